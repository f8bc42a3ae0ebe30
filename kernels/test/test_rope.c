/*
 * test_rope.c - hk_rope / hk_rope_shift against float64 rotate-half RoPE:
 * partial rotation (Qwen3-Next: hd 256, rot 64, theta 1e7), full and odd
 * sizes, positions up to 262143, untouched pass-through dims, and the
 * re-rotation identity rope(x, p) then shift(d) = rope(x, p + d), including
 * negative d. Also reports (diagnostic) how far HF's float32 angles are
 * from ours at long positions.
 */
#include <stdint.h>
#include <string.h>

#include "kernels/cpu/hk_cpu.h"
#include "t/lib/tap.h"
#define TEST_RNG_SEED 0x082efa98ec4e6c89ull
#include "t/lib/testrand.h"

/* |x| <= 1. cos/sin are rounded to float once (2^-24 relative each), the
 * rotation x0 c - x1 s adds two products and a sum in float: error <=
 * ~4 * 2^-24 * (|x0| + |x1|) <= 5e-7. */
#define ATOL 5e-7
#define RTOL 1e-6
/* rope then shift rotates twice: at most twice the error of one rope. */
#define ATOL_SHIFT 1e-6

static float *frand(size_t n)
{
    float *x = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++)
        x[i] = (float)urand();
    return x;
}

/* float64 rotate-half RoPE of x[T, nh, hd] to positions pos[t] (+ add). */
static void ref_rope(double *y, const float *x, const int *pos, long add, int T,
                     int nh, int hd, int rot, double theta)
{
    int h2 = rot / 2;
    for (int t = 0; t < T; t++)
        for (int h = 0; h < nh; h++) {
            const float *a = x + ((size_t)t * nh + h) * hd;
            double *b = y + ((size_t)t * nh + h) * hd;
            for (int i = 0; i < hd; i++)
                b[i] = a[i];
            for (int i = 0; i < h2; i++) {
                double phi =
                    (double)(pos[t] + add) * pow(theta, -2.0 * i / rot);
                b[i] = a[i] * cos(phi) - a[i + h2] * sin(phi);
                b[i + h2] = a[i + h2] * cos(phi) + a[i] * sin(phi);
            }
        }
}

static void check_rope(int T, int nh, int hd, int rot, double theta,
                       const int *pos)
{
    size_t n = (size_t)T * nh * hd;
    float *x = frand(n), *x0 = malloc(n * sizeof(float));
    double *ref = malloc(n * sizeof(double));
    memcpy(x0, x, n * sizeof(float));
    ref_rope(ref, x0, pos, 0, T, nh, hd, rot, theta);
    hk_rope(x, pos, T, nh, hd, rot, theta);
    close_d(ref, x, n, ATOL, RTOL, "rope T=%d nh=%d hd=%d rot=%d theta=%g", T,
            nh, hd, rot, theta);
    int same = 1;
    for (size_t r = 0; r < (size_t)T * nh; r++)
        same &= memcmp(x + r * hd + rot, x0 + r * hd + rot,
                       (size_t)(hd - rot) * sizeof(float)) == 0;
    ok(same, "rope hd=%d rot=%d: dims rot..hd-1 untouched", hd, rot);
    free(x);
    free(x0);
    free(ref);
}

/* rope(x, pos) then shift(d) versus rope(x, pos + d) and float64. */
static void check_shift(int T, int nh, int hd, int rot, double theta,
                        const int *pos, int d)
{
    size_t n = (size_t)T * nh * hd;
    float *x = frand(n), *a = malloc(n * sizeof(float));
    float *b = malloc(n * sizeof(float));
    double *ref = malloc(n * sizeof(double));
    int *pd = malloc((size_t)T * sizeof(int));
    for (int t = 0; t < T; t++)
        pd[t] = pos[t] + d;
    memcpy(a, x, n * sizeof(float));
    memcpy(b, x, n * sizeof(float));
    hk_rope(a, pos, T, nh, hd, rot, theta);
    hk_rope_shift(a, d, T, nh, hd, rot, theta);
    hk_rope(b, pd, T, nh, hd, rot, theta);
    ref_rope(ref, x, pos, d, T, nh, hd, rot, theta);
    close_d(ref, a, n, ATOL_SHIFT, RTOL,
            "shift %+d after rope matches float64 rope at p%+d", d, d);
    close_f(b, a, n, ATOL_SHIFT, RTOL,
            "shift %+d after rope equals rope at p%+d (hd=%d rot=%d)", d, d, hd,
            rot);
    free(x);
    free(a);
    free(b);
    free(ref);
    free(pd);
}

/* HF's float32 recipe: inv_freq = 1 / theta^(arange(0, rot, 2) / rot) in
 * float32, angle = float32(p * inv_freq), float32 cos/sin. Diagnostic:
 * the largest |ours - HF| per unit |x| at position p. */
static double hf_gap(int p, int rot, double theta)
{
    int h2 = rot / 2;
    double worst = 0.0;
    for (int i = 0; i < h2; i++) {
        float e = (float)(2 * i) / (float)rot;
        float inv = 1.0f / powf((float)theta, e);
        float phi = (float)p * inv;
        double ours = (double)p * pow(theta, -2.0 * i / rot);
        double g = fabs(cosf(phi) - cos(ours)) + fabs(sinf(phi) - sin(ours));
        worst = g > worst ? g : worst;
    }
    return worst;
}

int main(void)
{
    /* Qwen3-Next attention heads: hd 256, rot 64, theta 1e7. */
    {
        int pos[5] = {0, 1, 4095, 131071, 262143};
        check_rope(5, 3, 256, 64, 1e7, pos);
    }
    {
        int pos[7] = {3, 0, 17, 17, 1000, 2, 99999};
        check_rope(7, 2, 10, 6, 10000.0, pos);  /* odd sizes */
        check_rope(7, 1, 16, 16, 10000.0, pos); /* full rotation */
        check_rope(7, 2, 9, 0, 10000.0, pos);   /* rot 0: no-op */
    }
    {
        int T = 300, *pos = malloc(T * sizeof(int)); /* OpenMP path */
        for (int t = 0; t < T; t++)
            pos[t] = 7 * t;
        check_rope(T, 10, 256, 64, 1e7, pos);
        check_shift(T, 10, 256, 64, 1e7, pos, 1234);
        free(pos);
    }
    {
        int pos[4] = {0, 5, 100000, 200000};
        check_shift(4, 2, 256, 64, 1e7, pos, 1);
        check_shift(4, 2, 256, 64, 1e7, pos, 62143);
        check_shift(4, 3, 10, 6, 10000.0, pos, 777);
    }
    {
        int pos[3] = {5000, 6000, 100000};
        check_shift(3, 2, 256, 64, 1e7, pos, -4999);
    }
    {
        float x[8] = {1, 2, 3, 4, 5, 6, 7, 8}, y[8];
        memcpy(y, x, sizeof x);
        hk_rope_shift(y, 0, 1, 1, 8, 8, 1e7);
        ok(memcmp(x, y, sizeof x) == 0, "shift by 0 is the identity");
    }

    for (int p = 1024; p <= 262144; p *= 16)
        tap_diag("HF float32 angles vs ours (double) at p=%d: max |dcos| + "
                 "|dsin| = %.2e",
                 p, hf_gap(p, 64, 1e7));
    return tap_done();
}
