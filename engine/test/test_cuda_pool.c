/*
 * test_cuda_pool.c - serving on the CUDA backend allocates its device
 * memory at start only: the scheduler's sequence pool (seq.h), the
 * forward workspace and the backend's own scratch (hp_backend_reserve)
 * are made by hp_sched_create; a request's admission, prefill and decode
 * then make no device allocation (hp_backend_device_allocs counts every
 * hk_cuda_malloc). A pool with room for one request at a time makes the
 * second wait in the queue and run when the first ends; a request larger
 * than the pool is refused at submit with HP_ETOOLARGE. Runs on a GPU,
 * or on the host emulator (kernels/cuda/emu/run.sh with HK_EMU_ENGINE);
 * SKIPs where "cuda" cannot be opened. Models: argv, else the dense f32
 * one and its int8 twin (the I8 tile is planned with the workspace).
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine/cache/prompt.h"
#include "engine/forward/seq.h"
#include "engine/serve/sched.h"
#include "engine/test/test_util.h"

#define PROMPT     "The quick brown fox jumps over the lazy dog, again and again"
#define MAX_TOKENS 3

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
static int events; /* starts and ends so far, in order */

typedef struct {
    int start_at, done_at; /* events when started / done (0: not yet) */
    hp_sched_final_t fin;
    char text[512];
} col_t;

static void on_start(void *ud, const hp_sched_start_t *s)
{
    col_t *c = ud;
    (void)s;
    pthread_mutex_lock(&mu);
    c->start_at = ++events;
    pthread_mutex_unlock(&mu);
}

static size_t on_text(void *ud, int choice, const char *t, size_t len)
{
    col_t *c = ud;
    (void)choice;
    pthread_mutex_lock(&mu);
    strncat(c->text, t,
            len < sizeof(c->text) - strlen(c->text) - 1
                ? len
                : sizeof(c->text) - strlen(c->text) - 1);
    pthread_mutex_unlock(&mu);
    return len;
}

static void on_done(void *ud, const hp_sched_final_t *f)
{
    col_t *c = ud;
    pthread_mutex_lock(&mu);
    c->fin = *f;
    c->done_at = ++events;
    pthread_cond_broadcast(&cv);
    pthread_mutex_unlock(&mu);
}

static const hp_sched_ops_t ops = {
    .start = on_start, .text = on_text, .done = on_done};

/* Waits for c's end (bounded: a failure, never a measurement). */
static int wait_done(col_t *c)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec += 600;
    pthread_mutex_lock(&mu);
    while (!c->done_at && pthread_cond_timedwait(&cv, &mu, &ts) == 0)
        ;
    int r = c->done_at;
    pthread_mutex_unlock(&mu);
    return r;
}

static int submit(hp_sched_t *s, col_t *c, int max, int n, hp_error_t *err)
{
    hp_sched_req_t r = {.prompt = PROMPT,
                        .prompt_len = strlen(PROMPT),
                        .n = n,
                        .ops = &ops,
                        .ud = c};
    r.gen.max_tokens = max;
    r.gen.ignore_eos = 1;
    return hp_sched_submit(s, &r, err);
}

static void check(const char *root, const char *name, const hp_backend_t *be)
{
    char dir[1024];
    hp_llm_t llm;
    hp_error_t err = {0};
    snprintf(dir, sizeof(dir), "%s/models/test/%s", root, name);
    if (!ok(hp_llm_load_on(&llm, dir, be, &err) == HP_OK, "%s loads on %s: %s",
            name, hp_backend_name(be), err.msg))
        return;
    /* the prompt's tokens: a request reserves prompt + MAX_TOKENS +
     * drafts + 1 positions; the pool holds one such request, not two */
    hp_prompt_t p;
    int n_prompt =
        hp_prompt_build(&p, &llm, PROMPT, strlen(PROMPT), "", &err) == HP_OK
            ? p.n
            : 0;
    if (n_prompt)
        hp_prompt_free(&p);
    size_t need = hp_seq_pool_need(&llm.model, n_prompt + MAX_TOKENS +
                                                   HP_SCHED_MAX_DRAFT + 1);
    hp_sched_cfg_t cfg = {.batch = 4,
                          .prefill_chunk = 16,
                          .max_context = 128,
                          .seq_budget = need + need / 2};
    hp_sched_t *s;
    if (!ok(hp_sched_create(&s, &llm, &cfg, &err) == HP_OK,
            "%s: scheduler with a pool of %zu KiB: %s", name,
            cfg.seq_budget >> 10, err.msg)) {
        hp_llm_free(&llm);
        return;
    }
    unsigned long at_start = hp_backend_device_allocs(be);
    ok(at_start > 0, "%s: the device allocations counted (%lu at start)", name,
       at_start);

    col_t a = {0}, b = {0}, big = {0}, two = {0};
    pthread_mutex_lock(&mu);
    events = 0;
    pthread_mutex_unlock(&mu);
    int ra = submit(s, &a, MAX_TOKENS, 1, &err);
    int rb = submit(s, &b, MAX_TOKENS, 1, &err);
    ok(ra == HP_OK && rb == HP_OK, "%s: two requests queued", name);
    ok(wait_done(&a) && wait_done(&b), "%s: both end", name);
    ok(a.fin.status == HP_OK && b.fin.status == HP_OK &&
           a.fin.completion_tokens == MAX_TOKENS &&
           b.fin.completion_tokens == MAX_TOKENS,
       "%s: both generate %d tokens (%s / %s)", name, MAX_TOKENS, a.fin.err.msg,
       b.fin.err.msg);
    ok(a.done_at && b.start_at > a.done_at,
       "%s: the second waits for the first's memory (start %d after end "
       "%d)",
       name, b.start_at, a.done_at);
    ok(!strcmp(a.text, b.text), "%s: greedy texts equal (\"%s\")", name,
       a.text);
    unsigned long after = hp_backend_device_allocs(be);
    ok(after == at_start,
       "%s: admission, prefill and decode made no device allocation (%lu "
       "at start, %lu after)",
       name, at_start, after);

    /* a request the pool can never hold, and one whose choices cannot */
    int rc = submit(s, &big, 100, 1, &err);
    ok(rc == HP_ETOOLARGE && strstr(err.msg, "seq_budget"),
       "%s: a request larger than the pool is refused: %s", name, err.msg);
    rc = submit(s, &two, MAX_TOKENS, 2, &err);
    ok(rc == HP_ETOOLARGE, "%s: two choices that cannot fit together: %s", name,
       err.msg);
    hp_sched_destroy(s);
    hp_llm_free(&llm);
}

int main(int argc, char **argv)
{
    const hp_backend_t *cuda;
    hp_error_t err = {0};
    int rc = hp_backend_open(&cuda, "cuda:0", &err);
    if (rc != HP_OK) {
        ok(rc == HP_EUNAVAIL, "cuda:0 refused clearly: %s", err.msg);
        return tap_done();
    }
    const char *root = getenv("HYPIC_ROOT") ? getenv("HYPIC_ROOT") : ".";
    if (argc > 1) {
        for (int i = 1; i < argc; i++)
            check(root, argv[i], cuda);
    } else {
        check(root, "qwen35-dense", cuda);
        check(root, "qwen35-dense-int8", cuda);
    }
    rc = tap_done();
    hp_backend_close(cuda);
    return rc;
}
