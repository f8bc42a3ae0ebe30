/*
 * hk_wkern.c - the plain C weight kernels (any CPU: the reference the
 * AVX ones are tested against, hk_wkern_x86.c), the f32 tile conversion
 * of every format, and the choice of ISA.
 */
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/hk_wkern.h"

/* ---- plain C dot kernels ------------------------------------------------ */

void hk_wdot_bf16_generic(float *y, int ldy, const float *x, int ldx, int n,
                          const hk_weight_t *w, int o0, int oc, float beta)
{
    const int K = w->cols;
    for (int o = o0; o < o0 + oc; o++) {
        const uint16_t *wr = (const uint16_t *)w->data + (size_t)o * K;
        for (int r = 0; r < n; r++) {
            const float *xr = x + (size_t)r * ldx;
            float s = 0.0f;
            for (int k = 0; k < K; k++)
                s += xr[k] * hk_bf16_to_f32(wr[k]);
            float *yo = y + (size_t)r * ldy + o;
            *yo = beta != 0.0f ? *yo + s : s;
        }
    }
}

void hk_wdot_i8_generic(float *y, int ldy, const float *x, int ldx, int n,
                        const hk_weight_t *w, int o0, int oc, float beta)
{
    const int K = w->cols, G = w->group, ng = K / G;
    for (int o = o0; o < o0 + oc; o++) {
        const int8_t *wr = (const int8_t *)w->data + (size_t)o * K;
        const float *sc = w->scales + (size_t)o * ng;
        for (int r = 0; r < n; r++) {
            const float *xr = x + (size_t)r * ldx;
            float s = 0.0f;
            /* W dequantized as hk_wtile does: the tile path's products */
            for (int k = 0; k < K; k++)
                s += xr[k] * ((float)wr[k] * sc[k / G]);
            float *yo = y + (size_t)r * ldy + o;
            *yo = beta != 0.0f ? *yo + s : s;
        }
    }
}

/* ---- tiles -------------------------------------------------------------- */

void hk_wtile(float *dst, int ldd, const hk_weight_t *w, int o0, int oc, int k0,
              int kc)
{
    const int K = w->cols;
    for (int i = 0; i < oc; i++) {
        const size_t row = (size_t)(o0 + i) * K;
        float *d = dst + (size_t)i * ldd;
        if (w->dtype == HK_W_F32) {
            memcpy(d, (const float *)w->data + row + k0,
                   (size_t)kc * sizeof(float));
        } else if (w->dtype == HK_W_BF16) {
            const uint16_t *s = (const uint16_t *)w->data + row + k0;
#pragma omp simd
            for (int j = 0; j < kc; j++)
                d[j] = hk_bf16_to_f32(s[j]);
        } else {
            const int8_t *s = (const int8_t *)w->data + row;
            const int G = w->group;
            const float *sc = w->scales + (size_t)(o0 + i) * (K / G);
            /* by runs of one scale: no division per element */
            for (int j = k0; j < k0 + kc;) {
                const int e =
                    (j / G + 1) * G < k0 + kc ? (j / G + 1) * G : k0 + kc;
                const float f = sc[j / G];
#pragma omp simd
                for (int q = j; q < e; q++)
                    d[q - k0] = (float)s[q] * f;
                j = e;
            }
        }
    }
}

void hk_weight_rows(float *dst, const hk_weight_t *w, const int *ids, int n)
{
    for (int i = 0; i < n; i++)
        hk_wtile(dst + (size_t)i * w->cols, w->cols, w, ids[i], 1, 0, w->cols);
}

/* ---- ISA choice --------------------------------------------------------- */

/* The cap: -1 until the first use reads HK_ISA. */
static int isa_cap = -1;

const char *hk_isa_name(hk_isa_t isa)
{
    static const char *const names[] = {"generic", "avx2", "avx512"};
    return isa >= HK_ISA_GENERIC && isa <= HK_ISA_AVX512 ? names[isa] : "?";
}

void hk_cpu_set_isa(hk_isa_t max)
{
    __atomic_store_n(&isa_cap, (int)max, __ATOMIC_RELAXED);
}

static int env_cap(void)
{
    const char *e = getenv("HK_ISA");
    for (int i = HK_ISA_GENERIC; e && i <= HK_ISA_AVX512; i++)
        if (strcmp(e, hk_isa_name((hk_isa_t)i)) == 0)
            return i;
    return HK_ISA_AVX512;
}

/* What the CPU runs for a dtype's kernels, uncapped. */
static hk_isa_t cpu_best(int dtype)
{
#if defined(__x86_64__) && defined(__GNUC__)
    __builtin_cpu_init();
    const int has512 = __builtin_cpu_supports("avx512f") &&
                       __builtin_cpu_supports("avx512bw") &&
                       __builtin_cpu_supports("avx512vl") &&
                       __builtin_cpu_supports("avx512dq");
    if (has512 && hk_wdot_bf16_avx512 &&
        (dtype == HK_W_BF16 || dtype == HK_W_F32))
        return HK_ISA_AVX512;
    if (has512 && hk_wdot_i8_avx512 && dtype == HK_W_I8 &&
        __builtin_cpu_supports("avx512vnni"))
        return HK_ISA_AVX512;
    if (hk_wdot_bf16_avx2 && __builtin_cpu_supports("avx2") &&
        __builtin_cpu_supports("fma"))
        return HK_ISA_AVX2;
#endif
    (void)dtype;
    return HK_ISA_GENERIC;
}

hk_isa_t hk_cpu_isa(int dtype)
{
    int cap = __atomic_load_n(&isa_cap, __ATOMIC_RELAXED);
    if (cap < 0) {
        cap = env_cap();
        __atomic_store_n(&isa_cap, cap, __ATOMIC_RELAXED);
    }
    hk_isa_t best = cpu_best(dtype);
    return (int)best < cap ? best : (hk_isa_t)cap;
}
