/*
 * test_prefill_pool.c - segment parallelism on one node: the OpenMP
 * thread count is each worker's own, the parallel warm pass publishes
 * every segment (one at a time, as each is done) on the worker LPT chose,
 * and the assembly after it is bit-identical to the sequential warm path's;
 * a worker error fails only its own request, and leaves no reference.
 */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <omp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "engine/cache/assemble.h"
#include "engine/cache/prompt.h"
#include "engine/cache/segcache.h"
#include "engine/cluster/peer.h"
#include "engine/serve/lpt.h"
#include "engine/serve/prefill_pool.h"
#include "t/lib/tap.h"

#define SEP "<|pic_sep|>"
#define W   8
/* lead, four documents of uneven length, the question */
static const char *PROMPT =
    "You are a careful assistant who answers from the documents." SEP
    "The capital of Zorvia is Quellam. Zorvia exports copper and tea, and "
    "its population is 4812 people living mostly in the hills. The hills "
    "are green in spring and brown in late summer, and the rivers that run "
    "from them feed the valley farms." SEP
    "Water boils at one hundred degrees at sea level; at altitude it boils "
    "earlier because the air pressure is lower." SEP
    "A short note about tea: it is grown on terraces." SEP
    "Copper ore is smelted in the east of the country, near the border, in "
    "three old furnaces that date from the last century and still run "
    "every day of the week except on the feast of the harvest." SEP
    "What is the capital of Zorvia?";

typedef struct {
    pthread_mutex_t mu;
    const hp_prompt_t *p;
    hp_pool_t *pub;
    int calls, ok, bad_entry;
    int worker[16];    /* by segment index, -1 none */
    int visible_first; /* cold segments in the pool at the first call */
    int order[16];     /* segments in completion order */
} rec_t;

static void rec_init(rec_t *r, const hp_prompt_t *p, hp_pool_t *pub)
{
    memset(r, 0, sizeof(*r));
    pthread_mutex_init(&r->mu, NULL);
    r->p = p;
    r->pub = pub;
    for (int i = 0; i < 16; i++)
        r->worker[i] = -1;
}

static void on_done(void *ud, const hp_prefill_done_t *d)
{
    rec_t *r = ud;
    pthread_mutex_lock(&r->mu);
    if (r->calls == 0)
        for (int i = 0; i < r->p->n_segs; i++)
            r->visible_first += hp_pool_contains(r->pub, r->p->segs[i].id,
                                                 i == 0 ? 1u : (3u | (W << 8)));
    r->order[r->calls++] = d->seg;
    if (d->status == HP_OK) {
        r->ok++;
        if (!d->entry ||
            !hp_pool_contains(r->pub, d->entry->key, d->entry->variant))
            r->bad_entry++;
    }
    if (d->seg >= 0 && d->seg < 16)
        r->worker[d->seg] = d->worker;
    pthread_mutex_unlock(&r->mu);
}

typedef struct {
    hp_llm_t llm;
    hp_fwd_ws_t ws;
    size_t V;
} ctx_t;

static hp_cache_t cache_new(size_t budget)
{
    hp_error_t err = {0};
    hp_cache_t c = {hp_pool_create(budget, &err), NULL};
    return c;
}

/* pic (or naive) assembly from cache c; logits malloc'd */
static float *assemble(ctx_t *x, hp_cache_t *c, const hp_prompt_t *p,
                       hp_ipc_mode_t mode, hp_assemble_stats_t *st, int *rc)
{
    hp_error_t err = {0};
    hp_seq_t seq;
    float *lg = malloc(x->V * 4);
    hp_seq_init(&seq, &x->llm.model, &err);
    *rc = hp_assemble(&x->llm, c, &x->ws, p, mode, W, &seq, lg, st, &err);
    if (*rc != HP_OK)
        tap_diag("assemble: %s", err.msg);
    hp_seq_free(&seq);
    return lg;
}

/* entries of every cacheable segment bytewise equal in both pools */
static int same_entries(const hp_prompt_t *p, hp_pool_t *a, hp_pool_t *b,
                        hp_ipc_mode_t mode)
{
    int same = 1;
    for (int i = 0; i < p->n_segs - 1; i++) {
        uint32_t var = i == 0                    ? 1u
                       : mode == HP_IPC_MODE_PIC ? 3u | (W << 8)
                                                 : 2u;
        hp_pool_entry_t *ea = hp_pool_get(a, p->segs[i].id, var);
        hp_pool_entry_t *eb = hp_pool_get(b, p->segs[i].id, var);
        same = same && ea && eb && ea->bytes == eb->bytes &&
               !memcmp(ea->data, eb->data, ea->bytes);
        hp_pool_release(a, ea);
        hp_pool_release(b, eb);
    }
    return same;
}

static void check_threads(void)
{
    hp_error_t err = {0};
    hp_prefill_pool_t *pp;
    int mx, team, good = 1;
    omp_set_num_threads(3);
    hp_prefill_pool_cfg_t cfg = {.workers = 2, .threads_per_worker = 2};
    if (!ok(hp_prefill_pool_create(&pp, &cfg, &err) == HP_OK,
            "a pool of 2 workers x 2 threads starts"))
        return;
    for (int i = 0; i < 2; i++) {
        hp_prefill_pool_worker_omp(pp, i, &mx, &team);
        good = good && mx == 2 && team == 2;
    }
    ok(good && omp_get_max_threads() == 3,
       "omp_set_num_threads is per thread: workers see 2 (team of 2), the "
       "caller still 3");
    hp_prefill_pool_destroy(pp);
    cfg = (hp_prefill_pool_cfg_t){.workers = 2, .threads_per_worker = 1};
    hp_prefill_pool_create(&pp, &cfg, &err);
    hp_prefill_pool_worker_omp(pp, 1, &mx, &team);
    ok(mx == 1 && team == 1 && omp_get_max_threads() == 3,
       "2 workers x 1 thread: each runs alone");
    hp_prefill_pool_destroy(pp);
    omp_set_num_threads(2);
    cfg.workers = 0;
    ok(hp_prefill_pool_create(&pp, &cfg, &err) == HP_EBADINPUT && !pp,
       "0 workers refused");
}

static int logged_failures;
static void on_log(void *ud, int level, const char *msg)
{
    (void)ud;
    if (level == HP_LOG_WARN && strstr(msg, "failed"))
        __atomic_add_fetch(&logged_failures, 1, __ATOMIC_RELAXED);
}

/* A peer that dies mid-request: accepts, reads the request, closes. */
typedef struct {
    int lfd, port, conns;
} dying_t;

static void *dying_main(void *arg)
{
    dying_t *d = arg;
    char buf[65536];
    for (int i = 0; i < d->conns; i++) {
        int fd = accept(d->lfd, NULL, NULL);
        if (fd < 0)
            return NULL;
        if (recv(fd, buf, sizeof(buf), 0) < 0) { /* then "killed" */
        }
        close(fd);
    }
    return NULL;
}

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

/* Remote workers: a live peer computes its LPT share, a peer that holds
 * the segments serves them, a dead or dying peer costs a local recompute;
 * the logits stay bit-identical every time. */
static void check_peers(ctx_t *x, const hp_prompt_t *p, const float *ls)
{
    hp_error_t err = {0};
    hp_prefill_stats_t ps;
    hp_assemble_stats_t st;
    int rc;
    hp_cache_t cb = cache_new(64 << 20);
    hp_peer_server_cfg_t scfg = {
        .listen = "127.0.0.1:0", .pub = cb.pub, .llm = &x->llm};
    hp_peer_server_t *srv = hp_peer_server_start(&scfg, &err);
    if (!ok(srv != NULL, "a peer listens on loopback")) {
        tap_diag("%s", err.msg);
        return;
    }
    char addr[64];
    snprintf(addr, sizeof(addr), "127.0.0.1:%d", hp_peer_server_port(srv));
    const char *peers[1] = {addr};
    hp_prefill_pool_cfg_t cfg = {.workers = 1,
                                 .peers = peers,
                                 .n_peers = 1,
                                 .peer_timeout_ms = 5000,
                                 .log = on_log};
    hp_prefill_pool_t *pp;
    hp_prefill_pool_create(&pp, &cfg, &err);
    ok(hp_prefill_pool_workers(pp) == 2, "1 local worker + 1 peer");

    hp_cache_t ca = cache_new(64 << 20);
    rc = hp_prefill_pool_run(pp, &x->llm, &ca, p, HP_IPC_MODE_PIC, W, NULL,
                             NULL, &ps, &err);
    float *l1 = assemble(x, &ca, p, HP_IPC_MODE_PIC, &st, &rc);
    hp_peer_server_stats_t ss;
    hp_peer_server_stats(srv, &ss);
    ok(rc == HP_OK && ps.published == 5 && ps.remote == ps.per_worker[1] &&
           ps.remote >= 1 && ss.prefills == (uint64_t)ps.remote &&
           !ps.fallbacks,
       "the peer prefilled its LPT share (%d of 5 segments)", ps.remote);
    ok(st.miss_segments == 0 && !memcmp(l1, ls, x->V * 4),
       "logits with a remote worker equal the sequential ones, bitwise");
    hp_prefill_pool_destroy(pp);

    /* the peer holds every segment now: fetched, not computed */
    hp_assemble_warm(&x->llm, &cb, &x->ws, p, HP_IPC_MODE_PIC, W, NULL, &err);
    cfg.peer_fetch = 1;
    hp_prefill_pool_create(&pp, &cfg, &err);
    hp_cache_t cf = cache_new(64 << 20);
    rc = hp_prefill_pool_run(pp, &x->llm, &cf, p, HP_IPC_MODE_PIC, W, NULL,
                             NULL, &ps, &err);
    float *l2 = assemble(x, &cf, p, HP_IPC_MODE_PIC, &st, &rc);
    ok(rc == HP_OK && ps.fetched == 5 && st.miss_segments == 0 &&
           !memcmp(l2, ls, x->V * 4),
       "peer_fetch: all 5 pulled from the peer that held them, same bits");
    ok(ps.miss_tokens > 0 && ps.fetched_tokens == ps.miss_tokens,
       "peer_fetch: their %ld cached tokens counted as fetched",
       ps.fetched_tokens);
    hp_prefill_pool_destroy(pp);
    hp_peer_server_stop(srv);

    /* the peer is gone: refused at once, its share recomputed here */
    logged_failures = 0;
    cfg.peer_fetch = 0;
    hp_prefill_pool_create(&pp, &cfg, &err);
    hp_cache_t cd = cache_new(64 << 20);
    rc = hp_prefill_pool_run(pp, &x->llm, &cd, p, HP_IPC_MODE_PIC, W, NULL,
                             NULL, &ps, &err);
    float *l3 = assemble(x, &cd, p, HP_IPC_MODE_PIC, &st, &rc);
    ok(rc == HP_OK && ps.published == 5 && ps.fallbacks >= 1 && !ps.remote &&
           logged_failures >= 1 && st.miss_segments == 0 &&
           !memcmp(l3, ls, x->V * 4),
       "dead peer: %d segment(s) recomputed locally, logged, same bits",
       ps.fallbacks);
    /* within the retry window it gets nothing new */
    hp_cache_t cd2 = cache_new(64 << 20);
    rc = hp_prefill_pool_run(pp, &x->llm, &cd2, p, HP_IPC_MODE_PIC, W, NULL,
                             NULL, &ps, &err);
    ok(rc == HP_OK && ps.per_worker[1] == 0 && ps.published == 5,
       "a failed peer is skipped by the next dispatch");
    hp_prefill_pool_destroy(pp);

    /* a peer that dies mid-request (reads the PREFILL, closes) */
    dying_t dy = {.conns = 8};
    dy.lfd = listen_any(&dy.port);
    snprintf(addr, sizeof(addr), "127.0.0.1:%d", dy.port);
    pthread_t th;
    pthread_create(&th, NULL, dying_main, &dy);
    hp_prefill_pool_create(&pp, &cfg, &err);
    hp_cache_t ck = cache_new(64 << 20);
    rc = hp_prefill_pool_run(pp, &x->llm, &ck, p, HP_IPC_MODE_PIC, W, NULL,
                             NULL, &ps, &err);
    float *l4 = assemble(x, &ck, p, HP_IPC_MODE_PIC, &st, &rc);
    ok(rc == HP_OK && ps.fallbacks >= 1 && !memcmp(l4, ls, x->V * 4),
       "a peer killed mid-request: the request completes by local "
       "recompute, same bits");
    hp_prefill_pool_destroy(pp);
    shutdown(dy.lfd, SHUT_RDWR);
    close(dy.lfd);
    pthread_join(th, NULL);

    hp_cache_t *all[] = {&ca, &cb, &cf, &cd, &cd2, &ck};
    for (size_t i = 0; i < sizeof(all) / sizeof(*all); i++)
        hp_pool_destroy(all[i]->pub);
    free(l1);
    free(l2);
    free(l3);
    free(l4);
}

int main(void)
{
    const char *root = getenv("HYPIC_ROOT") ? getenv("HYPIC_ROOT") : ".";
    char dir[1024];
    ctx_t x = {0};
    hp_error_t err = {0};
    hp_prompt_t p;
    hp_assemble_stats_t st;
    hp_prefill_stats_t ps;
    hp_prefill_pool_t *pp;
    rec_t rec;
    int rc;

    check_threads();

    snprintf(dir, sizeof(dir), "%s/models/test/qwen35-dense", root);
    if (!ok(hp_llm_load(&x.llm, dir, &err) == HP_OK, "model loads")) {
        tap_diag("%s", err.msg);
        return tap_done();
    }
    x.V = (size_t)x.llm.model.cfg.vocab_size;
    hp_fwd_ws_init(&x.ws, &x.llm.model, NULL, &err);
    hp_prompt_build(&p, &x.llm, PROMPT, strlen(PROMPT), SEP, &err);
    int lens_ok = p.n_segs == 6;
    for (int i = 1; i < 5 && lens_ok; i++)
        lens_ok = p.segs[i].len > 2 * W;
    ok(lens_ok,
       "6 segments, every document longer than two seams "
       "(%d tokens)",
       p.n);

    /* the sequential warm pass, then the assembly: the reference */
    hp_cache_t cs = cache_new(64 << 20);
    hp_assemble_warm(&x.llm, &cs, &x.ws, &p, HP_IPC_MODE_PIC, W, NULL, &err);
    float *ls = assemble(&x, &cs, &p, HP_IPC_MODE_PIC, &st, &rc);

    /* the parallel warm pass: 2 workers x 1 thread */
    hp_prefill_pool_cfg_t cfg = {.workers = 2, .threads_per_worker = 1};
    hp_prefill_pool_create(&pp, &cfg, &err);
    hp_cache_t cp = cache_new(64 << 20);
    rec_init(&rec, &p, cp.pub);
    rc = hp_prefill_pool_run(pp, &x.llm, &cp, &p, HP_IPC_MODE_PIC, W, on_done,
                             &rec, &ps, &err);
    ok(rc == HP_OK && ps.cold == 5 && ps.published == 5 && rec.calls == 5 &&
           rec.ok == 5 && !rec.bad_entry,
       "parallel warm: 5 cold segments, each published and reported once "
       "(rc %d: %s)",
       rc, rc ? err.msg : "ok");
    ok(rec.visible_first <= 2,
       "pipelined: at the first completion %d of 5 segments were public",
       rec.visible_first);
    ok(ps.per_worker[0] > 0 && ps.per_worker[1] > 0,
       "both workers got segments (%d + %d)", ps.per_worker[0],
       ps.per_worker[1]);

    /* the workers are those LPT picks for the token counts */
    double cost[5];
    int as[5], lpt_ok = 1;
    for (int i = 0; i < 5; i++)
        cost[i] = p.segs[i].len;
    double planned = hp_lpt_assign(cost, 5, 2, NULL, as, NULL);
    for (int i = 0; i < 5; i++)
        lpt_ok = lpt_ok && rec.worker[i] == as[i];
    ok(lpt_ok && planned == ps.planned,
       "dispatch follows LPT (makespan %.0f of %ld tokens)", ps.planned,
       ps.tokens);

    float *lp = assemble(&x, &cp, &p, HP_IPC_MODE_PIC, &st, &rc);
    ok(rc == HP_OK && st.hit_segments == 5 && st.miss_segments == 0,
       "the combine finds every segment a hit (%d hit, %d miss)",
       st.hit_segments, st.miss_segments);
    ok(!memcmp(lp, ls, x.V * 4), "pic logits after the parallel warm pass "
                                 "equal the sequential ones, bitwise");
    ok(same_entries(&p, cs.pub, cp.pub, HP_IPC_MODE_PIC),
       "every pool entry is byte-identical to the sequential one");

    /* warm already: nothing to dispatch */
    rc = hp_prefill_pool_run(pp, &x.llm, &cp, &p, HP_IPC_MODE_PIC, W, NULL,
                             NULL, &ps, &err);
    ok(rc == HP_OK && ps.cold == 0 && ps.hits == 5,
       "a warm request dispatches nothing (%d hits)", ps.hits);

    /* other thread counts give the same bits: 2 workers x 2 threads */
    hp_prefill_pool_t *pp2;
    cfg.threads_per_worker = 2;
    hp_prefill_pool_create(&pp2, &cfg, &err);
    hp_cache_t c2 = cache_new(64 << 20);
    rc = hp_prefill_pool_run(pp2, &x.llm, &c2, &p, HP_IPC_MODE_PIC, W, NULL,
                             NULL, &ps, &err);
    float *l2 = assemble(&x, &c2, &p, HP_IPC_MODE_PIC, &st, &rc);
    ok(rc == HP_OK && !memcmp(l2, ls, x.V * 4),
       "2 workers x 2 threads: the same logits, bitwise");
    hp_prefill_pool_destroy(pp2);

    /* naive mode too (every segment a STATE entry) */
    hp_cache_t ns = cache_new(64 << 20), np = cache_new(64 << 20);
    hp_assemble_warm(&x.llm, &ns, &x.ws, &p, HP_IPC_MODE_NAIVE, W, NULL, &err);
    float *lns = assemble(&x, &ns, &p, HP_IPC_MODE_NAIVE, &st, &rc);
    rc = hp_prefill_pool_run(pp, &x.llm, &np, &p, HP_IPC_MODE_NAIVE, W, NULL,
                             NULL, &ps, &err);
    float *lnp = assemble(&x, &np, &p, HP_IPC_MODE_NAIVE, &st, &rc);
    ok(rc == HP_OK && st.miss_segments == 0 && !memcmp(lns, lnp, x.V * 4) &&
           same_entries(&p, ns.pub, np.pub, HP_IPC_MODE_NAIVE),
       "naive: parallel warm equals sequential, bitwise");

    /* a public pool too small for the request's segments at once, beside
     * a healthy request on the same workers */
    size_t one = hp_segc_bytes(&x.llm.model.cfg, HP_SEGC_PIC, p.segs[1].len, W);
    hp_cache_t ce = cache_new(one + one / 2), cg = cache_new(64 << 20);
    hp_prefill_job_t *je, *jg;
    hp_error_t eerr = {0}, gerr = {0};
    rec_t rece;
    rec_init(&rece, &p, ce.pub);
    hp_prefill_submit(pp, &x.llm, &ce, &p, HP_IPC_MODE_PIC, W, on_done, &rece,
                      &je, &eerr);
    hp_prefill_submit(pp, &x.llm, &cg, &p, HP_IPC_MODE_PIC, W, NULL, NULL, &jg,
                      &gerr);
    int rce = hp_prefill_job_wait(je, &ps, &eerr);
    ok(rce == HP_ENOMEM && ps.failed >= 1 &&
           ps.published + ps.failed + ps.cancelled == 5 && rece.calls == 5,
       "too small a pool fails that request with ENOMEM (%d published, %d "
       "failed, %d given up): %s",
       ps.published, ps.failed, ps.cancelled, eerr.msg);
    int rcg = hp_prefill_job_wait(jg, NULL, &gerr);
    hp_prefill_job_free(je);
    hp_prefill_job_free(jg);
    float *lg = assemble(&x, &cg, &p, HP_IPC_MODE_PIC, &st, &rc);
    ok(rcg == HP_OK && rc == HP_OK && st.miss_segments == 0 &&
           !memcmp(lg, ls, x.V * 4),
       "the request beside it completes, bit-identical");
    hp_pool_stats_t pst;
    hp_pool_clear(ce.pub);
    hp_pool_stats(ce.pub, &pst);
    ok(pst.bytes_used == 0 && pst.entries == 0,
       "the failed request left no reference behind (%zu bytes held)",
       pst.bytes_used);

    /* and the workers go on */
    hp_cache_t ca = cache_new(64 << 20);
    rc = hp_prefill_pool_run(pp, &x.llm, &ca, &p, HP_IPC_MODE_PIC, W, NULL,
                             NULL, &ps, &err);
    ok(rc == HP_OK && ps.published == 5, "the pool serves the next request");

    /* a repeated document is built once */
    char *rep = malloc(strlen(PROMPT) * 2);
    const char *d1 = strstr(PROMPT, SEP) + strlen(SEP);
    sprintf(rep, "Lead." SEP "%.*s" SEP "%.*s" SEP "Q?",
            (int)(strstr(d1, SEP) - d1), d1, (int)(strstr(d1, SEP) - d1), d1);
    hp_prompt_t pr;
    hp_prompt_build(&pr, &x.llm, rep, strlen(rep), SEP, &err);
    hp_cache_t cr = cache_new(64 << 20);
    rc = hp_prefill_pool_run(pp, &x.llm, &cr, &pr, HP_IPC_MODE_PIC, W, NULL,
                             NULL, &ps, &err);
    ok(rc == HP_OK && ps.cold == 2 && ps.dups == 1,
       "a document repeated in one prompt is prefilled once");
    hp_prompt_free(&pr);
    free(rep);

    hp_prefill_pool_destroy(pp);
    check_peers(&x, &p, ls);
    hp_cache_t *all[] = {&cs, &cp, &c2, &ns, &np, &ce, &cg, &ca, &cr};
    for (size_t i = 0; i < sizeof(all) / sizeof(*all); i++)
        hp_pool_destroy(all[i]->pub);
    free(ls);
    free(lp);
    free(l2);
    free(lns);
    free(lnp);
    free(lg);
    hp_prompt_free(&p);
    hp_fwd_ws_free(&x.ws);
    hp_llm_free(&x.llm);
    return tap_done();
}
