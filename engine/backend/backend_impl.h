/*
 * backend_impl.h - what a backend implements (ggml's ggml_backend_i):
 * one table of function pointers per backend kind, and the backend
 * object. Private to engine/backend/. Every op and memory entry gets the
 * backend first; entries marked (optional) may be NULL: the op is then
 * unsupported (hp_backend_supports_op says 0, a call records HP_EINTERNAL
 * through fail).
 */
#ifndef HP_BACKEND_IMPL_H
#define HP_BACKEND_IMPL_H

#include "engine/backend/backend.h"

typedef const hp_backend_t *be_t;

typedef struct {
    /* lifecycle and queries */
    void (*close)(be_t b);                                /* (optional) */
    int (*supports_dtype)(be_t b, hp_op_t op, int dtype); /* (optional) */
    int (*sync)(be_t b, hp_error_t *err);                 /* (optional) */
    void (*fail)(be_t b, hp_op_t op); /* (optional) records an unsupported
                                         call for sync */

    /* memory */
    void *(*alloc)(be_t b, size_t bytes);
    void *(*alloc0)(be_t b, size_t bytes); /* (optional) NULL: alloc and
                                              memset0 */
    void *(*realloc)(be_t b, void *p, size_t old_bytes, size_t new_bytes);
    void (*free)(be_t b, void *p);
    void (*memset0)(be_t b, void *p, size_t bytes);
    void (*upload)(be_t b, void *dst, const void *src, size_t bytes);
    void (*download)(be_t b, void *dst, const void *src, size_t bytes);
    void (*copy)(be_t b, void *dst, const void *src, size_t bytes);
    int (*place)(be_t b, const void **p, size_t bytes,
                 hp_error_t *err);          /* (optional) NULL: host memory */
    void (*unplace)(be_t b, const void *p); /* (optional) */
    int (*reserve)(be_t b, const hp_backend_plan_t *plan,
                   hp_error_t *err);              /* (optional) */
    unsigned long (*device_allocs)(be_t b);       /* (optional) */
    unsigned long (*device_waits)(be_t b);        /* (optional) */
    unsigned long long (*device_wait_ns)(be_t b); /* (optional) */
    unsigned long long (*host_bytes)(be_t b);     /* (optional) */
    unsigned long (*host_copies)(be_t b);         /* (optional) */
    size_t (*mem_total)(be_t b);                  /* (optional) */
    size_t (*mem_free)(be_t b);                   /* (optional) */
    int (*lost)(be_t b, hp_error_t *err);         /* (optional) */
    void (*lock)(be_t b);                         /* (optional) */
    void (*unlock)(be_t b);                       /* (optional) */
    /* the op profile (hp_backend_profile_start, _stop; both or neither) */
    int (*profile_start)(be_t b, hp_error_t *err);
    int (*profile_stop)(be_t b, hp_backend_prof_row_t *rows, int cap, int *n,
                        hp_error_t *err);
    /* what the kernel tuners chose (hp_backend_tuned), into buf (cap
     * bytes), snprintf's way: the length the whole needs (optional) */
    size_t (*tuned)(be_t b, char *buf, size_t cap);

    /* ops (all optional) */
    void (*linear)(be_t b, float *y, const float *x, const hk_weight_t *w,
                   int n, int acc);
    /* (optional: else linear k times) */
    void (*linear_n)(be_t b, float *const *y, const float *x,
                     const hk_weight_t *const *w, int k, int n);
    /* (optional, each: else the two ops it is made of, backend.h) */
    void (*rmsnorm_linear_n)(be_t b, float *const *ys, float *y, const float *x,
                             const float *nw, const hk_weight_t *const *w,
                             int k, int T, float eps);
    void (*rmsnorm_gated_linear_acc)(be_t b, float *x, float *o, const float *z,
                                     const float *gw, int rows, int dim,
                                     float eps, const hk_weight_t *w, int T);
    void (*gate_mul_linear_acc)(be_t b, float *x, float *o, const float *gate,
                                const hk_weight_t *w, int T);
    void (*swiglu_linear_acc)(be_t b, float *x, float *g, const float *u,
                              const hk_weight_t *w, int T);
    /* (optional: else the ops hp_backend_mlp_acc names) the dense MLP on
     * bf16 hidden rows, asked for only where prec is bf16 and the three
     * matrices are */
    void (*mlp_acc_bf16)(be_t b, float *x, const float *y, float *g, float *u,
                         const float *nw, const hk_weight_t *gw,
                         const hk_weight_t *uw, const hk_weight_t *dw, int T,
                         float eps);
    void (*embed)(be_t b, float *x, const hk_weight_t *w, const int *ids,
                  int T);
    void (*rmsnorm)(be_t b, float *y, const float *x, const float *w, int rows,
                    int dim, float eps);
    void (*rmsnorm_gated)(be_t b, float *y, const float *x, const float *z,
                          const float *w, int rows, int dim, float eps);
    void (*l2norm)(be_t b, float *x, int rows, int dim, float eps, float scale);
    void (*swiglu)(be_t b, float *y, const float *g, const float *u, size_t n);
    void (*split_heads)(be_t be, float *a, float *b, float *c, const float *x,
                        int rows, int da, int db, int dc);
    void (*gate_mul)(be_t b, float *o, const float *gate, size_t n);
    void (*scale_rows)(be_t b, float *x, const float *s, int rows, int dim,
                       int sigm);
    void (*axpy)(be_t b, float *y, float a, const float *x, size_t n);
    void (*kv_store)(be_t b, float *kc, float *vc, const float *k,
                     const float *v, const int *pos, int T, int kvd);
    void (*kv_store_decode)(be_t b, float *const *kcs, float *const *vcs,
                            const float *k, const float *v, const int *pos,
                            int B, int kvd);
    void (*argmax)(be_t b, int *idx, const float *logits, int B, int V, int ld);
    void (*topk)(be_t b, float *p, int *idx, float *raw, double *lse,
                 const float *logits, int B, int V, int ld, int k,
                 double inv_t);
    void (*conv1d_silu)(be_t b, float *y, float *state, const float *x,
                        const float *w, int T, int C, int K);
    void (*conv1d_silu_decode)(be_t b, float *y, float *const *states,
                               const float *x, const float *w, int B, int C,
                               int K);
    /* (optional: else the four ops, backend.h) */
    void (*conv_qkv)(be_t b, float *q, float *k, float *v, float *cv,
                     float *state, const float *x, const float *w, float *g,
                     float *beta, const float *A_log, const float *dt_bias,
                     int T, int Hk, int Hv, int dk, int dv, int K, float eps,
                     float q_scale);
    /* (optional: else conv1d_silu_decode and the four after it) */
    void (*conv_qkv_decode)(be_t b, float *q, float *k, float *v, float *cv,
                            float *const *states, const float *x,
                            const float *w, float *g, float *beta,
                            const float *A_log, const float *dt_bias, int B,
                            int Hk, int Hv, int dk, int dv, int K, float eps,
                            float q_scale);
    void (*gdn_gates)(be_t b, float *g, float *beta, const float *a,
                      const float *bp, const float *A_log, const float *dt_bias,
                      int T, int Hv);
    void (*gdn_recurrent)(be_t b, float *o, float *S, const float *q,
                          const float *k, const float *v, const float *g,
                          const float *beta, int T, int Hk, int Hv, int dk,
                          int dv);
    void (*gdn_decode)(be_t b, float *o, float *const *states, const float *q,
                       const float *k, const float *v, const float *g,
                       const float *beta, int B, int Hk, int Hv, int dk,
                       int dv);
    void (*gdn_chunk)(be_t b, float *o, float *S, float *Tc, const float *q,
                      const float *k, const float *v, const float *g,
                      const float *beta, int T, int Hk, int Hv, int dk, int dv,
                      int C, float *scratch, hp_prec_t prec);
    size_t (*gdn_chunk_scratch)(be_t b, int T, int Hv, int dk, int dv, int C);
    void (*gdn_step)(be_t b, float *o, float *const *states,
                     float *const *conv_states, const float *qkv,
                     const float *a, const float *bp, const float *conv_w,
                     const float *A_log, const float *dt_bias, int B, int Hk,
                     int Hv, int dk, int dv, int K, float eps, float q_scale,
                     float *scratch);
    size_t (*gdn_step_scratch)(be_t b, int B, int Hk, int Hv, int dk, int dv);
    void (*rope)(be_t b, float *x, const int *pos, int T, int nh, int hd,
                 int rot, double theta);
    void (*rope_shift)(be_t b, float *x, int delta, int T, int nh, int hd,
                       int rot, double theta);
    /* (optional: else split_heads, rmsnorm twice, rope twice) */
    void (*qk_norm_rope)(be_t b, float *q, float *gate, float *k,
                         const float *P, const float *qw, const float *kw,
                         const int *pos, int T, int Hq, int Hkv, int hd,
                         int rot, double theta, float eps);
    void (*attention)(be_t b, float *o, const float *q, const int *qpos,
                      const float *k, const float *v, int T, int N, int Hq,
                      int Hkv, int hd, float scale, hp_prec_t prec,
                      float *scratch);
    size_t (*attention_scratch)(be_t b, int T, int N, int Hq, int Hkv, int hd,
                                hp_prec_t prec);
    void (*attention_decode)(be_t b, float *o, const float *q,
                             const float *const *kcs, const float *const *vcs,
                             const int *n_ctx, int B, int Hq, int Hkv, int hd,
                             float scale, float *scratch);
    void (*moe_route)(be_t b, int *idx, float *w, const float *logits, int T,
                      int E, int k, int renorm);
    void (*moe_plan)(be_t b, int *offs, int *rows, float *scale, int *slot,
                     const int *idx, const float *w, int T, int k, int E);
    void (*moe_gather)(be_t b, float *xg, const float *y, const int *rows,
                       int n, int H);
    void (*moe_scatter)(be_t b, float *x, const float *eo, const int *rows,
                        int n, int H);
    void (*moe_combine)(be_t b, float *x, const float *eo, const int *slot,
                        int T, int k, int H);
    void (*trans_identity)(be_t b, float *T, int H, int dk);
    void (*trans_compose)(be_t b, float *out, hk_trans_family_t fam,
                          const float *T, const float *S, const float *S0,
                          int H, int dk, int dv, float *scratch);
    void (*trans_chain)(be_t b, float *T1, float *S1, hk_trans_family_t fam,
                        const float *T2, const float *S2, int H, int dk, int dv,
                        float *scratch);
    size_t (*kvbuf_block_floats)(be_t b, const hk_kvbuf_geom_t *g);
    size_t (*kvbuf_scratch)(be_t b, const hk_kvbuf_geom_t *g, int T, int lmax,
                            int nth);
    void (*kvbuf_step)(be_t b, float *o, float *arena,
                       const hk_kvbuf_view_t *vw, const float *q,
                       const float *k, const float *v, const float *g,
                       const float *beta, int R, int T,
                       const hk_kvbuf_geom_t *geom, int lmax, float *scratch,
                       int nth);
    void (*kvbuf_flush)(be_t b, float *arena, const hk_kvbuf_view_t *vw,
                        const int *n, int R, const hk_kvbuf_geom_t *geom,
                        float *scratch, int nth);
    void (*kvbuf_conv_commit)(be_t b, float *state, const float *x, int m,
                              int C, int K);
} hp_backend_i;

struct hp_backend {
    const hp_backend_i *iface;
    void *ctx; /* the kind's own state (device, stream, first error) */
    char name[32];
    int host_memory; /* backend memory is host memory */
    char device[64]; /* the hardware's name ("": the host's CPU) */
};

/* The CPU table (backend_cpu.c). */
extern const hp_backend_i hp_backend_cpu_iface;

/* gdn_step as the backend's own conv1d_silu_decode, split_heads, l2norm,
 * gdn_gates and gdn_decode (backend.c): the CPU's gdn_step, and a device's
 * where its fused kernel cannot take the shape. Its scratch:
 * hp_backend_gdn_step_floats. */
void hp_backend_gdn_step_ops(be_t b, float *o, float *const *states,
                             float *const *conv_states, const float *qkv,
                             const float *a, const float *bp,
                             const float *conv_w, const float *A_log,
                             const float *dt_bias, int B, int Hk, int Hv,
                             int dk, int dv, int K, float eps, float q_scale,
                             float *scratch);
size_t hp_backend_gdn_step_floats(be_t b, int B, int Hk, int Hv, int dk,
                                  int dv);

/* Opens CUDA device `device` (backend_cuda.c). Weak: only the programs
 * built with the CUDA library link backend_cuda.c (Makefile), elsewhere
 * the address is NULL and "cuda" is refused. */
int hp_backend_cuda_open(const hp_backend_t **b, int device, hp_error_t *err)
    __attribute__((weak));

#endif
