/*
 * test_cuda_pic.c - the caches on the CUDA backend against the CPU
 * backend, on whole test models: PIC capture of segments (T_C, S_C|0,
 * conv tail, interior K/V), the splice behind another prefix (compose, K
 * re-rotation, seam recompute), the cold path, naive assembly and a
 * prefix-cache resume; every cached tuple, every layer's state after the
 * splice, the logits and greedy tokens compared. The same calls run on
 * both backends (the cache code is written once). Runs on a GPU or the
 * host emulator (kernels/cuda/emu/run.sh with HK_EMU_ENGINE); SKIPs where
 * "cuda" cannot be opened.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/backend/backend.h"
#include "engine/cache/assemble.h"
#include "engine/cache/segcache.h"
#include "engine/forward/sampler.h"
#include "engine/test/test_cpu_bf16.h"
#include "engine/test/test_util.h"

/* f32 on the f32 GDN kernels (HYPIC_CUDA_GDN=scalar): sums in another
 * order (cuBLAS, block reductions) through a few layers, measured ~5e-6;
 * the bound. On the tensor-core chunk (auto, where the heads
 * allow) its ~1e-5 grows through the small random models to ~1e-4 in the
 * states (emulator), as in test_cuda_backend. bf16 weights: x is rounded
 * to bf16 on the device only, and with MoE that flips near-tied routes
 * (a state entry off by up to ~0.45, logits ~1e-2), so greedy tokens are
 * compared at f32 only. */
#define TOL_F32      1e-4
#define TOL_TC       5e-4
#define TOL_BF16     3e-2
#define TOL_BF16_MOE 0.5
/* HYPIC_CUDA_GDN=tc_bf16 (q, k, v rounded to bf16 once, FAST products)
 * against the CPU whose chunk takes the same rounded q, k, v
 * (test_cpu_bf16.h): FAST's single bf16 products remain, in the T_C and
 * S_C|0 a capture keeps too (emulator, dense: tuples and states max
 * 1.8e-2, logits 5e-3); greedy tokens identical */
#define TOL_TC_BF16 3e-2

#define W      3 /* seam: conv kernel 4 needs >= 3 */
#define N_DOC  4
#define N_TOK  4 /* greedy tokens after the warm splice */
#define N_MORE 7 /* the prefix resume's next turn */

static const hp_backend_t *cuda, *cuda_scalar, *cuda_bf16;
/* tc_bf16 too: the test models' run (make test-cuda-emu, the device), not
 * t/015's named model (each mode is ~70 s under the emulator) */
static int with_bf16;

/* Token ids of segment s (seeded, content only: the same document in
 * another place has the same id). */
static void fill(int *ids, int n, unsigned seed, int V)
{
    for (int i = 0; i < n; i++) {
        seed = seed * 1103515245u + 12345u;
        ids[i] = (int)((seed >> 8) % (unsigned)V);
    }
}

/* lead ++ docs in `order` ++ query. Documents: 13 and 20 tokens, 2W+1
 * (an interior of one token, shorter than the conv history) and 2W (no
 * interior: recomputed). */
static const int doc_len[N_DOC] = {13, 20, 2 * W + 1, 2 * W};

static void make_prompt(hp_prompt_t *p, const hp_model_t *m, unsigned lead,
                        const int *order, int extra)
{
    int V = m->cfg.vocab_size, nl = 6 + (int)lead % 5, nq = 5, n = nl + nq;
    for (int i = 0; i < N_DOC; i++)
        n += doc_len[i];
    p->ids = malloc((size_t)(n + extra) * sizeof(int));
    p->segs = calloc(N_DOC + 2, sizeof(*p->segs));
    p->n = 0;
    p->n_segs = N_DOC + 2;
    for (int s = 0; s < N_DOC + 2; s++) {
        hp_prompt_seg_t *g = &p->segs[s];
        int d = s > 0 && s <= N_DOC ? order[s - 1] : -1;
        g->start = p->n;
        g->len = s == 0 ? nl : d >= 0 ? doc_len[d] : nq + extra;
        g->role = s == 0 ? HP_SEG_LEAD : d >= 0 ? HP_SEG_PIC : HP_SEG_QUERY;
        fill(p->ids + p->n, g->len, s == 0 ? lead : d >= 0 ? 100u + d : 7u, V);
        hp_seg_id(g->id, m->fingerprint, g->role, (const char *)(p->ids + p->n),
                  (size_t)g->len * sizeof(int));
        p->n += g->len;
    }
}

/* What one backend produced, all on the host. */
typedef struct {
    float *logits[4]; /* cold A, warm B (pic), naive B, prefix resume */
    float *state;     /* every layer after the warm splice */
    float *tuple;     /* the PIC entries of documents 0-2, concatenated */
    size_t n_state, n_tuple;
    int toks[N_TOK]; /* greedy after the warm splice */
    /* bytes over the host link: the warm splice's prefill, and `full`'s
     * of the same prompt; the prefix resume's (restore, recompute,
     * checkpoints) and `full`'s of its prompt */
    unsigned long long moved_pic, moved_full, moved_resume, moved_full2;
    int resumed; /* tokens the prefix resume restored */
} result_t;

static void result_free(result_t *r)
{
    for (int i = 0; i < 4; i++)
        free(r->logits[i]);
    free(r->state);
    free(r->tuple);
}

/* Every layer's state of seq appended to r->state (S and conv, or K/V of
 * positions [0, n_pos)). */
static void keep_state(result_t *r, const hp_seq_t *seq)
{
    const hp_model_config_t *c = &seq->model->cfg;
    size_t n = 0;
    for (int l = 0; l < c->n_layers; l++)
        n += c->layer_kind[l] == HP_LAYER_LINEAR
                 ? c->state_floats + c->conv_floats
                 : 2 * (size_t)seq->n_pos * c->kv_row;
    float *at = r->state = malloc(n * sizeof(float));
    r->n_state = n;
    for (int l = 0; l < c->n_layers; l++) {
        if (c->layer_kind[l] == HP_LAYER_LINEAR) {
            hp_seq_state_pack(seq, l, at, HP_MEM_HOST);
            at += c->state_floats + c->conv_floats;
        } else {
            size_t kv = (size_t)seq->n_pos * c->kv_row;
            hp_seq_kv_pack(seq, l, 0, seq->n_pos, at, at + kv, HP_MEM_HOST);
            at += 2 * kv;
        }
    }
}

static int assemble_st(const hp_llm_t *llm, hp_cache_t *cache, hp_fwd_ws_t *ws,
                       const hp_prompt_t *p, hp_ipc_mode_t mode, int w,
                       hp_seq_t *seq, float **logits, hp_assemble_stats_t *st,
                       hp_error_t *err)
{
    *logits = malloc((size_t)llm->model.cfg.vocab_size * sizeof(float));
    int rc = hp_seq_init(seq, &llm->model, err);
    if (rc == HP_OK)
        rc = hp_assemble(llm, cache, ws, p, mode, w, seq, *logits, st, err);
    if (rc == HP_OK)
        rc = hp_backend_sync(llm->model.be, err);
    return rc;
}

static int assemble(const hp_llm_t *llm, hp_cache_t *cache, hp_fwd_ws_t *ws,
                    const hp_prompt_t *p, hp_ipc_mode_t mode, int w,
                    hp_seq_t *seq, float **logits, hp_error_t *err)
{
    return assemble_st(llm, cache, ws, p, mode, w, seq, logits, NULL, err);
}

/* The whole sequence on one backend. */
static int run(const hp_llm_t *llm, result_t *r, hp_error_t *err)
{
    const hp_model_t *m = &llm->model;
    const int V = m->cfg.vocab_size;
    static const int order_a[N_DOC] = {0, 1, 2, 3},
                     order_b[N_DOC] = {2, 0, 3, 1};
    hp_prompt_t a, b, a2;
    make_prompt(&a, m, 1, order_a, 0);
    make_prompt(&b, m, 2, order_b, 0);
    make_prompt(&a2, m, 1, order_a, N_MORE);
    hp_prefix_cache_params_t pcp;
    hp_prefix_cache_params_default(&pcp, (size_t)64 << 20);
    hp_cache_t cache = {hp_segc_pool_create(m->be, (size_t)64 << 20, err),
                        hp_prefix_cache_create(&m->cfg, &pcp, m->be, err)};
    /* pieces of 16 tokens: capture and splice jumps span pieces */
    hp_fwd_plan_t plan = {16, 0, 1, 1};
    hp_fwd_ws_t ws;
    hp_seq_t seq;
    memset(r, 0, sizeof(*r));
    int rc = cache.pub && cache.prefix ? hp_fwd_ws_init(&ws, m, &plan, err)
                                       : HP_ENOMEM;
    if (rc != HP_OK)
        goto out;
    /* cold: every document captured now, then spliced */
    rc = assemble(llm, &cache, &ws, &a, HP_IPC_MODE_PIC, W, &seq, &r->logits[0],
                  err);
    hp_seq_free(&seq);
    /* full, for the host traffic of a prefill that caches nothing */
    float *lf = NULL;
    unsigned long long at = hp_backend_host_bytes(m->be);
    if (rc == HP_OK) {
        rc =
            assemble(llm, &cache, &ws, &b, HP_IPC_MODE_FULL, W, &seq, &lf, err);
        hp_seq_free(&seq);
        free(lf);
    }
    r->moved_full = hp_backend_host_bytes(m->be) - at;
    /* warm: the same documents, another lead and order */
    if (rc == HP_OK) {
        at = hp_backend_host_bytes(m->be);
        rc = assemble(llm, &cache, &ws, &b, HP_IPC_MODE_PIC, W, &seq,
                      &r->logits[1], err);
        r->moved_pic = hp_backend_host_bytes(m->be) - at;
        if (rc == HP_OK)
            keep_state(r, &seq);
        float *lg = malloc((size_t)V * sizeof(float));
        for (int t = 0; t < N_TOK && rc == HP_OK; t++) {
            r->toks[t] = hp_argmax(t ? lg : r->logits[1], V);
            rc = hp_forward(m, &seq, &ws, &r->toks[t], NULL, 1, NULL,
                            HP_LOGITS_LAST, lg, err);
        }
        free(lg);
        hp_seq_free(&seq);
    }
    /* the tuples */
    for (int d = 0; d < 3 && rc == HP_OK; d++) {
        const hp_prompt_seg_t *s = &a.segs[1 + d];
        hp_pool_entry_t *e = hp_pool_get(
            cache.pub, s->id, hp_assemble_variant(s, HP_IPC_MODE_PIC, W));
        if (!e) {
            rc = hp_error_set(err, HP_EINTERNAL, "document %d not cached", d);
            break;
        }
        size_t n = (hp_segc_bytes(&m->cfg, HP_SEGC_PIC, s->len, W) -
                    sizeof(hp_segc_hdr_t)) /
                   sizeof(float);
        r->tuple = realloc(r->tuple, (r->n_tuple + n) * sizeof(float));
        hp_backend_get(m->be, r->tuple + r->n_tuple, HP_MEM_HOST,
                       (char *)e->data + sizeof(hp_segc_hdr_t),
                       n * sizeof(float));
        r->n_tuple += n;
        hp_pool_release(cache.pub, e);
    }
    /* naive: whole-document states added, no seams */
    if (rc == HP_OK) {
        rc = assemble(llm, &cache, &ws, &b, HP_IPC_MODE_NAIVE, 0, &seq,
                      &r->logits[2], err);
        hp_seq_free(&seq);
    }
    /* prefix: A checkpointed, then its next turn resumes there */
    float *lg = NULL;
    if (rc == HP_OK) {
        rc = assemble(llm, &cache, &ws, &a, HP_IPC_MODE_PREFIX, W, &seq, &lg,
                      err);
        hp_seq_free(&seq);
        free(lg);
    }
    if (rc == HP_OK) {
        at = hp_backend_host_bytes(m->be);
        rc = assemble(llm, &cache, &ws, &a2, HP_IPC_MODE_FULL, W, &seq, &lg,
                      err);
        r->moved_full2 = hp_backend_host_bytes(m->be) - at;
        hp_seq_free(&seq);
        free(lg);
    }
    if (rc == HP_OK) {
        hp_assemble_stats_t st = {0};
        at = hp_backend_host_bytes(m->be);
        rc = assemble_st(llm, &cache, &ws, &a2, HP_IPC_MODE_PREFIX, W, &seq,
                         &r->logits[3], &st, err);
        r->moved_resume = hp_backend_host_bytes(m->be) - at;
        r->resumed = st.cached_tokens;
        hp_seq_free(&seq);
    }
    hp_fwd_ws_free(&ws);
out:
    hp_pool_destroy(cache.pub);
    hp_prefix_cache_destroy(cache.prefix);
    hp_prompt_free(&a);
    hp_prompt_free(&b);
    hp_prompt_free(&a2);
    return rc;
}

static void compare(const char *name, const char *what, const float *a,
                    const float *b, size_t n, double tol)
{
    double mx, l2;
    test_rel_errs(a, b, n, &mx, &l2);
    ok(mx <= tol, "%s: %s within %.0e of the CPU's (max %.2e, l2 %.2e)", name,
       what, tol, mx, l2);
}

/* The run on device backend be against the CPU's run a. */
static void check_on(const char *dir, const char *name, const hp_llm_t *ref,
                     const result_t *a, const hp_backend_t *be,
                     const char *mode)
{
    hp_llm_t dev;
    hp_error_t err = {0};
    char tag[160];
    snprintf(tag, sizeof(tag), "%s on %s (HYPIC_CUDA_GDN=%s)", name,
             hp_backend_name(be), mode);
    if (hp_llm_load_on(&dev, dir, be, &err) != HP_OK) {
        ok(0, "%s: %s", tag, err.msg);
        return;
    }
    int bf16 = ref->model.weight_bytes[HK_W_BF16] > 0;
    double tol = bf16 ? (ref->model.cfg.n_experts ? TOL_BF16_MOE : TOL_BF16)
                 : !strcmp(mode, "tc_bf16") ? TOL_TC_BF16
                 : strcmp(mode, "scalar")   ? TOL_TC
                                            : TOL_F32;
    result_t b;
    int rb = run(&dev, &b, &err);
    ok(rb == HP_OK, "%s: run %s", tag, rb == HP_OK ? "" : err.msg);
    if (rb == HP_OK) {
        const size_t V = (size_t)ref->model.cfg.vocab_size;
        ok(a->n_tuple == b.n_tuple && a->n_state == b.n_state,
           "%s: as many cached and state floats", tag);
        compare(tag, "PIC tuples (T_C, S_C|0, conv tail, interior K/V)",
                a->tuple, b.tuple, a->n_tuple, tol);
        compare(tag, "every layer's state after the warm splice", a->state,
                b.state, a->n_state, tol);
        compare(tag, "cold PIC logits", a->logits[0], b.logits[0], V, tol);
        compare(tag, "warm PIC logits (another lead, order)", a->logits[1],
                b.logits[1], V, tol);
        compare(tag, "naive logits", a->logits[2], b.logits[2], V, tol);
        compare(tag, "prefix-resume logits", a->logits[3], b.logits[3], V, tol);
        /* the tuples stay in device memory: a warm splice moves what a
         * full prefill does (ids, positions, logits) and the conv rows of
         * the one-token interior, which jump through the host */
        const hp_model_config_t *c = &ref->model.cfg;
        unsigned long long tail = 3ull * c->n_lin * c->conv_floats * 4,
                           tuple = (unsigned long long)c->n_lin *
                                   (c->trans_floats + c->state_floats) * 4;
        ok(b.moved_pic <= b.moved_full + tail,
           "%s: the warm splice moved %llu bytes over the host link (full: "
           "%llu, short interior's conv: %llu; one tuple's T_C and S_C|0: "
           "%llu)",
           tag, b.moved_pic, b.moved_full, tail, tuple);
        /* the prefix cache's checkpoints stay in device memory too: a
         * resume moves what a full prefill of its prompt does (ids,
         * positions, logits), not its restored K/V and states, nor the
         * captured state and the new K/V it admits */
        unsigned long long ckpt =
            (unsigned long long)b.resumed * c->n_full * 2 * c->kv_row * 4 +
            (unsigned long long)c->n_lin * (c->state_floats + c->conv_floats) *
                4;
        ok(b.resumed > 0 && b.moved_resume <= b.moved_full2,
           "%s: the prefix resume (%d tokens restored) moved %llu bytes over "
           "the host link (full: %llu; its K/V and state: %llu)",
           tag, b.resumed, b.moved_resume, b.moved_full2, ckpt);
        if (!bf16)
            ok(!memcmp(a->toks, b.toks, sizeof(b.toks)),
               "%s: greedy tokens after the warm splice identical (%d %d %d "
               "%d)",
               tag, b.toks[0], b.toks[1], b.toks[2], b.toks[3]);
    }
    result_free(&b);
    hp_llm_free(&dev);
}

static void check(const char *root, const char *name)
{
    char dir[1024];
    hp_llm_t ref;
    hp_error_t err = {0};
    snprintf(dir, sizeof(dir), "%s/models/test/%s", root, name);
    if (!ok(hp_llm_load(&ref, dir, &err) == HP_OK, "%s loads: %s", name,
            err.msg))
        return;
    result_t a;
    int ra = run(&ref, &a, &err);
    if (ok(ra == HP_OK, "%s: cpu run %s", name, ra == HP_OK ? "" : err.msg)) {
        check_on(dir, name, &ref, &a, cuda_scalar, "scalar");
        check_on(dir, name, &ref, &a, cuda, "auto");
    }
    result_free(&a);
    const hp_model_config_t *c = &ref.model.cfg;
    if (with_bf16 && c->lin_k_dim % 16 == 0 && c->lin_v_dim % 16 == 0) {
        /* tc_bf16 where the tensor-core chunk takes the heads, against the
         * CPU rounding q, k, v (and x for bf16 weights) as it does */
        hp_backend_i iface;
        struct hp_backend bx;
        tcb_backend(&iface, &bx, ref.model.weight_bytes[HK_W_BF16] > 0, 1);
        hp_llm_t refq;
        if (ok(hp_llm_load_on(&refq, dir, &bx, &err) == HP_OK, "%s on %s: %s",
               name, bx.name, err.msg)) {
            ra = run(&refq, &a, &err);
            if (ok(ra == HP_OK, "%s: %s run %s", name, bx.name,
                   ra == HP_OK ? "" : err.msg))
                check_on(dir, name, &refq, &a, cuda_bf16, "tc_bf16");
            result_free(&a);
            hp_llm_free(&refq);
        }
    }
    hp_llm_free(&ref);
}

/* Models named on the command line (the emulator's short run), else the
 * test models. */
int main(int argc, char **argv)
{
    hp_error_t err = {0};
    int rc = hp_backend_open(&cuda, "cuda:0", &err);
    if (test_cuda_absent(rc, &err))
        return tap_done();
    /* the f32 GDN kernels, beside the default (tensor cores where the
     * heads allow) */
    setenv("HYPIC_CUDA_GDN", "scalar", 1);
    rc = hp_backend_open(&cuda_scalar, "cuda:0", &err);
    unsetenv("HYPIC_CUDA_GDN");
    if (!ok(rc == HP_OK, "cuda:0 with HYPIC_CUDA_GDN=scalar: %s", err.msg))
        return tap_done();
    setenv("HYPIC_CUDA_GDN", "tc_bf16", 1);
    rc = hp_backend_open(&cuda_bf16, "cuda:0", &err);
    unsetenv("HYPIC_CUDA_GDN");
    if (!ok(rc == HP_OK, "cuda:0 with HYPIC_CUDA_GDN=tc_bf16: %s", err.msg))
        return tap_done();
    ok(hp_backend_supports_op(cuda, HP_OP_AXPY, 0) &&
           hp_backend_supports_op(cuda, HP_OP_TRANS_COMPOSE, 0) &&
           hp_backend_supports_op(cuda, HP_OP_ROPE_SHIFT, 0),
       "cuda: the splice's ops (axpy, trans_compose, rope_shift)");
    if (argc > 1) {
        for (int i = 1; i < argc; i++)
            check(getenv("HYPIC_ROOT") ? getenv("HYPIC_ROOT") : ".", argv[i]);
        rc = tap_done();
    } else {
        with_bf16 = 1;
        rc = test_each_model(check);
    }
    hp_backend_close(cuda_scalar);
    hp_backend_close(cuda_bf16);
    hp_backend_close(cuda);
    return rc;
}
