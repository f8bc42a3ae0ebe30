/*
 * ckpt_dp.h - where to keep recurrent-state checkpoints inside one cached
 * prefix of N tokens (sparse prefix caching, papers/002 §3-4). A request
 * that overlaps the prefix to depth t resumes from the deepest checkpoint
 * c <= t and recomputes t - c tokens. Given the overlap law p[1..N]:
 * the exact O(N*M) dynamic program with the monotone convex-hull trick
 * (Theorem 2), balanced placement (optimal under a uniform law and in the
 * worst case, Theorem 1), and the cost of any placement. Pure functions.
 */
#ifndef HP_CKPT_DP_H
#define HP_CKPT_DP_H

#include "engine/contract/hp_error.h"

/* Expected recompute sum_t p[t] (t - l(t)) over t in [1, N] of the rising
 * checkpoints c[0..m) in [1, N], l(t) the deepest c <= t (0 if none).
 * p has N + 1 entries; p[0] is ignored. Weights need not sum to 1. */
double hp_ckpt_dp_cost(const double *p, int N, const int *c, int m);

/* Worst case max_t (t - l(t)) over t in [1, N]. */
int hp_ckpt_dp_worst(int N, const int *c, int m);

/* Balanced placement c_i = floor(i (N+1) / (M+1)), i = 1..M, into c[M]:
 * gaps differ by at most one. Returns M, or 0 when M <= 0 or M > N. */
int hp_ckpt_dp_balanced(int N, int M, int *c);

/*
 * The optimal placement of at most M checkpoints for the law p[0..N]
 * (p[0] ignored, p[t] >= 0): writes the rising positions to c (room for
 * M) and their count to *m, the expected recompute to *cost (may be
 * NULL). Checkpoints that serve no mass are dropped, so *m may be < M.
 * O(N*M) time, O(N*M) ints of scratch (allocated here and freed).
 * Errors: HP_EBADINPUT (N < 0, M < 0, a negative or non-finite weight),
 * HP_ENOMEM.
 */
int hp_ckpt_dp_solve(const double *p, int N, int M, int *c, int *m,
                     double *cost, hp_error_t *err);

#endif
