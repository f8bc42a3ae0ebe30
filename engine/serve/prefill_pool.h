/*
 * prefill_pool.h - segment parallelism on one node (HYPIC §4.4, DESIGN
 * §7): N prefill workers (threads, each with its own activation buffers
 * and its own OpenMP thread count) that prefill the cold segments of
 * requests, each segment on its own, and publish every result into the
 * shared public pool the moment it is done (pipelined: no batch at the
 * end). A request's cold segments go out longest first, each to the
 * worker with the least queued tokens (LPT, lpt.h), counting work other
 * requests already queued there. The caller is the combine node: it waits
 * for the job, then runs hp_assemble, which finds every segment a hit.
 *
 * Each segment is built by the same call as the sequential warm pass
 * (hp_segc_build_pic / _state), and the CPU kernels give the same bits for
 * any thread count (hk_matmul.c), so entries are bit-identical to the
 * sequential path's.
 *
 * Peers (peer.h) can serve as remote workers; whatever they fail to do is
 * done here. Not here: the choice of combine node, the global index.
 */
#ifndef HP_PREFILL_POOL_H
#define HP_PREFILL_POOL_H

#include <stdint.h>

#include "engine/cache/assemble.h"
#include "engine/cache/pool.h"
#include "engine/cache/prompt.h"
#include "engine/contract/hp_error.h"
#include "engine/contract/hp_log.h"
#include "engine/model/llm.h"

#define HP_PREFILL_MAX_WORKERS 64

typedef struct hp_prefill_pool hp_prefill_pool_t;
typedef struct hp_prefill_job hp_prefill_job_t;

typedef struct {
    int workers;            /* local prefill threads (>= 1) */
    int threads_per_worker; /* OpenMP threads of each (0: 1) */
    /* Remote prefill workers: peers ("host:port", peer.h) that get
     * segments by LPT like local workers, each driven by a thread of its
     * own that waits on the network. A peer that fails (refused, reset,
     * timed out, ERROR) is skipped for peer_retry_ms, and the segment is
     * prefilled locally by that thread instead: a dead peer costs time,
     * never the request. workers + n_peers <= HP_PREFILL_MAX_WORKERS. */
    const char *const *peers;
    int n_peers;
    int peer_timeout_ms; /* one remote call, connect to reply (0: 30000) */
    int peer_retry_ms;   /* a failed peer is left alone this long (0: 5000) */
    int peer_fetch;      /* before computing a segment, ask every live peer
                            for it (GET_SEGMENT): it may hold it already */
    hp_log_fn log;       /* peer failures (may be NULL) */
    void *log_ud;
} hp_prefill_pool_cfg_t;

/* One segment finished (or was given up). */
typedef struct {
    int seg;      /* index in the prompt's segs */
    int worker;   /* who built it */
    int status;   /* HP_OK, the build's error, or HP_ECANCELLED when an
                     earlier segment of the job failed */
    int tokens;   /* the segment's tokens */
    int reused;   /* another request published it first: not built */
    int remote;   /* built by a peer (PREFILL) and pulled here */
    int fetched;  /* pulled from a peer that held it (peer_fetch) */
    int fallback; /* its peer failed: prefilled locally instead */
    int64_t start_us, end_us; /* the build, CLOCK_MONOTONIC */
    int64_t cpu_us;           /* CPU time the worker's own thread got
                                 for it (its OpenMP team not counted);
                                 below end - start when the cores were
                                 busy with other work */
    hp_pool_entry_t *entry;   /* HP_OK: the published entry (the job holds
                                 a reference until hp_prefill_job_free) */
} hp_prefill_done_t;

/* Called from the worker thread right after the segment is published (or
 * has failed), before the worker takes its next segment. Must not call
 * back into the prefill pool; may read the public pool. */
typedef void (*hp_prefill_cb_fn)(void *ud, const hp_prefill_done_t *d);

typedef struct {
    int cold;         /* cacheable segments missing from the pool at submit */
    int hits;         /* cacheable segments found there */
    int dups;         /* repeats of a cold segment in the same prompt */
    int published;    /* built and published by this job */
    int reused;       /* published by someone else meanwhile */
    int remote;       /* of published: built by peers */
    int fetched;      /* of published: pulled from peers that held them */
    int fallbacks;    /* of published: a peer failed, prefilled locally */
    int failed;       /* build errors */
    int cancelled;    /* given up after a failure or a cancel */
    long tokens;      /* tokens of the cold segments */
    long miss_tokens; /* tokens the published segments cover in the
                         cache (pic: len - 2w, else len), as
                         hp_assemble_stats_t counts them */
    long fetched_tokens; /* of miss_tokens: those of fetched segments */
    double planned;      /* LPT makespan in tokens, queued work included */
    int per_worker[HP_PREFILL_MAX_WORKERS]; /* segments each got */
    int64_t wall_us; /* submit to the last segment done */
} hp_prefill_stats_t;

/* Starts the workers (peers are not contacted until there is work).
 * HP_EBADINPUT (worker count out of range),
 * HP_ENOMEM, or HP_EINTERNAL (a thread would not start). */
int hp_prefill_pool_create(hp_prefill_pool_t **out,
                           const hp_prefill_pool_cfg_t *cfg, hp_error_t *err);

/*
 * Plans every worker's workspace for llm's model now (else it is planned
 * at the worker's first job) and gives worker i the build sequence
 * seqs[i] (hp_fwd_ws_t.build_seq; seqs NULL: none), so that a server
 * that takes them from its sequence pool at start allocates nothing per
 * segment. The caller keeps the sequences; plan(pp, NULL, NULL) frees
 * the workspaces and lets them go. Only while no job is in flight.
 * HP_ENOMEM.
 */
int hp_prefill_pool_plan(hp_prefill_pool_t *pp, const hp_llm_t *llm,
                         hp_seq_t *seqs, hp_error_t *err);

/* Stops the workers and frees the pool. Every job must have been freed
 * (hp_prefill_job_free) before: jobs point into the pool. */
void hp_prefill_pool_destroy(hp_prefill_pool_t *pp);

/* Workers in all: local ones first (0..workers-1), then one per peer
 * (which prefills here when its peer fails). On a device backend each
 * build holds the device (hp_backend_lock). */
int hp_prefill_pool_workers(const hp_prefill_pool_t *pp);

/* What worker i saw from inside its thread: omp_get_max_threads() after
 * setting its own count, and the size of a parallel team it formed (the
 * count is a per-thread ICV; this is how the tests check it). */
void hp_prefill_pool_worker_omp(hp_prefill_pool_t *pp, int i, int *max,
                                int *team);

/* Queued plus running tokens of each worker (loads[workers]). */
void hp_prefill_pool_loads(hp_prefill_pool_t *pp, double *loads);

/*
 * Dispatches the cacheable segments of p that are missing from
 * cache->pub for `mode` (naive or pic; other modes dispatch nothing) at
 * seam w. Returns at once with *job; cb (may be NULL) is called once per
 * dispatched segment. llm, cache and p must stay valid until
 * hp_prefill_job_free. HP_OK, HP_EBADINPUT (seam < 0), HP_ENOMEM.
 */
int hp_prefill_submit(hp_prefill_pool_t *pp, const hp_llm_t *llm,
                      hp_cache_t *cache, const hp_prompt_t *p,
                      hp_ipc_mode_t mode, int w, hp_prefill_cb_fn cb, void *ud,
                      hp_prefill_job_t **job, hp_error_t *err);

/* 1 when every dispatched segment is done (published or failed). */
int hp_prefill_job_done(hp_prefill_job_t *job);

/* Waits for the job; HP_OK when every segment is published, else the
 * first error (err says which segment and why). Fills st if not NULL. */
int hp_prefill_job_wait(hp_prefill_job_t *job, hp_prefill_stats_t *st,
                        hp_error_t *err);

/* Gives up the job's segments not yet started, waits for those running,
 * drops the references the job holds on its published entries, frees. */
void hp_prefill_job_free(hp_prefill_job_t *job);

/*
 * The warm pass in parallel: submit, wait, free. Afterwards every cold
 * segment of p is in the public pool (HP_OK), as after hp_assemble_warm;
 * a failed segment fails only this call (the pool and other jobs go on).
 */
int hp_prefill_pool_run(hp_prefill_pool_t *pp, const hp_llm_t *llm,
                        hp_cache_t *cache, const hp_prompt_t *p,
                        hp_ipc_mode_t mode, int w, hp_prefill_cb_fn cb,
                        void *ud, hp_prefill_stats_t *st, hp_error_t *err);

#endif
