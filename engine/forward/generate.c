/*
 * generate.c - the decode loop of one sequence: the step-wise decoder
 * (decoder.h) plus one forward pass per token, or, with speculative
 * decoding, one verification pass per prompt-lookup draft.
 */
#include "engine/forward/generate.h"

#include <stdlib.h>
#include <string.h>

#include "engine/forward/decoder.h"

/* Hands the decoder's ready text to emit; 1 if emit asked to stop. */
static int flush_text(hp_decoder_t *d, hp_gen_emit_fn emit, void *ud)
{
    const char *text;
    size_t n = hp_decoder_ready(d, &text);
    if (n == 0)
        return 0;
    int stop = emit ? emit(ud, text, n, d->done ? -1 : d->last) : 0;
    hp_decoder_take(d, n);
    return stop;
}

int hp_generate(const hp_llm_t *llm, hp_seq_t *seq, hp_fwd_ws_t *ws,
                float *logits, const hp_gen_params_t *p, hp_gen_emit_fn emit,
                void *ud, hp_gen_result_t *res, hp_error_t *err)
{
    const hp_model_t *m = &llm->model;
    int Vm = m->cfg.vocab_size, V = m->sample_vocab, spec = p->speculative;
    int rc, tok, keep;
    hp_decoder_t d;
    hp_sampler_t sm = {0};
    int *ids = spec ? malloc(((size_t)spec + 1) * sizeof(int)) : NULL;
    float *rows = spec ? malloc(((size_t)spec + 1) * Vm * sizeof(float)) : NULL;
    float *prob = spec ? malloc((size_t)V * sizeof(float)) : NULL;

    memset(res, 0, sizeof(*res));
    if ((spec && (!ids || !rows || !prob)) || hp_sampler_init(&sm, V) != 0) {
        rc = hp_error_set(err, HP_ENOMEM, "generate: out of memory");
        goto out_nodec;
    }
    if ((rc = hp_decoder_init(&d, llm, p, err)) != HP_OK)
        goto out_nodec;

    int cancel = 0;
    rc = hp_decoder_next(&d, &sm, logits, &tok, err);
    while (rc == HP_OK && !d.done && !(cancel = flush_text(&d, emit, ud))) {
        /* tok: sampled and counted, not yet fed to the model */
        int n = hp_decoder_draft(&d, ids + 1);
        res->passes++;
        if (n == 0) {
            rc = hp_forward(m, seq, ws, &tok, NULL, 1, NULL, HP_LOGITS_LAST,
                            logits, err);
            if (rc == HP_OK)
                rc = hp_decoder_next(&d, &sm, logits, &tok, err);
            continue;
        }
        /* verify [tok, drafts] in one pass; row j follows ids[j] */
        ids[0] = tok;
        rc = hp_forward_verify(m, seq, ws, ids, n + 1, rows, err);
        if (rc == HP_OK)
            rc = hp_decoder_accept(&d, &sm, prob, rows, Vm, ids + 1, n, &keep,
                                   &tok, err);
        if (rc == HP_OK)
            rc = hp_forward_accept(m, seq, ws, keep, err);
    }
    if (rc == HP_OK && !cancel)
        cancel = flush_text(&d, emit, ud);
    res->finish = cancel ? HP_FINISH_CANCEL : d.finish;
    res->n_tokens = d.n_tokens;
    res->drafted = d.drafted;
    res->accepted = d.accepted;
    res->tokens = malloc(((size_t)d.n_tokens + 1) * sizeof(int));
    if (res->tokens && d.n_tokens)
        memcpy(res->tokens, d.ids + d.n_prompt,
               (size_t)d.n_tokens * sizeof(int));
    else if (rc == HP_OK)
        rc = hp_error_set(err, HP_ENOMEM, "generate: out of memory");
    hp_decoder_free(&d);
out_nodec:
    free(ids);
    free(rows);
    free(prob);
    hp_sampler_free(&sm);
    return rc;
}
