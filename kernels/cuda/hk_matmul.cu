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
 *
 * I8 weights (int8 q, a float scale per row and group of columns): the
 * CPU's non-VNNI arithmetic, W = q * scale in f32 and f32 products with x
 * as given. Few rows of x (decode): one warp per output row streams q once
 * (1 byte a weight) and keeps n sums. More: W dequantized to f32 a tile
 * of rows at a time into the caller's scratch, each tile one
 * cublasSgemm into its columns of y (the compute-bound case; the tile is
 * written and read back once per call, cheap beside n rows of products).
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

extern "C" int hk_cuda_to_bf16(uint16_t *xb, const float *x, size_t n,
                               void *stream)
{
    if (n == 0)
        return HK_CUDA_OK;
    if (!xb || !x)
        return HK_CUDA_EINVAL;
    hk_to_bf16_kernel<<<hk_grid_1d(n, HK_MM_THREADS), HK_MM_THREADS, 0,
                        hk_stream(stream)>>>(xb, x, n);
    return hk_cuda_check_launch();
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

/* y[n, out] of a row-major y whose rows are ldy apart (the columns of a
 * wider y from a tile of W's rows). */
static int hk_sgemm_ld(float *y, int ldy, const float *x, const float *w, int n,
                       int in, int out, float beta, hk_cuda_blas_t *blas,
                       void *stream)
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
                                      in, &alpha, w, ld, x, ld, &beta, y, ldy));
}

static int hk_sgemm_rm(float *y, const float *x, const float *w, int n, int in,
                       int out, float beta, hk_cuda_blas_t *blas, void *stream)
{
    return hk_sgemm_ld(y, out, x, w, n, in, out, beta, blas, stream);
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

/* hk_cuda_matmul_bf16 into y of type yt (f32, or bf16 with acc 0). */
static int hk_mm_bf16(void *y, cudaDataType_t yt, const float *x,
                      const uint16_t *w, int n, int in, int out, int acc,
                      uint16_t *xb, hk_cuda_blas_t *blas, void *stream)
{
    int skip, rc = hk_mm_args(n, in, out, blas, &skip);
    if (rc || skip)
        return rc;
    if (!xb && in > 0)
        return HK_CUDA_EINVAL;
    const cudaStream_t s = hk_stream(stream);
    if (x && (rc = hk_cuda_to_bf16(xb, x, (size_t)n * in, stream)))
        return rc;
    if (cublasSetStream(blas->h, s) != CUBLAS_STATUS_SUCCESS)
        return HK_CUDA_EBLAS;
    const float alpha = 1.0f, beta = acc ? 1.0f : 0.0f;
    const int ld = in > 0 ? in : 1;
    return hk_blas_status(
        cublasGemmEx(blas->h, CUBLAS_OP_T, CUBLAS_OP_N, out, n, in, &alpha, w,
                     CUDA_R_16BF, ld, xb, CUDA_R_16BF, ld, &beta, y, yt, out,
                     CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

extern "C" int hk_cuda_matmul_bf16(float *y, const float *x, const uint16_t *w,
                                   int n, int in, int out, int acc,
                                   uint16_t *xb, hk_cuda_blas_t *blas,
                                   void *stream)
{
    return hk_mm_bf16(y, CUDA_R_32F, x, w, n, in, out, acc, xb, blas, stream);
}

extern "C" int hk_cuda_matmul_bf16_to_bf16(uint16_t *y, const float *x,
                                           const uint16_t *w, int n, int in,
                                           int out, uint16_t *xb,
                                           hk_cuda_blas_t *blas, void *stream)
{
    return hk_mm_bf16(y, CUDA_R_16BF, x, w, n, in, out, 0, xb, blas, stream);
}

/* ---- bf16, few rows: one launch for the matrices of one input ---------- */

#define HK_GV_WARPS 8 /* output rows per block */

/* bf16 pairs of a 32-bit word widened (the lower address in the low half) */
static __device__ __forceinline__ void hk_gv_widen(uint32_t u, float *lo,
                                                   float *hi)
{
    *lo = __uint_as_float(u << 16);
    *hi = __uint_as_float(u & 0xffff0000u);
}

/* Row o of the parts' rows laid end to end: its part's matrix (*w),
 * output (*y) and rows (*out), and its row there (returned); -1 past the
 * last. Selects, not an index: an indexed parameter array goes to the
 * stack. */
static __device__ __forceinline__ int hk_gv_row(const hk_cuda_gemv_t &p, int k,
                                                int o, const uint16_t **w,
                                                void **y, int *out)
{
    int at = -1;
    *w = p.w[0];
    *y = p.y[0];
    *out = p.out[0];
#pragma unroll
    for (int i = 0; i < HK_CUDA_GEMV_PARTS; i++) {
        const bool here = at < 0 && i < k && o < p.out[i];
        at = here ? o : at;
        *w = here ? p.w[i] : *w;
        *y = here ? p.y[i] : *y;
        *out = here ? p.out[i] : *out;
        o -= i < k ? p.out[i] : 0;
    }
    return at;
}

/* Row wr's dot products with the N rows of xb, added to s (lane's part
 * of each, in the order every GEMV kernel here sums them): 16 bytes of W
 * a lane (VEC) or 2; K = 0 adds nothing. */
template <int N, bool VEC>
static __device__ __forceinline__ void
hk_gv_dot(float (&s)[N], const uint16_t *wr, const uint16_t *xb, int in, int K,
          int lane)
{
    if (VEC) {
#pragma unroll 4
        for (int c = lane * 8; c < K; c += 256) {
            const uint4 wv = *(const uint4 *)(wr + c);
            float w8[8];
            hk_gv_widen(wv.x, &w8[0], &w8[1]);
            hk_gv_widen(wv.y, &w8[2], &w8[3]);
            hk_gv_widen(wv.z, &w8[4], &w8[5]);
            hk_gv_widen(wv.w, &w8[6], &w8[7]);
#pragma unroll
            for (int r = 0; r < N; r++) {
                const uint4 xv = *(const uint4 *)(xb + (size_t)r * in + c);
                const uint32_t xu[4] = {xv.x, xv.y, xv.z, xv.w};
#pragma unroll
                for (int j = 0; j < 4; j++) {
                    float a, b;
                    hk_gv_widen(xu[j], &a, &b);
                    s[r] = fmaf(a, w8[2 * j], s[r]);
                    s[r] = fmaf(b, w8[2 * j + 1], s[r]);
                }
            }
        }
    } else {
        for (int c = lane; c < K; c += 32) {
            const float wk = hk_bf16_to_f32(wr[c]);
#pragma unroll
            for (int r = 0; r < N; r++)
                s[r] = fmaf(hk_bf16_to_f32(xb[(size_t)r * in + c]), wk, s[r]);
        }
    }
}

/* One warp per output row: the row of W read once (hk_gv_dot) against
 * the N rows of xb (few and small: L1 holds them for the block's warps),
 * N f32 sums. */
template <int N, bool VEC>
static __global__ void __launch_bounds__(32 * HK_GV_WARPS)
    hk_gemv_bf16_kernel(hk_cuda_gemv_t p, int k, const uint16_t *xb, int in,
                        int acc, int bf)
{
    const int lane = threadIdx.x & 31;
    const uint16_t *w;
    void *y;
    int out;
    const int o = hk_gv_row(p, k, blockIdx.x * HK_GV_WARPS + (threadIdx.x >> 5),
                            &w, &y, &out);
    /* a warp past the last row runs no columns (no exit before the
     * shuffles) */
    float s[N];
#pragma unroll
    for (int r = 0; r < N; r++)
        s[r] = 0.0f;
    hk_gv_dot<N, VEC>(s, w + (size_t)(o >= 0 ? o : 0) * in, xb, in,
                      o >= 0 ? in : 0, lane);
#pragma unroll
    for (int r = 0; r < N; r++) {
        const float t = hk_warp_sum(s[r]);
        if (lane != 0 || o < 0)
            continue;
        const size_t at = (size_t)r * out + o;
        if (bf) {
            ((uint16_t *)y)[at] = hk_bf16_from_f32(t);
            continue;
        }
        float *yo = (float *)y + at;
        *yo = acc ? *yo + t : t;
    }
}

/* The gated form: warp o's rows of wg and wu, each summed as above and
 * rounded to bf16, then hk_swiglu_kernel's expression on them. */
template <int N, bool VEC>
static __global__ void __launch_bounds__(32 * HK_GV_WARPS)
    hk_gemv_swiglu_kernel(uint16_t *h, const uint16_t *wg, const uint16_t *wu,
                          int out, const uint16_t *xb, int in)
{
    const int lane = threadIdx.x & 31;
    const int o = blockIdx.x * HK_GV_WARPS + (threadIdx.x >> 5);
    const int K = o < out ? in : 0;
    const size_t row = (size_t)(o < out ? o : 0) * in;
    float g[N], u[N];
#pragma unroll
    for (int r = 0; r < N; r++)
        g[r] = u[r] = 0.0f;
    hk_gv_dot<N, VEC>(g, wg + row, xb, in, K, lane);
    hk_gv_dot<N, VEC>(u, wu + row, xb, in, K, lane);
#pragma unroll
    for (int r = 0; r < N; r++) {
        const float tg = hk_warp_sum(g[r]), tu = hk_warp_sum(u[r]);
        if (lane != 0 || o >= out)
            continue;
        const float gb = hk_bf16_to_f32(hk_bf16_from_f32(tg));
        const float ub = hk_bf16_to_f32(hk_bf16_from_f32(tu));
        h[(size_t)r * out + o] = hk_bf16_from_f32(hk_math_silu_fast(gb) * ub);
    }
}

template <int N, bool VEC>
static int hk_gemv_launch(const hk_cuda_gemv_t &p, int k, const uint16_t *xb,
                          int in, int acc, int bf, unsigned blocks,
                          cudaStream_t s)
{
    hk_gemv_bf16_kernel<N, VEC>
        <<<blocks, 32 * HK_GV_WARPS, 0, s>>>(p, k, xb, in, acc, bf);
    return hk_cuda_check_launch();
}

static bool hk_al16(const void *q)
{
    return ((uintptr_t)q & 15) == 0;
}

extern "C" int hk_cuda_gemv_bf16(const hk_cuda_gemv_t *p, int k,
                                 const uint16_t *xb, int n, int in, int acc,
                                 int bf, void *stream)
{
    if (!p || k < 1 || k > HK_CUDA_GEMV_PARTS || n < 0 ||
        n > HK_CUDA_GEMV_ROWS || in < 0 || (bf && acc) || (!xb && in > 0))
        return HK_CUDA_EINVAL;
    size_t rows = 0;
    bool vec = in % 8 == 0 && hk_al16(xb);
    for (int i = 0; i < k; i++) {
        if (p->out[i] < 0 || (p->out[i] > 0 && (!p->y[i] || !p->w[i])))
            return HK_CUDA_EINVAL;
        rows += (size_t)p->out[i];
        vec = vec && hk_al16(p->w[i]);
    }
    if (n == 0 || rows == 0)
        return HK_CUDA_OK;
    if (rows > (size_t)INT32_MAX)
        return HK_CUDA_EINVAL;
    typedef int (*launch_fn)(const hk_cuda_gemv_t &, int, const uint16_t *, int,
                             int, int, unsigned, cudaStream_t);
    static const launch_fn fns[2][HK_CUDA_GEMV_ROWS] = {
        {hk_gemv_launch<1, false>, hk_gemv_launch<2, false>,
         hk_gemv_launch<3, false>, hk_gemv_launch<4, false>},
        {hk_gemv_launch<1, true>, hk_gemv_launch<2, true>,
         hk_gemv_launch<3, true>, hk_gemv_launch<4, true>}};
    const unsigned blocks = (unsigned)((rows + HK_GV_WARPS - 1) / HK_GV_WARPS);
    return fns[vec][n - 1](*p, k, xb, in, acc, bf, blocks, hk_stream(stream));
}

template <int N, bool VEC>
static int hk_gemv_swiglu_launch(uint16_t *h, const uint16_t *wg,
                                 const uint16_t *wu, int out,
                                 const uint16_t *xb, int in, cudaStream_t s)
{
    const unsigned blocks = (unsigned)((out + HK_GV_WARPS - 1) / HK_GV_WARPS);
    hk_gemv_swiglu_kernel<N, VEC>
        <<<blocks, 32 * HK_GV_WARPS, 0, s>>>(h, wg, wu, out, xb, in);
    return hk_cuda_check_launch();
}

extern "C" int hk_cuda_gemv_bf16_swiglu(uint16_t *h, const uint16_t *wg,
                                        const uint16_t *wu, int out,
                                        const uint16_t *xb, int n, int in,
                                        void *stream)
{
    if (n < 0 || n > HK_CUDA_GEMV_ROWS || in < 0 || out < 0 ||
        (out > 0 && (!h || !wg || !wu)) || (!xb && in > 0))
        return HK_CUDA_EINVAL;
    if (n == 0 || out == 0)
        return HK_CUDA_OK;
    const bool vec = in % 8 == 0 && hk_al16(xb) && hk_al16(wg) && hk_al16(wu);
    typedef int (*launch_fn)(uint16_t *, const uint16_t *, const uint16_t *,
                             int, const uint16_t *, int, cudaStream_t);
    static const launch_fn fns[2][HK_CUDA_GEMV_ROWS] = {
        {hk_gemv_swiglu_launch<1, false>, hk_gemv_swiglu_launch<2, false>,
         hk_gemv_swiglu_launch<3, false>, hk_gemv_swiglu_launch<4, false>},
        {hk_gemv_swiglu_launch<1, true>, hk_gemv_swiglu_launch<2, true>,
         hk_gemv_swiglu_launch<3, true>, hk_gemv_swiglu_launch<4, true>}};
    return fns[vec][n - 1](h, wg, wu, out, xb, in, hk_stream(stream));
}

/* ---- I8 ------------------------------------------------------------------ */

#define HK_I8_WARPS 8 /* output rows per block of the direct kernel */

/* y[r, o] (= or +=) sum_k x[r, k] (q[o, k] scale[o, k / G]) for r < N:
 * one warp per o, lanes over k, N sums in registers. */
template <int N>
static __global__ void hk_i8_direct_kernel(float *y,        // [N, rows]
                                           const float *x,  // [N, cols]
                                           const int8_t *q, // [rows, cols]
                                           const float *sc, // [rows, cols/G]
                                           int rows, int cols, int G, int acc)
{
    const int lane = threadIdx.x & 31;
    const int o = blockIdx.x * HK_I8_WARPS + (threadIdx.x >> 5);
    /* a warp past the last row runs no k (no early exit before the
     * shuffles) */
    const int K = o < rows ? cols : 0;
    const int8_t *wr = q + (size_t)(o < rows ? o : 0) * cols;
    const float *sr = sc + (size_t)(o < rows ? o : 0) * (cols / G);
    float s[N];
    for (int r = 0; r < N; r++)
        s[r] = 0.0f;
    for (int k = lane; k < K; k += 32) {
        const float wk = (float)wr[k] * sr[k / G];
        for (int r = 0; r < N; r++)
            s[r] += x[(size_t)r * cols + k] * wk;
    }
    for (int r = 0; r < N; r++) {
        const float t = hk_warp_sum(s[r]);
        if (lane == 0 && o < rows) {
            float *yo = y + (size_t)r * rows + o;
            *yo = acc ? *yo + t : t;
        }
    }
}

/* dst[i, k] = q[o0 + i, k] scale[o0 + i, k / G] for i < rb: a tile of W in
 * f32, as hk_wtile makes it. */
static __global__ void hk_i8_tile_kernel(float *dst, const int8_t *q,
                                         const float *sc, size_t o0, int rb,
                                         int cols, int G)
{
    const size_t n = (size_t)rb * cols;
    HK_GRID_STRIDE(i, n)
    {
        const size_t o = o0 + i / (size_t)cols;
        const int k = (int)(i % (size_t)cols);
        dst[i] = (float)q[o * cols + k] * sc[o * (size_t)(cols / G) + k / G];
    }
}

template <int N>
static int hk_i8_direct(float *y, const float *x, const hk_weight_t *w, int acc,
                        cudaStream_t s)
{
    const unsigned blocks =
        (unsigned)((w->rows + HK_I8_WARPS - 1) / HK_I8_WARPS);
    hk_i8_direct_kernel<N><<<blocks, 32 * HK_I8_WARPS, 0, s>>>(
        y, x, (const int8_t *)w->data, w->scales, w->rows, w->cols, w->group,
        acc);
    return hk_cuda_check_launch();
}

extern "C" int hk_cuda_linear_i8(float *y, const float *x, const hk_weight_t *w,
                                 int n, int acc, float *scratch,
                                 size_t scratch_floats, hk_cuda_blas_t *blas,
                                 void *stream)
{
    if (!w || w->dtype != HK_W_I8 || w->group < 1 || w->cols < 1 ||
        w->cols % w->group || !w->scales || !w->data)
        return HK_CUDA_EINVAL;
    int skip, rc = hk_mm_args(n, w->cols, w->rows, blas, &skip);
    if (rc || skip)
        return rc;
    const cudaStream_t s = hk_stream(stream);
    /* the direct kernel with n sums in registers, n = 1..8 */
    typedef int (*direct_fn)(float *, const float *, const hk_weight_t *, int,
                             cudaStream_t);
    static const direct_fn direct[HK_CUDA_I8_DIRECT + 1] = {NULL,
                                                            hk_i8_direct<1>,
                                                            hk_i8_direct<2>,
                                                            hk_i8_direct<3>,
                                                            hk_i8_direct<4>,
                                                            hk_i8_direct<5>,
                                                            hk_i8_direct<6>,
                                                            hk_i8_direct<7>,
                                                            hk_i8_direct<8>};
    if (n <= HK_CUDA_I8_DIRECT)
        return direct[n](y, x, w, acc, s);
    if (!scratch || scratch_floats < (size_t)w->cols)
        return HK_CUDA_EINVAL;
    size_t tile = scratch_floats / (size_t)w->cols;
    for (size_t o0 = 0; o0 < (size_t)w->rows; o0 += tile) {
        const int rb = (int)((size_t)w->rows - o0 < tile ? w->rows - o0 : tile);
        const size_t ne = (size_t)rb * w->cols;
        hk_i8_tile_kernel<<<hk_grid_1d(ne, HK_MM_THREADS), HK_MM_THREADS, 0,
                            s>>>(scratch, (const int8_t *)w->data, w->scales,
                                 o0, rb, w->cols, w->group);
        if ((rc = hk_cuda_check_launch()))
            return rc;
        rc = hk_sgemm_ld(y + o0, w->rows, x, scratch, n, w->cols, rb,
                         acc ? 1.0f : 0.0f, blas, stream);
        if (rc)
            return rc;
    }
    return HK_CUDA_OK;
}
