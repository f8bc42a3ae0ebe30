/*
 * test_cuda_backend.c - the CUDA backend (engine/backend/backend_cuda.c)
 * against the CPU backend on whole models: a prefill in pieces, decode
 * steps and a batched step of two sequences, every logit compared; then
 * the KVBuffer (chunkwise decode, a batched step with a KV-only sequence,
 * draft verification): logits compared, greedy tokens identical; a
 * batched step of 1, 4 or 16 plain decode items issues as many ops and
 * transfers and waits as often (tbr_check_counts); the fused ops and the
 * dense MLP on bf16 hidden rows (check_fused, check_mlp); a 320-token prompt in
 * pieces whose attention splits its keys over blocks (check_split_kv). Runs
 * on a GPU, or on the host emulator (kernels/cuda/emu/run.sh with
 * HK_EMU_ENGINE=1); SKIPs where "cuda" cannot be opened (no device, or a
 * program built without CUDA), after checking the refusal is clear.
 * Models whose formats the backend does not run must be refused at load,
 * naming the format.
 *
 * int8 models (the -int8 test models): the CUDA projections dequantize
 * W to f32 (hk_cuda_linear_i8), as the CPU's AVX2 / plain C path does, so the
 * reference is the CPU backend with its ISA capped at AVX2 (AVX-512 VNNI
 * rounds x to 8 bits): logits within the f32 tolerance, every row's
 * greedy token the same. HK_CUDA_TEST_GRID=small (t/015) runs the dense
 * one only, without its batched-step and KVBuffer checks (the emulated
 * I8 decode kernel, a warp per output row, is slow on the host: ~40 s).
 *
 * bf16 models: the CUDA projection rounds x to bf16 before its bf16 GEMM
 * (hk_cuda_matmul_bf16), where the CPU keeps x in f32: ~2^-9 per
 * activation, which on the small random MoE test model flips a router's
 * top-k choice now and then (another expert: O(1) changes in that row,
 * carried on by the recurrence). So a bf16 model is compared with the CPU
 * backend whose bf16 projections round x the same way (the op's CPU twin,
 * "cpu-bf16x" below), and even then an x element 1 ulp off in f32 can
 * round to the neighbouring bf16 and flip a choice later: the check is on
 * the logits' l2 error and the greedy tokens, not every element. The MoE
 * ops themselves are checked at f32 tolerance on an f32 copy of the MoE
 * model (converted by t/015-cuda-emu.t with tools/convert_weights.py
 * --to f32, passed as the first argument).
 *
 * Gated DeltaNet kernels (HYPIC_CUDA_GDN, backend_cuda.c): every model
 * whose heads the tensor-core chunk and the fused step take runs with
 * HYPIC_CUDA_GDN=tc (they or an error), the others (qwen3next: dv = 8)
 * with auto (the f32 chunk there), one model with scalar (the f32 chunk
 * and the unfused decode). On tc, a batched decode step gives each
 * sequence what a step alone gives it. The dense f32 models also run on
 * tc_bf16 (q, k, v rounded to bf16 for the chunk, FAST products) against
 * the CPU whose chunk rounds them the same way ("cpu-bf16qkv",
 * test_cpu_bf16.h); HK_CUDA_TEST_GRID=small without its KVBuffer run.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/backend/backend_impl.h"
#include "engine/test/test_backend_run.h"
#include "engine/test/test_cpu_bf16.h"
#include "engine/test/test_util.h"
#include "kernels/cpu/hk_cpu.h"
#ifdef HK_HAVE_CUDA
#include "kernels/cuda/hk_cuda.h"
#endif
#include "t/lib/testrand.h"

/* f32 sums in another order (cuBLAS, block reductions) */
#define TOL_F32 2e-4
/* ... over a 320-token run (check_split_kv): more steps of the recurrence
 * and longer attention sums (emulator: 2.2e-4, the same with the keys
 * split or not, HK_EMU_SMS=1) */
#define TOL_F32_LONG 6e-4
/* bf16 against cpu-bf16x: the median over rows of each row's l2 error
 * (emulator: 3e-3; a routing flip gives one row 0.1-0.4, a wrong row or
 * scale in the bf16 gather or GEMM O(1) everywhere), and the share of
 * rows whose greedy token agrees (emulator: all) */
#define TOL_BF16_ROW   2e-2
#define MIN_BF16_AGREE 0.9
/* the KVBuffer run's rows: fewer, and later in a sequence whose earlier
 * flips feed them (emulator: 89 %) */
#define MIN_BF16_AGREE_KVBUF 0.8

/* HYPIC_CUDA_GDN=tc_bf16 against the CPU whose chunk takes q, k, v rounded
 * to bf16 (test_cpu_bf16.h): what remains is FAST's single bf16 products
 * (S, W, Vn, P rounded once, ~1e-3 of the chunk's O(1) outputs) through
 * the layers (emulator, dense: max 1.8e-2, l2 8e-3; kernel A without its
 * lo half (FAST_A): 3.4e-2, 1.3e-2) */
#define TOL_TC_BF16 2.5e-2
/* ... and the unrounded CPU's l2 error at least this many times that
 * reference's (the inputs were rounded, to nearest: emulator 1.8-2.4; the
 * chunk on f32 inputs gives < 1), and that reference's at least
 * BF16_FLOOR (FAST's products; the hi/lo kernels' ~2e-5 fail it). */
#define BF16_NEARER 1.4
#define BF16_FLOOR  1e-3

static const hp_backend_t *cuda, *cuda_tc, *cuda_scalar, *cuda_bf16;
static int small_grid; /* HK_CUDA_TEST_GRID=small */

/* Opens cuda:0 with HYPIC_CUDA_GDN=mode (NULL: unset). */
static int open_mode(const hp_backend_t **b, const char *mode, hp_error_t *err)
{
    if (mode)
        setenv("HYPIC_CUDA_GDN", mode, 1);
    else
        unsetenv("HYPIC_CUDA_GDN");
    int rc = hp_backend_open(b, "cuda:0", err);
    unsetenv("HYPIC_CUDA_GDN");
    return rc;
}

/* Over the rows of [rows, V]: the share whose argmax agrees, and the
 * median of the rows' relative l2 errors. */
static double agree(const float *a, const float *b, int rows, int V,
                    double *median)
{
    int same = 0;
    double e[TBR_ROWS > TBK_ROWS ? TBR_ROWS : TBK_ROWS] = {0};
    for (int r = 0; r < rows; r++) {
        const float *x = a + (size_t)r * V, *y = b + (size_t)r * V;
        int ia = 0, ib = 0;
        for (int i = 1; i < V; i++) {
            ia = x[i] > x[ia] ? i : ia;
            ib = y[i] > y[ib] ? i : ib;
        }
        same += ia == ib;
        double mx;
        test_rel_errs(x, y, (size_t)V, &mx, &e[r]);
    }
    for (int i = 1; i < rows; i++) /* insertion sort: 43 rows */
        for (int j = i; j > 0 && e[j] < e[j - 1]; j--) {
            double t = e[j];
            e[j] = e[j - 1];
            e[j - 1] = t;
        }
    *median = e[rows / 2];
    return (double)same / rows;
}

/* On m (on a device): two sequences' decode step batched against each
 * step alone, from the same prompts. */
static void batch_vs_alone(const hp_model_t *m, const char *name)
{
    const int V = m->cfg.vocab_size, ids[6] = {3, 14, 15, 92, 65, 35};
    hp_error_t err = {0};
    hp_fwd_plan_t plan = {16, 0, 2, 1};
    hp_fwd_ws_t ws;
    hp_seq_t s[4];
    float *a = malloc(4 * (size_t)V * sizeof(float));
    int rc = hp_fwd_ws_init(&ws, m, &plan, &err);
    for (int i = 0; i < 4 && rc == HP_OK; i++) /* s[i] and s[i+2] alike */
        if ((rc = hp_seq_init(&s[i], m, &err)) == HP_OK)
            rc = hp_forward(m, &s[i], &ws, ids + (i % 2), NULL, 4 - i % 2, NULL,
                            HP_LOGITS_NONE, NULL, &err);
    hp_fwd_item_t it[2] = {{.seq = &s[0], .ids = &ids[4], .T = 1},
                           {.seq = &s[1], .ids = &ids[5], .T = 1}};
    unsigned long w0 = hp_backend_device_waits(m->be);
    if (rc == HP_OK)
        rc = hp_forward_batch(m, it, 2, &ws, &err);
    unsigned long waits = hp_backend_device_waits(m->be) - w0;
    /* one wait for the logits copied out (the rows of both: one copy),
     * one for the step's status (after the logits: the layers' failures
     * with theirs), and one per MoE layer (the host sizes each expert's
     * GEMM from the routing plan): none per op, whose host arrays go
     * through the staging ring */
    unsigned long most = 1 + 1 + (m->cfg.n_experts ? m->cfg.n_layers : 0);
    ok(rc == HP_OK && waits <= most,
       "%s on %s: the batched step waits for the device %lu times (<= %lu, "
       "%d layers)",
       name, hp_backend_name(m->be), waits, most, m->cfg.n_layers);
    for (int i = 0; i < 2 && rc == HP_OK; i++) {
        if ((rc = it[i].status) == HP_OK)
            memcpy(a + (size_t)i * V, it[i].logits, (size_t)V * sizeof(float));
        else
            err = it[i].err;
    }
    for (int i = 0; i < 2 && rc == HP_OK; i++)
        rc = hp_forward(m, &s[2 + i], &ws, &ids[4 + i], NULL, 1, NULL,
                        HP_LOGITS_LAST, a + (size_t)(2 + i) * V, &err);
    double e0 = 1, e1 = 1;
    if (rc == HP_OK) {
        e0 = test_rel_err(a + 2 * (size_t)V, a, (size_t)V);
        e1 = test_rel_err(a + 3 * (size_t)V, a + (size_t)V, (size_t)V);
    }
    ok(rc == HP_OK && e0 <= 1e-5 && e1 <= 1e-5,
       "%s on %s: a batched decode step = each step alone (%.1e, %.1e) %s",
       name, hp_backend_name(m->be), e0, e1, rc == HP_OK ? "" : err.msg);
    for (int i = 0; i < 4; i++)
        hp_seq_free(&s[i]);
    hp_fwd_ws_free(&ws);
    free(a);
}

static void check_on(const char *dir, const char *name,
                     const hp_backend_t *dev);

static const char *mode_name(const hp_backend_t *dev)
{
    return dev == cuda_tc       ? "tc"
           : dev == cuda_scalar ? "scalar"
           : dev == cuda_bf16   ? "tc_bf16"
                                : "auto";
}

static void check_dir(const char *dir, const char *name)
{
    hp_model_config_t c;
    hp_model_t ref;
    hp_error_t err = {0};
    if (hp_model_load(&ref, dir, &err) != HP_OK) {
        ok(0, "%s: %s", name, err.msg);
        return;
    }
    c = ref.cfg;
    /* tc_bf16 on the dense f32 models: bf16 (x rounded) and int8
     * projections have references of their own, and on the small random
     * MoE these roundings flip near-tied routes (the f32 copy: rows' l2
     * median 3.5e-2, 84 % of greedy tokens), O(1) changes that say nothing
     * of the chunk, which is the same op on either */
    int dense_f32 = ref.weight_bytes[HK_W_BF16] == 0 &&
                    ref.weight_bytes[HK_W_I8] == 0 && !ref.cfg.n_experts;
    hp_model_free(&ref);
    /* the heads the tensor-core chunk takes; the fused step takes dv % 4 */
    int tc = c.lin_k_dim % 16 == 0 && c.lin_v_dim % 16 == 0;
    check_on(dir, name, tc ? cuda_tc : cuda);
    if (!strcmp(name, "qwen35-dense"))
        check_on(dir, name, cuda_scalar);
    /* FLA's precision */
    if (tc && dense_f32)
        check_on(dir, name, cuda_bf16);
}

static void check_on(const char *dir, const char *name, const hp_backend_t *dev)
{
    hp_model_t ref, m;
    hp_error_t err = {0};
    if (hp_model_load(&ref, dir, &err) != HP_OK) {
        ok(0, "%s: %s", name, err.msg);
        return;
    }
    int bf16 = ref.weight_bytes[HK_W_BF16] > 0;
    int i8 = ref.weight_bytes[HK_W_I8] > 0;
    int rc = hp_model_load_on(&m, dir, dev, &err);
    if (!hp_backend_supports_op(dev, HP_OP_EMBED, ref.embed.dtype)) {
        ok(rc == HP_EUNAVAIL && strstr(err.msg, "cannot"),
           "%s: formats the backend does not run are refused: %s", name,
           err.msg);
        if (rc == HP_OK)
            hp_model_free(&m);
        hp_model_free(&ref);
        return;
    }
    if (rc != HP_OK) {
        ok(0, "%s on %s: %s", name, hp_backend_name(dev), err.msg);
        hp_model_free(&ref);
        return;
    }
    /* the port against the CPU: f32 operands (a bf16 checkpoint's auto,
     * bf16 attention, is FLASH2's: test_cuda_kernels, t/015) */
    hp_model_set_compute(&m, HP_COMPUTE_F32);
    /* tc_bf16: the reference's chunk rounds q, k, v as the device's */
    int qkv = dev == cuda_bf16;
    hp_backend_i iface;
    struct hp_backend bx;
    tcb_backend(&iface, &bx, bf16, qkv);
    hp_model_t refx;
    if (bf16 || qkv) {
        if (hp_model_load_on(&refx, dir, &bx, &err) != HP_OK) {
            ok(0, "%s on %s: %s", name, bx.name, err.msg);
            hp_model_free(&m);
            hp_model_free(&ref);
            return;
        }
    }
    if (bf16) {
        hp_model_free(&ref);
    }
    hp_model_t *r = bf16 || qkv ? &refx : &ref;
    ref.sample_vocab = r->sample_vocab = m.sample_vocab =
        TBR_SAMPLE_VOCAB(m.cfg.vocab_size);
    if (i8) /* the CPU twin of hk_cuda_linear_i8 */
        hk_cpu_set_isa(HK_ISA_AVX2);
    size_t n = (size_t)TBR_ROWS * m.cfg.vocab_size;
    float *a = malloc(n * sizeof(float)), *b = malloc(n * sizeof(float));
    int ra = tbr_run(r, a, NULL, &err);
    ok(ra == HP_OK, "%s: %s run %s", name, hp_backend_name(r->be),
       ra == HP_OK ? "" : err.msg);
    int rb = tbr_run(&m, b, NULL, &err);
    ok(rb == HP_OK, "%s: %s (HYPIC_CUDA_GDN=%s) run %s", name,
       hp_backend_name(dev), mode_name(dev), rb == HP_OK ? "" : err.msg);
    if (ra == HP_OK && rb == HP_OK && qkv) {
        /* the unrounded CPU's logits: tc_bf16 must be nearer the rounded
         * reference (the rounding happened, once, to nearest) */
        float *c = malloc(n * sizeof(float));
        double mx, l2, mxc, l2c;
        int rc0 = tbr_run(&ref, c, NULL, &err);
        test_rel_errs(a, b, n, &mx, &l2);
        test_rel_errs(c, b, n, &mxc, &l2c);
        double med, ag = agree(a, b, TBR_ROWS, m.cfg.vocab_size, &med);
        ok(rc0 == HP_OK && mx <= TOL_TC_BF16 && l2 >= BF16_FLOOR &&
               l2 * BF16_NEARER <= l2c && ag == 1.0,
           "%s: tc_bf16 logits within %.1e of %s's (max %.2e, l2 %.2e >= "
           "%.0e; the f32 CPU's l2 %.2e, >= %gx); every row's greedy token "
           "the same",
           name, TOL_TC_BF16, hp_backend_name(r->be), mx, l2, BF16_FLOOR, l2c,
           BF16_NEARER);
        free(c);
    } else if (ra == HP_OK && rb == HP_OK && !bf16 && !qkv) {
        double mx, l2;
        test_rel_errs(a, b, n, &mx, &l2);
        ok(mx <= TOL_F32, "%s: logits within %.0e of %s's (max %.2e, l2 %.2e)",
           name, TOL_F32, hp_backend_name(r->be), mx, l2);
        if (i8) {
            double med, ag = agree(a, b, TBR_ROWS, m.cfg.vocab_size, &med);
            ok(ag == 1.0, "%s: every row's greedy token as %s's (%.0f%%)", name,
               hp_backend_name(r->be), 100 * ag);
        }
    } else if (ra == HP_OK && rb == HP_OK) {
        double med, ag = agree(a, b, TBR_ROWS, m.cfg.vocab_size, &med);
        ok(med <= TOL_BF16_ROW && ag >= MIN_BF16_AGREE,
           "%s: rows' logits within %.0e (l2) of %s's, median %.2e; greedy "
           "tokens agree in %.0f%% of rows",
           name, TOL_BF16_ROW, hp_backend_name(r->be), med, 100 * ag);
    }
    if (dev == cuda_tc && !bf16 && !(i8 && small_grid)) {
        batch_vs_alone(&m, name);
        /* a step's ops, transfers and waits whatever its batch: at most
         * one wait for the argmax, one for the logits, one for the status
         * (and one per MoE layer, as above); the small grid on the dense
         * models only (~15 s a model on the emulator) */
        if (!small_grid || !m.cfg.n_experts)
            tbr_check_counts(&m, name,
                             3 + (m.cfg.n_experts ? m.cfg.n_layers : 0));
    }
    free(a);
    free(b);
    /* the small grid (t/015): tc_bf16's main run only */
    if ((i8 || qkv) && small_grid) {
        hk_cpu_set_isa(HK_ISA_AVX512);
        hp_model_free(&m);
        hp_model_free(r);
        if (qkv && !bf16)
            hp_model_free(&ref);
        return;
    }

    /* the KVBuffer: chunkwise decode, a KV-only sequence, verification */
    n = (size_t)TBK_ROWS * m.cfg.vocab_size;
    a = malloc(n * sizeof(float));
    b = malloc(n * sizeof(float));
    int ta[TBK_TOKS], tb[TBK_TOKS];
    ra = tbr_kvbuf(r, a, ta, &err);
    ok(ra == HP_OK, "%s: %s KVBuffer run %s", name, hp_backend_name(r->be),
       ra == HP_OK ? "" : err.msg);
    rb = tbr_kvbuf(&m, b, tb, &err);
    ok(rb == HP_OK, "%s: %s KVBuffer run %s", name, hp_backend_name(dev),
       rb == HP_OK ? "" : err.msg);
    if (ra == HP_OK && rb == HP_OK && !bf16) {
        double mx, l2, tol = qkv ? TOL_TC_BF16 : TOL_F32;
        test_rel_errs(a, b, n, &mx, &l2);
        ok(mx <= tol,
           "%s: chunkwise decode and verification: logits within %.1e of "
           "%s's (max %.2e, l2 %.2e)",
           name, tol, hp_backend_name(r->be), mx, l2);
        ok(!memcmp(ta, tb, sizeof(ta)),
           "%s: KVBuffer greedy tokens identical to %s's", name,
           hp_backend_name(r->be));
    } else if (ra == HP_OK && rb == HP_OK) {
        double med, ag = agree(a, b, TBK_ROWS, m.cfg.vocab_size, &med);
        ok(med <= TOL_BF16_ROW && ag >= MIN_BF16_AGREE_KVBUF,
           "%s: KVBuffer rows' logits within %.0e (l2) of %s's, median "
           "%.2e; greedy tokens agree in %.0f%% of rows",
           name, TOL_BF16_ROW, hp_backend_name(r->be), med, 100 * ag);
    }
    hk_cpu_set_isa(HK_ISA_AVX512); /* lifts the cap */
    hp_model_free(&m);
    hp_model_free(r);
    if (qkv && !bf16)
        hp_model_free(&ref);
    free(a);
    free(b);
}

/* n floats of x on backend b. */
static float *put(const hp_backend_t *b, const float *x, size_t n)
{
    float *d = hp_backend_alloc(b, n * sizeof(float));
    if (d)
        hp_backend_upload(b, d, x, n * sizeof(float));
    return d;
}

/* A [rows, cols] bf16 matrix of random values on b; *wide (if given):
 * its values as f32 on the host. */
static hk_weight_t put_bf16_w(const hp_backend_t *b, int rows, int cols,
                              float **wide)
{
    size_t n = (size_t)rows * cols;
    uint16_t *h = malloc(n * sizeof(uint16_t));
    for (size_t i = 0; i < n; i++)
        h[i] = hk_bf16_from_f32((float)(0.3 * urand()));
    void *d = hp_backend_alloc(b, n * sizeof(uint16_t));
    hp_backend_upload(b, d, h, n * sizeof(uint16_t));
    if (wide) {
        *wide = malloc(n * sizeof(float));
        for (size_t i = 0; i < n; i++)
            (*wide)[i] = hk_bf16_to_f32(h[i]);
    }
    free(h);
    return (hk_weight_t){d, NULL, HK_W_BF16, rows, cols, 0};
}

static hk_weight_t put_bf16(const hp_backend_t *b, int rows, int cols)
{
    return put_bf16_w(b, rows, cols, NULL);
}

/* x rounded to bf16 values, in place. */
static void round_bf16(float *x, size_t n)
{
    for (size_t i = 0; i < n; i++)
        x[i] = hk_bf16_to_f32(hk_bf16_from_f32(x[i]));
}

/* Frees n buffers of b's. */
static void drop(const hp_backend_t *b, void *const *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        hp_backend_free(b, p[i]);
}

/* Whether n floats at a and b (on the device) are equal bit for bit. */
static int same_dev(const hp_backend_t *be, const float *a, const float *b,
                    size_t n)
{
    float *ha = malloc(n * sizeof(float)), *hb = malloc(n * sizeof(float));
    hp_backend_download(be, ha, a, n * sizeof(float));
    hp_backend_download(be, hb, b, n * sizeof(float));
    int same = !memcmp(ha, hb, n * sizeof(float));
    free(ha);
    free(hb);
    return same;
}

/* An attention layer's prologue (hp_backend_qk_norm_rope) against the
 * five ops it stands for, through the seam: bit for bit, as many ops; at
 * hd = 64 the device's fused kernel, at hd = 1280 (past
 * HK_CUDA_QK_MAX_HD) its five kernels in the one op. */
static void check_qk_norm_rope(const hp_backend_t *b)
{
    enum { T = 3, HQ = 2, HKV = 1 };
    static const int hds[2] = {64, 1280};
    const int pos[T] = {5, 6, 900};
    const float eps = 1e-6f;
    for (int s = 0; s < 2; s++) {
        const int hd = hds[s], rot = hd / 4;
        const size_t nq = (size_t)T * HQ * hd, nk = (size_t)T * HKV * hd;
        float *hP = frand_amp(2 * nq, 2.0), *hk = frand_amp(nk, 2.0);
        float *hw = frand_amp((size_t)2 * hd, 0.5);
        float *P = put(b, hP, 2 * nq), *qw = put(b, hw, hd);
        float *kw = put(b, hw + hd, hd), *q[2], *g[2], *k[2];
        for (int i = 0; i < 2; i++) {
            q[i] = hp_backend_alloc(b, nq * sizeof(float));
            g[i] = hp_backend_alloc(b, nq * sizeof(float));
            k[i] = put(b, hk, nk);
        }
        unsigned long n0 = hp_backend_op_count(b);
        hp_backend_qk_norm_rope(b, q[0], g[0], k[0], P, qw, kw, pos, T, HQ, HKV,
                                hd, rot, 1e7, eps);
        unsigned long n1 = hp_backend_op_count(b);
        hp_backend_split_heads(b, q[1], g[1], NULL, P, T * HQ, hd, hd, 0);
        hp_backend_rmsnorm(b, q[1], q[1], qw, T * HQ, hd, eps);
        hp_backend_rmsnorm(b, k[1], k[1], kw, T * HKV, hd, eps);
        hp_backend_rope(b, q[1], pos, T, HQ, hd, rot, 1e7);
        hp_backend_rope(b, k[1], pos, T, HKV, hd, rot, 1e7);
        hp_error_t err = {0};
        ok(hp_backend_sync(b, &err) == HP_OK &&
               hp_backend_op_count(b) - n1 == n1 - n0 &&
               same_dev(b, q[0], q[1], nq) && same_dev(b, g[0], g[1], nq) &&
               same_dev(b, k[0], k[1], nk),
           "qk_norm_rope hd=%d: split, rmsnorm, rope bit for bit, as many ops "
           "%s",
           hd, err.msg);
        void *all[9] = {P, qw, kw, q[0], q[1], g[0], g[1], k[0], k[1]};
        drop(b, all, 9);
        free(hP);
        free(hk);
        free(hw);
    }
}

/* The made-then-projected ops (backend.h) on bf16 matrices, where the
 * device writes the made input straight to the bf16 operand (its f32
 * buffer never written: the fusion ran): the two ops they are made of,
 * bit for bit, counted as those; with an f32 matrix among them (no
 * fusion: y written), the same. */
static void check_fused(const hp_backend_t *b)
{
    enum { T = 7, H = 48, R0 = 24, R1 = 16, I = 40, HV = 4, DV = 12 };
    const float eps = 1e-6f;
    float *hx = frand_amp((size_t)T * H, 2.0), *hn = frand_amp(H, 0.5);
    float *hg = frand_amp((size_t)T * I, 3.0),
          *hu = frand_amp((size_t)T * I, 2.0);
    float *hz = frand_amp((size_t)T * HV * DV, 2.0), *hgw = frand_amp(DV, 1.0);
    float *hw32 = frand_amp((size_t)R1 * H, 0.3);
    float *x = put(b, hx, (size_t)T * H), *nw = put(b, hn, H);
    float *gw = put(b, hgw, DV), *z = put(b, hz, (size_t)T * HV * DV);
    float *w32 = put(b, hw32, (size_t)R1 * H);
    hk_weight_t w0 = put_bf16(b, R0, H), w1 = put_bf16(b, R1, H);
    hk_weight_t wf = {w32, NULL, HK_W_F32, R1, H, 0};
    hk_weight_t wd = put_bf16(b, H, I), wo = put_bf16(b, H, HV * DV);
    const size_t nx = (size_t)T * H, ng = (size_t)T * I;
    float *y = hp_backend_alloc(b, nx * sizeof(float));
    float *ya[2], *yb[2], *acc[2], *g[2], *o[2];
    for (int i = 0; i < 2; i++) {
        ya[i] = hp_backend_alloc(b, (size_t)T * R0 * sizeof(float));
        yb[i] = hp_backend_alloc(b, (size_t)T * R0 * sizeof(float));
        acc[i] = put(b, hx, nx); /* the residuals, equal */
        g[i] = put(b, hg, ng);
        o[i] = put(b, hz, (size_t)T * HV * DV);
    }
    float *u = put(b, hu, ng);
    hp_error_t err = {0};
    int good = 1;
    float *zero = calloc(nx, sizeof(float));
    for (int mixed = 0; mixed < 2; mixed++) {
        const hk_weight_t *w[2] = {&w0, mixed ? &wf : &w1};
        float *const fused[2] = {ya[0], yb[0]}, *const two[2] = {ya[1], yb[1]};
        hp_backend_upload(b, y, zero, nx * sizeof(float));
        unsigned long n0 = hp_backend_op_count(b);
        hp_backend_rmsnorm_linear_n(b, fused, y, x, nw, w, 2, T, eps);
        unsigned long n1 = hp_backend_op_count(b);
        float *hy = malloc(nx * sizeof(float));
        hp_backend_download(b, hy, y, nx * sizeof(float));
        good &= !memcmp(hy, zero, nx * sizeof(float)) == !mixed;
        free(hy);
        hp_backend_rmsnorm(b, y, x, nw, T, H, eps);
        hp_backend_linear_n(b, two, y, w, 2, T);
        good &= hp_backend_op_count(b) - n1 == n1 - n0;
        good &= same_dev(b, ya[0], ya[1], (size_t)T * R0) &&
                same_dev(b, yb[0], yb[1], (size_t)T * R1);
    }
    ok(hp_backend_sync(b, &err) == HP_OK && good,
       "rmsnorm_linear_n: rmsnorm then linear_n, bit for bit, as many ops "
       "(bf16 matrices: y never written; one f32 among them: written)");
    free(zero);

    /* o and g: made in place by the two ops, left as given by the fused */
    const size_t no = (size_t)T * HV * DV;
    float *ho = put(b, hz, no), *hgd = put(b, hg, ng);
    hp_backend_rmsnorm_gated_linear_acc(b, acc[0], o[0], z, gw, T * HV, DV, eps,
                                        &wo, T);
    hp_backend_rmsnorm_gated(b, o[1], o[1], z, gw, T * HV, DV, eps);
    hp_backend_linear_acc(b, acc[1], o[1], &wo, T);
    ok(hp_backend_sync(b, &err) == HP_OK && same_dev(b, acc[0], acc[1], nx) &&
           same_dev(b, o[0], ho, no) && !same_dev(b, o[1], ho, no),
       "rmsnorm_gated_linear_acc: the two ops' x, bit for bit (o untouched)");

    hp_backend_upload(b, o[1], hz, no * sizeof(float)); /* o as given */
    hp_backend_gate_mul_linear_acc(b, acc[0], o[0], z, &wo, T);
    hp_backend_gate_mul(b, o[1], z, no);
    hp_backend_linear_acc(b, acc[1], o[1], &wo, T);
    ok(hp_backend_sync(b, &err) == HP_OK && same_dev(b, acc[0], acc[1], nx) &&
           same_dev(b, o[0], ho, no) && !same_dev(b, o[1], ho, no),
       "gate_mul_linear_acc: the two ops' x, bit for bit (o untouched)");

    hp_backend_swiglu_linear_acc(b, acc[0], g[0], u, &wd, T);
    hp_backend_swiglu(b, g[1], g[1], u, ng);
    hp_backend_linear_acc(b, acc[1], g[1], &wd, T);
    ok(hp_backend_sync(b, &err) == HP_OK && same_dev(b, acc[0], acc[1], nx) &&
           same_dev(b, g[0], hgd, ng) && !same_dev(b, g[1], hgd, ng),
       "swiglu_linear_acc: the two ops' x, bit for bit (g untouched)");
    hp_backend_free(b, ho);
    hp_backend_free(b, hgd);

    void *all[] = {x,
                   nw,
                   gw,
                   z,
                   w32,
                   (void *)w0.data,
                   (void *)w1.data,
                   (void *)wd.data,
                   (void *)wo.data,
                   y,
                   u,
                   ya[0],
                   ya[1],
                   yb[0],
                   yb[1],
                   acc[0],
                   acc[1],
                   g[0],
                   g[1],
                   o[0],
                   o[1]};
    drop(b, all, sizeof(all) / sizeof(all[0]));
    free(hx);
    free(hn);
    free(hg);
    free(hu);
    free(hz);
    free(hgw);
    free(hw32);
}

/* The MLP's CPU reference on bf16 matrices (wide: their values), the
 * device's roundings: its input n (rmsnorm(x) with nw, else y) and the
 * SwiGLU rounded to bf16 as the projections' operands are; with hid, gate
 * and up too (the bf16 hidden rows). x += down(...). */
static void mlp_ref(float *x, const float *y, const float *nw, const float *wg,
                    const float *wu, const float *wd, int T, int H, int I,
                    float eps, int hid)
{
    const size_t nx = (size_t)T * H, nh = (size_t)T * I;
    float *n = malloc(nx * sizeof(float)), *g = malloc(nh * sizeof(float));
    float *u = malloc(nh * sizeof(float)), *o = malloc(nx * sizeof(float));
    if (nw)
        hk_rmsnorm_zc(n, x, nw, T, H, eps);
    else
        memcpy(n, y, nx * sizeof(float));
    round_bf16(n, nx);
    hk_matmul(g, n, wg, T, H, I);
    hk_matmul(u, n, wu, T, H, I);
    if (hid) {
        round_bf16(g, nh);
        round_bf16(u, nh);
    }
    hk_swiglu(g, g, u, nh);
    round_bf16(g, nh);
    hk_matmul(o, g, wd, T, I, H);
    for (size_t i = 0; i < nx; i++)
        x[i] += o[i];
    free(n);
    free(g);
    free(u);
    free(o);
}

/* The dense MLP (hp_backend_mlp_acc), with the norm and without. F32: the
 * ops it names, bit for bit, as many. BF16 on bf16 matrices: the hidden
 * rows kept in bf16 (the upper half of g's f32 rows never written), x as
 * the CPU reference that rounds them computes it (f32 sums in another
 * order; a rounding flipped now and then), several times nearer that than
 * the one that does not round them; counted as the same ops. */
static void check_mlp(const hp_backend_t *b)
{
    enum { T = 6, H = 64, I = 96 };
    const float eps = 1e-6f;
    const size_t nx = (size_t)T * H, nh = (size_t)T * I;
    float *hx = frand_amp(nx, 2.0), *hn = frand_amp(H, 0.5);
    float *hy = frand_amp(nx, 1.0), *wg, *wu, *wd;
    hk_weight_t mg = put_bf16_w(b, I, H, &wg), mu = put_bf16_w(b, I, H, &wu);
    hk_weight_t md = put_bf16_w(b, H, I, &wd);
    float *nw = put(b, hn, H), *y = put(b, hy, nx);
    float *g = hp_backend_alloc(b, nh * sizeof(float));
    float *u = hp_backend_alloc(b, nh * sizeof(float));
    float *g2 = hp_backend_alloc(b, nh * sizeof(float));
    float *u2 = hp_backend_alloc(b, nh * sizeof(float));
    float *acc[3];
    for (int i = 0; i < 3; i++)
        acc[i] = put(b, hx, nx);
    float *canary = malloc(nh * sizeof(float)),
          *hg = malloc(nh * sizeof(float));
    for (size_t i = 0; i < nh; i++)
        canary[i] = 1.5f;
    float *got = malloc(nx * sizeof(float));
    hp_error_t err = {0};
    for (int norm = 1; norm >= 0; norm--) {
        const float *w = norm ? nw : NULL;
        hp_backend_upload(b, y, hy, nx * sizeof(float)); /* y: scratch */
        /* F32: the named ops */
        unsigned long n0 = hp_backend_op_count(b);
        hp_backend_mlp_acc(b, acc[0], y, g, u, w, &mg, &mu, &md, T, eps,
                           HP_PREC_F32);
        unsigned long n1 = hp_backend_op_count(b);
        float *const ys[] = {g2, u2};
        const hk_weight_t *const ws[] = {&mg, &mu};
        if (norm)
            hp_backend_rmsnorm_linear_n(b, ys, y, acc[1], nw, ws, 2, T, eps);
        else
            hp_backend_linear_n(b, ys, y, ws, 2, T);
        hp_backend_swiglu_linear_acc(b, acc[1], g2, u2, &md, T);
        unsigned long n2 = hp_backend_op_count(b);
        ok(hp_backend_sync(b, &err) == HP_OK &&
               same_dev(b, acc[0], acc[1], nx) && n2 - n1 == n1 - n0,
           "mlp_acc%s at f32: the ops it names, bit for bit, as many (%lu)",
           norm ? "" : " without a norm", n1 - n0);
        /* BF16: the hidden rows in bf16; the references from x before */
        float *x0 = malloc(nx * sizeof(float)), *ref[2];
        hp_backend_download(b, x0, acc[2], nx * sizeof(float));
        hp_backend_upload(b, g, canary, nh * sizeof(float));
        unsigned long n3 = hp_backend_op_count(b);
        hp_backend_mlp_acc(b, acc[2], y, g, u, w, &mg, &mu, &md, T, eps,
                           HP_PREC_BF16);
        unsigned long n4 = hp_backend_op_count(b);
        int rc = hp_backend_sync(b, &err);
        hp_backend_download(b, got, acc[2], nx * sizeof(float));
        hp_backend_download(b, hg, g, nh * sizeof(float));
        /* the T I bf16 gate values fill g's first T I / 2 floats */
        int kept = !memcmp(hg + nh / 2, canary + nh / 2,
                           (nh - nh / 2) * sizeof(float));
        double mx[2], l2[2];
        for (int hid = 0; hid < 2; hid++) {
            ref[hid] = malloc(nx * sizeof(float));
            memcpy(ref[hid], x0, nx * sizeof(float));
            mlp_ref(ref[hid], hy, norm ? hn : NULL, wg, wu, wd, T, H, I, eps,
                    hid);
            test_rel_errs(ref[hid], got, nx, &mx[hid], &l2[hid]);
        }
        ok(rc == HP_OK && kept && n4 - n3 == n1 - n0 && l2[1] <= 1e-4 &&
               l2[0] >= 4 * l2[1],
           "mlp_acc%s at bf16: hidden rows in bf16 (g's upper half %s), x "
           "within 1e-4 (l2) of the reference rounding them (%.2e, max "
           "%.2e), %.1fx nearer than to the one that does not; %lu ops",
           norm ? "" : " without a norm", kept ? "untouched" : "written", l2[1],
           mx[1], l2[1] > 0 ? l2[0] / l2[1] : 0.0, n4 - n3);
        free(ref[0]);
        free(ref[1]);
        free(x0);
    }
    free(canary);
    free(hg);
    free(got);
    free(hx);
    free(hn);
    free(hy);
    free(wg);
    free(wu);
    free(wd);
    void *const p[] = {
        (void *)mg.data, (void *)mu.data, (void *)md.data, nw, y, g, u, g2, u2,
        acc[0],          acc[1],          acc[2]};
    drop(b, p, sizeof p / sizeof p[0]);
}

/* hp_backend_conv_qkv: the five ops' q, k, v, gates and state bit for
 * bit, cv never written (the fused path ran), as many ops counted. */
static void check_conv_qkv(const hp_backend_t *b)
{
    enum { T = 6, HK = 2, HV = 4, DK = 16, DV = 8, K = 4 };
    const int kd = HK * DK, vd = HV * DV, C = 2 * kd + vd;
    const size_t nx = (size_t)T * C, ns = (size_t)C * (K - 1), ng = T * HV;
    const float eps = 1e-6f, qs = 0.25f;
    float *hx = frand_amp(nx, 2.0), *hw = frand_amp((size_t)C * K, 1.0);
    float *hs = frand_amp(ns, 2.0), *zero = calloc(nx, sizeof(float));
    float *ha = frand_amp(ng, 3.0), *hb = frand_amp(ng, 3.0);
    float *hal = frand_amp(HV, 1.0), *hdt = frand_amp(HV, 1.0);
    float *x = put(b, hx, nx), *w = put(b, hw, (size_t)C * K);
    float *al = put(b, hal, HV), *dt = put(b, hdt, HV);
    float *st[2], *cv[2], *q[2], *k[2], *v[2], *g[2], *be[2];
    for (int i = 0; i < 2; i++) {
        st[i] = put(b, hs, ns);
        cv[i] = put(b, zero, nx);
        g[i] = put(b, ha, ng); /* the raw a and b projections */
        be[i] = put(b, hb, ng);
        q[i] = hp_backend_alloc(b, (size_t)T * kd * sizeof(float));
        k[i] = hp_backend_alloc(b, (size_t)T * kd * sizeof(float));
        v[i] = hp_backend_alloc(b, (size_t)T * vd * sizeof(float));
    }
    unsigned long n0 = hp_backend_op_count(b);
    hp_backend_conv_qkv(b, q[0], k[0], v[0], cv[0], st[0], x, w, g[0], be[0],
                        al, dt, T, HK, HV, DK, DV, K, eps, qs);
    unsigned long n1 = hp_backend_op_count(b);
    hp_backend_conv1d_silu(b, cv[1], st[1], x, w, T, C, K);
    hp_backend_split_heads(b, q[1], k[1], v[1], cv[1], T, kd, kd, vd);
    hp_backend_l2norm(b, q[1], T * HK, DK, eps, qs);
    hp_backend_l2norm(b, k[1], T * HK, DK, eps, 1.0f);
    hp_backend_gdn_gates(b, g[1], be[1], g[1], be[1], al, dt, T, HV);
    hp_error_t err = {0};
    float *z = put(b, zero, nx);
    ok(hp_backend_sync(b, &err) == HP_OK &&
           hp_backend_op_count(b) - n1 == n1 - n0 &&
           same_dev(b, q[0], q[1], (size_t)T * kd) &&
           same_dev(b, k[0], k[1], (size_t)T * kd) &&
           same_dev(b, v[0], v[1], (size_t)T * vd) &&
           same_dev(b, g[0], g[1], ng) && same_dev(b, be[0], be[1], ng) &&
           same_dev(b, st[0], st[1], ns) && same_dev(b, cv[0], z, nx),
       "conv_qkv: the conv, split, norms and gates' q, k, v, g, beta and "
       "state bit for bit, as many ops (cv never written)");
    void *all[] = {x,     w,     z,    al,    dt,   st[0], st[1],
                   cv[0], cv[1], q[0], q[1],  k[0], k[1],  v[0],
                   v[1],  g[0],  g[1], be[0], be[1]};
    drop(b, all, sizeof(all) / sizeof(all[0]));
    free(hx);
    free(hw);
    free(hs);
    free(zero);
    free(ha);
    free(hb);
    free(hal);
    free(hdt);
}

/* A backend with HYPIC_CUDA_TUNE=1's tuners (*tun) and one without
 * (*ref), whatever the environment says (it is left as it was). */
static int open_tuned(const hp_backend_t **tun, const hp_backend_t **ref,
                      hp_error_t *err)
{
    const char *was = getenv("HYPIC_CUDA_TUNE");
    char *keep = was ? strdup(was) : NULL;
    unsetenv("HYPIC_CUDA_TUNE");
    int rc = open_mode(ref, NULL, err);
    setenv("HYPIC_CUDA_TUNE", "1", 1);
    if (rc == HP_OK && (rc = open_mode(tun, NULL, err)) != HP_OK)
        hp_backend_close(*ref);
    if (keep)
        setenv("HYPIC_CUDA_TUNE", keep, 1);
    else
        unsetenv("HYPIC_CUDA_TUNE");
    free(keep);
    return rc;
}

/* Whether p (past a class's head) is ": <kernel> (k[0] <ms or ->, k[1]
 * ..., ... ms)": settled on one of the kernels of mask (bit i: k[i]), each
 * of them timed, the others "-". */
static int tuned_line_ok(const char *p, const char *const *k, int n,
                         unsigned mask)
{
    if (strncmp(p, ": ", 2))
        return 0;
    const char *pick = p += 2;
    const size_t pl = strcspn(pick, " ");
    int known = 0;
    for (int i = 0; i < n; i++)
        known |=
            (mask >> i & 1u) && strlen(k[i]) == pl && !strncmp(pick, k[i], pl);
    if (!known || strncmp(p += pl, " (", 2))
        return 0;
    p += 2;
    for (int i = 0; i < n; i++) {
        const size_t l = strlen(k[i]);
        if (strncmp(p, k[i], l) || p[l] != ' ')
            return 0;
        p += l + 1;
        const char *end;
        if (mask >> i & 1u) {
            char *e;
            if (strtof(p, &e) < 0 || e == p)
                return 0;
            end = e;
        } else if (*p == '-')
            end = p + 1;
        else
            return 0;
        if (i + 1 < n && strncmp(end, ", ", 2))
            return 0;
        p = end + (i + 1 < n ? 2 : 0);
    }
    return !strncmp(p, " ms)", 4);
}

/* Whether tun's hp_backend_tuned has the line "<head>: ..." as
 * tuned_line_ok says; the line, or the whole report, into line[cap] for
 * the message. */
static int tuned_settled(const hp_backend_t *tun, const char *head,
                         const char *const *k, int n, unsigned mask, char *line,
                         size_t cap)
{
    char *rep = hp_backend_tuned(tun);
    const char *p = rep ? strstr(rep, head) : NULL, *at = p ? p : rep;
    snprintf(line, cap, "%.*s", at ? (int)strcspn(at, "\n") : 4,
             at ? at : "none");
    const int good = p && tuned_line_ok(p + strlen(head), k, n, mask);
    free(rep);
    return good;
}

/* HYPIC_CUDA_TUNE=1's GDN chunk tuner (backend_cuda.c): at a shape where
 * DEEP, W8 and O64 apply, and R64 on the emulator (dk = dv = 128, T_C,
 * inputs rounded: 16 blocks of 32 columns over its 4 SMs; DEEP's 212 KB
 * fit), 32 calls whose kernels take turns (the ten combinations, those
 * that launch other kernels: all ten on the emulator, eight on a device
 * of more SMs)
 * give the tuner-less backend's o, S and T_C bit for bit each time, and
 * hp_backend_tuned then names the class's choice with a time for each of
 * those, "-" for the others. */
static void check_chunk_tune(const hp_backend_t *tun, const hp_backend_t *ref)
{
    enum { T = 70, HK = 1, HV = 2, DK = 128, DV = 128, C = 64, CALLS = 40 };
    const size_t nq = (size_t)T * HK * DK, nv = (size_t)T * HV * DV;
    const size_t ng = (size_t)T * HV, ns = (size_t)HV * DK * DV;
    const size_t nt = (size_t)HV * DK * DK;
    float *hq = frand_amp(nq, 0.1), *hk = frand_amp(nq, 0.1);
    float *hv = frand_amp(nv, 1.0), *hg = frand_amp(ng, 1.0);
    float *hb = frand_amp(ng, 1.0), *hs = frand_amp(ns, 0.5);
    float *ht = calloc(nt, sizeof(float));
    for (size_t i = 0; i < ng; i++) {
        hg[i] = -0.1f * fabsf(hg[i]); /* decays in (e^-0.1, 1] */
        hb[i] = 0.5f + 0.5f * hb[i];  /* beta in [0, 1] */
    }
    hp_error_t err = {0};
    float *out[2][3]; /* [ref, tuned][o, S, Tc] on the host */
    int same = 1, calls = 0;
    for (int r = 0; r < 2; r++) {
        const hp_backend_t *b = r ? tun : ref;
        float *q = put(b, hq, nq), *k = put(b, hk, nq), *v = put(b, hv, nv);
        float *g = put(b, hg, ng), *be = put(b, hb, ng);
        float *o = hp_backend_alloc(b, nv * sizeof(float));
        float *scr = hp_backend_alloc(
            b,
            hp_backend_gdn_chunk_scratch(b, T, HV, DK, DV, C) * sizeof(float));
        const size_t n[3] = {nv, ns, nt};
        for (int i = 0; i < 3; i++)
            out[r][i] = malloc(n[i] * sizeof(float));
        for (int c = 0; c < (r ? CALLS : 1); c++) {
            float *S = put(b, hs, ns), *Tc = put(b, ht, nt);
            hp_backend_gdn_chunk(b, o, S, Tc, q, k, v, g, be, T, HK, HV, DK, DV,
                                 C, scr, HP_PREC_BF16);
            const float *dev[3] = {o, S, Tc};
            same &= hp_backend_sync(b, &err) == HP_OK;
            for (int i = 0; i < 3; i++) {
                hp_backend_download(b, out[r][i], dev[i], n[i] * sizeof(float));
                if (r)
                    same &= !memcmp(out[0][i], out[1][i], n[i] * sizeof(float));
            }
            calls += r;
            void *p[] = {S, Tc};
            drop(b, p, 2);
        }
        void *p[] = {q, k, v, g, be, o, scr};
        drop(b, p, sizeof p / sizeof p[0]);
    }
    enum { NK = 12 };
    static const char *const kn[NK] = {
        "default", "r64",     "deep",   "o64",         "r64+o64", "deep+o64",
        "w8",      "w8+deep", "w8+o64", "w8+deep+o64", "ov",      "w8+ov"};
    static const unsigned W8 = HK_CUDA_GDN_TC_W8, O64 = HK_CUDA_GDN_TC_O64;
    static const unsigned DEEP = HK_CUDA_GDN_TC_DEEP;
    static const unsigned OV = HK_CUDA_GDN_TC_OVERLAP;
    static const unsigned fl[NK] = {0,
                                    HK_CUDA_GDN_TC_R64,
                                    DEEP,
                                    O64,
                                    HK_CUDA_GDN_TC_R64 | O64,
                                    DEEP | O64,
                                    W8,
                                    W8 | DEEP,
                                    W8 | O64,
                                    W8 | DEEP | O64,
                                    OV,
                                    W8 | OV};
    char runs[NK][32], line[768];
    unsigned mask = 0; /* those whose launches differ from those before */
    for (int i = 0; i < NK; i++) {
        int other = hk_cuda_gdn_tc_kernels(runs[i], sizeof runs[i], T, 1, HK,
                                           HV, DK, DV, C, 1, 1,
                                           HK_CUDA_GDN_TC_ROUND | fl[i]) == 0;
        for (int j = 0; j < i && other; j++)
            other = (mask >> j & 1u) == 0 || strcmp(runs[i], runs[j]);
        mask |= (unsigned)other << i;
    }
    const int settled =
        tuned_settled(tun, "gdn_chunk T<=128 Hk=1 Hv=2 dk=128 dv=128 x=3", kn,
                      NK, mask, line, sizeof line);
    ok(same && calls == CALLS && settled,
       "gdn_chunk tuner: %d calls as the untuned backend's bit for bit, then "
       "%s",
       calls, line);
    for (int r = 0; r < 2; r++)
        for (int i = 0; i < 3; i++)
            free(out[r][i]);
    free(hq);
    free(hk);
    free(hv);
    free(hg);
    free(hb);
    free(hs);
    free(ht);
}

/* HYPIC_CUDA_TUNE=1's attention tuner: bf16 prefills of a prompt after a
 * cached prefix whose kernels (FLASH3_SEQ, FLASH3_WS, FLASH3) take turns
 * give the tuner-less backend's o bit for bit each time, then the class
 * is settled with a time for each; the tuner-less backend reports
 * nothing. Only where the tuner is made: HYPIC_CUDA_ATT unset, bf16's
 * default FLASH3_SEQ (compute capability 9.0, as the emulator's). */
static void check_att_tune(const hp_backend_t *tun, const hp_backend_t *ref)
{
    const char *att = getenv("HYPIC_CUDA_ATT");
    if ((att && *att) || hk_cuda_attention_kernel(HK_CUDA_ATT_DEFAULT_BF16) !=
                             HK_CUDA_ATT_FLASH3_SEQ) {
        tap_diag("attention tuner: none here (HYPIC_CUDA_ATT set, or not "
                 "compute capability 9.0): skipped");
        return;
    }
    enum { T = 40, N = 100, HQ = 4, HKV = 2, HD = 64, CALLS = 12 };
    const size_t nq = (size_t)T * HQ * HD, nk = (size_t)N * HKV * HD;
    float *hq = frand_amp(nq, 1.0), *hk = frand_amp(nk, 1.0);
    float *hv = frand_amp(nk, 1.0);
    float *out[2] = {malloc(nq * sizeof(float)), malloc(nq * sizeof(float))};
    int qpos[T];
    for (int t = 0; t < T; t++)
        qpos[t] = N - T + t;
    hp_error_t err = {0};
    int same = 1, calls = 0;
    for (int r = 0; r < 2; r++) {
        const hp_backend_t *b = r ? tun : ref;
        float *q = put(b, hq, nq), *k = put(b, hk, nk), *v = put(b, hv, nk);
        float *o = hp_backend_alloc(b, nq * sizeof(float));
        float *scr =
            hp_backend_alloc(b, hp_backend_attention_scratch(b, T, N, HQ, HKV,
                                                             HD, HP_PREC_BF16) *
                                    sizeof(float));
        for (int c = 0; c < (r ? CALLS : 1); c++) {
            hp_backend_attention(b, o, q, qpos, k, v, T, N, HQ, HKV, HD, 0.125f,
                                 HP_PREC_BF16, scr);
            same &= hp_backend_sync(b, &err) == HP_OK;
            hp_backend_download(b, out[r], o, nq * sizeof(float));
            if (r)
                same &= !memcmp(out[0], out[1], nq * sizeof(float));
            calls += r;
        }
        void *p[] = {q, k, v, o, scr};
        drop(b, p, sizeof p / sizeof p[0]);
    }
    static const char *const kn[3] = {"flash3_seq", "flash3_ws", "flash3"};
    char line[512];
    const int settled =
        tuned_settled(tun, "attention T<=64 Hkv=2 Hq=4 hd=64 N<=128", kn, 3, 7u,
                      line, sizeof line);
    ok(same && calls == CALLS && settled && !hp_backend_tuned(ref),
       "attention tuner: %d bf16 prefills as the untuned backend's bit for "
       "bit, then %s",
       calls, line);
    free(out[0]);
    free(out[1]);
    free(hq);
    free(hk);
    free(hv);
}

/* The tuners (HYPIC_CUDA_TUNE=1) of the GDN chunk and the attention. */
static void check_tuners(void)
{
    const hp_backend_t *tun, *ref;
    hp_error_t err = {0};
    if (open_tuned(&tun, &ref, &err) != HP_OK) {
        ok(0, "tuners: open: %s", err.msg);
        return;
    }
    check_chunk_tune(tun, ref);
    check_att_tune(tun, ref);
    hp_backend_close(tun);
    hp_backend_close(ref);
}

/* Every row's logits of T tokens of qwen35-dense, run in pieces of
 * `piece`, on the CPU and on the device at f32: the worst relative error
 * between them, or -1 with a failure's message in err; the model's config
 * in *cfg. */
static double dense_logits_vs_cpu(const char *root, int T, int piece,
                                  hp_model_config_t *cfg, hp_error_t *err)
{
    char dir[1024];
    snprintf(dir, sizeof(dir), "%s/models/test/qwen35-dense", root);
    hp_model_t m[2];
    if (hp_model_load(&m[0], dir, err) != HP_OK)
        return -1;
    if (hp_model_load_on(&m[1], dir, cuda, err) != HP_OK) {
        hp_model_free(&m[0]);
        return -1;
    }
    hp_model_set_compute(&m[1], HP_COMPUTE_F32);
    *cfg = m[0].cfg;
    const int V = m[0].cfg.vocab_size;
    int *ids = malloc((size_t)T * sizeof(int)), rc[2] = {HP_ENOMEM, HP_ENOMEM};
    float *lg[2] = {malloc((size_t)T * V * sizeof(float)),
                    malloc((size_t)T * V * sizeof(float))};
    for (int i = 0; ids && i < T; i++)
        ids[i] = (i * 7919 + 13) % V;
    for (int k = 0; k < 2 && ids && lg[0] && lg[1]; k++) {
        hp_fwd_plan_t plan = {piece, T, 1, 1};
        hp_fwd_ws_t ws;
        hp_seq_t s;
        rc[k] = hp_fwd_ws_init(&ws, &m[k], &plan, err);
        if (rc[k] != HP_OK)
            break;
        hp_seq_init(&s, &m[k], err);
        rc[k] = hp_forward(&m[k], &s, &ws, ids, NULL, T, NULL, HP_LOGITS_ALL,
                           lg[k], err);
        hp_seq_free(&s);
        hp_fwd_ws_free(&ws);
    }
    double mx = -1, l2 = 1;
    if (rc[0] == HP_OK && rc[1] == HP_OK)
        test_rel_errs(lg[0], lg[1], (size_t)T * V, &mx, &l2);
    free(ids);
    free(lg[0]);
    free(lg[1]);
    hp_model_free(&m[0]);
    hp_model_free(&m[1]);
    return mx;
}

/* A prompt of 320 tokens in pieces of 32: past 256 keys each piece's
 * attention splits its keys over blocks (its row blocks are under a
 * wave: test_cuda_kernels' test_attention_split), in the scratch the
 * engine's plan sized; every logit as the CPU's. */
static void check_split_kv(const char *root)
{
    enum { T = 320, PIECE = 32 };
    hp_error_t err = {0};
    hp_model_config_t c = {0};
    const double mx = dense_logits_vs_cpu(root, T, PIECE, &c, &err);
#ifdef HK_HAVE_CUDA
    const int ns =
        mx < 0 ? 0
               : hk_cuda_attention_splits(HK_CUDA_ATT_DEFAULT, PIECE, T,
                                          c.n_heads, c.n_kv_heads, c.head_dim);
#else
    const int ns = 0; /* not reached: no device without CUDA */
#endif
    ok(mx >= 0 && ns > 1 && mx <= TOL_F32_LONG,
       "split-KV: %d tokens in pieces of %d (the last piece's keys in %d "
       "splits): logits within %.0e of the CPU's (max %.2e)%s%s",
       T, PIECE, ns, TOL_F32_LONG, mx, mx >= 0 ? "" : " ",
       mx >= 0 ? "" : err.msg);
}

/* steps decode steps of B <= MEMO_B sequences on the dense model, on
 * dev: every step's logits into lg ([steps][B][V]) and each step's
 * transfers (counted at the seam) and host-link copies. */
enum { MEMO_B = 4, MEMO_STEPS = 5, MEMO_LONG = 240 };
static int memo_steps(const char *dir, const hp_backend_t *dev, int B,
                      int steps, float *lg, unsigned long *trans,
                      unsigned long *copies, hp_error_t *err)
{
    hp_model_t m;
    int rc = hp_model_load_on(&m, dir, dev, err);
    if (rc != HP_OK)
        return rc;
    hp_model_set_compute(&m, HP_COMPUTE_F32);
    const int V = m.cfg.vocab_size;
    hp_fwd_plan_t plan = {16, 0, B, 1};
    hp_fwd_ws_t ws;
    hp_seq_t s[MEMO_B];
    int n = 0, tok[MEMO_B], ids[3 + MEMO_B];
    for (int i = 0; i < 3 + MEMO_B; i++)
        ids[i] = (i * 7919 + 13) % V;
    if ((rc = hp_fwd_ws_init(&ws, &m, &plan, err)) != HP_OK) {
        hp_model_free(&m);
        return rc;
    }
    /* prompts of 3..6 tokens: the sequences' lengths differ */
    for (; n < B && rc == HP_OK; n++)
        if ((rc = hp_seq_init(&s[n], &m, err)) == HP_OK)
            rc = hp_forward(&m, &s[n], &ws, ids, NULL, 3 + n, NULL,
                            HP_LOGITS_NONE, NULL, err);
    for (int i = 0; i < B; i++)
        tok[i] = ids[3 + i];
    for (int t = 0; t < steps && rc == HP_OK; t++) {
        hp_fwd_item_t it[MEMO_B];
        for (int i = 0; i < B; i++)
            it[i] = (hp_fwd_item_t){.seq = &s[i], .ids = &tok[i], .T = 1};
        unsigned long t0 = hp_backend_transfer_count(dev);
        unsigned long c0 = hp_backend_host_copies(dev);
        rc = hp_forward_batch(&m, it, B, &ws, err);
        trans[t] = hp_backend_transfer_count(dev) - t0;
        copies[t] = hp_backend_host_copies(dev) - c0;
        for (int i = 0; i < B && rc == HP_OK; i++) {
            float *row = lg + ((size_t)t * B + i) * V;
            if ((rc = it[i].status) != HP_OK) {
                *err = it[i].err;
                break;
            }
            memcpy(row, it[i].logits, (size_t)V * sizeof(float));
            tok[i] = hp_argmax(row, V);
        }
    }
    while (n > 0)
        hp_seq_free(&s[--n]);
    hp_fwd_ws_free(&ws);
    hp_model_free(&m);
    return rc;
}

/* The staging memo (stage_memo.h): the backend hands an op the copy of an
 * array it made before in the ring's current segment. The same decode
 * steps with it and without (HYPIC_CUDA_STAGE_MEMO=0) give the same logits
 * bit for bit; without it every transfer counted at the seam is a copy;
 * with it a step after the first copies only what changed: the token ids,
 * the positions, the context lengths (the next step's positions, reused)
 * and the logits down, not each layer's pointer lists. */
static void check_stage_memo(const char *root)
{
    char dir[1024];
    snprintf(dir, sizeof(dir), "%s/models/test/qwen35-dense", root);
    hp_error_t err = {0};
    const hp_backend_t *off = NULL;
    setenv("HYPIC_CUDA_STAGE_MEMO", "0", 1);
    int rc = open_mode(&off, "tc", &err);
    unsetenv("HYPIC_CUDA_STAGE_MEMO");
    hp_model_config_t cfg;
    if (rc == HP_OK)
        rc = hp_model_config_load(&cfg, dir, &err);
    const size_t n =
        rc == HP_OK ? (size_t)MEMO_STEPS * MEMO_B * cfg.vocab_size : 1;
    float *lg[2] = {malloc(n * sizeof(float)), malloc(n * sizeof(float))};
    unsigned long tr[2][MEMO_STEPS] = {{0}}, cp[2][MEMO_STEPS] = {{0}};
    if (rc == HP_OK)
        rc = memo_steps(dir, cuda_tc, MEMO_B, MEMO_STEPS, lg[0], tr[0], cp[0],
                        &err);
    if (rc == HP_OK)
        rc =
            memo_steps(dir, off, MEMO_B, MEMO_STEPS, lg[1], tr[1], cp[1], &err);
    int same = rc == HP_OK && !memcmp(lg[0], lg[1], n * sizeof(float));
    ok(same,
       "stage memo: %d decode steps of %d sequences, the logits with "
       "it and without bit for bit %s",
       MEMO_STEPS, MEMO_B, rc == HP_OK ? "" : err.msg);
    int all = rc == HP_OK, few = rc == HP_OK;
    unsigned long most = 0;
    for (int t = 0; t < MEMO_STEPS; t++) {
        all &= cp[1][t] == tr[1][t] && tr[0][t] == tr[1][t];
        if (t > 0) {
            few &= cp[0][t] <= 4 && tr[0][t] >= 4 * cp[0][t];
            most = cp[0][t] > most ? cp[0][t] : most;
        }
    }
    ok(all, "stage memo off: each step copies its %lu transfers",
       tr[1][MEMO_STEPS - 1]);
    ok(few,
       "stage memo: after the first step (%lu copies), a step copies %lu "
       "(<= 4: ids, positions, lengths, logits) of its %lu transfers",
       cp[0][0], most, tr[0][MEMO_STEPS - 1]);
    free(lg[0]);
    free(lg[1]);

    /* a long decode: the ring enters new segments (~1 KiB a step of a
     * 64 KiB one), where the lists are copied once more */
    const size_t nl = rc == HP_OK ? (size_t)MEMO_LONG * 2 * cfg.vocab_size : 1;
    float *ll[2] = {malloc(nl * sizeof(float)), malloc(nl * sizeof(float))};
    unsigned long *lt = calloc(4 * MEMO_LONG, sizeof(unsigned long));
    if (rc == HP_OK)
        rc = memo_steps(dir, cuda_tc, 2, MEMO_LONG, ll[0], lt, lt + MEMO_LONG,
                        &err);
    if (rc == HP_OK)
        rc = memo_steps(dir, off, 2, MEMO_LONG, ll[1], lt + 2 * MEMO_LONG,
                        lt + 3 * MEMO_LONG, &err);
    unsigned long copied = 0, moved = 0;
    for (int t = 0; t < MEMO_LONG; t++) {
        copied += lt[MEMO_LONG + t];
        moved += lt[3 * MEMO_LONG + t];
    }
    ok(rc == HP_OK && !memcmp(ll[0], ll[1], nl * sizeof(float)) &&
           4 * copied < moved,
       "stage memo: %d decode steps of 2 sequences (new ring segments), the "
       "logits with it and without bit for bit; %lu copies of %lu %s",
       MEMO_LONG, copied, moved, rc == HP_OK ? "" : err.msg);
    free(ll[0]);
    free(ll[1]);
    free(lt);
    hp_backend_close(off);
}

/* A KVBuffer decode step (chunkwise, flushing every 4 entries) of two
 * sequences on the dense model waits for the device as a plain step
 * does: for the argmax and the step's status, not per layer (each
 * layer's views go through the staging ring, not a synchronous upload). */
static void check_kvbuf_waits(const char *root)
{
    enum { STEPS = 6 };
    char dir[1024];
    snprintf(dir, sizeof(dir), "%s/models/test/qwen35-dense", root);
    hp_error_t err = {0};
    hp_model_t m;
    int rc = hp_model_load_on(&m, dir, cuda_tc, &err);
    if (rc != HP_OK) {
        ok(0, "kvbuf waits: %s", err.msg);
        return;
    }
    const hp_model_config_t *c = &m.cfg;
    hp_kvbuf_config_t kc;
    hp_kvbuf_config_default(&kc, c->lin_k_heads, c->lin_v_heads, c->lin_k_dim,
                            c->lin_v_dim);
    kc.cap = 4;
    kc.n_blocks = 2 * c->n_layers * (kc.cap_kvonly / kc.block_tokens + 3);
    kc.be = m.be;
    hp_kvbuf_pool_t pool;
    hp_fwd_plan_t plan = {16, 0, 2, 1};
    hp_fwd_ws_t ws;
    hp_seq_t s[2];
    int ids[8] = {3, 14, 15, 92, 65, 35, 89, 79}, tok[2] = {5, 6}, n = 0;
    unsigned long most = 0;
    int pooled = (rc = hp_kvbuf_pool_init(&pool, &kc, &err)) == HP_OK;
    int spaced = pooled && (rc = hp_fwd_ws_init(&ws, &m, &plan, &err)) == HP_OK;
    /* prompts of 5 and 6 tokens */
    for (; n < 2 && rc == HP_OK; n++) {
        if ((rc = hp_seq_init(&s[n], &m, &err)) != HP_OK)
            break;
        if ((rc = hp_forward(&m, &s[n], &ws, ids, NULL, 5 + n, NULL,
                             HP_LOGITS_NONE, NULL, &err)) == HP_OK)
            rc = hp_seq_kvbuf_open(&s[n], &pool, &err);
    }
    for (int t = 0; t < STEPS && rc == HP_OK; t++) {
        hp_fwd_item_t it[2] = {
            {.seq = &s[0], .ids = &tok[0], .T = 1, .argmax = 1},
            {.seq = &s[1], .ids = &tok[1], .T = 1, .argmax = 1}};
        unsigned long w0 = hp_backend_device_waits(m.be);
        rc = hp_forward_batch(&m, it, 2, &ws, &err);
        unsigned long w = hp_backend_device_waits(m.be) - w0;
        most = w > most ? w : most;
        for (int i = 0; i < 2 && rc == HP_OK; i++)
            if ((rc = it[i].status) == HP_OK)
                tok[i] = it[i].best[0];
            else
                err = it[i].err;
    }
    ok(rc == HP_OK && most <= 2,
       "kvbuf: %d KVBuffer decode steps of 2 sequences (flushing every 4) "
       "each wait for the device at most %lu times (<= 2: the argmax, the "
       "status; %d layers) %s",
       STEPS, most, c->n_layers, rc == HP_OK ? "" : err.msg);
    while (n > 0)
        hp_seq_free(&s[--n]);
    if (spaced)
        hp_fwd_ws_free(&ws);
    if (pooled)
        hp_kvbuf_pool_free(&pool);
    hp_model_free(&m);
}

/* Every row's logits of one pass longer than the workspace's logits
 * (HP_FWD_LOGIT_ROWS): the device computes and downloads them in slices,
 * the same as the CPU's in one. */
static void check_logit_slices(const char *root)
{
    enum { T = HP_FWD_LOGIT_ROWS + 37 };
    hp_error_t err = {0};
    hp_model_config_t c = {0};
    const double mx = dense_logits_vs_cpu(root, T, T, &c, &err);
    ok(mx >= 0 && mx <= TOL_F32_LONG,
       "logits of %d rows in one pass, in slices of %d: within %.0e of the "
       "CPU's (max %.2e)%s%s",
       T, HP_FWD_LOGIT_ROWS, TOL_F32_LONG, mx, mx >= 0 ? "" : " ",
       mx >= 0 ? "" : err.msg);
}

static void check(const char *root, const char *name)
{
    char dir[1024];
    snprintf(dir, sizeof(dir), "%s/models/test/%s", root, name);
    check_dir(dir, name);
}

/* argv[1], when given: one more model directory (t/015 passes an f32
 * copy of the MoE model). */
int main(int argc, char **argv)
{
    hp_error_t err = {0};
    int rc = open_mode(&cuda, NULL, &err);
    if (test_cuda_absent(rc, &err))
        return tap_done();
    const hp_backend_t *b;
    ok(hp_backend_open(&b, "cuda:64", &err) == HP_EUNAVAIL &&
           strstr(err.msg, "no such device"),
       "a device that does not exist: %s", err.msg);
    ok(hp_backend_supports_op(cuda, HP_OP_LINEAR, HK_W_I8) &&
           hp_backend_supports_op(cuda, HP_OP_LINEAR, HK_W_BF16) &&
           hp_backend_supports_op(cuda, HP_OP_KVBUF_STEP, 0) &&
           hp_backend_supports_op(cuda, HP_OP_KVBUF_FLUSH, 0) &&
           hp_backend_supports_op(cuda, HP_OP_KVBUF_CONV_COMMIT, 0),
       "cuda: I8 and BF16 projections and the KVBuffer are supported");
    ok(hp_backend_supports_op(cuda, HP_OP_EMBED, HK_W_BF16) &&
           hp_backend_supports_op(cuda, HP_OP_EMBED, HK_W_I8),
       "cuda: BF16 and I8 embeddings are gathered on the device");
    ok(open_mode(&b, "fast", &err) == HP_EBADINPUT &&
           strstr(err.msg, "auto, tc, scalar, tc_v1, tc_fast, tc_a1, "
                           "tc_bf16, tc_p, tc_bf16_p, tc_a3, tc_ro, "
                           "tc_a3ro, tc_r64, tc_deep, tc_w8 or tc_ov"),
       "an unknown HYPIC_CUDA_GDN is refused: %s", err.msg);
    if (open_mode(&cuda_tc, "tc", &err) != HP_OK ||
        open_mode(&cuda_scalar, "scalar", &err) != HP_OK ||
        open_mode(&cuda_bf16, "tc_bf16", &err) != HP_OK) {
        ok(0, "cuda:0 with HYPIC_CUDA_GDN=tc, scalar and tc_bf16: %s", err.msg);
        return tap_done();
    }
    check_fused(cuda);
    check_mlp(cuda);
    check_conv_qkv(cuda);
    check_tuners();
    const char *root = getenv("HYPIC_ROOT") ? getenv("HYPIC_ROOT") : ".";
    check_split_kv(root);
    check_logit_slices(root);
    check_stage_memo(root);
    check_kvbuf_waits(root);
    if (argc > 1)
        check_dir(argv[1], argv[1]);
    /* the int8 checkpoints (the small grid: one) */
    const char *grid = getenv("HK_CUDA_TEST_GRID");
    small_grid = grid && !strcmp(grid, "small");
    static const char *const i8[] = {"qwen35-dense-int8", "qwen35-moe-int8",
                                     "qwen3next-int8"};
    for (int k = 0; k < (small_grid ? 1 : 3); k++)
        check(root, i8[k]);
    check_qk_norm_rope(cuda); /* after the checks whose draws it would move */
    rc = test_each_model(check);
    hp_backend_close(cuda);
    hp_backend_close(cuda_tc);
    hp_backend_close(cuda_scalar);
    hp_backend_close(cuda_bf16);
    return rc;
}
