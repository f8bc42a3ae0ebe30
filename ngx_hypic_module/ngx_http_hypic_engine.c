
/*
 * HYPIC serve: the engine client (the protocol is in engine/contract/hp_ipc.h).
 *
 * A link is one worker's unix-socket connection to one engine. It is
 * opened by the first request that needs it: connect(2) on a unix socket
 * never blocks, and a refused or missing socket is a 503 at once. The
 * engine answers with a hello and the descriptor of its shared segment,
 * which the worker maps; requests that came meanwhile wait on the link.
 * From then on the socket only carries wake-up bytes, both ways: it sits
 * in the event loop level-triggered, and every wake-up drains the rings
 * of the link's requests. When the socket closes (engine stopped,
 * crashed or restarted), every request on the link fails cleanly and the
 * segment is unmapped; the next request connects again and meets the new
 * engine generation.
 *
 * A request holds its slot from claim to release; the pool cleanup
 * releases it whatever ends the request (client gone, timeout, error),
 * which cancels it in the engine if it is still running.
 *
 * An engine that keeps its socket but stops working (SIGSTOP, a hung
 * main loop) closes nothing: its heartbeat in the shared header goes
 * stale instead. Once it is hypic_stall_timeout old, a new request gets
 * 503 at once and a watchdog, armed while the link has requests, fails
 * those in flight; the link stays, so an engine that resumes serves on.
 */


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include <sys/mman.h>
#include <sys/un.h>

#include "ngx_http_hypic_module.h"
#include "ngx_http_hypic_engine.h"
#include "ngx_http_hypic_handler.h"
#include "ngx_http_hypic_response.h"
#include "ngx_http_hypic_json.h"


#define NGX_HTTP_HYPIC_LINK_DOWN     0
#define NGX_HTTP_HYPIC_LINK_HELLO    1
#define NGX_HTTP_HYPIC_LINK_UP       2

/* how long an engine that accepted us may take to say hello */
#define NGX_HTTP_HYPIC_HELLO_TIMEOUT  3000


struct ngx_http_hypic_link_s {
    ngx_http_hypic_engine_t    *engine;
    ngx_connection_t           *connection;
    ngx_event_t                 hello_timer;
    ngx_event_t                 watchdog;     /* stall checks, while busy */
    ngx_msec_t                  stall_timeout;
    ngx_uint_t                  state;
    unsigned                    stalled:1;    /* as last seen, for the log */

    hp_ipc_header_t            *shm;
    size_t                      shm_size;
    uint64_t                    generation;   /* of the last engine seen */
    uint32_t                    conn_id;
    u_char                      node[HP_IPC_NAME_BYTES];
    size_t                      node_len;
    u_char                      model[HP_IPC_MODEL_BYTES];
    size_t                      model_len;
    u_char                      fingerprint[16];
    unsigned                    has_fingerprint:1;

    hp_ipc_hello_t              hello;
    size_t                      hello_len;
    ngx_fd_t                    hello_fd;

    ngx_queue_t                 waiting;      /* ctx: before the hello */
    ngx_queue_t                 active;       /* ctx: holding a slot */
    ngx_queue_t                 watchers;     /* ngx_http_hypic_watch_t */
};


static ngx_int_t ngx_http_hypic_link_connect(ngx_http_hypic_link_t *link,
    ngx_uint_t level);
static void ngx_http_hypic_link_read(ngx_event_t *rev);
static ngx_int_t ngx_http_hypic_link_hello(ngx_http_hypic_link_t *link);
static ngx_int_t ngx_http_hypic_link_up(ngx_http_hypic_link_t *link);
static void ngx_http_hypic_link_hello_timeout(ngx_event_t *ev);
static void ngx_http_hypic_link_dummy(ngx_event_t *ev);
static void ngx_http_hypic_link_fail(ngx_http_hypic_link_t *link,
    const char *why, ngx_err_t err);
static void ngx_http_hypic_link_fail_requests(ngx_http_hypic_link_t *link,
    ngx_queue_t *list, const char *what);
static ngx_uint_t ngx_http_hypic_link_stalled(ngx_http_hypic_link_t *link);
static void ngx_http_hypic_link_watchdog(ngx_event_t *ev);
static void ngx_http_hypic_link_notify(ngx_http_hypic_link_t *link);
static void ngx_http_hypic_link_close(ngx_http_hypic_link_t *link);
static void ngx_http_hypic_link_wake(ngx_http_hypic_link_t *link);
static ngx_int_t ngx_http_hypic_engine_send(ngx_http_request_t *r,
    ngx_http_hypic_ctx_t *ctx);
static ngx_int_t ngx_http_hypic_engine_unavailable(ngx_http_request_t *r,
    ngx_http_hypic_ctx_t *ctx, const char *what);
static void ngx_http_hypic_engine_read(ngx_http_request_t *r,
    ngx_http_hypic_ctx_t *ctx);
static void ngx_http_hypic_engine_timeout(ngx_event_t *ev);
static void ngx_http_hypic_engine_cleanup(void *data);


ngx_int_t
ngx_http_hypic_engine_init_process(ngx_cycle_t *cycle)
{
    ngx_uint_t                   i;
    ngx_http_hypic_link_t       *link;
    ngx_http_hypic_engine_t     *engine;
    ngx_http_hypic_main_conf_t  *hmcf;

    if (ngx_process != NGX_PROCESS_WORKER
        && ngx_process != NGX_PROCESS_SINGLE)
    {
        return NGX_OK;
    }

    if (cycle->conf_ctx[ngx_http_module.index] == NULL) {
        return NGX_OK;
    }

    hmcf = ngx_http_cycle_get_module_main_conf(cycle, ngx_http_hypic_module);
    if (hmcf == NULL) {
        return NGX_OK;
    }

    engine = hmcf->engines.elts;

    for (i = 0; i < hmcf->engines.nelts; i++) {
        link = ngx_pcalloc(cycle->pool, sizeof(ngx_http_hypic_link_t));
        if (link == NULL) {
            return NGX_ERROR;
        }

        link->engine = &engine[i];
        link->hello_fd = NGX_INVALID_FILE;
        link->hello_timer.handler = ngx_http_hypic_link_hello_timeout;
        link->hello_timer.data = link;
        link->hello_timer.log = cycle->log;
        link->hello_timer.cancelable = 1;

        link->watchdog.handler = ngx_http_hypic_link_watchdog;
        link->watchdog.data = link;
        link->watchdog.log = cycle->log;
        link->watchdog.cancelable = 1;
        link->stall_timeout = hmcf->stall_timeout;

        ngx_queue_init(&link->waiting);
        ngx_queue_init(&link->active);
        ngx_queue_init(&link->watchers);

        engine[i].link = link;
    }

    return NGX_OK;
}


void
ngx_http_hypic_engine_exit_process(ngx_cycle_t *cycle)
{
    ngx_uint_t                   i;
    ngx_http_hypic_engine_t     *engine;
    ngx_http_hypic_main_conf_t  *hmcf;

    if (cycle->conf_ctx[ngx_http_module.index] == NULL) {
        return;
    }

    hmcf = ngx_http_cycle_get_module_main_conf(cycle, ngx_http_hypic_module);
    if (hmcf == NULL) {
        return;
    }

    engine = hmcf->engines.elts;

    for (i = 0; i < hmcf->engines.nelts; i++) {
        if (engine[i].link) {
            ngx_http_hypic_link_close(engine[i].link);
        }
    }
}


ngx_int_t
ngx_http_hypic_engine_submit(ngx_http_request_t *r,
    ngx_http_hypic_ctx_t *ctx)
{
    ngx_int_t                   rc;
    ngx_pool_cleanup_t         *cln;
    ngx_http_hypic_link_t      *link;
    ngx_http_hypic_loc_conf_t  *hlcf;

    hlcf = ngx_http_get_module_loc_conf(r, ngx_http_hypic_module);

    link = hlcf->engine->link;

    if (link == NULL) {
        ngx_log_error(NGX_LOG_ALERT, r->connection->log, 0,
                      "hypic: no link to engine \"%V\"", &hlcf->engine->name);
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    if (link->state == NGX_HTTP_HYPIC_LINK_DOWN
        && ngx_http_hypic_link_connect(link, NGX_LOG_ERR) != NGX_OK)
    {
        return ngx_http_hypic_engine_unavailable(r, ctx, "unavailable");
    }

    if (!ctx->eng.cleanup) {
        cln = ngx_pool_cleanup_add(r->pool, 0);
        if (cln == NULL) {
            return NGX_HTTP_INTERNAL_SERVER_ERROR;
        }

        cln->handler = ngx_http_hypic_engine_cleanup;
        cln->data = ctx;
        ctx->eng.cleanup = 1;
    }

    ctx->eng.link = link;

    /* not cancelable: a worker that exits gracefully waits for us */

    ctx->eng.timeout.handler = ngx_http_hypic_engine_timeout;
    ctx->eng.timeout.data = r;
    ctx->eng.timeout.log = r->connection->log;

    ngx_add_timer(&ctx->eng.timeout, hlcf->request_timeout);

    if (link->state == NGX_HTTP_HYPIC_LINK_HELLO) {
        ngx_queue_insert_tail(&link->waiting, &ctx->eng.queue);
        ctx->eng.queued = 1;
        return NGX_DONE;
    }

    rc = ngx_http_hypic_engine_send(r, ctx);

    if (rc != NGX_DONE) {
        ngx_http_hypic_engine_detach(ctx);
    }

    return rc;
}


/*
 * Claims a slot and writes the request into it; NGX_DONE, or the result
 * of an error response.
 */

static ngx_int_t
ngx_http_hypic_engine_send(ngx_http_request_t *r, ngx_http_hypic_ctx_t *ctx)
{
    u_char                 *p;
    uint32_t                index;
    hp_ipc_slot_t          *slot;
    hp_ipc_header_t        *shm;
    ngx_http_hypic_link_t  *link;

    link = ctx->eng.link;
    shm = link->shm;

    if (ngx_http_hypic_link_stalled(link)) {
        return ngx_http_hypic_engine_unavailable(r, ctx, "not responding");
    }

    ctx->eng.node.len = link->node_len;
    ctx->eng.node.data = ngx_pnalloc(r->pool, link->node_len + 1);
    if (ctx->eng.node.data == NULL) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    ngx_memcpy(ctx->eng.node.data, link->node, link->node_len);

    if (ctx->in.prompt.len + ctx->in.grammar.len > shm->input_bytes) {
        ngx_log_error(NGX_LOG_INFO, r->connection->log, 0,
                      "hypic: prompt of %uz bytes is larger than the "
                      "%uD the engine \"%V\" takes",
                      ctx->in.prompt.len + ctx->in.grammar.len,
                      shm->input_bytes, &link->engine->name);

        return ngx_http_hypic_send_error(r, NGX_HTTP_REQUEST_ENTITY_TOO_LARGE,
                                         NGX_HTTP_HYPIC_INVALID_REQUEST,
                                         "prompt_too_large", "prompt",
                                         "The prompt is %uz bytes, the "
                                         "engine takes at most %uD",
                                         ctx->in.prompt.len
                                         + ctx->in.grammar.len,
                                         shm->input_bytes);
    }

    slot = hp_ipc_claim(shm, link->conn_id, (int32_t) ngx_pid, &index,
                        &ctx->eng.seq);

    if (slot == NULL) {
        ngx_log_error(NGX_LOG_WARN, r->connection->log, 0,
                      "hypic: engine \"%V\" has all %uD slots in flight",
                      &link->engine->name, shm->n_slots);

        return ngx_http_hypic_send_error(r, NGX_HTTP_TOO_MANY_REQUESTS,
                                         "rate_limit_error",
                                         "engine_at_capacity", NULL,
                                         "The engine for model \"%V\" has "
                                         "%uD requests in flight, its "
                                         "limit; try again later",
                                         &link->engine->model,
                                         shm->n_slots);
    }

    ngx_memcpy(&slot->req, &ctx->in.req, sizeof(hp_ipc_request_t));
    slot->req.prompt_len = (uint32_t) ctx->in.prompt.len;

    slot->req.grammar_len = (uint32_t) ctx->in.grammar.len;

    p = (u_char *) hp_ipc_input(shm, slot);
    p = ngx_cpymem(p, ctx->in.prompt.data, ctx->in.prompt.len);

    if (ctx->in.grammar.len) {
        ngx_memcpy(p, ctx->in.grammar.data, ctx->in.grammar.len);
    }

    ctx->eng.slot = slot;

    ngx_queue_insert_tail(&link->active, &ctx->eng.queue);
    ctx->eng.queued = 1;

    if (hp_ipc_submit(shm, slot, ctx->eng.seq) != 0) {
        ngx_log_error(NGX_LOG_ALERT, r->connection->log, 0,
                      "hypic: engine \"%V\" took back slot %uD before "
                      "submit", &link->engine->name, index);
        ctx->eng.slot = NULL;
        return ngx_http_hypic_engine_unavailable(r, ctx, "unavailable");
    }

    ngx_log_debug3(NGX_LOG_DEBUG_HTTP, r->connection->log, 0,
                   "hypic: %V in slot %uD of engine \"%V\"",
                   &ctx->out.id, index, &link->engine->name);

    if (!link->watchdog.timer_set) {
        ngx_add_timer(&link->watchdog, link->stall_timeout / 2);
    }

    ngx_http_hypic_link_wake(link);

    return NGX_DONE;
}


/* what: "unavailable", "not responding" */

static ngx_int_t
ngx_http_hypic_engine_unavailable(ngx_http_request_t *r,
    ngx_http_hypic_ctx_t *ctx, const char *what)
{
    ngx_http_hypic_loc_conf_t  *hlcf;

    hlcf = ngx_http_get_module_loc_conf(r, ngx_http_hypic_module);

    ctx->out.engine_error = 1;

    return ngx_http_hypic_send_error(r, NGX_HTTP_SERVICE_UNAVAILABLE,
                                     NGX_HTTP_HYPIC_ENGINE_UNAVAILABLE,
                                     "engine_unavailable", NULL,
                                     "The engine for model \"%V\" is %s, "
                                     "try again later",
                                     &hlcf->engine->model, what);
}


void
ngx_http_hypic_engine_detach(ngx_http_hypic_ctx_t *ctx)
{
    if (ctx->eng.queued) {
        ngx_queue_remove(&ctx->eng.queue);
        ctx->eng.queued = 0;
    }

    if (ctx->eng.slot) {
        /* 0: still running, the engine frees it once it sees cancel */

        if (hp_ipc_release(ctx->eng.slot, ctx->eng.seq) == 0 && ctx->eng.link) {
            ngx_http_hypic_link_wake(ctx->eng.link);
        }

        ctx->eng.slot = NULL;
    }

    if (ctx->eng.timeout.timer_set) {
        ngx_del_timer(&ctx->eng.timeout);
    }

    if (ctx->out.heartbeat.timer_set) {
        ngx_del_timer(&ctx->out.heartbeat);
    }

    ctx->eng.link = NULL;
}


static void
ngx_http_hypic_engine_cleanup(void *data)
{
    ngx_http_hypic_ctx_t  *ctx = data;

    ngx_http_hypic_engine_detach(ctx);
}


static void
ngx_http_hypic_engine_timeout(ngx_event_t *ev)
{
    ngx_connection_t           *c;
    ngx_http_request_t         *r;
    ngx_http_hypic_loc_conf_t  *hlcf;

    r = ev->data;
    c = r->connection;

    hlcf = ngx_http_get_module_loc_conf(r, ngx_http_hypic_module);

    ngx_log_error(NGX_LOG_ERR, c->log, 0,
                  "hypic: engine \"%V\" did not finish the request within "
                  "hypic_request_timeout %M", &hlcf->engine->name,
                  hlcf->request_timeout);

    ngx_http_hypic_fail(r, NGX_HTTP_GATEWAY_TIME_OUT, "timeout", "timeout",
                        "The request did not finish within %M ms",
                        hlcf->request_timeout);

    ngx_http_run_posted_requests(c);
}


/* Drains the records of one request; may finalize it. */

static void
ngx_http_hypic_engine_read(ngx_http_request_t *r, ngx_http_hypic_ctx_t *ctx)
{
    u_char                  buf[HP_IPC_RECORD_MAX];
    uint32_t                type, len;
    ngx_int_t               rc;
    hp_ipc_slot_t          *slot;
    ngx_http_hypic_link_t  *link;

    link = ctx->eng.link;

    while (ctx->eng.slot) {
        slot = ctx->eng.slot;

        rc = hp_ipc_ring_get(link->shm, slot, &type, buf, sizeof(buf), &len);

        if (rc == 0) {
            /* the engine waits for room we just made */

            if (atomic_exchange(&slot->waiting, 0)) {
                ngx_http_hypic_link_wake(link);
            }

            return;
        }

        if (rc < 0) {
            ngx_log_error(NGX_LOG_ALERT, r->connection->log, 0,
                          "hypic: corrupt output ring from engine \"%V\"",
                          &link->engine->name);

            ngx_http_hypic_fail(r, NGX_HTTP_BAD_GATEWAY,
                                NGX_HTTP_HYPIC_SERVER_ERROR,
                                "engine_error",
                                "The engine sent a malformed answer");
            return;
        }

        if (ngx_http_hypic_deliver(r, type, buf, len) == NGX_DONE) {
            return;
        }
    }
}


ngx_int_t
ngx_http_hypic_engine_identity(ngx_http_hypic_engine_t *engine,
    ngx_http_hypic_identity_t *id)
{
    ngx_http_hypic_link_t  *link;

    link = engine->link;

    if (link == NULL) {
        return NGX_DECLINED;
    }

    if (link->state != NGX_HTTP_HYPIC_LINK_UP) {
        return NGX_AGAIN;
    }

    if (!link->has_fingerprint) {
        return NGX_DECLINED;
    }

    id->node.data = link->node;
    id->node.len = link->node_len;
    id->model.data = link->model;
    id->model.len = link->model_len;
    id->fingerprint = link->fingerprint;

    return NGX_OK;
}


void
ngx_http_hypic_engine_state(ngx_http_hypic_engine_t *engine,
    ngx_uint_t connect, ngx_http_hypic_engine_state_t *st)
{
    uint32_t                i;
    hp_ipc_header_t        *shm;
    ngx_http_hypic_link_t  *link;

    ngx_memzero(st, sizeof(ngx_http_hypic_engine_state_t));

    st->state = NGX_HTTP_HYPIC_STATE_DOWN;

    link = engine->link;

    if (link == NULL) {
        return;
    }

    /* a look is no request: an engine that is not there is no error */

    if (link->state == NGX_HTTP_HYPIC_LINK_DOWN && connect) {
        (void) ngx_http_hypic_link_connect(link, NGX_LOG_INFO);
    }

    if (link->state == NGX_HTTP_HYPIC_LINK_DOWN) {
        return;
    }

    if (link->state == NGX_HTTP_HYPIC_LINK_HELLO) {
        st->state = NGX_HTTP_HYPIC_STATE_STARTING;
        return;
    }

    shm = link->shm;

    st->shm = shm;
    st->generation = link->generation;
    st->heartbeat_age = hp_ipc_heartbeat_age(shm, hp_ipc_now_ms());

    for (i = 0; i < shm->n_slots; i++) {
        if (HP_IPC_STATE(atomic_load(&hp_ipc_slot(shm, i)->word))
            == HP_IPC_FREE)
        {
            st->free_slots++;
        }
    }

    /* draining first: an engine past its drain stops beating as it exits */

    if (atomic_load(&shm->health) == HP_IPC_HEALTH_DRAINING) {
        st->state = NGX_HTTP_HYPIC_STATE_DRAINING;

    } else if (ngx_http_hypic_link_stalled(link)) {
        st->state = NGX_HTTP_HYPIC_STATE_STALLED;

    } else {
        st->state = NGX_HTTP_HYPIC_STATE_UP;
    }
}


void
ngx_http_hypic_engine_watch(ngx_http_hypic_engine_t *engine,
    ngx_http_hypic_watch_t *w)
{
    ngx_http_hypic_link_t  *link;

    link = engine->link;

    if (w->queued || link == NULL) {
        return;
    }

    if (link->state != NGX_HTTP_HYPIC_LINK_HELLO) {
        ngx_post_event(&w->event, &ngx_posted_events);
        return;
    }

    ngx_queue_insert_tail(&link->watchers, &w->queue);
    w->queued = 1;
}


void
ngx_http_hypic_engine_unwatch(ngx_http_hypic_watch_t *w)
{
    if (w->queued) {
        ngx_queue_remove(&w->queue);
        w->queued = 0;
    }

    if (w->event.posted) {
        ngx_delete_posted_event(&w->event);
    }
}


/* ---- the link ------------------------------------------------------ */


/* level: of the message that the engine is not there */

static ngx_int_t
ngx_http_hypic_link_connect(ngx_http_hypic_link_t *link, ngx_uint_t level)
{
    int                   rc;
    ngx_err_t             err;
    ngx_socket_t          s;
    ngx_connection_t     *c;
    struct sockaddr_un    sun;

    ngx_memzero(&sun, sizeof(struct sockaddr_un));
    sun.sun_family = AF_UNIX;
    ngx_memcpy(sun.sun_path, link->engine->path.data,
               link->engine->path.len);

    s = ngx_socket(AF_UNIX, SOCK_STREAM, 0);

    if (s == (ngx_socket_t) -1) {
        ngx_log_error(NGX_LOG_ALERT, ngx_cycle->log, ngx_socket_errno,
                      ngx_socket_n " failed");
        return NGX_ERROR;
    }

    c = ngx_get_connection(s, ngx_cycle->log);

    if (c == NULL) {
        ngx_close_socket(s);
        return NGX_ERROR;
    }

    if (ngx_nonblocking(s) == -1) {
        ngx_log_error(NGX_LOG_ALERT, ngx_cycle->log, ngx_socket_errno,
                      ngx_nonblocking_n " failed");
        ngx_close_connection(c);
        return NGX_ERROR;
    }

    /* a unix socket connects at once or never (EAGAIN: backlog full) */

    rc = connect(s, (struct sockaddr *) &sun, sizeof(struct sockaddr_un));

    if (rc == -1) {
        err = ngx_socket_errno;

        ngx_log_error(level, ngx_cycle->log, err,
                      "hypic: engine \"%V\" at \"%V\" is unavailable",
                      &link->engine->name, &link->engine->address);

        ngx_close_connection(c);
        return NGX_ERROR;
    }

    c->data = link;
    c->read->handler = ngx_http_hypic_link_read;
    c->write->handler = ngx_http_hypic_link_dummy;
    c->read->log = c->log;
    c->write->log = c->log;

    /* level-triggered: a wake-up left unread is never lost */

    if (ngx_add_event(c->read, NGX_READ_EVENT, NGX_LEVEL_EVENT) != NGX_OK) {
        ngx_close_connection(c);
        return NGX_ERROR;
    }

    link->connection = c;
    link->state = NGX_HTTP_HYPIC_LINK_HELLO;
    link->hello_len = 0;

    ngx_add_timer(&link->hello_timer, NGX_HTTP_HYPIC_HELLO_TIMEOUT);

    ngx_log_debug1(NGX_LOG_DEBUG_HTTP, ngx_cycle->log, 0,
                   "hypic: connecting to engine \"%V\"", &link->engine->name);

    return NGX_OK;
}


static void
ngx_http_hypic_link_read(ngx_event_t *rev)
{
    u_char                  buf[256];
    ssize_t                 n;
    ngx_err_t               err;
    ngx_queue_t             pending, *q;
    ngx_connection_t       *c, *cn;
    ngx_http_request_t     *r;
    ngx_http_hypic_ctx_t   *ctx;
    ngx_http_hypic_link_t  *link;

    c = rev->data;
    link = c->data;

    if (link->state == NGX_HTTP_HYPIC_LINK_HELLO) {
        if (ngx_http_hypic_link_hello(link) != NGX_OK) {
            return;
        }

        if (link->state != NGX_HTTP_HYPIC_LINK_UP) {
            return;
        }
    }

    /* the wake-up bytes carry no data: drain them */

    for ( ;; ) {
        n = recv(c->fd, buf, sizeof(buf), 0);

        if (n > 0) {
            continue;
        }

        if (n == 0) {
            ngx_http_hypic_link_fail(link, "closed the connection", 0);
            return;
        }

        err = ngx_socket_errno;

        if (err == NGX_EAGAIN) {
            break;
        }

        if (err != NGX_EINTR) {
            ngx_http_hypic_link_fail(link, "failed", err);
            return;
        }
    }

    /*
     * Reading may end requests, and ending one may run other requests'
     * handlers: walk a private list, so that a request that leaves the
     * link meanwhile simply drops out of it.
     */

    ngx_queue_init(&pending);
    ngx_queue_add(&pending, &link->active);
    ngx_queue_init(&link->active);

    while (!ngx_queue_empty(&pending)) {
        q = ngx_queue_head(&pending);
        ngx_queue_remove(q);
        ngx_queue_insert_tail(&link->active, q);

        ctx = ngx_queue_data(q, ngx_http_hypic_ctx_t, eng.queue);
        r = ctx->eng.timeout.data;
        cn = r->connection;

        ngx_http_hypic_engine_read(r, ctx);
        ngx_http_run_posted_requests(cn);
    }
}


/* Takes the hello and the segment's descriptor; NGX_OK if the link is
 * still usable (maybe still waiting for the rest of the hello). */

static ngx_int_t
ngx_http_hypic_link_hello(ngx_http_hypic_link_t *link)
{
    int                fd;
    ssize_t            n;
    ngx_err_t          err;
    struct iovec       iov;
    struct msghdr      msg;
    struct cmsghdr    *cm;
    ngx_connection_t  *c;

    union {
        struct cmsghdr  cm;
        char            space[CMSG_SPACE(sizeof(int))];
    } cmsg;

    c = link->connection;

    iov.iov_base = (u_char *) &link->hello + link->hello_len;
    iov.iov_len = sizeof(hp_ipc_hello_t) - link->hello_len;

    ngx_memzero(&msg, sizeof(struct msghdr));
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = &cmsg;
    msg.msg_controllen = sizeof(cmsg);

    n = recvmsg(c->fd, &msg, MSG_CMSG_CLOEXEC);

    if (n == -1) {
        err = ngx_socket_errno;

        if (err == NGX_EAGAIN || err == NGX_EINTR) {
            return NGX_OK;
        }

        ngx_http_hypic_link_fail(link, "failed", err);
        return NGX_ERROR;
    }

    if (n == 0) {
        ngx_http_hypic_link_fail(link, "closed the connection", 0);
        return NGX_ERROR;
    }

    for (cm = CMSG_FIRSTHDR(&msg); cm; cm = CMSG_NXTHDR(&msg, cm)) {
        if (cm->cmsg_level != SOL_SOCKET || cm->cmsg_type != SCM_RIGHTS) {
            continue;
        }

        ngx_memcpy(&fd, CMSG_DATA(cm), sizeof(int));

        if (link->hello_fd != NGX_INVALID_FILE) {
            (void) close(fd);
            continue;
        }

        link->hello_fd = fd;
    }

    link->hello_len += n;

    if (link->hello_len < sizeof(hp_ipc_hello_t)) {
        return NGX_OK;
    }

    if (ngx_http_hypic_link_up(link) != NGX_OK) {
        return NGX_ERROR;
    }

    return NGX_OK;
}


static ngx_int_t
ngx_http_hypic_link_up(ngx_http_hypic_link_t *link)
{
    void                  *p;
    ngx_int_t              rc;
    ngx_uint_t             i;
    const char            *why;
    ngx_queue_t           *q;
    hp_ipc_hello_t        *hello;
    ngx_file_info_t        fi;
    ngx_connection_t      *c;
    ngx_http_request_t    *r;
    ngx_http_hypic_ctx_t  *ctx;

    hello = &link->hello;

    if (hello->magic != HP_IPC_MAGIC || hello->version != HP_IPC_VERSION) {
        ngx_http_hypic_link_fail(link, "speaks another protocol version",
                                 0);
        return NGX_ERROR;
    }

    if (link->hello_fd == NGX_INVALID_FILE) {
        ngx_http_hypic_link_fail(link, "sent no shared memory", 0);
        return NGX_ERROR;
    }

    hello->shm_name[HP_IPC_NAME_BYTES - 1] = '\0';

    if (link->engine->shm.len
        && (link->engine->shm.len != ngx_strlen(hello->shm_name)
            || ngx_strncmp(link->engine->shm.data, hello->shm_name,
                           link->engine->shm.len)
               != 0))
    {
        ngx_log_error(NGX_LOG_ERR, ngx_cycle->log, 0,
                      "hypic: engine \"%V\" serves segment \"%s\", "
                      "not shm=%V", &link->engine->name, hello->shm_name,
                      &link->engine->shm);
        ngx_http_hypic_link_fail(link, "serves another segment", 0);
        return NGX_ERROR;
    }

    if (ngx_fd_info(link->hello_fd, &fi) == NGX_FILE_ERROR
        || (uint64_t) ngx_file_size(&fi) < hello->shm_bytes
        || hello->shm_bytes < sizeof(hp_ipc_header_t))
    {
        ngx_http_hypic_link_fail(link, "sent a bad shared segment", 0);
        return NGX_ERROR;
    }

    p = mmap(NULL, (size_t) hello->shm_bytes, PROT_READ|PROT_WRITE,
             MAP_SHARED, link->hello_fd, 0);

    (void) close(link->hello_fd);
    link->hello_fd = NGX_INVALID_FILE;

    if (p == MAP_FAILED) {
        ngx_http_hypic_link_fail(link, "sent a segment that cannot be "
                                 "mapped", ngx_errno);
        return NGX_ERROR;
    }

    link->shm = p;
    link->shm_size = (size_t) hello->shm_bytes;

    why = hp_ipc_check(p, hello->shm_bytes);

    if (why != NULL || link->shm->generation != hello->generation) {
        ngx_log_error(NGX_LOG_ERR, ngx_cycle->log, 0,
                      "hypic: engine \"%V\" segment refused: %s",
                      &link->engine->name,
                      why ? why : "generation differs from the hello");
        ngx_http_hypic_link_fail(link, "sent an unusable segment", 0);
        return NGX_ERROR;
    }

    if (link->generation && link->generation != hello->generation) {
        ngx_log_error(NGX_LOG_NOTICE, ngx_cycle->log, 0,
                      "hypic: engine \"%V\" restarted, generation %uL "
                      "after %uL", &link->engine->name, hello->generation,
                      link->generation);
    }

    link->generation = hello->generation;
    link->conn_id = hello->conn_id;
    link->node_len = ngx_strnlen((u_char *) link->shm->node,
                                 HP_IPC_NAME_BYTES - 1);
    ngx_memcpy(link->node, link->shm->node, link->node_len);
    link->model_len = ngx_strnlen((u_char *) link->shm->model,
                                  HP_IPC_MODEL_BYTES - 1);
    ngx_memcpy(link->model, link->shm->model, link->model_len);
    ngx_memcpy(link->fingerprint, link->shm->fingerprint, 16);

    link->has_fingerprint = 0;

    for (i = 0; i < 16; i++) {
        if (link->fingerprint[i]) {
            link->has_fingerprint = 1;
        }
    }

    if (!link->has_fingerprint) {
        ngx_log_error(NGX_LOG_NOTICE, ngx_cycle->log, 0,
                      "hypic: engine \"%V\" publishes no model fingerprint, "
                      "its requests are routed locally",
                      &link->engine->name);
    }

    link->state = NGX_HTTP_HYPIC_LINK_UP;
    link->stalled = 0;

    if (link->hello_timer.timer_set) {
        ngx_del_timer(&link->hello_timer);
    }

    ngx_http_hypic_link_notify(link);

    ngx_log_error(NGX_LOG_INFO, ngx_cycle->log, 0,
                  "hypic: connected to engine \"%V\" (generation %uL, "
                  "%uD slots)", &link->engine->name, link->generation,
                  link->shm->n_slots);

    /* the requests that waited for the hello go now, in order */

    while (!ngx_queue_empty(&link->waiting)) {
        q = ngx_queue_head(&link->waiting);
        ngx_queue_remove(q);

        ctx = ngx_queue_data(q, ngx_http_hypic_ctx_t, eng.queue);
        ctx->eng.queued = 0;

        r = ctx->eng.timeout.data;
        c = r->connection;

        /* one that waited to learn who the engine is routes itself now */

        if (ctx->routing.await_link) {
            ctx->routing.await_link = 0;
            rc = ngx_http_hypic_route_again(r);

        } else {
            rc = ngx_http_hypic_engine_send(r, ctx);
        }

        if (rc != NGX_DONE) {
            ngx_http_hypic_engine_detach(ctx);
            ngx_http_finalize_request(r, rc);
        }

        ngx_http_run_posted_requests(c);
    }

    return NGX_OK;
}


static void
ngx_http_hypic_link_hello_timeout(ngx_event_t *ev)
{
    ngx_http_hypic_link_t  *link = ev->data;

    ngx_http_hypic_link_fail(link, "did not say hello in time",
                             NGX_ETIMEDOUT);
}


static void
ngx_http_hypic_link_dummy(ngx_event_t *ev)
{
    return;
}


/* Every request on the link fails cleanly; the next one reconnects. */

static void
ngx_http_hypic_link_fail(ngx_http_hypic_link_t *link, const char *why,
    ngx_err_t err)
{
    ngx_queue_t            *q;
    ngx_queue_t             waiting, active;
    ngx_http_hypic_ctx_t   *ctx;

    ngx_log_error(NGX_LOG_ERR, ngx_cycle->log, err,
                  "hypic: engine \"%V\" at \"%V\" %s", &link->engine->name,
                  &link->engine->address, why);

    ngx_queue_init(&waiting);
    ngx_queue_add(&waiting, &link->waiting);
    ngx_queue_init(&link->waiting);

    ngx_queue_init(&active);
    ngx_queue_add(&active, &link->active);
    ngx_queue_init(&link->active);

    /* no request may touch the segment once it is unmapped */

    for (q = ngx_queue_head(&active);
         q != ngx_queue_sentinel(&active);
         q = ngx_queue_next(q))
    {
        ctx = ngx_queue_data(q, ngx_http_hypic_ctx_t, eng.queue);
        ctx->eng.slot = NULL;
        ctx->eng.link = NULL;
    }

    ngx_http_hypic_link_close(link);

    ngx_queue_add(&waiting, &active);

    ngx_http_hypic_link_fail_requests(link, &waiting, "unavailable");
}


/* Answers 503 (or an SSE error event) to every request of list. */

static void
ngx_http_hypic_link_fail_requests(ngx_http_hypic_link_t *link,
    ngx_queue_t *list, const char *what)
{
    ngx_queue_t           *q;
    ngx_connection_t      *c;
    ngx_http_request_t    *r;
    ngx_http_hypic_ctx_t  *ctx;

    while (!ngx_queue_empty(list)) {
        q = ngx_queue_head(list);
        ngx_queue_remove(q);

        ctx = ngx_queue_data(q, ngx_http_hypic_ctx_t, eng.queue);
        ctx->eng.queued = 0;

        r = ctx->eng.timeout.data;
        c = r->connection;

        ngx_http_hypic_fail(r, NGX_HTTP_SERVICE_UNAVAILABLE,
                            NGX_HTTP_HYPIC_ENGINE_UNAVAILABLE,
                            "engine_unavailable",
                            "The engine for model \"%V\" is %s, try again "
                            "later", &link->engine->model, what);

        ngx_http_run_posted_requests(c);
    }
}


/*
 * Whether the engine's heartbeat is hypic_stall_timeout old; logs when
 * that changes. The link must be up.
 */

static ngx_uint_t
ngx_http_hypic_link_stalled(ngx_http_hypic_link_t *link)
{
    uint64_t  age;

    age = hp_ipc_heartbeat_age(link->shm, hp_ipc_now_ms());

    if (age < link->stall_timeout) {
        if (link->stalled) {
            ngx_log_error(NGX_LOG_NOTICE, ngx_cycle->log, 0,
                          "hypic: engine \"%V\" responds again",
                          &link->engine->name);
            link->stalled = 0;
        }

        return 0;
    }

    if (!link->stalled) {
        ngx_log_error(NGX_LOG_ERR, ngx_cycle->log, 0,
                      "hypic: engine \"%V\" at \"%V\" is stalled: no "
                      "heartbeat for %uL ms (hypic_stall_timeout %M)",
                      &link->engine->name, &link->engine->address, age,
                      link->stall_timeout);
        link->stalled = 1;
    }

    return 1;
}


/* While the link has requests: fails them once the engine stalls. */

static void
ngx_http_hypic_link_watchdog(ngx_event_t *ev)
{
    ngx_queue_t             active;
    ngx_http_hypic_link_t  *link;

    link = ev->data;

    if (link->state != NGX_HTTP_HYPIC_LINK_UP
        || ngx_queue_empty(&link->active))
    {
        return;
    }

    if (!ngx_http_hypic_link_stalled(link)) {
        ngx_add_timer(&link->watchdog, link->stall_timeout / 2);
        return;
    }

    /* the link stays: an engine that resumes (SIGCONT) serves on */

    ngx_queue_init(&active);
    ngx_queue_add(&active, &link->active);
    ngx_queue_init(&link->active);

    ngx_http_hypic_link_fail_requests(link, &active, "not responding");
}


/* Those waiting for the link to leave the hello look again. */

static void
ngx_http_hypic_link_notify(ngx_http_hypic_link_t *link)
{
    ngx_queue_t             *q;
    ngx_http_hypic_watch_t  *w;

    while (!ngx_queue_empty(&link->watchers)) {
        q = ngx_queue_head(&link->watchers);
        ngx_queue_remove(q);

        w = ngx_queue_data(q, ngx_http_hypic_watch_t, queue);
        w->queued = 0;

        ngx_post_event(&w->event, &ngx_posted_events);
    }
}


static void
ngx_http_hypic_link_close(ngx_http_hypic_link_t *link)
{
    if (link->hello_timer.timer_set) {
        ngx_del_timer(&link->hello_timer);
    }

    if (link->watchdog.timer_set) {
        ngx_del_timer(&link->watchdog);
    }

    if (link->connection) {
        ngx_close_connection(link->connection);
        link->connection = NULL;
    }

    if (link->hello_fd != NGX_INVALID_FILE) {
        (void) close(link->hello_fd);
        link->hello_fd = NGX_INVALID_FILE;
    }

    if (link->shm) {
        (void) munmap(link->shm, link->shm_size);
        link->shm = NULL;
    }

    link->state = NGX_HTTP_HYPIC_LINK_DOWN;
    link->stalled = 0;

    ngx_http_hypic_link_notify(link);
}


/* One byte: the engine looks at its slots. */

static void
ngx_http_hypic_link_wake(ngx_http_hypic_link_t *link)
{
    ssize_t    n;
    ngx_err_t  err;

    if (link->connection == NULL) {
        return;
    }

    n = send(link->connection->fd, "W", 1, MSG_DONTWAIT|MSG_NOSIGNAL);

    if (n == -1) {
        err = ngx_socket_errno;

        /* EAGAIN: unread bytes are waiting, the engine wakes anyway */

        if (err != NGX_EAGAIN) {
            ngx_log_error(NGX_LOG_ERR, ngx_cycle->log, err,
                          "hypic: wake-up to engine \"%V\" failed",
                          &link->engine->name);
        }
    }
}
