/* seq.c - allocation and reset of one sequence's running state. */
#include "engine/forward/seq.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

struct hp_seq_pool {
    const hp_backend_t *be;
    char *base;
    size_t bytes;
    pthread_mutex_t mu;
    size_t (*ext)[2]; /* free extents: offset, length; by offset, merged */
    int n_ext, cap_ext;
};

#define POOL_ALIGN 256 /* as cudaMalloc's */

static size_t pool_round(size_t bytes)
{
    return (bytes + POOL_ALIGN - 1) & ~(size_t)(POOL_ALIGN - 1);
}

/* The bytes of a linear layer's conv history: one float past it, as the
 * kernels' own allocation (hp_seq_init) */
static size_t conv_bytes(const hp_model_config_t *c)
{
    return (c->conv_floats + 1) * sizeof(float);
}

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
        size_t cb = conv_bytes(c);
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

static void pool_put(hp_seq_pool_t *p, size_t off, size_t len);

void hp_seq_free(hp_seq_t *s)
{
    if (!s->layers)
        return;
    kvbuf_drop(s);
    for (int l = 0; !s->pool && l < s->model->cfg.n_layers; l++) {
        hp_backend_free(s->be, s->layers[l].S);
        hp_backend_free(s->be, s->layers[l].conv);
        hp_backend_free(s->be, s->layers[l].k);
        hp_backend_free(s->be, s->layers[l].v);
    }
    if (s->pool)
        pool_put(s->pool, s->pool_off, s->pool_len);
    free(s->layers);
    memset(s, 0, sizeof(*s));
}

static int pool_move(hp_seq_t *s, int n, int cap, hp_error_t *err);

int hp_seq_reserve(hp_seq_t *s, int n, hp_error_t *err)
{
    const hp_model_config_t *c = &s->model->cfg;
    if (n <= s->kv_cap)
        return HP_OK;
    int cap = s->kv_cap ? s->kv_cap : 256;
    while (cap < n)
        cap *= 2;
    if (s->pool) {
        int rc = pool_move(s, n, cap, err);
        return rc == HP_EBUSY ? hp_error_set(err, HP_ENOMEM,
                                             "sequence: no memory for %d "
                                             "positions",
                                             n)
                              : rc;
    }
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

void hp_seq_state_pack(const hp_seq_t *s, int l, float *buf, hp_mem_t mem)
{
    const hp_model_config_t *c = &s->model->cfg;
    hp_backend_get(s->be, buf, mem, s->layers[l].S,
                   c->state_floats * sizeof(float));
    hp_backend_get(s->be, buf + c->state_floats, mem, s->layers[l].conv,
                   c->conv_floats * sizeof(float));
}

void hp_seq_state_unpack(hp_seq_t *s, int l, const float *buf, hp_mem_t mem)
{
    const hp_model_config_t *c = &s->model->cfg;
    hp_backend_put(s->be, s->layers[l].S, buf, mem,
                   c->state_floats * sizeof(float));
    hp_backend_put(s->be, s->layers[l].conv, buf + c->state_floats, mem,
                   c->conv_floats * sizeof(float));
}

void hp_seq_kv_pack(const hp_seq_t *s, int l, int at, int n, float *k, float *v,
                    hp_mem_t mem)
{
    size_t row = s->model->cfg.kv_row, bytes = (size_t)n * row * sizeof(float);
    if (n <= 0)
        return;
    hp_backend_get(s->be, k, mem, s->layers[l].k + (size_t)at * row, bytes);
    hp_backend_get(s->be, v, mem, s->layers[l].v + (size_t)at * row, bytes);
}

void hp_seq_kv_unpack(hp_seq_t *s, int l, int at, int n, const float *k,
                      const float *v, hp_mem_t mem)
{
    size_t row = s->model->cfg.kv_row, bytes = (size_t)n * row * sizeof(float);
    if (n <= 0)
        return;
    hp_backend_put(s->be, s->layers[l].k + (size_t)at * row, k, mem, bytes);
    hp_backend_put(s->be, s->layers[l].v + (size_t)at * row, v, mem, bytes);
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

/* ---- the sequence pool -------------------------------------------------- */

int hp_seq_pool_create(hp_seq_pool_t **out, const hp_backend_t *be,
                       size_t bytes, hp_error_t *err)
{
    hp_seq_pool_t *p = calloc(1, sizeof(*p));
    *out = NULL;
    bytes = pool_round(bytes);
    if (p) {
        p->ext = malloc(16 * sizeof(*p->ext));
        p->cap_ext = 16;
    }
    if (p && p->ext && bytes)
        p->base = hp_backend_alloc(be, bytes);
    if (!p || !p->ext || !p->base) {
        if (p)
            free(p->ext);
        free(p);
        return hp_error_set(err, HP_ENOMEM,
                            "sequence pool: no memory for %zu MiB on %s "
                            "(lower seq_budget or max_context)",
                            bytes >> 20, hp_backend_name(be));
    }
    p->be = be;
    p->bytes = bytes;
    p->ext[0][0] = 0;
    p->ext[0][1] = bytes;
    p->n_ext = 1;
    pthread_mutex_init(&p->mu, NULL);
    *out = p;
    return HP_OK;
}

void hp_seq_pool_free(hp_seq_pool_t *p)
{
    if (!p)
        return;
    hp_backend_free(p->be, p->base);
    pthread_mutex_destroy(&p->mu);
    free(p->ext);
    free(p);
}

size_t hp_seq_pool_bytes(const hp_seq_pool_t *p)
{
    return p->bytes;
}

size_t hp_seq_pool_free_bytes(const hp_seq_pool_t *p, size_t *largest)
{
    hp_seq_pool_t *q = (hp_seq_pool_t *)p; /* the lock only */
    size_t all = 0, big = 0;
    pthread_mutex_lock(&q->mu);
    for (int i = 0; i < p->n_ext; i++) {
        all += p->ext[i][1];
        if (p->ext[i][1] > big)
            big = p->ext[i][1];
    }
    pthread_mutex_unlock(&q->mu);
    if (largest)
        *largest = big;
    return all;
}

size_t hp_seq_pool_need(const hp_model_t *m, int n)
{
    const hp_model_config_t *c = &m->cfg;
    size_t b = 0;
    for (int l = 0; l < c->n_layers; l++)
        b += c->layer_kind[l] == HP_LAYER_LINEAR
                 ? pool_round(c->state_floats * sizeof(float)) +
                       pool_round(conv_bytes(c))
                 : 2 * pool_round((size_t)n * c->kv_row * sizeof(float));
    return b;
}

/* First fit: the offset of len bytes taken, or (size_t)-1. */
static size_t pool_take(hp_seq_pool_t *p, size_t len)
{
    size_t off = (size_t)-1;
    pthread_mutex_lock(&p->mu);
    for (int i = 0; i < p->n_ext; i++) {
        if (p->ext[i][1] < len)
            continue;
        off = p->ext[i][0];
        p->ext[i][0] += len;
        p->ext[i][1] -= len;
        if (!p->ext[i][1]) {
            memmove(&p->ext[i], &p->ext[i + 1],
                    (size_t)(p->n_ext - i - 1) * sizeof(*p->ext));
            p->n_ext--;
        }
        break;
    }
    pthread_mutex_unlock(&p->mu);
    return off;
}

/* Gives [off, off + len) back, merged with its neighbours. The list can
 * always grow by one: extents taken outnumber the gaps between them, and
 * the array grows before it is full (a host allocation). */
static void pool_put(hp_seq_pool_t *p, size_t off, size_t len)
{
    pthread_mutex_lock(&p->mu);
    int i = 0;
    while (i < p->n_ext && p->ext[i][0] < off)
        i++;
    int prev = i > 0 && p->ext[i - 1][0] + p->ext[i - 1][1] == off;
    int next = i < p->n_ext && off + len == p->ext[i][0];
    if (prev && next) {
        p->ext[i - 1][1] += len + p->ext[i][1];
        memmove(&p->ext[i], &p->ext[i + 1],
                (size_t)(p->n_ext - i - 1) * sizeof(*p->ext));
        p->n_ext--;
    } else if (prev) {
        p->ext[i - 1][1] += len;
    } else if (next) {
        p->ext[i][0] = off;
        p->ext[i][1] += len;
    } else {
        if (p->n_ext == p->cap_ext) {
            void *n = realloc(p->ext, 2 * (size_t)p->cap_ext * sizeof(*p->ext));
            if (!n) { /* lost to the pool until the next merge: rare */
                pthread_mutex_unlock(&p->mu);
                return;
            }
            p->ext = n;
            p->cap_ext *= 2;
        }
        memmove(&p->ext[i + 1], &p->ext[i],
                (size_t)(p->n_ext - i) * sizeof(*p->ext));
        p->ext[i][0] = off;
        p->ext[i][1] = len;
        p->n_ext++;
    }
    pthread_mutex_unlock(&p->mu);
}

/* Points s's layers into the extent at off, cap positions per K/V. */
static void pool_carve(hp_seq_t *s, size_t off, int cap)
{
    const hp_model_config_t *c = &s->model->cfg;
    char *at = s->pool->base + off;
    size_t kv = pool_round((size_t)cap * c->kv_row * sizeof(float));
    for (int l = 0; l < c->n_layers; l++) {
        hp_seq_layer_t *sl = &s->layers[l];
        if (c->layer_kind[l] == HP_LAYER_LINEAR) {
            sl->S = (float *)(void *)at;
            at += pool_round(c->state_floats * sizeof(float));
            sl->conv = (float *)(void *)at;
            at += pool_round(conv_bytes(c));
        } else {
            sl->k = (float *)(void *)at;
            sl->v = (float *)(void *)(at + kv);
            at += 2 * kv;
        }
    }
}

int hp_seq_init_in(hp_seq_t *s, const hp_model_t *m, hp_seq_pool_t *pool, int n,
                   hp_error_t *err)
{
    const hp_model_config_t *c = &m->cfg;
    size_t len = hp_seq_pool_need(m, n);
    memset(s, 0, sizeof(*s));
    if (len > pool->bytes)
        return hp_error_set(err, HP_ETOOLARGE,
                            "a sequence of %d positions takes %.1f MiB, the "
                            "sequence pool has %.1f MiB",
                            n, len / 1048576.0, pool->bytes / 1048576.0);
    size_t off = pool_take(pool, len);
    if (off == (size_t)-1)
        return hp_error_set(err, HP_EBUSY,
                            "sequence pool: no room for %d positions now", n);
    s->layers = calloc(c->n_layers, sizeof(*s->layers));
    if (!s->layers) {
        pool_put(pool, off, len);
        return hp_error_set(err, HP_ENOMEM, "sequence: out of memory");
    }
    s->model = m;
    s->be = m->be;
    s->pool = pool;
    s->pool_off = off;
    s->pool_len = len;
    s->kv_cap = n;
    pool_carve(s, off, n);
    for (int l = 0; l < c->n_layers; l++)
        if (c->layer_kind[l] == HP_LAYER_LINEAR) {
            hp_backend_memset0(s->be, s->layers[l].S,
                               c->state_floats * sizeof(float));
            hp_backend_memset0(s->be, s->layers[l].conv, conv_bytes(c));
        }
    return HP_OK;
}

/* A pooled sequence past its extent: to a larger one (cap positions, else
 * n), its states and K/V copied inside the pool (backend copies: the pool
 * may be device memory); open KVBuffers follow their states. HP_EBUSY
 * when no free extent holds n positions now. */
static int pool_move(hp_seq_t *s, int n, int cap, hp_error_t *err)
{
    const hp_model_config_t *c = &s->model->cfg;
    hp_seq_pool_t *p = s->pool;
    size_t len = hp_seq_pool_need(s->model, cap);
    size_t off = pool_take(p, len);
    if (off == (size_t)-1) {
        cap = n;
        len = hp_seq_pool_need(s->model, cap);
        off = pool_take(p, len);
    }
    if (off == (size_t)-1)
        return hp_error_set(err, HP_EBUSY,
                            "sequence: no room in the pool for %d positions "
                            "now",
                            n);
    hp_seq_layer_t *old = malloc((size_t)c->n_layers * sizeof(*old));
    if (!old) {
        pool_put(p, off, len);
        return hp_error_set(err, HP_ENOMEM, "sequence: out of memory");
    }
    memcpy(old, s->layers, (size_t)c->n_layers * sizeof(*old));
    pool_carve(s, off, cap);
    size_t kv = (size_t)s->kv_cap * c->kv_row * sizeof(float);
    for (int l = 0; l < c->n_layers; l++) {
        hp_seq_layer_t *a = &old[l], *b = &s->layers[l];
        if (c->layer_kind[l] == HP_LAYER_LINEAR) {
            hp_backend_copy(s->be, b->S, a->S, c->state_floats * sizeof(float));
            hp_backend_copy(s->be, b->conv, a->conv, conv_bytes(c));
            /* a buffer's state (the last flush's) or the storage a KV-only
             * one creates it in is this layer's S */
            if (b->kvb.S == a->S)
                b->kvb.S = b->S;
            if (b->kvb.store == a->S)
                b->kvb.store = b->S;
        } else if (kv) {
            hp_backend_copy(s->be, b->k, a->k, kv);
            hp_backend_copy(s->be, b->v, a->v, kv);
        }
    }
    free(old);
    pool_put(p, s->pool_off, s->pool_len);
    s->pool_off = off;
    s->pool_len = len;
    s->kv_cap = cap;
    return HP_OK;
}

int hp_seq_grow(hp_seq_t *s, int n, int cap, hp_error_t *err)
{
    if (n <= s->kv_cap)
        return HP_OK;
    if (!s->pool)
        return hp_seq_reserve(s, cap > n ? cap : n, err);
    if (s->spec_T)
        return hp_error_set(err, HP_EBADINPUT,
                            "sequence: grow with an unresolved verification");
    return pool_move(s, n, cap > n ? cap : n, err);
}
