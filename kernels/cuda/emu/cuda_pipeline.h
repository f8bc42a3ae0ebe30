/*
 * emu/cuda_pipeline.h - CUDA's asynchronous global -> shared copies
 * (cp.async, the __pipeline_* primitives) on the host emulator: each copy
 * happens when it is issued, so commit and wait have nothing left to do.
 * That is a legal schedule of the real thing (a copy may complete any time
 * before the wait); a kernel that reads a buffer before waiting on it, or
 * without the barrier after the wait, is not caught here (the GPU is).
 * zfill: the last zfill of the size bytes are zeros, src is not read there.
 */
#ifndef HK_EMU_CUDA_PIPELINE_H
#define HK_EMU_CUDA_PIPELINE_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static inline void __pipeline_memcpy_async(void *dst, const void *src,
                                           size_t size, size_t zfill = 0)
{
    if ((size != 4 && size != 8 && size != 16) || zfill > size ||
        (uintptr_t)dst % size || (zfill < size && (uintptr_t)src % size)) {
        fprintf(stderr, "emu: bad __pipeline_memcpy_async(%p, %p, %zu, %zu)\n",
                dst, src, size, zfill);
        abort();
    }
    memcpy(dst, src, size - zfill);
    memset((char *)dst + size - zfill, 0, zfill);
}

static inline void __pipeline_commit(void) {}

static inline void __pipeline_wait_prior(size_t n) { (void)n; }

#endif
