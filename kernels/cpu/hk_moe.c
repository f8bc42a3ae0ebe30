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
 *
 * Dispatch (hk_moe_plan, gather, scatter, combine): the routed pairs are
 * sorted by expert once (a counting sort, stable in token order), so each
 * expert runs as one dense MLP over a contiguous slice of gathered rows.
 */
#include <assert.h>
#include <math.h>
#include <string.h>

#include "kernels/common/hk_select.h"
#include "kernels/cpu/hk_cpu.h"

/* Does expert a come before expert b in (logit desc, index asc) order? */
static int hk_moe_before(const float *l, int a, int b)
{
    return hk_sel_before(l[a], a, l[b], b);
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

void hk_moe_plan(int *offs,      // [E + 1]
                 int *rows,      // [T * k]
                 float *scale,   // [T * k]
                 int *slot,      // [T * k]
                 const int *idx, // [T, k]
                 const float *w, // [T, k]
                 int T, int k, int E)
{
    const size_t n = (size_t)T * k;
    memset(offs, 0, (size_t)(E + 1) * sizeof(int));
    for (size_t i = 0; i < n; i++) {
        assert(idx[i] >= 0 && idx[i] < E);
        offs[idx[i] + 1]++;
    }
    for (int e = 0; e < E; e++)
        offs[e + 1] += offs[e];
    /* Filling in (t, j) order keeps each expert's tokens ascending; offs[e]
     * is used as expert e's cursor, then restored from its neighbour. */
    for (size_t i = 0; i < n; i++) {
        const int s = offs[idx[i]]++;
        rows[s] = (int)(i / (size_t)k);
        scale[s] = w[i];
        slot[i] = s;
    }
    for (int e = E; e > 0; e--)
        offs[e] = offs[e - 1];
    offs[0] = 0;
}

void hk_moe_gather(float *xg,       // [n, H]
                   const float *y,  // [*, H]
                   const int *rows, // [n]
                   int n, int H)
{
    for (int i = 0; i < n; i++)
        memcpy(xg + (size_t)i * H, y + (size_t)rows[i] * H,
               (size_t)H * sizeof(float));
}

void hk_moe_scatter(float *x,        // [*, H]
                    const float *eo, // [n, H]
                    const int *rows, // [n], distinct
                    int n, int H)
{
    for (int i = 0; i < n; i++) {
        float *dst = x + (size_t)rows[i] * H;
        const float *src = eo + (size_t)i * H;
        for (int h = 0; h < H; h++)
            dst[h] += src[h];
    }
}

void hk_moe_combine(float *x,        // [T, H]
                    const float *eo, // [T * k, H] by slot
                    const int *slot, // [T, k]
                    int T, int k, int H)
{
    for (int t = 0; t < T; t++) {
        float *dst = x + (size_t)t * H;
        for (int j = 0; j < k; j++) {
            const float *src = eo + (size_t)slot[(size_t)t * k + j] * H;
            for (int h = 0; h < H; h++)
                dst[h] += src[h];
        }
    }
}
