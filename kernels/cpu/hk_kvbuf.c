/*
 * hk_kvbuf.c - KVBuffer kernels for Gated DeltaNet decoding: the chunkwise
 * step (decode, draft verification, KV-only prompt) and the rank-n flush.
 * Equations, block layout and threading: hk_kvbuf.h. Reference:
 * pic-kvbuffer-math.md §5; KVBuffer paper (papers/004) Eq. 4-5, 7-8, A.1.
 *
 * Step, per request r and key head kh (one work item), tokens t = 0..T-1:
 *   1. write k_t into entry len+t of key head kh (shared by the group);
 *   2. KK[t][i] = k_i.k_t (i < len+t), KQ[t][i] = k_i.q_t (i <= len+t);
 *   3. per value head h of the group: one pass over S0 gives
 *      SK[t] = S0^T k_t and SQ[t] = S0^T q_t for all t (a dk x 2T
 *      right-hand side); then in token order
 *        G_t = G_{t-1} + g_t,  c_i = e^{G_t - G_i}
 *        u   = e^{G_t} SK[t] + sum_{i<len+t} c_i KK[t][i] w_i
 *        w_t = beta_t (v_t - u)
 *        o_t = e^{G_t} SQ[t] + sum_{i<len+t} c_i KQ[t][i] w_i + KQ[t][t] w_t
 *      each w_i read once for both sums.
 * Flush, per request and value head: Ktilde = diag(e^{G_n - G_i}) K,
 * S <- e^{G_n} S + Ktilde^T W as one cblas_sgemm (beta = e^{G_n}), so S is
 * read and written once whatever n is.
 */
#include "kernels/cpu/hk_kvbuf.h"

#include <assert.h>
#include <cblas.h>
#include <math.h>
#include <omp.h>
#include <string.h>

#include "kernels/common/gdn_math.h"

/* Columns of w / o handled together: the accumulators of a column block
 * (S0^T k and S0^T q, which then become u and o) stay in vector registers
 * while S0 rows and buffered w rows stream past. With AVX-512 (32 vector
 * registers) a block is a whole 128-wide head row, so S0 is read front to
 * back (the prefetcher's best case); otherwise 64 columns. */
#ifdef __AVX512F__
#define HK_KVBUF_JB 128
#else
#define HK_KVBUF_JB 64
#endif
/* Below this many multiply-adds per call the OpenMP fork/join costs more
 * than the work (and on a loaded machine a descheduled thread stalls every
 * barrier); such calls run on the calling thread. */
#define HK_KVBUF_PAR_MIN 65536
/* Software prefetch distance of the S0 pass, in rows (8 x 512 B = 4 KiB),
 * and of the buffered keys and w rows, in bytes. */
#define HK_KVBUF_PF_ROWS  8
#define HK_KVBUF_PF_BYTES 2048

size_t hk_kvbuf_block_floats(const hk_kvbuf_geom_t *g)
{
    return hk_kvbuf_layout_floats(g);
}

static float *block_base(float *arena, const hk_kvbuf_geom_t *g,
                         const int *blocks, int i)
{
    return arena + (size_t)blocks[i / g->bs] * hk_kvbuf_block_floats(g);
}

/* Key head kh's [dk, bs] key matrix of the block holding entry i. */
static float *block_keys(float *arena, const hk_kvbuf_geom_t *g,
                         const int *blocks, int i, int kh)
{
    return block_base(arena, g, blocks, i) + (size_t)kh * g->dk * g->bs;
}

float *hk_kvbuf_w(float *arena, const hk_kvbuf_geom_t *g, const int *blocks,
                  int i, int h)
{
    return block_base(arena, g, blocks, i) + hk_kvbuf_off_w(g) +
           ((size_t)h * g->bs + i % g->bs) * g->dv;
}

double *hk_kvbuf_G(float *arena, const hk_kvbuf_geom_t *g, const int *blocks,
                   int i, int h)
{
    /* The arena is untyped allocated memory; the G region is only ever
     * accessed as double (64-byte aligned), so this is a valid view. */
    /* cppcheck-suppress invalidPointerCast */
    return (double *)(block_base(arena, g, blocks, i) + hk_kvbuf_off_G(g)) +
           (size_t)h * g->bs + i % g->bs;
}

/* Per-thread scratch of the step (floats): Gt [T] doubles, eG, self [T],
 * KK, KQ [T, lmax] (key products, per key head), CU, CO [T, lmax] (the
 * same times the decays, per value head), SK, SQ [T, JB] (S0^T k, S0^T q
 * of one column block when T > 1). */
typedef struct {
    double *Gt;
    float *eG, *self, *KK, *KQ, *CU, *CO, *SK, *SQ;
} step_ws_t;

static size_t step_slot(int T, int lmax)
{
    return hk_kvbuf_round16(4 * (size_t)T + 4 * (size_t)T * lmax +
                            2 * (size_t)T * HK_KVBUF_JB);
}

static step_ws_t step_ws(float *ws, int T, int lmax)
{
    step_ws_t w;
    /* Scratch slots are 64-byte aligned (sizes are round16) and this part
     * is only accessed as double. */
    /* cppcheck-suppress invalidPointerCast */
    w.Gt = (double *)ws;
    w.eG = ws + 2 * (size_t)T;
    w.self = w.eG + T;
    w.KK = w.self + T;
    w.KQ = w.KK + (size_t)T * lmax;
    w.CU = w.KQ + (size_t)T * lmax;
    w.CO = w.CU + (size_t)T * lmax;
    w.SK = w.CO + (size_t)T * lmax;
    w.SQ = w.SK + (size_t)T * HK_KVBUF_JB;
    return w;
}

size_t hk_kvbuf_step_scratch(const hk_kvbuf_geom_t *g, int T, int lmax, int nth)
{
    (void)g;
    return (size_t)nth * step_slot(T, lmax);
}

/* Per-thread scratch of the flush: Ktilde^T [dk, nmax], W [nmax, dv]. */
static size_t flush_slot(const hk_kvbuf_geom_t *g, int nmax)
{
    return hk_kvbuf_round16((size_t)nmax * (g->dk + g->dv));
}

size_t hk_kvbuf_flush_scratch(const hk_kvbuf_geom_t *g, int nmax, int nth)
{
    return (size_t)nth * flush_slot(g, nmax);
}

/* kk[s] = K[:, s] . kt, kq[s] = K[:, s] . qt for the nb entries of one
 * block (K [dk, bs]): vertical sums across entries, no horizontal
 * reductions. bs is a literal at the hot call site, so the accumulators
 * are registers. */
static inline __attribute__((always_inline)) void
block_dots(float *restrict kk, float *restrict kq, const float *restrict K,
           const float *restrict kt, const float *restrict qt, int nb, int bs,
           int dk)
{
    float ak[64], aq[64];
    for (int s = 0; s < bs; s++)
        ak[s] = aq[s] = 0.0f;
    for (int i = 0; i < dk; i++) {
        const float *restrict Ki = K + (size_t)i * bs;
        const float ki = kt[i], qi = qt[i];
        /* The block comes from memory in short runs (one key head's
         * [dk, bs] slice): fetch ahead, past the page boundaries where the
         * hardware prefetcher stops. */
        __builtin_prefetch(Ki + (size_t)HK_KVBUF_PF_BYTES / sizeof(float));
#pragma omp simd
        for (int s = 0; s < bs; s++) {
            ak[s] += Ki[s] * ki;
            aq[s] += Ki[s] * qi;
        }
    }
    for (int s = 0; s < nb; s++) {
        kk[s] = ak[s];
        kq[s] = aq[s];
    }
}

/* Same for any bs: the accumulators live in kk, kq. */
static void block_dots_any(float *restrict kk, float *restrict kq,
                           const float *restrict K, const float *restrict kt,
                           const float *restrict qt, int nb, int bs, int dk)
{
    memset(kk, 0, nb * sizeof(float));
    memset(kq, 0, nb * sizeof(float));
    for (int i = 0; i < dk; i++) {
        const float *restrict Ki = K + (size_t)i * bs;
        const float ki = kt[i], qi = qt[i];
#pragma omp simd
        for (int s = 0; s < nb; s++) {
            kk[s] += Ki[s] * ki;
            kq[s] += Ki[s] * qi;
        }
    }
}

/* What one value head needs for a column block. */
typedef struct {
    float *arena;
    const hk_kvbuf_geom_t *g;
    const hk_kvbuf_view_t *vw;
    const float *q, *k, *v, *beta; /* rows of request r */
    float *o;
    int h, kh, T, lmax;
} head_t;

/* S0^T k_t and S0^T q_t over columns [j0, j0 + jn) for T > 1 tokens, into
 * w->SK, w->SQ [T, JB]: one pass over the rows of S0. */
static void s_pass_multi(const head_t *H, const step_ws_t *w, const float *S,
                         int jn)
{
    const int Hk = H->g->Hk, dk = H->g->dk, dv = H->g->dv, T = H->T;
    memset(w->SK, 0, (size_t)T * HK_KVBUF_JB * sizeof(float));
    memset(w->SQ, 0, (size_t)T * HK_KVBUF_JB * sizeof(float));
    for (int i = 0; i < dk; i++) {
        const float *restrict Si = S + (size_t)i * dv;
        for (int t = 0; t < T; t++) {
            const size_t row = (size_t)t * Hk + H->kh;
            const float ki = H->k[row * dk + i], qi = H->q[row * dk + i];
            float *restrict sk = w->SK + (size_t)t * HK_KVBUF_JB;
            float *restrict sq = w->SQ + (size_t)t * HK_KVBUF_JB;
#pragma omp simd
            for (int jj = 0; jj < jn; jj++) {
                sk[jj] += Si[jj] * ki;
                sq[jj] += Si[jj] * qi;
            }
        }
    }
}

/* Columns [j0, j0 + jn) of every token's u, w and o for head H->h:
 *   u   = e^{G_t} SK[t] + sum_i CU[t][i] w_i
 *   w_t = beta_t (v_t - u),  o_t = e^{G_t} SQ[t] + sum_i CO[t][i] w_i
 *         + self[t] w_t
 * Any T and jn <= JB (col_block_1 is the fast path of decode steps). */
static void col_block_any(const head_t *H, const step_ws_t *w, int j0, int jn)
{
    const hk_kvbuf_geom_t *g = H->g;
    const int Hv = g->Hv, dk = g->dk, dv = g->dv, bs = g->bs;
    const int T = H->T, len = H->vw->len, h = H->h;
    const float *S = H->vw->S ? H->vw->S + (size_t)h * dk * dv + j0 : NULL;
    float ak[HK_KVBUF_JB], aq[HK_KVBUF_JB], u[HK_KVBUF_JB], oa[HK_KVBUF_JB];

    /* One pass over S0's columns [j0, j0+jn) for all T tokens. */
    if (S && T == 1) {
        const float *kt = H->k + (size_t)H->kh * dk;
        const float *qt = H->q + (size_t)H->kh * dk;
        for (int jj = 0; jj < jn; jj++)
            ak[jj] = aq[jj] = 0.0f;
        for (int i = 0; i < dk; i++) {
            const float *restrict Si = S + (size_t)i * dv;
            const float ki = kt[i], qi = qt[i];
#pragma omp simd
            for (int jj = 0; jj < jn; jj++) {
                ak[jj] += Si[jj] * ki;
                aq[jj] += Si[jj] * qi;
            }
        }
    } else if (S) {
        s_pass_multi(H, w, S, jn);
    }

    for (int t = 0; t < T; t++) {
        const float eG = S ? w->eG[t] : 0.0f;
        const float *sk = T == 1 ? ak : w->SK + (size_t)t * HK_KVBUF_JB;
        const float *sq = T == 1 ? aq : w->SQ + (size_t)t * HK_KVBUF_JB;
        if (S) {
#pragma omp simd
            for (int jj = 0; jj < jn; jj++) {
                u[jj] = eG * sk[jj];
                oa[jj] = eG * sq[jj];
            }
        } else {
            for (int jj = 0; jj < jn; jj++)
                u[jj] = oa[jj] = 0.0f;
        }
        const float *cu = w->CU + (size_t)t * H->lmax;
        const float *co = w->CO + (size_t)t * H->lmax;
        const int n = len + t;
        for (int b0 = 0; b0 < n; b0 += bs) {
            const int nb = n - b0 < bs ? n - b0 : bs;
            const float *Wb =
                hk_kvbuf_w(H->arena, g, H->vw->blocks, b0, h) + j0;
            for (int s = 0; s < nb; s++) {
                const float a = cu[b0 + s], c = co[b0 + s];
                if (a == 0.0f && c == 0.0f)
                    continue; /* fully decayed (or orthogonal) */
                const float *restrict wi = Wb + (size_t)s * dv;
#pragma omp simd
                for (int jj = 0; jj < jn; jj++) {
                    u[jj] += a * wi[jj];
                    oa[jj] += c * wi[jj];
                }
            }
        }
        float *restrict wt = hk_kvbuf_w(H->arena, g, H->vw->blocks, n, h) + j0;
        const float *restrict vt = H->v + ((size_t)t * Hv + h) * dv + j0;
        float *restrict ot = H->o + ((size_t)t * Hv + h) * dv + j0;
        const float b = H->beta[(size_t)t * Hv + h], self = w->self[t];
#pragma omp simd
        for (int jj = 0; jj < jn; jj++) {
            wt[jj] = b * (vt[jj] - u[jj]);
            ot[jj] = oa[jj] + self * wt[jj];
        }
    }
}

/* The widest vector the target has (a wider GCC vector would be split
 * anyway), loaded and stored by macros: a vector passed to or returned
 * from a function changes the ABI with the ISA (-Wpsabi). */
#if defined(__AVX512F__)
#define HK_KVBUF_VL 16
#elif defined(__AVX__)
#define HK_KVBUF_VL 8
#else
#define HK_KVBUF_VL 4
#endif
typedef float hk_vf __attribute__((vector_size(HK_KVBUF_VL * sizeof(float))));
#define HK_KVBUF_NV          (HK_KVBUF_JB / HK_KVBUF_VL)
#define HK_VLD(x, p)         memcpy(&(x), (p), sizeof(hk_vf))
#define HK_VST(p, x)         memcpy((p), &(x), sizeof(hk_vf))
#define HK_CACHE_LINE_FLOATS 16

/* col_block_any for one token (a decode step) and a full block of JB
 * columns, with the accumulators held in vector variables and the loops
 * over them unrolled, so that they live in registers (GCC keeps float
 * arrays, or loops it does not unroll, in memory: a load and a store per
 * multiply-add). S0^T k and S0^T q accumulate in u and oa, which are then
 * scaled by e^{G_t}; same operations in the same order as col_block_any. */
static void col_block_1(const head_t *H, const step_ws_t *w, int j0)
{
    const hk_kvbuf_geom_t *g = H->g;
    const int dk = g->dk, dv = g->dv, bs = g->bs;
    const int n = H->vw->len, h = H->h;
    const float *S = H->vw->S ? H->vw->S + (size_t)h * dk * dv + j0 : NULL;
    const hk_vf zero = {0};
    hk_vf u[HK_KVBUF_NV], oa[HK_KVBUF_NV], v;

#pragma GCC unroll 16
    for (int x = 0; x < HK_KVBUF_NV; x++)
        u[x] = oa[x] = zero;
    if (S) {
        const float *kt = H->k + (size_t)H->kh * dk;
        const float *qt = H->q + (size_t)H->kh * dk;
        for (int i = 0; i < dk; i++) {
            const float *Si = S + (size_t)i * dv;
            const float ki = kt[i], qi = qt[i];
            /* Hardware prefetchers stop at 4 KiB pages; S is 16 pages per
             * head and comes from memory, so ask for 4 KiB ahead. */
            if (i + HK_KVBUF_PF_ROWS < dk)
                for (int x = 0; x < HK_KVBUF_JB; x += HK_CACHE_LINE_FLOATS)
                    __builtin_prefetch(Si + (size_t)HK_KVBUF_PF_ROWS * dv + x);
#pragma GCC unroll 16
            for (int x = 0; x < HK_KVBUF_NV; x++) {
                HK_VLD(v, Si + HK_KVBUF_VL * x);
                u[x] += v * ki;
                oa[x] += v * qi;
            }
        }
        const float eG = w->eG[0];
#pragma GCC unroll 16
        for (int x = 0; x < HK_KVBUF_NV; x++) {
            u[x] = eG * u[x];
            oa[x] = eG * oa[x];
        }
    }
    for (int b0 = 0; b0 < n; b0 += bs) {
        const int nb = n - b0 < bs ? n - b0 : bs;
        const float *Wb = hk_kvbuf_w(H->arena, g, H->vw->blocks, b0, h) + j0;
        for (int s = 0; s < nb; s++) {
            const float a = w->CU[b0 + s], c = w->CO[b0 + s];
            if (a == 0.0f && c == 0.0f)
                continue;
            const float *wi = Wb + (size_t)s * dv;
            for (int x = 0; x < HK_KVBUF_JB; x += HK_CACHE_LINE_FLOATS)
                __builtin_prefetch(wi + HK_KVBUF_PF_BYTES / sizeof(float) + x);
#pragma GCC unroll 16
            for (int x = 0; x < HK_KVBUF_NV; x++) {
                HK_VLD(v, wi + HK_KVBUF_VL * x);
                u[x] += a * v;
                oa[x] += c * v;
            }
        }
    }
    float *wt = hk_kvbuf_w(H->arena, g, H->vw->blocks, n, h) + j0;
    const float *vt = H->v + (size_t)h * dv + j0;
    float *ot = H->o + (size_t)h * dv + j0;
    const float b = H->beta[h], self = w->self[0];
#pragma GCC unroll 16
    for (int x = 0; x < HK_KVBUF_NV; x++) {
        HK_VLD(v, vt + HK_KVBUF_VL * x);
        v = b * (v - u[x]);
        HK_VST(wt + HK_KVBUF_VL * x, v);
        v = oa[x] + self * v;
        HK_VST(ot + HK_KVBUF_VL * x, v);
    }
}

/* Value head h of one request: cumulative decays, coefficients, then the
 * column blocks. KK, KQ hold the key products of its key head. */
static void step_head(const head_t *H, const step_ws_t *w, const float *gl)
{
    const hk_kvbuf_geom_t *g = H->g;
    const int T = H->T, len = H->vw->len, h = H->h, Hv = g->Hv, bs = g->bs;
    const int *blocks = H->vw->blocks;

    double G = len > 0 ? *hk_kvbuf_G(H->arena, g, blocks, len - 1, h) : 0.0;
    for (int t = 0; t < T; t++) {
        G += (double)gl[(size_t)t * Hv + h];
        w->Gt[t] = G;
        w->eG[t] = hk_gdn_decay(G);
        w->self[t] = w->KQ[(size_t)t * H->lmax + len + t];
        *hk_kvbuf_G(H->arena, g, blocks, len + t, h) = G;
    }
    /* c = e^{G_t - G_i} for the entries before token t: the buffered
     * ones from the blocks (contiguous per block), then this call's. */
    for (int t = 0; t < T; t++) {
        const size_t o = (size_t)t * H->lmax;
        for (int b0 = 0; b0 < len + t; b0 += bs) {
            const int nb = len + t - b0 < bs ? len + t - b0 : bs;
            const double *Gb = hk_kvbuf_G(H->arena, g, blocks, b0, h);
            for (int s = 0; s < nb; s++) {
                const float c = hk_gdn_decayf(w->Gt[t] - Gb[s]);
                w->CU[o + b0 + s] = c * w->KK[o + b0 + s];
                w->CO[o + b0 + s] = c * w->KQ[o + b0 + s];
            }
        }
    }

    int j0 = 0;
    for (; T == 1 && j0 + HK_KVBUF_JB <= g->dv; j0 += HK_KVBUF_JB)
        col_block_1(H, w, j0);
    for (; j0 < g->dv; j0 += HK_KVBUF_JB)
        col_block_any(H, w, j0,
                      g->dv - j0 < HK_KVBUF_JB ? g->dv - j0 : HK_KVBUF_JB);
}

void hk_kvbuf_step(float *o, float *arena, const hk_kvbuf_view_t *vw,
                   const float *q, const float *k, const float *v,
                   const float *gl, const float *beta, int R, int T,
                   const hk_kvbuf_geom_t *g, int lmax, float *scratch, int nth)
{
    assert(R >= 0 && T >= 1 && nth >= 1);
    assert(g->Hk > 0 && g->Hv % g->Hk == 0 && g->dk > 0 && g->dv > 0);
    assert(g->bs > 0 && g->bs <= 64 && lmax > 0);
    const int Hk = g->Hk, Hv = g->Hv, dk = g->dk, dv = g->dv, bs = g->bs;
    const int r_ = Hv / Hk;
    const size_t slot = step_slot(T, lmax);
    double work = 0.0;
    for (int r = 0; r < R; r++)
        work += (double)T * Hv *
                ((vw[r].S ? (double)dk * dv : 0.0) +
                 (vw[r].len + T) * (double)(dk + dv));

#pragma omp parallel for num_threads(nth)                                      \
    schedule(static) if (work >= HK_KVBUF_PAR_MIN)
    for (int it = 0; it < R * Hk; it++) {
        const int r = it / Hk, kh = it % Hk;
        const hk_kvbuf_view_t *V = &vw[r];
        const int len = V->len;
        step_ws_t w =
            step_ws(scratch + (size_t)omp_get_thread_num() * slot, T, lmax);
        const float *qr = q + (size_t)r * T * Hk * dk;
        const float *kr = k + (size_t)r * T * Hk * dk;
        assert(len >= 0 && len + T <= lmax);

        /* 1. the new keys into their block columns. */
        for (int t = 0; t < T; t++) {
            float *K =
                block_keys(arena, g, V->blocks, len + t, kh) + (len + t) % bs;
            const float *kt = kr + ((size_t)t * Hk + kh) * dk;
            for (int e = 0; e < dk; e++)
                K[(size_t)e * bs] = kt[e];
        }

        /* 2. key/key and key/query products up to and including the
         * token's own entry. */
        for (int t = 0; t < T; t++) {
            const float *kt = kr + ((size_t)t * Hk + kh) * dk;
            const float *qt = qr + ((size_t)t * Hk + kh) * dk;
            float *kk = w.KK + (size_t)t * lmax, *kq = w.KQ + (size_t)t * lmax;
            const int n = len + t + 1;
            for (int b0 = 0; b0 < n; b0 += bs) {
                const int nb = n - b0 < bs ? n - b0 : bs;
                const float *K = block_keys(arena, g, V->blocks, b0, kh);
                if (bs == 16)
                    block_dots(kk + b0, kq + b0, K, kt, qt, nb, 16, dk);
                else if (bs == 32)
                    block_dots(kk + b0, kq + b0, K, kt, qt, nb, 32, dk);
                else if (bs == 64)
                    block_dots(kk + b0, kq + b0, K, kt, qt, nb, 64, dk);
                else
                    block_dots_any(kk + b0, kq + b0, K, kt, qt, nb, bs, dk);
            }
        }

        /* 3. the value heads of the group. */
        for (int j = 0; j < r_; j++) {
            const int h = kh * r_ + j;
            head_t H = {arena,
                        g,
                        V,
                        qr,
                        kr,
                        v + (size_t)r * T * Hv * dv,
                        beta + (size_t)r * T * Hv,
                        o + (size_t)r * T * Hv * dv,
                        h,
                        kh,
                        T,
                        lmax};
            step_head(&H, &w, gl + (size_t)r * T * Hv);
        }
    }
}

void hk_kvbuf_flush(float *arena, const hk_kvbuf_view_t *vw, const int *n,
                    int R, const hk_kvbuf_geom_t *g, float *scratch, int nth)
{
    assert(R >= 0 && nth >= 1 && g->bs > 0);
    const int Hv = g->Hv, dk = g->dk, dv = g->dv, bs = g->bs;
    const int r_ = g->Hv / g->Hk;
    int nmax = 0;
    for (int r = 0; r < R; r++)
        nmax = n[r] > nmax ? n[r] : nmax;
    const size_t slot = flush_slot(g, nmax);
    double work = 0.0;
    for (int r = 0; r < R; r++)
        work += (double)n[r] * Hv * dk * dv;

#pragma omp parallel for num_threads(nth)                                      \
    schedule(static) if (work >= HK_KVBUF_PAR_MIN)
    for (int it = 0; it < R * Hv; it++) {
        const int r = it / Hv, h = it % Hv, m = n[r];
        if (m <= 0)
            continue;
        const hk_kvbuf_view_t *V = &vw[r];
        assert(V->S != NULL);
        float *A = scratch + (size_t)omp_get_thread_num() * slot; /* [dk,m] */
        float *Wg = A + (size_t)m * dk;
        const double Gn = *hk_kvbuf_G(arena, g, V->blocks, m - 1, h);
        float c[64];

        /* A = Ktilde^T: block key columns scaled by e^{G_n - G_i}. */
        for (int b0 = 0; b0 < m; b0 += bs) {
            const int nb = m - b0 < bs ? m - b0 : bs;
            const double *Gb = hk_kvbuf_G(arena, g, V->blocks, b0, h);
            const float *K = block_keys(arena, g, V->blocks, b0, h / r_);
            for (int s = 0; s < nb; s++)
                c[s] = hk_gdn_decayf(Gn - Gb[s]);
            for (int e = 0; e < dk; e++) {
                const float *restrict Ke = K + (size_t)e * bs;
                float *restrict Ae = A + (size_t)e * m + b0;
                for (int s = 0; s < nb; s++)
                    Ae[s] = c[s] * Ke[s];
            }
        }
        /* Within one block head h's w rows are already a [m, dv] matrix. */
        const float *W = hk_kvbuf_w(arena, g, V->blocks, 0, h);
        if (m > bs) {
            for (int b0 = 0; b0 < m; b0 += bs) {
                const int nb = m - b0 < bs ? m - b0 : bs;
                memcpy(Wg + (size_t)b0 * dv,
                       hk_kvbuf_w(arena, g, V->blocks, b0, h),
                       (size_t)nb * dv * sizeof(float));
            }
            W = Wg;
        }
        /* OpenBLAS's OpenMP build sizes a call from omp_get_max_threads()
         * when it is not inside an active parallel region (this loop runs
         * inactive for small work): make it single-threaded, as hk_matmul
         * does (the ICV is per task and restored at once). */
        const int saved = omp_get_max_threads();
        omp_set_num_threads(1);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, dk, dv, m, 1.0f,
                    A, m, W, dv, hk_gdn_decay(Gn), V->S + (size_t)h * dk * dv,
                    dv);
        omp_set_num_threads(saved);
    }
}

void hk_kvbuf_conv_commit(float *state, const float *x, int m, int C, int K)
{
    assert(m >= 0 && C > 0 && K >= 1);
    const int S = K - 1;
    for (int c = 0; c < C; c++) {
        float *st = state + (size_t)c * S;
        /* tau indexes x; tau < 0 is the old history, read at i + m > i, so
         * a forward pass never reads an overwritten value. */
        for (int i = 0; i < S; i++) {
            int tau = m - S + i;
            st[i] = tau < 0 ? st[i + m] : x[(size_t)tau * C + c];
        }
    }
}
