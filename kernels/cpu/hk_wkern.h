/*
 * hk_wkern.h - the per-ISA weight kernels behind hk_linear (hk_matmul.c).
 * Internal to kernels/cpu.
 *
 * A dot kernel computes, for rows r < n of x and outputs o in
 * [o0, o0 + oc) of W,
 *   y[r * ldy + o] = (beta ? y[r * ldy + o] : 0) + x[r * ldx + :] . W[o, :]
 * streaming each W row once for all n rows (n small: decode and small
 * batches). beta is 0 or 1; with 0, y is only written.
 */
#ifndef HK_WKERN_H
#define HK_WKERN_H

#include <stdint.h>

#include "kernels/cpu/hk_cpu.h"

typedef void hk_wdot_fn(float *y, int ldy, const float *x, int ldx, int n,
                        const hk_weight_t *w, int o0, int oc, float beta);

/* Plain C (hk_wkern.c). */
hk_wdot_fn hk_wdot_bf16_generic, hk_wdot_i8_generic;
/* AVX2 + FMA and AVX-512 (hk_wkern_x86.c); NULL where not compiled. */
extern hk_wdot_fn *const hk_wdot_bf16_avx2, *const hk_wdot_i8_avx2;
extern hk_wdot_fn *const hk_wdot_bf16_avx512, *const hk_wdot_i8_avx512;
/* F32 on AVX-512 (others: OpenBLAS). */
extern hk_wdot_fn *const hk_wdot_f32_avx512;

/* The VNNI kernel quantizes x on its stack: at most this many columns
 * (longer rows take the AVX2 kernel). */
#define HK_I8_VNNI_MAXK 16384

/* dst[i * ldd + j] = W[o0 + i, k0 + j] as f32, i < oc, j < kc. */
void hk_wtile(float *dst, int ldd, const hk_weight_t *w, int o0, int oc, int k0,
              int kc);

static inline float hk_bf16_to_f32(uint16_t h)
{
    union {
        uint32_t u;
        float f;
    } v = {(uint32_t)h << 16};
    return v.f;
}

#endif
