/*
 * hk_gdn_tc_local.cu - kernel A of the tensor-core chunked prefill
 * (hk_gdn_tc.cu): per (chunk, value head), all in parallel, the chunk's
 * gamma, U, -W and P into the workspace. The first kernel (A1,
 * HK_CUDA_GDN_TC_A1), the blockwise one (A2, the default) and A2 with its
 * loads in flight (A3, HK_CUDA_GDN_TC_A3); the launch of the one planned.
 */
#include "kernels/cuda/hk_gdn_tc.h"

#define HK_TC_A_THREADS 256

/* Kernels A's start, for chunk slot hk_tc_slot of value head blockIdx.y
 * (hc): the chunk's first token (*t0) and length (returned; 0 for a spare
 * slot, in every thread), then located(t0, n) (kernel A3 issues its first
 * copies there), gamma in double by one thread in the CPU's order (from g
 * staged in bg by all first: a serial loop over global loads waits for
 * each in turn) into gam and scratch, BATCH > 1 of g read from bg ahead of
 * their sums (the same sums in the same order), then beta in bv and
 * beta e^gamma in bg, 0 past the chunk. Ends at a barrier. */
template <int BATCH, class F>
static __device__ int
hk_tc_a_begin(const hk_tc_ws &ws, const float *g, const float *beta,
              const int *cu, int nseq, int Hv, int C, size_t hc, int *loc,
              double *gam, float *bv, float *bg, int *t0, F &&located)
{
    const int tid = threadIdx.x, h = blockIdx.y;
    if (tid == 0)
        hk_tc_locate(cu, nseq, C, hk_tc_slot(ws), &loc[0], &loc[1]);
    __syncthreads();
    const int n = loc[1];
    *t0 = loc[0];
    if (n == 0)
        return 0;
    located(*t0, n);
    for (int i = tid; i < n; i += blockDim.x)
        bg[i] = g[(size_t)(*t0 + i) * Hv + h];
    __syncthreads();
    if (tid == 0) {
        double acc = 0.0;
        for (int i0 = 0; i0 < n; i0 += BATCH) {
            float x[BATCH];
#pragma unroll
            for (int k = 0; k < BATCH; k++)
                x[k] = i0 + k < n ? bg[i0 + k] : 0.0f;
#pragma unroll
            for (int k = 0; k < BATCH && i0 + k < n; k++) {
                acc += x[k];
                gam[i0 + k] = acc;
                ws.gam[hc * C + i0 + k] = acc;
            }
        }
    }
    __syncthreads();
    for (int i = tid; i < C; i += blockDim.x) {
        const float bi = i < n ? beta[(size_t)(*t0 + i) * Hv + h] : 0.0f;
        bv[i] = bi;
        bg[i] = i < n ? bi * hk_gdn_decay(gam[i]) : 0.0f;
    }
    __syncthreads();
    return n;
}

/* Kernels A1 and A2: nothing between. */
static __device__ int hk_tc_a_begin(const hk_tc_ws &ws, const float *g,
                                    const float *beta, const int *cu, int nseq,
                                    int Hv, int C, size_t hc, int *loc,
                                    double *gam, float *bv, float *bg, int *t0)
{
    return hk_tc_a_begin<1>(ws, g, beta, cu, nseq, Hv, C, hc, loc, gam, bv, bg,
                            t0, [](int, int) {});
}

/* Shared memory of kernel A, in bytes, and its carving. */
struct hk_tc_a_smem {
    uint16_t *Ks, *Qs, *Vs; // [C][dk + 8], [C][dk + 8], [C][dv + 8]
    uint16_t *Kl, *Ql, *Vl; // their lo parts (f32 inputs only)
    float *G;               // [2C][C + 4]: K K^T then Q K^T
    float *Ti;              // [C][C + 4]
    uint16_t *Tb[4];        // [C][C + 8]: Tinv diag(beta) hi, lo;
                            //   Tinv diag(beta e^gamma) hi, lo
    float *stage;           // [warps][16][20]
    double *gam;            // [C]
    float *bv, *bg;         // [C]
};

static __host__ __device__ size_t hk_tc_a_carve(hk_tc_a_smem *s,
                                                unsigned char *p, int dk,
                                                int dv, int C, bool lo)
{
    const int ldk = dk + HK_PAD16, ldv = dv + HK_PAD16;
    const int ldc = C + HK_PAD32, ldb = C + HK_PAD16;
    const size_t sz[15] = {(size_t)C * ldk * 2,
                           (size_t)C * ldk * 2,
                           (size_t)C * ldv * 2,
                           (size_t)2 * C * ldc * 4,
                           (size_t)C * ldc * 4,
                           (size_t)C * ldb * 2,
                           (size_t)C * ldb * 2,
                           (size_t)C * ldb * 2,
                           (size_t)C * ldb * 2,
                           (size_t)(HK_TC_A_THREADS / 32) * 16 * 20 * 4,
                           (size_t)C * 8,
                           (size_t)2 * C * 4,
                           lo ? (size_t)C * ldk * 2 : 0,
                           lo ? (size_t)C * ldk * 2 : 0,
                           lo ? (size_t)C * ldv * 2 : 0};
    size_t off[15];
    const size_t at = hk_layout(sz, 15, 128, off);
    if (s) {
        s->Ks = (uint16_t *)(p + off[0]);
        s->Qs = (uint16_t *)(p + off[1]);
        s->Vs = (uint16_t *)(p + off[2]);
        s->G = (float *)(p + off[3]);
        s->Ti = (float *)(p + off[4]);
        for (int i = 0; i < 4; i++)
            s->Tb[i] = (uint16_t *)(p + off[5 + i]);
        s->stage = (float *)(p + off[9]);
        s->gam = (double *)(p + off[10]);
        s->bv = (float *)(p + off[11]);
        s->bg = s->bv + C;
        s->Kl = lo ? (uint16_t *)(p + off[12]) : NULL;
        s->Ql = lo ? (uint16_t *)(p + off[13]) : NULL;
        s->Vl = lo ? (uint16_t *)(p + off[14]) : NULL;
    }
    return at;
}

/* Tile pair idx of [K; Q] K^T's lower tiles: which (0: K K^T, 1: Q K^T),
 * row tile ti, column tile tj <= ti; npair pairs per product. */
static __device__ __forceinline__ void hk_tc_pair(int idx, int npair,
                                                  int *which, int *ti, int *tj)
{
    const int p = idx % npair;
    int i = 0;
    while ((i + 1) * (i + 2) / 2 <= p)
        i++;
    *which = idx / npair;
    *ti = i;
    *tj = p - i * (i + 1) / 2;
}

/* acc += X[ti] K[tj]^T, 16-row tiles over nk 16-column steps (row stride
 * ld); with lo parts (LO: f32 inputs) + hi lo^T + lo hi^T. */
template <bool LO>
static __device__ void
hk_tc_xkt(hk_facc &acc, const uint16_t *X, const uint16_t *Xl,
          const uint16_t *K, const uint16_t *Kl, int ld, int ti, int tj, int nk)
{
    for (int kk = 0; kk < nk; kk++) {
        hk_fa_row a;
        hk_fb_col b;
        const int xa = ti * 16 * ld + kk * 16, ka = tj * 16 * ld + kk * 16;
        hk_wmma_lds(a, X + xa, ld);
        hk_wmma_lds(b, K + ka, ld);
        wmma::mma_sync(acc, a, b, acc);
        if (LO) {
            hk_fb_col bl;
            hk_wmma_lds(bl, Kl + ka, ld);
            wmma::mma_sync(acc, a, bl, acc);
            hk_wmma_lds(a, Xl + xa, ld);
            wmma::mma_sync(acc, a, b, acc);
        }
    }
}

/* acc = row tile ti of (Th + Tl) B, T lower triangular (column tiles
 * kk <= ti), 16 columns of B at B (row stride ldB): Th B + Tl B, with LO
 * (B an f32 input's hi part, lo part Bl) + Th Bl. Tl NULL: T's hi half
 * only (HK_CUDA_GDN_TC_FAST_A). */
template <bool LO>
static __device__ void hk_tc_tb(hk_facc &acc, const uint16_t *Th,
                                const uint16_t *Tl, int ldb, const uint16_t *B,
                                const uint16_t *Bl, int ldB, int ti)
{
    wmma::fill_fragment(acc, 0.0f);
    for (int kk = 0; kk <= ti; kk++) {
        hk_fa_row ah;
        hk_fb_row b;
        hk_wmma_lds(ah, Th + ti * 16 * ldb + kk * 16, ldb);
        hk_wmma_lds(b, B + kk * 16 * ldB, ldB);
        wmma::mma_sync(acc, ah, b, acc);
        if (Tl) {
            hk_fa_row al;
            hk_wmma_lds(al, Tl + ti * 16 * ldb + kk * 16, ldb);
            wmma::mma_sync(acc, al, b, acc);
        }
        if (LO) {
            hk_wmma_lds(b, Bl + kk * 16 * ldB, ldB);
            wmma::mma_sync(acc, ah, b, acc);
        }
    }
}

/* x[0..7] split into bf16 hi + lo (hk_bf16_split's values), each half in
 * one 16-byte store (hi, lo 16-byte aligned). */
static __device__ __forceinline__ void
hk_tc_put_split8(uint16_t *hi, uint16_t *lo, const float (&x)[8])
{
    uint32_t h[4], l[4];
#pragma unroll
    for (int k = 0; k < 4; k++)
        hk_split_bf16x2(x[2 * k], x[2 * k + 1], &h[k], &l[k]);
    *reinterpret_cast<uint4 *>(hi) = make_uint4(h[0], h[1], h[2], h[3]);
    *reinterpret_cast<uint4 *>(lo) = make_uint4(l[0], l[1], l[2], l[3]);
}

/* Lane's 8 of a warp's 16 x 16 tile stg (row stride 20, 16-byte aligned):
 * row lane / 2, columns 8 (lane % 2).. */
static __device__ __forceinline__ void hk_tc_get8(float (&x)[8],
                                                  const float *stg, int lane)
{
    const float4 *p = reinterpret_cast<const float4 *>(stg + (lane >> 1) * 20 +
                                                       (lane & 1) * 8);
    const float4 a = p[0], b = p[1];
    x[0] = a.x, x[1] = a.y, x[2] = a.z, x[3] = a.w;
    x[4] = b.x, x[5] = b.y, x[6] = b.z, x[7] = b.w;
}

/* A warp's W tile (row tile ti, columns col..col + 15) to scratch as -W,
 * flushed as the CPU's W, split; through the warp's tile stg [16][20]. VEC
 * (kernel A3): a lane's 8 elements of a row in one 16-byte store of each
 * half, where the others store an element a lane (2 bytes). */
template <bool VEC = false>
static __device__ void hk_tc_store_w(const hk_tc_ws &ws, hk_facc &acc,
                                     float *stg, int lane, size_t hc, int C,
                                     int dk, int ti, int col)
{
    for (int e = 0; e < acc.num_elements; e++)
        acc.x[e] = fabsf(acc.x[e]) < HK_GDN_TINY ? 0.0f : -acc.x[e];
    hk_wmma_sts(stg, acc, 20);
    __syncwarp();
    if (VEC) {
        float x[8];
        hk_tc_get8(x, stg, lane);
        const size_t at =
            (hc * C + ti * 16 + (lane >> 1)) * dk + col + (lane & 1) * 8;
        hk_tc_put_split8(ws.Wh + at, ws.Wl + at, x);
    }
    for (int e = lane; !VEC && e < 256; e += 32) {
        const int r = e / 16, c = e % 16;
        const size_t at = (hc * C + ti * 16 + r) * dk + col + c;
        hk_bf16_split(stg[r * 20 + c], &ws.Wh[at], &ws.Wl[at]);
    }
    __syncwarp(); /* stg is rewritten by the warp's next tile */
}

/* Kernel A: chunk slot hk_tc_slot, value head blockIdx.y. LO: the inputs
 * have lo parts (f32 inputs). */
template <bool LO>
static __global__ void __launch_bounds__(HK_TC_A_THREADS)
    hk_gdn_tc_local_kernel(hk_tc_ws ws, hk_tc_in in, const float *g,
                           const float *beta, const int *cu, int nseq,
                           int nslots, int Hk, int Hv, int dk, int dv, int C,
                           int fast_a)
{
    HK_DYNAMIC_SMEM(smem);
    __shared__ int loc[2];
    hk_tc_a_smem s;
    hk_tc_a_carve(&s, smem, dk, dv, C, LO);
    const int h = blockIdx.y, kh = h / (Hv / Hk);
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int nwarps = blockDim.x >> 5;
    const size_t hc = (size_t)h * nslots + hk_tc_slot(ws);
    const size_t ldq = (size_t)Hk * dk, ldvg = (size_t)Hv * dv;
    const int ldk = dk + HK_PAD16, ldv = dv + HK_PAD16;
    const int ldc = C + HK_PAD32, ldb = C + HK_PAD16;

    int t0;
    const int n = hk_tc_a_begin(ws, g, beta, cu, nseq, Hv, C, hc, loc, s.gam,
                                s.bv, s.bg, &t0);
    if (n == 0)
        return; /* a spare slot: the whole block leaves */
    const size_t rq = (size_t)t0 * ldq + (size_t)kh * dk;
    const size_t rv = (size_t)t0 * ldvg + (size_t)h * dv;
    hk_tc_stage(s.Ks, ldk, in.k + rq, ldq, C, n, dk);
    hk_tc_stage(s.Qs, ldk, in.q + rq, ldq, C, n, dk);
    hk_tc_stage(s.Vs, ldv, in.v + rv, ldvg, C, n, dv);
    if (LO) {
        hk_tc_stage(s.Kl, ldk, in.kl + rq, ldq, C, n, dk);
        hk_tc_stage(s.Ql, ldk, in.ql + rq, ldq, C, n, dk);
        hk_tc_stage(s.Vl, ldv, in.vl + rv, ldvg, C, n, dv);
    }
    __syncthreads();

    /* [K; Q] K^T, the tiles on and below the diagonal. */
    const int nt = (n + 15) / 16, npair = nt * (nt + 1) / 2;
    for (int idx = warp; idx < 2 * npair; idx += nwarps) {
        int which, ti, tj;
        hk_tc_pair(idx, npair, &which, &ti, &tj);
        hk_facc acc;
        wmma::fill_fragment(acc, 0.0f);
        hk_tc_xkt<LO>(acc, which ? s.Qs : s.Ks, which ? s.Ql : s.Kl, s.Ks, s.Kl,
                      ldk, ti, tj, dk / 16);
        hk_wmma_sts(s.G + (which * C + ti * 16) * ldc + tj * 16, acc, ldc);
    }
    __syncthreads();

    /* L = strictly_lower(diag(beta) KK^T (.) Gamma) in place; P split into
     * scratch; Tinv zeroed. */
    for (int e = tid; e < C * C; e += blockDim.x) {
        const int i = e / C, j = e % C;
        float a = 0.0f, pv = 0.0f;
        if (i < n && j < i) {
            const float d = hk_gdn_decay(s.gam[i] - s.gam[j]);
            a = s.G[i * ldc + j] * (s.bv[i] * d);
            pv = s.G[(C + i) * ldc + j] * d;
        } else if (i < n && j == i) {
            pv = s.G[(C + i) * ldc + j];
        }
        s.G[i * ldc + j] = a;
        s.Ti[i * ldc + j] = 0.0f;
        hk_bf16_split(pv, &ws.Ph[hc * C * C + e], &ws.Pl[hc * C * C + e]);
    }
    __syncthreads();

    /* Tinv = (I + L)^{-1}, row i = e_i - sum_{j<i} L_ij Tinv_j, j ascending
     * (hk_gdn.cu's order). */
    for (int i = 0; i < n; i++) {
        for (int cc = tid; cc <= i; cc += blockDim.x) {
            float t = cc == i ? 1.0f : 0.0f;
            for (int j = cc; j < i; j++)
                t -= s.G[i * ldc + j] * s.Ti[j * ldc + cc];
            s.Ti[i * ldc + cc] = t;
        }
        __syncthreads();
    }
    for (int e = tid; e < C * C; e += blockDim.x) {
        const int i = e / C, m = e % C;
        const float t = s.Ti[i * ldc + m];
        hk_bf16_split(t * s.bv[m], &s.Tb[0][i * ldb + m],
                      &s.Tb[1][i * ldb + m]);
        hk_bf16_split(t * s.bg[m], &s.Tb[2][i * ldb + m],
                      &s.Tb[3][i * ldb + m]);
    }
    __syncthreads();

    /* U = Tinv diag(beta) V, W = Tinv diag(beta e^gamma) K; Tinv is lower
     * triangular, so row tile ti sums column tiles kk <= ti. */
    const int nu = dv / 16, nw = dk / 16;
    float *stg = s.stage + warp * 16 * 20;
    for (int idx = warp; idx < nt * (nu + nw); idx += nwarps) {
        const int ti = idx / (nu + nw), tj = idx % (nu + nw);
        const bool isw = tj >= nu;
        const uint16_t *Th = s.Tb[isw ? 2 : 0], *Tl = s.Tb[isw ? 3 : 1];
        const int cB = isw ? (tj - nu) * 16 : tj * 16;
        const uint16_t *B = (isw ? s.Ks : s.Vs) + cB;
        const uint16_t *Bl = LO ? (isw ? s.Kl : s.Vl) + cB : NULL;
        const int ldB = isw ? ldk : ldv;
        hk_facc acc;
        hk_tc_tb<LO>(acc, Th, fast_a ? NULL : Tl, ldb, B, Bl, ldB, ti);
        if (!isw) {
            wmma::store_matrix_sync(ws.U + (hc * C + ti * 16) * dv + tj * 16,
                                    acc, dv, wmma::mem_row_major);
            continue;
        }
        hk_tc_store_w(ws, acc, stg, lane, hc, C, dk, ti, (tj - nu) * 16);
    }
}

/* Where a kernel A block works (A2, A3): chunk slot hk_tc_slot of value
 * head blockIdx.y (h) and its key head kh; its scratch slot hc; the rows'
 * strides of q, k (ldq) and v (ldvg) and of its C x C tiles in f32 (ldc)
 * and bf16 (ldb); the thread's warp and lane. */
struct hk_tc_a_at {
    int h, kh, lane, warp, nwarps, ldc, ldb;
    size_t hc, ldq, ldvg;
    __device__ hk_tc_a_at(const hk_tc_ws &ws, int nslots, int Hk, int Hv,
                          int dk, int dv, int C)
        : h((int)blockIdx.y), kh(h / (Hv / Hk)), lane((int)threadIdx.x & 31),
          warp((int)threadIdx.x >> 5), nwarps((int)blockDim.x >> 5),
          ldc(C + HK_PAD32), ldb(C + HK_PAD16),
          hc((size_t)h * nslots + hk_tc_slot(ws)), ldq((size_t)Hk * dk),
          ldvg((size_t)Hv * dv)
    {
    }
};

/* ---- kernel A, blockwise (the default) -------------------------------------
 *
 * The first kernel A above keeps K, Q, V (and their lo parts) and every
 * C x C matrix resident (152-200 KB at dk = dv = 128, C = 64: one block per
 * SM) and inverts I + L by C serial rows, each behind a block barrier. This
 * one works in phases over one shared region, so three blocks fit an SM:
 *   1. [K; Q] K^T accumulated in fragments over 64-column panels of K and Q;
 *      through a per-warp tile, the masks give L (f32, shared) and P (hi/lo,
 *      straight to scratch).
 *   2. (I + L)^{-1} blockwise in f32: the 16 x 16 diagonal blocks by
 *      forward substitution, one warp each (16 rows deep, no block
 *      barrier); then by block diagonals d = 1, 2, 3, in parallel within
 *      one: T_ij = -T_ii (sum_{j <= k < i} L_ik T_kj). Then T's hi/lo split.
 *   3. U = (T diag(beta)) V over 64-column panels of V, then
 *      W = (T diag(beta e^gamma)) K over panels of K, T's columns scaled
 *      and split into hi + lo before each: the first kernel's products.
 * Shared memory 65 KB at C = 64 with f32 inputs, 64 KB with bf16, for any
 * dk, dv; 80 registers at sm_90a. Outputs as the first kernel's: gamma, U,
 * -W and P hi/lo. */

#define HK_TC_A2_PW 64 /* panel width, columns */
/* fragments per warp in phase 1: 2 nt (nt + 1) / 2 <= 20 tiles, 8 warps */
#define HK_TC_A2_ACC 3

struct hk_tc_a2_smem {
    /* one region, by phase: */
    uint16_t *Kp, *Qp, *Kpl, *Qpl; // 1: [C][PW + 8] K, Q panels (lo: LO)
    float *L, *T;                  // 2: [C][C + 4] (T past 2 panels)
    uint16_t *Bh, *Bl;             // 3: [C][PW + 8] a V or K panel (lo: LO)
    uint16_t *Th, *Tl;             // [C][C + 8]   T diag(...) split
    float *stage;                  // [warps][16][20]; phase 2's X blocks
    double *gam;                   // [C]
    float *bv, *bg;                // [C]
};

static __host__ __device__ size_t hk_tc_a2_carve(hk_tc_a2_smem *s,
                                                 unsigned char *p, int C,
                                                 bool lo)
{
    const size_t pan = (size_t)C * (HK_TC_A2_PW + HK_PAD16) * 2;
    const size_t lt = (size_t)C * (C + HK_PAD32) * 4;
    const size_t tb = (size_t)C * (C + HK_PAD16) * 2;
    size_t x = (lo ? 4 : 2) * pan;
    x = x > 2 * pan + lt ? x : 2 * pan + lt;
    const size_t sz[6] = {x,
                          2 * tb,
                          (size_t)(HK_TC_A_THREADS / 32) * 16 * 20 * 4,
                          (size_t)C * 8,
                          (size_t)2 * C * 4,
                          0};
    size_t off[6];
    const size_t at = hk_layout(sz, 6, 128, off);
    if (s) {
        unsigned char *r = p + off[0];
        s->Kp = (uint16_t *)r;
        s->Qp = (uint16_t *)(r + pan);
        s->Kpl = lo ? (uint16_t *)(r + 2 * pan) : NULL;
        s->Qpl = lo ? (uint16_t *)(r + 3 * pan) : NULL;
        s->L = (float *)r;
        s->T = (float *)(r + 2 * pan);
        s->Bh = (uint16_t *)r;
        s->Bl = (uint16_t *)(r + pan);
        s->Th = (uint16_t *)(p + off[1]);
        s->Tl = (uint16_t *)(p + off[1] + tb);
        s->stage = (float *)(p + off[2]);
        s->gam = (double *)(p + off[3]);
        s->bv = (float *)(p + off[4]);
        s->bg = s->bv + C;
    }
    return at;
}

/* Step 1 on a panel (blockwise kernels): warp w's pairs w, w + 8, w + 16
 * of [K; Q] K^T's lower tiles (npair a product) accumulate the panel's nk
 * 16-column steps of K, Q (and their lo parts Kl, Ql: LO; row stride ld). */
template <bool LO>
static __device__ __forceinline__ void
hk_tc_a2_kkt(hk_facc (&acc)[HK_TC_A2_ACC], const uint16_t *K, const uint16_t *Q,
             const uint16_t *Kl, const uint16_t *Ql, int ld, int nk, int npair)
{
    const int warp = (int)threadIdx.x >> 5, nwarps = blockDim.x >> 5;
#pragma unroll
    for (int r = 0; r < HK_TC_A2_ACC; r++) {
        const int idx = warp + r * nwarps;
        if (idx >= 2 * npair)
            continue;
        int which, ti, tj;
        hk_tc_pair(idx, npair, &which, &ti, &tj);
        hk_tc_xkt<LO>(acc[r], which ? Q : K, which ? Ql : Kl, K, Kl, ld, ti, tj,
                      nk);
    }
}

/* Step 2 (blockwise kernels): T = (I + L)^{-1} over nt row tiles (row
 * stride ldc; L written behind a barrier). Diagonal block b by warp b, lane
 * c < 16 on column c in registers, row r = e_r - sum_{j < r} L_rj T_jc (j
 * ascending; T_jc = 0 for j < c, so the terms before c change nothing and
 * the sum is hk_gdn.cu's). A column needs no other lane's. Rows past the
 * chunk have L = 0: T is I there (dropped in the split). Then the block
 * diagonals d = 1.. through X ([nt - 1][16][16]). Ends without a barrier
 * (T's last blocks just written). */
static __device__ __forceinline__ void
hk_tc_a2_inverse(const float *L, float *T, float *X, int ldc, int nt)
{
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    if (warp < nt) {
        const int b0 = warp * 16, c = lane & 15;
        float col[16];
#pragma unroll
        for (int r = 0; r < 16; r++) {
            float t = r == c ? 1.0f : 0.0f;
#pragma unroll
            for (int j = 0; j < r; j++)
                t -= L[(b0 + r) * ldc + b0 + j] * col[j];
            col[r] = t;
        }
#pragma unroll
        for (int r = 0; r < 16; r++) /* 0 above the diagonal */
            if (lane < 16)
                T[(b0 + r) * ldc + b0 + c] = col[r];
    }
    for (int d = 1; d < nt; d++) {
        const int nb = (nt - d) * 256;
        __syncthreads(); /* the blocks of diagonal d - 1 are written */
        for (int e = tid; e < nb; e += blockDim.x) {
            const int bi = e / 256 + d, bj = bi - d;
            const int i = bi * 16 + (e % 256) / 16, col = bj * 16 + e % 16;
            float x = 0.0f;
            for (int m = bj * 16; m < bi * 16; m++)
                x += L[i * ldc + m] * T[m * ldc + col];
            X[e] = x;
        }
        __syncthreads();
        for (int e = tid; e < nb; e += blockDim.x) {
            const int bi = e / 256 + d, r = (e % 256) / 16, c = e % 16;
            const int i = bi * 16 + r;
            const float *Xb = X + (e / 256) * 256;
            float t = 0.0f;
            for (int m = 0; m <= r; m++)
                t -= T[i * ldc + bi * 16 + m] * Xb[m * 16 + c];
            T[i * ldc + (bi - d) * 16 + c] = t;
        }
    }
}

/* Step 3's left operand (blockwise kernels): T diag(sc) split into Th + Tl
 * (row stride ldb), rows x rows, 0 past the chunk's n rows and above the
 * diagonal. */
static __device__ __forceinline__ void
hk_tc_a2_split_t(const float *T, int ldc, const float *sc, uint16_t *Th,
                 uint16_t *Tl, int ldb, int n, int rows)
{
    for (int e = threadIdx.x; e < rows * rows; e += blockDim.x) {
        const int i = e / rows, m = e % rows;
        const float t = i < n && m <= i ? T[i * ldc + m] * sc[m] : 0.0f;
        hk_bf16_split(t, &Th[i * ldb + m], &Tl[i * ldb + m]);
    }
}

/* Step 3 on a panel (blockwise kernels): (Th + Tl) B for the panel's w
 * columns of B (Bh, and its lo part Bl: LO; row stride ldp), which are
 * columns col0.. of U, or of W (isw). T is lower triangular: row tile
 * ti < nt sums column tiles kk <= ti. U straight to scratch, -W through
 * the warp's tile stg (hk_tc_store_w<VEC>). Tl NULL: T's hi half only. */
template <bool LO, bool VEC>
static __device__ __forceinline__ void
hk_tc_a2_panel(const hk_tc_ws &ws, const uint16_t *Th, const uint16_t *Tl,
               int ldb, const uint16_t *Bh, const uint16_t *Bl, int ldp, int w,
               int nt, bool isw, int col0, float *stg, size_t hc, int C, int dk,
               int dv)
{
    const int lane = (int)threadIdx.x & 31, warp = (int)threadIdx.x >> 5;
    const int nwarps = blockDim.x >> 5;
    for (int idx = warp; idx < nt * (w / 16); idx += nwarps) {
        const int ti = idx / (w / 16), tj = idx % (w / 16);
        hk_facc u;
        hk_tc_tb<LO>(u, Th, Tl, ldb, Bh + tj * 16, Bl + tj * 16, ldp, ti);
        const int col = col0 + tj * 16;
        if (isw)
            hk_tc_store_w<VEC>(ws, u, stg, lane, hc, C, dk, ti, col);
        else
            wmma::store_matrix_sync(ws.U + (hc * C + ti * 16) * dv + col, u, dv,
                                    wmma::mem_row_major);
    }
}

/* Each of the warp's [K; Q] K^T tiles (hk_tc_a2_kkt's accumulators)
 * through its staging tile stg [16][20]: f(which, ti, tj) with the tile
 * in stg (hk_tc_pair's indices). */
template <class F>
static __device__ __forceinline__ void
hk_tc_a_tiles(hk_facc (&acc)[HK_TC_A2_ACC], float *stg, int warp, int nwarps,
              int npair, F f)
{
#pragma unroll
    for (int r = 0; r < HK_TC_A2_ACC; r++) {
        const int idx = warp + r * nwarps;
        if (idx >= 2 * npair)
            continue;
        int which, ti, tj;
        hk_tc_pair(idx, npair, &which, &ti, &tj);
        hk_wmma_sts(stg, acc[r], 20);
        __syncwarp();
        f(which, ti, tj);
        __syncwarp(); /* stg is rewritten by the warp's next tile */
    }
}

/* Kernel A, blockwise: chunk slot hk_tc_slot, value head blockIdx.y. */
template <bool LO>
static __global__ void __launch_bounds__(HK_TC_A_THREADS, 3)
    hk_gdn_tc_local2_kernel(hk_tc_ws ws, hk_tc_in in, const float *g,
                            const float *beta, const int *cu, int nseq,
                            int nslots, int Hk, int Hv, int dk, int dv, int C,
                            int fast_a)
{
    HK_DYNAMIC_SMEM(smem);
    __shared__ int loc[2];
    hk_probe_start(ws.probe);
    hk_tc_a2_smem s;
    hk_tc_a2_carve(&s, smem, C, LO);
    const hk_tc_a_at ka(ws, nslots, Hk, Hv, dk, dv, C);
    const int h = ka.h, kh = ka.kh, lane = ka.lane, warp = ka.warp;
    const int nwarps = ka.nwarps, ldc = ka.ldc, ldb = ka.ldb;
    const size_t hc = ka.hc, ldq = ka.ldq, ldvg = ka.ldvg;
    const int ldp = HK_TC_A2_PW + HK_PAD16;

    int t0;
    const int n = hk_tc_a_begin(ws, g, beta, cu, nseq, Hv, C, hc, loc, s.gam,
                                s.bv, s.bg, &t0);
    if (n == 0)
        return; /* a spare slot: the whole block leaves */
    hk_probe_at(ws.probe, 0);
    const size_t rq = (size_t)t0 * ldq + (size_t)kh * dk;
    const size_t rv = (size_t)t0 * ldvg + (size_t)h * dv;
    const int nt = (n + 15) / 16, rows = nt * 16, npair = nt * (nt + 1) / 2;

    /* 1. [K; Q] K^T, tiles on and below the diagonal: warp w accumulates
     * pairs w, w + 8, w + 16 over the panels. */
    hk_facc acc[HK_TC_A2_ACC];
#pragma unroll
    for (int r = 0; r < HK_TC_A2_ACC; r++)
        wmma::fill_fragment(acc[r], 0.0f);
    for (int c0 = 0; c0 < dk; c0 += HK_TC_A2_PW) {
        const int w = min(HK_TC_A2_PW, dk - c0);
        if (c0 > 0)
            __syncthreads(); /* the last panel's reads are done */
        hk_tc_stage(s.Kp, ldp, in.k + rq + c0, ldq, rows, n, w);
        hk_tc_stage(s.Qp, ldp, in.q + rq + c0, ldq, rows, n, w);
        if (LO) {
            hk_tc_stage(s.Kpl, ldp, in.kl + rq + c0, ldq, rows, n, w);
            hk_tc_stage(s.Qpl, ldp, in.ql + rq + c0, ldq, rows, n, w);
        }
        __syncthreads();
        hk_tc_a2_kkt<LO>(acc, s.Kp, s.Qp, s.Kpl, s.Qpl, ldp, w / 16, npair);
    }
    __syncthreads(); /* the panels' reads are done: the region holds L, T */
    hk_probe_at(ws.probe, 1);

    /* L = strictly_lower(diag(beta) K K^T (.) Gamma) to shared memory,
     * P = tril(Q K^T (.) Gamma) split into scratch (the tiles above the
     * diagonal are never read, of either). */
    float *stg = s.stage + warp * 16 * 20;
    hk_tc_a_tiles(
        acc, stg, warp, nwarps, npair, [&](int which, int ti, int tj) {
            for (int e = lane; e < 256; e += 32) {
                const int i = ti * 16 + e / 16, j = tj * 16 + e % 16;
                const float x = stg[(e / 16) * 20 + e % 16];
                const float d =
                    i < n && j < i ? hk_gdn_decay(s.gam[i] - s.gam[j]) : 0.0f;
                if (!which) {
                    s.L[i * ldc + j] = x * (s.bv[i] * d);
                    continue;
                }
                const float pv = i < n && j == i ? x : x * d;
                hk_bf16_split(pv, &ws.Ph[hc * C * C + i * C + j],
                              &ws.Pl[hc * C * C + i * C + j]);
            }
        });
    __syncthreads();
    hk_probe_at(ws.probe, 2);

    /* 2. T = (I + L)^{-1}. */
    hk_tc_a2_inverse(s.L, s.T, s.stage, ldc, nt);
    /* 3. U = (T diag(beta)) V, then W = (T diag(beta e^gamma)) K over
     * 64-column panels of V, then of K: T's columns scaled and split into
     * Th, Tl before each (the first kernel's precision). */
    for (int isw = 0; isw < 2; isw++) {
        const int ncol = isw ? dk : dv;
        const uint16_t *xh = isw ? in.k + rq : in.v + rv;
        const uint16_t *xl = !LO ? NULL : isw ? in.kl + rq : in.vl + rv;
        const size_t ldx = isw ? ldq : ldvg;
        __syncthreads(); /* T is written; Th, Tl and the panel are read */
        hk_probe_at(ws.probe, 3 + isw);
        hk_tc_a2_split_t(s.T, ldc, isw ? s.bg : s.bv, s.Th, s.Tl, ldb, n, rows);
        for (int c0 = 0; c0 < ncol; c0 += HK_TC_A2_PW) {
            const int w = min(HK_TC_A2_PW, ncol - c0);
            if (c0 > 0)
                __syncthreads(); /* the last panel's reads are done */
            hk_tc_stage(s.Bh, ldp, xh + c0, ldx, rows, n, w);
            if (LO)
                hk_tc_stage(s.Bl, ldp, xl + c0, ldx, rows, n, w);
            __syncthreads();
            hk_tc_a2_panel<LO, false>(ws, s.Th, fast_a ? NULL : s.Tl, ldb, s.Bh,
                                      s.Bl, ldp, w, nt, isw != 0, c0, stg, hc,
                                      C, dk, dv);
        }
    }
    hk_probe_end(ws.probe, 5);
}

/* ---- kernel A3 (HK_CUDA_GDN_TC_A3): the blockwise kernel, loads in flight
 *
 * Kernel A2's steps, products and outputs (the helpers above), with:
 *   - every panel copied by cp.async into one of two buffers: step 1's
 *     (K, Q) and step 3's (V, then K; not over L and T, so they land
 *     during steps 1 and 2) each have two. The first two of each are
 *     issued as soon as the chunk is located, so the gates' loads and
 *     gamma's serial sum run under them; each later one as soon as the
 *     barrier before a panel's products says its buffer's last panel is
 *     read. A2 stages every panel with plain loads between two barriers,
 *     and its block computes nothing while they are in flight.
 *   - the decay factors of L and P in f32 from the double differences
 *     (hk_gdn_decayf: x = gamma_i - gamma_j in double, then expf), where A2
 *     runs exp in double for each of its 2 C^2 masked elements.
 *   - P and -W stored 16 bytes a lane (8 elements of a row as hi, then
 *     lo: hk_tc_put_split8) from the warp's tile, where A2 stores 2 bytes
 *     a lane and half; L read and written 8 floats a lane.
 *   - gamma's serial sum (the CPU's order) reads g 8 ahead.
 * Panels are 64 columns with bf16 inputs, 32 with f32 inputs (four arrays
 * a step-1 panel), so the buffers fit what A2 used for L and T: 65 KB
 * (bf16) or 71 KB (f32) at C = 64 for any dk, dv, three blocks an SM as
 * A2. At dk = dv = 128 with bf16 inputs every step-1 panel and V's two
 * are in flight at once. Outputs as A2's but for those decay factors
 * (~1e-7 relative) and the order of nothing else. */

#define HK_TC_A3_PW(lo) ((lo) ? 32 : 64) /* panel width, columns */

struct hk_tc_a3_smem {
    uint16_t *r1;      // 1: buffers 0, 1 of [K, (Kl,) Q, (Ql)] [C][PW + 8]
    float *L, *T;      // 2: [C][C + 4], L at r1, T at its end
    uint16_t *Th, *Tl; // 3: [C][C + 8] at r1 (over L, short of T)
    uint16_t *r3;      // buffers 0, 1 of a V or K panel (and its lo part)
    float *stage;      // [warps][16][20]; step 2's X blocks
    double *gam;       // [C]
    float *bv, *bg;    // [C]
};

static __host__ __device__ size_t hk_tc_a3_carve(hk_tc_a3_smem *s,
                                                 unsigned char *p, int C,
                                                 bool lo)
{
    const size_t pan = (size_t)C * (HK_TC_A3_PW(lo) + HK_PAD16) * 2;
    const size_t lt = (size_t)C * (C + HK_PAD32) * 4;
    const size_t tb = (size_t)C * (C + HK_PAD16) * 2;
    size_t r1 = 2 * (lo ? 4 : 2) * pan;
    r1 = r1 > 2 * lt ? r1 : 2 * lt;
    r1 = r1 > 2 * tb + lt ? r1 : 2 * tb + lt;
    const size_t sz[5] = {r1, 2 * (lo ? 2 : 1) * pan,
                          (size_t)(HK_TC_A_THREADS / 32) * 16 * 20 * 4,
                          (size_t)C * 8, (size_t)2 * C * 4};
    size_t off[5];
    const size_t at = hk_layout(sz, 5, 128, off);
    if (s) {
        s->r1 = (uint16_t *)(p + off[0]);
        s->L = (float *)(p + off[0]);
        s->T = (float *)(p + off[0] + r1 - lt); /* lt, r1: 256-byte steps */
        s->Th = s->r1;
        s->Tl = (uint16_t *)(p + off[0] + tb);
        s->r3 = (uint16_t *)(p + off[1]);
        s->stage = (float *)(p + off[2]);
        s->gam = (double *)(p + off[3]);
        s->bv = (float *)(p + off[4]);
        s->bg = s->bv + C;
    }
    return at;
}

/* Kernel A3's cp.async groups, numbered in the order committed (the same
 * in every thread: every issue commits one, empty past the last panel). */
struct hk_tc_a3_pipe {
    int ncom;
    __device__ __forceinline__ void commit()
    {
        hk_cp_async_commit();
        ncom++;
    }
    /* Group g and the ones before it have landed, for the whole block: the
     * groups after g may stay in flight (at most 3 are waited past). */
    __device__ __forceinline__ void wait(int g)
    {
        const int after = ncom - 1 - g;
        if (after >= 3)
            hk_cp_async_wait<3>();
        else if (after == 2)
            hk_cp_async_wait<2>();
        else if (after == 1)
            hk_cp_async_wait<1>();
        else
            hk_cp_async_wait<0>();
        __syncthreads();
    }
};

/* Columns c0.. (pw of them, none from ncol on) of the chunk's rows of a
 * bf16 input x (row stride ld; with LO its lo part xl, into dst + pan) into
 * dst (row stride ldp) by cp.async; nothing when c0 >= ncol. */
template <bool LO>
static __device__ __forceinline__ void
hk_tc_a3_copy(uint16_t *dst, int pan, int ldp, const uint16_t *x,
              const uint16_t *xl, size_t ld, int c0, int ncol, int pw, int rows,
              int n)
{
    if (c0 >= ncol)
        return;
    const int w = min(pw, ncol - c0);
    hk_tc_stage<true>(dst, ldp, x + c0, ld, rows, n, w);
    if (LO)
        hk_tc_stage<true>(dst + pan, ldp, xl + c0, ld, rows, n, w);
}

/* Kernel A3's masks on a warp's tile (which: 0 K K^T, 1 Q K^T; row tile
 * ti, column tile tj) in stg: the lane's row ti 16 + lane / 2, 8 columns
 * from tj 16 + 8 (lane % 2). L's to shared memory as two float4, P's split
 * into scratch 16 bytes a half. A2's masks with hk_gdn_decayf. */
static __device__ __forceinline__ void
hk_tc_a3_mask(const hk_tc_ws &ws, float *L, const double *gam, const float *bv,
              const float *stg, int which, int ti, int tj, int n, int C,
              int ldc, size_t hc, int lane)
{
    const int i = ti * 16 + (lane >> 1), j0 = tj * 16 + (lane & 1) * 8;
    float x[8];
    hk_tc_get8(x, stg, lane);
    const double gi = i < n ? gam[i] : 0.0;
    const float bi = bv[i];
#pragma unroll
    for (int k = 0; k < 8; k++) {
        const int j = j0 + k;
        const float d = i < n && j < i ? hk_gdn_decayf(gi - gam[j]) : 0.0f;
        x[k] = which ? (i < n && j == i ? x[k] : x[k] * d) : x[k] * (bi * d);
    }
    if (which) {
        const size_t at = (hc * C + i) * C + j0;
        hk_tc_put_split8(ws.Ph + at, ws.Pl + at, x);
        return;
    }
    float4 *l = reinterpret_cast<float4 *>(L + i * ldc + j0);
    l[0] = make_float4(x[0], x[1], x[2], x[3]);
    l[1] = make_float4(x[4], x[5], x[6], x[7]);
}

/* Kernel A3: chunk slot hk_tc_slot, value head blockIdx.y. */
template <bool LO>
static __global__ void __launch_bounds__(HK_TC_A_THREADS, 3)
    hk_gdn_tc_local3_kernel(hk_tc_ws ws, hk_tc_in in, const float *g,
                            const float *beta, const int *cu, int nseq,
                            int nslots, int Hk, int Hv, int dk, int dv, int C,
                            int fast_a)
{
    HK_DYNAMIC_SMEM(smem);
    __shared__ int loc[2];
    hk_probe_start(ws.probe);
    hk_tc_a3_smem s;
    hk_tc_a3_carve(&s, smem, C, LO);
    const hk_tc_a_at ka(ws, nslots, Hk, Hv, dk, dv, C);
    const int h = ka.h, kh = ka.kh, lane = ka.lane, warp = ka.warp;
    const int nwarps = ka.nwarps, ldc = ka.ldc, ldb = ka.ldb;
    const size_t hc = ka.hc, ldq = ka.ldq, ldvg = ka.ldvg;
    const int PW = HK_TC_A3_PW(LO), ldp = PW + HK_PAD16, pan = C * ldp;

    const int np1 = (dk + PW - 1) / PW, nv3 = (dv + PW - 1) / PW;
    const int np3 = nv3 + np1;          /* step 3: V's panels, then K's */
    const int st1 = (LO ? 2 : 1) * pan; /* K to Q in a step-1 buffer */
    hk_tc_a3_pipe pipe = {0};
    /* a chunk of m tokens from token t: its rows of k, q from rq, of v
     * from rv; rows of them staged (zeros from m on) */
    struct at_t {
        size_t rq, rv;
        int rows, m;
    };
    auto place = [&](int t, int m) {
        return at_t{(size_t)t * ldq + (size_t)kh * dk,
                    (size_t)t * ldvg + (size_t)h * dv, (m + 15) / 16 * 16, m};
    };
    /* step 1's panel p into buffer p % 2 (K, then Q at + st1) */
    auto issue1 = [&](const at_t &a, int p) {
        uint16_t *b = s.r1 + (p & 1) * 2 * st1;
        hk_tc_a3_copy<LO>(b, pan, ldp, in.k + a.rq, LO ? in.kl + a.rq : NULL,
                          ldq, p * PW, dk, PW, a.rows, a.m);
        hk_tc_a3_copy<LO>(b + st1, pan, ldp, in.q + a.rq,
                          LO ? in.ql + a.rq : NULL, ldq, p * PW, dk, PW, a.rows,
                          a.m);
        pipe.commit();
    };
    /* step 3's panel q (V's, then K's) into its buffer q % 2 */
    auto issue3 = [&](const at_t &a, int q) {
        uint16_t *b = s.r3 + (q & 1) * (LO ? 2 : 1) * pan;
        if (q < nv3)
            hk_tc_a3_copy<LO>(b, pan, ldp, in.v + a.rv,
                              LO ? in.vl + a.rv : NULL, ldvg, q * PW, dv, PW,
                              a.rows, a.m);
        else
            hk_tc_a3_copy<LO>(b, pan, ldp, in.k + a.rq,
                              LO ? in.kl + a.rq : NULL, ldq, (q - nv3) * PW, dk,
                              PW, a.rows, a.m);
        pipe.commit();
    };

    /* groups 0, 1: step 1's first panels; 2, 3: step 3's; in flight
     * while the gates load and gamma is summed */
    int t0;
    const int n = hk_tc_a_begin<8>(ws, g, beta, cu, nseq, Hv, C, hc, loc, s.gam,
                                   s.bv, s.bg, &t0, [&](int t, int m) {
                                       const at_t a = place(t, m);
                                       issue1(a, 0);
                                       issue1(a, 1);
                                       issue3(a, 0);
                                       issue3(a, 1);
                                   });
    if (n == 0)
        return; /* a spare slot: the whole block leaves */
    hk_probe_at(ws.probe, 0);
    const at_t at = place(t0, n);
    const int nt = at.rows / 16, rows = at.rows, npair = nt * (nt + 1) / 2;

    /* 1. [K; Q] K^T as A2's. Panel p >= 2 is issued at step p - 1, after
     * that step's barrier (every read of panel p - 2, in the same buffer,
     * is done): group p + 2. */
    hk_facc acc[HK_TC_A2_ACC];
#pragma unroll
    for (int r = 0; r < HK_TC_A2_ACC; r++)
        wmma::fill_fragment(acc[r], 0.0f);
    for (int p = 0; p < np1; p++) {
        pipe.wait(p < 2 ? p : p + 2);
        if (p >= 1)
            issue1(at, p + 1);
        const uint16_t *b = s.r1 + (p & 1) * 2 * st1;
        hk_tc_a2_kkt<LO>(acc, b, b + st1, b + pan, b + st1 + pan, ldp,
                         min(PW, dk - p * PW) / 16, npair);
    }
    __syncthreads(); /* the panels' reads are done: r1 holds L, T */
    hk_probe_at(ws.probe, 1);

    /* L and P as A2's, 8 elements a lane */
    float *stg = s.stage + warp * 16 * 20;
    hk_tc_a_tiles(acc, stg, warp, nwarps, npair,
                  [&](int which, int ti, int tj) {
                      hk_tc_a3_mask(ws, s.L, s.gam, s.bv, stg, which, ti, tj, n,
                                    C, ldc, hc, lane);
                  });
    __syncthreads();
    hk_probe_at(ws.probe, 2);

    /* 2. T = (I + L)^{-1} */
    hk_tc_a2_inverse(s.L, s.T, s.stage, ldc, nt);

    /* 3. U, then W, as A2's; Th, Tl over L. Step 1 committed np1 - 1
     * groups after the first four, so panel q >= 2 (issued at step q - 1)
     * is group np1 + q + 1. */
    for (int q = 0; q < np3; q++) {
        const bool isw = q >= nv3;
        if (q == 0 || q == nv3) {
            __syncthreads(); /* T is written; the last Th, Tl reads done */
            hk_probe_at(ws.probe, isw ? 4 : 3);
            hk_tc_a2_split_t(s.T, ldc, isw ? s.bg : s.bv, s.Th, s.Tl, ldb, n,
                             rows);
        }
        pipe.wait(q < 2 ? q + 2 : np1 + q + 1);
        if (q >= 1)
            issue3(at, q + 1);
        const int c0 = (isw ? q - nv3 : q) * PW;
        const uint16_t *b = s.r3 + (q & 1) * (LO ? 2 : 1) * pan;
        hk_tc_a2_panel<LO, true>(ws, s.Th, fast_a ? NULL : s.Tl, ldb, b,
                                 b + pan, ldp, min(PW, (isw ? dk : dv) - c0),
                                 nt, isw, c0, stg, hc, C, dk, dv);
    }
    hk_probe_end(ws.probe, 5);
}

size_t hk_tc_local_smem(int a1, int a3, int dk, int dv, int C, bool lo)
{
    return a1   ? hk_tc_a_carve(NULL, NULL, dk, dv, C, lo)
           : a3 ? hk_tc_a3_carve(NULL, NULL, C, lo)
                : hk_tc_a2_carve(NULL, NULL, C, lo);
}

/* The probes' phases of A2 and A3 (hk_probe.h): each ends at a barrier
 * (W at the block's last warp). */
static const char *const hk_tc_a_phases[] = {"begin",   "kkt", "masks",
                                             "inverse", "U",   "W"};
static const hk_probe_kind hk_tc_a2_probe = {"A2", hk_tc_a_phases, 6, 0, 0};
static const hk_probe_kind hk_tc_a3_probe = {"A3", hk_tc_a_phases, 6, 0, 0};

/* Kernel A as planned, over the launch's chunk slots and the heads. */
template <bool LO>
int hk_tc_launch_local(const hk_tc_plan &p, const hk_tc_call &a)
{
    const unsigned nx = (unsigned)(a.ws.seg1 - a.ws.seg0);
    const dim3 grid(nx, a.Hv);
    hk_tc_ws ws = a.ws; /* A1 is not probed */
    if (!p.A1 && a.probe)
        ws.probe = hk_probe_launch(p.A3 ? &hk_tc_a3_probe : &hk_tc_a2_probe,
                                   (size_t)nx * a.Hv, 0, a.s);
#define HK_TC_LOCAL(KERNEL)                                                    \
    do {                                                                       \
        cudaFuncSetAttribute(KERNEL<LO>,                                       \
                             cudaFuncAttributeMaxDynamicSharedMemorySize,      \
                             (int)p.sa);                                       \
        KERNEL<LO><<<grid, HK_TC_A_THREADS, p.sa, a.s>>>(                      \
            ws, a.in, a.g, a.beta, a.cu_seqlens, a.nseq, (int)a.slots, a.Hk,   \
            a.Hv, a.dk, a.dv, a.C, a.fast_a);                                  \
    } while (0)
    if (p.A1)
        HK_TC_LOCAL(hk_gdn_tc_local_kernel);
    else if (p.A3)
        HK_TC_LOCAL(hk_gdn_tc_local3_kernel);
    else
        HK_TC_LOCAL(hk_gdn_tc_local2_kernel);
#undef HK_TC_LOCAL
    return hk_cuda_check_launch();
}

template int hk_tc_launch_local<false>(const hk_tc_plan &p,
                                       const hk_tc_call &a);
template int hk_tc_launch_local<true>(const hk_tc_plan &p, const hk_tc_call &a);
