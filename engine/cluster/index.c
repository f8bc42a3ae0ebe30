/*
 * index.c - Redis registration thread (see index.h).
 *
 * Operations go through a bounded ring; the set of held segments is kept
 * here too, so a reconnect (or a ring overflow) is repaired by registering
 * the whole set again instead of replaying a log.
 */
#include "engine/cluster/index.h"

#include <hiredis.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine/contract/hp_seg.h"

#define RING           4096 /* pending operations */
#define BACKOFF_MIN_MS 100  /* first retry after a failure */
#define BACKOFF_MAX_MS 2000

typedef struct {
    uint8_t id[16];
    int add; /* 1 add, 0 remove */
} op_t;

typedef struct {
    uint8_t (*ids)[16];
    unsigned char *used; /* 0 empty, 1 used, 2 deleted */
    size_t cap, n;
} idset_t;

struct hp_index {
    hp_index_config_t cfg;
    char host[256];
    int port;
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int stop;
    op_t ring[RING];
    unsigned head, tail; /* head: next to read */
    int resync;          /* register the whole set on next connect */
    int leave;           /* 1: hp_index_leave asked, 2: done */
    pthread_cond_t left; /* leave became 2 */
    idset_t held;
    double load;
    hp_index_stats_t st;
};

static void logf_(hp_index_t *ix, int level, const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    if (!ix->cfg.log)
        return;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    ix->cfg.log(ix->cfg.log_ud, level, msg);
}

/* ---- the held set: open addressing on the id's first 8 bytes ---------- */

static size_t slot(const idset_t *s, const uint8_t id[16])
{
    uint64_t h;
    memcpy(&h, id, 8);
    return (size_t)(h % s->cap);
}

static int set_grow(idset_t *s)
{
    idset_t n = {calloc(s->cap * 2, 16), calloc(s->cap * 2, 1), s->cap * 2, 0};
    if (!n.ids || !n.used) {
        free(n.ids);
        free(n.used);
        return -1;
    }
    for (size_t i = 0; i < s->cap; i++)
        if (s->used[i] == 1) {
            size_t j = slot(&n, s->ids[i]);
            while (n.used[j])
                j = (j + 1) % n.cap;
            memcpy(n.ids[j], s->ids[i], 16);
            n.used[j] = 1;
            n.n++;
        }
    free(s->ids);
    free(s->used);
    *s = n;
    return 0;
}

static void set_put(idset_t *s, const uint8_t id[16], int add)
{
    if (add && (s->n + 1) * 2 > s->cap && set_grow(s) != 0)
        return;
    size_t j = slot(s, id), free_at = (size_t)-1;
    for (size_t k = 0; k < s->cap && s->used[j]; k++) {
        if (s->used[j] == 1 && !memcmp(s->ids[j], id, 16)) {
            if (!add) {
                s->used[j] = 2;
                s->n--;
            }
            return;
        }
        if (s->used[j] == 2 && free_at == (size_t)-1)
            free_at = j;
        j = (j + 1) % s->cap;
    }
    if (!add)
        return;
    if (free_at != (size_t)-1)
        j = free_at;
    memcpy(s->ids[j], id, 16);
    s->used[j] = 1;
    s->n++;
}

/* ---- Redis side (thread only) ----------------------------------------- */

static int reply_ok(redisContext *c, redisReply *r)
{
    int ok = r && r->type != REDIS_REPLY_ERROR;
    if (r)
        freeReplyObject(r);
    return ok && c->err == 0;
}

/* The replies of n pipelined commands: 1 if every one came back fine. */
static int get_replies(redisContext *c, int n)
{
    int ok = 1;
    for (int i = 0; i < n; i++) {
        redisReply *r = NULL;
        if (redisGetReply(c, (void **)&r) != REDIS_OK)
            return 0;
        ok &= reply_ok(c, r);
    }
    return ok;
}

static void node_key(const hp_index_t *ix, char *key, size_t cap)
{
    snprintf(key, cap, "hypic:%s:node:%s", ix->cfg.model, ix->cfg.node);
}

static int send_seg(hp_index_t *ix, redisContext *c, const uint8_t id[16],
                    int add)
{
    char hex[HP_SEG_ID_HEX_LEN + 1], key[512];
    hp_seg_id_hex(hex, id);
    snprintf(key, sizeof(key), "hypic:%s:seg:%s", ix->cfg.model, hex);
    if (add) {
        redisAppendCommand(c, "SADD %s %s", key, ix->cfg.node);
        redisAppendCommand(c, "EXPIRE %s %d", key, ix->cfg.ttl_s);
        return 2;
    }
    redisAppendCommand(c, "SREM %s %s", key, ix->cfg.node);
    return 1;
}

static int heartbeat(hp_index_t *ix, redisContext *c, double load)
{
    char key[512], lo[32], ts[32];
    node_key(ix, key, sizeof(key));
    snprintf(lo, sizeof(lo), "%.3f", load);
    snprintf(ts, sizeof(ts), "%lld", (long long)time(NULL));
    redisAppendCommand(c, "HSET %s addr %s load %s ts %s", key,
                       ix->cfg.node_addr ? ix->cfg.node_addr : "", lo, ts);
    redisAppendCommand(c, "EXPIRE %s %d", key, ix->cfg.ttl_s);
    return get_replies(c, 2);
}

/* Sends a batch (all pending ops, or the whole held set on resync),
 * pipelined; 1 if every reply came back fine. */
static int flush(hp_index_t *ix, redisContext *c)
{
    op_t batch[256];
    int n = 0, replies = 0, adds = 0, rems = 0;
    pthread_mutex_lock(&ix->mu);
    if (ix->resync) {
        ix->resync = 0;
        ix->head = ix->tail; /* the set supersedes the log */
        for (size_t i = 0; i < ix->held.cap; i++)
            if (ix->held.used[i] == 1) {
                pthread_mutex_unlock(&ix->mu);
                replies += send_seg(ix, c, ix->held.ids[i], 1);
                adds++;
                pthread_mutex_lock(&ix->mu);
            }
    }
    while (ix->head != ix->tail && n < 256)
        batch[n++] = ix->ring[ix->head++ % RING];
    pthread_mutex_unlock(&ix->mu);
    for (int i = 0; i < n; i++) {
        replies += send_seg(ix, c, batch[i].id, batch[i].add);
        adds += batch[i].add;
        rems += !batch[i].add;
    }
    int ok = get_replies(c, replies);
    pthread_mutex_lock(&ix->mu);
    if (ok) {
        ix->st.registered += adds;
        ix->st.removed += rems;
    } else {
        ix->resync = 1; /* what was in flight is re-sent as the set */
    }
    pthread_mutex_unlock(&ix->mu);
    return ok;
}

/* A pthread_cond_timedwait deadline ms from now. */
static void in_ms(struct timespec *t, long ms)
{
    clock_gettime(CLOCK_REALTIME, t);
    t->tv_sec += ms / 1000;
    t->tv_nsec += (ms % 1000) * 1000000L;
    if (t->tv_nsec >= 1000000000L) {
        t->tv_sec++;
        t->tv_nsec -= 1000000000L;
    }
}

/* hp_index_leave: SREM every held segment, DEL the heartbeat. */
static int leave(hp_index_t *ix, redisContext *c)
{
    char key[512];
    int replies = 1;
    pthread_mutex_lock(&ix->mu);
    for (size_t i = 0; i < ix->held.cap; i++)
        if (ix->held.used[i] == 1)
            replies += send_seg(ix, c, ix->held.ids[i], 0);
    int n = (int)ix->held.n;
    pthread_mutex_unlock(&ix->mu);
    node_key(ix, key, sizeof(key));
    redisAppendCommand(c, "DEL %s", key);
    int ok = get_replies(c, replies);
    if (ok)
        logf_(ix, HP_LOG_INFO,
              "index: node %s left the index (%d segment(s) removed)",
              ix->cfg.node, n);
    return ok;
}

static void *run(void *arg)
{
    hp_index_t *ix = arg;
    redisContext *c = NULL;
    int backoff = BACKOFF_MIN_MS, failed = 0;
    struct timespec next_hb = {0};
    struct timeval tv = {ix->cfg.timeout_ms / 1000,
                         (ix->cfg.timeout_ms % 1000) * 1000};
    for (;;) {
        pthread_mutex_lock(&ix->mu);
        if (ix->stop) {
            pthread_mutex_unlock(&ix->mu);
            break;
        }
        pthread_mutex_unlock(&ix->mu);
        if (!c) {
            c = redisConnectWithTimeout(ix->host, ix->port, tv);
            if (!c || c->err) {
                if (!failed)
                    logf_(ix, HP_LOG_WARN, "index: redis %s unreachable (%s)",
                          ix->cfg.redis, c ? c->errstr : "no memory");
                if (c)
                    redisFree(c);
                c = NULL;
                pthread_mutex_lock(&ix->mu);
                ix->st.errors++;
                ix->st.connected = 0;
                pthread_mutex_unlock(&ix->mu);
                failed = 1;
            } else {
                redisSetTimeout(c, tv);
                pthread_mutex_lock(&ix->mu);
                ix->resync = 1;
                ix->st.connected = 1;
                ix->st.reconnects += failed;
                pthread_mutex_unlock(&ix->mu);
                if (failed)
                    logf_(ix, HP_LOG_INFO,
                          "index: redis %s back, re-registering",
                          ix->cfg.redis);
                failed = 0;
                backoff = BACKOFF_MIN_MS;
                next_hb.tv_sec = 0;
            }
        }
        if (c) {
            struct timespec t;
            clock_gettime(CLOCK_MONOTONIC, &t);
            int ok = flush(ix, c);
            pthread_mutex_lock(&ix->mu);
            int leaving = ix->leave == 1;
            pthread_mutex_unlock(&ix->mu);
            if (ok && leaving && (ok = leave(ix, c))) {
                pthread_mutex_lock(&ix->mu);
                ix->leave = 2;
                pthread_cond_broadcast(&ix->left);
                pthread_mutex_unlock(&ix->mu);
                break; /* nothing more to say to Redis */
            }
            if (ok && !leaving && t.tv_sec >= next_hb.tv_sec) {
                pthread_mutex_lock(&ix->mu);
                double load = ix->load;
                pthread_mutex_unlock(&ix->mu);
                ok = heartbeat(ix, c, load);
                next_hb.tv_sec =
                    t.tv_sec + (ix->cfg.ttl_s / 3 > 0 ? ix->cfg.ttl_s / 3 : 1);
            }
            if (!ok) {
                logf_(ix, HP_LOG_WARN, "index: redis error (%s), reconnecting",
                      c->errstr[0] ? c->errstr : "command failed");
                redisFree(c);
                c = NULL;
                pthread_mutex_lock(&ix->mu);
                ix->st.errors++;
                ix->st.connected = 0;
                pthread_mutex_unlock(&ix->mu);
                failed = 1;
            }
        }
        /* sleep until work arrives, the heartbeat is due, or the back-off
         * ends */
        struct timespec until;
        in_ms(&until, c ? 1000 : backoff);
        pthread_mutex_lock(&ix->mu);
        if (!c) { /* down: only the back-off (or stop) ends the wait, so
                   * a burst of registrations is no burst of connects */
            while (!ix->stop &&
                   pthread_cond_timedwait(&ix->cv, &ix->mu, &until) == 0)
                ;
        } else if (!ix->stop && ix->head == ix->tail && !ix->resync &&
                   ix->leave != 1) {
            pthread_cond_timedwait(&ix->cv, &ix->mu, &until);
        }
        pthread_mutex_unlock(&ix->mu);
        if (!c && backoff < BACKOFF_MAX_MS)
            backoff *= 2;
    }
    if (c)
        redisFree(c);
    return NULL;
}

/* ---- API ------------------------------------------------------------- */

hp_index_t *hp_index_start(const hp_index_config_t *cfg, hp_error_t *err)
{
    const char *colon = cfg->redis ? strrchr(cfg->redis, ':') : NULL;
    if (!colon || colon == cfg->redis || !cfg->model || !cfg->node ||
        atoi(colon + 1) <= 0 || atoi(colon + 1) > 65535 ||
        (size_t)(colon - cfg->redis) >= 256) {
        hp_error_set(err, HP_EBADINPUT,
                     "index: redis address must be host:port, not '%s'",
                     cfg->redis ? cfg->redis : "");
        return NULL;
    }
    hp_index_t *ix = calloc(1, sizeof(*ix));
    if (!ix) {
        hp_error_set(err, HP_ENOMEM, "index: out of memory");
        return NULL;
    }
    ix->cfg = *cfg;
    if (ix->cfg.ttl_s <= 0)
        ix->cfg.ttl_s = 60;
    if (ix->cfg.timeout_ms <= 0)
        ix->cfg.timeout_ms = 200;
    memcpy(ix->host, cfg->redis, (size_t)(colon - cfg->redis));
    ix->port = atoi(colon + 1);
    ix->held = (idset_t){calloc(1024, 16), calloc(1024, 1), 1024, 0};
    pthread_mutex_init(&ix->mu, NULL);
    pthread_cond_init(&ix->cv, NULL);
    pthread_cond_init(&ix->left, NULL);
    if (!ix->held.ids || !ix->held.used ||
        pthread_create(&ix->thread, NULL, run, ix) != 0) {
        free(ix->held.ids);
        free(ix->held.used);
        free(ix);
        hp_error_set(err, HP_ENOMEM, "index: cannot start its thread");
        return NULL;
    }
    return ix;
}

void hp_index_stop(hp_index_t *ix)
{
    if (!ix)
        return;
    pthread_mutex_lock(&ix->mu);
    ix->stop = 1;
    pthread_cond_signal(&ix->cv);
    pthread_mutex_unlock(&ix->mu);
    pthread_join(ix->thread, NULL);
    pthread_mutex_destroy(&ix->mu);
    pthread_cond_destroy(&ix->cv);
    pthread_cond_destroy(&ix->left);
    free(ix->held.ids);
    free(ix->held.used);
    free(ix);
}

static void push(hp_index_t *ix, const uint8_t id[16], int add)
{
    pthread_mutex_lock(&ix->mu);
    if (ix->leave) { /* gone from the index: nothing to tell it */
        pthread_mutex_unlock(&ix->mu);
        return;
    }
    set_put(&ix->held, id, add);
    if (ix->tail - ix->head == RING) { /* full: the set repairs it */
        ix->st.dropped++;
        ix->resync = 1;
    } else {
        op_t *o = &ix->ring[ix->tail++ % RING];
        memcpy(o->id, id, 16);
        o->add = add;
    }
    pthread_cond_signal(&ix->cv);
    pthread_mutex_unlock(&ix->mu);
}

void hp_index_add(hp_index_t *ix, const uint8_t id[16])
{
    if (ix)
        push(ix, id, 1);
}

void hp_index_remove(hp_index_t *ix, const uint8_t id[16])
{
    if (ix)
        push(ix, id, 0);
}

void hp_index_set_load(hp_index_t *ix, double load)
{
    if (!ix)
        return;
    pthread_mutex_lock(&ix->mu);
    ix->load = load;
    pthread_mutex_unlock(&ix->mu);
}

void hp_index_stats(hp_index_t *ix, hp_index_stats_t *out)
{
    pthread_mutex_lock(&ix->mu);
    *out = ix->st;
    out->held = (int)ix->held.n;
    pthread_mutex_unlock(&ix->mu);
}

int hp_index_leave(hp_index_t *ix, int timeout_ms)
{
    struct timespec until;
    int rc = 0;
    if (!ix)
        return 0;
    in_ms(&until, timeout_ms);
    pthread_mutex_lock(&ix->mu);
    if (!ix->leave)
        ix->leave = 1;
    pthread_cond_signal(&ix->cv);
    while (ix->leave != 2 && rc == 0)
        rc = pthread_cond_timedwait(&ix->left, &ix->mu, &until);
    int done = ix->leave == 2;
    pthread_mutex_unlock(&ix->mu);
    return done ? 0 : -1;
}
