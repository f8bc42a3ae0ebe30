/*
 * cmd_serve.c - `hypic-engine serve`: loads the model once, then serves
 * nginx workers through the shared-memory interface (engine/contract/hp_ipc.h):
 * the IPC loop runs in this thread, the scheduler in one of its own.
 * Settings: serve_config.h.
 *
 * Signals only set flags; this thread acts on them between waits (and is
 * the only one that takes them: the others block them).
 *   SIGTERM  drain: refuse new requests and the queued ones not yet
 *            started (nginx answers 503 at once), let the running ones
 *            finish, leave the Redis index, exit 0; after
 *            drain-timeout-ms the rest end with an error record
 *   SIGINT, or a second SIGTERM: stop at once (requests end in an error)
 *   SIGHUP   re-read --config; apply what can change while running
 * While the model loads they keep their default actions (nothing to
 * drain yet).
 */
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "engine/cache/segcache.h"
#include "engine/cli/cli.h"
#include "engine/cli/serve_config.h"
#include "engine/cluster/index.h"
#include "engine/cluster/peer.h"
#include "engine/contract/hp_ipc.h"
#include "engine/model/llm.h"
#include "engine/serve/ipc_server.h"
#include "engine/serve/prefill_pool.h"
#include "engine/serve/sched.h"
#include "engine/tokenizer/chat.h"

/* How long a stop waits for Redis to confirm the node left the index
 * (a drained stop, one at once), and for nginx to collect the error
 * records of requests ended by the drain timeout. */
#define LEAVE_MS         2000
#define LEAVE_AT_ONCE_MS 500
#define ABORT_GRACE_MS   2000

/* Set by the handler, taken by the loop (the only thread not blocking
 * these signals, and only while it waits). */
static volatile sig_atomic_t sig_wake, sig_term, sig_int, sig_hup;
/* Set by the scheduler's thread (the flush hook) when the device faulted;
 * it sets sig_wake too, and the flush's wake-up ends the loop's wait. */
static _Atomic int dev_lost;

static void on_signal(int sig)
{
    if (sig == SIGTERM)
        sig_term = 1;
    else if (sig == SIGINT)
        sig_int = 1;
    else
        sig_hup = 1;
    sig_wake = 1;
}

/* The logger every subsystem gets (ud): lines above the level are
 * dropped; SIGHUP may change the level while other threads log. */
typedef struct {
    atomic_int level;
} serve_log_t;

static void log_line(void *ud, int level, const char *msg)
{
    static const char *names[] = {"error", "warn", "info", "debug"};
    const serve_log_t *lg = ud;
    char ts[32];
    struct timespec now;
    struct tm tm;
    if (lg && level > atomic_load(&lg->level))
        return;
    clock_gettime(CLOCK_REALTIME, &now);
    gmtime_r(&now.tv_sec, &tm);
    strftime(ts, sizeof(ts), "%Y-%m-%dT%H:%M:%S", &tm);
    fprintf(stderr, "%s.%03ldZ [%s] %s\n", ts, now.tv_nsec / 1000000,
            names[level < 0 || level > 3 ? 0 : level], msg);
}

static void logf_(serve_log_t *lg, int level, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void logf_(serve_log_t *lg, int level, const char *fmt, ...)
{
    char msg[1400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    log_line(lg, level, msg);
}

/* The public pool tells the index what this node holds. */
static void pool_to_index(void *ud, const uint8_t key[16], uint32_t variant,
                          int present)
{
    (void)variant;
    if (present)
        hp_index_add(ud, key);
    else
        hp_index_remove(ud, key);
}

/* The pools' gauges into the shared header, for nginx's /metrics: the
 * caches' (st NULL: before the scheduler runs) and the sequences'. */
static void publish_pools(hp_ipc_server_t *srv, const hp_cache_t *cache,
                          const hp_sched_stats_t *st)
{
    hp_pool_stats_t ps;
    hp_prefix_cache_stats_t pc;
    hp_pool_stats(cache->pub, &ps);
    hp_ipc_server_pool(srv, HP_IPC_POOL_PUBLIC, ps.bytes_used, ps.budget,
                       (uint64_t)ps.entries, ps.evictions);
    hp_prefix_cache_stats(cache->prefix, &pc);
    hp_ipc_server_pool(srv, HP_IPC_POOL_PRIVATE, pc.bytes_used, pc.budget,
                       (uint64_t)pc.nodes,
                       pc.nodes_evicted + pc.states_evicted);
    if (st)
        hp_ipc_server_pool(srv, HP_IPC_POOL_SEQUENCE, st->seq_bytes,
                           st->seq_budget, (uint64_t)st->seqs, st->preemptions);
}

/* Where a device's memory went at start (everything a server allocates
 * is taken by then), so an operator sizes seq_budget and the pools from
 * one line: how many full-context requests fit, what is left free. */
static void log_memory(serve_log_t *lg, const hp_model_t *m,
                       const hp_sched_stats_t *st, const hp_serve_cfg_t *c)
{
    const hp_backend_t *be = m->be;
    size_t total = hp_backend_mem_total(be), mib = 1 << 20, w = 0;
    if (hp_backend_host_memory(be) || !total)
        return;
    for (size_t k = 0; k < sizeof(m->weight_bytes) / sizeof(*m->weight_bytes);
         k++)
        w += m->weight_bytes[k];
    size_t free_now = hp_backend_mem_free(be);
    logf_(lg, HP_LOG_INFO,
          "%s (%s): %zu of %zu MiB in use after start: weights %zu MiB, "
          "sequence pool %zu MiB (%d requests of max_context at once), "
          "public pool %ld MiB, private pool %ld MiB; %zu MiB free",
          hp_backend_name(be), hp_backend_device(be), (total - free_now) / mib,
          total / mib, w / mib, st->seq_pool / mib, st->seq_full,
          c->num[HP_SO_PUBLIC_POOL] >> 20, c->num[HP_SO_PRIVATE_POOL] >> 20,
          free_now / mib);
}

/* After every productive scheduler step: the pools' gauges, wake nginx,
 * and publish the node's load (requests held) with the next index
 * heartbeat, which the module's routing breaks ties by. */
typedef struct {
    hp_ipc_server_t *srv;
    hp_index_t *index;
    const hp_cache_t *cache;
    serve_log_t *log;
    uint64_t preempt_logged; /* the preemptions the last line counted */
    uint64_t short_logged;   /* the same for pool_short */
} step_hooks_t;

/* 1 when a count has reached 1, 2, 4, ... since the last line (*logged
 * its count then, set): a trouble that persists shows without a line per
 * request. */
static int doubled(uint64_t now, uint64_t *logged)
{
    if (now < 2 * *logged + !*logged)
        return 0;
    *logged = now;
    return 1;
}

static void after_step(void *ud, const hp_sched_stats_t *st)
{
    step_hooks_t *h = ud;
    if (st->lost && !atomic_exchange(&dev_lost, 1))
        sig_wake = 1;
    /* the sequence pool ran short */
    if (doubled(st->preemptions, &h->preempt_logged))
        logf_(h->log, HP_LOG_INFO,
              "sequence pool: %llu requests preempted (prefilled again "
              "once readmitted) and %llu sequences grown since start; "
              "seq_budget %zu MiB leaves requests %zu MiB",
              (unsigned long long)st->preemptions,
              (unsigned long long)st->seq_growths, st->seq_pool >> 20,
              st->seq_budget >> 20);
    if (doubled(st->pool_short, &h->short_logged))
        logf_(h->log, HP_LOG_WARN,
              "public pool: %llu naive/pic requests ran full since start: "
              "their segments need more than public_pool holds",
              (unsigned long long)st->pool_short);
    publish_pools(h->srv, h->cache, st);
    hp_ipc_server_flush(h->srv, st);
    hp_index_set_load(h->index, st->live);
}

/* What runs, and what SIGHUP needs to change it. */
typedef struct {
    int argc;
    char **argv;
    hp_serve_cfg_t cfg; /* the settings in force */
    serve_log_t log;
    hp_ipc_server_t *srv;
    hp_sched_t *sched;
    const hp_backend_t *be; /* where the model runs */
    int started_chunkwise;  /* the scheduler has a KVBuffer pool */
    int at_once;            /* stopped by SIGINT or a second SIGTERM */
} serve_t;

static int decode_form(const hp_serve_cfg_t *c)
{
    const char *d = c->str[HP_SO_DECODE];
    return !d || !strcmp(d, "auto")  ? HP_SCHED_DECODE_AUTO
           : !strcmp(d, "recurrent") ? HP_SCHED_DECODE_RECURRENT
                                     : HP_SCHED_DECODE_CHUNKWISE;
}

/* The reloadable settings of sv->cfg, into the running parts. */
static void apply(serve_t *sv)
{
    const hp_serve_cfg_t *c = &sv->cfg;
    hp_error_t err;
    hp_sched_tune_t t = {
        .max_queue = (int)c->num[HP_SO_MAX_QUEUE],
        .throttle_ms = (int)c->num[HP_SO_THROTTLE_MS],
        .decode = decode_form(c),
    };
    atomic_store(&sv->log.level, c->log_level);
    hp_ipc_server_set_seam(sv->srv, (int)c->num[HP_SO_SEAM]);
    if (hp_sched_tune(sv->sched, &t, &err) != HP_OK)
        logf_(&sv->log, HP_LOG_ERROR, "reload: %s", err.msg);
}

/* SIGHUP: the flags and the file again, as at start; the changes that
 * can apply do, the others are logged and wait for a restart. */
static void reload(serve_t *sv)
{
    hp_serve_cfg_t nc;
    char msg[600], was[300], now[300];
    const char *file = sv->cfg.str[HP_SO_CONFIG];
    int applied = 0, restart = 0;

    if (!file) {
        logf_(&sv->log, HP_LOG_WARN,
              "SIGHUP: no --config file to re-read, nothing changes");
        return;
    }
    logf_(&sv->log, HP_LOG_INFO, "SIGHUP: re-reading %s", file);
    if (hp_serve_cfg_load(&nc, sv->argc, sv->argv, msg, sizeof(msg)) != 0) {
        logf_(&sv->log, HP_LOG_ERROR,
              "reload failed, the running configuration stays: %s", msg);
        hp_serve_cfg_free(&nc);
        return;
    }
    for (int k = 0; k < HP_SO_N; k++) {
        if (nc.file_ignored[k])
            logf_(&sv->log, HP_LOG_INFO,
                  "reload: %s in %s is ignored: the flag --%s %s wins",
                  hp_serve_opt_name(k), file, hp_serve_opt_name(k), nc.str[k]);
        if (k == HP_SO_CONFIG || !hp_serve_cfg_differs(&sv->cfg, &nc, k))
            continue;
        const char *name = hp_serve_opt_name(k);
        hp_serve_cfg_text(&sv->cfg, k, was, sizeof(was));
        hp_serve_cfg_text(&nc, k, now, sizeof(now));
        if (!hp_serve_opt_reloadable(k) ||
            (k == HP_SO_DECODE && !sv->started_chunkwise &&
             decode_form(&nc) == HP_SCHED_DECODE_CHUNKWISE)) {
            logf_(&sv->log, HP_LOG_WARN,
                  "reload: %s %s -> %s needs a restart; it stays %s", name, was,
                  now, was);
            restart++;
            continue;
        }
        logf_(&sv->log, HP_LOG_INFO, "reload: %s %s -> %s", name, was, now);
        hp_serve_cfg_take(&sv->cfg, &nc, k);
        applied++;
    }
    if (applied)
        apply(sv);
    logf_(&sv->log, HP_LOG_INFO,
          "reload done: %d setting(s) applied, %d need a restart", applied,
          restart);
    hp_serve_cfg_free(&nc);
}

/* What the kernel tuners (HYPIC_CUDA_TUNE=1) chose so far, a line each
 * (none without them), at a SIGHUP and at the end: which kernels this
 * device runs at each size, and their times. */
static void log_tuned(serve_t *sv)
{
    hp_backend_lock(sv->be); /* the tuners are the ops' */
    char *rep = hp_backend_tuned(sv->be);
    hp_backend_unlock(sv->be);
    char *save = NULL;
    for (char *l = rep ? strtok_r(rep, "\n", &save) : NULL; l;
         l = strtok_r(NULL, "\n", &save))
        logf_(&sv->log, HP_LOG_INFO, "kernel tuner: %s", l);
    free(rep);
}

/* Serves until a stop; 0 for a clean one (drained, drain timeout, or
 * stopped at once), 1 if the loop failed or the device faulted. */
static int serve_loop(serve_t *sv)
{
    hp_error_t err = {0};
    int64_t deadline = 0;
    int draining = 0, aborted = 0, lost = 0;

    for (;;) {
        if (hp_ipc_server_run(sv->srv, sv->sched, &sig_wake, &err) != HP_OK) {
            log_line(&sv->log, HP_LOG_ERROR, err.msg);
            return 1;
        }
        /* the signals are blocked here: nothing changes under us */
        int term = sig_term, intr = sig_int, hup = sig_hup;
        sig_wake = sig_term = sig_int = sig_hup = 0;
        int64_t now = hp_ipc_server_now_ms();
        int busy = hp_ipc_server_busy(sv->srv);

        if (hup) {
            reload(sv);
            log_tuned(sv);
        }
        if (atomic_load(&dev_lost) && !lost) {
            /* the scheduler ended every request with the fault and
             * refuses new ones; the header says draining, so nginx stops
             * sending; exit once nginx has collected the answers */
            hp_backend_lost(sv->be, &err);
            logf_(&sv->log, HP_LOG_ERROR,
                  "%s; every request in flight ended with "
                  "engine_unavailable; exiting with status 1 for the "
                  "supervisor to restart the engine",
                  err.msg);
            lost = 1;
            draining = 1;
            deadline = now + ABORT_GRACE_MS;
            hp_ipc_server_drain(sv->srv, deadline);
            continue;
        }
        if (intr || (term && draining)) {
            logf_(&sv->log, HP_LOG_WARN,
                  "%s: stopping now, %d request(s) in flight end",
                  intr ? "SIGINT" : "second SIGTERM", busy);
            hp_ipc_server_abort(sv->srv, "the engine was stopped before "
                                         "the request finished");
            sv->at_once = 1;
            return 0;
        }
        if (term) {
            long ms = sv->cfg.num[HP_SO_DRAIN_TIMEOUT_MS];
            logf_(&sv->log, HP_LOG_INFO,
                  "SIGTERM: draining: no new requests, %d in flight may "
                  "finish (drain timeout %ld ms; SIGTERM again or SIGINT "
                  "stops at once)",
                  busy, ms);
            draining = 1;
            deadline = now + ms;
            hp_ipc_server_drain(sv->srv, deadline);
            continue;
        }
        if (!draining)
            continue;
        if (busy == 0) {
            logf_(&sv->log, HP_LOG_INFO, "drained: %s",
                  aborted ? "the requests ended by the timeout are collected"
                          : "every request in flight finished");
            return lost;
        }
        if (now < deadline)
            continue;
        if (aborted) {
            logf_(&sv->log, HP_LOG_WARN,
                  "%d request(s) not collected by nginx; stopping anyway",
                  busy);
            return lost;
        }
        logf_(&sv->log, HP_LOG_WARN,
              "drain timeout (%ld ms): %d request(s) still in flight",
              sv->cfg.num[HP_SO_DRAIN_TIMEOUT_MS], busy);
        char why[200];
        snprintf(why, sizeof(why),
                 "the engine shut down before the request finished (drain "
                 "timeout, %ld ms)",
                 sv->cfg.num[HP_SO_DRAIN_TIMEOUT_MS]);
        hp_ipc_server_abort(sv->srv, why);
        aborted = 1;
        deadline = now + ABORT_GRACE_MS;
        hp_ipc_server_drain(sv->srv, deadline);
    }
}

static void our_signals(sigset_t *set)
{
    sigemptyset(set);
    sigaddset(set, SIGTERM);
    sigaddset(set, SIGINT);
    sigaddset(set, SIGHUP);
}

/*
 * OpenMP's worker threads of this thread start here, with our signals
 * blocked like every thread started later; this thread keeps them while
 * the model loads, where the default actions (end the process) are right:
 * there is nothing to drain yet.
 */
static void start_omp_blocked(void)
{
    sigset_t mine, old;
    our_signals(&mine);
    pthread_sigmask(SIG_BLOCK, &mine, &old);
#pragma omp parallel
    {
    }
    pthread_sigmask(SIG_SETMASK, &old, NULL);
}

/* From now on SIGTERM, SIGINT and SIGHUP set flags, and only this
 * thread's waits take them (*wait: the mask to wait with). Before the
 * other threads start: they inherit the blocked mask. */
static void take_signals(sigset_t *wait)
{
    sigset_t mine;
    struct sigaction sa = {.sa_handler = on_signal}; /* no SA_RESTART */
    our_signals(&mine);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGHUP, &sa, NULL);
    pthread_sigmask(SIG_BLOCK, &mine, wait);
    sigdelset(wait, SIGTERM);
    sigdelset(wait, SIGINT);
    sigdelset(wait, SIGHUP);
}

int hp_cmd_serve(int argc, char **argv)
{
    serve_t sv = {.argc = argc, .argv = argv};
    hp_serve_cfg_t *c = &sv.cfg;
    hp_llm_t llm;
    hp_chat_t *chat = NULL;
    const hp_backend_t *be = NULL; /* where the model runs (--device) */
    hp_error_t err = {0};
    char shm[HP_IPC_NAME_BYTES], model_id[HP_IPC_MODEL_BYTES], msg[600];
    hp_prefill_pool_t *prefill = NULL;
    hp_peer_server_t *peer = NULL;
    char *peer_list = NULL;
    const char *peers[HP_PREFILL_MAX_WORKERS];
    int n_peers = 0;
    hp_cache_t cache = {NULL, NULL};
    hp_index_t *index = NULL;
    sigset_t wait_mask;
    int rc = hp_serve_cfg_load(c, argc, argv, msg, sizeof(msg));

    if (rc != 0) {
        if (rc < 0)
            fprintf(stderr, "hypic-engine serve: %s\n", msg);
        hp_serve_cfg_free(c);
        return rc < 0 ? 2 : 0;
    }
    atomic_init(&sv.log.level, c->log_level);
    for (int k = 0; k < HP_SO_N; k++)
        if (c->file_ignored[k])
            logf_(&sv.log, HP_LOG_INFO, "%s in %s is ignored: the flag wins",
                  hp_serve_opt_name(k), c->str[HP_SO_CONFIG]);
    signal(SIGPIPE, SIG_IGN);
    start_omp_blocked();

    long pworkers = c->num[HP_SO_PREFILL_WORKERS];
    if (c->str[HP_SO_PEERS]) {
        peer_list = strdup(c->str[HP_SO_PEERS]);
        for (char *save,
             *t = peer_list ? strtok_r(peer_list, ",", &save) : NULL;
             t; t = strtok_r(NULL, ",", &save))
            if (*t && n_peers < HP_PREFILL_MAX_WORKERS - 1)
                peers[n_peers++] = t;
        if (n_peers && !pworkers)
            pworkers = 1; /* a local worker to fall back on */
    }
    const char *node = c->str[HP_SO_NODE] ? c->str[HP_SO_NODE] : "node-1";
    if (c->str[HP_SO_SHM])
        snprintf(shm, sizeof(shm), "%s", c->str[HP_SO_SHM]);
    else
        snprintf(shm, sizeof(shm), "/hypic-%s", node);
    /* the model id defaults to the directory's last component */
    const char *dir = c->str[HP_SO_MODEL];
    if (c->str[HP_SO_MODEL_ID]) {
        snprintf(model_id, sizeof(model_id), "%s", c->str[HP_SO_MODEL_ID]);
    } else {
        size_t n = strlen(dir);
        while (n > 1 && dir[n - 1] == '/')
            n--;
        size_t b = n;
        while (b > 0 && dir[b - 1] != '/')
            b--;
        snprintf(model_id, sizeof(model_id), "%.*s", (int)(n - b), dir + b);
    }

    const char *dev = c->str[HP_SO_DEVICE] ? c->str[HP_SO_DEVICE] : "cpu";
    int brc = hp_backend_open(&be, dev, &err);
    if (brc != HP_OK) {
        fprintf(stderr, "hypic-engine serve: %s\n", err.msg);
        rc = brc == HP_EBADINPUT ? 2 : 1;
        goto out;
    }
    sv.be = be;
    if (hp_llm_load_on(&llm, dir, be, &err) != HP_OK) {
        fprintf(stderr, "hypic-engine serve: %s\n", err.msg);
        rc = 1;
        goto out;
    }
    hp_compute_t dtype = HP_COMPUTE_AUTO;
    hp_compute_parse(c->str[HP_SO_DTYPE], &dtype); /* checked: or unset */
    hp_model_set_compute(&llm.model, dtype);
    const size_t *wb = llm.model.weight_bytes;
    logf_(&sv.log, HP_LOG_INFO,
          "model %s loaded on %s (%d layers, hidden %d; weights f32 %zu "
          "MiB, bf16 %zu MiB, int8 %zu MiB; operands %s, dtype %s)",
          dir, hp_backend_name(be), llm.model.cfg.n_layers,
          llm.model.cfg.hidden, wb[HK_W_F32] >> 20, wb[HK_W_BF16] >> 20,
          wb[HK_W_I8] >> 20, hp_prec_name(llm.model.prec),
          c->str[HP_SO_DTYPE] ? c->str[HP_SO_DTYPE] : "auto");
    if (hp_chat_load(&chat, dir, &err) != HP_OK) {
        fprintf(stderr, "hypic-engine serve: %s\n", err.msg);
        rc = 1;
        goto free_llm;
    }
    logf_(&sv.log, HP_LOG_INFO, "chat template: %s", hp_chat_origin(chat));
    take_signals(&wait_mask);

    cache.pub =
        hp_segc_pool_create(be, (size_t)c->num[HP_SO_PUBLIC_POOL], &err);
    hp_prefix_cache_params_t pcp;
    hp_prefix_cache_params_default(&pcp, (size_t)c->num[HP_SO_PRIVATE_POOL]);
    cache.prefix = cache.pub ? hp_prefix_cache_create(&llm.model.cfg, &pcp,
                                                      llm.model.be, &err)
                             : NULL;
    if (!cache.prefix) {
        fprintf(stderr, "hypic-engine serve: %s\n", err.msg);
        rc = 1;
        goto free_llm;
    }
    if (c->str[HP_SO_REDIS]) {
        hp_index_config_t xcfg = {
            .redis = c->str[HP_SO_REDIS],
            .model = model_id,
            .node = node,
            .node_addr = c->str[HP_SO_PEER_ADDR] ? c->str[HP_SO_PEER_ADDR] : "",
            .ttl_s = 60,
            .timeout_ms = 200,
            .log = log_line,
            .log_ud = &sv.log,
        };
        index = hp_index_start(&xcfg, &err);
        if (!index) {
            fprintf(stderr, "hypic-engine serve: %s\n", err.msg);
            rc = 2;
            goto free_llm;
        }
        hp_pool_set_hook(cache.pub, pool_to_index, index);
    }

    if (pworkers > 0) {
        hp_prefill_pool_cfg_t pcfg = {
            .workers = (int)pworkers,
            .threads_per_worker = (int)c->num[HP_SO_PREFILL_THREADS],
            .peers = peers,
            .n_peers = n_peers,
            .peer_timeout_ms = (int)c->num[HP_SO_PEER_TIMEOUT_MS],
            .peer_fetch = (int)c->num[HP_SO_PEER_FETCH],
            .log = log_line,
            .log_ud = &sv.log,
        };
        if (hp_prefill_pool_create(&prefill, &pcfg, &err) != HP_OK) {
            fprintf(stderr, "hypic-engine serve: %s\n", err.msg);
            rc = 2;
            goto free_llm;
        }
    }
    if (c->str[HP_SO_PEER_LISTEN]) {
        hp_peer_server_cfg_t pscfg = {
            .listen = c->str[HP_SO_PEER_LISTEN],
            .pub = cache.pub,
            .llm = &llm,
            .threads = (int)c->num[HP_SO_PREFILL_THREADS],
            .max_segment =
                (int)(c->num[HP_SO_MAX_SEGMENT] ? c->num[HP_SO_MAX_SEGMENT]
                                                : c->num[HP_SO_MAX_CONTEXT]),
            .log = log_line,
            .log_ud = &sv.log,
        };
        peer = hp_peer_server_start(&pscfg, &err);
        if (!peer) {
            fprintf(stderr, "hypic-engine serve: %s\n", err.msg);
            rc = 2;
            goto free_llm;
        }
        logf_(&sv.log, HP_LOG_INFO, "peers reach this node on %s (port %d)",
              c->str[HP_SO_PEER_LISTEN], hp_peer_server_port(peer));
    }

    hp_ipc_server_cfg_t icfg = {
        .socket_path = c->str[HP_SO_SOCKET],
        .shm_name = shm,
        .node = node,
        .model = model_id,
        .slots = (uint32_t)c->num[HP_SO_SLOTS],
        .input_bytes = (uint32_t)((c->num[HP_SO_MAX_PROMPT_BYTES] + 63) & ~63L),
        .ring_bytes = (uint32_t)c->num[HP_SO_RING_BYTES],
        .log = log_line,
        .log_ud = &sv.log,
        .fingerprint = llm.model.fingerprint,
        .wait_mask = &wait_mask,
        .chat = chat,
        .device = hp_backend_name(llm.model.be),
        .device_name = hp_backend_device(llm.model.be),
    };
    sv.started_chunkwise = 1; /* the scheduler always has its pool */
    hp_sched_cfg_t scfg = {
        .batch = (int)c->num[HP_SO_BATCH],
        .prefill_chunk = (int)c->num[HP_SO_PREFILL_CHUNK],
        .max_queue = (int)c->num[HP_SO_MAX_QUEUE],
        .max_context = (int)c->num[HP_SO_MAX_CONTEXT],
        .threads = (int)c->num[HP_SO_THREADS],
        .throttle_ms = (int)c->num[HP_SO_THROTTLE_MS],
        .flush = after_step,
        .cache = &cache,
        .seam = (int)c->num[HP_SO_SEAM],
        .prefill = prefill,
        .decode = decode_form(c),
        .speculative = (int)c->num[HP_SO_SPECULATIVE],
        .max_draft = (int)c->num[HP_SO_MAX_DRAFT],
        .seq_budget = (size_t)c->num[HP_SO_SEQ_BUDGET],
        .max_segment = (int)c->num[HP_SO_MAX_SEGMENT],
    };

    if (hp_ipc_server_open(&sv.srv, &icfg, &err) != HP_OK) {
        fprintf(stderr, "hypic-engine serve: %s\n", err.msg);
        rc = 1;
        goto free_llm;
    }
    step_hooks_t hooks = {sv.srv, index, &cache, &sv.log, 0, 0};
    publish_pools(sv.srv, &cache, NULL);
    scfg.flush_ud = &hooks;
    if (hp_sched_create(&sv.sched, &llm, &scfg, &err) != HP_OK) {
        fprintf(stderr, "hypic-engine serve: %s\n", err.msg);
        rc = 1;
        goto close_srv;
    }
    {
        hp_sched_stats_t st;
        hp_sched_stats(sv.sched, &st); /* the sequence pool's budget */
        publish_pools(sv.srv, &cache, &st);
        log_memory(&sv.log, &llm.model, &st, c);
    }
    hp_ipc_server_set_seam(sv.srv, (int)c->num[HP_SO_SEAM]);
    logf_(&sv.log, HP_LOG_INFO,
          "serving \"%s\" on %s (node %s, shm %s, generation %llu, pid %d, "
          "%ld slots, max queue %ld, batch %ld, prefill chunk %ld, seam "
          "%ld, decode %s, pools %ld+%ld MiB, %ld prefill workers, %d "
          "peers%s%s)",
          model_id, c->str[HP_SO_SOCKET], node, shm,
          (unsigned long long)hp_ipc_server_generation(sv.srv), (int)getpid(),
          c->num[HP_SO_SLOTS], c->num[HP_SO_MAX_QUEUE], c->num[HP_SO_BATCH],
          c->num[HP_SO_PREFILL_CHUNK]
              ? c->num[HP_SO_PREFILL_CHUNK]
              : (long)hp_sched_prefill_chunk(&llm.model),
          c->num[HP_SO_SEAM],
          c->str[HP_SO_DECODE] ? c->str[HP_SO_DECODE] : "auto",
          c->num[HP_SO_PUBLIC_POOL] >> 20, c->num[HP_SO_PRIVATE_POOL] >> 20,
          pworkers, n_peers, index ? ", redis index" : "",
          c->num[HP_SO_THROTTLE_MS] ? ", throttled" : "");

    rc = serve_loop(&sv);
    if (index) {
        int left =
            hp_index_leave(index, sv.at_once ? LEAVE_AT_ONCE_MS : LEAVE_MS);
        logf_(&sv.log, left == 0 ? HP_LOG_INFO : HP_LOG_WARN, "%s",
              left == 0 ? "left the Redis index"
                        : "Redis did not confirm leaving the index; its "
                          "entries expire by themselves");
    }
    log_line(&sv.log, HP_LOG_INFO, "shutting down");
    hp_sched_destroy(sv.sched);
    log_tuned(&sv);
close_srv:
    hp_ipc_server_close(sv.srv);
free_llm:
    hp_peer_server_stop(peer); /* after the scheduler: its jobs are gone */
    hp_prefill_pool_destroy(prefill);
    if (cache.pub)
        hp_pool_set_hook(cache.pub, NULL, NULL);
    hp_index_stop(index);
    hp_pool_destroy(cache.pub);
    hp_prefix_cache_destroy(cache.prefix);
    hp_chat_free(chat);
    hp_llm_free(&llm);
    if (rc == 0)
        log_line(&sv.log, HP_LOG_INFO, "exit 0");
out:
    hp_backend_close(be);
    free(peer_list);
    hp_serve_cfg_free(c);
    return rc;
}
