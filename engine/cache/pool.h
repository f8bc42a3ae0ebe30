/*
 * pool.h - a byte-budgeted cache of variable-size entries in one arena:
 * keyed lookup, LRU eviction of unreferenced entries, reference counts
 * (an entry in use is never evicted), hit/miss/eviction/byte counters.
 * The public pool (segment tuples) and the private pool (per-session
 * running states) are two instances (DESIGN §4). Thread-safe.
 */
#ifndef HP_POOL_H
#define HP_POOL_H

#include <stddef.h>
#include <stdint.h>

#include "engine/cache/arena.h"
#include "engine/contract/hp_error.h"

typedef struct hp_pool hp_pool_t;

#define HP_POOL_ALIGN HP_ARENA_ALIGN /* entries' alignment, size granule */

typedef struct hp_pool_entry {
    uint8_t key[16];
    uint32_t variant; /* distinguishes entries of one key (mode, seam) */
    void *data;       /* in the arena, 64-byte aligned */
    /* the owner's header, in host memory: an arena may be device memory
     * the host does not read (segcache.h keeps its hp_segc_hdr_t here) */
    _Alignas(8) uint8_t meta[64];
    size_t bytes;
    int refs;
    int published; /* visible to lookups */
    uint64_t stamp;
    struct hp_pool_entry *prev, *next; /* LRU list, most recent first */
    struct hp_pool_entry *chain;       /* hash bucket */
} hp_pool_entry_t;

typedef struct {
    uint64_t hits, misses, evictions, inserts, failed;
    size_t bytes_used; /* arena bytes held by entries */
    size_t budget;
    int entries;
} hp_pool_stats_t;

/* Creates a pool with an arena of `budget` bytes (reserved, touched on
 * use). Returns NULL with err set (HP_ENOMEM) on failure. */
hp_pool_t *hp_pool_create(size_t budget, hp_error_t *err);

/* The same over an arena the caller made (device memory: the pool never
 * touches its bytes, only hands out offsets into it); destroy gives it
 * back through release(ud, arena, budget); on failure it stays the
 * caller's. */
typedef void (*hp_pool_release_fn)(void *ud, void *arena, size_t bytes);
hp_pool_t *hp_pool_create_in(void *arena, size_t budget,
                             hp_pool_release_fn release, void *ud,
                             hp_error_t *err);
void hp_pool_destroy(hp_pool_t *p);

/* Published entry for (key, variant) with one more reference, or NULL
 * (a miss). Counts a hit or a miss. */
hp_pool_entry_t *hp_pool_get(hp_pool_t *p, const uint8_t key[16],
                             uint32_t variant);

/* Whether (key, variant) is published; counts nothing, moves nothing. */
int hp_pool_contains(hp_pool_t *p, const uint8_t key[16], uint32_t variant);

/* A new, unpublished entry of `bytes` bytes held by the caller (refs 1),
 * evicting least recently used unreferenced entries to make room. NULL
 * with HP_ENOMEM when even after eviction it does not fit (everything else
 * in use, or bytes > budget). */
hp_pool_entry_t *hp_pool_alloc(hp_pool_t *p, const uint8_t key[16],
                               uint32_t variant, size_t bytes, hp_error_t *err);

/* Makes a filled entry visible to lookups. If an entry with the same key
 * was published meanwhile, the older one is dropped once unreferenced. */
void hp_pool_publish(hp_pool_t *p, hp_pool_entry_t *e);

/* Drops one reference; an unpublished entry with no references is freed. */
void hp_pool_release(hp_pool_t *p, hp_pool_entry_t *e);

/* Removes every unreferenced entry (e.g. on a model reload). */
void hp_pool_clear(hp_pool_t *p);

void hp_pool_stats(hp_pool_t *p, hp_pool_stats_t *out);

/* Called with the pool locked when a key becomes visible (publish) or
 * stops being visible (eviction, replacement by a newer copy, clear):
 * the segment index follows the public pool through these. Hooks must
 * not call back into the pool. */
typedef void (*hp_pool_hook_fn)(void *ud, const uint8_t key[16],
                                uint32_t variant, int present);
void hp_pool_set_hook(hp_pool_t *p, hp_pool_hook_fn fn, void *ud);

#endif
