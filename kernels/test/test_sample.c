/*
 * test_sample.c - hk_argmax, hk_topk and hk_sample_topk against a naive
 * sampler written from the engine sampler's rules (sampler.h): softmax at
 * a temperature over all V (float terms, double sum), a full sort by
 * (probability desc, index asc), top-k, then the shortest head reaching
 * top-p, renormalized, and the first candidate whose cumulative
 * probability exceeds u. The top-k path must pick the same token wherever
 * its k candidates decide, and say -1 exactly where they cannot.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/hk_cpu.h"
#include "t/lib/tap.h"
#define TEST_RNG_SEED 0xa54ff53a5f1d36f1ull
#include "t/lib/testrand.h"

typedef struct {
    float p;
    int i;
} pr_t;

static int pr_desc(const void *a, const void *b)
{
    const pr_t *x = a, *y = b;
    if (x->p != y->p)
        return x->p < y->p ? 1 : -1;
    return x->i - y->i;
}

/* All V (p, index) pairs in the sampler's order. */
static pr_t *ref_sorted(const float *l, int V, double inv_t)
{
    float mx = l[0];
    for (int i = 1; i < V; i++)
        mx = l[i] > mx ? l[i] : mx;
    float *e = malloc((size_t)V * sizeof(float));
    double z = 0.0;
    for (int i = 0; i < V; i++)
        z += e[i] = (float)exp((l[i] - mx) * inv_t);
    pr_t *p = malloc((size_t)V * sizeof(pr_t));
    for (int i = 0; i < V; i++)
        p[i] = (pr_t){(float)(e[i] / z), i};
    qsort(p, V, sizeof(pr_t), pr_desc);
    free(e);
    return p;
}

static int ref_draw(const pr_t *p, int V, int top_k, float top_p, double u)
{
    int n = top_k > 0 && top_k < V ? top_k : V;
    if (top_p > 0.0f && top_p < 1.0f) {
        double cum = 0.0;
        int keep = 0;
        while (keep < n) {
            cum += p[keep++].p;
            if (cum >= top_p)
                break;
        }
        n = keep;
    }
    double z = 0.0, cum = 0.0;
    for (int i = 0; i < n; i++)
        z += p[i].p;
    for (int i = 0; i < n; i++) {
        cum += (float)(p[i].p / z);
        if (u < cum)
            return p[i].i;
    }
    return p[n - 1].i;
}

static void test_argmax(void)
{
    const float x[7] = {-5.0f, 2.0f, -1.0f, 2.0f, 1.5f, -7.0f, 2.0f};
    const float neg[3] = {-3.0f, -2.0f, -2.5f};
    ok(hk_argmax(x, 7) == 1 && hk_argmax(x + 2, 5) == 1 &&
           hk_argmax(neg, 3) == 1 && hk_argmax(x, 1) == 0,
       "argmax: the lowest index among equal maxima; negative values");
}

static void test_topk(const char *name, const float *l, int V, int k,
                      double inv_t)
{
    pr_t *ref = ref_sorted(l, V, inv_t);
    float *p = malloc((size_t)k * sizeof(float));
    float *raw = malloc((size_t)k * sizeof(float));
    int *idx = malloc((size_t)k * sizeof(int));
    double lse;
    hk_topk(p, idx, raw, &lse, l, V, k, inv_t);
    int good = 1;
    for (int j = 0; j < k; j++)
        good &= idx[j] == ref[j].i && p[j] == ref[j].p && raw[j] == l[idx[j]];
    /* the log-sum-exp with its terms in another order (backwards): the
     * same to the double sum's rounding */
    const int a = hk_argmax(l, V);
    const float mx = l[a];
    double sum = 1.0;
    for (int i = V - 1; i >= 0; i--)
        if (i != a)
            sum += exp((double)l[i] - mx);
    const double want = mx + log(sum);
    ok(good && fabs(lse - want) <= 1e-12 * (1.0 + fabs(want)),
       "topk %s V=%d k=%d inv_t=%.3g: the sampler's first k, same p, their "
       "raw logits, the log-sum-exp (%.17g, naively %.17g)",
       name, V, k, inv_t, lse, want);
    free(ref);
    free(p);
    free(raw);
    free(idx);
}

/* Over a grid of filters and draws: the same token wherever the k
 * candidates decide; -1 only where the kept set reaches past them. */
static void test_draw(const float *l, int V, int k, double inv_t)
{
    static const int top_ks[] = {0, 1, 5, 40, 100};
    static const float top_ps[] = {1.0f, 0.95f, 0.5f, 0.0f};
    pr_t *ref = ref_sorted(l, V, inv_t);
    float *p = malloc((size_t)k * sizeof(float));
    int *idx = malloc((size_t)k * sizeof(int));
    hk_topk(p, idx, NULL, NULL, l, V, k, inv_t);
    int agree = 1, undecided = 0, decided = 0;
    for (size_t a = 0; a < sizeof(top_ks) / sizeof(top_ks[0]); a++)
        for (size_t b = 0; b < sizeof(top_ps) / sizeof(top_ps[0]); b++)
            for (int d = 0; d < 50; d++) {
                const double u = (d + 0.5) / 50.0;
                const int tk = top_ks[a];
                const float tp = top_ps[b];
                const int got = hk_sample_topk(p, idx, k, V, tk, tp, u);
                const int want = ref_draw(ref, V, tk, tp, u);
                /* the reference's kept count: does it fit in k? */
                int n = tk > 0 && tk < V ? tk : V;
                if (tp > 0.0f && tp < 1.0f) {
                    double cum = 0.0;
                    int keep = 0;
                    while (keep < n && cum < tp)
                        cum += ref[keep++].p;
                    n = keep;
                }
                if (got < 0) {
                    undecided++;
                    agree &= n > k;
                } else {
                    decided++;
                    agree &= got == want;
                }
            }
    ok(agree && decided > 0 && (k == V || undecided > 0),
       "sample_topk V=%d k=%d inv_t=%.3g: %d draws as the full sampler, %d "
       "undecidable from k",
       V, k, inv_t, decided, undecided);
    free(ref);
    free(p);
    free(idx);
}

int main(void)
{
    test_argmax();
    const int V = 3000;
    float *l = frand_amp(V, 6.0);
    test_topk("random", l, V, 1, 1.0);
    test_topk("random", l, V, 50, 1.0 / 0.7);
    test_topk("random", l, V, V, 1.0 / 1.5);
    float *ties = malloc(200 * sizeof(float));
    for (int i = 0; i < 200; i++)
        ties[i] = (float)((i * 7) % 5);
    test_topk("ties", ties, 200, 30, 1.0);
    test_topk("ties", ties, 200, 200, 2.0);
    test_draw(l, V, 40, 1.0);
    test_draw(l, V, 40, 1.0 / 0.3);
    test_draw(ties, 200, 40, 1.0);
    test_draw(ties, 200, 200, 1.0 / 0.7);
    free(l);
    free(ties);
    return tap_done();
}
