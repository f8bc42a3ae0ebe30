/*
 * hk_conv.cu - CUDA twin of hk_conv.c: causal depthwise conv1d + SiLU with
 * a carried state (the GDN short convolution over the q/k/v channels).
 *
 *   y[t, c] = silu( sum_{j=0}^{K-1} w[c, j] * in[t - (K-1) + j, c] )
 *   in[tau] = x[tau, c] for tau >= 0, state[c, K-1 + tau] for tau < 0
 *
 * Layouts: x, y [T, C] row-major; w [C, K], w[c, K-1] multiplies the
 * current token; state [C, K-1], oldest first. On return state holds the
 * last K-1 raw inputs of (state ++ x). The batched decode form runs B
 * independent sequences of one token, each with its own state pointer.
 *
 * Two launches on one stream: every output first (one thread per (token,
 * channel), the taps summed in the CPU's order, j ascending from 0.0f),
 * then the state shift (one thread per (sequence, channel)). The second
 * launch starts only after the first has read the old state.
 *
 * hk_cuda_conv_qkv is a prefill's whole GDN input path in the first
 * launch: the conv of one head's channels (q, k or v), SiLU, and for q
 * and k the L2 norm, written split into q, k, v, and a v head's gates:
 * the four kernels' results (conv, split, l2norm, gates) bit for bit,
 * without the conv output written and read back. Its launch shape: a warp
 * per (head slot, run of HK_CONV_RUN consecutive tokens), HK_CONV_WARPS
 * consecutive runs of one slot a block; lanes over the head's channels as
 * hk_cuda_impl.h's row fragments (float4 where dims and pointers allow),
 * each lane's weights and last K inputs in registers (a sliding window:
 * each x element read once per run, the K-1 before a run's first token
 * from x or the state; the decode form's warps one row each, over their
 * own sequence's state); the L2 norm the warp's shuffles
 * (hk_wrow_l2norm, as hk_cuda_l2norm's for rows of <= HK_WROW_MAX); a v
 * head's gates (t, h) by its lane 0. Heads wider than HK_WROW_MAX or
 * K > HK_CONV_KMAX take a block of HK_ROW_THREADS per (token, head slot)
 * instead, the row staged in shared memory and reduced as hk_cuda_l2norm
 * reduces a row of its dim. The state shift is a second launch either
 * way. hk_cuda_conv_qkv_decode is the same path for a decode step's rows,
 * each one token of its own sequence with its own state (the fused
 * recurrent step's input half, for the KVBuffer step that follows it).
 */
#include "kernels/cuda/hk_cuda_impl.h"

#define HK_CONV_THREADS 128
/* The fused path's warp kernel: tokens a warp convolves in sequence (its
 * K-1 inputs before them read twice, once by the warp before: 16 keeps
 * that and the run's weight loads small, and a 1024-token chunk of a
 * 64-head layer about one wave of an H100/H200), runs a block, the widest
 * conv it holds in registers. */
#define HK_CONV_RUN   16
#define HK_CONV_WARPS 4
#define HK_CONV_KMAX  4

/* Sequence b has tokens rows b*T .. b*T + T-1 of x and y; its state is
 * states[b] if states is non-NULL, else state (B = 1). */
static __device__ __forceinline__ const float *
hk_conv_state(const float *state, float *const *states, int b)
{
    return states ? states[b] : state;
}

/* Channel c's input at token tau of its sequence: xs [T, C] for tau >= 0,
 * its state st [K-1] (oldest first) before. */
static __device__ __forceinline__ float
hk_conv_in(const float *st, const float *xs, int tau, int c, int C, int S)
{
    return tau < 0 ? st[S + tau] : xs[(size_t)tau * C + c];
}

/* One tap added to the sum: every kernel's, so the sums agree bit for
 * bit (the CPU's order: j ascending from 0.0f). */
static __device__ __forceinline__ float hk_conv_tap(float acc, float w,
                                                    float in)
{
    return acc + w * in;
}

/* Channel c's taps at token t before the SiLU: st its state [K-1], xs its
 * sequence's inputs [T, C], wc its weights [K] (the CPU's order). */
static __device__ __forceinline__ float hk_conv_taps(const float *st,
                                                     const float *xs,
                                                     const float *wc, int t,
                                                     int c, int C, int K)
{
    const int S = K - 1;
    float acc = 0.0f;
    for (int j = 0; j < K; j++)
        acc = hk_conv_tap(acc, wc[j], hk_conv_in(st, xs, t - S + j, c, C, S));
    return acc;
}

static __global__ void hk_conv_out_kernel(float *y,             // [B*T, C]
                                          const float *state,   // [C, K-1]
                                          float *const *states, // [B] or 0
                                          const float *x,       // [B*T, C]
                                          const float *w,       // [C, K]
                                          int B, int T, int C, int K)
{
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C)
        return;
    const int S = K - 1;
    const float *wc = w + (size_t)c * K;
    const long long rows = (long long)B * T;
    for (long long r = blockIdx.y; r < rows; r += gridDim.y) {
        const int b = (int)(r / T), t = (int)(r % T);
        const float *st = hk_conv_state(state, states, b) + (size_t)c * S;
        const float *xs = x + (size_t)b * T * C; /* this sequence's x */
        y[(size_t)r * C + c] =
            hk_math_silu(hk_conv_taps(st, xs, wc, t, c, C, K));
    }
}

/* st[i] <- the i-th of the last S raw inputs of (st ++ x), oldest first.
 * In place: st[i + T] is read before st[i + T] itself is written, since i
 * ascends (the CPU's loop). */
static __global__ void hk_conv_state_kernel(float *state,         // [C, K-1]
                                            float *const *states, // [B] or 0
                                            const float *x,       // [B*T, C]
                                            int B, int T, int C, int K)
{
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    const int b = blockIdx.y;
    if (c >= C)
        return;
    const int S = K - 1;
    float *st = (states ? states[b] : state) + (size_t)c * S;
    const float *xs = x + (size_t)b * T * C;
    for (int i = 0; i < S; i++) {
        const int tau = T - S + i;
        st[i] = tau < 0 ? st[i + T] : xs[(size_t)tau * C + c];
    }
}

/* The head slot's output rows: q heads 0..Hk-1, k heads, then v heads;
 * *stride: floats from one token's row to the next. */
static __device__ __forceinline__ float *hk_conv_qkv_out(float *q, float *k,
                                                         float *v, int slot,
                                                         int Hk, int Hv, int dk,
                                                         int dv, size_t *stride)
{
    *stride = slot < 2 * Hk ? (size_t)Hk * dk : (size_t)Hv * dv;
    return slot < Hk       ? q + (size_t)slot * dk
           : slot < 2 * Hk ? k + (size_t)(slot - Hk) * dk
                           : v + (size_t)(slot - 2 * Hk) * dv;
}

/* v head h's gates at token t, in place (hk_gdn_gates_kernel's). */
static __device__ __forceinline__ void hk_conv_gates(float *g, float *beta,
                                                     const float *A_log,
                                                     const float *dt_bias,
                                                     int t, int h, int Hv)
{
    const size_t e = (size_t)t * Hv + h;
    beta[e] = hk_math_sigmoid(beta[e]);
    g[e] = hk_math_gdn_gate(g[e], A_log[h], dt_bias[h]);
}

/* The warp kernel (file comment): run blockIdx.x HK_CONV_WARPS + warp of
 * head slot blockIdx.y; heads of <= NC HK_FRAG_VEC 32 channels, K <=
 * HK_CONV_KMAX. Window entry HK_CONV_KMAX - K + j holds tap j's input,
 * the newest last; w's entries likewise (the first HK_CONV_KMAX - K are
 * neither read nor summed). DEC (the decode form): row t is a sequence of
 * its own, its state states[t], a run one row (a template argument, so
 * the prefill's instances keep their registers). */
template <int NC, bool DEC>
static __global__ void __launch_bounds__(HK_CONV_WARPS * 32)
    hk_conv_qkv_warp_kernel(float *q, float *k, float *v, const float *state,
                            float *const *states, const float *x,
                            const float *w, float *g, float *beta,
                            const float *A_log, const float *dt_bias, int T,
                            int Hk, int Hv, int dk, int dv, int K, float eps,
                            float q_scale, bool vec)
{
    constexpr int run = DEC ? 1 : HK_CONV_RUN;
    const int lane = threadIdx.x & 31;
    const int t0 = (blockIdx.x * HK_CONV_WARPS + (threadIdx.x >> 5)) * run;
    if (t0 >= T) /* the whole warp */
        return;
    const int t1 = min(T, t0 + run), slot = blockIdx.y;
    /* the run's sequence: its state and first row */
    const float *st = DEC ? states[t0] : state;
    const int tb = DEC ? t0 : 0;
    const int kd = Hk * dk, C = 2 * kd + Hv * dv, S = K - 1;
    const int D = HK_CONV_KMAX - K;
    const bool qk = slot < 2 * Hk;
    const int dim = qk ? dk : dv;
    const int c0 = qk ? slot * dk : 2 * kd + (slot - 2 * Hk) * dv;
    size_t stride;
    float *out = hk_conv_qkv_out(q, k, v, slot, Hk, Hv, dk, dv, &stride);
    float wr[NC][HK_FRAG_VEC][HK_CONV_KMAX], win[NC][HK_FRAG_VEC][HK_CONV_KMAX];
#pragma unroll
    for (int c = 0; c < NC; c++)
#pragma unroll
        for (int e = 0; e < HK_FRAG_VEC; e++) {
            const int i = hk_frag_at(c, lane, 32) + e, ch = c0 + i;
            const bool in = i < dim;
            /* the window before the first shift: the run's K-1 earlier
             * inputs in entries D+1 .. HK_CONV_KMAX-1 */
#pragma unroll
            for (int j = 0; j < HK_CONV_KMAX; j++) {
                wr[c][e][j] = in && j >= D ? w[(size_t)ch * K + j - D] : 0.0f;
                win[c][e][j] =
                    in && j > D
                        ? hk_conv_in(st + (size_t)ch * S, x + (size_t)tb * C,
                                     t0 - tb - S + j - D - 1, ch, C, S)
                        : 0.0f;
            }
        }
    /* tokens t + 1 .. t + A's inputs loaded before token t's work: A + 1
     * rows in flight a warp (an H200's call 2 measured this kernel at
     * 57 % of copy with one row ahead: ~28 warps an SM x 1 KB in flight
     * is under the ~5 MB its bandwidth times latency asks for) */
    constexpr int A = NC == 1 ? 4 : 2;
    hk_frag<NC> ahead[A];
#pragma unroll
    for (int a = 0; a < A; a++)
        if (t0 + a < t1)
            hk_frag_load(ahead[a], x + (size_t)(t0 + a) * C + c0, dim, lane, 32,
                         vec);
    for (int t = t0; t < t1; t++) {
        hk_frag<NC> f = ahead[0]; /* token t's inputs, then its outputs */
#pragma unroll
        for (int a = 0; a + 1 < A; a++)
            ahead[a] = ahead[a + 1];
        if (t + A < t1)
            hk_frag_load(ahead[A - 1], x + (size_t)(t + A) * C + c0, dim, lane,
                         32, vec);
#pragma unroll
        for (int c = 0; c < NC; c++)
#pragma unroll
            for (int e = 0; e < HK_FRAG_VEC; e++) {
                float acc = 0.0f;
#pragma unroll
                for (int j = 0; j < HK_CONV_KMAX; j++) {
                    win[c][e][j] =
                        j + 1 < HK_CONV_KMAX ? win[c][e][j + 1] : f.v[c][e];
                    if (j >= D)
                        acc = hk_conv_tap(acc, wr[c][e][j], win[c][e][j]);
                }
                const bool in = hk_frag_at(c, lane, 32) + e < dim;
                f.v[c][e] = in ? hk_math_silu(acc) : 0.0f;
            }
        if (qk)
            hk_wrow_l2norm(f, eps, slot < Hk ? q_scale : 1.0f);
        hk_frag_store(out + (size_t)t * stride, f, dim, lane, 32, vec);
        if (!qk && g && lane == 0)
            hk_conv_gates(g, beta, A_log, dt_bias, t, slot - 2 * Hk, Hv);
    }
}

/* The block form, for any head dim and K: token blockIdx.x, head slot
 * blockIdx.y; row: [max(dk, dv)] floats of dynamic shared memory. With
 * states, token t is a sequence of its own (its state states[t]). */
static __global__ void
hk_conv_qkv_kernel(float *q, float *k, float *v, const float *state,
                   float *const *states, const float *x, const float *w,
                   float *g, float *beta, const float *A_log,
                   const float *dt_bias, int Hk, int Hv, int dk, int dv, int K,
                   float eps, float q_scale)
{
    __shared__ float sh[32];
    HK_DYNAMIC_SMEM(smem);
    float *row = (float *)smem;
    const int t = blockIdx.x, slot = blockIdx.y, kd = Hk * dk;
    const int C = 2 * kd + Hv * dv, S = K - 1;
    const bool qk = slot < 2 * Hk;
    const int dim = qk ? dk : dv;
    const int c0 = qk ? slot * dk : 2 * kd + (slot - 2 * Hk) * dv;
    size_t stride;
    float *out = hk_conv_qkv_out(q, k, v, slot, Hk, Hv, dk, dv, &stride);
    out += (size_t)t * stride;
    /* the token's sequence: its state, its rows, the token's place */
    const float *st = states ? states[t] : state;
    const float *xs = states ? x + (size_t)t * C : x;
    const int tl = states ? 0 : t;
    for (int i = threadIdx.x; i < dim; i += blockDim.x) {
        const int c = c0 + i;
        const float y = hk_math_silu(hk_conv_taps(
            st + (size_t)c * S, xs, w + (size_t)c * K, tl, c, C, K));
        if (qk)
            row[i] = y;
        else
            out[i] = y; /* v: no norm */
    }
    if (!qk) { /* the whole block leaves, after its head's gates */
        if (g && threadIdx.x == 0)
            hk_conv_gates(g, beta, A_log, dt_bias, t, slot - 2 * Hk, Hv);
        return;
    }
    const float scale = slot < Hk ? q_scale : 1.0f;
    if (dim <= HK_WROW_MAX) { /* hk_cuda_l2norm's warp reduction */
        __syncthreads();      /* the row, written by the whole block */
        if (threadIdx.x < 32) {
            hk_frag<HK_WROW_MAX / (HK_FRAG_VEC * 32)> f;
            hk_frag_load(f, row, dim, threadIdx.x, 32, false);
            hk_wrow_l2norm(f, eps, scale);
            hk_frag_store(out, f, dim, threadIdx.x, 32, false);
        }
        return;
    }
    /* each thread reads back the elements it wrote */
    const float ss = hk_row_sumsq(row, dim, sh);
    const float f = hk_l2_factor(ss, eps, scale);
    for (int i = threadIdx.x; i < dim; i += blockDim.x)
        out[i] = row[i] * f;
}

static int hk_conv_launch(float *y, float *state, float *const *states,
                          const float *x, const float *w, int B, int T, int C,
                          int K, void *stream)
{
    if (B < 0 || B > HK_CUDA_MAX_GRID_YZ || T < 0 || C <= 0 || K < 1)
        return HK_CUDA_EINVAL;
    if (K > 1 && !state && !states)
        return HK_CUDA_EINVAL;
    if (B == 0 || T == 0)
        return HK_CUDA_OK;
    const cudaStream_t s = hk_stream(stream);
    const long long rows = (long long)B * T;
    dim3 grid(HK_CEIL_DIV(C, HK_CONV_THREADS), rows < HK_CUDA_MAX_GRID_YZ
                                                   ? (unsigned)rows
                                                   : HK_CUDA_MAX_GRID_YZ);
    hk_conv_out_kernel<<<grid, HK_CONV_THREADS, 0, s>>>(y, state, states, x, w,
                                                        B, T, C, K);
    int rc = hk_cuda_check_launch();
    if (rc || K == 1)
        return rc;
    dim3 sgrid(HK_CEIL_DIV(C, HK_CONV_THREADS), B);
    hk_conv_state_kernel<<<sgrid, HK_CONV_THREADS, 0, s>>>(state, states, x, B,
                                                           T, C, K);
    return hk_cuda_check_launch();
}

extern "C" int hk_cuda_conv1d_silu(float *y, float *state, const float *x,
                                   const float *w, int T, int C, int K,
                                   void *stream)
{
    return hk_conv_launch(y, state, NULL, x, w, 1, T, C, K, stream);
}

/* hk_cuda_conv_qkv over T rows of one sequence (state), or, with states,
 * T rows each one token of its own sequence. */
static int hk_conv_qkv_launch(float *q, float *k, float *v, float *state,
                              float *const *states, const float *x,
                              const float *w, float *g, float *beta,
                              const float *A_log, const float *dt_bias, int T,
                              int Hk, int Hv, int dk, int dv, int K, float eps,
                              float q_scale, void *stream)
{
    if (T < 0 || Hk < 1 || Hv < 1 || dk < 1 || dv < 1 || K < 1 ||
        2 * Hk + Hv > HK_CUDA_MAX_GRID_YZ || (K > 1 && !state && !states) ||
        (states && T > HK_CUDA_MAX_GRID_YZ) ||
        (g && (!beta || !A_log || !dt_bias)))
        return HK_CUDA_EINVAL;
    if (T == 0)
        return HK_CUDA_OK;
    const cudaStream_t s = hk_stream(stream);
    const int dmax = dk > dv ? dk : dv, slots = 2 * Hk + Hv;
    const size_t smem = sizeof(float) * (size_t)dmax;
    if (smem > 48 * 1024)
        return HK_CUDA_EINVAL;
    if (dmax <= HK_WROW_MAX && K <= HK_CONV_KMAX) {
        const bool vec = dk % HK_FRAG_VEC == 0 && dv % HK_FRAG_VEC == 0 &&
                         hk_aligned(x, 16) && hk_aligned(q, 16) &&
                         hk_aligned(k, 16) && hk_aligned(v, 16);
        const int run = states ? 1 : HK_CONV_RUN, nc = hk_frag_chunks(dmax, 32);
        const dim3 grid(HK_CEIL_DIV(T, run * HK_CONV_WARPS), slots);
        auto kern = states ? (nc == 1 ? hk_conv_qkv_warp_kernel<1, true>
                                      : hk_conv_qkv_warp_kernel<2, true>)
                           : (nc == 1 ? hk_conv_qkv_warp_kernel<1, false>
                                      : hk_conv_qkv_warp_kernel<2, false>);
        kern<<<grid, HK_CONV_WARPS * 32, 0, s>>>(
            q, k, v, state, states, x, w, g, beta, A_log, dt_bias, T, Hk, Hv,
            dk, dv, K, eps, q_scale, vec);
    } else {
        hk_conv_qkv_kernel<<<dim3((unsigned)T, slots), HK_ROW_THREADS, smem,
                             s>>>(q, k, v, state, states, x, w, g, beta, A_log,
                                  dt_bias, Hk, Hv, dk, dv, K, eps, q_scale);
    }
    int rc = hk_cuda_check_launch();
    if (rc || K == 1)
        return rc;
    /* one sequence of T tokens, or T sequences of one */
    const int C = 2 * Hk * dk + Hv * dv, B = states ? T : 1;
    dim3 sgrid(HK_CEIL_DIV(C, HK_CONV_THREADS), B);
    hk_conv_state_kernel<<<sgrid, HK_CONV_THREADS, 0, s>>>(
        state, states, x, B, states ? 1 : T, C, K);
    return hk_cuda_check_launch();
}

extern "C" int hk_cuda_conv_qkv(float *q, float *k, float *v, float *state,
                                const float *x, const float *w, float *g,
                                float *beta, const float *A_log,
                                const float *dt_bias, int T, int Hk, int Hv,
                                int dk, int dv, int K, float eps, float q_scale,
                                void *stream)
{
    return hk_conv_qkv_launch(q, k, v, state, NULL, x, w, g, beta, A_log,
                              dt_bias, T, Hk, Hv, dk, dv, K, eps, q_scale,
                              stream);
}

extern "C" int hk_cuda_conv_qkv_decode(float *q, float *k, float *v,
                                       float *const *states, const float *x,
                                       const float *w, float *g, float *beta,
                                       const float *A_log, const float *dt_bias,
                                       int B, int Hk, int Hv, int dk, int dv,
                                       int K, float eps, float q_scale,
                                       void *stream)
{
    if (K > 1 && !states)
        return HK_CUDA_EINVAL;
    return hk_conv_qkv_launch(q, k, v, NULL, states, x, w, g, beta, A_log,
                              dt_bias, B, Hk, Hv, dk, dv, K, eps, q_scale,
                              stream);
}

extern "C" int hk_cuda_conv1d_silu_decode(float *y, float *const *states,
                                          const float *x, const float *w, int B,
                                          int C, int K, void *stream)
{
    return hk_conv_launch(y, NULL, states, x, w, B, 1, C, K, stream);
}
