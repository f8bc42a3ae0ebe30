
/*
 * HYPIC serve: server-sent events in the OpenAI streaming shapes.
 *
 *   data: {"id":..,"object":"text_completion",..,"choices":[..]}\n\n
 *   data: [DONE]\n\n
 *   : ping\n\n                       (a comment: heartbeat)
 *
 * Every event is flushed as it is written. The functions return what
 * ngx_http_output_filter() returns (NGX_OK, NGX_AGAIN, NGX_ERROR); a
 * client that reads slowly is served by a write handler, never waited on.
 */


#ifndef _NGX_HTTP_HYPIC_SSE_H_INCLUDED_
#define _NGX_HTTP_HYPIC_SSE_H_INCLUDED_


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include "ngx_http_hypic_module.h"


/* the longest "usage":{...} object ngx_http_hypic_usage() writes */
#define NGX_HTTP_HYPIC_USAGE_LEN                                              \
    (sizeof("\"usage\":{\"prompt_tokens\":,\"completion_tokens\":,"           \
            "\"total_tokens\":,\"prompt_tokens_details\":"                    \
            "{\"cached_tokens\":,\"fetched_tokens\":},"                       \
            "\"completion_tokens_details\":"                                  \
            "{\"accepted_prediction_tokens\":,"                               \
            "\"rejected_prediction_tokens\":}}") - 1 + 7 * NGX_INT64_LEN)


/*
 * Status 200, text/event-stream, the X-Hypic-* headers, then for chat the
 * first chunk of each choice (the assistant role); starts the
 * hypic_heartbeat timer.
 */
ngx_int_t ngx_http_hypic_sse_start(ngx_http_request_t *r,
    ngx_http_hypic_ctx_t *ctx);

/*
 * data: HEAD"choices":[{"index":INDEX,"delta":DELTA,"logprobs":LOGPROBS,
 *       "finish_reason":FINISH}]}
 *
 * For chat the delta is DELTA, or {"content":"TEXT"}; for completions it
 * is "text":"TEXT" instead. LOGPROBS NULL or empty, FINISH NULL: null.
 */
ngx_int_t ngx_http_hypic_sse_chunk(ngx_http_request_t *r,
    ngx_http_hypic_ctx_t *ctx, ngx_uint_t index, ngx_str_t *delta,
    u_char *text, size_t len, ngx_str_t *logprobs, ngx_str_t *finish);

/* The usage chunk if the client asked for it
 * (stream_options.include_usage), data: [DONE] and the end; the choices
 * have had their last chunks (ngx_http_hypic_choices_end). */
ngx_int_t ngx_http_hypic_sse_finish(ngx_http_request_t *r,
    ngx_http_hypic_ctx_t *ctx);

/* An error event in OpenAI's error shape, then the end (no [DONE]). */
ngx_int_t ngx_http_hypic_sse_error(ngx_http_request_t *r,
    ngx_http_hypic_ctx_t *ctx, const char *type, const char *code,
    u_char *msg, size_t len);

/* Writes "usage":{...} for a FINAL record; returns the end. */
u_char *ngx_http_hypic_usage(u_char *p, hp_ipc_final_t *final);

/* "stop" or "length" of an HP_IPC_FINISH_* */
ngx_str_t *ngx_http_hypic_finish_name(ngx_uint_t finish);


#endif /* _NGX_HTTP_HYPIC_SSE_H_INCLUDED_ */
