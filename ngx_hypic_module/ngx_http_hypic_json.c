
/*
 * HYPIC serve: the OpenAI error bodies and JSON answers.
 */


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include "ngx_http_hypic_json.h"


static size_t ngx_http_hypic_json_string_len(const char *s);
static u_char *ngx_http_hypic_json_string(u_char *p, const char *s);


static ngx_str_t  ngx_http_hypic_json_type = ngx_string("application/json");


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
