/*
 * test_gdn.c - Gated DeltaNet kernels (hk_gdn.c) against a float64
 * brute-force recurrence: hk_gdn_recurrent, hk_gdn_chunk for chunk sizes
 * 1..64 (partial last chunks, GVA, non-zero start), and the chunk pass's
 * transition Tc. HK_BENCH=1 also times a 0.8B-shaped layer.
 */
#include <cblas.h>
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kernels/cpu/hk_cpu.h"
#include "t/lib/tap.h"

/* f32 kernels vs the f64 recurrence, relative error in norm per tensor.
 * Each token contracts the state (eigenvalues of e^g (I - b k k^T) lie in
 * [0, 1]), so rounding does not compound across tokens: measured errors are
 * ~1e-7..1e-6 (dk = 128 dot products at unit roundoff 6e-8). 1e-5 leaves
 * a 10x margin yet catches any wrong decay, index or missing term (those
 * give errors of 1e-3 and up). */
#define REL_TOL 1e-5
/* Per element: |ref - x| <= ATOL + RTOL |ref|. Entries of o and S are
 * O(0.1..1); ATOL covers entries that cancel to ~0 where only the absolute
 * rounding of their O(1) summands (~1e-7 * dk^0.5) is meaningful. */
#define ATOL 2e-6
#define RTOL 1e-4
/* Tc entries are O(1) near the diagonal and O(1e-2) off it; same budget. */
#define TC_REL_TOL 1e-5

/* ---- deterministic inputs ------------------------------------------------ */

typedef struct {
    uint64_t s;
} rng_t;

static double rng_u(rng_t *r) /* [0, 1) */
{
    r->s += 0x9E3779B97F4A7C15ull;
    uint64_t z = r->s;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    return (double)(z >> 11) * (1.0 / 9007199254740992.0);
}

static double rng_n(rng_t *r)
{
    double u1 = rng_u(r), u2 = rng_u(r);
    return sqrt(-2.0 * log(1.0 - u1)) * cos(2.0 * M_PI * u2);
}

typedef struct {
    int T, Hk, Hv, dk, dv;
    float *q, *k, *v, *g, *beta; // [T,Hk,dk] x2, [T,Hv,dv], [T,Hv] x2
    float *S0;                   // [Hv, dk, dv] initial state
} prob_t;

/* L2-normalized like the model (eps 1e-6 inside the sqrt), then scaled. */
static void randn_unit(rng_t *r, float *x, int n, double scale)
{
    double t[1024], ss = 0.0;
    for (int i = 0; i < n; i++) {
        t[i] = rng_n(r);
        ss += t[i] * t[i];
    }
    for (int i = 0; i < n; i++)
        x[i] = (float)(t[i] / sqrt(ss + 1e-6) * scale);
}

static double softplus_d(double x)
{
    return x > 20.0 ? x : log1p(exp(x));
}

/* Gates as the model makes them: g = -exp(A_log) softplus(a + dt_bias),
 * beta = sigmoid(b), with A in [1, 16] and dt in [1e-3, 1e-1] per head (the
 * HF initialisation ranges) and a, b random. gmin < 0 instead draws g
 * uniformly in [gmin, 0] with every 7th token at exactly gmin. */
static void prob_make(prob_t *p, int T, int Hk, int Hv, int dk, int dv,
                      uint64_t seed, double gmin, int zero_start)
{
    rng_t r = {seed};
    p->T = T, p->Hk = Hk, p->Hv = Hv, p->dk = dk, p->dv = dv;
    size_t nq = (size_t)T * Hk * dk, nv = (size_t)T * Hv * dv;
    p->q = malloc((nq ? nq : 1) * sizeof(float));
    p->k = malloc((nq ? nq : 1) * sizeof(float));
    p->v = malloc((nv ? nv : 1) * sizeof(float));
    p->g = malloc(((size_t)T * Hv + 1) * sizeof(float));
    p->beta = malloc(((size_t)T * Hv + 1) * sizeof(float));
    p->S0 = malloc((size_t)Hv * dk * dv * sizeof(float));
    double A[64], dtb[64];
    for (int h = 0; h < Hv; h++) {
        A[h] = 1.0 + 15.0 * rng_u(&r);
        double dt = exp(log(1e-3) + rng_u(&r) * (log(1e-1) - log(1e-3)));
        dtb[h] = log(expm1(dt)); // softplus^-1(dt)
    }
    for (int t = 0; t < T; t++) {
        for (int h = 0; h < Hk; h++) {
            randn_unit(&r, p->q + ((size_t)t * Hk + h) * dk, dk,
                       1.0 / sqrt((double)dk));
            randn_unit(&r, p->k + ((size_t)t * Hk + h) * dk, dk, 1.0);
        }
        for (int e = 0; e < Hv * dv; e++)
            p->v[(size_t)t * Hv * dv + e] = (float)rng_n(&r);
        for (int h = 0; h < Hv; h++) {
            double a = 1.5 * rng_n(&r), b = 2.0 * rng_n(&r), gg;
            if (gmin < 0.0)
                gg = (t % 7 == 3) ? gmin : gmin * rng_u(&r);
            else
                gg = -A[h] * softplus_d(a + dtb[h]);
            p->g[(size_t)t * Hv + h] = (float)gg;
            p->beta[(size_t)t * Hv + h] = (float)(1.0 / (1.0 + exp(-b)));
        }
    }
    for (size_t e = 0; e < (size_t)Hv * dk * dv; e++)
        p->S0[e] = zero_start ? 0.0f : (float)(0.5 * rng_n(&r));
}

static void prob_free(prob_t *p)
{
    free(p->q);
    free(p->k);
    free(p->v);
    free(p->g);
    free(p->beta);
    free(p->S0);
}

/* ---- float64 references ---------------------------------------------------
 * The recurrence exactly as written in the model spec, on the same f32
 * inputs: decay, read, delta, write, output after the update. */
static void ref_gdn(double *o, double *S, const prob_t *p)
{
    int T = p->T, Hk = p->Hk, Hv = p->Hv, dk = p->dk, dv = p->dv;
    double *u = malloc(dv * sizeof(double));
    for (size_t e = 0; e < (size_t)Hv * dk * dv; e++)
        S[e] = p->S0[e];
    for (int h = 0; h < Hv; h++) {
        double *Sh = S + (size_t)h * dk * dv;
        int kh = h / (Hv / Hk);
        for (int t = 0; t < T; t++) {
            const float *q = p->q + ((size_t)t * Hk + kh) * dk;
            const float *k = p->k + ((size_t)t * Hk + kh) * dk;
            const float *v = p->v + ((size_t)t * Hv + h) * dv;
            double a = exp((double)p->g[(size_t)t * Hv + h]);
            double b = p->beta[(size_t)t * Hv + h];
            for (int i = 0; i < dk; i++)
                for (int j = 0; j < dv; j++)
                    Sh[i * dv + j] *= a;
            for (int j = 0; j < dv; j++) {
                u[j] = 0.0;
                for (int i = 0; i < dk; i++)
                    u[j] += Sh[i * dv + j] * k[i];
                u[j] = b * (v[j] - u[j]);
            }
            for (int i = 0; i < dk; i++)
                for (int j = 0; j < dv; j++)
                    Sh[i * dv + j] += k[i] * u[j];
            for (int j = 0; j < dv; j++) {
                double s = 0.0;
                for (int i = 0; i < dk; i++)
                    s += Sh[i * dv + j] * q[i];
                o[((size_t)t * Hv + h) * dv + j] = s;
            }
        }
    }
    free(u);
}

/* Tc[h] = prod_t e^{g_t}(I - beta_t k_t k_t^T), later tokens on the left,
 * by explicit dk x dk matrix products. */
static void ref_tc(double *Tc, const prob_t *p)
{
    int T = p->T, Hk = p->Hk, Hv = p->Hv, dk = p->dk;
    double *M = malloc((size_t)dk * dk * sizeof(double));
    double *N = malloc((size_t)dk * dk * sizeof(double));
    for (int h = 0; h < Hv; h++) {
        double *Th = Tc + (size_t)h * dk * dk;
        for (int i = 0; i < dk; i++)
            for (int j = 0; j < dk; j++)
                Th[i * dk + j] = i == j;
        for (int t = 0; t < T; t++) {
            const float *k = p->k + ((size_t)t * Hk + h / (Hv / Hk)) * dk;
            double a = exp((double)p->g[(size_t)t * Hv + h]);
            double b = p->beta[(size_t)t * Hv + h];
            for (int i = 0; i < dk; i++)
                for (int j = 0; j < dk; j++)
                    M[i * dk + j] = a * ((i == j) - b * k[i] * k[j]);
            for (int i = 0; i < dk; i++)
                for (int j = 0; j < dk; j++) {
                    double s = 0.0;
                    for (int l = 0; l < dk; l++)
                        s += M[i * dk + l] * Th[l * dk + j];
                    N[i * dk + j] = s;
                }
            memcpy(Th, N, (size_t)dk * dk * sizeof(double));
        }
    }
    free(M);
    free(N);
}

/* ---- helpers --------------------------------------------------------------
 */

static int all_finite(const float *x, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (!isfinite(x[i]))
            return 0;
    return 1;
}

/* Both the per-tensor norm bound and the per-element bound. */
static int close_both(const double *ref, const float *x, size_t n, double *rel)
{
    *rel = tap_rel_norm_err(ref, x, n);
    return all_finite(x, n) && *rel <= REL_TOL &&
           tap_close_ratio_d(ref, x, n, ATOL, RTOL) <= 1.0;
}

typedef struct {
    float *o, *S, *Tc, *scr;
} out_t;

static void run_chunk(out_t *w, const prob_t *p, int C, int want_tc)
{
    size_t ns = (size_t)p->Hv * p->dk * p->dv;
    w->o = malloc(((size_t)p->T * p->Hv * p->dv + 1) * sizeof(float));
    w->S = malloc(ns * sizeof(float));
    w->Tc =
        want_tc ? malloc((size_t)p->Hv * p->dk * p->dk * sizeof(float)) : NULL;
    w->scr =
        malloc(hk_gdn_chunk_scratch(p->Hv, p->dk, p->dv, C) * sizeof(float));
    memcpy(w->S, p->S0, ns * sizeof(float));
    hk_gdn_chunk(w->o, w->S, w->Tc, p->q, p->k, p->v, p->g, p->beta, p->T,
                 p->Hk, p->Hv, p->dk, p->dv, C, w->scr);
}

static void out_free(out_t *w)
{
    free(w->o);
    free(w->S);
    free(w->Tc);
    free(w->scr);
}

/* ---- tests -----------------------------------------------------------------
 */

static const int Ts[] = {1, 5, 64, 100, 257};
#define NTS ((int)(sizeof(Ts) / sizeof(Ts[0])))

/* Recurrence and chunk form vs the f64 recurrence on a GVA shape
 * (Hv = 2 Hk) with dk = dv = 128, non-zero start, for the listed C. */
static void test_against_ref(void)
{
    static const int Cs[] = {1, 2, 3, 4, 7, 8, 16, 31, 32, 63, 64};
    for (int it = 0; it < NTS; it++) {
        prob_t p;
        prob_make(&p, Ts[it], 2, 4, 128, 128, 1000 + it, 0.0, 0);
        size_t no = (size_t)p.T * p.Hv * p.dv, ns = (size_t)p.Hv * 128 * 128;
        double *ro = malloc(no * sizeof(double));
        double *rS = malloc(ns * sizeof(double));
        ref_gdn(ro, rS, &p);

        float *o = malloc(no * sizeof(float)), *S = malloc(ns * 4);
        memcpy(S, p.S0, ns * sizeof(float));
        hk_gdn_recurrent(o, S, p.q, p.k, p.v, p.g, p.beta, p.T, 2, 4, 128, 128);
        double eo, es;
        int good = close_both(ro, o, no, &eo);
        good = close_both(rS, S, ns, &es) && good;
        ok(good, "recurrent T=%d Hk=2 Hv=4 dk=dv=128: rel err o %.2e S %.2e",
           p.T, eo, es);
        free(o);
        free(S);

        for (size_t ic = 0; ic < sizeof(Cs) / sizeof(Cs[0]); ic++) {
            out_t w;
            run_chunk(&w, &p, Cs[ic], 0);
            good = close_both(ro, w.o, no, &eo);
            good = close_both(rS, w.S, ns, &es) && good;
            ok(good, "chunk C=%d T=%d: rel err o %.2e S %.2e", Cs[ic], p.T, eo,
               es);
            out_free(&w);
        }
        free(ro);
        free(rS);
        prob_free(&p);
    }
}

/* Odd head sizes and a 3:1 grouping, both kernels. */
static void test_odd_shape(void)
{
    prob_t p;
    prob_make(&p, 77, 1, 3, 48, 40, 77, 0.0, 0);
    size_t no = (size_t)p.T * p.Hv * p.dv, ns = (size_t)p.Hv * p.dk * p.dv;
    double *ro = malloc(no * sizeof(double)), *rS = malloc(ns * 8);
    ref_gdn(ro, rS, &p);
    float *o = malloc(no * sizeof(float)), *S = malloc(ns * 4);
    memcpy(S, p.S0, ns * sizeof(float));
    hk_gdn_recurrent(o, S, p.q, p.k, p.v, p.g, p.beta, p.T, 1, 3, 48, 40);
    double eo, es;
    int good = close_both(ro, o, no, &eo);
    good = close_both(rS, S, ns, &es) && good;
    ok(good, "recurrent T=77 Hk=1 Hv=3 dk=48 dv=40: rel err o %.2e S %.2e", eo,
       es);
    out_t w;
    run_chunk(&w, &p, 13, 0);
    good = close_both(ro, w.o, no, &eo);
    good = close_both(rS, w.S, ns, &es) && good;
    ok(good, "chunk C=13 same shape: rel err o %.2e S %.2e", eo, es);
    out_free(&w);
    free(o);
    free(S);
    free(ro);
    free(rS);
    prob_free(&p);
}

/* Every chunk size 1..64 on a small shape, T = 100 (a partial last chunk
 * for all C except 1, 2, 4, 5, 10, 20, 25, 50). */
static void test_all_chunk_sizes(void)
{
    prob_t p;
    prob_make(&p, 100, 1, 2, 16, 16, 4242, 0.0, 0);
    size_t no = (size_t)p.T * p.Hv * p.dv, ns = (size_t)p.Hv * p.dk * p.dv;
    double *ro = malloc(no * sizeof(double)), *rS = malloc(ns * 8);
    ref_gdn(ro, rS, &p);
    int nbad = 0;
    double worst = 0.0;
    for (int C = 1; C <= 64; C++) {
        out_t w;
        run_chunk(&w, &p, C, 0);
        double eo, es;
        int good = close_both(ro, w.o, no, &eo);
        good = close_both(rS, w.S, ns, &es) && good;
        if (!good) {
            tap_diag("C=%d: rel err o %.2e S %.2e", C, eo, es);
            nbad++;
        }
        worst = fmax(worst, fmax(eo, es));
        out_free(&w);
    }
    ok(nbad == 0, "chunk C=1..64, T=100 dk=dv=16: %d bad, worst rel %.2e", nbad,
       worst);
    free(ro);
    free(rS);
    prob_free(&p);
}

/* Tc: matches the f64 product, and composes: Tc S_start + S_end|0 equals
 * the end state of the run from S_start. */
static void test_tc(int T, int dk, int C)
{
    prob_t p, pz;
    /* Mild decay (g in [-0.05, 0]) so that Tc stays far from underflow
     * over the whole segment and the comparison means something. */
    prob_make(&p, T, 1, 2, dk, dk, 31 * T + C, -0.05, 0);
    prob_make(&pz, T, 1, 2, dk, dk, 31 * T + C, -0.05, 1); // same, S0 = 0
    size_t nt = (size_t)p.Hv * dk * dk, ns = nt;
    double *rT = malloc(nt * sizeof(double));
    ref_tc(rT, &p);
    out_t w, wz;
    run_chunk(&w, &p, C, 1);
    run_chunk(&wz, &pz, C, 1);
    double et = tap_rel_norm_err(rT, w.Tc, nt), nrm = 0.0;
    for (size_t e = 0; e < nt; e++)
        nrm += rT[e] * rT[e];
    ok(all_finite(w.Tc, nt) && et <= TC_REL_TOL &&
           memcmp(w.Tc, wz.Tc, nt * sizeof(float)) == 0,
       "Tc T=%d dk=%d C=%d vs f64 product (|Tc| %.3g): rel err %.2e, "
       "independent of S",
       T, dk, C, sqrt(nrm), et);

    /* Composition in f64 from the f32 pieces, against the f32 end state
     * from S_start and against the f64 end state. */
    double *comp = malloc(ns * sizeof(double)), *rS = malloc(ns * 8);
    double *ro = malloc((size_t)T * p.Hv * dk * sizeof(double));
    ref_gdn(ro, rS, &p);
    for (int h = 0; h < p.Hv; h++)
        for (int i = 0; i < dk; i++)
            for (int j = 0; j < dk; j++) {
                double s = wz.S[((size_t)h * dk + i) * dk + j];
                for (int l = 0; l < dk; l++)
                    s += (double)w.Tc[((size_t)h * dk + i) * dk + l] *
                         p.S0[((size_t)h * dk + l) * dk + j];
                comp[((size_t)h * dk + i) * dk + j] = s;
            }
    double ec = tap_rel_norm_err(comp, w.S, ns);
    float *compf = malloc(ns * sizeof(float));
    for (size_t e = 0; e < ns; e++)
        compf[e] = (float)comp[e];
    double er = tap_rel_norm_err(rS, compf, ns);
    ok(ec <= REL_TOL && er <= REL_TOL,
       "Tc S_start + S_end|0 = S_end (T=%d C=%d): vs kernel %.2e, vs f64 "
       "%.2e",
       T, C, ec, er);
    free(compf);
    free(comp);
    free(rS);
    free(ro);
    free(rT);
    out_free(&w);
    out_free(&wz);
    prob_free(&p);
    prob_free(&pz);
}

/* T = 0: nothing happens to S and the transition is the identity. */
static void test_empty(void)
{
    prob_t p;
    prob_make(&p, 0, 1, 2, 8, 8, 5, 0.0, 0);
    out_t w;
    run_chunk(&w, &p, 16, 1);
    int good = memcmp(w.S, p.S0, 2 * 64 * sizeof(float)) == 0;
    for (int h = 0; h < 2; h++)
        for (int i = 0; i < 8; i++)
            for (int j = 0; j < 8; j++)
                good = good && w.Tc[(h * 8 + i) * 8 + j] == (i == j);
    ok(good, "T=0: S unchanged, Tc = I");
    out_free(&w);
    prob_free(&p);
}

/* Strong decay, g down to -30 per token: in-chunk e^{gamma_i} reaches
 * e^{-1900}, which only log-space differences survive. */
static void test_strong_decay(int C)
{
    prob_t p;
    prob_make(&p, 200, 1, 2, 32, 32, 99 + C, -30.0, 0);
    size_t no = (size_t)p.T * p.Hv * p.dv, ns = (size_t)p.Hv * 32 * 32;
    double *ro = malloc(no * 8), *rS = malloc(ns * 8), *rT = malloc(ns * 8);
    ref_gdn(ro, rS, &p);
    ref_tc(rT, &p);
    out_t w;
    run_chunk(&w, &p, C, 1);
    double eo, es;
    int good = close_both(ro, w.o, no, &eo);
    good = close_both(rS, w.S, ns, &es) && good;
    /* The true Tc underflows to 0 in double as well (e^{-3000}); the kernel
     * flushes entries below 1e-30 (gdn_math.h). */
    good = good && all_finite(w.Tc, ns) &&
           tap_close_ratio_d(rT, w.Tc, ns, 1e-29, 0.0) <= 1.0;
    ok(good,
       "strong decay g in [-30,0], T=200 C=%d: finite, rel err o %.2e "
       "S %.2e",
       C, eo, es);
    free(ro);
    free(rS);
    free(rT);
    out_free(&w);
    prob_free(&p);
}

/* Two calls (a prefill split at any point) equal one call. */
static void test_split(void)
{
    prob_t p;
    prob_make(&p, 100, 2, 4, 32, 24, 8, 0.0, 0);
    size_t no = (size_t)p.T * p.Hv * p.dv, ns = (size_t)p.Hv * p.dk * p.dv;
    double *ro = malloc(no * 8), *rS = malloc(ns * 8);
    ref_gdn(ro, rS, &p);
    float *o = malloc(no * 4), *S = malloc(ns * 4);
    float *scr = malloc(hk_gdn_chunk_scratch(4, 32, 24, 16) * sizeof(float));
    memcpy(S, p.S0, ns * 4);
    int t1 = 37;
    hk_gdn_chunk(o, S, NULL, p.q, p.k, p.v, p.g, p.beta, t1, 2, 4, 32, 24, 16,
                 scr);
    size_t qo = (size_t)t1 * 2 * 32, vo = (size_t)t1 * 4 * 24;
    hk_gdn_chunk(o + vo, S, NULL, p.q + qo, p.k + qo, p.v + vo, p.g + t1 * 4,
                 p.beta + t1 * 4, p.T - t1, 2, 4, 32, 24, 16, scr);
    double eo, es;
    int good = close_both(ro, o, no, &eo);
    good = close_both(rS, S, ns, &es) && good;
    ok(good, "chunk split 37+63 = whole: rel err o %.2e S %.2e", eo, es);
    free(o);
    free(S);
    free(scr);
    free(ro);
    free(rS);
    prob_free(&p);
}

/* Results must not depend on the OpenMP thread count (bitwise). */
static void test_threads(void)
{
    prob_t p;
    prob_make(&p, 130, 2, 4, 64, 64, 17, 0.0, 0);
    int nth = omp_get_max_threads();
    size_t no = (size_t)p.T * p.Hv * p.dv, ns = (size_t)p.Hv * 64 * 64;
    out_t w1, w2;
    omp_set_num_threads(1);
    run_chunk(&w1, &p, 32, 1);
    float *o1 = malloc(no * 4), *S1 = malloc(ns * 4);
    memcpy(S1, p.S0, ns * 4);
    hk_gdn_recurrent(o1, S1, p.q, p.k, p.v, p.g, p.beta, p.T, 2, 4, 64, 64);
    omp_set_num_threads(nth > 1 ? nth : 2);
    run_chunk(&w2, &p, 32, 1);
    float *o2 = malloc(no * 4), *S2 = malloc(ns * 4);
    memcpy(S2, p.S0, ns * 4);
    hk_gdn_recurrent(o2, S2, p.q, p.k, p.v, p.g, p.beta, p.T, 2, 4, 64, 64);
    omp_set_num_threads(nth);
    /* Multi-threaded pthreads OpenBLAS: heads run in turn, BLAS splits
     * each product (its bits may differ, so only close). */
    if (openblas_get_parallel() == 1) {
        out_t w3;
        openblas_set_num_threads(2);
        run_chunk(&w3, &p, 32, 1);
        openblas_set_num_threads(1);
        ok(tap_close_ratio_f(w1.o, w3.o, no, ATOL, RTOL) <= 1.0 &&
               tap_close_ratio_f(w1.S, w3.S, ns, ATOL, RTOL) <= 1.0 &&
               tap_close_ratio_f(w1.Tc, w3.Tc, ns, ATOL, RTOL) <= 1.0,
           "2 pthreads OpenBLAS threads (heads in turn): same to rounding");
        out_free(&w3);
    } else {
        tap_skip("OpenBLAS is not the pthreads build");
    }
    ok(memcmp(w1.o, w2.o, no * 4) == 0 && memcmp(w1.S, w2.S, ns * 4) == 0 &&
           memcmp(w1.Tc, w2.Tc, ns * 4) == 0 && memcmp(o1, o2, no * 4) == 0 &&
           memcmp(S1, S2, ns * 4) == 0,
       "1 thread and %d threads give bitwise equal results", nth > 1 ? nth : 2);
    free(o1);
    free(S1);
    free(o2);
    free(S2);
    out_free(&w1);
    out_free(&w2);
    prob_free(&p);
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + 1e-9 * ts.tv_nsec;
}

/* 0.8B GDN layer: Hk = Hv = 16, dk = dv = 128, T = 2048; best of 3. */
static void bench(void)
{
    enum { T = 2048, H = 16, D = 128 };
    static const int Cs[] = {16, 32, 64};
    prob_t p;
    prob_make(&p, T, H, H, D, D, 1, 0.0, 0);
    size_t ns = (size_t)H * D * D;
    float *o = malloc((size_t)T * H * D * 4), *S = malloc(ns * 4);
    float *Tc = malloc(ns * 4);
    float *scr = malloc(hk_gdn_chunk_scratch(H, D, D, 64) * 4);
    double best = 1e9;
    for (int rep = 0; rep < 3; rep++) {
        double t0 = now_s();
        hk_gdn_recurrent(o, S, p.q, p.k, p.v, p.g, p.beta, T, H, H, D, D);
        best = fmin(best, now_s() - t0);
    }
    tap_diag("bench T=%d Hv=%d dk=dv=%d, %d threads: recurrent %.1f ms "
             "(%.0f tok/s)",
             T, H, D, omp_get_max_threads(), best * 1e3, T / best);
    for (int ic = 0; ic < 3; ic++) {
        double b0 = 1e9, b1 = 1e9;
        for (int rep = 0; rep < 3; rep++) {
            double t0 = now_s();
            hk_gdn_chunk(o, S, NULL, p.q, p.k, p.v, p.g, p.beta, T, H, H, D, D,
                         Cs[ic], scr);
            double t1 = now_s();
            hk_gdn_chunk(o, S, Tc, p.q, p.k, p.v, p.g, p.beta, T, H, H, D, D,
                         Cs[ic], scr);
            b0 = fmin(b0, t1 - t0);
            b1 = fmin(b1, now_s() - t1);
        }
        tap_diag("  chunk C=%d: %.1f ms (%.0f tok/s); with Tc %.1f ms", Cs[ic],
                 b0 * 1e3, T / b0, b1 * 1e3);
    }
    free(o);
    free(S);
    free(Tc);
    free(scr);
    prob_free(&p);
}

int main(void)
{
    /* A pthreads OpenBLAS must be single-threaded for the kernel to run
     * heads in parallel (hk_matmul_init does this in the engine); the
     * OpenMP build needs nothing, and setting it would also set ours. */
    if (openblas_get_parallel() == 1)
        openblas_set_num_threads(1);
    test_against_ref();
    test_odd_shape();
    test_all_chunk_sizes();
    test_tc(100, 32, 1);
    test_tc(100, 32, 7);
    test_tc(100, 64, 16);
    test_tc(257, 64, 64);
    test_tc(130, 128, 64);
    test_empty();
    test_strong_decay(64);
    test_strong_decay(37);
    test_split();
    test_threads();
    if (getenv("HK_BENCH"))
        bench();
    return tap_done();
}
