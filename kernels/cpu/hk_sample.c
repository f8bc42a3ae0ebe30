/*
 * hk_sample.c - next-token helpers: argmax, the sampler's top-k
 * candidates, and the draw from them (twins: kernels/cuda/hk_sample.cu).
 *
 * The engine sampler (engine/forward/sampler.c) forms, for temperature
 * 1/inv_t, e_i = (float)exp((l_i - max) * inv_t), z = sum e_i in double,
 * p_i = (float)(e_i / z), sorts by (p desc, index asc), keeps the top_k
 * first, then the shortest head reaching top_p, renormalizes in double and
 * draws. hk_topk forms the same p for the k largest logits only; since p
 * does not increase as the logit falls, the first k of the sampler's order
 * are these k, except where equal p straddle the k-th place. So a device
 * sends k (p, index) pairs instead of V logits, and hk_sample_topk applies
 * the sampler's filters to them.
 */
#include <assert.h>
#include <math.h>

#include "kernels/common/hk_select.h"
#include "kernels/cpu/hk_cpu.h"

int hk_argmax(const float *x, int n)
{
    int best = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[best])
            best = i;
    return best;
}

double hk_lse(const float *x, int n, int a)
{
    double sum = 1.0; /* x[a]'s own term */
    for (int i = 0; i < n; i++)
        if (i != a)
            sum += exp((double)x[i] - x[a]);
    return x[a] + log(sum);
}

void hk_topk(float *p,            // [k]
             int *idx,            // [k]
             float *raw,          // [k] or NULL
             double *lse,         // [1] or NULL
             const float *logits, // [V]
             int V, int k, double inv_t)
{
    assert(k >= 1 && k <= V);
    const int a = hk_argmax(logits, V);
    const float mx = logits[a];
    double z = 0.0;
    for (int i = 0; i < V; i++)
        z += (float)exp((logits[i] - mx) * inv_t);
    /* Insertion into a sorted list of k: O(V k) worst case, O(V) typical. */
    int n = 0;
    for (int i = 0; i < V; i++) {
        if (n == k && !hk_sel_before(logits[i], i, p[k - 1], idx[k - 1]))
            continue;
        int j = n < k ? n++ : k - 1;
        for (; j > 0 && hk_sel_before(logits[i], i, p[j - 1], idx[j - 1]);
             j--) {
            p[j] = p[j - 1];
            idx[j] = idx[j - 1];
        }
        p[j] = logits[i];
        idx[j] = i;
    }
    hk_sel_probs(p, idx, k, mx, z, inv_t);
    for (int j = 0; raw && j < k; j++)
        raw[j] = logits[idx[j]];
    if (lse)
        *lse = hk_lse(logits, V, a);
}

/* The sampler's sum of all V probabilities, sum (float)(e_i / z) in
 * double, is 1 within this: each term is rounded to float (2^-24
 * relative), the double sums and the division add about 2 V 2^-53,
 * which 2^-24 more covers for any V below 2^28. */
#define HK_SAMPLE_TOTAL_SLACK 0x1p-23

int hk_sample_topk(const float *p, const int *idx, int k, int V, int top_k,
                   float top_p, double u)
{
    assert(k >= 1 && k <= V);
    const int lim = top_k > 0 && top_k < V ? top_k : V; /* top-k's kept */
    const int nucleus = top_p > 0.0f && top_p < 1.0f;
    const int n = lim < k ? lim : k; /* the kept that the list holds */
    /* the nucleus walk, in the sampler's order and arithmetic: its sum is
     * the sampler's normalizer wherever the kept set ends in the list */
    double z = 0.0;
    int keep = 0;
    while (keep < n) {
        z += p[keep++];
        if (nucleus && z >= top_p)
            break;
    }
    double zlo = z, zhi = z;
    const int exact = (nucleus && z >= top_p) || lim <= k;
    if (!exact) {
        /* The kept set runs past the list: its normalizer is at least the
         * list's sum, at most the list's sum plus the rest of top-k at
         * p[k - 1] each, or the last head below top_p plus one more, or
         * the whole vocabulary's; with no filter it is the whole. */
        const double slack = 1.0 + (double)lim * 0x1p-52;
        const double rest = (z + (double)(lim - k) * p[k - 1]) * slack;
        const double head = ((double)top_p + p[k - 1]) * slack;
        zhi = fmin(1.0 + HK_SAMPLE_TOTAL_SLACK, rest);
        if (nucleus)
            zhi = fmin(zhi, head);
        if (lim == V) {
            const double whole = 1.0 - HK_SAMPLE_TOTAL_SLACK;
            const double least = nucleus && top_p < whole ? top_p : whole;
            if (least > zlo)
                zlo = least;
        }
        if (zhi < zlo)
            zhi = zlo;
    }
    /* The sampler's cumulative probability falls as its normalizer grows,
     * so lo and hi bound it over [zlo, zhi]: the draw is decided where u
     * is below the first lo it reaches and not below the previous hi. */
    double lo = 0.0, hi = 0.0;
    for (int i = 0; i < keep; i++) {
        const double was = hi;
        lo += (float)(p[i] / zhi);
        hi += (float)(p[i] / zlo);
        if (u < lo)
            return u >= was ? idx[i] : -1;
    }
    return exact ? idx[keep - 1] : -1;
}
