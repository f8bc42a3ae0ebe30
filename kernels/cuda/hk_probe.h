/*
 * hk_probe.h - in-kernel phase probes (hk_cuda_probe in hk_cuda.h): where
 * a block's time goes inside one kernel, which the CUDA events between
 * launches cannot say. Private to the .cu files.
 *
 * A probed launch gets a zeroed region of the probe buffer, `per` stamps
 * a block (blocks in grid order): [0] the SM the block ran on, [1] its
 * start, [2 + k] the SM's clock when thread 0 passed probe point k. Points
 * sit right after a block barrier (hk_probe_end adds one), so thread 0's
 * clock there is the block's. A launch's kind names its phases: point k
 * ends phase k for the first nhead points, then, for each of at most
 * `iters` iterations of the kernel's loop, phase nhead + j at point
 * nhead + i nloop + j, then the ntail phases after the loop at
 * nhead + iters nloop + j. A point not passed stays 0 and its time goes
 * to the next one passed.
 * Off (p.at NULL, every launch but a bench's) a point is one uniform
 * branch; on, one 8-byte store by thread 0.
 */
#ifndef HK_PROBE_H
#define HK_PROBE_H

#include "kernels/cuda/hk_cuda_impl.h"

struct hk_probe {
    unsigned long long *at; /* the launch's region; NULL: off */
    int per;                /* stamps a block */
};

/* What a probed kernel's points mean (static storage). */
struct hk_probe_kind {
    const char *kernel;
    const char *const *phase; /* nhead + nloop + ntail names */
    int nhead, nloop, ntail;
};

/* The launch's probes: a region for `blocks` blocks of kind k whose loop
 * runs at most iters times, zeroed on stream s; off (at NULL) unless the
 * probes are on and the region fits the buffer (else counted as dropped). */
hk_probe hk_probe_launch(const hk_probe_kind *k, size_t blocks, int iters,
                         cudaStream_t s);

#ifdef HK_EMU_CUDA_RUNTIME_H
/* The emulator: the host's clock in ns, one SM. */
static inline unsigned long long hk_probe_clock(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (unsigned long long)ts.tv_sec * 1000000000ull +
           (unsigned long long)ts.tv_nsec;
}
static inline unsigned hk_probe_smid(void)
{
    return 0;
}
#else
static __device__ __forceinline__ unsigned long long hk_probe_clock(void)
{
    return (unsigned long long)clock64();
}
static __device__ __forceinline__ unsigned hk_probe_smid(void)
{
    unsigned id;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(id));
    return id;
}
#endif

/* The block's index in grid order (volatile on the device: read at each
 * point, so that no register holds the row through the kernel's loop). */
static __device__ __forceinline__ size_t hk_probe_block(void)
{
#ifdef HK_EMU_CUDA_RUNTIME_H
    return blockIdx.x +
           (size_t)gridDim.x * (blockIdx.y + (size_t)gridDim.y * blockIdx.z);
#else
    unsigned x, y, z, nx, ny;
    asm volatile("mov.u32 %0, %%ctaid.x;\n\t"
                 "mov.u32 %1, %%ctaid.y;\n\t"
                 "mov.u32 %2, %%ctaid.z;\n\t"
                 "mov.u32 %3, %%nctaid.x;\n\t"
                 "mov.u32 %4, %%nctaid.y;"
                 : "=r"(x), "=r"(y), "=r"(z), "=r"(nx), "=r"(ny));
    return x + (size_t)nx * (y + (size_t)ny * z);
#endif
}

static __device__ __forceinline__ unsigned long long *
hk_probe_row(const hk_probe &p)
{
    return p.at + hk_probe_block() * (size_t)p.per;
}

/* At the kernel's start: the SM and the start stamp. */
static __device__ __forceinline__ void hk_probe_start(const hk_probe &p)
{
    if (p.at && threadIdx.x == 0) {
        unsigned long long *r = hk_probe_row(p);
        r[0] = hk_probe_smid();
        r[1] = hk_probe_clock();
    }
}

/* Point k, by thread 0 (right after a barrier). */
static __device__ __forceinline__ void hk_probe_at(const hk_probe &p, int k)
{
    if (p.at && threadIdx.x == 0 && 2 + k < p.per)
        hk_probe_row(p)[2 + k] = hk_probe_clock();
}

/* Tail point j of ntail (after the kernel's loop, whatever its count). */
static __device__ __forceinline__ int hk_probe_tail(const hk_probe &p,
                                                    int ntail, int j)
{
    return p.per - 2 - ntail + j;
}

/* Point k after a barrier of its own: where the block's last warps
 * finish (the kernel's end; every thread must come here). */
static __device__ __forceinline__ void hk_probe_end(const hk_probe &p, int k)
{
    if (p.at) {
        __syncthreads();
        hk_probe_at(p, k);
    }
}

#endif
