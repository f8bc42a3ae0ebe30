
/*
 * HYPIC serve: tools in chat completions.
 *
 * The request's tools, tool_choice, parallel_tool_calls and
 * chat_template_kwargs are checked here and go to the engine in the body,
 * whose chat template renders them. The model's answer is scanned for
 * its tool calls (engine/contract/hp_tool.h): they become
 * message.tool_calls, or delta.tool_calls chunks when streamed, and
 * finish_reason "tool_calls"; a call that does not parse is content.
 * tool_choice "required" and a named function are enforced by the
 * engine's decoding (ngx_http_hypic_format.c); the named tool is also
 * the only one the template sees.
 */


#ifndef _NGX_HTTP_HYPIC_TOOLS_H_INCLUDED_
#define _NGX_HTTP_HYPIC_TOOLS_H_INCLUDED_


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include <cJSON.h>

#include "ngx_http_hypic_module.h"
#include "ngx_http_hypic_request.h"


/* The chat request's tool fields, and those of its messages; what the
 * answer needs of them goes to ctx->in (tools, tool_calls, parallel). */
ngx_int_t ngx_http_hypic_tools_check(ngx_http_hypic_ctx_t *ctx,
    cJSON *json, ngx_http_hypic_bad_t *bad);

/* Whether the answer is scanned for calls, with what it needs for that
 * (ctx->out.tools, a scanner per choice: after ngx_http_hypic_choices_init).
 * NGX_OK or NGX_ERROR (no memory). */
ngx_int_t ngx_http_hypic_tools_setup(ngx_http_request_t *r,
    ngx_http_hypic_ctx_t *ctx);

/* Text of choice i from the engine through its scanner: content and
 * calls out, each choice's calls numbered from 0. */
ngx_int_t ngx_http_hypic_tools_text(ngx_http_request_t *r,
    ngx_http_hypic_ctx_t *ctx, ngx_uint_t i, u_char *data, size_t len);

/* The end of choice i: what its scanner held goes out. */
ngx_int_t ngx_http_hypic_tools_end(ngx_http_request_t *r,
    ngx_http_hypic_ctx_t *ctx, ngx_uint_t i);

/* ,"tool_calls":[...] for choice i's non-streamed message, or an empty
 * string */
ngx_str_t *ngx_http_hypic_tools_calls(ngx_http_hypic_ctx_t *ctx,
    ngx_uint_t i);

/* "tool_calls" when choice i stopped after calling tools, else the name
 * of its finish (HP_IPC_FINISH_*) */
ngx_str_t *ngx_http_hypic_tools_finish(ngx_http_hypic_ctx_t *ctx,
    ngx_uint_t i, ngx_uint_t finish);


#endif /* _NGX_HTTP_HYPIC_TOOLS_H_INCLUDED_ */
