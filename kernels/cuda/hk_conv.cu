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
 * launch: the conv of one head's channels (q, k or v) a block, SiLU, and
 * for q and k the L2 norm (hk_norm.cu's row reduction, HK_ROW_THREADS),
 * written split into q, k, v, and a v head's gates by its block: the four
 * kernels' results (conv, split, l2norm, gates) bit for bit, without the
 * conv output written and read back.
 */
#include "kernels/cuda/hk_cuda_impl.h"

#define HK_CONV_THREADS 128

/* Sequence b has tokens rows b*T .. b*T + T-1 of x and y; its state is
 * states[b] if states is non-NULL, else state (B = 1). */
static __device__ __forceinline__ const float *
hk_conv_state(const float *state, float *const *states, int b)
{
    return states ? states[b] : state;
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
    for (int j = 0; j < K; j++) {
        const int tau = t - S + j;
        const float in = tau < 0 ? st[S + tau] : xs[(size_t)tau * C + c];
        acc += wc[j] * in;
    }
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

/* Token blockIdx.x, head slot blockIdx.y: q heads 0..Hk-1, k heads, then
 * v heads; row: [max(dk, dv)] floats of dynamic shared memory. */
static __global__ void
hk_conv_qkv_kernel(float *q, float *k, float *v, const float *state,
                   const float *x, const float *w, float *g, float *beta,
                   const float *A_log, const float *dt_bias, int Hk, int Hv,
                   int dk, int dv, int K, float eps, float q_scale)
{
    __shared__ float sh[32];
    HK_DYNAMIC_SMEM(smem);
    float *row = (float *)smem;
    const int t = blockIdx.x, slot = blockIdx.y, kd = Hk * dk;
    const int C = 2 * kd + Hv * dv, S = K - 1;
    const bool qk = slot < 2 * Hk;
    const int dim = qk ? dk : dv;
    const int c0 = qk ? slot * dk : 2 * kd + (slot - 2 * Hk) * dv;
    float *out = slot < Hk ? q + ((size_t)t * Hk + slot) * dk
                 : qk      ? k + ((size_t)t * Hk + slot - Hk) * dk
                           : v + ((size_t)t * Hv + slot - 2 * Hk) * dv;
    for (int i = threadIdx.x; i < dim; i += blockDim.x) {
        const int c = c0 + i;
        const float y = hk_math_silu(hk_conv_taps(
            state + (size_t)c * S, x, w + (size_t)c * K, t, c, C, K));
        if (qk)
            row[i] = y;
        else
            out[i] = y; /* v: no norm */
    }
    if (!qk) { /* the whole block leaves, after its head's gates */
        const int h = slot - 2 * Hk;
        const size_t e = (size_t)t * Hv + h;
        if (g && threadIdx.x == 0) { /* hk_gdn_gates_kernel's, in place */
            beta[e] = hk_math_sigmoid(beta[e]);
            g[e] = hk_math_gdn_gate(g[e], A_log[h], dt_bias[h]);
        }
        return;
    }
    /* each thread reads back the elements it wrote */
    const float ss = hk_row_sumsq(row, dim, sh);
    const float f = hk_l2_factor(ss, eps, slot < Hk ? q_scale : 1.0f);
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

extern "C" int hk_cuda_conv_qkv(float *q, float *k, float *v, float *state,
                                const float *x, const float *w, float *g,
                                float *beta, const float *A_log,
                                const float *dt_bias, int T, int Hk, int Hv,
                                int dk, int dv, int K, float eps, float q_scale,
                                void *stream)
{
    if (T < 0 || Hk < 1 || Hv < 1 || dk < 1 || dv < 1 || K < 1 ||
        2 * Hk + Hv > HK_CUDA_MAX_GRID_YZ || (K > 1 && !state) ||
        (g && (!beta || !A_log || !dt_bias)))
        return HK_CUDA_EINVAL;
    if (T == 0)
        return HK_CUDA_OK;
    const cudaStream_t s = hk_stream(stream);
    const size_t smem = sizeof(float) * (size_t)(dk > dv ? dk : dv);
    if (smem > 48 * 1024)
        return HK_CUDA_EINVAL;
    hk_conv_qkv_kernel<<<dim3((unsigned)T, 2 * Hk + Hv), HK_ROW_THREADS, smem,
                         s>>>(q, k, v, state, x, w, g, beta, A_log, dt_bias, Hk,
                              Hv, dk, dv, K, eps, q_scale);
    int rc = hk_cuda_check_launch();
    if (rc || K == 1)
        return rc;
    const int C = 2 * Hk * dk + Hv * dv;
    dim3 sgrid(HK_CEIL_DIV(C, HK_CONV_THREADS), 1);
    hk_conv_state_kernel<<<sgrid, HK_CONV_THREADS, 0, s>>>(state, NULL, x, 1, T,
                                                           C, K);
    return hk_cuda_check_launch();
}

extern "C" int hk_cuda_conv1d_silu_decode(float *y, float *const *states,
                                          const float *x, const float *w, int B,
                                          int C, int K, void *stream)
{
    return hk_conv_launch(y, NULL, states, x, w, B, 1, C, K, stream);
}
