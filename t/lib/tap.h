/*
 * tap.h - a tiny TAP producer for the C unit tests (run by prove).
 *
 * Like Redis's testhelp.h: numbered checks, a plan at the end, exit 1 on
 * any failure. Numeric checks use one tolerance form for every test,
 * |ref - x| <= atol + rtol * |ref| (llm.c), and print the first mismatches.
 */
#ifndef HYPIC_TAP_H
#define HYPIC_TAP_H

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

static int tap_n_;
static int tap_failed_;

static inline int tap_ok(int cond, const char *fmt, ...)
{
    va_list ap;
    tap_n_++;
    printf("%sok %d - ", cond ? "" : "not ", tap_n_);
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    printf("\n");
    if (!cond)
        tap_failed_++;
    fflush(stdout);
    return cond;
}

#define ok(cond, ...) tap_ok(!!(cond), __VA_ARGS__)

static inline void tap_diag(const char *fmt, ...)
{
    va_list ap;
    printf("# ");
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    printf("\n");
    fflush(stdout);
}

static inline void tap_skip(const char *why)
{
    tap_n_++;
    printf("ok %d # SKIP %s\n", tap_n_, why);
}

/* Largest |ref - x| / (atol + rtol |ref|) over n values; <= 1 passes. */
static inline double tap_close_ratio_d(const double *ref, const float *x,
                                       size_t n, double atol, double rtol)
{
    double worst = 0.0;
    int shown = 0;
    for (size_t i = 0; i < n; i++) {
        double err = fabs(ref[i] - (double)x[i]);
        double lim = atol + rtol * fabs(ref[i]);
        double r = err / lim;
        if (!(r <= 1.0) && shown < 5) {
            tap_diag("  [%zu] ref %.9g got %.9g", i, ref[i], (double)x[i]);
            shown++;
        }
        if (!(r <= worst))
            worst = isnan(r) ? INFINITY : r;
    }
    return worst;
}

static inline double tap_close_ratio_f(const float *ref, const float *x,
                                       size_t n, double atol, double rtol)
{
    double worst = 0.0;
    int shown = 0;
    for (size_t i = 0; i < n; i++) {
        double err = fabs((double)ref[i] - (double)x[i]);
        double lim = atol + rtol * fabs((double)ref[i]);
        double r = err / lim;
        if (!(r <= 1.0) && shown < 5) {
            tap_diag("  [%zu] ref %.9g got %.9g", i, (double)ref[i],
                     (double)x[i]);
            shown++;
        }
        if (!(r <= worst))
            worst = isnan(r) ? INFINITY : r;
    }
    return worst;
}

/* Relative error in norm: ||ref - x|| / ||ref|| (0 when both are zero). */
static inline double tap_rel_norm_err(const double *ref, const float *x,
                                      size_t n)
{
    double num = 0.0, den = 0.0;
    for (size_t i = 0; i < n; i++) {
        double d = ref[i] - (double)x[i];
        num += d * d;
        den += ref[i] * ref[i];
    }
    if (den == 0.0)
        return sqrt(num);
    return sqrt(num / den);
}

#define close_d(ref, x, n, atol, rtol, ...)                                    \
    ok(tap_close_ratio_d((ref), (x), (n), (atol), (rtol)) <= 1.0, __VA_ARGS__)
#define close_f(ref, x, n, atol, rtol, ...)                                    \
    ok(tap_close_ratio_f((ref), (x), (n), (atol), (rtol)) <= 1.0, __VA_ARGS__)

static inline int tap_done(void)
{
    printf("1..%d\n", tap_n_);
    if (tap_failed_)
        printf("# %d of %d checks failed\n", tap_failed_, tap_n_);
    return tap_failed_ ? 1 : 0;
}

#endif
