/*
 * tokenizer_regex.c - the pre-tokenizer regex: HF tokenizers runs it with
 * Oniguruma, we with PCRE2. The Unicode classes are rewritten into explicit
 * ranges of the Unicode version HF's Oniguruma uses (tokenizer_unicode.c),
 * so the split agrees for every code point whatever PCRE2's own tables.
 */
#include "engine/tokenizer_impl.h"

#include <ctype.h>
#include <stdio.h>
#include <string.h>

typedef struct {
    hp_tokenizer_text_t out;
    hp_error_t *err;
    int rc;
} xlat_t;

static void put(xlat_t *x, const char *s, size_t n)
{
    if (!x->rc)
        x->rc = hp_tokenizer_text_append(&x->out, s, n, x->err);
}

static void puts_(xlat_t *x, const char *s) { put(x, s, strlen(s)); }

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

/* Class body (no brackets) of the code points whose category is in mask. */
static void put_categories(xlat_t *x, uint32_t mask)
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

static uint32_t cat_mask(const char *names)
{
    uint32_t m = 0;
    for (size_t i = 0; i < hp_tokenizer_gc_n_names; i++) {
        const char *g = hp_tokenizer_gc_names[i];
        for (const char *p = names; *p; p += 2)
            if ((p[1] == '*' && g[0] == p[0]) ||
                (g[0] == p[0] && g[1] == p[1]))
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
        {"l", "L*"},          {"letter", "L*"},     {"m", "M*"},
        {"mark", "M*"},       {"combiningmark", "M*"},
        {"n", "N*"},          {"number", "N*"},     {"p", "P*"},
        {"punctuation", "P*"}, {"punct", "P*"},     {"s", "S*"},
        {"symbol", "S*"},     {"z", "Z*"},          {"separator", "Z*"},
        {"c", "C*"},          {"other", "C*"},      {"lc", "LuLlLt"},
        {"l&", "LuLlLt"},     {"casedletter", "LuLlLt"},
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
    xlat_t x = {{0}, err, HP_OK};
    if (literal)
        put(&x, pat, len);
    else
        translate(&x, pat, len);
    if (x.rc) {
        hp_tokenizer_text_free(&x.out);
        return x.rc;
    }
    int ecode;
    PCRE2_SIZE eoff;
    uint32_t opts = PCRE2_UTF | PCRE2_UCP | (literal ? PCRE2_LITERAL : 0);
    pcre2_code *re =
        pcre2_compile((PCRE2_SPTR)(x.out.data ? x.out.data : ""), x.out.len,
                      opts, &ecode, &eoff, NULL);
    hp_tokenizer_text_free(&x.out);
    if (!re) {
        PCRE2_UCHAR msg[160];
        pcre2_get_error_message(ecode, msg, sizeof(msg));
        return hp_error_set(err, HP_EMODEL,
                            "pre-tokenizer regex /%.80s/: %s", pat,
                            (const char *)msg);
    }
    /* JIT is an optimisation only: without it pcre2_match interprets */
    (void)pcre2_jit_compile(re, PCRE2_JIT_COMPLETE);
    *out = re;
    return HP_OK;
}
