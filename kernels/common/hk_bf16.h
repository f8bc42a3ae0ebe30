/*
 * hk_bf16.h - bf16 as bit patterns (uint16_t: the upper half of an f32),
 * for the CUDA kernels that take bf16 inputs and for their tests and
 * benches, which round on the host the same way.
 *
 * Rounding is to nearest even, as __float2bfloat16_rn; a NaN stays a quiet
 * NaN. Static inline behind HK_HOSTDEV (see hk_math.h).
 */
#ifndef HK_BF16_H
#define HK_BF16_H

#include <stdint.h>
#include <string.h>

#include "kernels/common/hk_math.h" /* HK_HOSTDEV */

static inline HK_HOSTDEV uint16_t hk_bf16_from_f32(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof(u));
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((u >> 16) | 0x0040u);
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    /* the device's own round to nearest even: the same bits in one
     * instruction where the integer form takes six */
    uint16_t h;
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
#else
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
#endif
}

static inline HK_HOSTDEV float hk_bf16_to_f32(uint16_t b)
{
    const uint32_t u = (uint32_t)b << 16;
    float f;
    memcpy(&f, &u, sizeof(f));
    return f;
}

/* x = hi + lo + r with |r| <= 2^-16 |x| (roughly): hi is x rounded to
 * bf16, lo the rounded remainder. Products with bf16 operands then keep
 * ~16 significant bits where one bf16 keeps 8 (the "bf16x2/x3" split). */
static inline HK_HOSTDEV void hk_bf16_split(float x, uint16_t *hi, uint16_t *lo)
{
    *hi = hk_bf16_from_f32(x);
    *lo = hk_bf16_from_f32(x - hk_bf16_to_f32(*hi));
}

#endif
