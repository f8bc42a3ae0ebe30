/* ipc_server.c - the engine's end of the request interface (see
 * ipc_server.h and, for the protocol, hp_ipc.h). */
#include "engine/serve/ipc_server.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <poll.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "engine/contract/hp_ipc.h"

#define SWEEP_MS      1000
#define DRAIN_LOOK_MS 50

/* Why requests are refused once the engine drains: at take, and those
 * the scheduler has queued but not started. */
#define DRAINING_MSG                                                           \
    "the engine is draining before it shuts down and takes no new requests"

typedef struct {
    int fd;
    uint32_t id; /* owner id in slot words */
    pid_t pid;   /* the worker, from SO_PEERCRED */
    int notify;  /* a wake-up byte is due */
} conn_t;

/* The engine's side of one slot: the scheduler request's user data. */
typedef struct {
    hp_ipc_server_t *srv;
    hp_ipc_slot_t *slot;
    uint64_t word;      /* the RUNNING word of the current request */
    atomic_int dirty;   /* new records since the last wake-up */
    atomic_int aborted; /* hp_ipc_server_abort: end it with an error */
    char id[HP_IPC_ID_BYTES];
} job_t;

struct hp_ipc_server {
    hp_ipc_server_cfg_t cfg;
    char *socket_path, *shm_name, *node, *model; /* owned copies */
    int listen_fd, event_fd, shm_fd;
    hp_ipc_header_t *h;
    uint64_t bytes, generation;
    hp_sched_t *sched;
    conn_t *conns;
    int n_conns, cap_conns;
    uint32_t next_conn;
    job_t *jobs; /* [slots] */
    int64_t last_sweep;
    int seam; /* for requests that leave it to us; < 0: the scheduler's */
    int draining;
    int64_t deadline; /* of the drain, hp_ipc_server_now_ms */
    char abort_msg[256];
};

int64_t hp_ipc_server_now_ms(void)
{
    return (int64_t)hp_ipc_now_ms();
}

static void logf_(hp_ipc_server_t *s, int level, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void logf_(hp_ipc_server_t *s, int level, const char *fmt, ...)
{
    char msg[600];
    va_list ap;
    if (!s->cfg.log)
        return;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    s->cfg.log(s->cfg.log_ud, level, msg);
}

/* ---- setup ----------------------------------------------------------- */

/* The generation counter survives the data segment: a tiny segment of
 * its own, bumped once per start. */
static uint64_t bump_generation(const char *shm_name)
{
    char name[HP_IPC_NAME_BYTES + 8];
    uint64_t gen = 1;
    snprintf(name, sizeof(name), "%s.gen", shm_name);
    int fd = shm_open(name, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (fd < 0)
        return gen;
    struct stat st;
    if (fstat(fd, &st) == 0 && (st.st_size >= (off_t)sizeof(uint64_t) ||
                                ftruncate(fd, sizeof(uint64_t)) == 0)) {
        _Atomic uint64_t *p = mmap(NULL, sizeof(uint64_t),
                                   PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        if (p != MAP_FAILED) {
            gen = atomic_fetch_add(p, 1) + 1;
            munmap((void *)p, sizeof(uint64_t));
        }
    }
    close(fd);
    return gen;
}

static int open_shm(hp_ipc_server_t *s, hp_error_t *err)
{
    const hp_ipc_server_cfg_t *c = &s->cfg;

    s->bytes = hp_ipc_segment_bytes(c->slots, c->input_bytes, c->ring_bytes);
    s->generation = bump_generation(s->shm_name);
    /* a segment left by a crashed engine is replaced, never reused */
    shm_unlink(s->shm_name);
    s->shm_fd =
        shm_open(s->shm_name, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (s->shm_fd < 0)
        return hp_error_set(err, HP_EIO, "shared memory %s: %s", s->shm_name,
                            strerror(errno));
    if (ftruncate(s->shm_fd, (off_t)s->bytes) != 0)
        return hp_error_set(err, HP_EIO, "shared memory %s: %s", s->shm_name,
                            strerror(errno));
    /* reserve the pages now: a full /dev/shm is an error at start, not a
     * SIGBUS in the middle of a request */
    int rc = posix_fallocate(s->shm_fd, 0, (off_t)s->bytes);
    if (rc != 0)
        return hp_error_set(
            err, HP_EIO, "shared memory %s: cannot reserve %llu bytes: %s",
            s->shm_name, (unsigned long long)s->bytes, strerror(rc));
    s->h =
        mmap(NULL, s->bytes, PROT_READ | PROT_WRITE, MAP_SHARED, s->shm_fd, 0);
    if (s->h == MAP_FAILED) {
        s->h = NULL;
        return hp_error_set(err, HP_EIO, "shared memory %s: mmap: %s",
                            s->shm_name, strerror(errno));
    }
    if (hp_ipc_format(s->h, c->slots, c->input_bytes, c->ring_bytes,
                      s->generation, (int32_t)getpid(), s->node, s->model) != 0)
        return hp_error_set(err, HP_EBADINPUT, "bad slot geometry");
    /* before the socket listens: every worker that maps it sees it */
    if (c->fingerprint)
        memcpy(s->h->fingerprint, c->fingerprint, sizeof(s->h->fingerprint));
    snprintf(s->h->device, sizeof(s->h->device), "%s",
             c->device ? c->device : "");
    snprintf(s->h->device_name, sizeof(s->h->device_name), "%s",
             c->device_name ? c->device_name : "");
    return HP_OK;
}

static int open_socket(hp_ipc_server_t *s, hp_error_t *err)
{
    struct sockaddr_un addr = {.sun_family = AF_UNIX};

    if (strlen(s->socket_path) >= sizeof(addr.sun_path))
        return hp_error_set(err, HP_EBADINPUT, "socket path too long: %s",
                            s->socket_path);
    strcpy(addr.sun_path, s->socket_path);

    /* refuse to steal the socket of an engine that still answers */
    int probe = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (probe >= 0) {
        int live = connect(probe, (struct sockaddr *)&addr, sizeof(addr)) == 0;
        close(probe);
        if (live)
            return hp_error_set(err, HP_EIO, "another engine is serving on %s",
                                s->socket_path);
    }
    /*
     * Bound and listening under a temporary name, then renamed into place:
     * the socket appears only once it accepts, so a client (or a test
     * waiting for the file) never meets a socket that refuses.
     */
    struct sockaddr_un tmp = addr;
    int n = snprintf(tmp.sun_path, sizeof(tmp.sun_path), "%s.%d",
                     s->socket_path, (int)getpid());
    int renamed = n > 0 && (size_t)n < sizeof(tmp.sun_path);
    if (!renamed)
        tmp = addr;
    unlink(tmp.sun_path);
    s->listen_fd =
        socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (s->listen_fd < 0 ||
        bind(s->listen_fd, (struct sockaddr *)&tmp, sizeof(tmp)) != 0 ||
        listen(s->listen_fd, 128) != 0 ||
        (renamed && rename(tmp.sun_path, s->socket_path) != 0)) {
        int e = errno;
        if (renamed)
            unlink(tmp.sun_path);
        return hp_error_set(err, HP_EIO, "cannot listen on %s: %s",
                            s->socket_path, strerror(e));
    }
    return HP_OK;
}

int hp_ipc_server_open(hp_ipc_server_t **out, const hp_ipc_server_cfg_t *cfg,
                       hp_error_t *err)
{
    hp_ipc_server_t *s;
    int rc;

    *out = NULL;
    if (!cfg->socket_path || !cfg->shm_name || cfg->shm_name[0] != '/' ||
        strchr(cfg->shm_name + 1, '/') ||
        strlen(cfg->shm_name) >= HP_IPC_NAME_BYTES)
        return hp_error_set(err, HP_EBADINPUT,
                            "shm name must be \"/name\", under %d bytes, "
                            "without another \"/\"",
                            HP_IPC_NAME_BYTES);
    if (cfg->slots == 0 || cfg->slots > 65536)
        return hp_error_set(err, HP_EBADINPUT, "slots must be 1..65536");
    if (cfg->input_bytes == 0 || cfg->input_bytes % 64)
        return hp_error_set(err, HP_EBADINPUT,
                            "max_prompt_bytes must be a multiple of 64");
    if (cfg->ring_bytes < HP_IPC_RING_MIN ||
        (cfg->ring_bytes & (cfg->ring_bytes - 1)))
        return hp_error_set(err, HP_EBADINPUT,
                            "ring_bytes must be a power of two >= %d",
                            HP_IPC_RING_MIN);
    s = calloc(1, sizeof(*s));
    if (!s)
        return hp_error_set(err, HP_ENOMEM, "ipc: out of memory");
    s->cfg = *cfg;
    s->listen_fd = s->event_fd = s->shm_fd = -1;
    s->socket_path = strdup(cfg->socket_path);
    s->shm_name = strdup(cfg->shm_name);
    s->node = strdup(cfg->node ? cfg->node : "");
    s->model = strdup(cfg->model ? cfg->model : "");
    s->jobs = calloc(cfg->slots, sizeof(*s->jobs));
    s->next_conn = 1;
    s->seam = -1;
    if (!s->socket_path || !s->shm_name || !s->node || !s->model || !s->jobs) {
        hp_ipc_server_close(s);
        return hp_error_set(err, HP_ENOMEM, "ipc: out of memory");
    }
    if ((rc = open_shm(s, err)) != HP_OK ||
        (rc = open_socket(s, err)) != HP_OK) {
        hp_ipc_server_close(s);
        return rc;
    }
    s->event_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (s->event_fd < 0) {
        rc = hp_error_set(err, HP_EIO, "eventfd: %s", strerror(errno));
        hp_ipc_server_close(s);
        return rc;
    }
    for (uint32_t i = 0; i < cfg->slots; i++) {
        s->jobs[i].srv = s;
        s->jobs[i].slot = hp_ipc_slot(s->h, i);
        atomic_init(&s->jobs[i].dirty, 0);
        atomic_init(&s->jobs[i].aborted, 0);
    }
    *out = s;
    return HP_OK;
}

uint64_t hp_ipc_server_generation(const hp_ipc_server_t *s)
{
    return s->generation;
}

void hp_ipc_server_close(hp_ipc_server_t *s)
{
    if (!s)
        return;
    if (s->h)
        atomic_store(&s->h->health, HP_IPC_HEALTH_DRAINING);
    for (int i = 0; i < s->n_conns; i++)
        close(s->conns[i].fd);
    if (s->listen_fd >= 0) {
        close(s->listen_fd);
        unlink(s->socket_path);
    }
    if (s->event_fd >= 0)
        close(s->event_fd);
    if (s->h)
        munmap(s->h, s->bytes);
    if (s->shm_fd >= 0) {
        close(s->shm_fd);
        shm_unlink(s->shm_name);
    }
    free(s->conns);
    free(s->jobs);
    free(s->socket_path);
    free(s->shm_name);
    free(s->node);
    free(s->model);
    free(s);
}

/* ---- the scheduler's callbacks (scheduler thread) -------------------- */

/* Decode forms and speculation pass between the contract and the
 * scheduler as they are. */
_Static_assert((int)HP_IPC_DECODE_SERVER == HP_SCHED_DECODE_SERVER &&
                   (int)HP_IPC_DECODE_RECURRENT == HP_SCHED_DECODE_RECURRENT &&
                   (int)HP_IPC_DECODE_CHUNKWISE == HP_SCHED_DECODE_CHUNKWISE &&
                   (int)HP_IPC_DECODE_AUTO == HP_SCHED_DECODE_AUTO &&
                   (int)HP_IPC_DECODE_KVONLY == HP_SCHED_DECODE_KVONLY &&
                   (int)HP_IPC_SPEC_ON == HP_SCHED_SPEC_ON &&
                   (int)HP_IPC_SPEC_OFF == HP_SCHED_SPEC_OFF &&
                   HP_IPC_MAX_DRAFT == HP_SCHED_MAX_DRAFT,
               "hp_ipc.h and sched.h agree");

static void job_start(void *ud, const hp_sched_start_t *st)
{
    job_t *j = ud;
    hp_ipc_start_t rec = {
        .prompt_tokens = (uint32_t)st->prompt_tokens,
        .cached_tokens = (uint32_t)st->cached_tokens,
        .mode = (uint32_t)st->mode,
        .segs_hit = (uint32_t)st->segs_hit,
        .segs_total = (uint32_t)st->segs_total,
        .decode = (uint32_t)st->decode,
        .queue_us = st->queue_us > 0 ? (uint64_t)st->queue_us : 0,
    };
    /* the ring is empty at admission: START always fits */
    hp_ipc_ring_put(j->srv->h, j->slot, HP_IPC_REC_START, &rec, sizeof(rec), 0);
    atomic_store(&j->dirty, 1);
}

/* A record that leaves START and FINAL their room: 1 written, 0 the
 * ring is full (the reader is asked for a wake-up when it drains it). */
static int job_put(job_t *j, uint32_t type, const void *rec, uint32_t len)
{
    if (hp_ipc_ring_put(j->srv->h, j->slot, type, rec, len,
                        HP_IPC_RING_RESERVE) != 0) {
        /* full: ask the reader for a wake-up, then look once more in
         * case it drained the ring before seeing the flag */
        atomic_store(&j->slot->waiting, 1);
        if (hp_ipc_ring_put(j->srv->h, j->slot, type, rec, len,
                            HP_IPC_RING_RESERVE) != 0)
            return 0;
        atomic_store(&j->slot->waiting, 0);
    }
    atomic_store(&j->dirty, 1);
    return 1;
}

static size_t job_text(void *ud, int choice, const char *text, size_t len)
{
    job_t *j = ud;
    size_t off = 0;
    unsigned char rec[sizeof(hp_ipc_text_t) + HP_IPC_TEXT_MAX];
    hp_ipc_text_t hd = {.choice = (uint32_t)choice};

    memcpy(rec, &hd, sizeof(hd));
    while (off < len) {
        size_t n = hp_ipc_utf8_cut(text + off, len - off, HP_IPC_TEXT_MAX);
        memcpy(rec + sizeof(hd), text + off, n);
        if (!job_put(j, HP_IPC_REC_TEXT, rec, (uint32_t)(sizeof(hd) + n)))
            break;
        off += n;
    }
    return off;
}

static int job_token(void *ud, const hp_sched_token_t *t)
{
    job_t *j = ud;
    uint32_t len = sizeof(hp_ipc_token_t);
    unsigned char rec[HP_IPC_RECORD_MAX];
    hp_ipc_token_t hd = {
        .choice = (uint32_t)t->choice,
        .text_offset = (uint32_t)t->text_offset,
        .n_top = (uint32_t)t->n_top,
    };

    memcpy(rec, &hd, sizeof(hd));
    hp_ipc_token_add(rec, &len, t->tok.logprob, t->tok.bytes,
                     (uint32_t)t->tok.len);
    for (int i = 0; i < t->n_top && i < HP_IPC_MAX_LOGPROBS; i++)
        hp_ipc_token_add(rec, &len, t->top[i].logprob, t->top[i].bytes,
                         (uint32_t)t->top[i].len);
    return job_put(j, HP_IPC_REC_TOKEN, rec, len);
}

static int job_end(void *ud, int choice, hp_finish_t finish, int tokens)
{
    hp_ipc_end_t rec = {
        .choice = (uint32_t)choice,
        .finish = finish == HP_FINISH_STOP ? HP_IPC_FINISH_STOP
                                           : HP_IPC_FINISH_LENGTH,
        .completion_tokens = (uint32_t)tokens,
    };
    return job_put(ud, HP_IPC_REC_END, &rec, sizeof(rec));
}

static int job_cancelled(void *ud)
{
    job_t *j = ud;
    return atomic_load_explicit(&j->slot->cancel, memory_order_acquire) ||
           atomic_load(&j->aborted);
}

/* FINAL, then the slot goes back (the reader frees it after reading). */
static void job_final(job_t *j, const hp_sched_final_t *f, int status,
                      const char *msg)
{
    hp_ipc_final_t rec;

    memset(&rec, 0, sizeof(rec));
    rec.status = status;
    if (status != HP_OK) {
        rec.finish = HP_IPC_FINISH_ERROR;
        snprintf(rec.code, sizeof(rec.code), "%s", hp_ipc_error(status)->code);
        snprintf(rec.message, sizeof(rec.message), "%s", msg);
    } else {
        rec.finish = f->finish == HP_FINISH_STOP ? HP_IPC_FINISH_STOP
                                                 : HP_IPC_FINISH_LENGTH;
    }
    if (f) {
        rec.prompt_tokens = (uint32_t)f->prompt_tokens;
        rec.completion_tokens = (uint32_t)f->completion_tokens;
        rec.cached_tokens = (uint32_t)f->cached_tokens;
        rec.fetched_tokens = (uint32_t)f->fetched_tokens;
        rec.mode = (uint32_t)f->mode;
        rec.segs_hit = (uint32_t)f->segs_hit;
        rec.segs_total = (uint32_t)f->segs_total;
        rec.decode = (uint32_t)f->decode;
        rec.draft_tokens = (uint32_t)f->draft_tokens;
        rec.accepted_tokens = (uint32_t)f->accepted_tokens;
        rec.ttft_us = f->ttft_us > 0 ? (uint64_t)f->ttft_us : 0;
        rec.total_us = f->total_us > 0 ? (uint64_t)f->total_us : 0;
    }
    /* TEXT writers leave HP_IPC_RING_RESERVE free: FINAL always fits */
    hp_ipc_ring_put(j->srv->h, j->slot, HP_IPC_REC_FINAL, &rec, sizeof(rec), 0);
    logf_(j->srv, HP_LOG_DEBUG, "request %s done: %s, %u tokens", j->id,
          status != HP_OK                    ? rec.code
          : rec.finish == HP_IPC_FINISH_STOP ? "stop"
                                             : "length",
          rec.completion_tokens);
    atomic_fetch_add(&j->srv->h->served, 1);
    atomic_store(&j->dirty, 1);
    hp_ipc_finish(j->slot);
}

static void job_done(void *ud, const hp_sched_final_t *f)
{
    job_t *j = ud;
    if (f->finish == HP_FINISH_CANCEL && atomic_load(&j->aborted) &&
        !atomic_load(&j->slot->cancel)) {
        /* ended by the engine while its reader waits: say why */
        job_final(j, f, HP_EUNAVAIL, j->srv->abort_msg);
        return;
    }
    if (f->finish == HP_FINISH_CANCEL) {
        /* nobody reads any more: just give the slot back */
        hp_ipc_finish(j->slot);
        return;
    }
    job_final(j, f, f->status, f->status != HP_OK ? f->err.msg : "");
}

static const hp_sched_ops_t job_ops = {
    .start = job_start,
    .text = job_text,
    .cancelled = job_cancelled,
    .done = job_done,
    .token = job_token,
    .end = job_end,
};

void hp_ipc_server_pool(hp_ipc_server_t *s, int pool, uint64_t bytes_used,
                        uint64_t budget, uint64_t entries, uint64_t evictions)
{
    hp_ipc_pool_gauges_t *g = &s->h->pools[pool];
    atomic_store_explicit(&g->bytes_used, bytes_used, memory_order_relaxed);
    atomic_store_explicit(&g->budget, budget, memory_order_relaxed);
    atomic_store_explicit(&g->entries, entries, memory_order_relaxed);
    atomic_store_explicit(&g->evictions, evictions, memory_order_relaxed);
}

void hp_ipc_server_flush(void *ud, const hp_sched_stats_t *st)
{
    hp_ipc_server_t *s = ud;
    uint64_t one = 1;
    atomic_store_explicit(&s->h->running, (uint32_t)st->running,
                          memory_order_relaxed);
    atomic_store_explicit(&s->h->queued, (uint32_t)st->queued,
                          memory_order_relaxed);
    /* the main loop turns dirty slots into wake-up bytes */
    if (write(s->event_fd, &one, sizeof(one)) < 0 && errno != EAGAIN)
        logf_(s, HP_LOG_ERROR, "eventfd: %s", strerror(errno));
}

/* ---- the main loop --------------------------------------------------- */

static conn_t *find_conn(hp_ipc_server_t *s, uint32_t id)
{
    for (int i = 0; i < s->n_conns; i++)
        if (s->conns[i].id == id)
            return &s->conns[i];
    return NULL;
}

static void send_hello(hp_ipc_server_t *s, conn_t *c)
{
    hp_ipc_hello_t hello;
    union {
        struct cmsghdr h;
        char buf[CMSG_SPACE(sizeof(int))];
    } ctl;
    struct iovec iov = {.iov_base = &hello, .iov_len = sizeof(hello)};
    struct msghdr msg = {.msg_iov = &iov,
                         .msg_iovlen = 1,
                         .msg_control = ctl.buf,
                         .msg_controllen = sizeof(ctl.buf)};

    memset(&hello, 0, sizeof(hello));
    memset(&ctl, 0, sizeof(ctl));
    hello.magic = HP_IPC_MAGIC;
    hello.version = HP_IPC_VERSION;
    hello.generation = s->generation;
    hello.shm_bytes = s->bytes;
    hello.conn_id = c->id;
    hello.engine_pid = (int32_t)getpid();
    snprintf(hello.shm_name, sizeof(hello.shm_name), "%s", s->shm_name);
    struct cmsghdr *cm = CMSG_FIRSTHDR(&msg);
    cm->cmsg_level = SOL_SOCKET;
    cm->cmsg_type = SCM_RIGHTS;
    cm->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(cm), &s->shm_fd, sizeof(int));
    /* a fresh socket's buffer takes ~100 bytes: this never blocks */
    if (sendmsg(c->fd, &msg, MSG_NOSIGNAL) != (ssize_t)sizeof(hello))
        logf_(s, HP_LOG_WARN, "hello to worker %d failed: %s", (int)c->pid,
              strerror(errno));
}

static void accept_conns(hp_ipc_server_t *s)
{
    for (;;) {
        int fd =
            accept4(s->listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno != EAGAIN && errno != EINTR && errno != ECONNABORTED)
                logf_(s, HP_LOG_ERROR, "accept: %s", strerror(errno));
            return;
        }
        if (s->n_conns == s->cap_conns) {
            int cap = s->cap_conns ? 2 * s->cap_conns : 16;
            conn_t *c = realloc(s->conns, (size_t)cap * sizeof(*c));
            if (!c) {
                logf_(s, HP_LOG_ERROR, "out of memory for a connection");
                close(fd);
                continue;
            }
            s->conns = c;
            s->cap_conns = cap;
        }
        struct ucred cred = {0};
        socklen_t cl = sizeof(cred);
        getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &cl);
        conn_t *c = &s->conns[s->n_conns++];
        c->fd = fd;
        c->pid = cred.pid;
        c->notify = 0;
        /* owner ids are never 0 and never reused while a slot may hold
         * one: 16M connections per engine life before wrapping */
        do {
            c->id = s->next_conn++;
            if (s->next_conn > HP_IPC_OWNER_MAX)
                s->next_conn = 1;
        } while (find_conn(s, c->id) != c);
        send_hello(s, c);
        logf_(s, HP_LOG_INFO, "worker %d connected (connection %u)",
              (int)c->pid, c->id);
    }
}

/* Gives back every slot held by owner (a connection that closed). */
static int reclaim_owner(hp_ipc_server_t *s, uint32_t owner)
{
    int n = 0;
    for (uint32_t i = 0; i < s->cfg.slots; i++) {
        hp_ipc_slot_t *sl = hp_ipc_slot(s->h, i);
        uint64_t w = atomic_load(&sl->word);
        if (HP_IPC_STATE(w) == HP_IPC_FREE || HP_IPC_OWNER(w) != owner)
            continue;
        /* RUNNING: the scheduler sees cancel and frees it when it ends */
        if (hp_ipc_release(sl, HP_IPC_SEQ(w)) >= 0)
            n++;
    }
    return n;
}

static void close_conn(hp_ipc_server_t *s, int i)
{
    conn_t c = s->conns[i];
    close(c.fd);
    s->conns[i] = s->conns[--s->n_conns];
    int n = reclaim_owner(s, c.id);
    logf_(s, n ? HP_LOG_WARN : HP_LOG_INFO,
          "worker %d disconnected (connection %u), %d request(s) cancelled",
          (int)c.pid, c.id, n);
    if (n)
        hp_sched_kick(s->sched);
}

/*
 * Slots whose owner is gone without a goodbye: a connection id that is
 * not live (closed while we were not looking), or a worker pid that no
 * longer exists. Only past CLAIMED is owner_pid trustworthy.
 */
static void sweep(hp_ipc_server_t *s)
{
    int n = 0;
    for (uint32_t i = 0; i < s->cfg.slots; i++) {
        hp_ipc_slot_t *sl = hp_ipc_slot(s->h, i);
        uint64_t w = atomic_load(&sl->word);
        uint32_t st = HP_IPC_STATE(w);
        if (st == HP_IPC_FREE || atomic_load(&sl->cancel))
            continue;
        int dead = find_conn(s, HP_IPC_OWNER(w)) == NULL;
        if (!dead && st != HP_IPC_CLAIMED && sl->owner_pid > 0 &&
            kill(sl->owner_pid, 0) != 0 && errno == ESRCH)
            dead = 1;
        if (dead && hp_ipc_release(sl, HP_IPC_SEQ(w)) >= 0)
            n++;
    }
    if (n) {
        logf_(s, HP_LOG_WARN, "reclaimed %d slot(s) of workers that died", n);
        hp_sched_kick(s->sched);
    }
}

typedef struct {
    uint64_t ticket;
    uint32_t index;
} pending_t;

static int by_ticket(const void *a, const void *b)
{
    const pending_t *x = a, *y = b;
    return x->ticket < y->ticket ? -1 : x->ticket > y->ticket;
}

/* A request nginx sent that we refuse before the scheduler sees it. */
static void refuse(hp_ipc_server_t *s, job_t *j, int status, const char *msg)
{
    logf_(s, HP_LOG_INFO, "request %s refused: %s", j->id, msg);
    job_final(j, NULL, status, msg);
}

static void take_one(hp_ipc_server_t *s, uint32_t index)
{
    job_t *j = &s->jobs[index];
    hp_ipc_slot_t *sl = j->slot;
    hp_ipc_request_t rq;
    char stop[HP_IPC_MAX_STOP][HP_IPC_STOP_BYTES + 1];
    char sep[HP_IPC_SEP_BYTES + 1];
    hp_error_t err = {0};

    if (hp_ipc_take(sl, &j->word) != 0)
        return;
    atomic_store(&j->aborted, 0);
    /* our copy: what we check is what we use */
    memcpy(&rq, &sl->req, sizeof(rq));
    memcpy(j->id, rq.id, sizeof(j->id));
    j->id[sizeof(j->id) - 1] = '\0';
    if (s->draining) {
        refuse(s, j, HP_EUNAVAIL, DRAINING_MSG);
        return;
    }
    logf_(s, HP_LOG_DEBUG, "request %s: slot %u, mode %u, %u prompt bytes",
          j->id, index, rq.mode, rq.prompt_len);
    if (rq.prompt_len > s->cfg.input_bytes ||
        rq.grammar_len > s->cfg.input_bytes - rq.prompt_len ||
        rq.n_stop > HP_IPC_MAX_STOP || rq.sep_len > HP_IPC_SEP_BYTES ||
        !(rq.temperature >= 0.0f) || !isfinite(rq.temperature) ||
        !(rq.top_p > 0.0f && rq.top_p <= 1.0f) || rq.top_k < 0 ||
        rq.decode > HP_IPC_DECODE_AUTO || rq.speculative > HP_IPC_SPEC_OFF ||
        rq.max_draft > HP_IPC_MAX_DRAFT || rq.n > HP_IPC_MAX_CHOICES ||
        rq.logprobs > 1 + HP_IPC_MAX_LOGPROBS) {
        refuse(s, j, HP_EBADINPUT, "malformed request in shared memory");
        return;
    }
    /* a chat request becomes its prompt here, off nginx's event loop,
     * in the thread that tokenizes it next */
    char *text = NULL;
    size_t text_len = 0;
    if (rq.flags & HP_IPC_FLAG_CHAT) {
        if (!s->cfg.chat) {
            refuse(s, j, HP_EUNAVAIL, "this engine renders no chat template");
            return;
        }
        if (hp_chat_render(s->cfg.chat, hp_ipc_input(s->h, sl), rq.prompt_len,
                           &text, &text_len, &err) != HP_OK) {
            refuse(s, j, err.code, err.msg);
            return;
        }
    }
    hp_sched_req_t req = {
        .prompt = text ? text : hp_ipc_input(s->h, sl),
        .prompt_len = text ? text_len : rq.prompt_len,
        .mode = (int)rq.mode,
        .seam = rq.seam <= 256 ? (int)rq.seam : s->seam,
        .decode = (int)rq.decode, /* same numbers (asserted above) */
        .speculative = (int)rq.speculative,
        .max_draft = (int)rq.max_draft,
        .n = (int)rq.n,
        .grammar = hp_ipc_input(s->h, sl) + rq.prompt_len,
        .grammar_len = rq.grammar_len,
        .ops = &job_ops,
        .ud = j,
    };
    /* tool calls as the template teaches them; a prompt that leaves a
     * thought open lets the model finish it before the constrained part */
    req.grammar_opts.tools = s->cfg.chat && hp_chat_tool_xml(s->cfg.chat)
                                 ? HP_GRAMMAR_TOOLS_XML
                                 : HP_GRAMMAR_TOOLS_JSON;
    req.grammar_opts.thinking =
        req.prompt_len >= 8 &&
        !memcmp(req.prompt + req.prompt_len - 8, "<think>\n", 8);
    req.gen.max_tokens =
        (int)(rq.max_tokens > 1000000 ? 1000000 : rq.max_tokens);
    req.gen.sampling.temperature = rq.temperature;
    req.gen.sampling.top_p = rq.top_p;
    req.gen.sampling.top_k = rq.top_k;
    req.gen.sampling.seed = rq.seed;
    req.gen.ignore_eos = (rq.flags & HP_IPC_FLAG_IGNORE_EOS) != 0;
    req.gen.logprobs = rq.logprobs > 0;
    req.gen.top_logprobs = rq.logprobs > 0 ? (int)rq.logprobs - 1 : 0;
    for (uint32_t i = 0; i < rq.n_stop; i++) {
        uint32_t n = rq.stop_len[i] < HP_IPC_STOP_BYTES ? rq.stop_len[i]
                                                        : HP_IPC_STOP_BYTES;
        memcpy(stop[i], rq.stop[i], n);
        stop[i][n] = '\0';
        req.gen.stop[req.gen.n_stop++] = stop[i];
    }
    memcpy(sep, rq.separator, rq.sep_len);
    sep[rq.sep_len] = '\0';
    req.separator = sep;

    int rc = hp_sched_submit(s->sched, &req, &err);
    free(text);
    if (rc != HP_OK)
        refuse(s, j, err.code, err.msg);
}

/* Submitted slots go to the scheduler in ticket (submission) order. */
static void take_submitted(hp_ipc_server_t *s, pending_t *p)
{
    uint32_t n = 0;
    for (uint32_t i = 0; i < s->cfg.slots; i++) {
        hp_ipc_slot_t *sl = hp_ipc_slot(s->h, i);
        uint64_t w = atomic_load(&sl->word);
        if (HP_IPC_STATE(w) == HP_IPC_SUBMITTED) {
            p[n].ticket = sl->ticket;
            p[n].index = i;
            n++;
        }
    }
    qsort(p, n, sizeof(*p), by_ticket);
    for (uint32_t i = 0; i < n; i++)
        take_one(s, p[i].index);
}

/* Dirty slots become one wake-up byte per connection that owns them. */
static void notify(hp_ipc_server_t *s)
{
    for (uint32_t i = 0; i < s->cfg.slots; i++) {
        job_t *j = &s->jobs[i];
        if (!atomic_exchange(&j->dirty, 0))
            continue;
        conn_t *c = find_conn(s, HP_IPC_OWNER(j->word));
        if (c)
            c->notify = 1;
    }
    for (int i = 0; i < s->n_conns; i++) {
        conn_t *c = &s->conns[i];
        if (!c->notify)
            continue;
        c->notify = 0;
        /* EAGAIN: bytes are already waiting, the worker will wake */
        if (send(c->fd, "W", 1, MSG_NOSIGNAL | MSG_DONTWAIT) < 0 &&
            errno != EAGAIN)
            logf_(s, HP_LOG_WARN, "wake-up to worker %d: %s", (int)c->pid,
                  strerror(errno));
    }
}

/* ---- draining -------------------------------------------------------- */

void hp_ipc_server_drain(hp_ipc_server_t *s, int64_t deadline_ms)
{
    s->draining = 1;
    s->deadline = deadline_ms;
    atomic_store(&s->h->health, HP_IPC_HEALTH_DRAINING);
    /* queued, not started: refused now, not at the deadline */
    if (s->sched)
        hp_sched_drain(s->sched, HP_EUNAVAIL, DRAINING_MSG);
}

int hp_ipc_server_busy(const hp_ipc_server_t *s)
{
    int n = 0;
    for (uint32_t i = 0; i < s->cfg.slots; i++) {
        uint32_t st = HP_IPC_STATE(atomic_load(&hp_ipc_slot(s->h, i)->word));
        /* CLAIMED: nginx is still writing it; we would refuse it */
        n +=
            st == HP_IPC_SUBMITTED || st == HP_IPC_RUNNING || st == HP_IPC_DONE;
    }
    return n;
}

void hp_ipc_server_abort(hp_ipc_server_t *s, const char *msg)
{
    int n = 0;
    snprintf(s->abort_msg, sizeof(s->abort_msg), "%s", msg);
    for (uint32_t i = 0; i < s->cfg.slots; i++) {
        job_t *j = &s->jobs[i];
        if (HP_IPC_STATE(atomic_load(&j->slot->word)) == HP_IPC_RUNNING &&
            !atomic_exchange(&j->aborted, 1))
            n++;
    }
    if (n) {
        logf_(s, HP_LOG_WARN, "ending %d request(s) in flight: %s", n, msg);
        if (s->sched)
            hp_sched_kick(s->sched);
    }
}

void hp_ipc_server_set_seam(hp_ipc_server_t *s, int seam)
{
    s->seam = seam;
}

/* ---- the loop ------------------------------------------------------- */

int hp_ipc_server_run(hp_ipc_server_t *s, hp_sched_t *sched,
                      volatile sig_atomic_t *wake, hp_error_t *err)
{
    struct pollfd *fds = NULL;
    pending_t *pend = calloc(s->cfg.slots, sizeof(*pend));
    int cap = 0, rc = HP_OK;

    s->sched = sched;
    s->last_sweep = hp_ipc_server_now_ms();
    if (!pend)
        return hp_error_set(err, HP_ENOMEM, "ipc: out of memory");
    while (!*wake) {
        int64_t now = hp_ipc_server_now_ms(), wait = HP_IPC_HEARTBEAT_MS;
        /* alive: nginx tells a stalled engine by this going stale */
        hp_ipc_beat(s->h, (uint64_t)now);
        if (s->draining) {
            if (now >= s->deadline || hp_ipc_server_busy(s) == 0)
                break;
            /* a reader frees its slot without a wake-up: look again soon,
             * only while draining */
            wait = s->deadline - now < DRAIN_LOOK_MS ? s->deadline - now
                                                     : DRAIN_LOOK_MS;
        }
        if (cap < s->n_conns + 2) {
            cap = s->n_conns + 18;
            struct pollfd *f = realloc(fds, (size_t)cap * sizeof(*f));
            if (!f) {
                rc = hp_error_set(err, HP_ENOMEM, "ipc: out of memory");
                break;
            }
            fds = f;
        }
        fds[0] = (struct pollfd){.fd = s->listen_fd, .events = POLLIN};
        fds[1] = (struct pollfd){.fd = s->event_fd, .events = POLLIN};
        int n_conns = s->n_conns;
        for (int i = 0; i < n_conns; i++)
            fds[2 + i] =
                (struct pollfd){.fd = s->conns[i].fd, .events = POLLIN};
        struct timespec ts = {wait / 1000, (wait % 1000) * 1000000};
        int n = ppoll(fds, (nfds_t)(2 + n_conns), &ts, s->cfg.wait_mask);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            rc = hp_error_set(err, HP_EIO, "poll: %s", strerror(errno));
            break;
        }
        /* on a quiet second, look anyway */
        int rang = n == 0 && hp_ipc_server_now_ms() - s->last_sweep >= SWEEP_MS;

        /* connections first, by fd: closing one reorders s->conns */
        for (int i = n_conns - 1; i >= 0; i--) {
            if (!fds[2 + i].revents)
                continue;
            char buf[256];
            ssize_t r;
            int closed = 0;
            while ((r = recv(fds[2 + i].fd, buf, sizeof(buf), MSG_DONTWAIT)) >
                   0)
                rang = 1;
            if (r == 0 || (r < 0 && errno != EAGAIN && errno != EINTR))
                closed = 1;
            if (closed)
                close_conn(s, i);
        }
        if (fds[0].revents & POLLIN)
            accept_conns(s);
        if (rang) {
            take_submitted(s, pend);
            hp_sched_kick(sched); /* cancels and drained rings */
        }
        if (fds[1].revents & POLLIN) {
            uint64_t v;
            if (read(s->event_fd, &v, sizeof(v)) < 0 && errno != EAGAIN)
                logf_(s, HP_LOG_ERROR, "eventfd: %s", strerror(errno));
        }
        /* refusals above made slots dirty too */
        notify(s);
        if (hp_ipc_server_now_ms() - s->last_sweep >= SWEEP_MS) {
            s->last_sweep = hp_ipc_server_now_ms();
            sweep(s);
        }
    }
    free(fds);
    free(pend);
    return rc;
}
