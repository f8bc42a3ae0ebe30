/*
 * hk_kvbuf.cu - CUDA twin of hk_kvbuf.c: the KVBuffer's chunkwise step
 * (decode, draft verification, KV-only prompt pieces), the rank-n flush
 * and the conv-history commit. Math and block layout: hk_kvbuf.h. Two
 * sets of kernels: v1 (below; every T) and v2 (further down: the decode
 * step, T = 1, and the flush as streaming kernels), picked by
 * hk_cuda_kvbuf_step_ex / _flush_ex.
 *
 * v1 step: one block of 8 warps per (value head, request), four phases.
 *   0. G_t in double by one thread (the CPU's order), the tokens' q and k
 *      of the key head staged in shared memory; the group's first value
 *      head writes the new keys into their block columns. The other value
 *      heads never read those columns in this launch: entries >= len take
 *      their keys from the staged inputs, so no block waits for another.
 *   1. Coefficients, one thread per (token, entry): the k_i.k_t and
 *      k_i.q_t dot products (serial over dk, as the CPU's vertical sums),
 *      times e^{G_t - G_i}, into CU, CO [T, lmax] in shared memory.
 *   2. For tiles of 4 tokens, one pass over S0 and one over the entries
 *      buffered before the call: warp w takes rows w, w+8, ... of S0 and
 *      entries w, w+8, ...; lane l columns l + 32c (or 4 adjacent columns
 *      per 128 as float4 when dv is a multiple of 128), so every warp load
 *      is a contiguous row segment. S0^T k_t, S0^T q_t are scaled by
 *      e^{G_t} before the entries' terms are added; the 8 warps' partials
 *      are summed into U, O [T, dv] in warp order (deterministic).
 *   3. In token order, one thread per column: the terms of this call's
 *      earlier entries (w written by the same thread a token before, so no
 *      barrier), w_t = beta_t (v_t - u), o_t = O + self w_t.
 * S0 is read once per 4 tokens (once per decode step), each buffered
 * entry once per 4 tokens per value head (keys per value head too: the
 * group's heads read them through L2).
 *
 * v1 flush: one block per (value head, request, 16 rows of S): the scaled key
 * tile Ktilde^T [16, 64 entries] in shared memory, w rows streamed, S read
 * and written once: S <- e^{G_n} S + Ktilde^T W.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/common/gdn_math.h"
#include "kernels/cuda/hk_cuda_impl.h"

#define HK_KB_THREADS 256
#define HK_KB_WARPS   (HK_KB_THREADS / 32)
#define HK_KB_TT      4  /* tokens per pass over S0 and the entries */
#define HK_KF_ROWS    16 /* rows of S per flush block: 2 per warp */
#define HK_KF_TILE    64 /* entries per staged Ktilde tile */

/* Where entry i of a view lives. */
struct hk_kb_at {
    float *arena;
    const int *blocks;
    size_t bf, ow, oG; /* block floats, offsets of W and G */
    int bs, dk, dv, Hv;

    __device__ float *base(int i) const
    {
        return arena + (size_t)blocks[i / bs] * bf;
    }
    /* key head kh's key of entry i: dk values at stride bs */
    __device__ float *key(int i, int kh) const
    {
        return base(i) + (size_t)kh * dk * bs + i % bs;
    }
    __device__ float *w(int i, int h) const
    {
        return base(i) + ow + ((size_t)h * bs + i % bs) * dv;
    }
    __device__ double *G(int i, int h) const
    {
        return reinterpret_cast<double *>(base(i) + oG) + (size_t)h * bs +
               i % bs;
    }
};

static __device__ hk_kb_at hk_kb_view(float *arena, const hk_kvbuf_view_t &V,
                                      const hk_kvbuf_geom_t &g)
{
    hk_kb_at a;
    a.arena = arena;
    a.blocks = V.blocks;
    a.bf = hk_kvbuf_layout_floats(&g);
    a.ow = hk_kvbuf_off_w(&g);
    a.oG = hk_kvbuf_off_G(&g);
    a.bs = g.bs;
    a.dk = g.dk;
    a.dv = g.dv;
    a.Hv = g.Hv;
    return a;
}

/* The phases a multi-token step shares (v1, v2's verification), each run
 * by one block of nth threads.
 * Phase 0: G_t = G_{t-1} + g_t in double by thread 0 (the CPU's order),
 * into Gt [T] and the entries when wG; e^{G_t} into eG [T]; the tokens' k
 * and q of key head kh staged in ks, qs [T][dk]; the new keys written into
 * their block columns when wkey (the group's first value head: the other
 * heads take entries >= len from the staged keys, so no block waits for
 * another). */
static __device__ void hk_kb_stage_tokens(double *Gt, float *eG, float *ks,
                                          float *qs, const hk_kb_at &at,
                                          const float *q, const float *k,
                                          const float *gl, size_t row0, int len,
                                          int T, int h, int kh, int Hk, bool wG,
                                          bool wkey, int nth)
{
    const int tid = threadIdx.x, dk = at.dk;
    if (tid == 0) {
        double G = len > 0 ? *at.G(len - 1, h) : 0.0;
        for (int t = 0; t < T; t++) {
            G += (double)gl[(row0 + t) * at.Hv + h];
            Gt[t] = G;
            eG[t] = hk_gdn_decay(G);
            if (wG)
                *at.G(len + t, h) = G;
        }
    }
    for (int x = tid; x < T * dk; x += nth) {
        const int t = x / dk, e = x % dk;
        const size_t src = ((row0 + t) * Hk + kh) * dk + e;
        ks[x] = k[src];
        qs[x] = q[src];
        if (wkey)
            at.key(len + t, kh)[(size_t)e * at.bs] = k[src];
    }
}

/* Phase 1: the coefficients of every (token t, entry i <= len + t: a later
 * draft is masked) into CU, CO [T][ld]: k_i.k_t and k_i.q_t serial over dk
 * (the CPU's vertical sums; entries >= len from the staged keys) times
 * e^{G_t - G_i}; the token's own entry, undecayed, in CO only. Gb: the
 * buffered entries' G staged in shared memory, or NULL (from the arena). */
static __device__ void hk_kb_coefs(float *CU, float *CO, int ld,
                                   const float *ks, const float *qs,
                                   const double *Gt, const double *Gb,
                                   const hk_kb_at &at, int len, int T, int h,
                                   int kh, int nth)
{
    const int n = len + T, dk = at.dk, bs = at.bs;
    for (int x = threadIdx.x; x < T * n; x += nth) {
        const int t = x / n, i = x % n;
        if (i > len + t)
            continue;
        const float *kt = ks + (size_t)t * dk, *qt = qs + (size_t)t * dk;
        float kk = 0.0f, kq = 0.0f;
        if (i < len) {
            const float *K = at.key(i, kh);
#pragma unroll 4
            for (int e = 0; e < dk; e++) {
                const float ke = K[(size_t)e * bs];
                kk += ke * kt[e];
                kq += ke * qt[e];
            }
        } else {
            const float *K = ks + (size_t)(i - len) * dk;
#pragma unroll 4
            for (int e = 0; e < dk; e++) {
                kk += K[e] * kt[e];
                kq += K[e] * qt[e];
            }
        }
        if (i == len + t) { /* the token's own entry: no decay */
            CO[(size_t)t * ld + i] = kq;
            continue;
        }
        const double Gi = i < len ? (Gb ? Gb[i] : *at.G(i, h)) : Gt[i - len];
        const float c = hk_gdn_decayf(Gt[t] - Gi);
        CU[(size_t)t * ld + i] = c * kk;
        CO[(size_t)t * ld + i] = c * kq;
    }
}

/* Phase 3, one thread's column (col of U, O [T][ldu], j of the head's dv)
 * in token order: U, O hold e^{G_t} S0^T k_t + the buffered entries' terms
 * (S0^T q_t ...); this call's earlier entries are added (their w kept in
 * U's slots of the tokens before, by this thread), then
 * w_t = beta_t (v_t - u) into the arena and o_t = O + (k_t.q_t) w_t. */
static __device__ void hk_kb_tokens(float *U, const float *O, int ldu, int col,
                                    int j, const float *CU, const float *CO,
                                    int ld, const hk_kb_at &at, const float *v,
                                    const float *beta, float *o, size_t row0,
                                    int len, int T, int h)
{
    const int Hv = at.Hv, dv = at.dv;
    for (int t = 0; t < T; t++) {
        const float *cu = CU + (size_t)t * ld, *co = CO + (size_t)t * ld;
        float u = U[(size_t)t * ldu + col], oa = O[(size_t)t * ldu + col];
        for (int i = len; i < len + t; i++) {
            const float wi = U[(size_t)(i - len) * ldu + col];
            u += cu[i] * wi;
            oa += co[i] * wi;
        }
        const size_t row = (row0 + t) * Hv + h;
        const float wt = beta[row] * (v[row * dv + j] - u);
        U[(size_t)t * ldu + col] = wt;
        at.w(len + t, h)[j] = wt;
        o[row * dv + j] = oa + co[len + t] * wt;
    }
}

/* Column of lane's c-th value: lane + 32c, or with VEC 4 adjacent columns
 * per 128 (dv a multiple of 128). */
template <bool VEC>
static __device__ __forceinline__ int hk_kb_col(int lane, int c)
{
    return VEC ? (c >> 2) * 128 + lane * 4 + (c & 3) : lane + 32 * c;
}

/* The lane's CPT values of a row of dv floats (0 past dv). */
template <int CPT, bool VEC>
static __device__ __forceinline__ void
hk_kb_row(float (&x)[CPT], const float *row, int lane, int dv)
{
    if (VEC) {
#pragma unroll
        for (int c4 = 0; c4 < CPT / 4; c4++) {
            const float4 f =
                *reinterpret_cast<const float4 *>(row + c4 * 128 + lane * 4);
            x[4 * c4] = f.x;
            x[4 * c4 + 1] = f.y;
            x[4 * c4 + 2] = f.z;
            x[4 * c4 + 3] = f.w;
        }
    } else {
#pragma unroll
        for (int c = 0; c < CPT; c++) {
            const int j = lane + 32 * c;
            x[c] = j < dv ? row[j] : 0.0f;
        }
    }
}

/* Shared memory of the step, in bytes: Gt [T] doubles, then eG [T], ks,
 * qs [T, dk], CU, CO [T, lmax], U, O [T, dv] floats. */
static size_t hk_kb_smem(int T, int dk, int dv, int lmax)
{
    return 8 * (size_t)T +
           4 * (size_t)T * (1 + 2 * (size_t)dk + 2 * (size_t)lmax + 2 * dv);
}

/* 4 blocks per SM (64 registers) up to 4 values a lane, as before the
 * phases shared with v2's verification, which took it to 73-77. */
template <int CPT, bool VEC>
static __global__ void __launch_bounds__(HK_KB_THREADS, CPT <= 4 ? 4 : 1)
    hk_kvbuf_step_kernel(float *o,                  // [R*T, Hv, dv]
                         float *arena,              // blocks
                         const hk_kvbuf_view_t *vw, // [R]
                         const float *q,            // [R*T, Hk, dk]
                         const float *k,            // [R*T, Hk, dk]
                         const float *v,            // [R*T, Hv, dv]
                         const float *gl,           // [R*T, Hv]
                         const float *beta,         // [R*T, Hv]
                         int T, hk_kvbuf_geom_t g, int lmax)
{
    HK_DYNAMIC_SMEM(smem);
    const int h = blockIdx.x, r = blockIdx.y;
    const int Hk = g.Hk, Hv = g.Hv, dk = g.dk, dv = g.dv;
    const int kh = h / (Hv / Hk);
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const hk_kvbuf_view_t V = vw[r];
    const int len = V.len;
    const hk_kb_at at = hk_kb_view(arena, V, g);
    double *Gt = reinterpret_cast<double *>(smem);
    float *eG = reinterpret_cast<float *>(Gt + T);
    float *ks = eG + T, *qs = ks + (size_t)T * dk;
    float *CU = qs + (size_t)T * dk, *CO = CU + (size_t)T * lmax;
    float *U = CO + (size_t)T * lmax, *O = U + (size_t)T * dv;
    const size_t row0 = (size_t)r * T;

    /* 0. decays, the tokens' q and k, the new keys */
    hk_kb_stage_tokens(Gt, eG, ks, qs, at, q, k, gl, row0, len, T, h, kh, Hk,
                       true, h % (Hv / Hk) == 0, HK_KB_THREADS);
    __syncthreads();

    /* 1. coefficients of every (token, entry <= its own) */
    hk_kb_coefs(CU, CO, lmax, ks, qs, Gt, nullptr, at, len, T, h, kh,
                HK_KB_THREADS);
    __syncthreads();

    /* 2. S0 and the entries buffered before the call */
    const float *S = V.S ? V.S + (size_t)h * dk * dv : nullptr;
    for (int t0 = 0; t0 < T; t0 += HK_KB_TT) {
        const int nt = T - t0 < HK_KB_TT ? T - t0 : HK_KB_TT;
        float au[HK_KB_TT][CPT], ao[HK_KB_TT][CPT];
#pragma unroll
        for (int tt = 0; tt < HK_KB_TT; tt++)
#pragma unroll
            for (int c = 0; c < CPT; c++)
                au[tt][c] = ao[tt][c] = 0.0f;
        if (S) {
#pragma unroll 2
            for (int i = warp; i < dk; i += HK_KB_WARPS) {
                float s[CPT];
                hk_kb_row<CPT, VEC>(s, S + (size_t)i * dv, lane, dv);
#pragma unroll
                for (int tt = 0; tt < HK_KB_TT; tt++) {
                    if (tt < nt) {
                        const float kv = ks[(size_t)(t0 + tt) * dk + i];
                        const float qv = qs[(size_t)(t0 + tt) * dk + i];
#pragma unroll
                        for (int c = 0; c < CPT; c++) {
                            au[tt][c] += s[c] * kv;
                            ao[tt][c] += s[c] * qv;
                        }
                    }
                }
            }
#pragma unroll
            for (int tt = 0; tt < HK_KB_TT; tt++) {
                const float e = tt < nt ? eG[t0 + tt] : 0.0f;
#pragma unroll
                for (int c = 0; c < CPT; c++) {
                    au[tt][c] *= e;
                    ao[tt][c] *= e;
                }
            }
        }
        for (int i = warp; i < len; i += HK_KB_WARPS) {
            float w[CPT];
            hk_kb_row<CPT, VEC>(w, at.w(i, h), lane, dv);
#pragma unroll
            for (int tt = 0; tt < HK_KB_TT; tt++) {
                const float a = tt < nt ? CU[(size_t)(t0 + tt) * lmax + i] : 0;
                const float b = tt < nt ? CO[(size_t)(t0 + tt) * lmax + i] : 0;
                if (a != 0.0f || b != 0.0f) { /* else fully decayed */
#pragma unroll
                    for (int c = 0; c < CPT; c++) {
                        au[tt][c] += a * w[c];
                        ao[tt][c] += b * w[c];
                    }
                }
            }
        }
        for (int wp = 0; wp < HK_KB_WARPS; wp++) {
            if (warp == wp) {
#pragma unroll
                for (int tt = 0; tt < HK_KB_TT; tt++) {
#pragma unroll
                    for (int c = 0; c < CPT; c++) {
                        const int j = hk_kb_col<VEC>(lane, c);
                        if (tt < nt && j < dv) {
                            float *pu = U + (size_t)(t0 + tt) * dv + j;
                            float *po = O + (size_t)(t0 + tt) * dv + j;
                            *pu = wp ? *pu + au[tt][c] : au[tt][c];
                            *po = wp ? *po + ao[tt][c] : ao[tt][c];
                        }
                    }
                }
            }
            __syncthreads();
        }
    }

    /* 3. this call's entries, in token order, one thread per column */
    for (int j = tid; j < dv; j += HK_KB_THREADS)
        hk_kb_tokens(U, O, dv, j, j, CU, CO, lmax, at, v, beta, o, row0, len, T,
                     h);
}

template <int CPT>
static __global__ void __launch_bounds__(HK_KB_THREADS)
    hk_kvbuf_flush_kernel(float *arena, const hk_kvbuf_view_t *vw, const int *n,
                          hk_kvbuf_geom_t g)
{
    __shared__ float kt[HK_KF_ROWS][HK_KF_TILE];
    __shared__ float cs[HK_KF_TILE];
    const int h = blockIdx.x, r = blockIdx.y, e0 = blockIdx.z * HK_KF_ROWS;
    const int m = n[r];
    if (m <= 0)
        return; /* the whole block: no barrier is skipped by some */
    const int dk = g.dk, dv = g.dv, kh = h / (g.Hv / g.Hk);
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const hk_kvbuf_view_t V = vw[r];
    const hk_kb_at at = hk_kb_view(arena, V, g);
    const double Gn = *at.G(m - 1, h);
    float acc[2][CPT];
#pragma unroll
    for (int rr = 0; rr < 2; rr++)
#pragma unroll
        for (int c = 0; c < CPT; c++)
            acc[rr][c] = 0.0f;

    for (int b0 = 0; b0 < m; b0 += HK_KF_TILE) {
        const int nb = m - b0 < HK_KF_TILE ? m - b0 : HK_KF_TILE;
        if (tid < nb)
            cs[tid] = hk_gdn_decayf(Gn - *at.G(b0 + tid, h));
        __syncthreads();
        for (int x = tid; x < HK_KF_ROWS * HK_KF_TILE; x += HK_KB_THREADS) {
            const int row = x / HK_KF_TILE, s = x % HK_KF_TILE;
            const int e = e0 + row;
            kt[row][s] = s < nb && e < dk
                             ? cs[s] * at.key(b0 + s, kh)[(size_t)e * g.bs]
                             : 0.0f;
        }
        __syncthreads();
        for (int s = 0; s < nb; s++) {
            float w[CPT];
            hk_kb_row<CPT, false>(w, at.w(b0 + s, h), lane, dv);
#pragma unroll
            for (int rr = 0; rr < 2; rr++) {
                const float a = kt[2 * warp + rr][s];
#pragma unroll
                for (int c = 0; c < CPT; c++)
                    acc[rr][c] += a * w[c];
            }
        }
        __syncthreads();
    }
    const float eGn = hk_gdn_decay(Gn);
    float *Sh = V.S + (size_t)h * dk * dv;
#pragma unroll
    for (int rr = 0; rr < 2; rr++) {
        const int e = e0 + 2 * warp + rr;
        if (e >= dk)
            continue;
#pragma unroll
        for (int c = 0; c < CPT; c++) {
            const int j = lane + 32 * c;
            if (j < dv) {
                float *p = Sh + (size_t)e * dv + j;
                *p = eGn * *p + acc[rr][c];
            }
        }
    }
}

/* ---- v2: the decode step (T = 1) and the flush as streaming kernels ------
 * Both are bandwidth kernels over S (dk x dv f32 per value head): the step
 * reads it once, the flush reads and writes it once. One block of 256
 * threads per (slab of 4 NC4 columns, value head, request); thread t owns
 * the 4 adjacent columns 4 (t mod NC4) of the slab and the rows
 * t div NC4 + RG i (RG = 256 / NC4 row groups), so a warp's 16-byte loads
 * cover 4 NC4 * 4 contiguous bytes of a row. The rows come in passes of
 * 8 RG (8 float4 per thread, in registers: 80 registers, 3 blocks per
 * SM); the first pass's loads are issued before anything else,
 * so they are in flight while the block works out its small terms. NC4 is
 * 32, 16 or 8 (slabs of 128, 64, 32 columns; passes of 64, 128, 256
 * rows); by default 16 while that gives ~4 blocks per SM, else 8.
 *
 * Step: the entry terms are per (key head, request) and tiny (len <= cap
 * entries of dk floats), so every block recomputes them instead of waiting
 * for another. The block stages its slab of the buffered w's, their G's,
 * v_t's slab, k_t and q_t in shared memory; the keys of a buffer block are
 * one contiguous [dk, bs] matrix per key head, read as float4 (thread: 4
 * entries, a row); sums over a warp's lanes by shuffles, over the 8 warps
 * in warp order through shared memory (one barrier); each thread then
 * forms the coefficients of its own entries, e^{G_t - G_i} (k_i.k_t),
 * e^{G_t - G_i} (k_i.q_t). The
 * thread's S rows give e^{G_t} S0^T k_t, e^{G_t} S0^T q_t partials, its
 * entries i = rg + RG m add CU_i w_i, CO_i w_i; the row groups' partials
 * are added in order through shared memory (second barrier), and one
 * thread per column forms w_t and o_t. Slab 0 writes G_t, the group's
 * first value head's slab 0 the new key (as v1). T > 1 runs v1.
 *
 * Flush: S rows in registers, scaled by e^{G_n}, then Ktilde^T W added by
 * tiles of FT entries: the tile's scaled keys (this pass's rows) and its
 * w slab staged in shared memory, each thread adding its rows x columns.
 * Keys and w are read from L2 by every slab of a head; S once. */
#define HK_KV2_THREADS 256
#define HK_KV2_WARPS   (HK_KV2_THREADS / 32)
#define HK_KV2_RPT     8  /* rows of S a thread holds: a pass of 8 RG */
#define HK_KV2_FT      32 /* entries per flush tile */

/* The thread's RPT rows c0 + rg + RG i of the 4 columns at j (zeros past
 * dk, or for the whole thread when j is past dv or S is NULL). */
template <int RPT, int RG>
static __device__ __forceinline__ void
hk_kv2_load(float4 (&s)[RPT], const float *S, int c0, int rg, int j, int dk,
            int dv)
{
#pragma unroll
    for (int i = 0; i < RPT; i++) {
        const int e = c0 + rg + RG * i;
        s[i] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        if (S && j < dv && e < dk)
            s[i] = *reinterpret_cast<const float4 *>(S + (size_t)e * dv + j);
    }
}

static __device__ __forceinline__ void hk_kv2_fma(float4 &acc, float a,
                                                  const float4 &x)
{
    acc.x += a * x.x;
    acc.y += a * x.y;
    acc.z += a * x.z;
    acc.w += a * x.w;
}

/* Stages the slab of the buffered entries' w (columns j0 .. j0 + 4 NC4,
 * zeros past dv) in sw [len][4 NC4] and their G in sG [len]. */
template <int NC4>
static __device__ __forceinline__ void
hk_kv2_stage_entries(float *sw, double *sG, const hk_kb_at &at, int len, int h,
                     int j0)
{
    const int tid = threadIdx.x;
    for (int x = tid; x < len * NC4; x += HK_KV2_THREADS) {
        const int i = x / NC4, jj = j0 + 4 * (x % NC4);
        float4 w4 = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        if (jj < at.dv)
            w4 = *reinterpret_cast<const float4 *>(at.w(i, h) + jj);
        *reinterpret_cast<float4 *>(sw + (size_t)i * 4 * NC4 + 4 * (x % NC4)) =
            w4;
    }
    for (int i = tid; i < len; i += HK_KV2_THREADS)
        sG[i] = *at.G(i, h);
}

/* Shared memory of the step (bytes) beyond its static part, lp = lmax
 * rounded up to whole blocks: G_i [lp] doubles, the slab of w_i [lp][4 NC4],
 * the warps' partial key products 2 [8][lp], k_t, q_t [dk], v_t [4 NC4]. */
static size_t hk_kv2_smem(int lp, int nc4, int dk)
{
    return 8 * (size_t)lp +
           4 * ((size_t)lp * 4 * nc4 + 2 * HK_KV2_WARPS * (size_t)lp +
                2 * (size_t)dk + 4 * (size_t)nc4);
}

template <int NC4>
static __global__ void __launch_bounds__(HK_KV2_THREADS, 3)
    hk_kvbuf_step1_kernel(float *o,                  // [R, Hv, dv]
                          float *arena,              // blocks
                          const hk_kvbuf_view_t *vw, // [R]
                          const float *q,            // [R, Hk, dk]
                          const float *k,            // [R, Hk, dk]
                          const float *v,            // [R, Hv, dv]
                          const float *gl,           // [R, Hv]
                          const float *beta,         // [R, Hv]
                          hk_kvbuf_geom_t g, int lp)
{
    constexpr int RG = HK_KV2_THREADS / NC4, RPT = HK_KV2_RPT, CH = RG * RPT;
    constexpr int CW = 4 * NC4; /* columns of a slab */
    HK_DYNAMIC_SMEM(smem);
    __shared__ float4 red4[2][HK_KV2_THREADS]; /* float4: 16-byte aligned */
    __shared__ double sGt;
    __shared__ float sEG, sSelf, sBeta;
    const int slab = blockIdx.x, h = blockIdx.y, r = blockIdx.z;
    const int Hk = g.Hk, Hv = g.Hv, dk = g.dk, dv = g.dv, bs = g.bs;
    const int kh = h / (Hv / Hk);
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int cg = tid % NC4, rg = tid / NC4, j0 = slab * CW, j = j0 + 4 * cg;
    double *sG = reinterpret_cast<double *>(smem);
    float *sw = reinterpret_cast<float *>(sG + lp); /* 16-byte aligned */
    float *pk = sw + (size_t)lp * CW, *pq = pk + HK_KV2_WARPS * lp;
    float *ks = pq + HK_KV2_WARPS * lp, *qs = ks + dk, *vs = qs + dk;
    const hk_kvbuf_view_t V = vw[r];
    const int len = V.len;
    const hk_kb_at at = hk_kb_view(arena, V, g);
    const float *S = V.S ? V.S + (size_t)h * dk * dv : nullptr;
    const float *kt = k + (size_t)(r * Hk + kh) * dk;
    const float *qt = q + (size_t)(r * Hk + kh) * dk;
    const size_t row = (size_t)r * Hv + h;

    /* first the first pass of S, into registers */
    float4 s[RPT];
    hk_kv2_load<RPT, RG>(s, S, 0, rg, j, dk, dv);

    /* then the small inputs, staged in shared memory: the entries' w slab
     * and G, v_t's slab, k_t and q_t; the decay and self term; the new key
     * (the group's first value head, slab 0) and G_t (slab 0) */
    hk_kv2_stage_entries<NC4>(sw, sG, at, len, h, j0);
    if (tid < CW)
        vs[tid] = j0 + tid < dv ? v[row * dv + j0 + tid] : 0.0f;
    const bool writer = slab == 0 && h % (Hv / Hk) == 0;
    for (int e = tid; e < dk; e += HK_KV2_THREADS) {
        const float ke = kt[e];
        ks[e] = ke;
        qs[e] = qt[e];
        if (writer)
            at.key(len, kh)[(size_t)e * bs] = ke;
    }
    if (tid == 0) {
        const double Gt = (len > 0 ? *at.G(len - 1, h) : 0.0) + (double)gl[row];
        sGt = Gt;
        sEG = hk_gdn_decay(Gt);
        sBeta = beta[row];
        if (slab == 0)
            *at.G(len, h) = Gt;
    }
    if (warp == 1) {
        float kq = 0.0f;
        for (int e = lane; e < dk; e += 32)
            kq += kt[e] * qt[e];
        kq = hk_warp_sum(kq);
        if (lane == 0)
            sSelf = kq;
    }

    /* k_i.k_t, k_i.q_t of the buffered entries: per buffer block, thread
     * x4 = tid + 256 m takes the float4 at 4 x4 of the [dk, bs] keys, i.e.
     * row 4 x4 / bs and entries s0 .. s0 + 3, s0 = 4 tid mod bs (1024 is
     * a multiple of bs); lanes with the same s0 are summed by shuffles,
     * the warps in warp order after the barrier. */
    const int s0 = (4 * tid) % bs, nq4 = dk * bs / 4;
    for (int b = 0; b * bs < len; b++) {
        const float *K = at.key(b * bs, kh); /* [dk, bs] */
        float4 ak = make_float4(0.0f, 0.0f, 0.0f, 0.0f), aq = ak;
#pragma unroll 1
        for (int x4 = tid; x4 < nq4; x4 += HK_KV2_THREADS) {
            const float4 kv = *reinterpret_cast<const float4 *>(K + 4 * x4);
            const int e = 4 * x4 / bs;
            hk_kv2_fma(ak, kt[e], kv);
            hk_kv2_fma(aq, qt[e], kv);
        }
        for (int off = 16; off >= bs / 4; off >>= 1) {
            ak.x += __shfl_xor_sync(HK_FULL_MASK, ak.x, off);
            ak.y += __shfl_xor_sync(HK_FULL_MASK, ak.y, off);
            ak.z += __shfl_xor_sync(HK_FULL_MASK, ak.z, off);
            ak.w += __shfl_xor_sync(HK_FULL_MASK, ak.w, off);
            aq.x += __shfl_xor_sync(HK_FULL_MASK, aq.x, off);
            aq.y += __shfl_xor_sync(HK_FULL_MASK, aq.y, off);
            aq.z += __shfl_xor_sync(HK_FULL_MASK, aq.z, off);
            aq.w += __shfl_xor_sync(HK_FULL_MASK, aq.w, off);
        }
        if (lane < bs / 4) {
            float *dk_ = pk + (size_t)warp * lp + b * bs + s0;
            float *dq_ = pq + (size_t)warp * lp + b * bs + s0;
            dk_[0] = ak.x, dk_[1] = ak.y, dk_[2] = ak.z, dk_[3] = ak.w;
            dq_[0] = aq.x, dq_[1] = aq.y, dq_[2] = aq.z, dq_[3] = aq.w;
        }
    }
    __syncthreads();

    /* e^{G_t} S0^T k_t, e^{G_t} S0^T q_t over the thread's rows */
    float4 su = make_float4(0.0f, 0.0f, 0.0f, 0.0f), so = su;
    for (int c0 = 0; S && c0 < dk; c0 += CH) {
        if (c0 > 0)
            hk_kv2_load<RPT, RG>(s, S, c0, rg, j, dk, dv);
#pragma unroll
        for (int i = 0; i < RPT; i++) {
            const int e = min(c0 + rg + RG * i, dk - 1); /* zeros past dk */
            hk_kv2_fma(su, ks[e], s[i]);
            hk_kv2_fma(so, qs[e], s[i]);
        }
    }
    const float eG = sEG;
    su.x *= eG, su.y *= eG, su.z *= eG, su.w *= eG;
    so.x *= eG, so.y *= eG, so.z *= eG, so.w *= eG;

    /* the thread's entries i = rg + RG m: coefficients from the warps'
     * partials, times the staged w_i */
    const double Gt = sGt;
    for (int i = rg; i < len; i += RG) {
        float kk = 0.0f, kq = 0.0f;
        for (int w = 0; w < HK_KV2_WARPS; w++) {
            kk += pk[(size_t)w * lp + i];
            kq += pq[(size_t)w * lp + i];
        }
        const float c = hk_gdn_decayf(Gt - sG[i]);
        const float4 wi =
            *reinterpret_cast<const float4 *>(sw + (size_t)i * CW + 4 * cg);
        hk_kv2_fma(su, c * kk, wi);
        hk_kv2_fma(so, c * kq, wi);
    }
    red4[0][rg * NC4 + cg] = su;
    red4[1][rg * NC4 + cg] = so;
    __syncthreads();

    /* one thread per column: the row groups in order, then w_t and o_t */
    if (tid < CW && j0 + tid < dv) {
        const float *ru = reinterpret_cast<const float *>(red4[0]);
        const float *ro = reinterpret_cast<const float *>(red4[1]);
        float u = 0.0f, oa = 0.0f;
        for (int x = 0; x < RG; x++) {
            u += ru[(size_t)x * CW + tid];
            oa += ro[(size_t)x * CW + tid];
        }
        const float wt = sBeta * (vs[tid] - u);
        at.w(len, h)[j0 + tid] = wt;
        o[row * dv + j0 + tid] = oa + sSelf * wt;
    }
}

/* ---- v2 verification: T > 1 tokens per request ------------------------
 * The decode step's blocks (slab of 4 NC4 columns, value head, request)
 * and S layout (thread: 4 columns, rows rg + RG i, RPT float4 a pass, the
 * first pass's loads issued first), for all T tokens: each pass of S rows
 * stays in registers while the tokens go by in tiles of TT, so S0's slab
 * is read once whatever T is. Per tile the thread's partials of
 * e^{G_t} S0^T k_t, e^{G_t} S0^T q_t (and, on the first pass, of its
 * buffered entries i = rg + RG m: CU[t][i] w_i, CO[t][i] w_i) are summed
 * over the row groups in order through shared memory into U, O [T][CW].
 * The coefficients are v1's: one thread per (token, entry <= its own),
 * k_i.k_t, k_i.q_t serial over dk (entries >= len from the staged inputs,
 * the same causal mask), times e^{G_t - G_i}. Last, one thread per column
 * in token order adds this call's earlier entries (its own w's, kept in
 * U's slots) and forms w_t, o_t, as v1's phase 3. A kernel of its own
 * rather than the step's body with T = 1: the step gets its key products
 * from all 256 threads over dk (one token has too few (token, entry)
 * pairs to fill the block), and one row-group sum. */
#define HK_KV2_TT 4 /* tokens a tile: 2 T accumulators of float4 */

/* Dynamic shared memory of the verification (bytes): Gt [T], G_i [lp]
 * doubles (an even count: 16-byte aligned floats after them), then the
 * slab of w_i [lp][CW], U, O [T][CW], CU, CO [T][lp], k_t, q_t [T][dk],
 * e^{G_t} [T] floats. */
static size_t hk_kv2v_smem(int T, int lp, int nc4, int dk)
{
    const size_t cw = 4 * (size_t)nc4;
    return 8 * (size_t)((T + lp + 1) & ~1) +
           4 * ((size_t)lp * cw + 2 * (size_t)T * cw + 2 * (size_t)T * lp +
                2 * (size_t)T * dk + (size_t)T);
}

template <int NC4, int TT>
static __global__ void __launch_bounds__(HK_KV2_THREADS, 2)
    hk_kvbuf_verify2_kernel(float *o,                  // [R*T, Hv, dv]
                            float *arena,              // blocks
                            const hk_kvbuf_view_t *vw, // [R]
                            const float *q,            // [R*T, Hk, dk]
                            const float *k,            // [R*T, Hk, dk]
                            const float *v,            // [R*T, Hv, dv]
                            const float *gl,           // [R*T, Hv]
                            const float *beta,         // [R*T, Hv]
                            int T, hk_kvbuf_geom_t g, int lp)
{
    constexpr int RG = HK_KV2_THREADS / NC4, RPT = HK_KV2_RPT, CH = RG * RPT;
    constexpr int CW = 4 * NC4;
    HK_DYNAMIC_SMEM(smem);
    __shared__ float4 red4[2][TT][HK_KV2_THREADS];
    const int slab = blockIdx.x, h = blockIdx.y, r = blockIdx.z;
    const int Hk = g.Hk, Hv = g.Hv, dk = g.dk, dv = g.dv;
    const int kh = h / (Hv / Hk);
    const int tid = threadIdx.x;
    const int cg = tid % NC4, rg = tid / NC4, j0 = slab * CW, j = j0 + 4 * cg;
    const hk_kvbuf_view_t V = vw[r];
    const int len = V.len;
    const hk_kb_at at = hk_kb_view(arena, V, g);
    const float *S = V.S ? V.S + (size_t)h * dk * dv : nullptr;
    const size_t row0 = (size_t)r * T;
    double *Gt = reinterpret_cast<double *>(smem), *sG = Gt + T;
    float *sw = reinterpret_cast<float *>(Gt + ((T + lp + 1) & ~1));
    float *U = sw + (size_t)lp * CW, *O = U + (size_t)T * CW;
    float *CU = O + (size_t)T * CW, *CO = CU + (size_t)T * lp;
    float *ks = CO + (size_t)T * lp, *qs = ks + (size_t)T * dk;
    float *eG = qs + (size_t)T * dk;

    /* first the first pass of S, into registers */
    float4 s[RPT];
    hk_kv2_load<RPT, RG>(s, S, 0, rg, j, dk, dv);

    /* the small inputs: the buffered entries' w slab and G, the tokens'
     * k and q (the group's first value head, slab 0, writes the new
     * keys), G_t in double by one thread (slab 0 writes them) */
    hk_kv2_stage_entries<NC4>(sw, sG, at, len, h, j0);
    hk_kb_stage_tokens(Gt, eG, ks, qs, at, q, k, gl, row0, len, T, h, kh, Hk,
                       slab == 0, slab == 0 && h % (Hv / Hk) == 0,
                       HK_KV2_THREADS);
    __syncthreads();

    /* coefficients of every (token t, entry i <= len + t) */
    hk_kb_coefs(CU, CO, lp, ks, qs, Gt, sG, at, len, T, h, kh, HK_KV2_THREADS);
    __syncthreads();

    /* S0 (pass by pass, each pass held for every tile of tokens) and the
     * buffered entries (first pass), summed over the row groups in order */
    const int passes = S ? HK_CEIL_DIV(dk, CH) : 1;
    for (int p = 0; p < passes; p++) {
        const int c0 = p * CH;
        if (p > 0)
            hk_kv2_load<RPT, RG>(s, S, c0, rg, j, dk, dv);
        for (int t0 = 0; t0 < T; t0 += TT) {
            float4 su[TT], so[TT];
#pragma unroll
            for (int tt = 0; tt < TT; tt++) {
                su[tt] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
                so[tt] = su[tt];
            }
            if (S) {
#pragma unroll
                for (int i = 0; i < RPT; i++) {
                    const int e = min(c0 + rg + RG * i, dk - 1); /* 0 past */
#pragma unroll
                    for (int tt = 0; tt < TT; tt++) {
                        const int t = min(t0 + tt, T - 1); /* unused past T */
                        hk_kv2_fma(su[tt], ks[(size_t)t * dk + e], s[i]);
                        hk_kv2_fma(so[tt], qs[(size_t)t * dk + e], s[i]);
                    }
                }
#pragma unroll
                for (int tt = 0; tt < TT; tt++) {
                    const float e = eG[min(t0 + tt, T - 1)];
                    su[tt].x *= e, su[tt].y *= e, su[tt].z *= e, su[tt].w *= e;
                    so[tt].x *= e, so[tt].y *= e, so[tt].z *= e, so[tt].w *= e;
                }
            }
            for (int i = rg; p == 0 && i < len; i += RG) {
                const float4 wi = *reinterpret_cast<const float4 *>(
                    sw + (size_t)i * CW + 4 * cg);
#pragma unroll
                for (int tt = 0; tt < TT; tt++) {
                    const size_t ti = (size_t)min(t0 + tt, T - 1) * lp + i;
                    hk_kv2_fma(su[tt], CU[ti], wi);
                    hk_kv2_fma(so[tt], CO[ti], wi);
                }
            }
#pragma unroll
            for (int tt = 0; tt < TT; tt++) {
                red4[0][tt][tid] = su[tt];
                red4[1][tt][tid] = so[tt];
            }
            __syncthreads();
            for (int x = tid; x < 2 * TT * CW; x += HK_KV2_THREADS) {
                const int qn = x / (TT * CW), tt = x / CW % TT, jj = x % CW;
                if (t0 + tt >= T)
                    continue;
                const float *rd =
                    reinterpret_cast<const float *>(red4[qn][tt]) + jj;
                float sum = 0.0f;
                for (int y = 0; y < RG; y++)
                    sum += rd[(size_t)y * CW];
                float *dst = (qn ? O : U) + (size_t)(t0 + tt) * CW + jj;
                *dst = p ? *dst + sum : sum;
            }
            __syncthreads(); /* red4 is rewritten by the next tile */
        }
    }

    /* one thread per column, in token order: this call's earlier entries,
     * then w_t and o_t */
    if (tid < CW && j0 + tid < dv)
        hk_kb_tokens(U, O, CW, tid, j0 + tid, CU, CO, lp, at, v, beta, o, row0,
                     len, T, h);
}

template <int NC4>
static __global__ void __launch_bounds__(HK_KV2_THREADS, 3)
    hk_kvbuf_flush2_kernel(float *arena, const hk_kvbuf_view_t *vw,
                           const int *n, hk_kvbuf_geom_t g)
{
    constexpr int RG = HK_KV2_THREADS / NC4, RPT = HK_KV2_RPT, CH = RG * RPT;
    /* Ktilde^T of a tile, this pass's rows (odd stride: the row groups of
     * a warp hit different banks), and the tile's w slab */
    __shared__ float kt[CH][HK_KV2_FT + 1];
    __shared__ float4 ws[HK_KV2_FT][NC4];
    const int slab = blockIdx.x, h = blockIdx.y, r = blockIdx.z;
    const int m = n[r];
    if (m <= 0)
        return; /* the whole block: no barrier is skipped by some */
    const int dk = g.dk, dv = g.dv, bs = g.bs, kh = h / (g.Hv / g.Hk);
    const int tid = threadIdx.x, lane = tid & 31;
    const int cg = tid % NC4, rg = tid / NC4, j = slab * 4 * NC4 + 4 * cg;
    const hk_kvbuf_view_t V = vw[r];
    const hk_kb_at at = hk_kb_view(arena, V, g);
    float *Sh = V.S + (size_t)h * dk * dv;
    const double Gn = *at.G(m - 1, h);

    for (int c0 = 0; c0 < dk; c0 += CH) {
        float4 s[RPT];
        hk_kv2_load<RPT, RG>(s, Sh, c0, rg, j, dk, dv);
        for (int b0 = 0; b0 < m; b0 += HK_KV2_FT) {
            const int nb = m - b0 < HK_KV2_FT ? m - b0 : HK_KV2_FT;
            /* thread: entry b0 + lane, rows tid / 32 + 8 x */
            const float cs =
                lane < nb ? hk_gdn_decayf(Gn - *at.G(b0 + lane, h)) : 0.0f;
            const float *K = lane < nb ? at.key(b0 + lane, kh) : nullptr;
            for (int er = tid / 32; er < CH; er += HK_KV2_WARPS)
                kt[er][lane] =
                    K && c0 + er < dk ? cs * K[(size_t)(c0 + er) * bs] : 0.0f;
            for (int x = tid; x < HK_KV2_FT * NC4; x += HK_KV2_THREADS) {
                const int se = x / NC4, jj = slab * 4 * NC4 + 4 * (x % NC4);
                float4 w4 = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
                if (se < nb && jj < dv)
                    w4 = *reinterpret_cast<const float4 *>(at.w(b0 + se, h) +
                                                           jj);
                ws[se][x % NC4] = w4;
            }
            __syncthreads();
            if (b0 == 0) {
                const float e = hk_gdn_decay(Gn);
#pragma unroll
                for (int i = 0; i < RPT; i++) {
                    s[i].x *= e, s[i].y *= e, s[i].z *= e, s[i].w *= e;
                }
            }
            for (int se = 0; se < nb; se++) {
                const float4 w4 = ws[se][cg];
#pragma unroll
                for (int i = 0; i < RPT; i++)
                    hk_kv2_fma(s[i], kt[rg + RG * i][se], w4);
            }
            __syncthreads(); /* kt, ws are restaged next tile */
        }
        if (j < dv) {
#pragma unroll
            for (int i = 0; i < RPT; i++) {
                const int e = c0 + rg + RG * i;
                if (e < dk)
                    *reinterpret_cast<float4 *>(Sh + (size_t)e * dv + j) = s[i];
            }
        }
    }
}

/* One thread per channel, the CPU's loop: old history read at i + m > i
 * before it is overwritten. */
static __global__ void hk_kvbuf_conv_commit_kernel(float *state, const float *x,
                                                   int m, int C, int K)
{
    const int S = K - 1;
    HK_GRID_STRIDE(c, (size_t)C)
    {
        float *st = state + c * S;
        for (int i = 0; i < S; i++) {
            const int tau = m - S + i;
            st[i] = tau < 0 ? st[i + m] : x[(size_t)tau * C + c];
        }
    }
}

/* Values per lane for dv columns: 1, 2, 4 or 8. */
static int hk_kb_cpt(int dv)
{
    const int c = (dv + 31) / 32;
    return c <= 1 ? 1 : c <= 2 ? 2 : c <= 4 ? 4 : 8;
}

static bool hk_kb_geom_ok(const hk_kvbuf_geom_t *g)
{
    return g && g->Hk >= 1 && g->Hv >= 1 && g->Hv % g->Hk == 0 && g->dk >= 1 &&
           g->dv >= 1 && g->dv <= HK_CUDA_KVBUF_MAX_DV && g->bs >= 1 &&
           g->bs <= 64;
}

/* v2 runs: dv a multiple of 4, bs a power of two in [4, 64] (the key
 * products' float4 lanes), 16-byte aligned arena, v and o (states too:
 * the caller's, hk_cuda.h). */
static bool hk_kv2_ok(const hk_kvbuf_geom_t *g, const void *arena,
                      const void *a, const void *b)
{
    const int bs = g->bs;
    return g->dv % 4 == 0 && bs >= 4 && bs <= 64 && (bs & (bs - 1)) == 0 &&
           ((uintptr_t)arena | (uintptr_t)a | (uintptr_t)b) % 16 == 0;
}

/* DEFAULT kernels: HYPIC_CUDA_KVBUF=v1 picks the first ones, v2 the
 * streaming ones by name (a call they cannot take is an error, not v1:
 * the tests' way to prove the engine runs them), else v2 where it
 * applies (read once). */
static unsigned hk_kv_resolve(unsigned flags)
{
    static const char *const names[] = {"v1", "v2"};
    static const int values[] = {HK_CUDA_KVBUF_V1, HK_CUDA_KVBUF_V2};
    static const unsigned env =
        (unsigned)hk_env_choice("HYPIC_CUDA_KVBUF", names, values, 2, 0);
    return flags ? flags : env;
}

/* v2's float4 columns per block row: the flags' slab; else, for a step
 * (T = 1), 128 columns once that gives a block per SM, else 32; for a
 * verification 64 columns (a pass covers 128 rows) while that gives >= 4
 * blocks per SM, else 32 (more blocks for small batches, and for dv <=
 * 32). The step's rule is the H100's (session 11's run: CW128 0.0215 /
 * 0.0535 / 0.1725 ms at B = 16 / 64 / 256 against 0.0308 / 0.0661 /
 * 0.2144 for the old rule's; CW32 best at B = 1). */
static int hk_kv2_nc4(unsigned flags, int Hv, int R, int T, int dv)
{
    switch (flags & HK_CUDA_KVBUF_CW_MASK) {
    case HK_CUDA_KVBUF_CW128:
        return 32;
    case HK_CUDA_KVBUF_CW64:
        return 16;
    case HK_CUDA_KVBUF_CW32:
        return 8;
    default:
        break;
    }
    const int sms = hk_cuda_sm_count(1);
    if (dv <= 32)
        return 8;
    if (T == 1)
        return (long long)Hv * R * HK_CEIL_DIV(dv, 128) >= sms ? 32 : 8;
    const long long blocks = (long long)Hv * R * HK_CEIL_DIV(dv, 64);
    return blocks >= 4LL * sms ? 16 : 8;
}

/* Flags the launchers take (hk_cuda.h); EINVAL for unknown bits. */
static bool hk_kv_flags_ok(unsigned flags)
{
    return (flags & ~HK_CUDA_KVBUF_FLAGS) == 0 &&
           !((flags & HK_CUDA_KVBUF_V1) &&
             (flags & (HK_CUDA_KVBUF_V2 | HK_CUDA_KVBUF_CW_MASK)));
}

static int hk_kvbuf_step_v1(float *o, float *arena, const hk_kvbuf_view_t *vw,
                            const float *q, const float *k, const float *v,
                            const float *gl, const float *beta, int R, int T,
                            const hk_kvbuf_geom_t *g, int lmax, cudaStream_t s)
{
    const size_t sm = hk_kb_smem(T, g->dk, g->dv, lmax);
    if (sm > (size_t)hk_cuda_smem_optin())
        return HK_CUDA_EINVAL;
    const dim3 grid(g->Hv, R);
    const bool vec = g->dv % 128 == 0;
#define HK_KB_STEP(CPT, VEC)                                                   \
    do {                                                                       \
        if (sm > 48 * 1024)                                                    \
            cudaFuncSetAttribute(hk_kvbuf_step_kernel<CPT, VEC>,               \
                                 cudaFuncAttributeMaxDynamicSharedMemorySize,  \
                                 (int)sm);                                     \
        hk_kvbuf_step_kernel<CPT, VEC><<<grid, HK_KB_THREADS, sm, s>>>(        \
            o, arena, vw, q, k, v, gl, beta, T, *g, lmax);                     \
    } while (0)
    switch (hk_kb_cpt(g->dv)) {
    case 1:
        HK_KB_STEP(1, false);
        break;
    case 2:
        HK_KB_STEP(2, false);
        break;
    case 4:
        if (vec)
            HK_KB_STEP(4, true);
        else
            HK_KB_STEP(4, false);
        break;
    default:
        if (vec)
            HK_KB_STEP(8, true);
        else
            HK_KB_STEP(8, false);
        break;
    }
#undef HK_KB_STEP
    return hk_cuda_check_launch();
}

/* v2's shared memory for T tokens (the static part included), lp = lmax
 * rounded up to whole blocks. */
static size_t hk_kv2_step_bytes(int T, int lp, int nc4, int dk)
{
    if (T == 1) /* 8 KB of row-group partials and the scalars */
        return hk_kv2_smem(lp, nc4, dk) + 8 * 1024 + 64;
    return hk_kv2v_smem(T, lp, nc4, dk) +
           2 * HK_KV2_TT * HK_KV2_THREADS * sizeof(float4);
}

static int hk_kvbuf_step_v2(float *o, float *arena, const hk_kvbuf_view_t *vw,
                            const float *q, const float *k, const float *v,
                            const float *gl, const float *beta, int R, int T,
                            const hk_kvbuf_geom_t *g, int lmax, int nc4,
                            cudaStream_t s)
{
    const int lp = HK_CEIL_DIV(lmax, g->bs) * g->bs;
    const dim3 grid(HK_CEIL_DIV(g->dv, 4 * nc4), g->Hv, R);
    const size_t sm =
        T == 1 ? hk_kv2_smem(lp, nc4, g->dk) : hk_kv2v_smem(T, lp, nc4, g->dk);
    /* past 48 KB in all (the static part counts: the verification's is
     * 32 KB) a kernel must be allowed its dynamic part first */
    const bool optin = hk_kv2_step_bytes(T, lp, nc4, g->dk) > 48 * 1024;
#define HK_KV2_LAUNCH(KERNEL, ...)                                             \
    do {                                                                       \
        if (optin)                                                             \
            cudaFuncSetAttribute(                                              \
                KERNEL, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sm); \
        KERNEL<<<grid, HK_KV2_THREADS, sm, s>>>(__VA_ARGS__);                  \
    } while (0)
#define HK_KV2_STEP(NC4)                                                       \
    do {                                                                       \
        if (T == 1)                                                            \
            HK_KV2_LAUNCH(hk_kvbuf_step1_kernel<NC4>, o, arena, vw, q, k, v,   \
                          gl, beta, *g, lp);                                   \
        else                                                                   \
            HK_KV2_LAUNCH((hk_kvbuf_verify2_kernel<NC4, HK_KV2_TT>), o, arena, \
                          vw, q, k, v, gl, beta, T, *g, lp);                   \
    } while (0)
    if (nc4 == 32)
        HK_KV2_STEP(32);
    else if (nc4 == 16)
        HK_KV2_STEP(16);
    else
        HK_KV2_STEP(8);
#undef HK_KV2_STEP
#undef HK_KV2_LAUNCH
    return hk_cuda_check_launch();
}

extern "C" int hk_cuda_kvbuf_step_ex(float *o, float *arena,
                                     const hk_kvbuf_view_t *vw, const float *q,
                                     const float *k, const float *v,
                                     const float *gl, const float *beta, int R,
                                     int T, const hk_kvbuf_geom_t *g, int lmax,
                                     unsigned flags, void *stream)
{
    if (!hk_kb_geom_ok(g) || R < 0 || R > HK_CUDA_MAX_GRID_YZ || T < 1 ||
        lmax < T || (R > 0 && (!vw || !arena)) || !hk_kv_flags_ok(flags))
        return HK_CUDA_EINVAL;
    flags = hk_kv_resolve(flags);
    const int nc4 = hk_kv2_nc4(flags, g->Hv, R, T, g->dv);
    const int lp = HK_CEIL_DIV(lmax, g->bs) * g->bs;
    const bool v2 =
        hk_kv2_ok(g, arena, v, o) &&
        hk_kv2_step_bytes(T, lp, nc4, g->dk) <= (size_t)hk_cuda_smem_optin();
    const bool forced = flags & (HK_CUDA_KVBUF_V2 | HK_CUDA_KVBUF_CW_MASK);
    if (forced && !v2)
        return HK_CUDA_EINVAL; /* a bench or test asked for v2 by name */
    if (R == 0)
        return HK_CUDA_OK;
    const cudaStream_t s = hk_stream(stream);
    /* a verification runs v1 from a block per SM on, unless v2 was named
     * (H100, session 11, T = 5: v1 0.059 / 0.131 ms at B = 16 / 64, v2
     * 0.108 / 0.232; v2 ahead at B = 1, 0.031 against 0.053) */
    const bool v1_verify =
        T > 1 && !forced && (long long)g->Hv * R >= hk_cuda_sm_count(1);
    if (v2 && !(flags & HK_CUDA_KVBUF_V1) && !v1_verify)
        return hk_kvbuf_step_v2(o, arena, vw, q, k, v, gl, beta, R, T, g, lmax,
                                nc4, s);
    return hk_kvbuf_step_v1(o, arena, vw, q, k, v, gl, beta, R, T, g, lmax, s);
}

extern "C" int hk_cuda_kvbuf_step(float *o, float *arena,
                                  const hk_kvbuf_view_t *vw, const float *q,
                                  const float *k, const float *v,
                                  const float *gl, const float *beta, int R,
                                  int T, const hk_kvbuf_geom_t *g, int lmax,
                                  void *stream)
{
    return hk_cuda_kvbuf_step_ex(o, arena, vw, q, k, v, gl, beta, R, T, g, lmax,
                                 0, stream);
}

extern "C" int hk_cuda_kvbuf_flush_ex(float *arena, const hk_kvbuf_view_t *vw,
                                      const int *n, int R,
                                      const hk_kvbuf_geom_t *g, unsigned flags,
                                      void *stream)
{
    if (!hk_kb_geom_ok(g) || R < 0 || R > HK_CUDA_MAX_GRID_YZ ||
        (R > 0 && (!vw || !n || !arena)) || !hk_kv_flags_ok(flags))
        return HK_CUDA_EINVAL;
    flags = hk_kv_resolve(flags);
    const bool v2 = hk_kv2_ok(g, arena, arena, arena);
    if ((flags & (HK_CUDA_KVBUF_V2 | HK_CUDA_KVBUF_CW_MASK)) && !v2)
        return HK_CUDA_EINVAL;
    if (R == 0)
        return HK_CUDA_OK;
    const cudaStream_t s = hk_stream(stream);
    if (v2 && !(flags & HK_CUDA_KVBUF_V1)) {
        const int nc4 = hk_kv2_nc4(flags, g->Hv, R, 1, g->dv);
        const dim3 grid(HK_CEIL_DIV(g->dv, 4 * nc4), g->Hv, R);
        if (nc4 == 32)
            hk_kvbuf_flush2_kernel<32>
                <<<grid, HK_KV2_THREADS, 0, s>>>(arena, vw, n, *g);
        else if (nc4 == 16)
            hk_kvbuf_flush2_kernel<16>
                <<<grid, HK_KV2_THREADS, 0, s>>>(arena, vw, n, *g);
        else
            hk_kvbuf_flush2_kernel<8>
                <<<grid, HK_KV2_THREADS, 0, s>>>(arena, vw, n, *g);
        return hk_cuda_check_launch();
    }
    const dim3 grid(g->Hv, R, HK_CEIL_DIV(g->dk, HK_KF_ROWS));
    switch (hk_kb_cpt(g->dv)) {
    case 1:
        hk_kvbuf_flush_kernel<1>
            <<<grid, HK_KB_THREADS, 0, s>>>(arena, vw, n, *g);
        break;
    case 2:
        hk_kvbuf_flush_kernel<2>
            <<<grid, HK_KB_THREADS, 0, s>>>(arena, vw, n, *g);
        break;
    case 4:
        hk_kvbuf_flush_kernel<4>
            <<<grid, HK_KB_THREADS, 0, s>>>(arena, vw, n, *g);
        break;
    default:
        hk_kvbuf_flush_kernel<8>
            <<<grid, HK_KB_THREADS, 0, s>>>(arena, vw, n, *g);
        break;
    }
    return hk_cuda_check_launch();
}

extern "C" int hk_cuda_kvbuf_flush(float *arena, const hk_kvbuf_view_t *vw,
                                   const int *n, int R,
                                   const hk_kvbuf_geom_t *g, void *stream)
{
    return hk_cuda_kvbuf_flush_ex(arena, vw, n, R, g, 0, stream);
}

extern "C" int hk_cuda_kvbuf_conv_commit(float *state, const float *x, int m,
                                         int C, int K, void *stream)
{
    if (m < 0 || C < 1 || K < 1 || (m > 0 && !x) || !state)
        return HK_CUDA_EINVAL;
    if (K == 1)
        return HK_CUDA_OK; /* no history */
    HK_LAUNCH_1D(hk_kvbuf_conv_commit_kernel, (size_t)C, 128, stream, state, x,
                 m, C, K);
}
