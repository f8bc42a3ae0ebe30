/*
 * test_ckpt_dp.c - sparse checkpoint placement against brute force: the
 * convex-hull DP is optimal over every placement on small N, M and equals
 * a plain O(N^2 M) DP on larger ones; balanced placement is optimal under
 * a uniform law, exactly the balanced sets are, with the closed-form cost
 * and worst case of Theorem 1.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/cache/ckpt_dp.h"
#include "t/lib/tap.h"

/* Integer weights keep every cost an exact integer in a double, so the
 * small-case comparisons are exact; real weights get a relative bound
 * for reassociated sums. */
#define REAL_TOL 1e-9

static unsigned long long rng_state = 88172645463325252ULL;
static unsigned rnd(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (unsigned)(rng_state >> 11);
}

/* Every subset of [1, N] of size <= M (or exactly M when exact): the
 * minimum cost, and a callback per subset. */
typedef struct {
    const double *p;
    int N;
    double best;
    int best_c[32], best_m;
} brute_t;

static void brute_rec(brute_t *b, int *c, int m, int from, int left)
{
    double cost = hp_ckpt_dp_cost(b->p, b->N, c, m);
    if (cost < b->best) {
        b->best = cost;
        b->best_m = m;
        memcpy(b->best_c, c, (size_t)m * sizeof(int));
    }
    if (left == 0)
        return;
    for (int s = from; s <= b->N; s++) {
        c[m] = s;
        brute_rec(b, c, m + 1, s + 1, left - 1);
    }
}

static double brute_min(const double *p, int N, int M)
{
    brute_t b = {p, N, INFINITY, {0}, 0};
    int c[32];
    brute_rec(&b, c, 0, 1, M);
    return b.best;
}

/* Plain DP: dp[m][j] = min_s dp[m-1][s-1] + w(s, j), O(N^2 M). */
static double plain_dp(const double *p, int N, int M)
{
    double *prev = malloc((size_t)(N + 1) * sizeof(double));
    double *cur = malloc((size_t)(N + 1) * sizeof(double));
    for (int j = 0; j <= N; j++) {
        prev[j] = 0;
        for (int t = 1; t <= j; t++)
            prev[j] += p[t] * t;
    }
    for (int m = 1; m <= M; m++) {
        cur[0] = 0;
        for (int j = 1; j <= N; j++) {
            double best = prev[j];
            for (int s = 1; s <= j; s++) {
                double w = 0;
                for (int t = s; t <= j; t++)
                    w += p[t] * (t - s);
                if (prev[s - 1] + w < best)
                    best = prev[s - 1] + w;
            }
            cur[j] = best;
        }
        double *x = prev;
        prev = cur;
        cur = x;
    }
    double r = prev[N];
    free(prev);
    free(cur);
    return r;
}

static void random_law(double *p, int N, int integer)
{
    p[0] = 0;
    int kind = rnd() % 3;
    for (int t = 1; t <= N; t++) {
        unsigned r = rnd();
        if (kind == 0) /* dense */
            p[t] = integer ? r % 10 : (r % 100000) / 1000.0;
        else if (kind == 1) /* sparse spikes */
            p[t] = r % 4 == 0 ? (integer ? 1 + r % 20 : (r % 997) / 7.0) : 0;
        else /* mostly zero, one heavy tail */
            p[t] = t > N / 2 && r % 3 == 0 ? (integer ? 5 : 4.75) : 0;
    }
}

static void test_dp_vs_brute(void)
{
    int bad = 0, cases = 0, worse = 0;
    for (int N = 1; N <= 13; N++) {
        for (int M = 0; M <= 5; M++) {
            for (int rep = 0; rep < 6; rep++) {
                double p[64];
                int c[64], m;
                double cost;
                hp_error_t err = {0};
                random_law(p, N, 1);
                if (hp_ckpt_dp_solve(p, N, M, c, &m, &cost, &err) != HP_OK) {
                    bad++;
                    continue;
                }
                double bf = brute_min(p, N, M);
                double check = hp_ckpt_dp_cost(p, N, c, m);
                int rising = 1;
                for (int i = 0; i < m; i++)
                    if (c[i] < 1 || c[i] > N || (i && c[i] <= c[i - 1]))
                        rising = 0;
                cases++;
                if (cost != bf || check != cost || m > M || !rising) {
                    if (bad < 5)
                        tap_diag("N %d M %d: dp %g (placement %g) brute %g", N,
                                 M, cost, check, bf);
                    bad++;
                }
                if (cost > bf)
                    worse++;
            }
        }
    }
    ok(bad == 0,
       "hull DP equals brute force over every placement (%d laws, N <= 13, "
       "M <= 5; %d worse)",
       cases, worse);
}

static void test_dp_vs_plain(void)
{
    int bad = 0;
    for (int rep = 0; rep < 40; rep++) {
        int N = 20 + rnd() % 180, M = 1 + rnd() % 9;
        double p[256];
        int c[16], m;
        double cost;
        hp_error_t err = {0};
        random_law(p, N, 0);
        hp_ckpt_dp_solve(p, N, M, c, &m, &cost, &err);
        double ref = plain_dp(p, N, M);
        if (fabs(cost - ref) > REAL_TOL * (1 + fabs(ref))) {
            if (bad < 5)
                tap_diag("N %d M %d: hull %.12g plain %.12g", N, M, cost, ref);
            bad++;
        }
    }
    ok(bad == 0, "hull DP equals the O(N^2 M) DP on 40 real-valued laws");
}

/* gaps g_0..g_M with c_0 = 0, c_{M+1} = N + 1 differ by at most one */
static int balanced(const int *c, int m, int N)
{
    int lo = 1 << 30, hi = 0, prev = 0;
    for (int i = 0; i <= m; i++) {
        int g = (i < m ? c[i] : N + 1) - prev;
        if (g < lo)
            lo = g;
        if (g > hi)
            hi = g;
        prev = i < m ? c[i] : prev;
    }
    return hi - lo <= 1;
}

/* Theorem 1 by brute force under p_t = 1: every exact-M set with the
 * minimum cost is balanced and every balanced set has it; the minimum is
 * the closed form; balanced also minimises the worst case. */
typedef struct {
    int N, M;
    double best;
    int worst_best;
    int n_opt, n_opt_unbalanced, n_bal, n_bal_not_opt;
} thm_t;

static void thm_rec(thm_t *x, const double *p, int *c, int m, int from,
                    int pass)
{
    if (m == x->M) {
        double cost = hp_ckpt_dp_cost(p, x->N, c, m);
        int worst = hp_ckpt_dp_worst(x->N, c, m);
        int bal = balanced(c, m, x->N);
        if (pass == 0) {
            if (cost < x->best)
                x->best = cost;
            if (worst < x->worst_best)
                x->worst_best = worst;
        } else {
            if (cost == x->best) {
                x->n_opt++;
                x->n_opt_unbalanced += !bal;
            }
            if (bal) {
                x->n_bal++;
                x->n_bal_not_opt += cost != x->best;
            }
        }
        return;
    }
    for (int s = from; s <= x->N; s++) {
        c[m] = s;
        thm_rec(x, p, c, m + 1, s + 1, pass);
    }
}

static void test_theorem1(void)
{
    int bad_iff = 0, bad_form = 0, bad_worst = 0, bad_bal = 0, bad_dp = 0;
    int cases = 0;
    for (int N = 1; N <= 13; N++) {
        double p[32];
        p[0] = 0;
        for (int t = 1; t <= N; t++)
            p[t] = 1.0;
        for (int M = 1; M <= N && M <= 6; M++) {
            thm_t x = {N, M, INFINITY, 1 << 30, 0, 0, 0, 0};
            int c[32];
            thm_rec(&x, p, c, 0, 1, 0);
            thm_rec(&x, p, c, 0, 1, 1);
            cases++;
            if (x.n_opt_unbalanced || x.n_bal_not_opt || x.n_bal == 0)
                bad_iff++;
            int K = M + 1, q = (N + 1) / K, rho = (N + 1) % K;
            double form = (K - rho) * q * (q - 1) / 2.0 +
                          rho * q * (q + 1) / 2.0; /* = N E[r] */
            if (form != x.best)
                bad_form++;
            if (x.worst_best != (N + 1 + K - 1) / K - 1)
                bad_worst++;
            int cb[32];
            int mb = hp_ckpt_dp_balanced(N, M, cb);
            if (mb != M || !balanced(cb, mb, N) ||
                hp_ckpt_dp_cost(p, N, cb, mb) != x.best ||
                hp_ckpt_dp_worst(N, cb, mb) != x.worst_best)
                bad_bal++;
            int cd[32], md;
            double cost;
            hp_error_t err = {0};
            hp_ckpt_dp_solve(p, N, M, cd, &md, &cost, &err);
            if (cost != x.best)
                bad_dp++;
        }
    }
    ok(bad_iff == 0,
       "uniform law: optimal <=> balanced, by brute force (%d (N, M))", cases);
    ok(bad_form == 0, "uniform law: optimum equals the closed form");
    ok(bad_worst == 0,
       "worst case: min over placements is ceil((N+1)/(M+1)) - 1");
    ok(bad_bal == 0,
       "hp_ckpt_dp_balanced is balanced, optimal and worst-case optimal");
    ok(bad_dp == 0, "the DP finds the balanced optimum under a uniform law");
}

static void test_edges(void)
{
    double p[8] = {0, 1, 2, 3, 4, 5, 6, 7};
    int c[8], m = -1;
    double cost;
    hp_error_t err = {0};
    hp_ckpt_dp_solve(p, 7, 0, c, &m, &cost, &err);
    ok(m == 0 && cost == hp_ckpt_dp_cost(p, 7, c, 0) && cost == 140,
       "M = 0: no checkpoint, cost sum t p_t (%g)", cost);
    hp_ckpt_dp_solve(p, 7, 20, c, &m, &cost, &err);
    ok(m == 7 && cost == 0, "M > N: a checkpoint at every depth, cost 0");
    double q[8] = {0, 0, 0, 0, 0, 0, 0, 9};
    hp_ckpt_dp_solve(q, 7, 3, c, &m, &cost, &err);
    ok(m == 1 && c[0] == 7 && cost == 0,
       "a point mass gets one checkpoint exactly there (m %d)", m);
    double r[8] = {0, 1, 0, 0, 0, 0, 0, 0};
    ok(hp_ckpt_dp_solve(r, -1, 1, c, &m, &cost, &err) == HP_EBADINPUT,
       "N < 0 is bad input");
    r[3] = -1;
    ok(hp_ckpt_dp_solve(r, 7, 1, c, &m, &cost, &err) == HP_EBADINPUT,
       "a negative weight is bad input");
    /* a law concentrated in two places: balanced loses to the DP */
    double s[101] = {0};
    s[30] = 50, s[31] = 10, s[90] = 40;
    int cb[2];
    hp_ckpt_dp_balanced(100, 2, cb);
    hp_ckpt_dp_solve(s, 100, 2, c, &m, &cost, &err);
    ok(cost == 10 && cost < hp_ckpt_dp_cost(s, 100, cb, 2),
       "two spikes: DP cost %g < balanced %g", cost,
       hp_ckpt_dp_cost(s, 100, cb, 2));
}

int main(void)
{
    test_dp_vs_brute();
    test_dp_vs_plain();
    test_theorem1();
    test_edges();
    return tap_done();
}
