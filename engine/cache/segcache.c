/* segcache.c - segment cache entries: layout, capture, load (segcache.h). */
#include "engine/cache/segcache.h"

#include <stdlib.h>
#include <string.h>

typedef struct {
    size_t T, S, conv, K, V; /* float offsets after the header, or -1 */
} layer_off_t;

static size_t kv_rows(const hp_segc_hdr_t *h)
{
    return (size_t)(h->kind == HP_SEGC_PIC ? h->n_int : h->n_tok);
}

/* Walks the layers up to `layer` (or all when layer < 0); returns the
 * total float count and fills *o for `layer`. */
static size_t layout(const hp_model_config_t *c, uint32_t kind, size_t rows,
                     int layer, layer_off_t *o)
{
    size_t at = 0, none = (size_t)-1, kv = rows * c->kv_row;
    for (int l = 0; l < c->n_layers; l++) {
        layer_off_t x = {none, none, none, none, none};
        if (c->layer_kind[l] == HP_LAYER_LINEAR) {
            if (kind == HP_SEGC_PIC) {
                x.T = at;
                at += c->trans_floats;
            }
            /* S then conv, as hp_seq_state_pack lays them out */
            x.S = at;
            at += c->state_floats;
            x.conv = at;
            at += c->conv_floats;
        } else {
            x.K = at;
            at += kv;
            x.V = at;
            at += kv;
        }
        /* layer < 0 asks for the total only */
        if (o && (unsigned)l == (unsigned)layer)
            *o = x;
    }
    return at;
}

size_t hp_segc_bytes(const hp_model_config_t *c, hp_segc_kind_t kind, int n_tok,
                     int w)
{
    size_t rows = (size_t)(kind == HP_SEGC_PIC ? n_tok - 2 * w : n_tok);
    return sizeof(hp_segc_hdr_t) +
           layout(c, kind, rows, -1, NULL) * sizeof(float);
}

_Static_assert(sizeof(hp_segc_hdr_t) <= sizeof(((hp_pool_entry_t *)0)->meta),
               "the header fits a pool entry's meta");

const hp_segc_hdr_t *hp_segc_hdr(const hp_pool_entry_t *e)
{
    return (const hp_segc_hdr_t *)(const void *)e->meta;
}

/* The header goes to meta, and into the data's slot where the host can
 * write it (an upload would wait for the device for 64 bytes nobody on
 * the device reads). */
static void set_hdr(hp_pool_entry_t *e, const hp_backend_t *be,
                    const hp_segc_hdr_t *h)
{
    memcpy(e->meta, h, sizeof(*h));
    if (hp_backend_host_memory(be))
        memcpy(e->data, h, sizeof(*h));
}

void hp_segc_adopt(hp_pool_entry_t *e, const void *bytes)
{
    memcpy(e->meta, bytes, sizeof(hp_segc_hdr_t));
}

static float *view(const hp_model_config_t *c, const hp_pool_entry_t *e,
                   int layer, int which)
{
    const hp_segc_hdr_t *h = hp_segc_hdr(e);
    layer_off_t o;
    layout(c, h->kind, kv_rows(h), layer, &o);
    size_t off = which == 0   ? o.T
                 : which == 1 ? o.S
                 : which == 2 ? o.conv
                 : which == 3 ? o.K
                              : o.V;
    if (off == (size_t)-1)
        return NULL;
    return (float *)(void *)((char *)e->data + sizeof(*h)) + off;
}

float *hp_segc_T(const hp_model_config_t *c, const hp_pool_entry_t *e, int l)
{
    return view(c, e, l, 0);
}
float *hp_segc_S(const hp_model_config_t *c, const hp_pool_entry_t *e, int l)
{
    return view(c, e, l, 1);
}
float *hp_segc_conv(const hp_model_config_t *c, const hp_pool_entry_t *e, int l)
{
    return view(c, e, l, 2);
}
float *hp_segc_K(const hp_model_config_t *c, const hp_pool_entry_t *e, int l)
{
    return view(c, e, l, 3);
}
float *hp_segc_V(const hp_model_config_t *c, const hp_pool_entry_t *e, int l)
{
    return view(c, e, l, 4);
}

static void arena_release(void *be, void *arena, size_t bytes)
{
    hp_arena_mem_free(be, arena, bytes);
}

hp_pool_t *hp_segc_pool_create(const hp_backend_t *be, size_t budget,
                               hp_error_t *err)
{
    budget = hp_arena_round(budget); /* 0: a mode that caches nothing */
    void *arena = hp_arena_mem(be, budget);
    if (!arena) {
        hp_error_set(err, HP_ENOMEM,
                     "%s: no memory for a public pool of %.1f MiB "
                     "(public_pool)",
                     hp_backend_name(be), budget / 1048576.0);
        return NULL;
    }
    hp_pool_t *p =
        hp_pool_create_in(arena, budget, arena_release, (void *)be, err);
    if (!p)
        hp_arena_mem_free(be, arena, budget);
    return p;
}

void hp_segc_capture_state(hp_pool_entry_t *e, const hp_seq_t *seq)
{
    const hp_model_config_t *c = &seq->model->cfg;
    hp_segc_hdr_t h = {.magic = HP_SEGC_MAGIC,
                       .kind = HP_SEGC_STATE,
                       .n_tok = seq->n_pos,
                       .n_int = seq->n_pos};
    set_hdr(e, seq->be, &h);
    for (int l = 0; l < c->n_layers; l++)
        if (c->layer_kind[l] == HP_LAYER_LINEAR)
            hp_seq_state_pack(seq, l, hp_segc_S(c, e, l), HP_MEM_BACKEND);
        else
            hp_seq_kv_pack(seq, l, 0, seq->n_pos, hp_segc_K(c, e, l),
                           hp_segc_V(c, e, l), HP_MEM_BACKEND);
}

int hp_segc_load_state(hp_seq_t *seq, const hp_pool_entry_t *e, hp_error_t *err)
{
    const hp_model_config_t *c = &seq->model->cfg;
    const hp_segc_hdr_t *h = hp_segc_hdr(e);
    if (h->magic != HP_SEGC_MAGIC || h->kind != HP_SEGC_STATE)
        return hp_error_set(err, HP_EINTERNAL, "segcache: not a state");
    int rc = hp_seq_reserve(seq, h->n_tok, err);
    if (rc != HP_OK)
        return rc;
    for (int l = 0; l < c->n_layers; l++)
        if (c->layer_kind[l] == HP_LAYER_LINEAR)
            hp_seq_state_unpack(seq, l, hp_segc_S(c, e, l), HP_MEM_BACKEND);
        else
            hp_seq_kv_unpack(seq, l, 0, h->n_tok, hp_segc_K(c, e, l),
                             hp_segc_V(c, e, l), HP_MEM_BACKEND);
    seq->n_pos = h->n_tok;
    return HP_OK;
}

/* The sequence a build runs in: the workspace's build sequence, reset,
 * else *own, made now (build_end frees it). */
static int build_begin(const hp_model_t *m, hp_fwd_ws_t *ws, hp_seq_t *own,
                       hp_seq_t **seq, hp_error_t *err)
{
    *seq = ws->build_seq;
    if (*seq && (*seq)->model == m) {
        hp_seq_reset(*seq);
        return HP_OK;
    }
    *seq = own;
    return hp_seq_init(own, m, err);
}

static void build_end(hp_seq_t *seq, hp_seq_t *own)
{
    if (seq == own)
        hp_seq_free(own);
}

int hp_segc_build_state(hp_pool_entry_t *e, const hp_model_t *m,
                        hp_fwd_ws_t *ws, const int *ids, int n, hp_error_t *err)
{
    hp_seq_t own, *seq;
    int rc = build_begin(m, ws, &own, &seq, err);
    if (rc != HP_OK)
        return rc;
    if (n > 0)
        rc = hp_prefill(m, seq, ws, ids, n, 0, NULL, err);
    if (rc == HP_OK)
        hp_segc_capture_state(e, seq);
    build_end(seq, &own);
    return rc;
}

/* The capture pass, in backend memory: jump 0 (after the head) parks
 * S_head in the entry's S slot; jump 1 (after the interior) turns S_end
 * into S_C|0 = S_end - T_C S_head there and keeps T_C and the conv tail. */
typedef struct {
    const hp_model_config_t *c;
    const hp_backend_t *be;
    hp_pool_entry_t *e;
    hp_fwd_jump_mem_t jm;
} capture_t;

static int capture_jump(void *ud, int l, int j, float *S, float *conv,
                        const float *Tc, hp_error_t *err)
{
    capture_t *cp = ud;
    const hp_model_config_t *c = cp->c;
    const hp_backend_t *be = cp->be;
    float *S0 = hp_segc_S(c, cp->e, l);
    size_t sb = c->state_floats * sizeof(float);
    if (j == 0) {
        hp_backend_copy(be, S0, S, sb);
        return HP_OK;
    }
    if (!Tc)
        return hp_error_set(err, HP_EINTERNAL, "segcache: no transition");
    hp_backend_trans_compose(be, cp->jm.s, HK_TRANS_DENSE, Tc, S0, NULL,
                             c->lin_v_heads, c->lin_k_dim, c->lin_v_dim,
                             cp->jm.scr);
    hp_backend_copy(be, S0, S, sb);
    hp_backend_axpy(be, S0, -1.0f, cp->jm.s, c->state_floats);
    hp_backend_copy(be, hp_segc_T(c, cp->e, l), Tc,
                    c->trans_floats * sizeof(float));
    hp_backend_copy(be, hp_segc_conv(c, cp->e, l), conv,
                    c->conv_floats * sizeof(float));
    return HP_OK;
}

int hp_segc_build_pic(hp_pool_entry_t *e, const hp_model_t *m, hp_fwd_ws_t *ws,
                      const int *ids, int n, int w, hp_error_t *err)
{
    const hp_model_config_t *c = &m->cfg;
    int n_int = n - 2 * w;
    if (n_int <= 0)
        return hp_error_set(err, HP_EINTERNAL,
                            "segcache: %d tokens have no interior at seam %d",
                            n, w);
    hp_segc_hdr_t h = {.magic = HP_SEGC_MAGIC,
                       .kind = HP_SEGC_PIC,
                       .n_tok = n,
                       .w = w,
                       .n_int = n_int};
    set_hdr(e, m->be, &h);
    hp_seq_t own, *seq;
    int rc = build_begin(m, ws, &own, &seq, err);
    if (rc != HP_OK)
        return rc;
    capture_t cp = {c, m->be, e, hp_fwd_jump_mem(ws)};
    int after[2] = {w, n - w};
    hp_jumps_t jumps = {after, 2, 1, capture_jump, &cp};
    if (c->n_lin > 0 && !cp.jm.s)
        rc = hp_error_set(err, HP_EINTERNAL, "segcache: no workspace");
    if (rc == HP_OK)
        rc = hp_forward(m, seq, ws, ids, NULL, n - w, &jumps, HP_LOGITS_NONE,
                        NULL, err);
    for (int l = 0; rc == HP_OK && l < c->n_layers; l++)
        if (c->layer_kind[l] == HP_LAYER_FULL)
            hp_seq_kv_pack(seq, l, w, n_int, hp_segc_K(c, e, l),
                           hp_segc_V(c, e, l), HP_MEM_BACKEND);
    /* a device reports its failures here, before the entry is published */
    if (rc == HP_OK)
        rc = hp_backend_sync(m->be, err);
    build_end(seq, &own);
    return rc;
}

void hp_segc_conv_jump(const hp_backend_t *be, float *conv, const float *tail,
                       int n_int, int C, int Kc)
{
    int K1 = Kc - 1;
    if (n_int >= K1) {
        hp_backend_copy(be, conv, tail, (size_t)C * K1 * sizeof(float));
        return;
    }
    /* rare (an interior of one or two tokens): rows through the host, a
     * block of channels at a time */
    float run[512], cached[512];
    int per = (int)(sizeof(run) / sizeof(float)) / K1;
    for (int c0 = 0; c0 < C; c0 += per) {
        int nc = C - c0 < per ? C - c0 : per;
        size_t off = (size_t)c0 * K1, bytes = (size_t)nc * K1 * sizeof(float);
        hp_backend_download(be, run, conv + off, bytes);
        hp_backend_download(be, cached, tail + off, bytes);
        for (int ch = 0; ch < nc; ch++) {
            float *r = run + (size_t)ch * K1;
            const float *t = cached + (size_t)ch * K1;
            memmove(r, r + n_int, (size_t)(K1 - n_int) * sizeof(float));
            memcpy(r + K1 - n_int, t + K1 - n_int,
                   (size_t)n_int * sizeof(float));
        }
        hp_backend_upload(be, conv + off, run, bytes);
    }
}
