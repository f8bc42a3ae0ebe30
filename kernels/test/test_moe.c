/*
 * test_moe.c - hk_moe_route against a float64 reference (softmax over all
 * E, stable sort by probability, ties to the lower index, optional
 * renormalization): random logits, exact ties, k = 1 and k = E, large
 * logits (max subtraction), Qwen3-Next sizes (E = 512, k = 10). The
 * dispatch (hk_moe_plan, gather, scatter, combine) against the forward
 * pass's own loop over experts and tokens.
 */
#include <stdint.h>
#include <string.h>

#include "kernels/cpu/hk_cpu.h"
#include "t/lib/tap.h"
#define TEST_RNG_SEED 0x452821e638d01377ull
#include "t/lib/testrand.h"

/* Weights are e^{l - max} (float expf, <= 1 ulp) over a double sum: ~2
 * roundings, so 5e-7 relative; renormalization adds one division. */
#define RTOL 1e-6
#define ATOL 1e-9

/* Reference: selection sort on (p desc, index asc), then weights. */
static void ref_route(int *idx, double *w, const float *l, int E, int k,
                      int renorm)
{
    double *p = malloc((size_t)E * sizeof(double));
    char *used = calloc((size_t)E, 1);
    double mx = -INFINITY, sum = 0.0, ws = 0.0;
    for (int e = 0; e < E; e++)
        mx = l[e] > mx ? l[e] : mx;
    for (int e = 0; e < E; e++)
        sum += p[e] = exp((double)l[e] - mx);
    for (int i = 0; i < k; i++) {
        int best = -1;
        for (int e = 0; e < E; e++)
            if (!used[e] && (best < 0 || p[e] > p[best]))
                best = e; /* strict >: the lower index keeps a tie */
        used[best] = 1;
        idx[i] = best;
        w[i] = p[best] / sum;
        ws += w[i];
    }
    if (renorm)
        for (int i = 0; i < k; i++)
            w[i] /= ws;
    free(p);
    free(used);
}

static void check(const char *name, const float *l, int E, int k, int renorm)
{
    int *idx = malloc((size_t)k * sizeof(int));
    int *ridx = malloc((size_t)k * sizeof(int));
    float *w = malloc((size_t)k * sizeof(float));
    double *rw = malloc((size_t)k * sizeof(double));
    ref_route(ridx, rw, l, E, k, renorm);
    hk_moe_route(idx, w, l, E, k, renorm);
    ok(memcmp(idx, ridx, (size_t)k * sizeof(int)) == 0,
       "%s (E=%d k=%d renorm=%d): experts and order", name, E, k, renorm);
    close_d(rw, w, (size_t)k, ATOL, RTOL, "%s: weights", name);
    if (renorm) {
        double s = 0.0;
        for (int i = 0; i < k; i++)
            s += w[i];
        ok(fabs(s - 1.0) <= 1e-6, "%s: renormalized weights sum to 1", name);
    }
    free(idx);
    free(ridx);
    free(w);
    free(rw);
}

/* The forward pass's loop (forward.c moe_mlp): for each expert, its
 * tokens in order; rows, weights and the slot of each (t, j). */
static void ref_plan(int *offs, int *rows, float *scale, int *slot,
                     const int *idx, const float *w, int T, int k, int E)
{
    int n = 0;
    for (int e = 0; e < E; e++) {
        offs[e] = n;
        for (int t = 0; t < T; t++)
            for (int j = 0; j < k; j++)
                if (idx[t * k + j] == e) {
                    rows[n] = t;
                    scale[n] = w[t * k + j];
                    slot[t * k + j] = n++;
                }
    }
    offs[E] = n;
}

static void check_dispatch(int T, int E, int k)
{
    const int H = 7, nk = T * k;
    float *lg = frand_amp((size_t)T * E, 3.0);
    int *idx = malloc(nk * sizeof(int)), *offs = malloc((E + 1) * sizeof(int));
    int *rows = malloc(nk * sizeof(int)), *slot = malloc(nk * sizeof(int));
    int *roffs = malloc((E + 1) * sizeof(int));
    int *rrows = malloc(nk * sizeof(int)), *rslot = malloc(nk * sizeof(int));
    float *w = malloc(nk * sizeof(float)), *scale = malloc(nk * sizeof(float));
    float *rscale = malloc(nk * sizeof(float));
    for (int t = 0; t < T; t++)
        hk_moe_route(idx + t * k, w + t * k, lg + (size_t)t * E, E, k, 1);
    hk_moe_plan(offs, rows, scale, slot, idx, w, T, k, E);
    ref_plan(roffs, rrows, rscale, rslot, idx, w, T, k, E);
    ok(!memcmp(offs, roffs, (E + 1) * sizeof(int)) &&
           !memcmp(rows, rrows, nk * sizeof(int)) &&
           !memcmp(slot, rslot, nk * sizeof(int)) &&
           !memcmp(scale, rscale, nk * sizeof(float)),
       "moe_plan T=%d E=%d k=%d: the forward loop's order", T, E, k);

    /* gather, then each expert's output added back: the scatter per
     * expert (exactly the loop's adds) and the combine (k adds per token
     * in choice order) against naive sums. */
    float *y = frand_amp((size_t)T * H, 1.0),
          *xg = malloc((size_t)nk * H * sizeof(float));
    float *eo = frand_amp((size_t)nk * H, 1.0);
    float *x = frand_amp((size_t)T * H, 1.0),
          *x2 = malloc((size_t)T * H * sizeof(float));
    float *x3 = malloc((size_t)T * H * sizeof(float));
    memcpy(x2, x, (size_t)T * H * sizeof(float));
    memcpy(x3, x, (size_t)T * H * sizeof(float));
    hk_moe_gather(xg, y, rows, nk, H);
    int good = 1;
    for (int s = 0; s < nk; s++)
        good &= !memcmp(xg + s * H, y + rows[s] * H, H * sizeof(float));
    ok(good, "moe_gather: slot s holds token rows[s]");
    for (int e = 0; e < E; e++)
        hk_moe_scatter(x2, eo + (size_t)offs[e] * H, rows + offs[e],
                       offs[e + 1] - offs[e], H);
    hk_moe_combine(x3, eo, slot, T, k, H);
    good = 1;
    int same = 1;
    for (int t = 0; t < T; t++)
        for (int h = 0; h < H; h++) {
            double ref = x[t * H + h];
            float seq = x[t * H + h];
            for (int j = 0; j < k; j++) {
                ref += eo[slot[t * k + j] * H + h];
                seq += eo[slot[t * k + j] * H + h];
            }
            good &= fabs(x2[t * H + h] - ref) <= 1e-5 * (1 + fabs(ref));
            same &= x3[t * H + h] == seq;
        }
    ok(good, "moe_scatter per expert adds every token's k outputs");
    ok(same, "moe_combine adds them in choice order");
    free(lg);
    free(idx);
    free(offs);
    free(rows);
    free(slot);
    free(roffs);
    free(rrows);
    free(rslot);
    free(w);
    free(scale);
    free(rscale);
    free(y);
    free(xg);
    free(eo);
    free(x);
    free(x2);
    free(x3);
}

int main(void)
{
    float l[512];
    for (int e = 0; e < 512; e++)
        l[e] = (float)(4.0 * urand());
    check("random", l, 8, 2, 0);
    check("random", l, 8, 2, 1);
    check("k=1", l, 8, 1, 1);
    check("k=E", l, 8, 8, 0);
    check("qwen3-next", l, 512, 10, 1);
    check("qwen3-next", l, 512, 10, 0);

    {
        float t[6] = {1.0f, 3.0f, 3.0f, 0.0f, 3.0f, 1.0f};
        int idx[3];
        float w[3];
        hk_moe_route(idx, w, t, 6, 3, 1);
        ok(idx[0] == 1 && idx[1] == 2 && idx[2] == 4,
           "three-way tie: experts 1, 2, 4 in index order");
        ok(w[0] == w[1] && w[1] == w[2], "tied experts get equal weights");
        hk_moe_route(idx, w, t, 6, 2, 0);
        ok(idx[0] == 1 && idx[1] == 2, "tie cut by k keeps the lower index");
        check("ties", t, 6, 5, 0); /* 1.0 tie between experts 0 and 5 */
    }
    {
        float t[5] = {0.5f, 0.5f, 0.5f, 0.5f, 0.5f};
        check("all equal", t, 5, 3, 1);
    }
    {
        /* exp(1000) overflows without max subtraction. */
        float t[6] = {1000.0f, 999.0f, -1000.0f, 998.5f, 1000.0f, -3.0f};
        check("large logits", t, 6, 3, 0);
        check("large logits", t, 6, 3, 1);
    }
    check_dispatch(1, 1, 1);
    check_dispatch(9, 8, 8);
    check_dispatch(13, 64, 4);
    check_dispatch(5, 512, 10);
    return tap_done();
}
