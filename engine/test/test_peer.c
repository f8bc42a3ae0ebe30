/*
 * test_peer.c - the peer transport: the wire format rejects malformed,
 * oversized, wrongly checksummed and wrong-version messages (crafted bytes
 * and random mutations); two engines in one process on loopback ports: a
 * segment prefilled on A is fetched by B and B's pic logits equal A's
 * bitwise; remote PREFILL; a dead or silent peer fails fast and the caller
 * recomputes locally; a lying peer publishes nothing; the RDMA probe
 * reports cleanly.
 */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define XXH_STATIC_LINKING_ONLY
#include <xxhash.h>

#include "engine/cache/assemble.h"
#include "engine/cache/prompt.h"
#include "engine/cache/segcache.h"
#include "engine/cluster/peer.h"
#include "t/lib/tap.h"

#define SEP        "<|pic_sep|>"
#define W          8
#define VAR_LEAD   1u
#define VAR_NAIVE  2u
#define VAR_PIC    (3u | (W << 8))
#define TIMEOUT_MS 2000

static const char *PROMPT =
    "You are a careful assistant." SEP
    "The capital of Zorvia is Quellam. Zorvia exports copper and tea, and "
    "its population is 4812 people living mostly in the hills." SEP
    "Water boils at one hundred degrees at sea level; at altitude it boils "
    "earlier because the air pressure is lower." SEP
    "A short note about tea: it is grown on terraces in the hills." SEP
    "Copper ore is smelted in the east of the country, near the border." SEP
    "What is the capital of Zorvia?";

static double now_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e3 + t.tv_nsec * 1e-6;
}

static uint64_t rs = 0x2545f4914f6cdd1dULL;
static uint32_t rnd(void)
{
    rs ^= rs << 13;
    rs ^= rs >> 7;
    rs ^= rs << 17;
    return (uint32_t)(rs >> 17);
}

/* Rewrites a header's fields and re-signs it (a well-formed header that
 * says something the receiver must refuse). */
static void resign(uint8_t *h, uint16_t version, uint16_t type, uint64_t len)
{
    h[4] = (uint8_t)version;
    h[5] = (uint8_t)(version >> 8);
    h[6] = (uint8_t)type;
    h[7] = (uint8_t)(type >> 8);
    for (int i = 0; i < 8; i++)
        h[8 + i] = (uint8_t)(len >> (8 * i));
    uint64_t s = XXH3_64bits(h, 24);
    for (int i = 0; i < 8; i++)
        h[24 + i] = (uint8_t)(s >> (8 * i));
}

/* decode + parse of buf[n] (header then payload) */
static int receive(const uint8_t *buf, size_t n, uint64_t max, hp_peer_msg_t *m,
                   hp_error_t *err)
{
    hp_peer_hdr_t h;
    int rc = hp_peer_hdr_decode(&h, buf, max, err);
    if (rc != HP_OK)
        return rc;
    if (h.length > n - HP_PEER_HDR_BYTES)
        return HP_EUNAVAIL; /* the stream would end early */
    return hp_peer_msg_parse(m, &h, buf + HP_PEER_HDR_BYTES, err);
}

static size_t msg(uint8_t *out, int type, const void *pl, size_t n)
{
    const void *parts[1] = {pl};
    hp_peer_hdr_encode(out, type, parts, &n, 1);
    memcpy(out + HP_PEER_HDR_BYTES, pl, n);
    return HP_PEER_HDR_BYTES + n;
}

static void check_wire(void)
{
    uint8_t key[16], buf[4096], bad[4096], pl[256];
    hp_peer_msg_t m;
    hp_error_t err = {0};
    for (int i = 0; i < 16; i++)
        key[i] = (uint8_t)(i * 7 + 1);

    size_t n = msg(buf, HP_PEER_GET_SEGMENT, pl, hp_peer_enc_key(pl, key, 77));
    ok(receive(buf, n, 0, &m, &err) == HP_OK && m.type == HP_PEER_GET_SEGMENT &&
           !memcmp(m.key, key, 16) && m.variant == 77,
       "wire: GET_SEGMENT round-trips");

    memcpy(bad, buf, n);
    bad[0] ^= 1;
    ok(receive(bad, n, 0, &m, &err) == HP_EBADINPUT, "wire: bad magic "
                                                     "refused");
    memcpy(bad, buf, n);
    bad[9] ^= 0x40; /* the length, unsigned */
    ok(receive(bad, n, 0, &m, &err) == HP_EBADINPUT &&
           strstr(err.msg, "header checksum"),
       "wire: a corrupt length fails the header checksum (%s)", err.msg);
    memcpy(bad, buf, n);
    resign(bad, 2, HP_PEER_GET_SEGMENT, 24);
    ok(receive(bad, n, 0, &m, &err) == HP_EBADINPUT &&
           strstr(err.msg, "version 2"),
       "wire: version 2 refused (%s)", err.msg);
    memcpy(bad, buf, n);
    resign(bad, 1, 9, 24);
    ok(receive(bad, n, 0, &m, &err) == HP_EBADINPUT, "wire: unknown type "
                                                     "refused");
    memcpy(bad, buf, n);
    resign(bad, 1, HP_PEER_GET_SEGMENT, 1ull << 40);
    ok(receive(bad, n, 0, &m, &err) == HP_ETOOLARGE,
       "wire: a signed 1 TiB length is refused before any read (%s)", err.msg);
    ok(receive(buf, n, 16, &m, &err) == HP_ETOOLARGE,
       "wire: the receiver's own bound applies");
    memcpy(bad, buf, n);
    bad[HP_PEER_HDR_BYTES + 3] ^= 1;
    ok(receive(bad, n, 0, &m, &err) == HP_EBADINPUT &&
           strstr(err.msg, "payload checksum"),
       "wire: a corrupt payload fails its checksum");

    /* structurally wrong payloads, correctly signed */
    n = msg(bad, HP_PEER_GET_SEGMENT, pl, 10);
    ok(receive(bad, n, 0, &m, &err) == HP_EBADINPUT, "wire: short GET "
                                                     "refused");
    hp_peer_enc_segment(pl, key, 77, 1000);
    n = msg(bad, HP_PEER_SEGMENT, pl, 40);
    ok(receive(bad, n, 0, &m, &err) == HP_EBADINPUT,
       "wire: SEGMENT whose byte count disagrees with its length refused");
    hp_peer_enc_prefill(pl, key, 77, HP_PEER_KIND_PIC, 8, 5);
    n = msg(bad, HP_PEER_PREFILL, pl, 32 + 4 * 4);
    ok(receive(bad, n, 0, &m, &err) == HP_EBADINPUT,
       "wire: PREFILL with 4 ids for 5 tokens refused");
    n = msg(bad, HP_PEER_ERROR, pl, 4);
    ok(receive(bad, n, 0, &m, &err) == HP_EBADINPUT, "wire: short ERROR "
                                                     "refused");

    /* random mutations of a valid SEGMENT: never accepted as changed */
    uint8_t seg[200];
    hp_peer_enc_segment(seg, key, 77, 168);
    for (int i = 32; i < 200; i++)
        seg[i] = (uint8_t)i;
    size_t sn = msg(buf, HP_PEER_SEGMENT, seg, 200);
    int accepted_changed = 0, trials = 20000;
    for (int t = 0; t < trials; t++) {
        memcpy(bad, buf, sn);
        size_t len = sn;
        int flips = 1 + (int)(rnd() % 4);
        for (int f = 0; f < flips; f++)
            bad[rnd() % sn] ^= (uint8_t)(1 + rnd() % 255);
        if (rnd() % 4 == 0) { /* a lying, re-signed length */
            uint64_t l = rnd() % 400;
            resign(bad, 1, HP_PEER_SEGMENT, l);
        }
        if (rnd() % 8 == 0)
            len = rnd() % sn; /* truncated */
        if (len < HP_PEER_HDR_BYTES)
            continue;
        if (receive(bad, len, 1 << 20, &m, &err) == HP_OK &&
            memcmp(bad, buf, sn))
            accepted_changed++;
    }
    ok(!accepted_changed,
       "wire: %d random mutations, none accepted (%d slipped through)", trials,
       accepted_changed);
}

/* ---- a fake peer: accepts one connection, reads, answers `reply` ------- */

typedef struct {
    int lfd, port;
    const uint8_t *reply;
    size_t n;
    int silent; /* accept nothing at all */
} fake_t;

static int listen_any(int *port)
{
    struct sockaddr_in a = {.sin_family = AF_INET};
    socklen_t al = sizeof(a);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    bind(fd, (struct sockaddr *)&a, sizeof(a));
    listen(fd, 8);
    getsockname(fd, (struct sockaddr *)&a, &al);
    *port = ntohs(a.sin_port);
    return fd;
}

static void *fake_main(void *arg)
{
    fake_t *f = arg;
    uint8_t req[64];
    int fd = accept(f->lfd, NULL, NULL);
    if (fd < 0)
        return NULL;
    if (recv(fd, req, sizeof(req), 0) > 0 && f->n)
        send(fd, f->reply, f->n, MSG_NOSIGNAL);
    close(fd);
    return NULL;
}

/* raw bytes to a server; returns the reply's type (0: closed without
 * reply) and whether the connection was then closed */
static int raw_exchange(int port, const uint8_t *b, size_t n, int *closed)
{
    struct sockaddr_in a = {.sin_family = AF_INET,
                            .sin_port = htons((uint16_t)port)};
    uint8_t r[4096];
    hp_peer_hdr_t h;
    hp_error_t err;
    struct timeval tv = {5, 0};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    if (connect(fd, (struct sockaddr *)&a, sizeof(a)) != 0) {
        close(fd);
        return -1;
    }
    send(fd, b, n, MSG_NOSIGNAL);
    size_t got = 0;
    ssize_t k;
    while ((k = recv(fd, r + got, sizeof(r) - got, 0)) > 0)
        got += (size_t)k;
    *closed = k == 0;
    close(fd);
    if (got < HP_PEER_HDR_BYTES || hp_peer_hdr_decode(&h, r, 0, &err) != HP_OK)
        return 0;
    return h.type;
}

typedef struct {
    hp_cache_t cache;
    hp_peer_server_t *srv;
    char addr[64];
} node_t;

static int node_start(node_t *nd, const hp_llm_t *llm, int io_ms)
{
    hp_error_t err = {0};
    nd->cache.pub = hp_pool_create(64 << 20, &err);
    nd->cache.prefix = NULL;
    hp_peer_server_cfg_t cfg = {.listen = "127.0.0.1:0",
                                .pub = nd->cache.pub,
                                .llm = llm,
                                .io_timeout_ms = io_ms};
    nd->srv = hp_peer_server_start(&cfg, &err);
    if (!nd->srv) {
        tap_diag("%s", err.msg);
        return 0;
    }
    snprintf(nd->addr, sizeof(nd->addr), "127.0.0.1:%d",
             hp_peer_server_port(nd->srv));
    return 1;
}

static uint32_t var_of(int i)
{
    return i == 0 ? VAR_LEAD : VAR_PIC;
}

static float *assemble(const hp_llm_t *llm, hp_cache_t *c, hp_fwd_ws_t *ws,
                       const hp_prompt_t *p, hp_assemble_stats_t *st, int *rc)
{
    hp_error_t err = {0};
    hp_seq_t seq;
    float *lg = malloc((size_t)llm->model.cfg.vocab_size * 4);
    hp_seq_init(&seq, &llm->model, &err);
    *rc = hp_assemble(llm, c, ws, p, HP_IPC_MODE_PIC, W, &seq, lg, st, &err);
    if (*rc != HP_OK)
        tap_diag("assemble: %s", err.msg);
    hp_seq_free(&seq);
    return lg;
}

int main(void)
{
    const char *root = getenv("HYPIC_ROOT") ? getenv("HYPIC_ROOT") : ".";
    char dir[1024];
    hp_llm_t llm;
    hp_fwd_ws_t ws;
    hp_error_t err = {0};
    hp_prompt_t p;
    hp_assemble_stats_t st;
    hp_peer_server_stats_t ss;
    int rc;

    check_wire();

    snprintf(dir, sizeof(dir), "%s/models/test/qwen35-dense", root);
    if (!ok(hp_llm_load(&llm, dir, &err) == HP_OK, "model loads")) {
        tap_diag("%s", err.msg);
        return tap_done();
    }
    const hp_model_config_t *c = &llm.model.cfg;
    const hp_model_t *mdl = &llm.model;
    size_t V = (size_t)c->vocab_size;
    ok(hp_fwd_ws_init(&ws, &llm.model, NULL, &err) == HP_OK, "workspace (%s)",
       err.msg);
    hp_prompt_build(&p, &llm, PROMPT, strlen(PROMPT), SEP, &err);
    int nc = p.n_segs - 1; /* lead + documents */

    /* the entry check against the local model */
    const hp_prompt_seg_t *d1 = &p.segs[1];
    size_t eb = hp_segc_bytes(c, HP_SEGC_PIC, d1->len, W);
    void *ent = aligned_alloc(64, (eb + 63) / 64 * 64);
    hp_pool_entry_t te = {.data = ent, .bytes = eb};
    hp_segc_build_pic(&te, &llm.model, &ws, p.ids + d1->start, d1->len, W,
                      &err);
    int e_ok = hp_peer_check_entry(c, VAR_PIC, ent, eb, &err) == HP_OK;
    int e_var = hp_peer_check_entry(c, VAR_NAIVE, ent, eb, &err) != HP_OK;
    int e_seam = hp_peer_check_entry(c, 3u | (4u << 8), ent, eb, &err) != 0;
    int e_len = hp_peer_check_entry(c, VAR_PIC, ent, eb - 4, &err) != 0;
    ((hp_segc_hdr_t *)ent)->n_tok += 1;
    int e_tok = hp_peer_check_entry(c, VAR_PIC, ent, eb, &err) != 0;
    ok(e_ok && e_var && e_seam && e_len && e_tok,
       "entry check: a real entry passes; wrong kind, seam, size or token "
       "count fail");
    free(ent);

    /* A prefills, B fetches */
    node_t A, B;
    if (!ok(node_start(&A, &llm, 300) && node_start(&B, &llm, 300),
            "two engines listen on loopback (%s, %s)", A.addr, B.addr))
        return tap_done();
    hp_assemble_warm(&llm, &A.cache, &ws, &p, HP_IPC_MODE_PIC, W, NULL, &err);
    float *la = assemble(&llm, &A.cache, &ws, &p, &st, &rc);
    int fetched = 0;
    for (int i = 0; i < nc; i++) {
        hp_pool_entry_t *e = NULL;
        if (hp_peer_fetch(A.addr, p.segs[i].id, var_of(i), B.cache.pub, mdl,
                          TIMEOUT_MS, &e, &err) == HP_OK &&
            e) {
            hp_pool_entry_t *ea =
                hp_pool_get(A.cache.pub, p.segs[i].id, var_of(i));
            fetched += ea && ea->bytes == e->bytes &&
                       !memcmp(ea->data, e->data, e->bytes) &&
                       !memcmp(ea->meta, e->meta, sizeof(e->meta));
            hp_pool_release(A.cache.pub, ea);
        } else {
            tap_diag("fetch %d: %s", i, err.msg);
        }
        hp_pool_release(B.cache.pub, e);
    }
    ok(fetched == nc,
       "B fetched all %d segments from A, byte-identical, headers adopted", nc);
    float *lb = assemble(&llm, &B.cache, &ws, &p, &st, &rc);
    ok(rc == HP_OK && st.miss_segments == 0 && st.hit_segments == nc,
       "B assembles with every segment a hit (%d hit)", st.hit_segments);
    ok(!memcmp(la, lb, V * 4), "B's pic logits equal A's, bitwise");

    uint8_t nokey[16] = {1, 2, 3};
    hp_pool_stats_t pb0, pb1;
    hp_pool_stats(B.cache.pub, &pb0);
    rc = hp_peer_fetch(A.addr, nokey, VAR_PIC, B.cache.pub, mdl, TIMEOUT_MS,
                       NULL, &err);
    hp_pool_stats(B.cache.pub, &pb1);
    ok(rc == HP_PEER_NOT_FOUND_RC && pb1.entries == pb0.entries,
       "an unknown segment: NOT_FOUND, nothing published");

    /* remote PREFILL: B has A compute a naive (STATE) entry */
    const hp_prompt_seg_t *d2 = &p.segs[2];
    hp_pool_entry_t *pe = NULL;
    rc = hp_peer_prefill(A.addr, d2->id, VAR_NAIVE, HP_PEER_KIND_STATE, 0,
                         p.ids + d2->start, d2->len, B.cache.pub, mdl,
                         TIMEOUT_MS, &pe, &err);
    size_t sb = hp_segc_bytes(c, HP_SEGC_STATE, d2->len, 0);
    void *loc = aligned_alloc(64, (sb + 63) / 64 * 64);
    hp_pool_entry_t tl = {.data = loc, .bytes = sb};
    hp_segc_build_state(&tl, &llm.model, &ws, p.ids + d2->start, d2->len, &err);
    hp_peer_server_stats(A.srv, &ss);
    ok(rc == HP_OK && pe && pe->bytes == sb && !memcmp(pe->data, loc, sb) &&
           ss.prefills == 1 && hp_pool_contains(A.cache.pub, d2->id, VAR_NAIVE),
       "remote PREFILL: A computes and keeps it, B gets the same bytes as a "
       "local build (rc %d %s)",
       rc, rc ? err.msg : "");
    hp_pool_release(B.cache.pub, pe);
    free(loc);
    rc = hp_peer_prefill(A.addr, d2->id, VAR_NAIVE, HP_PEER_KIND_PIC, W,
                         p.ids + d2->start, d2->len, B.cache.pub, mdl,
                         TIMEOUT_MS, NULL, &err);
    ok(rc == HP_EUNAVAIL && strstr(err.msg, "refused"),
       "a PREFILL whose kind contradicts its variant is refused (%s)", err.msg);

    /* malformed bytes at A's listener: an ERROR, the connection closed,
     * the server still serving */
    uint8_t raw[256];
    int closed = 0;
    memset(raw, 0xab, sizeof(raw));
    int t1 = raw_exchange(hp_peer_server_port(A.srv), raw, 64, &closed);
    int c1 = closed;
    uint8_t pl[24];
    size_t n = msg(raw, HP_PEER_GET_SEGMENT, pl,
                   hp_peer_enc_key(pl, p.segs[1].id, VAR_PIC));
    resign(raw, 1, HP_PEER_GET_SEGMENT, 1ull << 40);
    int t2 = raw_exchange(hp_peer_server_port(A.srv), raw, n, &closed);
    int c2 = closed;
    n = msg(raw, HP_PEER_GET_SEGMENT, pl,
            hp_peer_enc_key(pl, p.segs[1].id, VAR_PIC));
    resign(raw, 7, HP_PEER_GET_SEGMENT, 24);
    int t3 = raw_exchange(hp_peer_server_port(A.srv), raw, n, &closed);
    int c3 = closed;
    n = msg(raw, HP_PEER_SEGMENT, pl, 24); /* a reply type as a request */
    int t4 = raw_exchange(hp_peer_server_port(A.srv), raw, n, &closed);
    hp_peer_server_stats(A.srv, &ss);
    ok(t1 == HP_PEER_ERROR && t2 == HP_PEER_ERROR && t3 == HP_PEER_ERROR &&
           t4 == HP_PEER_ERROR && c1 && c2 && c3 && closed && ss.rejected == 4,
       "garbage, a 1 TiB length, version 7, a reply as request: each gets "
       "ERROR and a closed connection (%llu rejected)",
       (unsigned long long)ss.rejected);
    rc = hp_peer_fetch(A.addr, p.segs[1].id, VAR_PIC, B.cache.pub, mdl,
                       TIMEOUT_MS, NULL, &err);
    ok(rc == HP_OK, "A still serves afterwards");

    /* a lying peer: right header, wrong payload checksum; then a peer that
     * closes mid-payload: nothing is published either way */
    hp_cache_t C = {hp_pool_create(64 << 20, &err), NULL};
    hp_pool_entry_t *good = hp_pool_get(A.cache.pub, p.segs[1].id, VAR_PIC);
    size_t rn = HP_PEER_HDR_BYTES + 32 + good->bytes;
    uint8_t *rep = malloc(rn);
    uint8_t pre[32];
    hp_peer_enc_segment(pre, good->key, good->variant, good->bytes);
    const void *parts[2] = {pre, good->data};
    size_t lens[2] = {32, good->bytes};
    hp_peer_hdr_encode(rep, HP_PEER_SEGMENT, parts, lens, 2);
    memcpy(rep + HP_PEER_HDR_BYTES, pre, 32);
    memcpy(rep + HP_PEER_HDR_BYTES + 32, good->data, good->bytes);
    hp_pool_release(A.cache.pub, good);
    rep[rn - 5] ^= 0x10; /* one bit of one float */
    fake_t fk = {.reply = rep, .n = rn};
    pthread_t th;
    fk.lfd = listen_any(&fk.port);
    char fa[64];
    snprintf(fa, sizeof(fa), "127.0.0.1:%d", fk.port);
    pthread_create(&th, NULL, fake_main, &fk);
    int rl = hp_peer_fetch(fa, p.segs[1].id, VAR_PIC, C.pub, mdl, TIMEOUT_MS,
                           NULL, &err);
    pthread_join(th, NULL);
    fk.n = rn / 2;
    pthread_create(&th, NULL, fake_main, &fk);
    int rt = hp_peer_fetch(fa, p.segs[1].id, VAR_PIC, C.pub, mdl, TIMEOUT_MS,
                           NULL, &err);
    pthread_join(th, NULL);
    close(fk.lfd);
    hp_pool_stats_t pc;
    hp_pool_stats(C.pub, &pc);
    ok(rl == HP_EBADINPUT && rt == HP_EUNAVAIL && pc.entries == 0 &&
           pc.bytes_used == 0,
       "a flipped bit fails the checksum, a cut stream fails as "
       "unavailable; nothing published");
    free(rep);

    /* dead peers: nobody listening (refused at once), and one that
     * accepts but never answers (timeout); then local recompute */
    int dead_port;
    int dfd = listen_any(&dead_port);
    close(dfd);
    char da[64];
    snprintf(da, sizeof(da), "127.0.0.1:%d", dead_port);
    double t0 = now_ms();
    int rd = hp_peer_fetch(da, p.segs[1].id, VAR_PIC, C.pub, mdl, TIMEOUT_MS,
                           NULL, &err);
    double dt_refused = now_ms() - t0;
    ok(rd == HP_EUNAVAIL && dt_refused < TIMEOUT_MS,
       "a dead peer fails at once (%s, %.0f ms)", err.msg, dt_refused);
    int sil_port, sfd = listen_any(&sil_port); /* backlog only: no accept */
    char sa[64];
    snprintf(sa, sizeof(sa), "127.0.0.1:%d", sil_port);
    t0 = now_ms();
    int rsil =
        hp_peer_fetch(sa, p.segs[1].id, VAR_PIC, C.pub, mdl, 200, NULL, &err);
    double dt_sil = now_ms() - t0;
    ok(rsil == HP_ETIMEOUT && dt_sil >= 190 && dt_sil < 5000,
       "a silent peer times out after its deadline (%.0f ms for 200)", dt_sil);
    close(sfd);
    int fetched_c = 0;
    for (int i = 0; i < nc; i++) /* fetch what we can, ... */
        fetched_c += hp_peer_fetch(da, p.segs[i].id, var_of(i), C.pub, mdl,
                                   TIMEOUT_MS, NULL, &err) == HP_OK;
    float *lc = assemble(&llm, &C, &ws, &p, &st, &rc); /* ... recompute */
    ok(fetched_c == 0 && rc == HP_OK && st.miss_segments == nc &&
           !memcmp(lc, la, V * 4),
       "with the peer dead the caller recomputes locally: same logits");
    hp_pool_destroy(C.pub);

    /* stop with a connection open and idle */
    int idle_closed = 0;
    struct sockaddr_in ia = {.sin_family = AF_INET,
                             .sin_port =
                                 htons((uint16_t)hp_peer_server_port(B.srv))};
    ia.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    int ifd = socket(AF_INET, SOCK_STREAM, 0);
    connect(ifd, (struct sockaddr *)&ia, sizeof(ia));
    send(ifd, raw, 10, MSG_NOSIGNAL); /* half a header */
    t0 = now_ms();
    hp_peer_server_stop(B.srv);
    double dt_stop = now_ms() - t0;
    char tmp[8];
    idle_closed = recv(ifd, tmp, sizeof(tmp), 0) <= 0;
    close(ifd);
    ok(idle_closed && dt_stop < 2000,
       "stop ends an idle connection and returns (%.0f ms)", dt_stop);
    hp_peer_server_stop(A.srv);

    rc = hp_peer_verbs_probe(&err);
    ok(rc == HP_EUNAVAIL || rc > 0, "RDMA probe reports cleanly: %s",
       rc > 0 ? "devices found" : err.msg);

    free(la);
    free(lb);
    free(lc);
    hp_pool_destroy(A.cache.pub);
    hp_pool_destroy(B.cache.pub);
    hp_prompt_free(&p);
    hp_fwd_ws_free(&ws);
    hp_llm_free(&llm);
    return tap_done();
}
