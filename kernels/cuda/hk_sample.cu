/*
 * hk_sample.cu - CUDA twin of hk_sample.c: per row of logits, the argmax
 * (greedy decoding) and the sampler's top-k candidates with their
 * probabilities, so only k (p, index) pairs per row go to the host, where
 * hk_sample_topk draws with the engine sampler's rules.
 *
 * A row is cut into S contiguous splits, one block each (grid (B, S)), so
 * that a batch of one still fills the GPU; S is the caller's or chosen
 * from B and the SM count (hk_sample_splits). Per-split partials live in
 * the caller's scratch (a record per (row, split): hk_cuda_argmax_scratch,
 * hk_cuda_topk_scratch) and the next launch joins them; no atomics on
 * global memory, no grid-wide waits, and the joins run in split order, so
 * results do not depend on which block ran first.
 *
 * Argmax: each split's best in hk_sel_before order (value, then lower
 * index), then one thread per row joins the S bests (S = 1: the block
 * writes the answer; no scratch needed).
 *
 * Top-k by radix select over the order-preserving 32-bit key of each logit
 * (hk_key; -0 keyed as +0, since they compare equal), 8 bits a pass:
 *   pass 0: split bests, histogram of key bits 31..24;
 *   pass 1: every block joins the bests (the maximum) and the pass-0
 *           histograms (the threshold's top digit), sums its split's
 *           (float)exp((l - max) inv_t) in double (and, where the
 *           log-sum-exp is wanted, exp((double)l - max)), histograms bits
 *           23..16 of the keys under that digit;
 *   passes 2, 3: the same for bits 15..8 and 7..0;
 *   pass 4: the last join gives T, the k-th largest key, and `need`, how
 *           many keys equal to T are kept; each split writes its keys > T
 *           and, of its keys == T, those whose rank by index among all
 *           the row's keys == T is < need (hk_sel_before's lower-index
 *           rule), to its record; at most k in all;
 *   finish: one block per row gathers the k candidates, sorts them by
 *           rank (hk_sel_before), sums the S normalizer partials in split
 *           order and forms p with the CPU's code (hk_select.h); where
 *           wanted, the candidates' raw logits (read back by index) and
 *           the row's log-sum-exp, max + log of the S partials' sum.
 * Each join (hk_digit) sums the S histograms bin by bin, one bin a thread,
 * and finds the digit whose suffix count reaches the keys still wanted by
 * a block scan; every block of a pass does it (S x 256 loads, cheaper than
 * a launch), split 0 stores the result for the pass after. Six launches and
 * five reads of the row whatever k is, where the first kernel made k
 * block-wide selections (O(k V) a row). Logits must not be NaN (as for
 * the CPU twin, whose ranking is undefined then).
 */
#include "kernels/cuda/hk_cuda_impl.h"

#define HK_SAMPLE_THREADS 256
#define HK_SAMPLE_BINS    256 /* 8-bit digits: one bin a thread */
#define HK_SAMPLE_PASSES  4
/* Automatic splits cover at least this many logits each. */
#define HK_SAMPLE_MIN_SPAN 8192

/* One (row, split) record of the scratch, in 4-byte words. */
#define HK_REC_HIST  0 /* int [passes][bins]: the split's digit counts */
#define HK_REC_Z     (HK_REC_HIST + HK_SAMPLE_PASSES * HK_SAMPLE_BINS)
#define HK_REC_LZ    (HK_REC_Z + 2)     /* double: exp(l - max) summed */
#define HK_REC_BEST  (HK_REC_LZ + 2)    /* float value, int index */
#define HK_REC_STATE (HK_REC_BEST + 2)  /* split 0: (prefix, left) x 3 */
#define HK_REC_COUNT (HK_REC_STATE + 6) /* candidates written (pass 4) */
#define HK_REC_CAND  (HK_REC_COUNT + 2) /* float [TOPK_MAX], int [TOPK_MAX] */
#define HK_REC_WORDS                                                           \
    ((HK_REC_CAND + 2 * HK_CUDA_TOPK_MAX + 7) / 8 * 8) /* 32-byte records */

static_assert(HK_SAMPLE_BINS == HK_SAMPLE_THREADS, "one bin a thread");
static_assert(HK_REC_Z % 2 == 0 && HK_REC_LZ % 2 == 0 && HK_REC_WORDS % 2 == 0,
              "the double partials are 8-byte aligned");

/* The order-preserving key: a > b as floats iff key(a) > key(b), and
 * -0 == +0 keyed alike, as hk_sel_before compares them. */
static __device__ __forceinline__ unsigned hk_key(float x)
{
    unsigned u = __float_as_uint(x);
    u = u == 0x80000000u ? 0u : u;
    return u & 0x80000000u ? ~u : u | 0x80000000u;
}

static __device__ __forceinline__ float *hk_rec(float *scratch, int row, int S,
                                                int s)
{
    return scratch + ((size_t)row * S + s) * HK_REC_WORDS;
}

/* Split s of S of a row of V: [lo, hi). */
static __device__ __forceinline__ void hk_span(int V, int S, int s, int *lo,
                                               int *hi)
{
    *lo = (int)((long long)V * s / S);
    *hi = (int)((long long)V * (s + 1) / S);
}

/* The block's first (value, index) of l[lo, hi) in hk_sel_before order;
 * every thread gets it ((-inf, -1) for an empty span). */
static __device__ void hk_span_best(const float *l, int lo, int hi, float *bv,
                                    int *bi, float *sv, int *si)
{
    float v = -INFINITY;
    int i = -1;
    for (int e = lo + threadIdx.x; e < hi; e += blockDim.x)
        if (hk_sel_before(l[e], e, v, i)) {
            v = l[e];
            i = e;
        }
    hk_block_argbest(&v, &i, sv, si);
    *bv = v;
    *bi = i;
}

/* The first of a row's S split bests, (float value, int index) pairs
 * `stride` words apart from b0, in split order. */
static __device__ void hk_join_best(const float *b0, int S, size_t stride,
                                    float *bv, int *bi)
{
    float v = -INFINITY;
    int i = -1;
    for (int s = 0; s < S; s++) {
        const float *r = b0 + (size_t)s * stride;
        const int ri = ((const int *)r)[1];
        if (hk_sel_before(r[0], ri, v, i)) {
            v = r[0];
            i = ri;
        }
    }
    *bv = v;
    *bi = i;
}

/* Joins the S histograms of `pass`: the threshold key's digit of that
 * pass goes into *prefix, and *left (keys still wanted among those under
 * the prefix) loses the keys of the higher digits, which are all kept.
 * Every thread gets both. sh: 32 ints; out: 2 ints of shared memory. */
static __device__ void hk_digit(const float *rec0, int S, int pass,
                                unsigned *prefix, int *left, int *sh, int *out)
{
    const int d = threadIdx.x;
    int h = 0;
    for (int s = 0; s < S; s++)
        h += ((const int *)rec0)[(size_t)s * HK_REC_WORDS + HK_REC_HIST +
                                 pass * HK_SAMPLE_BINS + d];
    int total;
    const int above = h + hk_block_scan(h, &total, sh); /* bins <= d */
    const int gt = total - above;                       /* bins > d */
    if (gt < *left && gt + h >= *left) {
        out[0] = d;
        out[1] = *left - gt;
    }
    __syncthreads();
    *prefix |= (unsigned)out[0] << (24 - 8 * pass);
    *left = out[1];
    __syncthreads();
}

static __global__ void __launch_bounds__(HK_SAMPLE_THREADS)
    hk_argmax_kernel(int *idx,            // [B]
                     const float *logits, // [B, ld]
                     int V, int ld, int S, float *scratch)
{
    __shared__ float sv[HK_SAMPLE_THREADS];
    __shared__ int si[HK_SAMPLE_THREADS];
    const int row = blockIdx.x, s = blockIdx.y;
    int lo, hi;
    hk_span(V, S, s, &lo, &hi);
    float v;
    int i;
    hk_span_best(logits + (size_t)row * ld, lo, hi, &v, &i, sv, si);
    if (threadIdx.x != 0)
        return;
    if (S == 1) {
        idx[row] = i;
    } else {
        float *r = scratch + ((size_t)row * S + s) * 2;
        r[0] = v;
        ((int *)r)[1] = i;
    }
}

/* One thread per row: the first of its S split bests. */
static __global__ void hk_argmax_join_kernel(int *idx, float *scratch, int B,
                                             int S)
{
    const int row = blockIdx.x * blockDim.x + threadIdx.x;
    if (row >= B)
        return;
    float v;
    int i;
    hk_join_best(scratch + (size_t)row * S * 2, S, 2, &v, &i);
    idx[row] = i;
}

/* Pass `pass` (0..4) of the radix select, block (row, split); see the
 * file's comment. */
static __global__ void __launch_bounds__(HK_SAMPLE_THREADS)
    hk_topk_pass_kernel(int pass, const float *logits, // [B, ld]
                        int V, int ld, int k, double inv_t, int want_lse, int S,
                        float *scratch)
{
    __shared__ int hist[HK_SAMPLE_THREADS / 32][HK_SAMPLE_BINS];
    __shared__ float sv[HK_SAMPLE_THREADS];
    __shared__ int si[HK_SAMPLE_THREADS];
    __shared__ double sd[32];
    __shared__ int sh[32], out[2], s_count, s_eq[2];
    __shared__ float s_mx;
    const int row = blockIdx.x, s = blockIdx.y, tid = threadIdx.x;
    const float *l = logits + (size_t)row * ld;
    float *rec0 = hk_rec(scratch, row, S, 0);
    float *rec = rec0 + (size_t)s * HK_REC_WORDS;
    int *irec = (int *)rec;
    int lo, hi;
    hk_span(V, S, s, &lo, &hi);

    if (pass == 0) {
        float v;
        int i;
        hk_span_best(l, lo, hi, &v, &i, sv, si);
        if (tid == 0) {
            rec[HK_REC_BEST] = v;
            irec[HK_REC_BEST + 1] = i;
        }
    }
    /* The threshold's digits so far: (prefix, left) after pass - 2 from
     * split 0's record, then this block joins pass - 1's histograms. */
    unsigned prefix = 0;
    int left = k;
    if (pass >= 1) {
        const int *st = (const int *)rec0 + HK_REC_STATE;
        if (pass >= 2) {
            prefix = (unsigned)st[2 * (pass - 2)];
            left = st[2 * (pass - 2) + 1];
        }
        hk_digit(rec0, S, pass - 1, &prefix, &left, sh, out);
        if (s == 0 && tid == 0 && pass < HK_SAMPLE_PASSES) {
            ((int *)rec0)[HK_REC_STATE + 2 * (pass - 1)] = (int)prefix;
            ((int *)rec0)[HK_REC_STATE + 2 * (pass - 1) + 1] = left;
        }
    }
    if (pass == 1) {
        if (tid == 0) {
            float mx;
            int mi;
            hk_join_best(rec0 + HK_REC_BEST, S, HK_REC_WORDS, &mx, &mi);
            s_mx = mx;
        }
        __syncthreads();
        const float mx = s_mx;
        double z = 0.0, lz = 0.0;
        for (int e = lo + tid; e < hi; e += blockDim.x) {
            z += (float)exp((l[e] - mx) * inv_t);
            if (want_lse) /* hk_lse's terms, the same read */
                lz += exp((double)l[e] - mx);
        }
        z = hk_block_sum_d(z, sd);
        if (want_lse)
            lz = hk_block_sum_d(lz, sd);
        if (tid == 0) {
            *(double *)(rec + HK_REC_Z) = z;
            *(double *)(rec + HK_REC_LZ) = lz;
        }
    }

    if (pass < HK_SAMPLE_PASSES) {
        /* per-warp histograms of this pass's digit among the keys under
         * the prefix, summed in warp order */
        const unsigned hmask = pass == 0 ? 0u : ~0u << (32 - 8 * pass);
        const int shift = 24 - 8 * pass;
        int *hw = hist[tid >> 5];
        for (int j = tid; j < HK_SAMPLE_THREADS / 32 * HK_SAMPLE_BINS;
             j += blockDim.x)
            (&hist[0][0])[j] = 0;
        __syncthreads();
        for (int e = lo + tid; e < hi; e += blockDim.x) {
            const unsigned key = hk_key(l[e]);
            if (((key ^ prefix) & hmask) == 0)
                atomicAdd(&hw[(key >> shift) & (HK_SAMPLE_BINS - 1)], 1);
        }
        __syncthreads();
        int c = 0;
        for (int w = 0; w < HK_SAMPLE_THREADS / 32; w++)
            c += hist[w][tid];
        irec[HK_REC_HIST + pass * HK_SAMPLE_BINS + tid] = c;
        return;
    }

    /* pass 4: prefix is T, the k-th largest key; left of the row's keys
     * == T are kept, the lowest indices. This split's keys == T are
     * ranks eq_base .. eq_base + its count - 1 of them. */
    if (tid == 0) {
        const int dig = (int)(prefix & (HK_SAMPLE_BINS - 1));
        const int *h3 = (const int *)rec0 + HK_REC_HIST +
                        (HK_SAMPLE_PASSES - 1) * HK_SAMPLE_BINS + dig;
        int base = 0;
        for (int j = 0; j < s; j++)
            base += h3[(size_t)j * HK_REC_WORDS];
        s_eq[0] = base;
        s_eq[1] = h3[(size_t)s * HK_REC_WORDS];
        s_count = 0;
    }
    __syncthreads();
    const int eq_base = s_eq[0], eq_n = s_eq[1];
    /* all of them kept, or some: then ranks by index, chunk by chunk */
    const int all_eq = eq_base + eq_n <= left;
    int eq_run = eq_base;
    float *cv = rec + HK_REC_CAND;
    int *ci = irec + HK_REC_CAND + HK_CUDA_TOPK_MAX;
    for (int c = lo; c < hi; c += blockDim.x) {
        const int e = c + tid;
        const float x = e < hi ? l[e] : 0.0f;
        const unsigned key = hk_key(x);
        const int eq = e < hi && key == prefix;
        if ((e < hi && key > prefix) || (eq && all_eq)) {
            const int at = atomicAdd(&s_count, 1);
            cv[at] = x;
            ci[at] = e;
        }
        if (!all_eq && eq_run < left) { /* the same in every thread */
            int n;
            const int r = hk_block_scan(eq, &n, sh);
            if (eq && eq_run + r < left) {
                const int at = atomicAdd(&s_count, 1);
                cv[at] = x;
                ci[at] = e;
            }
            eq_run += n;
        }
    }
    __syncthreads();
    if (tid == 0)
        irec[HK_REC_COUNT] = s_count;
}

/* One block per row: the splits' candidates (k in all) in rank order, then
 * the sampler's probabilities, a thread each, and its order; raw and lse
 * where wanted (non-NULL). */
static __global__ void __launch_bounds__(HK_SAMPLE_THREADS)
    hk_topk_finish_kernel(float *p,            // [B, k]
                          int *idx,            // [B, k]
                          float *raw,          // [B, k] or NULL
                          double *lse,         // [B] or NULL
                          const float *logits, // [B, ld]
                          int ld, int k, double inv_t, int S, float *scratch)
{
    __shared__ float cv[HK_CUDA_TOPK_MAX], tv[HK_CUDA_TOPK_MAX];
    __shared__ int ci[HK_CUDA_TOPK_MAX], ti[HK_CUDA_TOPK_MAX];
    const int row = blockIdx.x, tid = threadIdx.x;
    const float *rec0 = hk_rec(scratch, row, S, 0);
    int at = 0;
    for (int s = 0; s < S; s++) {
        const float *r = rec0 + (size_t)s * HK_REC_WORDS;
        const int n = ((const int *)r)[HK_REC_COUNT];
        for (int j = tid; j < n; j += blockDim.x)
            if (at + j < k) { /* k in all unless logits are NaN */
                cv[at + j] = r[HK_REC_CAND + j];
                ci[at + j] =
                    ((const int *)r)[HK_REC_CAND + HK_CUDA_TOPK_MAX + j];
            }
        at += n;
    }
    __syncthreads();
    if (tid < k) {
        int rank = 0;
        for (int m = 0; m < k; m++)
            rank += hk_sel_before(cv[m], ci[m], cv[tid], ci[tid]);
        tv[rank] = cv[tid];
        ti[rank] = ci[tid];
    }
    __syncthreads();
    /* z in split order, p a thread each; thread 0 orders them (linear on
     * the rank order, where ties of p are adjacent) */
    double z = 0.0;
    for (int s = 0; s < S; s++)
        z += *(const double *)(rec0 + (size_t)s * HK_REC_WORDS + HK_REC_Z);
    const float mx = tv[0];
    if (lse && tid == 0) {
        double lz = 0.0;
        for (int s = 0; s < S; s++)
            lz +=
                *(const double *)(rec0 + (size_t)s * HK_REC_WORDS + HK_REC_LZ);
        lse[row] = mx + log(lz);
    }
    __syncthreads();
    if (tid < k)
        tv[tid] = hk_sel_prob(tv[tid], mx, z, inv_t);
    __syncthreads();
    if (tid == 0)
        hk_sel_order(tv, ti, k);
    __syncthreads();
    if (tid < k) {
        p[(size_t)row * k + tid] = tv[tid];
        idx[(size_t)row * k + tid] = ti[tid];
        if (raw)
            raw[(size_t)row * k + tid] = logits[(size_t)row * ld + ti[tid]];
    }
}

/* The splits of each of B rows of V: the caller's, else about two blocks
 * per SM in all, each split at least HK_SAMPLE_MIN_SPAN logits, at most
 * HK_CUDA_SAMPLE_SPLITS_MAX. B * result <= max(B, 2 * SMs), and 1 where
 * B >= 2 * SMs. */
static int hk_sample_splits(int B, int V, int splits)
{
    if (splits > 0)
        return splits;
    int s = 2 * hk_cuda_sm_count(1) / B;
    s = s < V / HK_SAMPLE_MIN_SPAN ? s : V / HK_SAMPLE_MIN_SPAN;
    s = s < HK_CUDA_SAMPLE_SPLITS_MAX ? s : HK_CUDA_SAMPLE_SPLITS_MAX;
    return s > 1 ? s : 1;
}

/* Records for B rows at `splits` (0: any the launcher picks for B' <= B
 * rows), `words` floats each; unsplit rows take none where `whole` is 0. */
static size_t hk_sample_scratch(int B, int splits, int words, int whole)
{
    if (B <= 0 || splits < 0 || splits > HK_CUDA_SAMPLE_SPLITS_MAX)
        return 0;
    const size_t sms2 = 2 * (size_t)hk_cuda_sm_count(1);
    size_t slots = splits > 0 ? (size_t)B * splits : sms2;
    if (whole && splits == 0)
        slots = (size_t)B > sms2 ? (size_t)B : sms2;
    if (!whole && splits == 1)
        slots = 0;
    return slots * (size_t)words;
}

extern "C" size_t hk_cuda_argmax_scratch(int B, int splits)
{
    return hk_sample_scratch(B, splits, 2, 0);
}

extern "C" size_t hk_cuda_topk_scratch(int B, int splits)
{
    return hk_sample_scratch(B, splits, HK_REC_WORDS, 1);
}

extern "C" int hk_cuda_argmax(int *idx, const float *logits, int B, int V,
                              int ld, int splits, float *scratch, void *stream)
{
    if (B < 0 || V <= 0 || ld < V || splits < 0 ||
        splits > HK_CUDA_SAMPLE_SPLITS_MAX || (!scratch && splits > 1))
        return HK_CUDA_EINVAL;
    if (B == 0)
        return HK_CUDA_OK;
    const int S = scratch ? hk_sample_splits(B, V, splits) : 1;
    cudaStream_t st = hk_stream(stream);
    hk_argmax_kernel<<<dim3(B, S), HK_SAMPLE_THREADS, 0, st>>>(idx, logits, V,
                                                               ld, S, scratch);
    int rc = hk_cuda_check_launch();
    if (rc != HK_CUDA_OK || S == 1)
        return rc;
    hk_argmax_join_kernel<<<HK_CEIL_DIV(B, 128), 128, 0, st>>>(idx, scratch, B,
                                                               S);
    return hk_cuda_check_launch();
}

extern "C" int hk_cuda_topk(float *p, int *idx, float *raw, double *lse,
                            const float *logits, int B, int V, int ld, int k,
                            double inv_t, int splits, float *scratch,
                            void *stream)
{
    if (B < 0 || V <= 0 || ld < V || k < 1 || k > V || k > HK_CUDA_TOPK_MAX ||
        !(inv_t > 0.0) || splits < 0 || splits > HK_CUDA_SAMPLE_SPLITS_MAX ||
        !scratch)
        return HK_CUDA_EINVAL;
    if (B == 0)
        return HK_CUDA_OK;
    const int S = hk_sample_splits(B, V, splits);
    cudaStream_t st = hk_stream(stream);
    for (int pass = 0; pass <= HK_SAMPLE_PASSES; pass++) {
        hk_topk_pass_kernel<<<dim3(B, S), HK_SAMPLE_THREADS, 0, st>>>(
            pass, logits, V, ld, k, inv_t, lse != NULL, S, scratch);
        const int rc = hk_cuda_check_launch();
        if (rc != HK_CUDA_OK)
            return rc;
    }
    hk_topk_finish_kernel<<<B, HK_SAMPLE_THREADS, 0, st>>>(
        p, idx, raw, lse, logits, ld, k, inv_t, S, scratch);
    return hk_cuda_check_launch();
}
