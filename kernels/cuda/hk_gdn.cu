/*
 * hk_gdn.cu - CUDA twin of hk_gdn.c: the Gated DeltaNet token recurrence
 * (decode, batched over requests) and the chunked WY/UT prefill, which can
 * also return the segment transition T_C for PIC composition.
 *
 * Recurrence, per value head h (key head h / (Hv/Hk)), S[dk][dv], per
 * token in this order (HF torch_recurrent_gated_delta_rule):
 *   S <- e^{g_t} S            decay
 *   u = S^T k_t               read
 *   d = beta_t (v_t - u)      delta
 *   S <- S + k_t d^T          write
 *   o_t = S^T q_t             output, with the updated state
 * Chunk form (hk_gdn.c's header; pic-kvbuffer-math.md §3), per chunk of
 * n <= C tokens, gamma_i = sum_{j<=i} g_j, Gamma_ij = e^{gamma_i-gamma_j}:
 *   L = strictly_lower(diag(beta) K K^T (.) Gamma),  P = tril(Q K^T (.) Gamma)
 *   [U W] = (I + L)^{-1} [diag(beta) V  diag(beta e^gamma) K]
 *   Vn = U - W S;  O = diag(e^gamma) Q S + P Vn
 *   S = e^{gamma_n} S + Kt^T Vn,  Kt = K (.) e^{gamma_n - gamma}
 *   Tc <- e^{gamma_n} Tc - Kt^T (W Tc),  Tc = I before the first chunk
 * Layouts: q, k [T, Hk, dk]; v, o [T, Hv, dv]; g, beta [T, Hv];
 * S [Hv, dk, dv]; Tc [Hv, dk, dk]; all row-major f32.
 *
 * State columns are independent: column j of S (and of Tc) evolves from
 * column j alone (u_j, d_j, Vn[:, j] only involve S[:, j]). Both forms
 * exploit that: a warp owns one column, each lane keeps dk/32 of its
 * entries in registers (lane l holds rows l, l+32, ...), and the dot
 * products over dk are warp reductions. No block-wide synchronization is
 * needed inside the token loop.
 *
 * Recurrent: one block per (request, value head). The head's state is
 * staged through shared memory 32 columns at a time (coalesced global
 * reads and writes, transposed with an odd leading dimension so that both
 * the staging and the warps' column reads are free of bank conflicts); each
 * warp then runs all T tokens on its columns in registers. Decode (T = 1)
 * is memory bound: S is read once and written once, coalesced.
 *
 * Chunked, three launches on one stream (the FLA structure):
 *   A. per (chunk, head), in parallel: gamma (double), the A = beta KK^T
 *      (.) Gamma and P = QK^T (.) Gamma blocks (K, Q staged in 32-wide
 *      tiles), (I + L)^{-1} by forward substitution (the CPU's order),
 *      then U and W. Outputs gamma, U, W, P to scratch.
 *   B. per (head, state column), sequential over chunks: o = e^gamma Q S,
 *      Vn = U - W S (written over U), S = e^{gamma_n} S + Kt^T Vn. Tc's dk
 *      columns run the same recurrence with U = 0 and start as e_j.
 *   C. per (chunk, head), in parallel: O += P Vn.
 * Decays are hk_gdn_decay (gdn_math.h): e^{x} of a log-space difference
 * x <= 0, flushed to 0 below e^{-69}; W and Tc entries below 1e-30 are
 * flushed like the CPU's, so the two backends see the same zeros.
 * Scratch (floats): Hv * ceil(T/C) * C * (2 + dk + dv + C) - the chunk
 * quantities of every chunk at once, about the size of k + v.
 */
#include "kernels/common/gdn_math.h"
#include "kernels/cuda/hk_cuda_impl.h"

/* Warps per block in the recurrent and state-pass kernels. */
#define HK_GDN_WARPS 4
/* State columns staged in shared memory per pass (one per lane). */
#define HK_GDN_SLAB 32
/* Threads of the chunk-local kernels (A, C). */
#define HK_GDN_CT 256
/* Pairs (i, j) of a chunk per thread in kernel A: C^2 / HK_GDN_CT. */
#define HK_GDN_PAIRS (HK_CUDA_GDN_MAX_C * HK_CUDA_GDN_MAX_C / HK_GDN_CT)
/* Width of the dk tiles of K and Q in kernel A; +1 pads the rows. */
#define HK_GDN_DT 32

/* ---- gates ------------------------------------------------------------ */

static __global__ void hk_gdn_gates_kernel(float *g,             // [T, Hv]
                                           float *beta,          // [T, Hv]
                                           const float *a,       // [T, Hv]
                                           const float *b,       // [T, Hv]
                                           const float *A_log,   // [Hv]
                                           const float *dt_bias, // [Hv]
                                           size_t n, int Hv)
{
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x; e < n;
         e += stride) {
        const int h = (int)(e % Hv);
        beta[e] = hk_math_sigmoid(b[e]);
        g[e] = hk_math_gdn_gate(a[e], A_log[h], dt_bias[h]);
    }
}

extern "C" int hk_cuda_gdn_gates(float *g, float *beta, const float *a,
                                 const float *b, const float *A_log,
                                 const float *dt_bias, int T, int Hv,
                                 void *stream)
{
    if (T < 0 || Hv <= 0)
        return HK_CUDA_EINVAL;
    const size_t n = (size_t)T * Hv;
    if (n == 0)
        return HK_CUDA_OK;
    hk_gdn_gates_kernel<<<hk_grid_1d(n, 256), 256, 0, hk_stream(stream)>>>(
        g, beta, a, b, A_log, dt_bias, n, Hv);
    return hk_cuda_check_launch();
}

/* ---- recurrence ------------------------------------------------------- */

/* Lane's slice of a dk vector: x[lane + 32 r], 0 past dk. */
template <int R>
static __device__ __forceinline__ void
hk_lane_load(float (&r)[R], const float *x, int dk, int lane)
{
#pragma unroll
    for (int i = 0; i < R; i++) {
        const int row = lane + 32 * i;
        r[i] = row < dk ? x[row] : 0.0f;
    }
}

template <int R>
static __device__ __forceinline__ float hk_lane_dot(const float (&a)[R],
                                                    const float (&b)[R])
{
    float acc = 0.0f;
#pragma unroll
    for (int i = 0; i < R; i++)
        acc += a[i] * b[i];
    return hk_warp_sum(acc);
}

/* Sequence b (gridDim.y of them) has tokens rows b*T .. b*T + T-1 of q, k,
 * v, g, beta, o; its state is states[b] if states is non-NULL, else S.
 * R = registers per lane for one state column, 32 R >= dk. */
template <int R>
static __global__ void
hk_gdn_rec_kernel(float *o,             // [B*T, Hv, dv]
                  float *S,             // [Hv, dk, dv] (B = 1) or NULL
                  float *const *states, // [B] of [Hv, dk, dv], or NULL
                  const float *q,       // [B*T, Hk, dk]
                  const float *k,       // [B*T, Hk, dk]
                  const float *v,       // [B*T, Hv, dv]
                  const float *g,       // [B*T, Hv]
                  const float *beta,    // [B*T, Hv]
                  int T, int Hk, int Hv, int dk, int dv)
{
    /* [HK_GDN_SLAB][ld], transposed; ld = 32 R + 1 >= dk + 1 is odd, so
     * neither the staging (lanes along j) nor a warp's column reads
     * (lanes along i) hit one bank twice. At most 32 x 257 floats (33 KB),
     * under the 48 KB of static shared memory. */
    __shared__ float slab[HK_GDN_SLAB * (32 * R + 1)];
    const int ld = 32 * R + 1;
    const int h = blockIdx.x, b = blockIdx.y;
    const int kh = h / (Hv / Hk);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    float *Sh = (states ? states[b] : S) + (size_t)h * dk * dv;

    for (int j0 = 0; j0 < dv; j0 += HK_GDN_SLAB) {
        const int nj = min(HK_GDN_SLAB, dv - j0);
        for (int e = threadIdx.x; e < dk * HK_GDN_SLAB; e += blockDim.x) {
            const int i = e / HK_GDN_SLAB, jj = e % HK_GDN_SLAB;
            if (jj < nj)
                slab[jj * ld + i] = Sh[(size_t)i * dv + j0 + jj];
        }
        __syncthreads();

        for (int jj = warp; jj < nj; jj += HK_GDN_WARPS) {
            const int j = j0 + jj;
            float s[R], kr[R], qr[R];
            hk_lane_load<R>(s, slab + jj * ld, dk, lane);
            for (int t = 0; t < T; t++) {
                const size_t row = (size_t)b * T + t;
                const float a = expf(g[row * Hv + h]);
                const float bt = beta[row * Hv + h];
                hk_lane_load<R>(kr, k + (row * Hk + kh) * dk, dk, lane);
                hk_lane_load<R>(qr, q + (row * Hk + kh) * dk, dk, lane);
#pragma unroll
                for (int i = 0; i < R; i++)
                    s[i] *= a;
                const float u = hk_lane_dot<R>(s, kr);
                const float d = bt * (v[(row * Hv + h) * dv + j] - u);
#pragma unroll
                for (int i = 0; i < R; i++)
                    s[i] += kr[i] * d;
                const float oj = hk_lane_dot<R>(s, qr);
                if (lane == 0)
                    o[(row * Hv + h) * dv + j] = oj;
            }
#pragma unroll
            for (int i = 0; i < R; i++) {
                const int row = lane + 32 * i;
                if (row < dk)
                    slab[jj * ld + row] = s[i];
            }
        }
        __syncthreads();

        for (int e = threadIdx.x; e < dk * HK_GDN_SLAB; e += blockDim.x) {
            const int i = e / HK_GDN_SLAB, jj = e % HK_GDN_SLAB;
            if (jj < nj)
                Sh[(size_t)i * dv + j0 + jj] = slab[jj * ld + i];
        }
        __syncthreads(); /* the slab is reloaded next pass */
    }
}

/* Registers per lane for dk, rounded up to an instantiated size. */
static int hk_gdn_regs(int dk)
{
    const int r = (dk + 31) / 32;
    return r <= 1 ? 1 : r <= 2 ? 2 : r <= 4 ? 4 : 8;
}

static int hk_gdn_args_ok(int T, int Hk, int Hv, int dk, int dv)
{
    return T >= 0 && Hk > 0 && Hv > 0 && Hv % Hk == 0 && dk > 0 &&
           dk <= HK_CUDA_GDN_MAX_DK && dv > 0;
}

static int hk_gdn_rec_launch(float *o, float *S, float *const *states,
                             const float *q, const float *k, const float *v,
                             const float *g, const float *beta, int B, int T,
                             int Hk, int Hv, int dk, int dv, void *stream)
{
    if (!hk_gdn_args_ok(T, Hk, Hv, dk, dv) || B < 0 ||
        B > HK_CUDA_MAX_GRID_YZ || (!S && !states))
        return HK_CUDA_EINVAL;
    if (B == 0 || T == 0)
        return HK_CUDA_OK;
    const dim3 grid(Hv, B);
    const int threads = 32 * HK_GDN_WARPS;
    const cudaStream_t s = hk_stream(stream);
#define HK_GDN_REC(R)                                                          \
    hk_gdn_rec_kernel<R><<<grid, threads, 0, s>>>(o, S, states, q, k, v, g,    \
                                                  beta, T, Hk, Hv, dk, dv)
    switch (hk_gdn_regs(dk)) {
    case 1:
        HK_GDN_REC(1);
        break;
    case 2:
        HK_GDN_REC(2);
        break;
    case 4:
        HK_GDN_REC(4);
        break;
    default:
        HK_GDN_REC(8);
        break;
    }
#undef HK_GDN_REC
    return hk_cuda_check_launch();
}

extern "C" int hk_cuda_gdn_recurrent(float *o, float *S, const float *q,
                                     const float *k, const float *v,
                                     const float *g, const float *beta, int T,
                                     int Hk, int Hv, int dk, int dv,
                                     void *stream)
{
    return hk_gdn_rec_launch(o, S, NULL, q, k, v, g, beta, 1, T, Hk, Hv, dk, dv,
                             stream);
}

extern "C" int hk_cuda_gdn_decode(float *o, float *const *states,
                                  const float *q, const float *k,
                                  const float *v, const float *g,
                                  const float *beta, int B, int Hk, int Hv,
                                  int dk, int dv, void *stream)
{
    if (!states && B > 0)
        return HK_CUDA_EINVAL;
    return hk_gdn_rec_launch(o, NULL, states, q, k, v, g, beta, B, 1, Hk, Hv,
                             dk, dv, stream);
}

/* ---- chunked prefill -------------------------------------------------- */

/* Scratch regions of the chunk form; chunk c of head h is slot
 * hc = h * nc + c. gam first, so the doubles are 8-byte aligned. */
struct hk_gdn_ws {
    double *gam; // [Hv * nc, C]
    float *U;    // [Hv * nc, C, dv], Vn after kernel B
    float *W;    // [Hv * nc, C, dk]
    float *P;    // [Hv * nc, C, C]
};

static hk_gdn_ws hk_gdn_ws_carve(float *scratch, int nc, int Hv, int dk, int dv,
                                 int C)
{
    const size_t slots = (size_t)Hv * nc * C;
    hk_gdn_ws ws;
    ws.gam = (double *)scratch;
    ws.U = scratch + 2 * slots;
    ws.W = ws.U + slots * dv;
    ws.P = ws.W + slots * dk;
    return ws;
}

extern "C" size_t hk_cuda_gdn_chunk_scratch(int T, int Hv, int dk, int dv,
                                            int C)
{
    if (T <= 0 || C <= 0)
        return 0;
    const size_t nc = (size_t)(T + C - 1) / C;
    return (size_t)Hv * nc * C * (2 + (size_t)dk + dv + C);
}

/* Kernel A: chunk-local quantities of chunk blockIdx.x of value head
 * blockIdx.y. */
static __global__ void
hk_gdn_chunk_local_kernel(hk_gdn_ws ws, const float *q, const float *k,
                          const float *v, const float *g, const float *beta,
                          int T, int Hk, int Hv, int dk, int dv, int C)
{
    /* The K/Q tiles are dead once A and P are formed; Tinv reuses them. */
    __shared__ float tiles[2 * HK_CUDA_GDN_MAX_C * (HK_GDN_DT + 1)];
    __shared__ float Am[HK_CUDA_GDN_MAX_C * (HK_CUDA_GDN_MAX_C + 1)];
    __shared__ double gam[HK_CUDA_GDN_MAX_C];
    __shared__ float bv[HK_CUDA_GDN_MAX_C], bg[HK_CUDA_GDN_MAX_C];
    const int c = blockIdx.x, h = blockIdx.y, nc = gridDim.x;
    const int kh = h / (Hv / Hk), t0 = c * C, n = min(C, T - t0);
    const size_t hc = (size_t)h * nc + c;
    const int tid = threadIdx.x;
    const size_t ldq = (size_t)Hk * dk, ldv = (size_t)Hv * dv;
    const float *Kc = k + (size_t)t0 * ldq + (size_t)kh * dk; // [n, ldq]
    const float *Qc = q + (size_t)t0 * ldq + (size_t)kh * dk; // [n, ldq]
    const float *Vc = v + (size_t)t0 * ldv + (size_t)h * dv;  // [n, ldv]
    float *Kt = tiles, *Qt = tiles + HK_CUDA_GDN_MAX_C * (HK_GDN_DT + 1);
    float *Ti = tiles; // [n][C + 1] after the tiles
    const int ldt = HK_GDN_DT + 1, lda = HK_CUDA_GDN_MAX_C + 1;

    /* Cumulative decay in double, as the CPU (a float sum of 64 terms of
     * size ~30 would put ~1e-4 into neighbouring tokens' factors). */
    if (tid == 0) {
        double acc = 0.0;
        for (int i = 0; i < n; i++) {
            acc += g[(size_t)(t0 + i) * Hv + h];
            gam[i] = acc;
            ws.gam[hc * C + i] = acc;
        }
    }

    /* [A; P] raw dot products, dk in tiles of HK_GDN_DT. */
    float acc_a[HK_GDN_PAIRS], acc_p[HK_GDN_PAIRS];
#pragma unroll
    for (int m = 0; m < HK_GDN_PAIRS; m++)
        acc_a[m] = acc_p[m] = 0.0f;
    for (int d0 = 0; d0 < dk; d0 += HK_GDN_DT) {
        __syncthreads();
        for (int e = tid; e < n * HK_GDN_DT; e += blockDim.x) {
            const int i = e / HK_GDN_DT, dd = e % HK_GDN_DT;
            const bool in = d0 + dd < dk;
            Kt[i * ldt + dd] = in ? Kc[(size_t)i * ldq + d0 + dd] : 0.0f;
            Qt[i * ldt + dd] = in ? Qc[(size_t)i * ldq + d0 + dd] : 0.0f;
        }
        __syncthreads();
#pragma unroll
        for (int m = 0; m < HK_GDN_PAIRS; m++) {
            const int p = tid + m * HK_GDN_CT;
            if (p >= n * n)
                continue;
            const int i = p / n, j = p % n;
            if (j > i)
                continue;
            for (int dd = 0; dd < HK_GDN_DT; dd++) {
                acc_a[m] += Kt[i * ldt + dd] * Kt[j * ldt + dd];
                acc_p[m] += Qt[i * ldt + dd] * Kt[j * ldt + dd];
            }
        }
    }
    __syncthreads(); /* tiles dead from here; gam visible */

    float *P = ws.P + hc * C * C; // [n, C]
#pragma unroll
    for (int m = 0; m < HK_GDN_PAIRS; m++) {
        const int p = tid + m * HK_GDN_CT;
        if (p >= n * n)
            continue;
        const int i = p / n, j = p % n;
        float pv = 0.0f;
        if (j < i) {
            const float d = hk_gdn_decay(gam[i] - gam[j]);
            const float bi = beta[(size_t)(t0 + i) * Hv + h];
            Am[i * lda + j] = acc_a[m] * (bi * d);
            pv = acc_p[m] * d;
        } else if (j == i) {
            pv = acc_p[m];
        }
        P[(size_t)i * C + j] = pv;
    }
    for (int i = tid; i < n; i += blockDim.x) {
        const float bi = beta[(size_t)(t0 + i) * Hv + h];
        bv[i] = bi;
        bg[i] = bi * hk_gdn_decay(gam[i]);
    }
    __syncthreads();

    /* Tinv = (I + L)^{-1} row by row: Tinv_i = e_i - sum_{j<i} L_ij Tinv_j,
     * each entry summed over j ascending (the CPU's order). */
    for (int i = 0; i < n; i++) {
        for (int cc = tid; cc < n; cc += blockDim.x) {
            float t = 0.0f;
            if (cc == i) {
                t = 1.0f;
            } else if (cc < i) {
                for (int j = cc; j < i; j++)
                    t -= Am[i * lda + j] * Ti[j * lda + cc];
            }
            Ti[i * lda + cc] = t;
        }
        __syncthreads();
    }

    /* U = Tinv (beta V), W = Tinv (beta e^gamma K), row i sums m <= i. */
    float *U = ws.U + hc * C * dv, *W = ws.W + hc * C * dk;
    const int w = dv + dk;
    for (int e = tid; e < n * w; e += blockDim.x) {
        const int i = e / w, jj = e % w;
        float acc = 0.0f;
        if (jj < dv) {
            for (int m = 0; m <= i; m++)
                acc += Ti[i * lda + m] * (bv[m] * Vc[(size_t)m * ldv + jj]);
            U[(size_t)i * dv + jj] = acc;
        } else {
            const int jk = jj - dv;
            for (int m = 0; m <= i; m++)
                acc += Ti[i * lda + m] * (bg[m] * Kc[(size_t)m * ldq + jk]);
            W[(size_t)i * dk + jk] = fabsf(acc) < HK_GDN_TINY ? 0.0f : acc;
        }
    }
}

/* Kernel B: carries state column col of head blockIdx.y across all chunks.
 * Columns 0..dv-1 are S's, dv..dv+dk-1 Tc's (when Tc != NULL). */
template <int R>
static __global__ void
hk_gdn_chunk_state_kernel(hk_gdn_ws ws, float *o, float *S, float *Tc,
                          const float *q, const float *k, int T, int Hk, int Hv,
                          int dk, int dv, int C, int nc)
{
    __shared__ float e_g[HK_CUDA_GDN_MAX_C]; // e^{gamma_i}
    __shared__ float e_n[HK_CUDA_GDN_MAX_C]; // e^{gamma_n - gamma_i}
    __shared__ float vn[HK_GDN_WARPS][HK_CUDA_GDN_MAX_C];
    __shared__ float egn_s;
    const int h = blockIdx.y, kh = h / (Hv / Hk);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int ncols = dv + (Tc ? dk : 0);
    const int col = blockIdx.x * HK_GDN_WARPS + warp;
    const bool active = col < ncols, is_s = col < dv;
    const size_t ldq = (size_t)Hk * dk, ldv = (size_t)Hv * dv;
    float *Sh = S + (size_t)h * dk * dv;
    float *Th = Tc ? Tc + (size_t)h * dk * dk : NULL;

    float s[R];
#pragma unroll
    for (int r = 0; r < R; r++) {
        const int row = lane + 32 * r;
        s[r] = 0.0f;
        if (active && row < dk)
            s[r] = is_s ? Sh[(size_t)row * dv + col]
                        : (row == col - dv ? 1.0f : 0.0f);
    }

    for (int c = 0; c < nc; c++) {
        const int t0 = c * C, n = min(C, T - t0);
        const size_t hc = (size_t)h * nc + c;
        __syncthreads(); /* previous chunk's factors are no longer read */
        for (int i = threadIdx.x; i < n; i += blockDim.x) {
            const double gi = ws.gam[hc * C + i];
            const double gn = ws.gam[hc * C + n - 1];
            e_g[i] = hk_gdn_decay(gi);
            e_n[i] = hk_gdn_decay(gn - gi);
            if (i == 0)
                egn_s = hk_gdn_decay(gn);
        }
        __syncthreads();
        if (!active)
            continue;

        const float *Wc = ws.W + hc * C * dk;
        float *Uc = ws.U + hc * C * dv;
        float wr[R];
        for (int i = 0; i < n; i++) {
            hk_lane_load<R>(wr, Wc + (size_t)i * dk, dk, lane);
            const float x = hk_lane_dot<R>(wr, s);
            float vi;
            if (is_s) {
                float qr[R];
                const size_t t = (size_t)(t0 + i);
                hk_lane_load<R>(qr, q + t * ldq + (size_t)kh * dk, dk, lane);
                const float qs = hk_lane_dot<R>(qr, s);
                vi = Uc[(size_t)i * dv + col] - x;
                if (lane == 0) {
                    o[t * ldv + (size_t)h * dv + col] = e_g[i] * qs;
                    Uc[(size_t)i * dv + col] = vi; /* Vn for kernel C */
                }
            } else {
                vi = fabsf(x) < HK_GDN_TINY ? 0.0f : -x;
            }
            if (lane == 0)
                vn[warp][i] = vi;
        }
        __syncwarp();

        /* s = e^{gamma_n} s + Kt^T vn */
        float acc[R];
#pragma unroll
        for (int r = 0; r < R; r++)
            acc[r] = 0.0f;
        for (int i = 0; i < n; i++) {
            float kr[R];
            const float *ki = k + (size_t)(t0 + i) * ldq + (size_t)kh * dk;
            hk_lane_load<R>(kr, ki, dk, lane);
            const float f = vn[warp][i];
#pragma unroll
            for (int r = 0; r < R; r++)
                acc[r] += (e_n[i] * kr[r]) * f;
        }
        const float egn = egn_s;
#pragma unroll
        for (int r = 0; r < R; r++) {
            s[r] = egn * s[r] + acc[r];
            if (!is_s && fabsf(s[r]) < HK_GDN_TINY)
                s[r] = 0.0f;
        }
        __syncwarp(); /* vn is rewritten next chunk */
    }

    if (!active)
        return;
#pragma unroll
    for (int r = 0; r < R; r++) {
        const int row = lane + 32 * r;
        if (row >= dk)
            continue;
        if (is_s)
            Sh[(size_t)row * dv + col] = s[r];
        else
            Th[(size_t)row * dk + (col - dv)] = s[r];
    }
}

/* Kernel C: O += P Vn for chunk blockIdx.x of head blockIdx.y. */
static __global__ void hk_gdn_chunk_out_kernel(hk_gdn_ws ws, float *o, int T,
                                               int Hv, int dv, int C)
{
    const int c = blockIdx.x, h = blockIdx.y, nc = gridDim.x;
    const int t0 = c * C, n = min(C, T - t0);
    const size_t hc = (size_t)h * nc + c, ldv = (size_t)Hv * dv;
    const float *P = ws.P + hc * C * C;
    const float *Vn = ws.U + hc * C * dv;
    float *Oc = o + (size_t)t0 * ldv + (size_t)h * dv;
    for (int e = threadIdx.x; e < n * dv; e += blockDim.x) {
        const int i = e / dv, j = e % dv;
        float acc = 0.0f;
        for (int m = 0; m <= i; m++)
            acc += P[(size_t)i * C + m] * Vn[(size_t)m * dv + j];
        Oc[(size_t)i * ldv + j] += acc;
    }
}

extern "C" int hk_cuda_gdn_chunk(float *o, float *S, float *Tc, const float *q,
                                 const float *k, const float *v, const float *g,
                                 const float *beta, int T, int Hk, int Hv,
                                 int dk, int dv, int C, float *scratch,
                                 void *stream)
{
    if (!hk_gdn_args_ok(T, Hk, Hv, dk, dv) || C < 1 || C > HK_CUDA_GDN_MAX_C ||
        Hv > HK_CUDA_MAX_GRID_YZ || !S || (T > 0 && !scratch))
        return HK_CUDA_EINVAL;
    if (T == 0 && !Tc)
        return HK_CUDA_OK;
    const int nc = (T + C - 1) / C;
    const cudaStream_t s = hk_stream(stream);
    const hk_gdn_ws ws = hk_gdn_ws_carve(scratch, nc, Hv, dk, dv, C);
    int rc;

    if (nc > 0) {
        hk_gdn_chunk_local_kernel<<<dim3(nc, Hv), HK_GDN_CT, 0, s>>>(
            ws, q, k, v, g, beta, T, Hk, Hv, dk, dv, C);
        if ((rc = hk_cuda_check_launch()))
            return rc;
    }

    const int ncols = dv + (Tc ? dk : 0);
    const dim3 grid(HK_CEIL_DIV(ncols, HK_GDN_WARPS), Hv);
    const int threads = 32 * HK_GDN_WARPS;
#define HK_GDN_STATE(R)                                                        \
    hk_gdn_chunk_state_kernel<R><<<grid, threads, 0, s>>>(                     \
        ws, o, S, Tc, q, k, T, Hk, Hv, dk, dv, C, nc)
    switch (hk_gdn_regs(dk)) {
    case 1:
        HK_GDN_STATE(1);
        break;
    case 2:
        HK_GDN_STATE(2);
        break;
    case 4:
        HK_GDN_STATE(4);
        break;
    default:
        HK_GDN_STATE(8);
        break;
    }
#undef HK_GDN_STATE
    if ((rc = hk_cuda_check_launch()) || nc == 0)
        return rc;

    hk_gdn_chunk_out_kernel<<<dim3(nc, Hv), HK_GDN_CT, 0, s>>>(ws, o, T, Hv, dv,
                                                               C);
    return hk_cuda_check_launch();
}
