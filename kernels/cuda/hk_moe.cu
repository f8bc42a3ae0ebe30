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
 * Plan: one block, a counting sort by expert that keeps the CPU's (t, j)
 * order within each expert: per-warp counts over contiguous ranges of the
 * pairs, a block scan for the offsets, a second walk for the slots (see
 * hk_moe_plan_kernel). O(T k / threads + E / threads) per thread, where the
 * first kernel scanned all pairs for each expert.
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

/* The plan: warp w owns pairs [w n / nw, (w + 1) n / nw) and counts them
 * per expert in its row of c (shared, [nw][E]); the lanes of a step that
 * share an expert find each other with __match_any_sync, and the lowest of
 * them adds their number, so no atomics. One block scan over the experts'
 * totals gives offs, and turns c into each warp's first slot per expert
 * (offs[e] plus the earlier warps' counts). A second walk gives each pair
 * its slot: its warp's cursor plus the lanes below it with its expert;
 * warps in order, lanes in order: the CPU's (t, j) order. */
static __global__ void hk_moe_plan_kernel(int *offs,      // [E + 1]
                                          int *rows,      // [T * k]
                                          float *scale,   // [T * k]
                                          int *slot,      // [T * k]
                                          const int *idx, // [T * k]
                                          const float *w, // [T * k]
                                          int n, int k, int E)
{
    HK_DYNAMIC_SMEM(smem);
    int *c = (int *)smem; /* [nw][E] */
    __shared__ int sh[32];
    const int tid = threadIdx.x, lane = tid & 31, wp = tid >> 5;
    const int nw = blockDim.x >> 5;
    const unsigned below = (1u << lane) - 1u;
    const int lo = (int)((long long)n * wp / nw);
    const int hi = (int)((long long)n * (wp + 1) / nw);
    int *cw = c + (size_t)wp * E;

    for (int j = tid; j < nw * E; j += blockDim.x)
        c[j] = 0;
    __syncthreads();
    for (int b = lo; b < hi; b += 32) {
        const int i = b + lane;
        const int e = i < hi ? idx[i] : -1;
        const unsigned m = __match_any_sync(HK_FULL_MASK, (unsigned)e);
        if (e >= 0 && e < E && !(m & below))
            cw[e] += __popc(m);
        __syncwarp();
    }
    __syncthreads();

    /* thread t: experts [t per, (t + 1) per) */
    const int per = HK_CEIL_DIV(E, (int)blockDim.x);
    const int e0 = tid * per < E ? tid * per : E;
    const int e1 = e0 + per < E ? e0 + per : E;
    int sum = 0;
    for (int e = e0; e < e1; e++)
        for (int v = 0; v < nw; v++)
            sum += c[(size_t)v * E + e];
    int total;
    int at = hk_block_scan(sum, &total, sh);
    for (int e = e0; e < e1; e++) {
        offs[e] = at;
        for (int v = 0; v < nw; v++) {
            const int cnt = c[(size_t)v * E + e];
            c[(size_t)v * E + e] = at;
            at += cnt;
        }
    }
    if (tid == 0)
        offs[E] = total;
    __syncthreads();

    for (int b = lo; b < hi; b += 32) {
        const int i = b + lane;
        const int e = i < hi ? idx[i] : -1;
        const unsigned m = __match_any_sync(HK_FULL_MASK, (unsigned)e);
        const int ok = e >= 0 && e < E;
        if (ok) {
            const int s = cw[e] + __popc(m & below);
            rows[s] = i / k;
            scale[s] = w[i];
            slot[i] = s;
        }
        __syncwarp();
        if (ok && !(m & below))
            cw[e] += __popc(m);
        __syncwarp();
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
    /* the warps' counts per expert in 48 KB of shared memory with the
     * static part: 8 warps up to E = 1500, fewer above, E <= 12000 */
    const int nw = E > 0 && E <= 12000 / 8 ? 8 : E > 0 ? 12000 / E : 0;
    if (T < 0 || k <= 0 || E <= 0 || nw < 1 || (long long)T * k > 2147483647LL)
        return HK_CUDA_EINVAL;
    hk_moe_plan_kernel<<<1, 32 * nw, (size_t)nw * E * sizeof(int),
                         hk_stream(stream)>>>(offs, rows, scale, slot, idx, w,
                                              T * k, k, E);
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
