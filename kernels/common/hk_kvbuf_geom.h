/*
 * hk_kvbuf_geom.h - the KVBuffer's shapes as every backend sees them:
 * the heads and block size of a pool, and one request's buffer (its
 * state, block list and length). Plain data; the block layout is
 * kernels/cpu/hk_kvbuf.h's.
 */
#ifndef HK_KVBUF_GEOM_H
#define HK_KVBUF_GEOM_H

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

#endif
