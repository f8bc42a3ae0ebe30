/*
 * testrand.h - the random inputs of the C tests: a splitmix64 stream (so
 * every run sees the same data) and arrays of uniform floats. A test that
 * wants its own stream sets TEST_RNG_SEED before including this file.
 */
#ifndef HYPIC_TESTRAND_H
#define HYPIC_TESTRAND_H

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

#endif
