
/*
 * HYPIC serve: the nginx module's configuration and request context.
 *
 * The module is glue only (DESIGN section 2): it speaks the OpenAI API,
 * checks requests and hands them to an engine; no model math lives here.
 */


#ifndef _NGX_HTTP_HYPIC_MODULE_H_INCLUDED_
#define _NGX_HTTP_HYPIC_MODULE_H_INCLUDED_


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include <cJSON.h>

#include "engine/contract/hp_ipc.h"


/* modes are the contract's: HP_IPC_MODE_* (engine/contract/hp_ipc.h) */

#define NGX_HTTP_HYPIC_ROUTING_LOCAL    0
#define NGX_HTTP_HYPIC_ROUTING_AFFINITY 1

/*
 * Where a request went ($hypic_route, hypic:routes_total): "local" (no
 * lookup wanted or possible), "cache-local" (Redis chose this node),
 * "cache-peer" (proxied to the node Redis chose), "local-fallback"
 * (Redis down, slow or wrong) and "from-peer" (a peer sent it here).
 */
#define NGX_HTTP_HYPIC_ROUTE_LOCAL      0
#define NGX_HTTP_HYPIC_ROUTE_CACHE      1
#define NGX_HTTP_HYPIC_ROUTE_PEER       2
#define NGX_HTTP_HYPIC_ROUTE_FALLBACK   3
#define NGX_HTTP_HYPIC_ROUTE_HOP        4
#define NGX_HTTP_HYPIC_ROUTE_N          5


#define NGX_HTTP_HYPIC_UNKNOWN          0
#define NGX_HTTP_HYPIC_MODELS           1
#define NGX_HTTP_HYPIC_COMPLETIONS      2
#define NGX_HTTP_HYPIC_CHAT             3


/* a worker's connection to one engine (ngx_http_hypic_engine.c) */
typedef struct ngx_http_hypic_link_s  ngx_http_hypic_link_t;

/* one choice of an answer (ngx_http_hypic_choice.c) */
typedef struct ngx_http_hypic_choice_s  ngx_http_hypic_choice_t;

/* one Redis lookup in flight (ngx_http_hypic_redis.c) */
typedef struct ngx_http_hypic_lookup_s  ngx_http_hypic_lookup_t;

/* a node that holds some of a request's segments */
typedef struct {
    ngx_str_t                   id;
    ngx_str_t                   addr;         /* its nginx, HOST:PORT */
    uint64_t                    bytes;        /* segment bytes it holds */
    double                      load;
    unsigned                    local:1;
    unsigned                    live:1;       /* its node hash exists */
} ngx_http_hypic_node_t;


/* one hypic_engine directive: an engine endpoint serving one model */

typedef struct {
    ngx_str_t                   name;
    ngx_str_t                   address;      /* "unix:/path" as written */
    ngx_str_t                   path;         /* socket path, 0-terminated */
    ngx_str_t                   model;        /* model id, default: name */
    ngx_str_t                   shm;          /* shared segment, may be "" */

    ngx_http_hypic_link_t      *link;         /* this worker's, after fork */
} ngx_http_hypic_engine_t;


typedef struct {
    ngx_array_t                 engines;      /* ngx_http_hypic_engine_t */

    ngx_str_t                   redis;        /* HOST:PORT as written */
    ngx_str_t                   redis_host;   /* numeric, 0-terminated */
    in_port_t                   redis_port;
    ngx_msec_t                  redis_timeout;
    ngx_flag_t                  affinity;     /* a location looks up */

    ngx_shm_zone_t             *metrics_zone;
    time_t                      created;      /* "created" in /v1/models */
    ngx_msec_t                  stall_timeout;  /* heartbeat this old: */
                                                /* the engine is stalled */
} ngx_http_hypic_main_conf_t;


typedef struct {
    ngx_str_t                   engine_name;  /* hypic_pass NAME */
    ngx_http_hypic_engine_t    *engine;       /* resolved in merge */
    u_char                     *pass_file;    /* where hypic_pass was, */
    ngx_uint_t                  pass_line;    /* for the error message */

    ngx_str_t                   separator;
    ngx_http_complex_value_t   *mode;
    ngx_uint_t                  seam;
    ngx_uint_t                  routing;
    ngx_str_t                   peer;         /* hypic_peer @NAME */
    size_t                      max_prompt_bytes;
    ngx_uint_t                  max_tokens;
    ngx_msec_t                  request_timeout;
    ngx_msec_t                  heartbeat;
} ngx_http_hypic_loc_conf_t;


/*
 * A hypic_pass request's context, one part per owner: what the request's
 * body became (ngx_http_hypic_request.c), where it goes (the handler and
 * ngx_http_hypic_redis.c), its claim on the engine
 * (ngx_http_hypic_engine.c) and its answer (ngx_http_hypic_response.c,
 * sse, choice, tools).
 */

typedef struct {
    ngx_uint_t                  endpoint;     /* NGX_HTTP_HYPIC_CHAT, ... */
    ngx_uint_t                  mode;         /* HP_IPC_MODE_* */
    unsigned                    mode_set:1;   /* mode is evaluated */
    unsigned                    stream:1;
    unsigned                    include_usage:1;
    hp_ipc_request_t            req;          /* as the engine gets it */
    ngx_str_t                   prompt;       /* chat: the body */
    ngx_str_t                   grammar;      /* constraint (format.c) */
    cJSON                      *tools;        /* in the body; while parsed */
    unsigned                    tool_calls:1; /* the answer is scanned */
    unsigned                    parallel:1;   /* parallel_tool_calls */
    ngx_array_t                *contents;     /* chat: message texts */
} ngx_http_hypic_in_t;


typedef struct {
    ngx_uint_t                  route;        /* NGX_HTTP_HYPIC_ROUTE_* */
    ngx_http_hypic_lookup_t    *lookup;       /* in flight, or NULL */
    ngx_event_t                 redis_timer;
    ngx_str_t                   local_node;   /* the engine's, for Redis */
    ngx_str_t                   model_key;    /* "hypic:{model}:" */
    uint64_t                   *seg_bytes;    /* [n_segs] */
    ngx_str_t                  *seg_keys;     /* [n_segs] */
    ngx_uint_t                  n_segs;
    ngx_array_t                 nodes;        /* ngx_http_hypic_node_t */
    ngx_http_hypic_node_t      *peer;         /* chosen, or NULL */
    unsigned                    routed:1;     /* the route is decided */
    unsigned                    peer_failed:1;  /* error_page came back */
    unsigned                    await_link:1; /* for the engine's identity */
} ngx_http_hypic_routing_t;


typedef struct {
    ngx_http_hypic_link_t      *link;
    ngx_str_t                   node;         /* the engine's node id */
    ngx_queue_t                 queue;        /* link->waiting or ->active */
    hp_ipc_slot_t              *slot;
    uint32_t                    seq;          /* the slot claim's */
    ngx_event_t                 timeout;
    unsigned                    queued:1;
    unsigned                    cleanup:1;
} ngx_http_hypic_claim_t;


typedef struct {
    ngx_str_t                   id;           /* "chatcmpl-...", "cmpl-..." */
    time_t                      created;
    ngx_str_t                   head;         /* JSON common to chunks */
    unsigned                    started:1;    /* START arrived */
    unsigned                    finished:1;   /* FINAL arrived */
    unsigned                    succeeded:1;  /* ... without an error */
    unsigned                    ttft_set:1;
    unsigned                    engine_error:1; /* unavailable, failed */
    ngx_msec_int_t              ttft;         /* ms: request to 1st token */

    /* what the engine answered with: START's, or FINAL's without one */
    hp_ipc_start_t              start;
    hp_ipc_final_t              final;

    ngx_event_t                 heartbeat;    /* SSE comments while idle */
    ngx_chain_t                *free;         /* SSE buffers to reuse */
    ngx_chain_t                *busy;         /* ... and those in flight */
    ngx_http_hypic_choice_t    *choices;      /* [n] (choice.c) */
    ngx_uint_t                  n;
    void                       *tools;        /* ngx_http_hypic_tools.c */
} ngx_http_hypic_out_t;


typedef struct {
    off_t                       received;     /* body bytes seen so far */
    unsigned                    too_large:1;

    ngx_http_hypic_in_t         in;
    ngx_http_hypic_routing_t    routing;
    ngx_http_hypic_claim_t      eng;
    ngx_http_hypic_out_t        out;
} ngx_http_hypic_ctx_t;


ngx_int_t ngx_http_hypic_parse_mode(ngx_str_t *value);

/* "local", "cache-local", "cache-peer", "local-fallback", "from-peer" */
ngx_str_t *ngx_http_hypic_route_name(ngx_uint_t route);

/*
 * The ctx of r, also after an internal redirect cleared r->ctx (to the
 * hypic_peer location, or an error_page); NULL if r never had one.
 */
ngx_http_hypic_ctx_t *ngx_http_hypic_get_ctx(ngx_http_request_t *r);

/* "full", "prefix", "naive", "pic" */
ngx_str_t *ngx_http_hypic_mode_name(ngx_uint_t mode);


extern ngx_module_t  ngx_http_hypic_module;


#endif /* _NGX_HTTP_HYPIC_MODULE_H_INCLUDED_ */
