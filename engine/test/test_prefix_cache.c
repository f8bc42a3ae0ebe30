/*
 * test_prefix_cache.c - the hybrid prefix cache. As a simulator: Marconi
 * admission (branch points, last decoded token), block and sparse (DP,
 * balanced) checkpoints, eviction order against an independent scorer,
 * pinned entries never evicted, the budget never exceeded, the alpha
 * search on crafted traces (inline and in its thread). On the real
 * qwen35-dense checkpoint: resuming from every checkpoint and recomputing
 * the rest equals a full prefill, multi-turn resumes from the last decoded
 * token with identical greedy tokens, prompts longer than a prefill piece.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/cache/arena.h"
#include "engine/cache/prefix_cache.h"
#include "engine/forward/generate.h"
#include "engine/model/llm.h"
#include "engine/model/model_config.h"
#include "t/lib/tap.h"

/* Resume + recompute vs one pass: the same tokens through different run
 * splits of the chunked GDN kernel; the bound. */
#define EXACT_TOL 1e-5

static unsigned long long rng_state = 0x2545F4914F6CDD1DULL;
static unsigned rnd(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (unsigned)(rng_state >> 11);
}

/* Random ids in [lo, lo + span): prompts use [0, 400), probe suffixes
 * [400, 490), so a suffix never continues a cached path. */
static void fill(int *ids, int n, int lo, int span)
{
    for (int i = 0; i < n; i++)
        ids[i] = lo + (int)(rnd() % (unsigned)span);
}

static hp_model_config_t cfg;

static hp_prefix_cache_t *sim(size_t budget, double alpha, int tune)
{
    hp_prefix_cache_params_t p;
    hp_error_t err = {0};
    hp_prefix_cache_params_default(&p, budget);
    p.alpha = alpha;
    p.tune = tune;
    return hp_prefix_cache_create(&cfg, &p, NULL, &err);
}

/* One simulated request: begin, admit, finish with n_out more tokens
 * (out may be NULL: fresh tokens). Returns the resume depth. */
static int request(hp_prefix_cache_t *pc, const int *ids, int n, const int *out,
                   int n_out, hp_prefix_cache_req_t *keep)
{
    hp_prefix_cache_req_t req;
    hp_error_t err = {0};
    int tmp[4096];
    if (!out) {
        fill(tmp, n_out, 0, 400);
        out = tmp;
    }
    if (hp_prefix_cache_begin(pc, ids, n, -1, NULL, &req, &err) != HP_OK)
        return -1;
    hp_prefix_cache_admit(pc, &req, NULL, &err);
    int r = req.resume;
    if (keep)
        *keep = req;
    else
        hp_prefix_cache_finish(pc, &req, out, n_out, NULL, &err);
    return r;
}

static int has_ckpt(hp_prefix_cache_t *pc, int depth)
{
    int d[256], n = hp_prefix_cache_checkpoints(pc, d, NULL, 256);
    for (int i = 0; i < n && i < 256; i++)
        if (d[i] == depth)
            return 1;
    return 0;
}

/* ---- admission ----------------------------------------------------------- */

static void test_admission(void)
{
    hp_prefix_cache_t *pc = sim((size_t)1 << 40, 0, 0);
    hp_prefix_cache_req_t req;
    hp_prefix_cache_stats_t st;
    hp_error_t err = {0};
    int A[200], B[200], C[200], out[20];
    fill(A, 150, 0, 400);
    memcpy(B, A, 100 * sizeof(int));
    fill(B + 100, 50, 0, 400);
    B[100] = (A[100] + 1) % 400;
    memcpy(C, A, 100 * sizeof(int));
    fill(C + 100, 60, 0, 400);
    C[100] = (A[100] + 2) % 400;
    fill(out, 20, 0, 400);

    ok(request(pc, A, 150, out, 20, NULL) == 0, "first request: no hit");
    hp_prefix_cache_stats(pc, &st);
    ok(st.states == 1 && has_ckpt(pc, 170),
       "one checkpoint, at the last decoded token (depth 170)");

    hp_prefix_cache_begin(pc, B, 150, -1, NULL, &req, &err);
    ok(req.match == 100 && req.resume == 0 && req.n_ckpt == 1 &&
           req.ckpt[0] == 100,
       "speculative insertion: B branches at 100, capture asked there");
    hp_prefix_cache_admit(pc, &req, NULL, &err);
    hp_prefix_cache_finish(pc, &req, out, 5, NULL, &err);
    hp_prefix_cache_stats(pc, &st);
    ok(st.states == 3 && has_ckpt(pc, 100) && has_ckpt(pc, 155),
       "after B: branch point 100, leaves 170 and 155 (%d states)", st.states);

    hp_prefix_cache_begin(pc, C, 160, -1, NULL, &req, &err);
    ok(req.resume == 100 && req.n_ckpt == 0,
       "C resumes from the branch point, no new branch (at a node)");
    hp_prefix_cache_release(pc, &req);

    /* turn 2 extends A's prompt + output */
    int T2[300];
    memcpy(T2, A, 150 * sizeof(int));
    memcpy(T2 + 150, out, 20 * sizeof(int));
    fill(T2 + 170, 30, 0, 400);
    ok(request(pc, T2, 200, NULL, 10, NULL) == 170,
       "multi-turn: the next turn resumes from the last decoded token");

    /* the same prompt again: resume below its end (its logits are needed) */
    ok(request(pc, A, 100, NULL, 0, NULL) == 0 &&
           request(pc, A, 100, NULL, 0, NULL) == 99,
       "a prompt found whole resumes below its end: its first repeat "
       "captures n - 1, the second resumes there");
    /* a caller-known boundary (the lead's end) is captured on first use */
    int H1[120], H2[120];
    fill(H1, 120, 0, 400);
    H1[0] = 399;
    memcpy(H2, H1, 40 * sizeof(int));
    fill(H2 + 40, 80, 0, 400);
    H2[40] = (H1[40] + 1) % 400;
    hp_prefix_cache_begin(pc, H1, 120, 40, NULL, &req, &err);
    ok(req.n_ckpt == 1 && req.ckpt[0] == 40, "a hint asks for a capture");
    hp_prefix_cache_admit(pc, &req, NULL, &err);
    hp_prefix_cache_finish(pc, &req, NULL, 0, NULL, &err);
    ok(request(pc, H2, 120, NULL, 0, NULL) == 40,
       "the second request sharing the hinted lead resumes there");
    hp_prefix_cache_stats(pc, &st);
    ok(st.bytes_used == st.kv_bytes + st.state_bytes &&
           st.state_bytes ==
               (size_t)st.states * hp_prefix_cache_state_bytes(pc),
       "bytes: K/V + states, %d states", st.states);
    hp_prefix_cache_destroy(pc);

    /* block admission (vLLM+): every 32 tokens */
    hp_prefix_cache_params_t p;
    hp_prefix_cache_params_default(&p, (size_t)1 << 40);
    p.admit = HP_PC_ADMIT_BLOCK;
    p.block = 32;
    p.tune = 0;
    pc = hp_prefix_cache_create(&cfg, &p, NULL, &err);
    hp_prefix_cache_begin(pc, A, 150, -1, NULL, &req, &err);
    ok(req.n_ckpt == 4 && req.ckpt[0] == 32 && req.ckpt[3] == 128,
       "block: captures at 32, 64, 96, 128");
    hp_prefix_cache_admit(pc, &req, NULL, &err);
    hp_prefix_cache_finish(pc, &req, out, 20, NULL, &err);
    hp_prefix_cache_stats(pc, &st);
    ok(st.states == 5 && has_ckpt(pc, 160) && !has_ckpt(pc, 170),
       "block: the output's block at 160 too, not the unaligned end");
    ok(request(pc, B, 150, NULL, 0, NULL) == 96,
       "block: B resumes from 96, the last block before its branch");
    hp_prefix_cache_destroy(pc);
}

/* ---- FLOP model ---------------------------------------------------------- */

/* Attention makes each token dearer than the one before by 4 Hq hd per
 * full layer (QK^T and AV over one more key); the rest is at least the
 * 2 FLOPs per weight of every projection and MLP matrix a token meets. */
static void test_flops(void)
{
    hp_prefix_cache_t *pc = sim(1, 0, 0);
    double H = cfg.hidden, a1 = 0, w = 0;
    for (int l = 0; l < cfg.n_layers; l++) {
        w += 3 * H * cfg.intermediate;
        if (cfg.layer_kind[l] == HP_LAYER_FULL) {
            a1 += 4.0 * cfg.n_heads * cfg.head_dim;
            w += H * cfg.head_dim * (3.0 * cfg.n_heads + 2 * cfg.n_kv_heads);
        } else {
            w += H * (hp_cfg_conv_dim(&cfg) + 2.0 * hp_cfg_value_dim(&cfg) +
                      2 * cfg.lin_v_heads);
        }
    }
    int bad = 0;
    for (int d = 0; d < 3000; d += 37) {
        double f0 = hp_prefix_cache_flops(pc, d, d + 1);
        double f1 = hp_prefix_cache_flops(pc, d + 1, d + 2);
        double sum = hp_prefix_cache_flops(pc, 0, d) +
                     hp_prefix_cache_flops(pc, d, d + 50);
        bad += fabs((f1 - f0) - a1) > 1e-9 * f1 ||
               fabs(sum - hp_prefix_cache_flops(pc, 0, d + 50)) > 1e-9 * sum;
    }
    double c0 = hp_prefix_cache_flops(pc, 0, 1) - a1;
    ok(bad == 0, "FLOPs: additive over spans, each token dearer by %g", a1);
    ok(c0 >= 2 * w && c0 <= 1.3 * 2 * w,
       "FLOPs: per-token base %.0f within [1, 1.3] x 2 x weights (%.0f)", c0,
       2 * w);
    hp_prefix_cache_destroy(pc);
}

/* ---- sparse checkpoints -------------------------------------------------- */

static void test_sparse(void)
{
    hp_prefix_cache_params_t p;
    hp_prefix_cache_req_t req;
    hp_error_t err = {0};
    hp_prefix_cache_params_default(&p, (size_t)1 << 40);
    p.tune = 0;
    p.sparse = 2;
    p.dp_min_mass = 3.0;
    hp_prefix_cache_t *pc = hp_prefix_cache_create(&cfg, &p, NULL, &err);
    int x[400], P[400], Q[400];
    fill(x, 101, 0, 400);
    x[0] = 1;
    hp_prefix_cache_begin(pc, x, 101, -1, NULL, &req, &err);
    ok(req.n_ckpt == 2 && req.ckpt[0] == 33 && req.ckpt[1] == 67,
       "too little history: balanced placement (33, 67) in the new stretch");
    hp_prefix_cache_release(pc, &req);

    /* requests that leave the tree at depth 60 (prefix P) and 25 (Q) */
    fill(P, 300, 0, 400);
    fill(Q, 300, 0, 400);
    P[0] = 2;
    Q[0] = 3;
    for (int i = 0; i < 8; i++) {
        P[60] = 10 + i; /* a new branch each time */
        Q[25] = 10 + i;
        request(pc, P, 80, NULL, 0, NULL);
        request(pc, Q, 80, NULL, 0, NULL);
    }
    fill(x, 300, 0, 400);
    x[0] = 4;
    hp_prefix_cache_begin(pc, x, 300, -1, NULL, &req, &err);
    ok(req.n_ckpt == 2 && req.ckpt[0] == 25 && req.ckpt[1] == 60,
       "with history: the DP puts a fresh prompt's checkpoints where "
       "requests diverge (%d: %d %d)",
       req.n_ckpt, req.n_ckpt > 0 ? req.ckpt[0] : -1,
       req.n_ckpt > 1 ? req.ckpt[1] : -1);
    hp_prefix_cache_admit(pc, &req, NULL, &err);
    hp_prefix_cache_finish(pc, &req, NULL, 0, NULL, &err);
    ok(has_ckpt(pc, 25) && has_ckpt(pc, 60),
       "the fresh prompt's path now holds states at 25 and 60");
    x[60] = 499 - 1; /* diverge at 60: resumes there, second occurrence */
    ok(request(pc, x, 100, NULL, 0, NULL) == 60,
       "a request diverging at 60 hits on its path's first reuse");
    hp_prefix_cache_destroy(pc);
}

/* ---- eviction order ------------------------------------------------------ */

/* An independent scorer over a flat description of the crafted tree:
 * candidates are alive stateful nodes with <= 1 live child; FLOPs from the
 * nearest live ancestor; min-max normalised recency and efficiency. */
typedef struct {
    int depth, len, parent, alive;
    double stamp;
} ref_node_t;

static int ref_victim(hp_prefix_cache_t *pc, ref_node_t *v, int n, double alpha)
{
    double smin = INFINITY, smax = -INFINITY, emin = INFINITY, emax = -INFINITY,
           eff[16];
    int kids[16] = {0};
    for (int i = 0; i < n; i++)
        if (v[i].alive && v[i].parent >= 0)
            kids[v[i].parent]++;
    for (int i = 0; i < n; i++) {
        if (!v[i].alive || kids[i] > 1)
            continue;
        int a = v[i].parent;
        double f =
            hp_prefix_cache_flops(pc, a >= 0 ? v[a].depth : 0, v[i].depth);
        eff[i] = f / ((double)v[i].len * hp_prefix_cache_kv_bytes(pc) +
                      hp_prefix_cache_state_bytes(pc));
        smin = fmin(smin, v[i].stamp), smax = fmax(smax, v[i].stamp);
        emin = fmin(emin, eff[i]), emax = fmax(emax, eff[i]);
    }
    int best = -1;
    double bs = INFINITY;
    for (int i = 0; i < n; i++) {
        if (!v[i].alive || kids[i] > 1)
            continue;
        double s = (smax > smin ? (v[i].stamp - smin) / (smax - smin) : 0) +
                   alpha * (emax > emin ? (eff[i] - emin) / (emax - emin) : 0);
        if (s < bs) {
            bs = s;
            best = i;
        }
    }
    /* apply: a leaf goes; a single-child node's edge joins its child */
    v[best].alive = 0;
    for (int i = 0; i < n; i++)
        if (v[i].alive && v[i].parent == best) {
            v[i].parent = v[best].parent;
            v[i].len += v[best].len;
        }
    return v[best].depth;
}

/* The crafted tree: root-level leaves of lengths 300, 40, 1200, 80, a
 * chain 500 -> 1200 (a turn and its extension) and 60. Stamps are the
 * order of last access: creation, and the chain's parent touched when
 * the extension resumed from it. */
static void build_crafted(hp_prefix_cache_t *pc, ref_node_t *v)
{
    static const int lens[] = {300, 40, 1200, 80, 500, 60};
    int ids[1300];
    int k = 0;
    for (int i = 0; i < 6; i++) {
        fill(ids, lens[i], 0, 400);
        ids[0] = 100 + i;
        request(pc, ids, lens[i], NULL, 0, NULL);
        v[k++] = (ref_node_t){lens[i], lens[i], -1, 1, (double)i};
        if (i == 4) { /* the extension: resumes from 500 */
            fill(ids + 500, 700, 0, 400);
            request(pc, ids, 1200, NULL, 0, NULL);
            v[4].stamp = 4.5; /* touched by the resume */
            v[k++] = (ref_node_t){1200, 700, 4, 1, 4.6};
        }
    }
}

static void test_eviction_order(void)
{
    /* alpha 0 is LRU; a huge alpha is FLOP efficiency alone. Stamps enter
     * the scorer only as an order there, so the reference needs no
     * knowledge of the clock's exact values. */
    static const double alphas[] = {0.0, 1e9};
    for (int a = 0; a < 2; a++) {
        hp_prefix_cache_t *pc = sim((size_t)1 << 40, alphas[a], 0);
        ref_node_t v[16];
        build_crafted(pc, v);
        int got[8], want[8], bad = 0;
        for (int i = 0; i < 7; i++) {
            got[i] = hp_prefix_cache_evict_one(pc);
            want[i] = ref_victim(pc, v, 7, alphas[a]);
            bad += got[i] != want[i];
        }
        ok(bad == 0 && hp_prefix_cache_evict_one(pc) == -1,
           "alpha %g: eviction order %d %d %d %d %d %d %d matches the "
           "reference",
           alphas[a], got[0], got[1], got[2], got[3], got[4], got[5], got[6]);
        if (bad)
            tap_diag("want %d %d %d %d %d %d %d", want[0], want[1], want[2],
                     want[3], want[4], want[5], want[6]);
        hp_prefix_cache_destroy(pc);
    }
    /* Two candidates, old + efficient vs new + cheap: normalised they
     * score alpha and 1, so alpha decides which goes first. */
    for (int a = 0; a < 2; a++) {
        double alpha = a ? 2.0 : 0.5;
        hp_prefix_cache_t *pc = sim((size_t)1 << 40, alpha, 0);
        int ids[2000];
        fill(ids, 1500, 0, 400);
        ids[0] = 1;
        request(pc, ids, 1500, NULL, 0, NULL);
        fill(ids, 30, 0, 400);
        ids[0] = 2;
        request(pc, ids, 30, NULL, 0, NULL);
        int first = hp_prefix_cache_evict_one(pc);
        ok(first == (a ? 30 : 1500), "alpha %g: the %s entry goes first (%d)",
           alpha, a ? "recent cheap" : "old efficient", first);
        hp_prefix_cache_destroy(pc);
    }
}

/* ---- pins and budget ----------------------------------------------------- */

static void test_pins(void)
{
    size_t kv = 0, stb = 0;
    hp_prefix_cache_t *probe = sim(1, 0, 0);
    kv = hp_prefix_cache_kv_bytes(probe);
    stb = hp_prefix_cache_state_bytes(probe);
    hp_prefix_cache_destroy(probe);
    size_t budget = 400 * kv + 4 * (100 * kv + stb);
    hp_prefix_cache_t *pc = sim(budget, 0.0, 0);
    hp_prefix_cache_req_t held, req;
    hp_prefix_cache_stats_t st;
    hp_error_t err = {0};
    int A[400], x[200], over = 0;
    fill(A, 400, 0, 400);
    A[0] = 7;
    request(pc, A, 400, NULL, 0, &held); /* prefilled, not finished */
    ok(held.admitted, "a 400-token prompt admitted and held");
    for (int i = 0; i < 30; i++) {
        fill(x, 100, 0, 400);
        x[0] = 8 + i;
        request(pc, x, 100, NULL, 0, NULL);
        hp_prefix_cache_stats(pc, &st);
        over += st.bytes_used > st.budget;
    }
    hp_prefix_cache_stats(pc, &st);
    ok(st.states_evicted > 20 && over == 0,
       "30 requests forced %d evictions, never over budget",
       (int)st.states_evicted);
    hp_prefix_cache_begin(pc, A, 400, -1, NULL, &req, &err);
    ok(req.match == 400, "the held prompt is still all there (match %d)",
       req.match);
    hp_prefix_cache_release(pc, &req);
    ok(hp_prefix_cache_finish(pc, &held, NULL, 0, NULL, &err) == HP_OK &&
           has_ckpt(pc, 400),
       "its finish checkpoints the prompt's end");
    for (int i = 0; i < 10; i++) {
        fill(x, 100, 0, 400);
        x[0] = 40 + i;
        request(pc, x, 100, NULL, 0, NULL);
    }
    ok(!has_ckpt(pc, 400), "once released it can be evicted");
    request(pc, A, 400, NULL, 0, &held);
    hp_prefix_cache_clear(pc);
    hp_prefix_cache_stats(pc, &st);
    ok(st.states == 0 && st.kv_bytes == 400 * kv,
       "clear drops every entry but the held prompt's path");
    hp_prefix_cache_release(pc, &held);
    hp_prefix_cache_destroy(pc);

    /* everything pinned: a newcomer is refused, the budget holds */
    pc = sim(400 * kv + stb, 1.0, 0);
    request(pc, A, 400, NULL, 0, &held);
    fill(x, 100, 0, 400);
    x[0] = 9;
    request(pc, x, 100, NULL, 0, &req);
    hp_prefix_cache_stats(pc, &st);
    ok(held.admitted && !req.admitted && st.rejected == 1 &&
           st.bytes_used <= st.budget,
       "with every entry in use a new prompt is refused, not squeezed in");
    hp_prefix_cache_release(pc, &req);
    hp_prefix_cache_release(pc, &held);
    hp_prefix_cache_stats(pc, &st);
    ok(st.bytes_used == 0 && st.nodes == 0,
       "released without a checkpoint: stateless paths are dropped");
    hp_prefix_cache_destroy(pc);
}

/* ---- alpha search -------------------------------------------------------- */

typedef struct {
    hp_prefix_cache_trace_t tr[512];
    int n;
} trace_t;

static void trace_add(trace_t *t, const int *ids, int n_prompt, int n)
{
    hp_prefix_cache_trace_t *r = &t->tr[t->n++];
    int *c = malloc((size_t)n * sizeof(int));
    memcpy(c, ids, (size_t)n * sizeof(int));
    r->ids = c;
    r->n_prompt = n_prompt;
    r->n = n;
}

static void trace_free(trace_t *t)
{
    for (int i = 0; i < t->n; i++)
        free((void *)t->tr[i].ids);
    t->n = 0;
}

/* FLOP-aware wins: one long conversation whose turns are separated by
 * bursts of short one-off requests that would push it out under LRU. */
static void trace_long_vs_bursts(trace_t *t, int cycles)
{
    static int conv[8000];
    int n = 1200, x[200];
    fill(conv, n, 0, 400);
    conv[0] = 1;
    for (int c = 0; c < cycles; c++) {
        fill(conv + n, 40, 0, 400); /* the output */
        trace_add(t, conv, n, n + 40);
        n += 40;
        for (int s = 0; s < 8; s++) {
            fill(x, 150, 0, 400);
            x[0] = 2 + (c * 8 + s) % 300;
            fill(x + 150, 10, 0, 400);
            trace_add(t, x, 150, 160);
        }
        fill(conv + n, 30, 0, 400); /* the next user message */
        n += 30;
    }
}

/* Room for the conversation at its longest and two short requests, so
 * LRU drops the conversation in every burst. */
static size_t bursts_budget(size_t kv, size_t stb, int cycles)
{
    return (size_t)(1200 + 70 * cycles + 50) * kv + 2 * (160 * kv + stb) + stb;
}

/* Recency wins: short sessions that come back at once, interleaved with
 * long one-off documents that FLOP efficiency would keep. */
static void trace_sessions_vs_docs(trace_t *t, int cycles)
{
    static int doc[2000], sess[4][4000];
    int len[4] = {0};
    for (int c = 0; c < cycles; c++) {
        fill(doc, 900, 0, 400);
        doc[0] = 300 + c % 90;
        fill(doc + 900, 10, 0, 400);
        trace_add(t, doc, 900, 910);
        for (int s = 0; s < 4; s++) {
            if (c % 3 == 0) { /* a new session */
                len[s] = 50;
                fill(sess[s], 50, 0, 400);
                sess[s][0] = 10 + (c * 4 + s) % 280;
            }
            fill(sess[s] + len[s], 20, 0, 400);
            trace_add(t, sess[s], len[s], len[s] + 20);
            len[s] += 20;
            fill(sess[s] + len[s], 20, 0, 400);
            len[s] += 20;
        }
    }
}

static void test_alpha(void)
{
    hp_prefix_cache_t *probe = sim(1, 0, 0);
    size_t kv = hp_prefix_cache_kv_bytes(probe);
    size_t stb = hp_prefix_cache_state_bytes(probe);
    hp_prefix_cache_destroy(probe);
    hp_error_t err = {0};

    /* 1: replaying from an empty cache, FLOP-awareness beats LRU */
    trace_t t = {0};
    trace_long_vs_bursts(&t, 8);
    size_t budget = bursts_budget(kv, stb, 12);
    hp_prefix_cache_t *pc = sim(budget, 0, 0);
    double r0 = hp_prefix_cache_replay(pc, t.tr, t.n, 0.0, &err);
    double r8 = hp_prefix_cache_replay(pc, t.tr, t.n, 8.0, &err);
    ok(r8 > r0 + 0.2, "long-vs-bursts: hit rate alpha 8 %.3f > LRU %.3f", r8,
       r0);
    hp_prefix_cache_destroy(pc);

    /* 2: the bootstrap search, in its thread, on that workload */
    hp_prefix_cache_params_t p;
    hp_prefix_cache_params_default(&p, budget);
    p.tune = 1;
    p.tune_async = 1;
    p.bootstrap_mult = 5;
    p.bootstrap_min = 20;
    pc = hp_prefix_cache_create(&cfg, &p, NULL, &err);
    hp_prefix_cache_stats_t st;
    hp_prefix_cache_stats(pc, &st);
    ok(st.tune_phase == HP_PC_TUNE_WAIT, "a fresh cache waits for its first "
                                         "eviction to tune");
    trace_t u = {0};
    trace_long_vs_bursts(&u, 12);
    for (int i = 0; i < u.n; i++)
        request(pc, u.tr[i].ids, u.tr[i].n_prompt,
                u.tr[i].ids + u.tr[i].n_prompt, u.tr[i].n - u.tr[i].n_prompt,
                NULL);
    hp_prefix_cache_tune_wait(pc);
    hp_prefix_cache_stats(pc, &st);
    int best = 0, chosen = -1;
    for (int i = 0; i < p.n_alphas; i++) {
        if (st.tune_hit[i] > st.tune_hit[best])
            best = i;
        if (p.alphas[i] == st.alpha)
            chosen = i;
    }
    ok(st.tune_phase == HP_PC_TUNE_DONE && chosen == best && st.alpha > 0 &&
           st.tune_hit[best] > st.tune_hit[0],
       "threaded search adopted alpha %g: best replay hit rate %.3f > "
       "LRU's %.3f",
       st.alpha, st.tune_hit[best], st.tune_hit[0]);
    hp_prefix_cache_destroy(pc);
    trace_free(&u);
    trace_free(&t);

    /* 3: where recency is right, the search keeps alpha 0 */
    trace_sessions_vs_docs(&t, 24);
    budget = 2 * 910 * kv + 6 * (200 * kv + stb);
    pc = sim(budget, 0, 0);
    r0 = hp_prefix_cache_replay(pc, t.tr, t.n, 0.0, &err);
    r8 = hp_prefix_cache_replay(pc, t.tr, t.n, 8.0, &err);
    hp_prefix_cache_destroy(pc);
    hp_prefix_cache_params_default(&p, budget);
    p.tune_async = 0;
    p.bootstrap_mult = 5;
    p.bootstrap_min = 40;
    pc = hp_prefix_cache_create(&cfg, &p, NULL, &err);
    for (int i = 0; i < t.n; i++)
        request(pc, t.tr[i].ids, t.tr[i].n_prompt,
                t.tr[i].ids + t.tr[i].n_prompt, t.tr[i].n - t.tr[i].n_prompt,
                NULL);
    hp_prefix_cache_stats(pc, &st);
    best = 0;
    for (int i = 0; i < p.n_alphas; i++)
        if (st.tune_hit[i] > st.tune_hit[best])
            best = i;
    ok(r0 > r8 && st.tune_phase == 3 && st.alpha == p.alphas[best] &&
           st.alpha == 0,
       "sessions-vs-docs: LRU %.3f > alpha 8 %.3f; inline search keeps "
       "alpha %g",
       r0, r8, st.alpha);
    hp_prefix_cache_destroy(pc);
    trace_free(&t);
}

/* ---- the real model ------------------------------------------------------ */

static double rel(const float *a, const float *b, size_t n)
{
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        num += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
        den += (double)a[i] * a[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

typedef struct {
    hp_llm_t llm;
    hp_fwd_ws_t ws;
    float *lf, *lc;
    int V;
} model_ctx_t;

static double full_logits(model_ctx_t *x, const int *ids, int n, float *out)
{
    hp_seq_t s;
    hp_error_t err = {0};
    hp_seq_init(&s, &x->llm.model, &err);
    int rc = hp_prefill(&x->llm.model, &s, &x->ws, ids, n, 1024, out, &err);
    hp_seq_free(&s);
    return rc;
}

/* Greedy continuation of a prefilled seq. */
static int greedy(model_ctx_t *x, hp_seq_t *s, float *logits, int k,
                  hp_gen_result_t *res)
{
    hp_gen_params_t gp = {0};
    hp_error_t err = {0};
    gp.max_tokens = k;
    gp.ignore_eos = 1;
    return hp_generate(&x->llm, s, &x->ws, logits, &gp, NULL, NULL, res, &err);
}

/* Every checkpoint pc holds: a probe of its path plus fresh tokens must
 * resume exactly there and give full-prefill logits. */
static void probe_all(model_ctx_t *x, hp_prefix_cache_t *pc, const char *what)
{
    int depths[256], *paths[256], n;
    n = hp_prefix_cache_checkpoints(pc, depths, paths, 256);
    int bad_resume = 0, bad_logits = 0, tested = 0;
    double worst = 0;
    for (int i = 0; i < n && i < 256; i++) {
        int d = depths[i], len = d + 6;
        int *probe = malloc((size_t)len * sizeof(int));
        memcpy(probe, paths[i], (size_t)d * sizeof(int));
        fill(probe + d, 6, 400, 90);
        hp_seq_t s;
        hp_prefix_cache_req_t req;
        hp_error_t err = {0};
        hp_seq_init(&s, &x->llm.model, &err);
        int rc = hp_prefix_cache_prefill(pc, &x->llm.model, &x->ws, probe, len,
                                         -1, &s, x->lc, &req, &err);
        full_logits(x, probe, len, x->lf);
        double e = rel(x->lf, x->lc, x->V);
        tested++;
        bad_resume += rc != HP_OK || req.resume != d;
        bad_logits += !(e <= EXACT_TOL);
        worst = e > worst ? e : worst;
        if (rc == HP_OK)
            hp_prefix_cache_release(pc, &req);
        hp_seq_free(&s);
        free(probe);
        free(paths[i]);
    }
    ok(tested > 0 && bad_resume == 0,
       "%s: %d checkpoints, each probe resumed exactly there", what, tested);
    ok(bad_logits == 0,
       "%s: restore + recompute == full prefill logits (worst rel %.2e)", what,
       worst);
}

static void test_private_pool(model_ctx_t *x);

static void test_model(const char *root)
{
    char dir[1024];
    model_ctx_t x = {0};
    hp_error_t err = {0};
    snprintf(dir, sizeof(dir), "%s/models/test/qwen35-dense", root);
    if (!ok(hp_llm_load(&x.llm, dir, &err) == HP_OK, "qwen35-dense loads")) {
        tap_diag("%s", err.msg);
        return;
    }
    hp_fwd_ws_init(&x.ws, &x.llm.model, NULL, &err);
    x.V = x.llm.model.cfg.vocab_size;
    x.lf = malloc((size_t)x.V * 4);
    x.lc = malloc((size_t)x.V * 4);
    float *lg = malloc((size_t)x.V * 4);

    hp_prefix_cache_params_t p;
    hp_prefix_cache_params_default(&p, 64 << 20);
    p.tune = 0;
    p.sparse = 2;
    p.dp_min_mass = 1e9; /* balanced: checkpoints at many depths */
    hp_prefix_cache_t *pc =
        hp_prefix_cache_create(&x.llm.model.cfg, &p, x.llm.model.be, &err);

    /* turn 1: S + a, greedy 10 tokens, finish */
    int P1[400], P2[400], P3[600];
    fill(P1, 88, 0, 400);
    hp_seq_t s1, sf;
    hp_prefix_cache_req_t r1;
    hp_gen_result_t g1, gf;
    hp_seq_init(&s1, &x.llm.model, &err);
    int rc = hp_prefix_cache_prefill(pc, &x.llm.model, &x.ws, P1, 88, -1, &s1,
                                     lg, &r1, &err);
    full_logits(&x, P1, 88, x.lf);
    ok(rc == HP_OK && r1.resume == 0 && rel(x.lf, lg, x.V) <= EXACT_TOL,
       "cold prefill through the cache equals full (rel %.2e)",
       rel(x.lf, lg, x.V));
    greedy(&x, &s1, lg, 10, &g1);
    ok(hp_prefix_cache_finish(pc, &r1, g1.tokens, g1.n_tokens, &s1, &err) ==
               HP_OK &&
           has_ckpt(pc, s1.n_pos),
       "turn 1 finished: checkpoint at the last decoded token (%d)", s1.n_pos);

    /* a sibling prompt branching after 48 tokens */
    memcpy(P2, P1, 48 * sizeof(int));
    fill(P2 + 48, 30, 0, 400);
    P2[48] = (P1[48] + 1) % 400;
    hp_seq_t s2;
    hp_prefix_cache_req_t r2;
    hp_seq_init(&s2, &x.llm.model, &err);
    hp_prefix_cache_prefill(pc, &x.llm.model, &x.ws, P2, 78, -1, &s2, lg, &r2,
                            &err);
    hp_prefix_cache_finish(pc, &r2, NULL, 0, &s2, &err);
    ok(has_ckpt(pc, 48), "the sibling's branch point (48) was captured");
    hp_seq_free(&s2);

    /* turn 2 extends turn 1's prompt and consumed output */
    int k1 = s1.n_pos;
    memcpy(P3, P1, 88 * sizeof(int));
    memcpy(P3 + 88, g1.tokens, (size_t)(k1 - 88) * sizeof(int));
    fill(P3 + k1, 25, 0, 400);
    int n3 = k1 + 25;
    hp_seq_t s3;
    hp_prefix_cache_req_t r3;
    hp_seq_init(&s3, &x.llm.model, &err);
    hp_seq_init(&sf, &x.llm.model, &err);
    rc = hp_prefix_cache_prefill(pc, &x.llm.model, &x.ws, P3, n3, -1, &s3, lg,
                                 &r3, &err);
    hp_prefill(&x.llm.model, &sf, &x.ws, P3, n3, 1024, x.lf, &err);
    ok(rc == HP_OK && r3.resume == k1,
       "turn 2 resumed from the last decoded token (%d of %d)", r3.resume, n3);
    ok(rel(x.lf, lg, x.V) <= EXACT_TOL, "turn 2 logits equal full (rel %.2e)",
       rel(x.lf, lg, x.V));
    hp_gen_result_t g3;
    greedy(&x, &s3, lg, 8, &g3);
    greedy(&x, &sf, x.lf, 8, &gf);
    ok(g3.n_tokens == 8 && gf.n_tokens == 8 &&
           !memcmp(g3.tokens, gf.tokens, 8 * sizeof(int)),
       "turn 2 greedy tokens identical to full");
    hp_prefix_cache_finish(pc, &r3, g3.tokens, g3.n_tokens, &s3, &err);
    free(g1.tokens);
    free(g3.tokens);
    free(gf.tokens);
    hp_seq_free(&s1);
    hp_seq_free(&s3);
    hp_seq_free(&sf);

    probe_all(&x, pc, "marconi + sparse");
    hp_prefix_cache_stats_t st;
    hp_prefix_cache_stats(pc, &st);
    ok(st.bytes_used <= st.budget && st.hit_tokens > 0,
       "within budget, %llu tokens restored",
       (unsigned long long)st.hit_tokens);
    hp_prefix_cache_destroy(pc);

    /* blocks of 256 on a prompt longer than a prefill piece (1024) */
    hp_prefix_cache_params_default(&p, 64 << 20);
    p.tune = 0;
    p.admit = HP_PC_ADMIT_BLOCK;
    p.block = 256;
    pc = hp_prefix_cache_create(&x.llm.model.cfg, &p, x.llm.model.be, &err);
    int *L = malloc(1400 * sizeof(int));
    fill(L, 1400, 0, 400);
    hp_seq_t sl;
    hp_prefix_cache_req_t rl;
    hp_seq_init(&sl, &x.llm.model, &err);
    rc = hp_prefix_cache_prefill(pc, &x.llm.model, &x.ws, L, 1400, -1, &sl, lg,
                                 &rl, &err);
    full_logits(&x, L, 1400, x.lf);
    ok(rc == HP_OK && rl.n_ckpt == 5 && rel(x.lf, lg, x.V) <= EXACT_TOL,
       "1400 tokens in two pieces, 5 block captures, logits equal full");
    hp_prefix_cache_finish(pc, &rl, NULL, 0, &sl, &err);
    hp_seq_free(&sl);
    probe_all(&x, pc, "blocks of 256 across pieces");
    hp_prefix_cache_destroy(pc);
    free(L);
    test_private_pool(&x);

    free(lg);
    free(x.lf);
    free(x.lc);
    hp_fwd_ws_free(&x.ws);
    hp_llm_free(&x.llm);
}

/* ---- the private pool (backend memory, an arena) ------------------------ */

/* Whether pc holds a checkpoint at depth on the path starting with t0. */
static int ckpt_on(hp_prefix_cache_t *pc, int t0, int depth)
{
    int d[64], *paths[64], n = hp_prefix_cache_checkpoints(pc, d, paths, 64);
    int found = 0;
    for (int i = 0; i < n && i < 64; i++) {
        found |= d[i] == depth && paths[i] && paths[i][0] == t0;
        free(paths[i]);
    }
    return found;
}

/* Prefill through the cache and finish at the prompt's end (as
 * prefix mode does); the resume depth, or -1. lg: the logits. */
static int turn(model_ctx_t *x, hp_prefix_cache_t *pc, const int *ids, int n,
                int hint, float *lg, hp_prefix_cache_req_t *req)
{
    hp_seq_t s;
    hp_error_t err = {0};
    hp_seq_init(&s, &x->llm.model, &err);
    int rc = hp_prefix_cache_prefill(pc, &x->llm.model, &x->ws, ids, n, hint,
                                     &s, lg, req, &err);
    int r = rc == HP_OK ? req->resume : -1;
    if (rc == HP_OK)
        hp_prefix_cache_finish(pc, req, NULL, 0, &s, &err);
    hp_seq_free(&s);
    return r;
}

/* K/V, checkpoints and snapshots are blobs of one arena of the budget.
 * Fragmentation: four prompts fill it exactly, two evicted leave two
 * holes that the byte count says hold a prompt of twice the length, but
 * no run does; the cache evicts one more (by its policy: the least
 * recent) and admits it. No room at all: a snapshot is skipped, the
 * prefill stays exact. */
static void test_private_pool(model_ctx_t *x)
{
    hp_error_t err = {0};
    hp_prefix_cache_params_t p;
    hp_prefix_cache_params_default(&p, 1 << 20);
    p.tune = 0;
    hp_prefix_cache_t *pc =
        hp_prefix_cache_create(&x->llm.model.cfg, &p, NULL, &err);
    size_t kv = hp_prefix_cache_kv_bytes(pc),
           sb = hp_prefix_cache_state_bytes(pc), st = hp_arena_round(sb);
    hp_prefix_cache_destroy(pc);
    int L = 8;
    while ((L * kv) % HP_ARENA_ALIGN || L * kv <= st)
        L += 8;
    size_t unit = L * kv + st;
    float *lg = malloc((size_t)x->V * sizeof(float));
    int P[5][400];
    for (int i = 0; i < 5; i++) {
        fill(P[i], 2 * L + 10, 0, 400);
        P[i][0] = 7 * i; /* five paths from the root */
    }
    hp_prefix_cache_req_t req;
    hp_prefix_cache_stats_t sts;

    p.budget = 4 * unit;
    pc = hp_prefix_cache_create(&x->llm.model.cfg, &p, x->llm.model.be, &err);
    for (int i = 0; i < 4; i++)
        turn(x, pc, P[i], L, -1, lg, &req);
    /* P1, then P3 resumed (touched); P0 and P2 evicted */
    for (int i = 1; i < 4; i += 2) {
        hp_seq_t s;
        hp_seq_init(&s, &x->llm.model, &err);
        if (hp_prefix_cache_begin(pc, P[i], L + 1, -1, &s, &req, &err) == HP_OK)
            hp_prefix_cache_release(pc, &req);
        hp_seq_free(&s);
    }
    int e0 = hp_prefix_cache_evict_one(pc), e1 = hp_prefix_cache_evict_one(pc);
    hp_prefix_cache_stats(pc, &sts);
    ok(e0 == L && e1 == L && sts.bytes_used == 2 * (L * kv + sb) &&
           !ckpt_on(pc, P[0][0], L) && ckpt_on(pc, P[1][0], L) &&
           !ckpt_on(pc, P[2][0], L) && ckpt_on(pc, P[3][0], L),
       "%d-token prompts: 4 fill %zu bytes; P0 and P2 evicted, P1 and P3 "
       "kept",
       L, p.budget);
    int r = turn(x, pc, P[4], 2 * L, -1, lg, &req);
    hp_prefix_cache_stats(pc, &sts);
    ok(r == 0 && sts.arena_evictions == 1 && ckpt_on(pc, P[4][0], 2 * L) &&
           !ckpt_on(pc, P[1][0], L) && ckpt_on(pc, P[3][0], L) &&
           sts.bytes_used <= sts.budget,
       "a %d-token prompt fits the count, not a run: one more evicted (the "
       "least recent, P1; %llu such evictions), admitted",
       2 * L, (unsigned long long)sts.arena_evictions);
    r = turn(x, pc, P[4], 2 * L + 10, -1, lg, &req);
    full_logits(x, P[4], 2 * L + 10, x->lf);
    ok(r == 2 * L && rel(x->lf, lg, x->V) <= EXACT_TOL,
       "it resumes at %d from the arena, logits equal full (rel %.2e)", r,
       rel(x->lf, lg, x->V));
    hp_prefix_cache_destroy(pc);

    /* one prompt fills the pool; the next pins it, so its snapshot at
     * the hint (L + 5) finds no room and is skipped */
    p.budget = unit;
    pc = hp_prefix_cache_create(&x->llm.model.cfg, &p, x->llm.model.be, &err);
    turn(x, pc, P[0], L, -1, lg, &req);
    hp_seq_t s;
    hp_seq_init(&s, &x->llm.model, &err);
    int rc = hp_prefix_cache_prefill(pc, &x->llm.model, &x->ws, P[0], L + 10,
                                     L + 5, &s, lg, &req, &err);
    full_logits(x, P[0], L + 10, x->lf);
    hp_prefix_cache_stats(pc, &sts);
    ok(rc == HP_OK && req.resume == L && req.n_ckpt == 0 && sts.skipped == 1 &&
           sts.snap_bytes == 0 && rel(x->lf, lg, x->V) <= EXACT_TOL,
       "no room for a snapshot: the capture skipped (%llu), the prefill "
       "exact (rel %.2e)",
       (unsigned long long)sts.skipped, rel(x->lf, lg, x->V));
    hp_prefix_cache_release(pc, &req);
    hp_seq_free(&s);
    hp_prefix_cache_destroy(pc);

    /* room: the snapshot is held (counted) until the request ends */
    p.budget = 64 << 20;
    pc = hp_prefix_cache_create(&x->llm.model.cfg, &p, x->llm.model.be, &err);
    turn(x, pc, P[0], L, -1, lg, &req);
    hp_seq_init(&s, &x->llm.model, &err);
    rc = hp_prefix_cache_begin(pc, P[0], L + 10, L + 5, &s, &req, &err);
    hp_prefix_cache_stats(pc, &sts);
    size_t held = sts.snap_bytes;
    int nck = req.n_ckpt;
    if (rc == HP_OK)
        hp_prefix_cache_release(pc, &req);
    hp_prefix_cache_stats(pc, &sts);
    ok(rc == HP_OK && nck == 1 && held == sb && sts.snap_bytes == 0,
       "a snapshot is counted while its request runs (%zu bytes), given back "
       "at its end",
       held);
    hp_seq_free(&s);
    hp_prefix_cache_destroy(pc);
    free(lg);
}

int main(void)
{
    const char *root = getenv("HYPIC_ROOT") ? getenv("HYPIC_ROOT") : ".";
    char dir[1024];
    hp_error_t err = {0};
    snprintf(dir, sizeof(dir), "%s/models/test/qwen35-dense", root);
    if (!ok(hp_model_config_load(&cfg, dir, &err) == HP_OK,
            "qwen35-dense config (the simulator's geometry)")) {
        tap_diag("%s", err.msg);
        return tap_done();
    }
    test_flops();
    test_admission();
    test_sparse();
    test_eviction_order();
    test_pins();
    test_alpha();
    test_model(root);
    return tap_done();
}
