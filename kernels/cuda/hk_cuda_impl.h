/*
 * hk_cuda_impl.h - private helpers of the CUDA kernels (.cu files only):
 * launch checks that return status codes, warp reductions, grid sizes.
 * Not part of the C interface (hk_cuda.h).
 */
#ifndef HK_CUDA_IMPL_H
#define HK_CUDA_IMPL_H

#ifndef __CUDACC__
#error "hk_cuda_impl.h is for .cu files compiled by nvcc"
#endif

#include <cuda_runtime.h>

#include "kernels/common/hk_math.h"
#include "kernels/cuda/hk_cuda.h"

#define HK_CEIL_DIV(a, b) (((a) + (b)-1) / (b))
/* Largest gridDim.y / gridDim.z. */
#define HK_CUDA_MAX_GRID_YZ 65535
#define HK_FULL_MASK        0xffffffffu

/* Every launch is followed by this: a launch error (bad configuration, no
 * device, missing kernel image for this GPU) becomes a status code, never
 * an exit. Asynchronous faults surface at the caller's next sync. */
static inline int hk_cuda_check_launch(void)
{
    cudaError_t e = cudaGetLastError();
    if (e == cudaSuccess)
        return HK_CUDA_OK;
    if (e == cudaErrorNoDevice || e == cudaErrorInsufficientDriver)
        return HK_CUDA_ENODEV;
    return HK_CUDA_ELAUNCH;
}

static inline int hk_cuda_status(cudaError_t e)
{
    switch (e) {
    case cudaSuccess:
        return HK_CUDA_OK;
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
        return HK_CUDA_ENODEV;
    case cudaErrorMemoryAllocation:
        return HK_CUDA_ENOMEM;
    case cudaErrorInvalidValue:
        return HK_CUDA_EINVAL;
    default:
        return HK_CUDA_ERUNTIME;
    }
}

static inline cudaStream_t hk_stream(void *s)
{
    return (cudaStream_t)s;
}

/* Sum over the 32 lanes of a warp; every lane gets the result. The xor
 * butterfly adds in the same order on every lane, so all lanes agree. */
static __device__ __forceinline__ float hk_warp_sum(float x)
{
    for (int off = 16; off > 0; off >>= 1)
        x += __shfl_xor_sync(HK_FULL_MASK, x, off);
    return x;
}

/* Sum over a block of blockDim.x threads (a multiple of 32, <= 1024);
 * every thread gets the result. sh: 32 floats of shared memory, reused on
 * the next call only after the __syncthreads at its end. */
static __device__ __forceinline__ float hk_block_sum(float x, float *sh)
{
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int nw = blockDim.x >> 5;
    x = hk_warp_sum(x);
    if (lane == 0)
        sh[warp] = x;
    __syncthreads();
    float t = lane < nw ? sh[lane] : 0.0f;
    t = hk_warp_sum(t);
    __syncthreads();
    return t;
}

#endif
