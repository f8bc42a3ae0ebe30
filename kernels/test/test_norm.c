/*
 * test_norm.c - hk_rmsnorm_zc, hk_rmsnorm_gated, hk_l2norm and hk_swiglu
 * against float64 brute force: dim 1 and odd dims, row counts on both sides
 * of the OpenMP threshold, in-place use, zero rows, extreme gates.
 */
#include <stdint.h>
#include <string.h>

#include "kernels/cpu/hk_cpu.h"
#include "t/lib/tap.h"
#define TEST_RNG_SEED 0x13198a2e03707344ull
#include "t/lib/testrand.h"

/* Each output is a product of a few correctly rounded factors (the
 * normalizer is summed in double and rounded once, then 2-3 float
 * multiplies): <= ~4 roundings of 2^-24, so 5e-7 relative. The absolute
 * part covers (1 + w) and silu's 1 + e^-z rounded in float near
 * cancellation, each <= 2^-24 times an O(1) factor. */
#define RTOL_NORM 5e-7
#define ATOL_NORM 2e-7
/* silu adds expf (<= 1 ulp) and a division: a few more roundings. */
#define RTOL_SILU 1e-6
#define ATOL_SILU 2e-7

static double dsilu(double z)
{
    return z / (1.0 + exp(-z));
}

/* Inverse RMS / inverse L2 norm of one row, float64. */
static double inv_rms(const float *x, int dim, double eps)
{
    double ss = 0.0;
    for (int i = 0; i < dim; i++)
        ss += (double)x[i] * x[i];
    return 1.0 / sqrt(ss / dim + eps);
}

static void check_rms(int rows, int dim, int inplace)
{
    const double eps = 1e-6;
    size_t n = (size_t)rows * dim;
    float *x = frand_amp(n, 3.0), *w = frand_amp((size_t)dim, 1.0);
    float *y = malloc(n * sizeof(float));
    double *ref = malloc(n * sizeof(double));
    if (rows > 1) /* a zero row: y = 0, not NaN */
        memset(x + dim, 0, (size_t)dim * sizeof(float));
    for (int r = 0; r < rows; r++) {
        double s = inv_rms(x + (size_t)r * dim, dim, eps);
        for (int i = 0; i < dim; i++)
            ref[(size_t)r * dim + i] =
                x[(size_t)r * dim + i] * s * (1.0 + (double)w[i]);
    }
    if (inplace) {
        hk_rmsnorm_zc(x, x, w, rows, dim, (float)eps);
        memcpy(y, x, n * sizeof(float));
    } else {
        hk_rmsnorm_zc(y, x, w, rows, dim, (float)eps);
    }
    close_d(ref, y, n, ATOL_NORM, RTOL_NORM, "rmsnorm_zc rows=%d dim=%d%s",
            rows, dim, inplace ? " in place" : "");
    free(x);
    free(w);
    free(y);
    free(ref);
}

static void check_gated(int rows, int dim)
{
    const double eps = 1e-6;
    size_t n = (size_t)rows * dim;
    float *x = frand_amp(n, 2.0), *z = frand_amp(n, 6.0),
          *w = frand_amp((size_t)dim, 1.5);
    float *y = malloc(n * sizeof(float));
    double *ref = malloc(n * sizeof(double));
    for (int r = 0; r < rows; r++) {
        double s = inv_rms(x + (size_t)r * dim, dim, eps);
        for (int i = 0; i < dim; i++) {
            size_t k = (size_t)r * dim + i;
            ref[k] = (double)w[i] * (x[k] * s) * dsilu(z[k]);
        }
    }
    hk_rmsnorm_gated(y, x, z, w, rows, dim, (float)eps);
    close_d(ref, y, n, ATOL_SILU, RTOL_SILU, "rmsnorm_gated rows=%d dim=%d",
            rows, dim);
    free(x);
    free(z);
    free(w);
    free(y);
    free(ref);
}

static void check_l2(int rows, int dim, double scale)
{
    const double eps = 1e-6;
    size_t n = (size_t)rows * dim;
    float *x = frand_amp(n, 1.0);
    double *ref = malloc(n * sizeof(double));
    if (rows > 1)
        memset(x, 0, (size_t)dim * sizeof(float));
    for (int r = 0; r < rows; r++) {
        double ss = 0.0;
        for (int i = 0; i < dim; i++)
            ss += (double)x[(size_t)r * dim + i] * x[(size_t)r * dim + i];
        for (int i = 0; i < dim; i++)
            ref[(size_t)r * dim + i] =
                x[(size_t)r * dim + i] / sqrt(ss + eps) * scale;
    }
    hk_l2norm(x, rows, dim, (float)eps, (float)scale);
    close_d(ref, x, n, ATOL_NORM, RTOL_NORM, "l2norm rows=%d dim=%d scale=%g",
            rows, dim, scale);
    free(x);
    free(ref);
}

static void check_swiglu(size_t n, int alias)
{
    float *g = frand_amp(n, 12.0), *u = frand_amp(n, 2.0);
    float *y = malloc(n * sizeof(float));
    double *ref = malloc(n * sizeof(double));
    if (n >= 4) { /* expf(-z) overflows / underflows here */
        g[0] = -100.0f;
        g[1] = 100.0f;
        g[2] = -88.5f;
        g[3] = 0.0f;
    }
    for (size_t i = 0; i < n; i++)
        ref[i] = dsilu(g[i]) * u[i];
    if (alias) {
        hk_swiglu(g, g, u, n);
        memcpy(y, g, n * sizeof(float));
    } else {
        hk_swiglu(y, g, u, n);
    }
    close_d(ref, y, n, ATOL_SILU, RTOL_SILU, "swiglu n=%zu%s", n,
            alias ? " (y aliases g)" : "");
    free(g);
    free(u);
    free(y);
    free(ref);
}

int main(void)
{
    check_rms(1, 1, 0);
    check_rms(3, 37, 0);
    check_rms(3, 37, 1);
    check_rms(40, 2048, 0); /* above the OpenMP threshold */
    check_rms(40, 1024, 1);
    check_gated(1, 1);
    check_gated(7, 128);
    check_gated(300, 128); /* GDN: one row per (token, value head) */
    check_l2(1, 1, 1.0);
    check_l2(5, 37, 1.0);
    check_l2(400, 128, 1.0 / sqrt(128.0)); /* q scaling of the GDN */
    check_swiglu(1, 0);
    check_swiglu(1001, 0);
    check_swiglu(100003, 1);
    return tap_done();
}
