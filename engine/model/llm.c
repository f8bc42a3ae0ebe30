/* llm.c - model + tokenizer + stop tokens of one model directory. */
#include "engine/model/llm.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void add_stop(hp_llm_t *llm, int id)
{
    if (id < 0 || llm->n_stop_ids == HP_LLM_MAX_STOP_IDS)
        return;
    for (int i = 0; i < llm->n_stop_ids; i++)
        if (llm->stop_ids[i] == id)
            return;
    llm->stop_ids[llm->n_stop_ids++] = id;
}

int hp_llm_load(hp_llm_t *llm, const char *dir, hp_error_t *err)
{
    return hp_llm_load_on(llm, dir, hp_backend_cpu(), err);
}

int hp_llm_load_on(hp_llm_t *llm, const char *dir, const hp_backend_t *be,
                   hp_error_t *err)
{
    char path[1200];
    int rc;
    memset(llm, 0, sizeof(*llm));
    if ((rc = hp_model_load_on(&llm->model, dir, be, err)) != HP_OK)
        return rc;
    snprintf(path, sizeof(path), "%s/tokenizer.json", dir);
    if ((rc = hp_tokenizer_load(&llm->tok, path, err)) != HP_OK) {
        hp_model_free(&llm->model);
        return rc;
    }
    size_t tv = hp_tokenizer_vocab_size(llm->tok);
    if (tv > (size_t)llm->model.cfg.vocab_size) {
        hp_llm_free(llm);
        return hp_error_set(err, HP_EMODEL,
                            "%s: %zu tokens but config.json vocab_size is %d",
                            path, tv, llm->model.cfg.vocab_size);
    }
    llm->model.sample_vocab = (int)tv;
    for (int i = 0; i < llm->model.cfg.n_eos; i++)
        add_stop(llm, llm->model.cfg.eos_ids[i]);
    /* Chat models end a turn with <|im_end|> whatever config.json says. */
    add_stop(llm, hp_tokenizer_token_id(llm->tok, "<|im_end|>"));
    add_stop(llm, hp_tokenizer_token_id(llm->tok, "<|endoftext|>"));
    return HP_OK;
}

void hp_llm_free(hp_llm_t *llm)
{
    hp_tokenizer_free(llm->tok);
    hp_model_free(&llm->model);
    memset(llm, 0, sizeof(*llm));
}

int hp_llm_tokenize(const hp_llm_t *llm, const char *text, size_t len,
                    int **ids, int *n, hp_error_t *err)
{
    hp_tokenizer_ids_t v = {0};
    int rc = hp_tokenizer_encode(llm->tok, text, len, &v, err);
    if (rc != HP_OK) {
        hp_tokenizer_ids_free(&v);
        return rc;
    }
    *ids = malloc((v.n ? v.n : 1) * sizeof(int));
    if (!*ids) {
        hp_tokenizer_ids_free(&v);
        return hp_error_set(err, HP_ENOMEM, "tokenize: out of memory");
    }
    for (size_t i = 0; i < v.n; i++)
        (*ids)[i] = v.ids[i];
    *n = (int)v.n;
    hp_tokenizer_ids_free(&v);
    return HP_OK;
}
