/*
 * test_backend_run.h - the model run the backend tests compare across
 * backends (test_backend.c, test_cuda_backend.c): a prefill in pieces of
 * 16 (the chunked recurrence), single-token steps, one batched step of
 * two sequences, then one more where the first wants only its argmax
 * (greedy: on a device its logits stay there); every logit to the host,
 * the argmax as a one-hot row.
 */
#ifndef HYPIC_ENGINE_TEST_BACKEND_RUN_H
#define HYPIC_ENGINE_TEST_BACKEND_RUN_H

#include <string.h>

#include "engine/forward/dump.h"
#include "engine/forward/forward.h"
#include "engine/forward/sampler.h"

#define TBR_PROMPT 37
#define TBR_STEPS  4
/* logits rows a run writes */
#define TBR_ROWS (TBR_PROMPT + TBR_STEPS + 4)

/* out [TBR_ROWS, vocab]; the first sequence's state dumped to the file
 * dump unless it is NULL. */
static inline int tbr_run(const hp_model_t *m, float *out, const char *dump,
                          hp_error_t *err)
{
    const int V = m->cfg.vocab_size;
    int ids[TBR_PROMPT], rc;
    for (int i = 0; i < TBR_PROMPT; i++)
        ids[i] = (i * 7919 + 13) % V;
    hp_fwd_plan_t plan = {16, 0, 2, 1};
    hp_fwd_ws_t ws;
    hp_seq_t s[2];
    if ((rc = hp_fwd_ws_init(&ws, m, &plan, err)) != HP_OK)
        return rc;
    hp_seq_init(&s[0], m, err);
    hp_seq_init(&s[1], m, err);
    rc = hp_forward(m, &s[0], &ws, ids, NULL, TBR_PROMPT, NULL, HP_LOGITS_ALL,
                    out, err);
    out += (size_t)TBR_PROMPT * V;
    for (int t = 0; t < TBR_STEPS && rc == HP_OK; t++) {
        rc = hp_forward(m, &s[0], &ws, &ids[t + 1], NULL, 1, NULL,
                        HP_LOGITS_LAST, out, err);
        out += V;
    }
    if (rc == HP_OK)
        rc = hp_forward(m, &s[1], &ws, ids, NULL, 5, NULL, HP_LOGITS_NONE, NULL,
                        err);
    hp_fwd_item_t it[2] = {{.seq = &s[0], .ids = &ids[3], .T = 1},
                           {.seq = &s[1], .ids = &ids[5], .T = 1}};
    if (rc == HP_OK)
        rc = hp_forward_batch(m, it, 2, &ws, err);
    int next[2];
    for (int i = 0; i < 2 && rc == HP_OK; i++) {
        if (it[i].status != HP_OK)
            rc = hp_error_set(err, it[i].status, "%s", it[i].err.msg);
        else if (it[i].best)
            rc = hp_error_set(err, HP_EINTERNAL, "best without argmax");
        else
            memcpy(out, it[i].logits, (size_t)V * 4);
        next[i] = rc == HP_OK ? hp_argmax(out, V) : 0;
        out += V;
    }
    hp_fwd_item_t g[2] = {{.seq = &s[0], .ids = &next[0], .T = 1, .argmax = 1},
                          {.seq = &s[1], .ids = &next[1], .T = 1}};
    if (rc == HP_OK)
        rc = hp_forward_batch(m, g, 2, &ws, err);
    if (rc == HP_OK &&
        (g[0].status != HP_OK || g[1].status != HP_OK || !g[0].best ||
         g[1].best || !g[1].logits ||
         (g[0].logits && hp_argmax(g[0].logits, V) != *g[0].best)))
        rc = hp_error_set(err, HP_EINTERNAL, "argmax step: best %s, logits %s",
                          g[0].best ? "set" : "missing",
                          g[0].logits ? "disagree" : "missing");
    if (rc == HP_OK) {
        memset(out, 0, (size_t)V * 4);
        out[*g[0].best] = 1.0f;
        memcpy(out + V, g[1].logits, (size_t)V * 4);
    }
    if (rc == HP_OK && dump)
        rc = hp_dump_state(dump, &s[0], err);
    hp_seq_free(&s[0]);
    hp_seq_free(&s[1]);
    hp_fwd_ws_free(&ws);
    return rc;
}

#endif
