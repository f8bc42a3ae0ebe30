
/*
 * HYPIC serve: the metrics zone, its counters and the hypic_metrics
 * handler.
 */


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include "ngx_http_hypic_module.h"
#include "ngx_http_hypic_json.h"
#include "ngx_http_hypic_metrics.h"


typedef struct {
    ngx_atomic_t                requests[6];  /* [c]: status c00..c99 */
} ngx_http_hypic_metrics_t;


static ngx_int_t ngx_http_hypic_metrics_init(ngx_shm_zone_t *zone,
    void *data);


static ngx_str_t  ngx_http_hypic_metrics_zone = ngx_string("hypic_metrics");

static ngx_str_t  ngx_http_hypic_metrics_type =
    ngx_string("text/plain; version=0.0.4; charset=utf-8");


#define NGX_HTTP_HYPIC_REQUESTS_HELP                                          \
    "# HELP hypic:requests_total Requests answered by hypic_pass "            \
    "locations, by status class.\n"                                           \
    "# TYPE hypic:requests_total counter\n"

#define NGX_HTTP_HYPIC_REQUESTS_LINE  "hypic:requests_total{code=\"1xx\"} \n"


ngx_shm_zone_t *
ngx_http_hypic_metrics_add(ngx_conf_t *cf)
{
    ngx_shm_zone_t  *zone;

    /* 8 pages: the smallest zone the slab allocator is happy with */

    zone = ngx_shared_memory_add(cf, &ngx_http_hypic_metrics_zone,
                                 8 * ngx_pagesize, &ngx_http_hypic_module);
    if (zone == NULL) {
        return NULL;
    }

    zone->init = ngx_http_hypic_metrics_init;

    return zone;
}


static ngx_int_t
ngx_http_hypic_metrics_init(ngx_shm_zone_t *zone, void *data)
{
    ngx_slab_pool_t           *shpool;
    ngx_http_hypic_metrics_t  *m;

    if (data) {
        /* a reload with the same zone: keep counting where we were */
        zone->data = data;
        return NGX_OK;
    }

    shpool = (ngx_slab_pool_t *) zone->shm.addr;

    if (zone->shm.exists) {
        zone->data = shpool->data;
        return NGX_OK;
    }

    m = ngx_slab_calloc(shpool, sizeof(ngx_http_hypic_metrics_t));
    if (m == NULL) {
        return NGX_ERROR;
    }

    shpool->data = m;
    zone->data = m;

    return NGX_OK;
}


void
ngx_http_hypic_metrics_count(ngx_http_request_t *r, ngx_uint_t status)
{
    ngx_http_hypic_metrics_t    *m;
    ngx_http_hypic_main_conf_t  *hmcf;

    if (status < 100 || status > 599) {
        return;
    }

    hmcf = ngx_http_get_module_main_conf(r, ngx_http_hypic_module);

    m = hmcf->metrics_zone->data;

    (void) ngx_atomic_fetch_add(&m->requests[status / 100], 1);
}


ngx_int_t
ngx_http_hypic_metrics_handler(ngx_http_request_t *r)
{
    u_char                      *p;
    size_t                       len;
    ngx_uint_t                   i;
    ngx_http_complex_value_t     cv;
    ngx_http_hypic_metrics_t    *m;
    ngx_http_hypic_main_conf_t  *hmcf;

    if (!(r->method & (NGX_HTTP_GET|NGX_HTTP_HEAD))) {
        return ngx_http_hypic_send_error(r, NGX_HTTP_NOT_ALLOWED,
                                         NGX_HTTP_HYPIC_INVALID_REQUEST,
                                         "method_not_allowed", NULL,
                                         "metrics answer GET only");
    }

    hmcf = ngx_http_get_module_main_conf(r, ngx_http_hypic_module);

    m = hmcf->metrics_zone->data;

    len = sizeof(NGX_HTTP_HYPIC_REQUESTS_HELP) - 1
          + 5 * (sizeof(NGX_HTTP_HYPIC_REQUESTS_LINE) - 1 + NGX_ATOMIC_T_LEN);

    p = ngx_pnalloc(r->pool, len);
    if (p == NULL) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    ngx_memzero(&cv, sizeof(ngx_http_complex_value_t));

    cv.value.data = p;

    p = ngx_cpymem(p, NGX_HTTP_HYPIC_REQUESTS_HELP,
                   sizeof(NGX_HTTP_HYPIC_REQUESTS_HELP) - 1);

    for (i = 1; i <= 5; i++) {
        p = ngx_sprintf(p, "hypic:requests_total{code=\"%uixx\"} %uA\n",
                        i, m->requests[i]);
    }

    cv.value.len = p - cv.value.data;

    return ngx_http_send_response(r, NGX_HTTP_OK,
                                  &ngx_http_hypic_metrics_type, &cv);
}
