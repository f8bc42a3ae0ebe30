/*
 * forward_impl.h - what forward.c (the rows of one sequence),
 * forward_batch.c (one decode step of many sequences) and forward_plan.c
 * (the workspace, pieces) share: the workspace's named buffers and the layer
 * pieces that do not care which sequence a row belongs to. Internal to the
 * forward pass, not an API.
 *
 * A layer runs as begin (projections over all rows: each weight read
 * once), the per-sequence middle (conv and recurrence, or K/V store and
 * attention), end (output projection over all rows).
 */
#ifndef HP_FORWARD_IMPL_H
#define HP_FORWARD_IMPL_H

#include "engine/forward/forward.h"

/* Named activation buffers of the workspace: backend memory, except the
 * ones marked host (read by the host's control flow, or host arrays an op
 * takes). */
enum {
    B_X,
    B_Y,
    B_QKV,
    B_CONV,
    B_Q,
    B_K,
    B_V,
    B_Z,
    B_BETA,
    B_G,
    B_O,
    B_P,
    B_GATE,
    B_UP,
    B_SCRATCH,
    B_ROUTE,
    B_XG,
    B_EO,
    B_POS, /* host */
    B_ROWS,
    B_MOEIDX,
    B_MOEW,
    B_MOESCALE, /* hp_backend_moe_plan's outputs */
    B_MOESLOT,
    B_MOEOFFS, /* host */
    B_TC,
    B_SPECQKV,
    B_SPECCONV,
    B_LOGITS,
    B_ITEMS,      /* host; hp_forward_batch: ints per item (order, rows, ctx) */
    B_KVBUFS,     /* host; hp_forward_batch: hp_kvbuf_t * per item */
    B_DECODE,     /* host; hp_forward_batch: K and V caches, context per item */
    B_TCACC,      /* hp_forward: a transition run's product over the pieces */
    B_BEST,       /* host; hp_forward_batch: each row's argmax (ints) */
    B_HOSTLOGITS, /* host; hp_forward_batch: logits rows the host reads,
                     where backend memory is not host memory */
    B_IDS,        /* host; hp_forward_batch: the rows' token ids (ints) */
    B_CANDP,      /* host; hp_forward_batch: topk items' candidates, */
    B_CANDI,      /* hp_fwd_topk a row: probabilities, tokens (ints), */
    B_CANDR,      /* raw logits (logprobs items), */
    B_CANDL,      /* a row's log-sum-exp (a double: two floats) */
    B_JUMPS,      /* the jump callbacks' (hp_fwd_jump_mem) */
    B_JUMPSCR,
    B_COUNT
};

/* hk_gdn_chunk's chunk: measured best on AVX-512 (helper bench in
 * test_gdn), C=16 beats 64 by ~1.5x, the sgemms being small either way. */
#define HP_FWD_GDN_CHUNK 16

/* Buffer `id` (64-byte aligned) if the plan gave it room for n floats,
 * else NULL: the entry checks keep calls within the plan, so NULL is a
 * planning bug (forward_plan.c sizes every buffer). */
void *hp_fwd_buf(hp_fwd_ws_t *ws, int id, size_t n);

/* hp_forward for at most the plan's max_tokens tokens (forward.c). */
int hp_fwd_run(const hp_model_t *m, hp_seq_t *seq, hp_fwd_ws_t *ws,
               const int *ids, const int *pos, int T, const hp_jumps_t *jumps,
               hp_logits_mode_t mode, float *logits, hp_error_t *err);

/* A Gated DeltaNet layer's per-row tensors (reference §3), T rows. */
typedef struct {
    float *qkv;  /* [T, conv_dim] projection, raw conv input */
    float *cv;   /* [T, conv_dim] after the conv */
    float *q;    /* [T, Hk, dk] */
    float *k;    /* [T, Hk, dk] */
    float *v;    /* [T, Hv, dv] */
    float *z;    /* [T, Hv, dv] output gate */
    float *beta; /* [T, Hv] sigmoid'ed */
    float *g;    /* [T, Hv] log decay */
    float *o;    /* [T, Hv, dv] */
} hp_fwd_lin_t;

/* Buffers for T rows, the input norm of x [T, hidden] into y (scratch
 * after: hp_backend_rmsnorm_linear_n), its four projections (beta and g
 * hold the raw b and a projections until the gates are formed:
 * hp_fwd_lin_conv, _conv_decode, or the fused hp_fwd_lin_step).
 * HP_ENOMEM. */
int hp_fwd_lin_begin(const hp_model_t *m, int l, hp_fwd_ws_t *ws, float *y,
                     const float *x, int T, hp_fwd_lin_t *b, hp_error_t *err);
/* Rows [start, end) of one sequence: causal conv continuing from hist
 * [conv_dim, Kc-1] (updated), split into q, k, v, q and k L2-normalized
 * (q scaled by dk^-1/2), in one op (hp_backend_conv_qkv: cv is its
 * scratch); their gates formed in beta and g. */
void hp_fwd_lin_conv(const hp_model_t *m, int l, const hp_fwd_lin_t *b,
                     float *hist, int start, int end);
/* Rows [r0, r0 + R): one decode token for each of R sequences, their
 * conv histories conv[R] (a host array; updated): hp_fwd_lin_conv's path
 * in one op (hp_backend_conv_qkv_decode), for a step whose recurrence is
 * not fused with it (the KVBuffer's). */
void hp_fwd_lin_conv_decode(const hp_model_t *m, int l, const hp_fwd_lin_t *b,
                            float *const *conv, int r0, int R);
/* Rows [r0, r0 + R): one decode token for each of R sequences, with the
 * layer's states S[R] and conv histories conv[R] (host arrays): conv,
 * split, norms, gates and recurrence in one op (hp_backend_gdn_step)
 * into o. scratch: hp_backend_gdn_step_scratch(R, ...) floats. */
void hp_fwd_lin_step(const hp_model_t *m, int l, const hp_fwd_lin_t *b,
                     float *const *S, float *const *conv, int r0, int R,
                     float *scratch);
/* Gated RMSNorm of o by z, then x [T, hidden] += o out_proj^T. */
void hp_fwd_lin_end(const hp_model_t *m, int l, const hp_fwd_lin_t *b, float *x,
                    int T);

/* A gated attention layer's per-row tensors (reference §4), T rows. */
typedef struct {
    float *q;    /* [T, Hq, hd] normed, rotated */
    float *gate; /* [T, Hq, hd] */
    float *k;    /* [T, Hkv, hd] normed, rotated */
    float *v;    /* [T, Hkv, hd] */
    float *o;    /* [T, Hq, hd] */
} hp_fwd_att_t;

/* Buffers, the input norm of x into y (scratch after), its projections,
 * q/gate split, q/k norms, RoPE at pos[T]. HP_ENOMEM. */
int hp_fwd_att_begin(const hp_model_t *m, int l, hp_fwd_ws_t *ws, float *y,
                     const float *x, const int *pos, int T, hp_fwd_att_t *b,
                     hp_error_t *err);
/* Rows [row0, row0+T) of one sequence: K/V into its cache at their
 * positions. */
void hp_fwd_att_store(const hp_model_t *m, hp_seq_layer_t *sl,
                      const hp_fwd_att_t *b, const int *pos, int row0, int T);
/* The same, then attention over its n_ctx positions. scratch:
 * hp_backend_attention_scratch(T, n_ctx, Hq, Hkv, hd). */
void hp_fwd_att_seq(const hp_model_t *m, hp_seq_layer_t *sl,
                    const hp_fwd_att_t *b, const int *pos, int row0, int T,
                    int n_ctx, float *scratch);
/* Output gate, then x [T, hidden] += o o_proj^T. */
void hp_fwd_att_end(const hp_model_t *m, int l, const hp_fwd_att_t *b, float *x,
                    int T);

/* Post-attention norm of x into y, then x += MLP(y) (SwiGLU or MoE) over
 * T rows. HP_ENOMEM. */
int hp_fwd_mlp(const hp_model_t *m, int l, hp_fwd_ws_t *ws, float *y, float *x,
               int T, hp_error_t *err);

#endif
