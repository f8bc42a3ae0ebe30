
/*
 * HYPIC serve: the content handlers and request lifecycle.
 */


#ifndef _NGX_HTTP_HYPIC_HANDLER_H_INCLUDED_
#define _NGX_HTTP_HYPIC_HANDLER_H_INCLUDED_


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include <cJSON.h>

#include "ngx_http_hypic_module.h"


/* why a request was refused, filled by the checks */

typedef struct {
    ngx_uint_t                  status;
    const char                 *code;
    const char                 *param;
    u_char                     *last;
    u_char                      msg[NGX_MAX_ERROR_STR];
} ngx_http_hypic_bad_t;


/* hypic_pass: the OpenAI API (completions, chat completions, models) */
ngx_int_t ngx_http_hypic_pass_handler(ngx_http_request_t *r);

/* A 405 in JSON with "Allow: allow"; what a content handler returns. */
ngx_int_t ngx_http_hypic_not_allowed(ngx_http_request_t *r, char *allow);

/* Postconfiguration: the log phase counter and the request body filter. */
ngx_int_t ngx_http_hypic_handler_init(ngx_conf_t *cf);

/*
 * Goes on with a request whose Redis lookup is over (ctx->route set): to
 * the local engine, or to the hypic_peer location. Finalizes r as
 * needed; the caller runs the posted requests.
 */
void ngx_http_hypic_routed(ngx_http_request_t *r);

/*
 * Routes a request that waited for its engine's link to come up, as if it
 * had just been read: NGX_DONE, or what a content handler returns.
 */
ngx_int_t ngx_http_hypic_route_again(ngx_http_request_t *r);

/*
 * One record from the engine for r (HP_IPC_REC_*). NGX_OK: more may come;
 * NGX_DONE: the request was finalized (its ctx is gone).
 */
ngx_int_t ngx_http_hypic_deliver(ngx_http_request_t *r, ngx_uint_t type,
    u_char *data, size_t len);

/*
 * Ends r because the engine cannot answer it: an OpenAI error with
 * status, or, once the stream has begun, an SSE error event. Lets go of
 * the engine first; finalizes the request.
 */
void ngx_http_hypic_fail(ngx_http_request_t *r, ngx_uint_t status,
    const char *type, const char *code, const char *fmt, ...);

/* Fills bad (param and code may be NULL); returns NGX_ERROR. */
ngx_int_t ngx_http_hypic_bad(ngx_http_hypic_bad_t *bad, ngx_uint_t status,
    const char *param, const char *code, const char *fmt, ...);

/* Checks that json's field name, if there and not null, is a number in
 * [min, max] (an integer if integer): NGX_OK or NGX_ERROR with bad. */
ngx_int_t ngx_http_hypic_check_number(cJSON *json, const char *name,
    double min, double max, ngx_uint_t integer, ngx_http_hypic_bad_t *bad);

/* X-Hypic-Mode, X-Hypic-Node and X-Hypic-Segments of an answer. */
ngx_int_t ngx_http_hypic_add_headers(ngx_http_request_t *r,
    ngx_http_hypic_ctx_t *ctx);


#endif /* _NGX_HTTP_HYPIC_HANDLER_H_INCLUDED_ */
