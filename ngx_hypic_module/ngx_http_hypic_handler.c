
/*
 * HYPIC serve: the hypic_pass content handler, the request body limit
 * and the log phase counter.
 *
 * A hypic_pass request reads its body without blocking, checks the JSON,
 * hands the prompt (or, for chat, the body, which the engine renders with
 * the model's chat template) to the engine (ngx_http_hypic_engine.c).
 * The engine's records come back through ngx_http_hypic_deliver():
 * streamed as server-sent events
 * (ngx_http_hypic_sse.c), or gathered into one JSON answer.
 */


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include <cJSON.h>

#include "ngx_http_hypic_module.h"
#include "ngx_http_hypic_choice.h"
#include "ngx_http_hypic_engine.h"
#include "ngx_http_hypic_handler.h"
#include "ngx_http_hypic_json.h"
#include "ngx_http_hypic_metrics.h"
#include "ngx_http_hypic_redis.h"
#include "ngx_http_hypic_sse.h"
#include "ngx_http_hypic_tools.h"
#include "ngx_http_hypic_format.h"


/* OpenAI's default for the legacy completions endpoint */
#define NGX_HTTP_HYPIC_COMPLETION_TOKENS  16


static ngx_uint_t ngx_http_hypic_endpoint(ngx_str_t *uri);
static ngx_int_t ngx_http_hypic_models(ngx_http_request_t *r,
    ngx_http_hypic_loc_conf_t *hlcf);
static ngx_int_t ngx_http_hypic_too_large(ngx_http_request_t *r,
    ngx_http_hypic_loc_conf_t *hlcf);
static void ngx_http_hypic_body_handler(ngx_http_request_t *r);
static ngx_int_t ngx_http_hypic_process(ngx_http_request_t *r);
static ngx_int_t ngx_http_hypic_read_body(ngx_http_request_t *r,
    ngx_str_t *body);
static ngx_int_t ngx_http_hypic_parse(ngx_pool_t *pool, ngx_str_t *body,
    cJSON **json, ngx_http_hypic_bad_t *bad);
static ngx_int_t ngx_http_hypic_refuse_json(ngx_pool_t *pool,
    ngx_http_hypic_json_err_t *err, size_t size, ngx_http_hypic_bad_t *bad);
static ngx_int_t ngx_http_hypic_check_common(ngx_http_hypic_loc_conf_t *hlcf,
    cJSON *json, ngx_http_hypic_bad_t *bad);
static ngx_int_t ngx_http_hypic_check_completion(cJSON *json,
    ngx_http_hypic_bad_t *bad);
static ngx_int_t ngx_http_hypic_check_chat(cJSON *json,
    ngx_http_hypic_bad_t *bad);
static ngx_int_t ngx_http_hypic_check_decode(cJSON *json,
    ngx_http_hypic_bad_t *bad);
static ngx_int_t ngx_http_hypic_decode_form(cJSON *item);
static ngx_str_t *ngx_http_hypic_decode_name(ngx_uint_t form);
static void ngx_http_hypic_build_decode(hp_ipc_request_t *req, cJSON *json);
static ngx_int_t ngx_http_hypic_check_extras(cJSON *json,
    ngx_http_hypic_bad_t *bad);
static ngx_int_t ngx_http_hypic_build(ngx_http_request_t *r,
    ngx_http_hypic_ctx_t *ctx, ngx_http_hypic_loc_conf_t *hlcf, cJSON *json,
    ngx_http_hypic_bad_t *bad);
static ngx_int_t ngx_http_hypic_prompt_completion(ngx_http_request_t *r,
    ngx_http_hypic_ctx_t *ctx, cJSON *json, ngx_http_hypic_bad_t *bad);
static ngx_int_t ngx_http_hypic_prompt_chat(ngx_http_request_t *r,
    ngx_http_hypic_ctx_t *ctx, cJSON *json, ngx_http_hypic_bad_t *bad);
static double ngx_http_hypic_number(cJSON *json, const char *name,
    double dflt);
static ngx_int_t ngx_http_hypic_head(ngx_http_request_t *r,
    ngx_http_hypic_ctx_t *ctx, ngx_http_hypic_loc_conf_t *hlcf);
static ngx_int_t ngx_http_hypic_respond(ngx_http_request_t *r,
    ngx_http_hypic_ctx_t *ctx);
static ngx_uint_t ngx_http_hypic_eval_mode(ngx_http_request_t *r,
    ngx_http_hypic_loc_conf_t *hlcf);
static ngx_int_t ngx_http_hypic_route(ngx_http_request_t *r,
    ngx_http_hypic_ctx_t *ctx, ngx_http_hypic_loc_conf_t *hlcf);
static ngx_table_elt_t *ngx_http_hypic_hop(ngx_http_request_t *r);
static ngx_int_t ngx_http_hypic_to_peer(ngx_http_request_t *r,
    ngx_http_hypic_ctx_t *ctx, ngx_http_hypic_loc_conf_t *hlcf);
static void ngx_http_hypic_first_token(ngx_http_request_t *r,
    ngx_http_hypic_ctx_t *ctx);
static void ngx_http_hypic_cleanup(void *data);
static ngx_int_t ngx_http_hypic_request_body_filter(ngx_http_request_t *r,
    ngx_chain_t *in);
static ngx_int_t ngx_http_hypic_log_handler(ngx_http_request_t *r);


static ngx_http_request_body_filter_pt   ngx_http_next_request_body_filter;


static ngx_str_t  ngx_http_hypic_hop_header = ngx_string("X-Hypic-Hop");


static ngx_str_t  ngx_http_hypic_roles[] = {
    ngx_string("system"),
    ngx_string("developer"),
    ngx_string("user"),
    ngx_string("assistant"),
    ngx_string("tool"),
    ngx_null_string
};


ngx_int_t
ngx_http_hypic_pass_handler(ngx_http_request_t *r)
{
    ngx_int_t                   rc;
    ngx_uint_t                  endpoint;
    ngx_pool_cleanup_t         *cln;
    ngx_http_hypic_ctx_t       *ctx, *before;
    ngx_http_hypic_loc_conf_t  *hlcf;

    hlcf = ngx_http_get_module_loc_conf(r, ngx_http_hypic_module);

    endpoint = ngx_http_hypic_endpoint(&r->uri);

    if (endpoint == NGX_HTTP_HYPIC_UNKNOWN) {
        return ngx_http_hypic_send_error(r, NGX_HTTP_NOT_FOUND,
                                         NGX_HTTP_HYPIC_INVALID_REQUEST,
                                         "unknown_url", NULL,
                                         "Unknown request URL: %V %V",
                                         &r->method_name, &r->uri);
    }

    if (endpoint == NGX_HTTP_HYPIC_MODELS) {
        if (!(r->method & (NGX_HTTP_GET|NGX_HTTP_HEAD))) {
            return ngx_http_hypic_not_allowed(r, "GET, HEAD");
        }

        return ngx_http_hypic_models(r, hlcf);
    }

    if (r->method != NGX_HTTP_POST) {
        return ngx_http_hypic_not_allowed(r, "POST");
    }

    /* refuse early on Content-Length, before a byte of the body is read */

    if (r->headers_in.content_length_n > (off_t) hlcf->max_prompt_bytes) {
        return ngx_http_hypic_too_large(r, hlcf);
    }

    /* here again after an error_page: a peer we sent it to failed */

    before = ngx_http_hypic_get_ctx(r);

    ctx = ngx_pcalloc(r->pool, sizeof(ngx_http_hypic_ctx_t));
    if (ctx == NULL) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    ctx->endpoint = endpoint;
    ctx->peer_failed = (before && before->route == NGX_HTTP_HYPIC_ROUTE_PEER);

    /* also how the ctx is found again after a redirect to hypic_peer */

    cln = ngx_pool_cleanup_add(r->pool, 0);
    if (cln == NULL) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    cln->handler = ngx_http_hypic_cleanup;
    cln->data = ctx;

    ngx_http_set_ctx(r, ctx, ngx_http_hypic_module);

    rc = ngx_http_read_client_request_body(r, ngx_http_hypic_body_handler);

    if (rc >= NGX_HTTP_SPECIAL_RESPONSE) {
        return rc;
    }

    return NGX_DONE;
}


/* the API path is the end of the URI, so any location prefix works */

static ngx_uint_t
ngx_http_hypic_endpoint(ngx_str_t *uri)
{
    ngx_uint_t  i;

    static struct {
        ngx_str_t   suffix;
        ngx_uint_t  endpoint;
    } endpoints[] = {
        { ngx_string("/v1/chat/completions"), NGX_HTTP_HYPIC_CHAT },
        { ngx_string("/v1/completions"), NGX_HTTP_HYPIC_COMPLETIONS },
        { ngx_string("/v1/models"), NGX_HTTP_HYPIC_MODELS },
        { ngx_null_string, NGX_HTTP_HYPIC_UNKNOWN }
    };

    for (i = 0; endpoints[i].suffix.len; i++) {
        if (uri->len >= endpoints[i].suffix.len
            && ngx_strncmp(uri->data + uri->len - endpoints[i].suffix.len,
                           endpoints[i].suffix.data, endpoints[i].suffix.len)
               == 0)
        {
            return endpoints[i].endpoint;
        }
    }

    return NGX_HTTP_HYPIC_UNKNOWN;
}


static ngx_int_t
ngx_http_hypic_models(ngx_http_request_t *r, ngx_http_hypic_loc_conf_t *hlcf)
{
    u_char                      *p;
    size_t                       len;
    ngx_str_t                    body, *model;
    ngx_http_hypic_main_conf_t  *hmcf;

    static u_char  head[] = "{\"object\":\"list\",\"data\":[{\"id\":\"";
    static u_char  tail[] = "\",\"object\":\"model\",\"created\":";
    static u_char  owner[] = ",\"owned_by\":\"hypic\"}]}";

    hmcf = ngx_http_get_module_main_conf(r, ngx_http_hypic_module);

    model = &hlcf->engine->model;

    len = sizeof(head) - 1
          + ngx_http_hypic_json_escape_len(model->data, model->len)
          + sizeof(tail) - 1 + NGX_TIME_T_LEN + sizeof(owner) - 1;

    p = ngx_pnalloc(r->pool, len);
    if (p == NULL) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    body.data = p;

    p = ngx_cpymem(p, head, sizeof(head) - 1);
    p = ngx_http_hypic_json_escape(p, model->data, model->len);
    p = ngx_cpymem(p, tail, sizeof(tail) - 1);
    p = ngx_sprintf(p, "%T", hmcf->created);
    p = ngx_cpymem(p, owner, sizeof(owner) - 1);

    body.len = p - body.data;

    return ngx_http_hypic_send_json(r, NGX_HTTP_OK, &body);
}


ngx_int_t
ngx_http_hypic_not_allowed(ngx_http_request_t *r, char *allow)
{
    ngx_table_elt_t  *h;

    h = ngx_list_push(&r->headers_out.headers);
    if (h == NULL) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    h->hash = 1;
    ngx_str_set(&h->key, "Allow");
    h->value.data = (u_char *) allow;
    h->value.len = ngx_strlen(allow);

    return ngx_http_hypic_send_error(r, NGX_HTTP_NOT_ALLOWED,
                                     NGX_HTTP_HYPIC_INVALID_REQUEST,
                                     "method_not_allowed", NULL,
                                     "Method %V is not allowed for %V, "
                                     "use %s", &r->method_name, &r->uri,
                                     allow);
}


static ngx_int_t
ngx_http_hypic_too_large(ngx_http_request_t *r,
    ngx_http_hypic_loc_conf_t *hlcf)
{
    ngx_log_error(NGX_LOG_INFO, r->connection->log, 0,
                  "hypic: client body is larger than "
                  "hypic_max_prompt_bytes %uz", hlcf->max_prompt_bytes);

    /* no "100 Continue" for a body that is refused anyway */
    r->expect_tested = 1;

    return ngx_http_hypic_send_error(r, NGX_HTTP_REQUEST_ENTITY_TOO_LARGE,
                                     NGX_HTTP_HYPIC_INVALID_REQUEST,
                                     "request_too_large", NULL,
                                     "The request body is larger than "
                                     "%uz bytes", hlcf->max_prompt_bytes);
}


static void
ngx_http_hypic_body_handler(ngx_http_request_t *r)
{
    ngx_int_t  rc;

    rc = ngx_http_hypic_process(r);

    /* NGX_DONE: the engine has it; the body's reference is now ours */

    if (rc == NGX_DONE) {
        return;
    }

    ngx_http_finalize_request(r, rc);
}


static ngx_int_t
ngx_http_hypic_process(ngx_http_request_t *r)
{
    cJSON                      *json;
    ngx_int_t                   rc;
    ngx_str_t                   body;
    ngx_http_hypic_bad_t        bad;
    ngx_http_hypic_ctx_t       *ctx;
    ngx_http_hypic_engine_t    *engine;
    ngx_http_hypic_loc_conf_t  *hlcf;

    ctx = ngx_http_get_module_ctx(r, ngx_http_hypic_module);
    hlcf = ngx_http_get_module_loc_conf(r, ngx_http_hypic_module);

    if (ctx->too_large) {
        return ngx_http_hypic_too_large(r, hlcf);
    }

    if (ngx_http_hypic_read_body(r, &body) != NGX_OK) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    rc = ngx_http_hypic_parse(r->pool, &body, &json, &bad);

    if (rc == NGX_OK) {
        rc = ngx_http_hypic_check_common(hlcf, json, &bad);
    }

    if (rc == NGX_OK) {
        rc = (ctx->endpoint == NGX_HTTP_HYPIC_CHAT)
             ? ngx_http_hypic_check_chat(json, &bad)
             : ngx_http_hypic_check_completion(json, &bad);
    }

    if (rc == NGX_OK && ctx->endpoint == NGX_HTTP_HYPIC_CHAT) {
        rc = ngx_http_hypic_tools_check(json, &bad);

        /* the engine renders the body with the model's chat template */

        ctx->prompt = body;
    }

    if (rc == NGX_OK) {
        rc = ngx_http_hypic_check_extras(json, &bad);
    }

    if (rc == NGX_OK) {
        rc = ngx_http_hypic_choices_check(json,
                                          ctx->endpoint
                                          == NGX_HTTP_HYPIC_CHAT, &bad);
    }

    if (rc == NGX_OK) {
        rc = ngx_http_hypic_format(r, ctx, json, &bad);
    }

    if (rc == NGX_OK) {
        ctx->mode = ngx_http_hypic_eval_mode(r, hlcf);
        ctx->mode_set = 1;
        rc = ngx_http_hypic_build(r, ctx, hlcf, json, &bad);
    }

    if (json) {
        cJSON_Delete(json);
    }

    if (rc == NGX_HTTP_INTERNAL_SERVER_ERROR) {
        return rc;
    }

    if (rc != NGX_OK) {
        ngx_log_error(NGX_LOG_INFO, r->connection->log, 0,
                      "hypic: bad request: %*s",
                      (size_t) (bad.last - bad.msg), bad.msg);

        return ngx_http_hypic_send_error(r, bad.status,
                                         NGX_HTTP_HYPIC_INVALID_REQUEST,
                                         bad.code, bad.param, "%*s",
                                         (size_t) (bad.last - bad.msg),
                                         bad.msg);
    }

    engine = hlcf->engine;

    ngx_log_debug4(NGX_LOG_DEBUG_HTTP, r->connection->log, 0,
                   "hypic: %V for model \"%V\" via \"%V\", mode %ui",
                   &ctx->id, &engine->model, &engine->name, ctx->mode);

    /* a client that goes away cancels its request in the engine */

    r->read_event_handler = ngx_http_test_reading;

    return ngx_http_hypic_route(r, ctx, hlcf);
}


/*
 * Local engine or a peer (hypic_routing): NGX_DONE while Redis is asked
 * (ngx_http_hypic_routed() goes on), or what the local submit returns.
 */

static ngx_int_t
ngx_http_hypic_route(ngx_http_request_t *r, ngx_http_hypic_ctx_t *ctx,
    ngx_http_hypic_loc_conf_t *hlcf)
{
    ngx_int_t                  rc;
    ngx_http_hypic_identity_t  id;

    ctx->route = NGX_HTTP_HYPIC_ROUTE_LOCAL;

    if (ctx->peer_failed) {
        ctx->route = NGX_HTTP_HYPIC_ROUTE_FALLBACK;

    } else if (ngx_http_hypic_hop(r)) {

        /* a peer chose this node: never send it on again */

        ctx->route = NGX_HTTP_HYPIC_ROUTE_HOP;

    } else if (hlcf->routing == NGX_HTTP_HYPIC_ROUTING_AFFINITY
               && hlcf->peer.len)
    {
        rc = ngx_http_hypic_engine_identity(hlcf->engine, &id);

        if (rc == NGX_AGAIN) {

            /* segment ids need the engine's fingerprint: wait for its hello */

            ctx->await_link = 1;

            return ngx_http_hypic_engine_submit(r, ctx);
        }

        rc = (rc == NGX_OK) ? ngx_http_hypic_redis_lookup(r, ctx, &id)
                            : NGX_OK;

        if (rc == NGX_AGAIN) {
            return NGX_DONE;
        }

        if (rc == NGX_ERROR) {
            return NGX_HTTP_INTERNAL_SERVER_ERROR;
        }

        if (rc == NGX_DECLINED) {
            ctx->route = NGX_HTTP_HYPIC_ROUTE_FALLBACK;
        }
    }

    ctx->routed = 1;

    return ngx_http_hypic_engine_submit(r, ctx);
}


ngx_int_t
ngx_http_hypic_route_again(ngx_http_request_t *r)
{
    ngx_http_hypic_ctx_t       *ctx;
    ngx_http_hypic_loc_conf_t  *hlcf;

    ctx = ngx_http_get_module_ctx(r, ngx_http_hypic_module);
    hlcf = ngx_http_get_module_loc_conf(r, ngx_http_hypic_module);

    return ngx_http_hypic_route(r, ctx, hlcf);
}


void
ngx_http_hypic_routed(ngx_http_request_t *r)
{
    ngx_int_t                   rc;
    ngx_http_hypic_ctx_t       *ctx;
    ngx_http_hypic_loc_conf_t  *hlcf;

    ctx = ngx_http_get_module_ctx(r, ngx_http_hypic_module);
    hlcf = ngx_http_get_module_loc_conf(r, ngx_http_hypic_module);

    ctx->routed = 1;

    if (ctx->route == NGX_HTTP_HYPIC_ROUTE_PEER) {
        rc = ngx_http_hypic_to_peer(r, ctx, hlcf);

    } else {
        rc = ngx_http_hypic_engine_submit(r, ctx);
    }

    if (rc != NGX_DONE) {
        ngx_http_finalize_request(r, rc);
    }
}


/* the X-Hypic-Hop header of a request a peer sent here, or NULL */

static ngx_table_elt_t *
ngx_http_hypic_hop(ngx_http_request_t *r)
{
    ngx_uint_t        i;
    ngx_list_part_t  *part;
    ngx_table_elt_t  *h;

    part = &r->headers_in.headers.part;
    h = part->elts;

    for (i = 0; /* void */ ; i++) {

        if (i >= part->nelts) {
            if (part->next == NULL) {
                return NULL;
            }

            part = part->next;
            h = part->elts;
            i = 0;
        }

        if (h[i].key.len == ngx_http_hypic_hop_header.len
            && ngx_strncasecmp(h[i].key.data, ngx_http_hypic_hop_header.data,
                               h[i].key.len)
               == 0)
        {
            return &h[i];
        }
    }
}


/*
 * To the named location of hypic_peer, which proxies to
 * $hypic_peer_addr. The request carries X-Hypic-Hop, so that the peer
 * serves it itself. The module's ctx is cleared by the redirect; the
 * variables find it again through its pool cleanup.
 */

static ngx_int_t
ngx_http_hypic_to_peer(ngx_http_request_t *r, ngx_http_hypic_ctx_t *ctx,
    ngx_http_hypic_loc_conf_t *hlcf)
{
    ngx_table_elt_t  *h;

    h = ngx_list_push(&r->headers_in.headers);
    if (h == NULL) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    h->key = ngx_http_hypic_hop_header;
    h->value = ctx->local_node;
    h->lowcase_key = (u_char *) "x-hypic-hop";
    h->hash = ngx_hash_key(h->lowcase_key, h->key.len);
#if (nginx_version >= 1023000)
    h->next = NULL;
#endif

    ngx_log_debug3(NGX_LOG_DEBUG_HTTP, r->connection->log, 0,
                   "hypic: %V goes to node \"%V\" at %V", &ctx->id,
                   &ctx->peer->id, &ctx->peer->addr);

    (void) ngx_http_named_location(r, &hlcf->peer);

    /* the redirect holds the request now; this was the body's reference */

    ngx_http_finalize_request(r, NGX_DONE);

    return NGX_DONE;
}


/*
 * The ctx of r, also after an internal redirect cleared r->ctx (to
 * hypic_peer, or an error_page): found through the pool cleanup that
 * every ctx registers, the newest first. NULL if r never had one.
 */

ngx_http_hypic_ctx_t *
ngx_http_hypic_get_ctx(ngx_http_request_t *r)
{
    ngx_pool_cleanup_t    *cln;
    ngx_http_hypic_ctx_t  *ctx;

    ctx = ngx_http_get_module_ctx(r, ngx_http_hypic_module);

    if (ctx || !r->internal) {
        return ctx;
    }

    for (cln = r->pool->cleanup; cln; cln = cln->next) {
        if (cln->handler == ngx_http_hypic_cleanup) {
            return cln->data;
        }
    }

    return NULL;
}


static void
ngx_http_hypic_cleanup(void *data)
{
    ngx_http_hypic_ctx_t  *ctx = data;

    ngx_http_hypic_redis_abandon(ctx);
}


/*
 * The body as one piece of memory: zero-copy when nginx kept it in one
 * buffer; otherwise copied, reading the part nginx wrote to its temp file
 * (a local file, at most hypic_max_prompt_bytes). Empty buffers are
 * skipped: a chunked body ends with one whose pos is NULL, and a chain
 * may hold others (an empty chunk, a trailer).
 */

static ngx_int_t
ngx_http_hypic_read_body(ngx_http_request_t *r, ngx_str_t *body)
{
    off_t         len, size;
    u_char       *p;
    ssize_t       n;
    ngx_buf_t    *b, *one;
    ngx_uint_t    nbufs;
    ngx_chain_t  *cl;

    ngx_str_null(body);

    if (r->request_body == NULL) {
        return NGX_OK;
    }

    len = 0;
    nbufs = 0;
    one = NULL;

    for (cl = r->request_body->bufs; cl; cl = cl->next) {
        size = ngx_buf_size(cl->buf);

        if (size > 0) {
            len += size;
            nbufs++;
            one = cl->buf;
        }
    }

    if (len == 0) {
        return NGX_OK;
    }

    if (nbufs == 1 && ngx_buf_in_memory(one)) {
        body->data = one->pos;
        body->len = one->last - one->pos;
        return NGX_OK;
    }

    p = ngx_pnalloc(r->pool, (size_t) len);
    if (p == NULL) {
        return NGX_ERROR;
    }

    body->data = p;

    for (cl = r->request_body->bufs; cl; cl = cl->next) {
        b = cl->buf;
        size = ngx_buf_size(b);

        if (size == 0) {
            continue;
        }

        /* as ngx_buf_size() counts it: memory first, then the file */

        if (ngx_buf_in_memory(b)) {
            p = ngx_cpymem(p, b->pos, (size_t) size);
            continue;
        }

        n = ngx_read_file(b->file, p, (size_t) size, b->file_pos);

        if (n == NGX_ERROR) {
            return NGX_ERROR;
        }

        if (n != (ssize_t) size) {
            ngx_log_error(NGX_LOG_ALERT, r->connection->log, 0,
                          "hypic: read only %z of %O bytes of the body "
                          "from \"%V\"", n, size, &b->file->name);
            return NGX_ERROR;
        }

        p += n;
    }

    body->len = p - body->data;

    return NGX_OK;
}


/*
 * The body is checked strictly before cJSON reads it (see
 * ngx_http_hypic_json_parse.c): what cJSON would lose or change is
 * refused, naming the field, rather than passed on changed.
 */

static ngx_int_t
ngx_http_hypic_parse(ngx_pool_t *pool, ngx_str_t *body, cJSON **json,
    ngx_http_hypic_bad_t *bad)
{
    const char                **scratch;
    ngx_http_hypic_json_err_t   err;

    *json = NULL;

    if (body->len == 0) {
        return ngx_http_hypic_bad(bad, NGX_HTTP_BAD_REQUEST, NULL, NULL,
                                  "We could not parse the JSON body of "
                                  "your request: the body is empty");
    }

    if (ngx_http_hypic_json_check(body->data, body->len, &err) != NGX_OK) {
        return ngx_http_hypic_refuse_json(pool, &err, body->len, bad);
    }

    /* the text is valid: cJSON fails only for want of memory */

    *json = cJSON_ParseWithLength((const char *) body->data + err.start,
                                  body->len - err.start);
    if (*json == NULL) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    if (!cJSON_IsObject(*json)) {
        return ngx_http_hypic_bad(bad, NGX_HTTP_BAD_REQUEST, NULL, NULL,
                                  "The request body must be a JSON object");
    }

    scratch = ngx_palloc(pool, err.keys * sizeof(const char *));
    if (scratch == NULL) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    if (ngx_http_hypic_json_unique(*json, scratch, &err) != NGX_OK) {
        return ngx_http_hypic_refuse_json(pool, &err, 0, bad);
    }

    return NGX_OK;
}


/* a 400 for a refused body; size 0: the reason has no byte (unique) */

static ngx_int_t
ngx_http_hypic_refuse_json(ngx_pool_t *pool, ngx_http_hypic_json_err_t *err,
    size_t size, ngx_http_hypic_bad_t *bad)
{
    size_t   n;
    u_char  *param;

    n = err->path_last - err->path;

    if (n == 0) {
        return ngx_http_hypic_bad(bad, NGX_HTTP_BAD_REQUEST, NULL, NULL,
                                  "We could not parse the JSON body of "
                                  "your request: %s at byte %uz of %uz",
                                  err->reason, err->offset, size);
    }

    param = ngx_pnalloc(pool, n + 1);
    if (param == NULL) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    *ngx_cpymem(param, err->path, n) = '\0';

    if (size == 0) {
        return ngx_http_hypic_bad(bad, NGX_HTTP_BAD_REQUEST, (char *) param,
                                  NULL, "We could not parse the JSON body "
                                  "of your request: %s, '%s'", err->reason,
                                  param);
    }

    return ngx_http_hypic_bad(bad, NGX_HTTP_BAD_REQUEST, (char *) param,
                              NULL, "We could not parse the JSON body of "
                              "your request: %s at byte %uz of %uz, in '%s'",
                              err->reason, err->offset, size, param);
}


static ngx_int_t
ngx_http_hypic_check_common(ngx_http_hypic_loc_conf_t *hlcf, cJSON *json,
    ngx_http_hypic_bad_t *bad)
{
    cJSON      *item;
    double      max;
    ngx_int_t   rc;
    ngx_str_t  *model;

    item = cJSON_GetObjectItemCaseSensitive(json, "model");

    if (item && !cJSON_IsNull(item)) {

        if (!cJSON_IsString(item)) {
            return ngx_http_hypic_bad(bad, NGX_HTTP_BAD_REQUEST, "model",
                                      NULL, "'model' must be a string");
        }

        model = &hlcf->engine->model;

        if (ngx_strlen(item->valuestring) != model->len
            || ngx_strncmp(item->valuestring, model->data, model->len) != 0)
        {
            return ngx_http_hypic_bad(bad, NGX_HTTP_NOT_FOUND, "model",
                                      "model_not_found",
                                      "The model '%s' does not exist here, "
                                      "this endpoint serves '%V'",
                                      item->valuestring, model);
        }
    }

    item = cJSON_GetObjectItemCaseSensitive(json, "stream");

    if (item && !cJSON_IsNull(item) && !cJSON_IsBool(item)) {
        return ngx_http_hypic_bad(bad, NGX_HTTP_BAD_REQUEST, "stream", NULL,
                                  "'stream' must be a boolean");
    }

    max = (double) hlcf->max_tokens;

    rc = ngx_http_hypic_check_number(json, "max_tokens", 0, max, 1, bad);

    if (rc == NGX_OK) {
        rc = ngx_http_hypic_check_number(json, "max_completion_tokens", 0,
                                         max, 1, bad);
    }

    if (rc == NGX_OK) {
        rc = ngx_http_hypic_check_number(json, "temperature", 0, 2, 0, bad);
    }

    if (rc == NGX_OK) {
        rc = ngx_http_hypic_check_number(json, "top_p", 0, 1, 0, bad);
    }

    return rc;
}


ngx_int_t
ngx_http_hypic_check_number(cJSON *json, const char *name, double min,
    double max, ngx_uint_t integer, ngx_http_hypic_bad_t *bad)
{
    cJSON  *item;
    double  v;

    item = cJSON_GetObjectItemCaseSensitive(json, name);

    if (item == NULL || cJSON_IsNull(item)) {
        return NGX_OK;
    }

    if (cJSON_IsNumber(item)) {
        v = item->valuedouble;

        /* in range first, so that the cast below is defined */

        if (v >= min && v <= max
            && (!integer || v == (double) (int64_t) v))
        {
            return NGX_OK;
        }
    }

    if (integer) {
        return ngx_http_hypic_bad(bad, NGX_HTTP_BAD_REQUEST, name, NULL,
                                  "'%s' must be an integer from %L to %L",
                                  name, (int64_t) min, (int64_t) max);
    }

    return ngx_http_hypic_bad(bad, NGX_HTTP_BAD_REQUEST, name, NULL,
                              "'%s' must be a number from %.1f to %.1f",
                              name, min, max);
}


static ngx_int_t
ngx_http_hypic_check_completion(cJSON *json, ngx_http_hypic_bad_t *bad)
{
    cJSON  *prompt, *item;

    prompt = cJSON_GetObjectItemCaseSensitive(json, "prompt");

    if (prompt == NULL) {
        return ngx_http_hypic_bad(bad, NGX_HTTP_BAD_REQUEST, "prompt", NULL,
                                  "Missing required parameter: 'prompt'");
    }

    if (cJSON_IsString(prompt)) {
        return NGX_OK;
    }

    if (cJSON_IsArray(prompt) && cJSON_GetArraySize(prompt) > 0) {

        cJSON_ArrayForEach(item, prompt) {
            if (!cJSON_IsString(item)) {
                break;
            }
        }

        if (item == NULL) {
            return NGX_OK;
        }
    }

    return ngx_http_hypic_bad(bad, NGX_HTTP_BAD_REQUEST, "prompt", NULL,
                              "'prompt' must be a string or a non-empty "
                              "array of strings");
}


static ngx_int_t
ngx_http_hypic_check_chat(cJSON *json, ngx_http_hypic_bad_t *bad)
{
    cJSON       *messages, *message, *role, *content;
    ngx_str_t    name;
    ngx_uint_t   i, k;

    messages = cJSON_GetObjectItemCaseSensitive(json, "messages");

    if (messages == NULL) {
        return ngx_http_hypic_bad(bad, NGX_HTTP_BAD_REQUEST, "messages",
                                  NULL,
                                  "Missing required parameter: 'messages'");
    }

    if (!cJSON_IsArray(messages) || cJSON_GetArraySize(messages) == 0) {
        return ngx_http_hypic_bad(bad, NGX_HTTP_BAD_REQUEST, "messages",
                                  NULL,
                                  "'messages' must be a non-empty array");
    }

    i = 0;

    cJSON_ArrayForEach(message, messages) {

        if (!cJSON_IsObject(message)) {
            return ngx_http_hypic_bad(bad, NGX_HTTP_BAD_REQUEST, "messages",
                                      NULL, "'messages[%ui]' must be an "
                                      "object", i);
        }

        role = cJSON_GetObjectItemCaseSensitive(message, "role");

        if (!cJSON_IsString(role)) {
            return ngx_http_hypic_bad(bad, NGX_HTTP_BAD_REQUEST, "messages",
                                      NULL, "'messages[%ui].role' must be "
                                      "a string", i);
        }

        name.data = (u_char *) role->valuestring;
        name.len = ngx_strlen(role->valuestring);

        for (k = 0; ngx_http_hypic_roles[k].len; k++) {
            if (name.len == ngx_http_hypic_roles[k].len
                && ngx_strncmp(name.data, ngx_http_hypic_roles[k].data,
                               name.len)
                   == 0)
            {
                break;
            }
        }

        if (ngx_http_hypic_roles[k].len == 0) {
            return ngx_http_hypic_bad(bad, NGX_HTTP_BAD_REQUEST, "messages",
                                      NULL, "'messages[%ui].role' must be "
                                      "system, developer, user, assistant "
                                      "or tool, not '%V'", i, &name);
        }

        content = cJSON_GetObjectItemCaseSensitive(message, "content");

        /* only an assistant turn (with tool calls) may have no content */

        if (!(cJSON_IsString(content) || cJSON_IsArray(content)
              || ((content == NULL || cJSON_IsNull(content))
                  && ngx_strcmp(name.data, "assistant") == 0)))
        {
            return ngx_http_hypic_bad(bad, NGX_HTTP_BAD_REQUEST, "messages",
                                      NULL, "'messages[%ui].content' must "
                                      "be a string or an array of content "
                                      "parts", i);
        }

        i++;
    }

    return NGX_OK;
}


/* the extensions and the fields the checks above leave alone */

static ngx_int_t
ngx_http_hypic_check_extras(cJSON *json, ngx_http_hypic_bad_t *bad)
{
    cJSON      *item, *stop;
    size_t      len;
    ngx_int_t   rc;
    ngx_uint_t  n;

    rc = ngx_http_hypic_check_number(json, "top_k", 0, 1e9, 1, bad);

    if (rc == NGX_OK) {
        rc = ngx_http_hypic_check_number(json, "seed", -9e18, 9e18, 1, bad);
    }

    if (rc != NGX_OK) {
        return rc;
    }

    item = cJSON_GetObjectItemCaseSensitive(json, "ignore_eos");

    if (item && !cJSON_IsNull(item) && !cJSON_IsBool(item)) {
        return ngx_http_hypic_bad(bad, NGX_HTTP_BAD_REQUEST, "ignore_eos",
                                  NULL, "'ignore_eos' must be a boolean");
    }

    if (ngx_http_hypic_check_decode(json, bad) != NGX_OK) {
        return NGX_ERROR;
    }

    item = cJSON_GetObjectItemCaseSensitive(json, "stream_options");

    if (item && !cJSON_IsNull(item)) {
        if (!cJSON_IsObject(item)) {
            return ngx_http_hypic_bad(bad, NGX_HTTP_BAD_REQUEST,
                                      "stream_options", NULL,
                                      "'stream_options' must be an object");
        }

        item = cJSON_GetObjectItemCaseSensitive(item, "include_usage");

        if (item && !cJSON_IsNull(item) && !cJSON_IsBool(item)) {
            return ngx_http_hypic_bad(bad, NGX_HTTP_BAD_REQUEST,
                                      "stream_options", NULL,
                                      "'stream_options.include_usage' must "
                                      "be a boolean");
        }
    }

    stop = cJSON_GetObjectItemCaseSensitive(json, "stop");

    if (stop == NULL || cJSON_IsNull(stop)) {
        return NGX_OK;
    }

    if (cJSON_IsString(stop)) {
        n = 1;
        item = stop;

    } else if (cJSON_IsArray(stop)) {
        n = cJSON_GetArraySize(stop);
        item = stop->child;

    } else {
        n = 0;
        item = NULL;
    }

    if ((item == NULL && !cJSON_IsArray(stop)) || n > HP_IPC_MAX_STOP) {
        return ngx_http_hypic_bad(bad, NGX_HTTP_BAD_REQUEST, "stop", NULL,
                                  "'stop' must be a string or an array of "
                                  "at most %d strings", HP_IPC_MAX_STOP);
    }

    for ( /* void */ ; item; item = cJSON_IsArray(stop) ? item->next : NULL)
    {
        len = cJSON_IsString(item) ? ngx_strlen(item->valuestring) : 0;

        if (len == 0 || len > HP_IPC_STOP_BYTES) {
            return ngx_http_hypic_bad(bad, NGX_HTTP_BAD_REQUEST, "stop",
                                      NULL, "each 'stop' sequence must be "
                                      "a string of 1 to %d bytes",
                                      HP_IPC_STOP_BYTES);
        }
    }

    return NGX_OK;
}


/*
 * The extension object "hypic": {"decode": "recurrent"|"chunkwise"|"auto",
 * "speculative": true|false, "max_draft": 1..16}, each optional (absent:
 * the engine's setting). Speculative drafts are verified in the KVBuffer,
 * so they cannot go with recurrent decoding.
 */

static ngx_int_t
ngx_http_hypic_check_decode(cJSON *json, ngx_http_hypic_bad_t *bad)
{
    cJSON      *opts, *item;
    ngx_int_t   form;

    opts = cJSON_GetObjectItemCaseSensitive(json, "hypic");

    if (opts == NULL || cJSON_IsNull(opts)) {
        return NGX_OK;
    }

    if (!cJSON_IsObject(opts)) {
        return ngx_http_hypic_bad(bad, NGX_HTTP_BAD_REQUEST, "hypic", NULL,
                                  "'hypic' must be an object with any of "
                                  "decode, speculative, max_draft");
    }

    cJSON_ArrayForEach(item, opts) {
        if (ngx_strcmp(item->string, "decode") != 0
            && ngx_strcmp(item->string, "speculative") != 0
            && ngx_strcmp(item->string, "max_draft") != 0)
        {
            return ngx_http_hypic_bad(bad, NGX_HTTP_BAD_REQUEST, "hypic",
                                      NULL, "'hypic.%s' is not an option: "
                                      "'hypic' takes decode, speculative "
                                      "and max_draft", item->string);
        }
    }

    form = ngx_http_hypic_decode_form(
               cJSON_GetObjectItemCaseSensitive(opts, "decode"));

    if (form == NGX_ERROR) {
        return ngx_http_hypic_bad(bad, NGX_HTTP_BAD_REQUEST, "hypic.decode",
                                  NULL, "'hypic.decode' must be "
                                  "\"recurrent\", \"chunkwise\" or "
                                  "\"auto\"");
    }

    item = cJSON_GetObjectItemCaseSensitive(opts, "speculative");

    if (item && !cJSON_IsNull(item) && !cJSON_IsBool(item)) {
        return ngx_http_hypic_bad(bad, NGX_HTTP_BAD_REQUEST,
                                  "hypic.speculative", NULL,
                                  "'hypic.speculative' must be a boolean");
    }

    if (cJSON_IsTrue(item) && form == HP_IPC_DECODE_RECURRENT) {
        return ngx_http_hypic_bad(bad, NGX_HTTP_BAD_REQUEST,
                                  "hypic.speculative", NULL,
                                  "'hypic.speculative' needs 'hypic.decode' "
                                  "chunkwise or auto (drafts are verified "
                                  "in the KVBuffer), not recurrent");
    }

    item = cJSON_GetObjectItemCaseSensitive(opts, "max_draft");

    if (item && !cJSON_IsNull(item)
        && !(cJSON_IsNumber(item) && item->valuedouble >= 1
             && item->valuedouble <= HP_IPC_MAX_DRAFT
             && item->valuedouble == (double) (int) item->valuedouble))
    {
        return ngx_http_hypic_bad(bad, NGX_HTTP_BAD_REQUEST,
                                  "hypic.max_draft", NULL,
                                  "'hypic.max_draft' must be an integer "
                                  "from 1 to %d", HP_IPC_MAX_DRAFT);
    }

    return NGX_OK;
}


/* HP_IPC_DECODE_* of a "decode" value (absent: the engine's), or
 * NGX_ERROR */

static ngx_int_t
ngx_http_hypic_decode_form(cJSON *item)
{
    if (item == NULL || cJSON_IsNull(item)) {
        return HP_IPC_DECODE_SERVER;
    }

    if (!cJSON_IsString(item)) {
        return NGX_ERROR;
    }

    if (ngx_strcmp(item->valuestring, "recurrent") == 0) {
        return HP_IPC_DECODE_RECURRENT;
    }

    if (ngx_strcmp(item->valuestring, "chunkwise") == 0) {
        return HP_IPC_DECODE_CHUNKWISE;
    }

    if (ngx_strcmp(item->valuestring, "auto") == 0) {
        return HP_IPC_DECODE_AUTO;
    }

    return NGX_ERROR;
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


static void
ngx_http_hypic_build_decode(hp_ipc_request_t *req, cJSON *json)
{
    cJSON  *opts, *item;

    opts = cJSON_GetObjectItemCaseSensitive(json, "hypic");

    if (!cJSON_IsObject(opts)) {
        return;
    }

    req->decode = (uint32_t) ngx_http_hypic_decode_form(
                      cJSON_GetObjectItemCaseSensitive(opts, "decode"));

    item = cJSON_GetObjectItemCaseSensitive(opts, "speculative");

    req->speculative = cJSON_IsTrue(item) ? HP_IPC_SPEC_ON
                       : cJSON_IsFalse(item) ? HP_IPC_SPEC_OFF
                                             : HP_IPC_SPEC_SERVER;

    item = cJSON_GetObjectItemCaseSensitive(opts, "max_draft");

    if (cJSON_IsNumber(item)) {
        req->max_draft = (uint32_t) item->valuedouble;
    }
}


/*
 * Fills ctx->req, ctx->prompt and the answer's fixed parts from a checked
 * request. NGX_OK, NGX_ERROR with bad filled, or 500 (no memory).
 */

static ngx_int_t
ngx_http_hypic_build(ngx_http_request_t *r, ngx_http_hypic_ctx_t *ctx,
    ngx_http_hypic_loc_conf_t *hlcf, cJSON *json, ngx_http_hypic_bad_t *bad)
{
    cJSON             *item, *stop;
    ngx_int_t          rc;
    ngx_uint_t         chat, n;
    hp_ipc_request_t  *req;

    chat = (ctx->endpoint == NGX_HTTP_HYPIC_CHAT);

    rc = chat ? ngx_http_hypic_prompt_chat(r, ctx, json, bad)
              : ngx_http_hypic_prompt_completion(r, ctx, json, bad);

    if (rc != NGX_OK) {
        return rc;
    }

    req = &ctx->req;

    req->endpoint = chat ? HP_IPC_EP_CHAT : HP_IPC_EP_COMPLETIONS;
    req->mode = (uint32_t) ctx->mode;
    req->seam = (uint32_t) hlcf->seam;

    item = cJSON_GetObjectItemCaseSensitive(json, "max_completion_tokens");

    if (!chat || item == NULL || cJSON_IsNull(item)) {
        item = cJSON_GetObjectItemCaseSensitive(json, "max_tokens");
    }

    req->max_tokens = (item && cJSON_IsNumber(item))
                      ? (uint32_t) item->valuedouble
                      : chat ? (uint32_t) hlcf->max_tokens
                             : ngx_min(NGX_HTTP_HYPIC_COMPLETION_TOKENS,
                                       hlcf->max_tokens);

    req->temperature = (float) ngx_http_hypic_number(json, "temperature", 1);
    req->top_p = (float) ngx_http_hypic_number(json, "top_p", 1);
    req->top_k = (int32_t) ngx_http_hypic_number(json, "top_k", 0);

    /* top_p 0 keeps only the likeliest token: that is greedy */

    if (req->top_p <= 0) {
        req->top_p = 1;
        req->temperature = 0;
    }

    item = cJSON_GetObjectItemCaseSensitive(json, "seed");

    if (item && cJSON_IsNumber(item)) {
        req->seed = (uint64_t) (int64_t) item->valuedouble;

    } else {
        req->seed = ((uint64_t) ngx_random() << 32)
                    ^ (uint64_t) ngx_random()
                    ^ (r->connection->number << 8);
    }

    item = cJSON_GetObjectItemCaseSensitive(json, "ignore_eos");

    if (cJSON_IsTrue(item)) {
        req->flags |= HP_IPC_FLAG_IGNORE_EOS;
    }

    stop = cJSON_GetObjectItemCaseSensitive(json, "stop");
    item = cJSON_IsString(stop) ? stop
           : cJSON_IsArray(stop) ? stop->child : NULL;

    for (n = 0; item && n < HP_IPC_MAX_STOP; n++) {
        req->stop_len[n] = (uint32_t) ngx_strlen(item->valuestring);
        ngx_memcpy(req->stop[n], item->valuestring, req->stop_len[n]);
        item = cJSON_IsArray(stop) ? item->next : NULL;
    }

    req->n_stop = (uint32_t) n;

    ngx_http_hypic_build_decode(req, json);

    req->sep_len = (uint32_t) hlcf->separator.len;
    ngx_memcpy(req->separator, hlcf->separator.data, hlcf->separator.len);

    ctx->stream = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(json,
                                                                "stream"));

    item = cJSON_GetObjectItemCaseSensitive(json, "stream_options");

    if (ctx->stream && cJSON_IsObject(item)) {
        ctx->include_usage = cJSON_IsTrue(
            cJSON_GetObjectItemCaseSensitive(item, "include_usage"));
    }

    ctx->created = ngx_time();

    /* the tools' scanners are per choice */

    if (ngx_http_hypic_choices_init(r, ctx, json) != NGX_OK
        || (chat && ngx_http_hypic_tools_setup(r, ctx, json) != NGX_OK))
    {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    return ngx_http_hypic_head(r, ctx, hlcf);
}


static ngx_int_t
ngx_http_hypic_prompt_completion(ngx_http_request_t *r,
    ngx_http_hypic_ctx_t *ctx, cJSON *json, ngx_http_hypic_bad_t *bad)
{
    cJSON  *prompt;

    prompt = cJSON_GetObjectItemCaseSensitive(json, "prompt");

    if (cJSON_IsArray(prompt)) {
        if (cJSON_GetArraySize(prompt) != 1) {
            return ngx_http_hypic_bad(bad, NGX_HTTP_BAD_REQUEST, "prompt",
                                      NULL, "only one prompt per request "
                                      "is supported");
        }

        prompt = prompt->child;
    }

    /* cJSON keeps it until the request is built: copy it */

    ctx->prompt.len = ngx_strlen(prompt->valuestring);
    ctx->prompt.data = ngx_pnalloc(r->pool, ctx->prompt.len + 1);
    if (ctx->prompt.data == NULL) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    ngx_memcpy(ctx->prompt.data, prompt->valuestring, ctx->prompt.len);

    return NGX_OK;
}


/*
 * A chat request goes to the engine as its body (ctx->prompt): the
 * engine renders it with the model's chat template. Kept here: the text
 * content parts only (others are refused) and the texts that can hold
 * segments (for the Redis lookup).
 */

static ngx_int_t
ngx_http_hypic_prompt_chat(ngx_http_request_t *r, ngx_http_hypic_ctx_t *ctx,
    cJSON *json, ngx_http_hypic_bad_t *bad)
{
    cJSON       *message, *content, *part, *type, *text;
    ngx_str_t   *s;
    ngx_uint_t   i;

    ctx->req.flags |= HP_IPC_FLAG_CHAT;

    /* a byte order mark is not JSON to the engine's parser */

    if (ctx->prompt.len >= 3
        && ngx_strncmp(ctx->prompt.data, "\xef\xbb\xbf", 3) == 0)
    {
        ctx->prompt.data += 3;
        ctx->prompt.len -= 3;
    }

    ctx->contents = ngx_array_create(r->pool, 4, sizeof(ngx_str_t));
    if (ctx->contents == NULL) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    i = 0;

    cJSON_ArrayForEach(message,
                       cJSON_GetObjectItemCaseSensitive(json, "messages"))
    {
        content = cJSON_GetObjectItemCaseSensitive(message, "content");
        part = cJSON_IsArray(content) ? content->child : content;

        for ( /* void */ ; part; part = cJSON_IsArray(content) ? part->next
                                                              : NULL)
        {
            text = part;

            if (cJSON_IsArray(content)) {
                type = cJSON_GetObjectItemCaseSensitive(part, "type");
                text = cJSON_GetObjectItemCaseSensitive(part, "text");

                if (!cJSON_IsString(type)
                    || ngx_strcmp(type->valuestring, "text") != 0
                    || !cJSON_IsString(text))
                {
                    return ngx_http_hypic_bad(bad, NGX_HTTP_BAD_REQUEST,
                                              "messages", NULL,
                                              "'messages[%ui].content' "
                                              "parts must be "
                                              "{\"type\": \"text\", "
                                              "\"text\": ...}: only "
                                              "text is supported", i);
                }
            }

            if (!cJSON_IsString(text)) {
                continue;
            }

            s = ngx_array_push(ctx->contents);
            if (s == NULL) {
                return NGX_HTTP_INTERNAL_SERVER_ERROR;
            }

            s->len = ngx_strlen(text->valuestring);
            s->data = ngx_pnalloc(r->pool, s->len);
            if (s->data == NULL) {
                return NGX_HTTP_INTERNAL_SERVER_ERROR;
            }

            ngx_memcpy(s->data, text->valuestring, s->len);
        }

        i++;
    }

    return NGX_OK;
}


static double
ngx_http_hypic_number(cJSON *json, const char *name, double dflt)
{
    cJSON  *item;

    item = cJSON_GetObjectItemCaseSensitive(json, name);

    return cJSON_IsNumber(item) ? item->valuedouble : dflt;
}


/*
 * The id, and the JSON every event and answer starts with:
 * {"id":"ID","object":"OBJECT","created":T,"model":"MODEL",
 */

static ngx_int_t
ngx_http_hypic_head(ngx_http_request_t *r, ngx_http_hypic_ctx_t *ctx,
    ngx_http_hypic_loc_conf_t *hlcf)
{
    u_char      *p;
    size_t       len;
    ngx_str_t   *model;
    const char  *object, *prefix;

    if (ctx->endpoint == NGX_HTTP_HYPIC_CHAT) {
        prefix = "chatcmpl-";
        object = ctx->stream ? "chat.completion.chunk" : "chat.completion";

    } else {
        prefix = "cmpl-";
        object = "text_completion";
    }

    ctx->id.data = ngx_pnalloc(r->pool, sizeof("chatcmpl-") - 1 + 24);
    if (ctx->id.data == NULL) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    p = ngx_sprintf(ctx->id.data, "%s%08xD%08xD%08xD", prefix,
                    (uint32_t) ngx_random(), (uint32_t) ngx_random(),
                    (uint32_t) (r->connection->number ^ ngx_pid));

    ctx->id.len = p - ctx->id.data;

    ngx_cpystrn((u_char *) ctx->req.id, ctx->id.data,
                ngx_min(ctx->id.len + 1, HP_IPC_ID_BYTES));

    model = &hlcf->engine->model;

    len = sizeof("{\"id\":\"\",\"object\":\"\",\"created\":,\"model\":\"\",")
          - 1 + ctx->id.len + ngx_strlen(object) + NGX_TIME_T_LEN
          + ngx_http_hypic_json_escape_len(model->data, model->len);

    p = ngx_pnalloc(r->pool, len);
    if (p == NULL) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    ctx->head.data = p;

    p = ngx_sprintf(p, "{\"id\":\"%V\",\"object\":\"%s\",\"created\":%T,"
                    "\"model\":\"", &ctx->id, object, ctx->created);
    p = ngx_http_hypic_json_escape(p, model->data, model->len);
    p = ngx_cpymem(p, "\",", 2);

    ctx->head.len = p - ctx->head.data;

    return NGX_OK;
}


ngx_int_t
ngx_http_hypic_bad(ngx_http_hypic_bad_t *bad, ngx_uint_t status,
    const char *param, const char *code, const char *fmt, ...)
{
    va_list  args;

    bad->status = status;
    bad->param = param;
    bad->code = code;

    va_start(args, fmt);
    bad->last = ngx_vslprintf(bad->msg, bad->msg + sizeof(bad->msg), fmt,
                              args);
    va_end(args);

    return NGX_ERROR;
}


/*
 * hypic_mode may be a variable (split_clients, map): a value that is not a
 * mode is the configuration's fault, so it is logged and "full", which
 * reuses nothing and is always exact, is used.
 */

static ngx_uint_t
ngx_http_hypic_eval_mode(ngx_http_request_t *r,
    ngx_http_hypic_loc_conf_t *hlcf)
{
    ngx_int_t  mode;
    ngx_str_t  value;

    if (ngx_http_complex_value(r, hlcf->mode, &value) != NGX_OK) {
        return HP_IPC_MODE_FULL;
    }

    mode = ngx_http_hypic_parse_mode(&value);

    if (mode == NGX_ERROR) {
        ngx_log_error(NGX_LOG_ERR, r->connection->log, 0,
                      "hypic: hypic_mode evaluated to \"%V\", which is not "
                      "full, prefix, naive or pic; using \"full\"", &value);
        return HP_IPC_MODE_FULL;
    }

    return (ngx_uint_t) mode;
}


/*
 * Counts the body as it arrives and, past hypic_max_prompt_bytes, drops
 * it but reads on to the end: the client then gets our JSON 413 instead
 * of a reset, and the body never takes more than the limit. A body with
 * Content-Length never gets here too large (refused before reading).
 */

static ngx_int_t
ngx_http_hypic_request_body_filter(ngx_http_request_t *r, ngx_chain_t *in)
{
    ngx_chain_t                *cl, *last;
    ngx_http_hypic_ctx_t       *ctx;
    ngx_http_hypic_loc_conf_t  *hlcf;

    ctx = ngx_http_get_module_ctx(r, ngx_http_hypic_module);

    if (ctx == NULL) {
        return ngx_http_next_request_body_filter(r, in);
    }

    hlcf = ngx_http_get_module_loc_conf(r, ngx_http_hypic_module);

    for (cl = in; cl; cl = cl->next) {
        ctx->received += ngx_buf_size(cl->buf);
    }

    if (!ctx->too_large
        && ctx->received <= (off_t) hlcf->max_prompt_bytes)
    {
        return ngx_http_next_request_body_filter(r, in);
    }

    if (!ctx->too_large) {
        ngx_log_error(NGX_LOG_INFO, r->connection->log, 0,
                      "hypic: client sent more than hypic_max_prompt_bytes "
                      "%uz in a chunked body", hlcf->max_prompt_bytes);
        ctx->too_large = 1;
    }

    last = NULL;

    for (cl = in; cl; cl = cl->next) {
        cl->buf->pos = cl->buf->last;

        if (cl->buf->last_buf) {
            last = cl;
        }
    }

    /* only the end of the body goes on, so reading completes normally */

    return ngx_http_next_request_body_filter(r, last);
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

        if (len != sizeof(hp_ipc_start_t) || ctx->started) {
            break;
        }

        ngx_memcpy(&ctx->start, data, len);
        ctx->started = 1;

        if (!ctx->stream) {
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

        if (!ctx->started) {
            break;
        }

        if (!ctx->ttft_set && type == HP_IPC_REC_TEXT
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

        ngx_memcpy(&ctx->final, data, len);
        ctx->final.code[sizeof(ctx->final.code) - 1] = '\0';
        ctx->final.message[sizeof(ctx->final.message) - 1] = '\0';

        ctx->finished = 1;
        ctx->succeeded = (ctx->final.status == 0
                          && ctx->final.finish != HP_IPC_FINISH_ERROR);

        /* an answer without text has its first "token" at the end */

        if (ctx->succeeded && !ctx->ttft_set) {
            ngx_http_hypic_first_token(r, ctx);
        }

        /* the slot is free again before the client has its last byte */

        ngx_http_hypic_engine_detach(ctx);

        if (ctx->final.status != 0
            || ctx->final.finish == HP_IPC_FINISH_ERROR)
        {
            e = hp_ipc_error(ctx->final.status);
            level = (e->http >= NGX_HTTP_INTERNAL_SERVER_ERROR)
                    ? NGX_LOG_ERR : NGX_LOG_INFO;

            ngx_log_error(level, r->connection->log, 0,
                          "hypic: engine refused %V: %s (%s)", &ctx->id,
                          ctx->final.message, e->code);

            ngx_http_hypic_fail(r, e->http, e->type, e->code, "%s",
                                ctx->final.message);
            return NGX_DONE;
        }

        if (!ctx->stream) {
            rc = ngx_http_hypic_choices_end(r, ctx);

            ngx_http_finalize_request(r, rc == NGX_OK
                                         ? ngx_http_hypic_respond(r, ctx)
                                         : NGX_HTTP_INTERNAL_SERVER_ERROR);
            return NGX_DONE;
        }

        if (!r->header_sent) {
            ctx->start.mode = ctx->final.mode;
            ctx->start.decode = ctx->final.decode;
            ctx->start.segs_hit = ctx->final.segs_hit;
            ctx->start.segs_total = ctx->final.segs_total;

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
                  "for %V", type, len, &ctx->id);

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
        ctx->engine_error = 1;
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
    h->value = *ngx_http_hypic_mode_name(ctx->started ? ctx->start.mode
                                                      : ctx->final.mode);

    h = ngx_list_push(&r->headers_out.headers);
    if (h == NULL) {
        return NGX_ERROR;
    }

    h->hash = 1;
    ngx_str_set(&h->key, "X-Hypic-Node");
    h->value = ctx->node;

    h = ngx_list_push(&r->headers_out.headers);
    if (h == NULL) {
        return NGX_ERROR;
    }

    h->hash = 1;
    ngx_str_set(&h->key, "X-Hypic-Decode");
    h->value = *ngx_http_hypic_decode_name(ctx->started ? ctx->start.decode
                                                        : ctx->final.decode);

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
    h->value.len = ngx_sprintf(p, "%uD/%uD",
                               ctx->started ? ctx->start.segs_hit
                                            : ctx->final.segs_hit,
                               ctx->started ? ctx->start.segs_total
                                            : ctx->final.segs_total)
                   - p;

    return NGX_OK;
}


/* time to first token: from the request's first byte, as $request_time */

static void
ngx_http_hypic_first_token(ngx_http_request_t *r, ngx_http_hypic_ctx_t *ctx)
{
    ngx_time_t  *tp;

    tp = ngx_timeofday();

    ctx->ttft = (ngx_msec_int_t) ((tp->sec - r->start_sec) * 1000
                                  + (tp->msec - r->start_msec));
    ctx->ttft = ngx_max(ctx->ttft, 0);
    ctx->ttft_set = 1;
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

    len = ctx->head.len + choices.len + 2 + NGX_HTTP_HYPIC_USAGE_LEN;

    p = ngx_pnalloc(r->pool, len);
    if (p == NULL) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    body.data = p;

    p = ngx_cpymem(p, ctx->head.data, ctx->head.len);
    p = ngx_cpymem(p, choices.data, choices.len);
    *p++ = ',';
    p = ngx_http_hypic_usage(p, &ctx->final);
    *p++ = '}';

    body.len = p - body.data;

    if (ngx_http_hypic_add_headers(r, ctx) != NGX_OK) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    return ngx_http_hypic_send_json(r, NGX_HTTP_OK, &body);
}


static ngx_int_t
ngx_http_hypic_log_handler(ngx_http_request_t *r)
{
    ngx_http_hypic_ctx_t       *ctx;
    ngx_http_hypic_loc_conf_t  *hlcf;

    hlcf = ngx_http_get_module_loc_conf(r, ngx_http_hypic_module);

    /* a request sent on to a peer ends in hypic_peer's location */

    ctx = ngx_http_hypic_get_ctx(r);

    if (hlcf->engine == NULL && ctx == NULL) {
        return NGX_OK;
    }

    ngx_http_hypic_metrics_count(r, ctx, r->err_status
                                         ? r->err_status
                                         : r->headers_out.status);

    return NGX_OK;
}


ngx_int_t
ngx_http_hypic_handler_init(ngx_conf_t *cf)
{
    ngx_http_handler_pt        *h;
    ngx_http_core_main_conf_t  *cmcf;

    cmcf = ngx_http_conf_get_module_main_conf(cf, ngx_http_core_module);

    h = ngx_array_push(&cmcf->phases[NGX_HTTP_LOG_PHASE].handlers);
    if (h == NULL) {
        return NGX_ERROR;
    }

    *h = ngx_http_hypic_log_handler;

    ngx_http_next_request_body_filter = ngx_http_top_request_body_filter;
    ngx_http_top_request_body_filter = ngx_http_hypic_request_body_filter;

    return NGX_OK;
}
