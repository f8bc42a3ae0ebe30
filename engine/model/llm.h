/*
 * llm.h - a servable model: weights, tokenizer and the token ids that end
 * a generation, loaded from one Hugging Face model directory.
 */
#ifndef HP_LLM_H
#define HP_LLM_H

#include "engine/contract/hp_error.h"
#include "engine/model/model.h"
#include "engine/tokenizer/tokenizer.h"

#define HP_LLM_MAX_STOP_IDS 16

typedef struct {
    hp_model_t model;
    hp_tokenizer_t *tok;
    int stop_ids[HP_LLM_MAX_STOP_IDS]; /* config eos + <|im_end|>, ... */
    int n_stop_ids;
} hp_llm_t;

/* Loads DIR (config.json, safetensors, tokenizer.json). Checks that the
 * tokenizer fits the embedding table. Errors as hp_model_load, plus
 * HP_EMODEL naming tokenizer.json. */
int hp_llm_load(hp_llm_t *llm, const char *dir, hp_error_t *err);
/* The same with the model on backend be (hp_model_load_on). */
int hp_llm_load_on(hp_llm_t *llm, const char *dir, const hp_backend_t *be,
                   hp_error_t *err);
void hp_llm_free(hp_llm_t *llm);

/* Tokenizes text into a malloc'd array (*ids, *n). */
int hp_llm_tokenize(const hp_llm_t *llm, const char *text, size_t len,
                    int **ids, int *n, hp_error_t *err);

#endif
