/*
 * hk_kvbuf.h - KVBuffer decoding kernels for the Gated DeltaNet layers
 * (CPU): chunkwise decode from a state S0 plus a paged buffer of recent
 * tokens, parallel draft verification, KV-only (state-less) decode, and the
 * rank-n flush. Kept apart from hk_cpu.h; same conventions (outputs first,
 * shapes in comments, f32, kernels never allocate).
 *
 * Math (pic-kvbuffer-math.md §5), per value head h with key head h/(Hv/Hk).
 * Buffered tokens i = 1..t since the last flush, G_i = sum_{j<=i} g_j:
 *   S_t = e^{G_t} S0 + sum_{i<=t} e^{G_t - G_i} k_i w_i^T
 *   u_t = e^{G_t} S0^T k_t + sum_{i<t} e^{G_t - G_i} (k_i.k_t) w_i
 *       (= e^{g_t} S_{t-1}^T k_t)
 *   w_t = beta_t (v_t - u_t)
 *   o_t = e^{G_t} S0^T q_t + sum_{i<=t} e^{G_t - G_i} (k_i.q_t) w_i
 *   flush: S0 <- e^{G_n} S0 + Ktilde^T W, Ktilde_i = e^{G_n - G_i} k_i
 * so o_t and S_t equal hk_gdn_recurrent's. Every decay is e^{x} of a
 * log-space difference x <= 0 (gdn_math.h), G kept in double.
 *
 * Block layout. The buffer entries live in fixed-size blocks of bs tokens
 * carved from one arena; block id b starts at arena + b * block_floats:
 *   K [Hk][dk][bs] f32  key of each KEY head, stored once and shared by the
 *                       Hv/Hk value heads of its group (GVA); one column
 *                       per entry, so the products k_i.k_t of a block are
 *                       vertical sums (no horizontal reductions) and the
 *                       block is Ktilde^T for the flush GEMM as it stands
 *   W [Hv][bs][dv] f32  delta value w of each value head
 *   G [Hv][bs]     f64  cumulative log decay since the last flush
 * (each region starts on a 64-byte boundary). A request's buffer is a list
 * of block ids: entry i is slot i % bs of block blocks[i / bs]. Per head the
 * keys of one block are a contiguous [dk, bs] matrix, the w's [bs, dv].
 * bs <= 64; bs = 16 (the default) has a register-resident fast path.
 *
 * Threads: OpenMP with nth threads over (request, head); each work item
 * uses its own thread's scratch slot and writes disjoint outputs, so the
 * results are the same bits for any nth and any batch composition (a
 * request batched with others gives exactly its solo outputs). The flush
 * calls cblas_sgemm from those threads: hk_matmul_init() first.
 */
#ifndef HK_KVBUF_H
#define HK_KVBUF_H

#include <stddef.h>

#include "kernels/common/hk_kvbuf_geom.h"

/* Floats one block takes in the arena (a multiple of 16: 64-byte aligned
 * blocks when the arena is). */
size_t hk_kvbuf_block_floats(const hk_kvbuf_geom_t *g);

/* Entry i's w of value head h, and its G (keys are stored as columns). */
float *hk_kvbuf_w(float *arena, const hk_kvbuf_geom_t *g, const int *blocks,
                  int i, int h); /* -> [dv] */
double *hk_kvbuf_G(float *arena, const hk_kvbuf_geom_t *g, const int *blocks,
                   int i, int h);

/*
 * T new tokens per request, in order, against S0 + the buffer: appends the
 * entries (k, w, G) at positions len .. len+T-1 of each view (the blocks
 * must already be there) and writes every token's output. T = 1 is a
 * decode step; T > 1 verifies drafts (each w_t sees the earlier drafts'
 * entries) or runs a short prompt on a state-less buffer. S0^T k_t and
 * S0^T q_t for all T tokens come from one read of S0. Neither S0 nor the
 * views' len change: the caller owns both (truncation = keep a shorter len).
 * q, k are normalized as for hk_gdn_recurrent (q scaled by dk^-1/2).
 * Rows are request-major: row r*T + t is token t of request r.
 * lmax >= every len + T; scratch: hk_kvbuf_step_scratch(g, T, lmax, nth).
 */
void hk_kvbuf_step(float *o,                  /* [R*T, Hv, dv] */
                   float *arena,              /* blocks, entries appended */
                   const hk_kvbuf_view_t *vw, /* [R] */
                   const float *q,            /* [R*T, Hk, dk] */
                   const float *k,            /* [R*T, Hk, dk] */
                   const float *v,            /* [R*T, Hv, dv] */
                   const float *gl,           /* [R*T, Hv] log decay */
                   const float *beta,         /* [R*T, Hv] */
                   int R, int T, const hk_kvbuf_geom_t *g, int lmax,
                   float *scratch, int nth);
size_t hk_kvbuf_step_scratch(const hk_kvbuf_geom_t *g, int T, int lmax,
                             int nth);

/*
 * Folds the first n[r] entries of each view into its S (which must not be
 * NULL: the caller hands a zeroed state for a state-less buffer):
 * S <- e^{G_n} S + Ktilde^T W, one rank-n cblas_sgemm per value head.
 * n[r] = 0 leaves request r alone. Entries are not modified, so the same
 * call on a copy of S gives the effective state without flushing.
 * scratch: hk_kvbuf_flush_scratch(g, nmax, nth).
 */
void hk_kvbuf_flush(float *arena, const hk_kvbuf_view_t *vw, /* [R] */
                    const int *n,                            /* [R] */
                    int R, const hk_kvbuf_geom_t *g, float *scratch, int nth);
size_t hk_kvbuf_flush_scratch(const hk_kvbuf_geom_t *g, int nmax, int nth);

/*
 * Conv history after accepting m of the drafts whose raw (pre-conv) inputs
 * are x[0..m): state[C, K-1] (oldest first) <- the last K-1 raw inputs of
 * (state ++ x[0..m)). Draft verification runs hk_conv1d_silu on a scratch
 * copy of the history; the real history is touched only here, once the
 * accepted count is known, so rejected drafts leave no trace (exact: it is
 * pure data movement, the same values hk_conv1d_silu over x[0..m) keeps).
 */
void hk_kvbuf_conv_commit(float *state,   /* [C, K-1], in/out */
                          const float *x, /* [>= m, C] raw inputs */
                          int m, int C, int K);

#endif
