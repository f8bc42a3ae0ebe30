/*
 * prefix_cache_impl.h - what prefix_cache.c (the tree, admission,
 * eviction) and prefix_tune.c (the alpha search on simulator copies)
 * share. Internal to the prefix cache, not an API.
 */
#ifndef HP_PREFIX_CACHE_IMPL_H
#define HP_PREFIX_CACHE_IMPL_H

#include <pthread.h>

#include "engine/cache/arena.h"
#include "engine/cache/prefix_cache.h"
#include "engine/cache/radix.h"

/* Per node: what eviction and restore need. kv and state are blobs of
 * the private pool (backend memory: the host may not read them). */
typedef struct {
    uint64_t stamp; /* last access */
    int lock;       /* running requests whose path goes through here */
    int has_state;
    float *kv;       /* [n_full][2][len][kv_row]: K then V per full layer */
    size_t kv_bytes; /* kv's size (len when it was made) */
    float *state;    /* [n_lin][state + conv floats]: hp_seq_state_pack per
                        linear layer, in slot order */
} pcd_t;

/* Sizes and FLOPs the cache adds to the config's geometry. */
typedef struct {
    size_t kv_tok; /* bytes of one token's K/V, all full layers */
    size_t state;  /* bytes of one checkpoint */
    double c0;     /* FLOPs per token, context-free part */
    double a1;     /* FLOPs per (query, key) pair, all layers */
} geom_t;

struct hp_prefix_cache {
    pthread_mutex_t mu;
    hp_model_config_t cfg;
    hp_prefix_cache_params_t p;
    geom_t g;
    int tensors;
    /* the private pool (tensors): budget bytes of the backend's memory,
     * made at create, blobs from the arena ar; no allocation after */
    const hp_backend_t *be;
    uint8_t *mem;
    size_t mem_bytes;
    hp_arena_t ar;
    size_t snap_used; /* bytes of requests' snapshots, not yet in the tree */
    hp_radix_t tree;
    uint64_t clock;
    size_t kv_used, st_used;
    int states;
    hp_prefix_cache_stats_t st; /* counters */
    /* overlap-depth histogram, weights gamma^-k (k = request count) */
    double *hist; /* [dp_max_depth + 1] */
    double hist_w, hist_mass;
    double hist_all; /* every request's weight, overlap or not */
    double hist_len; /* ... times its prompt length */
    /* alpha tuning (prefix_tune.c) */
    hp_pc_tune_phase_t phase;
    int evicted_once;
    uint64_t n_before;
    int window;
    hp_prefix_cache_t *snap;
    hp_prefix_cache_trace_t *rec;
    int n_rec, cap_rec;
    size_t rec_tokens;
    struct hp_pc_tune_job *job; /* the search running, or NULL */
    double tune_hit[HP_PC_MAX_ALPHAS];
};

static inline pcd_t *D(const hp_radix_node_t *x)
{
    return x->data;
}

static inline size_t node_kv_bytes(const hp_prefix_cache_t *pc,
                                   const hp_radix_node_t *x)
{
    return (size_t)x->len * pc->g.kv_tok;
}

/* Frees a node's payload, its blobs back to the pool ud (the cache;
 * NULL: nothing to give back) (hp_radix_free's callback). */
void hp_pc_free_pcd(void *ud, void *data);

/* The bootstrap state machine (prefix_tune.c), all with pc->mu held:
 * after each call that may have evicted (step); a finished request into
 * the window being recorded (record); a finished search adopted (poll,
 * wait: block until it is); the search and window dropped (free, from
 * destroy). */
void hp_pc_tune_step(hp_prefix_cache_t *pc);
void hp_pc_tune_record(hp_prefix_cache_t *pc, const int *ids, int n_prompt,
                       int n);
void hp_pc_tune_poll(hp_prefix_cache_t *pc, int wait);
void hp_pc_tune_free(hp_prefix_cache_t *pc);

#endif
