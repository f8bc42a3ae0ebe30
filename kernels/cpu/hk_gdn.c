/*
 * hk_gdn.c - Gated DeltaNet core on the CPU: the token recurrence (decode)
 * and the chunked WY/UT prefill, which can also return the segment
 * transition T_C for PIC composition.
 *
 * Recurrence, per value head h (key head h / (Hv/Hk)), S[dk][dv]:
 *   S <- e^{g_t} S;  d = beta_t (v_t - S^T k_t);  S <- S + k_t d^T;
 *   o_t = S^T q_t   (read after the update)
 * i.e. S_t = e^{g_t}(I - beta_t k_t k_t^T) S_{t-1} + beta_t k_t v_t^T.
 *
 * Chunk form (qwen3-hybrid-architecture.md §7.2, FLA chunk_gated_delta_rule;
 * pic-kvbuffer-math.md §3), per chunk of n <= C tokens with
 * gamma_i = sum_{j<=i} g_j and Gamma_ij = e^{gamma_i - gamma_j} (j <= i):
 *   L  = strictly_lower(diag(beta) K K^T (.) Gamma)
 *   [U W] = (I + L)^{-1} [diag(beta) V   diag(beta e^gamma) K]
 *   Vn = U - W S
 *   O  = diag(e^gamma) Q S + (Q K^T (.) Gamma) Vn
 *   Kt = K (.) e^{gamma_n - gamma}           (row-wise)
 *   S  = e^{gamma_n} S + Kt^T Vn
 *   T_chunk = e^{gamma_n} I - Kt^T W,  Tc <- T_chunk Tc
 * Layouts: q, k [T, Hk, dk]; v, o [T, Hv, dv]; g, beta [T, Hv];
 * S [Hv, dk, dv]; Tc [Hv, dk, dk]; all row-major f32.
 *
 * The last chunk is simply shorter (n = T mod C): no padding, so no
 * padded-token artefacts. Every exponential is of a log-space difference
 * that is <= 0, so nothing overflows however strong the decay; factors
 * below e^{-69} and Tc entries below 1e-30 are flushed to 0 (gdn_math.h:
 * far under f32 rounding, and it keeps denormals out of the products).
 *
 * Cost: per token the chunk form does the recurrence's 3 dk dv multiply-adds
 * (as GEMMs: [Q; W] S and Kt^T Vn) plus O(C (dk + dv)) for the in-chunk
 * terms, so C = 16..32 is fastest on CPUs; Tc adds 2 dk^2 per token.
 */
#include <assert.h>
#include <cblas.h>
#include <math.h>
#include <string.h>

#include "kernels/common/gdn_math.h"
#include "kernels/cpu/hk_cpu.h"

void hk_gdn_gates(float *g,             // [T, Hv]
                  float *beta,          // [T, Hv]
                  const float *a,       // [T, Hv]
                  const float *b,       // [T, Hv]
                  const float *A_log,   // [Hv]
                  const float *dt_bias, // [Hv]
                  int T, int Hv)
{
    for (size_t e = 0; e < (size_t)T * Hv; e++) {
        const int h = (int)(e % (size_t)Hv);
        beta[e] = hk_sigmoid(b[e]);
        g[e] = hk_math_gdn_gate(a[e], A_log[h], dt_bias[h]);
    }
}

/* The recurrence keeps one dv vector on the stack (kernels never allocate);
 * Qwen3-Next / Qwen3.5 use dv = 128. */
#define HK_GDN_MAX_DV 512
/* Cumulative decays of one chunk live on the stack as well. */
#define HK_GDN_MAX_C 64

void hk_gdn_recurrent(float *o,          // [T, Hv, dv]
                      float *S,          // [Hv, dk, dv], in/out
                      const float *q,    // [T, Hk, dk]
                      const float *k,    // [T, Hk, dk]
                      const float *v,    // [T, Hv, dv]
                      const float *g,    // [T, Hv]
                      const float *beta, // [T, Hv]
                      int T, int Hk, int Hv, int dk, int dv)
{
    assert(T >= 0 && Hk > 0 && Hv % Hk == 0 && dk > 0);
    assert(dv > 0 && dv <= HK_GDN_MAX_DV);
    const int r = Hv / Hk;

#pragma omp parallel for schedule(static)
    for (int h = 0; h < Hv; h++) {
        float *restrict Sh = S + (size_t)h * dk * dv;
        float u[HK_GDN_MAX_DV]; // S^T k, then the delta d
        float w[HK_GDN_MAX_DV]; // S^T q
        for (int t = 0; t < T; t++) {
            const float *restrict qt = q + ((size_t)t * Hk + h / r) * dk;
            const float *restrict kt = k + ((size_t)t * Hk + h / r) * dk;
            const float *restrict vt = v + ((size_t)t * Hv + h) * dv;
            float *restrict ot = o + ((size_t)t * Hv + h) * dv;
            const float a = expf(g[(size_t)t * Hv + h]);
            const float b = beta[(size_t)t * Hv + h];

            /* One read of the old state gives both S^T k and S^T q:
             * o = S_new^T q = a S_old^T q + (k.q) d. The j loops are
             * marked simd: -O2's cheap cost model leaves them scalar. */
            float kq = 0.0f;
            for (int i = 0; i < dk; i++)
                kq += kt[i] * qt[i];
#pragma omp simd
            for (int j = 0; j < dv; j++) {
                u[j] = 0.0f;
                w[j] = 0.0f;
            }
            for (int i = 0; i < dk; i++) {
                const float *restrict Si = Sh + (size_t)i * dv;
                const float ki = kt[i], qi = qt[i];
#pragma omp simd
                for (int j = 0; j < dv; j++) {
                    u[j] += Si[j] * ki;
                    w[j] += Si[j] * qi;
                }
            }
#pragma omp simd
            for (int j = 0; j < dv; j++) {
                u[j] = b * (vt[j] - a * u[j]);
                ot[j] = a * w[j] + kq * u[j];
            }
            for (int i = 0; i < dk; i++) {
                float *restrict Si = Sh + (size_t)i * dv;
                const float ki = kt[i];
#pragma omp simd
                for (int j = 0; j < dv; j++)
                    Si[j] = a * Si[j] + ki * u[j];
            }
        }
    }
}

/* Floats one value head needs: B[3C, dk] (rows K | Q | W, so that
 * [K; Q] K^T and [Q; W] S are one product each), G[3C, C] (K K^T then L,
 * Q K^T then masked, Tinv), BVW[C, dv + dk] (beta V | beta e^gamma K),
 * UW[C, dv + dk] (U then Vn | W before the copy into B), R[2C, dv]
 * ([Q; W] S), Kt[C, dk], X[C, dk] (W Tc). */
static size_t gdn_head_scratch(int dk, int dv, int C)
{
    return (size_t)C * (3 * (size_t)dk + 3 * (size_t)C + 2 * (size_t)(dv + dk) +
                        2 * (size_t)dv + 2 * (size_t)dk);
}

/* Scratch is per value head (Hv slots), so the result cannot depend on how
 * OpenMP maps heads to threads. */
size_t hk_gdn_chunk_scratch(int Hv, int dk, int dv, int C)
{
    return (size_t)Hv * gdn_head_scratch(dk, dv, C);
}

static void set_identity(float *M, int d)
{
    memset(M, 0, (size_t)d * d * sizeof(float));
    for (int i = 0; i < d; i++)
        M[(size_t)i * d + i] = 1.0f;
}

/* Flushes entries of M[rows, ld] below HK_GDN_TINY to 0: W and the
 * transition shrink like e^{gamma}, and a denormal fed into a product costs
 * a microcode assist per multiply (~3x slower prefill with strong-decay
 * heads). Returns 1 when the whole matrix is 0. */
static int flush_tiny(float *M, int rows, int cols, int ld)
{
    int zero = 1;
    for (int i = 0; i < rows; i++) {
        float *Mi = M + (size_t)i * ld;
        for (int j = 0; j < cols; j++) {
            if (fabsf(Mi[j]) < HK_GDN_TINY)
                Mi[j] = 0.0f;
            else
                zero = 0;
        }
    }
    return zero;
}

/* Runs value head h over all chunks; see the file header. */
static void gdn_chunk_head(float *o, float *S, float *Tc, const float *q,
                           const float *k, const float *v, const float *g,
                           const float *beta, int T, int Hk, int Hv, int dk,
                           int dv, int C, float *ws, int h)
{
    const int kh = h / (Hv / Hk);
    const int ldq = Hk * dk, ldv = Hv * dv, lduw = dv + dk;
    float *B = ws;                                    // [3C, dk]
    float *G = B + (size_t)3 * C * dk;                // [3C, C]
    float *BVW = G + (size_t)3 * C * C;               // [C, dv + dk]
    float *UW = BVW + (size_t)C * lduw;               // [C, dv + dk]
    float *R = UW + (size_t)C * lduw;                 // [2C, dv]
    float *Kt = R + (size_t)2 * C * dv;               // [C, dk]
    float *X = Kt + (size_t)C * dk;                   // [C, dk]
    float *Sh = S + (size_t)h * dk * dv;              // [dk, dv]
    float *Th = Tc ? Tc + (size_t)h * dk * dk : NULL; // [dk, dk]
    double gam[HK_GDN_MAX_C];
    int tc_zero = 0; // Tc flushed to exactly 0: no more updates

    for (int t0 = 0; t0 < T; t0 += C) {
        const int n = T - t0 < C ? T - t0 : C;
        const float *Qc = q + ((size_t)t0 * Hk + kh) * dk; // [n, ldq]
        const float *Kc = k + ((size_t)t0 * Hk + kh) * dk; // [n, ldq]
        const float *Vc = v + ((size_t)t0 * Hv + h) * dv;  // [n, ldv]
        float *Oc = o + ((size_t)t0 * Hv + h) * dv;        // [n, ldv]
        float *Kb = B, *Qb = B + (size_t)n * dk;           // [n, dk] each
        float *Wb = B + (size_t)2 * n * dk;                // [n, dk]
        float *A = G, *P = G + (size_t)n * n;              // [n, n] each
        float *Ti = G + (size_t)2 * n * n;                 // [n, n]

        /* Cumulative decay in double: a float sum of up to 64 terms of
         * size ~30 would put ~1e-4 absolute error into e^{gamma_i-gamma_j}
         * of neighbouring tokens. */
        double acc = 0.0;
        for (int i = 0; i < n; i++) {
            acc += g[(size_t)(t0 + i) * Hv + h];
            gam[i] = acc;
        }
        const double gn = gam[n - 1];
        const float egn = hk_gdn_decay(gn);

        /* Gather K and Q (contiguous, for the stacked products); beta V
         * and beta e^gamma K side by side, so one product with Tinv makes
         * both U and W; Kt = K (.) e^{gamma_n - gamma}. */
        for (int i = 0; i < n; i++) {
            const float bi = beta[(size_t)(t0 + i) * Hv + h];
            const float bg = bi * hk_gdn_decay(gam[i]);
            const float di = hk_gdn_decay(gn - gam[i]);
            const float *restrict ki = Kc + (size_t)i * ldq;
            const float *restrict qi = Qc + (size_t)i * ldq;
            const float *restrict vi = Vc + (size_t)i * ldv;
            float *restrict kb = Kb + (size_t)i * dk;
            float *restrict qb = Qb + (size_t)i * dk;
            float *restrict kti = Kt + (size_t)i * dk;
            float *restrict ui = BVW + (size_t)i * lduw;
            float *restrict wi = ui + dv;
#pragma omp simd
            for (int j = 0; j < dk; j++) {
                kb[j] = ki[j];
                qb[j] = qi[j];
                wi[j] = bg * ki[j];
                kti[j] = di * ki[j];
            }
#pragma omp simd
            for (int j = 0; j < dv; j++)
                ui[j] = bi * vi[j];
        }
        /* [A; P] = [K; Q] K^T */
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, 2 * n, n, dk, 1.0f,
                    B, dk, Kb, dk, 0.0f, G, n);
        for (int i = 0; i < n; i++) {
            const float bi = beta[(size_t)(t0 + i) * Hv + h];
            float *Ai = A + (size_t)i * n, *Pi = P + (size_t)i * n;
            for (int j = 0; j < i; j++) {
                const float d = hk_gdn_decay(gam[i] - gam[j]);
                Ai[j] *= bi * d;
                Pi[j] *= d;
            }
            for (int j = i + 1; j < n; j++)
                Pi[j] = 0.0f;
        }
        /* Tinv = (I + L)^{-1} by forward substitution over rows:
         * Tinv_i = e_i - sum_{j<i} L_ij Tinv_j (row i lives in columns
         * <= i). Then [U W] = Tinv [beta V  beta e^gamma K] is one sgemm,
         * several times faster than strsm at these sizes (OpenBLAS 0.3.21,
         * n <= 64). */
        for (int i = 0; i < n; i++) {
            float *restrict ti = Ti + (size_t)i * n;
            const float *Ai = A + (size_t)i * n;
            memset(ti, 0, (size_t)n * sizeof(float));
            ti[i] = 1.0f;
            for (int j = 0; j < i; j++) {
                const float *restrict tj = Ti + (size_t)j * n;
                const float l = Ai[j];
#pragma omp simd
                for (int c = 0; c <= j; c++)
                    ti[c] -= l * tj[c];
            }
        }
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, lduw, n, 1.0f,
                    Ti, n, BVW, lduw, 0.0f, UW, lduw);
        for (int i = 0; i < n; i++)
            memcpy(Wb + (size_t)i * dk, UW + (size_t)i * lduw + dv,
                   (size_t)dk * sizeof(float));
        flush_tiny(Wb, n, dk, dk);
        /* [R_q; R_w] = [Q; W] S, both with S before its update. */
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, 2 * n, dv, dk,
                    1.0f, Qb, dk, Sh, dv, 0.0f, R, dv);
        /* Vn = U - W S (in place over U); O = diag(e^gamma) Q S. */
        for (int i = 0; i < n; i++) {
            const float e = hk_gdn_decay(gam[i]);
            float *restrict ui = UW + (size_t)i * lduw;
            float *restrict oi = Oc + (size_t)i * ldv;
            const float *restrict rq = R + (size_t)i * dv;
            const float *restrict rw = R + (size_t)(n + i) * dv;
#pragma omp simd
            for (int j = 0; j < dv; j++) {
                ui[j] -= rw[j];
                oi[j] = e * rq[j];
            }
        }
        /* O += (Q K^T (.) Gamma) Vn */
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, dv, n, 1.0f,
                    P, n, UW, lduw, 1.0f, Oc, ldv);
        /* S = e^{gamma_n} S + Kt^T Vn */
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, dk, dv, n, 1.0f,
                    Kt, dk, UW, lduw, egn, Sh, dv);
        if (Th && !tc_zero) {
            /* Tc <- (e^{gamma_n} I - Kt^T W) Tc = e^{gamma_n} Tc
             * - Kt^T (W Tc): two n x dk x dk products instead of forming
             * T_chunk and a dk^3 product. The first chunk has Tc = I. */
            const float *WT = X;
            if (t0 == 0) {
                set_identity(Th, dk);
                WT = Wb;
            } else {
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, dk,
                            dk, 1.0f, Wb, dk, Th, dk, 0.0f, X, dk);
                flush_tiny(X, n, dk, dk);
            }
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, dk, dk, n,
                        -1.0f, Kt, dk, WT, dk, egn, Th, dk);
            tc_zero = flush_tiny(Th, dk, dk, dk);
        }
    }
    if (Th && T == 0)
        set_identity(Th, dk);
}

void hk_gdn_chunk(float *o,          // [T, Hv, dv]
                  float *S,          // [Hv, dk, dv], in/out
                  float *Tc,         // [Hv, dk, dk] out, or NULL
                  const float *q,    // [T, Hk, dk]
                  const float *k,    // [T, Hk, dk]
                  const float *v,    // [T, Hv, dv]
                  const float *g,    // [T, Hv]
                  const float *beta, // [T, Hv]
                  int T, int Hk, int Hv, int dk, int dv, int C,
                  float *scratch) // [hk_gdn_chunk_scratch]
{
    assert(T >= 0 && Hk > 0 && Hv % Hk == 0 && dk > 0 && dv > 0);
    assert(C >= 1 && C <= HK_GDN_MAX_C && scratch);
    const size_t per = gdn_head_scratch(dk, dv, C);
    /* Heads in parallel, each BLAS call single-threaded. OpenBLAS's OpenMP
     * build does that by itself inside our region; the pthreads build only
     * once hk_matmul_init() has made it single-threaded: its pool called
     * from two OpenMP threads made this kernel 2-3x slower (0.3.21).
     * Otherwise heads run in turn and OpenBLAS threads each product. */
    const int par =
        openblas_get_parallel() == 2 || openblas_get_num_threads() == 1;

#pragma omp parallel for schedule(static) if (par)
    for (int h = 0; h < Hv; h++)
        gdn_chunk_head(o, S, Tc, q, k, v, g, beta, T, Hk, Hv, dk, dv, C,
                       scratch + (size_t)h * per, h);
}
