/*
 * test_kvbuf.c - KVBuffer kernels (hk_kvbuf.c) against a float64
 * token-by-token Gated DeltaNet recurrence: chunkwise steps of 1..7 tokens
 * with flushes at irregular points, state-less (KV-only) buffers, odd
 * geometry (dk != dv, GVA, blocks of 3 tokens), strong decay, the
 * effective state, batch/thread invariance (bitwise), and the conv-history
 * commit used to drop rejected drafts.
 */
#include <cblas.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/hk_cpu.h"
#include "kernels/cpu/hk_kvbuf.h"
#include "t/lib/tap.h"
#include "t/lib/testrand.h"

/* f32 kernel vs the f64 recurrence, relative error in norm per call (o)
 * and per state. A buffered output is a sum of <= lmax + 1 terms of f32
 * products (dot products over dk, decays from double G), the flush one
 * sgemm: errors are ~1e-7..1e-6, and the state contracts, so rounding does
 * not compound over steps. 1e-5 leaves ~10x margin while any wrong decay
 * index or dropped term costs 1e-3 and more (see the negative control). */
#define REL_TOL 1e-5
/* Per element, |ref - x| <= ATOL + RTOL |ref|: entries are O(0.1..1);
 * ATOL covers entries that cancel to ~0 (absolute rounding of O(1)
 * summands, ~1e-7 sqrt(dk)). */
#define ATOL 2e-6
#define RTOL 1e-4
/* State entries grow to O(1..5) in weak-decay heads (a sum of many
 * writes), so near-zero entries carry the absolute rounding of those
 * (hk_gdn_recurrent shows up to ~1.5e-6 over long runs). */
#define STATE_ATOL 5e-6

typedef struct {
    int Hk, Hv, dk, dv, T;
    float *q, *k, *v, *g, *beta; /* [T,Hk,dk] x2, [T,Hv,dv], [T,Hv] x2 */
} toks_t;

/* Unit vector (eps 1e-6 inside the sqrt, as the model), times scale. */
/* Per value head a decay scale log-uniform in [1e-3, 8] (weak heads keep
 * hundreds of tokens, strong ones a handful), g = -scale * softplus(N),
 * beta = sigmoid(2N). gmin < 0: g uniform in [gmin, 0] instead. */
static void toks_make(toks_t *p, int T, int Hk, int Hv, int dk, int dv,
                      uint64_t seed, double gmin)
{
    test_rng_t r = {seed};
    p->T = T, p->Hk = Hk, p->Hv = Hv, p->dk = dk, p->dv = dv;
    p->q = malloc((size_t)T * Hk * dk * sizeof(float));
    p->k = malloc((size_t)T * Hk * dk * sizeof(float));
    p->v = malloc((size_t)T * Hv * dv * sizeof(float));
    p->g = malloc((size_t)T * Hv * sizeof(float));
    p->beta = malloc((size_t)T * Hv * sizeof(float));
    double sc[64];
    for (int h = 0; h < Hv; h++)
        sc[h] = exp(log(1e-3) + test_rng_unif(&r) * (log(8.0) - log(1e-3)));
    for (int t = 0; t < T; t++) {
        for (int h = 0; h < Hk; h++) {
            test_rng_unit(&r, p->q + ((size_t)t * Hk + h) * dk, dk,
                          1.0 / sqrt(dk));
            test_rng_unit(&r, p->k + ((size_t)t * Hk + h) * dk, dk, 1.0);
        }
        for (int e = 0; e < Hv * dv; e++)
            p->v[(size_t)t * Hv * dv + e] = (float)test_rng_normal(&r);
        for (int h = 0; h < Hv; h++) {
            double a = test_rng_normal(&r), gg;
            gg = gmin < 0.0 ? gmin * test_rng_unif(&r)
                            : -sc[h] * (a > 20 ? a : log1p(exp(a)));
            p->g[(size_t)t * Hv + h] = (float)gg;
            p->beta[(size_t)t * Hv + h] =
                (float)(1.0 / (1.0 + exp(-2.0 * test_rng_normal(&r))));
        }
    }
}

static void toks_free(toks_t *p)
{
    free(p->q);
    free(p->k);
    free(p->v);
    free(p->g);
    free(p->beta);
}

/* f64 recurrence over tokens [t0, t1) from S[Hv,dk,dv] (in/out), as the
 * model spec writes it: decay, read, delta, write, read the output. */
static void ref_run(double *o, double *S, const toks_t *p, int t0, int t1)
{
    int Hk = p->Hk, Hv = p->Hv, dk = p->dk, dv = p->dv;
    double u[512];
    for (int h = 0; h < Hv; h++) {
        double *Sh = S + (size_t)h * dk * dv;
        int kh = h / (Hv / Hk);
        for (int t = t0; t < t1; t++) {
            const float *q = p->q + ((size_t)t * Hk + kh) * dk;
            const float *k = p->k + ((size_t)t * Hk + kh) * dk;
            const float *v = p->v + ((size_t)t * Hv + h) * dv;
            double a = exp((double)p->g[(size_t)t * Hv + h]);
            double b = p->beta[(size_t)t * Hv + h];
            for (size_t e = 0; e < (size_t)dk * dv; e++)
                Sh[e] *= a;
            for (int j = 0; j < dv; j++) {
                double s = 0.0;
                for (int i = 0; i < dk; i++)
                    s += Sh[(size_t)i * dv + j] * k[i];
                u[j] = b * (v[j] - s);
            }
            for (int i = 0; i < dk; i++)
                for (int j = 0; j < dv; j++)
                    Sh[(size_t)i * dv + j] += k[i] * u[j];
            for (int j = 0; j < dv; j++) {
                double s = 0.0;
                for (int i = 0; i < dk; i++)
                    s += Sh[(size_t)i * dv + j] * q[i];
                o[((size_t)(t - t0) * Hv + h) * dv + j] = s;
            }
        }
    }
}

/* A state's worst of relative-in-norm error / REL_TOL and elementwise
 * ratio (<= 1 passes both). quiet: the norm only, no diagnostics. */
static double worse(double w, const double *ref, const float *x, size_t n,
                    int quiet)
{
    double a = tap_rel_norm_err(ref, x, n) / REL_TOL;
    double b = quiet ? 0.0 : tap_close_ratio_d(ref, x, n, STATE_ATOL, RTOL);
    a = a > b ? a : b;
    return a > w ? a : w;
}

/* Squared error and squared reference summed into acc[2]: the outputs'
 * relative error in norm is taken over a whole run, because one output
 * alone can be tiny (o = (k.q) w under total decay, with k.q ~ 1e-4),
 * where the bound that matters is the elementwise absolute one. */
static void accum(double *acc, const double *ref, const float *x, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        double d = ref[i] - (double)x[i];
        acc[0] += d * d;
        acc[1] += ref[i] * ref[i];
    }
}

/* An arena of nb blocks with ids 0..nb-1 in order. */
typedef struct {
    hk_kvbuf_geom_t g;
    float *arena;
    int *ids;
    int nb, lmax;
    float *scratch;
} bufs_t;

static void bufs_make(bufs_t *b, hk_kvbuf_geom_t g, int lmax, int T, int nth)
{
    b->g = g;
    b->lmax = lmax;
    b->nb = (lmax + g.bs - 1) / g.bs;
    b->arena = calloc((size_t)b->nb * hk_kvbuf_block_floats(&g), 4);
    b->ids = malloc((size_t)b->nb * sizeof(int));
    for (int i = 0; i < b->nb; i++)
        b->ids[i] = i;
    size_t s1 = hk_kvbuf_step_scratch(&g, T, lmax, nth);
    size_t s2 = hk_kvbuf_flush_scratch(&g, lmax, nth);
    b->scratch = malloc((s1 > s2 ? s1 : s2) * sizeof(float));
}

static void bufs_free(bufs_t *b)
{
    free(b->arena);
    free(b->ids);
    free(b->scratch);
}

/*
 * Runs p through a buffer in calls of T tokens (the sizes cycle through
 * steps[]), flushing whenever len reaches cap (the flush takes all len
 * entries), from S0 (NULL: state-less until the first flush). Checks every
 * call's outputs elementwise and all of them in norm, and after each flush
 * and at the end the state (the effective state, folded into a copy, then
 * the flushed one) in norm and elementwise, against the f64 recurrence.
 * Returns the worst error ratio (<= 1 passes). damage > 0 corrupts the G
 * of entry 1 by that much once it exists (negative control).
 */
static double run_case(const toks_t *p, int bs, const float *S0,
                       const int *steps, int nsteps, int cap, int nth,
                       double damage)
{
    int Hv = p->Hv, dk = p->dk, dv = p->dv, maxT = 0;
    for (int i = 0; i < nsteps; i++)
        maxT = steps[i] > maxT ? steps[i] : maxT;
    hk_kvbuf_geom_t g = {p->Hk, Hv, dk, dv, bs};
    bufs_t B;
    bufs_make(&B, g, cap - 1 + maxT, maxT, nth);
    size_t ns = (size_t)Hv * dk * dv;
    float *S = malloc(ns * sizeof(float)), *Se = malloc(ns * sizeof(float));
    double *Sr = malloc(ns * sizeof(double));
    double * or = malloc((size_t)maxT * Hv * dv * sizeof(double));
    float *o = malloc((size_t)maxT * Hv * dv * sizeof(float));
    int have = S0 != NULL, len = 0, call = 0;
    const int quiet = damage > 0.0;
    double acc[2] = {0.0, 0.0};
    for (size_t e = 0; e < ns; e++) {
        S[e] = have ? S0[e] : 0.0f;
        Sr[e] = S[e];
    }
    double w = 0.0;
    for (int t0 = 0; t0 < p->T; call++) {
        int T = steps[call % nsteps];
        T = T < p->T - t0 ? T : p->T - t0;
        hk_kvbuf_view_t vw = {have ? S : NULL, B.ids, len};
        size_t qo = (size_t)t0 * p->Hk * dk, vo = (size_t)t0 * Hv * dv;
        hk_kvbuf_step(o, B.arena, &vw, p->q + qo, p->k + qo, p->v + vo,
                      p->g + (size_t)t0 * Hv, p->beta + (size_t)t0 * Hv, 1, T,
                      &g, B.lmax, B.scratch, nth);
        ref_run(or, Sr, p, t0, t0 + T);
        size_t no = (size_t)T * Hv * dv;
        if (!quiet) {
            double e = tap_close_ratio_d(or, o, no, ATOL, RTOL);
            w = e > w ? e : w;
        }
        accum(acc, or, o, no);
        if (damage > 0.0 && len + T > 1) {
            *hk_kvbuf_G(B.arena, &g, B.ids, 1, 0) -= damage;
            damage = 0.0;
        }
        len += T;
        t0 += T;
        if (len >= cap || t0 == p->T) {
            /* Effective state on a copy, then (if full) the real flush. */
            memcpy(Se, S, ns * sizeof(float));
            if (!have)
                memset(Se, 0, ns * sizeof(float));
            hk_kvbuf_view_t ve = {Se, B.ids, len};
            hk_kvbuf_flush(B.arena, &ve, &len, 1, &g, B.scratch, nth);
            w = worse(w, Sr, Se, ns, quiet);
            if (len >= cap) {
                if (!have)
                    memset(S, 0, ns * sizeof(float));
                have = 1;
                hk_kvbuf_view_t vf = {S, B.ids, len};
                hk_kvbuf_flush(B.arena, &vf, &len, 1, &g, B.scratch, nth);
                w = worse(w, Sr, S, ns, quiet);
                len = 0;
            }
        }
    }
    double e = sqrt(acc[0] / acc[1]) / REL_TOL;
    w = e > w ? e : w;
    bufs_free(&B);
    free(S);
    free(Se);
    free(Sr);
    free(or);
    free(o);
    return w;
}

static float *rand_state(int Hv, int dk, int dv, uint64_t seed)
{
    test_rng_t r = {seed};
    float *S = malloc((size_t)Hv * dk * dv * sizeof(float));
    for (size_t e = 0; e < (size_t)Hv * dk * dv; e++)
        S[e] = (float)(0.5 * test_rng_normal(&r));
    return S;
}

static void test_chunkwise(void)
{
    static const int one[] = {1}, mix[] = {1, 5, 2, 1, 7, 3, 1, 1, 4};
    struct {
        int Hk, Hv, dk, dv, bs, cap, T;
        const int *steps;
        int ns, state, nth;
        double gmin;
        const char *what;
    } cs[] = {
        {2, 4, 24, 40, 3, 10, 120, one, 1, 1, 2, 0, "decode, GVA, bs 3"},
        {2, 4, 24, 40, 3, 10, 120, mix, 9, 1, 2, 0, "mixed steps 1..7"},
        {1, 1, 128, 128, 16, 64, 200, one, 1, 1, 2, 0, "0.8B head, B 64"},
        {1, 2, 128, 128, 16, 20, 120, mix, 9, 1, 2, 0, "dv 128, mixed steps"},
        {2, 2, 40, 160, 16, 24, 120, mix, 9, 1, 2, 0, "dv 160 (block + tail)"},
        {2, 2, 32, 16, 5, 23, 150, mix, 9, 0, 1, 0, "KV-only then state"},
        {2, 4, 24, 40, 4, 1000, 90, mix, 9, 0, 2, 0, "KV-only, no flush"},
        {1, 2, 16, 24, 4, 12, 100, mix, 9, 1, 2, -60.0, "g down to -60"},
        {1, 2, 16, 24, 4, 12, 100, one, 1, 1, 2, -300.0, "g down to -300"},
    };
    for (size_t c = 0; c < sizeof(cs) / sizeof(cs[0]); c++) {
        toks_t p;
        toks_make(&p, cs[c].T, cs[c].Hk, cs[c].Hv, cs[c].dk, cs[c].dv, 100 + c,
                  cs[c].gmin);
        float *S0 = cs[c].state
                        ? rand_state(cs[c].Hv, cs[c].dk, cs[c].dv, 7 + c)
                        : NULL;
        double w = run_case(&p, cs[c].bs, S0, cs[c].steps, cs[c].ns, cs[c].cap,
                            cs[c].nth, 0.0);
        ok(w <= 1.0, "%s: o and S match the f64 recurrence (worst %.3f)",
           cs[c].what, w);
        free(S0);
        toks_free(&p);
    }

    /* Negative control: G of one entry off by 1e-3 must be caught. */
    toks_t p;
    toks_make(&p, 40, 2, 4, 24, 40, 5, 0.0);
    float *S0 = rand_state(4, 24, 40, 6);
    double w = run_case(&p, 3, S0, one, 1, 1000, 1, 1e-3);
    ok(w > 1.0, "a G entry off by 1e-3 fails the check (worst %.1f)", w);
    free(S0);
    toks_free(&p);
}

/* A batch of requests with different buffer lengths and states (one
 * state-less) gives each request exactly its solo outputs and entries,
 * with 1 or 2 threads. */
static void test_batch_bits(int dk, int dv, int bs, int T)
{
    const int R = 4, Hk = 2, Hv = 4;
    const int lens[] = {0, 5, 11, 2};
    hk_kvbuf_geom_t g = {Hk, Hv, dk, dv, bs};
    int lmax = 11 + T, nbr = (lmax + bs - 1) / bs;
    size_t bf = hk_kvbuf_block_floats(&g);
    float *arena = calloc((size_t)R * nbr * bf, sizeof(float));
    float *solo = calloc((size_t)nbr * bf, sizeof(float));
    int *ids = malloc((size_t)R * nbr * sizeof(int));
    /* Request r owns blocks r, r+R, r+2R...: interleaved in the arena. */
    for (int r = 0; r < R; r++)
        for (int j = 0; j < nbr; j++)
            ids[r * nbr + j] = j * R + r;
    int solo_ids[64];
    for (int j = 0; j < nbr; j++)
        solo_ids[j] = j;
    toks_t fill, x;
    toks_make(&fill, R * 11, Hk, Hv, dk, dv, 31, 0.0);
    toks_make(&x, R * T, Hk, Hv, dk, dv, 32, 0.0);
    float *S[4];
    hk_kvbuf_view_t vw[4];
    size_t sc = hk_kvbuf_step_scratch(&g, 11, lmax, 2);
    float *scr = malloc(sc * sizeof(float));
    float *junk = malloc((size_t)11 * Hv * dv * sizeof(float));
    for (int r = 0; r < R; r++) {
        S[r] = r == 2 ? NULL : rand_state(Hv, dk, dv, 40 + r);
        /* Fill the first lens[r] entries, request by request. */
        hk_kvbuf_view_t v0 = {S[r], ids + r * nbr, 0};
        if (lens[r])
            hk_kvbuf_step(
                junk, arena, &v0, fill.q + (size_t)r * 11 * Hk * dk,
                fill.k + (size_t)r * 11 * Hk * dk,
                fill.v + (size_t)r * 11 * Hv * dv, fill.g + (size_t)r * 11 * Hv,
                fill.beta + (size_t)r * 11 * Hv, 1, lens[r], &g, lmax, scr, 2);
        vw[r] = (hk_kvbuf_view_t){S[r], ids + r * nbr, lens[r]};
    }
    float *solo_arena_src = malloc((size_t)R * nbr * bf * sizeof(float));
    memcpy(solo_arena_src, arena, (size_t)R * nbr * bf * sizeof(float));
    size_t no = (size_t)R * T * Hv * dv;
    float *ob = malloc(no * sizeof(float)), *os = malloc(no * sizeof(float));
    int same = 1;
    for (int nth = 1; nth <= 2; nth++) {
        memcpy(arena, solo_arena_src, (size_t)R * nbr * bf * sizeof(float));
        hk_kvbuf_step(ob, arena, vw, x.q, x.k, x.v, x.g, x.beta, R, T, &g, lmax,
                      scr, nth);
        for (int r = 0; r < R; r++) {
            /* Solo: copy r's blocks into a private arena in order. */
            for (int j = 0; j < nbr; j++)
                memcpy(solo + (size_t)j * bf,
                       solo_arena_src + (size_t)ids[r * nbr + j] * bf,
                       bf * sizeof(float));
            hk_kvbuf_view_t v1 = {S[r], solo_ids, lens[r]};
            size_t qo = (size_t)r * T * Hk * dk, vo = (size_t)r * T * Hv * dv;
            hk_kvbuf_step(os + vo, solo, &v1, x.q + qo, x.k + qo, x.v + vo,
                          x.g + (size_t)r * T * Hv, x.beta + (size_t)r * T * Hv,
                          1, T, &g, lmax, scr, 3 - nth);
            for (int j = 0; j < nbr; j++)
                same &= !memcmp(solo + (size_t)j * bf,
                                arena + (size_t)ids[r * nbr + j] * bf,
                                bf * sizeof(float));
        }
        same &= !memcmp(ob, os, no * sizeof(float));
    }
    ok(same,
       "dk %d dv %d bs %d T %d: batched requests = their solo runs, bit for "
       "bit, 1 or 2 threads",
       dk, dv, bs, T);
    for (int r = 0; r < R; r++)
        free(S[r]);
    free(arena);
    free(solo);
    free(solo_arena_src);
    free(ids);
    free(scr);
    free(junk);
    free(ob);
    free(os);
    toks_free(&fill);
    toks_free(&x);
}

/* Conv history after m accepted drafts = hk_conv1d_silu's over x[0..m),
 * bit for bit, for m = 0..n and n below and above K-1. */
static void test_conv_commit(void)
{
    const int C = 7, K = 4;
    test_rng_t r = {77};
    int good = 1;
    for (int n = 1; n <= 6; n++) {
        float st0[7 * 3], x[6 * 7], y[6 * 7], w[7 * 4];
        for (int i = 0; i < C * (K - 1); i++)
            st0[i] = (float)test_rng_normal(&r);
        for (int i = 0; i < n * C; i++)
            x[i] = (float)test_rng_normal(&r);
        for (int i = 0; i < C * K; i++)
            w[i] = (float)test_rng_normal(&r);
        for (int m = 0; m <= n; m++) {
            float ref[7 * 3], scratch[7 * 3], st[7 * 3];
            memcpy(ref, st0, sizeof(st0));
            if (m)
                hk_conv1d_silu(y, ref, x, w, m, C, K);
            /* Verification convolves all n drafts on a scratch copy... */
            memcpy(scratch, st0, sizeof(st0));
            hk_conv1d_silu(y, scratch, x, w, n, C, K);
            /* ...and only the commit touches the real history. */
            memcpy(st, st0, sizeof(st0));
            hk_kvbuf_conv_commit(st, x, m, C, K);
            good &= !memcmp(st, ref, sizeof(st));
        }
    }
    ok(good, "conv commit of m accepted drafts = conv over them (bitwise)");
}

int main(void)
{
    hk_matmul_init();
    test_chunkwise();
    test_batch_bits(24, 40, 3, 3);
    test_batch_bits(32, 128, 16, 1);
    test_batch_bits(32, 128, 16, 4);
    test_conv_commit();
    return tap_done();
}
