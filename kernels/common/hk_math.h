/*
 * hk_math.h - scalar math written once for the CPU kernels and their CUDA
 * twins (DESIGN §9): the activations and the RoPE angle.
 *
 * Every function is static inline behind HK_HOSTDEV, which is
 * __host__ __device__ under nvcc and empty for gcc, so a .c file and a .cu
 * file that include this header evaluate the same expression (float
 * expf/log1pf on both sides; CUDA's are within 2 ulp of correctly rounded
 * without -use_fast_math, which our nvcc line does not pass).
 *
 * Names carry a hk_math_ prefix: hk_cpu.h still defines its own hk_silu,
 * hk_sigmoid and hk_softplus with the same bodies, and a C file includes
 * both headers.
 */
#ifndef HK_MATH_H
#define HK_MATH_H

#include <math.h>

#ifndef HK_HOSTDEV
#ifdef __CUDACC__
#define HK_HOSTDEV __host__ __device__
#else
#define HK_HOSTDEV
#endif
#endif

/* PyTorch's default softplus threshold: above it softplus(x) = x to float
 * precision (log1p(e^-20) ~ 2e-9 < ulp(20)/2), and e^x would overflow
 * soon after. */
#define HK_MATH_SOFTPLUS_THRESHOLD 20.0f

static inline HK_HOSTDEV float hk_math_sigmoid(float x)
{
    return 1.0f / (1.0f + expf(-x));
}

static inline HK_HOSTDEV float hk_math_silu(float x)
{
    return x / (1.0f + expf(-x));
}

/* silu for the device's elementwise SwiGLU, which streams 2 x 201M bf16
 * at a 9B model's 16k prefill and ran at 37 % of copy on an H200 with the
 * IEEE division's ~8 instructions an element: __fdividef (reciprocal
 * and product, 2 ulp; 0 where 1 + e^-x passes 2^126, i.e. x < -87, where
 * silu is ~1e-36) instead. The CPU and the emulator divide exactly. */
static inline HK_HOSTDEV float hk_math_silu_fast(float x)
{
#if defined(__CUDA_ARCH__)
    return __fdividef(x, 1.0f + expf(-x));
#else
    return x / (1.0f + expf(-x));
#endif
}

/* log(1 + e^x), returning x itself above the threshold (torch semantics). */
static inline HK_HOSTDEV float hk_math_softplus(float x)
{
    return x > HK_MATH_SOFTPLUS_THRESHOLD ? x : log1pf(expf(x));
}

/* The GDN decay gate in log space (HF Qwen3NextGatedDeltaNet):
 * g = -exp(A_log) * softplus(a + dt_bias) <= 0. */
static inline HK_HOSTDEV float hk_math_gdn_gate(float a, float A_log,
                                                float dt_bias)
{
    return -expf(A_log) * hk_math_softplus(a + dt_bias);
}

/* RoPE angle of pair i < rot/2 at position p: p * theta^(-2i/rot), in
 * double. A float angle would carry up to ulp(p)/2 rad of error (2.4e-4 rad
 * at p = 8192), which breaks R(b - a) R(a) = R(b) that the PIC splice
 * relies on (hk_rope.c). Callers round only cos/sin to float. */
static inline HK_HOSTDEV double hk_math_rope_angle(double p, int i, int rot,
                                                   double theta)
{
    return p * pow(theta, -2.0 * i / rot);
}

#endif
