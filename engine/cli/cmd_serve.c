/*
 * cmd_serve.c - `hypic-engine serve`: loads the model once, then serves
 * nginx workers through the shared-memory interface (engine/hp_ipc.h):
 * the IPC loop runs in this thread, the scheduler in one of its own.
 *
 * Settings come from flags and from a config file of "key value" lines
 * (conf/engine.conf); a key is a flag's name without "--" ('_' and '-'
 * alike), and flags win over the file.
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "engine/cli/cli.h"
#include "engine/hp_ipc.h"
#include "engine/index.h"
#include "engine/ipc_server.h"
#include "engine/llm.h"
#include "engine/peer.h"
#include "engine/prefill_pool.h"
#include "engine/sched.h"

enum { T_STR, T_INT, T_SIZE };

typedef struct {
    const char *name; /* flag without "--", also the config key */
    int type;
    long lo, hi;
    const char *arg, *help;
} opt_t;

static const opt_t opts[] = {
    {"config", T_STR, 0, 0, "F", "config file (key value lines)"},
    {"model", T_STR, 0, 0, "DIR", "Hugging Face model directory"},
    {"model-id", T_STR, 0, 0, "ID", "model id (default: DIR's last part)"},
    {"socket", T_STR, 0, 0, "PATH", "unix socket nginx connects to"},
    {"redis", T_STR, 0, 0, "HOST:PORT", "global segment index"},
    {"node", T_STR, 0, 0, "ID", "this node's id (default node-1)"},
    {"peer-addr", T_STR, 0, 0, "HOST:PORT",
     "where this node's nginx listens, for routing (index addr)"},
    {"shm", T_STR, 0, 0, "/NAME", "shared segment (default /hypic-NODE)"},
    {"slots", T_INT, 1, 65536, "N",
     "requests in flight, running + queued (default 32)"},
    {"batch", T_INT, 1, 4096, "N", "requests decoding at once (default 8)"},
    {"threads", T_INT, 0, 4096, "N", "compute threads (default: all)"},
    {"prefill-chunk", T_INT, 1, 1 << 20, "N",
     "prompt tokens per scheduler step (default 256)"},
    {"max-prompt-bytes", T_SIZE, 64, 1L << 30, "SIZE",
     "largest prompt, k/m suffix (default 1m)"},
    {"ring-bytes", T_SIZE, HP_IPC_RING_MIN, 1L << 26, "SIZE",
     "output ring per request (default 64k)"},
    {"max-context", T_INT, 0, 1 << 30, "N",
     "prompt + output tokens (default: the model's)"},
    {"throttle-ms", T_INT, 0, 60000, "N",
     "pause after every busy step: tests, demos (default 0)"},
    {"public-pool", T_SIZE, 0, 1L << 40, "SIZE",
     "segment cache budget, k/m/g suffix (default 2g)"},
    {"private-pool", T_SIZE, 0, 1L << 40, "SIZE",
     "prefix cache (sessions, shared prompts) budget (default 1g)"},
    {"seam", T_INT, 0, 256, "N", "default seam width (default 8)"},
    {"prefill-workers", T_INT, 0, 64, "N",
     "segment prefill threads; 0: in the scheduler (default 0)"},
    {"prefill-threads", T_INT, 0, 4096, "N",
     "OpenMP threads of each prefill worker (default 1)"},
    {"peer-listen", T_STR, 0, 0, "HOST:PORT",
     "serve this node's segments (and prefills) to peers (TCP)"},
    {"peers", T_STR, 0, 0, "A,B,..",
     "peers' --peer-listen addresses: remote prefill workers"},
    {"peer-timeout-ms", T_INT, 1, 1 << 30, "N",
     "one remote prefill or fetch (default 30000)"},
    {"peer-fetch", T_INT, 0, 1, "0|1",
     "ask the peers for a cold segment before computing it (default 0)"},
    {"decode", T_STR, 0, 0, "FORM",
     "recurrent | chunkwise | auto (KVBuffer; default auto)"},
};

#define N_OPTS (sizeof(opts) / sizeof(opts[0]))

typedef struct {
    const char *val[N_OPTS]; /* as given */
    char *owned[N_OPTS];     /* values read from the config file */
} serve_opts_t;

static volatile sig_atomic_t stop_flag;

static void on_signal(int sig)
{
    (void)sig;
    stop_flag = 1;
}

static void log_line(void *ud, int level, const char *msg)
{
    static const char *names[] = {"error", "warn", "info", "debug"};
    char ts[32];
    struct timespec now;
    struct tm tm;
    (void)ud;
    clock_gettime(CLOCK_REALTIME, &now);
    gmtime_r(&now.tv_sec, &tm);
    strftime(ts, sizeof(ts), "%Y-%m-%dT%H:%M:%S", &tm);
    fprintf(stderr, "%s.%03ldZ [%s] %s\n", ts, now.tv_nsec / 1000000,
            names[level < 0 || level > 3 ? 0 : level], msg);
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

/* After every productive scheduler step: wake nginx, and publish the
 * node's load (requests held) with the next index heartbeat, which the
 * module's routing breaks ties by. */
typedef struct {
    hp_ipc_server_t *srv;
    hp_index_t *index;
} step_hooks_t;

static void after_step(void *ud, const hp_sched_stats_t *st)
{
    step_hooks_t *h = ud;
    hp_ipc_server_flush(h->srv, st);
    hp_index_set_load(h->index, st->live);
}

static int find_opt(const char *name)
{
    char norm[64];
    size_t n = strlen(name);
    if (n >= sizeof(norm))
        return -1;
    for (size_t i = 0; i <= n; i++)
        norm[i] = name[i] == '_' ? '-' : name[i];
    for (size_t i = 0; i < N_OPTS; i++)
        if (!strcmp(opts[i].name, norm))
            return (int)i;
    return -1;
}

static char *trim(char *s)
{
    while (*s == ' ' || *s == '\t')
        s++;
    char *e = s + strlen(s);
    while (e > s &&
           (e[-1] == ' ' || e[-1] == '\t' || e[-1] == '\n' || e[-1] == '\r'))
        *--e = '\0';
    return s;
}

static int read_config(const char *path, serve_opts_t *o)
{
    FILE *f = fopen(path, "r");
    char line[1024];
    int lineno = 0;
    if (!f) {
        fprintf(stderr, "hypic-engine serve: cannot open %s: %s\n", path,
                strerror(errno));
        return -1;
    }
    while (fgets(line, sizeof(line), f)) {
        lineno++;
        char *s = trim(line);
        if (!*s || *s == '#')
            continue;
        char *v = s + strcspn(s, " \t");
        if (*v)
            *v++ = '\0';
        v = trim(v);
        int k = find_opt(s);
        if (k < 0 || k == 0 || !*v) {
            fprintf(stderr, "hypic-engine serve: %s:%d: %s '%s'\n", path,
                    lineno, k > 0 ? "missing value for" : "unknown setting", s);
            fclose(f);
            return -1;
        }
        if (!o->val[k]) {
            o->owned[k] = strdup(v);
            o->val[k] = o->owned[k];
        }
    }
    fclose(f);
    return 0;
}

/* An integer (with k/m/g for sizes) within the option's bounds. */
static int get_num(const serve_opts_t *o, int k, long dflt, long *out)
{
    const char *v = o->val[k];
    char *end;
    if (!v) {
        *out = dflt;
        return 0;
    }
    errno = 0;
    long x = strtol(v, &end, 10);
    if (opts[k].type == T_SIZE && end != v) {
        long mul = *end == 'k' || *end == 'K'   ? 1024
                   : *end == 'm' || *end == 'M' ? 1024 * 1024
                   : *end == 'g' || *end == 'G' ? 1024L * 1024 * 1024
                                                : 1;
        if (mul > 1) {
            end++;
            x = x > opts[k].hi / mul ? opts[k].hi + 1 : x * mul;
        }
    }
    if (errno || end == v || *end || x < opts[k].lo || x > opts[k].hi) {
        fprintf(stderr,
                "hypic-engine serve: %s needs %s in [%ld, %ld], not "
                "'%s'\n",
                opts[k].name, opts[k].type == T_SIZE ? "a size" : "an integer",
                opts[k].lo, opts[k].hi, v);
        return -1;
    }
    *out = x;
    return 0;
}

static void usage(void)
{
    printf("usage: hypic-engine serve [--config F] --model DIR --socket PATH "
           "[options]\n\n");
    for (size_t i = 0; i < N_OPTS; i++)
        printf("  --%-17s %-10s %s\n", opts[i].name, opts[i].arg, opts[i].help);
}

#define OPT(name) (o.val[find_opt(name)])

int hp_cmd_serve(int argc, char **argv)
{
    serve_opts_t o;
    hp_llm_t llm;
    hp_error_t err = {0};
    hp_ipc_server_t *srv = NULL;
    hp_sched_t *sched = NULL;
    char shm[HP_IPC_NAME_BYTES], model_id[HP_IPC_MODEL_BYTES];
    long slots, batch, threads, chunk, prompt_bytes, ring, ctx, throttle;
    long pub_bytes, priv_bytes, seam, pworkers, pthreads, ptimeout, pfetch;
    hp_prefill_pool_t *prefill = NULL;
    hp_peer_server_t *peer = NULL;
    char *peer_list = NULL;
    const char *peers[HP_PREFILL_MAX_WORKERS];
    int n_peers = 0;
    hp_cache_t cache = {NULL, NULL};
    hp_index_t *index = NULL;
    int rc = 0;

    memset(&o, 0, sizeof(o));
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            usage();
            return 0;
        }
        int k = strncmp(argv[i], "--", 2) ? -1 : find_opt(argv[i] + 2);
        if (k < 0 || i + 1 >= argc) {
            fprintf(stderr, "hypic-engine serve: %s '%s' (see --help)\n",
                    k < 0 ? "unknown option" : "missing value for", argv[i]);
            return 2;
        }
        o.val[k] = argv[++i];
    }
    if (o.val[0] && read_config(o.val[0], &o) != 0) {
        rc = 2;
        goto out;
    }
    if (!OPT("model") || !OPT("socket")) {
        fprintf(stderr, "hypic-engine serve: model and socket are required "
                        "(flags or config file)\n");
        rc = 2;
        goto out;
    }
    if (get_num(&o, find_opt("slots"), 32, &slots) ||
        get_num(&o, find_opt("batch"), 8, &batch) ||
        get_num(&o, find_opt("threads"), 0, &threads) ||
        get_num(&o, find_opt("prefill-chunk"), 256, &chunk) ||
        get_num(&o, find_opt("max-prompt-bytes"), 1024 * 1024, &prompt_bytes) ||
        get_num(&o, find_opt("ring-bytes"), 65536, &ring) ||
        get_num(&o, find_opt("max-context"), 0, &ctx) ||
        get_num(&o, find_opt("throttle-ms"), 0, &throttle) ||
        get_num(&o, find_opt("public-pool"), 2L << 30, &pub_bytes) ||
        get_num(&o, find_opt("private-pool"), 1L << 30, &priv_bytes) ||
        get_num(&o, find_opt("seam"), HP_SEAM_DEFAULT, &seam) ||
        get_num(&o, find_opt("prefill-workers"), 0, &pworkers) ||
        get_num(&o, find_opt("prefill-threads"), 1, &pthreads) ||
        get_num(&o, find_opt("peer-timeout-ms"), 30000, &ptimeout) ||
        get_num(&o, find_opt("peer-fetch"), 0, &pfetch)) {
        rc = 2;
        goto out;
    }
    if (OPT("peers")) {
        peer_list = strdup(OPT("peers"));
        for (char *sv, *t = peer_list ? strtok_r(peer_list, ",", &sv) : NULL; t;
             t = strtok_r(NULL, ",", &sv))
            if (*t && n_peers < HP_PREFILL_MAX_WORKERS - 1)
                peers[n_peers++] = t;
        if (n_peers && !pworkers)
            pworkers = 1; /* a local worker to fall back on */
    }
    if (ring & (ring - 1)) {
        fprintf(stderr, "hypic-engine serve: ring-bytes must be a power of "
                        "two\n");
        rc = 2;
        goto out;
    }
    const char *node = OPT("node") ? OPT("node") : "node-1";
    if (OPT("shm"))
        snprintf(shm, sizeof(shm), "%s", OPT("shm"));
    else
        snprintf(shm, sizeof(shm), "/hypic-%s", node);
    /* the model id defaults to the directory's last component */
    const char *dir = OPT("model");
    if (OPT("model-id")) {
        snprintf(model_id, sizeof(model_id), "%s", OPT("model-id"));
    } else {
        size_t n = strlen(dir);
        while (n > 1 && dir[n - 1] == '/')
            n--;
        size_t b = n;
        while (b > 0 && dir[b - 1] != '/')
            b--;
        snprintf(model_id, sizeof(model_id), "%.*s", (int)(n - b), dir + b);
    }

    if (hp_llm_load(&llm, dir, &err) != HP_OK) {
        fprintf(stderr, "hypic-engine serve: %s\n", err.msg);
        rc = 1;
        goto out;
    }
    char msg[1400];
    snprintf(msg, sizeof(msg), "model %s loaded (%d layers, hidden %d)", dir,
             llm.model.cfg.n_layers, llm.model.cfg.hidden);
    log_line(NULL, HP_LOG_INFO, msg);

    cache.pub = hp_pool_create((size_t)pub_bytes, &err);
    hp_prefix_cache_params_t pcp;
    hp_prefix_cache_params_default(&pcp, (size_t)priv_bytes);
    cache.prefix = cache.pub
                       ? hp_prefix_cache_create(&llm.model.cfg, &pcp, 1, &err)
                       : NULL;
    if (!cache.prefix) {
        fprintf(stderr, "hypic-engine serve: %s\n", err.msg);
        rc = 1;
        goto free_llm;
    }
    if (OPT("redis")) {
        hp_index_config_t xcfg = {
            .redis = OPT("redis"),
            .model = model_id,
            .node = node,
            .node_addr = OPT("peer-addr") ? OPT("peer-addr") : "",
            .ttl_s = 60,
            .timeout_ms = 200,
            .log = log_line,
        };
        index = hp_index_start(&xcfg, &err);
        if (!index) {
            fprintf(stderr, "hypic-engine serve: %s\n", err.msg);
            rc = 2;
            goto free_llm;
        }
        hp_pool_set_hook(cache.pub, pool_to_index, index);
    }

    const char *decode = OPT("decode") ? OPT("decode") : "auto";
    if (strcmp(decode, "recurrent") && strcmp(decode, "chunkwise") &&
        strcmp(decode, "auto")) {
        fprintf(stderr,
                "hypic-engine serve: decode is recurrent, chunkwise "
                "or auto, not '%s'\n",
                decode);
        rc = 2;
        goto free_llm;
    }

    if (pworkers > 0) {
        hp_prefill_pool_cfg_t pcfg = {
            .workers = (int)pworkers,
            .threads_per_worker = (int)pthreads,
            .peers = peers,
            .n_peers = n_peers,
            .peer_timeout_ms = (int)ptimeout,
            .peer_fetch = (int)pfetch,
            .log = log_line,
        };
        if (hp_prefill_pool_create(&prefill, &pcfg, &err) != HP_OK) {
            fprintf(stderr, "hypic-engine serve: %s\n", err.msg);
            rc = 2;
            goto free_llm;
        }
    }
    if (OPT("peer-listen")) {
        hp_peer_server_cfg_t pscfg = {
            .listen = OPT("peer-listen"),
            .pub = cache.pub,
            .llm = &llm,
            .threads = (int)pthreads,
            .log = log_line,
        };
        peer = hp_peer_server_start(&pscfg, &err);
        if (!peer) {
            fprintf(stderr, "hypic-engine serve: %s\n", err.msg);
            rc = 2;
            goto free_llm;
        }
        snprintf(msg, sizeof(msg), "peers reach this node on %s (port %d)",
                 OPT("peer-listen"), hp_peer_server_port(peer));
        log_line(NULL, HP_LOG_INFO, msg);
    }

    hp_ipc_server_cfg_t icfg = {
        .socket_path = OPT("socket"),
        .shm_name = shm,
        .node = node,
        .model = model_id,
        .slots = (uint32_t)slots,
        .input_bytes = (uint32_t)((prompt_bytes + 63) & ~63L),
        .ring_bytes = (uint32_t)ring,
        .log = log_line,
        .fingerprint = llm.model.fingerprint,
    };
    hp_sched_cfg_t scfg = {
        .batch = (int)batch,
        .prefill_chunk = (int)chunk,
        .max_queue = (int)slots,
        .max_context = (int)ctx,
        .threads = (int)threads,
        .throttle_ms = (int)throttle,
        .flush = after_step,
        .cache = &cache,
        .seam = (int)seam,
        .prefill = prefill,
        .decode = strcmp(decode, "recurrent") ? HP_SCHED_DECODE_CHUNKWISE
                                              : HP_SCHED_DECODE_RECURRENT,
    };
    /* no SA_RESTART: poll(2) returns on a signal and the loop ends */
    struct sigaction sa = {.sa_handler = on_signal};
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);

    if (hp_ipc_server_open(&srv, &icfg, &err) != HP_OK) {
        fprintf(stderr, "hypic-engine serve: %s\n", err.msg);
        rc = 1;
        goto free_llm;
    }
    step_hooks_t hooks = {srv, index};
    scfg.flush_ud = &hooks;
    if (hp_sched_create(&sched, &llm, &scfg, &err) != HP_OK) {
        fprintf(stderr, "hypic-engine serve: %s\n", err.msg);
        rc = 1;
        goto close_srv;
    }
    snprintf(msg, sizeof(msg),
             "serving \"%s\" on %s (node %s, shm %s, generation %llu, "
             "%ld slots, batch %ld, prefill chunk %ld, seam %ld, pools "
             "%ld+%ld MiB, %ld prefill workers, %d peers%s%s)",
             model_id, OPT("socket"), node, shm,
             (unsigned long long)hp_ipc_server_generation(srv), slots, batch,
             chunk, seam, pub_bytes >> 20, priv_bytes >> 20, pworkers, n_peers,
             index ? ", redis index" : "", throttle ? ", throttled" : "");
    log_line(NULL, HP_LOG_INFO, msg);

    if (hp_ipc_server_run(srv, sched, &stop_flag, &err) != HP_OK) {
        log_line(NULL, HP_LOG_ERROR, err.msg);
        rc = 1;
    }
    log_line(NULL, HP_LOG_INFO, "shutting down");
    hp_sched_destroy(sched);
close_srv:
    hp_ipc_server_close(srv);
free_llm:
    hp_peer_server_stop(peer); /* after the scheduler: its jobs are gone */
    hp_prefill_pool_destroy(prefill);
    if (cache.pub)
        hp_pool_set_hook(cache.pub, NULL, NULL);
    hp_index_stop(index);
    hp_pool_destroy(cache.pub);
    hp_prefix_cache_destroy(cache.prefix);
    hp_llm_free(&llm);
out:
    free(peer_list);
    for (size_t i = 0; i < N_OPTS; i++)
        free(o.owned[i]);
    return rc;
}
