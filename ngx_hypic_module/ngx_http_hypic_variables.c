
/*
 * HYPIC serve: the module's variables (see ngx_http_hypic_variables.h).
 *
 * They read the request's ctx, found again after a redirect to the
 * hypic_peer location, and are never cached: the log phase must see the
 * final values, not those of an earlier look.
 */


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include "ngx_http_hypic_module.h"
#include "ngx_http_hypic_variables.h"


#define NGX_HTTP_HYPIC_VAR_MODE      0
#define NGX_HTTP_HYPIC_VAR_NODE      1
#define NGX_HTTP_HYPIC_VAR_HITS      2
#define NGX_HTTP_HYPIC_VAR_MISSES    3
#define NGX_HTTP_HYPIC_VAR_TTFT      4
#define NGX_HTTP_HYPIC_VAR_ROUTE     5
#define NGX_HTTP_HYPIC_VAR_PEER      6


static ngx_int_t ngx_http_hypic_variable(ngx_http_request_t *r,
    ngx_http_variable_value_t *v, uintptr_t data);
static ngx_int_t ngx_http_hypic_variable_number(ngx_http_request_t *r,
    ngx_http_variable_value_t *v, ngx_int_t n);


static ngx_http_variable_t  ngx_http_hypic_vars[] = {

    { ngx_string("hypic_mode"), NULL, ngx_http_hypic_variable,
      NGX_HTTP_HYPIC_VAR_MODE, NGX_HTTP_VAR_NOCACHEABLE, 0 },

    { ngx_string("hypic_node"), NULL, ngx_http_hypic_variable,
      NGX_HTTP_HYPIC_VAR_NODE, NGX_HTTP_VAR_NOCACHEABLE, 0 },

    { ngx_string("hypic_hit_segments"), NULL, ngx_http_hypic_variable,
      NGX_HTTP_HYPIC_VAR_HITS, NGX_HTTP_VAR_NOCACHEABLE, 0 },

    { ngx_string("hypic_miss_segments"), NULL, ngx_http_hypic_variable,
      NGX_HTTP_HYPIC_VAR_MISSES, NGX_HTTP_VAR_NOCACHEABLE, 0 },

    { ngx_string("hypic_ttft_ms"), NULL, ngx_http_hypic_variable,
      NGX_HTTP_HYPIC_VAR_TTFT, NGX_HTTP_VAR_NOCACHEABLE, 0 },

    { ngx_string("hypic_route"), NULL, ngx_http_hypic_variable,
      NGX_HTTP_HYPIC_VAR_ROUTE, NGX_HTTP_VAR_NOCACHEABLE, 0 },

    { ngx_string("hypic_peer_addr"), NULL, ngx_http_hypic_variable,
      NGX_HTTP_HYPIC_VAR_PEER, NGX_HTTP_VAR_NOCACHEABLE, 0 },

      ngx_http_null_variable
};


ngx_int_t
ngx_http_hypic_add_variables(ngx_conf_t *cf)
{
    ngx_http_variable_t  *var, *v;

    for (v = ngx_http_hypic_vars; v->name.len; v++) {
        var = ngx_http_add_variable(cf, &v->name, v->flags);
        if (var == NULL) {
            return NGX_ERROR;
        }

        var->get_handler = v->get_handler;
        var->data = v->data;
    }

    return NGX_OK;
}


static ngx_int_t
ngx_http_hypic_variable(ngx_http_request_t *r, ngx_http_variable_value_t *v,
    uintptr_t data)
{
    uint32_t               hit, total;
    ngx_str_t             *s;
    ngx_uint_t             answered;
    ngx_http_hypic_ctx_t  *ctx;

    ctx = ngx_http_hypic_get_ctx(r);

    if (ctx == NULL) {
        v->not_found = 1;
        return NGX_OK;
    }

    /* what the engine said about the request, START or FINAL */

    answered = ctx->out.started || ctx->out.finished;
    hit = ctx->out.start.segs_hit;
    total = ctx->out.start.segs_total;

    s = NULL;

    switch (data) {

    case NGX_HTTP_HYPIC_VAR_MODE:

        if (answered) {
            s = ngx_http_hypic_mode_name(ctx->out.start.mode);

        } else if (ctx->in.mode_set) {
            s = ngx_http_hypic_mode_name(ctx->in.mode);
        }

        break;

    case NGX_HTTP_HYPIC_VAR_NODE:

        if (ctx->routing.route == NGX_HTTP_HYPIC_ROUTE_PEER
            && ctx->routing.peer)
        {
            s = &ctx->routing.peer->id;

        } else if (ctx->eng.node.len) {
            s = &ctx->eng.node;
        }

        break;

    case NGX_HTTP_HYPIC_VAR_HITS:

        if (answered) {
            return ngx_http_hypic_variable_number(r, v, hit);
        }

        break;

    case NGX_HTTP_HYPIC_VAR_MISSES:

        if (answered) {
            return ngx_http_hypic_variable_number(r, v,
                                                  total > hit ? total - hit
                                                              : 0);
        }

        break;

    case NGX_HTTP_HYPIC_VAR_TTFT:

        if (ctx->out.ttft_set) {
            return ngx_http_hypic_variable_number(r, v, ctx->out.ttft);
        }

        break;

    case NGX_HTTP_HYPIC_VAR_ROUTE:

        if (ctx->routing.routed) {
            s = ngx_http_hypic_route_name(ctx->routing.route);
        }

        break;

    default: /* NGX_HTTP_HYPIC_VAR_PEER */

        if (ctx->routing.route == NGX_HTTP_HYPIC_ROUTE_PEER
            && ctx->routing.peer)
        {
            s = &ctx->routing.peer->addr;
        }

        break;
    }

    if (s == NULL) {
        v->not_found = 1;
        return NGX_OK;
    }

    v->len = s->len;
    v->valid = 1;
    v->no_cacheable = 1;
    v->not_found = 0;
    v->data = s->data;

    return NGX_OK;
}


static ngx_int_t
ngx_http_hypic_variable_number(ngx_http_request_t *r,
    ngx_http_variable_value_t *v, ngx_int_t n)
{
    u_char  *p;

    p = ngx_pnalloc(r->pool, NGX_INT_T_LEN);
    if (p == NULL) {
        return NGX_ERROR;
    }

    v->len = ngx_sprintf(p, "%i", n) - p;
    v->valid = 1;
    v->no_cacheable = 1;
    v->not_found = 0;
    v->data = p;

    return NGX_OK;
}
