/*
 * lpt.h - assignment of independent jobs (cold segments) to m workers,
 * minimising the heaviest worker's load (HYPIC §4.4, Eq. 9):
 *
 *   LPT          longest processing time first: jobs in descending cost
 *                (ties: lower index first), each to the worker with the
 *                least accumulated load (ties: lower worker index). Within
 *                (4/3 - 1/(3m)) of the optimum (Graham 1969).
 *   round-robin  job i (in the given order) to worker i mod m; the
 *                baseline LPT is compared with.
 *
 * Costs are abstract (token counts for the dispatcher, measured times for
 * the simulator). Every function is deterministic and allocation-free
 * except hp_lpt_assign (a sort index) and hp_lpt_optimum (recursion only).
 * Not here: threads or queues (prefill_pool.h).
 */
#ifndef HP_LPT_H
#define HP_LPT_H

/* The largest instance hp_lpt_optimum solves (branch and bound). */
#define HP_LPT_OPT_MAX_JOBS 24

/*
 * LPT: writes assign[n] (worker of each job, 0..m-1) and, if load != NULL,
 * load[m] (the accumulated cost per worker, starting from base[m] when
 * base != NULL: work those workers already have queued). Returns the
 * makespan (max of load), or -1 when n < 0, m < 1 or out of memory.
 */
double hp_lpt_assign(const double *cost, int n, int m, const double *base,
                     int *assign, double *load);

/* The order LPT takes jobs in: order[n] = job indices by descending
 * cost, ties by lower index. 0, or -1 (out of memory). */
int hp_lpt_order(const double *cost, int n, int *order);

/* Round-robin, same contract (base only adds to load). */
double hp_rr_assign(const double *cost, int n, int m, const double *base,
                    int *assign, double *load);

/* Makespan of a given assignment (base may be NULL); -1 on a worker index
 * out of range. */
double hp_lpt_makespan(const double *cost, int n, int m, const int *assign,
                       const double *base);

/* max(largest job, total / m): no assignment does better. */
double hp_lpt_lower_bound(const double *cost, int n, int m);

/* The optimal makespan by exhaustive search (no base loads); -1 when
 * n > HP_LPT_OPT_MAX_JOBS or m < 1. Exponential: small instances only. */
double hp_lpt_optimum(const double *cost, int n, int m);

#endif
