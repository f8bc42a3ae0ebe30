/*
 * hk_gdn_tc.h - private to the tensor-core chunked prefill's files
 * (hk_gdn_tc*.cu; the design is hk_gdn_tc.cu's header): the wmma
 * fragments, the inputs, the chunk workspace and its layout, the device
 * helpers of more than one kernel family, a call's plan and launch
 * arguments, and each family's shared-memory size and launcher.
 */
#ifndef HK_GDN_TC_H
#define HK_GDN_TC_H

#include <cuda_bf16.h>
#include <mma.h>

#include "kernels/common/gdn_math.h"
#include "kernels/cuda/hk_cuda_impl.h"
#include "kernels/cuda/hk_probe.h"
#include "kernels/cuda/hk_ptx.h"

using namespace nvcuda;

typedef wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16,
                       wmma::row_major>
    hk_fa_row;
typedef wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16,
                       wmma::col_major>
    hk_fa_col;
typedef wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16,
                       wmma::row_major>
    hk_fb_row;
typedef wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16,
                       wmma::col_major>
    hk_fb_col;
typedef wmma::fragment<wmma::accumulator, 16, 16, 16, float> hk_facc;

/* Row padding of shared tiles: 8 bf16 or 4 f32 (16 bytes) keep every
 * 16-row tile 32-byte aligned and spread rows over the banks. */
#define HK_PAD16 8
#define HK_PAD32 4

static __device__ __forceinline__ const __nv_bfloat16 *hk_bf(const uint16_t *p)
{
    return reinterpret_cast<const __nv_bfloat16 *>(p);
}

/* wmma::load_matrix_sync of a bf16 fragment and wmma::store_matrix_sync of
 * an f32 tile (row-major), for shared memory only (p), by the PTX .shared
 * forms of wmma.load and wmma.store. The wmma API emits the generic forms
 * whatever the pointer (nvcc 13: even for a shared array), which
 * ptxas makes four generic 32-bit loads (LD.E) a fragment and eight 32-bit
 * generic stores a tile; the .shared forms are one ldmatrix (LDSM) and
 * shared stores (cuobjdump, sm_90a). A fragment's layout does not depend
 * on the state space: the same registers, so the same results. ld in
 * elements. The emulator runs the API's calls. */
#ifdef HK_EMU_CUDA_RUNTIME_H
template <class F>
static inline void hk_wmma_lds(F &f, const uint16_t *p, unsigned ld)
{
    wmma::load_matrix_sync(f, hk_bf(p), ld);
}
static inline void hk_wmma_sts(float *p, const hk_facc &f, unsigned ld)
{
    wmma::store_matrix_sync(p, f, ld, wmma::mem_row_major);
}
#else
#define HK_WMMA_LDS(FRAG, OP)                                                  \
    static __device__ __forceinline__ void hk_wmma_lds(                        \
        FRAG &f, const uint16_t *p, unsigned ld)                               \
    {                                                                          \
        uint32_t *x = reinterpret_cast<uint32_t *>(&f.x[0]);                   \
        const unsigned s = (unsigned)__cvta_generic_to_shared(p);              \
        asm volatile(OP " {%0,%1,%2,%3}, [%4], %5;\n"                          \
                     : "=r"(x[0]), "=r"(x[1]), "=r"(x[2]), "=r"(x[3])          \
                     : "r"(s), "r"(ld)                                         \
                     : "memory");                                              \
    }
HK_WMMA_LDS(hk_fa_row, "wmma.load.a.sync.aligned.row.m16n16k16.shared.bf16")
HK_WMMA_LDS(hk_fa_col, "wmma.load.a.sync.aligned.col.m16n16k16.shared.bf16")
HK_WMMA_LDS(hk_fb_row, "wmma.load.b.sync.aligned.row.m16n16k16.shared.bf16")
HK_WMMA_LDS(hk_fb_col, "wmma.load.b.sync.aligned.col.m16n16k16.shared.bf16")
#undef HK_WMMA_LDS
static __device__ __forceinline__ void hk_wmma_sts(float *p, const hk_facc &f,
                                                   unsigned ld)
{
    const unsigned s = (unsigned)__cvta_generic_to_shared(p);
    asm volatile("wmma.store.d.sync.aligned.row.m16n16k16.shared.f32 [%0], "
                 "{%1,%2,%3,%4,%5,%6,%7,%8}, %9;\n"
                 :
                 : "r"(s), "f"(f.x[0]), "f"(f.x[1]), "f"(f.x[2]), "f"(f.x[3]),
                   "f"(f.x[4]), "f"(f.x[5]), "f"(f.x[6]), "f"(f.x[7]), "r"(ld)
                 : "memory");
}
#endif

/* The inputs as bf16 bit patterns: hi parts, and with f32 inputs their lo
 * parts (NULL for bf16 inputs, which are exact). */
struct hk_tc_in {
    const uint16_t *q, *k, *v;
    const uint16_t *ql, *kl, *vl;
};

/* Scratch regions; slot hc = h * nslots + chunk slot. */
struct hk_tc_ws {
    double *gam;  // [Hv * nslots, C]
    float *U;     // [Hv * nslots, C, dv]
    uint16_t *Wh; // [Hv * nslots, C, dk]  -W, hi
    uint16_t *Wl; //                        -W, lo
    uint16_t *Ph; // [Hv * nslots, C, C]   P, hi
    uint16_t *Pl; //                        P, lo
    /* Written by the state pass of the split variant (v2) only. */
    uint16_t *Sh; // [Hv * nslots, dk, dv]  chunk's starting state, hi
    uint16_t *Sl; //                        lo
    uint16_t *Vh; // [Hv * nslots, C, dv]   Vn, hi
    uint16_t *Vl; //                        lo
    /* The launch's phase probes (hk_probe.h; off but in benches). */
    hk_probe probe;
    /* The launch's chunk slots [seg0, seg1): all of them, or one segment
     * (HK_CUDA_GDN_TC_OVERLAP). Kernels A and O run slot seg0 + blockIdx.x;
     * a state pass block the chunks of its sequence among them. */
    int seg0, seg1;
};

/* Slots: every chunk of every sequence, at most T / C + nseq. */
static size_t hk_tc_slots(int T, int nseq, int C)
{
    return (size_t)T / C + (size_t)nseq;
}

static size_t hk_tc_ws_bytes(size_t slots, int Hv, int dk, int dv, int C,
                             hk_tc_ws *ws, unsigned char *base)
{
    const size_t rows = slots * Hv * C, srows = slots * Hv * dk;
    const size_t sz[10] = {rows * sizeof(double), rows * dv * sizeof(float),
                           rows * dk * 2,         rows * dk * 2,
                           rows * C * 2,          rows * C * 2,
                           srows * dv * 2,        srows * dv * 2,
                           rows * dv * 2,         rows * dv * 2};
    size_t off[10];
    const size_t at = hk_layout(sz, 10, 256, off);
    if (ws) {
        ws->gam = (double *)(base + off[0]);
        ws->U = (float *)(base + off[1]);
        ws->Wh = (uint16_t *)(base + off[2]);
        ws->Wl = (uint16_t *)(base + off[3]);
        ws->Ph = (uint16_t *)(base + off[4]);
        ws->Pl = (uint16_t *)(base + off[5]);
        ws->Sh = (uint16_t *)(base + off[6]);
        ws->Sl = (uint16_t *)(base + off[7]);
        ws->Vh = (uint16_t *)(base + off[8]);
        ws->Vl = (uint16_t *)(base + off[9]);
        ws->probe = hk_probe{NULL, 0};
        ws->seg0 = 0;
        ws->seg1 = (int)slots;
    }
    return at;
}

/* The chunk slot of a kernel A or O block. */
static __device__ __forceinline__ int hk_tc_slot(const hk_tc_ws &ws)
{
    return ws.seg0 + (int)blockIdx.x;
}

/* Sequence b's first chunk slot. */
static __device__ int hk_tc_first_slot(const int *cu, int b, int C)
{
    int acc = 0;
    for (int i = 0; i < b; i++)
        acc += (cu[i + 1] - cu[i] + C - 1) / C;
    return acc;
}

/* Chunk slot `slot` of the batch: its sequence's first token t0 and its
 * length n (0: past the last chunk). Thread 0 scans the offsets. */
static __device__ void hk_tc_locate(const int *cu, int nseq, int C, int slot,
                                    int *t0, int *n)
{
    *t0 = 0;
    *n = 0;
    int acc = 0;
    for (int b = 0; b < nseq; b++) {
        const int len = cu[b + 1] - cu[b], nb = (len + C - 1) / C;
        if (slot < acc + nb) {
            const int c = slot - acc;
            *t0 = cu[b] + c * C;
            *n = min(C, len - c * C);
            return;
        }
        acc += nb;
    }
}

/* rows x cols bf16 (cols a multiple of 8) from src (row stride lds) into
 * dst (row stride ldd), 16 bytes at a time; rows >= n are zeros. ASYNC:
 * by cp.async (zero-filled rows read nothing), landing by the caller's
 * hk_cp_async_wait after its commit. */
template <bool ASYNC = false>
static __device__ void hk_tc_stage(uint16_t *dst, int ldd, const uint16_t *src,
                                   size_t lds, int rows, int n, int cols)
{
    const int vc = cols / 8;
    for (int e = threadIdx.x; e < rows * vc; e += blockDim.x) {
        const int i = e / vc, c = (e % vc) * 8;
        if (ASYNC) {
            hk_cp_async16(dst + (size_t)i * ldd + c,
                          i < n ? src + (size_t)i * lds + c : src,
                          i < n ? 16 : 0);
            continue;
        }
        uint4 x = make_uint4(0, 0, 0, 0);
        if (i < n)
            x = *reinterpret_cast<const uint4 *>(src + (size_t)i * lds + c);
        *reinterpret_cast<uint4 *>(dst + (size_t)i * ldd + c) = x;
    }
}

/* A state pass block's place (kernels B, P and R): BV columns from col0
 * of the state (or, is_tc, of T_C) of value head h (key head kh) of
 * sequence b, from column block blockIdx.x of [S | Tc], blockIdx.y and
 * blockIdx.z; Sg its matrix (row stride ldg). Its chunks: those of the
 * sequence among the launch's slots (ws.seg0..), nch of them from slot
 * first, tokens ts.., len of them; cont when they start past the
 * sequence's first chunk (T_C then goes on from Sg, not from I). skip: no
 * chunks in a launch after the first segment, which leaves the block
 * nothing to do (the first segment's stores every sequence's state and
 * T_C, I for a sequence not begun, as a whole call does for an empty one). */
struct hk_tc_pass_at {
    bool is_tc, cont, skip;
    int h, b, kh, col0, ldg, first, ts, len, nch;
    float *Sg;
    __device__ hk_tc_pass_at(const hk_tc_ws &ws, float *const *states,
                             float *const *tcs, const int *cu, int BV, int Hk,
                             int Hv, int dk, int dv, int C)
        : is_tc((int)blockIdx.x * BV >= dv), h((int)blockIdx.y),
          b((int)blockIdx.z), kh(h / (Hv / Hk)),
          col0((int)blockIdx.x * BV - (is_tc ? dv : 0)), ldg(is_tc ? dk : dv),
          Sg(is_tc ? tcs[b] + (size_t)h * dk * dk
                   : states[b] + (size_t)h * dk * dv)
    {
        const int all = (cu[b + 1] - cu[b] + C - 1) / C;
        const int f = hk_tc_first_slot(cu, b, C);
        const int lo = min(max(ws.seg0 - f, 0), all);
        const int hi = min(max(ws.seg1 - f, lo), all);
        first = f + lo;
        nch = hi - lo;
        ts = cu[b] + lo * C;
        len = max(0, min(cu[b + 1] - ts, nch * C));
        cont = lo > 0;
        skip = nch == 0 && ws.seg0 > 0;
    }
};

/* The launches of one call: v2 (pass BV > 0) unless flags ask for v1 or
 * v2's tiles do not fit the shared memory; each kernel's bytes. */
struct hk_tc_plan {
    int BV, PBV, BVO;
    int nbuf; /* the pass's buffers: 1 with HK_CUDA_GDN_TC_PSHARE, else 2 */
    int A1;   /* the first kernel A (HK_CUDA_GDN_TC_A1) */
    int A3;   /* kernel A3 (HK_CUDA_GDN_TC_A3) */
    int reg;  /* the pass in registers, where it can (not _SMEM) */
    int fuse; /* R with the outputs in the same pass (_FUSE_O, fitting) */
    int rbuf; /* R's chunk buffers: 2, or 3 (_DEEP, fitting) */
    int w8;   /* R on 8 state warps at BV 16 or 32 (_W8, where it runs) */
    size_t sa, sb, so;
};

/* A call's launch arguments (hk_gdn_tc_launch's), for the launchers
 * below: ws carved from the scratch, slots chunk slots a head
 * (hk_tc_slots); ncols the state pass's columns, dv (+ dk with T_C); fast,
 * fast_a the flags' FAST and FAST_A. */
struct hk_tc_call {
    hk_tc_ws ws;
    hk_tc_in in;
    float *o;
    float *const *states;
    float *const *tcs;
    const float *g, *beta;
    const int *cu_seqlens;
    int nseq, Hk, Hv, dk, dv, C, ncols;
    size_t slots;
    int fast, fast_a;
    int probe; /* the launchers probe (not HK_CUDA_GDN_TC_OVERLAP's) */
    cudaStream_t s;
};

/* Each kernel family (in its file): its dynamic shared memory in bytes
 * (its carve, for the plan), and its launch as planned (p), followed by
 * hk_cuda_check_launch, whose status it returns. LO: the inputs have lo
 * parts (f32 inputs); both instances are in the family's file. */

/* Kernel A (hk_gdn_tc_local.cu): A1 (a1), A3 (a3) or else A2. */
size_t hk_tc_local_smem(int a1, int a3, int dk, int dv, int C, bool lo);
template <bool LO>
int hk_tc_launch_local(const hk_tc_plan &p, const hk_tc_call &a);

/* Kernel B (hk_gdn_tc_state.cu): v1's pass, states and outputs. */
size_t hk_tc_state_smem(int dk, int C, int BV, bool lo);
template <bool LO>
int hk_tc_launch_state(const hk_tc_plan &p, const hk_tc_call &a);

/* v2's state pass (hk_gdn_tc_pass.cu): kernel R (p.reg) or P; f32: P's
 * f32 tiles, out: R's fused outputs. */
size_t hk_tc_pass_smem(int dk, int C, int BV, bool lo, int nbuf, bool f32,
                       bool out);
template <bool LO>
int hk_tc_launch_pass(const hk_tc_plan &p, const hk_tc_call &a);

/* v2's outputs (hk_gdn_tc_out.cu): kernel O. */
size_t hk_tc_out_smem(int dk, int C, int BVO, bool lo);
template <bool LO>
int hk_tc_launch_out(const hk_tc_plan &p, const hk_tc_call &a);

#endif
