/*
 * hk_trans.h - the transition families of a linear-recurrence layer
 * (reference: pic-kvbuffer-math.md), shared by every backend: per head
 * S_t = T_t S_{t-1} + u_t with T stored compressed by family.
 */
#ifndef HK_TRANS_H
#define HK_TRANS_H

typedef enum {
    HK_TRANS_SCALAR = 0, /* t[1] */
    HK_TRANS_DIAG = 1,   /* t[dk] */
    HK_TRANS_DENSE = 2   /* t[dk, dk] */
} hk_trans_family_t;

#endif
