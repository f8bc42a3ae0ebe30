
/*
 * HYPIC serve: JSON escaping and the OpenAI error bodies.
 */


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include "ngx_http_hypic_json.h"


static size_t ngx_http_hypic_utf8_len(u_char *p, size_t n);
static size_t ngx_http_hypic_json_string_len(const char *s);
static u_char *ngx_http_hypic_json_string(u_char *p, const char *s);


static u_char  ngx_http_hypic_hex[] = "0123456789abcdef";

static ngx_str_t  ngx_http_hypic_json_type = ngx_string("application/json");


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


ngx_int_t
ngx_http_hypic_send_json(ngx_http_request_t *r, ngx_uint_t status,
    ngx_str_t *body)
{
    ngx_http_complex_value_t  cv;

    ngx_memzero(&cv, sizeof(ngx_http_complex_value_t));

    cv.value = *body;

    return ngx_http_send_response(r, status, &ngx_http_hypic_json_type, &cv);
}


ngx_int_t
ngx_http_hypic_send_error(ngx_http_request_t *r, ngx_uint_t status,
    const char *type, const char *code, const char *param,
    const char *fmt, ...)
{
    u_char     *p, *last;
    u_char      msg[NGX_MAX_ERROR_STR];
    size_t      len;
    va_list     args;
    ngx_str_t   body;

    if (r->header_sent) {
        ngx_log_error(NGX_LOG_ALERT, r->connection->log, 0,
                      "hypic: error %ui after the header was sent", status);
        return NGX_ERROR;
    }

    va_start(args, fmt);
    last = ngx_vslprintf(msg, msg + sizeof(msg), fmt, args);
    va_end(args);

    len = sizeof("{\"error\":{\"message\":\"") - 1
          + ngx_http_hypic_json_escape_len(msg, last - msg)
          + sizeof("\",\"type\":") - 1
          + ngx_http_hypic_json_string_len(type)
          + sizeof(",\"param\":") - 1
          + ngx_http_hypic_json_string_len(param)
          + sizeof(",\"code\":") - 1
          + ngx_http_hypic_json_string_len(code)
          + sizeof("}}") - 1;

    p = ngx_pnalloc(r->pool, len);
    if (p == NULL) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    body.data = p;

    p = ngx_cpymem(p, "{\"error\":{\"message\":\"",
                   sizeof("{\"error\":{\"message\":\"") - 1);
    p = ngx_http_hypic_json_escape(p, msg, last - msg);
    p = ngx_cpymem(p, "\",\"type\":", sizeof("\",\"type\":") - 1);
    p = ngx_http_hypic_json_string(p, type);
    p = ngx_cpymem(p, ",\"param\":", sizeof(",\"param\":") - 1);
    p = ngx_http_hypic_json_string(p, param);
    p = ngx_cpymem(p, ",\"code\":", sizeof(",\"code\":") - 1);
    p = ngx_http_hypic_json_string(p, code);
    p = ngx_cpymem(p, "}}", sizeof("}}") - 1);

    body.len = p - body.data;

    return ngx_http_hypic_send_json(r, status, &body);
}


/* a quoted JSON string, or null for NULL */

static size_t
ngx_http_hypic_json_string_len(const char *s)
{
    if (s == NULL) {
        return sizeof("null") - 1;
    }

    return 2 + ngx_http_hypic_json_escape_len((u_char *) s, ngx_strlen(s));
}


static u_char *
ngx_http_hypic_json_string(u_char *p, const char *s)
{
    if (s == NULL) {
        return ngx_cpymem(p, "null", sizeof("null") - 1);
    }

    *p++ = '"';
    p = ngx_http_hypic_json_escape(p, (u_char *) s, ngx_strlen(s));
    *p++ = '"';

    return p;
}
