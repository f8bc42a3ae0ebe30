/*
 * stage_memo.c - host arrays found again by content (stage_memo.h).
 */
#include "engine/backend/stage_memo.h"

#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

/* Entries a hash may sit in: the slot it names and the next ones. */
#define MEMO_WINDOW 8

int hp_stage_memo_init(hp_stage_memo_t *m, int n, size_t max_bytes)
{
    int size = MEMO_WINDOW;
    while (size < n)
        size *= 2;
    memset(m, 0, sizeof(*m));
    m->e = calloc((size_t)size, sizeof(*m->e));
    if (!m->e)
        return -1;
    m->n = size;
    m->max_bytes = max_bytes;
    return 0;
}

void hp_stage_memo_free(hp_stage_memo_t *m)
{
    for (int i = 0; m->e && i < m->n; i++)
        free(m->e[i].host);
    free(m->e);
    memset(m, 0, sizeof(*m));
}

void hp_stage_memo_clear(hp_stage_memo_t *m)
{
    for (int i = 0; m->e && i < m->n; i++)
        m->e[i].bytes = 0;
}

static hp_stage_memo_entry_t *slot(hp_stage_memo_t *m, uint64_t hash, int i)
{
    return &m->e[(hash + (uint64_t)i) & (uint64_t)(m->n - 1)];
}

void *hp_stage_memo_find(hp_stage_memo_t *m, const void *src, size_t bytes,
                         uint64_t oldest, uint64_t *hash)
{
    *hash = 0;
    if (!m->e || !bytes || bytes > m->max_bytes)
        return NULL;
    *hash = XXH3_64bits(src, bytes);
    for (int i = 0; i < MEMO_WINDOW; i++) {
        hp_stage_memo_entry_t *e = slot(m, *hash, i);
        if (e->bytes == bytes && e->hash == *hash && e->mark >= oldest &&
            !memcmp(e->host, src, bytes)) {
            e->used = ++m->clock;
            m->hits++;
            return e->dev;
        }
    }
    return NULL;
}

void hp_stage_memo_note(hp_stage_memo_t *m, uint64_t hash, const void *src,
                        size_t bytes, void *dev, uint64_t mark)
{
    if (!m->e || !bytes || bytes > m->max_bytes)
        return;
    /* the window's empty entry, else its least recently used (a stale
     * one is never found, so it ages out) */
    hp_stage_memo_entry_t *v = slot(m, hash, 0);
    for (int i = 1; i < MEMO_WINDOW && v->bytes; i++) {
        hp_stage_memo_entry_t *e = slot(m, hash, i);
        if (!e->bytes || e->used < v->used)
            v = e;
    }
    if (bytes > v->cap) {
        void *h = realloc(v->host, bytes);
        if (!h) {
            v->bytes = 0;
            return;
        }
        v->host = h;
        v->cap = bytes;
    }
    memcpy(v->host, src, bytes);
    *v = (hp_stage_memo_entry_t){.hash = hash,
                                 .bytes = bytes,
                                 .host = v->host,
                                 .cap = v->cap,
                                 .dev = dev,
                                 .mark = mark,
                                 .used = ++m->clock};
}
