
/*
 * HYPIC serve: what an operator and a load balancer look at - the
 * metrics zone, its counters and the hypic_metrics handler, with gauges
 * of each engine read from its shared header; and the hypic_health
 * handler.
 */


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include "ngx_http_hypic_module.h"
#include "ngx_http_hypic_engine.h"
#include "ngx_http_hypic_handler.h"
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
#define NGX_HTTP_HYPIC_MODE_NONE  (HP_IPC_MODE_PIC + 1)

/* how long /health waits for an engine that accepted us to say hello */
#define NGX_HTTP_HYPIC_HEALTH_WAIT  1000

/* the per-engine values of the gauges, from its shared header */
#define NGX_HTTP_HYPIC_G_GENERATION      0
#define NGX_HTTP_HYPIC_G_HEARTBEAT       1
#define NGX_HTTP_HYPIC_G_RUNNING         2
#define NGX_HTTP_HYPIC_G_QUEUED          3
#define NGX_HTTP_HYPIC_G_SLOTS           4
#define NGX_HTTP_HYPIC_G_FREE_SLOTS      5
#define NGX_HTTP_HYPIC_G_POOL_USED       6
#define NGX_HTTP_HYPIC_G_POOL_BUDGET     7
#define NGX_HTTP_HYPIC_G_POOL_ENTRIES    8
#define NGX_HTTP_HYPIC_G_POOL_EVICTIONS  9
#define NGX_HTTP_HYPIC_G_PREEMPTIONS     10

/* bytes of one engine's sample lines, besides its name */
#define NGX_HTTP_HYPIC_ENGINE_METRICS    4096
#define NGX_HTTP_HYPIC_ENGINE_LINES      32


/* room for the longer list of buckets, and +Inf */

typedef struct {
    ngx_atomic_t                buckets[NGX_HTTP_HYPIC_E2E_N + 1];
    ngx_atomic_t                sum_ms;
} ngx_http_hypic_histogram_t;


typedef struct {
    ngx_atomic_t                requests[6];  /* [c]: status c00..c99 */
    ngx_atomic_t                mode_requests[NGX_HTTP_HYPIC_MODE_NONE + 1]
                                             [6];  /* [mode][c] */
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


/* one family of per-engine gauges */

typedef struct {
    const char                 *name;
    const char                 *type;
    const char                 *help;
    ngx_uint_t                  field;        /* NGX_HTTP_HYPIC_G_* */
    ngx_uint_t                  per_pool;     /* one sample per pool */
} ngx_http_hypic_gauge_t;


/* a /health request that waits for engines to say hello */

typedef struct {
    ngx_http_request_t         *request;
    ngx_http_hypic_watch_t      watch;
    ngx_event_t                 timer;        /* the longest wait */
    unsigned                    expired:1;
} ngx_http_hypic_health_t;


static ngx_int_t ngx_http_hypic_metrics_init(ngx_shm_zone_t *zone,
    void *data);
static void ngx_http_hypic_observe(ngx_http_hypic_histogram_t *h,
    ngx_uint_t *bounds, ngx_uint_t n, ngx_msec_int_t ms);
static u_char *ngx_http_hypic_histogram(u_char *p, u_char *last,
    const char *name, const char *help, ngx_http_hypic_histogram_t *h,
    ngx_uint_t *bounds, ngx_uint_t n);
static u_char *ngx_http_hypic_counter(u_char *p, u_char *last,
    const char *name, const char *help, ngx_atomic_uint_t value);
static ngx_http_hypic_engine_state_t *ngx_http_hypic_states(
    ngx_http_request_t *r, ngx_uint_t connect);
static u_char *ngx_http_hypic_engine_gauges(u_char *p, u_char *last,
    ngx_http_hypic_main_conf_t *hmcf, ngx_http_hypic_engine_state_t *st);
static uint64_t ngx_http_hypic_gauge_value(ngx_http_hypic_engine_state_t *st,
    ngx_uint_t field, ngx_uint_t pool);
static u_char *ngx_http_hypic_label(u_char *p, u_char *last,
    const char *name, const char *value, size_t max);
static ngx_int_t ngx_http_hypic_health_answer(ngx_http_hypic_health_t *h,
    ngx_uint_t connect);
static void ngx_http_hypic_health_look(ngx_event_t *ev);
static void ngx_http_hypic_health_cleanup(void *data);


static ngx_str_t  ngx_http_hypic_metrics_zone = ngx_string("hypic_metrics");

static ngx_str_t  ngx_http_hypic_metrics_type =
    ngx_string("text/plain; version=0.0.4; charset=utf-8");

static const char  *ngx_http_hypic_mode_labels[] = {
    "full", "prefix", "naive", "pic", "none"
};

static const char  *ngx_http_hypic_state_names[] = {
    "down", "starting", "up", "draining", "stalled"    /* STATE_* */
};

static const char  *ngx_http_hypic_pool_names[] = {
    "public", "private", "sequence"                    /* HP_IPC_POOL_* */
};

static ngx_http_hypic_gauge_t  ngx_http_hypic_gauges[] = {

    { "hypic:engine_generation", "gauge",
      "The engine's generation (one more at every engine start).",
      NGX_HTTP_HYPIC_G_GENERATION, 0 },

    { "hypic:engine_heartbeat_age_seconds", "gauge",
      "Time since the engine's main loop last wrote its heartbeat.",
      NGX_HTTP_HYPIC_G_HEARTBEAT, 0 },

    { "hypic:num_requests_running", "gauge",
      "Requests the engine runs (prefill or decode).",
      NGX_HTTP_HYPIC_G_RUNNING, 0 },

    { "hypic:num_requests_waiting", "gauge",
      "Requests queued in the engine, not yet started.",
      NGX_HTTP_HYPIC_G_QUEUED, 0 },

    { "hypic:slots", "gauge",
      "Request slots of the engine (requests in flight at most).",
      NGX_HTTP_HYPIC_G_SLOTS, 0 },

    { "hypic:slots_free", "gauge",
      "Request slots free for new requests.",
      NGX_HTTP_HYPIC_G_FREE_SLOTS, 0 },

    { "hypic:pool_used_bytes", "gauge",
      "Bytes held in a pool (public: segments; private: prefix cache; "
      "sequence: the running requests' states and K/V).",
      NGX_HTTP_HYPIC_G_POOL_USED, 1 },

    { "hypic:pool_budget_bytes", "gauge",
      "A pool's budget (sequence: what the engine's sequence memory "
      "leaves to requests; 0: no pool, each request allocates).",
      NGX_HTTP_HYPIC_G_POOL_BUDGET, 1 },

    { "hypic:pool_entries", "gauge",
      "Entries of a pool (public: segments; private: prefix tree nodes; "
      "sequence: sequences held).",
      NGX_HTTP_HYPIC_G_POOL_ENTRIES, 1 },

    { "hypic:pool_evictions_total", "counter",
      "Entries a pool dropped to make room, since the engine started "
      "(sequence: requests preempted).",
      NGX_HTTP_HYPIC_G_POOL_EVICTIONS, 1 },

    { "hypic:preemptions_total", "counter",
      "Requests that gave their sequence memory back for others to grow "
      "into, since the engine started; each prefilled its context again "
      "once readmitted.",
      NGX_HTTP_HYPIC_G_PREEMPTIONS, 0 }
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

    if (ctx->out.started || ctx->out.finished) {
        mode = ctx->out.start.mode;

    } else if (ctx->in.mode_set) {
        mode = ctx->in.mode;
    }

    mode = ngx_min(mode, NGX_HTTP_HYPIC_MODE_NONE);

    (void) ngx_atomic_fetch_add(&m->mode_requests[mode][status / 100], 1);

    if (ctx->routing.routed) {
        (void) ngx_atomic_fetch_add(&m->routes[ctx->routing.route], 1);
    }

    if (ctx->routing.route == NGX_HTTP_HYPIC_ROUTE_FALLBACK) {
        (void) ngx_atomic_fetch_add(&m->redis_errors, 1);
    }

    if (ctx->out.engine_error) {
        (void) ngx_atomic_fetch_add(&m->engine_errors, 1);
    }

    if (!ctx->out.succeeded) {
        return;
    }

    /* an answer the local engine gave in full */

    if (ctx->out.ttft_set) {
        ngx_http_hypic_observe(&m->ttft, ngx_http_hypic_ttft_ms,
                               NGX_HTTP_HYPIC_TTFT_N, ctx->out.ttft);
    }

    tp = ngx_timeofday();

    ms = (ngx_msec_int_t) ((tp->sec - r->start_sec) * 1000
                           + (tp->msec - r->start_msec));

    ngx_http_hypic_observe(&m->e2e, ngx_http_hypic_e2e_ms,
                           NGX_HTTP_HYPIC_E2E_N, ngx_max(ms, 0));

    hit = ctx->out.final.segs_hit;
    total = ngx_max(ctx->out.final.segs_total, hit);

    (void) ngx_atomic_fetch_add(&m->prompt_tokens,
                                ctx->out.final.prompt_tokens);
    (void) ngx_atomic_fetch_add(&m->generation_tokens,
                                ctx->out.final.completion_tokens);
    (void) ngx_atomic_fetch_add(&m->cached_tokens,
                                ctx->out.final.cached_tokens);
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
    u_char                         *p, *last;
    size_t                          len;
    ngx_uint_t                      i, k;
    ngx_http_complex_value_t        cv;
    ngx_http_hypic_engine_t        *engine;
    ngx_http_hypic_metrics_t       *m;
    ngx_http_hypic_main_conf_t     *hmcf;
    ngx_http_hypic_engine_state_t  *st;

    if (!(r->method & (NGX_HTTP_GET|NGX_HTTP_HEAD))) {
        return ngx_http_hypic_send_error(r, NGX_HTTP_NOT_ALLOWED,
                                         NGX_HTTP_HYPIC_INVALID_REQUEST,
                                         "method_not_allowed", NULL,
                                         "metrics answer GET only");
    }

    hmcf = ngx_http_get_module_main_conf(r, ngx_http_hypic_module);

    m = hmcf->metrics_zone->data;

    /* a scrape connects a link that is down, but never waits for it */

    st = ngx_http_hypic_states(r, 1);
    if (st == NULL) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    len = NGX_HTTP_HYPIC_METRICS_MAX;
    engine = hmcf->engines.elts;

    for (i = 0; i < hmcf->engines.nelts; i++) {
        len += NGX_HTTP_HYPIC_ENGINE_METRICS
               + NGX_HTTP_HYPIC_ENGINE_LINES * engine[i].name.len;
    }

    p = ngx_pnalloc(r->pool, len);
    if (p == NULL) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    ngx_memzero(&cv, sizeof(ngx_http_complex_value_t));

    cv.value.data = p;
    last = p + len;

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

    p = ngx_http_hypic_engine_gauges(p, last, hmcf, st);

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


/* The state of every engine of the http block, in their order. */

static ngx_http_hypic_engine_state_t *
ngx_http_hypic_states(ngx_http_request_t *r, ngx_uint_t connect)
{
    ngx_uint_t                      i;
    ngx_http_hypic_engine_t        *engine;
    ngx_http_hypic_main_conf_t     *hmcf;
    ngx_http_hypic_engine_state_t  *st;

    hmcf = ngx_http_get_module_main_conf(r, ngx_http_hypic_module);

    st = ngx_palloc(r->pool, (hmcf->engines.nelts + 1)
                             * sizeof(ngx_http_hypic_engine_state_t));
    if (st == NULL) {
        return NULL;
    }

    engine = hmcf->engines.elts;

    for (i = 0; i < hmcf->engines.nelts; i++) {
        ngx_http_hypic_engine_state(&engine[i], connect, &st[i]);
    }

    return st;
}


/* Each engine's state, then its gauges where its header is mapped. */

static u_char *
ngx_http_hypic_engine_gauges(u_char *p, u_char *last,
    ngx_http_hypic_main_conf_t *hmcf, ngx_http_hypic_engine_state_t *st)
{
    uint64_t                  v;
    ngx_uint_t                i, k, n, g;
    ngx_http_hypic_gauge_t   *gauge;
    ngx_http_hypic_engine_t  *engine;

    engine = hmcf->engines.elts;

    p = ngx_slprintf(p, last,
                     "# HELP hypic:engine_state The engine's state as "
                     "nginx sees it: 1 for the state it is in.\n"
                     "# TYPE hypic:engine_state gauge\n");

    for (i = 0; i < hmcf->engines.nelts; i++) {
        for (k = 0; k < NGX_HTTP_HYPIC_STATE_N; k++) {
            p = ngx_slprintf(p, last,
                             "hypic:engine_state{engine=\"%V\","
                             "state=\"%s\"} %d\n",
                             &engine[i].name, ngx_http_hypic_state_names[k],
                             st[i].state == k);
        }
    }

    p = ngx_slprintf(p, last,
                     "# HELP hypic:engine_info What an engine that said "
                     "hello serves, and where its model runs.\n"
                     "# TYPE hypic:engine_info gauge\n");

    for (i = 0; i < hmcf->engines.nelts; i++) {
        if (st[i].shm == NULL) {
            continue;
        }

        p = ngx_slprintf(p, last, "hypic:engine_info{engine=\"%V\"",
                         &engine[i].name);
        p = ngx_http_hypic_label(p, last, "node", st[i].shm->node,
                                 sizeof(st[i].shm->node));
        p = ngx_http_hypic_label(p, last, "model", st[i].shm->model,
                                 sizeof(st[i].shm->model));
        p = ngx_http_hypic_label(p, last, "device", st[i].shm->device,
                                 sizeof(st[i].shm->device));
        p = ngx_http_hypic_label(p, last, "device_name",
                                 st[i].shm->device_name,
                                 sizeof(st[i].shm->device_name));
        p = ngx_slprintf(p, last, "} 1\n");
    }

    for (g = 0; g < sizeof(ngx_http_hypic_gauges)
                    / sizeof(ngx_http_hypic_gauge_t); g++)
    {
        gauge = &ngx_http_hypic_gauges[g];

        p = ngx_slprintf(p, last, "# HELP %s %s\n# TYPE %s %s\n",
                         gauge->name, gauge->help, gauge->name,
                         gauge->type);

        for (i = 0; i < hmcf->engines.nelts; i++) {
            if (st[i].shm == NULL) {
                continue;
            }

            n = gauge->per_pool ? HP_IPC_POOLS : 1;

            for (k = 0; k < n; k++) {
                v = ngx_http_hypic_gauge_value(&st[i], gauge->field, k);

                p = ngx_slprintf(p, last, "%s{engine=\"%V\"", gauge->name,
                                 &engine[i].name);

                if (gauge->per_pool) {
                    p = ngx_slprintf(p, last, ",pool=\"%s\"",
                                     ngx_http_hypic_pool_names[k]);
                }

                if (gauge->field == NGX_HTTP_HYPIC_G_HEARTBEAT) {
                    p = ngx_slprintf(p, last, "} %uL.%03uL\n", v / 1000,
                                     v % 1000);

                } else {
                    p = ngx_slprintf(p, last, "} %uL\n", v);
                }
            }
        }
    }

    return p;
}


/*
 * ,name="value" from a string of the engine's header (NUL-terminated
 * within max bytes, or cut there), escaped as the exposition format
 * wants: backslash, double quote and line feed.
 */

static u_char *
ngx_http_hypic_label(u_char *p, u_char *last, const char *name,
    const char *value, size_t max)
{
    u_char  c;
    size_t  i, n;

    n = ngx_strnlen((u_char *) value, max);

    p = ngx_slprintf(p, last, ",%s=\"", name);

    for (i = 0; i < n && last - p > 2; i++) {
        c = (u_char) value[i];

        if (c == '\\' || c == '"' || c == '\n') {
            *p++ = '\\';
            c = (c == '\n') ? 'n' : c;
        }

        *p++ = c;
    }

    return ngx_slprintf(p, last, "\"");
}


static uint64_t
ngx_http_hypic_gauge_value(ngx_http_hypic_engine_state_t *st,
    ngx_uint_t field, ngx_uint_t pool)
{
    hp_ipc_header_t       *shm;
    hp_ipc_pool_gauges_t  *pg;

    shm = st->shm;
    pg = &shm->pools[pool];

    switch (field) {

    case NGX_HTTP_HYPIC_G_GENERATION:
        return st->generation;

    case NGX_HTTP_HYPIC_G_HEARTBEAT:
        return st->heartbeat_age;

    case NGX_HTTP_HYPIC_G_RUNNING:
        return atomic_load_explicit(&shm->running, memory_order_relaxed);

    case NGX_HTTP_HYPIC_G_QUEUED:
        return atomic_load_explicit(&shm->queued, memory_order_relaxed);

    case NGX_HTTP_HYPIC_G_SLOTS:
        return shm->n_slots;

    case NGX_HTTP_HYPIC_G_FREE_SLOTS:
        return st->free_slots;

    case NGX_HTTP_HYPIC_G_POOL_USED:
        return atomic_load_explicit(&pg->bytes_used, memory_order_relaxed);

    case NGX_HTTP_HYPIC_G_POOL_BUDGET:
        return atomic_load_explicit(&pg->budget, memory_order_relaxed);

    case NGX_HTTP_HYPIC_G_POOL_ENTRIES:
        return atomic_load_explicit(&pg->entries, memory_order_relaxed);

    case NGX_HTTP_HYPIC_G_PREEMPTIONS:
        pg = &shm->pools[HP_IPC_POOL_SEQUENCE];
        return atomic_load_explicit(&pg->evictions, memory_order_relaxed);

    default: /* NGX_HTTP_HYPIC_G_POOL_EVICTIONS */
        return atomic_load_explicit(&pg->evictions, memory_order_relaxed);
    }
}


/* ---- /health -------------------------------------------------------- */


ngx_int_t
ngx_http_hypic_health_handler(ngx_http_request_t *r)
{
    ngx_int_t                 rc;
    ngx_pool_cleanup_t       *cln;
    ngx_http_hypic_health_t  *h;

    if (!(r->method & (NGX_HTTP_GET|NGX_HTTP_HEAD))) {
        return ngx_http_hypic_not_allowed(r, "GET, HEAD");
    }

    h = ngx_pcalloc(r->pool, sizeof(ngx_http_hypic_health_t));
    if (h == NULL) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    cln = ngx_pool_cleanup_add(r->pool, 0);
    if (cln == NULL) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    cln->handler = ngx_http_hypic_health_cleanup;
    cln->data = h;

    h->request = r;

    h->watch.event.handler = ngx_http_hypic_health_look;
    h->watch.event.data = h;
    h->watch.event.log = r->connection->log;

    h->timer.handler = ngx_http_hypic_health_look;
    h->timer.data = h;
    h->timer.log = r->connection->log;

    rc = ngx_http_hypic_health_answer(h, 1);

    if (rc == NGX_DONE) {
        r->main->count++;
        ngx_add_timer(&h->timer, NGX_HTTP_HYPIC_HEALTH_WAIT);
    }

    return rc;
}


/*
 * Answers, or waits (NGX_DONE) while an engine that accepted us has not
 * said hello yet: a worker's first look at a healthy engine says "up",
 * not "starting". connect: links that are down connect first.
 */

static ngx_int_t
ngx_http_hypic_health_answer(ngx_http_hypic_health_t *h, ngx_uint_t connect)
{
    u_char                         *p;
    size_t                          len;
    uint32_t                        running, queued;
    ngx_str_t                       body, node;
    ngx_uint_t                      i, up;
    hp_ipc_header_t                *shm;
    ngx_http_request_t             *r;
    ngx_http_hypic_engine_t        *engine;
    ngx_http_hypic_main_conf_t     *hmcf;
    ngx_http_hypic_engine_state_t  *st;

    r = h->request;

    hmcf = ngx_http_get_module_main_conf(r, ngx_http_hypic_module);
    engine = hmcf->engines.elts;

    st = ngx_http_hypic_states(r, connect);
    if (st == NULL) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    for (i = 0; i < hmcf->engines.nelts && !h->expired; i++) {
        if (st[i].state == NGX_HTTP_HYPIC_STATE_STARTING) {
            ngx_http_hypic_engine_watch(&engine[i], &h->watch);
            return NGX_DONE;
        }
    }

    ngx_http_hypic_health_cleanup(h);

    len = sizeof("{\"status\":\"unavailable\",\"engines\":[]}") - 1;

    for (i = 0; i < hmcf->engines.nelts; i++) {
        len += sizeof(",{\"name\":\"\",\"address\":\"\",\"model\":\"\","
                      "\"state\":\"starting\",\"node\":\"\","
                      "\"device\":\"\",\"device_name\":\"\","
                      "\"generation\":,\"pid\":,\"slots\":,"
                      "\"free_slots\":,\"running\":,\"queued\":,"
                      "\"heartbeat_age_ms\":}") - 1
               + 7 * NGX_INT64_LEN
               + ngx_http_hypic_json_escape_len(engine[i].name.data,
                                                engine[i].name.len)
               + ngx_http_hypic_json_escape_len(engine[i].address.data,
                                                engine[i].address.len)
               + ngx_http_hypic_json_escape_len(engine[i].model.data,
                                                engine[i].model.len)
               + 6 * (2 * HP_IPC_NAME_BYTES + 32);
                                    /* node, device names, escaped */
    }

    p = ngx_pnalloc(r->pool, len);
    if (p == NULL) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    body.data = p;

    /* the node is up while one of its engines can serve */

    up = 0;

    for (i = 0; i < hmcf->engines.nelts; i++) {
        up |= st[i].state == NGX_HTTP_HYPIC_STATE_UP;
    }

    p = ngx_sprintf(p, "{\"status\":\"%s\",\"engines\":[",
                    up ? "ok" : "unavailable");

    for (i = 0; i < hmcf->engines.nelts; i++) {
        if (i) {
            *p++ = ',';
        }

        p = ngx_cpymem(p, "{\"name\":\"", sizeof("{\"name\":\"") - 1);
        p = ngx_http_hypic_json_escape(p, engine[i].name.data,
                                       engine[i].name.len);
        p = ngx_cpymem(p, "\",\"address\":\"", sizeof("\",\"address\":\"") - 1);
        p = ngx_http_hypic_json_escape(p, engine[i].address.data,
                                       engine[i].address.len);
        p = ngx_cpymem(p, "\",\"model\":\"", sizeof("\",\"model\":\"") - 1);
        p = ngx_http_hypic_json_escape(p, engine[i].model.data,
                                       engine[i].model.len);
        p = ngx_sprintf(p, "\",\"state\":\"%s\"",
                        ngx_http_hypic_state_names[st[i].state]);

        shm = st[i].shm;

        if (shm == NULL) {
            *p++ = '}';
            continue;
        }

        node.data = (u_char *) shm->node;
        node.len = ngx_strnlen(node.data, HP_IPC_NAME_BYTES - 1);

        running = atomic_load_explicit(&shm->running, memory_order_relaxed);
        queued = atomic_load_explicit(&shm->queued, memory_order_relaxed);

        p = ngx_cpymem(p, ",\"node\":\"", sizeof(",\"node\":\"") - 1);
        p = ngx_http_hypic_json_escape(p, node.data, node.len);

        node.data = (u_char *) shm->device;
        node.len = ngx_strnlen(node.data, sizeof(shm->device));
        p = ngx_cpymem(p, "\",\"device\":\"", sizeof("\",\"device\":\"") - 1);
        p = ngx_http_hypic_json_escape(p, node.data, node.len);

        node.data = (u_char *) shm->device_name;
        node.len = ngx_strnlen(node.data, sizeof(shm->device_name));
        p = ngx_cpymem(p, "\",\"device_name\":\"",
                       sizeof("\",\"device_name\":\"") - 1);
        p = ngx_http_hypic_json_escape(p, node.data, node.len);
        p = ngx_sprintf(p, "\",\"generation\":%uL,\"pid\":%D,"
                        "\"slots\":%uD,\"free_slots\":%uD,"
                        "\"running\":%uD,\"queued\":%uD,"
                        "\"heartbeat_age_ms\":%uL}",
                        st[i].generation, shm->engine_pid, shm->n_slots,
                        st[i].free_slots, running, queued,
                        st[i].heartbeat_age);
    }

    p = ngx_cpymem(p, "]}", sizeof("]}") - 1);

    body.len = p - body.data;

    return ngx_http_hypic_send_json(r, up ? NGX_HTTP_OK
                                          : NGX_HTTP_SERVICE_UNAVAILABLE,
                                    &body);
}


static void
ngx_http_hypic_health_look(ngx_event_t *ev)
{
    ngx_int_t                 rc;
    ngx_connection_t         *c;
    ngx_http_request_t       *r;
    ngx_http_hypic_health_t  *h;

    h = ev->data;
    r = h->request;
    c = r->connection;

    if (ev == &h->timer) {
        h->expired = 1;
    }

    rc = ngx_http_hypic_health_answer(h, 0);

    if (rc == NGX_DONE) {
        return;
    }

    ngx_http_finalize_request(r, rc);
    ngx_http_run_posted_requests(c);
}


static void
ngx_http_hypic_health_cleanup(void *data)
{
    ngx_http_hypic_health_t  *h = data;

    ngx_http_hypic_engine_unwatch(&h->watch);

    if (h->timer.timer_set) {
        ngx_del_timer(&h->timer);
    }
}
