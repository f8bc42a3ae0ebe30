
/*
 * HYPIC serve: the answer to a hypic_pass request.
 *
 * The engine's records come back through ngx_http_hypic_deliver():
 * streamed as server-sent events (ngx_http_hypic_sse.c), or gathered
 * into one JSON answer. An engine error is mapped to HTTP once, by its
 * status (hp_ipc_error()).
 */


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include "ngx_http_hypic_module.h"
#include "ngx_http_hypic_choice.h"
#include "ngx_http_hypic_engine.h"
#include "ngx_http_hypic_json.h"
#include "ngx_http_hypic_response.h"
#include "ngx_http_hypic_sse.h"


static ngx_str_t *ngx_http_hypic_decode_name(ngx_uint_t form);
static void ngx_http_hypic_first_token(ngx_http_request_t *r,
    ngx_http_hypic_ctx_t *ctx);
static ngx_int_t ngx_http_hypic_respond(ngx_http_request_t *r,
    ngx_http_hypic_ctx_t *ctx);


/*
 * The id, and the JSON every event and answer starts with:
 * {"id":"ID","object":"OBJECT","created":T,"model":"MODEL",
 */

ngx_int_t
ngx_http_hypic_response_init(ngx_http_request_t *r,
    ngx_http_hypic_ctx_t *ctx, ngx_http_hypic_loc_conf_t *hlcf)
{
    u_char      *p;
    size_t       len;
    ngx_str_t   *model;
    const char  *object, *prefix;

    ctx->out.created = ngx_time();

    if (ctx->in.endpoint == NGX_HTTP_HYPIC_CHAT) {
        prefix = "chatcmpl-";
        object = ctx->in.stream ? "chat.completion.chunk" : "chat.completion";

    } else {
        prefix = "cmpl-";
        object = "text_completion";
    }

    ctx->out.id.data = ngx_pnalloc(r->pool, sizeof("chatcmpl-") - 1 + 24);
    if (ctx->out.id.data == NULL) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    p = ngx_sprintf(ctx->out.id.data, "%s%08xD%08xD%08xD", prefix,
                    (uint32_t) ngx_random(), (uint32_t) ngx_random(),
                    (uint32_t) (r->connection->number ^ ngx_pid));

    ctx->out.id.len = p - ctx->out.id.data;

    ngx_cpystrn((u_char *) ctx->in.req.id, ctx->out.id.data,
                ngx_min(ctx->out.id.len + 1, HP_IPC_ID_BYTES));

    model = &hlcf->engine->model;

    len = sizeof("{\"id\":\"\",\"object\":\"\",\"created\":,\"model\":\"\",")
          - 1 + ctx->out.id.len + ngx_strlen(object) + NGX_TIME_T_LEN
          + ngx_http_hypic_json_escape_len(model->data, model->len);

    p = ngx_pnalloc(r->pool, len);
    if (p == NULL) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    ctx->out.head.data = p;

    p = ngx_sprintf(p, "{\"id\":\"%V\",\"object\":\"%s\",\"created\":%T,"
                    "\"model\":\"", &ctx->out.id, object, ctx->out.created);
    p = ngx_http_hypic_json_escape(p, model->data, model->len);
    p = ngx_cpymem(p, "\",", 2);

    ctx->out.head.len = p - ctx->out.head.data;

    return NGX_OK;
}


ngx_int_t
ngx_http_hypic_deliver(ngx_http_request_t *r, ngx_uint_t type, u_char *data,
    size_t len)
{
    ngx_int_t               rc;
    ngx_uint_t              level;
    ngx_http_hypic_ctx_t   *ctx;
    const hp_ipc_error_t   *e;

    ctx = ngx_http_get_module_ctx(r, ngx_http_hypic_module);

    switch (type) {

    case HP_IPC_REC_START:

        if (len != sizeof(hp_ipc_start_t) || ctx->out.started) {
            break;
        }

        ngx_memcpy(&ctx->out.start, data, len);
        ctx->out.started = 1;

        if (!ctx->in.stream) {
            return NGX_OK;
        }

        rc = ngx_http_hypic_sse_start(r, ctx);

        if (rc == NGX_ERROR || rc > NGX_OK) {
            ngx_http_hypic_engine_detach(ctx);
            ngx_http_finalize_request(r, rc);
            return NGX_DONE;
        }

        return NGX_OK;

    case HP_IPC_REC_TEXT:
    case HP_IPC_REC_TOKEN:
    case HP_IPC_REC_END:

        if (!ctx->out.started) {
            break;
        }

        if (!ctx->out.ttft_set && type == HP_IPC_REC_TEXT
            && len > sizeof(hp_ipc_text_t))
        {
            ngx_http_hypic_first_token(r, ctx);
        }

        rc = ngx_http_hypic_choices_record(r, ctx, type, data, len);

        if (rc == NGX_DECLINED) {
            break;
        }

        if (rc == NGX_ERROR) {
            ngx_http_hypic_engine_detach(ctx);
            ngx_http_finalize_request(r, NGX_ERROR);
            return NGX_DONE;
        }

        return NGX_OK;

    case HP_IPC_REC_FINAL:

        if (len != sizeof(hp_ipc_final_t)) {
            break;
        }

        ngx_memcpy(&ctx->out.final, data, len);
        ctx->out.final.code[sizeof(ctx->out.final.code) - 1] = '\0';
        ctx->out.final.message[sizeof(ctx->out.final.message) - 1] = '\0';

        ctx->out.finished = 1;
        ctx->out.succeeded = (ctx->out.final.status == 0
                              && ctx->out.final.finish
                                 != HP_IPC_FINISH_ERROR);

        /* what START would have said, once, for the headers and the log */

        if (!ctx->out.started) {
            ctx->out.start.mode = ctx->out.final.mode;
            ctx->out.start.decode = ctx->out.final.decode;
            ctx->out.start.segs_hit = ctx->out.final.segs_hit;
            ctx->out.start.segs_total = ctx->out.final.segs_total;
        }

        /* an answer without text has its first "token" at the end */

        if (ctx->out.succeeded && !ctx->out.ttft_set) {
            ngx_http_hypic_first_token(r, ctx);
        }

        /* the slot is free again before the client has its last byte */

        ngx_http_hypic_engine_detach(ctx);

        if (ctx->out.final.status != 0
            || ctx->out.final.finish == HP_IPC_FINISH_ERROR)
        {
            e = hp_ipc_error(ctx->out.final.status);
            level = (e->http >= NGX_HTTP_INTERNAL_SERVER_ERROR)
                    ? NGX_LOG_ERR : NGX_LOG_INFO;

            ngx_log_error(level, r->connection->log, 0,
                          "hypic: engine refused %V: %s (%s)", &ctx->out.id,
                          ctx->out.final.message, e->code);

            ngx_http_hypic_fail(r, e->http, e->type, e->code, "%s",
                                ctx->out.final.message);
            return NGX_DONE;
        }

        if (!ctx->in.stream) {
            rc = ngx_http_hypic_choices_end(r, ctx);

            ngx_http_finalize_request(r, rc == NGX_OK
                                         ? ngx_http_hypic_respond(r, ctx)
                                         : NGX_HTTP_INTERNAL_SERVER_ERROR);
            return NGX_DONE;
        }

        if (!r->header_sent) {
            rc = ngx_http_hypic_sse_start(r, ctx);

            if (rc == NGX_ERROR || rc > NGX_OK) {
                ngx_http_finalize_request(r, rc);
                return NGX_DONE;
            }
        }

        rc = ngx_http_hypic_choices_end(r, ctx);

        ngx_http_finalize_request(r, rc == NGX_OK
                                     ? ngx_http_hypic_sse_finish(r, ctx)
                                     : NGX_ERROR);
        return NGX_DONE;
    }

    ngx_log_error(NGX_LOG_ALERT, r->connection->log, 0,
                  "hypic: unexpected record %ui (%uz bytes) from the engine "
                  "for %V", type, len, &ctx->out.id);

    ngx_http_hypic_fail(r, NGX_HTTP_BAD_GATEWAY, NGX_HTTP_HYPIC_SERVER_ERROR,
                        "engine_error", "The engine sent a malformed answer");

    return NGX_DONE;
}


void
ngx_http_hypic_fail(ngx_http_request_t *r, ngx_uint_t status,
    const char *type, const char *code, const char *fmt, ...)
{
    u_char                *last;
    u_char                 msg[NGX_MAX_ERROR_STR];
    va_list                args;
    ngx_int_t              rc;
    ngx_http_hypic_ctx_t  *ctx;

    ctx = ngx_http_get_module_ctx(r, ngx_http_hypic_module);

    ngx_http_hypic_engine_detach(ctx);

    if (status >= NGX_HTTP_INTERNAL_SERVER_ERROR) {
        ctx->out.engine_error = 1;
    }

    va_start(args, fmt);
    last = ngx_vslprintf(msg, msg + sizeof(msg), fmt, args);
    va_end(args);

    if (r->header_sent) {
        rc = ngx_http_hypic_sse_error(r, ctx, type, code, msg, last - msg);

    } else {
        rc = ngx_http_hypic_send_error(r, status, type, code, NULL, "%*s",
                                       (size_t) (last - msg), msg);
    }

    ngx_http_finalize_request(r, rc);
}


ngx_int_t
ngx_http_hypic_add_headers(ngx_http_request_t *r, ngx_http_hypic_ctx_t *ctx)
{
    u_char           *p;
    ngx_table_elt_t  *h;

    h = ngx_list_push(&r->headers_out.headers);
    if (h == NULL) {
        return NGX_ERROR;
    }

    h->hash = 1;
    ngx_str_set(&h->key, "X-Hypic-Mode");
    h->value = *ngx_http_hypic_mode_name(ctx->out.start.mode);

    h = ngx_list_push(&r->headers_out.headers);
    if (h == NULL) {
        return NGX_ERROR;
    }

    h->hash = 1;
    ngx_str_set(&h->key, "X-Hypic-Node");
    h->value = ctx->eng.node;

    h = ngx_list_push(&r->headers_out.headers);
    if (h == NULL) {
        return NGX_ERROR;
    }

    h->hash = 1;
    ngx_str_set(&h->key, "X-Hypic-Decode");
    h->value = *ngx_http_hypic_decode_name(ctx->out.start.decode);

    p = ngx_pnalloc(r->pool, 2 * NGX_INT32_LEN + 1);
    if (p == NULL) {
        return NGX_ERROR;
    }

    h = ngx_list_push(&r->headers_out.headers);
    if (h == NULL) {
        return NGX_ERROR;
    }

    h->hash = 1;
    ngx_str_set(&h->key, "X-Hypic-Segments");
    h->value.data = p;
    h->value.len = ngx_sprintf(p, "%uD/%uD", ctx->out.start.segs_hit,
                               ctx->out.start.segs_total)
                   - p;

    return NGX_OK;
}


/* the X-Hypic-Decode value of a form the engine reports (HP_IPC_DECODE_*) */

static ngx_str_t *
ngx_http_hypic_decode_name(ngx_uint_t form)
{
    static ngx_str_t  names[] = {
        ngx_string("recurrent"),           /* (none reported) */
        ngx_string("recurrent"),           /* HP_IPC_DECODE_RECURRENT */
        ngx_string("chunkwise"),           /* HP_IPC_DECODE_CHUNKWISE */
        ngx_string("auto"),                /* HP_IPC_DECODE_AUTO */
        ngx_string("kv-only")              /* HP_IPC_DECODE_KVONLY */
    };

    return &names[form <= HP_IPC_DECODE_KVONLY ? form : 0];
}


/* time to first token: from the request's first byte, as $request_time */

static void
ngx_http_hypic_first_token(ngx_http_request_t *r, ngx_http_hypic_ctx_t *ctx)
{
    ngx_time_t  *tp;

    tp = ngx_timeofday();

    ctx->out.ttft = (ngx_msec_int_t) ((tp->sec - r->start_sec) * 1000
                                  + (tp->msec - r->start_msec));
    ctx->out.ttft = ngx_max(ctx->out.ttft, 0);
    ctx->out.ttft_set = 1;
}


/* HEAD"choices":[..],"usage":{..}} */

static ngx_int_t
ngx_http_hypic_respond(ngx_http_request_t *r, ngx_http_hypic_ctx_t *ctx)
{
    u_char     *p;
    size_t      len;
    ngx_str_t   body, choices;

    if (ngx_http_hypic_choices_json(r, ctx, &choices) != NGX_OK) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    len = ctx->out.head.len + choices.len + 2 + NGX_HTTP_HYPIC_USAGE_LEN;

    p = ngx_pnalloc(r->pool, len);
    if (p == NULL) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    body.data = p;

    p = ngx_cpymem(p, ctx->out.head.data, ctx->out.head.len);
    p = ngx_cpymem(p, choices.data, choices.len);
    *p++ = ',';
    p = ngx_http_hypic_usage(p, &ctx->out.final);
    *p++ = '}';

    body.len = p - body.data;

    if (ngx_http_hypic_add_headers(r, ctx) != NGX_OK) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    return ngx_http_hypic_send_json(r, NGX_HTTP_OK, &body);
}
