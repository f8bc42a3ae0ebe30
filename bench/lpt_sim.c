/*
 * lpt_sim.c - segment dispatch beyond the cores of this machine (issue 6;
 * HYPIC §4.4 Eq. 9, Fig. 14): per-segment prefill times from a linear
 * model t = a + b * tokens fitted to measured times (bench/segpar_bench
 * --times: tokens and per-segment CPU ms, the first two columns), then the
 * makespan of LPT and round-robin on m = 1..64 workers over random segment
 * mixes, against the lower bound max(largest job, total / m) and, where small
 * enough, the exact optimum.
 *
 *   build/bench/lpt_sim [--times FILE] [--a MS] [--b MS_PER_TOKEN]
 *       [--combine MS] [--mixes 1000] [--seed 1]
 *
 * Dispatch is by token count, as the engine does (prefill_pool.c); the
 * makespan is in modelled milliseconds. Workers are independent instances
 * (no shared cores, no transfer cost): the model's own assumptions.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/bench_util.h"
#include "engine/serve/lpt.h"

#define MAXN 256

static uint64_t rng = BENCH_SEED;

/* One "tokens ms [...]" line (further columns ignored). */
static int next_point(FILE *f, double *n, double *t)
{
    char line[256];
    while (fgets(line, sizeof(line), f))
        if (sscanf(line, "%lf %lf", n, t) == 2)
            return 1;
    return 0;
}

/* least squares t = a + b n over the file's "tokens ms" lines */
static int fit(const char *path, double *a, double *b, double *r2, int *npts)
{
    FILE *f = fopen(path, "r");
    double n, t, sx = 0, sy = 0, sxx = 0, sxy = 0, syy = 0;
    int k = 0;
    if (!f)
        return -1;
    while (next_point(f, &n, &t)) {
        sx += n;
        sy += t;
        sxx += n * n;
        sxy += n * t;
        syy += t * t;
        k++;
    }
    fclose(f);
    if (k < 2 || k * sxx - sx * sx == 0)
        return -1;
    *b = (k * sxy - sx * sy) / (k * sxx - sx * sx);
    *a = (sy - *b * sx) / k;
    if (*a < 0) { /* no negative fixed cost: fit through the origin */
        *a = 0;
        *b = sxy / sxx;
    }
    double ss_tot = syy - sy * sy / k, ss_res = 0;
    /* residuals need a second pass */
    f = fopen(path, "r");
    while (f && next_point(f, &n, &t))
        ss_res += (t - *a - *b * n) * (t - *a - *b * n);
    if (f)
        fclose(f);
    *r2 = ss_tot > 0 ? 1 - ss_res / ss_tot : 1;
    *npts = k;
    return 0;
}

typedef struct {
    double lpt, rr, lb, opt, seq;
} res_t;

static res_t simulate(const double *tok, int n, int m, double a, double b)
{
    double t[MAXN];
    int as[MAXN];
    res_t r = {0};
    for (int i = 0; i < n; i++) {
        t[i] = a + b * tok[i];
        r.seq += t[i];
    }
    hp_lpt_assign(tok, n, m, NULL, as, NULL);
    r.lpt = hp_lpt_makespan(t, n, m, as, NULL);
    hp_rr_assign(tok, n, m, NULL, as, NULL);
    r.rr = hp_lpt_makespan(t, n, m, as, NULL);
    r.lb = hp_lpt_lower_bound(t, n, m);
    r.opt = n <= 14 ? hp_lpt_optimum(t, n, m) : -1;
    return r;
}

int main(int argc, char **argv)
{
    const char *times = NULL;
    double a = -1, b = -1, r2 = 1, combine = 0;
    int mixes = 1000, npts = 0;
    if (argc % 2 == 0) { /* every option takes a value: --help lands here */
        fprintf(stderr,
                "usage: lpt_sim [--times FILE | --a MS --b MS_PER_TOKEN] "
                "[--combine MS] [--mixes N] [--seed S]\n");
        return 2;
    }
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--times"))
            times = argv[i + 1];
        else if (!strcmp(argv[i], "--a"))
            a = atof(argv[i + 1]);
        else if (!strcmp(argv[i], "--b"))
            b = atof(argv[i + 1]);
        else if (!strcmp(argv[i], "--combine"))
            combine = atof(argv[i + 1]);
        else if (!strcmp(argv[i], "--mixes"))
            mixes = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--seed"))
            rng ^= (uint64_t)atoll(argv[i + 1]) * 0x9e3779b97f4a7c15ull;
        else {
            fprintf(stderr, "unknown option %s\n", argv[i]);
            return 2;
        }
    }
    if (times && fit(times, &a, &b, &r2, &npts) != 0) {
        fprintf(stderr, "%s: need at least two \"tokens ms\" lines\n", times);
        return 1;
    }
    if (b < 0) { /* no data: a unit cost per token */
        a = 0;
        b = 1;
    }
    if (a < 0)
        a = 0;
    printf("time model: t = %.2f ms + %.4f ms/token", a, b);
    if (npts)
        printf(" (fit to %d measured segments of %s, R^2 %.4f)", npts, times,
               r2);
    printf("; combine %.0f ms\n\n", combine);

    /* Fig. 14: 11 equal segments of 2.4k tokens */
    static const int ms_fig[] = {1, 2, 4, 8, 16, 64};
    double tok[MAXN];
    printf("11 segments x 2400 tokens (HYPIC Fig. 14 shape)\n\n");
    printf("| workers | dispatch ms | + combine ms | speedup vs 1 worker |\n");
    printf("|---:|---:|---:|---:|\n");
    for (int i = 0; i < 11; i++)
        tok[i] = 2400;
    double one = simulate(tok, 11, 1, a, b).lpt + combine;
    for (size_t k = 0; k < sizeof(ms_fig) / sizeof(*ms_fig); k++) {
        res_t r = simulate(tok, 11, ms_fig[k], a, b);
        printf("| %d | %.0f | %.0f | %.2fx |\n", ms_fig[k], r.lpt,
               r.lpt + combine, one / (r.lpt + combine));
    }

    /* random mixes */
    static const struct {
        const char *name;
        int lo, hi, n;
    } mix[] = {{"uniform 1000..2400", 1000, 2400, 11},
               {"uniform 1000..2400", 1000, 2400, 32},
               {"uniform 1000..2400", 1000, 2400, 128},
               {"log-uniform 128..16384", 128, 16384, 11},
               {"log-uniform 128..16384", 128, 16384, 32},
               {"log-uniform 128..16384", 128, 16384, 128}};
    static const int ms[] = {2, 4, 8, 16, 32, 64};
    printf("\n%d random mixes each; makespan / lower bound "
           "max(largest, total/m), mean (worst); speedup = sequential / "
           "LPT makespan; OPT where n <= 14\n\n",
           mixes);
    printf("| mix | segs | workers | LPT/LB | RR/LB | LPT/OPT | speedup "
           "LPT | speedup RR |\n");
    printf("|---|---:|---:|---:|---:|---:|---:|---:|\n");
    for (size_t x = 0; x < sizeof(mix) / sizeof(*mix); x++) {
        for (size_t k = 0; k < sizeof(ms) / sizeof(*ms); k++) {
            int n = mix[x].n, m = ms[k];
            double sl = 0, wl = 0, sr = 0, wr = 0, so = 0, wo = 0, sp = 0,
                   spr = 0;
            int have_opt = 1;
            for (int t = 0; t < mixes; t++) {
                for (int i = 0; i < n; i++) {
                    double u = bench_unif(&rng);
                    tok[i] = mix[x].lo == 128
                                 ? floor(mix[x].lo *
                                         pow((double)mix[x].hi / mix[x].lo, u))
                                 : mix[x].lo +
                                       floor(u * (mix[x].hi - mix[x].lo + 1));
                }
                res_t r = simulate(tok, n, m, a, b);
                sl += r.lpt / r.lb;
                wl = fmax(wl, r.lpt / r.lb);
                sr += r.rr / r.lb;
                wr = fmax(wr, r.rr / r.lb);
                if (r.opt > 0) {
                    so += r.lpt / r.opt;
                    wo = fmax(wo, r.lpt / r.opt);
                } else {
                    have_opt = 0;
                }
                sp += r.seq / r.lpt;
                spr += r.seq / r.rr;
            }
            char opt[32] = "-";
            if (have_opt)
                snprintf(opt, sizeof(opt), "%.3f (%.3f)", so / mixes, wo);
            printf("| %s | %d | %d | %.3f (%.3f) | %.3f (%.3f) | %s | %.2fx "
                   "| %.2fx |\n",
                   mix[x].name, n, m, sl / mixes, wl, sr / mixes, wr, opt,
                   sp / mixes, spr / mixes);
        }
    }
    return 0;
}
