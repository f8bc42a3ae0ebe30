/* seq.c - allocation and reset of one sequence's running state. */
#include "engine/forward/seq.h"

#include <stdlib.h>
#include <string.h>

int hp_seq_init(hp_seq_t *s, const hp_model_t *m, hp_error_t *err)
{
    const hp_model_config_t *c = &m->cfg;
    memset(s, 0, sizeof(*s));
    s->model = m;
    s->be = m->be;
    s->layers = calloc(c->n_layers, sizeof(*s->layers));
    if (!s->layers)
        return hp_error_set(err, HP_ENOMEM, "sequence: out of memory");
    for (int l = 0; l < c->n_layers; l++) {
        if (c->layer_kind[l] != HP_LAYER_LINEAR)
            continue;
        size_t sb = c->state_floats * sizeof(float);
        size_t cb = (c->conv_floats + 1) * sizeof(float);
        s->layers[l].S = hp_backend_alloc0(s->be, sb);
        s->layers[l].conv = hp_backend_alloc0(s->be, cb);
        if (!s->layers[l].S || !s->layers[l].conv) {
            hp_seq_free(s);
            return hp_error_set(err, HP_ENOMEM, "sequence: out of memory");
        }
    }
    return HP_OK;
}

static void kvbuf_drop(hp_seq_t *s)
{
    for (int l = 0; s->kvpool && l < s->model->cfg.n_layers; l++)
        if (s->layers[l].kvb.blocks)
            hp_kvbuf_close(s->kvpool, &s->layers[l].kvb);
    s->kvpool = NULL;
    s->spec_T = 0;
}

int hp_seq_kvbuf_open(hp_seq_t *s, hp_kvbuf_pool_t *pool, hp_error_t *err)
{
    const hp_model_config_t *c = &s->model->cfg;
    if (!pool)
        return hp_error_set(err, HP_EBADINPUT, "sequence: no KVBuffer pool");
    if (pool->cfg.Hk != c->lin_k_heads || pool->cfg.Hv != c->lin_v_heads ||
        pool->cfg.dk != c->lin_k_dim || pool->cfg.dv != c->lin_v_dim)
        return hp_error_set(err, HP_EBADINPUT,
                            "sequence: KVBuffer pool shaped for another model");
    if (pool->be != s->be)
        return hp_error_set(err, HP_EBADINPUT,
                            "sequence: KVBuffer pool on backend %s, the "
                            "model on %s",
                            hp_backend_name(pool->be), hp_backend_name(s->be));
    if (s->kvpool)
        return HP_OK;
    s->kvpool = pool;
    for (int l = 0; l < c->n_layers; l++) {
        hp_seq_layer_t *sl = &s->layers[l];
        if (c->layer_kind[l] != HP_LAYER_LINEAR)
            continue;
        int rc = s->n_pos == 0
                     ? hp_kvbuf_open(pool, &sl->kvb, NULL, sl->S, err)
                     : hp_kvbuf_open(pool, &sl->kvb, sl->S, NULL, err);
        if (rc != HP_OK) {
            kvbuf_drop(s);
            return rc;
        }
    }
    return HP_OK;
}

int hp_seq_kvbuf_close(hp_seq_t *s, hp_error_t *err)
{
    if (!s->kvpool)
        return HP_OK;
    if (s->spec_T)
        return hp_error_set(err, HP_EBADINPUT,
                            "sequence: close with an unresolved verification");
    for (int l = 0; l < s->model->cfg.n_layers; l++) {
        hp_seq_layer_t *sl = &s->layers[l];
        if (!sl->kvb.blocks)
            continue;
        /* The storage is S itself, so folding cannot run out of slots;
         * a KV-only buffer with no entries leaves S as the empty state. */
        int rc = hp_kvbuf_fold(s->kvpool, &sl->kvb, err);
        if (rc != HP_OK)
            return rc;
        if (!sl->kvb.S)
            hp_backend_memset0(s->be, sl->S,
                               s->model->cfg.state_floats * sizeof(float));
    }
    kvbuf_drop(s);
    return HP_OK;
}

void hp_seq_free(hp_seq_t *s)
{
    if (!s->layers)
        return;
    kvbuf_drop(s);
    for (int l = 0; l < s->model->cfg.n_layers; l++) {
        hp_backend_free(s->be, s->layers[l].S);
        hp_backend_free(s->be, s->layers[l].conv);
        hp_backend_free(s->be, s->layers[l].k);
        hp_backend_free(s->be, s->layers[l].v);
    }
    free(s->layers);
    memset(s, 0, sizeof(*s));
}

int hp_seq_reserve(hp_seq_t *s, int n, hp_error_t *err)
{
    const hp_model_config_t *c = &s->model->cfg;
    if (n <= s->kv_cap)
        return HP_OK;
    int cap = s->kv_cap ? s->kv_cap : 256;
    while (cap < n)
        cap *= 2;
    size_t row = c->kv_row * sizeof(float);
    size_t old = (size_t)s->kv_cap * row, bytes = (size_t)cap * row;
    for (int l = 0; l < c->n_layers; l++) {
        if (c->layer_kind[l] != HP_LAYER_FULL)
            continue;
        float *k = hp_backend_realloc(s->be, s->layers[l].k, old, bytes);
        if (k)
            s->layers[l].k = k;
        float *v = hp_backend_realloc(s->be, s->layers[l].v, old, bytes);
        if (v)
            s->layers[l].v = v;
        if (!k || !v)
            return hp_error_set(err, HP_ENOMEM,
                                "sequence: no memory for %d positions", cap);
    }
    s->kv_cap = cap;
    return HP_OK;
}

void hp_seq_reset(hp_seq_t *s)
{
    const hp_model_config_t *c = &s->model->cfg;
    kvbuf_drop(s);
    for (int l = 0; l < c->n_layers; l++) {
        if (s->layers[l].S) {
            hp_backend_memset0(s->be, s->layers[l].S,
                               c->state_floats * sizeof(float));
            hp_backend_memset0(s->be, s->layers[l].conv,
                               c->conv_floats * sizeof(float));
        }
    }
    s->n_pos = 0;
}

int hp_seq_copy(hp_seq_t *dst, const hp_seq_t *src, hp_error_t *err)
{
    const hp_model_config_t *c = &src->model->cfg;
    if (src->kvpool || dst->kvpool)
        return hp_error_set(err, HP_EBADINPUT,
                            "sequence: copy with KVBuffers open");
    int rc = hp_seq_reserve(dst, src->kv_cap, err);
    if (rc != HP_OK)
        return rc;
    size_t kv = (size_t)src->n_pos * c->kv_row * sizeof(float);
    for (int l = 0; l < c->n_layers; l++) {
        const hp_seq_layer_t *a = &src->layers[l];
        hp_seq_layer_t *b = &dst->layers[l];
        if (c->layer_kind[l] == HP_LAYER_LINEAR) {
            hp_backend_copy(src->be, b->S, a->S,
                            c->state_floats * sizeof(float));
            hp_backend_copy(src->be, b->conv, a->conv,
                            c->conv_floats * sizeof(float));
        } else if (kv) {
            hp_backend_copy(src->be, b->k, a->k, kv);
            hp_backend_copy(src->be, b->v, a->v, kv);
        }
    }
    dst->n_pos = src->n_pos;
    return HP_OK;
}

void hp_seq_state_pack(const hp_seq_t *s, int l, float *buf)
{
    const hp_model_config_t *c = &s->model->cfg;
    hp_backend_download(s->be, buf, s->layers[l].S,
                        c->state_floats * sizeof(float));
    hp_backend_download(s->be, buf + c->state_floats, s->layers[l].conv,
                        c->conv_floats * sizeof(float));
}

void hp_seq_state_unpack(hp_seq_t *s, int l, const float *buf)
{
    const hp_model_config_t *c = &s->model->cfg;
    hp_backend_upload(s->be, s->layers[l].S, buf,
                      c->state_floats * sizeof(float));
    hp_backend_upload(s->be, s->layers[l].conv, buf + c->state_floats,
                      c->conv_floats * sizeof(float));
}

void hp_seq_kv_pack(const hp_seq_t *s, int l, int at, int n, float *k, float *v)
{
    size_t row = s->model->cfg.kv_row, bytes = (size_t)n * row * sizeof(float);
    if (n <= 0)
        return;
    hp_backend_download(s->be, k, s->layers[l].k + (size_t)at * row, bytes);
    hp_backend_download(s->be, v, s->layers[l].v + (size_t)at * row, bytes);
}

void hp_seq_kv_unpack(hp_seq_t *s, int l, int at, int n, const float *k,
                      const float *v)
{
    size_t row = s->model->cfg.kv_row, bytes = (size_t)n * row * sizeof(float);
    if (n <= 0)
        return;
    hp_backend_upload(s->be, s->layers[l].k + (size_t)at * row, k, bytes);
    hp_backend_upload(s->be, s->layers[l].v + (size_t)at * row, v, bytes);
}

size_t hp_seq_bytes(const hp_model_t *m, int n)
{
    const hp_model_config_t *c = &m->cfg;
    size_t b = 0;
    for (int l = 0; l < c->n_layers; l++)
        b += c->layer_kind[l] == HP_LAYER_LINEAR
                 ? (c->state_floats + c->conv_floats) * sizeof(float)
                 : 2 * (size_t)n * c->kv_row * sizeof(float);
    return b;
}
