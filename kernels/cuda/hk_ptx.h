/*
 * hk_ptx.h - the inline PTX the register-fragment kernels use, in one
 * place (hk_attention_tc.cu's FLASH2): the bf16 tensor-core product
 * m16n8k16, ldmatrix (x4, plain and .trans) and cp.async (16 bytes, with
 * zero fill) with its commit / wait. Under the host emulator (emu/,
 * which cannot compile inline PTX) emu/ptx.h implements the same calls as
 * warp collectives with the PTX ISA's per-lane fragment layouts, so a
 * kernel that puts an element in the wrong lane or register fails there.
 *
 * Fragment layouts (PTX ISA, "Matrix Fragments for mma.m16n8k16 with
 * floating point type" and "Warp-level matrix load instruction: ldmatrix";
 * lane l, group g = l / 4, thread-in-group t = l % 4; a 32-bit register
 * holds two bf16, the lower column / row index in its low half):
 *   A (16 x 16, row-major) a[0]: (g, 2t..2t+1), a[1]: (g + 8, 2t..),
 *                          a[2]: (g, 2t+8..), a[3]: (g + 8, 2t+8..)
 *   B (16 x 8, k x n)      b[0]: (k = 2t..2t+1, n = g), b[1]: (k = 2t+8.., g)
 *   C, D (16 x 8, f32)     c[0], c[1]: (g, 2t), (g, 2t+1);
 *                          c[2], c[3]: (g + 8, 2t), (g + 8, 2t+1)
 *   ldmatrix .x4           lanes 8i..8i+7 give the row addresses (16 bytes
 *                          each, 16-byte aligned) of 8x8 matrix i; r[i] of
 *                          lane l: row g, columns 2t, 2t+1 of matrix i;
 *                          with .trans: rows 2t, 2t+1 of column g.
 * bar.sync / bar.arrive on a named barrier (hk_bar_sync, hk_bar_arrive):
 * the barrier completes when n threads have arrived, those that sync wait
 * for it, those that arrive go on (FLASH3_WS's producer / consumer
 * signals).
 * cp.async.cg 16 bytes: src_bytes (0 or 16) are read, the rest of the 16
 * zero-filled (cp.async.ca 4 bytes, hk_cp_async4, for 4-byte aligned
 * sources); completes by the cp.async.wait_group that leaves fewer
 * groups pending than its own, then needs a barrier before other threads
 * read it.
 * hk_split_bf16x2 (both builds): two floats as bf16 hi + lo pairs, the
 * split of kernels/common/hk_bf16.h; hk_mma2 (both builds): a 16-deep
 * step of two n-tiles on optionally split operands; hk_frag_rows_out and
 * _part (both builds): the attention prefills' o = O / l from C fragments,
 * or a split's partial softmax;
 * hk_frag_softmax: their online softmax step on C fragments.
 */
#ifndef HK_PTX_H
#define HK_PTX_H

#include <cuda_bf16.h>
#include <stdint.h>

#include "kernels/common/hk_bf16.h"

#ifdef HK_EMU_CUDA_RUNTIME_H
#include <ptx.h> /* emu/ptx.h */
#else

/* d = a b + c (d may be c). */
static __device__ __forceinline__ void hk_mma_bf16_16816(float d[4],
                                                         const uint32_t a[4],
                                                         const uint32_t b[2],
                                                         const float c[4])
{
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
                 "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%10,%11,%12,%13};\n"
                 : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]),
                   "r"(b[1]), "f"(c[0]), "f"(c[1]), "f"(c[2]), "f"(c[3]));
}

/* Four 8x8 b16 matrices from shared memory (p: this lane's row): name
 * runs the ldmatrix variant op. */
#define HK_LDMATRIX_X4(name, op)                                               \
    static __device__ __forceinline__ void name(uint32_t r[4], const void *p)  \
    {                                                                          \
        const unsigned s = (unsigned)__cvta_generic_to_shared(p);              \
        asm volatile(op " {%0,%1,%2,%3}, [%4];\n"                              \
                     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])          \
                     : "r"(s));                                                \
    }
HK_LDMATRIX_X4(hk_ldmatrix_x4, "ldmatrix.sync.aligned.m8n8.x4.shared.b16")
/* The same, each matrix transposed. */
HK_LDMATRIX_X4(hk_ldmatrix_x4_trans,
               "ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16")

/* 16 bytes global -> shared, src_bytes of them read (0 or 16). */
static __device__ __forceinline__ void hk_cp_async16(void *dst, const void *src,
                                                     int src_bytes)
{
    const unsigned s = (unsigned)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s),
                 "l"(src), "r"(src_bytes)
                 : "memory");
}

/* 4 bytes global -> shared (cp.async.ca: 4-byte aligned sides only). */
static __device__ __forceinline__ void hk_cp_async4(void *dst, const void *src)
{
    const unsigned s = (unsigned)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(s), "l"(src)
                 : "memory");
}

static __device__ __forceinline__ void hk_cp_async_commit(void)
{
    asm volatile("cp.async.commit_group;\n" ::: "memory");
}

/* Waits until at most N committed groups are pending. */
template <int N> static __device__ __forceinline__ void hk_cp_async_wait(void)
{
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

/* Named barrier id (1..15; 0 is __syncthreads') of n threads (a multiple
 * of 32, whole warps calling): the caller waits until n have arrived. */
static __device__ __forceinline__ void hk_bar_sync(int id, int n)
{
    asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(n) : "memory");
}

/* The same barrier's arrival without waiting: the caller's earlier memory
 * accesses are ordered before those of the threads its completion
 * releases (a producer's signal to hk_bar_sync consumers). */
static __device__ __forceinline__ void hk_bar_arrive(int id, int n)
{
    asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(n) : "memory");
}

/* Two floats as bf16 (round to nearest even), x in the low half. */
static __device__ __forceinline__ uint32_t hk_pack_bf16x2(float x, float y)
{
    const __nv_bfloat162 h = __floats2bfloat162_rn(x, y);
    return *reinterpret_cast<const uint32_t *>(&h);
}

#endif /* HK_EMU_CUDA_RUNTIME_H */

/* One 16-deep step of two 8-column n-tiles: d0 += A B (B's n-tiles in
 * b[0..1], b[2..3]), d1 likewise, where A = a + al (AL) and B = b + bl
 * (BL) are split operands: a b + a bl + al b, the small terms first (al,
 * bl unread without their flag). */
template <bool AL, bool BL>
static __device__ __forceinline__ void
hk_mma2(float d0[4], float d1[4], const uint32_t a[4], const uint32_t al[4],
        const uint32_t b[4], const uint32_t bl[4])
{
    if (AL) {
        hk_mma_bf16_16816(d0, al, b, d0);
        hk_mma_bf16_16816(d1, al, b + 2, d1);
    }
    if (BL) {
        hk_mma_bf16_16816(d0, a, bl, d0);
        hk_mma_bf16_16816(d1, a, bl + 2, d1);
    }
    hk_mma_bf16_16816(d0, a, b, d0);
    hk_mma_bf16_16816(d1, a, b + 2, d1);
}

/* The attention prefills' online softmax step on register fragments
 * (FLASH2, FLASH3), for a tile of NT 8-key n-tiles of scores S (C
 * fragments side by side: S[4 i + 2 h + e] is key k0 + 8 i + 2 (lane % 4)
 * + e of the lane's row h = 0 (row g of its warp's 16) or 1 (g + 8)):
 * scaled by sl2 (scale log2 e), keys from lim[h] on masked, the row maxima
 * m over the row's 4 lanes, S <- 2^{S - m} (the probabilities, f32), the
 * sums l and the NO accumulators O (the same layout) rescaled by
 * 2^{m_old - m}. A row with no key yet keeps p = 0 and nothing to
 * rescale. */
template <int NT, int NO>
static __device__ __forceinline__ void
hk_frag_softmax(float *S, float *O, int k0, const int lim[2], int lane,
                float sl2, float m[2], float l[2])
{
    const bool full = k0 + 8 * NT <= min(lim[0], lim[1]);
    float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int i = 0; i < NT; i++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const int key = k0 + 8 * i + 2 * (lane & 3) + (e & 1);
            const float x =
                full || key < lim[e >> 1] ? S[4 * i + e] * sl2 : -INFINITY;
            S[4 * i + e] = x;
            mx[e >> 1] = fmaxf(mx[e >> 1], x);
        }
    float msub[2], alpha[2], rs[2] = {0.0f, 0.0f};
#pragma unroll
    for (int h = 0; h < 2; h++) {
        mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 1));
        mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 2));
        const float mn = fmaxf(m[h], mx[h]);
        msub[h] = mn == -INFINITY ? 0.0f : mn;
        alpha[h] = exp2f(m[h] - msub[h]);
        m[h] = mn;
    }
#pragma unroll
    for (int i = 0; i < 4 * NT; i++) {
        S[i] = exp2f(S[i] - msub[(i >> 1) & 1]);
        rs[(i >> 1) & 1] += S[i];
    }
#pragma unroll
    for (int h = 0; h < 2; h++)
        l[h] = l[h] * alpha[h] + rs[h];
#pragma unroll
    for (int i = 0; i < NO; i++)
        O[i] *= alpha[(i >> 1) & 1];
}

/* The lane's two rows' O (C fragments of 8 columns side by side:
 * O[4 i + 2 h + e] is column 8 i + 2 (lane % 4) + e of row h) times f[h]
 * into dst[h] (NULL: no row); columns from hd on are dropped. */
template <int HD>
static __device__ __forceinline__ void
hk_frag_rows_put(float *const dst[2], const float *O, const float f[2], int hd,
                 int lane)
{
#pragma unroll
    for (int h = 0; h < 2; h++) {
        if (!dst[h])
            continue;
#pragma unroll
        for (int i = 0; i < HD / 8; i++)
#pragma unroll
            for (int e = 0; e < 2; e++) {
                const int d = 8 * i + 2 * (lane & 3) + e;
                if (d < hd)
                    dst[h][d] = O[4 * i + 2 * h + e] * f[h];
            }
    }
}

/* l summed over each of the lane's two rows' 4 lanes. */
static __device__ __forceinline__ void hk_frag_row_sums(float l[2])
{
#pragma unroll
    for (int h = 0; h < 2; h++) {
        l[h] += __shfl_xor_sync(0xffffffffu, l[h], 1);
        l[h] += __shfl_xor_sync(0xffffffffu, l[h], 2);
    }
}

/* The attention prefills' end on register fragments (FLASH2, FLASH3):
 * o = O / l on the lane's two rows h = 0 (row g of its warp's 16) and 1
 * (g + 8); at[h]: the row's offset in o, -1 for no row. */
template <int HD>
static __device__ __forceinline__ void
hk_frag_rows_out(float *o, const float *O, float l[2], const long long at[2],
                 int hd, int lane)
{
    hk_frag_row_sums(l);
    float *const dst[2] = {at[0] < 0 ? NULL : o + at[0],
                           at[1] < 0 ? NULL : o + at[1]};
    const float f[2] = {1.0f / l[0], 1.0f / l[1]};
    hk_frag_rows_put<HD>(dst, O, f, hd, lane);
}

/* The same end for split s of nsplit over the keys (split-KV): each row's
 * partial softmax (m, l, unnormalized O) to part[(row nsplit + s) (2 +
 * hd)..] (row = at / hd, the (query, head) row of o), m from the log2
 * units hk_frag_softmax keeps to natural ones (m ln 2); hk_att_combine
 * (hk_cuda_impl.h) makes o of the splits. A row this split saw no key of
 * writes m = -inf, l = 0, O = 0. */
template <int HD>
static __device__ __forceinline__ void
hk_frag_rows_part(float *part, const float *O, const float m[2], float l[2],
                  const long long at[2], int hd, int lane, int nsplit, int s)
{
    hk_frag_row_sums(l);
    float *dst[2];
#pragma unroll
    for (int h = 0; h < 2; h++) {
        dst[h] = at[h] < 0 ? NULL
                           : part + ((size_t)(at[h] / hd) * nsplit + s) *
                                        (size_t)(2 + hd);
        if (dst[h] && (lane & 3) == 0)
            dst[h][0] = m[h] * 0.69314718055994531f, dst[h][1] = l[h];
        if (dst[h])
            dst[h] += 2;
    }
    const float f[2] = {1.0f, 1.0f};
    hk_frag_rows_put<HD>(dst, O, f, hd, lane);
}

/* x, y -> hi = their bf16 pair (hk_pack_bf16x2), lo = the pair of the
 * rounded remainders x - hi.x, y - hi.y (hk_bf16_split's lo): hi + lo
 * keeps ~16 significant bits. */
static __device__ __forceinline__ void
hk_split_bf16x2(float x, float y, uint32_t *hi, uint32_t *lo)
{
    const uint32_t h = hk_pack_bf16x2(x, y);
    *hi = h;
    *lo = hk_pack_bf16x2(x - hk_bf16_to_f32((uint16_t)(h & 0xffffu)),
                         y - hk_bf16_to_f32((uint16_t)(h >> 16)));
}

#endif
