/*
 * hk_kvbuf_geom.h - the KVBuffer's shapes as every backend sees them:
 * the heads and block size of a pool, and one request's buffer (its
 * state, block list and length). Plain data; the block layout is
 * kernels/cpu/hk_kvbuf.h's.
 */
#ifndef HK_KVBUF_GEOM_H
#define HK_KVBUF_GEOM_H

#include <stddef.h>

#include "kernels/common/hk_math.h" /* HK_HOSTDEV */

typedef struct {
    int Hk, Hv; /* key heads, value heads (Hv a multiple of Hk) */
    int dk, dv; /* key and value head dims */
    int bs;     /* tokens per block */
} hk_kvbuf_geom_t;

/* One request as a kernel sees it. */
typedef struct {
    float *S;          /* [Hv, dk, dv] state at the last flush; NULL = 0 */
    const int *blocks; /* block ids in entry order, enough for the call */
    int len;           /* entries buffered before the call */
} hk_kvbuf_view_t;

/* The block layout (kernels/cpu/hk_kvbuf.h) in floats, for every
 * backend: K [Hk][dk][bs] at 0, W [Hv][bs][dv] at hk_kvbuf_off_w, G
 * [Hv][bs] doubles at hk_kvbuf_off_G, each on a 64-byte boundary. */
static inline HK_HOSTDEV size_t hk_kvbuf_round16(size_t n)
{
    return (n + 15) & ~(size_t)15;
}

static inline HK_HOSTDEV size_t hk_kvbuf_off_w(const hk_kvbuf_geom_t *g)
{
    return hk_kvbuf_round16((size_t)g->Hk * g->dk * g->bs);
}

static inline HK_HOSTDEV size_t hk_kvbuf_off_G(const hk_kvbuf_geom_t *g)
{
    return hk_kvbuf_round16(hk_kvbuf_off_w(g) + (size_t)g->Hv * g->bs * g->dv);
}

/* Floats one block takes (a multiple of 16). */
static inline HK_HOSTDEV size_t hk_kvbuf_layout_floats(const hk_kvbuf_geom_t *g)
{
    return hk_kvbuf_round16(hk_kvbuf_off_G(g) + 2 * (size_t)g->Hv * g->bs);
}

#endif
