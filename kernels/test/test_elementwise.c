/*
 * test_elementwise.c - the forward pass's small steps as kernels
 * (hk_elementwise.c, and hk_gdn_gates in hk_gdn.c) against naive
 * references: element-by-element index arithmetic for the copies (which
 * must be exact), float64 for the gates and products.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/hk_cpu.h"
#include "t/lib/tap.h"
#define TEST_RNG_SEED 0x3c6ef372fe94f82bull
#include "t/lib/testrand.h"

/* sigmoid / softplus in f32 (expf, log1pf: <= 2 ulp each, then a division
 * or product): a few 1e-7 relative of float64. */
#define RTOL_EW 2e-6
#define ATOL_EW 1e-9

static double sigmoid_d(double x)
{
    return 1.0 / (1.0 + exp(-x));
}

static void test_split(int rows, int da, int db, int dc)
{
    const int ld = da + db + dc;
    float *x = frand_amp((size_t)rows * ld, 1.0);
    float *a = malloc((size_t)rows * da * sizeof(float));
    float *b = malloc((size_t)rows * db * sizeof(float));
    float *c = dc ? malloc((size_t)rows * dc * sizeof(float)) : NULL;
    hk_split_heads(a, b, c, x, rows, da, db, dc);
    int good = 1;
    for (int r = 0; r < rows; r++)
        for (int i = 0; i < ld; i++) {
            const float want = x[(size_t)r * ld + i];
            const float got = i < da        ? a[(size_t)r * da + i]
                              : i < da + db ? b[(size_t)r * db + i - da]
                                            : c[(size_t)r * dc + i - da - db];
            good &= got == want;
        }
    ok(good, "split_heads rows=%d %d|%d|%d: every element in place", rows, da,
       db, dc);
    free(x);
    free(a);
    free(b);
    free(c);
}

static void test_gate_scale(void)
{
    const int rows = 9, dim = 37;
    const size_t n = (size_t)rows * dim;
    float *o = frand_amp(n, 2.0), *g = frand_amp(n, 15.0);
    float *s = frand_amp(rows, 4.0), *y = malloc(n * sizeof(float));
    memcpy(y, o, n * sizeof(float));
    hk_gate_mul(y, g, n);
    double worst = 0.0;
    for (size_t i = 0; i < n; i++) {
        const double ref = o[i] * sigmoid_d(g[i]);
        const double r = fabs(y[i] - ref) / (ATOL_EW + RTOL_EW * fabs(ref));
        worst = r > worst ? r : worst;
    }
    ok(worst <= 1.0, "gate_mul: o sigmoid(gate) (worst %.2g of tolerance)",
       worst);
    for (int sigm = 0; sigm < 2; sigm++) {
        memcpy(y, o, n * sizeof(float));
        hk_scale_rows(y, s, rows, dim, sigm);
        worst = 0.0;
        for (size_t i = 0; i < n; i++) {
            const double f = sigm ? sigmoid_d(s[i / dim]) : s[i / dim];
            const double ref = o[i] * f;
            const double r = fabs(y[i] - ref) / (ATOL_EW + RTOL_EW * fabs(ref));
            worst = r > worst ? r : worst;
        }
        ok(worst <= 1.0, "scale_rows%s: row r times its factor",
           sigm ? " (sigmoid)" : "");
    }
    free(o);
    free(g);
    free(s);
    free(y);
}

/* Rows stored at scattered positions; the other cache rows untouched. */
static void test_kv_store(void)
{
    const int T = 6, N = 23, kvd = 10;
    const int pos[6] = {4, 0, 22, 9, 10, 3};
    float *kc = frand_amp((size_t)N * kvd, 1.0), *vc = frand_amp(N * kvd, 1.0);
    float *k0 = malloc((size_t)N * kvd * sizeof(float));
    float *v0 = malloc((size_t)N * kvd * sizeof(float));
    memcpy(k0, kc, (size_t)N * kvd * sizeof(float));
    memcpy(v0, vc, (size_t)N * kvd * sizeof(float));
    float *k = frand_amp((size_t)T * kvd, 1.0), *v = frand_amp(T * kvd, 1.0);
    hk_kv_store(kc, vc, k, v, pos, T, kvd);
    int good = 1;
    for (int p = 0; p < N; p++) {
        int t = -1;
        for (int i = 0; i < T; i++)
            t = pos[i] == p ? i : t;
        for (int d = 0; d < kvd; d++) {
            const size_t e = (size_t)p * kvd + d;
            good &= kc[e] == (t < 0 ? k0[e] : k[(size_t)t * kvd + d]);
            good &= vc[e] == (t < 0 ? v0[e] : v[(size_t)t * kvd + d]);
        }
    }
    ok(good, "kv_store: rows at their positions, the rest unchanged");
    free(kc);
    free(vc);
    free(k0);
    free(v0);
    free(k);
    free(v);
}

/* Paged: request b's row at position pos[b] of its pages (table rows of
 * 3 pages of P = 4, pages in no order); every other arena row unchanged. */
static void test_kv_store_paged(void)
{
    enum { B = 4, P = 4, MAXP = 3, NPAGES = 13, KVD = 6 };
    const int table[B * MAXP] = {7, 2, 11, 0, 12, 5, 9, 1, 3, 4, 10, 6};
    const int pos[B] = {9, 0, 7, 4};
    const size_t n = (size_t)NPAGES * P * KVD;
    float *kp = frand_amp(n, 1.0), *vp = frand_amp(n, 1.0);
    float *k0 = malloc(n * sizeof(float)), *v0 = malloc(n * sizeof(float));
    memcpy(k0, kp, n * sizeof(float));
    memcpy(v0, vp, n * sizeof(float));
    float *k = frand_amp((size_t)B * KVD, 1.0), *v = frand_amp(B * KVD, 1.0);
    hk_kv_store_paged(kp, vp, k, v, table, MAXP, pos, B, P, KVD);
    int good = 1;
    for (size_t r = 0; r < (size_t)NPAGES * P; r++) {
        int src = -1; /* the request whose new row lands on arena row r */
        for (int b = 0; b < B; b++)
            src = (size_t)table[b * MAXP + pos[b] / P] * P + pos[b] % P == r
                      ? b
                      : src;
        for (int d = 0; d < KVD; d++) {
            const size_t e = r * KVD + d;
            good &= kp[e] == (src < 0 ? k0[e] : k[src * KVD + d]);
            good &= vp[e] == (src < 0 ? v0[e] : v[src * KVD + d]);
        }
    }
    ok(good, "kv_store_paged: rows at their pages' positions, the rest "
             "unchanged");
    free(kp);
    free(vp);
    free(k0);
    free(v0);
    free(k);
    free(v);
}

static void test_embed(void)
{
    const int T = 5, V = 11, H = 6;
    const int ids[5] = {3, 10, 0, 3, 7};
    float *table = frand_amp((size_t)V * H, 1.0);
    float x[5 * 6];
    hk_embed(x, table, ids, T, H);
    int good = 1;
    for (int t = 0; t < T; t++)
        for (int h = 0; h < H; h++)
            good &= x[t * H + h] == table[ids[t] * H + h];
    ok(good, "embed: row t is the table's row ids[t]");
    free(table);
}

/* beta = sigmoid(b); g = -e^A_log softplus(a + dt_bias), softplus(x) = x
 * above 20 (PyTorch's threshold), in place as the forward pass calls it;
 * a + dt_bias spans both sides of the threshold. */
static void test_gdn_gates(void)
{
    const int T = 7, Hv = 5;
    const size_t n = (size_t)T * Hv;
    float *a = frand_amp(n, 30.0), *b = frand_amp(n, 8.0);
    float *Al = frand_amp(Hv, 2.0), *dt = frand_amp(Hv, 3.0);
    float *a0 = malloc(n * sizeof(float)), *b0 = malloc(n * sizeof(float));
    memcpy(a0, a, n * sizeof(float));
    memcpy(b0, b, n * sizeof(float));
    hk_gdn_gates(a, b, a, b, Al, dt, T, Hv);
    double worst = 0.0;
    for (size_t e = 0; e < n; e++) {
        const int h = (int)(e % Hv);
        const double x = (double)(float)(a0[e] + dt[h]);
        const double sp = x > 20.0 ? x : log1p(exp(x));
        const double g = -exp((double)Al[h]) * sp, be = sigmoid_d(b0[e]);
        double r = fabs(a[e] - g) / (ATOL_EW + RTOL_EW * fabs(g));
        worst = r > worst ? r : worst;
        r = fabs(b[e] - be) / (ATOL_EW + RTOL_EW * fabs(be));
        worst = r > worst ? r : worst;
    }
    ok(worst <= 1.0, "gdn_gates T=%d Hv=%d in place (worst %.2g of tolerance)",
       T, Hv, worst);
    free(a);
    free(b);
    free(Al);
    free(dt);
    free(a0);
    free(b0);
}

int main(void)
{
    test_split(1, 1, 1, 0);
    test_split(12, 16, 16, 0);
    test_split(5, 32, 32, 48);
    test_gate_scale();
    test_kv_store();
    test_kv_store_paged();
    test_embed();
    test_gdn_gates();
    return tap_done();
}
