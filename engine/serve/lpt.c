/* lpt.c - LPT and round-robin job assignment, makespans (lpt.h). */
#include "engine/serve/lpt.h"

#include <stdlib.h>
#include <string.h>

typedef struct {
    double cost;
    int idx;
} job_t;

/* Descending cost, then ascending index: a total order, so the result
 * does not depend on qsort's (unstable) algorithm. */
static int job_cmp(const void *a, const void *b)
{
    const job_t *x = a, *y = b;
    if (x->cost != y->cost)
        return x->cost > y->cost ? -1 : 1;
    return (x->idx > y->idx) - (x->idx < y->idx);
}

static double max_of(const double *v, int n)
{
    double mx = 0;
    for (int i = 0; i < n; i++)
        if (v[i] > mx)
            mx = v[i];
    return mx;
}

double hp_lpt_assign(const double *cost, int n, int m, const double *base,
                     int *assign, double *load)
{
    if (n < 0 || m < 1)
        return -1;
    job_t *jobs = malloc((size_t)(n ? n : 1) * sizeof(*jobs));
    double *ld = load ? load : malloc((size_t)m * sizeof(double));
    if (!jobs || !ld) {
        free(jobs);
        if (ld != load)
            free(ld);
        return -1;
    }
    for (int j = 0; j < m; j++)
        ld[j] = base ? base[j] : 0;
    for (int i = 0; i < n; i++)
        jobs[i] = (job_t){cost[i], i};
    qsort(jobs, (size_t)n, sizeof(*jobs), job_cmp);
    for (int i = 0; i < n; i++) {
        int best = 0;
        for (int j = 1; j < m; j++) /* strict <: ties go to the lower index */
            if (ld[j] < ld[best])
                best = j;
        assign[jobs[i].idx] = best;
        ld[best] += jobs[i].cost;
    }
    double ms = max_of(ld, m);
    free(jobs);
    if (ld != load)
        free(ld);
    return ms;
}

int hp_lpt_order(const double *cost, int n, int *order)
{
    job_t *jobs = malloc((size_t)(n > 0 ? n : 1) * sizeof(*jobs));
    if (!jobs || n < 0) {
        free(jobs);
        return -1;
    }
    for (int i = 0; i < n; i++)
        jobs[i] = (job_t){cost[i], i};
    qsort(jobs, (size_t)n, sizeof(*jobs), job_cmp);
    for (int i = 0; i < n; i++)
        order[i] = jobs[i].idx;
    free(jobs);
    return 0;
}

double hp_rr_assign(const double *cost, int n, int m, const double *base,
                    int *assign, double *load)
{
    if (n < 0 || m < 1)
        return -1;
    for (int i = 0; i < n; i++)
        assign[i] = i % m;
    double ms = hp_lpt_makespan(cost, n, m, assign, base);
    if (load) {
        for (int j = 0; j < m; j++)
            load[j] = base ? base[j] : 0;
        for (int i = 0; i < n; i++)
            load[assign[i]] += cost[i];
    }
    return ms;
}

double hp_lpt_makespan(const double *cost, int n, int m, const int *assign,
                       const double *base)
{
    double ms = 0;
    if (m < 1)
        return -1;
    double *ld = calloc((size_t)m, sizeof(double));
    if (!ld)
        return -1;
    for (int j = 0; j < m; j++)
        ld[j] = base ? base[j] : 0;
    for (int i = 0; i < n; i++) {
        if (assign[i] < 0 || assign[i] >= m) {
            free(ld);
            return -1;
        }
        ld[assign[i]] += cost[i];
    }
    ms = max_of(ld, m);
    free(ld);
    return ms;
}

double hp_lpt_lower_bound(const double *cost, int n, int m)
{
    double total = 0, mx = 0;
    if (m < 1)
        return -1;
    for (int i = 0; i < n; i++) {
        total += cost[i];
        if (cost[i] > mx)
            mx = cost[i];
    }
    return total / m > mx ? total / m : mx;
}

/* ---- exhaustive optimum -------------------------------------------------- */

typedef struct {
    const double *c; /* descending */
    int n, m;
    double load[HP_LPT_OPT_MAX_JOBS];
    double best, bound;
} opt_t;

static void opt_dfs(opt_t *o, int k, double cur)
{
    if (o->best <= o->bound) /* cannot improve on the lower bound */
        return;
    if (k == o->n) {
        if (cur < o->best)
            o->best = cur;
        return;
    }
    for (int j = 0; j < o->m; j++) {
        /* machines with equal loads are interchangeable: try one */
        int seen = 0;
        for (int q = 0; q < j && !seen; q++)
            seen = o->load[q] == o->load[j];
        if (seen)
            continue;
        double nl = o->load[j] + o->c[k];
        if (nl >= o->best)
            continue;
        o->load[j] = nl;
        opt_dfs(o, k + 1, nl > cur ? nl : cur);
        o->load[j] -= o->c[k];
    }
}

double hp_lpt_optimum(const double *cost, int n, int m)
{
    if (m < 1 || n < 0 || n > HP_LPT_OPT_MAX_JOBS)
        return -1;
    if (n == 0)
        return 0;
    if (m >= n) /* one job each */
        return max_of(cost, n);
    double sorted[HP_LPT_OPT_MAX_JOBS];
    int as[HP_LPT_OPT_MAX_JOBS];
    job_t jobs[HP_LPT_OPT_MAX_JOBS] = {{0, 0}};
    for (int i = 0; i < n; i++)
        jobs[i] = (job_t){cost[i], i};
    qsort(jobs, (size_t)n, sizeof(*jobs), job_cmp);
    for (int i = 0; i < n; i++)
        sorted[i] = jobs[i].cost;
    opt_t o = {.c = sorted, .n = n, .m = m};
    memset(o.load, 0, sizeof(o.load));
    /* LPT is a feasible start; the search only looks for better */
    o.best = hp_lpt_assign(cost, n, m, NULL, as, NULL);
    o.bound = hp_lpt_lower_bound(cost, n, m);
    opt_dfs(&o, 0, 0);
    return o.best;
}
