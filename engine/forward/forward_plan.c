/*
 * forward_plan.c - the forward pass's workspace, planned once (forward.h,
 * hp_fwd_plan_t): every named buffer sized from the model's config and
 * the plan, carved out of one backend allocation (the few host arrays out
 * of one host allocation); and hp_forward, which runs a
 * call longer than the plan in pieces that fit it.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "engine/forward/forward.h"
#include "engine/forward/forward_impl.h"

static size_t zmax(size_t a, size_t b)
{
    return a > b ? a : b;
}

static size_t zmin(size_t a, size_t b)
{
    return a < b ? a : b;
}

static size_t align16(size_t floats)
{
    return (floats + 15) & ~(size_t)15; /* 64 bytes */
}

/* The plan with its defaults filled in. */
static hp_fwd_plan_t resolve(const hp_model_t *m, const hp_fwd_plan_t *in)
{
    hp_fwd_plan_t p = {hp_fwd_piece(m), 0, 1, HP_FWD_MAX_STEP};
    if (in)
        p = *in;
    if (p.max_ctx <= 0)
        p.max_ctx = m->cfg.max_positions > 0 ? m->cfg.max_positions : INT32_MAX;
    return p;
}

/* Whether buffer id is host memory (forward_impl.h). */
static int is_host(int id)
{
    return id == B_POS || id == B_MOEOFFS || id == B_ITEMS || id == B_KVBUFS ||
           id == B_DECODE || id == B_BEST || id == B_HOSTLOGITS ||
           id == B_IDS || id == B_CANDP || id == B_CANDI || id == B_CANDR ||
           id == B_CANDL;
}

/* Floats of every buffer for plan p: rows are the most of one pass (a
 * piece, or a batch of items), the layer buffers serve both mixers. */
static void sizes(const hp_model_t *m, const hp_fwd_plan_t *p,
                  size_t n[B_COUNT])
{
    const hp_model_config_t *c = &m->cfg;
    const hp_backend_t *be = m->be;
    size_t H = c->hidden, Hv = c->lin_v_heads, cd = hp_cfg_conv_dim(c);
    size_t kd = hp_cfg_key_dim(c), vd = hp_cfg_value_dim(c);
    size_t qd = (size_t)c->n_heads * c->head_dim, kvd = c->kv_row;
    size_t batch = p->max_batch > 0 ? (size_t)p->max_batch : 0;
    size_t brows = batch * (size_t)p->max_step;
    size_t R = zmax((size_t)p->max_tokens, brows);
    size_t I =
        zmax((size_t)c->intermediate,
             zmax((size_t)c->moe_intermediate, (size_t)c->shared_intermediate));
    size_t E = c->n_experts, K = c->n_experts_per_tok;
    /* attention's scratch is largest at one token (heads on the rows) or
     * at the most tokens; it no longer grows past a key block */
    int tmax = p->max_tokens > p->max_step ? p->max_tokens : p->max_step;
    size_t ascr =
        zmax(hp_backend_attention_scratch(be, 1, p->max_ctx, c->n_heads,
                                          c->n_kv_heads, c->head_dim, m->prec),
             hp_backend_attention_scratch(be, tmax, p->max_ctx, c->n_heads,
                                          c->n_kv_heads, c->head_dim, m->prec));

    memset(n, 0, B_COUNT * sizeof(size_t));
    n[B_X] = n[B_Y] = R * H;
    n[B_QKV] = n[B_CONV] = R * cd;
    n[B_Q] = R * zmax(kd, qd);
    n[B_K] = R * zmax(kd, kvd);
    n[B_V] = R * zmax(vd, kvd);
    n[B_Z] = n[B_O] = R * zmax(vd, qd);
    n[B_BETA] = n[B_G] = R * Hv;
    n[B_P] = R * 2 * qd;
    n[B_GATE] = n[B_UP] = R * I;
    /* a decode step's fused mixer: one sequence, or the batch's */
    size_t sscr = hp_backend_gdn_step_scratch(be, batch > 1 ? (int)batch : 1,
                                              c->lin_k_heads, c->lin_v_heads,
                                              c->lin_k_dim, c->lin_v_dim);
    n[B_SCRATCH] = zmax(zmax(zmax(ascr, sscr),
                             hp_backend_gdn_chunk_scratch(
                                 be, p->max_tokens, c->lin_v_heads,
                                 c->lin_k_dim, c->lin_v_dim, HP_FWD_GDN_CHUNK)),
                        (size_t)c->lin_k_dim * c->lin_k_dim);
    if (E > 0) {
        n[B_ROUTE] = R * E;
        n[B_XG] = n[B_EO] = R * H;
        n[B_MOEW] = n[B_MOEIDX] = n[B_ROWS] = R * K;
        n[B_MOESCALE] = n[B_MOESLOT] = R * K;
        n[B_MOEOFFS] = E + 1;
    }
    n[B_POS] = R;
    n[B_TC] = c->trans_floats;
    /* a product per linear layer, and one being formed */
    n[B_TCACC] = ((size_t)c->n_lin + 1) * c->trans_floats;
    if (p->max_step > 1) /* verified rows' raw conv inputs, every layer */
        n[B_SPECQKV] = (size_t)c->n_layers * brows * cd;
    n[B_SPECCONV] = c->conv_floats;
    /* batched logits; a one-sequence pass writes the caller's, through
     * here (HP_FWD_LOGIT_ROWS rows at a time) where backend memory is not
     * host memory */
    n[B_LOGITS] =
        (hp_backend_host_memory(be) ? brows
                                    : zmax(brows, zmin(R, HP_FWD_LOGIT_ROWS))) *
        c->vocab_size;
    n[B_ITEMS] = 4 * batch;
    n[B_KVBUFS] = 2 * batch; /* pointers, two floats each */
    n[B_DECODE] = 5 * batch; /* two pointers and an int each */
    n[B_BEST] = n[B_IDS] = brows;
    n[B_HOSTLOGITS] = hp_backend_host_memory(be) ? 0 : brows * c->vocab_size;
    n[B_CANDP] = n[B_CANDI] = n[B_CANDR] =
        hp_backend_host_memory(be) ? 0 : brows * (size_t)hp_fwd_topk(m);
    n[B_CANDL] = hp_backend_host_memory(be) ? 0 : 2 * brows;
    if (c->n_lin > 0) {
        n[B_JUMPS] = c->state_floats;
        n[B_JUMPSCR] = c->state_floats;
    }
}

/* Layout of the two allocations: in the host one the tables, the
 * verification records, then the host buffers; in the backend one the
 * rest; each buffer 64-byte aligned. off[] counts floats in its own
 * allocation; bytes[0] host, bytes[1] backend. */
static void layout(const hp_model_t *m, const hp_fwd_plan_t *p,
                   size_t n[B_COUNT], size_t off[B_COUNT], size_t bytes[2])
{
    size_t at[2] = {align16((B_COUNT * (sizeof(float *) + sizeof(size_t)) +
                             (size_t)p->max_batch * sizeof(hp_fwd_spec_t)) /
                                sizeof(float) +
                            1),
                    0};
    sizes(m, p, n);
    for (int i = 0; i < B_COUNT; i++) {
        int d = !is_host(i);
        off[i] = at[d];
        at[d] += align16(n[i]);
    }
    bytes[0] = at[0] * sizeof(float);
    bytes[1] = at[1] * sizeof(float);
}

/* The backend's own scratch for plan p's passes (hp_backend_reserve):
 * projections of up to R rows of the widest input; staged host arrays of
 * one op: positions or ids of R tokens, or per sequence of the batch two
 * pointer lists and a count, or a KVBuffer view with its block ids (up
 * to 1024 + max_step entries of 16-token blocks, hp_kvbuf_config_default:
 * under 128 ids); each array rounded to 256 bytes; the argmax of up to
 * R rows of logits (a device's partials of rows split over blocks). */
static hp_backend_plan_t backend_plan(const hp_model_t *m,
                                      const hp_fwd_plan_t *p)
{
    const hp_model_config_t *c = &m->cfg;
    size_t batch = p->max_batch > 0 ? (size_t)p->max_batch : 1;
    size_t R = zmax((size_t)p->max_tokens, batch * (size_t)p->max_step);
    size_t I =
        zmax((size_t)c->intermediate,
             zmax((size_t)c->moe_intermediate, (size_t)c->shared_intermediate));
    size_t cols = zmax(
        zmax((size_t)c->hidden, I),
        zmax(hp_cfg_value_dim(c), (size_t)c->n_heads * (size_t)c->head_dim));
    hp_backend_plan_t bp = {.rows = (int)R, .cols = (int)cols};
    for (int t = 0; t < 3; t++)
        if (m->weight_bytes[t])
            bp.wmask |= 1u << t;
    size_t per_seq = zmax(2 * sizeof(void *) + sizeof(int),
                          sizeof(hk_kvbuf_view_t) + 129 * sizeof(int));
    bp.stage = 4 * 256 + zmax(R * sizeof(int), batch * per_seq);
    return bp;
}

static int bad_plan(const hp_fwd_plan_t *p)
{
    return p->max_tokens < 1 || p->max_batch < 0 || p->max_step < 1 ||
           p->max_ctx < 1;
}

size_t hp_fwd_ws_bytes(const hp_model_t *m, const hp_fwd_plan_t *plan)
{
    hp_fwd_plan_t p = resolve(m, plan);
    size_t n[B_COUNT], off[B_COUNT], bytes[2];
    if (bad_plan(&p))
        return 0;
    layout(m, &p, n, off, bytes);
    return bytes[0] + bytes[1];
}

int hp_fwd_ws_init(hp_fwd_ws_t *ws, const hp_model_t *m,
                   const hp_fwd_plan_t *plan, hp_error_t *err)
{
    size_t n[B_COUNT], off[B_COUNT], bytes[2];
    memset(ws, 0, sizeof(*ws));
    ws->plan = resolve(m, plan);
    if (bad_plan(&ws->plan))
        return hp_error_set(err, HP_EBADINPUT,
                            "forward: bad workspace plan (%d tokens, batch "
                            "%d of %d, context %d)",
                            ws->plan.max_tokens, ws->plan.max_batch,
                            ws->plan.max_step, ws->plan.max_ctx);
    layout(m, &ws->plan, n, off, bytes);
    ws->be = m->be;
    ws->mem = aligned_alloc(64, bytes[0]);
    ws->dev = hp_backend_alloc(ws->be, bytes[1]);
    if (!ws->mem || !ws->dev) {
        hp_fwd_ws_free(ws);
        return hp_error_set(err, HP_ENOMEM,
                            "forward: no memory for a workspace of %zu MiB",
                            (bytes[0] + bytes[1]) >> 20);
    }
    hp_backend_plan_t bp = backend_plan(m, &ws->plan);
    int rc = hp_backend_reserve(ws->be, &bp, err);
    if (rc != HP_OK) {
        hp_fwd_ws_free(ws);
        return rc;
    }
    char *tables = ws->mem; /* pointers and sizes: 8-byte aligned */
    ws->buf = (float **)(void *)tables;
    ws->cap = (size_t *)(void *)(tables + B_COUNT * sizeof(float *));
    ws->spec = (hp_fwd_spec_t *)(void *)(tables + B_COUNT * (sizeof(float *) +
                                                             sizeof(size_t)));
    ws->n = B_COUNT;
    for (int i = 0; i < B_COUNT; i++) {
        ws->buf[i] =
            (is_host(i) ? (float *)ws->mem : (float *)ws->dev) + off[i];
        ws->cap[i] = n[i];
    }
    return HP_OK;
}

void hp_fwd_ws_free(hp_fwd_ws_t *ws)
{
    free(ws->mem);
    if (ws->be)
        hp_backend_free(ws->be, ws->dev);
    memset(ws, 0, sizeof(*ws));
}

void *hp_fwd_buf(hp_fwd_ws_t *ws, int id, size_t n)
{
    if (!ws->mem || n > ws->cap[id])
        return NULL;
    return ws->buf[id];
}

hp_fwd_jump_mem_t hp_fwd_jump_mem(hp_fwd_ws_t *ws)
{
    hp_fwd_jump_mem_t j = {NULL, NULL};
    if (ws->mem && ws->cap[B_JUMPS] > 0)
        j = (hp_fwd_jump_mem_t){ws->buf[B_JUMPS], ws->buf[B_JUMPSCR]};
    return j;
}

/* ---- a call in pieces -------------------------------------------------- */

/* One piece's view of the caller's jumps: its own jumps are the caller's
 * [first, first + n_own), shifted; when the caller's transition run goes
 * on past the piece, one more jump at the piece's end takes the part
 * done so far into the product acc (per linear layer). */
typedef struct {
    const hp_model_t *m;
    const hp_model_config_t *c;
    const hp_jumps_t *jumps;
    int first, n_own;
    int acc_on; /* acc holds the run's earlier pieces */
    float *acc; /* [n_lin][Hv, dk, dk] */
    float *tmp; /* [Hv, dk, dk]: the product being formed */
    float *scr; /* trans_compose's scratch, [dk, dk] */
} piece_t;

/* T [Hv, dk, dk] <- Tp T, head by head (the later transition first). */
static void chain(const hp_model_t *m, float *T, const float *Tp, float *tmp,
                  float *scr)
{
    const hp_model_config_t *c = &m->cfg;
    int Hv = c->lin_v_heads, dk = c->lin_k_dim;
    hp_backend_trans_compose(m->be, tmp, HK_TRANS_DENSE, Tp, T, NULL, Hv, dk,
                             dk, scr);
    hp_backend_copy(m->be, T, tmp, c->trans_floats * sizeof(float));
}

static int piece_jump(void *ud, int l, int j, float *S, float *conv,
                      const float *Tc, hp_error_t *err)
{
    piece_t *pc = ud;
    float *acc = pc->acc + (size_t)pc->c->slot[l] * pc->c->trans_floats;
    if (j == pc->n_own) { /* the piece's end, inside the transition run */
        if (pc->acc_on)
            chain(pc->m, acc, Tc, pc->tmp, pc->scr);
        else
            hp_backend_copy(pc->m->be, acc, Tc,
                            pc->c->trans_floats * sizeof(float));
        return HP_OK;
    }
    int g = pc->first + j;
    if (g == pc->jumps->tc_run && pc->acc_on) {
        chain(pc->m, acc, Tc, pc->tmp, pc->scr);
        Tc = acc;
    }
    return pc->jumps->fn(pc->jumps->ud, l, g, S, conv, Tc, err);
}

int hp_forward(const hp_model_t *m, hp_seq_t *seq, hp_fwd_ws_t *ws,
               const int *ids, const int *pos, int T, const hp_jumps_t *jumps,
               hp_logits_mode_t mode, float *logits, hp_error_t *err)
{
    const hp_model_config_t *c = &m->cfg;
    int P = ws->plan.max_tokens;
    if (!ws->mem)
        return hp_error_set(err, HP_ENOMEM,
                            "forward: no workspace (its allocation failed)");
    if (T <= P)
        return hp_fwd_run(m, seq, ws, ids, pos, T, jumps, mode, logits, err);

    int *after = NULL, rc = HP_OK, tc = jumps ? jumps->tc_run : -1;
    piece_t pc = {m, c, jumps, 0, 0, 0, NULL, NULL, NULL};
    if (jumps) {
        after = malloc(((size_t)jumps->n + 1) * sizeof(int));
        if (!after)
            return hp_error_set(err, HP_ENOMEM, "forward: out of memory");
    }
    if (tc >= 0) {
        size_t acc = (size_t)c->n_lin * c->trans_floats;
        pc.acc = hp_fwd_buf(ws, B_TCACC, acc + c->trans_floats);
        pc.tmp = pc.acc ? pc.acc + acc : NULL;
        /* GDN's scratch: free while a jump runs */
        pc.scr = hp_fwd_buf(ws, B_SCRATCH, (size_t)c->lin_k_dim * c->lin_k_dim);
        if (!pc.acc || !pc.scr)
            rc = hp_error_set(err, HP_EINTERNAL, "forward: workspace plan");
    }
    for (int off = 0; off < T && rc == HP_OK; off += P) {
        int n = T - off < P ? T - off : P, last = off + n == T;
        hp_jumps_t pj = {after, 0, -1, piece_jump, &pc};
        if (jumps) {
            while (pc.first + pj.n < jumps->n &&
                   jumps->after[pc.first + pj.n] <= off + n) {
                after[pj.n] = jumps->after[pc.first + pj.n] - off;
                pj.n++;
            }
            pc.n_own = pj.n;
            /* the run in progress at the piece's end is the caller's run
             * pc.first + n_own; the transition run's own pieces */
            if (tc >= pc.first && tc <= pc.first + pj.n)
                pj.tc_run = tc - pc.first;
            if (!last && tc == pc.first + pj.n)
                after[pj.n++] = n; /* the run goes on: keep its part */
        }
        rc = hp_fwd_run(m, seq, ws, ids + off, pos ? pos + off : NULL, n,
                        jumps ? &pj : NULL,
                        !last && mode == HP_LOGITS_LAST ? HP_LOGITS_NONE : mode,
                        mode == HP_LOGITS_ALL
                            ? logits + (size_t)off * c->vocab_size
                            : logits,
                        err);
        if (jumps) {
            pc.acc_on = pj.n > pc.n_own;
            pc.first += pc.n_own;
        }
    }
    free(after);
    return rc;
}
