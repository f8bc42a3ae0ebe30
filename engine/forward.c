/*
 * forward.c - one forward pass of the hybrid decoder (reference §5.2, §9):
 * embed; per layer pre-norm mixer (Gated DeltaNet or gated attention) and
 * pre-norm MLP (SwiGLU or MoE) with residuals; final norm; LM head.
 */
#include "engine/forward.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/hk_cpu.h"
#include "kernels/cpu/hk_kvbuf.h"

/* Measured best on AVX-512 (helper bench in test_gdn): C=16 beats 64 by
 * ~1.5x, the sgemms being small either way. */
#define GDN_CHUNK_DEFAULT 16

/* Named activation buffers of the workspace. */
enum {
    B_X,
    B_Y,
    B_QKV,
    B_CONV,
    B_Q,
    B_K,
    B_V,
    B_Z,
    B_BETA,
    B_G,
    B_O,
    B_P,
    B_GATE,
    B_UP,
    B_SCRATCH,
    B_ROUTE,
    B_XG,
    B_EO,
    B_POS,
    B_ROWS,
    B_MOEIDX,
    B_MOEW,
    B_TC,
    B_SPECQKV,
    B_SPECCONV,
    B_COUNT
};

void hp_fwd_ws_init(hp_fwd_ws_t *ws)
{
    ws->n = B_COUNT;
    ws->buf = calloc(B_COUNT, sizeof(*ws->buf));
    ws->cap = calloc(B_COUNT, sizeof(*ws->cap));
}

void hp_fwd_ws_free(hp_fwd_ws_t *ws)
{
    for (int i = 0; i < ws->n && ws->buf; i++)
        free(ws->buf[i]);
    free(ws->buf);
    free(ws->cap);
    memset(ws, 0, sizeof(*ws));
}

/* Buffer `id` with room for n floats (64-byte aligned), or NULL. */
static void *ws_get(hp_fwd_ws_t *ws, int id, size_t n)
{
    if (!ws->buf || !ws->cap)
        return NULL;
    if (n == 0)
        n = 1;
    if (ws->cap[id] < n) {
        free(ws->buf[id]);
        size_t bytes = ((n * sizeof(float) + 63) / 64) * 64;
        ws->buf[id] = aligned_alloc(64, bytes);
        ws->cap[id] = ws->buf[id] ? n : 0;
    }
    return ws->buf[id];
}

/* ---- Gated DeltaNet mixer (reference §3) ------------------------------- */

/* kvp: the sequence's KVBuffer pool when its buffers are open (DESIGN §5):
 * a decode step goes through hp_kvbuf_decode, a short prompt on a
 * state-less buffer through hp_kvbuf_prefill (KV-only), anything else
 * folds the buffer into S first and runs as before. verify: the T tokens
 * are a draft verification (hp_forward_verify): buffered as pending
 * entries, the conv run on a copy of the history, raw inputs kept. */
static int linear_mixer(const hp_model_t *m, int l, hp_seq_layer_t *sl,
                        hp_fwd_ws_t *ws, const float *y, float *x, int T,
                        const hp_jumps_t *jumps, int chunk,
                        hp_kvbuf_pool_t *kvp, int verify, hp_error_t *err)
{
    const hp_model_config_t *c = &m->cfg;
    const hp_layer_weights_t *w = &m->layers[l];
    int H = c->hidden, Hk = c->lin_k_heads, Hv = c->lin_v_heads;
    int dk = c->lin_k_dim, dv = c->lin_v_dim, Kc = c->conv_kernel;
    int kd = Hk * dk, vd = Hv * dv, cd = hp_cfg_conv_dim(c);

    float *qkv = ws_get(ws, B_QKV, (size_t)T * cd);
    float *cv = ws_get(ws, B_CONV, (size_t)T * cd);
    float *q = ws_get(ws, B_Q, (size_t)T * kd);
    float *k = ws_get(ws, B_K, (size_t)T * kd);
    float *v = ws_get(ws, B_V, (size_t)T * vd);
    float *z = ws_get(ws, B_Z, (size_t)T * vd);
    float *beta = ws_get(ws, B_BETA, (size_t)T * Hv);
    float *g = ws_get(ws, B_G, (size_t)T * Hv);
    float *o = ws_get(ws, B_O, (size_t)T * vd);
    float *scr = ws_get(ws, B_SCRATCH, hk_gdn_chunk_scratch(Hv, dk, dv, chunk));
    int want_tc = jumps && jumps->tc_run >= 0;
    float *tc = want_tc ? ws_get(ws, B_TC, (size_t)Hv * dk * dk) : NULL;
    hp_kvbuf_t *kb = kvp && sl->kvb.blocks && !jumps ? &sl->kvb : NULL;
    float *spec_qkv = NULL, *spec_conv = NULL;
    if (verify) {
        spec_qkv = ws_get(ws, B_SPECQKV, (size_t)c->n_layers * T * cd);
        spec_conv = ws_get(ws, B_SPECCONV, (size_t)cd * (Kc - 1));
    }
    if (!qkv || !cv || !q || !k || !v || !z || !beta || !g || !o || !scr ||
        (want_tc && !tc) || (verify && (!spec_qkv || !spec_conv)))
        return hp_error_set(err, HP_ENOMEM, "forward: out of memory");
    if (kvp && sl->kvb.blocks && jumps) {
        /* PIC jumps read and write S: the buffer goes into it first. */
        int rc = hp_kvbuf_fold(kvp, &sl->kvb, err);
        if (rc != HP_OK)
            return rc;
    }

    hk_matmul(qkv, y, w->in_qkv.w, T, H, cd);
    hk_matmul(z, y, w->in_z.w, T, H, vd);
    hk_matmul(beta, y, w->in_b.w, T, H, Hv);
    hk_matmul(g, y, w->in_a.w, T, H, Hv);

    for (int t = 0; t < T; t++) {
        for (int h = 0; h < Hv; h++) {
            float *bt = &beta[(size_t)t * Hv + h];
            float *gt = &g[(size_t)t * Hv + h];
            *bt = hk_sigmoid(*bt);
            *gt = hk_math_gdn_gate(*gt, w->A_log[h], w->dt_bias[h]);
        }
    }

    /* Runs between jumps: conv and recurrence continue from the state the
     * previous run (or the jump) left. */
    int start = 0;
    for (int j = 0; j <= (jumps ? jumps->n : 0); j++) {
        int end = (jumps && j < jumps->n) ? jumps->after[j] : T;
        int n = end - start;
        float *run_tc = want_tc && j == jumps->tc_run ? tc : NULL;
        if (run_tc && n == 0) { /* an empty run's transition is I */
            memset(run_tc, 0, (size_t)Hv * dk * dk * sizeof(float));
            for (int h = 0; h < Hv; h++)
                for (int i = 0; i < dk; i++)
                    run_tc[((size_t)h * dk + i) * dk + i] = 1.0f;
        }
        if (n > 0) {
            const float *src = qkv + (size_t)start * cd;
            float *dst = cv + (size_t)start * cd;
            float *hist = sl->conv;
            if (verify) {
                /* Drafts may be rejected: convolve on a copy of the history
                 * and keep the raw inputs; hp_forward_accept commits the
                 * accepted ones (hk_kvbuf_conv_commit). */
                hist = spec_conv;
                memcpy(hist, sl->conv, (size_t)cd * (Kc - 1) * sizeof(float));
                memcpy(spec_qkv + (size_t)l * T * cd, qkv,
                       (size_t)T * cd * sizeof(float));
            }
            hk_conv1d_silu(dst, hist, src, w->conv_w, n, cd, Kc);
            for (int t = start; t < end; t++) {
                memcpy(q + (size_t)t * kd, cv + (size_t)t * cd,
                       kd * sizeof(float));
                memcpy(k + (size_t)t * kd, cv + (size_t)t * cd + kd,
                       kd * sizeof(float));
                memcpy(v + (size_t)t * vd, cv + (size_t)t * cd + 2 * kd,
                       vd * sizeof(float));
            }
            float *qs = q + (size_t)start * kd, *ks = k + (size_t)start * kd;
            hk_l2norm(qs, n * Hk, dk, 1e-6f, 1.0f / sqrtf((float)dk));
            hk_l2norm(ks, n * Hk, dk, 1e-6f, 1.0f);
            float *os = o + (size_t)start * vd;
            const float *vs = v + (size_t)start * vd;
            const float *gs = g + (size_t)start * Hv;
            const float *bs = beta + (size_t)start * Hv;
            int rc = HP_OK;
            if (kb && verify)
                rc = hp_kvbuf_verify(kvp, &kb, 1, n, os, qs, ks, vs, gs, bs,
                                     err);
            else if (kb && n == 1)
                rc = hp_kvbuf_decode(kvp, &kb, 1, os, qs, ks, vs, gs, bs, err);
            else if (kb && !kb->S && n <= kvp->cfg.max_step &&
                     kb->len + n <= kvp->cfg.cap_kvonly)
                rc = hp_kvbuf_prefill(kvp, kb, n, os, qs, ks, vs, gs, bs, err);
            else {
                if (kb)
                    rc = hp_kvbuf_fold(kvp, kb, err);
                if (rc == HP_OK && n == 1 && !run_tc)
                    hk_gdn_recurrent(os, sl->S, qs, ks, vs, gs, bs, 1, Hk, Hv,
                                     dk, dv);
                else if (rc == HP_OK)
                    hk_gdn_chunk(os, sl->S, run_tc, qs, ks, vs, gs, bs, n, Hk,
                                 Hv, dk, dv, chunk, scr);
            }
            if (rc != HP_OK)
                return rc;
        }
        if (jumps && j < jumps->n) {
            int rc = jumps->fn(jumps->ud, l, j, sl->S, sl->conv, run_tc, err);
            if (rc != HP_OK)
                return rc;
        }
        start = end;
    }

    hk_rmsnorm_gated(o, o, z, w->gnorm, T * Hv, dv, c->rms_eps);
    hk_matmul_acc(x, o, w->out_proj.w, T, vd, H);
    return HP_OK;
}

/* ---- gated full attention (reference §4) ------------------------------- */

static int full_mixer(const hp_model_t *m, int l, hp_seq_layer_t *sl,
                      hp_fwd_ws_t *ws, const float *y, float *x, const int *pos,
                      int T, int n_ctx, hp_error_t *err)
{
    const hp_model_config_t *c = &m->cfg;
    const hp_layer_weights_t *w = &m->layers[l];
    int H = c->hidden, Hq = c->n_heads, Hkv = c->n_kv_heads;
    int hd = c->head_dim;
    size_t qd = (size_t)Hq * hd, kvd = (size_t)Hkv * hd;

    float *P = ws_get(ws, B_P, (size_t)T * 2 * qd);
    float *q = ws_get(ws, B_Q, (size_t)T * qd);
    float *gate = ws_get(ws, B_Z, (size_t)T * qd);
    float *k = ws_get(ws, B_K, (size_t)T * kvd);
    float *v = ws_get(ws, B_V, (size_t)T * kvd);
    float *o = ws_get(ws, B_O, (size_t)T * qd);
    float *scr = ws_get(ws, B_SCRATCH, hk_attention_scratch(T, n_ctx, Hq));
    if (!P || !q || !gate || !k || !v || !o || !scr)
        return hp_error_set(err, HP_ENOMEM, "forward: out of memory");

    hk_matmul(P, y, w->q_proj.w, T, H, 2 * (int)qd);
    hk_matmul(k, y, w->k_proj.w, T, H, (int)kvd);
    hk_matmul(v, y, w->v_proj.w, T, H, (int)kvd);
    /* q_proj rows are per head [query hd | gate hd] (reference §2.4). */
    for (int t = 0; t < T; t++)
        for (int h = 0; h < Hq; h++) {
            const float *src = P + (size_t)t * 2 * qd + (size_t)h * 2 * hd;
            memcpy(q + (size_t)t * qd + (size_t)h * hd, src,
                   hd * sizeof(float));
            memcpy(gate + (size_t)t * qd + (size_t)h * hd, src + hd,
                   hd * sizeof(float));
        }
    hk_rmsnorm_zc(q, q, w->q_norm, T * Hq, hd, c->rms_eps);
    hk_rmsnorm_zc(k, k, w->k_norm, T * Hkv, hd, c->rms_eps);
    hk_rope(q, pos, T, Hq, hd, c->rotary_dim, c->rope_theta);
    hk_rope(k, pos, T, Hkv, hd, c->rotary_dim, c->rope_theta);
    for (int t = 0; t < T; t++) {
        memcpy(sl->k + (size_t)pos[t] * kvd, k + (size_t)t * kvd,
               kvd * sizeof(float));
        memcpy(sl->v + (size_t)pos[t] * kvd, v + (size_t)t * kvd,
               kvd * sizeof(float));
    }
    hk_attention(o, q, pos, sl->k, sl->v, T, n_ctx, Hq, Hkv, hd,
                 1.0f / sqrtf((float)hd), scr);
    for (size_t i = 0; i < (size_t)T * qd; i++)
        o[i] *= hk_sigmoid(gate[i]);
    hk_matmul_acc(x, o, w->o_proj.w, T, (int)qd, H);
    return HP_OK;
}

/* ---- MLP (reference §5.3, §5.4) ----------------------------------------- */

static int dense_mlp(const hp_mat_t *gw, const hp_mat_t *uw, const hp_mat_t *dw,
                     hp_fwd_ws_t *ws, const float *y, float *x, int T, int H,
                     const float *row_scale, hp_error_t *err)
{
    int I = gw->rows;
    float *g = ws_get(ws, B_GATE, (size_t)T * I);
    float *u = ws_get(ws, B_UP, (size_t)T * I);
    if (!g || !u)
        return hp_error_set(err, HP_ENOMEM, "forward: out of memory");
    hk_matmul(g, y, gw->w, T, H, I);
    hk_matmul(u, y, uw->w, T, H, I);
    hk_swiglu(g, g, u, (size_t)T * I);
    if (row_scale)
        for (int t = 0; t < T; t++)
            for (int i = 0; i < I; i++)
                g[(size_t)t * I + i] *= row_scale[t];
    hk_matmul_acc(x, g, dw->w, T, I, H);
    return HP_OK;
}

static int moe_mlp(const hp_model_t *m, int l, hp_fwd_ws_t *ws, const float *y,
                   float *x, int T, hp_error_t *err)
{
    const hp_model_config_t *c = &m->cfg;
    const hp_layer_weights_t *w = &m->layers[l];
    int H = c->hidden, E = c->n_experts, K = c->n_experts_per_tok;
    float *logits = ws_get(ws, B_ROUTE, (size_t)T * E);
    float *xg = ws_get(ws, B_XG, (size_t)T * H);
    float *eo = ws_get(ws, B_EO, (size_t)T * H);
    float *wsel = ws_get(ws, B_MOEW, (size_t)T * K);
    int *isel = ws_get(ws, B_MOEIDX, (size_t)T * K);
    int *rows = ws_get(ws, B_ROWS, (size_t)T);
    if (!logits || !xg || !eo || !wsel || !isel || !rows)
        return hp_error_set(err, HP_ENOMEM, "forward: out of memory");

    hk_matmul(logits, y, w->router.w, T, H, E);
    for (int t = 0; t < T; t++)
        hk_moe_route(isel + (size_t)t * K, wsel + (size_t)t * K,
                     logits + (size_t)t * E, E, K, c->norm_topk_prob);

    /* Gather the tokens routed to each expert, run it once over them,
     * scatter-add the weighted result. */
    for (int e = 0; e < E; e++) {
        int n = 0;
        for (int t = 0; t < T; t++)
            for (int j = 0; j < K; j++)
                if (isel[(size_t)t * K + j] == e) {
                    rows[n] = t;
                    logits[n] = wsel[(size_t)t * K + j]; /* reuse as scale */
                    memcpy(xg + (size_t)n * H, y + (size_t)t * H,
                           H * sizeof(float));
                    n++;
                }
        if (n == 0)
            continue;
        memset(eo, 0, (size_t)n * H * sizeof(float));
        int rc = dense_mlp(&w->exp_gate[e], &w->exp_up[e], &w->exp_down[e], ws,
                           xg, eo, n, H, logits, err);
        if (rc != HP_OK)
            return rc;
        for (int i = 0; i < n; i++) {
            float *dst = x + (size_t)rows[i] * H;
            const float *src = eo + (size_t)i * H;
            for (int h = 0; h < H; h++)
                dst[h] += src[h];
        }
    }

    if (w->sh_gate.rows > 0) {
        /* shared expert with a per-token scalar sigmoid gate */
        float *sg = wsel; /* T floats needed, T*K available */
        hk_matmul(sg, y, w->sh_expert_gate, T, H, 1);
        for (int t = 0; t < T; t++)
            sg[t] = hk_sigmoid(sg[t]);
        return dense_mlp(&w->sh_gate, &w->sh_up, &w->sh_down, ws, y, x, T, H,
                         sg, err);
    }
    return HP_OK;
}

/* ---- the whole model --------------------------------------------------- */

int hp_forward(const hp_model_t *m, hp_seq_t *seq, hp_fwd_ws_t *ws,
               const int *ids, const int *pos_in, int T,
               const hp_jumps_t *jumps, hp_logits_mode_t mode, float *logits,
               hp_error_t *err)
{
    const hp_model_config_t *c = &m->cfg;
    int H = c->hidden, rc;
    if (T <= 0)
        return hp_error_set(err, HP_EBADINPUT, "forward: no tokens");
    for (int t = 0; t < T; t++)
        if (ids[t] < 0 || ids[t] >= c->vocab_size)
            return hp_error_set(err, HP_EBADINPUT,
                                "token id %d outside the vocabulary (%d)",
                                ids[t], c->vocab_size);

    /* positions: given, or continuing the sequence */
    int *pos = ws_get(ws, B_POS, (size_t)T);
    float *x = ws_get(ws, B_X, (size_t)T * H);
    float *y = ws_get(ws, B_Y, (size_t)T * H);
    if (!pos || !x || !y)
        return hp_error_set(err, HP_ENOMEM, "forward: out of memory");
    int n_ctx = seq->n_pos;
    for (int t = 0; t < T; t++) {
        pos[t] = pos_in ? pos_in[t] : seq->n_pos + t;
        if (pos[t] < 0)
            return hp_error_set(err, HP_EBADINPUT, "negative position");
        if (pos[t] + 1 > n_ctx)
            n_ctx = pos[t] + 1;
    }
    if ((rc = hp_seq_reserve(seq, n_ctx, err)) != HP_OK)
        return rc;
    /* KVBuffer blocks for every linear layer before any layer runs, so a
     * full pool refuses the step (HP_EBUSY, the request waits) instead of
     * leaving the layers half advanced. Blocks, once held, stay with the
     * buffer, so a refusal after some layers reserved changes nothing. */
    if (seq->kvpool && !jumps && T <= seq->kvpool->cfg.max_step)
        for (int l = 0; l < c->n_layers; l++) {
            hp_kvbuf_t *kb = &seq->layers[l].kvb;
            if (kb->blocks &&
                (rc = hp_kvbuf_reserve(seq->kvpool, &kb, 1, T, err)) != HP_OK)
                return rc;
        }
    for (int t = 0; t < T; t++)
        memcpy(x + (size_t)t * H, m->embed + (size_t)ids[t] * H,
               H * sizeof(float));

    int chunk = GDN_CHUNK_DEFAULT;
    rc = HP_OK;
    for (int l = 0; l < c->n_layers && rc == HP_OK; l++) {
        const hp_layer_weights_t *w = &m->layers[l];
        hk_rmsnorm_zc(y, x, w->input_norm, T, H, c->rms_eps);
        if (c->layer_kind[l] == HP_LAYER_LINEAR)
            rc = linear_mixer(m, l, &seq->layers[l], ws, y, x, T, jumps, chunk,
                              seq->kvpool, seq->spec_T > 0, err);
        else
            rc =
                full_mixer(m, l, &seq->layers[l], ws, y, x, pos, T, n_ctx, err);
        if (rc != HP_OK)
            break;
        hk_rmsnorm_zc(y, x, w->post_norm, T, H, c->rms_eps);
        if (c->layer_moe[l])
            rc = moe_mlp(m, l, ws, y, x, T, err);
        else
            rc = dense_mlp(&w->gate, &w->up, &w->down, ws, y, x, T, H, NULL,
                           err);
    }
    if (rc != HP_OK)
        return rc;
    seq->n_pos = n_ctx;

    if (mode == HP_LOGITS_NONE)
        return HP_OK;
    int first = mode == HP_LOGITS_LAST ? T - 1 : 0;
    int rows = T - first;
    hk_rmsnorm_zc(y, x + (size_t)first * H, m->final_norm, rows, H, c->rms_eps);
    hk_matmul(logits, y, m->lm_head.w, rows, H, c->vocab_size);
    return HP_OK;
}

int hp_prefill(const hp_model_t *m, hp_seq_t *seq, hp_fwd_ws_t *ws,
               const int *ids, int T, int piece, float *logits, hp_error_t *err)
{
    if (piece <= 0)
        piece = 1024;
    for (int off = 0; off < T; off += piece) {
        int n = T - off < piece ? T - off : piece;
        int last = off + n == T;
        int rc = hp_forward(m, seq, ws, ids + off, NULL, n, NULL,
                            last && logits ? HP_LOGITS_LAST : HP_LOGITS_NONE,
                            logits, err);
        if (rc != HP_OK)
            return rc;
    }
    return HP_OK;
}

int hp_forward_verify(const hp_model_t *m, hp_seq_t *seq, hp_fwd_ws_t *ws,
                      const int *ids, int T, float *logits, hp_error_t *err)
{
    if (!seq->kvpool || seq->spec_T || T < 1 || T > seq->kvpool->cfg.max_step)
        return hp_error_set(err, HP_EBADINPUT,
                            "forward: verification needs open KVBuffers, no "
                            "unresolved drafts and 1..%d tokens",
                            seq->kvpool ? seq->kvpool->cfg.max_step : 0);
    seq->spec_start = seq->n_pos;
    seq->spec_T = T;
    int rc =
        hp_forward(m, seq, ws, ids, NULL, T, NULL, HP_LOGITS_ALL, logits, err);
    if (rc != HP_OK) { /* drop whatever layers buffered; conv untouched */
        for (int l = 0; l < m->cfg.n_layers; l++)
            if (seq->layers[l].kvb.pending)
                hp_kvbuf_truncate(seq->kvpool, &seq->layers[l].kvb, 0, NULL);
        seq->n_pos = seq->spec_start;
        seq->spec_T = 0;
    }
    return rc;
}

int hp_forward_accept(const hp_model_t *m, hp_seq_t *seq, hp_fwd_ws_t *ws,
                      int keep, hp_error_t *err)
{
    const hp_model_config_t *c = &m->cfg;
    int T = seq->spec_T, cd = hp_cfg_conv_dim(c), Kc = c->conv_kernel;
    if (!T || keep < 0 || keep > T)
        return hp_error_set(err, HP_EBADINPUT,
                            "forward: accept %d of %d verified tokens", keep,
                            T);
    /* Same size as in the verification: the same buffer, still filled. */
    const float *raw = ws_get(ws, B_SPECQKV, (size_t)c->n_layers * T * cd);
    if (!raw)
        return hp_error_set(err, HP_EINTERNAL, "forward: drafts' inputs lost");
    for (int l = 0; l < c->n_layers; l++) {
        hp_seq_layer_t *sl = &seq->layers[l];
        if (!sl->kvb.blocks)
            continue;
        hk_kvbuf_conv_commit(sl->conv, raw + (size_t)l * T * cd, keep, cd, Kc);
        int rc = hp_kvbuf_truncate(seq->kvpool, &sl->kvb, keep, err);
        if (rc != HP_OK)
            return rc;
    }
    seq->n_pos = seq->spec_start + keep;
    seq->spec_T = 0;
    return HP_OK;
}
