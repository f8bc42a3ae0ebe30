/*
 * test_sampler.c - the device's way of sampling against the sampler's
 * own: a device sends the scheduler hk_topk's candidates of a row
 * (hp_backend_topk), and hk_sample_topk draws from them with the same
 * uniform hp_sample would take (hp_decoder_next_cands). Over random rows,
 * temperatures, top-k and top-p filters and seeds, that must give
 * hp_sample's token and leave the generator where hp_sample leaves it
 * wherever the candidates decide, decide every top-k filter within
 * the candidates, and, at plain temperature, every draw inside their
 * probability mass.
 *
 * Log-probabilities likewise: from the candidates' raw logits and the
 * row's log-sum-exp (hp_backend_topk's raw, lse; hp_logprobs_from), the
 * same entry as hp_logprobs over the row, greedy (the token
 * hp_logprobs_first) and sampled, n_top 0..20, on random, peaked and tied
 * rows: bit for bit with the CPU's lse (the same hk_lse), and with a lse
 * summed in another order (a device's) within one float ulp of the value
 * plus 1e-9: the sums differ by ~V 2^-53 relative (3e-11 at V = 248320),
 * so l - lse moves by far less than that and its rounding to float by at
 * most one ulp.
 */
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "engine/backend/backend.h"
#include "engine/forward/sampler.h"
#include "kernels/cpu/hk_cpu.h"
#include "t/lib/tap.h"
#define TEST_RNG_SEED 0x5deece66dull
#include "t/lib/testrand.h"

/* The lse of l[V] summed in another order than hk_lse's: backwards, the
 * largest term last (a device sums splits apart). */
static double lse_other_order(const float *l, int V)
{
    int a = hp_argmax(l, V);
    double sum = 0.0;
    for (int i = V - 1; i >= 0; i--)
        if (i != a)
            sum += exp((double)l[i] - l[a]);
    return l[a] + log(sum + 1.0);
}

static int lp_close(float got, float want)
{
    return fabsf(got - want) <= FLT_EPSILON * fabsf(want) + 1e-9f;
}

/* got against want: ids exact; values exact (exact) or close */
static int same_lp(const hp_logprobs_t *got, const hp_logprobs_t *want,
                   int exact)
{
    int same = got->token == want->token && got->n_top == want->n_top &&
               (exact ? got->logprob == want->logprob
                      : lp_close(got->logprob, want->logprob));
    for (int j = 0; same && j < want->n_top; j++)
        same = got->top_id[j] == want->top_id[j] &&
               (exact ? got->top_lp[j] == want->top_lp[j]
                      : lp_close(got->top_lp[j], want->top_lp[j]));
    return same;
}

/* hp_logprobs_from on hk_topk's candidates against hp_logprobs. */
static void check_logprobs(void)
{
    enum { V = 5000, K = HP_BACKEND_TOPK_MAX };
    static const double inv_ts[] = {1.0, 1.0 / 0.7, 1.0 / 1.9};
    static const char *kinds[] = {"random", "peaked", "tied"};
    float *l = malloc(V * sizeof(float)), *p = malloc(K * sizeof(float));
    float *raw = malloc(K * sizeof(float));
    int *idx = malloc(K * sizeof(int));
    test_rng_t rng = {TEST_RNG_SEED + 1};
    for (int kind = 0; kind < 3; kind++) {
        long checked = 0;
        int exact = 1, close = 1, greedy = 1, absent = 1;
        for (int row = 0; row < 4; row++) {
            for (int i = 0; i < V; i++)
                l[i] = kind == 2 ? (float)(int)(9.0 * test_rng_unif(&rng))
                                 : (float)(test_rng_normal(&rng) * 2.5);
            /* a model's confident step: one or two spikes; at 80 the
             * others' p underflow to 0 and rank by index, not logit */
            if (kind == 1)
                for (int j = 0; j <= row % 2; j++)
                    l[(row * 997 + j * 31) % V] =
                        (row < 2 ? 80.0f : 22.0f) + (float)j * 2e-6f;
            const double other = lse_other_order(l, V);
            for (size_t a = 0; a < sizeof(inv_ts) / sizeof(*inv_ts); a++) {
                double lse;
                hk_topk(p, idx, raw, &lse, l, V, K, inv_ts[a]);
                /* greedy: the argmax (a = 0: inv_t 1, as the scheduler
                 * asks); sampled: candidates across the list */
                const int t0 = hp_logprobs_first(raw, idx, K);
                greedy &= t0 == hp_argmax(l, V);
                const int toks[] = {t0, idx[0], idx[1], idx[19], idx[K - 1]};
                for (size_t t = 0; t < sizeof(toks) / sizeof(*toks); t++)
                    for (int n = 0; n <= HP_LOGPROBS_MAX_TOP; n++) {
                        hp_logprobs_t want, got, near;
                        hp_logprobs(&want, l, V, toks[t], n);
                        exact &= hp_logprobs_from(&got, lse, raw, idx, K,
                                                  toks[t], n) == 0 &&
                                 same_lp(&got, &want, 1);
                        close &= hp_logprobs_from(&near, other, raw, idx, K,
                                                  toks[t], n) == 0 &&
                                 same_lp(&near, &want, 0);
                        checked++;
                    }
                /* a token past the candidates: the row is needed */
                int out = 0;
                while (out < V) {
                    int in = 0;
                    for (int j = 0; j < K; j++)
                        in |= idx[j] == out;
                    if (!in)
                        break;
                    out++;
                }
                hp_logprobs_t none;
                absent &= hp_logprobs_from(&none, lse, raw, idx, K, out, 5) < 0;
            }
        }
        ok(exact && close && greedy && absent,
           "logprobs from the candidates, %s rows (%ld entries, n_top "
           "0..%d): greedy's token hp_argmax's %s, hp_logprobs' entry bit "
           "for bit %s, within an ulp with the lse summed apart %s, a "
           "token past them refused %s",
           kinds[kind], checked, HP_LOGPROBS_MAX_TOP, greedy ? "yes" : "NO",
           exact ? "yes" : "NO", close ? "yes" : "NO", absent ? "yes" : "NO");
    }
    free(l);
    free(p);
    free(raw);
    free(idx);
}

/* Where the normalizer's bounds straddle u, the row decides. With no
 * filter the sampler's normalizer is 1 within 2^-23, so u = 0.5 on half
 * the mass is on a boundary; with top-k 4 over 3 candidates it lies in
 * [0.875, 1], so u in (0.5, 0.571) could go either way. */
static void test_bounds(void)
{
    const float p[3] = {0.5f, 0.25f, 0.125f};
    const int idx[3] = {7, 3, 9};
    ok(hk_sample_topk(p, idx, 3, 1000, 0, 1.0f, 0.4999) == 7 &&
           hk_sample_topk(p, idx, 3, 1000, 0, 1.0f, 0.5) == -1 &&
           hk_sample_topk(p, idx, 3, 1000, 0, 1.0f, 0.5001) == 3 &&
           hk_sample_topk(p, idx, 3, 1000, 0, 1.0f, 0.8749) == 9 &&
           hk_sample_topk(p, idx, 3, 1000, 0, 1.0f, 0.8751) == -1,
       "no filter: a draw on a boundary within rounding, or past the "
       "candidates' mass, needs the row");
    ok(hk_sample_topk(p, idx, 3, 1000, 4, 1.0f, 0.3) == 7 &&
           hk_sample_topk(p, idx, 3, 1000, 4, 1.0f, 0.55) == -1 &&
           hk_sample_topk(p, idx, 3, 1000, 4, 1.0f, 0.6) == 3,
       "top-k one past the candidates: decided only where every "
       "normalizer the fourth allows gives the same token");
}

int main(void)
{
    check_logprobs();
    test_bounds();

    enum { V = 3000, K = HP_BACKEND_TOPK_MAX, ROWS = 6, DRAWS = 40 };
    static const float temps[] = {0.3f, 0.8f, 1.0f, 1.7f};
    static const int top_ks[] = {0, 1, 20, K, K + 1};
    static const float top_ps[] = {1.0f, 0.95f, 0.6f};
    hp_sampler_t sm;
    float *l = malloc(V * sizeof(float)), *p = malloc(K * sizeof(float));
    int *idx = malloc(K * sizeof(int));
    test_rng_t rng = {TEST_RNG_SEED};
    if (hp_sampler_init(&sm, V) != 0 || !l || !p || !idx)
        return 1;

    long same = 0, decided = 0, undecided = 0, cases = 0, topk_undecided = 0;
    long plain = 0, plain_decided = 0, inside_undecided = 0;
    int agree = 1, rng_agree = 1;
    for (int row = 0; row < ROWS; row++) {
        /* peaked rows (a model's) and flat ones, ties included */
        for (int i = 0; i < V; i++)
            l[i] = row % 3 == 2 ? (float)(int)(7.0 * test_rng_unif(&rng))
                                : (float)(test_rng_normal(&rng) * (2.0 + row));
        for (size_t a = 0; a < sizeof(temps) / sizeof(*temps); a++) {
            hk_topk(p, idx, NULL, NULL, l, V, K, 1.0 / temps[a]);
            for (size_t b = 0; b < sizeof(top_ks) / sizeof(*top_ks); b++)
                for (size_t c = 0; c < sizeof(top_ps) / sizeof(*top_ps); c++)
                    for (int d = 0; d < DRAWS; d++) {
                        hp_sampling_t sp = {.temperature = temps[a],
                                            .top_k = top_ks[b],
                                            .top_p = top_ps[c],
                                            .seed = (uint64_t)d};
                        hp_rng_t ra, rb;
                        hp_rng_seed(&ra, sp.seed);
                        hp_rng_seed(&rb, sp.seed);
                        int want = hp_sample(&sm, l, &sp, &ra);
                        double u = hp_rng_uniform(&rb);
                        int got =
                            hk_sample_topk(p, idx, K, V, sp.top_k, sp.top_p, u);
                        /* plain temperature: the draw is the list's
                         * wherever u is inside its mass */
                        int past = sp.top_k == 0 && sp.top_p >= 1.0f;
                        double mass = 0.0;
                        for (int i = 0; i < K; i++)
                            mass += p[i];
                        cases++;
                        plain += past;
                        if (got < 0) {
                            undecided++;
                            topk_undecided += sp.top_k > 0 && sp.top_k <= K;
                            inside_undecided += past && u < mass * 0.99999;
                            continue;
                        }
                        plain_decided += past;
                        decided++;
                        same += got == want;
                        agree &= got == want;
                        rng_agree &= !memcmp(&ra, &rb, sizeof(ra));
                    }
        }
    }
    ok(agree,
       "the candidates pick hp_sample's token wherever they decide "
       "(%ld of %ld decided, %ld the same)",
       decided, cases, same);
    ok(rng_agree, "and leave the generator where hp_sample leaves it");
    ok(topk_undecided == 0,
       "every top-k filter within the %d candidates "
       "decides (%ld did not)",
       K, topk_undecided);
    ok(inside_undecided == 0 && plain_decided > plain / 2,
       "plain temperature: a draw inside the candidates' mass decides "
       "(%ld of %ld decided, %ld inside did not)",
       plain_decided, plain, inside_undecided);
    ok(decided > cases / 2 && undecided > 0,
       "most draws decide, some need the row (%ld of %ld)", undecided, cases);

    hp_sampler_free(&sm);
    free(l);
    free(p);
    free(idx);
    return tap_done();
}
