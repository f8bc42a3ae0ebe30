/*
 * hk_elementwise.cu - CUDA twins of hk_elementwise.c: head splitting, the
 * output gate, row scaling, the K/V cache store (one sequence, or one row
 * for each of B requests) and the token embedding (rows of an F32, BF16
 * or I8 matrix).
 *
 * All are grid-stride loops over output elements: copies are exact, the
 * products the same single multiply as on the CPU (sigmoid from
 * hk_math.h). The flat element index carries the row, so any number of
 * rows fits the grid.
 */
#include "kernels/cuda/hk_cuda_impl.h"

#define HK_EW_THREADS 256

static __global__ void hk_split_kernel(float *a, float *b, float *c, // outs
                                       const float *x, // [rows, ld]
                                       size_t n,       // rows * ld
                                       int da, int db, int ld)
{
    HK_GRID_STRIDE(e, n)
    {
        const size_t r = e / (size_t)ld;
        const int col = (int)(e % (size_t)ld);
        const float val = x[e];
        if (col < da)
            a[r * da + col] = val;
        else if (col < da + db)
            b[r * db + (col - da)] = val;
        else
            c[r * (ld - da - db) + (col - da - db)] = val;
    }
}

static __global__ void hk_gate_mul_kernel(float *o, const float *gate, size_t n)
{
    HK_GRID_STRIDE(i, n)
    o[i] *= hk_math_sigmoid(gate[i]);
}

/* The same product rounded to bf16 into ob (o kept). */
static __global__ void hk_gate_mul_bf16_kernel(uint16_t *ob, const float *o,
                                               const float *gate, size_t n)
{
    HK_GRID_STRIDE(i, n)
    ob[i] = hk_bf16_from_f32(o[i] * hk_math_sigmoid(gate[i]));
}

static __global__ void hk_axpy_kernel(float *y, float a, const float *x,
                                      size_t n)
{
    HK_GRID_STRIDE(i, n)
    y[i] += a * x[i];
}

static __global__ void hk_scale_rows_kernel(float *x,       // [rows, dim]
                                            const float *s, // [rows]
                                            size_t n, int dim, int sigm)
{
    HK_GRID_STRIDE(e, n)
    {
        const float sr = s[e / (size_t)dim];
        x[e] *= sigm ? hk_math_sigmoid(sr) : sr;
    }
}

/* Row b of k and v goes to position pos[b] of request b's K/V (kv:
 * hk_cuda_impl.h's one cache for all rows, own caches or pages). */
template <class KV>
static __global__ void hk_kv_store_kernel(KV kv,
                                          const float *k, // [B, kvd]
                                          const float *v, // [B, kvd]
                                          const int *pos, // [B]
                                          size_t n, int kvd)
{
    HK_GRID_STRIDE(e, n)
    {
        const int b = (int)(e / (size_t)kvd);
        const size_t d = e % (size_t)kvd;
        const size_t dst = kv.row(b, pos[b]) * kvd + d;
        kv.k(b)[dst] = k[e];
        kv.v(b)[dst] = v[e];
    }
}

/* Row ids[t] of a weight matrix as f32, the way hk_wtile widens it:
 * exact for F32 and BF16, q * scale for I8 (one scale per group of
 * columns). */
template <int DT>
static __global__ void hk_weight_rows_kernel(float *x,         // [T, H]
                                             const void *data, // [V, H]
                                             const float *scales, int group,
                                             const int *ids, // [T]
                                             size_t n, int H)
{
    HK_GRID_STRIDE(e, n)
    {
        const size_t t = e / (size_t)H, d = e % (size_t)H;
        const size_t at = (size_t)ids[t] * H + d;
        if (DT == HK_W_F32)
            x[e] = ((const float *)data)[at];
        else if (DT == HK_W_BF16)
            x[e] = hk_bf16_to_f32(((const uint16_t *)data)[at]);
        else
            x[e] = (float)((const int8_t *)data)[at] *
                   scales[(size_t)ids[t] * (H / group) + d / group];
    }
}

extern "C" int hk_cuda_split_heads(float *a, float *b, float *c, const float *x,
                                   int rows, int da, int db, int dc,
                                   void *stream)
{
    if (rows < 0 || da < 0 || db < 0 || dc < 0 || (!c && dc > 0) ||
        da + db + dc == 0)
        return HK_CUDA_EINVAL;
    const int ld = da + db + dc;
    const size_t n = (size_t)rows * ld;
    HK_LAUNCH_1D(hk_split_kernel, n, HK_EW_THREADS, stream, a, b, c, x, n, da,
                 db, ld);
}

extern "C" int hk_cuda_gate_mul(float *o, const float *gate, size_t n,
                                void *stream)
{
    HK_LAUNCH_1D(hk_gate_mul_kernel, n, HK_EW_THREADS, stream, o, gate, n);
}

extern "C" int hk_cuda_gate_mul_bf16(uint16_t *ob, const float *o,
                                     const float *gate, size_t n, void *stream)
{
    HK_LAUNCH_1D(hk_gate_mul_bf16_kernel, n, HK_EW_THREADS, stream, ob, o, gate,
                 n);
}

extern "C" int hk_cuda_axpy(float *y, float a, const float *x, size_t n,
                            void *stream)
{
    HK_LAUNCH_1D(hk_axpy_kernel, n, HK_EW_THREADS, stream, y, a, x, n);
}

extern "C" int hk_cuda_scale_rows(float *x, const float *s, int rows, int dim,
                                  int sigm, void *stream)
{
    if (rows < 0 || dim < 0)
        return HK_CUDA_EINVAL;
    const size_t n = (size_t)rows * dim;
    HK_LAUNCH_1D(hk_scale_rows_kernel, n, HK_EW_THREADS, stream, x, s, n, dim,
                 sigm);
}

extern "C" int hk_cuda_kv_store(float *kc, float *vc, const float *k,
                                const float *v, const int *pos, int T, int kvd,
                                void *stream)
{
    if (T < 0 || kvd < 0)
        return HK_CUDA_EINVAL;
    const size_t n = (size_t)T * kvd;
    const hk_kv_flat<float> kv = {kc, vc};
    HK_LAUNCH_1D(hk_kv_store_kernel, n, HK_EW_THREADS, stream, kv, k, v, pos, n,
                 kvd);
}

extern "C" int hk_cuda_kv_store_decode(float *const *kcs, float *const *vcs,
                                       const float *k, const float *v,
                                       const int *pos, int B, int kvd,
                                       void *stream)
{
    if (B < 0 || kvd < 0)
        return HK_CUDA_EINVAL;
    const size_t n = (size_t)B * kvd;
    const hk_kv_own<float> kv = {kcs, vcs};
    HK_LAUNCH_1D(hk_kv_store_kernel, n, HK_EW_THREADS, stream, kv, k, v, pos, n,
                 kvd);
}

extern "C" int hk_cuda_kv_store_paged(float *k_pages, float *v_pages,
                                      const float *k, const float *v,
                                      const int *table, int max_pages,
                                      const int *pos, int B, int P, int kvd,
                                      void *stream)
{
    const int shift = hk_page_shift(P);
    if (B < 0 || kvd < 0 || shift < 0 || (B > 0 && max_pages < 1))
        return HK_CUDA_EINVAL;
    const size_t n = (size_t)B * kvd;
    const hk_kv_paged<float> kv = {k_pages, v_pages, table, max_pages, shift};
    HK_LAUNCH_1D(hk_kv_store_kernel, n, HK_EW_THREADS, stream, kv, k, v, pos, n,
                 kvd);
}

extern "C" int hk_cuda_embed(float *x, const float *table, const int *ids,
                             int T, int H, void *stream)
{
    const hk_weight_t w = {table, NULL, HK_W_F32, 0, H, H};
    return hk_cuda_weight_rows(x, &w, ids, T, stream);
}

extern "C" int hk_cuda_weight_rows(float *x, const hk_weight_t *w,
                                   const int *ids, int T, void *stream)
{
    const int H = w->cols;
    if (T < 0 || H < 0 ||
        (w->dtype == HK_W_I8 && (w->group < 1 || H % w->group || !w->scales)) ||
        (w->dtype != HK_W_F32 && w->dtype != HK_W_BF16 && w->dtype != HK_W_I8))
        return HK_CUDA_EINVAL;
    const size_t n = (size_t)T * H;
    if (w->dtype == HK_W_F32)
        HK_LAUNCH_1D(hk_weight_rows_kernel<HK_W_F32>, n, HK_EW_THREADS, stream,
                     x, w->data, w->scales, w->group, ids, n, H);
    if (w->dtype == HK_W_BF16)
        HK_LAUNCH_1D(hk_weight_rows_kernel<HK_W_BF16>, n, HK_EW_THREADS, stream,
                     x, w->data, w->scales, w->group, ids, n, H);
    HK_LAUNCH_1D(hk_weight_rows_kernel<HK_W_I8>, n, HK_EW_THREADS, stream, x,
                 w->data, w->scales, w->group, ids, n, H);
}
