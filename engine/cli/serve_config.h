/*
 * serve_config.h - the settings of `hypic-engine serve`: one table of
 * options, each a flag (--name) and a config-file key (name, '_' and '-'
 * alike); flags win over the file. Read at start and again on SIGHUP,
 * when only the options marked reloadable may change what runs.
 */
#ifndef HP_CLI_SERVE_CONFIG_H
#define HP_CLI_SERVE_CONFIG_H

#include <stddef.h>

/* Indices into the table (and into hp_serve_cfg_t's arrays). */
enum {
    HP_SO_CONFIG,
    HP_SO_MODEL,
    HP_SO_MODEL_ID,
    HP_SO_DEVICE,
    HP_SO_DTYPE,
    HP_SO_SOCKET,
    HP_SO_REDIS,
    HP_SO_NODE,
    HP_SO_PEER_ADDR,
    HP_SO_SHM,
    HP_SO_SLOTS,
    HP_SO_MAX_QUEUE,
    HP_SO_BATCH,
    HP_SO_THREADS,
    HP_SO_PREFILL_CHUNK,
    HP_SO_MAX_PROMPT_BYTES,
    HP_SO_RING_BYTES,
    HP_SO_MAX_CONTEXT,
    HP_SO_THROTTLE_MS,
    HP_SO_PUBLIC_POOL,
    HP_SO_PRIVATE_POOL,
    HP_SO_SEAM,
    HP_SO_PREFILL_WORKERS,
    HP_SO_PREFILL_THREADS,
    HP_SO_PEER_LISTEN,
    HP_SO_PEERS,
    HP_SO_PEER_TIMEOUT_MS,
    HP_SO_PEER_FETCH,
    HP_SO_DECODE,
    HP_SO_SPECULATIVE,
    HP_SO_MAX_DRAFT,
    HP_SO_LOG_LEVEL,
    HP_SO_DRAIN_TIMEOUT_MS,
    HP_SO_SEQ_BUDGET,
    HP_SO_MAX_SEGMENT,
    HP_SO_N
};

typedef struct {
    char *str[HP_SO_N]; /* as given (the flag, else the file), owned;
                         * NULL: not given */
    long num[HP_SO_N];  /* numeric options, their default when not given */
    int log_level;      /* HP_LOG_*, from log-level */
    /* the file sets it too, but a flag gave it: the flag wins */
    unsigned char file_ignored[HP_SO_N];
} hp_serve_cfg_t;

/*
 * Reads the flags (argv[0] is "serve") and then the config file that
 * --config names, and checks every value. Returns 0, 1 if --help was
 * asked (usage printed, nothing else done), or -1 with the reason in
 * msg[cap] (the first bad setting, with file and line for the file's).
 * c is filled in either case: free it with hp_serve_cfg_free.
 */
int hp_serve_cfg_load(hp_serve_cfg_t *c, int argc, char **argv, char *msg,
                      size_t cap);
void hp_serve_cfg_free(hp_serve_cfg_t *c);

/* The option's name ("max-queue"), and whether a running engine can
 * take a new value of it (SIGHUP) rather than needing a restart. */
const char *hp_serve_opt_name(int k);
int hp_serve_opt_reloadable(int k);

/* Whether option k has different values in a and b. */
int hp_serve_cfg_differs(const hp_serve_cfg_t *a, const hp_serve_cfg_t *b,
                         int k);
/* Option k's value for the log: the text given, or "(default N)". */
const char *hp_serve_cfg_text(const hp_serve_cfg_t *c, int k, char *buf,
                              size_t cap);
/* Moves option k's value from src into dst (a reload that applied it). */
void hp_serve_cfg_take(hp_serve_cfg_t *dst, hp_serve_cfg_t *src, int k);

#endif
