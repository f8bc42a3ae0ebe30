/*
 * emu/cuda_bf16.h - the bf16 type of the host emulator (cuda_runtime.h
 * here): a 16-bit pattern, the upper half of an f32, with CUDA's
 * conversions (round to nearest even).
 */
#ifndef HK_EMU_CUDA_BF16_H
#define HK_EMU_CUDA_BF16_H

#include "kernels/common/hk_bf16.h"

struct __nv_bfloat16 {
    unsigned short __x;
};

static inline __nv_bfloat16 __float2bfloat16(float f)
{
    return __nv_bfloat16{hk_bf16_from_f32(f)};
}

static inline __nv_bfloat16 __float2bfloat16_rn(float f)
{
    return __float2bfloat16(f);
}

static inline float __bfloat162float(__nv_bfloat16 b)
{
    return hk_bf16_to_f32(b.__x);
}

#endif
