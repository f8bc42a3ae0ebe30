/*
 * pool.c - LRU cache over an arena (see pool.h).
 *
 * The arena's memory is one anonymous mapping of the budget, or memory
 * the caller made (a device's); its blocks come from arena.h (first fit,
 * coalescing), whose bookkeeping lives outside it, so the pool never
 * reads or writes the arena's bytes. Eviction walks the LRU list from
 * the cold end, skipping entries in use, until the allocation fits.
 */
#include "engine/cache/pool.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#define ALIGN    HP_POOL_ALIGN
#define NBUCKETS 4096

struct hp_pool {
    pthread_mutex_t mu;
    uint8_t *arena;
    size_t budget;
    hp_arena_t ar;                /* the arena's free runs */
    hp_pool_entry_t *head, *tail; /* LRU: head = most recent */
    hp_pool_entry_t *buckets[NBUCKETS];
    uint64_t clock;
    hp_pool_stats_t st;
    hp_pool_hook_fn hook;
    void *hook_ud;
    hp_pool_release_fn release; /* gives the arena back */
    void *release_ud;
};

static unsigned bucket(const uint8_t key[16], uint32_t variant)
{
    uint64_t h;
    memcpy(&h, key, 8);
    h ^= (uint64_t)variant * 0x9e3779b97f4a7c15ULL;
    return (unsigned)((h ^ (h >> 29)) % NBUCKETS);
}

/* The pool around an arena of budget bytes (a multiple of ALIGN). */
static hp_pool_t *pool_new(uint8_t *arena, size_t budget, hp_error_t *err)
{
    hp_pool_t *p = calloc(1, sizeof(*p));
    if (!p || hp_arena_init(&p->ar, budget, err) != HP_OK) {
        free(p);
        hp_error_set(err, HP_ENOMEM, "pool: out of memory");
        return NULL;
    }
    p->arena = arena;
    p->budget = p->st.budget = budget;
    pthread_mutex_init(&p->mu, NULL);
    return p;
}

static void unmap(void *ud, void *arena, size_t bytes)
{
    (void)ud;
    hp_arena_unmap(arena, bytes);
}

hp_pool_t *hp_pool_create(size_t budget, hp_error_t *err)
{
    budget = hp_arena_round(budget);
    void *a = hp_arena_map(budget);
    if (!a) {
        hp_error_set(err, HP_ENOMEM, "pool: cannot reserve %zu bytes", budget);
        return NULL;
    }
    hp_pool_t *p = hp_pool_create_in(a, budget, unmap, NULL, err);
    if (!p)
        hp_arena_unmap(a, budget);
    return p;
}

hp_pool_t *hp_pool_create_in(void *arena, size_t budget,
                             hp_pool_release_fn release, void *ud,
                             hp_error_t *err)
{
    if (!arena || ((uintptr_t)arena & (ALIGN - 1))) {
        hp_error_set(err, HP_EINTERNAL, "pool: arena not %d-byte aligned",
                     ALIGN);
        return NULL;
    }
    /* offsets stay aligned: the tail past the last whole block is unused */
    hp_pool_t *p = pool_new(arena, budget & ~(size_t)(ALIGN - 1), err);
    if (p) {
        p->release = release;
        p->release_ud = ud;
    }
    return p;
}

static void lru_unlink(hp_pool_t *p, hp_pool_entry_t *e)
{
    if (e->prev)
        e->prev->next = e->next;
    else
        p->head = e->next;
    if (e->next)
        e->next->prev = e->prev;
    else
        p->tail = e->prev;
    e->prev = e->next = NULL;
}

static void lru_front(hp_pool_t *p, hp_pool_entry_t *e)
{
    e->prev = NULL;
    e->next = p->head;
    if (p->head)
        p->head->prev = e;
    p->head = e;
    if (!p->tail)
        p->tail = e;
}

static void hash_unlink(hp_pool_t *p, hp_pool_entry_t *e)
{
    hp_pool_entry_t **pp = &p->buckets[bucket(e->key, e->variant)];
    while (*pp && *pp != e)
        pp = &(*pp)->chain;
    if (*pp)
        *pp = e->chain;
    e->chain = NULL;
}

static void entry_free(hp_pool_t *p, hp_pool_entry_t *e)
{
    if (e->published) {
        lru_unlink(p, e);
        hash_unlink(p, e);
        p->st.entries--;
        if (p->hook)
            p->hook(p->hook_ud, e->key, e->variant, 0);
    }
    hp_arena_free(&p->ar, (size_t)((uint8_t *)e->data - p->arena), e->bytes);
    p->st.bytes_used -= hp_arena_round(e->bytes);
    free(e);
}

void hp_pool_destroy(hp_pool_t *p)
{
    if (!p)
        return;
    hp_pool_entry_t *e = p->head;
    while (e) {
        hp_pool_entry_t *n = e->next;
        free(e);
        e = n;
    }
    hp_arena_fini(&p->ar);
    p->release(p->release_ud, p->arena, p->budget);
    pthread_mutex_destroy(&p->mu);
    free(p);
}

hp_pool_entry_t *hp_pool_get(hp_pool_t *p, const uint8_t key[16],
                             uint32_t variant)
{
    pthread_mutex_lock(&p->mu);
    hp_pool_entry_t *e = p->buckets[bucket(key, variant)];
    while (e && (e->variant != variant || memcmp(e->key, key, 16)))
        e = e->chain;
    if (e) {
        e->refs++;
        e->stamp = ++p->clock;
        lru_unlink(p, e);
        lru_front(p, e);
        p->st.hits++;
    } else {
        p->st.misses++;
    }
    pthread_mutex_unlock(&p->mu);
    return e;
}

int hp_pool_contains(hp_pool_t *p, const uint8_t key[16], uint32_t variant)
{
    pthread_mutex_lock(&p->mu);
    hp_pool_entry_t *e = p->buckets[bucket(key, variant)];
    while (e && (e->variant != variant || memcmp(e->key, key, 16)))
        e = e->chain;
    pthread_mutex_unlock(&p->mu);
    return e != NULL;
}

hp_pool_entry_t *hp_pool_alloc(hp_pool_t *p, const uint8_t key[16],
                               uint32_t variant, size_t bytes, hp_error_t *err)
{
    size_t len = hp_arena_round(bytes);
    hp_pool_entry_t *e = calloc(1, sizeof(*e));
    if (!e) {
        hp_error_set(err, HP_ENOMEM, "pool: out of memory");
        return NULL;
    }
    pthread_mutex_lock(&p->mu);
    size_t off = len <= p->budget ? hp_arena_alloc(&p->ar, len) : HP_ARENA_NONE;
    hp_pool_entry_t *victim = p->tail;
    while (off == HP_ARENA_NONE && victim && len <= p->budget) {
        hp_pool_entry_t *prev = victim->prev;
        if (victim->refs == 0) {
            entry_free(p, victim);
            p->st.evictions++;
            off = hp_arena_alloc(&p->ar, len);
        }
        victim = prev;
    }
    if (off == HP_ARENA_NONE) {
        p->st.failed++;
        pthread_mutex_unlock(&p->mu);
        free(e);
        hp_error_set(err, HP_ENOMEM,
                     "pool: no room for %zu bytes (budget %zu, %zu in use)",
                     bytes, p->budget, p->st.bytes_used);
        return NULL;
    }
    memcpy(e->key, key, 16);
    e->variant = variant;
    e->data = p->arena + off;
    e->bytes = bytes;
    e->refs = 1;
    p->st.bytes_used += len;
    pthread_mutex_unlock(&p->mu);
    return e;
}

void hp_pool_publish(hp_pool_t *p, hp_pool_entry_t *e)
{
    pthread_mutex_lock(&p->mu);
    unsigned b = bucket(e->key, e->variant);
    hp_pool_entry_t *old = p->buckets[b];
    while (old && (old->variant != e->variant || memcmp(old->key, e->key, 16)))
        old = old->chain;
    if (old) { /* a concurrent filler won: retire the older copy */
        lru_unlink(p, old);
        hash_unlink(p, old);
        old->published = 0;
        p->st.entries--;
        if (old->refs == 0)
            entry_free(p, old);
    }
    e->published = 1;
    if (p->hook && !old)
        p->hook(p->hook_ud, e->key, e->variant, 1);
    e->stamp = ++p->clock;
    e->chain = p->buckets[b];
    p->buckets[b] = e;
    lru_front(p, e);
    p->st.entries++;
    p->st.inserts++;
    pthread_mutex_unlock(&p->mu);
}

void hp_pool_release(hp_pool_t *p, hp_pool_entry_t *e)
{
    if (!e)
        return;
    pthread_mutex_lock(&p->mu);
    if (--e->refs == 0 && !e->published)
        entry_free(p, e);
    pthread_mutex_unlock(&p->mu);
}

void hp_pool_clear(hp_pool_t *p)
{
    pthread_mutex_lock(&p->mu);
    hp_pool_entry_t *e = p->head;
    while (e) {
        hp_pool_entry_t *n = e->next;
        if (e->refs == 0)
            entry_free(p, e);
        e = n;
    }
    pthread_mutex_unlock(&p->mu);
}

void hp_pool_set_hook(hp_pool_t *p, hp_pool_hook_fn fn, void *ud)
{
    pthread_mutex_lock(&p->mu);
    p->hook = fn;
    p->hook_ud = ud;
    pthread_mutex_unlock(&p->mu);
}

void hp_pool_stats(hp_pool_t *p, hp_pool_stats_t *out)
{
    pthread_mutex_lock(&p->mu);
    *out = p->st;
    pthread_mutex_unlock(&p->mu);
}
