/*
 * hk_moe.c - sparse-MoE router: softmax over all experts, top-k, optional
 * renormalization of the k weights.
 *
 *   p = softmax(logits) over E;  idx = top-k of p;  w = p[idx]
 *   renorm: w <- w / sum(w)
 *
 * Layouts: logits [E], idx [k] (descending weight), w [k]. Reference: HF
 * Qwen3NextSparseMoeBlock / Qwen3NextTopKRouter (softmax in float32, then
 * torch.topk, then divide by the sum when norm_topk_prob); spec §5.4.
 *
 * Order: softmax is strictly increasing in the logit, so selecting on the
 * logits picks the same experts as selecting on p, without a [E] buffer of
 * probabilities; equal logits give equal p, and ties go to the lower index.
 * (Distinct logits that round to the same float p keep their exact order.)
 * The normalizer is summed in double so it does not depend on E's size.
 */
#include <assert.h>
#include <math.h>

#include "kernels/cpu/hk_cpu.h"

/* Does expert a come before expert b in (logit desc, index asc) order? */
static int hk_moe_before(const float *l, int a, int b)
{
    const float la = l[a], lb = l[b];
    return la > lb || (la == lb && a < b);
}

void hk_moe_route(int *idx,            // [k]
                  float *w,            // [k]
                  const float *logits, // [E]
                  int E, int k, int renorm)
{
    assert(E > 0 && k > 0 && k <= E);
    float mx = logits[0];
    for (int e = 1; e < E; e++)
        mx = logits[e] > mx ? logits[e] : mx;
    double sum = 0.0;
    for (int e = 0; e < E; e++)
        sum += (double)expf(logits[e] - mx);

    /* k passes: the first expert (in order) after the previous pick. O(kE),
     * k ~ 10, and needs no scratch. */
    for (int i = 0; i < k; i++) {
        int best = -1;
        for (int e = 0; e < E; e++) {
            if (i > 0 && !hk_moe_before(logits, idx[i - 1], e))
                continue;
            if (best < 0 || hk_moe_before(logits, e, best))
                best = e;
        }
        assert(best >= 0);
        idx[i] = best;
        w[i] = (float)((double)expf(logits[best] - mx) / sum);
    }
    if (renorm) {
        double ws = 0.0;
        for (int i = 0; i < k; i++)
            ws += w[i];
        for (int i = 0; i < k; i++)
            w[i] = (float)(w[i] / ws);
    }
}
