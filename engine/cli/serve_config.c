/* serve_config.c - serve's option table, flags and config file (see
 * serve_config.h). */
#include "engine/cli/serve_config.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/cache/assemble.h"
#include "engine/contract/hp_ipc.h"
#include "engine/contract/hp_log.h"

enum { T_STR, T_INT, T_SIZE };

typedef struct {
    const char *name; /* flag without "--", also the config key */
    int type;
    long lo, hi, dflt;
    int reload; /* a running engine takes a new value on SIGHUP */
    const char *arg, *help;
} opt_t;

#define K 1024L
#define M (1024L * 1024)
#define G (1024L * 1024 * 1024)

/* In the order of the HP_SO_* indices. */
static const opt_t opts[HP_SO_N] = {
    {"config", T_STR, 0, 0, 0, 0, "F", "config file (key value lines)"},
    {"model", T_STR, 0, 0, 0, 0, "DIR", "Hugging Face model directory"},
    {"model-id", T_STR, 0, 0, 0, 0, "ID",
     "model id (default: DIR's last part)"},
    {"device", T_STR, 0, 0, 0, 0, "DEV",
     "cpu | cuda | cuda:N, where the model runs (default cpu)"},
    {"dtype", T_STR, 0, 0, 0, 0, "T",
     "auto | f32 | bf16: bf16 lets a device round attention's operands as "
     "a bf16 checkpoint does (default auto: the checkpoint's)"},
    {"socket", T_STR, 0, 0, 0, 0, "PATH", "unix socket nginx connects to"},
    {"redis", T_STR, 0, 0, 0, 0, "HOST:PORT", "global segment index"},
    {"node", T_STR, 0, 0, 0, 0, "ID", "this node's id (default node-1)"},
    {"peer-addr", T_STR, 0, 0, 0, 0, "HOST:PORT",
     "where this node's nginx listens, for routing (index addr)"},
    {"shm", T_STR, 0, 0, 0, 0, "/NAME", "shared segment (default /hypic-NODE)"},
    {"slots", T_INT, 1, 65536, 32, 0, "N",
     "requests in flight, running + queued (default 32)"},
    {"max-queue", T_INT, 0, 65536, 0, 1, "N",
     "requests admitted at once, <= slots; beyond: busy (default: slots)"},
    {"batch", T_INT, 1, 4096, 8, 0, "N",
     "requests decoding at once (default 8)"},
    {"threads", T_INT, 0, 4096, 0, 0, "N", "compute threads (default: all)"},
    {"prefill-chunk", T_INT, 0, 1 << 20, 0, 0, "N",
     "prompt tokens per scheduler step (default 0: 256 on the CPU, 2048 "
     "on a device)"},
    {"max-prompt-bytes", T_SIZE, 64, G, M, 0, "SIZE",
     "largest prompt, k/m suffix (default 1m)"},
    {"ring-bytes", T_SIZE, HP_IPC_RING_MIN, 1L << 26, 64 * K, 0, "SIZE",
     "output ring per request (default 64k)"},
    {"max-context", T_INT, 0, 1 << 30, 0, 0, "N",
     "prompt + output tokens (default: the model's)"},
    {"throttle-ms", T_INT, 0, 60000, 0, 1, "N",
     "pause after every busy step: tests, demos (default 0)"},
    {"public-pool", T_SIZE, 0, 1024 * G, 2 * G, 0, "SIZE",
     "segment cache budget, k/m/g suffix (default 2g)"},
    {"private-pool", T_SIZE, 0, 1024 * G, G, 0, "SIZE",
     "prefix cache (sessions, shared prompts) budget (default 1g)"},
    {"seam", T_INT, 0, 256, HP_SEAM_DEFAULT, 1, "N",
     "default seam width (default 8)"},
    {"prefill-workers", T_INT, 0, 64, 0, 0, "N",
     "segment prefill threads; 0: in the scheduler (default 0)"},
    {"prefill-threads", T_INT, 0, 4096, 1, 0, "N",
     "OpenMP threads of each prefill worker (default 1)"},
    {"peer-listen", T_STR, 0, 0, 0, 0, "HOST:PORT",
     "serve this node's segments (and prefills) to peers (TCP)"},
    {"peers", T_STR, 0, 0, 0, 0, "A,B,..",
     "peers' --peer-listen addresses: remote prefill workers"},
    {"peer-timeout-ms", T_INT, 1, 1 << 30, 30000, 0, "N",
     "one remote prefill or fetch (default 30000)"},
    {"peer-fetch", T_INT, 0, 1, 0, 0, "0|1",
     "ask the peers for a cold segment before computing it (default 0)"},
    {"decode", T_STR, 0, 0, 0, 1, "FORM",
     "recurrent | chunkwise | auto (KVBuffer; default auto)"},
    {"speculative", T_INT, 0, 1, 0, 0, "0|1",
     "prompt-lookup speculative decoding unless a request says (default 0)"},
    {"max-draft", T_INT, 1, 16, 8, 0, "N",
     "speculative tokens drafted per pass (default 8)"},
    {"log-level", T_STR, 0, 0, 0, 1, "LEVEL",
     "error | warn | info | debug (default info)"},
    {"drain-timeout-ms", T_INT, 0, 1 << 30, 30000, 1, "N",
     "SIGTERM: longest wait for requests in flight (default 30000)"},
    {"seq-budget", T_SIZE, 0, 1024 * G, 0, 0, "SIZE",
     "running requests' states and KV, one allocation at start, taken as "
     "sequences grow (the last admitted preempted when short); includes "
     "the segment builders' (default: batch x "
     "max-context on a device, capped at half its memory; none on cpu)"},
    {"max-segment", T_INT, 0, 1 << 30, 0, 0, "N",
     "longest naive/pic segment; sizes the builders' sequences in "
     "seq-budget (default: max-context)"},
};

static const char *const log_levels[] = {"error", "warn", "info", "debug"};

const char *hp_serve_opt_name(int k)
{
    return opts[k].name;
}
int hp_serve_opt_reloadable(int k)
{
    return opts[k].reload;
}

static int find_opt(const char *name)
{
    char norm[64];
    size_t n = strlen(name);
    if (n >= sizeof(norm))
        return -1;
    for (size_t i = 0; i <= n; i++)
        norm[i] = name[i] == '_' ? '-' : name[i];
    for (int i = 0; i < HP_SO_N; i++)
        if (!strcmp(opts[i].name, norm))
            return i;
    return -1;
}

static int fail(char *msg, size_t cap, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static int fail(char *msg, size_t cap, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, cap, fmt, ap);
    va_end(ap);
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

static int set_str(hp_serve_cfg_t *c, int k, const char *v, char *msg,
                   size_t cap)
{
    c->str[k] = strdup(v);
    return c->str[k] ? 0 : fail(msg, cap, "out of memory");
}

/* The file's settings, for the options no flag gave; line[k] says where
 * each came from. */
static int read_file(hp_serve_cfg_t *c, const char *path, int *line, char *msg,
                     size_t cap)
{
    FILE *f = fopen(path, "r");
    char buf[1024];
    int lineno = 0, rc = 0;
    unsigned char seen[HP_SO_N] = {0};
    if (!f)
        return fail(msg, cap, "cannot open %s: %s", path, strerror(errno));
    while (rc == 0 && fgets(buf, sizeof(buf), f)) {
        lineno++;
        char *s = trim(buf);
        if (!*s || *s == '#')
            continue;
        char *v = s + strcspn(s, " \t");
        if (*v)
            *v++ = '\0';
        v = trim(v);
        int k = find_opt(s);
        if (k <= HP_SO_CONFIG || !*v)
            rc = fail(msg, cap, "%s:%d: %s '%s'", path, lineno,
                      k > 0 ? "missing value for" : "unknown setting", s);
        else if (seen[k]++)
            rc = fail(msg, cap, "%s:%d: '%s' is set twice", path, lineno, s);
        else if (c->str[k])
            c->file_ignored[k] = 1;
        else if ((rc = set_str(c, k, v, msg, cap)) == 0)
            line[k] = lineno;
    }
    fclose(f);
    return rc;
}

/* An integer (with k/m/g for sizes) within the option's bounds. */
static int parse_num(hp_serve_cfg_t *c, int k, const char *where, char *msg,
                     size_t cap)
{
    const char *v = c->str[k];
    char *end;
    if (!v) {
        c->num[k] = opts[k].dflt;
        return 0;
    }
    errno = 0;
    long x = strtol(v, &end, 10);
    if (opts[k].type == T_SIZE && end != v) {
        long mul = *end == 'k' || *end == 'K'   ? K
                   : *end == 'm' || *end == 'M' ? M
                   : *end == 'g' || *end == 'G' ? G
                                                : 1;
        if (mul > 1) {
            end++;
            x = x > opts[k].hi / mul ? opts[k].hi + 1 : x * mul;
        }
    }
    if (errno || end == v || *end || x < opts[k].lo || x > opts[k].hi)
        return fail(msg, cap, "%s%s needs %s in [%ld, %ld], not '%s'", where,
                    opts[k].name,
                    opts[k].type == T_SIZE ? "a size" : "an integer",
                    opts[k].lo, opts[k].hi, v);
    c->num[k] = x;
    return 0;
}

/* Every value checked, and the defaults that depend on others. */
static int check(hp_serve_cfg_t *c, const int *line, char *msg, size_t cap)
{
    const char *file = c->str[HP_SO_CONFIG];
    char where[HP_SO_N][300];
    for (int k = 0; k < HP_SO_N; k++) {
        if (line[k])
            snprintf(where[k], sizeof(where[k]), "%s:%d: ", file, line[k]);
        else
            where[k][0] = '\0';
        if (opts[k].type != T_STR && parse_num(c, k, where[k], msg, cap))
            return -1;
    }
    const char *d = c->str[HP_SO_DECODE];
    if (d && strcmp(d, "recurrent") && strcmp(d, "chunkwise") &&
        strcmp(d, "auto"))
        return fail(msg, cap,
                    "%sdecode is recurrent, chunkwise or auto, not '%s'",
                    where[HP_SO_DECODE], d);
    hp_compute_t dt;
    if (c->str[HP_SO_DTYPE] && hp_compute_parse(c->str[HP_SO_DTYPE], &dt))
        return fail(msg, cap, "%sdtype is auto, f32 or bf16, not '%s'",
                    where[HP_SO_DTYPE], c->str[HP_SO_DTYPE]);
    c->log_level = HP_LOG_INFO;
    if (c->str[HP_SO_LOG_LEVEL]) {
        c->log_level = -1;
        for (int i = 0; i < 4; i++)
            if (!strcmp(c->str[HP_SO_LOG_LEVEL], log_levels[i]))
                c->log_level = i;
        if (c->log_level < 0)
            return fail(msg, cap,
                        "%slog-level is error, warn, info or debug, not "
                        "'%s'",
                        where[HP_SO_LOG_LEVEL], c->str[HP_SO_LOG_LEVEL]);
    }
    long ring = c->num[HP_SO_RING_BYTES];
    if (ring & (ring - 1))
        return fail(msg, cap, "%sring-bytes must be a power of two",
                    where[HP_SO_RING_BYTES]);
    if (c->num[HP_SO_MAX_QUEUE] > c->num[HP_SO_SLOTS])
        return fail(msg, cap, "%smax-queue %ld is more than the %ld slots",
                    where[HP_SO_MAX_QUEUE], c->num[HP_SO_MAX_QUEUE],
                    c->num[HP_SO_SLOTS]);
    if (c->num[HP_SO_MAX_QUEUE] == 0)
        c->num[HP_SO_MAX_QUEUE] = c->num[HP_SO_SLOTS];
    if (!c->str[HP_SO_MODEL] || !c->str[HP_SO_SOCKET])
        return fail(msg, cap,
                    "model and socket are required (flags or config file)");
    return 0;
}

static void usage(void)
{
    printf("usage: hypic-engine serve [--config F] --model DIR --socket PATH "
           "[options]\n\n");
    for (int i = 0; i < HP_SO_N; i++)
        printf("  --%-17s %-10s %s\n", opts[i].name, opts[i].arg, opts[i].help);
    printf("\nSIGTERM drains (no new requests, the running ones finish, "
           "then exit);\na second SIGTERM or SIGINT stops at once. SIGHUP "
           "re-reads --config and\napplies max-queue, throttle-ms, seam, "
           "decode, log-level and\ndrain-timeout-ms; flags still win.\n");
}

int hp_serve_cfg_load(hp_serve_cfg_t *c, int argc, char **argv, char *msg,
                      size_t cap)
{
    int line[HP_SO_N] = {0};
    memset(c, 0, sizeof(*c));
    msg[0] = '\0';
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            usage();
            return 1;
        }
        int k = strncmp(argv[i], "--", 2) ? -1 : find_opt(argv[i] + 2);
        if (k < 0 || i + 1 >= argc)
            return fail(msg, cap, "%s '%s' (see --help)",
                        k < 0 ? "unknown option" : "missing value for",
                        argv[i]);
        free(c->str[k]); /* the last one wins */
        c->str[k] = NULL;
        if (set_str(c, k, argv[++i], msg, cap))
            return -1;
    }
    if (c->str[HP_SO_CONFIG] &&
        read_file(c, c->str[HP_SO_CONFIG], line, msg, cap))
        return -1;
    return check(c, line, msg, cap);
}

void hp_serve_cfg_free(hp_serve_cfg_t *c)
{
    for (int k = 0; k < HP_SO_N; k++) {
        free(c->str[k]);
        c->str[k] = NULL;
    }
}

int hp_serve_cfg_differs(const hp_serve_cfg_t *a, const hp_serve_cfg_t *b,
                         int k)
{
    if (opts[k].type != T_STR)
        return a->num[k] != b->num[k];
    if (!a->str[k] || !b->str[k])
        return a->str[k] != b->str[k];
    return strcmp(a->str[k], b->str[k]) != 0;
}

const char *hp_serve_cfg_text(const hp_serve_cfg_t *c, int k, char *buf,
                              size_t cap)
{
    if (c->str[k])
        snprintf(buf, cap, "%s", c->str[k]);
    else if (opts[k].type != T_STR)
        snprintf(buf, cap, "(default %ld)", c->num[k]);
    else
        snprintf(buf, cap, "(default)");
    return buf;
}

void hp_serve_cfg_take(hp_serve_cfg_t *dst, hp_serve_cfg_t *src, int k)
{
    free(dst->str[k]);
    dst->str[k] = src->str[k];
    src->str[k] = NULL;
    dst->num[k] = src->num[k];
    if (k == HP_SO_LOG_LEVEL)
        dst->log_level = src->log_level;
}
