/* test_stage_memo.c - host arrays found again by content (stage_memo.h):
 * a noted array is found while its mark is good, a changed byte or an
 * older mark misses, arrays past the bound are not kept, and under many
 * more arrays than entries every hit is an array's own copy. No device:
 * the "copies" are addresses the test makes up. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "engine/backend/stage_memo.h"
#include "t/lib/tap.h"

/* Array k's bytes (n ints) and the address its copy is noted at. */
static void fill(int *a, int n, int k)
{
    for (int i = 0; i < n; i++)
        a[i] = k * 1000003 + i * 7;
}

static void *dev_of(int k)
{
    return (void *)(uintptr_t)(0x10000 + 256 * (uintptr_t)k);
}

int main(void)
{
    hp_stage_memo_t m;
    uint64_t h;
    int a[64], b[64];
    ok(hp_stage_memo_init(&m, 100, 64 * sizeof(int)) == 0 && m.n == 128,
       "100 entries round up to 128");

    fill(a, 64, 1);
    ok(!hp_stage_memo_find(&m, a, sizeof(a), 0, &h), "empty: a miss");
    hp_stage_memo_note(&m, h, a, sizeof(a), dev_of(1), 5);
    memcpy(b, a, sizeof(a));
    ok(hp_stage_memo_find(&m, b, sizeof(b), 5, &h) == dev_of(1),
       "the same bytes from another array: found, at its mark");
    ok(!hp_stage_memo_find(&m, b, sizeof(b), 6, &h),
       "a copy made before the oldest good mark: a miss");
    ok(!hp_stage_memo_find(&m, b, 32 * sizeof(int), 0, &h),
       "a prefix of the bytes: a miss");
    b[63] ^= 1;
    ok(!hp_stage_memo_find(&m, b, sizeof(b), 0, &h), "one bit changed: a miss");
    hp_stage_memo_note(&m, h, b, sizeof(b), dev_of(2), 7);
    ok(hp_stage_memo_find(&m, b, sizeof(b), 0, &h) == dev_of(2) &&
           hp_stage_memo_find(&m, a, sizeof(a), 0, &h) == dev_of(1),
       "both kept, each its own copy");

    int big[65];
    fill(big, 65, 3);
    hp_stage_memo_note(&m, 0, big, sizeof(big), dev_of(3), 7);
    ok(!hp_stage_memo_find(&m, big, sizeof(big), 0, &h),
       "an array past the bound is not kept");

    hp_stage_memo_clear(&m);
    ok(!hp_stage_memo_find(&m, a, sizeof(a), 0, &h), "cleared: a miss");

    /* 1000 arrays of 1..64 ints through 128 entries, each noted on a
     * miss, looked up twice more: a hit must be its own copy, and the
     * one just noted is always found */
    int right = 1, fresh = 1;
    unsigned long hits0 = m.hits;
    for (int r = 0; r < 3; r++)
        for (int k = 0; k < 1000; k++) {
            int n = 1 + k % 64;
            fill(a, n, k);
            void *d = hp_stage_memo_find(&m, a, n * sizeof(int), 0, &h);
            if (d)
                right &= d == dev_of(k);
            else {
                hp_stage_memo_note(&m, h, a, n * sizeof(int), dev_of(k), r);
                fresh &= hp_stage_memo_find(&m, a, n * sizeof(int), 0, &h) ==
                         dev_of(k);
            }
        }
    ok(right && fresh, "1000 arrays through 128 entries: every hit its own "
                       "copy, each noted one found at once");
    /* the last 100 looked up again: LRU keeps most of a recent window */
    int found = 0;
    for (int k = 900; k < 1000; k++) {
        int n = 1 + k % 64;
        fill(a, n, k);
        void *d = hp_stage_memo_find(&m, a, n * sizeof(int), 0, &h);
        found += d != NULL;
        right &= !d || d == dev_of(k);
    }
    ok(right && found >= 60 && m.hits > hits0,
       "the last 100 looked up again: %d found (>= 60), each its own", found);
    hp_stage_memo_free(&m);
    return tap_done();
}
