/*
 * hk_cuda_impl.h - private helpers of the CUDA kernels (.cu files only):
 * launch checks that return status codes, warp reductions, grid sizes.
 * Not part of the C interface (hk_cuda.h).
 */
#ifndef HK_CUDA_IMPL_H
#define HK_CUDA_IMPL_H

#ifndef __CUDACC__
#error "hk_cuda_impl.h is for .cu files compiled by nvcc"
#endif

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <type_traits>

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "kernels/common/hk_bf16.h"
#include "kernels/common/hk_math.h"
#include "kernels/common/hk_select.h"
#include "kernels/cuda/hk_cuda.h"

#define HK_CEIL_DIV(a, b) (((a) + (b)-1) / (b))
/* Largest gridDim.y / gridDim.z. */
#define HK_CUDA_MAX_GRID_YZ 65535
#define HK_FULL_MASK        0xffffffffu

/* Dynamic shared memory of a kernel, as a byte array (the host emulator
 * defines its own). Launches over 48 KB need
 * cudaFuncSetAttribute(MaxDynamicSharedMemorySize) first. */
#ifndef HK_DYNAMIC_SMEM
#define HK_DYNAMIC_SMEM(name)                                                  \
    extern __shared__ __align__(128) unsigned char name[]
#endif

/* hk_attention_tc.cu: the tensor-core attention prefill (split: bf16
 * hi + lo operands, else bf16 once); HK_CUDA_EINVAL where it cannot run
 * (hd, shared memory). Arguments checked by hk_cuda_attention_impl. */
int hk_attention_tc(int split, float *o, const float *q, const int *qpos,
                    const float *k, const float *v, int T, int Hq, int Hkv,
                    int hd, float scale, cudaStream_t stream);

/* hk_attention_tc.cu: FLASH2, the FlashAttention-2-style prefill on bf16
 * operands (split: FLASH2X, bf16 hi + lo operands); scratch (16-byte
 * aligned): hk_attention_f2_scratch floats for the bf16 copies of k and v
 * (split: and their lo halves; 0: hd too wide), then the partials of a
 * call split over the keys (any call of at most T queries over at most N
 * keys; hk_attention_f2_splits: the splits of one, 1 for none).
 * HK_CUDA_EINVAL where it cannot run. Arguments checked by
 * hk_cuda_attention_ex. */
size_t hk_attention_f2_scratch(int split, int T, int N, int Hq, int Hkv,
                               int hd);
int hk_attention_f2_splits(int split, int T, int N, int Hq, int Hkv, int hd);
int hk_attention_f2(int split, float *o, const float *q, const int *qpos,
                    const float *k, const float *v, int T, int N, int Hq,
                    int Hkv, int hd, float scale, float *scratch,
                    cudaStream_t stream);

/* hk_attention.cu: o [rows, hd] = the softmax of nsplit partials per row
 * (part [rows, nsplit, 2 + hd]: m in natural units, l, unnormalized o),
 * flash-decoding's second launch; FLASH2's split-KV uses it too. */
int hk_att_combine(float *o, const float *part, long long rows, int hd,
                   int nsplit, cudaStream_t stream);

/* hk_attention_wg.cu: FLASH3, the prefill on Hopper's wgmma (bf16
 * operands), of kind HK_F3_SEQ (FLASH3_SEQ), HK_F3_OV (FLASH3: the next
 * tile's scores issued before this tile's softmax) or HK_F3_WS
 * (FLASH3_WS: a producer warp, the warpgroups in turns); scratch (16-byte
 * aligned):
 * hk_attention_f3_scratch floats for the bf16 tiles of k and v (0: hd too
 * wide), then split-KV's partials (any call of at most T queries over at
 * most N keys; hk_attention_f3_splits: the splits of one).
 * HK_CUDA_EINVAL where it cannot run (not a compute capability 9.0
 * device, shared memory). Arguments checked by hk_cuda_attention_ex. */
size_t hk_attention_f3_scratch(int T, int N, int Hq, int Hkv, int hd);
int hk_attention_f3_splits(int T, int N, int Hq, int Hkv, int hd);
#define HK_F3_SEQ 0
#define HK_F3_OV  1
#define HK_F3_WS  2
int hk_attention_f3(int kind, float *o, const float *q, const int *qpos,
                    const float *k, const float *v, int T, int N, int Hq,
                    int Hkv, int hd, float scale, float *scratch,
                    cudaStream_t stream);

/* The rows of the tensor-core attention prefills (FLASH, FLASH2, FLASH3):
 * the rows of kv group g are its (query, head) pairs, head fastest (row R
 * is query R / r, head g r + R % r, r = Hq / Hkv), so every K/V tile a
 * block stages serves all the group's heads; the grid's x runs blocks of
 * M rows latest first (the most keys), y the kv groups. */
struct hk_att_rows {
    long long R0, rows; /* the block's first row; the group's rows */
    int r, g, Hq, hd;
    __device__ hk_att_rows(int M, int T, int Hq_, int Hkv, int hd_)
        : R0((long long)(gridDim.x - 1 - blockIdx.x) * M),
          rows((long long)T * (Hq_ / Hkv)), r(Hq_ / Hkv), g((int)blockIdx.y),
          Hq(Hq_), hd(hd_)
    {
    }
    /* Offset of the block's row rr in q and o; -1 past the last row. */
    __device__ long long off(int rr) const
    {
        const long long R = R0 + rr;
        if (R >= rows)
            return -1;
        return ((R / r) * Hq + (long long)g * r + R % r) * hd;
    }
    /* The keys row rr sees (its qpos + 1; 0 past the last row). */
    __device__ int keys(const int *qpos, int rr) const
    {
        const long long R = R0 + rr;
        return R < rows ? qpos[R / r] + 1 : 0;
    }
};

/* The head dim the register-fragment prefills (FLASH2, FLASH3) pad hd to:
 * 64, 128 or 256 (0: too wide). */
static inline int hk_att_tc_hd(int hd)
{
    return hd <= 64 ? 64 : hd <= 128 ? 128 : hd <= 256 ? 256 : 0;
}

/* The errors that leave the context unusable (CUDA calls them sticky):
 * every later call of the process returns them. */
static inline int hk_cuda_sticky(cudaError_t e)
{
    switch (e) {
    case cudaErrorIllegalAddress:
    case cudaErrorLaunchFailure:
    case cudaErrorIllegalInstruction:
    case cudaErrorMisalignedAddress:
    case cudaErrorInvalidAddressSpace:
    case cudaErrorInvalidPc:
    case cudaErrorHardwareStackError:
    case cudaErrorAssert:
    case cudaErrorECCUncorrectable:
        return 1;
    default:
        return 0;
    }
}

/* Every launch is followed by this: a launch error (bad configuration, no
 * device, missing kernel image for this GPU) becomes a status code, never
 * an exit. Asynchronous faults surface at the caller's next sync, or here
 * once an earlier one has. */
static inline int hk_cuda_check_launch(void)
{
    cudaError_t e = cudaGetLastError();
    if (e == cudaSuccess)
        return HK_CUDA_OK;
    if (e == cudaErrorNoDevice || e == cudaErrorInsufficientDriver)
        return HK_CUDA_ENODEV;
    return hk_cuda_sticky(e) ? HK_CUDA_EFAULT : HK_CUDA_ELAUNCH;
}

static inline int hk_cuda_status(cudaError_t e)
{
    if (hk_cuda_sticky(e))
        return HK_CUDA_EFAULT;
    switch (e) {
    case cudaSuccess:
        return HK_CUDA_OK;
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
        return HK_CUDA_ENODEV;
    case cudaErrorMemoryAllocation:
        return HK_CUDA_ENOMEM;
    case cudaErrorInvalidValue:
        return HK_CUDA_EINVAL;
    default:
        return HK_CUDA_ERUNTIME;
    }
}

/* The largest dynamic shared memory a block of the current device may
 * opt in to (48 KB when the device cannot say). */
static inline int hk_cuda_smem_optin(void)
{
    int dev = 0, v = 0;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&v, cudaDevAttrMaxSharedMemoryPerBlockOptin,
                               dev) != cudaSuccess)
        return 48 * 1024;
    return v;
}

/* The current device's compute capability, major 10 + minor (0 where it
 * cannot say). */
static inline int hk_cuda_cc(void)
{
    int dev = 0, ma = 0, mi = 0;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&ma, cudaDevAttrComputeCapabilityMajor, dev) !=
            cudaSuccess ||
        cudaDeviceGetAttribute(&mi, cudaDevAttrComputeCapabilityMinor, dev) !=
            cudaSuccess)
        return 0;
    return ma * 10 + mi;
}

/* The current device's SM count (fallback where it cannot say). */
static inline int hk_cuda_sm_count(int fallback)
{
    int dev = 0, sms = 0;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) !=
            cudaSuccess ||
        sms < 1)
        return fallback;
    return sms;
}

/* Split-KV of the register-fragment prefills (FLASH2, FLASH3): a short
 * prompt over a long cache has fewer row blocks than a wave; each block's
 * key tiles then go to nsplit blocks (grid z), whose partial softmaxes
 * hk_att_combine makes o of. A split takes at least HK_ATT_SPLIT_KEYS keys
 * (its partials, 2 + hd floats a row, cost about what 128 keys of K/V
 * do), a block's keys at most HK_ATT_MAX_SPLIT splits. */
#define HK_ATT_SPLIT_KEYS 128
#define HK_ATT_MAX_SPLIT  64

/* The splits of a call of T queries over N keys by a kernel of M rows a
 * block and per_sm blocks per SM: enough blocks for one wave, 1 where the
 * row blocks fill it. */
static inline int hk_att_splits(int per_sm, int M, long long T, int N, int Hq,
                                int Hkv)
{
    const long long blocks = (T * (Hq / Hkv) + M - 1) / M * (long long)Hkv;
    const long long wave = (long long)per_sm * hk_cuda_sm_count(1);
    if (blocks < 1 || blocks >= wave)
        return 1;
    long long s = wave / blocks;
    s = s < N / HK_ATT_SPLIT_KEYS ? s : N / HK_ATT_SPLIT_KEYS;
    s = s < HK_ATT_MAX_SPLIT ? s : HK_ATT_MAX_SPLIT;
    return s > 1 ? (int)s : 1;
}

/* Floats of partials the splits of any call of at most T queries over N
 * keys write: T' Hq nsplit(T') (2 + hd), largest over T' <= T (the split
 * count falls as T' grows, so the largest T' of each count of row blocks
 * is the one to check, up to a wave's blocks). */
static inline size_t hk_att_part_floats(int per_sm, int M, int T, int N, int Hq,
                                        int Hkv, int hd)
{
    const long long r = Hq / Hkv;
    size_t most = 0;
    for (long long nb = 1;; nb++) {
        const long long t = nb * M / r < T ? nb * M / r : T;
        if (t < 1)
            continue;
        const int ns = hk_att_splits(per_sm, M, t, N, Hq, Hkv);
        const size_t f = ns > 1 ? (size_t)t * Hq * ns * (2 + (size_t)hd) : 0;
        most = f > most ? f : most;
        if (t == T || ns == 1)
            break;
    }
    return most;
}

/* The kernel an environment variable names (HYPIC_CUDA_ATT, _STEP,
 * _KVBUF): values[i] where names[i] is its value, else dflt (unset or
 * unknown). n pairs. Callers read it once, into a local static. */
static inline int hk_env_choice(const char *var, const char *const *names,
                                const int *values, int n, int dflt)
{
    const char *e = getenv(var);
    for (int i = 0; e && i < n; i++)
        if (!strcmp(e, names[i]))
            return values[i];
    return dflt;
}

/* Counts a copy across the host link and its bytes (hk_cuda_host_bytes,
 * hk_cuda_host_copies). */
void hk_note_host_bytes(size_t bytes);
/* The host's monotonic clock, ns. */
uint64_t hk_host_ns(void);
/* A host wait on the device that began at hk_host_ns() t0 ends: timed
 * into hk_cuda_wait_ns, and counted in hk_cuda_sync_count when counted
 * (the staging ring's waits are not: a step's count stays flat). */
void hk_wait_end(uint64_t t0, bool counted);

static inline cudaStream_t hk_stream(void *s)
{
    return (cudaStream_t)s;
}

/* Offsets of n regions of sz[i] bytes laid end to end, each starting on an
 * `align` boundary; returns the total. */
static inline __host__ __device__ size_t hk_layout(const size_t *sz, int n,
                                                   size_t align, size_t *off)
{
    size_t at = 0;
    for (int i = 0; i < n; i++) {
        off[i] = at;
        at += (sz[i] + align - 1) / align * align;
    }
    return at;
}

/* ---- where the decode ops find request b's K/V row j ----------------------
 * Rows are Hkv * hd floats; the kernels add b's base pointer (k(b), v(b))
 * and row(b, j) rows. F is float (the store) or const float (attention).
 * Templates, so each kernel has one body for every layout. */

/* One array for all (prefill: b is ignored). */
template <typename F> struct hk_kv_flat {
    F *kp, *vp;
    __device__ F *k(int) const { return kp; }
    __device__ F *v(int) const { return vp; }
    __device__ size_t row(int, int j) const { return (size_t)j; }
};

/* Each request its own cache: kcs, vcs device arrays of B pointers. */
template <typename F> struct hk_kv_own {
    F *const *kcs, *const *vcs;
    __device__ F *k(int b) const { return kcs[b]; }
    __device__ F *v(int b) const { return vcs[b]; }
    __device__ size_t row(int, int j) const { return (size_t)j; }
};

/* Pages of 2^shift positions in two arenas [page][P][Hkv][hd]; position
 * j of request b is row j mod P of page table[b * max_pages + j / P].
 * Rows j..j + P - 1 - (j mod P) are consecutive (the kernels read keys
 * in aligned runs of a power of two <= P and look a run's page up once). */
template <typename F> struct hk_kv_paged {
    F *kp, *vp;
    const int *table;
    int max_pages, shift;
    __device__ F *k(int) const { return kp; }
    __device__ F *v(int) const { return vp; }
    __device__ size_t row(int b, int j) const
    {
        const int page = table[(size_t)b * max_pages + (j >> shift)];
        return ((size_t)page << shift) + (size_t)(j & ((1 << shift) - 1));
    }
};

/* log2 P for a page size the paged ops take (a power of two from
 * HK_CUDA_PAGE_MIN to HK_CUDA_PAGE_MAX), else -1. */
static inline int hk_page_shift(int P)
{
    if (P < HK_CUDA_PAGE_MIN || P > HK_CUDA_PAGE_MAX || (P & (P - 1)))
        return -1;
    int s = 0;
    while ((1 << s) < P)
        s++;
    return s;
}

/* The handle behind hk_cuda_blas_t (hk_matmul.cu creates it). */
struct hk_cuda_blas {
    cublasHandle_t h;
};

/* The side streams behind hk_cuda_lanes_t (hk_lanes.cu): lane 0 of the
 * device's highest priority, 1 of a middle one, 2 of its lowest; event
 * HK_LANE_FORK forks them from a caller's stream, HK_LANE_JOIN + i joins
 * lane i back, and the others pass a step's end from one lane to another
 * (hk_lanes_pass). */
#define HK_LANES       3
#define HK_LANE_FORK   0
#define HK_LANE_JOIN   1
#define HK_LANE_PASS   (HK_LANE_JOIN + HK_LANES)
#define HK_LANE_NPASS  2
#define HK_LANE_EVENTS (HK_LANE_PASS + HK_LANE_NPASS)
struct hk_cuda_lanes {
    cudaStream_t s[HK_LANES];
    cudaEvent_t ev[HK_LANE_EVENTS];
};
/* Every lane waits for the work issued on `from` so far. */
int hk_lanes_fork(hk_cuda_lanes *l, cudaStream_t from);
/* Lane `to` waits for the work issued on lane `from` so far, through
 * hand-off event i (< HK_LANE_NPASS; free again once this returns). */
int hk_lanes_pass(hk_cuda_lanes *l, int i, int from, int to);
/* Stream `to` waits for the work issued on every lane so far. */
int hk_lanes_join(hk_cuda_lanes *l, cudaStream_t to);

/* Blocks of a grid-stride loop over n elements: enough to fill any current
 * GPU, capped so the grid size never overflows for huge n. */
static inline unsigned hk_grid_1d(size_t n, int threads)
{
    size_t b = (n + (size_t)threads - 1) / (size_t)threads;
    return (unsigned)(b > 65536 ? 65536 : (b ? b : 1));
}

/* Sum over the 32 lanes of a warp; every lane gets the result. The xor
 * butterfly adds in the same order on every lane, so all lanes agree. */
static __device__ __forceinline__ float hk_warp_sum(float x)
{
    for (int off = 16; off > 0; off >>= 1)
        x += __shfl_xor_sync(HK_FULL_MASK, x, off);
    return x;
}

/* Sum over a block of blockDim.x threads (a multiple of 32, <= 1024);
 * every thread gets the result. sh: 32 floats of shared memory, reused on
 * the next call only after the __syncthreads at its end. */
static __device__ __forceinline__ float hk_block_sum(float x, float *sh)
{
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int nw = blockDim.x >> 5;
    x = hk_warp_sum(x);
    if (lane == 0)
        sh[warp] = x;
    __syncthreads();
    float t = lane < nw ? sh[lane] : 0.0f;
    t = hk_warp_sum(t);
    __syncthreads();
    return t;
}

/* A grid-stride loop over n elements, for grids sized by hk_grid_1d. */
#define HK_GRID_STRIDE(i, n)                                                   \
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n);    \
         i += (size_t)gridDim.x * blockDim.x)

/* Body of a launcher of one grid-stride kernel over n elements: nothing to
 * do for n = 0, else launch and return the launch check. */
#define HK_LAUNCH_1D(kernel, n, threads, stream, ...)                          \
    do {                                                                       \
        if ((n) == 0)                                                          \
            return HK_CUDA_OK;                                                 \
        kernel<<<hk_grid_1d((n), (threads)), (threads), 0,                     \
                 hk_stream(stream)>>>(__VA_ARGS__);                            \
        return hk_cuda_check_launch();                                         \
    } while (0)

/* The threads of a block that norms a row (hk_norm.cu; hk_conv.cu's fused
 * GDN input path): one count, so both reduce a row in the same tree. */
#define HK_ROW_THREADS 256

/* The sum of squares of x[0..dim) over a block: f32 per thread (elements
 * tid, tid + blockDim, ...), then hk_block_sum's tree. */
static __device__ __forceinline__ float hk_row_sumsq(const float *x, int dim,
                                                     float *sh)
{
    float ss = 0.0f;
    for (int i = threadIdx.x; i < dim; i += blockDim.x)
        ss += x[i] * x[i];
    return hk_block_sum(ss, sh);
}

/* Whether p is on an a-byte boundary (vector loads and stores). */
static __host__ __device__ __forceinline__ bool hk_aligned(const void *p,
                                                           size_t a)
{
    return ((uintptr_t)p & (a - 1)) == 0;
}

/* ---- RoPE (hk_rope.cu; hk_norm.cu's fused attention prologue) ------------
 * Rotate-half pairs (i, i + rot/2) of a head, angle p theta^(-2i/rot). */
#define HK_ROPE_MAX_ROT 1024

/* Position p's cos and sin table, entries i < h2 = rot/2 by the block's
 * threads: angle, cos and sin in double, rounded once to float, as the
 * CPU. The caller syncs the block before reading it. */
static __device__ __forceinline__ void
hk_rope_table(float *cs, float *sn, double p, int h2, int rot, double theta)
{
    for (int i = threadIdx.x; i < h2; i += blockDim.x) {
        const double phi = hk_math_rope_angle(p, i, rot, theta);
        cs[i] = (float)cos(phi);
        sn[i] = (float)sin(phi);
    }
}

/* Pair (a[0], a[h2]) rotated by (c, s) in place: every RoPE kernel's one
 * expression, so they agree bit for bit. */
static __device__ __forceinline__ void hk_rope_pair(float *a, int h2, float c,
                                                    float s)
{
    const float x0 = a[0], x1 = a[h2];
    a[0] = x0 * c - x1 * s;
    a[h2] = x1 * c + x0 * s;
}

/* ---- row fragments ---------------------------------------------------------
 * A row x[0, dim) spread over a group of G threads (a warp, G = 32, or a
 * block): thread `lane` holds NC chunks of HK_FRAG_VEC consecutive
 * elements, chunk c holding x[c HK_FRAG_VEC G + HK_FRAG_VEC lane + e],
 * e < HK_FRAG_VEC, 0 past dim. With vec (HK_FRAG_VEC | dim, every row
 * pointer 16-byte aligned) a chunk is one float4 access; without, the same
 * elements one by one, so the layout, and every sum over it, is the same
 * either way. */
#define HK_FRAG_VEC 4
template <int NC> struct hk_frag {
    float v[NC][HK_FRAG_VEC];
};

/* The chunks a row of dim needs in a group of G threads: 1, 2, 4 or 8
 * (more than 8: 16, which no caller instantiates). A row's sums do not
 * depend on NC: the padding adds exact zeros after a thread's elements. */
static __host__ __device__ __forceinline__ int hk_frag_chunks(int dim, int G)
{
    const int per = HK_FRAG_VEC * G;
    return dim <= per       ? 1
           : dim <= 2 * per ? 2
           : dim <= 4 * per ? 4
           : dim <= 8 * per ? 8
                            : 16;
}

/* f(std::integral_constant<int, NC>) for the chunk count nc (1, 2, 4,
 * else 8): a launcher's one switch over the fragment sizes it builds. */
template <class F> static inline void hk_frag_dispatch(int nc, F f)
{
    switch (nc) {
    case 1:
        f(std::integral_constant<int, 1>{});
        break;
    case 2:
        f(std::integral_constant<int, 2>{});
        break;
    case 4:
        f(std::integral_constant<int, 4>{});
        break;
    default:
        f(std::integral_constant<int, 8>{});
    }
}

/* Element i of chunk c of thread lane (e = 0). */
static __device__ __forceinline__ int hk_frag_at(int c, int lane, int G)
{
    return (c * G + lane) * HK_FRAG_VEC;
}

template <int NC>
static __device__ __forceinline__ void
hk_frag_load(hk_frag<NC> &f, const float *x, int dim, int lane, int G, bool vec)
{
#pragma unroll
    for (int c = 0; c < NC; c++) {
        const int i = hk_frag_at(c, lane, G);
        if (vec) {
            const float4 q = i < dim ? *(const float4 *)(x + i)
                                     : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            f.v[c][0] = q.x;
            f.v[c][1] = q.y;
            f.v[c][2] = q.z;
            f.v[c][3] = q.w;
        } else {
#pragma unroll
            for (int e = 0; e < HK_FRAG_VEC; e++)
                f.v[c][e] = i + e < dim ? x[i + e] : 0.0f;
        }
    }
}

/* N bf16 (nearest even) of f in one 2N-byte store (N = 4 or 8), element
 * 0 in the low half of word 0 (little-endian, as uint16_t[N]). */
template <int N> struct alignas(2 * N) hk_bf16v {
    uint32_t w[N / 2];
};
template <int N>
static __device__ __forceinline__ hk_bf16v<N> hk_bf16_pack(const float *f)
{
    hk_bf16v<N> b;
#pragma unroll
    for (int j = 0; j < N / 2; j++)
        b.w[j] = hk_bf16_from_f32(f[2 * j]) |
                 (uint32_t)hk_bf16_from_f32(f[2 * j + 1]) << 16;
    return b;
}

/* An output element: f32, or bf16 (nearest even) as the bf16 GEMMs round
 * their inputs. */
static __device__ __forceinline__ void hk_put(float *y, size_t i, float v)
{
    y[i] = v;
}
static __device__ __forceinline__ void hk_put(uint16_t *y, size_t i, float v)
{
    y[i] = hk_bf16_from_f32(v);
}

/* N outputs in one store: f32 (N = 4, a float4), or bf16 (N = 4, 8). */
template <int N>
static __device__ __forceinline__ void hk_store_n(float *y, const float *f)
{
    static_assert(N == 4, "f32 stores are float4");
    *(float4 *)y = make_float4(f[0], f[1], f[2], f[3]);
}
template <int N>
static __device__ __forceinline__ void hk_store_n(uint16_t *y, const float *f)
{
    *(hk_bf16v<N> *)y = hk_bf16_pack<N>(f);
}

/* f into y[0, dim) in hk_frag's layout (vec: y 16-byte aligned for f32,
 * 8-byte for bf16). */
template <class Y, int NC>
static __device__ __forceinline__ void
hk_frag_store(Y *y, const hk_frag<NC> &f, int dim, int lane, int G, bool vec)
{
#pragma unroll
    for (int c = 0; c < NC; c++) {
        const int i = hk_frag_at(c, lane, G);
        if (vec) {
            if (i < dim)
                hk_store_n<HK_FRAG_VEC>(y + i, f.v[c]);
        } else {
#pragma unroll
            for (int e = 0; e < HK_FRAG_VEC; e++)
                if (i + e < dim)
                    hk_put(y, i + e, f.v[c][e]);
        }
    }
}

/* A thread's sum of squares of its fragment, chunks then elements in
 * order, in f32. */
template <int NC>
static __device__ __forceinline__ float hk_frag_sumsq(const hk_frag<NC> &f)
{
    float ss = 0.0f;
#pragma unroll
    for (int c = 0; c < NC; c++)
#pragma unroll
        for (int e = 0; e < HK_FRAG_VEC; e++)
            ss += f.v[c][e] * f.v[c][e];
    return ss;
}

/* The L2 norm's row reduction: rows of dim <= HK_WROW_MAX are summed by
 * one warp (hk_wrow_sumsq), longer ones by a block of HK_ROW_THREADS
 * (hk_row_sumsq). hk_l2norm_kernel and hk_conv.cu's fused GDN input path
 * both choose by this bound alone, so they agree bit for bit. */
#define HK_WROW_MAX 256

/* The sum of squares of a row of dim <= HK_WROW_MAX held by a warp as
 * fragments (G = 32): each lane's hk_frag_sumsq, then hk_warp_sum's
 * butterfly; every lane gets it. */
template <int NC>
static __device__ __forceinline__ float hk_wrow_sumsq(const hk_frag<NC> &f)
{
    return hk_warp_sum(hk_frag_sumsq(f));
}

/* The L2 normalizer of a row whose squares sum to ss: formed in double,
 * rounded once (the CPU's hk_l2norm). */
static __device__ __forceinline__ float hk_l2_factor(float ss, float eps,
                                                     float scale)
{
    return (float)(scale / sqrt((double)ss + eps));
}

/* A warp's row of dim <= HK_WROW_MAX L2-normed in place (the CPU's
 * hk_l2norm): x hk_l2_factor(hk_wrow_sumsq). */
template <int NC>
static __device__ __forceinline__ void hk_wrow_l2norm(hk_frag<NC> &f, float eps,
                                                      float scale)
{
    const float s = hk_l2_factor(hk_wrow_sumsq(f), eps, scale);
#pragma unroll
    for (int c = 0; c < NC; c++)
#pragma unroll
        for (int e = 0; e < HK_FRAG_VEC; e++)
            f.v[c][e] *= s;
}

/* Double sum over a block, as hk_block_sum (sh: 32 doubles). */
static __device__ __forceinline__ double hk_block_sum_d(double x, double *sh)
{
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int nw = blockDim.x >> 5;
    for (int off = 16; off > 0; off >>= 1)
        x += __shfl_xor_sync(HK_FULL_MASK, x, off);
    if (lane == 0)
        sh[warp] = x;
    __syncthreads();
    double t = lane < nw ? sh[lane] : 0.0;
    for (int off = 16; off > 0; off >>= 1)
        t += __shfl_xor_sync(HK_FULL_MASK, t, off);
    __syncthreads();
    return t;
}

/* The first (value, index) of a block in hk_sel_before order; every thread
 * gets it. An index < 0 is "none". sv, si: blockDim.x entries of shared
 * memory (a power of two), free again after the call. */
static __device__ __forceinline__ void hk_block_argbest(float *v, int *i,
                                                        float *sv, int *si)
{
    const int tid = threadIdx.x;
    sv[tid] = *v;
    si[tid] = *i;
    __syncthreads();
    for (int half = blockDim.x / 2; half > 0; half >>= 1) {
        if (tid < half &&
            hk_sel_before(sv[tid + half], si[tid + half], sv[tid], si[tid])) {
            sv[tid] = sv[tid + half];
            si[tid] = si[tid + half];
        }
        __syncthreads();
    }
    *v = sv[0];
    *i = si[0];
    __syncthreads();
}

/* Exclusive prefix sum of x over the block in tid order (blockDim.x a
 * multiple of 32); *total gets the block's sum. sh: 32 ints of shared
 * memory, free again after the call. */
static __device__ __forceinline__ int hk_block_scan(int x, int *total, int *sh)
{
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int nw = blockDim.x >> 5;
    int inc = x;
    for (int off = 1; off < 32; off <<= 1) {
        const int y = __shfl_up_sync(HK_FULL_MASK, inc, off);
        inc += lane >= off ? y : 0;
    }
    if (lane == 31)
        sh[warp] = inc;
    __syncthreads();
    int before = 0, all = 0;
    for (int w = 0; w < nw; w++) {
        before += w < warp ? sh[w] : 0;
        all += sh[w];
    }
    __syncthreads();
    *total = all;
    return before + inc - x;
}

#endif
