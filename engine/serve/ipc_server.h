/*
 * ipc_server.h - the engine's end of the request interface (hp_ipc.h):
 * owns the shared segment and the unix socket, hands every connecting
 * nginx worker the segment, turns submitted slots into scheduler requests
 * and scheduler output into ring records, and reclaims the slots of
 * workers that went away.
 *
 * Threads: hp_ipc_server_run is the engine's main loop (poll(2) on the
 * socket, the connections and an eventfd); the scheduler's callbacks run
 * in the scheduler thread and only touch the slots' rings and atomics.
 */
#ifndef HP_IPC_SERVER_H
#define HP_IPC_SERVER_H

#include <signal.h>
#include <stdint.h>

#include "engine/contract/hp_error.h"
#include "engine/contract/hp_log.h"
#include "engine/model/llm.h"
#include "engine/serve/sched.h"
#include "engine/tokenizer/chat.h"

typedef struct {
    const char *socket_path; /* unix socket nginx connects to */
    const char *shm_name;    /* "/name" of the POSIX shared segment */
    const char *node;        /* this node's id (header, X-Hypic-Node) */
    const char *model;       /* model id (header) */
    const char *device;      /* backend, e.g. "cuda:0" (header; NULL: "") */
    const char *device_name; /* the device's own name (header; NULL: "") */
    uint32_t slots;          /* requests in flight at most */
    uint32_t input_bytes;    /* largest prompt, bytes */
    uint32_t ring_bytes;     /* output ring per slot (power of two) */
    hp_log_fn log;
    void *log_ud;
    /* [16] the model fingerprint for the header, so that nginx names
     * segments as the engine does (NULL: not published) */
    const uint8_t *fingerprint;
    /* the signal mask the loop waits with (ppoll); NULL: the thread's.
     * serve blocks its signals everywhere but here, so that a signal
     * never lands between the loop's look at its flags and the wait */
    const sigset_t *wait_mask;
    /* the model's chat template: chat requests (HP_IPC_FLAG_CHAT) are
     * rendered with it when taken; NULL refuses them */
    hp_chat_t *chat;
} hp_ipc_server_cfg_t;

typedef struct hp_ipc_server hp_ipc_server_t;

/*
 * Creates the segment (a fresh one; the generation counter, kept in a
 * small "<shm_name>.gen" segment, goes up by one) and listens on the
 * socket. Errors: HP_EBADINPUT (bad sizes or names), HP_EIO (shm, socket;
 * another engine already serving on the socket), HP_ENOMEM.
 */
int hp_ipc_server_open(hp_ipc_server_t **out, const hp_ipc_server_cfg_t *cfg,
                       hp_error_t *err);

/* The scheduler's flush hook (hp_sched_cfg_t.flush, ud = the server):
 * running and queued into the header, then wake-ups. */
void hp_ipc_server_flush(void *ud, const hp_sched_stats_t *st);

/* One cache pool's gauges (pool: HP_IPC_POOL_*) into the header, for
 * nginx's /metrics. Any thread. */
void hp_ipc_server_pool(hp_ipc_server_t *s, int pool, uint64_t bytes_used,
                        uint64_t budget, uint64_t entries, uint64_t evictions);

/*
 * Serves until *wake becomes non-zero (a signal handler sets it; the wait
 * is interrupted) or, once draining, until no request is left or the
 * drain deadline has passed; the caller looks at which and may call it
 * again. sched's flush hook must call hp_ipc_server_flush. Every turn of
 * the loop, at least every HP_IPC_HEARTBEAT_MS, writes the header's
 * heartbeat.
 * Returns HP_OK, or HP_EIO/HP_ENOMEM if the loop itself failed.
 */
int hp_ipc_server_run(hp_ipc_server_t *s, hp_sched_t *sched,
                      volatile sig_atomic_t *wake, hp_error_t *err);

/*
 * Stops admitting (SIGTERM): the header says HP_IPC_HEALTH_DRAINING, and
 * every request submitted from now on, or queued in the scheduler and
 * not yet started, is refused with engine_unavailable at once (nginx
 * answers 503); those already running run on. hp_ipc_server_run
 * returns once none is left or at deadline_ms (CLOCK_MONOTONIC ms, as
 * hp_ipc_server_now_ms; may be moved by calling this again).
 */
void hp_ipc_server_drain(hp_ipc_server_t *s, int64_t deadline_ms);

/* Requests not yet done with: submitted, running, or finished but not
 * yet collected by their nginx worker. */
int hp_ipc_server_busy(const hp_ipc_server_t *s);

/*
 * Ends every request the scheduler runs with an error record (code
 * engine_unavailable, message msg) instead of its remaining tokens: the
 * scheduler cancels them at its next step. For the drain timeout and an
 * immediate stop.
 */
void hp_ipc_server_abort(hp_ipc_server_t *s, const char *msg);

/* The seam width for requests that leave it to the engine (seam > 256
 * in the slot); < 0: the scheduler's. Call from the loop's thread. */
void hp_ipc_server_set_seam(hp_ipc_server_t *s, int seam);

/* The clock of drain deadlines. */
int64_t hp_ipc_server_now_ms(void);

/* The generation this engine runs as. */
uint64_t hp_ipc_server_generation(const hp_ipc_server_t *s);

/* Closes connections and socket, unlinks the socket and the segment.
 * Destroy the scheduler first: its callbacks use the segment. */
void hp_ipc_server_close(hp_ipc_server_t *s);

#endif
