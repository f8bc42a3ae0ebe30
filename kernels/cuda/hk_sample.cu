/*
 * hk_sample.cu - CUDA twin of hk_sample.c: per row of logits, the argmax
 * (greedy decoding) and the sampler's top-k candidates with their
 * probabilities, so only k (p, index) pairs per row go to the host, where
 * hk_sample_topk draws with the engine sampler's rules.
 *
 * One block per row. Argmax is a block reduction in hk_sel_before order
 * (value, then lower index). Top-k: the maximum, the double normalizer
 * z = sum (float)exp((l - max) inv_t) as a block reduction, then k
 * block-wide selections, each of the first logit ranked after the previous
 * pick (as hk_moe_route's passes): O(k V / threads) per row, simple and
 * fine for the k of sampling (<= HK_CUDA_TOPK_MAX); a radix select would
 * be the faster form. Thread 0 then forms p and the sampler's order with
 * the CPU's own code (hk_select.h).
 */
#include "kernels/cuda/hk_cuda_impl.h"

#define HK_SAMPLE_THREADS 256

/* The row's best (value, index) after (pv, pi) in rank order (pi < 0:
 * from the start). */
static __device__ void hk_row_next(const float *l, int V, float pv, int pi,
                                   float *bv, int *bi, float *sv, int *si)
{
    float v = -INFINITY;
    int i = -1;
    for (int e = threadIdx.x; e < V; e += blockDim.x)
        if ((pi < 0 || hk_sel_before(pv, pi, l[e], e)) &&
            hk_sel_before(l[e], e, v, i)) {
            v = l[e];
            i = e;
        }
    hk_block_argbest(&v, &i, sv, si);
    *bv = v;
    *bi = i;
}

static __global__ void hk_argmax_kernel(int *idx,            // [B]
                                        const float *logits, // [B, V]
                                        int V)
{
    __shared__ float sv[HK_SAMPLE_THREADS];
    __shared__ int si[HK_SAMPLE_THREADS];
    float v;
    int i;
    hk_row_next(logits + (size_t)blockIdx.x * V, V, 0.0f, -1, &v, &i, sv, si);
    if (threadIdx.x == 0)
        idx[blockIdx.x] = i;
}

static __global__ void hk_topk_kernel(float *p,            // [B, k]
                                      int *idx,            // [B, k]
                                      const float *logits, // [B, V]
                                      int V, int k, double inv_t)
{
    __shared__ float sv[HK_SAMPLE_THREADS];
    __shared__ int si[HK_SAMPLE_THREADS];
    __shared__ double sd[32];
    __shared__ float tv[HK_CUDA_TOPK_MAX];
    __shared__ int ti[HK_CUDA_TOPK_MAX];
    const float *l = logits + (size_t)blockIdx.x * V;
    float v = 0.0f, mx = 0.0f;
    int i = -1;
    for (int j = 0; j < k; j++) {
        hk_row_next(l, V, v, i, &v, &i, sv, si);
        mx = j == 0 ? v : mx; /* every thread has the pick */
        if (threadIdx.x == 0) {
            tv[j] = v;
            ti[j] = i;
        }
    }
    double z = 0.0;
    for (int e = threadIdx.x; e < V; e += blockDim.x)
        z += (float)exp((l[e] - mx) * inv_t);
    z = hk_block_sum_d(z, sd);
    if (threadIdx.x == 0) {
        hk_sel_probs(tv, ti, k, mx, z, inv_t);
        for (int j = 0; j < k; j++) {
            p[(size_t)blockIdx.x * k + j] = tv[j];
            idx[(size_t)blockIdx.x * k + j] = ti[j];
        }
    }
}

extern "C" int hk_cuda_argmax(int *idx, const float *logits, int B, int V,
                              void *stream)
{
    if (B < 0 || V <= 0)
        return HK_CUDA_EINVAL;
    if (B == 0)
        return HK_CUDA_OK;
    hk_argmax_kernel<<<B, HK_SAMPLE_THREADS, 0, hk_stream(stream)>>>(idx,
                                                                     logits, V);
    return hk_cuda_check_launch();
}

extern "C" int hk_cuda_topk(float *p, int *idx, const float *logits, int B,
                            int V, int k, double inv_t, void *stream)
{
    if (B < 0 || V <= 0 || k < 1 || k > V || k > HK_CUDA_TOPK_MAX ||
        !(inv_t > 0.0))
        return HK_CUDA_EINVAL;
    if (B == 0)
        return HK_CUDA_OK;
    hk_topk_kernel<<<B, HK_SAMPLE_THREADS, 0, hk_stream(stream)>>>(
        p, idx, logits, V, k, inv_t);
    return hk_cuda_check_launch();
}
