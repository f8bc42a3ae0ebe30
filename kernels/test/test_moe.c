/*
 * test_moe.c - hk_moe_route against a float64 reference (softmax over all
 * E, stable sort by probability, ties to the lower index, optional
 * renormalization): random logits, exact ties, k = 1 and k = E, large
 * logits (max subtraction), Qwen3-Next sizes (E = 512, k = 10).
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
    return tap_done();
}
