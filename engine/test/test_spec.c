/*
 * test_spec.c - prompt-lookup drafting and the acceptance rules
 * (engine/forward/spec.c): lookup cases; greedy speculative decoding of a toy
 * deterministic model gives exactly plain greedy's tokens (lookup drafts
 * and random drafts); the sampled rule's emitted tokens follow the target
 * distribution (chi-square over many seeds, first token and second token
 * given the first draft accepted), with a wrong rule as negative control;
 * temperature 0 makes the sampled rule the greedy one.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "engine/forward/sampler.h"
#include "engine/forward/spec.h"
#include "t/lib/tap.h"

/* Chi-square tests reject at alpha = 1e-4 (z = 3.719): with the fixed
 * seeds below a false failure would need a 1-in-10^4 draw, while the wrong
 * rule (negative control) lands hundreds of sigma away at N = 40000. */
#define CHI_Z    3.719
#define N_TRIALS 40000

/* ---- lookup -------------------------------------------------------------- */

static int same(const int *a, const int *b, int n)
{
    return !memcmp(a, b, (size_t)n * sizeof(int));
}

static void test_lookup(void)
{
    int d[8];
    const int c1[] = {1, 2, 3, 4, 5, 1, 2, 3};
    int n = hp_spec_lookup(d, 4, c1, 8, 3, 1);
    ok(n == 4 && same(d, (int[]){4, 5, 1, 2}, 4),
       "3-gram suffix found, up to max_draft tokens that followed");
    const int c2[] = {7, 1, 2, 9, 1, 2, 8, 1, 2};
    n = hp_spec_lookup(d, 5, c2, 9, 3, 1);
    ok(n == 3 && same(d, (int[]){8, 1, 2}, 3),
       "most recent earlier occurrence wins; draft stops at the context end");
    const int c3[] = {5, 6, 7, 8, 6};
    n = hp_spec_lookup(d, 5, c3, 5, 3, 1);
    ok(n == 3 && same(d, (int[]){7, 8, 6}, 3), "falls back to a 1-gram");
    const int c4[] = {1, 2, 3, 4};
    ok(hp_spec_lookup(d, 5, c4, 4, 3, 1) == 0 &&
           hp_spec_lookup(d, 5, c4, 1, 3, 1) == 0 &&
           hp_spec_lookup(d, 5, c4, 0, 3, 1) == 0,
       "no earlier occurrence (or no context): no draft");
    const int c5[] = {3, 3, 3, 3};
    n = hp_spec_lookup(d, 5, c5, 4, 3, 1);
    ok(n == 1 && d[0] == 3, "overlapping occurrence: 3-gram at 0 -> [3]");
}

/* ---- a toy deterministic model ------------------------------------------- */

enum { V = 23 };

/* Logits after ctx[0..n): a function of the last two tokens, with a mild
 * preference for continuing a cycle so that lookups often hit; distinct
 * values (no ties). */
static void toy_logits(float *l, const int *ctx, int n)
{
    int a = n > 0 ? ctx[n - 1] : 0, b = n > 1 ? ctx[n - 2] : 0;
    uint64_t h = (uint64_t)(a * 131 + b * 7 + 1) * 0x9E3779B97F4A7C15ull;
    for (int i = 0; i < V; i++) {
        h ^= h >> 29;
        h *= 0xBF58476D1CE4E5B9ull;
        l[i] = (float)((h >> 40) & 0xFFFF) / 65536.0f + 0.001f * i;
    }
    l[(a + 3) % V] += (a % 4 == 0) ? 0.4f : 1.5f;
}

static int plain_greedy(int *out, const int *prompt, int P, int N)
{
    int ctx[1024];
    float l[V];
    memcpy(ctx, prompt, (size_t)P * sizeof(int));
    for (int i = 0; i < N; i++) {
        toy_logits(l, ctx, P + i);
        ctx[P + i] = out[i] = hp_argmax(l, V);
    }
    return N;
}

/* Speculative greedy: draft (lookup, or random when rnd != NULL),
 * "verify" by computing all n+1 rows, accept, append. Returns steps. */
static int spec_greedy(int *out, const int *prompt, int P, int N, uint64_t *rnd,
                       int *accepted)
{
    int ctx[1024 + 16], d[8], steps = 0, len = P, m, next;
    float rows[9 * V];
    memcpy(ctx, prompt, (size_t)P * sizeof(int));
    *accepted = 0;
    while (len < P + N) {
        int n;
        if (rnd) {
            /* Half the drafts follow the model, half are noise. */
            *rnd = *rnd * 6364136223846793005ull + 1442695040888963407ull;
            n = (int)((*rnd >> 40) % 6);
            for (int j = 0; j < n; j++) {
                *rnd = *rnd * 6364136223846793005ull + 1442695040888963407ull;
                memcpy(ctx + len, d, (size_t)j * sizeof(int));
                toy_logits(rows, ctx, len + j);
                d[j] =
                    (*rnd >> 63) ? hp_argmax(rows, V) : (int)((*rnd >> 33) % V);
            }
        } else {
            n = hp_spec_lookup(d, 6, ctx, len, 3, 1);
        }
        for (int j = 0; j <= n; j++) {
            memcpy(ctx + len, d, (size_t)j * sizeof(int));
            toy_logits(rows + (size_t)j * V, ctx, len + j);
        }
        m = hp_spec_accept_greedy(rows, V, d, n, &next);
        memcpy(ctx + len, d, (size_t)m * sizeof(int));
        ctx[len + m] = next;
        len += m + 1;
        *accepted += m;
        steps++;
    }
    memcpy(out, ctx + P, (size_t)N * sizeof(int));
    return steps;
}

static void test_greedy_exact(void)
{
    const int prompt[] = {1, 5, 9, 2, 6};
    int ref[400], got[400], acc;
    plain_greedy(ref, prompt, 5, 400);
    int steps = spec_greedy(got, prompt, 5, 400, NULL, &acc);
    ok(same(ref, got, 400),
       "greedy with lookup drafts = plain greedy (400 tokens in %d steps, "
       "%d drafts accepted)",
       steps, acc);
    uint64_t seed = 12345;
    steps = spec_greedy(got, prompt, 5, 400, &seed, &acc);
    ok(same(ref, got, 400),
       "greedy with random drafts = plain greedy (%d steps, %d accepted)",
       steps, acc);
}

/* ---- sampled acceptance -------------------------------------------------- */

static double chi_crit(int df)
{
    double a = 2.0 / (9.0 * df);
    double c = 1.0 - a + CHI_Z * sqrt(a);
    return df * c * c * c;
}

/* Chi-square of counts[V] (total n) against p[V]; counts where p = 0 make
 * it infinite. *df gets (support - 1). */
static double chi2(const long *counts, const float *p, long n, int *df)
{
    double x = 0.0;
    int k = 0;
    for (int i = 0; i < V; i++) {
        if (p[i] <= 0.0f) {
            if (counts[i])
                return INFINITY;
            continue;
        }
        double e = (double)n * p[i];
        x += (counts[i] - e) * (counts[i] - e) / e;
        k++;
    }
    *df = k - 1;
    return x;
}

/* The wrong rule for the negative control: on rejection, redraw from the
 * full target p (x not removed). Biased towards x. */
static int wrong_accept(hp_sampler_t *s, float *prob, const float *logits,
                        const int *draft, const hp_sampling_t *sp,
                        hp_rng_t *rng, int *next)
{
    hp_sampler_probs(s, prob, logits, sp);
    if (hp_rng_uniform(rng) < prob[draft[0]])
        return 1;
    double u = hp_rng_uniform(rng), cum = 0.0;
    *next = V - 1;
    for (int i = 0; i < V; i++) {
        cum += prob[i];
        if (u < cum && prob[i] > 0.0f) {
            *next = i;
            break;
        }
    }
    return 0;
}

static void test_sampled(void)
{
    hp_sampler_t s;
    hp_sampler_init(&s, V);
    float logits[3 * V], p0[V], p1[V], prob[V];
    hp_rng_t g;
    hp_rng_seed(&g, 99);
    for (int i = 0; i < 3 * V; i++)
        logits[i] = (float)(3.0 * hp_rng_uniform(&g));
    const hp_sampling_t sp = {0.8f, 8, 0.97f, 0};
    hp_sampler_probs(&s, p0, logits, &sp);
    hp_sampler_probs(&s, p1, logits + V, &sp);
    int top = 0, mid = -1, zero = -1;
    for (int i = 0; i < V; i++) {
        if (p0[i] > p0[top])
            top = i;
        if (p0[i] == 0.0f && zero < 0)
            zero = i;
    }
    for (int i = 0; i < V; i++)
        if (i != top && p0[i] > 0.0f && (mid < 0 || p0[i] < p0[mid]))
            mid = i;
    const int xs[3] = {top, mid, zero};
    const char *names[3] = {"most likely", "least likely kept", "filtered out"};
    for (int c = 0; c < 3; c++) {
        long cnt[V] = {0}, cnt2[V] = {0}, n2 = 0;
        int draft[2] = {xs[c], top};
        for (long t = 0; t < N_TRIALS; t++) {
            hp_rng_t r;
            hp_rng_seed(&r, 1000003ull * (c + 1) + (uint64_t)t);
            int next, m = hp_spec_accept_sampled(&s, prob, logits, draft, 2,
                                                 &sp, &r, &next);
            cnt[m >= 1 ? draft[0] : next]++;
            if (m >= 1) {
                cnt2[m >= 2 ? draft[1] : next]++;
                n2++;
            }
        }
        int df, df2;
        double x = chi2(cnt, p0, N_TRIALS, &df);
        ok(x <= chi_crit(df),
           "draft %s (p %.3f): first token ~ target (chi2 %.1f, df %d, "
           "crit %.1f)",
           names[c], p0[xs[c]], x, df, chi_crit(df));
        if (n2 > 1000) {
            double x2 = chi2(cnt2, p1, n2, &df2);
            ok(x2 <= chi_crit(df2),
               "  second token given the first accepted ~ target (chi2 "
               "%.1f, df %d, n %ld)",
               x2, df2, n2);
        }
    }

    /* Negative control: the wrong residual is detected. */
    long cnt[V] = {0};
    int draft[1] = {top};
    for (long t = 0; t < N_TRIALS; t++) {
        hp_rng_t r;
        hp_rng_seed(&r, 777 + (uint64_t)t);
        int next = 0;
        int m = wrong_accept(&s, prob, logits, draft, &sp, &r, &next);
        cnt[m ? top : next]++;
    }
    int df;
    double x = chi2(cnt, p0, N_TRIALS, &df);
    ok(x > chi_crit(df), "a rule without the residual fails (chi2 %.0f)", x);

    /* Temperature 0: the sampled rule is the greedy one. */
    const hp_sampling_t gp = {0.0f, 0, 1.0f, 0};
    int agree = 1;
    for (int t = 0; t < 2000; t++) {
        hp_rng_t r;
        hp_rng_seed(&r, (uint64_t)t);
        float rows[4 * V];
        int d[3];
        for (int i = 0; i < 4 * V; i++)
            rows[i] = (float)hp_rng_uniform(&r);
        for (int j = 0; j < 3; j++)
            d[j] = hp_rng_uniform(&r) < 0.6 ? hp_argmax(rows + j * V, V)
                                            : (int)(hp_rng_uniform(&r) * V);
        int n1, n2, m1 = hp_spec_accept_greedy(rows, V, d, 3, &n1);
        int m2 = hp_spec_accept_sampled(&s, prob, rows, d, 3, &gp, &r, &n2);
        agree &= m1 == m2 && n1 == n2;
    }
    ok(agree, "temperature 0: sampled acceptance = greedy acceptance");
    hp_sampler_free(&s);
}

int main(void)
{
    test_lookup();
    test_greedy_exact();
    test_sampled();
    return tap_done();
}
