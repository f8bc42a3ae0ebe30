/*
 * hk_attention.cu - CUDA twin of hk_attention.c: causal grouped-query
 * attention by position, for a prompt over its cache (prefill, PIC splice
 * runs) and for one decode token of each of B requests over their own
 * caches or over pages of K/V; the choice of kernels
 * (hk_cuda_att_impl_t).
 *
 *   o[t, h] = sum_{j < nkeys} softmax_j(scale * q[t, h] . k[j, g]) v[j, g]
 *   g = h / (Hq / Hkv);  nkeys = qpos[t] + 1 (prefill), n_ctx[b] (decode)
 *
 * FLASH, FLASH_BF16 and FLASH2 prefill: hk_attention_tc.cu (tensor cores).
 *
 * FLASH decode (flash-decoding): grid (split, kv group, request), 4 warps.
 * A block takes a contiguous range of its request's keys (n_ctx / splits,
 * rounded up to 16) and all r query heads of its group, so each K/V row is
 * read once for the r heads. Its warps take 4 keys at a time (16 keys a
 * block step, rows read as float4 over the lanes: lane l holds dims 4l..
 * 4l+3 and 128 + 4l..); per key the r scores are warp sums, then an online
 * softmax per head in registers (m, l, hd/32 output dims per lane). The
 * warps' partial softmaxes combine through shared memory; with one split
 * that is o, else a partial (m, l, unnormalized o) per (request, head,
 * split) to scratch, and a second launch combines the splits. Splits:
 * enough blocks for ~4 per SM, at most HK_DEC_MAX_SPLIT; 1 without
 * scratch. r <= 16, hd <= 256 (else SIMPLE).
 *
 * Paged KV (hk_cuda_attention_decode_paged): the same kernels, templated
 * on where request b's key j lives (hk_cuda_impl.h: hk_kv_own, one cache
 * per request; hk_kv_paged, a block table into page arenas). A FLASH warp
 * looks its run of 4 keys' page up once (pages are >= 4 positions, runs
 * start at multiples of 4); SIMPLE once per key.
 *
 * SIMPLE: one block of 4 warps per (query, head), an online softmax over
 * tiles of 64 keys: each warp takes a key of the tile at a time and forms
 * its score as a warp-reduced dot product (lanes over hd, so the key row
 * is read coalesced); the scores' maximum, then e^{s - m'} per key go
 * through shared memory; each thread owns hd/128 output dims and rescales
 * and adds p_j v[j, d] (the value rows read coalesced across threads). K
 * and V are read once per query head, no tensor cores: the first kernels,
 * kept for hd > 256 and to compare against.
 */
#include <stdlib.h>
#include <string.h>

#include "kernels/cuda/hk_cuda_impl.h"

#define HK_ATT_THREADS 128
#define HK_ATT_WARPS   (HK_ATT_THREADS / 32)
#define HK_ATT_KT      64
/* Output dims per thread. */
#define HK_ATT_DPT (HK_CUDA_ATT_MAX_HD / HK_ATT_THREADS)

/* One query row against nkeys keys of request b. k, v point at the
 * query's kv group in b's row 0 (kv.k(b) + g * hd); key j's row is
 * kv.row(b, j), rows ldkv apart. qs [hd], ss, ps [HK_ATT_KT]: shared
 * memory. */
template <class KV>
static __device__ void hk_att_row(float *o, const float *q, const KV &kv, int b,
                                  const float *k, const float *v, size_t ldkv,
                                  int nkeys, int hd, float scale, float *qs,
                                  float *ss, float *ps)
{
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    for (int d = tid; d < hd; d += HK_ATT_THREADS)
        qs[d] = q[d];
    __syncthreads();
    float acc[HK_ATT_DPT];
    for (int i = 0; i < HK_ATT_DPT; i++)
        acc[i] = 0.0f;
    float m = -INFINITY, l = 0.0f;
    for (int j0 = 0; j0 < nkeys; j0 += HK_ATT_KT) {
        const int nk = min(HK_ATT_KT, nkeys - j0);
        for (int jj = warp; jj < nk; jj += HK_ATT_WARPS) {
            const float *kr = k + kv.row(b, j0 + jj) * ldkv;
            float s = 0.0f;
            for (int d = lane; d < hd; d += 32)
                s += qs[d] * kr[d];
            s = hk_warp_sum(s);
            if (lane == 0)
                ss[jj] = s * scale;
        }
        __syncthreads();
        /* Every thread finds the same maximum (same values, same order). */
        float mt = m;
        for (int jj = 0; jj < nk; jj++)
            mt = fmaxf(mt, ss[jj]);
        for (int jj = tid; jj < nk; jj += HK_ATT_THREADS)
            ps[jj] = expf(ss[jj] - mt);
        __syncthreads();
        /* m = -inf before the first tile: alpha = 0 and acc is 0 anyway. */
        const float alpha = expf(m - mt);
        float sum = 0.0f;
        for (int jj = 0; jj < nk; jj++)
            sum += ps[jj];
        l = l * alpha + sum;
        for (int i = 0; i < HK_ATT_DPT; i++) {
            const int d = tid + i * HK_ATT_THREADS;
            if (d >= hd)
                break;
            float a = acc[i] * alpha;
            for (int jj = 0; jj < nk; jj++)
                a += ps[jj] * v[kv.row(b, j0 + jj) * ldkv + d];
            acc[i] = a;
        }
        m = mt;
        /* The next tile writes ss only after this one's second barrier,
         * and ps after its own first one: no third barrier needed. */
    }
    const float inv = l > 0.0f ? 1.0f / l : 0.0f;
    for (int i = 0; i < HK_ATT_DPT; i++) {
        const int d = tid + i * HK_ATT_THREADS;
        if (d < hd)
            o[d] = acc[i] * inv;
    }
}

/* Block x = t * Hq + h (the grid's x takes any T * Hq). */
static __global__ void hk_attention_kernel(float *o,        // [T, Hq, hd]
                                           const float *q,  // [T, Hq, hd]
                                           const int *qpos, // [T]
                                           const float *k,  // [N, Hkv, hd]
                                           const float *v,  // [N, Hkv, hd]
                                           int Hq, int Hkv, int hd, float scale)
{
    __shared__ float qs[HK_CUDA_ATT_MAX_HD], ss[HK_ATT_KT], ps[HK_ATT_KT];
    const int t = blockIdx.x / Hq, h = blockIdx.x % Hq;
    const size_t g = (size_t)(h / (Hq / Hkv)) * hd;
    const size_t off = (size_t)blockIdx.x * hd;
    const hk_kv_flat<const float> kv = {k, v};
    hk_att_row(o + off, q + off, kv, t, k + g, v + g, (size_t)Hkv * hd,
               qpos[t] + 1, hd, scale, qs, ss, ps);
}

/* Block x = b * Hq + h; kv: request b's K/V (own caches or pages). */
template <class KV>
static __global__ void hk_attention_decode_kernel(float *o,       // [B, Hq, hd]
                                                  const float *q, // [B, Hq, hd]
                                                  KV kv,
                                                  const int *n_ctx, // [B]
                                                  int Hq, int Hkv, int hd,
                                                  float scale)
{
    __shared__ float qs[HK_CUDA_ATT_MAX_HD], ss[HK_ATT_KT], ps[HK_ATT_KT];
    const int b = blockIdx.x / Hq, h = blockIdx.x % Hq;
    const size_t g = (size_t)(h / (Hq / Hkv)) * hd;
    const size_t off = (size_t)blockIdx.x * hd;
    hk_att_row(o + off, q + off, kv, b, kv.k(b) + g, kv.v(b) + g,
               (size_t)Hkv * hd, n_ctx[b], hd, scale, qs, ss, ps);
}

/* ---- FLASH decode ------------------------------------------------------- */

#define HK_DEC_THREADS   128
#define HK_DEC_WARPS     (HK_DEC_THREADS / 32)
#define HK_DEC_KW        4 /* keys per warp step */
#define HK_DEC_MAX_SPLIT 64
#define HK_DEC_MAX_R     16
#define HK_DEC_MAX_HD    256

/* Four floats of a row at dim d (0 past hd): one float4 when vec. */
static __device__ __forceinline__ float4 hk_dec_ld4(const float *p, int d,
                                                    int hd, int vec)
{
    if (vec && d < hd)
        return *reinterpret_cast<const float4 *>(p + d);
    float x[4];
    for (int u = 0; u < 4; u++)
        x[u] = d + u < hd ? p[d + u] : 0.0f;
    return make_float4(x[0], x[1], x[2], x[3]);
}

static __device__ __forceinline__ float hk_dot4(float4 a, float4 b)
{
    return a.x * b.x + a.y * b.y + a.z * b.z + a.w * b.w;
}

/* Grid (splits, Hkv, B); R >= r = Hq / Hkv, a power of two; kv: where
 * request b's keys are (own caches or pages; a warp's HK_DEC_KW keys from
 * a multiple of HK_DEC_KW are consecutive rows in both). Shared: q
 * [r, hd], the warps' partial o [WARPS, r, hd], m and l [WARPS, r]. */
template <int R, class KV>
static __global__ void __launch_bounds__(HK_DEC_THREADS)
    hk_dec_kernel(float *o,       // [B, Hq, hd]
                  float *part,    // [B, Hq, nsplit, 2 + hd] (nsplit > 1)
                  const float *q, // [B, Hq, hd]
                  KV kv, const int *n_ctx, int Hq, int Hkv, int hd, float scale,
                  int nsplit)
{
    HK_DYNAMIC_SMEM(smem);
    const int r = Hq / Hkv;
    float *qs = (float *)smem;
    float *wo = qs + r * hd;
    float *wm = wo + HK_DEC_WARPS * r * hd, *wl = wm + HK_DEC_WARPS * r;
    const int sp = blockIdx.x, g = blockIdx.y, b = blockIdx.z;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int n = n_ctx[b];
    const int per = ((n + nsplit - 1) / nsplit + 15) / 16 * 16;
    const int k0 = sp * per, k1 = min(n, k0 + per);
    const size_t ldkv = (size_t)Hkv * hd;
    const float *kc = kv.k(b) + (size_t)g * hd;
    const float *vc = kv.v(b) + (size_t)g * hd;
    const int vec = hd % 4 == 0 && (((uintptr_t)kc | (uintptr_t)vc) & 15) == 0;
    const float *qb = q + ((size_t)b * Hq + (size_t)g * r) * hd;
    for (int i = tid; i < r * hd; i += HK_DEC_THREADS)
        qs[i] = qb[i];
    __syncthreads();

    float m[R], l[R];
    float4 acc[R][2];
#pragma unroll
    for (int h = 0; h < R; h++) {
        m[h] = -INFINITY, l[h] = 0.0f;
        acc[h][0] = acc[h][1] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
    for (int j0 = k0 + HK_DEC_KW * warp; j0 < k1;
         j0 += HK_DEC_KW * HK_DEC_WARPS) {
        float4 kr[HK_DEC_KW][2], vr[HK_DEC_KW][2];
        /* j0 < k1 <= n: its row (a page lookup) exists */
        const size_t at0 = kv.row(b, j0) * ldkv;
#pragma unroll
        for (int u = 0; u < HK_DEC_KW; u++)
#pragma unroll
            for (int i = 0; i < 2; i++) {
                const int d = 4 * lane + 128 * i;
                const size_t at = at0 + (size_t)u * ldkv;
                const bool ok = j0 + u < k1 && d < hd;
                kr[u][i] = ok ? hk_dec_ld4(kc + at, d, hd, vec)
                              : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
                vr[u][i] = ok ? hk_dec_ld4(vc + at, d, hd, vec)
                              : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            }
#pragma unroll
        for (int h = 0; h < R; h++) {
            if (h >= r)
                break;
            float4 qv[2];
#pragma unroll
            for (int i = 0; i < 2; i++)
                qv[i] = hk_dec_ld4(qs + h * hd, 4 * lane + 128 * i, hd,
                                   hd % 4 == 0);
            float sc[HK_DEC_KW], mx = m[h];
#pragma unroll
            for (int u = 0; u < HK_DEC_KW; u++) {
                sc[u] = hk_warp_sum(hk_dot4(kr[u][0], qv[0]) +
                                    hk_dot4(kr[u][1], qv[1])) *
                        scale;
                if (j0 + u < k1)
                    mx = fmaxf(mx, sc[u]);
            }
            /* m = -inf before the first key: alpha = 0, acc is 0. */
            const float alpha = expf(m[h] - mx);
            float4 a0 = acc[h][0], a1 = acc[h][1];
            a0.x *= alpha, a0.y *= alpha, a0.z *= alpha, a0.w *= alpha;
            a1.x *= alpha, a1.y *= alpha, a1.z *= alpha, a1.w *= alpha;
            float sum = 0.0f;
#pragma unroll
            for (int u = 0; u < HK_DEC_KW; u++) {
                const float p = j0 + u < k1 ? expf(sc[u] - mx) : 0.0f;
                sum += p;
                a0.x += p * vr[u][0].x, a0.y += p * vr[u][0].y;
                a0.z += p * vr[u][0].z, a0.w += p * vr[u][0].w;
                a1.x += p * vr[u][1].x, a1.y += p * vr[u][1].y;
                a1.z += p * vr[u][1].z, a1.w += p * vr[u][1].w;
            }
            acc[h][0] = a0, acc[h][1] = a1;
            l[h] = l[h] * alpha + sum;
            m[h] = mx;
        }
    }

    /* The warps' partials, then their combination per (head, dim). */
#pragma unroll
    for (int h = 0; h < R; h++) {
        if (h >= r)
            break;
        float *dst = wo + ((size_t)warp * r + h) * hd;
#pragma unroll
        for (int i = 0; i < 2; i++) {
            const int d = 4 * lane + 128 * i;
            const float x[4] = {acc[h][i].x, acc[h][i].y, acc[h][i].z,
                                acc[h][i].w};
            for (int u = 0; u < 4; u++)
                if (d + u < hd)
                    dst[d + u] = x[u];
        }
        if (lane == 0) {
            wm[warp * r + h] = m[h];
            wl[warp * r + h] = l[h];
        }
    }
    __syncthreads();
    for (int i = tid; i < r * hd; i += HK_DEC_THREADS) {
        const int h = i / hd, d = i % hd;
        float M = -INFINITY;
        for (int w = 0; w < HK_DEC_WARPS; w++)
            M = fmaxf(M, wm[w * r + h]);
        float L = 0.0f, A = 0.0f;
        if (M != -INFINITY)
            for (int w = 0; w < HK_DEC_WARPS; w++) {
                const float e = expf(wm[w * r + h] - M);
                L += wl[w * r + h] * e;
                A += wo[((size_t)w * r + h) * hd + d] * e;
            }
        const size_t row = (size_t)b * Hq + (size_t)g * r + h;
        if (nsplit == 1) {
            o[row * hd + d] = L > 0.0f ? A / L : 0.0f;
        } else {
            float *pp = part + (row * nsplit + sp) * (size_t)(2 + hd);
            pp[2 + d] = A;
            if (d == 0)
                pp[0] = M, pp[1] = L;
        }
    }
}

/* o = the splits' partials combined; one block per row (a request's or
 * a query's head). */
static __global__ void hk_att_combine_kernel(float *o, const float *part,
                                             int hd, int nsplit)
{
    const float *pr = part + (size_t)blockIdx.x * nsplit * (2 + hd);
    float M = -INFINITY, L = 0.0f;
    for (int s = 0; s < nsplit; s++)
        M = fmaxf(M, pr[(size_t)s * (2 + hd)]);
    if (M != -INFINITY)
        for (int s = 0; s < nsplit; s++)
            L += pr[(size_t)s * (2 + hd) + 1] *
                 expf(pr[(size_t)s * (2 + hd)] - M);
    for (int d = threadIdx.x; d < hd; d += blockDim.x) {
        float A = 0.0f;
        if (M != -INFINITY)
            for (int s = 0; s < nsplit; s++) {
                const float *ps = pr + (size_t)s * (2 + hd);
                A += ps[2 + d] * expf(ps[0] - M);
            }
        o[(size_t)blockIdx.x * hd + d] = L > 0.0f ? A / L : 0.0f;
    }
}

int hk_att_combine(float *o, const float *part, long long rows, int hd,
                   int nsplit, cudaStream_t stream)
{
    if (rows < 1)
        return HK_CUDA_OK;
    if (rows > 2147483647LL)
        return HK_CUDA_EINVAL;
    hk_att_combine_kernel<<<(unsigned)rows, HK_DEC_THREADS, 0, stream>>>(
        o, part, hd, nsplit);
    return hk_cuda_check_launch();
}

/* Splits of the key axis for B requests: ~4 blocks per SM. */
static int hk_dec_splits(int B, int Hkv)
{
    const int sms = hk_cuda_sm_count(1);
    const long long groups = (long long)B * Hkv;
    const long long want = (4LL * sms + groups - 1) / groups;
    return (int)(want < 1                  ? 1
                 : want > HK_DEC_MAX_SPLIT ? HK_DEC_MAX_SPLIT
                                           : want);
}

static int hk_dec_ok(int Hq, int Hkv, int hd)
{
    return Hq / Hkv <= HK_DEC_MAX_R && hd <= HK_DEC_MAX_HD;
}

template <class KV>
static int hk_dec_launch(float *o, float *part, const float *q, KV kv,
                         const int *n_ctx, int B, int Hq, int Hkv, int hd,
                         float scale, int nsplit, cudaStream_t st)
{
    const int r = Hq / Hkv;
    const size_t sm =
        ((size_t)(1 + HK_DEC_WARPS) * r * hd + 2 * HK_DEC_WARPS * r) *
        sizeof(float);
    const dim3 grid((unsigned)nsplit, (unsigned)Hkv, (unsigned)B);
#define HK_DEC_CASE(RR)                                                        \
    case RR:                                                                   \
        cudaFuncSetAttribute(hk_dec_kernel<RR, KV>,                            \
                             cudaFuncAttributeMaxDynamicSharedMemorySize,      \
                             (int)sm);                                         \
        hk_dec_kernel<RR, KV><<<grid, HK_DEC_THREADS, sm, st>>>(               \
            o, part, q, kv, n_ctx, Hq, Hkv, hd, scale, nsplit);                \
        break
    switch (r <= 1 ? 1 : r <= 2 ? 2 : r <= 4 ? 4 : r <= 8 ? 8 : 16) {
        HK_DEC_CASE(1);
        HK_DEC_CASE(2);
        HK_DEC_CASE(4);
        HK_DEC_CASE(8);
        HK_DEC_CASE(16);
    }
#undef HK_DEC_CASE
    int rc = hk_cuda_check_launch();
    if (rc || nsplit == 1)
        return rc;
    return hk_att_combine(o, part, (long long)B * Hq, hd, nsplit, st);
}

/* ---- the interface ---------------------------------------------------------
 */

static int hk_att_args_ok(int rows, int Hq, int Hkv, int hd)
{
    return rows >= 0 && Hkv > 0 && Hq >= Hkv && Hq % Hkv == 0 && hd > 0 &&
           hd <= HK_CUDA_ATT_MAX_HD && (long long)rows * Hq <= 2147483647LL;
}

/* A default falls back where its kernel cannot run; a named kernel
 * reports HK_CUDA_EINVAL there. */
static bool hk_att_named(hk_cuda_att_impl_t impl)
{
    return impl != HK_CUDA_ATT_DEFAULT && impl != HK_CUDA_ATT_DEFAULT_BF16;
}

/* DEFAULT and DEFAULT_BF16: HYPIC_CUDA_ATT (read once, a thread-safe local
 * static), else FLASH2X and FLASH2. */
static hk_cuda_att_impl_t hk_att_resolve(hk_cuda_att_impl_t impl)
{
    static const char *const names[] = {"simple",     "flash",    "flash_bf16",
                                        "flash2",     "flash2x",  "flash3",
                                        "flash3_seq", "flash3_ws"};
    static const int values[] = {HK_CUDA_ATT_SIMPLE,     HK_CUDA_ATT_FLASH,
                                 HK_CUDA_ATT_FLASH_BF16, HK_CUDA_ATT_FLASH2,
                                 HK_CUDA_ATT_FLASH2X,    HK_CUDA_ATT_FLASH3,
                                 HK_CUDA_ATT_FLASH3_SEQ, HK_CUDA_ATT_FLASH3_WS};
    static const hk_cuda_att_impl_t env = (hk_cuda_att_impl_t)hk_env_choice(
        "HYPIC_CUDA_ATT", names, values, 8, HK_CUDA_ATT_DEFAULT);
    if (hk_att_named(impl))
        return impl;
    if (env != HK_CUDA_ATT_DEFAULT)
        return env;
    if (impl == HK_CUDA_ATT_DEFAULT)
        return HK_CUDA_ATT_FLASH2X;
    /* bf16 operands: wgmma where the device has it (2.1-2.3x FLASH2 on an
     * H200; the overlapped FLASH3 measured 3-4 % slower than SEQ) */
    return hk_cuda_cc() == 90 ? HK_CUDA_ATT_FLASH3_SEQ : HK_CUDA_ATT_FLASH2;
}

extern "C" hk_cuda_att_impl_t hk_cuda_attention_kernel(hk_cuda_att_impl_t impl)
{
    return hk_att_resolve(impl);
}

/* The FLASH3 kind (hk_cuda_impl.h) of impl; -1 for another kernel. */
static int hk_att_f3_kind(hk_cuda_att_impl_t impl)
{
    return impl == HK_CUDA_ATT_FLASH3       ? HK_F3_OV
           : impl == HK_CUDA_ATT_FLASH3_SEQ ? HK_F3_SEQ
           : impl == HK_CUDA_ATT_FLASH3_WS  ? HK_F3_WS
                                            : -1;
}

static bool hk_att_impl_ok(hk_cuda_att_impl_t impl)
{
    return impl >= HK_CUDA_ATT_DEFAULT && impl <= HK_CUDA_ATT_FLASH3_WS;
}

extern "C" size_t hk_cuda_attention_scratch(hk_cuda_att_impl_t impl, int T,
                                            int N, int Hq, int Hkv, int hd)
{
    const hk_cuda_att_impl_t use = hk_att_resolve(impl);
    if (T <= 0 || N <= 0 || !hk_att_args_ok(T, Hq, Hkv, hd))
        return 0;
    if (hk_att_f3_kind(use) >= 0) {
        /* and FLASH2's, its fallback */
        const size_t f3 = hk_attention_f3_scratch(T, N, Hq, Hkv, hd);
        const size_t f2 = hk_attention_f2_scratch(0, T, N, Hq, Hkv, hd);
        return f3 > f2 ? f3 : f2;
    }
    if (use != HK_CUDA_ATT_FLASH2 && use != HK_CUDA_ATT_FLASH2X)
        return 0;
    return hk_attention_f2_scratch(use == HK_CUDA_ATT_FLASH2X, T, N, Hq, Hkv,
                                   hd);
}

extern "C" int hk_cuda_attention_splits(hk_cuda_att_impl_t impl, int T, int N,
                                        int Hq, int Hkv, int hd)
{
    const hk_cuda_att_impl_t use = hk_att_resolve(impl);
    if (T <= 0 || N <= 0 || !hk_att_args_ok(T, Hq, Hkv, hd))
        return 1;
    if (hk_att_f3_kind(use) >= 0)
        /* FLASH3 runs FLASH2 off a compute capability 9.0 device */
        return hk_cuda_cc() == 90
                   ? hk_attention_f3_splits(T, N, Hq, Hkv, hd)
                   : hk_attention_f2_splits(0, T, N, Hq, Hkv, hd);
    if (use != HK_CUDA_ATT_FLASH2 && use != HK_CUDA_ATT_FLASH2X)
        return 1;
    return hk_attention_f2_splits(use == HK_CUDA_ATT_FLASH2X, T, N, Hq, Hkv,
                                  hd);
}

extern "C" int hk_cuda_attention_ex(hk_cuda_att_impl_t impl, float *o,
                                    const float *q, const int *qpos,
                                    const float *k, const float *v, int T,
                                    int N, int Hq, int Hkv, int hd, float scale,
                                    float *scratch, void *stream)
{
    if (!hk_att_args_ok(T, Hq, Hkv, hd) || N <= 0 || !hk_att_impl_ok(impl))
        return HK_CUDA_EINVAL;
    hk_cuda_att_impl_t use = hk_att_resolve(impl);
    if (hk_att_f3_kind(use) >= 0) {
        const int rc =
            hk_attention_f3(hk_att_f3_kind(use), o, q, qpos, k, v, T, N, Hq,
                            Hkv, hd, scale, scratch, hk_stream(stream));
        if (rc != HK_CUDA_EINVAL || hk_att_named(impl))
            return rc;
        use = HK_CUDA_ATT_FLASH2;
    }
    if (use == HK_CUDA_ATT_FLASH2 || use == HK_CUDA_ATT_FLASH2X) {
        const int rc =
            hk_attention_f2(use == HK_CUDA_ATT_FLASH2X, o, q, qpos, k, v, T, N,
                            Hq, Hkv, hd, scale, scratch, hk_stream(stream));
        if (rc != HK_CUDA_EINVAL || hk_att_named(impl))
            return rc;
        use = HK_CUDA_ATT_FLASH;
    }
    if (use != HK_CUDA_ATT_SIMPLE) {
        const int rc =
            hk_attention_tc(use == HK_CUDA_ATT_FLASH, o, q, qpos, k, v, T, Hq,
                            Hkv, hd, scale, hk_stream(stream));
        if (rc != HK_CUDA_EINVAL || hk_att_named(impl))
            return rc;
    }
    if (T == 0)
        return HK_CUDA_OK;
    hk_attention_kernel<<<(unsigned)(T * Hq), HK_ATT_THREADS, 0,
                          hk_stream(stream)>>>(o, q, qpos, k, v, Hq, Hkv, hd,
                                               scale);
    return hk_cuda_check_launch();
}

extern "C" int hk_cuda_attention_impl(hk_cuda_att_impl_t impl, float *o,
                                      const float *q, const int *qpos,
                                      const float *k, const float *v, int T,
                                      int N, int Hq, int Hkv, int hd,
                                      float scale, void *stream)
{
    return hk_cuda_attention_ex(impl, o, q, qpos, k, v, T, N, Hq, Hkv, hd,
                                scale, NULL, stream);
}

extern "C" int hk_cuda_attention(float *o, const float *q, const int *qpos,
                                 const float *k, const float *v, int T, int N,
                                 int Hq, int Hkv, int hd, float scale,
                                 void *stream)
{
    return hk_cuda_attention_impl(HK_CUDA_ATT_DEFAULT, o, q, qpos, k, v, T, N,
                                  Hq, Hkv, hd, scale, stream);
}

extern "C" size_t hk_cuda_attention_decode_scratch(int B, int Hq, int Hkv,
                                                   int hd)
{
    if (B < 1 || !hk_att_args_ok(B, Hq, Hkv, hd) || !hk_dec_ok(Hq, Hkv, hd))
        return 0;
    const int ns = hk_dec_splits(B, Hkv);
    return ns > 1 ? (size_t)B * Hq * ns * (size_t)(2 + hd) : 0;
}

/* The decode's choice of kernels over either K/V layout (arguments
 * checked by the caller). */
template <class KV>
static int hk_decode_run(hk_cuda_att_impl_t impl, float *o, const float *q,
                         KV kv, const int *n_ctx, int B, int Hq, int Hkv,
                         int hd, float scale, float *scratch, void *stream)
{
    const hk_cuda_att_impl_t use = hk_att_resolve(impl);
    if (use != HK_CUDA_ATT_SIMPLE && !hk_dec_ok(Hq, Hkv, hd) &&
        hk_att_named(impl))
        return HK_CUDA_EINVAL;
    if (B == 0)
        return HK_CUDA_OK;
    if (use != HK_CUDA_ATT_SIMPLE && hk_dec_ok(Hq, Hkv, hd)) {
        const int ns = scratch ? hk_dec_splits(B, Hkv) : 1;
        return hk_dec_launch(o, scratch, q, kv, n_ctx, B, Hq, Hkv, hd, scale,
                             ns, hk_stream(stream));
    }
    hk_attention_decode_kernel<<<(unsigned)(B * Hq), HK_ATT_THREADS, 0,
                                 hk_stream(stream)>>>(o, q, kv, n_ctx, Hq, Hkv,
                                                      hd, scale);
    return hk_cuda_check_launch();
}

static int hk_dec_args_ok(hk_cuda_att_impl_t impl, int B, int Hq, int Hkv,
                          int hd)
{
    return hk_att_args_ok(B, Hq, Hkv, hd) && B <= HK_CUDA_MAX_GRID_YZ &&
           hk_att_impl_ok(impl);
}

extern "C" int
hk_cuda_attention_decode_ex(hk_cuda_att_impl_t impl, float *o, const float *q,
                            const float *const *kcs, const float *const *vcs,
                            const int *n_ctx, int B, int Hq, int Hkv, int hd,
                            float scale, float *scratch, void *stream)
{
    if (!hk_dec_args_ok(impl, B, Hq, Hkv, hd))
        return HK_CUDA_EINVAL;
    const hk_kv_own<const float> kv = {kcs, vcs};
    return hk_decode_run(impl, o, q, kv, n_ctx, B, Hq, Hkv, hd, scale, scratch,
                         stream);
}

extern "C" int
hk_cuda_attention_decode(float *o, const float *q, const float *const *kcs,
                         const float *const *vcs, const int *n_ctx, int B,
                         int Hq, int Hkv, int hd, float scale, void *stream)
{
    return hk_cuda_attention_decode_ex(HK_CUDA_ATT_DEFAULT, o, q, kcs, vcs,
                                       n_ctx, B, Hq, Hkv, hd, scale, NULL,
                                       stream);
}

extern "C" int hk_cuda_attention_decode_paged_ex(
    hk_cuda_att_impl_t impl, float *o, const float *q, const float *k_pages,
    const float *v_pages, const int *table, int max_pages, const int *n_ctx,
    int B, int P, int Hq, int Hkv, int hd, float scale, float *scratch,
    void *stream)
{
    const int shift = hk_page_shift(P);
    if (!hk_dec_args_ok(impl, B, Hq, Hkv, hd) || shift < 0 ||
        (B > 0 && max_pages < 1))
        return HK_CUDA_EINVAL;
    const hk_kv_paged<const float> kv = {k_pages, v_pages, table, max_pages,
                                         shift};
    return hk_decode_run(impl, o, q, kv, n_ctx, B, Hq, Hkv, hd, scale, scratch,
                         stream);
}

extern "C" int hk_cuda_attention_decode_paged(
    float *o, const float *q, const float *k_pages, const float *v_pages,
    const int *table, int max_pages, const int *n_ctx, int B, int P, int Hq,
    int Hkv, int hd, float scale, void *stream)
{
    return hk_cuda_attention_decode_paged_ex(
        HK_CUDA_ATT_DEFAULT, o, q, k_pages, v_pages, table, max_pages, n_ctx, B,
        P, Hq, Hkv, hd, scale, NULL, stream);
}
