/*
 * hk_gdn_tc.cu - the Gated DeltaNet chunked prefill on tensor cores: bf16
 * q, k, v in; f32 gates, state, T_C and output; f32 accumulation; several
 * sequences per call (cu_seqlens offsets). The math is hk_gdn.cu's chunk
 * form (its header, and hk_gdn.c's); the f32-in kernel there stays the
 * reference these results are tested against.
 *
 * Precision. Products of two bf16 inputs (K K^T, Q K^T) are exact in f32,
 * so one bf16 MMA does them. Every other product has an f32 operand
 * (Tinv, W, S, Vn, P): it is split into bf16 hi + lo (hk_bf16_split,
 * ~16 significant bits) and multiplied as hi*x + lo*x (x exact bf16: K, Q,
 * V) or hi*hi + hi*lo + lo*hi (both f32), accumulating in f32. That keeps
 * the state's error near 1e-5 relative where one bf16 rounding of S or W
 * (FLA's bf16 path) costs ~4e-3, at 2-3 MMAs per product.
 *
 * Two launches on one stream (wmma 16x16x16, bf16 -> f32):
 *   A. per (chunk, value head), in parallel, 8 warps: gamma in double (the
 *      CPU's order), K/Q/V of the chunk staged in shared memory (rows past
 *      the chunk's end zeroed), [K; Q] K^T on MMAs (lower tiles only), the
 *      decay and beta masks, (I + L)^{-1} by forward substitution in f32
 *      (hk_gdn.cu's order), then U = Tinv diag(beta) V and
 *      W = Tinv diag(beta e^gamma) K on MMAs. Out to scratch: gamma, U
 *      (f32), -W and P = tril(QK^T (.) Gamma) as bf16 hi/lo pairs.
 *   B. per (sequence, value head, BV columns of [S | Tc]), 4 warps,
 *      sequential over the sequence's chunks, the BV-column tile of the
 *      state in shared memory in f32 for the whole pass:
 *        Vn = U - W S,  X = e^{gamma} Q S            (MMAs, dk deep)
 *        O = X + P Vn  -> o                           (MMAs, C deep)
 *        S = e^{gamma_n} S + K^T (e^{gamma_n - gamma} Vn)
 *      Tc's columns are more blocks of the same launch running the same
 *      recurrence with U = 0 from e_j (T_C in the same pass); no O.
 *      BV = 32, or 16 when 32 would leave SMs idle.
 * That is v1 (HK_CUDA_GDN_TC_V1). The default, v2 (hk_gdn_tc_pass.cu),
 * replaces B by a sequential pass that computes only the states (and
 * writes each chunk's starting state and Vn to scratch) and a parallel
 * output launch; HK_CUDA_GDN_TC_FAST runs v2 on single bf16 products.
 * Kernel A is the blockwise one (A2) by default; HK_CUDA_GDN_TC_A1 runs
 * the first, HK_CUDA_GDN_TC_A3 A2's steps with every load by cp.async in
 * flight under the steps before it (hk_gdn_tc_local.cu).
 * Tiles of a chunk's last 16 tokens that run past its end are staged in
 * shared memory with zero rows, so no load reads past a sequence or the
 * buffer. Tiny values are flushed as on the CPU (gdn_math.h).
 *
 * f32 inputs (hk_cuda_gdn_chunk_tc, the engine's activations): q, k, v
 * are split into bf16 hi + lo arrays in scratch first (one pass), and the
 * same kernels run with LO set: every product with an input gains its lo
 * term (hi*hi + hi*lo + lo*hi), so no operand keeps fewer than ~16
 * significant bits and the results stay ~1e-5 of the f32 kernel's. With
 * HK_CUDA_GDN_TC_ROUND the pass writes the hi halves only (q, k, v
 * rounded to bf16 once) and the bf16 entry's kernels run on them: that
 * entry's results bit for bit, FLA's input precision.
 *
 * Requirements: dk, dv, C multiples of 16; dk <= 256; C <= 64; q, k, v
 * (bf16 entry), every state and Tc 32-byte aligned (wmma tiles).
 *
 * The files: this one plans a call and launches it (the entries, the f32
 * inputs' split, phase timing); hk_gdn_tc.h holds what they share (the
 * fragments, the workspace's layout, the plan, the launchers'
 * declarations); hk_gdn_tc_local.cu kernel A (A1, A2, A3),
 * hk_gdn_tc_state.cu kernel B (v1), hk_gdn_tc_pass.cu v2's state passes
 * (P, R) and hk_gdn_tc_out.cu v2's outputs (O), each with its launcher.
 */
#include <stdio.h>

#include "kernels/cuda/hk_gdn_tc.h"

/* The SM count (4 where the device cannot say). */
static int hk_tc_sms(void)
{
    return hk_cuda_sm_count(4);
}

/* v1's BV: 32 when the grid still covers every SM, else 16 (more blocks). */
static int hk_tc_bv(int nseq, int Hv, int ncols, int dk, int dv)
{
    if (dk % 32 || dv % 32)
        return 16;
    return (long long)nseq * Hv * (ncols / 32) >= hk_tc_sms() ? 32 : 16;
}

/* v2's pass runs one block per SM (its double buffer takes most of the
 * shared memory) and each chunk step's time grows with BV: BV = 16 while
 * the blocks fit in one wave of `room` SMs, else 32 (half the blocks, each
 * twice the MMAs but the same W and K bytes). With one buffer (nbuf = 1,
 * two blocks an SM at dk = 128) BV = 16 always. 0: no BV fits the shared
 * memory. */
static int hk_tc_pass_bv(int nseq, int Hv, int ncols, int dk, int C, bool lo,
                         int nbuf, int room)
{
    const size_t lim = (size_t)hk_cuda_smem_optin();
    const bool f16 = hk_tc_pass_smem(dk, C, 16, lo, nbuf, true, false) <= lim;
    const bool f32 = hk_tc_pass_smem(dk, C, 32, lo, nbuf, true, false) <= lim &&
                     ncols % 32 == 0 && dk % 32 == 0;
    if (f32 &&
        (!f16 || (nbuf == 2 && (long long)nseq * Hv * (ncols / 16) > room)))
        return 32;
    return f16 ? 16 : 0;
}

/* Plans a call: 0, or 1 where kernel A or B / P does not fit. */
static int hk_tc_plan_for(hk_tc_plan *p, int nseq, int Hv, int ncols, int dk,
                          int dv, int C, bool lo, unsigned flags)
{
    const size_t lim = (size_t)hk_cuda_smem_optin();
    /* the SMs the state pass may fill: all, or with OVERLAP half, so that
     * kernels A and O of other segments have SMs of their own (beside a
     * pass block only one A block fits at dk = 128) */
    const bool ov = (flags & HK_CUDA_GDN_TC_OVERLAP) != 0;
    const int room = ov ? (hk_tc_sms() + 1) / 2 : hk_tc_sms();
    p->BVO = dv % 32 ? 16 : 32;
    if ((flags & HK_CUDA_GDN_TC_O64) && dv % 64 == 0 &&
        hk_tc_out_smem(dk, C, 64, lo) <= lim)
        p->BVO = 64;
    p->so = hk_tc_out_smem(dk, C, p->BVO, lo);
    p->nbuf = flags & HK_CUDA_GDN_TC_PSHARE ? 1 : 2;
    p->PBV = (flags & HK_CUDA_GDN_TC_V1) || p->so > lim
                 ? 0
                 : hk_tc_pass_bv(nseq, Hv, ncols, dk, C, lo, p->nbuf, room);
    p->BV = p->PBV ? p->PBV : hk_tc_bv(nseq, Hv, ncols, dk, dv);
    p->A1 = (flags & HK_CUDA_GDN_TC_A1) != 0;
    p->A3 = (flags & HK_CUDA_GDN_TC_A3) != 0;
    p->reg = !(flags & HK_CUDA_GDN_TC_SMEM) && p->PBV && p->nbuf == 2 &&
             dk % 64 == 0 && dk <= 256;
    p->fuse = p->reg && (flags & HK_CUDA_GDN_TC_FUSE_O) &&
              hk_tc_pass_smem(dk, C, p->BV, lo, 2, false, true) <= lim;
    /* R64 where BV = 32 makes more blocks than SMs (OVERLAP: than its
     * room, by itself) and its tiles fit, not fused (its tiles and the
     * fused outputs' pass an SM's shared memory; fused outputs sum in
     * another order, so R64 there would change the results) */
    if (((flags & HK_CUDA_GDN_TC_R64) || ov) && p->reg && !p->fuse &&
        p->BV == 32 && dk == 128 && ncols % 64 == 0 &&
        (long long)nseq * Hv * (ncols / 32) > room &&
        hk_tc_pass_smem(dk, C, 64, lo, 2, false, false) <= lim)
        p->BV = p->PBV = 64;
    /* W8: R's state rows over 8 warps (MT = dk / 128 tiles a warp); fused
     * at dk = 128 (the fused outputs fit only there) */
    p->w8 = (flags & HK_CUDA_GDN_TC_W8) && p->reg && p->BV <= 32 &&
            (dk == 128 || (dk == 256 && !p->fuse));
    p->sa = hk_tc_local_smem(p->A1, p->A3, dk, dv, C, lo);
    p->rbuf =
        p->reg && (flags & HK_CUDA_GDN_TC_DEEP) &&
                hk_tc_pass_smem(dk, C, p->BV, lo, 3, false, p->fuse) <= lim
            ? 3
            : 2;
    p->sb = p->reg ? hk_tc_pass_smem(dk, C, p->BV, lo, p->rbuf, false, p->fuse)
            : p->PBV ? hk_tc_pass_smem(dk, C, p->BV, lo, p->nbuf, true, false)
                     : hk_tc_state_smem(dk, C, p->BV, lo);
    return p->sa > lim || p->sb > lim;
}

/* The f32 entry's q, k, v (x[i] of n[i] elements each) into bf16 hi[i] +
 * lo[i] (hk_bf16_split); with lo NULL, hi only (rounded once:
 * HK_CUDA_GDN_TC_ROUND). */
struct hk_tc_split_args {
    const float *x[3];
    uint16_t *hi[3], *lo[3];
    size_t n[3];
    bool vec[3]; /* 4 elements a thread: n[i] % 4 == 0, x[i] 16-byte and
                    hi[i], lo[i] 8-byte aligned */
};

/* a[i] of a kernel parameter's array by selects: an index into the
 * parameter would copy it to the stack (104 bytes here). */
template <class P>
static __device__ __forceinline__ P hk_tc_pick(const P (&a)[3], int i)
{
    return i == 0 ? a[0] : i == 1 ? a[1] : a[2];
}

/* Four bf16 in one 8-byte store, element 0 in the low half. */
static __device__ __forceinline__ void hk_tc_put4(uint16_t *p,
                                                  const uint16_t (&h)[4])
{
    *(uint2 *)p =
        make_uint2(h[0] | (uint32_t)h[1] << 16, h[2] | (uint32_t)h[3] << 16);
}

/* Array blockIdx.y of the three, grid-strided over x: 16 bytes of it a
 * thread where vec (the H200 timed the element-a-thread form at a third of
 * its copy rate: 0.55 ms of a 16k-token chunk on 0.8B heads), one element
 * after, or without vec. */
static __global__ void hk_tc_split_kernel(hk_tc_split_args a)
{
    const int i = blockIdx.y;
    const float *x = hk_tc_pick(a.x, i);
    uint16_t *hi = hk_tc_pick(a.hi, i), *lo = hk_tc_pick(a.lo, i);
    const size_t n = hk_tc_pick(a.n, i);
    const size_t nv = hk_tc_pick(a.vec, i) ? n / 4 : 0;
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    const size_t t = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    for (size_t j = t; j < nv; j += stride) {
        const float4 v = ((const float4 *)x)[j];
        const float f[4] = {v.x, v.y, v.z, v.w};
        uint16_t h[4], l[4];
#pragma unroll
        for (int e = 0; e < 4; e++) {
            if (lo)
                hk_bf16_split(f[e], &h[e], &l[e]);
            else
                h[e] = hk_bf16_from_f32(f[e]);
        }
        hk_tc_put4(hi + 4 * j, h);
        if (lo)
            hk_tc_put4(lo + 4 * j, l);
    }
    for (size_t j = 4 * nv + t; j < n; j += stride) {
        if (lo)
            hk_bf16_split(x[j], &hi[j], &lo[j]);
        else
            hi[j] = hk_bf16_from_f32(x[j]);
    }
}

/* Phase timing for benches (hk_cuda_gdn_tc_profile): events 0..4 around
 * the f32 entry's split, kernel A, the state pass, the outputs. */
static cudaEvent_t hk_tc_ev[HK_CUDA_GDN_TC_PHASES + 1];
static int hk_tc_prof;

static void hk_tc_mark(int i, cudaStream_t s)
{
    if (hk_tc_prof)
        cudaEventRecord(hk_tc_ev[i], s);
}

extern "C" int hk_cuda_gdn_tc_profile(int on)
{
    if (!on == !hk_tc_prof)
        return 0;
    for (int i = 0; i <= HK_CUDA_GDN_TC_PHASES; i++) {
        cudaError_t e =
            on ? cudaEventCreate(&hk_tc_ev[i]) : cudaEventDestroy(hk_tc_ev[i]);
        if (e != cudaSuccess)
            return hk_cuda_status(e);
    }
    hk_tc_prof = on;
    return 0;
}

extern "C" int hk_cuda_gdn_tc_phases(double *ms)
{
    if (!hk_tc_prof)
        return HK_CUDA_EINVAL;
    cudaError_t e = cudaEventSynchronize(hk_tc_ev[HK_CUDA_GDN_TC_PHASES]);
    for (int i = 0; i < HK_CUDA_GDN_TC_PHASES && e == cudaSuccess; i++) {
        float f = 0.0f;
        e = cudaEventElapsedTime(&f, hk_tc_ev[i], hk_tc_ev[i + 1]);
        ms[i] = f;
    }
    return e == cudaSuccess ? 0 : hk_cuda_status(e);
}

/* HK_CUDA_GDN_TC_OVERLAP's segments of a call's slots: up to
 * HK_TC_SEGMENTS, of HK_TC_SEG_MIN slots at the least. */
#define HK_TC_SEGMENTS 8
#define HK_TC_SEG_MIN  2

/* HK_CUDA_GDN_TC_OVERLAP: a's launches segment by segment on the lanes,
 * forked from and joined back into a.s. Kernel A on lane 1, the state
 * pass on lane 0 (the highest priority: the one path through every
 * segment), kernel O on lane 2; the pass of segment k waits for A of k
 * and O of k for the pass of k. Each lane's own order does the rest: A of
 * k + 1 writes other slots than any launch before it reads, the pass
 * carries states and tcs from k to k + 1 in place, O of k reads what the
 * pass of k wrote. */
template <bool LO>
static int hk_tc_overlap(const hk_tc_plan &p, hk_tc_call a, hk_cuda_lanes *l)
{
    const cudaStream_t caller = a.s;
    const int slots = (int)a.slots;
    int nseg = slots / HK_TC_SEG_MIN;
    nseg = nseg < 1 ? 1 : nseg > HK_TC_SEGMENTS ? HK_TC_SEGMENTS : nseg;
    a.probe = 0;
    int rc = hk_lanes_fork(l, caller);
    for (int k = 0; !rc && k < nseg; k++) {
        a.ws.seg0 = (int)((long long)slots * k / nseg);
        a.ws.seg1 = (int)((long long)slots * (k + 1) / nseg);
        a.s = l->s[1];
        if ((rc = hk_tc_launch_local<LO>(p, a)) ||
            (rc = hk_lanes_pass(l, 0, 1, 0)))
            break;
        a.s = l->s[0];
        if ((rc = hk_tc_launch_pass<LO>(p, a)) || p.fuse)
            continue;
        a.s = l->s[2];
        if (!(rc = hk_lanes_pass(l, 1, 0, 2)))
            rc = hk_tc_launch_out<LO>(p, a);
    }
    /* joined whatever failed: the caller's stream never runs ahead of
     * work already issued on the lanes */
    const int jc = hk_lanes_join(l, caller);
    return rc ? rc : jc;
}

/* Both entries: the launches on inputs `in` (lo parts when lo), chunk
 * workspace at ws_base, as planned by hk_tc_plan_for (fast: flags' FAST),
 * on the lanes where given (HK_CUDA_GDN_TC_OVERLAP), else on s. */
template <bool LO>
static int hk_gdn_tc_launch(float *o, float *const *states, float *const *tcs,
                            hk_tc_in in, const hk_tc_plan &p, int fast,
                            int fast_a, const float *g, const float *beta,
                            const int *cu_seqlens, int nseq, int T, int Hk,
                            int Hv, int dk, int dv, int C, void *ws_base,
                            hk_cuda_lanes *lanes, cudaStream_t s)
{
    const size_t slots = hk_tc_slots(T, nseq, C);
    hk_tc_call a;
    hk_tc_ws_bytes(slots, Hv, dk, dv, C, &a.ws, (unsigned char *)ws_base);
    a.in = in;
    a.o = o;
    a.states = states;
    a.tcs = tcs;
    a.g = g;
    a.beta = beta;
    a.cu_seqlens = cu_seqlens;
    a.nseq = nseq;
    a.Hk = Hk;
    a.Hv = Hv;
    a.dk = dk;
    a.dv = dv;
    a.C = C;
    a.ncols = dv + (tcs ? dk : 0);
    a.slots = slots;
    a.fast = fast;
    a.fast_a = fast_a;
    a.probe = 1;
    a.s = s;
    int rc;

    hk_tc_mark(1, s);
    if (lanes && T > 0) { /* the phases: all in the state pass's */
        hk_tc_mark(2, s);
        rc = hk_tc_overlap<LO>(p, a, lanes);
        hk_tc_mark(3, s);
        hk_tc_mark(4, s);
        return rc;
    }
    if (T > 0 && (rc = hk_tc_launch_local<LO>(p, a)))
        return rc;
    hk_tc_mark(2, s);
    if (!p.PBV) { /* v1: kernel B, the outputs in the same pass */
        rc = hk_tc_launch_state<LO>(p, a);
        hk_tc_mark(3, s);
        hk_tc_mark(4, s);
        return rc;
    }
    rc = hk_tc_launch_pass<LO>(p, a);
    hk_tc_mark(3, s);
    if (rc || T == 0 || p.fuse) {
        hk_tc_mark(4, s);
        return rc;
    }
    rc = hk_tc_launch_out<LO>(p, a);
    hk_tc_mark(4, s);
    return rc;
}

/* Shapes and flags both entries refuse (HK_CUDA_EINVAL; A1 and A3 both
 * asked for among them, and OVERLAP with V1), the shared memory included:
 * 0 when the kernels can run them, with plan p. */
static int hk_tc_bad(hk_tc_plan *p, int T, int nseq, int Hk, int Hv, int dk,
                     int dv, int C, bool lo, bool want_tc, unsigned flags)
{
    if (T < 0 || nseq < 1 || nseq > HK_CUDA_MAX_GRID_YZ || Hk < 1 || Hv < 1 ||
        Hv % Hk || Hv > HK_CUDA_MAX_GRID_YZ || dk < 16 || dk % 16 ||
        dk > HK_CUDA_GDN_MAX_DK || dv < 16 || dv % 16 || C < 16 || C % 16 ||
        C > HK_CUDA_GDN_MAX_C || (flags & ~(unsigned)HK_CUDA_GDN_TC_FLAGS) ||
        ((flags & HK_CUDA_GDN_TC_A1) && (flags & HK_CUDA_GDN_TC_A3)) ||
        ((flags & HK_CUDA_GDN_TC_OVERLAP) && (flags & HK_CUDA_GDN_TC_V1)))
        return 1;
    return hk_tc_plan_for(p, nseq, Hv, dv + (want_tc ? dk : 0), dk, dv, C, lo,
                          flags);
}

/* Whether a call with plan p and flags overlaps its launches: OVERLAP
 * asked for and v2's kernels planned (v1 runs one launch). */
static bool hk_tc_overlaps(const hk_tc_plan &p, unsigned flags)
{
    return (flags & HK_CUDA_GDN_TC_OVERLAP) && p.PBV;
}

extern "C" int hk_cuda_gdn_tc_kernels(char *buf, size_t cap, int T, int nseq,
                                      int Hk, int Hv, int dk, int dv, int C,
                                      int f32_in, int want_tc, unsigned flags)
{
    hk_tc_plan p;
    const bool lo = f32_in && !(flags & HK_CUDA_GDN_TC_ROUND);
    if (!buf || cap == 0 ||
        hk_tc_bad(&p, T, nseq, Hk, Hv, dk, dv, C, lo, want_tc != 0, flags))
        return HK_CUDA_EINVAL;
    const char *a = p.A1 ? "A1" : p.A3 ? "A3" : "A2";
    const char *ov = hk_tc_overlaps(p, flags) ? " ov" : "";
    if (!p.PBV) /* as hk_gdn_tc_launch picks them */
        snprintf(buf, cap, "%s B%d", a, p.BV);
    else if (p.reg)
        snprintf(buf, cap, "%s R%dx%d%s%s%s%s%s", a, p.BV,
                 p.BV == 64 ? 1 : dk / 64, p.w8 ? "w8" : "",
                 p.rbuf == 3 ? "/3" : "", p.fuse ? "+O" : " O",
                 !p.fuse && p.BVO == 64 ? "64" : "", ov);
    else
        snprintf(buf, cap, "%s P%d%s O%s%s", a, p.BV, p.nbuf == 1 ? "s" : "",
                 p.BVO == 64 ? "64" : "", ov);
    return HK_CUDA_OK;
}

extern "C" size_t hk_cuda_gdn_chunk_bf16_scratch(int T, int nseq, int Hv,
                                                 int dk, int dv, int C)
{
    if (T < 0 || nseq < 1 || Hv < 1 || dk < 1 || dv < 1 || C < 1)
        return 0;
    const size_t bytes =
        hk_tc_ws_bytes(hk_tc_slots(T, nseq, C), Hv, dk, dv, C, NULL, NULL);
    return bytes / sizeof(float);
}

extern "C" int hk_cuda_gdn_chunk_bf16_ex(
    float *o, float *const *states, float *const *tcs, const uint16_t *q,
    const uint16_t *k, const uint16_t *v, const float *g, const float *beta,
    const int *cu_seqlens, int nseq, int T, int Hk, int Hv, int dk, int dv,
    int C, float *scratch, unsigned flags, hk_cuda_lanes_t *lanes, void *stream)
{
    hk_tc_plan p;
    if (hk_tc_bad(&p, T, nseq, Hk, Hv, dk, dv, C, false, tcs != NULL, flags) ||
        !states || !cu_seqlens || (T > 0 && !scratch) ||
        ((flags & HK_CUDA_GDN_TC_OVERLAP) && !lanes))
        return HK_CUDA_EINVAL;
    const hk_tc_in in = {q, k, v, NULL, NULL, NULL};
    hk_tc_mark(0, hk_stream(stream));
    return hk_gdn_tc_launch<false>(
        o, states, tcs, in, p, flags & HK_CUDA_GDN_TC_FAST ? 1 : 0,
        flags & HK_CUDA_GDN_TC_FAST_A ? 1 : 0, g, beta, cu_seqlens, nseq, T, Hk,
        Hv, dk, dv, C, scratch, hk_tc_overlaps(p, flags) ? lanes : NULL,
        hk_stream(stream));
}

extern "C" int hk_cuda_gdn_chunk_bf16(float *o, float *const *states,
                                      float *const *tcs, const uint16_t *q,
                                      const uint16_t *k, const uint16_t *v,
                                      const float *g, const float *beta,
                                      const int *cu_seqlens, int nseq, int T,
                                      int Hk, int Hv, int dk, int dv, int C,
                                      float *scratch, void *stream)
{
    return hk_cuda_gdn_chunk_bf16_ex(o, states, tcs, q, k, v, g, beta,
                                     cu_seqlens, nseq, T, Hk, Hv, dk, dv, C,
                                     scratch, 0, NULL, stream);
}

/* The f32 entry's scratch: the chunk workspace, then q, k (T Hk dk each)
 * and v (T Hv dv) as hi and lo halves; byte offsets in off[6]. */
static size_t hk_tc_f32_bytes(int T, int nseq, int Hk, int Hv, int dk, int dv,
                              int C, size_t *off)
{
    const size_t nq = (size_t)T * Hk * dk, nv = (size_t)T * Hv * dv;
    const size_t sz[7] = {
        hk_tc_ws_bytes(hk_tc_slots(T, nseq, C), Hv, dk, dv, C, NULL, NULL),
        nq * 2,
        nq * 2,
        nq * 2,
        nq * 2,
        nv * 2,
        nv * 2};
    size_t o7[7];
    const size_t at = hk_layout(sz, 7, 256, o7);
    for (int i = 0; off && i < 6; i++)
        off[i] = o7[i + 1];
    return at;
}

extern "C" size_t hk_cuda_gdn_chunk_tc_scratch(int T, int nseq, int Hk, int Hv,
                                               int dk, int dv, int C)
{
    if (T < 0 || nseq < 1 || Hk < 1 || Hv < 1 || dk < 1 || dv < 1 || C < 1)
        return 0;
    return (hk_tc_f32_bytes(T, nseq, Hk, Hv, dk, dv, C, NULL) + 3) /
           sizeof(float);
}

extern "C" int hk_cuda_gdn_chunk_tc_ex(
    float *o, float *const *states, float *const *tcs, const float *q,
    const float *k, const float *v, const float *g, const float *beta,
    const int *cu_seqlens, int nseq, int T, int Hk, int Hv, int dk, int dv,
    int C, float *scratch, unsigned flags, hk_cuda_lanes_t *lanes, void *stream)
{
    hk_tc_plan p;
    const bool lo = !(flags & HK_CUDA_GDN_TC_ROUND);
    if (hk_tc_bad(&p, T, nseq, Hk, Hv, dk, dv, C, lo, tcs != NULL, flags) ||
        !states || !cu_seqlens || (T > 0 && !scratch) ||
        ((flags & HK_CUDA_GDN_TC_OVERLAP) && !lanes))
        return HK_CUDA_EINVAL;
    const cudaStream_t s = hk_stream(stream);
    hk_cuda_lanes *ov = hk_tc_overlaps(p, flags) ? lanes : NULL;
    size_t off[6];
    hk_tc_f32_bytes(T, nseq, Hk, Hv, dk, dv, C, off);
    unsigned char *base = (unsigned char *)scratch;
    uint16_t *h[6];
    for (int i = 0; i < 6; i++)
        h[i] = (uint16_t *)(base + off[i]);
    const size_t nq = (size_t)T * Hk * dk, nv = (size_t)T * Hv * dv;
    hk_tc_mark(0, s);
    if (T > 0) {
        hk_tc_split_args a = {{q, k, v},
                              {h[0], h[2], h[4]},
                              {NULL, NULL, NULL},
                              {nq, nq, nv},
                              {false, false, false}};
        size_t most = 0; /* the widest array's threads */
        for (int i = 0; i < 3; i++) {
            a.lo[i] = lo ? h[2 * i + 1] : NULL;
            a.vec[i] = a.n[i] % 4 == 0 && hk_aligned(a.x[i], 16) &&
                       hk_aligned(a.hi[i], 8) &&
                       (!lo || hk_aligned(a.lo[i], 8));
            const size_t w = a.vec[i] ? a.n[i] / 4 : a.n[i];
            most = w > most ? w : most;
        }
        hk_tc_split_kernel<<<dim3(hk_grid_1d(most, 256), 3), 256, 0, s>>>(a);
        int rc = hk_cuda_check_launch();
        if (rc)
            return rc;
    }
    if (!lo) { /* the bf16 entry's kernels on the rounded inputs */
        const hk_tc_in in = {h[0], h[2], h[4], NULL, NULL, NULL};
        return hk_gdn_tc_launch<false>(
            o, states, tcs, in, p, flags & HK_CUDA_GDN_TC_FAST ? 1 : 0,
            flags & HK_CUDA_GDN_TC_FAST_A ? 1 : 0, g, beta, cu_seqlens, nseq, T,
            Hk, Hv, dk, dv, C, scratch, ov, s);
    }
    const hk_tc_in in = {h[0], h[2], h[4], h[1], h[3], h[5]};
    return hk_gdn_tc_launch<true>(
        o, states, tcs, in, p, flags & HK_CUDA_GDN_TC_FAST ? 1 : 0,
        flags & HK_CUDA_GDN_TC_FAST_A ? 1 : 0, g, beta, cu_seqlens, nseq, T, Hk,
        Hv, dk, dv, C, scratch, ov, s);
}

extern "C" int hk_cuda_gdn_chunk_tc(float *o, float *const *states,
                                    float *const *tcs, const float *q,
                                    const float *k, const float *v,
                                    const float *g, const float *beta,
                                    const int *cu_seqlens, int nseq, int T,
                                    int Hk, int Hv, int dk, int dv, int C,
                                    float *scratch, void *stream)
{
    return hk_cuda_gdn_chunk_tc_ex(o, states, tcs, q, k, v, g, beta, cu_seqlens,
                                   nseq, T, Hk, Hv, dk, dv, C, scratch, 0, NULL,
                                   stream);
}
