/*
 * prefix_bench.c - the hybrid prefix cache (engine/cache/prefix_cache.h) on
 * three synthetic traces, four policies, at simulator speed: token-level
 * bookkeeping, byte budget, FLOPs from a Qwen3.5-9B-shaped config (32
 * layers, 8 full; fp32 states as the engine keeps them: 52.7 MB per
 * checkpoint, 64 KiB of K/V per token).
 *
 *   traces  chat  multi-turn sessions over a few system prompts
 *           doc   many questions over a few long shared documents (Zipf),
 *                 with unrelated one-off traffic
 *           rag   system prompt + 4 documents drawn by Zipf popularity
 *                 from 400, in random order, + question
 *   arms    vllm+    a checkpoint every 32 tokens, LRU over the path
 *           sglang+  Marconi's admission, LRU
 *           marconi  admission + FLOP-aware eviction, alpha from the
 *                    bootstrap replay over the grid 0..16 (inline here, so
 *                    runs are deterministic): once (the paper), or again
 *                    after every window (re-tuned)
 *           +dp      re-tuned marconi + up to 4 sparse checkpoints per
 *                    request from the overlap-depth DP (balanced until the
 *                    histogram fills), each saving >= 10% of the mean
 *                    prompt per request
 *
 * TTFT is modelled: FLOPs of the recomputed stretch at 200 TFLOP/s plus
 * the restored bytes at 50 GB/s. A second table evaluates checkpoint
 * placement alone (papers/002): the overlap-depth law of the first half
 * of a trace, M checkpoints placed by the DP / balanced / every N/M,
 * recompute saved on the second half. With --model DIR a small measured
 * run on a real checkpoint (models/test/qwen35-dense) checks every
 * resumed prefill against a full one and times both.
 *
 * Build (after `make`):
 *   mkdir -p build/bench && cc -std=c11 -D_GNU_SOURCE -O2 -march=native \
 *      -fopenmp -Wall -Wextra -Werror -Wshadow -I. bench/prefix_bench.c \
 *      build/libhypic.a build/libhk_cpu.a $(pkg-config --libs libcjson \
 *      libpcre2-8 libxxhash libutf8proc openblas) -lm -lpthread \
 *      -o build/bench/prefix_bench
 * Run: build/bench/prefix_bench [--requests N] [--seed S]
 *      [--budget-gb chat,doc,rag] [--sparse M] [--dp-gain F]
 *      [--model models/test/qwen35-dense]
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench/bench_util.h"
#include "engine/cache/ckpt_dp.h"
#include "engine/cache/prefix_cache.h"
#include "engine/cache/radix.h"
#include "engine/forward/generate.h"
#include "engine/model/llm.h"

#define FLOP_RATE  200e12 /* effective prefill FLOP/s */
#define RESTORE_BW 50e9   /* bytes/s for restoring K/V + state */

/* ---- traces -------------------------------------------------------------- */

#define MAX_SEGS 8

typedef struct {
    int *ids; /* prompt then output */
    int n_prompt, n;
    /* the prompt's cacheable segments (rag only): -1 the system prompt,
     * else a document id; the query follows them */
    int seg_doc[MAX_SEGS], seg_len[MAX_SEGS], n_segs;
} req_t;

typedef struct {
    req_t *r;
    int n, cap;
    const char *name;
} trace_t;

typedef struct {
    uint64_t s;
    int fresh; /* next never-seen token id */
} gen_t;

static uint64_t rnd64(gen_t *g)
{
    return bench_xorshift(&g->s);
}

static unsigned rnd(gen_t *g)
{
    return (unsigned)(rnd64(g) >> 32);
}

static int uni(gen_t *g, int lo, int hi)
{
    return lo + (int)(rnd(g) % (unsigned)(hi - lo + 1));
}

static double unif01(gen_t *g)
{
    return ((rnd64(g) >> 11) + 0.5) / 9007199254740992.0;
}

/* Zipf(s) over [0, n) by inversion of the cumulative weights. */
typedef struct {
    double *cdf;
    int n;
} zipf_t;

static void zipf_init(zipf_t *z, int n, double s)
{
    z->n = n;
    z->cdf = malloc((size_t)n * sizeof(double));
    double acc = 0;
    for (int i = 0; i < n; i++)
        z->cdf[i] = (acc += 1.0 / pow(i + 1, s));
    for (int i = 0; i < n; i++)
        z->cdf[i] /= acc;
}

static int zipf(zipf_t *z, gen_t *g)
{
    return bench_cdf_pick(z->cdf, z->n, unif01(g));
}

/* Fresh content: token ids never used before (no accidental sharing). */
static int *fresh(gen_t *g, int n)
{
    int *a = malloc((size_t)n * sizeof(int));
    for (int i = 0; i < n; i++)
        a[i] = g->fresh++;
    return a;
}

typedef struct {
    int *a;
    int n, cap;
} buf_t;

static void put(buf_t *b, const int *x, int n)
{
    if (b->n + n > b->cap) {
        b->cap = (b->n + n) * 2;
        b->a = realloc(b->a, (size_t)b->cap * sizeof(int));
    }
    memcpy(b->a + b->n, x, (size_t)n * sizeof(int));
    b->n += n;
}

static void put_fresh(buf_t *b, gen_t *g, int n)
{
    int *x = fresh(g, n);
    put(b, x, n);
    free(x);
}

static void push(trace_t *t, const buf_t *prompt, gen_t *g, int n_out)
{
    if (t->n == t->cap) {
        t->cap = t->cap ? 2 * t->cap : 256;
        t->r = realloc(t->r, (size_t)t->cap * sizeof(req_t));
    }
    req_t *r = &t->r[t->n++];
    r->n_segs = 0;
    r->n_prompt = prompt->n;
    r->n = prompt->n + n_out;
    r->ids = malloc((size_t)r->n * sizeof(int));
    memcpy(r->ids, prompt->a, (size_t)prompt->n * sizeof(int));
    for (int i = 0; i < n_out; i++)
        r->ids[prompt->n + i] = g->fresh++;
}

/* chat: 24 sessions live at a time, each 2-10 turns; a turn is the
 * history + a user message (20-150) with an answer of 40-400 tokens.
 * A session starts from one of 8 system prompts (200-1200, Zipf 1). */
static void gen_chat(trace_t *t, gen_t *g, int n_req)
{
    enum { LIVE = 24, SYS = 8 };
    int *sys[SYS], sys_n[SYS];
    zipf_t z;
    zipf_init(&z, SYS, 1.0);
    for (int i = 0; i < SYS; i++)
        sys[i] = fresh(g, sys_n[i] = uni(g, 200, 1200));
    buf_t hist[LIVE] = {{0}};
    int left[LIVE] = {0};
    t->name = "chat";
    while (t->n < n_req) {
        int s = uni(g, 0, LIVE - 1);
        if (left[s] == 0) { /* a new session */
            int k = zipf(&z, g);
            hist[s].n = 0;
            put(&hist[s], sys[k], sys_n[k]);
            left[s] = uni(g, 2, 10);
        }
        put_fresh(&hist[s], g, uni(g, 20, 150));
        int out = uni(g, 40, 400);
        push(t, &hist[s], g, out);
        const req_t *r = &t->r[t->n - 1];
        put(&hist[s], r->ids + r->n_prompt, out);
        left[s]--;
    }
    for (int i = 0; i < LIVE; i++)
        free(hist[i].a);
    for (int i = 0; i < SYS; i++)
        free(sys[i]);
    free(z.cdf);
}

/* doc: 75% questions (15-60 tokens, answers 30-150) over one of 4
 * documents (6k-12k tokens, Zipf 1) after a 300-token system prompt;
 * 25% one-off prompts of 500-3000 tokens. */
static void gen_doc(trace_t *t, gen_t *g, int n_req)
{
    enum { DOCS = 4 };
    int *sys = fresh(g, 300), *doc[DOCS], doc_n[DOCS];
    zipf_t z;
    zipf_init(&z, DOCS, 1.0);
    for (int i = 0; i < DOCS; i++)
        doc[i] = fresh(g, doc_n[i] = uni(g, 6000, 12000));
    buf_t b = {0};
    t->name = "doc";
    while (t->n < n_req) {
        b.n = 0;
        if (rnd(g) % 4 == 0) {
            put_fresh(&b, g, uni(g, 500, 3000));
        } else {
            int k = zipf(&z, g);
            put(&b, sys, 300);
            put(&b, doc[k], doc_n[k]);
            put_fresh(&b, g, uni(g, 15, 60));
        }
        push(t, &b, g, uni(g, 30, 150));
    }
    free(b.a);
    for (int i = 0; i < DOCS; i++)
        free(doc[i]);
    free(sys);
    free(z.cdf);
}

/* rag: 300-token system prompt + 4 distinct documents (150-1000 tokens)
 * from 400 by Zipf 1.1, in random order, + a question (20-80); answers
 * 30-200 tokens. */
static void gen_rag(trace_t *t, gen_t *g, int n_req)
{
    enum { DOCS = 400, K = 4 };
    int *sys = fresh(g, 300), *doc[DOCS], doc_n[DOCS];
    zipf_t z;
    zipf_init(&z, DOCS, 1.1);
    for (int i = 0; i < DOCS; i++)
        doc[i] = fresh(g, doc_n[i] = uni(g, 150, 1000));
    buf_t b = {0};
    t->name = "rag";
    while (t->n < n_req) {
        int pick[K] = {0};
        for (int i = 0; i < K; i++) {
            int d, dup;
            do {
                d = zipf(&z, g);
                dup = 0;
                for (int j = 0; j < i; j++)
                    dup |= pick[j] == d;
            } while (dup);
            pick[i] = d;
        }
        b.n = 0;
        put(&b, sys, 300);
        for (int i = 0; i < K; i++)
            put(&b, doc[pick[i]], doc_n[pick[i]]);
        put_fresh(&b, g, uni(g, 20, 80));
        push(t, &b, g, uni(g, 30, 200));
        req_t *r = &t->r[t->n - 1];
        r->seg_doc[0] = -1;
        r->seg_len[0] = 300;
        for (int i = 0; i < K; i++) {
            r->seg_doc[1 + i] = pick[i];
            r->seg_len[1 + i] = doc_n[pick[i]];
        }
        r->n_segs = 1 + K;
    }
    free(b.a);
    for (int i = 0; i < DOCS; i++)
        free(doc[i]);
    free(sys);
    free(z.cdf);
}

static void trace_free(trace_t *t)
{
    for (int i = 0; i < t->n; i++)
        free(t->r[i].ids);
    free(t->r);
    memset(t, 0, sizeof(*t));
}

/* ---- the model shape ----------------------------------------------------- */

/* Qwen3.5-9B text shape (shared/reference/qwen3-hybrid-architecture.md
 * §1.3): only what the FLOP and byte model reads. */
static void cfg_qwen35_9b(hp_model_config_t *c)
{
    memset(c, 0, sizeof(*c));
    c->arch = HP_ARCH_QWEN3_5;
    c->vocab_size = 248320;
    c->hidden = 4096;
    c->n_layers = 32;
    c->n_heads = 16;
    c->n_kv_heads = 4;
    c->head_dim = 256;
    c->rotary_dim = 64;
    c->rope_theta = 1e7;
    c->lin_k_heads = 16;
    c->lin_v_heads = 32;
    c->lin_k_dim = 128;
    c->lin_v_dim = 128;
    c->conv_kernel = 4;
    c->intermediate = 12288;
    for (int l = 0; l < c->n_layers; l++)
        c->layer_kind[l] = (l + 1) % 4 == 0 ? HP_LAYER_FULL : HP_LAYER_LINEAR;
    hp_model_config_derive(c);
}

/* ---- the simulated arms -------------------------------------------------- */

typedef enum {
    ARM_NONE,
    ARM_VLLM,
    ARM_SGLANG,
    ARM_MARCONI,
    ARM_RETUNE,
    ARM_DP
} arm_t;
static const char *arm_name[] = {"no cache",
                                 "vllm+ (block 32, LRU)",
                                 "sglang+ (Marconi admission, LRU)",
                                 "marconi (alpha tuned once)",
                                 "marconi (alpha re-tuned)",
                                 "marconi re-tuned + sparse DP"};

typedef struct {
    double hit, flops_saved, ttft_mean, ttft_p95, alpha;
    unsigned long long admitted, evicted;
    double seconds;
} result_t;

static int cmp_dbl(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

typedef struct {
    int sparse;     /* DP checkpoints per request (the +dp arm) */
    double dp_gain; /* their minimum gain, fraction of the mean prompt */
} knobs_t;

static result_t run_arm(const trace_t *t, const hp_model_config_t *cfg,
                        arm_t arm, size_t budget, const knobs_t *kn)
{
    hp_prefix_cache_params_t p;
    hp_error_t err = {0};
    result_t res = {0};
    hp_prefix_cache_params_default(&p, arm == ARM_NONE ? 0 : budget);
    p.tune = arm >= ARM_MARCONI;
    p.retune = arm >= ARM_RETUNE;
    p.tune_async = 0;
    if (arm == ARM_VLLM) {
        p.admit = HP_PC_ADMIT_BLOCK;
        p.block = 32;
        p.touch_path = 1;
    }
    if (arm == ARM_DP) {
        p.sparse = kn->sparse;
        p.dp_min_gain = kn->dp_gain;
    }
    hp_prefix_cache_t *pc = hp_prefix_cache_create(cfg, &p, NULL, &err);
    if (!pc) {
        fprintf(stderr, "prefix_bench: %s\n", err.msg);
        exit(1);
    }
    double *ttft = malloc((size_t)t->n * sizeof(double));
    clock_t c0 = clock();
    for (int i = 0; i < t->n; i++) {
        const req_t *r = &t->r[i];
        hp_prefix_cache_req_t req;
        if (hp_prefix_cache_begin(pc, r->ids, r->n_prompt, -1, NULL, &req,
                                  &err) != HP_OK) {
            fprintf(stderr, "prefix_bench: %s\n", err.msg);
            exit(1);
        }
        double restored =
            (double)req.resume * hp_prefix_cache_kv_bytes(pc) +
            (req.resume ? (double)hp_prefix_cache_state_bytes(pc) : 0);
        ttft[i] =
            hp_prefix_cache_flops(pc, req.resume, r->n_prompt) / FLOP_RATE +
            restored / RESTORE_BW;
        hp_prefix_cache_admit(pc, &req, NULL, &err);
        hp_prefix_cache_finish(pc, &req, r->ids + r->n_prompt,
                               r->n - r->n_prompt, NULL, &err);
    }
    res.seconds = (double)(clock() - c0) / CLOCKS_PER_SEC;
    hp_prefix_cache_stats_t st;
    hp_prefix_cache_stats(pc, &st);
    res.hit = st.prompt_tokens ? (double)st.hit_tokens / st.prompt_tokens : 0;
    res.flops_saved =
        st.prompt_flops > 0 ? st.saved_flops / st.prompt_flops : 0;
    double sum = 0;
    for (int i = 0; i < t->n; i++)
        sum += ttft[i];
    res.ttft_mean = sum / t->n;
    qsort(ttft, (size_t)t->n, sizeof(double), cmp_dbl);
    res.ttft_p95 = ttft[(int)(0.95 * (t->n - 1))];
    res.alpha = st.alpha;
    res.admitted = st.states_admitted;
    res.evicted = st.states_evicted;
    free(ttft);
    hp_prefix_cache_destroy(pc);
    return res;
}

/* ---- the PIC arm (modelled) ---------------------------------------------
 * A segment cache keyed by document, LRU under the same byte budget: an
 * entry holds T_C and S_C|0 per linear layer and the interior K/V; the
 * system prompt is cached as a prefix (state + all K/V). A request
 * recomputes its misses (prefilled on their own), the seams (2w per hit
 * document) and the query; a hit costs restoring its bytes and one
 * dk x dk by dk x dv product per linear layer and head. */
#define PIC_SEAM 8

static result_t run_pic(const trace_t *t, const hp_model_config_t *cfg,
                        size_t budget)
{
    hp_prefix_cache_params_t p;
    hp_error_t err = {0};
    result_t res = {0};
    hp_prefix_cache_params_default(&p, 0);
    hp_prefix_cache_t *pc = hp_prefix_cache_create(cfg, &p, NULL, &err);
    int n_lin = cfg->n_lin;
    double hk = cfg->lin_v_heads, dk = cfg->lin_k_dim, dv = cfg->lin_v_dim;
    double tuple = n_lin * hk * (dk * dk + dk * dv) * 4;
    double kvb = (double)hp_prefix_cache_kv_bytes(pc);
    double compose = n_lin * hk * 2 * dk * dk * dv;
    enum { SLOTS = 1024 };
    long long stamp[SLOTS + 1] = {0}; /* [doc + 1] last use, 0 = absent */
    double bytes_of[SLOTS + 1] = {0}, used = 0;
    double *ttft = malloc((size_t)t->n * sizeof(double));
    double hit = 0, total = 0, flops_all = 0, flops_saved = 0;
    for (int i = 0; i < t->n; i++) {
        const req_t *r = &t->r[i];
        double rec = r->n_prompt, restored = 0, extra = 0;
        for (int s2 = 0; s2 < r->n_segs; s2++) {
            int key = r->seg_doc[s2] + 1, len = r->seg_len[s2];
            int lead = key == 0;
            double b = lead ? tuple / (dk * dk + dk * dv) * dk * dv + len * kvb
                            : tuple + (len - 2 * PIC_SEAM) * kvb;
            int cached = lead ? len : len - 2 * PIC_SEAM;
            if (stamp[key]) {
                rec -= cached;
                hit += cached;
                restored += b;
                extra += lead ? 0 : compose;
            } else {
                while (used + b > budget) { /* evict the least recent */
                    int v = -1;
                    for (int k = 0; k <= SLOTS; k++)
                        if (stamp[k] && (v < 0 || stamp[k] < stamp[v]))
                            v = k;
                    if (v < 0)
                        break;
                    used -= bytes_of[v];
                    bytes_of[v] = 0;
                    stamp[v] = 0;
                }
                if (used + b <= budget) {
                    used += b;
                    bytes_of[key] = b;
                }
                /* a miss is prefilled on its own: attention over the
                 * segment only (cold cost; with workers it runs in
                 * parallel, modelled here as sequential) */
                extra += hp_prefix_cache_flops(pc, 0, len);
                rec -= len;
            }
            if (bytes_of[key] > 0) /* present: a hit, or inserted now */
                stamp[key] = i + 1;
        }
        double full = hp_prefix_cache_flops(pc, 0, r->n_prompt);
        double work = full * rec / r->n_prompt + extra;
        total += r->n_prompt;
        flops_all += full;
        flops_saved += full - work > 0 ? full - work : 0;
        ttft[i] = work / FLOP_RATE + restored / RESTORE_BW;
    }
    res.hit = total ? hit / total : 0;
    res.flops_saved = flops_all > 0 ? flops_saved / flops_all : 0;
    double sum = 0;
    for (int i = 0; i < t->n; i++)
        sum += ttft[i];
    res.ttft_mean = sum / t->n;
    qsort(ttft, (size_t)t->n, sizeof(double), cmp_dbl);
    res.ttft_p95 = ttft[(int)(0.95 * (t->n - 1))];
    free(ttft);
    hp_prefix_cache_destroy(pc);
    return res;
}

/* ---- placement alone (papers/002) ---------------------------------------- */

/* Overlap depth of each request: its longest common prefix with any
 * earlier sequence (an unbounded tree). */
static int *overlaps(const trace_t *t)
{
    hp_radix_t tree;
    hp_error_t err = {0};
    int *d = malloc((size_t)t->n * sizeof(int));
    hp_radix_init(&tree, &err);
    for (int i = 0; i < t->n; i++) {
        hp_radix_match_t m;
        hp_radix_match(&tree, t->r[i].ids, t->r[i].n_prompt, &m);
        d[i] = m.depth;
        hp_radix_insert(&tree, t->r[i].ids, t->r[i].n, NULL, &err);
    }
    hp_radix_free(&tree, NULL, NULL);
    return d;
}

static void placement_table(const trace_t *t)
{
    int *d = overlaps(t), N = 0, half = t->n / 2;
    for (int i = 0; i < t->n; i++)
        N = d[i] > N ? d[i] : N;
    if (N < 2) {
        free(d);
        return;
    }
    double *train = calloc((size_t)N + 1, sizeof(double));
    double *test = calloc((size_t)N + 1, sizeof(double));
    double base = 0;
    for (int i = 0; i < t->n; i++) {
        if (d[i] < 1)
            continue;
        if (i < half) {
            train[d[i]] += 1;
        } else {
            test[d[i]] += 1;
            base += d[i];
        }
    }
    static const int Ms[] = {1, 2, 4, 8, 16};
    printf("| %s | DP (train law) |", t->name);
    for (int k = 0; k < 5; k++) {
        int c[16], m;
        hp_error_t err = {0};
        hp_ckpt_dp_solve(train, N, Ms[k], c, &m, NULL, &err);
        printf(" %.1f%% |", 100 * (1 - hp_ckpt_dp_cost(test, N, c, m) / base));
    }
    printf("\n| %s | balanced |", t->name);
    for (int k = 0; k < 5; k++) {
        int c[16], m = hp_ckpt_dp_balanced(N, Ms[k], c);
        printf(" %.1f%% |", 100 * (1 - hp_ckpt_dp_cost(test, N, c, m) / base));
    }
    printf("\n| %s | every N/M from N/M |", t->name);
    for (int k = 0; k < 5; k++) {
        int c[16], m = 0, step = N / Ms[k];
        for (int x = step; x <= N && m < Ms[k]; x += step)
            c[m++] = x;
        printf(" %.1f%% |", 100 * (1 - hp_ckpt_dp_cost(test, N, c, m) / base));
    }
    printf("\n");
    free(train);
    free(test);
    free(d);
}

/* ---- a measured run on a real checkpoint --------------------------------- */

/* Multi-turn chat scaled to the test model (ids < 400): 6 sessions, 5
 * turns, real greedy answers of 24 tokens. Each prompt runs through the
 * cache and as a full prefill; logits compared, prefill times summed. */
static int measured(const char *dir, unsigned long long seed)
{
    hp_llm_t llm;
    hp_fwd_ws_t ws;
    hp_error_t err = {0};
    gen_t g = {seed ^ 0x5DEECE66DULL, 0};
    if (hp_llm_load(&llm, dir, &err) != HP_OK) {
        fprintf(stderr, "prefix_bench: %s\n", err.msg);
        return 1;
    }
    if (hp_fwd_ws_init(&ws, &llm.model, NULL, &err) != HP_OK)
        return bench_fail(&err);
    const hp_model_t *m = &llm.model;
    int V = m->cfg.vocab_size;
    float *lf = malloc((size_t)V * 4), *lc = malloc((size_t)V * 4);
    hp_prefix_cache_params_t p;
    hp_prefix_cache_params_default(&p, 256 << 20);
    p.tune_async = 0;
    hp_prefix_cache_t *pc = hp_prefix_cache_create(&m->cfg, &p, m->be, &err);
    enum { S = 6, TURNS = 5 };
    static int hist[S][4096];
    int len[S], sys[300];
    for (int i = 0; i < 300; i++)
        sys[i] = uni(&g, 0, 399);
    for (int s = 0; s < S; s++) {
        len[s] = 150 + 50 * (s % 3);
        memcpy(hist[s], sys, (size_t)len[s] * sizeof(int)); /* shared head */
        for (int i = 100; i < len[s]; i++)
            hist[s][i] = uni(&g, 0, 399);
    }
    double t_full = 0, t_cache = 0, worst = 0;
    long tok = 0, hit = 0;
    for (int turn = 0; turn < TURNS; turn++)
        for (int s = 0; s < S; s++) {
            int n = len[s] + 30;
            for (int i = len[s]; i < n; i++)
                hist[s][i] = uni(&g, 0, 399);
            hp_seq_t sf, sc;
            hp_prefix_cache_req_t req;
            hp_seq_init(&sf, m, &err);
            hp_seq_init(&sc, m, &err);
            double t0 = bench_now();
            hp_prefill(m, &sf, &ws, hist[s], n, 1024, lf, &err);
            double t1 = bench_now();
            if (hp_prefix_cache_prefill(pc, m, &ws, hist[s], n, -1, &sc, lc,
                                        &req, &err) != HP_OK) {
                fprintf(stderr, "prefix_bench: %s\n", err.msg);
                return 1;
            }
            double t2 = bench_now();
            t_full += t1 - t0;
            t_cache += t2 - t1;
            tok += n;
            hit += req.resume;
            double num = 0, den = 0;
            for (int i = 0; i < V; i++) {
                num += ((double)lf[i] - lc[i]) * ((double)lf[i] - lc[i]);
                den += (double)lf[i] * lf[i];
            }
            worst = fmax(worst, sqrt(num / den));
            hp_gen_params_t gp = {0};
            hp_gen_result_t gr;
            gp.max_tokens = 24;
            gp.ignore_eos = 1;
            hp_generate(&llm, &sc, &ws, lc, &gp, NULL, NULL, &gr, &err);
            hp_prefix_cache_finish(pc, &req, gr.tokens, gr.n_tokens, &sc, &err);
            memcpy(hist[s] + n, gr.tokens,
                   (size_t)(sc.n_pos - n) * sizeof(int));
            len[s] = sc.n_pos;
            free(gr.tokens);
            hp_seq_free(&sf);
            hp_seq_free(&sc);
        }
    printf("\nmeasured, %s: %d requests, multi-turn, greedy answers\n\n", dir,
           S * TURNS);
    printf("| arm | token hit | prefill time (sum) | worst logits rel err |\n");
    printf("|---|---|---|---|\n");
    printf("| full prefill | 0.0%% | %.1f ms | - |\n", t_full * 1e3);
    printf("| marconi (tensors) | %.1f%% | %.1f ms | %.2e |\n",
           100.0 * hit / tok, t_cache * 1e3, worst);
    hp_prefix_cache_destroy(pc);
    free(lf);
    free(lc);
    hp_fwd_ws_free(&ws);
    hp_llm_free(&llm);
    return worst <= 1e-5 ? 0 : 1;
}

/* ---- main ---------------------------------------------------------------- */

int main(int argc, char **argv)
{
    int n_req = 2000;
    unsigned long long seed = 1;
    double gb[3] = {16, 16, 16};
    const char *model = NULL;
    knobs_t kn = {4, 0.1};
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--requests") && i + 1 < argc)
            n_req = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--seed") && i + 1 < argc)
            seed = strtoull(argv[++i], NULL, 10);
        else if (!strcmp(argv[i], "--budget-gb") && i + 1 < argc)
            sscanf(argv[++i], "%lf,%lf,%lf", &gb[0], &gb[1], &gb[2]);
        else if (!strcmp(argv[i], "--model") && i + 1 < argc)
            model = argv[++i];
        else if (!strcmp(argv[i], "--sparse") && i + 1 < argc)
            kn.sparse = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--dp-gain") && i + 1 < argc)
            kn.dp_gain = atof(argv[++i]);
        else {
            fprintf(stderr,
                    "usage: prefix_bench [--requests N] [--seed S] "
                    "[--budget-gb chat,doc,rag] [--sparse M] [--dp-gain F] "
                    "[--model DIR]\n");
            return 2;
        }
    }
    if (n_req < 2) {
        fprintf(stderr, "prefix_bench: --requests must be >= 2\n");
        return 2;
    }
    hp_model_config_t cfg;
    cfg_qwen35_9b(&cfg);
    trace_t tr[3] = {{0}};
    gen_t g = {seed * 0x9E3779B97F4A7C15ULL + 7, 1};
    gen_chat(&tr[0], &g, n_req);
    gen_doc(&tr[1], &g, n_req);
    gen_rag(&tr[2], &g, n_req);

    printf("prefix cache, %d requests per trace, seed %llu, Qwen3.5-9B shape "
           "(fp32 state %.1f MB/checkpoint, K/V %.0f KiB/token)\n\n",
           n_req, seed, 24 * (32 * 128 * 128 + 8192 * 3) * 4 / 1e6,
           8 * 2 * 4 * 256 * 4 / 1024.0);
    printf("| trace | budget | arm | token hit | FLOPs saved | TTFT mean | "
           "TTFT p95 | states admitted | evicted | alpha | sim s |\n");
    printf("|---|---|---|---|---|---|---|---|---|---|---|\n");
    for (int k = 0; k < 3; k++) {
        size_t budget = (size_t)(gb[k] * 1e9);
        for (int a = ARM_NONE; a <= ARM_DP; a++) {
            result_t r = run_arm(&tr[k], &cfg, (arm_t)a, budget, &kn);
            printf("| %s | %.0f GB | %s | %.1f%% | %.1f%% | %.0f ms | %.0f ms "
                   "| %llu | %llu | %s%.2g | %.1f |\n",
                   tr[k].name, gb[k], arm_name[a], 100 * r.hit,
                   100 * r.flops_saved, r.ttft_mean * 1e3, r.ttft_p95 * 1e3,
                   r.admitted, r.evicted, a >= ARM_MARCONI ? "last " : "",
                   r.alpha, r.seconds);
        }
        if (tr[k].r[0].n_segs) { /* segmented prompts: the PIC arm too */
            result_t r = run_pic(&tr[k], &cfg, budget);
            printf("| %s | %.0f GB | pic (modelled, w=%d) | %.1f%% | %.1f%% "
                   "| %.0f ms | %.0f ms | - | - | - | - |\n",
                   tr[k].name, gb[k], PIC_SEAM, 100 * r.hit,
                   100 * r.flops_saved, r.ttft_mean * 1e3, r.ttft_p95 * 1e3);
        }
    }

    printf("\ncheckpoint placement alone: recompute saved on the second half "
           "of each trace by M checkpoints placed from the first half's "
           "overlap-depth law (absolute depths 1..N)\n\n");
    printf("| trace | placement | M=1 | M=2 | M=4 | M=8 | M=16 |\n");
    printf("|---|---|---|---|---|---|---|\n");
    for (int k = 0; k < 3; k++)
        placement_table(&tr[k]);

    int rc = model ? measured(model, seed) : 0;
    for (int k = 0; k < 3; k++)
        trace_free(&tr[k]);
    return rc;
}
