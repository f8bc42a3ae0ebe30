/*
 * hk_elementwise.c - the small data-movement and elementwise steps of the
 * forward pass, as named kernels so each has a CUDA twin
 * (kernels/cuda/hk_elementwise.cu): head splitting, the output gate, row
 * scaling, the K/V cache store and the token embedding.
 *
 * Each is one pass over memory, exactly the loop it replaces: copies are
 * copies, and the products are the same single float multiply (sigmoid
 * from hk_math.h), so the CUDA twins agree to the bit up to expf.
 */
#include <assert.h>
#include <string.h>

#include "kernels/cpu/hk_cpu.h"

void hk_split_heads(float *a,       // [rows, da]
                    float *b,       // [rows, db]
                    float *c,       // [rows, dc] or NULL (dc = 0)
                    const float *x, // [rows, da + db + dc]
                    int rows, int da, int db, int dc)
{
    assert(rows >= 0 && da >= 0 && db >= 0 && dc >= 0 && (c || dc == 0));
    const size_t ld = (size_t)da + db + dc;
    for (int r = 0; r < rows; r++) {
        const float *xr = x + (size_t)r * ld;
        memcpy(a + (size_t)r * da, xr, (size_t)da * sizeof(float));
        memcpy(b + (size_t)r * db, xr + da, (size_t)db * sizeof(float));
        if (dc)
            memcpy(c + (size_t)r * dc, xr + da + db,
                   (size_t)dc * sizeof(float));
    }
}

void hk_gate_mul(float *o,          // [n]
                 const float *gate, // [n]
                 size_t n)
{
    for (size_t i = 0; i < n; i++)
        o[i] *= hk_sigmoid(gate[i]);
}

void hk_axpy(float *y,                // [n]
             float a, const float *x, // [n]
             size_t n)
{
    for (size_t i = 0; i < n; i++)
        y[i] += a * x[i];
}

void hk_scale_rows(float *x,       // [rows, dim]
                   const float *s, // [rows]
                   int rows, int dim, int sigm)
{
    for (int r = 0; r < rows; r++) {
        const float f = sigm ? hk_sigmoid(s[r]) : s[r];
        float *xr = x + (size_t)r * dim;
        for (int i = 0; i < dim; i++)
            xr[i] *= f;
    }
}

void hk_kv_store(float *kc,      // [N, kvd]
                 float *vc,      // [N, kvd]
                 const float *k, // [T, kvd]
                 const float *v, // [T, kvd]
                 const int *pos, // [T]
                 int T, int kvd)
{
    const size_t row = (size_t)kvd * sizeof(float);
    for (int t = 0; t < T; t++) {
        assert(pos[t] >= 0);
        memcpy(kc + (size_t)pos[t] * kvd, k + (size_t)t * kvd, row);
        memcpy(vc + (size_t)pos[t] * kvd, v + (size_t)t * kvd, row);
    }
}

void hk_kv_store_paged(float *k_pages,   // [pages, P, kvd]
                       float *v_pages,   // [pages, P, kvd]
                       const float *k,   // [B, kvd]
                       const float *v,   // [B, kvd]
                       const int *table, // [B, max_pages]
                       int max_pages,
                       const int *pos, // [B]
                       int B, int P, int kvd)
{
    for (int b = 0; b < B; b++) {
        assert(pos[b] >= 0 && pos[b] / P < max_pages);
        const int page = table[(size_t)b * max_pages + pos[b] / P];
        const size_t at = ((size_t)page * P + (size_t)(pos[b] % P)) * kvd;
        memcpy(k_pages + at, k + (size_t)b * kvd, (size_t)kvd * sizeof(float));
        memcpy(v_pages + at, v + (size_t)b * kvd, (size_t)kvd * sizeof(float));
    }
}

void hk_embed(float *x,           // [T, H]
              const float *table, // [V, H]
              const int *ids,     // [T]
              int T, int H)
{
    for (int t = 0; t < T; t++) {
        assert(ids[t] >= 0);
        memcpy(x + (size_t)t * H, table + (size_t)ids[t] * H,
               (size_t)H * sizeof(float));
    }
}
