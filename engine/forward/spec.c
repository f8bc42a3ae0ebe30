/*
 * spec.c - prompt-lookup drafting and exact acceptance rules (spec.h).
 *
 * Why the sampled rule is exact (Leviathan et al. 2023, with the draft
 * distribution a point mass at x): the emitted token is x with probability
 * p(x), and otherwise a draw from r(y) = p(y) / (1 - p(x)) for y != x,
 * which has total probability (1 - p(x)) r(y) = p(y). So every token has
 * probability p(y), and by induction over the positions (each row's
 * distribution is conditioned on the tokens emitted before it) the whole
 * emitted sequence is distributed as plain sampling.
 */
#include "engine/forward/spec.h"

#include <string.h>

int hp_spec_lookup(int *draft, int max_draft, const int *ctx, int n_ctx,
                   int max_ngram, int min_ngram)
{
    if (max_draft <= 0 || min_ngram < 1)
        return 0;
    for (int n = max_ngram; n >= min_ngram; n--) {
        const int *suf = ctx + n_ctx - n;
        /* An occurrence at p needs a continuation: p + n < n_ctx, and it
         * must start before the suffix itself. */
        for (int p = n_ctx - n - 1; p >= 0; p--) {
            if (memcmp(ctx + p, suf, (size_t)n * sizeof(int)) != 0)
                continue;
            int m = n_ctx - (p + n);
            m = m < max_draft ? m : max_draft;
            memcpy(draft, ctx + p + n, (size_t)m * sizeof(int));
            return m;
        }
    }
    return 0;
}

int hp_spec_accept_greedy(const float *logits, int V, const int *draft, int n,
                          int *next)
{
    int m = 0;
    while (m < n && hp_argmax(logits + (size_t)m * V, V) == draft[m])
        m++;
    *next = hp_argmax(logits + (size_t)m * V, V);
    return m;
}

/* A draw from prob[V] (non-negative, any total > 0), by inversion. */
static int draw(const float *prob, int V, hp_rng_t *rng)
{
    double total = 0.0;
    for (int i = 0; i < V; i++)
        total += prob[i];
    double u = hp_rng_uniform(rng) * total, cum = 0.0;
    int last = 0;
    for (int i = 0; i < V; i++) {
        if (prob[i] <= 0.0f)
            continue;
        cum += prob[i];
        last = i;
        if (u < cum)
            return i;
    }
    return last; /* u landed in the rounding gap at the top */
}

int hp_spec_accept_sampled(hp_sampler_t *s, float *prob, const float *logits,
                           const int *draft, int n, const hp_sampling_t *sp,
                           hp_rng_t *rng, int *next)
{
    const int V = s->V;
    for (int j = 0; j < n; j++) {
        hp_sampler_probs(s, prob, logits + (size_t)j * V, sp);
        int x = draft[j];
        float px = x >= 0 && x < V ? prob[x] : 0.0f;
        if (hp_rng_uniform(rng) < px)
            continue;
        /* Rejected: the residual p - p(x) e_x, renormalized by draw().
         * It is empty only when p(x) is 1 up to rounding: then x stands. */
        if (x >= 0 && x < V)
            prob[x] = 0.0f;
        double rest = 0.0;
        for (int i = 0; i < V; i++)
            rest += prob[i];
        if (rest <= 0.0)
            continue;
        *next = draw(prob, V, rng);
        return j;
    }
    hp_sampler_probs(s, prob, logits + (size_t)n * V, sp);
    *next = draw(prob, V, rng);
    return n;
}
