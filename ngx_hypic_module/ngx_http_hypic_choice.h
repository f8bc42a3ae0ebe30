
/*
 * HYPIC serve: the choices of an answer (n of them) and their
 * log-probabilities, in OpenAI's shapes.
 *
 * The engine sends each choice's text (TEXT), its tokens'
 * log-probabilities (TOKEN, before the text they start) and its end
 * (END) under the choice's index. Streamed, every TEXT becomes a chunk of
 * that choice with the log-probabilities gathered since the last one, and
 * END the choice's chunk with its finish_reason; gathered, they make the
 * "choices" array of the answer. With tools, each choice's text goes
 * through its own tool call scanner (ngx_http_hypic_tools.c) first.
 *
 *   chat:        "logprobs":{"content":[{"token":T,"logprob":L,
 *                    "bytes":[..],"top_logprobs":[{"token":T,
 *                    "logprob":L,"bytes":[..]},..]},..],"refusal":null}
 *   completions: "logprobs":{"tokens":[T,..],"token_logprobs":[L,..],
 *                    "top_logprobs":[{T:L,..},..],"text_offset":[N,..]}
 */


#ifndef _NGX_HTTP_HYPIC_CHOICE_H_INCLUDED_
#define _NGX_HTTP_HYPIC_CHOICE_H_INCLUDED_


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include <cJSON.h>

#include "ngx_http_hypic_module.h"
#include "ngx_http_hypic_request.h"


/* a growing piece of JSON or text in the request pool */

typedef struct {
    u_char                     *data;
    size_t                      len;
    size_t                      cap;
} ngx_http_hypic_buf_t;


struct ngx_http_hypic_choice_s {
    ngx_http_hypic_buf_t        text;         /* gathered (not streamed) */

    /* log-probability entries not yet sent, comma-separated: chat's
     * "content"; for completions tokens, token_logprobs, top_logprobs
     * and text_offset */
    ngx_http_hypic_buf_t        lp[4];
    ngx_uint_t                  n_lp;

    ngx_uint_t                  finish;       /* HP_IPC_FINISH_*, at end */
    unsigned                    ended:1;
};


/*
 * The checks of n, logprobs, top_logprobs (chat) and stream_options,
 * which fill ctx->out.n, req.n and req.logprobs: NGX_OK, or NGX_ERROR
 * with bad filled.
 */
ngx_int_t ngx_http_hypic_choices_check(ngx_http_hypic_ctx_t *ctx,
    cJSON *json, ngx_http_hypic_bad_t *bad);

/* The choices of a checked request. NGX_OK or NGX_ERROR (no memory). */
ngx_int_t ngx_http_hypic_choices_init(ngx_http_request_t *r,
    ngx_http_hypic_ctx_t *ctx);

/*
 * A TEXT, TOKEN or END record: NGX_OK, NGX_ERROR (no memory, the client
 * is gone) or NGX_DECLINED (malformed).
 */
ngx_int_t ngx_http_hypic_choices_record(ngx_http_request_t *r,
    ngx_http_hypic_ctx_t *ctx, ngx_uint_t type, u_char *data, size_t len);

/* Content of choice i: gathered, or streamed as its chunk. */
ngx_int_t ngx_http_hypic_choice_text(ngx_http_request_t *r,
    ngx_http_hypic_ctx_t *ctx, ngx_uint_t i, u_char *data, size_t len);

/*
 * A streamed chunk of choice i (ngx_http_hypic_sse_chunk's delta, text
 * and finish) with the log-probabilities gathered since its last one.
 */
ngx_int_t ngx_http_hypic_choice_chunk(ngx_http_request_t *r,
    ngx_http_hypic_ctx_t *ctx, ngx_uint_t i, ngx_str_t *delta,
    u_char *text, size_t len, ngx_str_t *finish);

/*
 * At FINAL: the choices without an END end with the request (their call
 * scanners emptied and, streamed, their last chunks sent).
 */
ngx_int_t ngx_http_hypic_choices_end(ngx_http_request_t *r,
    ngx_http_hypic_ctx_t *ctx);

/* "stop", "length" or "tool_calls" for choice i, once it ended (its
 * END's finish, or the FINAL's) */
ngx_str_t *ngx_http_hypic_choice_finish(ngx_http_hypic_ctx_t *ctx,
    ngx_uint_t i);

/* "choices":[..] of a gathered answer */
ngx_int_t ngx_http_hypic_choices_json(ngx_http_request_t *r,
    ngx_http_hypic_ctx_t *ctx, ngx_str_t *out);


#endif /* _NGX_HTTP_HYPIC_CHOICE_H_INCLUDED_ */
