/*
 * hk_rope.cu - CUDA twin of hk_rope.c: partial rotary position embedding,
 * rotate-half (NeoX) pairing, and the re-rotation of cached keys.
 *
 * For each head vector x[hd] of a token at position p, pairs (i, i + rot/2),
 * i < rot/2:  phi_i = p * theta^(-2i/rot)  (hk_math_rope_angle, double)
 *   x'[i]         = x[i] cos phi_i - x[i + rot/2] sin phi_i
 *   x'[i + rot/2] = x[i + rot/2] cos phi_i + x[i] sin phi_i
 * dims rot..hd-1 pass through. Layout: x [T, nh, hd], pos [T] (device).
 * The shift uses p = delta for every token: K_b = R(b - a) K_a.
 *
 * Each block builds the cos/sin table of its token in shared memory (angle,
 * cos and sin in double, rounded once to float, as the CPU), then rotates
 * every head of the token. For the shift the table is the same for all
 * tokens, so a block builds it once and walks many tokens.
 */
#include "kernels/cuda/hk_cuda_impl.h"

#define HK_ROPE_THREADS 128
/* Blocks for the shift (one table each); tokens are strided over them. */
#define HK_ROPE_SHIFT_BLOCKS 1024

static __global__ void hk_rope_kernel(float *x,       // [T, nh, hd]
                                      const int *pos, // [T] or NULL
                                      int delta,      // p when pos NULL
                                      int T, int nh, int hd, int rot,
                                      double theta)
{
    __shared__ float cs[HK_ROPE_MAX_ROT / 2], sn[HK_ROPE_MAX_ROT / 2];
    const int h2 = rot / 2;
    for (int t = blockIdx.x; t < T; t += gridDim.x) {
        if (pos || t == (int)blockIdx.x) {
            const double p = pos ? (double)pos[t] : (double)delta;
            __syncthreads(); /* the previous token is done with the table */
            hk_rope_table(cs, sn, p, h2, rot, theta);
            __syncthreads();
        }
        float *xt = x + (size_t)t * nh * hd;
        for (int e = threadIdx.x; e < nh * h2; e += blockDim.x) {
            const int h = e / h2, i = e % h2;
            hk_rope_pair(xt + (size_t)h * hd + i, h2, cs[i], sn[i]);
        }
    }
}

static int hk_rope_launch(float *x, const int *pos, int delta, int T, int nh,
                          int hd, int rot, double theta, void *stream)
{
    if (T < 0 || nh < 0 || rot < 0 || rot % 2 || rot > hd ||
        rot > HK_ROPE_MAX_ROT || !(theta > 0.0))
        return HK_CUDA_EINVAL;
    if (T == 0 || nh == 0 || rot == 0 || (!pos && delta == 0))
        return HK_CUDA_OK;
    const int blocks =
        pos ? T : (T < HK_ROPE_SHIFT_BLOCKS ? T : HK_ROPE_SHIFT_BLOCKS);
    hk_rope_kernel<<<blocks, HK_ROPE_THREADS, 0, hk_stream(stream)>>>(
        x, pos, delta, T, nh, hd, rot, theta);
    return hk_cuda_check_launch();
}

extern "C" int hk_cuda_rope(float *x, const int *pos, int T, int nh, int hd,
                            int rot, double theta, void *stream)
{
    if (!pos && T > 0)
        return HK_CUDA_EINVAL;
    return hk_rope_launch(x, pos, 0, T, nh, hd, rot, theta, stream);
}

extern "C" int hk_cuda_rope_shift(float *x, int delta, int T, int nh, int hd,
                                  int rot, double theta, void *stream)
{
    return hk_rope_launch(x, NULL, delta, T, nh, hd, rot, theta, stream);
}
