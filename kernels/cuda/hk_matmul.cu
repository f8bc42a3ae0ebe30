/*
 * hk_matmul.cu - CUDA twin of hk_matmul.c: the dense projections through
 * cuBLAS, and the handle they (and hk_transition.cu) use.
 *
 *   y[n, out] (= or +=) x[n, in] . W[out, in]^T
 *
 * cuBLAS is column-major: a row-major [r, c] matrix is its column-major
 * transpose with leading dimension c. So row-major y = x W^T is, in
 * column-major terms, y^T [out, n] = W^T^T x^T: gemm(T, N, m = out,
 * n = n, k = in, A = W (lda = in), B = x (ldb = in), C = y (ldc = out)).
 *
 * bf16 weights: cuBLAS multiplies bf16 only by bf16 (CUBLAS_COMPUTE_32F
 * lists A and B of one type), so x is first rounded to bf16, nearest even,
 * by a small kernel; accumulation and y stay f32.
 */
#include <stdlib.h>

#include "kernels/cuda/hk_cuda_impl.h"

#define HK_MM_THREADS 256

extern "C" int hk_cuda_blas_create(hk_cuda_blas_t **blas)
{
    if (!blas)
        return HK_CUDA_EINVAL;
    *blas = NULL;
    int n = 0, rc = hk_cuda_device_count(&n);
    if (rc)
        return rc;
    if (n == 0)
        return HK_CUDA_ENODEV;
    hk_cuda_blas_t *b = (hk_cuda_blas_t *)calloc(1, sizeof(*b));
    if (!b)
        return HK_CUDA_ENOMEM;
    cublasStatus_t st = cublasCreate(&b->h);
    if (st != CUBLAS_STATUS_SUCCESS) {
        free(b);
        return st == CUBLAS_STATUS_ALLOC_FAILED ? HK_CUDA_ENOMEM
                                                : HK_CUDA_EBLAS;
    }
    *blas = b;
    return HK_CUDA_OK;
}

extern "C" void hk_cuda_blas_destroy(hk_cuda_blas_t *blas)
{
    if (!blas)
        return;
    cublasDestroy(blas->h);
    free(blas);
}

static __global__ void hk_to_bf16_kernel(uint16_t *xb,   // [n]
                                         const float *x, // [n]
                                         size_t n)
{
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += stride)
        xb[i] = hk_bf16_from_f32(x[i]);
}

/* Checks shared by the three entry points; *skip when there is nothing to
 * multiply (n or out is 0). in = 0 is an empty sum: y = 0 (or unchanged),
 * which cuBLAS gives with k = 0. */
static int hk_mm_args(int n, int in, int out, const hk_cuda_blas_t *blas,
                      int *skip)
{
    *skip = 0;
    if (!blas || n < 0 || in < 0 || out < 0)
        return HK_CUDA_EINVAL;
    *skip = n == 0 || out == 0;
    return HK_CUDA_OK;
}

static int hk_blas_status(cublasStatus_t st)
{
    if (st == CUBLAS_STATUS_SUCCESS)
        return HK_CUDA_OK;
    return st == CUBLAS_STATUS_ALLOC_FAILED ? HK_CUDA_ENOMEM : HK_CUDA_EBLAS;
}

static int hk_sgemm_rm(float *y, const float *x, const float *w, int n, int in,
                       int out, float beta, hk_cuda_blas_t *blas, void *stream)
{
    int skip, rc = hk_mm_args(n, in, out, blas, &skip);
    if (rc || skip)
        return rc;
    if (cublasSetStream(blas->h, hk_stream(stream)) != CUBLAS_STATUS_SUCCESS)
        return HK_CUDA_EBLAS;
    const float alpha = 1.0f;
    /* lda, ldb >= 1 even for in = 0 (k = 0 never reads them). */
    const int ld = in > 0 ? in : 1;
    return hk_blas_status(cublasSgemm(blas->h, CUBLAS_OP_T, CUBLAS_OP_N, out, n,
                                      in, &alpha, w, ld, x, ld, &beta, y, out));
}

extern "C" int hk_cuda_matmul(float *y, const float *x, const float *w, int n,
                              int in, int out, hk_cuda_blas_t *blas,
                              void *stream)
{
    return hk_sgemm_rm(y, x, w, n, in, out, 0.0f, blas, stream);
}

extern "C" int hk_cuda_matmul_acc(float *y, const float *x, const float *w,
                                  int n, int in, int out, hk_cuda_blas_t *blas,
                                  void *stream)
{
    return hk_sgemm_rm(y, x, w, n, in, out, 1.0f, blas, stream);
}

extern "C" int hk_cuda_matmul_bf16(float *y, const float *x, const uint16_t *w,
                                   int n, int in, int out, int acc,
                                   uint16_t *xb, hk_cuda_blas_t *blas,
                                   void *stream)
{
    int skip, rc = hk_mm_args(n, in, out, blas, &skip);
    if (rc || skip)
        return rc;
    if (!xb && in > 0)
        return HK_CUDA_EINVAL;
    const cudaStream_t s = hk_stream(stream);
    const size_t nx = (size_t)n * in;
    if (nx > 0) {
        hk_to_bf16_kernel<<<hk_grid_1d(nx, HK_MM_THREADS), HK_MM_THREADS, 0,
                            s>>>(xb, x, nx);
        if ((rc = hk_cuda_check_launch()))
            return rc;
    }
    if (cublasSetStream(blas->h, s) != CUBLAS_STATUS_SUCCESS)
        return HK_CUDA_EBLAS;
    const float alpha = 1.0f, beta = acc ? 1.0f : 0.0f;
    const int ld = in > 0 ? in : 1;
    return hk_blas_status(
        cublasGemmEx(blas->h, CUBLAS_OP_T, CUBLAS_OP_N, out, n, in, &alpha, w,
                     CUDA_R_16BF, ld, xb, CUDA_R_16BF, ld, &beta, y, CUDA_R_32F,
                     out, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}
