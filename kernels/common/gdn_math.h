/*
 * gdn_math.h - scalar math shared by the Gated DeltaNet kernels (CPU and a
 * future CUDA twin): decay factors from log-space differences.
 *
 * Every decay the chunk form needs is e^{x} with x = gamma_i - gamma_j <= 0
 * (never a ratio e^{gamma_i} / e^{gamma_j}, which overflows for strong
 * decay). Factors below e^{-69} (~1e-30) are returned as exactly 0: the terms
 * they scale are added to terms of the same kind with factor >= e^0 (the
 * diagonal of Gamma, the fresh writes), so they sit ~1e-23 below f32
 * rounding, while the denormals they would otherwise produce run ~100x
 * slower on x86 and cannot be flushed without touching global FP state.
 */
#ifndef HK_GDN_MATH_H
#define HK_GDN_MATH_H

#include <math.h>

#include "kernels/common/hk_math.h" /* HK_HOSTDEV */

/* log of the smallest decay factor kept; e^{-69} ~ 1.0e-30. */
#define HK_GDN_LOG_TINY (-69.0)
/* Transition entries below this magnitude are flushed to 0 (same scale). */
#define HK_GDN_TINY 1e-30f

/* e^{x} for a log-space difference x <= 0, flushed to 0 below e^{-69}. */
static inline HK_HOSTDEV float hk_gdn_decay(double x)
{
    return x < HK_GDN_LOG_TINY ? 0.0f : (float)exp(x);
}

/* The same exponentiated in single precision, for the KVBuffer's factors
 * (one per buffered entry, value head and token): rounding x to f32
 * perturbs the factor by |x| 6e-8 relative, i.e. by at most
 * max x e^{-x} 6e-8 = 2e-8 of the term's own scale, below f32 rounding,
 * and expf is several times cheaper than exp. */
static inline HK_HOSTDEV float hk_gdn_decayf(double x)
{
    return x < HK_GDN_LOG_TINY ? 0.0f : expf((float)x);
}

#endif
