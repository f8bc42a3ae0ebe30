/*
 * kvbuf.h - KVBuffer for the Gated DeltaNet layers (DESIGN §5): a paged
 * block pool shared by all requests, and per request and linear layer a
 * buffer of the tokens since the last flush (k, w, G; layout in
 * kernels/cpu/hk_kvbuf.h, run through the backend's kvbuf ops) over the state
 * S0 of that flush.
 *
 * Forms. Chunkwise: a buffer over a state (the prefill's, or one created
 * by an earlier flush) reads S0 once per step and writes it once per `cap`
 * steps. KV-only: a buffer with no state (a short prompt run through the
 * buffer, hp_kvbuf_prefill) reads only its entries; it creates its state at
 * its first flush, when the context reaches cap_kvonly. Verification:
 * drafts are appended as pending entries, all outputs computed in one call,
 * and hp_kvbuf_truncate keeps the accepted prefix (no state copy, no
 * rollback). Outputs equal hk_gdn_recurrent's to f32 rounding.
 *
 * Not thread-safe: one scheduler thread owns a pool and its buffers (the
 * kernels parallelize inside). Nothing here allocates after init: blocks
 * and state slots come from the pool's free lists in O(1).
 */
#ifndef HP_KVBUF_H
#define HP_KVBUF_H

#include <stddef.h>

#include "engine/backend/backend.h"
#include "engine/contract/hp_error.h"

typedef struct {
    int Hk, Hv, dk, dv;     /* linear-attention heads and dims */
    int block_tokens;       /* tokens per block (b) */
    int cap;                /* B: a buffer over a state flushes at B entries */
    int cap_kvonly;         /* a state-less buffer flushes (creating its state)
                               when the context reaches this */
    int max_step;           /* most tokens one call appends per request
                               (drafts + 1; prompts are cut into such pieces) */
    int max_batch;          /* most requests (or buffers) per call */
    int n_blocks;           /* pool size in blocks (required, > 0) */
    int n_states;           /* pool state slots for buffers that start KV-only
                               and were given no storage of their own */
    int n_threads;          /* kernel threads; 0: omp_get_max_threads() */
    const hp_backend_t *be; /* where the pool's memory and kernels are:
                               the sequences' model's; NULL: the CPU */
} hp_kvbuf_config_t;

typedef struct {
    hp_kvbuf_config_t cfg;
    const hp_backend_t *be; /* cfg.be, or the CPU */
    hk_kvbuf_geom_t geom;
    size_t block_floats; /* hk_kvbuf_block_floats(&geom) */
    size_t state_floats; /* Hv * dk * dv */
    int lmax;            /* most entries a buffer ever holds */
    int max_blocks;      /* blocks one buffer can hold */
    int nth;
    float *arena; /* [n_blocks, block_floats], 64-byte aligned */
    int *free_blk;
    int n_free_blk;
    float *states; /* [n_states, state_floats] */
    int *free_st;
    int n_free_st;
    float *scratch;
    hk_kvbuf_view_t *views; /* [max_batch] per-call views */
    int *nfold;             /* [max_batch] */
    int *undo_nb;           /* [max_batch] n_blocks before a failed call */
    int *undo_slot;         /* [max_batch] slot taken by the call, or -1 */
} hp_kvbuf_pool_t;

typedef struct {
    int *blocks;  /* [pool max_blocks] block ids; first n_blocks held */
    int n_blocks; /* blocks held (kept across flushes, freed at release) */
    int len;      /* entries since the last flush, pending ones included */
    int pending;  /* entries of an unresolved verification, else 0 */
    float *S;     /* [Hv, dk, dv] state of the last flush; NULL: KV-only */
    float *store; /* where a KV-only buffer's state will live, or NULL */
    int slot;     /* pool state slot behind S or store, -1 if none */
} hp_kvbuf_t;

/* ---- traffic model (bytes per request, layer and step; inputs and
 * outputs, the same for every form, left out) -------------------------- */

/* Recurrent: read and write S every step, Hv * 2 * dk*dv * 4. */
double hp_kvbuf_bytes_recurrent(int Hk, int Hv, int dk, int dv);
/* Chunkwise with capacity B, averaged over the B steps of a flush cycle:
 * read S0 each step, read the (B-1)/2 earlier entries on average, write
 * one entry; once per cycle the flush reads the B entries and reads and
 * writes S0. One entry is Hk*dk*4 + Hv*(dv*4 + 8) bytes (k once per key
 * head, w and a double G per value head). */
double hp_kvbuf_bytes_chunkwise(int Hk, int Hv, int dk, int dv, int B);
/* KV-only at a context of t entries: read t entries, write one. */
double hp_kvbuf_bytes_kvonly(int Hk, int Hv, int dk, int dv, int t);

/* Defaults: cap = the B minimizing hp_kvbuf_bytes_chunkwise
 * (B* = 4 sqrt(Hv dk dv * 4 / entry bytes): 16 for Qwen3.5-0.8B, 18 for
 * Qwen3-Next); cap_kvonly = the largest context whose KV-only step moves
 * no more bytes than an average chunkwise step (79 and 103); block_tokens
 * 16, max_step 16, max_batch 256, n_threads 0, be NULL. n_blocks and
 * n_states are left 0 for the caller. */
void hp_kvbuf_config_default(hp_kvbuf_config_t *c, int Hk, int Hv, int dk,
                             int dv);

/* Bytes the pool's arena, state slots and scratch take. */
size_t hp_kvbuf_pool_bytes(const hp_kvbuf_config_t *c);

/* ---- pool ---------------------------------------------------------------- */

/* Allocates the arena, state slots and scratch. HP_EBADINPUT on a bad
 * config, HP_ENOMEM. On error the pool is left empty (free is safe). */
int hp_kvbuf_pool_init(hp_kvbuf_pool_t *p, const hp_kvbuf_config_t *c,
                       hp_error_t *err);
/* Frees everything; buffers still open become invalid. */
void hp_kvbuf_pool_free(hp_kvbuf_pool_t *p);
static inline int hp_kvbuf_pool_free_blocks(const hp_kvbuf_pool_t *p)
{
    return p->n_free_blk;
}

/* ---- buffers ------------------------------------------------------------- */

/*
 * Opens an empty buffer. S: the state decoding continues from (the
 * prefill's), updated in place at every flush and never freed here, or
 * NULL for a KV-only buffer. For a KV-only buffer `store` (may be NULL)
 * is caller memory [Hv, dk, dv] the state is created in at the first
 * flush; with store NULL that flush takes a pool state slot. Allocates the
 * block list (not in the decode loop). HP_ENOMEM.
 */
int hp_kvbuf_open(hp_kvbuf_pool_t *p, hp_kvbuf_t *b, float *S, float *store,
                  hp_error_t *err);
/* Returns the buffer's blocks and state slot to the pool and frees the
 * block list. Entries not yet flushed are dropped: call hp_kvbuf_fold
 * first to keep the running state in S. */
void hp_kvbuf_close(hp_kvbuf_pool_t *p, hp_kvbuf_t *b);

/* Capacity in force: cap over a state, cap_kvonly without one. */
static inline int hp_kvbuf_threshold(const hp_kvbuf_pool_t *p,
                                     const hp_kvbuf_t *b)
{
    return b->S ? p->cfg.cap : p->cfg.cap_kvonly;
}

/*
 * Makes sure each of the n buffers can take T more entries (blocks, and a
 * state slot where a flush may create the state), all or nothing:
 * HP_EBUSY and no change when the pool cannot supply them (the request
 * waits). A scheduler reserves a request's buffers of every linear layer
 * before its forward pass, so no layer can fail half way. T <= max_step.
 */
int hp_kvbuf_reserve(hp_kvbuf_pool_t *p, hp_kvbuf_t *const *bufs, int n, int T,
                     hp_error_t *err);

/*
 * One decode step of one layer for R requests (bufs[r] is request r's
 * buffer of this layer): q, k [R, Hk, dk] (q L2-normalized and scaled by
 * dk^-1/2, k L2-normalized), v [R, Hv, dv], g (log decay) and beta
 * [R, Hv], the same tensors hk_gdn_recurrent takes; o [R, Hv, dv].
 * Buffers that reach their capacity are flushed. HP_EBUSY (pool
 * exhausted; nothing changed), HP_EBADINPUT (R > max_batch, or a buffer
 * with pending drafts).
 */
int hp_kvbuf_decode(hp_kvbuf_pool_t *p, hp_kvbuf_t *const *bufs, int R,
                    float *o, const float *q, const float *k, const float *v,
                    const float *g, const float *beta, hp_error_t *err);

/*
 * Verification: T tokens per request (the last sampled token and T-1
 * drafts, say) in one call, rows request-major ([R*T, ...], row r*T + t),
 * outputs o [R*T, Hv, dv] for all. The entries stay pending until
 * hp_kvbuf_truncate. Same errors as hp_kvbuf_decode; T <= max_step.
 */
int hp_kvbuf_verify(hp_kvbuf_pool_t *p, hp_kvbuf_t *const *bufs, int R, int T,
                    float *o, const float *q, const float *k, const float *v,
                    const float *g, const float *beta, hp_error_t *err);

/* Keeps the first `keep` (0..T) pending entries, drops the rest, and
 * flushes if the buffer reached its capacity. HP_EBADINPUT. */
int hp_kvbuf_truncate(hp_kvbuf_pool_t *p, hp_kvbuf_t *b, int keep,
                      hp_error_t *err);

/*
 * A prompt's GDN layer through the buffer (KV-only prefill when b has no
 * state): T tokens ([T, ...] rows as in hk_gdn_recurrent), in pieces of at
 * most max_step, each accepted whole; a buffer that reaches its capacity
 * flushes on the way (so a long prompt ends up with a state). o [T, Hv, dv].
 * HP_EBUSY leaves the pieces already done in place: reserve first.
 */
int hp_kvbuf_prefill(hp_kvbuf_pool_t *p, hp_kvbuf_t *b, int T, float *o,
                     const float *q, const float *k, const float *v,
                     const float *g, const float *beta, hp_error_t *err);

/* dst [Hv, dk, dv] <- the running state S_t = e^{G_t} S0 + sum e^{G_t-G_i}
 * k_i w_i^T (pending entries excluded), b unchanged. */
int hp_kvbuf_state(hp_kvbuf_pool_t *p, const hp_kvbuf_t *b, float *dst,
                   hp_error_t *err);

/* Folds every entry into the state now (creating it for a KV-only buffer:
 * HP_EBUSY without storage or a free slot), leaving the buffer empty. */
int hp_kvbuf_fold(hp_kvbuf_pool_t *p, hp_kvbuf_t *b, hp_error_t *err);

#endif
