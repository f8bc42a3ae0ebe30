/*
 * hk_norm.cu - CUDA twins of hk_norm.c: RMS/L2 norms and SwiGLU.
 *
 *   rmsnorm_zc:    y = x / sqrt(mean(x^2) + eps) * (1 + w)   per row of dim
 *   rmsnorm_gated: y = w * x / sqrt(mean(x^2) + eps) * silu(z) per row of dim
 *   l2norm:        x <- x / sqrt(sum(x^2) + eps) * scale      per row of dim
 *   swiglu:        y = silu(g) * u                             elementwise
 *                  (g, u f32, or bf16: hk_cuda_swiglu_bf16_in)
 *
 * Layouts: x, y, z [rows, dim] row-major, w [dim]. References as hk_norm.c.
 *
 * One block per row. The sum of squares is accumulated in f32 per thread
 * and added in a tree (block reduction): its relative error is ~log2(dim)
 * roundings, not dim as in a serial f32 sum, so it stays within a few ulp
 * of the CPU's double sum; the normalizer is then formed in double and
 * rounded once, like the CPU. Element order within a row is the CPU's.
 *
 * The _bf16 entries write y rounded to bf16 (nearest even) instead: the
 * same kernels with another store, so y is the f32 kernel's rounded, bit
 * for bit: the input of a bf16 projection (hk_cuda_matmul_bf16 with x
 * NULL) without an f32 copy written and read back.
 */
#include "kernels/cuda/hk_cuda_impl.h"

/* Rows go on gridDim.x, which takes any int row count; HK_ROW_THREADS
 * (hk_cuda_impl.h) threads a row, elementwise kernels as many. */

/* An output element: f32, or bf16 as hk_cuda_matmul_bf16 rounds x. */
static __device__ __forceinline__ void hk_put(float *y, size_t i, float v)
{
    y[i] = v;
}
static __device__ __forceinline__ void hk_put(uint16_t *y, size_t i, float v)
{
    y[i] = hk_bf16_from_f32(v);
}

/* y may alias x (f32): each element is read, then written, by the same
 * thread, and the reduction has finished reading the row before anyone
 * writes. */
template <class Y>
static __global__ void hk_rmsnorm_zc_kernel(Y *y,           // [rows, dim]
                                            const float *x, // [rows, dim]
                                            const float *w, // [dim]
                                            int dim, float eps)
{
    __shared__ float sh[32];
    const size_t r = blockIdx.x;
    const float *xr = x + r * dim;
    Y *yr = y + r * dim;
    const float ss = hk_row_sumsq(xr, dim, sh);
    const float inv = (float)(1.0 / sqrt((double)ss / dim + eps));
    for (int i = threadIdx.x; i < dim; i += blockDim.x)
        hk_put(yr, i, xr[i] * inv * (1.0f + w[i]));
}

template <class Y>
static __global__ void hk_rmsnorm_gated_kernel(Y *y,           // [rows, dim]
                                               const float *x, // [rows, dim]
                                               const float *z, // [rows, dim]
                                               const float *w, // [dim]
                                               int dim, float eps)
{
    __shared__ float sh[32];
    const size_t r = blockIdx.x;
    const float *xr = x + r * dim, *zr = z + r * dim;
    Y *yr = y + r * dim;
    const float ss = hk_row_sumsq(xr, dim, sh);
    const float inv = (float)(1.0 / sqrt((double)ss / dim + eps));
    for (int i = threadIdx.x; i < dim; i += blockDim.x)
        hk_put(yr, i, w[i] * (xr[i] * inv) * hk_math_silu(zr[i]));
}

static __global__ void hk_l2norm_kernel(float *x, // [rows, dim], in place
                                        int dim, float eps, float scale)
{
    __shared__ float sh[32];
    float *xr = x + (size_t)blockIdx.x * dim;
    const float ss = hk_row_sumsq(xr, dim, sh);
    const float f = hk_l2_factor(ss, eps, scale);
    for (int i = threadIdx.x; i < dim; i += blockDim.x)
        xr[i] *= f;
}

/* An input element as f32 (bf16 widened exactly). */
static __device__ __forceinline__ float hk_get(const float *x, size_t i)
{
    return x[i];
}
static __device__ __forceinline__ float hk_get(const uint16_t *x, size_t i)
{
    return hk_bf16_to_f32(x[i]);
}

/* y may alias g or u: each element is read, then written, by one thread. */
template <class Y, class X>
static __global__ void hk_swiglu_kernel(Y *y,       // [n]
                                        const X *g, // [n]
                                        const X *u, // [n]
                                        size_t n)
{
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += stride)
        hk_put(y, i, hk_math_silu(hk_get(g, i)) * hk_get(u, i));
}

static int hk_norm_args_ok(int rows, int dim)
{
    return rows >= 0 && dim > 0;
}

template <class Y>
static int hk_rmsnorm_zc(Y *y, const float *x, const float *w, int rows,
                         int dim, float eps, void *stream)
{
    if (!hk_norm_args_ok(rows, dim))
        return HK_CUDA_EINVAL;
    if (rows == 0)
        return HK_CUDA_OK;
    hk_rmsnorm_zc_kernel<<<rows, HK_ROW_THREADS, 0, hk_stream(stream)>>>(
        y, x, w, dim, eps);
    return hk_cuda_check_launch();
}

extern "C" int hk_cuda_rmsnorm_zc(float *y, const float *x, const float *w,
                                  int rows, int dim, float eps, void *stream)
{
    return hk_rmsnorm_zc(y, x, w, rows, dim, eps, stream);
}

extern "C" int hk_cuda_rmsnorm_zc_bf16(uint16_t *y, const float *x,
                                       const float *w, int rows, int dim,
                                       float eps, void *stream)
{
    return hk_rmsnorm_zc(y, x, w, rows, dim, eps, stream);
}

template <class Y>
static int hk_rmsnorm_gated(Y *y, const float *x, const float *z,
                            const float *w, int rows, int dim, float eps,
                            void *stream)
{
    if (!hk_norm_args_ok(rows, dim))
        return HK_CUDA_EINVAL;
    if (rows == 0)
        return HK_CUDA_OK;
    hk_rmsnorm_gated_kernel<<<rows, HK_ROW_THREADS, 0, hk_stream(stream)>>>(
        y, x, z, w, dim, eps);
    return hk_cuda_check_launch();
}

extern "C" int hk_cuda_rmsnorm_gated(float *y, const float *x, const float *z,
                                     const float *w, int rows, int dim,
                                     float eps, void *stream)
{
    return hk_rmsnorm_gated(y, x, z, w, rows, dim, eps, stream);
}

extern "C" int hk_cuda_rmsnorm_gated_bf16(uint16_t *y, const float *x,
                                          const float *z, const float *w,
                                          int rows, int dim, float eps,
                                          void *stream)
{
    return hk_rmsnorm_gated(y, x, z, w, rows, dim, eps, stream);
}

extern "C" int hk_cuda_l2norm(float *x, int rows, int dim, float eps,
                              float scale, void *stream)
{
    if (!hk_norm_args_ok(rows, dim))
        return HK_CUDA_EINVAL;
    if (rows == 0)
        return HK_CUDA_OK;
    hk_l2norm_kernel<<<rows, HK_ROW_THREADS, 0, hk_stream(stream)>>>(
        x, dim, eps, scale);
    return hk_cuda_check_launch();
}

template <class Y, class X>
static int hk_swiglu(Y *y, const X *g, const X *u, size_t n, void *stream)
{
    if (n == 0)
        return HK_CUDA_OK;
    hk_swiglu_kernel<<<hk_grid_1d(n, HK_ROW_THREADS), HK_ROW_THREADS, 0,
                       hk_stream(stream)>>>(y, g, u, n);
    return hk_cuda_check_launch();
}

extern "C" int hk_cuda_swiglu(float *y, const float *g, const float *u,
                              size_t n, void *stream)
{
    return hk_swiglu(y, g, u, n, stream);
}

extern "C" int hk_cuda_swiglu_bf16(uint16_t *y, const float *g, const float *u,
                                   size_t n, void *stream)
{
    return hk_swiglu(y, g, u, n, stream);
}

extern "C" int hk_cuda_swiglu_bf16_in(uint16_t *y, const uint16_t *g,
                                      const uint16_t *u, size_t n, void *stream)
{
    return hk_swiglu(y, g, u, n, stream);
}
