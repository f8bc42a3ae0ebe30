/* ckpt_dp.c - sparse checkpoint placement: DP + convex hull (ckpt_dp.h). */
#include "engine/cache/ckpt_dp.h"

#include <math.h>
#include <stdlib.h>

double hp_ckpt_dp_cost(const double *p, int N, const int *c, int m)
{
    double cost = 0.0;
    int k = 0, last = 0;
    for (int t = 1; t <= N; t++) {
        while (k < m && c[k] <= t)
            last = c[k++];
        cost += p[t] * (double)(t - last);
    }
    return cost;
}

int hp_ckpt_dp_worst(int N, const int *c, int m)
{
    int worst = 0, k = 0, last = 0;
    for (int t = 1; t <= N; t++) {
        while (k < m && c[k] <= t)
            last = c[k++];
        if (t - last > worst)
            worst = t - last;
    }
    return worst;
}

int hp_ckpt_dp_balanced(int N, int M, int *c)
{
    if (M <= 0 || M > N)
        return 0;
    for (int i = 1; i <= M; i++)
        c[i - 1] = (int)(((long long)i * (N + 1)) / (M + 1));
    return M;
}

/*
 * dp[m][j] = T_j + min_{1<=s<=j} (dp[m-1][s-1] - T_{s-1} + s P_{s-1}
 *                                  - s P_j)
 * (papers/002 App. A.4): for fixed m, candidate s is the line
 * y = -s x + b_s queried at x = P_j. Slopes fall as s grows and the
 * queries P_j never fall, so the lower envelope is a deque whose front
 * only moves forward. dp[m][0] = 0: checkpoints beyond the served range
 * cost nothing, which makes dp[m] "at most m".
 */
typedef struct {
    double *b; /* intercepts */
    int *s;    /* slope -s */
    int head, size;
} hull_t;

static double line_at(const hull_t *h, int i, double x)
{
    return h->b[i] - (double)h->s[i] * x;
}

/* Line 2 is never strictly lowest once line 3 (steeper) exists:
 * x(1,3) <= x(1,2), with x(i,j) = (b_j - b_i) / (s_j - s_i). */
static int hull_useless(const hull_t *h, int i1, int i2, double b3, int s3)
{
    double l = (b3 - h->b[i1]) * (double)(h->s[i2] - h->s[i1]);
    double r = (h->b[i2] - h->b[i1]) * (double)(s3 - h->s[i1]);
    return l <= r;
}

static void hull_add(hull_t *h, double b, int s)
{
    while (h->size - h->head >= 2 &&
           hull_useless(h, h->size - 2, h->size - 1, b, s))
        h->size--; /* never below head + 1: passed lines stay put */
    h->b[h->size] = b;
    h->s[h->size] = s;
    h->size++;
}

/* Minimum over the envelope at x (queries non-decreasing); *arg gets s. */
static double hull_query(hull_t *h, double x, int *arg)
{
    while (h->head + 1 < h->size &&
           line_at(h, h->head + 1, x) <= line_at(h, h->head, x))
        h->head++;
    *arg = h->s[h->head];
    return line_at(h, h->head, x);
}

int hp_ckpt_dp_solve(const double *p, int N, int M, int *c, int *m,
                     double *cost, hp_error_t *err)
{
    *m = 0;
    if (N < 0 || M < 0)
        return hp_error_set(err, HP_EBADINPUT, "ckpt_dp: N %d, M %d", N, M);
    for (int t = 1; t <= N; t++)
        if (!(p[t] >= 0.0) || !isfinite(p[t]))
            return hp_error_set(err, HP_EBADINPUT, "ckpt_dp: weight %d is %g",
                                t, p[t]);
    if (M > N)
        M = N;
    size_t n1 = (size_t)N + 1;
    double *P = malloc(n1 * sizeof(double));
    double *T = malloc(n1 * sizeof(double));
    double *prev = malloc(n1 * sizeof(double));
    double *cur = malloc(n1 * sizeof(double));
    hull_t h = {malloc(n1 * sizeof(double)), malloc(n1 * sizeof(int)), 0, 0};
    int *arg = malloc(((size_t)M + 1) * n1 * sizeof(int));
    int rc = HP_OK;
    if (!P || !T || !prev || !cur || !h.b || !h.s || !arg) {
        rc = hp_error_set(err, HP_ENOMEM, "ckpt_dp: out of memory");
        goto done;
    }
    P[0] = T[0] = 0.0;
    for (int t = 1; t <= N; t++) {
        P[t] = P[t - 1] + p[t];
        T[t] = T[t - 1] + (double)t * p[t];
    }
    for (int j = 0; j <= N; j++)
        prev[j] = T[j]; /* no checkpoint: recompute every depth */
    for (int k = 1; k <= M; k++) {
        int *ak = arg + (size_t)k * n1;
        h.head = h.size = 0;
        cur[0] = 0.0;
        ak[0] = 0;
        for (int j = 1; j <= N; j++) {
            hull_add(&h, prev[j - 1] - T[j - 1] + (double)j * P[j - 1], j);
            cur[j] = T[j] + hull_query(&h, P[j], &ak[j]);
            if (cur[j] > prev[j]) { /* numerical guard: never worse */
                cur[j] = prev[j];
                ak[j] = -1; /* fewer checkpoints suffice here */
            }
        }
        double *sw = prev;
        prev = cur;
        cur = sw;
    }
    /* walk back: at layer k and prefix j, the last checkpoint is ak[j] */
    int j = N, k = M, n = 0;
    while (k > 0 && j > 0) {
        int s = arg[(size_t)k * n1 + j];
        if (s < 0) { /* this layer added nothing: same as k - 1 */
            k--;
            continue;
        }
        c[n++] = s;
        j = s - 1;
        k--;
    }
    for (int a = 0, b = n - 1; a < b; a++, b--) {
        int x = c[a];
        c[a] = c[b];
        c[b] = x;
    }
    /* drop checkpoints whose interval [c_i, next) holds no mass */
    int next = N + 1, kept = n;
    for (int i = n - 1; i >= 0; i--) {
        double mass = P[next - 1] - P[c[i] - 1];
        if (mass > 0.0) {
            next = c[i];
        } else {
            for (int q = i; q < kept - 1; q++)
                c[q] = c[q + 1];
            kept--;
        }
    }
    *m = kept;
    if (cost)
        *cost = hp_ckpt_dp_cost(p, N, c, kept);
done:
    free(arg);
    free(h.s);
    free(h.b);
    free(cur);
    free(prev);
    free(T);
    free(P);
    return rc;
}
