/*
 * emu/cuda_runtime.h - a host emulator of the small part of CUDA the
 * kernels in kernels/cuda/ use, so their logic can be run and compared
 * with the CPU kernels on a machine without a GPU (ours). Used only by
 * kernels/cuda/emu/run.sh; never by the real build, which uses nvcc and
 * the real <cuda_runtime.h>.
 *
 * What it models: a launch runs the blocks one after another; the threads
 * of a block are coroutines (a stack switch of our own on x86-64, else
 * ucontext) that switch only at __syncthreads,
 * __syncwarp and the warp shuffles, which are real barriers here (all 32
 * lanes must arrive, as on the GPU). __shared__ is a static, so one copy
 * per block as blocks never overlap. A barrier nobody can complete (a
 * thread exited or diverged around it) aborts with a message. The order in
 * which threads run between barriers is tid order, or reversed with
 * HK_EMU_ORDER=reverse: running both orders exposes most missing barriers
 * (a reader that only worked because its writer happened to run first).
 *
 * Dynamic shared memory (HK_DYNAMIC_SMEM, hk_cuda_impl.h) is one buffer
 * per launch of the size the launch asks for, 128-byte aligned and filled
 * with a NaN pattern before each block (as uninitialized as on a GPU); a
 * launch asking more than an H100 block may have (227 KB) fails, and so
 * does one whose dynamic part passes what its kernel may take: 48 KB less
 * its static __shared__ bytes (emu_rewrite.py has each declaration
 * register its variable, hk_emu_shared; a launch checks after its blocks
 * ran, so its error comes with outputs a GPU would not have written),
 * else what cudaFuncSetAttribute allowed the kernel (not checked for a
 * template kernel launched with deduced arguments: no address). Device
 * memory is 256-byte aligned, as cudaMalloc's. Events read the host clock.
 * nvcuda::wmma is in emu/mma.h, bf16 in emu/cuda_bf16.h, the inline PTX
 * of hk_ptx.h (mma.sync, ldmatrix, cp.async) in emu/ptx.h, hk_wgmma.h's
 * warpgroup products in emu/wgmma.h.
 *
 * Streams: the legacy stream (NULL) runs each launch, copy and memset
 * when it is issued. A created stream (cudaStreamCreateWithPriority; the
 * kernels' side streams, hk_cuda_lanes_t) queues them, with its event
 * records and waits, and runs them only when something must see them done:
 * a wait of the legacy stream (cudaStreamWaitEvent) or of the host
 * (cudaEventSynchronize, cudaStreamSynchronize of it, cudaDeviceSynchronize,
 * cudaStreamDestroy). The queues then run one item at a time, each time
 * the runnable queue of highest priority first, or with
 * HK_EMU_ORDER=reverse of lowest: so work on two streams with no event
 * between them runs in the order a missing dependency breaks, in one of
 * the two orders (a reader before its writer). A wait that nothing queued
 * can satisfy aborts with a message.
 *
 * What it does not model: memory spaces (device pointers are host
 * pointers), two launches at once (a queue runs one launch to its end),
 * registers, timing, f32 FMA contraction choices of nvcc.
 */
#ifndef HK_EMU_CUDA_RUNTIME_H
#define HK_EMU_CUDA_RUNTIME_H

#ifndef __cplusplus
#error "the emulator is C++: compile the .cu files with g++ -x c++"
#endif

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <functional>
#include <malloc.h>
#include <math.h>
#include <ucontext.h>
#include <unistd.h>
#include <utility>
#include <vector>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __shared__      static
#define __align__(n)    alignas(n)
#define __launch_bounds__(...)
#define __maxnreg__(n)
/* Dynamic shared memory: a pointer to this launch's buffer. */
#define HK_DYNAMIC_SMEM(name) unsigned char *name = hk_emu.dyn_smem
/* The most dynamic shared memory an H100 block may opt in to. */
#define HK_EMU_MAX_DYN_SMEM 232448

typedef enum {
    cudaSuccess = 0,
    cudaErrorInvalidValue = 1,
    cudaErrorMemoryAllocation = 2,
    cudaErrorInvalidConfiguration = 9,
    cudaErrorInsufficientDriver = 35,
    cudaErrorNoDevice = 100,
    cudaErrorNotReady = 600,
    cudaErrorInvalidDevice = 101,
    cudaErrorECCUncorrectable = 214,
    cudaErrorIllegalAddress = 700,
    cudaErrorAssert = 710,
    cudaErrorHardwareStackError = 714,
    cudaErrorIllegalInstruction = 715,
    cudaErrorMisalignedAddress = 716,
    cudaErrorInvalidAddressSpace = 717,
    cudaErrorInvalidPc = 718,
    cudaErrorLaunchFailure = 719
} cudaError_t;

typedef enum {
    cudaMemcpyHostToHost = 0,
    cudaMemcpyHostToDevice = 1,
    cudaMemcpyDeviceToHost = 2,
    cudaMemcpyDeviceToDevice = 3
} cudaMemcpyKind;

typedef struct hk_emu_stream *cudaStream_t;

struct uint3 {
    unsigned x, y, z;
};

struct alignas(8) uint2 {
    unsigned x, y;
};
static inline uint2 make_uint2(unsigned x, unsigned y)
{
    return uint2{x, y};
}

struct uint4 {
    unsigned x, y, z, w;
};

static inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w)
{
    return uint4{x, y, z, w};
}

struct alignas(8) float2 {
    float x, y;
};
static inline float2 make_float2(float x, float y)
{
    return float2{x, y};
}

struct float4 {
    float x, y, z, w;
};

static inline float4 make_float4(float x, float y, float z, float w)
{
    return float4{x, y, z, w};
}

struct dim3 {
    unsigned x, y, z;
    dim3(unsigned a = 1, unsigned b = 1, unsigned c = 1) : x(a), y(b), z(c) {}
};

/* ---- coroutines ----
 * A block's threads, switched only at barriers. x86-64: hk_emu_switch
 * (&from_sp, to_sp) saves the callee-saved registers, MXCSR and the x87
 * control word on the current stack, stores its pointer in *from_sp and
 * resumes the stack to_sp: swapcontext's signal-mask syscalls were ~90 %
 * of the emulator's time. Elsewhere ucontext. hk_emu_ctx_t: a suspended
 * thread; hk_emu_ctx_make: one that starts in fn on stack. */
#if defined(__x86_64__)
extern "C" void hk_emu_switch(void **from_sp, void *to_sp);
asm(R"(
    .text
    .weak hk_emu_switch
    .type hk_emu_switch, @function
hk_emu_switch:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    subq $8, %rsp
    stmxcsr (%rsp)
    fnstcw 4(%rsp)
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    ldmxcsr (%rsp)
    fldcw 4(%rsp)
    addq $8, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
    .size hk_emu_switch, .-hk_emu_switch
)");

typedef void *hk_emu_ctx_t; /* its stack pointer */

static inline void hk_emu_swap(hk_emu_ctx_t *from, const hk_emu_ctx_t *to)
{
    hk_emu_switch(from, *to);
}

/* A frame hk_emu_switch returns from into fn, as if fn were called
 * (rsp = 8 mod 16 at its entry); fn never returns. */
static inline void hk_emu_ctx_make(hk_emu_ctx_t *c, std::vector<char> &stack,
                                   void (*fn)(void))
{
    uintptr_t top = ((uintptr_t)stack.data() + stack.size()) & ~(uintptr_t)15;
    void **sp = (void **)top;
    *--sp = nullptr; /* fn's return address */
    *--sp = (void *)fn;
    for (int r = 0; r < 6; r++)
        *--sp = nullptr; /* rbp, rbx, r12-r15 */
    --sp;
    unsigned csr[2] = {0, 0};
    __asm__ volatile("stmxcsr %0\n\tfnstcw %1" : "=m"(csr[0]), "=m"(csr[1]));
    memcpy(sp, csr, 8);
    *c = sp;
}
#else
typedef ucontext_t hk_emu_ctx_t;

static inline void hk_emu_swap(hk_emu_ctx_t *from, const hk_emu_ctx_t *to)
{
    swapcontext(from, to);
}

static inline void hk_emu_ctx_make(hk_emu_ctx_t *c, std::vector<char> &stack,
                                   void (*fn)(void))
{
    getcontext(c);
    c->uc_stack.ss_sp = stack.data();
    c->uc_stack.ss_size = stack.size();
    c->uc_link = nullptr;
    makecontext(c, fn, 0);
}
#endif

/* ---- emulator state (one launch at a time) ---- */

struct hk_emu_thread {
    hk_emu_ctx_t ctx;
    std::vector<char> stack;
    bool done;
    bool waiting;
};

struct hk_emu_state {
    cudaError_t last_error = cudaSuccess;
    hk_emu_ctx_t main_ctx;
    std::vector<hk_emu_thread> th;
    const std::function<void()> *body = nullptr;
    int cur = 0, nthreads = 0;
    uint3 block{0, 0, 0}, bdim{1, 1, 1}, gdim{1, 1, 1};
    long long progress = 0;
    int bar_count = 0, bar_gen = 0;
    int wcount[32] = {0}, wgen[32] = {0};
    int gcount[8] = {0}, ggen[8] = {0}; /* warpgroups (emu/wgmma.h) */
    /* named barriers (emu/ptx.h's hk_bar_sync, hk_bar_arrive): arrivals,
     * generation, the thread count of the generation under way, and per
     * thread the generation it last arrived in (two arrivals in one are
     * a protocol error); reset per block once used */
    int nbcount[16] = {0}, nbgen[16] = {0}, nbn[16] = {0};
    std::vector<int> nblast[16];
    bool nbused = false;
    double wbuf[32][32];
    unsigned char *dyn_smem = nullptr;
    size_t dyn_cap = 0, dyn_size = 0; /* allocated; this launch's */
    long long block_serial = 0; /* blocks run so far (emu/ptx.h's cp.async) */
    /* the running launch's static __shared__ variables (hk_emu_shared) */
    std::vector<const void *> shared_seen;
    size_t shared_static = 0;
    /* cudaFuncSetAttribute(MaxDynamicSharedMemorySize) per kernel */
    std::vector<std::pair<const void *, int>> dyn_allowed;
};

inline hk_emu_state hk_emu;

/* An event: its records issued and its records run (the same on the
 * legacy stream), and the host time of the last run. */
struct hk_emu_event {
    double t = 0;
    long long issued = 0, done = 0;
};

/* A created stream's queue (the file's header: Streams). */
struct hk_emu_item {
    std::function<void()> run;     /* a launch, copy or memset; or */
    hk_emu_event *rec = nullptr;   /* an event's record; or */
    hk_emu_event *wait = nullptr;  /* a wait for the wait_for'th record */
    long long wait_for = 0;
};
struct hk_emu_stream {
    int priority;
    std::vector<hk_emu_item> q; /* front first */
    size_t head = 0;
};
inline std::vector<hk_emu_stream *> hk_emu_streams;

/* An event's record runs: its host time now. */
static inline void hk_emu_event_stamp(hk_emu_event *e)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    e->t = ts.tv_sec * 1e3 + ts.tv_nsec * 1e-6;
}

/* A device fault on demand, for the serving path's tests: once the file
 * HK_EMU_FAULT_FILE names exists, the next launch faults as an illegal
 * address would on a GPU, and the error is sticky: every later launch,
 * copy, memset, allocation and sync of the process returns it. */
inline cudaError_t hk_emu_sticky = cudaSuccess;

static inline cudaError_t hk_emu_fault(bool launch)
{
    static const char *file = getenv("HK_EMU_FAULT_FILE");
    if (launch && hk_emu_sticky == cudaSuccess && file &&
        access(file, F_OK) == 0)
        hk_emu_sticky = cudaErrorIllegalAddress;
    return hk_emu_sticky;
}

#define threadIdx (hk_emu_tidx())
#define blockIdx  (hk_emu.block)
#define blockDim  (hk_emu.bdim)
#define gridDim   (hk_emu.gdim)

static inline uint3 hk_emu_tidx(void)
{
    const unsigned t = (unsigned)hk_emu.cur;
    return uint3{t % hk_emu.bdim.x, (t / hk_emu.bdim.x) % hk_emu.bdim.y,
                 t / (hk_emu.bdim.x * hk_emu.bdim.y)};
}

/* HK_EMU_ORDER=reverse: threads run in reverse tid order between
 * barriers, and the asynchronous copies and products take the other end
 * of their window (emu/ptx.h, emu/wgmma.h). Read once. */
static inline bool hk_emu_reverse(void)
{
    static const bool r = getenv("HK_EMU_ORDER") &&
                          strcmp(getenv("HK_EMU_ORDER"), "reverse") == 0;
    return r;
}

static inline void hk_emu_yield(void)
{
    hk_emu_thread &t = hk_emu.th[hk_emu.cur];
    t.waiting = true;
    hk_emu_swap(&t.ctx, &hk_emu.main_ctx);
    t.waiting = false;
}

static inline void __syncthreads(void)
{
    const int g = hk_emu.bar_gen;
    hk_emu.progress++;
    if (++hk_emu.bar_count == hk_emu.nthreads) {
        hk_emu.bar_count = 0;
        hk_emu.bar_gen++;
        return;
    }
    while (hk_emu.bar_gen == g)
        hk_emu_yield();
}

/* Barrier of the n threads of a part of the block (count and gen: its
 * arrivals and its generation). */
static inline void hk_emu_part_bar(int *count, int *gen, int n)
{
    const int g = *gen;
    hk_emu.progress++;
    if (++*count == n) {
        *count = 0;
        ++*gen;
        return;
    }
    while (*gen == g)
        hk_emu_yield();
}

/* A block's named barriers start empty. */
static inline void hk_emu_nb_reset(void)
{
    if (!hk_emu.nbused)
        return;
    for (int i = 0; i < 16; i++) {
        hk_emu.nbcount[i] = hk_emu.nbgen[i] = hk_emu.nbn[i] = 0;
        hk_emu.nblast[i].assign(hk_emu.nblast[i].size(), -1);
    }
    hk_emu.nbused = false;
}

/* A block that ends with arrivals pending on a named barrier ran an
 * unbalanced protocol (an arrive nobody syncs, or the reverse). */
static inline void hk_emu_nb_check(unsigned bx, unsigned by, unsigned bz)
{
    for (int i = 0; i < 16; i++)
        if (hk_emu.nbcount[i]) {
            fprintf(stderr,
                    "emu: block (%u,%u,%u) ended with %d of %d arrivals on "
                    "named barrier %d\n",
                    bx, by, bz, hk_emu.nbcount[i], hk_emu.nbn[i], i);
            abort();
        }
}

/* Barrier of the 32 lanes of the caller's warp. */
static inline void hk_emu_warp_bar(void)
{
    const int w = hk_emu.cur / 32;
    hk_emu_part_bar(&hk_emu.wcount[w], &hk_emu.wgen[w], 32);
}

/* The caller's queue of asynchronous operations of type T (emu/ptx.h's
 * cp.async, emu/wgmma.h's products): committed groups, oldest first, then
 * the open one; emptied when a new block starts (what a block never waited
 * for is dropped). */
template <class T> struct hk_emu_async_queue {
    long long block = -1;
    std::vector<std::vector<T>> groups;
    std::vector<T> open;
};

template <class T> static inline hk_emu_async_queue<T> &hk_emu_async(void)
{
    static hk_emu_async_queue<T> q[1024];
    hk_emu_async_queue<T> &t = q[hk_emu.cur];
    if (t.block != hk_emu.block_serial) {
        t.block = hk_emu.block_serial;
        t.groups.clear();
        t.open.clear();
    }
    return t;
}

/* Closes the open group of the caller's queue. */
template <class T> static inline void hk_emu_async_commit(void)
{
    hk_emu_async_queue<T> &q = hk_emu_async<T>();
    q.groups.push_back(q.open);
    q.open.clear();
}

/* Barrier of the 128 threads of the caller's warpgroup (4 warps). */
static inline void hk_emu_group_bar(void)
{
    const int w = hk_emu.cur / 128;
    hk_emu_part_bar(&hk_emu.gcount[w], &hk_emu.ggen[w], 128);
}

static inline void __syncwarp(unsigned mask = 0xffffffffu)
{
    if (mask != 0xffffffffu) {
        fprintf(stderr, "emu: partial __syncwarp masks are not modelled\n");
        abort();
    }
    hk_emu_warp_bar();
}

/* The streaming (evict-first) load and store: plain accesses here, as
 * the emulator has no caches. */
static inline float4 __ldcs(const float4 *p)
{
    return *p;
}

static inline void __stcs(float4 *p, float4 v)
{
    *p = v;
}

/* Lane l gets lane src's v: any 4- or 8-byte type (float, int, double),
 * as CUDA's overloads. */
template <class V> static inline V hk_emu_shfl(unsigned mask, V v, int src)
{
    static_assert(sizeof(V) <= sizeof(double), "emu: shuffle of a wide type");
    if (mask != 0xffffffffu) {
        fprintf(stderr, "emu: partial shuffle masks are not modelled\n");
        abort();
    }
    const int w = hk_emu.cur / 32, l = hk_emu.cur % 32;
    memcpy(&hk_emu.wbuf[w][l], &v, sizeof(V));
    hk_emu_warp_bar();
    V r;
    memcpy(&r, &hk_emu.wbuf[w][src], sizeof(V));
    hk_emu_warp_bar(); /* nobody overwrites wbuf before all have read */
    return r;
}

template <class V> static inline V __shfl_xor_sync(unsigned mask, V v, int off)
{
    return hk_emu_shfl(mask, v, (hk_emu.cur % 32) ^ off);
}

/* Lane l gets lane l - off's v (its own below off). */
template <class V> static inline V __shfl_up_sync(unsigned mask, V v, int off)
{
    const int l = hk_emu.cur % 32;
    return hk_emu_shfl(mask, v, l >= off ? l - off : l);
}

/* all[i] = lane i's x, in every lane (read before the closing barrier, as
 * the shuffles: nobody overwrites wbuf before all have read). */
static inline void hk_emu_warp_gather(unsigned x, unsigned *all)
{
    const int w = hk_emu.cur / 32, l = hk_emu.cur % 32;
    memcpy(&hk_emu.wbuf[w][l], &x, sizeof(x));
    hk_emu_warp_bar();
    for (int i = 0; i < 32; i++)
        memcpy(&all[i], &hk_emu.wbuf[w][i], sizeof(unsigned));
    hk_emu_warp_bar();
}

/* Bit i: lane i's predicate is nonzero. */
static inline unsigned __ballot_sync(unsigned mask, int pred)
{
    if (mask != 0xffffffffu) {
        fprintf(stderr, "emu: partial ballot masks are not modelled\n");
        abort();
    }
    unsigned all[32];
    hk_emu_warp_gather(pred != 0, all);
    unsigned r = 0;
    for (int i = 0; i < 32; i++)
        r |= all[i] << i;
    return r;
}

/* Bit i: lane i holds the caller's value. */
static inline unsigned __match_any_sync(unsigned mask, unsigned v)
{
    if (mask != 0xffffffffu) {
        fprintf(stderr, "emu: partial match masks are not modelled\n");
        abort();
    }
    unsigned all[32];
    hk_emu_warp_gather(v, all);
    unsigned r = 0;
    for (int i = 0; i < 32; i++)
        r |= (unsigned)(all[i] == v) << i;
    return r;
}

static inline int __popc(unsigned x)
{
    return __builtin_popcount(x);
}

static inline unsigned __float_as_uint(float x)
{
    unsigned u;
    memcpy(&u, &x, sizeof(u));
    return u;
}

static inline float __uint_as_float(unsigned u)
{
    float x;
    memcpy(&x, &u, sizeof(x));
    return x;
}

/* Threads switch only at barriers, so a plain update is atomic here. */
template <class T> static inline T atomicAdd(T *p, T v)
{
    const T old = *p;
    *p = old + v;
    return old;
}

static inline int min(int a, int b)
{
    return a < b ? a : b;
}

static inline int max(int a, int b)
{
    return a > b ? a : b;
}

static inline void hk_emu_entry(void)
{
    (*hk_emu.body)();
    hk_emu_thread &t = hk_emu.th[hk_emu.cur];
    t.done = true;
    hk_emu.progress++;
    hk_emu_swap(&t.ctx, &hk_emu.main_ctx); /* never resumed */
    abort();
}

/* A static __shared__ variable of the running kernel, as declared (every
 * thread registers it; each address counts once a launch). */
static inline void hk_emu_shared(const void *p, size_t bytes)
{
    for (const void *q : hk_emu.shared_seen)
        if (q == p)
            return;
    hk_emu.shared_seen.push_back(p);
    hk_emu.shared_static += bytes;
}

/* The dynamic shared memory kernel k may take: what cudaFuncSetAttribute
 * allowed it, else 48 KB less its static part. */
static inline size_t hk_emu_dyn_limit(const void *k)
{
    for (const auto &a : hk_emu.dyn_allowed)
        if (a.first == k)
            return (size_t)a.second;
    const size_t dflt = 48 * 1024;
    return hk_emu.shared_static < dflt ? dflt - hk_emu.shared_static : 0;
}

/* A launch's blocks, one after another (the launch checked). */
static inline void hk_emu_run_launch(const void *k, dim3 g, dim3 b,
                                     size_t smem,
                                     const std::function<void()> &body)
{
    const long long nt = (long long)b.x * b.y * b.z;
    if (smem > hk_emu.dyn_cap) {
        free(hk_emu.dyn_smem);
        hk_emu.dyn_cap = (smem + 127) / 128 * 128;
        hk_emu.dyn_smem = (unsigned char *)aligned_alloc(128, hk_emu.dyn_cap);
    }
    hk_emu.dyn_size = smem;
    hk_emu.shared_seen.clear();
    hk_emu.shared_static = 0;
    const bool reverse = hk_emu_reverse();
    hk_emu.body = &body;
    hk_emu.nthreads = (int)nt;
    hk_emu.bdim = uint3{b.x, b.y, b.z};
    hk_emu.gdim = uint3{g.x, g.y, g.z};
    hk_emu.th.resize((size_t)nt);
    for (auto &t : hk_emu.th)
        if (t.stack.size() < 256 * 1024)
            t.stack.resize(256 * 1024);
    for (unsigned bz = 0; bz < g.z; bz++)
        for (unsigned by = 0; by < g.y; by++)
            for (unsigned bx = 0; bx < g.x; bx++) {
                hk_emu.block = uint3{bx, by, bz};
                hk_emu.block_serial++;
                if (smem)
                    memset(hk_emu.dyn_smem, 0xff, smem); /* NaN floats */
                hk_emu.bar_count = 0;
                memset(hk_emu.wcount, 0, sizeof(hk_emu.wcount));
                memset(hk_emu.gcount, 0, sizeof(hk_emu.gcount));
                hk_emu_nb_reset();
                for (int i = 0; i < nt; i++) {
                    hk_emu_thread &t = hk_emu.th[i];
                    t.done = t.waiting = false;
                    hk_emu_ctx_make(&t.ctx, t.stack, hk_emu_entry);
                }
                for (;;) {
                    bool live = false;
                    const long long before = hk_emu.progress;
                    for (int k = 0; k < nt; k++) {
                        const int i = reverse ? (int)nt - 1 - k : k;
                        if (hk_emu.th[i].done)
                            continue;
                        live = true;
                        hk_emu.cur = i;
                        hk_emu_swap(&hk_emu.main_ctx, &hk_emu.th[i].ctx);
                    }
                    if (!live)
                        break;
                    if (hk_emu.progress == before) {
                        fprintf(stderr,
                                "emu: deadlock in block (%u,%u,%u): a "
                                "barrier or shuffle some threads never "
                                "reach\n",
                                bx, by, bz);
                        abort();
                    }
                }
                hk_emu_nb_check(bx, by, bz);
            }
    const size_t may = k ? hk_emu_dyn_limit(k) : smem;
    if (smem > may) {
        fprintf(stderr,
                "emu: a launch asks %zu bytes of dynamic shared memory, its "
                "kernel may take %zu (%zu static; cudaFuncSetAttribute "
                "first)\n",
                smem, may, hk_emu.shared_static);
        hk_emu.last_error = cudaErrorInvalidConfiguration;
    }
}

/* Work for stream s: now on the legacy stream, else queued. */
static inline void hk_emu_issue(cudaStream_t s, std::function<void()> run)
{
    if (!s) {
        run();
        return;
    }
    hk_emu_item it;
    it.run = std::move(run);
    s->q.push_back(std::move(it));
}

template <class F>
static inline void hk_emu_launch(const void *k, dim3 g, dim3 b, size_t smem,
                                 cudaStream_t s, F f)
{
    if (hk_emu_fault(true) != cudaSuccess) {
        hk_emu.last_error = hk_emu_sticky;
        return;
    }
    const long long nt = (long long)b.x * b.y * b.z;
    if (nt < 1 || nt > 1024 || b.z > 64 || g.x < 1 || g.y < 1 || g.z < 1 ||
        g.y > 65535 || g.z > 65535 || g.x > 2147483647u ||
        smem > HK_EMU_MAX_DYN_SMEM) {
        hk_emu.last_error = cudaErrorInvalidConfiguration;
        return;
    }
    std::function<void()> body = f;
    hk_emu_issue(s, [=]() { hk_emu_run_launch(k, g, b, smem, body); });
}

/* Whether queue s is empty, and whether its next item can run (a wait's
 * record has run). */
static inline bool hk_emu_idle(const hk_emu_stream *s)
{
    return s->head >= s->q.size();
}

static inline bool hk_emu_runnable(const hk_emu_stream *s)
{
    if (hk_emu_idle(s))
        return false;
    const hk_emu_item &it = s->q[s->head];
    return !it.wait || it.wait->done >= it.wait_for;
}

/* Runs queued items, one at a time (the header: Streams), until done()
 * says so; aborts when nothing queued can run and done() is still false. */
template <class D>
static inline void hk_emu_drain(D done)
{
    while (!done()) {
        hk_emu_stream *pick = nullptr;
        for (hk_emu_stream *s : hk_emu_streams)
            if (hk_emu_runnable(s) &&
                (!pick || (hk_emu_reverse() ? s->priority > pick->priority
                                            : s->priority < pick->priority)))
                pick = s;
        if (!pick) {
            fprintf(stderr, "emu: a stream waits for an event no queued "
                            "work records\n");
            abort();
        }
        hk_emu_item it = std::move(pick->q[pick->head++]);
        if (pick->head == pick->q.size()) {
            pick->q.clear();
            pick->head = 0;
        }
        if (it.run) {
            it.run();
        } else if (it.rec) {
            hk_emu_event_stamp(it.rec);
            it.rec->done++;
        }
    }
}

/* ---- runtime API subset ---- */

static inline cudaError_t cudaGetDeviceCount(int *n)
{
    *n = 1;
    return cudaSuccess;
}

/* The emulator is one device, 0. */
static inline cudaError_t cudaSetDevice(int d)
{
    return d == 0 ? cudaSuccess : cudaErrorInvalidDevice;
}

/* The last error, kept. */
static inline cudaError_t cudaPeekAtLastError(void)
{
    if (hk_emu_fault(false) != cudaSuccess)
        return hk_emu_sticky;
    return hk_emu.last_error;
}

static inline cudaError_t cudaGetLastError(void)
{
    if (hk_emu_fault(false) != cudaSuccess)
        return hk_emu_sticky;
    const cudaError_t e = hk_emu.last_error;
    hk_emu.last_error = cudaSuccess;
    return e;
}

/* The emulated device's memory: HK_EMU_MEM_MB (default 16 GiB), less
 * what cudaMalloc holds (host threads allocate concurrently); an
 * allocation past it fails as on a full GPU. */
inline size_t hk_emu_mem_used;

static inline size_t hk_emu_mem_total(void)
{
    const char *e = getenv("HK_EMU_MEM_MB");
    return (e ? (size_t)atol(e) : 16384) << 20;
}

static inline cudaError_t cudaMalloc(void **p, size_t bytes)
{
    if (hk_emu_fault(false) != cudaSuccess) {
        *p = NULL;
        return hk_emu_sticky;
    }
    if (__atomic_load_n(&hk_emu_mem_used, __ATOMIC_RELAXED) + bytes >
        hk_emu_mem_total()) {
        *p = NULL; /* the device is full */
        return cudaErrorMemoryAllocation;
    }
    *p = aligned_alloc(256, (bytes + 255) / 256 * 256 + 256 * !bytes);
    if (*p) {
        memset(*p, 0xa5, bytes); /* no zeroed memory on a GPU either */
        __atomic_add_fetch(&hk_emu_mem_used, malloc_usable_size(*p),
                           __ATOMIC_RELAXED);
    }
    return *p ? cudaSuccess : cudaErrorMemoryAllocation;
}

static inline cudaError_t cudaFree(void *p)
{
    if (p)
        __atomic_sub_fetch(&hk_emu_mem_used, malloc_usable_size(p),
                           __ATOMIC_RELAXED);
    free(p);
    return cudaSuccess;
}

static inline cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total)
{
    const size_t t = hk_emu_mem_total(),
                 u = __atomic_load_n(&hk_emu_mem_used, __ATOMIC_RELAXED);
    *total = t;
    *free_bytes = u < t ? t - u : 0;
    return cudaSuccess;
}

/* Pinned host memory: plain host memory here (copies are immediate). */
static inline cudaError_t cudaMallocHost(void **p, size_t n)
{
    *p = malloc(n ? n : 1);
    return *p ? cudaSuccess : cudaErrorMemoryAllocation;
}

static inline cudaError_t cudaFreeHost(void *p)
{
    free(p);
    return cudaSuccess;
}

static inline cudaError_t cudaMemsetAsync(void *p, int v, size_t n,
                                          cudaStream_t s)
{
    if (hk_emu_fault(false) != cudaSuccess)
        return hk_emu_sticky;
    hk_emu_issue(s, [=]() { memset(p, v, n); });
    return cudaSuccess;
}

static inline cudaError_t cudaMemcpyAsync(void *d, const void *src, size_t n,
                                          cudaMemcpyKind k, cudaStream_t s)
{
    (void)k;
    if (hk_emu_fault(false) != cudaSuccess)
        return hk_emu_sticky;
    hk_emu_issue(s, [=]() { memmove(d, src, n); });
    return cudaSuccess;
}

/* The legacy stream's work is done when issued; a created stream's when
 * its queue has run. */
static inline cudaError_t cudaStreamSynchronize(cudaStream_t s)
{
    if (s)
        hk_emu_drain([=]() { return hk_emu_idle(s); });
    return hk_emu_fault(false);
}

#define cudaStreamNonBlocking 1

static inline cudaError_t cudaDeviceGetStreamPriorityRange(int *least,
                                                           int *greatest)
{
    *least = 0; /* an H100's */
    *greatest = -5;
    return cudaSuccess;
}

/* Created streams are non-blocking here whatever the flags: the legacy
 * stream waits for them only through events (the kernels create theirs
 * so, cudaStreamNonBlocking). */
static inline cudaError_t cudaStreamCreateWithPriority(cudaStream_t *s,
                                                       unsigned flags, int prio)
{
    (void)flags;
    *s = new hk_emu_stream{prio, {}, 0};
    hk_emu_streams.push_back(*s);
    return cudaSuccess;
}

static inline cudaError_t cudaStreamDestroy(cudaStream_t s)
{
    if (!s)
        return cudaErrorInvalidValue;
    hk_emu_drain([=]() { return hk_emu_idle(s); });
    for (size_t i = 0; i < hk_emu_streams.size(); i++)
        if (hk_emu_streams[i] == s)
            hk_emu_streams.erase(hk_emu_streams.begin() + (long)i);
    delete s;
    return cudaSuccess;
}

/* ---- device queries, attributes, events ---- */

typedef enum {
    cudaDevAttrMultiProcessorCount = 16,
    cudaDevAttrComputeCapabilityMajor = 75,
    cudaDevAttrComputeCapabilityMinor = 76,
    cudaDevAttrMaxSharedMemoryPerBlockOptin = 97
} cudaDeviceAttr;

typedef enum {
    cudaFuncAttributeMaxDynamicSharedMemorySize = 8
} cudaFuncAttribute;

struct cudaDeviceProp {
    char name[256];
    size_t totalGlobalMem;
    int multiProcessorCount, major, minor;
};

static inline cudaError_t cudaGetDevice(int *d)
{
    *d = 0;
    return cudaSuccess;
}

/* HK_EMU_SMS (default 4) multiprocessors, so that code sizing its grid by
 * the SM count takes both branches on the test shapes. */
static inline cudaError_t cudaDeviceGetAttribute(int *v, cudaDeviceAttr a,
                                                 int dev)
{
    (void)dev;
    if (a == cudaDevAttrMultiProcessorCount)
        *v = getenv("HK_EMU_SMS") ? atoi(getenv("HK_EMU_SMS")) : 4;
    else if (a == cudaDevAttrComputeCapabilityMajor)
        *v = 9; /* an H100's 9.0: what emu/wgmma.h models */
    else if (a == cudaDevAttrComputeCapabilityMinor)
        *v = 0;
    else
        *v = HK_EMU_MAX_DYN_SMEM;
    return cudaSuccess;
}

static inline cudaError_t cudaGetDeviceProperties(cudaDeviceProp *p, int dev)
{
    memset(p, 0, sizeof(*p));
    snprintf(p->name, sizeof(p->name), "host emulator");
    p->totalGlobalMem = hk_emu_mem_total();
    cudaDeviceGetAttribute(&p->multiProcessorCount,
                           cudaDevAttrMultiProcessorCount, dev);
    cudaDeviceGetAttribute(&p->major, cudaDevAttrComputeCapabilityMajor, dev);
    cudaDeviceGetAttribute(&p->minor, cudaDevAttrComputeCapabilityMinor, dev);
    return cudaSuccess;
}

/* Records the dynamic shared memory kernel f may take (the launch checks
 * it: hk_emu_dyn_limit). */
template <class F>
static inline cudaError_t cudaFuncSetAttribute(F *f, cudaFuncAttribute a, int v)
{
    if (a != cudaFuncAttributeMaxDynamicSharedMemorySize || v < 0 ||
        v > HK_EMU_MAX_DYN_SMEM)
        return cudaErrorInvalidValue;
    const void *k = reinterpret_cast<const void *>(f);
    for (auto &x : hk_emu.dyn_allowed)
        if (x.first == k) {
            x.second = v;
            return cudaSuccess;
        }
    hk_emu.dyn_allowed.emplace_back(k, v);
    return cudaSuccess;
}

static inline cudaError_t cudaDeviceSynchronize(void)
{
    hk_emu_drain([]() {
        for (const hk_emu_stream *s : hk_emu_streams)
            if (!hk_emu_idle(s))
                return false;
        return true;
    });
    return hk_emu_fault(false);
}

typedef hk_emu_event *cudaEvent_t;

static inline cudaError_t cudaEventCreate(cudaEvent_t *e)
{
    *e = new hk_emu_event();
    return cudaSuccess;
}

#define cudaEventDisableTiming 2

static inline cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned f)
{
    (void)f;
    return cudaEventCreate(e);
}

static inline cudaError_t cudaEventDestroy(cudaEvent_t e)
{
    delete e;
    return cudaSuccess;
}

static inline cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s)
{
    e->issued++;
    if (s) {
        hk_emu_item it;
        it.rec = e;
        s->q.push_back(std::move(it));
        return cudaSuccess;
    }
    hk_emu_event_stamp(e);
    e->done = e->issued;
    return cudaSuccess;
}

/* Stream s waits for e's latest record (as issued by now): the legacy
 * stream by running the queues until it has run. */
static inline cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e,
                                              unsigned flags)
{
    (void)flags;
    const long long want = e->issued;
    if (!s) {
        hk_emu_drain([=]() { return e->done >= want; });
        return hk_emu_fault(false);
    }
    hk_emu_item it;
    it.wait = e;
    it.wait_for = want;
    s->q.push_back(std::move(it));
    return cudaSuccess;
}

static inline cudaError_t cudaEventSynchronize(cudaEvent_t e)
{
    const long long want = e->issued;
    hk_emu_drain([=]() { return e->done >= want; });
    return hk_emu_fault(false);
}

static inline cudaError_t cudaEventQuery(cudaEvent_t e)
{
    return e->done >= e->issued ? cudaSuccess : cudaErrorNotReady;
}

static inline cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t a,
                                               cudaEvent_t b)
{
    *ms = (float)(b->t - a->t);
    return cudaSuccess;
}

#endif
