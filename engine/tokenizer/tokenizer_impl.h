/*
 * tokenizer_impl.h - internals shared by the tokenizer_*.c files: the
 * loaded tables, the regex translation, UTF-8 helpers and Unicode data.
 * Not part of the engine's API; include engine/tokenizer/tokenizer.h instead.
 */
#ifndef HP_TOKENIZER_IMPL_H
#define HP_TOKENIZER_IMPL_H

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "engine/tokenizer/tokenizer.h"

/* flags per id */
#define HP_TOKF_PRESENT 1u
#define HP_TOKF_ADDED   2u
#define HP_TOKF_SPECIAL 4u

/* An added token; content (and, for normalized ones, its normalised form)
 * lives in tok->strs. */
typedef struct {
    uint32_t off, len;   /* content as written in the file */
    uint32_t noff, nlen; /* the content after normalisation */
    int32_t id;
    bool special, lstrip, rstrip, single_word, normalized;
} hp_tokenizer_added_t;

/* Added tokens of one matching pass (raw text or normalised text), indexed
 * by first byte: tokens first[b] .. first[b+1]-1 of order[] start with byte
 * b, longest first, so the first one that matches is the longest. */
typedef struct {
    uint32_t first[257];
    uint32_t *order; /* indices into tok->added */
    int only_byte;   /* the one first byte all of them share, or -1 */
} hp_tokenizer_added_index_t;

enum {
    HP_TOKENIZER_NFC,
    HP_TOKENIZER_NFD,
    HP_TOKENIZER_NFKC,
    HP_TOKENIZER_NFKD
};

enum { HP_TOKENIZER_STEP_SPLIT, HP_TOKENIZER_STEP_PREFIX_SPACE };
enum { HP_TOKENIZER_ISOLATED, HP_TOKENIZER_REMOVED };

/* One pre-tokenizer step, applied to every piece of the previous step. */
typedef struct {
    int kind;
    int behavior;   /* for SPLIT */
    pcre2_code *re; /* for SPLIT */
} hp_tokenizer_step_t;

typedef struct hp_tokenizer_cache hp_tokenizer_cache_t;

/* One slot of the merge table: one cache line holds four. */
typedef struct {
    uint64_t key; /* (left << 32 | right) + 1, 0 = empty */
    uint32_t rank;
    int32_t new_id;
} hp_tokenizer_merge_t;

struct hp_tokenizer {
    /* per id, n_ids = largest id + 1 */
    uint32_t n_ids;
    uint8_t *flags;
    uint32_t *str_off, *str_len; /* token string as in the file (strs) */
    uint32_t *dec_off, *dec_len; /* decoded bytes (decs) */
    char *strs;
    size_t strs_len, strs_cap;
    char *decs;
    size_t decs_len;

    /* BPE vocabulary: entries (string in strs, id) and a string -> entry
     * hash (open addressing; slot = entry index + 1, 0 = empty) */
    uint32_t *voc_off, *voc_len;
    int32_t *voc_id;
    size_t n_vocab;
    uint32_t *vocab_slot;
    uint32_t vocab_mask;

    /* merges: (left id, right id) -> rank, merged id; open addressing */
    hp_tokenizer_merge_t *merges;
    uint32_t merge_mask;
    size_t n_merges;

    /* GPT-2 byte alphabet */
    uint16_t byte_cp[256];   /* byte -> code point */
    int32_t byte_id[256];    /* id of the one-character token, or -1 */
    int32_t byte_fb[256][2]; /* byte_fallback ids <0xXX> of its UTF-8 */

    /* BPE options */
    int32_t unk_id; /* -1: no unknown token */
    bool fuse_unk, byte_fallback, ignore_merges;

    /* added tokens */
    hp_tokenizer_added_t *added;
    size_t n_added;
    hp_tokenizer_added_index_t raw_index, norm_index;

    /* normaliser sequence */
    int norm[8];
    int n_norm;

    /* pre-tokenizer steps */
    hp_tokenizer_step_t steps[8];
    int n_steps;

    hp_tokenizer_cache_t *cache;
};

/* ---- tokenizer.c ---- */

/* Vocabulary lookup of a byte-level string; -1 if absent. */
int32_t hp_tokenizer_vocab_find(const hp_tokenizer_t *tok, const char *s,
                                size_t len);

/* The bounded per-tokenizer cache of BPE results (tokenizer_encode.c);
 * create returns -1 when out of memory. */
int hp_tokenizer_cache_create(hp_tokenizer_t *tok);
void hp_tokenizer_cache_destroy(hp_tokenizer_t *tok);

/* Merge of the pair (a, b): 1 and *rank, *new_id set, or 0. */
static inline uint32_t hp_tokenizer_merge_hash(uint64_t k)
{
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdULL;
    k ^= k >> 33;
    return (uint32_t)k;
}

static inline int hp_tokenizer_merge_find(const hp_tokenizer_t *tok, int32_t a,
                                          int32_t b, uint32_t *rank,
                                          int32_t *new_id)
{
    uint64_t key = (((uint64_t)(uint32_t)a << 32) | (uint32_t)b) + 1;
    uint32_t i = hp_tokenizer_merge_hash(key) & tok->merge_mask;
    for (;;) {
        const hp_tokenizer_merge_t *m = &tok->merges[i];
        if (m->key == key) {
            *rank = m->rank;
            *new_id = m->new_id;
            return 1;
        }
        if (m->key == 0)
            return 0;
        i = (i + 1) & tok->merge_mask;
    }
}

/* ---- tokenizer_text.c: UTF-8, normalisation ---- */

/* Appends bytes to a text buffer; HP_ENOMEM on failure. */
int hp_tokenizer_text_append(hp_tokenizer_text_t *t, const void *p, size_t n,
                             hp_error_t *err);

/* Feeds bytes through the streaming UTF-8 repairer: complete valid
 * sequences are appended to out, invalid maximal subparts as U+FFFD, an
 * incomplete tail is kept in st. */
int hp_tokenizer_utf8_feed(hp_tokenizer_stream_t *st, const uint8_t *p,
                           size_t n, hp_tokenizer_text_t *out, hp_error_t *err);

/* Length of the valid UTF-8 prefix of p[0..n). */
size_t hp_tokenizer_utf8_valid_prefix(const uint8_t *p, size_t n);

/* Decodes one code point at p (n >= 1 bytes left); returns its length.
 * Meant for valid UTF-8; an invalid byte reads as U+FFFD of length 1. */
int hp_tokenizer_utf8_next(const uint8_t *p, size_t n, uint32_t *cp);

/* Appends the UTF-8 of cp to buf (>= 4 bytes); returns the length. */
int hp_tokenizer_utf8_put(uint32_t cp, char *buf);

/* Applies the tokenizer's normaliser sequence to s[0..n) (valid UTF-8)
 * into out (replaced, not appended). */
int hp_tokenizer_normalize(const hp_tokenizer_t *tok, const char *s, size_t n,
                           hp_tokenizer_text_t *out, hp_error_t *err);

/* Unicode predicates the added-token rules use (Rust regex \s and \w). */
bool hp_tokenizer_is_white_space(uint32_t cp);
bool hp_tokenizer_is_word_char(uint32_t cp);

/* ---- tokenizer_regex.c ---- */

/* Compiles an Oniguruma-flavoured pattern (as HF tokenizers runs it) with
 * PCRE2: the general-category classes \p{..}, \s, \d, \w, \h are rewritten
 * as explicit ranges of the Unicode data HF uses. literal: match the
 * string itself. Errors: HP_EMODEL (unsupported or invalid), HP_ENOMEM. */
int hp_tokenizer_regex_compile(const char *pat, size_t len, bool literal,
                               pcre2_code **out, hp_error_t *err);

/* ---- tokenizer_unicode.c (generated) ---- */

/* General categories: code points gc_start[i] .. gc_start[i+1]-1 have
 * category gc_cat[i], an index into hp_tokenizer_gc_names (2 letters). */
extern const uint32_t hp_tokenizer_gc_start[];
extern const uint8_t hp_tokenizer_gc_cat[];
extern const size_t hp_tokenizer_gc_n;
extern const char hp_tokenizer_gc_names[][3];
extern const size_t hp_tokenizer_gc_n_names;
extern const char hp_tokenizer_unicode_version[];

/* Code points HF's NFC does not know (and so leaves alone) but utf8proc
 * may reorder or compose; sorted. */
extern const uint32_t hp_tokenizer_nfc_opaque[];
extern const size_t hp_tokenizer_nfc_n_opaque;

/* General category index of cp. */
int hp_tokenizer_gc(uint32_t cp);

#endif
