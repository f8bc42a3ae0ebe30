/*
 * index.h - the engine's side of the global segment index in Redis
 * (DESIGN §7): registers the segments this node holds, removes evicted
 * ones, and keeps a node heartbeat with its address and load.
 *
 *   hypic:{model}:seg:{id}    set of node ids holding segment id (expiry
 *                             refreshed on every registration or use)
 *   hypic:{model}:node:{node} hash {addr, load, ts}, expiring heartbeat
 *
 * Calls never block the caller: they enqueue for a background thread that
 * owns the Redis connection. Redis slow or down: the thread logs, backs off
 * and retries; on reconnect it registers every segment still held (the
 * index is a hint: a stale or missing entry costs a recompute, never a
 * wrong answer).
 */
#ifndef HP_INDEX_H
#define HP_INDEX_H

#include <stdint.h>

#include "engine/contract/hp_error.h"
#include "engine/contract/hp_log.h"

typedef struct hp_index hp_index_t;

typedef struct {
    const char *redis;     /* "host:port" */
    const char *model;     /* model id in key names */
    const char *node;      /* this node's id */
    const char *node_addr; /* where peers reach this node */
    int ttl_s;             /* segment and heartbeat expiry, e.g. 60 */
    int timeout_ms;        /* connect / command timeout, e.g. 200 */
    hp_log_fn log;         /* may be NULL */
    void *log_ud;
} hp_index_config_t;

typedef struct {
    int connected;
    uint64_t registered; /* SADDs acknowledged */
    uint64_t removed;
    uint64_t errors;     /* failed connects or commands */
    uint64_t reconnects; /* successful connects after a failure */
    uint64_t dropped;    /* queue overflow (recovered by re-registration) */
    int held;            /* segments this node holds */
} hp_index_stats_t;

/* Starts the thread. Fails only on bad arguments (HP_EBADINPUT, e.g. an
 * address without a port) or no memory; an unreachable Redis is not an
 * error. */
hp_index_t *hp_index_start(const hp_index_config_t *cfg, hp_error_t *err);
/* Stops the thread (pending operations are dropped) and frees. */
void hp_index_stop(hp_index_t *ix);

/* This node now holds / no longer holds segment id. Non-blocking. */
void hp_index_add(hp_index_t *ix, const uint8_t id[16]);
void hp_index_remove(hp_index_t *ix, const uint8_t id[16]);
/* Load figure published with the heartbeat (e.g. queued + running). */
void hp_index_set_load(hp_index_t *ix, double load);

void hp_index_stats(hp_index_t *ix, hp_index_stats_t *out);

/*
 * Takes this node out of the index for good (a drained engine about to
 * exit): pending operations go out, then every segment it holds is
 * removed and its heartbeat key deleted; adds, removes and heartbeats
 * after this call are ignored. Waits up to timeout_ms for Redis to
 * confirm: 0 if it did, -1 if not (Redis down or slow: the entries expire
 * after ttl_s by themselves).
 */
int hp_index_leave(hp_index_t *ix, int timeout_ms);

#endif
