/*
 * emu/mma.h - nvcuda::wmma for the host emulator (cuda_runtime.h here):
 * the 16x16x16 shape with bf16 inputs and an f32 accumulator, the only
 * one the kernels use.
 *
 * Each call is a warp collective, as on the GPU: every lane of the warp
 * must make it with the same pointer, leading dimension and layout (the
 * emulator aborts otherwise), and it waits for all 32 lanes first, so
 * what the warp's lanes wrote before the call is what it reads. Each lane
 * keeps whole A and B tiles; an accumulator's 256 elements are spread over
 * the lanes as on the GPU (sm_80+: lane l owns rows l/4 and l/4 + 8,
 * columns 2(l%4), +1, +8, +9): mma_sync computes, and store_matrix_sync
 * writes, only the caller's share. A lane that reads what its warp stored without a
 * __syncwarp() in between therefore sees the other lanes' elements
 * missing in one of the two thread orders. Element access through x[]
 * is for uniform updates (the same operation on every element), which is
 * all the real API defines too. Products are exact (bf16 x bf16 fits an
 * f32) and sums run in k order in f32.
 *
 * Checked: 32-byte aligned tile pointers, ldm a multiple of 8 (16-bit
 * elements) or 4 (float).
 */
#ifndef HK_EMU_MMA_H
#define HK_EMU_MMA_H

#include <cstdint>
#include <type_traits>

#include "cuda_bf16.h"
#include "cuda_runtime.h"

namespace nvcuda {
namespace wmma {

struct matrix_a {};
struct matrix_b {};
struct accumulator {};
struct row_major {};
struct col_major {};
enum layout_t { mem_row_major, mem_col_major };

template <class Use, int M, int N, int K, class T, class Layout = void>
class fragment;

/* A, B tiles: 16 x 16 values, row-major, whole in every lane. */
template <class Layout>
class fragment<matrix_a, 16, 16, 16, __nv_bfloat16, Layout> {
  public:
    enum { num_elements = 256 };
    __nv_bfloat16 x[256];
};
template <class Layout>
class fragment<matrix_b, 16, 16, 16, __nv_bfloat16, Layout> {
  public:
    enum { num_elements = 256 };
    __nv_bfloat16 x[256];
};
/* Accumulator: row-major 16 x 16; the caller's lane owns e % 32 == lane. */
template <> class fragment<accumulator, 16, 16, 16, float, void> {
  public:
    enum { num_elements = 256 };
    float x[256];
};

/* The lane that holds element (r, c) of an accumulator tile. */
static inline int hk_emu_wmma_owner(int r, int c)
{
    return (r % 8) * 4 + (c % 8) / 2;
}

/* Every lane of the warp made this call with the same arguments; waits for
 * all of them (the warp barrier). Arguments are exchanged in one of two
 * tables by barrier generation, so a lane that runs ahead to its next call
 * cannot overwrite what a slower lane still compares. */
static inline void hk_emu_wmma_enter(const void *p, unsigned ldm, int lay,
                                     size_t elt, const char *what)
{
    if (((uintptr_t)p & 31u) != 0 || ldm % (elt == 2 ? 8 : 4) != 0) {
        fprintf(stderr, "emu: %s: pointer %p not 32-byte aligned or ldm %u "
                        "not a multiple of %d\n",
                what, p, ldm, elt == 2 ? 8 : 4);
        abort();
    }
    static struct {
        const void *p;
        unsigned ldm;
        int lay;
    } args[32][2][32];
    const int w = hk_emu.cur / 32, l = hk_emu.cur % 32;
    const int par = hk_emu.wgen[w] & 1;
    args[w][par][l] = {p, ldm, lay};
    hk_emu_warp_bar();
    for (int o = 0; o < 32; o++)
        if (args[w][par][o].p != p || args[w][par][o].ldm != ldm ||
            args[w][par][o].lay != lay) {
            fprintf(stderr, "emu: %s: lanes %d and %d of a warp disagree on "
                            "the arguments\n", what, l, o);
            abort();
        }
}

template <class Use, class Layout>
static inline void
load_matrix_sync(fragment<Use, 16, 16, 16, __nv_bfloat16, Layout> &f,
                 const __nv_bfloat16 *p, unsigned ldm)
{
    const bool col = std::is_same<Layout, col_major>::value;
    hk_emu_wmma_enter(p, ldm, col, 2, "load_matrix_sync");
    for (int r = 0; r < 16; r++)
        for (int c = 0; c < 16; c++)
            f.x[r * 16 + c] = col ? p[r + (size_t)c * ldm]
                                  : p[(size_t)r * ldm + c];
}

static inline void
load_matrix_sync(fragment<accumulator, 16, 16, 16, float, void> &f,
                 const float *p, unsigned ldm, layout_t lay)
{
    hk_emu_wmma_enter(p, ldm, 2 + lay, 4, "load_matrix_sync");
    for (int e = 0; e < 256; e++) {
        const int r = e / 16, c = e % 16;
        f.x[e] = lay == mem_col_major ? p[r + (size_t)c * ldm]
                                      : p[(size_t)r * ldm + c];
    }
}

static inline void
store_matrix_sync(float *p, const fragment<accumulator, 16, 16, 16, float> &f,
                  unsigned ldm, layout_t lay)
{
    hk_emu_wmma_enter(p, ldm, 4 + lay, 4, "store_matrix_sync");
    for (int e = 0; e < 256; e++) {
        const int r = e / 16, c = e % 16;
        if (hk_emu_wmma_owner(r, c) != hk_emu.cur % 32)
            continue;
        if (lay == mem_col_major)
            p[r + (size_t)c * ldm] = f.x[e];
        else
            p[(size_t)r * ldm + c] = f.x[e];
    }
}

template <class Use, class T, class Layout>
static inline void fill_fragment(fragment<Use, 16, 16, 16, T, Layout> &f,
                                 const T &v)
{
    for (int e = 0; e < 256; e++)
        f.x[e] = v;
}

template <class LA, class LB>
static inline void
mma_sync(fragment<accumulator, 16, 16, 16, float> &d,
         const fragment<matrix_a, 16, 16, 16, __nv_bfloat16, LA> &a,
         const fragment<matrix_b, 16, 16, 16, __nv_bfloat16, LB> &b,
         const fragment<accumulator, 16, 16, 16, float> &c)
{
    hk_emu_wmma_enter(nullptr, 0, 6, 4, "mma_sync");
    for (int e = 0; e < 256; e++) {
        const int r = e / 16, col = e % 16;
        if (hk_emu_wmma_owner(r, col) != hk_emu.cur % 32)
            continue;
        float acc = c.x[e];
        for (int k = 0; k < 16; k++)
            acc += __bfloat162float(a.x[r * 16 + k]) *
                   __bfloat162float(b.x[k * 16 + col]);
        d.x[e] = acc;
    }
}

} // namespace wmma
} // namespace nvcuda

#endif
