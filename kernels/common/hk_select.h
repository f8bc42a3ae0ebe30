/*
 * hk_select.h - the selection order and the sampler's probabilities,
 * written once for the CPU kernels and their CUDA twins (hk_moe, hk_sample):
 * MoE top-k, argmax and the sampler's candidates all rank by value
 * descending, then index ascending.
 */
#ifndef HK_SELECT_H
#define HK_SELECT_H

#include <math.h>

#include "kernels/common/hk_math.h" /* HK_HOSTDEV */

/* Does (va, a) rank before (vb, b)? An index < 0 is "none", last of all. */
static inline HK_HOSTDEV int hk_sel_before(float va, int a, float vb, int b)
{
    if (a < 0)
        return 0;
    if (b < 0)
        return 1;
    return va > vb || (va == vb && a < b);
}

/* The engine sampler's probability of a logit l, given mx, the largest of
 * all, and z, the double sum over all V of (float)exp((logit - mx) inv_t):
 * (float)(e / z). */
static inline HK_HOSTDEV float hk_sel_prob(float l, float mx, double z,
                                           double inv_t)
{
    return (float)((float)exp((l - mx) * inv_t) / z);
}

/* Orders k probabilities as the sampler sorts, by p then index. Distinct
 * logits may round to equal p, and only adjacent entries can, so an
 * insertion sort is enough (O(k) on logits already in rank order). */
static inline HK_HOSTDEV void hk_sel_order(float *p, int *idx, int k)
{
    for (int j = 1; j < k; j++)
        for (int m = j;
             m > 0 && hk_sel_before(p[m], idx[m], p[m - 1], idx[m - 1]); m--) {
            const float tp = p[m];
            const int ti = idx[m];
            p[m] = p[m - 1];
            idx[m] = idx[m - 1];
            p[m - 1] = tp;
            idx[m - 1] = ti;
        }
}

/* p[k] holds the k largest logits in rank order: turns them into the
 * sampler's probabilities (hk_sel_prob) in its order (hk_sel_order). */
static inline HK_HOSTDEV void hk_sel_probs(float *p, int *idx, int k, float mx,
                                           double z, double inv_t)
{
    for (int j = 0; j < k; j++)
        p[j] = hk_sel_prob(p[j], mx, z, inv_t);
    hk_sel_order(p, idx, k);
}

#endif
