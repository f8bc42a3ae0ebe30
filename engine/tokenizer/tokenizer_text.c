/*
 * tokenizer_text.c - text helpers of the tokenizer: growable buffers, UTF-8
 * validation and repair (U+FFFD per maximal subpart, like Python and Rust),
 * normalisation through utf8proc, and the Unicode predicates it needs.
 */
#include "engine/tokenizer/tokenizer_impl.h"

#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

static const uint8_t fffd[3] = {0xef, 0xbf, 0xbd};

int hp_tokenizer_text_append(hp_tokenizer_text_t *t, const void *p, size_t n,
                             hp_error_t *err)
{
    if (t->len + n + 1 > t->cap) {
        size_t cap = t->cap ? t->cap : 256;
        while (cap < t->len + n + 1)
            cap *= 2;
        char *d = realloc(t->data, cap);
        if (!d)
            return hp_error_set(err, HP_ENOMEM, "tokenizer: out of memory");
        t->data = d;
        t->cap = cap;
    }
    if (n)
        memcpy(t->data + t->len, p, n);
    t->len += n;
    t->data[t->len] = 0;
    return HP_OK;
}

/* Length of the sequence a lead byte starts, 0 if it cannot start one. */
static int seq_len(uint8_t b)
{
    if (b < 0x80)
        return 1;
    if (b >= 0xc2 && b <= 0xdf)
        return 2;
    if (b >= 0xe0 && b <= 0xef)
        return 3;
    if (b >= 0xf0 && b <= 0xf4)
        return 4;
    return 0;
}

/* Allowed range of the byte after lead (the later ones are 80..BF); this
 * excludes overlongs, surrogates and code points past U+10FFFF. */
static void second_range(uint8_t lead, uint8_t *lo, uint8_t *hi)
{
    *lo = 0x80;
    *hi = 0xbf;
    if (lead == 0xe0)
        *lo = 0xa0;
    else if (lead == 0xed)
        *hi = 0x9f;
    else if (lead == 0xf0)
        *lo = 0x90;
    else if (lead == 0xf4)
        *hi = 0x8f;
}

size_t hp_tokenizer_utf8_valid_prefix(const uint8_t *p, size_t n)
{
    size_t i = 0;
    while (i < n) {
        if (p[i] < 0x80) {
            i++;
            continue;
        }
        int k = seq_len(p[i]);
        if (k == 0 || i + (size_t)k > n)
            return i;
        uint8_t lo, hi;
        second_range(p[i], &lo, &hi);
        if (p[i + 1] < lo || p[i + 1] > hi)
            return i;
        for (int j = 2; j < k; j++)
            if ((p[i + j] & 0xc0) != 0x80)
                return i;
        i += (size_t)k;
    }
    return n;
}

int hp_tokenizer_utf8_feed(hp_tokenizer_stream_t *st, const uint8_t *p,
                           size_t n, hp_tokenizer_text_t *out, hp_error_t *err)
{
    size_t i = 0;
    while (i < n) {
        uint8_t b = p[i];
        if (st->n == 0) {
            size_t k = hp_tokenizer_utf8_valid_prefix(p + i, n - i);
            if (k) {
                if (hp_tokenizer_text_append(out, p + i, k, err))
                    return err->code;
                i += k;
                continue;
            }
            int need = seq_len(b);
            i++;
            if (need == 0) {
                if (hp_tokenizer_text_append(out, fffd, 3, err))
                    return err->code;
                continue;
            }
            st->pend[0] = b;
            st->n = 1;
            st->need = (uint8_t)need;
            continue;
        }
        uint8_t lo = 0x80, hi = 0xbf;
        if (st->n == 1)
            second_range(st->pend[0], &lo, &hi);
        if (b < lo || b > hi) {
            /* the held bytes are a maximal subpart: one U+FFFD, then b
             * starts afresh */
            st->n = 0;
            if (hp_tokenizer_text_append(out, fffd, 3, err))
                return err->code;
            continue;
        }
        st->pend[st->n++] = b;
        i++;
        if (st->n == st->need) {
            st->n = 0;
            if (hp_tokenizer_text_append(out, st->pend, st->need, err))
                return err->code;
        }
    }
    return HP_OK;
}

void hp_tokenizer_stream_init(hp_tokenizer_stream_t *st)
{
    memset(st, 0, sizeof(*st));
}

int hp_tokenizer_stream_flush(hp_tokenizer_stream_t *st,
                              hp_tokenizer_text_t *out, hp_error_t *err)
{
    int had = st->n != 0;
    hp_tokenizer_stream_init(st);
    if (had)
        return hp_tokenizer_text_append(out, fffd, 3, err);
    /* keep out NUL-terminated even when nothing was ever appended */
    return hp_tokenizer_text_append(out, "", 0, err);
}

int hp_tokenizer_utf8_next(const uint8_t *p, size_t n, uint32_t *cp)
{
    uint8_t b = p[0];
    int k = seq_len(b);
    if (k == 1) {
        *cp = b;
        return 1;
    }
    if (k == 0 || (size_t)k > n ||
        hp_tokenizer_utf8_valid_prefix(p, (size_t)k) != (size_t)k) {
        *cp = 0xfffd;
        return 1;
    }
    uint32_t c = b & (0x7f >> k);
    for (int j = 1; j < k; j++)
        c = (c << 6) | (p[j] & 0x3f);
    *cp = c;
    return k;
}

int hp_tokenizer_utf8_put(uint32_t cp, char *buf)
{
    uint8_t *u = (uint8_t *)buf;
    if (cp < 0x80) {
        u[0] = (uint8_t)cp;
        return 1;
    }
    if (cp < 0x800) {
        u[0] = (uint8_t)(0xc0 | (cp >> 6));
        u[1] = (uint8_t)(0x80 | (cp & 0x3f));
        return 2;
    }
    if (cp < 0x10000) {
        u[0] = (uint8_t)(0xe0 | (cp >> 12));
        u[1] = (uint8_t)(0x80 | ((cp >> 6) & 0x3f));
        u[2] = (uint8_t)(0x80 | (cp & 0x3f));
        return 3;
    }
    u[0] = (uint8_t)(0xf0 | (cp >> 18));
    u[1] = (uint8_t)(0x80 | ((cp >> 12) & 0x3f));
    u[2] = (uint8_t)(0x80 | ((cp >> 6) & 0x3f));
    u[3] = (uint8_t)(0x80 | (cp & 0x3f));
    return 4;
}

/* ---- normalisation ---- */

static bool nfc_opaque(uint32_t cp)
{
    size_t lo = 0, hi = hp_tokenizer_nfc_n_opaque;
    if (cp < hp_tokenizer_nfc_opaque[0])
        return false;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (hp_tokenizer_nfc_opaque[mid] < cp)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo < hp_tokenizer_nfc_n_opaque && hp_tokenizer_nfc_opaque[lo] == cp;
}

static int map_run(const char *s, size_t n, int kind, hp_tokenizer_text_t *out,
                   hp_error_t *err)
{
    if (n == 0)
        return HP_OK;
    int opts = UTF8PROC_STABLE;
    if (kind == HP_TOKENIZER_NFC || kind == HP_TOKENIZER_NFKC)
        opts |= UTF8PROC_COMPOSE;
    else
        opts |= UTF8PROC_DECOMPOSE;
    if (kind == HP_TOKENIZER_NFKC || kind == HP_TOKENIZER_NFKD)
        opts |= UTF8PROC_COMPAT;
    utf8proc_uint8_t *dst = NULL;
    utf8proc_ssize_t r =
        utf8proc_map((const utf8proc_uint8_t *)s, (utf8proc_ssize_t)n, &dst,
                     (utf8proc_option_t)opts);
    if (r < 0) {
        if (r == UTF8PROC_ERROR_NOMEM)
            return hp_error_set(err, HP_ENOMEM, "tokenizer: out of memory");
        return hp_error_set(err, HP_EINTERNAL, "tokenizer: utf8proc: %s",
                            utf8proc_errmsg(r));
    }
    int rc = hp_tokenizer_text_append(out, dst, (size_t)r, err);
    free(dst);
    return rc;
}

/* One normaliser over valid UTF-8. Code points HF's (older) Unicode data
 * does not know are copied as they are and the runs between them
 * normalised on their own: to HF they are plain starters that neither
 * reorder nor compose, which is what cutting the text there reproduces. */
static int normalize_one(const char *s, size_t n, int kind,
                         hp_tokenizer_text_t *out, hp_error_t *err)
{
    size_t run = 0, i = 0;
    while (i < n) {
        uint8_t b = (uint8_t)s[i];
        if (b < 0xdf) { /* below U+07C0: never opaque */
            i += b < 0x80 ? 1 : 2;
            continue;
        }
        uint32_t cp;
        int k = hp_tokenizer_utf8_next((const uint8_t *)s + i, n - i, &cp);
        if (nfc_opaque(cp)) {
            int rc = map_run(s + run, i - run, kind, out, err);
            if (!rc)
                rc = hp_tokenizer_text_append(out, s + i, (size_t)k, err);
            if (rc)
                return rc;
            run = i + (size_t)k;
        }
        i += (size_t)k;
    }
    return map_run(s + run, n - run, kind, out, err);
}

int hp_tokenizer_normalize(const hp_tokenizer_t *tok, const char *s, size_t n,
                           hp_tokenizer_text_t *out, hp_error_t *err)
{
    out->len = 0;
    bool ascii = true;
    for (size_t i = 0; i < n && ascii; i++)
        ascii = (uint8_t)s[i] < 0x80;
    if (ascii || tok->n_norm == 0) /* every normal form keeps ASCII */
        return hp_tokenizer_text_append(out, s, n, err);
    hp_tokenizer_text_t tmp = {0};
    int rc = HP_OK;
    for (int k = 0; k < tok->n_norm && !rc; k++) {
        if (k == 0) {
            rc = normalize_one(s, n, tok->norm[k], out, err);
            continue;
        }
        tmp.len = 0;
        rc = hp_tokenizer_text_append(&tmp, out->data, out->len, err);
        out->len = 0;
        if (!rc)
            rc = normalize_one(tmp.data, tmp.len, tok->norm[k], out, err);
    }
    hp_tokenizer_text_free(&tmp);
    if (!rc)
        rc = hp_tokenizer_text_append(out, "", 0, err);
    return rc;
}

/* ---- Unicode predicates ---- */

int hp_tokenizer_gc(uint32_t cp)
{
    size_t lo = 0, hi = hp_tokenizer_gc_n;
    while (hi - lo > 1) { /* last run starting at or before cp */
        size_t mid = (lo + hi) / 2;
        if (hp_tokenizer_gc_start[mid] <= cp)
            lo = mid;
        else
            hi = mid;
    }
    return hp_tokenizer_gc_cat[lo];
}

bool hp_tokenizer_is_white_space(uint32_t cp)
{
    /* the White_Space property: Rust's \s and Oniguruma's \s */
    return (cp >= 0x09 && cp <= 0x0d) || cp == 0x20 || cp == 0x85 ||
           cp == 0xa0 || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200a) ||
           cp == 0x2028 || cp == 0x2029 || cp == 0x202f || cp == 0x205f ||
           cp == 0x3000;
}

bool hp_tokenizer_is_word_char(uint32_t cp)
{
    /* Rust's Unicode \w: Alphabetic, marks, Nd, Pc, Join_Control. The
     * Alphabetic property is approximated by letters, Nl and the symbols
     * with Other_Alphabetic (circled and squared Latin letters). */
    if (cp < 0x80)
        return (cp >= '0' && cp <= '9') || (cp >= 'a' && cp <= 'z') ||
               (cp >= 'A' && cp <= 'Z') || cp == '_';
    if (cp == 0x200c || cp == 0x200d || (cp >= 0x24b6 && cp <= 0x24e9) ||
        (cp >= 0x1f130 && cp <= 0x1f149) || (cp >= 0x1f150 && cp <= 0x1f169) ||
        (cp >= 0x1f170 && cp <= 0x1f189))
        return true;
    const char *g = hp_tokenizer_gc_names[hp_tokenizer_gc(cp)];
    return g[0] == 'L' || g[0] == 'M' || !strcmp(g, "Nd") || !strcmp(g, "Nl") ||
           !strcmp(g, "Pc");
}
