/*
 * test_kvbuf_model.c - KVBuffer decoding inside the model (forward.c with
 * open buffers) against the recurrent engine, on the committed test
 * models: chunkwise decode after a prefill, KV-only (prompt through the
 * buffer), speculative greedy with prompt-lookup drafts (same tokens as
 * plain greedy), and the folded state equal to the recurrent state.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/forward/forward.h"
#include "engine/forward/kvbuf.h"
#include "engine/forward/sampler.h"
#include "engine/forward/seq.h"
#include "engine/forward/spec.h"
#include "engine/model/model.h"
#include "engine/model/safetensors.h"
#include "engine/test/test_util.h"
#include "kernels/cpu/hk_cpu.h"
#include "t/lib/tap.h"

/* Same bound as test_model_parity's decode check: the same math in
 * another order, f32. */
#define TOL   1e-4
#define STEPS 40

/* Greedy decode of n tokens after prefilling ids[P]; logits of every step
 * into lg [n, V], tokens into out [n]. kv: KV-only (open before the
 * prompt), chunk (open after it), or neither. */
static int run(const hp_model_t *m, hp_kvbuf_pool_t *pool, int mode,
               const int *ids, int P, int n, int *out, float *lg, hp_seq_t *s,
               hp_fwd_ws_t *ws, hp_error_t *err)
{
    int V = m->cfg.vocab_size, rc;
    hp_seq_init(s, m, err);
    if (mode == 1 && (rc = hp_seq_kvbuf_open(s, pool, err)) != HP_OK)
        return rc;
    if ((rc = hp_forward(m, s, ws, ids, NULL, P, NULL, HP_LOGITS_LAST, lg,
                         err)) != HP_OK)
        return rc;
    if (mode == 2 && (rc = hp_seq_kvbuf_open(s, pool, err)) != HP_OK)
        return rc;
    for (int i = 0; i < n; i++) {
        out[i] = hp_argmax(lg + (size_t)i * V, V);
        if (i + 1 < n &&
            (rc = hp_forward(m, s, ws, &out[i], NULL, 1, NULL, HP_LOGITS_LAST,
                             lg + (size_t)(i + 1) * V, err)) != HP_OK)
            return rc;
    }
    return HP_OK;
}

static void check(const char *root, const char *name)
{
    char dir[1024], path[1200];
    hp_model_t m;
    hp_st_file_t g;
    hp_error_t err = {0};
    snprintf(dir, sizeof(dir), "%s/models/test/%s", root, name);
    snprintf(path, sizeof(path), "%s/golden.safetensors", dir);
    if (hp_model_load(&m, dir, &err) != HP_OK ||
        hp_st_open(&g, path, &err) != HP_OK) {
        ok(0, "%s: %s", name, err.msg);
        return;
    }
    const hp_model_config_t *c = &m.cfg;
    int V = c->vocab_size;
    const hp_st_tensor_t *tid = hp_st_find(&g, "prompt.1.ids");
    int P = (int)tid->shape[0];
    const int *ids = tid->data;

    hp_kvbuf_config_t kc;
    hp_kvbuf_config_default(&kc, c->lin_k_heads, c->lin_v_heads, c->lin_k_dim,
                            c->lin_v_dim);
    kc.cap = 8;         /* flush often */
    kc.cap_kvonly = 72; /* the 52-token prompt + 20 steps stay KV-only */
    kc.max_step = 64;
    kc.n_blocks = 4 * c->n_layers * 8;
    hp_kvbuf_pool_t pool;
    hp_kvbuf_pool_init(&pool, &kc, &err);
    hp_fwd_ws_t ws;
    hp_fwd_ws_init(&ws, &m, NULL, &err);

    int ta[STEPS], tb[STEPS], tcn[STEPS];
    float *la = malloc((size_t)STEPS * V * sizeof(float));
    float *lb = malloc((size_t)STEPS * V * sizeof(float));
    float *lc = malloc((size_t)STEPS * V * sizeof(float));
    hp_seq_t A, B, C;
    int rc = run(&m, NULL, 0, ids, P, STEPS, ta, la, &A, &ws, &err);
    rc |= run(&m, &pool, 2, ids, P, STEPS, tb, lb, &B, &ws, &err);
    double eb = test_rel_err(la, lb, (size_t)STEPS * V);
    ok(rc == HP_OK && eb <= TOL && !memcmp(ta, tb, sizeof(ta)),
       "%s: chunkwise decode (B 8) = recurrent, %d steps (logits rel err "
       "%.2e)",
       name, STEPS, eb);
    rc = run(&m, &pool, 1, ids, P, STEPS, tcn, lc, &C, &ws, &err);
    double ec = test_rel_err(la, lc, (size_t)STEPS * V);
    int first_S = -1;
    for (int l = 0; l < c->n_layers; l++)
        if (C.layers[l].kvb.blocks && first_S < 0)
            first_S = C.layers[l].kvb.S != NULL;
    ok(rc == HP_OK && ec <= TOL && !memcmp(ta, tcn, sizeof(ta)),
       "%s: KV-only prompt (%d) + decode = recurrent (rel err %.2e; state "
       "created: %s)",
       name, P, ec, first_S ? "yes" : "no");

    /* The folded running state equals the recurrent state. */
    rc = hp_seq_kvbuf_close(&B, &err) | hp_seq_kvbuf_close(&C, &err);
    double es = 0;
    size_t ns = (size_t)c->lin_v_heads * c->lin_k_dim * c->lin_v_dim;
    for (int l = 0; l < c->n_layers; l++)
        if (A.layers[l].S) {
            double e1 = test_rel_err(A.layers[l].S, B.layers[l].S, ns);
            double e2 = test_rel_err(A.layers[l].S, C.layers[l].S, ns);
            es = e1 > es ? e1 : es;
            es = e2 > es ? e2 : es;
        }
    ok(rc == HP_OK && es <= TOL,
       "%s: folded states = recurrent states (rel err %.2e)", name, es);

    /* Speculative greedy with prompt-lookup drafts. */
    hp_seq_t D;
    hp_seq_init(&D, &m, &err);
    float *rows = malloc((size_t)9 * V * sizeof(float));
    int ctx[512], len = P, x0, steps = 0, acc = 0;
    memcpy(ctx, ids, (size_t)P * sizeof(int));
    rc =
        hp_forward(&m, &D, &ws, ids, NULL, P, NULL, HP_LOGITS_LAST, rows, &err);
    rc |= hp_seq_kvbuf_open(&D, &pool, &err);
    x0 = hp_argmax(rows, V);
    ctx[len++] = x0;
    while (rc == HP_OK && len < P + STEPS) {
        int d[8], in[9], next;
        int n = hp_spec_lookup(d, 8, ctx, len, 3, 1);
        in[0] = x0;
        memcpy(in + 1, d, (size_t)n * sizeof(int));
        rc = hp_forward_verify(&m, &D, &ws, in, n + 1, rows, &err);
        if (rc != HP_OK)
            break;
        int a = hp_spec_accept_greedy(rows, V, d, n, &next);
        rc = hp_forward_accept(&m, &D, &ws, a + 1, &err);
        memcpy(ctx + len, d, (size_t)a * sizeof(int));
        len += a;
        ctx[len++] = x0 = next;
        acc += a;
        steps++;
    }
    ok(rc == HP_OK && !memcmp(ctx + P, ta, sizeof(ta)),
       "%s: speculative greedy = plain greedy (%d tokens in %d verify "
       "steps, %d drafts accepted) %s",
       name, STEPS, steps, acc, rc == HP_OK ? "" : err.msg);
    ok(D.n_pos == len - 1, "%s: positions follow the accepted tokens", name);

    free(rows);
    free(la);
    free(lb);
    free(lc);
    hp_seq_free(&A);
    hp_seq_free(&B);
    hp_seq_free(&C);
    hp_seq_free(&D);
    ok(pool.n_free_blk == kc.n_blocks, "%s: every block back in the pool",
       name);
    hp_kvbuf_pool_free(&pool);
    hp_fwd_ws_free(&ws);
    hp_st_close(&g);
    hp_model_free(&m);
}

int main(void)
{
    hk_matmul_init();
    return test_each_model(check);
}
