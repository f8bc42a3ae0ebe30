/*
 * tokenizer_encode.c - text to ids: UTF-8 repair, added-token split,
 * normalisation, pre-tokenizer regex, byte-level BPE (lowest rank first,
 * leftmost on ties, as HF's BPE::merge_word), with a bounded cache.
 */
#include "engine/tokenizer/tokenizer_impl.h"

#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

/* ---- cache of BPE results per pre-token ----
 * Direct-mapped, fixed size (about 1.5 MB): a pre-token of up to
 * CACHE_KEY bytes with up to CACHE_IDS ids; a collision replaces. */
#define CACHE_SLOTS 16384
#define CACHE_KEY   30
#define CACHE_IDS   14

typedef struct {
    uint64_t hash;
    uint8_t klen, nids; /* klen 0: empty */
    char key[CACHE_KEY];
    int32_t ids[CACHE_IDS];
} cache_slot_t;

struct hp_tokenizer_cache {
    pthread_mutex_t mu;
    cache_slot_t slot[CACHE_SLOTS];
};

int hp_tokenizer_cache_create(hp_tokenizer_t *tok)
{
    tok->cache = calloc(1, sizeof(*tok->cache));
    if (!tok->cache)
        return -1;
    if (pthread_mutex_init(&tok->cache->mu, NULL)) {
        free(tok->cache);
        tok->cache = NULL;
        return -1;
    }
    return 0;
}

void hp_tokenizer_cache_destroy(hp_tokenizer_t *tok)
{
    if (!tok->cache)
        return;
    pthread_mutex_destroy(&tok->cache->mu);
    free(tok->cache);
    tok->cache = NULL;
}

/* ---- one encode call ---- */

typedef struct {
    uint32_t rank, pos;
    int32_t left, right, new_id; /* the pair when queued, and its merge */
} merge_t;

typedef struct {
    const hp_tokenizer_t *tok;
    hp_tokenizer_ids_t *ids;
    hp_error_t *err;
    pcre2_match_data *md;
    int32_t *sym, *prev, *next; /* BPE symbols: id (-1 merged away), links */
    size_t sym_cap;
    merge_t *heap;
    size_t heap_n, heap_cap;
    hp_tokenizer_text_t clean, norm, tmp;
} enc_t;

static int nomem(enc_t *e)
{
    return hp_error_set(e->err, HP_ENOMEM, "tokenizer: out of memory");
}

static int push_ids(enc_t *e, const int32_t *v, size_t n)
{
    hp_tokenizer_ids_t *a = e->ids;
    if (a->n + n > a->cap) {
        size_t cap = a->cap ? a->cap : 64;
        while (cap < a->n + n)
            cap *= 2;
        int32_t *p = realloc(a->ids, cap * sizeof(int32_t));
        if (!p)
            return nomem(e);
        a->ids = p;
        a->cap = cap;
    }
    memcpy(a->ids + a->n, v, n * sizeof(int32_t));
    a->n += n;
    return HP_OK;
}

static bool merge_less(const merge_t *a, const merge_t *b)
{
    return a->rank < b->rank || (a->rank == b->rank && a->pos < b->pos);
}

static int heap_push(enc_t *e, const merge_t *m)
{
    if (e->heap_n == e->heap_cap) {
        size_t cap = e->heap_cap ? 2 * e->heap_cap : 64;
        merge_t *h = realloc(e->heap, cap * sizeof(merge_t));
        if (!h)
            return nomem(e);
        e->heap = h;
        e->heap_cap = cap;
    }
    size_t i = e->heap_n++;
    while (i > 0) {
        size_t up = (i - 1) / 2;
        if (!merge_less(m, &e->heap[up]))
            break;
        e->heap[i] = e->heap[up];
        i = up;
    }
    e->heap[i] = *m;
    return HP_OK;
}

static merge_t heap_pop(enc_t *e)
{
    merge_t top = e->heap[0], last = e->heap[--e->heap_n];
    size_t i = 0, n = e->heap_n;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n)
            break;
        if (c + 1 < n && merge_less(&e->heap[c + 1], &e->heap[c]))
            c++;
        if (!merge_less(&e->heap[c], &last))
            break;
        e->heap[i] = e->heap[c];
        i = c;
    }
    if (n)
        e->heap[i] = last;
    return top;
}

static int push_pair(enc_t *e, int32_t pos)
{
    int32_t right = e->next[pos];
    merge_t m = {.pos = (uint32_t)pos};
    if (right < 0)
        return HP_OK;
    m.left = e->sym[pos];
    m.right = e->sym[right];
    if (!hp_tokenizer_merge_find(e->tok, m.left, m.right, &m.rank, &m.new_id))
        return HP_OK;
    return heap_push(e, &m);
}

static bool cache_get(enc_t *e, uint64_t h, const char *s, size_t n)
{
    hp_tokenizer_cache_t *c = e->tok->cache;
    const cache_slot_t *sl = &c->slot[h & (CACHE_SLOTS - 1)];
    int32_t ids[CACHE_IDS];
    size_t nids = 0;
    bool hit = false;
    pthread_mutex_lock(&c->mu);
    if (sl->klen == n && sl->hash == h && !memcmp(sl->key, s, n)) {
        nids = sl->nids;
        memcpy(ids, sl->ids, nids * sizeof(int32_t));
        hit = true;
    }
    pthread_mutex_unlock(&c->mu);
    if (hit && push_ids(e, ids, nids))
        return false; /* retried uncached; the error shows up there */
    return hit;
}

static void cache_put(enc_t *e, uint64_t h, const char *s, size_t n,
                      const int32_t *ids, size_t nids)
{
    hp_tokenizer_cache_t *c = e->tok->cache;
    cache_slot_t *sl = &c->slot[h & (CACHE_SLOTS - 1)];
    pthread_mutex_lock(&c->mu);
    sl->hash = h;
    sl->klen = (uint8_t)n;
    sl->nids = (uint8_t)nids;
    memcpy(sl->key, s, n);
    memcpy(sl->ids, ids, nids * sizeof(int32_t));
    pthread_mutex_unlock(&c->mu);
}

/* BPE of one pre-token, its raw bytes s[0..n) seen through the byte
 * alphabet; the ids are appended. */
static int bpe(enc_t *e, const char *s, size_t n)
{
    const hp_tokenizer_t *tok = e->tok;
    uint64_t h = 0;
    bool cacheable = n <= CACHE_KEY;
    if (cacheable) {
        h = XXH3_64bits(s, n);
        if (cache_get(e, h, s, n))
            return HP_OK;
    }
    size_t start = e->ids->n;
    if (tok->ignore_merges) { /* a whole-word vocabulary hit wins */
        e->tmp.len = 0;
        for (size_t i = 0; i < n; i++) {
            char u[4];
            int k = hp_tokenizer_utf8_put(tok->byte_cp[(uint8_t)s[i]], u);
            if (hp_tokenizer_text_append(&e->tmp, u, (size_t)k, e->err))
                return e->err->code;
        }
        int32_t id = hp_tokenizer_vocab_find(tok, e->tmp.data, e->tmp.len);
        if (id >= 0) {
            if (cacheable)
                cache_put(e, h, s, n, &id, 1);
            return push_ids(e, &id, 1);
        }
    }
    if (2 * n > e->sym_cap) {
        size_t cap = 2 * n + 64;
        int32_t *a = realloc(e->sym, cap * sizeof(int32_t));
        if (a)
            e->sym = a;
        int32_t *b = realloc(e->prev, cap * sizeof(int32_t));
        if (b)
            e->prev = b;
        int32_t *c = realloc(e->next, cap * sizeof(int32_t));
        if (c)
            e->next = c;
        if (!a || !b || !c)
            return nomem(e);
        e->sym_cap = cap;
    }
    /* initial symbols: one per byte; unknown ones as HF handles them
     * (byte fallback, else an unknown token, fused or not, else dropped) */
    size_t m = 0;
    bool unk = false;
    for (size_t i = 0; i < n; i++) {
        uint8_t b = (uint8_t)s[i];
        int32_t id = tok->byte_id[b];
        if (id >= 0) {
            if (unk)
                e->sym[m++] = tok->unk_id;
            unk = false;
            e->sym[m++] = id;
        } else if (tok->byte_fallback && tok->byte_fb[b][0] >= 0) {
            e->sym[m++] = tok->byte_fb[b][0];
            if (tok->byte_fb[b][1] >= 0)
                e->sym[m++] = tok->byte_fb[b][1];
        } else if (tok->unk_id >= 0) {
            if (unk && !tok->fuse_unk)
                e->sym[m++] = tok->unk_id;
            unk = true;
        }
    }
    if (unk)
        e->sym[m++] = tok->unk_id;
    if (m == 0)
        return HP_OK;
    for (size_t i = 0; i < m; i++) {
        e->prev[i] = (int32_t)i - 1;
        e->next[i] = i + 1 < m ? (int32_t)i + 1 : -1;
    }
    e->heap_n = 0;
    for (size_t i = 0; i + 1 < m; i++)
        if (push_pair(e, (int32_t)i))
            return e->err->code;
    while (e->heap_n) {
        merge_t top = heap_pop(e);
        int32_t pos = (int32_t)top.pos, right = e->next[pos];
        /* HF skips an entry whose pair no longer merges into new_id. As
         * merges only ever remove boundaries, and a token's id names its
         * string, that is exactly when either symbol has changed. */
        if (e->sym[pos] != top.left || right < 0 || e->sym[right] != top.right)
            continue;
        e->sym[pos] = top.new_id;
        e->sym[right] = -1;
        e->next[pos] = e->next[right];
        if (e->next[right] >= 0)
            e->prev[e->next[right]] = pos;
        if (e->prev[pos] >= 0 && push_pair(e, e->prev[pos]))
            return e->err->code;
        if (push_pair(e, pos))
            return e->err->code;
    }
    for (int32_t i = 0; i >= 0; i = e->next[i])
        if (push_ids(e, &e->sym[i], 1))
            return e->err->code;
    size_t nids = e->ids->n - start;
    if (cacheable && nids <= CACHE_IDS)
        cache_put(e, h, s, n, e->ids->ids + start, nids);
    return HP_OK;
}

/* Runs pre-tokenizer steps k.. on one piece, then BPE on what remains. */
static int run_steps(enc_t *e, int k, const char *s, size_t n)
{
    if (n == 0)
        return HP_OK;
    const hp_tokenizer_t *tok = e->tok;
    if (k == tok->n_steps)
        return bpe(e, s, n);
    const hp_tokenizer_step_t *st = &tok->steps[k];
    if (st->kind == HP_TOKENIZER_STEP_PREFIX_SPACE) {
        if (s[0] == ' ')
            return run_steps(e, k + 1, s, n);
        char *p = malloc(n + 1);
        if (!p)
            return nomem(e);
        p[0] = ' ';
        memcpy(p + 1, s, n);
        int rc = run_steps(e, k + 1, p, n + 1);
        free(p);
        return rc;
    }
    /* Split: matches and the gaps between them become pieces. Empty
     * matches split too, but one right after a match is skipped, as in
     * the rust-onig iterator HF uses. */
    size_t pos = 0, prev = 0;
    bool have_end = false;
    size_t last_end = 0;
    while (pos <= n) {
        int rc = pcre2_match(st->re, (PCRE2_SPTR)s, n, pos, PCRE2_NO_UTF_CHECK,
                             e->md, NULL);
        if (rc == PCRE2_ERROR_JIT_STACKLIMIT) /* the interpreter uses heap */
            rc = pcre2_match(st->re, (PCRE2_SPTR)s, n, pos,
                             PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT, e->md, NULL);
        if (rc == PCRE2_ERROR_NOMATCH)
            break;
        if (rc < 0) {
            PCRE2_UCHAR msg[120];
            pcre2_get_error_message(rc, msg, sizeof(msg));
            return hp_error_set(e->err, HP_EINTERNAL,
                                "tokenizer: regex match failed: %s",
                                (const char *)msg);
        }
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(e->md);
        size_t ms = ov[0], me = ov[1];
        if (ms == me && have_end && last_end == me) {
            uint32_t cp;
            pos += pos < n ? (size_t)hp_tokenizer_utf8_next(
                                 (const uint8_t *)s + pos, n - pos, &cp)
                           : 1;
            continue;
        }
        if (ms > prev && (rc = run_steps(e, k + 1, s + prev, ms - prev)))
            return rc;
        if (st->behavior == HP_TOKENIZER_ISOLATED &&
            (rc = run_steps(e, k + 1, s + ms, me - ms)))
            return rc;
        prev = pos = me;
        have_end = true;
        last_end = me;
    }
    return prev < n ? run_steps(e, k + 1, s + prev, n - prev) : HP_OK;
}

/* Leftmost-longest added token in s[from..n): its index and extent. */
static bool find_added(const hp_tokenizer_t *tok,
                       const hp_tokenizer_added_index_t *ix, const char *s,
                       size_t n, size_t from, size_t *ms, size_t *me,
                       const hp_tokenizer_added_t **hit)
{
    if (ix->first[256] == 0)
        return false;
    for (size_t i = from; i < n; i++) {
        if (ix->only_byte >= 0) {
            const char *q = memchr(s + i, ix->only_byte, n - i);
            if (!q)
                return false;
            i = (size_t)(q - s);
        }
        uint8_t b = (uint8_t)s[i];
        for (uint32_t k = ix->first[b]; k < ix->first[b + 1]; k++) {
            const hp_tokenizer_added_t *a = &tok->added[ix->order[k]];
            if (a->nlen <= n - i &&
                !memcmp(tok->strs + a->noff, s + i, a->nlen)) {
                *ms = i;
                *me = i + a->nlen;
                *hit = a;
                return true;
            }
        }
    }
    return false;
}

/* Code point before position i of valid UTF-8 s (i > 0); its length. */
static int prev_cp(const char *s, size_t i, uint32_t *cp)
{
    size_t j = i - 1;
    while (j > 0 && i - j < 4 && ((uint8_t)s[j] & 0xc0) == 0x80)
        j--;
    hp_tokenizer_utf8_next((const uint8_t *)s + j, i - j, cp);
    return (int)(i - j);
}

static int segment(enc_t *e, bool raw, const char *s, size_t n);

/* Splits s on the added tokens of one pass, as HF's
 * AddedVocabulary::find_matches (including its single_word, lstrip and
 * rstrip rules); the pieces in between go on to segment(). */
static int split_added(enc_t *e, bool raw, const char *s, size_t n)
{
    const hp_tokenizer_t *tok = e->tok;
    const hp_tokenizer_added_index_t *ix =
        raw ? &tok->raw_index : &tok->norm_index;
    size_t start_offset = 0, search = 0, ms, me;
    const hp_tokenizer_added_t *a;
    int rc;
    while (find_added(tok, ix, s, n, search, &ms, &me, &a)) {
        search = me;
        uint32_t cp;
        if (a->single_word) {
            if (ms > 0 && (prev_cp(s, ms, &cp), hp_tokenizer_is_word_char(cp)))
                continue;
            if (me < n &&
                (hp_tokenizer_utf8_next((const uint8_t *)s + me, n - me, &cp),
                 hp_tokenizer_is_word_char(cp)))
                continue;
        }
        size_t start = ms, stop = me;
        if (a->lstrip) {
            while (start > 0) {
                int k = prev_cp(s, start, &cp);
                if (!hp_tokenizer_is_white_space(cp))
                    break;
                start -= (size_t)k;
            }
            if (start < start_offset)
                start = start_offset;
        }
        if (a->rstrip) {
            while (stop < n) {
                int k = hp_tokenizer_utf8_next((const uint8_t *)s + stop,
                                               n - stop, &cp);
                if (!hp_tokenizer_is_white_space(cp))
                    break;
                stop += (size_t)k;
            }
        }
        if (start_offset < start &&
            (rc = segment(e, raw, s + start_offset, start - start_offset)))
            return rc;
        if ((rc = push_ids(e, &a->id, 1)))
            return rc;
        start_offset = stop;
    }
    return start_offset < n
               ? segment(e, raw, s + start_offset, n - start_offset)
               : HP_OK;
}

/* A piece with no added token of the current pass: after the raw pass it
 * is normalised and searched for the normalised added tokens; after that
 * pass it goes through the pre-tokenizer. */
static int segment(enc_t *e, bool raw, const char *s, size_t n)
{
    if (!raw)
        return run_steps(e, 0, s, n);
    int rc = hp_tokenizer_normalize(e->tok, s, n, &e->norm, e->err);
    if (rc)
        return rc;
    /* the normalised pass never normalises again, so e->norm stays put */
    return split_added(e, false, e->norm.data, e->norm.len);
}

int hp_tokenizer_encode(const hp_tokenizer_t *tok, const char *text, size_t len,
                        hp_tokenizer_ids_t *ids, hp_error_t *err)
{
    enc_t e = {.tok = tok, .ids = ids, .err = err};
    int rc = HP_OK;
    if (len == 0)
        return HP_OK;
    const uint8_t *u = (const uint8_t *)text;
    if (hp_tokenizer_utf8_valid_prefix(u, len) != len) {
        /* Python's decode(errors="replace"): one U+FFFD per maximal
         * subpart of an ill-formed sequence */
        hp_tokenizer_stream_t st;
        hp_tokenizer_stream_init(&st);
        rc = hp_tokenizer_utf8_feed(&st, u, len, &e.clean, err);
        if (!rc)
            rc = hp_tokenizer_stream_flush(&st, &e.clean, err);
        text = e.clean.data;
        len = e.clean.len;
    }
    if (!rc && tok->n_steps > 0) {
        e.md = pcre2_match_data_create(1, NULL);
        if (!e.md)
            rc = nomem(&e);
    }
    if (!rc)
        rc = split_added(&e, true, text, len);
    pcre2_match_data_free(e.md);
    free(e.sym);
    free(e.prev);
    free(e.next);
    free(e.heap);
    hp_tokenizer_text_free(&e.clean);
    hp_tokenizer_text_free(&e.norm);
    hp_tokenizer_text_free(&e.tmp);
    return rc;
}
