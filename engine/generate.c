/*
 * generate.c - the decode loop of one sequence: the step-wise decoder
 * (sched.h) plus one forward pass per token, or, with speculative
 * decoding, one verification pass per prompt-lookup draft.
 */
#include "engine/generate.h"

#include <stdlib.h>
#include <string.h>

#include "engine/sched.h"
#include "engine/spec.h"

/* Appends the decoder's newest token to out once it has been counted. */
static void record(const hp_sched_dec_t *d, int *out, int *n)
{
    if (d->n_tokens > *n)
        out[(*n)++] = d->last;
}

/* Hands the decoder's ready text to emit; 1 if emit asked to stop. */
static int flush_text(hp_sched_dec_t *d, hp_gen_emit_fn emit, void *ud)
{
    const char *text;
    size_t n = hp_sched_dec_ready(d, &text);
    if (n == 0)
        return 0;
    int stop = emit ? emit(ud, text, n, d->done ? -1 : d->last) : 0;
    hp_sched_dec_take(d, n);
    return stop;
}

int hp_generate(const hp_llm_t *llm, hp_seq_t *seq, hp_fwd_ws_t *ws,
                float *logits, const hp_gen_params_t *p, hp_gen_emit_fn emit,
                void *ud, hp_gen_result_t *res, hp_error_t *err)
{
    const hp_model_t *m = &llm->model;
    int Vm = m->cfg.vocab_size, spec = p->speculative, rc, tok;
    /* Embedding tables are padded past the tokenizer: ids without a token
     * are never sampled. */
    size_t tv = hp_tokenizer_vocab_size(llm->tok);
    int V = tv < (size_t)Vm ? (int)tv : Vm;
    hp_sched_dec_t d;
    hp_sampler_t sm = {0};
    /* all = the prompt's ids, then the generated ones: what the drafter
     * looks up in, and (from n_prompt on) the result */
    int n_prompt = p->n_ctx > 0 ? p->n_ctx : 0, n_gen = 0;
    int *all = malloc(((size_t)n_prompt + p->max_tokens + 1) * sizeof(int));
    int *gen = all ? all + n_prompt : NULL;
    int *ids = spec ? malloc(((size_t)spec + 1) * sizeof(int)) : NULL;
    float *rows = spec ? malloc(((size_t)spec + 1) * Vm * sizeof(float)) : NULL;
    float *prob = spec ? malloc((size_t)V * sizeof(float)) : NULL;

    memset(res, 0, sizeof(*res));
    if (!all || (spec && (!ids || !rows || !prob)) ||
        hp_sampler_init(&sm, V) != 0) {
        rc = hp_error_set(err, HP_ENOMEM, "generate: out of memory");
        goto out_nodec;
    }
    if ((rc = hp_sched_dec_init(&d, llm, p, err)) != HP_OK)
        goto out_nodec;
    if (n_prompt)
        memcpy(all, p->ctx, (size_t)n_prompt * sizeof(int));

    int cancel = 0;
    rc = hp_sched_dec_next(&d, &sm, logits, &tok, err);
    record(&d, gen, &n_gen);
    while (rc == HP_OK && !d.done && !(cancel = flush_text(&d, emit, ud))) {
        /* tok: sampled and counted, not yet fed to the model */
        int n = spec
                    ? hp_spec_lookup(ids + 1, spec, all, n_prompt + n_gen, 3, 1)
                    : 0;
        res->passes++;
        if (n == 0) {
            rc = hp_forward(m, seq, ws, &tok, NULL, 1, NULL, HP_LOGITS_LAST,
                            logits, err);
            if (rc == HP_OK)
                rc = hp_sched_dec_next(&d, &sm, logits, &tok, err);
            record(&d, gen, &n_gen);
            continue;
        }
        /* verify [tok, drafts] in one pass; row j follows ids[j] */
        ids[0] = tok;
        rc = hp_forward_verify(m, seq, ws, ids, n + 1, rows, err);
        if (rc != HP_OK)
            break;
        for (int j = 0; j <= n && V < Vm; j++) /* rows of stride V */
            memmove(rows + (size_t)j * V, rows + (size_t)j * Vm,
                    (size_t)V * sizeof(float));
        int next,
            acc = p->sampling.temperature > 0.0f
                      ? hp_spec_accept_sampled(&sm, prob, rows, ids + 1, n,
                                               &p->sampling, &d.rng, &next)
                      : hp_spec_accept_greedy(rows, V, ids + 1, n, &next);
        res->drafted += n;
        res->accepted += acc;
        int keep = 1; /* tok, then the accepted drafts while going on */
        for (int j = 1; j <= acc && rc == HP_OK && !d.done; j++) {
            rc = hp_sched_dec_push(&d, ids[j], err);
            record(&d, gen, &n_gen);
            if (rc == HP_OK && !d.done)
                keep++;
        }
        if (rc == HP_OK)
            rc = hp_forward_accept(m, seq, ws, keep, err);
        if (rc != HP_OK || d.done)
            break;
        /* the model's own token where the drafts stopped: the next one to
         * feed, chosen without a fresh forward pass */
        rc = hp_sched_dec_push(&d, next, err);
        record(&d, gen, &n_gen);
        tok = next;
    }
    if (rc == HP_OK && !cancel)
        cancel = flush_text(&d, emit, ud);
    res->finish = cancel ? HP_FINISH_CANCEL : d.finish;
    res->n_tokens = n_gen;
    if (n_prompt)
        memmove(all, gen, (size_t)n_gen * sizeof(int));
    res->tokens = all;
    all = NULL;
    hp_sched_dec_free(&d);
out_nodec:
    free(all);
    free(ids);
    free(rows);
    free(prob);
    hp_sampler_free(&sm);
    return rc;
}
