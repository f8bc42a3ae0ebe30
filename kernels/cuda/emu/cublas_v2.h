/*
 * emu/cublas_v2.h - the cuBLAS subset hk_transition.cu uses, for the host
 * emulator (emu/cuda_runtime.h): a naive column-major strided batched
 * sgemm with cuBLAS's argument conventions (beta = 0 never reads C).
 */
#ifndef HK_EMU_CUBLAS_V2_H
#define HK_EMU_CUBLAS_V2_H

#include "cuda_runtime.h"

typedef enum {
    CUBLAS_STATUS_SUCCESS = 0,
    CUBLAS_STATUS_ALLOC_FAILED = 3,
    CUBLAS_STATUS_INVALID_VALUE = 7,
    CUBLAS_STATUS_NOT_SUPPORTED = 15
} cublasStatus_t;

typedef enum { CUBLAS_OP_N = 0, CUBLAS_OP_T = 1 } cublasOperation_t;

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

/* C[b] = alpha A[b] B[b] + beta C[b], column-major, no transposes. */
static inline cublasStatus_t cublasSgemmStridedBatched(
    cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n,
    int k, const float *alpha, const float *A, int lda, long long sA,
    const float *B, int ldb, long long sB, const float *beta, float *C, int ldc,
    long long sC, int batch)
{
    (void)h;
    if (ta != CUBLAS_OP_N || tb != CUBLAS_OP_N)
        return CUBLAS_STATUS_NOT_SUPPORTED;
    if (m < 0 || n < 0 || k < 0 || lda < m || ldb < k || ldc < m)
        return CUBLAS_STATUS_INVALID_VALUE;
    for (int b = 0; b < batch; b++) {
        const float *Ab = A + b * sA, *Bb = B + b * sB;
        float *Cb = C + b * sC;
        for (int j = 0; j < n; j++)
            for (int i = 0; i < m; i++) {
                float acc = 0.0f;
                for (int l = 0; l < k; l++)
                    acc += Ab[i + (size_t)l * lda] * Bb[l + (size_t)j * ldb];
                float *c = &Cb[i + (size_t)j * ldc];
                *c = *beta == 0.0f ? *alpha * acc : *alpha * acc + *beta * *c;
            }
    }
    return CUBLAS_STATUS_SUCCESS;
}

#endif
