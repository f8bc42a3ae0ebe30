/*
 * hk_gdn_step.cu - one fused Gated DeltaNet decode step for B requests:
 * gates, the causal conv (+ SiLU) with its state shift, the l2 norms of q
 * and k, and the recurrence step, in one launch. Twin: the CPU's sequence
 * hk_conv1d_silu (T = 1) -> split q | k | v -> hk_l2norm (q scaled) ->
 * hk_gdn_gates -> hk_gdn_recurrent (T = 1), per request.
 *
 * One block per (key head, request): the key head's q and k channels are
 * shared by its r = Hv / Hk value heads, so the block that owns them owns
 * every reader of their conv state too, and shifts that state in place
 * with no other block racing it. The block convolves its 2 dk + r dv
 * channels (one thread per channel, old state read before the same thread
 * writes the new one), normalizes q and k in shared memory, then runs its
 * value heads one after the other.
 *
 * The step is memory bound: each state is read once and written once, in
 * 16-byte vectors. Thread t owns 4 adjacent columns (t mod CW/4) of a
 * slab of CW <= 128 columns and rows t div (CW/4) + nrg i (nrg = 256 /
 * (CW/4) row groups), so a warp reads 512 contiguous bytes of a row. The
 * block issues a head's state loads before its conv and norms, so they
 * are in flight meanwhile. Per column, o = S_new^T q is formed from the old
 * state as the CPU does: u = S^T k and w = S^T q in one pass (row-group
 * partial sums added in a fixed order through shared memory), then
 * d = beta (v - a u), o = a w + (k.q) d, and S <- a S + k d^T in the
 * registers that hold it.
 *
 * dk <= 256, dv a multiple of 4, states 16-byte aligned.
 */
#include "kernels/cuda/hk_cuda_impl.h"

#define HK_STEP_THREADS 256
/* Columns of a slab; 4 per thread. */
#define HK_STEP_CW 128

/* Shared memory: partial sums 2 [nrg][CW], d [CW] (16-byte aligned for
 * their float4s), then q, k [dk], v [r dv]. */
static size_t hk_step_smem(int dk, int dv, int r)
{
    const int cw = dv < HK_STEP_CW ? dv : HK_STEP_CW;
    const int nrg = HK_STEP_THREADS / (cw / 4);
    return sizeof(float) *
           (2 * (size_t)dk + (size_t)r * dv + 2 * (size_t)nrg * cw + cw);
}

/* The thread's R rows of 4 columns j0 + 4 cg of a state (zeros past its
 * edges). */
template <int R>
static __device__ __forceinline__ void
hk_step_load(float4 (&s)[R], const float *Sh, int j0, int dk, int dv, int nrg,
             int rg, int cg)
{
    const int j = j0 + 4 * cg;
#pragma unroll
    for (int i = 0; i < R; i++) {
        const int row = rg + nrg * i;
        s[i] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        if (rg < nrg && row < dk && j < dv)
            s[i] = *reinterpret_cast<const float4 *>(Sh + (size_t)row * dv + j);
    }
}

/* R = 4-column rows per thread (ceil(dk / nrg), rounded up). */
template <int R>
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
                       float q_scale)
{
    HK_DYNAMIC_SMEM(smem);
    __shared__ float red[32];
    const int kh = blockIdx.x, b = blockIdx.y, r = Hv / Hk;
    const int tid = threadIdx.x;
    const int kd = Hk * dk, cd = 2 * kd + Hv * dv, S = K - 1;
    const int cw = dv < HK_STEP_CW ? dv : HK_STEP_CW, ncg = cw / 4;
    const int nrg = HK_STEP_THREADS / ncg;
    const int cg = tid % ncg, rg = tid / ncg;
    float *pu = (float *)smem, *pw = pu + (size_t)nrg * cw;
    float *dsh = pw + (size_t)nrg * cw;
    float *qs = dsh + cw, *ks = qs + dk, *vs = ks + dk; /* contiguous */
    float *const Sb = states[b];
    float4 s[R];

    /* The first slab's loads go out before the conv. */
    hk_step_load<R>(s, Sb + (size_t)kh * r * dk * dv, 0, dk, dv, nrg, rg, cg);

    /* conv + SiLU over the block's channels: q, k of key head kh, v of
     * its value heads; then the state shift, by the same thread. */
    const float *x = qkv + (size_t)b * cd;
    float *cst = conv_states ? conv_states[b] : NULL;
    for (int e = tid; e < 2 * dk + r * dv; e += blockDim.x) {
        const int c = e < dk       ? kh * dk + e
                      : e < 2 * dk ? kd + kh * dk + (e - dk)
                                   : 2 * kd + kh * r * dv + (e - 2 * dk);
        const float *wc = conv_w + (size_t)c * K;
        float *st = cst ? cst + (size_t)c * S : NULL;
        float acc = 0.0f;
        for (int j = 0; j < S; j++)
            acc += wc[j] * st[j];
        acc += wc[S] * x[c];
        for (int j = 0; j + 1 < S; j++)
            st[j] = st[j + 1];
        if (S > 0)
            st[S - 1] = x[c];
        qs[e] = hk_math_silu(acc); /* q | k | v */
    }
    __syncthreads();

    /* l2 norms (hk_norm.cu's: f32 tree, the factor in double), then k.q */
    float qq = 0.0f, kk = 0.0f;
    for (int i = tid; i < dk; i += blockDim.x) {
        qq += qs[i] * qs[i];
        kk += ks[i] * ks[i];
    }
    qq = hk_block_sum(qq, red);
    kk = hk_block_sum(kk, red);
    const float fq = (float)(q_scale / sqrt((double)qq + eps));
    const float fk = (float)(1.0 / sqrt((double)kk + eps));
    float kq = 0.0f;
    for (int i = tid; i < dk; i += blockDim.x) {
        qs[i] *= fq;
        ks[i] *= fk;
        kq += ks[i] * qs[i];
    }
    kq = hk_block_sum(kq, red); /* its barriers publish qs, ks */

    for (int hh = 0; hh < r; hh++) {
        const int h = kh * r + hh;
        float *Sh = Sb + (size_t)h * dk * dv;
        const float ga =
            expf(hk_math_gdn_gate(a[(size_t)b * Hv + h], A_log[h], dt_bias[h]));
        const float beta = hk_math_sigmoid(bg[(size_t)b * Hv + h]);
        for (int j0 = 0; j0 < dv; j0 += cw) {
            if (hh > 0 || j0 > 0)
                hk_step_load<R>(s, Sh, j0, dk, dv, nrg, rg, cg);
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
            __syncthreads();
            if (tid < cw && j0 + tid < dv) {
                float su = 0.0f, sw = 0.0f;
                for (int g = 0; g < nrg; g++) {
                    su += pu[(size_t)g * cw + tid];
                    sw += pw[(size_t)g * cw + tid];
                }
                const int j = j0 + tid;
                const float d = beta * (vs[(size_t)hh * dv + j] - ga * su);
                o[((size_t)b * Hv + h) * dv + j] = ga * sw + kq * d;
                dsh[tid] = d;
            }
            __syncthreads();
            const int j = j0 + 4 * cg;
            if (rg < nrg && j < dv) {
                const float4 d =
                    *reinterpret_cast<const float4 *>(dsh + 4 * cg);
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
                    *reinterpret_cast<float4 *>(Sh + (size_t)row * dv + j) = t;
                }
            }
            __syncthreads(); /* pu, pw, dsh are rewritten next slab */
        }
    }
}

extern "C" int hk_cuda_gdn_step(float *o, float *const *states,
                                float *const *conv_states, const float *qkv,
                                const float *a, const float *b,
                                const float *conv_w, const float *A_log,
                                const float *dt_bias, int B, int Hk, int Hv,
                                int dk, int dv, int K, float eps, float q_scale,
                                void *stream)
{
    if (B < 0 || B > HK_CUDA_MAX_GRID_YZ || Hk < 1 || Hv < 1 || Hv % Hk ||
        dk < 1 || dk > HK_CUDA_GDN_MAX_DK || dv < 4 || dv % 4 || K < 1 ||
        (B > 0 && (!states || (K > 1 && !conv_states))))
        return HK_CUDA_EINVAL;
    if (B == 0)
        return HK_CUDA_OK;
    const int cw = dv < HK_STEP_CW ? dv : HK_STEP_CW;
    const int nrg = HK_STEP_THREADS / (cw / 4);
    const int rows = (dk + nrg - 1) / nrg;
    const size_t sm = hk_step_smem(dk, dv, Hv / Hk);
    if (sm > 48 * 1024)
        return HK_CUDA_EINVAL;
    const dim3 grid(Hk, B);
    const cudaStream_t s = hk_stream(stream);
#define HK_STEP(R)                                                             \
    hk_gdn_step_kernel<R><<<grid, HK_STEP_THREADS, sm, s>>>(                   \
        o, states, conv_states, qkv, a, b, conv_w, A_log, dt_bias, Hk, Hv, dk, \
        dv, K, eps, q_scale)
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
