
/*
 * HYPIC serve: the answer to a hypic_pass request, from the engine's
 * records: streamed as server-sent events (ngx_http_hypic_sse.c), or
 * gathered into one JSON answer; or an OpenAI error.
 */


#ifndef _NGX_HTTP_HYPIC_RESPONSE_H_INCLUDED_
#define _NGX_HTTP_HYPIC_RESPONSE_H_INCLUDED_


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include "ngx_http_hypic_module.h"


/*
 * The answer's id and the JSON every event and answer starts with, once
 * the request is checked: NGX_OK or NGX_HTTP_INTERNAL_SERVER_ERROR.
 */
ngx_int_t ngx_http_hypic_response_init(ngx_http_request_t *r,
    ngx_http_hypic_ctx_t *ctx, ngx_http_hypic_loc_conf_t *hlcf);

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

/* X-Hypic-Mode, X-Hypic-Node and X-Hypic-Segments of an answer. */
ngx_int_t ngx_http_hypic_add_headers(ngx_http_request_t *r,
    ngx_http_hypic_ctx_t *ctx);


#endif /* _NGX_HTTP_HYPIC_RESPONSE_H_INCLUDED_ */
