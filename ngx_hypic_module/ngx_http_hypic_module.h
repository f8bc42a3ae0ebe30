
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


#define NGX_HTTP_HYPIC_MODE_FULL        0
#define NGX_HTTP_HYPIC_MODE_PREFIX      1
#define NGX_HTTP_HYPIC_MODE_NAIVE       2
#define NGX_HTTP_HYPIC_MODE_PIC         3

#define NGX_HTTP_HYPIC_ROUTING_LOCAL    0
#define NGX_HTTP_HYPIC_ROUTING_AFFINITY 1


/* one hypic_engine directive: an engine endpoint serving one model */

typedef struct {
    ngx_str_t                   name;
    ngx_str_t                   address;      /* "unix:/path" as written */
    ngx_str_t                   path;         /* socket path, 0-terminated */
    ngx_str_t                   model;        /* model id, default: name */
    ngx_str_t                   shm;          /* shared segment, may be "" */
} ngx_http_hypic_engine_t;


typedef struct {
    ngx_array_t                 engines;      /* ngx_http_hypic_engine_t */

    ngx_str_t                   redis;        /* HOST:PORT as written */
    ngx_str_t                   redis_host;   /* numeric, 0-terminated */
    in_port_t                   redis_port;
    ngx_msec_t                  redis_timeout;

    ngx_shm_zone_t             *metrics_zone;
    time_t                      created;      /* "created" in /v1/models */
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
    size_t                      max_prompt_bytes;
    ngx_uint_t                  max_tokens;
    ngx_msec_t                  request_timeout;
} ngx_http_hypic_loc_conf_t;


typedef struct {
    off_t                       received;     /* body bytes seen so far */
    ngx_uint_t                  endpoint;
    ngx_uint_t                  mode;
    unsigned                    too_large:1;
} ngx_http_hypic_ctx_t;


ngx_int_t ngx_http_hypic_parse_mode(ngx_str_t *value);


extern ngx_module_t  ngx_http_hypic_module;


#endif /* _NGX_HTTP_HYPIC_MODULE_H_INCLUDED_ */
