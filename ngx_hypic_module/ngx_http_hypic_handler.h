
/*
 * HYPIC serve: the content handlers and request lifecycle.
 */


#ifndef _NGX_HTTP_HYPIC_HANDLER_H_INCLUDED_
#define _NGX_HTTP_HYPIC_HANDLER_H_INCLUDED_


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include "ngx_http_hypic_module.h"


/* hypic_pass: the OpenAI API (completions, chat completions, models) */
ngx_int_t ngx_http_hypic_pass_handler(ngx_http_request_t *r);

/* A 405 in JSON with "Allow: allow"; what a content handler returns. */
ngx_int_t ngx_http_hypic_not_allowed(ngx_http_request_t *r, char *allow);

/* Postconfiguration: the log phase counter and the request body filter. */
ngx_int_t ngx_http_hypic_handler_init(ngx_conf_t *cf);

/*
 * Goes on with a request whose Redis lookup is over (ctx->routing.route
 * set): to the local engine, or to the hypic_peer location. Finalizes r
 * as needed; the caller runs the posted requests.
 */
void ngx_http_hypic_routed(ngx_http_request_t *r);

/*
 * Routes a request that waited for its engine's link to come up, as if it
 * had just been read: NGX_DONE, or what a content handler returns.
 */
ngx_int_t ngx_http_hypic_route_again(ngx_http_request_t *r);


#endif /* _NGX_HTTP_HYPIC_HANDLER_H_INCLUDED_ */
