/*
 * decoder.h - the step-wise decoder: one sequence's decode as a state
 * machine, so a scheduler can interleave many: sample from logits, stop on
 * stop ids, stop strings or the token budget, and keep the text that is
 * safe to show (whole UTF-8 characters that can no longer become part of a
 * stop string). hp_generate's loop is this decoder plus one hp_forward per
 * token (or one verification per speculative draft: hp_decoder_draft,
 * hp_decoder_accept). The scheduler (serve/sched.c) runs one per request.
 */
#ifndef HP_DECODER_H
#define HP_DECODER_H

#include <stddef.h>

#include "engine/contract/hp_error.h"
#include "engine/forward/generate.h"
#include "engine/forward/sampler.h"
#include "engine/model/llm.h"

/* A token's log-probabilities and where its text starts. */
typedef struct {
    hp_logprobs_t lp;
    size_t off; /* bytes of text before the token's own */
} hp_decoder_lp_t;

typedef struct {
    const hp_llm_t *llm;
    int max_tokens;
    hp_sampling_t sampling;
    int ignore_eos;
    char *stop[HP_GEN_MAX_STOP]; /* owned copies */
    int n_stop;
    size_t max_stop; /* longest stop string */
    hp_rng_t rng;
    hp_tokenizer_stream_t st;
    hp_tokenizer_text_t text; /* all text so far */
    size_t safe;              /* text[0..safe) may be shown */
    size_t shown;             /* text[0..shown) was taken */
    int n_tokens;             /* generated, stop id excluded */
    int last;                 /* the last token counted in n_tokens, -1 */
    int done;
    hp_finish_t finish;
    /* ids[n_prompt..n_ids): the tokens counted in n_tokens; with
     * speculative decoding ids[0..n_prompt) is the prompt (p->ctx), the
     * drafter looks up in all of it */
    int *ids;
    int n_ids, cap_ids, n_prompt;
    int spec;     /* most drafted tokens per pass, 0: off */
    int drafted;  /* tokens proposed by the drafter */
    int accepted; /* ... of which accepted */
    /* logprobs: an entry per counted token, from the logits it was chosen
     * from; lp[lp_taken..n_lp) not yet taken */
    int logprobs, top_logprobs;
    hp_decoder_lp_t *lp;
    int n_lp, cap_lp, lp_taken;
    int stopped; /* a stop string ended it: text past safe dropped */
    /* structured output (p->grammar): the recogniser of the text so far,
     * the allowed tokens' bits, the masked logits, the walk's scratch */
    const hp_grammar_t *grammar;
    const hp_gmask_vocab_t *gvocab;
    hp_gmatch_t gm;
    uint32_t *allowed;
    float *masked;
    hp_gmask_scratch_t gs;
    size_t chars_at, chars; /* text[0..chars_at) holds `chars` characters */
} hp_decoder_t;

/* Copies p (stop strings and, speculating, the prompt ids included).
 * HP_OK or HP_ENOMEM. */
int hp_decoder_init(hp_decoder_t *d, const hp_llm_t *llm,
                    const hp_gen_params_t *p, hp_error_t *err);
void hp_decoder_free(hp_decoder_t *d);

/*
 * One token: samples from logits [vocab] with sm's scratch (under a
 * grammar, from the logits masked to the tokens it allows; where it must
 * end, the generation ends "stop" without sampling). If the
 * generation goes on, *tok is the token the caller must run through the
 * model to get the next logits; if it ends, d->done and d->finish are set
 * (and *tok is -1). A budget of 0 tokens ends at the first call without
 * sampling. HP_OK or a tokenizer error.
 */
int hp_decoder_next(hp_decoder_t *d, hp_sampler_t *sm, const float *logits,
                    int *tok, hp_error_t *err);
/* hp_decoder_next with the token already chosen where the logits are
 * (best >= 0: greedy sampling's argmax, hp_fwd_item_t.best); best < 0
 * samples from logits as hp_decoder_next. Under a grammar best must be
 * < 0 (an unmasked argmax is not the masked one). */
int hp_decoder_next_id(hp_decoder_t *d, int best, hp_sampler_t *sm,
                       const float *logits, int *tok, hp_error_t *err);
/* hp_decoder_next_id from a device's k candidates of a vocabulary of V
 * (hp_fwd_item_t.cand_*; raw, lse NULL where not sent): the token d's
 * sampler draws from them as hp_sample would from the whole row with the
 * same draw (hp_backend_sample_topk) or, greedy, the row's argmax (their
 * first by raw logit, hp_logprobs_first), with its log-probabilities
 * formed from raw and lse (hp_logprobs_from) where d wants them. Returns
 * as hp_decoder_next_id, or 1, nothing done and the generator untouched,
 * where the candidates cannot decide (or lack the chosen token, or a
 * grammar masks the row): then hp_decoder_next_id on the row's logits. */
int hp_decoder_next_cands(hp_decoder_t *d, const float *p, const int *idx,
                          const float *raw, const double *lse, int k, int V,
                          int *tok, hp_error_t *err);

/* One token chosen elsewhere (an accepted speculative draft, or the
 * token drawn at a rejection): the same stops and text as for a sampled
 * one. HP_OK or a tokenizer error; d->done says whether it ended. */
int hp_decoder_push(hp_decoder_t *d, int t, hp_error_t *err);

/* Speculative decoding (d->spec > 0): drafts for the pass that feeds
 * the token just chosen, by prompt lookup (spec.h) over the prompt and the
 * output so far; at most d->spec tokens and no more than the budget can
 * still take. Returns the count into draft[] (0: feed the token alone). */
int hp_decoder_draft(const hp_decoder_t *d, int *draft);

/*
 * After verifying [tok, draft[0..n)] (hp_forward_verify or a verify item
 * of hp_forward_batch): rows [n+1] of logits with row stride `stride`
 * (compacted in place to the sampler's V). Accepts drafts by the greedy
 * rule (temperature 0) or the rejection rule, pushes the accepted ones and
 * then the model's own next token. *keep: the verified tokens the sequence
 * keeps (hp_forward_accept); *tok: the next token to feed, -1 if the
 * generation ended. prob: scratch [V]. HP_OK or a tokenizer error.
 */
int hp_decoder_accept(hp_decoder_t *d, hp_sampler_t *sm, float *prob,
                      float *rows, int stride, const int *draft, int n,
                      int *keep, int *tok, hp_error_t *err);
/* hp_decoder_accept's greedy rule from each row's argmax, best [n + 1]
 * (hp_fwd_item_t.best), where the logits stay on the device. */
int hp_decoder_accept_best(hp_decoder_t *d, const int *best, const int *draft,
                           int n, int *keep, int *tok, hp_error_t *err);

/*
 * A copy of d's settings with a fresh state, sampling from `seed`: one
 * more choice of the same request (n > 1). d must not have begun.
 * HP_OK or HP_ENOMEM.
 */
int hp_decoder_fork(hp_decoder_t *dst, const hp_decoder_t *d, uint64_t seed,
                    hp_error_t *err);

/*
 * The log-probability entries that may be shown (*lp, count): those of
 * tokens whose text starts in the safe text, all of them once the
 * generation ended, except those of tokens inside a stop string. In
 * order; hp_decoder_logprobs_take marks n as taken.
 */
int hp_decoder_logprobs_ready(const hp_decoder_t *d,
                              const hp_decoder_lp_t **lp);
void hp_decoder_logprobs_take(hp_decoder_t *d, int n);

/* Characters (UTF-8 code points) of the text before byte `off`; off must
 * not go down from one call to the next. */
size_t hp_decoder_chars(hp_decoder_t *d, size_t off);

/* The text that is safe to show and not yet taken (*text, length). */
size_t hp_decoder_ready(const hp_decoder_t *d, const char **text);
/* Marks n bytes of the ready text as taken. */
void hp_decoder_take(hp_decoder_t *d, size_t n);

#endif
