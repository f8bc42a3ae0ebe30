/*
 * generate.h - the decode loop of one sequence: sample, stop on stop ids,
 * stop strings or the token budget, and stream the text out in pieces that
 * are whole UTF-8 characters and can no longer turn into a stop string.
 */
#ifndef HP_GENERATE_H
#define HP_GENERATE_H

#include "engine/forward/forward.h"
#include "engine/forward/gmask.h"
#include "engine/forward/sampler.h"
#include "engine/model/llm.h"

#define HP_GEN_MAX_STOP 8

typedef struct {
    int max_tokens;
    hp_sampling_t sampling;
    const char *stop[HP_GEN_MAX_STOP]; /* stop strings (not emitted) */
    int n_stop;
    int ignore_eos; /* keep going past the model's stop ids */
    /* speculative decoding (needs the sequence's KVBuffers open): drafts
     * of up to `speculative` tokens by prompt lookup over ctx (the prompt),
     * verified in one pass; 0 = off */
    int speculative;
    const int *ctx; /* [n_ctx] prompt ids the drafter looks up in */
    int n_ctx;
    /* 1: keep every token's log-probabilities (hp_logprobs) with
     * top_logprobs (0..HP_LOGPROBS_MAX_TOP) alternatives */
    int logprobs;
    int top_logprobs;
    /* structured output: the grammar the text must match, and the trie
     * of the vocabulary its masks are computed over (gmask.h); both
     * outlive the generation. NULL: free text. Logits are masked before
     * sampling, so log-probabilities are the masked distribution's; no
     * speculation, no device argmax. */
    const hp_grammar_t *grammar;
    const hp_gmask_vocab_t *gvocab;
} hp_gen_params_t;

typedef enum {
    HP_FINISH_LENGTH = 0, /* max_tokens reached */
    HP_FINISH_STOP,       /* stop id or stop string */
    HP_FINISH_CANCEL      /* emit asked to stop */
} hp_finish_t;

/* Text that is safe to show, with the token that completed it (-1 for
 * the final flush). Return non-zero to cancel the generation. */
typedef int (*hp_gen_emit_fn)(void *ud, const char *text, size_t len,
                              int token);

typedef struct {
    hp_finish_t finish;
    int n_tokens; /* generated tokens, the stop id excluded */
    int *tokens;  /* [n_tokens], malloc'd, caller frees */
    int drafted;  /* speculative tokens proposed */
    int accepted; /* ... and accepted */
    int passes;   /* forward passes of the decode (verifications count 1) */
} hp_gen_result_t;

/*
 * Generates from seq, whose prompt is already prefilled; `logits` [vocab]
 * are the prompt's last logits (overwritten as decoding goes on). emit may
 * be NULL. Returns HP_OK (res filled) or an error from the forward pass.
 */
int hp_generate(const hp_llm_t *llm, hp_seq_t *seq, hp_fwd_ws_t *ws,
                float *logits, const hp_gen_params_t *p, hp_gen_emit_fn emit,
                void *ud, hp_gen_result_t *res, hp_error_t *err);

#endif
