
/*
 * HYPIC serve: structured output.
 *
 * A request's response_format (json_object, json_schema) and, in chat,
 * tool_choice "required" or a named function are enforced by the engine
 * while it decodes (engine/contract/hp_grammar.h, engine/forward/gmask.h).
 * Here they are compiled with the engine's own compiler, so a schema it
 * cannot take is a 400 naming the problem before anything is queued, and
 * the fields that constrain the output go to the engine after the prompt
 * (hp_ipc_request_t.grammar_len).
 */


#ifndef _NGX_HTTP_HYPIC_FORMAT_H_INCLUDED_
#define _NGX_HTTP_HYPIC_FORMAT_H_INCLUDED_


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include <cJSON.h>

#include "ngx_http_hypic_module.h"
#include "ngx_http_hypic_request.h"


/*
 * Checks and compiles json's constraint; sets ctx->grammar to the text
 * the engine compiles (empty: free text). NGX_OK, NGX_ERROR with bad
 * (a 400), or NGX_HTTP_INTERNAL_SERVER_ERROR (no memory).
 */
ngx_int_t ngx_http_hypic_format(ngx_http_request_t *r,
    ngx_http_hypic_ctx_t *ctx, cJSON *json, ngx_http_hypic_bad_t *bad);


#endif /* _NGX_HTTP_HYPIC_FORMAT_H_INCLUDED_ */
