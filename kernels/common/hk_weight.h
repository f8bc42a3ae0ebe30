/*
 * hk_weight.h - a weight matrix as the checkpoint stores it, for every
 * backend: y = x W^T with W [rows, cols] (PyTorch nn.Linear [out, in]),
 * row-major, in one of three element types. Plain data (no pointers into
 * host-only structures), so a CUDA backend can hold the same handle with
 * device pointers.
 *
 *   F32   data float [rows, cols]
 *   BF16  data uint16 [rows, cols], bfloat16 bits (the f32's top half)
 *   I8    data int8 [rows, cols], symmetric: W[o, k] = data[o, k] *
 *         scales[o, k / group]; scales float [rows, cols / group], group
 *         divides cols (group == cols: one scale per output channel)
 */
#ifndef HK_WEIGHT_H
#define HK_WEIGHT_H

typedef enum { HK_W_F32 = 0, HK_W_BF16 = 1, HK_W_I8 = 2 } hk_wtype_t;

typedef struct {
    const void *data;    /* [rows, cols] of dtype */
    const float *scales; /* I8 only: [rows, cols / group] */
    int dtype;           /* hk_wtype_t */
    int rows;            /* out features */
    int cols;            /* in features */
    int group;           /* I8 only: columns per scale */
} hk_weight_t;

/* Bytes of one element of data. */
static inline int hk_wtype_size(int dtype)
{
    return dtype == HK_W_F32 ? 4 : dtype == HK_W_BF16 ? 2 : 1;
}

#endif
