/*
 * emu/ptx.h - hk_ptx.h's inline PTX on the host emulator (cuda_runtime.h
 * here). The layouts are the PTX ISA's, as hk_ptx.h lists them.
 *
 * mma and ldmatrix are warp collectives: every lane deposits its operands
 * (registers, or its row address) in a table, waits for all 32 lanes (the
 * warp barrier; a lane that never comes deadlocks the emulator, as on the
 * GPU), checks that all made the same call, then rebuilds the whole
 * matrices from the lanes' shares and keeps only its own share of the
 * result. So a kernel that feeds a register from the wrong element, or
 * reads the wrong one back, computes a wrong result here too. Tables are
 * double-buffered by barrier generation (as emu/mma.h): a lane that runs
 * ahead to its next collective cannot overwrite what a slower lane still
 * reads.
 *
 * cp.async lands at one of the two ends of its legal window: in tid order
 * (HK_EMU_ORDER unset or forward) when its thread's hk_cp_async_wait<N>
 * retires its group (the oldest committed groups first), so a kernel that
 * reads a tile before waiting reads the old contents (NaN in fresh dynamic
 * shared memory); in reverse order when it is issued, so a kernel that
 * refills a buffer other warps may still read (a missing barrier before
 * the refill) overwrites it under them. Copies never waited for are
 * dropped at the block's end.
 * Checked: 16-byte alignment of both sides, src_bytes 0 or 16 (the
 * 4-byte copy: 4-byte alignment).
 *
 * Named barriers (bar.sync / bar.arrive) count arrivals per thread (whole
 * warps call them, as on the GPU, where a warp counts 32): a sync waits
 * for its generation to complete, an arrive goes on after the others had
 * their turn. Checked: one count
 * per generation, no thread arriving twice in one generation, none left
 * pending when the block ends (cuda_runtime.h); one nobody completes
 * deadlocks the emulator.
 */
#ifndef HK_EMU_PTX_H
#define HK_EMU_PTX_H

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "cuda_bf16.h"
#include "cuda_runtime.h"

/* Every lane's value of `mine` (the warp's table), after the warp barrier;
 * `what` names the call for the check that all lanes made the same one. */
template <class V>
static inline const V *hk_emu_warp_all(const V &mine, int op, const char *what)
{
    static V tab[32][2][32];
    static int ops[32][2][32];
    const int w = hk_emu.cur / 32, l = hk_emu.cur % 32;
    const int par = hk_emu.wgen[w] & 1;
    tab[w][par][l] = mine;
    ops[w][par][l] = op;
    hk_emu_warp_bar();
    for (int o = 0; o < 32; o++)
        if (ops[w][par][o] != op) {
            fprintf(stderr,
                    "emu: %s: lanes %d and %d of a warp made different "
                    "calls\n",
                    what, l, o);
            abort();
        }
    return tab[w][par];
}

static inline float hk_emu_lo(uint32_t r)
{
    return hk_bf16_to_f32((uint16_t)(r & 0xffffu));
}

static inline float hk_emu_hi(uint32_t r)
{
    return hk_bf16_to_f32((uint16_t)(r >> 16));
}

struct hk_emu_mma_regs {
    uint32_t a[4], b[2];
};

/* mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32: d = a b + c. */
static inline void hk_mma_bf16_16816(float d[4], const uint32_t a[4],
                                     const uint32_t b[2], const float c[4])
{
    hk_emu_mma_regs mine;
    memcpy(mine.a, a, sizeof mine.a);
    memcpy(mine.b, b, sizeof mine.b);
    const hk_emu_mma_regs *all = hk_emu_warp_all(mine, 1, "mma m16n8k16");
    float A[16][16], B[16][8];
    for (int L = 0; L < 32; L++) {
        const int g = L / 4, t = L % 4;
        const uint32_t *ra = all[L].a, *rb = all[L].b;
        for (int h = 0; h < 2; h++) { /* h: the column / row +8 half */
            A[g][2 * t + 8 * h] = hk_emu_lo(ra[2 * h]);
            A[g][2 * t + 1 + 8 * h] = hk_emu_hi(ra[2 * h]);
            A[g + 8][2 * t + 8 * h] = hk_emu_lo(ra[2 * h + 1]);
            A[g + 8][2 * t + 1 + 8 * h] = hk_emu_hi(ra[2 * h + 1]);
            B[2 * t + 8 * h][g] = hk_emu_lo(rb[h]);
            B[2 * t + 1 + 8 * h][g] = hk_emu_hi(rb[h]);
        }
    }
    const int l = hk_emu.cur % 32, g = l / 4, t = l % 4;
    float out[4];
    for (int i = 0; i < 4; i++) {
        const int row = g + 8 * (i / 2), col = 2 * t + (i % 2);
        float acc = c[i];
        for (int k = 0; k < 16; k++)
            acc += A[row][k] * B[k][col]; /* bf16 x bf16: exact in f32 */
        out[i] = acc;
    }
    memcpy(d, out, sizeof out);
}

static inline void hk_emu_ldmatrix(uint32_t r[4], const void *p, bool trans)
{
    if ((uintptr_t)p % 16) {
        fprintf(stderr, "emu: ldmatrix: row address %p not 16-byte aligned\n",
                p);
        abort();
    }
    const void *const *rows = hk_emu_warp_all(p, trans ? 3 : 2, "ldmatrix.x4");
    const int l = hk_emu.cur % 32, g = l / 4, t = l % 4;
    for (int i = 0; i < 4; i++) {
        /* element (row, col) of matrix i */
        auto at = [&](int row, int col) {
            uint16_t e;
            memcpy(&e, (const char *)rows[8 * i + row] + 2 * col, 2);
            return (uint32_t)e;
        };
        r[i] = trans ? at(2 * t, g) | at(2 * t + 1, g) << 16
                     : at(g, 2 * t) | at(g, 2 * t + 1) << 16;
    }
}

/* ldmatrix.sync.aligned.m8n8.x4.shared.b16 */
static inline void hk_ldmatrix_x4(uint32_t r[4], const void *p)
{
    hk_emu_ldmatrix(r, p, false);
}

/* ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 */
static inline void hk_ldmatrix_x4_trans(uint32_t r[4], const void *p)
{
    hk_emu_ldmatrix(r, p, true);
}

/* ---- named barriers ---- */

/* The caller's arrival at named barrier id of n threads; returns the
 * generation it arrived in. Checked: id 1..15, n a multiple of 32 within
 * the block, every arrival of a generation with the same n, one arrival a
 * thread a generation. */
static inline int hk_emu_bar_arrival(int id, int n)
{
    if (id < 1 || id > 15 || n <= 0 || n % 32 || n > hk_emu.nthreads) {
        fprintf(stderr, "emu: named barrier %d of %d threads (block of %d)\n",
                id, n, hk_emu.nthreads);
        abort();
    }
    std::vector<int> &last = hk_emu.nblast[id];
    if (last.size() < (size_t)hk_emu.nthreads)
        last.resize((size_t)hk_emu.nthreads, -1);
    hk_emu.nbused = true;
    const int g = hk_emu.nbgen[id];
    if (hk_emu.nbcount[id] == 0)
        hk_emu.nbn[id] = n;
    if (hk_emu.nbn[id] != n || last[(size_t)hk_emu.cur] == g) {
        fprintf(stderr,
                "emu: named barrier %d: thread %d arrives %s (generation %d "
                "of %d threads)\n",
                id, hk_emu.cur,
                hk_emu.nbn[id] != n ? "with another count" : "twice", g,
                hk_emu.nbn[id]);
        abort();
    }
    last[(size_t)hk_emu.cur] = g;
    hk_emu.progress++;
    if (++hk_emu.nbcount[id] == n) {
        hk_emu.nbcount[id] = 0;
        hk_emu.nbgen[id]++;
    }
    return g;
}

/* bar.sync id, n */
static inline void hk_bar_sync(int id, int n)
{
    const int g = hk_emu_bar_arrival(id, n);
    while (hk_emu.nbgen[id] == g)
        hk_emu_yield();
}

/* bar.arrive id, n: the caller then lets the others run (a GPU's other
 * warps run on meanwhile), so what it does next cannot hide what its
 * arrival released: a producer that signals before its copies landed, a
 * consumer that frees a buffer before its last read of it. */
static inline void hk_bar_arrive(int id, int n)
{
    hk_emu_bar_arrival(id, n);
    hk_emu_yield();
}

/* ---- cp.async, deferred to the wait ---- */

struct hk_emu_copy {
    void *dst;
    const void *src;
    int n, size; /* bytes read; bytes written (the rest zero-filled) */
};

static inline void hk_emu_copy_land(const hk_emu_copy &c)
{
    memcpy(c.dst, c.src, (size_t)c.n);
    memset((char *)c.dst + c.n, 0, (size_t)(c.size - c.n));
}

/* cp.async.cg.shared.global [dst], [src], 16, src_bytes */
static inline void hk_cp_async16(void *dst, const void *src, int src_bytes)
{
    if ((uintptr_t)dst % 16 || (src_bytes && (uintptr_t)src % 16) ||
        (src_bytes != 0 && src_bytes != 16)) {
        fprintf(stderr, "emu: bad cp.async(%p, %p, 16, %d)\n", dst, src,
                src_bytes);
        abort();
    }
    const hk_emu_copy c = {dst, src, src_bytes, 16};
    if (hk_emu_reverse())
        hk_emu_copy_land(c);
    else
        hk_emu_async<hk_emu_copy>().open.push_back(c);
}

/* cp.async.ca.shared.global [dst], [src], 4 */
static inline void hk_cp_async4(void *dst, const void *src)
{
    if ((uintptr_t)dst % 4 || (uintptr_t)src % 4) {
        fprintf(stderr, "emu: bad cp.async(%p, %p, 4)\n", dst, src);
        abort();
    }
    const hk_emu_copy c = {dst, src, 4, 4};
    if (hk_emu_reverse())
        hk_emu_copy_land(c);
    else
        hk_emu_async<hk_emu_copy>().open.push_back(c);
}

/* cp.async.commit_group */
static inline void hk_cp_async_commit(void)
{
    hk_emu_async_commit<hk_emu_copy>();
}

/* cp.async.wait_group N: the copies of all but the N newest groups land. */
template <int N> static inline void hk_cp_async_wait(void)
{
    hk_emu_async_queue<hk_emu_copy> &q = hk_emu_async<hk_emu_copy>();
    while (q.groups.size() > (size_t)N) {
        for (const hk_emu_copy &c : q.groups.front())
            hk_emu_copy_land(c);
        q.groups.erase(q.groups.begin());
    }
}

/* cvt.rn.bf16x2.f32: x in the low half. */
static inline uint32_t hk_pack_bf16x2(float x, float y)
{
    return (uint32_t)hk_bf16_from_f32(x) | (uint32_t)hk_bf16_from_f32(y) << 16;
}

#endif
