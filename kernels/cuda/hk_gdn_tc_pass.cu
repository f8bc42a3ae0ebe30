/*
 * hk_gdn_tc_pass.cu - v2's state pass of the tensor-core chunked prefill
 * (hk_gdn_tc.cu): kernel R (the state in registers, the default; with
 * HK_CUDA_GDN_TC_FUSE_O the outputs too) and kernel P (the state in
 * shared memory), on the shared memory and copies they share; the launch
 * of the one planned. Kernel O (hk_gdn_tc_out.cu) makes the outputs from
 * the starting states and Vn they write.
 */
#include "kernels/cuda/hk_gdn_tc.h"

/* ---- v2: the state pass computes states only; outputs in parallel -------
 *
 * Kernel B of v1 does the outputs inside the sequential loop and reads
 * its W, Q, K tiles straight from global memory, so each chunk step waits
 * on loads. v2 splits it:
 *   P. per (sequence, value head, BV columns of [S | Tc]), 8 warps,
 *      sequential over chunks: Vn = U - W S; S = e^{gamma_n} S + K^T X.
 *      The next chunk's W, K, U and gamma are copied into the other half
 *      of a double buffer (cp.async) while this chunk computes; the S
 *      columns also write the chunk's starting state (its hi/lo split,
 *      which W S needs anyway) and Vn to scratch.
 *   O. per (chunk slot, BVO output columns, value head), 8 warps, all in
 *      parallel: O = e^{gamma} (Q S_c) + P Vn.
 * Precision: the same hi/lo splits as v1, or with fast set single bf16
 * products of the hi parts in P and O (FLA's bf16 accuracy, ~1e-3 of
 * O(1) outputs; half the MMAs and scratch reads). Kernel A is shared.
 * With LO (f32 inputs) P stages K's lo rows too and O Q's, for the lo
 * terms K^T X and Q S gain (not with fast). */

#define HK_TC_P_THREADS 256

struct hk_tc_p_smem {
    /* [1] is [0] with one buffer (nbuf = 1; then Vf[0] is Ub[0]), [2]
     * is [0] with fewer than three (kernel R's HK_CUDA_GDN_TC_DEEP) */
    uint16_t *Wh[3], *Wl[3]; // [C][dk + 8]   -W of a chunk
    uint16_t *Kb[3];         // [C][dk + 8]   K rows (zero past the chunk)
    uint16_t *Kl[3];         // [C][dk + 8]   their lo parts (LO only)
    float *Ub[3];            // [C][BV + 4]   U columns
    double *gb[3];           // [C]           gamma
    float *Sf;               // [dk][BV + 4]  the state tile, f32
    uint16_t *Sh, *Sl;       // [dk][BV + 8]  its split
    float *Vf;               // [2][C][BV + 4] Vn, partial sums over dk
    uint16_t *Xh, *Xl;       // [C][BV + 8]   e^{gamma_n - gamma} Vn split
    float *en;               // [C]
};

/* The output warps' region of kernel R with the outputs fused. */
struct hk_tc_ro_smem {
    uint16_t *Vh, *Vl; // [C][BV + 8]   Vn split (the state warps write it)
    uint16_t *Qs, *Ql; // [C][dk + 8]   Q rows, each warp its 16 (Ql: LO)
    uint16_t *Ph, *Pl; // [C][C + 8]    P rows, each warp its 16
};

/* Kernel P's shared memory (f32: with its f32 state and Vn tiles) and
 * kernel R's (without them: R keeps the state in registers), and with the
 * outputs fused (out, R) the output warps' region r after them. */
static __host__ __device__ size_t hk_tc_p_carve(hk_tc_p_smem *s,
                                                hk_tc_ro_smem *r,
                                                unsigned char *p, int dk, int C,
                                                int BV, bool lo, int nbuf,
                                                bool f32, bool out)
{
    const int ldk = dk + HK_PAD16, ldf = BV + HK_PAD32, ldh = BV + HK_PAD16;
    const size_t w = (size_t)C * ldk * 2, u = (size_t)C * ldf * 4;
    const size_t w2 = nbuf >= 2 ? w : 0; /* the second buffer */
    const size_t w3 = nbuf == 3 ? w : 0; /* the third (kernel R's DEEP) */
    const size_t xh = (size_t)C * ldh * 2;
    const size_t pp = (size_t)C * (C + HK_PAD16) * 2;
    const size_t sz[30] = {w,
                           w2,
                           w,
                           w2,
                           w,
                           w2,
                           nbuf >= 2 ? u : 2 * u, /* one: Vf's room too */
                           nbuf >= 2 ? u : 0,
                           (size_t)C * 8,
                           nbuf >= 2 ? (size_t)C * 8 : 0,
                           f32 ? (size_t)dk * ldf * 4 : 0,
                           (size_t)dk * ldh * 2,
                           (size_t)dk * ldh * 2,
                           nbuf >= 2 && f32 ? 2 * u : 0,
                           xh,
                           xh,
                           (size_t)C * 4,
                           lo ? w : 0,
                           lo ? w2 : 0,
                           out ? xh : 0,
                           out ? xh : 0,
                           out ? w : 0,
                           out && lo ? w : 0,
                           out ? 2 * pp : 0,
                           w3,
                           w3,
                           w3,
                           nbuf == 3 ? u : 0,
                           nbuf == 3 ? (size_t)C * 8 : 0,
                           lo ? w3 : 0};
    size_t off[30];
    const size_t at = hk_layout(sz, 30, 128, off);
    if (s) {
        for (int i = 0; i < 2; i++) {
            const int j = nbuf >= 2 ? i : 0;
            s->Wh[i] = (uint16_t *)(p + off[j]);
            s->Wl[i] = (uint16_t *)(p + off[2 + j]);
            s->Kb[i] = (uint16_t *)(p + off[4 + j]);
            s->Ub[i] = (float *)(p + off[6 + j]);
            s->gb[i] = (double *)(p + off[8 + j]);
            s->Kl[i] = lo ? (uint16_t *)(p + off[17 + j]) : NULL;
        }
        const bool b3 = nbuf == 3;
        s->Wh[2] = b3 ? (uint16_t *)(p + off[24]) : s->Wh[0];
        s->Wl[2] = b3 ? (uint16_t *)(p + off[25]) : s->Wl[0];
        s->Kb[2] = b3 ? (uint16_t *)(p + off[26]) : s->Kb[0];
        s->Ub[2] = b3 ? (float *)(p + off[27]) : s->Ub[0];
        s->gb[2] = b3 ? (double *)(p + off[28]) : s->gb[0];
        s->Kl[2] = b3 && lo ? (uint16_t *)(p + off[29]) : s->Kl[0];
        s->Sf = f32 ? (float *)(p + off[10]) : NULL;
        s->Sh = (uint16_t *)(p + off[11]);
        s->Sl = (uint16_t *)(p + off[12]);
        /* one buffer: a U tile is read by the warp that writes its Vn
         * tile over it, and the next chunk's U lands after Vn is read */
        s->Vf = !f32 ? NULL : (float *)(p + off[nbuf >= 2 ? 13 : 6]);
        s->Xh = (uint16_t *)(p + off[14]);
        s->Xl = (uint16_t *)(p + off[15]);
        s->en = (float *)(p + off[16]);
    }
    if (r) {
        r->Vh = out ? (uint16_t *)(p + off[19]) : NULL;
        r->Vl = out ? (uint16_t *)(p + off[20]) : NULL;
        r->Qs = out ? (uint16_t *)(p + off[21]) : NULL;
        r->Ql = out && lo ? (uint16_t *)(p + off[22]) : NULL;
        r->Ph = out ? (uint16_t *)(p + off[23]) : NULL;
        r->Pl = out ? (uint16_t *)(p + off[23] + pp) : NULL;
    }
    return at;
}

/* x[bf] of three (selects, not an index: an indexed pointer array goes
 * to the stack). */
template <class P>
static __device__ __forceinline__ P hk_tc_sel3(P const (&x)[3], int bf)
{
    return bf == 2 ? x[2] : bf ? x[1] : x[0];
}

/* Buffer bf of kernel P's or R's buffers. */
struct hk_tc_p_buf {
    const double *gam;
    const uint16_t *Wh, *Wl, *Kb, *Kl;
    const float *Ub;
};

static __device__ __forceinline__ hk_tc_p_buf
hk_tc_p_pick(const hk_tc_p_smem &s, int bf)
{
    hk_tc_p_buf t;
    t.gam = hk_tc_sel3(s.gb, bf);
    t.Wh = hk_tc_sel3(s.Wh, bf);
    t.Wl = hk_tc_sel3(s.Wl, bf);
    t.Kb = hk_tc_sel3(s.Kb, bf);
    t.Kl = hk_tc_sel3(s.Kl, bf);
    t.Ub = hk_tc_sel3(s.Ub, bf);
    return t;
}

/* Issues (and commits, one group) the copies of chunk slot hc (tokens
 * t0.., n of them) into buffer bf by hk_ptx.h's cp.async (which the
 * emulator lands at the wait in tid order, so a wait that leaves a chunk
 * in flight fails there): the rows of its nt 16-row tiles of -W (hi; lo
 * unless fast) and K (zeros past n, nothing read there; K's lo rows from
 * klr unless NULL), U's BV columns from col0 (S columns only), gamma; by
 * the block's first nthr threads (the caller among them). */
static __device__ void hk_tc_p_fetch(const hk_tc_p_smem &s, const hk_tc_ws &ws,
                                     const uint16_t *kr, const uint16_t *klr,
                                     size_t ldq, int bf, size_t hc, int n,
                                     int dk, int dv, int C, int BV, int col0,
                                     bool is_tc, int fast, int nthr)
{
    const int rows = (n + 15) / 16 * 16, ldk = dk + HK_PAD16;
    const int ldf = BV + HK_PAD32, vk = dk / 8, vu = BV / 4;
    uint16_t *Wh = hk_tc_sel3(s.Wh, bf), *Wl = hk_tc_sel3(s.Wl, bf);
    uint16_t *Kb = hk_tc_sel3(s.Kb, bf), *Kl = hk_tc_sel3(s.Kl, bf);
    float *Ub = hk_tc_sel3(s.Ub, bf);
    double *gb = hk_tc_sel3(s.gb, bf);
    for (int e = threadIdx.x; e < rows * vk; e += nthr) {
        const int i = e / vk, c = (e % vk) * 8;
        const size_t at = (hc * C + i) * dk + c;
        hk_cp_async16(Wh + i * ldk + c, ws.Wh + at, 16);
        if (!fast)
            hk_cp_async16(Wl + i * ldk + c, ws.Wl + at, 16);
        const bool in = i < n;
        hk_cp_async16(Kb + i * ldk + c, in ? kr + (size_t)i * ldq + c : kr,
                      in ? 16 : 0);
        if (klr)
            hk_cp_async16(Kl + i * ldk + c,
                          in ? klr + (size_t)i * ldq + c : klr, in ? 16 : 0);
    }
    if (!is_tc)
        for (int e = threadIdx.x; e < rows * vu; e += nthr) {
            const int i = e / vu, c = (e % vu) * 4;
            hk_cp_async16(Ub + i * ldf + c, ws.U + (hc * C + i) * dv + col0 + c,
                          16);
        }
    for (int e = threadIdx.x; e < C / 2; e += nthr)
        hk_cp_async16(gb + 2 * e, ws.gam + hc * C + 2 * e, 16);
    hk_cp_async_commit();
}

/* Chunk c of the block's sequence (tokens ts + c C.., of len; slots from
 * hc0) into buffer bf, by hk_tc_p_fetch. kl0: K's lo rows, or NULL. */
static __device__ void
hk_tc_p_fetch_chunk(const hk_tc_p_smem &s, const hk_tc_ws &ws,
                    const uint16_t *kh0, const uint16_t *kl0, size_t ldq,
                    int bf, size_t hc0, int ts, int len, int c, int dk, int dv,
                    int C, int BV, int col0, bool is_tc, int fast, int nthr)
{
    const size_t rn = (size_t)(ts + c * C) * ldq;
    hk_tc_p_fetch(s, ws, kh0 + rn, kl0 ? kl0 + rn : NULL, ldq, bf, hc0 + c,
                  min(C, len - c * C), dk, dv, C, BV, col0, is_tc, fast, nthr);
}

/* Kernel P: column block blockIdx.x of [S | Tc], value head blockIdx.y,
 * sequence blockIdx.z. LO: K has lo parts (f32 inputs). nbuf = 2: the next
 * chunk's tiles are fetched while this one computes; 1 (the shared-SM
 * variant, HK_CUDA_GDN_TC_PSHARE): after it, in half the shared memory and
 * at most 128 registers, so two blocks share an SM and hide each other's
 * waits. */
template <int BV, bool LO, int NBUF>
static __global__ void __launch_bounds__(HK_TC_P_THREADS, NBUF == 1 ? 2 : 1)
    hk_gdn_tc_pass_kernel(hk_tc_ws ws, float *const *states, float *const *tcs,
                          hk_tc_in in, const int *cu, int nslots, int Hk,
                          int Hv, int dk, int dv, int C, int fast)
{
    const int nbuf = NBUF;
    HK_DYNAMIC_SMEM(smem);
    __shared__ int first;
    hk_tc_p_smem s;
    hk_tc_p_carve(&s, NULL, smem, dk, C, BV, LO, nbuf, true, false);
    const hk_tc_pass_at pa(ws, states, tcs, cu, BV, Hk, Hv, dk, dv, C);
    if (pa.skip)
        return; /* no chunk of this segment: the whole block leaves */
    const int h = pa.h, kh = pa.kh, col0 = pa.col0, ldg = pa.ldg;
    const int ts = pa.ts, len = pa.len, nch = pa.nch;
    const bool is_tc = pa.is_tc;
    float *Sg = pa.Sg;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int nwarps = blockDim.x >> 5;
    const int ldf = BV + HK_PAD32, ldh = BV + HK_PAD16, ldk = dk + HK_PAD16;
    const size_t ldq = (size_t)Hk * dk;
    const int NB = BV / 16, nk = dk / 16;
    /* Two warps split each Vn tile's dk sum (BV = 16 has fewer tiles than
     * warps); the same at every BV, so sums do not depend on it. */
    const int KS = nk % 2 == 0 ? 2 : 1;
    const uint16_t *kh0 = in.k + (size_t)kh * dk;
    const uint16_t *kl0 = LO && !fast ? in.kl + (size_t)kh * dk : NULL;

    if (tid == 0)
        first = pa.first;
    for (int e = tid; e < dk * BV; e += blockDim.x) {
        const int i = e / BV, j = e % BV;
        const float x = is_tc && !pa.cont ? (i == col0 + j ? 1.0f : 0.0f)
                                          : Sg[(size_t)i * ldg + col0 + j];
        s.Sf[i * ldf + j] = x;
        hk_bf16_split(x, &s.Sh[i * ldh + j], &s.Sl[i * ldh + j]);
    }
    __syncthreads();
    if (nch > 0)
        hk_tc_p_fetch_chunk(s, ws, kh0, kl0, ldq, 0, (size_t)h * nslots + first,
                            ts, len, 0, dk, dv, C, BV, col0, is_tc, fast,
                            blockDim.x);

    for (int c = 0; c < nch; c++) {
        const int bf = nbuf == 2 ? c & 1 : 0;
        const int n = min(C, len - c * C), nt = (n + 15) / 16;
        const size_t hc = (size_t)h * nslots + first + c;
        hk_cp_async_wait<0>();
        /* chunk c's copies landed everywhere; last step's S split is
         * written; every read of buffer bf ^ 1 (chunk c - 1) is done */
        __syncthreads();
        if (nbuf == 2 && c + 1 < nch) {
            hk_tc_p_fetch_chunk(s, ws, kh0, kl0, ldq, bf ^ 1, hc - c, ts, len,
                                c + 1, dk, dv, C, BV, col0, is_tc, fast,
                                blockDim.x);
        }
        const hk_tc_p_buf t = hk_tc_p_pick(s, bf);
        const double *gam = t.gam;
        const uint16_t *Wh = t.Wh, *Wl = t.Wl, *Kb = t.Kb, *Kl = t.Kl;
        const float *Ub = t.Ub;
        if (!is_tc) /* the chunk's starting state, for the output kernel */
            for (int e = tid; e < dk * NB * 2; e += blockDim.x) {
                const int i = e / (NB * 2), j = (e % (NB * 2)) * 8;
                const size_t at = (hc * dk + i) * dv + col0 + j;
                *reinterpret_cast<uint4 *>(ws.Sh + at) =
                    *reinterpret_cast<const uint4 *>(s.Sh + i * ldh + j);
                if (!fast)
                    *reinterpret_cast<uint4 *>(ws.Sl + at) =
                        *reinterpret_cast<const uint4 *>(s.Sl + i * ldh + j);
            }

        /* Vn = U + (-W) S, the dk sum in KS parts. */
        for (int idx = warp; idx < nt * NB * KS; idx += nwarps) {
            const int part = idx / (nt * NB), r = idx % (nt * NB);
            const int ti = r / NB, tj = r % NB;
            hk_facc acc;
            if (part == 0 && !is_tc)
                wmma::load_matrix_sync(acc, Ub + ti * 16 * ldf + tj * 16, ldf,
                                       wmma::mem_row_major);
            else
                wmma::fill_fragment(acc, 0.0f);
            for (int kk = part * (nk / KS); kk < (part + 1) * (nk / KS); kk++) {
                hk_fb_row sh, sl;
                hk_fa_row a;
                wmma::load_matrix_sync(
                    sh, hk_bf(s.Sh + kk * 16 * ldh + tj * 16), ldh);
                wmma::load_matrix_sync(a, hk_bf(Wh + ti * 16 * ldk + kk * 16),
                                       ldk);
                wmma::mma_sync(acc, a, sh, acc);
                if (fast)
                    continue;
                wmma::load_matrix_sync(
                    sl, hk_bf(s.Sl + kk * 16 * ldh + tj * 16), ldh);
                wmma::mma_sync(acc, a, sl, acc);
                wmma::load_matrix_sync(a, hk_bf(Wl + ti * 16 * ldk + kk * 16),
                                       ldk);
                wmma::mma_sync(acc, a, sh, acc);
            }
            wmma::store_matrix_sync(s.Vf + (part * C + ti * 16) * ldf + tj * 16,
                                    acc, ldf, wmma::mem_row_major);
        }
        for (int i = tid; i < C; i += blockDim.x)
            s.en[i] = i < n ? hk_gdn_decay(gam[n - 1] - gam[i]) : 0.0f;
        __syncthreads();

        /* Vn to scratch (S columns); e^{gamma_n - gamma} Vn split; S's
         * e^{gamma_n}. Rows past the chunk are 0 (U and W rows are). */
        for (int e = tid; e < nt * 16 * BV; e += blockDim.x) {
            const int i = e / BV, j = e % BV;
            float vn = s.Vf[i * ldf + j];
            if (KS > 1)
                vn += s.Vf[(C + i) * ldf + j];
            if (is_tc && fabsf(vn) < HK_GDN_TINY)
                vn = 0.0f;
            if (!is_tc) {
                const size_t at = (hc * C + i) * dv + col0 + j;
                uint16_t hi, lo;
                hk_bf16_split(vn, &hi, &lo);
                ws.Vh[at] = hi;
                if (!fast)
                    ws.Vl[at] = lo;
            }
            hk_bf16_split(s.en[i] * vn, &s.Xh[i * ldh + j], &s.Xl[i * ldh + j]);
        }
        const float egn = hk_gdn_decay(gam[n - 1]);
        for (int e = tid; e < dk * BV; e += blockDim.x)
            s.Sf[(e / BV) * ldf + e % BV] *= egn;
        __syncthreads();

        /* S += K^T X; each warp splits the tiles it wrote for the next
         * chunk's W S. */
        for (int idx = warp; idx < nk * NB; idx += nwarps) {
            const int ti = idx / NB, tj = idx % NB;
            float *St = s.Sf + ti * 16 * ldf + tj * 16;
            hk_facc acc;
            wmma::load_matrix_sync(acc, St, ldf, wmma::mem_row_major);
            for (int kk = 0; kk < nt; kk++) {
                hk_fa_col a;
                hk_fb_row xh, xl;
                wmma::load_matrix_sync(a, hk_bf(Kb + kk * 16 * ldk + ti * 16),
                                       ldk);
                wmma::load_matrix_sync(
                    xh, hk_bf(s.Xh + kk * 16 * ldh + tj * 16), ldh);
                wmma::mma_sync(acc, a, xh, acc);
                if (fast)
                    continue;
                wmma::load_matrix_sync(
                    xl, hk_bf(s.Xl + kk * 16 * ldh + tj * 16), ldh);
                wmma::mma_sync(acc, a, xl, acc);
                if (LO) { /* + K_lo^T X_hi */
                    wmma::load_matrix_sync(
                        a, hk_bf(Kl + kk * 16 * ldk + ti * 16), ldk);
                    wmma::mma_sync(acc, a, xh, acc);
                }
            }
            if (is_tc)
                for (int e = 0; e < acc.num_elements; e++)
                    if (fabsf(acc.x[e]) < HK_GDN_TINY)
                        acc.x[e] = 0.0f;
            wmma::store_matrix_sync(St, acc, ldf, wmma::mem_row_major);
            __syncwarp();
            for (int e = lane; e < 256; e += 32) {
                const int r = ti * 16 + e / 16, cc = tj * 16 + e % 16;
                hk_bf16_split(s.Sf[r * ldf + cc], &s.Sh[r * ldh + cc],
                              &s.Sl[r * ldh + cc]);
            }
        }
        if (nbuf == 1 && c + 1 < nch) {
            __syncthreads(); /* every read of chunk c's tiles is done */
            hk_tc_p_fetch_chunk(s, ws, kh0, kl0, ldq, 0, hc - c, ts, len, c + 1,
                                dk, dv, C, BV, col0, is_tc, fast, blockDim.x);
        }
    }
    __syncthreads();
    for (int e = tid; e < dk * BV; e += blockDim.x) {
        const int i = e / BV, j = e % BV;
        Sg[(size_t)i * ldg + col0 + j] = s.Sf[i * ldf + j];
    }
}

/* ---- the state pass with the state in registers (the default: R) ------
 *
 * Kernel P keeps the state tile in shared memory as f32 and splits it to
 * bf16 there every chunk, and goes through shared memory for each wmma
 * tile, with three barriers a chunk: each chunk step is latency, not
 * arithmetic (0.5-1.6M MACs a chunk and block at dk = 128, BV = 32, fast
 * or split, on tensor cores). Kernel R holds the state as mma.sync
 * accumulators, FlashAttention-2's way (hk_ptx.h):
 * NW = 4 warps, warp w the state rows w dk / NW .. (MT = dk / (16 NW)
 * tiles of 16 rows) across the BV columns. Per chunk:
 *   1. the state (the chunk's starting one) to shared memory as bf16 hi
 *      (and lo), and to scratch for the output kernel; barrier (with the
 *      chunk's copies landed; the next chunk's are issued after it);
 *   2. warp w < C / 16: Vn rows 16 w.. = U + (-W) S on mma (W by
 *      ldmatrix, S by ldmatrix.trans), in registers; to scratch;
 *   3. X = e^{gamma_n - gamma} Vn, split, to shared memory; S *= e^{gamma_n}
 *      in registers; barrier;
 *   4. S += K^T X on mma (K^T by ldmatrix.trans of K's rows, X by
 *      ldmatrix.trans), in registers.
 * Two barriers a chunk and no f32 tile in shared memory. The products and
 * their splits are kernel P's (hi*hi + hi*lo + lo*hi, or hi only with
 * fast; K's lo rows with LO), in another order of f32 sums. The shared
 * memory is kernel P's double-buffered carve without its f32 tiles, the
 * copies hk_tc_p_fetch's. Requires dk a multiple of 64 (at most 256).
 *
 * R64 (HK_CUDA_GDN_TC_R64, untimed): BV = 64 on NW = 8 warps (dk = 128:
 * at 256 its tiles pass the shared memory; not fused: 191 KB, 225 KB with
 * K's lo rows), where BV = 32 would make more blocks than the device
 * has SMs (T_C's columns on Qwen3-Next's heads: 256 blocks of 4 warps,
 * two an SM). Every block reads its head's W, K and gates each chunk, so
 * half the blocks halve those copies from L2 and their shared memory; the
 * SM holds as many state warps, and the products are the same. Session
 * 15's H200 put T_C at +37 % of the pass there (target 20 %), +20 % on
 * the 0.8B's heads, where T_C doubles the columns of as many blocks.
 * Step 2 then runs on all 8 warps: two a 16-row tile of Vn, 32 columns
 * each.
 *
 * DEEP (HK_CUDA_GDN_TC_DEEP, untimed): nb = 3 buffers, chunk c's tiles
 * issued at chunk c - 2's step instead of c - 1's, so a chunk's copies have
 * two steps to land. Session 15's rows suggest the step waits on them:
 * FAST (a third of the products, W's lo rows not copied: 30 % fewer bytes)
 * took 20 % off the pass, where a chain of dependent MMAs would have lost
 * more. Where three buffers fit (at dk = 128: no lo halves, not fused).
 *
 * W8 (HK_CUDA_GDN_TC_W8, untimed): BV = 16 or 32 on NW = 8 warps (MT =
 * dk / 128). With 4 warps one block an SM gives each of its 4 schedulers
 * one warp, so every step's latency is the chunk's: ~2,700 instructions
 * a warp and chunk at BV = 32 (sm_90a), where session 15's H200 spent
 * ~5,500-7,000 cycles a chunk. On 8 warps each holds half the rows: half
 * the split, K^T X and copies a warp, and two warps a scheduler. Step 2
 * runs on 8 warps at BV = 32 (16 columns each), on warps 0-3 at BV = 16.
 * Fused (dk = 128): 12 warps, 168 registers a thread, no spills (sm_90a).
 * Each product and sum is the same, so the results are too. */
/* With the outputs fused (HK_CUDA_GDN_TC_FUSE_O): 4 more warps. */
#define HK_TC_O_WARPS 4

/* acc (16 rows of BV columns as mma C fragments, acc[8-column tile][4])
 * += A B over nk 16-deep steps: A's 16 rows at Ah (row stride lda; lo
 * parts at Al with AL) by ldmatrix, B [16 nk][BV] at Bh (row stride ldb;
 * Bl with BL) by ldmatrix.trans, in hk_mma2's order (al b, a bl, a b). */
template <int BV, bool AL, bool BL>
static __device__ __forceinline__ void
hk_tc_frag_mm(float (*acc)[4], const uint16_t *Ah, const uint16_t *Al, int lda,
              const uint16_t *Bh, const uint16_t *Bl, int ldb, int nk, int lane)
{
    const int ar = (lane & 7) + ((lane >> 3) & 1) * 8, ac = (lane >> 4) * 8;
    for (int kk = 0; kk < nk; kk++) {
        uint32_t a[4], al[4];
        const int ao = ar * lda + kk * 16 + ac;
        hk_ldmatrix_x4(a, Ah + ao);
        if (AL)
            hk_ldmatrix_x4(al, Al + ao);
#pragma unroll
        for (int dp = 0; dp < BV / 16; dp++) {
            uint32_t bb[4], bl[4];
            const int at = (kk * 16 + ar) * ldb + ac + dp * 16;
            hk_ldmatrix_x4_trans(bb, Bh + at);
            if (BL)
                hk_ldmatrix_x4_trans(bl, Bl + at);
            hk_mma2<AL, BL>(acc[2 * dp], acc[2 * dp + 1], a, AL ? al : a, bb,
                            BL ? bl : bb);
        }
    }
}

/* The same with the lo terms chosen at run time. */
template <int BV>
static __device__ __forceinline__ void
hk_tc_frag_mm_rt(bool al, bool bl, float (*acc)[4], const uint16_t *Ah,
                 const uint16_t *Al, int lda, const uint16_t *Bh,
                 const uint16_t *Bl, int ldb, int nk, int lane)
{
    if (al && bl)
        hk_tc_frag_mm<BV, true, true>(acc, Ah, Al, lda, Bh, Bl, ldb, nk, lane);
    else if (bl)
        hk_tc_frag_mm<BV, false, true>(acc, Ah, Al, lda, Bh, Bl, ldb, nk, lane);
    else if (al)
        hk_tc_frag_mm<BV, true, false>(acc, Ah, Al, lda, Bh, Bl, ldb, nk, lane);
    else
        hk_tc_frag_mm<BV, false, false>(acc, Ah, Al, lda, Bh, Bl, ldb, nk,
                                        lane);
}

/* An output warp's copies of its rows 16 ti.. of a chunk, by its 32
 * lanes, committed as one group (hk_ptx.h's cp.async, which the emulator
 * lands at the wait, so a missing wait fails there; it runs
 * __pipeline_memcpy_async at once). Q's rows from qr (row stride ldq;
 * zeros past the chunk's n rows; Ql's from qlr unless NULL): */
static __device__ void hk_tc_ro_fetch_q(const hk_tc_ro_smem &r,
                                        const uint16_t *qr, const uint16_t *qlr,
                                        size_t ldq, int n, int ti, int dk,
                                        int lane)
{
    const int ldk = dk + HK_PAD16;
    for (int e = lane; e < 16 * (dk / 8); e += 32) {
        const int i = 16 * ti + e / (dk / 8), c = e % (dk / 8) * 8;
        const bool in = i < n;
        hk_cp_async16(r.Qs + i * ldk + c, in ? qr + (size_t)i * ldq + c : qr,
                      in ? 16 : 0);
        if (qlr)
            hk_cp_async16(r.Ql + i * ldk + c,
                          in ? qlr + (size_t)i * ldq + c : qlr, in ? 16 : 0);
    }
    hk_cp_async_commit();
}

/* ... and P's rows of slot hc, their first 16 (ti + 1) columns (hi; lo
 * unless fast), the only ones its lower triangle reads. */
static __device__ void hk_tc_ro_fetch_p(const hk_tc_ro_smem &r,
                                        const hk_tc_ws &ws, size_t hc, int ti,
                                        int C, int fast, int lane)
{
    const int ldp = C + HK_PAD16, w8 = 2 * (ti + 1);
    for (int e = lane; e < 16 * w8; e += 32) {
        const int i = 16 * ti + e / w8, c = e % w8 * 8;
        const size_t at = (hc * C + i) * C + c;
        hk_cp_async16(r.Ph + i * ldp + c, ws.Ph + at, 16);
        if (!fast)
            hk_cp_async16(r.Pl + i * ldp + c, ws.Pl + at, 16);
    }
    hk_cp_async_commit();
}

/* Kernel R: column block blockIdx.x of [S | Tc], value head blockIdx.y,
 * sequence blockIdx.z. OUT (HK_CUDA_GDN_TC_FUSE_O): kernel O's outputs
 * in the same pass, by four more warps (below), so neither the chunks'
 * starting states nor Vn go through scratch and there is no output
 * launch. */
template <int BV, int MT, int NW, bool LO, bool OUT>
static __global__ void
    __launch_bounds__(32 * NW + (OUT ? HK_TC_O_WARPS * 32 : 0), 1)
        hk_gdn_tc_reg_kernel(hk_tc_ws ws, float *const *states,
                             float *const *tcs, hk_tc_in in, const int *cu,
                             int nslots, int Hk, int Hv, int dk, int dv, int C,
                             int fast, float *o, int nb)
{
    const int NT = BV / 8; /* 8-column tiles */
    /* step 2: VW warps a 16-row tile of Vn, VB columns each (16 at the
     * least: at BV = 16 on 8 warps, warps 4-7 skip it) */
    constexpr int VW = BV / 16 < NW / 4 ? BV / 16 : NW / 4;
    constexpr int VB = BV / VW, NTV = VB / 8;
    HK_DYNAMIC_SMEM(smem);
    /* the block's chunks (hk_tc_pass_at): its first slot, tokens, length
     * and count, from shared memory once its first barrier is passed, so
     * that no register holds what went into them */
    __shared__ int first, seg[3];
    hk_probe_start(ws.probe);
    hk_tc_p_smem s;
    hk_tc_ro_smem ro;
    hk_tc_p_carve(&s, &ro, smem, dk, C, BV, LO, nb, false, OUT);
    const hk_tc_pass_at pa(ws, states, tcs, cu, BV, Hk, Hv, dk, dv, C);
    if (pa.skip)
        return; /* no chunk of this segment: the whole block leaves */
    const int h = pa.h, kh = pa.kh, col0 = pa.col0, ldg = pa.ldg;
    const bool is_tc = pa.is_tc;
    float *Sg = pa.Sg;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g8 = lane >> 2, t4 = lane & 3;
    const int ldf = BV + HK_PAD32, ldh = BV + HK_PAD16, ldk = dk + HK_PAD16;
    const size_t ldq = (size_t)Hk * dk;
    const uint16_t *kh0 = in.k + (size_t)kh * dk;
    const uint16_t *kl0 = LO && !fast ? in.kl + (size_t)kh * dk : NULL;
    const bool split = !fast, klo = LO && !fast;
    /* OUT: warps 0-3 run the state (the state warps), 4-7 the outputs */
    const bool sw = !OUT || warp < NW;
    /* this warp's state rows: r0 + 16 mt + g8 (+ 8) */
    const int r0 = warp * (dk / NW);
    /* K^T's A fragments by .trans from K's rows (tokens): matrix lane / 8
     * is tokens 8 (i / 2).., state rows 8 (i % 2).. */
    const int kr = (lane & 7) + (lane >> 4) * 8, kc = ((lane >> 3) & 1) * 8;
    const int ar = (lane & 7) + ((lane >> 3) & 1) * 8, ac = (lane >> 4) * 8;
    /* OUT's output warps: warp 4 + ti the chunk's rows 16 ti.. */
    const int ti = warp - NW;
    const bool ow = OUT && !sw && !is_tc && ti < C / 16;
    const uint16_t *q0 = in.q + (size_t)kh * dk;
    const uint16_t *ql0 = LO && !fast ? in.ql + (size_t)kh * dk : NULL;
    const size_t ldov = (size_t)Hv * dv;

    if (tid == 0) {
        first = pa.first;
        seg[0] = pa.ts;
        seg[1] = pa.len;
        seg[2] = pa.nch;
    }
    float S[MT][NT][4];
    if (sw)
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
#pragma unroll
            for (int nt = 0; nt < NT; nt++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int row = r0 + 16 * mt + g8 + 8 * (e >> 1);
                    const int col = 8 * nt + 2 * t4 + (e & 1);
                    S[mt][nt][e] = is_tc && !pa.cont
                                       ? (row == col0 + col ? 1.0f : 0.0f)
                                       : Sg[(size_t)row * ldg + col0 + col];
                }
    __syncthreads();
    const int ts = seg[0], len = seg[1], nch = seg[2];
    /* chunks 0 .. nb - 2 in flight: chunk c is fetched into buffer c % nb
     * at chunk c - nb + 1's step */
    for (int c = 0; sw && c < nb - 1 && c < nch; c++)
        hk_tc_p_fetch_chunk(s, ws, kh0, kl0, ldq, c, (size_t)h * nslots + first,
                            ts, len, c, dk, dv, C, BV, col0, is_tc, fast,
                            32 * NW);
    /* an output warp's groups: Q of chunk c, P of chunk c, Q of c + 1, ...
     * (empty past the last chunk), so each wait leaves the newest one
     * pending */
    if (ow && nch > 0) {
        const size_t hc = (size_t)h * nslots + first;
        const size_t rq = (size_t)ts * ldq;
        const int n = min(C, len);
        hk_tc_ro_fetch_q(ro, q0 + rq, ql0 ? ql0 + rq : NULL, ldq, n, ti, dk,
                         lane);
        hk_tc_ro_fetch_p(ro, ws, hc, ti, C, fast, lane);
    }
    hk_probe_at(ws.probe, 0);

    for (int c = 0; c < nch; c++) {
        const int pk = 1 + 5 * c; /* the chunk's probe points */
        const int bf = c % nb;
        const int n = min(C, len - c * C), ntk = (n + 15) / 16;
        const size_t hc = (size_t)h * nslots + first + c;
        /* 1. the starting state, split, to shared memory (and scratch for
         * kernel O) */
        if (sw)
#pragma unroll
            for (int mt = 0; mt < MT; mt++)
#pragma unroll
                for (int nt = 0; nt < NT; nt++)
#pragma unroll
                    for (int hh = 0; hh < 2; hh++) {
                        const int row = r0 + 16 * mt + g8 + 8 * hh;
                        const int col = 8 * nt + 2 * t4;
                        uint32_t hi, lo;
                        hk_split_bf16x2(S[mt][nt][2 * hh],
                                        S[mt][nt][2 * hh + 1], &hi, &lo);
                        *reinterpret_cast<uint32_t *>(s.Sh + row * ldh + col) =
                            hi;
                        if (split)
                            *reinterpret_cast<uint32_t *>(s.Sl + row * ldh +
                                                          col) = lo;
                        if (!is_tc && !OUT) {
                            const size_t at = (hc * dk + row) * dv + col0 + col;
                            *reinterpret_cast<uint32_t *>(ws.Sh + at) = hi;
                            if (split)
                                *reinterpret_cast<uint32_t *>(ws.Sl + at) = lo;
                        }
                    }
        hk_probe_at(ws.probe, pk);
        if (sw && nb == 3 && c + 1 < nch)
            hk_cp_async_wait<1>(); /* chunk c + 1's may stay in flight */
        else if (sw)
            hk_cp_async_wait<0>();
        /* chunk c's copies landed everywhere; the state is published;
         * every read of chunk c - 1's buffer is done */
        __syncthreads();
        hk_probe_at(ws.probe, pk + 1);
        if (sw && c + nb - 1 < nch) /* into chunk c - 1's buffer */
            hk_tc_p_fetch_chunk(s, ws, kh0, kl0, ldq, (c + nb - 1) % nb, hc - c,
                                ts, len, c + nb - 1, dk, dv, C, BV, col0, is_tc,
                                fast, 32 * NW);
        const hk_tc_p_buf t = hk_tc_p_pick(s, bf);
        const double *gam = t.gam;
        const uint16_t *Wh = t.Wh, *Wl = t.Wl, *Kb = t.Kb, *Kl = t.Kl;
        const float *Ub = t.Ub;

        /* OUT: X = Q S_c (dk deep) on the output warps while the state
         * warps run steps 2 and 3 (both only read the state's split);
         * then the next chunk's Q rows, whose buffer this warp alone
         * reads */
        float X[NT][4];
        if (ow) {
            hk_cp_async_wait<1>(); /* Q of chunk c */
            __syncwarp();
#pragma unroll
            for (int nt = 0; nt < NT; nt++)
#pragma unroll
                for (int e = 0; e < 4; e++)
                    X[nt][e] = 0.0f;
            if (ti < ntk) {
                hk_tc_frag_mm_rt<BV>(ql0 != NULL, split, X,
                                     ro.Qs + 16 * ti * ldk,
                                     ro.Ql ? ro.Ql + 16 * ti * ldk : NULL, ldk,
                                     s.Sh, s.Sl, ldh, dk / 16, lane);
#pragma unroll
                for (int hh = 0; hh < 2; hh++) { /* X = e^gamma Q S_c */
                    const int row = 16 * ti + g8 + 8 * hh;
                    const float eg = row < n ? hk_gdn_decay(gam[row]) : 0.0f;
#pragma unroll
                    for (int nt = 0; nt < NT; nt++)
                        X[nt][2 * hh] *= eg, X[nt][2 * hh + 1] *= eg;
                }
            }
            __syncwarp(); /* every lane's reads of Q before the refill */
            const size_t rq = (size_t)(ts + (c + 1) * C) * ldq;
            if (c + 1 < nch)
                hk_tc_ro_fetch_q(ro, q0 + rq, ql0 ? ql0 + rq : NULL, ldq,
                                 min(C, len - (c + 1) * C), ti, dk, lane);
            else
                hk_cp_async_commit();
        }

        /* 2, 3. Vn of rows 16 vt.., columns vc.. vc + VB (tiles past the
         * chunk's end: none) */
        const int vt = warp % 4, vc = warp / 4 * VB;
        if (sw && warp < 4 * VW && vt < ntk) {
            float V[NTV][4];
#pragma unroll
            for (int nt = 0; nt < NTV; nt++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int row = 16 * vt + g8 + 8 * (e >> 1);
                    const int col = vc + 8 * nt + 2 * t4 + (e & 1);
                    V[nt][e] = is_tc ? 0.0f : Ub[row * ldf + col];
                }
            hk_tc_frag_mm_rt<VB>(split, split, V, Wh + 16 * vt * ldk,
                                 Wl + 16 * vt * ldk, ldk, s.Sh + vc, s.Sl + vc,
                                 ldh, dk / 16, lane);
            const double gl = gam[n - 1];
#pragma unroll
            for (int hh = 0; hh < 2; hh++) {
                const int row = 16 * vt + g8 + 8 * hh;
                const float en = row < n ? hk_gdn_decay(gl - gam[row]) : 0.0f;
#pragma unroll
                for (int nt = 0; nt < NTV; nt++) {
                    const int col = vc + 8 * nt + 2 * t4;
                    float v0 = V[nt][2 * hh], v1 = V[nt][2 * hh + 1];
                    if (is_tc) {
                        v0 = fabsf(v0) < HK_GDN_TINY ? 0.0f : v0;
                        v1 = fabsf(v1) < HK_GDN_TINY ? 0.0f : v1;
                    }
                    uint32_t hi, lo;
                    if (!is_tc) {
                        hk_split_bf16x2(v0, v1, &hi, &lo);
                        /* Vn for the outputs: in shared memory when
                         * fused, else scratch for kernel O */
                        uint16_t *vh =
                            OUT ? ro.Vh + row * ldh + col
                                : ws.Vh + (hc * C + row) * dv + col0 + col;
                        uint16_t *vl =
                            OUT ? ro.Vl + row * ldh + col
                                : ws.Vl + (hc * C + row) * dv + col0 + col;
                        *reinterpret_cast<uint32_t *>(vh) = hi;
                        if (split)
                            *reinterpret_cast<uint32_t *>(vl) = lo;
                    }
                    hk_split_bf16x2(en * v0, en * v1, &hi, &lo);
                    *reinterpret_cast<uint32_t *>(s.Xh + row * ldh + col) = hi;
                    if (split)
                        *reinterpret_cast<uint32_t *>(s.Xl + row * ldh + col) =
                            lo;
                }
            }
        }
        if (sw) {
            const float egn = hk_gdn_decay(gam[n - 1]);
#pragma unroll
            for (int mt = 0; mt < MT; mt++)
#pragma unroll
                for (int nt = 0; nt < NT; nt++)
#pragma unroll
                    for (int e = 0; e < 4; e++)
                        S[mt][nt][e] *= egn;
        }
        hk_probe_at(ws.probe, pk + 2);
        __syncthreads();
        hk_probe_at(ws.probe, pk + 3);

        /* OUT: o = e^gamma X + P Vn (P lower triangular: C deep to the
         * diagonal tile) on the output warps while the state warps run
         * step 4, straight to o; then the next chunk's P rows. Vn is
         * rewritten only after the next barrier. */
        if (ow) {
            hk_cp_async_wait<1>(); /* P of chunk c */
            __syncwarp();
            if (ti < ntk) {
                const int ldp = C + HK_PAD16;
                hk_tc_frag_mm_rt<BV>(split, split, X, ro.Ph + 16 * ti * ldp,
                                     ro.Pl + 16 * ti * ldp, ldp, ro.Vh, ro.Vl,
                                     ldh, ti + 1, lane);
                const size_t t0 = (size_t)(ts + c * C);
#pragma unroll
                for (int hh = 0; hh < 2; hh++) {
                    const int row = 16 * ti + g8 + 8 * hh;
                    if (row >= n)
                        continue;
                    float *orow = o + (t0 + row) * ldov + (size_t)h * dv + col0;
#pragma unroll
                    for (int nt = 0; nt < NT; nt++)
                        *reinterpret_cast<float2 *>(orow + 8 * nt + 2 * t4) =
                            make_float2(X[nt][2 * hh], X[nt][2 * hh + 1]);
                }
            }
            __syncwarp(); /* every lane's reads of P before the refill */
            if (c + 1 < nch)
                hk_tc_ro_fetch_p(ro, ws, hc + 1, ti, C, fast, lane);
            else
                hk_cp_async_commit();
        }

        /* 4. S += K^T X over the chunk's 16-token tiles */
        for (int kk = 0; sw && kk < ntk; kk++) {
#pragma unroll
            for (int mt = 0; mt < MT; mt++) {
                uint32_t a[4], al[4];
                const int at = (kk * 16 + kr) * ldk + r0 + 16 * mt + kc;
                hk_ldmatrix_x4_trans(a, Kb + at);
                if (klo)
                    hk_ldmatrix_x4_trans(al, Kl + at);
#pragma unroll
                for (int dp = 0; dp < BV / 16; dp++) {
                    uint32_t bb[4], bl[4];
                    const int xt = (kk * 16 + ar) * ldh + ac + dp * 16;
                    hk_ldmatrix_x4_trans(bb, s.Xh + xt);
                    float *d0 = S[mt][2 * dp], *d1 = S[mt][2 * dp + 1];
                    if (!split) {
                        hk_mma2<false, false>(d0, d1, a, a, bb, bb);
                        continue;
                    }
                    hk_ldmatrix_x4_trans(bl, s.Xl + xt);
                    if (klo)
                        hk_mma2<true, true>(d0, d1, a, al, bb, bl);
                    else
                        hk_mma2<false, true>(d0, d1, a, a, bb, bl);
                }
            }
        }
        if (sw && is_tc)
#pragma unroll
            for (int mt = 0; mt < MT; mt++)
#pragma unroll
                for (int nt = 0; nt < NT; nt++)
#pragma unroll
                    for (int e = 0; e < 4; e++)
                        if (fabsf(S[mt][nt][e]) < HK_GDN_TINY)
                            S[mt][nt][e] = 0.0f;
        hk_probe_at(ws.probe, pk + 4);
    }
    if (sw)
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
#pragma unroll
            for (int nt = 0; nt < NT; nt++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int row = r0 + 16 * mt + g8 + 8 * (e >> 1);
                    const int col = 8 * nt + 2 * t4 + (e & 1);
                    Sg[(size_t)row * ldg + col0 + col] = S[mt][nt][e];
                }
    hk_probe_end(ws.probe, hk_probe_tail(ws.probe, 1, 0));
}

size_t hk_tc_pass_smem(int dk, int C, int BV, bool lo, int nbuf, bool f32,
                       bool out)
{
    return hk_tc_p_carve(NULL, NULL, NULL, dk, C, BV, lo, nbuf, f32, out);
}

/* Kernel R's probe points (hk_probe.h): init, the first copies issued;
 * per chunk: split, the state split and stored (thread 0's warp); wait,
 * the chunk's copies waited for, through the barrier; Vn, steps 2 and 3
 * (its warp); bar, the barrier after them; KtX, step 4 issued (its MMAs
 * may finish in the next chunk's split); store, the state written back,
 * through a barrier. */
static const char *const hk_tc_r_phases[] = {"init", "split", "wait", "Vn",
                                             "bar",  "KtX",   "store"};
static const hk_probe_kind hk_tc_r_probe = {"R", hk_tc_r_phases, 1, 5, 1};

/* Kernel R or P as planned, over (ncols / BV, Hv, nseq). */
template <bool LO>
int hk_tc_launch_pass(const hk_tc_plan &p, const hk_tc_call &a)
{
    const dim3 grid(a.ncols / p.BV, a.Hv, a.nseq);
    hk_tc_ws ws = a.ws;
    if (p.reg && a.probe) { /* P is not probed; at most slots chunks */
        ws.probe =
            hk_probe_launch(&hk_tc_r_probe, (size_t)grid.x * grid.y * grid.z,
                            (int)a.slots, a.s);
    }
    /* the state pass: kernel R (the state in registers) or P, by the plan;
     * the kernel (a template-id) is the variadic part; its arguments R's
     * and P's first ones */
#define HK_TC_PASS_ARGS                                                        \
    ws, a.states, a.tcs, a.in, a.cu_seqlens, (int)a.slots, a.Hk, a.Hv, a.dk,   \
        a.dv, a.C, a.fast
#define HK_TC_PASS(THREADS, ...)                                               \
    do {                                                                       \
        cudaFuncSetAttribute(__VA_ARGS__,                                      \
                             cudaFuncAttributeMaxDynamicSharedMemorySize,      \
                             (int)p.sb);                                       \
        __VA_ARGS__<<<grid, THREADS, p.sb, a.s>>>(HK_TC_PASS_ARGS);            \
    } while (0)
    /* kernel R: its state tiles a warp (MT), BV, its state warps (NW) and
     * the fused outputs (OUT: four more warps) */
#define HK_TC_REG_AS(BV, MT, NW, OUT)                                          \
    do {                                                                       \
        cudaFuncSetAttribute(hk_gdn_tc_reg_kernel<BV, MT, NW, LO, OUT>,        \
                             cudaFuncAttributeMaxDynamicSharedMemorySize,      \
                             (int)p.sb);                                       \
        hk_gdn_tc_reg_kernel<BV, MT, NW, LO, OUT>                              \
            <<<grid, 32 * (NW + (OUT ? HK_TC_O_WARPS : 0)), p.sb, a.s>>>(      \
                HK_TC_PASS_ARGS, a.o, p.rbuf);                                 \
    } while (0)
#define HK_TC_REG(BV, MT, NW)                                                  \
    do {                                                                       \
        if (p.fuse)                                                            \
            HK_TC_REG_AS(BV, MT, NW, true);                                    \
        else                                                                   \
            HK_TC_REG_AS(BV, MT, NW, false);                                   \
    } while (0)
    const int mt = a.dk / 64;
    if (p.reg && p.BV == 64) /* R64 (hk_tc_plan_for): dk = 128, not fused */
        HK_TC_REG_AS(64, 1, 8, false);
    else if (p.reg && p.w8 && p.BV == 32 && mt == 2) /* W8 */
        HK_TC_REG(32, 1, 8);
    else if (p.reg && p.w8 && p.BV == 32) /* dk = 256: never fused */
        HK_TC_REG_AS(32, 2, 8, false);
    else if (p.reg && p.w8 && mt == 2)
        HK_TC_REG(16, 1, 8);
    else if (p.reg && p.w8)
        HK_TC_REG_AS(16, 2, 8, false);
    else if (p.reg && p.BV == 32 && mt == 1)
        HK_TC_REG(32, 1, 4);
    else if (p.reg && p.BV == 32 && mt == 2)
        HK_TC_REG(32, 2, 4);
    else if (p.reg && p.BV == 32)
        HK_TC_REG(32, 4, 4);
    else if (p.reg && mt == 1)
        HK_TC_REG(16, 1, 4);
    else if (p.reg && mt == 2)
        HK_TC_REG(16, 2, 4);
    else if (p.reg)
        HK_TC_REG(16, 4, 4);
    else if (p.BV == 32 && p.nbuf == 2)
        HK_TC_PASS(HK_TC_P_THREADS, hk_gdn_tc_pass_kernel<32, LO, 2>);
    else if (p.BV == 32)
        HK_TC_PASS(HK_TC_P_THREADS, hk_gdn_tc_pass_kernel<32, LO, 1>);
    else if (p.nbuf == 2)
        HK_TC_PASS(HK_TC_P_THREADS, hk_gdn_tc_pass_kernel<16, LO, 2>);
    else
        HK_TC_PASS(HK_TC_P_THREADS, hk_gdn_tc_pass_kernel<16, LO, 1>);
#undef HK_TC_REG
#undef HK_TC_REG_AS
#undef HK_TC_PASS
#undef HK_TC_PASS_ARGS
    return hk_cuda_check_launch();
}

template int hk_tc_launch_pass<false>(const hk_tc_plan &p, const hk_tc_call &a);
template int hk_tc_launch_pass<true>(const hk_tc_plan &p, const hk_tc_call &a);
