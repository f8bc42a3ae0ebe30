/*
 * hk_transition.cu - CUDA twin of hk_transition.c: the segment transition
 * algebra of PIC for linear attention (HYPIC §4.2).
 *
 *   compose:    out[h] = T[h] S[h] + S0[h]                (Eq. 6)
 *   chain:      (T1, S1) <- (T2 T1, T2 S1 + S2)
 *   rope shift: S[h] <- R(delta) S[h], R on the key axis (Eq. 7)
 * Per head S[dk, dv] ([key][value]); T by family: scalar t[1], diagonal
 * t[dk], dense t[dk, dk]; all row-major, heads contiguous.
 *
 * Dense products are one cublasSgemmStridedBatched over the H heads.
 * cuBLAS is column-major: a row-major [r, c] matrix is its column-major
 * transpose with leading dimension c, so out = T S (row-major) is computed
 * as out^T = S^T T^T, i.e. gemm(N, N, m = dv, n = dk, k = dk, A = S,
 * lda = dv, B = T, ldb = dk, C = out, ldc = dv). cuBLAS forbids C
 * overlapping A or B, hence the scratch when out aliases S (chain always).
 * Scalar and diagonal families are elementwise kernels.
 */
#include "kernels/cuda/hk_cuda_impl.h"

#define HK_TRANS_THREADS 256

static size_t hk_tsize(hk_trans_family_t fam, int dk)
{
    switch (fam) {
    case HK_TRANS_SCALAR:
        return 1;
    case HK_TRANS_DIAG:
        return (size_t)dk;
    case HK_TRANS_DENSE:
        return (size_t)dk * dk;
    }
    return 0;
}

/* out[e] = t S[e] + S0[e]; t per head (scalar) or per key row (diagonal).
 * Same-index read before write, so out may alias S or S0. */
static __global__ void hk_trans_ew_kernel(float *out,      // [H, dk, dv]
                                          const float *t,  // [H] or [H, dk]
                                          const float *S,  // [H, dk, dv]
                                          const float *S0, // [H, dk, dv]/0
                                          int diag, int H, int dk, int dv)
{
    const size_t n = (size_t)H * dk * dv;
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x; e < n;
         e += stride) {
        const size_t row = e / dv; /* h * dk + i */
        const float f = diag ? t[row] : t[row / dk];
        out[e] = f * S[e] + (S0 ? S0[e] : 0.0f);
    }
}

/* out[e] = a[e] + b[e] (b may be NULL); out may alias a or b. */
static __global__ void hk_add_kernel(float *out, const float *a, const float *b,
                                     size_t n)
{
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x; e < n;
         e += stride)
        out[e] = a[e] + (b ? b[e] : 0.0f);
}

/* t1[e] *= t2[e] (scalar and diagonal chains). */
static __global__ void hk_mul_kernel(float *t1, const float *t2, size_t n)
{
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x; e < n;
         e += stride)
        t1[e] *= t2[e];
}

/* Row-major C[h] = A[h] B[h] with A [r, kk], B [kk, c], C [r, c], heads
 * strided; beta scales the old C. */
static int hk_gemm_rm(hk_cuda_blas_t *blas, cudaStream_t s, float *C,
                      const float *A, const float *B, int r, int kk, int c,
                      float beta, int H)
{
    const float alpha = 1.0f;
    if (cublasSetStream(blas->h, s) != CUBLAS_STATUS_SUCCESS)
        return HK_CUDA_EBLAS;
    /* Column-major C^T [c, r] = B^T [c, kk] A^T [kk, r]. */
    cublasStatus_t st = cublasSgemmStridedBatched(
        blas->h, CUBLAS_OP_N, CUBLAS_OP_N, c, r, kk, &alpha, B, c,
        (long long)kk * c, A, kk, (long long)r * kk, &beta, C, c,
        (long long)r * c, H);
    return st == CUBLAS_STATUS_SUCCESS ? HK_CUDA_OK : HK_CUDA_EBLAS;
}

static int hk_trans_args_ok(hk_trans_family_t fam, int H, int dk, int dv)
{
    return H >= 0 && dk > 0 && dv > 0 &&
           (fam == HK_TRANS_SCALAR || fam == HK_TRANS_DIAG ||
            fam == HK_TRANS_DENSE);
}

extern "C" int hk_cuda_trans_compose(float *out, hk_trans_family_t fam,
                                     const float *T, const float *S,
                                     const float *S0, int H, int dk, int dv,
                                     float *scratch, hk_cuda_blas_t *blas,
                                     void *stream)
{
    if (!hk_trans_args_ok(fam, H, dk, dv))
        return HK_CUDA_EINVAL;
    if (H == 0)
        return HK_CUDA_OK;
    const cudaStream_t s = hk_stream(stream);
    const size_t n = (size_t)H * dk * dv;
    if (fam != HK_TRANS_DENSE) {
        hk_trans_ew_kernel<<<hk_grid_1d(n, HK_TRANS_THREADS), HK_TRANS_THREADS,
                             0, s>>>(out, T, S, S0, fam == HK_TRANS_DIAG, H, dk,
                                     dv);
        return hk_cuda_check_launch();
    }
    if (!blas)
        return HK_CUDA_EINVAL;
    if (out == S) {
        /* T S into scratch, then out = scratch + S0. */
        if (!scratch)
            return HK_CUDA_EINVAL;
        int rc = hk_gemm_rm(blas, s, scratch, T, S, dk, dk, dv, 0.0f, H);
        if (rc)
            return rc;
        hk_add_kernel<<<hk_grid_1d(n, HK_TRANS_THREADS), HK_TRANS_THREADS, 0,
                        s>>>(out, scratch, S0, n);
        return hk_cuda_check_launch();
    }
    float beta = 0.0f;
    if (S0) {
        /* out starts as S0 and the product is added with beta = 1. */
        if (out != S0) {
            int rc = hk_cuda_d2d(out, S0, n * sizeof(float), stream);
            if (rc)
                return rc;
        }
        beta = 1.0f;
    }
    return hk_gemm_rm(blas, s, out, T, S, dk, dk, dv, beta, H);
}

extern "C" int hk_cuda_trans_chain(float *T1, float *S1, hk_trans_family_t fam,
                                   const float *T2, const float *S2, int H,
                                   int dk, int dv, float *scratch,
                                   hk_cuda_blas_t *blas, void *stream)
{
    if (!hk_trans_args_ok(fam, H, dk, dv))
        return HK_CUDA_EINVAL;
    if (H == 0)
        return HK_CUDA_OK;
    /* S first: it needs T2 only, and T1 is overwritten below. */
    int rc = hk_cuda_trans_compose(S1, fam, T2, S1, S2, H, dk, dv, scratch,
                                   blas, stream);
    if (rc)
        return rc;
    const cudaStream_t s = hk_stream(stream);
    const size_t nt = (size_t)H * hk_tsize(fam, dk);
    if (fam != HK_TRANS_DENSE) {
        hk_mul_kernel<<<hk_grid_1d(nt, HK_TRANS_THREADS), HK_TRANS_THREADS, 0,
                        s>>>(T1, T2, nt);
        return hk_cuda_check_launch();
    }
    rc = hk_gemm_rm(blas, s, scratch, T2, T1, dk, dk, dk, 0.0f, H);
    if (rc)
        return rc;
    return hk_cuda_d2d(T1, scratch, nt * sizeof(float), stream);
}

/* One block per (key pair i, head h); threads over the value axis. The
 * rotation is done in double and rounded once, as the CPU does. */
static __global__ void hk_trans_rope_kernel(float *S, // [H, dk, dv]
                                            int delta, int dk, int dv, int rot,
                                            double theta)
{
    const int i = blockIdx.x, h = blockIdx.y, half = rot / 2;
    const double ang = hk_math_rope_angle((double)delta, i, rot, theta);
    const double c = cos(ang), s = sin(ang);
    float *x = S + ((size_t)h * dk + i) * dv;
    float *y = S + ((size_t)h * dk + i + half) * dv;
    for (int j = threadIdx.x; j < dv; j += blockDim.x) {
        const double xj = x[j], yj = y[j];
        x[j] = (float)(c * xj - s * yj);
        y[j] = (float)(c * yj + s * xj);
    }
}

extern "C" int hk_cuda_trans_rope_shift(float *S, int delta, int H, int dk,
                                        int dv, int rot, double theta,
                                        void *stream)
{
    if (H < 0 || H > HK_CUDA_MAX_GRID_YZ || dk <= 0 || dv <= 0 || rot < 0 ||
        rot % 2 || rot > dk || !(theta > 0.0))
        return HK_CUDA_EINVAL;
    if (H == 0 || rot == 0)
        return HK_CUDA_OK;
    dim3 grid(rot / 2, H);
    const int threads =
        dv < HK_TRANS_THREADS ? HK_CEIL_DIV(dv, 32) * 32 : HK_TRANS_THREADS;
    hk_trans_rope_kernel<<<grid, threads, 0, hk_stream(stream)>>>(
        S, delta, dk, dv, rot, theta);
    return hk_cuda_check_launch();
}
