/*
 * hk_norm.cu - CUDA twins of hk_norm.c: RMS/L2 norms and SwiGLU.
 *
 *   rmsnorm_zc:    y = x / sqrt(mean(x^2) + eps) * (1 + w)   per row of dim
 *   rmsnorm_gated: y = w * x / sqrt(mean(x^2) + eps) * silu(z) per row of dim
 *   l2norm:        x <- x / sqrt(sum(x^2) + eps) * scale      per row of dim
 *   swiglu:        y = silu(g) * u                             elementwise
 *                  (g, u f32, or bf16: hk_cuda_swiglu_bf16_in)
 *
 * Layouts: x, y, z [rows, dim] row-major, w [dim]. References as hk_norm.c.
 *
 * Launch shapes, by row length (the rows are many and short: a GDN
 * layer's T Hv rows of 128, T rows of 4096 hidden):
 *   - rmsnorm dim <= HK_NORM_WARP_MAX, l2norm dim <= HK_WROW_MAX: a warp a
 *     row, HK_NORM_WARPS rows a block; the row held in registers as
 *     fragments (hk_cuda_impl.h: float4 accesses where dim and the
 *     pointers allow), reduced by shuffles, no __syncthreads;
 *   - rmsnorm up to HK_NORM_BLOCK_MAX: a block of HK_ROW_THREADS a row,
 *     held in registers the same way (read once, float4), one block sum;
 *   - longer rows (and l2norm past HK_WROW_MAX): a block a row, strided
 *     (hk_row_sumsq), x read twice.
 * Every sum of squares is in f32 per thread, then a tree (shuffles, then
 * the block's warps): ~log2(dim) roundings, not dim as in a serial f32
 * sum, so it stays within a few ulp of the CPU's double sum; the
 * normalizer is then formed in double and rounded once, like the CPU.
 * l2norm's reduction by row length is hk_conv.cu's fused GDN input path's
 * too (HK_WROW_MAX), which gives this kernel's bits.
 *
 * The _bf16 entries write y rounded to bf16 (nearest even) instead: the
 * same kernels with another store, so y is the f32 kernel's rounded, bit
 * for bit: the input of a bf16 projection (hk_cuda_matmul_bf16 with x
 * NULL) without an f32 copy written and read back.
 *
 * hk_cuda_qk_norm_rope is a gated attention layer's prologue in one
 * launch: a block a token builds its RoPE table once, then a warp a head
 * (HK_QK_WARPS warps, each over every HK_QK_WARPS-th head) splits a q head
 * from its gate, RMS-norms it (or a k head, in place) as the warp kernel
 * above does (hk_rms_row) and rotates its pairs (hk_rope_pair): the
 * split, the two norms' and the two RoPEs' results bit for bit (a row's
 * sums do not depend on its fragments), in one launch where there were
 * five.
 *
 * SwiGLU: 16 bytes of g and of u a thread (4 f32 or 8 bf16) where the
 * pointers are aligned, the rest one element a thread; elementwise, so the
 * bits do not depend on the split; silu's division by __fdividef
 * (hk_math_silu_fast: within 2 ulp of the CPU's).
 */
#include "kernels/cuda/hk_cuda_impl.h"

/* Rows of rmsnorm a warp norms (HK_NORM_WARPS rows a block); up to
 * HK_NORM_BLOCK_MAX a block holding the row in registers (8 chunks of
 * HK_ROW_THREADS float4s). */
#define HK_NORM_WARP_MAX  1024
#define HK_NORM_WARPS     8
#define HK_NORM_BLOCK_MAX (8 * HK_FRAG_VEC * HK_ROW_THREADS)

/* 1 / rms of a row whose squares sum to ss (in double, rounded once). */
static __device__ __forceinline__ float hk_rms_inv(float ss, int dim, float eps)
{
    return (float)(1.0 / sqrt((double)ss / dim + eps));
}

/* An output element of rmsnorm (gated: rmsnorm_gated), the CPU's
 * expression. */
template <bool GATED>
static __device__ __forceinline__ float hk_rms_elem(float x, float inv, float w,
                                                    float z)
{
    return GATED ? w * (x * inv) * hk_math_silu(z) : x * inv * (1.0f + w);
}

/* The group sums of hk_rms_row: a warp's, or a block's (sh: 32 floats). */
struct hk_sum_warp {
    __device__ float operator()(float s) const { return hk_warp_sum(s); }
};
struct hk_sum_block {
    float *sh;
    __device__ float operator()(float s) const { return hk_block_sum(s, sh); }
};

/* Row x normed into y by a group of G threads (thread lane of it) holding
 * it as fragments; z: the gate (GATED). y may alias x: each element is
 * read, then written, by one thread, and the sum has read the row first. */
template <int NC, bool GATED, class Y, class Sum>
static __device__ __forceinline__ void
hk_rms_row(Y *y, const float *x, const float *z, const float *w, int dim,
           float eps, int lane, int G, bool vec, Sum sum)
{
    hk_frag<NC> f, wf, zf;
    hk_frag_load(f, x, dim, lane, G, vec);
    if (GATED)
        hk_frag_load(zf, z, dim, lane, G, vec);
    hk_frag_load(wf, w, dim, lane, G, vec);
    const float inv = hk_rms_inv(sum(hk_frag_sumsq(f)), dim, eps);
#pragma unroll
    for (int c = 0; c < NC; c++)
#pragma unroll
        for (int e = 0; e < HK_FRAG_VEC; e++)
            f.v[c][e] = hk_rms_elem<GATED>(f.v[c][e], inv, wf.v[c][e],
                                           GATED ? zf.v[c][e] : 0.0f);
    hk_frag_store(y, f, dim, lane, G, vec);
}

/* A warp a row (dim <= HK_NORM_WARP_MAX); z: GATED only. */
template <int NC, bool GATED, class Y>
static __global__ void __launch_bounds__(HK_NORM_WARPS * 32)
    hk_rmsnorm_warp_kernel(Y *y, const float *x, const float *z, const float *w,
                           int rows, int dim, float eps, bool vec)
{
    const long long r =
        (long long)blockIdx.x * HK_NORM_WARPS + (threadIdx.x >> 5);
    if (r >= rows) /* the whole warp */
        return;
    const size_t o = (size_t)r * dim;
    hk_rms_row<NC, GATED>(y + o, x + o, GATED ? z + o : z, w, dim, eps,
                          threadIdx.x & 31, 32, vec, hk_sum_warp());
}

/* A block of HK_ROW_THREADS a row, held in registers
 * (dim <= HK_NORM_BLOCK_MAX). */
template <int NC, bool GATED, class Y>
static __global__ void __launch_bounds__(HK_ROW_THREADS)
    hk_rmsnorm_block_kernel(Y *y, const float *x, const float *z,
                            const float *w, int dim, float eps, bool vec)
{
    __shared__ float sh[32];
    const size_t o = (size_t)blockIdx.x * dim;
    hk_rms_row<NC, GATED>(y + o, x + o, GATED ? z + o : z, w, dim, eps,
                          threadIdx.x, HK_ROW_THREADS, vec, hk_sum_block{sh});
}

/* Any dim: a block a row, strided, x read again for the output (y may
 * alias x: each element is read, then written, by the same thread, after
 * the reduction has read the whole row). */
template <bool GATED, class Y>
static __global__ void hk_rmsnorm_kernel(Y *y, const float *x, const float *z,
                                         const float *w, int dim, float eps)
{
    __shared__ float sh[32];
    const size_t o = (size_t)blockIdx.x * dim;
    const float *xr = x + o;
    Y *yr = y + o;
    const float inv = hk_rms_inv(hk_row_sumsq(xr, dim, sh), dim, eps);
    for (int i = threadIdx.x; i < dim; i += blockDim.x)
        hk_put(yr, i,
               hk_rms_elem<GATED>(xr[i], inv, w[i], GATED ? z[o + i] : 0.0f));
}

/* l2norm of rows of dim <= HK_WROW_MAX: a warp a row, in place. */
template <int NC>
static __global__ void __launch_bounds__(HK_NORM_WARPS * 32)
    hk_l2norm_warp_kernel(float *x, int rows, int dim, float eps, float scale,
                          bool vec)
{
    const long long r =
        (long long)blockIdx.x * HK_NORM_WARPS + (threadIdx.x >> 5);
    const int lane = threadIdx.x & 31;
    if (r >= rows) /* the whole warp */
        return;
    float *xr = x + (size_t)r * dim;
    hk_frag<NC> f;
    hk_frag_load(f, xr, dim, lane, 32, vec);
    hk_wrow_l2norm(f, eps, scale);
    hk_frag_store(xr, f, dim, lane, 32, vec);
}

/* Longer rows: a block a row. */
static __global__ void hk_l2norm_kernel(float *x, // [rows, dim], in place
                                        int dim, float eps, float scale)
{
    __shared__ float sh[32];
    float *xr = x + (size_t)blockIdx.x * dim;
    const float ss = hk_row_sumsq(xr, dim, sh);
    const float f = hk_l2_factor(ss, eps, scale);
    for (int i = threadIdx.x; i < dim; i += blockDim.x)
        xr[i] *= f;
}

/* 16 bytes of x (4 f32, or 8 bf16 widened exactly) into f. */
static __device__ __forceinline__ void hk_load16(float (&f)[4], const float *x)
{
    const float4 q = *(const float4 *)x;
    f[0] = q.x;
    f[1] = q.y;
    f[2] = q.z;
    f[3] = q.w;
}
static __device__ __forceinline__ void hk_load16(float (&f)[8],
                                                 const uint16_t *x)
{
    const uint4 q = *(const uint4 *)x;
    const uint32_t wd[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
    for (int j = 0; j < 4; j++) {
        f[2 * j] = hk_bf16_to_f32((uint16_t)(wd[j] & 0xffffu));
        f[2 * j + 1] = hk_bf16_to_f32((uint16_t)(wd[j] >> 16));
    }
}

/* An input element as f32 (bf16 widened exactly). */
static __device__ __forceinline__ float hk_get(const float *x, size_t i)
{
    return x[i];
}
static __device__ __forceinline__ float hk_get(const uint16_t *x, size_t i)
{
    return hk_bf16_to_f32(x[i]);
}

/* y may alias g or u: each element is read, then written, by one thread.
 * vec: groups of V = 16 / sizeof(X) elements (one 16-byte load of g and
 * of u, one store), then the last n % V one a thread; else one a thread. */
template <class Y, class X>
static __global__ void hk_swiglu_kernel(Y *y,       // [n]
                                        const X *g, // [n]
                                        const X *u, // [n]
                                        size_t n, bool vec)
{
    constexpr int V = 16 / sizeof(X);
    const size_t nv = vec ? n / V : 0;
    HK_GRID_STRIDE(j, nv)
    {
        float gf[V], uf[V];
        hk_load16(gf, g + j * V);
        hk_load16(uf, u + j * V);
#pragma unroll
        for (int e = 0; e < V; e++)
            gf[e] = hk_math_silu_fast(gf[e]) * uf[e];
        hk_store_n<V>(y + j * V, gf);
    }
    HK_GRID_STRIDE(i, n - nv * V)
    {
        const size_t k = nv * V + i;
        hk_put(y, k, hk_math_silu_fast(hk_get(g, k)) * hk_get(u, k));
    }
}

static int hk_norm_args_ok(int rows, int dim)
{
    return rows >= 0 && dim > 0;
}

/* The warp kernel of NC chunks. */
template <int NC, bool GATED, class Y>
static void hk_rmsnorm_warps(Y *y, const float *x, const float *z,
                             const float *w, int rows, int dim, float eps,
                             bool vec, cudaStream_t s)
{
    hk_rmsnorm_warp_kernel<NC, GATED>
        <<<HK_CEIL_DIV(rows, HK_NORM_WARPS), HK_NORM_WARPS * 32, 0, s>>>(
            y, x, z, w, rows, dim, eps, vec);
}

/* The block kernel of NC chunks. */
template <int NC, bool GATED, class Y>
static void hk_rmsnorm_blocks(Y *y, const float *x, const float *z,
                              const float *w, int rows, int dim, float eps,
                              bool vec, cudaStream_t s)
{
    hk_rmsnorm_block_kernel<NC, GATED>
        <<<rows, HK_ROW_THREADS, 0, s>>>(y, x, z, w, dim, eps, vec);
}

/* rmsnorm_zc (z NULL) or rmsnorm_gated, by row length (file comment). */
template <bool GATED, class Y>
static int hk_rmsnorm(Y *y, const float *x, const float *z, const float *w,
                      int rows, int dim, float eps, void *stream)
{
    if (!hk_norm_args_ok(rows, dim))
        return HK_CUDA_EINVAL;
    if (rows == 0)
        return HK_CUDA_OK;
    const cudaStream_t s = hk_stream(stream);
    const bool vec = dim % HK_FRAG_VEC == 0 && hk_aligned(x, 16) &&
                     hk_aligned(w, 16) && (!GATED || hk_aligned(z, 16)) &&
                     hk_aligned(y, HK_FRAG_VEC * sizeof(Y));
    if (dim <= HK_NORM_WARP_MAX) {
        hk_frag_dispatch(hk_frag_chunks(dim, 32), [&](auto nc) {
            hk_rmsnorm_warps<decltype(nc)::value, GATED>(y, x, z, w, rows, dim,
                                                         eps, vec, s);
        });
    } else if (dim <= HK_NORM_BLOCK_MAX) {
        /* 2 chunks at least: past HK_NORM_WARP_MAX */
        hk_frag_dispatch(hk_frag_chunks(dim, HK_ROW_THREADS), [&](auto nc) {
            hk_rmsnorm_blocks<decltype(nc)::value, GATED>(y, x, z, w, rows, dim,
                                                          eps, vec, s);
        });
    } else {
        hk_rmsnorm_kernel<GATED>
            <<<rows, HK_ROW_THREADS, 0, s>>>(y, x, z, w, dim, eps);
    }
    return hk_cuda_check_launch();
}

extern "C" int hk_cuda_rmsnorm_zc(float *y, const float *x, const float *w,
                                  int rows, int dim, float eps, void *stream)
{
    return hk_rmsnorm<false>(y, x, NULL, w, rows, dim, eps, stream);
}

extern "C" int hk_cuda_rmsnorm_zc_bf16(uint16_t *y, const float *x,
                                       const float *w, int rows, int dim,
                                       float eps, void *stream)
{
    return hk_rmsnorm<false>(y, x, NULL, w, rows, dim, eps, stream);
}

extern "C" int hk_cuda_rmsnorm_gated(float *y, const float *x, const float *z,
                                     const float *w, int rows, int dim,
                                     float eps, void *stream)
{
    return hk_rmsnorm<true>(y, x, z, w, rows, dim, eps, stream);
}

extern "C" int hk_cuda_rmsnorm_gated_bf16(uint16_t *y, const float *x,
                                          const float *z, const float *w,
                                          int rows, int dim, float eps,
                                          void *stream)
{
    return hk_rmsnorm<true>(y, x, z, w, rows, dim, eps, stream);
}

/* Warps of the fused attention prologue's block (a token). */
#define HK_QK_WARPS 8

/* Token blockIdx.x's heads (file comment): slot s < Hq a q head of P
 * (split from its gate), else k head s - Hq, in place; rows of hd <=
 * NC HK_FRAG_VEC 32. */
template <int NC>
static __global__ void __launch_bounds__(HK_QK_WARPS * 32)
    hk_qk_norm_rope_kernel(float *q, float *gate, float *k, const float *P,
                           const float *qw, const float *kw, const int *pos,
                           int Hq, int Hkv, int hd, int rot, double theta,
                           float eps, bool vec)
{
    __shared__ float cs[HK_ROPE_MAX_ROT / 2], sn[HK_ROPE_MAX_ROT / 2];
    const int t = blockIdx.x, h2 = rot / 2, lane = threadIdx.x & 31;
    hk_rope_table(cs, sn, (double)pos[t], h2, rot, theta);
    __syncthreads();
    for (int s = threadIdx.x >> 5; s < Hq + Hkv; s += HK_QK_WARPS) {
        float *row;
        if (s < Hq) {
            const size_t r = (size_t)t * Hq + s;
            const float *src = P + 2 * r * hd;
            row = q + r * hd;
            for (int i = lane; i < hd; i += 32)
                gate[r * hd + i] = src[hd + i];
            hk_rms_row<NC, false>(row, src, NULL, qw, hd, eps, lane, 32, vec,
                                  hk_sum_warp());
        } else {
            row = k + ((size_t)t * Hkv + s - Hq) * hd;
            hk_rms_row<NC, false>(row, row, NULL, kw, hd, eps, lane, 32, vec,
                                  hk_sum_warp());
        }
        __syncwarp(); /* the normed row, every lane's part, before its pairs */
        for (int i = lane; i < h2; i += 32)
            hk_rope_pair(row + i, h2, cs[i], sn[i]);
    }
}

extern "C" int hk_cuda_qk_norm_rope(float *q, float *gate, float *k,
                                    const float *P, const float *qw,
                                    const float *kw, const int *pos, int T,
                                    int Hq, int Hkv, int hd, int rot,
                                    double theta, float eps, void *stream)
{
    static_assert(HK_CUDA_QK_MAX_HD <= HK_NORM_WARP_MAX,
                  "a warp norms each head (hk_rms_row)");
    if (T < 0 || Hq < 1 || Hkv < 0 || hd < 1 || hd > HK_CUDA_QK_MAX_HD ||
        rot < 0 || rot % 2 || rot > hd || rot > HK_ROPE_MAX_ROT ||
        !(theta > 0.0) || (T > 0 && !pos))
        return HK_CUDA_EINVAL;
    if (T == 0)
        return HK_CUDA_OK;
    const bool vec = hd % HK_FRAG_VEC == 0 && hk_aligned(P, 16) &&
                     hk_aligned(q, 16) && hk_aligned(k, 16) &&
                     hk_aligned(qw, 16) && (!Hkv || hk_aligned(kw, 16));
    const cudaStream_t s = hk_stream(stream);
    hk_frag_dispatch(hk_frag_chunks(hd, 32), [&](auto nc) {
        hk_qk_norm_rope_kernel<decltype(nc)::value>
            <<<T, HK_QK_WARPS * 32, 0, s>>>(q, gate, k, P, qw, kw, pos, Hq, Hkv,
                                            hd, rot, theta, eps, vec);
    });
    return hk_cuda_check_launch();
}

extern "C" int hk_cuda_l2norm(float *x, int rows, int dim, float eps,
                              float scale, void *stream)
{
    if (!hk_norm_args_ok(rows, dim))
        return HK_CUDA_EINVAL;
    if (rows == 0)
        return HK_CUDA_OK;
    const cudaStream_t s = hk_stream(stream);
    const bool vec = dim % HK_FRAG_VEC == 0 && hk_aligned(x, 16);
    const int blocks = HK_CEIL_DIV(rows, HK_NORM_WARPS);
    if (dim > HK_WROW_MAX)
        hk_l2norm_kernel<<<rows, HK_ROW_THREADS, 0, s>>>(x, dim, eps, scale);
    else if (hk_frag_chunks(dim, 32) == 1)
        hk_l2norm_warp_kernel<1><<<blocks, HK_NORM_WARPS * 32, 0, s>>>(
            x, rows, dim, eps, scale, vec);
    else
        hk_l2norm_warp_kernel<2><<<blocks, HK_NORM_WARPS * 32, 0, s>>>(
            x, rows, dim, eps, scale, vec);
    return hk_cuda_check_launch();
}

template <class Y, class X>
static int hk_swiglu(Y *y, const X *g, const X *u, size_t n, void *stream)
{
    if (n == 0)
        return HK_CUDA_OK;
    constexpr size_t V = 16 / sizeof(X);
    const bool vec =
        hk_aligned(g, 16) && hk_aligned(u, 16) && hk_aligned(y, V * sizeof(Y));
    const size_t work = vec ? n / V + n % V : n;
    hk_swiglu_kernel<<<hk_grid_1d(work, HK_ROW_THREADS), HK_ROW_THREADS, 0,
                       hk_stream(stream)>>>(y, g, u, n, vec);
    return hk_cuda_check_launch();
}

extern "C" int hk_cuda_swiglu(float *y, const float *g, const float *u,
                              size_t n, void *stream)
{
    return hk_swiglu(y, g, u, n, stream);
}

extern "C" int hk_cuda_swiglu_bf16(uint16_t *y, const float *g, const float *u,
                                   size_t n, void *stream)
{
    return hk_swiglu(y, g, u, n, stream);
}

extern "C" int hk_cuda_swiglu_bf16_in(uint16_t *y, const uint16_t *g,
                                      const uint16_t *u, size_t n, void *stream)
{
    return hk_swiglu(y, g, u, n, stream);
}
