
/*
 * HYPIC serve: the module's variables, for log_format and the hypic_peer
 * location:
 *
 *   $hypic_mode            the mode that ran (or was asked for)
 *   $hypic_node            the node that served (this one's engine, or
 *                          the peer it was sent to)
 *   $hypic_hit_segments    segments the engine found cached
 *   $hypic_miss_segments   segments it had to compute
 *   $hypic_ttft_ms         request start to the first token, ms
 *   $hypic_route           local, cache-local, cache-peer, local-fallback
 *                          or from-peer
 *   $hypic_peer_addr       HOST:PORT of the peer's nginx, for proxy_pass
 *
 * A variable that does not apply to the request is not found ("-" in an
 * access log line).
 */


#ifndef _NGX_HTTP_HYPIC_VARIABLES_H_INCLUDED_
#define _NGX_HTTP_HYPIC_VARIABLES_H_INCLUDED_


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>


/* Preconfiguration: declares the variables. */
ngx_int_t ngx_http_hypic_add_variables(ngx_conf_t *cf);


#endif /* _NGX_HTTP_HYPIC_VARIABLES_H_INCLUDED_ */
