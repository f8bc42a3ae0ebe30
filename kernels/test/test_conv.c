/*
 * test_conv.c - hk_conv1d_silu against a float64 causal depthwise conv over
 * (state ++ x): zero and non-zero start states, T < K-1 (the state shifts),
 * K = 1 (no state), odd channel counts, the OpenMP path, one call versus
 * split calls with the state carried, and token-by-token decode.
 */
#include <stdint.h>
#include <string.h>

#include "kernels/cpu/hk_cpu.h"
#include "t/lib/tap.h"
#define TEST_RNG_SEED 0xa4093822299f31d0ull
#include "t/lib/testrand.h"

/* y = silu of a K-term float sum (K <= 8, |terms| <= 1): a few roundings of
 * 2^-24 on an O(1) value plus expf's ulp; 2e-6 relative, 1e-6 absolute
 * near y = 0. The state is a copy of inputs: exact. */
#define RTOL 2e-6
#define ATOL 1e-6
/* Split calls do the same per-channel sum in the same order as one call;
 * only FMA contraction chosen differently in the two code paths could
 * differ, by an ulp or two. */
#define SPLIT_RTOL 3e-7
#define SPLIT_ATOL 1e-7

static float *frand(size_t n)
{
    float *x = malloc((n ? n : 1) * sizeof(float));
    for (size_t i = 0; i < n; i++)
        x[i] = (float)urand();
    return x;
}

/* Reference: history h[tau] over tau = -(K-1) .. T-1, y in float64 and the
 * new state (last K-1 entries of h) as floats. */
static void ref_conv(double *y, float *st_out, const float *st_in,
                     const float *x, const float *w, int T, int C, int K)
{
    int S = K - 1;
    for (int c = 0; c < C; c++) {
        for (int t = 0; t < T; t++) {
            double acc = 0.0;
            for (int j = 0; j < K; j++) {
                int tau = t - S + j;
                double in = tau < 0 ? st_in[(size_t)c * S + S + tau]
                                    : x[(size_t)tau * C + c];
                acc += (double)w[(size_t)c * K + j] * in;
            }
            y[(size_t)t * C + c] = acc / (1.0 + exp(-acc));
        }
        for (int i = 0; i < S; i++) {
            int tau = T - S + i;
            st_out[(size_t)c * S + i] = tau < 0 ? st_in[(size_t)c * S + S + tau]
                                                : x[(size_t)tau * C + c];
        }
    }
}

static void check(int T, int C, int K, int zero_state)
{
    int S = K - 1;
    float *x = frand((size_t)T * C), *w = frand((size_t)C * K);
    float *st = frand((size_t)C * S), *st_ref = frand((size_t)C * S);
    if (zero_state)
        memset(st, 0, (size_t)C * S * sizeof(float));
    float *y = malloc(((size_t)T * C + 1) * sizeof(float));
    double *ref = malloc(((size_t)T * C + 1) * sizeof(double));
    for (size_t i = 0; i < (size_t)T * C; i++)
        y[i] = NAN;
    ref_conv(ref, st_ref, st, x, w, T, C, K);
    hk_conv1d_silu(y, st, x, w, T, C, K);
    close_d(ref, y, (size_t)T * C, ATOL, RTOL, "conv T=%d C=%d K=%d %s state",
            T, C, K, zero_state ? "zero" : "random");
    ok(memcmp(st, st_ref, (size_t)C * S * sizeof(float)) == 0,
       "conv T=%d C=%d K=%d: new state is the last K-1 raw inputs", T, C, K);
    free(x);
    free(w);
    free(st);
    free(st_ref);
    free(y);
    free(ref);
}

/* One call over T tokens versus calls over the pieces cuts[] with the state
 * carried: same y, same final state. */
static void check_split(int T, int C, int K, const int *cuts, int ncut,
                        const char *name)
{
    int S = K - 1;
    size_t n = (size_t)T * C;
    float *x = frand(n), *w = frand((size_t)C * K), *st0 = frand((size_t)C * S);
    float *st1 = malloc(((size_t)C * S + 1) * sizeof(float));
    float *st2 = malloc(((size_t)C * S + 1) * sizeof(float));
    float *y1 = malloc(n * sizeof(float)), *y2 = malloc(n * sizeof(float));
    memcpy(st1, st0, (size_t)C * S * sizeof(float));
    memcpy(st2, st0, (size_t)C * S * sizeof(float));
    hk_conv1d_silu(y1, st1, x, w, T, C, K);
    int t0 = 0;
    for (int i = 0; i <= ncut; i++) {
        int t1 = i < ncut ? cuts[i] : T;
        hk_conv1d_silu(y2 + (size_t)t0 * C, st2, x + (size_t)t0 * C, w, t1 - t0,
                       C, K);
        t0 = t1;
    }
    close_f(y1, y2, n, SPLIT_ATOL, SPLIT_RTOL,
            "conv split %s (T=%d C=%d K=%d): same y as one call", name, T, C,
            K);
    ok(memcmp(st1, st2, (size_t)C * S * sizeof(float)) == 0,
       "conv split %s: same final state as one call", name);
    free(x);
    free(w);
    free(st0);
    free(st1);
    free(st2);
    free(y1);
    free(y2);
}

int main(void)
{
    check(1, 1, 4, 1);
    check(7, 37, 4, 1);
    check(7, 37, 4, 0);
    check(2, 37, 4, 0); /* T < K-1: state shifts, keeps an old input */
    check(3, 37, 4, 0); /* T = K-1 */
    check(1, 300, 4, 0);
    check(9, 5, 1, 0); /* K = 1: no state */
    check(11, 19, 6, 0);
    check(64, 1000, 4, 0); /* OpenMP path, partial last channel block */

    {
        int cuts[] = {9};
        check_split(23, 37, 4, cuts, 1, "9+14");
    }
    {
        int cuts[] = {1, 2, 4};
        check_split(23, 37, 4, cuts, 3, "1+1+2+19 (pieces < K-1)");
    }
    {
        int cuts[] = {0, 5, 5};
        check_split(12, 300, 4, cuts, 3, "empty pieces");
    }
    {
        int cuts[40];
        for (int i = 0; i < 39; i++)
            cuts[i] = i + 1;
        check_split(40, 513, 4, cuts, 39, "token by token (decode)");
    }
    {
        int cuts[] = {100};
        check_split(160, 1024, 4, cuts, 1, "100+60 OpenMP path");
    }
    return tap_done();
}
