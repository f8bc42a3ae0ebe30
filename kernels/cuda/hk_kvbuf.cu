/*
 * hk_kvbuf.cu - CUDA twin of hk_kvbuf.c: the KVBuffer's chunkwise step
 * (decode, draft verification, KV-only prompt pieces), the rank-n flush
 * and the conv-history commit. Math and block layout: hk_kvbuf.h.
 *
 * Step: one block of 8 warps per (value head, request), four phases.
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
 * Flush: one block per (value head, request, 16 rows of S): the scaled key
 * tile Ktilde^T [16, 64 entries] in shared memory, w rows streamed, S read
 * and written once: S <- e^{G_n} S + Ktilde^T W.
 */
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

template <int CPT, bool VEC>
static __global__ void __launch_bounds__(HK_KB_THREADS)
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
    const int Hk = g.Hk, Hv = g.Hv, dk = g.dk, dv = g.dv, bs = g.bs;
    const int kh = h / (Hv / Hk);
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const hk_kvbuf_view_t V = vw[r];
    const int len = V.len, n = len + T;
    const hk_kb_at at = hk_kb_view(arena, V, g);
    double *Gt = reinterpret_cast<double *>(smem);
    float *eG = reinterpret_cast<float *>(Gt + T);
    float *ks = eG + T, *qs = ks + (size_t)T * dk;
    float *CU = qs + (size_t)T * dk, *CO = CU + (size_t)T * lmax;
    float *U = CO + (size_t)T * lmax, *O = U + (size_t)T * dv;
    const size_t row0 = (size_t)r * T;

    /* 0. decays, the tokens' q and k, the new keys */
    if (tid == 0) {
        double G = len > 0 ? *at.G(len - 1, h) : 0.0;
        for (int t = 0; t < T; t++) {
            G += (double)gl[(row0 + t) * Hv + h];
            Gt[t] = G;
            eG[t] = hk_gdn_decay(G);
            *at.G(len + t, h) = G;
        }
    }
    const bool writer = h % (Hv / Hk) == 0;
    for (int x = tid; x < T * dk; x += HK_KB_THREADS) {
        const int t = x / dk, e = x % dk;
        const size_t src = ((row0 + t) * Hk + kh) * dk + e;
        ks[x] = k[src];
        qs[x] = q[src];
        if (writer)
            at.key(len + t, kh)[(size_t)e * bs] = k[src];
    }
    __syncthreads();

    /* 1. coefficients of every (token, entry <= its own) */
    for (int x = tid; x < T * n; x += HK_KB_THREADS) {
        const int t = x / n, i = x % n;
        if (i > len + t)
            continue;
        const float *kt = ks + (size_t)t * dk, *qt = qs + (size_t)t * dk;
        float kk = 0.0f, kq = 0.0f;
        if (i < len) {
            const float *K = at.key(i, kh);
            for (int e = 0; e < dk; e++) {
                const float ke = K[(size_t)e * bs];
                kk += ke * kt[e];
                kq += ke * qt[e];
            }
        } else {
            const float *K = ks + (size_t)(i - len) * dk;
            for (int e = 0; e < dk; e++) {
                kk += K[e] * kt[e];
                kq += K[e] * qt[e];
            }
        }
        if (i == len + t) { /* the token's own entry: no decay */
            CO[(size_t)t * lmax + i] = kq;
            continue;
        }
        const double Gi = i < len ? *at.G(i, h) : Gt[i - len];
        const float c = hk_gdn_decayf(Gt[t] - Gi);
        CU[(size_t)t * lmax + i] = c * kk;
        CO[(size_t)t * lmax + i] = c * kq;
    }
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
    for (int j = tid; j < dv; j += HK_KB_THREADS) {
        for (int t = 0; t < T; t++) {
            const float *cu = CU + (size_t)t * lmax,
                        *co = CO + (size_t)t * lmax;
            float u = U[(size_t)t * dv + j], oa = O[(size_t)t * dv + j];
            for (int i = len; i < len + t; i++) {
                if (cu[i] == 0.0f && co[i] == 0.0f)
                    continue;
                const float wi = at.w(i, h)[j];
                u += cu[i] * wi;
                oa += co[i] * wi;
            }
            const size_t row = (row0 + t) * Hv + h;
            const float wt = beta[row] * (v[row * dv + j] - u);
            at.w(len + t, h)[j] = wt;
            o[row * dv + j] = oa + co[len + t] * wt;
        }
    }
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

extern "C" int hk_cuda_kvbuf_step(float *o, float *arena,
                                  const hk_kvbuf_view_t *vw, const float *q,
                                  const float *k, const float *v,
                                  const float *gl, const float *beta, int R,
                                  int T, const hk_kvbuf_geom_t *g, int lmax,
                                  void *stream)
{
    if (!hk_kb_geom_ok(g) || R < 0 || R > HK_CUDA_MAX_GRID_YZ || T < 1 ||
        lmax < T || (R > 0 && (!vw || !arena)))
        return HK_CUDA_EINVAL;
    if (R == 0)
        return HK_CUDA_OK;
    const size_t sm = hk_kb_smem(T, g->dk, g->dv, lmax);
    if (sm > (size_t)hk_cuda_smem_optin())
        return HK_CUDA_EINVAL;
    const dim3 grid(g->Hv, R);
    const cudaStream_t s = hk_stream(stream);
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

extern "C" int hk_cuda_kvbuf_flush(float *arena, const hk_kvbuf_view_t *vw,
                                   const int *n, int R,
                                   const hk_kvbuf_geom_t *g, void *stream)
{
    if (!hk_kb_geom_ok(g) || R < 0 || R > HK_CUDA_MAX_GRID_YZ ||
        (R > 0 && (!vw || !n || !arena)))
        return HK_CUDA_EINVAL;
    if (R == 0)
        return HK_CUDA_OK;
    const dim3 grid(g->Hv, R, HK_CEIL_DIV(g->dk, HK_KF_ROWS));
    const cudaStream_t s = hk_stream(stream);
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
