/*
 * backend_cpu.c - the CPU backend: the table of backend_impl.h over
 * kernels/cpu (hk_cpu.h, hk_kvbuf.h). Backend memory is host memory, so
 * transfers are memcpy and placing weights leaves them where the loader
 * put them (mmapped or converted). Stateless: one shared instance.
 */
#include <stdlib.h>
#include <string.h>

#include "engine/backend/backend_impl.h"
#include "kernels/cpu/hk_cpu.h"
#include "kernels/cpu/hk_kvbuf.h"

/* ---- memory ------------------------------------------------------------- */

static void *cpu_alloc(be_t b, size_t bytes)
{
    (void)b;
    return aligned_alloc(64, ((bytes ? bytes : 1) + 63) & ~(size_t)63);
}

static void *cpu_alloc0(be_t b, size_t bytes)
{
    (void)b;
    return calloc(1, bytes ? bytes : 1);
}

static void *cpu_realloc(be_t b, void *p, size_t old_bytes, size_t new_bytes)
{
    (void)b;
    (void)old_bytes;
    return realloc(p, new_bytes);
}

static void cpu_free(be_t b, void *p)
{
    (void)b;
    free(p);
}

static void cpu_memset0(be_t b, void *p, size_t bytes)
{
    (void)b;
    memset(p, 0, bytes);
}

/* One copy for the three directions: all host memory. */
static void cpu_copy(be_t b, void *dst, const void *src, size_t bytes)
{
    (void)b;
    if (dst != src)
        memmove(dst, src, bytes);
}

/* ---- ops: kernels/cpu with the backend argument dropped ----------------- */

static void cpu_linear(be_t b, float *y, const float *x, const hk_weight_t *w,
                       int n, int acc)
{
    (void)b;
    if (acc)
        hk_linear_acc(y, x, w, n);
    else
        hk_linear(y, x, w, n);
}

static void cpu_embed(be_t b, float *x, const hk_weight_t *w, const int *ids,
                      int T)
{
    (void)b;
    hk_weight_rows(x, w, ids, T);
}

static void cpu_rmsnorm(be_t b, float *y, const float *x, const float *w,
                        int rows, int dim, float eps)
{
    (void)b;
    hk_rmsnorm_zc(y, x, w, rows, dim, eps);
}

static void cpu_rmsnorm_gated(be_t b, float *y, const float *x, const float *z,
                              const float *w, int rows, int dim, float eps)
{
    (void)b;
    hk_rmsnorm_gated(y, x, z, w, rows, dim, eps);
}

static void cpu_l2norm(be_t b, float *x, int rows, int dim, float eps,
                       float scale)
{
    (void)b;
    hk_l2norm(x, rows, dim, eps, scale);
}

static void cpu_swiglu(be_t b, float *y, const float *g, const float *u,
                       size_t n)
{
    (void)b;
    hk_swiglu(y, g, u, n);
}

static void cpu_split_heads(be_t be, float *a, float *b, float *c,
                            const float *x, int rows, int da, int db, int dc)
{
    (void)be;
    hk_split_heads(a, b, c, x, rows, da, db, dc);
}

static void cpu_gate_mul(be_t b, float *o, const float *gate, size_t n)
{
    (void)b;
    hk_gate_mul(o, gate, n);
}

static void cpu_scale_rows(be_t b, float *x, const float *s, int rows, int dim,
                           int sigm)
{
    (void)b;
    hk_scale_rows(x, s, rows, dim, sigm);
}

static void cpu_axpy(be_t b, float *y, float a, const float *x, size_t n)
{
    (void)b;
    hk_axpy(y, a, x, n);
}

static void cpu_kv_store(be_t b, float *kc, float *vc, const float *k,
                         const float *v, const int *pos, int T, int kvd)
{
    (void)b;
    hk_kv_store(kc, vc, k, v, pos, T, kvd);
}

static void cpu_kv_store_decode(be_t b, float *const *kcs, float *const *vcs,
                                const float *k, const float *v, const int *pos,
                                int B, int kvd)
{
    (void)b;
    for (int r = 0; r < B; r++)
        hk_kv_store(kcs[r], vcs[r], k + (size_t)r * kvd, v + (size_t)r * kvd,
                    pos + r, 1, kvd);
}

static void cpu_argmax(be_t b, int *idx, const float *logits, int B, int V,
                       int ld)
{
    (void)b;
    for (int r = 0; r < B; r++)
        idx[r] = hk_argmax(logits + (size_t)r * ld, V);
}

static void cpu_topk(be_t b, float *p, int *idx, float *raw, double *lse,
                     const float *logits, int B, int V, int ld, int k,
                     double inv_t)
{
    (void)b;
    for (int r = 0; r < B; r++)
        hk_topk(p + (size_t)r * k, idx + (size_t)r * k,
                raw ? raw + (size_t)r * k : NULL, lse ? lse + r : NULL,
                logits + (size_t)r * ld, V, k, inv_t);
}

static void cpu_conv1d_silu(be_t b, float *y, float *state, const float *x,
                            const float *w, int T, int C, int K)
{
    (void)b;
    hk_conv1d_silu(y, state, x, w, T, C, K);
}

static void cpu_conv1d_silu_decode(be_t b, float *y, float *const *states,
                                   const float *x, const float *w, int B, int C,
                                   int K)
{
    (void)b;
    for (int r = 0; r < B; r++)
        hk_conv1d_silu(y + (size_t)r * C, states[r], x + (size_t)r * C, w, 1, C,
                       K);
}

static void cpu_gdn_gates(be_t b, float *g, float *beta, const float *a,
                          const float *bp, const float *A_log,
                          const float *dt_bias, int T, int Hv)
{
    (void)b;
    hk_gdn_gates(g, beta, a, bp, A_log, dt_bias, T, Hv);
}

static void cpu_gdn_recurrent(be_t b, float *o, float *S, const float *q,
                              const float *k, const float *v, const float *g,
                              const float *beta, int T, int Hk, int Hv, int dk,
                              int dv)
{
    (void)b;
    hk_gdn_recurrent(o, S, q, k, v, g, beta, T, Hk, Hv, dk, dv);
}

static void cpu_gdn_decode(be_t b, float *o, float *const *states,
                           const float *q, const float *k, const float *v,
                           const float *g, const float *beta, int B, int Hk,
                           int Hv, int dk, int dv)
{
    (void)b;
    size_t kd = (size_t)Hk * dk, vd = (size_t)Hv * dv;
    for (int r = 0; r < B; r++)
        hk_gdn_recurrent(o + r * vd, states[r], q + r * kd, k + r * kd,
                         v + r * vd, g + (size_t)r * Hv, beta + (size_t)r * Hv,
                         1, Hk, Hv, dk, dv);
}

static void cpu_gdn_chunk(be_t b, float *o, float *S, float *Tc, const float *q,
                          const float *k, const float *v, const float *g,
                          const float *beta, int T, int Hk, int Hv, int dk,
                          int dv, int C, float *scratch, hp_prec_t prec)
{
    (void)b;
    (void)prec; /* f32 either way, as the attention */
    hk_gdn_chunk(o, S, Tc, q, k, v, g, beta, T, Hk, Hv, dk, dv, C, scratch);
}

static size_t cpu_gdn_chunk_scratch(be_t b, int T, int Hv, int dk, int dv,
                                    int C)
{
    (void)b;
    (void)T; /* one slot per head, whatever T */
    return hk_gdn_chunk_scratch(Hv, dk, dv, C);
}

static void cpu_rope(be_t b, float *x, const int *pos, int T, int nh, int hd,
                     int rot, double theta)
{
    (void)b;
    hk_rope(x, pos, T, nh, hd, rot, theta);
}

static void cpu_rope_shift(be_t b, float *x, int delta, int T, int nh, int hd,
                           int rot, double theta)
{
    (void)b;
    hk_rope_shift(x, delta, T, nh, hd, rot, theta);
}

static void cpu_attention(be_t b, float *o, const float *q, const int *qpos,
                          const float *k, const float *v, int T, int N, int Hq,
                          int Hkv, int hd, float scale, hp_prec_t prec,
                          float *scratch)
{
    (void)b;
    (void)prec; /* f32 either way: rounding would buy the CPU nothing */
    hk_attention(o, q, qpos, k, v, T, N, Hq, Hkv, hd, scale, scratch);
}

static size_t cpu_attention_scratch(be_t b, int T, int N, int Hq, int Hkv,
                                    int hd, hp_prec_t prec)
{
    (void)b;
    (void)Hkv;
    (void)hd;
    (void)prec;
    return hk_attention_scratch(T, N, Hq);
}

static void cpu_attention_decode(be_t b, float *o, const float *q,
                                 const float *const *kcs,
                                 const float *const *vcs, const int *n_ctx,
                                 int B, int Hq, int Hkv, int hd, float scale,
                                 float *scratch)
{
    (void)b;
    size_t qd = (size_t)Hq * hd;
    for (int r = 0; r < B; r++) {
        int qpos = n_ctx[r] - 1;
        hk_attention(o + r * qd, q + r * qd, &qpos, kcs[r], vcs[r], 1, n_ctx[r],
                     Hq, Hkv, hd, scale, scratch);
    }
}

static void cpu_moe_route(be_t b, int *idx, float *w, const float *logits,
                          int T, int E, int k, int renorm)
{
    (void)b;
    for (int t = 0; t < T; t++)
        hk_moe_route(idx + (size_t)t * k, w + (size_t)t * k,
                     logits + (size_t)t * E, E, k, renorm);
}

static void cpu_moe_plan(be_t b, int *offs, int *rows, float *scale, int *slot,
                         const int *idx, const float *w, int T, int k, int E)
{
    (void)b;
    hk_moe_plan(offs, rows, scale, slot, idx, w, T, k, E);
}

static void cpu_moe_gather(be_t b, float *xg, const float *y, const int *rows,
                           int n, int H)
{
    (void)b;
    hk_moe_gather(xg, y, rows, n, H);
}

static void cpu_moe_scatter(be_t b, float *x, const float *eo, const int *rows,
                            int n, int H)
{
    (void)b;
    hk_moe_scatter(x, eo, rows, n, H);
}

static void cpu_moe_combine(be_t b, float *x, const float *eo, const int *slot,
                            int T, int k, int H)
{
    (void)b;
    hk_moe_combine(x, eo, slot, T, k, H);
}

static void cpu_trans_identity(be_t b, float *T, int H, int dk)
{
    (void)b;
    memset(T, 0, (size_t)H * dk * dk * sizeof(float));
    for (int h = 0; h < H; h++)
        for (int i = 0; i < dk; i++)
            T[((size_t)h * dk + i) * dk + i] = 1.0f;
}

static void cpu_trans_compose(be_t b, float *out, hk_trans_family_t fam,
                              const float *T, const float *S, const float *S0,
                              int H, int dk, int dv, float *scratch)
{
    (void)b;
    hk_trans_compose(out, fam, T, S, S0, H, dk, dv, scratch);
}

static void cpu_trans_chain(be_t b, float *T1, float *S1, hk_trans_family_t fam,
                            const float *T2, const float *S2, int H, int dk,
                            int dv, float *scratch)
{
    (void)b;
    hk_trans_chain(T1, S1, fam, T2, S2, H, dk, dv, scratch);
}

static size_t cpu_kvbuf_block_floats(be_t b, const hk_kvbuf_geom_t *g)
{
    (void)b;
    return hk_kvbuf_block_floats(g);
}

static size_t cpu_kvbuf_scratch(be_t b, const hk_kvbuf_geom_t *g, int T,
                                int lmax, int nth)
{
    (void)b;
    size_t s = hk_kvbuf_step_scratch(g, T, lmax, nth);
    size_t f = hk_kvbuf_flush_scratch(g, lmax, nth);
    return s > f ? s : f;
}

static void cpu_kvbuf_step(be_t b, float *o, float *arena,
                           const hk_kvbuf_view_t *vw, const float *q,
                           const float *k, const float *v, const float *g,
                           const float *beta, int R, int T,
                           const hk_kvbuf_geom_t *geom, int lmax,
                           float *scratch, int nth)
{
    (void)b;
    hk_kvbuf_step(o, arena, vw, q, k, v, g, beta, R, T, geom, lmax, scratch,
                  nth);
}

static void cpu_kvbuf_flush(be_t b, float *arena, const hk_kvbuf_view_t *vw,
                            const int *n, int R, const hk_kvbuf_geom_t *geom,
                            float *scratch, int nth)
{
    (void)b;
    hk_kvbuf_flush(arena, vw, n, R, geom, scratch, nth);
}

static void cpu_kvbuf_conv_commit(be_t b, float *state, const float *x, int m,
                                  int C, int K)
{
    (void)b;
    hk_kvbuf_conv_commit(state, x, m, C, K);
}

const hp_backend_i hp_backend_cpu_iface = {
    .alloc = cpu_alloc,
    .alloc0 = cpu_alloc0,
    .realloc = cpu_realloc,
    .free = cpu_free,
    .memset0 = cpu_memset0,
    .upload = cpu_copy,
    .download = cpu_copy,
    .copy = cpu_copy,
    .linear = cpu_linear,
    .embed = cpu_embed,
    .rmsnorm = cpu_rmsnorm,
    .rmsnorm_gated = cpu_rmsnorm_gated,
    .l2norm = cpu_l2norm,
    .swiglu = cpu_swiglu,
    .split_heads = cpu_split_heads,
    .gate_mul = cpu_gate_mul,
    .scale_rows = cpu_scale_rows,
    .axpy = cpu_axpy,
    .kv_store = cpu_kv_store,
    .kv_store_decode = cpu_kv_store_decode,
    .argmax = cpu_argmax,
    .topk = cpu_topk,
    .conv1d_silu = cpu_conv1d_silu,
    .conv1d_silu_decode = cpu_conv1d_silu_decode,
    .gdn_gates = cpu_gdn_gates,
    .gdn_recurrent = cpu_gdn_recurrent,
    .gdn_decode = cpu_gdn_decode,
    .gdn_chunk = cpu_gdn_chunk,
    .gdn_chunk_scratch = cpu_gdn_chunk_scratch,
    .gdn_step = hp_backend_gdn_step_ops, /* the unfused ops in turn */
    .gdn_step_scratch = hp_backend_gdn_step_floats,
    .rope = cpu_rope,
    .rope_shift = cpu_rope_shift,
    .attention = cpu_attention,
    .attention_scratch = cpu_attention_scratch,
    .attention_decode = cpu_attention_decode,
    .moe_route = cpu_moe_route,
    .moe_plan = cpu_moe_plan,
    .moe_gather = cpu_moe_gather,
    .moe_scatter = cpu_moe_scatter,
    .moe_combine = cpu_moe_combine,
    .trans_identity = cpu_trans_identity,
    .trans_compose = cpu_trans_compose,
    .trans_chain = cpu_trans_chain,
    .kvbuf_block_floats = cpu_kvbuf_block_floats,
    .kvbuf_scratch = cpu_kvbuf_scratch,
    .kvbuf_step = cpu_kvbuf_step,
    .kvbuf_flush = cpu_kvbuf_flush,
    .kvbuf_conv_commit = cpu_kvbuf_conv_commit,
};
