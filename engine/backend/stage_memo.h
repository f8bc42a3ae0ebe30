/*
 * stage_memo.h - the host arrays a device backend copied to the device
 * lately (pointer lists, positions, ids), found again by content.
 *
 * A decode step hands every layer's op its own pointer list, the same
 * list step after step while the batch stays, and the attention layers
 * the same context lengths within a step. Each one copied is a transfer
 * the device waits on and the host issues. The backend looks an array up
 * here first and hands an op the copy made earlier while that copy is
 * good (backend_cuda.c's stage: made in the staging ring's current
 * segment, by its mark, hk_cuda_ring_mark), else copies it and notes it
 * here.
 *
 * The memo knows nothing of devices: an entry is the array's bytes, where
 * its copy is, and the ring's mark the copy was made at; a find names
 * the oldest mark still good. Open addressing over a power-of-two table,
 * a short window per hash; a note takes the window's empty or least
 * recently used entry. Not thread safe: the backend's lock covers it.
 */
#ifndef HP_STAGE_MEMO_H
#define HP_STAGE_MEMO_H

#include <stddef.h>
#include <stdint.h>

typedef struct {
    uint64_t hash;
    size_t bytes; /* 0: empty */
    void *host;   /* the array's bytes, cap of room */
    size_t cap;
    void *dev;     /* where its copy is */
    uint64_t mark; /* the ring's mark when it was made */
    uint64_t used; /* the memo's clock at its last find or note */
} hp_stage_memo_entry_t;

typedef struct {
    hp_stage_memo_entry_t *e; /* [n] */
    int n;                    /* a power of two */
    size_t max_bytes;         /* larger arrays are not kept */
    uint64_t clock;
    unsigned long hits; /* finds that found */
} hp_stage_memo_t;

/* n entries (rounded up to a power of two, at least the window), arrays
 * of up to max_bytes. 0, or -1 without memory. */
int hp_stage_memo_init(hp_stage_memo_t *m, int n, size_t max_bytes);
void hp_stage_memo_free(hp_stage_memo_t *m);
/* Forgets every entry (the ring behind them went). */
void hp_stage_memo_clear(hp_stage_memo_t *m);
/* The copy of src's bytes made at a mark >= oldest, or NULL; *hash gets
 * the bytes' hash for hp_stage_memo_note (0, not computed, for arrays past
 * max_bytes: never kept). */
void *hp_stage_memo_find(hp_stage_memo_t *m, const void *src, size_t bytes,
                         uint64_t oldest, uint64_t *hash);
/* Notes that dev holds a copy of src's bytes (hash from the find), made
 * at mark. Arrays past max_bytes, or a host copy without memory, are not
 * kept. */
void hp_stage_memo_note(hp_stage_memo_t *m, uint64_t hash, const void *src,
                        size_t bytes, void *dev, uint64_t mark);

#endif
