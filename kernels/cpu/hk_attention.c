/*
 * hk_attention.c - causal grouped-query attention by position (prefill,
 * PIC splice runs and decode).
 *
 *   o[t, h] = sum_{j <= qpos[t]} softmax_j(scale * q[t, h] . k[j, g]) v[j, g]
 *   g = h / (Hq / Hkv)
 *
 * Layouts (row-major): q, o [T, Hq, hd]; qpos [T], any order, each in
 * 0..N-1; k, v [N, Hkv, hd], the key at row j has position j. Reference: HF
 * eager_attention_forward (repeat_kv, softmax in float32, causal mask) for
 * Qwen3NextAttention; spec §4.6 (scale is hd^-1/2 there, given here).
 *
 * Method (flash-attention style). A work item is one kv group g and a block
 * of up to HK_ATTN_BQ queries. Its rows are one query head over the block
 * (stride Hq*hd, accumulated straight into o), taking the group's r heads in
 * turn; for T == 1 the rows are the r heads themselves (contiguous, stride
 * hd). Keys 0..max(qpos in block) go by blocks of bk; per block the keys are
 * transposed once into Kt [hd, bk], then for each head pass
 *   S = Q Kt;  per row: S *= scale, m' = max(m, max_valid S),
 *   P = exp(S - m') on keys j <= qpos (0 elsewhere), l = l e^{m-m'} + sum P,
 *   O = O e^{m-m'} + P V;        finally o = O / l.
 * Max subtraction keeps every exponent <= 0; every row has key 0, so l >= 1.
 *
 * Products: a small register-tiled kernel (8 rows x 32 columns), not
 * sgemm. The same loop on single-threaded OpenBLAS sgemm (SkylakeX kernels)
 * ran ~2x slower at hd 256 (packing its small panels took a third of the
 * time), ~4x slower when OpenBLAS 0.3.21 falls back to its SSE3 kernels on
 * CPUs it does not know (this host), and the pthreads build called from
 * OpenMP threads oversubscribes the cores. AVX-512 intrinsics because GCC
 * keeps a vectorized accumulator tile in memory (measured ~2x slower); the
 * portable path is the same loop nest in plain C.
 *
 * Threads and scratch: work items are spread over at most HK_ATTN_SLOTS
 * OpenMP threads, each with its own scratch slot; a work item is computed by
 * one thread from start to end, so o does not depend on the thread count.
 * The scratch size is a function of (T, N, Hq) only: the Kt panel has a
 * fixed budget (HK_ATTN_KT floats), so bk shrinks for large hd.
 */
#include <assert.h>
#include <math.h>
#include <omp.h>
#include <string.h>
#if defined(__AVX512F__)
#include <immintrin.h>
#endif

#include "kernels/cpu/hk_cpu.h"

/* Queries per work item: rows of each product; the causal waste is ~BQ/2
 * keys per row on the diagonal block. */
#define HK_ATTN_BQ 64
/* Keys per block at most; the Kt panel budget in floats (272 KB: hd 256 x
 * (256 + pad) keys, stays in L2 while every head pass of the work item
 * reuses it); Kt row padding, so its rows do not all fall into the same L1
 * sets; the largest hd the budget admits (bk >= 32). */
#define HK_ATTN_BK    256
#define HK_ATTN_KT    69632
#define HK_ATTN_KPAD  16
#define HK_ATTN_HDMAX (HK_ATTN_KT / (32 + HK_ATTN_KPAD))
/* Most threads (and scratch slots) one call uses. */
#define HK_ATTN_SLOTS 32

/* exp(x) to ~1 ulp for x <= 88, 0 below -87.3 (where e^x < 2^-126): a
 * branch-free form the compiler vectorizes, unlike libm's expf. x = n ln2 +
 * r with |r| <= ln2/2 (Cody-Waite split of ln2), e^r by its degree-7 Taylor
 * polynomial (truncation r^8/8! < 6e-9 relative), times 2^n built in the
 * exponent bits. */
static inline float hk_attn_exp(float x)
{
    const float shifter = 12582912.0f; /* 1.5 * 2^23: rounds to integer */
    float xc = x > 88.0f ? 88.0f : x;
    xc = xc < -87.3f ? -87.3f : xc;
    float n = (xc * 1.44269504088896341f + shifter) - shifter;
    float r = (xc - n * 0.693145751953125f) - n * 1.42860682030941723e-6f;
    float p = 1.0f / 5040.0f;
    p = p * r + 1.0f / 720.0f;
    p = p * r + 1.0f / 120.0f;
    p = p * r + 1.0f / 24.0f;
    p = p * r + 1.0f / 6.0f;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    union {
        int i;
        float f;
    } s;
    s.i = ((int)n + 127) << 23;
    return x < -87.3f ? 0.0f : p * s.f;
}

/*
 * C[M, N] (= or +=) A[M, K] . B[K, N], all row-major with leading dims.
 * Each C element is one k-ordered sum whatever M, N and the tiling, so
 * results do not depend on how rows are grouped into work items.
 */
#if defined(__AVX512F__)
/* One row of the 8-row tile: broadcast A[i][k] against two B vectors. */
#define HK_ATTN_FMA2(i)                                                        \
    do {                                                                       \
        __m512 x = _mm512_set1_ps(a##i[k]);                                    \
        c##i##0 = _mm512_fmadd_ps(x, b0, c##i##0);                             \
        c##i##1 = _mm512_fmadd_ps(x, b1, c##i##1);                             \
    } while (0)
/* Store one tile row (rows past M were computed on a clamped copy of the
 * last row and are dropped). */
#define HK_ATTN_STORE(i)                                                       \
    do {                                                                       \
        if (m0 + i < M) {                                                      \
            float *cr = C + (size_t)(m0 + i) * ldc + n0;                       \
            if (acc) {                                                         \
                c##i##0 =                                                      \
                    _mm512_add_ps(c##i##0, _mm512_maskz_loadu_ps(k0, cr));     \
                c##i##1 = _mm512_add_ps(c##i##1,                               \
                                        _mm512_maskz_loadu_ps(k1, cr + 16));   \
            }                                                                  \
            _mm512_mask_storeu_ps(cr, k0, c##i##0);                            \
            _mm512_mask_storeu_ps(cr + 16, k1, c##i##1);                       \
        }                                                                      \
    } while (0)

static void hk_attn_mm(float *restrict C, size_t ldc,       // [M, N]
                       const float *restrict A, size_t lda, // [M, K]
                       const float *restrict B, size_t ldb, // [K, N]
                       int M, int N, int K, int acc)
{
    for (int n0 = 0; n0 < N; n0 += 32) {
        const int nr = N - n0;
        const __mmask16 k0 =
            nr >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << nr) - 1);
        const __mmask16 k1 = nr >= 32   ? (__mmask16)0xFFFF
                             : nr <= 16 ? (__mmask16)0
                                        : (__mmask16)((1u << (nr - 16)) - 1);
        for (int m0 = 0; m0 < M; m0 += 8) {
#define HK_ATTN_AROW(i) (A + (size_t)(m0 + i < M ? m0 + i : M - 1) * lda)
            const float *a0 = HK_ATTN_AROW(0), *a1 = HK_ATTN_AROW(1);
            const float *a2 = HK_ATTN_AROW(2), *a3 = HK_ATTN_AROW(3);
            const float *a4 = HK_ATTN_AROW(4), *a5 = HK_ATTN_AROW(5);
            const float *a6 = HK_ATTN_AROW(6), *a7 = HK_ATTN_AROW(7);
#undef HK_ATTN_AROW
            __m512 c00 = _mm512_setzero_ps(), c01 = c00, c10 = c00, c11 = c00;
            __m512 c20 = c00, c21 = c00, c30 = c00, c31 = c00;
            __m512 c40 = c00, c41 = c00, c50 = c00, c51 = c00;
            __m512 c60 = c00, c61 = c00, c70 = c00, c71 = c00;
            const float *b = B + n0;
            for (int k = 0; k < K; k++, b += ldb) {
                __m512 b0 = _mm512_maskz_loadu_ps(k0, b);
                __m512 b1 = _mm512_maskz_loadu_ps(k1, b + 16);
                HK_ATTN_FMA2(0);
                HK_ATTN_FMA2(1);
                HK_ATTN_FMA2(2);
                HK_ATTN_FMA2(3);
                HK_ATTN_FMA2(4);
                HK_ATTN_FMA2(5);
                HK_ATTN_FMA2(6);
                HK_ATTN_FMA2(7);
            }
            HK_ATTN_STORE(0);
            HK_ATTN_STORE(1);
            HK_ATTN_STORE(2);
            HK_ATTN_STORE(3);
            HK_ATTN_STORE(4);
            HK_ATTN_STORE(5);
            HK_ATTN_STORE(6);
            HK_ATTN_STORE(7);
        }
    }
}
#undef HK_ATTN_FMA2
#undef HK_ATTN_STORE
#else
static void hk_attn_mm(float *restrict C, size_t ldc,       // [M, N]
                       const float *restrict A, size_t lda, // [M, K]
                       const float *restrict B, size_t ldb, // [K, N]
                       int M, int N, int K, int acc)
{
    for (int m = 0; m < M; m++) {
        float *c = C + (size_t)m * ldc;
        const float *a = A + (size_t)m * lda;
        if (!acc)
            for (int n = 0; n < N; n++)
                c[n] = 0.0f;
        for (int k = 0; k < K; k++) {
            const float x = a[k];
            const float *b = B + (size_t)k * ldb;
#pragma omp simd
            for (int n = 0; n < N; n++)
                c[n] += x * b[n];
        }
    }
}
#endif

/* Queries per work item, keys per block and floats per scratch slot. */
static void hk_attn_geom(int T, int N, int Hq, int hd, int *bq, int *bk,
                         size_t *slot)
{
    *bq = T < HK_ATTN_BQ ? T : HK_ATTN_BQ;
    int b = HK_ATTN_BK;
    if (hd > 0 && HK_ATTN_KT / hd - HK_ATTN_KPAD < b)
        b = (HK_ATTN_KT / hd - HK_ATTN_KPAD) / 32 * 32; /* >= 32 */
    *bk = N < b ? N : b;
    /* T == 1 puts a group's heads (<= Hq) on the rows. */
    int rows = T == 1 ? Hq : *bq;
    /* Kt panel, S [rows, HK_ATTN_BK], running max and sum per (row, head of
     * the group); sized for the largest bk so hd is not needed. */
    int bkmax = N < HK_ATTN_BK ? N : HK_ATTN_BK;
    *slot = (size_t)HK_ATTN_KT + (size_t)rows * (size_t)bkmax +
            2 * (size_t)*bq * (size_t)Hq;
}

size_t hk_attention_scratch(int T, int N, int Hq)
{
    int bq, bk;
    size_t slot;
    if (T <= 0 || N <= 0)
        return 0;
    hk_attn_geom(T, N, Hq, 0, &bq, &bk, &slot);
    /* Work items: at most Hq groups times the query blocks. */
    size_t items = (size_t)Hq * (size_t)((T + bq - 1) / bq);
    size_t nslot = items < HK_ATTN_SLOTS ? items : HK_ATTN_SLOTS;
    return nslot * slot;
}

/*
 * Softmax step for one row of raw scores against a key block: scales the
 * first nv (valid) scores, turns them into probabilities relative to the
 * new running max, zeroes the rest, updates (m, l) and returns the factor
 * e^{m-m'} by which the row's accumulated output must be rescaled.
 */
static float hk_attn_row(float *restrict s, // [bk] scores -> probabilities
                         int nv, int bk, float scale, float *m, float *l)
{
    float mx = *m;
#pragma omp simd reduction(max : mx)
    for (int j = 0; j < nv; j++) {
        s[j] *= scale;
        mx = s[j] > mx ? s[j] : mx;
    }
    float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
    for (int j = 0; j < nv; j++) {
        s[j] = hk_attn_exp(s[j] - mx);
        sum += s[j];
    }
    for (int j = nv; j < bk; j++)
        s[j] = 0.0f;
    /* Nothing accumulated yet (m = -inf, l = 0): no rescale needed. */
    float alpha = *l > 0.0f ? expf(*m - mx) : 1.0f;
    *m = mx;
    *l = *l * alpha + sum;
    return alpha;
}

/* Kt[d, j] = K[j, d] for j < bk, d < hd, by 16x16 tiles. */
#if defined(__AVX512F__)
/* One tile in registers: 32-bit then 64-bit interleaves transpose the 4x4
 * blocks inside each 128-bit lane, two lane shuffles move the blocks. */
static void hk_attn_tile16(float *restrict kt, size_t ldkt,
                           const float *restrict k, size_t ldk, int nj, int nd)
{
    const __mmask16 dm = (__mmask16)((1u << nd) - 1); /* nd, nj in 1..16 */
    const __mmask16 jm = (__mmask16)((1u << nj) - 1);
    __m512 r[16], a[16], b[16];
    for (int j = 0; j < 16; j++)
        r[j] = j < nj ? _mm512_maskz_loadu_ps(dm, k + (size_t)j * ldk)
                      : _mm512_setzero_ps();
    for (int i = 0; i < 16; i += 2) {
        a[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
        a[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
    }
    for (int i = 0; i < 16; i += 4)
        for (int c = 0; c < 2; c++) {
            __m512d x = _mm512_castps_pd(a[i + c]);
            __m512d y = _mm512_castps_pd(a[i + c + 2]);
            b[i + 2 * c] = _mm512_castpd_ps(_mm512_unpacklo_pd(x, y));
            b[i + 2 * c + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(x, y));
        }
    /* b[4i + c], 128-bit lane L: rows 4i..4i+3 of column 4L + c. */
    for (int c = 0; c < 4; c++) {
        __m512 c0 = _mm512_shuffle_f32x4(b[c], b[4 + c], 0x44);
        __m512 c1 = _mm512_shuffle_f32x4(b[c], b[4 + c], 0xEE);
        __m512 c2 = _mm512_shuffle_f32x4(b[8 + c], b[12 + c], 0x44);
        __m512 c3 = _mm512_shuffle_f32x4(b[8 + c], b[12 + c], 0xEE);
        __m512 out[4] = {_mm512_shuffle_f32x4(c0, c2, 0x88),
                         _mm512_shuffle_f32x4(c0, c2, 0xDD),
                         _mm512_shuffle_f32x4(c1, c3, 0x88),
                         _mm512_shuffle_f32x4(c1, c3, 0xDD)};
        for (int L = 0; L < 4; L++)
            if (4 * L + c < nd)
                _mm512_mask_storeu_ps(kt + (size_t)(4 * L + c) * ldkt, jm,
                                      out[L]);
    }
}
#else
static void hk_attn_tile16(float *restrict kt, size_t ldkt,
                           const float *restrict k, size_t ldk, int nj, int nd)
{
    for (int j = 0; j < nj; j++)
        for (int d = 0; d < nd; d++)
            kt[(size_t)d * ldkt + j] = k[(size_t)j * ldk + d];
}
#endif

static void hk_attn_transpose(float *restrict kt, size_t ldkt,     // [hd, bk]
                              const float *restrict k, size_t ldk, // [bk,hd]
                              int bk, int hd)
{
    for (int j0 = 0; j0 < bk; j0 += 16)
        for (int d0 = 0; d0 < hd; d0 += 16)
            hk_attn_tile16(
                kt + (size_t)d0 * ldkt + j0, ldkt, k + (size_t)j0 * ldk + d0,
                ldk, bk - j0 < 16 ? bk - j0 : 16, hd - d0 < 16 ? hd - d0 : 16);
}

/* Work-item geometry shared by every head pass. */
typedef struct {
    int g, t0, nt, heads_on_rows;
    int N, Hq, Hkv, hd, bk;
    float scale;
} hk_attn_item_t;

/* One work item: kv group g, queries [t0, t0 + nt), or, when heads_on_rows,
 * the single query t0 with the group's r heads as rows. */
static void hk_attn_item(float *o, const float *q, const int *qpos,
                         const float *k, const float *v,
                         const hk_attn_item_t *it, float *slot)
{
    const int hd = it->hd, Hq = it->Hq, bk_max = it->bk;
    const int r = Hq / it->Hkv, g = it->g, t0 = it->t0, nt = it->nt;
    /* Row m of head pass i: query q + off(i) + m*ldq. */
    const int npass = it->heads_on_rows ? 1 : r;
    const int M = it->heads_on_rows ? r : nt;
    const size_t ldq = it->heads_on_rows ? (size_t)hd : (size_t)Hq * hd;
    const size_t ldkv = (size_t)it->Hkv * hd;
    /* Padded so Kt rows do not all map to the same L1 sets. */
    const size_t ldkt = (size_t)bk_max + HK_ATTN_KPAD;
    float *kt = slot;                       // [hd, bk_max]
    float *s = kt + HK_ATTN_KT;             // [M, bk_max]
    float *mrow = s + (size_t)M * bk_max;   // [npass, M]
    float *lrow = mrow + (size_t)npass * M; // [npass, M]

    int pmax = 0;
    for (int t = t0; t < t0 + nt; t++) {
        assert(qpos[t] >= 0 && qpos[t] < it->N);
        pmax = qpos[t] > pmax ? qpos[t] : pmax;
    }
    for (int i = 0; i < npass * M; i++) {
        mrow[i] = -INFINITY;
        lrow[i] = 0.0f;
    }
    for (int t = t0; t < t0 + nt; t++)
        memset(o + ((size_t)t * Hq + (size_t)g * r) * hd, 0,
               (size_t)r * hd * sizeof(float));

    for (int kb = 0; kb <= pmax; kb += bk_max) {
        const int bk = pmax + 1 - kb < bk_max ? pmax + 1 - kb : bk_max;
        const float *vblk = v + (size_t)kb * ldkv + (size_t)g * hd;
        hk_attn_transpose(kt, ldkt, k + (size_t)kb * ldkv + (size_t)g * hd,
                          ldkv, bk, hd);
        for (int pass = 0; pass < npass; pass++) {
            const size_t off = ((size_t)t0 * Hq + (size_t)g * r + pass) * hd;
            float *mp = mrow + (size_t)pass * M, *lp = lrow + (size_t)pass * M;
            hk_attn_mm(s, (size_t)bk_max, q + off, ldq, kt, ldkt, M, bk, hd, 0);
            for (int m = 0; m < M; m++) {
                const int p = qpos[it->heads_on_rows ? t0 : t0 + m];
                int nv = p - kb + 1 < bk ? p - kb + 1 : bk;
                nv = nv < 0 ? 0 : nv;
                float *srow = s + (size_t)m * bk_max;
                if (nv == 0) { /* row's keys all lie before this block */
                    memset(srow, 0, (size_t)bk * sizeof(float));
                    continue;
                }
                float alpha =
                    hk_attn_row(srow, nv, bk, it->scale, mp + m, lp + m);
                float *orow = o + off + (size_t)m * ldq;
                if (alpha != 1.0f)
#pragma omp simd
                    for (int d = 0; d < hd; d++)
                        orow[d] *= alpha;
            }
            hk_attn_mm(o + off, ldq, s, (size_t)bk_max, vblk, ldkv, M, hd, bk,
                       1);
        }
    }

    for (int pass = 0; pass < npass; pass++) {
        const size_t off = ((size_t)t0 * Hq + (size_t)g * r + pass) * hd;
        for (int m = 0; m < M; m++) {
            const float inv = 1.0f / lrow[(size_t)pass * M + m];
            float *orow = o + off + (size_t)m * ldq;
#pragma omp simd
            for (int d = 0; d < hd; d++)
                orow[d] *= inv;
        }
    }
}

void hk_attention(float *o,        // [T, Hq, hd]
                  const float *q,  // [T, Hq, hd]
                  const int *qpos, // [T]
                  const float *k,  // [N, Hkv, hd]
                  const float *v,  // [N, Hkv, hd]
                  int T, int N, int Hq, int Hkv, int hd, float scale,
                  float *scratch) // [hk_attention_scratch(T, N, Hq)]
{
    assert(T >= 0 && N > 0 && Hkv > 0 && Hq % Hkv == 0);
    assert(hd > 0 && hd <= HK_ATTN_HDMAX);
    if (T == 0)
        return;
    int bq, bk;
    size_t slot;
    hk_attn_geom(T, N, Hq, hd, &bq, &bk, &slot);
    const int heads_on_rows = T == 1;
    const int nqb = (T + bq - 1) / bq;
    const int nitems = nqb * Hkv;
    int nth = omp_get_max_threads();
    nth = nth < HK_ATTN_SLOTS ? nth : HK_ATTN_SLOTS;
    nth = nth < nitems ? nth : nitems;

    /* Later query blocks usually see more keys: hand them out first. */
#pragma omp parallel for num_threads(nth) schedule(dynamic, 1)
    for (int i = 0; i < nitems; i++) {
        const int qb = nqb - 1 - i / Hkv;
        hk_attn_item_t it = {.g = i % Hkv,
                             .t0 = qb * bq,
                             .nt = T - qb * bq < bq ? T - qb * bq : bq,
                             .heads_on_rows = heads_on_rows,
                             .N = N,
                             .Hq = Hq,
                             .Hkv = Hkv,
                             .hd = hd,
                             .bk = bk,
                             .scale = scale};
        hk_attn_item(o, q, qpos, k, v, &it,
                     scratch + (size_t)omp_get_thread_num() * slot);
    }
}

size_t hk_attention_decode_paged_scratch(int N, int Hq, int Hkv, int hd)
{
    if (N <= 0)
        return 0;
    /* hk_attention's scratch grows with N: the longest context's serves
     * every request. */
    return 2 * (size_t)N * Hkv * hd + hk_attention_scratch(1, N, Hq);
}

void hk_attention_decode_paged(float *o,             // [B, Hq, hd]
                               const float *q,       // [B, Hq, hd]
                               const float *k_pages, // [pages, P, Hkv, hd]
                               const float *v_pages, // [pages, P, Hkv, hd]
                               const int *table,     // [B, max_pages]
                               int max_pages,
                               const int *n_ctx, // [B]
                               int B, int P, int Hq, int Hkv, int hd,
                               float scale, float *scratch)
{
    const size_t row = (size_t)Hkv * hd;
    for (int b = 0; b < B; b++) {
        const int n = n_ctx[b];
        assert(n >= 1 && P > 0 && (n - 1) / P < max_pages);
        float *k = scratch, *v = scratch + (size_t)n * row;
        for (int j = 0; j < n; j++) {
            const int page = table[(size_t)b * max_pages + j / P];
            const size_t at = ((size_t)page * P + (size_t)(j % P)) * row;
            memcpy(k + j * row, k_pages + at, row * sizeof(float));
            memcpy(v + j * row, v_pages + at, row * sizeof(float));
        }
        const int qpos = n - 1;
        hk_attention(o + (size_t)b * Hq * hd, q + (size_t)b * Hq * hd, &qpos, k,
                     v, 1, n, Hq, Hkv, hd, scale, v + (size_t)n * row);
    }
}
