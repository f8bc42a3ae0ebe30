/*
 * forward.c - one forward pass of the hybrid decoder (reference §5.2, §9):
 * embed; per layer pre-norm mixer (Gated DeltaNet or gated attention) and
 * pre-norm MLP (SwiGLU or MoE) with residuals; final norm; LM head. The
 * layer pieces are shared with the batched decode step (forward_batch.c).
 * Every op runs on the model's backend (m->be), on workspace, sequence and
 * weight memory of that backend.
 */
#include "engine/forward/forward.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "engine/forward/forward_impl.h"

/* ---- Gated DeltaNet mixer (reference §3) ------------------------------- */

int hp_fwd_lin_begin(const hp_model_t *m, int l, hp_fwd_ws_t *ws, float *y,
                     const float *x, int T, hp_fwd_lin_t *b, hp_error_t *err)
{
    const hp_model_config_t *c = &m->cfg;
    const hp_layer_weights_t *w = &m->layers[l];
    int Hv = c->lin_v_heads, cd = hp_cfg_conv_dim(c);
    size_t kd = (size_t)c->lin_k_heads * c->lin_k_dim, vd = hp_cfg_value_dim(c);

    b->qkv = hp_fwd_buf(ws, B_QKV, (size_t)T * cd);
    b->cv = hp_fwd_buf(ws, B_CONV, (size_t)T * cd);
    b->q = hp_fwd_buf(ws, B_Q, T * kd);
    b->k = hp_fwd_buf(ws, B_K, T * kd);
    b->v = hp_fwd_buf(ws, B_V, T * vd);
    b->z = hp_fwd_buf(ws, B_Z, T * vd);
    b->beta = hp_fwd_buf(ws, B_BETA, (size_t)T * Hv);
    b->g = hp_fwd_buf(ws, B_G, (size_t)T * Hv);
    b->o = hp_fwd_buf(ws, B_O, T * vd);
    if (!b->qkv || !b->cv || !b->q || !b->k || !b->v || !b->z || !b->beta ||
        !b->g || !b->o)
        return hp_error_set(err, HP_ENOMEM, "forward: out of memory");

    float *const ys[] = {b->qkv, b->z, b->beta, b->g};
    const hp_mat_t *const mats[] = {&w->in_qkv, &w->in_z, &w->in_b, &w->in_a};
    hp_backend_rmsnorm_linear_n(m->be, ys, y, x, w->input_norm, mats, 4, T,
                                c->rms_eps);
    return HP_OK;
}

/* q and k's l2 norm: eps inside the root, q scaled by dk^-1/2 */
#define L2_EPS 1e-6f
static float q_scale(int dk)
{
    return 1.0f / sqrtf((float)dk);
}

void hp_fwd_lin_conv(const hp_model_t *m, int l, const hp_fwd_lin_t *b,
                     float *hist, int start, int end)
{
    const hp_model_config_t *c = &m->cfg;
    const hp_layer_weights_t *w = &m->layers[l];
    int Hk = c->lin_k_heads, Hv = c->lin_v_heads, dk = c->lin_k_dim;
    int cd = hp_cfg_conv_dim(c);
    size_t kd = (size_t)Hk * dk, vd = hp_cfg_value_dim(c);
    /* conv, split, norms and gates in one op: cv is its scratch */
    hp_backend_conv_qkv(m->be, b->q + start * kd, b->k + start * kd,
                        b->v + start * vd, b->cv + (size_t)start * cd, hist,
                        b->qkv + (size_t)start * cd, w->conv_w,
                        b->g + (size_t)start * Hv, b->beta + (size_t)start * Hv,
                        w->A_log, w->dt_bias, end - start, Hk, Hv, dk,
                        c->lin_v_dim, c->conv_kernel, L2_EPS, q_scale(dk));
}

void hp_fwd_lin_conv_decode(const hp_model_t *m, int l, const hp_fwd_lin_t *b,
                            float *const *conv, int r0, int R)
{
    const hp_model_config_t *c = &m->cfg;
    const hp_layer_weights_t *w = &m->layers[l];
    int Hk = c->lin_k_heads, Hv = c->lin_v_heads, dk = c->lin_k_dim;
    int cd = hp_cfg_conv_dim(c);
    size_t kd = (size_t)Hk * dk, vd = hp_cfg_value_dim(c), r = (size_t)r0;
    hp_backend_conv_qkv_decode(
        m->be, b->q + r * kd, b->k + r * kd, b->v + r * vd, b->cv + r * cd,
        conv, b->qkv + r * cd, w->conv_w, b->g + r * Hv, b->beta + r * Hv,
        w->A_log, w->dt_bias, R, Hk, Hv, dk, c->lin_v_dim, c->conv_kernel,
        L2_EPS, q_scale(dk));
}

void hp_fwd_lin_step(const hp_model_t *m, int l, const hp_fwd_lin_t *b,
                     float *const *S, float *const *conv, int r0, int R,
                     float *scratch)
{
    const hp_model_config_t *c = &m->cfg;
    const hp_layer_weights_t *w = &m->layers[l];
    int Hk = c->lin_k_heads, Hv = c->lin_v_heads;
    int dk = c->lin_k_dim, dv = c->lin_v_dim, cd = hp_cfg_conv_dim(c);
    size_t vd = hp_cfg_value_dim(c);
    hp_backend_gdn_step(m->be, b->o + r0 * vd, S, conv,
                        b->qkv + (size_t)r0 * cd, b->g + (size_t)r0 * Hv,
                        b->beta + (size_t)r0 * Hv, w->conv_w, w->A_log,
                        w->dt_bias, R, Hk, Hv, dk, dv, c->conv_kernel, L2_EPS,
                        q_scale(dk), scratch);
}

void hp_fwd_lin_end(const hp_model_t *m, int l, const hp_fwd_lin_t *b, float *x,
                    int T)
{
    const hp_model_config_t *c = &m->cfg;
    const hp_layer_weights_t *w = &m->layers[l];
    hp_backend_rmsnorm_gated_linear_acc(m->be, x, b->o, b->z, w->gnorm,
                                        T * c->lin_v_heads, c->lin_v_dim,
                                        c->rms_eps, &w->out_proj, T);
}

/* kvp: the sequence's KVBuffer pool when its buffers are open (DESIGN §5):
 * a decode step goes through hp_kvbuf_decode, a short prompt on a
 * state-less buffer through hp_kvbuf_prefill (KV-only), anything else
 * folds the buffer into S first and runs as before. (Draft verification
 * is forward_batch.c's.) */
static int linear_mixer(const hp_model_t *m, int l, hp_seq_layer_t *sl,
                        hp_fwd_ws_t *ws, float *y, float *x, int T,
                        const hp_jumps_t *jumps, hp_kvbuf_pool_t *kvp,
                        hp_error_t *err)
{
    const hp_model_config_t *c = &m->cfg;
    int Hk = c->lin_k_heads, Hv = c->lin_v_heads;
    int dk = c->lin_k_dim, dv = c->lin_v_dim;
    int kd = Hk * dk, vd = Hv * dv;
    hp_fwd_lin_t b;

    float *scr = hp_fwd_buf(
        ws, B_SCRATCH,
        hp_backend_gdn_chunk_scratch(m->be, T, Hv, dk, dv, HP_FWD_GDN_CHUNK));
    int want_tc = jumps && jumps->tc_run >= 0;
    float *tc = want_tc ? hp_fwd_buf(ws, B_TC, (size_t)Hv * dk * dk) : NULL;
    hp_kvbuf_t *kb = kvp && sl->kvb.blocks && !jumps ? &sl->kvb : NULL;
    if (!scr || (want_tc && !tc))
        return hp_error_set(err, HP_ENOMEM, "forward: out of memory");
    if (kvp && sl->kvb.blocks && jumps) {
        /* PIC jumps read and write S: the buffer goes into it first. */
        int rc = hp_kvbuf_fold(kvp, &sl->kvb, err);
        if (rc != HP_OK)
            return rc;
    }
    int rc = hp_fwd_lin_begin(m, l, ws, y, x, T, &b, err);
    if (rc != HP_OK)
        return rc;
    if (T == 1 && !jumps && !kb) {
        /* a decode step: the batched step's op (hp_forward_batch) */
        float *sscr =
            hp_fwd_buf(ws, B_SCRATCH,
                       hp_backend_gdn_step_scratch(m->be, 1, Hk, Hv, dk, dv));
        if (!sscr)
            return hp_error_set(err, HP_ENOMEM, "forward: out of memory");
        hp_fwd_lin_step(m, l, &b, &sl->S, &sl->conv, 0, 1, sscr);
        hp_fwd_lin_end(m, l, &b, x, T);
        return HP_OK;
    }

    /* Runs between jumps: conv and recurrence continue from the state the
     * previous run (or the jump) left. */
    int start = 0;
    for (int j = 0; j <= (jumps ? jumps->n : 0); j++) {
        int end = (jumps && j < jumps->n) ? jumps->after[j] : T;
        int n = end - start;
        float *run_tc = want_tc && j == jumps->tc_run ? tc : NULL;
        if (run_tc && n == 0) /* an empty run's transition is I */
            hp_backend_trans_identity(m->be, run_tc, Hv, dk);
        if (n > 0) {
            hp_fwd_lin_conv(m, l, &b, sl->conv, start, end);
            float *qs = b.q + (size_t)start * kd,
                  *ks = b.k + (size_t)start * kd;
            float *os = b.o + (size_t)start * vd;
            const float *vs = b.v + (size_t)start * vd;
            const float *gs = b.g + (size_t)start * Hv;
            const float *bs = b.beta + (size_t)start * Hv;
            if (kb && n == 1)
                rc = hp_kvbuf_decode(kvp, &kb, 1, os, qs, ks, vs, gs, bs, err);
            else if (kb && !kb->S && n <= kvp->cfg.max_step &&
                     kb->len + n <= kvp->cfg.cap_kvonly)
                rc = hp_kvbuf_prefill(kvp, kb, n, os, qs, ks, vs, gs, bs, err);
            else {
                if (kb)
                    rc = hp_kvbuf_fold(kvp, kb, err);
                if (rc == HP_OK && n == 1 && !run_tc)
                    hp_backend_gdn_recurrent(m->be, os, sl->S, qs, ks, vs, gs,
                                             bs, 1, Hk, Hv, dk, dv);
                else if (rc == HP_OK)
                    hp_backend_gdn_chunk(m->be, os, sl->S, run_tc, qs, ks, vs,
                                         gs, bs, n, Hk, Hv, dk, dv,
                                         HP_FWD_GDN_CHUNK, scr, m->prec);
            }
            if (rc != HP_OK)
                return rc;
        }
        if (jumps && j < jumps->n) {
            rc = jumps->fn(jumps->ud, l, j, sl->S, sl->conv, run_tc, err);
            if (rc != HP_OK)
                return rc;
        }
        start = end;
    }
    hp_fwd_lin_end(m, l, &b, x, T);
    return HP_OK;
}

/* ---- gated full attention (reference §4) ------------------------------- */

int hp_fwd_att_begin(const hp_model_t *m, int l, hp_fwd_ws_t *ws, float *y,
                     const float *x, const int *pos, int T, hp_fwd_att_t *b,
                     hp_error_t *err)
{
    const hp_model_config_t *c = &m->cfg;
    const hp_layer_weights_t *w = &m->layers[l];
    int Hq = c->n_heads, Hkv = c->n_kv_heads;
    int hd = c->head_dim;
    size_t qd = (size_t)Hq * hd, kvd = (size_t)Hkv * hd;

    float *P = hp_fwd_buf(ws, B_P, (size_t)T * 2 * qd);
    b->q = hp_fwd_buf(ws, B_Q, (size_t)T * qd);
    b->gate = hp_fwd_buf(ws, B_Z, (size_t)T * qd);
    b->k = hp_fwd_buf(ws, B_K, (size_t)T * kvd);
    b->v = hp_fwd_buf(ws, B_V, (size_t)T * kvd);
    b->o = hp_fwd_buf(ws, B_O, (size_t)T * qd);
    if (!P || !b->q || !b->gate || !b->k || !b->v || !b->o)
        return hp_error_set(err, HP_ENOMEM, "forward: out of memory");

    float *const ys[] = {P, b->k, b->v};
    const hp_mat_t *const mats[] = {&w->q_proj, &w->k_proj, &w->v_proj};
    hp_backend_rmsnorm_linear_n(m->be, ys, y, x, w->input_norm, mats, 3, T,
                                c->rms_eps);
    /* q_proj rows are per head [query hd | gate hd] (reference §2.4);
     * the split, q and k norms and RoPE in one op */
    hp_backend_qk_norm_rope(m->be, b->q, b->gate, b->k, P, w->q_norm, w->k_norm,
                            pos, T, Hq, Hkv, hd, c->rotary_dim, c->rope_theta,
                            c->rms_eps);
    return HP_OK;
}

void hp_fwd_att_store(const hp_model_t *m, hp_seq_layer_t *sl,
                      const hp_fwd_att_t *b, const int *pos, int row0, int T)
{
    size_t kvd = m->cfg.kv_row;
    hp_backend_kv_store(m->be, sl->k, sl->v, b->k + (size_t)row0 * kvd,
                        b->v + (size_t)row0 * kvd, pos + row0, T, (int)kvd);
}

void hp_fwd_att_seq(const hp_model_t *m, hp_seq_layer_t *sl,
                    const hp_fwd_att_t *b, const int *pos, int row0, int T,
                    int n_ctx, float *scratch)
{
    const hp_model_config_t *c = &m->cfg;
    int Hq = c->n_heads, hd = c->head_dim;
    size_t qd = (size_t)Hq * hd;
    hp_fwd_att_store(m, sl, b, pos, row0, T);
    hp_backend_attention(m->be, b->o + (size_t)row0 * qd,
                         b->q + (size_t)row0 * qd, pos + row0, sl->k, sl->v, T,
                         n_ctx, Hq, c->n_kv_heads, hd, 1.0f / sqrtf((float)hd),
                         m->prec, scratch);
}

void hp_fwd_att_end(const hp_model_t *m, int l, const hp_fwd_att_t *b, float *x,
                    int T)
{
    hp_backend_gate_mul_linear_acc(m->be, x, b->o, b->gate,
                                   &m->layers[l].o_proj, T);
}

static int full_mixer(const hp_model_t *m, int l, hp_seq_layer_t *sl,
                      hp_fwd_ws_t *ws, float *y, float *x, const int *pos,
                      int T, int n_ctx, hp_error_t *err)
{
    hp_fwd_att_t b;
    int rc = hp_fwd_att_begin(m, l, ws, y, x, pos, T, &b, err);
    float *scr = hp_fwd_buf(ws, B_SCRATCH,
                            hp_backend_attention_scratch(
                                m->be, T, n_ctx, m->cfg.n_heads,
                                m->cfg.n_kv_heads, m->cfg.head_dim, m->prec));
    if (rc != HP_OK)
        return rc;
    if (!scr)
        return hp_error_set(err, HP_ENOMEM, "forward: out of memory");
    hp_fwd_att_seq(m, sl, &b, pos, 0, T, n_ctx, scr);
    hp_fwd_att_end(m, l, &b, x, T);
    return HP_OK;
}

/* ---- MLP (reference §5.3, §5.4) ----------------------------------------- */

/* x += down(silu(gate y) * up y), the hidden rows scaled by row_scale
 * (sigmoid'ed when sigm) where given. With norm, y is made first as
 * rmsnorm(x) with it (with the up projections: y is scratch then), else
 * read. */
static int dense_mlp(const hp_model_t *m, const hp_mat_t *gw,
                     const hp_mat_t *uw, const hp_mat_t *dw, hp_fwd_ws_t *ws,
                     float *y, float *x, int T, const float *row_scale,
                     int sigm, const float *norm, hp_error_t *err)
{
    int I = gw->rows;
    float *g = hp_fwd_buf(ws, B_GATE, (size_t)T * I);
    float *u = hp_fwd_buf(ws, B_UP, (size_t)T * I);
    if (!g || !u)
        return hp_error_set(err, HP_ENOMEM, "forward: out of memory");
    if (!row_scale) {
        hp_backend_mlp_acc(m->be, x, y, g, u, norm, gw, uw, dw, T,
                           m->cfg.rms_eps, m->prec);
        return HP_OK;
    }
    float *const ys[] = {g, u};
    const hp_mat_t *const mats[] = {gw, uw};
    hp_backend_rmsnorm_linear_n(m->be, ys, y, x, norm, mats, 2, T,
                                m->cfg.rms_eps);
    hp_backend_swiglu(m->be, g, g, u, (size_t)T * I);
    hp_backend_scale_rows(m->be, g, row_scale, T, I, sigm);
    hp_backend_linear_acc(m->be, x, g, dw, T);
    return HP_OK;
}

static int moe_mlp(const hp_model_t *m, int l, hp_fwd_ws_t *ws, float *y,
                   float *x, int T, hp_error_t *err)
{
    const hp_model_config_t *c = &m->cfg;
    const hp_layer_weights_t *w = &m->layers[l];
    int H = c->hidden, E = c->n_experts, K = c->n_experts_per_tok;
    size_t TK = (size_t)T * K;
    float *logits = hp_fwd_buf(ws, B_ROUTE, (size_t)T * E);
    float *xg = hp_fwd_buf(ws, B_XG, (size_t)T * H);
    float *eo = hp_fwd_buf(ws, B_EO, (size_t)T * H);
    float *wsel = hp_fwd_buf(ws, B_MOEW, TK);
    int *isel = hp_fwd_buf(ws, B_MOEIDX, TK);
    int *rows = hp_fwd_buf(ws, B_ROWS, TK);
    float *scale = hp_fwd_buf(ws, B_MOESCALE, TK);
    int *slot = hp_fwd_buf(ws, B_MOESLOT, TK);
    int *offs = hp_fwd_buf(ws, B_MOEOFFS, (size_t)E + 1);
    if (!logits || !xg || !eo || !wsel || !isel || !rows || !scale || !slot ||
        !offs)
        return hp_error_set(err, HP_ENOMEM, "forward: out of memory");

    hp_backend_linear(m->be, logits, y, &w->router, T);
    hp_backend_moe_route(m->be, isel, wsel, logits, T, E, K, c->norm_topk_prob);
    /* Each expert runs once over the tokens routed to it (gathered), its
     * weighted result added back to their rows, experts in order. */
    hp_backend_moe_plan(m->be, offs, rows, scale, slot, isel, wsel, T, K, E);
    for (int e = 0; e < E; e++) {
        int o = offs[e], n = offs[e + 1] - offs[e];
        if (n == 0)
            continue;
        hp_backend_moe_gather(m->be, xg, y, rows + o, n, H);
        hp_backend_memset0(m->be, eo, (size_t)n * H * sizeof(float));
        int rc = dense_mlp(m, &w->exp_gate[e], &w->exp_up[e], &w->exp_down[e],
                           ws, xg, eo, n, scale + o, 0, NULL, err);
        if (rc != HP_OK)
            return rc;
        hp_backend_moe_scatter(m->be, x, eo, rows + o, n, H);
    }

    if (w->sh_gate.rows > 0) {
        /* shared expert with a per-token scalar sigmoid gate */
        hp_mat_t gate = {w->sh_expert_gate, NULL, HK_W_F32, 1, H, 0};
        float *sg = wsel; /* T floats needed, T*K available */
        hp_backend_linear(m->be, sg, y, &gate, T);
        return dense_mlp(m, &w->sh_gate, &w->sh_up, &w->sh_down, ws, y, x, T,
                         sg, 1, NULL, err);
    }
    return HP_OK;
}

int hp_fwd_mlp(const hp_model_t *m, int l, hp_fwd_ws_t *ws, float *y, float *x,
               int T, hp_error_t *err)
{
    const hp_model_config_t *c = &m->cfg;
    const hp_layer_weights_t *w = &m->layers[l];
    if (!c->layer_moe[l])
        return dense_mlp(m, &w->gate, &w->up, &w->down, ws, y, x, T, NULL, 0,
                         w->post_norm, err);
    hp_backend_rmsnorm(m->be, y, x, w->post_norm, T, c->hidden, c->rms_eps);
    return moe_mlp(m, l, ws, y, x, T, err);
}

/* ---- the whole model --------------------------------------------------- */

int hp_fwd_run(const hp_model_t *m, hp_seq_t *seq, hp_fwd_ws_t *ws,
               const int *ids, const int *pos_in, int T,
               const hp_jumps_t *jumps, hp_logits_mode_t mode, float *logits,
               hp_error_t *err)
{
    const hp_model_config_t *c = &m->cfg;
    int H = c->hidden, rc;
    if (T <= 0)
        return hp_error_set(err, HP_EBADINPUT, "forward: no tokens");
    if (seq->spec_T)
        return hp_error_set(err, HP_EBADINPUT,
                            "forward: a verification awaits "
                            "hp_forward_accept");
    for (int t = 0; t < T; t++)
        if (ids[t] < 0 || ids[t] >= c->vocab_size)
            return hp_error_set(err, HP_EBADINPUT,
                                "token id %d outside the vocabulary (%d)",
                                ids[t], c->vocab_size);

    /* positions: given, or continuing the sequence */
    int *pos = hp_fwd_buf(ws, B_POS, (size_t)T);
    float *x = hp_fwd_buf(ws, B_X, (size_t)T * H);
    float *y = hp_fwd_buf(ws, B_Y, (size_t)T * H);
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
    if (n_ctx > ws->plan.max_ctx)
        return hp_error_set(err, HP_ETOOLARGE,
                            "forward: position %d is past the workspace's "
                            "plan of %d (max_ctx)",
                            n_ctx - 1, ws->plan.max_ctx);
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
    hp_backend_embed(m->be, x, &m->embed, ids, T);

    rc = HP_OK;
    for (int l = 0; l < c->n_layers && rc == HP_OK; l++) {
        /* each part norms its input itself (with its projections) */
        if (c->layer_kind[l] == HP_LAYER_LINEAR)
            rc = linear_mixer(m, l, &seq->layers[l], ws, y, x, T, jumps,
                              seq->kvpool, err);
        else
            rc =
                full_mixer(m, l, &seq->layers[l], ws, y, x, pos, T, n_ctx, err);
        if (rc == HP_OK)
            rc = hp_fwd_mlp(m, l, ws, y, x, T, err);
    }
    /* the logits follow the layers without a wait between: one sync
     * reports a failure of either before the positions commit */
    if (rc == HP_OK && mode != HP_LOGITS_NONE) {
        int first = mode == HP_LOGITS_LAST ? T - 1 : 0;
        int rows = T - first;
        hp_backend_rmsnorm(m->be, y, x + (size_t)first * H, m->final_norm, rows,
                           H, c->rms_eps);
        /* the caller's logits are host memory: straight there on the CPU;
         * a device's go through the workspace HP_FWD_LOGIT_ROWS at a time */
        const size_t V = (size_t)c->vocab_size;
        int slice = hp_backend_host_memory(m->be) ? rows : HP_FWD_LOGIT_ROWS;
        for (int r = 0; r < rows; r += slice) {
            int n = rows - r < slice ? rows - r : slice;
            float *out = logits + (size_t)r * V;
            float *lg = hp_backend_host_memory(m->be)
                            ? out
                            : hp_fwd_buf(ws, B_LOGITS, (size_t)n * V);
            if (!lg)
                return hp_error_set(err, HP_EINTERNAL,
                                    "forward: workspace plan");
            hp_backend_linear(m->be, lg, y + (size_t)r * H, &m->lm_head, n);
            if (lg != out)
                hp_backend_download(m->be, out, lg,
                                    (size_t)n * V * sizeof(float));
        }
    }
    if (rc == HP_OK)
        rc = hp_backend_sync(m->be, err);
    if (rc == HP_OK)
        seq->n_pos = n_ctx;
    return rc;
}

int hp_fwd_piece(const hp_model_t *m)
{
    return hp_backend_host_memory(m->be) ? HP_FWD_PIECE : HP_FWD_PIECE_DEVICE;
}

int hp_prefill(const hp_model_t *m, hp_seq_t *seq, hp_fwd_ws_t *ws,
               const int *ids, int T, int piece, float *logits, hp_error_t *err)
{
    if (piece <= 0)
        piece = hp_fwd_piece(m);
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
