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
 * Built with -DHK_HAVE_CUDA and linked with libhk_cuda.a -lcudart -lcublas
 * when nvcc exists; without it, or on a machine with no device, it prints
 * the plan and one "ok N # SKIP no CUDA device" per op and exits 0.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/common/hk_math.h"
#include "kernels/cpu/hk_cpu.h"
#include "t/lib/tap.h"
#define TEST_RNG_SEED 0x6a09e667f3bcc909ull
#include "t/lib/testrand.h"
#ifdef HK_HAVE_CUDA
#include "kernels/cuda/hk_cuda.h"
#endif

static const char *const op_names[] = {
    "rmsnorm_zc",    "rmsnorm_gated", "l2norm",
    "swiglu",        "conv1d_silu",   "conv1d_silu_decode",
    "rope",          "rope_shift",    "gdn_gates",
    "gdn_recurrent", "gdn_decode",    "gdn_chunk",
    "trans_compose", "trans_chain",   "trans_rope_shift"};
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

/* ---- plumbing ------------------------------------------------------------ */

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

static float *hmalloc(size_t n)
{
    float *x = malloc((n ? n : 1) * sizeof(float));
    if (!x) {
        printf("Bail out! out of host memory\n");
        exit(1);
    }
    return x;
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

/* One check per (op, shape): the worst ratio over the named tensors. */
static int close_cpu(const float *ref, const float *d_x, size_t n, double atol,
                     double rtol, const char *what)
{
    float *x = host_from(d_x, n);
    double r = tap_close_ratio_f(ref, x, n, atol, rtol);
    free(x);
    if (!(r <= 1.0))
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

/* ---- norms and activations ------------------------------------------------
 */

static const int norm_shapes[][2] = {{1, 1},    {3, 17},    {7, 128}, {5, 257},
                                     {2, 1000}, {33, 2048}, {4, 8191}};
#define N_NORM ((int)(sizeof(norm_shapes) / sizeof(norm_shapes[0])))

static void test_norms(void)
{
    const float eps = 1e-6f;
    for (int s = 0; s < N_NORM; s++) {
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
        /* in place (y aliases x) on a copy */
        float *dxi = dev_from(x, n);
        RUN(hk_cuda_rmsnorm_zc(dxi, dxi, dw, rows, dim, eps, NULL));
        good &= close_cpu(y, dxi, n, ATOL_NORM, RTOL_NORM, "y in place");
        ok(good, "rmsnorm_zc rows=%d dim=%d (and in place)", rows, dim);

        hk_rmsnorm_gated(y, x, z, w, rows, dim, eps);
        RUN(hk_cuda_rmsnorm_gated(dy, dx, dz, dw, rows, dim, eps, NULL));
        ok(close_cpu(y, dy, n, ATOL_NORM, RTOL_NORM, "y"),
           "rmsnorm_gated rows=%d dim=%d", rows, dim);

        const float scale = 1.0f / sqrtf((float)dim);
        memcpy(y, x, n * sizeof(float));
        hk_l2norm(y, rows, dim, eps, scale);
        RUN(hk_cuda_l2norm(dx, rows, dim, eps, scale, NULL));
        ok(close_cpu(y, dx, n, ATOL_NORM, RTOL_NORM, "x"),
           "l2norm rows=%d dim=%d", rows, dim);

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
    for (int s = 0; s < (int)(sizeof(ns) / sizeof(ns[0])); s++) {
        const size_t n = ns[s];
        float *g = frand(n, 12.0), *u = frand(n, 2.0), *y = hmalloc(n);
        float *dg = dev_from(g, n), *du = dev_from(u, n), *dy = dev_alloc(n);
        hk_swiglu(y, g, u, n);
        RUN(hk_cuda_swiglu(dy, dg, du, n, NULL));
        ok(close_cpu(y, dy, n, ATOL_EW, RTOL_EW, "y"), "swiglu n=%zu", n);
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
    for (int s = 0; s < (int)(sizeof(shapes) / sizeof(shapes[0])); s++) {
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

/* B requests, one token each, every state in its own allocation (pool
 * slots), against hk_conv1d_silu with T = 1 per request. */
static void test_conv_decode(void)
{
    static const int shapes[][3] = {{1, 37, 4}, {3, 256, 4}, {8, 129, 2}};
    for (int s = 0; s < (int)(sizeof(shapes) / sizeof(shapes[0])); s++) {
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
    for (int s = 0; s < (int)(sizeof(shapes) / sizeof(shapes[0])); s++) {
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

/* The gates against the shared inline math evaluated on the host (the
 * engine's loop has no CPU kernel of its own); a + dt_bias crosses the
 * softplus threshold of 20 in both directions. */
static void test_gdn_gates(void)
{
    static const int shapes[][2] = {{1, 1}, {7, 5}, {33, 32}};
    for (int s = 0; s < (int)(sizeof(shapes) / sizeof(shapes[0])); s++) {
        const int T = shapes[s][0], Hv = shapes[s][1];
        const size_t n = (size_t)T * Hv;
        float *a = frand(n, 25.0), *b = frand(n, 8.0);
        float *Al = frand((size_t)Hv, 2.0), *dt = frand((size_t)Hv, 3.0);
        float *g = hmalloc(n), *be = hmalloc(n);
        for (size_t e = 0; e < n; e++) {
            const int h = (int)(e % Hv);
            g[e] = hk_math_gdn_gate(a[e], Al[h], dt[h]);
            be[e] = hk_math_sigmoid(b[e]);
        }
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
                                    {9, 2, 4, 32, 33},  {16, 2, 6, 64, 64},
                                    {3, 1, 1, 100, 40}, {4, 2, 2, 128, 128},
                                    {2, 1, 1, 256, 7},  {40, 1, 2, 48, 80}};
#define N_GDN ((int)(sizeof(gdn_shapes) / sizeof(gdn_shapes[0])))

static void test_gdn_recurrent(void)
{
    for (int s = 0; s < N_GDN; s++) {
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
    for (int s = 0; s < (int)(sizeof(shapes) / sizeof(shapes[0])); s++) {
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
        {0, 1, 2, 16, 8, 16, 1},      {1, 1, 1, 16, 8, 64, 1},
        {37, 1, 2, 32, 24, 16, 1},    {64, 2, 4, 64, 64, 64, 1},
        {100, 1, 2, 128, 128, 64, 1}, {130, 2, 2, 48, 17, 32, 0},
        {9, 1, 1, 256, 33, 4, 1},     {20, 1, 3, 20, 20, 7, 1},
        {6, 1, 1, 8, 5, 1, 1}};
    for (int s = 0; s < (int)(sizeof(shapes) / sizeof(shapes[0])); s++) {
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
        for (int s = 0; s < N_TRANS; s++) {
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
        for (int s = 0; s < N_TRANS; s++) {
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
    for (int s = 0; s < (int)(sizeof(shapes) / sizeof(shapes[0])); s++) {
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
    ok(good, "launchers return HK_CUDA_EINVAL on bad shapes");
}

static void run_all(void)
{
    test_norms(); /* rmsnorm_zc, rmsnorm_gated, l2norm */
    test_swiglu();
    test_conv();
    test_conv_decode();
    test_rope(); /* rope, rope_shift */
    test_gdn_gates();
    test_gdn_recurrent();
    test_gdn_decode();
    test_gdn_chunk();
    test_trans_compose();
    test_trans_chain();
    test_trans_rope_shift();
    test_einval();
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
