/*
 * hk_attention.cu - CUDA twin of hk_attention.c: causal grouped-query
 * attention by position, for a prompt over its cache (prefill, PIC splice
 * runs) and for one decode token of each of B requests over their own
 * caches.
 *
 *   o[t, h] = sum_{j < nkeys} softmax_j(scale * q[t, h] . k[j, g]) v[j, g]
 *   g = h / (Hq / Hkv);  nkeys = qpos[t] + 1 (prefill), n_ctx[b] (decode)
 *
 * One block of 4 warps per (query, head), an online softmax over tiles of
 * 64 keys: each warp takes a key of the tile at a time and forms its score
 * as a warp-reduced dot product (lanes over hd, so the key row is read
 * coalesced); the scores' maximum, then e^{s - m'} per key go through
 * shared memory; each thread owns hd/128 output dims and rescales and adds
 * p_j v[j, d] (the value rows read coalesced across threads). Straight-
 * forward rather than fast: K and V are read once per query head, not
 * shared across the heads of a group or the queries of a block (no tensor
 * cores either); that is the performance work left.
 */
#include "kernels/cuda/hk_cuda_impl.h"

#define HK_ATT_THREADS 128
#define HK_ATT_WARPS   (HK_ATT_THREADS / 32)
#define HK_ATT_KT      64
/* Output dims per thread. */
#define HK_ATT_DPT (HK_CUDA_ATT_MAX_HD / HK_ATT_THREADS)

/* One query row against nkeys keys. k, v point at the row of key 0 of the
 * query's kv group; rows are ldkv apart. qs [hd], ss, ps [HK_ATT_KT]:
 * shared memory. */
static __device__ void hk_att_row(float *o, const float *q, const float *k,
                                  const float *v, size_t ldkv, int nkeys,
                                  int hd, float scale, float *qs, float *ss,
                                  float *ps)
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
            const float *kr = k + (size_t)(j0 + jj) * ldkv;
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
            const float *vc = v + (size_t)j0 * ldkv + d;
            for (int jj = 0; jj < nk; jj++)
                a += ps[jj] * vc[(size_t)jj * ldkv];
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
    hk_att_row(o + off, q + off, k + g, v + g, (size_t)Hkv * hd, qpos[t] + 1,
               hd, scale, qs, ss, ps);
}

/* Block x = b * Hq + h. */
static __global__ void hk_attention_decode_kernel(float *o,       // [B, Hq, hd]
                                                  const float *q, // [B, Hq, hd]
                                                  const float *const *kcs,
                                                  const float *const *vcs,
                                                  const int *n_ctx, // [B]
                                                  int Hq, int Hkv, int hd,
                                                  float scale)
{
    __shared__ float qs[HK_CUDA_ATT_MAX_HD], ss[HK_ATT_KT], ps[HK_ATT_KT];
    const int b = blockIdx.x / Hq, h = blockIdx.x % Hq;
    const size_t g = (size_t)(h / (Hq / Hkv)) * hd;
    const size_t off = (size_t)blockIdx.x * hd;
    hk_att_row(o + off, q + off, kcs[b] + g, vcs[b] + g, (size_t)Hkv * hd,
               n_ctx[b], hd, scale, qs, ss, ps);
}

static int hk_att_args_ok(int rows, int Hq, int Hkv, int hd)
{
    return rows >= 0 && Hkv > 0 && Hq >= Hkv && Hq % Hkv == 0 && hd > 0 &&
           hd <= HK_CUDA_ATT_MAX_HD && (long long)rows * Hq <= 2147483647LL;
}

extern "C" int hk_cuda_attention(float *o, const float *q, const int *qpos,
                                 const float *k, const float *v, int T, int N,
                                 int Hq, int Hkv, int hd, float scale,
                                 void *stream)
{
    if (!hk_att_args_ok(T, Hq, Hkv, hd) || N <= 0)
        return HK_CUDA_EINVAL;
    if (T == 0)
        return HK_CUDA_OK;
    hk_attention_kernel<<<(unsigned)(T * Hq), HK_ATT_THREADS, 0,
                          hk_stream(stream)>>>(o, q, qpos, k, v, Hq, Hkv, hd,
                                               scale);
    return hk_cuda_check_launch();
}

extern "C" int
hk_cuda_attention_decode(float *o, const float *q, const float *const *kcs,
                         const float *const *vcs, const int *n_ctx, int B,
                         int Hq, int Hkv, int hd, float scale, void *stream)
{
    if (!hk_att_args_ok(B, Hq, Hkv, hd))
        return HK_CUDA_EINVAL;
    if (B == 0)
        return HK_CUDA_OK;
    hk_attention_decode_kernel<<<(unsigned)(B * Hq), HK_ATT_THREADS, 0,
                                 hk_stream(stream)>>>(o, q, kcs, vcs, n_ctx, Hq,
                                                      Hkv, hd, scale);
    return hk_cuda_check_launch();
}
