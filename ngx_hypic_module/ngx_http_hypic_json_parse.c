
/*
 * HYPIC serve: strict checking of a JSON request body and JSON escaping,
 * with nginx's core types and macros only (no nginx object is linked).
 *
 * cJSON builds the tree the handler reads, but it is lenient where that
 * loses the client's text: it skips any byte up to ' ' as white space,
 * decodes "\u0000" and bad escapes such as "\u12G4" to a NUL that ends
 * the C string, keeps the first of two equal names. The body is checked
 * here first, so what cJSON is given decodes to exactly what was sent.
 */


#include <ngx_config.h>
#include <ngx_core.h>

#include <math.h>

#include "ngx_http_hypic_json_parse.h"


/* what is being read at one level of nesting */

typedef struct {
    u_char                     *key;      /* the member's name, or NULL */
    size_t                      key_len;
    ngx_uint_t                  index;    /* the array element */
    ngx_uint_t                  members;
    ngx_uint_t                  object;
} ngx_http_hypic_json_level_t;


/* the text being checked */

typedef struct {
    u_char                     *data;
    u_char                     *last;
    ngx_http_hypic_json_err_t  *err;
} ngx_http_hypic_json_text_t;


static u_char *ngx_http_hypic_json_space(u_char *p, u_char *last);
static u_char *ngx_http_hypic_json_key(ngx_http_hypic_json_text_t *t,
    u_char *p, ngx_http_hypic_json_level_t *lv);
static u_char *ngx_http_hypic_json_scan(ngx_http_hypic_json_text_t *t,
    u_char *p);
static ngx_int_t ngx_http_hypic_json_hex4(u_char *p, u_char *last);
static u_char *ngx_http_hypic_json_number(ngx_http_hypic_json_text_t *t,
    u_char *p);
static u_char *ngx_http_hypic_json_literal(ngx_http_hypic_json_text_t *t,
    u_char *p);
static u_char *ngx_http_hypic_json_bad(ngx_http_hypic_json_text_t *t,
    u_char *p, const char *reason);
static ngx_int_t ngx_http_hypic_json_fail(ngx_http_hypic_json_err_t *err,
    ngx_http_hypic_json_level_t *stack, ngx_uint_t depth);
static ngx_int_t ngx_http_hypic_json_unique_at(cJSON *item,
    const char **keys, ngx_http_hypic_json_err_t *err);
static int ngx_http_hypic_json_cmp(const void *a, const void *b);
static void ngx_http_hypic_json_path_key(ngx_http_hypic_json_err_t *err,
    u_char *key, size_t len);
static void ngx_http_hypic_json_path_index(ngx_http_hypic_json_err_t *err,
    ngx_uint_t index);
static void ngx_http_hypic_json_path_cat(ngx_http_hypic_json_err_t *err,
    u_char *s, size_t len);
static size_t ngx_http_hypic_utf8_len(u_char *p, size_t n);


#define NGX_HTTP_HYPIC_JSON_SYNTAX  "invalid JSON"

/*
 * cJSON up to 1.7.15 reads a number through a buffer of 64 bytes and
 * misreads a longer one (Debian's patched cJSON does not); no client
 * needs more digits than a double has.
 */
#define NGX_HTTP_HYPIC_JSON_NUMBER  63


static u_char  ngx_http_hypic_hex[] = "0123456789abcdef";


ngx_int_t
ngx_http_hypic_json_check(u_char *data, size_t len,
    ngx_http_hypic_json_err_t *err)
{
    u_char                       *p, *last;
    ngx_uint_t                    depth;
    ngx_http_hypic_json_text_t    t;
    ngx_http_hypic_json_level_t  *lv;
    ngx_http_hypic_json_level_t   stack[NGX_HTTP_HYPIC_JSON_DEPTH];

    p = data;
    last = data + len;
    depth = 0;

    t.data = data;
    t.last = last;
    t.err = err;

    err->keys = 0;

    /* RFC 8259 lets a parser ignore a BOM, and cJSON does */

    if (len >= 3 && p[0] == 0xef && p[1] == 0xbb && p[2] == 0xbf) {
        p += 3;
    }

    err->start = p - data;

    for ( ;; ) {

        /* a value */

        p = ngx_http_hypic_json_space(p, last);

        if (p == last) {
            ngx_http_hypic_json_bad(&t, p, NGX_HTTP_HYPIC_JSON_SYNTAX);
            return ngx_http_hypic_json_fail(err, stack, depth);
        }

        switch (*p) {

        case '{':
        case '[':
            if (depth == NGX_HTTP_HYPIC_JSON_DEPTH) {
                ngx_http_hypic_json_bad(&t, p,
                                        "nesting deeper than 64 levels");
                return ngx_http_hypic_json_fail(err, stack, depth);
            }

            lv = &stack[depth++];

            lv->object = (*p == '{');
            lv->key = NULL;
            lv->key_len = 0;
            lv->index = 0;
            lv->members = 0;

            p = ngx_http_hypic_json_space(p + 1, last);

            if (p < last && *p == (lv->object ? '}' : ']')) {
                depth--;
                p++;
                break;
            }

            if (lv->object) {
                p = ngx_http_hypic_json_key(&t, p, lv);
                if (p == NULL) {
                    return ngx_http_hypic_json_fail(err, stack, depth);
                }
            }

            continue;

        case '"':
            p = ngx_http_hypic_json_scan(&t, p);
            break;

        case 't':
        case 'f':
        case 'n':
            p = ngx_http_hypic_json_literal(&t, p);
            break;

        default:
            p = ngx_http_hypic_json_number(&t, p);
        }

        if (p == NULL) {
            return ngx_http_hypic_json_fail(err, stack, depth);
        }

        /* after a value: close what ends here, or go on to the next one */

        for ( ;; ) {
            p = ngx_http_hypic_json_space(p, last);

            if (depth == 0) {
                if (p != last) {
                    ngx_http_hypic_json_bad(&t, p,
                                            NGX_HTTP_HYPIC_JSON_SYNTAX);
                    return ngx_http_hypic_json_fail(err, stack, 0);
                }

                return NGX_OK;
            }

            lv = &stack[depth - 1];

            if (p < last && *p == (lv->object ? '}' : ']')) {
                depth--;
                p++;
                continue;
            }

            if (p == last || *p != ',') {
                ngx_http_hypic_json_bad(&t, p, NGX_HTTP_HYPIC_JSON_SYNTAX);
                return ngx_http_hypic_json_fail(err, stack, depth);
            }

            p = ngx_http_hypic_json_space(p + 1, last);

            if (!lv->object) {
                lv->index++;
                break;
            }

            p = ngx_http_hypic_json_key(&t, p, lv);
            if (p == NULL) {
                return ngx_http_hypic_json_fail(err, stack, depth);
            }

            break;
        }
    }
}


static u_char *
ngx_http_hypic_json_space(u_char *p, u_char *last)
{
    while (p < last
           && (*p == ' ' || *p == '\t' || *p == '\r' || *p == '\n'))
    {
        p++;
    }

    return p;
}


/*
 * A member's name and its colon, at p after white space. On an error the
 * name is not set, so the error names the object that holds it.
 */

static u_char *
ngx_http_hypic_json_key(ngx_http_hypic_json_text_t *t, u_char *p,
    ngx_http_hypic_json_level_t *lv)
{
    u_char  *end;

    lv->key = NULL;

    if (p == t->last || *p != '"') {
        return ngx_http_hypic_json_bad(t, p, NGX_HTTP_HYPIC_JSON_SYNTAX);
    }

    end = ngx_http_hypic_json_scan(t, p);
    if (end == NULL) {
        return NULL;
    }

    lv->key = p + 1;
    lv->key_len = end - 1 - lv->key;

    if (++lv->members > t->err->keys) {
        t->err->keys = lv->members;
    }

    p = ngx_http_hypic_json_space(end, t->last);

    if (p == t->last || *p != ':') {
        return ngx_http_hypic_json_bad(t, p, NGX_HTTP_HYPIC_JSON_SYNTAX);
    }

    return p + 1;
}


/* a string at its opening quote; returns the byte after the closing one */

static u_char *
ngx_http_hypic_json_scan(ngx_http_hypic_json_text_t *t, u_char *p)
{
    size_t     n;
    u_char    *last;
    ngx_int_t  u, v;

    last = t->last;

    for (p++; p < last; /* void */ ) {

        if (*p == '"') {
            return p + 1;
        }

        if (*p >= 0x80) {
            n = ngx_http_hypic_utf8_len(p, last - p);

            if (n == 0) {
                return ngx_http_hypic_json_bad(t, p,
                                               "invalid UTF-8 in a string");
            }

            p += n;
            continue;
        }

        if (*p < 0x20) {
            return ngx_http_hypic_json_bad(t, p, "a control character must "
                                           "be escaped in a string");
        }

        if (*p != '\\') {
            p++;
            continue;
        }

        if (last - p < 2) {
            break;
        }

        switch (p[1]) {

        case '"':
        case '\\':
        case '/':
        case 'b':
        case 'f':
        case 'n':
        case 'r':
        case 't':
            p += 2;
            continue;

        case 'u':
            break;

        default:
            return ngx_http_hypic_json_bad(t, p,
                                           "invalid escape in a string");
        }

        u = ngx_http_hypic_json_hex4(p + 2, last);

        if (u == NGX_ERROR) {
            return ngx_http_hypic_json_bad(t, p, "invalid \\u escape in a "
                                           "string");
        }

        if (u == 0) {
            return ngx_http_hypic_json_bad(t, p, "\\u0000 (NUL) is not "
                                           "allowed in a string");
        }

        if (u < 0xd800 || u > 0xdfff) {
            p += 6;
            continue;
        }

        /* a surrogate: a high one, then a low one, make a code point */

        v = NGX_ERROR;

        if (u <= 0xdbff && last - p >= 12 && p[6] == '\\' && p[7] == 'u') {
            v = ngx_http_hypic_json_hex4(p + 8, last);
        }

        if (v < 0xdc00 || v > 0xdfff) {
            return ngx_http_hypic_json_bad(t, p, "unpaired UTF-16 "
                                           "surrogate in a string");
        }

        p += 12;
    }

    return ngx_http_hypic_json_bad(t, p, NGX_HTTP_HYPIC_JSON_SYNTAX);
}


static ngx_int_t
ngx_http_hypic_json_hex4(u_char *p, u_char *last)
{
    u_char      c;
    ngx_int_t   u;
    ngx_uint_t  i;

    if (last - p < 4) {
        return NGX_ERROR;
    }

    u = 0;

    for (i = 0; i < 4; i++) {
        c = p[i];

        if (c >= '0' && c <= '9') {
            u = u * 16 + c - '0';

        } else if ((c | 0x20) >= 'a' && (c | 0x20) <= 'f') {
            u = u * 16 + (c | 0x20) - 'a' + 10;

        } else {
            return NGX_ERROR;
        }
    }

    return u;
}


/* -? (0 | [1-9][0-9]*) (. [0-9]+)? ([eE] [+-]? [0-9]+)? */

static u_char *
ngx_http_hypic_json_number(ngx_http_hypic_json_text_t *t, u_char *p)
{
    u_char  *start, *last;
    u_char   buf[NGX_HTTP_HYPIC_JSON_NUMBER + 1];
    double   v;

    start = p;
    last = t->last;

    if (*p == '-') {
        p++;
    }

    if (p == last || *p < '0' || *p > '9') {
        return ngx_http_hypic_json_bad(t, p, NGX_HTTP_HYPIC_JSON_SYNTAX);
    }

    if (*p++ != '0') {
        while (p < last && *p >= '0' && *p <= '9') {
            p++;
        }
    }

    if (p < last && *p == '.') {
        if (++p == last || *p < '0' || *p > '9') {
            return ngx_http_hypic_json_bad(t, p,
                                           NGX_HTTP_HYPIC_JSON_SYNTAX);
        }

        while (p < last && *p >= '0' && *p <= '9') {
            p++;
        }
    }

    if (p < last && (*p == 'e' || *p == 'E')) {
        p++;

        if (p < last && (*p == '+' || *p == '-')) {
            p++;
        }

        if (p == last || *p < '0' || *p > '9') {
            return ngx_http_hypic_json_bad(t, p,
                                           NGX_HTTP_HYPIC_JSON_SYNTAX);
        }

        while (p < last && *p >= '0' && *p <= '9') {
            p++;
        }
    }

    if (p - start > NGX_HTTP_HYPIC_JSON_NUMBER) {
        return ngx_http_hypic_json_bad(t, start,
                                       "a number longer than 63 characters");
    }

    *ngx_cpymem(buf, start, p - start) = '\0';

    v = strtod((char *) buf, NULL);

    /* strtod() gives HUGE_VAL past DBL_MAX */

    if (isinf(v)) {
        return ngx_http_hypic_json_bad(t, start,
                                       "a number too large for a double");
    }

    return p;
}


static u_char *
ngx_http_hypic_json_literal(ngx_http_hypic_json_text_t *t, u_char *p)
{
    size_t       n;
    const char  *s;

    s = (*p == 't') ? "true" : (*p == 'f') ? "false" : "null";
    n = ngx_strlen(s);

    if ((size_t) (t->last - p) < n || ngx_strncmp(p, s, n) != 0) {
        return ngx_http_hypic_json_bad(t, p, NGX_HTTP_HYPIC_JSON_SYNTAX);
    }

    return p + n;
}


/* notes where and why the text is refused; returns NULL */

static u_char *
ngx_http_hypic_json_bad(ngx_http_hypic_json_text_t *t, u_char *p,
    const char *reason)
{
    t->err->offset = p - t->data;
    t->err->reason = reason;

    return NULL;
}


/* names the field being read where the error is: messages[0].content */

static ngx_int_t
ngx_http_hypic_json_fail(ngx_http_hypic_json_err_t *err,
    ngx_http_hypic_json_level_t *stack, ngx_uint_t depth)
{
    ngx_uint_t  i;

    err->path_last = err->path;
    err->path_cut = 0;

    for (i = 0; i < depth; i++) {
        if (!stack[i].object) {
            ngx_http_hypic_json_path_index(err, stack[i].index);

        } else if (stack[i].key) {
            ngx_http_hypic_json_path_key(err, stack[i].key,
                                         stack[i].key_len);

        } else {
            break;
        }
    }

    return NGX_ERROR;
}


ngx_int_t
ngx_http_hypic_json_unique(cJSON *json, const char **scratch,
    ngx_http_hypic_json_err_t *err)
{
    err->path_last = err->path;
    err->path_cut = 0;
    err->offset = 0;

    return ngx_http_hypic_json_unique_at(json, scratch, err);
}


static ngx_int_t
ngx_http_hypic_json_unique_at(cJSON *item, const char **keys,
    ngx_http_hypic_json_err_t *err)
{
    cJSON       *child;
    u_char      *mark;
    ngx_uint_t   i, n, cut;

    if (cJSON_IsObject(item)) {
        n = 0;

        for (child = item->child; child; child = child->next) {

            /* err->keys counted the members of the checked text */

            if (n == err->keys) {
                err->reason = "more names than the text has";
                return NGX_ERROR;
            }

            keys[n++] = child->string;
        }

        /* sorted, equal names meet: n log n for any object */

        qsort(keys, n, sizeof(const char *), ngx_http_hypic_json_cmp);

        for (i = 1; i < n; i++) {
            if (ngx_strcmp(keys[i - 1], keys[i]) == 0) {
                ngx_http_hypic_json_path_key(err, (u_char *) keys[i],
                                             ngx_strlen(keys[i]));
                err->reason = "a name given twice in one object";
                return NGX_ERROR;
            }
        }
    }

    i = 0;

    for (child = item->child; child; child = child->next, i++) {

        if (!cJSON_IsObject(child) && !cJSON_IsArray(child)) {
            continue;
        }

        mark = err->path_last;
        cut = err->path_cut;

        if (cJSON_IsObject(item)) {
            ngx_http_hypic_json_path_key(err, (u_char *) child->string,
                                         ngx_strlen(child->string));

        } else {
            ngx_http_hypic_json_path_index(err, i);
        }

        if (ngx_http_hypic_json_unique_at(child, keys, err) != NGX_OK) {
            return NGX_ERROR;
        }

        err->path_last = mark;
        err->path_cut = cut;
    }

    return NGX_OK;
}


static int
ngx_http_hypic_json_cmp(const void *a, const void *b)
{
    return ngx_strcmp(*(const char **) a, *(const char **) b);
}


static void
ngx_http_hypic_json_path_key(ngx_http_hypic_json_err_t *err, u_char *key,
    size_t len)
{
    if (err->path_last != err->path) {
        ngx_http_hypic_json_path_cat(err, (u_char *) ".", 1);
    }

    /* the empty name is a name too: it shows as "" in the path */

    if (len == 0) {
        ngx_http_hypic_json_path_cat(err, (u_char *) "\"\"", 2);
        return;
    }

    ngx_http_hypic_json_path_cat(err, key, len);
}


static void
ngx_http_hypic_json_path_index(ngx_http_hypic_json_err_t *err,
    ngx_uint_t index)
{
    u_char  *p;
    u_char   buf[NGX_INT_T_LEN + 2];

    p = buf + sizeof(buf);

    *--p = ']';

    do {
        *--p = (u_char) ('0' + index % 10);
        index /= 10;
    } while (index);

    *--p = '[';

    ngx_http_hypic_json_path_cat(err, p, buf + sizeof(buf) - p);
}


/* appends a part that fits; a longer path ends with "..." at a part */

static void
ngx_http_hypic_json_path_cat(ngx_http_hypic_json_err_t *err, u_char *s,
    size_t len)
{
    size_t  room;

    if (err->path_cut) {
        return;
    }

    room = err->path + sizeof(err->path) - err->path_last;

    if (len + sizeof("...") - 1 > room) {
        err->path_last = ngx_cpymem(err->path_last, "...",
                                    sizeof("...") - 1);
        err->path_cut = 1;
        return;
    }

    err->path_last = ngx_cpymem(err->path_last, s, len);
}


size_t
ngx_http_hypic_json_escape_len(u_char *src, size_t size)
{
    size_t   len, n;
    u_char  *last;

    len = 0;
    last = src + size;

    while (src < last) {

        if (*src >= 0x80) {
            n = ngx_http_hypic_utf8_len(src, last - src);

            if (n == 0) {
                len += sizeof("\\ufffd") - 1;
                src++;
                continue;
            }

            len += n;
            src += n;
            continue;
        }

        switch (*src) {

        case '"':
        case '\\':
        case '\b':
        case '\f':
        case '\n':
        case '\r':
        case '\t':
            len += 2;
            break;

        default:
            len += (*src < 0x20) ? sizeof("\\u0000") - 1 : 1;
        }

        src++;
    }

    return len;
}


u_char *
ngx_http_hypic_json_escape(u_char *dst, u_char *src, size_t size)
{
    size_t   n;
    u_char  *last;

    last = src + size;

    while (src < last) {

        if (*src >= 0x80) {
            n = ngx_http_hypic_utf8_len(src, last - src);

            if (n == 0) {
                dst = ngx_cpymem(dst, "\\ufffd", sizeof("\\ufffd") - 1);
                src++;
                continue;
            }

            dst = ngx_cpymem(dst, src, n);
            src += n;
            continue;
        }

        switch (*src) {

        case '"':
        case '\\':
            *dst++ = '\\';
            *dst++ = *src;
            break;

        case '\b':
            *dst++ = '\\';
            *dst++ = 'b';
            break;

        case '\f':
            *dst++ = '\\';
            *dst++ = 'f';
            break;

        case '\n':
            *dst++ = '\\';
            *dst++ = 'n';
            break;

        case '\r':
            *dst++ = '\\';
            *dst++ = 'r';
            break;

        case '\t':
            *dst++ = '\\';
            *dst++ = 't';
            break;

        default:
            if (*src < 0x20) {
                dst = ngx_cpymem(dst, "\\u00", sizeof("\\u00") - 1);
                *dst++ = ngx_http_hypic_hex[*src >> 4];
                *dst++ = ngx_http_hypic_hex[*src & 0xf];

            } else {
                *dst++ = *src;
            }
        }

        src++;
    }

    return dst;
}


/*
 * The length of the valid UTF-8 sequence at p, or 0: overlong forms,
 * surrogates and code points past U+10FFFF are not valid.
 */

static size_t
ngx_http_hypic_utf8_len(u_char *p, size_t n)
{
    size_t    len, i;
    uint32_t  u, min;

    if (p[0] < 0x80) {
        return 1;
    }

    if (p[0] >= 0xc2 && p[0] <= 0xdf) {
        len = 2;
        u = p[0] & 0x1f;
        min = 0x80;

    } else if (p[0] >= 0xe0 && p[0] <= 0xef) {
        len = 3;
        u = p[0] & 0x0f;
        min = 0x800;

    } else if (p[0] >= 0xf0 && p[0] <= 0xf4) {
        len = 4;
        u = p[0] & 0x07;
        min = 0x10000;

    } else {
        return 0;
    }

    if (n < len) {
        return 0;
    }

    for (i = 1; i < len; i++) {
        if ((p[i] & 0xc0) != 0x80) {
            return 0;
        }

        u = (u << 6) | (p[i] & 0x3f);
    }

    if (u < min || u > 0x10ffff || (u >= 0xd800 && u <= 0xdfff)) {
        return 0;
    }

    return len;
}
