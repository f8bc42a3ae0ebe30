/*
 * hk_cuda.h - the CUDA kernels: twins of kernels/cpu/hk_cpu.h, callable
 * from C. It includes no CUDA header, so the engine and the tests compile
 * with gcc alone and link libhk_cuda.a + -lcudart -lcublas.
 *
 * Conventions: the CPU ones (outputs first, then inputs, then dims; shapes
 * in comments; row-major f32), plus:
 *   - every tensor pointer is a device pointer;
 *   - the last argument is the stream, a cudaStream_t passed as void *
 *     (NULL = the legacy default stream); launchers are asynchronous;
 *   - every launcher returns an hk_cuda_status_t: 0, or a negative code
 *     (a failed cudaGetLastError() after the launch is HK_CUDA_ELAUNCH).
 *     Library code never exits or prints; hk_cuda_strerror names a code;
 *   - kernels never allocate: scratch is passed in, sized by the
 *     matching _scratch function (counted in floats, like the CPU's).
 * Numerics follow the CPU kernels' order of operations where it is fixed
 * by the math (the GDN step order, the chunk quantities); sums of products
 * are f32 in another order, so results agree to f32 rounding, not bits.
 */
#ifndef HK_CUDA_H
#define HK_CUDA_H

#include <math.h>
#include <stddef.h>

/* hk_cpu.h for hk_trans_family_t, with C linkage under nvcc too; its system
 * headers are included above, outside the extern "C" block. */
#ifdef __cplusplus
extern "C" {
#endif

#include "kernels/cpu/hk_cpu.h"

typedef enum {
    HK_CUDA_OK = 0,
    HK_CUDA_ENODEV = -1,   /* no device or no driver */
    HK_CUDA_EINVAL = -2,   /* bad shape or argument */
    HK_CUDA_ENOMEM = -3,   /* cudaMalloc failed */
    HK_CUDA_ELAUNCH = -4,  /* kernel launch failed (cudaGetLastError) */
    HK_CUDA_ERUNTIME = -5, /* other CUDA runtime error (copy, sync) */
    HK_CUDA_EBLAS = -6     /* cuBLAS error */
} hk_cuda_status_t;

/* A static string naming rc. */
const char *hk_cuda_strerror(int rc);

/* *n = number of usable devices. No device or no driver (cudaGetDeviceCount
 * failing with cudaErrorNoDevice / cudaErrorInsufficientDriver, error 35
 * on our CI) is not an error: *n = 0, returns 0. Other failures return
 * HK_CUDA_ERUNTIME with *n = 0. */
int hk_cuda_device_count(int *n);

/* ---- memory and streams (thin checked wrappers) ------------------------ */

int hk_cuda_malloc(void **p, size_t bytes); /* *p = NULL on failure */
int hk_cuda_free(void *p);                  /* NULL is a no-op */
int hk_cuda_memset0(void *p, size_t bytes, void *stream);
int hk_cuda_h2d(void *dst, const void *src, size_t bytes, void *stream);
int hk_cuda_d2h(void *dst, const void *src, size_t bytes, void *stream);
int hk_cuda_d2d(void *dst, const void *src, size_t bytes, void *stream);
int hk_cuda_stream_sync(void *stream);

/* cuBLAS handle for the dense transition products; one per host thread
 * that launches them. Create after choosing the device. */
typedef struct hk_cuda_blas hk_cuda_blas_t;
int hk_cuda_blas_create(hk_cuda_blas_t **blas);
void hk_cuda_blas_destroy(hk_cuda_blas_t *blas); /* NULL is a no-op */

/* ---- norms and activations (hk_norm.cu) -------------------------------- */

/* Twins of hk_rmsnorm_zc, hk_rmsnorm_gated, hk_l2norm, hk_swiglu (same
 * aliasing rules: y may alias x; l2norm is in place). */
int hk_cuda_rmsnorm_zc(float *y, const float *x, const float *w, int rows,
                       int dim, float eps, void *stream);
int hk_cuda_rmsnorm_gated(float *y, const float *x, const float *z,
                          const float *w, int rows, int dim, float eps,
                          void *stream);
int hk_cuda_l2norm(float *x, int rows, int dim, float eps, float scale,
                   void *stream);
int hk_cuda_swiglu(float *y, const float *g, const float *u, size_t n,
                   void *stream);

/* ---- causal depthwise conv1d + SiLU (hk_conv.cu) ----------------------- */

/* Twin of hk_conv1d_silu: y[T, C], state[C, K-1] in/out, x[T, C],
 * w[C, K]. */
int hk_cuda_conv1d_silu(float *y, float *state, const float *x, const float *w,
                        int T, int C, int K, void *stream);
/* One decode token for each of B requests: y[B, C], x[B, C]; states is a
 * device array of B device pointers, each a [C, K-1] state (pool slots
 * need not be contiguous). Same as hk_conv1d_silu with T = 1 per request. */
int hk_cuda_conv1d_silu_decode(float *y, float *const *states, const float *x,
                               const float *w, int B, int C, int K,
                               void *stream);

/* ---- RoPE, rotate-half, partial (hk_rope.cu) --------------------------- */

/* Twins of hk_rope / hk_rope_shift: x[T, nh, hd] in place, pos[T] (device),
 * rot even, rot <= hd, rot <= 1024; angles in double (hk_math.h). */
int hk_cuda_rope(float *x, const int *pos, int T, int nh, int hd, int rot,
                 double theta, void *stream);
int hk_cuda_rope_shift(float *x, int delta, int T, int nh, int hd, int rot,
                       double theta, void *stream);

/* ---- Gated DeltaNet (hk_gdn.cu) ----------------------------------------
 * Layouts as hk_gdn_recurrent / hk_gdn_chunk: q, k [T, Hk, dk];
 * v, o [T, Hv, dv]; g, beta [T, Hv]; S [Hv, dk, dv]; Tc [Hv, dk, dk].
 * dk <= HK_CUDA_GDN_MAX_DK (a warp keeps one state column in registers). */
#define HK_CUDA_GDN_MAX_DK 256
#define HK_CUDA_GDN_MAX_C  64

/* Gates from the projections: beta = sigmoid(b), g = -exp(A_log[h])
 * softplus(a + dt_bias[h]) (hk_math.h). b, a, beta, g [T, Hv]; A_log,
 * dt_bias [Hv]. beta may alias b and g may alias a. */
int hk_cuda_gdn_gates(float *g, float *beta, const float *a, const float *b,
                      const float *A_log, const float *dt_bias, int T, int Hv,
                      void *stream);

/* Twin of hk_gdn_recurrent: one sequence of T tokens, per token in the
 * order decay, read S^T k, delta, write, output o = S^T q with the updated
 * state. One block per value head. */
int hk_cuda_gdn_recurrent(float *o, float *S, const float *q, const float *k,
                          const float *v, const float *g, const float *beta,
                          int T, int Hk, int Hv, int dk, int dv, void *stream);
/* One decode step for B requests: q, k [B, Hk, dk]; v, o [B, Hv, dv];
 * g, beta [B, Hv]; states: device array of B device pointers, each an
 * [Hv, dk, dv] state, updated in place. One block per (request, head). */
int hk_cuda_gdn_decode(float *o, float *const *states, const float *q,
                       const float *k, const float *v, const float *g,
                       const float *beta, int B, int Hk, int Hv, int dk, int dv,
                       void *stream);

/* Twin of hk_gdn_chunk (chunk size C, 1..64; Tc may be NULL). Unlike the
 * CPU kernel the scratch grows with T: the chunk-local quantities of all
 * chunks are formed in parallel first, then one pass carries the state
 * across chunks (hk_gdn.cu). Callers with very long T may split it into
 * calls (S carries over; chain the Tc's with hk_cuda_trans_chain). */
int hk_cuda_gdn_chunk(float *o, float *S, float *Tc, const float *q,
                      const float *k, const float *v, const float *g,
                      const float *beta, int T, int Hk, int Hv, int dk, int dv,
                      int C, float *scratch, void *stream);
size_t hk_cuda_gdn_chunk_scratch(int T, int Hv, int dk, int dv, int C);

/* ---- transition algebra (hk_transition.cu) ----------------------------- */

/* Twin of hk_trans_compose: out[H, dk, dv] = T[h] S[h] + S0[h]; out may
 * alias S or S0; S0 may be NULL. Dense products are one strided batched
 * sgemm over heads; scratch [H, dk, dv] floats is needed (dense) only when
 * out aliases S, else may be NULL. */
int hk_cuda_trans_compose(float *out, hk_trans_family_t fam, const float *T,
                          const float *S, const float *S0, int H, int dk,
                          int dv, float *scratch, hk_cuda_blas_t *blas,
                          void *stream);
/* Twin of hk_trans_chain: T1 <- T2 T1, S1 <- T2 S1 + S2. Dense needs
 * scratch [H, dk, max(dk, dv)] floats. */
int hk_cuda_trans_chain(float *T1, float *S1, hk_trans_family_t fam,
                        const float *T2, const float *S2, int H, int dk, int dv,
                        float *scratch, hk_cuda_blas_t *blas, void *stream);
/* Twin of hk_trans_rope_shift: S[H, dk, dv] <- R(delta) S on the key axis. */
int hk_cuda_trans_rope_shift(float *S, int delta, int H, int dk, int dv,
                             int rot, double theta, void *stream);

#ifdef __cplusplus
}
#endif

#endif
