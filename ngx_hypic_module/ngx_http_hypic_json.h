
/*
 * HYPIC serve: JSON output of the module - escaping and OpenAI-shaped
 * error bodies, {"error":{"message":..,"type":..,"param":..,"code":..}}.
 */


#ifndef _NGX_HTTP_HYPIC_JSON_H_INCLUDED_
#define _NGX_HTTP_HYPIC_JSON_H_INCLUDED_


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>


/* the "type" of an error body, as the OpenAI API names them */

#define NGX_HTTP_HYPIC_INVALID_REQUEST     "invalid_request_error"
#define NGX_HTTP_HYPIC_ENGINE_UNAVAILABLE  "engine_unavailable"
#define NGX_HTTP_HYPIC_SERVER_ERROR        "server_error"


/*
 * The length of src once escaped as the inside of a JSON string. Escaping
 * writes \" \\ \n \r \t \b \f, \u00XX for other control bytes and \ufffd
 * for each byte that is not part of valid UTF-8, so the output is always
 * valid JSON whatever the client sent.
 */
size_t ngx_http_hypic_json_escape_len(u_char *src, size_t size);

/* Writes the escaped src to dst; returns the end of what was written. */
u_char *ngx_http_hypic_json_escape(u_char *dst, u_char *src, size_t size);

/*
 * Sends body with the given status as application/json, discarding an
 * unread request body first. Returns what a content handler returns.
 */
ngx_int_t ngx_http_hypic_send_json(ngx_http_request_t *r, ngx_uint_t status,
    ngx_str_t *body);

/*
 * Sends an OpenAI error body. The message is an ngx_sprintf() format, so
 * %V quotes request data; param and code may be NULL (JSON null).
 */
ngx_int_t ngx_http_hypic_send_error(ngx_http_request_t *r,
    ngx_uint_t status, const char *type, const char *code, const char *param,
    const char *fmt, ...);


#endif /* _NGX_HTTP_HYPIC_JSON_H_INCLUDED_ */
