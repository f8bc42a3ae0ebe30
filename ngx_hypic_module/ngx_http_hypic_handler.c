
/*
 * HYPIC serve: the hypic_pass content handler, the request body limit
 * and the log phase counter.
 *
 * A hypic_pass request reads its body without blocking; once it is read,
 * the body becomes the engine request (ngx_http_hypic_request.c), which
 * goes to the local engine (ngx_http_hypic_engine.c) or to the peer that
 * holds its segments (ngx_http_hypic_redis.c). The answer is written by
 * ngx_http_hypic_response.c.
 */


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include "ngx_http_hypic_module.h"
#include "ngx_http_hypic_engine.h"
#include "ngx_http_hypic_handler.h"
#include "ngx_http_hypic_json.h"
#include "ngx_http_hypic_metrics.h"
#include "ngx_http_hypic_redis.h"
#include "ngx_http_hypic_request.h"


static ngx_uint_t ngx_http_hypic_endpoint(ngx_str_t *uri);
static ngx_int_t ngx_http_hypic_models(ngx_http_request_t *r,
    ngx_http_hypic_loc_conf_t *hlcf);
static ngx_int_t ngx_http_hypic_too_large(ngx_http_request_t *r,
    ngx_http_hypic_loc_conf_t *hlcf);
static void ngx_http_hypic_body_handler(ngx_http_request_t *r);
static ngx_int_t ngx_http_hypic_process(ngx_http_request_t *r);
static ngx_int_t ngx_http_hypic_route(ngx_http_request_t *r,
    ngx_http_hypic_ctx_t *ctx, ngx_http_hypic_loc_conf_t *hlcf);
static ngx_table_elt_t *ngx_http_hypic_hop(ngx_http_request_t *r);
static ngx_int_t ngx_http_hypic_to_peer(ngx_http_request_t *r,
    ngx_http_hypic_ctx_t *ctx, ngx_http_hypic_loc_conf_t *hlcf);
static void ngx_http_hypic_cleanup(void *data);
static ngx_int_t ngx_http_hypic_request_body_filter(ngx_http_request_t *r,
    ngx_chain_t *in);
static ngx_int_t ngx_http_hypic_log_handler(ngx_http_request_t *r);


static ngx_http_request_body_filter_pt   ngx_http_next_request_body_filter;


static ngx_str_t  ngx_http_hypic_hop_header = ngx_string("X-Hypic-Hop");


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

    ctx->in.endpoint = endpoint;
    ctx->routing.peer_failed = (before && before->routing.route
                                          == NGX_HTTP_HYPIC_ROUTE_PEER);

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
    ngx_int_t                   rc;
    ngx_http_hypic_bad_t        bad;
    ngx_http_hypic_ctx_t       *ctx;
    ngx_http_hypic_engine_t    *engine;
    ngx_http_hypic_loc_conf_t  *hlcf;

    ctx = ngx_http_get_module_ctx(r, ngx_http_hypic_module);
    hlcf = ngx_http_get_module_loc_conf(r, ngx_http_hypic_module);

    if (ctx->too_large) {
        return ngx_http_hypic_too_large(r, hlcf);
    }

    rc = ngx_http_hypic_request_parse(r, ctx, &bad);

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
                   &ctx->out.id, &engine->model, &engine->name, ctx->in.mode);

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

    ctx->routing.route = NGX_HTTP_HYPIC_ROUTE_LOCAL;

    if (ctx->routing.peer_failed) {
        ctx->routing.route = NGX_HTTP_HYPIC_ROUTE_FALLBACK;

    } else if (ngx_http_hypic_hop(r)) {

        /* a peer chose this node: never send it on again */

        ctx->routing.route = NGX_HTTP_HYPIC_ROUTE_HOP;

    } else if (hlcf->routing == NGX_HTTP_HYPIC_ROUTING_AFFINITY
               && hlcf->peer.len)
    {
        rc = ngx_http_hypic_engine_identity(hlcf->engine, &id);

        if (rc == NGX_AGAIN) {

            /* segment ids need the engine's fingerprint: wait for its hello */

            ctx->routing.await_link = 1;

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
            ctx->routing.route = NGX_HTTP_HYPIC_ROUTE_FALLBACK;
        }
    }

    ctx->routing.routed = 1;

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

    ctx->routing.routed = 1;

    if (ctx->routing.route == NGX_HTTP_HYPIC_ROUTE_PEER) {
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
    h->value = ctx->routing.local_node;
    h->lowcase_key = (u_char *) "x-hypic-hop";
    h->hash = ngx_hash_key(h->lowcase_key, h->key.len);
#if (nginx_version >= 1023000)
    h->next = NULL;
#endif

    ngx_log_debug3(NGX_LOG_DEBUG_HTTP, r->connection->log, 0,
                   "hypic: %V goes to node \"%V\" at %V", &ctx->out.id,
                   &ctx->routing.peer->id, &ctx->routing.peer->addr);

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

