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

int hk_sample_topk(const float *p, const int *idx, int k, int V, int top_k,
                   float top_p, double u)
{
    assert(k >= 1 && k <= V);
    int n = V;
    if (top_k > 0 && top_k < n)
        n = top_k;
    const int complete = n <= k; /* the kept set lies within the list */
    n = n < k ? n : k;
    if (top_p > 0.0f && top_p < 1.0f) {
        double cum = 0.0;
        int keep = 0;
        while (keep < n) {
            cum += p[keep];
            keep++;
            if (cum >= top_p)
                break;
        }
        if (cum < top_p && !complete)
            return -1;
        n = keep;
    } else if (!complete) {
        return -1;
    }
    double z = 0.0;
    for (int i = 0; i < n; i++)
        z += p[i];
    double cum = 0.0;
    for (int i = 0; i < n; i++) {
        cum += (float)(p[i] / z);
        if (u < cum)
            return idx[i];
    }
    return idx[n - 1];
}
