/* test_pool.c - the pools: budget, LRU, reference counts, counters. */
#include <string.h>

#include "engine/cache/pool.h"
#include "t/lib/tap.h"

static void key(uint8_t k[16], int i)
{
    memset(k, 0, 16);
    memcpy(k, &i, sizeof(i));
}

static hp_pool_entry_t *put(hp_pool_t *p, int i, size_t bytes)
{
    uint8_t k[16];
    hp_error_t err = {0};
    key(k, i);
    hp_pool_entry_t *e = hp_pool_alloc(p, k, 0, bytes, &err);
    if (e) {
        memset(e->data, i & 0xff, bytes);
        hp_pool_publish(p, e);
    }
    return e;
}

static int has(hp_pool_t *p, int i)
{
    uint8_t k[16];
    key(k, i);
    hp_pool_entry_t *e = hp_pool_get(p, k, 0);
    if (e)
        hp_pool_release(p, e);
    return e != NULL;
}

static int hook_present[64];

static void hook(void *ud, const uint8_t k[16], uint32_t variant, int present)
{
    int i;
    (void)ud;
    (void)variant;
    memcpy(&i, k, sizeof(i));
    if (i >= 0 && i < 64)
        hook_present[i] = present;
}

int main(void)
{
    hp_error_t err = {0};
    hp_pool_stats_t st;
    hp_pool_t *p = hp_pool_create(4096, &err);
    ok(p != NULL, "pool of 4 KiB created");

    /* four 1 KiB entries fill it; a fifth evicts the least recently used */
    for (int i = 0; i < 4; i++)
        hp_pool_release(p, put(p, i, 1024));
    ok(has(p, 0), "entry 0 present (and now most recent)");
    hp_pool_release(p, put(p, 4, 1024));
    ok(has(p, 0) && !has(p, 1) && has(p, 2) && has(p, 3) && has(p, 4),
       "LRU evicted entry 1, the least recently used");

    /* an entry in use is never evicted, even when it is the oldest */
    uint8_t k[16];
    key(k, 2);
    hp_pool_entry_t *held = hp_pool_get(p, k, 0);
    for (int i = 10; i < 20; i++) {
        hp_pool_entry_t *e = put(p, i, 1024);
        if (e)
            hp_pool_release(p, e);
    }
    ok(held && has(p, 2), "held entry survived ten insertions");
    int intact = 1;
    for (int b = 0; b < 1024; b++)
        intact &= ((unsigned char *)held->data)[b] == 2;
    ok(intact, "and its bytes are intact");

    /* all space in use: allocation fails cleanly, nothing is freed */
    hp_pool_entry_t *hold[4] = {held};
    int n = 1;
    for (int i = 30; i < 33; i++) {
        hold[n] = put(p, i, 1024);
        if (hold[n])
            n++;
    }
    ok(n == 4, "the three other slots taken and held");
    ok(put(p, 99, 1024) == NULL, "a fifth allocation fails (all in use)");
    hp_pool_stats(p, &st);
    ok(st.failed >= 1 && st.bytes_used == 4096,
       "failure counted, bytes still %zu", st.bytes_used);
    ok(put(p, 98, 8192) == NULL, "an entry over the budget is refused");
    for (int i = 0; i < n; i++)
        hp_pool_release(p, hold[i]);

    /* freed space coalesces: one entry as large as the whole arena fits */
    hp_pool_entry_t *big = put(p, 50, 4096);
    ok(big != NULL, "after release, one 4 KiB entry fits (coalesced)");
    hp_pool_release(p, big);

    /* publish of an existing key replaces the older copy */
    hp_pool_clear(p);
    hp_pool_entry_t *a = put(p, 7, 64), *b = put(p, 7, 64);
    hp_pool_release(p, a);
    hp_pool_release(p, b);
    key(k, 7);
    hp_pool_entry_t *g = hp_pool_get(p, k, 0);
    ok(g == b, "a later publish of the same key wins");
    hp_pool_release(p, g);

    hp_pool_stats(p, &st);
    ok(st.hits > 0 && st.misses > 0 && st.evictions > 0 && st.entries == 1,
       "counters: %llu hits, %llu misses, %llu evictions, %d entries",
       (unsigned long long)st.hits, (unsigned long long)st.misses,
       (unsigned long long)st.evictions, st.entries);
    hp_pool_destroy(p);

    /* the hook follows visibility: publish, eviction */
    p = hp_pool_create(2048, &err);
    hp_pool_set_hook(p, hook, NULL);
    hp_pool_release(p, put(p, 1, 1024));
    hp_pool_release(p, put(p, 2, 1024));
    ok(hook_present[1] && hook_present[2], "hook saw both publishes");
    hp_pool_release(p, put(p, 3, 1024));
    ok(!hook_present[1] && hook_present[2] && hook_present[3],
       "hook saw the eviction of the least recently used");
    hp_pool_destroy(p);
    return tap_done();
}
