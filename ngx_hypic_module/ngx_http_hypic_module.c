
/*
 * HYPIC serve: directives, configuration create/merge and module hooks.
 *
 * Every check on the configuration happens here, at config time, so that
 * the handlers never see an unknown engine, a bad mode literal or an
 * unset value.
 */


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include <sys/un.h>

#include "ngx_http_hypic_module.h"
#include "ngx_http_hypic_engine.h"
#include "ngx_http_hypic_error.h"
#include "ngx_http_hypic_handler.h"
#include "ngx_http_hypic_metrics.h"
#include "ngx_http_hypic_redis.h"
#include "ngx_http_hypic_variables.h"


static ngx_int_t ngx_http_hypic_preconfiguration(ngx_conf_t *cf);
static ngx_int_t ngx_http_hypic_init(ngx_conf_t *cf);
static void *ngx_http_hypic_create_main_conf(ngx_conf_t *cf);
static char *ngx_http_hypic_init_main_conf(ngx_conf_t *cf, void *conf);
static void *ngx_http_hypic_create_loc_conf(ngx_conf_t *cf);
static char *ngx_http_hypic_merge_loc_conf(ngx_conf_t *cf, void *parent,
    void *child);
static ngx_http_hypic_engine_t *ngx_http_hypic_find_engine(
    ngx_http_hypic_main_conf_t *hmcf, ngx_str_t *name);
static char *ngx_http_hypic_engine(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf);
static char *ngx_http_hypic_redis(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf);
static char *ngx_http_hypic_pass(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf);
static char *ngx_http_hypic_mode(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf);
static char *ngx_http_hypic_health(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf);
static char *ngx_http_hypic_metrics(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf);
static char *ngx_http_hypic_error(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf);
static char *ngx_http_hypic_set_handler(ngx_conf_t *cf,
    ngx_http_handler_pt handler);
static char *ngx_http_hypic_check_separator(ngx_conf_t *cf, void *post,
    void *data);
static char *ngx_http_hypic_check_peer(ngx_conf_t *cf, void *post,
    void *data);
static char *ngx_http_hypic_check_bounds(ngx_conf_t *cf, void *post,
    void *data);
static char *ngx_http_hypic_check_stall(ngx_conf_t *cf, void *post,
    void *data);
static ngx_int_t ngx_http_hypic_init_process(ngx_cycle_t *cycle);
static void ngx_http_hypic_exit_process(ngx_cycle_t *cycle);


static ngx_conf_post_t  ngx_http_hypic_separator_post =
    { ngx_http_hypic_check_separator };

static ngx_conf_post_t  ngx_http_hypic_peer_post =
    { ngx_http_hypic_check_peer };

static ngx_conf_post_t  ngx_http_hypic_stall_post =
    { ngx_http_hypic_check_stall };

static ngx_conf_num_bounds_t  ngx_http_hypic_seam_bounds = {
    ngx_http_hypic_check_bounds, 0, 256
};

static ngx_conf_num_bounds_t  ngx_http_hypic_max_tokens_bounds = {
    ngx_http_hypic_check_bounds, 1, -1
};

static ngx_conf_enum_t  ngx_http_hypic_routing[] = {
    { ngx_string("local"), NGX_HTTP_HYPIC_ROUTING_LOCAL },
    { ngx_string("cache_affinity"), NGX_HTTP_HYPIC_ROUTING_AFFINITY },
    { ngx_null_string, 0 }
};

static ngx_str_t  ngx_http_hypic_modes[] = {
    ngx_string("full"),                    /* HP_IPC_MODE_FULL */
    ngx_string("prefix"),                  /* HP_IPC_MODE_PREFIX */
    ngx_string("naive"),                   /* HP_IPC_MODE_NAIVE */
    ngx_string("pic"),                     /* HP_IPC_MODE_PIC */
    ngx_null_string
};

_Static_assert(sizeof(ngx_http_hypic_modes) / sizeof(ngx_str_t)
               == HP_IPC_MODE_PIC + 2, "a name for every HP_IPC_MODE_*");

static ngx_str_t  ngx_http_hypic_routes[] = {
    ngx_string("local"),                   /* NGX_HTTP_HYPIC_ROUTE_LOCAL */
    ngx_string("cache-local"),             /* NGX_HTTP_HYPIC_ROUTE_CACHE */
    ngx_string("cache-peer"),              /* NGX_HTTP_HYPIC_ROUTE_PEER */
    ngx_string("local-fallback"),          /* NGX_HTTP_HYPIC_ROUTE_FALLBACK */
    ngx_string("from-peer"),               /* NGX_HTTP_HYPIC_ROUTE_HOP */
    ngx_null_string
};


static ngx_command_t  ngx_http_hypic_commands[] = {

    { ngx_string("hypic_engine"),
      NGX_HTTP_MAIN_CONF|NGX_CONF_2MORE,
      ngx_http_hypic_engine,
      NGX_HTTP_MAIN_CONF_OFFSET,
      0,
      NULL },

    { ngx_string("hypic_redis"),
      NGX_HTTP_MAIN_CONF|NGX_CONF_TAKE1,
      ngx_http_hypic_redis,
      NGX_HTTP_MAIN_CONF_OFFSET,
      0,
      NULL },

    { ngx_string("hypic_redis_timeout"),
      NGX_HTTP_MAIN_CONF|NGX_CONF_TAKE1,
      ngx_conf_set_msec_slot,
      NGX_HTTP_MAIN_CONF_OFFSET,
      offsetof(ngx_http_hypic_main_conf_t, redis_timeout),
      NULL },

    { ngx_string("hypic_stall_timeout"),
      NGX_HTTP_MAIN_CONF|NGX_CONF_TAKE1,
      ngx_conf_set_msec_slot,
      NGX_HTTP_MAIN_CONF_OFFSET,
      offsetof(ngx_http_hypic_main_conf_t, stall_timeout),
      &ngx_http_hypic_stall_post },

    { ngx_string("hypic_pass"),
      NGX_HTTP_LOC_CONF|NGX_CONF_TAKE1,
      ngx_http_hypic_pass,
      NGX_HTTP_LOC_CONF_OFFSET,
      0,
      NULL },

    { ngx_string("hypic_separator"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_TAKE1,
      ngx_conf_set_str_slot,
      NGX_HTTP_LOC_CONF_OFFSET,
      offsetof(ngx_http_hypic_loc_conf_t, separator),
      &ngx_http_hypic_separator_post },

    { ngx_string("hypic_mode"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_TAKE1,
      ngx_http_hypic_mode,
      NGX_HTTP_LOC_CONF_OFFSET,
      offsetof(ngx_http_hypic_loc_conf_t, mode),
      NULL },

    { ngx_string("hypic_seam"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_TAKE1,
      ngx_conf_set_num_slot,
      NGX_HTTP_LOC_CONF_OFFSET,
      offsetof(ngx_http_hypic_loc_conf_t, seam),
      &ngx_http_hypic_seam_bounds },

    { ngx_string("hypic_routing"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_TAKE1,
      ngx_conf_set_enum_slot,
      NGX_HTTP_LOC_CONF_OFFSET,
      offsetof(ngx_http_hypic_loc_conf_t, routing),
      &ngx_http_hypic_routing },

    { ngx_string("hypic_peer"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_TAKE1,
      ngx_conf_set_str_slot,
      NGX_HTTP_LOC_CONF_OFFSET,
      offsetof(ngx_http_hypic_loc_conf_t, peer),
      &ngx_http_hypic_peer_post },

    { ngx_string("hypic_max_prompt_bytes"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_TAKE1,
      ngx_conf_set_size_slot,
      NGX_HTTP_LOC_CONF_OFFSET,
      offsetof(ngx_http_hypic_loc_conf_t, max_prompt_bytes),
      NULL },

    { ngx_string("hypic_max_tokens"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_TAKE1,
      ngx_conf_set_num_slot,
      NGX_HTTP_LOC_CONF_OFFSET,
      offsetof(ngx_http_hypic_loc_conf_t, max_tokens),
      &ngx_http_hypic_max_tokens_bounds },

    { ngx_string("hypic_request_timeout"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_TAKE1,
      ngx_conf_set_msec_slot,
      NGX_HTTP_LOC_CONF_OFFSET,
      offsetof(ngx_http_hypic_loc_conf_t, request_timeout),
      NULL },

    { ngx_string("hypic_heartbeat"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_TAKE1,
      ngx_conf_set_msec_slot,
      NGX_HTTP_LOC_CONF_OFFSET,
      offsetof(ngx_http_hypic_loc_conf_t, heartbeat),
      NULL },

    { ngx_string("hypic_error"),
      NGX_HTTP_LOC_CONF|NGX_CONF_NOARGS,
      ngx_http_hypic_error,
      NGX_HTTP_LOC_CONF_OFFSET,
      0,
      NULL },

    { ngx_string("hypic_health"),
      NGX_HTTP_LOC_CONF|NGX_CONF_NOARGS,
      ngx_http_hypic_health,
      NGX_HTTP_LOC_CONF_OFFSET,
      0,
      NULL },

    { ngx_string("hypic_metrics"),
      NGX_HTTP_LOC_CONF|NGX_CONF_NOARGS,
      ngx_http_hypic_metrics,
      NGX_HTTP_LOC_CONF_OFFSET,
      0,
      NULL },

      ngx_null_command
};


static ngx_http_module_t  ngx_http_hypic_module_ctx = {
    ngx_http_hypic_preconfiguration,       /* preconfiguration */
    ngx_http_hypic_init,                   /* postconfiguration */

    ngx_http_hypic_create_main_conf,       /* create main configuration */
    ngx_http_hypic_init_main_conf,         /* init main configuration */

    NULL,                                  /* create server configuration */
    NULL,                                  /* merge server configuration */

    ngx_http_hypic_create_loc_conf,        /* create location configuration */
    ngx_http_hypic_merge_loc_conf          /* merge location configuration */
};


ngx_module_t  ngx_http_hypic_module = {
    NGX_MODULE_V1,
    &ngx_http_hypic_module_ctx,            /* module context */
    ngx_http_hypic_commands,               /* module directives */
    NGX_HTTP_MODULE,                       /* module type */
    NULL,                                  /* init master */
    NULL,                                  /* init module */
    ngx_http_hypic_init_process,           /* init process */
    NULL,                                  /* init thread */
    NULL,                                  /* exit thread */
    ngx_http_hypic_exit_process,           /* exit process */
    NULL,                                  /* exit master */
    NGX_MODULE_V1_PADDING
};


ngx_int_t
ngx_http_hypic_parse_mode(ngx_str_t *value)
{
    ngx_uint_t  i;

    for (i = 0; ngx_http_hypic_modes[i].len; i++) {
        if (value->len == ngx_http_hypic_modes[i].len
            && ngx_strncmp(value->data, ngx_http_hypic_modes[i].data,
                           value->len)
               == 0)
        {
            return i;
        }
    }

    return NGX_ERROR;
}


ngx_str_t *
ngx_http_hypic_mode_name(ngx_uint_t mode)
{
    if (mode > HP_IPC_MODE_PIC) {
        mode = HP_IPC_MODE_FULL;
    }

    return &ngx_http_hypic_modes[mode];
}


ngx_str_t *
ngx_http_hypic_route_name(ngx_uint_t route)
{
    if (route >= NGX_HTTP_HYPIC_ROUTE_N) {
        route = NGX_HTTP_HYPIC_ROUTE_LOCAL;
    }

    return &ngx_http_hypic_routes[route];
}


static ngx_int_t
ngx_http_hypic_preconfiguration(ngx_conf_t *cf)
{
    return ngx_http_hypic_add_variables(cf);
}


static ngx_int_t
ngx_http_hypic_init(ngx_conf_t *cf)
{
    return ngx_http_hypic_handler_init(cf);
}


static void *
ngx_http_hypic_create_main_conf(ngx_conf_t *cf)
{
    ngx_http_hypic_main_conf_t  *hmcf;

    hmcf = ngx_pcalloc(cf->pool, sizeof(ngx_http_hypic_main_conf_t));
    if (hmcf == NULL) {
        return NULL;
    }

    /*
     * set by ngx_pcalloc():
     *
     *     hmcf->redis = { 0, NULL };
     *     hmcf->redis_host = { 0, NULL };
     *     hmcf->redis_port = 0;
     *     hmcf->affinity = 0;
     *     hmcf->metrics_zone = NULL;
     */

    if (ngx_array_init(&hmcf->engines, cf->pool, 4,
                       sizeof(ngx_http_hypic_engine_t))
        != NGX_OK)
    {
        return NULL;
    }

    hmcf->redis_timeout = NGX_CONF_UNSET_MSEC;
    hmcf->stall_timeout = NGX_CONF_UNSET_MSEC;
    hmcf->created = ngx_time();

    return hmcf;
}


static char *
ngx_http_hypic_init_main_conf(ngx_conf_t *cf, void *conf)
{
    ngx_http_hypic_main_conf_t  *hmcf = conf;

    ngx_conf_init_msec_value(hmcf->redis_timeout, 50);
    ngx_conf_init_msec_value(hmcf->stall_timeout, 5000);

    hmcf->metrics_zone = ngx_http_hypic_metrics_add(cf);
    if (hmcf->metrics_zone == NULL) {
        return NGX_CONF_ERROR;
    }

    return NGX_CONF_OK;
}


static void *
ngx_http_hypic_create_loc_conf(ngx_conf_t *cf)
{
    ngx_http_hypic_loc_conf_t  *hlcf;

    hlcf = ngx_pcalloc(cf->pool, sizeof(ngx_http_hypic_loc_conf_t));
    if (hlcf == NULL) {
        return NULL;
    }

    /*
     * set by ngx_pcalloc():
     *
     *     hlcf->engine_name = { 0, NULL };
     *     hlcf->engine = NULL;
     *     hlcf->pass_file = NULL;
     *     hlcf->pass_line = 0;
     *     hlcf->separator = { 0, NULL };
     *     hlcf->peer = { 0, NULL };
     */

    hlcf->mode = NGX_CONF_UNSET_PTR;
    hlcf->seam = NGX_CONF_UNSET_UINT;
    hlcf->routing = NGX_CONF_UNSET_UINT;
    hlcf->max_prompt_bytes = NGX_CONF_UNSET_SIZE;
    hlcf->max_tokens = NGX_CONF_UNSET_UINT;
    hlcf->request_timeout = NGX_CONF_UNSET_MSEC;
    hlcf->heartbeat = NGX_CONF_UNSET_MSEC;

    return hlcf;
}


static char *
ngx_http_hypic_merge_loc_conf(ngx_conf_t *cf, void *parent, void *child)
{
    ngx_http_hypic_loc_conf_t *prev = parent;
    ngx_http_hypic_loc_conf_t *conf = child;

    ngx_http_core_loc_conf_t    *clcf;
    ngx_http_hypic_main_conf_t  *hmcf;

    ngx_conf_merge_str_value(conf->separator, prev->separator,
                             "<|pic_sep|>");
    ngx_conf_merge_ptr_value(conf->mode, prev->mode, NULL);
    /* unset: the engine's own default (its "seam" setting) applies */
    ngx_conf_merge_uint_value(conf->seam, prev->seam, NGX_CONF_UNSET_UINT);
    ngx_conf_merge_uint_value(conf->routing, prev->routing,
                              NGX_HTTP_HYPIC_ROUTING_LOCAL);
    ngx_conf_merge_str_value(conf->peer, prev->peer, "");
    ngx_conf_merge_size_value(conf->max_prompt_bytes, prev->max_prompt_bytes,
                              1024 * 1024);
    ngx_conf_merge_uint_value(conf->max_tokens, prev->max_tokens, 4096);
    ngx_conf_merge_msec_value(conf->request_timeout, prev->request_timeout,
                              300000);
    ngx_conf_merge_msec_value(conf->heartbeat, prev->heartbeat, 15000);

    if (conf->mode == NULL) {
        conf->mode = ngx_pcalloc(cf->pool, sizeof(ngx_http_complex_value_t));
        if (conf->mode == NULL) {
            return NGX_CONF_ERROR;
        }

        conf->mode->value = ngx_http_hypic_modes[HP_IPC_MODE_PIC];
    }

    if (conf->engine_name.len == 0) {
        return NGX_CONF_OK;
    }

    /*
     * hypic_pass is resolved here, after the whole http block is read:
     * hypic_engine may come after the location, and the engines array
     * does not move any more.
     */

    hmcf = ngx_http_conf_get_module_main_conf(cf, ngx_http_hypic_module);

    conf->engine = ngx_http_hypic_find_engine(hmcf, &conf->engine_name);

    if (conf->engine == NULL) {
        if (hmcf->engines.nelts == 0) {
            ngx_log_error(NGX_LOG_EMERG, cf->log, 0,
                          "hypic_pass \"%V\" in %s:%ui needs a hypic_engine, "
                          "but none is declared in the http block",
                          &conf->engine_name, conf->pass_file,
                          conf->pass_line);

        } else {
            ngx_log_error(NGX_LOG_EMERG, cf->log, 0,
                          "unknown hypic_engine \"%V\" in %s:%ui",
                          &conf->engine_name, conf->pass_file,
                          conf->pass_line);
        }

        return NGX_CONF_ERROR;
    }

    /*
     * In a hypic_pass location the body limit is hypic_max_prompt_bytes,
     * answered in JSON by our handler and request body filter; the core
     * check would run first and answer in HTML.
     */

    clcf = ngx_http_conf_get_module_loc_conf(cf, ngx_http_core_module);
    clcf->client_max_body_size = 0;

    if (conf->routing != NGX_HTTP_HYPIC_ROUTING_AFFINITY) {
        return NGX_CONF_OK;
    }

    if (hmcf->redis.len == 0) {
        ngx_log_error(NGX_LOG_EMERG, cf->log, 0,
                      "hypic_routing cache_affinity for hypic_pass \"%V\" "
                      "in %s:%ui needs hypic_redis in the http block",
                      &conf->engine_name, conf->pass_file, conf->pass_line);
        return NGX_CONF_ERROR;
    }

    /* without hypic_peer every request stays here: nothing to look up */

    if (conf->peer.len) {
        hmcf->affinity = 1;
    }

    return NGX_CONF_OK;
}


static ngx_http_hypic_engine_t *
ngx_http_hypic_find_engine(ngx_http_hypic_main_conf_t *hmcf, ngx_str_t *name)
{
    ngx_uint_t                i;
    ngx_http_hypic_engine_t  *engine;

    engine = hmcf->engines.elts;

    for (i = 0; i < hmcf->engines.nelts; i++) {
        if (engine[i].name.len == name->len
            && ngx_strncmp(engine[i].name.data, name->data, name->len) == 0)
        {
            return &engine[i];
        }
    }

    return NULL;
}


static char *
ngx_http_hypic_engine(ngx_conf_t *cf, ngx_command_t *cmd, void *conf)
{
    ngx_http_hypic_main_conf_t  *hmcf = conf;

    u_char                   *p;
    ngx_str_t                *value, path;
    ngx_uint_t                i;
    ngx_http_hypic_engine_t  *engine;

    value = cf->args->elts;

    if (value[1].len == 0) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "empty hypic_engine name");
        return NGX_CONF_ERROR;
    }

    for (p = value[1].data; p < value[1].data + value[1].len; p++) {
        if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z')
              || (*p >= '0' && *p <= '9')
              || *p == '_' || *p == '-' || *p == '.'))
        {
            ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                               "invalid hypic_engine name \"%V\", use "
                               "letters, digits, \"_\", \"-\" and \".\"",
                               &value[1]);
            return NGX_CONF_ERROR;
        }
    }

    if (cf->args->nelts > 5) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "too many parameters in hypic_engine \"%V\"",
                           &value[1]);
        return NGX_CONF_ERROR;
    }

    if (ngx_http_hypic_find_engine(hmcf, &value[1]) != NULL) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "duplicate hypic_engine \"%V\"", &value[1]);
        return NGX_CONF_ERROR;
    }

    if (value[2].len <= 5 || ngx_strncmp(value[2].data, "unix:", 5) != 0) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "invalid address \"%V\" in hypic_engine \"%V\", "
                           "expected unix:/path",
                           &value[2], &value[1]);
        return NGX_CONF_ERROR;
    }

    path.len = value[2].len - 5;
    path.data = value[2].data + 5;

    if (ngx_conf_full_name(cf->cycle, &path, 0) != NGX_OK) {
        return NGX_CONF_ERROR;
    }

    if (path.len >= sizeof(((struct sockaddr_un *) 0)->sun_path)) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "too long socket path \"%V\" in hypic_engine "
                           "\"%V\"", &path, &value[1]);
        return NGX_CONF_ERROR;
    }

    engine = ngx_array_push(&hmcf->engines);
    if (engine == NULL) {
        return NGX_CONF_ERROR;
    }

    ngx_memzero(engine, sizeof(ngx_http_hypic_engine_t));

    engine->name = value[1];
    engine->address = value[2];
    engine->path = path;
    engine->model = value[1];

    for (i = 3; i < cf->args->nelts; i++) {

        if (ngx_strncmp(value[i].data, "model=", 6) == 0
            && value[i].len > 6)
        {
            engine->model.len = value[i].len - 6;
            engine->model.data = value[i].data + 6;
            continue;
        }

        if (ngx_strncmp(value[i].data, "shm=", 4) == 0 && value[i].len > 4) {
            engine->shm.len = value[i].len - 4;
            engine->shm.data = value[i].data + 4;
            continue;
        }

        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "invalid parameter \"%V\" in hypic_engine \"%V\", "
                           "expected model=ID or shm=NAME",
                           &value[i], &value[1]);
        return NGX_CONF_ERROR;
    }

    return NGX_CONF_OK;
}


static char *
ngx_http_hypic_redis(ngx_conf_t *cf, ngx_command_t *cmd, void *conf)
{
    ngx_http_hypic_main_conf_t  *hmcf = conf;

    u_char     *p;
    size_t      len;
    ngx_str_t  *value;
    ngx_url_t   u;

    if (hmcf->redis.data) {
        return "is duplicate";
    }

    value = cf->args->elts;

    ngx_memzero(&u, sizeof(ngx_url_t));

    u.url = value[1];

    /* resolved now, once: hiredis would resolve with a blocking call */

    if (ngx_parse_url(cf->pool, &u) != NGX_OK) {
        if (u.err) {
            ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                               "%s in hypic_redis \"%V\"", u.err, &u.url);
        }

        return NGX_CONF_ERROR;
    }

    if (u.family == AF_UNIX || u.no_port || u.naddrs == 0) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "invalid hypic_redis \"%V\", expected HOST:PORT",
                           &u.url);
        return NGX_CONF_ERROR;
    }

    p = ngx_pnalloc(cf->pool, NGX_SOCKADDR_STRLEN + 1);
    if (p == NULL) {
        return NGX_CONF_ERROR;
    }

    len = ngx_sock_ntop(u.addrs[0].sockaddr, u.addrs[0].socklen, p,
                        NGX_SOCKADDR_STRLEN, 0);
    p[len] = '\0';

    hmcf->redis = value[1];
    hmcf->redis_host.len = len;
    hmcf->redis_host.data = p;
    hmcf->redis_port = u.port;

    return NGX_CONF_OK;
}


static char *
ngx_http_hypic_pass(ngx_conf_t *cf, ngx_command_t *cmd, void *conf)
{
    ngx_http_hypic_loc_conf_t  *hlcf = conf;

    char       *rv;
    ngx_str_t  *value;

    if (hlcf->engine_name.data) {
        return "is duplicate";
    }

    value = cf->args->elts;

    if (value[1].len == 0) {
        return "needs an engine name";
    }

    rv = ngx_http_hypic_set_handler(cf, ngx_http_hypic_pass_handler);
    if (rv != NGX_CONF_OK) {
        return rv;
    }

    hlcf->engine_name = value[1];
    hlcf->pass_file = cf->conf_file->file.name.data;
    hlcf->pass_line = cf->conf_file->line;

    return NGX_CONF_OK;
}


static char *
ngx_http_hypic_mode(ngx_conf_t *cf, ngx_command_t *cmd, void *conf)
{
    ngx_http_hypic_loc_conf_t  *hlcf = conf;

    char       *rv;
    ngx_str_t  *value;

    rv = ngx_http_set_complex_value_slot(cf, cmd, conf);
    if (rv != NGX_CONF_OK) {
        return rv;
    }

    /* a literal is checked now; a variable is checked per request */

    if (hlcf->mode->lengths == NULL
        && ngx_http_hypic_parse_mode(&hlcf->mode->value) == NGX_ERROR)
    {
        value = cf->args->elts;

        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "invalid hypic_mode \"%V\", expected full, "
                           "prefix, naive, pic or a variable", &value[1]);
        return NGX_CONF_ERROR;
    }

    return NGX_CONF_OK;
}


static char *
ngx_http_hypic_health(ngx_conf_t *cf, ngx_command_t *cmd, void *conf)
{
    return ngx_http_hypic_set_handler(cf, ngx_http_hypic_health_handler);
}


static char *
ngx_http_hypic_metrics(ngx_conf_t *cf, ngx_command_t *cmd, void *conf)
{
    return ngx_http_hypic_set_handler(cf, ngx_http_hypic_metrics_handler);
}


static char *
ngx_http_hypic_error(ngx_conf_t *cf, ngx_command_t *cmd, void *conf)
{
    return ngx_http_hypic_set_handler(cf, ngx_http_hypic_error_handler);
}


static char *
ngx_http_hypic_set_handler(ngx_conf_t *cf, ngx_http_handler_pt handler)
{
    ngx_http_core_loc_conf_t  *clcf;

    clcf = ngx_http_conf_get_module_loc_conf(cf, ngx_http_core_module);

    if (clcf->handler == handler) {
        return "is duplicate";
    }

    if (clcf->handler) {
        return "conflicts with another content handler in this location";
    }

    clcf->handler = handler;

    return NGX_CONF_OK;
}


static char *
ngx_http_hypic_check_separator(ngx_conf_t *cf, void *post, void *data)
{
    ngx_str_t  *separator = data;

    if (separator->len == 0) {
        return "must not be empty";
    }

    /* it travels to the engine in a fixed field of the request slot */

    if (separator->len > HP_IPC_SEP_BYTES) {
        return "is too long (64 bytes at most)";
    }

    return NGX_CONF_OK;
}


/* hypic_peer names a location ("@name") that proxies to $hypic_peer_addr */

static char *
ngx_http_hypic_check_peer(ngx_conf_t *cf, void *post, void *data)
{
    ngx_str_t  *peer = data;

    if (peer->len < 2 || peer->data[0] != '@') {
        return "must name a named location, such as @hypic_peer";
    }

    return NGX_CONF_OK;
}


/* the engine beats every HP_IPC_HEARTBEAT_MS: leave room for a late one */

static char *
ngx_http_hypic_check_stall(ngx_conf_t *cf, void *post, void *data)
{
    ngx_msec_t  *ms = data;

    if (*ms < 4 * HP_IPC_HEARTBEAT_MS) {
        return "must be at least 1s";
    }

    return NGX_CONF_OK;
}


/* ngx_conf_check_num_bounds(), but the message names the directive */

static char *
ngx_http_hypic_check_bounds(ngx_conf_t *cf, void *post, void *data)
{
    ngx_conf_num_bounds_t  *bounds = post;
    ngx_int_t              *np = data;

    ngx_str_t  *value;

    if (*np >= bounds->low && (bounds->high == -1 || *np <= bounds->high)) {
        return NGX_CONF_OK;
    }

    value = cf->args->elts;

    if (bounds->high == -1) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "\"%V\" must be at least %i, not \"%V\"",
                           &value[0], bounds->low, &value[1]);

    } else {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "\"%V\" must be between %i and %i, not \"%V\"",
                           &value[0], bounds->low, bounds->high, &value[1]);
    }

    return NGX_CONF_ERROR;
}


static ngx_int_t
ngx_http_hypic_init_process(ngx_cycle_t *cycle)
{
    if (ngx_http_hypic_engine_init_process(cycle) != NGX_OK) {
        return NGX_ERROR;
    }

    return ngx_http_hypic_redis_init_process(cycle);
}


static void
ngx_http_hypic_exit_process(ngx_cycle_t *cycle)
{
    ngx_http_hypic_redis_exit_process(cycle);
    ngx_http_hypic_engine_exit_process(cycle);
}
