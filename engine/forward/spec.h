/*
 * spec.h - speculative decoding without a draft model: prompt-lookup
 * drafting (copy what followed an earlier occurrence of the context's
 * suffix) and the acceptance rules that make the output exactly the
 * target's: greedy (same tokens as plain greedy decoding) and sampled (the
 * speculative rejection rule for a point-mass draft: same distribution).
 *
 * A verification step feeds the model [x0, d_1 .. d_n] (x0 the last token
 * not yet fed, d the drafts) and gets n+1 rows of logits: row j is the
 * next-token distribution after d_j (row 0: after x0). With m drafts
 * accepted, the emitted tokens are d_1 .. d_m and then `next`, drawn from
 * row m; the linear layers keep m+1 buffered entries (hp_kvbuf_truncate),
 * and `next` is the x0 of the following step.
 */
#ifndef HP_SPEC_H
#define HP_SPEC_H

#include "engine/forward/sampler.h"

/*
 * Drafts up to max_draft tokens into draft[]: for n = max_ngram down to
 * min_ngram (>= 1), the most recent earlier occurrence of the last n tokens
 * of ctx[0..n_ctx) that has a continuation; the draft is the tokens that
 * followed it, stopping at the end of ctx. Returns the count (0: no match).
 */
int hp_spec_lookup(int *draft, int max_draft, const int *ctx, int n_ctx,
                   int max_ngram, int min_ngram);

/*
 * Greedy acceptance: logits [n+1, V] as above. Accepts d_j while it is the
 * argmax of row j-1 (hp_argmax: lowest index on ties); *next = argmax of
 * the first row that disagrees (or of row n). Returns m.
 */
int hp_spec_accept_greedy(const float *logits, int V, const int *draft, int n,
                          int *next);

/*
 * Sampled acceptance for the point-mass draft: p_j = hp_sampler_probs of
 * row j under sp (temperature, top-k, top-p). d_{j+1} is accepted with
 * probability p_j(d_{j+1}); on the first rejection *next is drawn from the
 * residual p_j without d_{j+1}, renormalized; if all n are accepted *next
 * is drawn from p_n. The emitted tokens are then distributed exactly as
 * plain sampling from the target. prob: scratch [V], not aliasing s->prob.
 * Temperature 0 reduces to the greedy rule. Returns m.
 */
int hp_spec_accept_sampled(hp_sampler_t *s, float *prob, const float *logits,
                           const int *draft, int n, const hp_sampling_t *sp,
                           hp_rng_t *rng, int *next);

#endif
