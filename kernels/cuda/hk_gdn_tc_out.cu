/*
 * hk_gdn_tc_out.cu - kernel O of the tensor-core chunked prefill
 * (hk_gdn_tc.cu; v2, described in hk_gdn_tc_pass.cu): per (chunk slot,
 * output columns, value head), all in parallel, o = e^gamma (Q S_c) + P Vn
 * from each chunk's starting state and Vn, which the state pass wrote; its
 * launch.
 */
#include <cuda_pipeline.h>

#include "kernels/cuda/hk_gdn_tc.h"

#define HK_TC_O_THREADS 256

struct hk_tc_o_smem {
    uint16_t *Qs;      // [C][dk + 8]   Q rows (zero past the chunk)
    uint16_t *Ql;      // [C][dk + 8]   their lo parts (LO only)
    uint16_t *Sh, *Sl; // [dk][BVO + 8] the chunk's starting state, split
    uint16_t *Ph, *Pl; // [C][C + 8]
    uint16_t *Vh, *Vl; // [C][BVO + 8]  Vn split
    float *stage;      // [warps][2][16][20]
    float *eg;         // [C]
};

static __host__ __device__ size_t hk_tc_o_carve(hk_tc_o_smem *s,
                                                unsigned char *p, int dk, int C,
                                                int BVO, bool lo)
{
    const int ldk = dk + HK_PAD16, ldo = BVO + HK_PAD16;
    const int ldp = C + HK_PAD16;
    const size_t sz[10] = {
        (size_t)C * ldk * 2,  (size_t)dk * ldo * 2,
        (size_t)dk * ldo * 2, (size_t)C * ldp * 2,
        (size_t)C * ldp * 2,  (size_t)C * ldo * 2,
        (size_t)C * ldo * 2,  (size_t)(HK_TC_O_THREADS / 32) * 2 * 16 * 20 * 4,
        (size_t)C * 4,        lo ? (size_t)C * ldk * 2 : 0};
    size_t off[10];
    const size_t at = hk_layout(sz, 10, 128, off);
    if (s) {
        s->Qs = (uint16_t *)(p + off[0]);
        s->Sh = (uint16_t *)(p + off[1]);
        s->Sl = (uint16_t *)(p + off[2]);
        s->Ph = (uint16_t *)(p + off[3]);
        s->Pl = (uint16_t *)(p + off[4]);
        s->Vh = (uint16_t *)(p + off[5]);
        s->Vl = (uint16_t *)(p + off[6]);
        s->stage = (float *)(p + off[7]);
        s->eg = (float *)(p + off[8]);
        s->Ql = lo ? (uint16_t *)(p + off[9]) : NULL;
    }
    return at;
}

/* Kernel O: chunk slot hk_tc_slot, output columns blockIdx.y * BVO..
 * (BVO = 32, or 16 where dv is not a multiple of 32; 64 with
 * HK_CUDA_GDN_TC_O64), value head
 * blockIdx.z. LO: Q has lo parts (f32 inputs). */
template <bool LO>
static __global__ void __launch_bounds__(HK_TC_O_THREADS)
    hk_gdn_tc_out_kernel(hk_tc_ws ws, float *o, hk_tc_in in, const int *cu,
                         int nseq, int nslots, int Hk, int Hv, int dk, int dv,
                         int C, int BVO, int fast)
{
    HK_DYNAMIC_SMEM(smem);
    __shared__ int loc[2];
    hk_probe_start(ws.probe);
    hk_tc_o_smem s;
    hk_tc_o_carve(&s, smem, dk, C, BVO, LO);
    const int NB = BVO / 16;
    const int h = blockIdx.z, kh = h / (Hv / Hk), col0 = blockIdx.y * BVO;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int nwarps = blockDim.x >> 5;
    const size_t hc = (size_t)h * nslots + hk_tc_slot(ws);
    const size_t ldq = (size_t)Hk * dk, ldov = (size_t)Hv * dv;
    const int ldk = dk + HK_PAD16, ldo = BVO + HK_PAD16, ldp = C + HK_PAD16;

    if (tid == 0)
        hk_tc_locate(cu, nseq, C, hk_tc_slot(ws), &loc[0], &loc[1]);
    __syncthreads();
    const int t0 = loc[0], n = loc[1], nt = (n + 15) / 16, rows = nt * 16;
    if (n == 0)
        return; /* a spare slot: the whole block leaves */
    hk_probe_at(ws.probe, 0);

    const size_t r0 = (size_t)t0 * ldq + (size_t)kh * dk;
    const uint16_t *qr = in.q + r0, *qlr = LO ? in.ql + r0 : NULL;
    for (int e = tid; e < rows * (dk / 8); e += blockDim.x) {
        const int i = e / (dk / 8), c = (e % (dk / 8)) * 8;
        const bool inr = i < n;
        __pipeline_memcpy_async(s.Qs + i * ldk + c,
                                inr ? qr + (size_t)i * ldq + c : qr, 16,
                                inr ? 0 : 16);
        if (LO && !fast)
            __pipeline_memcpy_async(s.Ql + i * ldk + c,
                                    inr ? qlr + (size_t)i * ldq + c : qlr, 16,
                                    inr ? 0 : 16);
    }
    for (int e = tid; e < dk * (BVO / 8); e += blockDim.x) {
        const int i = e / (BVO / 8), c = (e % (BVO / 8)) * 8;
        const size_t at = (hc * dk + i) * dv + col0 + c;
        __pipeline_memcpy_async(s.Sh + i * ldo + c, ws.Sh + at, 16);
        if (!fast)
            __pipeline_memcpy_async(s.Sl + i * ldo + c, ws.Sl + at, 16);
    }
    for (int e = tid; e < rows * (C / 8); e += blockDim.x) {
        const int i = e / (C / 8), c = (e % (C / 8)) * 8;
        const size_t at = (hc * C + i) * C + c;
        __pipeline_memcpy_async(s.Ph + i * ldp + c, ws.Ph + at, 16);
        if (!fast)
            __pipeline_memcpy_async(s.Pl + i * ldp + c, ws.Pl + at, 16);
    }
    for (int e = tid; e < rows * (BVO / 8); e += blockDim.x) {
        const int i = e / (BVO / 8), c = (e % (BVO / 8)) * 8;
        const size_t at = (hc * C + i) * dv + col0 + c;
        __pipeline_memcpy_async(s.Vh + i * ldo + c, ws.Vh + at, 16);
        if (!fast)
            __pipeline_memcpy_async(s.Vl + i * ldo + c, ws.Vl + at, 16);
    }
    __pipeline_commit();
    for (int i = tid; i < C; i += blockDim.x)
        s.eg[i] = i < n ? hk_gdn_decay(ws.gam[hc * C + i]) : 0.0f;
    __pipeline_wait_prior(0);
    __syncthreads();
    hk_probe_at(ws.probe, 1);

    /* X = Q S_c (dk deep) and Y = P Vn (P lower triangular: kk <= ti);
     * o = e^gamma X + Y, rows of the chunk only. */
    float *stg = s.stage + warp * 2 * 16 * 20;
    for (int idx = warp; idx < nt * NB; idx += nwarps) {
        const int ti = idx / NB, tj = idx % NB;
        hk_facc x, y;
        wmma::fill_fragment(x, 0.0f);
        wmma::fill_fragment(y, 0.0f);
        for (int kk = 0; kk < dk / 16; kk++) {
            hk_fa_row a;
            hk_fb_row sh, sl;
            hk_wmma_lds(a, s.Qs + ti * 16 * ldk + kk * 16, ldk);
            hk_wmma_lds(sh, s.Sh + kk * 16 * ldo + tj * 16, ldo);
            wmma::mma_sync(x, a, sh, x);
            if (fast)
                continue;
            hk_wmma_lds(sl, s.Sl + kk * 16 * ldo + tj * 16, ldo);
            wmma::mma_sync(x, a, sl, x);
            if (LO) { /* + Q_lo S_hi */
                hk_wmma_lds(a, s.Ql + ti * 16 * ldk + kk * 16, ldk);
                wmma::mma_sync(x, a, sh, x);
            }
        }
        for (int kk = 0; kk <= ti; kk++) {
            hk_fa_row ph, pl;
            hk_fb_row vh, vl;
            hk_wmma_lds(ph, s.Ph + ti * 16 * ldp + kk * 16, ldp);
            hk_wmma_lds(vh, s.Vh + kk * 16 * ldo + tj * 16, ldo);
            wmma::mma_sync(y, ph, vh, y);
            if (fast)
                continue;
            hk_wmma_lds(pl, s.Pl + ti * 16 * ldp + kk * 16, ldp);
            hk_wmma_lds(vl, s.Vl + kk * 16 * ldo + tj * 16, ldo);
            wmma::mma_sync(y, ph, vl, y);
            wmma::mma_sync(y, pl, vh, y);
        }
        hk_wmma_sts(stg, x, 20);
        hk_wmma_sts(stg + 16 * 20, y, 20);
        __syncwarp();
        for (int e = lane; e < 256; e += 32) {
            const int r = e / 16, c = e % 16, i = ti * 16 + r;
            if (i < n)
                o[(size_t)(t0 + i) * ldov + (size_t)h * dv + col0 + tj * 16 +
                  c] = s.eg[i] * stg[r * 20 + c] + stg[16 * 20 + r * 20 + c];
        }
        __syncwarp(); /* stg is rewritten by the warp's next tile */
    }
    hk_probe_end(ws.probe, 2);
}

size_t hk_tc_out_smem(int dk, int C, int BVO, bool lo)
{
    return hk_tc_o_carve(NULL, NULL, dk, C, BVO, lo);
}

/* Kernel O's probe points (hk_probe.h), each at a barrier: locate (the
 * chunk found), load (its tiles copied), tiles (the block's last warp
 * done). */
static const char *const hk_tc_o_phases[] = {"locate", "load", "tiles"};
static const hk_probe_kind hk_tc_o_probe = {"O", hk_tc_o_phases, 3, 0, 0};

/* Kernel O over (the launch's slots, dv / BVO, Hv). */
template <bool LO>
int hk_tc_launch_out(const hk_tc_plan &p, const hk_tc_call &a)
{
    const unsigned nx = (unsigned)(a.ws.seg1 - a.ws.seg0);
    hk_tc_ws ws = a.ws;
    if (a.probe)
        ws.probe = hk_probe_launch(&hk_tc_o_probe,
                                   (size_t)nx * (a.dv / p.BVO) * a.Hv, 0, a.s);
    cudaFuncSetAttribute(hk_gdn_tc_out_kernel<LO>,
                         cudaFuncAttributeMaxDynamicSharedMemorySize,
                         (int)p.so);
    hk_gdn_tc_out_kernel<LO>
        <<<dim3(nx, a.dv / p.BVO, a.Hv), HK_TC_O_THREADS, p.so, a.s>>>(
            ws, a.o, a.in, a.cu_seqlens, a.nseq, (int)a.slots, a.Hk, a.Hv, a.dk,
            a.dv, a.C, p.BVO, a.fast);
    return hk_cuda_check_launch();
}

template int hk_tc_launch_out<false>(const hk_tc_plan &p, const hk_tc_call &a);
template int hk_tc_launch_out<true>(const hk_tc_plan &p, const hk_tc_call &a);
