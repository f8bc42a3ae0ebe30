/*
 * tokenizer_regex.c - the pre-tokenizer regex, written for HF's Oniguruma,
 * compiled with PCRE2; its Unicode classes follow the Unicode version HF
 * uses (tokenizer_unicode.c), whatever PCRE2's own tables are.
 */
#include "engine/tokenizer/tokenizer_impl.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Class bodies already built in this translation, by category mask. */
#define MAX_CLASSES 8

typedef struct {
    hp_tokenizer_text_t out;
    hp_error_t *err;
    int rc;
    uint32_t mask[MAX_CLASSES];
    hp_tokenizer_text_t body[MAX_CLASSES];
    int n_class;
    hp_tokenizer_text_t probe; /* subject of all code points to compare */
    bool probe_all;
} xlat_t;

static void put(xlat_t *x, const char *s, size_t n)
{
    if (!x->rc)
        x->rc = hp_tokenizer_text_append(&x->out, s, n, x->err);
}

static void puts_(xlat_t *x, const char *s)
{
    put(x, s, strlen(s));
}

static void put_cp(xlat_t *x, uint32_t cp)
{
    char b[16];
    int k = snprintf(b, sizeof(b), "\\x{%x}", cp);
    put(x, b, (size_t)k);
}

static void put_range(xlat_t *x, uint32_t lo, uint32_t hi)
{
    /* UTF-8 text cannot hold surrogates, and PCRE2 refuses them */
    if (lo <= 0xdfff && hi >= 0xd800) {
        if (lo < 0xd800)
            put_range(x, lo, 0xd7ff);
        if (hi > 0xdfff)
            put_range(x, 0xe000, hi);
        return;
    }
    put_cp(x, lo);
    if (hi != lo) {
        put(x, "-", 1);
        put_cp(x, hi);
    }
}

/* Explicit ranges of the code points whose category is in mask. */
static void put_all_ranges(xlat_t *x, uint32_t mask)
{
    size_t n = hp_tokenizer_gc_n;
    for (size_t i = 0; i < n; i++) {
        if (!(mask >> hp_tokenizer_gc_cat[i] & 1))
            continue;
        uint32_t lo = hp_tokenizer_gc_start[i];
        while (i + 1 < n && (mask >> hp_tokenizer_gc_cat[i + 1] & 1))
            i++;
        uint32_t hi = i + 1 < n ? hp_tokenizer_gc_start[i + 1] - 1 : 0x10ffff;
        put_range(x, lo, hi);
    }
}

static int gc_index(const char *name)
{
    for (size_t i = 0; i < hp_tokenizer_gc_n_names; i++)
        if (!strcmp(hp_tokenizer_gc_names[i], name))
            return (int)i;
    return -1;
}

/* PCRE2's own property class for mask: \p{L} for a whole major class,
 * else its subcategories. */
static void put_pcre_props(xlat_t *x, uint32_t mask)
{
    static const char majors[] = "LMNPSZC";
    for (const char *m = majors; *m; m++) {
        uint32_t all = 0;
        for (size_t i = 0; i < hp_tokenizer_gc_n_names; i++)
            if (hp_tokenizer_gc_names[i][0] == *m)
                all |= 1u << i;
        char b[8];
        if ((mask & all) == all) {
            snprintf(b, sizeof(b), "\\p{%c}", *m);
            puts_(x, b);
            continue;
        }
        for (size_t i = 0; i < hp_tokenizer_gc_n_names; i++)
            if (mask & all & (1u << i)) {
                snprintf(b, sizeof(b), "\\p{%s}", hp_tokenizer_gc_names[i]);
                puts_(x, b);
            }
    }
}

/* The code points PCRE2's tables are compared on: every assigned one of
 * our Unicode version (private use and unassigned ones never change
 * category), or all of them if PCRE2's Unicode is newer than ours. */
static int build_probe(xlat_t *x)
{
    if (x->probe.len)
        return HP_OK;
    char v[32] = "";
    unsigned a = 0, b = 0, c = 0, d = 0, e = 0, f = 0;
    if (pcre2_config(PCRE2_CONFIG_UNICODE_VERSION, v) > 0 &&
        sscanf(v, "%u.%u.%u", &a, &b, &c) >= 2 &&
        sscanf(hp_tokenizer_unicode_version, "%u.%u.%u", &d, &e, &f) >= 2)
        x->probe_all = a > d || (a == d && (b > e || (b == e && c > f)));
    else
        x->probe_all = true;
    int cn = gc_index("Cn"), co = gc_index("Co"), cs = gc_index("Cs");
    for (size_t i = 0; i < hp_tokenizer_gc_n && !x->rc; i++) {
        int cat = hp_tokenizer_gc_cat[i];
        if (cat == cs || (!x->probe_all && (cat == cn || cat == co)))
            continue;
        uint32_t hi =
            i + 1 < hp_tokenizer_gc_n ? hp_tokenizer_gc_start[i + 1] : 0x110000;
        for (uint32_t cp = hp_tokenizer_gc_start[i]; cp < hi; cp++) {
            char u[4];
            int k = hp_tokenizer_utf8_put(cp, u);
            if (hp_tokenizer_text_append(&x->probe, u, (size_t)k, x->err)) {
                x->rc = x->err->code;
                break;
            }
        }
    }
    return x->rc;
}

/* Marks in bits the probe code points PCRE2's property class for mask
 * matches. Returns 0, or -1 if PCRE2 could not be asked. */
static int pcre_members(xlat_t *x, uint32_t mask, uint8_t *bits)
{
    hp_tokenizer_text_t saved = x->out;
    memset(&x->out, 0, sizeof(x->out));
    puts_(x, "[");
    put_pcre_props(x, mask);
    puts_(x, "]+");
    int ecode;
    PCRE2_SIZE eoff;
    pcre2_code *re =
        x->rc ? NULL
              : pcre2_compile((PCRE2_SPTR)x->out.data, x->out.len,
                              PCRE2_UTF | PCRE2_UCP, &ecode, &eoff, NULL);
    hp_tokenizer_text_free(&x->out);
    x->out = saved;
    pcre2_match_data *md = re ? pcre2_match_data_create(1, NULL) : NULL;
    if (!md) {
        pcre2_code_free(re);
        return -1;
    }
    (void)pcre2_jit_compile(re, PCRE2_JIT_COMPLETE);
    const uint8_t *s = (const uint8_t *)x->probe.data;
    size_t n = x->probe.len, pos = 0;
    while (pos < n &&
           pcre2_match(re, s, n, pos, PCRE2_NO_UTF_CHECK, md, NULL) >= 0) {
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
        for (size_t i = ov[0]; i < ov[1];) {
            uint32_t cp;
            i += (size_t)hp_tokenizer_utf8_next(s + i, n - i, &cp);
            bits[cp >> 3] |= (uint8_t)(1u << (cp & 7));
        }
        pos = ov[1] > pos ? ov[1] : pos + 1;
    }
    pcre2_match_data_free(md);
    pcre2_code_free(re);
    return 0;
}

/* Class body (no brackets) for the categories in mask, as HF's Unicode
 * version sees them. Explicit ranges are exact but slow to match in PCRE2's
 * JIT (it tests them one by one), so when PCRE2's own property tables only
 * lack code points (an older Unicode) we use them plus the missing ranges;
 * if they disagree otherwise we fall back to the explicit ranges. */
static void put_categories(xlat_t *x, uint32_t mask)
{
    for (int i = 0; i < x->n_class; i++)
        if (x->mask[i] == mask) {
            put(x, x->body[i].data, x->body[i].len);
            return;
        }
    if (build_probe(x))
        return;
    uint8_t *bits = calloc(0x110000 / 8, 1);
    const uint8_t *s = (const uint8_t *)x->probe.data;
    size_t n = x->probe.len;
    bool exact = !bits || pcre_members(x, mask, bits);
    for (size_t i = 0; i < n && !exact;) {
        uint32_t cp;
        i += (size_t)hp_tokenizer_utf8_next(s + i, n - i, &cp);
        if ((bits[cp >> 3] >> (cp & 7) & 1) &&
            !(mask >> hp_tokenizer_gc(cp) & 1))
            exact = true; /* PCRE2 has a code point we do not */
    }
    hp_tokenizer_text_t saved = x->out;
    memset(&x->out, 0, sizeof(x->out));
    if (exact) {
        put_all_ranges(x, mask);
    } else {
        put_pcre_props(x, mask);
        uint32_t lo = 0, hi = 0;
        bool open = false;
        for (size_t i = 0; i < n;) {
            uint32_t cp;
            i += (size_t)hp_tokenizer_utf8_next(s + i, n - i, &cp);
            if (!(mask >> hp_tokenizer_gc(cp) & 1) ||
                (bits[cp >> 3] >> (cp & 7) & 1))
                continue; /* only ours that PCRE2 lacks */
            if (open && cp == hi + 1) {
                hi = cp;
                continue;
            }
            if (open)
                put_range(x, lo, hi);
            lo = hi = cp;
            open = true;
        }
        if (open)
            put_range(x, lo, hi);
    }
    free(bits);
    hp_tokenizer_text_t body = x->out;
    x->out = saved;
    put(x, body.data, body.len);
    if (!x->rc && x->n_class < MAX_CLASSES) {
        x->mask[x->n_class] = mask;
        x->body[x->n_class++] = body;
        return;
    }
    hp_tokenizer_text_free(&body);
}

static uint32_t cat_mask(const char *names)
{
    uint32_t m = 0;
    for (size_t i = 0; i < hp_tokenizer_gc_n_names; i++) {
        const char *g = hp_tokenizer_gc_names[i];
        for (const char *p = names; *p; p += 2)
            if ((p[1] == '*' && g[0] == p[0]) || (g[0] == p[0] && g[1] == p[1]))
                m |= 1u << i;
    }
    return m;
}

/* Category set of a \p{name}, 0 if it is not a general category (a script
 * or binary property, left to PCRE2). Oniguruma ignores case, spaces,
 * underscores and hyphens in names. */
static uint32_t property_mask(const char *name, size_t len)
{
    char k[40];
    size_t n = 0;
    for (size_t i = 0; i < len && n + 1 < sizeof(k); i++) {
        char ch = name[i];
        if (ch == ' ' || ch == '_' || ch == '-')
            continue;
        k[n++] = (char)tolower((unsigned char)ch);
    }
    k[n] = 0;
    static const struct {
        const char *name, *cats;
    } alias[] = {
        {"l", "L*"},
        {"letter", "L*"},
        {"m", "M*"},
        {"mark", "M*"},
        {"combiningmark", "M*"},
        {"n", "N*"},
        {"number", "N*"},
        {"p", "P*"},
        {"punctuation", "P*"},
        {"punct", "P*"},
        {"s", "S*"},
        {"symbol", "S*"},
        {"z", "Z*"},
        {"separator", "Z*"},
        {"c", "C*"},
        {"other", "C*"},
        {"lc", "LuLlLt"},
        {"l&", "LuLlLt"},
        {"casedletter", "LuLlLt"},
    };
    for (size_t i = 0; i < sizeof(alias) / sizeof(alias[0]); i++)
        if (!strcmp(k, alias[i].name))
            return cat_mask(alias[i].cats);
    if (n == 2) {
        char two[3] = {(char)toupper((unsigned char)k[0]), k[1], 0};
        for (size_t i = 0; i < hp_tokenizer_gc_n_names; i++)
            if (!strcmp(two, hp_tokenizer_gc_names[i]))
                return 1u << i;
    }
    return 0;
}

static const uint32_t white_space[][2] = {
    {0x09, 0x0d},     {0x20, 0x20},     {0x85, 0x85},     {0xa0, 0xa0},
    {0x1680, 0x1680}, {0x2000, 0x200a}, {0x2028, 0x2029}, {0x202f, 0x202f},
    {0x205f, 0x205f}, {0x3000, 0x3000},
};

/* Class body of an Oniguruma shorthand (lower-case letter), 0 if none. */
static int put_shorthand(xlat_t *x, char e)
{
    switch (e) {
    case 's':
        for (size_t i = 0; i < sizeof(white_space) / sizeof(white_space[0]);
             i++)
            put_range(x, white_space[i][0], white_space[i][1]);
        return 1;
    case 'd':
        put_categories(x, cat_mask("Nd"));
        return 1;
    case 'w':
        put_categories(x, cat_mask("L*M*NdPc"));
        return 1;
    case 'h': /* Oniguruma: a hexadecimal digit */
        puts_(x, "0-9a-fA-F");
        return 1;
    default:
        return 0;
    }
}

static int unsupported(xlat_t *x, const char *what)
{
    x->rc = hp_error_set(x->err, HP_EMODEL,
                         "pre-tokenizer regex: unsupported %s", what);
    return x->rc;
}

static int translate(xlat_t *x, const char *p, size_t n)
{
    bool in_class = false;
    size_t body = 0; /* where the current class's items start */
    for (size_t i = 0; i < n && !x->rc;) {
        char c = p[i];
        if (c == '\\' && i + 1 < n) {
            char e = p[i + 1];
            if ((e == 'p' || e == 'P') && i + 2 < n && p[i + 2] == '{') {
                const char *close = memchr(p + i + 3, '}', n - i - 3);
                if (!close)
                    return unsupported(x, "\\p{ without }");
                const char *name = p + i + 3;
                bool neg = e == 'P';
                if (name < close && *name == '^') {
                    neg = !neg;
                    name++;
                }
                uint32_t mask = property_mask(name, (size_t)(close - name));
                size_t end = (size_t)(close - p) + 1;
                if (!mask) { /* not a general category: PCRE2's own */
                    put(x, p + i, end - i);
                } else if (in_class) {
                    if (neg)
                        return unsupported(x, "negated \\P{} inside []");
                    put_categories(x, mask);
                } else {
                    puts_(x, neg ? "[^" : "[");
                    put_categories(x, mask);
                    puts_(x, "]");
                }
                i = end;
                continue;
            }
            char lower = (char)tolower((unsigned char)e);
            if (strchr("sdwh", lower)) {
                bool neg = e != lower;
                if (in_class) {
                    if (neg)
                        return unsupported(x, "negated shorthand inside []");
                    put_shorthand(x, lower);
                } else {
                    puts_(x, neg ? "[^" : "[");
                    put_shorthand(x, lower);
                    puts_(x, "]");
                }
                i += 2;
                continue;
            }
            if (e == 'u' && i + 6 <= n) { /* Oniguruma's \uHHHH */
                char hex[5] = {0};
                memcpy(hex, p + i + 2, 4);
                if (strspn(hex, "0123456789abcdefABCDEF") == 4) {
                    puts_(x, "\\x{");
                    puts_(x, hex);
                    puts_(x, "}");
                    i += 6;
                    continue;
                }
            }
            put(x, p + i, 2);
            i += 2;
            continue;
        }
        if (in_class) {
            if (c == ']' && i > body) {
                in_class = false;
            } else if (c == '[') {
                if (i + 1 < n && p[i + 1] == ':') { /* [:alpha:] */
                    size_t end = i + 2;
                    while (end + 1 < n && !(p[end] == ':' && p[end + 1] == ']'))
                        end++;
                    if (end + 1 >= n)
                        return unsupported(x, "[: without :]");
                    put(x, p + i, end + 2 - i);
                    i = end + 2;
                    continue;
                }
                return unsupported(x, "nested character class");
            } else if (c == '&' && i + 1 < n && p[i + 1] == '&') {
                return unsupported(x, "class intersection &&");
            }
            put(x, &c, 1);
            i++;
            continue;
        }
        put(x, &c, 1);
        i++;
        if (c == '[') {
            in_class = true;
            if (i < n && p[i] == '^') {
                put(x, "^", 1);
                i++;
            }
            body = i;
        }
    }
    if (!x->rc && in_class)
        return unsupported(x, "unterminated character class");
    return x->rc;
}

int hp_tokenizer_regex_compile(const char *pat, size_t len, bool literal,
                               pcre2_code **out, hp_error_t *err)
{
    *out = NULL;
    xlat_t x = {.err = err};
    if (literal)
        put(&x, pat, len);
    else
        translate(&x, pat, len);
    for (int i = 0; i < x.n_class; i++)
        hp_tokenizer_text_free(&x.body[i]);
    hp_tokenizer_text_free(&x.probe);
    if (x.rc) {
        hp_tokenizer_text_free(&x.out);
        return x.rc;
    }
    int ecode;
    PCRE2_SIZE eoff;
    uint32_t opts = PCRE2_UTF | PCRE2_UCP | (literal ? PCRE2_LITERAL : 0);
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)(x.out.data ? x.out.data : ""),
                                   x.out.len, opts, &ecode, &eoff, NULL);
    hp_tokenizer_text_free(&x.out);
    if (!re) {
        PCRE2_UCHAR msg[160];
        pcre2_get_error_message(ecode, msg, sizeof(msg));
        return hp_error_set(err, HP_EMODEL, "pre-tokenizer regex /%.80s/: %s",
                            pat, (const char *)msg);
    }
    /* JIT is an optimisation only: without it pcre2_match interprets */
    (void)pcre2_jit_compile(re, PCRE2_JIT_COMPLETE);
    *out = re;
    return HP_OK;
}
