
/*
 * HYPIC serve: the Redis segment index, read from nginx's event loop.
 *
 * Each worker keeps one hiredis async connection (built in init_process,
 * rebuilt with back-off). A cache_affinity request asks, in one pipelined
 * round trip, which nodes hold each of its segments (SMEMBERS of every
 * hypic:{model}:seg:{id}) and the local node's load; a second pipelined
 * round (HMGET addr load of the candidate nodes) follows only when
 * another node may win. The whole lookup is bounded by
 * hypic_redis_timeout; Redis down, slow or answering nonsense sends the
 * request to the local engine ("local-fallback"), logged once per
 * incident and worker.
 */


#ifndef _NGX_HTTP_HYPIC_REDIS_H_INCLUDED_
#define _NGX_HTTP_HYPIC_REDIS_H_INCLUDED_


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include "ngx_http_hypic_module.h"
#include "ngx_http_hypic_engine.h"


/* Connects this worker when some location uses cache_affinity. */
ngx_int_t ngx_http_hypic_redis_init_process(ngx_cycle_t *cycle);

/* Drops the connection; lookups still in flight are abandoned. */
void ngx_http_hypic_redis_exit_process(ngx_cycle_t *cycle);

/*
 * Starts the lookup for ctx->in.prompt, with segment ids named as the engine
 * id names them. NGX_AGAIN: the request waits; ctx->routing.route (and .peer)
 * are set and ngx_http_hypic_routed() is called later, from the event
 * loop, within hypic_redis_timeout. NGX_OK: nothing in the prompt can be
 * cached, route locally. NGX_DECLINED: Redis cannot be asked now (down,
 * backing off), route locally. NGX_ERROR: no memory.
 */
ngx_int_t ngx_http_hypic_redis_lookup(ngx_http_request_t *r,
    ngx_http_hypic_ctx_t *ctx, ngx_http_hypic_identity_t *id);

/* Lets go of the lookup in flight, if any; idempotent (pool cleanup). */
void ngx_http_hypic_redis_abandon(ngx_http_hypic_ctx_t *ctx);


#endif /* _NGX_HTTP_HYPIC_REDIS_H_INCLUDED_ */
