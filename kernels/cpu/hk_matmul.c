/*
 * hk_matmul.c - dense projections, y = x W^T (nn.Linear without bias).
 *
 *   y[n, out] (=|+=) x[n, in] . W[out, in]^T
 *
 * Layouts: row-major; W is the PyTorch nn.Linear weight [out, in] as stored
 * in the checkpoint, so the product is sgemm(NoTrans, Trans). Reference:
 * torch.nn.functional.linear(x, W).
 *
 * Threads. OpenBLAS's own threading does not give the same bits for
 * different thread counts (measured, 0.3.21). So y is cut into a fixed grid
 * of HK_MM_ROWS x HK_MM_CHUNK blocks (independent of the thread count),
 * OpenMP spreads the blocks, and every BLAS call runs single-threaded: y is the
 * same for any number of threads, and decode's chunked gemv is faster than
 * OpenBLAS's threaded one. OpenBLAS's OpenMP build sizes a call from
 * omp_get_max_threads(), so each call is made with that ICV set to 1 (it is
 * per task and restored at once); its pthreads build needs
 * hk_matmul_init() once to stop its own pool.
 *
 * Few rows (decode) take a dot kernel of hk_wkern*.c where there is one
 * (BF16 and I8 always, F32 on AVX-512), which computes each output alone,
 * so they are cut into one range per thread, and y is still the same for
 * any number of threads. More rows of BF16 or I8 use the grid: each block
 * widens its W rows to f32 HK_MM_TILE_K columns at a time and multiplies
 * them by sgemm.
 */
#include <assert.h>
#include <cblas.h>
#include <omp.h>
#include <string.h>

#include "kernels/cpu/hk_cpu.h"
#include "kernels/cpu/hk_wkern.h"

/* Output columns and rows per BLAS call: multiples of OpenBLAS's register
 * tiles, small enough to balance narrow layers (k_proj, the GDN b/a
 * projections) over a few threads, big enough to amortize its packing. */
#define HK_MM_CHUNK 256
#define HK_MM_ROWS  256
/* Below this many multiply-adds the OpenMP fork costs more than it gains. */
#define HK_MM_PAR_MIN (1 << 18)
/* Columns of W widened to f32 per sgemm call on the tile path: a
 * HK_MM_CHUNK x HK_MM_TILE_K tile (128 KiB) stays in L2 and on the stack. */
#define HK_MM_TILE_K 128

void hk_matmul_init(void)
{
    /* Only the pthreads build has a pool of its own; in the OpenMP build
     * this call would set our OpenMP thread count to 1. */
    if (openblas_get_parallel() == 1)
        openblas_set_num_threads(1);
}

/* y[r0:r0+n, o0:o0+oc] from rows r0.. of x and rows o0.. of W, on the
 * calling thread only. */
static void hk_matmul_part(float *y, const float *x, const float *w, int n,
                           int in, int out, int r0, int o0, int oc, float beta)
{
    x += (size_t)r0 * in;
    y += (size_t)r0 * out;
    const int saved = omp_get_max_threads();
    omp_set_num_threads(1);
    if (n == 1)
        cblas_sgemv(CblasRowMajor, CblasNoTrans, oc, in, 1.0f,
                    w + (size_t)o0 * in, in, x, 1, beta, y + o0, 1);
    else
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, oc, in, 1.0f, x,
                    in, w + (size_t)o0 * in, in, beta, y + o0, out);
    omp_set_num_threads(saved);
}

/* ---- weights in their stored formats ----------------------------------- */

static hk_wdot_fn *wdot_kernel(int dtype)
{
    const hk_isa_t isa = hk_cpu_isa(dtype);
    const int bf = dtype == HK_W_BF16;
    if (dtype == HK_W_F32)
        return isa == HK_ISA_AVX512 ? hk_wdot_f32_avx512 : NULL;
    if (isa == HK_ISA_AVX512)
        return bf ? hk_wdot_bf16_avx512 : hk_wdot_i8_avx512;
    if (isa == HK_ISA_AVX2)
        return bf ? hk_wdot_bf16_avx2 : hk_wdot_i8_avx2;
    return bf ? hk_wdot_bf16_generic : hk_wdot_i8_generic;
}

/* Block (r0, o0) of the tile path: W[o0:o0+oc] widened to f32 by
 * HK_MM_TILE_K columns, each slice one single-threaded sgemm into y. */
static void linear_tiles(float *y, const float *x, const hk_weight_t *w, int rn,
                         int r0, int o0, int oc, float beta)
{
    const int in = w->cols, out = w->rows;
    float tile[HK_MM_CHUNK * HK_MM_TILE_K] __attribute__((aligned(64)));
    const int saved = omp_get_max_threads();
    omp_set_num_threads(1);
    for (int k0 = 0; k0 < in; k0 += HK_MM_TILE_K) {
        const int kc = in - k0 < HK_MM_TILE_K ? in - k0 : HK_MM_TILE_K;
        hk_wtile(tile, kc, w, o0, oc, k0, kc);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rn, oc, kc, 1.0f,
                    x + (size_t)r0 * in + k0, in, tile, kc, k0 ? 1.0f : beta,
                    y + (size_t)r0 * out + o0, out);
    }
    omp_set_num_threads(saved);
}

/* y cut into a fixed grid of HK_MM_ROWS x HK_MM_CHUNK blocks spread over
 * the OpenMP threads, each block one single-threaded call; or, for a dot
 * kernel (which streams W once for all n rows), one range of outputs per
 * thread. */
static void linear_beta(float *y, const float *x, const hk_weight_t *w, int n,
                        float beta)
{
    const int in = w->cols, out = w->rows;
    assert(n >= 0 && in >= 0 && out >= 0);
    assert(w->dtype != HK_W_I8 || (w->group > 0 && in % w->group == 0));
    if (n == 0 || out == 0)
        return;
    if (in == 0) {
        /* BLAS rejects lda = 0; the empty sum is 0. */
        if (beta == 0.0f)
            for (int i = 0; i < n; i++)
                memset(y + (size_t)i * out, 0, (size_t)out * sizeof(float));
        return;
    }
    hk_wdot_fn *dot = n <= HK_LINEAR_DIRECT ? wdot_kernel(w->dtype) : NULL;
    const size_t work = (size_t)n * (size_t)in * (size_t)out;
    const int nch = (out + HK_MM_CHUNK - 1) / HK_MM_CHUNK;
    if (dot) {
        /* A dot kernel computes each output alone, the same whatever
         * range it is called on: one range per thread, so x is prepared
         * (dealt or quantized) once per thread, not once per chunk. */
#pragma omp parallel if (nch > 1 && work >= HK_MM_PAR_MIN)
        {
            const int nt = omp_get_num_threads(), t = omp_get_thread_num();
            const int per = ((out + nt - 1) / nt + 15) & ~15;
            const int o0 = t * per < out ? t * per : out;
            const int oc = out - o0 < per ? out - o0 : per;
            if (oc > 0)
                dot(y, out, x, in, n, w, o0, oc, beta);
        }
        return;
    }
    const int nrb = (n + HK_MM_ROWS - 1) / HK_MM_ROWS;
#pragma omp parallel for schedule(static) if (nch * nrb > 1 &&                 \
                                              work >= HK_MM_PAR_MIN)
    for (int b = 0; b < nch * nrb; b++) {
        const int r0 = b / nch * HK_MM_ROWS, o0 = b % nch * HK_MM_CHUNK;
        const int rn = n - r0 < HK_MM_ROWS ? n - r0 : HK_MM_ROWS;
        const int oc = out - o0 < HK_MM_CHUNK ? out - o0 : HK_MM_CHUNK;
        if (w->dtype == HK_W_F32)
            hk_matmul_part(y, x, w->data, rn, in, out, r0, o0, oc, beta);
        else
            linear_tiles(y, x, w, rn, r0, o0, oc, beta);
    }
}

void hk_matmul(float *y, const float *x, const float *w, int n, int in, int out)
{
    const hk_weight_t wt = {
        .data = w, .dtype = HK_W_F32, .rows = out, .cols = in};
    linear_beta(y, x, &wt, n, 0.0f);
}

void hk_matmul_acc(float *y, const float *x, const float *w, int n, int in,
                   int out)
{
    const hk_weight_t wt = {
        .data = w, .dtype = HK_W_F32, .rows = out, .cols = in};
    linear_beta(y, x, &wt, n, 1.0f);
}

void hk_linear(float *y, const float *x, const hk_weight_t *w, int n)
{
    linear_beta(y, x, w, n, 0.0f);
}

void hk_linear_acc(float *y, const float *x, const hk_weight_t *w, int n)
{
    linear_beta(y, x, w, n, 1.0f);
}
