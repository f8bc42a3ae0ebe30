
/*
 * HYPIC serve: server-sent events (see ngx_http_hypic_sse.h).
 */


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include "ngx_http_hypic_module.h"
#include "ngx_http_hypic_response.h"
#include "ngx_http_hypic_json.h"
#include "ngx_http_hypic_sse.h"


static ngx_chain_t *ngx_http_hypic_sse_buf(ngx_http_request_t *r,
    ngx_http_hypic_ctx_t *ctx, size_t size);
static ngx_int_t ngx_http_hypic_sse_send(ngx_http_request_t *r,
    ngx_http_hypic_ctx_t *ctx, ngx_chain_t *cl);
static void ngx_http_hypic_sse_writer(ngx_http_request_t *r);
static void ngx_http_hypic_sse_heartbeat(ngx_event_t *ev);


static ngx_str_t  ngx_http_hypic_sse_type = ngx_string("text/event-stream");

static ngx_str_t  ngx_http_hypic_finish_stop = ngx_string("stop");
static ngx_str_t  ngx_http_hypic_finish_length = ngx_string("length");

static u_char  ngx_http_hypic_sse_done[] = "data: [DONE]\n\n";
static u_char  ngx_http_hypic_sse_ping[] = ": ping\n\n";


ngx_int_t
ngx_http_hypic_sse_start(ngx_http_request_t *r, ngx_http_hypic_ctx_t *ctx)
{
    ngx_int_t                   rc;
    ngx_str_t                   role;
    ngx_uint_t                  i;
    ngx_table_elt_t            *h;
    ngx_http_hypic_loc_conf_t  *hlcf;

    hlcf = ngx_http_get_module_loc_conf(r, ngx_http_hypic_module);

    r->headers_out.status = NGX_HTTP_OK;
    r->headers_out.content_type = ngx_http_hypic_sse_type;
    r->headers_out.content_type_len = ngx_http_hypic_sse_type.len;
    r->headers_out.content_type_lowcase = NULL;

    ngx_http_clear_content_length(r);
    ngx_http_clear_accept_ranges(r);

    h = ngx_list_push(&r->headers_out.headers);
    if (h == NULL) {
        return NGX_ERROR;
    }

    h->hash = 1;
    ngx_str_set(&h->key, "Cache-Control");
    ngx_str_set(&h->value, "no-cache");

    /* a proxy in front of us must not hold the events back either */

    h = ngx_list_push(&r->headers_out.headers);
    if (h == NULL) {
        return NGX_ERROR;
    }

    h->hash = 1;
    ngx_str_set(&h->key, "X-Accel-Buffering");
    ngx_str_set(&h->value, "no");

    if (ngx_http_hypic_add_headers(r, ctx) != NGX_OK) {
        return NGX_ERROR;
    }

    rc = ngx_http_send_header(r);

    if (rc == NGX_ERROR || rc > NGX_OK || r->header_only) {
        return rc;
    }

    if (hlcf->heartbeat) {
        ctx->out.heartbeat.handler = ngx_http_hypic_sse_heartbeat;
        ctx->out.heartbeat.data = r;
        ctx->out.heartbeat.log = r->connection->log;

        /* the request timeout keeps an exiting worker alive, not this */
        ctx->out.heartbeat.cancelable = 1;

        ngx_add_timer(&ctx->out.heartbeat, hlcf->heartbeat);
    }

    if (ctx->in.endpoint != NGX_HTTP_HYPIC_CHAT) {
        return NGX_OK;
    }

    ngx_str_set(&role, "{\"role\":\"assistant\",\"content\":\"\"}");

    /* each choice begins with its own */

    for (i = 0; i < ctx->out.n; i++) {
        rc = ngx_http_hypic_sse_chunk(r, ctx, i, &role, NULL, 0, NULL, NULL);

        if (rc == NGX_ERROR) {
            return rc;
        }
    }

    return NGX_OK;
}


ngx_int_t
ngx_http_hypic_sse_finish(ngx_http_request_t *r, ngx_http_hypic_ctx_t *ctx)
{
    u_char       *p;
    size_t        len;
    ngx_buf_t    *b;
    ngx_chain_t  *cl;

    len = sizeof("data: \"choices\":[],}\n\n") - 1 + ctx->out.head.len
          + NGX_HTTP_HYPIC_USAGE_LEN + sizeof(ngx_http_hypic_sse_done) - 1;

    cl = ngx_http_hypic_sse_buf(r, ctx, len);
    if (cl == NULL) {
        return NGX_ERROR;
    }

    b = cl->buf;
    p = b->last;

    if (ctx->in.include_usage) {
        p = ngx_cpymem(p, "data: ", sizeof("data: ") - 1);
        p = ngx_cpymem(p, ctx->out.head.data, ctx->out.head.len);
        p = ngx_cpymem(p, "\"choices\":[],", sizeof("\"choices\":[],") - 1);
        p = ngx_http_hypic_usage(p, &ctx->out.final);
        p = ngx_cpymem(p, "}\n\n", sizeof("}\n\n") - 1);
    }

    p = ngx_cpymem(p, ngx_http_hypic_sse_done,
                   sizeof(ngx_http_hypic_sse_done) - 1);

    b->last = p;
    b->last_buf = (r == r->main) ? 1 : 0;
    b->last_in_chain = 1;

    return ngx_http_hypic_sse_send(r, ctx, cl);
}


ngx_int_t
ngx_http_hypic_sse_error(ngx_http_request_t *r, ngx_http_hypic_ctx_t *ctx,
    const char *type, const char *code, u_char *msg, size_t len)
{
    u_char       *p;
    size_t        size;
    ngx_buf_t    *b;
    ngx_chain_t  *cl;

    size = sizeof("data: {\"error\":{\"message\":\"\",\"type\":\"\","
                  "\"param\":null,\"code\":\"\"}}\n\n") - 1
           + ngx_http_hypic_json_escape_len(msg, len)
           + ngx_strlen(type) + ngx_strlen(code);

    cl = ngx_http_hypic_sse_buf(r, ctx, size);
    if (cl == NULL) {
        return NGX_ERROR;
    }

    b = cl->buf;

    p = ngx_cpymem(b->last, "data: {\"error\":{\"message\":\"",
                   sizeof("data: {\"error\":{\"message\":\"") - 1);
    p = ngx_http_hypic_json_escape(p, msg, len);
    p = ngx_sprintf(p, "\",\"type\":\"%s\",\"param\":null,\"code\":\"%s\"}}"
                    "\n\n", type, code);

    b->last = p;
    b->last_buf = (r == r->main) ? 1 : 0;
    b->last_in_chain = 1;

    return ngx_http_hypic_sse_send(r, ctx, cl);
}


u_char *
ngx_http_hypic_usage(u_char *p, hp_ipc_final_t *final)
{
    p = ngx_sprintf(p, "\"usage\":{\"prompt_tokens\":%uD,"
                    "\"completion_tokens\":%uD,\"total_tokens\":%uL,"
                    "\"prompt_tokens_details\":{\"cached_tokens\":%uD",
                    final->prompt_tokens, final->completion_tokens,
                    (uint64_t) final->prompt_tokens + final->completion_tokens,
                    final->cached_tokens);

    /* of the cached tokens, those the engine pulled from a peer's cache
     * (another node prefilled them): not OpenAI's, so only when there are */

    if (final->fetched_tokens) {
        p = ngx_sprintf(p, ",\"fetched_tokens\":%uD", final->fetched_tokens);
    }

    *p++ = '}';

    /* speculative decoding, in the fields OpenAI gives predicted outputs:
     * drafted tokens that were accepted, and those that were not */

    if (final->draft_tokens) {
        p = ngx_sprintf(p, ",\"completion_tokens_details\":"
                        "{\"accepted_prediction_tokens\":%uD,"
                        "\"rejected_prediction_tokens\":%uD}",
                        final->accepted_tokens,
                        final->draft_tokens - final->accepted_tokens);
    }

    *p++ = '}';

    return p;
}


ngx_str_t *
ngx_http_hypic_finish_name(ngx_uint_t finish)
{
    return (finish == HP_IPC_FINISH_STOP)
           ? &ngx_http_hypic_finish_stop : &ngx_http_hypic_finish_length;
}


ngx_int_t
ngx_http_hypic_sse_chunk(ngx_http_request_t *r, ngx_http_hypic_ctx_t *ctx,
    ngx_uint_t index, ngx_str_t *delta, u_char *text, size_t len,
    ngx_str_t *logprobs, ngx_str_t *finish)
{
    u_char       *p;
    size_t        size;
    ngx_buf_t    *b;
    ngx_chain_t  *cl;

    size = sizeof("data: \"choices\":[{\"index\":,\"delta\":{\"content\":\""
                  "\"},\"logprobs\":null,\"finish_reason\":\"\"}]}\n\n") - 1
           + NGX_INT_T_LEN + ctx->out.head.len
           + ngx_http_hypic_json_escape_len(text, len)
           + (delta ? delta->len : 0) + (finish ? finish->len : 0)
           + (logprobs ? logprobs->len : 0);

    cl = ngx_http_hypic_sse_buf(r, ctx, size);
    if (cl == NULL) {
        return NGX_ERROR;
    }

    b = cl->buf;

    p = ngx_cpymem(b->last, "data: ", sizeof("data: ") - 1);
    p = ngx_cpymem(p, ctx->out.head.data, ctx->out.head.len);
    p = ngx_sprintf(p, "\"choices\":[{\"index\":%ui,", index);

    if (ctx->in.endpoint == NGX_HTTP_HYPIC_CHAT) {
        p = ngx_cpymem(p, "\"delta\":", sizeof("\"delta\":") - 1);

        if (delta) {
            p = ngx_cpymem(p, delta->data, delta->len);

        } else {
            p = ngx_cpymem(p, "{\"content\":\"",
                           sizeof("{\"content\":\"") - 1);
            p = ngx_http_hypic_json_escape(p, text, len);
            p = ngx_cpymem(p, "\"}", sizeof("\"}") - 1);
        }

    } else {
        p = ngx_cpymem(p, "\"text\":\"", sizeof("\"text\":\"") - 1);
        p = ngx_http_hypic_json_escape(p, text, len);
        *p++ = '"';
    }

    p = ngx_cpymem(p, ",\"logprobs\":", sizeof(",\"logprobs\":") - 1);

    if (logprobs && logprobs->len) {
        p = ngx_cpymem(p, logprobs->data, logprobs->len);

    } else {
        p = ngx_cpymem(p, "null", sizeof("null") - 1);
    }

    p = ngx_cpymem(p, ",\"finish_reason\":", sizeof(",\"finish_reason\":") - 1);

    if (finish) {
        *p++ = '"';
        p = ngx_cpymem(p, finish->data, finish->len);
        *p++ = '"';

    } else {
        p = ngx_cpymem(p, "null", sizeof("null") - 1);
    }

    p = ngx_cpymem(p, "}]}\n\n", sizeof("}]}\n\n") - 1);

    b->last = p;

    return ngx_http_hypic_sse_send(r, ctx, cl);
}


/*
 * A buffer of at least size bytes: one the client has taken already if
 * there is one, so that a long stream reuses a few buffers instead of
 * filling the request pool with one per event.
 */

static ngx_chain_t *
ngx_http_hypic_sse_buf(ngx_http_request_t *r, ngx_http_hypic_ctx_t *ctx,
    size_t size)
{
    u_char       *start, *end;
    ngx_buf_t    *b;
    ngx_chain_t  *cl;

    cl = ngx_chain_get_free_buf(r->pool, &ctx->out.free);
    if (cl == NULL) {
        return NULL;
    }

    b = cl->buf;

    start = b->start;
    end = b->end;

    if (start == NULL || (size_t) (end - start) < size) {
        size = ngx_max(size, 512);

        start = ngx_palloc(r->pool, size);
        if (start == NULL) {
            return NULL;
        }

        end = start + size;
    }

    ngx_memzero(b, sizeof(ngx_buf_t));

    b->start = start;
    b->end = end;
    b->pos = start;
    b->last = start;
    b->temporary = 1;
    b->flush = 1;
    b->tag = (ngx_buf_tag_t) &ngx_http_hypic_module;

    return cl;
}


static ngx_int_t
ngx_http_hypic_sse_send(ngx_http_request_t *r, ngx_http_hypic_ctx_t *ctx,
    ngx_chain_t *cl)
{
    ngx_int_t                  rc;
    ngx_uint_t                 last;
    ngx_event_t               *wev;
    ngx_connection_t          *c;
    ngx_http_core_loc_conf_t  *clcf;

    c = r->connection;
    last = cl->buf->last_buf;

    rc = ngx_http_output_filter(r, cl);

    ngx_chain_update_chains(r->pool, &ctx->out.free, &ctx->out.busy, &cl,
                            (ngx_buf_tag_t) &ngx_http_hypic_module);

    if (rc == NGX_ERROR || last || !c->buffered) {
        return rc;
    }

    /* the client reads slowly: the rest goes out when it can take it */

    clcf = ngx_http_get_module_loc_conf(r, ngx_http_core_module);

    wev = c->write;

    r->write_event_handler = ngx_http_hypic_sse_writer;

    if (!wev->delayed && !wev->timer_set) {
        ngx_add_timer(wev, clcf->send_timeout);
    }

    if (ngx_handle_write_event(wev, clcf->send_lowat) != NGX_OK) {
        return NGX_ERROR;
    }

    return rc;
}


static void
ngx_http_hypic_sse_writer(ngx_http_request_t *r)
{
    ngx_int_t                  rc;
    ngx_event_t               *wev;
    ngx_connection_t          *c;
    ngx_http_core_loc_conf_t  *clcf;

    c = r->connection;
    wev = c->write;

    if (wev->timedout) {
        ngx_log_error(NGX_LOG_INFO, c->log, NGX_ETIMEDOUT,
                      "client timed out");
        c->timedout = 1;
        ngx_http_finalize_request(r, NGX_HTTP_REQUEST_TIME_OUT);
        return;
    }

    rc = ngx_http_output_filter(r, NULL);

    if (rc == NGX_ERROR) {
        ngx_http_finalize_request(r, NGX_ERROR);
        return;
    }

    clcf = ngx_http_get_module_loc_conf(r, ngx_http_core_module);

    if (c->buffered) {
        if (!wev->delayed && !wev->timer_set) {
            ngx_add_timer(wev, clcf->send_timeout);
        }

        if (ngx_handle_write_event(wev, clcf->send_lowat) != NGX_OK) {
            ngx_http_finalize_request(r, NGX_ERROR);
        }

        return;
    }

    if (wev->timer_set) {
        ngx_del_timer(wev);
    }

    r->write_event_handler = ngx_http_request_empty_handler;
}


static void
ngx_http_hypic_sse_heartbeat(ngx_event_t *ev)
{
    ngx_int_t                   rc;
    ngx_chain_t                *cl;
    ngx_connection_t           *c;
    ngx_http_request_t         *r;
    ngx_http_hypic_ctx_t       *ctx;
    ngx_http_hypic_loc_conf_t  *hlcf;

    r = ev->data;
    c = r->connection;

    ctx = ngx_http_get_module_ctx(r, ngx_http_hypic_module);
    hlcf = ngx_http_get_module_loc_conf(r, ngx_http_hypic_module);

    cl = ngx_http_hypic_sse_buf(r, ctx, sizeof(ngx_http_hypic_sse_ping) - 1);
    if (cl == NULL) {
        ngx_http_finalize_request(r, NGX_ERROR);
        ngx_http_run_posted_requests(c);
        return;
    }

    cl->buf->last = ngx_cpymem(cl->buf->last, ngx_http_hypic_sse_ping,
                               sizeof(ngx_http_hypic_sse_ping) - 1);

    rc = ngx_http_hypic_sse_send(r, ctx, cl);

    if (rc == NGX_ERROR) {
        ngx_http_finalize_request(r, NGX_ERROR);

    } else {
        ngx_add_timer(ev, hlcf->heartbeat);
    }

    ngx_http_run_posted_requests(c);
}
