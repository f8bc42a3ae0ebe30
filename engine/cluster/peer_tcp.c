/*
 * peer_tcp.c - the peer transport over TCP (peer.h): a listener thread
 * that serves the local public pool, one thread per connection (at most
 * max_conns), and a blocking client with one deadline per call.
 *
 * Every socket is non-blocking and every wait is a poll() bounded by a
 * deadline, so neither a dead peer nor a stalled client holds a thread
 * past its timeout. The listener is woken by a pipe; stop shuts down the
 * open connections, which ends their reads.
 */
#include "engine/cluster/peer.h"

#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <omp.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#define XXH_STATIC_LINKING_ONLY
#include <xxhash.h>

#include "engine/cache/segcache.h"
#include "engine/forward/forward.h"

#define DEF_MAX_REQ (16u << 20)
#define DEF_IO_MS   5000
#define DEF_CONNS   16
#define DEF_SEGMENT 4096
#define MAX_ERR_MSG 4096 /* longest ERROR reply the client reads */

/* ---- time and I/O -------------------------------------------------------- */

static int64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Waits for `ev` on fd until the deadline: 1 ready, 0 timed out, -1
 * error. */
static int wait_fd(int fd, short ev, int64_t deadline)
{
    for (;;) {
        int64_t left = deadline - now_ms();
        if (left <= 0)
            return 0;
        struct pollfd p = {fd, ev, 0};
        int r = poll(&p, 1, left > 1000000 ? 1000000 : (int)left);
        if (r > 0)
            return 1;
        if (r == 0)
            continue; /* re-check the clock */
        if (errno != EINTR)
            return -1;
    }
}

/* Reads exactly n bytes. HP_OK; HP_EUNAVAIL (closed: *eof = 1 when
 * nothing at all was read), HP_ETIMEOUT, HP_EIO. */
static int read_full(int fd, void *buf, size_t n, int64_t deadline, int *eof,
                     hp_error_t *err)
{
    size_t got = 0;
    if (eof)
        *eof = 0;
    while (got < n) {
        ssize_t r = recv(fd, (char *)buf + got, n - got, 0);
        if (r > 0) {
            got += (size_t)r;
            continue;
        }
        if (r == 0) {
            if (eof && got == 0)
                *eof = 1;
            return hp_error_set(err, HP_EUNAVAIL,
                                "peer: connection closed after %zu of %zu "
                                "bytes",
                                got, n);
        }
        if (errno == EINTR)
            continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK)
            return hp_error_set(err, HP_EIO, "peer: recv: %s", strerror(errno));
        int w = wait_fd(fd, POLLIN, deadline);
        if (w == 0)
            return hp_error_set(err, HP_ETIMEOUT, "peer: read timed out");
        if (w < 0)
            return hp_error_set(err, HP_EIO, "peer: poll: %s", strerror(errno));
    }
    return HP_OK;
}

/* Writes iov[n] in full (the iovecs are consumed). */
static int write_full(int fd, struct iovec *iov, int n, int64_t deadline,
                      hp_error_t *err)
{
    while (n > 0) {
        struct msghdr mh = {.msg_iov = iov, .msg_iovlen = (size_t)n};
        ssize_t r = sendmsg(fd, &mh, MSG_NOSIGNAL);
        if (r < 0) {
            if (errno == EINTR)
                continue;
            if (errno != EAGAIN && errno != EWOULDBLOCK)
                return hp_error_set(err, HP_EUNAVAIL, "peer: send: %s",
                                    strerror(errno));
            int w = wait_fd(fd, POLLOUT, deadline);
            if (w == 0)
                return hp_error_set(err, HP_ETIMEOUT, "peer: write timed out");
            if (w < 0)
                return hp_error_set(err, HP_EIO, "peer: poll: %s",
                                    strerror(errno));
            continue;
        }
        size_t left = (size_t)r;
        while (n > 0 && left >= iov->iov_len) {
            left -= iov->iov_len;
            iov++;
            n--;
        }
        if (n > 0) {
            iov->iov_base = (char *)iov->iov_base + left;
            iov->iov_len -= left;
        }
    }
    return HP_OK;
}

/* Sends one message: header + parts. */
static int send_msg(int fd, int type, const void *const *parts,
                    const size_t *lens, int n, int64_t deadline,
                    hp_error_t *err)
{
    uint8_t hdr[HP_PEER_HDR_BYTES];
    struct iovec iov[4];
    hp_peer_hdr_encode(hdr, type, parts, lens, n);
    iov[0] = (struct iovec){hdr, sizeof(hdr)};
    for (int i = 0; i < n; i++)
        iov[i + 1] = (struct iovec){(void *)parts[i], lens[i]};
    return write_full(fd, iov, n + 1, deadline, err);
}

static int send_error(int fd, int code, const char *msg, int64_t deadline)
{
    uint8_t pre[8] = {0};
    hp_error_t e2;
    for (int i = 0; i < 4; i++)
        pre[i] = (uint8_t)((uint32_t)code >> (8 * i));
    const void *parts[2] = {pre, msg};
    size_t lens[2] = {8, strlen(msg)};
    return send_msg(fd, HP_PEER_ERROR, parts, lens, 2, deadline, &e2);
}

/* After an ERROR reply: no more writes, and whatever the peer still
 * sends is read and dropped for a moment, so closing with unread bytes
 * does not reset the connection before the peer has read the reply. */
static void linger_close(int fd)
{
    char buf[4096];
    int64_t deadline = now_ms() + 200;
    size_t drained = 0;
    shutdown(fd, SHUT_WR);
    while (drained < (1u << 20) && wait_fd(fd, POLLIN, deadline) == 1) {
        ssize_t r = recv(fd, buf, sizeof(buf), 0);
        if (r <= 0 && !(r < 0 && (errno == EINTR || errno == EAGAIN)))
            break;
        if (r > 0)
            drained += (size_t)r;
    }
}

/* "host:port" or "[v6]:port" into host and port strings. */
static int split_addr(const char *addr, char *host, size_t hn, char *port,
                      size_t pn, hp_error_t *err)
{
    const char *colon = strrchr(addr, ':');
    const char *h = addr, *he = colon;
    if (!colon || !colon[1])
        return hp_error_set(err, HP_EBADINPUT,
                            "peer: address \"%s\" has no "
                            "port",
                            addr);
    if (*addr == '[') {
        h = addr + 1;
        he = strchr(addr, ']');
        if (!he || he + 1 != colon)
            return hp_error_set(err, HP_EBADINPUT, "peer: bad address \"%s\"",
                                addr);
    }
    if ((size_t)(he - h) >= hn || strlen(colon + 1) >= pn)
        return hp_error_set(err, HP_EBADINPUT, "peer: address \"%s\" too long",
                            addr);
    memcpy(host, h, (size_t)(he - h));
    host[he - h] = 0;
    strcpy(port, colon + 1);
    return HP_OK;
}

static void set_nonblock(int fd)
{
    int fl = fcntl(fd, F_GETFL);
    fcntl(fd, F_SETFL, fl | O_NONBLOCK);
}

/* ---- server -------------------------------------------------------------- */

enum { SLOT_FREE = 0, SLOT_RUN, SLOT_DONE };

typedef struct {
    hp_peer_server_t *srv;
    pthread_t th;
    int fd;
    int state; /* under srv->mu */
} slot_t;

struct hp_peer_server {
    hp_peer_server_cfg_t cfg;
    /* on a device: the one workspace and builder sequence of every
     * PREFILL, taken at start (a device runs one build at a time, under
     * hp_backend_lock); on the CPU each connection plans its own */
    int dev;
    hp_fwd_ws_t bws;
    hp_seq_t bseq;
    int lfd, port;
    int wake[2]; /* pipe: a slot finished, or stop */
    pthread_t th;
    pthread_mutex_t mu;
    int stopping;
    slot_t *slots;
    hp_peer_server_stats_t st; /* under mu */
};

static void srv_log(hp_peer_server_t *s, int level, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void srv_log(hp_peer_server_t *s, int level, const char *fmt, ...)
{
    char line[600];
    va_list ap;
    if (!s->cfg.log)
        return;
    va_start(ap, fmt);
    vsnprintf(line, sizeof(line), fmt, ap);
    va_end(ap);
    s->cfg.log(s->cfg.log_ud, level, line);
}

static void count(hp_peer_server_t *s, uint64_t *field)
{
    pthread_mutex_lock(&s->mu);
    (*field)++;
    pthread_mutex_unlock(&s->mu);
}

/* Sends entry e as a SEGMENT reply (the pool's bytes, no copy). */
/* SEGMENT with entry e (held): the header from meta, where it always is
 * (segcache.h), the tensors from the pool, through the host from a
 * device's. */
static int send_entry(hp_peer_server_t *s, int fd, const hp_pool_entry_t *e,
                      int64_t deadline, hp_error_t *err)
{
    uint8_t pre[32];
    size_t hb = sizeof(hp_segc_hdr_t), nb = e->bytes - hb;
    const char *body = (const char *)e->data + hb;
    char *host = NULL;
    if (s->dev) {
        const hp_backend_t *be = s->cfg.llm->model.be;
        if (!(host = malloc(nb ? nb : 1)))
            return hp_error_set(err, HP_ENOMEM, "peer: out of memory");
        hp_backend_lock(be);
        hp_backend_download(be, host, body, nb);
        int rc = hp_backend_sync(be, err);
        hp_backend_unlock(be);
        if (rc != HP_OK) {
            free(host);
            return rc;
        }
        body = host;
    }
    hp_peer_enc_segment(pre, e->key, e->variant, e->bytes);
    const void *parts[3] = {pre, e->meta, body};
    size_t lens[3] = {32, hb, nb};
    int rc = send_msg(fd, HP_PEER_SEGMENT, parts, lens, 3, deadline, err);
    free(host);
    return rc;
}

/* PREFILL: build the entry here (unless present), publish it, reply. */
static int serve_prefill(hp_peer_server_t *s, int fd, const hp_peer_msg_t *m,
                         hp_fwd_ws_t *ws, int64_t deadline)
{
    hp_error_t err = {0};
    const hp_llm_t *llm = s->cfg.llm;
    uint32_t vk = m->variant & 0xffu;
    int pic = m->kind == HP_PEER_KIND_PIC;
    if (!llm)
        return send_error(fd, HP_EUNAVAIL, "this peer has no model to prefill",
                          deadline);
    if ((m->kind != HP_PEER_KIND_STATE && !pic) || (pic != (vk == 3)) ||
        vk < 1 || vk > 3 || m->n_tok == 0 || m->seam < 0 ||
        (pic && (m->n_tok <= 2 * (uint32_t)m->seam ||
                 m->seam != (int)(m->variant >> 8))) ||
        m->n_tok > (uint32_t)(llm->model.cfg.max_positions > 0
                                  ? llm->model.cfg.max_positions
                                  : 1 << 20))
        return send_error(fd, HP_EBADINPUT, "inconsistent PREFILL request",
                          deadline);
    hp_pool_entry_t *e = hp_pool_get(s->cfg.pub, m->key, m->variant);
    if (!e) {
        int *ids = malloc((size_t)m->n_tok * sizeof(int));
        int rc =
            ids ? HP_OK : hp_error_set(&err, HP_ENOMEM, "peer: out of memory");
        for (uint32_t i = 0; ids && i < m->n_tok; i++) {
            const uint8_t *q = m->ids + 4 * i;
            ids[i] = (int)((uint32_t)q[0] | (uint32_t)q[1] << 8 |
                           (uint32_t)q[2] << 16 | (uint32_t)q[3] << 24);
            if (ids[i] < 0 || ids[i] >= llm->model.cfg.vocab_size)
                rc = hp_error_set(&err, HP_EBADINPUT,
                                  "token id %d out of range", ids[i]);
        }
        size_t bytes =
            hp_segc_bytes(&llm->model.cfg, pic ? HP_SEGC_PIC : HP_SEGC_STATE,
                          (int)m->n_tok, m->seam);
        if (rc == HP_OK)
            e = hp_pool_alloc(s->cfg.pub, m->key, m->variant, bytes, &err);
        if (rc == HP_OK && !e)
            rc = err.code ? err.code : HP_ENOMEM;
        if (rc == HP_OK && s->dev && m->n_tok > (uint32_t)s->cfg.max_segment)
            rc = hp_error_set(&err, HP_ETOOLARGE,
                              "a segment of %u tokens is over this peer's "
                              "max_segment (%d)",
                              m->n_tok, s->cfg.max_segment);
        if (rc == HP_OK) {
            const hp_backend_t *be = llm->model.be;
            hp_backend_lock(be); /* a no-op on the CPU */
            rc = pic ? hp_segc_build_pic(e, &llm->model, ws, ids, (int)m->n_tok,
                                         m->seam, &err)
                     : hp_segc_build_state(e, &llm->model, ws, ids,
                                           (int)m->n_tok, &err);
            if (rc == HP_OK)
                rc = hp_backend_sync(be, &err);
            hp_backend_unlock(be);
        }
        free(ids);
        if (rc != HP_OK) {
            hp_pool_release(s->cfg.pub, e);
            return send_error(fd, rc, err.msg, deadline);
        }
        hp_pool_publish(s->cfg.pub, e);
        count(s, &s->st.prefills);
    }
    int rc = send_entry(s, fd, e, deadline, &err);
    hp_pool_release(s->cfg.pub, e);
    if (rc == HP_OK)
        count(s, &s->st.served);
    return rc;
}

static void *conn_main(void *arg)
{
    slot_t *sl = arg;
    hp_peer_server_t *s = sl->srv;
    hp_fwd_ws_t ws;
    uint64_t max = s->cfg.max_payload ? s->cfg.max_payload : DEF_MAX_REQ;
    int io = s->cfg.io_timeout_ms > 0 ? s->cfg.io_timeout_ms : DEF_IO_MS;

    omp_set_num_threads(s->cfg.threads > 0 ? s->cfg.threads : 1);
    /* remote prefills in pieces, no batched steps; a failed allocation
     * leaves ws empty and each prefill fails with HP_ENOMEM */
    hp_fwd_plan_t plan = {HP_FWD_PIECE, 0, 0, 1};
    hp_error_t ws_err = {0};
    memset(&ws, 0, sizeof(ws));
    if (s->cfg.llm && !s->dev)
        hp_fwd_ws_init(&ws, &s->cfg.llm->model, &plan, &ws_err);
    for (;;) {
        uint8_t hb[HP_PEER_HDR_BYTES];
        hp_peer_hdr_t h;
        hp_peer_msg_t m;
        hp_error_t err = {0};
        int eof, rc;
        int64_t deadline = now_ms() + io;
        if (read_full(sl->fd, hb, sizeof(hb), deadline, &eof, &err) != HP_OK)
            break; /* closed, idle too long, or stopping */
        rc = hp_peer_hdr_decode(&h, hb, max, &err);
        uint8_t *pl = NULL;
        if (rc == HP_OK) {
            pl = malloc(h.length ? (size_t)h.length : 1);
            if (!pl)
                rc = hp_error_set(&err, HP_ENOMEM, "peer: out of memory");
        }
        if (rc == HP_OK && (rc = read_full(sl->fd, pl, (size_t)h.length,
                                           deadline, NULL, &err)) != HP_OK) {
            free(pl);
            break;
        }
        if (rc == HP_OK)
            rc = hp_peer_msg_parse(&m, &h, pl, &err);
        if (rc == HP_OK && m.type != HP_PEER_GET_SEGMENT &&
            m.type != HP_PEER_PREFILL)
            rc = hp_error_set(&err, HP_EBADINPUT,
                              "peer: type %d is not a request", m.type);
        if (rc != HP_OK) {
            /* tell the sender why, then drop the connection: after a bad
             * header the stream cannot be trusted to resynchronise */
            count(s, &s->st.rejected);
            srv_log(s, HP_LOG_WARN, "peer: rejected a message: %s", err.msg);
            send_error(sl->fd, rc, err.msg, now_ms() + io);
            linger_close(sl->fd);
            free(pl);
            break;
        }
        count(s, &s->st.requests);
        if (m.type == HP_PEER_GET_SEGMENT) {
            hp_pool_entry_t *e = hp_pool_get(s->cfg.pub, m.key, m.variant);
            if (e) {
                rc = send_entry(s, sl->fd, e, now_ms() + io, &err);
                hp_pool_release(s->cfg.pub, e);
                if (rc == HP_OK)
                    count(s, &s->st.served);
            } else {
                uint8_t k[24];
                const void *parts[1] = {k};
                size_t lens[1] = {hp_peer_enc_key(k, m.key, m.variant)};
                count(s, &s->st.not_found);
                rc = send_msg(sl->fd, HP_PEER_NOT_FOUND, parts, lens, 1,
                              now_ms() + io, &err);
            }
        } else {
            rc = serve_prefill(s, sl->fd, &m, s->dev ? &s->bws : &ws,
                               now_ms() + io);
        }
        free(pl);
        if (rc != HP_OK)
            break;
    }
    hp_fwd_ws_free(&ws);
    pthread_mutex_lock(&s->mu);
    sl->state = SLOT_DONE; /* the listener joins and closes the fd */
    pthread_mutex_unlock(&s->mu);
    char c = 1;
    if (write(s->wake[1], &c, 1) < 0) { /* full pipe: a wake-up is pending */
    }
    return NULL;
}

/* Joins finished connection threads; returns a free slot or NULL. */
static slot_t *reap(hp_peer_server_t *s)
{
    slot_t *free_slot = NULL;
    int n = s->cfg.max_conns;
    for (int i = 0; i < n; i++) {
        slot_t *sl = &s->slots[i];
        pthread_mutex_lock(&s->mu);
        int st = sl->state;
        pthread_mutex_unlock(&s->mu);
        if (st == SLOT_DONE) {
            pthread_join(sl->th, NULL);
            close(sl->fd);
            sl->state = SLOT_FREE;
            st = SLOT_FREE;
        }
        if (st == SLOT_FREE && !free_slot)
            free_slot = sl;
    }
    return free_slot;
}

static void *listen_main(void *arg)
{
    hp_peer_server_t *s = arg;
    for (;;) {
        slot_t *sl = reap(s);
        pthread_mutex_lock(&s->mu);
        int stop = s->stopping;
        pthread_mutex_unlock(&s->mu);
        if (stop)
            break;
        /* with every slot busy, new connections wait in the backlog */
        struct pollfd p[2] = {{s->wake[0], POLLIN, 0},
                              {sl ? s->lfd : -1, POLLIN, 0}};
        if (poll(p, 2, -1) < 0 && errno != EINTR)
            break;
        if (p[0].revents) {
            char buf[64];
            while (read(s->wake[0], buf, sizeof(buf)) > 0)
                ;
        }
        if (!sl || !(p[1].revents & POLLIN))
            continue;
        int fd = accept4(s->lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0)
            continue;
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
        sl->fd = fd;
        pthread_mutex_lock(&s->mu);
        sl->state = SLOT_RUN;
        s->st.conns++;
        pthread_mutex_unlock(&s->mu);
        if (pthread_create(&sl->th, NULL, conn_main, sl) != 0) {
            close(fd);
            pthread_mutex_lock(&s->mu);
            sl->state = SLOT_FREE;
            pthread_mutex_unlock(&s->mu);
            srv_log(s, HP_LOG_ERROR, "peer: cannot start a connection thread");
        }
    }
    /* stopping: end every connection's reads, then join them */
    for (int i = 0; i < s->cfg.max_conns; i++) {
        slot_t *sl = &s->slots[i];
        pthread_mutex_lock(&s->mu);
        int st = sl->state;
        pthread_mutex_unlock(&s->mu);
        if (st == SLOT_FREE)
            continue;
        shutdown(sl->fd, SHUT_RDWR);
        pthread_join(sl->th, NULL);
        close(sl->fd);
        sl->state = SLOT_FREE;
    }
    return NULL;
}

/* A device's PREFILL builder, taken now so that serving allocates no
 * device memory later. */
static int builder_start(hp_peer_server_t *s, hp_error_t *err)
{
    const hp_model_t *m = s->cfg.llm ? &s->cfg.llm->model : NULL;
    if (!m || hp_backend_host_memory(m->be))
        return HP_OK;
    hp_fwd_plan_t plan = {hp_fwd_piece(m), 0, 0, 1};
    int rc = hp_fwd_ws_init(&s->bws, m, &plan, err);
    if (rc == HP_OK && (rc = hp_seq_init(&s->bseq, m, err)) != HP_OK)
        hp_fwd_ws_free(&s->bws);
    if (rc == HP_OK &&
        (rc = hp_seq_reserve(&s->bseq, s->cfg.max_segment, err)) != HP_OK) {
        hp_seq_free(&s->bseq);
        hp_fwd_ws_free(&s->bws);
    }
    if (rc != HP_OK)
        return rc;
    s->bws.build_seq = &s->bseq;
    s->dev = 1;
    return HP_OK;
}

static void builder_stop(hp_peer_server_t *s)
{
    if (!s->dev)
        return;
    hp_seq_free(&s->bseq);
    hp_fwd_ws_free(&s->bws);
    s->dev = 0;
}

hp_peer_server_t *hp_peer_server_start(const hp_peer_server_cfg_t *cfg,
                                       hp_error_t *err)
{
    char host[256], port[32];
    struct addrinfo hints = {.ai_family = AF_UNSPEC,
                             .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_PASSIVE | AI_NUMERICSERV},
                    *ai = NULL;
    if (!cfg->pub) {
        hp_error_set(err, HP_EBADINPUT, "peer: no pool to serve");
        return NULL;
    }
    if (split_addr(cfg->listen, host, sizeof(host), port, sizeof(port), err) !=
        HP_OK)
        return NULL;
    int gai = getaddrinfo(host[0] ? host : NULL, port, &hints, &ai);
    if (gai != 0) {
        hp_error_set(err, HP_EBADINPUT, "peer: %s: %s", cfg->listen,
                     gai_strerror(gai));
        return NULL;
    }
    hp_peer_server_t *s = calloc(1, sizeof(*s));
    if (!s) {
        freeaddrinfo(ai);
        hp_error_set(err, HP_ENOMEM, "peer: out of memory");
        return NULL;
    }
    s->cfg = *cfg;
    s->cfg.listen = NULL; /* not kept */
    if (s->cfg.max_conns <= 0)
        s->cfg.max_conns = DEF_CONNS;
    if (s->cfg.max_segment <= 0)
        s->cfg.max_segment = DEF_SEGMENT;
    if (builder_start(s, err) != HP_OK) {
        freeaddrinfo(ai);
        free(s);
        return NULL;
    }
    s->lfd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    int one = 1;
    if (s->lfd >= 0)
        setsockopt(s->lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (s->lfd < 0 || bind(s->lfd, ai->ai_addr, ai->ai_addrlen) != 0 ||
        listen(s->lfd, 64) != 0) {
        hp_error_set(err, HP_EIO, "peer: cannot listen on %s: %s", cfg->listen,
                     strerror(errno));
        if (s->lfd >= 0)
            close(s->lfd);
        freeaddrinfo(ai);
        builder_stop(s);
        free(s);
        return NULL;
    }
    freeaddrinfo(ai);
    struct sockaddr_storage ss;
    socklen_t sl = sizeof(ss);
    getsockname(s->lfd, (struct sockaddr *)&ss, &sl);
    s->port =
        ntohs(ss.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port
                                       : ((struct sockaddr_in *)&ss)->sin_port);
    set_nonblock(s->lfd);
    s->slots = calloc((size_t)s->cfg.max_conns, sizeof(slot_t));
    if (!s->slots || pipe2(s->wake, O_NONBLOCK | O_CLOEXEC) != 0) {
        close(s->lfd);
        free(s->slots);
        builder_stop(s);
        free(s);
        hp_error_set(err, HP_ENOMEM, "peer: out of memory");
        return NULL;
    }
    for (int i = 0; i < s->cfg.max_conns; i++)
        s->slots[i].srv = s;
    pthread_mutex_init(&s->mu, NULL);
    if (pthread_create(&s->th, NULL, listen_main, s) != 0) {
        close(s->lfd);
        close(s->wake[0]);
        close(s->wake[1]);
        pthread_mutex_destroy(&s->mu);
        free(s->slots);
        builder_stop(s);
        free(s);
        hp_error_set(err, HP_EINTERNAL, "peer: cannot start the listener");
        return NULL;
    }
    return s;
}

int hp_peer_server_port(const hp_peer_server_t *s)
{
    return s->port;
}

void hp_peer_server_stats(hp_peer_server_t *s, hp_peer_server_stats_t *st)
{
    pthread_mutex_lock(&s->mu);
    *st = s->st;
    pthread_mutex_unlock(&s->mu);
}

void hp_peer_server_stop(hp_peer_server_t *s)
{
    if (!s)
        return;
    pthread_mutex_lock(&s->mu);
    s->stopping = 1;
    pthread_mutex_unlock(&s->mu);
    char c = 1;
    if (write(s->wake[1], &c, 1) < 0) { /* full: already woken */
    }
    pthread_join(s->th, NULL);
    close(s->lfd);
    close(s->wake[0]);
    close(s->wake[1]);
    pthread_mutex_destroy(&s->mu);
    free(s->slots);
    builder_stop(s);
    free(s);
}

/* ---- client -------------------------------------------------------------- */

static int connect_to(const char *addr, int64_t deadline, hp_error_t *err)
{
    char host[256], port[32];
    struct addrinfo hints = {.ai_family = AF_UNSPEC,
                             .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_NUMERICSERV},
                    *ai = NULL;
    int rc = split_addr(addr, host, sizeof(host), port, sizeof(port), err);
    if (rc != HP_OK)
        return rc;
    int gai = getaddrinfo(host, port, &hints, &ai);
    if (gai != 0)
        return hp_error_set(err, HP_EUNAVAIL, "peer: %s: %s", addr,
                            gai_strerror(gai));
    int fd =
        socket(ai->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        freeaddrinfo(ai);
        return hp_error_set(err, HP_EIO, "peer: socket: %s", strerror(errno));
    }
    int r = connect(fd, ai->ai_addr, ai->ai_addrlen);
    freeaddrinfo(ai);
    if (r != 0 && errno != EINPROGRESS) {
        rc = hp_error_set(err, HP_EUNAVAIL, "peer %s: %s", addr,
                          strerror(errno));
        close(fd);
        return rc;
    }
    if (r != 0) {
        int w = wait_fd(fd, POLLOUT, deadline), e = 0;
        socklen_t el = sizeof(e);
        if (w == 0) {
            close(fd);
            return hp_error_set(err, HP_ETIMEOUT, "peer %s: connect timed out",
                                addr);
        }
        if (w < 0 || getsockopt(fd, SOL_SOCKET, SO_ERROR, &e, &el) != 0 ||
            e != 0) {
            rc = hp_error_set(err, HP_EUNAVAIL, "peer %s: %s", addr,
                              strerror(e ? e : errno));
            close(fd);
            return rc;
        }
    }
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    return fd;
}

/* Reads the reply to a request for (key, variant): a SEGMENT into a new
 * pool entry (checked, published; a device's pool gets it through a host
 * buffer), NOT_FOUND, or ERROR. */
static int read_reply(int fd, const char *addr, const uint8_t key[16],
                      uint32_t variant, hp_pool_t *pool, const hp_model_t *mdl,
                      int64_t deadline, hp_pool_entry_t **out, hp_error_t *err)
{
    const hp_backend_t *be = mdl ? mdl->be : NULL;
    int dev = be && !hp_backend_host_memory(be);
    uint8_t hb[HP_PEER_HDR_BYTES];
    hp_peer_hdr_t h;
    hp_peer_msg_t m;
    int rc = read_full(fd, hb, sizeof(hb), deadline, NULL, err);
    if (rc == HP_OK)
        rc = hp_peer_hdr_decode(&h, hb, 0, err);
    if (rc != HP_OK)
        return rc == HP_ETOOLARGE ? HP_EBADINPUT : rc;
    if (h.type == HP_PEER_NOT_FOUND || h.type == HP_PEER_ERROR) {
        uint8_t small[24 + MAX_ERR_MSG];
        if (h.length > sizeof(small))
            return hp_error_set(err, HP_EBADINPUT,
                                "peer %s: reply of %llu bytes", addr,
                                (unsigned long long)h.length);
        if ((rc = read_full(fd, small, (size_t)h.length, deadline, NULL,
                            err)) != HP_OK ||
            (rc = hp_peer_msg_parse(&m, &h, small, err)) != HP_OK)
            return rc;
        if (m.type == HP_PEER_ERROR)
            return hp_error_set(err, HP_EUNAVAIL, "peer %s refused: %.*s", addr,
                                (int)(m.msg_len < 400 ? m.msg_len : 400),
                                m.msg);
        if (memcmp(m.key, key, 16) || m.variant != variant)
            return hp_error_set(err, HP_EBADINPUT,
                                "peer %s: reply for another segment", addr);
        return HP_PEER_NOT_FOUND_RC;
    }
    if (h.type != HP_PEER_SEGMENT || h.length < 32)
        return hp_error_set(err, HP_EBADINPUT, "peer %s: unexpected reply %d",
                            addr, h.type);
    uint8_t pre[32];
    if ((rc = read_full(fd, pre, 32, deadline, NULL, err)) != HP_OK)
        return rc;
    uint64_t bytes = h.length - 32;
    hp_peer_enc_segment(hb, key, variant, bytes); /* what we expect */
    if (memcmp(pre, hb, 32))
        return hp_error_set(err, HP_EBADINPUT,
                            "peer %s: segment reply does not match the "
                            "request",
                            addr);
    hp_pool_entry_t *e = hp_pool_alloc(pool, key, variant, (size_t)bytes, err);
    if (!e)
        return err->code ? err->code : HP_ENOMEM;
    /* the payload lands in the pool's arena (host memory) or a buffer on
     * its way to the device's: checked there, then public */
    uint8_t *land = dev ? malloc((size_t)bytes) : e->data;
    rc = land ? read_full(fd, land, (size_t)bytes, deadline, NULL, err)
              : hp_error_set(err, HP_ENOMEM, "peer: out of memory");
    if (rc == HP_OK) {
        XXH3_state_t st;
        XXH3_64bits_reset(&st);
        XXH3_64bits_update(&st, pre, 32);
        XXH3_64bits_update(&st, land, (size_t)bytes);
        if (XXH3_64bits_digest(&st) != h.payload_sum)
            rc = hp_error_set(err, HP_EBADINPUT, "peer %s: payload checksum",
                              addr);
    }
    if (rc == HP_OK && mdl)
        rc = hp_peer_check_entry(&mdl->cfg, variant, land, bytes, err);
    if (rc == HP_OK && dev) {
        hp_backend_lock(be);
        hp_backend_upload(be, e->data, land, (size_t)bytes);
        rc = hp_backend_sync(be, err);
        hp_backend_unlock(be);
    }
    if (rc == HP_OK)
        hp_segc_adopt(e, land);
    if (dev)
        free(land);
    if (rc != HP_OK) {
        hp_pool_release(pool, e);
        return rc;
    }
    hp_pool_publish(pool, e);
    if (out)
        *out = e;
    else
        hp_pool_release(pool, e);
    return HP_OK;
}

static int exchange(const char *addr, int type, const void *const *parts,
                    const size_t *lens, int n, const uint8_t key[16],
                    uint32_t variant, hp_pool_t *pool, const hp_model_t *m,
                    int timeout_ms, hp_pool_entry_t **out, hp_error_t *err)
{
    int64_t deadline = now_ms() + (timeout_ms > 0 ? timeout_ms : 1);
    if (out)
        *out = NULL;
    int fd = connect_to(addr, deadline, err);
    if (fd < 0)
        return fd;
    int rc = send_msg(fd, type, parts, lens, n, deadline, err);
    if (rc == HP_OK)
        rc = read_reply(fd, addr, key, variant, pool, m, deadline, out, err);
    close(fd);
    return rc;
}

int hp_peer_fetch(const char *addr, const uint8_t key[16], uint32_t variant,
                  hp_pool_t *pool, const hp_model_t *m, int timeout_ms,
                  hp_pool_entry_t **out, hp_error_t *err)
{
    uint8_t req[24];
    const void *parts[1] = {req};
    size_t lens[1] = {hp_peer_enc_key(req, key, variant)};
    return exchange(addr, HP_PEER_GET_SEGMENT, parts, lens, 1, key, variant,
                    pool, m, timeout_ms, out, err);
}

int hp_peer_prefill(const char *addr, const uint8_t key[16], uint32_t variant,
                    int kind, int seam, const int *ids, int n, hp_pool_t *pool,
                    const hp_model_t *m, int timeout_ms, hp_pool_entry_t **out,
                    hp_error_t *err)
{
    uint8_t req[32];
    if (n <= 0)
        return hp_error_set(err, HP_EBADINPUT, "peer: empty prefill");
    uint8_t *wire = malloc((size_t)n * 4);
    if (!wire)
        return hp_error_set(err, HP_ENOMEM, "peer: out of memory");
    for (int i = 0; i < n; i++)
        for (int b = 0; b < 4; b++)
            wire[4 * i + b] = (uint8_t)((uint32_t)ids[i] >> (8 * b));
    const void *parts[2] = {req, wire};
    size_t lens[2] = {hp_peer_enc_prefill(req, key, variant, kind, seam, n),
                      (size_t)n * 4};
    int rc = exchange(addr, HP_PEER_PREFILL, parts, lens, 2, key, variant, pool,
                      m, timeout_ms, out, err);
    free(wire);
    return rc == HP_PEER_NOT_FOUND_RC
               ? hp_error_set(err, HP_EBADINPUT,
                              "peer %s: NOT_FOUND to a PREFILL", addr)
               : rc;
}
