/*
 * decoder.c - the step-wise decoder (decoder.h): one sequence's sampling,
 * stops and safe text, and its speculative decoding (prompt-lookup drafts,
 * acceptance by spec.h's rules). Used by the scheduler for every request
 * and by hp_generate for one.
 */
#include <stdlib.h>
#include <string.h>

#include "engine/backend/backend.h"
#include "engine/forward/decoder.h"
#include "engine/forward/spec.h"

/* Length of the longest suffix of text[0..len) that is a proper prefix of
 * a stop string: that much is held back, it may still become one. */
static size_t holdback(const hp_decoder_t *d, const char *text, size_t len)
{
    size_t best = 0;
    for (int s = 0; s < d->n_stop; s++) {
        size_t sl = strlen(d->stop[s]);
        for (size_t k = sl > 1 ? sl - 1 : 0; k > best; k--)
            if (k <= len && !memcmp(text + len - k, d->stop[s], k)) {
                best = k;
                break;
            }
    }
    return best;
}

/* Earliest stop-string match starting at or after `from`, or -1. */
static long find_stop(const hp_decoder_t *d, const char *text, size_t len,
                      size_t from)
{
    long best = -1;
    for (int s = 0; s < d->n_stop; s++) {
        size_t sl = strlen(d->stop[s]);
        for (size_t i = from; i + sl <= len; i++)
            if (!memcmp(text + i, d->stop[s], sl)) {
                if (best < 0 || (long)i < best)
                    best = (long)i;
                break;
            }
    }
    return best;
}

static int is_stop_id(const hp_llm_t *llm, int id)
{
    for (int i = 0; i < llm->n_stop_ids; i++)
        if (llm->stop_ids[i] == id)
            return 1;
    return 0;
}

int hp_decoder_init(hp_decoder_t *d, const hp_llm_t *llm,
                    const hp_gen_params_t *p, hp_error_t *err)
{
    memset(d, 0, sizeof(*d));
    d->llm = llm;
    d->max_tokens = p->max_tokens < 0 ? 0 : p->max_tokens;
    d->sampling = p->sampling;
    d->ignore_eos = p->ignore_eos;
    for (int i = 0; i < p->n_stop && i < HP_GEN_MAX_STOP; i++) {
        if (!p->stop[i] || !*p->stop[i])
            continue; /* an empty stop string would match at once */
        d->stop[d->n_stop] = strdup(p->stop[i]);
        if (!d->stop[d->n_stop]) {
            hp_decoder_free(d);
            return hp_error_set(err, HP_ENOMEM, "decoder: out of memory");
        }
        if (strlen(p->stop[i]) > d->max_stop)
            d->max_stop = strlen(p->stop[i]);
        d->n_stop++;
    }
    d->logprobs = p->logprobs != 0;
    d->top_logprobs = p->top_logprobs < 0 ? 0
                      : p->top_logprobs > HP_LOGPROBS_MAX_TOP
                          ? HP_LOGPROBS_MAX_TOP
                          : p->top_logprobs;
    d->spec = p->speculative > 0 ? p->speculative : 0;
    if (d->spec && p->n_ctx > 0) {
        /* the drafter looks up in the prompt, then in the output */
        d->cap_ids = p->n_ctx + 64;
        d->ids = malloc((size_t)d->cap_ids * sizeof(int));
        if (!d->ids) {
            hp_decoder_free(d);
            return hp_error_set(err, HP_ENOMEM, "decoder: out of memory");
        }
        memcpy(d->ids, p->ctx, (size_t)p->n_ctx * sizeof(int));
        d->n_ids = d->n_prompt = p->n_ctx;
    }
    if (p->grammar) {
        d->grammar = p->grammar;
        d->gvocab = p->gvocab;
        d->spec = 0; /* drafts are not checked against the grammar */
        int rc = hp_gmatch_init(&d->gm, p->grammar, err);
        if (rc != HP_OK) {
            hp_decoder_free(d);
            return rc;
        }
    }
    hp_rng_seed(&d->rng, p->sampling.seed);
    hp_tokenizer_stream_init(&d->st);
    d->finish = HP_FINISH_LENGTH;
    d->last = -1;
    return HP_OK;
}

void hp_decoder_free(hp_decoder_t *d)
{
    for (int i = 0; i < d->n_stop; i++)
        free(d->stop[i]);
    free(d->ids);
    free(d->lp);
    if (d->grammar)
        hp_gmatch_free(&d->gm);
    free(d->allowed);
    free(d->masked);
    hp_gmask_scratch_free(&d->gs);
    hp_tokenizer_text_free(&d->text);
    memset(d, 0, sizeof(*d));
}

/* Ends the generation; unless a stop string ended it, a character still
 * incomplete comes out as U+FFFD and everything becomes safe. */
static int dec_end(hp_decoder_t *d, hp_finish_t finish, int flush,
                   hp_error_t *err)
{
    d->done = 1;
    d->finish = finish;
    if (flush) {
        int rc = hp_tokenizer_stream_flush(&d->st, &d->text, err);
        if (rc != HP_OK)
            return rc;
        d->safe = d->text.len;
    }
    return HP_OK;
}

/* The entry of token t, counted just now: ready, formed already, or from
 * the logits it was chosen from (rows of the sampler's V). */
static int note_logprobs(hp_decoder_t *d, int t, const float *logits, int V,
                         const hp_logprobs_t *ready, hp_error_t *err)
{
    if (d->n_lp == d->cap_lp) {
        int cap = d->cap_lp ? 2 * d->cap_lp : 16;
        hp_decoder_lp_t *lp = realloc(d->lp, (size_t)cap * sizeof(*lp));
        if (!lp)
            return hp_error_set(err, HP_ENOMEM, "decoder: out of memory");
        d->lp = lp;
        d->cap_lp = cap;
    }
    hp_decoder_lp_t *e = &d->lp[d->n_lp++];
    if (ready)
        e->lp = *ready;
    else
        hp_logprobs(&e->lp, logits, V, t, d->top_logprobs);
    e->off = d->text.len;
    return HP_OK;
}

/* hp_decoder_push, with the logits t was chosen from (NULL: none) or its
 * log-probabilities formed elsewhere (lp; NULL: none) */
static int push(hp_decoder_t *d, int t, const float *logits, int V,
                const hp_logprobs_t *lp, hp_error_t *err)
{
    if (d->done)
        return HP_OK;
    if (d->n_tokens >= d->max_tokens)
        return dec_end(d, HP_FINISH_LENGTH, 1, err);
    if (!d->ignore_eos && is_stop_id(d->llm, t))
        return dec_end(d, HP_FINISH_STOP, 1, err);
    if (d->n_ids == d->cap_ids) {
        int cap = d->cap_ids ? 2 * d->cap_ids : 64;
        int *ids = realloc(d->ids, (size_t)cap * sizeof(int));
        if (!ids)
            return hp_error_set(err, HP_ENOMEM, "decoder: out of memory");
        d->ids = ids;
        d->cap_ids = cap;
    }
    if (d->grammar) {
        size_t n;
        const char *b = hp_tokenizer_token_bytes(d->llm->tok, t, &n);
        if (!b || !hp_gmatch_feed(&d->gm, b, n))
            return hp_error_set(err, HP_EINTERNAL,
                                "decoder: token %d is not in the grammar", t);
    }
    if (d->logprobs && (logits || lp)) {
        int rc = note_logprobs(d, t, logits, V, lp, err);
        if (rc != HP_OK)
            return rc;
    }
    d->ids[d->n_ids++] = t;
    d->n_tokens++;
    d->last = t;
    size_t before = d->text.len;
    int rc = hp_tokenizer_stream_push(d->llm->tok, &d->st, t, &d->text, err);
    if (rc != HP_OK)
        return rc;
    size_t from = before > d->max_stop ? before - d->max_stop : 0;
    long at = d->n_stop ? find_stop(d, d->text.data, d->text.len, from) : -1;
    if (at >= 0) {
        /* the stop string and whatever follows it are dropped */
        d->safe = (size_t)at > d->shown ? (size_t)at : d->shown;
        d->stopped = 1;
        return dec_end(d, HP_FINISH_STOP, 0, err);
    }
    size_t safe = d->text.len - holdback(d, d->text.data, d->text.len);
    if (safe > d->safe)
        d->safe = safe;
    if (d->grammar && hp_gmatch_must_end(&d->gm))
        return dec_end(d, HP_FINISH_STOP, 1, err);
    if (d->n_tokens == d->max_tokens)
        return dec_end(d, HP_FINISH_LENGTH, 1, err);
    return HP_OK;
}

/* The logits masked to what the grammar allows next (d->masked). */
static int constrain(hp_decoder_t *d, const float *logits, int V,
                     const float **out, hp_error_t *err)
{
    if (!d->masked) {
        d->allowed = malloc((size_t)(V + 31) / 32 * sizeof(uint32_t));
        d->masked = malloc((size_t)V * sizeof(float));
        if (!d->allowed || !d->masked)
            return hp_error_set(err, HP_ENOMEM, "decoder: out of memory");
    }
    if (hp_gmask_vocab_size(d->gvocab) != V)
        return hp_error_set(err, HP_EINTERNAL,
                            "decoder: the grammar's vocabulary is %d wide, "
                            "the logits %d",
                            hp_gmask_vocab_size(d->gvocab), V);
    int n = hp_gmask_compute(d->gvocab, &d->gm, &d->gs, d->allowed);
    if (n < 0)
        return hp_error_set(err, HP_ENOMEM, "decoder: out of memory");
    if (d->ignore_eos)
        for (int i = 0; i < d->llm->n_stop_ids; i++) {
            int s = d->llm->stop_ids[i];
            if (s >= 0 && s < V && (d->allowed[s >> 5] >> (s & 31) & 1)) {
                d->allowed[s >> 5] &= ~(1u << (s & 31));
                n--;
            }
        }
    if (n <= 0)
        return hp_error_set(err, HP_EINTERNAL,
                            "decoder: no token of the vocabulary continues "
                            "the grammar");
    memcpy(d->masked, logits, (size_t)V * sizeof(float));
    hp_gmask_apply(d->allowed, d->masked, V);
    *out = d->masked;
    return HP_OK;
}

int hp_decoder_push(hp_decoder_t *d, int t, hp_error_t *err)
{
    return push(d, t, NULL, 0, NULL, err);
}

int hp_decoder_next(hp_decoder_t *d, hp_sampler_t *sm, const float *logits,
                    int *tok, hp_error_t *err)
{
    return hp_decoder_next_id(d, -1, sm, logits, tok, err);
}

/* hp_decoder_next_id, with best's log-probabilities formed elsewhere
 * (lp; NULL: from the logits) */
static int next_id(hp_decoder_t *d, int best, hp_sampler_t *sm,
                   const float *logits, const hp_logprobs_t *lp, int *tok,
                   hp_error_t *err)
{
    *tok = -1;
    if (d->done)
        return HP_OK;
    if (d->n_tokens >= d->max_tokens)
        return dec_end(d, HP_FINISH_LENGTH, 1, err);
    if (d->grammar) {
        if (hp_gmatch_must_end(&d->gm))
            return dec_end(d, HP_FINISH_STOP, 1, err);
        int rc = logits ? constrain(d, logits, sm->V, &logits, err)
                        : hp_error_set(err, HP_EINTERNAL,
                                       "decoder: a grammar needs the logits");
        if (rc != HP_OK)
            return rc;
        best = -1;
    }
    int t = best >= 0 ? best : hp_sample(sm, logits, &d->sampling, &d->rng);
    /* logits may be NULL where the device chose best (no logprobs then,
     * or lp formed from its candidates) */
    int rc = push(d, t, logits, sm ? sm->V : 0, lp, err);
    if (rc == HP_OK && !d->done)
        *tok = t;
    return rc;
}

int hp_decoder_next_id(hp_decoder_t *d, int best, hp_sampler_t *sm,
                       const float *logits, int *tok, hp_error_t *err)
{
    return next_id(d, best, sm, logits, NULL, tok, err);
}

int hp_decoder_next_cands(hp_decoder_t *d, const float *p, const int *idx,
                          const float *raw, const double *lse, int k, int V,
                          int *tok, hp_error_t *err)
{
    if (d->grammar)
        return 1;
    if (d->done || d->n_tokens >= d->max_tokens) /* ends without a token */
        return next_id(d, -1, NULL, NULL, NULL, tok, err);
    hp_rng_t was = d->rng;
    const hp_sampling_t *sp = &d->sampling;
    int t = sp->temperature > 0.0f
                ? hp_backend_sample_topk(p, idx, k, V, sp->top_k, sp->top_p,
                                         hp_rng_uniform(&d->rng))
            : raw ? hp_logprobs_first(raw, idx, k)
                  : -1;
    hp_logprobs_t lp;
    if (t >= 0 && d->logprobs &&
        (!raw || !lse ||
         hp_logprobs_from(&lp, *lse, raw, idx, k, t, d->top_logprobs) != 0))
        t = -1; /* the row has them */
    if (t < 0) {
        d->rng = was;
        return 1;
    }
    return next_id(d, t, NULL, NULL, d->logprobs ? &lp : NULL, tok, err);
}

size_t hp_decoder_ready(const hp_decoder_t *d, const char **text)
{
    *text = d->text.data ? d->text.data + d->shown : "";
    return d->safe - d->shown;
}

void hp_decoder_take(hp_decoder_t *d, size_t n)
{
    d->shown += n;
    if (d->shown > d->safe)
        d->shown = d->safe;
}

int hp_decoder_draft(const hp_decoder_t *d, int *draft)
{
    /* drafts past the budget would only be thrown away */
    int left = d->max_tokens - d->n_tokens;
    int most = d->spec < left ? d->spec : left;
    if (d->done || most <= 0)
        return 0;
    return hp_spec_lookup(draft, most, d->ids, d->n_ids, 3, 1);
}

/* After acceptance: acc of the n drafts taken, then the model's own next
 * token where they stopped; rows [n + 1] of V logits they were checked
 * against (NULL: chosen on the device, no logprobs). */
static int accepted(hp_decoder_t *d, const float *rows, int V, const int *draft,
                    int n, int acc, int next, int *keep, int *tok,
                    hp_error_t *err)
{
    int rc = HP_OK;
    d->drafted += n;
    d->accepted += acc;
    *keep = 1; /* the token fed before the drafts */
    *tok = -1;
    /* row j holds the logits draft j was checked against */
    for (int j = 0; j < acc && rc == HP_OK && !d->done; j++) {
        rc =
            push(d, draft[j], rows ? rows + (size_t)j * V : NULL, V, NULL, err);
        if (rc == HP_OK && !d->done)
            (*keep)++;
    }
    /* the model's own token where the drafts stopped: the next one to
     * feed, chosen without a fresh forward pass */
    if (rc == HP_OK && !d->done)
        rc = push(d, next, rows ? rows + (size_t)acc * V : NULL, V, NULL, err);
    if (rc == HP_OK && !d->done)
        *tok = next;
    return rc;
}

int hp_decoder_accept(hp_decoder_t *d, hp_sampler_t *sm, float *prob,
                      float *rows, int stride, const int *draft, int n,
                      int *keep, int *tok, hp_error_t *err)
{
    const int V = sm->V;
    int next, acc;
    for (int j = 0; j <= n && V < stride; j++) /* rows of stride V */
        memmove(rows + (size_t)j * V, rows + (size_t)j * stride,
                (size_t)V * sizeof(float));
    acc = d->sampling.temperature > 0.0f
              ? hp_spec_accept_sampled(sm, prob, rows, draft, n, &d->sampling,
                                       &d->rng, &next)
              : hp_spec_accept_greedy(rows, V, draft, n, &next);
    return accepted(d, rows, V, draft, n, acc, next, keep, tok, err);
}

int hp_decoder_accept_best(hp_decoder_t *d, const int *best, const int *draft,
                           int n, int *keep, int *tok, hp_error_t *err)
{
    int acc = 0;
    while (acc < n && best[acc] == draft[acc])
        acc++;
    return accepted(d, NULL, 0, draft, n, acc, best[acc], keep, tok, err);
}

int hp_decoder_fork(hp_decoder_t *dst, const hp_decoder_t *d, uint64_t seed,
                    hp_error_t *err)
{
    hp_gen_params_t p = {
        .max_tokens = d->max_tokens,
        .sampling = d->sampling,
        .n_stop = d->n_stop,
        .ignore_eos = d->ignore_eos,
        .speculative = d->spec,
        .ctx = d->ids,
        .n_ctx = d->n_prompt,
        .logprobs = d->logprobs,
        .top_logprobs = d->top_logprobs,
        .grammar = d->grammar,
        .gvocab = d->gvocab,
    };
    p.sampling.seed = seed;
    for (int i = 0; i < d->n_stop; i++)
        p.stop[i] = d->stop[i];
    return hp_decoder_init(dst, d->llm, &p, err);
}

int hp_decoder_logprobs_ready(const hp_decoder_t *d, const hp_decoder_lp_t **lp)
{
    int end = d->lp_taken;
    *lp = d->lp + d->lp_taken;
    if (d->done && !d->stopped)
        return d->n_lp - d->lp_taken;
    /* a token whose text starts past the safe text waits (or, stopped,
     * belongs to the stop string) */
    while (end < d->n_lp && d->lp[end].off < d->safe)
        end++;
    return end - d->lp_taken;
}

void hp_decoder_logprobs_take(hp_decoder_t *d, int n)
{
    d->lp_taken += n;
    if (d->lp_taken >= d->n_lp)
        d->lp_taken = d->n_lp = 0; /* all taken: the room is reused */
}

size_t hp_decoder_chars(hp_decoder_t *d, size_t off)
{
    if (off > d->text.len)
        off = d->text.len;
    for (; d->chars_at < off; d->chars_at++)
        d->chars += ((unsigned char)d->text.data[d->chars_at] & 0xc0) != 0x80;
    return d->chars;
}
