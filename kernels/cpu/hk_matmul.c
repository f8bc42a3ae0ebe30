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
 */
#include <assert.h>
#include <cblas.h>
#include <omp.h>
#include <string.h>

#include "kernels/cpu/hk_cpu.h"

/* Output columns and rows per BLAS call: multiples of OpenBLAS's register
 * tiles, small enough to balance narrow layers (k_proj, the GDN b/a
 * projections) over a few threads, big enough to amortize its packing. */
#define HK_MM_CHUNK 256
#define HK_MM_ROWS  256
/* Below this many multiply-adds the OpenMP fork costs more than it gains. */
#define HK_MM_PAR_MIN (1 << 18)

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

static void hk_matmul_beta(float *y,       // [n, out]
                           const float *x, // [n, in]
                           const float *w, // [out, in]
                           int n, int in, int out, float beta)
{
    assert(n >= 0 && in >= 0 && out >= 0);
    if (n == 0 || out == 0)
        return;
    if (in == 0) {
        /* BLAS rejects lda = 0; the empty sum is 0. */
        if (beta == 0.0f)
            for (int i = 0; i < n; i++)
                memset(y + (size_t)i * out, 0, (size_t)out * sizeof(float));
        return;
    }
    const size_t work = (size_t)n * (size_t)in * (size_t)out;
    const int nch = (out + HK_MM_CHUNK - 1) / HK_MM_CHUNK;
    const int nrb = (n + HK_MM_ROWS - 1) / HK_MM_ROWS;
#pragma omp parallel for schedule(static) if (nch * nrb > 1 &&                 \
                                              work >= HK_MM_PAR_MIN)
    for (int b = 0; b < nch * nrb; b++) {
        const int r0 = b / nch * HK_MM_ROWS, o0 = b % nch * HK_MM_CHUNK;
        const int rn = n - r0 < HK_MM_ROWS ? n - r0 : HK_MM_ROWS;
        const int oc = out - o0 < HK_MM_CHUNK ? out - o0 : HK_MM_CHUNK;
        hk_matmul_part(y, x, w, rn, in, out, r0, o0, oc, beta);
    }
}

void hk_matmul(float *y, const float *x, const float *w, int n, int in, int out)
{
    hk_matmul_beta(y, x, w, n, in, out, 0.0f);
}

void hk_matmul_acc(float *y, const float *x, const float *w, int n, int in,
                   int out)
{
    hk_matmul_beta(y, x, w, n, in, out, 1.0f);
}
