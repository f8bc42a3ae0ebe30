/*
 * bench_util.h - what the benches share: clocks, the xorshift64 stream
 * their synthetic inputs come from, comma lists of integers, inverse-CDF
 * picks (Zipf popularity), and reporting an engine error.
 *
 * Static inline: each bench is one .c file built into its own program
 * (the Makefile's bench rule), so there is no object to link them with.
 */
#ifndef HYPIC_BENCH_UTIL_H
#define HYPIC_BENCH_UTIL_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine/contract/hp_error.h"

/* Seconds on a clock: CLOCK_MONOTONIC for wall time,
 * CLOCK_PROCESS_CPUTIME_ID or CLOCK_THREAD_CPUTIME_ID for CPU time. */
static inline double bench_clock(clockid_t id)
{
    struct timespec t;
    clock_gettime(id, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static inline double bench_now(void)
{
    return bench_clock(CLOCK_MONOTONIC);
}

/* The seed the benches' streams start from unless told otherwise. */
#define BENCH_SEED 88172645463325252ull

/* Marsaglia's xorshift64 (13, 7, 17): fast, and the same numbers on every
 * machine, so a seed names one synthetic input. *s must not be 0. */
static inline uint64_t bench_xorshift(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

/* Uniform in [0, 1) from the top 53 bits of the next number. */
static inline double bench_unif(uint64_t *s)
{
    return (double)(bench_xorshift(s) >> 11) * 0x1.0p-53;
}

/* The integer at *s in a comma list ("1,4,16"); moves *s past it and its
 * comma, so `while (*s)` walks the list. */
static inline int bench_next_int(const char **s)
{
    int v = atoi(*s);
    *s += strcspn(*s, ",");
    *s += **s == ',';
    return v;
}

/* The first index whose cumulative weight is >= u: drawing from the
 * distribution by inversion (cdf ascending, ending at 1, n >= 1). */
static inline int bench_cdf_pick(const double *cdf, int n, double u)
{
    int lo = 0, hi = n - 1;
    while (lo < hi) {
        int mid = (lo + hi) / 2;
        if (cdf[mid] < u)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

/* Prints an engine error; returns the exit status for a failed run. */
static inline int bench_fail(const hp_error_t *err)
{
    fprintf(stderr, "%s\n", err->msg);
    return 1;
}

/* A scheduler text callback that drops the text: the benches count
 * tokens (the final record), not characters. */
static inline size_t bench_drop_text(void *ud, int choice, const char *text,
                                     size_t len)
{
    (void)choice;
    (void)ud;
    (void)text;
    return len;
}

#endif
