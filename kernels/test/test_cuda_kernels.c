/*
 * test_cuda_kernels.c - the CUDA twins (kernels/cuda/hk_cuda.h) against the
 * CPU kernels (kernels/cpu/hk_cpu.h), which are themselves tested against
 * float64 references by the other kernel tests.
 *
 * Every op runs over a grid of shapes (odd sizes, sizes below and above a
 * warp, T below the conv width, GQA head ratios, all three transition
 * families and their aliasing modes) on the same random inputs, and each
 * output element must satisfy |ref - x| <= atol + rtol |ref| with ref the
 * CPU result. One TAP check per (op, shape).
 *
 * HK_CUDA_TEST_GRID=small keeps the first shapes of each grid (the host
 * emulator's quick run in make test; kernels/cuda/emu/run.sh).
 *
 * Built with -DHK_HAVE_CUDA and linked with libhk_cuda.a -lcudart -lcublas
 * when nvcc exists; without it, or on a machine with no device, it prints
 * the plan and one "ok N # SKIP no CUDA device" per op and exits 0.
 */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/common/hk_bf16.h"
#include "kernels/common/hk_math.h"
#include "kernels/cpu/hk_cpu.h"
#include "kernels/cpu/hk_kvbuf.h"
#include "t/lib/tap.h"
#define TEST_RNG_SEED 0x6a09e667f3bcc909ull
#include "t/lib/testrand.h"
#ifdef HK_HAVE_CUDA
#include "kernels/cuda/hk_cuda.h"
#endif

static const char *const op_names[] = {"rmsnorm_zc",
                                       "rmsnorm_gated",
                                       "l2norm",
                                       "swiglu",
                                       "conv1d_silu",
                                       "conv1d_silu_decode",
                                       "conv_qkv_decode",
                                       "rope",
                                       "rope_shift",
                                       "qk_norm_rope",
                                       "gdn_gates",
                                       "gdn_recurrent",
                                       "gdn_decode",
                                       "gdn_chunk",
                                       "trans_compose",
                                       "trans_chain",
                                       "trans_rope_shift",
                                       "matmul",
                                       "matmul_acc",
                                       "matmul_bf16",
                                       "gemv_bf16",
                                       "linear_i8",
                                       "split_heads",
                                       "gate_mul",
                                       "axpy",
                                       "scale_rows",
                                       "kv_store",
                                       "kv_store_decode",
                                       "kv_store_paged",
                                       "embed",
                                       "weight_rows",
                                       "attention",
                                       "attention_decode",
                                       "attention_decode_paged",
                                       "moe_route",
                                       "moe_plan",
                                       "moe_gather",
                                       "moe_scatter",
                                       "moe_combine",
                                       "argmax",
                                       "topk",
                                       "gdn_chunk_bf16",
                                       "gdn_chunk_bf16_varlen",
                                       "gdn_chunk_tc",
                                       "gdn_step",
                                       "kvbuf_step",
                                       "kvbuf_verify",
                                       "kvbuf_flush",
                                       "kvbuf_conv_commit",
                                       "ring"};
#define N_OPS ((int)(sizeof(op_names) / sizeof(op_names[0])))

static void print_plan(void)
{
    tap_diag("CUDA twins vs CPU kernels, %d ops over shape grids:", N_OPS);
    for (int i = 0; i < N_OPS; i++)
        tap_diag("  %s", op_names[i]);
    tap_diag("pass: |cpu - cuda| <= atol + rtol |cpu| per element");
}

#ifdef HK_HAVE_CUDA

/* ---- tolerances ------------------------------------------------------------
 * The CPU result is the reference; both sides are f32. What differs is the
 * order of f32 additions (tree reductions on the GPU, serial or BLAS
 * blocking on the CPU), FMA contraction, and libm vs CUDA's expf/log1pf
 * (both within 2 ulp). */

/* Norms: the sum of squares is a double sum on the CPU and an f32 tree on
 * the GPU (~(dim/256 + 8) roundings, <= 40 at dim 8192: 2.4e-6 relative,
 * halved by the square root), then 2-3 f32 multiplies and silu's expf. */
#define RTOL_NORM 4e-6
#define ATOL_NORM 1e-6
/* Elementwise silu(g) u and the gates: expf/log1pf/division, each a few
 * ulp apart between glibc and CUDA. */
#define RTOL_EW 2e-6
#define ATOL_EW 1e-7
/* Conv: the same K-term sum in the same order on both sides; only FMA
 * contraction may differ (an ulp per term on O(1) terms), then silu. The
 * state is a copy of inputs: exact. */
#define RTOL_CONV 2e-6
#define ATOL_CONV 1e-6
/* RoPE: cos/sin formed in double and rounded once on both sides, then two
 * products and a sum: an FMA may change the last bit of an O(1) value. */
#define RTOL_ROPE 1e-6
#define ATOL_ROPE 5e-7
/* GDN: dot products over dk <= 256 in different orders (warp trees vs
 * serial / BLAS blocks): ~sqrt(dk) roundings of O(1) entries per token.
 * The state contracts each token (eigenvalues of e^g (I - b k k^T) are in
 * [0, 1]), so errors do not compound (test_gdn.c measures 1e-7..1e-6 vs
 * float64; under the host emulator the worst element here uses 1/50 of
 * this budget). These are test_gdn.c's per-element bounds: 2e-6 absolute
 * for entries that cancel to ~0, 1e-4 relative; a wrong decay, index or
 * step order gives errors of 1e-3 and up. */
#define RTOL_GDN 1e-4
#define ATOL_GDN 2e-6
/* Dense transitions: one dk-term product per entry (dk <= 128, entries
 * O(1/sqrt(dk)) times O(1)): ~1e-6 of the O(1) result; scalar and
 * diagonal families are one multiply-add (exact up to FMA). */
#define RTOL_TRANS 1e-5
#define ATOL_TRANS 2e-6
/* State rotation: computed in double, rounded once, on both sides. */
#define RTOL_TROPE 1e-6
#define ATOL_TROPE 1e-7

/* Attention: scores are hd-term dot products (hd <= 256, O(1) terms)
 * in another order, then exp (the CPU's polynomial vs expf, ~1 ulp each)
 * and a normalized sum of O(1) values: ~1e-6 of the O(1) output. A wrong
 * mask, group or scale moves outputs by 1e-2 and more. */
#define RTOL_ATT 2e-5
#define ATOL_ATT 2e-6
/* The tensor-core prefill (FLASH): every operand split into bf16 hi + lo,
 * products hi*hi + hi*lo + lo*hi (~3 * 2^-18 of |x y| each: the dropped
 * lo*lo and the remainders), so a score is off by up to ~1e-5 of
 * sum_d |q_d k_d| scale (~1e-4 at hd 256 with O(1) entries), and each
 * probability by as much, relatively; o, a weighted mean of v, by that
 * times |v - o|. Under the emulator the worst element is 2.5e-5 of the
 * outputs' rms (4e-6 absolute at hd 128 against float64); the bound leaves
 * room for another accumulation order. FLASH_BF16 rounds q, k, p, v to
 * bf16 once (2^-9 relative each): ~100x more. A dropped lo term, a wrong
 * mask, group, tile edge or rescale moves outputs by 1e-3 and more.
 * FLASH2X (FLASH2's kernel on the same split) is held to it too: under
 * the emulator at 0.04-0.13 of it, where FLASH2 is 23-36x over it. */
#define RTOL_ATT_TC   2e-4
#define ATOL_ATT_TC   5e-5
#define RTOL_ATT_BF16 2e-2
#define ATOL_ATT_BF16 4e-3
/* The bf16 kernels on q of amplitude 3 (scores of O(1), a sharper
 * softmax: the FLASH3 and split-KV tests): the scores' rounding error
 * grows with them, and the emulator's worst element reached 1.01 of the
 * bound above on one draw of inputs (0.56 on another); twice it. */
#define RTOL_ATT_BF16_Q3 (2 * RTOL_ATT_BF16)
#define ATOL_ATT_BF16_Q3 (2 * ATOL_ATT_BF16)
/* Projections: in <= 512 products of O(1) x O(1/sqrt(in)) terms in
 * another order (cuBLAS blocking vs OpenBLAS's): ~sqrt(in) roundings of
 * the O(1) result. The bf16 path multiplies the same rounded inputs. */
#define RTOL_MM 2e-5
#define ATOL_MM 2e-6
/* Router and sampler probabilities: expf / exp and a double normalizer
 * on both sides, summed in another order; then one division. */
#define RTOL_SEL 2e-6
#define ATOL_SEL 1e-9
/* A row's log-sum-exp: the same double terms summed in another order
 * (at most V of them, each rounding by 2^-53 relative: V 2^-53 <= 3e-11
 * relative to the sum at V = 248320), then log. */
#define TOL_LSE 1e-10

/* ---- plumbing ------------------------------------------------------------ */

/* The number of shapes of a grid to run: all, or the first few with
 * HK_CUDA_TEST_GRID=small. */
static int small_grid;
#define NSHAPES(a) ((int)(sizeof(a) / sizeof((a)[0])))
static int grid_n(int all, int small)
{
    return small_grid && small < all ? small : all;
}

/* Tests may exit (style anchors §9): a CUDA error mid-test is a bail out. */
#define CK(rc) cuda_check((rc), __FILE__, __LINE__)
static void cuda_check(int rc, const char *file, int line)
{
    if (rc == 0)
        return;
    printf("Bail out! %s:%d: %s (%d)\n", file, line, hk_cuda_strerror(rc), rc);
    exit(1);
}

/* Launch result, then the stream: asynchronous faults surface here. */
#define RUN(call)                                                              \
    do {                                                                       \
        CK(call);                                                              \
        CK(hk_cuda_stream_sync(NULL));                                         \
    } while (0)

static double nrand(void) /* standard normal */
{
    double u1 = 0.5 * (urand() + 1.0), u2 = 0.5 * (urand() + 1.0);
    return sqrt(-2.0 * log(1.0 - u1)) * cos(2.0 * M_PI * u2);
}

/* bytes of host memory, or a bail out */
static void *hbytes(size_t bytes)
{
    void *x = malloc(bytes ? bytes : 1);
    if (!x) {
        printf("Bail out! out of host memory\n");
        exit(1);
    }
    return x;
}

static float *hmalloc(size_t n)
{
    return hbytes(n * sizeof(float));
}

static float *frand(size_t n, double amp)
{
    float *x = hmalloc(n);
    for (size_t i = 0; i < n; i++)
        x[i] = (float)(amp * urand());
    return x;
}

static float *fdup(const float *x, size_t n)
{
    float *y = hmalloc(n);
    memcpy(y, x, n * sizeof(float));
    return y;
}

static float *dev_alloc(size_t n)
{
    void *d = NULL;
    CK(hk_cuda_malloc(&d, n * sizeof(float)));
    return d;
}

/* n bf16 elements of device memory, uninitialized. */
static uint16_t *dev_alloc_u16(size_t n)
{
    void *d = NULL;
    CK(hk_cuda_malloc(&d, (n ? n : 1) * sizeof(uint16_t)));
    return d;
}

/* A device copy of bytes of host memory (at least one byte allocated). */
static void *dev_bytes(const void *h, size_t bytes)
{
    void *d = NULL;
    CK(hk_cuda_malloc(&d, bytes ? bytes : 1));
    CK(hk_cuda_h2d(d, h, bytes, NULL));
    return d;
}

static float *dev_from(const float *h, size_t n)
{
    float *d = dev_alloc(n);
    CK(hk_cuda_h2d(d, h, n * sizeof(float), NULL));
    return d;
}

/* Device -> new host buffer. */
static float *host_from(const float *d, size_t n)
{
    float *h = hmalloc(n);
    CK(hk_cuda_d2h(h, d, n * sizeof(float), NULL));
    return h;
}

/* The worst |err| / (atol + rtol |ref|) of a device array. */
static double ratio_cpu(const float *ref, const float *d_x, size_t n,
                        double atol, double rtol)
{
    float *x = host_from(d_x, n);
    const double r = tap_close_ratio_f(ref, x, n, atol, rtol);
    free(x);
    return r;
}

/* One check per (op, shape): the worst ratio over the named tensors. */
static int close_cpu(const float *ref, const float *d_x, size_t n, double atol,
                     double rtol, const char *what)
{
    const double r = ratio_cpu(ref, d_x, n, atol, rtol);
    if (!(r <= 1.0) || getenv("HK_CUDA_TEST_VERBOSE"))
        tap_diag("  %s: worst |err| / (atol + rtol |ref|) = %.3g", what, r);
    return r <= 1.0;
}

/* Copies (conv states) must be bit-exact. */
static int same_cpu(const float *ref, const float *d_x, size_t n,
                    const char *what)
{
    float *x = host_from(d_x, n);
    const int same = n == 0 || memcmp(ref, x, n * sizeof(float)) == 0;
    free(x);
    if (!same)
        tap_diag("  %s: not bit-exact", what);
    return same;
}

/* A _bf16 entry's output d_b: the f32 entry's output d_f (on the device)
 * rounded to bf16, bit for bit. */
/* Whether the device's bf16 d_b is the device's f32 d_f rounded, within
 * ulps bf16 steps (0: bit for bit). */
static int near_rounded(const float *d_f, const void *d_b, size_t n, int ulps,
                        const char *what)
{
    float *f = host_from(d_f, n);
    uint16_t *b = malloc((n ? n : 1) * sizeof(uint16_t));
    CK(hk_cuda_d2h(b, d_b, n * sizeof(uint16_t), NULL));
    int same = 1;
    for (size_t i = 0; i < n; i++) {
        const uint16_t r = hk_bf16_from_f32(f[i]);
        /* 8 significant bits: a step is |r| 2^-7 at most */
        const double step = ldexp(fabs(hk_bf16_to_f32(r)), -7) + 1e-38;
        same &= b[i] == r ||
                (ulps > 0 &&
                 fabs(hk_bf16_to_f32(b[i]) - hk_bf16_to_f32(r)) <= ulps * step);
    }
    free(f);
    free(b);
    if (!same)
        tap_diag("  %s: not the f32 output rounded%s", what,
                 ulps ? " (within a step)" : "");
    return same;
}

static int same_rounded(const float *d_f, const void *d_b, size_t n,
                        const char *what)
{
    return near_rounded(d_f, d_b, n, 0, what);
}

/* Device bf16 of host f32 values (rounded to nearest even). */
static uint16_t *dev_bf16_of(const float *x, size_t n)
{
    uint16_t *h = malloc((n ? n : 1) * sizeof(uint16_t));
    for (size_t i = 0; i < n; i++)
        h[i] = hk_bf16_from_f32(x[i]);
    uint16_t *d = dev_alloc_u16(n);
    CK(hk_cuda_h2d(d, h, n * sizeof(uint16_t), NULL));
    free(h);
    return d;
}

/* ---- norms and activations ------------------------------------------------
 */

/* rows, dim: the warp kernels (rmsnorm to dim 1024 in 1, 2, 4 and 8
 * chunks a lane, l2norm to 256; rows past a block's warps), the block
 * kernels holding the row (2048, 4096, 8191: not a multiple of 4, element
 * by element), the strided one (9000; l2norm past 256). */
static const int norm_shapes[][2] = {
    {1, 1},    {3, 17},    {19, 200}, {7, 128},  {5, 257},
    {2, 1000}, {33, 2048}, {9, 4096}, {4, 8191}, {2, 9000}};
#define N_NORM ((int)(sizeof(norm_shapes) / sizeof(norm_shapes[0])))

/* The device copy of h [n] at an odd float offset in its allocation (not
 * 16-byte aligned: the norms' element-by-element path); *base: the
 * allocation, for hk_cuda_free. */
static float *dev_from_odd(const float *h, size_t n, float **base)
{
    *base = dev_alloc(n + 1);
    CK(hk_cuda_h2d(*base + 1, h, n * sizeof(float), NULL));
    return *base + 1;
}

static void test_norms(void)
{
    const float eps = 1e-6f;
    for (int s = 0; s < grid_n(N_NORM, 6); s++) {
        const int rows = norm_shapes[s][0], dim = norm_shapes[s][1];
        const size_t n = (size_t)rows * dim;
        float *x = frand(n, 3.0), *z = frand(n, 4.0);
        float *w = frand((size_t)dim, 1.0), *y = hmalloc(n);
        if (rows > 1) /* a zero row: y = 0 on both sides, not NaN */
            memset(x + dim, 0, (size_t)dim * sizeof(float));
        float *dx = dev_from(x, n), *dz = dev_from(z, n);
        float *dw = dev_from(w, (size_t)dim), *dy = dev_alloc(n);

        hk_rmsnorm_zc(y, x, w, rows, dim, eps);
        RUN(hk_cuda_rmsnorm_zc(dy, dx, dw, rows, dim, eps, NULL));
        int good = close_cpu(y, dy, n, ATOL_NORM, RTOL_NORM, "y");
        /* bf16 out: the same y rounded */
        uint16_t *db = dev_alloc_u16(n);
        RUN(hk_cuda_rmsnorm_zc_bf16(db, dx, dw, rows, dim, eps, NULL));
        good &= same_rounded(dy, db, n, "y bf16");
        /* in place (y aliases x) on a copy */
        float *dxi = dev_from(x, n);
        RUN(hk_cuda_rmsnorm_zc(dxi, dxi, dw, rows, dim, eps, NULL));
        good &= close_cpu(y, dxi, n, ATOL_NORM, RTOL_NORM, "y in place");
        ok(good, "rmsnorm_zc rows=%d dim=%d (in place, bf16 out)", rows, dim);

        hk_rmsnorm_gated(y, x, z, w, rows, dim, eps);
        RUN(hk_cuda_rmsnorm_gated(dy, dx, dz, dw, rows, dim, eps, NULL));
        good = close_cpu(y, dy, n, ATOL_NORM, RTOL_NORM, "y");
        RUN(hk_cuda_rmsnorm_gated_bf16(db, dx, dz, dw, rows, dim, eps, NULL));
        good &= same_rounded(dy, db, n, "y bf16");
        /* unaligned x (element by element): the same bits, the sums'
         * order not depending on the access width */
        float *bx, *dxo = dev_from_odd(x, n, &bx), *dyo = dev_alloc(n);
        RUN(hk_cuda_rmsnorm_gated(dyo, dxo, dz, dw, rows, dim, eps, NULL));
        float *hy = host_from(dy, n);
        good &= same_cpu(hy, dyo, n, "y of unaligned x");
        ok(good, "rmsnorm_gated rows=%d dim=%d (bf16 out, unaligned x)", rows,
           dim);
        CK(hk_cuda_free(db));

        const float scale = 1.0f / sqrtf((float)dim);
        memcpy(y, x, n * sizeof(float));
        hk_l2norm(y, rows, dim, eps, scale);
        RUN(hk_cuda_l2norm(dx, rows, dim, eps, scale, NULL));
        RUN(hk_cuda_l2norm(dxo, rows, dim, eps, scale, NULL));
        free(hy);
        hy = host_from(dx, n);
        ok(close_cpu(y, dx, n, ATOL_NORM, RTOL_NORM, "x") &&
               same_cpu(hy, dxo, n, "x unaligned"),
           "l2norm rows=%d dim=%d (unaligned: the same bits)", rows, dim);
        free(hy);
        CK(hk_cuda_free(bx));
        CK(hk_cuda_free(dyo));

        CK(hk_cuda_free(dx));
        CK(hk_cuda_free(dxi));
        CK(hk_cuda_free(dz));
        CK(hk_cuda_free(dw));
        CK(hk_cuda_free(dy));
        free(x);
        free(z);
        free(w);
        free(y);
    }
}

static void test_swiglu(void)
{
    static const size_t ns[] = {1, 31, 1000, 100003};
    for (int s = 0; s < grid_n(NSHAPES(ns), 3); s++) {
        const size_t n = ns[s];
        float *g = frand(n, 12.0), *u = frand(n, 2.0), *y = hmalloc(n);
        float *dg = dev_from(g, n), *du = dev_from(u, n), *dy = dev_alloc(n);
        hk_swiglu(y, g, u, n);
        RUN(hk_cuda_swiglu(dy, dg, du, n, NULL));
        uint16_t *db = dev_alloc_u16(n);
        RUN(hk_cuda_swiglu_bf16(db, dg, du, n, NULL));
        int good = close_cpu(y, dy, n, ATOL_EW, RTOL_EW, "y") &&
                   same_rounded(dy, db, n, "y bf16");
        /* bf16 in (a bf16 GEMM's outputs), in place over g: the f32
         * kernel on their values, rounded */
        for (size_t i = 0; i < n; i++) {
            g[i] = hk_bf16_to_f32(hk_bf16_from_f32(g[i]));
            u[i] = hk_bf16_to_f32(hk_bf16_from_f32(u[i]));
        }
        CK(hk_cuda_h2d(dg, g, n * sizeof(float), NULL));
        CK(hk_cuda_h2d(du, u, n * sizeof(float), NULL));
        RUN(hk_cuda_swiglu(dy, dg, du, n, NULL));
        uint16_t *gb = dev_bf16_of(g, n), *ub = dev_bf16_of(u, n);
        RUN(hk_cuda_swiglu_bf16_in(gb, gb, ub, n, NULL));
        good &= same_rounded(dy, gb, n, "y of bf16 g, u");
        if (n > 1) { /* unaligned (element by element): the same bits */
            float *dy1 = dev_alloc(n), *hy = host_from(dy, n);
            RUN(hk_cuda_swiglu(dy1 + 1, dg + 1, du + 1, n - 1, NULL));
            good &= same_cpu(hy + 1, dy1 + 1, n - 1, "y unaligned");
            CK(hk_cuda_free(dy1));
            free(hy);
        }
        ok(good,
           "swiglu n=%zu (bf16 out; bf16 in and out, in place; unaligned)", n);
        CK(hk_cuda_free(gb));
        CK(hk_cuda_free(ub));
        CK(hk_cuda_free(db));
        CK(hk_cuda_free(dg));
        CK(hk_cuda_free(du));
        CK(hk_cuda_free(dy));
        free(g);
        free(u);
        free(y);
    }
}

/* ---- conv ------------------------------------------------------------------
 */

static void test_conv(void)
{
    /* T, C, K: T < K-1 shifts the state; K = 1 has none; odd C. */
    static const int shapes[][3] = {{1, 1, 4},   {1, 37, 4},   {5, 64, 4},
                                    {2, 129, 4}, {17, 300, 4}, {9, 33, 1},
                                    {6, 50, 2},  {40, 257, 5}};
    for (int s = 0; s < NSHAPES(shapes); s++) {
        const int T = shapes[s][0], C = shapes[s][1], K = shapes[s][2];
        const size_t nx = (size_t)T * C, ns = (size_t)C * (K - 1);
        float *x = frand(nx, 1.0), *w = frand((size_t)C * K, 1.0);
        float *st = frand(ns, 1.0), *y = hmalloc(nx);
        float *dx = dev_from(x, nx), *dw = dev_from(w, (size_t)C * K);
        float *dst = dev_from(st, ns), *dy = dev_alloc(nx);
        hk_conv1d_silu(y, st, x, w, T, C, K);
        RUN(hk_cuda_conv1d_silu(dy, dst, dx, dw, T, C, K, NULL));
        int good = close_cpu(y, dy, nx, ATOL_CONV, RTOL_CONV, "y");
        good &= same_cpu(st, dst, ns, "state");
        ok(good, "conv1d_silu T=%d C=%d K=%d", T, C, K);
        CK(hk_cuda_free(dx));
        CK(hk_cuda_free(dw));
        CK(hk_cuda_free(dst));
        CK(hk_cuda_free(dy));
        free(x);
        free(w);
        free(st);
        free(y);
    }
}

/* The GDN input path in one launch (hk_cuda_conv_qkv) against its four
 * kernels (conv, split, l2 norms, gates) on the device: q, k, v, the gates
 * and the state bit for bit; T < K-1 reads the state; dk > dv and dk < dv.
 * The warp kernel: T over several runs of a warp and blocks (70: the
 * runs' first tokens read x before them), dims not a multiple of 4
 * (element by element), heads of 2 chunks a lane (200, 256), K = 1, 3.
 * The block kernel: dk past 256 (the block's reduction), dv past 256 or
 * K = 5 with dk <= 256 (the warp's reduction, as l2norm's). */
/* One GDN input path's inputs and outputs on the device: x [rows, C] and
 * the conv weights; q, k [rows, Hk dk], v [rows, Hv dv] of the unfused
 * ops (0) and the fused one (1), their g and beta [rows, Hv] holding the
 * raw a and b until the gates are formed in place. */
typedef struct {
    int rows, Hk, Hv, dk, dv, K;
    float *x, *w, *al, *db, *cv; /* cv: the unfused conv's output */
    float *q[2], *k[2], *v[2], *g[2], *beta[2];
} qkv_dev_t;

static qkv_dev_t qkv_dev(int rows, int Hk, int Hv, int dk, int dv, int K,
                         const float *x, const float *w, const float *ga,
                         const float *gb, const float *al, const float *db)
{
    const size_t C = 2 * (size_t)Hk * dk + (size_t)Hv * dv;
    const size_t ng = (size_t)rows * Hv;
    qkv_dev_t d = {rows,
                   Hk,
                   Hv,
                   dk,
                   dv,
                   K,
                   dev_from(x, rows * C),
                   dev_from(w, C * K),
                   dev_from(al, Hv),
                   dev_from(db, Hv),
                   dev_alloc(rows * C),
                   {NULL},
                   {NULL},
                   {NULL},
                   {NULL},
                   {NULL}};
    for (int i = 0; i < 2; i++) {
        d.q[i] = dev_alloc((size_t)rows * Hk * dk);
        d.k[i] = dev_alloc((size_t)rows * Hk * dk);
        d.v[i] = dev_alloc((size_t)rows * Hv * dv);
        d.g[i] = dev_from(ga, ng);
        d.beta[i] = dev_from(gb, ng);
    }
    return d;
}

/* The unfused path after the conv (d->cv): split, norms, gates. */
static void qkv_unfused(const qkv_dev_t *d, float eps, float qs)
{
    const int n = d->rows, kd = d->Hk * d->dk, vd = d->Hv * d->dv;
    RUN(hk_cuda_split_heads(d->q[0], d->k[0], d->v[0], d->cv, n, kd, kd, vd,
                            NULL));
    RUN(hk_cuda_l2norm(d->q[0], n * d->Hk, d->dk, eps, qs, NULL));
    RUN(hk_cuda_l2norm(d->k[0], n * d->Hk, d->dk, eps, 1.0f, NULL));
    RUN(hk_cuda_gdn_gates(d->g[0], d->beta[0], d->g[0], d->beta[0], d->al,
                          d->db, n, d->Hv, NULL));
}

/* Whether the fused outputs are the unfused ones bit for bit. */
static int qkv_same(const qkv_dev_t *d)
{
    const size_t nq = (size_t)d->rows * d->Hk * d->dk;
    const size_t nv = (size_t)d->rows * d->Hv * d->dv;
    const size_t ng = (size_t)d->rows * d->Hv;
    float *const *at[5] = {d->q, d->k, d->v, d->g, d->beta};
    const size_t n[5] = {nq, nq, nv, ng, ng};
    static const char *const what[5] = {"q", "k", "v", "g", "beta"};
    int good = 1;
    for (int i = 0; i < 5; i++) {
        float *h = host_from(at[i][0], n[i]);
        good &= same_cpu(h, at[i][1], n[i], what[i]);
        free(h);
    }
    return good;
}

static void qkv_free(qkv_dev_t *d)
{
    float **one[5] = {&d->x, &d->w, &d->al, &d->db, &d->cv};
    float **two[5] = {d->q, d->k, d->v, d->g, d->beta};
    for (int i = 0; i < 5; i++) {
        CK(hk_cuda_free(*one[i]));
        CK(hk_cuda_free(two[i][0]));
        CK(hk_cuda_free(two[i][1]));
    }
}

static void test_conv_qkv(void)
{
    /* T, Hk, Hv, dk, dv, K */
    static const int shapes[][6] = {
        {2, 1, 1, 16, 16, 4},  {70, 2, 3, 32, 16, 4}, {5, 2, 2, 64, 128, 4},
        {3, 1, 3, 300, 48, 3}, {37, 1, 2, 18, 10, 3}, {6, 1, 2, 32, 260, 4},
        {7, 2, 2, 24, 40, 1},  {9, 2, 4, 32, 16, 4},  {20, 1, 2, 200, 256, 4},
        {5, 1, 1, 16, 20, 5}};
    const float eps = 1e-6f;
    for (int s = 0; s < grid_n(NSHAPES(shapes), 6); s++) {
        const int T = shapes[s][0], Hk = shapes[s][1], Hv = shapes[s][2];
        const int dk = shapes[s][3], dv = shapes[s][4], K = shapes[s][5];
        const int C = 2 * Hk * dk + Hv * dv;
        const size_t nx = (size_t)T * C, ns = (size_t)C * (K - 1);
        const float qs = 1.0f / sqrtf((float)dk);
        const size_t ng = (size_t)T * Hv;
        float *x = frand(nx, 2.0), *w = frand((size_t)C * K, 1.0);
        float *st = frand(ns, 2.0), *ga = frand(ng, 3.0), *gb = frand(ng, 3.0);
        float *al = frand(Hv, 1.0), *db_ = frand(Hv, 1.0);
        qkv_dev_t d = qkv_dev(T, Hk, Hv, dk, dv, K, x, w, ga, gb, al, db_);
        float *dst[2] = {dev_from(st, ns), dev_from(st, ns)};
        RUN(hk_cuda_conv1d_silu(d.cv, dst[0], d.x, d.w, T, C, K, NULL));
        qkv_unfused(&d, eps, qs);
        RUN(hk_cuda_conv_qkv(d.q[1], d.k[1], d.v[1], dst[1], d.x, d.w, d.g[1],
                             d.beta[1], d.al, d.db, T, Hk, Hv, dk, dv, K, eps,
                             qs, NULL));
        float *hs = host_from(dst[0], ns);
        int good = qkv_same(&d) & same_cpu(hs, dst[1], ns, "state");
        ok(good,
           "conv_qkv = conv1d_silu, split_heads, l2norm, gdn_gates bit for "
           "bit T=%d Hk=%d Hv=%d dk=%d dv=%d K=%d",
           T, Hk, Hv, dk, dv, K);
        free(hs);
        qkv_free(&d);
        CK(hk_cuda_free(dst[0]));
        CK(hk_cuda_free(dst[1]));
        free(x);
        free(w);
        free(st);
        free(ga);
        free(gb);
        free(al);
        free(db_);
    }
}

/* B requests, one token each, every state in its own allocation (pool
 * slots), against hk_conv1d_silu with T = 1 per request. */
static void test_conv_decode(void)
{
    static const int shapes[][3] = {{1, 37, 4}, {3, 256, 4}, {8, 129, 2}};
    for (int s = 0; s < grid_n(NSHAPES(shapes), 2); s++) {
        const int B = shapes[s][0], C = shapes[s][1], K = shapes[s][2];
        const size_t ns = (size_t)C * (K - 1), nx = (size_t)B * C;
        float *x = frand(nx, 1.0), *w = frand((size_t)C * K, 1.0);
        float *y = hmalloc(nx), *st[8], *dst[8];
        for (int b = 0; b < B; b++) {
            st[b] = frand(ns, 1.0);
            dst[b] = dev_from(st[b], ns);
            hk_conv1d_silu(y + (size_t)b * C, st[b], x + (size_t)b * C, w, 1, C,
                           K);
        }
        void *dptrs = NULL;
        CK(hk_cuda_malloc(&dptrs, B * sizeof(float *)));
        CK(hk_cuda_h2d(dptrs, dst, B * sizeof(float *), NULL));
        float *dx = dev_from(x, nx), *dw = dev_from(w, (size_t)C * K);
        float *dy = dev_alloc(nx);
        RUN(hk_cuda_conv1d_silu_decode(dy, dptrs, dx, dw, B, C, K, NULL));
        int good = close_cpu(y, dy, nx, ATOL_CONV, RTOL_CONV, "y");
        for (int b = 0; b < B; b++) {
            good &= same_cpu(st[b], dst[b], ns, "state");
            CK(hk_cuda_free(dst[b]));
            free(st[b]);
        }
        ok(good, "conv1d_silu_decode B=%d C=%d K=%d", B, C, K);
        CK(hk_cuda_free(dptrs));
        CK(hk_cuda_free(dx));
        CK(hk_cuda_free(dw));
        CK(hk_cuda_free(dy));
        free(x);
        free(w);
        free(y);
    }
}

/* ---- rope ------------------------------------------------------------------
 */

static void test_rope(void)
{
    /* T, nh, hd, rot, first position; theta below. */
    static const int shapes[][5] = {{1, 1, 2, 2, 0},
                                    {5, 3, 64, 16, 7},
                                    {7, 2, 256, 64, 1},
                                    {3, 5, 33, 20, 500},
                                    {4, 16, 128, 128, 100000}};
    static const double thetas[] = {10000.0, 1e7};
    static const int deltas[] = {-37, 12345};
    for (int s = 0; s < grid_n(NSHAPES(shapes), 3); s++) {
        const int T = shapes[s][0], nh = shapes[s][1], hd = shapes[s][2];
        const int rot = shapes[s][3], p0 = shapes[s][4];
        const double theta = thetas[s % 2];
        const size_t n = (size_t)T * nh * hd;
        int pos[8];
        for (int t = 0; t < T; t++)
            pos[t] = p0 + 3 * t * t;
        float *x = frand(n, 1.0), *y = fdup(x, n);
        float *dx = dev_from(x, n);
        void *dpos = NULL;
        CK(hk_cuda_malloc(&dpos, (size_t)T * sizeof(int)));
        CK(hk_cuda_h2d(dpos, pos, (size_t)T * sizeof(int), NULL));
        hk_rope(y, pos, T, nh, hd, rot, theta);
        RUN(hk_cuda_rope(dx, dpos, T, nh, hd, rot, theta, NULL));
        ok(close_cpu(y, dx, n, ATOL_ROPE, RTOL_ROPE, "x"),
           "rope T=%d nh=%d hd=%d rot=%d pos0=%d", T, nh, hd, rot, p0);

        const int delta = deltas[s % 2];
        hk_rope_shift(y, delta, T, nh, hd, rot, theta);
        RUN(hk_cuda_rope_shift(dx, delta, T, nh, hd, rot, theta, NULL));
        ok(close_cpu(y, dx, n, ATOL_ROPE, RTOL_ROPE, "x"),
           "rope_shift T=%d nh=%d hd=%d rot=%d delta=%d", T, nh, hd, rot,
           delta);
        CK(hk_cuda_free(dx));
        CK(hk_cuda_free(dpos));
        free(x);
        free(y);
    }
}

/* ---- GDN -------------------------------------------------------------------
 */

/* The gates against hk_gdn_gates; a + dt_bias crosses the softplus
 * threshold of 20 in both directions. */
static void test_gdn_gates(void)
{
    static const int shapes[][2] = {{1, 1}, {7, 5}, {33, 32}};
    for (int s = 0; s < NSHAPES(shapes); s++) {
        const int T = shapes[s][0], Hv = shapes[s][1];
        const size_t n = (size_t)T * Hv;
        float *a = frand(n, 25.0), *b = frand(n, 8.0);
        float *Al = frand((size_t)Hv, 2.0), *dt = frand((size_t)Hv, 3.0);
        float *g = hmalloc(n), *be = hmalloc(n);
        hk_gdn_gates(g, be, a, b, Al, dt, T, Hv);
        float *da = dev_from(a, n), *db = dev_from(b, n);
        float *dAl = dev_from(Al, (size_t)Hv), *ddt = dev_from(dt, (size_t)Hv);
        /* in place, as the engine would: g over a, beta over b */
        RUN(hk_cuda_gdn_gates(da, db, da, db, dAl, ddt, T, Hv, NULL));
        int good = close_cpu(g, da, n, ATOL_EW, RTOL_EW, "g");
        good &= close_cpu(be, db, n, ATOL_EW, RTOL_EW, "beta");
        ok(good, "gdn_gates T=%d Hv=%d", T, Hv);
        CK(hk_cuda_free(da));
        CK(hk_cuda_free(db));
        CK(hk_cuda_free(dAl));
        CK(hk_cuda_free(ddt));
        free(a);
        free(b);
        free(Al);
        free(dt);
        free(g);
        free(be);
    }
}

typedef struct {
    int T, Hk, Hv, dk, dv;
    float *q, *k, *v, *g, *beta, *S0; // host
} gdn_prob_t;

/* Unit vector of dim n times scale, like the model's l2norm of q and k. */
static void unit_rand(float *x, int n, double scale)
{
    double ss = 0.0, t[HK_CUDA_GDN_MAX_DK];
    for (int i = 0; i < n; i++) {
        t[i] = nrand();
        ss += t[i] * t[i];
    }
    for (int i = 0; i < n; i++)
        x[i] = (float)(t[i] / sqrt(ss + 1e-6) * scale);
}

/* Inputs as the model makes them: unit k, q scaled by dk^-1/2, gates from
 * hk_math_gdn_gate with the HF initialisation ranges (A in [1, 16], dt in
 * [1e-3, 1e-1]), so decays span ~1 to ~e^-30 per token. */
static void gdn_prob_make(gdn_prob_t *p, int T, int Hk, int Hv, int dk, int dv)
{
    p->T = T, p->Hk = Hk, p->Hv = Hv, p->dk = dk, p->dv = dv;
    const size_t nq = (size_t)T * Hk * dk, nv = (size_t)T * Hv * dv;
    p->q = hmalloc(nq);
    p->k = hmalloc(nq);
    p->v = hmalloc(nv);
    p->g = hmalloc((size_t)T * Hv);
    p->beta = hmalloc((size_t)T * Hv);
    p->S0 = hmalloc((size_t)Hv * dk * dv);
    float A_log[64], dtb[64];
    for (int h = 0; h < Hv; h++) {
        const double A = 1.0 + 7.5 * (urand() + 1.0);
        const double dt = exp(log(1e-3) + 0.5 * (urand() + 1.0) * log(100.0));
        A_log[h] = (float)log(A);
        dtb[h] = (float)log(expm1(dt)); /* softplus^-1(dt) */
    }
    for (size_t r = 0; r < (size_t)T * Hk; r++) {
        unit_rand(p->q + r * dk, dk, 1.0 / sqrt((double)dk));
        unit_rand(p->k + r * dk, dk, 1.0);
    }
    for (size_t e = 0; e < nv; e++)
        p->v[e] = (float)nrand();
    for (size_t e = 0; e < (size_t)T * Hv; e++) {
        const int h = (int)(e % Hv);
        p->g[e] = hk_math_gdn_gate((float)(1.5 * nrand()), A_log[h], dtb[h]);
        p->beta[e] = hk_math_sigmoid((float)(2.0 * nrand()));
    }
    for (size_t e = 0; e < (size_t)Hv * dk * dv; e++)
        p->S0[e] = (float)(0.5 * nrand());
}

static void gdn_prob_free(gdn_prob_t *p)
{
    free(p->q);
    free(p->k);
    free(p->v);
    free(p->g);
    free(p->beta);
    free(p->S0);
}

typedef struct {
    float *q, *k, *v, *g, *beta; // device copies of the inputs
} gdn_dev_t;

static gdn_dev_t gdn_upload(const gdn_prob_t *p)
{
    const size_t nq = (size_t)p->T * p->Hk * p->dk;
    const size_t nv = (size_t)p->T * p->Hv * p->dv;
    gdn_dev_t d;
    d.q = dev_from(p->q, nq);
    d.k = dev_from(p->k, nq);
    d.v = dev_from(p->v, nv);
    d.g = dev_from(p->g, (size_t)p->T * p->Hv);
    d.beta = dev_from(p->beta, (size_t)p->T * p->Hv);
    return d;
}

static void gdn_dev_free(gdn_dev_t *d)
{
    CK(hk_cuda_free(d->q));
    CK(hk_cuda_free(d->k));
    CK(hk_cuda_free(d->v));
    CK(hk_cuda_free(d->g));
    CK(hk_cuda_free(d->beta));
}

/* T, Hk, Hv, dk, dv: dk around and past a warp, odd dv, GQA ratios. */
static const int gdn_shapes[][5] = {{1, 1, 1, 1, 1},    {5, 1, 2, 17, 9},
                                    {9, 2, 4, 32, 33},  {2, 1, 1, 256, 7},
                                    {3, 1, 1, 100, 40}, {4, 2, 2, 128, 128},
                                    {16, 2, 6, 64, 64}, {40, 1, 2, 48, 80}};
#define N_GDN ((int)(sizeof(gdn_shapes) / sizeof(gdn_shapes[0])))

static void test_gdn_recurrent(void)
{
    for (int s = 0; s < grid_n(N_GDN, 4); s++) {
        gdn_prob_t p;
        gdn_prob_make(&p, gdn_shapes[s][0], gdn_shapes[s][1], gdn_shapes[s][2],
                      gdn_shapes[s][3], gdn_shapes[s][4]);
        const size_t no = (size_t)p.T * p.Hv * p.dv;
        const size_t ns = (size_t)p.Hv * p.dk * p.dv;
        float *o = hmalloc(no), *S = fdup(p.S0, ns);
        hk_gdn_recurrent(o, S, p.q, p.k, p.v, p.g, p.beta, p.T, p.Hk, p.Hv,
                         p.dk, p.dv);
        gdn_dev_t d = gdn_upload(&p);
        float *dS = dev_from(p.S0, ns), *dO = dev_alloc(no);
        RUN(hk_cuda_gdn_recurrent(dO, dS, d.q, d.k, d.v, d.g, d.beta, p.T, p.Hk,
                                  p.Hv, p.dk, p.dv, NULL));
        int good = close_cpu(o, dO, no, ATOL_GDN, RTOL_GDN, "o");
        good &= close_cpu(S, dS, ns, ATOL_GDN, RTOL_GDN, "S");
        ok(good, "gdn_recurrent T=%d Hk=%d Hv=%d dk=%d dv=%d", p.T, p.Hk, p.Hv,
           p.dk, p.dv);
        gdn_dev_free(&d);
        CK(hk_cuda_free(dS));
        CK(hk_cuda_free(dO));
        free(o);
        free(S);
        gdn_prob_free(&p);
    }
}

/* B requests, one token each, states in separate allocations; the
 * reference runs hk_gdn_recurrent with T = 1 on each request. */
static void test_gdn_decode(void)
{
    static const int shapes[][5] = {
        {1, 1, 1, 16, 16}, {3, 2, 4, 64, 48}, {5, 1, 2, 128, 128}};
    for (int s = 0; s < grid_n(NSHAPES(shapes), 2); s++) {
        gdn_prob_t p; /* T plays B: row b is request b's token */
        gdn_prob_make(&p, shapes[s][0], shapes[s][1], shapes[s][2],
                      shapes[s][3], shapes[s][4]);
        const int B = p.T, Hk = p.Hk, Hv = p.Hv, dk = p.dk, dv = p.dv;
        const size_t ns = (size_t)Hv * dk * dv, no = (size_t)B * Hv * dv;
        float *o = hmalloc(no), *S[8], *dS[8];
        for (int b = 0; b < B; b++) {
            S[b] = hmalloc(ns);
            for (size_t e = 0; e < ns; e++)
                S[b][e] = (float)(0.5 * nrand());
            dS[b] = dev_from(S[b], ns);
            hk_gdn_recurrent(o + (size_t)b * Hv * dv, S[b],
                             p.q + (size_t)b * Hk * dk,
                             p.k + (size_t)b * Hk * dk,
                             p.v + (size_t)b * Hv * dv, p.g + (size_t)b * Hv,
                             p.beta + (size_t)b * Hv, 1, Hk, Hv, dk, dv);
        }
        void *dptrs = NULL;
        CK(hk_cuda_malloc(&dptrs, B * sizeof(float *)));
        CK(hk_cuda_h2d(dptrs, dS, B * sizeof(float *), NULL));
        gdn_dev_t d = gdn_upload(&p);
        float *dO = dev_alloc(no);
        RUN(hk_cuda_gdn_decode(dO, dptrs, d.q, d.k, d.v, d.g, d.beta, B, Hk, Hv,
                               dk, dv, NULL));
        int good = close_cpu(o, dO, no, ATOL_GDN, RTOL_GDN, "o");
        for (int b = 0; b < B; b++) {
            good &= close_cpu(S[b], dS[b], ns, ATOL_GDN, RTOL_GDN, "S");
            CK(hk_cuda_free(dS[b]));
            free(S[b]);
        }
        ok(good, "gdn_decode B=%d Hk=%d Hv=%d dk=%d dv=%d", B, Hk, Hv, dk, dv);
        CK(hk_cuda_free(dptrs));
        CK(hk_cuda_free(dO));
        gdn_dev_free(&d);
        free(o);
        gdn_prob_free(&p);
    }
}

static void test_gdn_chunk(void)
{
    /* T, Hk, Hv, dk, dv, C, want Tc: T = 0 (Tc = I), T < C, T a multiple
     * of C, a short last chunk, C = 1 and odd C, dk = 256. */
    static const int shapes[][7] = {
        {0, 1, 2, 16, 8, 16, 1},     {1, 1, 1, 16, 8, 64, 1},
        {9, 1, 1, 256, 33, 4, 1},    {6, 1, 1, 8, 5, 1, 1},
        {20, 1, 3, 20, 20, 7, 1},    {37, 1, 2, 32, 24, 16, 1},
        {130, 2, 2, 48, 17, 32, 0},  {64, 2, 4, 64, 64, 64, 1},
        {100, 1, 2, 128, 128, 64, 1}};
    for (int s = 0; s < grid_n(NSHAPES(shapes), 5); s++) {
        const int C = shapes[s][5], want_tc = shapes[s][6];
        gdn_prob_t p;
        gdn_prob_make(&p, shapes[s][0], shapes[s][1], shapes[s][2],
                      shapes[s][3], shapes[s][4]);
        const size_t no = (size_t)p.T * p.Hv * p.dv;
        const size_t ns = (size_t)p.Hv * p.dk * p.dv;
        const size_t nt = (size_t)p.Hv * p.dk * p.dk;
        float *o = hmalloc(no), *S = fdup(p.S0, ns);
        float *Tc = want_tc ? hmalloc(nt) : NULL;
        float *scr = hmalloc(hk_gdn_chunk_scratch(p.Hv, p.dk, p.dv, C));
        hk_gdn_chunk(o, S, Tc, p.q, p.k, p.v, p.g, p.beta, p.T, p.Hk, p.Hv,
                     p.dk, p.dv, C, scr);

        gdn_dev_t d = gdn_upload(&p);
        float *dS = dev_from(p.S0, ns), *dO = dev_alloc(no);
        float *dTc = want_tc ? dev_alloc(nt) : NULL;
        float *dscr =
            dev_alloc(hk_cuda_gdn_chunk_scratch(p.T, p.Hv, p.dk, p.dv, C));
        RUN(hk_cuda_gdn_chunk(dO, dS, dTc, d.q, d.k, d.v, d.g, d.beta, p.T,
                              p.Hk, p.Hv, p.dk, p.dv, C, dscr, NULL));
        int good = close_cpu(o, dO, no, ATOL_GDN, RTOL_GDN, "o");
        good &= close_cpu(S, dS, ns, ATOL_GDN, RTOL_GDN, "S");
        if (want_tc)
            good &= close_cpu(Tc, dTc, nt, ATOL_GDN, RTOL_GDN, "Tc");
        ok(good, "gdn_chunk T=%d Hk=%d Hv=%d dk=%d dv=%d C=%d%s", p.T, p.Hk,
           p.Hv, p.dk, p.dv, C, want_tc ? " +Tc" : "");
        gdn_dev_free(&d);
        CK(hk_cuda_free(dS));
        CK(hk_cuda_free(dO));
        CK(hk_cuda_free(dTc));
        CK(hk_cuda_free(dscr));
        free(o);
        free(S);
        free(Tc);
        free(scr);
        gdn_prob_free(&p);
    }
}

/* ---- transitions -----------------------------------------------------------
 */

static const int trans_shapes[][3] = {
    {1, 1, 1}, {3, 17, 9}, {4, 64, 128}, {2, 128, 128}};
#define N_TRANS ((int)(sizeof(trans_shapes) / sizeof(trans_shapes[0])))
static const char *const fam_names[] = {"scalar", "diag", "dense"};

/* T entries: near 1 for scalar/diag (decays), O(1/sqrt(dk)) for dense so
 * products stay O(1). */
static float *trans_rand(hk_trans_family_t fam, int H, int dk)
{
    const size_t n = (size_t)H * hk_trans_size(fam, dk);
    return frand(n, fam == HK_TRANS_DENSE ? 1.0 / sqrt((double)dk) : 1.0);
}

/* Alias modes of compose: 0 out separate with S0, 1 out = S, 2 out = S0,
 * 3 S0 = NULL. */
static const char *const compose_modes[] = {"out", "out=S", "out=S0",
                                            "S0=NULL"};

static void test_trans_compose(void)
{
    hk_cuda_blas_t *blas = NULL;
    CK(hk_cuda_blas_create(&blas));
    for (int f = 0; f < 3; f++) {
        const hk_trans_family_t fam = (hk_trans_family_t)f;
        for (int s = 0; s < grid_n(N_TRANS, 3); s++) {
            const int H = trans_shapes[s][0], dk = trans_shapes[s][1];
            const int dv = trans_shapes[s][2];
            const size_t ns = (size_t)H * dk * dv;
            const size_t nt = (size_t)H * hk_trans_size(fam, dk);
            float *T = trans_rand(fam, H, dk), *S = frand(ns, 1.0);
            float *S0 = frand(ns, 1.0), *out = hmalloc(ns);
            float *cscr = hmalloc((size_t)dk * dv);
            float *dT = dev_from(T, nt), *dscr = dev_alloc(ns);
            int good = 1;
            for (int m = 0; m < 4; m++) {
                float *dS = dev_from(S, ns), *dS0 = dev_from(S0, ns);
                float *dout = m == 1 ? dS : m == 2 ? dS0 : dev_alloc(ns);
                const float *s0 = m == 3 ? NULL : S0;
                hk_trans_compose(out, fam, T, S, s0, H, dk, dv, cscr);
                RUN(hk_cuda_trans_compose(dout, fam, dT, dS,
                                          m == 3 ? NULL : dS0, H, dk, dv, dscr,
                                          blas, NULL));
                good &= close_cpu(out, dout, ns, ATOL_TRANS, RTOL_TRANS,
                                  compose_modes[m]);
                if (m == 0 || m == 3)
                    CK(hk_cuda_free(dout));
                CK(hk_cuda_free(dS));
                CK(hk_cuda_free(dS0));
            }
            ok(good, "trans_compose %s H=%d dk=%d dv=%d (4 alias modes)",
               fam_names[f], H, dk, dv);
            CK(hk_cuda_free(dT));
            CK(hk_cuda_free(dscr));
            free(T);
            free(S);
            free(S0);
            free(out);
            free(cscr);
        }
    }
    hk_cuda_blas_destroy(blas);
}

static void test_trans_chain(void)
{
    hk_cuda_blas_t *blas = NULL;
    CK(hk_cuda_blas_create(&blas));
    for (int f = 0; f < 3; f++) {
        const hk_trans_family_t fam = (hk_trans_family_t)f;
        for (int s = 0; s < grid_n(N_TRANS, 3); s++) {
            const int H = trans_shapes[s][0], dk = trans_shapes[s][1];
            const int dv = trans_shapes[s][2];
            const size_t ns = (size_t)H * dk * dv;
            const size_t nt = (size_t)H * hk_trans_size(fam, dk);
            const size_t nscr = (size_t)dk * (dk > dv ? dk : dv);
            float *T1 = trans_rand(fam, H, dk), *T2 = trans_rand(fam, H, dk);
            float *S1 = frand(ns, 1.0), *S2 = frand(ns, 1.0);
            float *scr = hmalloc(nscr);
            float *dT1 = dev_from(T1, nt), *dT2 = dev_from(T2, nt);
            float *dS1 = dev_from(S1, ns), *dS2 = dev_from(S2, ns);
            float *dscr = dev_alloc((size_t)H * nscr);
            hk_trans_chain(T1, S1, fam, T2, S2, H, dk, dv, scr);
            RUN(hk_cuda_trans_chain(dT1, dS1, fam, dT2, dS2, H, dk, dv, dscr,
                                    blas, NULL));
            int good = close_cpu(T1, dT1, nt, ATOL_TRANS, RTOL_TRANS, "T");
            good &= close_cpu(S1, dS1, ns, ATOL_TRANS, RTOL_TRANS, "S");
            ok(good, "trans_chain %s H=%d dk=%d dv=%d", fam_names[f], H, dk,
               dv);
            CK(hk_cuda_free(dT1));
            CK(hk_cuda_free(dT2));
            CK(hk_cuda_free(dS1));
            CK(hk_cuda_free(dS2));
            CK(hk_cuda_free(dscr));
            free(T1);
            free(T2);
            free(S1);
            free(S2);
            free(scr);
        }
    }
    hk_cuda_blas_destroy(blas);
}

static void test_trans_rope_shift(void)
{
    /* H, dk, dv, rot, delta */
    static const int shapes[][5] = {{1, 2, 1, 2, 5},
                                    {3, 64, 33, 64, -1000},
                                    {2, 128, 128, 64, 100000},
                                    {2, 17, 300, 16, 7}};
    for (int s = 0; s < NSHAPES(shapes); s++) {
        const int H = shapes[s][0], dk = shapes[s][1], dv = shapes[s][2];
        const int rot = shapes[s][3], delta = shapes[s][4];
        const size_t ns = (size_t)H * dk * dv;
        float *S = frand(ns, 1.0);
        float *dS = dev_from(S, ns);
        hk_trans_rope_shift(S, delta, H, dk, dv, rot, 10000.0);
        RUN(hk_cuda_trans_rope_shift(dS, delta, H, dk, dv, rot, 10000.0, NULL));
        ok(close_cpu(S, dS, ns, ATOL_TROPE, RTOL_TROPE, "S"),
           "trans_rope_shift H=%d dk=%d dv=%d rot=%d delta=%d", H, dk, dv, rot,
           delta);
        CK(hk_cuda_free(dS));
        free(S);
    }
}

/* ---- projections -----------------------------------------------------------
 */

/* A device array of n device pointers. */
static void *dev_ptrs(float *const *h, int n)
{
    return dev_bytes(h, (size_t)n * sizeof(float *));
}

static int *dev_ints(const int *h, size_t n)
{
    return dev_bytes(h, n * sizeof(int));
}

/* A gated attention layer's prologue in one launch (hk_cuda_qk_norm_rope)
 * against its five kernels (split_heads, rmsnorm_zc of q and of k,
 * rope of both): q, gate and k bit for bit. Heads of 1, 2, 4 and 8
 * fragments a lane (hd 16 .. 1024), a dim not a multiple of 4 (element
 * by element), partial and whole rotations, more heads than the block's
 * 8 warps, no k heads. Its own RNG stream. */
static void test_qk_norm_rope(void)
{
    /* T, Hq, Hkv, hd, rot */
    static const int shapes[][5] = {{1, 1, 1, 16, 8},     {5, 8, 2, 256, 64},
                                    {3, 16, 4, 256, 64},  {4, 3, 1, 18, 10},
                                    {2, 4, 2, 512, 128},  {6, 9, 3, 128, 128},
                                    {3, 2, 1, 1024, 256}, {2, 2, 0, 64, 32}};
    const float eps = 1e-6f;
    const double theta = 1e7;
    const uint64_t rng0 = rng_state;
    rng_state ^= 0x6c8e9cf5u;
    for (int s = 0; s < grid_n(NSHAPES(shapes), 4); s++) {
        const int T = shapes[s][0], Hq = shapes[s][1], Hkv = shapes[s][2];
        const int hd = shapes[s][3], rot = shapes[s][4];
        const size_t nq = (size_t)T * Hq * hd, nk = (size_t)T * Hkv * hd;
        float *P = frand(2 * nq, 3.0), *k = frand(nk ? nk : 1, 3.0);
        float *qw = frand(hd, 0.5), *kw = frand(hd, 0.5);
        int pos[9];
        for (int t = 0; t < T; t++)
            pos[t] = 1000 * s + 37 * t + 3;
        float *dP = dev_from(P, 2 * nq), *dqw = dev_from(qw, hd);
        float *dkw = dev_from(kw, hd);
        int *dpos = dev_ints(pos, T);
        float *dq[2], *dg[2], *dk[2];
        for (int i = 0; i < 2; i++) {
            dq[i] = dev_alloc(nq);
            dg[i] = dev_alloc(nq);
            dk[i] = dev_from(k, nk ? nk : 1);
        }
        RUN(hk_cuda_split_heads(dq[0], dg[0], NULL, dP, T * Hq, hd, hd, 0,
                                NULL));
        RUN(hk_cuda_rmsnorm_zc(dq[0], dq[0], dqw, T * Hq, hd, eps, NULL));
        RUN(hk_cuda_rmsnorm_zc(dk[0], dk[0], dkw, T * Hkv, hd, eps, NULL));
        RUN(hk_cuda_rope(dq[0], dpos, T, Hq, hd, rot, theta, NULL));
        RUN(hk_cuda_rope(dk[0], dpos, T, Hkv, hd, rot, theta, NULL));
        RUN(hk_cuda_qk_norm_rope(dq[1], dg[1], dk[1], dP, dqw, dkw, dpos, T, Hq,
                                 Hkv, hd, rot, theta, eps, NULL));
        float *h[3] = {host_from(dq[0], nq), host_from(dg[0], nq),
                       host_from(dk[0], nk ? nk : 1)};
        int good = same_cpu(h[0], dq[1], nq, "q") &
                   same_cpu(h[1], dg[1], nq, "gate") &
                   same_cpu(h[2], dk[1], nk, "k");
        ok(good,
           "qk_norm_rope = split_heads, rmsnorm_zc, rope bit for bit T=%d "
           "Hq=%d Hkv=%d hd=%d rot=%d",
           T, Hq, Hkv, hd, rot);
        for (int i = 0; i < 3; i++)
            free(h[i]);
        for (int i = 0; i < 2; i++) {
            CK(hk_cuda_free(dq[i]));
            CK(hk_cuda_free(dg[i]));
            CK(hk_cuda_free(dk[i]));
        }
        CK(hk_cuda_free(dP));
        CK(hk_cuda_free(dqw));
        CK(hk_cuda_free(dkw));
        CK(hk_cuda_free(dpos));
        free(P);
        free(k);
        free(qw);
        free(kw);
    }
    rng_state = rng0;
}

/* A decode step's GDN input path in one launch (hk_cuda_conv_qkv_decode)
 * against its four kernels (conv1d_silu_decode, split, l2 norms, gates):
 * q, k, v, the gates and every request's state bit for bit, the states
 * in allocations of their own and listed out of order. The warp kernel
 * (heads of 1 and 2 chunks a lane, dims not a multiple of 4, K = 1 with
 * no states, B past a block's 4 warps), the block kernel (dk past 256,
 * K = 5). Its own RNG stream: later tests' inputs stay as they were. */
static void test_conv_qkv_decode(void)
{
    /* B, Hk, Hv, dk, dv, K */
    static const int shapes[][6] = {
        {1, 1, 1, 16, 16, 4},   {9, 2, 3, 32, 16, 4}, {5, 2, 2, 128, 128, 4},
        {3, 1, 2, 200, 256, 4}, {4, 2, 2, 18, 10, 3}, {6, 2, 2, 24, 40, 1},
        {3, 1, 3, 300, 48, 3},  {2, 1, 1, 16, 20, 5}};
    const float eps = 1e-6f;
    const uint64_t rng0 = rng_state;
    rng_state ^= 0x2545f491u;
    for (int s = 0; s < grid_n(NSHAPES(shapes), 6); s++) {
        const int B = shapes[s][0], Hk = shapes[s][1], Hv = shapes[s][2];
        const int dk = shapes[s][3], dv = shapes[s][4], K = shapes[s][5];
        const int C = 2 * Hk * dk + Hv * dv;
        const size_t ns = (size_t)C * (K - 1), ng = (size_t)B * Hv;
        const float qs = 1.0f / sqrtf((float)dk);
        float *x = frand((size_t)B * C, 2.0), *w = frand((size_t)C * K, 1.0);
        float *ga = frand(ng, 3.0), *gb = frand(ng, 3.0);
        float *al = frand(Hv, 1.0), *db_ = frand(Hv, 1.0);
        qkv_dev_t d = qkv_dev(B, Hk, Hv, dk, dv, K, x, w, ga, gb, al, db_);
        float *st[9], *dst[2][9];
        void *dptrs[2] = {NULL, NULL};
        for (int b = 0; b < B; b++)
            st[b] = frand(ns ? ns : 1, 2.0);
        for (int i = 0; i < 2; i++) {
            for (int b = B - 1; b >= 0; b--) /* allocated last to first */
                dst[i][b] = dev_from(st[b], ns ? ns : 1);
            dptrs[i] = K > 1 ? dev_ptrs(dst[i], B) : NULL;
        }
        if (K > 1)
            RUN(hk_cuda_conv1d_silu_decode(d.cv, dptrs[0], d.x, d.w, B, C, K,
                                           NULL));
        else /* no state: conv1d_silu over B rows is the same */
            RUN(hk_cuda_conv1d_silu(d.cv, NULL, d.x, d.w, B, C, K, NULL));
        qkv_unfused(&d, eps, qs);
        RUN(hk_cuda_conv_qkv_decode(d.q[1], d.k[1], d.v[1], dptrs[1], d.x, d.w,
                                    d.g[1], d.beta[1], d.al, d.db, B, Hk, Hv,
                                    dk, dv, K, eps, qs, NULL));
        int good = qkv_same(&d);
        for (int b = 0; b < B && ns; b++) {
            float *hs = host_from(dst[0][b], ns);
            good &= same_cpu(hs, dst[1][b], ns, "state");
            free(hs);
        }
        ok(good,
           "conv_qkv_decode = conv1d_silu_decode, split_heads, l2norm, "
           "gdn_gates bit for bit B=%d Hk=%d Hv=%d dk=%d dv=%d K=%d",
           B, Hk, Hv, dk, dv, K);
        qkv_free(&d);
        for (int i = 0; i < 2; i++) {
            for (int b = 0; b < B; b++)
                CK(hk_cuda_free(dst[i][b]));
            CK(hk_cuda_free(dptrs[i]));
        }
        for (int b = 0; b < B; b++)
            free(st[b]);
        free(x);
        free(w);
        free(ga);
        free(gb);
        free(al);
        free(db_);
    }
    rng_state = rng0;
}

/* Device ints must equal the CPU's. */
static int same_ints(const int *ref, const int *d, size_t n, const char *what)
{
    int *h = malloc((n ? n : 1) * sizeof(int));
    CK(hk_cuda_d2h(h, d, n * sizeof(int), NULL));
    const int same = n == 0 || memcmp(ref, h, n * sizeof(int)) == 0;
    free(h);
    if (!same)
        tap_diag("  %s: differs", what);
    return same;
}

static void test_matmul(void)
{
    /* n, in, out: a gemv (decode), odd sizes, in = 0 (empty sum). */
    static const int shapes[][3] = {{1, 1, 1},   {1, 64, 100},
                                    {5, 33, 17}, {17, 128, 257},
                                    {3, 0, 5},   {64, 512, 96}};
    hk_cuda_blas_t *blas = NULL;
    CK(hk_cuda_blas_create(&blas));
    for (int s = 0; s < grid_n(NSHAPES(shapes), 5); s++) {
        const int n = shapes[s][0], in = shapes[s][1], out = shapes[s][2];
        const size_t nx = (size_t)n * in, nw = (size_t)out * in;
        const size_t ny = (size_t)n * out;
        float *x = frand(nx, 1.0), *w = frand(nw, 1.0 / sqrt(in + 1.0));
        float *y0 = frand(ny, 1.0), *y = fdup(y0, ny);
        float *dx = dev_from(x, nx), *dw = dev_from(w, nw);
        float *dy = dev_alloc(ny);
        hk_matmul(y, x, w, n, in, out);
        RUN(hk_cuda_matmul(dy, dx, dw, n, in, out, blas, NULL));
        ok(close_cpu(y, dy, ny, ATOL_MM, RTOL_MM, "y"),
           "matmul n=%d in=%d out=%d", n, in, out);

        memcpy(y, y0, ny * sizeof(float));
        CK(hk_cuda_h2d(dy, y0, ny * sizeof(float), NULL));
        hk_matmul_acc(y, x, w, n, in, out);
        RUN(hk_cuda_matmul_acc(dy, dx, dw, n, in, out, blas, NULL));
        ok(close_cpu(y, dy, ny, ATOL_MM, RTOL_MM, "y"),
           "matmul_acc n=%d in=%d out=%d", n, in, out);

        /* bf16: the CPU twin is hk_matmul over bf16(x) and widened w. */
        uint16_t *wb = malloc((nw ? nw : 1) * sizeof(uint16_t));
        float *xr = hmalloc(nx), *wr = hmalloc(nw);
        for (size_t i = 0; i < nw; i++)
            wr[i] = hk_bf16_to_f32(wb[i] = hk_bf16_from_f32(w[i]));
        for (size_t i = 0; i < nx; i++)
            xr[i] = hk_bf16_to_f32(hk_bf16_from_f32(x[i]));
        void *dwb = NULL, *dxb = NULL;
        CK(hk_cuda_malloc(&dwb, (nw ? nw : 1) * sizeof(uint16_t)));
        CK(hk_cuda_h2d(dwb, wb, nw * sizeof(uint16_t), NULL));
        CK(hk_cuda_malloc(&dxb, (nx ? nx : 1) * sizeof(uint16_t)));
        int good = 1;
        for (int acc = 0; acc < 2; acc++) {
            memcpy(y, y0, ny * sizeof(float));
            CK(hk_cuda_h2d(dy, y0, ny * sizeof(float), NULL));
            (acc ? hk_matmul_acc : hk_matmul)(y, xr, wr, n, in, out);
            RUN(hk_cuda_matmul_bf16(dy, dx, dwb, n, in, out, acc, dxb, blas,
                                    NULL));
            good &= close_cpu(y, dy, ny, ATOL_MM, RTOL_MM, acc ? "y+=" : "y=");
        }
        /* x NULL: xb still holds x rounded (another matrix on the same
         * input): the y of rounding it again, bit for bit */
        RUN(hk_cuda_matmul_bf16(dy, dx, dwb, n, in, out, 0, dxb, blas, NULL));
        float *y1 = host_from(dy, ny);
        CK(hk_cuda_memset0(dy, ny * sizeof(float), NULL));
        RUN(hk_cuda_matmul_bf16(dy, NULL, dwb, n, in, out, 0, dxb, blas, NULL));
        good &= same_cpu(y1, dy, ny, "y from xb");
        free(y1);
        /* bf16 out: the f32 y rounded (cuBLAS may sum in another order for
         * another output type: a step apart on a device) */
        uint16_t *dyb = dev_alloc_u16(ny);
        RUN(hk_cuda_matmul_bf16_to_bf16(dyb, dx, dwb, n, in, out, dxb, blas,
                                        NULL));
        good &= near_rounded(dy, dyb, ny, 1, "y bf16");
        CK(hk_cuda_free(dyb));
        ok(good,
           "matmul_bf16 n=%d in=%d out=%d (= and +=; x rounded once; bf16 "
           "out)",
           n, in, out);
        CK(hk_cuda_free(dwb));
        CK(hk_cuda_free(dxb));
        CK(hk_cuda_free(dx));
        CK(hk_cuda_free(dw));
        CK(hk_cuda_free(dy));
        free(wb);
        free(xr);
        free(wr);
        free(x);
        free(w);
        free(y0);
        free(y);
    }
    hk_cuda_blas_destroy(blas);
}

/* The few-rows bf16 projection of several matrices of one input
 * (hk_cuda_gemv_bf16): each part against hk_matmul over the rounded x and
 * widened w, = and += (the matmul's tolerance: another order of the same
 * f32 sums); bf16 outputs the f32 ones rounded, within a step (a sum
 * near a rounding boundary); and against cuBLAS's (hk_cuda_matmul_bf16 of
 * each part, x NULL) at that tolerance. Shapes: in a multiple of 8 (16
 * bytes a lane) and not (2), one part and four (one empty), n 1..4. */
static void test_gemv(void)
{
    /* its own draws: the later tests' inputs stay what they were (some
     * tolerances there were set on those draws) */
    const uint64_t rng0 = rng_state;
    rng_state ^= 0x5bd1e995u;
    static const int shapes[][6] = {
        /* n, in, k, out_0.. */
        {1, 64, 1, 100, 0, 0}, {2, 33, 2, 17, 40, 0},   {3, 256, 4, 8, 0, 29},
        {4, 24, 3, 9, 1, 70},  {4, 1024, 2, 96, 33, 0}, {1, 7, 4, 3, 5, 2}};
    hk_cuda_blas_t *blas = NULL;
    CK(hk_cuda_blas_create(&blas));
    for (int s = 0; s < grid_n(NSHAPES(shapes), 4); s++) {
        const int n = shapes[s][0], in = shapes[s][1], k = shapes[s][2];
        int out[4] = {shapes[s][3], shapes[s][4], shapes[s][5], 11};
        const size_t nx = (size_t)n * in;
        float *x = frand(nx, 1.0), *xr = hmalloc(nx);
        uint16_t *xb = malloc((nx ? nx : 1) * sizeof(uint16_t));
        for (size_t i = 0; i < nx; i++)
            xr[i] = hk_bf16_to_f32(xb[i] = hk_bf16_from_f32(x[i]));
        uint16_t *dxb = dev_alloc_u16(nx);
        CK(hk_cuda_h2d(dxb, xb, nx * sizeof(uint16_t), NULL));
        hk_cuda_gemv_t p = {0}, pb = {0};
        float *wr[4] = {0}, *y0[4] = {0}, *y[4] = {0}, *dy[4] = {0};
        uint16_t *dw[4] = {0}, *dyb[4] = {0};
        for (int i = 0; i < k; i++) {
            const size_t nw = (size_t)out[i] * in, ny = (size_t)n * out[i];
            float *w = frand(nw, 1.0 / sqrt(in + 1.0));
            uint16_t *wb = malloc((nw ? nw : 1) * sizeof(uint16_t));
            wr[i] = hmalloc(nw);
            for (size_t j = 0; j < nw; j++)
                wr[i][j] = hk_bf16_to_f32(wb[j] = hk_bf16_from_f32(w[j]));
            dw[i] = dev_alloc_u16(nw);
            CK(hk_cuda_h2d(dw[i], wb, nw * sizeof(uint16_t), NULL));
            y0[i] = frand(ny, 1.0);
            y[i] = hmalloc(ny);
            dy[i] = dev_alloc(ny);
            dyb[i] = dev_alloc_u16(ny);
            p.y[i] = dy[i];
            pb.y[i] = dyb[i];
            p.w[i] = pb.w[i] = dw[i];
            p.out[i] = pb.out[i] = out[i];
            free(w);
            free(wb);
        }
        int good = 1;
        for (int acc = 0; acc < 2; acc++) {
            for (int i = 0; i < k; i++) {
                const size_t ny = (size_t)n * out[i];
                memcpy(y[i], y0[i], ny * sizeof(float));
                CK(hk_cuda_h2d(dy[i], y0[i], ny * sizeof(float), NULL));
                (acc ? hk_matmul_acc : hk_matmul)(y[i], xr, wr[i], n, in,
                                                  out[i]);
            }
            RUN(hk_cuda_gemv_bf16(&p, k, dxb, n, in, acc, 0, NULL));
            for (int i = 0; i < k; i++)
                good &= close_cpu(y[i], dy[i], (size_t)n * out[i], ATOL_MM,
                                  RTOL_MM, acc ? "y+=" : "y=");
        }
        RUN(hk_cuda_gemv_bf16(&p, k, dxb, n, in, 0, 0, NULL));
        RUN(hk_cuda_gemv_bf16(&pb, k, dxb, n, in, 0, 1, NULL));
        for (int i = 0; i < k; i++) {
            const size_t ny = (size_t)n * out[i];
            good &= near_rounded(dy[i], dyb[i], ny, 1, "y bf16");
            /* cuBLAS's products of the same operands */
            float *g = host_from(dy[i], ny);
            RUN(hk_cuda_matmul_bf16(dy[i], NULL, dw[i], n, in, out[i], 0, dxb,
                                    blas, NULL));
            good &= close_cpu(g, dy[i], ny, ATOL_MM, RTOL_MM, "vs cuBLAS");
            free(g);
        }
        ok(good,
           "gemv_bf16 n=%d in=%d parts %d (%d, %d, %d): = and +=, bf16 out, "
           "as cuBLAS's",
           n, in, k, out[0], k > 1 ? out[1] : 0, k > 2 ? out[2] : 0);
        for (int i = 0; i < k; i++) {
            CK(hk_cuda_free(dw[i]));
            CK(hk_cuda_free(dy[i]));
            CK(hk_cuda_free(dyb[i]));
            free(wr[i]);
            free(y0[i]);
            free(y[i]);
        }
        CK(hk_cuda_free(dxb));
        free(x);
        free(xr);
        free(xb);
    }
    /* what it refuses: more rows or parts than it keeps, bf16 and += */
    hk_cuda_gemv_t p = {{NULL}, {NULL}, {0}};
    float one = 0.0f;
    uint16_t w1 = 0;
    p.y[0] = &one;
    p.w[0] = &w1;
    p.out[0] = 1;
    int good = hk_cuda_gemv_bf16(&p, 1, &w1, HK_CUDA_GEMV_ROWS + 1, 1, 0, 0,
                                 NULL) == HK_CUDA_EINVAL;
    good &= hk_cuda_gemv_bf16(&p, HK_CUDA_GEMV_PARTS + 1, &w1, 1, 1, 0, 0,
                              NULL) == HK_CUDA_EINVAL;
    good &= hk_cuda_gemv_bf16(&p, 1, &w1, 1, 1, 1, 1, NULL) == HK_CUDA_EINVAL;
    good &= hk_cuda_gemv_bf16(&p, 0, &w1, 1, 1, 0, 0, NULL) == HK_CUDA_EINVAL;
    ok(good, "gemv_bf16: too many rows or parts, bf16 with +=, no parts: "
             "HK_CUDA_EINVAL");
    hk_cuda_blas_destroy(blas);
    rng_state = rng0;
}

/* x rounded to bf16 in place; the bit patterns in a new array. */
static uint16_t *round_bf16(float *x, size_t n)
{
    uint16_t *b = hbytes(n * sizeof(uint16_t));
    for (size_t i = 0; i < n; i++)
        x[i] = hk_bf16_to_f32(b[i] = hk_bf16_from_f32(x[i]));
    return b;
}

static uint16_t *dev_u16(const uint16_t *h, size_t n)
{
    return dev_bytes(h, n * sizeof(uint16_t));
}

/* The gated MLP's first half in one launch (hk_cuda_gemv_bf16_swiglu)
 * against the GEMV's bf16 g and u and hk_cuda_swiglu_bf16_in: h bit for
 * bit, at 1-4 rows, both load widths, rows past a block's 8 warps; and
 * what it refuses. Its own RNG stream. */
static void test_gemv_swiglu(void)
{
    const uint64_t rng0 = rng_state;
    rng_state ^= 0x1b873593u;
    /* n, in, out */
    static const int shapes[][3] = {
        {1, 64, 37}, {2, 30, 9}, {3, 256, 100}, {4, 1024, 17}, {4, 8, 1}};
    for (int s = 0; s < grid_n(NSHAPES(shapes), 3); s++) {
        const int n = shapes[s][0], in = shapes[s][1], out = shapes[s][2];
        const size_t nx = (size_t)n * in, nw = (size_t)out * in;
        const size_t nh = (size_t)n * out;
        float *x = frand(nx, 1.0), *wg = frand(nw, 3.0 / sqrt(in + 1.0));
        float *wu = frand(nw, 1.0 / sqrt(in + 1.0));
        uint16_t *xb = round_bf16(x, nx), *gb = round_bf16(wg, nw);
        uint16_t *ub = round_bf16(wu, nw);
        uint16_t *dx = dev_u16(xb, nx), *dg = dev_u16(gb, nw);
        uint16_t *du = dev_u16(ub, nw);
        uint16_t *dyg = dev_alloc_u16(nh), *dyu = dev_alloc_u16(nh);
        uint16_t *dh = dev_alloc_u16(nh);
        hk_cuda_gemv_t p = {{dyg, dyu}, {dg, du}, {out, out}};
        RUN(hk_cuda_gemv_bf16(&p, 2, dx, n, in, 0, 1, NULL));
        RUN(hk_cuda_swiglu_bf16_in(dyg, dyg, dyu, nh, NULL));
        RUN(hk_cuda_gemv_bf16_swiglu(dh, dg, du, out, dx, n, in, NULL));
        uint16_t *h[2] = {malloc(nh * sizeof(uint16_t)),
                          malloc(nh * sizeof(uint16_t))};
        CK(hk_cuda_d2h(h[0], dyg, nh * sizeof(uint16_t), NULL));
        CK(hk_cuda_d2h(h[1], dh, nh * sizeof(uint16_t), NULL));
        int nz = 0;
        for (size_t i = 0; i < nh; i++)
            nz += h[0][i] != 0;
        ok(!memcmp(h[0], h[1], nh * sizeof(uint16_t)) && nz > 0,
           "gemv_bf16_swiglu = gemv_bf16 (bf16 g, u) and swiglu_bf16_in bit "
           "for bit n=%d in=%d out=%d",
           n, in, out);
        free(h[0]);
        free(h[1]);
        uint16_t *dd[6] = {dx, dg, du, dyg, dyu, dh};
        for (int i = 0; i < 6; i++)
            CK(hk_cuda_free(dd[i]));
        free(x);
        free(wg);
        free(wu);
        free(xb);
        free(gb);
        free(ub);
    }
    uint16_t w1 = 0, h1 = 0;
    ok(hk_cuda_gemv_bf16_swiglu(&h1, &w1, &w1, 1, &w1, HK_CUDA_GEMV_ROWS + 1, 1,
                                NULL) == HK_CUDA_EINVAL &&
           hk_cuda_gemv_bf16_swiglu(&h1, NULL, &w1, 1, &w1, 1, 1, NULL) ==
               HK_CUDA_EINVAL,
       "gemv_bf16_swiglu: too many rows, no matrix: HK_CUDA_EINVAL");
    rng_state = rng0;
}

/* I8 weights (an int8 checkpoint's projections): the CPU twin is hk_linear
 * on its dequantizing path (the ISA capped at AVX2: AVX-512 VNNI rounds x
 * to 8 bits). Products of x and q * scale in f32 on both sides: the
 * matmul's tolerance. Shapes: n 1..8 take the direct kernel, more the f32
 * tiles (a scratch of 50 rows in the last one: six tiles and a short
 * one); groups of 16, 64 and one per row. */
static void test_linear_i8(void)
{
    static const int shapes[][5] = {
        /* n, in, out, group, scratch rows (0: the whole weight) */
        {1, 64, 100, 16, 0},
        {8, 128, 33, 64, 0},
        {3, 48, 7, 48, 0},
        {9, 128, 257, 64, 0},
        {17, 192, 300, 64, 50}};
    hk_cuda_blas_t *blas = NULL;
    CK(hk_cuda_blas_create(&blas));
    hk_cpu_set_isa(HK_ISA_AVX2);
    for (int s = 0; s < grid_n(NSHAPES(shapes), 4); s++) {
        const int n = shapes[s][0], in = shapes[s][1], out = shapes[s][2],
                  G = shapes[s][3];
        const size_t nx = (size_t)n * in, nw = (size_t)out * in;
        const size_t ny = (size_t)n * out, ns = nw / G;
        const size_t tile = (size_t)(shapes[s][4] ? shapes[s][4] : out) * in;
        float *x = frand(nx, 1.0), *y0 = frand(ny, 1.0), *y = fdup(y0, ny);
        float *sc = frand(ns, 0.5 / (127.0 * sqrt((double)in)));
        int8_t *q = hbytes(nw);
        for (size_t i = 0; i < nw; i++)
            q[i] = (int8_t)(int)(127.0 * urand());
        for (size_t i = 0; i < ns; i++)
            sc[i] = fabsf(sc[i]) + 1e-4f;
        void *dq = NULL;
        CK(hk_cuda_malloc(&dq, nw));
        CK(hk_cuda_h2d(dq, q, nw, NULL));
        float *dx = dev_from(x, nx), *dsc = dev_from(sc, ns);
        float *dy = dev_alloc(ny), *dtile = dev_alloc(tile);
        const hk_weight_t w = {q, sc, HK_W_I8, out, in, G};
        hk_weight_t dw = w;
        dw.data = dq;
        dw.scales = dsc;
        int good = 1;
        for (int acc = 0; acc < 2; acc++) {
            memcpy(y, y0, ny * sizeof(float));
            CK(hk_cuda_h2d(dy, y0, ny * sizeof(float), NULL));
            (acc ? hk_linear_acc : hk_linear)(y, x, &w, n);
            RUN(hk_cuda_linear_i8(dy, dx, &dw, n, acc, dtile, tile, blas,
                                  NULL));
            good &= close_cpu(y, dy, ny, ATOL_MM, RTOL_MM, acc ? "y+=" : "y=");
        }
        ok(good, "linear_i8 n=%d in=%d out=%d group %d (%s; = and +=)", n, in,
           out, G, n <= HK_CUDA_I8_DIRECT ? "direct" : "f32 tiles");
        CK(hk_cuda_free(dq));
        CK(hk_cuda_free(dx));
        CK(hk_cuda_free(dsc));
        CK(hk_cuda_free(dy));
        CK(hk_cuda_free(dtile));
        free(x);
        free(y0);
        free(y);
        free(sc);
        free(q);
    }
    hk_cpu_set_isa(HK_ISA_AVX512);
    hk_cuda_blas_destroy(blas);
}

/* ---- elementwise and data movement -----------------------------------------
 */

static void test_split_heads(void)
{
    /* rows, da, db, dc: attention's [q | gate] per head (rows = T*Hq), the
     * GDN conv output [q | k | v] (rows = T). */
    static const int shapes[][4] = {
        {1, 1, 1, 0}, {21, 64, 64, 0}, {5, 48, 48, 80}, {48, 256, 256, 0}};
    for (int s = 0; s < grid_n(NSHAPES(shapes), 3); s++) {
        const int rows = shapes[s][0], da = shapes[s][1], db = shapes[s][2];
        const int dc = shapes[s][3];
        const size_t nx = (size_t)rows * (da + db + dc);
        const size_t na = (size_t)rows * da, nb = (size_t)rows * db;
        const size_t nc = (size_t)rows * dc;
        float *x = frand(nx, 1.0), *a = hmalloc(na), *b = hmalloc(nb);
        float *c = dc ? hmalloc(nc) : NULL;
        float *dx = dev_from(x, nx), *da_ = dev_alloc(na), *db_ = dev_alloc(nb);
        float *dc_ = dc ? dev_alloc(nc) : NULL;
        hk_split_heads(a, b, c, x, rows, da, db, dc);
        RUN(hk_cuda_split_heads(da_, db_, dc_, dx, rows, da, db, dc, NULL));
        int good = same_cpu(a, da_, na, "a") & same_cpu(b, db_, nb, "b");
        if (dc)
            good &= same_cpu(c, dc_, nc, "c");
        ok(good, "split_heads rows=%d da=%d db=%d dc=%d", rows, da, db, dc);
        CK(hk_cuda_free(dx));
        CK(hk_cuda_free(da_));
        CK(hk_cuda_free(db_));
        CK(hk_cuda_free(dc_));
        free(x);
        free(a);
        free(b);
        free(c);
    }
}

static void test_gate_scale(void)
{
    static const int shapes[][2] = {{1, 1}, {7, 33}, {40, 1024}};
    for (int s = 0; s < grid_n(NSHAPES(shapes), 2); s++) {
        const int rows = shapes[s][0], dim = shapes[s][1];
        const size_t n = (size_t)rows * dim;
        float *o = frand(n, 2.0), *gt = frand(n, 12.0), *sc = frand(rows, 3.0);
        float *y = fdup(o, n);
        float *dgt = dev_from(gt, n), *dsc = dev_from(sc, rows);
        float *dy = dev_from(o, n);
        uint16_t *db = dev_alloc_u16(n);
        hk_gate_mul(y, gt, n);
        /* bf16 out first: o kept, then the product in place */
        RUN(hk_cuda_gate_mul_bf16(db, dy, dgt, n, NULL));
        RUN(hk_cuda_gate_mul(dy, dgt, n, NULL));
        ok(close_cpu(y, dy, n, ATOL_EW, RTOL_EW, "o") &&
               same_rounded(dy, db, n, "o bf16"),
           "gate_mul n=%zu (bf16 out)", n);
        CK(hk_cuda_free(db));
        memcpy(y, o, n * sizeof(float));
        CK(hk_cuda_h2d(dy, o, n * sizeof(float), NULL));
        hk_axpy(y, -0.75f, gt, n);
        RUN(hk_cuda_axpy(dy, -0.75f, dgt, n, NULL));
        ok(close_cpu(y, dy, n, ATOL_EW, RTOL_EW, "y"), "axpy n=%zu", n);
        int good = 1;
        for (int sigm = 0; sigm < 2; sigm++) {
            memcpy(y, o, n * sizeof(float));
            CK(hk_cuda_h2d(dy, o, n * sizeof(float), NULL));
            hk_scale_rows(y, sc, rows, dim, sigm);
            RUN(hk_cuda_scale_rows(dy, dsc, rows, dim, sigm, NULL));
            good &= close_cpu(y, dy, n, ATOL_EW, RTOL_EW, "x");
        }
        ok(good, "scale_rows rows=%d dim=%d (plain and sigmoid)", rows, dim);
        CK(hk_cuda_free(dgt));
        CK(hk_cuda_free(dsc));
        CK(hk_cuda_free(dy));
        free(o);
        free(gt);
        free(sc);
        free(y);
    }
}

/* A block table [B, maxp] over npages pages: request b's first
 * ceil(n[b] / P) entries are distinct pages in a shuffled order; the
 * others (never to be read) name the page returned, which nobody owns. */
static int page_table(int *table, const int *n, int B, int P, int maxp,
                      int npages)
{
    int *perm = hbytes((size_t)npages * sizeof(int));
    for (int i = 0; i < npages; i++)
        perm[i] = i;
    for (int i = npages - 1; i > 0; i--) {
        const int j = (int)(0.5 * (urand() + 1.0) * (i + 1)), t = perm[i];
        perm[i] = perm[j], perm[j] = t;
    }
    int used = 0;
    for (int b = 0; b < B; b++)
        for (int i = 0; i < maxp; i++)
            table[b * maxp + i] = i < (n[b] + P - 1) / P ? perm[used++] : -1;
    const int spare = perm[used];
    for (int i = 0; i < B * maxp; i++)
        table[i] = table[i] < 0 ? spare : table[i];
    free(perm);
    return spare;
}

/* Pages for n[b] positions of B requests, plus two nobody owns. */
static int pages_for(const int *n, int B, int P, int *maxp)
{
    int total = 2;
    *maxp = 1;
    for (int b = 0; b < B; b++) {
        const int np = (n[b] + P - 1) / P;
        total += np;
        *maxp = np > *maxp ? np : *maxp;
    }
    return total;
}

/* Cache rows by position: prefill rows at scattered positions (a PIC
 * splice writes recomputed rows between reused ones), then one decode
 * row per request into separate caches; untouched rows must stay. */
static void test_kv_store(void)
{
    static const int shapes[][3] = {{1, 1, 1}, {5, 40, 64}, {9, 300, 512}};
    for (int s = 0; s < grid_n(NSHAPES(shapes), 2); s++) {
        const int T = shapes[s][0], N = shapes[s][1], kvd = shapes[s][2];
        const size_t nc = (size_t)N * kvd, nr = (size_t)T * kvd;
        int pos[16];
        for (int t = 0; t < T; t++)
            pos[t] = (7 * t + 3) % N; /* distinct: T <= N, 7 coprime to N */
        float *kc = frand(nc, 1.0), *vc = frand(nc, 1.0);
        float *k = frand(nr, 1.0), *v = frand(nr, 1.0);
        float *dkc = dev_from(kc, nc), *dvc = dev_from(vc, nc);
        float *dk = dev_from(k, nr), *dv = dev_from(v, nr);
        int *dpos = dev_ints(pos, T);
        hk_kv_store(kc, vc, k, v, pos, T, kvd);
        RUN(hk_cuda_kv_store(dkc, dvc, dk, dv, dpos, T, kvd, NULL));
        ok(same_cpu(kc, dkc, nc, "k cache") & same_cpu(vc, dvc, nc, "v cache"),
           "kv_store T=%d N=%d kvd=%d", T, N, kvd);

        /* decode: request b gets row b at position pos[b] of its cache */
        float *kcs[16], *vcs[16], *dkcs[16], *dvcs[16];
        for (int b = 0; b < T; b++) {
            kcs[b] = frand(nc, 1.0);
            vcs[b] = frand(nc, 1.0);
            dkcs[b] = dev_from(kcs[b], nc);
            dvcs[b] = dev_from(vcs[b], nc);
            hk_kv_store(kcs[b], vcs[b], k + (size_t)b * kvd,
                        v + (size_t)b * kvd, pos + b, 1, kvd);
        }
        void *dpk = NULL, *dpv = NULL;
        CK(hk_cuda_malloc(&dpk, T * sizeof(float *)));
        CK(hk_cuda_malloc(&dpv, T * sizeof(float *)));
        CK(hk_cuda_h2d(dpk, dkcs, T * sizeof(float *), NULL));
        CK(hk_cuda_h2d(dpv, dvcs, T * sizeof(float *), NULL));
        RUN(hk_cuda_kv_store_decode(dpk, dpv, dk, dv, dpos, T, kvd, NULL));
        int good = 1;
        for (int b = 0; b < T; b++) {
            good &= same_cpu(kcs[b], dkcs[b], nc, "k cache");
            good &= same_cpu(vcs[b], dvcs[b], nc, "v cache");
            CK(hk_cuda_free(dkcs[b]));
            CK(hk_cuda_free(dvcs[b]));
            free(kcs[b]);
            free(vcs[b]);
        }
        ok(good, "kv_store_decode B=%d N=%d kvd=%d", T, N, kvd);
        CK(hk_cuda_free(dpk));
        CK(hk_cuda_free(dpv));

        /* paged: request b's row to position pos[b] of its pages (P = 4
         * and 16), the rest of the arena unchanged */
        for (int P = 4; P <= 16; P *= 4) {
            int lens[16], maxp = 0;
            for (int b = 0; b < T; b++)
                lens[b] = pos[b] + 1 + b % 3; /* the new row is not last */
            const int npages = pages_for(lens, T, P, &maxp);
            int *table = hbytes((size_t)T * maxp * sizeof(int));
            page_table(table, lens, T, P, maxp, npages);
            const size_t na = (size_t)npages * P * kvd;
            float *kp = frand(na, 1.0), *vp = frand(na, 1.0);
            float *dkp = dev_from(kp, na), *dvp = dev_from(vp, na);
            int *dtab = dev_ints(table, (size_t)T * maxp);
            hk_kv_store_paged(kp, vp, k, v, table, maxp, pos, T, P, kvd);
            RUN(hk_cuda_kv_store_paged(dkp, dvp, dk, dv, dtab, maxp, dpos, T, P,
                                       kvd, NULL));
            ok(same_cpu(kp, dkp, na, "k pages") &
                   same_cpu(vp, dvp, na, "v pages"),
               "kv_store_paged B=%d P=%d pages=%d kvd=%d", T, P, npages, kvd);
            CK(hk_cuda_free(dkp));
            CK(hk_cuda_free(dvp));
            CK(hk_cuda_free(dtab));
            free(kp);
            free(vp);
            free(table);
        }
        CK(hk_cuda_free(dkc));
        CK(hk_cuda_free(dvc));
        CK(hk_cuda_free(dk));
        CK(hk_cuda_free(dv));
        CK(hk_cuda_free(dpos));
        free(kc);
        free(vc);
        free(k);
        free(v);
    }
}

static void test_embed(void)
{
    static const int shapes[][3] = {{1, 1, 1}, {6, 50, 64}, {33, 1000, 257}};
    for (int s = 0; s < grid_n(NSHAPES(shapes), 2); s++) {
        const int T = shapes[s][0], V = shapes[s][1], H = shapes[s][2];
        int ids[64];
        for (int t = 0; t < T; t++)
            ids[t] = (int)((urand() + 1.0) * 0.5 * V) % V;
        if (T > 1)
            ids[T - 1] = ids[0]; /* a repeated token */
        float *table = frand((size_t)V * H, 1.0), *x = hmalloc((size_t)T * H);
        float *dt = dev_from(table, (size_t)V * H);
        float *dx = dev_alloc((size_t)T * H);
        int *dids = dev_ints(ids, T);
        hk_embed(x, table, ids, T, H);
        RUN(hk_cuda_embed(dx, dt, dids, T, H, NULL));
        ok(same_cpu(x, dx, (size_t)T * H, "x"), "embed T=%d V=%d H=%d", T, V,
           H);

        /* The BF16 and I8 tables of a checkpoint: the CPU's hk_weight_rows
         * (bf16 widened exactly, I8 q * scale with several groups per row
         * where H allows). */
        const size_t nt = (size_t)V * H;
        const int G = H % 16 == 0 ? 16 : H;
        uint16_t *tb = hbytes(nt * sizeof(uint16_t));
        int8_t *tq = hbytes(nt);
        float *sc = frand((size_t)V * (H / G), 0.05);
        for (size_t i = 0; i < nt; i++) {
            tb[i] = hk_bf16_from_f32(table[i]);
            tq[i] = (int8_t)(int)(127.0 * table[i]);
        }
        void *dtb = NULL, *dtq = NULL;
        CK(hk_cuda_malloc(&dtb, nt * sizeof(uint16_t)));
        CK(hk_cuda_h2d(dtb, tb, nt * sizeof(uint16_t), NULL));
        CK(hk_cuda_malloc(&dtq, nt ? nt : 1));
        CK(hk_cuda_h2d(dtq, tq, nt, NULL));
        float *dsc = dev_from(sc, (size_t)V * (H / G));
        const hk_weight_t wb = {tb, NULL, HK_W_BF16, V, H, 0},
                          wq = {tq, sc, HK_W_I8, V, H, G};
        hk_weight_t dwb = wb, dwq = wq;
        dwb.data = dtb;
        dwq.data = dtq;
        dwq.scales = dsc;
        hk_weight_rows(x, &wb, ids, T);
        RUN(hk_cuda_weight_rows(dx, &dwb, dids, T, NULL));
        int good = same_cpu(x, dx, (size_t)T * H, "x bf16");
        hk_weight_rows(x, &wq, ids, T);
        RUN(hk_cuda_weight_rows(dx, &dwq, dids, T, NULL));
        good &= same_cpu(x, dx, (size_t)T * H, "x i8");
        ok(good, "weight_rows bf16, i8 (group %d) T=%d V=%d H=%d", G, T, V, H);
        CK(hk_cuda_free(dtb));
        CK(hk_cuda_free(dtq));
        CK(hk_cuda_free(dsc));
        free(tb);
        free(tq);
        free(sc);
        CK(hk_cuda_free(dt));
        CK(hk_cuda_free(dx));
        CK(hk_cuda_free(dids));
        free(table);
        free(x);
    }
}

/* The staging ring: id lists put one after another (the ring wraps many
 * times, no host wait in between) each read by a gather issued after its
 * put, and again by a second gather issued after the later puts, at the
 * oldest put the ring's mark says is still held (hk_cuda_ring_mark). On
 * a device, a segment reused before its copies ran would show as rows of
 * another round's ids; on either, a mark that held a put too long would
 * show in the second gathers. */
static void test_ring(void)
{
    enum { N = 100, ROUNDS = 64, V = 97, H = 8 };
    float *table = frand((size_t)V * H, 1.0);
    float *x = hmalloc((size_t)ROUNDS * N * H), *y = hmalloc((size_t)N * H);
    float *x2 = hmalloc((size_t)ROUNDS * N * H);
    float *dt = dev_from(table, (size_t)V * H);
    float *dx = dev_alloc((size_t)ROUNDS * N * H);
    float *dx2 = dev_alloc((size_t)ROUNDS * N * H);
    hk_cuda_ring_t *r = NULL;
    int ids[N], good = 1, good2 = 1, rc = hk_cuda_ring_create(&r, 1024);
    ok(rc == HK_CUDA_OK && hk_cuda_ring_seg_bytes(r) == 1024 &&
           hk_cuda_ring_mark(r) == 0,
       "ring: 4 segments of 1024 bytes, none entered yet");
    void *d = NULL;
    ok(r && hk_cuda_ring_put(r, ids, 1025, NULL, &d) == HK_CUDA_EINVAL && !d,
       "ring: a put larger than a segment is refused");
    unsigned long w0 = hk_cuda_sync_count();
    char *at[ROUNDS];
    uint64_t mark[ROUNDS];
    int apart = 1; /* no put overlaps the five before it (3 segments) */
    int back[ROUNDS];
    for (int i = 0; r && i < ROUNDS; i++) {
        for (int t = 0; t < N; t++)
            ids[t] = (i * 31 + t * 7) % V;
        CK(hk_cuda_ring_put(r, ids, sizeof(ids), NULL, &d));
        at[i] = d;
        mark[i] = hk_cuda_ring_mark(r);
        for (int j = i - 5 > 0 ? i - 5 : 0; j < i; j++)
            apart &=
                at[j] + sizeof(ids) <= at[i] || at[i] + sizeof(ids) <= at[j];
        CK(hk_cuda_embed(dx + (size_t)i * N * H, dt, d, N, H, NULL));
        int j = 0;
        while (mark[j] + HK_CUDA_RING_SEGS <= mark[i])
            j++;
        back[i] = j;
        CK(hk_cuda_embed(dx2 + (size_t)i * N * H, dt,
                         (const int *)(void *)at[j], N, H, NULL));
        for (int t = 0; t < N; t++)
            ids[t] = -1; /* the host reuses its array at once */
    }
    /* 400 bytes a put, 512 apart: two a segment */
    ok(hk_cuda_sync_count() == w0 && apart &&
           hk_cuda_ring_mark(r) == ROUNDS / 2 - 1,
       "ring: %d puts without a stream sync, each apart from the five "
       "before; %d segments entered",
       ROUNDS, ROUNDS / 2 - 1);
    CK(hk_cuda_d2h(x, dx, (size_t)ROUNDS * N * H * sizeof(float), NULL));
    CK(hk_cuda_d2h(x2, dx2, (size_t)ROUNDS * N * H * sizeof(float), NULL));
    for (int i = 0; i < ROUNDS; i++) {
        for (int t = 0; t < N; t++)
            ids[t] = (i * 31 + t * 7) % V;
        hk_embed(y, table, ids, N, H);
        good &= !memcmp(y, x + (size_t)i * N * H, sizeof(float) * N * H);
        for (int t = 0; t < N; t++)
            ids[t] = (back[i] * 31 + t * 7) % V;
        hk_embed(y, table, ids, N, H);
        good2 &= !memcmp(y, x2 + (size_t)i * N * H, sizeof(float) * N * H);
    }
    ok(good, "ring: %d rounds of %d ids through 4 KiB, every gather exact",
       ROUNDS, N);
    ok(good2 && back[ROUNDS - 1] == ROUNDS - 8,
       "ring: a put read again while the mark has grown by less than %d "
       "(7 puts later), every gather exact",
       HK_CUDA_RING_SEGS);
    hk_cuda_ring_destroy(r);
    CK(hk_cuda_free(dt));
    CK(hk_cuda_free(dx));
    CK(hk_cuda_free(dx2));
    free(table);
    free(x);
    free(x2);
    free(y);
}

/* ---- attention
 * ---------------------------------------------------------------
 */

/* The attention layer's steps around the op on both sides, as the forward
 * pass runs them (reference §4): q and k zero-centred RMSNorm per head,
 * partial RoPE (rot of hd), attention, then the output gate. */
typedef struct {
    int T, N, Hq, Hkv, hd, rot;
} att_shape_t;

/* The defaults are their kernels, bit for bit, scratch and all: DEFAULT
 * FLASH2X, DEFAULT_BF16 (a bf16 checkpoint's) FLASH3_SEQ on a compute
 * capability 9.0 device (the emulator's), else FLASH2. */
static void att_defaults(float *dO, const float *dq, const int *dpos,
                         const float *dkc, const float *dvc, int T, int N,
                         int Hq, int Hkv, int hd, float scale)
{
    const int hopper = hk_cuda_compute_capability() == 90;
    const hk_cuda_att_impl_t pairs[2][2] = {
        {HK_CUDA_ATT_DEFAULT, HK_CUDA_ATT_FLASH2X},
        {HK_CUDA_ATT_DEFAULT_BF16,
         hopper ? HK_CUDA_ATT_FLASH3_SEQ : HK_CUDA_ATT_FLASH2}};
    const size_t nq = (size_t)T * Hq * hd;
    for (int p = 0; p < 2; p++) {
        float *o[2];
        size_t nscr[2];
        for (int i = 0; i < 2; i++) {
            nscr[i] = hk_cuda_attention_scratch(pairs[p][i], T, N, Hq, Hkv, hd);
            float *dscr = nscr[i] ? dev_alloc(nscr[i]) : NULL;
            CK(hk_cuda_memset0(dO, nq * sizeof(float), NULL));
            RUN(hk_cuda_attention_ex(pairs[p][i], dO, dq, dpos, dkc, dvc, T, N,
                                     Hq, Hkv, hd, scale, dscr, NULL));
            if (dscr)
                CK(hk_cuda_free(dscr));
            o[i] = host_from(dO, nq);
        }
        ok(nscr[0] == nscr[1] && nscr[0] > 0 &&
               !memcmp(o[0], o[1], nq * sizeof(float)),
           "attention %s is %s, bit for bit (scratch %zu floats)",
           p ? "DEFAULT_BF16" : "DEFAULT",
           p ? (hopper ? "FLASH3_SEQ" : "FLASH2") : "FLASH2X", nscr[0]);
        free(o[0]);
        free(o[1]);
    }
}

static void test_attention(void)
{
    /* qpos: prefill from 0, a prompt over a cache (the last T of N), a
     * PIC splice (unordered positions). hd 256, GQA 4 and rot 64 are the
     * Qwen3.5 attention layers (8:2 heads as the 0.8B); T and N past the
     * tensor-core kernel's tiles (64 rows of (query, head), 64 keys) and
     * not multiples of them, nkeys > T (a cached prefix). */
    static const att_shape_t shapes[] = {
        {1, 1, 1, 1, 2, 2},       {5, 5, 4, 2, 64, 16},
        {20, 90, 8, 2, 256, 64},  {3, 100, 6, 3, 33, 8},
        {70, 200, 8, 2, 256, 64}, {7, 40, 8, 2, 256, 64},
        {1, 130, 16, 2, 256, 64}, {70, 70, 2, 1, 128, 128},
        {150, 150, 8, 2, 64, 64}, {41, 300, 16, 2, 256, 64}};
    /* Each shape on every kernel: (impl, tolerance, name). */
    static const struct {
        hk_cuda_att_impl_t impl;
        double atol, rtol;
        const char *name;
    } impls[] = {
        {HK_CUDA_ATT_SIMPLE, ATOL_ATT, RTOL_ATT, "simple"},
        {HK_CUDA_ATT_FLASH, ATOL_ATT_TC, RTOL_ATT_TC, "flash"},
        {HK_CUDA_ATT_FLASH_BF16, ATOL_ATT_BF16, RTOL_ATT_BF16, "flash_bf16"},
        {HK_CUDA_ATT_FLASH2, ATOL_ATT_BF16, RTOL_ATT_BF16, "flash2"},
        {HK_CUDA_ATT_FLASH2X, ATOL_ATT_TC, RTOL_ATT_TC, "flash2x"}};
    const float eps = 1e-6f;
    /* The small grid reaches shape 4: several row blocks of FLASH2 (128
     * rows) and a K/V buffer refilled (4 tiles of 64 keys). */
    for (int s = 0; s < grid_n(NSHAPES(shapes), 5); s++) {
        const att_shape_t *a = &shapes[s];
        const int T = a->T, N = a->N, Hq = a->Hq, Hkv = a->Hkv, hd = a->hd;
        const size_t nq = (size_t)T * Hq * hd, nkv = (size_t)N * Hkv * hd;
        const size_t nkn = (size_t)T * Hkv * hd;
        int qpos[256];
        for (int t = 0; t < T; t++)
            qpos[t] = s == 3 ? (t * 37 + 10) % N : N - T + t;
        float *q = frand(nq, 1.0), *gate = frand(nq, 3.0);
        float *kc = frand(nkv, 1.0), *vc = frand(nkv, 1.0);
        float *kn = frand(nkn, 1.0), *vn = frand(nkn, 1.0);
        float *qw = frand(hd, 0.5), *kw = frand(hd, 0.5);
        float *o = hmalloc(nq);
        float *dq = dev_from(q, nq), *dgate = dev_from(gate, nq);
        float *dkc = dev_from(kc, nkv), *dvc = dev_from(vc, nkv);
        float *dkn = dev_from(kn, nkn), *dvn = dev_from(vn, nkn);
        float *dqw = dev_from(qw, hd), *dkw = dev_from(kw, hd);
        float *dO = dev_alloc(nq);
        int *dpos = dev_ints(qpos, T);
        const float scale = 1.0f / sqrtf((float)hd);

        float *scr = hmalloc(hk_attention_scratch(T, N, Hq));
        hk_rmsnorm_zc(q, q, qw, T * Hq, hd, eps);
        hk_rmsnorm_zc(kn, kn, kw, T * Hkv, hd, eps);
        hk_rope(q, qpos, T, Hq, hd, a->rot, 1e7);
        hk_rope(kn, qpos, T, Hkv, hd, a->rot, 1e7);
        hk_kv_store(kc, vc, kn, vn, qpos, T, Hkv * hd);
        hk_attention(o, q, qpos, kc, vc, T, N, Hq, Hkv, hd, scale, scr);
        float *ogate = fdup(o, nq);
        hk_gate_mul(ogate, gate, nq);

        RUN(hk_cuda_rmsnorm_zc(dq, dq, dqw, T * Hq, hd, eps, NULL));
        RUN(hk_cuda_rmsnorm_zc(dkn, dkn, dkw, T * Hkv, hd, eps, NULL));
        RUN(hk_cuda_rope(dq, dpos, T, Hq, hd, a->rot, 1e7, NULL));
        RUN(hk_cuda_rope(dkn, dpos, T, Hkv, hd, a->rot, 1e7, NULL));
        RUN(hk_cuda_kv_store(dkc, dvc, dkn, dvn, dpos, T, Hkv * hd, NULL));
        for (size_t m = 0; m < sizeof impls / sizeof impls[0]; m++) {
            /* The previous kernel's output must not pass for this one's. */
            CK(hk_cuda_memset0(dO, nq * sizeof(float), NULL));
            const size_t nscr =
                hk_cuda_attention_scratch(impls[m].impl, T, N, Hq, Hkv, hd);
            float *dscr = nscr ? dev_alloc(nscr) : NULL;
            RUN(hk_cuda_attention_ex(impls[m].impl, dO, dq, dpos, dkc, dvc, T,
                                     N, Hq, Hkv, hd, scale, dscr, NULL));
            if (dscr)
                CK(hk_cuda_free(dscr));
            int good = close_cpu(o, dO, nq, impls[m].atol, impls[m].rtol, "o");
            RUN(hk_cuda_gate_mul(dO, dgate, nq, NULL));
            good &= close_cpu(ogate, dO, nq, impls[m].atol, impls[m].rtol,
                              "gated o");
            ok(good, "attention %s T=%d N=%d Hq=%d Hkv=%d hd=%d rot=%d%s",
               impls[m].name, T, N, Hq, Hkv, hd, a->rot,
               s == 3 ? " (unordered qpos)" : "");
        }
        if (s == 1 && !getenv("HYPIC_CUDA_ATT"))
            att_defaults(dO, dq, dpos, dkc, dvc, T, N, Hq, Hkv, hd, scale);
        CK(hk_cuda_free(dq));
        CK(hk_cuda_free(dgate));
        CK(hk_cuda_free(dkc));
        CK(hk_cuda_free(dvc));
        CK(hk_cuda_free(dkn));
        CK(hk_cuda_free(dvn));
        CK(hk_cuda_free(dqw));
        CK(hk_cuda_free(dkw));
        CK(hk_cuda_free(dO));
        CK(hk_cuda_free(dpos));
        free(q);
        free(gate);
        free(kc);
        free(vc);
        free(kn);
        free(vn);
        free(qw);
        free(kw);
        free(o);
        free(ogate);
        free(scr);
    }
}

/* One prefill case of the kernel tests below: random q (amplitude qa), k,
 * v [N] at positions qpos, the CPU's o, and the device's copies. */
typedef struct {
    int T, N, Hq, Hkv, hd;
    size_t nq;
    float *q, *k, *v, *o; /* host; o: the CPU's */
    float *dq, *dk, *dv, *dO;
    int *dpos;
} att_case_t;

static void att_case_make(att_case_t *c, int T, int N, int Hq, int Hkv, int hd,
                          const int *qpos, double qa)
{
    const size_t nkv = (size_t)N * Hkv * hd;
    memset(c, 0, sizeof *c);
    c->T = T, c->N = N, c->Hq = Hq, c->Hkv = Hkv, c->hd = hd;
    c->nq = (size_t)T * Hq * hd;
    c->q = frand(c->nq, qa), c->k = frand(nkv, 1.0), c->v = frand(nkv, 1.0);
    c->o = hmalloc(c->nq);
    float *scr = hmalloc(hk_attention_scratch(T, N, Hq));
    hk_attention(c->o, c->q, qpos, c->k, c->v, T, N, Hq, Hkv, hd,
                 1.0f / sqrtf((float)hd), scr);
    free(scr);
    c->dq = dev_from(c->q, c->nq), c->dk = dev_from(c->k, nkv);
    c->dv = dev_from(c->v, nkv), c->dO = dev_alloc(c->nq);
    c->dpos = dev_ints(qpos, T);
}

/* impl into c->dO (zeroed first, so another kernel's output cannot pass
 * for this one's), with the scratch it asks for. */
static void att_case_run(att_case_t *c, hk_cuda_att_impl_t impl)
{
    CK(hk_cuda_memset0(c->dO, c->nq * sizeof(float), NULL));
    const size_t ns =
        hk_cuda_attention_scratch(impl, c->T, c->N, c->Hq, c->Hkv, c->hd);
    float *dscr = ns ? dev_alloc(ns) : NULL;
    RUN(hk_cuda_attention_ex(impl, c->dO, c->dq, c->dpos, c->dk, c->dv, c->T,
                             c->N, c->Hq, c->Hkv, c->hd,
                             1.0f / sqrtf((float)c->hd), dscr, NULL));
    if (dscr)
        CK(hk_cuda_free(dscr));
}

static void att_case_free(att_case_t *c)
{
    CK(hk_cuda_free(c->dq));
    CK(hk_cuda_free(c->dk));
    CK(hk_cuda_free(c->dv));
    CK(hk_cuda_free(c->dO));
    CK(hk_cuda_free(c->dpos));
    free(c->q);
    free(c->k);
    free(c->v);
    free(c->o);
}

/* Split-KV: a short prompt over a long cache (PIC seams, a resume) has
 * fewer row blocks than a wave, so FLASH2 and FLASH2X split each block's
 * keys over blocks and combine the partial softmaxes. Against the CPU at
 * each kernel's bound: queries at the end of the cache, and unordered
 * positions (rows that see none of a split's keys; splits past a block's
 * last tile). Under the emulator HK_EMU_SMS = 32 for this test makes the
 * splits many (the default 4 SMs would allow two); a GPU has its own. */
/* A kernel of the split-KV tests: impl, its bound against the CPU. */
typedef struct {
    hk_cuda_att_impl_t impl;
    double atol, rtol;
    const char *name;
} att_impl_t;

/* The split shapes on n kernels (test_attention_split's; FLASH3's from
 * test_attention_flash3, last). */
static void att_split_on(const att_impl_t *impls, int n)
{
    static const int shapes[][5] = {{6, 700, 8, 2, 256},
                                    {9, 600, 4, 2, 128},
                                    {5, 520, 6, 3, 64},
                                    {12, 900, 16, 2, 256}};
    const char *sms = getenv("HK_EMU_SMS");
    char *keep = sms ? strdup(sms) : NULL;
    setenv("HK_EMU_SMS", "32", 1);
    for (int s = 0; s < grid_n(NSHAPES(shapes), 3); s++) {
        const int T = shapes[s][0], N = shapes[s][1], Hq = shapes[s][2];
        const int Hkv = shapes[s][3], hd = shapes[s][4];
        int qpos[16];
        for (int t = 0; t < T; t++) /* shape 2: a splice's scattered seams */
            qpos[t] = s == 2 ? (t * 173 + 11) % N : N - T + t;
        att_case_t c;
        att_case_make(&c, T, N, Hq, Hkv, hd, qpos, 3.0);
        for (int m = 0; m < n; m++) {
            const int ns =
                hk_cuda_attention_splits(impls[m].impl, T, N, Hq, Hkv, hd);
            att_case_run(&c, impls[m].impl);
            const double r =
                ratio_cpu(c.o, c.dO, c.nq, impls[m].atol, impls[m].rtol);
            if (!(r <= 1.0) || getenv("HK_CUDA_TEST_VERBOSE"))
                tap_diag("  worst |err| / (atol + rtol |ref|): %.3g", r);
            ok(ns > 1 && r <= 1.0,
               "attention %s T=%d N=%d Hq=%d Hkv=%d hd=%d%s: %d splits of "
               "the keys, within its bound of the CPU",
               impls[m].name, T, N, Hq, Hkv, hd,
               s == 2 ? " (unordered qpos)" : "", ns);
        }
        att_case_free(&c);
    }
    if (keep)
        setenv("HK_EMU_SMS", keep, 1);
    else
        unsetenv("HK_EMU_SMS");
    free(keep);
}

static void test_attention_split(void)
{
    static const att_impl_t impls[] = {
        {HK_CUDA_ATT_FLASH2X, ATOL_ATT_TC, RTOL_ATT_TC, "flash2x"},
        {HK_CUDA_ATT_FLASH2, ATOL_ATT_BF16_Q3, RTOL_ATT_BF16_Q3, "flash2"}};
    att_split_on(impls, 2);
    /* a prompt whose row blocks fill a wave is not split */
    ok(hk_cuda_attention_splits(HK_CUDA_ATT_FLASH2X, 1 << 16, 1 << 16, 8, 2,
                                256) == 1,
       "attention: 64k queries are not split");
}

/* FLASH3 (wgmma) runs on a compute capability 9.0 device only (the
 * emulator is one); elsewhere its checks are skipped, saying so once. */
static int flash3_here(void)
{
    static int here = -1;
    if (here < 0) {
        here = hk_cuda_compute_capability() == 90;
        if (!here)
            tap_diag("  flash3 skipped: compute capability %d, not 9.0",
                     hk_cuda_compute_capability());
    }
    return here;
}

/* FLASH3 at every padded head dim against the CPU at the bf16 bound, and
 * against FLASH2 (the same precision), FLASH3_SEQ and FLASH3_WS equal to
 * FLASH3 bit for bit: several row blocks (128 rows) and
 * both warpgroups, the K/V buffers refilled (tiles of 64 keys), a last
 * tile past N, hd below its padded width, a cached prefix, unordered
 * positions (a PIC splice); FLASH3_WS on the same shapes (its producer
 * warp and named barriers: the emulator checks every barrier's counts and
 * that none is left pending). It runs last, so a fault there (which leaves
 * the context unusable) cannot take the other tests' checks with it
 * (FLASH3_WS has not run on a GPU yet). */
static void test_attention_flash3(void)
{
    static const int shapes[][5] = {{37, 100, 8, 2, 64},  {24, 90, 4, 2, 128},
                                    {40, 75, 8, 2, 256},  {9, 30, 6, 3, 100},
                                    {70, 300, 8, 2, 256}, {33, 33, 2, 2, 48}};
    static const struct {
        hk_cuda_att_impl_t impl;
        const char *name;
    } impls[4] = {{HK_CUDA_ATT_FLASH2, "flash2"},
                  {HK_CUDA_ATT_FLASH3, "flash3"},
                  {HK_CUDA_ATT_FLASH3_SEQ, "flash3_seq"},
                  {HK_CUDA_ATT_FLASH3_WS, "flash3_ws"}};
    if (!flash3_here())
        return;
    for (int s = 0; s < NSHAPES(shapes); s++) {
        const int T = shapes[s][0], N = shapes[s][1], Hq = shapes[s][2];
        const int Hkv = shapes[s][3], hd = shapes[s][4];
        int qpos[128];
        for (int t = 0; t < T; t++)
            qpos[t] = s == 3 ? (t * 7 + 5) % N : N - T + t;
        att_case_t c;
        att_case_make(&c, T, N, Hq, Hkv, hd, qpos, 3.0);
        float *o2 = hmalloc(c.nq), *o3 = hmalloc(c.nq);
        for (int m = 0; m < 4; m++) {
            att_case_run(&c, impls[m].impl);
            if (m == 0) {
                CK(hk_cuda_d2h(o2, c.dO, c.nq * sizeof(float), NULL));
                continue;
            }
            /* the three run the same products and softmax steps in the
             * same order (the tuner takes them as one) */
            if (m == 1)
                CK(hk_cuda_d2h(o3, c.dO, c.nq * sizeof(float), NULL));
            else
                ok(same_cpu(o3, c.dO, c.nq, "o"),
                   "attention %s T=%d N=%d Hq=%d Hkv=%d hd=%d: flash3's o, "
                   "bit for bit",
                   impls[m].name, T, N, Hq, Hkv, hd);
            const double r =
                ratio_cpu(c.o, c.dO, c.nq, ATOL_ATT_BF16_Q3, RTOL_ATT_BF16_Q3);
            /* FLASH2 and FLASH3 round the same operands to bf16; they
             * differ in the order of the f32 sums (and so a bf16 rounding
             * of p here and there) only */
            const double r2 =
                ratio_cpu(o2, c.dO, c.nq, ATOL_ATT_BF16 / 2, RTOL_ATT_BF16 / 2);
            if (!(r <= 1.0 && r2 <= 1.0) || getenv("HK_CUDA_TEST_VERBOSE"))
                tap_diag("  worst |err| / (atol + rtol |ref|): vs cpu %.3g, "
                         "vs flash2 (bound / 2) %.3g",
                         r, r2);
            ok(r <= 1.0 && r2 <= 1.0,
               "attention %s T=%d N=%d Hq=%d Hkv=%d hd=%d%s: within the bf16 "
               "bound of the CPU, near flash2",
               impls[m].name, T, N, Hq, Hkv, hd,
               s == 3 ? " (unordered qpos)" : "");
        }
        free(o2);
        free(o3);
        att_case_free(&c);
    }
    /* split-KV on the FLASH3 kernels (test_attention_split's shapes) */
    static const att_impl_t split[] = {
        {HK_CUDA_ATT_FLASH3, ATOL_ATT_BF16_Q3, RTOL_ATT_BF16_Q3, "flash3"},
        {HK_CUDA_ATT_FLASH3_SEQ, ATOL_ATT_BF16_Q3, RTOL_ATT_BF16_Q3,
         "flash3_seq"},
        {HK_CUDA_ATT_FLASH3_WS, ATOL_ATT_BF16_Q3, RTOL_ATT_BF16_Q3,
         "flash3_ws"}};
    att_split_on(split, 3);
}

/* FLASH2X (FLASH2's kernel on hi/lo split operands) at every padded head
 * dim against the CPU, at FLASH's bound, and FLASH2 (bf16 operands) on
 * the same inputs outside it: the bound tells the split from bf16. */
static void test_attention_flash2x(void)
{
    /* T, N, Hq, Hkv, hd: a cached prefix of N - T keys, GQA, more than one
     * block of 128 rows (T r > 128) and more than one K/V tile (64 keys,
     * 16 at hd 256), a last tile past N, hd below its padded width. */
    static const int shapes[][5] = {{37, 100, 8, 2, 64},
                                    {24, 90, 4, 2, 128},
                                    {40, 75, 8, 2, 256},
                                    {9, 30, 6, 3, 100}};
    for (int s = 0; s < NSHAPES(shapes); s++) {
        const int T = shapes[s][0], N = shapes[s][1], Hq = shapes[s][2];
        const int Hkv = shapes[s][3], hd = shapes[s][4];
        int qpos[64];
        for (int t = 0; t < T; t++)
            qpos[t] = N - T + t;
        /* scores of O(1): q . k of hd terms of variance 1/9, scale
         * 1/sqrt(hd), times 3 */
        att_case_t c;
        att_case_make(&c, T, N, Hq, Hkv, hd, qpos, 3.0);
        const hk_cuda_att_impl_t impls[2] = {HK_CUDA_ATT_FLASH2X,
                                             HK_CUDA_ATT_FLASH2};
        double r[2];
        for (int m = 0; m < 2; m++) {
            att_case_run(&c, impls[m]);
            r[m] = ratio_cpu(c.o, c.dO, c.nq, ATOL_ATT_TC, RTOL_ATT_TC);
        }
        if (!(r[0] <= 1.0 && r[1] > 1.0) || getenv("HK_CUDA_TEST_VERBOSE"))
            tap_diag("  worst |err| / (atol + rtol |ref|): flash2x %.3g, "
                     "flash2 %.3g",
                     r[0], r[1]);
        ok(r[0] <= 1.0 && r[1] > 1.0,
           "attention flash2x T=%d N=%d Hq=%d Hkv=%d hd=%d: within FLASH's "
           "bound, flash2 not",
           T, N, Hq, Hkv, hd);
        att_case_free(&c);
    }
}

/* The decode's kernels: kernel, with scratch (flash-decoding's splits). */
static const struct {
    hk_cuda_att_impl_t impl;
    int scratch;
    const char *name;
} dec_impls[] = {{HK_CUDA_ATT_SIMPLE, 0, "simple"},
                 {HK_CUDA_ATT_FLASH, 0, "flash"},
                 {HK_CUDA_ATT_FLASH, 1, "flash split"}};
#define N_DEC_IMPLS ((int)(sizeof dec_impls / sizeof dec_impls[0]))

/* B requests, one query each, every cache its own allocation of its own
 * length; the reference is hk_attention with T = 1, qpos = n_ctx - 1. */
static void test_attention_decode(void)
{
    /* B, Hq, Hkv, hd; contexts below (the emulator's 4 SMs make FLASH with
     * scratch split 16 blocks' worth: up to 16 splits of a request, some
     * empty, and none at B * Hkv >= 16). */
    static const int shapes[][4] = {{1, 1, 1, 16},  {3, 8, 2, 256},
                                    {4, 6, 6, 64},  {2, 16, 2, 128},
                                    {4, 8, 2, 256}, {3, 4, 1, 33}};
    static const int ctx[] = {65, 1, 200, 64};
    for (int s = 0; s < grid_n(NSHAPES(shapes), 2); s++) {
        const int B = shapes[s][0], Hq = shapes[s][1], Hkv = shapes[s][2];
        const int hd = shapes[s][3];
        const size_t nq = (size_t)B * Hq * hd, row = (size_t)Hkv * hd;
        const float scale = 1.0f / sqrtf((float)hd);
        float *q = frand(nq, 1.0), *o = hmalloc(nq);
        float *kc[4], *vc[4], *dkc[4], *dvc[4];
        int nctx[4];
        for (int b = 0; b < B; b++) {
            nctx[b] = ctx[(b + s) % 4];
            kc[b] = frand(nctx[b] * row, 1.0);
            vc[b] = frand(nctx[b] * row, 1.0);
            dkc[b] = dev_from(kc[b], nctx[b] * row);
            dvc[b] = dev_from(vc[b], nctx[b] * row);
            float *scr = hmalloc(hk_attention_scratch(1, nctx[b], Hq));
            const int p = nctx[b] - 1;
            hk_attention(o + (size_t)b * Hq * hd, q + (size_t)b * Hq * hd, &p,
                         kc[b], vc[b], 1, nctx[b], Hq, Hkv, hd, scale, scr);
            free(scr);
        }
        void *dpk = dev_ptrs(dkc, B), *dpv = dev_ptrs(dvc, B);
        float *dq = dev_from(q, nq), *dO = dev_alloc(nq);
        int *dctx = dev_ints(nctx, B);
        const size_t nscr = hk_cuda_attention_decode_scratch(B, Hq, Hkv, hd);
        float *dscr = nscr ? dev_alloc(nscr) : NULL;
        for (int m = 0; m < N_DEC_IMPLS; m++) {
            CK(hk_cuda_memset0(dO, nq * sizeof(float), NULL));
            RUN(hk_cuda_attention_decode_ex(
                dec_impls[m].impl, dO, dq, dpk, dpv, dctx, B, Hq, Hkv, hd,
                scale, dec_impls[m].scratch && nscr ? dscr : NULL, NULL));
            ok(close_cpu(o, dO, nq, ATOL_ATT, RTOL_ATT, "o"),
               "attention_decode %s B=%d Hq=%d Hkv=%d hd=%d (scratch %zu)",
               dec_impls[m].name, B, Hq, Hkv, hd,
               dec_impls[m].scratch ? nscr : 0);
        }
        for (int b = 0; b < B; b++) {
            CK(hk_cuda_free(dkc[b]));
            CK(hk_cuda_free(dvc[b]));
            free(kc[b]);
            free(vc[b]);
        }
        CK(hk_cuda_free(dscr));
        CK(hk_cuda_free(dpk));
        CK(hk_cuda_free(dpv));
        CK(hk_cuda_free(dq));
        CK(hk_cuda_free(dO));
        CK(hk_cuda_free(dctx));
        free(q);
        free(o);
    }
}

/* Paged decode: B requests with ragged contexts (1, P - 1, P, P + 1 and
 * a long one, in turn) whose rows lie on shuffled pages of an arena;
 * the rows past each context, the pages nobody owns and the one unused
 * table entries name are NaN, so a key read past a context shows. Each
 * request's last row (the new token) is stored by kv_store_paged first.
 * Every kernel (with and without flash-decoding's splits) against the
 * CPU twin, and against the contiguous decode on the same rows. */
static void test_attention_decode_paged(void)
{
    /* B, Hq, Hkv, hd, P. The small grid (the emulator in make test) runs
     * the first two: hd 256 and 64, P 16 and 64, r 4 and 8, every
     * context length; the rest: hd 128, r 3, 1, 16, P 4, B 1..6. */
    static const int shapes[][5] = {{5, 8, 2, 256, 16}, {5, 16, 2, 64, 64},
                                    {3, 6, 2, 128, 16}, {1, 1, 1, 64, 64},
                                    {6, 4, 4, 128, 4},  {2, 16, 1, 256, 64}};
    for (int s = 0; s < grid_n(NSHAPES(shapes), 2); s++) {
        const int B = shapes[s][0], Hq = shapes[s][1], Hkv = shapes[s][2];
        const int hd = shapes[s][3], P = shapes[s][4];
        const size_t nq = (size_t)B * Hq * hd, row = (size_t)Hkv * hd;
        const float scale = 1.0f / sqrtf((float)hd);
        const int lens[5] = {1, P - 1, P, P + 1, 2 * P + 3};
        int nctx[8], pos[8], maxp = 0, nmin = 1 << 30, nmax = 0;
        for (int b = 0; b < B; b++) {
            nctx[b] = lens[(b + s) % 5];
            pos[b] = nctx[b] - 1;
            nmin = nctx[b] < nmin ? nctx[b] : nmin;
            nmax = nctx[b] > nmax ? nctx[b] : nmax;
        }
        const int npages = pages_for(nctx, B, P, &maxp);
        int *table = hbytes((size_t)B * maxp * sizeof(int));
        page_table(table, nctx, B, P, maxp, npages);
        const size_t na = (size_t)npages * P * row;
        float *kp = hmalloc(na), *vp = hmalloc(na);
        for (size_t i = 0; i < na; i++)
            kp[i] = vp[i] = NAN;
        /* each request's rows in order: the contiguous caches; on its
         * pages all but the last (stored below as the new token's) */
        float *kc[8], *vc[8], *dkc[8], *dvc[8];
        for (int b = 0; b < B; b++) {
            kc[b] = frand(nctx[b] * row, 1.0);
            vc[b] = frand(nctx[b] * row, 1.0);
            for (int j = 0; j + 1 < nctx[b]; j++) {
                const size_t at =
                    ((size_t)table[b * maxp + j / P] * P + j % P) * row;
                memcpy(kp + at, kc[b] + j * row, row * sizeof(float));
                memcpy(vp + at, vc[b] + j * row, row * sizeof(float));
            }
        }
        float *kn = hmalloc((size_t)B * row), *vn = hmalloc((size_t)B * row);
        for (int b = 0; b < B; b++) {
            memcpy(kn + b * row, kc[b] + pos[b] * row, row * sizeof(float));
            memcpy(vn + b * row, vc[b] + pos[b] * row, row * sizeof(float));
        }
        float *dkp = dev_from(kp, na), *dvp = dev_from(vp, na);
        float *dkn = dev_from(kn, (size_t)B * row);
        float *dvn = dev_from(vn, (size_t)B * row);
        int *dtab = dev_ints(table, (size_t)B * maxp),
            *dctx = dev_ints(nctx, B);
        int *dpos = dev_ints(pos, B);
        hk_kv_store_paged(kp, vp, kn, vn, table, maxp, pos, B, P, (int)row);
        RUN(hk_cuda_kv_store_paged(dkp, dvp, dkn, dvn, dtab, maxp, dpos, B, P,
                                   (int)row, NULL));

        float *q = frand(nq, 1.0), *o = hmalloc(nq);
        float *scr =
            hmalloc(hk_attention_decode_paged_scratch(nmax, Hq, Hkv, hd));
        hk_attention_decode_paged(o, q, kp, vp, table, maxp, nctx, B, P, Hq,
                                  Hkv, hd, scale, scr);
        free(scr);
        for (int b = 0; b < B; b++) {
            dkc[b] = dev_from(kc[b], nctx[b] * row);
            dvc[b] = dev_from(vc[b], nctx[b] * row);
        }
        void *dpk = dev_ptrs(dkc, B), *dpv = dev_ptrs(dvc, B);
        float *dq = dev_from(q, nq), *dO = dev_alloc(nq);
        const size_t nscr = hk_cuda_attention_decode_scratch(B, Hq, Hkv, hd);
        float *dscr = nscr ? dev_alloc(nscr) : NULL;
        for (int m = 0; m < N_DEC_IMPLS; m++) {
            float *ds = dec_impls[m].scratch && nscr ? dscr : NULL;
            CK(hk_cuda_memset0(dO, nq * sizeof(float), NULL));
            RUN(hk_cuda_attention_decode_ex(dec_impls[m].impl, dO, dq, dpk, dpv,
                                            dctx, B, Hq, Hkv, hd, scale, ds,
                                            NULL));
            float *oc = host_from(dO, nq);
            CK(hk_cuda_memset0(dO, nq * sizeof(float), NULL));
            RUN(hk_cuda_attention_decode_paged_ex(
                dec_impls[m].impl, dO, dq, dkp, dvp, dtab, maxp, dctx, B, P, Hq,
                Hkv, hd, scale, ds, NULL));
            int good = close_cpu(o, dO, nq, ATOL_ATT, RTOL_ATT, "o vs cpu");
            good &=
                close_cpu(oc, dO, nq, ATOL_ATT, RTOL_ATT, "o vs contiguous");
            ok(good,
               "attention_decode_paged %s B=%d Hq=%d Hkv=%d hd=%d P=%d "
               "n_ctx %d..%d over %d pages (scratch %zu)",
               dec_impls[m].name, B, Hq, Hkv, hd, P, nmin, nmax, npages,
               ds ? nscr : 0);
            free(oc);
        }
        for (int b = 0; b < B; b++) {
            CK(hk_cuda_free(dkc[b]));
            CK(hk_cuda_free(dvc[b]));
            free(kc[b]);
            free(vc[b]);
        }
        void *dbufs[] = {dscr, dpk, dpv, dq,   dO,   dkp,
                         dvp,  dkn, dvn, dtab, dctx, dpos};
        for (size_t i = 0; i < sizeof dbufs / sizeof dbufs[0]; i++)
            CK(hk_cuda_free(dbufs[i]));
        free(table);
        free(kp);
        free(vp);
        free(kn);
        free(vn);
        free(q);
        free(o);
    }
}

/* ---- MoE
 * ---------------------------------------------------------------------
 */

/* The CPU's dispatch plan of idx, w [T, k] (host) and the device's from
 * didx, dw: both kept (host arrays, device rows, slot and the rest) for
 * the ops that follow; returns whether they agree exactly. */
typedef struct {
    int *offs, *rows, *slot, *doffs, *drows, *dslot;
    float *scale, *dscale;
} plan_pair_t;

static int plan_both(plan_pair_t *p, const int *idx, const float *w,
                     const int *didx, const float *dw, int T, int k, int E)
{
    const size_t nk = (size_t)T * k, n1 = nk ? nk : 1;
    p->offs = malloc((size_t)(E + 1) * sizeof(int));
    p->rows = malloc(n1 * sizeof(int));
    p->slot = malloc(n1 * sizeof(int));
    p->scale = hmalloc(nk);
    hk_moe_plan(p->offs, p->rows, p->scale, p->slot, idx, w, T, k, E);
    p->doffs = dev_ints(p->offs, E + 1);
    p->drows = dev_ints(p->rows, nk);
    p->dslot = dev_ints(p->slot, nk);
    p->dscale = dev_alloc(nk);
    CK(hk_cuda_memset0(p->doffs, (E + 1) * sizeof(int), NULL));
    CK(hk_cuda_memset0(p->drows, nk * sizeof(int), NULL));
    CK(hk_cuda_memset0(p->dslot, nk * sizeof(int), NULL));
    RUN(hk_cuda_moe_plan(p->doffs, p->drows, p->dscale, p->dslot, didx, dw, T,
                         k, E, NULL));
    return same_ints(p->offs, p->doffs, E + 1, "offs") &
           same_ints(p->rows, p->drows, nk, "rows") &
           same_ints(p->slot, p->dslot, nk, "slot") &
           same_cpu(p->scale, p->dscale, nk, "scale");
}

static void plan_free(plan_pair_t *p)
{
    CK(hk_cuda_free(p->doffs));
    CK(hk_cuda_free(p->drows));
    CK(hk_cuda_free(p->dslot));
    CK(hk_cuda_free(p->dscale));
    free(p->offs);
    free(p->rows);
    free(p->slot);
    free(p->scale);
}

static void test_moe(void)
{
    /* T, E, k, renorm: ties (E = 8 logits from 3 values), k = E, the
     * Qwen3-Next router (E = 512, k = 10). */
    static const int shapes[][4] = {
        {1, 1, 1, 1}, {9, 8, 8, 0}, {5, 64, 4, 1}, {3, 512, 10, 1}};
    for (int s = 0; s < grid_n(NSHAPES(shapes), 3); s++) {
        const int T = shapes[s][0], E = shapes[s][1], k = shapes[s][2];
        const int renorm = shapes[s][3], H = 40;
        const size_t nl = (size_t)T * E, nk = (size_t)T * k;
        float *lg = frand(nl, 4.0);
        if (E == 8)
            for (size_t i = 0; i < nl; i++)
                lg[i] = (float)((int)(3.0 * (urand() + 1.0)) % 3);
        int *idx = malloc(nk * sizeof(int));
        float *w = hmalloc(nk);
        for (int t = 0; t < T; t++)
            hk_moe_route(idx + (size_t)t * k, w + (size_t)t * k,
                         lg + (size_t)t * E, E, k, renorm);
        float *dlg = dev_from(lg, nl), *dw = dev_alloc(nk);
        int *didx = dev_ints(idx, nk); /* overwritten below */
        RUN(hk_cuda_moe_route(didx, dw, dlg, T, E, k, renorm, NULL));
        ok(same_ints(idx, didx, nk, "idx") &
               close_cpu(w, dw, nk, ATOL_SEL, RTOL_SEL, "w"),
           "moe_route T=%d E=%d k=%d renorm=%d", T, E, k, renorm);

        /* dispatch from the CPU's routes (so both sides plan the same) */
        CK(hk_cuda_h2d(didx, idx, nk * sizeof(int), NULL));
        CK(hk_cuda_h2d(dw, w, nk * sizeof(float), NULL));
        plan_pair_t pl;
        ok(plan_both(&pl, idx, w, didx, dw, T, k, E), "moe_plan T=%d E=%d k=%d",
           T, E, k);
        const int *offs = pl.offs, *rows = pl.rows, *slot = pl.slot;
        const int *drows = pl.drows, *dslot = pl.dslot;

        float *y = frand((size_t)T * H, 1.0), *xg = hmalloc(nk * H);
        float *dy = dev_from(y, (size_t)T * H), *dxg = dev_alloc(nk * H);
        hk_moe_gather(xg, y, rows, (int)nk, H);
        RUN(hk_cuda_moe_gather(dxg, dy, drows, (int)nk, H, NULL));
        ok(same_cpu(xg, dxg, nk * H, "xg"), "moe_gather T=%d k=%d H=%d", T, k,
           H);

        /* scatter expert by expert (as the forward loop), then combine */
        float *eo = frand(nk * H, 1.0), *x = frand((size_t)T * H, 1.0);
        float *x2 = fdup(x, (size_t)T * H);
        float *deo = dev_from(eo, nk * H), *dx = dev_from(x, (size_t)T * H);
        float *dx2 = dev_from(x, (size_t)T * H);
        for (int e = 0; e < E; e++) {
            const int n = offs[e + 1] - offs[e];
            hk_moe_scatter(x, eo + (size_t)offs[e] * H, rows + offs[e], n, H);
            RUN(hk_cuda_moe_scatter(dx, deo + (size_t)offs[e] * H,
                                    drows + offs[e], n, H, NULL));
        }
        ok(same_cpu(x, dx, (size_t)T * H, "x"), "moe_scatter T=%d E=%d k=%d", T,
           E, k);
        hk_moe_combine(x2, eo, slot, T, k, H);
        RUN(hk_cuda_moe_combine(dx2, deo, dslot, T, k, H, NULL));
        ok(same_cpu(x2, dx2, (size_t)T * H, "x"), "moe_combine T=%d k=%d H=%d",
           T, k, H);
        CK(hk_cuda_free(dlg));
        CK(hk_cuda_free(dw));
        CK(hk_cuda_free(didx));
        plan_free(&pl);
        CK(hk_cuda_free(dy));
        CK(hk_cuda_free(dxg));
        CK(hk_cuda_free(deo));
        CK(hk_cuda_free(dx));
        CK(hk_cuda_free(dx2));
        free(lg);
        free(idx);
        free(w);
        free(y);
        free(xg);
        free(eo);
        free(x);
        free(x2);
    }
}

/* ---- next-token helpers
 * ------------------------------------------------------
 */

/* The plan alone on routes that the router would not make: every pair to
 * one expert (the rest empty), a few experts of many (most empty), runs
 * of one expert across the warps' ranges, more experts than fit 8 warps'
 * counts (E = 2000: 6 warps), no tokens. */
static void test_moe_plan(void)
{
    /* T, k, E, route: 0 all to expert E - 1, 1 random among E / 64 + 1,
     * 2 runs of 37 pairs, 3 uniform */
    static const int shapes[][4] = {{1000, 1, 16, 0},   {300, 4, 512, 1},
                                    {257, 8, 64, 2},    {5, 2, 3, 0},
                                    {700, 10, 2000, 3}, {0, 4, 8, 3}};
    for (int s = 0; s < grid_n(NSHAPES(shapes), 6); s++) {
        const int T = shapes[s][0], k = shapes[s][1], E = shapes[s][2];
        const size_t nk = (size_t)T * k;
        int *idx = malloc((nk ? nk : 1) * sizeof(int));
        for (size_t i = 0; i < nk; i++) {
            const double u = 0.5 * (urand() + 1.0);
            idx[i] = shapes[s][3] == 0   ? E - 1
                     : shapes[s][3] == 1 ? (int)(u * (E / 64 + 1)) * 64 % E
                     : shapes[s][3] == 2 ? (int)(i / 37 * 7 % (size_t)E)
                                         : (int)(u * E) % E;
        }
        float *w = frand(nk, 1.0);
        int *didx = dev_ints(idx, nk);
        float *dw = dev_from(w, nk);
        plan_pair_t pl;
        ok(plan_both(&pl, idx, w, didx, dw, T, k, E),
           "moe_plan T=%d k=%d E=%d route=%d", T, k, E, shapes[s][3]);
        CK(hk_cuda_free(didx));
        CK(hk_cuda_free(dw));
        plan_free(&pl);
        free(idx);
        free(w);
    }
}

/* Logits for the sampler's tests (the radix select's hard cases). */
enum { LG_RAND, LG_TIES, LG_EQUAL, LG_INF, LG_ZEROS };

static float *sample_logits(size_t n, int kind)
{
    float *lg = frand(n, 8.0);
    for (size_t i = 0; i < n; i++) {
        const int r = (int)(5.0 * (urand() + 1.0)) % 5; /* 0..4 */
        if (kind == LG_TIES) /* five values: long runs at the k-th */
            lg[i] = (float)r;
        else if (kind == LG_EQUAL)
            lg[i] = 2.5f;
        else if (kind == LG_INF) /* -inf, the extremes of f32, smalls */
            lg[i] = r < 2   ? -INFINITY
                    : r < 3 ? (i % 3 ? -FLT_MAX : FLT_MAX)
                            : lg[i] * 1e-30f;
        else if (kind == LG_ZEROS) /* -0 and +0 rank alike, by index */
            lg[i] = r < 2 ? -0.0f : r < 4 ? 0.0f : -1.0f;
    }
    return lg;
}

static void test_sample(void)
{
    /* B, V, k, temperature x 100, splits (0: the launcher's), logits:
     * ties at the threshold over several splits, -inf and +-FLT_MAX at
     * k = HK_CUDA_TOPK_MAX, V < threads with k = V, negative zeros with
     * k = 1 and across the zeros, an all-equal row, the launcher's splits
     * (V = 70000: 8 on the emulator's 4 SMs), k = V = 1, the Qwen3.5
     * vocabulary (248320; full grid only). */
    static const int shapes[][6] = {
        {3, 777, 20, 100, 4, LG_TIES},    {2, 1000, 50, 70, 3, LG_RAND},
        {2, 300, 256, 100, 2, LG_INF},    {1, 40, 40, 100, 0, LG_TIES},
        {2, 517, 1, 130, 5, LG_ZEROS},    {2, 333, 100, 100, 6, LG_ZEROS},
        {1, 1000, 256, 100, 7, LG_EQUAL}, {1, 70000, 20, 100, 0, LG_RAND},
        {1, 1, 1, 100, 0, LG_RAND},       {16, 3000, 64, 100, 0, LG_TIES},
        {2, 5000, 256, 130, 1, LG_RAND},  {2, 4099, 256, 100, 64, LG_TIES},
        {1, 248320, 20, 100, 0, LG_RAND}, {1, 248320, 256, 100, 0, LG_TIES}};
    for (int s = 0; s < grid_n(NSHAPES(shapes), 9); s++) {
        const int B = shapes[s][0], V = shapes[s][1], k = shapes[s][2];
        const int splits = shapes[s][4];
        const double inv_t = 100.0 / shapes[s][3];
        const size_t n = (size_t)B * V;
        float *lg = sample_logits(n, shapes[s][5]);
        int *am = malloc((size_t)B * sizeof(int));
        int *idx = malloc((size_t)B * k * sizeof(int));
        float *p = hmalloc((size_t)B * k), *raw = hmalloc((size_t)B * k);
        double *lse = malloc((size_t)B * sizeof(double));
        double *dlse = malloc((size_t)B * sizeof(double));
        for (int b = 0; b < B; b++) {
            am[b] = hk_argmax(lg + (size_t)b * V, V);
            hk_topk(p + (size_t)b * k, idx + (size_t)b * k, raw + (size_t)b * k,
                    lse + b, lg + (size_t)b * V, V, k, inv_t);
        }
        /* every other shape: rows ld apart, padded with logits that would
         * win if the kernels read past V (a checkpoint's padding rows) */
        const int ld = s % 2 ? V + 7 : V;
        float *pad = hmalloc((size_t)B * ld);
        for (int b = 0; b < B; b++)
            for (int j = 0; j < ld; j++)
                pad[(size_t)b * ld + j] = j < V ? lg[(size_t)b * V + j] : 3e38f;
        const size_t ns = hk_cuda_topk_scratch(B, splits);
        float *dlg = dev_from(pad, (size_t)B * ld);
        float *dp = dev_alloc((size_t)B * k);
        float *dr = dev_alloc((size_t)B * k), *dl = dev_alloc(2 * (size_t)B);
        const size_t na = hk_cuda_argmax_scratch(B, splits);
        float *dscr = dev_alloc(ns), *dascr = dev_alloc(na ? na : 1);
        int *dam = dev_ints(am, B), *didx = dev_ints(idx, (size_t)B * k);
        CK(hk_cuda_memset0(dam, B * sizeof(int), NULL));
        RUN(hk_cuda_argmax(dam, dlg, B, V, ld, 0, NULL, NULL));
        int good = same_ints(am, dam, B, "idx (one block a row)");
        CK(hk_cuda_memset0(dam, B * sizeof(int), NULL));
        RUN(hk_cuda_argmax(dam, dlg, B, V, ld, splits, dascr, NULL));
        ok(good & same_ints(am, dam, B, "idx"),
           "argmax B=%d V=%d ld=%d splits=%d", B, V, ld, splits);
        CK(hk_cuda_memset0(didx, (size_t)B * k * sizeof(int), NULL));
        RUN(hk_cuda_topk(dp, didx, NULL, NULL, dlg, B, V, ld, k, inv_t, splits,
                         dscr, NULL));
        ok(same_ints(idx, didx, (size_t)B * k, "idx") &
               close_cpu(p, dp, (size_t)B * k, ATOL_SEL, RTOL_SEL, "p"),
           "topk B=%d V=%d ld=%d k=%d inv_t=%.3g splits=%d logits=%d", B, V, ld,
           k, inv_t, splits, shapes[s][5]);
        /* with what log-probabilities need: the same candidates, their raw
         * logits exactly, the log-sum-exp to its sum's order */
        CK(hk_cuda_memset0(didx, (size_t)B * k * sizeof(int), NULL));
        RUN(hk_cuda_topk(dp, didx, dr, (double *)(void *)dl, dlg, B, V, ld, k,
                         inv_t, splits, dscr, NULL));
        CK(hk_cuda_d2h(dlse, dl, (size_t)B * sizeof(double), NULL));
        int lse_good = 1;
        for (int b = 0; b < B; b++)
            lse_good &=
                fabs(dlse[b] - lse[b]) <= TOL_LSE * (1.0 + fabs(lse[b]));
        if (!lse_good)
            tap_diag("  lse: row 0 %.17g where the CPU gives %.17g", dlse[0],
                     lse[0]);
        ok(same_ints(idx, didx, (size_t)B * k, "idx") &
               close_cpu(p, dp, (size_t)B * k, ATOL_SEL, RTOL_SEL, "p") &
               same_cpu(raw, dr, (size_t)B * k, "raw") & lse_good,
           "topk with raw logits and lse B=%d V=%d k=%d inv_t=%.3g splits=%d "
           "logits=%d",
           B, V, k, inv_t, splits, shapes[s][5]);
        CK(hk_cuda_free(dlg));
        CK(hk_cuda_free(dp));
        CK(hk_cuda_free(dr));
        CK(hk_cuda_free(dl));
        CK(hk_cuda_free(dscr));
        CK(hk_cuda_free(dascr));
        CK(hk_cuda_free(dam));
        CK(hk_cuda_free(didx));
        free(lg);
        free(pad);
        free(am);
        free(idx);
        free(p);
        free(raw);
        free(lse);
        free(dlse);
    }
}

/* ---- GDN on tensor cores (bf16 inputs), varlen batches ----------------------
 */

/* The tensor-core chunk against the CPU on the same inputs (bf16-rounded q,
 * k, v widened to f32): products of f32 quantities (Tinv, W, S, Vn, P) run
 * as bf16 hi + lo splits, ~2^-16 relative each where f32 is 2^-24, summed
 * over dk <= 256 terms of O(1) entries: ~1e-5 of the O(1) outputs (the
 * emulator's worst element uses 1/20 of this budget; tensor cores may
 * round their f32 sums differently). A dropped lo half (one bf16
 * rounding) errs by ~4e-3, a wrong mask, decay or row by 1e-2 and more. */
#define RTOL_TC 2e-4
#define ATOL_TC 4e-5
/* The same outputs against the CPU on the unrounded f32 inputs: each q, k,
 * v entry moves by up to 2^-9 relative, ~1e-2 of the O(1) outputs after
 * the sums; a wrong chunk or head is off by O(1). */
#define RTOL_BF16 2e-2
#define ATOL_BF16 1e-2
/* HK_CUDA_GDN_TC_FAST against the CPU on the rounded inputs: S, W, Vn and
 * P enter their products rounded to bf16 once (2^-9 relative), as FLA's
 * bf16 path: ~1e-3 of the O(1) outputs; the hi/lo kernels' 1e-5 would fail
 * this. It still catches a wrong mask, decay or row (1e-2 and more).
 * FAST_A (T's hi half alone in kernel A, as FLA's bf16 (I + L)^-1) adds
 * ~1/4: the emulator's worst element at 0.70 of this budget (FAST alone:
 * 0.53; dk = dv = 128, S). */
#define RTOL_FAST 1e-2
#define ATOL_FAST 4e-3
/* The same kernel on the same rows, batched or alone: only the column
 * blocking (BV) may differ, which no element's sum depends on. */
#define RTOL_SAME 1e-6
#define ATOL_SAME 1e-7

/* The variants each tensor-core test runs: the default (blockwise kernel
 * A, split state pass, in registers where dk allows), v1's state pass, the
 * fast products, the single-buffered state pass, the fast products with
 * kernel A's on T's hi half too (HYPIC_CUDA_GDN=tc_bf16's), the state pass
 * in shared memory (kernel P: split and fast), kernel A3 with the default's
 * passes, the outputs fused into the pass in registers (ro: split and
 * fast); then (the full grid: make test-cuda-emu) A3 with the fused
 * outputs, with the fast_a pair and with v1, the first kernel A with
 * the first three and the fast_a pair, kernel R on 64 columns (r64:
 * where the emulator's 4 SMs take it, dk = 128) and with three buffers
 * (deep, where they fit). */
static const unsigned tc_vflags[] = {
    0,
    HK_CUDA_GDN_TC_V1,
    HK_CUDA_GDN_TC_FAST,
    HK_CUDA_GDN_TC_PSHARE,
    HK_CUDA_GDN_TC_FAST | HK_CUDA_GDN_TC_FAST_A,
    HK_CUDA_GDN_TC_SMEM,
    HK_CUDA_GDN_TC_SMEM | HK_CUDA_GDN_TC_FAST,
    HK_CUDA_GDN_TC_A3,
    HK_CUDA_GDN_TC_FUSE_O,
    HK_CUDA_GDN_TC_FUSE_O | HK_CUDA_GDN_TC_FAST,
    HK_CUDA_GDN_TC_A3 | HK_CUDA_GDN_TC_FUSE_O,
    HK_CUDA_GDN_TC_A3 | HK_CUDA_GDN_TC_FAST | HK_CUDA_GDN_TC_FAST_A,
    HK_CUDA_GDN_TC_A3 | HK_CUDA_GDN_TC_V1,
    HK_CUDA_GDN_TC_A1,
    HK_CUDA_GDN_TC_A1 | HK_CUDA_GDN_TC_V1,
    HK_CUDA_GDN_TC_A1 | HK_CUDA_GDN_TC_FAST,
    HK_CUDA_GDN_TC_A1 | HK_CUDA_GDN_TC_FAST | HK_CUDA_GDN_TC_FAST_A,
    HK_CUDA_GDN_TC_R64,
    HK_CUDA_GDN_TC_DEEP};
static const char *const tc_vname[] = {"",
                                       " v1",
                                       " fast",
                                       " ps",
                                       " fast fast_a",
                                       " p",
                                       " p fast",
                                       " a3",
                                       " ro",
                                       " ro fast",
                                       " a3 ro",
                                       " a3 fast fast_a",
                                       " a3 v1",
                                       " a1",
                                       " a1 v1",
                                       " a1 fast",
                                       " a1 fast fast_a",
                                       " r64",
                                       " deep"};
#define TC_NVAR grid_n(NSHAPES(tc_vflags), 10)

/* Whether a call with these flags runs the state pass in registers
 * (hk_tc_plan_for): dk a multiple of 64 up to 256, neither kernel P asked
 * for nor v1's or the single-buffered pass. */
static int tc_runs_reg(unsigned flags, int dk)
{
    return !(flags & (HK_CUDA_GDN_TC_SMEM | HK_CUDA_GDN_TC_V1 |
                      HK_CUDA_GDN_TC_PSHARE)) &&
           dk % 64 == 0 && dk <= 256;
}

/* q, k, v of p as bf16 on the device (p's copies rounded in place). */
typedef struct {
    uint16_t *q, *k, *v;
} gdn_bf16_t;

static gdn_bf16_t gdn_upload_bf16(gdn_prob_t *p)
{
    const size_t nq = (size_t)p->T * p->Hk * p->dk;
    const size_t nv = (size_t)p->T * p->Hv * p->dv;
    uint16_t *q = round_bf16(p->q, nq), *k = round_bf16(p->k, nq);
    uint16_t *v = round_bf16(p->v, nv);
    gdn_bf16_t d = {dev_u16(q, nq), dev_u16(k, nq), dev_u16(v, nv)};
    free(q);
    free(k);
    free(v);
    return d;
}

static void gdn_bf16_free(gdn_bf16_t *d)
{
    CK(hk_cuda_free(d->q));
    CK(hk_cuda_free(d->k));
    CK(hk_cuda_free(d->v));
}

/* The side streams of the chunk calls with HK_CUDA_GDN_TC_OVERLAP, made
 * at the first (NULL if that fails, which the call then refuses). */
static hk_cuda_lanes_t *test_lanes(void)
{
    static hk_cuda_lanes_t *l;
    if (!l)
        CK(hk_cuda_lanes_create(&l));
    return l;
}

/* One bf16-in chunked call over the sequences of cu (host offsets). */
static void tc_run(float *dO, float **dS, float **dTc, const gdn_bf16_t *x,
                   const gdn_dev_t *f, const int *cu, int nseq, int Hk, int Hv,
                   int dk, int dv, int C, unsigned flags)
{
    const int T = cu[nseq];
    void *dst = dev_ptrs(dS, nseq), *dtc = dTc ? dev_ptrs(dTc, nseq) : NULL;
    int *dcu = dev_ints(cu, (size_t)nseq + 1);
    float *scr =
        dev_alloc(hk_cuda_gdn_chunk_bf16_scratch(T, nseq, Hv, dk, dv, C));
    if (flags)
        RUN(hk_cuda_gdn_chunk_bf16_ex(dO, dst, dtc, x->q, x->k, x->v, f->g,
                                      f->beta, dcu, nseq, T, Hk, Hv, dk, dv, C,
                                      scr, flags, test_lanes(), NULL));
    else
        RUN(hk_cuda_gdn_chunk_bf16(dO, dst, dtc, x->q, x->k, x->v, f->g,
                                   f->beta, dcu, nseq, T, Hk, Hv, dk, dv, C,
                                   scr, NULL));
    CK(hk_cuda_free(dst));
    CK(hk_cuda_free(dtc));
    CK(hk_cuda_free(dcu));
    CK(hk_cuda_free(scr));
}

/* The f32 entry (q, k, v split into bf16 hi + lo by it) on f's inputs,
 * one sequence cu, with flags. */
static void tc_run_f32(float *dO, float **dS, float **dTc, const gdn_dev_t *f,
                       const int *cu, int Hk, int Hv, int dk, int dv, int C,
                       unsigned flags)
{
    const int T = cu[1];
    void *dst = dev_ptrs(dS, 1), *dtc = dTc ? dev_ptrs(dTc, 1) : NULL;
    int *dcu = dev_ints(cu, 2);
    float *scr =
        dev_alloc(hk_cuda_gdn_chunk_tc_scratch(T, 1, Hk, Hv, dk, dv, C));
    RUN(hk_cuda_gdn_chunk_tc_ex(dO, dst, dtc, f->q, f->k, f->v, f->g, f->beta,
                                dcu, 1, T, Hk, Hv, dk, dv, C, scr, flags,
                                test_lanes(), NULL));
    CK(hk_cuda_free(dst));
    CK(hk_cuda_free(dtc));
    CK(hk_cuda_free(dcu));
    CK(hk_cuda_free(scr));
}

/* The f32 entry with HK_CUDA_GDN_TC_ROUND | flags on the unrounded inputs
 * fu and state S0 (one sequence, cu) against the bf16 entry's dO, dS, dTc (Tc:
 * NULL for none) with flags on them rounded: bit for bit, the same kernels on
 * the same bf16 values (a lo half kept, or another rounding, differs). */
static int tc_round_same(const float *dO, const float *dS, const float *dTc,
                         const gdn_dev_t *fu, const float *S0, const int *cu,
                         int Hk, int Hv, int dk, int dv, int C, size_t ns,
                         size_t nt, unsigned flags)
{
    const int T = cu[1];
    const size_t no = (size_t)T * Hv * dv;
    float *o = host_from(dO, no), *S = host_from(dS, ns);
    float *Tc = dTc ? host_from(dTc, nt) : NULL;
    float *rS = dev_from(S0, ns), *rO = dev_alloc(no);
    float *rTc = dTc ? dev_alloc(nt) : NULL;
    tc_run_f32(rO, &rS, dTc ? &rTc : NULL, fu, cu, Hk, Hv, dk, dv, C,
               flags | HK_CUDA_GDN_TC_ROUND);
    int good = same_cpu(o, rO, no, "o") & same_cpu(S, rS, ns, "S");
    if (dTc)
        good &= same_cpu(Tc, rTc, nt, "Tc");
    CK(hk_cuda_free(rS));
    CK(hk_cuda_free(rO));
    CK(hk_cuda_free(rTc));
    free(o);
    free(S);
    free(Tc);
    return good;
}

/* One sequence: against the CPU on the rounded inputs, the f32 CUDA kernel
 * on the same inputs, and the CPU on the unrounded inputs. */
static void test_gdn_chunk_bf16(void)
{
    /* T, Hk, Hv, dk, dv, C, want Tc: T = 0 (Tc = I), a partial chunk and
     * a partial 16-token tile, GQA, BV = 16 and 32 (the emulator has 4
     * SMs), C = 16, 32, 64, dk = 256; dk and dv not multiples of 32 (the
     * blockwise kernel A's 64-column panels end short), three chunks of
     * 64, the last of 29 tokens. */
    static const int shapes[][7] = {
        {0, 1, 1, 16, 16, 16, 1},     {37, 1, 2, 32, 16, 16, 1},
        {70, 1, 2, 64, 32, 64, 1},    {130, 2, 4, 64, 64, 32, 0},
        {100, 1, 2, 128, 128, 64, 1}, {20, 1, 1, 256, 32, 16, 1},
        {157, 1, 3, 48, 48, 64, 1}};
    for (int s = 0; s < grid_n(NSHAPES(shapes), 3); s++) {
        const int C = shapes[s][5], want_tc = shapes[s][6];
        gdn_prob_t p;
        gdn_prob_make(&p, shapes[s][0], shapes[s][1], shapes[s][2],
                      shapes[s][3], shapes[s][4]);
        const int T = p.T, Hk = p.Hk, Hv = p.Hv, dk = p.dk, dv = p.dv;
        const size_t no = (size_t)T * Hv * dv, ns = (size_t)Hv * dk * dv;
        const size_t nt = (size_t)Hv * dk * dk;
        float *scr = hmalloc(hk_gdn_chunk_scratch(Hv, dk, dv, C));
        /* CPU on the f32 inputs, before rounding */
        float *o2 = hmalloc(no), *S2 = fdup(p.S0, ns), *Tc2 = hmalloc(nt);
        hk_gdn_chunk(o2, S2, Tc2, p.q, p.k, p.v, p.g, p.beta, T, Hk, Hv, dk, dv,
                     C, scr);
        gdn_dev_t fu = gdn_upload(&p); /* unrounded, for the f32 entry */
        gdn_bf16_t x = gdn_upload_bf16(&p);
        gdn_dev_t f = gdn_upload(&p); /* the rounded values, as f32 */
        float *o1 = hmalloc(no), *S1 = fdup(p.S0, ns), *Tc1 = hmalloc(nt);
        hk_gdn_chunk(o1, S1, Tc1, p.q, p.k, p.v, p.g, p.beta, T, Hk, Hv, dk, dv,
                     C, scr);
        /* the f32 CUDA kernel on the same inputs */
        float *dS3 = dev_from(p.S0, ns), *dO3 = dev_alloc(no);
        float *dTc3 = dev_alloc(nt);
        float *dscr = dev_alloc(hk_cuda_gdn_chunk_scratch(T, Hv, dk, dv, C));
        RUN(hk_cuda_gdn_chunk(dO3, dS3, dTc3, f.q, f.k, f.v, f.g, f.beta, T, Hk,
                              Hv, dk, dv, C, dscr, NULL));
        float *o3 = host_from(dO3, no), *S3 = host_from(dS3, ns);
        float *Tc3 = host_from(dTc3, nt);

        /* each structure (v2, v1), v2's fast precision, the first
         * kernel A */
        for (int vi = 0; vi < TC_NVAR; vi++) {
            const unsigned *vflags = tc_vflags;
            const char *const *vname = tc_vname;
            const int fast = (vflags[vi] & HK_CUDA_GDN_TC_FAST) != 0;
            const double at = fast ? ATOL_FAST : ATOL_TC;
            const double rt = fast ? RTOL_FAST : RTOL_TC;
            float *dS = dev_from(p.S0, ns), *dO = dev_alloc(no);
            float *dTc = want_tc ? dev_alloc(nt) : NULL;
            const int cu[2] = {0, T};
            tc_run(dO, &dS, want_tc ? &dTc : NULL, &x, &f, cu, 1, Hk, Hv, dk,
                   dv, C, vflags[vi]);
            int good = close_cpu(o1, dO, no, at, rt, "o vs CPU");
            good &= close_cpu(S1, dS, ns, at, rt, "S vs CPU");
            good &= close_cpu(o3, dO, no, at, rt, "o vs f32 kernel");
            good &= close_cpu(S3, dS, ns, at, rt, "S vs f32 kernel");
            good &=
                close_cpu(o2, dO, no, ATOL_BF16, RTOL_BF16, "o vs f32 inputs");
            good &=
                close_cpu(S2, dS, ns, ATOL_BF16, RTOL_BF16, "S vs f32 inputs");
            if (want_tc) {
                good &= close_cpu(Tc1, dTc, nt, at, rt, "Tc vs CPU");
                good &= close_cpu(Tc3, dTc, nt, at, rt, "Tc vs f32 kernel");
                good &= close_cpu(Tc2, dTc, nt, ATOL_BF16, RTOL_BF16,
                                  "Tc vs f32 inputs");
            }
            /* what ran: the pass in registers where dk allows it */
            char kn[32] = "?";
            const int reg = tc_runs_reg(vflags[vi], dk);
            good &= hk_cuda_gdn_tc_kernels(kn, sizeof kn, T, 1, Hk, Hv, dk, dv,
                                           C, 0, want_tc, vflags[vi]) == 0 &&
                    (strstr(kn, " R") != NULL) == reg;
            ok(good,
               "gdn_chunk_bf16%s [%s] T=%d Hk=%d Hv=%d dk=%d dv=%d C=%d%s",
               vname[vi], kn, T, Hk, Hv, dk, dv, C, want_tc ? " +Tc" : "");
            /* HYPIC_CUDA_GDN=tc_bf16's call (fast) and a bf16 checkpoint's
             * (the default's products, with kernel A2 or A3) */
            const int round =
                fast || (vflags[vi] & ~(unsigned)(HK_CUDA_GDN_TC_A3 |
                                                  HK_CUDA_GDN_TC_FUSE_O)) == 0;
            if (round)
                good = tc_round_same(dO, dS, dTc, &fu, p.S0, cu, Hk, Hv, dk, dv,
                                     C, ns, nt, vflags[vi]);
            if (round)
                ok(good,
                   "gdn_chunk_tc ROUND%s (f32 in, rounded once) = the bf16 "
                   "entry bit for bit T=%d Hk=%d Hv=%d dk=%d dv=%d C=%d%s",
                   vname[vi], T, Hk, Hv, dk, dv, C, want_tc ? " +Tc" : "");
            CK(hk_cuda_free(dS));
            CK(hk_cuda_free(dO));
            CK(hk_cuda_free(dTc));
        }
        gdn_dev_free(&fu);
        gdn_bf16_free(&x);
        gdn_dev_free(&f);
        CK(hk_cuda_free(dS3));
        CK(hk_cuda_free(dO3));
        CK(hk_cuda_free(dTc3));
        CK(hk_cuda_free(dscr));
        free(scr);
        free(o1);
        free(S1);
        free(Tc1);
        free(o2);
        free(S2);
        free(Tc2);
        free(o3);
        free(S3);
        free(Tc3);
        gdn_prob_free(&p);
    }
}

/* Variants of kernels R and O that change how they run, not what they
 * sum, against the default on the same inputs: o, S and T_C bit for bit,
 * and the kernels each ran. R64 (64 columns on 8 state warps; the
 * emulator's 4 SMs are fewer than the 32-column blocks of both dk = 128
 * shapes), DEEP (each chunk's tiles two chunks ahead in three buffers: 10
 * and 13 chunks at dk = 64, and the dk = 128 shape; and with the fused
 * outputs against them alone) and O64 (kernel O on 64 columns: dv = 128
 * and 64, after R and after P), split and fast, with and without T_C;
 * R64 asked for with the fused outputs runs them fused, not R64 (their
 * sums are in another order: the tuner may offer R64 in a fused mode);
 * each also through the f32 entry (K's lo rows: R64's 225 KB; Q's lo rows
 * in O64's). The default is held to the CPU by test_gdn_chunk_bf16 and
 * test_gdn_chunk_tc. */
static void test_gdn_chunk_same(void)
{
    static const struct {
        int T, Hk, Hv, dk, dv, C, want_tc, f32; /* f32: the f32 entry */
        unsigned flags;
        const char *name, *runs, *dflt; /* the kernel names: variant's,
                                           default's */
    } cases[] = {
        {100, 1, 2, 128, 128, 64, 0, 0, HK_CUDA_GDN_TC_R64, "r64", " R64x1 O",
         " R32x2 O"},
        {70, 2, 2, 128, 128, 64, 1, 0, HK_CUDA_GDN_TC_R64, "r64", " R64x1 O",
         " R32x2 O"},
        {300, 1, 2, 64, 64, 32, 1, 0, HK_CUDA_GDN_TC_DEEP, "deep", " R32x1/3 O",
         " R32x1 O"},
        {200, 2, 2, 64, 32, 16, 0, 0, HK_CUDA_GDN_TC_DEEP, "deep", " R16x1/3 O",
         " R16x1 O"},
        {100, 1, 2, 128, 128, 64, 1, 0, HK_CUDA_GDN_TC_DEEP, "deep",
         " R32x2/3 O", " R32x2 O"},
        {300, 1, 2, 64, 64, 32, 1, 0,
         HK_CUDA_GDN_TC_DEEP | HK_CUDA_GDN_TC_FUSE_O, "deep ro", " R32x1/3+O",
         " R32x1+O"},
        {100, 1, 2, 128, 128, 64, 1, 1, HK_CUDA_GDN_TC_R64, "f32 r64",
         " R64x1 O", " R32x2 O"},
        {300, 1, 2, 64, 64, 32, 1, 1, HK_CUDA_GDN_TC_DEEP, "f32 deep",
         " R32x1/3 O", " R32x1 O"},
        {100, 1, 2, 128, 128, 64, 1, 0, HK_CUDA_GDN_TC_O64, "o64", " R32x2 O64",
         " R32x2 O"},
        {200, 2, 2, 64, 64, 16, 0, 0, HK_CUDA_GDN_TC_O64, "o64", " R32x1 O64",
         " R32x1 O"},
        {100, 1, 2, 128, 128, 64, 0, 0,
         HK_CUDA_GDN_TC_SMEM | HK_CUDA_GDN_TC_O64, "p o64", " P32 O64",
         " P32 O"},
        {100, 1, 2, 128, 128, 64, 1, 1, HK_CUDA_GDN_TC_O64, "f32 o64",
         " R32x2 O64", " R32x2 O"},
        {70, 2, 2, 128, 128, 64, 1, 0,
         HK_CUDA_GDN_TC_R64 | HK_CUDA_GDN_TC_FUSE_O, "r64 ro", " R32x2+O",
         " R32x2+O"},
        /* W8: 16 columns (Vn on warps 0-3), 32 (on all 8), T_C,
         * f32 in, with DEEP, at dk = 256; not with R64's 64; fused
         * (12 warps) at dk = 128, not at 256 (MT = 2) */
        {100, 1, 1, 128, 32, 64, 0, 0, HK_CUDA_GDN_TC_W8, "w8", " R16x2w8 O",
         " R16x2 O"},
        {70, 2, 2, 128, 128, 64, 1, 0, HK_CUDA_GDN_TC_W8, "w8", " R32x2w8 O",
         " R32x2 O"},
        {100, 1, 2, 128, 128, 64, 1, 1, HK_CUDA_GDN_TC_W8, "f32 w8",
         " R32x2w8 O", " R32x2 O"},
        {100, 1, 2, 128, 128, 64, 1, 0, HK_CUDA_GDN_TC_W8 | HK_CUDA_GDN_TC_DEEP,
         "w8 deep", " R32x2w8/3 O", " R32x2 O"},
        {40, 1, 1, 256, 64, 32, 0, 0, HK_CUDA_GDN_TC_W8, "w8", " R16x4w8 O",
         " R16x4 O"},
        {40, 1, 1, 256, 64, 32, 1, 0, HK_CUDA_GDN_TC_W8, "w8", " R32x4w8 O",
         " R32x4 O"},
        {70, 2, 2, 128, 128, 64, 1, 0, HK_CUDA_GDN_TC_W8 | HK_CUDA_GDN_TC_R64,
         "w8 r64", " R64x1 O", " R32x2 O"},
        {70, 2, 2, 128, 128, 64, 1, 0,
         HK_CUDA_GDN_TC_W8 | HK_CUDA_GDN_TC_FUSE_O, "w8 ro", " R32x2w8+O",
         " R32x2+O"},
        {100, 1, 1, 128, 32, 64, 0, 0,
         HK_CUDA_GDN_TC_W8 | HK_CUDA_GDN_TC_FUSE_O, "w8 ro", " R16x2w8+O",
         " R16x2+O"},
        {100, 1, 1, 128, 32, 64, 0, 1,
         HK_CUDA_GDN_TC_W8 | HK_CUDA_GDN_TC_FUSE_O, "f32 w8 ro", " R16x2w8+O",
         " R16x2+O"},
        {40, 1, 1, 256, 32, 32, 0, 0, HK_CUDA_GDN_TC_W8 | HK_CUDA_GDN_TC_FUSE_O,
         "w8 ro", " R16x4+O", " R16x4+O"},
        /* OVERLAP: 5 segments (11 slots), 7 (14), 2 (5 or 4) of the
         * launches on the lanes; with T_C, fused, kernel P, f32 in, W8
         * (16 columns: its 2 blocks fill half the emulator's 4 SMs); one
         * segment (T <= C); the pass wider where 16 (32) columns would fill
         * more than half the SMs: 32, and R64's 64 at dk = 128 */
        {300, 1, 2, 64, 64, 32, 1, 0, HK_CUDA_GDN_TC_OVERLAP, "ov",
         " R32x1 O ov", " R32x1 O"},
        {200, 2, 2, 64, 32, 16, 0, 0, HK_CUDA_GDN_TC_OVERLAP, "ov",
         " R32x1 O ov", " R16x1 O"},
        {300, 1, 2, 64, 64, 32, 1, 0,
         HK_CUDA_GDN_TC_OVERLAP | HK_CUDA_GDN_TC_FUSE_O, "ov ro", " R32x1+O ov",
         " R32x1+O"},
        {300, 1, 2, 64, 64, 32, 1, 0,
         HK_CUDA_GDN_TC_OVERLAP | HK_CUDA_GDN_TC_SMEM, "ov p", " O ov",
         " P32 O"},
        {300, 1, 2, 64, 64, 32, 1, 1, HK_CUDA_GDN_TC_OVERLAP, "f32 ov",
         " R32x1 O ov", " R32x1 O"},
        {200, 1, 1, 128, 32, 64, 0, 0,
         HK_CUDA_GDN_TC_OVERLAP | HK_CUDA_GDN_TC_W8, "ov w8", " R16x2w8 O ov",
         " R16x2 O"},
        {200, 1, 2, 128, 128, 64, 1, 0, HK_CUDA_GDN_TC_OVERLAP, "ov",
         " R64x1 O ov", " R32x2 O"},
        {40, 1, 2, 64, 64, 64, 1, 0, HK_CUDA_GDN_TC_OVERLAP, "ov", " O ov",
         " R32x1 O"}};
    static const unsigned extra[2] = {0, HK_CUDA_GDN_TC_FAST};
    for (int cs = 0; cs < (int)NSHAPES(cases); cs++)
        for (int e = 0; e < 2; e++) {
            const int T = cases[cs].T, Hk = cases[cs].Hk, Hv = cases[cs].Hv;
            const int dk = cases[cs].dk, dv = cases[cs].dv, C = cases[cs].C;
            const int want_tc = cases[cs].want_tc;
            gdn_prob_t p;
            gdn_prob_make(&p, T, Hk, Hv, dk, dv);
            gdn_dev_t fu = gdn_upload(&p); /* unrounded: the f32 entry's */
            gdn_bf16_t x = gdn_upload_bf16(&p);
            gdn_dev_t f = gdn_upload(&p);
            const size_t no = (size_t)T * Hv * dv, ns = (size_t)Hv * dk * dv;
            const size_t nt = (size_t)Hv * dk * dk;
            const int cu[2] = {0, T};
            float *dO[2], *dS[2], *dTc[2] = {NULL, NULL};
            char kn[2][32];
            for (int v = 0; v < 2; v++) {
                /* the default: the case's FUSE_O or SMEM alone, if it has
                 * them */
                const unsigned fl =
                    extra[e] | (v ? cases[cs].flags
                                  : cases[cs].flags & (HK_CUDA_GDN_TC_FUSE_O |
                                                       HK_CUDA_GDN_TC_SMEM));
                dO[v] = dev_alloc(no);
                dS[v] = dev_from(p.S0, ns);
                if (want_tc)
                    dTc[v] = dev_alloc(nt);
                if (cases[cs].f32)
                    tc_run_f32(dO[v], &dS[v], want_tc ? &dTc[v] : NULL, &fu, cu,
                               Hk, Hv, dk, dv, C, fl);
                else
                    tc_run(dO[v], &dS[v], want_tc ? &dTc[v] : NULL, &x, &f, cu,
                           1, Hk, Hv, dk, dv, C, fl);
                strcpy(kn[v], "?");
                if (hk_cuda_gdn_tc_kernels(kn[v], sizeof kn[v], T, 1, Hk, Hv,
                                           dk, dv, C, cases[cs].f32, want_tc,
                                           fl))
                    strcpy(kn[v], "refused");
            }
            float *o0 = host_from(dO[0], no), *S0 = host_from(dS[0], ns);
            int good =
                same_cpu(o0, dO[1], no, "o") & same_cpu(S0, dS[1], ns, "S");
            if (want_tc) {
                float *T0 = host_from(dTc[0], nt);
                good &= same_cpu(T0, dTc[1], nt, "Tc");
                free(T0);
            }
            good &= strstr(kn[1], cases[cs].runs) != NULL &&
                    strstr(kn[0], cases[cs].dflt) != NULL;
            ok(good,
               "%s %s%s [%s] = [%s] bit for bit T=%d Hk=%d Hv=%d dk=%d dv=%d "
               "C=%d%s",
               cases[cs].f32 ? "gdn_chunk_tc (f32 in)" : "gdn_chunk_bf16",
               cases[cs].name + (cases[cs].f32 ? 4 : 0), e ? " fast" : "",
               kn[1], kn[0], T, Hk, Hv, dk, dv, C, want_tc ? " +Tc" : "");
            for (int v = 0; v < 2; v++) {
                CK(hk_cuda_free(dO[v]));
                CK(hk_cuda_free(dS[v]));
                CK(hk_cuda_free(dTc[v]));
            }
            free(o0);
            free(S0);
            gdn_bf16_free(&x);
            gdn_dev_free(&fu);
            gdn_dev_free(&f);
            gdn_prob_free(&p);
        }
}

/* Several sequences in one call: each must come out as the CPU gives it
 * alone, and as the same kernel gives it alone. Empty sequences keep their
 * state and get Tc = I. */
static void test_gdn_chunk_varlen(void)
{
#define VL_MAX 6
    static const struct {
        int nseq, len[VL_MAX], Hk, Hv, dk, dv, C;
    } cases[] = {{5, {5, 0, 70, 16, 33}, 1, 2, 64, 32, 32},
                 {4, {130, 64, 1, 200}, 2, 4, 64, 64, 64},
                 {3, {17, 1, 50}, 2, 2, 16, 48, 16}};
    /* the first two cases' dk = 64 run the pass in registers by default,
     * in shared memory with _SMEM */
    static const unsigned vflags[8] = {0,
                                       HK_CUDA_GDN_TC_V1,
                                       HK_CUDA_GDN_TC_PSHARE,
                                       HK_CUDA_GDN_TC_SMEM,
                                       HK_CUDA_GDN_TC_A3,
                                       HK_CUDA_GDN_TC_FUSE_O,
                                       HK_CUDA_GDN_TC_OVERLAP,
                                       HK_CUDA_GDN_TC_A1};
    static const char *const vname[8] = {"",    " v1", " ps", " p",
                                         " a3", " ro", " ov", " a1"};
    const int nv = grid_n(8, 7); /* kernel A1: the full grid */
    for (int vs = 0; vs < nv * grid_n(NSHAPES(cases), 1); vs++) {
        const int s = vs / nv; /* each case in v2, v1, ..., with A3, A1 */
        const unsigned flags = vflags[vs % nv];
        const int nseq = cases[s].nseq, Hk = cases[s].Hk, Hv = cases[s].Hv;
        const int dk = cases[s].dk, dv = cases[s].dv, C = cases[s].C;
        int cu[VL_MAX + 1] = {0};
        for (int b = 0; b < nseq; b++)
            cu[b + 1] = cu[b] + cases[s].len[b];
        const int T = cu[nseq];
        gdn_prob_t p;
        gdn_prob_make(&p, T, Hk, Hv, dk, dv);
        gdn_bf16_t x = gdn_upload_bf16(&p);
        gdn_dev_t f = gdn_upload(&p);
        const size_t ns = (size_t)Hv * dk * dv, nt = (size_t)Hv * dk * dk;
        const size_t no = (size_t)T * Hv * dv, ldq = (size_t)Hk * dk;
        const size_t ldv = (size_t)Hv * dv;
        float *o = hmalloc(no), *S[VL_MAX], *Tc[VL_MAX];
        float *dS[VL_MAX], *dTc[VL_MAX], *dS1[VL_MAX], *dTc1[VL_MAX];
        float *scr = hmalloc(hk_gdn_chunk_scratch(Hv, dk, dv, C));
        float *dO = dev_alloc(no), *dO1 = dev_alloc(no);
        for (int b = 0; b < nseq; b++) {
            const size_t r = (size_t)cu[b];
            S[b] = hmalloc(ns);
            for (size_t e = 0; e < ns; e++)
                S[b][e] = (float)(0.5 * nrand());
            Tc[b] = hmalloc(nt);
            dS[b] = dev_from(S[b], ns);
            dS1[b] = dev_from(S[b], ns);
            dTc[b] = dev_alloc(nt);
            dTc1[b] = dev_alloc(nt);
            hk_gdn_chunk(o + r * ldv, S[b], Tc[b], p.q + r * ldq, p.k + r * ldq,
                         p.v + r * ldv, p.g + r * Hv, p.beta + r * Hv,
                         cases[s].len[b], Hk, Hv, dk, dv, C, scr);
        }
        tc_run(dO, dS, dTc, &x, &f, cu, nseq, Hk, Hv, dk, dv, C, flags);
        for (int b = 0; b < nseq; b++) { /* each alone, same kernel */
            const size_t r = (size_t)cu[b];
            const gdn_bf16_t xb = {x.q + r * ldq, x.k + r * ldq, x.v + r * ldv};
            const gdn_dev_t fb = {NULL, NULL, NULL, f.g + r * Hv,
                                  f.beta + r * Hv};
            const int cub[2] = {0, cases[s].len[b]};
            tc_run(dO1 + r * ldv, &dS1[b], &dTc1[b], &xb, &fb, cub, 1, Hk, Hv,
                   dk, dv, C, flags);
        }
        int good = close_cpu(o, dO, no, ATOL_TC, RTOL_TC, "o vs CPU");
        float *o1 = host_from(dO1, no);
        good &= close_cpu(o1, dO, no, ATOL_SAME, RTOL_SAME, "o vs alone");
        for (int b = 0; b < nseq; b++) {
            good &= close_cpu(S[b], dS[b], ns, ATOL_TC, RTOL_TC, "S vs CPU");
            good &= close_cpu(Tc[b], dTc[b], nt, ATOL_TC, RTOL_TC, "Tc vs CPU");
            float *S1 = host_from(dS1[b], ns), *Tc1 = host_from(dTc1[b], nt);
            good &=
                close_cpu(S1, dS[b], ns, ATOL_SAME, RTOL_SAME, "S vs alone");
            good &=
                close_cpu(Tc1, dTc[b], nt, ATOL_SAME, RTOL_SAME, "Tc vs alone");
            free(S1);
            free(Tc1);
            CK(hk_cuda_free(dS[b]));
            CK(hk_cuda_free(dS1[b]));
            CK(hk_cuda_free(dTc[b]));
            CK(hk_cuda_free(dTc1[b]));
            free(S[b]);
            free(Tc[b]);
        }
        ok(good,
           "gdn_chunk_bf16%s varlen nseq=%d T=%d Hk=%d Hv=%d dk=%d dv=%d "
           "C=%d +Tc",
           vname[vs % nv], nseq, T, Hk, Hv, dk, dv, C);
        gdn_bf16_free(&x);
        gdn_dev_free(&f);
        CK(hk_cuda_free(dO));
        CK(hk_cuda_free(dO1));
        free(o1);
        free(o);
        free(scr);
        gdn_prob_free(&p);
    }
#undef VL_MAX
}

/* The tensor-core chunk on f32 inputs (hk_cuda_gdn_chunk_tc, the engine's
 * prefill), each structure (v2, v1) and v2's fast precision: against the
 * CPU on the same unrounded inputs, within the bf16 kernel's budget against
 * its rounded ones (RTOL_TC: every operand keeps ~16 bits; an input without
 * its lo half errs by ~2^-9, 1e-2 of the outputs), one case of several
 * sequences (an empty one) in one call. Fast also drops q's and k's lo
 * halves in the state pass and the outputs, so it is held to the bf16
 * kernel's budget against unrounded inputs (RTOL_BF16; RTOL_FAST failed on
 * some inputs here, 1.26 of it at T = 70, C = 64, with either kernel A). */
/* The f32 entry on q, k, v at an odd float offset (its split pass one
 * element a thread instead of 16 bytes) = on aligned ones, bit for bit:
 * o and the states, split (hi + lo) and rounded once (ROUND). */
static int tc_unaligned_same(const gdn_prob_t *p, const gdn_dev_t *f,
                             float *const *S0, int nseq, const int *dcu, int T,
                             int Hk, int Hv, int dk, int dv, int C, float *dscr,
                             unsigned flags)
{
    const size_t nq = (size_t)T * Hk * dk, nv = (size_t)T * Hv * dv;
    const size_t no = nv, ns = (size_t)Hv * dk * dv;
    float *base[3], *oq = dev_from_odd(p->q, nq, &base[0]);
    float *ok_ = dev_from_odd(p->k, nq, &base[1]);
    float *ov = dev_from_odd(p->v, nv, &base[2]);
    float *out[2][4] = {{0}}; /* o, then each sequence's state */
    int good = 1;
    for (int u = 0; u < 2; u++) {
        float *dS[3];
        for (int b = 0; b < nseq; b++)
            dS[b] = dev_from(S0[b], ns);
        void *dst = dev_ptrs(dS, nseq);
        float *dO = dev_alloc(no);
        RUN(hk_cuda_gdn_chunk_tc_ex(dO, dst, NULL, u ? oq : f->q,
                                    u ? ok_ : f->k, u ? ov : f->v, f->g,
                                    f->beta, dcu, nseq, T, Hk, Hv, dk, dv, C,
                                    dscr, flags, test_lanes(), NULL));
        out[u][0] = host_from(dO, no);
        for (int b = 0; b < nseq; b++) {
            out[u][1 + b] = host_from(dS[b], ns);
            CK(hk_cuda_free(dS[b]));
        }
        CK(hk_cuda_free(dst));
        CK(hk_cuda_free(dO));
    }
    good &= !memcmp(out[0][0], out[1][0], no * sizeof(float));
    for (int b = 0; b < nseq; b++)
        good &= !memcmp(out[0][1 + b], out[1][1 + b], ns * sizeof(float));
    for (int u = 0; u < 2; u++)
        for (int b = 0; b <= nseq; b++)
            free(out[u][b]);
    for (int i = 0; i < 3; i++)
        CK(hk_cuda_free(base[i]));
    return good;
}

static void test_gdn_chunk_tc(void)
{
    /* T, Hk, Hv, dk, dv, C, want Tc (test_gdn_chunk_bf16's shapes) */
    static const int shapes[][7] = {{37, 1, 2, 32, 16, 16, 1},
                                    {70, 1, 2, 64, 32, 64, 1},
                                    {0, 1, 1, 16, 16, 16, 1},
                                    {130, 2, 4, 64, 64, 32, 0},
                                    {100, 1, 2, 128, 128, 64, 1}};
    const unsigned *vflags = tc_vflags;
    const char *const *vname = tc_vname;
    const int nshape = grid_n(NSHAPES(shapes), 2);
    for (int s = 0; s <= nshape; s++) {
        /* s == nshape: sequences of 5, 0 and 40 tokens in one call */
        const int vl = s == nshape, nseq = vl ? 3 : 1;
        const int *sh = vl ? (const int[]){45, 1, 2, 32, 32, 32, 1} : shapes[s];
        int cu[4] = {0, sh[0], sh[0], sh[0]};
        if (vl)
            cu[1] = cu[2] = 5;
        const int T = sh[0], Hk = sh[1], Hv = sh[2], dk = sh[3], dv = sh[4];
        const int C = sh[5], want_tc = sh[6];
        gdn_prob_t p;
        gdn_prob_make(&p, T, Hk, Hv, dk, dv);
        const size_t no = (size_t)T * Hv * dv, ns = (size_t)Hv * dk * dv;
        const size_t nt = (size_t)Hv * dk * dk, ldq = (size_t)Hk * dk;
        const size_t ldv = (size_t)Hv * dv;
        float *scr = hmalloc(hk_gdn_chunk_scratch(Hv, dk, dv, C));
        float *o = hmalloc(no), *S0[3], *S[3], *Tc[3], *dS[3], *dTc[3];
        gdn_dev_t f = gdn_upload(&p);
        for (int b = 0; b < nseq; b++) {
            const size_t r = (size_t)cu[b];
            S0[b] = b == 0 ? fdup(p.S0, ns) : frand(ns, 0.5);
            S[b] = fdup(S0[b], ns);
            Tc[b] = hmalloc(nt);
            hk_gdn_chunk(o + r * ldv, S[b], Tc[b], p.q + r * ldq, p.k + r * ldq,
                         p.v + r * ldv, p.g + r * Hv, p.beta + r * Hv,
                         cu[b + 1] - cu[b], Hk, Hv, dk, dv, C, scr);
        }
        int *dcu = dev_ints(cu, (size_t)nseq + 1);
        float *dscr =
            dev_alloc(hk_cuda_gdn_chunk_tc_scratch(T, nseq, Hk, Hv, dk, dv, C));
        for (int vi = 0; vi < TC_NVAR; vi++) {
            const int fast = (vflags[vi] & HK_CUDA_GDN_TC_FAST) != 0;
            const double at = fast ? ATOL_BF16 : ATOL_TC;
            const double rt = fast ? RTOL_BF16 : RTOL_TC;
            for (int b = 0; b < nseq; b++) {
                dS[b] = dev_from(S0[b], ns);
                dTc[b] = want_tc ? dev_alloc(nt) : NULL;
            }
            void *dst = dev_ptrs(dS, nseq), *dtc = dev_ptrs(dTc, nseq);
            float *dO = dev_alloc(no);
            if (vflags[vi]) /* the default through the plain entry */
                RUN(hk_cuda_gdn_chunk_tc_ex(dO, dst, want_tc ? dtc : NULL, f.q,
                                            f.k, f.v, f.g, f.beta, dcu, nseq, T,
                                            Hk, Hv, dk, dv, C, dscr, vflags[vi],
                                            test_lanes(), NULL));
            else
                RUN(hk_cuda_gdn_chunk_tc(dO, dst, want_tc ? dtc : NULL, f.q,
                                         f.k, f.v, f.g, f.beta, dcu, nseq, T,
                                         Hk, Hv, dk, dv, C, dscr, NULL));
            int good = close_cpu(o, dO, no, at, rt, "o vs CPU");
            for (int b = 0; b < nseq; b++) {
                good &= close_cpu(S[b], dS[b], ns, at, rt, "S vs CPU");
                if (want_tc)
                    good &= close_cpu(Tc[b], dTc[b], nt, at, rt, "Tc vs CPU");
                CK(hk_cuda_free(dS[b]));
                CK(hk_cuda_free(dTc[b]));
            }
            ok(good,
               "gdn_chunk_tc (f32 in)%s nseq=%d T=%d Hk=%d Hv=%d dk=%d dv=%d "
               "C=%d%s",
               vname[vi], nseq, T, Hk, Hv, dk, dv, C, want_tc ? " +Tc" : "");
            CK(hk_cuda_free(dst));
            CK(hk_cuda_free(dtc));
            CK(hk_cuda_free(dO));
        }
        for (int r = 0; r < 2 && T > 0; r++)
            ok(tc_unaligned_same(&p, &f, S0, nseq, dcu, T, Hk, Hv, dk, dv, C,
                                 dscr, r ? HK_CUDA_GDN_TC_ROUND : 0),
               "gdn_chunk_tc (f32 in%s) on unaligned q, k, v = aligned, bit "
               "for bit nseq=%d T=%d Hk=%d Hv=%d dk=%d dv=%d C=%d",
               r ? ", rounded once" : "", nseq, T, Hk, Hv, dk, dv, C);
        for (int b = 0; b < nseq; b++) {
            free(S0[b]);
            free(S[b]);
            free(Tc[b]);
        }
        gdn_dev_free(&f);
        CK(hk_cuda_free(dcu));
        CK(hk_cuda_free(dscr));
        free(scr);
        free(o);
        gdn_prob_free(&p);
    }
}

/* The online tuner (hk_cuda_tuner, the decode step's in the backend):
 * bad arguments refused; each kernel timed `samples` times at a class,
 * then the class settles on the one whose calls took least (here device
 * work of 64 MB, none and 16 MB of memset: the second), picked from then
 * on untimed; another class starts over; past 4096 classes kernel 0,
 * untimed; the classes' report; a class of some of the kernels (pick_of's
 * mask) times those only; kernels whose calls fail leave the running. The
 * events are read only once the stream is done. */
/* The in-kernel probes (hk_cuda_probe): a probed call gives the same bits
 * as an unprobed one, and its rows count what ran: the kernels the plan
 * names, their blocks that had a chunk (spare slots left out), each phase
 * passed once a block, R's loop phases once a chunk; the phases sum to
 * the span. Too small a buffer drops the launches; off, no rows. */
static void test_probe(void)
{
    /* two sequences, 3 and 2 chunks of 32, one spare slot; T_C on */
    const int cu[3] = {0, 90, 128}, nseq = 2, T = 128, Hk = 1, Hv = 2;
    const int dk = 64, dv = 64, C = 32, nch[2] = {3, 2};
    const unsigned flags[2] = {0, HK_CUDA_GDN_TC_A3};
    for (int fi = 0; fi < 2; fi++) {
        gdn_prob_t p;
        gdn_prob_make(&p, T, Hk, Hv, dk, dv);
        gdn_bf16_t x = gdn_upload_bf16(&p);
        gdn_dev_t f = gdn_upload(&p);
        const size_t no = (size_t)T * Hv * dv, ns = (size_t)Hv * dk * dv;
        const size_t nt = (size_t)Hv * dk * dk;
        float *dO[2], *dS[2][2], *dTc[2][2];
        hk_cuda_probe_row_t rows[64];
        int n = 0, dropped = -1;
        for (int v = 0; v < 2; v++) { /* v = 1: probed */
            dO[v] = dev_alloc(no);
            for (int b = 0; b < nseq; b++) {
                dS[v][b] = dev_from(p.S0, ns);
                dTc[v][b] = dev_alloc(nt);
            }
            if (v)
                CK(hk_cuda_probe((size_t)1 << 16));
            tc_run(dO[v], dS[v], dTc[v], &x, &f, cu, nseq, Hk, Hv, dk, dv, C,
                   flags[fi]);
            if (v)
                CK(hk_cuda_probe_rows(rows, 64, &n, &dropped));
        }
        int good = 1;
        float *o0 = host_from(dO[0], no);
        good &= same_cpu(o0, dO[1], no, "o");
        for (int b = 0; b < nseq; b++) {
            float *S0 = host_from(dS[0][b], ns), *T0 = host_from(dTc[0][b], nt);
            good &= same_cpu(S0, dS[1][b], ns, "S");
            good &= same_cpu(T0, dTc[1][b], nt, "Tc");
            free(S0);
            free(T0);
        }
        ok(good, "probe: gdn_chunk_bf16%s probed = unprobed bit for bit",
           fi ? " A3" : "");

        char kn[32] = "";
        CK(hk_cuda_gdn_tc_kernels(kn, sizeof kn, T, nseq, Hk, Hv, dk, dv, C, 0,
                                  1, flags[fi]));
        const char *rk = strstr(kn, " R");
        const int bvo = strstr(kn, "O64") ? 64 : 32, bv = rk ? atoi(rk + 2) : 1;
        const int chunks = nch[0] + nch[1];
        static const struct {
            const char *kernel;
            int nphase, loop0, nloop; /* loop phases loop0.. */
        } want[3] = {{NULL, 6, 0, 0}, {"R", 7, 1, 5}, {"O", 3, 0, 0}};
        const long long blocks[3] = {(long long)chunks * Hv,
                                     (long long)(dv + dk) / bv * Hv * nseq,
                                     (long long)chunks * (dv / bvo) * Hv};
        int at = 0;
        good = dropped == 0 && strstr(kn, fi ? "A3 R" : "A2 R") &&
               strstr(kn, " O");
        for (int k = 0; k < 3 && good; k++) {
            const char *name = want[k].kernel ? want[k].kernel
                               : fi           ? "A3"
                                              : "A2";
            double sum = 0.0;
            for (int i = 0; i <= want[k].nphase && good; i++, at++) {
                const hk_cuda_probe_row_t *r = &rows[at];
                const int loop =
                    i >= want[k].loop0 && i < want[k].loop0 + want[k].nloop;
                const long long pts =
                    loop ? (long long)(dv + dk) / bv * Hv * chunks : blocks[k];
                good &= at < n && !strcmp(r->kernel, name) &&
                        r->blocks == blocks[k] && r->points == pts &&
                        r->cycles >= 0.0;
                if (!good)
                    tap_diag("row %d: %s.%s blocks %lld points %lld, want "
                             "%s blocks %lld points %lld",
                             at, at < n ? r->kernel : "-",
                             at < n ? r->phase : "-", at < n ? r->blocks : -1,
                             at < n ? r->points : -1, name, blocks[k], pts);
                if (i < want[k].nphase)
                    sum += r->cycles;
                else
                    good &= !strcmp(r->phase, "span") && r->cycles > 0.0 &&
                            fabs(sum - r->cycles) <= 1e-9 * r->cycles &&
                            r->share == 1.0 && r->resident > 0.0;
            }
        }
        good &= at == n;
        for (int i = 0; i < n; i++)
            tap_diag("  %s.%-8s %10.0f a block, %5.1f %%, %lld blocks, %lld "
                     "points%s",
                     rows[i].kernel, rows[i].phase, rows[i].cycles,
                     100.0 * rows[i].share, rows[i].blocks, rows[i].points,
                     strcmp(rows[i].phase, "span") ? "" : " (span)");
        ok(good,
           "probe: %s's rows: %d of 3 kernels, blocks and points as run "
           "(%d chunks, %d of them A's), phases summing to the span",
           kn, n, chunks, (int)blocks[0]);

        /* a buffer too small: every launch dropped, nothing read */
        CK(hk_cuda_probe(8));
        tc_run(dO[1], dS[1], dTc[1], &x, &f, cu, nseq, Hk, Hv, dk, dv, C,
               flags[fi]);
        CK(hk_cuda_probe_rows(rows, 64, &n, &dropped));
        good = n == 0 && dropped == 3;
        const int nd = dropped;
        CK(hk_cuda_probe(0));
        good &= hk_cuda_probe_rows(rows, 64, &n, &dropped) == HK_CUDA_EINVAL;
        ok(good,
           "probe: %s, a full buffer drops its launches (%d); off, "
           "no rows",
           kn, nd);
        for (int v = 0; v < 2; v++) {
            CK(hk_cuda_free(dO[v]));
            for (int b = 0; b < nseq; b++) {
                CK(hk_cuda_free(dS[v][b]));
                CK(hk_cuda_free(dTc[v][b]));
            }
        }
        free(o0);
        gdn_bf16_free(&x);
        gdn_dev_free(&f);
        gdn_prob_free(&p);
    }
}

static void test_tuner(void)
{
    hk_cuda_tuner_t *t = NULL;
    ok(hk_cuda_tuner_create(&t, 0, 3) == HK_CUDA_EINVAL &&
           hk_cuda_tuner_create(&t, HK_CUDA_TUNER_MAX_CAND + 1, 3) ==
               HK_CUDA_EINVAL &&
           hk_cuda_tuner_create(&t, 3, 0) == HK_CUDA_EINVAL && !t,
       "tuner: 0 or %d kernels, or no samples, refused",
       HK_CUDA_TUNER_MAX_CAND + 1);
    CK(hk_cuda_tuner_create(&t, 3, 2));
    const size_t big = (size_t)64 << 20;
    const size_t work[3] = {big, 0, big / 4};
    void *buf = dev_alloc(big / sizeof(float));
    int timed_n[3] = {0, 0, 0}, calls = 0, untimed = 0;
    while (hk_cuda_tuner_best(t, 7) < 0 && calls < 20) {
        int timed = 0;
        const int k = hk_cuda_tuner_pick(t, 7, &timed);
        calls++;
        if (!timed) {
            untimed++;
            continue;
        }
        timed_n[k]++;
        CK(hk_cuda_tuner_begin(t, NULL));
        if (work[k])
            CK(hk_cuda_memset0(buf, work[k], NULL));
        CK(hk_cuda_tuner_end(t, NULL));
        CK(hk_cuda_stream_sync(NULL));
    }
    ok(hk_cuda_tuner_best(t, 7) == 1 && timed_n[0] == 2 && timed_n[1] == 2 &&
           timed_n[2] == 2 && untimed == 1,
       "tuner: each kernel timed twice (%d, %d, %d; then %d untimed: the "
       "pick that reads the last time), then the fastest: %d",
       timed_n[0], timed_n[1], timed_n[2], untimed, hk_cuda_tuner_best(t, 7));
    int timed = 1, same = 1;
    for (int i = 0; i < 5; i++)
        same &= hk_cuda_tuner_pick(t, 7, &timed) == 1 && !timed;
    ok(same, "tuner: a settled class runs its kernel, untimed");
    ok(hk_cuda_tuner_pick(t, 8, &timed) == 0 && timed &&
           hk_cuda_tuner_best(t, 8) < 0,
       "tuner: another class is timed from its start");
    CK(hk_cuda_tuner_begin(t, NULL));
    CK(hk_cuda_tuner_end(t, NULL));
    for (long long key = 9; key < 4096 + 8; key++)
        if (hk_cuda_tuner_pick(t, key, &timed) >= 0 && timed) {
            CK(hk_cuda_tuner_begin(t, NULL));
            CK(hk_cuda_tuner_end(t, NULL));
        }
    const int k = hk_cuda_tuner_pick(t, 1000000, &timed);
    ok(k == 0 && !timed, "tuner: past 4096 classes, kernel 0 untimed");
    CK(hk_cuda_stream_sync(NULL));
    /* the report: class 0 (key 7) settled on kernel 1 with a time for
     * each, class 1 (key 8) timed once on kernel 0; none past the last */
    long long key = 0;
    int best = -2;
    float ms[3] = {0, 0, 0};
    ok(hk_cuda_tuner_class(t, 0, &key, &best, ms) == HK_CUDA_OK && key == 7 &&
           best == 1 && ms[1] >= 0 && ms[0] > ms[1] && ms[2] > ms[1] &&
           hk_cuda_tuner_class(t, 1, &key, &best, ms) == HK_CUDA_OK &&
           key == 8 && best == -1 && ms[0] >= 0 && ms[1] < 0 && ms[2] < 0 &&
           hk_cuda_tuner_class(t, 4096, &key, &best, ms) == HK_CUDA_EINVAL &&
           hk_cuda_tuner_class(t, 4095, &key, &best, ms) == HK_CUDA_OK &&
           key == 4095 + 8 - 1,
       "tuner: its classes' keys, choices and least times, in order");
    hk_cuda_tuner_destroy(t);

    /* a class of kernels 0 and 2 only (mask 5): kernel 1 never runs nor
     * wins, though its calls would take least; a class of kernel 0 alone
     * runs it untimed from the start */
    CK(hk_cuda_tuner_create(&t, 3, 2));
    int n[3] = {0, 0, 0};
    calls = 0;
    while (hk_cuda_tuner_best(t, 5) < 0 && calls++ < 20) {
        const int j = hk_cuda_tuner_pick_of(t, 5, 5u, &timed);
        n[j]++;
        if (!timed)
            continue;
        CK(hk_cuda_tuner_begin(t, NULL));
        if (work[j])
            CK(hk_cuda_memset0(buf, work[j], NULL));
        CK(hk_cuda_tuner_end(t, NULL));
        CK(hk_cuda_stream_sync(NULL));
    }
    ok(hk_cuda_tuner_best(t, 5) == 2 && n[1] == 0 && n[0] >= 2 && n[2] >= 2,
       "tuner: a class of kernels 0 and 2 times those (%d, %d, %d calls), "
       "then runs the faster: %d",
       n[0], n[1], n[2], hk_cuda_tuner_best(t, 5));
    timed = 1;
    ok(hk_cuda_tuner_pick_of(t, 6, 1u, &timed) == 0 && !timed &&
           hk_cuda_tuner_best(t, 6) == 0 &&
           hk_cuda_tuner_pick_of(t, 6, 7u, &timed) == 0 && !timed,
       "tuner: a class of kernel 0 alone runs it, untimed, whatever later "
       "calls' masks say");
    CK(hk_cuda_stream_sync(NULL));
    hk_cuda_tuner_destroy(t);

    /* calls that fail (hk_cuda_tuner_fail): kernel 1's, the one whose calls
     * would take least, leaves the running at its first; a class whose
     * kernels all fail runs kernel 0 */
    CK(hk_cuda_tuner_create(&t, 3, 2));
    int fails = 0, fail_ok = 1;
    calls = 0;
    while (hk_cuda_tuner_best(t, 9) < 0 && calls++ < 20) {
        const int j = hk_cuda_tuner_pick(t, 9, &timed);
        if (!timed)
            continue;
        CK(hk_cuda_tuner_begin(t, NULL));
        if (j == 1) {
            fails++;
            fail_ok &= hk_cuda_tuner_fail(t) == HK_CUDA_OK;
            continue;
        }
        if (work[j])
            CK(hk_cuda_memset0(buf, work[j], NULL));
        CK(hk_cuda_tuner_end(t, NULL));
        CK(hk_cuda_stream_sync(NULL));
    }
    float fms[3];
    long long fkey;
    int fbest;
    ok(fail_ok && fails == 1 && hk_cuda_tuner_best(t, 9) == 2 &&
           hk_cuda_tuner_class(t, 0, &fkey, &fbest, fms) == HK_CUDA_OK &&
           fms[1] < 0 && fms[0] >= 0 && fms[2] >= 0 &&
           hk_cuda_tuner_fail(t) == HK_CUDA_EINVAL,
       "tuner: a kernel whose call fails is out of its class (%d failed "
       "call), the class settles on another: %d",
       fails, hk_cuda_tuner_best(t, 9));
    for (int i = 0; i < 3 && hk_cuda_tuner_best(t, 10) < 0; i++)
        if (hk_cuda_tuner_pick(t, 10, &timed) >= 0 && timed) {
            CK(hk_cuda_tuner_begin(t, NULL));
            CK(hk_cuda_tuner_fail(t));
        }
    ok(hk_cuda_tuner_best(t, 10) == 0,
       "tuner: a class whose kernels all fail runs kernel 0");
    CK(hk_cuda_stream_sync(NULL));
    hk_cuda_tuner_destroy(t);
    CK(hk_cuda_free(buf));
}

/* A decode step's inputs but its states, on the host and the device
 * (qkv, conv weights, a, b, A_log, dt_bias). */
typedef struct {
    float *qkv, *w, *a, *b, *A_log, *dt;
    float *d_qkv, *d_w, *d_a, *d_b, *d_A_log, *d_dt;
} step_in_t;

static void step_in_make(step_in_t *x, int B, int cd, int Hv, int K)
{
    x->qkv = frand((size_t)B * cd, 2.0);
    x->w = frand((size_t)cd * K, 0.7);
    x->a = frand((size_t)B * Hv, 3.0);
    x->b = frand((size_t)B * Hv, 3.0);
    x->A_log = frand((size_t)Hv, 1.0);
    x->dt = frand((size_t)Hv, 2.0);
    x->d_qkv = dev_from(x->qkv, (size_t)B * cd);
    x->d_w = dev_from(x->w, (size_t)cd * K);
    x->d_a = dev_from(x->a, (size_t)B * Hv);
    x->d_b = dev_from(x->b, (size_t)B * Hv);
    x->d_A_log = dev_from(x->A_log, (size_t)Hv);
    x->d_dt = dev_from(x->dt, (size_t)Hv);
}

static void step_in_free(step_in_t *x)
{
    float *h[6] = {x->qkv, x->w, x->a, x->b, x->A_log, x->dt};
    float *d[6] = {x->d_qkv, x->d_w, x->d_a, x->d_b, x->d_A_log, x->d_dt};
    for (int i = 0; i < 6; i++) {
        free(h[i]);
        CK(hk_cuda_free(d[i]));
    }
}

/* The fused decode step against the CPU's unfused sequence per request:
 * conv (T = 1), split, l2 norms, gates, recurrence (T = 1), for every
 * kernel (KH, PIPE, PIPEA, PIPEW, PIPE32) on the same inputs. Conv states
 * are copies: bit-exact; o and S within the GDN budget (the norms' sums
 * differ in order, ~1e-7); PIPEA's and PIPEW's are PIPE's bit for bit. */
static void test_gdn_step(void)
{
    /* B, Hk, Hv, dk, dv, K: GQA groups; more items than the emulator's 8
     * (PIPE32: 12) block slots, in unequal shares (13: blocks of 2 and a
     * last of 1); an odd number of units per block (7 x r = 3, one slab:
     * the unit loop ends on either buffer); dv > 128 and dv = 100 (a
     * partial last slab); K = 1 (no conv state), odd dk, dv not a multiple
     * of 32, dk = 256. The fourth: 64 units an item, 3 items a PIPEW
     * block; only there do the slab threads take more of the emulator's
     * rounds an item than the prologue warps (whose sums shuffle), so
     * prologue warps not held back by EMPTY overwrite a buffer still read
     * (caught). The last: 384 items, so a device's blocks run several
     * (PIPE 2, PIPEW 3 on 132 SMs). */
    static const int shapes[][6] = {
        {1, 1, 1, 16, 16, 4},   {13, 1, 2, 128, 128, 4}, {7, 1, 3, 32, 32, 4},
        {12, 1, 8, 16, 512, 2}, {3, 2, 4, 32, 48, 4},    {2, 1, 2, 128, 128, 4},
        {5, 2, 2, 64, 256, 4},  {4, 1, 1, 17, 12, 1},    {3, 1, 3, 256, 64, 2},
        {5, 1, 3, 64, 100, 4},  {96, 4, 8, 16, 64, 2}};
    static const struct {
        hk_cuda_step_impl_t impl;
        const char *name;
    } impls[] = {{HK_CUDA_STEP_KH, "kh"},
                 {HK_CUDA_STEP_PIPE, "pipe"},
                 {HK_CUDA_STEP_PIPEA, "pipea"},
                 {HK_CUDA_STEP_PIPEW, "pipew"},
                 {HK_CUDA_STEP_PIPE32, "pipe32"}};
    for (int s = 0; s < grid_n(NSHAPES(shapes), 4); s++) {
        const int B = shapes[s][0], Hk = shapes[s][1], Hv = shapes[s][2];
        const int dk = shapes[s][3], dv = shapes[s][4], K = shapes[s][5];
        const int kd = Hk * dk, cd = 2 * kd + Hv * dv;
        const size_t ns = (size_t)Hv * dk * dv, nc = (size_t)cd * (K - 1);
        const size_t no = (size_t)B * Hv * dv;
        const float eps = 1e-6f, qsc = 1.0f / sqrtf((float)dk);
        step_in_t x;
        step_in_make(&x, B, cd, Hv, K);
        float *o = hmalloc(no), *y = hmalloc((size_t)cd);
        float *g = hmalloc((size_t)Hv), *be = hmalloc((size_t)Hv);
        float *poison = hmalloc(no); /* o unwritten by a kernel fails */
        for (size_t i = 0; i < no; i++)
            poison[i] = NAN;
        float *S0[96], *cs0[96], *S[96], *cs[96], *dS[96], *dcs[96];
        for (int b = 0; b < B; b++) {
            S0[b] = frand(ns, 0.5);
            cs0[b] = frand(nc, 2.0);
            S[b] = hmalloc(ns);
            cs[b] = hmalloc(nc);
            memcpy(S[b], S0[b], ns * sizeof(float));
            memcpy(cs[b], cs0[b], nc * sizeof(float));
            dS[b] = dev_alloc(ns);
            dcs[b] = dev_alloc(nc);
            /* the CPU's unfused sequence */
            hk_conv1d_silu(y, cs[b], x.qkv + (size_t)b * cd, x.w, 1, cd, K);
            hk_l2norm(y, Hk, dk, eps, qsc);
            hk_l2norm(y + kd, Hk, dk, eps, 1.0f);
            hk_gdn_gates(g, be, x.a + (size_t)b * Hv, x.b + (size_t)b * Hv,
                         x.A_log, x.dt, 1, Hv);
            hk_gdn_recurrent(o + (size_t)b * Hv * dv, S[b], y, y + kd,
                             y + 2 * kd, g, be, 1, Hk, Hv, dk, dv);
        }
        void *dSp = dev_ptrs(dS, B), *dcsp = K > 1 ? dev_ptrs(dcs, B) : NULL;
        float *dO = dev_alloc(no);
        /* PIPE's outputs: PIPEA's must be theirs bit for bit (the same
         * sums on inputs it copied first) */
        float *po = hmalloc(no), *pS[96];
        for (size_t v = 0; v < sizeof impls / sizeof impls[0]; v++) {
            for (int b = 0; b < B; b++) {
                CK(hk_cuda_h2d(dS[b], S0[b], ns * sizeof(float), NULL));
                if (nc)
                    CK(hk_cuda_h2d(dcs[b], cs0[b], nc * sizeof(float), NULL));
            }
            CK(hk_cuda_h2d(dO, poison, no * sizeof(float), NULL));
            RUN(hk_cuda_gdn_step_impl(impls[v].impl, dO, dSp, dcsp, x.d_qkv,
                                      x.d_a, x.d_b, x.d_w, x.d_A_log, x.d_dt, B,
                                      Hk, Hv, dk, dv, K, eps, qsc, NULL));
            int good = close_cpu(o, dO, no, ATOL_GDN, RTOL_GDN, "o");
            for (int b = 0; b < B; b++) {
                good &= close_cpu(S[b], dS[b], ns, ATOL_GDN, RTOL_GDN, "S");
                good &= same_cpu(cs[b], dcs[b], nc, "conv state");
            }
            const int pipe = impls[v].impl == HK_CUDA_STEP_PIPE;
            /* PIPEA, PIPEW: PIPE's sums in PIPE's order */
            const int pipea = impls[v].impl == HK_CUDA_STEP_PIPEA ||
                              impls[v].impl == HK_CUDA_STEP_PIPEW;
            if (pipe) {
                CK(hk_cuda_d2h(po, dO, no * sizeof(float), NULL));
                for (int b = 0; b < B; b++)
                    pS[b] = host_from(dS[b], ns);
            }
            if (pipea) {
                good &= same_cpu(po, dO, no, "o = pipe's");
                for (int b = 0; b < B; b++)
                    good &= same_cpu(pS[b], dS[b], ns, "S = pipe's");
            }
            ok(good, "gdn_step[%s] B=%d Hk=%d Hv=%d dk=%d dv=%d K=%d%s",
               impls[v].name, B, Hk, Hv, dk, dv, K,
               pipea ? " (= pipe bit for bit)" : "");
        }
        free(po);
        for (int b = 0; b < B; b++) {
            free(pS[b]);
            CK(hk_cuda_free(dS[b]));
            CK(hk_cuda_free(dcs[b]));
            free(S0[b]);
            free(cs0[b]);
            free(S[b]);
            free(cs[b]);
        }
        CK(hk_cuda_free(dSp));
        CK(hk_cuda_free(dcsp));
        CK(hk_cuda_free(dO));
        step_in_free(&x);
        free(o);
        free(y);
        free(g);
        free(be);
        free(poison);
    }
}

/* The decode step's probes (hk_cuda_probe): each kernel probed gives the
 * bits it gives unprobed, and its rows count what ran: a row per phase
 * and a span, named by the kernel; the head phase (KH's conv, the others'
 * ptrs) once a block; an item's conv (PIPEW: wait, every unit) and each
 * unit's sums, d and store once each; the phases sum to the span. Items:
 * 10 of 2 value heads, 48 columns (PIPE32: 2 slabs a head). */
static void test_gdn_step_probe(void)
{
    const int B = 5, Hk = 2, Hv = 4, dk = 32, dv = 48, K = 4;
    const int kd = Hk * dk, cd = 2 * kd + Hv * dv, items = Hk * B;
    const size_t ns = (size_t)Hv * dk * dv, nc = (size_t)cd * (K - 1);
    const size_t no = (size_t)B * Hv * dv;
    static const struct {
        hk_cuda_step_impl_t impl;
        const char *kernel, *head, *item;
        int slabs; /* a value head's */
    } impls[] = {{HK_CUDA_STEP_KH, "KH", "conv", NULL, 1},
                 {HK_CUDA_STEP_PIPE, "PIPE", "ptrs", "conv", 1},
                 {HK_CUDA_STEP_PIPEA, "PIPEA", "ptrs", "conv", 1},
                 {HK_CUDA_STEP_PIPEW, "PIPEW", "ptrs", "wait", 1},
                 {HK_CUDA_STEP_PIPE32, "PIPE32", "ptrs", "conv", 2}};
    step_in_t x;
    step_in_make(&x, B, cd, Hv, K);
    float *S0[5], *cs0[5], *dS[2][5], *dcs[2][5];
    for (int b = 0; b < B; b++) {
        S0[b] = frand(ns, 0.5);
        cs0[b] = frand(nc, 2.0);
        for (int v = 0; v < 2; v++) {
            dS[v][b] = dev_alloc(ns);
            dcs[v][b] = dev_alloc(nc);
        }
    }
    void *dSp[2] = {dev_ptrs(dS[0], B), dev_ptrs(dS[1], B)};
    void *dcsp[2] = {dev_ptrs(dcs[0], B), dev_ptrs(dcs[1], B)};
    float *dO[2] = {dev_alloc(no), dev_alloc(no)};
    for (size_t i = 0; i < sizeof impls / sizeof impls[0]; i++) {
        hk_cuda_probe_row_t rows[16];
        int n = 0, dropped = -1;
        memset(rows, 0, sizeof rows);
        for (int v = 0; v < 2; v++) { /* v = 1: probed */
            for (int b = 0; b < B; b++) {
                CK(hk_cuda_h2d(dS[v][b], S0[b], ns * sizeof(float), NULL));
                CK(hk_cuda_h2d(dcs[v][b], cs0[b], nc * sizeof(float), NULL));
            }
            if (v)
                CK(hk_cuda_probe((size_t)1 << 14));
            RUN(hk_cuda_gdn_step_impl(impls[i].impl, dO[v], dSp[v], dcsp[v],
                                      x.d_qkv, x.d_a, x.d_b, x.d_w, x.d_A_log,
                                      x.d_dt, B, Hk, Hv, dk, dv, K, 1e-6f,
                                      0.125f, NULL));
            if (v) {
                CK(hk_cuda_probe_rows(rows, 16, &n, &dropped));
                CK(hk_cuda_probe(0));
            }
        }
        float *o0 = host_from(dO[0], no);
        int good = same_cpu(o0, dO[1], no, "o");
        for (int b = 0; b < B; b++) {
            float *s = host_from(dS[0][b], ns), *c = host_from(dcs[0][b], nc);
            good &= same_cpu(s, dS[1][b], ns, "S");
            good &= same_cpu(c, dcs[1][b], nc, "conv state");
            free(s);
            free(c);
        }
        free(o0);
        ok(good, "step probe: %s probed = unprobed bit for bit",
           impls[i].kernel);

        /* rows: head, item (not KH), sums, d, store, span */
        const long long units = (long long)items * (Hv / Hk) * impls[i].slabs;
        const int kh = impls[i].impl == HK_CUDA_STEP_KH;
        const int pipew = impls[i].impl == HK_CUDA_STEP_PIPEW;
        const char *names[6] = {impls[i].head, impls[i].item, "sums",
                                "d",           "store",       "span"};
        long long blocks = n > 0 ? rows[0].blocks : 0;
        double sum = 0.0;
        good = dropped == 0 && n == 5 - (kh ? 1 : 0) + 1 && blocks > 0 &&
               blocks <= items && (!kh || blocks == items);
        for (int k = 0, at = 0; k < 6 && good; k++) {
            if (k == 1 && kh)
                continue;
            const hk_cuda_probe_row_t *r = &rows[at++];
            const long long pts = k == 0   ? blocks
                                  : k == 1 ? (pipew ? units : items)
                                  : k == 5 ? blocks
                                           : units;
            good &= !strcmp(r->kernel, impls[i].kernel) &&
                    !strcmp(r->phase, names[k]) && r->blocks == blocks &&
                    r->points == pts && r->cycles >= 0.0;
            if (!good)
                tap_diag("row %d: %s.%s blocks %lld points %lld, want %s.%s "
                         "points %lld",
                         at - 1, r->kernel, r->phase, r->blocks, r->points,
                         impls[i].kernel, names[k], pts);
            if (k < 5)
                sum += r->cycles;
            else
                good &= r->cycles > 0.0 &&
                        fabs(sum - r->cycles) <= 1e-9 * r->cycles &&
                        r->share == 1.0 && r->resident > 0.0;
        }
        ok(good,
           "step probe: %s's rows: %d, %lld blocks, %lld units, phases "
           "summing to the span",
           impls[i].kernel, n, blocks, units);
    }
    for (int v = 0; v < 2; v++) {
        for (int b = 0; b < B; b++) {
            CK(hk_cuda_free(dS[v][b]));
            CK(hk_cuda_free(dcs[v][b]));
        }
        CK(hk_cuda_free(dSp[v]));
        CK(hk_cuda_free(dcsp[v]));
        CK(hk_cuda_free(dO[v]));
    }
    for (int b = 0; b < B; b++) {
        free(S0[b]);
        free(cs0[b]);
    }
    step_in_free(&x);
}

/* ---- KVBuffer -------------------------------------------------------------
 * The step is the GDN recurrence in another association (the CPU kernel
 * matches hk_gdn_recurrent at test_gdn.c's bounds), so o, w and the
 * flushed S get the GDN tolerances; keys are copies and G the same double
 * sums in the same order on both sides: compared exactly. */

/* R, T, Hk, Hv, dk, dv, bs, then R buffer lengths: partial blocks, a
 * length at a block boundary, empty buffers, bs - 1 (a full cap of 16);
 * T > 1 is draft verification (T = 5, 6 cross the v1 kernel's 4-token
 * tiles); dv = 128, 256 take v1's float4 path, odd dv its scalar one.
 * Any T with dv % 4 = 0 and bs a power of two >= 4 also runs v2 (each
 * slab width; T > 1 its verification kernel): GQA groups of 2 and 3, dk past
 * one pass of rows (256, and 40 < a pass), dv not a multiple of the slab (20,
 * 80), bs 4 to 64. Request r % 3 == 1 has no state (a KV-only buffer). */
static const int kvb_shapes[][15] = {{3, 1, 1, 2, 17, 9, 4, 0, 4, 7},
                                     {2, 5, 2, 4, 32, 33, 8, 3, 8},
                                     {4, 1, 2, 4, 128, 128, 16, 0, 15, 16, 37},
                                     {2, 6, 1, 2, 64, 256, 16, 5, 20},
                                     {2, 3, 1, 1, 48, 80, 64, 63, 1},
                                     {1, 16, 1, 1, 16, 40, 16, 9},
                                     {3, 1, 1, 3, 40, 20, 4, 6, 9, 0},
                                     {2, 1, 1, 1, 256, 256, 64, 63, 2},
                                     {3, 1, 2, 2, 64, 80, 8, 17, 1, 8}};

typedef struct {
    hk_kvbuf_geom_t g;
    int R, T, lmax, mb;
    size_t bf, nar; /* floats per block, in the arena */
    float *arena;   /* host, the CPU's */
    int *blocks;    /* [R, mb]: block j of request r is j*R + r */
    hk_kvbuf_view_t vw[4];
    float *S[4]; /* host states (NULL: KV-only) */
} kvb_case_t;

/* A pool whose buffers hold len[r] entries made by the CPU step itself
 * (R separate calls of T = len[r] tokens). */
static void kvb_make(kvb_case_t *c, const int *sh)
{
    memset(c, 0, sizeof(*c));
    c->R = sh[0], c->T = sh[1];
    c->g = (hk_kvbuf_geom_t){sh[2], sh[3], sh[4], sh[5], sh[6]};
    const hk_kvbuf_geom_t *g = &c->g;
    for (int r = 0; r < c->R; r++)
        c->lmax = sh[7 + r] + c->T > c->lmax ? sh[7 + r] + c->T : c->lmax;
    c->mb = (c->lmax + g->bs - 1) / g->bs;
    c->bf = hk_kvbuf_block_floats(g);
    c->nar = (size_t)c->R * c->mb * c->bf;
    c->arena = hmalloc(c->nar);
    memset(c->arena, 0, c->nar * sizeof(float));
    c->blocks = hbytes((size_t)c->R * c->mb * sizeof(int));
    const size_t ns = (size_t)g->Hv * g->dk * g->dv;
    for (int r = 0; r < c->R; r++) {
        for (int j = 0; j < c->mb; j++)
            c->blocks[r * c->mb + j] = j * c->R + r;
        c->S[r] = NULL;
        if (r % 3 != 1) {
            c->S[r] = hmalloc(ns);
            for (size_t e = 0; e < ns; e++)
                c->S[r][e] = (float)(0.5 * nrand());
        }
        c->vw[r] = (hk_kvbuf_view_t){c->S[r], c->blocks + r * c->mb, 0};
        const int len = sh[7 + r];
        if (len > 0) {
            gdn_prob_t h;
            gdn_prob_make(&h, len, g->Hk, g->Hv, g->dk, g->dv);
            float *o = hmalloc((size_t)len * g->Hv * g->dv);
            float *ws = hmalloc(hk_kvbuf_step_scratch(g, len, c->lmax, 1));
            hk_kvbuf_step(o, c->arena, &c->vw[r], h.q, h.k, h.v, h.g, h.beta, 1,
                          len, g, c->lmax, ws, 1);
            free(o);
            free(ws);
            gdn_prob_free(&h);
        }
        c->vw[r].len = len;
    }
}

static void kvb_free(kvb_case_t *c)
{
    for (int r = 0; r < c->R; r++)
        free(c->S[r]);
    free(c->arena);
    free(c->blocks);
}

/* The device copies: arena, states, block lists and the views over them. */
typedef struct {
    float *arena, *S[4];
    int *blocks;
    hk_kvbuf_view_t *vw;
} kvb_dev_t;

static kvb_dev_t kvb_upload(const kvb_case_t *c)
{
    const hk_kvbuf_geom_t *g = &c->g;
    kvb_dev_t d;
    hk_kvbuf_view_t hv[4];
    d.arena = dev_from(c->arena, c->nar);
    const size_t nb = (size_t)c->R * c->mb * sizeof(int);
    CK(hk_cuda_malloc((void **)&d.blocks, nb));
    CK(hk_cuda_h2d(d.blocks, c->blocks, nb, NULL));
    for (int r = 0; r < c->R; r++) {
        d.S[r] =
            c->S[r] ? dev_from(c->S[r], (size_t)g->Hv * g->dk * g->dv) : NULL;
        hv[r] = (hk_kvbuf_view_t){d.S[r], d.blocks + r * c->mb, c->vw[r].len};
    }
    CK(hk_cuda_malloc((void **)&d.vw, c->R * sizeof(hk_kvbuf_view_t)));
    CK(hk_cuda_h2d(d.vw, hv, c->R * sizeof(hk_kvbuf_view_t), NULL));
    return d;
}

static void kvb_dev_free(kvb_dev_t *d, int R)
{
    CK(hk_cuda_free(d->arena));
    CK(hk_cuda_free(d->blocks));
    CK(hk_cuda_free(d->vw));
    for (int r = 0; r < R; r++)
        CK(hk_cuda_free(d->S[r]));
}

/* Every entry of every buffer, up to n[r]: w within tolerance, keys and G
 * exact. */
static int kvb_entries_close(const kvb_case_t *c, float *ref, float *x,
                             const int *n)
{
    const hk_kvbuf_geom_t *g = &c->g;
    int good = 1;
    double worst = 0.0;
    for (int r = 0; r < c->R; r++) {
        const int *bl = c->blocks + r * c->mb;
        for (int i = 0; i < n[r]; i++) {
            for (int h = 0; h < g->Hv; h++) {
                double q = tap_close_ratio_f(hk_kvbuf_w(ref, g, bl, i, h),
                                             hk_kvbuf_w(x, g, bl, i, h), g->dv,
                                             ATOL_GDN, RTOL_GDN);
                worst = q > worst || q != q ? q : worst;
                good &= *hk_kvbuf_G(ref, g, bl, i, h) ==
                        *hk_kvbuf_G(x, g, bl, i, h);
            }
            const size_t kb = (size_t)bl[i / g->bs] * c->bf;
            for (size_t e = 0; e < (size_t)g->Hk * g->dk; e++)
                good &= ref[kb + e * g->bs + i % g->bs] ==
                        x[kb + e * g->bs + i % g->bs];
        }
    }
    if (!good)
        tap_diag("  keys or G differ");
    if (!(worst <= 1.0) || getenv("HK_CUDA_TEST_VERBOSE"))
        tap_diag("  w: worst |err| / (atol + rtol |ref|) = %.3g", worst);
    return good && worst <= 1.0;
}

/* The kernels each case runs: the default (v2 where it applies), v1 by
 * name, v2 at each slab width (a shape v2 takes). */
static const struct {
    const char *name;
    unsigned flags;
} kvb_kinds[] = {{"default", 0},
                 {"v1", HK_CUDA_KVBUF_V1},
                 {"v2/cw128", HK_CUDA_KVBUF_CW128},
                 {"v2/cw64", HK_CUDA_KVBUF_CW64},
                 {"v2/cw32", HK_CUDA_KVBUF_CW32}};
#define KVB_KINDS ((int)(sizeof(kvb_kinds) / sizeof(kvb_kinds[0])))

static int kvb_v2_applies(const hk_kvbuf_geom_t *g)
{
    return g->dv % 4 == 0 && g->bs >= 4 && !(g->bs & (g->bs - 1));
}

/* The step (T = 1 decode, T > 1 verification) over R requests with their
 * block tables, then a flush of a prefix of each buffer with a state; each
 * by every kernel that takes the case, from the same inputs. sh: a row of
 * kvb_shapes. */
static void kvb_run(const int *sh)
{
    kvb_case_t c;
    kvb_make(&c, sh);
    const hk_kvbuf_geom_t *g = &c.g;
    const int R = c.R, T = c.T, Hv = g->Hv, dk = g->dk, dv = g->dv;
    const size_t no = (size_t)R * T * Hv * dv, ns = (size_t)Hv * dk * dv;
    /* kinds of step and flush (a flush is a flush whatever T was) */
    const int nk = kvb_v2_applies(g) ? KVB_KINDS : T == 1 ? 2 : 1;
    const int nf = kvb_v2_applies(g) ? KVB_KINDS : 2;
    const int nd = nk > nf ? nk : nf;
    gdn_prob_t p; /* rows r*T + t */
    gdn_prob_make(&p, R * T, g->Hk, Hv, dk, dv);
    kvb_dev_t d[KVB_KINDS];
    for (int v = 0; v < nd; v++)
        d[v] = kvb_upload(&c);
    gdn_dev_t di = gdn_upload(&p);
    float *o = hmalloc(no), *dO = dev_alloc(no);
    float *ws = hmalloc(hk_kvbuf_step_scratch(g, T, c.lmax, 2));
    hk_kvbuf_step(o, c.arena, c.vw, p.q, p.k, p.v, p.g, p.beta, R, T, g, c.lmax,
                  ws, 2);
    int n[4];
    for (int r = 0; r < R; r++)
        n[r] = c.vw[r].len + T;
    float *nan = hmalloc(no); /* o starts as NaN for every kernel */
    for (size_t i = 0; i < no; i++)
        nan[i] = NAN;
    for (int v = 0; v < nk; v++) {
        CK(hk_cuda_h2d(dO, nan, no * sizeof(float), NULL));
        RUN(hk_cuda_kvbuf_step_ex(dO, d[v].arena, d[v].vw, di.q, di.k, di.v,
                                  di.g, di.beta, R, T, g, c.lmax,
                                  kvb_kinds[v].flags, NULL));
        int good = close_cpu(o, dO, no, ATOL_GDN, RTOL_GDN, "o");
        float *ar = host_from(d[v].arena, c.nar);
        good &= kvb_entries_close(&c, c.arena, ar, n);
        free(ar);
        ok(good, "%s[%s] R=%d T=%d Hk=%d Hv=%d dk=%d dv=%d bs=%d",
           T == 1 ? "kvbuf_step" : "kvbuf_verify", kvb_kinds[v].name, R, T,
           g->Hk, Hv, dk, dv, g->bs);
    }

    /* flush: all entries, about half, none; from the CPU's arena on
     * both sides, the states as they were before the CPU's flush */
    int *dn = NULL;
    for (int r = 0; r < R; r++)
        n[r] = !c.S[r] ? 0 : r % 2 ? (n[r] + 1) / 2 : n[r];
    for (int v = 0; v < nf; v++)
        CK(hk_cuda_h2d(d[v].arena, c.arena, c.nar * sizeof(float), NULL));
    CK(hk_cuda_malloc((void **)&dn, R * sizeof(int)));
    CK(hk_cuda_h2d(dn, n, R * sizeof(int), NULL));
    float *fws = hmalloc(hk_kvbuf_flush_scratch(g, c.lmax, 2));
    hk_kvbuf_flush(c.arena, c.vw, n, R, g, fws, 2);
    for (int v = 0; v < nf; v++) {
        RUN(hk_cuda_kvbuf_flush_ex(d[v].arena, d[v].vw, dn, R, g,
                                   kvb_kinds[v].flags, NULL));
        int good = 1;
        for (int r = 0; r < R; r++)
            if (c.S[r])
                good &=
                    close_cpu(c.S[r], d[v].S[r], ns, ATOL_GDN, RTOL_GDN, "S");
        good &= same_cpu(c.arena, d[v].arena, c.nar, "arena (unchanged)");
        ok(good, "kvbuf_flush[%s] R=%d Hk=%d Hv=%d dk=%d dv=%d bs=%d",
           kvb_kinds[v].name, R, g->Hk, Hv, dk, dv, g->bs);
    }

    CK(hk_cuda_free(dn));
    CK(hk_cuda_free(dO));
    for (int v = 0; v < nd; v++)
        kvb_dev_free(&d[v], R);
    gdn_dev_free(&di);
    free(nan);
    free(fws);
    free(ws);
    free(o);
    gdn_prob_free(&p);
    kvb_free(&c);
}

static void test_kvbuf(void)
{
    /* the small grid's 4: the 4th's verification takes 27 KB of dynamic
     * shared memory beside 32 KB of static (the 48 KB rule, found on a
     * GPU in session 11 and modelled by the emulator since) */
    for (int s = 0; s < grid_n(NSHAPES(kvb_shapes), 4); s++)
        kvb_run(kvb_shapes[s]);
}

/* Draft verification (T = 2 .. HK_TEST_KVB_TMAX, the engine's largest
 * step: 16 drafts + 1) at the models' head shapes per key head: Qwen3.5
 * (one value head a key head) and Qwen3-Next (two), dk = dv = 128, blocks
 * of 16. Three requests: an empty buffer, a partly full one without a
 * state (KV-only) and one that the T tokens fill to 32 entries, where a
 * flush follows (the test's flush then folds them). The small grid takes
 * T = 2, 5 (past a tile of 4 tokens) and 17. */
#define HK_TEST_KVB_TMAX 17
static void test_kvbuf_verify(void)
{
    static const int small_T[] = {2, 5, HK_TEST_KVB_TMAX};
    static const int heads[][2] = {{1, 1}, {1, 2}};
    for (int hs = 0; hs < 2; hs++) {
        const int nT = grid_n(HK_TEST_KVB_TMAX - 1, 3);
        for (int x = 0; x < nT; x++) {
            const int T = nT == 3 ? small_T[x] : 2 + x;
            const int sh[15] = {3, T, heads[hs][0], heads[hs][1], 128, 128, 16,
                                0, 9, 32 - T};
            kvb_run(sh);
        }
    }
}

/* Accepting m drafts: m below, at and above the history length K-1, and
 * none. Pure data movement: bit-exact. */
static void test_kvbuf_conv_commit(void)
{
    static const int shapes[][3] = {
        {5, 7, 4}, {1, 33, 4}, {0, 9, 4}, {3, 130, 4}, {2, 6, 2}};
    for (int s = 0; s < grid_n(NSHAPES(shapes), 3); s++) {
        const int m = shapes[s][0], C = shapes[s][1], K = shapes[s][2];
        const size_t nst = (size_t)C * (K - 1), nx = (size_t)(m + 1) * C;
        float *st = frand(nst, 1.0), *x = frand(nx, 1.0);
        float *dst = dev_from(st, nst), *dx = dev_from(x, nx);
        hk_kvbuf_conv_commit(st, x, m, C, K);
        RUN(hk_cuda_kvbuf_conv_commit(dst, dx, m, C, K, NULL));
        ok(same_cpu(st, dst, nst, "state"), "kvbuf_conv_commit m=%d C=%d K=%d",
           m, C, K);
        CK(hk_cuda_free(dst));
        CK(hk_cuda_free(dx));
        free(st);
        free(x);
    }
}

/* Launchers refuse bad shapes with an error code, launching nothing. */
static void test_einval(void)
{
    float x = 0.0f;
    int good =
        hk_cuda_rmsnorm_zc(&x, &x, &x, 1, 0, 1e-6f, NULL) == HK_CUDA_EINVAL;
    good &= hk_cuda_gdn_recurrent(&x, &x, &x, &x, &x, &x, &x, 1, 1, 1,
                                  HK_CUDA_GDN_MAX_DK + 1, 1,
                                  NULL) == HK_CUDA_EINVAL;
    good &=
        hk_cuda_gdn_chunk(&x, &x, NULL, &x, &x, &x, &x, &x, 1, 1, 1, 1, 1,
                          HK_CUDA_GDN_MAX_C + 1, &x, NULL) == HK_CUDA_EINVAL;
    good &= hk_cuda_rope(&x, NULL, 1, 1, 2, 3, 1e4, NULL) == HK_CUDA_EINVAL;
    good &= hk_cuda_attention(&x, &x, NULL, &x, &x, 1, 1, 3, 2, 8, 1.0f,
                              NULL) == HK_CUDA_EINVAL; /* Hq % Hkv */
    good &=
        hk_cuda_attention(&x, &x, NULL, &x, &x, 1, 1, 1, 1,
                          HK_CUDA_ATT_MAX_HD + 1, 1.0f, NULL) == HK_CUDA_EINVAL;
    /* The tensor-core prefill and the split decode, asked for by name,
     * refuse what they cannot run (DEFAULT falls back to SIMPLE). */
    good &= hk_cuda_attention_impl(HK_CUDA_ATT_FLASH, &x, &x, NULL, &x, &x, 1,
                                   1, 1, 1, HK_CUDA_ATT_TC_MAX_HD + 8, 1.0f,
                                   NULL) == HK_CUDA_EINVAL;
    good &= hk_cuda_attention_ex(HK_CUDA_ATT_FLASH2, &x, &x, NULL, &x, &x, 1, 1,
                                 1, 1, 8, 1.0f, NULL,
                                 NULL) == HK_CUDA_EINVAL; /* no scratch */
    good &=
        hk_cuda_attention_ex(HK_CUDA_ATT_FLASH2X, &x, &x, NULL, &x, &x, 1, 1, 1,
                             1, 8, 1.0f, NULL, NULL) == HK_CUDA_EINVAL;
    good &= hk_cuda_attention_ex(HK_CUDA_ATT_FLASH3, &x, &x, NULL, &x, &x, 1, 1,
                                 1, 1, 8, 1.0f, NULL,
                                 NULL) == HK_CUDA_EINVAL; /* no scratch */
    good &= hk_cuda_attention_decode_ex(HK_CUDA_ATT_FLASH, &x, &x, NULL, NULL,
                                        NULL, 1, 32, 1, 8, 1.0f, NULL,
                                        NULL) == HK_CUDA_EINVAL; /* r > 16 */
    /* page sizes: powers of two from HK_CUDA_PAGE_MIN only */
    for (int P = 0; P <= 2 * HK_CUDA_PAGE_MAX; P = P < 64 ? P + 1 : 2 * P) {
        const int pw2 =
            P >= HK_CUDA_PAGE_MIN && P <= HK_CUDA_PAGE_MAX && !(P & (P - 1));
        const int want = pw2 ? HK_CUDA_OK : HK_CUDA_EINVAL;
        /* B = 0: nothing launched where P is good */
        good &= hk_cuda_attention_decode_paged(&x, &x, &x, &x, NULL, 1, NULL, 0,
                                               P, 2, 1, 8, 1.0f, NULL) == want;
        good &= hk_cuda_kv_store_paged(&x, &x, &x, &x, NULL, 1, NULL, 0, P, 8,
                                       NULL) == want;
    }
    good &= hk_cuda_attention_decode_paged(&x, &x, &x, &x, NULL, 0, NULL, 1, 16,
                                           2, 1, 8, 1.0f,
                                           NULL) == HK_CUDA_EINVAL; /* pages */
    good &=
        hk_cuda_topk(&x, NULL, NULL, NULL, &x, 1, 10, 10, HK_CUDA_TOPK_MAX + 1,
                     1.0, 0, &x, NULL) == HK_CUDA_EINVAL;
    good &= hk_cuda_topk(&x, NULL, NULL, NULL, &x, 1, 10, 10, 5, 1.0, 0, NULL,
                         NULL) == HK_CUDA_EINVAL; /* no scratch */
    good &=
        hk_cuda_topk(&x, NULL, NULL, NULL, &x, 1, 10, 10, 5, 1.0,
                     HK_CUDA_SAMPLE_SPLITS_MAX + 1, &x, NULL) == HK_CUDA_EINVAL;
    good &= hk_cuda_argmax(NULL, &x, 1, 10, 9, 0, NULL, NULL) ==
            HK_CUDA_EINVAL; /* rows closer than V */
    good &= hk_cuda_argmax(NULL, &x, 1, 10, 10, 2, NULL, NULL) ==
            HK_CUDA_EINVAL; /* splits without scratch */
    good &= hk_cuda_moe_route(NULL, &x, &x, 1, 4, 5, 1, NULL) == HK_CUDA_EINVAL;
    good &= hk_cuda_matmul(&x, &x, &x, 1, 1, 1, NULL, NULL) == HK_CUDA_EINVAL;
    const hk_weight_t wi8 = {&x, &x, HK_W_I8,
                             1,  6,  4}; /* group must divide cols */
    good &= hk_cuda_weight_rows(&x, &wi8, NULL, 1, NULL) == HK_CUDA_EINVAL;
    hk_cuda_blas_t *blas = NULL;
    CK(hk_cuda_blas_create(&blas));
    good &= hk_cuda_linear_i8(&x, &x, &wi8, 1, 0, NULL, 0, blas, NULL) ==
            HK_CUDA_EINVAL;
    const hk_weight_t wok = {&x, &x, HK_W_I8, 1, 8, 4};
    good &=
        hk_cuda_linear_i8(&x, &x, &wok, HK_CUDA_I8_DIRECT + 1, 0, &x, 7, blas,
                          NULL) == HK_CUDA_EINVAL; /* a tile holds no row */
    hk_cuda_blas_destroy(blas);
    int cu[2] = {0, 1};
    float *tab[1] = {&x};
    uint16_t hb = 0;
    good &= hk_cuda_gdn_chunk_bf16(&x, tab, NULL, &hb, &hb, &hb, &x, &x, cu, 1,
                                   1, 1, 1, 24, 16, 16, &x,
                                   NULL) == HK_CUDA_EINVAL; /* dk % 16 */
    good &= hk_cuda_gdn_chunk_bf16_ex(&x, tab, NULL, &hb, &hb, &hb, &x, &x, cu,
                                      1, 1, 1, 1, 16, 16, 16, &x,
                                      HK_CUDA_GDN_TC_FLAGS + 1, NULL,
                                      NULL) == HK_CUDA_EINVAL; /* flags */
    good &=
        hk_cuda_gdn_chunk_tc_ex(&x, tab, NULL, &x, &x, &x, &x, &x, cu, 1, 1, 1,
                                1, 16, 16, 16, &x, HK_CUDA_GDN_TC_FLAGS + 1,
                                NULL, NULL) == HK_CUDA_EINVAL; /* flags */
    good &= hk_cuda_gdn_chunk_bf16_ex(
                &x, tab, NULL, &hb, &hb, &hb, &x, &x, cu, 1, 1, 1, 1, 16, 16,
                16, &x, HK_CUDA_GDN_TC_A1 | HK_CUDA_GDN_TC_A3, NULL,
                NULL) == HK_CUDA_EINVAL; /* two kernels A */
    good &= hk_cuda_gdn_chunk_bf16_ex(&x, tab, NULL, &hb, &hb, &hb, &x, &x, cu,
                                      1, 1, 1, 1, 16, 16, 16, &x,
                                      HK_CUDA_GDN_TC_OVERLAP, NULL,
                                      NULL) == HK_CUDA_EINVAL; /* no lanes */
    good &= hk_cuda_gdn_chunk_tc_ex(
                &x, tab, NULL, &x, &x, &x, &x, &x, cu, 1, 1, 1, 1, 16, 16, 16,
                &x, HK_CUDA_GDN_TC_OVERLAP | HK_CUDA_GDN_TC_V1, test_lanes(),
                NULL) == HK_CUDA_EINVAL; /* overlap v1 */
    good &= hk_cuda_lanes_create(NULL) == HK_CUDA_EINVAL;
    hk_cuda_lanes_destroy(NULL);
    good &= hk_cuda_gdn_step(&x, tab, tab, &x, &x, &x, &x, &x, &x, 1, 1, 1, 16,
                             6, 4, 1e-6f, 1.0f, NULL) == HK_CUDA_EINVAL;
    good &= hk_cuda_gdn_step_impl((hk_cuda_step_impl_t)(HK_CUDA_STEP_PIPEW + 1),
                                  &x, tab, tab, &x, &x, &x, &x, &x, &x, 1, 1, 1,
                                  16, 16, 4, 1e-6f, 1.0f,
                                  NULL) == HK_CUDA_EINVAL; /* impl */
    hk_kvbuf_geom_t kg = {1, 1, 16, HK_CUDA_KVBUF_MAX_DV + 1, 16};
    hk_kvbuf_view_t kv = {NULL, NULL, 0};
    good &= hk_cuda_kvbuf_step(&x, &x, &kv, &x, &x, &x, &x, &x, 1, 1, &kg, 4,
                               NULL) == HK_CUDA_EINVAL;
    kg.dv = 16, kg.bs = 65;
    good &= hk_cuda_kvbuf_flush(&x, &kv, cu, 1, &kg, NULL) == HK_CUDA_EINVAL;
    kg.bs = 16; /* v2 by name where it cannot run: T > 1, bs not 2^k */
    good &= hk_cuda_kvbuf_step_ex(&x, &x, &kv, &x, &x, &x, &x, &x, 1, 2, &kg, 4,
                                  HK_CUDA_KVBUF_V2, NULL) == HK_CUDA_EINVAL;
    good &= hk_cuda_kvbuf_step_ex(&x, &x, &kv, &x, &x, &x, &x, &x, 1, 1, &kg, 4,
                                  HK_CUDA_KVBUF_FLAGS + 1,
                                  NULL) == HK_CUDA_EINVAL; /* flags */
    kg.bs = 12;
    good &= hk_cuda_kvbuf_flush_ex(&x, &kv, cu, 1, &kg, HK_CUDA_KVBUF_CW64,
                                   NULL) == HK_CUDA_EINVAL;
    ok(good, "launchers return HK_CUDA_EINVAL on bad shapes");
}

/* HK_CUDA_TEST_ONLY: does the test's name hold one of its comma-separated
 * parts? */
static int only_match(const char *only, const char *name)
{
    char part[128];
    for (const char *at = only;; at++) {
        const size_t n = strcspn(at, ",");
        if (n > 0 && n < sizeof part) {
            memcpy(part, at, n);
            part[n] = 0;
            if (strstr(name, part))
                return 1;
        }
        at += n;
        if (!*at)
            return 0;
    }
}

static void run_all(void)
{
    const char *grid = getenv("HK_CUDA_TEST_GRID");
    small_grid = grid && strcmp(grid, "small") == 0;
    if (small_grid)
        tap_diag("HK_CUDA_TEST_GRID=small: the first shapes of each grid");
    const char *only = getenv("HK_CUDA_TEST_ONLY");
    if (only)
        tap_diag("HK_CUDA_TEST_ONLY=%s: only the tests whose names hold it",
                 only);
/* HK_CUDA_TEST_ONLY=gdn_chunk runs test_gdn_chunk* only (while iterating);
 * test_sample,test_moe both. */
#define RUN_TEST(fn)                                                           \
    do {                                                                       \
        if (!only || only_match(only, #fn))                                    \
            fn();                                                              \
    } while (0)
    RUN_TEST(test_norms); /* rmsnorm_zc, rmsnorm_gated, l2norm */
    RUN_TEST(test_swiglu);
    RUN_TEST(test_conv);
    RUN_TEST(test_conv_decode);
    RUN_TEST(test_conv_qkv);
    RUN_TEST(test_conv_qkv_decode);
    RUN_TEST(test_rope); /* rope, rope_shift */
    RUN_TEST(test_qk_norm_rope);
    RUN_TEST(test_gdn_gates);
    RUN_TEST(test_gdn_recurrent);
    RUN_TEST(test_gdn_decode);
    RUN_TEST(test_gdn_chunk);
    RUN_TEST(test_trans_compose);
    RUN_TEST(test_trans_chain);
    RUN_TEST(test_trans_rope_shift);
    RUN_TEST(test_matmul); /* matmul, matmul_acc, matmul_bf16 */
    RUN_TEST(test_gemv);
    RUN_TEST(test_gemv_swiglu);
    RUN_TEST(test_linear_i8);
    RUN_TEST(test_split_heads);
    RUN_TEST(test_gate_scale); /* gate_mul, scale_rows */
    RUN_TEST(test_kv_store);   /* kv_store, kv_store_decode, _paged */
    RUN_TEST(test_embed);
    RUN_TEST(test_attention);
    RUN_TEST(test_attention_flash2x);
    RUN_TEST(test_attention_split);
    RUN_TEST(test_attention_decode);
    RUN_TEST(test_attention_decode_paged);
    RUN_TEST(test_moe); /* moe_route, moe_plan, moe_gather, moe_scatter,
                           moe_combine */
    RUN_TEST(test_moe_plan);
    RUN_TEST(test_sample); /* argmax, topk */
    RUN_TEST(test_gdn_chunk_bf16);
    RUN_TEST(test_gdn_chunk_same);
    RUN_TEST(test_gdn_chunk_varlen);
    RUN_TEST(test_gdn_chunk_tc);
    RUN_TEST(test_gdn_step);
    RUN_TEST(test_gdn_step_probe);
    RUN_TEST(test_tuner);
    RUN_TEST(test_probe);
    RUN_TEST(test_kvbuf); /* kvbuf_step, kvbuf_verify, kvbuf_flush */
    RUN_TEST(test_kvbuf_verify);
    RUN_TEST(test_kvbuf_conv_commit);
    RUN_TEST(test_ring);
    RUN_TEST(test_einval);
    RUN_TEST(test_attention_flash3); /* last: see there */
#undef RUN_TEST
}

#endif /* HK_HAVE_CUDA */

int main(void)
{
    int ndev = 0;
    print_plan();
#ifdef HK_HAVE_CUDA
    int rc = hk_cuda_device_count(&ndev);
    if (rc)
        tap_diag("hk_cuda_device_count: %s", hk_cuda_strerror(rc));
    tap_diag("CUDA devices: %d", ndev);
#else
    tap_diag("CUDA backend not built (no nvcc, or NO_DEVICE=1)");
#endif
    if (ndev == 0) {
        for (int i = 0; i < N_OPS; i++)
            tap_skip("no CUDA device");
        return tap_done();
    }
#ifdef HK_HAVE_CUDA
    run_all();
#endif
    return tap_done();
}
