/*
 * test_forward_batch.c - one decode step of many sequences as one pass
 * (hp_forward_batch) against each sequence run alone (hp_forward,
 * hp_forward_verify): sequences of different lengths in every decode form
 * (recurrent, chunkwise, KV-only), some verifying drafts, on the three
 * test models. Logits within TOL, greedy tokens identical, folded states
 * equal; a bad item is left out without touching the others; every block
 * returns to the pool. And the workspace's plan: a call longer than it
 * runs in pieces with the same logits, jumps and a transition run across
 * pieces; a batch, an item or a context past it is refused. And a step
 * of plain decode items issues as many backend ops and transfers
 * whatever its batch (tbr_check_counts).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/forward/forward.h"
#include "engine/forward/kvbuf.h"
#include "engine/forward/sampler.h"
#include "engine/forward/seq.h"
#include "engine/model/model.h"
#include "engine/test/test_backend_run.h"
#include "engine/test/test_util.h"
#include "kernels/cpu/hk_cpu.h"
#include "t/lib/tap.h"
#include "t/lib/testrand.h"

/* The batch sums each projection as a GEMM over all rows, a sequence
 * alone as a GEMV (OpenBLAS's sums depend on the row count, so there are
 * no equal bits to ask for): the same products in another order, f32.
 * Two bounds: the largest difference over the largest |logit| and the L2
 * norm of the difference over the logits' (both measured 0.7-1.5e-5 on
 * these models, the size of chunkwise-vs-recurrent differences in
 * test_kvbuf_model, up to 1.9e-5). */
#define TOL    1e-4
#define TOL_L2 5e-5
#define N_SEQ  6
#define STEPS  24
#define DRAFT  5

enum { RECURRENT, CHUNKWISE, KVONLY };

typedef struct {
    hp_seq_t a, b;   /* batched, alone */
    int form, tok;   /* next token to feed */
    float *lb;       /* [DRAFT+1, V] alone's logits */
    int ctx[512], n; /* prompt + output, for drafts */
} pair_t;

/* Prefills both copies of a sequence identically. */
static int start(const hp_model_t *m, hp_kvbuf_pool_t *pool, hp_fwd_ws_t *ws,
                 pair_t *p, int P, int form, hp_error_t *err)
{
    int V = m->cfg.vocab_size, rc = HP_OK;
    p->form = form;
    p->n = P;
    for (int i = 0; i < P; i++) /* repeats, so some drafts get accepted */
        p->ctx[i] =
            i < 8 ? (int)((urand() + 1) * 0.5 * (V - 1)) : p->ctx[i - 8];
    hp_seq_t *s[2] = {&p->a, &p->b};
    for (int k = 0; k < 2 && rc == HP_OK; k++) {
        hp_seq_init(s[k], m, err);
        if (form == KVONLY)
            rc = hp_seq_kvbuf_open(s[k], pool, err);
        /* KV-only prompts go in pieces the buffer takes (max_step) */
        int piece = form == KVONLY ? pool->cfg.max_step : P;
        for (int o = 0; o < P && rc == HP_OK; o += piece)
            rc = hp_forward(m, s[k], ws, p->ctx + o, NULL,
                            P - o < piece ? P - o : piece, NULL, HP_LOGITS_LAST,
                            p->lb, err);
        if (rc == HP_OK && form == CHUNKWISE)
            rc = hp_seq_kvbuf_open(s[k], pool, err);
    }
    p->tok = hp_argmax(p->lb, V);
    p->ctx[p->n++] = p->tok;
    return rc;
}

static void check_plan(const char *name, const hp_model_t *m);

static void check(const char *root, const char *name)
{
    char dir[1024];
    hp_model_t m;
    hp_error_t err = {0};
    snprintf(dir, sizeof(dir), "%s/models/test/%s", root, name);
    if (hp_model_load(&m, dir, &err) != HP_OK) {
        ok(0, "%s: %s", name, err.msg);
        return;
    }
    const hp_model_config_t *c = &m.cfg;
    int V = c->vocab_size;
    hp_kvbuf_config_t kc;
    hp_kvbuf_config_default(&kc, c->lin_k_heads, c->lin_v_heads, c->lin_k_dim,
                            c->lin_v_dim);
    kc.cap = 8;         /* flush often */
    kc.cap_kvonly = 40; /* some KV-only sequences create their state */
    kc.max_step = 16;
    kc.n_blocks = 2 * N_SEQ * c->n_layers * 8;
    kc.max_batch = 2 * N_SEQ;
    hp_kvbuf_pool_t pool;
    hp_fwd_ws_t ws, ws1;
    hp_kvbuf_pool_init(&pool, &kc, &err);
    hp_fwd_plan_t plan = {HP_FWD_PIECE, 0, N_SEQ, kc.max_step};
    hp_fwd_ws_init(&ws, &m, &plan, &err);
    hp_fwd_ws_init(&ws1, &m, NULL, &err);

    static const int lens[N_SEQ] = {3, 17, 12, 90, 33, 130};
    static const int forms[N_SEQ] = {RECURRENT, CHUNKWISE, KVONLY,
                                     CHUNKWISE, KVONLY,    RECURRENT};
    pair_t p[N_SEQ];
    int rc = HP_OK;
    for (int i = 0; i < N_SEQ; i++) {
        p[i].lb = malloc((size_t)(DRAFT + 1) * V * sizeof(float));
        rc |= start(&m, &pool, &ws1, &p[i], lens[i], forms[i], &err);
    }
    ok(rc == HP_OK, "%s: %d sequences prefilled %s", name, N_SEQ,
       rc == HP_OK ? "" : err.msg);

    /* Greedy steps; every third step the buffered sequences verify a
     * draft (alone: hp_forward_verify), so decode and verify rows mix. */
    double worst = 0, worst2 = 0;
    int same = 1, verified = 0, accepted = 0;
    hp_fwd_item_t it[N_SEQ];
    int ids[N_SEQ][DRAFT + 1];
    for (int step = 0; step < STEPS && rc == HP_OK; step++) {
        for (int i = 0; i < N_SEQ; i++) {
            int T = 1;
            ids[i][0] = p[i].tok;
            if (p[i].form != RECURRENT && step % 3 == 2) {
                for (int d = 1; d <= DRAFT; d++) /* the prompt's continuation */
                    ids[i][d] = p[i].ctx[(p[i].n - 8 + d) % p[i].n];
                T = DRAFT + 1;
            }
            it[i] = (hp_fwd_item_t){
                .seq = &p[i].a, .ids = ids[i], .T = T, .verify = T > 1};
        }
        rc = hp_forward_batch(&m, it, N_SEQ, &ws, &err);
        for (int i = 0; i < N_SEQ && rc == HP_OK; i++) {
            pair_t *q = &p[i];
            rc = it[i].status;
            if (rc == HP_OK && it[i].verify)
                rc = hp_forward_verify(&m, &q->b, &ws1, ids[i], it[i].T, q->lb,
                                       &err);
            else if (rc == HP_OK)
                rc = hp_forward(&m, &q->b, &ws1, ids[i], NULL, 1, NULL,
                                HP_LOGITS_LAST, q->lb, &err);
            if (rc != HP_OK)
                break;
            double e, e2;
            test_rel_errs(q->lb, it[i].logits, (size_t)it[i].T * V, &e, &e2);
            worst = fmax(worst, e);
            worst2 = fmax(worst2, e2);
            /* greedy: accept drafts while they are the argmax (from the
             * batched logits; the alone ones must agree) */
            int keep = 1, next = hp_argmax(it[i].logits, V);
            same &= next == hp_argmax(q->lb, V);
            while (keep < it[i].T && ids[i][keep] == next) {
                q->ctx[q->n++] = next;
                next = hp_argmax(it[i].logits + (size_t)keep * V, V);
                same &= next == hp_argmax(q->lb + (size_t)keep * V, V);
                keep++;
            }
            if (it[i].verify) {
                verified++;
                accepted += keep - 1;
                rc = hp_forward_accept(&m, &q->a, &ws, keep, &err);
                if (rc == HP_OK)
                    rc = hp_forward_accept(&m, &q->b, &ws1, keep, &err);
            }
            q->tok = next;
            q->ctx[q->n++] = next;
        }
    }
    ok(rc == HP_OK && worst <= TOL && worst2 <= TOL_L2,
       "%s: batched logits = alone, %d steps of %d sequences, %d "
       "verifications (rel err %.2e max, %.2e L2) %s",
       name, STEPS, N_SEQ, verified, worst, worst2, rc == HP_OK ? "" : err.msg);
    ok(same,
       "%s: greedy tokens identical batched and alone (%d drafts "
       "accepted)",
       name, accepted);
    int pos_ok = 1;
    for (int i = 0; i < N_SEQ; i++)
        pos_ok &= p[i].a.n_pos == p[i].b.n_pos && p[i].a.n_pos == p[i].n - 1;
    ok(pos_ok, "%s: positions follow the tokens fed", name);

    /* A bad item is left out; the others run as if it were not there. */
    int bad = V + 5;
    it[0] = (hp_fwd_item_t){.seq = &p[1].a, .ids = &bad, .T = 1};
    it[1] = (hp_fwd_item_t){.seq = &p[2].a, .ids = &p[2].tok, .T = 1};
    it[2] = (hp_fwd_item_t){.seq = &p[0].a,
                            .ids = ids[0],
                            .T = 3,
                            .verify = 1}; /* recurrent: cannot verify */
    int n1 = p[1].a.n_pos, n0 = p[0].a.n_pos;
    rc = hp_forward_batch(&m, it, 3, &ws, &err);
    int rc2 = hp_forward(&m, &p[2].b, &ws1, &p[2].tok, NULL, 1, NULL,
                         HP_LOGITS_LAST, p[2].lb, &err);
    double e1 = 1, e2 = 1;
    if (rc == HP_OK && it[1].status == HP_OK)
        test_rel_errs(p[2].lb, it[1].logits, V, &e1, &e2);
    ok(rc == HP_OK && it[0].status == HP_EBADINPUT &&
           it[2].status == HP_EBADINPUT && it[1].status == HP_OK &&
           p[1].a.n_pos == n1 && p[0].a.n_pos == n0 && rc2 == HP_OK &&
           e1 <= TOL,
       "%s: bad items are left out (\"%s\"), the others run", name,
       it[0].err.msg);

    /* The folded running states agree too. */
    double es = 0;
    size_t ns = (size_t)c->lin_v_heads * c->lin_k_dim * c->lin_v_dim;
    rc = HP_OK;
    for (int i = 0; i < N_SEQ; i++) {
        if (i == 2) /* one step apart now */
            continue;
        rc |= hp_seq_kvbuf_close(&p[i].a, &err) |
              hp_seq_kvbuf_close(&p[i].b, &err);
        for (int l = 0; l < c->n_layers; l++)
            if (p[i].a.layers[l].S) {
                double e, el2;
                test_rel_errs(p[i].b.layers[l].S, p[i].a.layers[l].S, ns, &e,
                              &el2);
                es = fmax(es, e);
            }
    }
    ok(rc == HP_OK && es <= TOL, "%s: folded states agree (rel err %.2e)", name,
       es);
    for (int i = 0; i < N_SEQ; i++) {
        hp_seq_free(&p[i].a);
        hp_seq_free(&p[i].b);
        free(p[i].lb);
    }
    ok(pool.n_free_blk == kc.n_blocks && pool.n_free_st == kc.n_states,
       "%s: every block back in the pool", name);
    hp_kvbuf_pool_free(&pool);
    hp_fwd_ws_free(&ws);
    hp_fwd_ws_free(&ws1);
    check_plan(name, &m);
    tbr_check_counts(&m, name, 0);
    hp_model_free(&m);
}

/* Records the jumps of a call: how often each ran, and the transition
 * of run 1 per linear layer. */
typedef struct {
    const hp_model_config_t *c;
    float *tc; /* [n_lin][Hv, dk, dk] */
    int calls[2], bad;
} jrec_t;

static int rec_jump(void *ud, int l, int j, float *S, float *conv,
                    const float *Tc, hp_error_t *err)
{
    jrec_t *r = ud;
    if (j < 0 || j > 1 || (j == 1) != (Tc != NULL)) {
        r->bad++;
        return HP_OK;
    }
    r->calls[j]++;
    if (Tc)
        memcpy(r->tc + (size_t)r->c->slot[l] * r->c->trans_floats, Tc,
               r->c->trans_floats * sizeof(float));
    return HP_OK;
}

#define PLAN_T 70

static void check_plan(const char *name, const hp_model_t *m)
{
    const hp_model_config_t *c = &m->cfg;
    size_t V = (size_t)c->vocab_size, nt = (size_t)c->n_lin * c->trans_floats;
    hp_error_t err = {0};
    hp_fwd_ws_t big, small;
    hp_fwd_plan_t ps = {16, 128, 2, 4}; /* passes of 16 tokens */
    int ids[PLAN_T], after[2] = {10, 60}, rc[2];
    hp_seq_t s[2];
    float *lg[2] = {malloc(PLAN_T * V * 4), malloc(PLAN_T * V * 4)};
    jrec_t jr[2] = {{c, calloc(nt + 1, 4), {0, 0}, 0},
                    {c, calloc(nt + 1, 4), {0, 0}, 0}};
    /* (not from urand: the other checks' prompts stay as they were) */
    for (int i = 0; i < PLAN_T; i++)
        ids[i] = (int)(((size_t)i * 7919 + 13) % V);
    ok(hp_fwd_ws_init(&big, m, NULL, &err) == HP_OK &&
           hp_fwd_ws_init(&small, m, &ps, &err) == HP_OK &&
           hp_fwd_ws_bytes(m, &ps) < hp_fwd_ws_bytes(m, NULL),
       "%s: workspaces planned (%zu and %zu KiB)", name,
       hp_fwd_ws_bytes(m, NULL) >> 10, hp_fwd_ws_bytes(m, &ps) >> 10);
    void *mem = small.mem;

    hp_fwd_ws_t *ws[2] = {&big, &small};
    for (int k = 0; k < 2; k++) {
        hp_seq_init(&s[k], m, &err);
        rc[k] = hp_forward(m, &s[k], ws[k], ids, NULL, PLAN_T, NULL,
                           HP_LOGITS_ALL, lg[k], &err);
    }
    double e1 = 1, e2 = 1;
    if (rc[0] == HP_OK && rc[1] == HP_OK)
        test_rel_errs(lg[0], lg[1], PLAN_T * V, &e1, &e2);
    ok(rc[0] == HP_OK && rc[1] == HP_OK && s[1].n_pos == PLAN_T && e1 <= TOL &&
           e2 <= TOL_L2,
       "%s: %d tokens in passes of 16 give the logits of one pass (rel "
       "%.2e)",
       name, PLAN_T, e1);

    /* jumps at 10 and 60, the transition of [10, 60) across 4 passes */
    for (int k = 0; k < 2; k++) {
        hp_jumps_t jumps = {after, 2, 1, rec_jump, &jr[k]};
        hp_seq_reset(&s[k]);
        rc[k] = hp_forward(m, &s[k], ws[k], ids, NULL, PLAN_T, &jumps,
                           HP_LOGITS_NONE, NULL, &err);
    }
    e1 = 1;
    if (rc[0] == HP_OK && rc[1] == HP_OK && nt > 0)
        test_rel_errs(jr[0].tc, jr[1].tc, nt, &e1, &e2);
    ok(rc[0] == HP_OK && rc[1] == HP_OK && !jr[1].bad &&
           jr[1].calls[0] == c->n_lin && jr[1].calls[1] == c->n_lin &&
           (nt == 0 || e1 <= TOL),
       "%s: jumps across passes run once per layer, the transition over "
       "them is one pass's (rel %.2e)",
       name, e1);

    /* past the plan: a batch, an item, a context */
    int tok[3] = {ids[0], ids[1], ids[2]};
    hp_fwd_item_t it[3];
    for (int k = 0; k < 3; k++)
        it[k] = (hp_fwd_item_t){.seq = &s[k % 2], .ids = tok, .T = 1};
    ok(hp_forward_batch(m, it, 3, &small, &err) == HP_ETOOLARGE,
       "%s: 3 sequences past a plan of 2: %s", name, err.msg);
    it[0].T = 5;
    it[0].verify = 1;
    ok(hp_forward_batch(m, it, 1, &small, &err) == HP_OK &&
           it[0].status == HP_ETOOLARGE,
       "%s: 5 tokens past a plan of 4 per item: %s", name, it[0].err.msg);
    int far = 200;
    ok(hp_forward(m, &s[1], &small, tok, &far, 1, NULL, HP_LOGITS_NONE, NULL,
                  &err) == HP_ETOOLARGE,
       "%s: position 200 past a plan of 128: %s", name, err.msg);
    hp_fwd_plan_t bad = {0, 0, 0, 0};
    hp_fwd_ws_t none;
    ok(hp_fwd_ws_init(&none, m, &bad, &err) == HP_EBADINPUT && !none.mem,
       "%s: a plan of no tokens is refused: %s", name, err.msg);
    ok(small.mem == mem, "%s: the workspace never moved", name);

    for (int k = 0; k < 2; k++) {
        hp_seq_free(&s[k]);
        free(lg[k]);
        free(jr[k].tc);
    }
    hp_fwd_ws_free(&big);
    hp_fwd_ws_free(&small);
}

int main(void)
{
    hk_matmul_init();
    return test_each_model(check);
}
