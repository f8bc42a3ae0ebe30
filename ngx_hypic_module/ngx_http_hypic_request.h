
/*
 * HYPIC serve: a hypic_pass request's body, from its bytes to the engine
 * request (ctx->in.req, ctx->in.prompt), or to the reason it is refused.
 */


#ifndef _NGX_HTTP_HYPIC_REQUEST_H_INCLUDED_
#define _NGX_HTTP_HYPIC_REQUEST_H_INCLUDED_


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


/*
 * Reads r's body, checks it and builds ctx's engine request and the
 * answer's fixed parts: NGX_OK, NGX_ERROR with bad filled (an OpenAI
 * error for the client), or NGX_HTTP_INTERNAL_SERVER_ERROR.
 */
ngx_int_t ngx_http_hypic_request_parse(ngx_http_request_t *r,
    ngx_http_hypic_ctx_t *ctx, ngx_http_hypic_bad_t *bad);

/* Fills bad (param and code may be NULL); returns NGX_ERROR. */
ngx_int_t ngx_http_hypic_bad(ngx_http_hypic_bad_t *bad, ngx_uint_t status,
    const char *param, const char *code, const char *fmt, ...);

/*
 * Checks that json's field name, if there and not null, is a number in
 * [min, max] (an integer if integer), and then sets *value (if value is
 * not NULL; else it is left as it was): NGX_OK or NGX_ERROR with bad.
 */
ngx_int_t ngx_http_hypic_check_number(cJSON *json, const char *name,
    double min, double max, ngx_uint_t integer, double *value,
    ngx_http_hypic_bad_t *bad);


#endif /* _NGX_HTTP_HYPIC_REQUEST_H_INCLUDED_ */
