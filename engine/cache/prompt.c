/* prompt.c - segment-wise tokenization of a prompt (see prompt.h). */
#include "engine/cache/prompt.h"

#include <stdlib.h>
#include <string.h>

int hp_prompt_build(hp_prompt_t *p, const hp_llm_t *llm, const char *text,
                    size_t len, const char *sep, hp_error_t *err)
{
    hp_seg_t *segs = malloc(HP_PROMPT_MAX_SEGS * sizeof(*segs));
    hp_tokenizer_ids_t all = {0};
    int rc = HP_OK;

    memset(p, 0, sizeof(*p));
    if (!segs)
        return hp_error_set(err, HP_ENOMEM, "prompt: out of memory");
    int n = hp_seg_split(segs, HP_PROMPT_MAX_SEGS, text, len, sep, strlen(sep));
    if (n < 0) {
        free(segs);
        return hp_error_set(err, HP_EBADINPUT,
                            "prompt has more than %d segments",
                            HP_PROMPT_MAX_SEGS);
    }
    p->segs = calloc((size_t)n, sizeof(*p->segs));
    if (!p->segs)
        rc = hp_error_set(err, HP_ENOMEM, "prompt: out of memory");
    for (int i = 0; i < n && rc == HP_OK; i++) {
        size_t before = all.n;
        rc =
            hp_tokenizer_encode(llm->tok, segs[i].data, segs[i].len, &all, err);
        p->segs[i].start = (int)before;
        p->segs[i].len = (int)(all.n - before);
        p->segs[i].role = segs[i].role;
        hp_seg_id(p->segs[i].id, llm->model.fingerprint, segs[i].role,
                  segs[i].data, segs[i].len);
    }
    p->n_segs = n;
    free(segs);
    if (rc == HP_OK && all.n == 0)
        rc = hp_error_set(err, HP_EBADINPUT, "prompt has no tokens");
    if (rc == HP_OK) {
        p->ids = malloc(all.n * sizeof(int));
        if (!p->ids)
            rc = hp_error_set(err, HP_ENOMEM, "prompt: out of memory");
        for (size_t i = 0; rc == HP_OK && i < all.n; i++)
            p->ids[i] = all.ids[i];
        p->n = (int)all.n;
    }
    hp_tokenizer_ids_free(&all);
    if (rc != HP_OK)
        hp_prompt_free(p);
    return rc;
}

void hp_prompt_free(hp_prompt_t *p)
{
    free(p->ids);
    free(p->segs);
    memset(p, 0, sizeof(*p));
}
