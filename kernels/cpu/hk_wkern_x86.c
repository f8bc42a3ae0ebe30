/*
 * hk_wkern_x86.c - the AVX2 and AVX-512 weight dot kernels (hk_wkern.h).
 *
 * Every function carries its ISA as a target attribute, so the file builds
 * under any -march (make ARCH_FLAGS=-march=x86-64-v3 included) and
 * hk_cpu_isa() runs only what the CPU has.
 *
 * Blocks of R <= 4 rows of x by C outputs keep R*C accumulators in
 * registers (C = 4, or 2 for R > 2 where 4 would spill), stream C rows of
 * W once for the R rows, and reduce each accumulator once at the end.
 *  - F32, AVX-512: W as stored, FMA with x (sgemv's arithmetic with
 *    the prefetch below; without AVX-512, F32 decode stays on OpenBLAS).
 *  - BF16, AVX-512: a 64-byte load of W is 16 pairs of bf16; shifted
 *    up and masked they are two vectors of exact f32 (the even and the
 *    odd elements), multiplied with x dealt into its even and odd
 *    elements once per pass. The products are f32's. (AVX-512 BF16's
 *    vdpbf16ps needs x in bf16 too: x in one bf16 moves the test models'
 *    logits by up to 7e-2 of the largest, in two parts by 1.4e-4 between
 *    batched and single decoding, and three parts, f32-exact, take 1.8x
 *    the instructions of this kernel per byte of W; measured on the
 *    Sapphire Rapids this was written on.)
 *  - BF16, AVX2: W widened to f32 (a shift), FMA with x.
 *  - I8, AVX-512 VNNI (rows up to HK_I8_VNNI_MAXK columns in at most
 *    HK_I8_VNNI_MAXG groups; others take the AVX2 kernel): x quantized
 *    per row and group (the weight's group) to int8 with scale
 *    max|x|/127; vpdpbusd sums u8*s8 products exactly in int32, W read
 *    as u8 (+128) and x as s8, the +128's share taken off by starting
 *    each group's sums at -128 x (per row, once). Per group: int32 ->
 *    f32 times the two scales.
 *  - I8, AVX2: W dequantized to f32 (q * scale, as hk_wtile does), FMA
 *    with x: the exact f32 product, x unquantized.
 *
 * Every loop over R and C is unrolled by pragma: GCC otherwise keeps the
 * accumulator arrays in memory, a load and a store around every FMA or
 * vpdpbusd (measured: 25 % more CPU time per I8 byte, 5-10 % for BF16).
 */
#include "kernels/cpu/hk_wkern.h"

#if defined(__x86_64__) && defined(__GNUC__)

#include <immintrin.h>

#define T_AVX2   __attribute__((target("avx2,fma")))
#define T_AVX512 "avx512f,avx512bw,avx512vl,avx512dq"
#define T_512    __attribute__((target(T_AVX512)))
#define T_VNNI   __attribute__((target(T_AVX512 ",avx512vnni")))
/* The weight kernels prefetch the W rows HK_PF blocks ahead (a block: C
 * rows, the next ones in memory) into L2: a decode step streams every
 * weight once from DRAM, and rows of 1-4 KB are too short for the
 * hardware prefetcher to ramp up on. Measured at one thread on the LM
 * head's shape (bench/linear_bench, CPU time): 15-20 % less per byte for
 * BF16 and I8 than none; into L2 5-8 % less than into L1; 1, 2 and 4
 * blocks ahead within 2 %. */
#define HK_PF      2
#define HK_PF_HINT _MM_HINT_T1
#define HK_INLINE  static inline __attribute__((always_inline))

/* Walks rows [0, n) by 4 (the row group: PREP(r, R) first) and outputs
 * [o0, o0 + oc) by C, calling BLK(r, o, R, C) with constant R and C; a
 * single row takes 8 outputs at a time where WIDE (its accumulators fit
 * the registers), sharing each x load and group step among more. */
#define HK_WALK(n, o0, oc, WIDE, PREP, BLK)                                    \
    for (int r_ = 0; r_ < (n); r_ += 4) {                                      \
        const int R_ = (n)-r_ < 4 ? (n)-r_ : 4;                                \
        PREP(r_, R_);                                                          \
        for (int o_ = (o0), c_; o_ < (o0) + (oc); o_ += c_) {                  \
            const int left_ = (o0) + (oc)-o_;                                  \
            c_ = WIDE && R_ == 1 && left_ >= 8 ? 8 : left_ >= 4 ? 4 : 1;       \
            switch (R_ * 16 + c_) {                                            \
            case 1 * 16 + 8:                                                   \
                BLK(r_, o_, 1, 8);                                             \
                break;                                                         \
            case 1 * 16 + 4:                                                   \
                BLK(r_, o_, 1, 4);                                             \
                break;                                                         \
            case 2 * 16 + 4:                                                   \
                BLK(r_, o_, 2, 4);                                             \
                break;                                                         \
            case 3 * 16 + 4:                                                   \
                BLK(r_, o_, 3, 2);                                             \
                BLK(r_, o_ + 2, 3, 2);                                         \
                break;                                                         \
            case 4 * 16 + 4:                                                   \
                BLK(r_, o_, 4, 2);                                             \
                BLK(r_, o_ + 2, 4, 2);                                         \
                break;                                                         \
            case 1 * 16 + 1:                                                   \
                BLK(r_, o_, 1, 1);                                             \
                break;                                                         \
            case 2 * 16 + 1:                                                   \
                BLK(r_, o_, 2, 1);                                             \
                break;                                                         \
            case 3 * 16 + 1:                                                   \
                BLK(r_, o_, 3, 1);                                             \
                break;                                                         \
            default:                                                           \
                BLK(r_, o_, 4, 1);                                             \
                break;                                                         \
            }                                                                  \
        }                                                                      \
    }
#define HK_NO_PREP(r, R) (void)0

HK_INLINE void store(float *y, float s, float beta)
{
    *y = beta != 0.0f ? *y + s : s;
}

/* ---- AVX2 + FMA --------------------------------------------------------- */

HK_INLINE T_AVX2 float hsum256(__m256 v)
{
    __m128 s =
        _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

HK_INLINE T_AVX2 void bf16_blk_avx2(float *y, int ldy, const float *x, int ldx,
                                    const uint16_t *w, int K, float beta,
                                    const int R, const int C)
{
    __m256 acc[4][8];
#pragma GCC unroll 8
    for (int r = 0; r < R; r++)
#pragma GCC unroll 8
        for (int c = 0; c < C; c++)
            acc[r][c] = _mm256_setzero_ps();
    int k = 0;
    for (; k + 8 <= K; k += 8) {
        __m256 xv[4];
#pragma GCC unroll 8
        for (int r = 0; r < R; r++)
            xv[r] = _mm256_loadu_ps(x + (size_t)r * ldx + k);
#pragma GCC unroll 8
        for (int c = 0; c < C; c++) {
            if ((k & 31) == 0) /* once per 64 bytes */
                _mm_prefetch(
                    (const char *)(w + (size_t)(c + HK_PF * C) * K + k),
                    HK_PF_HINT);
            const __m128i h =
                _mm_loadu_si128((const __m128i *)(w + (size_t)c * K + k));
            const __m256 wv = _mm256_castsi256_ps(
                _mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
#pragma GCC unroll 8
            for (int r = 0; r < R; r++)
                acc[r][c] = _mm256_fmadd_ps(xv[r], wv, acc[r][c]);
        }
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; r++)
#pragma GCC unroll 8
        for (int c = 0; c < C; c++) {
            float s = hsum256(acc[r][c]);
            for (int j = k; j < K; j++)
                s += x[(size_t)r * ldx + j] *
                     hk_bf16_to_f32(w[(size_t)c * K + j]);
            store(y + (size_t)r * ldy + c, s, beta);
        }
}

static T_AVX2 void bf16_avx2(float *y, int ldy, const float *x, int ldx, int n,
                             const hk_weight_t *w, int o0, int oc, float beta)
{
    const int K = w->cols;
    const uint16_t *W = w->data;
#define BLK(r, o, R, C)                                                        \
    bf16_blk_avx2(y + (size_t)(r)*ldy + (o), ldy, x + (size_t)(r)*ldx, ldx,    \
                  W + (size_t)(o)*K, K, beta, R, C)
    HK_WALK(n, o0, oc, 1, HK_NO_PREP, BLK)
#undef BLK
}

HK_INLINE T_AVX2 void i8_blk_avx2(float *y, int ldy, const float *x, int ldx,
                                  const int8_t *w, const float *ws, int K,
                                  int G, float beta, const int R, const int C)
{
    const int ng = K / G, g8 = G / 8 * 8;
    __m256 acc[4][8];
    float tail[4][8] = {{0}};
#pragma GCC unroll 8
    for (int r = 0; r < R; r++)
#pragma GCC unroll 8
        for (int c = 0; c < C; c++)
            acc[r][c] = _mm256_setzero_ps();
    for (int g = 0; g < ng; g++) {
        __m256 sv[8];
#pragma GCC unroll 8
        for (int c = 0; c < C; c++)
            sv[c] = _mm256_set1_ps(ws[(size_t)c * ng + g]);
        const size_t k0 = (size_t)g * G;
        for (int kk = 0; kk < g8; kk += 8) {
            __m256 xv[4];
#pragma GCC unroll 8
            for (int r = 0; r < R; r++)
                xv[r] = _mm256_loadu_ps(x + (size_t)r * ldx + k0 + kk);
#pragma GCC unroll 8
            for (int c = 0; c < C; c++) {
                if (((k0 + kk) & 63) == 0) /* once per 64 bytes */
                    _mm_prefetch((const char *)(w +
                                                (size_t)(c + HK_PF * C) * K +
                                                k0 + kk),
                                 HK_PF_HINT);
                const __m128i q = _mm_loadl_epi64(
                    (const __m128i *)(w + (size_t)c * K + k0 + kk));
                const __m256 wv = _mm256_mul_ps(
                    _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q)), sv[c]);
#pragma GCC unroll 8
                for (int r = 0; r < R; r++)
                    acc[r][c] = _mm256_fmadd_ps(xv[r], wv, acc[r][c]);
            }
        }
        for (int kk = g8; kk < G; kk++)
#pragma GCC unroll 8
            for (int c = 0; c < C; c++) {
                const float wf =
                    (float)w[(size_t)c * K + k0 + kk] * ws[(size_t)c * ng + g];
#pragma GCC unroll 8
                for (int r = 0; r < R; r++)
                    tail[r][c] += x[(size_t)r * ldx + k0 + kk] * wf;
            }
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; r++)
#pragma GCC unroll 8
        for (int c = 0; c < C; c++)
            store(y + (size_t)r * ldy + c, hsum256(acc[r][c]) + tail[r][c],
                  beta);
}

static T_AVX2 void i8_avx2(float *y, int ldy, const float *x, int ldx, int n,
                           const hk_weight_t *w, int o0, int oc, float beta)
{
    const int K = w->cols, G = w->group, ng = K / G;
    const int8_t *W = w->data;
#define BLK(r, o, R, C)                                                        \
    i8_blk_avx2(y + (size_t)(r)*ldy + (o), ldy, x + (size_t)(r)*ldx, ldx,      \
                W + (size_t)(o)*K, w->scales + (size_t)(o)*ng, K, G, beta, R,  \
                C)
    HK_WALK(n, o0, oc, 0 /* 8 scales + 8 sums spill 16 ymm */, HK_NO_PREP, BLK)
#undef BLK
}

/* ---- AVX-512 (F32 weights) -------------------------------------------- */

/* y[r, c] (=|+=) the sum of acc[r][c]'s lanes: every AVX-512 block's end. */
HK_INLINE T_512 void store_512(float *y, int ldy, __m512 acc[4][8], float beta,
                               const int R, const int C)
{
#pragma GCC unroll 8
    for (int r = 0; r < R; r++)
#pragma GCC unroll 8
        for (int c = 0; c < C; c++)
            store(y + (size_t)r * ldy + c, _mm512_reduce_add_ps(acc[r][c]),
                  beta);
}

/* y[r, c] (=|+=) x[r, :] . w[c, :], w rows K apart: OpenBLAS's sgemv
 * with the prefetch of the rows ahead (the weights stream from DRAM). */
HK_INLINE T_512 void f32_blk_512(float *y, int ldy, const float *x, int ldx,
                                 const float *w, int K, float beta, const int R,
                                 const int C)
{
    __m512 acc[4][8];
#pragma GCC unroll 8
    for (int r = 0; r < R; r++)
#pragma GCC unroll 8
        for (int c = 0; c < C; c++)
            acc[r][c] = _mm512_setzero_ps();
    for (int k = 0; k < K; k += 16) {
        const __mmask16 m =
            K - k >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (K - k)) - 1u);
        __m512 xv[4];
#pragma GCC unroll 8
        for (int r = 0; r < R; r++)
            xv[r] = _mm512_maskz_loadu_ps(m, x + (size_t)r * ldx + k);
#pragma GCC unroll 8
        for (int c = 0; c < C; c++) {
            _mm_prefetch((const char *)(w + (size_t)(c + HK_PF * C) * K + k),
                         HK_PF_HINT);
            const __m512 wv = _mm512_maskz_loadu_ps(m, w + (size_t)c * K + k);
#pragma GCC unroll 8
            for (int r = 0; r < R; r++)
                acc[r][c] = _mm512_fmadd_ps(xv[r], wv, acc[r][c]);
        }
    }
    store_512(y, ldy, acc, beta, R, C);
}

static T_512 void f32_512(float *y, int ldy, const float *x, int ldx, int n,
                          const hk_weight_t *w, int o0, int oc, float beta)
{
    const int K = w->cols;
    const float *W = w->data;
#define BLK(r, o, R, C)                                                        \
    f32_blk_512(y + (size_t)(r)*ldy + (o), ldy, x + (size_t)(r)*ldx, ldx,      \
                W + (size_t)(o)*K, K, beta, R, C)
    HK_WALK(n, o0, oc, 1, HK_NO_PREP, BLK)
#undef BLK
}

/* ---- AVX-512 (BF16 weights) ------------------------------------------- */

/* Columns of x per pass (the deinterleaved rows live on the stack: 4 rows
 * x HK_BF16_KCH floats = 32 KiB). */
#define HK_BF16_KCH 2048

/* x[0, kc) deinterleaved by pairs, the order of a 64-byte load of bf16
 * read as 16 dwords: xe[16 j + i] = x[32 j + 2 i] (the low halves),
 * xe[HK_BF16_KCH / 2 + 16 j + i] = x[32 j + 2 i + 1]; zero past kc, to the
 * next 32. */
static T_512 void bf16_deal_row(float *xe, const float *x, int kc)
{
    const __m512i ev = _mm512_set_epi32(30, 28, 26, 24, 22, 20, 18, 16, 14, 12,
                                        10, 8, 6, 4, 2, 0);
    const __m512i od = _mm512_add_epi32(ev, _mm512_set1_epi32(1));
    for (int k = 0; k < kc; k += 32) {
        const int rem = kc - k;
        const __mmask32 m = rem >= 32 ? 0xffffffffu : (1u << rem) - 1u;
        const __m512 x0 = _mm512_maskz_loadu_ps((__mmask16)m, x + k);
        const __m512 x1 =
            _mm512_maskz_loadu_ps((__mmask16)(m >> 16), x + k + 16);
        _mm512_store_ps(xe + k / 2, _mm512_permutex2var_ps(x0, ev, x1));
        _mm512_store_ps(xe + HK_BF16_KCH / 2 + k / 2,
                        _mm512_permutex2var_ps(x0, od, x1));
    }
}

/* y[r, c] (=|+=) x[r, 0:kc] . w[c, 0:kc]; xe: per row the dealt x, w rows
 * K apart. A 64-byte load of w holds 16 pairs: the low bf16 of each
 * shifted up and the high one masked are both exact f32. */
HK_INLINE T_512 void bf16_blk_512(float *y, int ldy, const float *xe,
                                  const uint16_t *w, int K, int kc, float beta,
                                  const int R, const int C)
{
    const __m512i hi = _mm512_set1_epi32((int)0xffff0000u);
    __m512 acc[4][8];
#pragma GCC unroll 8
    for (int r = 0; r < R; r++)
#pragma GCC unroll 8
        for (int c = 0; c < C; c++)
            acc[r][c] = _mm512_setzero_ps();
    for (int k = 0; k < kc; k += 32) {
        const int rem = kc - k;
        const __mmask32 mw = rem >= 32 ? 0xffffffffu : (1u << rem) - 1u;
        __m512 ev[4], od[4];
#pragma GCC unroll 8
        for (int r = 0; r < R; r++) {
            ev[r] = _mm512_load_ps(xe + (size_t)r * HK_BF16_KCH + k / 2);
            od[r] = _mm512_load_ps(xe + (size_t)r * HK_BF16_KCH +
                                   HK_BF16_KCH / 2 + k / 2);
        }
#pragma GCC unroll 8
        for (int c = 0; c < C; c++) {
            _mm_prefetch((const char *)(w + (size_t)(c + HK_PF * C) * K + k),
                         HK_PF_HINT);
            const __m512i wv =
                _mm512_maskz_loadu_epi16(mw, w + (size_t)c * K + k);
            const __m512 we = _mm512_castsi512_ps(_mm512_slli_epi32(wv, 16));
            const __m512 wo = _mm512_castsi512_ps(_mm512_and_si512(wv, hi));
#pragma GCC unroll 8
            for (int r = 0; r < R; r++) {
                acc[r][c] = _mm512_fmadd_ps(we, ev[r], acc[r][c]);
                acc[r][c] = _mm512_fmadd_ps(wo, od[r], acc[r][c]);
            }
        }
    }
    store_512(y, ldy, acc, beta, R, C);
}

static T_512 void bf16_512(float *y, int ldy, const float *x, int ldx, int n,
                           const hk_weight_t *w, int o0, int oc, float beta)
{
    const int K = w->cols;
    const uint16_t *W = w->data;
    float xe[4 * HK_BF16_KCH] __attribute__((aligned(64)));
    /* x dealt once per row group and pass, not once per output */
    for (int k0 = 0; k0 < K; k0 += HK_BF16_KCH) {
        const int kc = K - k0 < HK_BF16_KCH ? K - k0 : HK_BF16_KCH;
        const float b = k0 ? 1.0f : beta;
#define PREP(r, R)                                                             \
    for (int i = 0; i < (R); i++)                                              \
    bf16_deal_row(xe + (size_t)i * HK_BF16_KCH,                                \
                  x + (size_t)((r) + i) * ldx + k0, kc)
#define BLK(r, o, R, C)                                                        \
    bf16_blk_512(y + (size_t)(r)*ldy + (o), ldy, xe, W + (size_t)(o)*K + k0,   \
                 K, kc, b, R, C)
        HK_WALK(n, o0, oc, 1, PREP, BLK)
#undef BLK
#undef PREP
    }
}

/* ---- AVX-512 VNNI ------------------------------------------------------- */

/* Groups of one row a VNNI block quantizes (its stack holds their
 * scales and corrections); rows of more go to the AVX2 kernel. */
#define HK_I8_VNNI_MAXG (HK_I8_VNNI_MAXK / 64)

/* The first rem (<= 64) bytes or 16 floats. */
HK_INLINE T_VNNI __mmask64 mask64(int rem)
{
    return rem >= 64 ? ~0ull : (1ull << rem) - 1ull;
}

HK_INLINE T_VNNI __mmask16 mask16(int rem)
{
    return rem >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << rem) - 1u);
}

/* One row of x: per group of G, xs[g] = max|x| / 127 and xq = round(x /
 * xs[g]) as s8; per group the vector xc[g] = -128 x (xq summed by lanes of
 * 4 bytes over the group's chunks of 64), which takes the +128 of W's u8
 * form back out of the same lanes. */
static T_VNNI void quant_row(int8_t *xq, float *xs, __m512i *xc, const float *x,
                             int K, int G)
{
    const __m512i k80 = _mm512_set1_epi8((char)0x80);
    for (int g = 0; g < K / G; g++) {
        const float *xg = x + (size_t)g * G;
        __m512 mx = _mm512_setzero_ps();
        for (int kk = 0; kk < G; kk += 16)
            mx = _mm512_max_ps(mx, _mm512_abs_ps(_mm512_maskz_loadu_ps(
                                       mask16(G - kk), xg + kk)));
        const float amax = _mm512_reduce_max_ps(mx);
        const __m512 inv = _mm512_set1_ps(amax > 0.0f ? 127.0f / amax : 0.0f);
        xs[g] = amax / 127.0f;
        int8_t *qg = xq + (size_t)g * G;
        for (int kk = 0; kk < G; kk += 16) {
            const __mmask16 m = mask16(G - kk);
            _mm_mask_storeu_epi8(
                qg + kk, m,
                _mm512_cvtsepi32_epi8(_mm512_cvtps_epi32(
                    _mm512_mul_ps(_mm512_maskz_loadu_ps(m, xg + kk), inv))));
        }
        __m512i s = _mm512_setzero_si512();
        for (int kk = 0; kk < G; kk += 64)
            s = _mm512_dpbusd_epi32(
                s, k80, _mm512_maskz_loadu_epi8(mask64(G - kk), qg + kk));
        xc[g] = _mm512_sub_epi32(_mm512_setzero_si512(), s);
    }
}

/* vpdpbusd multiplies u8 by s8: W is read as u8 (W + 128, an xor) and x
 * as s8, so the W side costs one op per load shared by the R rows and
 * the +128's share, -128 x summed, starts each group's accumulators
 * (xc). Every lane then holds exactly its int32 sum of x_q * W_q. Per
 * group: int32 -> f32, times the two scales. G64: G is a multiple of 64
 * (no masks; the common case), else a group's last chunk is masked. */
HK_INLINE T_VNNI void i8_blk_512(float *y, int ldy, const int8_t *xq,
                                 const float *xs, const __m512i *xc,
                                 const int8_t *w, const float *ws, int K, int G,
                                 float beta, const int G64, const int R,
                                 const int C)
{
    const int ng = K / G;
    const __m512i k80 = _mm512_set1_epi8((char)0x80);
    __m512 acc[4][8];
#pragma GCC unroll 8
    for (int r = 0; r < R; r++)
#pragma GCC unroll 8
        for (int c = 0; c < C; c++)
            acc[r][c] = _mm512_setzero_ps();
    for (int g = 0; g < ng; g++) {
        __m512i t[4][8];
#pragma GCC unroll 8
        for (int r = 0; r < R; r++) {
            const __m512i c0 = _mm512_load_si512(xc + (size_t)r * ng + g);
#pragma GCC unroll 8
            for (int c = 0; c < C; c++)
                t[r][c] = c0;
        }
        const int end = (g + 1) * G;
        for (int k = g * G; k < end; k += 64) {
            const __mmask64 m = G64 ? ~0ull : mask64(end - k);
            __m512i xv[4];
#pragma GCC unroll 8
            for (int r = 0; r < R; r++)
                xv[r] =
                    G64 ? _mm512_loadu_si512(xq + (size_t)r * K + k)
                        : _mm512_maskz_loadu_epi8(m, xq + (size_t)r * K + k);
#pragma GCC unroll 8
            for (int c = 0; c < C; c++) {
                _mm_prefetch(
                    (const char *)(w + (size_t)(c + HK_PF * C) * K + k),
                    HK_PF_HINT);
                const int8_t *wc = w + (size_t)c * K + k;
                const __m512i wv =
                    _mm512_xor_si512(G64 ? _mm512_loadu_si512(wc)
                                         : _mm512_maskz_loadu_epi8(m, wc),
                                     k80);
#pragma GCC unroll 8
                for (int r = 0; r < R; r++)
                    t[r][c] = _mm512_dpbusd_epi32(t[r][c], wv, xv[r]);
            }
        }
        /* x's scale broadcast once per row, W's read as a broadcast
         * operand of the multiply */
        __m512 xsb[4];
#pragma GCC unroll 8
        for (int r = 0; r < R; r++)
            xsb[r] = _mm512_set1_ps(xs[(size_t)r * ng + g]);
#pragma GCC unroll 8
        for (int c = 0; c < C; c++) {
            const __m512 wsb = _mm512_set1_ps(ws[(size_t)c * ng + g]);
#pragma GCC unroll 8
            for (int r = 0; r < R; r++)
                acc[r][c] =
                    _mm512_fmadd_ps(_mm512_cvtepi32_ps(t[r][c]),
                                    _mm512_mul_ps(xsb[r], wsb), acc[r][c]);
        }
    }
    store_512(y, ldy, acc, beta, R, C);
}

static T_VNNI void i8_512(float *y, int ldy, const float *x, int ldx, int n,
                          const hk_weight_t *w, int o0, int oc, float beta)
{
    const int K = w->cols, G = w->group, ng = K / G;
    if (K > HK_I8_VNNI_MAXK || ng > HK_I8_VNNI_MAXG) {
        i8_avx2(y, ldy, x, ldx, n, w, o0, oc, beta);
        return;
    }
    const int8_t *W = w->data;
    int8_t xq[4 * HK_I8_VNNI_MAXK];
    float xs[4 * HK_I8_VNNI_MAXG];
    __m512i xc[4 * HK_I8_VNNI_MAXG];
#define PREP(r, R)                                                             \
    for (int i = 0; i < (R); i++)                                              \
    quant_row(xq + (size_t)i * K, xs + (size_t)i * ng, xc + (size_t)i * ng,    \
              x + (size_t)((r) + i) * ldx, K, G)
#define BLK(r, o, R, C)                                                        \
    i8_blk_512(y + (size_t)(r)*ldy + (o), ldy, xq, xs, xc, W + (size_t)(o)*K,  \
               w->scales + (size_t)(o)*ng, K, G, beta, G64_, R, C)
    if (G % 64 == 0) {
        enum { G64_ = 1 };
        HK_WALK(n, o0, oc, 1, PREP, BLK)
    } else {
        enum { G64_ = 0 };
        HK_WALK(n, o0, oc, 1, PREP, BLK)
    }
#undef BLK
#undef PREP
}

hk_wdot_fn *const hk_wdot_bf16_avx2 = bf16_avx2;
hk_wdot_fn *const hk_wdot_i8_avx2 = i8_avx2;
hk_wdot_fn *const hk_wdot_f32_avx512 = f32_512;
hk_wdot_fn *const hk_wdot_bf16_avx512 = bf16_512;
hk_wdot_fn *const hk_wdot_i8_avx512 = i8_512;

#else

hk_wdot_fn *const hk_wdot_bf16_avx2 = NULL;
hk_wdot_fn *const hk_wdot_i8_avx2 = NULL;
hk_wdot_fn *const hk_wdot_f32_avx512 = NULL;
hk_wdot_fn *const hk_wdot_bf16_avx512 = NULL;
hk_wdot_fn *const hk_wdot_i8_avx512 = NULL;

#endif
