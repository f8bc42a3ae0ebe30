/*
 * arena.h - offsets into a block of memory its owner made (host or
 * device memory): first fit from an address-ordered free list, runs
 * coalesced with both neighbours on free, so churn of mixed sizes keeps
 * the free space in few large runs. The bookkeeping lives outside the
 * block: the arena never reads or writes it. Not thread-safe (the owner
 * locks). The public pool (pool.c) and the prefix cache's private pool
 * allocate from one each.
 */
#ifndef HP_ARENA_H
#define HP_ARENA_H

#include <stddef.h>

#include "engine/backend/backend.h"
#include "engine/contract/hp_error.h"

#define HP_ARENA_ALIGN 64           /* offsets' alignment and size granule */
#define HP_ARENA_NONE  ((size_t)-1) /* no run large enough */

typedef struct hp_arena_run hp_arena_run_t;

typedef struct {
    size_t size;          /* bytes managed, a multiple of HP_ARENA_ALIGN */
    size_t used;          /* bytes handed out (rounded) */
    hp_arena_run_t *free; /* free runs, address order */
} hp_arena_t;

/* An arena of size bytes (rounded down to the granule), all free.
 * HP_ENOMEM. */
int hp_arena_init(hp_arena_t *a, size_t size, hp_error_t *err);
void hp_arena_fini(hp_arena_t *a);

/* bytes as the arena hands them out: rounded up to the granule, 0 as 1. */
size_t hp_arena_round(size_t bytes);

/* The offset of bytes (first fit), or HP_ARENA_NONE. */
size_t hp_arena_alloc(hp_arena_t *a, size_t bytes);
/* Gives back what hp_arena_alloc(a, bytes) returned at off. */
void hp_arena_free(hp_arena_t *a, size_t off, size_t bytes);

/* The largest free run: a request of up to this many bytes succeeds. */
size_t hp_arena_largest(const hp_arena_t *a);

/* Host memory for an arena: an anonymous mapping of bytes, reserved and
 * touched on use (pages cost memory once written). NULL on failure. */
void *hp_arena_map(size_t bytes);
void hp_arena_unmap(void *p, size_t bytes);

/* Memory for an arena of bytes in be's memory: a mapping as above where
 * backend memory is host memory, one device allocation now otherwise
 * (the pools' budgets, taken at start). NULL when there is none. */
void *hp_arena_mem(const hp_backend_t *be, size_t bytes);
void hp_arena_mem_free(const hp_backend_t *be, void *p, size_t bytes);

#endif
