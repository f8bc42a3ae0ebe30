/* generate.c - the decode loop (see generate.h). */
#include "engine/generate.h"

#include <stdlib.h>
#include <string.h>

/* Length of the longest suffix of text[0..len) that is a proper prefix of
 * one of the stop strings: that much must be held back from the client. */
static size_t holdback(const char *text, size_t len, const hp_gen_params_t *p)
{
    size_t best = 0;
    for (int s = 0; s < p->n_stop; s++) {
        size_t sl = strlen(p->stop[s]);
        for (size_t k = sl > 1 ? sl - 1 : 0; k > best; k--)
            if (k <= len && !memcmp(text + len - k, p->stop[s], k)) {
                best = k;
                break;
            }
    }
    return best;
}

/* Earliest stop-string match starting at or after `from`, or -1. */
static long find_stop(const char *text, size_t len, size_t from,
                      const hp_gen_params_t *p)
{
    long best = -1;
    for (int s = 0; s < p->n_stop; s++) {
        size_t sl = strlen(p->stop[s]);
        if (!sl)
            continue;
        for (size_t i = from; i + sl <= len; i++)
            if (!memcmp(text + i, p->stop[s], sl)) {
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

int hp_generate(const hp_llm_t *llm, hp_seq_t *seq, hp_fwd_ws_t *ws,
                float *logits, const hp_gen_params_t *p, hp_gen_emit_fn emit,
                void *ud, hp_gen_result_t *res, hp_error_t *err)
{
    const hp_model_t *m = &llm->model;
    hp_sampler_t sm;
    hp_rng_t rng;
    hp_tokenizer_stream_t st;
    hp_tokenizer_text_t text = {0};
    size_t emitted = 0, maxstop = 0;
    int rc = HP_OK, by_string = 0;

    memset(res, 0, sizeof(*res));
    res->finish = HP_FINISH_LENGTH;
    res->tokens = malloc(((size_t)p->max_tokens + 1) * sizeof(int));
    /* Embedding tables are padded past the tokenizer: ids without a token
     * are never sampled. */
    size_t tv = hp_tokenizer_vocab_size(llm->tok);
    int V = tv < (size_t)m->cfg.vocab_size ? (int)tv : m->cfg.vocab_size;
    if (!res->tokens || hp_sampler_init(&sm, V) != 0) {
        free(res->tokens);
        res->tokens = NULL;
        hp_sampler_free(&sm);
        return hp_error_set(err, HP_ENOMEM, "generate: out of memory");
    }
    hp_rng_seed(&rng, p->sampling.seed);
    hp_tokenizer_stream_init(&st);
    for (int s = 0; s < p->n_stop; s++)
        if (strlen(p->stop[s]) > maxstop)
            maxstop = strlen(p->stop[s]);

    while (res->n_tokens < p->max_tokens) {
        int tok = hp_sample(&sm, logits, &p->sampling, &rng);
        if (!p->ignore_eos && is_stop_id(llm, tok)) {
            res->finish = HP_FINISH_STOP;
            break;
        }
        res->tokens[res->n_tokens++] = tok;
        size_t before = text.len;
        rc = hp_tokenizer_stream_push(llm->tok, &st, tok, &text, err);
        if (rc != HP_OK)
            break;
        size_t from = before > maxstop ? before - maxstop : 0;
        long at = p->n_stop ? find_stop(text.data, text.len, from, p) : -1;
        size_t safe =
            at >= 0 ? (size_t)at : text.len - holdback(text.data, text.len, p);
        if (safe > emitted && emit &&
            emit(ud, text.data + emitted, safe - emitted, tok)) {
            res->finish = HP_FINISH_CANCEL;
            emitted = safe;
            break;
        }
        if (safe > emitted)
            emitted = safe;
        if (at >= 0) {
            res->finish = HP_FINISH_STOP;
            by_string = 1; /* the stop string and what follows are dropped */
            break;
        }
        if (res->n_tokens == p->max_tokens)
            break;
        rc = hp_forward(m, seq, ws, &tok, NULL, 1, NULL, HP_LOGITS_LAST, logits,
                        err);
        if (rc != HP_OK)
            break;
    }
    /* A character still incomplete at the end comes out as U+FFFD. */
    if (rc == HP_OK && res->finish != HP_FINISH_CANCEL && !by_string) {
        rc = hp_tokenizer_stream_flush(&st, &text, err);
        if (rc == HP_OK && text.len > emitted && emit)
            emit(ud, text.data + emitted, text.len - emitted, -1);
    }
    hp_tokenizer_text_free(&text);
    hp_sampler_free(&sm);
    return rc;
}
