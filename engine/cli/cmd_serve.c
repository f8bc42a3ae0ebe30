/*
 * cmd_serve.c - `hypic-engine serve`: loads the model once and answers on
 * a unix socket. This first version speaks a line protocol for health
 * checks ("HEALTH" -> one JSON line); the request interface of DESIGN §7
 * (shared-memory rings + eventfd) is built on top of this process.
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "engine/cli/cli.h"
#include "engine/llm.h"

typedef struct {
    const char *model;
    const char *socket;
    const char *redis;
    const char *node;
} serve_opts_t;

static volatile sig_atomic_t stop_flag;

static void on_signal(int sig)
{
    (void)sig;
    stop_flag = 1;
}

static char *trim(char *s)
{
    while (*s == ' ' || *s == '\t')
        s++;
    char *e = s + strlen(s);
    while (e > s && (e[-1] == ' ' || e[-1] == '\t' || e[-1] == '\n' ||
                     e[-1] == '\r'))
        *--e = '\0';
    return s;
}

/* Config file: "key value" lines, '#' comments. Keys are the long flag
 * names without "--"; flags given on the command line win. */
static int read_config(const char *path, serve_opts_t *o, char **store)
{
    FILE *f = fopen(path, "r");
    char line[1024];
    int lineno = 0, n = 0;
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
        const char **dst = !strcmp(s, "model")    ? &o->model
                           : !strcmp(s, "socket") ? &o->socket
                           : !strcmp(s, "redis")  ? &o->redis
                           : !strcmp(s, "node")   ? &o->node
                                                  : NULL;
        if (!dst || !*v) {
            fprintf(stderr, "hypic-engine serve: %s:%d: %s '%s'\n", path,
                    lineno, dst ? "missing value for" : "unknown setting", s);
            fclose(f);
            return -1;
        }
        if (!*dst && n < 8) {
            store[n] = strdup(v);
            *dst = store[n++];
        }
    }
    fclose(f);
    return 0;
}

static void log_line(const char *level, const char *msg)
{
    char ts[32];
    time_t t = time(NULL);
    strftime(ts, sizeof(ts), "%Y-%m-%dT%H:%M:%S", gmtime(&t));
    fprintf(stderr, "%s [%s] %s\n", ts, level, msg);
}

int hp_cmd_serve(int argc, char **argv)
{
    serve_opts_t o = {0};
    const char *config = NULL;
    char *store[8] = {0};
    hp_llm_t llm;
    hp_error_t err = {0};
    char msg[1400];

    for (int i = 1; i < argc; i++) {
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(argv[i], "--help")) {
            printf("usage: hypic-engine serve [--config F] --model DIR "
                   "--socket PATH [--redis HOST:PORT] [--node ID]\n");
            return 0;
        }
        const char **dst = !strcmp(argv[i], "--config")   ? &config
                           : !strcmp(argv[i], "--model")  ? &o.model
                           : !strcmp(argv[i], "--socket") ? &o.socket
                           : !strcmp(argv[i], "--redis")  ? &o.redis
                           : !strcmp(argv[i], "--node")   ? &o.node
                                                          : NULL;
        if (!dst || !v) {
            fprintf(stderr, "hypic-engine serve: %s '%s'\n",
                    dst ? "missing value for" : "unknown option", argv[i]);
            return 2;
        }
        *dst = v;
        i++;
    }
    if (config && read_config(config, &o, store) != 0)
        return 2;
    if (!o.model || !o.socket) {
        fprintf(stderr, "hypic-engine serve: model and socket are required "
                        "(flags or config file)\n");
        return 2;
    }
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    if (strlen(o.socket) >= sizeof(addr.sun_path)) {
        fprintf(stderr, "hypic-engine serve: socket path too long\n");
        return 2;
    }
    strcpy(addr.sun_path, o.socket);

    if (hp_llm_load(&llm, o.model, &err) != HP_OK) {
        fprintf(stderr, "hypic-engine serve: %s\n", err.msg);
        return 1;
    }
    snprintf(msg, sizeof(msg), "model %s loaded (%d layers, hidden %d)",
             o.model, llm.model.cfg.n_layers, llm.model.cfg.hidden);
    log_line("info", msg);

    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    unlink(o.socket);
    if (fd < 0 || bind(fd, (struct sockaddr *)&addr, sizeof(addr)) != 0 ||
        listen(fd, 64) != 0) {
        fprintf(stderr, "hypic-engine serve: cannot listen on %s: %s\n",
                o.socket, strerror(errno));
        hp_llm_free(&llm);
        return 1;
    }
    struct sigaction sa = {.sa_handler = on_signal};
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
    snprintf(msg, sizeof(msg), "listening on %s", o.socket);
    log_line("info", msg);

    while (!stop_flag) {
        int c = accept(fd, NULL, NULL);
        if (c < 0) {
            if (errno != EINTR)
                log_line("error", strerror(errno));
            continue;
        }
        char buf[256];
        ssize_t n = read(c, buf, sizeof(buf) - 1);
        if (n > 0) {
            buf[n] = '\0';
            const char *reply =
                !strncmp(buf, "HEALTH", 6)
                    ? "{\"status\":\"ok\"}\n"
                    : "{\"error\":\"unknown command\"}\n";
            if (write(c, reply, strlen(reply)) < 0)
                log_line("warn", "client went away");
        }
        close(c);
    }
    log_line("info", "shutting down");
    close(fd);
    unlink(o.socket);
    hp_llm_free(&llm);
    for (int i = 0; i < 8; i++)
        free(store[i]);
    return 0;
}
