/*
 * hk_norm.cu - CUDA twins of hk_norm.c: RMS/L2 norms and SwiGLU.
 *
 *   rmsnorm_zc:    y = x / sqrt(mean(x^2) + eps) * (1 + w)   per row of dim
 *   rmsnorm_gated: y = w * x / sqrt(mean(x^2) + eps) * silu(z) per row of dim
 *   l2norm:        x <- x / sqrt(sum(x^2) + eps) * scale      per row of dim
 *   swiglu:        y = silu(g) * u                             elementwise
 *
 * Layouts: x, y, z [rows, dim] row-major, w [dim]. References as hk_norm.c.
 *
 * One block per row. The sum of squares is accumulated in f32 per thread
 * and added in a tree (block reduction): its relative error is ~log2(dim)
 * roundings, not dim as in a serial f32 sum, so it stays within a few ulp
 * of the CPU's double sum; the normalizer is then formed in double and
 * rounded once, like the CPU. Element order within a row is the CPU's.
 */
#include "kernels/cuda/hk_cuda_impl.h"

/* Rows go on gridDim.x, which takes any int row count. */
#define HK_NORM_THREADS 256

static __device__ float hk_row_sumsq(const float *x, int dim, float *sh)
{
    float ss = 0.0f;
    for (int i = threadIdx.x; i < dim; i += blockDim.x)
        ss += x[i] * x[i];
    return hk_block_sum(ss, sh);
}

/* y may alias x: each element is read, then written, by the same thread,
 * and the reduction has finished reading the row before anyone writes. */
static __global__ void hk_rmsnorm_zc_kernel(float *y,       // [rows, dim]
                                            const float *x, // [rows, dim]
                                            const float *w, // [dim]
                                            int dim, float eps)
{
    __shared__ float sh[32];
    const size_t r = blockIdx.x;
    const float *xr = x + r * dim;
    float *yr = y + r * dim;
    const float ss = hk_row_sumsq(xr, dim, sh);
    const float inv = (float)(1.0 / sqrt((double)ss / dim + eps));
    for (int i = threadIdx.x; i < dim; i += blockDim.x)
        yr[i] = xr[i] * inv * (1.0f + w[i]);
}

static __global__ void hk_rmsnorm_gated_kernel(float *y,       // [rows, dim]
                                               const float *x, // [rows, dim]
                                               const float *z, // [rows, dim]
                                               const float *w, // [dim]
                                               int dim, float eps)
{
    __shared__ float sh[32];
    const size_t r = blockIdx.x;
    const float *xr = x + r * dim, *zr = z + r * dim;
    float *yr = y + r * dim;
    const float ss = hk_row_sumsq(xr, dim, sh);
    const float inv = (float)(1.0 / sqrt((double)ss / dim + eps));
    for (int i = threadIdx.x; i < dim; i += blockDim.x)
        yr[i] = w[i] * (xr[i] * inv) * hk_math_silu(zr[i]);
}

static __global__ void hk_l2norm_kernel(float *x, // [rows, dim], in place
                                        int dim, float eps, float scale)
{
    __shared__ float sh[32];
    float *xr = x + (size_t)blockIdx.x * dim;
    const float ss = hk_row_sumsq(xr, dim, sh);
    const float f = (float)(scale / sqrt((double)ss + eps));
    for (int i = threadIdx.x; i < dim; i += blockDim.x)
        xr[i] *= f;
}

static __global__ void hk_swiglu_kernel(float *y,       // [n]
                                        const float *g, // [n]
                                        const float *u, // [n]
                                        size_t n)
{
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += stride)
        y[i] = hk_math_silu(g[i]) * u[i];
}

static int hk_norm_args_ok(int rows, int dim)
{
    return rows >= 0 && dim > 0;
}

extern "C" int hk_cuda_rmsnorm_zc(float *y, const float *x, const float *w,
                                  int rows, int dim, float eps, void *stream)
{
    if (!hk_norm_args_ok(rows, dim))
        return HK_CUDA_EINVAL;
    if (rows == 0)
        return HK_CUDA_OK;
    hk_rmsnorm_zc_kernel<<<rows, HK_NORM_THREADS, 0, hk_stream(stream)>>>(
        y, x, w, dim, eps);
    return hk_cuda_check_launch();
}

extern "C" int hk_cuda_rmsnorm_gated(float *y, const float *x, const float *z,
                                     const float *w, int rows, int dim,
                                     float eps, void *stream)
{
    if (!hk_norm_args_ok(rows, dim))
        return HK_CUDA_EINVAL;
    if (rows == 0)
        return HK_CUDA_OK;
    hk_rmsnorm_gated_kernel<<<rows, HK_NORM_THREADS, 0, hk_stream(stream)>>>(
        y, x, z, w, dim, eps);
    return hk_cuda_check_launch();
}

extern "C" int hk_cuda_l2norm(float *x, int rows, int dim, float eps,
                              float scale, void *stream)
{
    if (!hk_norm_args_ok(rows, dim))
        return HK_CUDA_EINVAL;
    if (rows == 0)
        return HK_CUDA_OK;
    hk_l2norm_kernel<<<rows, HK_NORM_THREADS, 0, hk_stream(stream)>>>(
        x, dim, eps, scale);
    return hk_cuda_check_launch();
}

extern "C" int hk_cuda_swiglu(float *y, const float *g, const float *u,
                              size_t n, void *stream)
{
    if (n == 0)
        return HK_CUDA_OK;
    hk_swiglu_kernel<<<hk_grid_1d(n, HK_NORM_THREADS), HK_NORM_THREADS, 0,
                       hk_stream(stream)>>>(y, g, u, n);
    return hk_cuda_check_launch();
}
