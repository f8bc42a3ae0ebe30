/*
 * hk_cuda.cu - the CUDA backend's runtime glue: device discovery, checked
 * memory and stream wrappers, status names. No kernels here.
 *
 * A machine without a GPU (our CI) makes cudaGetDeviceCount fail with
 * cudaErrorNoDevice (35 when the driver is present, cudaErrorInsufficient-
 * Driver without one): that is reported as zero devices, never as a crash
 * or an error, so callers fall back to the CPU backend.
 */
#include <time.h>

#include "kernels/cuda/hk_cuda_impl.h"

extern "C" const char *hk_cuda_strerror(int rc)
{
    switch (rc) {
    case HK_CUDA_OK:
        return "ok";
    case HK_CUDA_ENODEV:
        return "no CUDA device";
    case HK_CUDA_EINVAL:
        return "invalid argument";
    case HK_CUDA_ENOMEM:
        return "out of device memory";
    case HK_CUDA_ELAUNCH:
        return "kernel launch failed";
    case HK_CUDA_ERUNTIME:
        return "CUDA runtime error";
    case HK_CUDA_EBLAS:
        return "cuBLAS error";
    case HK_CUDA_EFAULT:
        return "the device faulted; its context is lost";
    }
    return "unknown error";
}

extern "C" int hk_cuda_device_count(int *n)
{
    if (!n)
        return HK_CUDA_EINVAL;
    *n = 0;
    int c = 0;
    cudaError_t e = cudaGetDeviceCount(&c);
    if (e == cudaErrorNoDevice || e == cudaErrorInsufficientDriver) {
        /* The failed call leaves a sticky last error; clear it so the next
         * launch check does not report it. */
        (void)cudaGetLastError();
        return HK_CUDA_OK;
    }
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return HK_CUDA_ERUNTIME;
    }
    *n = c;
    return HK_CUDA_OK;
}

extern "C" int hk_cuda_set_device(int dev)
{
    cudaError_t e = cudaSetDevice(dev);
    if (e == cudaErrorInvalidDevice) {
        (void)cudaGetLastError();
        return HK_CUDA_ENODEV;
    }
    return e == cudaSuccess ? HK_CUDA_OK : hk_cuda_status(e);
}

static unsigned long n_mallocs; /* atomic: any host thread allocates */

extern "C" unsigned long hk_cuda_malloc_count(void)
{
    return __atomic_load_n(&n_mallocs, __ATOMIC_RELAXED);
}

extern "C" int hk_cuda_malloc(void **p, size_t bytes)
{
    if (!p)
        return HK_CUDA_EINVAL;
    *p = NULL;
    cudaError_t e = cudaMalloc(p, bytes ? bytes : 1);
    if (e != cudaSuccess) {
        *p = NULL;
        return e == cudaErrorMemoryAllocation ? HK_CUDA_ENOMEM
                                              : hk_cuda_status(e);
    }
    __atomic_add_fetch(&n_mallocs, 1, __ATOMIC_RELAXED);
    return HK_CUDA_OK;
}

extern "C" int hk_cuda_free(void *p)
{
    return p ? hk_cuda_status(cudaFree(p)) : HK_CUDA_OK;
}

extern "C" int hk_cuda_memset0(void *p, size_t bytes, void *stream)
{
    if (bytes == 0)
        return HK_CUDA_OK;
    return hk_cuda_status(cudaMemsetAsync(p, 0, bytes, hk_stream(stream)));
}

static int hk_copy(void *dst, const void *src, size_t bytes,
                   cudaMemcpyKind kind, void *stream)
{
    if (bytes == 0)
        return HK_CUDA_OK;
    if (kind != cudaMemcpyDeviceToDevice)
        hk_note_host_bytes(bytes);
    return hk_cuda_status(
        cudaMemcpyAsync(dst, src, bytes, kind, hk_stream(stream)));
}

/* The two host copies synchronize the stream: the host buffer may be
 * pageable, and callers read (or reuse) it right after. */
extern "C" int hk_cuda_h2d(void *dst, const void *src, size_t bytes,
                           void *stream)
{
    int rc = hk_copy(dst, src, bytes, cudaMemcpyHostToDevice, stream);
    return rc ? rc : hk_cuda_stream_sync(stream);
}

extern "C" int hk_cuda_d2h(void *dst, const void *src, size_t bytes,
                           void *stream)
{
    int rc = hk_copy(dst, src, bytes, cudaMemcpyDeviceToHost, stream);
    return rc ? rc : hk_cuda_stream_sync(stream);
}

extern "C" int hk_cuda_d2d(void *dst, const void *src, size_t bytes,
                           void *stream)
{
    return hk_copy(dst, src, bytes, cudaMemcpyDeviceToDevice, stream);
}

static unsigned long n_syncs; /* atomic, as n_mallocs */
static unsigned long long n_host_bytes;
static unsigned long n_host_copies;

void hk_note_host_bytes(size_t bytes)
{
    __atomic_add_fetch(&n_host_bytes, (unsigned long long)bytes,
                       __ATOMIC_RELAXED);
    __atomic_add_fetch(&n_host_copies, 1ul, __ATOMIC_RELAXED);
}

extern "C" unsigned long long hk_cuda_host_bytes(void)
{
    return __atomic_load_n(&n_host_bytes, __ATOMIC_RELAXED);
}

extern "C" unsigned long hk_cuda_host_copies(void)
{
    return __atomic_load_n(&n_host_copies, __ATOMIC_RELAXED);
}

extern "C" unsigned long hk_cuda_sync_count(void)
{
    return __atomic_load_n(&n_syncs, __ATOMIC_RELAXED);
}

static unsigned long long n_wait_ns;

uint64_t hk_host_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

void hk_wait_end(uint64_t t0, bool counted)
{
    if (counted)
        __atomic_add_fetch(&n_syncs, 1, __ATOMIC_RELAXED);
    __atomic_add_fetch(&n_wait_ns, (unsigned long long)(hk_host_ns() - t0),
                       __ATOMIC_RELAXED);
}

extern "C" unsigned long long hk_cuda_wait_ns(void)
{
    return __atomic_load_n(&n_wait_ns, __ATOMIC_RELAXED);
}

extern "C" int hk_cuda_stream_sync(void *stream)
{
    const uint64_t t0 = hk_host_ns();
    const cudaError_t e = cudaStreamSynchronize(hk_stream(stream));
    hk_wait_end(t0, true);
    return hk_cuda_status(e);
}

extern "C" int hk_cuda_device_info(char *name, size_t n, int *sms, size_t *mem)
{
    int dev = 0;
    cudaDeviceProp p;
    cudaError_t e = cudaGetDevice(&dev);
    if (e == cudaSuccess)
        e = cudaGetDeviceProperties(&p, dev);
    if (e != cudaSuccess)
        return hk_cuda_status(e);
    if (name && n) {
        strncpy(name, p.name, n - 1);
        name[n - 1] = '\0';
    }
    if (sms)
        *sms = p.multiProcessorCount;
    if (mem)
        *mem = p.totalGlobalMem;
    return HK_CUDA_OK;
}

extern "C" int hk_cuda_compute_capability(void)
{
    return hk_cuda_cc();
}

extern "C" int hk_cuda_mem_info(size_t *free_bytes, size_t *total)
{
    size_t f = 0, t = 0;
    cudaError_t e = cudaMemGetInfo(&f, &t);
    if (e != cudaSuccess)
        return hk_cuda_status(e);
    if (free_bytes)
        *free_bytes = f;
    if (total)
        *total = t;
    return HK_CUDA_OK;
}

extern "C" int hk_cuda_timer_create(hk_cuda_timer_t *t)
{
    if (!t)
        return HK_CUDA_EINVAL;
    cudaEvent_t a = NULL, b = NULL;
    cudaError_t e = cudaEventCreate(&a);
    if (e == cudaSuccess && (e = cudaEventCreate(&b)) != cudaSuccess)
        cudaEventDestroy(a);
    if (e != cudaSuccess)
        return hk_cuda_status(e);
    t->start = a;
    t->stop = b;
    return HK_CUDA_OK;
}

extern "C" void hk_cuda_timer_destroy(hk_cuda_timer_t *t)
{
    if (!t || !t->start)
        return;
    cudaEventDestroy((cudaEvent_t)t->start);
    cudaEventDestroy((cudaEvent_t)t->stop);
    t->start = t->stop = NULL;
}

extern "C" int hk_cuda_timer_start(hk_cuda_timer_t *t, void *stream)
{
    return hk_cuda_status(
        cudaEventRecord((cudaEvent_t)t->start, hk_stream(stream)));
}

struct hk_cuda_marks {
    cudaEvent_t *ev;
    int cap, n;
};

extern "C" int hk_cuda_marks_create(hk_cuda_marks_t **out, int cap)
{
    if (!out || cap < 2)
        return HK_CUDA_EINVAL;
    hk_cuda_marks_t *m = (hk_cuda_marks_t *)calloc(1, sizeof(*m));
    if (!m || !(m->ev = (cudaEvent_t *)calloc((size_t)cap, sizeof(*m->ev)))) {
        free(m);
        return HK_CUDA_ENOMEM;
    }
    for (; m->cap < cap; m->cap++) {
        const cudaError_t e = cudaEventCreate(&m->ev[m->cap]);
        if (e != cudaSuccess) {
            hk_cuda_marks_destroy(m);
            return hk_cuda_status(e);
        }
    }
    *out = m;
    return HK_CUDA_OK;
}

extern "C" void hk_cuda_marks_destroy(hk_cuda_marks_t *m)
{
    if (!m)
        return;
    for (int i = 0; i < m->cap; i++)
        cudaEventDestroy(m->ev[i]);
    free(m->ev);
    free(m);
}

extern "C" int hk_cuda_marks_record(hk_cuda_marks_t *m, void *stream)
{
    if (m->n == m->cap)
        return HK_CUDA_ENOMEM;
    return hk_cuda_status(cudaEventRecord(m->ev[m->n++], hk_stream(stream)));
}

extern "C" int hk_cuda_marks_read(hk_cuda_marks_t *m, float *ms, int *n)
{
    cudaError_t e = cudaSuccess;
    *n = 0;
    if (m->n > 1)
        e = cudaEventSynchronize(m->ev[m->n - 1]);
    for (int i = 0; e == cudaSuccess && i + 1 < m->n; i++)
        e = cudaEventElapsedTime(&ms[i], m->ev[i], m->ev[i + 1]);
    if (e == cudaSuccess)
        *n = m->n > 1 ? m->n - 1 : 0;
    m->n = 0;
    return hk_cuda_status(e);
}

extern "C" int hk_cuda_timer_stop(hk_cuda_timer_t *t, void *stream, double *ms)
{
    float f = 0.0f;
    cudaError_t e = cudaEventRecord((cudaEvent_t)t->stop, hk_stream(stream));
    if (e == cudaSuccess)
        e = cudaEventSynchronize((cudaEvent_t)t->stop);
    if (e == cudaSuccess)
        e = cudaEventElapsedTime(&f, (cudaEvent_t)t->start,
                                 (cudaEvent_t)t->stop);
    *ms = f;
    return hk_cuda_status(e);
}
