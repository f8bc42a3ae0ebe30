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
 * different thread counts (measured, 0.3.21), and its pthreads pool fights
 * OpenMP when called from OpenMP threads. So, once hk_matmul_init() has made
 * OpenBLAS single-threaded, the output columns are cut into fixed chunks of
 * HK_MM_CHUNK (independent of the thread count) and OpenMP runs one
 * single-threaded BLAS call per chunk: y is then the same for any number of
 * threads, and decode's gemv gets faster than OpenBLAS's threaded one. If
 * OpenBLAS still runs several threads, one whole call is made instead.
 */
#include <assert.h>
#include <cblas.h>
#include <string.h>

#include "kernels/cpu/hk_cpu.h"

/* Output columns per BLAS call: a multiple of the kernels' register tiles,
 * small enough to balance 3584-wide layers over a few threads. */
#define HK_MM_CHUNK 256
/* Below this many multiply-adds one call beats the OpenMP fork. */
#define HK_MM_PAR_MIN (1 << 20)

void hk_matmul_init(void)
{
    openblas_set_num_threads(1);
}

/* y[:, o0:o0+oc] for one chunk of W's rows. */
static void hk_matmul_part(float *y, const float *x, const float *w, int n,
                           int in, int out, int o0, int oc, float beta)
{
    if (n == 1)
        cblas_sgemv(CblasRowMajor, CblasNoTrans, oc, in, 1.0f,
                    w + (size_t)o0 * in, in, x, 1, beta, y + o0, 1);
    else
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, oc, in, 1.0f, x,
                    in, w + (size_t)o0 * in, in, beta, y + o0, out);
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
    if (openblas_get_num_threads() > 1 || out <= HK_MM_CHUNK) {
        hk_matmul_part(y, x, w, n, in, out, 0, out, beta);
        return;
    }
    const int nch = (out + HK_MM_CHUNK - 1) / HK_MM_CHUNK;
#pragma omp parallel for schedule(static) if (work >= HK_MM_PAR_MIN)
    for (int c = 0; c < nch; c++) {
        const int o0 = c * HK_MM_CHUNK;
        const int oc = out - o0 < HK_MM_CHUNK ? out - o0 : HK_MM_CHUNK;
        hk_matmul_part(y, x, w, n, in, out, o0, oc, beta);
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
