/*
 * linear_bench.c - GB/s of W that hk_linear reaches in decode (n = 1) on a
 * weight larger than the caches, per format, ISA and thread count: the
 * ceiling of the engine's decode step, which streams every weight once.
 *
 *   build/bench/linear_bench [--rows 248320] [--cols 1024] [--n 1]
 *       [--dtype f32,bf16,int8] [--group 64] [--threads 1,2] [--reps 15]
 *
 * Defaults: the LM head of the Qwen3.5-0.8B shape (bf16 508 MB). Weights
 * are random bits (bf16 from random f32, int8 bytes in [-127, 127] with
 * random scales): the kernels' speed does not depend on the values. Each
 * row of output is the median and the best of --reps products after one
 * untimed product, in wall time and in CPU time of the process (all its
 * threads: on a shared machine the CPU time of one thread is the steadier
 * figure, it leaves out the time the thread was not running). HK_ISA caps the
 * ISA (hk_cpu_isa). To compare two builds, run their binaries alternately and
 * compare the medians.
 */
#include <omp.h>

#include "bench/bench_util.h"
#include "kernels/cpu/hk_cpu.h"

static int cmp_dbl(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static void fill(hk_weight_t *w, void **data, float **scales, int dtype,
                 int rows, int cols, int group)
{
    uint64_t s = BENCH_SEED;
    const size_t n = (size_t)rows * cols;
    *w = (hk_weight_t){
        .dtype = dtype, .rows = rows, .cols = cols, .group = group};
    *data = aligned_alloc(64, (n * hk_wtype_size(dtype) + 63) & ~(size_t)63);
    *scales = NULL;
    if (dtype == HK_W_F32) {
        float *d = *data;
        for (size_t i = 0; i < n; i++)
            d[i] = (float)bench_unif(&s) - 0.5f;
    } else if (dtype == HK_W_BF16) {
        uint16_t *d = *data;
        for (size_t i = 0; i < n; i++) {
            float f = (float)bench_unif(&s) - 0.5f;
            uint32_t u;
            memcpy(&u, &f, 4);
            d[i] = (uint16_t)(u >> 16);
        }
    } else {
        int8_t *d = *data;
        const size_t ns = (size_t)rows * (cols / group);
        for (size_t i = 0; i < n; i++)
            d[i] = (int8_t)(bench_xorshift(&s) % 255) - 127;
        *scales = malloc(ns * sizeof(float));
        for (size_t i = 0; i < ns; i++)
            (*scales)[i] = (float)bench_unif(&s) * 1e-3f;
        w->scales = *scales;
    }
    w->data = *data;
}

int main(int argc, char **argv)
{
    int rows = 248320, cols = 1024, n = 1, group = 64, reps = 15;
    const char *dtypes = "f32,bf16,int8", *threads = "1,2";
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--rows"))
            rows = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--cols"))
            cols = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--n"))
            n = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--group"))
            group = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--reps"))
            reps = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--dtype"))
            dtypes = argv[i + 1];
        else if (!strcmp(argv[i], "--threads"))
            threads = argv[i + 1];
        else {
            fprintf(stderr, "usage: linear_bench [--rows R] [--cols K] "
                            "[--n N] [--dtype f32,bf16,int8] [--group G] "
                            "[--threads 1,2] [--reps R]\n");
            return 2;
        }
    }
    if (rows < 1 || cols < 1 || n < 1 || reps < 1 || group < 1 ||
        cols % group) {
        fprintf(stderr, "linear_bench: bad shape (group must divide cols)\n");
        return 2;
    }
    hk_matmul_init();
    float *x = malloc((size_t)n * cols * sizeof(float));
    float *y = malloc((size_t)n * rows * sizeof(float));
    uint64_t s = BENCH_SEED ^ 1;
    for (size_t i = 0; i < (size_t)n * cols; i++)
        x[i] = (float)bench_unif(&s) - 0.5f;
    double *t = malloc((size_t)reps * sizeof(double));
    double *tc = malloc((size_t)reps * sizeof(double));
    printf("| dtype | isa | threads | %d x %d, n=%d: ms median | best | "
           "GB/s of W (median) | CPU ms (median) |\n"
           "|---|---|---|---|---|---|---|\n",
           rows, cols, n);
    static const char *const names[] = {"f32", "bf16", "int8"};
    for (int dt = HK_W_F32; dt <= HK_W_I8; dt++) {
        if (!strstr(dtypes, names[dt]))
            continue;
        hk_weight_t w;
        void *data;
        float *scales;
        fill(&w, &data, &scales, dt, rows, cols, group);
        double bytes = (double)rows * cols * hk_wtype_size(dt);
        if (dt == HK_W_I8)
            bytes += (double)rows * (cols / group) * sizeof(float);
        for (const char *p = threads; *p;) {
            const int th = atoi(p);
            omp_set_num_threads(th > 0 ? th : 1);
            hk_linear(y, x, &w, n);
            for (int r = 0; r < reps; r++) {
                const double t0 = bench_now();
                const double c0 = bench_clock(CLOCK_PROCESS_CPUTIME_ID);
                hk_linear(y, x, &w, n);
                t[r] = bench_now() - t0;
                tc[r] = bench_clock(CLOCK_PROCESS_CPUTIME_ID) - c0;
            }
            qsort(t, (size_t)reps, sizeof(double), cmp_dbl);
            qsort(tc, (size_t)reps, sizeof(double), cmp_dbl);
            const double med = t[reps / 2];
            printf("| %s | %s | %d | %.2f | %.2f | %.2f | %.2f |\n", names[dt],
                   dt == HK_W_F32 && hk_cpu_isa(dt) != HK_ISA_AVX512
                       ? "openblas"
                       : hk_isa_name(hk_cpu_isa(dt)),
                   th, med * 1e3, t[0] * 1e3, bytes / med * 1e-9,
                   tc[reps / 2] * 1e3);
            fflush(stdout);
            p = strchr(p, ',');
            if (!p)
                break;
            p++;
        }
        free(data);
        free(scales);
    }
    free(t);
    free(tc);
    free(x);
    free(y);
    return 0;
}
