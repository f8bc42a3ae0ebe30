/*
 * backend.c - the public face of a backend (backend.h): opening one by
 * name, support queries, and one wrapper per entry of its table
 * (backend_impl.h) that calls it, or records the call as unsupported.
 */
#include <stdlib.h>
#include <string.h>

#include "engine/backend/backend_impl.h"
#include "kernels/cpu/hk_cpu.h"

static const hp_backend_t cpu = {&hp_backend_cpu_iface, NULL, "cpu", 1, ""};

const hp_backend_t *hp_backend_cpu(void)
{
    return &cpu;
}

int hp_backend_open(const hp_backend_t **b, const char *name, hp_error_t *err)
{
    *b = NULL;
    if (!strcmp(name, "cpu")) {
        *b = &cpu;
        return HP_OK;
    }
    if (strncmp(name, "cuda", 4) || (name[4] && name[4] != ':'))
        return hp_error_set(err, HP_EBADINPUT,
                            "device \"%s\": expected cpu, cuda or cuda:N",
                            name);
    int dev = 0;
    if (name[4] == ':') {
        char *end;
        long n = strtol(name + 5, &end, 10);
        if (end == name + 5 || *end || n < 0 || n > 1023)
            return hp_error_set(err, HP_EBADINPUT,
                                "device \"%s\": N in cuda:N is a device "
                                "number",
                                name);
        dev = (int)n;
    }
    if (!hp_backend_cuda_open)
        return hp_error_set(err, HP_EUNAVAIL,
                            "device cuda:%d: this program was built without "
                            "CUDA (build on a machine with nvcc)",
                            dev);
    return hp_backend_cuda_open(b, dev, err);
}

void hp_backend_close(const hp_backend_t *b)
{
    if (b && b->iface->close)
        b->iface->close(b);
}

const char *hp_backend_name(const hp_backend_t *b)
{
    return b->name;
}

const char *hp_backend_device(const hp_backend_t *b)
{
    return b->device;
}

int hp_backend_host_memory(const hp_backend_t *b)
{
    return b->host_memory;
}

int hp_backend_sync(const hp_backend_t *b, hp_error_t *err)
{
    return b->iface->sync ? b->iface->sync(b, err) : HP_OK;
}

/* Whether the backend has the table entry behind op. */
static int entry(const hp_backend_i *i, hp_op_t op)
{
    switch (op) {
    case HP_OP_LINEAR:
    case HP_OP_LINEAR_ACC:
        return i->linear != NULL;
    case HP_OP_EMBED:
        return i->embed != NULL;
    case HP_OP_RMSNORM:
        return i->rmsnorm != NULL;
    case HP_OP_RMSNORM_GATED:
        return i->rmsnorm_gated != NULL;
    case HP_OP_L2NORM:
        return i->l2norm != NULL;
    case HP_OP_SWIGLU:
        return i->swiglu != NULL;
    case HP_OP_CONV1D_SILU:
        return i->conv1d_silu != NULL;
    case HP_OP_CONV1D_SILU_DECODE:
        return i->conv1d_silu_decode != NULL;
    case HP_OP_GDN_GATES:
        return i->gdn_gates != NULL;
    case HP_OP_GDN_RECURRENT:
        return i->gdn_recurrent != NULL;
    case HP_OP_GDN_DECODE:
        return i->gdn_decode != NULL;
    case HP_OP_GDN_CHUNK:
        return i->gdn_chunk != NULL;
    case HP_OP_GDN_STEP:
        return i->gdn_step != NULL;
    case HP_OP_ROPE:
        return i->rope != NULL;
    case HP_OP_ROPE_SHIFT:
        return i->rope_shift != NULL;
    case HP_OP_ATTENTION:
        return i->attention != NULL;
    case HP_OP_ATTENTION_DECODE:
        return i->attention_decode != NULL;
    case HP_OP_MOE_ROUTE:
        return i->moe_route != NULL;
    case HP_OP_MOE_PLAN:
        return i->moe_plan != NULL;
    case HP_OP_MOE_GATHER:
        return i->moe_gather != NULL;
    case HP_OP_MOE_SCATTER:
        return i->moe_scatter != NULL;
    case HP_OP_MOE_COMBINE:
        return i->moe_combine != NULL;
    case HP_OP_SPLIT_HEADS:
        return i->split_heads != NULL;
    case HP_OP_GATE_MUL:
        return i->gate_mul != NULL;
    case HP_OP_SCALE_ROWS:
        return i->scale_rows != NULL;
    case HP_OP_AXPY:
        return i->axpy != NULL;
    case HP_OP_KV_STORE:
        return i->kv_store != NULL;
    case HP_OP_KV_STORE_DECODE:
        return i->kv_store_decode != NULL;
    case HP_OP_ARGMAX:
        return i->argmax != NULL;
    case HP_OP_TOPK:
        return i->topk != NULL;
    case HP_OP_TRANS_IDENTITY:
        return i->trans_identity != NULL;
    case HP_OP_TRANS_COMPOSE:
        return i->trans_compose != NULL;
    case HP_OP_TRANS_CHAIN:
        return i->trans_chain != NULL;
    case HP_OP_KVBUF_STEP:
        return i->kvbuf_step != NULL;
    case HP_OP_KVBUF_FLUSH:
        return i->kvbuf_flush != NULL;
    case HP_OP_KVBUF_CONV_COMMIT:
        return i->kvbuf_conv_commit != NULL;
    case HP_OP_COUNT:
        break;
    }
    return 0;
}

int hp_backend_supports_op(const hp_backend_t *b, hp_op_t op, int dtype)
{
    if (!entry(b->iface, op))
        return 0;
    return b->iface->supports_dtype ? b->iface->supports_dtype(b, op, dtype)
                                    : 1;
}

/* An op the backend lacks: recorded for hp_backend_sync. */
static void unsupported(const hp_backend_t *b, hp_op_t op)
{
    if (b->iface->fail)
        b->iface->fail(b, op);
}

/* Ops issued and host-link transfers so far, every backend of this
 * process (atomic: prefill workers issue ops too). */
static unsigned long n_ops, n_transfers;
static unsigned long long n_down_bytes;

static void count(unsigned long ops, unsigned long transfers)
{
    __atomic_add_fetch(&n_ops, ops, __ATOMIC_RELAXED);
    __atomic_add_fetch(&n_transfers, transfers, __ATOMIC_RELAXED);
}

unsigned long hp_backend_op_count(const hp_backend_t *b)
{
    (void)b;
    return __atomic_load_n(&n_ops, __ATOMIC_RELAXED);
}

unsigned long long hp_backend_download_bytes(const hp_backend_t *b)
{
    (void)b;
    return __atomic_load_n(&n_down_bytes, __ATOMIC_RELAXED);
}

unsigned long hp_backend_transfer_count(const hp_backend_t *b)
{
    (void)b;
    return __atomic_load_n(&n_transfers, __ATOMIC_RELAXED);
}

/* The host arrays an op's signature takes (backend.h: ids, positions,
 * pointer lists, argmax's, topk's and moe_plan's outputs): each one a copy over
 * the host link on a device backend. */
static unsigned long host_arrays(hp_op_t op)
{
    switch (op) {
    case HP_OP_EMBED:
    case HP_OP_KV_STORE:
    case HP_OP_ARGMAX:
    case HP_OP_CONV1D_SILU_DECODE:
    case HP_OP_GDN_DECODE:
    case HP_OP_ROPE:
    case HP_OP_ATTENTION:
    case HP_OP_MOE_PLAN:
    case HP_OP_KVBUF_STEP:
        return 1;
    case HP_OP_GDN_STEP:
    case HP_OP_KVBUF_FLUSH:
        return 2;
    case HP_OP_TOPK:
        return 2;
    case HP_OP_KV_STORE_DECODE:
    case HP_OP_ATTENTION_DECODE:
        return 3;
    default:
        return 0;
    }
}

/* The one dispatch point of the ops: counted, then run or recorded as
 * unsupported. */
#define CALL(op, fn, ...)                                                      \
    do {                                                                       \
        count(1, host_arrays(op));                                             \
        if (b->iface->fn)                                                      \
            b->iface->fn(b, __VA_ARGS__);                                      \
        else                                                                   \
            unsupported(b, op);                                                \
    } while (0)

/* ---- memory ------------------------------------------------------------- */

void *hp_backend_alloc(const hp_backend_t *b, size_t bytes)
{
    return b->iface->alloc(b, bytes);
}

void *hp_backend_alloc0(const hp_backend_t *b, size_t bytes)
{
    if (b->iface->alloc0)
        return b->iface->alloc0(b, bytes);
    void *p = b->iface->alloc(b, bytes);
    if (p)
        b->iface->memset0(b, p, bytes);
    return p;
}

void *hp_backend_realloc(const hp_backend_t *b, void *p, size_t old_bytes,
                         size_t new_bytes)
{
    return b->iface->realloc(b, p, old_bytes, new_bytes);
}

void hp_backend_free(const hp_backend_t *b, void *p)
{
    if (p)
        b->iface->free(b, p);
}

void hp_backend_memset0(const hp_backend_t *b, void *p, size_t bytes)
{
    count(1, 0);
    b->iface->memset0(b, p, bytes);
}

void hp_backend_upload(const hp_backend_t *b, void *dst, const void *src,
                       size_t bytes)
{
    count(0, 1);
    b->iface->upload(b, dst, src, bytes);
}

void hp_backend_download(const hp_backend_t *b, void *dst, const void *src,
                         size_t bytes)
{
    count(0, 1);
    __atomic_add_fetch(&n_down_bytes, bytes, __ATOMIC_RELAXED);
    b->iface->download(b, dst, src, bytes);
}

void hp_backend_copy(const hp_backend_t *b, void *dst, const void *src,
                     size_t bytes)
{
    count(1, 0);
    b->iface->copy(b, dst, src, bytes);
}

void hp_backend_put(const hp_backend_t *b, void *dst, const void *src,
                    hp_mem_t mem, size_t bytes)
{
    if (mem == HP_MEM_HOST)
        hp_backend_upload(b, dst, src, bytes);
    else
        hp_backend_copy(b, dst, src, bytes);
}

void hp_backend_get(const hp_backend_t *b, void *dst, hp_mem_t mem,
                    const void *src, size_t bytes)
{
    if (mem == HP_MEM_HOST)
        hp_backend_download(b, dst, src, bytes);
    else
        hp_backend_copy(b, dst, src, bytes);
}

int hp_backend_place(const hp_backend_t *b, const void **p, size_t bytes,
                     hp_error_t *err)
{
    return b->iface->place && *p ? b->iface->place(b, p, bytes, err) : HP_OK;
}

void hp_backend_unplace(const hp_backend_t *b, const void *p)
{
    if (b->iface->unplace && p)
        b->iface->unplace(b, p);
}

int hp_backend_reserve(const hp_backend_t *b, const hp_backend_plan_t *plan,
                       hp_error_t *err)
{
    return b->iface->reserve ? b->iface->reserve(b, plan, err) : HP_OK;
}

unsigned long hp_backend_device_allocs(const hp_backend_t *b)
{
    return b->iface->device_allocs ? b->iface->device_allocs(b) : 0;
}

unsigned long hp_backend_device_waits(const hp_backend_t *b)
{
    return b->iface->device_waits ? b->iface->device_waits(b) : 0;
}

double hp_backend_device_wait_s(const hp_backend_t *b)
{
    return b->iface->device_wait_ns ? 1e-9 * (double)b->iface->device_wait_ns(b)
                                    : 0.0;
}

char *hp_backend_tuned(const hp_backend_t *b)
{
    const size_t n = b->iface->tuned ? b->iface->tuned(b, NULL, 0) : 0;
    char *s = n ? malloc(n + 1) : NULL;
    if (s)
        b->iface->tuned(b, s, n + 1);
    return s;
}

unsigned long long hp_backend_host_bytes(const hp_backend_t *b)
{
    return b->iface->host_bytes ? b->iface->host_bytes(b) : 0;
}

unsigned long hp_backend_host_copies(const hp_backend_t *b)
{
    return b->iface->host_copies ? b->iface->host_copies(b) : 0;
}

int hp_backend_profile_start(const hp_backend_t *b, hp_error_t *err)
{
    if (!b->iface->profile_start)
        return hp_error_set(err, HP_EBADINPUT, "%s: no op profile", b->name);
    return b->iface->profile_start(b, err);
}

int hp_backend_profile_stop(const hp_backend_t *b, hp_backend_prof_row_t *rows,
                            int cap, int *n, hp_error_t *err)
{
    *n = 0;
    if (!b->iface->profile_stop)
        return hp_error_set(err, HP_EBADINPUT, "%s: no op profile", b->name);
    return b->iface->profile_stop(b, rows, cap, n, err);
}

void hp_backend_lock(const hp_backend_t *b)
{
    if (b->iface->lock)
        b->iface->lock(b);
}

void hp_backend_unlock(const hp_backend_t *b)
{
    if (b->iface->unlock)
        b->iface->unlock(b);
}

size_t hp_backend_mem_total(const hp_backend_t *b)
{
    return b->iface->mem_total ? b->iface->mem_total(b) : 0;
}

size_t hp_backend_mem_free(const hp_backend_t *b)
{
    return b->iface->mem_free ? b->iface->mem_free(b) : 0;
}

int hp_backend_lost(const hp_backend_t *b, hp_error_t *err)
{
    return b->iface->lost ? b->iface->lost(b, err) : 0;
}

/* ---- ops ---------------------------------------------------------------- */

void hp_backend_linear(const hp_backend_t *b, float *y, const float *x,
                       const hk_weight_t *w, int n)
{
    CALL(HP_OP_LINEAR, linear, y, x, w, n, 0);
}

void hp_backend_linear_acc(const hp_backend_t *b, float *y, const float *x,
                           const hk_weight_t *w, int n)
{
    CALL(HP_OP_LINEAR_ACC, linear, y, x, w, n, 1);
}

/* Whether w[0..k) can be one input's matrices: every one as wide. */
static int one_input(const hk_weight_t *const *w, int k)
{
    for (int i = 1; i < k; i++)
        if (w[i]->cols != w[0]->cols)
            return 0;
    return 1;
}

void hp_backend_linear_n(const hp_backend_t *b, float *const *y, const float *x,
                         const hk_weight_t *const *w, int k, int n)
{
    if (!b->iface->linear_n || !one_input(w, k)) {
        for (int i = 0; i < k; i++)
            hp_backend_linear(b, y[i], x, w[i], n);
        return;
    }
    count((unsigned long)k, 0); /* k projections, as k linear calls */
    b->iface->linear_n(b, y, x, w, k, n);
}

/* The made-then-projected ops: a backend's own, counted as the two ops
 * they are made of, or those two ops. */
void hp_backend_rmsnorm_linear_n(const hp_backend_t *b, float *const *ys,
                                 float *y, const float *x, const float *nw,
                                 const hk_weight_t *const *w, int k, int T,
                                 float eps)
{
    if (!nw) { /* y as given */
        hp_backend_linear_n(b, ys, y, w, k, T);
        return;
    }
    if (!b->iface->rmsnorm_linear_n || !one_input(w, k)) {
        hp_backend_rmsnorm(b, y, x, nw, T, w[0]->cols, eps);
        hp_backend_linear_n(b, ys, y, w, k, T);
        return;
    }
    count(1 + (unsigned long)k, 0);
    b->iface->rmsnorm_linear_n(b, ys, y, x, nw, w, k, T, eps);
}

void hp_backend_rmsnorm_gated_linear_acc(const hp_backend_t *b, float *x,
                                         float *o, const float *z,
                                         const float *gw, int rows, int dim,
                                         float eps, const hk_weight_t *w, int T)
{
    if (!b->iface->rmsnorm_gated_linear_acc) {
        hp_backend_rmsnorm_gated(b, o, o, z, gw, rows, dim, eps);
        hp_backend_linear_acc(b, x, o, w, T);
        return;
    }
    count(2, 0);
    b->iface->rmsnorm_gated_linear_acc(b, x, o, z, gw, rows, dim, eps, w, T);
}

void hp_backend_gate_mul_linear_acc(const hp_backend_t *b, float *x, float *o,
                                    const float *gate, const hk_weight_t *w,
                                    int T)
{
    if (!b->iface->gate_mul_linear_acc) {
        hp_backend_gate_mul(b, o, gate, (size_t)T * w->cols);
        hp_backend_linear_acc(b, x, o, w, T);
        return;
    }
    count(2, 0);
    b->iface->gate_mul_linear_acc(b, x, o, gate, w, T);
}

void hp_backend_swiglu_linear_acc(const hp_backend_t *b, float *x, float *g,
                                  const float *u, const hk_weight_t *w, int T)
{
    if (!b->iface->swiglu_linear_acc) {
        hp_backend_swiglu(b, g, g, u, (size_t)T * w->cols);
        hp_backend_linear_acc(b, x, g, w, T);
        return;
    }
    count(2, 0);
    b->iface->swiglu_linear_acc(b, x, g, u, w, T);
}

void hp_backend_mlp_acc(const hp_backend_t *b, float *x, float *y, float *g,
                        float *u, const float *nw, const hk_weight_t *gw,
                        const hk_weight_t *uw, const hk_weight_t *dw, int T,
                        float eps, hp_prec_t prec)
{
    const hk_weight_t *const w[] = {gw, uw};
    float *const ys[] = {g, u};
    if (!b->iface->mlp_acc_bf16 || prec != HP_PREC_BF16 || !one_input(w, 2) ||
        gw->dtype != HK_W_BF16 || uw->dtype != HK_W_BF16 ||
        dw->dtype != HK_W_BF16) {
        hp_backend_rmsnorm_linear_n(b, ys, y, x, nw, w, 2, T, eps);
        hp_backend_swiglu_linear_acc(b, x, g, u, dw, T);
        return;
    }
    /* (rmsnorm,) gate, up, swiglu, down */
    count(nw ? 5 : 4, 0);
    b->iface->mlp_acc_bf16(b, x, y, g, u, nw, gw, uw, dw, T, eps);
}

void hp_backend_embed(const hp_backend_t *b, float *x, const hk_weight_t *w,
                      const int *ids, int T)
{
    CALL(HP_OP_EMBED, embed, x, w, ids, T);
}

void hp_backend_rmsnorm(const hp_backend_t *b, float *y, const float *x,
                        const float *w, int rows, int dim, float eps)
{
    CALL(HP_OP_RMSNORM, rmsnorm, y, x, w, rows, dim, eps);
}

void hp_backend_rmsnorm_gated(const hp_backend_t *b, float *y, const float *x,
                              const float *z, const float *w, int rows, int dim,
                              float eps)
{
    CALL(HP_OP_RMSNORM_GATED, rmsnorm_gated, y, x, z, w, rows, dim, eps);
}

void hp_backend_l2norm(const hp_backend_t *b, float *x, int rows, int dim,
                       float eps, float scale)
{
    CALL(HP_OP_L2NORM, l2norm, x, rows, dim, eps, scale);
}

void hp_backend_swiglu(const hp_backend_t *b, float *y, const float *g,
                       const float *u, size_t n)
{
    CALL(HP_OP_SWIGLU, swiglu, y, g, u, n);
}

void hp_backend_split_heads(const hp_backend_t *be, float *a, float *b2,
                            float *c, const float *x, int rows, int da, int db,
                            int dc)
{
    const hp_backend_t *b = be;
    CALL(HP_OP_SPLIT_HEADS, split_heads, a, b2, c, x, rows, da, db, dc);
}

void hp_backend_gate_mul(const hp_backend_t *b, float *o, const float *gate,
                         size_t n)
{
    CALL(HP_OP_GATE_MUL, gate_mul, o, gate, n);
}

void hp_backend_scale_rows(const hp_backend_t *b, float *x, const float *s,
                           int rows, int dim, int sigm)
{
    CALL(HP_OP_SCALE_ROWS, scale_rows, x, s, rows, dim, sigm);
}

void hp_backend_axpy(const hp_backend_t *b, float *y, float a, const float *x,
                     size_t n)
{
    CALL(HP_OP_AXPY, axpy, y, a, x, n);
}

void hp_backend_kv_store(const hp_backend_t *b, float *kc, float *vc,
                         const float *k, const float *v, const int *pos, int T,
                         int kvd)
{
    CALL(HP_OP_KV_STORE, kv_store, kc, vc, k, v, pos, T, kvd);
}

void hp_backend_kv_store_decode(const hp_backend_t *b, float *const *kcs,
                                float *const *vcs, const float *k,
                                const float *v, const int *pos, int B, int kvd)
{
    CALL(HP_OP_KV_STORE_DECODE, kv_store_decode, kcs, vcs, k, v, pos, B, kvd);
}

void hp_backend_argmax(const hp_backend_t *b, int *idx, const float *logits,
                       int B, int V, int ld)
{
    CALL(HP_OP_ARGMAX, argmax, idx, logits, B, V, ld);
}

int hp_backend_sample_topk(const float *p, const int *idx, int k, int V,
                           int top_k, float top_p, double u)
{
    return hk_sample_topk(p, idx, k, V, top_k, top_p, u);
}

void hp_backend_topk(const hp_backend_t *b, float *p, int *idx, float *raw,
                     double *lse, const float *logits, int B, int V, int ld,
                     int k, double inv_t)
{
    count(0, (raw != NULL) + (lse != NULL)); /* beyond host_arrays' two */
    CALL(HP_OP_TOPK, topk, p, idx, raw, lse, logits, B, V, ld, k, inv_t);
}

double hp_backend_lse(const float *x, int V)
{
    return hk_lse(x, V, hk_argmax(x, V));
}

void hp_backend_conv1d_silu(const hp_backend_t *b, float *y, float *state,
                            const float *x, const float *w, int T, int C, int K)
{
    CALL(HP_OP_CONV1D_SILU, conv1d_silu, y, state, x, w, T, C, K);
}

/* The conv_qkv ops' second half on a backend without them: the conv
 * output cv [T, C] split into q, k, v, the norms, the gates. */
static void split_norm_gates(const hp_backend_t *b, float *q, float *k,
                             float *v, const float *cv, float *g, float *beta,
                             const float *A_log, const float *dt_bias, int T,
                             int Hk, int Hv, int dk, int dv, float eps,
                             float q_scale)
{
    const int kd = Hk * dk, vd = Hv * dv;
    hp_backend_split_heads(b, q, k, v, cv, T, kd, kd, vd);
    hp_backend_l2norm(b, q, T * Hk, dk, eps, q_scale);
    hp_backend_l2norm(b, k, T * Hk, dk, eps, 1.0f);
    hp_backend_gdn_gates(b, g, beta, g, beta, A_log, dt_bias, T, Hv);
}

void hp_backend_conv_qkv(const hp_backend_t *b, float *q, float *k, float *v,
                         float *cv, float *state, const float *x,
                         const float *w, float *g, float *beta,
                         const float *A_log, const float *dt_bias, int T,
                         int Hk, int Hv, int dk, int dv, int K, float eps,
                         float q_scale)
{
    if (!b->iface->conv_qkv) {
        hp_backend_conv1d_silu(b, cv, state, x, w, T, 2 * Hk * dk + Hv * dv, K);
        split_norm_gates(b, q, k, v, cv, g, beta, A_log, dt_bias, T, Hk, Hv, dk,
                         dv, eps, q_scale);
        return;
    }
    count(5, 0); /* as the five ops */
    b->iface->conv_qkv(b, q, k, v, cv, state, x, w, g, beta, A_log, dt_bias, T,
                       Hk, Hv, dk, dv, K, eps, q_scale);
}

void hp_backend_conv1d_silu_decode(const hp_backend_t *b, float *y,
                                   float *const *states, const float *x,
                                   const float *w, int B, int C, int K)
{
    CALL(HP_OP_CONV1D_SILU_DECODE, conv1d_silu_decode, y, states, x, w, B, C,
         K);
}

void hp_backend_conv_qkv_decode(const hp_backend_t *b, float *q, float *k,
                                float *v, float *cv, float *const *states,
                                const float *x, const float *w, float *g,
                                float *beta, const float *A_log,
                                const float *dt_bias, int B, int Hk, int Hv,
                                int dk, int dv, int K, float eps, float q_scale)
{
    if (!b->iface->conv_qkv_decode) {
        hp_backend_conv1d_silu_decode(b, cv, states, x, w, B,
                                      2 * Hk * dk + Hv * dv, K);
        split_norm_gates(b, q, k, v, cv, g, beta, A_log, dt_bias, B, Hk, Hv, dk,
                         dv, eps, q_scale);
        return;
    }
    count(5, host_arrays(HP_OP_CONV1D_SILU_DECODE)); /* as the five ops */
    b->iface->conv_qkv_decode(b, q, k, v, cv, states, x, w, g, beta, A_log,
                              dt_bias, B, Hk, Hv, dk, dv, K, eps, q_scale);
}

void hp_backend_gdn_gates(const hp_backend_t *b, float *g, float *beta,
                          const float *a, const float *bp, const float *A_log,
                          const float *dt_bias, int T, int Hv)
{
    CALL(HP_OP_GDN_GATES, gdn_gates, g, beta, a, bp, A_log, dt_bias, T, Hv);
}

void hp_backend_gdn_recurrent(const hp_backend_t *b, float *o, float *S,
                              const float *q, const float *k, const float *v,
                              const float *g, const float *beta, int T, int Hk,
                              int Hv, int dk, int dv)
{
    CALL(HP_OP_GDN_RECURRENT, gdn_recurrent, o, S, q, k, v, g, beta, T, Hk, Hv,
         dk, dv);
}

void hp_backend_gdn_decode(const hp_backend_t *b, float *o,
                           float *const *states, const float *q, const float *k,
                           const float *v, const float *g, const float *beta,
                           int B, int Hk, int Hv, int dk, int dv)
{
    CALL(HP_OP_GDN_DECODE, gdn_decode, o, states, q, k, v, g, beta, B, Hk, Hv,
         dk, dv);
}

void hp_backend_gdn_chunk(const hp_backend_t *b, float *o, float *S, float *Tc,
                          const float *q, const float *k, const float *v,
                          const float *g, const float *beta, int T, int Hk,
                          int Hv, int dk, int dv, int C, float *scratch,
                          hp_prec_t prec)
{
    CALL(HP_OP_GDN_CHUNK, gdn_chunk, o, S, Tc, q, k, v, g, beta, T, Hk, Hv, dk,
         dv, C, scratch, prec);
}

size_t hp_backend_gdn_chunk_scratch(const hp_backend_t *b, int T, int Hv,
                                    int dk, int dv, int C)
{
    return b->iface->gdn_chunk_scratch
               ? b->iface->gdn_chunk_scratch(b, T, Hv, dk, dv, C)
               : 0;
}

void hp_backend_gdn_step(const hp_backend_t *b, float *o, float *const *states,
                         float *const *conv_states, const float *qkv,
                         const float *a, const float *bp, const float *conv_w,
                         const float *A_log, const float *dt_bias, int B,
                         int Hk, int Hv, int dk, int dv, int K, float eps,
                         float q_scale, float *scratch)
{
    CALL(HP_OP_GDN_STEP, gdn_step, o, states, conv_states, qkv, a, bp, conv_w,
         A_log, dt_bias, B, Hk, Hv, dk, dv, K, eps, q_scale, scratch);
}

size_t hp_backend_gdn_step_scratch(const hp_backend_t *b, int B, int Hk, int Hv,
                                   int dk, int dv)
{
    return b->iface->gdn_step_scratch
               ? b->iface->gdn_step_scratch(b, B, Hk, Hv, dk, dv)
               : 0;
}

/* [B, cd] conv output, q, k [B, Hk dk], v [B, Hv dv], g, beta [B, Hv] */
size_t hp_backend_gdn_step_floats(be_t b, int B, int Hk, int Hv, int dk, int dv)
{
    (void)b;
    size_t cd = 2 * (size_t)Hk * dk + (size_t)Hv * dv;
    return (size_t)B * (2 * cd + 2 * (size_t)Hv);
}

void hp_backend_gdn_step_ops(be_t b, float *o, float *const *states,
                             float *const *conv_states, const float *qkv,
                             const float *a, const float *bp,
                             const float *conv_w, const float *A_log,
                             const float *dt_bias, int B, int Hk, int Hv,
                             int dk, int dv, int K, float eps, float q_scale,
                             float *scratch)
{
    const size_t kd = (size_t)Hk * dk, vd = (size_t)Hv * dv;
    const int cd = (int)(2 * kd + vd);
    float *cv = scratch, *q = cv + (size_t)B * cd, *k = q + (size_t)B * kd;
    float *v = k + (size_t)B * kd, *g = v + (size_t)B * vd;
    float *beta = g + (size_t)B * Hv;
    hp_backend_conv1d_silu_decode(b, cv, conv_states, qkv, conv_w, B, cd, K);
    hp_backend_split_heads(b, q, k, v, cv, B, (int)kd, (int)kd, (int)vd);
    hp_backend_l2norm(b, q, B * Hk, dk, eps, q_scale);
    hp_backend_l2norm(b, k, B * Hk, dk, eps, 1.0f);
    hp_backend_gdn_gates(b, g, beta, a, bp, A_log, dt_bias, B, Hv);
    hp_backend_gdn_decode(b, o, states, q, k, v, g, beta, B, Hk, Hv, dk, dv);
}

void hp_backend_rope(const hp_backend_t *b, float *x, const int *pos, int T,
                     int nh, int hd, int rot, double theta)
{
    CALL(HP_OP_ROPE, rope, x, pos, T, nh, hd, rot, theta);
}

void hp_backend_qk_norm_rope(const hp_backend_t *b, float *q, float *gate,
                             float *k, const float *P, const float *qw,
                             const float *kw, const int *pos, int T, int Hq,
                             int Hkv, int hd, int rot, double theta, float eps)
{
    if (!b->iface->qk_norm_rope) {
        hp_backend_split_heads(b, q, gate, NULL, P, T * Hq, hd, hd, 0);
        hp_backend_rmsnorm(b, q, q, qw, T * Hq, hd, eps);
        hp_backend_rmsnorm(b, k, k, kw, T * Hkv, hd, eps);
        hp_backend_rope(b, q, pos, T, Hq, hd, rot, theta);
        hp_backend_rope(b, k, pos, T, Hkv, hd, rot, theta);
        return;
    }
    /* as the five ops, but one positions array for both rotations */
    count(5, host_arrays(HP_OP_ROPE));
    b->iface->qk_norm_rope(b, q, gate, k, P, qw, kw, pos, T, Hq, Hkv, hd, rot,
                           theta, eps);
}

void hp_backend_rope_shift(const hp_backend_t *b, float *x, int delta, int T,
                           int nh, int hd, int rot, double theta)
{
    CALL(HP_OP_ROPE_SHIFT, rope_shift, x, delta, T, nh, hd, rot, theta);
}

void hp_backend_attention(const hp_backend_t *b, float *o, const float *q,
                          const int *qpos, const float *k, const float *v,
                          int T, int N, int Hq, int Hkv, int hd, float scale,
                          hp_prec_t prec, float *scratch)
{
    CALL(HP_OP_ATTENTION, attention, o, q, qpos, k, v, T, N, Hq, Hkv, hd, scale,
         prec, scratch);
}

size_t hp_backend_attention_scratch(const hp_backend_t *b, int T, int N, int Hq,
                                    int Hkv, int hd, hp_prec_t prec)
{
    return b->iface->attention_scratch
               ? b->iface->attention_scratch(b, T, N, Hq, Hkv, hd, prec)
               : 0;
}

void hp_backend_attention_decode(const hp_backend_t *b, float *o,
                                 const float *q, const float *const *kcs,
                                 const float *const *vcs, const int *n_ctx,
                                 int B, int Hq, int Hkv, int hd, float scale,
                                 float *scratch)
{
    CALL(HP_OP_ATTENTION_DECODE, attention_decode, o, q, kcs, vcs, n_ctx, B, Hq,
         Hkv, hd, scale, scratch);
}

void hp_backend_moe_route(const hp_backend_t *b, int *idx, float *w,
                          const float *logits, int T, int E, int k, int renorm)
{
    CALL(HP_OP_MOE_ROUTE, moe_route, idx, w, logits, T, E, k, renorm);
}

void hp_backend_moe_plan(const hp_backend_t *b, int *offs, int *rows,
                         float *scale, int *slot, const int *idx,
                         const float *w, int T, int k, int E)
{
    CALL(HP_OP_MOE_PLAN, moe_plan, offs, rows, scale, slot, idx, w, T, k, E);
}

void hp_backend_moe_gather(const hp_backend_t *b, float *xg, const float *y,
                           const int *rows, int n, int H)
{
    CALL(HP_OP_MOE_GATHER, moe_gather, xg, y, rows, n, H);
}

void hp_backend_moe_scatter(const hp_backend_t *b, float *x, const float *eo,
                            const int *rows, int n, int H)
{
    CALL(HP_OP_MOE_SCATTER, moe_scatter, x, eo, rows, n, H);
}

void hp_backend_moe_combine(const hp_backend_t *b, float *x, const float *eo,
                            const int *slot, int T, int k, int H)
{
    CALL(HP_OP_MOE_COMBINE, moe_combine, x, eo, slot, T, k, H);
}

void hp_backend_trans_identity(const hp_backend_t *b, float *T, int H, int dk)
{
    CALL(HP_OP_TRANS_IDENTITY, trans_identity, T, H, dk);
}

void hp_backend_trans_compose(const hp_backend_t *b, float *out,
                              hk_trans_family_t fam, const float *T,
                              const float *S, const float *S0, int H, int dk,
                              int dv, float *scratch)
{
    CALL(HP_OP_TRANS_COMPOSE, trans_compose, out, fam, T, S, S0, H, dk, dv,
         scratch);
}

void hp_backend_trans_chain(const hp_backend_t *b, float *T1, float *S1,
                            hk_trans_family_t fam, const float *T2,
                            const float *S2, int H, int dk, int dv,
                            float *scratch)
{
    CALL(HP_OP_TRANS_CHAIN, trans_chain, T1, S1, fam, T2, S2, H, dk, dv,
         scratch);
}

size_t hp_backend_kvbuf_block_floats(const hp_backend_t *b,
                                     const hk_kvbuf_geom_t *g)
{
    return b->iface->kvbuf_block_floats ? b->iface->kvbuf_block_floats(b, g)
                                        : 0;
}

size_t hp_backend_kvbuf_scratch(const hp_backend_t *b, const hk_kvbuf_geom_t *g,
                                int T, int lmax, int nth)
{
    return b->iface->kvbuf_scratch ? b->iface->kvbuf_scratch(b, g, T, lmax, nth)
                                   : 0;
}

void hp_backend_kvbuf_step(const hp_backend_t *b, float *o, float *arena,
                           const hk_kvbuf_view_t *vw, const float *q,
                           const float *k, const float *v, const float *g,
                           const float *beta, int R, int T,
                           const hk_kvbuf_geom_t *geom, int lmax,
                           float *scratch, int nth)
{
    CALL(HP_OP_KVBUF_STEP, kvbuf_step, o, arena, vw, q, k, v, g, beta, R, T,
         geom, lmax, scratch, nth);
}

void hp_backend_kvbuf_flush(const hp_backend_t *b, float *arena,
                            const hk_kvbuf_view_t *vw, const int *n, int R,
                            const hk_kvbuf_geom_t *geom, float *scratch,
                            int nth)
{
    CALL(HP_OP_KVBUF_FLUSH, kvbuf_flush, arena, vw, n, R, geom, scratch, nth);
}

void hp_backend_kvbuf_conv_commit(const hp_backend_t *b, float *state,
                                  const float *x, int m, int C, int K)
{
    CALL(HP_OP_KVBUF_CONV_COMMIT, kvbuf_conv_commit, state, x, m, C, K);
}
