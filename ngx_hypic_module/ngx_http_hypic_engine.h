
/*
 * HYPIC serve: the engine client. Each worker keeps one unix-socket link
 * per engine, maps the engine's shared segment from the descriptor the
 * engine sends on connect, and moves requests through its slots
 * (engine/contract/hp_ipc.h): submit, read the records the engine
 * streams, cancel.
 */


#ifndef _NGX_HTTP_HYPIC_ENGINE_H_INCLUDED_
#define _NGX_HTTP_HYPIC_ENGINE_H_INCLUDED_


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include "ngx_http_hypic_module.h"


/* who the engine is, as its shared segment says (for the Redis index) */

typedef struct {
    ngx_str_t                   node;         /* node id */
    ngx_str_t                   model;        /* model id in index keys */
    u_char                     *fingerprint;  /* [16], as hp_seg_id takes */
} ngx_http_hypic_identity_t;


/* an engine's state, as this worker sees it (/health, /metrics) */

#define NGX_HTTP_HYPIC_STATE_DOWN      0  /* nobody on the socket */
#define NGX_HTTP_HYPIC_STATE_STARTING  1  /* connected, no hello yet */
#define NGX_HTTP_HYPIC_STATE_UP        2
#define NGX_HTTP_HYPIC_STATE_DRAINING  3  /* SIGTERM: refuses new requests */
#define NGX_HTTP_HYPIC_STATE_STALLED   4  /* heartbeat stall_timeout old */
#define NGX_HTTP_HYPIC_STATE_N         5

typedef struct {
    ngx_uint_t                  state;
    /* up, draining or stalled: the engine's shared header, valid for
     * the current event only */
    hp_ipc_header_t            *shm;
    uint64_t                    generation;
    uint64_t                    heartbeat_age;  /* ms */
    uint32_t                    free_slots;
} ngx_http_hypic_engine_state_t;


/* a wait for an engine's link to leave STARTING */

typedef struct {
    ngx_queue_t                 queue;        /* link->watchers */
    ngx_event_t                 event;        /* posted: look again */
    unsigned                    queued:1;
} ngx_http_hypic_watch_t;


/* Builds this worker's links (not connected until the first request). */
ngx_int_t ngx_http_hypic_engine_init_process(ngx_cycle_t *cycle);

/* Closes the links and unmaps the segments. */
void ngx_http_hypic_engine_exit_process(ngx_cycle_t *cycle);

/*
 * Hands ctx->in.req and ctx->in.prompt to the location's engine. NGX_DONE: the
 * request holds its reference and is answered later, through
 * ngx_http_hypic_deliver() and ngx_http_hypic_fail() (response). Anything
 * else is what a content handler returns after an error response was
 * sent: 503 (engine down), 413 (prompt larger than the engine's slots),
 * 429 (every slot in flight).
 */
ngx_int_t ngx_http_hypic_engine_submit(ngx_http_request_t *r,
    ngx_http_hypic_ctx_t *ctx);

/*
 * Lets go of the engine: the slot is released (the engine cancels a
 * request still running), the request leaves its link, its timers stop.
 * Idempotent; also run by the request pool's cleanup.
 */
void ngx_http_hypic_engine_detach(ngx_http_hypic_ctx_t *ctx);

/*
 * The identity of the engine behind this worker's link: NGX_OK; NGX_AGAIN
 * while the link is not up (a request submitted with ctx->routing.await_link
 * waits for it, then ngx_http_hypic_route_again() is called instead of
 * sending it); NGX_DECLINED when the engine publishes no fingerprint.
 * The strings live in the link until it closes: copy what must outlive
 * the current event.
 */
ngx_int_t ngx_http_hypic_engine_identity(ngx_http_hypic_engine_t *engine,
    ngx_http_hypic_identity_t *id);

/*
 * The state of engine as this worker sees it. With connect set, a link
 * that is down connects first (a refused or missing socket is DOWN, and
 * logged at info only); it is STARTING until the engine's hello.
 */
void ngx_http_hypic_engine_state(ngx_http_hypic_engine_t *engine,
    ngx_uint_t connect, ngx_http_hypic_engine_state_t *st);

/*
 * Posts w->event (its handler and data set by the caller) once engine's
 * link leaves STARTING, up or down: at once if it is not STARTING now.
 * ngx_http_hypic_engine_unwatch() takes a wait back (idempotent; for the
 * caller's pool cleanup).
 */
void ngx_http_hypic_engine_watch(ngx_http_hypic_engine_t *engine,
    ngx_http_hypic_watch_t *w);
void ngx_http_hypic_engine_unwatch(ngx_http_hypic_watch_t *w);

#endif /* _NGX_HTTP_HYPIC_ENGINE_H_INCLUDED_ */
