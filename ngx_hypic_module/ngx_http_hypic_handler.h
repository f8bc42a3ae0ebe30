
/*
 * HYPIC serve: the content handlers and request lifecycle.
 */


#ifndef _NGX_HTTP_HYPIC_HANDLER_H_INCLUDED_
#define _NGX_HTTP_HYPIC_HANDLER_H_INCLUDED_


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>


/* hypic_pass: the OpenAI API (completions, chat completions, models) */
ngx_int_t ngx_http_hypic_pass_handler(ngx_http_request_t *r);

/* hypic_health: {"status":"ok","engines":[...]} */
ngx_int_t ngx_http_hypic_health_handler(ngx_http_request_t *r);

/* Postconfiguration: the log phase counter and the request body filter. */
ngx_int_t ngx_http_hypic_handler_init(ngx_conf_t *cf);


#endif /* _NGX_HTTP_HYPIC_HANDLER_H_INCLUDED_ */
