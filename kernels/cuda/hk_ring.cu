/*
 * hk_ring.cu - the staging ring (hk_cuda.h): host arrays to the device
 * without a host wait per op.
 *
 * A synchronous copy from pageable memory drains the stream first, so an
 * engine that stages a pointer list per op runs the device one op at a
 * time. Here a put copies into pinned host memory and queues an
 * asynchronous copy to the same offset of a device buffer; the kernels
 * issued after it on the stream read the device side. The host side is
 * rewritten only after the device has passed the event that closed the
 * segment (the copies out of it come before that event); the device side
 * is rewritten by copies queued after the kernels that read it, on the
 * same stream.
 */
#include "kernels/cuda/hk_cuda_impl.h"

#define HK_RING_SEGS  HK_CUDA_RING_SEGS
#define HK_RING_ALIGN 256

struct hk_cuda_ring {
    unsigned char *host; /* pinned, HK_RING_SEGS * seg */
    unsigned char *dev;
    size_t seg;
    int cur;                        /* segment being filled */
    uint64_t entered;               /* segments entered (hk_cuda_ring_mark) */
    size_t used;                    /* bytes of it taken */
    cudaEvent_t done[HK_RING_SEGS]; /* never recorded: nothing to wait for */
};

extern "C" void hk_cuda_ring_destroy(hk_cuda_ring_t *r)
{
    if (!r)
        return;
    for (int s = 0; s < HK_RING_SEGS; s++)
        if (r->done[s])
            cudaEventDestroy(r->done[s]);
    if (r->host)
        cudaFreeHost(r->host);
    hk_cuda_free(r->dev);
    free(r);
}

extern "C" int hk_cuda_ring_create(hk_cuda_ring_t **out, size_t seg_bytes)
{
    if (!out || !seg_bytes)
        return HK_CUDA_EINVAL;
    *out = NULL;
    hk_cuda_ring_t *r = (hk_cuda_ring_t *)calloc(1, sizeof(*r));
    if (!r)
        return HK_CUDA_ENOMEM;
    r->seg = (seg_bytes + HK_RING_ALIGN - 1) & ~(size_t)(HK_RING_ALIGN - 1);
    const size_t bytes = HK_RING_SEGS * r->seg;
    cudaError_t e = cudaMallocHost((void **)&r->host, bytes);
    int rc = e == cudaSuccess                 ? HK_CUDA_OK
             : e == cudaErrorMemoryAllocation ? HK_CUDA_ENOMEM
                                              : hk_cuda_status(e);
    if (rc == HK_CUDA_OK)
        rc = hk_cuda_malloc((void **)&r->dev, bytes);
    for (int s = 0; rc == HK_CUDA_OK && s < HK_RING_SEGS; s++)
        rc = hk_cuda_status(
            cudaEventCreateWithFlags(&r->done[s], cudaEventDisableTiming));
    if (rc != HK_CUDA_OK) {
        (void)cudaGetLastError();
        hk_cuda_ring_destroy(r);
        return rc;
    }
    *out = r;
    return HK_CUDA_OK;
}

extern "C" size_t hk_cuda_ring_seg_bytes(const hk_cuda_ring_t *r)
{
    return r ? r->seg : 0;
}

extern "C" uint64_t hk_cuda_ring_mark(const hk_cuda_ring_t *r)
{
    return r ? r->entered : 0;
}

extern "C" int hk_cuda_ring_put(hk_cuda_ring_t *r, const void *src,
                                size_t bytes, void *stream, void **dev)
{
    if (!r || !dev || bytes > r->seg)
        return HK_CUDA_EINVAL;
    *dev = NULL;
    cudaStream_t st = hk_stream(stream);
    size_t at = (r->used + HK_RING_ALIGN - 1) & ~(size_t)(HK_RING_ALIGN - 1);
    if (at + bytes > r->seg) {
        /* close this segment after the copies out of its host side, and
         * enter the next once the copies of its last round have run */
        cudaError_t e = cudaEventRecord(r->done[r->cur], st);
        if (e != cudaSuccess)
            return hk_cuda_status(e);
        r->cur = (r->cur + 1) % HK_RING_SEGS;
        r->entered++;
        const uint64_t t0 = hk_host_ns();
        e = cudaEventSynchronize(r->done[r->cur]);
        hk_wait_end(t0, false);
        if (e != cudaSuccess)
            return hk_cuda_status(e);
        at = 0;
    }
    const size_t off = (size_t)r->cur * r->seg + at;
    r->used = at + bytes;
    if (src && bytes) {
        memcpy(r->host + off, src, bytes);
        cudaError_t e = cudaMemcpyAsync(r->dev + off, r->host + off, bytes,
                                        cudaMemcpyHostToDevice, st);
        if (e != cudaSuccess)
            return hk_cuda_status(e);
        hk_note_host_bytes(bytes);
    }
    *dev = r->dev + off;
    return HK_CUDA_OK;
}
