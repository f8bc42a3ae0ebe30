/*
 * seq.h - the running state of one sequence: per linear layer the recurrent
 * state and conv history, per full-attention layer the K/V cache indexed by
 * absolute position. This is what prefill produces and decode consumes.
 */
#ifndef HP_SEQ_H
#define HP_SEQ_H

#include <stddef.h>

#include "engine/contract/hp_error.h"
#include "engine/forward/kvbuf.h"
#include "engine/model/model.h"

typedef struct {
    /* linear layers (NULL for full layers) */
    float *S;    /* [Hv, dk, dv], layout [key][value] */
    float *conv; /* [conv_dim, Kc-1], raw inputs, oldest first */
    /* full-attention layers (NULL for linear layers) */
    float *k; /* [cap, Hkv, hd], post-norm post-RoPE */
    float *v; /* [cap, Hkv, hd] */
    /* KVBuffer decoding (DESIGN §5), open when kvb.blocks != NULL: S is
     * then the state of the last flush only (or unused while the buffer is
     * KV-only); the running state is hp_kvbuf_state(), and
     * hp_seq_kvbuf_close() folds it back into S. */
    hp_kvbuf_t kvb;
} hp_seq_layer_t;

/*
 * A sequence pool: one backend allocation, made at a server's start, from
 * which sequences take their memory (their linear states, conv histories
 * and K/V caches, all of one sequence in one extent), so that a request's
 * admission, prefill and decode make no device allocation (on CUDA each
 * cudaMalloc may synchronize the device). First fit over a free list of
 * extents (host memory), merged again when freed. A sequence that
 * outgrows its extent moves to a larger one (a copy inside the pool:
 * hp_seq_grow, or hp_seq_reserve, which fails with HP_ENOMEM as on the
 * CPU); the scheduler takes a bounded first extent and grows it as the
 * sequence does.
 * The byte budget is its caller's (hp_sched_cfg_t.seq_budget). Thread
 * safe.
 */
typedef struct hp_seq_pool hp_seq_pool_t;

typedef struct {
    const hp_model_t *model;
    const hp_backend_t *be;  /* the model's: where the states live */
    int n_pos;               /* positions filled: next token goes to n_pos */
    int kv_cap;              /* positions allocated in every k/v cache */
    hp_seq_layer_t *layers;  /* [L] */
    hp_kvbuf_pool_t *kvpool; /* non-NULL: linear layers use the KVBuffer */
    int spec_T;          /* tokens of an unresolved hp_forward_verify, else 0 */
    int spec_start;      /* n_pos before that verification */
    hp_seq_pool_t *pool; /* non-NULL: the memory is an extent of it */
    size_t pool_off;     /* ... at this offset, of pool_len bytes */
    size_t pool_len;
} hp_seq_t;

/* Creates an empty sequence (zero states). Returns HP_OK or HP_ENOMEM. */
int hp_seq_init(hp_seq_t *s, const hp_model_t *m, hp_error_t *err);
void hp_seq_free(hp_seq_t *s);
/* Makes room for positions [0, n) in every K/V cache (doubling). */
int hp_seq_reserve(hp_seq_t *s, int n, hp_error_t *err);
/* Room for positions [0, n): a pooled sequence moves to an extent of cap
 * positions (else n; cap < n: n), its states, K/V and open KVBuffers
 * kept; HP_EBUSY when the pool has no free extent that large now (others
 * must give theirs back first), nothing changed. Not with a verification
 * unresolved (HP_EBADINPUT). Unpooled: hp_seq_reserve. */
int hp_seq_grow(hp_seq_t *s, int n, int cap, hp_error_t *err);
/* Back to the empty state, keeping the allocations (KVBuffers are
 * closed, their entries dropped). */
void hp_seq_reset(hp_seq_t *s);
/* Switches the linear layers to KVBuffer decoding over the states they
 * hold: after a prefill, chunkwise from S; on an empty sequence, KV-only
 * (a short prompt then runs through the buffer, and S is only the storage
 * the state is created in when the context reaches cap_kvonly). The pool
 * must match the model's linear heads. HP_EBADINPUT, HP_ENOMEM. */
int hp_seq_kvbuf_open(hp_seq_t *s, hp_kvbuf_pool_t *pool, hp_error_t *err);
/* Folds every buffer into S (the running state: before S is read, saved
 * or copied) and closes them: back to recurrent decoding. HP_EBADINPUT
 * with a verification unresolved. No-op when not open. */
int hp_seq_kvbuf_close(hp_seq_t *s, hp_error_t *err);

/*
 * dst (initialised, empty) becomes a copy of src: its states and the K/V
 * of its positions, on the same backend. src's KVBuffers must be closed
 * (a request forks into n choices right after its prefill). HP_ENOMEM,
 * HP_EBADINPUT (buffers open).
 */
int hp_seq_copy(hp_seq_t *dst, const hp_seq_t *src, hp_error_t *err);

/*
 * The copies between a sequence and memory outside it (the caches'
 * entries and checkpoints in backend memory, dumps in host memory: mem
 * says which): the one place where a device backend transfers. Sizes
 * from the model's config geometry.
 *
 * state: linear layer l's S [Hv,dk,dv] then its conv history
 *   [conv_dim,Kc-1], state_floats + conv_floats floats at buf. Read the
 *   running state only with the KVBuffers closed (hp_seq_kvbuf_close).
 * kv: full layer l's K and V rows of positions [at, at + n), n * kv_row
 *   floats each; unpack needs the positions reserved (hp_seq_reserve).
 */
void hp_seq_state_pack(const hp_seq_t *s, int l, float *buf, hp_mem_t mem);
void hp_seq_state_unpack(hp_seq_t *s, int l, const float *buf, hp_mem_t mem);
void hp_seq_kv_pack(const hp_seq_t *s, int l, int at, int n, float *k, float *v,
                    hp_mem_t mem);
void hp_seq_kv_unpack(hp_seq_t *s, int l, int at, int n, const float *k,
                      const float *v, hp_mem_t mem);

/* Bytes a sequence of n positions holds (states + KV). */
size_t hp_seq_bytes(const hp_model_t *m, int n);

/* A pool of bytes of backend memory be (one allocation, now). HP_ENOMEM
 * naming the budget. */
int hp_seq_pool_create(hp_seq_pool_t **p, const hp_backend_t *be, size_t bytes,
                       hp_error_t *err);
void hp_seq_pool_free(hp_seq_pool_t *p); /* its sequences freed first */
/* The pool's size; the bytes of its free extents in all; its largest. */
size_t hp_seq_pool_bytes(const hp_seq_pool_t *p);
size_t hp_seq_pool_free_bytes(const hp_seq_pool_t *p, size_t *largest);
/* Bytes of the extent a sequence of model m with room for n positions
 * takes from a pool (its layers' buffers, each 256-byte aligned). */
size_t hp_seq_pool_need(const hp_model_t *m, int n);
/* hp_seq_init with room for n positions, in pool: HP_EBUSY when no free
 * extent is that large now (others must end first), HP_ETOOLARGE when it
 * never will be (larger than the pool). */
int hp_seq_init_in(hp_seq_t *s, const hp_model_t *m, hp_seq_pool_t *pool, int n,
                   hp_error_t *err);

#endif
