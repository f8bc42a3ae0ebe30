/*
 * gpu_kernels.c - the CUDA kernels (kernels/cuda) at the shapes of
 * Qwen3.5-0.8B and Qwen3-Next: time (CUDA events), tokens/s, achieved
 * GB/s or TFLOP/s, against the device's copy bandwidth (cudaMemcpy device
 * to device). Built by `make bench` where nvcc exists; run on the GPU host
 * by tools/device-check.sh.
 *
 *   gpu_kernels [--out FILE.tsv] [--dump DIR] [--budget SECONDS] [--tiny]
 *               [--only PREFIX] [--legacy]
 *
 * Measured (in this order, the most wanted first):
 *   copy_d2d                       1 GiB, bytes read + written
 *   gdn_chunk_{f32,bf16,f32mma}[_tc]  prefill, T = 4k, 16k, 64k (C = 64;
 *                                  _tc: with T_C): the f32 kernel, the
 *                                  tensor-core one on bf16 inputs and on
 *                                  f32 inputs (the engine's default,
 *                                  HYPIC_CUDA_GDN=auto; f32 is =scalar);
 *                                  {bf16,f32mma}_fast: one bf16 MMA per
 *                                  product (HK_CUDA_GDN_TC_FAST);
 *                                  bf16_fasta: and kernel A's too (_FAST_A);
 *                                  (each in registers, R, where dk
 *                                  allows); {bf16,f32mma}_p, bf16_fasta_p:
 *                                  the state pass in shared memory
 *                                  (kernel P, HK_CUDA_GDN_TC_SMEM);
 *                                  f32mma_round: f32 in, rounded to bf16
 *                                  once, then bf16_fast (_ROUND:
 *                                  HYPIC_CUDA_GDN=tc_bf16's call);
 *                                  f32mma_bf16in: rounded once, then
 *                                  bf16 (a bf16 checkpoint's call);
 *                                  {bf16,f32mma}_v1: the older structure,
 *                                  outputs in the sequential pass;
 *                                  {bf16,f32mma}_a1: the first kernel A
 *                                  (HK_CUDA_GDN_TC_A1); {bf16,f32mma}_a3
 *                                  (each after its default, untimed so
 *                                  far): kernel A3, A's loads in flight
 *                                  (HK_CUDA_GDN_TC_A3); bf16_ro, _a3ro,
 *                                  f32mma_bf16in_a3ro (a bf16
 *                                  checkpoint's call with both), f32mma_ro
 *                                  (untimed): the outputs fused into the
 *                                  state pass (HK_CUDA_GDN_TC_FUSE_O);
 *                                  bf16_r64, f32mma_bf16in_r64 (untimed):
 *                                  kernel R on 64 columns and 8 warps
 *                                  where 32 make more blocks than SMs
 *                                  (HK_CUDA_GDN_TC_R64; T_C on Next's
 *                                  heads); bf16_deep,
 *                                  f32mma_bf16in_deep (untimed): R with
 *                                  each chunk's tiles two chunks ahead
 *                                  (HK_CUDA_GDN_TC_DEEP); bf16_o64
 *                                  (untimed): kernel O on 64 columns
 *                                  (HK_CUDA_GDN_TC_O64); bf16_w8,
 *                                  f32mma_bf16in_w8 (untimed): R on 8
 *                                  state warps (HK_CUDA_GDN_TC_W8);
 *                                  _ps: the state
 *                                  pass single-buffered, two blocks an SM
 *                                  (HK_CUDA_GDN_TC_PSHARE); at T = 16k each
 *                                  tensor-core row is followed by its
 *                                  launches' times, phase_<op>.<launch>,
 *                                  and the phases inside them (in-kernel
 *                                  probes), probe_<op>.<kernel>.<phase>
 *   gdn_step[_kh|_pipe|_pipe32|_pipea|_pipew] / gdn_decode /
 *   gdn_decode_chain               decode, B = 1, 16, 64, 256:
 *                                  the fused step; the unfused recurrence
 *                                  alone; the unfused chain (conv, split,
 *                                  2 l2norm, gates, recurrence). GB/s
 *                                  counts state bytes read + written;
 *                                  states rotate over >= 256 MB of sets so
 *                                  no step finds them in L2; at B >= 64
 *                                  each gdn_step row is followed by its
 *                                  kernel's in-kernel probes,
 *                                  probe_<op>.<kernel>.<phase>;
 *                                  gdn_step_input[_fused]: the input path
 *                                  alone, its 5 launches against
 *                                  hk_cuda_conv_qkv_decode (the KVBuffer
 *                                  step's), GB/s of x, q k v, the states
 *   kvbuf_{step,flush,decode}[_v1|_cw128|_cw64|_cw32]  the KVBuffer at
 *                                  B = 1, 16, 64, 256: chunkwise step,
 *                                  flush, their average, each against
 *                                  gdn_step timed in the same call; no
 *                                  suffix: the v2 kernels (default slab),
 *                                  _v1 the first ones, _cwN v2 at N
 *                                  columns a block; kvbuf_verify[_v1]:
 *                                  4 and 8 drafts, v2 (S0 read once for
 *                                  all T tokens) and v1, each against T
 *                                  v2 decode steps; GB/s from the
 *                                  traffic model (bench_kvbuf)
 *   attention_decode[_1blk|_simple]  B requests x 4096 keys; GB/s of K
 *                                  and V: flash-decoding (keys split over
 *                                  blocks, with scratch); the same kernel
 *                                  one block per (request, group) (the
 *                                  engine's call, no scratch); the first
 *                                  kernel (one block per (request, head))
 *   attention_decode_paged         the same requests' keys on pages of
 *                                  P = 16 and 64 positions (params P=),
 *                                  the pages of all requests shuffled
 *                                  over one arena; flash-decoding with
 *                                  scratch, as attention_decode
 *   sample_{argmax[_1blk],topk}    next-token choice over B = 1, 16, 64,
 *                                  256 rows of the vocabulary (248320,
 *                                  151936), top-k at k = 20 and 256:
 *                                  rows split over blocks (with scratch)
 *                                  or one block a row; GB/s of the logits
 *                                  read once (bench_sample)
 *   matmul_{f32,bf16}              cuBLAS at the models' projections
 *                                  (n = 4096, 64, 4, 1); at n <= 4 also
 *                                  matmul_bf16_gemv (hk_cuda_gemv_bf16),
 *                                  GB/s of the weights; matmul_bf16_n4[_gemv]
 *                                  a GDN layer's four in-projections at
 *                                  n = 1, 4: cuBLAS a matrix each against
 *                                  one launch; matmul_bf16_swiglu[_gemv]
 *                                  a dense MLP's gate, up and SwiGLU at
 *                                  n = 1, 4: two launches against one
 *                                  (hk_cuda_gemv_bf16_swiglu)
 *   prefill_{conv_qkv,rmsnorm_gated[_bf16]}  T = 16k: the GDN input path
 *                                  (hk_cuda_conv_qkv) and output norm (T Hv
 *                                  rows of dv); prefill_{swiglu_bf16_in,
 *                                  rmsnorm_bf16} at a 9B-like dense
 *                                  model's widths (16k x 12288, 16k x
 *                                  4096); GB/s of bytes read + written;
 *                                  prefill_qk_norm_rope[_unfused] at T =
 *                                  16k and 4: an attention layer's split,
 *                                  q / k norms and RoPE, one launch
 *                                  against five
 *   attention_append_{flash2x,flash2}  T = 64, 128, 512 queries at the
 *                                  end of N = 16k, 32k keys (PIC seams, a
 *                                  resume), split over the keys where the
 *                                  row blocks are under a wave (splits=)
 *   attention_prefill[_flash2|_flash2x|_bf16|_simple]  causal, T = 4k,
 *                                  16k, 64k (simple: to 16k); TFLOP/s
 *                                  (causal flops, 4 Hq hd T(T+1)/2):
 *                                  flash2: FlashAttention-2's structure on
 *                                  bf16 operands (its k/v conversion pass
 *                                  included); flash2x: the same on hi/lo
 *                                  split operands (f32 accuracy, 3 MMAs a
 *                                  product); the wmma kernel with hi/lo
 *                                  split operands (f32 accuracy, the
 *                                  default), with bf16 operands; the first
 *                                  kernel
 * A row past the budget is printed as skipped. --dump DIR writes, for a
 * small shape of each op, the inputs and our outputs (raw little-endian
 * arrays and a meta.txt per case) for bench/gpu_kernels_ref.py, which runs
 * FLA and torch on the same inputs and a float64 reference. --tiny runs
 * toy shapes (the host emulator's plumbing check). --only PREFIX measures
 * (and dumps) only the ops whose names start with PREFIX, copy_d2d always.
 * --legacy times the GDN chunk variants earlier device runs decided
 * against too (chunk_vars; their dumps are always written).
 *
 * Inputs are synthetic, as the model makes them: q, k rows unit-norm
 * (q / sqrt(dk)), gates from hk_math_gdn_gate over the HF initialisation
 * ranges; q, k, v are rounded to bf16 values so the f32 and bf16 kernels
 * (and FLA's) see the same numbers. Long inputs repeat a block of rows.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "bench/bench_util.h"
#include "engine/forward/kvbuf.h"
#include "kernels/common/hk_bf16.h"
#include "kernels/common/hk_math.h"
#include "kernels/cuda/hk_cuda.h"

typedef struct {
    const char *name;
    int Hk, Hv, dk, dv;   /* GDN */
    int Hq, Hkv, hd;      /* full attention */
    int hidden, qkv, mlp; /* projections: hidden -> qkv (GDN), -> mlp */
} model_t;

static const model_t models[] = {
    {"qwen3.5-0.8b", 16, 16, 128, 128, 8, 2, 256, 1024, 6144, 3584},
    {"qwen3-next", 16, 32, 128, 128, 16, 2, 256, 2048, 12288, 512}};
static const model_t tiny_model = {"tiny", 1, 2, 32, 32, 2, 1, 32, 64, 96, 80};

#define CHUNK      64
#define CONV_K     4
#define NORM_EPS   1e-6f
#define ROPE_THETA 1e7 /* Qwen3.5's rope_theta */
#define ROT_BYTES                                                              \
    (256u << 20) /* state sets cycled through per decode bench                 \
                  */

static FILE *tsv;
static const char *dump_dir, *only;
static double copy_gbs; /* copy_d2d's GB/s, once measured */
static double t_begin, budget = 1e9;
static int tiny, legacy;
static uint64_t rng = BENCH_SEED;

/* ---- plumbing ------------------------------------------------------------ */

static void die(const char *what, int rc)
{
    printf("Bail out! %s: %s (%d)\n", what, hk_cuda_strerror(rc), rc);
    exit(1);
}

#define CK(call)                                                               \
    do {                                                                       \
        int rc_ = (call);                                                      \
        if (rc_)                                                               \
            die(#call, rc_);                                                   \
    } while (0)

static void *dalloc(size_t bytes)
{
    void *p = NULL;
    CK(hk_cuda_malloc(&p, bytes));
    return p;
}

static void *halloc(size_t bytes)
{
    void *p = malloc(bytes ? bytes : 1);
    if (!p) {
        printf("Bail out! out of host memory\n");
        exit(1);
    }
    return p;
}

static double nrand(void)
{
    const double u1 = bench_unif(&rng), u2 = bench_unif(&rng);
    return sqrt(-2.0 * log(1.0 - u1)) * cos(2.0 * M_PI * u2);
}

static float bf16_round(float x)
{
    return hk_bf16_to_f32(hk_bf16_from_f32(x));
}

/* Device buffer of total bytes from a host block of hb bytes, repeated. */
static void *dev_tiled(const void *h, size_t hb, size_t total)
{
    void *d = dalloc(total);
    const size_t first = hb < total ? hb : total;
    CK(hk_cuda_h2d(d, h, first, NULL));
    for (size_t at = first; at < total;) {
        const size_t n = at < total - at ? at : total - at;
        CK(hk_cuda_d2d((char *)d + at, d, n, NULL));
        at += n;
    }
    CK(hk_cuda_stream_sync(NULL));
    return d;
}

static uint16_t *to_bf16(const float *x, size_t n)
{
    uint16_t *b = halloc(n * sizeof(uint16_t));
    for (size_t i = 0; i < n; i++)
        b[i] = hk_bf16_from_f32(x[i]);
    return b;
}

/* --only: is op one of the ops to run (or a family prefix of them)?
 * copy_d2d always: every family's GB/s are read against it. */
static int wanted(const char *op)
{
    return !only || !strcmp(op, "copy_d2d") ||
           !strncmp(op, only, strlen(only)) || !strncmp(only, op, strlen(op));
}

/* Would measure() time op (not only a family that holds it)? */
static int measured(const char *op)
{
    return wanted(op) && (!only || !strcmp(op, "copy_d2d") ||
                          !strncmp(op, only, strlen(only)));
}

static int over_budget(void)
{
    return bench_now() - t_begin > budget;
}

/* One result row: stdout and the TSV. rate, gbps, tflops < 0: none. */
static void emit(const char *op, const char *model, const char *params,
                 double ms, int reps, double rate, double gbps, double tflops,
                 const char *note)
{
    char r[32] = "-", g[32] = "-", f[32] = "-", m[32] = "-";
    if (ms >= 0)
        snprintf(m, sizeof m, "%.4f", ms);
    if (rate >= 0)
        snprintf(r, sizeof r, "%.4g", rate);
    if (gbps >= 0)
        snprintf(g, sizeof g, "%.1f", gbps);
    if (tflops >= 0)
        snprintf(f, sizeof f, "%.2f", tflops);
    printf("| %-24s | %-13s | %-34s | %10s | %4d | %10s | %7s | %6s | %s |\n",
           op, model, params, m, reps, r, g, f, note ? note : "");
    fprintf(tsv, "%s\t%s\t%s\t%s\t%d\t%s\t%s\t%s\t%s\n", op, model, params, m,
            reps, r, g, f, note ? note : "");
    fflush(stdout);
    fflush(tsv);
}

static void skipped(const char *op, const char *model, const char *params,
                    const char *why)
{
    emit(op, model, params, -1, 0, -1, -1, -1, why);
}

/* The op to time: rep counts calls (0 = warm-up), so decode benches can
 * rotate state sets. Returns an hk_cuda status. */
typedef int (*op_fn)(void *ctx, int rep);

static int cmp_dbl(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

#define MAX_REPS 50
#define REP_MS   100.0
/* Median milliseconds of the op: one warm-up call, then at least 3 timed
 * calls and up to ~REP_MS of them (1 when the warm-up took over 1 s).
 * Why 100: the GDN chunk family has ~46 rows a shape since session 20 and
 * its 64k rows took 200 ms each; a median of 12 or more multi-ms calls is
 * as steady. Returns < 0 (and *rc) on an error. */
static double time_op(op_fn f, void *ctx, int *reps, int *rc)
{
    hk_cuda_timer_t t = {0};
    double ms[MAX_REPS], warm = 0.0, total = 0.0;
    int n = 0;
    *reps = 0;
    if ((*rc = hk_cuda_timer_create(&t)))
        return -1;
    if ((*rc = hk_cuda_timer_start(&t, NULL)) || (*rc = f(ctx, 0)) ||
        (*rc = hk_cuda_timer_stop(&t, NULL, &warm)))
        goto out;
    const int want = tiny ? 1 : warm > 1000.0 ? 1 : 3;
    while (n < MAX_REPS && (n < want || (total < REP_MS && !tiny))) {
        if ((*rc = hk_cuda_timer_start(&t, NULL)) || (*rc = f(ctx, n + 1)) ||
            (*rc = hk_cuda_timer_stop(&t, NULL, &ms[n])))
            goto out;
        total += ms[n++];
    }
out:
    hk_cuda_timer_destroy(&t);
    *reps = n;
    if (*rc || n == 0)
        return -1;
    qsort(ms, (size_t)n, sizeof(double), cmp_dbl);
    return ms[n / 2];
}

/* Times f and prints its row; work = tokens (rate), bytes (GB/s) and
 * flops (TFLOP/s), each 0 when not meaningful. ref_ms > 0: the note
 * compares with gdn_step's ref_ms, the op's time / per (a KVBuffer flush
 * serves cap tokens) against it. */
static double measure_vs(const char *op, const char *model, const char *params,
                         op_fn f, void *ctx, double tokens, double bytes,
                         double flops, double ref_ms, double per)
{
    if (!measured(op))
        return -1;
    if (over_budget()) {
        skipped(op, model, params, "skipped: budget");
        return -1;
    }
    int reps = 0, rc = 0;
    char note[160];
    const double ms = time_op(f, ctx, &reps, &rc);
    if (ms < 0) {
        snprintf(note, sizeof note, "error: %s", hk_cuda_strerror(rc));
        emit(op, model, params, -1, reps, -1, -1, -1, note);
        return -1;
    }
    const double s = ms * 1e-3, gbs = bytes > 0 ? bytes / s * 1e-9 : -1;
    int at = 0;
    note[0] = 0;
    if (gbs > 0 && copy_gbs > 0)
        at = snprintf(note, sizeof note, "%.0f %% of copy%s",
                      100.0 * gbs / copy_gbs, ref_ms > 0 ? "; " : "");
    if (ref_ms > 0 && per > 1)
        snprintf(note + at, sizeof note - at,
                 "/%g: %.4f ms a token; vs gdn_step %.4f ms: x%.2f", per,
                 ms / per, ref_ms, ref_ms / (ms / per));
    else if (ref_ms > 0)
        snprintf(note + at, sizeof note - at, "vs gdn_step %.4f ms: x%.2f",
                 ref_ms, ref_ms / ms);
    emit(op, model, params, ms, reps, tokens > 0 ? tokens / s : -1, gbs,
         flops > 0 ? flops / s * 1e-12 : -1, note);
    return ms;
}

static double measure(const char *op, const char *model, const char *params,
                      op_fn f, void *ctx, double tokens, double bytes,
                      double flops)
{
    return measure_vs(op, model, params, f, ctx, tokens, bytes, flops, 0, 1);
}

/* ---- dumps for gpu_kernels_ref.py ---------------------------------------- */

static char case_dir[512];

static void dump_begin(const char *name, const char *meta)
{
    snprintf(case_dir, sizeof case_dir, "%s/%s", dump_dir, name);
    mkdir(dump_dir, 0755);
    mkdir(case_dir, 0755);
    char p[600];
    snprintf(p, sizeof p, "%s/meta.txt", case_dir);
    FILE *f = fopen(p, "w");
    if (!f) {
        printf("Bail out! cannot write %s\n", p);
        exit(1);
    }
    fputs(meta, f);
    fclose(f);
}

/* name.f32 / name.i32 from host memory. */
static void dump_host(const char *name, const void *h, size_t bytes)
{
    char p[600];
    snprintf(p, sizeof p, "%s/%s", case_dir, name);
    FILE *f = fopen(p, "wb");
    if (!f || fwrite(h, 1, bytes, f) != bytes) {
        printf("Bail out! cannot write %s\n", p);
        exit(1);
    }
    fclose(f);
}

static void dump_dev(const char *name, const void *d, size_t bytes)
{
    void *h = halloc(bytes);
    CK(hk_cuda_d2h(h, d, bytes, NULL));
    dump_host(name, h, bytes);
    free(h);
}

/* ---- copy bandwidth ------------------------------------------------------ */

typedef struct {
    void *a, *b;
    size_t bytes;
} copy_ctx;

static int copy_run(void *ctx, int rep)
{
    const copy_ctx *c = ctx;
    (void)rep;
    return hk_cuda_d2d(c->b, c->a, c->bytes, NULL);
}

static void bench_copy(void)
{
    copy_ctx c = {NULL, NULL, tiny ? (size_t)4 << 20 : (size_t)1 << 30};
    c.a = dalloc(c.bytes);
    c.b = dalloc(c.bytes);
    CK(hk_cuda_memset0(c.a, c.bytes, NULL));
    char p[64];
    snprintf(p, sizeof p, "bytes=%zu", c.bytes);
    const double ms =
        measure("copy_d2d", "-", p, copy_run, &c, 0, 2.0 * c.bytes, 0);
    if (ms > 0)
        copy_gbs = 2.0 * c.bytes / (ms * 1e-3) * 1e-9;
    CK(hk_cuda_free(c.a));
    CK(hk_cuda_free(c.b));
}

/* ---- GDN inputs ------------------------------------------------------------
 */

/* Host rows of a GDN problem (R tokens), q, k, v already bf16 values. */
typedef struct {
    int R, Hk, Hv, dk, dv;
    float *q, *k, *v, *g, *beta, *S0;
    float A_log[64], dtb[64];
} gdn_host_t;

static void unit_row(float *x, int n, double scale)
{
    double t[512], ss = 0.0;
    for (int i = 0; i < n; i++) {
        t[i] = nrand();
        ss += t[i] * t[i];
    }
    for (int i = 0; i < n; i++)
        x[i] = bf16_round((float)(t[i] / sqrt(ss + 1e-6) * scale));
}

static void gdn_host_make(gdn_host_t *p, const model_t *m, int R)
{
    p->R = R, p->Hk = m->Hk, p->Hv = m->Hv, p->dk = m->dk, p->dv = m->dv;
    const size_t nq = (size_t)R * m->Hk * m->dk, nv = (size_t)R * m->Hv * m->dv;
    const size_t ng = (size_t)R * m->Hv, ns = (size_t)m->Hv * m->dk * m->dv;
    p->q = halloc((2 * nq + nv + 2 * ng + ns) * 4); /* one block */
    p->k = p->q + nq;
    p->v = p->k + nq;
    p->g = p->v + nv;
    p->beta = p->g + ng;
    p->S0 = p->beta + ng;
    for (int h = 0; h < m->Hv; h++) {
        const double A = 1.0 + 15.0 * bench_unif(&rng);
        const double dt = exp(log(1e-3) + bench_unif(&rng) * log(100.0));
        p->A_log[h] = (float)log(A);
        p->dtb[h] = (float)log(expm1(dt));
    }
    for (size_t r = 0; r < (size_t)R * m->Hk; r++) {
        unit_row(p->q + r * m->dk, m->dk, 1.0 / sqrt((double)m->dk));
        unit_row(p->k + r * m->dk, m->dk, 1.0);
    }
    for (size_t e = 0; e < nv; e++)
        p->v[e] = bf16_round((float)nrand());
    for (size_t e = 0; e < (size_t)R * m->Hv; e++) {
        const int h = (int)(e % m->Hv);
        p->g[e] =
            hk_math_gdn_gate((float)(1.5 * nrand()), p->A_log[h], p->dtb[h]);
        p->beta[e] = hk_math_sigmoid((float)(2.0 * nrand()));
    }
    for (size_t e = 0; e < ns; e++)
        p->S0[e] = (float)(0.1 * nrand());
}

/* ---- GDN chunked prefill ---------------------------------------------------
 */

/* the chunk kernels measured: hk_cuda_gdn_chunk, hk_cuda_gdn_chunk_bf16,
 * hk_cuda_gdn_chunk_tc */
enum { CH_F32, CH_BF16, CH_F32MMA, CH_KINDS };

typedef struct {
    int T, Hk, Hv, dk, dv, kind, tc;
    unsigned flags; /* the _ex entries' */
    float *q, *k, *v, *g, *beta, *o, *S, *Tc, *scr;
    uint16_t *qb, *kb, *vb;
    float **states, **tcs; /* device tables of one pointer */
    int *cu;
    hk_cuda_lanes_t *lanes; /* HK_CUDA_GDN_TC_OVERLAP's */
} chunk_ctx;

static int chunk_run(void *ctx, int rep)
{
    const chunk_ctx *c = ctx;
    (void)rep;
    if (c->kind == CH_BF16)
        return hk_cuda_gdn_chunk_bf16_ex(
            c->o, c->states, c->tc ? c->tcs : NULL, c->qb, c->kb, c->vb, c->g,
            c->beta, c->cu, 1, c->T, c->Hk, c->Hv, c->dk, c->dv, CHUNK, c->scr,
            c->flags, c->lanes, NULL);
    if (c->kind == CH_F32MMA)
        return hk_cuda_gdn_chunk_tc_ex(c->o, c->states, c->tc ? c->tcs : NULL,
                                       c->q, c->k, c->v, c->g, c->beta, c->cu,
                                       1, c->T, c->Hk, c->Hv, c->dk, c->dv,
                                       CHUNK, c->scr, c->flags, c->lanes, NULL);
    return hk_cuda_gdn_chunk(c->o, c->S, c->tc ? c->Tc : NULL, c->q, c->k, c->v,
                             c->g, c->beta, c->T, c->Hk, c->Hv, c->dk, c->dv,
                             CHUNK, c->scr, NULL);
}

static void chunk_setup(chunk_ctx *c, const gdn_host_t *p, int T)
{
    memset(c, 0, sizeof *c);
    c->T = T, c->Hk = p->Hk, c->Hv = p->Hv, c->dk = p->dk, c->dv = p->dv;
    const size_t rq = (size_t)p->Hk * p->dk, rv = (size_t)p->Hv * p->dv;
    const size_t R = (size_t)p->R;
    uint16_t *qb = to_bf16(p->q, R * rq), *kb = to_bf16(p->k, R * rq);
    uint16_t *vb = to_bf16(p->v, R * rv);
    c->q = dev_tiled(p->q, R * rq * 4, (size_t)T * rq * 4);
    c->k = dev_tiled(p->k, R * rq * 4, (size_t)T * rq * 4);
    c->v = dev_tiled(p->v, R * rv * 4, (size_t)T * rv * 4);
    c->qb = dev_tiled(qb, R * rq * 2, (size_t)T * rq * 2);
    c->kb = dev_tiled(kb, R * rq * 2, (size_t)T * rq * 2);
    c->vb = dev_tiled(vb, R * rv * 2, (size_t)T * rv * 2);
    c->g = dev_tiled(p->g, R * p->Hv * 4, (size_t)T * p->Hv * 4);
    c->beta = dev_tiled(p->beta, R * p->Hv * 4, (size_t)T * p->Hv * 4);
    c->o = dalloc((size_t)T * rv * 4);
    const size_t ns = (size_t)p->Hv * p->dk * p->dv;
    c->S = dev_tiled(p->S0, ns * 4, ns * 4);
    c->Tc = dalloc((size_t)p->Hv * p->dk * p->dk * 4);
    const size_t s1 = hk_cuda_gdn_chunk_scratch(T, p->Hv, p->dk, p->dv, CHUNK);
    const size_t s2 =
        hk_cuda_gdn_chunk_tc_scratch(T, 1, p->Hk, p->Hv, p->dk, p->dv, CHUNK);
    /* the f32-in entry's scratch holds the bf16 one's and more */
    c->scr = dalloc((s1 > s2 ? s1 : s2) * 4);
    c->states = dalloc(sizeof(float *));
    c->tcs = dalloc(sizeof(float *));
    CK(hk_cuda_h2d(c->states, &c->S, sizeof(float *), NULL));
    CK(hk_cuda_h2d(c->tcs, &c->Tc, sizeof(float *), NULL));
    const int cu[2] = {0, T};
    c->cu = dalloc(sizeof cu);
    CK(hk_cuda_h2d(c->cu, cu, sizeof cu, NULL));
    CK(hk_cuda_lanes_create(&c->lanes));
    free(qb);
    free(kb);
    free(vb);
}

static void chunk_free(chunk_ctx *c)
{
    void *bufs[] = {c->q, c->k, c->v,  c->qb,  c->kb,     c->vb,  c->g, c->beta,
                    c->o, c->S, c->Tc, c->scr, c->states, c->tcs, c->cu};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        CK(hk_cuda_free(bufs[i]));
    hk_cuda_lanes_destroy(c->lanes);
}

/* The variants: kernel, flags, op name and the dump files' suffix
 * (gpu_kernels_ref.py's), each timed without and with T_C (legacy ones
 * only with --legacy, or an --only that names them: kernel P, v1, the
 * first kernel A and PSHARE lost to the defaults on the H100 and H200 of
 * sessions 11-15, and their rows took a third of the family's budget,
 * which then ran out before the Next heads at 64k). */
static const struct {
    int kind;
    unsigned flags;
    const char *op, *var;
    int legacy; /* decided by earlier device runs: timed with --legacy */
} chunk_vars[] = {
    {CH_F32, 0, "gdn_chunk_f32", "f32", 0},
    {CH_BF16, 0, "gdn_chunk_bf16", "bf16", 0},
    {CH_BF16, HK_CUDA_GDN_TC_OVERLAP, "gdn_chunk_bf16_ov", "bf16ov", 0},
    {CH_BF16, HK_CUDA_GDN_TC_A3, "gdn_chunk_bf16_a3", "bf16a3", 0},
    {CH_BF16, HK_CUDA_GDN_TC_FUSE_O, "gdn_chunk_bf16_ro", "bf16ro", 0},
    {CH_BF16, HK_CUDA_GDN_TC_A3 | HK_CUDA_GDN_TC_FUSE_O, "gdn_chunk_bf16_a3ro",
     "bf16a3ro", 0},
    {CH_BF16, HK_CUDA_GDN_TC_R64, "gdn_chunk_bf16_r64", "bf16r64", 0},
    {CH_BF16, HK_CUDA_GDN_TC_DEEP, "gdn_chunk_bf16_deep", "bf16deep", 0},
    {CH_BF16, HK_CUDA_GDN_TC_O64, "gdn_chunk_bf16_o64", "bf16o64", 0},
    {CH_BF16, HK_CUDA_GDN_TC_W8, "gdn_chunk_bf16_w8", "bf16w8", 0},
    {CH_BF16, HK_CUDA_GDN_TC_FAST, "gdn_chunk_bf16_fast", "bf16fast", 0},
    {CH_BF16, HK_CUDA_GDN_TC_FAST | HK_CUDA_GDN_TC_FAST_A,
     "gdn_chunk_bf16_fasta", "bf16fasta", 0},
    {CH_BF16, HK_CUDA_GDN_TC_FAST | HK_CUDA_GDN_TC_FAST_A | HK_CUDA_GDN_TC_SMEM,
     "gdn_chunk_bf16_fasta_p", "bf16fastap", 1},
    {CH_BF16, HK_CUDA_GDN_TC_SMEM, "gdn_chunk_bf16_p", "bf16p", 1},
    {CH_BF16, HK_CUDA_GDN_TC_V1, "gdn_chunk_bf16_v1", "bf16v1", 1},
    {CH_F32MMA, 0, "gdn_chunk_f32mma", "f32mma", 0},
    {CH_F32MMA, HK_CUDA_GDN_TC_A3, "gdn_chunk_f32mma_a3", "f32mmaa3", 0},
    {CH_F32MMA, HK_CUDA_GDN_TC_SMEM, "gdn_chunk_f32mma_p", "f32mmap", 1},
    {CH_F32MMA, HK_CUDA_GDN_TC_FAST, "gdn_chunk_f32mma_fast", "f32mmafast", 0},
    {CH_F32MMA, HK_CUDA_GDN_TC_ROUND | HK_CUDA_GDN_TC_FAST,
     "gdn_chunk_f32mma_round", "f32mmaround", 0},
    {CH_F32MMA, HK_CUDA_GDN_TC_ROUND, "gdn_chunk_f32mma_bf16in", "f32mmabf16in",
     0},
    {CH_F32MMA, HK_CUDA_GDN_TC_ROUND | HK_CUDA_GDN_TC_OVERLAP,
     "gdn_chunk_f32mma_bf16in_ov", "f32mmabf16inov", 0},
    {CH_F32MMA,
     HK_CUDA_GDN_TC_ROUND | HK_CUDA_GDN_TC_A3 | HK_CUDA_GDN_TC_FUSE_O,
     "gdn_chunk_f32mma_bf16in_a3ro", "f32mmabf16ina3ro", 0},
    {CH_F32MMA, HK_CUDA_GDN_TC_ROUND | HK_CUDA_GDN_TC_R64,
     "gdn_chunk_f32mma_bf16in_r64", "f32mmabf16inr64", 0},
    {CH_F32MMA, HK_CUDA_GDN_TC_ROUND | HK_CUDA_GDN_TC_DEEP,
     "gdn_chunk_f32mma_bf16in_deep", "f32mmabf16indeep", 0},
    {CH_F32MMA, HK_CUDA_GDN_TC_ROUND | HK_CUDA_GDN_TC_W8,
     "gdn_chunk_f32mma_bf16in_w8", "f32mmabf16inw8", 0},
    {CH_F32MMA, HK_CUDA_GDN_TC_FUSE_O, "gdn_chunk_f32mma_ro", "f32mmaro", 0},
    {CH_F32MMA, HK_CUDA_GDN_TC_V1, "gdn_chunk_f32mma_v1", "f32mmav1", 1},
    {CH_BF16, HK_CUDA_GDN_TC_A1, "gdn_chunk_bf16_a1", "bf16a1", 1},
    {CH_F32MMA, HK_CUDA_GDN_TC_A1, "gdn_chunk_f32mma_a1", "f32mmaa1", 1},
    {CH_BF16, HK_CUDA_GDN_TC_PSHARE, "gdn_chunk_bf16_ps", "bf16ps", 1},
    {CH_F32MMA, HK_CUDA_GDN_TC_PSHARE, "gdn_chunk_f32mma_ps", "f32mmaps", 1},
};
#define N_CHUNK_VARS (int)(sizeof chunk_vars / sizeof chunk_vars[0])

/* Whether variant v / 2 is timed: not legacy, or --legacy, or an --only
 * that names more than the family (e.g. gdn_chunk_bf16_v1). */
static int chunk_var_on(int v)
{
    const char *op = chunk_vars[v / 2].op;
    return !chunk_vars[v / 2].legacy || legacy ||
           (only && strlen(only) > strlen("gdn_chunk_") &&
            !strncmp(op, only, strlen(only)));
}

/* op of variant v / 2, "_tc" appended when v is odd */
static const char *chunk_op(int v, char *buf, size_t n)
{
    snprintf(buf, n, "%s%s", chunk_vars[v / 2].op, v % 2 ? "_tc" : "");
    return buf;
}

/* Where a tensor-core variant's time goes (hk_cuda_gdn_tc_phases): the
 * median of 5 profiled calls per launch, one row each, op
 * "phase_<op>.<launch>" (split: the f32 entry's q/k/v split; A: kernel A;
 * P: the state pass, B for v1; O: the outputs). The rows' sum is about
 * the op's own row (the events add a little). The pass's row notes the
 * kernels that ran (hk_cuda_gdn_tc_kernels: R where the state pass ran in
 * registers). */
static void chunk_phases(const char *op, const char *model, const char *params,
                         chunk_ctx *c, double *med)
{
    const int v1 = (c->flags & HK_CUDA_GDN_TC_V1) != 0;
    const char *names[HK_CUDA_GDN_TC_PHASES] = {"split", "A", v1 ? "B" : "P",
                                                "O"};
    enum { NREP = 5 };
    double ms[NREP][HK_CUDA_GDN_TC_PHASES];
    const int reps = tiny ? 1 : NREP;
    if (over_budget())
        return;
    CK(hk_cuda_gdn_tc_profile(1));
    for (int r = 0; r < reps; r++) {
        CK(chunk_run(c, r));
        CK(hk_cuda_gdn_tc_phases(ms[r]));
    }
    CK(hk_cuda_gdn_tc_profile(0));
    char kn[48] = "kernels ";
    if (hk_cuda_gdn_tc_kernels(kn + 8, sizeof kn - 8, c->T, 1, c->Hk, c->Hv,
                               c->dk, c->dv, CHUNK, c->kind == CH_F32MMA, c->tc,
                               c->flags))
        kn[0] = 0;
    for (int i = 0; i < HK_CUDA_GDN_TC_PHASES; i++) {
        if ((i == 0 && c->kind == CH_BF16) || (i == 3 && v1))
            continue; /* not launched */
        double x[NREP];
        for (int r = 0; r < reps; r++)
            x[r] = ms[r][i];
        qsort(x, (size_t)reps, sizeof(double), cmp_dbl);
        med[i] = x[reps / 2];
        char name[64];
        snprintf(name, sizeof name, "phase_%s.%s", op, names[i]);
        emit(name, model, params, x[reps / 2], reps, -1, -1, -1,
             i == 2 ? kn : NULL);
    }
}

/* Where each kernel's time goes inside it (hk_cuda_probe): one probed
 * call of run, a row per kernel and phase, op "probe_<op>.<kernel>.<phase>"
 * (the probes' kernels and phases: hk_gdn_tc_*.cu, hk_gdn_step.cu). Its ms
 * is the phase's share of a block's time times ms_of(kernel, arg), the
 * kernel's launch time; the note gives its cycles a block (and a point:
 * for a loop's phases, an iteration's) and, in the span rows, the blocks
 * an SM ran at once. Kernels without probes give no rows. */
static void probe_call(const char *op, const char *model, const char *params,
                       int (*run)(void *, int), void *ctx,
                       double (*ms_of)(const char *kernel, const void *arg),
                       const void *arg)
{
    hk_cuda_probe_row_t rows[64];
    int n = 0, dropped = 0;
    if (over_budget())
        return;
    CK(hk_cuda_probe(tiny ? (size_t)1 << 18 : (size_t)16 << 20));
    CK(run(ctx, 0));
    CK(hk_cuda_probe_rows(rows, 64, &n, &dropped));
    CK(hk_cuda_probe(0));
    for (int i = 0; i < n; i++) {
        const hk_cuda_probe_row_t *r = &rows[i];
        const int span = !strcmp(r->phase, "span");
        char name[128], note[160];
        snprintf(name, sizeof name, "probe_%.48s.%.15s.%.15s", op, r->kernel,
                 r->phase);
        if (span)
            snprintf(note, sizeof note,
                     "%.0f cycles a block, %.2f blocks an SM, %lld blocks%s",
                     r->cycles, r->resident, r->blocks,
                     dropped ? ", launches dropped" : "");
        else
            snprintf(note, sizeof note,
                     "%.0f cycles a block (%.0f a point), "
                     "%.1f %%",
                     r->cycles,
                     r->points
                         ? r->cycles * (double)r->blocks / (double)r->points
                         : 0.0,
                     100.0 * r->share);
        emit(name, model, params, r->share * ms_of(r->kernel, arg), 1, -1, -1,
             -1, note);
    }
}

/* The GDN chunk's kernels' times: chunk_phases' medians (A, P, O). */
static double chunk_kernel_ms(const char *kernel, const void *arg)
{
    const double *med = arg;
    return med[kernel[0] == 'A' ? 1 : kernel[0] == 'R' ? 2 : 3];
}

static void bench_chunk(const model_t *m, int T)
{
    char params[128];
    snprintf(params, sizeof params, "T=%d,Hk=%d,Hv=%d,dk=%d,dv=%d,C=%d", T,
             m->Hk, m->Hv, m->dk, m->dv, CHUNK);
    if (over_budget()) {
        for (int v = 0; v < 2 * N_CHUNK_VARS; v++) {
            char op[48];
            if (chunk_var_on(v))
                skipped(chunk_op(v, op, sizeof op), m->name, params,
                        "skipped: budget");
        }
        return;
    }
    gdn_host_t p;
    gdn_host_make(&p, m, T < 4096 ? T : 4096);
    chunk_ctx c;
    chunk_setup(&c, &p, T);
    /* nominal flops: the recurrence's 3 dk dv and the chunk terms
     * C (dk + dv) per token and head, 2 per multiply-add; Tc 2 dk^2 more */
    const double base = 2.0 * T * m->Hv *
                        (3.0 * m->dk * m->dv + (double)CHUNK * (m->dk + m->dv));
    for (int v = 0; v < 2 * N_CHUNK_VARS; v++) {
        if (!chunk_var_on(v))
            continue;
        c.kind = chunk_vars[v / 2].kind;
        c.flags = chunk_vars[v / 2].flags;
        c.tc = v % 2;
        const double fl = base + (c.tc ? 4.0 * T * m->Hv * m->dk * m->dk : 0.0);
        char op[48];
        const double ms = measure(chunk_op(v, op, sizeof op), m->name, params,
                                  chunk_run, &c, T, 0, fl);
        /* --tiny (the emulator's plumbing check): the defaults' only;
         * OVERLAP's launches overlap, so no phase is its own */
        if (ms >= 0 && c.kind != CH_F32 &&
            !(c.flags & HK_CUDA_GDN_TC_OVERLAP) &&
            (tiny ? !c.flags : T == 16384)) {
            double med[HK_CUDA_GDN_TC_PHASES] = {0};
            chunk_phases(op, m->name, params, &c, med);
            probe_call(op, m->name, params, chunk_run, &c, chunk_kernel_ms,
                       med);
        }
    }
    chunk_free(&c);
    free(p.q);
}

/* Inputs and our outputs of one chunked prefill, each variant from S0. */
static void dump_chunk(const model_t *m, int T)
{
    gdn_host_t p;
    gdn_host_make(&p, m, T);
    chunk_ctx c;
    chunk_setup(&c, &p, T);
    char meta[256], name[64];
    snprintf(meta, sizeof meta,
             "op gdn_chunk\nmodel %s\nT %d\nHk %d\nHv %d\ndk %d\ndv %d\nC %d\n",
             m->name, T, m->Hk, m->Hv, m->dk, m->dv, CHUNK);
    snprintf(name, sizeof name, "gdn_chunk-%s", m->name);
    dump_begin(name, meta);
    const size_t nq = (size_t)T * m->Hk * m->dk, nv = (size_t)T * m->Hv * m->dv;
    const size_t ns = (size_t)m->Hv * m->dk * m->dv;
    dump_host("q.f32", p.q, nq * 4);
    dump_host("k.f32", p.k, nq * 4);
    dump_host("v.f32", p.v, nv * 4);
    dump_host("g.f32", p.g, (size_t)T * m->Hv * 4);
    dump_host("beta.f32", p.beta, (size_t)T * m->Hv * 4);
    dump_host("S0.f32", p.S0, ns * 4);
    for (int b = 0; b < N_CHUNK_VARS; b++) {
        CK(hk_cuda_h2d(c.S, p.S0, ns * 4, NULL));
        c.kind = chunk_vars[b].kind;
        c.flags = chunk_vars[b].flags;
        const char *var = chunk_vars[b].var;
        c.tc = 1;
        CK(chunk_run(&c, 0));
        char f[32];
        snprintf(f, sizeof f, "o_%s.f32", var);
        dump_dev(f, c.o, nv * 4);
        snprintf(f, sizeof f, "S_%s.f32", var);
        dump_dev(f, c.S, ns * 4);
        snprintf(f, sizeof f, "Tc_%s.f32", var);
        dump_dev(f, c.Tc, (size_t)m->Hv * m->dk * m->dk * 4);
    }
    chunk_free(&c);
    free(p.q);
}

/* ---- GDN decode
 * -------------------------------------------------------------- */

typedef struct {
    int B, Hk, Hv, dk, dv, nsets;
    hk_cuda_step_impl_t impl;             /* gdn_step's kernel */
    float *qkv, *a, *b, *w, *A_log, *dtb; /* step inputs */
    float *q, *k, *v, *g, *beta, *o, *cv; /* chain buffers */
    float *pool, *cpool;                  /* nsets x B states, conv states */
    float ***tabs, ***ctabs;              /* per set: device tables */
} step_ctx;

/* gdn_step's kernels, the rows they print, their dumps' suffixes. */
static const struct {
    hk_cuda_step_impl_t impl;
    const char *op, *var;
} step_vars[] = {{HK_CUDA_STEP_DEFAULT, "gdn_step", "step"},
                 {HK_CUDA_STEP_KH, "gdn_step_kh", "step_kh"},
                 {HK_CUDA_STEP_PIPE, "gdn_step_pipe", "step_pipe"},
                 {HK_CUDA_STEP_PIPE32, "gdn_step_pipe32", "step_pipe32"},
                 {HK_CUDA_STEP_PIPEA, "gdn_step_pipea", "step_pipea"},
                 {HK_CUDA_STEP_PIPEW, "gdn_step_pipew", "step_pipew"}};
#define N_STEP_VARS (sizeof step_vars / sizeof step_vars[0])

static int step_run(void *ctx, int rep)
{
    const step_ctx *c = ctx;
    const int s = rep % c->nsets;
    return hk_cuda_gdn_step_impl(
        c->impl, c->o, (float *const *)c->tabs[s], (float *const *)c->ctabs[s],
        c->qkv, c->a, c->b, c->w, c->A_log, c->dtb, c->B, c->Hk, c->Hv, c->dk,
        c->dv, CONV_K, NORM_EPS, 1.0f / sqrtf((float)c->dk), NULL);
}

static int decode_run(void *ctx, int rep)
{
    const step_ctx *c = ctx;
    return hk_cuda_gdn_decode(c->o, (float *const *)c->tabs[rep % c->nsets],
                              c->q, c->k, c->v, c->g, c->beta, c->B, c->Hk,
                              c->Hv, c->dk, c->dv, NULL);
}

/* The step's input path unfused: conv, split, norms, gates. */
static int input_run(void *ctx, int rep)
{
    const step_ctx *c = ctx;
    const int s = rep % c->nsets, kd = c->Hk * c->dk, vd = c->Hv * c->dv;
    const int cd = 2 * kd + vd;
    int rc;
    if ((rc = hk_cuda_conv1d_silu_decode(c->cv, (float *const *)c->ctabs[s],
                                         c->qkv, c->w, c->B, cd, CONV_K,
                                         NULL)) ||
        (rc = hk_cuda_split_heads(c->q, c->k, c->v, c->cv, c->B, kd, kd, vd,
                                  NULL)) ||
        (rc = hk_cuda_l2norm(c->q, c->B * c->Hk, c->dk, NORM_EPS,
                             1.0f / sqrtf((float)c->dk), NULL)) ||
        (rc = hk_cuda_l2norm(c->k, c->B * c->Hk, c->dk, NORM_EPS, 1.0f, NULL)))
        return rc;
    return hk_cuda_gdn_gates(c->g, c->beta, c->a, c->b, c->A_log, c->dtb, c->B,
                             c->Hv, NULL);
}

/* ... in one launch (hk_cuda_conv_qkv_decode: the KVBuffer step's; its
 * gates in place over g and beta, which stay in range) */
static int input_fused_run(void *ctx, int rep)
{
    const step_ctx *c = ctx;
    return hk_cuda_conv_qkv_decode(
        c->q, c->k, c->v, (float *const *)c->ctabs[rep % c->nsets], c->qkv,
        c->w, c->g, c->beta, c->A_log, c->dtb, c->B, c->Hk, c->Hv, c->dk, c->dv,
        CONV_K, NORM_EPS, 1.0f / sqrtf((float)c->dk), NULL);
}

/* The unfused sequence the fused step replaces. */
static int chain_run(void *ctx, int rep)
{
    const int rc = input_run(ctx, rep);
    return rc ? rc : decode_run(ctx, rep);
}

static void step_setup(step_ctx *c, const model_t *m, int B, int nsets)
{
    memset(c, 0, sizeof *c);
    c->B = B, c->Hk = m->Hk, c->Hv = m->Hv, c->dk = m->dk, c->dv = m->dv;
    c->nsets = nsets;
    const int kd = m->Hk * m->dk, vd = m->Hv * m->dv, cd = 2 * kd + vd;
    const size_t ns = (size_t)m->Hv * m->dk * m->dv;
    const size_t nc = (size_t)cd * (CONV_K - 1);
    float *h = halloc((size_t)B * cd * 4), *w = halloc((size_t)cd * CONV_K * 4);
    float *ab = halloc((size_t)B * m->Hv * 4), *hv = halloc((size_t)m->Hv * 4);
    for (size_t i = 0; i < (size_t)B * cd; i++)
        h[i] = (float)nrand();
    c->qkv = dev_tiled(h, (size_t)B * cd * 4, (size_t)B * cd * 4);
    for (size_t i = 0; i < (size_t)cd * CONV_K; i++)
        w[i] = (float)(0.5 * nrand());
    c->w = dev_tiled(w, (size_t)cd * CONV_K * 4, (size_t)cd * CONV_K * 4);
    for (int i = 0; i < B * m->Hv; i++)
        ab[i] = (float)nrand();
    c->a = dev_tiled(ab, (size_t)B * m->Hv * 4, (size_t)B * m->Hv * 4);
    for (int i = 0; i < B * m->Hv; i++)
        ab[i] = (float)(2.0 * nrand());
    c->b = dev_tiled(ab, (size_t)B * m->Hv * 4, (size_t)B * m->Hv * 4);
    for (int i = 0; i < m->Hv; i++)
        hv[i] = (float)log(1.0 + 15.0 * bench_unif(&rng));
    c->A_log = dev_tiled(hv, (size_t)m->Hv * 4, (size_t)m->Hv * 4);
    for (int i = 0; i < m->Hv; i++)
        hv[i] =
            (float)log(expm1(exp(log(1e-3) + bench_unif(&rng) * log(100.0))));
    c->dtb = dev_tiled(hv, (size_t)m->Hv * 4, (size_t)m->Hv * 4);
    c->q = dalloc((size_t)B * kd * 4);
    c->k = dalloc((size_t)B * kd * 4);
    c->v = dalloc((size_t)B * vd * 4);
    c->g = dalloc((size_t)B * m->Hv * 4);
    c->beta = dalloc((size_t)B * m->Hv * 4);
    c->o = dalloc((size_t)B * vd * 4);
    c->cv = dalloc((size_t)B * cd * 4);
    /* states: small random values, one block repeated */
    float *s0 = halloc(ns * 4), *c0 = halloc(nc * 4);
    for (size_t i = 0; i < ns; i++)
        s0[i] = (float)(0.1 * nrand());
    for (size_t i = 0; i < nc; i++)
        c0[i] = (float)nrand();
    c->pool = dev_tiled(s0, ns * 4, (size_t)nsets * B * ns * 4);
    c->cpool = dev_tiled(c0, nc * 4, (size_t)nsets * B * nc * 4);
    c->tabs = halloc((size_t)nsets * sizeof(float **));
    c->ctabs = halloc((size_t)nsets * sizeof(float **));
    float **t = halloc((size_t)B * sizeof(float *));
    float **ct = halloc((size_t)B * sizeof(float *));
    for (int s = 0; s < nsets; s++) {
        for (int b = 0; b < B; b++) {
            t[b] = c->pool + ((size_t)s * B + b) * ns;
            ct[b] = c->cpool + ((size_t)s * B + b) * nc;
        }
        c->tabs[s] = dalloc((size_t)B * sizeof(float *));
        c->ctabs[s] = dalloc((size_t)B * sizeof(float *));
        CK(hk_cuda_h2d(c->tabs[s], t, (size_t)B * sizeof(float *), NULL));
        CK(hk_cuda_h2d(c->ctabs[s], ct, (size_t)B * sizeof(float *), NULL));
    }
    free(t);
    free(ct);
    free(h);
    free(w);
    free(ab);
    free(hv);
    free(s0);
    free(c0);
}

static void step_free(step_ctx *c)
{
    void *bufs[] = {c->qkv,  c->a, c->b,  c->w,    c->A_log,
                    c->dtb,  c->q, c->k,  c->v,    c->g,
                    c->beta, c->o, c->cv, c->pool, c->cpool};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        CK(hk_cuda_free(bufs[i]));
    for (int s = 0; s < c->nsets; s++) {
        CK(hk_cuda_free(c->tabs[s]));
        CK(hk_cuda_free(c->ctabs[s]));
    }
    free(c->tabs);
    free(c->ctabs);
}

/* The decode step's one launch: its row's median. */
static double step_kernel_ms(const char *kernel, const void *arg)
{
    (void)kernel;
    return *(const double *)arg;
}

static void bench_decode(const model_t *m, int B)
{
    char params[128];
    snprintf(params, sizeof params, "B=%d,Hk=%d,Hv=%d,dk=%d,dv=%d", B, m->Hk,
             m->Hv, m->dk, m->dv);
    const double sbytes = (double)B * m->Hv * m->dk * m->dv * 4.0;
    int nsets = (int)ceil(ROT_BYTES / sbytes);
    nsets = tiny ? 2 : nsets < 1 ? 1 : nsets > 256 ? 256 : nsets;
    if (over_budget()) {
        skipped("gdn_step", m->name, params, "skipped: budget");
        return;
    }
    step_ctx c;
    step_setup(&c, m, B, nsets);
    /* for the chain, q/k/v/g/beta come from the previous op; for the
     * recurrence alone, from one chain run */
    CK(chain_run(&c, 0));
    CK(hk_cuda_stream_sync(NULL));
    /* gdn_step: the default kernel (HYPIC_CUDA_STEP, else PIPE); then
     * every kernel by name */
    for (size_t v = 0; v < N_STEP_VARS; v++) {
        c.impl = step_vars[v].impl;
        const double ms = measure(step_vars[v].op, m->name, params, step_run,
                                  &c, B, 2.0 * sbytes, 0);
        /* where a block's time goes, at the batches of the bandwidth
         * target (--tiny: each, the emulator's plumbing check) */
        if (ms >= 0 && (tiny || B >= 64))
            probe_call(step_vars[v].op, m->name, params, step_run, &c,
                       step_kernel_ms, &ms);
    }
    c.impl = HK_CUDA_STEP_DEFAULT;
    measure("gdn_decode", m->name, params, decode_run, &c, B, 2.0 * sbytes, 0);
    measure("gdn_decode_chain", m->name, params, chain_run, &c, B, 2.0 * sbytes,
            0);
    /* the input path alone, 5 launches or 1: x and q k v once, the conv
     * states read and written */
    const double cd = 2.0 * m->Hk * m->dk + (double)m->Hv * m->dv;
    const double ib = B * cd * 4.0 * (2.0 + 2.0 * (CONV_K - 1));
    measure("gdn_step_input", m->name, params, input_run, &c, B, ib, 0);
    measure("gdn_step_input_fused", m->name, params, input_fused_run, &c, B, ib,
            0);
    step_free(&c);
}

/* Inputs and outputs of one fused step (and of the unfused chain). */
static void dump_step(const model_t *m, int B)
{
    step_ctx c;
    step_setup(&c, m, B, 2);
    const int kd = m->Hk * m->dk, vd = m->Hv * m->dv, cd = 2 * kd + vd;
    const size_t ns = (size_t)B * m->Hv * m->dk * m->dv;
    const size_t nc = (size_t)B * cd * (CONV_K - 1);
    char meta[256], name[64];
    snprintf(meta, sizeof meta,
             "op gdn_step\nmodel %s\nB %d\nHk %d\nHv %d\ndk %d\ndv %d\nK %d\n"
             "eps %g\n",
             m->name, B, m->Hk, m->Hv, m->dk, m->dv, CONV_K, NORM_EPS);
    snprintf(name, sizeof name, "gdn_step-%s", m->name);
    dump_begin(name, meta);
    dump_dev("qkv.f32", c.qkv, (size_t)B * cd * 4);
    dump_dev("a.f32", c.a, (size_t)B * m->Hv * 4);
    dump_dev("b.f32", c.b, (size_t)B * m->Hv * 4);
    dump_dev("conv_w.f32", c.w, (size_t)cd * CONV_K * 4);
    dump_dev("A_log.f32", c.A_log, (size_t)m->Hv * 4);
    dump_dev("dt_bias.f32", c.dtb, (size_t)m->Hv * 4);
    dump_dev("S0.f32", c.pool, ns * 4);
    dump_dev("conv0.f32", c.cpool, nc * 4);
    /* each kernel on set 0 from the same values (set 1's copy) */
    for (size_t v = 0; v < N_STEP_VARS; v++) {
        char f[40];
        CK(hk_cuda_d2d(c.pool, c.pool + ns, ns * 4, NULL));
        CK(hk_cuda_d2d(c.cpool, c.cpool + nc, nc * 4, NULL));
        c.impl = step_vars[v].impl;
        CK(step_run(&c, 0));
        snprintf(f, sizeof f, "o_%s.f32", step_vars[v].var);
        dump_dev(f, c.o, (size_t)B * vd * 4);
        snprintf(f, sizeof f, "S_%s.f32", step_vars[v].var);
        dump_dev(f, c.pool, ns * 4);
        snprintf(f, sizeof f, "conv_%s.f32", step_vars[v].var);
        dump_dev(f, c.cpool, nc * 4);
    }
    CK(chain_run(&c, 1)); /* set 1: the same initial values */
    dump_dev("o_chain.f32", c.o, (size_t)B * vd * 4);
    dump_dev("S_chain.f32", c.pool + ns, ns * 4);
    step_free(&c);
}

/* ---- KVBuffer decode -------------------------------------------------------
 * Chunkwise decode (hk_cuda_kvbuf_step, T = 1) of R requests at the
 * average buffer length of a flush cycle (cap = the default, the B of
 * least traffic), the flush of full buffers, their average step (step +
 * flush / cap), and verification of KVB_DRAFTS and 2 KVB_DRAFTS drafts
 * (T = 1 + drafts; v2 and v1), against the recurrent step (gdn_decode,
 * and the fused gdn_step) and the v2 decode step timed in the same run. Bytes
 * are the traffic model of engine/forward/kvbuf.h (the one bench/kvbuf_bench
 * uses on the CPU), per request: S = Hv dk dv 4, an entry e = Hk dk 4 + Hv (4
 * dv + 8); step    S + (len + 1) e          flush   2 S + cap e decode
 * hp_kvbuf_bytes_chunkwise (S (1 + 2/cap) + e (cap + 3) / 2) verify  S + (len +
 * T) e          recurrent 2 S per token so GB/s is model bytes / time, and a
 * row near copy_d2d's GB/s means the model's bytes are what moved; the decode
 * row's note gives the model's speedup over the recurrent step beside the
 * measured one. Every kernel kind (kvb_kinds) gets the three rows, each noting
 * gdn_step's time from the same call (the flush per token: its time / cap).
 * States and buffers rotate over >= 256 MB of sets, as in bench_decode. */
#define KVB_DRAFTS 4
#define KVB_BS     16

typedef struct {
    int R, T, nsets, lmax;
    unsigned flags; /* the kernels (HK_CUDA_KVBUF_*) */
    hk_kvbuf_geom_t g;
    float *arena, *pool;              /* nsets x R buffers and states */
    int *blocks, *n;                  /* block ids; flush counts [R] */
    hk_kvbuf_view_t **vw;             /* per set: device views */
    float *q, *k, *v, *gl, *beta, *o; /* [R*T] rows */
} kvb_ctx;

static int kvb_step_run(void *ctx, int rep)
{
    const kvb_ctx *c = ctx;
    return hk_cuda_kvbuf_step_ex(c->o, c->arena, c->vw[rep % c->nsets], c->q,
                                 c->k, c->v, c->gl, c->beta, c->R, c->T, &c->g,
                                 c->lmax, c->flags, NULL);
}

static int kvb_flush_run(void *ctx, int rep)
{
    const kvb_ctx *c = ctx;
    return hk_cuda_kvbuf_flush_ex(c->arena, c->vw[rep % c->nsets], c->n, c->R,
                                  &c->g, c->flags, NULL);
}

/* R buffers of len entries (blocks for lmax) over states, per set;
 * inputs for T tokens each; flushes of cap entries. */
static void kvb_setup(kvb_ctx *c, const model_t *m, int R, int T, int len,
                      int cap)
{
    memset(c, 0, sizeof *c);
    c->R = R, c->T = T;
    c->g = (hk_kvbuf_geom_t){m->Hk, m->Hv, m->dk, m->dv, KVB_BS};
    c->lmax = len + T > cap ? len + T : cap;
    const int nb = (c->lmax + KVB_BS - 1) / KVB_BS;
    const size_t bf = hk_kvbuf_layout_floats(&c->g);
    const size_t ns = (size_t)m->Hv * m->dk * m->dv;
    const double set = (double)R * (ns + nb * bf) * 4.0;
    c->nsets = (int)ceil(ROT_BYTES / set);
    c->nsets = tiny ? 2 : c->nsets < 1 ? 1 : c->nsets > 256 ? 256 : c->nsets;
    const size_t nbuf = (size_t)c->nsets * R;

    /* one block repeated: small keys and w, G falling by 0.05 a slot */
    float *blk = halloc(bf * 4);
    for (size_t i = 0; i < hk_kvbuf_off_G(&c->g); i++)
        blk[i] = (float)(0.1 * nrand());
    double *G = (double *)(void *)(blk + hk_kvbuf_off_G(&c->g));
    for (int i = 0; i < m->Hv * KVB_BS; i++)
        G[i] = -0.05 * (i % KVB_BS + 1);
    c->arena = dev_tiled(blk, bf * 4, nbuf * nb * bf * 4);
    float *s0 = halloc(ns * 4);
    for (size_t i = 0; i < ns; i++)
        s0[i] = (float)(0.1 * nrand());
    c->pool = dev_tiled(s0, ns * 4, nbuf * ns * 4);
    int *ids = halloc(nbuf * nb * sizeof(int));
    for (size_t i = 0; i < nbuf * nb; i++)
        ids[i] = (int)i;
    c->blocks = dalloc(nbuf * nb * sizeof(int));
    CK(hk_cuda_h2d(c->blocks, ids, nbuf * nb * sizeof(int), NULL));
    hk_kvbuf_view_t *hv = halloc((size_t)R * sizeof(hk_kvbuf_view_t));
    c->vw = halloc((size_t)c->nsets * sizeof(*c->vw));
    for (int s = 0; s < c->nsets; s++) {
        for (int r = 0; r < R; r++) {
            const size_t b = (size_t)s * R + r;
            hv[r] =
                (hk_kvbuf_view_t){c->pool + b * ns, c->blocks + b * nb, len};
        }
        c->vw[s] = dalloc((size_t)R * sizeof(hk_kvbuf_view_t));
        CK(hk_cuda_h2d(c->vw[s], hv, (size_t)R * sizeof(hk_kvbuf_view_t),
                       NULL));
    }
    for (int r = 0; r < R; r++)
        ids[r] = cap;
    c->n = dalloc((size_t)R * sizeof(int));
    CK(hk_cuda_h2d(c->n, ids, (size_t)R * sizeof(int), NULL));

    const size_t rows = (size_t)R * T, nq = rows * m->Hk * m->dk;
    const size_t nv = rows * m->Hv * m->dv, ng = rows * m->Hv;
    float *q = halloc(nq * 4), *k = halloc(nq * 4), *v = halloc(nv * 4);
    float *gl = halloc(ng * 4), *beta = halloc(ng * 4);
    for (size_t r = 0; r < rows * m->Hk; r++) {
        unit_row(q + r * m->dk, m->dk, 1.0 / sqrt((double)m->dk));
        unit_row(k + r * m->dk, m->dk, 1.0);
    }
    for (size_t i = 0; i < nv; i++)
        v[i] = (float)nrand();
    for (size_t i = 0; i < ng; i++) {
        gl[i] = (float)(-0.01 - 0.5 * bench_unif(&rng));
        beta[i] = hk_math_sigmoid((float)nrand());
    }
    c->q = dev_tiled(q, nq * 4, nq * 4);
    c->k = dev_tiled(k, nq * 4, nq * 4);
    c->v = dev_tiled(v, nv * 4, nv * 4);
    c->gl = dev_tiled(gl, ng * 4, ng * 4);
    c->beta = dev_tiled(beta, ng * 4, ng * 4);
    c->o = dalloc(nv * 4);
    free(blk);
    free(s0);
    free(ids);
    free(hv);
    free(q);
    free(k);
    free(v);
    free(gl);
    free(beta);
}

static void kvb_free(kvb_ctx *c)
{
    void *bufs[] = {c->arena, c->pool, c->blocks, c->n,    c->q,
                    c->k,     c->v,    c->gl,     c->beta, c->o};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        CK(hk_cuda_free(bufs[i]));
    for (int s = 0; s < c->nsets; s++)
        CK(hk_cuda_free(c->vw[s]));
    free(c->vw);
}

/* Median ms of the recurrent step (gdn_decode; gdn_step in *fused) of B
 * requests, timed here without a row of its own (bench_decode prints
 * those). */
static double kvb_recurrent_ms(const model_t *m, int B, double *fused)
{
    const double sbytes = (double)B * m->Hv * m->dk * m->dv * 4.0;
    int nsets = (int)ceil(ROT_BYTES / sbytes), reps = 0, rc = 0;
    nsets = tiny ? 2 : nsets < 1 ? 1 : nsets > 256 ? 256 : nsets;
    step_ctx c;
    step_setup(&c, m, B, nsets);
    CK(chain_run(&c, 0));
    CK(hk_cuda_stream_sync(NULL));
    const double ms = time_op(decode_run, &c, &reps, &rc);
    *fused = time_op(step_run, &c, &reps, &rc);
    step_free(&c);
    return ms;
}

/* The kernels timed (hk_cuda.h): v2 at its own slab width, then v1 (the
 * first kernels), then v2 at each slab width; op name suffixes. */
static const struct {
    const char *suffix;
    unsigned flags;
} kvb_kinds[] = {{"", HK_CUDA_KVBUF_V2},
                 {"_v1", HK_CUDA_KVBUF_V1},
                 {"_cw128", HK_CUDA_KVBUF_CW128},
                 {"_cw64", HK_CUDA_KVBUF_CW64},
                 {"_cw32", HK_CUDA_KVBUF_CW32}};
#define KVB_KINDS ((int)(sizeof kvb_kinds / sizeof kvb_kinds[0]))

/* Verification of T - 1 drafts (T tokens a request) over buffers of len
 * entries, by v2 (kvbuf_verify) and v1 (kvbuf_verify_v1): GB/s of the
 * traffic model's S + (len + T) e a request (S0 once, every entry once),
 * the note comparing with T v2 decode steps (step_v2, timed by
 * bench_kvbuf; S0 T times) and T fused recurrent steps (gdn_step). */
static void bench_kvbuf_verify(const model_t *m, int R, int T, int len, int cap,
                               double step_v2, double fused)
{
    const double S = hp_kvbuf_bytes_recurrent(m->Hk, m->Hv, m->dk, m->dv) / 2;
    const double e = hp_kvbuf_bytes_kvonly(m->Hk, m->Hv, m->dk, m->dv, 0);
    const double bytes = R * (S + (len + T) * e);
    char params[128], note[192], op[40];
    snprintf(params, sizeof params, "B=%d,T=%d,len=%d,Hk=%d,Hv=%d,dk=%d,dv=%d",
             R, T, len, m->Hk, m->Hv, m->dk, m->dv);
    if (!wanted("kvbuf_verify"))
        return;
    kvb_ctx c;
    kvb_setup(&c, m, R, T, len, cap);
    for (int kind = 0; kind < 2; kind++) { /* v2, v1 */
        snprintf(op, sizeof op, "kvbuf_verify%s", kvb_kinds[kind].suffix);
        if (!wanted(op))
            continue;
        if (over_budget()) {
            skipped(op, m->name, params, "skipped: budget");
            continue;
        }
        int reps = 0, rc = 0;
        c.flags = kvb_kinds[kind].flags;
        const double ms = time_op(kvb_step_run, &c, &reps, &rc);
        if (ms < 0) {
            snprintf(note, sizeof note, "error: %s", hk_cuda_strerror(rc));
            emit(op, m->name, params, -1, reps, -1, -1, -1, note);
            continue;
        }
        const double s = ms * 1e-3, gbs = bytes / s * 1e-9;
        int at = snprintf(note, sizeof note, "model %.3g MB", bytes * 1e-6);
        if (copy_gbs > 0)
            at += snprintf(note + at, sizeof note - at, "; %.0f %% of copy",
                           100.0 * gbs / copy_gbs);
        if (step_v2 > 0)
            at += snprintf(note + at, sizeof note - at,
                           "; vs %d v2 steps %.4f ms: x%.2f", T, T * step_v2,
                           T * step_v2 / ms);
        if (fused > 0)
            snprintf(note + at, sizeof note - at,
                     "; vs %d gdn_step %.4f ms: x%.2f", T, T * fused,
                     T * fused / ms);
        emit(op, m->name, params, ms, reps, R * T / s, gbs, -1, note);
    }
    kvb_free(&c);
}

static void bench_kvbuf(const model_t *m, int R)
{
    hp_kvbuf_config_t kc;
    hp_kvbuf_config_default(&kc, m->Hk, m->Hv, m->dk, m->dv);
    const int cap = kc.cap, len = (cap - 1) / 2;
    const double S = hp_kvbuf_bytes_recurrent(m->Hk, m->Hv, m->dk, m->dv) / 2;
    const double e = hp_kvbuf_bytes_kvonly(m->Hk, m->Hv, m->dk, m->dv, 0);
    const double model =
        hp_kvbuf_bytes_chunkwise(m->Hk, m->Hv, m->dk, m->dv, cap);
    char params[128], note[192], op[3][40];
    snprintf(params, sizeof params, "B=%d,Hk=%d,Hv=%d,dk=%d,dv=%d,cap=%d", R,
             m->Hk, m->Hv, m->dk, m->dv, cap);
    if (over_budget()) {
        skipped("kvbuf", m->name, params, "skipped: budget");
        return;
    }
    double fused = -1, rec = kvb_recurrent_ms(m, R, &fused), step_v2 = -1;
    kvb_ctx c;
    kvb_setup(&c, m, R, 1, len, cap);
    for (int kind = 0; kind < KVB_KINDS; kind++) {
        snprintf(op[0], sizeof op[0], "kvbuf_step%s", kvb_kinds[kind].suffix);
        snprintf(op[1], sizeof op[1], "kvbuf_flush%s", kvb_kinds[kind].suffix);
        snprintf(op[2], sizeof op[2], "kvbuf_decode%s", kvb_kinds[kind].suffix);
        c.flags = kvb_kinds[kind].flags;
        const double step = measure_vs(op[0], m->name, params, kvb_step_run, &c,
                                       R, R * (S + (len + 1) * e), 0, fused, 1);
        if (kvb_kinds[kind].flags == HK_CUDA_KVBUF_V2)
            step_v2 = step;
        const double flush =
            measure_vs(op[1], m->name, params, kvb_flush_run, &c, 0,
                       R * (2 * S + cap * e), 0, fused, cap);
        if (!wanted(op[2]))
            continue;
        if (step < 0 || flush < 0) {
            skipped(op[2], m->name, params, "no step or flush time");
            continue;
        }
        const double ms = step + flush / cap, s = ms * 1e-3;
        snprintf(note, sizeof note,
                 "step+flush/cap; vs gdn_decode %.4f ms: x%.2f (model "
                 "x%.2f); vs gdn_step %.4f ms: x%.2f",
                 rec, rec / ms, 2 * S / model, fused, fused / ms);
        emit(op[2], m->name, params, ms, 0, R / s, R * model / s * 1e-9, -1,
             note);
    }
    /* the v2 decode step's time, for the verification rows' note, where
     * the loop above did not time it (--only kvbuf_verify) */
    if (step_v2 < 0 && wanted("kvbuf_verify") && !over_budget()) {
        int reps = 0, rc = 0;
        c.flags = HK_CUDA_KVBUF_V2;
        step_v2 = time_op(kvb_step_run, &c, &reps, &rc);
    }
    kvb_free(&c);
    /* verification of KVB_DRAFTS and twice as many drafts, v2 and v1 */
    for (int dr = KVB_DRAFTS; dr <= 2 * KVB_DRAFTS; dr += KVB_DRAFTS)
        bench_kvbuf_verify(m, R, 1 + dr, len, cap, step_v2, fused);
}

/* ---- attention
 * ------------------------------------------------------------------ */

typedef struct {
    int T, N, B, Hq, Hkv, hd;
    hk_cuda_att_impl_t impl;
    float *q, *k, *v, *o;
    int *qpos, *nctx;
    float **kcs, **vcs; /* decode: device tables */
    float *scr;         /* decode: flash-decoding's scratch; prefill: FLASH2X's
                           or FLASH3's, the larger (FLASH2 takes the first
                           half of FLASH2X's) */
} att_ctx;

/* The kernels measured: bench op, kernels, passed the scratch. */
typedef struct {
    const char *op;
    hk_cuda_att_impl_t impl;
    int scratch;
} att_kind_t;
static const att_kind_t att_prefill_kinds[] = {
    {"attention_prefill_flash3", HK_CUDA_ATT_FLASH3, 1},
    {"attention_prefill_flash3seq", HK_CUDA_ATT_FLASH3_SEQ, 1},
    {"attention_prefill_flash3ws", HK_CUDA_ATT_FLASH3_WS, 1},
    {"attention_prefill_flash2", HK_CUDA_ATT_FLASH2, 1},
    {"attention_prefill_flash2x", HK_CUDA_ATT_FLASH2X, 1},
    {"attention_prefill", HK_CUDA_ATT_FLASH, 0},
    {"attention_prefill_bf16", HK_CUDA_ATT_FLASH_BF16, 0},
    {"attention_prefill_simple", HK_CUDA_ATT_SIMPLE, 0}};
static const att_kind_t att_decode_kinds[] = {
    {"attention_decode", HK_CUDA_ATT_FLASH, 1},
    {"attention_decode_1blk", HK_CUDA_ATT_FLASH, 0},
    {"attention_decode_simple", HK_CUDA_ATT_SIMPLE, 0}};
#define N_ATT_PREFILL 8
#define N_ATT_KINDS   3 /* decode */
static int att_prefill_run(void *ctx, int rep)
{
    const att_ctx *c = ctx;
    (void)rep;
    return hk_cuda_attention_ex(c->impl, c->o, c->q, c->qpos, c->k, c->v, c->T,
                                c->N, c->Hq, c->Hkv, c->hd,
                                1.0f / sqrtf((float)c->hd), c->scr, NULL);
}

static int att_decode_run(void *ctx, int rep)
{
    const att_ctx *c = ctx;
    (void)rep;
    return hk_cuda_attention_decode_ex(
        c->impl, c->o, c->q, (const float *const *)c->kcs,
        (const float *const *)c->vcs, c->nctx, c->B, c->Hq, c->Hkv, c->hd,
        1.0f / sqrtf((float)c->hd), c->scr, NULL);
}

/* Paged decode: B requests x N keys on pages of P positions. */
typedef struct {
    int B, N, P, Hq, Hkv, hd, maxp;
    float *q, *kp, *vp, *o, *scr;
    int *table, *nctx;
} paged_ctx;

static int att_paged_run(void *ctx, int rep)
{
    const paged_ctx *c = ctx;
    (void)rep;
    return hk_cuda_attention_decode_paged_ex(
        HK_CUDA_ATT_FLASH, c->o, c->q, c->kp, c->vp, c->table, c->maxp, c->nctx,
        c->B, c->P, c->Hq, c->Hkv, c->hd, 1.0f / sqrtf((float)c->hd), c->scr,
        NULL);
}

/* Random rows (R of them) repeated over n rows of width w. */
static float *dev_rand(size_t n, size_t w, double amp)
{
    const size_t R = n < 4096 ? n : 4096;
    float *h = halloc(R * w * 4);
    for (size_t i = 0; i < R * w; i++)
        h[i] = bf16_round((float)(amp * nrand()));
    float *d = dev_tiled(h, R * w * 4, n * w * 4);
    free(h);
    return d;
}

/* Prefill (B = 0: T queries, the last of N keys; N = 0: their own T) or
 * decode (B requests, one query each over N keys in its own cache, and
 * flash-decoding's scratch). */
static void att_setup(att_ctx *c, const model_t *m, int T, int B, int N)
{
    memset(c, 0, sizeof *c);
    if (!B && N < T)
        N = T;
    c->T = T, c->B = B, c->N = N, c->Hq = m->Hq, c->Hkv = m->Hkv, c->hd = m->hd;
    const size_t rows = B ? (size_t)B : (size_t)T;
    c->q = dev_rand(rows, (size_t)m->Hq * m->hd, 1.0);
    c->o = dalloc(rows * m->Hq * m->hd * 4);
    const size_t kvr = B ? (size_t)B * N : (size_t)N;
    c->k = dev_rand(kvr, (size_t)m->Hkv * m->hd, 1.0);
    c->v = dev_rand(kvr, (size_t)m->Hkv * m->hd, 1.0);
    if (!B) {
        int *pos = halloc((size_t)T * sizeof(int));
        for (int t = 0; t < T; t++)
            pos[t] = N - T + t;
        c->qpos = dalloc((size_t)T * sizeof(int));
        CK(hk_cuda_h2d(c->qpos, pos, (size_t)T * sizeof(int), NULL));
        free(pos);
        const size_t n2 = hk_cuda_attention_scratch(HK_CUDA_ATT_FLASH2X, T, N,
                                                    m->Hq, m->Hkv, m->hd);
        const size_t n3 = hk_cuda_attention_scratch(HK_CUDA_ATT_FLASH3, T, N,
                                                    m->Hq, m->Hkv, m->hd);
        const size_t ns = n2 > n3 ? n2 : n3;
        if (ns)
            c->scr = dalloc(ns * sizeof(float));
        return;
    }
    float **kt = halloc((size_t)B * sizeof(float *));
    float **vt = halloc((size_t)B * sizeof(float *));
    int *n = halloc((size_t)B * sizeof(int));
    for (int b = 0; b < B; b++) {
        kt[b] = c->k + (size_t)b * N * m->Hkv * m->hd;
        vt[b] = c->v + (size_t)b * N * m->Hkv * m->hd;
        n[b] = N;
    }
    c->kcs = dalloc((size_t)B * sizeof(float *));
    c->vcs = dalloc((size_t)B * sizeof(float *));
    c->nctx = dalloc((size_t)B * sizeof(int));
    CK(hk_cuda_h2d(c->kcs, kt, (size_t)B * sizeof(float *), NULL));
    CK(hk_cuda_h2d(c->vcs, vt, (size_t)B * sizeof(float *), NULL));
    CK(hk_cuda_h2d(c->nctx, n, (size_t)B * sizeof(int), NULL));
    const size_t ns = hk_cuda_attention_decode_scratch(B, m->Hq, m->Hkv, m->hd);
    if (ns)
        c->scr = dalloc(ns * sizeof(float));
    free(kt);
    free(vt);
    free(n);
}

static void att_free(att_ctx *c)
{
    void *bufs[] = {c->q,    c->k,   c->v,   c->o,  c->qpos,
                    c->nctx, c->kcs, c->vcs, c->scr};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        CK(hk_cuda_free(bufs[i]));
}

/* The wgmma kinds (FLASH3, FLASH3_SEQ, FLASH3_WS; the last has not run on
 * a GPU yet): a fault there would leave the context unusable for every
 * row after it, so with --only they run in their own family
 * (attention_prefill_flash3), not in attention_prefill's. */
static int att_kind_wg(const att_kind_t *kd)
{
    return kd->impl == HK_CUDA_ATT_FLASH3 ||
           kd->impl == HK_CUDA_ATT_FLASH3_SEQ ||
           kd->impl == HK_CUDA_ATT_FLASH3_WS;
}

/* Whether this run takes the kind: the wgmma kinds on a compute
 * capability 9.0 device only, and with --only when it names their family
 * (why: "skipped: ..." in *why). */
static int att_kind_here(const att_kind_t *kd, const char **why)
{
    *why = NULL;
    if (!att_kind_wg(kd))
        return 1;
    if (hk_cuda_compute_capability() != 90)
        *why = "skipped: not a compute capability 9.0 device";
    else if (only && strncmp(only, "attention_prefill_flash3",
                             strlen("attention_prefill_flash3")))
        *why = "skipped: its own family (--only attention_prefill_flash3) "
               "until a device has run it";
    return *why == NULL;
}

/* Every prefill kind at T. last_ms, last_T: each kind's last time (ms at
 * T): the cost grows as T^2, and a call predicted to overrun the budget
 * (warm-up + 1) is not started. */
static void bench_att_prefill(const model_t *m, int T, double *last_ms,
                              int *last_T)
{
    char params[128];
    snprintf(params, sizeof params, "T=%d,Hq=%d,Hkv=%d,hd=%d", T, m->Hq, m->Hkv,
             m->hd);
    att_ctx c;
    float *scr = NULL;
    int set = 0;
    for (int i = 0; i < N_ATT_PREFILL; i++) {
        const att_kind_t *kd = &att_prefill_kinds[i];
        /* SIMPLE re-reads K/V per query head: 64k would take minutes. */
        if (!wanted(kd->op) || (kd->impl == HK_CUDA_ATT_SIMPLE && T > 16384))
            continue;
        const char *why;
        if (!att_kind_here(kd, &why)) {
            if (measured(kd->op))
                skipped(kd->op, m->name, params, why);
            continue;
        }
        const double r = last_T[i] ? (double)T / last_T[i] : 0.0;
        const double pred_s = last_ms[i] > 0 ? 2e-3 * last_ms[i] * r * r : 0.0;
        if (over_budget() || bench_now() - t_begin + pred_s > budget) {
            skipped(kd->op, m->name, params,
                    "skipped: budget (T^2 from the last size)");
            continue;
        }
        if (!set)
            att_setup(&c, m, T, 0, 0), scr = c.scr, set = 1;
        c.impl = kd->impl;
        c.scr = kd->scratch ? scr : NULL;
        const double fl = 4.0 * m->Hq * m->hd * ((double)T * (T + 1) / 2.0);
        last_ms[i] =
            measure(kd->op, m->name, params, att_prefill_run, &c, T, 0, fl);
        last_T[i] = T;
    }
    if (set) {
        c.scr = scr;
        att_free(&c);
    }
}

/* A short prompt over a long cache (a PIC splice's seams, a prefix-cache
 * resume): T queries, the last of N keys, on the kernels that split the
 * keys where their row blocks are under a wave (splits= in params: 1, not
 * split). TFLOP/s of the causal flops, 4 Hq hd (T (N - T) + T (T + 1) / 2). */
static const att_kind_t att_append_kinds[] = {
    {"attention_append_flash2x", HK_CUDA_ATT_FLASH2X, 1},
    {"attention_append_flash2", HK_CUDA_ATT_FLASH2, 1}};

static void bench_att_append(const model_t *m, int T, int N)
{
    att_ctx c;
    int set = 0;
    for (size_t i = 0; i < sizeof att_append_kinds / sizeof *att_append_kinds;
         i++) {
        const att_kind_t *kd = &att_append_kinds[i];
        if (!measured(kd->op))
            continue;
        char params[128];
        snprintf(
            params, sizeof params, "T=%d,N=%d,Hq=%d,Hkv=%d,hd=%d,splits=%d", T,
            N, m->Hq, m->Hkv, m->hd,
            hk_cuda_attention_splits(kd->impl, T, N, m->Hq, m->Hkv, m->hd));
        if (!set)
            att_setup(&c, m, T, 0, N), set = 1;
        c.impl = kd->impl;
        const double fl = 4.0 * m->Hq * m->hd *
                          ((double)T * (N - T) + (double)T * (T + 1) / 2.0);
        measure(kd->op, m->name, params, att_prefill_run, &c, T, 0, fl);
    }
    if (set)
        att_free(&c);
}

static void bench_att_decode(const model_t *m, int B, int N)
{
    char params[128];
    snprintf(params, sizeof params, "B=%d,N=%d,Hq=%d,Hkv=%d,hd=%d", B, N, m->Hq,
             m->Hkv, m->hd);
    if (over_budget()) {
        for (int i = 0; i < N_ATT_KINDS; i++)
            if (measured(att_decode_kinds[i].op))
                skipped(att_decode_kinds[i].op, m->name, params,
                        "skipped: budget");
        return;
    }
    int any = 0;
    for (int i = 0; i < N_ATT_KINDS; i++)
        any |= measured(att_decode_kinds[i].op);
    if (!any)
        return;
    att_ctx c;
    att_setup(&c, m, 0, B, N);
    float *scr = c.scr;
    const double bytes = 2.0 * B * N * m->Hkv * m->hd * 4.0;
    for (int i = 0; i < N_ATT_KINDS; i++) {
        c.impl = att_decode_kinds[i].impl;
        c.scr = att_decode_kinds[i].scratch ? scr : NULL;
        measure(att_decode_kinds[i].op, m->name, params, att_decode_run, &c, B,
                bytes, 4.0 * B * N * m->Hq * m->hd);
    }
    c.scr = scr;
    att_free(&c);
}

/* B requests x N keys (N a multiple of P) on B N / P pages of one
 * arena, handed out in a shuffled order (a request's pages lie anywhere,
 * none next to its neighbour in position), and flash-decoding's
 * scratch. */
static void paged_setup(paged_ctx *c, const model_t *m, int B, int N, int P)
{
    memset(c, 0, sizeof *c);
    c->B = B, c->N = N, c->P = P, c->Hq = m->Hq, c->Hkv = m->Hkv;
    c->hd = m->hd, c->maxp = N / P;
    const size_t np = (size_t)B * c->maxp, w = (size_t)m->Hkv * m->hd;
    c->q = dev_rand((size_t)B, (size_t)m->Hq * m->hd, 1.0);
    c->o = dalloc((size_t)B * m->Hq * m->hd * 4);
    c->kp = dev_rand(np * P, w, 1.0);
    c->vp = dev_rand(np * P, w, 1.0);
    int *t = halloc(np * sizeof(int)), *n = halloc((size_t)B * sizeof(int));
    for (size_t i = 0; i < np; i++)
        t[i] = (int)i;
    for (size_t i = np - 1; i > 0; i--) {
        const size_t j = (size_t)(bench_unif(&rng) * (double)(i + 1));
        const int x = t[i];
        t[i] = t[j < i ? j : i], t[j < i ? j : i] = x;
    }
    for (int b = 0; b < B; b++)
        n[b] = N;
    c->table = dalloc(np * sizeof(int));
    c->nctx = dalloc((size_t)B * sizeof(int));
    CK(hk_cuda_h2d(c->table, t, np * sizeof(int), NULL));
    CK(hk_cuda_h2d(c->nctx, n, (size_t)B * sizeof(int), NULL));
    const size_t ns = hk_cuda_attention_decode_scratch(B, m->Hq, m->Hkv, m->hd);
    if (ns)
        c->scr = dalloc(ns * sizeof(float));
    free(t);
    free(n);
}

static void paged_free(paged_ctx *c)
{
    void *bufs[] = {c->q, c->kp, c->vp, c->o, c->scr, c->table, c->nctx};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        CK(hk_cuda_free(bufs[i]));
}

/* attention_decode_paged at P = 16 and 64, beside attention_decode's
 * rows at the same B and N. */
static void bench_att_decode_paged(const model_t *m, int B, int N)
{
    static const int Ps[] = {16, 64};
    for (int i = 0; i < 2 && measured("attention_decode_paged"); i++) {
        char params[128];
        snprintf(params, sizeof params, "B=%d,N=%d,P=%d,Hq=%d,Hkv=%d,hd=%d", B,
                 N, Ps[i], m->Hq, m->Hkv, m->hd);
        if (over_budget()) {
            skipped("attention_decode_paged", m->name, params,
                    "skipped: budget");
            continue;
        }
        paged_ctx c;
        paged_setup(&c, m, B, N, Ps[i]);
        measure("attention_decode_paged", m->name, params, att_paged_run, &c, B,
                2.0 * B * N * m->Hkv * m->hd * 4.0,
                4.0 * B * N * m->Hq * m->hd);
        paged_free(&c);
    }
}

/* The paged case for gpu_kernels_ref.py: q, the arenas, the table and o
 * (at the smaller page size). */
static void dump_att_paged(const model_t *m, int B, int N, int P)
{
    if (!wanted("attention_decode_paged"))
        return;
    paged_ctx c;
    paged_setup(&c, m, B, N, P);
    char meta[256], name[64];
    snprintf(meta, sizeof meta,
             "op attention_decode_paged\nmodel %s\nB %d\nN %d\nP %d\n"
             "Hq %d\nHkv %d\nhd %d\n",
             m->name, B, N, P, m->Hq, m->Hkv, m->hd);
    snprintf(name, sizeof name, "attention_decode_paged-%s", m->name);
    dump_begin(name, meta);
    const size_t kv = (size_t)B * N * m->Hkv * m->hd * 4;
    dump_dev("q.f32", c.q, (size_t)B * m->Hq * m->hd * 4);
    dump_dev("k_pages.f32", c.kp, kv);
    dump_dev("v_pages.f32", c.vp, kv);
    dump_dev("table.i32", c.table, (size_t)B * c.maxp * sizeof(int));
    CK(att_paged_run(&c, 0));
    dump_dev("o.f32", c.o, (size_t)B * m->Hq * m->hd * 4);
    paged_free(&c);
}

static void dump_att(const model_t *m, int T, int B, int N)
{
    const att_kind_t *kinds = B ? att_decode_kinds : att_prefill_kinds;
    if (!wanted(B ? "attention_decode" : "attention_prefill"))
        return;
    att_ctx c;
    att_setup(&c, m, T, B, N);
    char meta[256], name[64];
    snprintf(meta, sizeof meta,
             "op attention_%s\nmodel %s\nT %d\nB %d\nN %d\nHq %d\nHkv %d\n"
             "hd %d\n",
             B ? "decode" : "prefill", m->name, T, B, N, m->Hq, m->Hkv, m->hd);
    snprintf(name, sizeof name, "attention_%s-%s", B ? "decode" : "prefill",
             m->name);
    dump_begin(name, meta);
    const size_t rows = B ? (size_t)B : (size_t)T;
    const size_t kvr = B ? (size_t)B * N : (size_t)T;
    dump_dev("q.f32", c.q, rows * m->Hq * m->hd * 4);
    dump_dev("k.f32", c.k, kvr * m->Hkv * m->hd * 4);
    dump_dev("v.f32", c.v, kvr * m->Hkv * m->hd * 4);
    float *scr = c.scr;
    /* o.f32 (attention_prefill, attention_decode), else o_SUFFIX.f32
     * (o_flash3, o_flash3seq, o_flash3ws, o_flash2, o_flash2x, o_bf16,
     * o_simple; o_1blk, o_simple). */
    const int nk = B ? N_ATT_KINDS : N_ATT_PREFILL;
    for (int i = 0; i < nk; i++) {
        char file[64] = "o.f32";
        const char *why;
        if (!att_kind_here(&kinds[i], &why))
            continue;
        const char *suf = strchr(kinds[i].op + strlen("attention_"), '_');
        if (suf)
            snprintf(file, sizeof file, "o_%s.f32", suf + 1);
        c.impl = kinds[i].impl;
        c.scr = kinds[i].scratch ? scr : NULL;
        CK(B ? att_decode_run(&c, 0) : att_prefill_run(&c, 0));
        dump_dev(file, c.o, rows * m->Hq * m->hd * 4);
    }
    c.scr = scr;
    att_free(&c);
}

/* ---- projections
 * ------------------------------------------------------------------ */

typedef struct {
    int n, in, out, bf16;
    int parts; /* the out rows as that many matrices of one input (1: w
                  whole; 4: a layer's in-projections), of part_out rows */
    int gemv;  /* bf16 through hk_cuda_gemv_bf16 (n <= HK_CUDA_GEMV_ROWS) */
    int part_out[HK_CUDA_GEMV_PARTS];
    float *x, *w, *y;
    uint16_t *wb, *xb;
    hk_cuda_blas_t *blas;
} mm_ctx;

/* The parts' matrices and outputs: consecutive rows of c's w, and y as
 * [n, out_i] blocks one after another. */
static hk_cuda_gemv_t mm_parts(const mm_ctx *c)
{
    hk_cuda_gemv_t p = {{NULL}, {NULL}, {0}};
    size_t r = 0;
    for (int i = 0; i < c->parts; i++) {
        p.w[i] = c->wb + r * c->in;
        p.y[i] = c->y + r * c->n;
        p.out[i] = c->part_out[i];
        r += (size_t)c->part_out[i];
    }
    return p;
}

/* bf16 as the engine runs it: x rounded once, then the parts in one
 * launch (gemv) or cuBLAS a matrix at a time. */
static int mm_run(void *ctx, int rep)
{
    const mm_ctx *c = ctx;
    (void)rep;
    if (!c->bf16)
        return hk_cuda_matmul(c->y, c->x, c->w, c->n, c->in, c->out, c->blas,
                              NULL);
    const hk_cuda_gemv_t p = mm_parts(c);
    int rc = hk_cuda_to_bf16(c->xb, c->x, (size_t)c->n * c->in, NULL);
    if (c->gemv)
        return rc ? rc
                  : hk_cuda_gemv_bf16(&p, c->parts, c->xb, c->n, c->in, 0, 0,
                                      NULL);
    for (int i = 0; i < c->parts && !rc; i++)
        rc = hk_cuda_matmul_bf16(p.y[i], NULL, p.w[i], c->n, c->in, p.out[i], 0,
                                 c->xb, c->blas, NULL);
    return rc;
}

static void mm_setup(mm_ctx *c, int n, int in, int out, hk_cuda_blas_t *blas)
{
    memset(c, 0, sizeof *c);
    c->n = n, c->in = in, c->out = out, c->blas = blas;
    c->parts = 1, c->part_out[0] = out;
    c->x = dev_rand((size_t)n, (size_t)in, 1.0);
    c->w = dev_rand((size_t)out, (size_t)in, 1.0 / sqrt((double)in));
    c->y = dalloc((size_t)n * out * 4);
    c->xb = dalloc((size_t)n * in * 2);
    /* the weights are bf16 values already: their bits are exact */
    float *h = halloc((size_t)out * in * 4);
    CK(hk_cuda_d2h(h, c->w, (size_t)out * in * 4, NULL));
    uint16_t *b = to_bf16(h, (size_t)out * in);
    c->wb = dalloc((size_t)out * in * 2);
    CK(hk_cuda_h2d(c->wb, b, (size_t)out * in * 2, NULL));
    free(h);
    free(b);
}

static void mm_free(mm_ctx *c)
{
    void *bufs[] = {c->x, c->w, c->y, c->xb, c->wb};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        CK(hk_cuda_free(bufs[i]));
}

/* ---- next-token choice (hk_sample.cu) ----------------------------------- */

typedef struct {
    float *lg, *p, *scr;
    float *raw;               /* with lp: the candidates' raw logits [B, k] */
    double *lse;              /* with lp: the rows' log-sum-exp [B] */
    int *idx, B, V, k, split; /* split: with scratch (rows over blocks) */
    int lp; /* top-k with what log-probabilities need (raw, lse) */
} samp_ctx;

static int argmax_run(void *ctx, int rep)
{
    const samp_ctx *c = ctx;
    (void)rep;
    return hk_cuda_argmax(c->idx, c->lg, c->B, c->V, c->V, 0,
                          c->split ? c->scr : NULL, NULL);
}

static int topk_run(void *ctx, int rep)
{
    const samp_ctx *c = ctx;
    (void)rep;
    return hk_cuda_topk(c->p, c->idx, c->lp ? c->raw : NULL,
                        c->lp ? c->lse : NULL, c->lg, c->B, c->V, c->V, c->k,
                        1.0, 0, c->scr, NULL);
}

/* sample_argmax (rows split over blocks, the engine's call),
 * sample_argmax_1blk (one block a row, no scratch), sample_topk at k = 20
 * and HK_CUDA_TOPK_MAX, sample_topk_lp at HK_CUDA_TOPK_MAX with the
 * log-probabilities' raw logits and log-sum-exp (a second exp a logit on
 * the normalizer's pass), for B rows of a vocabulary of V (Qwen3.5's
 * 248320, Qwen3-Next's 151936); GB/s of the logits read once (top-k reads
 * them five times, from L2 where they fit). Logits: 4 random rows of
 * N(0, 4) repeated. */
static void bench_sample(const char *model, int V, int B)
{
    samp_ctx c = {0};
    c.B = B, c.V = V;
    const size_t R = B < 4 ? (size_t)B : 4, rb = (size_t)V * sizeof(float);
    float *h = halloc(R * rb);
    for (size_t i = 0; i < R * V; i++)
        h[i] = (float)(4.0 * nrand());
    c.lg = dev_tiled(h, R * rb, (size_t)B * rb);
    free(h);
    c.p = dalloc((size_t)B * HK_CUDA_TOPK_MAX * sizeof(float));
    c.idx = dalloc((size_t)B * HK_CUDA_TOPK_MAX * sizeof(int));
    c.raw = dalloc((size_t)B * HK_CUDA_TOPK_MAX * sizeof(float));
    c.lse = dalloc((size_t)B * sizeof(double));
    c.scr = dalloc(hk_cuda_topk_scratch(B, 0) * sizeof(float));
    const double bytes = (double)B * V * sizeof(float);
    char params[96];
    snprintf(params, sizeof params, "B=%d,V=%d", B, V);
    c.split = 1;
    measure("sample_argmax", model, params, argmax_run, &c, B, bytes, 0);
    c.split = 0;
    measure("sample_argmax_1blk", model, params, argmax_run, &c, B, bytes, 0);
    const int ks[2] = {tiny ? 5 : 20, HK_CUDA_TOPK_MAX};
    for (int j = 0; j < 2; j++) {
        c.k = ks[j] < V ? ks[j] : V;
        snprintf(params, sizeof params, "B=%d,V=%d,k=%d", B, V, c.k);
        measure("sample_topk", model, params, topk_run, &c, B, bytes, 0);
    }
    c.lp = 1; /* c.k: HK_CUDA_TOPK_MAX (or V), as the engine asks */
    measure("sample_topk_lp", model, params, topk_run, &c, B, bytes, 0);
    CK(hk_cuda_free(c.lg));
    CK(hk_cuda_free(c.p));
    CK(hk_cuda_free(c.idx));
    CK(hk_cuda_free(c.raw));
    CK(hk_cuda_free(c.lse));
    CK(hk_cuda_free(c.scr));
}

static void bench_mm(const char *model, int n, int in, int out,
                     hk_cuda_blas_t *blas)
{
    char params[128];
    snprintf(params, sizeof params, "n=%d,in=%d,out=%d", n, in, out);
    if (over_budget()) {
        skipped("matmul_f32", model, params, "skipped: budget");
        skipped("matmul_bf16", model, params, "skipped: budget");
        return;
    }
    mm_ctx c;
    mm_setup(&c, n, in, out, blas);
    const double fl = 2.0 * n * in * out;
    /* few rows: GB/s of the bf16 weights read once (what bounds them) */
    const double wbytes = n <= HK_CUDA_GEMV_ROWS ? 2.0 * in * out : 0;
    c.bf16 = 0;
    measure("matmul_f32", model, params, mm_run, &c, n, 0, fl);
    c.bf16 = 1;
    measure("matmul_bf16", model, params, mm_run, &c, n, wbytes, fl);
    if (n <= HK_CUDA_GEMV_ROWS) {
        c.gemv = 1;
        measure("matmul_bf16_gemv", model, params, mm_run, &c, n, wbytes, fl);
    }
    mm_free(&c);
}

/* A GDN layer's in-projections at few rows (decode): qkv, z, b and a of
 * one input, as the engine runs them: cuBLAS a matrix at a time
 * (matmul_bf16_n4) against one launch for all four (_gemv). */
static void bench_mm_parts(const model_t *m, int n, hk_cuda_blas_t *blas)
{
    const int outs[4] = {2 * m->Hk * m->dk + m->Hv * m->dv, m->Hv * m->dv,
                         m->Hv, m->Hv};
    const int out = outs[0] + outs[1] + outs[2] + outs[3];
    char params[128];
    snprintf(params, sizeof params, "n=%d,in=%d,out=%d+%d+%d+%d", n, m->hidden,
             outs[0], outs[1], outs[2], outs[3]);
    if (over_budget()) {
        skipped("matmul_bf16_n4", m->name, params, "skipped: budget");
        return;
    }
    mm_ctx c;
    mm_setup(&c, n, m->hidden, out, blas);
    c.bf16 = 1;
    c.parts = 4;
    memcpy(c.part_out, outs, sizeof outs);
    const double wbytes = 2.0 * m->hidden * out, fl = 2.0 * n * m->hidden * out;
    measure("matmul_bf16_n4", m->name, params, mm_run, &c, n, wbytes, fl);
    c.gemv = 1;
    measure("matmul_bf16_n4_gemv", m->name, params, mm_run, &c, n, wbytes, fl);
    mm_free(&c);
}

static void dump_mm(const char *model, int n, int in, int out,
                    hk_cuda_blas_t *blas)
{
    mm_ctx c;
    mm_setup(&c, n, in, out, blas);
    char meta[256], name[64];
    snprintf(meta, sizeof meta, "op matmul\nmodel %s\nn %d\nin %d\nout %d\n",
             model, n, in, out);
    snprintf(name, sizeof name, "matmul-%s", model);
    dump_begin(name, meta);
    dump_dev("x.f32", c.x, (size_t)n * in * 4);
    dump_dev("w.f32", c.w, (size_t)out * in * 4);
    c.bf16 = 0;
    CK(mm_run(&c, 0));
    dump_dev("y_f32.f32", c.y, (size_t)n * out * 4);
    c.bf16 = 1;
    CK(mm_run(&c, 0));
    dump_dev("y_bf16.f32", c.y, (size_t)n * out * 4);
    mm_free(&c);
}

/* ---- prefill row ops ------------------------------------------------------
 * The prefill's memory-bound launches between the projections: the GDN
 * input path (hk_cuda_conv_qkv: conv, SiLU, l2 norms, gates), the GDN
 * output norm (rmsnorm_gated, T Hv rows of dv), SwiGLU on the bf16 GEMM
 * outputs and the hidden norm with a bf16 store (the engine's calls).
 * GB/s of the bytes read and written once. */

enum { PF_CONV, PF_GATED, PF_GATED_BF16, PF_SWIGLU, PF_NORM, PF_QK, PF_QK5 };

typedef struct {
    int kind, T, Hk, Hv, dk, dv, rows, dim;
    int Hq, Hkv, hd, rot; /* the attention prologue's (PF_QK, PF_QK5) */
    size_t n;
    float *x, *w, *st, *q, *k, *v, *g, *beta, *A_log, *dtb, *z, *y;
    float *P, *gate, *qw, *kw;
    int *pos;
    uint16_t *gb, *ub, *yb;
} pf_ctx;

/* The attention prologue's five launches (split, two norms, two RoPEs). */
static int qk5_run(const pf_ctx *c)
{
    const int T = c->T, hd = c->hd;
    int rc;
    if ((rc = hk_cuda_split_heads(c->q, c->gate, NULL, c->P, T * c->Hq, hd, hd,
                                  0, NULL)) ||
        (rc = hk_cuda_rmsnorm_zc(c->q, c->q, c->qw, T * c->Hq, hd, NORM_EPS,
                                 NULL)) ||
        (rc = hk_cuda_rmsnorm_zc(c->k, c->k, c->kw, T * c->Hkv, hd, NORM_EPS,
                                 NULL)) ||
        (rc = hk_cuda_rope(c->q, c->pos, T, c->Hq, hd, c->rot, ROPE_THETA,
                           NULL)))
        return rc;
    return hk_cuda_rope(c->k, c->pos, T, c->Hkv, hd, c->rot, ROPE_THETA, NULL);
}

static int pf_run(void *ctx, int rep)
{
    const pf_ctx *c = ctx;
    (void)rep;
    switch (c->kind) {
    case PF_CONV:
        return hk_cuda_conv_qkv(c->q, c->k, c->v, c->st, c->x, c->w, c->g,
                                c->beta, c->A_log, c->dtb, c->T, c->Hk, c->Hv,
                                c->dk, c->dv, CONV_K, NORM_EPS,
                                1.0f / sqrtf((float)c->dk), NULL);
    case PF_GATED:
        return hk_cuda_rmsnorm_gated(c->y, c->x, c->z, c->w, c->rows, c->dim,
                                     NORM_EPS, NULL);
    case PF_GATED_BF16:
        return hk_cuda_rmsnorm_gated_bf16(c->yb, c->x, c->z, c->w, c->rows,
                                          c->dim, NORM_EPS, NULL);
    case PF_SWIGLU:
        return hk_cuda_swiglu_bf16_in(c->gb, c->gb, c->ub, c->n, NULL);
    case PF_QK:
        return hk_cuda_qk_norm_rope(c->q, c->gate, c->k, c->P, c->qw, c->kw,
                                    c->pos, c->T, c->Hq, c->Hkv, c->hd, c->rot,
                                    ROPE_THETA, NORM_EPS, NULL);
    case PF_QK5:
        return qk5_run(c);
    default:
        return hk_cuda_rmsnorm_zc_bf16(c->yb, c->x, c->w, c->rows, c->dim,
                                       NORM_EPS, NULL);
    }
}

/* Device floats of n values of amplitude amp (a 1 MB block repeated). */
static float *pf_floats(size_t n, double amp)
{
    const size_t R = n < ((size_t)1 << 18) ? n : (size_t)1 << 18;
    float *h = halloc(R * sizeof(float));
    for (size_t i = 0; i < R; i++)
        h[i] = (float)(amp * nrand());
    float *d = dev_tiled(h, R * sizeof(float), n * sizeof(float));
    free(h);
    return d;
}

static uint16_t *pf_bf16(size_t n, double amp)
{
    const size_t R = n < ((size_t)1 << 18) ? n : (size_t)1 << 18;
    float *h = halloc(R * sizeof(float));
    for (size_t i = 0; i < R; i++)
        h[i] = (float)(amp * nrand());
    uint16_t *b = to_bf16(h, R);
    uint16_t *d = dev_tiled(b, R * 2, n * 2);
    free(h);
    free(b);
    return d;
}

static void pf_free(void *p)
{
    if (p)
        CK(hk_cuda_free(p));
}

/* A dense MLP's first half at few rows (decode): gate and up as bf16
 * (one GEMV launch), then SwiGLU (matmul_bf16_swiglu), against all of it
 * in one launch (matmul_bf16_swiglu_gemv, hk_cuda_gemv_bf16_swiglu). */
typedef struct {
    uint16_t *xb, *wg, *wu, *g, *u;
    int n, in, out, fused;
} glu_ctx;

static int glu_run(void *ctx, int rep)
{
    const glu_ctx *c = ctx;
    (void)rep;
    if (c->fused)
        return hk_cuda_gemv_bf16_swiglu(c->g, c->wg, c->wu, c->out, c->xb, c->n,
                                        c->in, NULL);
    hk_cuda_gemv_t p = {{c->g, c->u}, {c->wg, c->wu}, {c->out, c->out}};
    const int rc = hk_cuda_gemv_bf16(&p, 2, c->xb, c->n, c->in, 0, 1, NULL);
    return rc ? rc
              : hk_cuda_swiglu_bf16_in(c->g, c->g, c->u, (size_t)c->n * c->out,
                                       NULL);
}

static void bench_mm_swiglu(const model_t *m, int n)
{
    char params[128];
    snprintf(params, sizeof params, "n=%d,in=%d,out=2x%d", n, m->hidden,
             m->mlp);
    if (!measured("matmul_bf16_swiglu"))
        return;
    const size_t nw = (size_t)m->mlp * m->hidden;
    glu_ctx c = {pf_bf16((size_t)n * m->hidden, 1.0),
                 pf_bf16(nw, 0.05),
                 pf_bf16(nw, 0.05),
                 dalloc((size_t)n * m->mlp * 2),
                 dalloc((size_t)n * m->mlp * 2),
                 n,
                 m->hidden,
                 m->mlp,
                 0};
    const double wbytes = 4.0 * nw, fl = 4.0 * n * nw;
    measure("matmul_bf16_swiglu", m->name, params, glu_run, &c, n, wbytes, fl);
    c.fused = 1;
    measure("matmul_bf16_swiglu_gemv", m->name, params, glu_run, &c, n, wbytes,
            fl);
    void *all[] = {c.xb, c.wg, c.wu, c.g, c.u};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        pf_free(all[i]);
}

/* conv_qkv and rmsnorm_gated at model m's GDN shapes, T tokens. */
static void bench_prefill_gdn(const model_t *m, int T)
{
    pf_ctx c = {0};
    c.T = T, c.Hk = m->Hk, c.Hv = m->Hv, c.dk = m->dk, c.dv = m->dv;
    const size_t C = 2 * (size_t)m->Hk * m->dk + (size_t)m->Hv * m->dv;
    const size_t ng = (size_t)T * m->Hv, nv = ng * m->dv;
    char params[96];
    snprintf(params, sizeof params, "T=%d,Hk=%d,Hv=%d,d=%d", T, m->Hk, m->Hv,
             m->dk);
    if (measured("prefill_conv_qkv")) {
        c.kind = PF_CONV;
        c.x = pf_floats((size_t)T * C, 1.0);
        c.w = pf_floats(C * CONV_K, 0.5);
        c.st = pf_floats(C * (CONV_K - 1), 1.0);
        c.q = dalloc((size_t)T * m->Hk * m->dk * 4);
        c.k = dalloc((size_t)T * m->Hk * m->dk * 4);
        c.v = dalloc(nv * 4);
        c.g = pf_floats(ng, 1.0);
        c.beta = pf_floats(ng, 1.0);
        c.A_log = pf_floats((size_t)m->Hv, 0.5);
        c.dtb = pf_floats((size_t)m->Hv, 0.5);
        /* x read, q k v written, the gates read and written */
        const double bytes = 2.0 * T * C * 4 + 4.0 * ng * 4;
        measure("prefill_conv_qkv", m->name, params, pf_run, &c, T, bytes, 0);
        void *all[] = {c.x, c.w, c.st,   c.q,     c.k,
                       c.v, c.g, c.beta, c.A_log, c.dtb};
        for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
            pf_free(all[i]);
    }
    if (measured("prefill_rmsnorm_gated")) {
        c.rows = T * m->Hv, c.dim = m->dv;
        c.x = pf_floats(nv, 1.0);
        c.z = pf_floats(nv, 2.0);
        c.w = pf_floats((size_t)m->dv, 0.5);
        c.y = dalloc(nv * 4);
        c.yb = dalloc(nv * 2);
        snprintf(params, sizeof params, "rows=%d,dim=%d", c.rows, c.dim);
        c.kind = PF_GATED;
        measure("prefill_rmsnorm_gated", m->name, params, pf_run, &c, T,
                nv * 12.0, 0);
        c.kind = PF_GATED_BF16;
        measure("prefill_rmsnorm_gated_bf16", m->name, params, pf_run, &c, T,
                nv * 10.0, 0);
        void *all[] = {c.x, c.z, c.w, c.y, c.yb};
        for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
            pf_free(all[i]);
    }
}

/* A gated attention layer's prologue at model m's heads (a quarter of hd
 * rotated, as Qwen3.5's), T tokens: prefill_qk_norm_rope (one launch)
 * against _unfused (the five it replaces); at T = 4 (a decode step's
 * rows) the launches are most of it. GB/s of P read, q, gate and k
 * written, k read. */
static void bench_prefill_att(const model_t *m, int T)
{
    pf_ctx c = {0};
    char params[96];
    if (!measured("prefill_qk_norm_rope"))
        return;
    c.T = T, c.Hq = m->Hq, c.Hkv = m->Hkv, c.hd = m->hd, c.rot = m->hd / 4;
    const size_t nq = (size_t)T * m->Hq * m->hd,
                 nk = (size_t)T * m->Hkv * m->hd;
    c.P = pf_floats(2 * nq, 1.0);
    c.q = dalloc(nq * 4);
    c.gate = dalloc(nq * 4);
    c.k = pf_floats(nk, 1.0);
    c.qw = pf_floats((size_t)m->hd, 0.5);
    c.kw = pf_floats((size_t)m->hd, 0.5);
    int *pos = malloc((size_t)T * sizeof(int));
    for (int t = 0; t < T; t++)
        pos[t] = 4096 + t;
    c.pos = dalloc((size_t)T * sizeof(int));
    CK(hk_cuda_h2d(c.pos, pos, (size_t)T * sizeof(int), NULL));
    free(pos);
    snprintf(params, sizeof params, "T=%d,Hq=%d,Hkv=%d,hd=%d,rot=%d", T, c.Hq,
             c.Hkv, c.hd, c.rot);
    const double bytes = (4.0 * nq + 2.0 * nk) * 4;
    c.kind = PF_QK;
    measure("prefill_qk_norm_rope", m->name, params, pf_run, &c, T, bytes, 0);
    c.kind = PF_QK5;
    measure("prefill_qk_norm_rope_unfused", m->name, params, pf_run, &c, T,
            bytes, 0);
    void *all[] = {c.P, c.q, c.gate, c.k, c.qw, c.kw, c.pos};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        pf_free(all[i]);
}

/* SwiGLU on bf16 (in place over g, as the engine) and the bf16-store
 * hidden norm, T rows of a dense model's widths. */
static void bench_prefill_dense(const char *model, int T, int hidden, int inter)
{
    pf_ctx c = {0};
    char params[96];
    if (measured("prefill_swiglu_bf16_in")) {
        c.kind = PF_SWIGLU, c.n = (size_t)T * inter;
        c.gb = pf_bf16(c.n, 3.0);
        c.ub = pf_bf16(c.n, 1.0);
        snprintf(params, sizeof params, "T=%d,I=%d", T, inter);
        measure("prefill_swiglu_bf16_in", model, params, pf_run, &c, T,
                c.n * 6.0, 0);
        pf_free(c.gb);
        pf_free(c.ub);
    }
    if (measured("prefill_rmsnorm_bf16")) {
        c.kind = PF_NORM, c.rows = T, c.dim = hidden;
        c.n = (size_t)T * hidden;
        c.x = pf_floats(c.n, 1.0);
        c.w = pf_floats((size_t)hidden, 0.5);
        c.yb = dalloc(c.n * 2);
        snprintf(params, sizeof params, "rows=%d,dim=%d", T, hidden);
        measure("prefill_rmsnorm_bf16", model, params, pf_run, &c, T, c.n * 6.0,
                0);
        void *all[] = {c.x, c.w, c.yb};
        for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
            pf_free(all[i]);
    }
}

/* ---- main
 * ------------------------------------------------------------------------ */

int main(int argc, char **argv)
{
    const char *out = "gpu_kernels.tsv";
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--out") && i + 1 < argc)
            out = argv[++i];
        else if (!strcmp(argv[i], "--dump") && i + 1 < argc)
            dump_dir = argv[++i];
        else if (!strcmp(argv[i], "--budget") && i + 1 < argc)
            budget = atof(argv[++i]);
        else if (!strcmp(argv[i], "--tiny"))
            tiny = 1;
        else if (!strcmp(argv[i], "--legacy"))
            legacy = 1;
        else if (!strcmp(argv[i], "--only") && i + 1 < argc)
            only = argv[++i];
        else {
            fprintf(stderr,
                    "usage: %s [--out FILE.tsv] [--dump DIR] "
                    "[--budget SECONDS] [--tiny] [--only PREFIX]\n",
                    argv[0]);
            return 2;
        }
    }
    tsv = fopen(out, "w");
    if (!tsv) {
        fprintf(stderr, "cannot write %s\n", out);
        return 1;
    }
    fprintf(tsv, "op\tmodel\tparams\tms\treps\ttokens_per_s\tgb_per_s\t"
                 "tflop_per_s\tnote\n");
    int ndev = 0;
    CK(hk_cuda_device_count(&ndev));
    if (ndev == 0) {
        printf("no CUDA device: nothing measured\n");
        fprintf(tsv, "device\t-\t-\t-\t0\t-\t-\t-\tno CUDA device\n");
        fclose(tsv);
        return 0;
    }
    char name[128] = "?";
    int sms = 0;
    size_t mem = 0;
    CK(hk_cuda_device_info(name, sizeof name, &sms, &mem));
    printf("# device: %s, %d SMs, %.1f GiB\n", name, sms,
           mem / (1024.0 * 1024 * 1024));
    fprintf(tsv, "device\t%s\tsms=%d,mem=%zu\t-\t0\t-\t-\t-\t\n", name, sms,
            mem);
    t_begin = bench_now();
    hk_cuda_blas_t *blas = NULL;
    CK(hk_cuda_blas_create(&blas));

    const model_t *ms = tiny ? &tiny_model : models;
    const int nm = tiny ? 1 : 2;
    if (dump_dir)
        for (int i = 0; i < nm; i++) {
            if (wanted("gdn_chunk"))
                dump_chunk(&ms[i], tiny ? 40 : i == 0 ? 1024 : 512);
            if (wanted("gdn_step") || wanted("gdn_decode"))
                dump_step(&ms[i], tiny ? 2 : 4);
            dump_att(&ms[i], tiny ? 24 : 512, 0, 0);
            dump_att(&ms[i], 0, tiny ? 2 : 4, tiny ? 16 : 1024);
            dump_att_paged(&ms[i], tiny ? 2 : 4, tiny ? 16 : 1024, 16);
        }
    if (dump_dir && wanted("matmul"))
        dump_mm(ms[0].name, tiny ? 4 : 64, ms[0].hidden, tiny ? 16 : 512, blas);

    printf("| op | model | params | ms | reps | tokens/s | GB/s | TFLOP/s | "
           "note |\n|---|---|---|---:|---:|---:|---:|---:|---|\n");
    bench_copy();
    static const int Ts[] = {4096, 16384, 65536}, Bs[] = {1, 16, 64, 256};
    const int nT = tiny ? 1 : 3, nB = tiny ? 2 : 4;
    for (int t = 0; t < nT && wanted("gdn_chunk"); t++)
        for (int i = 0; i < nm; i++)
            bench_chunk(&ms[i], tiny ? 40 : Ts[t]);
    for (int b = 0; b < nB && (wanted("gdn_step") || wanted("gdn_decode")); b++)
        for (int i = 0; i < nm; i++)
            bench_decode(&ms[i], tiny ? b + 1 : Bs[b]);
    for (int b = 0; b < nB && wanted("kvbuf"); b++)
        for (int i = 0; i < nm; i++)
            bench_kvbuf(&ms[i], tiny ? b + 1 : Bs[b]);
    for (int b = 0; b < nB && wanted("attention_decode"); b++)
        for (int i = 0; i < nm; i++) {
            bench_att_decode(&ms[i], tiny ? b + 1 : Bs[b], tiny ? 16 : 4096);
            bench_att_decode_paged(&ms[i], tiny ? b + 1 : Bs[b],
                                   tiny ? 64 : 4096);
        }
    static const int vocab[2] = {248320, 151936};
    for (int b = 0; b < nB && wanted("sample"); b++)
        for (int i = 0; i < nm; i++)
            bench_sample(ms[i].name, tiny ? 1000 : vocab[i],
                         tiny ? b + 1 : Bs[b]);
    for (int i = 0; i < nm && wanted("matmul"); i++) {
        const model_t *m = &ms[i];
        const int ns[4] = {tiny ? 8 : 4096, tiny ? 2 : 64, 4, 1};
        for (int j = 0; j < (tiny ? 2 : 4); j++) {
            bench_mm(m->name, ns[j], m->hidden, m->qkv, blas);
            bench_mm(m->name, ns[j], m->hidden, m->mlp, blas);
        }
        for (int j = 0; j < 2; j++) {
            bench_mm_parts(m, tiny ? 2 : 1 + 3 * j, blas);
            bench_mm_swiglu(m, tiny ? 2 : 1 + 3 * j);
        }
    }
    double last_ms[2][N_ATT_PREFILL] = {{0}};
    int last_T[2][N_ATT_PREFILL] = {{0}};
    for (int t = 0; t < nT && wanted("attention_prefill"); t++)
        for (int i = 0; i < nm; i++)
            bench_att_prefill(&ms[i], tiny ? 20 : Ts[t], last_ms[i], last_T[i]);
    /* the seams of 4 and 8 segments of 4k (2 x 8 tokens each) and a
     * 512-token resume, over 16k and 32k keys */
    static const int appT[] = {64, 128, 512}, appN[] = {16384, 32768};
    for (int a = 0; a < 3 && wanted("attention_append"); a++)
        for (int n = 0; n < 2; n++)
            for (int i = 0; i < nm; i++)
                bench_att_append(&ms[i], tiny ? 3 + a : appT[a],
                                 tiny ? 300 + 100 * n : appN[n]);
    for (int i = 0; i < nm && wanted("prefill"); i++) {
        bench_prefill_gdn(&ms[i], tiny ? 40 : 16384);
        bench_prefill_att(&ms[i], tiny ? 40 : 16384);
        bench_prefill_att(&ms[i], 4);
    }
    if (wanted("prefill")) /* a 9B-like dense model's widths */
        bench_prefill_dense(tiny ? "tiny" : "9b-like", tiny ? 40 : 16384,
                            tiny ? 64 : 4096, tiny ? 80 : 12288);
    hk_cuda_blas_destroy(blas);
    fclose(tsv);
    printf("# %.1f s\n", bench_now() - t_begin);
    return 0;
}
