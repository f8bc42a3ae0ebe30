/*
 * test_cuda_pool.c - serving on the CUDA backend allocates its device
 * memory at start only: the scheduler's sequence pool (seq.h) with the
 * segment builders' sequences in it, the forward workspaces (the
 * scheduler's and every prefill worker's) and the backend's own scratch
 * (hp_backend_reserve) are made by hp_sched_create; then no request makes
 * a device allocation (hp_backend_device_allocs counts every
 * hk_cuda_malloc), whatever its mode:
 *   full    two requests; a pool with room for one makes the second wait
 *           in the queue and run when the first ends; one larger than the
 *           pool is refused at submit with HP_ETOOLARGE;
 *   cached  a cache, no prefill workers: pic cold (its segments built in
 *           the scheduler's builder) then warm (spliced), naive, prefix
 *           twice (a resume), all in one pool that holds one request at
 *           a time besides the builder: the second pic request waits;
 *           a request over the pool, and one whose segment is longer
 *           than the builders (max_segment), are refused;
 *   workers two prefill workers build a pic prompt's cold segments, with
 *           their own workspaces and builders planned at start.
 * Runs on a GPU, or on the host emulator (kernels/cuda/emu/run.sh with
 * HK_EMU_ENGINE); SKIPs where "cuda" cannot be opened. Models: argv, else
 * the dense f32 one and its int8 twin (the I8 tile is planned with the
 * workspace).
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine/cache/assemble.h"
#include "engine/cache/prompt.h"
#include "engine/cache/segcache.h"
#include "engine/forward/seq.h"
#include "engine/serve/sched.h"
#include "engine/test/test_util.h"

#define PROMPT     "The quick brown fox jumps over the lazy dog, again and again"
#define MAX_TOKENS 3
/* tokens of the requests that grow (no max_tokens: the context's end) */
#define GROW_TOKENS 24
#define SEP         "<|pic_sep|>"
/* short documents (seam 3: interiors of a few tokens) */
#define DOCS "Zorvia's capital is Quellam." SEP "Water boils at 100 degrees."
#define RAG  "Lead." SEP DOCS SEP "Capital?"
#define RAG2 "Lead." SEP "Cats sleep all day." SEP "Who?"
#define RAG3 "Lead." SEP "Cats sleep all day." SEP "Why not?"
#define RAG_WORKERS                                                            \
    "Lead two." SEP "Rivers run to the sea." SEP "Plates meet in peaks." SEP   \
    "Where?"
#define SEAM        3
#define MAX_SEGMENT 40

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

static int submit_as(hp_sched_t *s, col_t *c, const char *prompt, int mode,
                     int max, int n, hp_error_t *err)
{
    hp_sched_req_t r = {.prompt = prompt,
                        .prompt_len = strlen(prompt),
                        .separator = SEP,
                        .mode = mode,
                        .seam = SEAM,
                        .n = n,
                        .ops = &ops,
                        .ud = c};
    r.gen.max_tokens = max;
    r.gen.ignore_eos = 1;
    return hp_sched_submit(s, &r, err);
}

static int submit(hp_sched_t *s, col_t *c, int max, int n, hp_error_t *err)
{
    return submit_as(s, c, PROMPT, HP_IPC_MODE_FULL, max, n, err);
}

static void reset_events(void)
{
    pthread_mutex_lock(&mu);
    events = 0;
    pthread_mutex_unlock(&mu);
}

/* One request in mode, to its end: 1 when it generated MAX_TOKENS. */
static int run_one(hp_sched_t *s, col_t *c, const char *prompt, int mode,
                   const char *name, const char *what)
{
    hp_error_t err = {0};
    memset(c, 0, sizeof(*c));
    int rc = submit_as(s, c, prompt, mode, MAX_TOKENS, 1, &err);
    int done = rc == HP_OK && wait_done(c);
    return ok(done && c->fin.status == HP_OK &&
                  c->fin.completion_tokens == MAX_TOKENS && c->fin.mode == mode,
              "%s: %s runs (%d tokens, %d of %d segments hit: %s)", name, what,
              c->fin.completion_tokens, c->fin.segs_hit, c->fin.segs_total,
              rc != HP_OK ? err.msg : c->fin.err.msg);
}

/* Tokens of a prompt (its segments as the scheduler splits them). */
static int prompt_tokens(const hp_llm_t *llm, const char *text)
{
    hp_prompt_t p;
    hp_error_t err = {0};
    if (hp_prompt_build(&p, llm, text, strlen(text), SEP, &err) != HP_OK)
        return 0;
    int n = p.n;
    hp_prompt_free(&p);
    return n;
}

/* The caches' modes on one scheduler with a cache: cold and warm pic,
 * naive, prefix; then, with two prefill workers, a cold pic prompt. */
static void check_cached(const hp_llm_t *llm, const char *name,
                         const hp_backend_t *be)
{
    hp_error_t err = {0};
    hp_prefix_cache_params_t pcp;
    hp_prefix_cache_params_default(&pcp, 64u << 20);
    hp_cache_t cache = {hp_segc_pool_create(be, 64u << 20, &err), NULL};
    unsigned long before = hp_backend_device_allocs(be);
    cache.prefix =
        hp_prefix_cache_create(&llm->model.cfg, &pcp, llm->model.be, &err);
    unsigned long made = hp_backend_device_allocs(be) - before;
    if (!ok(cache.pub && cache.prefix, "%s: caches: %s", name, err.msg))
        goto out;
    ok(made == 1,
       "%s: the prefix cache's private pool is device memory, one allocation "
       "at its creation (%lu)",
       name, made);
    /* room for one RAG request besides the scheduler's builder */
    int n_rag = prompt_tokens(llm, RAG);
    size_t one = hp_seq_pool_need(&llm->model,
                                  n_rag + MAX_TOKENS + HP_SCHED_MAX_DRAFT + 1);
    size_t build = hp_seq_pool_need(&llm->model, MAX_SEGMENT);
    hp_sched_cfg_t cfg = {.batch = 4,
                          .prefill_chunk = 16,
                          .max_context = 256,
                          .max_segment = MAX_SEGMENT,
                          .cache = &cache,
                          .seam = SEAM,
                          .seq_budget = build + one + one / 2};
    hp_sched_t *s;
    if (!ok(hp_sched_create(&s, llm, &cfg, &err) == HP_OK,
            "%s: scheduler with a cache, pool of %zu KiB: %s", name,
            cfg.seq_budget >> 10, err.msg))
        goto out;
    unsigned long at_start = hp_backend_device_allocs(be);
    col_t a, b, c, d, e, f;
    reset_events();
    memset(&a, 0, sizeof(a));
    memset(&b, 0, sizeof(b));
    int ra = submit_as(s, &a, RAG, HP_IPC_MODE_PIC, MAX_TOKENS, 1, &err);
    int rb = submit_as(s, &b, RAG, HP_IPC_MODE_PIC, MAX_TOKENS, 1, &err);
    ok(ra == HP_OK && rb == HP_OK && wait_done(&a) && wait_done(&b) &&
           a.fin.status == HP_OK && b.fin.status == HP_OK,
       "%s: pic cold then warm run (%s / %s)", name, a.fin.err.msg,
       b.fin.err.msg);
    ok(a.fin.segs_hit == 0 && b.fin.segs_hit == 3 && b.fin.cached_tokens > 0,
       "%s: the first builds its 3 segments, the second splices them (hits "
       "%d, %d)",
       name, a.fin.segs_hit, b.fin.segs_hit);
    ok(a.done_at && b.start_at > a.done_at,
       "%s: the second waits for the first's memory (start %d after end %d)",
       name, b.start_at, a.done_at);
    ok(!strcmp(a.text, b.text),
       "%s: cold and warm splice say the same (\"%s\")", name, a.text);
    run_one(s, &c, RAG2, HP_IPC_MODE_NAIVE, name, "naive, cold");
    run_one(s, &d, RAG2, HP_IPC_MODE_PREFIX, name, "prefix, first");
    run_one(s, &e, RAG2, HP_IPC_MODE_PREFIX, name, "prefix, resumed");
    ok(e.fin.cached_tokens > 0, "%s: the prefix request resumed (%d cached)",
       name, e.fin.cached_tokens);
    /* another question: its branch point splits the cached path (K/V
     * copied on the device) and is captured into the private pool */
    run_one(s, &f, RAG3, HP_IPC_MODE_PREFIX, name, "prefix, a branch");
    hp_prefix_cache_stats_t pst;
    hp_prefix_cache_stats(cache.prefix, &pst);
    ok(f.fin.cached_tokens > 0 && pst.states >= 3 && pst.nodes >= 4,
       "%s: the branch resumed (%d cached); %d checkpoints on %d nodes", name,
       f.fin.cached_tokens, pst.states, pst.nodes);
    unsigned long after = hp_backend_device_allocs(be);
    ok(after == at_start,
       "%s: pic cold and warm, naive, prefix (a resume, a branch) made no "
       "device allocation (%lu at start, %lu after)",
       name, at_start, after);
    col_t big = {0}, seg = {0};
    int rc = submit_as(s, &big, RAG, HP_IPC_MODE_PIC, 100, 1, &err);
    ok(rc == HP_ETOOLARGE && strstr(err.msg, "seq_budget"),
       "%s: a pic request larger than the pool is refused: %s", name, err.msg);
    rc = submit_as(s, &seg,
                   "Lead." SEP "One two three four five six seven eight nine "
                   "ten eleven twelve thirteen fourteen fifteen sixteen "
                   "seventeen eighteen nineteen twenty." SEP "Q?",
                   HP_IPC_MODE_PIC, MAX_TOKENS, 1, &err);
    ok(rc == HP_ETOOLARGE && strstr(err.msg, "max_segment"),
       "%s: a segment longer than the builders is refused: %s", name, err.msg);
    hp_sched_destroy(s);

    /* two prefill workers: their workspaces and builders at start */
    hp_prefill_pool_cfg_t pc = {.workers = 2, .threads_per_worker = 1};
    hp_prefill_pool_t *pp;
    memset(&err, 0, sizeof(err));
    if (!ok(hp_prefill_pool_create(&pp, &pc, &err) == HP_OK,
            "%s: two prefill workers: %s", name, err.msg))
        goto out;
    cfg.prefill = pp;
    cfg.seq_budget = 3 * build + 2 * one;
    if (ok(hp_sched_create(&s, llm, &cfg, &err) == HP_OK,
           "%s: scheduler with two prefill workers: %s", name, err.msg)) {
        at_start = hp_backend_device_allocs(be);
        run_one(s, &a, RAG_WORKERS, HP_IPC_MODE_PIC, name,
                "pic on the prefill workers, cold");
        run_one(s, &b, RAG_WORKERS, HP_IPC_MODE_PIC, name,
                "pic on the prefill workers, warm");
        ok(a.fin.segs_hit == 0 && b.fin.segs_hit == 3,
           "%s: the workers built 3 segments, then all hit (%d, %d)", name,
           a.fin.segs_hit, b.fin.segs_hit);
        after = hp_backend_device_allocs(be);
        ok(after == at_start,
           "%s: the prefill workers made no device allocation (%lu at "
           "start, %lu after)",
           name, at_start, after);
        hp_sched_destroy(s);
    }
    hp_prefill_pool_destroy(pp);
out:
    if (cache.prefix)
        hp_prefix_cache_destroy(cache.prefix);
    if (cache.pub)
        hp_pool_destroy(cache.pub);
}

/* Sequence memory on demand in device memory: two requests without
 * max_tokens on a pool for two whole contexts (not for one and a
 * grown one beside another's first extent) take first
 * extents of prompt + 4 positions, grow (device-to-device copies,
 * KVBuffers following), and the second is preempted and prefilled again;
 * both say what one says alone, and nothing is allocated on the device. */
static void check_grow(const hp_llm_t *llm, const char *name,
                       const hp_backend_t *be, int n_prompt)
{
    hp_error_t err = {0};
    int ctx = n_prompt + GROW_TOKENS;
    size_t full = hp_seq_pool_need(&llm->model, ctx + HP_SCHED_MAX_DRAFT + 1);
    hp_sched_cfg_t cfg = {
        .batch = 2, .prefill_chunk = 16, .max_context = ctx, .seq_step = 4};
    hp_sched_t *s;
    col_t one = {0}, a = {0}, b = {0};
    /* alone: the default pool holds the whole context at once */
    cfg.seq_budget = 0;
    if (hp_sched_create(&s, llm, &cfg, &err) == HP_OK) {
        submit(s, &one, 1 << 30, 1, &err);
        wait_done(&one);
        hp_sched_destroy(s);
    }
    cfg.seq_budget = 2 * full;
    if (!ok(hp_sched_create(&s, llm, &cfg, &err) == HP_OK,
            "%s: scheduler growing its sequences: %s", name, err.msg))
        return;
    unsigned long at_start = hp_backend_device_allocs(be);
    submit(s, &a, 1 << 30, 1, &err);
    submit(s, &b, 1 << 30, 1, &err);
    wait_done(&a);
    wait_done(&b);
    hp_sched_stats_t st;
    for (int i = 0; i < 1000; i++) { /* the stats follow the last step */
        hp_sched_stats(s, &st);
        if (st.live == 0 && st.running == 0)
            break;
        struct timespec ts = {0, 10000000};
        nanosleep(&ts, NULL);
    }
    ok(one.fin.status == HP_OK && a.fin.status == HP_OK &&
           b.fin.status == HP_OK && one.fin.completion_tokens == GROW_TOKENS &&
           a.fin.completion_tokens == GROW_TOKENS &&
           b.fin.completion_tokens == GROW_TOKENS && b.fin.preempted > 0 &&
           st.seq_growths > 0 && !strcmp(a.text, one.text) &&
           !strcmp(b.text, one.text),
       "%s: grown sequences, the second preempted %d times (%llu growths): "
       "each says what one says alone (\"%s\" / \"%s\" / \"%s\") %s",
       name, b.fin.preempted, (unsigned long long)st.seq_growths, one.text,
       a.text, b.text, b.fin.err.msg);
    ok(hp_backend_device_allocs(be) == at_start,
       "%s: growth and preemption made no device allocation", name);
    hp_sched_destroy(s);
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
    reset_events();
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
    check_grow(&llm, name, be, n_prompt);
    check_cached(&llm, name, be);
    hp_llm_free(&llm);
}

int main(int argc, char **argv)
{
    static const char *const models[] = {"qwen35-dense", "qwen35-dense-int8",
                                         NULL};
    return test_cuda_models(argc, argv, check, models);
}
