/*
 * emu/wgmma.h - hk_wgmma.h's warpgroup products on the host emulator
 * (cuda_runtime.h here). The layouts are the PTX ISA's, as hk_wgmma.h
 * lists them.
 *
 * A product is a warpgroup collective: each of the 128 threads deposits
 * its call (descriptors, accumulate flag, A registers), waits for all
 * (the warpgroup barrier: a thread that never comes deadlocks, as on the
 * GPU), checks that all made the same call, and keeps its two rows of A.
 * Shared-memory operands are read through the descriptor as the hardware
 * reads them: start, LBO and SBO decoded from their bit fields (offsets
 * into the launch's dynamic shared memory; swizzled layouts and a base
 * offset abort, as the kernels use neither), element (mn, k) at
 * start + (mn / 8) SBO + (k / 8) LBO + 16 (mn % 8) + 2 (k % 8), each read
 * checked to fall inside the launch's dynamic shared memory.
 *
 * Asynchrony, at the two ends of its window as emu/ptx.h's cp.async: the
 * result reaches the thread's registers only when its hk_wgmma_wait<N>
 * retires the group (so reading or rescaling an accumulator before the
 * wait sees, or is overwritten by, the old value); in tid order
 * (HK_EMU_ORDER unset or forward) the shared memory is read at the issue,
 * in reverse order at the wait (so a kernel that refills a tile a pending
 * product still reads computes a wrong result). Products of one group into
 * the same accumulator chain, as on the GPU. Pending products never waited
 * for are dropped at the block's end. Not modelled: the proxy fence
 * (hk_fence_proxy_async) and wgmma.fence, which are no-ops here.
 */
#ifndef HK_EMU_WGMMA_H
#define HK_EMU_WGMMA_H

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "cuda_bf16.h"
#include "cuda_runtime.h"

/* One thread's view of a product: what every thread of the group passed
 * (checked equal) and this thread's A rows when A is in registers. */
struct hk_emu_wg_call {
    int op, n, acc;
    uint64_t da, db;
    uint32_t a[4];
};

static inline uint64_t hk_wgmma_desc(const void *p, uint32_t lbo, uint32_t sbo)
{
    const unsigned char *q = (const unsigned char *)p;
    if (q < hk_emu.dyn_smem || q >= hk_emu.dyn_smem + hk_emu.dyn_size ||
        (q - hk_emu.dyn_smem) % 16 || lbo % 16 || sbo % 16) {
        fprintf(stderr,
                "emu: wgmma descriptor: %p is not a 16-byte aligned address "
                "of the launch's dynamic shared memory, or LBO %u / SBO %u "
                "not multiples of 16\n",
                p, lbo, sbo);
        abort();
    }
    /* the offset into the launch's shared memory is its shared address */
    return hk_wgmma_desc_pack((uint32_t)(q - hk_emu.dyn_smem), lbo, sbo);
}

/* Element (mn, k) of the shared-memory operand d describes. */
static inline float hk_emu_wg_elem(uint64_t d, int mn, int k)
{
    if (d >> 62 || (d >> 49 & 7)) {
        fprintf(stderr, "emu: wgmma: swizzled layouts and base offsets are "
                        "not modelled\n");
        abort();
    }
    const size_t start = (size_t)(d & 0x3fff) << 4;
    const size_t lbo = (size_t)(d >> 16 & 0x3fff) << 4;
    const size_t sbo = (size_t)(d >> 32 & 0x3fff) << 4;
    const size_t at = start + (size_t)(mn / 8) * sbo + (size_t)(k / 8) * lbo +
                      16 * (size_t)(mn % 8) + 2 * (size_t)(k % 8);
    if (at + 2 > hk_emu.dyn_size) {
        fprintf(stderr,
                "emu: wgmma reads byte %zu of %zu of dynamic shared memory\n",
                at, hk_emu.dyn_size);
        abort();
    }
    uint16_t e;
    memcpy(&e, hk_emu.dyn_smem + at, 2);
    return hk_bf16_to_f32(e);
}

/* A product waiting for its group's retirement. */
struct hk_emu_wg_pending {
    float *d;
    hk_emu_wg_call c;
    float A[2][16]; /* this thread's rows of A (registers: taken at issue) */
    float prod[128];
    bool done; /* prod computed */
};

/* p.prod = this thread's share of A B (rows 16 w + g, + 8; columns
 * 8 i + 2 t, + 1), B (and A with op 1, both operands in shared memory)
 * read now. */
static inline void hk_emu_wg_compute(hk_emu_wg_pending &p)
{
    const int l = hk_emu.cur % 128, w = l / 32, g = l % 32 / 4, t = l % 4;
    if (p.c.op == 1)
        for (int h = 0; h < 2; h++)
            for (int k = 0; k < 16; k++)
                p.A[h][k] = hk_emu_wg_elem(p.c.da, 16 * w + g + 8 * h, k);
    for (int i = 0; i < p.c.n / 8; i++)
        for (int h = 0; h < 2; h++)
            for (int e = 0; e < 2; e++) {
                const int col = 8 * i + 2 * t + e;
                float s = 0.0f;
                for (int k = 0; k < 16; k++) /* bf16 x bf16: exact in f32 */
                    s += p.A[h][k] * hk_emu_wg_elem(p.c.db, col, k);
                p.prod[4 * i + 2 * h + e] = s;
            }
    p.done = true;
}

/* The collective: op 1 (A by descriptor) or 2 (A in registers a). */
static inline void hk_emu_wgmma(int op, int n, float *d, const uint32_t *a,
                                uint64_t da, uint64_t db, int acc)
{
    static hk_emu_wg_call tab[8][2][128];
    if ((hk_emu.cur / 128 + 1) * 128 > hk_emu.nthreads) {
        fprintf(stderr,
                "emu: wgmma by thread %d of a block of %d threads "
                "(not in a whole warpgroup)\n",
                hk_emu.cur, hk_emu.nthreads);
        abort();
    }
    const int wg = hk_emu.cur / 128, l = hk_emu.cur % 128;
    const int par = hk_emu.ggen[wg] & 1;
    hk_emu_wg_call mine = {op, n, acc != 0, op == 1 ? da : 0, db, {0, 0, 0, 0}};
    if (op == 2)
        memcpy(mine.a, a, sizeof mine.a);
    tab[wg][par][l] = mine;
    hk_emu_group_bar();
    const hk_emu_wg_call *all = tab[wg][par];
    for (int o = 0; o < 128; o++)
        if (all[o].op != op || all[o].n != n || all[o].acc != mine.acc ||
            all[o].da != mine.da || all[o].db != mine.db) {
            fprintf(stderr,
                    "emu: wgmma: threads %d and %d of a warpgroup made "
                    "different calls\n",
                    l, o);
            abort();
        }
    hk_emu_wg_pending p;
    p.d = d;
    p.c = mine;
    p.done = false;
    if (op == 2) {
        /* rows 16 w + g (+ 8) of the warp's lanes 4 g .. 4 g + 3 */
        const int w = l / 32, g = l % 32 / 4;
        for (int tt = 0; tt < 4; tt++) {
            const uint32_t *r = all[32 * w + 4 * g + tt].a;
            for (int h = 0; h < 2; h++)
                for (int c = 0; c < 2; c++) { /* a[h + 2 c]: columns + 8 c */
                    const uint32_t x = r[h + 2 * c];
                    p.A[h][2 * tt + 8 * c] =
                        hk_bf16_to_f32((uint16_t)(x & 0xffffu));
                    p.A[h][2 * tt + 8 * c + 1] =
                        hk_bf16_to_f32((uint16_t)(x >> 16));
                }
        }
    }
    if (!hk_emu_reverse())
        hk_emu_wg_compute(p);
    hk_emu_async<hk_emu_wg_pending>().open.push_back(p);
    /* nobody overwrites this generation's table before all have read it:
     * the next collective of the group uses the other half */
}

static inline void hk_wgmma_ss_64x64(float d[32], uint64_t da, uint64_t db,
                                     int acc)
{
    hk_emu_wgmma(1, 64, d, nullptr, da, db, acc);
}

static inline void hk_wgmma_rs_64x64(float d[32], const uint32_t a[4],
                                     uint64_t db, int acc)
{
    hk_emu_wgmma(2, 64, d, a, 0, db, acc);
}

static inline void hk_wgmma_rs_64x128(float d[64], const uint32_t a[4],
                                      uint64_t db, int acc)
{
    hk_emu_wgmma(2, 128, d, a, 0, db, acc);
}

static inline void hk_wgmma_rs_64x256(float d[128], const uint32_t a[4],
                                      uint64_t db, int acc)
{
    hk_emu_wgmma(2, 256, d, a, 0, db, acc);
}

static inline void hk_fence_proxy_async(void) {}

static inline void hk_wgmma_fence(void) {}

static inline void hk_wgmma_hold(float &) {}

static inline void hk_wgmma_hold(uint32_t &) {}

/* wgmma.commit_group */
static inline void hk_wgmma_commit(void)
{
    hk_emu_async_commit<hk_emu_wg_pending>();
}

/* wgmma.wait_group N: all but the N newest groups retire, oldest first:
 * each product lands in its registers, accumulated (acc) on what an
 * earlier product of the same group left there. */
template <int N> static inline void hk_wgmma_wait(void)
{
    hk_emu_async_queue<hk_emu_wg_pending> &q =
        hk_emu_async<hk_emu_wg_pending>();
    while (q.groups.size() > (size_t)N) {
        for (hk_emu_wg_pending &p : q.groups.front()) {
            if (!p.done)
                hk_emu_wg_compute(p);
            const int m = p.c.n / 2;
            for (int i = 0; i < m; i++)
                p.d[i] = p.c.acc ? p.d[i] + p.prod[i] : p.prod[i];
        }
        q.groups.erase(q.groups.begin());
    }
}

#endif
