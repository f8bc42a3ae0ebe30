/*
 * hk_cuda.h - the CUDA kernels: twins of kernels/cpu/hk_cpu.h, callable
 * from C. It includes no CUDA header, so the engine and the tests compile
 * with gcc alone and link libhk_cuda.a + -lcudart -lcublas.
 *
 * Conventions: the CPU ones (outputs first, then inputs, then dims; shapes
 * in comments; row-major f32), plus:
 *   - every tensor pointer is a device pointer;
 *   - the last argument is the stream, a cudaStream_t passed as void *
 *     (NULL = the legacy default stream); launchers are asynchronous;
 *   - every launcher returns an hk_cuda_status_t: 0, or a negative code
 *     (a failed cudaGetLastError() after the launch is HK_CUDA_ELAUNCH).
 *     Library code never exits or prints; hk_cuda_strerror names a code;
 *   - kernels never allocate: scratch is passed in, sized by the
 *     matching _scratch function (counted in floats, like the CPU's).
 * Numerics follow the CPU kernels' order of operations where it is fixed
 * by the math (the GDN step order, the chunk quantities); sums of products
 * are f32 in another order, so results agree to f32 rounding, not bits.
 */
#ifndef HK_CUDA_H
#define HK_CUDA_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>

/* hk_cpu.h for hk_trans_family_t, with C linkage under nvcc too; its system
 * headers are included above, outside the extern "C" block. */
#ifdef __cplusplus
extern "C" {
#endif

#include "kernels/common/hk_kvbuf_geom.h"
#include "kernels/cpu/hk_cpu.h"

typedef enum {
    HK_CUDA_OK = 0,
    HK_CUDA_ENODEV = -1,   /* no device or no driver */
    HK_CUDA_EINVAL = -2,   /* bad shape or argument */
    HK_CUDA_ENOMEM = -3,   /* cudaMalloc failed */
    HK_CUDA_ELAUNCH = -4,  /* kernel launch failed (cudaGetLastError) */
    HK_CUDA_ERUNTIME = -5, /* other CUDA runtime error (copy, sync) */
    HK_CUDA_EBLAS = -6,    /* cuBLAS error */
    /* the device faulted (illegal address or instruction, uncorrectable
     * ECC, a device-side assert, ...): the context is lost, every later
     * call fails, and only a new process gets the device back */
    HK_CUDA_EFAULT = -7
} hk_cuda_status_t;

/* A static string naming rc. */
const char *hk_cuda_strerror(int rc);

/* *n = number of usable devices. No device or no driver (cudaGetDeviceCount
 * failing with cudaErrorNoDevice / cudaErrorInsufficientDriver, error 35
 * on our CI) is not an error: *n = 0, returns 0. Other failures return
 * HK_CUDA_ERUNTIME with *n = 0. */
int hk_cuda_device_count(int *n);

/* Makes device dev (0 .. count-1) current for this host thread: the
 * device of later allocations, launches and handles. HK_CUDA_ENODEV for
 * a device that does not exist. */
int hk_cuda_set_device(int dev);

/* ---- memory and streams (thin checked wrappers) ------------------------ */

int hk_cuda_malloc(void **p, size_t bytes); /* *p = NULL on failure */
int hk_cuda_free(void *p);                  /* NULL is a no-op */
/* hk_cuda_malloc calls that succeeded so far, in this process: a serving
 * loop's tests check that a step makes none (each one may synchronize
 * the device). */
unsigned long hk_cuda_malloc_count(void);
int hk_cuda_memset0(void *p, size_t bytes, void *stream);
int hk_cuda_h2d(void *dst, const void *src, size_t bytes, void *stream);
int hk_cuda_d2h(void *dst, const void *src, size_t bytes, void *stream);
int hk_cuda_d2d(void *dst, const void *src, size_t bytes, void *stream);
int hk_cuda_stream_sync(void *stream);
/* Host waits for the device so far (stream syncs, the h2d/d2h copies'
 * included): a serving loop's tests check that a decode step waits once,
 * for its results, however many ops it issues. */
unsigned long hk_cuda_sync_count(void);
/* Nanoseconds the host spent in those waits (and in the staging ring's,
 * which the count leaves out): with a step's wall time, whether the host
 * issuing ops or the device running them is what a step waits on. */
unsigned long long hk_cuda_wait_ns(void);
/* Bytes copied between host and device so far (h2d, d2h, the staging
 * ring's): tests check that a warm PIC splice moves no cached tuple over
 * the host link. */
unsigned long long hk_cuda_host_bytes(void);
/* ... and the copies that moved them, one each (the staging memo's
 * reuses are none). */
unsigned long hk_cuda_host_copies(void);

/* Staging ring (hk_ring.cu): host arrays an op takes (positions, ids,
 * pointer lists) copied to the device ahead of the kernels that read
 * them, without waiting. Pinned host memory and a device buffer of 4
 * segments of seg_bytes; a put copies into the host side and queues the
 * copy on the stream. A put that leaves a segment marks its end with an
 * event; entering a segment waits for that segment's mark (its copies
 * done), so the host runs at most three segments ahead. One stream and
 * one host thread at a time per ring. */
typedef struct hk_cuda_ring hk_cuda_ring_t;
int hk_cuda_ring_create(hk_cuda_ring_t **r, size_t seg_bytes);
void hk_cuda_ring_destroy(hk_cuda_ring_t *r); /* NULL is a no-op */
size_t hk_cuda_ring_seg_bytes(const hk_cuda_ring_t *r);
/* Device room for bytes (at most seg_bytes, else HK_CUDA_EINVAL), 256-byte
 * aligned, holding a copy of src when it is not NULL, valid for the work
 * issued on stream after this call until the ring comes round again. */
int hk_cuda_ring_put(hk_cuda_ring_t *r, const void *src, size_t bytes,
                     void *stream, void **dev);
/* The segments the ring has entered so far. A put's copy stays on the
 * device, for work issued later, until the ring comes round to its
 * segment again: while this mark, read right after the put, has grown by
 * less than HK_CUDA_RING_SEGS. In that window a caller may hand the same
 * copy to later ops instead of putting it again. */
#define HK_CUDA_RING_SEGS 4
uint64_t hk_cuda_ring_mark(const hk_cuda_ring_t *r);

/* Side streams (hk_lanes.cu) that let one call's launches overlap (the
 * GDN chunk's segments, HK_CUDA_GDN_TC_OVERLAP): three non-blocking
 * streams of the device's highest, a middle and its lowest priority, and
 * the events that fork them from the caller's stream and join them back
 * into it. One call at a time per set; the caller's stream sees the
 * call's work done, in order, as if it had run there. */
typedef struct hk_cuda_lanes hk_cuda_lanes_t;
int hk_cuda_lanes_create(hk_cuda_lanes_t **l);
void hk_cuda_lanes_destroy(hk_cuda_lanes_t *l); /* NULL is a no-op */

/* The current device's name (truncated to n - 1 characters), its number of
 * multiprocessors and its memory in bytes; any output may be NULL. */
int hk_cuda_device_info(char *name, size_t n, int *sms, size_t *mem);
/* The current device's compute capability as major 10 + minor (90: an
 * H100 or H200); 0 where it cannot say. */
int hk_cuda_compute_capability(void);
/* The current device's free and total memory in bytes (cudaMemGetInfo:
 * what every process and the context hold counts as used). */
int hk_cuda_mem_info(size_t *free_bytes, size_t *total);

/* Elapsed device time between two points of a stream (a pair of CUDA
 * events), for the benches: start, launch work, stop (which waits for the
 * work and gives the milliseconds between the two events). */
typedef struct {
    void *start, *stop;
} hk_cuda_timer_t;
int hk_cuda_timer_create(hk_cuda_timer_t *t);
void hk_cuda_timer_destroy(hk_cuda_timer_t *t); /* zeroed: a no-op */
int hk_cuda_timer_start(hk_cuda_timer_t *t, void *stream);
int hk_cuda_timer_stop(hk_cuda_timer_t *t, void *stream, double *ms);

/* An online tuner (hk_tune.cu) for an op whose ncand kernels give the same
 * results bit for bit (the decode step's PIPE, PIPEA and PIPEW; the GDN
 * chunk's state pass with and without HK_CUDA_GDN_TC_R64 or _DEEP; the
 * attention prefill's FLASH3, FLASH3_SEQ and FLASH3_WS; the chunk's kernel
 * O with and without HK_CUDA_GDN_TC_O64): per size
 * class (key: any number the caller makes of the call's shape), pick says
 * which kernel a call runs; until each has samples timings at the class,
 * the kernels take turns and *timed asks the caller to wrap the launch in
 * begin / end (events on its stream); then the class runs its fastest
 * (the least of its times). Timings are read once complete, never waited
 * for. 4096 classes at most (later ones run kernel 0). One host thread at a
 * time. */
typedef struct hk_cuda_tuner hk_cuda_tuner_t;
#define HK_CUDA_TUNER_MAX_CAND 16 /* ncand's most */
int hk_cuda_tuner_create(hk_cuda_tuner_t **t, int ncand, int samples);
void hk_cuda_tuner_destroy(hk_cuda_tuner_t *t);
int hk_cuda_tuner_pick(hk_cuda_tuner_t *t, long long key, int *timed);
/* pick among the kernels of mask (bit k: kernel k) only, where a class
 * has fewer (they would run the same launches): the mask a class is first
 * seen with is its own; kernel 0 is always one; with no other the class
 * runs kernel 0, untimed. */
int hk_cuda_tuner_pick_of(hk_cuda_tuner_t *t, long long key, unsigned mask,
                          int *timed);
int hk_cuda_tuner_begin(hk_cuda_tuner_t *t, void *stream);
int hk_cuda_tuner_end(hk_cuda_tuner_t *t, void *stream);
/* Instead of end where the timed call failed: no time is taken, and the
 * kernel leaves the class's running (never its choice, unless every one
 * failed: then kernel 0). */
int hk_cuda_tuner_fail(hk_cuda_tuner_t *t);
/* The class's kernel once tuned, else -1. */
int hk_cuda_tuner_best(const hk_cuda_tuner_t *t, long long key);
/* Class i (0, 1, ... in the order first seen; the times in so far read
 * first): its key, its kernel once tuned (else -1) and each kernel's least
 * time, ms[ncand] (< 0: none in, or not one of the class's kernels);
 * HK_CUDA_EINVAL past the last class. */
int hk_cuda_tuner_class(hk_cuda_tuner_t *t, int i, long long *key, int *best,
                        float *ms);

/* Marks on a stream, for op profiles: a CUDA event recorded after each
 * piece of work; read gives the milliseconds between consecutive marks
 * (each piece's device time, and any idle gap before it), waiting for the
 * last, and empties the list. Create makes cap events up front: record
 * past them is HK_CUDA_ENOMEM. One host thread at a time. */
typedef struct hk_cuda_marks hk_cuda_marks_t;
int hk_cuda_marks_create(hk_cuda_marks_t **m, int cap);
void hk_cuda_marks_destroy(hk_cuda_marks_t *m); /* NULL: a no-op */
int hk_cuda_marks_record(hk_cuda_marks_t *m, void *stream);
/* ms[i] (i < *n, *n = marks - 1) is the time from mark i to mark i + 1. */
int hk_cuda_marks_read(hk_cuda_marks_t *m, float *ms, int *n);

/* In-kernel phase probes, for benches (hk_probe.cu): where a block's time
 * goes inside a kernel. hk_cuda_probe(stamps > 0) makes a device buffer
 * of that many 8-byte stamps and turns the probes on; 0 turns them off
 * and frees it. While on, the probed kernels (the tensor-core GDN chunk's
 * A2, A3, R and O; the decode step's KH, PIPE, PIPE32, PIPEA and PIPEW)
 * stamp the SM's clock at their phase boundaries, a
 * launch that does not fit the buffer unprobed. hk_cuda_probe_rows waits
 * for the device, sums the launches since the last read by kernel and
 * phase into rows (up to cap; *n of them) and starts over: per kernel its
 * phases in order, then a row of phase "span" (a block's whole time,
 * resident: the blocks an SM ran at once, on average), cycles of the
 * SM's clock (the emulator: ns); points: the stamps that ended the phase
 * (a loop's: one an iteration, so cycles blocks / points is an
 * iteration's). *dropped: the launches left unprobed.
 * Process-wide, one host thread; off, a probe is one uniform branch. */
typedef struct {
    char kernel[16], phase[16];
    double cycles;   /* a block's, on average over the blocks that ran */
    double share;    /* of the kernel's span */
    double resident; /* span rows; 0 in the phase rows */
    long long blocks, points;
} hk_cuda_probe_row_t;
int hk_cuda_probe(size_t stamps);
int hk_cuda_probe_rows(hk_cuda_probe_row_t *rows, int cap, int *n,
                       int *dropped);

/* cuBLAS handle for the projections and the dense transition products;
 * one per host thread that launches them. Create after choosing the
 * device. */
typedef struct hk_cuda_blas hk_cuda_blas_t;
int hk_cuda_blas_create(hk_cuda_blas_t **blas);
void hk_cuda_blas_destroy(hk_cuda_blas_t *blas); /* NULL is a no-op */

/* ---- dense projections (hk_matmul.cu) ---------------------------------- */

/* Twins of hk_matmul / hk_matmul_acc: y[n, out] (= or +=) x[n, in] .
 * W[out, in]^T, one cublasSgemm (row-major y^T = W x^T in cuBLAS's
 * column-major terms). y must not overlap x or w. */
int hk_cuda_matmul(float *y, const float *x, const float *w, int n, int in,
                   int out, hk_cuda_blas_t *blas, void *stream);
int hk_cuda_matmul_acc(float *y, const float *x, const float *w, int n, int in,
                       int out, hk_cuda_blas_t *blas, void *stream);
/* bf16 weights w[out, in] (bit patterns, the checkpoint's layout): x is
 * rounded to bf16 (nearest even) into xb[n * in], then cublasGemmEx
 * multiplies bf16 by bf16 with f32 accumulation into f32 y (= or += as
 * acc). x NULL: xb holds x rounded already (a call before this one on the
 * same x: several matrices of one input round it once). Twin: hk_matmul
 * over bf16-rounded x and w widened to f32. */
int hk_cuda_matmul_bf16(float *y, const float *x, const uint16_t *w, int n,
                        int in, int out, int acc, uint16_t *xb,
                        hk_cuda_blas_t *blas, void *stream);
/* xb[i] = x[i] rounded to bf16 (nearest even), i < n: a bf16
 * projection's input (hk_cuda_matmul_bf16's rounding, alone). */
int hk_cuda_to_bf16(uint16_t *xb, const float *x, size_t n, void *stream);
/* The same with y[n, out] in bf16 (cuBLAS rounds the f32 accumulation to
 * nearest even), no accumulate: a product whose consumer reads bf16 (a
 * bf16 checkpoint's MLP hidden rows), half the bytes written and read. y
 * must not overlap xb. */
int hk_cuda_matmul_bf16_to_bf16(uint16_t *y, const float *x, const uint16_t *w,
                                int n, int in, int out, uint16_t *xb,
                                hk_cuda_blas_t *blas, void *stream);

/* Few rows of x (decode): y_i[n, out_i] (= or += as acc) xb[n, in] .
 * W_i^T for k <= HK_CUDA_GEMV_PARTS bf16 matrices w[i] of one input, x
 * rounded already into xb (hk_cuda_matmul_bf16's), n <=
 * HK_CUDA_GEMV_ROWS, in one launch: one warp per output row reads its row
 * of W once (16 bytes a lane where in % 8 == 0 and the rows are 16-byte
 * aligned) and keeps n f32 sums of the bf16 products. bf set: each y_i is
 * bf16, the f32 sum rounded to nearest even (acc 0). Why: cuBLAS takes a
 * launch per matrix, and a decode step is launch-bound at small batch
 * (bench/gpu_engine's per-step split); this is one for a layer's
 * in-projections, at W's bytes. hk_cuda_matmul_bf16's products, summed in
 * another order. Twin: hk_matmul over the rounded x and widened w. */
#define HK_CUDA_GEMV_ROWS  4
#define HK_CUDA_GEMV_PARTS 4
typedef struct {
    void *y[HK_CUDA_GEMV_PARTS];           /* [n, out_i]: float, or bf16 */
    const uint16_t *w[HK_CUDA_GEMV_PARTS]; /* [out_i, in] bf16 */
    int out[HK_CUDA_GEMV_PARTS];
} hk_cuda_gemv_t;
int hk_cuda_gemv_bf16(const hk_cuda_gemv_t *p, int k, const uint16_t *xb, int n,
                      int in, int acc, int bf, void *stream);
/* A gated MLP's first half at few rows in one launch: h[n, out] (bf16) =
 * SwiGLU of g = xb wg^T and u = xb wu^T, each rounded to bf16 first:
 * hk_cuda_gemv_bf16's g and u (bf set), then hk_cuda_swiglu_bf16_in, bit
 * for bit; a warp an output row reads that row of both matrices. h must
 * not overlap xb. */
int hk_cuda_gemv_bf16_swiglu(uint16_t *h, const uint16_t *wg,
                             const uint16_t *wu, int out, const uint16_t *xb,
                             int n, int in, void *stream);

/* I8 weights (kernels/common/hk_weight.h; device data and scales): y[n,
 * rows] (= or += as acc) x[n, cols] . (q * scale)^T in f32. Up to
 * HK_CUDA_I8_DIRECT rows of x: one warp per output row reads q once.
 * More: W dequantized to f32 into scratch a tile of rows at a time
 * (scratch_floats / cols rows; at least one row: scratch_floats >= cols),
 * then cublasSgemm per tile; scratch is not read by the caller. Twin:
 * hk_linear on its generic / AVX2 path (W dequantized to f32, x as
 * given; the AVX-512 VNNI path rounds x to 8 bits, ~1e-2 apart). */
#define HK_CUDA_I8_DIRECT 8
int hk_cuda_linear_i8(float *y, const float *x, const hk_weight_t *w, int n,
                      int acc, float *scratch, size_t scratch_floats,
                      hk_cuda_blas_t *blas, void *stream);

/* ---- elementwise and data movement (hk_elementwise.cu) ----------------- */

/* Twins of hk_split_heads, hk_gate_mul, hk_scale_rows, hk_kv_store and
 * hk_embed (same layouts; pos and ids are device arrays). */
int hk_cuda_split_heads(float *a, float *b, float *c, const float *x, int rows,
                        int da, int db, int dc, void *stream);
int hk_cuda_gate_mul(float *o, const float *gate, size_t n, void *stream);
/* ob = o * sigmoid(gate) rounded to bf16 (hk_cuda_gate_mul's product, o
 * kept): a bf16 projection's input (hk_cuda_matmul_bf16 with x NULL). */
int hk_cuda_gate_mul_bf16(uint16_t *ob, const float *o, const float *gate,
                          size_t n, void *stream);
/* Twin of hk_axpy: y += a x. */
int hk_cuda_axpy(float *y, float a, const float *x, size_t n, void *stream);
int hk_cuda_scale_rows(float *x, const float *s, int rows, int dim, int sigm,
                       void *stream);
int hk_cuda_kv_store(float *kc, float *vc, const float *k, const float *v,
                     const int *pos, int T, int kvd, void *stream);
/* One new row for each of B requests, each with its own cache: kcs, vcs
 * are device arrays of B device pointers ([N_b, kvd] caches), k, v
 * [B, kvd], pos [B]. hk_kv_store with T = 1 per request. */
int hk_cuda_kv_store_decode(float *const *kcs, float *const *vcs,
                            const float *k, const float *v, const int *pos,
                            int B, int kvd, void *stream);
/* The same into paged K/V (the layout and P of
 * hk_cuda_attention_decode_paged, kvd = Hkv * hd): request b's row goes
 * to position pos[b] of its pages (table [B][max_pages], device). Twin:
 * hk_kv_store_paged. */
int hk_cuda_kv_store_paged(float *k_pages, float *v_pages, const float *k,
                           const float *v, const int *table, int max_pages,
                           const int *pos, int B, int P, int kvd, void *stream);
int hk_cuda_embed(float *x, const float *table, const int *ids, int T, int H,
                  void *stream);
/* Twin of hk_weight_rows (the embedding gather of any stored format):
 * x[t, :] = W[ids[t], :] as f32, W [rows, cols] F32, BF16 or I8 with its
 * scales (hk_weight.h); w is a host struct whose data and scales are
 * device pointers; ids [T] device. F32 and BF16 are exact, I8 q * scale
 * as hk_wtile. */
int hk_cuda_weight_rows(float *x, const hk_weight_t *w, const int *ids, int T,
                        void *stream);

/* ---- causal GQA attention (hk_attention.cu, hk_attention_tc.cu) -------- */

#define HK_CUDA_ATT_MAX_HD 512
/* The tensor-core prefill's largest head dim. */
#define HK_CUDA_ATT_TC_MAX_HD 256

/* Which kernels the attention calls run. DEFAULT is the environment's
 * HYPIC_CUDA_ATT (simple, flash, flash_bf16, flash2, flash2x, flash3,
 * flash3_seq or flash3_ws; read once), else FLASH2X: FLASH's accuracy at
 * 4.2-4.9x its speed on an H100 (bench/results/gpu/2026-11-27-h100-
 * session11). DEFAULT_BF16 is the default where bf16 operands are asked
 * for (a bf16 checkpoint, as transformers runs it): the environment's
 * choice, else FLASH3_SEQ on a compute capability 9.0 device (0.66-0.81x
 * torch SDPA's bf16 speed on an H200, 2.1-2.3x FLASH2's, FLASH3 3-4 %
 * slower: bench/results/gpu/2026-11-28-h200-session15), FLASH2 elsewhere
 * (1.8-1.9x FLASH2X's speed). Both fall back as below.
 *   SIMPLE      one block per (query, head), f32 CUDA cores; decode the
 *               same per (request, head) (the first kernels, kept to
 *               compare against).
 *   FLASH       prefill tiled on tensor cores, all heads of a kv group
 *               sharing each K/V tile, f32 operands split into bf16 hi +
 *               lo (3 MMAs per product, ~1e-5 of f32); decode split over
 *               the key axis, a group's heads sharing each K/V read.
 *   FLASH_BF16  the same prefill with q, k, p, v rounded to bf16 once
 *               (1 MMA, ~3e-3 relative); decode as FLASH.
 *   FLASH2      prefill in FlashAttention-2's structure (mma.sync with
 *               register fragments, cp.async double buffering) on bf16
 *               q, k, p, v (FLASH_BF16's precision); needs scratch
 *               (hk_cuda_attention_ex) for the bf16 copies of k and v;
 *               decode as FLASH.
 *   FLASH2X     FLASH2's structure on FLASH's split operands (q, k, p, v
 *               as bf16 hi + lo, 3 MMAs per product, ~1e-5 of f32);
 *               scratch twice FLASH2's (k and v hi and lo); decode as
 *               FLASH.
 *   FLASH3      prefill on Hopper's warpgroup tensor cores (wgmma, sm_90a:
 *               compute capability 9.0 only) on bf16 q, k, p, v (FLASH2's
 *               precision), the next tile's scores computed during this
 *               tile's softmax; scratch for k and v as bf16 tiles; decode
 *               as FLASH.
 *   FLASH3_SEQ  FLASH3 without that overlap: fewer registers (200 at hd
 *               256), faster on an H200; DEFAULT_BF16's choice there.
 *   FLASH3_WS   FLASH3_SEQ's warpgroups fed by a producer warp (warp
 *               specialization) and taking turns on the tensor cores, so
 *               one's softmax overlaps the other's products (ping-pong);
 *               no block barrier per tile. Untimed (2026-11-28).
 * FLASH falls back to SIMPLE where it cannot run (hd above
 * HK_CUDA_ATT_TC_MAX_HD, or the shared memory it needs), FLASH2 and
 * FLASH2X to FLASH (no scratch, or where they cannot run), FLASH3,
 * FLASH3_SEQ and FLASH3_WS to FLASH2 (another device); asked for explicitly
 * they return HK_CUDA_EINVAL there instead. */
typedef enum {
    HK_CUDA_ATT_DEFAULT = 0,
    HK_CUDA_ATT_SIMPLE = 1,
    HK_CUDA_ATT_FLASH = 2,
    HK_CUDA_ATT_FLASH_BF16 = 3,
    HK_CUDA_ATT_FLASH2 = 4,
    HK_CUDA_ATT_FLASH2X = 5,
    HK_CUDA_ATT_FLASH3 = 6,
    HK_CUDA_ATT_FLASH3_SEQ = 7,
    HK_CUDA_ATT_DEFAULT_BF16 = 8,
    HK_CUDA_ATT_FLASH3_WS = 9
} hk_cuda_att_impl_t;

/* The kernel impl runs on this device before any fallback: DEFAULT and
 * DEFAULT_BF16 resolved (HYPIC_CUDA_ATT, else the device's default),
 * others as they are. */
hk_cuda_att_impl_t hk_cuda_attention_kernel(hk_cuda_att_impl_t impl);

/* Twin of hk_attention: o[T, Hq, hd] = softmax(q k^T scale, keys
 * j <= qpos[t]) v; q [T, Hq, hd], qpos [T] (device, each < N), k, v
 * [N, Hkv, hd]; query head h reads kv head h / (Hq / Hkv). RoPE and the
 * q/k norms come before, the output gate after, as on the CPU. No
 * scratch. */
int hk_cuda_attention(float *o, const float *q, const int *qpos, const float *k,
                      const float *v, int T, int N, int Hq, int Hkv, int hd,
                      float scale, void *stream);
/* The same with the kernels named. */
int hk_cuda_attention_impl(hk_cuda_att_impl_t impl, float *o, const float *q,
                           const int *qpos, const float *k, const float *v,
                           int T, int N, int Hq, int Hkv, int hd, float scale,
                           void *stream);
/* The same with scratch: hk_cuda_attention_scratch(impl, T, N, Hq, Hkv,
 * hd) floats of device memory (16-byte aligned; NULL when that is 0). The
 * conversion of k and v that FLASH2 and FLASH2X need runs inside the
 * call; where their row blocks are fewer than a wave (a short prompt over
 * a long cache) they split the keys over blocks as flash-decoding does,
 * with a second launch to combine. */
int hk_cuda_attention_ex(hk_cuda_att_impl_t impl, float *o, const float *q,
                         const int *qpos, const float *k, const float *v, int T,
                         int N, int Hq, int Hkv, int hd, float scale,
                         float *scratch, void *stream);
/* Floats of scratch hk_cuda_attention_ex takes for impl (DEFAULT,
 * DEFAULT_BF16: what they resolve to) for any call of at most T queries
 * over at most N keys on the current device; 0: it takes none. */
size_t hk_cuda_attention_scratch(hk_cuda_att_impl_t impl, int T, int N, int Hq,
                                 int Hkv, int hd);
/* The splits of the key axis hk_cuda_attention_ex makes for this call on
 * the current device (1: none; only FLASH2 and FLASH2X split). */
int hk_cuda_attention_splits(hk_cuda_att_impl_t impl, int T, int N, int Hq,
                             int Hkv, int hd);
/* Decode for B requests, one query each, each over its own cache:
 * q, o [B, Hq, hd]; kcs, vcs device arrays of B device pointers
 * ([>= n_ctx[b], Hkv, hd] each); n_ctx [B] (device): request b attends
 * its keys 0..n_ctx[b]-1, the new one included (store it first with
 * hk_cuda_kv_store_decode). Twin: hk_attention with T = 1 and
 * qpos = n_ctx - 1 per request. Without scratch the key axis of a
 * (request, kv group) is split over one block's warps only; see
 * hk_cuda_attention_decode_ex. */
int hk_cuda_attention_decode(float *o, const float *q, const float *const *kcs,
                             const float *const *vcs, const int *n_ctx, int B,
                             int Hq, int Hkv, int hd, float scale,
                             void *stream);
/* Decode with the kernels named and scratch for flash-decoding: with
 * scratch (hk_cuda_attention_decode_scratch floats, device) FLASH splits
 * each (request, kv group)'s keys over several blocks, then combines the
 * partial softmaxes in a second launch; scratch may be NULL (one block per
 * (request, group)). */
int hk_cuda_attention_decode_ex(hk_cuda_att_impl_t impl, float *o,
                                const float *q, const float *const *kcs,
                                const float *const *vcs, const int *n_ctx,
                                int B, int Hq, int Hkv, int hd, float scale,
                                float *scratch, void *stream);
/* Floats of scratch hk_cuda_attention_decode_ex uses on the current
 * device (0: it does not split at this B). */
size_t hk_cuda_attention_decode_scratch(int B, int Hq, int Hkv, int hd);

/* Paged KV: K and V each live in an arena of pages of P positions,
 * laid out [page][P][Hkv][hd] (device; a page holds P consecutive
 * positions of every kv head). table [B][max_pages] (device int32): the
 * pages of request b in position order, so its position j is row j % P
 * of page table[b * max_pages + j / P]. Entries past a request's last
 * page are never read. P is a power of two from HK_CUDA_PAGE_MIN to
 * HK_CUDA_PAGE_MAX (a warp's run of 4 keys then lies in one page);
 * anything else is HK_CUDA_EINVAL. */
#define HK_CUDA_PAGE_MIN 4
#define HK_CUDA_PAGE_MAX (1 << 20)
/* hk_cuda_attention_decode over paged K/V: q, o [B, Hq, hd]; n_ctx [B]
 * (device, each 1..max_pages * P): request b attends its positions
 * 0..n_ctx[b]-1, the new one included (store it first with
 * hk_cuda_kv_store_paged). Same kernels, same results as the contiguous
 * call on the same rows. Twin: hk_attention_decode_paged. */
int hk_cuda_attention_decode_paged(float *o, const float *q,
                                   const float *k_pages, const float *v_pages,
                                   const int *table, int max_pages,
                                   const int *n_ctx, int B, int P, int Hq,
                                   int Hkv, int hd, float scale, void *stream);
/* The same with the kernels named and flash-decoding's scratch, as
 * hk_cuda_attention_decode_ex (hk_cuda_attention_decode_scratch(B, Hq,
 * Hkv, hd) floats, or NULL). */
int hk_cuda_attention_decode_paged_ex(hk_cuda_att_impl_t impl, float *o,
                                      const float *q, const float *k_pages,
                                      const float *v_pages, const int *table,
                                      int max_pages, const int *n_ctx, int B,
                                      int P, int Hq, int Hkv, int hd,
                                      float scale, float *scratch,
                                      void *stream);

/* ---- MoE routing and dispatch (hk_moe.cu) ------------------------------ */

/* hk_moe_route for each of T tokens: logits [T, E], idx, w [T, k]. */
int hk_cuda_moe_route(int *idx, float *w, const float *logits, int T, int E,
                      int k, int renorm, void *stream);
/* Twins of hk_moe_plan, hk_moe_gather, hk_moe_scatter, hk_moe_combine
 * (same layouts, all device arrays; the caller copies offs to the host to
 * size each expert's GEMMs). The plan is one block (a parallel counting
 * sort, the CPU's order within each expert); E <= 12000. */
int hk_cuda_moe_plan(int *offs, int *rows, float *scale, int *slot,
                     const int *idx, const float *w, int T, int k, int E,
                     void *stream);
int hk_cuda_moe_gather(float *xg, const float *y, const int *rows, int n, int H,
                       void *stream);
int hk_cuda_moe_scatter(float *x, const float *eo, const int *rows, int n,
                        int H, void *stream);
int hk_cuda_moe_combine(float *x, const float *eo, const int *slot, int T,
                        int k, int H, void *stream);

/* ---- next-token helpers (hk_sample.cu) --------------------------------- */

#define HK_CUDA_TOPK_MAX 256
/* Most blocks one row is split over. */
#define HK_CUDA_SAMPLE_SPLITS_MAX 64

/* Rows are cut into `splits` contiguous parts, one block each, so that a
 * small batch still fills the device (0: the launcher's choice, about two
 * blocks per SM in all, each part >= 8192 logits; 1 from B = 2 x SMs).
 * The parts' partials go to scratch (8-byte aligned) of the _scratch
 * functions' floats for B rows and the same splits, enough for any
 * B' <= B rows (splits 0: whatever the launcher picks for them). Results
 * do not depend on the splits (the normalizer's sum order aside). */
size_t hk_cuda_argmax_scratch(int B, int splits);
size_t hk_cuda_topk_scratch(int B, int splits);
/* Twin of hk_argmax per row: idx[B] of logits [B, V] whose rows are ld
 * >= V floats apart (the engine: the sampler's ids of a padded vocabulary).
 * scratch NULL: one block per row (splits 0 or 1). */
int hk_cuda_argmax(int *idx, const float *logits, int B, int V, int ld,
                   int splits, float *scratch, void *stream);
/* Twin of hk_topk per row: p, idx [B, k] from the first V of each row of
 * logits [B, ld] (ld >= V); k <= V and
 * k <= HK_CUDA_TOPK_MAX; logits not NaN. The same indices in the same
 * order as the CPU; p to the double normalizer's rounding (summed in
 * another order). raw [B, k], lse [B] (8-byte aligned), each NULL where
 * not wanted: raw exactly the CPU's, lse to its double sum's rounding
 * (its terms summed in another order). A radix select: six launches and
 * five reads of the rows whatever k is. scratch is required. The host
 * copies 2k values per row (3k + 2 with raw and lse) and draws with
 * hk_sample_topk. */
int hk_cuda_topk(float *p, int *idx, float *raw, double *lse,
                 const float *logits, int B, int V, int ld, int k, double inv_t,
                 int splits, float *scratch, void *stream);

/* ---- norms and activations (hk_norm.cu) -------------------------------- */

/* Twins of hk_rmsnorm_zc, hk_rmsnorm_gated, hk_l2norm, hk_swiglu (same
 * aliasing rules: y may alias x; l2norm is in place). */
int hk_cuda_rmsnorm_zc(float *y, const float *x, const float *w, int rows,
                       int dim, float eps, void *stream);
int hk_cuda_rmsnorm_gated(float *y, const float *x, const float *z,
                          const float *w, int rows, int dim, float eps,
                          void *stream);
int hk_cuda_l2norm(float *x, int rows, int dim, float eps, float scale,
                   void *stream);
int hk_cuda_swiglu(float *y, const float *g, const float *u, size_t n,
                   void *stream);
/* The same with y rounded to bf16 (nearest even, as hk_cuda_matmul_bf16
 * rounds x): the f32 entries' y, rounded, bit for bit; y does not alias
 * the inputs. A bf16 projection's input without an f32 copy. */
int hk_cuda_rmsnorm_zc_bf16(uint16_t *y, const float *x, const float *w,
                            int rows, int dim, float eps, void *stream);
int hk_cuda_rmsnorm_gated_bf16(uint16_t *y, const float *x, const float *z,
                               const float *w, int rows, int dim, float eps,
                               void *stream);
int hk_cuda_swiglu_bf16(uint16_t *y, const float *g, const float *u, size_t n,
                        void *stream);
/* SwiGLU of bf16 g and u (widened exactly), y rounded to bf16: the f32
 * kernel on their values, rounded, bit for bit; y may alias g or u. */
int hk_cuda_swiglu_bf16_in(uint16_t *y, const uint16_t *g, const uint16_t *u,
                           size_t n, void *stream);
/* A gated attention layer's prologue in one launch: P [T, Hq, 2 hd] (a q
 * head, then its gate) split into q and gate [T, Hq, hd], q RMS-normed by
 * qw [hd] and k [T, Hkv, hd] in place by kw (rmsnorm_zc, eps), then both
 * rotated at pos [T] (device; hk_cuda_rope's rot, theta). Twin:
 * hk_cuda_split_heads, hk_cuda_rmsnorm_zc twice, hk_cuda_rope twice,
 * whose results these are bit for bit. hd <= HK_CUDA_QK_MAX_HD (a warp
 * holds a head). */
#define HK_CUDA_QK_MAX_HD 1024
int hk_cuda_qk_norm_rope(float *q, float *gate, float *k, const float *P,
                         const float *qw, const float *kw, const int *pos,
                         int T, int Hq, int Hkv, int hd, int rot, double theta,
                         float eps, void *stream);

/* ---- causal depthwise conv1d + SiLU (hk_conv.cu) ----------------------- */

/* Twin of hk_conv1d_silu: y[T, C], state[C, K-1] in/out, x[T, C],
 * w[C, K]. */
int hk_cuda_conv1d_silu(float *y, float *state, const float *x, const float *w,
                        int T, int C, int K, void *stream);
/* A prefill's GDN input path in one launch (and the state shift): the
 * conv (+ SiLU) of x [T, C = 2 Hk dk + Hv dv] (q | k | v channels) with
 * state, split into q, k [T, Hk, dk] and v [T, Hv, dv], q and k
 * L2-normalized (eps inside the root, q scaled by q_scale); with g
 * non-NULL the gates too, in place: g, beta [T, Hv] hold the raw a and b
 * projections and get hk_cuda_gdn_gates' g and beta (A_log, dt_bias
 * [Hv]). Twin: hk_cuda_conv1d_silu, hk_cuda_split_heads, hk_cuda_l2norm,
 * hk_cuda_gdn_gates, whose results these are bit for bit. max(dk, dv) <=
 * 12288. */
int hk_cuda_conv_qkv(float *q, float *k, float *v, float *state, const float *x,
                     const float *w, float *g, float *beta, const float *A_log,
                     const float *dt_bias, int T, int Hk, int Hv, int dk,
                     int dv, int K, float eps, float q_scale, void *stream);
/* hk_cuda_conv_qkv for one decode token of each of B requests: x [B, C],
 * q, k [B, Hk, dk], v [B, Hv, dv], g, beta [B, Hv]; states as
 * hk_cuda_conv1d_silu_decode's (a device array of B pointers to [C, K-1]
 * states; NULL only with K = 1). Twin: hk_cuda_conv1d_silu_decode,
 * hk_cuda_split_heads, hk_cuda_l2norm, hk_cuda_gdn_gates, bit for bit. */
int hk_cuda_conv_qkv_decode(float *q, float *k, float *v, float *const *states,
                            const float *x, const float *w, float *g,
                            float *beta, const float *A_log,
                            const float *dt_bias, int B, int Hk, int Hv, int dk,
                            int dv, int K, float eps, float q_scale,
                            void *stream);
/* One decode token for each of B requests: y[B, C], x[B, C]; states is a
 * device array of B device pointers, each a [C, K-1] state (pool slots
 * need not be contiguous). Same as hk_conv1d_silu with T = 1 per request. */
int hk_cuda_conv1d_silu_decode(float *y, float *const *states, const float *x,
                               const float *w, int B, int C, int K,
                               void *stream);

/* ---- RoPE, rotate-half, partial (hk_rope.cu) --------------------------- */

/* Twins of hk_rope / hk_rope_shift: x[T, nh, hd] in place, pos[T] (device),
 * rot even, rot <= hd, rot <= 1024; angles in double (hk_math.h). */
int hk_cuda_rope(float *x, const int *pos, int T, int nh, int hd, int rot,
                 double theta, void *stream);
int hk_cuda_rope_shift(float *x, int delta, int T, int nh, int hd, int rot,
                       double theta, void *stream);

/* ---- Gated DeltaNet (hk_gdn.cu) ----------------------------------------
 * Layouts as hk_gdn_recurrent / hk_gdn_chunk: q, k [T, Hk, dk];
 * v, o [T, Hv, dv]; g, beta [T, Hv]; S [Hv, dk, dv]; Tc [Hv, dk, dk].
 * dk <= HK_CUDA_GDN_MAX_DK (a warp keeps one state column in registers). */
#define HK_CUDA_GDN_MAX_DK 256
#define HK_CUDA_GDN_MAX_C  64

/* Gates from the projections: beta = sigmoid(b), g = -exp(A_log[h])
 * softplus(a + dt_bias[h]) (hk_math.h). b, a, beta, g [T, Hv]; A_log,
 * dt_bias [Hv]. beta may alias b and g may alias a. */
int hk_cuda_gdn_gates(float *g, float *beta, const float *a, const float *b,
                      const float *A_log, const float *dt_bias, int T, int Hv,
                      void *stream);

/* Twin of hk_gdn_recurrent: one sequence of T tokens, per token in the
 * order decay, read S^T k, delta, write, output o = S^T q with the updated
 * state. One block per value head. */
int hk_cuda_gdn_recurrent(float *o, float *S, const float *q, const float *k,
                          const float *v, const float *g, const float *beta,
                          int T, int Hk, int Hv, int dk, int dv, void *stream);
/* One decode step for B requests: q, k [B, Hk, dk]; v, o [B, Hv, dv];
 * g, beta [B, Hv]; states: device array of B device pointers, each an
 * [Hv, dk, dv] state, updated in place. One block per (request, head). */
int hk_cuda_gdn_decode(float *o, float *const *states, const float *q,
                       const float *k, const float *v, const float *g,
                       const float *beta, int B, int Hk, int Hv, int dk, int dv,
                       void *stream);

/* One fused decode step for B requests (hk_gdn_step.cu): from the raw
 * projections qkv [B, 2 Hk dk + Hv dv] (q | k | v channels), a, b
 * [B, Hv] and the layer's conv_w [cd, K], A_log, dt_bias [Hv]: conv +
 * SiLU (conv_states: device array of B device pointers to [cd, K-1]
 * states, shifted in place; may be NULL when K = 1), l2 norms of q
 * (times q_scale) and k (eps inside the root), the gates, and the step on
 * states (device array of B device pointers to [Hv, dk, dv]). o
 * [B, Hv, dv]. Twin: hk_conv1d_silu, hk_l2norm, hk_gdn_gates and
 * hk_gdn_recurrent with T = 1 per request. dv a multiple of 4, states
 * 16-byte aligned. */
int hk_cuda_gdn_step(float *o, float *const *states, float *const *conv_states,
                     const float *qkv, const float *a, const float *b,
                     const float *conv_w, const float *A_log,
                     const float *dt_bias, int B, int Hk, int Hv, int dk,
                     int dv, int K, float eps, float q_scale, void *stream);
/* The kernels behind hk_cuda_gdn_step (hk_gdn_step.cu explains them):
 *   KH      one block per (key head, request), the first kernel;
 *   PIPE    about 2 blocks per SM, each over a range of (key head,
 *           request) items, the next 64-column slab's state loads in
 *           flight while the current one computes;
 *   PIPE32  the same with 32-column slabs, about 3 blocks per SM.
 *   PIPEA   PIPE with each item's conv inputs (x, old conv state, weights)
 *           copied into shared memory by cp.async while the previous
 *           item's slabs run (session 16, untimed); PIPE where dk % 4 or
 *           qkv's alignment rule the copies out.
 *   PIPEW   PIPEA's copies, each item's conv and norms on two warps of
 *           their own one item ahead, the states through a ring of 4
 *           slabs in shared memory by cp.async, one block per SM
 *           (session 17, untimed); PIPE where PIPEA's copies cannot run
 *           or its shared memory passes the device's limit.
 * PIPE, PIPEA and PIPEW give the same results bit for bit: the CUDA
 * backend can pick among them by timing (hk_cuda_tuner, HYPIC_CUDA_TUNE).
 * DEFAULT is the environment's HYPIC_CUDA_STEP=kh|pipe|pipe32|pipea|pipew, read
 * once (default pipe). Results agree to f32 rounding (the column sums are
 * grouped by 32, 16 or 8 row groups). */
typedef enum {
    HK_CUDA_STEP_DEFAULT = 0,
    HK_CUDA_STEP_KH = 1,
    HK_CUDA_STEP_PIPE = 2,
    HK_CUDA_STEP_PIPE32 = 3,
    HK_CUDA_STEP_PIPEA = 4,
    HK_CUDA_STEP_PIPEW = 5
} hk_cuda_step_impl_t;
int hk_cuda_gdn_step_impl(hk_cuda_step_impl_t impl, float *o,
                          float *const *states, float *const *conv_states,
                          const float *qkv, const float *a, const float *b,
                          const float *conv_w, const float *A_log,
                          const float *dt_bias, int B, int Hk, int Hv, int dk,
                          int dv, int K, float eps, float q_scale,
                          void *stream);

/* Twin of hk_gdn_chunk (chunk size C, 1..64; Tc may be NULL). Unlike the
 * CPU kernel the scratch grows with T: the chunk-local quantities of all
 * chunks are formed in parallel first, then one pass carries the state
 * across chunks (hk_gdn.cu). Callers with very long T may split it into
 * calls (S carries over; chain the Tc's with hk_cuda_trans_chain). */
int hk_cuda_gdn_chunk(float *o, float *S, float *Tc, const float *q,
                      const float *k, const float *v, const float *g,
                      const float *beta, int T, int Hk, int Hv, int dk, int dv,
                      int C, float *scratch, void *stream);
size_t hk_cuda_gdn_chunk_scratch(int T, int Hv, int dk, int dv, int C);

/* The chunked prefill on tensor cores (hk_gdn_tc.cu) for nseq sequences
 * in one call: q, k [T, Hk, dk] and v [T, Hv, dv] as bf16 bit patterns
 * (hk_bf16.h), g, beta [T, Hv] f32, o [T, Hv, dv] f32; sequence b is rows
 * cu_seqlens[b] .. cu_seqlens[b+1]-1 (device array of nseq + 1 offsets,
 * cu_seqlens[0] = 0, cu_seqlens[nseq] = T, non-decreasing); its state is
 * states[b] and its transition tcs[b] (device arrays of nseq device
 * pointers to [Hv, dk, dv] and [Hv, dk, dk] f32; tcs may be NULL). Each
 * sequence is hk_gdn_chunk on its own rows with the bf16 inputs widened;
 * products run on bf16 MMAs with f32 operands split in two (~1e-5
 * relative, where f32 gives ~1e-7 and one bf16 rounding ~4e-3). dk, dv and
 * C multiples of 16, dk <= 256, C <= 64; q, k, v, o, states and Tc
 * 32-byte aligned. Scratch grows with T and nseq. */
int hk_cuda_gdn_chunk_bf16(float *o, float *const *states, float *const *tcs,
                           const uint16_t *q, const uint16_t *k,
                           const uint16_t *v, const float *g, const float *beta,
                           const int *cu_seqlens, int nseq, int T, int Hk,
                           int Hv, int dk, int dv, int C, float *scratch,
                           void *stream);
size_t hk_cuda_gdn_chunk_bf16_scratch(int T, int nseq, int Hv, int dk, int dv,
                                      int C);
/* The same on f32 q, k, v (the engine's activations): each is split into
 * bf16 hi + lo in scratch first, and every product with an input gains
 * its lo term, so the results stay ~1e-5 relative of the f32 kernel's
 * (hk_cuda_gdn_chunk) where bf16 inputs would cost ~1e-2. Same layouts
 * and requirements as hk_cuda_gdn_chunk_bf16 (q, k, v need no alignment;
 * more shared memory: dk = dv = 128 at C = 64 needs 200 KB, an H100's
 * block has 227 KB, an A100's 163 KB: HK_CUDA_EINVAL where the device's
 * limit is exceeded, launching nothing). Scratch grows with T and nseq. */
int hk_cuda_gdn_chunk_tc(float *o, float *const *states, float *const *tcs,
                         const float *q, const float *k, const float *v,
                         const float *g, const float *beta,
                         const int *cu_seqlens, int nseq, int T, int Hk, int Hv,
                         int dk, int dv, int C, float *scratch, void *stream);
size_t hk_cuda_gdn_chunk_tc_scratch(int T, int nseq, int Hk, int Hv, int dk,
                                    int dv, int C);
/* hk_cuda_gdn_chunk_bf16 with flags (0: the same call).
 * HK_CUDA_GDN_TC_FAST: the state pass and the outputs multiply the hi
 * halves only, one bf16 MMA per product (FLA's bf16 accuracy, ~1e-3 of
 * O(1) outputs) where the default keeps ~1e-5.
 * HK_CUDA_GDN_TC_V1: the older structure, outputs inside the sequential
 * pass (for comparison; FAST is ignored there). The default computes the
 * states alone in the sequential pass and the outputs in a parallel
 * launch; shapes whose tiles do not fit its shared memory use v1.
 * HK_CUDA_GDN_TC_A1: the first chunk-local kernel (every tile resident,
 * (I + L)^{-1} by C serial rows) instead of the blockwise one (for
 * comparison; it combines with the others).
 * HK_CUDA_GDN_TC_PSHARE: the state pass single-buffered, 16 columns a
 * block, so two blocks share an SM (not yet timed; not with V1).
 * HK_CUDA_GDN_TC_ROUND (f32 entry; the bf16 entry ignores it): q, k, v
 * rounded to bf16 once (to nearest even) in the entry's pass, which
 * writes no lo halves, then the bf16 entry's kernels: its results on the
 * rounded inputs bit for bit (with FAST: FLA's bf16 precision).
 * HK_CUDA_GDN_TC_FAST_A: kernel A's U = T diag(beta) V and W = T
 * diag(beta e^gamma) K on T's hi half only (one MMA per product on bf16
 * inputs), where the default adds T's lo half (FLA rounds its (I + L)^-1
 * to bf16 the same way).
 * The state pass keeps the state in registers (R: mma.sync accumulators,
 * two barriers a chunk) where dk is a multiple of 64 up to 256 and neither
 * V1 nor PSHARE is asked for: 1.2-1.3x kernel P's speed on an H200
 * (bench/results/gpu/2026-11-28-h200). HK_CUDA_GDN_TC_SMEM: kernel P
 * there instead, the state in shared memory (P's products, another order
 * of f32 sums; to compare).
 * HK_CUDA_GDN_TC_A3: kernel A3 instead of the blockwise kernel A: the same
 * steps and outputs with its loads by cp.async in flight under the
 * previous steps, the decay factors exponentiated in f32 and P, W stored
 * 16 bytes a lane (not yet timed; HK_CUDA_EINVAL with A1).
 * HK_CUDA_GDN_TC_FUSE_O: the outputs in the state pass R (four more warps
 * compute each chunk's o = e^gamma Q S + P Vn while the state warps run
 * the next steps), so no chunk's starting state or Vn goes through
 * scratch and there is no output launch; where R runs and its shared
 * memory fits (dk <= 128, and not f32 inputs at BV = 32), else ignored.
 * Not yet timed.
 * HK_CUDA_GDN_TC_R64: where kernel R would run 32 columns a block on more
 * blocks than the device has SMs (T_C's columns on Qwen3-Next's heads),
 * 64 columns a block on 8 state warps instead: half the copies of each
 * chunk's W, K and gates (dk = 128 and not fused: its tiles fit only
 * then; else ignored). Same products and sums. Not yet timed.
 * HK_CUDA_GDN_TC_DEEP: kernel R with each chunk's tiles copied two chunks
 * ahead into three buffers instead of one ahead into two, where they fit
 * (at dk = 128 with bf16 or rounded inputs, not fused: 188 KB at BV = 16,
 * 212 KB at BV = 32, not at BV = 64; at dk = 64 fused too; else
 * ignored). The same results bit for bit. Not yet timed.
 * HK_CUDA_GDN_TC_O64: kernel O over 64 output columns a block instead of
 * 32, where dv is a multiple of 64 and its tiles fit (~111 KB at dk = 128,
 * 128 KB with Q's lo rows: one block an SM where 32 columns fit two):
 * each chunk's Q and P copied once per 64 columns, not per 32; each tile
 * of o the same products in the same order, so the same results bit for
 * bit (where the outputs are fused into R, ignored). Not yet timed.
 * HK_CUDA_GDN_TC_W8: kernel R on 8 state warps instead of 4 at its 16 or
 * 32 columns a block (dk = 128 or 256, fused at 128 (12 warps), not with
 * R64's 64; else ignored): each warp holds half the state rows, so half each
 * chunk's split, K^T X and copies a warp, and each scheduler of the SM
 * has two warps to interleave where it had one (at 16 columns the Vn
 * step stays on 4 warps: 16 columns are its narrowest). The same results
 * bit for bit. Not yet timed.
 * HK_CUDA_GDN_TC_OVERLAP (needs lanes, else HK_CUDA_EINVAL; not with V1):
 * the chunk slots in up to 8 segments of 2 or more, each launched as kernel
 * A, the state pass and kernel O of its slots alone, on the lanes: A of
 * the next segments runs beside the state pass of this one (which waits
 * only for its own segment's A) and O of the last ones, so the three
 * kernels' latencies overlap where a whole call runs them one after
 * another (a state pass block carries the state and T_C from segment to
 * segment through states and tcs). The state pass takes 32 columns a
 * block, or R64's 64, where 16 (32) would fill more than half the SMs, so
 * that A and O have SMs of their own. The same results bit for bit. Not
 * yet timed. */
#define HK_CUDA_GDN_TC_FAST    1u
#define HK_CUDA_GDN_TC_V1      2u
#define HK_CUDA_GDN_TC_A1      4u
#define HK_CUDA_GDN_TC_PSHARE  8u
#define HK_CUDA_GDN_TC_ROUND   16u
#define HK_CUDA_GDN_TC_FAST_A  32u
#define HK_CUDA_GDN_TC_SMEM    64u
#define HK_CUDA_GDN_TC_A3      128u
#define HK_CUDA_GDN_TC_FUSE_O  256u
#define HK_CUDA_GDN_TC_R64     512u
#define HK_CUDA_GDN_TC_DEEP    1024u
#define HK_CUDA_GDN_TC_O64     2048u
#define HK_CUDA_GDN_TC_W8      4096u
#define HK_CUDA_GDN_TC_OVERLAP 8192u
#define HK_CUDA_GDN_TC_FLAGS   16383u
int hk_cuda_gdn_chunk_bf16_ex(float *o, float *const *states, float *const *tcs,
                              const uint16_t *q, const uint16_t *k,
                              const uint16_t *v, const float *g,
                              const float *beta, const int *cu_seqlens,
                              int nseq, int T, int Hk, int Hv, int dk, int dv,
                              int C, float *scratch, unsigned flags,
                              hk_cuda_lanes_t *lanes, void *stream);
/* hk_cuda_gdn_chunk_tc with the same flags (FAST drops the inputs' lo
 * terms in the state pass and the outputs too). */
int hk_cuda_gdn_chunk_tc_ex(float *o, float *const *states, float *const *tcs,
                            const float *q, const float *k, const float *v,
                            const float *g, const float *beta,
                            const int *cu_seqlens, int nseq, int T, int Hk,
                            int Hv, int dk, int dv, int C, float *scratch,
                            unsigned flags, hk_cuda_lanes_t *lanes,
                            void *stream);
/* For benches: with on = 1 the two entries above record CUDA events
 * between their launches (on the call's stream) until called with on = 0;
 * hk_cuda_gdn_tc_phases then waits for the last call and gives its
 * milliseconds per launch: [0] the f32 entry's split of q, k, v (~0 for
 * bf16 in), [1] the chunk-local kernel A, [2] the state pass (v1: kernel
 * B), [3] the outputs (v1: 0). Process-wide, not thread-safe; off, the
 * entries only test a flag. */
#define HK_CUDA_GDN_TC_PHASES 4
int hk_cuda_gdn_tc_profile(int on);
int hk_cuda_gdn_tc_phases(double ms[HK_CUDA_GDN_TC_PHASES]);
/* The kernels a call of these shapes and flags launches (f32_in: the f32
 * entry; want_tc: tcs given) into buf, e.g. "A2 R32x2 O": kernel A (A1,
 * A3, or A2 the blockwise), the state pass (R<BV>x<dk/64>: the state in
 * registers, "w8" on 8 state warps, "/3" three buffers, "+O" the outputs
 * fused; P<BV>: in shared
 * memory, "s" single-buffered; B<BV>: v1, the outputs inside it) and O,
 * the outputs' launch ("O64": 64 columns a block; v1, fused: none). What
 * runs, not what was asked for (REG where dk is no multiple of 64 runs P):
 * 0, or HK_CUDA_EINVAL where the entry would refuse the call. */
int hk_cuda_gdn_tc_kernels(char *buf, size_t cap, int T, int nseq, int Hk,
                           int Hv, int dk, int dv, int C, int f32_in,
                           int want_tc, unsigned flags);

/* ---- transition algebra (hk_transition.cu) ----------------------------- */

/* Twin of hk_trans_compose: out[H, dk, dv] = T[h] S[h] + S0[h]; out may
 * alias S or S0; S0 may be NULL. Dense products are one strided batched
 * sgemm over heads; scratch [H, dk, dv] floats is needed (dense) only when
 * out aliases S, else may be NULL. */
int hk_cuda_trans_compose(float *out, hk_trans_family_t fam, const float *T,
                          const float *S, const float *S0, int H, int dk,
                          int dv, float *scratch, hk_cuda_blas_t *blas,
                          void *stream);
/* Twin of hk_trans_chain: T1 <- T2 T1, S1 <- T2 S1 + S2. Dense needs
 * scratch [H, dk, max(dk, dv)] floats. */
int hk_cuda_trans_chain(float *T1, float *S1, hk_trans_family_t fam,
                        const float *T2, const float *S2, int H, int dk, int dv,
                        float *scratch, hk_cuda_blas_t *blas, void *stream);
/* Twin of hk_trans_rope_shift: S[H, dk, dv] <- R(delta) S on the key axis. */
int hk_cuda_trans_rope_shift(float *S, int delta, int H, int dk, int dv,
                             int rot, double theta, void *stream);

/* ---- KVBuffer (hk_kvbuf.cu) ---------------------------------------------
 * Twins of kernels/cpu/hk_kvbuf.h: the same block layout in the arena
 * (hk_kvbuf_geom.h; hk_kvbuf_block_floats floats a block), the same math.
 * vw is a device array of R views whose S and blocks are device pointers
 * (S may be NULL: a KV-only buffer). No scratch: the coefficients live in
 * shared memory. dv <= HK_CUDA_KVBUF_MAX_DV, bs <= 64; states must be
 * 16-byte aligned (rows are read as float4 when dv is a multiple of 4). */
#define HK_CUDA_KVBUF_MAX_DV 256

/* Twin of hk_kvbuf_step: T tokens per request (T = 1 a decode step, T > 1
 * draft verification), entries appended at len .. len+T-1, outputs o
 * [R*T, Hv, dv]. lmax >= every len + T. HK_CUDA_EINVAL also when the
 * shared memory, about 4 T (2 dk + 2 dv + 2 lmax) bytes, exceeds the
 * device's. */
int hk_cuda_kvbuf_step(float *o, float *arena, const hk_kvbuf_view_t *vw,
                       const float *q, const float *k, const float *v,
                       const float *gl, const float *beta, int R, int T,
                       const hk_kvbuf_geom_t *g, int lmax, void *stream);
/* Twin of hk_kvbuf_flush: S <- e^{G_n} S + Ktilde^T W for the first n[r]
 * (device array [R]) entries of each view; every S with n[r] > 0 must be
 * non-NULL. */
int hk_cuda_kvbuf_flush(float *arena, const hk_kvbuf_view_t *vw, const int *n,
                        int R, const hk_kvbuf_geom_t *g, void *stream);
/* The same with a choice of kernels (0: the environment's,
 * HYPIC_CUDA_KVBUF=v1|v2, default v2 where it applies; =v2 names it, as
 * the V2 flag). V1: the first kernels, one block per (value head,
 * request). V2: the streaming kernels of hk_kvbuf.cu for the step (the
 * decode step, T = 1, and verification, T > 1: S0 read once for all T
 * tokens) and the flush: dv a multiple of 4, bs a power of two in [4, 64],
 * arena, v, o and the states 16-byte aligned, shared memory (about
 * 4 (T (2 dk + 2 lmax + 2 dv) + lmax dv) + 32 KB at T > 1) within the
 * device's; otherwise the default falls back to V1 and an explicit V2 or
 * CW* is HK_CUDA_EINVAL. CW128 / CW64 / CW32 fix V2's slab of columns per
 * block (default: the widest that gives ~4 blocks per SM). */
#define HK_CUDA_KVBUF_V1      1u
#define HK_CUDA_KVBUF_V2      2u
#define HK_CUDA_KVBUF_CW128   4u
#define HK_CUDA_KVBUF_CW64    8u
#define HK_CUDA_KVBUF_CW32    12u
#define HK_CUDA_KVBUF_CW_MASK 12u
#define HK_CUDA_KVBUF_FLAGS   15u
int hk_cuda_kvbuf_step_ex(float *o, float *arena, const hk_kvbuf_view_t *vw,
                          const float *q, const float *k, const float *v,
                          const float *gl, const float *beta, int R, int T,
                          const hk_kvbuf_geom_t *g, int lmax, unsigned flags,
                          void *stream);
int hk_cuda_kvbuf_flush_ex(float *arena, const hk_kvbuf_view_t *vw,
                           const int *n, int R, const hk_kvbuf_geom_t *g,
                           unsigned flags, void *stream);
/* Twin of hk_kvbuf_conv_commit (state [C, K-1], x [>= m, C]): exact. */
int hk_cuda_kvbuf_conv_commit(float *state, const float *x, int m, int C, int K,
                              void *stream);

#ifdef __cplusplus
}
#endif

#endif
