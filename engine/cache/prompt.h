/*
 * prompt.h - a prompt as the engine runs it: split on the separator into
 * segments (hp_seg.h), each tokenized on its own, the separators dropped,
 * the segments' tokens concatenated (DESIGN §3-4: every mode runs this same
 * token sequence and differs only in what it reuses).
 */
#ifndef HP_PROMPT_H
#define HP_PROMPT_H

#include <stdint.h>

#include "engine/contract/hp_seg.h"
#include "engine/model/llm.h"

#define HP_PROMPT_MAX_SEGS 1024

typedef struct {
    int start; /* first token index in ids */
    int len;   /* tokens */
    hp_seg_role_t role;
    uint8_t id[16]; /* segment id over (model fingerprint, role, bytes) */
} hp_prompt_seg_t;

typedef struct {
    int *ids; /* [n] */
    int n;
    hp_prompt_seg_t *segs; /* [n_segs] */
    int n_segs;
} hp_prompt_t;

/* Builds the prompt. Errors: HP_EBADINPUT (more than HP_PROMPT_MAX_SEGS
 * segments, or no tokens at all), HP_ENOMEM, tokenizer errors. */
int hp_prompt_build(hp_prompt_t *p, const hp_llm_t *llm, const char *text,
                    size_t len, const char *sep, hp_error_t *err);
void hp_prompt_free(hp_prompt_t *p);

#endif
