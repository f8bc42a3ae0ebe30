/*
 * test_lpt.c - LPT assignment: the specified order and tie rules, the
 * (4/3 - 1/(3m)) bound against the optimum found by brute force on small
 * instances (and attained on Graham's tight instances), determinism,
 * base loads, and round-robin as the worse baseline.
 */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "engine/serve/lpt.h"
#include "t/lib/tap.h"

static uint64_t rng_state = 0x9e3779b97f4a7c15ULL;
static uint32_t rnd(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state >> 11);
}

/* Every one of m^n assignments: checks the branch and bound itself. */
static double enumerate(const double *c, int n, int m)
{
    int a[16] = {0};
    double best = -1;
    for (;;) {
        double ms = hp_lpt_makespan(c, n, m, a, NULL);
        if (best < 0 || ms < best)
            best = ms;
        int k = 0;
        while (k < n && ++a[k] == m)
            a[k++] = 0;
        if (k == n)
            return best;
    }
}

int main(void)
{
    int as[64], as2[64];
    double load[8];

    /* the rule, step by step: 9 7 5 4 3 2 onto two workers */
    double c1[] = {5, 9, 3, 7, 2, 4};
    double ms = hp_lpt_assign(c1, 6, 2, NULL, as, load);
    int want1[] = {1, 0, 1, 1, 0, 0};
    ok(ms == 15 && !memcmp(as, want1, sizeof(want1)) && load[0] == 15 &&
           load[1] == 15,
       "LPT: longest first, each to the least loaded (makespan %.0f)", ms);

    double c2[] = {4, 4, 4, 4};
    hp_lpt_assign(c2, 4, 3, NULL, as, NULL);
    ok(as[0] == 0 && as[1] == 1 && as[2] == 2 && as[3] == 0,
       "LPT: equal costs in index order, ties to the lower worker");

    /* base loads: work already queued counts */
    double c3[] = {3, 3}, base[] = {10, 0};
    ms = hp_lpt_assign(c3, 2, 2, base, as, load);
    ok(as[0] == 1 && as[1] == 1 && ms == 10 && load[1] == 6,
       "LPT: queued work steers new jobs to the idle worker");

    /* Graham's tight instances: LPT = (4/3 - 1/(3m)) OPT exactly */
    double g2[] = {3, 3, 2, 2, 2};
    double g3[] = {5, 5, 4, 4, 3, 3, 3};
    double l2 = hp_lpt_assign(g2, 5, 2, NULL, as, NULL);
    double o2 = hp_lpt_optimum(g2, 5, 2);
    double l3 = hp_lpt_assign(g3, 7, 3, NULL, as, NULL);
    double o3 = hp_lpt_optimum(g3, 7, 3);
    ok(l2 == 7 && o2 == 6 && l3 == 11 && o3 == 9,
       "tight instances: LPT %.0f vs OPT %.0f (m=2), %.0f vs %.0f (m=3)", l2,
       o2, l3, o3);

    /* random small instances: the bound, the optimum checked by
     * enumeration, LPT never worse than round-robin's worst */
    int bad_bound = 0, bad_opt = 0, bad_lb = 0, rr_worse = 0, lpt_worse = 0;
    int trials = 3000;
    double worst = 1;
    for (int t = 0; t < trials; t++) {
        int n = 1 + (int)(rnd() % 9), m = 1 + (int)(rnd() % 4);
        double c[16];
        for (int i = 0; i < n; i++)
            c[i] = 1 + rnd() % 100;
        double lpt = hp_lpt_assign(c, n, m, NULL, as, NULL);
        double rr = hp_rr_assign(c, n, m, NULL, as2, NULL);
        double opt = hp_lpt_optimum(c, n, m);
        double lb = hp_lpt_lower_bound(c, n, m);
        if (n <= 7 && opt != enumerate(c, n, m))
            bad_opt++;
        if (lpt > (4.0 / 3 - 1.0 / (3 * m)) * opt + 1e-9 || lpt < opt)
            bad_bound++;
        if (opt < lb - 1e-9)
            bad_lb++;
        if (rr > lpt)
            rr_worse++;
        if (rr < opt)
            lpt_worse++; /* rr below the optimum: impossible */
        if (lpt / opt > worst)
            worst = lpt / opt;
    }
    ok(!bad_opt, "brute-force optimum equals full enumeration (%d wrong)",
       bad_opt);
    ok(!bad_bound,
       "%d random instances: OPT <= LPT <= (4/3 - 1/(3m)) OPT (worst "
       "ratio %.4f, %d violations)",
       trials, worst, bad_bound);
    ok(!bad_lb && !lpt_worse,
       "optimum >= max(largest, total/m), round-robin >= optimum");
    ok(rr_worse > trials / 10,
       "round-robin is worse than LPT on %d of %d instances", rr_worse, trials);

    /* deterministic: same input, same assignment; input order only
     * breaks ties between equal costs */
    double c4[40];
    for (int i = 0; i < 40; i++)
        c4[i] = 1 + rnd() % 5;
    hp_lpt_assign(c4, 40, 7, NULL, as, NULL);
    hp_lpt_assign(c4, 40, 7, NULL, as2, NULL);
    ok(!memcmp(as, as2, 40 * sizeof(int)), "LPT is deterministic");

    ok(hp_lpt_assign(c1, 6, 0, NULL, as, NULL) < 0 &&
           hp_lpt_makespan(c1, 2, 2, (int[]){0, 2}, NULL) < 0 &&
           hp_lpt_optimum(c4, 40, 3) < 0,
       "bad arguments are refused");
    return tap_done();
}
