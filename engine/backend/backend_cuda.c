/*
 * backend_cuda.c - the CUDA backend: the table of backend_impl.h over
 * kernels/cuda (hk_cuda.h) on one device, the legacy default stream and
 * one cuBLAS handle. Built where the CUDA library is (HK_HAVE_CUDA) and
 * linked into the binaries that can run on a GPU (hypic-engine, the CUDA
 * tests); backend.c finds it through a weak reference.
 *
 * Every op has a CUDA twin (hp_backend_supports_op says 1). I8
 * projections: hk_cuda_linear_i8, with a tile scratch of CU_I8_TILE floats
 * for batches past HK_CUDA_I8_DIRECT rows.
 * Host arrays an op takes (positions, ids, pointer lists) go through a
 * staging ring (hk_cuda_ring_t: pinned memory, asynchronous copies), so
 * issuing an op never waits for the device: a step waits once, for its
 * results. The ring's segments, the I8 tile, the bf16 copy of x and
 * argmax's split partials are sized by hp_backend_reserve (the forward
 * workspace's plan, at a server's start); a call past the plan still grows them
 * (a device allocation, hence a sync) rather than fail. Failures are kept for
 * hp_backend_sync, the first one with its op.
 *
 * The fused decode step's kernel: HYPIC_CUDA_STEP's (kernels/cuda/
 * hk_gdn_step.cu; default PIPE); with HYPIC_CUDA_TUNE=1 and no kernel
 * named, the fastest of PIPE, PIPEA and PIPEW (the same results bit for
 * bit) at each size class (the heads' shape and B's power of 2), found by
 * timing the class's first 3 steps on each (hk_cuda_tuner: events read
 * once done, no wait). Opt-in until PIPEA and PIPEW have passed their
 * tests on a GPU (they have run on the emulator only). Likewise, with
 * HYPIC_CUDA_TUNE=1 and a GDN mode that names no pass (not tc_r64,
 * tc_deep, tc_w8, tc_ov), each GDN chunk's size class (the heads' shape,
 * T's power of 2, T_C or not, the inputs rounded or not) times its first 3
 * calls on each of the default pass, R64, DEEP, W8 and W8 with DEEP, each
 * with kernel O on 32 or 64 columns (O64), and the default and W8 with
 * their launches overlapped (OVERLAP) (the same sums, bit for bit:
 * test_gdn_chunk_same), those of them that run other launches at that
 * shape, and keeps the fastest; and where HYPIC_CUDA_ATT names no kernel
 * and bf16 attention's default is FLASH3_SEQ (a Hopper device), each bf16
 * attention prefill's class (T's and N's powers of 2, the heads' shape)
 * times FLASH3_SEQ, FLASH3_WS and FLASH3 (bit for bit the same:
 * test_attention_flash3). hp_backend_tuned says what they chose.
 *
 * Gated DeltaNet kernels, chosen at open by HYPIC_CUDA_GDN:
 *   auto (default)  the chunked prefill on tensor cores on f32 inputs
 *                   (hk_cuda_gdn_chunk_tc, chunk 64, else 32 or 16 where
 *                   shared memory is short) and the fused decode step
 *                   (hk_cuda_gdn_step); the f32 kernels where a shape
 *                   rules those out (dk or dv not a multiple of 16, dv
 *                   not of 4); at bf16 precision (a bf16 checkpoint's
 *                   --dtype auto) the chunk's q, k, v rounded once
 *                   (HK_CUDA_GDN_TC_ROUND), in every mode but scalar
 *   tc              those only: a shape they cannot take is an error
 *   scalar          the f32 kernels only: hk_cuda_gdn_chunk (the
 *                   caller's chunk) and the unfused decode chain, so one
 *                   run can time both on the same device
 *   tc_v1, tc_fast  tc with the prefill's older structure (outputs in the
 *                   sequential pass) or its single-bf16 products (~1e-3),
 *                   HK_CUDA_GDN_TC_V1 / _FAST, to time them in the engine
 *   tc_a1           tc with the first chunk-local kernel A
 *                   (HK_CUDA_GDN_TC_A1; the default is the blockwise one)
 *   tc_bf16         tc at FLA's bf16 precision: the prefill's q, k, v
 *                   rounded to bf16 once, by the chunk entry's pass (hi
 *                   halves only), and one bf16 MMA per product in the
 *                   state pass and the outputs (HK_CUDA_GDN_TC_ROUND |
 *                   _FAST); kernel A keeps (I + L)^-1's lo half
 *                   (_FAST_A without it: 1.6x the logits' error on the
 *                   dense test model, kernels/cuda/README); decode
 *                   steps as tc (f32). Not the default until a device
 *                   times it against auto.
 *   tc_p,           tc and tc_bf16 with the state pass's state in shared
 *   tc_bf16_p       memory (kernel P, HK_CUDA_GDN_TC_SMEM) where the
 *                   default keeps it in registers (R: 1.2-1.3x P's speed
 *                   on an H200), to time both
 *   tc_a3, tc_ro,   tc with kernel A3 (HK_CUDA_GDN_TC_A3), the outputs
 *   tc_a3ro         fused into the state pass (_FUSE_O), or both; untimed
 *                   (session 16), to time them in the engine
 *   tc_r64          tc with kernel R on 64 columns and 8 warps where 32
 *                   columns make more blocks than SMs (HK_CUDA_GDN_TC_R64:
 *                   T_C's columns on Qwen3-Next's heads in PIC
 *                   capture); untimed (session 17)
 *   tc_deep         tc with kernel R's tiles two chunks ahead in three
 *                   buffers (HK_CUDA_GDN_TC_DEEP, where they fit: at
 *                   dk = 128 bf16 inputs, not fused); untimed (session 17)
 *   tc_w8           tc with kernel R on 8 state warps instead of 4
 *                   (HK_CUDA_GDN_TC_W8: dk = 128 or 256, fused at 128);
 *                   untimed (session 19)
 *   tc_ov           tc with the chunk's launches in segments on three
 *                   streams, kernel A of the next segments beside the
 *                   state pass of this one (HK_CUDA_GDN_TC_OVERLAP, on
 *                   the backend's lanes); untimed (session 20)
 */
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/backend/backend_impl.h"
#include "engine/backend/stage_memo.h"
#include "kernels/cuda/hk_cuda.h"

typedef enum { GDN_AUTO, GDN_TC, GDN_SCALAR } gdn_mode_t;

/* Floats of the I8 projections' f32 tile (32 MiB): a whole weight of up
 * to 8 M entries per cuBLAS call, more in tiles of rows */
#define CU_I8_TILE ((size_t)8 << 20)

/* Staging rings one op may outgrow (one per array it stages, at most) */
#define STAGE_RETIRED 8
/* A ring segment's bytes before any plan: a few ops' pointer lists */
#define STAGE_MIN ((size_t)64 << 10)
/* The staging memo: arrays of up to 16 KiB (a pointer list of 2k rows),
 * 256 entries (a 48-layer model's step hands ~100 distinct arrays) */
#define MEMO_ENTRIES 256
#define MEMO_BYTES   ((size_t)16 << 10)
/* An op profile's marks (events, made at its first start: a 64k-token
 * prefill of a 24-layer model is ~30k ops) and kinds of op */
#define PROF_MARKS (1 << 16)
#define PROF_KINDS 64
/* the decode step's kernels the tuner times (step_cands), the GDN chunk's
 * state passes (chunk_cands) and the bf16 attention prefill's kernels
 * (att_cands) */
#define STEP_CANDS  3
#define CHUNK_CANDS 12
#define ATT_CANDS   3

typedef struct {
    struct hp_backend self;
    int device;
    int sms;            /* multiprocessors: bounds flash-decoding's split */
    gdn_mode_t gdn;     /* HYPIC_CUDA_GDN */
    unsigned gdn_flags; /* ... and hk_cuda_gdn_chunk_tc_ex's flags */
    /* the decode step's kernel among PIPE, PIPEA, PIPEW (the same results
     * bit for bit), by timing real steps (HYPIC_CUDA_TUNE=1); NULL:
     * HYPIC_CUDA_STEP's */
    hk_cuda_tuner_t *step_tune;
    /* the GDN chunk's state pass among the default, R64, DEEP, W8 and W8
     * with DEEP, and its kernel O on 32 or 64 columns, the same way; NULL:
     * the mode's */
    hk_cuda_tuner_t *chunk_tune;
    /* the bf16 attention prefill's kernel among FLASH3_SEQ, FLASH3_WS and
     * FLASH3, the same way; NULL: DEFAULT_BF16's */
    hk_cuda_tuner_t *att_tune;
    /* side streams of the chunks that overlap their launches
     * (HK_CUDA_GDN_TC_OVERLAP); NULL where they could not be made, and
     * then no chunk asks for it */
    hk_cuda_lanes_t *lanes;
    hk_cuda_blas_t *blas;
    int rc;                /* first failure since the last sync (hk_cuda) */
    char what[96];         /* ... and where */
    _Atomic int lost;      /* a sticky fault (HK_CUDA_EFAULT) was seen */
    char lost_what[96];    /* ... first in this op, written before lost */
    hk_cuda_ring_t *stage; /* host arrays on their way to the device */
    hk_cuda_ring_t *retired[STAGE_RETIRED]; /* outgrown, the op still uses */
    int n_retired;
    /* the arrays staged lately, by content, and their copies in the
     * ring (stage_memo.h; stage: which are good; HYPIC_CUDA_STAGE_MEMO=0:
     * none) */
    hp_stage_memo_t memo;
    uint16_t *xb;    /* x rounded to bf16 for bf16 projections */
    size_t xb_cap;   /* elements */
    int gemv;        /* few rows: one launch for the matrices of one input
                        (hk_cuda_gemv_bf16; HYPIC_CUDA_GEMV=0: cuBLAS's) */
    float *i8_tile;  /* [CU_I8_TILE]: W dequantized, a tile of rows */
    float *samp;     /* argmax's and topk's split partials, topk's output */
    size_t samp_cap; /* floats */
    size_t mem;      /* device memory in all (bytes) */
    float *host;     /* host scratch (the identity) */
    size_t host_cap; /* floats */
    /* hp_backend_lock: a ticket lock, so threads get the device in the
     * order they asked for it */
    pthread_mutex_t mu;
    pthread_cond_t turn;
    unsigned long next, serving;
    /* the op profile (hp_backend_profile_start): a mark after each op;
     * prof_of[i] is the kind of the op mark i + 1 ends */
    hk_cuda_marks_t *marks;
    int prof_on, prof_full, prof_n, n_kinds;
    unsigned char *prof_of; /* [PROF_MARKS] */
    char kinds[PROF_KINDS][32];
} cuda_t;

static cuda_t *ctx(be_t b)
{
    return b->ctx;
}

/* The op profile's mark after an op named what. */
static void prof_mark(cuda_t *c, const char *what)
{
    int k = 0;
    while (k < c->n_kinds && strcmp(c->kinds[k], what))
        k++;
    if (k == PROF_KINDS || hk_cuda_marks_record(c->marks, NULL) != HK_CUDA_OK) {
        c->prof_full = 1;
        return;
    }
    if (k == c->n_kinds)
        snprintf(c->kinds[c->n_kinds++], sizeof(c->kinds[0]), "%s", what);
    c->prof_of[c->prof_n++] = (unsigned char)k;
}

/* Keeps the first failure: rc from an hk_cuda call, what it was; marks
 * the op for a profile. */
static void note(be_t b, int rc, const char *what)
{
    cuda_t *c = ctx(b);
    if (c->prof_on && !c->prof_full)
        prof_mark(c, what);
    if (rc == HK_CUDA_EFAULT && !atomic_load(&c->lost)) {
        snprintf(c->lost_what, sizeof(c->lost_what), "%s", what);
        atomic_store(&c->lost, 1);
    }
    if (rc == HK_CUDA_OK || c->rc != HK_CUDA_OK)
        return;
    c->rc = rc;
    snprintf(c->what, sizeof(c->what), "%s", what);
}

static int cu_lost(be_t b, hp_error_t *err)
{
    cuda_t *c = ctx(b);
    if (!atomic_load(&c->lost))
        return 0;
    hp_error_set(err, HP_EUNAVAIL, "%s: %s: %s", b->name, c->lost_what,
                 hk_cuda_strerror(HK_CUDA_EFAULT));
    return 1;
}

static void cu_fail(be_t b, hp_op_t op)
{
    char what[64];
    snprintf(what, sizeof(what), "op %d (unsupported here)", (int)op);
    note(b, HK_CUDA_EINVAL, what);
}

static int cu_sync(be_t b, hp_error_t *err)
{
    cuda_t *c = ctx(b);
    note(b, hk_cuda_stream_sync(NULL), "synchronize");
    int rc = c->rc;
    c->rc = HK_CUDA_OK;
    if (rc == HK_CUDA_OK)
        return HP_OK;
    return hp_error_set(err,
                        rc == HK_CUDA_ENOMEM   ? HP_ENOMEM
                        : rc == HK_CUDA_EFAULT ? HP_EUNAVAIL
                                               : HP_EINTERNAL,
                        "%s: %s: %s", b->name, c->what, hk_cuda_strerror(rc));
}

static int cu_supports(be_t b, hp_op_t op, int dtype)
{
    (void)b;
    if (op == HP_OP_LINEAR || op == HP_OP_LINEAR_ACC || op == HP_OP_EMBED)
        return dtype == HK_W_F32 || dtype == HK_W_BF16 || dtype == HK_W_I8;
    return 1;
}

static void stage_begin(be_t b);

static void cu_close(be_t b)
{
    cuda_t *c = ctx(b);
    hk_cuda_blas_destroy(c->blas);
    hk_cuda_tuner_destroy(c->step_tune);
    hk_cuda_tuner_destroy(c->chunk_tune);
    hk_cuda_tuner_destroy(c->att_tune);
    hk_cuda_lanes_destroy(c->lanes);
    stage_begin(b); /* frees outgrown staging */
    hk_cuda_ring_destroy(c->stage);
    hp_stage_memo_free(&c->memo);
    hk_cuda_free(c->xb);
    hk_cuda_free(c->i8_tile);
    hk_cuda_free(c->samp);
    free(c->host);
    hk_cuda_marks_destroy(c->marks);
    free(c->prof_of);
    pthread_cond_destroy(&c->turn);
    pthread_mutex_destroy(&c->mu);
    free(c);
}

static void cu_lock(be_t b)
{
    cuda_t *c = ctx(b);
    pthread_mutex_lock(&c->mu);
    unsigned long mine = c->next++;
    while (c->serving != mine)
        pthread_cond_wait(&c->turn, &c->mu);
    pthread_mutex_unlock(&c->mu);
    /* the current device is per host thread */
    note(b, hk_cuda_set_device(c->device), "set device");
}

static void cu_unlock(be_t b)
{
    cuda_t *c = ctx(b);
    pthread_mutex_lock(&c->mu);
    c->serving++;
    pthread_cond_broadcast(&c->turn);
    pthread_mutex_unlock(&c->mu);
}

/* ---- memory ------------------------------------------------------------- */

static void *cu_alloc(be_t b, size_t bytes)
{
    void *p = NULL;
    (void)b;
    return hk_cuda_malloc(&p, bytes) == HK_CUDA_OK ? p : NULL;
}

static void cu_free(be_t b, void *p)
{
    note(b, hk_cuda_free(p), "free");
}

static void *cu_realloc(be_t b, void *p, size_t old_bytes, size_t new_bytes)
{
    void *q = cu_alloc(b, new_bytes);
    if (!q)
        return NULL;
    if (p) {
        size_t n = old_bytes < new_bytes ? old_bytes : new_bytes;
        note(b, hk_cuda_d2d(q, p, n, NULL), "realloc");
        cu_free(b, p);
    }
    return q;
}

static void cu_memset0(be_t b, void *p, size_t bytes)
{
    note(b, hk_cuda_memset0(p, bytes, NULL), "memset");
}

static void cu_upload(be_t b, void *dst, const void *src, size_t bytes)
{
    note(b, hk_cuda_h2d(dst, src, bytes, NULL), "upload");
}

/* Waits (hk_cuda_d2h does): the host reads dst next. */
static void cu_download(be_t b, void *dst, const void *src, size_t bytes)
{
    note(b, hk_cuda_d2h(dst, src, bytes, NULL), "download");
}

static void cu_copy(be_t b, void *dst, const void *src, size_t bytes)
{
    if (dst != src)
        note(b, hk_cuda_d2d(dst, src, bytes, NULL), "copy");
}

static int cu_place(be_t b, const void **p, size_t bytes, hp_error_t *err)
{
    void *d = cu_alloc(b, bytes);
    if (!d)
        return hp_error_set(err, HP_ENOMEM,
                            "%s: no device memory for %zu MiB of weights",
                            b->name, bytes >> 20);
    int rc = hk_cuda_h2d(d, *p, bytes, NULL);
    if (rc != HK_CUDA_OK) {
        hk_cuda_free(d);
        return hp_error_set(err, HP_EINTERNAL, "%s: weights upload: %s",
                            b->name, hk_cuda_strerror(rc));
    }
    *p = d;
    return HP_OK;
}

static void cu_unplace(be_t b, const void *p)
{
    cu_free(b, (void *)p);
}

static int grow(void **p, size_t *cap, size_t need, size_t size)
{
    if (need <= *cap)
        return HK_CUDA_OK;
    hk_cuda_free(*p);
    *p = NULL;
    *cap = 0;
    int rc = hk_cuda_malloc(p, need * size);
    if (rc == HK_CUDA_OK)
        *cap = need;
    return rc;
}

/* Host scratch of at least bytes (grown, kept), or NULL (noted). */
static void *host_room(be_t b, size_t bytes, const char *what)
{
    cuda_t *c = ctx(b);
    size_t n = (bytes + sizeof(float) - 1) / sizeof(float);
    if (n > c->host_cap) {
        float *h = realloc(c->host, n * sizeof(float));
        if (!h) {
            note(b, HK_CUDA_ENOMEM, what);
            return NULL;
        }
        c->host = h;
        c->host_cap = n;
    }
    return c->host;
}

/* topk's outputs (lse: a double a row; p, idx, raw: k floats and ints a
 * row) for B rows of k, in floats: on the device after its scratch, one
 * block, so that one copy brings them to the host (host_room), where
 * they are dealt out. */
static size_t topk_out(int B, int k)
{
    return (size_t)B * (2 + 3 * (size_t)k);
}

/* topk's scratch and outputs for B rows of the largest k, in floats. */
static size_t topk_floats(int B)
{
    return hk_cuda_topk_scratch(B, 0) + topk_out(B, HP_BACKEND_TOPK_MAX);
}

/* The scratch the plan's projections and staging take, now. */
static int cu_reserve(be_t b, const hp_backend_plan_t *p, hp_error_t *err)
{
    cuda_t *c = ctx(b);
    size_t tile = c->i8_tile ? CU_I8_TILE : 0;
    size_t xb = (size_t)p->rows * (size_t)p->cols;
    int bf16 = (p->wmask & (1u << HK_W_BF16)) != 0;
    int i8 = (p->wmask & (1u << HK_W_I8)) && p->rows > HK_CUDA_I8_DIRECT;
    /* a smaller plan (a prefill worker's, after the scheduler's) touches
     * nothing the ops in flight use */
    size_t seg = p->stage > STAGE_MIN ? p->stage : STAGE_MIN;
    const int rows = p->rows > 0 ? p->rows : 1;
    size_t samp = topk_floats(rows), am = hk_cuda_argmax_scratch(rows, 0);
    if (samp < am)
        samp = am;
    /* topk's host copy, grown now rather than in a step */
    if (!host_room(b, topk_out(rows, HP_BACKEND_TOPK_MAX) * sizeof(float),
                   "topk's host copy"))
        return hp_error_set(err, HP_ENOMEM, "%s: out of host memory", b->name);
    if (seg <= hk_cuda_ring_seg_bytes(c->stage) && (!bf16 || xb <= c->xb_cap) &&
        (!i8 || tile) && samp <= c->samp_cap)
        return HP_OK;
    int rc = hk_cuda_stream_sync(NULL); /* nothing in flight reads them */
    stage_begin(b);
    if (rc == HK_CUDA_OK && seg > hk_cuda_ring_seg_bytes(c->stage)) {
        hk_cuda_ring_destroy(c->stage);
        c->stage = NULL;
        hp_stage_memo_clear(&c->memo);
        rc = hk_cuda_ring_create(&c->stage, seg);
    }
    if (rc == HK_CUDA_OK && bf16)
        rc = grow((void **)&c->xb, &c->xb_cap, xb, sizeof(uint16_t));
    if (rc == HK_CUDA_OK && i8)
        rc = grow((void **)&c->i8_tile, &tile, CU_I8_TILE, sizeof(float));
    if (rc == HK_CUDA_OK)
        rc = grow((void **)&c->samp, &c->samp_cap, samp, sizeof(float));
    if (rc != HK_CUDA_OK)
        return hp_error_set(err,
                            rc == HK_CUDA_ENOMEM ? HP_ENOMEM : HP_EINTERNAL,
                            "%s: scratch for %d rows of %d: %s", b->name,
                            p->rows, p->cols, hk_cuda_strerror(rc));
    return HP_OK;
}

static unsigned long cu_device_allocs(be_t b)
{
    (void)b;
    return hk_cuda_malloc_count();
}

static unsigned long cu_device_waits(be_t b)
{
    (void)b;
    return hk_cuda_sync_count();
}

static unsigned long long cu_device_wait_ns(be_t b)
{
    (void)b;
    return hk_cuda_wait_ns();
}

static unsigned long cu_host_copies(be_t b)
{
    (void)b;
    return hk_cuda_host_copies();
}

static unsigned long long cu_host_bytes(be_t b)
{
    (void)b;
    return hk_cuda_host_bytes();
}

/* The first mark (the marks are made at the first start). */
static int cu_profile_start(be_t b, hp_error_t *err)
{
    cuda_t *c = ctx(b);
    int rc = HK_CUDA_OK;
    if (!c->marks &&
        ((rc = hk_cuda_marks_create(&c->marks, PROF_MARKS)) != HK_CUDA_OK ||
         !(c->prof_of = malloc(PROF_MARKS)))) {
        hk_cuda_marks_destroy(c->marks);
        c->marks = NULL;
        return hp_error_set(err, HP_ENOMEM, "%s: op profile: %s", b->name,
                            hk_cuda_strerror(rc ? rc : HK_CUDA_ENOMEM));
    }
    c->prof_n = c->n_kinds = c->prof_full = 0;
    rc = hk_cuda_marks_record(c->marks, NULL);
    c->prof_on = rc == HK_CUDA_OK;
    return c->prof_on ? HP_OK
                      : hp_error_set(err, HP_EINTERNAL, "%s: op profile: %s",
                                     b->name, hk_cuda_strerror(rc));
}

/* The time from each mark to the next, summed by the kind of op that
 * ends it. */
static int cu_profile_stop(be_t b, hp_backend_prof_row_t *rows, int cap, int *n,
                           hp_error_t *err)
{
    cuda_t *c = ctx(b);
    int rc;
    if (!c->prof_on)
        return hp_error_set(err, HP_EBADINPUT, "%s: no op profile started",
                            b->name);
    c->prof_on = 0;
    float *ms = malloc(PROF_MARKS * sizeof(float));
    int got = 0;
    if (!ms)
        return hp_error_set(err, HP_ENOMEM, "%s: op profile", b->name);
    rc = hk_cuda_marks_read(c->marks, ms, &got);
    for (int k = 0; k < c->n_kinds && k < cap; k++) {
        snprintf(rows[k].op, sizeof(rows[k].op), "%s", c->kinds[k]);
        rows[k].ms = 0;
        rows[k].calls = 0;
    }
    for (int i = 0; i < got && i < c->prof_n; i++)
        if (c->prof_of[i] < cap) {
            rows[c->prof_of[i]].ms += ms[i];
            rows[c->prof_of[i]].calls++;
        }
    free(ms);
    *n = c->n_kinds < cap ? c->n_kinds : cap;
    if (rc != HK_CUDA_OK)
        return hp_error_set(err, HP_EINTERNAL, "%s: op profile: %s", b->name,
                            hk_cuda_strerror(rc));
    if (c->prof_full)
        return hp_error_set(err, HP_ENOMEM,
                            "%s: op profile: more than %d ops or %d kinds",
                            b->name, PROF_MARKS - 1, PROF_KINDS);
    return HP_OK;
}

static size_t cu_mem_total(be_t b)
{
    return ctx(b)->mem;
}

static size_t cu_mem_free(be_t b)
{
    size_t f = 0;
    (void)b;
    return hk_cuda_mem_info(&f, NULL) == HK_CUDA_OK ? f : 0;
}

/* ---- staging ------------------------------------------------------------ */

/* Starts an op's staging: rings an earlier op outgrew go, once the work
 * that reads them is done (rare: only a call past the plan grows one). */
static void stage_begin(be_t b)
{
    cuda_t *c = ctx(b);
    if (!c->n_retired)
        return;
    note(b, hk_cuda_stream_sync(NULL), "staging");
    for (int i = 0; i < c->n_retired; i++)
        hk_cuda_ring_destroy(c->retired[i]);
    c->n_retired = 0;
}

/* Device room for bytes, a copy of host array src unless it is NULL,
 * valid for the op being issued; or NULL (noted). A copy of the same
 * bytes made in the segment the ring is filling is handed out again (the
 * memo): ops only read the arrays they are handed, and a decode step
 * hands the same pointer lists step after step. Not an older segment's
 * copy, though the ring holds those for work queued now: this op's own
 * later puts (at most 3, each at most a segment) may enter new segments
 * before its kernels are queued, and a fourth would rewrite this one. */
static void *stage(be_t b, const void *src, size_t bytes)
{
    cuda_t *c = ctx(b);
    void *d = NULL;
    uint64_t h = 0;
    if (src && c->memo.e) {
        const uint64_t now = c->stage ? hk_cuda_ring_mark(c->stage) : 0;
        d = hp_stage_memo_find(&c->memo, src, bytes, now, &h);
        if (d)
            return d;
    }
    if (!c->stage || bytes > hk_cuda_ring_seg_bytes(c->stage)) {
        /* no ring yet (no plan), or past the plan: a larger one; arrays
         * this op was handed stay valid in the old, freed at the next op */
        size_t seg = 2 * bytes > STAGE_MIN ? 2 * bytes : STAGE_MIN;
        hk_cuda_ring_t *n = NULL;
        int rc = c->n_retired < STAGE_RETIRED ? hk_cuda_ring_create(&n, seg)
                                              : HK_CUDA_ENOMEM;
        if (rc != HK_CUDA_OK) {
            note(b, rc, "staging");
            return NULL;
        }
        if (c->stage)
            c->retired[c->n_retired++] = c->stage;
        c->stage = n;
        hp_stage_memo_clear(&c->memo);
    }
    note(b, hk_cuda_ring_put(c->stage, src, bytes, NULL, &d), "staging");
    if (src && d && c->memo.e)
        hp_stage_memo_note(&c->memo, h, src, bytes, d,
                           hk_cuda_ring_mark(c->stage));
    return d;
}

/* ---- ops ---------------------------------------------------------------- */

/* The bf16 staging of a projection's input, need elements at least: grown
 * as needed; NULL (noted) when it cannot be. */
static uint16_t *cu_xb(be_t b, size_t need)
{
    cuda_t *c = ctx(b);
    if (need > c->xb_cap) {
        hk_cuda_free(c->xb);
        c->xb = NULL;
        c->xb_cap = 0;
        int rc = hk_cuda_malloc((void **)&c->xb, need * sizeof(uint16_t));
        if (rc != HK_CUDA_OK) {
            note(b, rc, "linear (bf16 staging)");
            return NULL;
        }
        c->xb_cap = need;
    }
    return c->xb;
}

/* The staging for n rows of matrices w[0..k) (one input, same cols) when
 * every one is bf16, else NULL: a producer may write their input to it. */
static uint16_t *cu_xb_for(be_t b, const hk_weight_t *const *w, int k, int n)
{
    for (int i = 0; i < k; i++)
        if (w[i]->dtype != HK_W_BF16)
            return NULL;
    return cu_xb(b, (size_t)n * w[0]->cols);
}

/* The bf16 projections y[i] (f32, or bf16 with bf: acc 0) of the staged
 * bf16 input xs (cu_xb's, or a producer's bf16 rows) by the k bf16
 * matrices w[i] of that input: at few rows (a decode step's) one launch
 * for them all, else cuBLAS a matrix at a time. */
static void cu_project_staged(be_t b, void *const *y, uint16_t *xs,
                              const hk_weight_t *const *w, int k, int n,
                              int acc, int bf)
{
    cuda_t *c = ctx(b);
    const char *what = bf ? "linear (bf16 out)" : "linear (bf16)";
    if (c->gemv && n <= HK_CUDA_GEMV_ROWS) {
        for (int i0 = 0; i0 < k; i0 += HK_CUDA_GEMV_PARTS) {
            hk_cuda_gemv_t p = {{NULL}, {NULL}, {0}};
            const int m =
                k - i0 < HK_CUDA_GEMV_PARTS ? k - i0 : HK_CUDA_GEMV_PARTS;
            for (int i = 0; i < m; i++) {
                p.y[i] = y[i0 + i];
                p.w[i] = w[i0 + i]->data;
                p.out[i] = w[i0 + i]->rows;
            }
            note(b, hk_cuda_gemv_bf16(&p, m, xs, n, w[0]->cols, acc, bf, NULL),
                 what);
        }
        return;
    }
    for (int i = 0; i < k; i++)
        note(b,
             bf ? hk_cuda_matmul_bf16_to_bf16(y[i], NULL, w[i]->data, n,
                                              w[i]->cols, w[i]->rows, xs,
                                              c->blas, NULL)
                : hk_cuda_matmul_bf16(y[i], NULL, w[i]->data, n, w[i]->cols,
                                      w[i]->rows, acc, xs, c->blas, NULL),
             what);
}

/* A bf16 projection of the staged input (cu_xb's, rounded already). */
static void cu_linear_staged(be_t b, float *y, const hk_weight_t *w, int n,
                             int acc)
{
    void *ys = y;
    cu_project_staged(b, &ys, ctx(b)->xb, &w, 1, n, acc, 0);
}

static void cu_linear(be_t b, float *y, const float *x, const hk_weight_t *w,
                      int n, int acc)
{
    cuda_t *c = ctx(b);
    if (w->dtype == HK_W_F32) {
        note(b,
             acc ? hk_cuda_matmul_acc(y, x, w->data, n, w->cols, w->rows,
                                      c->blas, NULL)
                 : hk_cuda_matmul(y, x, w->data, n, w->cols, w->rows, c->blas,
                                  NULL),
             "linear");
        return;
    }
    if (w->dtype == HK_W_I8) {
        if (n > HK_CUDA_I8_DIRECT && !c->i8_tile) {
            int rc = hk_cuda_malloc((void **)&c->i8_tile,
                                    CU_I8_TILE * sizeof(float));
            if (rc != HK_CUDA_OK) {
                note(b, rc, "linear (I8 tile)");
                return;
            }
        }
        note(b,
             hk_cuda_linear_i8(y, x, w, n, acc, c->i8_tile,
                               c->i8_tile ? CU_I8_TILE : 0, c->blas, NULL),
             "linear (I8)");
        return;
    }
    if (w->dtype != HK_W_BF16) {
        cu_fail(b, acc ? HP_OP_LINEAR_ACC : HP_OP_LINEAR);
        return;
    }
    uint16_t *xb = cu_xb(b, (size_t)n * w->cols);
    if (!xb)
        return;
    note(b, hk_cuda_to_bf16(xb, x, (size_t)n * w->cols, NULL), "linear (bf16)");
    cu_linear_staged(b, y, w, n, acc);
}

/* Matrices of one input: x rounded to bf16 once for every bf16 one (the
 * staging holds it: same cols); all bf16, their projections together
 * (cu_project_staged: one launch at few rows). */
static void cu_linear_n(be_t b, float *const *y, const float *x,
                        const hk_weight_t *const *w, int k, int n)
{
    uint16_t *xb = cu_xb_for(b, w, k, n);
    if (xb) {
        note(b, hk_cuda_to_bf16(xb, x, (size_t)n * w[0]->cols, NULL),
             "linear (bf16)");
        cu_project_staged(b, (void *const *)y, xb, w, k, n, 0, 0);
        return;
    }
    int rounded = 0;
    for (int i = 0; i < k; i++) {
        if (w[i]->dtype == HK_W_BF16 && rounded) {
            cu_linear_staged(b, y[i], w[i], n, 0);
            continue;
        }
        rounded |= w[i]->dtype == HK_W_BF16;
        cu_linear(b, y[i], x, w[i], n, 0);
    }
}

static void cu_embed(be_t b, float *x, const hk_weight_t *w, const int *ids,
                     int T)
{
    stage_begin(b);
    const int *d = stage(b, ids, (size_t)T * sizeof(int));
    if (d)
        note(b, hk_cuda_weight_rows(x, w, d, T, NULL), "embed");
}

static void cu_rmsnorm(be_t b, float *y, const float *x, const float *w,
                       int rows, int dim, float eps)
{
    note(b, hk_cuda_rmsnorm_zc(y, x, w, rows, dim, eps, NULL), "rmsnorm");
}

static void cu_rmsnorm_gated(be_t b, float *y, const float *x, const float *z,
                             const float *w, int rows, int dim, float eps)
{
    note(b, hk_cuda_rmsnorm_gated(y, x, z, w, rows, dim, eps, NULL),
         "rmsnorm_gated");
}

static void cu_l2norm(be_t b, float *x, int rows, int dim, float eps,
                      float scale)
{
    note(b, hk_cuda_l2norm(x, rows, dim, eps, scale, NULL), "l2norm");
}

static void cu_swiglu(be_t b, float *y, const float *g, const float *u,
                      size_t n)
{
    note(b, hk_cuda_swiglu(y, g, u, n, NULL), "swiglu");
}

static void cu_split_heads(be_t be, float *a, float *b, float *c,
                           const float *x, int rows, int da, int db, int dc)
{
    note(be, hk_cuda_split_heads(a, b, c, x, rows, da, db, dc, NULL),
         "split_heads");
}

static void cu_gate_mul(be_t b, float *o, const float *gate, size_t n)
{
    note(b, hk_cuda_gate_mul(o, gate, n, NULL), "gate_mul");
}

/* The producers of a projection's input (backend.h): straight to its bf16
 * staging where the matrices are bf16 (the f32 kernels' output rounded,
 * bit for bit: hk_norm.cu), else the two ops. */
static void cu_rmsnorm_linear_n(be_t b, float *const *ys, float *y,
                                const float *x, const float *nw,
                                const hk_weight_t *const *w, int k, int T,
                                float eps)
{
    const int H = w[0]->cols;
    uint16_t *xb = cu_xb_for(b, w, k, T);
    if (!xb) {
        cu_rmsnorm(b, y, x, nw, T, H, eps);
        cu_linear_n(b, ys, y, w, k, T);
        return;
    }
    note(b, hk_cuda_rmsnorm_zc_bf16(xb, x, nw, T, H, eps, NULL), "rmsnorm");
    cu_project_staged(b, (void *const *)ys, xb, w, k, T, 0, 0);
}

static void cu_rmsnorm_gated_linear_acc(be_t b, float *x, float *o,
                                        const float *z, const float *gw,
                                        int rows, int dim, float eps,
                                        const hk_weight_t *w, int T)
{
    uint16_t *xb = cu_xb_for(b, &w, 1, T);
    if (!xb) {
        cu_rmsnorm_gated(b, o, o, z, gw, rows, dim, eps);
        cu_linear(b, x, o, w, T, 1);
        return;
    }
    note(b, hk_cuda_rmsnorm_gated_bf16(xb, o, z, gw, rows, dim, eps, NULL),
         "rmsnorm_gated");
    cu_linear_staged(b, x, w, T, 1);
}

static void cu_gate_mul_linear_acc(be_t b, float *x, float *o,
                                   const float *gate, const hk_weight_t *w,
                                   int T)
{
    const size_t n = (size_t)T * w->cols;
    uint16_t *xb = cu_xb_for(b, &w, 1, T);
    if (!xb) {
        cu_gate_mul(b, o, gate, n);
        cu_linear(b, x, o, w, T, 1);
        return;
    }
    note(b, hk_cuda_gate_mul_bf16(xb, o, gate, n, NULL), "gate_mul");
    cu_linear_staged(b, x, w, T, 1);
}

static void cu_swiglu_linear_acc(be_t b, float *x, float *g, const float *u,
                                 const hk_weight_t *w, int T)
{
    const size_t n = (size_t)T * w->cols;
    uint16_t *xb = cu_xb_for(b, &w, 1, T);
    if (!xb) {
        cu_swiglu(b, g, g, u, n);
        cu_linear(b, x, g, w, T, 1);
        return;
    }
    note(b, hk_cuda_swiglu_bf16(xb, g, u, n, NULL), "swiglu");
    cu_linear_staged(b, x, w, T, 1);
}

/* The dense MLP on bf16 hidden rows (hp_backend_mlp_acc): the input
 * rounded into the staging once (by the norm where there is one), gate
 * and up as bf16 GEMM outputs in g's and u's memory, their SwiGLU in
 * place over gate, which is the down projection's operand. */
static void cu_mlp_acc_bf16(be_t b, float *x, const float *y, float *g,
                            float *u, const float *nw, const hk_weight_t *gw,
                            const hk_weight_t *uw, const hk_weight_t *dw, int T,
                            float eps)
{
    const int H = gw->cols, I = gw->rows;
    uint16_t *gb = (void *)g, *ub = (void *)u; /* bf16 rows in f32 memory */
    uint16_t *xb = cu_xb(b, (size_t)T * H);
    if (!xb)
        return;
    if (nw)
        note(b, hk_cuda_rmsnorm_zc_bf16(xb, x, nw, T, H, eps, NULL), "rmsnorm");
    else /* y rounded into the staging, as the projection would */
        note(b, hk_cuda_to_bf16(xb, y, (size_t)T * H, NULL), "linear (bf16)");
    if (ctx(b)->gemv && T <= HK_CUDA_GEMV_ROWS) {
        /* few rows: gate, up and SwiGLU in one launch, the same bits */
        note(
            b,
            hk_cuda_gemv_bf16_swiglu(gb, gw->data, uw->data, I, xb, T, H, NULL),
            "linear (bf16 swiglu)");
    } else {
        void *const gu[2] = {gb, ub};
        const hk_weight_t *const guw[2] = {gw, uw};
        cu_project_staged(b, gu, xb, guw, 2, T, 0, 1);
        note(b, hk_cuda_swiglu_bf16_in(gb, gb, ub, (size_t)T * I, NULL),
             "swiglu");
    }
    void *xs = x;
    cu_project_staged(b, &xs, gb, &dw, 1, T, 1, 0);
}

static void cu_scale_rows(be_t b, float *x, const float *s, int rows, int dim,
                          int sigm)
{
    note(b, hk_cuda_scale_rows(x, s, rows, dim, sigm, NULL), "scale_rows");
}

static void cu_kv_store(be_t b, float *kc, float *vc, const float *k,
                        const float *v, const int *pos, int T, int kvd)
{
    stage_begin(b);
    const int *d = stage(b, pos, (size_t)T * sizeof(int));
    if (d)
        note(b, hk_cuda_kv_store(kc, vc, k, v, d, T, kvd, NULL), "kv_store");
}

static void cu_kv_store_decode(be_t b, float *const *kcs, float *const *vcs,
                               const float *k, const float *v, const int *pos,
                               int B, int kvd)
{
    stage_begin(b);
    float *const *dk = stage(b, kcs, (size_t)B * sizeof(float *));
    float *const *dv = stage(b, vcs, (size_t)B * sizeof(float *));
    const int *dp = stage(b, pos, (size_t)B * sizeof(int));
    if (dk && dv && dp)
        note(b, hk_cuda_kv_store_decode(dk, dv, k, v, dp, B, kvd, NULL),
             "kv_store_decode");
}

static void cu_argmax(be_t b, int *idx, const float *logits, int B, int V,
                      int ld)
{
    stage_begin(b);
    int *d = stage(b, NULL, (size_t)B * sizeof(int));
    if (!d)
        return;
    /* rows split over blocks where the planned scratch holds their
     * partials (a small batch fills the device), else a block a row */
    cuda_t *c = ctx(b);
    float *scr = hk_cuda_argmax_scratch(B, 0) <= c->samp_cap ? c->samp : NULL;
    note(b, hk_cuda_argmax(d, logits, B, V, ld, 0, scr, NULL), "argmax");
    cu_download(b, idx, d, (size_t)B * sizeof(int));
}

static void cu_topk(be_t b, float *p, int *idx, float *raw, double *lse,
                    const float *logits, int B, int V, int ld, int k,
                    double inv_t)
{
    cuda_t *c = ctx(b);
    if (k > HP_BACKEND_TOPK_MAX || topk_floats(B) > c->samp_cap) {
        note(b, HK_CUDA_EINVAL, "topk: past the plan (hp_backend_reserve)");
        return;
    }
    /* [lse | p | idx | raw]: the scratch is whole 32-byte records, so
     * the doubles first stay aligned; one copy of the part wanted */
    const size_t n = (size_t)B * k;
    float *out = c->samp + hk_cuda_topk_scratch(B, 0);
    float *dp = out + 2 * (size_t)B, *dr = dp + 2 * n;
    int *di = (int *)(void *)(dp + n);
    note(b,
         hk_cuda_topk(dp, di, raw ? dr : NULL,
                      lse ? (double *)(void *)out : NULL, logits, B, V, ld, k,
                      inv_t, 0, c->samp, NULL),
         "topk");
    const float *from = lse ? out : dp, *to = dp + (raw ? 3 : 2) * n;
    float *h = host_room(b, topk_out(B, k) * sizeof(float), "topk");
    if (!h)
        return;
    cu_download(b, h, from, (size_t)(to - from) * sizeof(float));
    const float *hp = h + (dp - from);
    memcpy(p, hp, n * sizeof(float));
    memcpy(idx, hp + n, n * sizeof(int));
    if (raw)
        memcpy(raw, hp + 2 * n, n * sizeof(float));
    if (lse)
        memcpy(lse, h, (size_t)B * sizeof(double));
}

static void cu_conv1d_silu(be_t b, float *y, float *state, const float *x,
                           const float *w, int T, int C, int K)
{
    note(b, hk_cuda_conv1d_silu(y, state, x, w, T, C, K, NULL), "conv1d_silu");
}

/* The conv writes q, k, v straight (cv unused), the gates in the same
 * launch: hk_cuda_conv_qkv. */
static void cu_conv_qkv(be_t b, float *q, float *k, float *v, float *cv,
                        float *state, const float *x, const float *w, float *g,
                        float *beta, const float *A_log, const float *dt_bias,
                        int T, int Hk, int Hv, int dk, int dv, int K, float eps,
                        float q_scale)
{
    (void)cv;
    note(b,
         hk_cuda_conv_qkv(q, k, v, state, x, w, g, beta, A_log, dt_bias, T, Hk,
                          Hv, dk, dv, K, eps, q_scale, NULL),
         "conv1d_silu");
}

static void cu_conv1d_silu_decode(be_t b, float *y, float *const *states,
                                  const float *x, const float *w, int B, int C,
                                  int K)
{
    stage_begin(b);
    float *const *d = stage(b, states, (size_t)B * sizeof(float *));
    if (d)
        note(b, hk_cuda_conv1d_silu_decode(y, d, x, w, B, C, K, NULL),
             "conv1d_silu_decode");
}

static void cu_conv_qkv_decode(be_t b, float *q, float *k, float *v, float *cv,
                               float *const *states, const float *x,
                               const float *w, float *g, float *beta,
                               const float *A_log, const float *dt_bias, int B,
                               int Hk, int Hv, int dk, int dv, int K, float eps,
                               float q_scale)
{
    (void)cv;
    stage_begin(b);
    float *const *d = stage(b, states, (size_t)B * sizeof(float *));
    if (d)
        note(b,
             hk_cuda_conv_qkv_decode(q, k, v, d, x, w, g, beta, A_log, dt_bias,
                                     B, Hk, Hv, dk, dv, K, eps, q_scale, NULL),
             "conv_qkv (decode)");
}

static void cu_gdn_gates(be_t b, float *g, float *beta, const float *a,
                         const float *bp, const float *A_log,
                         const float *dt_bias, int T, int Hv)
{
    note(b, hk_cuda_gdn_gates(g, beta, a, bp, A_log, dt_bias, T, Hv, NULL),
         "gdn_gates");
}

static void cu_gdn_recurrent(be_t b, float *o, float *S, const float *q,
                             const float *k, const float *v, const float *g,
                             const float *beta, int T, int Hk, int Hv, int dk,
                             int dv)
{
    note(b,
         hk_cuda_gdn_recurrent(o, S, q, k, v, g, beta, T, Hk, Hv, dk, dv, NULL),
         "gdn_recurrent");
}

static void cu_gdn_decode(be_t b, float *o, float *const *states,
                          const float *q, const float *k, const float *v,
                          const float *g, const float *beta, int B, int Hk,
                          int Hv, int dk, int dv)
{
    stage_begin(b);
    float *const *d = stage(b, states, (size_t)B * sizeof(float *));
    if (d)
        note(
            b,
            hk_cuda_gdn_decode(o, d, q, k, v, g, beta, B, Hk, Hv, dk, dv, NULL),
            "gdn_decode");
}

/* The tensor-core chunk on one sequence, chunk 64 or the largest that
 * fits the device; HK_CUDA_EINVAL (nothing launched) for a shape it
 * cannot take. */
static int chunk_tc(be_t b, float *o, float *S, float *Tc, const float *q,
                    const float *k, const float *v, const float *g,
                    const float *beta, int T, int Hk, int Hv, int dk, int dv,
                    float *scratch, unsigned flags)
{
    hk_cuda_lanes_t *lanes = ctx(b)->lanes;
    const int cu[2] = {0, T};
    stage_begin(b);
    float *const *ds = stage(b, &S, sizeof(float *));
    float *const *dt = Tc ? stage(b, &Tc, sizeof(float *)) : NULL;
    const int *dcu = stage(b, cu, sizeof(cu));
    if (!ds || (Tc && !dt) || !dcu)
        return HK_CUDA_ENOMEM; /* noted by stage */
    int rc = HK_CUDA_EINVAL;
    for (int c = HK_CUDA_GDN_MAX_C; c >= 16 && rc == HK_CUDA_EINVAL; c /= 2)
        rc =
            hk_cuda_gdn_chunk_tc_ex(o, ds, dt, q, k, v, g, beta, dcu, 1, T, Hk,
                                    Hv, dk, dv, c, scratch, flags, lanes, NULL);
    return rc;
}

/* A timed call's start (hk_cuda_tuner_begin) and its end: its time, or
 * where the call failed none, its kernel then out of the class's running
 * (hk_cuda_tuner_fail: a kernel that fails is never chosen). Only errors
 * are noted: the op's own note marks the op profile with its time. */
static void tune_begin(be_t b, hk_cuda_tuner_t *t, const char *what)
{
    const int rc = hk_cuda_tuner_begin(t, NULL);
    if (rc != HK_CUDA_OK)
        note(b, rc, what);
}

static void tune_end(be_t b, hk_cuda_tuner_t *t, int op_rc, const char *what)
{
    const int rc = op_rc == HK_CUDA_OK ? hk_cuda_tuner_end(t, NULL)
                                       : hk_cuda_tuner_fail(t);
    if (rc != HK_CUDA_OK)
        note(b, rc, what);
}

/* A call's size class for a tuner: CLASS_FIELDS small numbers of its
 * shape, of class_bits[i] bits each, packed into a key (values wider than
 * their fields alias classes: that only shares a choice of kernel);
 * lengths go in as their log2 (lg2up). */
#define CLASS_FIELDS 6
static const int class_bits[CLASS_FIELDS] = {5, 10, 12, 9, 12, 4};

static long long class_key(const int f[CLASS_FIELDS])
{
    long long key = 0;
    for (int i = 0; i < CLASS_FIELDS; i++)
        key = key << class_bits[i] | (f[i] & ((1 << class_bits[i]) - 1));
    return key;
}

static void class_fields(long long key, int f[CLASS_FIELDS])
{
    for (int i = CLASS_FIELDS - 1; i >= 0; i--) {
        f[i] = (int)(key & ((1 << class_bits[i]) - 1));
        key >>= class_bits[i];
    }
}

/* The least k with 2^k >= n (n >= 1; 0 for n < 1). */
static int lg2up(int n)
{
    int k = 0;
    while (k < 30 && (1 << k) < n)
        k++;
    return k;
}

/* The GDN chunk's state passes and output kernels the tuner picks among:
 * the same sums in the same order, bit for bit (test_gdn_chunk_same). */
static const unsigned chunk_cands[CHUNK_CANDS] = {
    0,
    HK_CUDA_GDN_TC_R64,
    HK_CUDA_GDN_TC_DEEP,
    HK_CUDA_GDN_TC_O64,
    HK_CUDA_GDN_TC_R64 | HK_CUDA_GDN_TC_O64,
    HK_CUDA_GDN_TC_DEEP | HK_CUDA_GDN_TC_O64,
    HK_CUDA_GDN_TC_W8,
    HK_CUDA_GDN_TC_W8 | HK_CUDA_GDN_TC_DEEP,
    HK_CUDA_GDN_TC_W8 | HK_CUDA_GDN_TC_O64,
    HK_CUDA_GDN_TC_W8 | HK_CUDA_GDN_TC_DEEP | HK_CUDA_GDN_TC_O64,
    HK_CUDA_GDN_TC_OVERLAP,
    HK_CUDA_GDN_TC_W8 | HK_CUDA_GDN_TC_OVERLAP};

/* The kernels a chunk call runs (an index of chunk_cands): its class's
 * fastest once tuned; until then they take turns, those of them that
 * launch other kernels than the ones before them at this shape (R64, DEEP,
 * W8 and O64 are ignored where they do not apply or fit). */
static int chunk_pick(cuda_t *c, int T, int Hk, int Hv, int dk, int dv,
                      int want_tc, unsigned flags, int *timed)
{
    const int x = want_tc | (flags & HK_CUDA_GDN_TC_ROUND ? 2 : 0);
    const int f[CLASS_FIELDS] = {lg2up(T), Hk, Hv, dk, dv, x};
    const long long key = class_key(f);
    *timed = 0;
    const int best = hk_cuda_tuner_best(c->chunk_tune, key);
    if (best >= 0)
        return best; /* settled: no mask to build */
    char kn[CHUNK_CANDS][32];
    unsigned mask = 1u;
    for (int k = 0; k < CHUNK_CANDS; k++) {
        kn[k][0] = '\0';
        if ((chunk_cands[k] & HK_CUDA_GDN_TC_OVERLAP) && !c->lanes)
            continue;
        if (hk_cuda_gdn_tc_kernels(kn[k], sizeof kn[k], T, 1, Hk, Hv, dk, dv,
                                   HK_CUDA_GDN_MAX_C, 1, want_tc,
                                   flags | chunk_cands[k]) != HK_CUDA_OK)
            continue; /* "": no other's */
        int other = 1;
        for (int j = 0; j < k; j++)
            other &= strcmp(kn[j], kn[k]) != 0;
        if (other)
            mask |= 1u << k;
    }
    return hk_cuda_tuner_pick_of(c->chunk_tune, key, mask, timed);
}

static void cu_gdn_chunk(be_t b, float *o, float *S, float *Tc, const float *q,
                         const float *k, const float *v, const float *g,
                         const float *beta, int T, int Hk, int Hv, int dk,
                         int dv, int C, float *scratch, hp_prec_t prec)
{
    gdn_mode_t mode = ctx(b)->gdn;
    if (mode != GDN_SCALAR) {
        /* bf16 precision: q, k, v rounded once, as FLA takes them, then
         * the bf16 entry's kernels (~1.2x the split f32 inputs' by an
         * H200's kernel rows) */
        cuda_t *c = ctx(b);
        unsigned flags =
            c->gdn_flags | (prec == HP_PREC_BF16 ? HK_CUDA_GDN_TC_ROUND : 0u);
        int timed = 0;
        if (c->chunk_tune)
            flags |= chunk_cands[chunk_pick(c, T, Hk, Hv, dk, dv, Tc != NULL,
                                            flags, &timed)];
        if (timed)
            tune_begin(b, c->chunk_tune, "gdn_chunk tuner");
        int rc = chunk_tc(b, o, S, Tc, q, k, v, g, beta, T, Hk, Hv, dk, dv,
                          scratch, flags);
        if (timed)
            tune_end(b, c->chunk_tune, rc, "gdn_chunk tuner");
        if (rc != HK_CUDA_EINVAL || mode == GDN_TC) {
            note(b, rc, "gdn_chunk (tensor cores)");
            return;
        }
    }
    note(b,
         hk_cuda_gdn_chunk(o, S, Tc, q, k, v, g, beta, T, Hk, Hv, dk, dv, C,
                           scratch, NULL),
         "gdn_chunk");
}

/* Room for either kernel (Hk <= Hv: Hv bounds the key heads). */
static size_t cu_gdn_chunk_scratch(be_t b, int T, int Hv, int dk, int dv, int C)
{
    size_t f32 = hk_cuda_gdn_chunk_scratch(T, Hv, dk, dv, C);
    size_t tc = ctx(b)->gdn == GDN_SCALAR
                    ? 0
                    : hk_cuda_gdn_chunk_tc_scratch(T, 1, Hv, Hv, dk, dv,
                                                   HK_CUDA_GDN_MAX_C);
    return f32 > tc ? f32 : tc;
}

/* The decode step's kernels the tuner picks among: PIPE's results bit for
 * bit (hk_cuda.h). */
static const hk_cuda_step_impl_t step_cands[STEP_CANDS] = {
    HK_CUDA_STEP_PIPE, HK_CUDA_STEP_PIPEA, HK_CUDA_STEP_PIPEW};

static void cu_gdn_step(be_t b, float *o, float *const *states,
                        float *const *conv_states, const float *qkv,
                        const float *a, const float *bp, const float *conv_w,
                        const float *A_log, const float *dt_bias, int B, int Hk,
                        int Hv, int dk, int dv, int K, float eps, float q_scale,
                        float *scratch)
{
    gdn_mode_t mode = ctx(b)->gdn;
    if (mode != GDN_SCALAR) {
        stage_begin(b);
        float *const *ds = stage(b, states, (size_t)B * sizeof(float *));
        float *const *dc = stage(b, conv_states, (size_t)B * sizeof(float *));
        if (!ds || !dc)
            return;
        cuda_t *c = ctx(b);
        hk_cuda_step_impl_t impl = HK_CUDA_STEP_DEFAULT;
        int timed = 0;
        if (c->step_tune) {
            const int f[CLASS_FIELDS] = {lg2up(B), Hk, Hv, dk, dv, K};
            impl = step_cands[hk_cuda_tuner_pick(c->step_tune, class_key(f),
                                                 &timed)];
        }
        if (timed)
            tune_begin(b, c->step_tune, "gdn_step tuner");
        int rc = hk_cuda_gdn_step_impl(impl, o, ds, dc, qkv, a, bp, conv_w,
                                       A_log, dt_bias, B, Hk, Hv, dk, dv, K,
                                       eps, q_scale, NULL);
        if (timed)
            tune_end(b, c->step_tune, rc, "gdn_step tuner");
        if (rc != HK_CUDA_EINVAL || mode == GDN_TC) {
            note(b, rc, "gdn_step (fused)");
            return;
        }
    }
    hp_backend_gdn_step_ops(b, o, states, conv_states, qkv, a, bp, conv_w,
                            A_log, dt_bias, B, Hk, Hv, dk, dv, K, eps, q_scale,
                            scratch);
}

/* Appends to buf (cap bytes; NULL with cap 0) at *len, snprintf's way:
 * *len grows by what the text needs, whether it fit or not. */
static void report_put(char *buf, size_t cap, size_t *len, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void report_put(char *buf, size_t cap, size_t *len, const char *fmt, ...)
{
    const size_t at = *len < cap ? *len : cap;
    va_list ap;
    va_start(ap, fmt);
    const int w = vsnprintf(buf ? buf + at : NULL, cap - at, fmt, ap);
    va_end(ap);
    *len += w > 0 ? (size_t)w : 0;
}

/* What a tuner's report says of it: its op, the names of its class's
 * fields (NULL: not printed; bit i of lg: field i is a log2, printed as
 * "<=" its power of 2) and of its kernels. */
typedef struct {
    const char *op;
    const char *field[CLASS_FIELDS];
    unsigned lg;
    const char *const *kernel;
    int n;
} tune_desc_t;

/* The decode step's kernels (step_cands), the GDN chunk's passes
 * (chunk_cands; x: T_C + 2 rounded inputs) and the attention prefill's
 * kernels (att_cands). */
static const char *const step_names[STEP_CANDS] = {"pipe", "pipea", "pipew"};
static const char *const chunk_names[CHUNK_CANDS] = {
    "default", "r64",     "deep",   "o64",         "r64+o64", "deep+o64",
    "w8",      "w8+deep", "w8+o64", "w8+deep+o64", "ov",      "w8+ov"};
static const char *const att_names[ATT_CANDS] = {"flash3_seq", "flash3_ws",
                                                 "flash3"};
static const tune_desc_t step_desc = {
    .op = "gdn_step",
    .field = {"B", "Hk", "Hv", "dk", "dv", "K"},
    .lg = 1u,
    .kernel = step_names,
    .n = STEP_CANDS,
};
static const tune_desc_t chunk_desc = {
    .op = "gdn_chunk",
    .field = {"T", "Hk", "Hv", "dk", "dv", "x"},
    .lg = 1u,
    .kernel = chunk_names,
    .n = CHUNK_CANDS,
};
static const tune_desc_t att_desc = {
    .op = "attention",
    .field = {"T", "Hkv", "Hq", "hd", "N", NULL},
    .lg = 1u | 16u,
    .kernel = att_names,
    .n = ATT_CANDS,
};

/* One tuner's classes into buf at *len: the op, its class's fields, the
 * kernel it runs (or "tuning") and each kernel's least time. */
static void tuned_lines(hk_cuda_tuner_t *t, const tune_desc_t *d, char *buf,
                        size_t cap, size_t *len)
{
    long long key;
    int best, f[CLASS_FIELDS];
    float ms[HK_CUDA_TUNER_MAX_CAND];
    for (int i = 0; t && hk_cuda_tuner_class(t, i, &key, &best, ms) == 0; i++) {
        class_fields(key, f);
        report_put(buf, cap, len, "%s", d->op);
        for (int j = 0; j < CLASS_FIELDS; j++)
            if (d->field[j] && (d->lg >> j & 1u))
                report_put(buf, cap, len, " %s<=%lld", d->field[j],
                           1LL << f[j]);
            else if (d->field[j])
                report_put(buf, cap, len, " %s=%d", d->field[j], f[j]);
        report_put(buf, cap, len, ": %s (",
                   best >= 0 ? d->kernel[best] : "tuning");
        for (int k = 0; k < d->n; k++)
            if (ms[k] < 0)
                report_put(buf, cap, len, "%s%s -", k ? ", " : "",
                           d->kernel[k]);
            else
                report_put(buf, cap, len, "%s%s %.3f", k ? ", " : "",
                           d->kernel[k], ms[k]);
        report_put(buf, cap, len, " ms)\n");
    }
}

static size_t cu_tuned(be_t b, char *buf, size_t cap)
{
    cuda_t *c = ctx(b);
    size_t len = 0;
    tuned_lines(c->step_tune, &step_desc, buf, cap, &len);
    tuned_lines(c->chunk_tune, &chunk_desc, buf, cap, &len);
    tuned_lines(c->att_tune, &att_desc, buf, cap, &len);
    return len;
}

static void cu_rope(be_t b, float *x, const int *pos, int T, int nh, int hd,
                    int rot, double theta)
{
    stage_begin(b);
    const int *d = stage(b, pos, (size_t)T * sizeof(int));
    if (d)
        note(b, hk_cuda_rope(x, d, T, nh, hd, rot, theta, NULL), "rope");
}

/* The fused prologue (hk_cuda_qk_norm_rope), else (heads past
 * HK_CUDA_QK_MAX_HD) its five kernels. */
static void cu_qk_norm_rope(be_t b, float *q, float *gate, float *k,
                            const float *P, const float *qw, const float *kw,
                            const int *pos, int T, int Hq, int Hkv, int hd,
                            int rot, double theta, float eps)
{
    stage_begin(b);
    const int *d = stage(b, pos, (size_t)T * sizeof(int));
    if (!d)
        return;
    if (hd <= HK_CUDA_QK_MAX_HD) {
        note(b,
             hk_cuda_qk_norm_rope(q, gate, k, P, qw, kw, d, T, Hq, Hkv, hd, rot,
                                  theta, eps, NULL),
             "qk_norm_rope");
        return;
    }
    note(b, hk_cuda_split_heads(q, gate, NULL, P, T * Hq, hd, hd, 0, NULL),
         "qk_norm_rope");
    note(b, hk_cuda_rmsnorm_zc(q, q, qw, T * Hq, hd, eps, NULL),
         "qk_norm_rope");
    note(b, hk_cuda_rmsnorm_zc(k, k, kw, T * Hkv, hd, eps, NULL),
         "qk_norm_rope");
    note(b, hk_cuda_rope(q, d, T, Hq, hd, rot, theta, NULL), "qk_norm_rope");
    note(b, hk_cuda_rope(k, d, T, Hkv, hd, rot, theta, NULL), "qk_norm_rope");
}

static void cu_rope_shift(be_t b, float *x, int delta, int T, int nh, int hd,
                          int rot, double theta)
{
    note(b, hk_cuda_rope_shift(x, delta, T, nh, hd, rot, theta, NULL),
         "rope_shift");
}

/* The prefill's kernels by precision: the defaults for f32 and bf16
 * operands (FLASH2X; FLASH3_SEQ on Hopper, else FLASH2), or
 * HYPIC_CUDA_ATT's for both. */
static hk_cuda_att_impl_t cu_att_impl(hp_prec_t prec)
{
    return prec == HP_PREC_BF16 ? HK_CUDA_ATT_DEFAULT_BF16
                                : HK_CUDA_ATT_DEFAULT;
}

/* The bf16 prefill's kernels the tuner picks among: the same products
 * and softmax steps in the same order, bit for bit
 * (test_attention_flash3), the same scratch. */
static const hk_cuda_att_impl_t att_cands[ATT_CANDS] = {
    HK_CUDA_ATT_FLASH3_SEQ, HK_CUDA_ATT_FLASH3_WS, HK_CUDA_ATT_FLASH3};

/* The prefill (hk_cuda_attention_ex); with scratch for FLASH2's bf16
 * copies of k and v (FLASH2X's hi and lo halves, FLASH3's bf16 tiles)
 * when that is the choice. With the tuner, bf16 operands run its pick (a
 * FLASH3 kernel that refuses a shape: the default's way instead). */
static void cu_attention(be_t b, float *o, const float *q, const int *qpos,
                         const float *k, const float *v, int T, int N, int Hq,
                         int Hkv, int hd, float scale, hp_prec_t prec,
                         float *scratch)
{
    cuda_t *c = ctx(b);
    stage_begin(b);
    const int *d = stage(b, qpos, (size_t)T * sizeof(int));
    if (!d)
        return;
    const hk_cuda_att_impl_t dflt = cu_att_impl(prec);
    hk_cuda_att_impl_t impl = dflt;
    int timed = 0;
    if (c->att_tune && prec == HP_PREC_BF16) {
        const int f[CLASS_FIELDS] = {lg2up(T), Hkv, Hq, hd, lg2up(N), 0};
        impl = att_cands[hk_cuda_tuner_pick(c->att_tune, class_key(f), &timed)];
    }
    if (timed)
        tune_begin(b, c->att_tune, "attention tuner");
    int rc = hk_cuda_attention_ex(impl, o, q, d, k, v, T, N, Hq, Hkv, hd, scale,
                                  scratch, NULL);
    if (timed)
        tune_end(b, c->att_tune, rc, "attention tuner");
    if (rc == HK_CUDA_EINVAL && impl != dflt)
        rc = hk_cuda_attention_ex(dflt, o, q, d, k, v, T, N, Hq, Hkv, hd, scale,
                                  scratch, NULL);
    note(b, rc, "attention");
}

/* Prefill: none (online softmax per tile), except FLASH2's bf16 copies of
 * the N keys and values (FLASH2, DEFAULT_BF16), twice that for FLASH2X's
 * hi and lo halves (DEFAULT), FLASH3's tiles (flash3: FLASH2's, N rounded
 * up to 64 keys), and FLASH2's partials where a short prompt splits the
 * keys (hk_cuda_attention_scratch: any call of at most T queries).
 * Decode (T = 1; a one-token prefill may take either op) splits
 * the keys of each (request, kv group) over blocks while B Hkv is under
 * four blocks per SM (hk_cuda_attention_decode_scratch): B Hkv splits
 * < 8 SMs, so B Hq splits < 8 SMs Hq whatever B and Hkv are, each split
 * keeping 2 + hd floats per query head. */
static size_t cu_attention_scratch(be_t b, int T, int N, int Hq, int Hkv,
                                   int hd, hp_prec_t prec)
{
    size_t n = hk_cuda_attention_scratch(cu_att_impl(prec), T, N, Hq, Hkv, hd);
    size_t dec = (size_t)8 * ctx(b)->sms * Hq * (2 + HK_CUDA_ATT_TC_MAX_HD);
    return T == 1 && dec > n ? dec : n;
}

static void cu_attention_decode(be_t b, float *o, const float *q,
                                const float *const *kcs,
                                const float *const *vcs, const int *n_ctx,
                                int B, int Hq, int Hkv, int hd, float scale,
                                float *scratch)
{
    stage_begin(b);
    const float *const *dk = stage(b, kcs, (size_t)B * sizeof(float *));
    const float *const *dv = stage(b, vcs, (size_t)B * sizeof(float *));
    const int *dn = stage(b, n_ctx, (size_t)B * sizeof(int));
    /* flash-decoding needs the scratch its split takes: the plan's (see
     * cu_attention_scratch) unless the head dim is past its bound */
    float *scr = hk_cuda_attention_decode_scratch(B, Hq, Hkv, hd) <=
                         cu_attention_scratch(b, 1, 0, Hq, Hkv, hd, HP_PREC_F32)
                     ? scratch
                     : NULL;
    if (dk && dv && dn)
        note(b,
             hk_cuda_attention_decode_ex(HK_CUDA_ATT_DEFAULT, o, q, dk, dv, dn,
                                         B, Hq, Hkv, hd, scale, scr, NULL),
             "attention_decode");
}

static void cu_moe_route(be_t b, int *idx, float *w, const float *logits, int T,
                         int E, int k, int renorm)
{
    note(b, hk_cuda_moe_route(idx, w, logits, T, E, k, renorm, NULL),
         "moe_route");
}

/* offs is the host's: planned on the device, then copied back. */
static void cu_moe_plan(be_t b, int *offs, int *rows, float *scale, int *slot,
                        const int *idx, const float *w, int T, int k, int E)
{
    stage_begin(b);
    int *d = stage(b, NULL, (size_t)(E + 1) * sizeof(int));
    if (!d)
        return;
    note(b, hk_cuda_moe_plan(d, rows, scale, slot, idx, w, T, k, E, NULL),
         "moe_plan");
    cu_download(b, offs, d, (size_t)(E + 1) * sizeof(int));
}

static void cu_moe_gather(be_t b, float *xg, const float *y, const int *rows,
                          int n, int H)
{
    note(b, hk_cuda_moe_gather(xg, y, rows, n, H, NULL), "moe_gather");
}

static void cu_moe_scatter(be_t b, float *x, const float *eo, const int *rows,
                           int n, int H)
{
    note(b, hk_cuda_moe_scatter(x, eo, rows, n, H, NULL), "moe_scatter");
}

static void cu_moe_combine(be_t b, float *x, const float *eo, const int *slot,
                           int T, int k, int H)
{
    note(b, hk_cuda_moe_combine(x, eo, slot, T, k, H, NULL), "moe_combine");
}

static void cu_axpy(be_t b, float *y, float a, const float *x, size_t n)
{
    note(b, hk_cuda_axpy(y, a, x, n, NULL), "axpy");
}

/* Built on the host and uploaded: no kernel for it. */
static void cu_trans_identity(be_t b, float *T, int H, int dk)
{
    size_t n = (size_t)H * dk * dk;
    float *h = host_room(b, n * sizeof(float), "trans_identity");
    if (!h)
        return;
    hp_backend_cpu_iface.trans_identity(b, h, H, dk);
    /* synchronous from pageable memory: host may reuse it at once */
    note(b, hk_cuda_h2d(T, h, n * sizeof(float), NULL), "trans_identity");
    note(b, hk_cuda_stream_sync(NULL), "trans_identity");
}

static void cu_trans_compose(be_t b, float *out, hk_trans_family_t fam,
                             const float *T, const float *S, const float *S0,
                             int H, int dk, int dv, float *scratch)
{
    note(b,
         hk_cuda_trans_compose(out, fam, T, S, S0, H, dk, dv, scratch,
                               ctx(b)->blas, NULL),
         "trans_compose");
}

static void cu_trans_chain(be_t b, float *T1, float *S1, hk_trans_family_t fam,
                           const float *T2, const float *S2, int H, int dk,
                           int dv, float *scratch)
{
    note(b,
         hk_cuda_trans_chain(T1, S1, fam, T2, S2, H, dk, dv, scratch,
                             ctx(b)->blas, NULL),
         "trans_chain");
}

/* ---- KVBuffer ----------------------------------------------------------- */

static size_t cu_kvbuf_block_floats(be_t b, const hk_kvbuf_geom_t *g)
{
    (void)b;
    return hk_kvbuf_layout_floats(g);
}

static size_t cu_kvbuf_scratch(be_t b, const hk_kvbuf_geom_t *g, int T,
                               int lmax, int nth)
{
    (void)b, (void)g, (void)T, (void)lmax, (void)nth;
    return 16; /* none: the coefficients live in shared memory */
}

/* Entries of view r a call reads or writes: len + T (a step) or n[r] (a
 * flush, T = 0). */
static int view_entries(const hk_kvbuf_view_t *vw, const int *n, int r, int T)
{
    return n ? n[r] : vw[r].len + T;
}

/* The views as the kernels take them: R views whose block lists (the
 * blocks of view_entries) point into a staged copy of the lists, and
 * n [R] (unless NULL) after them, at *dn. Both through the staging ring,
 * as every host array an op takes: a synchronous upload here drained the
 * stream at every linear layer of a KVBuffer step. Returns the device
 * views, or NULL (noted). */
static const hk_kvbuf_view_t *stage_views(be_t b, const hk_kvbuf_view_t *vw,
                                          const int *n, int R, int T,
                                          const hk_kvbuf_geom_t *g,
                                          const int **dn, const char *what)
{
    /* the rows' block ids (and flush's counts after them) go first, then
     * the views that point into their copy: two puts, no wait; a row's
     * ids unchanged since an earlier step are not copied again */
    size_t nb = 0, vb = (size_t)R * sizeof(hk_kvbuf_view_t);
    for (int r = 0; r < R; r++)
        nb += (size_t)(view_entries(vw, n, r, T) + g->bs - 1) / g->bs;
    size_t ib = (nb + (n ? (size_t)R : 0)) * sizeof(int);
    char *h = host_room(b, vb + ib, what);
    if (!h)
        return NULL;
    hk_kvbuf_view_t *hv = (hk_kvbuf_view_t *)(void *)h;
    int *ids = (int *)(void *)(h + vb), *at = ids;
    for (int r = 0; r < R; r++) {
        int k = (view_entries(vw, n, r, T) + g->bs - 1) / g->bs;
        memcpy(at, vw[r].blocks, (size_t)k * sizeof(int));
        at += k;
    }
    if (n)
        memcpy(at, n, (size_t)R * sizeof(int));
    stage_begin(b);
    const int *dids = stage(b, ids, ib);
    if (!dids)
        return NULL;
    for (int r = 0; r < R; r++) {
        int k = (view_entries(vw, n, r, T) + g->bs - 1) / g->bs;
        hv[r] = (hk_kvbuf_view_t){vw[r].S, dids, vw[r].len};
        dids += k;
    }
    if (n)
        *dn = dids;
    return stage(b, hv, vb);
}

static void cu_kvbuf_step(be_t b, float *o, float *arena,
                          const hk_kvbuf_view_t *vw, const float *q,
                          const float *k, const float *v, const float *g,
                          const float *beta, int R, int T,
                          const hk_kvbuf_geom_t *geom, int lmax, float *scratch,
                          int nth)
{
    (void)scratch, (void)nth;
    const hk_kvbuf_view_t *d =
        stage_views(b, vw, NULL, R, T, geom, NULL, "kvbuf_step");
    if (d)
        note(b,
             hk_cuda_kvbuf_step(o, arena, d, q, k, v, g, beta, R, T, geom, lmax,
                                NULL),
             "kvbuf_step");
}

static void cu_kvbuf_flush(be_t b, float *arena, const hk_kvbuf_view_t *vw,
                           const int *n, int R, const hk_kvbuf_geom_t *geom,
                           float *scratch, int nth)
{
    (void)scratch, (void)nth;
    const int *dn = NULL;
    const hk_kvbuf_view_t *d =
        stage_views(b, vw, n, R, 0, geom, &dn, "kvbuf_flush");
    if (d)
        note(b, hk_cuda_kvbuf_flush(arena, d, dn, R, geom, NULL),
             "kvbuf_flush");
}

static void cu_kvbuf_conv_commit(be_t b, float *state, const float *x, int m,
                                 int C, int K)
{
    note(b, hk_cuda_kvbuf_conv_commit(state, x, m, C, K, NULL),
         "kvbuf_conv_commit");
}

static const hp_backend_i cuda_iface = {
    .close = cu_close,
    .supports_dtype = cu_supports,
    .sync = cu_sync,
    .fail = cu_fail,
    .alloc = cu_alloc,
    .realloc = cu_realloc,
    .free = cu_free,
    .memset0 = cu_memset0,
    .upload = cu_upload,
    .download = cu_download,
    .copy = cu_copy,
    .place = cu_place,
    .unplace = cu_unplace,
    .reserve = cu_reserve,
    .device_allocs = cu_device_allocs,
    .device_waits = cu_device_waits,
    .device_wait_ns = cu_device_wait_ns,
    .host_bytes = cu_host_bytes,
    .host_copies = cu_host_copies,
    .mem_total = cu_mem_total,
    .mem_free = cu_mem_free,
    .lost = cu_lost,
    .lock = cu_lock,
    .unlock = cu_unlock,
    .profile_start = cu_profile_start,
    .profile_stop = cu_profile_stop,
    .tuned = cu_tuned,
    .linear = cu_linear,
    .linear_n = cu_linear_n,
    .rmsnorm_linear_n = cu_rmsnorm_linear_n,
    .rmsnorm_gated_linear_acc = cu_rmsnorm_gated_linear_acc,
    .gate_mul_linear_acc = cu_gate_mul_linear_acc,
    .swiglu_linear_acc = cu_swiglu_linear_acc,
    .mlp_acc_bf16 = cu_mlp_acc_bf16,
    .embed = cu_embed,
    .rmsnorm = cu_rmsnorm,
    .rmsnorm_gated = cu_rmsnorm_gated,
    .l2norm = cu_l2norm,
    .swiglu = cu_swiglu,
    .split_heads = cu_split_heads,
    .gate_mul = cu_gate_mul,
    .scale_rows = cu_scale_rows,
    .kv_store = cu_kv_store,
    .kv_store_decode = cu_kv_store_decode,
    .argmax = cu_argmax,
    .topk = cu_topk,
    .conv1d_silu = cu_conv1d_silu,
    .conv_qkv = cu_conv_qkv,
    .conv1d_silu_decode = cu_conv1d_silu_decode,
    .conv_qkv_decode = cu_conv_qkv_decode,
    .qk_norm_rope = cu_qk_norm_rope,
    .gdn_gates = cu_gdn_gates,
    .gdn_recurrent = cu_gdn_recurrent,
    .gdn_decode = cu_gdn_decode,
    .gdn_chunk = cu_gdn_chunk,
    .gdn_chunk_scratch = cu_gdn_chunk_scratch,
    .gdn_step = cu_gdn_step,
    /* the unfused chain's: auto falls back to it on shapes the fused
     * kernel cannot take */
    .gdn_step_scratch = hp_backend_gdn_step_floats,
    .rope = cu_rope,
    .rope_shift = cu_rope_shift,
    .attention = cu_attention,
    .attention_scratch = cu_attention_scratch,
    .attention_decode = cu_attention_decode,
    .moe_route = cu_moe_route,
    .moe_plan = cu_moe_plan,
    .moe_gather = cu_moe_gather,
    .moe_scatter = cu_moe_scatter,
    .moe_combine = cu_moe_combine,
    .trans_identity = cu_trans_identity,
    .trans_compose = cu_trans_compose,
    .axpy = cu_axpy,
    .trans_chain = cu_trans_chain,
    .kvbuf_block_floats = cu_kvbuf_block_floats,
    .kvbuf_scratch = cu_kvbuf_scratch,
    .kvbuf_step = cu_kvbuf_step,
    .kvbuf_flush = cu_kvbuf_flush,
    .kvbuf_conv_commit = cu_kvbuf_conv_commit,
};

int hp_backend_cuda_open(const hp_backend_t **b, int device, hp_error_t *err)
{
    int n = 0, rc = hk_cuda_device_count(&n);
    *b = NULL;
    if (rc != HK_CUDA_OK)
        return hp_error_set(err, HP_EUNAVAIL, "device cuda:%d: %s", device,
                            hk_cuda_strerror(rc));
    if (device >= n)
        return hp_error_set(err, HP_EUNAVAIL, "device cuda:%d: %s", device,
                            n == 0 ? "no CUDA device (or no driver) here"
                                   : "no such device");
    if ((rc = hk_cuda_set_device(device)) != HK_CUDA_OK)
        return hp_error_set(err, HP_EUNAVAIL, "device cuda:%d: %s", device,
                            hk_cuda_strerror(rc));
    static const char *const modes[] = {
        "auto",    "tc",      "scalar",    "tc_v1", "tc_fast", "tc_a1",
        "tc_bf16", "tc_p",    "tc_bf16_p", "tc_a3", "tc_ro",   "tc_a3ro",
        "tc_r64",  "tc_deep", "tc_w8",     "tc_ov"};
    static const unsigned mode_flags[] = {
        0,
        0,
        0,
        HK_CUDA_GDN_TC_V1,
        HK_CUDA_GDN_TC_FAST,
        HK_CUDA_GDN_TC_A1,
        HK_CUDA_GDN_TC_ROUND | HK_CUDA_GDN_TC_FAST,
        HK_CUDA_GDN_TC_SMEM,
        HK_CUDA_GDN_TC_ROUND | HK_CUDA_GDN_TC_FAST | HK_CUDA_GDN_TC_SMEM,
        HK_CUDA_GDN_TC_A3,
        HK_CUDA_GDN_TC_FUSE_O,
        HK_CUDA_GDN_TC_A3 | HK_CUDA_GDN_TC_FUSE_O,
        HK_CUDA_GDN_TC_R64,
        HK_CUDA_GDN_TC_DEEP,
        HK_CUDA_GDN_TC_W8,
        HK_CUDA_GDN_TC_OVERLAP};
    const char *e = getenv("HYPIC_CUDA_GDN");
    int gdn = e && *e ? -1 : GDN_AUTO;
    for (int i = 0; gdn < 0 && i < (int)(sizeof(modes) / sizeof(*modes)); i++)
        gdn = strcmp(e, modes[i]) ? -1 : i;
    if (gdn < 0)
        return hp_error_set(err, HP_EBADINPUT,
                            "HYPIC_CUDA_GDN=%s: expected auto, tc, scalar, "
                            "tc_v1, tc_fast, tc_a1, tc_bf16, tc_p, "
                            "tc_bf16_p, tc_a3, tc_ro, tc_a3ro, tc_r64, "
                            "tc_deep, tc_w8 or tc_ov",
                            e);
    cuda_t *c = calloc(1, sizeof(*c));
    if (!c)
        return hp_error_set(err, HP_ENOMEM, "device cuda:%d: out of memory",
                            device);
    if ((rc = hk_cuda_blas_create(&c->blas)) != HK_CUDA_OK) {
        free(c);
        return hp_error_set(err, HP_EUNAVAIL, "device cuda:%d: cuBLAS: %s",
                            device, hk_cuda_strerror(rc));
    }
    c->device = device;
    pthread_mutex_init(&c->mu, NULL);
    pthread_cond_init(&c->turn, NULL);
    const char *gv = getenv("HYPIC_CUDA_GEMV");
    c->gemv = !(gv && !strcmp(gv, "0"));
    /* without its memory, no memo: every array copied, as with =0 */
    const char *sm = getenv("HYPIC_CUDA_STAGE_MEMO");
    if (!(sm && !strcmp(sm, "0")) &&
        hp_stage_memo_init(&c->memo, MEMO_ENTRIES, MEMO_BYTES) != 0)
        hp_stage_memo_free(&c->memo);
    c->gdn = gdn > GDN_SCALAR ? GDN_TC : (gdn_mode_t)gdn;
    c->gdn_flags = mode_flags[gdn];
    /* the chunk's lanes: tc_ov's and the tuner's (without them tc_ov
     * runs the launches on one stream, and the tuner has no OVERLAP) */
    if (c->gdn != GDN_SCALAR && hk_cuda_lanes_create(&c->lanes) != HK_CUDA_OK) {
        c->lanes = NULL;
        c->gdn_flags &= ~HK_CUDA_GDN_TC_OVERLAP;
    }
    /* with HYPIC_CUDA_TUNE=1 and no step kernel named, the first 3 steps
     * of each size class time each kernel (no tuner if its events cannot
     * be made: HYPIC_CUDA_STEP's default then) */
    const char *tu = getenv("HYPIC_CUDA_TUNE");
    const char *st = getenv("HYPIC_CUDA_STEP"), *at = getenv("HYPIC_CUDA_ATT");
    const int tune = tu && !strcmp(tu, "1");
    if (tune && !(st && *st) &&
        hk_cuda_tuner_create(&c->step_tune, STEP_CANDS, 3) != HK_CUDA_OK)
        c->step_tune = NULL;
    /* ... and of each GDN chunk's, where the mode names no pass (R64,
     * DEEP, W8) nor OVERLAP */
    if (tune && c->gdn != GDN_SCALAR &&
        !(c->gdn_flags & (HK_CUDA_GDN_TC_R64 | HK_CUDA_GDN_TC_DEEP |
                          HK_CUDA_GDN_TC_W8 | HK_CUDA_GDN_TC_OVERLAP)) &&
        hk_cuda_tuner_create(&c->chunk_tune, CHUNK_CANDS, 3) != HK_CUDA_OK)
        c->chunk_tune = NULL;
    /* ... and of each bf16 attention prefill's, where HYPIC_CUDA_ATT names
     * no kernel and the default is FLASH3_SEQ (a Hopper device) */
    if (tune && !(at && *at) &&
        hk_cuda_attention_kernel(HK_CUDA_ATT_DEFAULT_BF16) ==
            HK_CUDA_ATT_FLASH3_SEQ &&
        hk_cuda_tuner_create(&c->att_tune, ATT_CANDS, 3) != HK_CUDA_OK)
        c->att_tune = NULL;
    {
        size_t mem = 0;
        if (hk_cuda_device_info(c->self.device, sizeof(c->self.device), &c->sms,
                                &mem) != HK_CUDA_OK ||
            c->sms < 1)
            c->sms = 1;
        c->mem = mem;
    }
    c->self.iface = &cuda_iface;
    c->self.ctx = c;
    c->self.host_memory = 0;
    snprintf(c->self.name, sizeof(c->self.name), "cuda:%d", device);
    *b = &c->self;
    return HP_OK;
}
