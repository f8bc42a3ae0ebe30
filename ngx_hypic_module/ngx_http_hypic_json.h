
/*
 * HYPIC serve: JSON answers of the module and OpenAI-shaped error
 * bodies, {"error":{"message":..,"type":..,"param":..,"code":..}};
 * escaping and the body checks are in ngx_http_hypic_json_parse.h.
 */


#ifndef _NGX_HTTP_HYPIC_JSON_H_INCLUDED_
#define _NGX_HTTP_HYPIC_JSON_H_INCLUDED_


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include "ngx_http_hypic_json_parse.h"


/* the "type" of an error body, as the OpenAI API names them */

#define NGX_HTTP_HYPIC_INVALID_REQUEST     "invalid_request_error"
#define NGX_HTTP_HYPIC_ENGINE_UNAVAILABLE  "engine_unavailable"
#define NGX_HTTP_HYPIC_SERVER_ERROR        "server_error"


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
