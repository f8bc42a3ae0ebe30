/*
 * hk_wgmma.h - Hopper's warpgroup tensor-core product (wgmma, sm_90a) in
 * one place, for the kernels that use it (hk_attention_wg.cu's FLASH3):
 * the shared-memory matrix descriptor, the async proxy fence, wgmma's
 * fence / commit / wait and the bf16 products with f32 accumulators that
 * the kernels take (m64n64k16 with both operands in shared memory;
 * m64n{64,128,256}k16 with A in registers). Under the host emulator
 * (emu/, which cannot compile inline PTX) emu/wgmma.h implements the same
 * calls as warpgroup collectives with the PTX ISA's layouts, so a kernel
 * that lays an operand out wrong, or reads a result from the wrong
 * register, fails there as it would on a GPU.
 *
 * Layouts (PTX ISA, "Asynchronous Warpgroup Level Matrix Multiply"; a
 * warpgroup is 4 consecutive warps, 128 threads; warp w of it, lane l,
 * g = l / 4, t = l % 4):
 *   D (64 x N, f32)  d[4i + 2h + e] = D[16 w + g + 8 h][8 i + 2 t + e]
 *                    (i < N / 8, h, e in 0..1): mma.m16n8's C tiles side
 *                    by side, the warp's 16 rows;
 *   A in registers   a[0]: (16 w + g, 2t..2t+1), a[1]: (16 w + g + 8, 2t..),
 *   (64 x 16, bf16)  a[2]: (16 w + g, 2t+8..), a[3]: (16 w + g + 8, 2t+8..),
 *                    the lower column in the low half (mma.m16n8k16's A);
 *   shared memory    K-major without swizzle only (the kernels' layout):
 *                    8 x 8 core matrices of 128 contiguous bytes (row r of
 *                    one at 16 r, its 8 k-elements contiguous); element
 *                    (mn, k) of an operand (A: m rows, B: n columns, k the
 *                    contracted axis) at start + (mn / 8) SBO + (k / 8) LBO
 *                    + 16 (mn % 8) + 2 (k % 8) bytes. hk_wgmma_desc builds
 *                    the descriptor: start, LBO, SBO in 16-byte units,
 *                    swizzle mode 0.
 * Ordering: shared memory written by threads (st.shared, cp.async) is seen
 * by wgmma only after hk_fence_proxy_async and a barrier; registers a
 * wgmma reads or accumulates into must be written before hk_wgmma_fence;
 * its results may be read after hk_wgmma_commit and the hk_wgmma_wait<N>
 * that retires its group, and hk_wgmma_hold on each of them, so the
 * compiler does not move those reads above the wait.
 */
#ifndef HK_WGMMA_H
#define HK_WGMMA_H

#include <stdint.h>

/* The descriptor of a shared-memory operand at shared address a (both
 * builds): start, LBO and SBO in 16-byte units, base offset and swizzle
 * mode 0. */
static __host__ __device__ __forceinline__ uint64_t
hk_wgmma_desc_pack(uint32_t a, uint32_t lbo, uint32_t sbo)
{
    return (uint64_t)((a & 0x3ffffu) >> 4) |
           (uint64_t)((lbo >> 4) & 0x3fffu) << 16 |
           (uint64_t)((sbo >> 4) & 0x3fffu) << 32;
}

#ifdef HK_EMU_CUDA_RUNTIME_H
#include <wgmma.h> /* emu/wgmma.h */
#else

/* Whether this compilation can issue wgmma: sm_90a's device pass (the
 * kernels compile their body to a trap elsewhere; the launchers run them
 * only on a compute capability 9.0 device, whose sm_90a code the driver
 * picks). */
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define HK_WGMMA_ARCH 1
#else
#define HK_WGMMA_ARCH 0
#endif

static __device__ __forceinline__ uint64_t hk_wgmma_desc(const void *p,
                                                         uint32_t lbo,
                                                         uint32_t sbo)
{
    return hk_wgmma_desc_pack((uint32_t)__cvta_generic_to_shared(p), lbo, sbo);
}

/* Keeps the compiler from moving accesses of x across this point. */
static __device__ __forceinline__ void hk_wgmma_hold(float &x)
{
    asm volatile("" : "+f"(x)::"memory");
}

static __device__ __forceinline__ void hk_wgmma_hold(uint32_t &x)
{
    asm volatile("" : "+r"(x)::"memory");
}

#if HK_WGMMA_ARCH
static __device__ __forceinline__ void hk_fence_proxy_async(void)
{
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

static __device__ __forceinline__ void hk_wgmma_fence(void)
{
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}

static __device__ __forceinline__ void hk_wgmma_commit(void)
{
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}

/* Waits until at most N committed groups are pending. */
template <int N> static __device__ __forceinline__ void hk_wgmma_wait(void)
{
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}

/* D[64, 64] (+)= A B: A 64 x 16 and B 16 x 64 by their descriptors. */
static __device__ __forceinline__ void
hk_wgmma_ss_64x64(float d[32], uint64_t da, uint64_t db, int acc)
{
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {"
                 "%0,%1,%2,%3,%4,%5,%6,%7,"
                 "%8,%9,%10,%11,%12,%13,%14,%15,"
                 "%16,%17,%18,%19,%20,%21,%22,%23,"
                 "%24,%25,%26,%27,%28,%29,%30,%31}, "
                 "%32, %33, p, 1, 1, 0, 0;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]),
                   "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]),
                   "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),
                   "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]),
                   "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]),
                   "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]),
                   "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]),
                   "+f"(d[30]), "+f"(d[31])
                 : "l"(da), "l"(db), "r"(acc));
}

/* D[64, 64] (+)= A B: A 64 x 16 from the registers a, B 16 x 64 by
 * its descriptor. */
static __device__ __forceinline__ void
hk_wgmma_rs_64x64(float d[32], const uint32_t a[4], uint64_t db, int acc)
{
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {"
        "%0,%1,%2,%3,%4,%5,%6,%7,"
        "%8,%9,%10,%11,%12,%13,%14,%15,"
        "%16,%17,%18,%19,%20,%21,%22,%23,"
        "%24,%25,%26,%27,%28,%29,%30,%31}, "
        "{%32,%33,%34,%35}, %36, p, 1, 1, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]),
          "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]),
          "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]),
          "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]),
          "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]),
          "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]),
          "+f"(d[30]), "+f"(d[31])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(acc));
}

/* D[64, 128] (+)= A B: A 64 x 16 from the registers a, B 16 x 128 by
 * its descriptor. */
static __device__ __forceinline__ void
hk_wgmma_rs_64x128(float d[64], const uint32_t a[4], uint64_t db, int acc)
{
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {"
        "%0,%1,%2,%3,%4,%5,%6,%7,"
        "%8,%9,%10,%11,%12,%13,%14,%15,"
        "%16,%17,%18,%19,%20,%21,%22,%23,"
        "%24,%25,%26,%27,%28,%29,%30,%31,"
        "%32,%33,%34,%35,%36,%37,%38,%39,"
        "%40,%41,%42,%43,%44,%45,%46,%47,"
        "%48,%49,%50,%51,%52,%53,%54,%55,"
        "%56,%57,%58,%59,%60,%61,%62,%63}, "
        "{%64,%65,%66,%67}, %68, p, 1, 1, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]),
          "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]),
          "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]),
          "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]),
          "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]),
          "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]),
          "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]),
          "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
          "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]),
          "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]),
          "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]),
          "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]),
          "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(acc));
}

/* D[64, 256] (+)= A B: A 64 x 16 from the registers a, B 16 x 256 by
 * its descriptor. */
static __device__ __forceinline__ void
hk_wgmma_rs_64x256(float d[128], const uint32_t a[4], uint64_t db, int acc)
{
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %133, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {"
        "%0,%1,%2,%3,%4,%5,%6,%7,"
        "%8,%9,%10,%11,%12,%13,%14,%15,"
        "%16,%17,%18,%19,%20,%21,%22,%23,"
        "%24,%25,%26,%27,%28,%29,%30,%31,"
        "%32,%33,%34,%35,%36,%37,%38,%39,"
        "%40,%41,%42,%43,%44,%45,%46,%47,"
        "%48,%49,%50,%51,%52,%53,%54,%55,"
        "%56,%57,%58,%59,%60,%61,%62,%63,"
        "%64,%65,%66,%67,%68,%69,%70,%71,"
        "%72,%73,%74,%75,%76,%77,%78,%79,"
        "%80,%81,%82,%83,%84,%85,%86,%87,"
        "%88,%89,%90,%91,%92,%93,%94,%95,"
        "%96,%97,%98,%99,%100,%101,%102,%103,"
        "%104,%105,%106,%107,%108,%109,%110,%111,"
        "%112,%113,%114,%115,%116,%117,%118,%119,"
        "%120,%121,%122,%123,%124,%125,%126,%127}, "
        "{%128,%129,%130,%131}, %132, p, 1, 1, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]),
          "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]),
          "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]),
          "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]),
          "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]),
          "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]),
          "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]),
          "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
          "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]),
          "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]),
          "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]),
          "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]),
          "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), "+f"(d[64]),
          "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]),
          "+f"(d[70]), "+f"(d[71]), "+f"(d[72]), "+f"(d[73]), "+f"(d[74]),
          "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]),
          "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]),
          "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), "+f"(d[88]), "+f"(d[89]),
          "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]),
          "+f"(d[95]), "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]),
          "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]), "+f"(d[104]),
          "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]),
          "+f"(d[110]), "+f"(d[111]), "+f"(d[112]), "+f"(d[113]), "+f"(d[114]),
          "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]),
          "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]),
          "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(acc));
}

#else /* !HK_WGMMA_ARCH: never run (the launchers check the device) */
static __device__ __forceinline__ void hk_fence_proxy_async(void) {}
static __device__ __forceinline__ void hk_wgmma_fence(void) {}
static __device__ __forceinline__ void hk_wgmma_commit(void) {}
template <int N> static __device__ __forceinline__ void hk_wgmma_wait(void) {}
#define HK_WGMMA_TRAP(name, ...)                                               \
    static __device__ __forceinline__ void name(__VA_ARGS__)                   \
    {                                                                          \
        __trap();                                                              \
    }
HK_WGMMA_TRAP(hk_wgmma_ss_64x64, float *, uint64_t, uint64_t, int)
HK_WGMMA_TRAP(hk_wgmma_rs_64x64, float *, const uint32_t *, uint64_t, int)
HK_WGMMA_TRAP(hk_wgmma_rs_64x128, float *, const uint32_t *, uint64_t, int)
HK_WGMMA_TRAP(hk_wgmma_rs_64x256, float *, const uint32_t *, uint64_t, int)
#undef HK_WGMMA_TRAP
#endif /* HK_WGMMA_ARCH */

#endif /* HK_EMU_CUDA_RUNTIME_H */

/* The product with A in registers at N = 64, 128 or 256 columns. */
template <int N>
static __device__ __forceinline__ void
hk_wgmma_rs(float d[N / 2], const uint32_t a[4], uint64_t db, int acc)
{
    static_assert(N == 64 || N == 128 || N == 256, "wgmma: N");
    if (N == 64)
        hk_wgmma_rs_64x64(d, a, db, acc);
    else if (N == 128)
        hk_wgmma_rs_64x128(d, a, db, acc);
    else
        hk_wgmma_rs_64x256(d, a, db, acc);
}

#endif
