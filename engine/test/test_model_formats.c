/*
 * test_model_formats.c - the whole model with weights kept as stored
 * (README "Weight formats").
 *
 * BF16: qwen35-moe is a BF16 checkpoint; its goldens are transformers'
 * float32 forward on the same weights. Logits must stay within the f32
 * parity bound (1e-4 of the largest logit, as test_model_parity) with
 * every kernel ISA this CPU has: the sgemm tile path (prefill), the plain
 * C, AVX2 and AVX-512 BF16 dot kernels (decode, short prompts).
 *
 * INT8: models/test/NAME-int8, made from each committed model by
 * tools/convert_weights.py --to int8 --group 32 (every projection, the
 * embedding and the head: symmetric, per row and group of 32 inputs).
 *  - Against its f32 twin (the same model with every matrix replaced by
 *    the f32 values it stands for, q * scale): the plain C and AVX2
 *    kernels and the sgemm tile path compute those very products, so
 *    within 1e-4 like f32 parity. AVX-512 VNNI quantizes x to 8 bits per
 *    group as well (any product of <= HK_LINEAR_DIRECT rows: decode, short
 *    prompts, MoE experts with few tokens): its logits' L2 error is bounded
 *    by VNNI_L2_TOL.
 *  - Against the f32 checkpoint it was made from (its transformers
 *    goldens): the accuracy cost. These tiny random models are chaotic: a
 *    0.4 % perturbation of the weights moves some positions' logits by
 *    half of the largest (a near-tie in attention or routing flips), so
 *    the bounds are on the L2 error over all positions and on argmax
 *    agreement, at levels that a wrong scale, group or layout (L2 ~1.4,
 *    agreement ~0) cannot reach. Measured (AVX-512 VNNI): L2 0.096 / 0.20 /
 *    0.33, argmax 258 / 226 / 173 of 279 positions, greedy 26 of 27, 9 of
 *    12, 6 of 10 tokens (dense / MoE / Qwen3-Next).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/forward/forward.h"
#include "engine/forward/sampler.h"
#include "engine/forward/seq.h"
#include "engine/model/model.h"
#include "engine/test/test_util.h"
#include "kernels/cpu/hk_cpu.h"

/* The f32 parity bound (test_model_parity's REL_TOL): summation order. */
#define BF16_TOL  1e-4
#define EXACT_TOL 1e-4
/* VNNI against the f32 twin (measured 0.054 / 0.11 / 0.20). */
#define VNNI_L2_TOL 0.4
/* int8 against the source f32 model (measured above). */
#define INT8_L2_TOL 0.5
#define INT8_AGREE  0.5
#define INT8_GREEDY 0.5

typedef struct {
    const char *dir, *gold; /* model, and the model whose goldens apply */
    int dtype;              /* hk_wtype_t of its matrices */
    int group;              /* I8 */
    hp_prec_t prec;         /* --dtype auto's operands */
} case_t;

/* auto: bf16 operands where the checkpoint was bf16 (the int8 MoE's
 * matrices the quantizer left are bf16), f32 where it was f32 */
static const case_t CASES[] = {
    {"qwen35-moe", "qwen35-moe", HK_W_BF16, 0, HP_PREC_BF16},
    {"qwen35-dense-int8", "qwen35-dense", HK_W_I8, 32, HP_PREC_F32},
    {"qwen35-moe-int8", "qwen35-moe", HK_W_I8, 32, HP_PREC_BF16},
    {"qwen3next-int8", "qwen3next", HK_W_I8, 32, HP_PREC_F32},
};

static const hp_st_tensor_t *want(const hp_st_file_t *g, const char *fmt, int i)
{
    char name[128];
    snprintf(name, sizeof(name), fmt, i);
    return hp_st_find(g, name);
}

/* The matrices are stored as the case says, and used in place. */
static int stored_as(const hp_model_t *m, const case_t *k)
{
    const hp_model_config_t *c = &m->cfg;
    int good = m->embed.dtype == k->dtype && m->lm_head.dtype == k->dtype;
    for (int l = 0; l < c->n_layers; l++) {
        const hp_layer_weights_t *w = &m->layers[l];
        const hp_mat_t *a =
            c->layer_kind[l] == HP_LAYER_LINEAR ? &w->in_qkv : &w->q_proj;
        const hp_mat_t *b =
            c->layer_kind[l] == HP_LAYER_LINEAR ? &w->out_proj : &w->o_proj;
        const hp_mat_t *d =
            c->layer_moe[l] ? &w->exp_down[c->n_experts - 1] : &w->down;
        good &= a->dtype == k->dtype && b->dtype == k->dtype &&
                d->dtype == k->dtype;
        if (k->dtype == HK_W_I8)
            good &= a->scales && a->cols % a->group == 0 &&
                    a->group == (a->cols % k->group ? a->cols : k->group) &&
                    d->scales && d->group <= k->group;
    }
    return good && m->weight_bytes[k->dtype] > 0;
}

/* ---- the f32 twin of an I8 model ---------------------------------------- */

/* Points w at an f32 copy of what it stands for (malloc'd, kept in bufs). */
static void to_f32(hp_mat_t *w, float **bufs, int *nb)
{
    if (!w->data)
        return;
    float *d = malloc((size_t)w->rows * w->cols * sizeof(float));
    for (int r = 0; r < w->rows; r++)
        hk_weight_rows(d + (size_t)r * w->cols, w, &r, 1);
    *w = (hp_mat_t){
        .data = d, .dtype = HK_W_F32, .rows = w->rows, .cols = w->cols};
    bufs[(*nb)++] = d;
}

/* t: m with every matrix replaced by its dequantized f32 values (the
 * weights the I8 tensors stand for); vectors and files shared with m. */
static void make_twin(hp_model_t *t, const hp_model_t *m, float **bufs, int *nb)
{
    const hp_model_config_t *c = &m->cfg;
    size_t nl = (size_t)c->n_layers, ne = 0;
    for (int l = 0; l < c->n_layers; l++)
        ne += c->layer_moe[l] ? 3 * (size_t)c->n_experts : 0;
    *t = *m;
    t->layers = malloc(nl * sizeof(*t->layers));
    memcpy(t->layers, m->layers, nl * sizeof(*t->layers));
    t->expert_mats = ne ? malloc(ne * sizeof(hp_mat_t)) : NULL;
    if (ne)
        memcpy(t->expert_mats, m->expert_mats, ne * sizeof(hp_mat_t));
    to_f32(&t->embed, bufs, nb);
    if (m->lm_head.data == m->embed.data)
        t->lm_head = t->embed;
    else
        to_f32(&t->lm_head, bufs, nb);
    for (int l = 0; l < c->n_layers; l++) {
        hp_layer_weights_t *w = &t->layers[l];
        hp_mat_t *all[] = {&w->in_qkv,   &w->in_z,    &w->in_b,   &w->in_a,
                           &w->out_proj, &w->q_proj,  &w->k_proj, &w->v_proj,
                           &w->o_proj,   &w->gate,    &w->up,     &w->down,
                           &w->router,   &w->sh_gate, &w->sh_up,  &w->sh_down};
        for (size_t j = 0; j < sizeof(all) / sizeof(all[0]); j++)
            to_f32(all[j], bufs, nb);
        if (!c->layer_moe[l])
            continue;
        size_t off = (size_t)(m->layers[l].exp_gate - m->expert_mats);
        w->exp_gate = t->expert_mats + off;
        w->exp_up = w->exp_gate + c->n_experts;
        w->exp_down = w->exp_up + c->n_experts;
        for (int e = 0; e < c->n_experts; e++) {
            to_f32(&w->exp_gate[e], bufs, nb);
            to_f32(&w->exp_up[e], bufs, nb);
            to_f32(&w->exp_down[e], bufs, nb);
        }
    }
}

static void free_twin(hp_model_t *t, float **bufs, int nb)
{
    for (int i = 0; i < nb; i++)
        free(bufs[i]);
    free(t->layers);
    free(t->expert_mats);
}

/* ---- logits of every golden prompt ------------------------------------- */

typedef struct {
    float *pre;  /* [sum T, V] prefill, every position */
    float *dec;  /* [sum T, V] positions from T/2 on by decode steps, the
                  * rest copied from pre */
    int *greedy; /* [n_prompts * 8] greedy continuation (-1 past a stop) */
    size_t rows;
} outs_t;

static size_t n_rows(const hp_st_file_t *g, int *np)
{
    size_t rows = 0;
    for (*np = 0; want(g, "prompt.%d.ids", *np); (*np)++)
        rows += (size_t)want(g, "prompt.%d.ids", *np)->shape[0];
    return rows;
}

static int run(const hp_model_t *m, const hp_st_file_t *g, outs_t *o)
{
    const int V = m->cfg.vocab_size;
    int np, rc = HP_OK;
    hp_error_t err = {0};
    hp_fwd_ws_t ws;
    o->rows = n_rows(g, &np);
    o->pre = malloc(o->rows * V * sizeof(float));
    o->dec = malloc(o->rows * V * sizeof(float));
    o->greedy = malloc((size_t)np * 8 * sizeof(int));
    rc = hp_fwd_ws_init(&ws, m, NULL, &err);
    size_t r0 = 0;
    for (int i = 0; i < np && rc == HP_OK; i++) {
        const hp_st_tensor_t *tid = want(g, "prompt.%d.ids", i);
        const int *ids = tid->data;
        int T = (int)tid->shape[0], P = T / 2;
        float *pre = o->pre + r0 * V, *dec = o->dec + r0 * V;
        hp_seq_t s1, s2;
        hp_seq_init(&s1, m, &err);
        hp_seq_init(&s2, m, &err);
        rc = hp_forward(m, &s1, &ws, ids, NULL, T, NULL, HP_LOGITS_ALL, pre,
                        &err);
        memcpy(dec, pre, (size_t)P * V * sizeof(float));
        if (rc == HP_OK)
            rc = hp_forward(m, &s2, &ws, ids, NULL, P, NULL, HP_LOGITS_NONE,
                            NULL, &err);
        for (int t = P; t < T && rc == HP_OK; t++)
            rc = hp_forward(m, &s2, &ws, ids + t, NULL, 1, NULL, HP_LOGITS_LAST,
                            dec + (size_t)t * V, &err);
        float *lg = malloc((size_t)V * sizeof(float));
        memcpy(lg, dec + (size_t)(T - 1) * V, (size_t)V * sizeof(float));
        for (int j = 0; j < 8 && rc == HP_OK; j++) {
            int tok = o->greedy[i * 8 + j] = hp_argmax(lg, V);
            rc = hp_forward(m, &s2, &ws, &tok, NULL, 1, NULL, HP_LOGITS_LAST,
                            lg, &err);
        }
        free(lg);
        hp_seq_free(&s1);
        hp_seq_free(&s2);
        r0 += (size_t)T;
    }
    hp_fwd_ws_free(&ws);
    return rc;
}

static void free_outs(outs_t *o)
{
    free(o->pre);
    free(o->dec);
    free(o->greedy);
}

/* The goldens in the same layout (decode rows: the prefill logits). */
static void golden_outs(const hp_st_file_t *g, int V, outs_t *o)
{
    int np;
    o->rows = n_rows(g, &np);
    o->pre = malloc(o->rows * V * sizeof(float));
    o->dec = NULL;
    o->greedy = malloc((size_t)np * 8 * sizeof(int));
    size_t r0 = 0;
    for (int i = 0; i < np; i++) {
        const hp_st_tensor_t *tl = want(g, "prompt.%d.logits", i);
        const hp_st_tensor_t *tg = want(g, "prompt.%d.greedy", i);
        memcpy(o->pre + r0 * V, tl->data, tl->nbytes);
        for (int j = 0; j < 8; j++)
            o->greedy[i * 8 + j] = j < tg->shape[0] ? ((int *)tg->data)[j] : -1;
        r0 += (size_t)tl->shape[0];
    }
}

/* Positions whose argmax agree; greedy tokens agreeing up to each
 * continuation's first difference (*ng: the tokens compared). */
static int agree_argmax(const float *a, const float *b, size_t rows, int V)
{
    int n = 0;
    for (size_t r = 0; r < rows; r++)
        n += hp_argmax(a + r * V, V) == hp_argmax(b + r * V, V);
    return n;
}

static int agree_greedy(const int *a, const int *b, int np, int *ng)
{
    int n = 0;
    *ng = 0;
    for (int i = 0; i < np; i++)
        for (int j = 0; j < 8 && b[i * 8 + j] >= 0; j++) {
            (*ng)++;
            if (a[i * 8 + j] != b[i * 8 + j])
                break;
            n++;
        }
    return n;
}

static void check_case(const char *root, const case_t *k)
{
    char dir[1024], path[1200];
    hp_model_t m;
    hp_st_file_t g;
    hp_error_t err = {0};
    snprintf(dir, sizeof(dir), "%s/models/test/%s", root, k->dir);
    snprintf(path, sizeof(path), "%s/models/test/%s/golden.safetensors", root,
             k->gold);
    if (!ok(hp_model_load(&m, dir, &err) == HP_OK, "%s loads", k->dir)) {
        tap_diag("%s", err.msg);
        return;
    }
    if (!ok(hp_st_open(&g, path, &err) == HP_OK, "%s goldens open", k->gold)) {
        hp_model_free(&m);
        return;
    }
    ok(stored_as(&m, k),
       "%s: matrices %s in memory (%zu bytes; f32 %zu, bf16 %zu)", k->dir,
       k->dtype == HK_W_I8 ? "I8 + scales" : "BF16", m.weight_bytes[k->dtype],
       m.weight_bytes[HK_W_F32], m.weight_bytes[HK_W_BF16]);
    hp_prec_t p[3];
    p[0] = m.prec;
    hp_model_set_compute(&m, HP_COMPUTE_F32);
    p[1] = m.prec;
    hp_model_set_compute(&m, HP_COMPUTE_BF16);
    p[2] = m.prec;
    hp_model_set_compute(&m, HP_COMPUTE_AUTO);
    ok(p[0] == k->prec && p[1] == HP_PREC_F32 && p[2] == HP_PREC_BF16 &&
           m.prec == k->prec,
       "%s: --dtype auto takes %s operands (f32 and bf16 as asked)", k->dir,
       hp_prec_name(k->prec));
    const int V = m.cfg.vocab_size;
    int np;
    n_rows(&g, &np);
    outs_t gold, twin = {0};
    golden_outs(&g, V, &gold);
    /* I8: the reference is the same weights in f32 (each kernel's own
     * error); BF16: transformers' f32 on the same weights */
    float *bufs[8192];
    int nb = 0;
    hp_model_t t;
    if (k->dtype == HK_W_I8) {
        make_twin(&t, &m, bufs, &nb);
        ok(run(&t, &g, &twin) == HP_OK, "%s: dequantized f32 twin runs",
           k->dir);
    }
    for (int isa = HK_ISA_AVX512, first = 1; isa >= HK_ISA_GENERIC; isa--) {
        hk_cpu_set_isa((hk_isa_t)isa);
        if ((int)hk_cpu_isa(k->dtype) != isa) {
            tap_skip("kernel ISA not on this CPU");
            continue;
        }
        outs_t o;
        const char *name = hk_isa_name((hk_isa_t)isa);
        int rc = run(&m, &g, &o);
        double pmax, pl2, dmax, dl2;
        if (k->dtype == HK_W_BF16) {
            test_rel_errs(gold.pre, o.pre, gold.rows * V, &pmax, &pl2);
            test_rel_errs(gold.pre, o.dec, gold.rows * V, &dmax, &dl2);
            ok(rc == HP_OK && pmax <= BF16_TOL && dmax <= BF16_TOL,
               "%s (%s): logits within %.0e of transformers' f32: prefill "
               "%.2e, decode %.2e",
               k->dir, name, BF16_TOL, pmax, dmax);
            free_outs(&o);
            continue;
        }
        test_rel_errs(twin.pre, o.pre, twin.rows * V, &pmax, &pl2);
        test_rel_errs(twin.dec, o.dec, twin.rows * V, &dmax, &dl2);
        if (isa == HK_ISA_AVX512)
            ok(rc == HP_OK && pl2 <= VNNI_L2_TOL && dl2 <= VNNI_L2_TOL,
               "%s (%s): vs its f32 twin, x in 8 bits where <= %d rows: L2 "
               "error prefill %.2e, decode %.2e (bound %.1f)",
               k->dir, name, HK_LINEAR_DIRECT, pl2, dl2, VNNI_L2_TOL);
        else
            ok(rc == HP_OK && pmax <= EXACT_TOL && dmax <= EXACT_TOL,
               "%s (%s): vs its f32 twin: prefill %.2e, decode %.2e (bound "
               "%.0e)",
               k->dir, name, pmax, dmax, EXACT_TOL);
        if (first) {
            /* the accuracy cost against the f32 weights it was made
             * from, on the best kernels this CPU has */
            int ng, ag = agree_greedy(o.greedy, gold.greedy, np, &ng);
            int aa = agree_argmax(o.pre, gold.pre, gold.rows, V);
            test_rel_errs(gold.pre, o.pre, gold.rows * V, &pmax, &pl2);
            ok(pl2 <= INT8_L2_TOL,
               "%s vs f32 %s: logits L2 error %.2e (bound %.0e), largest "
               "%.2e",
               k->dir, k->gold, pl2, INT8_L2_TOL, pmax);
            ok(aa >= INT8_AGREE * gold.rows && ag >= INT8_GREEDY * ng,
               "%s vs f32 %s: argmax equal at %d of %zu positions, greedy "
               "%d of %d tokens",
               k->dir, k->gold, aa, gold.rows, ag, ng);
        }
        first = 0;
        free_outs(&o);
    }
    hk_cpu_set_isa(HK_ISA_AVX512);
    if (k->dtype == HK_W_I8) {
        free_outs(&twin);
        free_twin(&t, bufs, nb);
    }
    free(gold.pre);
    free(gold.greedy);
    hp_st_close(&g);
    hp_model_free(&m);
}

/* --dtype's names, nothing else; an f32 checkpoint's auto is f32. */
static void check_compute(const char *root)
{
    hp_compute_t d[3] = {HP_COMPUTE_F32, HP_COMPUTE_AUTO, HP_COMPUTE_AUTO};
    int rc[3] = {hp_compute_parse("auto", &d[0]),
                 hp_compute_parse("f32", &d[1]),
                 hp_compute_parse("bf16", &d[2])};
    hp_compute_t x = HP_COMPUTE_F32;
    ok(!rc[0] && !rc[1] && !rc[2] && d[0] == HP_COMPUTE_AUTO &&
           d[1] == HP_COMPUTE_F32 && d[2] == HP_COMPUTE_BF16 &&
           hp_compute_parse("fp16", &x) == -1 &&
           hp_compute_parse("", &x) == -1 && hp_compute_parse(NULL, &x) == -1 &&
           x == HP_COMPUTE_F32,
       "--dtype: auto, f32 and bf16; fp16, empty and none refused");
    char dir[1024];
    hp_model_t m;
    hp_error_t err = {0};
    snprintf(dir, sizeof(dir), "%s/models/test/qwen35-dense", root);
    if (ok(hp_model_load(&m, dir, &err) == HP_OK, "qwen35-dense loads")) {
        ok(m.prec == HP_PREC_F32, "qwen35-dense (f32): --dtype auto takes f32 "
                                  "operands");
        hp_model_free(&m);
    }
}

int main(void)
{
    const char *root = getenv("HYPIC_ROOT") ? getenv("HYPIC_ROOT") : ".";
    hk_matmul_init();
    check_compute(root);
    for (size_t k = 0; k < sizeof(CASES) / sizeof(CASES[0]); k++)
        check_case(root, &CASES[k]);
    return tap_done();
}
