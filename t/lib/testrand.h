/*
 * testrand.h - the random inputs of the C tests: a splitmix64 stream (so
 * every run sees the same data) and arrays of uniform floats. A test that
 * wants its own stream sets TEST_RNG_SEED before including this file.
 */
#ifndef HYPIC_TESTRAND_H
#define HYPIC_TESTRAND_H

#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#ifndef TEST_RNG_SEED
#define TEST_RNG_SEED 0x9e3779b97f4a7c15ull
#endif

static uint64_t rng_state = TEST_RNG_SEED;

/* uniform in [-1, 1) */
static inline double urand(void)
{
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    return (double)(z >> 11) / 9007199254740992.0 * 2.0 - 1.0;
}

/* n floats uniform in [-amp, amp), malloc'd */
static inline float *frand_amp(size_t n, double amp)
{
    float *x = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++)
        x[i] = (float)(amp * urand());
    return x;
}

/* A stream of its own, for tests that draw several independent sequences
 * (the same splitmix64 as above, seeded by the caller). */
typedef struct {
    uint64_t s;
} test_rng_t;

/* uniform in [0, 1) */
static inline double test_rng_unif(test_rng_t *r)
{
    uint64_t z = (r->s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return (double)((z ^ (z >> 31)) >> 11) * 0x1.0p-53;
}

/* standard normal (Box-Muller) */
static inline double test_rng_normal(test_rng_t *r)
{
    double a = test_rng_unif(r), b = test_rng_unif(r);
    return sqrt(-2.0 * log(1.0 - a)) * cos(6.283185307179586 * b);
}

/* x = a random direction of length scale (n <= 512), as an L2-normalised key */
static inline void test_rng_unit(test_rng_t *r, float *x, int n, double scale)
{
    double t[512], ss = 0.0;
    for (int i = 0; i < n; i++) {
        t[i] = test_rng_normal(r);
        ss += t[i] * t[i];
    }
    for (int i = 0; i < n; i++)
        x[i] = (float)(t[i] / sqrt(ss + 1e-6) * scale);
}

#endif
