/*
 * hk_attention_tc.cu - causal GQA attention prefill on tensor cores
 * (hk_cuda_attention's FLASH and FLASH_BF16 kernels; the math and the
 * CPU twin are hk_attention.c's):
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

#include "kernels/cuda/hk_cuda_impl.h"

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
    const int r = Hq / Hkv, g = blockIdx.y;
    const long long rows = (long long)T * r;
    const long long R0 = (long long)(gridDim.x - 1 - blockIdx.x) * HK_FA_M;
    const size_t ldkv = (size_t)Hkv * hd;
    /* Row rr of the block in q and o (NULL past the last row). */
    auto qrow = [&](int rr) -> const float * {
        const long long R = R0 + rr;
        if (R >= rows)
            return nullptr;
        return q + ((size_t)(R / r) * Hq + (size_t)g * r + R % r) * hd;
    };

    if (tid < HK_FA_M) {
        const long long R = R0 + tid;
        s.lim[tid] = R < rows ? qpos[R / r] + 1 : 0;
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
