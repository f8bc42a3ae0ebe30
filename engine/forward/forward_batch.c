/*
 * forward_batch.c - one decode step of many sequences as one pass
 * (forward.h, hp_forward_batch). Rows are laid out sequence after
 * sequence; the projections, MLPs and LM head run over all rows at once,
 * conv, recurrence and attention over each sequence's own rows. A
 * speculative verification is a sequence with several rows; its raw conv
 * inputs wait in the workspace for hp_forward_accept.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "engine/forward/forward.h"
#include "engine/forward/forward_impl.h"

/* Per-item ints of the step, in the workspace (B_ITEMS). */
typedef struct {
    int *order; /* [live] items in row order */
    int *row;   /* [n] first row, -1 while unplaced */
    int *ctx;   /* [n] context after the step */
    int *vrow;  /* [n] first row among the verified (saved inputs) */
    int live, rows, vrows;
} plan_t;

/* A decode step through the KVBuffer (batched with its pool's others). */
static int is_kvdec(const hp_fwd_item_t *it)
{
    return it->status == HP_OK && !it->verify && it->seq->kvpool;
}

/* Checks an item and makes room for it: positions in the K/V caches and
 * KVBuffer entries in every linear layer, so no layer can refuse later.
 * Blocks once held stay with the buffer: a refusal changes nothing. */
static int admit(const hp_model_t *m, const hp_fwd_plan_t *plan,
                 hp_fwd_item_t *it)
{
    const hp_model_config_t *c = &m->cfg;
    hp_seq_t *s = it->seq;
    hp_error_t *err = &it->err;
    int rc;
    if (it->T < 1 || (!it->verify && it->T != 1))
        return hp_error_set(err, HP_EBADINPUT,
                            "forward: a batched step takes one token of a "
                            "sequence, or a verification (%d tokens)",
                            it->T);
    if (s->spec_T)
        return hp_error_set(err, HP_EBADINPUT,
                            "forward: a verification awaits "
                            "hp_forward_accept");
    if (it->T > plan->max_step || s->n_pos + it->T > plan->max_ctx)
        return hp_error_set(err, HP_ETOOLARGE,
                            "forward: %d tokens at position %d are past the "
                            "workspace's plan (max_step %d, max_ctx %d)",
                            it->T, s->n_pos, plan->max_step, plan->max_ctx);
    if (it->verify && (!s->kvpool || it->T > s->kvpool->cfg.max_step))
        return hp_error_set(err, HP_EBADINPUT,
                            "forward: verification needs open KVBuffers "
                            "and 1..%d tokens",
                            s->kvpool ? s->kvpool->cfg.max_step : 0);
    for (int t = 0; t < it->T; t++)
        if (it->ids[t] < 0 || it->ids[t] >= c->vocab_size)
            return hp_error_set(err, HP_EBADINPUT,
                                "token id %d outside the vocabulary (%d)",
                                it->ids[t], c->vocab_size);
    if ((rc = hp_seq_reserve(s, s->n_pos + it->T, err)) != HP_OK)
        return rc;
    for (int l = 0; s->kvpool && l < c->n_layers; l++) {
        hp_kvbuf_t *kb = &s->layers[l].kvb;
        if (kb->blocks &&
            (rc = hp_kvbuf_reserve(s->kvpool, &kb, 1, it->T, err)) != HP_OK)
            return rc;
    }
    return HP_OK;
}

/* Whether x's logits stay where the backend has them: it wants only its
 * argmax, or on a device only its sampler candidates. */
static int stays(const hp_model_t *m, const hp_fwd_item_t *x)
{
    return x->argmax || (x->topk > 0 && !x->verify && x->T == 1 &&
                         !hp_backend_host_memory(m->be));
}

/* Whether x wants only its sampler candidates (and gets them). */
static int wants_cands(const hp_model_t *m, const hp_fwd_item_t *x)
{
    return !x->argmax && stays(m, x);
}

/* Whether x is live, in class cls (0: a KVBuffer decode step of
 * pool kvp, 1: a recurrent step, 2: a verification), and its logits stay
 * on the device or not (am). */
static int in_class(const hp_model_t *m, const hp_fwd_item_t *x, int cls,
                    const hp_kvbuf_pool_t *kvp, int am)
{
    if (x->status != HP_OK || !stays(m, x) != !am)
        return 0;
    if (cls == 0)
        return is_kvdec(x) && x->seq->kvpool == kvp;
    return cls == 1 ? !is_kvdec(x) && !x->verify : x->verify;
}

/* Appends the unplaced items of a class to the order, those whose logits
 * stay on the device first. */
static void place_class(const hp_model_t *m, hp_fwd_item_t *it, int n,
                        plan_t *p, int cls, const hp_kvbuf_pool_t *kvp)
{
    for (int am = 1; am >= 0; am--)
        for (int j = 0; j < n; j++)
            if (p->row[j] < 0 && in_class(m, &it[j], cls, kvp, am)) {
                p->order[p->live++] = j;
                p->row[j] = 0; /* placed; the row comes below */
            }
}

/* Row order: the KVBuffer decode steps first, grouped by pool (each group
 * one hp_kvbuf_decode call over contiguous rows), then the recurrent
 * steps (one fused call), then the verifications; within each group the
 * greedy items first, so the rows whose logits go to the host are few
 * contiguous runs (one download each), not one per item. */
static void place(const hp_model_t *m, hp_fwd_item_t *it, int n, plan_t *p)
{
    p->live = p->rows = p->vrows = 0;
    for (int i = 0; i < n; i++)
        p->row[i] = -1;
    for (int i = 0; i < n; i++)
        if (is_kvdec(&it[i]) && p->row[i] < 0)
            place_class(m, it, n, p, 0, it[i].seq->kvpool);
    place_class(m, it, n, p, 1, NULL);
    place_class(m, it, n, p, 2, NULL);
    for (int k = 0; k < p->live; k++) {
        hp_fwd_item_t *x = &it[p->order[k]];
        p->row[p->order[k]] = p->rows;
        p->ctx[p->order[k]] = x->seq->n_pos + x->T;
        p->rows += x->T;
        p->vrow[p->order[k]] = x->verify ? p->vrows : -1;
        p->vrows += x->verify ? x->T : 0;
    }
}

/* Remembers where each verification's raw inputs go (hp_forward_accept
 * finds them by sequence); ws->spec has room for the plan's batch. */
static void note_specs(hp_fwd_ws_t *ws, const hp_fwd_item_t *it,
                       const plan_t *p)
{
    ws->n_spec = 0;
    ws->spec_rows = p->vrows;
    for (int k = 0; k < p->live; k++) {
        const hp_fwd_item_t *x = &it[p->order[k]];
        if (x->verify)
            ws->spec[ws->n_spec++] =
                (hp_fwd_spec_t){x->seq, p->vrow[p->order[k]]};
    }
}

/* A recurrent one-token step: neither through a KVBuffer nor a
 * verification (a run of them goes through hp_fwd_lin_step). */
static int is_step(const hp_fwd_item_t *it)
{
    return !is_kvdec(it) && !it->verify;
}

/* A Gated DeltaNet layer over every row. */
static int linear_step(const hp_model_t *m, int l, hp_fwd_ws_t *ws,
                       hp_fwd_item_t *it, const plan_t *p, float *y, float *x,
                       hp_error_t *err)
{
    const hp_model_config_t *c = &m->cfg;
    int Hk = c->lin_k_heads, Hv = c->lin_v_heads, dk = c->lin_k_dim;
    int dv = c->lin_v_dim, Kc = c->conv_kernel, cd = hp_cfg_conv_dim(c);
    size_t kd = (size_t)Hk * dk, vd = (size_t)Hv * dv;
    hp_kvbuf_t **bufs = hp_fwd_buf(ws, B_KVBUFS, 2 * (size_t)p->live);
    float *raw = p->vrows ? ws->buf[B_SPECQKV] : NULL;
    float *hcopy = p->vrows ? ws->buf[B_SPECCONV] : NULL;
    float *sscr =
        hp_fwd_buf(ws, B_SCRATCH,
                   hp_backend_gdn_step_scratch(m->be, p->live, Hk, Hv, dk, dv));
    hp_fwd_lin_t b;
    int rc = hp_fwd_lin_begin(m, l, ws, y, x, p->rows, &b, err);
    if (rc != HP_OK)
        return rc;
    if (!bufs || !sscr)
        return hp_error_set(err, HP_ENOMEM, "forward: out of memory");

    /* the pointer lists of the batched ops, one list (or two) at a time */
    float **sts = (float **)(void *)bufs, **cvs = sts + p->live;
    for (int k = 0; k < p->live;) {
        int i = p->order[k], r0 = p->row[i], T = it[i].T, R = 0;
        hp_seq_layer_t *sl = &it[i].seq->layers[l];
        if (it[i].verify) {
            /* Drafts may be rejected: convolve on a copy of the history
             * and keep the raw inputs; hp_forward_accept commits the
             * accepted ones (hp_backend_kvbuf_conv_commit). */
            hp_backend_copy(
                m->be, raw + ((size_t)l * p->vrows + p->vrow[i]) * cd,
                b.qkv + (size_t)r0 * cd, (size_t)T * cd * sizeof(float));
            hp_backend_copy(m->be, hcopy, sl->conv,
                            (size_t)cd * (Kc - 1) * sizeof(float));
            hp_fwd_lin_conv(m, l, &b, hcopy, r0, r0 + T);
            k++;
            continue;
        }
        if (is_step(&it[i])) { /* the next loop's, fused */
            k++;
            continue;
        }
        /* a run of KVBuffer steps, contiguous rows: conv, split, norms
         * and gates in one call */
        while (k + R < p->live && is_kvdec(&it[p->order[k + R]])) {
            sts[R] = it[p->order[k + R]].seq->layers[l].conv;
            R++;
        }
        hp_fwd_lin_conv_decode(m, l, &b, sts, r0, R);
        k += R;
    }

    for (int k = 0; k < p->live && rc == HP_OK;) {
        int i = p->order[k], r0 = p->row[i], R = 1;
        hp_seq_t *s = it[i].seq;
        float *o = b.o + (size_t)r0 * vd;
        const float *q = b.q + (size_t)r0 * kd, *kk = b.k + (size_t)r0 * kd;
        const float *v = b.v + (size_t)r0 * vd, *g = b.g + (size_t)r0 * Hv;
        const float *be = b.beta + (size_t)r0 * Hv;
        if (is_kvdec(&it[i])) {
            /* the run of steps sharing this pool: contiguous rows */
            bufs[0] = &s->layers[l].kvb;
            while (k + R < p->live && R < s->kvpool->cfg.max_batch &&
                   is_kvdec(&it[p->order[k + R]]) &&
                   it[p->order[k + R]].seq->kvpool == s->kvpool) {
                bufs[R] = &it[p->order[k + R]].seq->layers[l].kvb;
                R++;
            }
            rc = hp_kvbuf_decode(s->kvpool, bufs, R, o, q, kk, v, g, be, err);
        } else if (it[i].verify) {
            bufs[0] = &s->layers[l].kvb;
            rc = hp_kvbuf_verify(s->kvpool, bufs, 1, it[i].T, o, q, kk, v, g,
                                 be, err);
        } else {
            /* a run of recurrent one-token steps, contiguous rows: conv,
             * norms, gates and recurrence in one call */
            for (R = 0; k + R < p->live && is_step(&it[p->order[k + R]]); R++) {
                hp_seq_layer_t *sl = &it[p->order[k + R]].seq->layers[l];
                sts[R] = sl->S;
                cvs[R] = sl->conv;
            }
            hp_fwd_lin_step(m, l, &b, sts, cvs, r0, R, sscr);
        }
        k += R;
    }
    if (rc == HP_OK)
        hp_fwd_lin_end(m, l, &b, x, p->rows);
    return rc;
}

/* A gated attention layer over every row. */
static int full_step(const hp_model_t *m, int l, hp_fwd_ws_t *ws,
                     hp_fwd_item_t *it, const plan_t *p, const int *pos,
                     float *y, float *x, float *scratch, hp_error_t *err)
{
    const hp_model_config_t *c = &m->cfg;
    int hd = c->head_dim;
    size_t qd = (size_t)c->n_heads * hd, kvd = c->kv_row;
    float **kcs = hp_fwd_buf(ws, B_DECODE, 5 * (size_t)p->live);
    hp_fwd_att_t b;
    int rc = hp_fwd_att_begin(m, l, ws, y, x, pos, p->rows, &b, err);
    if (rc != HP_OK)
        return rc;
    if (!kcs)
        return hp_error_set(err, HP_ENOMEM, "forward: out of memory");
    float **vcs = kcs + p->live;
    int *nctx = (int *)(void *)(vcs + p->live);
    for (int k = 0; k < p->live;) {
        int i = p->order[k], r0 = p->row[i], R = 0;
        if (it[i].T > 1) {
            hp_fwd_att_seq(m, &it[i].seq->layers[l], &b, pos, r0, it[i].T,
                           p->ctx[i], scratch);
            k++;
            continue;
        }
        /* a run of one-token steps, contiguous rows: one K/V store and
         * one attention call over their caches */
        for (; k + R < p->live && it[p->order[k + R]].T == 1; R++) {
            hp_seq_layer_t *sl = &it[p->order[k + R]].seq->layers[l];
            kcs[R] = sl->k;
            vcs[R] = sl->v;
            nctx[R] = p->ctx[p->order[k + R]];
        }
        hp_backend_kv_store_decode(m->be, kcs, vcs, b.k + (size_t)r0 * kvd,
                                   b.v + (size_t)r0 * kvd, pos + r0, R,
                                   (int)kvd);
        hp_backend_attention_decode(
            m->be, b.o + (size_t)r0 * qd, b.q + (size_t)r0 * qd,
            (const float *const *)kcs, (const float *const *)vcs, nctx, R,
            c->n_heads, c->n_kv_heads, hd, 1.0f / sqrtf((float)hd), scratch);
        k += R;
    }
    hp_fwd_att_end(m, l, &b, x, p->rows);
    return HP_OK;
}

/* A failed step leaves the verified sequences as they were: their
 * pending buffer entries go (conv histories and n_pos were not touched). */
static void unverify(const hp_model_t *m, hp_fwd_item_t *it, const plan_t *p)
{
    for (int k = 0; k < p->live; k++) {
        hp_seq_t *s = it[p->order[k]].seq;
        if (!it[p->order[k]].verify)
            continue;
        for (int l = 0; l < m->cfg.n_layers; l++)
            if (s->layers[l].kvb.pending)
                hp_kvbuf_truncate(s->kvpool, &s->layers[l].kvb, 0, NULL);
    }
}

/* Logits rows [r0, r1) to the host's copy hl (nothing when empty). */
static void download_rows(const hp_model_t *m, float *hl, const float *lg,
                          size_t r0, size_t r1)
{
    const size_t V = (size_t)m->cfg.vocab_size;
    if (r1 > r0)
        hp_backend_download(m->be, hl + r0 * V, lg + r0 * V,
                            (r1 - r0) * V * sizeof(float));
}

int hp_fwd_topk(const hp_model_t *m)
{
    return m->sample_vocab < HP_BACKEND_TOPK_MAX ? m->sample_vocab
                                                 : HP_BACKEND_TOPK_MAX;
}

/* The sampler's candidates of the topk items, one hp_backend_topk per run
 * of consecutive rows at one temperature (a step's requests mostly share
 * theirs); 2k values a row cross to the host instead of a vocabulary. */
static int take_cands(const hp_model_t *m, hp_fwd_ws_t *ws, hp_fwd_item_t *it,
                      const plan_t *p, const float *lg, hp_error_t *err)
{
    const size_t V = (size_t)m->cfg.vocab_size, K = (size_t)hp_fwd_topk(m);
    float *cp = hp_fwd_buf(ws, B_CANDP, (size_t)p->rows * K);
    int *ci = (int *)hp_fwd_buf(ws, B_CANDI, (size_t)p->rows * K);
    float *cr = hp_fwd_buf(ws, B_CANDR, (size_t)p->rows * K);
    double *cl = (double *)hp_fwd_buf(ws, B_CANDL, 2 * (size_t)p->rows);
    if (!cp || !ci || !cr || !cl)
        return hp_error_set(err, HP_EINTERNAL, "forward: workspace plan");
    for (int k = 0; k < p->live;) {
        hp_fwd_item_t *a = &it[p->order[k]];
        if (!wants_cands(m, a)) {
            k++;
            continue;
        }
        size_t r0 = (size_t)p->row[p->order[k]], n = 0;
        for (; k < p->live; k++, n++) {
            hp_fwd_item_t *x = &it[p->order[k]];
            if (!wants_cands(m, x) || x->inv_t != a->inv_t ||
                !x->logprobs != !a->logprobs ||
                (size_t)p->row[p->order[k]] != r0 + n)
                break;
            x->cand_p = cp + (r0 + n) * K;
            x->cand_idx = ci + (r0 + n) * K;
            x->cand_raw = x->logprobs ? cr + (r0 + n) * K : NULL;
            x->cand_lse = x->logprobs ? cl + r0 + n : NULL;
        }
        hp_backend_topk(m->be, cp + r0 * K, ci + r0 * K,
                        a->logprobs ? cr + r0 * K : NULL,
                        a->logprobs ? cl + r0 : NULL, lg + r0 * V, (int)n,
                        m->sample_vocab, (int)V, (int)K, a->inv_t);
    }
    return HP_OK;
}

/* The step's results where the host reads them: every row's argmax when
 * an item wants only that, a topk item's candidates (on a device their
 * logits then stay there: a vocabulary of floats per row is the step's
 * largest copy), the logits of the other items copied to host memory
 * where backend memory is not. */
static int take_logits(const hp_model_t *m, hp_fwd_ws_t *ws, hp_fwd_item_t *it,
                       const plan_t *p, const float *lg, hp_error_t *err)
{
    const size_t V = (size_t)m->cfg.vocab_size;
    const int host = hp_backend_host_memory(m->be);
    int any = 0, cands = 0;
    int *best = hp_fwd_buf(ws, B_BEST, (size_t)p->rows);
    float *hl =
        host ? (float *)lg : hp_fwd_buf(ws, B_HOSTLOGITS, (size_t)p->rows * V);
    if (!best || !hl)
        return hp_error_set(err, HP_EINTERNAL, "forward: workspace plan");
    for (int k = 0; k < p->live; k++) {
        hp_fwd_item_t *a = &it[p->order[k]];
        any |= a->argmax;
        cands |= wants_cands(m, a);
        a->cand_p = NULL;
        a->cand_idx = NULL;
        a->cand_raw = NULL;
        a->cand_lse = NULL;
        a->row = p->row[p->order[k]];
    }
    if (any)
        hp_backend_argmax(m->be, best, lg, p->rows, m->sample_vocab, (int)V);
    if (cands) {
        int rc = take_cands(m, ws, it, p, lg, err);
        if (rc != HP_OK)
            return rc;
    }
    size_t run0 = 0, run1 = 0; /* rows [run0, run1) still to download */
    for (int k = 0; k < p->live; k++) {
        hp_fwd_item_t *a = &it[p->order[k]];
        size_t r0 = (size_t)p->row[p->order[k]];
        a->best = a->argmax ? best + r0 : NULL;
        a->logits = NULL;
        if (stays(m, a) && !host)
            continue;
        a->logits = hl + r0 * V;
        if (host)
            continue;
        if (r0 != run1) { /* a new run of rows the host reads */
            download_rows(m, hl, lg, run0, run1);
            run0 = r0;
        }
        run1 = r0 + (size_t)a->T;
    }
    download_rows(m, hl, lg, run0, run1);
    return hp_backend_sync(m->be, err);
}

int hp_forward_fetch_logits(const hp_model_t *m, hp_fwd_ws_t *ws,
                            hp_fwd_item_t *it, hp_error_t *err)
{
    const size_t V = (size_t)m->cfg.vocab_size;
    if (it->logits)
        return HP_OK;
    float *lg = hp_fwd_buf(ws, B_LOGITS, 0);
    float *hl = hp_fwd_buf(ws, B_HOSTLOGITS, 0);
    if (!lg || !hl)
        return hp_error_set(err, HP_EINTERNAL, "forward: no step's logits");
    download_rows(m, hl, lg, (size_t)it->row, (size_t)it->row + (size_t)it->T);
    it->logits = hl + (size_t)it->row * V;
    return hp_backend_sync(m->be, err);
}

int hp_forward_batch(const hp_model_t *m, hp_fwd_item_t *it, int n,
                     hp_fwd_ws_t *ws, hp_error_t *err)
{
    const hp_model_config_t *c = &m->cfg;
    int H = c->hidden, V = c->vocab_size, cd = hp_cfg_conv_dim(c), rc;
    if (n > ws->plan.max_batch)
        return hp_error_set(err, HP_ETOOLARGE,
                            "forward: a batch of %d sequences, the "
                            "workspace's plan is %d (max_batch)",
                            n, ws->plan.max_batch);
    int *ints = hp_fwd_buf(ws, B_ITEMS, 4 * (size_t)(n > 0 ? n : 1));
    if (!ints)
        return hp_error_set(err, HP_ENOMEM, "forward: out of memory");
    plan_t p = {ints, ints + n, ints + 2 * n, ints + 3 * n, 0, 0, 0};

    for (int i = 0; i < n; i++) {
        it[i].logits = NULL;
        it[i].err.code = HP_OK;
        it[i].status = admit(m, &ws->plan, &it[i]);
    }
    place(m, it, n, &p);
    ws->n_spec = 0;
    if (p.live == 0)
        return HP_OK;

    size_t ascr = 1;
    for (int k = 0; k < p.live; k++) {
        int i = p.order[k];
        size_t a =
            hp_backend_attention_scratch(m->be, it[i].T, p.ctx[i], c->n_heads,
                                         c->n_kv_heads, c->head_dim, m->prec);
        ascr = a > ascr ? a : ascr;
    }
    int *pos = hp_fwd_buf(ws, B_POS, (size_t)p.rows);
    int *ids = hp_fwd_buf(ws, B_IDS, (size_t)p.rows);
    float *x = hp_fwd_buf(ws, B_X, (size_t)p.rows * H);
    float *y = hp_fwd_buf(ws, B_Y, (size_t)p.rows * H);
    float *scr = hp_fwd_buf(ws, B_SCRATCH, ascr);
    int vr = p.vrows;
    if (!pos || !ids || !x || !y || !scr ||
        (vr &&
         (!hp_fwd_buf(ws, B_SPECQKV, (size_t)c->n_layers * vr * cd) ||
          !hp_fwd_buf(ws, B_SPECCONV, (size_t)cd * (c->conv_kernel - 1)))))
        return hp_error_set(err, HP_ENOMEM, "forward: out of memory");
    note_specs(ws, it, &p);

    /* every row's id and position gathered, one embedding call */
    for (int k = 0; k < p.live; k++) {
        const hp_fwd_item_t *a = &it[p.order[k]];
        int r0 = p.row[p.order[k]];
        for (int t = 0; t < a->T; t++) {
            pos[r0 + t] = a->seq->n_pos + t;
            ids[r0 + t] = a->ids[t];
        }
    }
    hp_backend_embed(m->be, x, &m->embed, ids, p.rows);

    rc = HP_OK;
    for (int l = 0; l < c->n_layers && rc == HP_OK; l++) {
        /* each part norms its input itself (with its projections) */
        if (c->layer_kind[l] == HP_LAYER_LINEAR)
            rc = linear_step(m, l, ws, it, &p, y, x, err);
        else
            rc = full_step(m, l, ws, it, &p, pos, y, x, scr, err);
        if (rc == HP_OK)
            rc = hp_fwd_mlp(m, l, ws, y, x, p.rows, err);
    }
    float *lg =
        rc == HP_OK ? hp_fwd_buf(ws, B_LOGITS, (size_t)p.rows * V) : NULL;
    if (rc == HP_OK && !lg)
        rc = hp_error_set(err, HP_ENOMEM, "forward: out of memory");
    /* the logits follow the layers without a wait between: one sync, in
     * take_logits, reports a failure of either before anything commits */
    if (rc == HP_OK) {
        hp_backend_rmsnorm(m->be, y, x, m->final_norm, p.rows, H, c->rms_eps);
        hp_backend_linear(m->be, lg, y, &m->lm_head, p.rows);
        rc = take_logits(m, ws, it, &p, lg, err);
    }
    if (rc != HP_OK) {
        unverify(m, it, &p);
        ws->n_spec = 0;
        return rc;
    }
    for (int k = 0; k < p.live; k++) {
        hp_fwd_item_t *a = &it[p.order[k]];
        if (a->verify) {
            a->seq->spec_start = a->seq->n_pos;
            a->seq->spec_T = a->T;
        }
        a->seq->n_pos = p.ctx[p.order[k]];
    }
    return HP_OK;
}

int hp_forward_verify(const hp_model_t *m, hp_seq_t *seq, hp_fwd_ws_t *ws,
                      const int *ids, int T, float *logits, hp_error_t *err)
{
    hp_fwd_item_t it = {.seq = seq, .ids = ids, .T = T, .verify = 1};
    int rc = hp_forward_batch(m, &it, 1, ws, err);
    if (rc == HP_OK && it.status != HP_OK) {
        *err = it.err;
        rc = it.status;
    }
    if (rc == HP_OK)
        memcpy(logits, it.logits,
               (size_t)T * m->cfg.vocab_size * sizeof(float));
    return rc;
}

int hp_forward_accept(const hp_model_t *m, hp_seq_t *seq, hp_fwd_ws_t *ws,
                      int keep, hp_error_t *err)
{
    const hp_model_config_t *c = &m->cfg;
    int T = seq->spec_T, cd = hp_cfg_conv_dim(c), Kc = c->conv_kernel;
    const hp_fwd_spec_t *sp = NULL;
    if (!T || keep < 0 || keep > T)
        return hp_error_set(err, HP_EBADINPUT,
                            "forward: accept %d of %d verified tokens", keep,
                            T);
    for (int i = 0; i < ws->n_spec && !sp; i++)
        if (ws->spec[i].seq == seq)
            sp = &ws->spec[i];
    if (!sp)
        return hp_error_set(err, HP_EINTERNAL, "forward: drafts' inputs lost");
    const float *raw = ws->buf[B_SPECQKV];
    for (int l = 0; l < c->n_layers; l++) {
        hp_seq_layer_t *sl = &seq->layers[l];
        if (!sl->kvb.blocks)
            continue;
        hp_backend_kvbuf_conv_commit(
            m->be, sl->conv, raw + ((size_t)l * ws->spec_rows + sp->row) * cd,
            keep, cd, Kc);
        int rc = hp_kvbuf_truncate(seq->kvpool, &sl->kvb, keep, err);
        if (rc != HP_OK)
            return rc;
    }
    seq->n_pos = seq->spec_start + keep;
    seq->spec_T = 0;
    return HP_OK;
}
