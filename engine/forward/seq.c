/* seq.c - allocation and reset of one sequence's running state. */
#include "engine/forward/seq.h"

#include <stdlib.h>
#include <string.h>

static size_t state_floats(const hp_model_config_t *c)
{
    return (size_t)c->lin_v_heads * c->lin_k_dim * c->lin_v_dim;
}

static size_t conv_floats(const hp_model_config_t *c)
{
    return (size_t)hp_cfg_conv_dim(c) * (c->conv_kernel - 1);
}

static size_t kv_row(const hp_model_config_t *c)
{
    return (size_t)c->n_kv_heads * c->head_dim;
}

int hp_seq_init(hp_seq_t *s, const hp_model_t *m, hp_error_t *err)
{
    const hp_model_config_t *c = &m->cfg;
    memset(s, 0, sizeof(*s));
    s->model = m;
    s->layers = calloc(c->n_layers, sizeof(*s->layers));
    if (!s->layers)
        return hp_error_set(err, HP_ENOMEM, "sequence: out of memory");
    for (int l = 0; l < c->n_layers; l++) {
        if (c->layer_kind[l] != HP_LAYER_LINEAR)
            continue;
        s->layers[l].S = calloc(state_floats(c), sizeof(float));
        s->layers[l].conv = calloc(conv_floats(c) + 1, sizeof(float));
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
            memset(sl->S, 0,
                   (size_t)s->model->cfg.lin_v_heads * s->model->cfg.lin_k_dim *
                       s->model->cfg.lin_v_dim * sizeof(float));
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
        free(s->layers[l].S);
        free(s->layers[l].conv);
        free(s->layers[l].k);
        free(s->layers[l].v);
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
    size_t bytes = (size_t)cap * kv_row(c) * sizeof(float);
    for (int l = 0; l < c->n_layers; l++) {
        if (c->layer_kind[l] != HP_LAYER_FULL)
            continue;
        float *k = realloc(s->layers[l].k, bytes);
        if (k)
            s->layers[l].k = k;
        float *v = realloc(s->layers[l].v, bytes);
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
            memset(s->layers[l].S, 0, state_floats(c) * sizeof(float));
            memset(s->layers[l].conv, 0, conv_floats(c) * sizeof(float));
        }
    }
    s->n_pos = 0;
}

size_t hp_seq_bytes(const hp_model_t *m, int n)
{
    const hp_model_config_t *c = &m->cfg;
    size_t b = 0;
    for (int l = 0; l < c->n_layers; l++)
        b += c->layer_kind[l] == HP_LAYER_LINEAR
                 ? (state_floats(c) + conv_floats(c)) * sizeof(float)
                 : 2 * (size_t)n * kv_row(c) * sizeof(float);
    return b;
}
