/*
 * hk_attention_tc.cu - causal GQA attention prefill on tensor cores
 * (hk_cuda_attention's FLASH and FLASH_BF16 kernels on wmma, and FLASH2 /
 * FLASH2X, FlashAttention-2's structure on mma.sync with bf16 or hi/lo
 * split operands, at the end of the file; the math and the CPU twin are
 * hk_attention.c's):
 *
 *   o[t, h] = sum_{j <= qpos[t]} softmax_j(scale * q[t, h] . k[j, g]) v[j, g]
 *
 * Work. The rows of a kv group g are its (query, head) pairs, head fastest:
 * row R is query R / r, head g r + R % r (r = Hq / Hkv). A block takes 64
 * consecutive rows (16 queries of 4 heads for Qwen3.5), so every K/V tile
 * it stages serves all the group's heads; blocks run latest rows first
 * (the most keys). Keys go by tiles of 64, up to the block's largest
 * qpos + 1:
 *   1. K tile -> shared memory as bf16;
 *   2. S = Q K^T on wmma 16x16x16 (8 warps: row group of 16 x 32 keys);
 *   3. per row, an online softmax in f32 (4 threads a row): m' = max(m,
 *      max_valid S scale), P = e^{S scale - m'} on keys j <= qpos (0
 *      elsewhere), l = l e^{m - m'} + sum P; P -> shared memory as bf16;
 *      V tile -> shared memory (the K buffer, free by then);
 *   4. O = O e^{m - m'} + P V on wmma (8 warps: row group x half of hd),
 *      O held in accumulator fragments; the rescale goes through a per-warp
 *      tile of shared memory, and only when a row's maximum moved.
 * Finally o = O / l through the same per-warp tile (rows of a block are
 * not evenly strided in o).
 *
 * Precision. FLASH splits every f32 operand x into bf16 hi + lo
 * (hk_bf16_split's rounding) and forms hi*hi + hi*lo + lo*hi with f32
 * accumulation (3 MMAs a product): ~16 significant bits per operand, so
 * S and O come out within ~1e-5 of f32 (the tests' bound: RTOL_ATT_TC).
 * FLASH_BF16 rounds q, k, p and v to bf16 once (1 MMA): ~3e-3, the
 * precision of a bf16 flash-attention kernel. Softmax statistics are f32
 * throughout; expf where the CPU has its polynomial (~1 ulp apart).
 *
 * Shared memory at hd 256: 168 KB with split operands (Q, the K/V tile and
 * P as hi/lo bf16, S, row statistics), one block per SM on an H100; 93 KB
 * with bf16 operands (two blocks). Set with cudaFuncSetAttribute.
 * Requirements: hd <= 256 (rounded up to 16 with zero columns). f32
 * inputs are read as float4 when hd % 4 == 0 and the pointers allow it.
 */
#include <cuda_bf16.h>
#include <mma.h>
#include <stdint.h>

#include "kernels/cuda/hk_cuda_impl.h"
#include "kernels/cuda/hk_ptx.h"

using namespace nvcuda;

#define HK_FA_THREADS 256
#define HK_FA_WARPS   (HK_FA_THREADS / 32)
#define HK_FA_M       64 /* rows (query, head) per block */
#define HK_FA_BK      64 /* keys per tile */
/* Row padding: 8 bf16 / 4 f32 (16 bytes) keep 16-row tiles 32-byte
 * aligned and spread rows over the banks. */
#define HK_FA_LDS (HK_FA_BK + 4)
#define HK_FA_LDP (HK_FA_BK + 8)
/* O tiles (16 columns of hd) per warp: half of hd <= 256. */
#define HK_FA_OT (HK_CUDA_ATT_TC_MAX_HD / 32)

typedef wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16,
                       wmma::row_major>
    hk_fa_a;
typedef wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16,
                       wmma::col_major>
    hk_fa_bt; /* K^T: K rows read as columns */
typedef wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16,
                       wmma::row_major>
    hk_fa_b;
typedef wmma::fragment<wmma::accumulator, 16, 16, 16, float> hk_fa_acc;

/* The block's shared memory. */
struct hk_fa_smem {
    __nv_bfloat16 *Qh, *Ql; // [M, ldh]
    __nv_bfloat16 *Kh, *Kl; // [BK, ldh]  K tile, then V tile
    float *S;               // [M, LDS]  scores; per-warp O tiles later
    __nv_bfloat16 *Ph, *Pl; // [M, LDP]
    float *m, *l, *alpha;   // [M]
    int *lim;               // [M] keys of each row (qpos + 1; 0: no row)
};

/* The lo halves only with split operands: without, a block needs 93 KB
 * at hd 256, and two fit on an SM. */
static __host__ __device__ size_t hk_fa_carve(hk_fa_smem *s,
                                              unsigned char *base, int ldh,
                                              bool split)
{
    const size_t q = (size_t)HK_FA_M * ldh * 2, kv = (size_t)HK_FA_BK * ldh * 2;
    const size_t p = (size_t)HK_FA_M * HK_FA_LDP * 2;
    const size_t sz[9] = {q,
                          split ? q : 0,
                          kv,
                          split ? kv : 0,
                          (size_t)HK_FA_M * HK_FA_LDS * 4,
                          p,
                          split ? p : 0,
                          3 * HK_FA_M * 4,
                          HK_FA_M * 4};
    size_t off[9];
    const size_t total = hk_layout(sz, 9, 128, off);
    if (s) {
        s->Qh = (__nv_bfloat16 *)(base + off[0]);
        s->Ql = (__nv_bfloat16 *)(base + off[1]);
        s->Kh = (__nv_bfloat16 *)(base + off[2]);
        s->Kl = (__nv_bfloat16 *)(base + off[3]);
        s->S = (float *)(base + off[4]);
        s->Ph = (__nv_bfloat16 *)(base + off[5]);
        s->Pl = (__nv_bfloat16 *)(base + off[6]);
        s->m = (float *)(base + off[7]);
        s->l = s->m + HK_FA_M;
        s->alpha = s->l + HK_FA_M;
        s->lim = (int *)(base + off[8]);
    }
    return total;
}

/* x -> bf16 hi (and, with SPLIT, the rounded remainder lo). */
template <bool SPLIT>
static __device__ __forceinline__ void hk_fa_put(__nv_bfloat16 *h,
                                                 __nv_bfloat16 *l, float x)
{
    const __nv_bfloat16 hi = __float2bfloat16_rn(x);
    *h = hi;
    if (SPLIT)
        *l = __float2bfloat16_rn(x - __bfloat162float(hi));
}

/* Stages 64 rows of hd floats as bf16 [64, ldh] (columns hd..hdp-1 and
 * rows whose pointer is NULL zeroed). row(i): the row's first float. */
template <bool SPLIT, class RowFn>
static __device__ void hk_fa_stage(__nv_bfloat16 *dh, __nv_bfloat16 *dl,
                                   int ldh, RowFn row, int hd, int hdp, int vec)
{
    const int nq = hdp / 4;
    for (int i = threadIdx.x; i < 64 * nq; i += HK_FA_THREADS) {
        const int rr = i / nq, d = (i % nq) * 4;
        const float *src = row(rr);
        float x[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        if (src && vec && d < hd) {
            const float4 f = *reinterpret_cast<const float4 *>(src + d);
            x[0] = f.x, x[1] = f.y, x[2] = f.z, x[3] = f.w;
        } else if (src) {
            for (int u = 0; u < 4; u++)
                x[u] = d + u < hd ? src[d + u] : 0.0f;
        }
        const size_t at = (size_t)rr * ldh + d;
        for (int u = 0; u < 4; u++)
            hk_fa_put<SPLIT>(dh + at + u, dl + at + u, x[u]);
    }
}

/* Each of the warp's first n O tiles through its 16x16 f32 tile of shared
 * memory: stored, f(i) on the lanes' elements, loaded back if back. */
template <class F>
static __device__ __forceinline__ void hk_fa_tiles(hk_fa_acc *O, int n,
                                                   float *wtile, bool back, F f)
{
#pragma unroll
    for (int i = 0; i < HK_FA_OT; i++) {
        if (i >= n)
            break;
        wmma::store_matrix_sync(wtile, O[i], 16, wmma::mem_row_major);
        __syncwarp();
        f(i);
        __syncwarp();
        if (back) {
            wmma::load_matrix_sync(O[i], wtile, 16, wmma::mem_row_major);
            __syncwarp();
        }
    }
}

/* Grid (row blocks, Hkv). */
template <bool SPLIT>
static __global__ void __launch_bounds__(HK_FA_THREADS)
    hk_fa_kernel(float *o,        // [T, Hq, hd]
                 const float *q,  // [T, Hq, hd]
                 const int *qpos, // [T]
                 const float *k,  // [N, Hkv, hd]
                 const float *v,  // [N, Hkv, hd]
                 int T, int Hq, int Hkv, int hd, float scale, int vec)
{
    HK_DYNAMIC_SMEM(smem);
    const int hdp = (hd + 15) / 16 * 16, ldh = hdp + 8;
    hk_fa_smem s;
    hk_fa_carve(&s, smem, ldh, SPLIT);
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const hk_att_rows rw(HK_FA_M, T, Hq, Hkv, hd);
    const int g = rw.g;
    const size_t ldkv = (size_t)Hkv * hd;
    /* Row rr of the block in q and o (NULL past the last row). */
    auto qrow = [&](int rr) -> const float * {
        const long long at = rw.off(rr);
        return at < 0 ? nullptr : q + at;
    };

    if (tid < HK_FA_M) {
        s.lim[tid] = rw.keys(qpos, tid);
        s.m[tid] = -INFINITY;
        s.l[tid] = 0.0f;
    }
    hk_fa_stage<SPLIT>(s.Qh, s.Ql, ldh, qrow, hd, hdp, vec);
    __syncthreads();

    /* Warp roles: row group rg (16 rows), half hf (keys in step 2, hd
     * columns in step 4). */
    const int rg = warp >> 1, hf = warp & 1;
    int nk = 0, rgmax = 0;
    for (int i = 0; i < HK_FA_M; i++) {
        nk = max(nk, s.lim[i]);
        if (i / 16 == rg)
            rgmax = max(rgmax, s.lim[i]);
    }
    const int ot = hdp / 16, ot0 = hf * ((ot + 1) / 2);
    const int otn = min(ot, ot0 + (ot + 1) / 2) - ot0;
    hk_fa_acc O[HK_FA_OT];
#pragma unroll
    for (int i = 0; i < HK_FA_OT; i++)
        wmma::fill_fragment(O[i], 0.0f);
    float *wtile = s.S + warp * 256; /* per-warp 16x16 f32 in step 4 */

    for (int kb = 0; kb < nk; kb += HK_FA_BK) {
        const int bk = min(HK_FA_BK, nk - kb);
        /* Row j of the tile of x (k or v) in group g; NULL past bk. */
        auto keys = [&](const float *x) {
            return [=](int j) -> const float * {
                return j < bk ? x + (size_t)(kb + j) * ldkv + (size_t)g * hd
                              : nullptr;
            };
        };
        /* Keys of this tile the warp's rows can see. */
        const int nvg = max(0, min(bk, rgmax - kb));
        hk_fa_stage<SPLIT>(s.Kh, s.Kl, ldh, keys(k), hd, hdp, vec);
        __syncthreads();

        /* 2. S[rg rows, hf*32 + 0..31] = Q K^T. */
        for (int c = 0; c < 2; c++) {
            const int c0 = hf * 32 + c * 16;
            if (c0 >= nvg)
                break;
            hk_fa_acc acc;
            wmma::fill_fragment(acc, 0.0f);
            for (int kk = 0; kk < hdp; kk += 16) {
                hk_fa_a ah, al;
                hk_fa_bt bh, bl;
                wmma::load_matrix_sync(ah, s.Qh + rg * 16 * ldh + kk, ldh);
                wmma::load_matrix_sync(bh, s.Kh + c0 * ldh + kk, ldh);
                if (SPLIT) {
                    wmma::load_matrix_sync(al, s.Ql + rg * 16 * ldh + kk, ldh);
                    wmma::load_matrix_sync(bl, s.Kl + c0 * ldh + kk, ldh);
                    wmma::mma_sync(acc, al, bh, acc);
                    wmma::mma_sync(acc, ah, bl, acc);
                }
                wmma::mma_sync(acc, ah, bh, acc);
            }
            wmma::store_matrix_sync(s.S + rg * 16 * HK_FA_LDS + c0, acc,
                                    HK_FA_LDS, wmma::mem_row_major);
        }
        __syncthreads();

        /* 3. Online softmax: row rr, keys part*16 .. +15 per thread. */
        {
            const int rr = tid >> 2, part = tid & 3;
            const int nv = max(0, min(bk, s.lim[rr] - kb));
            const float mold = s.m[rr], lold = s.l[rr];
            float x[16], mx = -INFINITY;
            for (int j = 0; j < 16; j++) {
                const int jj = part * 16 + j;
                x[j] = jj < nv ? s.S[rr * HK_FA_LDS + jj] * scale : -INFINITY;
                mx = fmaxf(mx, x[j]);
            }
            mx = fmaxf(mx, __shfl_xor_sync(HK_FULL_MASK, mx, 1));
            mx = fmaxf(mx, __shfl_xor_sync(HK_FULL_MASK, mx, 2));
            const float mnew = fmaxf(mold, mx);
            float sum = 0.0f;
            for (int j = 0; j < 16; j++) {
                const int jj = part * 16 + j;
                const float p = jj < nv ? expf(x[j] - mnew) : 0.0f;
                sum += p;
                hk_fa_put<SPLIT>(s.Ph + rr * HK_FA_LDP + jj,
                                 s.Pl + rr * HK_FA_LDP + jj, p);
            }
            sum += __shfl_xor_sync(HK_FULL_MASK, sum, 1);
            sum += __shfl_xor_sync(HK_FULL_MASK, sum, 2);
            /* No key yet (m = -inf): nothing to rescale. */
            const float alpha = mnew == -INFINITY ? 1.0f : expf(mold - mnew);
            if (part == 0) {
                s.m[rr] = mnew;
                s.l[rr] = lold * alpha + sum;
                s.alpha[rr] = alpha;
            }
        }
        /* V over K (every warp is past step 2). */
        hk_fa_stage<SPLIT>(s.Kh, s.Kl, ldh, keys(v), hd, hdp, vec);
        __syncthreads();

        /* 4. O = O alpha + P V on the warp's rows and columns. */
        bool moved = false;
        for (int i = 0; i < 16; i++)
            moved |= s.alpha[rg * 16 + i] != 1.0f;
        if (moved)
            hk_fa_tiles(O, otn, wtile, true, [&](int) {
                for (int e = lane; e < 256; e += 32)
                    wtile[e] *= s.alpha[rg * 16 + e / 16];
            });
        for (int kk = 0; kk < nvg; kk += 16) {
            hk_fa_a ph, pl;
            wmma::load_matrix_sync(ph, s.Ph + rg * 16 * HK_FA_LDP + kk,
                                   HK_FA_LDP);
            if (SPLIT)
                wmma::load_matrix_sync(pl, s.Pl + rg * 16 * HK_FA_LDP + kk,
                                       HK_FA_LDP);
#pragma unroll
            for (int i = 0; i < HK_FA_OT; i++) {
                if (i >= otn)
                    break;
                const int d0 = (ot0 + i) * 16;
                hk_fa_b vh, vl;
                wmma::load_matrix_sync(vh, s.Kh + kk * ldh + d0, ldh);
                if (SPLIT) {
                    wmma::load_matrix_sync(vl, s.Kl + kk * ldh + d0, ldh);
                    wmma::mma_sync(O[i], pl, vh, O[i]);
                    wmma::mma_sync(O[i], ph, vl, O[i]);
                }
                wmma::mma_sync(O[i], ph, vh, O[i]);
            }
        }
        __syncthreads();
    }

    /* o = O / l, rows mapped back to (query, head). */
    hk_fa_tiles(O, otn, wtile, false, [&](int i) {
        for (int e = lane; e < 256; e += 32) {
            const int rr = rg * 16 + e / 16, d = (ot0 + i) * 16 + e % 16;
            const float *qr = qrow(rr);
            if (qr && d < hd)
                o[(size_t)(qr - q) + d] = wtile[e] / s.l[rr];
        }
    });
}

int hk_attention_tc(int split, float *o, const float *q, const int *qpos,
                    const float *k, const float *v, int T, int Hq, int Hkv,
                    int hd, float scale, cudaStream_t stream)
{
    if (hd < 1 || hd > HK_CUDA_ATT_TC_MAX_HD)
        return HK_CUDA_EINVAL;
    const int hdp = (hd + 15) / 16 * 16;
    const size_t sm = hk_fa_carve(NULL, NULL, hdp + 8, split != 0);
    if (sm > (size_t)hk_cuda_smem_optin())
        return HK_CUDA_EINVAL;
    if (T == 0)
        return HK_CUDA_OK;
    const long long rows = (long long)T * (Hq / Hkv);
    const long long nb = (rows + HK_FA_M - 1) / HK_FA_M;
    if (nb > 2147483647LL || Hkv > HK_CUDA_MAX_GRID_YZ)
        return HK_CUDA_EINVAL;
    const int vec = hd % 4 == 0 && ((uintptr_t)q & 15) == 0 &&
                    ((uintptr_t)k & 15) == 0 && ((uintptr_t)v & 15) == 0;
    const dim3 grid((unsigned)nb, (unsigned)Hkv);
    if (split) {
        cudaFuncSetAttribute(hk_fa_kernel<true>,
                             cudaFuncAttributeMaxDynamicSharedMemorySize,
                             (int)sm);
        hk_fa_kernel<true><<<grid, HK_FA_THREADS, sm, stream>>>(
            o, q, qpos, k, v, T, Hq, Hkv, hd, scale, vec);
    } else {
        cudaFuncSetAttribute(hk_fa_kernel<false>,
                             cudaFuncAttributeMaxDynamicSharedMemorySize,
                             (int)sm);
        hk_fa_kernel<false><<<grid, HK_FA_THREADS, sm, stream>>>(
            o, q, qpos, k, v, T, Hq, Hkv, hd, scale, vec);
    }
    return hk_cuda_check_launch();
}

/* ---- FLASH2: FlashAttention-2's structure, fragments in registers -------
 *
 * bf16 q, k, p, v (FLASH_BF16's precision), f32 accumulation and softmax;
 * FLASH2X (X, the same kernel) splits each of them into bf16 hi + lo as
 * FLASH does (S = Qh Kh + Qh Kl + Ql Kh, O += Ph Vh + Ph Vl + Pl Vh: 3
 * MMAs a product, ~1e-5 of f32). One pass (hk_f2_convert) writes k and v
 * as bf16 [Hkv, N, HD] into the caller's scratch (with X their lo halves
 * too: kh, vh, kl, vl), each row padded with zeros to HD (64, 128 or 256,
 * the kernel's template), so every K/V tile is HD-wide rows that cp.async
 * copies 16 bytes at a time. The kernel, per block of 128 rows (query,
 * head) of one kv group (rows as in hk_fa_kernel), 8 warps of 16 rows:
 *   - q rows -> bf16 in shared memory (once, synchronous; zeros past hd
 *     and past the last row; X: hi and lo);
 *   - K/V tiles of BK keys double-buffered: tile j + 1 is issued with
 *     cp.async (zero fill past N) before tile j is used, then
 *     wait_group 1 and a barrier;
 *   - S = Q K^T on mma.m16n8k16 (Q and K fragments by ldmatrix.x4 from
 *     padded rows, 16 bytes of padding: the 8 rows of a matrix fall in 8
 *     different bank groups), S in registers: warp 16 x BK;
 *   - scale * log2(e) and the causal mask (key < qpos + 1 of the row)
 *     folded into one pass, the online softmax with exp2f on the lanes'
 *     two rows (maxima over the 4 lanes of a row by shuffles; l kept per
 *     lane and summed at the end), O *= alpha in registers;
 *   - P re-packed from the S accumulators into A fragments (bf16; X: hi
 *     and lo from the f32 probabilities), V fragments by ldmatrix.x4.trans,
 *     O += P V in registers (16 x HD a warp: 128 floats a lane at HD 256).
 * Tiles past a warp's last key are skipped whole, and within the
 * diagonal tile by 16 keys. Shared memory: (X ? 2 : 1) ((128 + 4 BK)
 * (HD + 8) 2) + 512 bytes. FLASH2, BK = 64: 199 KB at HD 256 (one block
 * per SM), 103 KB at 128 (two). FLASH2X: BK = 64 up to HD 128 (108 KB at
 * 64, two blocks; 204 KB at 128, one); at HD 256 two planes of Q take
 * 132 KB and double-buffered hi/lo K/V tiles of 64 (or 32) keys do not
 * fit beside them (264 KB / 198 KB more), so BK = 16: 198 KB, one block.
 *
 * Split-KV. A short prompt over a long cache (a PIC splice's seams, a
 * prefix-cache resume, the last piece of a chunked prefill) has few row
 * blocks, each walking every key alone: 64 queries of 4 heads per group
 * over 16k keys are 8 blocks on an H100's 132 SMs. Where the grid is
 * under a wave (hk_att_splits: blocks per SM x SMs), z splits each block's
 * key tiles into nsplit contiguous ranges; a split writes its rows'
 * partial softmax (hk_frag_rows_part) to scratch past the k/v planes and
 * hk_att_combine makes o, as flash-decoding does for one query.
 */
#define HK_F2_THREADS 256
#define HK_F2_M       128 /* rows (query, head) per block, 16 per warp */

template <int HD, bool X> struct hk_f2 {
    static constexpr int BK = X && HD > 128 ? 16 : 64; /* keys per tile */
    static constexpr int NS = X ? 2 : 1; /* bf16 planes: hi (, lo) */
    static constexpr int LD = HD + 8;    /* bf16 row pitch in shared memory */
    static constexpr size_t Q = (size_t)HK_F2_M * LD * 2; /* a plane */
    static constexpr size_t KV = (size_t)BK * LD * 2;     /* a plane */
    static constexpr size_t SMEM = NS * (Q + 4 * KV) + HK_F2_M * 4;
    /* two blocks per SM where their shared memory fits an H100's */
    static constexpr int BLOCKS = SMEM <= 115200 ? 2 : 1;
};

/* k, v [N, Hkv, hd] f32 -> bf16 [Hkv, N, HD] planes kh, vh (and, X, kl,
 * vl) P elements apart from kb, zero past hd; one thread per 8 output
 * values of each. */
template <bool X>
static __global__ void hk_f2_convert(__nv_bfloat16 *kb, const float *k,
                                     const float *v, int N, int Hkv, int hd,
                                     int HD, size_t P, int vec)
{
    const int nc = HD / 8;
    const size_t n = (size_t)N * Hkv * nc;
    HK_GRID_STRIDE(i, n)
    {
        const int c = (int)(i % nc) * 8;
        const size_t row = i / nc; /* g N + key */
        const size_t g = row / (size_t)N, key = row % (size_t)N;
        const size_t src = (key * (size_t)Hkv + g) * (size_t)hd + c;
        const float *xs[2] = {k, v};
        for (int w = 0; w < 2; w++) {
            float x[8];
            if (vec && c + 8 <= hd) {
                const float4 a = *reinterpret_cast<const float4 *>(xs[w] + src);
                const float4 b =
                    *reinterpret_cast<const float4 *>(xs[w] + src + 4);
                x[0] = a.x, x[1] = a.y, x[2] = a.z, x[3] = a.w;
                x[4] = b.x, x[5] = b.y, x[6] = b.z, x[7] = b.w;
            } else {
                for (int u = 0; u < 8; u++)
                    x[u] = c + u < hd ? xs[w][src + u] : 0.0f;
            }
            uint32_t h[4], l[4];
            for (int u = 0; u < 4; u++) {
                if (X)
                    hk_split_bf16x2(x[2 * u], x[2 * u + 1], &h[u], &l[u]);
                else
                    h[u] = hk_pack_bf16x2(x[2 * u], x[2 * u + 1]);
            }
            __nv_bfloat16 *d = kb + w * P + row * HD + c;
            *reinterpret_cast<uint4 *>(d) = make_uint4(h[0], h[1], h[2], h[3]);
            if (X)
                *reinterpret_cast<uint4 *>(d + 2 * P) =
                    make_uint4(l[0], l[1], l[2], l[3]);
        }
    }
}

/* Grid (row blocks, Hkv, nsplit). sl2 = scale * log2(e). kb: the
 * scratch's planes (hk_f2_convert), P elements apart. Split z of nsplit
 * takes the z-th of nsplit even ranges of the block's key tiles. */
template <int HD, bool X>
static __global__ void __launch_bounds__(HK_F2_THREADS, hk_f2<HD, X>::BLOCKS)
    hk_f2_kernel(float *o,                // [T, Hq, hd]
                 float *part,             // [T Hq, nsplit, 2 + hd] (nsplit > 1)
                 const float *q,          // [T, Hq, hd]
                 const int *qpos,         // [T]
                 const __nv_bfloat16 *kb, // kh, vh (, kl, vl) [Hkv, N, HD]
                 size_t P, int T, int N, int Hq, int Hkv, int hd, float sl2,
                 int vec, int nsplit)
{
    typedef hk_f2<HD, X> L;
    const int LD = L::LD, BK = L::BK, NS = L::NS;
    HK_DYNAMIC_SMEM(smem);
    /* plane p of Q at sQ + p QP; of K / V buffer b at sK / sV + (b NS + p)
     * KP */
    const int QP = HK_F2_M * LD, KP = BK * LD;
    __nv_bfloat16 *sQ = (__nv_bfloat16 *)smem;               // [NS][M, LD]
    __nv_bfloat16 *sK = (__nv_bfloat16 *)(smem + NS * L::Q); // [2][NS][BK, LD]
    __nv_bfloat16 *sV = sK + 2 * NS * KP;                    // [2][NS][BK, LD]
    int *sLim = (int *)(smem + NS * (L::Q + 4 * L::KV));     // [M]
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const hk_att_rows rw(HK_F2_M, T, Hq, Hkv, hd);
    const int g = rw.g;

    if (tid < HK_F2_M)
        sLim[tid] = rw.keys(qpos, tid);
    for (int i = tid; i < HK_F2_M * HD / 4; i += HK_F2_THREADS) {
        const int rr = i / (HD / 4), d = i % (HD / 4) * 4;
        const long long at = rw.off(rr);
        float x[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        if (at >= 0 && vec && d < hd) {
            const float4 f = *reinterpret_cast<const float4 *>(q + at + d);
            x[0] = f.x, x[1] = f.y, x[2] = f.z, x[3] = f.w;
        } else if (at >= 0) {
            for (int u = 0; u < 4; u++)
                x[u] = d + u < hd ? q[at + d + u] : 0.0f;
        }
        uint32_t *dh = reinterpret_cast<uint32_t *>(sQ + rr * LD + d);
        if (X) {
            uint32_t *dl = reinterpret_cast<uint32_t *>(sQ + QP + rr * LD + d);
            hk_split_bf16x2(x[0], x[1], &dh[0], &dl[0]);
            hk_split_bf16x2(x[2], x[3], &dh[1], &dl[1]);
        } else {
            dh[0] = hk_pack_bf16x2(x[0], x[1]);
            dh[1] = hk_pack_bf16x2(x[2], x[3]);
        }
    }
    __syncthreads();

    /* Keys: the block's (nk), the warp's 16 rows' (wmax), the lane's two
     * rows' (lim[0]: row g of the warp's 16, lim[1]: g + 8). */
    const int wr = warp * 16;
    int nk = 0, wmax = 0;
    for (int i = 0; i < HK_F2_M; i++)
        nk = max(nk, sLim[i]);
    for (int i = 0; i < 16; i++)
        wmax = max(wmax, sLim[wr + i]);
    const int lim[2] = {sLim[wr + lane / 4], sLim[wr + lane / 4 + 8]};
    const int ntile = (nk + BK - 1) / BK, per = (ntile + nsplit - 1) / nsplit;
    const int j0 = min(ntile, (int)blockIdx.z * per), j1 = min(ntile, j0 + per);
    /* plane p of k / v for group g: kb + (2 p + 0 / 1) P + g N HD */
    const __nv_bfloat16 *kg = kb + (size_t)g * N * HD;
    /* Tile j into buffer j % 2 (zeros past N), one commit group. */
    auto load = [&](int j) {
        for (int i = tid; i < BK * HD / 8; i += HK_F2_THREADS) {
            const int row = i / (HD / 8), c = i % (HD / 8) * 8;
            const int key = j * BK + row;
            const size_t off = key < N ? (size_t)key * HD + c : 0;
#pragma unroll
            for (int p = 0; p < NS; p++) {
                const int at = ((j & 1) * NS + p) * KP + row * LD + c;
                const __nv_bfloat16 *src = kg + 2 * p * P + off;
                hk_cp_async16(sK + at, src, key < N ? 16 : 0);
                hk_cp_async16(sV + at, src + P, key < N ? 16 : 0);
            }
        }
        hk_cp_async_commit();
    };

    float O[HD / 8][4], m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
#pragma unroll
    for (int i = 0; i < HD / 8; i++)
        O[i][0] = O[i][1] = O[i][2] = O[i][3] = 0.0f;
    /* ldmatrix row addresses of this lane: A tiles (Q) take rows
     * lane % 8 + 8 (lane / 8 % 2) and columns 8 (lane / 16) of a 16x16
     * tile; B tiles of K (two 8-key n-tiles) keys lane % 8 + 8 (lane / 16)
     * and columns 8 (lane / 8 % 2); V (.trans) keys as A's rows, columns
     * as A's. */
    const int ar = (lane & 7) + ((lane >> 3) & 1) * 8, ac = (lane >> 4) * 8;
    const int br = (lane & 7) + (lane >> 4) * 8, bc = ((lane >> 3) & 1) * 8;
    const __nv_bfloat16 *qa = sQ + (wr + ar) * LD + ac;

    if (j0 < j1)
        load(j0);
    for (int j = j0; j < j1; j++) {
        if (j + 1 < j1) {
            load(j + 1);
            hk_cp_async_wait<1>();
        } else {
            hk_cp_async_wait<0>();
        }
        __syncthreads();
        const int k0 = j * BK;
        if (k0 < wmax) { /* warp-uniform */
            const __nv_bfloat16 *tK = sK + (j & 1) * NS * KP;
            const __nv_bfloat16 *tV = sV + (j & 1) * NS * KP;
            /* keys of the tile some row of the warp sees */
            const int nv = min(BK, wmax - k0);
            float S[BK / 8][4];
#pragma unroll
            for (int i = 0; i < BK / 8; i++)
                S[i][0] = S[i][1] = S[i][2] = S[i][3] = 0.0f;
#pragma unroll 4
            for (int kk = 0; kk < HD; kk += 16) {
                uint32_t a[4], al[4];
                hk_ldmatrix_x4(a, qa + kk);
                if (X)
                    hk_ldmatrix_x4(al, qa + QP + kk);
#pragma unroll
                for (int np = 0; np < BK / 16; np++) {
                    if (np * 16 >= nv)
                        break;
                    const __nv_bfloat16 *kr =
                        tK + (np * 16 + br) * LD + kk + bc;
                    uint32_t b[4], bl[4];
                    hk_ldmatrix_x4(b, kr);
                    if (X)
                        hk_ldmatrix_x4(bl, kr + KP);
                    hk_mma2<X, X>(S[2 * np], S[2 * np + 1], a, al, b, bl);
                }
            }
            /* scale, mask, online softmax on rows h = 0 (g), 1 (g + 8);
             * O *= alpha */
            hk_frag_softmax<BK / 8, HD / 2>(&S[0][0], &O[0][0], k0, lim, lane,
                                            sl2, m, l);
            /* O += P V: P's A fragment of keys 16 kk.. is S's n-tiles
             * 2 kk (columns 0-7) and 2 kk + 1 (8-15). */
#pragma unroll
            for (int kk = 0; kk < BK / 16; kk++) {
                if (kk * 16 >= nv)
                    break;
                uint32_t p[4], pl[4];
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    const float *s = S[2 * kk + i / 2] + 2 * (i & 1);
                    if (X)
                        hk_split_bf16x2(s[0], s[1], &p[i], &pl[i]);
                    else
                        p[i] = hk_pack_bf16x2(s[0], s[1]);
                }
                const __nv_bfloat16 *vr = tV + (kk * 16 + ar) * LD + ac;
#pragma unroll
                for (int dp = 0; dp < HD / 16; dp++) {
                    uint32_t b[4], bl[4];
                    hk_ldmatrix_x4_trans(b, vr + dp * 16);
                    if (X)
                        hk_ldmatrix_x4_trans(bl, vr + KP + dp * 16);
                    hk_mma2<X, X>(O[2 * dp], O[2 * dp + 1], p, pl, b, bl);
                }
            }
        }
        /* every warp is done with buffer j % 2 before tile j + 2 goes in */
        __syncthreads();
    }

    const long long at[2] = {rw.off(wr + lane / 4), rw.off(wr + lane / 4 + 8)};
    if (nsplit == 1)
        hk_frag_rows_out<HD>(o, &O[0][0], l, at, hd, lane);
    else
        hk_frag_rows_part<HD>(part, &O[0][0], m, l, at, hd, lane, nsplit,
                              (int)blockIdx.z);
}

template <int HD, bool X> static size_t hk_f2_smem(void)
{
    return hk_f2<HD, X>::SMEM;
}

template <int HD, bool X> static int hk_f2_per_sm(void)
{
    return hk_f2<HD, X>::BLOCKS;
}

template <int HD, bool X>
static int hk_f2_launch(float *o, const float *q, const int *qpos,
                        const float *k, const float *v, int T, int N, int Hq,
                        int Hkv, int hd, float scale, float *scratch, int vec,
                        cudaStream_t stream)
{
    __nv_bfloat16 *kb = reinterpret_cast<__nv_bfloat16 *>(scratch);
    const size_t P = (size_t)N * Hkv * HD; /* a plane */
    hk_f2_convert<X><<<hk_grid_1d(P / 8, 256), 256, 0, stream>>>(
        kb, k, v, N, Hkv, hd, HD, P, vec);
    int rc = hk_cuda_check_launch();
    if (rc)
        return rc;
    const size_t sm = hk_f2<HD, X>::SMEM;
    const long long nb = ((long long)T * (Hq / Hkv) + HK_F2_M - 1) / HK_F2_M;
    const int ns = hk_att_splits(hk_f2<HD, X>::BLOCKS, HK_F2_M, T, N, Hq, Hkv);
    /* the partials past the planes (2 or 4 of P bf16: P or 2 P floats) */
    float *part = scratch + (X ? 2 : 1) * P;
    cudaFuncSetAttribute(hk_f2_kernel<HD, X>,
                         cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sm);
    const dim3 grid((unsigned)nb, (unsigned)Hkv, (unsigned)ns);
    hk_f2_kernel<HD, X><<<grid, HK_F2_THREADS, sm, stream>>>(
        o, part, q, qpos, kb, P, T, N, Hq, Hkv, hd, scale * 1.4426950408889634f,
        vec, ns);
    rc = hk_cuda_check_launch();
    if (rc || ns == 1)
        return rc;
    return hk_att_combine(o, part, (long long)T * Hq, hd, ns, stream);
}

/* The launcher of (HD, X). */
typedef int (*hk_f2_launch_t)(float *, const float *, const int *,
                              const float *, const float *, int, int, int, int,
                              int, float, float *, int, cudaStream_t);

/* (HD, X)'s kernel: its shared memory, blocks per SM and launcher. */
static const struct {
    size_t (*smem)(void);
    int (*per_sm)(void);
    hk_f2_launch_t launch;
} hk_f2_table[2][3] = {
    {{hk_f2_smem<64, false>, hk_f2_per_sm<64, false>, hk_f2_launch<64, false>},
     {hk_f2_smem<128, false>, hk_f2_per_sm<128, false>,
      hk_f2_launch<128, false>},
     {hk_f2_smem<256, false>, hk_f2_per_sm<256, false>,
      hk_f2_launch<256, false>}},
    {{hk_f2_smem<64, true>, hk_f2_per_sm<64, true>, hk_f2_launch<64, true>},
     {hk_f2_smem<128, true>, hk_f2_per_sm<128, true>, hk_f2_launch<128, true>},
     {hk_f2_smem<256, true>, hk_f2_per_sm<256, true>,
      hk_f2_launch<256, true>}}};

static int hk_f2_index(int HD)
{
    return HD == 64 ? 0 : HD == 128 ? 1 : 2;
}

size_t hk_attention_f2_scratch(int split, int T, int N, int Hq, int Hkv, int hd)
{
    const int HD = hk_att_tc_hd(hd);
    if (!HD)
        return 0;
    /* two bf16 arrays, four with the lo halves; then the splits' partials */
    const int per_sm = hk_f2_table[split != 0][hk_f2_index(HD)].per_sm();
    return (size_t)N * Hkv * HD * (split ? 2 : 1) +
           hk_att_part_floats(per_sm, HK_F2_M, T, N, Hq, Hkv, hd);
}

int hk_attention_f2_splits(int split, int T, int N, int Hq, int Hkv, int hd)
{
    const int HD = hk_att_tc_hd(hd);
    if (!HD)
        return 1;
    const int per_sm = hk_f2_table[split != 0][hk_f2_index(HD)].per_sm();
    return hk_att_splits(per_sm, HK_F2_M, T, N, Hq, Hkv);
}

int hk_attention_f2(int split, float *o, const float *q, const int *qpos,
                    const float *k, const float *v, int T, int N, int Hq,
                    int Hkv, int hd, float scale, float *scratch,
                    cudaStream_t stream)
{
    const int HD = hk_att_tc_hd(hd);
    if (!HD || !scratch || ((uintptr_t)scratch & 15) != 0)
        return HK_CUDA_EINVAL;
    const int x = split != 0, i = hk_f2_index(HD);
    if (hk_f2_table[x][i].smem() > (size_t)hk_cuda_smem_optin())
        return HK_CUDA_EINVAL;
    const long long nb = ((long long)T * (Hq / Hkv) + HK_F2_M - 1) / HK_F2_M;
    if (nb > 2147483647LL || Hkv > HK_CUDA_MAX_GRID_YZ)
        return HK_CUDA_EINVAL;
    if (T == 0)
        return HK_CUDA_OK;
    const int vec = hd % 4 == 0 && ((uintptr_t)q & 15) == 0 &&
                    ((uintptr_t)k & 15) == 0 && ((uintptr_t)v & 15) == 0;
    return hk_f2_table[x][i].launch(o, q, qpos, k, v, T, N, Hq, Hkv, hd, scale,
                                    scratch, vec, stream);
}
