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

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "engine/forward/dump.h"
#include "engine/forward/forward.h"
#include "engine/forward/kvbuf.h"
#include "engine/forward/sampler.h"
#include "engine/forward/seq.h"
#include "engine/forward/spec.h"
#include "kernels/cpu/hk_cpu.h"
#include "t/lib/tap.h"

#define TBR_PROMPT 37
#define TBR_STEPS  4
/* logits rows a run writes */
#define TBR_ROWS (TBR_PROMPT + TBR_STEPS + 4)

/* got against want: ids exact, values within one float ulp plus 1e-9
 * (the lse summed in another order on a device; test_sampler.c) */
static inline int tbr_same_lp(const hp_logprobs_t *got,
                              const hp_logprobs_t *want)
{
    int same = got->token == want->token && got->n_top == want->n_top;
    for (int j = -1; same && j < want->n_top; j++) {
        const float g = j < 0 ? got->logprob : got->top_lp[j];
        const float w = j < 0 ? want->logprob : want->top_lp[j];
        same = (j < 0 || got->top_id[j] == want->top_id[j]) &&
               fabsf(g - w) <= 1.1920929e-7f * fabsf(w) + 1e-9f;
    }
    return same;
}

/* A logprobs item's entries from its candidates (raw logits cr, lse)
 * against hp_logprobs on its fetched logits: greedy (the token
 * hp_logprobs_first, hp_argmax's) and for some candidates, n_top 0, 5,
 * 20. */
static inline int tbr_check_lp(const float *logits, int V, const float *cr,
                               const int *ci, double lse, int k,
                               hp_error_t *err)
{
    const int first = hp_logprobs_first(cr, ci, k);
    if (first != hp_argmax(logits, V))
        return hp_error_set(err, HP_EINTERNAL,
                            "logprobs: the candidates' first %d, the argmax %d",
                            first, hp_argmax(logits, V));
    const int toks[4] = {first, ci[1], ci[k / 2], ci[k - 1]};
    for (int t = 0; t < 4; t++)
        for (int n = 0; n <= HP_LOGPROBS_MAX_TOP; n += n ? 15 : 5) {
            hp_logprobs_t got, want;
            hp_logprobs(&want, logits, V, toks[t], n);
            if (hp_logprobs_from(&got, lse, cr, ci, k, toks[t], n) != 0 ||
                !tbr_same_lp(&got, &want))
                return hp_error_set(err, HP_EINTERNAL,
                                    "logprobs of %d (n_top %d): %g where the "
                                    "logits give %g",
                                    toks[t], n, got.logprob, want.logprob);
        }
    return HP_OK;
}

/* A tokenizer shorter than the embedding table (models pad it): the ids
 * tbr_run chooses among, over the candidates' k = 256 and leaving ~40 %
 * of a small table out, where a device's argmax would often land. */
#define TBR_SAMPLE_VOCAB(V) ((V) / 2 + 37 < (V) ? (V) / 2 + 37 : (V))

/* A device's candidates for a topk item against hk_topk on its logits,
 * fetched after them (hp_forward_fetch_logits): the same tokens in the
 * same order, probabilities to the normalizer's rounding; with logprobs,
 * their raw logits exactly and the entries formed from them
 * (tbr_check_lp). */
static inline int tbr_check_cands(const hp_model_t *m, hp_fwd_ws_t *ws,
                                  hp_fwd_item_t *it, hp_error_t *err)
{
    const int k = hp_fwd_topk(m);
    const int V = m->sample_vocab;
    float *p = malloc((size_t)k * sizeof(float));
    int *idx = malloc((size_t)k * sizeof(int));
    float *cp = malloc((size_t)k * sizeof(float));
    float *cr = malloc((size_t)k * sizeof(float));
    int *ci = malloc((size_t)k * sizeof(int));
    double lse = 0.0;
    int rc = p && idx && cp && cr && ci
                 ? HP_OK
                 : hp_error_set(err, HP_ENOMEM, "test: memory");
    if (rc == HP_OK && it->logprobs && (!it->cand_raw || !it->cand_lse))
        rc = hp_error_set(err, HP_EINTERNAL, "logprobs item: no raw logits");
    if (rc == HP_OK) { /* before the fetch: it reuses the host buffers */
        memcpy(cp, it->cand_p, (size_t)k * sizeof(float));
        memcpy(ci, it->cand_idx, (size_t)k * sizeof(int));
        if (it->logprobs) {
            memcpy(cr, it->cand_raw, (size_t)k * sizeof(float));
            lse = *it->cand_lse;
        }
        rc = hp_forward_fetch_logits(m, ws, it, err);
    }
    if (rc == HP_OK && !it->logits)
        rc = hp_error_set(err, HP_EINTERNAL, "topk item: no logits fetched");
    if (rc == HP_OK) {
        hk_topk(p, idx, NULL, NULL, it->logits, V, k, it->inv_t);
        for (int i = 0; i < k && rc == HP_OK; i++)
            if (ci[i] != idx[i] || fabsf(cp[i] - p[i]) > 1e-5f + 1e-4f * p[i])
                rc = hp_error_set(err, HP_EINTERNAL,
                                  "topk candidate %d: %d (p %g) where the "
                                  "logits give %d (p %g)",
                                  i, ci[i], cp[i], idx[i], p[i]);
        for (int i = 0; it->logprobs && i < k && rc == HP_OK; i++)
            if (cr[i] != it->logits[ci[i]])
                rc = hp_error_set(err, HP_EINTERNAL,
                                  "candidate %d: raw logit %g, the row's %g", i,
                                  cr[i], it->logits[ci[i]]);
        if (rc == HP_OK && it->logprobs)
            rc = tbr_check_lp(it->logits, V, cr, ci, lse, k, err);
    }
    free(p);
    free(idx);
    free(cp);
    free(cr);
    free(ci);
    return rc;
}

/* out [TBR_ROWS, vocab]; the first sequence's state dumped to the file
 * dump unless it is NULL. Tokens are chosen among m->sample_vocab (the
 * callers leave out much of the table, TBR_SAMPLE_VOCAB, so a device
 * reading past it errs). */
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
        next[i] = rc == HP_OK ? hp_argmax(out, m->sample_vocab) : 0;
        out += V;
    }
    /* the second samples: on a device only its candidates come over
     * (hp_backend_topk), then its logits on demand */
    hp_fwd_item_t g[2] = {{.seq = &s[0], .ids = &next[0], .T = 1, .argmax = 1},
                          {.seq = &s[1],
                           .ids = &next[1],
                           .T = 1,
                           .topk = 1,
                           .inv_t = 1.25,
                           .logprobs = 1}};
    const int host = hp_backend_host_memory(m->be);
    if (rc == HP_OK)
        rc = hp_forward_batch(m, g, 2, &ws, err);
    if (rc == HP_OK &&
        (g[0].status != HP_OK || g[1].status != HP_OK || !g[0].best ||
         g[1].best || !g[1].logits != !host || !g[1].cand_p != !!host ||
         *g[0].best >= m->sample_vocab ||
         (g[0].logits &&
          hp_argmax(g[0].logits, m->sample_vocab) != *g[0].best)))
        rc = hp_error_set(err, HP_EINTERNAL,
                          "argmax and topk step: best %s, logits %s, "
                          "candidates %s",
                          g[0].best ? "set" : "missing",
                          g[0].logits ? "disagree" : "missing",
                          g[1].cand_p ? "sent" : "not sent");
    if (rc == HP_OK && !host)
        rc = tbr_check_cands(m, &ws, &g[1], err);
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

/* The KVBuffer run (tbr_kvbuf): greedy steps of chunkwise decode after the
 * prompt (buffers flushing every TBK_CAP entries), one batched step of
 * that sequence with a KV-only one (a short prompt through its buffers),
 * then verification steps of TBK_DRAFT drafts each on a third sequence:
 * the drafts are the first run's greedy tokens, the last one made wrong
 * every other step, so both full and partial acceptance run. */
#define TBK_STEPS 10
#define TBK_CAP   4
#define TBK_SPEC  4
#define TBK_DRAFT 3
/* logits rows and tokens a run writes */
#define TBK_ROWS (TBK_STEPS + 2 + TBK_SPEC * (TBK_DRAFT + 1))
#define TBK_TOKS (TBK_STEPS + TBK_SPEC)

/* out [TBK_ROWS, vocab], toks [TBK_TOKS]: the chunkwise greedy tokens,
 * then the tokens each verification step accepted up to (its `next`). */
static inline int tbr_kvbuf(const hp_model_t *m, float *out, int *toks,
                            hp_error_t *err)
{
    const hp_model_config_t *c = &m->cfg;
    const int V = c->vocab_size;
    int ids[TBR_PROMPT], rc;
    for (int i = 0; i < TBR_PROMPT; i++)
        ids[i] = (i * 7919 + 13) % V;
    hp_fwd_plan_t plan = {16, 0, 2, TBK_DRAFT + 1};
    hp_kvbuf_config_t kc;
    hp_kvbuf_config_default(&kc, c->lin_k_heads, c->lin_v_heads, c->lin_k_dim,
                            c->lin_v_dim);
    kc.cap = TBK_CAP;
    kc.max_step = TBK_DRAFT + 1;
    kc.n_blocks = 3 * c->n_layers * (kc.cap_kvonly / kc.block_tokens + 3);
    kc.be = m->be;
    hp_kvbuf_pool_t pool;
    hp_fwd_ws_t ws;
    hp_seq_t s[3];
    if ((rc = hp_kvbuf_pool_init(&pool, &kc, err)) != HP_OK)
        return rc;
    if ((rc = hp_fwd_ws_init(&ws, m, &plan, err)) != HP_OK) {
        hp_kvbuf_pool_free(&pool);
        return rc;
    }
    for (int i = 0; i < 3; i++)
        hp_seq_init(&s[i], m, err);
    float *row = out;
    /* chunkwise greedy decode */
    rc = hp_forward(m, &s[0], &ws, ids, NULL, TBR_PROMPT, NULL, HP_LOGITS_LAST,
                    row, err);
    if (rc == HP_OK)
        rc = hp_seq_kvbuf_open(&s[0], &pool, err);
    for (int t = 0; t < TBK_STEPS && rc == HP_OK; t++) {
        toks[t] = hp_argmax(row, V);
        row += V;
        if (t + 1 < TBK_STEPS)
            rc = hp_forward(m, &s[0], &ws, &toks[t], NULL, 1, NULL,
                            HP_LOGITS_LAST, row, err);
    }
    /* a batched step with a KV-only sequence */
    if (rc == HP_OK)
        rc = hp_seq_kvbuf_open(&s[1], &pool, err);
    if (rc == HP_OK)
        rc = hp_forward(m, &s[1], &ws, ids, NULL, 5, NULL, HP_LOGITS_NONE, NULL,
                        err);
    hp_fwd_item_t it[2] = {{.seq = &s[0], .ids = &toks[TBK_STEPS - 1], .T = 1},
                           {.seq = &s[1], .ids = &ids[5], .T = 1}};
    if (rc == HP_OK)
        rc = hp_forward_batch(m, it, 2, &ws, err);
    for (int i = 0; i < 2 && rc == HP_OK; i++) {
        if (it[i].status != HP_OK)
            rc = hp_error_set(err, it[i].status, "%s", it[i].err.msg);
        else
            memcpy(row, it[i].logits, (size_t)V * 4);
        row += V;
    }
    /* verification */
    float *vrow = row;
    if (rc == HP_OK)
        rc = hp_forward(m, &s[2], &ws, ids, NULL, TBR_PROMPT, NULL,
                        HP_LOGITS_LAST, vrow, err);
    if (rc == HP_OK)
        rc = hp_seq_kvbuf_open(&s[2], &pool, err);
    int x0 = rc == HP_OK ? hp_argmax(vrow, V) : 0, done = 1;
    for (int j = 0; j < TBK_SPEC && rc == HP_OK; j++) {
        int in[TBK_DRAFT + 1], d[TBK_DRAFT], next;
        in[0] = x0;
        for (int i = 0; i < TBK_DRAFT; i++)
            d[i] = in[i + 1] = toks[(done + i) % TBK_STEPS];
        if (j % 2)
            d[TBK_DRAFT - 1] = in[TBK_DRAFT] = (d[TBK_DRAFT - 1] + 1) % V;
        rc = hp_forward_verify(m, &s[2], &ws, in, TBK_DRAFT + 1, row, err);
        if (rc != HP_OK)
            break;
        int a = hp_spec_accept_greedy(row, V, d, TBK_DRAFT, &next);
        rc = hp_forward_accept(m, &s[2], &ws, a + 1, err);
        row += (size_t)(TBK_DRAFT + 1) * V;
        toks[TBK_STEPS + j] = next;
        x0 = next;
        done += a + 1;
    }
    for (int i = 0; i < 3; i++)
        hp_seq_free(&s[i]);
    hp_fwd_ws_free(&ws);
    hp_kvbuf_pool_free(&pool);
    return rc;
}

/* One batched decode step of B plain items (fresh sequences, the same
 * token each) and what it cost: ops issued and host-link transfers (counted at
 * the backend seam, any backend), host waits for the device. want: 0
 * every item wants its logits, 1 only its argmax, 2 every other item
 * only its argmax (item 0 its logits), 3 its log-probabilities (greedy:
 * the candidates at temperature 1 with their raw logits and lse).
 * B <= TBR_MAX_B. */
#ifndef TBR_MAX_B
#define TBR_MAX_B 16
#endif
typedef struct {
    unsigned long ops, transfers, waits;
    unsigned long long down; /* bytes hp_backend_download copied */
} tbr_counts_t;

static inline int tbr_step_counts(const hp_model_t *m, int B, int want,
                                  tbr_counts_t *n, hp_error_t *err)
{
    hp_fwd_plan_t plan = {16, 0, TBR_MAX_B, 1};
    hp_fwd_ws_t ws;
    hp_seq_t s[TBR_MAX_B];
    hp_fwd_item_t it[TBR_MAX_B];
    int ids[TBR_MAX_B], rc, k = 0;
    memset(n, 0, sizeof(*n));
    if (B < 1 || B > TBR_MAX_B)
        return hp_error_set(err, HP_EBADINPUT, "B = %d", B);
    if ((rc = hp_fwd_ws_init(&ws, m, &plan, err)) != HP_OK)
        return rc;
    for (; k < B && rc == HP_OK; k++) {
        rc = hp_seq_init(&s[k], m, err);
        /* one token for all: a MoE layer then routes every row to the
         * same experts (its per-expert ops grow with the experts a batch
         * reaches, up to all of them, not with its rows) */
        ids[k] = 13 % m->cfg.vocab_size;
        it[k] = (hp_fwd_item_t){.seq = &s[k],
                                .ids = &ids[k],
                                .T = 1,
                                .argmax = want == 1 || (want == 2 && k % 2),
                                .topk = want == 3,
                                .logprobs = want == 3,
                                .inv_t = 1.0};
    }
    const hp_backend_t *be = m->be;
    unsigned long o0 = hp_backend_op_count(be);
    unsigned long t0 = hp_backend_transfer_count(be);
    unsigned long w0 = hp_backend_device_waits(be);
    unsigned long long d0 = hp_backend_download_bytes(be);
    if (rc == HP_OK)
        rc = hp_forward_batch(m, it, B, &ws, err);
    n->ops = hp_backend_op_count(be) - o0;
    n->transfers = hp_backend_transfer_count(be) - t0;
    n->waits = hp_backend_device_waits(be) - w0;
    n->down = hp_backend_download_bytes(be) - d0;
    const int host = hp_backend_host_memory(be);
    for (int i = 0; i < B && rc == HP_OK; i++)
        if (it[i].status != HP_OK)
            rc = hp_error_set(err, it[i].status, "%s", it[i].err.msg);
        else if (!it[i].argmax != !it[i].best ||
                 (!it[i].argmax && !it[i].topk && !it[i].logits) ||
                 (it[i].topk && !it[i].logits != !host) ||
                 (it[i].topk && !host && (!it[i].cand_raw || !it[i].cand_lse)))
            rc = hp_error_set(err, HP_EINTERNAL, "item %d: results missing", i);
    while (k > 0)
        hp_seq_free(&s[--k]);
    hp_fwd_ws_free(&ws);
    return rc;
}

/* The step's ops, transfers and waits do not grow with its plain decode
 * items: B = 1, 4 and 16 (the mixed form from B = 4: at 1 it has no
 * argmax) cost the same. Checked for each form of item; waits at most
 * most_waits. The log-probabilities form copies no row down (on a device:
 * the candidates decide; on the host there is nothing to copy). Returns
 * the B = 16 step's counts of the mixed form. */
static inline tbr_counts_t tbr_check_counts(const hp_model_t *m,
                                            const char *name,
                                            unsigned long most_waits)
{
    static const int Bs[3] = {1, 4, TBR_MAX_B};
    static const char *forms[4] = {"logits", "argmax", "mixed", "logprobs"};
    tbr_counts_t n[3] = {{0}}, mixed = {0};
    hp_error_t err = {0};
    for (int want = 0; want < 4; want++) {
        int rc = HP_OK, same = 1;
        for (int i = want == 2; i < 3 && rc == HP_OK; i++) {
            rc = tbr_step_counts(m, Bs[i], want, &n[i], &err);
            same &= i == (want == 2) || (n[i].ops == n[i - 1].ops &&
                                         n[i].transfers == n[i - 1].transfers &&
                                         n[i].waits == n[i - 1].waits);
        }
        ok(rc == HP_OK && same && n[2].waits <= most_waits,
           "%s on %s: a batched step of 1, 4, 16 plain decode items (%s) "
           "issues the same ops (%lu, %lu, %lu), transfers (%lu, %lu, %lu) "
           "and waits (%lu, %lu, %lu; <= %lu) %s",
           name, hp_backend_name(m->be), forms[want], n[0].ops, n[1].ops,
           n[2].ops, n[0].transfers, n[1].transfers, n[2].transfers, n[0].waits,
           n[1].waits, n[2].waits, most_waits, rc == HP_OK ? "" : err.msg);
        if (want == 2)
            mixed = n[2];
        if (want == 0 || want == 3)
            ok(rc == HP_OK &&
                   (want == 3 || hp_backend_host_memory(m->be)
                        ? n[2].down == 0
                        : n[2].down == (unsigned long long)TBR_MAX_B *
                                           m->cfg.vocab_size * sizeof(float)),
               "%s on %s: a step of %d %s items copies %llu bytes of logits "
               "down",
               name, hp_backend_name(m->be), TBR_MAX_B, forms[want], n[2].down);
    }
    return mixed;
}

#endif
