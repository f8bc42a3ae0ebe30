
/*
 * HYPIC serve: the Redis segment index on nginx's event loop (see
 * ngx_http_hypic_redis.h).
 *
 * The hiredis adapter follows hiredis's adapters/ae.h: the context's fd
 * is wrapped in an nginx connection whose events, registered
 * level-triggered (a reply larger than hiredis's read buffer must not
 * stall), call redisAsyncHandleRead/Write; the reading and writing flags
 * make the hooks idempotent. hiredis 0.14 has no timers: every lookup
 * carries an nginx timer of hypic_redis_timeout, and a lookup that times
 * out drops the connection, so that a Redis that stopped answering costs
 * the next requests nothing until the back-off has passed.
 *
 * hiredis never holds a pointer into a request pool: each lookup is a
 * small heap block that hiredis's callbacks share with the request. The
 * request's pool cleanup clears lookup->request; the block is freed by
 * whoever is last, the request or the last reply.
 *
 * Keys (DESIGN section 7; the engine's side is engine/cluster/index.c):
 *
 *   hypic:{model}:seg:{32 hex id}   set of node ids holding the segment
 *   hypic:{model}:node:{node}       hash {addr, load, ts}, expiring
 */


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include <hiredis.h>
#include <async.h>

#include "ngx_http_hypic_module.h"
#include "ngx_http_hypic_engine.h"
#include "ngx_http_hypic_handler.h"
#include "ngx_http_hypic_redis.h"

#include "engine/contract/hp_seg.h"


#define NGX_HTTP_HYPIC_REDIS_DOWN        0
#define NGX_HTTP_HYPIC_REDIS_CONNECTING  1
#define NGX_HTTP_HYPIC_REDIS_UP          2

#define NGX_HTTP_HYPIC_BACKOFF_MIN       100
#define NGX_HTTP_HYPIC_BACKOFF_MAX       5000

/* what one lookup asks at most: a bound on the work of one request */
#define NGX_HTTP_HYPIC_MAX_SEGS          256
#define NGX_HTTP_HYPIC_MAX_NODES         64
#define NGX_HTTP_HYPIC_MAX_PEERS         16


typedef struct {
    redisAsyncContext          *ac;
    ngx_connection_t           *connection;   /* wraps ac->c.fd */
    ngx_event_t                 reconnect;
    ngx_msec_t                  backoff;
    ngx_uint_t                  state;
    ngx_http_hypic_main_conf_t *hmcf;
    unsigned                    reading:1;
    unsigned                    writing:1;
    unsigned                    failing:1;    /* the incident is logged */
    unsigned                    exiting:1;
    unsigned                    warned_addr:1;
} ngx_http_hypic_redis_t;


struct ngx_http_hypic_lookup_s {
    ngx_http_request_t         *request;      /* NULL once it let go */
    ngx_uint_t                  pending;      /* replies still due */
    ngx_uint_t                  received;     /* replies of this round */
    ngx_uint_t                  round;        /* 1: segments, 2: nodes */
    ngx_uint_t                  n_peers;      /* asked in round 2 */
    ngx_http_hypic_node_t      *peers[NGX_HTTP_HYPIC_MAX_PEERS];
    unsigned                    failed:1;
};


static void ngx_http_hypic_redis_connect(void);
static void ngx_http_hypic_redis_reconnect(ngx_event_t *ev);
static void ngx_http_hypic_redis_schedule(void);
static void ngx_http_hypic_redis_reset(void);
static void ngx_http_hypic_redis_failed(const char *why,
    const char *detail, size_t len);
static void ngx_http_hypic_redis_connected(const redisAsyncContext *ac,
    int status);
static void ngx_http_hypic_redis_disconnected(const redisAsyncContext *ac,
    int status);
static void ngx_http_hypic_redis_read(ngx_event_t *ev);
static void ngx_http_hypic_redis_write(ngx_event_t *ev);
static void ngx_http_hypic_redis_add_read(void *data);
static void ngx_http_hypic_redis_del_read(void *data);
static void ngx_http_hypic_redis_add_write(void *data);
static void ngx_http_hypic_redis_del_write(void *data);
static void ngx_http_hypic_redis_cleanup(void *data);
static ngx_int_t ngx_http_hypic_redis_segments(ngx_http_request_t *r,
    ngx_http_hypic_ctx_t *ctx, ngx_http_hypic_identity_t *id);
static ngx_int_t ngx_http_hypic_redis_keys(ngx_http_request_t *r,
    ngx_http_hypic_ctx_t *ctx, ngx_http_hypic_identity_t *id,
    ngx_str_t *text, ngx_uint_t pic_only);
static void ngx_http_hypic_redis_reply(redisAsyncContext *ac, void *reply,
    void *privdata);
static void ngx_http_hypic_redis_holders(ngx_http_request_t *r,
    ngx_http_hypic_ctx_t *ctx, ngx_uint_t seg, redisReply *reply);
static ngx_http_hypic_node_t *ngx_http_hypic_redis_node(
    ngx_http_request_t *r, ngx_http_hypic_ctx_t *ctx, u_char *id,
    size_t len);
static ngx_int_t ngx_http_hypic_redis_ask_peers(ngx_http_request_t *r,
    ngx_http_hypic_ctx_t *ctx, ngx_http_hypic_lookup_t *lk);
static void ngx_http_hypic_redis_peer(ngx_http_request_t *r,
    ngx_http_hypic_node_t *node, redisReply *reply);
static double ngx_http_hypic_redis_load(redisReply *reply);
static ngx_uint_t ngx_http_hypic_redis_valid_addr(ngx_str_t *addr);
static ngx_http_hypic_node_t *ngx_http_hypic_redis_choose(
    ngx_http_hypic_ctx_t *ctx);
static void ngx_http_hypic_redis_finish(ngx_http_request_t *r,
    ngx_http_hypic_ctx_t *ctx, ngx_uint_t route);
static void ngx_http_hypic_redis_timeout(ngx_event_t *ev);


static ngx_http_hypic_redis_t  ngx_http_hypic_redis;    /* this worker's */


ngx_int_t
ngx_http_hypic_redis_init_process(ngx_cycle_t *cycle)
{
    ngx_http_hypic_redis_t      *rd;
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

    if (hmcf == NULL || hmcf->redis.len == 0 || !hmcf->affinity) {
        return NGX_OK;
    }

    rd = &ngx_http_hypic_redis;

    ngx_memzero(rd, sizeof(ngx_http_hypic_redis_t));

    rd->hmcf = hmcf;
    rd->backoff = NGX_HTTP_HYPIC_BACKOFF_MIN;
    rd->reconnect.handler = ngx_http_hypic_redis_reconnect;
    rd->reconnect.data = rd;
    rd->reconnect.log = cycle->log;
    rd->reconnect.cancelable = 1;

    ngx_http_hypic_redis_connect();

    return NGX_OK;
}


void
ngx_http_hypic_redis_exit_process(ngx_cycle_t *cycle)
{
    ngx_http_hypic_redis_t  *rd;

    rd = &ngx_http_hypic_redis;

    if (rd->hmcf == NULL) {
        return;
    }

    rd->exiting = 1;

    if (rd->reconnect.timer_set) {
        ngx_del_timer(&rd->reconnect);
    }

    ngx_http_hypic_redis_reset();
}


/* ---- the connection ------------------------------------------------ */


static void
ngx_http_hypic_redis_connect(void)
{
    redisAsyncContext       *ac;
    ngx_connection_t        *c;
    ngx_http_hypic_redis_t  *rd;

    rd = &ngx_http_hypic_redis;

    /* the address is numeric (resolved at config time): no blocking */

    ac = redisAsyncConnect((char *) rd->hmcf->redis_host.data,
                           rd->hmcf->redis_port);

    if (ac == NULL) {
        ngx_http_hypic_redis_failed("cannot be reached", "no memory", 9);
        ngx_http_hypic_redis_schedule();
        return;
    }

    if (ac->err) {
        ngx_http_hypic_redis_failed("cannot be reached", ac->errstr,
                                    ngx_strlen(ac->errstr));
        redisAsyncFree(ac);
        ngx_http_hypic_redis_schedule();
        return;
    }

    /* hiredis's adapters refuse a context that is attached already */

    if (ac->ev.data != NULL) {
        ngx_log_error(NGX_LOG_ALERT, ngx_cycle->log, 0,
                      "hypic: redis context attached twice");
        redisAsyncFree(ac);
        return;
    }

    c = ngx_get_connection(ac->c.fd, ngx_cycle->log);

    if (c == NULL) {
        redisAsyncFree(ac);
        ngx_http_hypic_redis_schedule();
        return;
    }

    c->data = rd;
    c->read->handler = ngx_http_hypic_redis_read;
    c->write->handler = ngx_http_hypic_redis_write;
    c->read->log = c->log;
    c->write->log = c->log;

    rd->ac = ac;
    rd->connection = c;
    rd->reading = 0;
    rd->writing = 0;
    rd->state = NGX_HTTP_HYPIC_REDIS_CONNECTING;

    ac->ev.data = rd;
    ac->ev.addRead = ngx_http_hypic_redis_add_read;
    ac->ev.delRead = ngx_http_hypic_redis_del_read;
    ac->ev.addWrite = ngx_http_hypic_redis_add_write;
    ac->ev.delWrite = ngx_http_hypic_redis_del_write;
    ac->ev.cleanup = ngx_http_hypic_redis_cleanup;

    /* after the hooks: setting the connect callback waits for writable */

    redisAsyncSetConnectCallback(ac, ngx_http_hypic_redis_connected);
    redisAsyncSetDisconnectCallback(ac, ngx_http_hypic_redis_disconnected);

    ngx_log_debug2(NGX_LOG_DEBUG_HTTP, ngx_cycle->log, 0,
                   "hypic: connecting to redis %V, fd %d",
                   &rd->hmcf->redis, c->fd);
}


static void
ngx_http_hypic_redis_reconnect(ngx_event_t *ev)
{
    ngx_http_hypic_redis_t  *rd = ev->data;

    if (rd->exiting || ngx_exiting || ngx_terminate || ngx_quit) {
        return;
    }

    ngx_http_hypic_redis_connect();
}


static void
ngx_http_hypic_redis_schedule(void)
{
    ngx_http_hypic_redis_t  *rd;

    rd = &ngx_http_hypic_redis;

    if (rd->exiting || rd->reconnect.timer_set) {
        return;
    }

    ngx_add_timer(&rd->reconnect, rd->backoff);

    rd->backoff = ngx_min(2 * rd->backoff, NGX_HTTP_HYPIC_BACKOFF_MAX);
}


/*
 * Drops the connection. hiredis first calls every pending callback with
 * no reply (their requests go local), then the cleanup hook.
 */

static void
ngx_http_hypic_redis_reset(void)
{
    redisAsyncContext       *ac;
    ngx_http_hypic_redis_t  *rd;

    rd = &ngx_http_hypic_redis;

    ac = rd->ac;

    if (ac == NULL) {
        return;
    }

    rd->ac = NULL;
    rd->state = NGX_HTTP_HYPIC_REDIS_DOWN;

    redisAsyncFree(ac);
}


/*
 * The first failure of an incident is an error; the rest are quiet until
 * a lookup succeeds again. detail (hiredis's words, Redis's error reply)
 * may be NULL.
 */

static void
ngx_http_hypic_redis_failed(const char *why, const char *detail, size_t len)
{
    ngx_http_hypic_redis_t  *rd;

    rd = &ngx_http_hypic_redis;

    if (rd->failing || rd->exiting) {
        ngx_log_debug1(NGX_LOG_DEBUG_HTTP, ngx_cycle->log, 0,
                       "hypic: redis still failing: %s", why);
        return;
    }

    rd->failing = 1;

    if (detail == NULL || len == 0) {
        ngx_log_error(NGX_LOG_ERR, ngx_cycle->log, 0,
                      "hypic: redis at \"%V\" %s, routing locally until "
                      "it answers again", &rd->hmcf->redis, why);
        return;
    }

    ngx_log_error(NGX_LOG_ERR, ngx_cycle->log, 0,
                  "hypic: redis at \"%V\" %s (%*s), routing locally until "
                  "it answers again", &rd->hmcf->redis, why,
                  ngx_min(len, 256), detail);
}


static void
ngx_http_hypic_redis_connected(const redisAsyncContext *ac, int status)
{
    ngx_http_hypic_redis_t  *rd;

    rd = &ngx_http_hypic_redis;

    if (status == REDIS_OK) {
        rd->state = NGX_HTTP_HYPIC_REDIS_UP;

        ngx_log_debug1(NGX_LOG_DEBUG_HTTP, ngx_cycle->log, 0,
                       "hypic: connected to redis %V", &rd->hmcf->redis);
        return;
    }

    /* hiredis frees the context when this returns */

    ngx_http_hypic_redis_failed("cannot be reached", ac->errstr,
                                ngx_strlen(ac->errstr));

    if (rd->ac == ac) {
        rd->ac = NULL;
        rd->state = NGX_HTTP_HYPIC_REDIS_DOWN;
    }

    ngx_http_hypic_redis_schedule();
}


static void
ngx_http_hypic_redis_disconnected(const redisAsyncContext *ac, int status)
{
    ngx_http_hypic_redis_t  *rd;

    rd = &ngx_http_hypic_redis;

    if (rd->ac == ac) {
        rd->ac = NULL;
        rd->state = NGX_HTTP_HYPIC_REDIS_DOWN;
    }

    if (rd->exiting) {
        return;
    }

    if (status != REDIS_OK) {
        ngx_http_hypic_redis_failed("closed the connection", ac->errstr,
                                    ngx_strlen(ac->errstr));
    }

    ngx_http_hypic_redis_schedule();
}


static void
ngx_http_hypic_redis_read(ngx_event_t *ev)
{
    ngx_connection_t        *c;
    ngx_http_hypic_redis_t  *rd;

    c = ev->data;
    rd = c->data;

    if (rd->ac) {
        redisAsyncHandleRead(rd->ac);
    }
}


static void
ngx_http_hypic_redis_write(ngx_event_t *ev)
{
    ngx_connection_t        *c;
    ngx_http_hypic_redis_t  *rd;

    c = ev->data;
    rd = c->data;

    if (rd->ac) {
        redisAsyncHandleWrite(rd->ac);
    }
}


/* the adapter's hooks: idempotent, as hiredis expects */

static void
ngx_http_hypic_redis_add_read(void *data)
{
    ngx_http_hypic_redis_t  *rd = data;

    if (rd->reading || rd->connection == NULL) {
        return;
    }

    if (ngx_add_event(rd->connection->read, NGX_READ_EVENT, NGX_LEVEL_EVENT)
        != NGX_OK)
    {
        ngx_log_error(NGX_LOG_ALERT, ngx_cycle->log, 0,
                      "hypic: cannot watch the redis connection");
        return;
    }

    rd->reading = 1;
}


static void
ngx_http_hypic_redis_del_read(void *data)
{
    ngx_http_hypic_redis_t  *rd = data;

    if (!rd->reading || rd->connection == NULL) {
        return;
    }

    rd->reading = 0;

    (void) ngx_del_event(rd->connection->read, NGX_READ_EVENT, 0);
}


static void
ngx_http_hypic_redis_add_write(void *data)
{
    ngx_http_hypic_redis_t  *rd = data;

    if (rd->writing || rd->connection == NULL) {
        return;
    }

    if (ngx_add_event(rd->connection->write, NGX_WRITE_EVENT,
                      NGX_LEVEL_EVENT)
        != NGX_OK)
    {
        ngx_log_error(NGX_LOG_ALERT, ngx_cycle->log, 0,
                      "hypic: cannot watch the redis connection");
        return;
    }

    rd->writing = 1;
}


static void
ngx_http_hypic_redis_del_write(void *data)
{
    ngx_http_hypic_redis_t  *rd = data;

    if (!rd->writing || rd->connection == NULL) {
        return;
    }

    rd->writing = 0;

    (void) ngx_del_event(rd->connection->write, NGX_WRITE_EVENT, 0);
}


/* hiredis is freeing the context and will close the fd itself */

static void
ngx_http_hypic_redis_cleanup(void *data)
{
    ngx_http_hypic_redis_t  *rd = data;

    ngx_connection_t  *c;

    ngx_http_hypic_redis_del_read(rd);
    ngx_http_hypic_redis_del_write(rd);

    c = rd->connection;

    if (c == NULL) {
        return;
    }

    rd->connection = NULL;

    c->fd = (ngx_socket_t) -1;
    ngx_free_connection(c);
}


/* ---- lookups ------------------------------------------------------- */


ngx_int_t
ngx_http_hypic_redis_lookup(ngx_http_request_t *r, ngx_http_hypic_ctx_t *ctx,
    ngx_http_hypic_identity_t *id)
{
    u_char                   *key;
    size_t                    len;
    ngx_int_t                 rc;
    ngx_uint_t                i;
    ngx_http_hypic_redis_t   *rd;
    ngx_http_hypic_lookup_t  *lk;

    rd = &ngx_http_hypic_redis;

    rc = ngx_http_hypic_redis_segments(r, ctx, id);

    if (rc != NGX_OK) {
        return rc;
    }

    if (ctx->routing.n_segs == 0) {
        return NGX_OK;
    }

    if (rd->ac == NULL || rd->state == NGX_HTTP_HYPIC_REDIS_DOWN) {
        return NGX_DECLINED;
    }

    len = ctx->routing.model_key.len + sizeof("node:") - 1
          + ctx->routing.local_node.len;

    key = ngx_pnalloc(r->pool, len);
    if (key == NULL) {
        return NGX_ERROR;
    }

    ngx_sprintf(key, "%Vnode:%V", &ctx->routing.model_key,
                &ctx->routing.local_node);

    lk = ngx_calloc(sizeof(ngx_http_hypic_lookup_t), r->connection->log);
    if (lk == NULL) {
        return NGX_ERROR;
    }

    lk->request = r;
    lk->round = 1;

    /* round 1: the holders of every segment, and the local node's load */

    for (i = 0; i < ctx->routing.n_segs; i++) {
        if (redisAsyncCommand(rd->ac, ngx_http_hypic_redis_reply, lk,
                              "SMEMBERS %b", ctx->routing.seg_keys[i].data,
                              ctx->routing.seg_keys[i].len)
            != REDIS_OK)
        {
            break;
        }

        lk->pending++;
    }

    if (lk->pending == ctx->routing.n_segs
        && redisAsyncCommand(rd->ac, ngx_http_hypic_redis_reply, lk,
                             "HMGET %b load", key, len)
           == REDIS_OK)
    {
        lk->pending++;
    }

    if (lk->pending != ctx->routing.n_segs + 1) {

        /* the context is going away: what was sent comes back empty */

        lk->request = NULL;

        if (lk->pending == 0) {
            ngx_free(lk);
        }

        return NGX_DECLINED;
    }

    ctx->routing.lookup = lk;

    ctx->routing.redis_timer.handler = ngx_http_hypic_redis_timeout;
    ctx->routing.redis_timer.data = r;
    ctx->routing.redis_timer.log = r->connection->log;

    ngx_add_timer(&ctx->routing.redis_timer, rd->hmcf->redis_timeout);

    ngx_log_debug2(NGX_LOG_DEBUG_HTTP, r->connection->log, 0,
                   "hypic: redis lookup of %ui segments for %V",
                   ctx->routing.n_segs, &ctx->out.id);

    return NGX_AGAIN;
}


/*
 * The cacheable segments of the prompt (the leading one and the PIC
 * ones, not empty; the question never is) as index keys, each with its
 * size in bytes: the weight of a hit. A chat prompt is rendered by the
 * engine, so only what the template copies as it is can be named here:
 * the PIC segments inside one message's text.
 */

static ngx_int_t
ngx_http_hypic_redis_segments(ngx_http_request_t *r,
    ngx_http_hypic_ctx_t *ctx, ngx_http_hypic_identity_t *id)
{
    ngx_str_t                  *texts, one;
    ngx_uint_t                  i, n_texts, chat;

    chat = (ctx->in.contents != NULL);

    if (chat) {
        texts = ctx->in.contents->elts;
        n_texts = ctx->in.contents->nelts;

    } else {
        one = ctx->in.prompt;
        texts = &one;
        n_texts = 1;
    }

    ctx->routing.n_segs = 0;

    ctx->routing.seg_keys = ngx_palloc(r->pool,
                               NGX_HTTP_HYPIC_MAX_SEGS * sizeof(ngx_str_t));
    ctx->routing.seg_bytes = ngx_palloc(r->pool,
                                NGX_HTTP_HYPIC_MAX_SEGS * sizeof(uint64_t));

    if (ctx->routing.seg_keys == NULL || ctx->routing.seg_bytes == NULL) {
        return NGX_ERROR;
    }

    /* "hypic:{model}:", the prefix of every key of this model */

    ctx->routing.model_key.len = sizeof("hypic::") - 1 + id->model.len;
    ctx->routing.model_key.data = ngx_pnalloc(r->pool,
                                              ctx->routing.model_key.len);
    if (ctx->routing.model_key.data == NULL) {
        return NGX_ERROR;
    }

    ngx_sprintf(ctx->routing.model_key.data, "hypic:%V:", &id->model);

    ctx->routing.local_node.len = id->node.len;
    ctx->routing.local_node.data = ngx_pstrdup(r->pool, &id->node);
    if (ctx->routing.local_node.data == NULL) {
        return NGX_ERROR;
    }

    for (i = 0; i < n_texts; i++) {
        if (ngx_http_hypic_redis_keys(r, ctx, id, &texts[i], chat)
            != NGX_OK)
        {
            return NGX_ERROR;
        }
    }

    if (ngx_array_init(&ctx->routing.nodes, r->pool, 4,
                       sizeof(ngx_http_hypic_node_t))
        != NGX_OK)
    {
        return NGX_ERROR;
    }

    return NGX_OK;
}


/* the keys of one text's segments (only its PIC ones: pic_only) */

static ngx_int_t
ngx_http_hypic_redis_keys(ngx_http_request_t *r, ngx_http_hypic_ctx_t *ctx,
    ngx_http_hypic_identity_t *id, ngx_str_t *text, ngx_uint_t pic_only)
{
    char                        hex[HP_SEG_ID_HEX_LEN + 1];
    u_char                     *p, *last, *key;
    size_t                      klen;
    uint8_t                     seg_id[16];
    hp_seg_t                   *segs;
    ngx_int_t                   n, i;
    ngx_str_t                  *sep;
    ngx_http_hypic_loc_conf_t  *hlcf;

    hlcf = ngx_http_get_module_loc_conf(r, ngx_http_hypic_module);

    sep = &hlcf->separator;

    /* the number of segments first, so the array is just big enough */

    n = 1;
    p = text->data;
    last = p + text->len;

    while ((size_t) (last - p) >= sep->len) {
        p = memmem(p, last - p, sep->data, sep->len);
        if (p == NULL) {
            break;
        }

        n++;
        p += sep->len;
    }

    if (n == 1) {
        return NGX_OK;
    }

    segs = ngx_palloc(r->pool, n * sizeof(hp_seg_t));
    if (segs == NULL) {
        return NGX_ERROR;
    }

    n = hp_seg_split(segs, (int) n, (const char *) text->data, text->len,
                     (const char *) sep->data, sep->len);

    if (n < 0) {
        ngx_log_error(NGX_LOG_ALERT, r->connection->log, 0,
                      "hypic: segments miscounted");
        return NGX_ERROR;
    }

    klen = ctx->routing.model_key.len + sizeof("seg:") - 1 + HP_SEG_ID_HEX_LEN;

    for (i = 0; i < n && ctx->routing.n_segs < NGX_HTTP_HYPIC_MAX_SEGS; i++) {
        if (segs[i].role == HP_SEG_QUERY || segs[i].len == 0
            || (pic_only && segs[i].role != HP_SEG_PIC))
        {
            continue;
        }

        hp_seg_id(seg_id, id->fingerprint, segs[i].role, segs[i].data,
                  segs[i].len);
        hp_seg_id_hex(hex, seg_id);

        key = ngx_pnalloc(r->pool, klen);
        if (key == NULL) {
            return NGX_ERROR;
        }

        ngx_sprintf(key, "%Vseg:%s", &ctx->routing.model_key, hex);

        ctx->routing.seg_keys[ctx->routing.n_segs].data = key;
        ctx->routing.seg_keys[ctx->routing.n_segs].len = klen;
        ctx->routing.seg_bytes[ctx->routing.n_segs] = segs[i].len;
        ctx->routing.n_segs++;
    }

    return NGX_OK;
}


/* Every reply of a lookup, in the order the commands went out. */

static void
ngx_http_hypic_redis_reply(redisAsyncContext *ac, void *reply,
    void *privdata)
{
    ngx_http_hypic_lookup_t *lk = privdata;

    redisReply              *rr = reply;
    ngx_uint_t               i;
    ngx_http_request_t      *r;
    ngx_http_hypic_ctx_t    *ctx;
    ngx_http_hypic_node_t   *node;
    ngx_http_hypic_redis_t  *rd;

    rd = &ngx_http_hypic_redis;

    lk->pending--;

    r = lk->request;

    if (r == NULL) {
        if (lk->pending == 0) {
            ngx_free(lk);
        }

        return;
    }

    ctx = ngx_http_get_module_ctx(r, ngx_http_hypic_module);

    i = lk->received++;

    if (rr == NULL) {

        /* the connection went away; whoever dropped it has logged why */

        lk->failed = 1;

    } else if (rr->type == REDIS_REPLY_ERROR) {
        if (!lk->failed) {
            ngx_http_hypic_redis_failed("answered with an error", rr->str,
                                        (size_t) rr->len);
        }

        lk->failed = 1;

    } else if (lk->failed) {
        /* void */

    } else if (lk->round == 1 && i < ctx->routing.n_segs) {
        ngx_http_hypic_redis_holders(r, ctx, i, rr);

    } else if (lk->round == 1) {
        node = ngx_http_hypic_redis_node(r, ctx, ctx->routing.local_node.data,
                                         ctx->routing.local_node.len);
        if (node) {
            node->load = ngx_http_hypic_redis_load(
                             rr->type == REDIS_REPLY_ARRAY && rr->elements
                             ? rr->element[0] : NULL);
        }

    } else if (i < lk->n_peers) {
        ngx_http_hypic_redis_peer(r, lk->peers[i], rr);
    }

    if (lk->pending) {
        return;
    }

    if (lk->failed) {
        ngx_http_hypic_redis_finish(r, ctx, NGX_HTTP_HYPIC_ROUTE_FALLBACK);
        return;
    }

    /* a whole round is in: a healthy Redis, whatever it said */

    rd->backoff = NGX_HTTP_HYPIC_BACKOFF_MIN;

    if (rd->failing) {
        rd->failing = 0;

        ngx_log_error(NGX_LOG_NOTICE, ngx_cycle->log, 0,
                      "hypic: redis at \"%V\" answers again",
                      &rd->hmcf->redis);
    }

    if (lk->round == 1) {
        switch (ngx_http_hypic_redis_ask_peers(r, ctx, lk)) {

        case NGX_AGAIN:
            return;

        case NGX_ERROR:
            ngx_http_hypic_redis_finish(r, ctx,
                                        NGX_HTTP_HYPIC_ROUTE_FALLBACK);
            return;

        default:
            break;
        }
    }

    ctx->routing.peer = ngx_http_hypic_redis_choose(ctx);

    ngx_http_hypic_redis_finish(r, ctx, ctx->routing.peer
                                        ? NGX_HTTP_HYPIC_ROUTE_PEER
                                        : NGX_HTTP_HYPIC_ROUTE_CACHE);
}


/* SMEMBERS of segment seg: each node in it holds seg_bytes[seg] more */

static void
ngx_http_hypic_redis_holders(ngx_http_request_t *r,
    ngx_http_hypic_ctx_t *ctx, ngx_uint_t seg, redisReply *reply)
{
    size_t                  i;
    redisReply             *e;
    ngx_http_hypic_node_t  *node;

    if (reply->type != REDIS_REPLY_ARRAY) {
        return;
    }

    for (i = 0; i < reply->elements; i++) {
        e = reply->element[i];

        if (e->type != REDIS_REPLY_STRING || e->len == 0) {
            continue;
        }

        node = ngx_http_hypic_redis_node(r, ctx, (u_char *) e->str,
                                         (size_t) e->len);
        if (node) {
            node->bytes += ctx->routing.seg_bytes[seg];
        }
    }
}


/* The node of that id, added if new; NULL past the limit or no memory. */

static ngx_http_hypic_node_t *
ngx_http_hypic_redis_node(ngx_http_request_t *r, ngx_http_hypic_ctx_t *ctx,
    u_char *id, size_t len)
{
    ngx_uint_t              i;
    ngx_http_hypic_node_t  *node;

    node = ctx->routing.nodes.elts;

    for (i = 0; i < ctx->routing.nodes.nelts; i++) {
        if (node[i].id.len == len
            && ngx_strncmp(node[i].id.data, id, len) == 0)
        {
            return &node[i];
        }
    }

    if (ctx->routing.nodes.nelts == NGX_HTTP_HYPIC_MAX_NODES) {
        return NULL;
    }

    node = ngx_array_push(&ctx->routing.nodes);
    if (node == NULL) {
        return NULL;
    }

    ngx_memzero(node, sizeof(ngx_http_hypic_node_t));

    node->id.data = ngx_pnalloc(r->pool, len);
    if (node->id.data == NULL) {
        ctx->routing.nodes.nelts--;
        return NULL;
    }

    ngx_memcpy(node->id.data, id, len);
    node->id.len = len;

    node->local = (len == ctx->routing.local_node.len
                   && ngx_strncmp(id, ctx->routing.local_node.data, len) == 0);
    node->live = node->local;

    return node;
}


/*
 * Round 2, when another node may beat this one: the address and load of
 * every node that holds at least as much as this one (the biggest ones
 * first). NGX_AGAIN: asked; NGX_DONE: no need; NGX_ERROR.
 */

static ngx_int_t
ngx_http_hypic_redis_ask_peers(ngx_http_request_t *r,
    ngx_http_hypic_ctx_t *ctx, ngx_http_hypic_lookup_t *lk)
{
    u_char                  *key;
    size_t                   len;
    uint64_t                 local;
    ngx_uint_t               i, k;
    ngx_http_hypic_node_t   *node, *t;
    ngx_http_hypic_redis_t  *rd;

    rd = &ngx_http_hypic_redis;

    node = ctx->routing.nodes.elts;
    local = 0;

    for (i = 0; i < ctx->routing.nodes.nelts; i++) {
        if (node[i].local) {
            local = node[i].bytes;
        }
    }

    lk->n_peers = 0;

    for (i = 0; i < ctx->routing.nodes.nelts; i++) {
        if (node[i].local || node[i].bytes == 0 || node[i].bytes < local) {
            continue;
        }

        /* kept sorted by bytes, largest first; the smallest falls off */

        if (lk->n_peers == NGX_HTTP_HYPIC_MAX_PEERS) {
            if (lk->peers[lk->n_peers - 1]->bytes >= node[i].bytes) {
                continue;
            }

            lk->n_peers--;
        }

        lk->peers[lk->n_peers++] = &node[i];

        for (k = lk->n_peers - 1;
             k > 0 && lk->peers[k - 1]->bytes < lk->peers[k]->bytes;
             k--)
        {
            t = lk->peers[k - 1];
            lk->peers[k - 1] = lk->peers[k];
            lk->peers[k] = t;
        }
    }

    if (lk->n_peers == 0) {
        return NGX_DONE;
    }

    if (rd->ac == NULL) {
        return NGX_ERROR;
    }

    lk->round = 2;
    lk->received = 0;

    for (i = 0; i < lk->n_peers; i++) {
        len = ctx->routing.model_key.len + sizeof("node:") - 1
              + lk->peers[i]->id.len;

        key = ngx_pnalloc(r->pool, len);
        if (key == NULL) {
            break;
        }

        ngx_sprintf(key, "%Vnode:%V", &ctx->routing.model_key,
                    &lk->peers[i]->id);

        if (redisAsyncCommand(rd->ac, ngx_http_hypic_redis_reply, lk,
                              "HMGET %b addr load", key, len)
            != REDIS_OK)
        {
            break;
        }

        lk->pending++;
    }

    if (lk->pending != lk->n_peers) {

        /* what went out comes back on a dying connection, or not at all */

        lk->failed = 1;

        return lk->pending ? NGX_AGAIN : NGX_ERROR;
    }

    return NGX_AGAIN;
}


/* HMGET addr load of a node: a node whose hash expired is dead */

static void
ngx_http_hypic_redis_peer(ngx_http_request_t *r, ngx_http_hypic_node_t *node,
    redisReply *reply)
{
    redisReply              *addr;
    ngx_http_hypic_redis_t  *rd;

    rd = &ngx_http_hypic_redis;

    if (reply->type != REDIS_REPLY_ARRAY || reply->elements < 2) {
        return;
    }

    addr = reply->element[0];

    if (addr->type != REDIS_REPLY_STRING) {
        return;
    }

    node->addr.len = addr->len;
    node->addr.data = ngx_pnalloc(r->pool, addr->len);
    if (node->addr.data == NULL) {
        return;
    }

    ngx_memcpy(node->addr.data, addr->str, addr->len);

    node->load = ngx_http_hypic_redis_load(reply->element[1]);

    if (ngx_http_hypic_redis_valid_addr(&node->addr)) {
        node->live = 1;
        return;
    }

    if (!rd->warned_addr) {
        rd->warned_addr = 1;

        ngx_log_error(NGX_LOG_WARN, r->connection->log, 0,
                      "hypic: node \"%V\" publishes the address \"%V\", "
                      "which is not the HOST:PORT of its nginx: it is not "
                      "routed to", &node->id, &node->addr);
    }
}


static double
ngx_http_hypic_redis_load(redisReply *reply)
{
    double  load;

    if (reply == NULL || reply->type != REDIS_REPLY_STRING) {
        return 0;
    }

    /* hiredis ends every string with a NUL */

    load = strtod(reply->str, NULL);

    return (load >= 0) ? load : 0;
}


/* HOST:PORT, what proxy_pass takes; not a socket path */

static ngx_uint_t
ngx_http_hypic_redis_valid_addr(ngx_str_t *addr)
{
    u_char  *p, *colon;

    if (addr->len < 3 || addr->data[0] == '/'
        || (addr->len > 5 && ngx_strncmp(addr->data, "unix:", 5) == 0))
    {
        return 0;
    }

    colon = NULL;

    for (p = addr->data; p < addr->data + addr->len; p++) {
        if (*p == ':') {
            colon = p;
        }

        if (*p <= ' ' || *p == '/' || *p == '?' || *p == '#'
            || *p == '@' || *p == 0x7f)
        {
            return 0;
        }
    }

    if (colon == NULL || colon == addr->data) {
        return 0;
    }

    p = colon + 1;

    if (p == addr->data + addr->len || addr->data + addr->len - p > 5) {
        return 0;
    }

    for ( /* void */ ; p < addr->data + addr->len; p++) {
        if (*p < '0' || *p > '9') {
            return 0;
        }
    }

    return 1;
}


/*
 * The node with the most segment bytes; a tie goes to the lesser load,
 * and then to this node. NULL: this node.
 */

static ngx_http_hypic_node_t *
ngx_http_hypic_redis_choose(ngx_http_hypic_ctx_t *ctx)
{
    double                  best_load;
    uint64_t                best_bytes;
    ngx_uint_t              i;
    ngx_http_hypic_node_t  *node, *best;

    node = ctx->routing.nodes.elts;

    best = NULL;
    best_bytes = 0;
    best_load = 0;

    for (i = 0; i < ctx->routing.nodes.nelts; i++) {
        if (node[i].local) {
            best_bytes = node[i].bytes;
            best_load = node[i].load;
        }
    }

    for (i = 0; i < ctx->routing.nodes.nelts; i++) {
        if (node[i].local || !node[i].live || node[i].bytes == 0) {
            continue;
        }

        if (node[i].bytes > best_bytes
            || (node[i].bytes == best_bytes && node[i].load < best_load))
        {
            best = &node[i];
            best_bytes = node[i].bytes;
            best_load = node[i].load;
        }
    }

    return best;
}


static void
ngx_http_hypic_redis_finish(ngx_http_request_t *r, ngx_http_hypic_ctx_t *ctx,
    ngx_uint_t route)
{
    ngx_connection_t  *c;

    ngx_http_hypic_redis_abandon(ctx);

    ctx->routing.route = route;

    if (ngx_http_hypic_redis.exiting) {
        return;
    }

    ngx_log_debug2(NGX_LOG_DEBUG_HTTP, r->connection->log, 0,
                   "hypic: %V routed %V", &ctx->out.id,
                   ngx_http_hypic_route_name(route));

    c = r->connection;

    ngx_http_hypic_routed(r);

    ngx_http_run_posted_requests(c);
}


void
ngx_http_hypic_redis_abandon(ngx_http_hypic_ctx_t *ctx)
{
    ngx_http_hypic_lookup_t  *lk;

    if (ctx->routing.redis_timer.timer_set) {
        ngx_del_timer(&ctx->routing.redis_timer);
    }

    lk = ctx->routing.lookup;

    if (lk == NULL) {
        return;
    }

    ctx->routing.lookup = NULL;
    lk->request = NULL;

    if (lk->pending == 0) {
        ngx_free(lk);
    }
}


/*
 * Redis did not answer in time: this request goes local, and the
 * connection is dropped (the other lookups on it go local at once) and
 * built again after the back-off.
 */

static void
ngx_http_hypic_redis_timeout(ngx_event_t *ev)
{
    ngx_http_request_t    *r;
    ngx_http_hypic_ctx_t  *ctx;

    r = ev->data;

    ctx = ngx_http_get_module_ctx(r, ngx_http_hypic_module);

    ngx_http_hypic_redis_abandon(ctx);

    ngx_http_hypic_redis_failed("did not answer within hypic_redis_timeout",
                                NULL, 0);

    ngx_http_hypic_redis_reset();
    ngx_http_hypic_redis_schedule();

    ngx_http_hypic_redis_finish(r, ctx, NGX_HTTP_HYPIC_ROUTE_FALLBACK);
}
