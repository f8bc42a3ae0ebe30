/*
 * test_model_parity.c - the whole forward pass against Hugging Face
 * transformers: for each committed test model (Qwen3.5 dense, Qwen3.5 MoE,
 * Qwen3-Next fused) the logits at every position and the states after
 * prefill must match golden.safetensors, written by tools/make_golden.py
 * from transformers in float32. Also: decode continuing a prefill equals
 * the prefill of the longer prompt, and greedy tokens match transformers.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/forward/forward.h"
#include "engine/forward/sampler.h"
#include "engine/forward/seq.h"
#include "engine/model/model.h"
#include "t/lib/tap.h"

/* Logits and states are compared relative to the tensor's largest
 * magnitude: f32 kernels (chunked GDN, blocked attention, OpenBLAS) sum in
 * other orders than PyTorch, ~1e-6 relative; 1e-4 is the bound. */
#define REL_TOL 1e-4
/* Decode vs prefill runs the recurrent GDN step instead of the chunk
 * form: the same math in another order, so the same bound. */
#define DECODE_TOL 1e-4

static const char *models[] = {"qwen35-dense", "qwen35-moe", "qwen3next"};

static double max_abs(const float *x, size_t n)
{
    double m = 0;
    for (size_t i = 0; i < n; i++)
        if (fabs(x[i]) > m)
            m = fabs(x[i]);
    return m;
}

/* max |a - b| / max |a| */
static double rel_err(const float *ref, const float *x, size_t n)
{
    double m = max_abs(ref, n), e = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)ref[i] - x[i]);
        if (!(d <= e))
            e = d;
    }
    return m > 0 ? e / m : e;
}

static const hp_st_tensor_t *want(const hp_st_file_t *g, const char *fmt, int i,
                                  int l)
{
    char name[128];
    /* some names use only i: the extra argument is ignored (C11 7.21.6.1) */
    // cppcheck-suppress wrongPrintfScanfArgNum
    snprintf(name, sizeof(name), fmt, i, l);
    return hp_st_find(g, name);
}

static void check_model(const char *root, const char *name)
{
    char dir[1024], path[1200];
    hp_model_t m;
    hp_st_file_t g;
    hp_error_t err = {0};
    snprintf(dir, sizeof(dir), "%s/models/test/%s", root, name);
    snprintf(path, sizeof(path), "%s/golden.safetensors", dir);
    if (!ok(hp_model_load(&m, dir, &err) == HP_OK, "%s loads", name)) {
        tap_diag("%s", err.msg);
        return;
    }
    if (!ok(hp_st_open(&g, path, &err) == HP_OK, "%s golden opens", name)) {
        tap_diag("%s", err.msg);
        hp_model_free(&m);
        return;
    }
    const hp_model_config_t *c = &m.cfg;
    int V = c->vocab_size;
    hp_fwd_ws_t ws;
    hp_fwd_ws_init(&ws, &m, NULL, &err);
    for (int i = 0;; i++) {
        const hp_st_tensor_t *tid = want(&g, "prompt.%d.ids", i, 0);
        if (!tid)
            break;
        int T = (int)tid->shape[0];
        const int *ids = tid->data;
        const hp_st_tensor_t *tl = want(&g, "prompt.%d.logits", i, 0);
        hp_seq_t seq;
        hp_seq_init(&seq, &m, &err);
        float *logits = malloc((size_t)T * V * sizeof(float));
        int rc = hp_forward(&m, &seq, &ws, ids, NULL, T, NULL, HP_LOGITS_ALL,
                            logits, &err);
        if (!ok(rc == HP_OK, "%s prompt %d (%d tokens) runs", name, i, T))
            tap_diag("%s", err.msg);
        double e = rel_err(tl->data, logits, (size_t)T * V);
        ok(e <= REL_TOL,
           "%s prompt %d: logits at all %d positions, rel err "
           "%.2e",
           name, i, T, e);

        /* states after prefill */
        double worst = 0;
        int missing = 0;
        for (int l = 0; l < c->n_layers; l++) {
            const hp_seq_layer_t *sl = &seq.layers[l];
            if (c->layer_kind[l] == HP_LAYER_LINEAR) {
                const hp_st_tensor_t *ts =
                    want(&g, "prompt.%d.layers.%d.linear_attn.state", i, l);
                const hp_st_tensor_t *tc = want(
                    &g, "prompt.%d.layers.%d.linear_attn.conv_state", i, l);
                if (!ts || !tc) {
                    missing++;
                    continue;
                }
                e = rel_err(ts->data, sl->S, ts->nbytes / 4);
                worst = e > worst ? e : worst;
                e = rel_err(tc->data, sl->conv, tc->nbytes / 4);
                worst = e > worst ? e : worst;
            } else {
                const hp_st_tensor_t *tk =
                    want(&g, "prompt.%d.layers.%d.self_attn.k", i, l);
                const hp_st_tensor_t *tv =
                    want(&g, "prompt.%d.layers.%d.self_attn.v", i, l);
                if (!tk || !tv) {
                    missing++;
                    continue;
                }
                e = rel_err(tk->data, sl->k, tk->nbytes / 4);
                worst = e > worst ? e : worst;
                e = rel_err(tv->data, sl->v, tv->nbytes / 4);
                worst = e > worst ? e : worst;
            }
        }
        ok(!missing && worst <= REL_TOL,
           "%s prompt %d: every layer's state/conv/K/V, worst rel err %.2e",
           name, i, worst);

        /* decode continuing a shorter prefill equals the long prefill */
        if (T >= 4) {
            int P = T / 2;
            hp_seq_t s2;
            hp_seq_init(&s2, &m, &err);
            float *lg = malloc((size_t)V * sizeof(float));
            double de = 0;
            rc = hp_forward(&m, &s2, &ws, ids, NULL, P, NULL, HP_LOGITS_LAST,
                            lg, &err);
            for (int t = P; t < T && rc == HP_OK; t++) {
                rc = hp_forward(&m, &s2, &ws, ids + t, NULL, 1, NULL,
                                HP_LOGITS_LAST, lg, &err);
                e = rel_err(logits + (size_t)t * V, lg, V);
                de = e > de ? e : de;
            }
            ok(rc == HP_OK && de <= DECODE_TOL,
               "%s prompt %d: decode after a %d-token prefill matches the "
               "full prefill (rel err %.2e)",
               name, i, P, de);
            free(lg);
            hp_seq_free(&s2);
        }

        /* greedy continuation equals transformers' generate() */
        const hp_st_tensor_t *tg = want(&g, "prompt.%d.greedy", i, 0);
        if (tg) {
            int n = (int)tg->shape[0], same = 1;
            const int *gold = tg->data;
            float *lg = malloc((size_t)V * sizeof(float));
            memcpy(lg, logits + (size_t)(T - 1) * V, (size_t)V * 4);
            for (int k = 0; k < n && same; k++) {
                int tok = hp_argmax(lg, V);
                if (tok != gold[k]) {
                    tap_diag("step %d: got %d want %d", k, tok, gold[k]);
                    same = 0;
                    break;
                }
                hp_forward(&m, &seq, &ws, &tok, NULL, 1, NULL, HP_LOGITS_LAST,
                           lg, &err);
            }
            ok(same, "%s prompt %d: %d greedy tokens equal transformers'", name,
               i, n);
            free(lg);
        }
        free(logits);
        hp_seq_free(&seq);
    }
    hp_fwd_ws_free(&ws);
    hp_st_close(&g);
    hp_model_free(&m);
}

int main(void)
{
    const char *root = getenv("HYPIC_ROOT") ? getenv("HYPIC_ROOT") : ".";
    for (size_t k = 0; k < sizeof(models) / sizeof(models[0]); k++)
        check_model(root, models[k]);
    return tap_done();
}
