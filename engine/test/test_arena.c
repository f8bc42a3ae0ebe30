/* test_arena.c - the arena the pools allocate from (arena.h): first fit
 * in address order, the granule, coalescing with both neighbours, the
 * largest free run, fragmentation. Offsets only: no memory behind it. */
#include "engine/cache/arena.h"
#include "t/lib/tap.h"

#define G HP_ARENA_ALIGN

int main(void)
{
    hp_arena_t a;
    hp_error_t err = {0};
    ok(hp_arena_init(&a, 8 * G + 5, &err) == HP_OK && a.size == 8 * G &&
           hp_arena_largest(&a) == 8 * G,
       "an arena of 8 granules (a partial one dropped), all free");
    ok(hp_arena_round(0) == G && hp_arena_round(1) == G &&
           hp_arena_round(G) == G && hp_arena_round(G + 1) == 2 * G,
       "sizes round up to the granule, 0 as 1");

    /* first fit, in address order */
    size_t o[8];
    for (int i = 0; i < 8; i++)
        o[i] = hp_arena_alloc(&a, G);
    int seq = 1;
    for (int i = 0; i < 8; i++)
        seq &= o[i] == (size_t)i * G;
    ok(seq && a.used == 8 * G, "eight blocks in address order, all used");
    ok(hp_arena_alloc(&a, 1) == HP_ARENA_NONE && hp_arena_largest(&a) == 0,
       "full: the ninth fails");

    /* holes at 1, 3, 5: three granules free, no run of two */
    hp_arena_free(&a, o[1], G);
    hp_arena_free(&a, o[5], G);
    hp_arena_free(&a, o[3], G);
    ok(a.used == 5 * G && hp_arena_largest(&a) == G &&
           hp_arena_alloc(&a, 2 * G) == HP_ARENA_NONE,
       "fragmented: 3 granules free, the largest run 1, 2 do not fit");
    ok(hp_arena_alloc(&a, G) == o[1], "first fit takes the lowest hole");
    hp_arena_free(&a, o[1], G);

    /* freeing 2 joins holes 1 and 3 (both neighbours), 4 joins 5 */
    hp_arena_free(&a, o[2], G);
    ok(hp_arena_largest(&a) == 3 * G && hp_arena_alloc(&a, 3 * G) == o[1],
       "a block between two holes coalesces with both: a run of 3 at 1");
    hp_arena_free(&a, o[1], 3 * G);
    hp_arena_free(&a, o[4], G);
    hp_arena_free(&a, o[0], G);
    hp_arena_free(&a, o[6], G);
    hp_arena_free(&a, o[7], G);
    ok(a.used == 0 && hp_arena_largest(&a) == 8 * G,
       "all given back: one run of the whole arena");

    /* mixed sizes churned: the free space stays one run once empty */
    size_t big = hp_arena_alloc(&a, 3 * G + 1), s1 = hp_arena_alloc(&a, 10),
           s2 = hp_arena_alloc(&a, 2 * G);
    ok(big == 0 && s1 == 4 * G && s2 == 5 * G && a.used == 7 * G,
       "3G+1 takes 4 granules, then 1, then 2");
    hp_arena_free(&a, s1, 10);
    ok(hp_arena_alloc(&a, 2 * G) == HP_ARENA_NONE,
       "a hole of 1 and a tail of 1 hold no run of 2");
    hp_arena_free(&a, big, 3 * G + 1);
    hp_arena_free(&a, s2, 2 * G);
    ok(a.used == 0 && hp_arena_largest(&a) == 8 * G,
       "mixed sizes given back coalesce into one run");
    hp_arena_fini(&a);

    ok(hp_arena_init(&a, G - 1, &err) == HP_OK && a.size == 0 &&
           hp_arena_alloc(&a, 1) == HP_ARENA_NONE,
       "an arena under a granule holds nothing");
    hp_arena_fini(&a);

    void *m = hp_arena_map((size_t)1 << 30);
    ok(m != NULL, "1 GiB of host memory mapped for an arena (touched on use)");
    if (m)
        ((volatile char *)m)[((size_t)1 << 30) - 1] = 1;
    hp_arena_unmap(m, (size_t)1 << 30);
    return tap_done();
}
