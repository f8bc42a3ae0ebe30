/*
 * test_linear.c - hk_linear / hk_linear_acc / hk_weight_rows on BF16 and
 * I8 weights, for every ISA this CPU has (plain C, AVX2, AVX-512; the
 * others SKIP), against a float64 x W^T of the weights' exact f32 values
 * (bf16 widened, q * scale).
 *
 * Bounds, per output y = sum_k x_k W_k, with A = sum_k |x_k W_k|:
 *  - exact-weight paths (every BF16 kernel, I8 on plain C and AVX2, the
 *    sgemm tile path for many rows): f32 summation, |err| <= 1e-5 A (for
 *    <= ~16k terms summed in vector lanes the worst case is a few 1e-6 A;
 *    x rounded to bf16, as a vdpbf16ps kernel would, errs by up to 2^-9 A);
 *  - I8 on AVX-512 VNNI: x quantized per group g to max|x_g|/127 steps,
 *    off by at most half a step: |err| <= sum_g (max|x_g| / 254)
 *    sum_{k in g} |W_k| + 1e-5 A;
 * and against hk_matmul (the f32 kernel) on those exact values within
 * twice the bound. A dropped term, a wrong scale or layout errs by
 * O(A / sqrt(in)) or more.
 * Also: 1, 2 and 3 OpenMP threads give the same bits; the gather equals
 * the exact f32 rows.
 *
 * HK_BENCH=1 also times decode-shaped products on each ISA (diagnostic).
 */
#include <omp.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

#include "kernels/cpu/hk_cpu.h"
#include "t/lib/tap.h"
#define TEST_RNG_SEED 0x13198a2e03707344ull
#include "t/lib/testrand.h"

typedef struct {
    hk_weight_t w;
    float *exact; /* [rows, cols] the f32 values W stands for */
    void *data;
    float *scales;
} wmat_t;

static uint16_t to_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

/* Set: make_w puts -128 (which the converter never writes, but an int8
 * checkpoint may hold) at every 7th I8 weight. */
static int i8_floor;

/* A random [rows, cols] weight of dtype (I8: groups of g columns, scales
 * max|W_g| / 127 as the converter makes them). */
static wmat_t make_w(int dtype, int rows, int cols, int g)
{
    wmat_t m = {0};
    size_t n = (size_t)rows * cols;
    float *src = frand_amp(n ? n : 1, 1.0);
    m.exact = malloc((n ? n : 1) * sizeof(float));
    m.w = (hk_weight_t){.dtype = dtype, .rows = rows, .cols = cols};
    if (dtype == HK_W_F32) {
        memcpy(m.exact, src, n * sizeof(float));
        m.data = src;
        src = NULL;
    } else if (dtype == HK_W_BF16) {
        uint16_t *d = malloc((n ? n : 1) * 2);
        for (size_t i = 0; i < n; i++) {
            uint32_t u = (uint32_t)(d[i] = to_bf16(src[i])) << 16;
            memcpy(&m.exact[i], &u, 4);
        }
        m.data = d;
    } else {
        int8_t *d = malloc(n ? n : 1);
        int ng = cols / g;
        m.scales = malloc((size_t)rows * ng * sizeof(float) + 1);
        for (int o = 0; o < rows; o++)
            for (int j = 0; j < ng; j++) {
                const float *s = src + (size_t)o * cols + (size_t)j * g;
                float mx = 0;
                for (int k = 0; k < g; k++)
                    mx = fabsf(s[k]) > mx ? fabsf(s[k]) : mx;
                float sc = mx / 127.0f;
                m.scales[(size_t)o * ng + j] = sc;
                for (int k = 0; k < g; k++) {
                    size_t i = (size_t)o * cols + (size_t)j * g + k;
                    d[i] = (int8_t)lrintf(sc > 0 ? s[k] / sc : 0.0f);
                    if (i8_floor && i % 7 == 5)
                        d[i] = -128;
                    m.exact[i] = (float)d[i] * sc;
                }
            }
        m.data = d;
        m.w.scales = m.scales;
        m.w.group = g;
    }
    m.w.data = m.data;
    free(src);
    return m;
}

static void free_w(wmat_t *m)
{
    free(m->exact);
    free(m->data);
    free(m->scales);
}

/* Worst |err| / bound over y[n, rows] (y0: the accumulated start or
 * NULL); vnni: the activation-quantization bound applies. yf: compare
 * with it (the f32 kernel's result, its own error within the same bound)
 * instead of the float64 sum, against twice the bound. */
static double worst_ratio(const float *y, const float *y0, const float *x,
                          const wmat_t *m, int n, double rel, int vnni,
                          const float *yf)
{
    const int in = m->w.cols, out = m->w.rows, g = m->w.group;
    double worst = 0;
    for (int i = 0; i < n; i++)
        for (int o = 0; o < out; o++) {
            const float *xr = x + (size_t)i * in;
            const float *wr = m->exact + (size_t)o * in;
            double ref = y0 ? y0[(size_t)i * out + o] : 0.0, A = 0, q = 0;
            for (int k = 0; k < in; k++) {
                ref += (double)xr[k] * wr[k];
                A += fabs((double)xr[k] * wr[k]);
            }
            for (int j = 0; vnni && j < in / g; j++) {
                double mx = 0, sw = 0;
                for (int k = j * g; k < (j + 1) * g; k++) {
                    mx = fabs(xr[k]) > mx ? fabs(xr[k]) : mx;
                    sw += fabs(wr[k]);
                }
                q += mx / 254.0 * sw;
            }
            double lim = rel * A + q + 1e-7;
            if (yf) {
                ref = yf[(size_t)i * out + o];
                lim *= 2;
            }
            double r = fabs(ref - y[(size_t)i * out + o]) / lim;
            if (!(r <= worst))
                worst = isnan(r) ? INFINITY : r;
        }
    return worst;
}

static const char *dt_name(int dt)
{
    return dt == HK_W_F32 ? "f32" : dt == HK_W_BF16 ? "bf16" : "i8";
}

static void check(hk_isa_t isa, int dtype, int n, int in, int out, int g)
{
    wmat_t m = make_w(dtype, out, in, g);
    float *x = frand_amp((size_t)n * in + 1, 1.0);
    if (n > 1 && in > 4) {
        /* a zero row (group scale 0) and an outlier */
        memset(x + (size_t)in, 0, (size_t)in * sizeof(float));
        x[3] = 40.0f;
    }
    size_t ny = (size_t)n * out;
    float *y = malloc((ny + 1) * sizeof(float));
    float *y0 = frand_amp(ny + 1, 1.0);
    const int direct = n <= HK_LINEAR_DIRECT;
    const int vnni =
        direct && isa == HK_ISA_AVX512 && dtype == HK_W_I8 && in <= 16384;
    const double rel = 1e-5;
    for (size_t i = 0; i < ny; i++)
        y[i] = NAN;
    hk_linear(y, x, &m.w, n);
    double r1 = worst_ratio(y, NULL, x, &m, n, rel, vnni, NULL);
    /* the f32 kernel on the weights' exact values */
    float *yf = malloc((ny + 1) * sizeof(float));
    hk_matmul(yf, x, m.exact, n, in, out);
    double rf = worst_ratio(y, NULL, x, &m, n, rel, vnni, yf);
    memcpy(y, y0, ny * sizeof(float));
    hk_linear_acc(y, x, &m.w, n);
    double r2 = worst_ratio(y, y0, x, &m, n, rel, vnni, NULL);
    ok(r1 <= 1.0 && r2 <= 1.0 && rf <= 1.0,
       "%s %s n=%d in=%d out=%d%s%.0d: err/bound %.2f, acc %.2f, vs "
       "hk_matmul %.2f",
       hk_isa_name(isa), dt_name(dtype), n, in, out,
       dtype == HK_W_I8 ? " group=" : "", dtype == HK_W_I8 ? g : 0, r1, r2, rf);
    free(yf);
    free_w(&m);
    free(x);
    free(y);
    free(y0);
}

static void check_isa(hk_isa_t isa, int dtype)
{
    hk_cpu_set_isa(isa);
    if (hk_cpu_isa(dtype) != isa) {
        char why[96];
        snprintf(why, sizeof(why), "%s %s kernels: not on this CPU",
                 hk_isa_name(isa), dt_name(dtype));
        tap_skip(why);
        return;
    }
    check(isa, dtype, 1, 1, 1, 1);
    check(isa, dtype, 1, 37, 53, 37);     /* tails everywhere, per channel */
    check(isa, dtype, 1, 1024, 300, 64);  /* two output chunks */
    check(isa, dtype, 1, 1024, 33, 1024); /* one scale per row */
    check(isa, dtype, 2, 96, 17, 32);     /* half-vector groups */
    check(isa, dtype, 3, 200, 777, 40);   /* masked groups, 4 chunks */
    check(isa, dtype, 4, 130, 9, 26);
    check(isa, dtype, 5, 64, 70, 16);
    check(isa, dtype, 8, 333, 300, 111); /* two row groups of 4 */
    check(isa, dtype, 9, 333, 300, 37);  /* tile path from here */
    check(isa, dtype, 300, 333, 520, 9); /* 2 x 3 blocks, 3 K slices */
    check(isa, dtype, 3, 4100, 20, 100); /* passes of 2048 columns */
    check(isa, dtype, 1, 16448, 8, 64);  /* past the VNNI stack */
    /* VNNI's shapes: groups of 1, 2 and 4 chunks of 64, row groups of 4
     * and 3 */
    check(isa, dtype, 1, 1024, 300, 128);
    check(isa, dtype, 4, 512, 77, 256);
    check(isa, dtype, 7, 384, 50, 64);
    i8_floor = 1; /* W's whole int8 range */
    check(isa, dtype, 1, 256, 40, 64);
    check(isa, dtype, 3, 256, 21, 128);
    i8_floor = 0;
}

static void check_threads(int dtype, int n)
{
    int nth = omp_get_max_threads(), in = 300, out = 1100;
    wmat_t m = make_w(dtype, out, in, 60);
    float *x = frand_amp((size_t)n * in, 1.0);
    float *y1 = malloc((size_t)n * out * sizeof(float));
    float *y2 = malloc((size_t)n * out * sizeof(float));
    int same = 1;
    omp_set_num_threads(1);
    hk_linear(y1, x, &m.w, n);
    for (int t = 2; t <= 3; t++) {
        omp_set_num_threads(t);
        hk_linear(y2, x, &m.w, n);
        same &= memcmp(y1, y2, (size_t)n * out * sizeof(float)) == 0;
    }
    omp_set_num_threads(nth);
    ok(same, "%s %s n=%d: 1, 2 and 3 threads give the same bits",
       hk_isa_name(hk_cpu_isa(dtype)), dt_name(dtype), n);
    free_w(&m);
    free(x);
    free(y1);
    free(y2);
}

static void check_rows(int dtype)
{
    wmat_t m = make_w(dtype, 50, 96, 32);
    int ids[3] = {49, 0, 7};
    float *d = malloc(3 * 96 * sizeof(float));
    hk_weight_rows(d, &m.w, ids, 3);
    int same = 1;
    for (int i = 0; i < 3; i++)
        same &= memcmp(d + i * 96, m.exact + (size_t)ids[i] * 96,
                       96 * sizeof(float)) == 0;
    ok(same, "%s rows gather: the exact f32 rows", dt_name(dtype));
    free(d);
    free_w(&m);
}

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + 1e-9 * ts.tv_nsec;
}

/* Decode-shaped: one row through a 1024 x 3584 weight (the 0.8B MLP). */
static void bench(int reps)
{
    const int in = 1024, out = 3584;
    for (int dt = HK_W_F32; dt <= HK_W_I8; dt++)
        for (int isa = HK_ISA_GENERIC; isa <= HK_ISA_AVX512; isa++) {
            hk_cpu_set_isa((hk_isa_t)isa);
            if (dt == HK_W_F32 ? isa != HK_ISA_AVX512
                               : (int)hk_cpu_isa(dt) != isa)
                continue; /* f32: OpenBLAS, whatever the ISA cap */
            wmat_t m = make_w(dt, out, in, 64);
            float *x = frand_amp(16 * (size_t)in, 1.0);
            float *y = malloc(16 * (size_t)out * sizeof(float));
            for (int n = 1; n <= 16; n *= 4) {
                double best = INFINITY;
                for (int r = 0; r < reps; r++) {
                    double t0 = now();
                    hk_linear(y, x, &m.w, n);
                    double dt2 = now() - t0;
                    best = dt2 < best ? dt2 : best;
                }
                tap_diag("bench: %s %s n=%d %dx%d: %.3f ms, %.1f GB/s of W, "
                         "%.1f GFLOP/s",
                         hk_isa_name((hk_isa_t)isa), dt_name(dt), n, out, in,
                         best * 1e3,
                         (double)in * out * hk_wtype_size(dt) / best * 1e-9,
                         2.0 * n * in * out / best * 1e-9);
            }
            free_w(&m);
            free(x);
            free(y);
        }
}

int main(void)
{
    int reps = getenv("HK_BENCH") ? atoi(getenv("HK_BENCH")) : 0;
    reps = getenv("HK_BENCH") ? (reps > 1 ? reps : 20) : 0;
    hk_matmul_init();
    for (int dt = HK_W_BF16; dt <= HK_W_I8; dt++) {
        for (int isa = HK_ISA_GENERIC; isa <= HK_ISA_AVX512; isa++)
            check_isa((hk_isa_t)isa, dt);
        hk_cpu_set_isa(HK_ISA_AVX512);
        check_threads(dt, 1);
        check_threads(dt, 5);
        check_threads(dt, 40);
        check_rows(dt);
    }
    if (reps)
        bench(reps);
    hk_cpu_set_isa(HK_ISA_AVX512);
    return tap_done();
}
