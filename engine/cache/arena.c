/*
 * arena.c - first-fit, address-ordered, coalescing offsets (arena.h).
 */
#include "engine/cache/arena.h"

#include <stdlib.h>
#include <sys/mman.h>

struct hp_arena_run {
    size_t off, len;
    struct hp_arena_run *next; /* address order */
};

size_t hp_arena_round(size_t bytes)
{
    bytes = bytes ? bytes : 1;
    return (bytes + HP_ARENA_ALIGN - 1) & ~(size_t)(HP_ARENA_ALIGN - 1);
}

int hp_arena_init(hp_arena_t *a, size_t size, hp_error_t *err)
{
    a->size = size & ~(size_t)(HP_ARENA_ALIGN - 1);
    a->used = 0;
    a->free = NULL;
    if (a->size == 0)
        return HP_OK;
    a->free = malloc(sizeof(*a->free));
    if (!a->free)
        return hp_error_set(err, HP_ENOMEM, "arena: out of memory");
    *a->free = (hp_arena_run_t){0, a->size, NULL};
    return HP_OK;
}

void hp_arena_fini(hp_arena_t *a)
{
    hp_arena_run_t *r = a->free;
    while (r) {
        hp_arena_run_t *n = r->next;
        free(r);
        r = n;
    }
    a->free = NULL;
}

size_t hp_arena_alloc(hp_arena_t *a, size_t bytes)
{
    size_t len = hp_arena_round(bytes);
    for (hp_arena_run_t **pp = &a->free; *pp; pp = &(*pp)->next) {
        hp_arena_run_t *r = *pp;
        if (r->len < len)
            continue;
        size_t off = r->off;
        r->off += len;
        r->len -= len;
        if (r->len == 0) {
            *pp = r->next;
            free(r);
        }
        a->used += len;
        return off;
    }
    return HP_ARENA_NONE;
}

void hp_arena_free(hp_arena_t *a, size_t off, size_t bytes)
{
    size_t len = hp_arena_round(bytes);
    hp_arena_run_t **pp = &a->free, *prev = NULL;
    a->used -= len;
    while (*pp && (*pp)->off < off) {
        prev = *pp;
        pp = &(*pp)->next;
    }
    hp_arena_run_t *next = *pp;
    if (prev && prev->off + prev->len == off) {
        prev->len += len;
        if (next && prev->off + prev->len == next->off) {
            prev->len += next->len;
            prev->next = next->next;
            free(next);
        }
        return;
    }
    if (next && off + len == next->off) {
        next->off = off;
        next->len += len;
        return;
    }
    hp_arena_run_t *r = malloc(sizeof(*r));
    if (!r)
        return; /* the bytes leak from the arena until fini; no UB */
    *r = (hp_arena_run_t){off, len, next};
    *pp = r;
}

size_t hp_arena_largest(const hp_arena_t *a)
{
    size_t m = 0;
    for (const hp_arena_run_t *r = a->free; r; r = r->next)
        m = r->len > m ? r->len : m;
    return m;
}

void *hp_arena_map(size_t bytes)
{
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    return p == MAP_FAILED ? NULL : p;
}

void hp_arena_unmap(void *p, size_t bytes)
{
    if (p)
        munmap(p, bytes);
}

void *hp_arena_mem(const hp_backend_t *be, size_t bytes)
{
    return hp_backend_host_memory(be) ? hp_arena_map(bytes)
                                      : hp_backend_alloc(be, bytes);
}

void hp_arena_mem_free(const hp_backend_t *be, void *p, size_t bytes)
{
    if (hp_backend_host_memory(be))
        hp_arena_unmap(p, bytes);
    else
        hp_backend_free(be, p);
}
