/*
 * hk_gdn_tc_state.cu - kernel B of the tensor-core chunked prefill
 * (hk_gdn_tc.cu; v1: HK_CUDA_GDN_TC_V1, or where v2's tiles do not fit):
 * per (sequence, value head, BV columns of [S | Tc]), sequential over the
 * sequence's chunks, the states and the outputs in one pass; its launch.
 */
#include "kernels/cuda/hk_gdn_tc.h"

#define HK_TC_B_THREADS 128

/* Shared memory of kernel B. */
struct hk_tc_b_smem {
    float *Sf;           // [dk][BV + 4]  the state tile, f32
    uint16_t *Sh, *Sl;   // [dk][BV + 8]  its bf16 split
    float *Vf, *Of;      // [C][BV + 4]   Vn; the output tile
    uint16_t *Vh, *Vl;   // [C][BV + 8]   Vn split
    uint16_t *Xh, *Xl;   // [C][BV + 8]   e^{gamma_n - gamma} Vn split
    uint16_t *Kst, *Qst; // [16][dk + 8]  a last partial token tile
    float *eg, *en;      // [C]
    uint16_t *Ksl, *Qsl; // [16][dk + 8]  its lo parts (f32 inputs only)
};

static __host__ __device__ size_t hk_tc_b_carve(hk_tc_b_smem *s,
                                                unsigned char *p, int dk, int C,
                                                int BV, bool lo)
{
    const int ldf = BV + HK_PAD32, ldh = BV + HK_PAD16, ldk = dk + HK_PAD16;
    const size_t sz[14] = {
        (size_t)dk * ldf * 4,          (size_t)dk * ldh * 2,
        (size_t)dk * ldh * 2,          (size_t)C * ldf * 4,
        (size_t)C * ldf * 4,           (size_t)C * ldh * 2,
        (size_t)C * ldh * 2,           (size_t)C * ldh * 2,
        (size_t)C * ldh * 2,           (size_t)16 * ldk * 2,
        (size_t)16 * ldk * 2,          (size_t)2 * C * 4,
        lo ? (size_t)16 * ldk * 2 : 0, lo ? (size_t)16 * ldk * 2 : 0};
    size_t off[14];
    const size_t at = hk_layout(sz, 14, 128, off);
    if (s) {
        s->Sf = (float *)(p + off[0]);
        s->Sh = (uint16_t *)(p + off[1]);
        s->Sl = (uint16_t *)(p + off[2]);
        s->Vf = (float *)(p + off[3]);
        s->Of = (float *)(p + off[4]);
        s->Vh = (uint16_t *)(p + off[5]);
        s->Vl = (uint16_t *)(p + off[6]);
        s->Xh = (uint16_t *)(p + off[7]);
        s->Xl = (uint16_t *)(p + off[8]);
        s->Kst = (uint16_t *)(p + off[9]);
        s->Qst = (uint16_t *)(p + off[10]);
        s->eg = (float *)(p + off[11]);
        s->en = s->eg + C;
        s->Ksl = lo ? (uint16_t *)(p + off[12]) : NULL;
        s->Qsl = lo ? (uint16_t *)(p + off[13]) : NULL;
    }
    return at;
}

/* Kernel B: column block blockIdx.x of [S | Tc] (dv / BV of S, then
 * dk / BV of Tc), value head blockIdx.y, sequence blockIdx.z. */
template <int BV, bool LO>
static __global__ void __launch_bounds__(HK_TC_B_THREADS)
    hk_gdn_tc_state_kernel(hk_tc_ws ws, float *o, float *const *states,
                           float *const *tcs, hk_tc_in in, const int *cu,
                           int nslots, int Hk, int Hv, int dk, int dv, int C)
{
    HK_DYNAMIC_SMEM(smem);
    __shared__ int first;
    hk_tc_b_smem s;
    hk_tc_b_carve(&s, smem, dk, C, BV, LO);
    const hk_tc_pass_at pa(ws, states, tcs, cu, BV, Hk, Hv, dk, dv, C);
    const int h = pa.h, kh = pa.kh, col0 = pa.col0, ldg = pa.ldg;
    const int ts = pa.ts, len = pa.len, nch = pa.nch;
    const bool is_tc = pa.is_tc;
    float *Sg = pa.Sg;
    const int tid = threadIdx.x, warp = tid >> 5, nwarps = blockDim.x >> 5;
    const int ldf = BV + HK_PAD32, ldh = BV + HK_PAD16, ldk = dk + HK_PAD16;
    const size_t ldq = (size_t)Hk * dk, ldo = (size_t)Hv * dv;
    const int NB = BV / 16;

    if (tid == 0)
        first = pa.first;
    for (int e = tid; e < dk * BV; e += blockDim.x) {
        const int i = e / BV, j = e % BV;
        s.Sf[i * ldf + j] = is_tc && !pa.cont ? (i == col0 + j ? 1.0f : 0.0f)
                                              : Sg[(size_t)i * ldg + col0 + j];
    }

    for (int c = 0; c < nch; c++) {
        const int t0 = ts + c * C, n = min(C, len - c * C);
        const int nt = (n + 15) / 16;
        const bool part = n % 16 != 0; /* tile nt-1 runs past the end */
        __syncthreads(); /* first, Sf, and the last chunk's reads are done */
        const size_t hc = (size_t)h * nslots + first + c;
        const double gn = ws.gam[hc * C + n - 1];
        const float egn = hk_gdn_decay(gn);
        for (int i = tid; i < C; i += blockDim.x) {
            const double gi = i < n ? ws.gam[hc * C + i] : 0.0;
            s.eg[i] = i < n ? hk_gdn_decay(gi) : 0.0f;
            s.en[i] = i < n ? hk_gdn_decay(gn - gi) : 0.0f;
        }
        for (int e = tid; e < dk * BV; e += blockDim.x) {
            const int i = e / BV, j = e % BV;
            hk_bf16_split(s.Sf[i * ldf + j], &s.Sh[i * ldh + j],
                          &s.Sl[i * ldh + j]);
        }
        if (part) {
            const size_t r0 = (size_t)(t0 + (nt - 1) * 16) * ldq + kh * dk;
            const int left = n - (nt - 1) * 16;
            hk_tc_stage(s.Kst, ldk, in.k + r0, ldq, 16, left, dk);
            if (!is_tc)
                hk_tc_stage(s.Qst, ldk, in.q + r0, ldq, 16, left, dk);
            if (LO) {
                hk_tc_stage(s.Ksl, ldk, in.kl + r0, ldq, 16, left, dk);
                if (!is_tc)
                    hk_tc_stage(s.Qsl, ldk, in.ql + r0, ldq, 16, left, dk);
            }
        }
        __syncthreads();

        /* Vn = U + (-W) S; X = Q S (scaled by e^gamma below). */
        for (int idx = warp; idx < nt * NB; idx += nwarps) {
            const int ti = idx / NB, tj = idx % NB;
            const bool st = part && ti == nt - 1;
            const size_t rq = (size_t)(t0 + ti * 16) * ldq + (size_t)kh * dk;
            const uint16_t *Qt = st ? s.Qst : in.q + rq;
            const uint16_t *Qtl = !LO ? NULL : st ? s.Qsl : in.ql + rq;
            const unsigned ldqt = st ? (unsigned)ldk : (unsigned)ldq;
            const uint16_t *Wh = ws.Wh + (hc * C + ti * 16) * dk;
            const uint16_t *Wl = ws.Wl + (hc * C + ti * 16) * dk;
            hk_facc vn, x;
            if (is_tc)
                wmma::fill_fragment(vn, 0.0f);
            else
                wmma::load_matrix_sync(
                    vn, ws.U + (hc * C + ti * 16) * dv + col0 + tj * 16, dv,
                    wmma::mem_row_major);
            wmma::fill_fragment(x, 0.0f);
            for (int kk = 0; kk < dk / 16; kk++) {
                hk_fb_row sh, sl;
                hk_fa_row a;
                wmma::load_matrix_sync(
                    sh, hk_bf(s.Sh + kk * 16 * ldh + tj * 16), ldh);
                wmma::load_matrix_sync(
                    sl, hk_bf(s.Sl + kk * 16 * ldh + tj * 16), ldh);
                wmma::load_matrix_sync(a, hk_bf(Wh + kk * 16), dk);
                wmma::mma_sync(vn, a, sh, vn);
                wmma::mma_sync(vn, a, sl, vn);
                wmma::load_matrix_sync(a, hk_bf(Wl + kk * 16), dk);
                wmma::mma_sync(vn, a, sh, vn);
                if (is_tc)
                    continue;
                wmma::load_matrix_sync(a, hk_bf(Qt + kk * 16), ldqt);
                wmma::mma_sync(x, a, sh, x);
                wmma::mma_sync(x, a, sl, x);
                if (LO) {
                    wmma::load_matrix_sync(a, hk_bf(Qtl + kk * 16), ldqt);
                    wmma::mma_sync(x, a, sh, x);
                }
            }
            wmma::store_matrix_sync(s.Vf + ti * 16 * ldf + tj * 16, vn, ldf,
                                    wmma::mem_row_major);
            if (!is_tc)
                wmma::store_matrix_sync(s.Of + ti * 16 * ldf + tj * 16, x, ldf,
                                        wmma::mem_row_major);
        }
        __syncthreads();

        /* Splits of Vn and of e^{gamma_n - gamma} Vn; O's e^gamma; S's
         * e^{gamma_n}. Rows past the chunk are 0 (U and W rows are). */
        for (int e = tid; e < nt * 16 * BV; e += blockDim.x) {
            const int i = e / BV, j = e % BV;
            float vn = s.Vf[i * ldf + j];
            if (is_tc && fabsf(vn) < HK_GDN_TINY)
                vn = 0.0f;
            hk_bf16_split(vn, &s.Vh[i * ldh + j], &s.Vl[i * ldh + j]);
            hk_bf16_split(s.en[i] * vn, &s.Xh[i * ldh + j], &s.Xl[i * ldh + j]);
            if (!is_tc)
                s.Of[i * ldf + j] *= s.eg[i];
        }
        for (int e = tid; e < dk * BV; e += blockDim.x)
            s.Sf[(e / BV) * ldf + e % BV] *= egn;
        __syncthreads();

        /* O += P Vn (P lower triangular: kk <= ti); S += K^T X. */
        const int no = is_tc ? 0 : nt * NB, ns = (dk / 16) * NB;
        for (int idx = warp; idx < no + ns; idx += nwarps) {
            hk_facc acc;
            if (idx < no) {
                const int ti = idx / NB, tj = idx % NB;
                float *Ot = s.Of + ti * 16 * ldf + tj * 16;
                wmma::load_matrix_sync(acc, Ot, ldf, wmma::mem_row_major);
                for (int kk = 0; kk <= ti; kk++) {
                    const size_t pt = (hc * C + ti * 16) * C + kk * 16;
                    hk_fa_row ph, pl;
                    hk_fb_row vh, vl;
                    wmma::load_matrix_sync(ph, hk_bf(ws.Ph + pt), C);
                    wmma::load_matrix_sync(pl, hk_bf(ws.Pl + pt), C);
                    wmma::load_matrix_sync(
                        vh, hk_bf(s.Vh + kk * 16 * ldh + tj * 16), ldh);
                    wmma::load_matrix_sync(
                        vl, hk_bf(s.Vl + kk * 16 * ldh + tj * 16), ldh);
                    wmma::mma_sync(acc, ph, vh, acc);
                    wmma::mma_sync(acc, ph, vl, acc);
                    wmma::mma_sync(acc, pl, vh, acc);
                }
                wmma::store_matrix_sync(Ot, acc, ldf, wmma::mem_row_major);
                continue;
            }
            const int ti = (idx - no) / NB, tj = (idx - no) % NB;
            float *St = s.Sf + ti * 16 * ldf + tj * 16;
            wmma::load_matrix_sync(acc, St, ldf, wmma::mem_row_major);
            for (int kk = 0; kk < nt; kk++) {
                const bool st = part && kk == nt - 1;
                const size_t rk =
                    (size_t)(t0 + kk * 16) * ldq + (size_t)kh * dk + ti * 16;
                const uint16_t *Kt = st ? s.Kst + ti * 16 : in.k + rk;
                const unsigned ldkt = st ? (unsigned)ldk : (unsigned)ldq;
                hk_fa_col a;
                hk_fb_row xh, xl;
                wmma::load_matrix_sync(a, hk_bf(Kt), ldkt);
                wmma::load_matrix_sync(
                    xh, hk_bf(s.Xh + kk * 16 * ldh + tj * 16), ldh);
                wmma::load_matrix_sync(
                    xl, hk_bf(s.Xl + kk * 16 * ldh + tj * 16), ldh);
                wmma::mma_sync(acc, a, xh, acc);
                wmma::mma_sync(acc, a, xl, acc);
                if (LO) {
                    wmma::load_matrix_sync(
                        a, hk_bf(st ? s.Ksl + ti * 16 : in.kl + rk), ldkt);
                    wmma::mma_sync(acc, a, xh, acc);
                }
            }
            if (is_tc)
                for (int e = 0; e < acc.num_elements; e++)
                    if (fabsf(acc.x[e]) < HK_GDN_TINY)
                        acc.x[e] = 0.0f;
            wmma::store_matrix_sync(St, acc, ldf, wmma::mem_row_major);
        }
        __syncthreads();

        if (!is_tc)
            for (int e = tid; e < n * BV; e += blockDim.x) {
                const int i = e / BV, j = e % BV;
                o[(size_t)(t0 + i) * ldo + (size_t)h * dv + col0 + j] =
                    s.Of[i * ldf + j];
            }
    }
    __syncthreads();
    for (int e = tid; e < dk * BV; e += blockDim.x) {
        const int i = e / BV, j = e % BV;
        Sg[(size_t)i * ldg + col0 + j] = s.Sf[i * ldf + j];
    }
}

size_t hk_tc_state_smem(int dk, int C, int BV, bool lo)
{
    return hk_tc_b_carve(NULL, NULL, dk, C, BV, lo);
}

/* Kernel B at the planned BV, over (ncols / BV, Hv, nseq). */
template <bool LO>
int hk_tc_launch_state(const hk_tc_plan &p, const hk_tc_call &a)
{
    const dim3 grid(a.ncols / p.BV, a.Hv, a.nseq);
#define HK_TC_STATE(N)                                                         \
    do {                                                                       \
        cudaFuncSetAttribute(hk_gdn_tc_state_kernel<N, LO>,                    \
                             cudaFuncAttributeMaxDynamicSharedMemorySize,      \
                             (int)p.sb);                                       \
        hk_gdn_tc_state_kernel<N, LO><<<grid, HK_TC_B_THREADS, p.sb, a.s>>>(   \
            a.ws, a.o, a.states, a.tcs, a.in, a.cu_seqlens, (int)a.slots,      \
            a.Hk, a.Hv, a.dk, a.dv, a.C);                                      \
    } while (0)
    if (p.BV == 32)
        HK_TC_STATE(32);
    else
        HK_TC_STATE(16);
#undef HK_TC_STATE
    return hk_cuda_check_launch();
}

template int hk_tc_launch_state<false>(const hk_tc_plan &p,
                                       const hk_tc_call &a);
template int hk_tc_launch_state<true>(const hk_tc_plan &p, const hk_tc_call &a);
