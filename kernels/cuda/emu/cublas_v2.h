/*
 * emu/cublas_v2.h - the cuBLAS subset kernels/cuda/ uses, for the host
 * emulator (emu/cuda_runtime.h): naive column-major GEMMs with cuBLAS's
 * argument conventions (op(A) is m x k, op(B) k x n; beta = 0 never reads
 * C), as cublasSgemm, cublasSgemmStridedBatched and cublasGemmEx with f32
 * or bf16 inputs, f32 compute and f32 output, or bf16 output (the f32
 * result rounded to nearest even, as cuBLAS's epilogue does). Sums run in k
 * order in f32, like one of the orders the real library may use.
 */
#ifndef HK_EMU_CUBLAS_V2_H
#define HK_EMU_CUBLAS_V2_H

#include <stdint.h>

#include "cuda_runtime.h"
#include "kernels/common/hk_bf16.h"

typedef enum {
    CUBLAS_STATUS_SUCCESS = 0,
    CUBLAS_STATUS_ALLOC_FAILED = 3,
    CUBLAS_STATUS_INVALID_VALUE = 7,
    CUBLAS_STATUS_NOT_SUPPORTED = 15
} cublasStatus_t;

typedef enum { CUBLAS_OP_N = 0, CUBLAS_OP_T = 1 } cublasOperation_t;

/* library_types.h and cublas_api.h values. */
typedef enum { CUDA_R_32F = 0, CUDA_R_16BF = 14 } cudaDataType_t;
typedef enum { CUBLAS_COMPUTE_32F = 68 } cublasComputeType_t;
typedef enum { CUBLAS_GEMM_DEFAULT = -1 } cublasGemmAlgo_t;

struct hk_emu_cublas {
    cudaStream_t stream;
};
typedef struct hk_emu_cublas *cublasHandle_t;

static inline cublasStatus_t cublasCreate(cublasHandle_t *h)
{
    *h = (cublasHandle_t)calloc(1, sizeof(**h));
    return *h ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_ALLOC_FAILED;
}

static inline cublasStatus_t cublasDestroy(cublasHandle_t h)
{
    free(h);
    return CUBLAS_STATUS_SUCCESS;
}

static inline cublasStatus_t cublasSetStream(cublasHandle_t h, cudaStream_t s)
{
    h->stream = s;
    return CUBLAS_STATUS_SUCCESS;
}

/* Element (i, j) of op(X), X column-major with leading dimension ld, as
 * f32 (bf16 is the upper half of an f32). */
static inline float hk_emu_blas_at(const void *X, cudaDataType_t t, int ld,
                                   cublasOperation_t op, int i, int j)
{
    const size_t e = op == CUBLAS_OP_N ? (size_t)i + (size_t)j * ld
                                       : (size_t)j + (size_t)i * ld;
    if (t == CUDA_R_32F)
        return ((const float *)X)[e];
    const uint32_t u = (uint32_t)((const uint16_t *)X)[e] << 16;
    float f;
    memcpy(&f, &u, sizeof(f));
    return f;
}

static inline cublasStatus_t
hk_emu_gemm(cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
            float alpha, const void *A, cudaDataType_t at, int lda,
            const void *B, cudaDataType_t bt, int ldb, float beta, void *C,
            cudaDataType_t ct, int ldc)
{
    /* rows of A and B as stored: lda >= max(1, rows) */
    const int ra = ta == CUBLAS_OP_N ? m : k, rb = tb == CUBLAS_OP_N ? k : n;
    if (m < 0 || n < 0 || k < 0 || ldc < max(1, m) || lda < max(1, ra) ||
        ldb < max(1, rb))
        return CUBLAS_STATUS_INVALID_VALUE;
    for (int j = 0; j < n; j++)
        for (int i = 0; i < m; i++) {
            float acc = 0.0f;
            for (int l = 0; l < k; l++)
                acc += hk_emu_blas_at(A, at, lda, ta, i, l) *
                       hk_emu_blas_at(B, bt, ldb, tb, l, j);
            const size_t e = i + (size_t)j * ldc;
            const float c =
                beta == 0.0f
                    ? alpha * acc
                    : alpha * acc +
                          beta * hk_emu_blas_at(C, ct, ldc, CUBLAS_OP_N, i, j);
            if (ct == CUDA_R_32F)
                ((float *)C)[e] = c;
            else
                ((uint16_t *)C)[e] = hk_bf16_from_f32(c);
        }
    return CUBLAS_STATUS_SUCCESS;
}

static inline cublasStatus_t
cublasSgemm(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m,
            int n, int k, const float *alpha, const float *A, int lda,
            const float *B, int ldb, const float *beta, float *C, int ldc)
{
    (void)h;
    return hk_emu_gemm(ta, tb, m, n, k, *alpha, A, CUDA_R_32F, lda, B,
                       CUDA_R_32F, ldb, *beta, C, CUDA_R_32F, ldc);
}

/* C[b] = alpha op(A[b]) op(B[b]) + beta C[b]. */
static inline cublasStatus_t cublasSgemmStridedBatched(
    cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n,
    int k, const float *alpha, const float *A, int lda, long long sA,
    const float *B, int ldb, long long sB, const float *beta, float *C, int ldc,
    long long sC, int batch)
{
    (void)h;
    for (int b = 0; b < batch; b++) {
        cublasStatus_t st = hk_emu_gemm(
            ta, tb, m, n, k, *alpha, A + b * sA, CUDA_R_32F, lda, B + b * sB,
            CUDA_R_32F, ldb, *beta, C + b * sC, CUDA_R_32F, ldc);
        if (st != CUBLAS_STATUS_SUCCESS)
            return st;
    }
    return CUBLAS_STATUS_SUCCESS;
}

/* f32 compute only; A and B of one type, f32 or bf16, C f32 or (with bf16
 * A and B) bf16, as the combinations cuBLAS lists for CUBLAS_COMPUTE_32F. */
static inline cublasStatus_t
cublasGemmEx(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb,
             int m, int n, int k, const void *alpha, const void *A,
             cudaDataType_t at, int lda, const void *B, cudaDataType_t bt,
             int ldb, const void *beta, void *C, cudaDataType_t ct, int ldc,
             cublasComputeType_t comp, cublasGemmAlgo_t algo)
{
    (void)h;
    (void)algo;
    if (comp != CUBLAS_COMPUTE_32F || at != bt ||
        (ct != CUDA_R_32F && !(ct == CUDA_R_16BF && at == CUDA_R_16BF)))
        return CUBLAS_STATUS_NOT_SUPPORTED;
    return hk_emu_gemm(ta, tb, m, n, k, *(const float *)alpha, A, at, lda, B,
                       bt, ldb, *(const float *)beta, C, ct, ldc);
}

#endif
