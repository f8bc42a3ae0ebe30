/*
 * hk_cpu.h - the CPU kernels: the tested reference backend.
 *
 * Conventions (llm.c / ggml): outputs first, then inputs, then dims; every
 * pointer carries its shape in a comment; row-major; activations f32 (weights
 * also BF16 or I8, hk_linear); kernels never allocate (callers pass scratch;
 * the weight kernels keep bounded tiles on the stack). Kernels parallelize
 * internally with OpenMP over independent rows/heads; results do not depend
 * on the thread count. T = tokens, H = hidden, hd = head dim.
 */
#ifndef HK_CPU_H
#define HK_CPU_H

#include <stddef.h>

#include "kernels/common/hk_trans.h"
#include "kernels/common/hk_weight.h"

/* ---- dense algebra (hk_matmul.c) -------------------------------------- */

/* y[n, out] = x[n, in] . W[out, in]^T  (nn.Linear), through OpenBLAS;
 * up to HK_LINEAR_DIRECT rows on AVX-512 by a dot kernel streaming W
 * once (prefetching ahead: decode reads W from DRAM). */
void hk_matmul(float *y, const float *x, const float *w, int n, int in,
               int out);
/* y[n, out] += x[n, in] . W[out, in]^T */
void hk_matmul_acc(float *y, const float *x, const float *w, int n, int in,
                   int out);
/* y[n, rows] = x[n, cols] . W^T for a weight in its stored format
 * (kernels/common/hk_weight.h). F32 is hk_matmul. BF16 and I8: up to
 * HK_LINEAR_DIRECT rows (decode, small batches) stream W once through a
 * dot-product kernel of the best ISA the CPU has (hk_cpu_isa): BF16 by
 * AVX-512, AVX2 or plain C widening W to f32 (f32's products); I8 by
 * AVX-512 VNNI on
 * x quantized per row and group to 8 bits (the int8 products are exact,
 * x's rounding is 1/254 of the group's largest |x|), by AVX2 or plain C
 * dequantizing W into f32 (x kept). More rows: W widened or dequantized
 * to f32 a tile at a time and multiplied by sgemm. The same fixed grid as
 * hk_matmul: y does not depend on the thread count. */
#define HK_LINEAR_DIRECT 8
void hk_linear(float *y, const float *x, const hk_weight_t *w, int n);
/* y[n, rows] += x[n, cols] . W^T */
void hk_linear_acc(float *y, const float *x, const hk_weight_t *w, int n);
/* dst[i, cols] = W[ids[i], :] as f32 (exact for F32 and BF16, q * scale for
 * I8): the embedding gather. */
void hk_weight_rows(float *dst, const hk_weight_t *w, const int *ids, int n);

/* Instruction sets the weight kernels choose from, best first where the CPU
 * has it (runtime detection; the AVX code is compiled with target
 * attributes, so any -march builds it). */
typedef enum {
    HK_ISA_GENERIC = 0, /* plain C */
    HK_ISA_AVX2 = 1,    /* AVX2 + FMA */
    HK_ISA_AVX512 = 2   /* AVX-512 F/BW/VL/DQ (bf16), + VNNI (int8) */
} hk_isa_t;
/* The ISA the BF16 (dtype HK_W_BF16) or I8 kernels run with now: the best
 * the CPU supports, capped by hk_cpu_set_isa or, at first use, by the
 * environment variable HK_ISA=generic|avx2|avx512. */
hk_isa_t hk_cpu_isa(int dtype);
/* Caps the ISA (tests, benches); HK_ISA_AVX512 lifts the cap. Not to be
 * called while kernels run. */
void hk_cpu_set_isa(hk_isa_t max);
const char *hk_isa_name(hk_isa_t isa);

/* Call once at startup, before other threads use BLAS. hk_matmul (and
 * other kernels) call BLAS from OpenMP threads, one single-threaded call per
 * fixed block, so y has the same bits for any thread count. With OpenBLAS's
 * pthreads build this stops its own pool; with the OpenMP build it does
 * nothing (openblas_set_num_threads would set OpenMP's count). */
void hk_matmul_init(void);

/* ---- norms and activations (hk_norm.c) --------------------------------- */

/* Zero-centred RMSNorm over rows of dim: y = x / sqrt(mean(x^2)+eps) * (1+w).
 * y may alias x. */
void hk_rmsnorm_zc(float *y, const float *x, const float *w, int rows, int dim,
                   float eps);
/* Gated RMSNorm per vector of dim: y = w * rmsnorm(x) * silu(z). */
void hk_rmsnorm_gated(float *y, const float *x, const float *z, const float *w,
                      int rows, int dim, float eps);
/* x / sqrt(sum(x^2) + eps) per row of dim, then times scale. In place. */
void hk_l2norm(float *x, int rows, int dim, float eps, float scale);
/* y = silu(g) * u elementwise (SwiGLU); y may alias g or u. */
void hk_swiglu(float *y, const float *g, const float *u, size_t n);
static inline float hk_silu(float x);
static inline float hk_sigmoid(float x);
/* PyTorch softplus (threshold 20: returns x when x > 20). */
static inline float hk_softplus(float x);

/* ---- causal depthwise conv1d + SiLU (hk_conv.c) ------------------------ */

/* y[T, C] = silu(causal_conv(x)), x[T, C] raw inputs, w[C, K] (w[c, K-1]
 * multiplies the current token). state[C, K-1] holds the K-1 raw inputs
 * before x[0] (oldest first; zeros at sequence start) and is updated to the
 * last K-1 raw inputs of (state ++ x). */
void hk_conv1d_silu(float *y, float *state, const float *x, const float *w,
                    int T, int C, int K);

/* ---- RoPE, rotate-half (NeoX), partial (hk_rope.c) --------------------- */

/* Rotates the first rot dims of each head vector of x[T, nh, hd] in place
 * to positions pos[T]: for i < rot/2, inv_freq_i = theta^(-2i/rot),
 * x'[i] = x[i] cos - x[i+rot/2] sin, x'[i+rot/2] = x[i+rot/2] cos + x[i] sin.
 * Angles are computed in double. */
void hk_rope(float *x, const int *pos, int T, int nh, int hd, int rot,
             double theta);
/* Re-rotates keys cached at positions a to positions a + delta
 * (K_b = R(b - a) K_a); same layout as hk_rope. */
void hk_rope_shift(float *x, int delta, int T, int nh, int hd, int rot,
                   double theta);

/* ---- causal GQA attention (hk_attention.c) ----------------------------- */

/* o[T, Hq, hd] = softmax(q k^T * scale, causal by position) v.
 * q[T, Hq, hd], qpos[T]: query positions; k, v [N, Hkv, hd]: keys at
 * positions 0..N-1 in order; query t attends keys j <= qpos[t].
 * Query head h uses kv head h / (Hq / Hkv). scratch: hk_attention_scratch. */
void hk_attention(float *o, const float *q, const int *qpos, const float *k,
                  const float *v, int T, int N, int Hq, int Hkv, int hd,
                  float scale, float *scratch);
size_t hk_attention_scratch(int T, int N, int Hq);
/* Decode of B requests over paged K/V: request b's position j is row
 * j % P of page table[b * max_pages + j / P] of the arenas k_pages,
 * v_pages [pages][P][Hkv][hd]; it attends positions 0..n_ctx[b]-1
 * (n_ctx[b] >= 1). q, o [B, Hq, hd]. Gathers each request's rows into
 * scratch, then hk_attention with T = 1, qpos = n_ctx[b] - 1 (the
 * reference of hk_cuda_attention_decode_paged). scratch:
 * hk_attention_decode_paged_scratch(N, ...) with N >= every n_ctx[b]. */
void hk_attention_decode_paged(float *o, const float *q, const float *k_pages,
                               const float *v_pages, const int *table,
                               int max_pages, const int *n_ctx, int B, int P,
                               int Hq, int Hkv, int hd, float scale,
                               float *scratch);
size_t hk_attention_decode_paged_scratch(int N, int Hq, int Hkv, int hd);

/* ---- Gated DeltaNet (hk_gdn.c) -----------------------------------------
 * Per value head h (key head h / (Hv/Hk)), state S[Hv, dk, dv] ([key][value]):
 *   S <- e^{g_t} S;  d = beta_t (v_t - S^T k_t);  S <- S + k_t d^T;
 *   o_t = S^T q_t.
 * q, k are already L2-normalized (q also scaled by dk^-1/2).
 * q, k [T, Hk, dk]; v [T, Hv, dv]; g, beta [T, Hv]; o [T, Hv, dv]. */

/* The gates from the projections: beta = sigmoid(b), g = hk_math_gdn_gate(
 * a, A_log[h], dt_bias[h]). a, b, g, beta [T, Hv]; A_log, dt_bias [Hv];
 * g may alias a and beta may alias b. */
void hk_gdn_gates(float *g, float *beta, const float *a, const float *b,
                  const float *A_log, const float *dt_bias, int T, int Hv);

/* Token-by-token recurrence (decode, and the reference for the chunk form). */
void hk_gdn_recurrent(float *o, float *S, const float *q, const float *k,
                      const float *v, const float *g, const float *beta, int T,
                      int Hk, int Hv, int dk, int dv);

/* Chunked (WY / UT) prefill with chunk size C (1..64), same o and S as the
 * recurrence. If Tc != NULL it also returns, per value head, the transition
 * over the T tokens, Tc[Hv, dk, dk] = prod_t e^{g_t}(I - beta_t k_t k_t^T)
 * (later tokens on the left), from the same chunk quantities:
 * T_chunk = e^{gamma_C} I - Ktilde^T W (pic-kvbuffer-math.md §3), so
 * S_end = Tc S_start + S_end|0. T need not be a multiple of C (the last
 * chunk is shorter; T = 0 leaves S and sets Tc = I). S may start non-zero.
 * scratch: hk_gdn_chunk_scratch floats (one slot per value head, so it does
 * not depend on the thread count). Heads run in parallel (OpenMP) with
 * OpenBLAS's OpenMP build, or its pthreads build made single-threaded by
 * hk_matmul_init(); else one by one. */
void hk_gdn_chunk(float *o, float *S, float *Tc, const float *q, const float *k,
                  const float *v, const float *g, const float *beta, int T,
                  int Hk, int Hv, int dk, int dv, int C, float *scratch);
size_t hk_gdn_chunk_scratch(int Hv, int dk, int dv, int C);

/* ---- transition algebra, all three families (hk_transition.c) ----------
 * Recurrence S_t = T_t S_{t-1} + u_t over a segment: S_end = T_C S + S_C|0.
 * Per head: S[dk, dv]; T stored compressed by family:
 *   scalar: t[1]; diagonal: t[dk]; dense: t[dk, dk]. */
/* Floats one head's T takes in the family's compressed form. */
size_t hk_trans_size(hk_trans_family_t fam, int dk);
/* out[H, dk, dv] = T[h] S[h] + S0[h] per head (the composition, Eq. 6).
 * out may alias S or S0; S0 may be NULL (zero). scratch >= dk*dv floats
 * (dense; may be NULL otherwise). */
void hk_trans_compose(float *out, hk_trans_family_t fam, const float *T,
                      const float *S, const float *S0, int H, int dk, int dv,
                      float *scratch);
/* Composes two segments' tuples: (T2, S2) after (T1, S1) ->
 * T = T2 T1, S = T2 S1 + S2 (in place into T1/S1). scratch >=
 * dk*max(dk, dv) floats (dense; may be NULL otherwise). */
void hk_trans_chain(float *T1, float *S1, hk_trans_family_t fam,
                    const float *T2, const float *S2, int H, int dk, int dv,
                    float *scratch);
/* State RoPE re-rotation for scalar-transition layers that rotate K
 * (Ring-style): S[H, dk, dv] <- R(delta) S, rotating the key axis with the
 * rotate-half convention over the first rot dims. */
void hk_trans_rope_shift(float *S, int delta, int H, int dk, int dv, int rot,
                         double theta);

/* ---- MoE routing (hk_moe.c) -------------------------------------------- */

/* softmax over E logits, top-k (ties: lower index first), optional
 * renormalization. idx[k], w[k]. */
void hk_moe_route(int *idx, float *w, const float *logits, int E, int k,
                  int renorm);

/* Groups the T*k routed pairs (token t, choice j) of idx[T, k], w[T, k] by
 * expert, in the order of a loop over experts then tokens: expert e owns
 * slots offs[e] .. offs[e+1]-1 (offs[E+1]), tokens ascending; rows[s] is
 * the slot's token, scale[s] its weight; slot[t*k + j] is the slot of
 * pair (t, j). rows, scale, slot [T*k]. idx entries in 0..E-1, distinct
 * per token (a top-k). */
void hk_moe_plan(int *offs, int *rows, float *scale, int *slot, const int *idx,
                 const float *w, int T, int k, int E);
/* xg[n, H] = y[rows[i], :] (the rows of one expert's slots, or all). */
void hk_moe_gather(float *xg, const float *y, const int *rows, int n, int H);
/* x[rows[i], :] += eo[i, :] for i < n; the rows must be distinct (one
 * expert's slots), so the CUDA twin needs no atomics. */
void hk_moe_scatter(float *x, const float *eo, const int *rows, int n, int H);
/* The expert combine in one pass: x[t, :] += eo[slot[t*k + j], :] for
 * j = 0..k-1 in that order (eo [T*k, H] by slot, already weighted). */
void hk_moe_combine(float *x, const float *eo, const int *slot, int T, int k,
                    int H);

/* ---- elementwise and data movement (hk_elementwise.c) -----------------
 * The small loops of the forward pass, named so each has a CUDA twin. */

/* Splits each row of x[rows, da + db + dc] into a[rows, da], b[rows, db]
 * and c[rows, dc] (c may be NULL when dc = 0). The attention projection's
 * per-head [query | gate] is rows = T*Hq, da = db = hd; the GDN conv
 * output [q | k | v] is rows = T, da = db = Hk*dk, dc = Hv*dv. */
void hk_split_heads(float *a, float *b, float *c, const float *x, int rows,
                    int da, int db, int dc);
/* o[i] *= sigmoid(gate[i]) (the attention output gate). */
void hk_gate_mul(float *o, const float *gate, size_t n);
/* y[i] += a x[i] (the naive splice; S_C|0 = S_end - T_C S_head). */
void hk_axpy(float *y, float a, const float *x, size_t n);
/* x[r, :] *= s[r], or sigmoid(s[r]) when sigm (the MoE routing weights and
 * the shared expert's gate). */
void hk_scale_rows(float *x, const float *s, int rows, int dim, int sigm);
/* Stores new keys and values in a cache by position: kc[pos[t], :] = k[t],
 * vc[pos[t], :] = v[t] for t < T; k, v [T, kvd]; kc, vc [N, kvd]. */
void hk_kv_store(float *kc, float *vc, const float *k, const float *v,
                 const int *pos, int T, int kvd);
/* The same for B requests over paged K/V (hk_attention_decode_paged's
 * layout, kvd = Hkv * hd): row b of k and v to position pos[b] of request
 * b's pages. */
void hk_kv_store_paged(float *k_pages, float *v_pages, const float *k,
                       const float *v, const int *table, int max_pages,
                       const int *pos, int B, int P, int kvd);
/* Token embedding: x[t, :] = table[ids[t], :]; x [T, H], table [V, H]. */
void hk_embed(float *x, const float *table, const int *ids, int T, int H);

/* ---- next-token helpers (hk_sample.c) -----------------------------------
 * The CPU twins of the device-side argmax and top-k, and the choice from a
 * top-k list with the engine sampler's rules (temperature, top-k, top-p),
 * so a device only sends k candidates to the host, not V logits. */

/* Index of the largest of x[n] (the lowest index among equals). */
int hk_argmax(const float *x, int n);
/* The sampler's candidates: idx[k] the k largest logits[V] (k <= V;
 * by value descending, then index ascending) and p[k] their probabilities
 * at temperature 1/inv_t as the engine sampler forms them,
 * p = (float)(e / z) with e = (float)exp((logit - max) * inv_t) and z the
 * double sum of e over all V; then ordered as the sampler sorts, by p
 * descending, then index ascending. With raw[k] and *lse (each NULL:
 * not wanted), what log-probabilities need: the candidates' raw logits
 * (raw[j] = logits[idx[j]]) and the row's hk_lse. */
void hk_topk(float *p, int *idx, float *raw, double *lse, const float *logits,
             int V, int k, double inv_t);
/* log(sum exp(x[i])) of x[n], a the index of the largest (hk_argmax):
 * x[a] + log(1 + sum over i != a of exp(x[i] - x[a])), in double and in
 * index order, as the engine's log-probabilities sum it. */
double hk_lse(const float *x, int n, int a);
/* The token the sampler draws with uniform u in [0, 1) from k candidates
 * of hk_topk: top_k (0: off) keeps the first top_k, top_p (>= 1: off) the
 * shortest head whose probabilities sum to top_p; the kept ones are
 * renormalized and the first whose cumulative probability exceeds u wins.
 * Where the kept set reaches past the k candidates (k < V, top_k 0 or
 * above k, the nucleus not complete within them), its normalizer is only
 * bounded, and the draw is decided while u falls within the candidates'
 * share for every normalizer in the bounds (plain temperature: u below
 * their probability mass). Returns -1 where it is not. */
int hk_sample_topk(const float *p, const int *idx, int k, int V, int top_k,
                   float top_p, double u);

/* ---- inline scalar helpers: the math shared with the CUDA twins ------- */
#include "kernels/common/hk_math.h"
static inline float hk_sigmoid(float x)
{
    return hk_math_sigmoid(x);
}
static inline float hk_silu(float x)
{
    return hk_math_silu(x);
}
static inline float hk_softplus(float x)
{
    return hk_math_softplus(x);
}

#endif
