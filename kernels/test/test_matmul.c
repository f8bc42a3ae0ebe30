/*
 * test_matmul.c - hk_matmul / hk_matmul_acc against a float64 brute-force
 * x W^T: the gemv path (n = 1), odd sizes, several row and column blocks,
 * accumulation, full overwrite of y, in = 0; 1, 2 and 3 OpenMP threads
 * must give the same bits; hk_matmul_init must leave OpenMP's thread count.
 *
 * HK_BENCH=1 (or =R: best of R runs) also times n = 512, in = 1024,
 * out = 3584 (diagnostic).
 */
#include <cblas.h>
#include <omp.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

#include "kernels/cpu/hk_cpu.h"
#include "t/lib/tap.h"
#define TEST_RNG_SEED 0x243f6a8885a308d3ull
#include "t/lib/testrand.h"

/* Data in [-1, 1): a float dot product of in <= 1024 terms has rounding
 * ~sqrt(in) * 2^-24 * (partial sums <= ~20) ~ 4e-5 at worst in practice;
 * a wrong layout or a dropped term errs by O(0.1). */
#define ATOL 1e-4
#define RTOL 1e-5

static float *frand(size_t n)
{
    float *x = malloc((n ? n : 1) * sizeof(float));
    for (size_t i = 0; i < n; i++)
        x[i] = (float)urand();
    return x;
}

/* ref[n, out] = y0 + x W^T in float64 (y0 may be NULL). */
static void ref_matmul(double *ref, const float *y0, const float *x,
                       const float *w, int n, int in, int out)
{
    for (int i = 0; i < n; i++)
        for (int o = 0; o < out; o++) {
            double s = y0 ? (double)y0[(size_t)i * out + o] : 0.0;
            for (int j = 0; j < in; j++)
                s += (double)x[(size_t)i * in + j] *
                     (double)w[(size_t)o * in + j];
            ref[(size_t)i * out + o] = s;
        }
}

static void check(int n, int in, int out)
{
    float *x = frand((size_t)n * in), *w = frand((size_t)out * in);
    float *y0 = frand((size_t)n * out);
    size_t ny = (size_t)n * out;
    float *y = malloc((ny ? ny : 1) * sizeof(float));
    double *ref = malloc((ny ? ny : 1) * sizeof(double));

    for (size_t i = 0; i < ny; i++)
        y[i] = NAN; /* every element must be overwritten */
    hk_matmul(y, x, w, n, in, out);
    ref_matmul(ref, NULL, x, w, n, in, out);
    close_d(ref, y, ny, ATOL, RTOL, "matmul n=%d in=%d out=%d", n, in, out);

    memcpy(y, y0, ny * sizeof(float));
    hk_matmul_acc(y, x, w, n, in, out);
    ref_matmul(ref, y0, x, w, n, in, out);
    close_d(ref, y, ny, ATOL, RTOL, "matmul_acc n=%d in=%d out=%d", n, in, out);
    free(x);
    free(w);
    free(y0);
    free(y);
    free(ref);
}

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + 1e-9 * ts.tv_nsec;
}

static void check_all(void)
{
    check(1, 1, 1);
    check(1, 37, 53);    /* gemv path */
    check(1, 1024, 300); /* gemv, two chunks */
    check(2, 5, 3);
    check(3, 37, 53);
    check(17, 129, 65);
    check(64, 300, 129);
    check(130, 1024, 96);
    check(33, 200, 777); /* four column blocks, the last partial */
    check(520, 64, 300); /* 3 x 2 blocks */
    check(257, 40, 30);  /* last row block: one row (gemv) */

    /* in = 0: the empty sum is 0; acc leaves y as it was. */
    float y[6] = {1, 2, 3, 4, 5, 6}, x[1] = {0}, w[1] = {0};
    hk_matmul_acc(y, x, w, 2, 0, 3);
    ok(y[0] == 1 && y[5] == 6, "matmul_acc with in=0 leaves y");
    hk_matmul(y, x, w, 2, 0, 3);
    ok(y[0] == 0 && y[5] == 0, "matmul with in=0 writes zeros");
}

static void bench(int reps)
{
    int n = 512, in = 1024, out = 3584;
    float *x = frand((size_t)n * in), *w = frand((size_t)out * in);
    float *y = malloc((size_t)n * out * sizeof(float));
    double best = INFINITY;
    for (int i = 0; i < reps; i++) {
        double t0 = now();
        hk_matmul(y, x, w, n, in, out);
        double dt = now() - t0;
        best = dt < best ? dt : best;
    }
    tap_diag("bench: hk_matmul n=%d in=%d out=%d: %.3f ms (best of %d), "
             "%.1f GFLOP/s; OpenBLAS core %s, %d BLAS / %d OpenMP threads",
             n, in, out, best * 1e3, reps, 2.0 * n * in * out / best * 1e-9,
             openblas_get_corename(), openblas_get_num_threads(),
             omp_get_max_threads());
    free(x);
    free(w);
    free(y);
}

int main(void)
{
    /* HK_BENCH=R: best of R runs (20 when R < 2). */
    int reps = getenv("HK_BENCH") ? atoi(getenv("HK_BENCH")) : 0;
    reps = getenv("HK_BENCH") ? (reps > 1 ? reps : 20) : 0;

    int nth = omp_get_max_threads();
    hk_matmul_init();
    ok(omp_get_max_threads() == nth,
       "hk_matmul_init leaves OpenMP at %d threads", nth);
    check_all();
    {
        /* several row and column blocks, partial last ones, and gemv */
        int n = 300, in = 333, out = 1300;
        float *x = frand((size_t)n * in), *w = frand((size_t)out * in);
        size_t ny = (size_t)n * out;
        float *y1 = malloc(ny * sizeof(float)),
              *y2 = malloc(ny * sizeof(float));
        float *v1 = malloc(out * sizeof(float)),
              *v2 = malloc(out * sizeof(float));
        /* in = 150: below the fork threshold, BLAS must still use one thread */
        float *u1 = malloc(out * sizeof(float)),
              *u2 = malloc(out * sizeof(float));
        int same = 1;
        omp_set_num_threads(1);
        hk_matmul(y1, x, w, n, in, out);
        hk_matmul(v1, x, w, 1, in, out);
        hk_matmul(u1, x, w, 1, 150, out);
        for (int nt = 2; nt <= 3; nt++) {
            omp_set_num_threads(nt);
            hk_matmul(y2, x, w, n, in, out);
            hk_matmul(v2, x, w, 1, in, out);
            hk_matmul(u2, x, w, 1, 150, out);
            same &= memcmp(u1, u2, (size_t)out * sizeof(float)) == 0;
            same &= memcmp(y1, y2, ny * sizeof(float)) == 0;
            same &= memcmp(v1, v2, (size_t)out * sizeof(float)) == 0;
        }
        omp_set_num_threads(nth);
        ok(same, "1, 2 and 3 threads give bitwise equal y (OpenBLAS %s)",
           openblas_get_parallel() == 2   ? "OpenMP build"
           : openblas_get_parallel() == 1 ? "pthreads build"
                                          : "sequential");
        free(x);
        free(w);
        free(y1);
        free(y2);
        free(v1);
        free(v2);
        free(u1);
        free(u2);
    }
    if (reps)
        bench(reps);
    return tap_done();
}
