/*
 * hk_gdn_tc.cu - the Gated DeltaNet chunked prefill on tensor cores: bf16
 * q, k, v in; f32 gates, state, T_C and output; f32 accumulation; several
 * sequences per call (cu_seqlens offsets). The math is hk_gdn.cu's chunk
 * form (its header, and hk_gdn.c's); the f32-in kernel there stays the
 * reference these results are tested against.
 *
 * Precision. Products of two bf16 inputs (K K^T, Q K^T) are exact in f32,
 * so one bf16 MMA does them. Every other product has an f32 operand
 * (Tinv, W, S, Vn, P): it is split into bf16 hi + lo (hk_bf16_split,
 * ~16 significant bits) and multiplied as hi*x + lo*x (x exact bf16: K, Q,
 * V) or hi*hi + hi*lo + lo*hi (both f32), accumulating in f32. That keeps
 * the state's error near 1e-5 relative where one bf16 rounding of S or W
 * (FLA's bf16 path) costs ~4e-3, at 2-3 MMAs per product.
 *
 * Two launches on one stream (wmma 16x16x16, bf16 -> f32):
 *   A. per (chunk, value head), in parallel, 8 warps: gamma in double (the
 *      CPU's order), K/Q/V of the chunk staged in shared memory (rows past
 *      the chunk's end zeroed), [K; Q] K^T on MMAs (lower tiles only), the
 *      decay and beta masks, (I + L)^{-1} by forward substitution in f32
 *      (hk_gdn.cu's order), then U = Tinv diag(beta) V and
 *      W = Tinv diag(beta e^gamma) K on MMAs. Out to scratch: gamma, U
 *      (f32), -W and P = tril(QK^T (.) Gamma) as bf16 hi/lo pairs.
 *   B. per (sequence, value head, BV columns of [S | Tc]), 4 warps,
 *      sequential over the sequence's chunks, the BV-column tile of the
 *      state in shared memory in f32 for the whole pass:
 *        Vn = U - W S,  X = e^{gamma} Q S            (MMAs, dk deep)
 *        O = X + P Vn  -> o                           (MMAs, C deep)
 *        S = e^{gamma_n} S + K^T (e^{gamma_n - gamma} Vn)
 *      Tc's columns are more blocks of the same launch running the same
 *      recurrence with U = 0 from e_j (T_C in the same pass); no O.
 *      BV = 32, or 16 when 32 would leave SMs idle.
 * That is v1 (HK_CUDA_GDN_TC_V1). The default, v2 (below kernel B),
 * replaces B by a sequential pass that computes only the states (and
 * writes each chunk's starting state and Vn to scratch) and a parallel
 * output launch; HK_CUDA_GDN_TC_FAST runs v2 on single bf16 products.
 * Kernel A is the blockwise one (A2) by default; HK_CUDA_GDN_TC_A1 runs
 * the first, HK_CUDA_GDN_TC_A3 A2's steps with every load by cp.async in
 * flight under the steps before it (below kernel A2).
 * Tiles of a chunk's last 16 tokens that run past its end are staged in
 * shared memory with zero rows, so no load reads past a sequence or the
 * buffer. Tiny values are flushed as on the CPU (gdn_math.h).
 *
 * f32 inputs (hk_cuda_gdn_chunk_tc, the engine's activations): q, k, v
 * are split into bf16 hi + lo arrays in scratch first (one pass), and the
 * same kernels run with LO set: every product with an input gains its lo
 * term (hi*hi + hi*lo + lo*hi), so no operand keeps fewer than ~16
 * significant bits and the results stay ~1e-5 of the f32 kernel's. With
 * HK_CUDA_GDN_TC_ROUND the pass writes the hi halves only (q, k, v
 * rounded to bf16 once) and the bf16 entry's kernels run on them: that
 * entry's results bit for bit, FLA's input precision.
 *
 * Requirements: dk, dv, C multiples of 16; dk <= 256; C <= 64; q, k, v
 * (bf16 entry), every state and Tc 32-byte aligned (wmma tiles).
 */
#include <cuda_bf16.h>
#include <cuda_pipeline.h>
#include <mma.h>
#include <stdio.h>

#include "kernels/common/gdn_math.h"
#include "kernels/cuda/hk_cuda_impl.h"
#include "kernels/cuda/hk_ptx.h"

using namespace nvcuda;

typedef wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16,
                       wmma::row_major>
    hk_fa_row;
typedef wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16,
                       wmma::col_major>
    hk_fa_col;
typedef wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16,
                       wmma::row_major>
    hk_fb_row;
typedef wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16,
                       wmma::col_major>
    hk_fb_col;
typedef wmma::fragment<wmma::accumulator, 16, 16, 16, float> hk_facc;

#define HK_TC_A_THREADS 256
#define HK_TC_B_THREADS 128
/* Row padding of shared tiles: 8 bf16 or 4 f32 (16 bytes) keep every
 * 16-row tile 32-byte aligned and spread rows over the banks. */
#define HK_PAD16 8
#define HK_PAD32 4

static __device__ __forceinline__ const __nv_bfloat16 *hk_bf(const uint16_t *p)
{
    return reinterpret_cast<const __nv_bfloat16 *>(p);
}

/* The inputs as bf16 bit patterns: hi parts, and with f32 inputs their lo
 * parts (NULL for bf16 inputs, which are exact). */
struct hk_tc_in {
    const uint16_t *q, *k, *v;
    const uint16_t *ql, *kl, *vl;
};

/* Scratch regions; slot hc = h * nslots + chunk slot. */
struct hk_tc_ws {
    double *gam;  // [Hv * nslots, C]
    float *U;     // [Hv * nslots, C, dv]
    uint16_t *Wh; // [Hv * nslots, C, dk]  -W, hi
    uint16_t *Wl; //                        -W, lo
    uint16_t *Ph; // [Hv * nslots, C, C]   P, hi
    uint16_t *Pl; //                        P, lo
    /* Written by the state pass of the split variant (v2) only. */
    uint16_t *Sh; // [Hv * nslots, dk, dv]  chunk's starting state, hi
    uint16_t *Sl; //                        lo
    uint16_t *Vh; // [Hv * nslots, C, dv]   Vn, hi
    uint16_t *Vl; //                        lo
};

/* Slots: every chunk of every sequence, at most T / C + nseq. */
static size_t hk_tc_slots(int T, int nseq, int C)
{
    return (size_t)T / C + (size_t)nseq;
}

static size_t hk_tc_ws_bytes(size_t slots, int Hv, int dk, int dv, int C,
                             hk_tc_ws *ws, unsigned char *base)
{
    const size_t rows = slots * Hv * C, srows = slots * Hv * dk;
    const size_t sz[10] = {rows * sizeof(double), rows * dv * sizeof(float),
                           rows * dk * 2,         rows * dk * 2,
                           rows * C * 2,          rows * C * 2,
                           srows * dv * 2,        srows * dv * 2,
                           rows * dv * 2,         rows * dv * 2};
    size_t off[10];
    const size_t at = hk_layout(sz, 10, 256, off);
    if (ws) {
        ws->gam = (double *)(base + off[0]);
        ws->U = (float *)(base + off[1]);
        ws->Wh = (uint16_t *)(base + off[2]);
        ws->Wl = (uint16_t *)(base + off[3]);
        ws->Ph = (uint16_t *)(base + off[4]);
        ws->Pl = (uint16_t *)(base + off[5]);
        ws->Sh = (uint16_t *)(base + off[6]);
        ws->Sl = (uint16_t *)(base + off[7]);
        ws->Vh = (uint16_t *)(base + off[8]);
        ws->Vl = (uint16_t *)(base + off[9]);
    }
    return at;
}

/* Sequence b's first chunk slot. */
static __device__ int hk_tc_first_slot(const int *cu, int b, int C)
{
    int acc = 0;
    for (int i = 0; i < b; i++)
        acc += (cu[i + 1] - cu[i] + C - 1) / C;
    return acc;
}

/* Chunk slot `slot` of the batch: its sequence's first token t0 and its
 * length n (0: past the last chunk). Thread 0 scans the offsets. */
static __device__ void hk_tc_locate(const int *cu, int nseq, int C, int slot,
                                    int *t0, int *n)
{
    *t0 = 0;
    *n = 0;
    int acc = 0;
    for (int b = 0; b < nseq; b++) {
        const int len = cu[b + 1] - cu[b], nb = (len + C - 1) / C;
        if (slot < acc + nb) {
            const int c = slot - acc;
            *t0 = cu[b] + c * C;
            *n = min(C, len - c * C);
            return;
        }
        acc += nb;
    }
}

/* rows x cols bf16 (cols a multiple of 8) from src (row stride lds) into
 * dst (row stride ldd), 16 bytes at a time; rows >= n are zeros. ASYNC:
 * by cp.async (zero-filled rows read nothing), landing by the caller's
 * hk_cp_async_wait after its commit. */
template <bool ASYNC = false>
static __device__ void hk_tc_stage(uint16_t *dst, int ldd, const uint16_t *src,
                                   size_t lds, int rows, int n, int cols)
{
    const int vc = cols / 8;
    for (int e = threadIdx.x; e < rows * vc; e += blockDim.x) {
        const int i = e / vc, c = (e % vc) * 8;
        if (ASYNC) {
            hk_cp_async16(dst + (size_t)i * ldd + c,
                          i < n ? src + (size_t)i * lds + c : src,
                          i < n ? 16 : 0);
            continue;
        }
        uint4 x = make_uint4(0, 0, 0, 0);
        if (i < n)
            x = *reinterpret_cast<const uint4 *>(src + (size_t)i * lds + c);
        *reinterpret_cast<uint4 *>(dst + (size_t)i * ldd + c) = x;
    }
}

/* Kernels A's start, for chunk slot blockIdx.x of value head blockIdx.y
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
        hk_tc_locate(cu, nseq, C, blockIdx.x, &loc[0], &loc[1]);
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
        wmma::load_matrix_sync(a, hk_bf(X + xa), ld);
        wmma::load_matrix_sync(b, hk_bf(K + ka), ld);
        wmma::mma_sync(acc, a, b, acc);
        if (LO) {
            hk_fb_col bl;
            wmma::load_matrix_sync(bl, hk_bf(Kl + ka), ld);
            wmma::mma_sync(acc, a, bl, acc);
            wmma::load_matrix_sync(a, hk_bf(Xl + xa), ld);
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
        wmma::load_matrix_sync(ah, hk_bf(Th + ti * 16 * ldb + kk * 16), ldb);
        wmma::load_matrix_sync(b, hk_bf(B + kk * 16 * ldB), ldB);
        wmma::mma_sync(acc, ah, b, acc);
        if (Tl) {
            hk_fa_row al;
            wmma::load_matrix_sync(al, hk_bf(Tl + ti * 16 * ldb + kk * 16),
                                   ldb);
            wmma::mma_sync(acc, al, b, acc);
        }
        if (LO) {
            wmma::load_matrix_sync(b, hk_bf(Bl + kk * 16 * ldB), ldB);
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
    wmma::store_matrix_sync(stg, acc, 20, wmma::mem_row_major);
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

/* Kernel A: chunk slot blockIdx.x, value head blockIdx.y. LO: the inputs
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
    const size_t hc = (size_t)h * nslots + blockIdx.x;
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
        wmma::store_matrix_sync(s.G + (which * C + ti * 16) * ldc + tj * 16,
                                acc, ldc, wmma::mem_row_major);
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

/* Where a kernel A block works (A2, A3): chunk slot blockIdx.x of value
 * head blockIdx.y (h) and its key head kh; its scratch slot hc; the rows'
 * strides of q, k (ldq) and v (ldvg) and of its C x C tiles in f32 (ldc)
 * and bf16 (ldb); the thread's warp and lane. */
struct hk_tc_a_at {
    int h, kh, lane, warp, nwarps, ldc, ldb;
    size_t hc, ldq, ldvg;
    __device__ hk_tc_a_at(int nslots, int Hk, int Hv, int dk, int dv, int C)
        : h((int)blockIdx.y), kh(h / (Hv / Hk)), lane((int)threadIdx.x & 31),
          warp((int)threadIdx.x >> 5), nwarps((int)blockDim.x >> 5),
          ldc(C + HK_PAD32), ldb(C + HK_PAD16),
          hc((size_t)h * nslots + blockIdx.x), ldq((size_t)Hk * dk),
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
        wmma::store_matrix_sync(stg, acc[r], 20, wmma::mem_row_major);
        __syncwarp();
        f(which, ti, tj);
        __syncwarp(); /* stg is rewritten by the warp's next tile */
    }
}

/* Kernel A, blockwise: chunk slot blockIdx.x, value head blockIdx.y. */
template <bool LO>
static __global__ void __launch_bounds__(HK_TC_A_THREADS, 3)
    hk_gdn_tc_local2_kernel(hk_tc_ws ws, hk_tc_in in, const float *g,
                            const float *beta, const int *cu, int nseq,
                            int nslots, int Hk, int Hv, int dk, int dv, int C,
                            int fast_a)
{
    HK_DYNAMIC_SMEM(smem);
    __shared__ int loc[2];
    hk_tc_a2_smem s;
    hk_tc_a2_carve(&s, smem, C, LO);
    const hk_tc_a_at ka(nslots, Hk, Hv, dk, dv, C);
    const int h = ka.h, kh = ka.kh, lane = ka.lane, warp = ka.warp;
    const int nwarps = ka.nwarps, ldc = ka.ldc, ldb = ka.ldb;
    const size_t hc = ka.hc, ldq = ka.ldq, ldvg = ka.ldvg;
    const int ldp = HK_TC_A2_PW + HK_PAD16;

    int t0;
    const int n = hk_tc_a_begin(ws, g, beta, cu, nseq, Hv, C, hc, loc, s.gam,
                                s.bv, s.bg, &t0);
    if (n == 0)
        return; /* a spare slot: the whole block leaves */
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

/* Kernel A3: chunk slot blockIdx.x, value head blockIdx.y. */
template <bool LO>
static __global__ void __launch_bounds__(HK_TC_A_THREADS, 3)
    hk_gdn_tc_local3_kernel(hk_tc_ws ws, hk_tc_in in, const float *g,
                            const float *beta, const int *cu, int nseq,
                            int nslots, int Hk, int Hv, int dk, int dv, int C,
                            int fast_a)
{
    HK_DYNAMIC_SMEM(smem);
    __shared__ int loc[2];
    hk_tc_a3_smem s;
    hk_tc_a3_carve(&s, smem, C, LO);
    const hk_tc_a_at ka(nslots, Hk, Hv, dk, dv, C);
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

    /* L and P as A2's, 8 elements a lane */
    float *stg = s.stage + warp * 16 * 20;
    hk_tc_a_tiles(acc, stg, warp, nwarps, npair,
                  [&](int which, int ti, int tj) {
                      hk_tc_a3_mask(ws, s.L, s.gam, s.bv, stg, which, ti, tj, n,
                                    C, ldc, hc, lane);
                  });
    __syncthreads();

    /* 2. T = (I + L)^{-1} */
    hk_tc_a2_inverse(s.L, s.T, s.stage, ldc, nt);

    /* 3. U, then W, as A2's; Th, Tl over L. Step 1 committed np1 - 1
     * groups after the first four, so panel q >= 2 (issued at step q - 1)
     * is group np1 + q + 1. */
    for (int q = 0; q < np3; q++) {
        const bool isw = q >= nv3;
        if (q == 0 || q == nv3) {
            __syncthreads(); /* T is written; the last Th, Tl reads done */
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
}

/* Shared memory of kernel B. */
struct hk_tc_b_smem {
    float *Sf;           // [dk][BV + 4]  the state tile, f32
    uint16_t *Sh, *Sl;   // [dk][BV + 8]  its bf16 split
    float *Vf, *Of;      // [C][BV + 4]   Vn; the output tile
    uint16_t *Vh, *Vl;   // [C][BV + 8]   Vn split
    uint16_t *Xh, *Xl;   // [C][BV + 8]   e^{gamma_n - gamma} Vn split
    uint16_t *Kst, *Qst; // [16][dk + 8]  a last partial token tile
    float *eg, *en;      // [C]
    uint16_t *Ksl, *Qsl; // [16][dk + 8]  its lo parts (f32 inputs only)
};

static __host__ __device__ size_t hk_tc_b_carve(hk_tc_b_smem *s,
                                                unsigned char *p, int dk, int C,
                                                int BV, bool lo)
{
    const int ldf = BV + HK_PAD32, ldh = BV + HK_PAD16, ldk = dk + HK_PAD16;
    const size_t sz[14] = {
        (size_t)dk * ldf * 4,          (size_t)dk * ldh * 2,
        (size_t)dk * ldh * 2,          (size_t)C * ldf * 4,
        (size_t)C * ldf * 4,           (size_t)C * ldh * 2,
        (size_t)C * ldh * 2,           (size_t)C * ldh * 2,
        (size_t)C * ldh * 2,           (size_t)16 * ldk * 2,
        (size_t)16 * ldk * 2,          (size_t)2 * C * 4,
        lo ? (size_t)16 * ldk * 2 : 0, lo ? (size_t)16 * ldk * 2 : 0};
    size_t off[14];
    const size_t at = hk_layout(sz, 14, 128, off);
    if (s) {
        s->Sf = (float *)(p + off[0]);
        s->Sh = (uint16_t *)(p + off[1]);
        s->Sl = (uint16_t *)(p + off[2]);
        s->Vf = (float *)(p + off[3]);
        s->Of = (float *)(p + off[4]);
        s->Vh = (uint16_t *)(p + off[5]);
        s->Vl = (uint16_t *)(p + off[6]);
        s->Xh = (uint16_t *)(p + off[7]);
        s->Xl = (uint16_t *)(p + off[8]);
        s->Kst = (uint16_t *)(p + off[9]);
        s->Qst = (uint16_t *)(p + off[10]);
        s->eg = (float *)(p + off[11]);
        s->en = s->eg + C;
        s->Ksl = lo ? (uint16_t *)(p + off[12]) : NULL;
        s->Qsl = lo ? (uint16_t *)(p + off[13]) : NULL;
    }
    return at;
}

/* A state pass block's place (kernels B, P and R): BV columns from col0
 * of the state (or, is_tc, of T_C) of value head h (key head kh) of
 * sequence b, from column block blockIdx.x of [S | Tc], blockIdx.y and
 * blockIdx.z; Sg its matrix (row stride ldg); the sequence's tokens ts..,
 * len of them in nch chunks. */
struct hk_tc_pass_at {
    bool is_tc;
    int h, b, kh, col0, ldg, ts, len, nch;
    float *Sg;
    __device__ hk_tc_pass_at(float *const *states, float *const *tcs,
                             const int *cu, int BV, int Hk, int Hv, int dk,
                             int dv, int C)
        : is_tc((int)blockIdx.x * BV >= dv), h((int)blockIdx.y),
          b((int)blockIdx.z), kh(h / (Hv / Hk)),
          col0((int)blockIdx.x * BV - (is_tc ? dv : 0)), ldg(is_tc ? dk : dv),
          ts(cu[b]), len(cu[b + 1] - cu[b]), nch((len + C - 1) / C),
          Sg(is_tc ? tcs[b] + (size_t)h * dk * dk
                   : states[b] + (size_t)h * dk * dv)
    {
    }
};

/* Kernel B: column block blockIdx.x of [S | Tc] (dv / BV of S, then
 * dk / BV of Tc), value head blockIdx.y, sequence blockIdx.z. */
template <int BV, bool LO>
static __global__ void __launch_bounds__(HK_TC_B_THREADS)
    hk_gdn_tc_state_kernel(hk_tc_ws ws, float *o, float *const *states,
                           float *const *tcs, hk_tc_in in, const int *cu,
                           int nslots, int Hk, int Hv, int dk, int dv, int C)
{
    HK_DYNAMIC_SMEM(smem);
    __shared__ int first;
    hk_tc_b_smem s;
    hk_tc_b_carve(&s, smem, dk, C, BV, LO);
    const hk_tc_pass_at pa(states, tcs, cu, BV, Hk, Hv, dk, dv, C);
    const int h = pa.h, b = pa.b, kh = pa.kh, col0 = pa.col0, ldg = pa.ldg;
    const int ts = pa.ts, len = pa.len, nch = pa.nch;
    const bool is_tc = pa.is_tc;
    float *Sg = pa.Sg;
    const int tid = threadIdx.x, warp = tid >> 5, nwarps = blockDim.x >> 5;
    const int ldf = BV + HK_PAD32, ldh = BV + HK_PAD16, ldk = dk + HK_PAD16;
    const size_t ldq = (size_t)Hk * dk, ldo = (size_t)Hv * dv;
    const int NB = BV / 16;

    if (tid == 0)
        first = hk_tc_first_slot(cu, b, C);
    for (int e = tid; e < dk * BV; e += blockDim.x) {
        const int i = e / BV, j = e % BV;
        s.Sf[i * ldf + j] = is_tc ? (i == col0 + j ? 1.0f : 0.0f)
                                  : Sg[(size_t)i * ldg + col0 + j];
    }

    for (int c = 0; c < nch; c++) {
        const int t0 = ts + c * C, n = min(C, len - c * C);
        const int nt = (n + 15) / 16;
        const bool part = n % 16 != 0; /* tile nt-1 runs past the end */
        __syncthreads(); /* first, Sf, and the last chunk's reads are done */
        const size_t hc = (size_t)h * nslots + first + c;
        const double gn = ws.gam[hc * C + n - 1];
        const float egn = hk_gdn_decay(gn);
        for (int i = tid; i < C; i += blockDim.x) {
            const double gi = i < n ? ws.gam[hc * C + i] : 0.0;
            s.eg[i] = i < n ? hk_gdn_decay(gi) : 0.0f;
            s.en[i] = i < n ? hk_gdn_decay(gn - gi) : 0.0f;
        }
        for (int e = tid; e < dk * BV; e += blockDim.x) {
            const int i = e / BV, j = e % BV;
            hk_bf16_split(s.Sf[i * ldf + j], &s.Sh[i * ldh + j],
                          &s.Sl[i * ldh + j]);
        }
        if (part) {
            const size_t r0 = (size_t)(t0 + (nt - 1) * 16) * ldq + kh * dk;
            const int left = n - (nt - 1) * 16;
            hk_tc_stage(s.Kst, ldk, in.k + r0, ldq, 16, left, dk);
            if (!is_tc)
                hk_tc_stage(s.Qst, ldk, in.q + r0, ldq, 16, left, dk);
            if (LO) {
                hk_tc_stage(s.Ksl, ldk, in.kl + r0, ldq, 16, left, dk);
                if (!is_tc)
                    hk_tc_stage(s.Qsl, ldk, in.ql + r0, ldq, 16, left, dk);
            }
        }
        __syncthreads();

        /* Vn = U + (-W) S; X = Q S (scaled by e^gamma below). */
        for (int idx = warp; idx < nt * NB; idx += nwarps) {
            const int ti = idx / NB, tj = idx % NB;
            const bool st = part && ti == nt - 1;
            const size_t rq = (size_t)(t0 + ti * 16) * ldq + (size_t)kh * dk;
            const uint16_t *Qt = st ? s.Qst : in.q + rq;
            const uint16_t *Qtl = !LO ? NULL : st ? s.Qsl : in.ql + rq;
            const unsigned ldqt = st ? (unsigned)ldk : (unsigned)ldq;
            const uint16_t *Wh = ws.Wh + (hc * C + ti * 16) * dk;
            const uint16_t *Wl = ws.Wl + (hc * C + ti * 16) * dk;
            hk_facc vn, x;
            if (is_tc)
                wmma::fill_fragment(vn, 0.0f);
            else
                wmma::load_matrix_sync(
                    vn, ws.U + (hc * C + ti * 16) * dv + col0 + tj * 16, dv,
                    wmma::mem_row_major);
            wmma::fill_fragment(x, 0.0f);
            for (int kk = 0; kk < dk / 16; kk++) {
                hk_fb_row sh, sl;
                hk_fa_row a;
                wmma::load_matrix_sync(
                    sh, hk_bf(s.Sh + kk * 16 * ldh + tj * 16), ldh);
                wmma::load_matrix_sync(
                    sl, hk_bf(s.Sl + kk * 16 * ldh + tj * 16), ldh);
                wmma::load_matrix_sync(a, hk_bf(Wh + kk * 16), dk);
                wmma::mma_sync(vn, a, sh, vn);
                wmma::mma_sync(vn, a, sl, vn);
                wmma::load_matrix_sync(a, hk_bf(Wl + kk * 16), dk);
                wmma::mma_sync(vn, a, sh, vn);
                if (is_tc)
                    continue;
                wmma::load_matrix_sync(a, hk_bf(Qt + kk * 16), ldqt);
                wmma::mma_sync(x, a, sh, x);
                wmma::mma_sync(x, a, sl, x);
                if (LO) {
                    wmma::load_matrix_sync(a, hk_bf(Qtl + kk * 16), ldqt);
                    wmma::mma_sync(x, a, sh, x);
                }
            }
            wmma::store_matrix_sync(s.Vf + ti * 16 * ldf + tj * 16, vn, ldf,
                                    wmma::mem_row_major);
            if (!is_tc)
                wmma::store_matrix_sync(s.Of + ti * 16 * ldf + tj * 16, x, ldf,
                                        wmma::mem_row_major);
        }
        __syncthreads();

        /* Splits of Vn and of e^{gamma_n - gamma} Vn; O's e^gamma; S's
         * e^{gamma_n}. Rows past the chunk are 0 (U and W rows are). */
        for (int e = tid; e < nt * 16 * BV; e += blockDim.x) {
            const int i = e / BV, j = e % BV;
            float vn = s.Vf[i * ldf + j];
            if (is_tc && fabsf(vn) < HK_GDN_TINY)
                vn = 0.0f;
            hk_bf16_split(vn, &s.Vh[i * ldh + j], &s.Vl[i * ldh + j]);
            hk_bf16_split(s.en[i] * vn, &s.Xh[i * ldh + j], &s.Xl[i * ldh + j]);
            if (!is_tc)
                s.Of[i * ldf + j] *= s.eg[i];
        }
        for (int e = tid; e < dk * BV; e += blockDim.x)
            s.Sf[(e / BV) * ldf + e % BV] *= egn;
        __syncthreads();

        /* O += P Vn (P lower triangular: kk <= ti); S += K^T X. */
        const int no = is_tc ? 0 : nt * NB, ns = (dk / 16) * NB;
        for (int idx = warp; idx < no + ns; idx += nwarps) {
            hk_facc acc;
            if (idx < no) {
                const int ti = idx / NB, tj = idx % NB;
                float *Ot = s.Of + ti * 16 * ldf + tj * 16;
                wmma::load_matrix_sync(acc, Ot, ldf, wmma::mem_row_major);
                for (int kk = 0; kk <= ti; kk++) {
                    const size_t pt = (hc * C + ti * 16) * C + kk * 16;
                    hk_fa_row ph, pl;
                    hk_fb_row vh, vl;
                    wmma::load_matrix_sync(ph, hk_bf(ws.Ph + pt), C);
                    wmma::load_matrix_sync(pl, hk_bf(ws.Pl + pt), C);
                    wmma::load_matrix_sync(
                        vh, hk_bf(s.Vh + kk * 16 * ldh + tj * 16), ldh);
                    wmma::load_matrix_sync(
                        vl, hk_bf(s.Vl + kk * 16 * ldh + tj * 16), ldh);
                    wmma::mma_sync(acc, ph, vh, acc);
                    wmma::mma_sync(acc, ph, vl, acc);
                    wmma::mma_sync(acc, pl, vh, acc);
                }
                wmma::store_matrix_sync(Ot, acc, ldf, wmma::mem_row_major);
                continue;
            }
            const int ti = (idx - no) / NB, tj = (idx - no) % NB;
            float *St = s.Sf + ti * 16 * ldf + tj * 16;
            wmma::load_matrix_sync(acc, St, ldf, wmma::mem_row_major);
            for (int kk = 0; kk < nt; kk++) {
                const bool st = part && kk == nt - 1;
                const size_t rk =
                    (size_t)(t0 + kk * 16) * ldq + (size_t)kh * dk + ti * 16;
                const uint16_t *Kt = st ? s.Kst + ti * 16 : in.k + rk;
                const unsigned ldkt = st ? (unsigned)ldk : (unsigned)ldq;
                hk_fa_col a;
                hk_fb_row xh, xl;
                wmma::load_matrix_sync(a, hk_bf(Kt), ldkt);
                wmma::load_matrix_sync(
                    xh, hk_bf(s.Xh + kk * 16 * ldh + tj * 16), ldh);
                wmma::load_matrix_sync(
                    xl, hk_bf(s.Xl + kk * 16 * ldh + tj * 16), ldh);
                wmma::mma_sync(acc, a, xh, acc);
                wmma::mma_sync(acc, a, xl, acc);
                if (LO) {
                    wmma::load_matrix_sync(
                        a, hk_bf(st ? s.Ksl + ti * 16 : in.kl + rk), ldkt);
                    wmma::mma_sync(acc, a, xh, acc);
                }
            }
            if (is_tc)
                for (int e = 0; e < acc.num_elements; e++)
                    if (fabsf(acc.x[e]) < HK_GDN_TINY)
                        acc.x[e] = 0.0f;
            wmma::store_matrix_sync(St, acc, ldf, wmma::mem_row_major);
        }
        __syncthreads();

        if (!is_tc)
            for (int e = tid; e < n * BV; e += blockDim.x) {
                const int i = e / BV, j = e % BV;
                o[(size_t)(t0 + i) * ldo + (size_t)h * dv + col0 + j] =
                    s.Of[i * ldf + j];
            }
    }
    __syncthreads();
    for (int e = tid; e < dk * BV; e += blockDim.x) {
        const int i = e / BV, j = e % BV;
        Sg[(size_t)i * ldg + col0 + j] = s.Sf[i * ldf + j];
    }
}

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
#define HK_TC_O_THREADS 256

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
    const hk_tc_pass_at pa(states, tcs, cu, BV, Hk, Hv, dk, dv, C);
    const int h = pa.h, b = pa.b, kh = pa.kh, col0 = pa.col0, ldg = pa.ldg;
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
        first = hk_tc_first_slot(cu, b, C);
    for (int e = tid; e < dk * BV; e += blockDim.x) {
        const int i = e / BV, j = e % BV;
        const float x = is_tc ? (i == col0 + j ? 1.0f : 0.0f)
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
 * more. Where three buffers fit (at dk = 128: no lo halves, not fused). */
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
static __global__ void __launch_bounds__(32 * NW +
                                         (OUT ? HK_TC_O_WARPS * 32 : 0))
    hk_gdn_tc_reg_kernel(hk_tc_ws ws, float *const *states, float *const *tcs,
                         hk_tc_in in, const int *cu, int nslots, int Hk, int Hv,
                         int dk, int dv, int C, int fast, float *o, int nb)
{
    const int NT = BV / 8; /* 8-column tiles */
    /* step 2: NW / 4 warps a 16-row tile of Vn, VB columns each */
    constexpr int VB = BV / (NW / 4), NTV = VB / 8;
    HK_DYNAMIC_SMEM(smem);
    __shared__ int first;
    hk_tc_p_smem s;
    hk_tc_ro_smem ro;
    hk_tc_p_carve(&s, &ro, smem, dk, C, BV, LO, nb, false, OUT);
    const hk_tc_pass_at pa(states, tcs, cu, BV, Hk, Hv, dk, dv, C);
    const int h = pa.h, b = pa.b, kh = pa.kh, col0 = pa.col0, ldg = pa.ldg;
    const int ts = pa.ts, len = pa.len, nch = pa.nch;
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

    if (tid == 0)
        first = hk_tc_first_slot(cu, b, C);
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
                    S[mt][nt][e] = is_tc ? (row == col0 + col ? 1.0f : 0.0f)
                                         : Sg[(size_t)row * ldg + col0 + col];
                }
    __syncthreads();
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

    for (int c = 0; c < nch; c++) {
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
        if (sw && nb == 3 && c + 1 < nch)
            hk_cp_async_wait<1>(); /* chunk c + 1's may stay in flight */
        else if (sw)
            hk_cp_async_wait<0>();
        /* chunk c's copies landed everywhere; the state is published;
         * every read of chunk c - 1's buffer is done */
        __syncthreads();
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
        if (sw && vt < ntk) {
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
        __syncthreads();

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
}

struct hk_tc_o_smem {
    uint16_t *Qs;      // [C][dk + 8]   Q rows (zero past the chunk)
    uint16_t *Ql;      // [C][dk + 8]   their lo parts (LO only)
    uint16_t *Sh, *Sl; // [dk][BVO + 8] the chunk's starting state, split
    uint16_t *Ph, *Pl; // [C][C + 8]
    uint16_t *Vh, *Vl; // [C][BVO + 8]  Vn split
    float *stage;      // [warps][2][16][20]
    float *eg;         // [C]
};

static __host__ __device__ size_t hk_tc_o_carve(hk_tc_o_smem *s,
                                                unsigned char *p, int dk, int C,
                                                int BVO, bool lo)
{
    const int ldk = dk + HK_PAD16, ldo = BVO + HK_PAD16;
    const int ldp = C + HK_PAD16;
    const size_t sz[10] = {
        (size_t)C * ldk * 2,  (size_t)dk * ldo * 2,
        (size_t)dk * ldo * 2, (size_t)C * ldp * 2,
        (size_t)C * ldp * 2,  (size_t)C * ldo * 2,
        (size_t)C * ldo * 2,  (size_t)(HK_TC_O_THREADS / 32) * 2 * 16 * 20 * 4,
        (size_t)C * 4,        lo ? (size_t)C * ldk * 2 : 0};
    size_t off[10];
    const size_t at = hk_layout(sz, 10, 128, off);
    if (s) {
        s->Qs = (uint16_t *)(p + off[0]);
        s->Sh = (uint16_t *)(p + off[1]);
        s->Sl = (uint16_t *)(p + off[2]);
        s->Ph = (uint16_t *)(p + off[3]);
        s->Pl = (uint16_t *)(p + off[4]);
        s->Vh = (uint16_t *)(p + off[5]);
        s->Vl = (uint16_t *)(p + off[6]);
        s->stage = (float *)(p + off[7]);
        s->eg = (float *)(p + off[8]);
        s->Ql = lo ? (uint16_t *)(p + off[9]) : NULL;
    }
    return at;
}

/* Kernel O: chunk slot blockIdx.x, output columns blockIdx.y * BVO..
 * (BVO = 32, or 16 where dv is not a multiple of 32), value head
 * blockIdx.z. LO: Q has lo parts (f32 inputs). */
template <bool LO>
static __global__ void __launch_bounds__(HK_TC_O_THREADS)
    hk_gdn_tc_out_kernel(hk_tc_ws ws, float *o, hk_tc_in in, const int *cu,
                         int nseq, int nslots, int Hk, int Hv, int dk, int dv,
                         int C, int BVO, int fast)
{
    HK_DYNAMIC_SMEM(smem);
    __shared__ int loc[2];
    hk_tc_o_smem s;
    hk_tc_o_carve(&s, smem, dk, C, BVO, LO);
    const int NB = BVO / 16;
    const int h = blockIdx.z, kh = h / (Hv / Hk), col0 = blockIdx.y * BVO;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int nwarps = blockDim.x >> 5;
    const size_t hc = (size_t)h * nslots + blockIdx.x;
    const size_t ldq = (size_t)Hk * dk, ldov = (size_t)Hv * dv;
    const int ldk = dk + HK_PAD16, ldo = BVO + HK_PAD16, ldp = C + HK_PAD16;

    if (tid == 0)
        hk_tc_locate(cu, nseq, C, blockIdx.x, &loc[0], &loc[1]);
    __syncthreads();
    const int t0 = loc[0], n = loc[1], nt = (n + 15) / 16, rows = nt * 16;
    if (n == 0)
        return; /* a spare slot: the whole block leaves */

    const size_t r0 = (size_t)t0 * ldq + (size_t)kh * dk;
    const uint16_t *qr = in.q + r0, *qlr = LO ? in.ql + r0 : NULL;
    for (int e = tid; e < rows * (dk / 8); e += blockDim.x) {
        const int i = e / (dk / 8), c = (e % (dk / 8)) * 8;
        const bool inr = i < n;
        __pipeline_memcpy_async(s.Qs + i * ldk + c,
                                inr ? qr + (size_t)i * ldq + c : qr, 16,
                                inr ? 0 : 16);
        if (LO && !fast)
            __pipeline_memcpy_async(s.Ql + i * ldk + c,
                                    inr ? qlr + (size_t)i * ldq + c : qlr, 16,
                                    inr ? 0 : 16);
    }
    for (int e = tid; e < dk * (BVO / 8); e += blockDim.x) {
        const int i = e / (BVO / 8), c = (e % (BVO / 8)) * 8;
        const size_t at = (hc * dk + i) * dv + col0 + c;
        __pipeline_memcpy_async(s.Sh + i * ldo + c, ws.Sh + at, 16);
        if (!fast)
            __pipeline_memcpy_async(s.Sl + i * ldo + c, ws.Sl + at, 16);
    }
    for (int e = tid; e < rows * (C / 8); e += blockDim.x) {
        const int i = e / (C / 8), c = (e % (C / 8)) * 8;
        const size_t at = (hc * C + i) * C + c;
        __pipeline_memcpy_async(s.Ph + i * ldp + c, ws.Ph + at, 16);
        if (!fast)
            __pipeline_memcpy_async(s.Pl + i * ldp + c, ws.Pl + at, 16);
    }
    for (int e = tid; e < rows * (BVO / 8); e += blockDim.x) {
        const int i = e / (BVO / 8), c = (e % (BVO / 8)) * 8;
        const size_t at = (hc * C + i) * dv + col0 + c;
        __pipeline_memcpy_async(s.Vh + i * ldo + c, ws.Vh + at, 16);
        if (!fast)
            __pipeline_memcpy_async(s.Vl + i * ldo + c, ws.Vl + at, 16);
    }
    __pipeline_commit();
    for (int i = tid; i < C; i += blockDim.x)
        s.eg[i] = i < n ? hk_gdn_decay(ws.gam[hc * C + i]) : 0.0f;
    __pipeline_wait_prior(0);
    __syncthreads();

    /* X = Q S_c (dk deep) and Y = P Vn (P lower triangular: kk <= ti);
     * o = e^gamma X + Y, rows of the chunk only. */
    float *stg = s.stage + warp * 2 * 16 * 20;
    for (int idx = warp; idx < nt * NB; idx += nwarps) {
        const int ti = idx / NB, tj = idx % NB;
        hk_facc x, y;
        wmma::fill_fragment(x, 0.0f);
        wmma::fill_fragment(y, 0.0f);
        for (int kk = 0; kk < dk / 16; kk++) {
            hk_fa_row a;
            hk_fb_row sh, sl;
            wmma::load_matrix_sync(a, hk_bf(s.Qs + ti * 16 * ldk + kk * 16),
                                   ldk);
            wmma::load_matrix_sync(sh, hk_bf(s.Sh + kk * 16 * ldo + tj * 16),
                                   ldo);
            wmma::mma_sync(x, a, sh, x);
            if (fast)
                continue;
            wmma::load_matrix_sync(sl, hk_bf(s.Sl + kk * 16 * ldo + tj * 16),
                                   ldo);
            wmma::mma_sync(x, a, sl, x);
            if (LO) { /* + Q_lo S_hi */
                wmma::load_matrix_sync(a, hk_bf(s.Ql + ti * 16 * ldk + kk * 16),
                                       ldk);
                wmma::mma_sync(x, a, sh, x);
            }
        }
        for (int kk = 0; kk <= ti; kk++) {
            hk_fa_row ph, pl;
            hk_fb_row vh, vl;
            wmma::load_matrix_sync(ph, hk_bf(s.Ph + ti * 16 * ldp + kk * 16),
                                   ldp);
            wmma::load_matrix_sync(vh, hk_bf(s.Vh + kk * 16 * ldo + tj * 16),
                                   ldo);
            wmma::mma_sync(y, ph, vh, y);
            if (fast)
                continue;
            wmma::load_matrix_sync(pl, hk_bf(s.Pl + ti * 16 * ldp + kk * 16),
                                   ldp);
            wmma::load_matrix_sync(vl, hk_bf(s.Vl + kk * 16 * ldo + tj * 16),
                                   ldo);
            wmma::mma_sync(y, ph, vl, y);
            wmma::mma_sync(y, pl, vh, y);
        }
        wmma::store_matrix_sync(stg, x, 20, wmma::mem_row_major);
        wmma::store_matrix_sync(stg + 16 * 20, y, 20, wmma::mem_row_major);
        __syncwarp();
        for (int e = lane; e < 256; e += 32) {
            const int r = e / 16, c = e % 16, i = ti * 16 + r;
            if (i < n)
                o[(size_t)(t0 + i) * ldov + (size_t)h * dv + col0 + tj * 16 +
                  c] = s.eg[i] * stg[r * 20 + c] + stg[16 * 20 + r * 20 + c];
        }
        __syncwarp(); /* stg is rewritten by the warp's next tile */
    }
}

/* The SM count (4 where the device cannot say). */
static int hk_tc_sms(void)
{
    return hk_cuda_sm_count(4);
}

/* v1's BV: 32 when the grid still covers every SM, else 16 (more blocks). */
static int hk_tc_bv(int nseq, int Hv, int ncols, int dk, int dv)
{
    if (dk % 32 || dv % 32)
        return 16;
    return (long long)nseq * Hv * (ncols / 32) >= hk_tc_sms() ? 32 : 16;
}

/* v2's pass runs one block per SM (its double buffer takes most of the
 * shared memory) and each chunk step's time grows with BV: BV = 16 while
 * the blocks fit in one wave, else 32 (half the blocks, each twice the
 * MMAs but the same W and K bytes). With one buffer (nbuf = 1, two blocks
 * an SM at dk = 128) BV = 16 always. 0: no BV fits the shared memory. */
static int hk_tc_pass_bv(int nseq, int Hv, int ncols, int dk, int C, bool lo,
                         int nbuf)
{
    const size_t lim = (size_t)hk_cuda_smem_optin();
    const bool f16 = hk_tc_p_carve(NULL, NULL, NULL, dk, C, 16, lo, nbuf, true,
                                   false) <= lim;
    const bool f32 = hk_tc_p_carve(NULL, NULL, NULL, dk, C, 32, lo, nbuf, true,
                                   false) <= lim &&
                     ncols % 32 == 0 && dk % 32 == 0;
    if (f32 && (!f16 || (nbuf == 2 &&
                         (long long)nseq * Hv * (ncols / 16) > hk_tc_sms())))
        return 32;
    return f16 ? 16 : 0;
}

/* The launches of one call: v2 (pass BV > 0) unless flags ask for v1 or
 * v2's tiles do not fit the shared memory; each kernel's bytes. */
struct hk_tc_plan {
    int BV, PBV, BVO;
    int nbuf; /* the pass's buffers: 1 with HK_CUDA_GDN_TC_PSHARE, else 2 */
    int A1;   /* the first kernel A (HK_CUDA_GDN_TC_A1) */
    int A3;   /* kernel A3 (HK_CUDA_GDN_TC_A3) */
    int reg;  /* the pass in registers, where it can (not _SMEM) */
    int fuse; /* R with the outputs in the same pass (_FUSE_O, fitting) */
    int rbuf; /* R's chunk buffers: 2, or 3 (_DEEP, fitting) */
    size_t sa, sb, so;
};

/* Plans a call: 0, or 1 where kernel A or B / P does not fit. */
static int hk_tc_plan_for(hk_tc_plan *p, int nseq, int Hv, int ncols, int dk,
                          int dv, int C, bool lo, unsigned flags)
{
    const size_t lim = (size_t)hk_cuda_smem_optin();
    p->BVO = dv % 32 ? 16 : 32;
    p->so = hk_tc_o_carve(NULL, NULL, dk, C, p->BVO, lo);
    p->nbuf = flags & HK_CUDA_GDN_TC_PSHARE ? 1 : 2;
    p->PBV = (flags & HK_CUDA_GDN_TC_V1) || p->so > lim
                 ? 0
                 : hk_tc_pass_bv(nseq, Hv, ncols, dk, C, lo, p->nbuf);
    p->BV = p->PBV ? p->PBV : hk_tc_bv(nseq, Hv, ncols, dk, dv);
    p->A1 = (flags & HK_CUDA_GDN_TC_A1) != 0;
    p->A3 = (flags & HK_CUDA_GDN_TC_A3) != 0;
    p->reg = !(flags & HK_CUDA_GDN_TC_SMEM) && p->PBV && p->nbuf == 2 &&
             dk % 64 == 0 && dk <= 256;
    /* R64 where BV = 32 makes more blocks than SMs and its tiles fit
     * (without the fused outputs' tiles) */
    if ((flags & HK_CUDA_GDN_TC_R64) && p->reg && p->BV == 32 && dk == 128 &&
        ncols % 64 == 0 && (long long)nseq * Hv * (ncols / 32) > hk_tc_sms() &&
        hk_tc_p_carve(NULL, NULL, NULL, dk, C, 64, lo, 2, false, false) <= lim)
        p->BV = p->PBV = 64;
    p->sa = p->A1   ? hk_tc_a_carve(NULL, NULL, dk, dv, C, lo)
            : p->A3 ? hk_tc_a3_carve(NULL, NULL, C, lo)
                    : hk_tc_a2_carve(NULL, NULL, C, lo);
    p->fuse = p->reg && p->BV != 64 && (flags & HK_CUDA_GDN_TC_FUSE_O) &&
              hk_tc_p_carve(NULL, NULL, NULL, dk, C, p->BV, lo, 2, false,
                            true) <= lim;
    p->rbuf = p->reg && (flags & HK_CUDA_GDN_TC_DEEP) &&
                      hk_tc_p_carve(NULL, NULL, NULL, dk, C, p->BV, lo, 3,
                                    false, p->fuse) <= lim
                  ? 3
                  : 2;
    p->sb = p->reg ? hk_tc_p_carve(NULL, NULL, NULL, dk, C, p->BV, lo, p->rbuf,
                                   false, p->fuse)
            : p->PBV ? hk_tc_p_carve(NULL, NULL, NULL, dk, C, p->BV, lo,
                                     p->nbuf, true, false)
                     : hk_tc_b_carve(NULL, NULL, dk, C, p->BV, lo);
    return p->sa > lim || p->sb > lim;
}

/* The f32 entry's q, k, v (x[i] of n[i] elements each) into bf16 hi[i] +
 * lo[i] (hk_bf16_split); with lo NULL, hi only (rounded once:
 * HK_CUDA_GDN_TC_ROUND). */
struct hk_tc_split_args {
    const float *x[3];
    uint16_t *hi[3], *lo[3];
    size_t n[3];
    bool vec[3]; /* 4 elements a thread: n[i] % 4 == 0, x[i] 16-byte and
                    hi[i], lo[i] 8-byte aligned */
};

/* a[i] of a kernel parameter's array by selects: an index into the
 * parameter would copy it to the stack (104 bytes here). */
template <class P>
static __device__ __forceinline__ P hk_tc_pick(const P (&a)[3], int i)
{
    return i == 0 ? a[0] : i == 1 ? a[1] : a[2];
}

/* Four bf16 in one 8-byte store, element 0 in the low half. */
static __device__ __forceinline__ void hk_tc_put4(uint16_t *p,
                                                  const uint16_t (&h)[4])
{
    *(uint2 *)p =
        make_uint2(h[0] | (uint32_t)h[1] << 16, h[2] | (uint32_t)h[3] << 16);
}

/* Array blockIdx.y of the three, grid-strided over x: 16 bytes of it a
 * thread where vec (the H200 timed the element-a-thread form at a third of
 * its copy rate: 0.55 ms of a 16k-token chunk on 0.8B heads), one element
 * after, or without vec. */
static __global__ void hk_tc_split_kernel(hk_tc_split_args a)
{
    const int i = blockIdx.y;
    const float *x = hk_tc_pick(a.x, i);
    uint16_t *hi = hk_tc_pick(a.hi, i), *lo = hk_tc_pick(a.lo, i);
    const size_t n = hk_tc_pick(a.n, i);
    const size_t nv = hk_tc_pick(a.vec, i) ? n / 4 : 0;
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    const size_t t = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    for (size_t j = t; j < nv; j += stride) {
        const float4 v = ((const float4 *)x)[j];
        const float f[4] = {v.x, v.y, v.z, v.w};
        uint16_t h[4], l[4];
#pragma unroll
        for (int e = 0; e < 4; e++) {
            if (lo)
                hk_bf16_split(f[e], &h[e], &l[e]);
            else
                h[e] = hk_bf16_from_f32(f[e]);
        }
        hk_tc_put4(hi + 4 * j, h);
        if (lo)
            hk_tc_put4(lo + 4 * j, l);
    }
    for (size_t j = 4 * nv + t; j < n; j += stride) {
        if (lo)
            hk_bf16_split(x[j], &hi[j], &lo[j]);
        else
            hi[j] = hk_bf16_from_f32(x[j]);
    }
}

/* Phase timing for benches (hk_cuda_gdn_tc_profile): events 0..4 around
 * the f32 entry's split, kernel A, the state pass, the outputs. */
static cudaEvent_t hk_tc_ev[HK_CUDA_GDN_TC_PHASES + 1];
static int hk_tc_prof;

static void hk_tc_mark(int i, cudaStream_t s)
{
    if (hk_tc_prof)
        cudaEventRecord(hk_tc_ev[i], s);
}

extern "C" int hk_cuda_gdn_tc_profile(int on)
{
    if (!on == !hk_tc_prof)
        return 0;
    for (int i = 0; i <= HK_CUDA_GDN_TC_PHASES; i++) {
        cudaError_t e =
            on ? cudaEventCreate(&hk_tc_ev[i]) : cudaEventDestroy(hk_tc_ev[i]);
        if (e != cudaSuccess)
            return hk_cuda_status(e);
    }
    hk_tc_prof = on;
    return 0;
}

extern "C" int hk_cuda_gdn_tc_phases(double *ms)
{
    if (!hk_tc_prof)
        return HK_CUDA_EINVAL;
    cudaError_t e = cudaEventSynchronize(hk_tc_ev[HK_CUDA_GDN_TC_PHASES]);
    for (int i = 0; i < HK_CUDA_GDN_TC_PHASES && e == cudaSuccess; i++) {
        float f = 0.0f;
        e = cudaEventElapsedTime(&f, hk_tc_ev[i], hk_tc_ev[i + 1]);
        ms[i] = f;
    }
    return e == cudaSuccess ? 0 : hk_cuda_status(e);
}

/* Both entries: the launches on inputs `in` (lo parts when lo), chunk
 * workspace at ws_base, as planned by hk_tc_plan_for (fast: flags' FAST). */
template <bool LO>
static int hk_gdn_tc_launch(float *o, float *const *states, float *const *tcs,
                            hk_tc_in in, const hk_tc_plan &p, int fast,
                            int fast_a, const float *g, const float *beta,
                            const int *cu_seqlens, int nseq, int T, int Hk,
                            int Hv, int dk, int dv, int C, void *ws_base,
                            cudaStream_t s)
{
    const int ncols = dv + (tcs ? dk : 0);
    const size_t slots = hk_tc_slots(T, nseq, C);
    hk_tc_ws ws;
    hk_tc_ws_bytes(slots, Hv, dk, dv, C, &ws, (unsigned char *)ws_base);
    int rc;

    hk_tc_mark(1, s);
    if (T > 0) {
#define HK_TC_LOCAL(KERNEL)                                                    \
    do {                                                                       \
        cudaFuncSetAttribute(KERNEL<LO>,                                       \
                             cudaFuncAttributeMaxDynamicSharedMemorySize,      \
                             (int)p.sa);                                       \
        KERNEL<LO><<<dim3((unsigned)slots, Hv), HK_TC_A_THREADS, p.sa, s>>>(   \
            ws, in, g, beta, cu_seqlens, nseq, (int)slots, Hk, Hv, dk, dv, C,  \
            fast_a);                                                           \
    } while (0)
        if (p.A1)
            HK_TC_LOCAL(hk_gdn_tc_local_kernel);
        else if (p.A3)
            HK_TC_LOCAL(hk_gdn_tc_local3_kernel);
        else
            HK_TC_LOCAL(hk_gdn_tc_local2_kernel);
#undef HK_TC_LOCAL
        if ((rc = hk_cuda_check_launch()))
            return rc;
    }
    hk_tc_mark(2, s);
    const dim3 grid(ncols / p.BV, Hv, nseq);
#define HK_TC_STATE(KERNEL, N, THREADS, ...)                                   \
    do {                                                                       \
        cudaFuncSetAttribute(KERNEL<N, LO>,                                    \
                             cudaFuncAttributeMaxDynamicSharedMemorySize,      \
                             (int)p.sb);                                       \
        KERNEL<N, LO><<<grid, THREADS, p.sb, s>>>(__VA_ARGS__);                \
    } while (0)
    if (!p.PBV) {
        if (p.BV == 32)
            HK_TC_STATE(hk_gdn_tc_state_kernel, 32, HK_TC_B_THREADS, ws, o,
                        states, tcs, in, cu_seqlens, (int)slots, Hk, Hv, dk, dv,
                        C);
        else
            HK_TC_STATE(hk_gdn_tc_state_kernel, 16, HK_TC_B_THREADS, ws, o,
                        states, tcs, in, cu_seqlens, (int)slots, Hk, Hv, dk, dv,
                        C);
        rc = hk_cuda_check_launch();
        hk_tc_mark(3, s);
        hk_tc_mark(4, s);
        return rc;
    }
#undef HK_TC_STATE
    /* the state pass: kernel R (the state in registers) or P, by the plan;
     * the kernel (a template-id) is the variadic part */
#define HK_TC_PASS(THREADS, ...)                                               \
    do {                                                                       \
        cudaFuncSetAttribute(__VA_ARGS__,                                      \
                             cudaFuncAttributeMaxDynamicSharedMemorySize,      \
                             (int)p.sb);                                       \
        __VA_ARGS__<<<grid, THREADS, p.sb, s>>>(ws, states, tcs, in,           \
                                                cu_seqlens, (int)slots, Hk,    \
                                                Hv, dk, dv, C, fast);          \
    } while (0)
    /* kernel R: its state tiles a warp (MT), BV, its state warps (NW) and
     * the fused outputs */
#define HK_TC_REG(BV, MT, NW)                                                  \
    do {                                                                       \
        if (p.fuse) {                                                          \
            cudaFuncSetAttribute(hk_gdn_tc_reg_kernel<BV, MT, NW, LO, true>,   \
                                 cudaFuncAttributeMaxDynamicSharedMemorySize,  \
                                 (int)p.sb);                                   \
            hk_gdn_tc_reg_kernel<BV, MT, NW, LO, true>                         \
                <<<grid, 32 * (NW + HK_TC_O_WARPS), p.sb, s>>>(                \
                    ws, states, tcs, in, cu_seqlens, (int)slots, Hk, Hv, dk,   \
                    dv, C, fast, o, p.rbuf);                                   \
        } else {                                                               \
            cudaFuncSetAttribute(hk_gdn_tc_reg_kernel<BV, MT, NW, LO, false>,  \
                                 cudaFuncAttributeMaxDynamicSharedMemorySize,  \
                                 (int)p.sb);                                   \
            hk_gdn_tc_reg_kernel<BV, MT, NW, LO, false>                        \
                <<<grid, 32 * NW, p.sb, s>>>(ws, states, tcs, in, cu_seqlens,  \
                                             (int)slots, Hk, Hv, dk, dv, C,    \
                                             fast, o, p.rbuf);                 \
        }                                                                      \
    } while (0)
    const int mt = dk / 64;
    if (p.reg && p.BV == 64) {
        /* R64 (hk_tc_plan_for): dk = 128, not fused */
        cudaFuncSetAttribute(hk_gdn_tc_reg_kernel<64, 1, 8, LO, false>,
                             cudaFuncAttributeMaxDynamicSharedMemorySize,
                             (int)p.sb);
        hk_gdn_tc_reg_kernel<64, 1, 8, LO, false><<<grid, 32 * 8, p.sb, s>>>(
            ws, states, tcs, in, cu_seqlens, (int)slots, Hk, Hv, dk, dv, C,
            fast, o, p.rbuf);
    } else if (p.reg && p.BV == 32 && mt == 1)
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
#undef HK_TC_REG
    else if (p.BV == 32 && p.nbuf == 2)
        HK_TC_PASS(HK_TC_P_THREADS, hk_gdn_tc_pass_kernel<32, LO, 2>);
    else if (p.BV == 32)
        HK_TC_PASS(HK_TC_P_THREADS, hk_gdn_tc_pass_kernel<32, LO, 1>);
    else if (p.nbuf == 2)
        HK_TC_PASS(HK_TC_P_THREADS, hk_gdn_tc_pass_kernel<16, LO, 2>);
    else
        HK_TC_PASS(HK_TC_P_THREADS, hk_gdn_tc_pass_kernel<16, LO, 1>);
#undef HK_TC_PASS
    rc = hk_cuda_check_launch();
    hk_tc_mark(3, s);
    if (rc || T == 0 || p.fuse) {
        hk_tc_mark(4, s);
        return rc;
    }
    cudaFuncSetAttribute(hk_gdn_tc_out_kernel<LO>,
                         cudaFuncAttributeMaxDynamicSharedMemorySize,
                         (int)p.so);
    hk_gdn_tc_out_kernel<LO>
        <<<dim3((unsigned)slots, dv / p.BVO, Hv), HK_TC_O_THREADS, p.so, s>>>(
            ws, o, in, cu_seqlens, nseq, (int)slots, Hk, Hv, dk, dv, C, p.BVO,
            fast);
    rc = hk_cuda_check_launch();
    hk_tc_mark(4, s);
    return rc;
}

/* Shapes and flags both entries refuse (HK_CUDA_EINVAL; A1 and A3 both
 * asked for among them), the shared memory included: 0 when the kernels
 * can run them, with plan p. */
static int hk_tc_bad(hk_tc_plan *p, int T, int nseq, int Hk, int Hv, int dk,
                     int dv, int C, bool lo, bool want_tc, unsigned flags)
{
    if (T < 0 || nseq < 1 || nseq > HK_CUDA_MAX_GRID_YZ || Hk < 1 || Hv < 1 ||
        Hv % Hk || Hv > HK_CUDA_MAX_GRID_YZ || dk < 16 || dk % 16 ||
        dk > HK_CUDA_GDN_MAX_DK || dv < 16 || dv % 16 || C < 16 || C % 16 ||
        C > HK_CUDA_GDN_MAX_C || (flags & ~(unsigned)HK_CUDA_GDN_TC_FLAGS) ||
        ((flags & HK_CUDA_GDN_TC_A1) && (flags & HK_CUDA_GDN_TC_A3)))
        return 1;
    return hk_tc_plan_for(p, nseq, Hv, dv + (want_tc ? dk : 0), dk, dv, C, lo,
                          flags);
}

extern "C" int hk_cuda_gdn_tc_kernels(char *buf, size_t cap, int T, int nseq,
                                      int Hk, int Hv, int dk, int dv, int C,
                                      int f32_in, int want_tc, unsigned flags)
{
    hk_tc_plan p;
    const bool lo = f32_in && !(flags & HK_CUDA_GDN_TC_ROUND);
    if (!buf || cap == 0 ||
        hk_tc_bad(&p, T, nseq, Hk, Hv, dk, dv, C, lo, want_tc != 0, flags))
        return HK_CUDA_EINVAL;
    const char *a = p.A1 ? "A1" : p.A3 ? "A3" : "A2";
    if (!p.PBV) /* as hk_gdn_tc_launch picks them */
        snprintf(buf, cap, "%s B%d", a, p.BV);
    else if (p.reg)
        snprintf(buf, cap, "%s R%dx%d%s%s", a, p.BV, p.BV == 64 ? 1 : dk / 64,
                 p.rbuf == 3 ? "/3" : "", p.fuse ? "+O" : " O");
    else
        snprintf(buf, cap, "%s P%d%s O", a, p.BV, p.nbuf == 1 ? "s" : "");
    return HK_CUDA_OK;
}

extern "C" size_t hk_cuda_gdn_chunk_bf16_scratch(int T, int nseq, int Hv,
                                                 int dk, int dv, int C)
{
    if (T < 0 || nseq < 1 || Hv < 1 || dk < 1 || dv < 1 || C < 1)
        return 0;
    const size_t bytes =
        hk_tc_ws_bytes(hk_tc_slots(T, nseq, C), Hv, dk, dv, C, NULL, NULL);
    return bytes / sizeof(float);
}

extern "C" int hk_cuda_gdn_chunk_bf16_ex(
    float *o, float *const *states, float *const *tcs, const uint16_t *q,
    const uint16_t *k, const uint16_t *v, const float *g, const float *beta,
    const int *cu_seqlens, int nseq, int T, int Hk, int Hv, int dk, int dv,
    int C, float *scratch, unsigned flags, void *stream)
{
    hk_tc_plan p;
    if (hk_tc_bad(&p, T, nseq, Hk, Hv, dk, dv, C, false, tcs != NULL, flags) ||
        !states || !cu_seqlens || (T > 0 && !scratch))
        return HK_CUDA_EINVAL;
    const hk_tc_in in = {q, k, v, NULL, NULL, NULL};
    hk_tc_mark(0, hk_stream(stream));
    return hk_gdn_tc_launch<false>(
        o, states, tcs, in, p, flags & HK_CUDA_GDN_TC_FAST ? 1 : 0,
        flags & HK_CUDA_GDN_TC_FAST_A ? 1 : 0, g, beta, cu_seqlens, nseq, T, Hk,
        Hv, dk, dv, C, scratch, hk_stream(stream));
}

extern "C" int hk_cuda_gdn_chunk_bf16(float *o, float *const *states,
                                      float *const *tcs, const uint16_t *q,
                                      const uint16_t *k, const uint16_t *v,
                                      const float *g, const float *beta,
                                      const int *cu_seqlens, int nseq, int T,
                                      int Hk, int Hv, int dk, int dv, int C,
                                      float *scratch, void *stream)
{
    return hk_cuda_gdn_chunk_bf16_ex(o, states, tcs, q, k, v, g, beta,
                                     cu_seqlens, nseq, T, Hk, Hv, dk, dv, C,
                                     scratch, 0, stream);
}

/* The f32 entry's scratch: the chunk workspace, then q, k (T Hk dk each)
 * and v (T Hv dv) as hi and lo halves; byte offsets in off[6]. */
static size_t hk_tc_f32_bytes(int T, int nseq, int Hk, int Hv, int dk, int dv,
                              int C, size_t *off)
{
    const size_t nq = (size_t)T * Hk * dk, nv = (size_t)T * Hv * dv;
    const size_t sz[7] = {
        hk_tc_ws_bytes(hk_tc_slots(T, nseq, C), Hv, dk, dv, C, NULL, NULL),
        nq * 2,
        nq * 2,
        nq * 2,
        nq * 2,
        nv * 2,
        nv * 2};
    size_t o7[7];
    const size_t at = hk_layout(sz, 7, 256, o7);
    for (int i = 0; off && i < 6; i++)
        off[i] = o7[i + 1];
    return at;
}

extern "C" size_t hk_cuda_gdn_chunk_tc_scratch(int T, int nseq, int Hk, int Hv,
                                               int dk, int dv, int C)
{
    if (T < 0 || nseq < 1 || Hk < 1 || Hv < 1 || dk < 1 || dv < 1 || C < 1)
        return 0;
    return (hk_tc_f32_bytes(T, nseq, Hk, Hv, dk, dv, C, NULL) + 3) /
           sizeof(float);
}

extern "C" int hk_cuda_gdn_chunk_tc_ex(
    float *o, float *const *states, float *const *tcs, const float *q,
    const float *k, const float *v, const float *g, const float *beta,
    const int *cu_seqlens, int nseq, int T, int Hk, int Hv, int dk, int dv,
    int C, float *scratch, unsigned flags, void *stream)
{
    hk_tc_plan p;
    const bool lo = !(flags & HK_CUDA_GDN_TC_ROUND);
    if (hk_tc_bad(&p, T, nseq, Hk, Hv, dk, dv, C, lo, tcs != NULL, flags) ||
        !states || !cu_seqlens || (T > 0 && !scratch))
        return HK_CUDA_EINVAL;
    const cudaStream_t s = hk_stream(stream);
    size_t off[6];
    hk_tc_f32_bytes(T, nseq, Hk, Hv, dk, dv, C, off);
    unsigned char *base = (unsigned char *)scratch;
    uint16_t *h[6];
    for (int i = 0; i < 6; i++)
        h[i] = (uint16_t *)(base + off[i]);
    const size_t nq = (size_t)T * Hk * dk, nv = (size_t)T * Hv * dv;
    hk_tc_mark(0, s);
    if (T > 0) {
        hk_tc_split_args a = {{q, k, v},
                              {h[0], h[2], h[4]},
                              {NULL, NULL, NULL},
                              {nq, nq, nv},
                              {false, false, false}};
        size_t most = 0; /* the widest array's threads */
        for (int i = 0; i < 3; i++) {
            a.lo[i] = lo ? h[2 * i + 1] : NULL;
            a.vec[i] = a.n[i] % 4 == 0 && hk_aligned(a.x[i], 16) &&
                       hk_aligned(a.hi[i], 8) &&
                       (!lo || hk_aligned(a.lo[i], 8));
            const size_t w = a.vec[i] ? a.n[i] / 4 : a.n[i];
            most = w > most ? w : most;
        }
        hk_tc_split_kernel<<<dim3(hk_grid_1d(most, 256), 3), 256, 0, s>>>(a);
        int rc = hk_cuda_check_launch();
        if (rc)
            return rc;
    }
    if (!lo) { /* the bf16 entry's kernels on the rounded inputs */
        const hk_tc_in in = {h[0], h[2], h[4], NULL, NULL, NULL};
        return hk_gdn_tc_launch<false>(
            o, states, tcs, in, p, flags & HK_CUDA_GDN_TC_FAST ? 1 : 0,
            flags & HK_CUDA_GDN_TC_FAST_A ? 1 : 0, g, beta, cu_seqlens, nseq, T,
            Hk, Hv, dk, dv, C, scratch, s);
    }
    const hk_tc_in in = {h[0], h[2], h[4], h[1], h[3], h[5]};
    return hk_gdn_tc_launch<true>(
        o, states, tcs, in, p, flags & HK_CUDA_GDN_TC_FAST ? 1 : 0,
        flags & HK_CUDA_GDN_TC_FAST_A ? 1 : 0, g, beta, cu_seqlens, nseq, T, Hk,
        Hv, dk, dv, C, scratch, s);
}

extern "C" int hk_cuda_gdn_chunk_tc(float *o, float *const *states,
                                    float *const *tcs, const float *q,
                                    const float *k, const float *v,
                                    const float *g, const float *beta,
                                    const int *cu_seqlens, int nseq, int T,
                                    int Hk, int Hv, int dk, int dv, int C,
                                    float *scratch, void *stream)
{
    return hk_cuda_gdn_chunk_tc_ex(o, states, tcs, q, k, v, g, beta, cu_seqlens,
                                   nseq, T, Hk, Hv, dk, dv, C, scratch, 0,
                                   stream);
}
