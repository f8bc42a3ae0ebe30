/*
 * hk_lanes.cu - side streams for launches that overlap (hk_cuda.h's
 * hk_cuda_lanes_t): made once, then a call forks them from its stream,
 * passes each step's end from lane to lane by events and joins them back.
 *
 * The streams are non-blocking: the legacy default stream does not wait
 * for them, nor they for it, so only the fork and the join order them
 * against the caller's work, whatever stream that is. An event may be
 * recorded again once a wait on it has been issued (a wait takes the
 * record made before it), so a few serve any number of steps.
 */
#include "kernels/cuda/hk_cuda_impl.h"

extern "C" void hk_cuda_lanes_destroy(hk_cuda_lanes_t *l)
{
    if (!l)
        return;
    for (int i = 0; i < HK_LANES; i++)
        if (l->s[i])
            cudaStreamDestroy(l->s[i]);
    for (int i = 0; i < HK_LANE_EVENTS; i++)
        if (l->ev[i])
            cudaEventDestroy(l->ev[i]);
    free(l);
}

extern "C" int hk_cuda_lanes_create(hk_cuda_lanes_t **out)
{
    if (!out)
        return HK_CUDA_EINVAL;
    *out = NULL;
    hk_cuda_lanes_t *l = (hk_cuda_lanes_t *)calloc(1, sizeof(*l));
    if (!l)
        return HK_CUDA_ENOMEM;
    int least = 0, greatest = 0;
    cudaError_t e = cudaDeviceGetStreamPriorityRange(&least, &greatest);
    /* lower numbers are higher priorities */
    const int prio[HK_LANES] = {greatest, (least + greatest) / 2, least};
    for (int i = 0; e == cudaSuccess && i < HK_LANES; i++)
        e = cudaStreamCreateWithPriority(&l->s[i], cudaStreamNonBlocking,
                                         prio[i]);
    for (int i = 0; e == cudaSuccess && i < HK_LANE_EVENTS; i++)
        e = cudaEventCreateWithFlags(&l->ev[i], cudaEventDisableTiming);
    if (e != cudaSuccess) {
        hk_cuda_lanes_destroy(l);
        return hk_cuda_status(e);
    }
    *out = l;
    return HK_CUDA_OK;
}

int hk_lanes_fork(hk_cuda_lanes *l, cudaStream_t from)
{
    cudaError_t e = cudaEventRecord(l->ev[HK_LANE_FORK], from);
    for (int i = 0; e == cudaSuccess && i < HK_LANES; i++)
        e = cudaStreamWaitEvent(l->s[i], l->ev[HK_LANE_FORK], 0);
    return e == cudaSuccess ? HK_CUDA_OK : hk_cuda_status(e);
}

int hk_lanes_pass(hk_cuda_lanes *l, int i, int from, int to)
{
    cudaEvent_t ev = l->ev[HK_LANE_PASS + i];
    cudaError_t e = cudaEventRecord(ev, l->s[from]);
    if (e == cudaSuccess)
        e = cudaStreamWaitEvent(l->s[to], ev, 0);
    return e == cudaSuccess ? HK_CUDA_OK : hk_cuda_status(e);
}

int hk_lanes_join(hk_cuda_lanes *l, cudaStream_t to)
{
    cudaError_t e = cudaSuccess;
    for (int i = 0; e == cudaSuccess && i < HK_LANES; i++) {
        e = cudaEventRecord(l->ev[HK_LANE_JOIN + i], l->s[i]);
        if (e == cudaSuccess)
            e = cudaStreamWaitEvent(to, l->ev[HK_LANE_JOIN + i], 0);
    }
    return e == cudaSuccess ? HK_CUDA_OK : hk_cuda_status(e);
}
