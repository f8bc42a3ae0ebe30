/*
 * hk_norm.c - RMS/L2 norms and the SwiGLU activation.
 *
 *   rmsnorm_zc:    y = x / sqrt(mean(x^2) + eps) * (1 + w)   per row of dim
 *   rmsnorm_gated: y = w * x / sqrt(mean(x^2) + eps) * silu(z) per row of dim
 *   l2norm:        x <- x / sqrt(sum(x^2) + eps) * scale      per row of dim
 *   swiglu:        y = silu(g) * u                             elementwise
 *
 * Layouts: x, y, z [rows, dim] row-major, w [dim]. References (HF
 * transformers, qwen3_next / qwen3_5): Qwen3NextRMSNorm (zero-centred, the
 * input/post-attention/final/q/k norms), Qwen3NextRMSNormGated
 * (linear_attn.norm, plain weight, norm first then gate), l2norm in the
 * torch chunk_gated_delta_rule (x * rsqrt(sum(x*x) + eps), eps inside the
 * sqrt), Qwen3NextMLP (act_fn(gate) * up). Architecture spec §3.6, §3.8, §5.
 *
 * Precision: the sums of squares are accumulated in double. HF accumulates
 * in float32; double costs nothing here (these loops are memory bound) and
 * keeps the normalizer exact to float rounding for any dim, so the only
 * float error left is the final per-element multiply. Rows are independent,
 * each computed by one thread, so results do not depend on the thread count.
 */
#include <assert.h>
#include <math.h>

#include "kernels/cpu/hk_cpu.h"

/* Below this many elements the OpenMP fork costs more than the loop. */
#define HK_NORM_PAR_MIN 32768

static double hk_sumsq(const float *restrict x, int dim)
{
    double ss = 0.0;
#pragma omp simd reduction(+ : ss)
    for (int i = 0; i < dim; i++)
        ss += (double)x[i] * (double)x[i];
    return ss;
}

/* y may alias x: every element is read before it is written, same index. */
void hk_rmsnorm_zc(float *y,       // [rows, dim]
                   const float *x, // [rows, dim]
                   const float *w, // [dim]
                   int rows, int dim, float eps)
{
    assert(rows >= 0 && dim > 0);
#pragma omp parallel for schedule(static) if ((size_t)rows * (size_t)dim >=    \
                                              HK_NORM_PAR_MIN)
    for (int r = 0; r < rows; r++) {
        const float *xr = x + (size_t)r * dim;
        float *yr = y + (size_t)r * dim;
        float inv = (float)(1.0 / sqrt(hk_sumsq(xr, dim) / dim + eps));
#pragma omp simd
        for (int i = 0; i < dim; i++)
            yr[i] = xr[i] * inv * (1.0f + w[i]);
    }
}

void hk_rmsnorm_gated(float *y,       // [rows, dim]
                      const float *x, // [rows, dim]
                      const float *z, // [rows, dim] gate
                      const float *w, // [dim]
                      int rows, int dim, float eps)
{
    assert(rows >= 0 && dim > 0);
#pragma omp parallel for schedule(static) if ((size_t)rows * (size_t)dim >=    \
                                              HK_NORM_PAR_MIN)
    for (int r = 0; r < rows; r++) {
        const float *xr = x + (size_t)r * dim;
        const float *zr = z + (size_t)r * dim;
        float *yr = y + (size_t)r * dim;
        float inv = (float)(1.0 / sqrt(hk_sumsq(xr, dim) / dim + eps));
        for (int i = 0; i < dim; i++)
            yr[i] = w[i] * (xr[i] * inv) * hk_silu(zr[i]);
    }
}

void hk_l2norm(float *x, // [rows, dim], in place
               int rows, int dim, float eps, float scale)
{
    assert(rows >= 0 && dim > 0);
#pragma omp parallel for schedule(static) if ((size_t)rows * (size_t)dim >=    \
                                              HK_NORM_PAR_MIN)
    for (int r = 0; r < rows; r++) {
        float *xr = x + (size_t)r * dim;
        float f = (float)(scale / sqrt(hk_sumsq(xr, dim) + eps));
#pragma omp simd
        for (int i = 0; i < dim; i++)
            xr[i] *= f;
    }
}

/* y may alias g or u (same-index read before write). */
void hk_swiglu(float *y,       // [n]
               const float *g, // [n] gate projection
               const float *u, // [n] up projection
               size_t n)
{
    ptrdiff_t nn = (ptrdiff_t)n;
#pragma omp parallel for schedule(static) if (n >= HK_NORM_PAR_MIN)
    for (ptrdiff_t i = 0; i < nn; i++)
        y[i] = hk_silu(g[i]) * u[i];
}
