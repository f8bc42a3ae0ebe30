/*
 * test_ipc.c - the shared-memory request interface (engine/contract/hp_ipc.h)
 * and the engine's server end (engine/serve/ipc_server.h): layout checks, the
 * slot life cycle, a full table, ring semantics (wrap-around, no room, corrupt
 * input, two threads), the generation counter, and reclaiming the slots
 * of a client process that dies.
 */
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "engine/contract/hp_ipc.h"
#include "engine/forward/forward.h"
#include "engine/forward/generate.h"
#include "engine/model/llm.h"
#include "engine/serve/ipc_server.h"
#include "engine/serve/sched.h"
#include "t/lib/tap.h"

#define MODEL "models/test/qwen35-dense"

static void *segment(uint32_t slots, uint32_t input, uint32_t ring,
                     uint64_t *bytes)
{
    *bytes = hp_ipc_segment_bytes(slots, input, ring);
    void *p = aligned_alloc(64, (size_t)*bytes);
    memset(p, 0, (size_t)*bytes);
    return p;
}

static void test_layout(void)
{
    uint64_t bytes;
    hp_ipc_header_t *h = segment(4, 4096, HP_IPC_RING_MIN, &bytes);

    ok(hp_ipc_format(h, 4, 4096, HP_IPC_RING_MIN, 7, 1, "n1", "m") == 0,
       "a segment formats");
    ok(hp_ipc_check(h, bytes) == NULL, "and checks out");
    ok(h->generation == 7 && !strcmp(h->node, "n1") && h->n_slots == 4,
       "header carries generation, node and geometry");
    ok(hp_ipc_check(h, bytes - 1) != NULL,
       "a mapping shorter than the slot table is refused (%s)",
       hp_ipc_check(h, bytes - 1));
    h->version++;
    ok(hp_ipc_check(h, bytes) && strstr(hp_ipc_check(h, bytes), "version"),
       "another protocol version is refused");
    h->version--;
    h->slot_bytes++;
    ok(hp_ipc_check(h, bytes) && strstr(hp_ipc_check(h, bytes), "sizes"),
       "different struct sizes are refused");
    h->slot_bytes--;
    h->magic = 0;
    ok(hp_ipc_check(h, bytes) != NULL, "a bad magic is refused");
    ok(hp_ipc_format(h, 4, 4000, HP_IPC_RING_MIN, 1, 1, "", "") != 0 &&
           hp_ipc_format(h, 4, 4096, HP_IPC_RING_MIN + 8, 1, 1, "", "") != 0,
       "bad geometry is refused at format time");
    uint64_t now = hp_ipc_now_ms();
    ok(hp_ipc_heartbeat_age(h, now) < 60000 &&
           atomic_load(&h->health) == HP_IPC_HEALTH_OK,
       "a fresh segment is healthy and has a heartbeat");
    hp_ipc_beat(h, now - 5000);
    ok(hp_ipc_heartbeat_age(h, now) == 5000,
       "the heartbeat's age is the reader's clock minus the beat");
    hp_ipc_beat(h, now + 10);
    ok(hp_ipc_heartbeat_age(h, now) == 0,
       "a beat ahead of the reader's clock is no age");
    ok((uintptr_t)hp_ipc_slot(h, 1) % 64 == 0 &&
           (char *)hp_ipc_slot(h, 3) + h->slot_stride <= (char *)h + bytes,
       "slots are cache-line aligned and inside the segment");
    free(h);
}

static void test_lifecycle(void)
{
    uint64_t bytes;
    hp_ipc_header_t *h = segment(3, 64, HP_IPC_RING_MIN, &bytes);
    hp_ipc_format(h, 3, 64, HP_IPC_RING_MIN, 1, 1, "", "");
    hp_ipc_slot_t *s[4];
    uint32_t idx[4], seq[4];

    for (int i = 0; i < 3; i++)
        s[i] = hp_ipc_claim(h, 5, 100, &idx[i], &seq[i]);
    ok(s[0] && s[1] && s[2] && idx[0] != idx[1] && idx[1] != idx[2],
       "three claims get three slots");
    ok(hp_ipc_claim(h, 5, 100, &idx[3], &seq[3]) == NULL,
       "a full table refuses the fourth: busy, never grows");
    uint64_t w = atomic_load(&s[0]->word);
    ok(HP_IPC_STATE(w) == HP_IPC_CLAIMED && HP_IPC_OWNER(w) == 5 &&
           s[0]->owner_pid == 100,
       "a claim records state, owner connection and pid in one word");

    ok(hp_ipc_submit(h, s[1], seq[1]) == 0 &&
           hp_ipc_submit(h, s[0], seq[0]) == 0,
       "submit");
    ok(s[1]->ticket < s[0]->ticket, "tickets follow submission order");
    ok(hp_ipc_submit(h, s[0], seq[0]) == -1, "submitting twice fails");

    uint64_t run;
    ok(hp_ipc_take(s[0], &run) == 0 && HP_IPC_STATE(run) == HP_IPC_RUNNING,
       "the engine takes a submitted slot");
    ok(hp_ipc_take(s[0], &run) == -1, "and only once");
    ok(hp_ipc_take(s[2], &run) == -1, "a CLAIMED slot cannot be taken");

    /* the user lets go while the engine runs it: the engine frees it */
    ok(hp_ipc_release(s[0], seq[0]) == 0 && atomic_load(&s[0]->cancel),
       "release of a RUNNING slot sets cancel and leaves it to the engine");
    hp_ipc_finish(s[0]);
    ok(HP_IPC_STATE(atomic_load(&s[0]->word)) == HP_IPC_FREE,
       "the engine frees a cancelled slot when it finishes");
    ok(hp_ipc_release(s[0], seq[0]) == 1, "releasing again is harmless");

    /* the engine finishes first: DONE until the user read FINAL */
    hp_ipc_take(s[1], &run);
    hp_ipc_finish(s[1]);
    ok(HP_IPC_STATE(atomic_load(&s[1]->word)) == HP_IPC_DONE,
       "finish without cancel leaves DONE for the reader");
    ok(hp_ipc_release(s[1], seq[1]) == 1 &&
           HP_IPC_STATE(atomic_load(&s[1]->word)) == HP_IPC_FREE,
       "the reader frees a DONE slot");

    /* a CLAIMED slot given back before submit */
    ok(hp_ipc_release(s[2], seq[2]) == 1, "a claim can be abandoned");

    /* stale handles never touch a reused slot */
    uint32_t i2, q2;
    hp_ipc_slot_t *again = hp_ipc_claim(h, 6, 101, &i2, &q2);
    ok(again && q2 != seq[idx[0] == i2   ? 0
                          : idx[1] == i2 ? 1
                                         : 2],
       "a reused slot has a new claim sequence");
    uint32_t old = idx[0] == i2 ? seq[0] : idx[1] == i2 ? seq[1] : seq[2];
    ok(hp_ipc_release(again, old) == -1 &&
           HP_IPC_STATE(atomic_load(&again->word)) == HP_IPC_CLAIMED &&
           !atomic_load(&again->cancel),
       "releasing with a stale sequence does nothing");
    ok(hp_ipc_submit(h, again, old) == -1, "nor does a stale submit");
    free(h);
}

static void test_ring(void)
{
    uint64_t bytes;
    uint32_t ring = HP_IPC_RING_MIN;
    hp_ipc_header_t *h = segment(1, 64, ring, &bytes);
    hp_ipc_format(h, 1, 64, ring, 1, 1, "", "");
    hp_ipc_slot_t *s = hp_ipc_slot(h, 0);
    char in[HP_IPC_RECORD_MAX], out[HP_IPC_RECORD_MAX];
    uint32_t type, len;
    int bad = 0;

    ok(hp_ipc_ring_get(h, s, &type, out, sizeof(out), &len) == 0,
       "an empty ring gives nothing");
    /* odd sizes walk the records across the wrap point many times */
    for (int i = 0; i < 5000 && !bad; i++) {
        uint32_t n = (uint32_t)((i * 37) % 700);
        for (uint32_t k = 0; k < n; k++)
            in[k] = (char)(i + k);
        if (hp_ipc_ring_put(h, s, HP_IPC_REC_TEXT, in, n, 0) != 0 ||
            hp_ipc_ring_get(h, s, &type, out, sizeof(out), &len) != 1 ||
            type != HP_IPC_REC_TEXT || len != n || memcmp(in, out, n))
            bad = i + 1;
    }
    ok(!bad, "5000 records of odd sizes round-trip across the wrap (%d)", bad);

    /* fill it: the put that does not fit changes nothing */
    int puts = 0;
    while (hp_ipc_ring_put(h, s, HP_IPC_REC_TEXT, in, 1000, 0) == 0)
        puts++;
    uint32_t room = hp_ipc_ring_room(h, s);
    ok(puts == (int)(ring / 1008) && room < 1008,
       "a full ring refuses a record (%d fitted, %u left)", puts, room);
    ok(hp_ipc_ring_put(h, s, HP_IPC_REC_FINAL, in, 8, room) != 0,
       "a reserve is kept free");
    ok(hp_ipc_ring_put(h, s, HP_IPC_REC_FINAL, in, room - 8, 0) == 0,
       "a record that fits exactly goes in");
    ok(hp_ipc_ring_room(h, s) == 0, "then the ring is full");
    ok(hp_ipc_ring_get(h, s, &type, out, 10, &len) == -1,
       "a reader buffer too small is an error, not a truncation");
    ok(hp_ipc_ring_get(h, s, &type, out, sizeof(out), &len) == 1 && len == 1000,
       "and the record is still there");
    ok(hp_ipc_ring_put(h, s, HP_IPC_REC_TEXT, in, 1000, 0) == 0,
       "reading made room");
    ok(hp_ipc_ring_put(h, s, HP_IPC_REC_TEXT, in, HP_IPC_RECORD_MAX + 1, 0) ==
           -1,
       "a record over HP_IPC_RECORD_MAX is refused");

    /* garbage from the other side is detected, not followed */
    atomic_store(&s->head, atomic_load(&s->tail) + ring + 8);
    ok(hp_ipc_ring_get(h, s, &type, out, sizeof(out), &len) == -1,
       "a head beyond the ring is corrupt");
    atomic_store(&s->head, atomic_load(&s->tail) + 3);
    ok(hp_ipc_ring_get(h, s, &type, out, sizeof(out), &len) == -1,
       "a partial header is corrupt");
    free(h);
}

typedef struct {
    hp_ipc_header_t *h;
    hp_ipc_slot_t *s;
    int n;
} spsc_t;

static void *producer(void *arg)
{
    spsc_t *t = arg;
    char buf[600];
    for (int i = 0; i < t->n; i++) {
        uint32_t n = 4 + (uint32_t)(i % 590);
        memcpy(buf, &i, 4);
        for (uint32_t k = 4; k < n; k++)
            buf[k] = (char)(i ^ k);
        while (hp_ipc_ring_put(t->h, t->s, HP_IPC_REC_TEXT, buf, n, 0) != 0)
            sched_yield();
    }
    return NULL;
}

static void test_spsc(void)
{
    uint64_t bytes;
    spsc_t t;
    pthread_t th;
    char buf[HP_IPC_RECORD_MAX];
    uint32_t type, len;
    int bad = -1;

    t.h = segment(1, 64, HP_IPC_RING_MIN, &bytes);
    hp_ipc_format(t.h, 1, 64, HP_IPC_RING_MIN, 1, 1, "", "");
    t.s = hp_ipc_slot(t.h, 0);
    t.n = 200000;
    pthread_create(&th, NULL, producer, &t);
    for (int i = 0; i < t.n && bad < 0;) {
        int rc = hp_ipc_ring_get(t.h, t.s, &type, buf, sizeof(buf), &len);
        if (rc == 0) {
            sched_yield();
            continue;
        }
        int v;
        memcpy(&v, buf, 4);
        if (rc != 1 || v != i || len != 4 + (uint32_t)(i % 590))
            bad = i;
        for (uint32_t k = 4; k < len && bad < 0; k++)
            if (buf[k] != (char)(i ^ k))
                bad = i;
        i++;
    }
    pthread_join(th, NULL);
    ok(bad < 0, "two threads pass 200000 records in order, intact (%d)", bad);
    free(t.h);
}

static void test_utf8_cut(void)
{
    const char *s = "ab\xc3\xa9\xe2\x82\xac"; /* a b é € */
    ok(hp_ipc_utf8_cut(s, 7, 10) == 7, "short text is not cut");
    ok(hp_ipc_utf8_cut(s, 7, 3) == 2, "a cut never splits é");
    ok(hp_ipc_utf8_cut(s, 7, 5) == 4 && hp_ipc_utf8_cut(s, 7, 6) == 4, "nor €");
}

/* One status, one answer: the HTTP status, type and code of each. */
static void test_errors(void)
{
    static const struct {
        int status, http;
        const char *type, *code;
    } want[] = {
        {HP_EBADINPUT, 400, "invalid_request_error", "invalid_prompt"},
        {HP_ETOOLARGE, 400, "invalid_request_error", "context_length_exceeded"},
        {HP_ENOMEM, 503, "engine_unavailable", "engine_out_of_memory"},
        {HP_EMODEL, 500, "server_error", "engine_error"},
        {HP_EIO, 500, "server_error", "engine_error"},
        {HP_EBUSY, 429, "rate_limit_error", "engine_busy"},
        {HP_EUNAVAIL, 503, "engine_unavailable", "engine_unavailable"},
        {HP_ETIMEOUT, 504, "timeout", "timeout"},
        {HP_ECANCELLED, 500, "server_error", "engine_error"},
        {HP_EINTERNAL, 500, "server_error", "engine_error"},
        {HP_OK, 500, "server_error", "engine_error"},
        {HP_EINTERNAL + 1, 500, "server_error", "engine_error"},
        {-1, 500, "server_error", "engine_error"},
    };
    for (size_t i = 0; i < sizeof(want) / sizeof(want[0]); i++) {
        const hp_ipc_error_t *e = hp_ipc_error(want[i].status);
        ok(e && e->http == want[i].http && !strcmp(e->type, want[i].type) &&
               !strcmp(e->code, want[i].code),
           "status %d -> %d %s %s", want[i].status, e ? e->http : 0,
           e ? e->type : "-", e ? e->code : "-");
    }
}

/* ---- against a running server ---------------------------------------- */

typedef struct {
    hp_ipc_server_t *srv;
    hp_sched_t *sched;
    volatile sig_atomic_t stop;
    pthread_t th;
    hp_llm_t *llm;
} engine_t;

static void *run_engine(void *arg)
{
    engine_t *e = arg;
    hp_error_t err;
    hp_ipc_server_run(e->srv, e->sched, &e->stop, &err);
    return NULL;
}

static int engine_start(engine_t *e, hp_llm_t *llm, const char *sock,
                        const char *shm, uint32_t slots, int throttle)
{
    hp_error_t err = {0};
    hp_ipc_server_cfg_t cfg = {.socket_path = sock,
                               .shm_name = shm,
                               .node = "t-node",
                               .model = "t-model",
                               .slots = slots,
                               .input_bytes = 4096,
                               .ring_bytes = HP_IPC_RING_MIN};
    hp_sched_cfg_t scfg = {.batch = 4,
                           .prefill_chunk = 64,
                           .throttle_ms = throttle,
                           .flush = hp_ipc_server_flush};
    memset(e, 0, sizeof(*e));
    e->llm = llm;
    if (hp_ipc_server_open(&e->srv, &cfg, &err) != HP_OK) {
        tap_diag("server: %s", err.msg);
        return -1;
    }
    scfg.flush_ud = e->srv;
    if (hp_sched_create(&e->sched, llm, &scfg, &err) != HP_OK) {
        tap_diag("sched: %s", err.msg);
        return -1;
    }
    pthread_create(&e->th, NULL, run_engine, e);
    return 0;
}

static void engine_stop(engine_t *e)
{
    e->stop = 1;
    pthread_join(e->th, NULL); /* at most one poll period */
    hp_sched_destroy(e->sched);
    hp_ipc_server_close(e->srv);
}

typedef struct {
    int fd;
    hp_ipc_hello_t hello;
    hp_ipc_header_t *h;
} client_t;

/* What an nginx worker does: connect, take the hello and its fd, map. */
static int client_open(client_t *c, const char *sock)
{
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    union {
        struct cmsghdr h;
        char buf[CMSG_SPACE(sizeof(int))];
    } ctl;
    struct iovec iov = {.iov_base = &c->hello, .iov_len = sizeof(c->hello)};
    struct msghdr msg = {.msg_iov = &iov,
                         .msg_iovlen = 1,
                         .msg_control = ctl.buf,
                         .msg_controllen = sizeof(ctl.buf)};
    int shm = -1;

    strcpy(addr.sun_path, sock);
    c->fd = socket(AF_UNIX, SOCK_STREAM, 0);
    if (connect(c->fd, (struct sockaddr *)&addr, sizeof(addr)) != 0)
        return -1;
    if (recvmsg(c->fd, &msg, MSG_WAITALL) != (ssize_t)sizeof(c->hello))
        return -1;
    struct cmsghdr *cm = CMSG_FIRSTHDR(&msg);
    if (cm && cm->cmsg_type == SCM_RIGHTS)
        memcpy(&shm, CMSG_DATA(cm), sizeof(int));
    if (shm < 0)
        return -1;
    c->h = mmap(NULL, c->hello.shm_bytes, PROT_READ | PROT_WRITE, MAP_SHARED,
                shm, 0);
    close(shm);
    return c->h == MAP_FAILED ? -1 : 0;
}

static void client_close(client_t *c)
{
    munmap(c->h, c->hello.shm_bytes);
    close(c->fd);
}

static hp_ipc_slot_t *client_submit(client_t *c, const char *prompt,
                                    int max_tokens, int ignore_eos,
                                    uint32_t *seq)
{
    uint32_t idx;
    hp_ipc_slot_t *s =
        hp_ipc_claim(c->h, c->hello.conn_id, getpid(), &idx, seq);
    if (!s)
        return NULL;
    memset(&s->req, 0, sizeof(s->req));
    strcpy(s->req.id, "cmpl-test");
    s->req.max_tokens = (uint32_t)max_tokens;
    s->req.top_p = 1.0f;
    s->req.flags = ignore_eos ? HP_IPC_FLAG_IGNORE_EOS : 0;
    s->req.prompt_len = (uint32_t)strlen(prompt);
    memcpy(hp_ipc_input(c->h, s), prompt, strlen(prompt));
    if (hp_ipc_submit(c->h, s, *seq) != 0)
        return NULL;
    if (write(c->fd, "W", 1) != 1)
        return NULL;
    return s;
}

/* Reads records until FINAL, sleeping on the socket between wake-ups. */
static int client_collect(client_t *c, hp_ipc_slot_t *s, char *text, size_t cap,
                          hp_ipc_final_t *fin, int *starts)
{
    char buf[HP_IPC_RECORD_MAX];
    uint32_t type, len;
    size_t n = 0;
    *starts = 0;
    for (int waits = 0; waits < 2000;) {
        int rc = hp_ipc_ring_get(c->h, s, &type, buf, sizeof(buf), &len);
        if (rc < 0)
            return -1;
        if (rc == 0) {
            struct pollfd p = {.fd = c->fd, .events = POLLIN};
            if (poll(&p, 1, 10) > 0) {
                char b[64];
                if (read(c->fd, b, sizeof(b)) <= 0)
                    return -1;
            }
            waits++;
            continue;
        }
        if (type == HP_IPC_REC_START)
            (*starts)++;
        /* the text of choice 0, after its header */
        if (type == HP_IPC_REC_TEXT && len >= sizeof(hp_ipc_text_t) &&
            n + len < cap) {
            memcpy(text + n, buf + sizeof(hp_ipc_text_t),
                   len - sizeof(hp_ipc_text_t));
            n += len - sizeof(hp_ipc_text_t);
        }
        if (type == HP_IPC_REC_FINAL) {
            memcpy(fin, buf, sizeof(*fin));
            text[n] = '\0';
            return 0;
        }
    }
    return -1;
}

static int append_text(void *ud, const char *t, size_t len, int token)
{
    (void)token;
    strncat(ud, t, len);
    return 0;
}

/* Waits (up to ms, a bound for failure only) for a slot's state. */
static int wait_state(hp_ipc_slot_t *s, uint32_t state, int ms)
{
    for (int i = 0; i < ms / 10; i++) {
        if (HP_IPC_STATE(atomic_load(&s->word)) == state)
            return 1;
        usleep(10000);
    }
    return 0;
}

static int wait_free(hp_ipc_slot_t *s, int ms)
{
    return wait_state(s, HP_IPC_FREE, ms);
}

static void test_server(void)
{
    hp_llm_t llm;
    hp_error_t err = {0};
    engine_t e;
    client_t c;
    char sock[108], shm[64], text[8192], ref[8192] = "";
    hp_ipc_final_t fin;
    int starts;
    uint32_t seq;

    if (hp_llm_load(&llm, MODEL, &err) != HP_OK) {
        tap_skip(err.msg);
        return;
    }
    snprintf(sock, sizeof(sock), "/tmp/hypic-test-ipc-%d.sock", getpid());
    snprintf(shm, sizeof(shm), "/hypic-test-ipc-%d", getpid());

    /* the reference: prefill + hp_generate, greedy */
    {
        hp_seq_t sq;
        hp_fwd_ws_t ws;
        int *ids, n;
        float *lg = malloc((size_t)llm.model.cfg.vocab_size * sizeof(float));
        hp_gen_params_t p = {.max_tokens = 12, .sampling = {0, 0, 1.0f, 0}};
        hp_gen_result_t res;
        hp_llm_tokenize(&llm, "Hello world", 11, &ids, &n, &err);
        hp_seq_init(&sq, &llm.model, &err);
        hp_fwd_ws_init(&ws, &llm.model, NULL, &err);
        hp_prefill(&llm.model, &sq, &ws, ids, n, 64, lg, &err);
        hp_generate(&llm, &sq, &ws, lg, &p, append_text, ref, &res, &err);
        free(res.tokens);
        free(ids);
        free(lg);
        hp_seq_free(&sq);
        hp_fwd_ws_free(&ws);
    }

    ok(engine_start(&e, &llm, sock, shm, 2, 0) == 0, "a server starts");
    uint64_t gen1 = hp_ipc_server_generation(e.srv);
    ok(client_open(&c, sock) == 0, "a client gets the hello and the segment");
    ok(c.hello.magic == HP_IPC_MAGIC && c.hello.generation == gen1 &&
           c.hello.conn_id > 0 && hp_ipc_check(c.h, c.hello.shm_bytes) == NULL,
       "hello and header agree (generation %llu, connection %u)",
       (unsigned long long)gen1, c.hello.conn_id);
    ok(!strcmp(c.h->node, "t-node") && !strcmp(c.h->model, "t-model"),
       "the header names node and model");
    /* an idle loop still beats: a stale beat is fresh again soon */
    hp_ipc_beat(c.h, 0);
    int beat = 0;
    for (int i = 0; i < 3000 && !beat; i++) {
        beat = hp_ipc_heartbeat_age(c.h, hp_ipc_now_ms()) <
               4 * HP_IPC_HEARTBEAT_MS;
        if (!beat)
            usleep(1000);
    }
    ok(beat, "the idle server's loop writes its heartbeat");

    hp_ipc_slot_t *s = client_submit(&c, "Hello world", 12, 0, &seq);
    int rc = s ? client_collect(&c, s, text, sizeof(text), &fin, &starts) : -1;
    ok(rc == 0 && starts == 1 && fin.status == 0,
       "a request streams START, text and FINAL");
    ok(rc == 0 && !strcmp(text, ref),
       "its greedy text equals hp_generate's (\"%s\")", text);
    ok(fin.prompt_tokens > 0 && fin.completion_tokens <= 12 &&
           fin.mode == HP_IPC_MODE_FULL && fin.segs_total == 1,
       "FINAL carries usage (%u + %u tokens) and the mode that ran",
       fin.prompt_tokens, fin.completion_tokens);
    ok(s && hp_ipc_release(s, seq) == 1, "the reader frees the slot");

    /* bad input: refused with a FINAL error, the slot comes back */
    s = client_submit(&c, "", 4, 0, &seq);
    rc = s ? client_collect(&c, s, text, sizeof(text), &fin, &starts) : -1;
    ok(rc == 0 && fin.status == HP_EBADINPUT && starts == 0 &&
           !strcmp(fin.code, "invalid_prompt"),
       "an empty prompt is refused: %s (%s)", fin.code, fin.message);
    hp_ipc_release(s, seq);

    /* two long requests fill both slots; a third claim is refused */
    uint32_t seq2;
    hp_ipc_slot_t *a = client_submit(&c, "one", 3000, 1, &seq);
    hp_ipc_slot_t *b = client_submit(&c, "two", 3000, 1, &seq2);
    uint32_t i3, q3;
    ok(a && b && hp_ipc_claim(c.h, c.hello.conn_id, getpid(), &i3, &q3) == NULL,
       "with every slot in flight the next claim is refused");
    hp_ipc_release(a, seq);
    hp_ipc_release(b, seq2);
    write(c.fd, "W", 1);
    ok(wait_free(a, 10000) && wait_free(b, 10000),
       "cancelled running requests give their slots back");

    /* a slot whose owner is no live connection: the sweep reclaims it */
    uint32_t ghost_seq, gi;
    hp_ipc_slot_t *g = hp_ipc_claim(c.h, 4242, getpid(), &gi, &ghost_seq);
    ok(g != NULL && wait_free(g, 5000),
       "a slot of an unknown connection is reclaimed by the sweep");
    client_close(&c);

    /* a worker process dies holding a running and a claimed slot */
    int pfd[2];
    if (pipe(pfd) != 0)
        pfd[0] = pfd[1] = -1;
    pid_t pid = fork();
    if (pid == 0) {
        client_t cc;
        uint32_t sq, ix, q;
        int32_t idx[2] = {-1, -1};
        if (client_open(&cc, sock) == 0) {
            hp_ipc_slot_t *r = client_submit(&cc, "a long one", 100000, 1, &sq);
            if (r)
                idx[0] = (int32_t)(((char *)r - (char *)cc.h -
                                    sizeof(hp_ipc_header_t)) /
                                   cc.h->slot_stride);
            if (hp_ipc_claim(cc.h, cc.hello.conn_id, getpid(), &ix, &q))
                idx[1] = (int32_t)ix;
        }
        if (write(pfd[1], idx, sizeof(idx)) < 0)
            _exit(1);
        pause(); /* killed by the parent */
        _exit(0);
    }
    int32_t held[2] = {-1, -1};
    if (read(pfd[0], held, sizeof(held)) != sizeof(held))
        held[0] = held[1] = -1;
    ok(held[0] >= 0 && held[1] >= 0,
       "a child worker holds a running and a claimed slot");
    client_t obs;
    client_open(&obs, sock);
    hp_ipc_slot_t *r0 =
        hp_ipc_slot(obs.h, (uint32_t)(held[0] < 0 ? 0 : held[0]));
    hp_ipc_slot_t *r1 =
        hp_ipc_slot(obs.h, (uint32_t)(held[1] < 0 ? 0 : held[1]));
    ok(wait_state(r0, HP_IPC_RUNNING, 10000), "its request runs");
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    ok(wait_free(r0, 10000) && wait_free(r1, 10000),
       "when it dies both its slots come back");
    hp_sched_stats_t st;
    for (int i = 0; i < 100; i++) {
        hp_sched_stats(e.sched, &st);
        if (st.live == 0)
            break;
        usleep(10000);
    }
    ok(st.live == 0 && st.bytes == 0,
       "and the engine holds no request memory (%d live, %zu bytes)", st.live,
       st.bytes);
    client_close(&obs);
    close(pfd[0]);
    close(pfd[1]);
    engine_stop(&e);

    /* a restart: a new segment, a generation one higher */
    struct stat sb;
    ok(stat(sock, &sb) != 0, "a stopped server removes its socket");
    ok(engine_start(&e, &llm, sock, shm, 2, 0) == 0 &&
           hp_ipc_server_generation(e.srv) == gen1 + 1,
       "a restarted engine runs as generation %llu",
       (unsigned long long)gen1 + 1);
    ok(client_open(&c, sock) == 0 && c.hello.generation == gen1 + 1 &&
           c.h->generation == gen1 + 1,
       "and says so in hello and header");
    client_close(&c);
    hp_error_t e2 = {0};
    hp_ipc_server_t *dup;
    hp_ipc_server_cfg_t cfg = {.socket_path = sock,
                               .shm_name = "/hypic-test-ipc-dup",
                               .slots = 1,
                               .input_bytes = 64,
                               .ring_bytes = HP_IPC_RING_MIN};
    ok(hp_ipc_server_open(&dup, &cfg, &e2) == HP_EIO &&
           strstr(e2.msg, "another engine"),
       "a second engine on a live socket is refused: %s", e2.msg);
    engine_stop(&e);
    {
        char gen[96];
        snprintf(gen, sizeof(gen), "%s.gen", shm);
        shm_unlink(gen);
        shm_unlink("/hypic-test-ipc-dup.gen");
    }
    hp_llm_free(&llm);
}

int main(void)
{
    signal(SIGPIPE, SIG_IGN);
    test_layout();
    test_lifecycle();
    test_ring();
    test_spsc();
    test_utf8_cut();
    test_errors();
    test_server();
    return tap_done();
}
