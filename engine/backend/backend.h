/*
 * backend.h - the seam between the model code and the kernels (ggml's
 * backend in spirit): an opaque backend, its memory, and the ops the
 * forward pass, the KVBuffer and the caches run. forward/, cache/ and
 * serve/ name no kernel family; only engine/backend/ includes kernels/cpu
 * or kernels/cuda (tools/check-layering.sh).
 *
 * Memory. Every tensor pointer an op takes is backend memory: from
 * hp_backend_alloc, or host data the backend placed (hp_backend_place:
 * the model's weights). On the CPU backend that is plain host memory, so
 * a host pointer is a backend pointer and placing is a no-op
 * (hp_backend_host_memory). Ops never allocate: scratch is passed in,
 * sized by the matching _scratch query. Arrays of ints that a call's
 * control flow reads on the host (positions, ids, per-request pointers)
 * are host arrays; a device backend uploads them itself.
 *
 * Errors. Ops return nothing and may run asynchronously; a device
 * backend records its first failure (a launch, an op it does not
 * support) and hp_backend_sync returns it. The CPU backend cannot fail.
 * Ask hp_backend_supports_op before relying on an op.
 *
 * Layouts and math are those of the CPU kernels (kernels/cpu/hk_cpu.h,
 * hk_kvbuf.h), row-major f32, outputs first.
 */
#ifndef HP_BACKEND_H
#define HP_BACKEND_H

#include <stddef.h>

#include "engine/contract/hp_error.h"
#include "kernels/common/hk_kvbuf_geom.h"
#include "kernels/common/hk_trans.h"
#include "kernels/common/hk_weight.h"

typedef struct hp_backend hp_backend_t;

/* The ops, for hp_backend_supports_op. */
typedef enum {
    HP_OP_LINEAR,
    HP_OP_LINEAR_ACC,
    HP_OP_EMBED,
    HP_OP_RMSNORM,
    HP_OP_RMSNORM_GATED,
    HP_OP_L2NORM,
    HP_OP_SWIGLU,
    HP_OP_CONV1D_SILU,
    HP_OP_CONV1D_SILU_DECODE,
    HP_OP_GDN_GATES,
    HP_OP_GDN_RECURRENT,
    HP_OP_GDN_DECODE,
    HP_OP_GDN_CHUNK,
    HP_OP_GDN_STEP,
    HP_OP_ROPE,
    HP_OP_ROPE_SHIFT,
    HP_OP_ATTENTION,
    HP_OP_ATTENTION_DECODE,
    HP_OP_MOE_ROUTE,
    HP_OP_MOE_PLAN,
    HP_OP_MOE_GATHER,
    HP_OP_MOE_SCATTER,
    HP_OP_MOE_COMBINE,
    HP_OP_SPLIT_HEADS,
    HP_OP_GATE_MUL,
    HP_OP_SCALE_ROWS,
    HP_OP_AXPY,
    HP_OP_KV_STORE,
    HP_OP_KV_STORE_DECODE,
    HP_OP_ARGMAX,
    HP_OP_TOPK,
    HP_OP_TRANS_IDENTITY,
    HP_OP_TRANS_COMPOSE,
    HP_OP_TRANS_CHAIN,
    HP_OP_KVBUF_STEP,
    HP_OP_KVBUF_FLUSH,
    HP_OP_KVBUF_CONV_COMMIT,
    HP_OP_COUNT
} hp_op_t;

/* ---- backends ----------------------------------------------------------- */

/* The CPU backend (kernels/cpu): stateless, shared by every thread, never
 * closed. */
const hp_backend_t *hp_backend_cpu(void);

/* Opens a backend by name: "cpu", or "cuda" / "cuda:N" (device N, 0 by
 * default). HP_EUNAVAIL naming why when the build has no CUDA or the
 * device does not exist; HP_EBADINPUT for another name. */
int hp_backend_open(const hp_backend_t **b, const char *name, hp_error_t *err);
/* Frees what open made (the CPU backend: nothing). NULL is a no-op. */
void hp_backend_close(const hp_backend_t *b);

/* "cpu", "cuda:0", ... */
const char *hp_backend_name(const hp_backend_t *b);
/* The device's own name ("NVIDIA H100 80GB HBM3"); "" for the CPU. */
const char *hp_backend_device(const hp_backend_t *b);
/* Whether op runs here for weights of dtype (hk_wtype_t; ops without
 * weights ignore it). */
int hp_backend_supports_op(const hp_backend_t *b, hp_op_t op, int dtype);
/* 1 when backend memory is host memory (the CPU). */
int hp_backend_host_memory(const hp_backend_t *b);
/* Waits for the ops issued so far; HP_OK or the first failure since the
 * last sync (then cleared). */
int hp_backend_sync(const hp_backend_t *b, hp_error_t *err);

/* ---- memory ------------------------------------------------------------- */

/* bytes of backend memory, 64-byte aligned, uninitialized; NULL when out
 * of memory. */
void *hp_backend_alloc(const hp_backend_t *b, size_t bytes);
/* The same, zeroed (the CPU's is calloc, 16-byte aligned: fresh pages
 * are zero already, nothing is written). */
void *hp_backend_alloc0(const hp_backend_t *b, size_t bytes);
/* Grows (or shrinks) p, keeping the first min(old, new) bytes; NULL when
 * out of memory, p then unchanged. p may be NULL. The CPU's is realloc:
 * 16-byte aligned, no copy where the allocator can grow in place. */
void *hp_backend_realloc(const hp_backend_t *b, void *p, size_t old_bytes,
                         size_t new_bytes);
void hp_backend_free(const hp_backend_t *b, void *p); /* NULL: no-op */
void hp_backend_memset0(const hp_backend_t *b, void *p, size_t bytes);
/* host -> backend, backend -> host, backend -> backend (no overlap). */
void hp_backend_upload(const hp_backend_t *b, void *dst, const void *src,
                       size_t bytes);
void hp_backend_download(const hp_backend_t *b, void *dst, const void *src,
                         size_t bytes);
void hp_backend_copy(const hp_backend_t *b, void *dst, const void *src,
                     size_t bytes);
/* Where memory outside a sequence lives: the caches' pools (the public
 * pool's arena, the prefix cache's private pool) in backend memory, a
 * dump's or a test's buffers in host memory. put: dst (backend memory)
 * <- src in mem; get: dst in mem <- src (backend memory). An upload /
 * download, or a copy that stays on the device. */
typedef enum { HP_MEM_HOST, HP_MEM_BACKEND } hp_mem_t;
void hp_backend_put(const hp_backend_t *b, void *dst, const void *src,
                    hp_mem_t mem, size_t bytes);
void hp_backend_get(const hp_backend_t *b, void *dst, hp_mem_t mem,
                    const void *src, size_t bytes);
/* Makes the host data *p of bytes usable by ops, replacing *p with the
 * backend's copy (CPU: nothing to do). HP_ENOMEM. Release with
 * hp_backend_unplace. */
int hp_backend_place(const hp_backend_t *b, const void **p, size_t bytes,
                     hp_error_t *err);
void hp_backend_unplace(const hp_backend_t *b, const void *p);

/* What a server's passes ask of a backend beyond the memory its callers
 * allocate: a device backend's own scratch (the staging of host arrays,
 * x rounded to bf16, the I8 dequantization tile, argmax's partials of rows
 * split over blocks), planned once at start
 * with the workspace so that no step allocates device memory (a
 * cudaMalloc there synchronizes the device). */
typedef struct {
    int rows;       /* most rows of one projection */
    int cols;       /* widest projection input */
    unsigned wmask; /* weight formats present: bit (1 << hk_wtype_t) */
    size_t stage;   /* most bytes of host arrays one op stages */
} hp_backend_plan_t;

/* Grows the backend's own scratch to serve plan (kept: the largest of all
 * plans so far). HP_ENOMEM. CPU: nothing to do. */
int hp_backend_reserve(const hp_backend_t *b, const hp_backend_plan_t *plan,
                       hp_error_t *err);
/* Device allocations this process made so far, every backend and kernel
 * scratch included (0 on the CPU): tests check that serving makes none
 * after its start. */
unsigned long hp_backend_device_allocs(const hp_backend_t *b);
/* Times this process's host waited for a device so far (0 on the CPU):
 * tests check that a step waits for its results only, not per op. */
unsigned long hp_backend_device_waits(const hp_backend_t *b);
/* Seconds the host spent in those waits so far (and in the device's own
 * flow control: its staging waiting to be reused; 0 on the CPU): benches
 * set it beside a step's wall time, to say whether the host issuing the
 * ops or the device running them bounds the step. */
double hp_backend_device_wait_s(const hp_backend_t *b);
/* Bytes this process moved between host and device so far (0 on the
 * CPU): tests check that a warm splice leaves the cached tuples where
 * they are. */
unsigned long long hp_backend_host_bytes(const hp_backend_t *b);
/* ... and the copies that moved them (0 on the CPU). Fewer than the
 * transfers counted at the seam (hp_backend_transfer_count) where the
 * device reuses a copy of an array it was handed before: benches print
 * both, a test checks a steady decode step copies only what changed. */
unsigned long hp_backend_host_copies(const hp_backend_t *b);

/* An op profile, for benches: between start and stop, the device time of
 * each kind of op summed (the CUDA backend records an event after each op
 * and reads them at stop: an op's time includes any idle gap before it,
 * so the rows sum to the elapsed time). One host thread at a time;
 * HP_EBADINPUT where the backend has none (the CPU). */
typedef struct {
    char op[32]; /* the op's name as its errors give it */
    double ms;
    long calls;
} hp_backend_prof_row_t;
int hp_backend_profile_start(const hp_backend_t *b, hp_error_t *err);
/* rows[cap]: the kinds in order of first use; *n of them (at most cap). */
int hp_backend_profile_stop(const hp_backend_t *b, hp_backend_prof_row_t *rows,
                            int cap, int *n, hp_error_t *err);
/* What the backend's kernel tuners chose so far (the CUDA backend's with
 * HYPIC_CUDA_TUNE=1): a line per size class of an op, its kernels' least
 * times and the one it runs, e.g. "gdn_step B<=64 Hk=16 Hv=32 dk=128
 * dv=128 K=4: pipew (pipe 0.101, pipea 0.097, pipew 0.088 ms)", "tuning"
 * until each is timed. A string to free; NULL: none (or no memory).
 * Called as an op is (under hp_backend_lock where threads share the
 * backend). */
char *hp_backend_tuned(const hp_backend_t *b);
/* Ops issued through this seam so far (each op call, device copies and
 * memsets; an op made of others, gdn_step on the CPU, counts them too)
 * and host-link transfers (uploads, downloads, and each host array an op
 * takes: ids, positions, pointer lists, argmax's indices), every backend
 * of this process together. Counted at the seam, so the CPU backend
 * counts what a device backend would launch and move: tests check that
 * a batched decode step issues as many whatever its batch. */
unsigned long hp_backend_op_count(const hp_backend_t *b);
unsigned long hp_backend_transfer_count(const hp_backend_t *b);
/* Bytes hp_backend_download copied so far (the logits rows a step
 * brings over; ops' host outputs not counted), counted alike: tests check
 * that rows whose candidates decide are not copied. */
unsigned long long hp_backend_download_bytes(const hp_backend_t *b);
/* Bytes of memory the device has in all, and free now (0: unknown, or
 * host memory). */
size_t hp_backend_mem_total(const hp_backend_t *b);
size_t hp_backend_mem_free(const hp_backend_t *b);
/* 1 once the device has faulted (an illegal address, uncorrectable ECC,
 * a device-side assert: CUDA's sticky errors), err saying where and how:
 * every later op fails, and only a new process gets the device back, so a
 * server stops taking work and exits for its supervisor to restart it.
 * Any thread; 0 on the CPU. */
int hp_backend_lost(const hp_backend_t *b, hp_error_t *err);
/* Serializes the device work of the threads that share a device backend
 * (a server's scheduler steps, its prefill workers' segment builds): the
 * backend's staging, scratch, BLAS handle and first-failure record serve
 * one thread at a time (and a device runs one stream anyway). FIFO, so a
 * worker is not starved by a busy scheduler; not recursive. It also makes
 * the device current in the calling thread. No-op on the CPU, whose ops
 * any thread may call at once. */
void hp_backend_lock(const hp_backend_t *b);
void hp_backend_unlock(const hp_backend_t *b);

/* The operand precision an op may take where the backend has a choice
 * (the attention prefill, the dense MLP's hidden rows): F32 keeps
 * f32-level accuracy (~1e-5); BF16 lets it round to bf16 what transformers
 * keeps in bf16 running a bf16 checkpoint (q, k, p and v; gate, up and
 * their SwiGLU), where that is faster (a device: FLASH2 instead of
 * FLASH2X, kernels/cuda/hk_cuda.h; half the bytes of the MLP's rows). The
 * CPU computes in f32 either way. */
typedef enum { HP_PREC_F32 = 0, HP_PREC_BF16 = 1 } hp_prec_t;

/* ---- projections -------------------------------------------------------- */

/* y[n, rows] = x[n, cols] . W^T (W in its stored format), and += . */
void hp_backend_linear(const hp_backend_t *b, float *y, const float *x,
                       const hk_weight_t *w, int n);
void hp_backend_linear_acc(const hp_backend_t *b, float *y, const float *x,
                           const hk_weight_t *w, int n);
/* y[i] = x . W[i]^T for k matrices of one input (the same cols): a layer's
 * in-projections. The results of k hp_backend_linear calls; a device
 * rounds x to bf16 once for its bf16 matrices, not once each. */
void hp_backend_linear_n(const hp_backend_t *b, float *const *y, const float *x,
                         const hk_weight_t *const *w, int k, int n);
/* A projection's input made by an op, then the projection(s): the results
 * of the two ops each names, except that the input made (y, o, g) is
 * scratch afterwards: where the matrices are all bf16, a device writes it
 * straight to their bf16 operand, rounded as the projection would, and
 * never as f32 (no copy written and read back). */
/* hp_backend_rmsnorm(y, x, nw, T, w[0]->cols, eps), hp_backend_linear_n;
 * nw NULL: hp_backend_linear_n of y as given (x unread). */
void hp_backend_rmsnorm_linear_n(const hp_backend_t *b, float *const *ys,
                                 float *y, const float *x, const float *nw,
                                 const hk_weight_t *const *w, int k, int T,
                                 float eps);
/* hp_backend_rmsnorm_gated(o, o, z, gw, rows, dim, eps), then
 * hp_backend_linear_acc(x, o, w, T). */
void hp_backend_rmsnorm_gated_linear_acc(const hp_backend_t *b, float *x,
                                         float *o, const float *z,
                                         const float *gw, int rows, int dim,
                                         float eps, const hk_weight_t *w,
                                         int T);
/* hp_backend_gate_mul(o, gate, T w->cols), hp_backend_linear_acc(x, o). */
void hp_backend_gate_mul_linear_acc(const hp_backend_t *b, float *x, float *o,
                                    const float *gate, const hk_weight_t *w,
                                    int T);
/* hp_backend_swiglu(g, g, u, T w->cols), hp_backend_linear_acc(x, g). */
void hp_backend_swiglu_linear_acc(const hp_backend_t *b, float *x, float *g,
                                  const float *u, const hk_weight_t *w, int T);
/* The dense MLP, x += down(silu(gate n) up n): n = rmsnorm(x) with nw
 * into y, else y as given; hp_backend_rmsnorm_linear_n into g and u, then
 * hp_backend_swiglu_linear_acc. prec HP_PREC_BF16 with
 * the three matrices bf16: a device may keep the hidden rows in bf16 (gate
 * and up as a bf16 GEMM rounds its output, their SwiGLU rounded), as
 * transformers runs a bf16 checkpoint, half the bytes of f32 rows written
 * and read; g and u are scratch afterwards. The CPU computes f32 whatever
 * is asked. */
void hp_backend_mlp_acc(const hp_backend_t *b, float *x, float *y, float *g,
                        float *u, const float *nw, const hk_weight_t *gw,
                        const hk_weight_t *uw, const hk_weight_t *dw, int T,
                        float eps, hp_prec_t prec);
/* x[t, :] = W[ids[t], :] as f32; ids [T] host. */
void hp_backend_embed(const hp_backend_t *b, float *x, const hk_weight_t *w,
                      const int *ids, int T);

/* ---- norms, activations, data movement ---------------------------------- */

/* Zero-centred RMSNorm: y = x / rms(x) * (1 + w) per row; y may alias x. */
void hp_backend_rmsnorm(const hp_backend_t *b, float *y, const float *x,
                        const float *w, int rows, int dim, float eps);
/* y = w * rmsnorm(x) * silu(z) per vector of dim. */
void hp_backend_rmsnorm_gated(const hp_backend_t *b, float *y, const float *x,
                              const float *z, const float *w, int rows, int dim,
                              float eps);
/* x = x / sqrt(sum x^2 + eps) * scale per row, in place. */
void hp_backend_l2norm(const hp_backend_t *b, float *x, int rows, int dim,
                       float eps, float scale);
/* y = silu(g) * u; y may alias g or u. */
void hp_backend_swiglu(const hp_backend_t *b, float *y, const float *g,
                       const float *u, size_t n);
/* Rows of x[rows, da + db + dc] into a, b, c (c NULL when dc = 0). */
void hp_backend_split_heads(const hp_backend_t *be, float *a, float *b,
                            float *c, const float *x, int rows, int da, int db,
                            int dc);
/* o *= sigmoid(gate). */
void hp_backend_gate_mul(const hp_backend_t *b, float *o, const float *gate,
                         size_t n);
/* x[r, :] *= s[r] (sigm: sigmoid(s[r])). */
void hp_backend_scale_rows(const hp_backend_t *b, float *x, const float *s,
                           int rows, int dim, int sigm);
/* y += a x. */
void hp_backend_axpy(const hp_backend_t *b, float *y, float a, const float *x,
                     size_t n);
/* kc[pos[t], :] = k[t, :], vc[pos[t], :] = v[t, :]; pos [T] host. */
void hp_backend_kv_store(const hp_backend_t *b, float *kc, float *vc,
                         const float *k, const float *v, const int *pos, int T,
                         int kvd);
/* One new row for each of B requests with its own cache: kcs[r][pos[r],
 * :] = k[r, :], vcs[r][pos[r], :] = v[r, :]; kcs, vcs [B] host arrays of
 * backend pointers, pos [B] host. */
void hp_backend_kv_store_decode(const hp_backend_t *b, float *const *kcs,
                                float *const *vcs, const float *k,
                                const float *v, const int *pos, int B, int kvd);
/* idx[r] = argmax of logits[r, 0..V) (lowest index among equals), rows
 * ld >= V floats apart (the sampler's ids: a checkpoint's padding rows
 * past the tokenizer are never chosen); idx [B] host (a sync point). */
void hp_backend_argmax(const hp_backend_t *b, int *idx, const float *logits,
                       int B, int V, int ld);
/* The sampler's k candidates of each row at temperature 1/inv_t
 * (hk_topk) among its first V logits (the sampler's vocabulary; rows ld
 * apart): p, idx [B, k] host (a sync point), for hk_sample_topk; k <=
 * HP_BACKEND_TOPK_MAX. raw [B, k] and lse [B] host, each NULL where not
 * wanted: the candidates' raw logits (raw[j] = logits[idx[j]]) and each
 * row's log-sum-exp of its raw logits (hp_backend_lse, summed in another
 * order on a device), what log-probabilities need (hp_logprobs_from). A
 * device sends 2k values a row (3k + 2 with both), not V; its scratch is
 * planned by hp_backend_reserve for the plan's rows. */
#define HP_BACKEND_TOPK_MAX 256
void hp_backend_topk(const hp_backend_t *b, float *p, int *idx, float *raw,
                     double *lse, const float *logits, int B, int V, int ld,
                     int k, double inv_t);
/* Host math, not an op: log(sum exp(x[i])) of x[V], the sum in double
 * from the largest term (hk_lse). */
double hp_backend_lse(const float *x, int V);
/* Host math, not an op: the token the sampler draws with uniform u from
 * k candidates of hp_backend_topk's (hk_sample_topk; -1 where they
 * cannot decide). */
int hp_backend_sample_topk(const float *p, const int *idx, int k, int V,
                           int top_k, float top_p, double u);

/* ---- causal conv, Gated DeltaNet ---------------------------------------- */

/* y[T, C] = silu(causal conv of x[T, C] continuing state[C, K-1]),
 * state updated; w [C, K]. */
void hp_backend_conv1d_silu(const hp_backend_t *b, float *y, float *state,
                            const float *x, const float *w, int T, int C,
                            int K);
/* A prefill's GDN input path: hp_backend_conv1d_silu(cv, state, x, w, T,
 * C, K) with C = 2 Hk dk + Hv dv, hp_backend_split_heads into q, k [T, Hk,
 * dk] and v [T, Hv, dv], hp_backend_l2norm of q (scaled by q_scale) and of
 * k, both with eps, then hp_backend_gdn_gates(g, beta, g, beta, A_log,
 * dt_bias, T, Hv): their results, except that cv is scratch after (a
 * device writes q, k, v straight from the conv, cv never, in one launch
 * with the gates). */
void hp_backend_conv_qkv(const hp_backend_t *b, float *q, float *k, float *v,
                         float *cv, float *state, const float *x,
                         const float *w, float *g, float *beta,
                         const float *A_log, const float *dt_bias, int T,
                         int Hk, int Hv, int dk, int dv, int K, float eps,
                         float q_scale);
/* One token for each of B requests with its own state: y, x [B, C];
 * states [B] host array of backend pointers. */
void hp_backend_conv1d_silu_decode(const hp_backend_t *b, float *y,
                                   float *const *states, const float *x,
                                   const float *w, int B, int C, int K);
/* A decode step's GDN input path, hp_backend_conv_qkv's for B requests of
 * one token each with its own state (hp_backend_conv1d_silu_decode's
 * states) in place of its one sequence: the results of that conv into cv
 * and the split, norms and gates after it (cv scratch after). */
void hp_backend_conv_qkv_decode(const hp_backend_t *b, float *q, float *k,
                                float *v, float *cv, float *const *states,
                                const float *x, const float *w, float *g,
                                float *beta, const float *A_log,
                                const float *dt_bias, int B, int Hk, int Hv,
                                int dk, int dv, int K, float eps,
                                float q_scale);
/* beta = sigmoid(bp), g = -exp(A_log) softplus(a + dt_bias); [T, Hv];
 * g may alias a, beta bp. */
void hp_backend_gdn_gates(const hp_backend_t *b, float *g, float *beta,
                          const float *a, const float *bp, const float *A_log,
                          const float *dt_bias, int T, int Hv);
/* The recurrence over T tokens of one sequence (hk_gdn_recurrent). */
void hp_backend_gdn_recurrent(const hp_backend_t *b, float *o, float *S,
                              const float *q, const float *k, const float *v,
                              const float *g, const float *beta, int T, int Hk,
                              int Hv, int dk, int dv);
/* One token for each of B requests: states [B] host array of backend
 * pointers [Hv, dk, dv]; rows as hk_gdn_recurrent's with T = B. */
void hp_backend_gdn_decode(const hp_backend_t *b, float *o,
                           float *const *states, const float *q, const float *k,
                           const float *v, const float *g, const float *beta,
                           int B, int Hk, int Hv, int dk, int dv);
/* Chunked prefill (hk_gdn_chunk), chunk C; Tc [Hv, dk, dk] or NULL. At
 * HP_PREC_BF16 a backend may take q, k and v rounded to bf16 once (a
 * device does, as transformers hands them to FLA; the products stay
 * accurate); the CPU computes in f32 either way. */
void hp_backend_gdn_chunk(const hp_backend_t *b, float *o, float *S, float *Tc,
                          const float *q, const float *k, const float *v,
                          const float *g, const float *beta, int T, int Hk,
                          int Hv, int dk, int dv, int C, float *scratch,
                          hp_prec_t prec);
/* Floats of gdn_chunk's scratch for up to T tokens. */
size_t hp_backend_gdn_chunk_scratch(const hp_backend_t *b, int T, int Hv,
                                    int dk, int dv, int C);
/* One decode step of the linear mixer for B requests, from the raw
 * projections to the recurrence's output: qkv [B, cd] (the q | k | v
 * channels, cd = 2 Hk dk + Hv dv) through the causal conv + SiLU
 * (conv_states [B] host array of backend pointers to [cd, K-1], conv_w
 * [cd, K]), the l2 norms of q (times q_scale) and k (eps inside the
 * root), the gates from a, bp [B, Hv] (A_log, dt_bias [Hv]) and the step
 * on states [B] (host array of backend pointers to [Hv, dk, dv]); o
 * [B, Hv, dv]. Exactly conv1d_silu_decode, split_heads, l2norm twice,
 * gdn_gates and gdn_decode in turn (the CPU's), which a device may fuse
 * into one launch. scratch: gdn_step_scratch floats. */
void hp_backend_gdn_step(const hp_backend_t *b, float *o, float *const *states,
                         float *const *conv_states, const float *qkv,
                         const float *a, const float *bp, const float *conv_w,
                         const float *A_log, const float *dt_bias, int B,
                         int Hk, int Hv, int dk, int dv, int K, float eps,
                         float q_scale, float *scratch);
size_t hp_backend_gdn_step_scratch(const hp_backend_t *b, int B, int Hk, int Hv,
                                   int dk, int dv);

/* ---- RoPE, attention ---------------------------------------------------- */

/* Partial rotate-half RoPE of x[T, nh, hd] to pos [T] (host). */
void hp_backend_rope(const hp_backend_t *b, float *x, const int *pos, int T,
                     int nh, int hd, int rot, double theta);
/* A gated attention layer's prologue: P [T, Hq, 2 hd] (each q head, then
 * its gate) split into q and gate [T, Hq, hd] (hp_backend_split_heads),
 * q RMS-normed by qw and k [T, Hkv, hd] in place by kw (hp_backend_rmsnorm,
 * eps), then both rotated to pos [T] (host; hp_backend_rope): those five
 * ops' results (a device: one launch). */
void hp_backend_qk_norm_rope(const hp_backend_t *b, float *q, float *gate,
                             float *k, const float *P, const float *qw,
                             const float *kw, const int *pos, int T, int Hq,
                             int Hkv, int hd, int rot, double theta, float eps);
/* Keys at positions a re-rotated to a + delta. */
void hp_backend_rope_shift(const hp_backend_t *b, float *x, int delta, int T,
                           int nh, int hd, int rot, double theta);

/* Causal GQA attention of q[T, Hq, hd] at qpos [T] (host) over k, v
 * [N, Hkv, hd] (cached and new) at precision prec; o [T, Hq, hd]. */
void hp_backend_attention(const hp_backend_t *b, float *o, const float *q,
                          const int *qpos, const float *k, const float *v,
                          int T, int N, int Hq, int Hkv, int hd, float scale,
                          hp_prec_t prec, float *scratch);
size_t hp_backend_attention_scratch(const hp_backend_t *b, int T, int N, int Hq,
                                    int Hkv, int hd, hp_prec_t prec);
/* One query for each of B requests over its own cache: q, o [B, Hq, hd];
 * kcs, vcs [B] host arrays of backend pointers; n_ctx [B] host (request r
 * attends keys 0..n_ctx[r]-1). scratch: attention_scratch(1, max n_ctx). */
void hp_backend_attention_decode(const hp_backend_t *b, float *o,
                                 const float *q, const float *const *kcs,
                                 const float *const *vcs, const int *n_ctx,
                                 int B, int Hq, int Hkv, int hd, float scale,
                                 float *scratch);

/* ---- MoE ---------------------------------------------------------------- */

/* Per token softmax top-k of logits [T, E]: idx, w [T, k]. */
void hp_backend_moe_route(const hp_backend_t *b, int *idx, float *w,
                          const float *logits, int T, int E, int k, int renorm);
/* Groups the routed pairs by expert (hk_moe_plan); offs [E + 1] is host
 * (the caller sizes each expert's projections from it), rows, scale,
 * slot [T*k] backend. */
void hp_backend_moe_plan(const hp_backend_t *b, int *offs, int *rows,
                         float *scale, int *slot, const int *idx,
                         const float *w, int T, int k, int E);
void hp_backend_moe_gather(const hp_backend_t *b, float *xg, const float *y,
                           const int *rows, int n, int H);
void hp_backend_moe_scatter(const hp_backend_t *b, float *x, const float *eo,
                            const int *rows, int n, int H);
void hp_backend_moe_combine(const hp_backend_t *b, float *x, const float *eo,
                            const int *slot, int T, int k, int H);

/* ---- transitions -------------------------------------------------------- */

/* T [H, dk, dk] = I per head. */
void hp_backend_trans_identity(const hp_backend_t *b, float *T, int H, int dk);
/* out = T S + S0 per head (S0 may be NULL; out may alias S or S0);
 * scratch [H, dk, dv] floats (dense). */
void hp_backend_trans_compose(const hp_backend_t *b, float *out,
                              hk_trans_family_t fam, const float *T,
                              const float *S, const float *S0, int H, int dk,
                              int dv, float *scratch);
/* T1 <- T2 T1, S1 <- T2 S1 + S2; scratch [H, dk, max(dk, dv)] (dense). */
void hp_backend_trans_chain(const hp_backend_t *b, float *T1, float *S1,
                            hk_trans_family_t fam, const float *T2,
                            const float *S2, int H, int dk, int dv,
                            float *scratch);

/* ---- KVBuffer (layouts: kernels/cpu/hk_kvbuf.h) ------------------------- */

size_t hp_backend_kvbuf_block_floats(const hp_backend_t *b,
                                     const hk_kvbuf_geom_t *g);
/* Scratch for steps of up to T tokens per request and flushes, buffers of
 * up to lmax entries, nth threads. */
size_t hp_backend_kvbuf_scratch(const hp_backend_t *b, const hk_kvbuf_geom_t *g,
                                int T, int lmax, int nth);
/* T tokens per request against S0 + the buffer (hk_kvbuf_step); vw [R]
 * host. */
void hp_backend_kvbuf_step(const hp_backend_t *b, float *o, float *arena,
                           const hk_kvbuf_view_t *vw, const float *q,
                           const float *k, const float *v, const float *g,
                           const float *beta, int R, int T,
                           const hk_kvbuf_geom_t *geom, int lmax,
                           float *scratch, int nth);
/* Folds the first n[r] entries into each view's S (hk_kvbuf_flush); vw,
 * n [R] host. */
void hp_backend_kvbuf_flush(const hp_backend_t *b, float *arena,
                            const hk_kvbuf_view_t *vw, const int *n, int R,
                            const hk_kvbuf_geom_t *geom, float *scratch,
                            int nth);
/* Conv history after accepting m drafts with raw inputs x (state [C, K-1],
 * hk_kvbuf_conv_commit). */
void hp_backend_kvbuf_conv_commit(const hp_backend_t *b, float *state,
                                  const float *x, int m, int C, int K);

#endif
