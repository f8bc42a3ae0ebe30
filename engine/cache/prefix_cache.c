/* prefix_cache.c - hybrid prefix cache: radix tree of K/V with sparse
 * linear-state checkpoints, Marconi admission and eviction (prefix_cache.h).
 * The alpha search is prefix_tune.c's.
 */
#include "engine/cache/prefix_cache.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "engine/cache/ckpt_dp.h"
#include "engine/cache/prefix_cache_impl.h"

#define HIST_RESCALE 1e150 /* decayed weights grow as gamma^-k */

/* ---- geometry and FLOPs ------------------------------------------------ */

static void geom_init(geom_t *g, const hp_model_config_t *c)
{
    double H = c->hidden, Hv = c->lin_v_heads, dk = c->lin_k_dim;
    double dv = c->lin_v_dim, cd = hp_cfg_conv_dim(c);
    double vd = hp_cfg_value_dim(c), Kc = c->conv_kernel;
    double Hq = c->n_heads, Hkv = c->n_kv_heads, hd = c->head_dim;
    memset(g, 0, sizeof(*g));
    for (int l = 0; l < c->n_layers; l++) {
        double mlp;
        if (c->layer_moe[l])
            mlp =
                2 * H * c->n_experts +
                6 * H * c->moe_intermediate * c->n_experts_per_tok +
                (c->shared_intermediate ? 6 * H * c->shared_intermediate + 2 * H
                                        : 0);
        else
            mlp = 6 * H * c->intermediate;
        g->c0 += mlp;
        if (c->layer_kind[l] == HP_LAYER_LINEAR) {
            /* in_qkv, in_z, in_b, in_a, out_proj; conv; the recurrence
             * (decay, k^T S, rank-1 update, S^T q) */
            g->c0 += 2 * H * (cd + vd + 2 * Hv) + 2 * vd * H + 2 * cd * Kc +
                     8 * Hv * dk * dv;
        } else {
            /* q (+ gate), k, v, o projections; QK^T and AV per pair */
            g->c0 += 2 * H * (2 * Hq * hd + 2 * Hkv * hd) + 2 * Hq * hd * H;
            g->a1 += 4 * Hq * hd;
        }
    }
    g->kv_tok = (size_t)c->n_full * 2 * c->kv_row * sizeof(float);
    g->state =
        (size_t)c->n_lin * (c->state_floats + c->conv_floats) * sizeof(float);
}

static double flops(const geom_t *g, int a, int b)
{
    if (b <= a)
        return 0.0;
    double pairs = ((double)b * (b + 1) - (double)a * (a + 1)) / 2.0;
    return g->c0 * (b - a) + g->a1 * pairs;
}

double hp_prefix_cache_flops(const hp_prefix_cache_t *pc, int a, int b)
{
    return flops(&pc->g, a, b);
}

size_t hp_prefix_cache_state_bytes(const hp_prefix_cache_t *pc)
{
    return pc->g.state;
}

size_t hp_prefix_cache_kv_bytes(const hp_prefix_cache_t *pc)
{
    return pc->g.kv_tok;
}

/* ---- payloads ------------------------------------------------------------ */

static int evict_one(hp_prefix_cache_t *pc);

/* bytes of the private pool. Where no free run is large enough although
 * the byte count has room (fragmentation, the granule, a split's or a
 * merge's old copy still held), evicts by the cache's policy until one
 * is (evict; the caller pins what it must keep). NULL when nothing more
 * can go. */
static float *blob_alloc(hp_prefix_cache_t *pc, size_t bytes, int evict)
{
    if (hp_arena_round(bytes) > pc->ar.size)
        return NULL;
    for (;;) {
        size_t off = hp_arena_alloc(&pc->ar, bytes);
        if (off != HP_ARENA_NONE)
            return (float *)(void *)(pc->mem + off);
        if (!evict || evict_one(pc) < 0)
            return NULL;
        pc->st.arena_evictions++;
    }
}

static void blob_free(hp_prefix_cache_t *pc, float *p, size_t bytes)
{
    if (p)
        hp_arena_free(&pc->ar, (size_t)((uint8_t *)p - pc->mem), bytes);
}

void hp_pc_free_pcd(void *ud, void *data)
{
    hp_prefix_cache_t *pc = ud;
    pcd_t *d = data;
    if (pc && d) {
        blob_free(pc, d->kv, d->kv_bytes);
        if (d->has_state)
            blob_free(pc, d->state, pc->g.state);
    }
    free(d);
}

static void touch(hp_prefix_cache_t *pc, hp_radix_node_t *x)
{
    if (x->parent)
        D(x)->stamp = ++pc->clock;
}

static void lock_path(hp_radix_node_t *x, int delta)
{
    for (; x && x->parent; x = x->parent)
        D(x)->lock += delta;
}

static void drop_state(hp_prefix_cache_t *pc, hp_radix_node_t *x)
{
    pcd_t *d = D(x);
    if (!d->has_state)
        return;
    blob_free(pc, d->state, pc->g.state);
    d->state = NULL;
    d->has_state = 0;
    pc->states--;
    pc->st_used -= pc->g.state;
}

/* Gives x the state buf (a blob, taken; NULL in the simulator). */
static void give_state(hp_prefix_cache_t *pc, hp_radix_node_t *x, float *buf)
{
    pcd_t *d = D(x);
    if (d->has_state) {
        blob_free(pc, buf, pc->g.state);
        return;
    }
    d->state = buf;
    d->has_state = 1;
    pc->states++;
    pc->st_used += pc->g.state;
    pc->st.states_admitted++;
}

/* K/V block of full slot f, K (kv = 0) or V (kv = 1), in a node of len. */
static float *kv_at(const hp_model_config_t *c, float *kv, int len, int f,
                    int which)
{
    return kv + ((size_t)f * 2 + which) * len * c->kv_row;
}

/* A checkpoint's block of linear layer l. */
static float *ckpt_at(const hp_model_config_t *c, float *state, int l)
{
    return state + (size_t)c->slot[l] * (c->state_floats + c->conv_floats);
}

/* Splits x (pinned) after k tokens: the new parent takes the first k
 * K/V rows, copied on the backend. */
static hp_radix_node_t *split_node(hp_prefix_cache_t *pc, hp_radix_node_t *x,
                                   int k, hp_error_t *err)
{
    const geom_t *g = &pc->g;
    pcd_t *md = calloc(1, sizeof(*md));
    float *head = NULL, *tail = NULL;
    int len = x->len;
    size_t hb = (size_t)k * g->kv_tok, tb = (size_t)(len - k) * g->kv_tok;
    if (md && pc->tensors && (head = blob_alloc(pc, hb, 1)))
        tail = blob_alloc(pc, tb, 1);
    if (!md || (pc->tensors && (!head || !tail))) {
        free(md);
        blob_free(pc, head, hb);
        hp_error_set(err, HP_ENOMEM, "prefix cache: no room to split");
        return NULL;
    }
    hp_radix_node_t *m = hp_radix_split(&pc->tree, x, k, err);
    if (!m) {
        free(md);
        blob_free(pc, head, hb);
        blob_free(pc, tail, tb);
        return NULL;
    }
    if (pc->tensors) {
        const hp_model_config_t *c = &pc->cfg;
        float *kv = D(x)->kv;
        for (int f = 0; f < c->n_full; f++)
            for (int w = 0; w < 2; w++) {
                const float *src = kv_at(c, kv, len, f, w);
                hp_backend_copy(pc->be, kv_at(c, head, k, f, w), src,
                                (size_t)k * c->kv_row * sizeof(float));
                hp_backend_copy(pc->be, kv_at(c, tail, len - k, f, w),
                                src + (size_t)k * c->kv_row,
                                (size_t)(len - k) * c->kv_row * sizeof(float));
            }
        blob_free(pc, kv, D(x)->kv_bytes);
        D(x)->kv = tail;
        D(x)->kv_bytes = tb;
        md->kv = head;
        md->kv_bytes = hb;
    }
    md->lock = D(x)->lock; /* every pinned path through x passes m */
    md->stamp = D(x)->stamp;
    m->data = md;
    return m;
}

/* x (unpinned, one child, no state) disappears into its child; the K/V
 * of both is copied on the backend into one blob, for which others are
 * evicted if evict (else no room leaves x as it is). */
static int merge_node(hp_prefix_cache_t *pc, hp_radix_node_t *x, int evict,
                      hp_error_t *err)
{
    const hp_model_config_t *cf = &pc->cfg;
    size_t row = cf->kv_row;
    hp_radix_node_t *c = x->kids[0];
    float *kv = NULL;
    int lx = x->len, lc = c->len;
    size_t bytes = (size_t)(lx + lc) * pc->g.kv_tok;
    if (pc->tensors) {
        /* making room must not take x, c or what lies above them */
        lock_path(c, +1);
        kv = blob_alloc(pc, bytes, evict);
        lock_path(c, -1);
        if (!kv)
            return hp_error_set(err, HP_ENOMEM,
                                "prefix cache: no room to merge");
        for (int f = 0; f < cf->n_full; f++)
            for (int w = 0; w < 2; w++) {
                float *dst = kv_at(cf, kv, lx + lc, f, w);
                hp_backend_copy(pc->be, dst, kv_at(cf, D(x)->kv, lx, f, w),
                                (size_t)lx * row * sizeof(float));
                hp_backend_copy(pc->be, dst + (size_t)lx * row,
                                kv_at(cf, D(c)->kv, lc, f, w),
                                (size_t)lc * row * sizeof(float));
            }
    }
    pcd_t *xd = D(x);
    if (!hp_radix_merge(&pc->tree, x, err)) {
        blob_free(pc, kv, bytes);
        return err->code;
    }
    if (pc->tensors) {
        blob_free(pc, D(c)->kv, D(c)->kv_bytes);
        D(c)->kv = kv;
        D(c)->kv_bytes = bytes;
    }
    hp_pc_free_pcd(pc, xd);
    return HP_OK;
}

static void remove_leaf(hp_prefix_cache_t *pc, hp_radix_node_t *x)
{
    drop_state(pc, x);
    pc->kv_used -= node_kv_bytes(pc, x);
    hp_pc_free_pcd(pc, x->data);
    x->data = NULL;
    hp_radix_remove(&pc->tree, x);
}

/* A node that holds nothing useful: unpinned, no state, <= 1 child.
 * Leaves go (their K/V serves no checkpoint), single children absorb. */
static void tidy_up(hp_prefix_cache_t *pc, hp_radix_node_t *x)
{
    hp_error_t err = {0};
    while (x && x->parent && D(x)->lock == 0 && !D(x)->has_state &&
           x->n_kids <= 1) {
        if (x->n_kids == 1) {
            /* tidying evicts nothing: no room, it just stays */
            merge_node(pc, x, 0, &err);
            return;
        }
        hp_radix_node_t *p = x->parent;
        remove_leaf(pc, x);
        x = p;
    }
}

/* A new leaf under parent for ids[a..b), K/V rows [a, b) from seq. */
static hp_radix_node_t *add_leaf(hp_prefix_cache_t *pc, hp_radix_node_t *parent,
                                 const int *ids, int a, int b,
                                 const hp_seq_t *seq, hp_error_t *err)
{
    const geom_t *g = &pc->g;
    const hp_model_config_t *c = &pc->cfg;
    int len = b - a;
    size_t bytes = (size_t)len * g->kv_tok;
    pcd_t *d = calloc(1, sizeof(*d));
    float *kv = d && pc->tensors ? blob_alloc(pc, bytes, 1) : NULL;
    if (!d || (pc->tensors && !kv)) {
        free(d);
        hp_error_set(err, HP_ENOMEM, "prefix cache: no room for %d tokens",
                     len);
        return NULL;
    }
    for (int l = 0; pc->tensors && l < c->n_layers; l++)
        if (c->layer_kind[l] == HP_LAYER_FULL)
            hp_seq_kv_pack(seq, l, a, len, kv_at(c, kv, len, c->slot[l], 0),
                           kv_at(c, kv, len, c->slot[l], 1), HP_MEM_BACKEND);
    hp_radix_node_t *x = hp_radix_add(&pc->tree, parent, ids + a, len, err);
    if (!x) {
        free(d);
        blob_free(pc, kv, bytes);
        return NULL;
    }
    d->kv = kv;
    d->kv_bytes = bytes;
    x->data = d;
    pc->kv_used += (size_t)len * g->kv_tok;
    touch(pc, x);
    return x;
}

/* The node at depth d on ids' path (splitting an edge if needed). */
static hp_radix_node_t *node_at(hp_prefix_cache_t *pc, const int *ids, int d,
                                hp_error_t *err)
{
    hp_radix_match_t m;
    hp_radix_match(&pc->tree, ids, d, &m);
    if (m.depth < d) {
        hp_error_set(err, HP_EINTERNAL, "prefix cache: depth %d lost", d);
        return NULL;
    }
    if (!m.edge)
        return m.node;
    return split_node(pc, m.edge, d - m.node->depth, err);
}

/* Inserts ids[0..n) (K/V of new tokens from seq); the node at depth n. */
static hp_radix_node_t *insert_path(hp_prefix_cache_t *pc, const int *ids,
                                    int n, const hp_seq_t *seq, hp_error_t *err)
{
    hp_radix_match_t m;
    hp_radix_match(&pc->tree, ids, n, &m);
    hp_radix_node_t *at = m.node;
    if (m.edge) {
        at = split_node(pc, m.edge, m.depth - m.node->depth, err);
        if (!at)
            return NULL;
    }
    if (m.depth < n)
        at = add_leaf(pc, at, ids, m.depth, n, seq, err);
    return at;
}

/* ---- eviction ------------------------------------------------------------ */

static int candidate(const hp_radix_node_t *x)
{
    return x->parent && D(x)->lock == 0 && x->n_kids <= 1;
}

/* FLOPs a hit on x saves over its nearest checkpointed ancestor. */
static double node_flops(const hp_prefix_cache_t *pc, const hp_radix_node_t *x)
{
    const hp_radix_node_t *a = x->parent;
    while (a->parent && !D(a)->has_state)
        a = a->parent;
    return flops(&pc->g, a->depth, x->depth);
}

static double node_eff(const hp_prefix_cache_t *pc, const hp_radix_node_t *x)
{
    size_t bytes = node_kv_bytes(pc, x) + pc->g.state;
    return node_flops(pc, x) / (double)bytes;
}

/* The victim: a stateless candidate first (it frees K/V or nothing and
 * costs no reuse), else the lowest recency + alpha * efficiency. */
static hp_radix_node_t *pick_victim(const hp_prefix_cache_t *pc)
{
    double alpha = pc->p.alpha;
    uint64_t smin = UINT64_MAX, smax = 0;
    double emin = INFINITY, emax = -INFINITY;
    int n = 0;
    for (hp_radix_node_t *x = pc->tree.all; x; x = x->next_all) {
        if (!candidate(x))
            continue;
        if (!D(x)->has_state)
            return x;
        n++;
        smin = D(x)->stamp < smin ? D(x)->stamp : smin;
        smax = D(x)->stamp > smax ? D(x)->stamp : smax;
        if (alpha > 0) {
            double e = node_eff(pc, x);
            emin = e < emin ? e : emin;
            emax = e > emax ? e : emax;
        }
    }
    if (n == 0)
        return NULL;
    hp_radix_node_t *best = NULL;
    double best_s = INFINITY;
    for (hp_radix_node_t *x = pc->tree.all; x; x = x->next_all) {
        if (!candidate(x))
            continue;
        double r = smax > smin
                       ? (double)(D(x)->stamp - smin) / (double)(smax - smin)
                       : 0.0;
        double s = r;
        if (alpha > 0)
            s += alpha *
                 (emax > emin ? (node_eff(pc, x) - emin) / (emax - emin) : 0.0);
        if (s < best_s || (s == best_s && D(x)->stamp < D(best)->stamp)) {
            best_s = s;
            best = x;
        }
    }
    return best;
}

/* Evicts one node; returns its depth or -1 if nothing can go. */
static int evict_one(hp_prefix_cache_t *pc)
{
    hp_error_t err = {0};
    hp_radix_node_t *v = pick_victim(pc);
    if (!v)
        return -1;
    int depth = v->depth, had = D(v)->has_state;
    if (v->n_kids == 0) {
        hp_radix_node_t *p = v->parent;
        remove_leaf(pc, v);
        tidy_up(pc, p);
    } else {
        drop_state(pc, v);
        if (merge_node(pc, v, 1, &err) != HP_OK && !had)
            return -1; /* no memory to merge and nothing freed */
    }
    if (had) {
        pc->st.states_evicted++;
        pc->evicted_once = 1;
    }
    pc->st.nodes_evicted++;
    return depth;
}

static size_t used(const hp_prefix_cache_t *pc)
{
    return pc->kv_used + pc->st_used;
}

/* Evicts until need more bytes fit the budget beside the tree and the
 * running requests' snapshots. */
static int make_room(hp_prefix_cache_t *pc, size_t need)
{
    if (need > pc->p.budget)
        return 0;
    while (used(pc) + pc->snap_used + need > pc->p.budget)
        if (evict_one(pc) < 0)
            return 0;
    return 1;
}

/* ---- create / destroy ---------------------------------------------------- */

void hp_prefix_cache_params_default(hp_prefix_cache_params_t *p, size_t budget)
{
    static const double grid[] = {0, 0.25, 0.5, 1, 2, 4, 8, 16};
    memset(p, 0, sizeof(*p));
    p->budget = budget;
    p->admit = HP_PC_ADMIT_MARCONI;
    p->block = 32;
    p->alpha = 0.0;
    p->tune = 1;
    p->tune_async = 1;
    p->bootstrap_mult = 15; /* the top of Marconi's 5-15x: a short
                               window sees only young sessions */
    p->bootstrap_min = 16;
    p->bootstrap_max = 4096;
    p->n_alphas = (int)(sizeof(grid) / sizeof(grid[0]));
    memcpy(p->alphas, grid, sizeof(grid));
    p->sparse = 0;
    p->dp_gamma = 0.99;
    p->dp_min_mass = 8.0;
    p->dp_min_gain = 0.1;
    p->dp_max_depth = 1 << 16;
}

/* The private pool: budget bytes of be's memory, and its arena. */
static int pool_init(hp_prefix_cache_t *pc, hp_error_t *err)
{
    const hp_backend_t *be = pc->be;
    size_t bytes = hp_arena_round(pc->p.budget);
    pc->mem = hp_arena_mem(be, bytes);
    if (!pc->mem)
        return hp_error_set(err, HP_ENOMEM,
                            "%s: no memory for a private pool of %.1f MiB "
                            "(private_pool)",
                            hp_backend_name(be), bytes / 1048576.0);
    pc->mem_bytes = bytes;
    if (hp_arena_init(&pc->ar, bytes, err) != HP_OK)
        return err->code;
    return HP_OK;
}

static void pool_fini(hp_prefix_cache_t *pc)
{
    hp_arena_fini(&pc->ar);
    if (pc->mem)
        hp_arena_mem_free(pc->be, pc->mem, pc->mem_bytes);
    pc->mem = NULL;
}

hp_prefix_cache_t *hp_prefix_cache_create(const hp_model_config_t *cfg,
                                          const hp_prefix_cache_params_t *p,
                                          const hp_backend_t *be,
                                          hp_error_t *err)
{
    if (p->block <= 0 || p->n_alphas < 0 || p->n_alphas > HP_PC_MAX_ALPHAS ||
        p->sparse < 0 || p->dp_max_depth < 1 || !(p->dp_gamma > 0) ||
        !(p->dp_min_gain >= 0) || p->dp_gamma > 1 || p->alpha < 0 ||
        cfg->n_lin + cfg->n_full != cfg->n_layers) {
        /* (a config filled by hand needs hp_model_config_derive) */
        hp_error_set(err, HP_EBADINPUT, "prefix cache: bad parameters");
        return NULL;
    }
    hp_prefix_cache_t *pc = calloc(1, sizeof(*pc));
    if (!pc) {
        hp_error_set(err, HP_ENOMEM, "prefix cache: out of memory");
        return NULL;
    }
    pc->cfg = *cfg;
    pc->p = *p;
    pc->tensors = be != NULL;
    pc->be = be;
    geom_init(&pc->g, cfg);
    pc->hist_w = 1.0;
    if (p->sparse > 0) {
        pc->hist = calloc((size_t)p->dp_max_depth + 1, sizeof(double));
        if (!pc->hist) {
            free(pc);
            hp_error_set(err, HP_ENOMEM, "prefix cache: out of memory");
            return NULL;
        }
    }
    if ((be && pool_init(pc, err) != HP_OK) ||
        hp_radix_init(&pc->tree, err) != HP_OK) {
        pool_fini(pc);
        free(pc->hist);
        free(pc);
        return NULL;
    }
    pc->tree.root->data = calloc(1, sizeof(pcd_t));
    if (!pc->tree.root->data) {
        hp_radix_free(&pc->tree, hp_pc_free_pcd, NULL);
        pool_fini(pc);
        free(pc->hist);
        free(pc);
        hp_error_set(err, HP_ENOMEM, "prefix cache: out of memory");
        return NULL;
    }
    pthread_mutex_init(&pc->mu, NULL);
    return pc;
}

void hp_prefix_cache_destroy(hp_prefix_cache_t *pc)
{
    if (!pc)
        return;
    hp_pc_tune_free(pc);
    hp_radix_free(&pc->tree, hp_pc_free_pcd, NULL); /* the pool goes whole */
    pool_fini(pc);
    pthread_mutex_destroy(&pc->mu);
    free(pc->hist);
    free(pc);
}

/* ---- requests ------------------------------------------------------------ */

static void req_clear(hp_prefix_cache_t *pc, hp_prefix_cache_req_t *req)
{
    if (req->snap)
        for (int i = 0; i < req->n_ckpt; i++)
            if (req->snap[i]) {
                blob_free(pc, req->snap[i], pc->g.state);
                pc->snap_used -= pc->g.state;
            }
    free(req->snap);
    free(req->ckpt);
    free(req->ids);
    memset(req, 0, sizeof(*req));
}

static void hist_add(hp_prefix_cache_t *pc, int depth, int n)
{
    if (!pc->hist)
        return;
    pc->hist_w /= pc->p.dp_gamma;
    if (pc->hist_w > HIST_RESCALE) {
        for (int t = 0; t <= pc->p.dp_max_depth; t++)
            pc->hist[t] /= pc->hist_w;
        pc->hist_mass /= pc->hist_w;
        pc->hist_all /= pc->hist_w;
        pc->hist_len /= pc->hist_w;
        pc->hist_w = 1.0;
    }
    pc->hist_all += pc->hist_w;
    pc->hist_len += pc->hist_w * n;
    if (depth >= 1 && depth <= pc->p.dp_max_depth) {
        pc->hist[depth] += pc->hist_w;
        pc->hist_mass += pc->hist_w;
    }
}

/* Drops, cheapest first, the checkpoints of c[0..m) whose removal would
 * cost less than min_gain (in the units of p) of expected recompute:
 * removing c_i hands [c_i, c_i+1) to c_i-1. Returns the count kept. */
static int prune_gain(const double *p, int N, int *c, int m, double min_gain)
{
    while (m > 0) {
        int worst = -1;
        double wg = INFINITY;
        for (int i = 0; i < m; i++) {
            int prev = i ? c[i - 1] : 0, end = i + 1 < m ? c[i + 1] : N + 1;
            double mass = 0;
            for (int t = c[i]; t < end; t++)
                mass += p[t];
            double gain = mass * (c[i] - prev);
            if (gain < wg) {
                wg = gain;
                worst = i;
            }
        }
        if (wg >= min_gain)
            break;
        memmove(c + worst, c + worst + 1,
                (size_t)(m - worst - 1) * sizeof(int));
        m--;
    }
    return m;
}

/* Sparse checkpoints for the stretch (r, n): depths where later requests
 * are expected to leave this path; appended to pos. */
static int sparse_positions(hp_prefix_cache_t *pc, int r, int n, int *pos,
                            int k, hp_error_t *err)
{
    int N = n - 1 - r, M = pc->p.sparse, c[64], m = 0;
    if (M > 64)
        M = 64;
    if (N < 1 || M < 1)
        return k;
    if (pc->hist_mass / pc->hist_w < pc->p.dp_min_mass) {
        m = hp_ckpt_dp_balanced(N, M < N ? M : N, c);
    } else {
        double *p = calloc((size_t)N + 1, sizeof(double));
        if (!p)
            return k; /* no sparse checkpoints this time */
        for (int t = 1; t <= N && r + t <= pc->p.dp_max_depth; t++)
            p[t] = pc->hist[r + t] / pc->hist_w;
        if (hp_ckpt_dp_solve(p, N, M, c, &m, NULL, err) != HP_OK)
            m = 0;
        /* in p's units: per-request tokens times requests */
        double mean_len = pc->hist_len / pc->hist_all;
        m = prune_gain(p, N, c, m,
                       pc->p.dp_min_gain * mean_len * pc->hist_all /
                           pc->hist_w);
        free(p);
    }
    for (int i = 0; i < m; i++)
        pos[k++] = r + c[i];
    return k;
}

static int cmp_int(const void *a, const void *b)
{
    int x = *(const int *)a, y = *(const int *)b;
    return (x > y) - (x < y);
}

/* Restores the state at node x into seq: K/V from the path, S and conv
 * from x. */
static int restore(hp_prefix_cache_t *pc, hp_radix_node_t *x, int n,
                   hp_seq_t *seq, hp_error_t *err)
{
    const hp_model_config_t *c = &pc->cfg;
    hp_seq_reset(seq);
    int rc = hp_seq_reserve(seq, n, err);
    if (rc != HP_OK)
        return rc;
    for (hp_radix_node_t *y = x; y->parent; y = y->parent)
        for (int l = 0; l < c->n_layers; l++)
            if (c->layer_kind[l] == HP_LAYER_FULL)
                hp_seq_kv_unpack(seq, l, y->depth - y->len, y->len,
                                 kv_at(c, D(y)->kv, y->len, c->slot[l], 0),
                                 kv_at(c, D(y)->kv, y->len, c->slot[l], 1),
                                 HP_MEM_BACKEND);
    for (int l = 0; x->parent && l < c->n_layers; l++)
        if (c->layer_kind[l] == HP_LAYER_LINEAR)
            hp_seq_state_unpack(seq, l, ckpt_at(c, D(x)->state, l),
                                HP_MEM_BACKEND);
    seq->n_pos = x->depth;
    return HP_OK;
}

static int begin_locked(hp_prefix_cache_t *pc, const int *ids, int n, int hint,
                        hp_seq_t *seq, hp_prefix_cache_req_t *req,
                        hp_error_t *err)
{
    hp_radix_match_t m;
    hp_radix_match(&pc->tree, ids, n, &m);
    int lim = m.depth < n - 1 ? m.depth : n - 1;
    hp_radix_node_t *x = m.node;
    while (x->parent && (x->depth > lim || !D(x)->has_state))
        x = x->parent;
    int r = x->depth;

    /* where to capture states during this prefill */
    int cap = 4 + pc->p.sparse +
              (pc->p.admit == HP_PC_ADMIT_BLOCK ? n / pc->p.block + 1 : 0);
    int *pos = malloc((size_t)cap * sizeof(int)), k = 0;
    req->ids = malloc((size_t)n * sizeof(int));
    if (!pos || !req->ids) {
        free(pos);
        free(req->ids);
        req->ids = NULL;
        return hp_error_set(err, HP_ENOMEM, "prefix cache: out of memory");
    }
    if (pc->p.admit == HP_PC_ADMIT_BLOCK) {
        for (int b = (r / pc->p.block + 1) * pc->p.block; b <= n;
             b += pc->p.block)
            pos[k++] = b;
    } else if (m.depth > r && m.depth < n) {
        pos[k++] = m.depth; /* the branch point this prompt creates */
    } else if (m.depth == n && n - 1 > r) {
        /* the whole prompt is a cached prefix: its output branches at n
         * or later, and the last prompt token is always recomputed, so
         * the nearest usable branch point is n - 1 */
        pos[k++] = n - 1;
    }
    if (hint > r && hint < n)
        pos[k++] = hint;
    if (pc->p.sparse > 0)
        k = sparse_positions(pc, r, n, pos, k, err);
    qsort(pos, (size_t)k, sizeof(int), cmp_int);
    int u = 0;
    for (int i = 0; i < k; i++)
        if (pos[i] > r && pos[i] <= n && (u == 0 || pos[i] != pos[u - 1]))
            pos[u++] = pos[i];
    hist_add(pc, m.depth, n);

    memcpy(req->ids, ids, (size_t)n * sizeof(int));
    req->n = n;
    req->match = m.depth;
    req->resume = r;
    req->ckpt = pos;
    req->n_ckpt = u;
    req->pin = x;
    req->active = 1;
    lock_path(x, +1);
    if (pc->p.touch_path)
        for (hp_radix_node_t *y = x; y->parent; y = y->parent)
            touch(pc, y);
    else
        touch(pc, x);

    if (seq) {
        req->snap = calloc((size_t)(u ? u : 1), sizeof(float *));
        int rc = req->snap ? HP_OK
                           : hp_error_set(err, HP_ENOMEM,
                                          "prefix cache: out of memory");
        /* snapshots in the private pool, counted in its budget; a
         * position without room is not captured */
        int kept = 0;
        for (int i = 0; i < u && rc == HP_OK; i++) {
            float *b = make_room(pc, pc->g.state)
                           ? blob_alloc(pc, pc->g.state, 1)
                           : NULL;
            if (!b) {
                pc->st.skipped++;
                continue;
            }
            pc->snap_used += pc->g.state;
            pos[kept] = pos[i];
            req->snap[kept++] = b;
        }
        req->n_ckpt = kept;
        if (rc == HP_OK)
            rc = restore(pc, x, n, seq, err);
        if (rc != HP_OK) {
            lock_path(x, -1);
            req_clear(pc, req);
            return rc;
        }
    }

    pc->st.requests++;
    pc->st.prompt_tokens += (uint64_t)n;
    pc->st.hit_tokens += (uint64_t)r;
    pc->st.prompt_flops += flops(&pc->g, 0, n);
    pc->st.saved_flops += flops(&pc->g, 0, r);
    if (pc->phase == HP_PC_TUNE_WAIT)
        pc->n_before = pc->st.requests;
    return HP_OK;
}

int hp_prefix_cache_begin(hp_prefix_cache_t *pc, const int *ids, int n,
                          int hint, hp_seq_t *seq, hp_prefix_cache_req_t *req,
                          hp_error_t *err)
{
    memset(req, 0, sizeof(*req));
    if (n < 1)
        return hp_error_set(err, HP_EBADINPUT, "prefix cache: empty prompt");
    if (seq && !pc->tensors)
        return hp_error_set(err, HP_EBADINPUT,
                            "prefix cache: a simulator holds no tensors");
    if (!seq && pc->tensors)
        return hp_error_set(err, HP_EBADINPUT,
                            "prefix cache: restoring needs a sequence");
    pthread_mutex_lock(&pc->mu);
    hp_pc_tune_poll(pc, 0);
    int rc = begin_locked(pc, ids, n, hint, seq, req, err);
    pthread_mutex_unlock(&pc->mu);
    return rc;
}

/* Does ids' path hold a checkpoint at exactly depth d? */
static int state_at(const hp_prefix_cache_t *pc, const int *ids, int d)
{
    hp_radix_match_t m;
    hp_radix_match(&pc->tree, ids, d, &m);
    return !m.edge && m.depth == d && m.node->depth == d && m.node->parent &&
           D(m.node)->has_state;
}

/* Inserts ids[0..n) with K/V from seq, states at pos[i] (buffers in
 * bufs, taken; NULL entries and the simulator: notional), and, if
 * final_state, at n from seq. Makes room first (the matched path
 * pinned meanwhile). Returns the node at n, NULL when there is no room
 * (*rc HP_OK) or on error. */
static hp_radix_node_t *admit_path(hp_prefix_cache_t *pc, const int *ids, int n,
                                   const int *pos, float **bufs, int n_pos,
                                   int final_state, const hp_seq_t *seq,
                                   int *rc, hp_error_t *err)
{
    hp_radix_match_t m;
    *rc = HP_OK;
    hp_radix_match(&pc->tree, ids, n, &m);
    size_t need = (size_t)(n - m.depth) * pc->g.kv_tok;
    for (int i = 0; !bufs && i < n_pos; i++) /* bufs: counted already */
        if (!state_at(pc, ids, pos[i]))
            need += pc->g.state;
    if (final_state && !state_at(pc, ids, n))
        need += pc->g.state;
    hp_radix_node_t *tp = m.edge ? m.edge : m.node;
    lock_path(tp, +1);
    int room = make_room(pc, need);
    hp_radix_node_t *at = NULL;
    if (!room) {
        pc->st.rejected++;
        goto out;
    }
    at = insert_path(pc, ids, n, seq, err);
    if (!at) {
        *rc = err->code ? err->code : HP_ENOMEM;
        goto out;
    }
    lock_path(at, +1); /* keep it while the checkpoints split its path */
    for (int i = 0; i < n_pos; i++) {
        hp_radix_node_t *x = node_at(pc, ids, pos[i], err);
        if (!x) {
            *rc = err->code;
            break;
        }
        if (x->parent) {
            give_state(pc, x, bufs ? bufs[i] : NULL);
            if (bufs) {
                bufs[i] = NULL;
                pc->snap_used -= pc->g.state;
            }
            touch(pc, x);
        }
    }
    if (final_state && *rc == HP_OK && at->parent && !D(at)->has_state) {
        float *buf = NULL;
        if (pc->tensors) {
            const hp_model_config_t *c = &pc->cfg;
            buf = blob_alloc(pc, pc->g.state, 1);
            if (!buf) {
                *rc = hp_error_set(err, HP_ENOMEM,
                                   "prefix cache: no room for a checkpoint");
            } else {
                for (int l = 0; l < c->n_layers; l++)
                    if (c->layer_kind[l] == HP_LAYER_LINEAR)
                        hp_seq_state_pack(seq, l, ckpt_at(c, buf, l),
                                          HP_MEM_BACKEND);
            }
        }
        if (*rc == HP_OK)
            give_state(pc, at, buf);
    }
    if (final_state && *rc == HP_OK)
        touch(pc, at);
    lock_path(at, -1);
out:
    lock_path(tp, -1);
    return *rc == HP_OK ? at : NULL;
}

int hp_prefix_cache_admit(hp_prefix_cache_t *pc, hp_prefix_cache_req_t *req,
                          const hp_seq_t *seq, hp_error_t *err)
{
    if (!req->active)
        return hp_error_set(err, HP_EBADINPUT, "prefix cache: no request");
    if (pc->tensors && (!seq || seq->n_pos < req->n))
        return hp_error_set(err, HP_EBADINPUT,
                            "prefix cache: admit before the prefill");
    pthread_mutex_lock(&pc->mu);
    int rc;
    hp_radix_node_t *at = admit_path(pc, req->ids, req->n, req->ckpt, req->snap,
                                     req->n_ckpt, 0, seq, &rc, err);
    if (at) { /* the request now holds its whole prompt */
        lock_path(at, +1);
        lock_path(req->pin, -1);
        tidy_up(pc, req->pin);
        req->pin = at;
        req->admitted = 1;
    }
    hp_pc_tune_step(pc);
    pthread_mutex_unlock(&pc->mu);
    return rc;
}

static void end_locked(hp_prefix_cache_t *pc, hp_prefix_cache_req_t *req)
{
    if (req->active) {
        hp_radix_node_t *x = req->pin;
        lock_path(x, -1);
        tidy_up(pc, x);
    }
    req_clear(pc, req);
}

int hp_prefix_cache_finish(hp_prefix_cache_t *pc, hp_prefix_cache_req_t *req,
                           const int *out, int n_out, const hp_seq_t *seq,
                           hp_error_t *err)
{
    if (!req->active)
        return hp_error_set(err, HP_EBADINPUT, "prefix cache: no request");
    int k = pc->tensors ? (seq ? seq->n_pos - req->n : -1) : n_out;
    if (k < 0 || k > n_out || (k > 0 && !out)) {
        hp_prefix_cache_release(pc, req);
        return hp_error_set(err, HP_EBADINPUT,
                            "prefix cache: %d tokens consumed, %d given", k,
                            n_out);
    }
    int L = req->n + k, *full = malloc((size_t)L * sizeof(int));
    int *pos = NULL, n_pos = 0, rc = HP_OK;
    if (full && pc->p.admit == HP_PC_ADMIT_BLOCK && !pc->tensors && k > 0)
        pos = malloc((size_t)(k / pc->p.block + 1) * sizeof(int));
    if (!full) {
        hp_prefix_cache_release(pc, req);
        return hp_error_set(err, HP_ENOMEM, "prefix cache: out of memory");
    }
    memcpy(full, req->ids, (size_t)req->n * sizeof(int));
    if (k > 0)
        memcpy(full + req->n, out, (size_t)k * sizeof(int));
    int final_state = 1;
    if (pc->p.admit == HP_PC_ADMIT_BLOCK) {
        /* blocks of the output: the simulator has them all, the engine
         * only the state it ends in */
        if (pos)
            for (int b = (req->n / pc->p.block + 1) * pc->p.block; b < L;
                 b += pc->p.block)
                pos[n_pos++] = b;
        final_state = L % pc->p.block == 0;
    }
    pthread_mutex_lock(&pc->mu);
    admit_path(pc, full, L, pos, NULL, n_pos, final_state, seq, &rc, err);
    hp_pc_tune_record(pc, full, req->n, L);
    end_locked(pc, req);
    hp_pc_tune_step(pc);
    pthread_mutex_unlock(&pc->mu);
    free(pos);
    free(full);
    return rc;
}

void hp_prefix_cache_release(hp_prefix_cache_t *pc, hp_prefix_cache_req_t *req)
{
    pthread_mutex_lock(&pc->mu);
    end_locked(pc, req);
    pthread_mutex_unlock(&pc->mu);
}

/* ---- the engine's prefill ------------------------------------------------ */

typedef struct {
    const hp_seq_t *seq;
    float **snap; /* the piece's first snapshot */
} capture_t;

/* The layer's S and conv are the sequence's own (hp_forward runs on
 * them), taken at the jump. */
static int capture_jump(void *ud, int layer, int jump, float *S, float *conv,
                        const float *Tc, hp_error_t *err)
{
    capture_t *cp = ud;
    (void)S;
    (void)conv;
    (void)Tc;
    (void)err;
    hp_seq_state_pack(cp->seq, layer,
                      ckpt_at(&cp->seq->model->cfg, cp->snap[jump], layer),
                      HP_MEM_BACKEND);
    return HP_OK;
}

int hp_prefix_cache_prefill(hp_prefix_cache_t *pc, const hp_model_t *m,
                            hp_fwd_ws_t *ws, const int *ids, int n, int hint,
                            hp_seq_t *seq, float *logits,
                            hp_prefix_cache_req_t *req, hp_error_t *err)
{
    int rc = hp_prefix_cache_begin(pc, ids, n, hint, seq, req, err);
    if (rc != HP_OK)
        return rc;
    int *after = malloc(((size_t)req->n_ckpt + 1) * sizeof(int)), c = 0;
    if (!after) {
        hp_prefix_cache_release(pc, req);
        return hp_error_set(err, HP_ENOMEM, "prefix cache: out of memory");
    }
    const int piece = hp_fwd_piece(m);
    for (int off = req->resume; off < n && rc == HP_OK; off += piece) {
        int T = n - off < piece ? n - off : piece, nj = 0, first = c;
        while (c < req->n_ckpt && req->ckpt[c] <= off + T)
            after[nj++] = req->ckpt[c++] - off;
        capture_t cp = {seq, req->snap + first};
        hp_jumps_t jumps = {after, nj, -1, capture_jump, &cp};
        int last = off + T == n;
        rc = hp_forward(m, seq, ws, ids + off, NULL, T, nj ? &jumps : NULL,
                        last && logits ? HP_LOGITS_LAST : HP_LOGITS_NONE,
                        logits, err);
    }
    free(after);
    if (rc != HP_OK) {
        hp_prefix_cache_release(pc, req);
        return rc;
    }
    /* a cache that cannot take the prompt costs reuse, not the request */
    hp_error_t aerr = {0};
    hp_prefix_cache_admit(pc, req, seq, &aerr);
    return HP_OK;
}

/* ---- introspection, replay ----------------------------------------------- */

void hp_prefix_cache_stats(hp_prefix_cache_t *pc, hp_prefix_cache_stats_t *out)
{
    pthread_mutex_lock(&pc->mu);
    hp_pc_tune_poll(pc, 0);
    *out = pc->st;
    out->kv_bytes = pc->kv_used;
    out->state_bytes = pc->st_used;
    out->bytes_used = used(pc);
    out->snap_bytes = pc->snap_used;
    out->budget = pc->p.budget;
    out->nodes = pc->tree.n_nodes;
    out->states = pc->states;
    out->alpha = pc->p.alpha;
    out->tune_phase = pc->phase;
    memcpy(out->tune_hit, pc->tune_hit, sizeof(out->tune_hit));
    pthread_mutex_unlock(&pc->mu);
}

int hp_prefix_cache_checkpoints(hp_prefix_cache_t *pc, int *depths, int **paths,
                                int max)
{
    int n = 0;
    pthread_mutex_lock(&pc->mu);
    for (hp_radix_node_t *x = pc->tree.all; x; x = x->next_all) {
        if (!D(x)->has_state)
            continue;
        if (n < max) {
            if (depths)
                depths[n] = x->depth;
            if (paths && (paths[n] = malloc((size_t)x->depth * sizeof(int))))
                hp_radix_path(x, paths[n]);
        }
        n++;
    }
    pthread_mutex_unlock(&pc->mu);
    return n;
}

void hp_prefix_cache_clear(hp_prefix_cache_t *pc)
{
    pthread_mutex_lock(&pc->mu);
    hp_prefix_cache_stats_t keep = pc->st;
    int once = pc->evicted_once;
    while (evict_one(pc) >= 0)
        ;
    pc->st = keep; /* a clear is not an eviction: no tuning trigger */
    pc->evicted_once = once;
    pthread_mutex_unlock(&pc->mu);
}

int hp_prefix_cache_evict_one(hp_prefix_cache_t *pc)
{
    pthread_mutex_lock(&pc->mu);
    int d = evict_one(pc);
    pthread_mutex_unlock(&pc->mu);
    return d;
}
