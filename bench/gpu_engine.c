/*
 * gpu_engine.c - the whole engine on one device (issue 14, item 6):
 * prefill tokens/s, batched decode tokens/s and PIC time to first token,
 * through the engine's own paths on the backend --device names.
 *
 *   build/bench/gpu_engine --model DIR [--device cpu|cuda[:N]]
 *       [--dtype auto|f32|bf16] [--tokens 4096,16384] [--batch 1,16,64,256]
 *       [--kvbuf-batch 1,64] [--decode 32]
 *       [--pic 4x4096,8x4096] [--tsv FILE] [--budget SECONDS]
 *       [--reps 3] [--piece P] [--prompt 16] [--lead 32] [--query 32]
 *       [--seam 8] [--name TAG] [--profile 0|1]
 *
 * prefill  one sequence of T synthetic tokens (bench_prompt_id) through
 *          hp_prefill in pieces of --piece (default the engine's,
 *          hp_fwd_piece: 1024 on the CPU, 4096 on a device), the last
 *          token's logits, the
 *          backend synchronized before the clock stops. --profile 1: then
 *          one more (and one more decode at each B, and one more warm
 *          PIC splice), untimed, under the
 *          backend's op profile
 *          (hp_backend_profile_start), its device time by kind of op on
 *          stderr, largest first: where a prefill's time goes.
 * decode   B sequences, each after a --prompt-token prompt of its own,
 *          then --decode greedy steps of all B through hp_forward_batch
 *          (the scheduler's batched step: argmax on the backend). Its
 *          progress line gives a step's ops, transfers (and how many of
 *          them copied: the device reuses an unchanged array's copy) and
 *          waits, and its wall time split into the host's (issuing) and
 *          its waits for the device (hp_backend_device_wait_s).
 * decode_kvbuf  the same at each --kvbuf-batch B, every sequence through
 *          KVBuffers (chunkwise: the server's form, hp_sched), after the
 *          PIC rows; none where the model or backend has no KVBuffer.
 * pic      lead + k documents of n tokens + query (bench_make_prompt):
 *          full (hp_assemble, every token prefilled), pic cold (the pool
 *          empty: each document prefilled on its own, cached, spliced),
 *          pic warm (every document cached first, untimed); then the
 *          per-segment fixed costs of the warm path: compose (every
 *          linear layer's T_C S + S_C|0 and conv jump), re-rotation (every
 *          full layer's K/V splice and RoPE shift) and seam (the 2w seam
 *          tokens of each document recomputed), each over the k cached
 *          entries divided by k.
 *
 * An untimed warm-up runs first. Each figure is the median of --reps
 * runs. With HYPIC_CUDA_TUNE=1 the last lines ("# tuned ...",
 * hp_backend_tuned) say which kernels the tuners chose at each size. Once
 * --budget seconds have passed no new measurement starts: those rows are
 * printed and written as skipped. A path the backend does not run is reported
 * as "unsupported: why" and the rest goes on. Prints a markdown table, line by
 * line (a run a timeout kills keeps what it printed), and its progress on
 * stderr (loading, warm-up, each measurement and each rep's seconds: where a
 * cut-short run was); appends rows to --tsv with the columns measure, shape,
 * ours, anchor, anchor_value, unit (anchor columns "-": bench/gpu_engine_ref.py
 * fills them); shapes carry --name (default the model folder's name).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/bench_engine.h"
#include "bench/bench_util.h"
#include "engine/cache/assemble.h"
#include "engine/cache/segcache.h"
#include "engine/forward/forward.h"
#include "engine/forward/sampler.h"
#include "engine/model/llm.h"

#define MAX_LIST 16
#define MAX_REPS 15

typedef struct {
    const char *model, *device, *tsv, *name;
    hp_compute_t dtype; /* --dtype (hp_model_set_compute) */
    int tokens[MAX_LIST], n_tokens;
    int batch[MAX_LIST], n_batch;
    int pic_k[MAX_LIST], pic_n[MAX_LIST], n_pic;
    int decode, reps, piece, prompt, lead, query, seam, profile;
    int kv_batch[MAX_LIST], n_kv_batch;
    double budget;
} opts_t;

typedef struct {
    const opts_t *o;
    hp_llm_t llm;
    const hp_backend_t *be;
    hp_fwd_ws_t ws;
    float *lg; /* [vocab], host */
    FILE *tsv;
    double t0; /* start, for the budget */
    int skipped;
} bench_t;

/* ---- reporting ----------------------------------------------------------- */

/* One figure: a table row and a TSV row. what: NULL for a value, else
 * why there is none ("skipped ...", "unsupported: ..."). */
static void row(bench_t *b, const char *measure, const char *shape, double v,
                const char *unit, const char *what)
{
    char val[320];
    if (what)
        snprintf(val, sizeof(val), "%s", what);
    else
        snprintf(val, sizeof(val), "%.6g", v);
    for (char *s = val; *s; s++) /* one TSV field, one table cell */
        if (*s == '\t' || *s == '\n' || *s == '|')
            *s = ' ';
    printf("| %s | %s | %s | %s |\n", measure, shape, val, unit);
    fflush(stdout);
    if (b->tsv) {
        fprintf(b->tsv, "%s\t%s/%s\t%s\t-\t-\t%s\n", measure, b->o->name, shape,
                val, unit);
        fflush(b->tsv);
    }
}

/* 1 when the budget is spent: the caller skips its measurement. */
static int over_budget(bench_t *b)
{
    if (b->o->budget <= 0 || bench_now() - b->t0 < b->o->budget)
        return 0;
    b->skipped++;
    return 1;
}

static int fail_row(bench_t *b, const char *measure, const char *shape,
                    const char *unit, const hp_error_t *err)
{
    char why[300];
    snprintf(why, sizeof(why), "%s: %.280s",
             err->code == HP_EUNAVAIL ? "unsupported" : "failed", err->msg);
    row(b, measure, shape, 0, unit, why);
    return err->code;
}

/* One measurement's timed run: seconds into *dt. */
typedef int (*once_fn)(bench_t *b, const void *arg, double *dt,
                       hp_error_t *err);

/* Runs fn --reps times (none past the budget: then HP_EBUSY) and writes
 * the row: work over the median seconds (a rate), or with work 0 the
 * median in ms; into *v if v is not NULL. HP_OK, or why there is none
 * (err set; the row says so). */
static int measure(bench_t *b, const char *name, const char *shape,
                   const char *unit, double work, once_fn fn, const void *arg,
                   double *v, hp_error_t *err)
{
    double dt[MAX_REPS], val;
    int r = 0, rc = HP_OK;
    if (over_budget(b)) {
        row(b, name, shape, 0, unit, "skipped (budget)");
        return hp_error_set(err, HP_EBUSY, "skipped (budget)");
    }
    /* progress, so a run cut short by a timeout says where it was */
    fprintf(stderr, "# %s %s: measuring (%.1f s in)\n", name, shape,
            bench_now() - b->t0);
    for (; r < b->o->reps && rc == HP_OK; r++) {
        rc = fn(b, arg, &dt[r], err);
        if (rc == HP_OK)
            fprintf(stderr, "#   rep %d: %.4g s\n", r + 1, dt[r]);
    }
    if (rc != HP_OK)
        return fail_row(b, name, shape, unit, err);
    val = work > 0 ? work / bench_median(dt, r) : bench_median(dt, r) * 1e3;
    row(b, name, shape, val, unit, NULL);
    if (v)
        *v = val;
    return HP_OK;
}

/* ---- prefill ------------------------------------------------------------- */

/* One T-token prefill from an empty sequence, seconds into *dt. */
static int prefill_once(bench_t *b, const int *ids, int T, double *dt,
                        hp_error_t *err)
{
    const hp_model_t *m = &b->llm.model;
    hp_seq_t seq;
    int rc = hp_seq_init(&seq, m, err);
    if (rc != HP_OK)
        return rc;
    rc = hp_seq_reserve(&seq, T, err); /* K/V caches outside the clock */
    double a = bench_now();
    if (rc == HP_OK)
        rc = hp_prefill(m, &seq, &b->ws, ids, T, b->o->piece, b->lg, err);
    if (rc == HP_OK)
        rc = hp_backend_sync(b->be, err);
    *dt = bench_now() - a;
    hp_seq_free(&seq);
    return rc;
}

typedef struct {
    const int *ids;
    int T;
} prefill_arg_t;

static int prefill_run(bench_t *b, const void *arg, double *dt, hp_error_t *err)
{
    const prefill_arg_t *a = arg;
    return prefill_once(b, a->ids, a->T, dt, err);
}

static int prof_cmp(const void *a, const void *b)
{
    double x = ((const hp_backend_prof_row_t *)a)->ms,
           y = ((const hp_backend_prof_row_t *)b)->ms;
    return (x < y) - (x > y);
}

/* The backend's op profile (hp_backend_profile_start) around one run:
 * profile_begin, the run (rc, its wall dt), then profile_end prints its
 * device time by kind of op, largest first, under what. */
static int profile_begin(bench_t *b, hp_error_t *err)
{
    return hp_backend_profile_start(b->be, err);
}

static void profile_end(bench_t *b, const char *what, int rc, double dt,
                        hp_error_t *err)
{
    hp_backend_prof_row_t rows[64];
    const int cap = (int)(sizeof(rows) / sizeof(rows[0]));
    double all = 0;
    int n = 0, calls = 0;
    hp_error_t e2 = {0};
    int rs = hp_backend_profile_stop(b->be, rows, cap, &n, &e2);
    if (rc == HP_OK && rs != HP_OK) {
        rc = rs;
        *err = e2;
    }
    if (rc != HP_OK) {
        fprintf(stderr, "# profile %s: %s\n", what, err->msg);
        return;
    }
    qsort(rows, (size_t)n, sizeof(rows[0]), prof_cmp);
    for (int i = 0; i < n; i++)
        all += rows[i].ms, calls += (int)rows[i].calls;
    fprintf(stderr,
            "# profile %s: %.2f ms of device time in %d ops (wall %.2f ms)\n",
            what, all, calls, dt * 1e3);
    for (int i = 0; i < n; i++)
        fprintf(stderr, "#   %-24s %10.3f ms %5.1f %% %7ld calls\n", rows[i].op,
                rows[i].ms, all > 0 ? 100 * rows[i].ms / all : 0,
                rows[i].calls);
}

/* One more prefill under the op profile. */
static void profile_prefill(bench_t *b, const int *ids, int T)
{
    char what[64];
    hp_error_t err = {0};
    double dt = 0;
    if (over_budget(b))
        return;
    snprintf(what, sizeof(what), "prefill T=%d", T);
    int rc = profile_begin(b, &err);
    if (rc != HP_OK) {
        fprintf(stderr, "# profile %s: %s\n", what, err.msg);
        return;
    }
    rc = prefill_once(b, ids, T, &dt, &err);
    profile_end(b, what, rc, dt, &err);
}

static void bench_prefill(bench_t *b, int T)
{
    char shape[64];
    hp_error_t err = {0};
    int *ids = malloc((size_t)T * sizeof(int));
    for (int t = 0; t < T; t++)
        ids[t] = bench_prompt_id(t, b->llm.model.cfg.vocab_size);
    prefill_arg_t a = {ids, T};
    snprintf(shape, sizeof(shape), "T=%d", T);
    measure(b, "prefill", shape, "tok/s", T, prefill_run, &a, NULL, &err);
    if (b->o->profile)
        profile_prefill(b, ids, T);
    free(ids);
}

/* ---- batched decode ------------------------------------------------------ */

/* A batched decode: B sequences, through KVBuffers (chunkwise, the
 * server's form) or not (the recurrent step). */
typedef struct {
    int B, kv;
} decode_arg_t;

/* The KVBuffer pool of a batch of B chunkwise decodes, sized as the
 * server sizes its own (hp_sched: every request at its largest). */
static int decode_pool(const hp_model_t *m, int B, hp_kvbuf_pool_t *pool,
                       hp_error_t *err)
{
    const hp_model_config_t *c = &m->cfg;
    hp_kvbuf_config_t kc;
    hp_kvbuf_config_default(&kc, c->lin_k_heads, c->lin_v_heads, c->lin_k_dim,
                            c->lin_v_dim);
    kc.max_batch = B;
    kc.n_blocks =
        B * c->n_lin * ((kc.cap + kc.max_step - 1) / kc.block_tokens + 1);
    kc.be = m->be;
    return hp_kvbuf_pool_init(pool, &kc, err);
}

/* a's B sequences after their prompts, then n_dec batched greedy steps;
 * seconds of the steps into *dt. */
static int decode_once(bench_t *b, decode_arg_t d, int n_dec, double *dt,
                       const char *prof, hp_error_t *err)
{
    const hp_model_t *m = &b->llm.model;
    const int V = m->cfg.vocab_size, P = b->o->prompt, B = d.B;
    hp_seq_t *seq = calloc((size_t)B, sizeof(*seq));
    hp_fwd_item_t *it = calloc((size_t)B, sizeof(*it));
    int *tok = malloc((size_t)B * sizeof(int));
    int *ids = malloc((size_t)P * sizeof(int)), n_seq = 0, rc = HP_OK;
    hp_kvbuf_pool_t pool;
    int pooled = 0;
    if (!seq || !it || !tok || !ids)
        rc = hp_error_set(err, HP_ENOMEM, "decode: out of memory");
    if (rc == HP_OK && d.kv)
        pooled = (rc = decode_pool(m, B, &pool, err)) == HP_OK;
    for (int i = 0; i < B && rc == HP_OK; i++) {
        if ((rc = hp_seq_init(&seq[i], m, err)) != HP_OK)
            break;
        n_seq++;
        for (int t = 0; t < P; t++) /* a prompt of its own per sequence */
            ids[t] = bench_prompt_id((long)i * P + t, V);
        rc = hp_seq_reserve(&seq[i], P + n_dec + 1, err);
        if (rc == HP_OK)
            rc =
                hp_prefill(m, &seq[i], &b->ws, ids, P, b->o->piece, b->lg, err);
        if (rc == HP_OK && pooled)
            rc = hp_seq_kvbuf_open(&seq[i], &pool, err);
        tok[i] = hp_argmax(b->lg, V);
    }
    if (rc == HP_OK)
        rc = hp_backend_sync(b->be, err);
    unsigned long o0 = hp_backend_op_count(b->be);
    unsigned long t0 = hp_backend_transfer_count(b->be);
    unsigned long c0 = hp_backend_host_copies(b->be);
    unsigned long w0 = hp_backend_device_waits(b->be);
    if (rc == HP_OK && prof)
        rc = profile_begin(b, err);
    double ws0 = hp_backend_device_wait_s(b->be), a = bench_now();
    for (int s = 0; s < n_dec && rc == HP_OK; s++) {
        /* greedy as the scheduler asks it: each row's argmax on the
         * backend, the logits left there */
        for (int i = 0; i < B; i++)
            it[i] = (hp_fwd_item_t){
                .seq = &seq[i], .ids = &tok[i], .T = 1, .argmax = 1};
        rc = hp_forward_batch(m, it, B, &b->ws, err);
        for (int i = 0; i < B && rc == HP_OK; i++) {
            if (it[i].status != HP_OK)
                rc = hp_error_set(err, it[i].status, "%s", it[i].err.msg);
            else
                tok[i] = it[i].best[0];
        }
    }
    if (rc == HP_OK)
        rc = hp_backend_sync(b->be, err);
    *dt = bench_now() - a;
    const double waited = hp_backend_device_wait_s(b->be) - ws0;
    if (prof)
        profile_end(b, prof, rc, *dt, err);
    /* what a step costs the host: flat in B since the step issues each
     * op once over all rows (backend.h, hp_backend_op_count); and its
     * wall time split into the host's own (issuing the ops) and its waits
     * for the device: a step with little waiting is bound by the host */
    if (rc == HP_OK)
        fprintf(stderr,
                "#   per step: %.1f ops, %.1f transfers (%.1f copied), "
                "%.1f waits; %.3f ms: host %.3f, waiting %.3f\n",
                (double)(hp_backend_op_count(b->be) - o0) / n_dec,
                (double)(hp_backend_transfer_count(b->be) - t0) / n_dec,
                (double)(hp_backend_host_copies(b->be) - c0) / n_dec,
                (double)(hp_backend_device_waits(b->be) - w0) / n_dec,
                1e3 * *dt / n_dec, 1e3 * (*dt - waited) / n_dec,
                1e3 * waited / n_dec);
    for (int i = 0; i < n_seq; i++)
        hp_seq_free(&seq[i]);
    if (pooled)
        hp_kvbuf_pool_free(&pool);
    free(seq);
    free(it);
    free(tok);
    free(ids);
    return rc;
}

static int decode_run(bench_t *b, const void *arg, double *dt, hp_error_t *err)
{
    return decode_once(b, *(const decode_arg_t *)arg, b->o->decode, dt, NULL,
                       err);
}

static void bench_decode(bench_t *b, int B, int kv)
{
    char shape[64], what[64];
    const char *op = kv ? "decode_kvbuf" : "decode";
    hp_error_t err = {0};
    double dt = 0;
    decode_arg_t a = {B, kv};
    snprintf(shape, sizeof(shape), "B=%d", B);
    measure(b, op, shape, "tok/s", (double)B * b->o->decode, decode_run, &a,
            NULL, &err);
    if (!b->o->profile || over_budget(b))
        return;
    /* where a step's time goes: one more under the op profile (its marks
     * cost the host too: the split above is the unprofiled one's) */
    snprintf(what, sizeof(what), "%s B=%d", op, B);
    decode_once(b, a, b->o->decode, &dt, what, &err);
}

/* ---- PIC time to first token --------------------------------------------- */

typedef struct {
    hp_prompt_t p;
    hp_cache_t cache;
    int k, n;
} pic_t;

/* hp_assemble of the prompt in mode (warm: every segment cached first,
 * untimed; else the pool emptied); seconds into *dt. The sequence is
 * kept in *keep when it is not NULL (the caller frees it). prof: the
 * timed part under the op profile, printed under that name. */
static int assemble_once(bench_t *b, pic_t *pc, hp_ipc_mode_t mode, int warm,
                         double *dt, hp_seq_t *keep, const char *prof,
                         hp_error_t *err)
{
    const hp_model_t *m = &b->llm.model;
    int w = b->o->seam, rc;
    hp_pool_clear(pc->cache.pub);
    if (warm && (rc = hp_assemble_warm(&b->llm, &pc->cache, &b->ws, &pc->p,
                                       mode, w, NULL, err)) != HP_OK)
        return rc;
    hp_seq_t seq;
    if ((rc = hp_seq_init(&seq, m, err)) != HP_OK)
        return rc;
    rc = hp_seq_reserve(&seq, pc->p.n, err);
    if (rc == HP_OK)
        rc = hp_backend_sync(b->be, err);
    if (rc == HP_OK && prof)
        rc = profile_begin(b, err);
    double a = bench_now();
    if (rc == HP_OK)
        rc = hp_assemble(&b->llm, &pc->cache, &b->ws, &pc->p, mode, w, &seq,
                         b->lg, NULL, err);
    if (rc == HP_OK)
        rc = hp_backend_sync(b->be, err);
    *dt = bench_now() - a;
    if (prof)
        profile_end(b, prof, rc, *dt, err);
    if (keep && rc == HP_OK)
        *keep = seq;
    else
        hp_seq_free(&seq);
    return rc;
}

/* The fixed costs of the warm splice, per segment, into ms[3] (compose,
 * re-rotation, seam); the pool holds every segment, seq is the warm
 * result (its positions reserved). */
static int fixed_costs(bench_t *b, pic_t *pc, hp_seq_t *seq, double ms[3],
                       hp_error_t *err)
{
    const hp_model_t *m = &b->llm.model;
    const hp_model_config_t *c = &m->cfg;
    const hp_prompt_t *p = &pc->p;
    int w = b->o->seam, k = 0, n_seam = 0, rc = HP_OK;
    hp_pool_entry_t **ent = calloc((size_t)p->n_segs, sizeof(*ent));
    int *at = calloc((size_t)p->n_segs, sizeof(int));
    int *ids = malloc((size_t)p->n_segs * 2 * w * sizeof(int) + 1);
    int *pos = malloc((size_t)p->n_segs * 2 * w * sizeof(int) + 1);
    hp_fwd_jump_mem_t jm = hp_fwd_jump_mem(&b->ws);
    double t[3][MAX_REPS];
    if (!ent || !at || !ids || !pos)
        rc = hp_error_set(err, HP_ENOMEM, "fixed costs: out of memory");
    for (int i = 0; i < p->n_segs && rc == HP_OK; i++) {
        const hp_prompt_seg_t *s = &p->segs[i];
        if (s->role != HP_SEG_PIC)
            continue;
        ent[k] = hp_pool_get(pc->cache.pub, s->id,
                             hp_assemble_variant(s, HP_IPC_MODE_PIC, w));
        if (!ent[k]) {
            rc = hp_error_set(err, HP_EINTERNAL, "segment %d not cached", i);
            break;
        }
        at[k++] = s->start;
        for (int j = 0; j < s->len; j++) /* the seams: first and last w */
            if (j < w || j >= s->len - w) {
                ids[n_seam] = p->ids[s->start + j];
                pos[n_seam++] = s->start + j;
            }
    }
    int r = 0;
    for (; r < b->o->reps && rc == HP_OK && k > 0; r++) {
        double a = bench_now();
        for (int j = 0; j < k; j++)
            for (int l = 0; l < c->n_layers; l++)
                if (c->layer_kind[l] == HP_LAYER_LINEAR)
                    hp_assemble_compose(b->be, c, l, seq->layers[l].S,
                                        seq->layers[l].conv, ent[j], 0, &jm);
        rc = hp_backend_sync(b->be, err);
        double a2 = bench_now();
        for (int j = 0; j < k && rc == HP_OK; j++)
            hp_assemble_splice_kv(seq, ent[j], at[j] + w, at[j]);
        if (rc == HP_OK)
            rc = hp_backend_sync(b->be, err);
        double a3 = bench_now();
        if (rc == HP_OK)
            rc = hp_forward(m, seq, &b->ws, ids, pos, n_seam, NULL,
                            HP_LOGITS_NONE, NULL, err);
        if (rc == HP_OK)
            rc = hp_backend_sync(b->be, err);
        double a4 = bench_now();
        t[0][r] = (a2 - a) / k;
        t[1][r] = (a3 - a2) / k;
        t[2][r] = (a4 - a3) / k;
    }
    for (int i = 0; i < 3 && rc == HP_OK; i++)
        ms[i] = r > 0 ? bench_median(t[i], r) * 1e3 : 0;
    for (int j = 0; j < k; j++)
        hp_pool_release(pc->cache.pub, ent[j]);
    free(ent);
    free(at);
    free(ids);
    free(pos);
    return rc;
}

static void pic_prompt(bench_t *b, pic_t *pc, int k, int n)
{
    const int V = b->llm.model.cfg.vocab_size;
    int nl = b->o->lead, nq = b->o->query;
    int **doc = malloc((size_t)k * sizeof(int *));
    int *dlen = malloc((size_t)k * sizeof(int));
    int *order = malloc((size_t)k * sizeof(int));
    int *lead = malloc((size_t)nl * sizeof(int) + 1);
    int *query = malloc((size_t)nq * sizeof(int) + 1);
    uint64_t rng = BENCH_SEED;
    for (int i = 0; i < k; i++) {
        doc[i] = malloc((size_t)n * sizeof(int));
        dlen[i] = n;
        order[i] = i;
        for (int t = 0; t < n; t++)
            doc[i][t] = (int)(bench_xorshift(&rng) % (uint64_t)V);
    }
    for (int t = 0; t < nl; t++)
        lead[t] = (int)(bench_xorshift(&rng) % (uint64_t)V);
    for (int t = 0; t < nq; t++)
        query[t] = (int)(bench_xorshift(&rng) % (uint64_t)V);
    bench_make_prompt(&pc->p, &b->llm, doc, dlen, order, k, lead, nl, query,
                      nq);
    for (int i = 0; i < k; i++)
        free(doc[i]);
    free(doc);
    free(dlen);
    free(order);
    free(lead);
    free(query);
    pc->k = k;
    pc->n = n;
}

typedef struct {
    pic_t *pc;
    hp_ipc_mode_t mode;
    int warm;
} pic_arg_t;

static int pic_run(bench_t *b, const void *arg, double *dt, hp_error_t *err)
{
    const pic_arg_t *a = arg;
    return assemble_once(b, a->pc, a->mode, a->warm, dt, NULL, NULL, err);
}

static void bench_pic(bench_t *b, int k, int n)
{
    static const char *const names[] = {"ttft_full", "ttft_pic_cold",
                                        "ttft_pic_warm"};
    static const char *const fixed[] = {
        "pic_compose_per_seg", "pic_rerotate_per_seg", "pic_seam_per_seg"};
    char shape[64];
    hp_error_t err = {0};
    pic_t pc = {0};
    snprintf(shape, sizeof(shape), "%dx%d", k, n);
    pic_prompt(b, &pc, k, n);
    /* the prompt's length, for the reference's `full` of the same tokens */
    row(b, "pic_prompt_tokens", shape, pc.p.n, "tokens", NULL);
    pc.cache.pub = hp_segc_pool_create(
        b->be,
        2 * (size_t)k *
                hp_segc_bytes(&b->llm.model.cfg, HP_SEGC_PIC, n, b->o->seam) +
            hp_segc_bytes(&b->llm.model.cfg, HP_SEGC_STATE, b->o->lead, 0) +
            (64u << 20),
        &err);
    if (!pc.cache.pub) {
        for (int i = 0; i < 3; i++)
            fail_row(b, names[i], shape, "ms", &err);
        hp_prompt_free(&pc.p);
        return;
    }
    double v[3] = {0, 0, 0}, ms[3];
    int rc = HP_OK;
    for (int mi = 0; mi < 3; mi++) {
        pic_arg_t a = {&pc, mi == 0 ? HP_IPC_MODE_FULL : HP_IPC_MODE_PIC,
                       mi == 2};
        if (mi == 2 && rc != HP_OK && rc != HP_EBUSY) {
            fail_row(b, names[2], shape, "ms", &err); /* as cold: no PIC */
            continue;
        }
        rc = measure(b, names[mi], shape, "ms", 0, pic_run, &a, &v[mi], &err);
    }
    /* the fixed costs, on the warm result */
    hp_seq_t seq;
    if (rc == HP_OK && over_budget(b))
        rc = hp_error_set(&err, HP_EBUSY, "skipped (budget)");
    if (rc == HP_OK) {
        double dt;
        rc = assemble_once(b, &pc, HP_IPC_MODE_PIC, 1, &dt, &seq, NULL, &err);
        if (rc == HP_OK) {
            rc = fixed_costs(b, &pc, &seq, ms, &err);
            hp_seq_free(&seq);
        }
    }
    for (int i = 0; i < 3; i++)
        if (rc == HP_EBUSY)
            row(b, fixed[i], shape, 0, "ms", "skipped (budget)");
        else if (rc != HP_OK)
            fail_row(b, fixed[i], shape, "ms", &err);
        else
            row(b, fixed[i], shape, ms[i], "ms", NULL);
    /* where the warm splice's time goes: one more under the op profile */
    if (rc == HP_OK && b->o->profile && !over_budget(b)) {
        char what[96];
        double dt;
        snprintf(what, sizeof(what), "ttft_pic_warm %s", shape);
        assemble_once(b, &pc, HP_IPC_MODE_PIC, 1, &dt, NULL, what, &err);
    }
    double full = v[0], warm = v[2];
    if (full > 0 && warm > 0)
        printf("# %s: warm PIC %.2fx faster than full\n", shape, full / warm);
    hp_pool_destroy(pc.cache.pub);
    hp_prompt_free(&pc.p);
}

/* ---- setup --------------------------------------------------------------- */

static int parse_list(const char *s, int *v, int max)
{
    int n = 0;
    while (*s && n < max)
        v[n++] = bench_next_int(&s);
    return n;
}

/* "4x4096,8x4096" */
static int parse_pic(const char *s, int *k, int *n, int max)
{
    int c = 0;
    while (*s && c < max) {
        k[c] = atoi(s);
        s += strcspn(s, "x,");
        if (*s != 'x')
            return -1;
        s++;
        n[c++] = bench_next_int(&s);
    }
    return c;
}

static int usage(void)
{
    fprintf(stderr,
            "usage: gpu_engine --model DIR [--device cpu|cuda[:N]] [--dtype "
            "auto|f32|bf16]\n       [--tokens 4096,16384] [--batch "
            "1,16,64,256] [--kvbuf-batch 1,64] [--decode N] [--pic "
            "4x4096,8x4096] [--tsv FILE]\n       [--budget S] [--reps R] "
            "[--piece P] [--prompt N] [--lead N] [--query N]\n       [--seam "
            "W] [--name TAG] [--profile 0|1]\n");
    return 2;
}

static int parse(opts_t *o, int argc, char **argv)
{
    *o = (opts_t){.device = "cpu",
                  .decode = 32,
                  .reps = 3,
                  .piece = 0,
                  .prompt = 16,
                  .lead = 32,
                  .query = 32,
                  .seam = HP_SEAM_DEFAULT};
    o->n_tokens = parse_list("4096,16384", o->tokens, MAX_LIST);
    o->n_batch = parse_list("1,16,64,256", o->batch, MAX_LIST);
    o->n_kv_batch = parse_list("1,64", o->kv_batch, MAX_LIST);
    o->n_pic = parse_pic("4x4096,8x4096", o->pic_k, o->pic_n, MAX_LIST);
    for (int i = 1; i < argc; i += 2) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v)
            return usage();
        if (!strcmp(a, "--model"))
            o->model = v;
        else if (!strcmp(a, "--device"))
            o->device = v;
        else if (!strcmp(a, "--dtype")) {
            if (hp_compute_parse(v, &o->dtype))
                return usage();
        } else if (!strcmp(a, "--tsv"))
            o->tsv = v;
        else if (!strcmp(a, "--name"))
            o->name = v;
        else if (!strcmp(a, "--tokens"))
            o->n_tokens = parse_list(v, o->tokens, MAX_LIST);
        else if (!strcmp(a, "--batch"))
            o->n_batch = parse_list(v, o->batch, MAX_LIST);
        else if (!strcmp(a, "--kvbuf-batch"))
            o->n_kv_batch = parse_list(v, o->kv_batch, MAX_LIST);
        else if (!strcmp(a, "--pic"))
            o->n_pic = parse_pic(v, o->pic_k, o->pic_n, MAX_LIST);
        else if (!strcmp(a, "--decode"))
            o->decode = atoi(v);
        else if (!strcmp(a, "--budget"))
            o->budget = atof(v);
        else if (!strcmp(a, "--reps"))
            o->reps = atoi(v);
        else if (!strcmp(a, "--piece"))
            o->piece = atoi(v);
        else if (!strcmp(a, "--prompt"))
            o->prompt = atoi(v);
        else if (!strcmp(a, "--lead"))
            o->lead = atoi(v);
        else if (!strcmp(a, "--query"))
            o->query = atoi(v);
        else if (!strcmp(a, "--seam"))
            o->seam = atoi(v);
        else if (!strcmp(a, "--profile"))
            o->profile = atoi(v);
        else
            return usage();
    }
    if (!o->model || o->n_pic < 0 || o->reps < 1 || o->reps > MAX_REPS ||
        o->decode < 1 || o->piece < 0 || o->prompt < 1 || o->lead < 0 ||
        o->query < 1)
        return usage();
    for (int i = 0; i < o->n_pic; i++)
        if (o->pic_k[i] < 1 || o->pic_n[i] <= 2 * o->seam)
            return usage();
    if (!o->name) { /* the model folder's name */
        size_t n = strlen(o->model);
        while (n > 1 && o->model[n - 1] == '/')
            n--;
        size_t s = n;
        while (s > 0 && o->model[s - 1] != '/')
            s--;
        static char nm[256];
        snprintf(nm, sizeof(nm), "%.*s", (int)(n - s), o->model + s);
        o->name = nm;
    }
    return 0;
}

/* The workspace's plan: the largest piece, batch and context asked for;
 * engine_piece: hp_assemble's pieces (hp_fwd_piece), whatever --piece. */
static hp_fwd_plan_t plan_of(const opts_t *o, int engine_piece)
{
    hp_fwd_plan_t p = {o->piece, 1, 1, 1};
    for (int i = 0; i < o->n_tokens; i++)
        if (o->tokens[i] > p.max_ctx)
            p.max_ctx = o->tokens[i];
    for (int i = 0; i < o->n_batch; i++)
        if (o->batch[i] > p.max_batch)
            p.max_batch = o->batch[i];
    for (int i = 0; i < o->n_kv_batch; i++)
        if (o->kv_batch[i] > p.max_batch)
            p.max_batch = o->kv_batch[i];
    if (o->prompt + o->decode + 1 > p.max_ctx)
        p.max_ctx = o->prompt + o->decode + 1;
    for (int i = 0; i < o->n_pic; i++) {
        int n = o->lead + o->query + o->pic_k[i] * o->pic_n[i];
        if (n > p.max_ctx)
            p.max_ctx = n;
    }
    if (p.max_tokens < engine_piece)
        p.max_tokens = engine_piece;
    return p;
}

/* Untimed: weights paged in, kernels loaded, libraries initialized. */
static void warm_up(bench_t *b)
{
    hp_error_t err = {0};
    double dt;
    int T = b->o->piece < 512 ? b->o->piece : 512;
    if (T > b->ws.plan.max_ctx)
        T = b->ws.plan.max_ctx;
    int *ids = malloc((size_t)T * sizeof(int));
    for (int t = 0; t < T; t++)
        ids[t] = bench_prompt_id(t, b->llm.model.cfg.vocab_size);
    if (prefill_once(b, ids, T, &dt, &err) != HP_OK)
        fprintf(stderr, "# warm-up prefill: %s\n", err.msg);
    free(ids);
    decode_arg_t d = {b->o->n_batch ? b->o->batch[0] : 1, 0};
    if (decode_once(b, d, 2, &dt, NULL, &err) != HP_OK)
        fprintf(stderr, "# warm-up decode: %s\n", err.msg);
    pic_t pc = {0};
    /* two documents with interiors, within the plan's context */
    int n = 4 * b->o->seam + 8,
        room = (b->ws.plan.max_ctx - b->o->lead - b->o->query) / 2;
    if (n > room)
        n = room;
    if (n <= 2 * b->o->seam)
        return;
    pic_prompt(b, &pc, 2, n);
    /* every segment at once: the assembly holds them all */
    pc.cache.pub = hp_segc_pool_create(
        b->be,
        hp_assemble_pool_bytes(&b->llm.model.cfg, &pc.p, HP_IPC_MODE_PIC,
                               b->o->seam) +
            (1u << 20),
        &err);
    if (pc.cache.pub && assemble_once(b, &pc, HP_IPC_MODE_PIC, 1, &dt, NULL,
                                      NULL, &err) != HP_OK)
        fprintf(stderr, "# warm-up pic: %s\n", err.msg);
    hp_pool_destroy(pc.cache.pub);
    hp_prompt_free(&pc.p);
}

int main(int argc, char **argv)
{
    opts_t o;
    bench_t b = {.o = &o};
    hp_error_t err = {0};
    if (parse(&o, argc, argv))
        return 2;
    /* line-buffered even into a file: a run a timeout kills leaves every
     * line it printed (device-check.sh's logs) */
    setvbuf(stdout, NULL, _IOLBF, 0);
    b.t0 = bench_now();
    fprintf(stderr, "# loading %s on %s\n", o.model, o.device);
    if (hp_backend_open(&b.be, o.device, &err) != HP_OK)
        return bench_fail(&err);
    if (hp_llm_load_on(&b.llm, o.model, b.be, &err) != HP_OK)
        return bench_fail(&err);
    hp_model_set_compute(&b.llm.model, o.dtype);
    const hp_model_config_t *c = &b.llm.model.cfg;
    const int engine_piece = hp_fwd_piece(&b.llm.model);
    if (o.piece == 0) /* the engine's own */
        o.piece = engine_piece;
    hp_fwd_plan_t plan = plan_of(&o, engine_piece);
    if (hp_fwd_ws_init(&b.ws, &b.llm.model, &plan, &err) != HP_OK)
        return bench_fail(&err);
    b.lg = malloc((size_t)c->vocab_size * sizeof(float));
    if (o.tsv) {
        b.tsv = fopen(o.tsv, "a");
        if (!b.tsv) {
            perror(o.tsv);
            return 1;
        }
        if (ftell(b.tsv) == 0)
            fprintf(b.tsv,
                    "measure\tshape\tours\tanchor\tanchor_value\tunit\n");
    }
    const size_t *wb = b.llm.model.weight_bytes;
    printf("# %s on %s: %d layers, hidden %d, vocab %d; weights f32 %.0f MB, "
           "bf16 %.0f MB; operands %s; loaded in %.1f s; workspace %.0f MB "
           "(piece %d, batch %d, context %d)\n",
           o.model, hp_backend_name(b.be), c->n_layers, c->hidden,
           c->vocab_size, wb[HK_W_F32] / 1e6, wb[HK_W_BF16] / 1e6,
           hp_prec_name(b.llm.model.prec), bench_now() - b.t0,
           hp_fwd_ws_bytes(&b.llm.model, &plan) / 1e6, plan.max_tokens,
           plan.max_batch, plan.max_ctx);
    printf("# median of %d; decode: %d steps after %d-token prompts; pic: "
           "lead %d + k x n + query %d, seam %d\n",
           o.reps, o.decode, o.prompt, o.lead, o.query, o.seam);
    double tw = bench_now();
    fprintf(stderr, "# warm-up\n");
    warm_up(&b);
    printf("# warm-up %.1f s\n\n| measure | shape | %s | unit |\n"
           "|---|---|---|---|\n",
           bench_now() - tw, o.name);
    for (int i = 0; i < o.n_tokens; i++)
        bench_prefill(&b, o.tokens[i]);
    for (int i = 0; i < o.n_batch; i++)
        bench_decode(&b, o.batch[i], 0);
    for (int i = 0; i < o.n_pic; i++)
        bench_pic(&b, o.pic_k[i], o.pic_n[i]);
    const int kv =
        c->n_lin > 0 && hp_backend_supports_op(b.be, HP_OP_KVBUF_STEP, 0);
    for (int i = 0; kv && i < o.n_kv_batch; i++)
        bench_decode(&b, o.kv_batch[i], 1);
    if (b.skipped)
        printf("# budget of %.0f s spent: %d measurement(s) skipped (rows "
               "above)\n",
               o.budget, b.skipped);
    /* what HYPIC_CUDA_TUNE=1's tuners chose, a line per size class */
    char *tuned = hp_backend_tuned(b.be);
    if (tuned)
        for (char *l = strtok(tuned, "\n"); l; l = strtok(NULL, "\n"))
            printf("# tuned %s\n", l);
    free(tuned);
    printf("# total %.1f s\n", bench_now() - b.t0);
    if (b.tsv)
        fclose(b.tsv);
    free(b.lg);
    hp_fwd_ws_free(&b.ws);
    hp_llm_free(&b.llm);
    hp_backend_close(b.be);
    return 0;
}
