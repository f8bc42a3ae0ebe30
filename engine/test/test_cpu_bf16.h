/*
 * test_cpu_bf16.h - CPU backends that round where a CUDA backend mode
 * rounds, the references of the device tests' bf16 paths
 * (test_cuda_backend.c, test_cuda_pic.c):
 *   cpu-bf16x    bf16 projections on x rounded to bf16 first (the CPU
 *                twin of hk_cuda_matmul_bf16)
 *   +qkv         the Gated DeltaNet chunk on q, k, v rounded to bf16 (to
 *                nearest even) first: what HYPIC_CUDA_GDN=tc_bf16's chunk
 *                takes in (HK_CUDA_GDN_TC_ROUND), computed in f32
 * Everything else is the CPU backend's.
 */
#ifndef HYPIC_ENGINE_TEST_CPU_BF16_H
#define HYPIC_ENGINE_TEST_CPU_BF16_H

#include <stdio.h>
#include <stdlib.h>

#include "engine/backend/backend_impl.h"
#include "kernels/common/hk_bf16.h"

/* A copy of x[n] rounded to bf16 (as f32); exits on no memory. */
static inline float *tcb_round(const float *x, size_t n)
{
    float *r = malloc((n ? n : 1) * sizeof(float));
    if (!r) {
        printf("Bail out! out of memory\n");
        exit(1);
    }
    for (size_t i = 0; i < n; i++)
        r[i] = hk_bf16_to_f32(hk_bf16_from_f32(x[i]));
    return r;
}

static inline void tcb_linear(be_t b, float *y, const float *x,
                              const hk_weight_t *w, int n, int acc)
{
    if (w->dtype != HK_W_BF16) {
        hp_backend_cpu_iface.linear(b, y, x, w, n, acc);
        return;
    }
    float *xr = tcb_round(x, (size_t)n * w->cols);
    hp_backend_cpu_iface.linear(b, y, xr, w, n, acc);
    free(xr);
}

static inline void tcb_gdn_chunk(be_t b, float *o, float *S, float *Tc,
                                 const float *q, const float *k, const float *v,
                                 const float *g, const float *beta, int T,
                                 int Hk, int Hv, int dk, int dv, int C,
                                 float *scratch, hp_prec_t prec)
{
    size_t nq = (size_t)T * Hk * dk, nv = (size_t)T * Hv * dv;
    float *qr = tcb_round(q, nq), *kr = tcb_round(k, nq),
          *vr = tcb_round(v, nv);
    hp_backend_cpu_iface.gdn_chunk(b, o, S, Tc, qr, kr, vr, g, beta, T, Hk, Hv,
                                   dk, dv, C, scratch, prec);
    free(qr);
    free(kr);
    free(vr);
}

/* The CPU backend with x rounded before bf16 projections (bf16x) and, with
 * qkv, the chunk's inputs rounded: *iface is filled, *be points at it. */
static inline void tcb_backend(hp_backend_i *iface, struct hp_backend *be,
                               int bf16x, int qkv)
{
    *iface = hp_backend_cpu_iface;
    if (bf16x)
        iface->linear = tcb_linear;
    if (qkv)
        iface->gdn_chunk = tcb_gdn_chunk;
    struct hp_backend x = {.iface = iface, .host_memory = 1};
    snprintf(x.name, sizeof(x.name), "cpu%s%s", bf16x ? "-bf16x" : "",
             qkv ? "-bf16qkv" : "");
    *be = x;
}

#endif
