/*
 * hk_gdn_step.cu - one fused Gated DeltaNet decode step for B requests:
 * gates, the causal conv (+ SiLU) with its state shift, the l2 norms of q
 * and k, and the recurrence step, in one launch. Twin: the CPU's sequence
 * hk_conv1d_silu (T = 1) -> split q | k | v -> hk_l2norm (q scaled) ->
 * hk_gdn_gates -> hk_gdn_recurrent (T = 1), per request.
 *
 * Work is split by items (key head, request): the key head's q and k
 * channels are shared by its r = Hv / Hk value heads, so the block that
 * owns an item owns every reader of their conv state too, and shifts that
 * state in place with no other block racing it. The block convolves its
 * 2 dk + r dv channels (one thread per channel, old state read before the
 * same thread writes the new one), normalizes q and k in shared memory,
 * then runs the item's value heads by column slabs.
 *
 * The step is memory bound: each state is read once and written once, in
 * 16-byte vectors. Thread t owns 4 adjacent columns (t mod CW/4) of a
 * slab of CW columns and rows t div (CW/4) + nrg i (nrg = 256 / (CW/4)
 * row groups), so a warp reads whole 128-byte lines of a row. Per column,
 * o = S_new^T q is formed from the old state as the CPU does: u = S^T k
 * and w = S^T q in one pass (row-group partial sums added in a fixed
 * order through shared memory), then d = beta (v - a u), o = a w +
 * (k.q) d, and S <- a S + k d^T in the registers that hold it.
 *
 * The kernels (hk_cuda_step_impl_t):
 * - KH, the first: one block per item, CW = 128, the item's first slab
 *   loaded before its conv, the next slab only after the previous one is
 *   stored. Between a block's start and its first state bytes (the
 *   pointer table, then the loads) and during its conv, norms and
 *   barriers, its SM has only the other block's loads in flight.
 * - PIPE: a grid of about 2 (PIPE32: 3) blocks per SM, each running a
 *   contiguous range of items as a sequence of units (item, value head,
 *   slab of CW = 64 columns; PIPE32 and dk > 128: 32). Two register
 *   buffers alternate: unit u + 1's state loads are issued before unit u
 *   computes, so each block keeps a slab of loads in flight through the
 *   conv, the norms and the barriers, and every block does equal work
 *   (no last partial wave). The items' state and conv-state pointers are
 *   read into shared memory at the start; the gates of an item's heads
 *   with its conv. States stream with evict-first loads and stores.
 *   PIPEA: PIPE with each item's conv inputs copied ahead by cp.async.
 * - PIPEW: PIPE's units on 256 threads, each item's prologue (gates,
 *   conv, norms) on two warps of their own one item ahead, the states
 *   through a ring in shared memory (below).
 *
 * Each kernel has a probed instance (PROBE; hk_probe.h), launched only
 * while a bench probes the call: its phases are listed at the launches.
 *
 * dk <= 256, dv a multiple of 4, states 16-byte aligned.
 */
#include "kernels/cuda/hk_cuda_impl.h"
#include "kernels/cuda/hk_probe.h"
#include "kernels/cuda/hk_ptx.h"

#include <stdlib.h>
#include <string.h>

#define HK_STEP_THREADS 256
/* KH's slab width; 4 columns per thread. */
#define HK_STEP_CW 128
/* PIPE: at most this many items per block (their pointers sit in shared
 * memory); more items make more blocks. */
#define HK_STEP_MAX_PER 64

/* Shared memory: partial sums 2 [nrg][cw], d [cw] (16-byte aligned for
 * their float4s), the gates 2 [r], then q, k [dk], v [r dv]. */
static __host__ __device__ size_t hk_step_smem(int dk, int dv, int r, int cw)
{
    const int nrg = HK_STEP_THREADS / (cw / 4);
    return sizeof(float) * (2 * (size_t)dk + (size_t)r * dv +
                            2 * (size_t)nrg * cw + cw + 2 * (size_t)r);
}

/* The thread's R rows of 4 columns j0 + 4 cg of a state (zeros past its
 * edges). */
template <int R, bool STREAM>
static __device__ __forceinline__ void
hk_step_load(float4 (&s)[R], const float *Sh, int j0, int dk, int dv, int nrg,
             int rg, int cg)
{
    const int j = j0 + 4 * cg;
#pragma unroll
    for (int i = 0; i < R; i++) {
        const int row = rg + nrg * i;
        s[i] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        if (rg < nrg && row < dk && j < dv) {
            const float4 *p =
                reinterpret_cast<const float4 *>(Sh + (size_t)row * dv + j);
            s[i] = STREAM ? __ldcs(p) : *p;
        }
    }
}

/* The gates of item (kh, b)'s r value heads into gs [2 r] (a, beta), by
 * threads tid of nt. */
static __device__ __forceinline__ void
hk_step_gates(float *gs, const float *a, const float *bg, const float *A_log,
              const float *dt_bias, int kh, int b, int Hv, int r, int tid,
              int nt)
{
    for (int t = tid; t < r; t += nt) {
        const int h = kh * r + t;
        gs[2 * t] =
            expf(hk_math_gdn_gate(a[(size_t)b * Hv + h], A_log[h], dt_bias[h]));
        gs[2 * t + 1] = hk_math_sigmoid(bg[(size_t)b * Hv + h]);
    }
}

/* The conv (+ SiLU) of item (kh, b)'s 2 dk + r dv channels into qs (q |
 * k | v) and their state shift, one channel a thread (tid of nt) at a
 * time: the old state is read before the same thread writes the new one.
 * AI: x, the old conv state and the weights are read from xin
 * (hk_step_fetch_item's copies), not from global memory. */
template <bool AI>
static __device__ __forceinline__ void
hk_step_conv(float *qs, float *cst, const float *x, const float *conv_w, int kh,
             int Hk, int dk, int dv, int r, int K, const float *xin, int tid,
             int nt)
{
    const int kd = Hk * dk, S = K - 1, nch = 2 * dk + r * dv;
    for (int e = tid; e < nch; e += nt) {
        const int c = e < dk       ? kh * dk + e
                      : e < 2 * dk ? kd + kh * dk + (e - dk)
                                   : 2 * kd + kh * r * dv + (e - 2 * dk);
        const float *wc = AI ? xin + (size_t)nch * (1 + S) + (size_t)e * K
                             : conv_w + (size_t)c * K;
        float *st = cst ? cst + (size_t)c * S : NULL;
        const float *so = AI ? xin + nch + (size_t)e * S : st;
        const float xv = AI ? xin[e] : x[c];
        float acc = 0.0f;
        for (int j = 0; j < S; j++)
            acc += wc[j] * so[j];
        acc += wc[S] * xv;
        for (int j = 0; j + 1 < S; j++)
            st[j] = so[j + 1];
        if (S > 0)
            st[S - 1] = xv;
        qs[e] = hk_math_silu(acc);
    }
}

/* Thread vt's part (of nvt) of sum x_i y_i, i < n: what it gives
 * hk_block_sum in the norms (PIPEW's hk_step_vsum the same, so the same
 * sums). */
static __device__ __forceinline__ float
hk_step_dot_part(const float *x, const float *y, int n, int vt, int nvt)
{
    float s = 0.0f;
    for (int i = vt; i < n; i += nvt)
        s += x[i] * y[i];
    return s;
}

/* q, k [dk] times their l2 factors, by threads tid of nt. */
static __device__ __forceinline__ void hk_step_scale_qk(float *qs, float *ks,
                                                        int dk, float fq,
                                                        float fk, int tid,
                                                        int nt)
{
    for (int i = tid; i < dk; i += nt) {
        qs[i] *= fq;
        ks[i] *= fk;
    }
}

/* The conv (+ SiLU) of item (kh, b)'s channels, its state shift, the l2
 * norms (hk_norm.cu's: f32 tree, the factor in double) and the gates of its
 * value heads into gs [2 r] (a, beta), by the whole block. qs: q | k [dk] |
 * v [r dv], contiguous. Returns k.q; the norms' barriers publish qs, ks and
 * gs (vs is published by the first barrier). AI: hk_step_conv's. */
template <bool AI>
static __device__ float
hk_step_conv_norm(float *qs, float *gs, float *red, float *cst, const float *x,
                  const float *conv_w, const float *a, const float *bg,
                  const float *A_log, const float *dt_bias, int kh, int b,
                  int Hk, int Hv, int dk, int dv, int K, float eps,
                  float q_scale, const float *xin)
{
    const int tid = threadIdx.x, nt = blockDim.x, r = Hv / Hk;
    float *ks = qs + dk;
    hk_step_gates(gs, a, bg, A_log, dt_bias, kh, b, Hv, r, tid, nt);
    hk_step_conv<AI>(qs, cst, x, conv_w, kh, Hk, dk, dv, r, K, xin, tid, nt);
    __syncthreads();

    const float qq = hk_block_sum(hk_step_dot_part(qs, qs, dk, tid, nt), red);
    const float kk = hk_block_sum(hk_step_dot_part(ks, ks, dk, tid, nt), red);
    hk_step_scale_qk(qs, ks, dk, hk_l2_factor(qq, eps, q_scale),
                     hk_l2_factor(kk, eps, 1.0f), tid, nt);
    /* each thread reads the elements it scaled: no barrier before */
    return hk_block_sum(hk_step_dot_part(ks, qs, dk, tid, nt), red);
}

/* The slab threads' barrier: the block's (bar 0), or named barrier bar of
 * HK_STEP_THREADS threads. */
static __device__ __forceinline__ void hk_step_sync(int bar)
{
    if (bar == 0)
        __syncthreads();
    else
        hk_bar_sync(bar, HK_STEP_THREADS);
}

/* One slab (columns j0 .. j0 + cw) of value head Sh's state, held in s:
 * u, w by row-group sums, d and o by threads < cw, the update stored.
 * Ends with a barrier (pu, pw, dsh are rewritten next slab). Barriers:
 * the block's (bar 0) or named barrier bar of the HK_STEP_THREADS
 * threads that run the slabs (PIPEW). Probe points pt, pt + 1, pt + 2
 * after its three barriers: sums (the state's loads landed, u and w
 * summed), d (d and o), store (the update's stores issued). */
template <int R, bool STREAM>
static __device__ __forceinline__ void
hk_step_slab(float4 (&s)[R], float *Sh, float *oh, const float *qs,
             const float *ks, const float *vh, float *pu, float *pw, float *dsh,
             float ga, float beta, float kq, int j0, int cw, int dk, int dv,
             int nrg, int rg, int cg, int bar, const hk_probe &pr, int pt)
{
    const int tid = threadIdx.x;
    float4 u = make_float4(0.0f, 0.0f, 0.0f, 0.0f), w = u;
#pragma unroll
    for (int i = 0; i < R; i++) { /* rows past dk hold zeros */
        const int row = min(rg + nrg * i, dk - 1);
        const float kr = ks[row], qr = qs[row];
        u.x += s[i].x * kr;
        u.y += s[i].y * kr;
        u.z += s[i].z * kr;
        u.w += s[i].w * kr;
        w.x += s[i].x * qr;
        w.y += s[i].y * qr;
        w.z += s[i].z * qr;
        w.w += s[i].w * qr;
    }
    if (rg < nrg) {
        *reinterpret_cast<float4 *>(pu + (size_t)rg * cw + 4 * cg) = u;
        *reinterpret_cast<float4 *>(pw + (size_t)rg * cw + 4 * cg) = w;
    }
    hk_step_sync(bar);
    hk_probe_at(pr, pt);
    if (tid < cw && j0 + tid < dv) {
        float su = 0.0f, sw = 0.0f;
        for (int g = 0; g < nrg; g++) {
            su += pu[(size_t)g * cw + tid];
            sw += pw[(size_t)g * cw + tid];
        }
        const int j = j0 + tid;
        const float d = beta * (vh[j] - ga * su);
        oh[j] = ga * sw + kq * d;
        dsh[tid] = d;
    }
    hk_step_sync(bar);
    hk_probe_at(pr, pt + 1);
    const int j = j0 + 4 * cg;
    if (rg < nrg && j < dv) {
        const float4 d = *reinterpret_cast<const float4 *>(dsh + 4 * cg);
#pragma unroll
        for (int i = 0; i < R; i++) {
            const int row = rg + nrg * i;
            if (row >= dk)
                continue;
            const float kr = ks[row];
            float4 t = s[i];
            t.x = ga * t.x + kr * d.x;
            t.y = ga * t.y + kr * d.y;
            t.z = ga * t.z + kr * d.z;
            t.w = ga * t.w + kr * d.w;
            float4 *p = reinterpret_cast<float4 *>(Sh + (size_t)row * dv + j);
            if (STREAM)
                __stcs(p, t);
            else
                *p = t;
        }
    }
    hk_step_sync(bar);
    hk_probe_at(pr, pt + 2);
}

/* KH: one block per item (key head, request), R = 4-column rows per
 * thread (ceil(dk / nrg), rounded up). PROBE: the probed instance (here
 * and in PIPE, PIPEW: the points' registers made the unprobed ones spill
 * more). */
template <int R, bool PROBE>
static __global__ void __launch_bounds__(HK_STEP_THREADS, 2)
    hk_gdn_step_kernel(float *o,                  // [B, Hv, dv]
                       float *const *states,      // [B] of [Hv, dk, dv]
                       float *const *conv_states, // [B] of [cd, K-1], or 0
                       const float *qkv,          // [B, cd]
                       const float *a,            // [B, Hv]
                       const float *bg,           // [B, Hv]
                       const float *conv_w,       // [cd, K]
                       const float *A_log,        // [Hv]
                       const float *dt_bias,      // [Hv]
                       int Hk, int Hv, int dk, int dv, int K, float eps,
                       float q_scale, hk_probe probe)
{
    HK_DYNAMIC_SMEM(smem);
    const hk_probe pr = PROBE ? probe : hk_probe{NULL, 0};
    __shared__ float red[32];
    const int kh = blockIdx.x, b = blockIdx.y, r = Hv / Hk;
    const int tid = threadIdx.x;
    const int cd = 2 * Hk * dk + Hv * dv;
    const int cw = dv < HK_STEP_CW ? dv : HK_STEP_CW, ncg = cw / 4;
    const int nrg = HK_STEP_THREADS / ncg;
    const int cg = tid % ncg, rg = tid / ncg;
    float *pu = (float *)smem, *pw = pu + (size_t)nrg * cw;
    float *dsh = pw + (size_t)nrg * cw, *gs = dsh + cw;
    float *qs = gs + 2 * r, *ks = qs + dk, *vs = ks + dk; /* contiguous */
    float *const Sb = states[b];
    float4 s[R];

    hk_probe_start(pr);
    /* The first slab's loads go out before the conv. */
    hk_step_load<R, false>(s, Sb + (size_t)kh * r * dk * dv, 0, dk, dv, nrg, rg,
                           cg);
    const float kq = hk_step_conv_norm<false>(
        qs, gs, red, conv_states ? conv_states[b] : NULL, qkv + (size_t)b * cd,
        conv_w, a, bg, A_log, dt_bias, kh, b, Hk, Hv, dk, dv, K, eps, q_scale,
        NULL);
    hk_probe_at(pr, 0);

    int pt = 1; /* the slab's first probe point */
    for (int hh = 0; hh < r; hh++) {
        const int h = kh * r + hh;
        float *Sh = Sb + (size_t)h * dk * dv;
        for (int j0 = 0; j0 < dv; j0 += cw, pt += 3) {
            if (hh > 0 || j0 > 0)
                hk_step_load<R, false>(s, Sh, j0, dk, dv, nrg, rg, cg);
            hk_step_slab<R, false>(s, Sh, o + ((size_t)b * Hv + h) * dv, qs, ks,
                                   vs + (size_t)hh * dv, pu, pw, dsh,
                                   gs[2 * hh], gs[2 * hh + 1], kq, j0, cw, dk,
                                   dv, nrg, rg, cg, 0, pr, pt);
        }
    }
}

/* PIPEA, PIPEW: item (kh, b)'s conv inputs into xin by cp.async
 * (threads tid of nt, one group each): its 2 dk + r dv channels' inputs x (16
 * bytes a copy: qkv and the counts 16-byte aligned, as the launch checks), old
 * conv states (4 bytes a copy: a state's alignment is its pool's) and
 * conv weights (16 bytes), in hk_step_conv_norm's xin layout. */
static __device__ void hk_step_fetch_item(float *xin, const float *xrow,
                                          const float *cst, const float *conv_w,
                                          int kh, int Hk, int dk, int r, int dv,
                                          int K, int tid, int nt)
{
    const int S = K - 1;
    const int nch = 2 * dk + r * dv, kd = Hk * dk;
    /* the item's three runs of channels: q, k, v (local e0, global c0) */
    const int e0[3] = {0, dk, 2 * dk}, len[3] = {dk, dk, r * dv};
    const int c0[3] = {kh * dk, kd + kh * dk, 2 * kd + kh * r * dv};
    for (int g = 0; g < 3; g++) {
        for (int i = 4 * tid; i < len[g]; i += 4 * nt)
            hk_cp_async16(xin + e0[g] + i, xrow + c0[g] + i, 16);
        for (int i = tid; cst && i < len[g] * S; i += nt)
            hk_cp_async4(xin + nch + (size_t)e0[g] * S + i,
                         cst + (size_t)c0[g] * S + i);
        for (int i = 4 * tid; i < len[g] * K; i += 4 * nt)
            hk_cp_async16(xin + (size_t)nch * (1 + S) + (size_t)e0[g] * K + i,
                          conv_w + (size_t)c0[g] * K + i, 16);
    }
    hk_cp_async_commit();
}

/* Floats of PIPEA's xin buffer. */
static __host__ __device__ size_t hk_step_xin(int dk, int dv, int r, int K)
{
    return (size_t)(2 * dk + r * dv) * (size_t)(2 * K);
}

/* PIPE: block x runs items x per .. x per + per - 1 (of Hk B; key head
 * fastest) as units (item, value head, slab of cw columns), two state
 * buffers in turn: unit u + 1's loads go out before unit u computes.
 * PIPEA (AI): each item's conv inputs are copied into shared memory
 * (hk_step_fetch_item) while the previous item's slabs run, so its conv
 * waits on no global load. */
template <int R, int MINB> struct hk_step_pipe {
    float *o;
    float *const *states, *const *conv_states;
    const float *qkv, *a, *bg, *conv_w, *A_log, *dt_bias;
    int B, Hk, Hv, dk, dv, K, cw, per;
    float eps, q_scale;
    hk_probe pr; /* off unless a bench probes the launch */
};

template <int R, int MINB, bool AI, bool PROBE>
static __global__ void __launch_bounds__(HK_STEP_THREADS, MINB)
    hk_gdn_step_pipe_kernel(const hk_step_pipe<R, MINB> p)
{
    HK_DYNAMIC_SMEM(smem);
    const hk_probe pr = PROBE ? p.pr : hk_probe{NULL, 0};
    __shared__ float red[32];
    __shared__ float *sps[HK_STEP_MAX_PER], *cps[HK_STEP_MAX_PER];
    const int Hk = p.Hk, Hv = p.Hv, dk = p.dk, dv = p.dv, cw = p.cw;
    const int r = Hv / Hk, tid = threadIdx.x;
    const int cd = 2 * Hk * dk + Hv * dv;
    const int ncg = cw / 4, nrg = HK_STEP_THREADS / ncg;
    const int cg = tid % ncg, rg = tid / ncg;
    const int nslab = (dv + cw - 1) / cw, U = r * nslab;
    const int it0 = blockIdx.x * p.per;
    const int nit = min(p.per, p.Hk * p.B - it0);
    float *pu = (float *)smem, *pw = pu + (size_t)nrg * cw;
    float *dsh = pw + (size_t)nrg * cw, *gs = dsh + cw;
    float *qs = gs + 2 * r, *ks = qs + dk, *vs = ks + dk; /* contiguous */
    /* AI: the item inputs' buffer, 16-byte aligned after the rest */
    float *xin = (float *)smem +
                 (hk_step_smem(dk, dv, r, cw) / sizeof(float) + 3) / 4 * 4;
    auto fetch = [&](int n) {
        const int kh = (it0 + n) % Hk, b = (it0 + n) / Hk;
        hk_step_fetch_item(xin, p.qkv + (size_t)b * cd, cps[n], p.conv_w, kh,
                           Hk, dk, r, dv, p.K, tid, HK_STEP_THREADS);
    };

    hk_probe_start(pr);
    if (tid < nit) {
        const int b = (it0 + tid) / Hk;
        sps[tid] = p.states[b];
        cps[tid] = p.conv_states ? p.conv_states[b] : NULL;
    }
    __syncthreads();
    hk_probe_at(pr, 0);
    if (AI && nit > 0) {
        fetch(0);
    }

    /* Unit u: item n = u / U, value head hh, columns j0. */
#define HK_PIPE_UNIT(u, n, hh, j0)                                             \
    const int n = (u) / U, hh = (u) % U / nslab, j0 = (u) % nslab * cw
    auto load = [&](float4(&s)[R], int u) {
        HK_PIPE_UNIT(u, n, hh, j0);
        const int h = (it0 + n) % Hk * r + hh;
        hk_step_load<R, true>(s, sps[n] + (size_t)h * dk * dv, j0, dk, dv, nrg,
                              rg, cg);
    };
    float kq = 0.0f;
    auto step = [&](float4(&s)[R], int u) {
        HK_PIPE_UNIT(u, n, hh, j0);
        const int kh = (it0 + n) % Hk, b = (it0 + n) / Hk, h = kh * r + hh;
        if (u % U == 0) { /* the item's first unit: its conv and norms */
            if (AI) {     /* its inputs landed (every thread's copies) */
                hk_cp_async_wait<0>();
                __syncthreads();
            }
            kq = hk_step_conv_norm<AI>(qs, gs, red, cps[n],
                                       p.qkv + (size_t)b * cd, p.conv_w, p.a,
                                       p.bg, p.A_log, p.dt_bias, kh, b, Hk, Hv,
                                       dk, dv, p.K, p.eps, p.q_scale, xin);
            hk_probe_at(pr, 1 + 4 * u);
            /* the next item's, over these: their last reads (the conv) are
             * behind the norms' barriers */
            if (AI && n + 1 < nit)
                fetch(n + 1);
        }
        hk_step_slab<R, true>(
            s, sps[n] + (size_t)h * dk * dv, p.o + ((size_t)b * Hv + h) * dv,
            qs, ks, vs + (size_t)hh * dv, pu, pw, dsh, gs[2 * hh],
            gs[2 * hh + 1], kq, j0, cw, dk, dv, nrg, rg, cg, 0, pr, 2 + 4 * u);
    };
#undef HK_PIPE_UNIT
    float4 sa[R], sb[R];
    const int nu = nit * U;
    load(sa, 0);
    for (int u = 0;; u += 2) {
        if (u + 1 < nu)
            load(sb, u + 1);
        step(sa, u);
        if (u + 1 >= nu)
            break;
        if (u + 2 < nu)
            load(sa, u + 2);
        step(sb, u + 1);
        if (u + 2 >= nu)
            break;
    }
}

/* ---- PIPEW: the item prologue on warps of its own, states through a ring
 *
 * PIPE's units and sums, with the block split by role (warp
 * specialization): HK_STEP_THREADS slab threads run the units, and
 * HK_STEP_PRO_THREADS prologue threads run each item's gates, conv and
 * norms (from PIPEA's copies of its inputs) one item ahead, into one of
 * two item buffers. The slab threads wait for an item's buffer (named
 * barrier FULL + buffer) at its first unit and hand it back (EMPTY +
 * buffer) after its last; so no item's conv, norms or their barriers
 * stand between two of the slab threads' units. Each slab thread copies
 * the 16-byte vectors of a unit's state it will itself read into a ring
 * of HK_STEP_NS stages by cp.async, HK_STEP_NS - 1 units ahead (no
 * barrier: no thread reads another's copies), so about 96 KB of state
 * is in flight at any time where PIPE keeps one 32 KB slab. One block an
 * SM. The norms' sums are hk_block_sum's tree over HK_STEP_THREADS
 * virtual threads (hk_step_vsum): PIPE's outputs bit for bit. Why: on the
 * H200 PIPE's per-item costs (conv, norms and their barriers, ~5 us an
 * item from its 0.8B / Next rows) are when its SM's memory idles. */

#define HK_STEP_PRO_THREADS 64
#define HK_STEP_W_THREADS   (HK_STEP_THREADS + HK_STEP_PRO_THREADS)
#define HK_STEP_NS          4 /* ring stages */
/* named barriers: FULL and EMPTY + item buffer (0, 1), the slab threads',
 * the prologue threads' */
#define HK_STEP_BAR_FULL  1
#define HK_STEP_BAR_EMPTY 3
#define HK_STEP_BAR_SLAB  5
#define HK_STEP_BAR_PRO   6

struct hk_step_w_smem {
    float4 *ring; // [NS][R][HK_STEP_THREADS]
    float *pu, *pw, *dsh;
    float *ib[2]; // gates [2 r] | q, k [dk] | v [r dv] | k.q
    float *xin;   // hk_step_xin floats
    float *red;   // [HK_STEP_THREADS / 32]
};

static __host__ __device__ size_t hk_step_w_carve(hk_step_w_smem *m,
                                                  unsigned char *p, int R,
                                                  int dk, int dv, int r, int K,
                                                  int cw)
{
    const int nrg = HK_STEP_THREADS / (cw / 4);
    const size_t ib = 2 * (size_t)r + 2 * (size_t)dk + (size_t)r * dv + 1;
    const size_t sz[7] = {(size_t)HK_STEP_NS * R * HK_STEP_THREADS *
                              sizeof(float4),
                          2 * (size_t)nrg * cw * sizeof(float),
                          (size_t)cw * sizeof(float),
                          ib * sizeof(float),
                          ib * sizeof(float),
                          hk_step_xin(dk, dv, r, K) * sizeof(float),
                          HK_STEP_THREADS / 32 * sizeof(float)};
    size_t off[7];
    const size_t at = hk_layout(sz, 7, 16, off);
    if (m) {
        m->ring = (float4 *)(p + off[0]);
        m->pu = (float *)(p + off[1]);
        m->pw = m->pu + (size_t)nrg * cw;
        m->dsh = (float *)(p + off[2]);
        m->ib[0] = (float *)(p + off[3]);
        m->ib[1] = (float *)(p + off[4]);
        m->xin = (float *)(p + off[5]);
        m->red = (float *)(p + off[6]);
    }
    return at;
}

/* hk_block_sum of a block of HK_STEP_THREADS threads whose thread v holds
 * part(v), by the prologue threads (pt: 0 .. HK_STEP_PRO_THREADS - 1): the
 * same warp sums and the same sum of them, so the same bits. sh:
 * HK_STEP_THREADS / 32 floats. */
template <class F>
static __device__ __forceinline__ float hk_step_vsum(F part, float *sh, int pt)
{
    const int lane = pt & 31;
    for (int vw = pt >> 5; vw < HK_STEP_THREADS / 32;
         vw += HK_STEP_PRO_THREADS / 32) {
        const float x = hk_warp_sum(part(vw * 32 + lane));
        if (lane == 0)
            sh[vw] = x;
    }
    hk_bar_sync(HK_STEP_BAR_PRO, HK_STEP_PRO_THREADS);
    float t = lane < HK_STEP_THREADS / 32 ? sh[lane] : 0.0f;
    t = hk_warp_sum(t);
    hk_bar_sync(HK_STEP_BAR_PRO, HK_STEP_PRO_THREADS); /* sh is reused */
    return t;
}

/* PIPEW's prologue threads (pt): each of the block's items into item
 * buffer n % 2 once the slab threads have handed it back, then FULL. */
template <int R>
static __device__ void
hk_step_w_prologue(const hk_step_pipe<R, 1> &p, const hk_step_w_smem &m,
                   float *const *cps, int it0, int nit, int pt)
{
    const int Hk = p.Hk, Hv = p.Hv, dk = p.dk, dv = p.dv, r = Hv / Hk;
    const int cd = 2 * Hk * dk + Hv * dv, np = HK_STEP_PRO_THREADS;
    auto fetch = [&](int n) {
        const int kh = (it0 + n) % Hk, b = (it0 + n) / Hk;
        hk_step_fetch_item(m.xin, p.qkv + (size_t)b * cd, cps[n], p.conv_w, kh,
                           Hk, dk, r, dv, p.K, pt, np);
    };
    if (nit > 0)
        fetch(0);
    for (int n = 0; n < nit; n++) {
        const int kh = (it0 + n) % Hk, b = (it0 + n) / Hk;
        float *gs = m.ib[n & 1], *qs = gs + 2 * r, *ks = qs + dk;
        if (n >= 2) /* item n - 2's last unit is done with the buffer */
            hk_bar_sync(HK_STEP_BAR_EMPTY + (n & 1), HK_STEP_W_THREADS);
        hk_step_gates(gs, p.a, p.bg, p.A_log, p.dt_bias, kh, b, Hv, r, pt, np);
        hk_cp_async_wait<0>();
        hk_bar_sync(HK_STEP_BAR_PRO, np); /* every thread's copies landed */
        hk_step_conv<true>(qs, cps[n], NULL, p.conv_w, kh, Hk, dk, dv, r, p.K,
                           m.xin, pt, np);
        hk_bar_sync(HK_STEP_BAR_PRO, np); /* q | k | v written, xin read */
        if (n + 1 < nit)
            fetch(n + 1);
        const float qq = hk_step_vsum(
            [&](int v) {
                return hk_step_dot_part(qs, qs, dk, v, HK_STEP_THREADS);
            },
            m.red, pt);
        const float kk = hk_step_vsum(
            [&](int v) {
                return hk_step_dot_part(ks, ks, dk, v, HK_STEP_THREADS);
            },
            m.red, pt);
        hk_step_scale_qk(qs, ks, dk, hk_l2_factor(qq, p.eps, p.q_scale),
                         hk_l2_factor(kk, p.eps, 1.0f), pt, np);
        hk_bar_sync(HK_STEP_BAR_PRO, np); /* scaled by other threads */
        const float kq = hk_step_vsum(
            [&](int v) {
                return hk_step_dot_part(ks, qs, dk, v, HK_STEP_THREADS);
            },
            m.red, pt);
        if (pt == 0)
            qs[2 * dk + r * dv] = kq;
        /* orders this thread's writes before the slab threads' reads */
        hk_bar_arrive(HK_STEP_BAR_FULL + (n & 1), HK_STEP_W_THREADS);
    }
}

/* PIPEW: PIPE's block ranges and units; threads below HK_STEP_THREADS run
 * the units, the rest hk_step_w_prologue. */
template <int R, bool PROBE>
static __global__ void __launch_bounds__(HK_STEP_W_THREADS, 1)
    hk_gdn_step_pipew_kernel(const hk_step_pipe<R, 1> p)
{
    HK_DYNAMIC_SMEM(smem);
    const hk_probe pr = PROBE ? p.pr : hk_probe{NULL, 0};
    __shared__ float *sps[HK_STEP_MAX_PER], *cps[HK_STEP_MAX_PER];
    const int Hk = p.Hk, Hv = p.Hv, dk = p.dk, dv = p.dv, cw = p.cw;
    const int r = Hv / Hk, tid = threadIdx.x;
    const int ncg = cw / 4, nrg = HK_STEP_THREADS / ncg;
    const int cg = tid % ncg, rg = tid / ncg;
    const int nslab = (dv + cw - 1) / cw, U = r * nslab;
    const int it0 = blockIdx.x * p.per;
    const int nit = min(p.per, p.Hk * p.B - it0), nu = nit * U;
    hk_step_w_smem m;
    hk_step_w_carve(&m, smem, R, dk, dv, r, p.K, cw);

    hk_probe_start(pr);
    if (tid < nit) {
        const int b = (it0 + tid) / Hk;
        sps[tid] = p.states[b];
        cps[tid] = p.conv_states ? p.conv_states[b] : NULL;
    }
    __syncthreads(); /* the last barrier of all the block's threads */
    hk_probe_at(pr, 0);
    if (tid >= HK_STEP_THREADS) {
        hk_step_w_prologue<R>(p, m, cps, it0, nit, tid - HK_STEP_THREADS);
        return;
    }

    /* Unit u (item n = u / U, value head hh, columns j0): this thread's
     * rows of 4 columns (hk_step_load's, zeros past the edges) into ring
     * stage u % NS; one group a unit, empty past the last. */
    auto issue = [&](int u) {
        if (u < nu) {
            const int n = u / U, hh = u % U / nslab,
                      j = u % nslab * cw + 4 * cg;
            const float *Sh =
                sps[n] + (size_t)((it0 + n) % Hk * r + hh) * dk * dv;
            float4 *st =
                m.ring + (size_t)(u % HK_STEP_NS) * R * HK_STEP_THREADS + tid;
#pragma unroll
            for (int i = 0; i < R; i++) {
                const int row = rg + nrg * i;
                const bool in = rg < nrg && row < dk && j < dv;
                hk_cp_async16(st + i * HK_STEP_THREADS,
                              in ? Sh + (size_t)row * dv + j : Sh, in ? 16 : 0);
            }
        }
        hk_cp_async_commit();
    };
    for (int u = 0; u < HK_STEP_NS - 1; u++)
        issue(u);
    for (int u = 0; u < nu; u++) {
        /* into the stage unit u - 1 was read from (by this thread) */
        issue(u + HK_STEP_NS - 1);
        hk_cp_async_wait<HK_STEP_NS - 1>(); /* unit u's copies landed */
        const int n = u / U, hh = u % U / nslab, j0 = u % nslab * cw;
        const int kh = (it0 + n) % Hk, b = (it0 + n) / Hk, h = kh * r + hh;
        const float *gs = m.ib[n & 1], *qs = gs + 2 * r, *ks = qs + dk;
        if (u % U == 0) /* the item's buffer is filled */
            hk_bar_sync(HK_STEP_BAR_FULL + (n & 1), HK_STEP_W_THREADS);
        hk_probe_at(pr, 1 + 4 * u); /* thread 0's copies (and FULL) */
        float4 s[R];
        const float4 *st =
            m.ring + (size_t)(u % HK_STEP_NS) * R * HK_STEP_THREADS + tid;
#pragma unroll
        for (int i = 0; i < R; i++)
            s[i] = st[i * HK_STEP_THREADS];
        hk_step_slab<R, true>(
            s, sps[n] + (size_t)h * dk * dv, p.o + ((size_t)b * Hv + h) * dv,
            qs, ks, ks + dk + (size_t)hh * dv, m.pu, m.pw, m.dsh, gs[2 * hh],
            gs[2 * hh + 1], ks[dk + r * dv], j0, cw, dk, dv, nrg, rg, cg,
            HK_STEP_BAR_SLAB, pr, 2 + 4 * u);
        /* the slab's last barrier: every slab thread is done with the
         * buffer; none waits for the last two items' */
        if (u % U == U - 1 && n + 2 < nit)
            hk_bar_arrive(HK_STEP_BAR_EMPTY + (n & 1), HK_STEP_W_THREADS);
    }
}

/* DEFAULT: HYPIC_CUDA_STEP, read once (a thread-safe local static). */
static hk_cuda_step_impl_t hk_step_resolve(hk_cuda_step_impl_t impl)
{
    static const char *const names[] = {"kh", "pipe32", "pipea", "pipew"};
    static const int values[] = {HK_CUDA_STEP_KH, HK_CUDA_STEP_PIPE32,
                                 HK_CUDA_STEP_PIPEA, HK_CUDA_STEP_PIPEW};
    static const hk_cuda_step_impl_t env = (hk_cuda_step_impl_t)hk_env_choice(
        "HYPIC_CUDA_STEP", names, values, 4, HK_CUDA_STEP_PIPE);
    return impl == HK_CUDA_STEP_DEFAULT ? env : impl;
}

/* The probes' phases (hk_probe.h; on while a bench probes a call): KH's
 * conv (gates, conv and norms, its first slab's loads in flight), then a
 * slab's sums, d, store (hk_step_slab's); the others' ptrs (the block's
 * pointer tables read), then a unit's conv (an item's first unit only:
 * gates, conv, norms), sums, d, store. PIPEW's wait in conv's place: thread
 * 0's own copies of the unit landed (no barrier) and, at an item's first
 * unit, the prologue warps' hand-over. Named by the kernel that ran (PIPE
 * where PIPEA or PIPEW fall back to it). */
static const char *const hk_step_kh_phases[] = {"conv", "sums", "d", "store"};
static const char *const hk_step_pipe_phases[] = {"ptrs", "conv", "sums", "d",
                                                  "store"};
static const char *const hk_step_w_phases[] = {"ptrs", "wait", "sums", "d",
                                               "store"};
static const hk_probe_kind hk_step_kh_probe = {"KH", hk_step_kh_phases, 1, 3,
                                               0};
static const hk_probe_kind hk_step_pipe_probe = {"PIPE", hk_step_pipe_phases, 1,
                                                 4, 0};
static const hk_probe_kind hk_step_pipe32_probe = {
    "PIPE32", hk_step_pipe_phases, 1, 4, 0};
static const hk_probe_kind hk_step_pipea_probe = {"PIPEA", hk_step_pipe_phases,
                                                  1, 4, 0};
static const hk_probe_kind hk_step_pipew_probe = {"PIPEW", hk_step_w_phases, 1,
                                                  4, 0};

/* Units (value head, slab) of an item. */
static int hk_step_units(int Hk, int Hv, int dv, int cw)
{
    return Hv / Hk * ((dv + cw - 1) / cw);
}

template <int R, int MINB, bool AI>
static int hk_step_pipe_launch(const hk_step_pipe<R, MINB> &p, size_t sm,
                               const hk_probe_kind *pk, cudaStream_t s)
{
    const int sms = hk_cuda_sm_count(1);
    /* equal shares of the items over about MINB blocks per SM */
    const long long items = (long long)p.Hk * p.B;
    long long per = HK_CEIL_DIV(items, (long long)MINB * sms);
    if (per > HK_STEP_MAX_PER)
        per = HK_STEP_MAX_PER;
    hk_step_pipe<R, MINB> q = p;
    q.per = (int)per;
    const long long grid = HK_CEIL_DIV(items, per);
    if (grid > 2147483647LL)
        return HK_CUDA_EINVAL;
    q.pr = hk_probe_launch(pk, (size_t)grid,
                           (int)per * hk_step_units(p.Hk, p.Hv, p.dv, p.cw), s);
    if (q.pr.at)
        hk_gdn_step_pipe_kernel<R, MINB, AI, true>
            <<<(unsigned)grid, HK_STEP_THREADS, sm, s>>>(q);
    else
        hk_gdn_step_pipe_kernel<R, MINB, AI, false>
            <<<(unsigned)grid, HK_STEP_THREADS, sm, s>>>(q);
    return hk_cuda_check_launch();
}

/* PIPEW over about one block per SM; *fits false (nothing launched) where
 * its shared memory, static and dynamic, passes the device's limit. */
template <int R>
static int hk_step_w_launch(const hk_step_pipe<R, 1> &p, cudaStream_t s,
                            bool *fits)
{
    const size_t sm =
        hk_step_w_carve(NULL, NULL, R, p.dk, p.dv, p.Hv / p.Hk, p.K, p.cw);
    /* the limit holds the static part (the pointer tables) too */
    *fits = sm + 2 * HK_STEP_MAX_PER * sizeof(float *) <=
                (size_t)hk_cuda_smem_optin() &&
            cudaFuncSetAttribute(hk_gdn_step_pipew_kernel<R, false>,
                                 cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 (int)sm) == cudaSuccess &&
            cudaFuncSetAttribute(hk_gdn_step_pipew_kernel<R, true>,
                                 cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 (int)sm) == cudaSuccess;
    if (!*fits) {
        (void)cudaGetLastError(); /* a refused attribute: PIPE instead */
        return HK_CUDA_EINVAL;
    }
    const long long items = (long long)p.Hk * p.B;
    long long per = HK_CEIL_DIV(items, (long long)hk_cuda_sm_count(1));
    if (per > HK_STEP_MAX_PER)
        per = HK_STEP_MAX_PER;
    hk_step_pipe<R, 1> q = p;
    q.per = (int)per;
    const long long grid = HK_CEIL_DIV(items, per);
    if (grid > 2147483647LL)
        return HK_CUDA_EINVAL;
    q.pr = hk_probe_launch(&hk_step_pipew_probe, (size_t)grid,
                           (int)per * hk_step_units(p.Hk, p.Hv, p.dv, p.cw), s);
    if (q.pr.at)
        hk_gdn_step_pipew_kernel<R, true>
            <<<(unsigned)grid, HK_STEP_W_THREADS, sm, s>>>(q);
    else
        hk_gdn_step_pipew_kernel<R, false>
            <<<(unsigned)grid, HK_STEP_W_THREADS, sm, s>>>(q);
    return hk_cuda_check_launch();
}

extern "C" int
hk_cuda_gdn_step_impl(hk_cuda_step_impl_t impl, float *o, float *const *states,
                      float *const *conv_states, const float *qkv,
                      const float *a, const float *b, const float *conv_w,
                      const float *A_log, const float *dt_bias, int B, int Hk,
                      int Hv, int dk, int dv, int K, float eps, float q_scale,
                      void *stream)
{
    if (B < 0 || B > HK_CUDA_MAX_GRID_YZ || Hk < 1 || Hv < 1 || Hv % Hk ||
        dk < 1 || dk > HK_CUDA_GDN_MAX_DK || dv < 4 || dv % 4 || K < 1 ||
        (B > 0 && (!states || (K > 1 && !conv_states))) ||
        impl < HK_CUDA_STEP_DEFAULT || impl > HK_CUDA_STEP_PIPEW)
        return HK_CUDA_EINVAL;
    if (B == 0)
        return HK_CUDA_OK;
    impl = hk_step_resolve(impl);
    const int r = Hv / Hk;
    const cudaStream_t s = hk_stream(stream);
    if (impl != HK_CUDA_STEP_KH) {
        /* 8 rows of 4 columns per thread and buffer at most: cw 64 up to
         * dk 128 (PIPE32: 32), half that above */
        int cw = impl == HK_CUDA_STEP_PIPE32 ? 32 : 64;
        if (dk > 128)
            cw /= 2;
        if (dv < cw)
            cw = dv;
        const int nrg = HK_STEP_THREADS / (cw / 4);
        const int rows = (dk + nrg - 1) / nrg;
        size_t sm = hk_step_smem(dk, dv, r, cw);
        if (sm > 48 * 1024)
            return HK_CUDA_EINVAL;
        /* PIPEA and PIPEW where their copies can run (16-byte runs of x
         * and the weights) and their buffers fit; PIPE otherwise */
        const bool copies =
            dk % 4 == 0 && hk_aligned(qkv, 16) && hk_aligned(conv_w, 16);
#define HK_PIPE_ARGS(R, MINB)                                                  \
    hk_step_pipe<R, MINB>                                                      \
    {                                                                          \
        o, states, conv_states, qkv, a, b, conv_w, A_log, dt_bias, B, Hk, Hv,  \
            dk, dv, K, cw, 0, eps, q_scale,                                    \
        {                                                                      \
            NULL, 0                                                            \
        }                                                                      \
    }
        if (impl == HK_CUDA_STEP_PIPE32)
            return hk_step_pipe_launch<4, 3, false>(HK_PIPE_ARGS(4, 3), sm,
                                                    &hk_step_pipe32_probe, s);
        bool fits = false;
        if (impl == HK_CUDA_STEP_PIPEW && copies) {
            const int rc =
                rows <= 4 ? hk_step_w_launch<4>(HK_PIPE_ARGS(4, 1), s, &fits)
                          : hk_step_w_launch<8>(HK_PIPE_ARGS(8, 1), s, &fits);
            if (fits)
                return rc;
        }
        const size_t sma =
            (sm + 15) / 16 * 16 + hk_step_xin(dk, dv, r, K) * sizeof(float);
        const bool ai =
            impl == HK_CUDA_STEP_PIPEA && copies && sma <= 48 * 1024;
        if (ai)
            sm = sma;
#define HK_PIPE(R, AI)                                                         \
    hk_step_pipe_launch<R, 2, AI>(                                             \
        HK_PIPE_ARGS(R, 2), sm,                                                \
        AI ? &hk_step_pipea_probe : &hk_step_pipe_probe, s)
        if (ai)
            return rows <= 4 ? HK_PIPE(4, true) : HK_PIPE(8, true);
        return rows <= 4 ? HK_PIPE(4, false) : HK_PIPE(8, false);
#undef HK_PIPE
#undef HK_PIPE_ARGS
    }
    const int cw = dv < HK_STEP_CW ? dv : HK_STEP_CW;
    const int nrg = HK_STEP_THREADS / (cw / 4);
    const int rows = (dk + nrg - 1) / nrg;
    const size_t sm = hk_step_smem(dk, dv, r, cw);
    if (sm > 48 * 1024)
        return HK_CUDA_EINVAL;
    const dim3 grid(Hk, B);
    const hk_probe pr = hk_probe_launch(&hk_step_kh_probe, (size_t)Hk * B,
                                        hk_step_units(Hk, Hv, dv, cw), s);
#define HK_STEP(R)                                                             \
    do {                                                                       \
        if (pr.at)                                                             \
            hk_gdn_step_kernel<R, true><<<grid, HK_STEP_THREADS, sm, s>>>(     \
                o, states, conv_states, qkv, a, b, conv_w, A_log, dt_bias, Hk, \
                Hv, dk, dv, K, eps, q_scale, pr);                              \
        else                                                                   \
            hk_gdn_step_kernel<R, false><<<grid, HK_STEP_THREADS, sm, s>>>(    \
                o, states, conv_states, qkv, a, b, conv_w, A_log, dt_bias, Hk, \
                Hv, dk, dv, K, eps, q_scale, pr);                              \
    } while (0)
    if (rows <= 4)
        HK_STEP(4);
    else if (rows <= 8)
        HK_STEP(8);
    else if (rows <= 16)
        HK_STEP(16);
    else /* dk <= 256 rows over >= 8 row groups */
        HK_STEP(32);
#undef HK_STEP
    return hk_cuda_check_launch();
}

extern "C" int hk_cuda_gdn_step(float *o, float *const *states,
                                float *const *conv_states, const float *qkv,
                                const float *a, const float *b,
                                const float *conv_w, const float *A_log,
                                const float *dt_bias, int B, int Hk, int Hv,
                                int dk, int dv, int K, float eps, float q_scale,
                                void *stream)
{
    return hk_cuda_gdn_step_impl(HK_CUDA_STEP_DEFAULT, o, states, conv_states,
                                 qkv, a, b, conv_w, A_log, dt_bias, B, Hk, Hv,
                                 dk, dv, K, eps, q_scale, stream);
}
