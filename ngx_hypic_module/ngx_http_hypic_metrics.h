
/*
 * HYPIC serve: Prometheus metrics and /health. The counters live in one
 * shared memory zone, so every worker adds to the same numbers and a
 * scrape of any worker sees the sum; they survive a reload (HUP), not a
 * restart. The gauges and /health read each engine's shared header.
 */


#ifndef _NGX_HTTP_HYPIC_METRICS_H_INCLUDED_
#define _NGX_HTTP_HYPIC_METRICS_H_INCLUDED_


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>


/* Adds the zone at config time; NULL on failure (already logged). */
ngx_shm_zone_t *ngx_http_hypic_metrics_add(ngx_conf_t *cf);

#include "ngx_http_hypic_module.h"


/*
 * Counts one answered API request under its status class, and, with its
 * ctx (NULL before the body was read), under its mode and route, its
 * tokens, segments, latencies and errors.
 */
void ngx_http_hypic_metrics_count(ngx_http_request_t *r,
    ngx_http_hypic_ctx_t *ctx, ngx_uint_t status);

/* The hypic_metrics content handler: Prometheus text format. */
ngx_int_t ngx_http_hypic_metrics_handler(ngx_http_request_t *r);

/*
 * The hypic_health content handler: {"status":"ok"|"unavailable",
 * "engines":[{"name","address","model","state", and with a mapped
 * header "node","generation","pid","slots","free_slots","running",
 * "queued","heartbeat_age_ms"}]}; 200 while an engine is up, else 503.
 */
ngx_int_t ngx_http_hypic_health_handler(ngx_http_request_t *r);


#endif /* _NGX_HTTP_HYPIC_METRICS_H_INCLUDED_ */
