/*
 * hk_moe.cu - CUDA twin of hk_moe.c: the router (softmax, top-k, optional
 * renormalization) for T tokens, and the dispatch: the routed pairs sorted
 * by expert (plan), rows gathered per slot, expert outputs added back
 * (scatter per expert, or combine for all at once).
 *
 * Router: one block per token. The maximum and the double normalizer are
 * block reductions; the k picks are k block-wide selections, each of the
 * first expert (hk_sel_before order) ranked after the previous pick, as
 * the CPU's k passes. The weights, and the renormalization by thread 0
 * in pick order, are the CPU's expressions.
 *
 * Plan: one block; thread e counts, then fills, expert e's slots by one
 * scan of the pairs in (t, j) order, so slots come out in the CPU's order
 * without atomics; thread 0 forms the offsets in between. O(E/threads *
 * T k) per thread: simple, and far below the experts' GEMMs.
 */
#include "kernels/cuda/hk_cuda_impl.h"

#define HK_MOE_THREADS 256

static __global__ void hk_moe_route_kernel(int *idx,            // [T, k]
                                           float *w,            // [T, k]
                                           const float *logits, // [T, E]
                                           int E, int k, int renorm)
{
    __shared__ float sv[HK_MOE_THREADS];
    __shared__ int si[HK_MOE_THREADS];
    __shared__ double sd[32];
    const float *l = logits + (size_t)blockIdx.x * E;
    int *it = idx + (size_t)blockIdx.x * k;
    float *wt = w + (size_t)blockIdx.x * k;
    const int tid = threadIdx.x;

    float mx = -INFINITY;
    int mi = -1;
    for (int e = tid; e < E; e += blockDim.x)
        if (hk_sel_before(l[e], e, mx, mi)) {
            mx = l[e];
            mi = e;
        }
    hk_block_argbest(&mx, &mi, sv, si);
    double sum = 0.0;
    for (int e = tid; e < E; e += blockDim.x)
        sum += (double)expf(l[e] - mx);
    sum = hk_block_sum_d(sum, sd);

    /* The first pick is the maximum found above. */
    int prev = mi;
    for (int i = 0; i < k; i++) {
        if (i > 0) {
            float bv = -INFINITY;
            int bi = -1;
            for (int e = tid; e < E; e += blockDim.x)
                if (hk_sel_before(l[prev], prev, l[e], e) &&
                    hk_sel_before(l[e], e, bv, bi)) {
                    bv = l[e];
                    bi = e;
                }
            hk_block_argbest(&bv, &bi, sv, si);
            prev = bi;
        }
        if (tid == 0) {
            it[i] = prev;
            wt[i] = (float)((double)expf(l[prev] - mx) / sum);
        }
    }
    if (tid == 0 && renorm) {
        double ws = 0.0;
        for (int i = 0; i < k; i++)
            ws += wt[i];
        for (int i = 0; i < k; i++)
            wt[i] = (float)(wt[i] / ws);
    }
}

static __global__ void hk_moe_plan_kernel(int *offs,      // [E + 1]
                                          int *rows,      // [T * k]
                                          float *scale,   // [T * k]
                                          int *slot,      // [T * k]
                                          const int *idx, // [T * k]
                                          const float *w, // [T * k]
                                          int n, int k, int E)
{
    for (int e = threadIdx.x; e < E; e += blockDim.x) {
        int c = 0;
        for (int i = 0; i < n; i++)
            c += idx[i] == e;
        offs[e + 1] = c;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        offs[0] = 0;
        for (int e = 0; e < E; e++)
            offs[e + 1] += offs[e];
    }
    __syncthreads();
    for (int e = threadIdx.x; e < E; e += blockDim.x) {
        int s = offs[e];
        for (int i = 0; i < n; i++)
            if (idx[i] == e) {
                rows[s] = i / k;
                scale[s] = w[i];
                slot[i] = s;
                s++;
            }
    }
}

static __global__ void hk_moe_gather_kernel(float *xg,       // [n, H]
                                            const float *y,  // [*, H]
                                            const int *rows, // [n]
                                            size_t n, int H)
{
    HK_GRID_STRIDE(e, n)
    xg[e] = y[(size_t)rows[e / H] * H + e % H];
}

static __global__ void hk_moe_scatter_kernel(float *x,        // [*, H]
                                             const float *eo, // [n, H]
                                             const int *rows, // [n], distinct
                                             size_t n, int H)
{
    HK_GRID_STRIDE(e, n)
    x[(size_t)rows[e / H] * H + e % H] += eo[e];
}

/* One thread per x element adds its k terms in j order, as the CPU. */
static __global__ void hk_moe_combine_kernel(float *x,        // [T, H]
                                             const float *eo, // [T * k, H]
                                             const int *slot, // [T, k]
                                             size_t n, int k, int H)
{
    HK_GRID_STRIDE(e, n)
    {
        const size_t t = e / H, h = e % H;
        float acc = x[e];
        for (int j = 0; j < k; j++)
            acc += eo[(size_t)slot[t * k + j] * H + h];
        x[e] = acc;
    }
}

extern "C" int hk_cuda_moe_route(int *idx, float *w, const float *logits, int T,
                                 int E, int k, int renorm, void *stream)
{
    if (T < 0 || E <= 0 || k <= 0 || k > E)
        return HK_CUDA_EINVAL;
    if (T == 0)
        return HK_CUDA_OK;
    hk_moe_route_kernel<<<T, HK_MOE_THREADS, 0, hk_stream(stream)>>>(
        idx, w, logits, E, k, renorm);
    return hk_cuda_check_launch();
}

extern "C" int hk_cuda_moe_plan(int *offs, int *rows, float *scale, int *slot,
                                const int *idx, const float *w, int T, int k,
                                int E, void *stream)
{
    if (T < 0 || k <= 0 || E <= 0 || (long long)T * k > 2147483647LL)
        return HK_CUDA_EINVAL;
    hk_moe_plan_kernel<<<1, HK_MOE_THREADS, 0, hk_stream(stream)>>>(
        offs, rows, scale, slot, idx, w, T * k, k, E);
    return hk_cuda_check_launch();
}

extern "C" int hk_cuda_moe_gather(float *xg, const float *y, const int *rows,
                                  int n, int H, void *stream)
{
    if (n < 0 || H < 0)
        return HK_CUDA_EINVAL;
    const size_t ne = (size_t)n * H;
    HK_LAUNCH_1D(hk_moe_gather_kernel, ne, HK_MOE_THREADS, stream, xg, y, rows,
                 ne, H);
}

extern "C" int hk_cuda_moe_scatter(float *x, const float *eo, const int *rows,
                                   int n, int H, void *stream)
{
    if (n < 0 || H < 0)
        return HK_CUDA_EINVAL;
    const size_t ne = (size_t)n * H;
    HK_LAUNCH_1D(hk_moe_scatter_kernel, ne, HK_MOE_THREADS, stream, x, eo, rows,
                 ne, H);
}

extern "C" int hk_cuda_moe_combine(float *x, const float *eo, const int *slot,
                                   int T, int k, int H, void *stream)
{
    if (T < 0 || k <= 0 || H < 0)
        return HK_CUDA_EINVAL;
    const size_t ne = (size_t)T * H;
    HK_LAUNCH_1D(hk_moe_combine_kernel, ne, HK_MOE_THREADS, stream, x, eo, slot,
                 ne, k, H);
}
