/*
 * hk_attention_wg.cu - FLASH3: causal GQA attention prefill on Hopper's
 * warpgroup tensor cores (wgmma, hk_wgmma.h), on bf16 q, k, p, v with f32
 * accumulation and softmax (FLASH2's precision; the math and the CPU twin
 * are hk_attention.c's):
 *
 *   o[t, h] = sum_{j <= qpos[t]} softmax_j(scale * q[t, h] . k[j, g]) v[j, g]
 *
 * Why: on an H100, mma.sync (FLASH2) reaches ~190 TFLOP/s at T = 16k where
 * torch's SDPA (wgmma kernels) reaches ~630 (session 11); wgmma is the
 * only way to the hardware's rate.
 *
 * Scratch. One pass (hk_f3_convert) writes k and v as bf16 tiles of 64
 * keys, in exactly the layout the kernel's shared memory takes them (the
 * K tile, then V transposed), so that a tile is one contiguous run of
 * 2 * 64 * HD bf16 that cp.async copies 16 bytes a thread at a time with
 * no address arithmetic, and both products read K-major operands (the
 * contracted axis contiguous: hd for S = Q K^T, keys for O = P V). Keys
 * past N are zeros. Layout (hk_wgmma.h's core matrices, 8 x 8 bf16 of
 * 128 contiguous bytes): K tile element (key n, column d) at
 * (n / 8) 8 HD + (d / 8) 64 + 8 (n % 8) + d % 8; V^T tile element (column
 * d, key n) at (d / 8) 8 BK + (n / 8) 64 + 8 (d % 8) + n % 8.
 *
 * The kernel, per block of 128 rows (query, head) of one kv group (rows as
 * hk_attention_tc.cu's: head fastest, latest rows first), two warpgroups
 * of 64 rows each:
 *   - q rows -> bf16 in shared memory, as core matrices (zeros past hd and
 *     past the last row);
 *   - tiles of BK = 64 keys double-buffered: tile j + 1 is issued with
 *     cp.async before tile j is used;
 *   - S = Q K^T: HD / 16 wgmma m64n64k16, both operands in shared memory,
 *     S in registers (32 floats a thread);
 *   - scale * log2(e), the causal mask and the online softmax on the
 *     accumulators, as FLASH2 (the accumulator layout of a warp is
 *     mma.m16n8's, side by side); O *= alpha in registers;
 *   - O += P V: P packed to bf16 A fragments straight from S's registers
 *     (the accumulator layout is the A-fragment layout), BK / 16 wgmma
 *     m64nHDk16 with A in registers and V^T in shared memory; O is 64 x HD
 *     a warpgroup (HD / 2 floats a thread: 128 at HD 256).
 * That is FLASH3_SEQ. FLASH3 (OV) issues tile j + 1's S before tile j's
 * softmax, so the tensor cores compute it while the softmax runs
 * (FlashAttention-3's intra-warpgroup overlap): K tiles are loaded a tile
 * ahead of V tiles, in the same two slots, and S of two tiles is in
 * registers (242 a thread at HD 256, against 202).
 * Tiles past a warpgroup's last key are skipped whole; within the diagonal
 * tile P is 0 past each row's last key (a partial P V would put the
 * products on a path ptxas cannot prove uniform, and it serializes them).
 * Shared memory: 128 HD 2 (Q) + 2 x 2 x 64 HD 2 (two buffers of K and V^T) +
 * 512 bytes: 197,120 at HD 256 (one block per SM), 98,816 at 128.
 *
 * Runs only on a compute capability 9.0 device (sm_90a's wgmma; elsewhere
 * HK_CUDA_EINVAL, and the default choice falls back to FLASH2). Under the
 * host emulator, emu/wgmma.h.
 */
#include <cuda_bf16.h>
#include <stdint.h>

#include "kernels/cuda/hk_cuda_impl.h"
#include "kernels/cuda/hk_ptx.h"
#include "kernels/cuda/hk_wgmma.h"

#define HK_F3_THREADS 256 /* two warpgroups */
#define HK_F3_M       128 /* rows (query, head) per block, 64 a warpgroup */
#define HK_F3_BK      64  /* keys per tile */

template <int HD> struct hk_f3 {
    static constexpr size_t Q = (size_t)HK_F3_M * HD * 2;
    static constexpr int TILE = 2 * HK_F3_BK * HD; /* bf16: K, then V^T */
    static constexpr size_t SMEM = Q + 2 * (size_t)TILE * 2 + HK_F3_M * 4;
    /* the carve of a block's shared memory p */
    __nv_bfloat16 *sQ; /* [M, HD] as core matrices */
    __nv_bfloat16 *sT; /* [2][K | V^T] */
    int *sLim;         /* [M] */
    __device__ explicit hk_f3(unsigned char *p)
        : sQ((__nv_bfloat16 *)p), sT((__nv_bfloat16 *)(p + Q)),
          sLim((int *)(p + Q + 2 * (size_t)TILE * 2))
    {
    }
};

/* Blocks per SM: two only where their registers fit (HD 64 without the
 * overlap: ~110 a thread; beyond, two would cap them at 128 and ptxas
 * serializes the products or spills). */
static constexpr int hk_f3_blocks(int HD, bool OV)
{
    return HD <= 64 && !OV ? 2 : 1;
}

/* k, v [N, Hkv, hd] f32 -> the scratch's bf16 tiles (above), ntiles per
 * kv group; one thread per 8 keys x 8 columns of both. */
static __global__ void hk_f3_convert(__nv_bfloat16 *kv, const float *k,
                                     const float *v, int N, int ntiles, int Hkv,
                                     int hd, int HD)
{
    const int n8 = HK_F3_BK / 8, d8s = HD / 8;
    const size_t n = (size_t)Hkv * ntiles * n8 * d8s;
    const size_t tile = 2 * (size_t)HK_F3_BK * HD;
    HK_GRID_STRIDE(i, n)
    {
        const int d8 = (int)(i % d8s);
        const int kb = (int)(i / d8s % n8);
        const size_t gt = i / d8s / n8; /* g ntiles + tile */
        const size_t g = gt / (size_t)ntiles;
        const int key0 = (int)(gt % (size_t)ntiles) * HK_F3_BK + kb * 8;
        float x[2][8][8]; /* [k, v][key][column] */
        for (int r = 0; r < 8; r++) {
            const int key = key0 + r;
            for (int c = 0; c < 8; c++) {
                const int d = d8 * 8 + c;
                const bool in = key < N && d < hd;
                const size_t at = ((size_t)key * Hkv + g) * hd + d;
                x[0][r][c] = in ? k[at] : 0.0f;
                x[1][r][c] = in ? v[at] : 0.0f;
            }
        }
        __nv_bfloat16 *t = kv + gt * tile;
        for (int r = 0; r < 8; r++) {
            /* K: row r of core matrix (kb, d8); V^T: row d8 8 + r of its
             * core matrix (d8, kb), i.e. column r of the block */
            uint4 a, b;
            a.x = hk_pack_bf16x2(x[0][r][0], x[0][r][1]);
            a.y = hk_pack_bf16x2(x[0][r][2], x[0][r][3]);
            a.z = hk_pack_bf16x2(x[0][r][4], x[0][r][5]);
            a.w = hk_pack_bf16x2(x[0][r][6], x[0][r][7]);
            b.x = hk_pack_bf16x2(x[1][0][r], x[1][1][r]);
            b.y = hk_pack_bf16x2(x[1][2][r], x[1][3][r]);
            b.z = hk_pack_bf16x2(x[1][4][r], x[1][5][r]);
            b.w = hk_pack_bf16x2(x[1][6][r], x[1][7][r]);
            *reinterpret_cast<uint4 *>(t + (size_t)kb * 8 * HD + d8 * 64 +
                                       8 * r) = a;
            *reinterpret_cast<uint4 *>(t + HK_F3_BK * HD +
                                       (size_t)d8 * 8 * HK_F3_BK + kb * 64 +
                                       8 * r) = b;
        }
    }
}

/* Pins n accumulators in the instruction order: after a wait, so reads
 * stay after it; before a wgmma fence, so no register move lands between
 * the fence and the products (ptxas would serialize them: C7515). */
static __device__ __forceinline__ void hk_f3_hold(float *x, int n)
{
#pragma unroll
    for (int i = 0; i < n; i++)
        hk_wgmma_hold(x[i]);
}

/* S = Q K^T of the warpgroup's 64 rows and a tile's 64 keys, issued
 * (committed, not waited for). */
template <int HD>
static __device__ __forceinline__ void hk_f3_scores(float S[HK_F3_BK / 2],
                                                    const __nv_bfloat16 *wQ,
                                                    const __nv_bfloat16 *tK)
{
    hk_f3_hold(S, HK_F3_BK / 2);
    hk_wgmma_fence();
#pragma unroll
    for (int s = 0; s < HD / 16; s++)
        hk_wgmma_ss_64x64(S, hk_wgmma_desc(wQ + s * 128, 128, HD * 16),
                          hk_wgmma_desc(tK + s * 128, 128, HD * 16), s > 0);
    hk_wgmma_commit();
}

/* A tile's online softmax step (hk_frag_softmax: the accumulator layout
 * of a warp is mma.m16n8's, side by side), then P packed as the A
 * fragments of P V (keys 16 s.. are S[8 s .. 8 s + 7] in pairs). */
template <int HD>
static __device__ __forceinline__ void
hk_f3_softmax(float S[HK_F3_BK / 2], int k0, const int lim[2], int lane,
              float sl2, float m[2], float l[2], float O[HD / 2],
              uint32_t P[HK_F3_BK / 16][4])
{
    const int BK = HK_F3_BK;
    hk_frag_softmax<BK / 8, HD / 2>(S, O, k0, lim, lane, sl2, m, l);
#pragma unroll
    for (int s = 0; s < BK / 16; s++) {
#pragma unroll
        for (int u = 0; u < 4; u++)
            P[s][u] = hk_pack_bf16x2(S[8 * s + 2 * u], S[8 * s + 2 * u + 1]);
    }
}

/* O += P V over a tile's V^T, issued (committed, not waited for). Within
 * the diagonal tile P is 0 past each row's last key: a partial product
 * would put the wgmma on a path ptxas cannot prove uniform, and it
 * serializes them all. */
template <int HD>
static __device__ __forceinline__ void
hk_f3_pv(float O[HD / 2], uint32_t P[HK_F3_BK / 16][4], const __nv_bfloat16 *tV)
{
    /* registers wgmma reads are written before its fence */
#pragma unroll
    for (int i = 0; i < HD / 2; i++)
        hk_wgmma_hold(O[i]);
#pragma unroll
    for (int s = 0; s < HK_F3_BK / 16; s++)
#pragma unroll
        for (int u = 0; u < 4; u++)
            hk_wgmma_hold(P[s][u]);
    hk_wgmma_fence();
#pragma unroll
    for (int s = 0; s < HK_F3_BK / 16; s++)
        hk_wgmma_rs<HD>(O, P[s],
                        hk_wgmma_desc(tV + s * 128, 128, HK_F3_BK * 16), 1);
    hk_wgmma_commit();
}

/* A block's start, every thread of it: the key count of each of its rows
 * to sLim, its q rows to sQ as bf16 core matrices (chunk i of 8 bf16 is
 * row 8 (i / 8 / (HD / 8)) + i % 8, columns 8 (i / 8 % (HD / 8)):
 * consecutive threads fill a core matrix; zeros past hd and the last
 * row); then the proxy fence and the block barrier. */
template <int HD>
static __device__ void hk_f3_stage_q(__nv_bfloat16 *sQ, int *sLim,
                                     const float *q, const int *qpos,
                                     const hk_att_rows &rw, int vec)
{
    const int tid = threadIdx.x;
    if (tid < HK_F3_M)
        sLim[tid] = rw.keys(qpos, tid);
    for (int i = tid; i < HK_F3_M * HD / 8; i += blockDim.x) {
        const int rr = (i >> 3) / (HD / 8) * 8 + (i & 7);
        const int d = (i >> 3) % (HD / 8) * 8;
        const long long at = rw.off(rr);
        float x[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
        if (at >= 0 && vec && d < rw.hd) {
            const float4 a = *reinterpret_cast<const float4 *>(q + at + d);
            const float4 b = *reinterpret_cast<const float4 *>(q + at + d + 4);
            x[0] = a.x, x[1] = a.y, x[2] = a.z, x[3] = a.w;
            x[4] = b.x, x[5] = b.y, x[6] = b.z, x[7] = b.w;
        } else if (at >= 0) {
            for (int u = 0; u < 8; u++)
                x[u] = d + u < rw.hd ? q[at + d + u] : 0.0f;
        }
        *reinterpret_cast<uint4 *>(sQ + (size_t)i * 8) =
            make_uint4(hk_pack_bf16x2(x[0], x[1]), hk_pack_bf16x2(x[2], x[3]),
                       hk_pack_bf16x2(x[4], x[5]), hk_pack_bf16x2(x[6], x[7]));
    }
    hk_fence_proxy_async(); /* st.shared -> wgmma's reads */
    __syncthreads();
}

/* Half (0: K, 1: V^T) of key tile j of the group's tiles kvg into slot
 * b's half of sT, 16 bytes a thread, threads first, first + step, ...
 * (no commit). */
template <int HD>
static __device__ __forceinline__ void
hk_f3_load(__nv_bfloat16 *sT, const __nv_bfloat16 *kvg, int j, int half, int b,
           int first, int step)
{
    const int TILE = hk_f3<HD>::TILE;
    const __nv_bfloat16 *src = kvg + (size_t)j * TILE + half * (TILE / 2);
    __nv_bfloat16 *dst = sT + b * TILE + half * (TILE / 2);
    for (int i = first; i < TILE / 16; i += step)
        hk_cp_async16(dst + i * 8, src + i * 8, 16);
}

/* After hk_f3_stage_q: the key tiles [*j0, *nt) of the block's split
 * blockIdx.z of nsplit (hk_att_splits; nsplit 1: all), and for a thread
 * of warpgroup wg < 2 its last key (*gmax, the max over its 64 rows) and
 * those of the lane's two rows (lim[0]: row g of the warp's 16, lim[1]:
 * g + 8; wr: the warp's first row). */
static __device__ void hk_f3_range(const int *sLim, int wg, int wr, int lane,
                                   int nsplit, int *j0, int *nt, int *gmax,
                                   int lim[2])
{
    int nk = 0;
    for (int i = 0; i < HK_F3_M; i++)
        nk = max(nk, sLim[i]);
    *gmax = 0;
    lim[0] = lim[1] = 0;
    if (wg < 2) {
        for (int i = 0; i < 64; i++)
            *gmax = max(*gmax, sLim[wg * 64 + i]);
        lim[0] = sLim[wr + lane / 4], lim[1] = sLim[wr + lane / 4 + 8];
    }
    const int ntk = (nk + HK_F3_BK - 1) / HK_F3_BK;
    const int per = (ntk + nsplit - 1) / nsplit;
    *j0 = min(ntk, (int)blockIdx.z * per);
    *nt = min(ntk, *j0 + per);
}

/* A warp's end: its rows' o (nsplit 1) or their partial softmax. */
template <int HD>
static __device__ void
hk_f3_end(float *o, float *part, const float *O, const float m[2], float l[2],
          const hk_att_rows &rw, int wr, int lane, int hd, int nsplit)
{
    const long long at[2] = {rw.off(wr + lane / 4), rw.off(wr + lane / 4 + 8)};
    if (nsplit == 1)
        hk_frag_rows_out<HD>(o, O, l, at, hd, lane);
    else
        hk_frag_rows_part<HD>(part, O, m, l, at, hd, lane, nsplit,
                              (int)blockIdx.z);
}

/* Grid (row blocks, Hkv, nsplit): split z takes the z-th of nsplit even
 * ranges of the block's key tiles (split-KV, hk_cuda_impl.h; nsplit 1:
 * all, o written, else the partials). sl2 = scale * log2(e). kv: the
 * scratch's tiles (hk_f3_convert), ntiles per kv group. OV: the next tile's S =
 * Q K^T is issued before this tile's softmax, so the tensor cores run it while
 * the softmax runs (FlashAttention-3's intra-warpgroup overlap): K tiles are
 * loaded a tile ahead of V tiles, and S of two tiles is in registers. */
template <int HD, bool OV>
static __global__ void __launch_bounds__(HK_F3_THREADS, hk_f3_blocks(HD, OV))
    hk_f3_kernel(float *o,                // [T, Hq, hd]
                 float *part,             // [T Hq, nsplit, 2 + hd] (nsplit > 1)
                 const float *q,          // [T, Hq, hd]
                 const int *qpos,         // [T]
                 const __nv_bfloat16 *kv, // tiles
                 int T, int ntiles, int Hq, int Hkv, int hd, float sl2, int vec,
                 int nsplit)
{
    const int BK = HK_F3_BK, TILE = hk_f3<HD>::TILE;
    HK_DYNAMIC_SMEM(smem);
    const hk_f3<HD> L(smem);
    const int tid = threadIdx.x, lane = tid & 31;
    const int wg = tid >> 7, wq = (tid >> 5) & 3; /* warpgroup, its warp */
    const hk_att_rows rw(HK_F3_M, T, Hq, Hkv, hd);
    const int g = rw.g;

    hk_f3_stage_q<HD>(L.sQ, L.sLim, q, qpos, rw, vec);
    /* this warpgroup's 64 rows: the warp's first (wr), their Q (wQ) */
    const int wr = wg * 64 + wq * 16;
    const __nv_bfloat16 *wQ = L.sQ + (size_t)wg * 64 * HD;
    const __nv_bfloat16 *kvg = kv + (size_t)g * ntiles * TILE;
    auto load = [&](int j, int half, int b) {
        hk_f3_load<HD>(L.sT, kvg, j, half, b, tid, HK_F3_THREADS);
    };
    float O[HD / 2], m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
#pragma unroll
    for (int i = 0; i < HD / 2; i++)
        O[i] = 0.0f;
    uint32_t P[BK / 16][4];
    int j0, nt, gmax, lim[2];
    hk_f3_range(L.sLim, wg, wr, lane, nsplit, &j0, &nt, &gmax, lim);

    if (!OV) {
        /* tile j in slot j % 2; tile j + 1 issued before tile j is used */
        if (j0 < nt) {
            load(j0, 0, j0 & 1), load(j0, 1, j0 & 1);
            hk_cp_async_commit();
        }
        for (int j = j0; j < nt; j++) {
            if (j + 1 < nt) {
                load(j + 1, 0, (j + 1) & 1), load(j + 1, 1, (j + 1) & 1);
                hk_cp_async_commit();
                hk_cp_async_wait<1>();
            } else {
                hk_cp_async_wait<0>();
            }
            hk_fence_proxy_async(); /* cp.async's writes -> wgmma's reads */
            __syncthreads();
            const int k0 = j * BK;
            if (k0 < gmax) { /* warpgroup-uniform */
                const __nv_bfloat16 *tK = L.sT + (j & 1) * TILE;
                float S[BK / 2] = {}; /* defined: hk_f3_scores pins it */
                hk_f3_scores<HD>(S, wQ, tK);
                hk_wgmma_wait<0>();
                hk_f3_hold(S, BK / 2);
                hk_f3_softmax<HD>(S, k0, lim, lane, sl2, m, l, O, P);
                hk_f3_pv<HD>(O, P, tK + BK * HD);
                hk_wgmma_wait<0>();
                hk_f3_hold(O, HD / 2);
            }
            /* every warpgroup is done with slot j % 2 before tile j + 2 */
            __syncthreads();
        }
    } else if (j0 < nt) {
        /* K of tile j in slot j % 2, V of tile j in slot j % 2: at the top
         * of iteration j, S_j is in registers and every warpgroup is done
         * with K_j and V_{j-1}; K_{j+2} and V_{j+1} go in their slots
         * while K_{j+1} and V_j (issued an iteration ago) land. */
        float S[BK / 2] = {}, Sn[BK / 2] = {};
        load(j0, 0, j0 & 1), load(j0, 1, j0 & 1);
        if (j0 + 1 < nt)
            load(j0 + 1, 0, (j0 + 1) & 1);
        hk_cp_async_commit();
        hk_cp_async_wait<0>();
        hk_fence_proxy_async();
        __syncthreads();
        if (j0 * BK < gmax) {
            hk_f3_scores<HD>(S, wQ, L.sT + (j0 & 1) * TILE);
            hk_wgmma_wait<0>();
            hk_f3_hold(S, BK / 2);
        }
        __syncthreads(); /* K_j0 is free */
        for (int j = j0; j < nt; j++) {
            if (j + 2 < nt)
                load(j + 2, 0, j & 1);
            if (j + 1 < nt)
                load(j + 1, 1, (j + 1) & 1);
            hk_cp_async_commit(); /* maybe empty: the wait counts it */
            hk_cp_async_wait<1>();
            hk_fence_proxy_async();
            __syncthreads();
            const int k0 = j * BK;
            const bool next = k0 + BK < gmax; /* warpgroup-uniform */
            if (next)
                hk_f3_scores<HD>(Sn, wQ, L.sT + ((j + 1) & 1) * TILE);
            if (k0 < gmax) {
                hk_f3_softmax<HD>(S, k0, lim, lane, sl2, m, l, O, P);
                hk_f3_pv<HD>(O, P, L.sT + (j & 1) * TILE + BK * HD);
            }
            hk_wgmma_wait<0>();
            hk_f3_hold(O, HD / 2);
            if (next) {
                hk_f3_hold(Sn, BK / 2);
#pragma unroll
                for (int i = 0; i < BK / 2; i++)
                    S[i] = Sn[i];
            }
            /* every warpgroup is done with K_{j+1} and V_j */
            __syncthreads();
        }
    }

    hk_f3_end<HD>(o, part, O, m, l, rw, wr, lane, hd, nsplit);
}

/* FLASH3_WS: the two warpgroups of FLASH3_SEQ as consumers, a ninth warp
 * as the producer of their K and V^T tiles (warp specialization), and the
 * warpgroups taking turns on the tensor cores (FlashAttention-3's
 * ping-pong). Why: in FLASH3_SEQ both warpgroups pass a block barrier twice
 * a tile, so they compute S together, run their softmax together (the
 * tensor cores idle) and P V together; its own OV overlap costs registers
 * (242 a thread at HD 256) and measured slower. Here no block barrier
 * follows the start, and the named barriers (hk_ptx.h) say only what each
 * side waits for:
 *   - the producer issues K_{j+1} once both warpgroups are done with
 *     K_{j-1} (FREE_K of its slot, arrived after their S_{j-1}) and V_{j+1}
 *     once they are done with V_{j-1} (after P V), and signals K_j and V_j
 *     landed to each warpgroup apart (FULL_K, FULL_V), so neither waits for
 *     the other's progress, only for the data;
 *   - a warpgroup issues each of its products (S, then P V) only in its
 *     turn (TURN: its own barrier, completed by the other's arrival after
 *     the other issued): products alternate between the warpgroups, and
 *     while one runs its softmax the other's products keep the tensor
 *     cores busy.
 * A warpgroup past its rows' last key keeps the protocol (every sync and
 * arrival) without the products, so both count the same tiles. The
 * shared memory is FLASH3_SEQ's (two slots of a K and a V^T tile); one
 * block per SM at HD 256. Registers: __maxnreg__ 224, since
 * __launch_bounds__(288, 1) made ptxas allot 168 (65536 / 384: it rounds
 * the block to whole warpgroups) and spill 560 bytes at HD 256; 9 warps
 * of 224 fit the 64K. sm_90a: 204 / 140 / 108 at HD 256 / 128 / 64, no
 * spills. */
#define HK_F3W_THREADS      (HK_F3_THREADS + 32)
#define HK_F3W_TURN(w)      (1 + (w))           /* 256: sync w, arrive 1-w */
#define HK_F3W_FULL_K(s, w) (3 + 2 * (s) + (w)) /* 160: arrive P, sync w */
#define HK_F3W_FULL_V(s, w) (7 + 2 * (s) + (w)) /* 160 */
#define HK_F3W_FREE_K(s)    (11 + (s))          /* 288: arrive both, sync P */
#define HK_F3W_FREE_V(s)    (13 + (s))          /* 288 */
#define HK_F3W_FULL_N       (128 + 32)

template <int HD>
static __global__ void __maxnreg__(224)
    hk_f3ws_kernel(float *o, float *part, const float *q, const int *qpos,
                   const __nv_bfloat16 *kv, int T, int ntiles, int Hq, int Hkv,
                   int hd, float sl2, int vec, int nsplit)
{
    const int BK = HK_F3_BK, TILE = hk_f3<HD>::TILE;
    HK_DYNAMIC_SMEM(smem);
    const hk_f3<HD> L(smem);
    const int tid = threadIdx.x, lane = tid & 31;
    const int wg = tid >> 7, wq = (tid >> 5) & 3; /* wg 2: the producer */
    const hk_att_rows rw(HK_F3_M, T, Hq, Hkv, hd);
    const int wr = wg * 64 + wq * 16;

    hk_f3_stage_q<HD>(L.sQ, L.sLim, q, qpos, rw, vec);
    int j0, nt, gmax, lim[2];
    hk_f3_range(L.sLim, wg, wr, lane, nsplit, &j0, &nt, &gmax, lim);
    if (j0 >= nt)
        return; /* block-uniform: no tile, no barrier */

    if (wg == 2) {
        /* Tile j in slot j % 2; groups in the order K_j, V_j, K_{j+1},
         * V_{j+1}, ... (empty past the last tile), so at each wait the two
         * newest may stay pending. */
        const __nv_bfloat16 *kvg = kv + (size_t)rw.g * ntiles * TILE;
        for (int half = 0; half < 2; half++) {
            hk_f3_load<HD>(L.sT, kvg, j0, half, j0 & 1, lane, 32);
            hk_cp_async_commit();
        }
        for (int j = j0; j < nt; j++) {
            const int s = j & 1;
            for (int half = 0; half < 2; half++) {
                if (j > j0) /* both warpgroups are done with tile j - 1's */
                    hk_bar_sync(half ? HK_F3W_FREE_V(s ^ 1)
                                     : HK_F3W_FREE_K(s ^ 1),
                                HK_F3W_THREADS);
                if (j + 1 < nt)
                    hk_f3_load<HD>(L.sT, kvg, j + 1, half, s ^ 1, lane, 32);
                hk_cp_async_commit();
                hk_cp_async_wait<2>();  /* this half of tile j landed */
                hk_fence_proxy_async(); /* cp.async's writes -> wgmma's */
                for (int w = 0; w < 2; w++)
                    hk_bar_arrive(half ? HK_F3W_FULL_V(s, w)
                                       : HK_F3W_FULL_K(s, w),
                                  HK_F3W_FULL_N);
            }
        }
        hk_bar_sync(HK_F3W_FREE_K((nt - 1) & 1), HK_F3W_THREADS);
        hk_bar_sync(HK_F3W_FREE_V((nt - 1) & 1), HK_F3W_THREADS);
        return;
    }

    const __nv_bfloat16 *wQ = L.sQ + (size_t)wg * 64 * HD;
    float O[HD / 2], m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
#pragma unroll
    for (int i = 0; i < HD / 2; i++)
        O[i] = 0.0f;
    uint32_t P[BK / 16][4];
    const int me = HK_F3W_TURN(wg), other = HK_F3W_TURN(wg ^ 1);
    if (wg == 1) /* warpgroup 0 takes the first turn */
        hk_bar_arrive(HK_F3W_TURN(0), HK_F3_THREADS);
    for (int j = j0; j < nt; j++) {
        const int s = j & 1, k0 = j * BK;
        const bool live = k0 < gmax; /* warpgroup-uniform */
        const __nv_bfloat16 *tK = L.sT + s * TILE;
        float S[BK / 2] = {}; /* defined: hk_f3_scores pins it */
        /* Each product and its wait in one branch, the other's turn
         * handed over inside it: with the two apart, ptxas sees a path
         * from the issue to a use of the registers without the wait, and
         * serializes the products (C7514). */
        hk_bar_sync(HK_F3W_FULL_K(s, wg), HK_F3W_FULL_N);
        hk_bar_sync(me, HK_F3_THREADS);
        if (live) {
            hk_f3_scores<HD>(S, wQ, tK);
            hk_bar_arrive(other, HK_F3_THREADS);
            hk_wgmma_wait<0>();
            hk_f3_hold(S, BK / 2);
        } else {
            hk_bar_arrive(other, HK_F3_THREADS);
        }
        hk_bar_arrive(HK_F3W_FREE_K(s), HK_F3W_THREADS);
        if (live)
            hk_f3_softmax<HD>(S, k0, lim, lane, sl2, m, l, O, P);
        hk_bar_sync(HK_F3W_FULL_V(s, wg), HK_F3W_FULL_N);
        hk_bar_sync(me, HK_F3_THREADS);
        if (live) {
            hk_f3_pv<HD>(O, P, tK + BK * HD);
            hk_bar_arrive(other, HK_F3_THREADS);
            hk_wgmma_wait<0>();
            hk_f3_hold(O, HD / 2);
        } else {
            hk_bar_arrive(other, HK_F3_THREADS);
        }
        hk_bar_arrive(HK_F3W_FREE_V(s), HK_F3W_THREADS);
    }
    if (wg == 0) /* warpgroup 1's arrival after its last product */
        hk_bar_sync(HK_F3W_TURN(0), HK_F3_THREADS);
    hk_f3_end<HD>(o, part, O, m, l, rw, wr, lane, hd, nsplit);
}

/* Floats of the bf16 K and V^T tiles: 2 HK_F3_BK HD bf16 = HK_F3_BK HD
 * floats each. */
static size_t hk_f3_tiles(int N, int Hkv, int HD)
{
    const size_t ntiles = ((size_t)N + HK_F3_BK - 1) / HK_F3_BK;
    return (size_t)Hkv * ntiles * HK_F3_BK * HD;
}

/* Blocks per SM the split counts take: the more of the two kernels' (the
 * scratch then holds either's partials). */
static int hk_f3_per_sm(int HD)
{
    const int a = hk_f3_blocks(HD, false), b = hk_f3_blocks(HD, true);
    return a > b ? a : b;
}

size_t hk_attention_f3_scratch(int T, int N, int Hq, int Hkv, int hd)
{
    const int HD = hk_att_tc_hd(hd);
    if (!HD)
        return 0;
    return hk_f3_tiles(N, Hkv, HD) +
           hk_att_part_floats(hk_f3_per_sm(HD), HK_F3_M, T, N, Hq, Hkv, hd);
}

int hk_attention_f3_splits(int T, int N, int Hq, int Hkv, int hd)
{
    const int HD = hk_att_tc_hd(hd);
    return HD ? hk_att_splits(hk_f3_per_sm(HD), HK_F3_M, T, N, Hq, Hkv) : 1;
}

template <int HD, int KIND>
static int hk_f3_launch(float *o, const float *q, const int *qpos,
                        const float *k, const float *v, int T, int N, int Hq,
                        int Hkv, int hd, float scale, float *scratch, int vec,
                        cudaStream_t stream)
{
    typedef hk_f3<HD> L;
    if (L::SMEM > (size_t)hk_cuda_smem_optin())
        return HK_CUDA_EINVAL;
    if (T == 0)
        return HK_CUDA_OK;
    __nv_bfloat16 *kv = reinterpret_cast<__nv_bfloat16 *>(scratch);
    const int ntiles = (N + HK_F3_BK - 1) / HK_F3_BK;
    const size_t nconv = (size_t)Hkv * ntiles * (HK_F3_BK / 8) * (HD / 8);
    hk_f3_convert<<<hk_grid_1d(nconv, 256), 256, 0, stream>>>(
        kv, k, v, N, ntiles, Hkv, hd, HD);
    int rc = hk_cuda_check_launch();
    if (rc)
        return rc;
    const long long nb = ((long long)T * (Hq / Hkv) + HK_F3_M - 1) / HK_F3_M;
    const int ns = hk_att_splits(hk_f3_per_sm(HD), HK_F3_M, T, N, Hq, Hkv);
    float *part = scratch + hk_f3_tiles(N, Hkv, HD);
    const dim3 grid((unsigned)nb, (unsigned)Hkv, (unsigned)ns);
    const float sl2 = scale * 1.4426950408889634f;
    if (KIND == HK_F3_WS) {
        cudaFuncSetAttribute(hk_f3ws_kernel<HD>,
                             cudaFuncAttributeMaxDynamicSharedMemorySize,
                             (int)L::SMEM);
        hk_f3ws_kernel<HD><<<grid, HK_F3W_THREADS, L::SMEM, stream>>>(
            o, part, q, qpos, kv, T, ntiles, Hq, Hkv, hd, sl2, vec, ns);
    } else {
        cudaFuncSetAttribute(hk_f3_kernel<HD, KIND == HK_F3_OV>,
                             cudaFuncAttributeMaxDynamicSharedMemorySize,
                             (int)L::SMEM);
        hk_f3_kernel<HD, KIND == HK_F3_OV>
            <<<grid, HK_F3_THREADS, L::SMEM, stream>>>(
                o, part, q, qpos, kv, T, ntiles, Hq, Hkv, hd, sl2, vec, ns);
    }
    rc = hk_cuda_check_launch();
    if (rc || ns == 1)
        return rc;
    return hk_att_combine(o, part, (long long)T * Hq, hd, ns, stream);
}

/* The launcher of (HD, kind). */
typedef int (*hk_f3_launch_t)(float *, const float *, const int *,
                              const float *, const float *, int, int, int, int,
                              int, float, float *, int, cudaStream_t);

int hk_attention_f3(int kind, float *o, const float *q, const int *qpos,
                    const float *k, const float *v, int T, int N, int Hq,
                    int Hkv, int hd, float scale, float *scratch,
                    cudaStream_t stream)
{
    const int HD = hk_att_tc_hd(hd);
    if (!HD || !scratch || ((uintptr_t)scratch & 15) != 0 ||
        hk_cuda_cc() != 90 || kind < HK_F3_SEQ || kind > HK_F3_WS)
        return HK_CUDA_EINVAL;
    const long long nb = ((long long)T * (Hq / Hkv) + HK_F3_M - 1) / HK_F3_M;
    if (nb > 2147483647LL || Hkv > HK_CUDA_MAX_GRID_YZ)
        return HK_CUDA_EINVAL;
    const int vec = hd % 8 == 0 && ((uintptr_t)q & 15) == 0;
    static const hk_f3_launch_t f[3][3] = {
        {hk_f3_launch<64, HK_F3_SEQ>, hk_f3_launch<128, HK_F3_SEQ>,
         hk_f3_launch<256, HK_F3_SEQ>},
        {hk_f3_launch<64, HK_F3_OV>, hk_f3_launch<128, HK_F3_OV>,
         hk_f3_launch<256, HK_F3_OV>},
        {hk_f3_launch<64, HK_F3_WS>, hk_f3_launch<128, HK_F3_WS>,
         hk_f3_launch<256, HK_F3_WS>}};
    const int i = HD == 64 ? 0 : HD == 128 ? 1 : 2;
    return f[kind][i](o, q, qpos, k, v, T, N, Hq, Hkv, hd, scale, scratch, vec,
                      stream);
}
