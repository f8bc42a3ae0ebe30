/*
 * hk_conv.c - causal depthwise conv1d + SiLU with a carried state (the GDN
 * short convolution over the q/k/v channels).
 *
 *   y[t, c] = silu( sum_{j=0}^{K-1} w[c, j] * in[t - (K-1) + j, c] )
 *   in[tau] = x[tau, c] for tau >= 0, state[c, K-1 + tau] for tau < 0
 *
 * Layouts: x, y [T, C] row-major; w [C, K] (the checkpoint's [C, 1, K]),
 * w[c, K-1] multiplies the current token; state [C, K-1], oldest first,
 * zeros at sequence start. On return state holds the last K-1 raw inputs of
 * (state ++ x), so a sequence split into calls gives the same y as one call.
 * Reference: HF Qwen3NextGatedDeltaNet (causal_conv1d_fn / torch_causal_
 * conv1d_update: F.conv1d with K-1 left padding, truncated to T, then SiLU;
 * the decode window keeps the last K columns). Spec §3.2 and §8.10.
 *
 * Threads: OpenMP over channel blocks; every output is one fixed-order sum.
 */
#include <assert.h>
#include <string.h>

#include "kernels/cpu/hk_cpu.h"

/* Channels per OpenMP work item: keeps rows of x in cache lines per thread. */
#define HK_CONV_CBLK 256
/* Below this many multiply-adds the fork costs more than the work. */
#define HK_CONV_PAR_MIN 65536

void hk_conv1d_silu(float *restrict y,       // [T, C]
                    float *restrict state,   // [C, K-1], in/out
                    const float *restrict x, // [T, C]
                    const float *restrict w, // [C, K]
                    int T, int C, int K)
{
    assert(T >= 0 && C > 0 && K >= 1);
    const int S = K - 1;
    const int nblk = (C + HK_CONV_CBLK - 1) / HK_CONV_CBLK;

#pragma omp parallel for schedule(                                             \
    static) if ((size_t)T * (size_t)C * (size_t)K >= HK_CONV_PAR_MIN)
    for (int b = 0; b < nblk; b++) {
        const int c0 = b * HK_CONV_CBLK;
        const int c1 = c0 + HK_CONV_CBLK < C ? c0 + HK_CONV_CBLK : C;

        /* Tokens whose window reaches into the state. */
        const int th = T < S ? T : S;
        for (int t = 0; t < th; t++)
            for (int c = c0; c < c1; c++) {
                float acc = 0.0f;
                for (int j = 0; j < K; j++) {
                    int tau = t - S + j;
                    float in = tau < 0 ? state[(size_t)c * S + S + tau]
                                       : x[(size_t)tau * C + c];
                    acc += w[(size_t)c * K + j] * in;
                }
                y[(size_t)t * C + c] = hk_silu(acc);
            }

        /* Interior: all K inputs come from x; vectorizes over channels. */
        for (int t = th; t < T; t++) {
            const float *xt = x + (size_t)(t - S) * C;
            float *yt = y + (size_t)t * C;
            /* Taps outer, channels inner (vectorized), the same sum order
             * per channel as above; silu in its own pass because libm's
             * expf stops the vectorizer. */
            for (int c = c0; c < c1; c++)
                yt[c] = 0.0f;
            for (int j = 0; j < K; j++) {
                const float *xj = xt + (size_t)j * C;
#pragma omp simd
                for (int c = c0; c < c1; c++)
                    yt[c] += w[(size_t)c * K + j] * xj[c];
            }
            for (int c = c0; c < c1; c++)
                yt[c] = hk_silu(yt[c]);
        }

        /* New state: the last S raw inputs of (state ++ x), oldest first. */
        for (int c = c0; c < c1; c++) {
            float *st = state + (size_t)c * S;
            for (int i = 0; i < S; i++) {
                int tau = T - S + i; /* index into x; < 0 means old state */
                st[i] = tau < 0 ? st[i + T] : x[(size_t)tau * C + c];
            }
        }
    }
}
