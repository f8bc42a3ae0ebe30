
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


/*
 * Histogram buckets, in ms, upper bounds; each bucket counts its own
 * observations and a scrape adds them up (Prometheus buckets are
 * cumulative). TTFT buckets are vLLM's; end-to-end ones start lower, for
 * small models.
 */

static ngx_uint_t  ngx_http_hypic_ttft_ms[] = {
    1, 5, 10, 20, 40, 60, 80, 100, 250, 500, 750, 1000, 2500, 5000, 7500,
    10000
};

static ngx_uint_t  ngx_http_hypic_e2e_ms[] = {
    10, 25, 50, 100, 300, 500, 800, 1000, 1500, 2000, 2500, 5000, 10000,
    15000, 20000, 30000, 40000, 50000, 60000
};

#define NGX_HTTP_HYPIC_TTFT_N                                                 \
    (sizeof(ngx_http_hypic_ttft_ms) / sizeof(ngx_uint_t))
#define NGX_HTTP_HYPIC_E2E_N                                                  \
    (sizeof(ngx_http_hypic_e2e_ms) / sizeof(ngx_uint_t))

/* the mode label of requests stopped before their mode was known */
#define NGX_HTTP_HYPIC_MODE_NONE  4


/* room for the longer list of buckets, and +Inf */

typedef struct {
    ngx_atomic_t                buckets[NGX_HTTP_HYPIC_E2E_N + 1];
    ngx_atomic_t                sum_ms;
} ngx_http_hypic_histogram_t;


typedef struct {
    ngx_atomic_t                requests[6];  /* [c]: status c00..c99 */
    ngx_atomic_t                mode_requests[5][6];  /* [mode][c] */
    ngx_atomic_t                routes[NGX_HTTP_HYPIC_ROUTE_N];
    ngx_http_hypic_histogram_t  ttft;
    ngx_http_hypic_histogram_t  e2e;
    ngx_atomic_t                prompt_tokens;
    ngx_atomic_t                generation_tokens;
    ngx_atomic_t                cached_tokens;
    ngx_atomic_t                segment_hits;
    ngx_atomic_t                segment_misses;
    ngx_atomic_t                redis_errors;
    ngx_atomic_t                engine_errors;
} ngx_http_hypic_metrics_t;


static ngx_int_t ngx_http_hypic_metrics_init(ngx_shm_zone_t *zone,
    void *data);
static void ngx_http_hypic_observe(ngx_http_hypic_histogram_t *h,
    ngx_uint_t *bounds, ngx_uint_t n, ngx_msec_int_t ms);
static u_char *ngx_http_hypic_histogram(u_char *p, u_char *last,
    const char *name, const char *help, ngx_http_hypic_histogram_t *h,
    ngx_uint_t *bounds, ngx_uint_t n);
static u_char *ngx_http_hypic_counter(u_char *p, u_char *last,
    const char *name, const char *help, ngx_atomic_uint_t value);


static ngx_str_t  ngx_http_hypic_metrics_zone = ngx_string("hypic_metrics");

static ngx_str_t  ngx_http_hypic_metrics_type =
    ngx_string("text/plain; version=0.0.4; charset=utf-8");

static const char  *ngx_http_hypic_mode_labels[] = {
    "full", "prefix", "naive", "pic", "none"
};


#define NGX_HTTP_HYPIC_REQUESTS_HELP                                          \
    "# HELP hypic:requests_total Requests answered by hypic_pass "            \
    "locations, by status class.\n"                                           \
    "# TYPE hypic:requests_total counter\n"

/* more than a scrape ever writes: every line is bounded */
#define NGX_HTTP_HYPIC_METRICS_MAX  16384


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
ngx_http_hypic_metrics_count(ngx_http_request_t *r,
    ngx_http_hypic_ctx_t *ctx, ngx_uint_t status)
{
    ngx_uint_t                   mode, hit, total;
    ngx_time_t                  *tp;
    ngx_msec_int_t               ms;
    ngx_http_hypic_metrics_t    *m;
    ngx_http_hypic_main_conf_t  *hmcf;

    if (status < 100 || status > 599) {
        return;
    }

    hmcf = ngx_http_get_module_main_conf(r, ngx_http_hypic_module);

    m = hmcf->metrics_zone->data;

    (void) ngx_atomic_fetch_add(&m->requests[status / 100], 1);

    mode = NGX_HTTP_HYPIC_MODE_NONE;

    if (ctx == NULL) {
        (void) ngx_atomic_fetch_add(&m->mode_requests[mode][status / 100],
                                    1);
        return;
    }

    if (ctx->started) {
        mode = ctx->start.mode;

    } else if (ctx->finished) {
        mode = ctx->final.mode;

    } else if (ctx->mode_set) {
        mode = ctx->mode;
    }

    mode = ngx_min(mode, NGX_HTTP_HYPIC_MODE_NONE);

    (void) ngx_atomic_fetch_add(&m->mode_requests[mode][status / 100], 1);

    if (ctx->routed) {
        (void) ngx_atomic_fetch_add(&m->routes[ctx->route], 1);
    }

    if (ctx->route == NGX_HTTP_HYPIC_ROUTE_FALLBACK) {
        (void) ngx_atomic_fetch_add(&m->redis_errors, 1);
    }

    if (ctx->engine_error) {
        (void) ngx_atomic_fetch_add(&m->engine_errors, 1);
    }

    if (!ctx->succeeded) {
        return;
    }

    /* an answer the local engine gave in full */

    if (ctx->ttft_set) {
        ngx_http_hypic_observe(&m->ttft, ngx_http_hypic_ttft_ms,
                               NGX_HTTP_HYPIC_TTFT_N, ctx->ttft);
    }

    tp = ngx_timeofday();

    ms = (ngx_msec_int_t) ((tp->sec - r->start_sec) * 1000
                           + (tp->msec - r->start_msec));

    ngx_http_hypic_observe(&m->e2e, ngx_http_hypic_e2e_ms,
                           NGX_HTTP_HYPIC_E2E_N, ngx_max(ms, 0));

    hit = ctx->final.segs_hit;
    total = ngx_max(ctx->final.segs_total, hit);

    (void) ngx_atomic_fetch_add(&m->prompt_tokens, ctx->final.prompt_tokens);
    (void) ngx_atomic_fetch_add(&m->generation_tokens,
                                ctx->final.completion_tokens);
    (void) ngx_atomic_fetch_add(&m->cached_tokens, ctx->final.cached_tokens);
    (void) ngx_atomic_fetch_add(&m->segment_hits, hit);
    (void) ngx_atomic_fetch_add(&m->segment_misses, total - hit);
}


static void
ngx_http_hypic_observe(ngx_http_hypic_histogram_t *h, ngx_uint_t *bounds,
    ngx_uint_t n, ngx_msec_int_t ms)
{
    ngx_uint_t  i;

    for (i = 0; i < n; i++) {
        if ((ngx_uint_t) ms <= bounds[i]) {
            break;
        }
    }

    /* i == n: the +Inf bucket */

    (void) ngx_atomic_fetch_add(&h->buckets[i], 1);
    (void) ngx_atomic_fetch_add(&h->sum_ms, (ngx_atomic_int_t) ms);
}


ngx_int_t
ngx_http_hypic_metrics_handler(ngx_http_request_t *r)
{
    u_char                      *p, *last;
    ngx_uint_t                   i, k;
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

    p = ngx_pnalloc(r->pool, NGX_HTTP_HYPIC_METRICS_MAX);
    if (p == NULL) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    ngx_memzero(&cv, sizeof(ngx_http_complex_value_t));

    cv.value.data = p;
    last = p + NGX_HTTP_HYPIC_METRICS_MAX;

    p = ngx_cpymem(p, NGX_HTTP_HYPIC_REQUESTS_HELP,
                   sizeof(NGX_HTTP_HYPIC_REQUESTS_HELP) - 1);

    for (i = 1; i <= 5; i++) {
        p = ngx_slprintf(p, last,
                         "hypic:requests_total{code=\"%uixx\"} %uA\n",
                         i, m->requests[i]);
    }

    p = ngx_slprintf(p, last,
                     "# HELP hypic:mode_requests_total Requests answered "
                     "by hypic_pass locations, by mode (\"none\": answered "
                     "before one was chosen) and status class.\n"
                     "# TYPE hypic:mode_requests_total counter\n");

    for (k = 0; k <= NGX_HTTP_HYPIC_MODE_NONE; k++) {
        for (i = 1; i <= 5; i++) {
            p = ngx_slprintf(p, last,
                             "hypic:mode_requests_total{mode=\"%s\","
                             "code=\"%uixx\"} %uA\n",
                             ngx_http_hypic_mode_labels[k], i,
                             m->mode_requests[k][i]);
        }
    }

    p = ngx_slprintf(p, last,
                     "# HELP hypic:routes_total Requests by where "
                     "hypic_routing sent them.\n"
                     "# TYPE hypic:routes_total counter\n");

    for (i = 0; i < NGX_HTTP_HYPIC_ROUTE_N; i++) {
        p = ngx_slprintf(p, last, "hypic:routes_total{route=\"%V\"} %uA\n",
                         ngx_http_hypic_route_name(i), m->routes[i]);
    }

    p = ngx_http_hypic_histogram(p, last,
                                 "hypic:time_to_first_token_seconds",
                                 "Time from the request to its first "
                                 "token, for answers the local engine "
                                 "completed.", &m->ttft,
                                 ngx_http_hypic_ttft_ms,
                                 NGX_HTTP_HYPIC_TTFT_N);

    p = ngx_http_hypic_histogram(p, last,
                                 "hypic:e2e_request_latency_seconds",
                                 "Time from the request to its end, for "
                                 "answers the local engine completed.",
                                 &m->e2e, ngx_http_hypic_e2e_ms,
                                 NGX_HTTP_HYPIC_E2E_N);

    p = ngx_http_hypic_counter(p, last, "hypic:prompt_tokens_total",
                               "Prompt tokens of completed answers.",
                               m->prompt_tokens);
    p = ngx_http_hypic_counter(p, last, "hypic:generation_tokens_total",
                               "Tokens generated for completed answers.",
                               m->generation_tokens);
    p = ngx_http_hypic_counter(p, last, "hypic:cached_tokens_total",
                               "Prompt tokens taken from a cache.",
                               m->cached_tokens);
    p = ngx_http_hypic_counter(p, last, "hypic:segment_hits_total",
                               "Prompt segments found in the segment "
                               "cache.", m->segment_hits);
    p = ngx_http_hypic_counter(p, last, "hypic:segment_misses_total",
                               "Prompt segments computed.",
                               m->segment_misses);
    p = ngx_http_hypic_counter(p, last, "hypic:redis_lookup_errors_total",
                               "Requests routed locally because Redis "
                               "was down, slow or wrong.",
                               m->redis_errors);
    p = ngx_http_hypic_counter(p, last, "hypic:engine_errors_total",
                               "Requests the engine could not serve "
                               "(unavailable, failed, timed out).",
                               m->engine_errors);

    cv.value.len = p - cv.value.data;

    return ngx_http_send_response(r, NGX_HTTP_OK,
                                  &ngx_http_hypic_metrics_type, &cv);
}


static u_char *
ngx_http_hypic_histogram(u_char *p, u_char *last, const char *name,
    const char *help, ngx_http_hypic_histogram_t *h, ngx_uint_t *bounds,
    ngx_uint_t n)
{
    ngx_uint_t         i;
    ngx_atomic_uint_t  sum_ms, count;

    p = ngx_slprintf(p, last, "# HELP %s %s\n# TYPE %s histogram\n",
                     name, help, name);

    count = 0;

    for (i = 0; i < n; i++) {
        count += h->buckets[i];

        p = ngx_slprintf(p, last, "%s_bucket{le=\"%ui.%03ui\"} %uA\n",
                         name, bounds[i] / 1000, bounds[i] % 1000, count);
    }

    count += h->buckets[n];
    sum_ms = h->sum_ms;

    return ngx_slprintf(p, last,
                        "%s_bucket{le=\"+Inf\"} %uA\n"
                        "%s_sum %uA.%03uA\n"
                        "%s_count %uA\n",
                        name, count, name, sum_ms / 1000, sum_ms % 1000,
                        name, count);
}


static u_char *
ngx_http_hypic_counter(u_char *p, u_char *last, const char *name,
    const char *help, ngx_atomic_uint_t value)
{
    return ngx_slprintf(p, last,
                        "# HELP %s %s\n# TYPE %s counter\n%s %uA\n",
                        name, help, name, name, value);
}
