/*
 * test_sched.c - the scheduler (engine/serve/sched.h): the step-wise decoder's
 * stop strings and budgets, many concurrent requests giving exactly the
 * text each gives alone, FIFO admission, back-pressure from a slow
 * reader, cancellation (queued and running) freeing all memory, and the
 * limits (queue, context).
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "engine/cache/pool.h"
#include "engine/cache/prefix_cache.h"
#include "engine/cache/prompt.h"
#include "engine/forward/forward.h"
#include "engine/forward/generate.h"
#include "engine/model/llm.h"
#include "engine/serve/sched.h"
#include "t/lib/tap.h"
#include "t/lib/testrand.h"

#define MODEL "models/test/qwen35-dense"

static hp_llm_t llm;

/* ---- the decoder, driven by forced logits ---------------------------- */

static float *forced(int V, int tok)
{
    static float *l;
    if (!l)
        l = calloc((size_t)V, sizeof(float));
    memset(l, 0, (size_t)V * sizeof(float));
    l[tok] = 100.0f;
    return l;
}

static int tok_of(const char *s)
{
    return hp_tokenizer_token_id(llm.tok, s);
}

/* Pushes the tokens of the strings (one token each) through a decoder;
 * returns the text taken so far. */
static const char *feed(hp_decoder_t *d, hp_sampler_t *sm,
                        const char *const *toks, int n, char *out)
{
    hp_error_t err = {0};
    int V = llm.model.cfg.vocab_size, t;
    for (int i = 0; i < n && !d->done; i++)
        hp_decoder_next(d, sm, forced(V, tok_of(toks[i])), &t, &err);
    const char *r;
    size_t len = hp_decoder_ready(d, &r);
    strncat(out, r, len);
    hp_decoder_take(d, len);
    return out;
}

static void test_decoder(void)
{
    hp_sampler_t sm;
    hp_decoder_t d;
    hp_error_t err = {0};
    char out[256] = "";
    int t;

    hp_sampler_init(&sm, llm.model.cfg.vocab_size);
    hp_gen_params_t p = {.max_tokens = 50, .sampling = {0, 0, 1.0f, 0}};
    p.stop[0] = "STOP";
    p.stop[1] = "";
    p.n_stop = 2;
    hp_decoder_init(&d, &llm, &p, &err);
    ok(d.n_stop == 1, "an empty stop string is ignored");

    const char *a[] = {"x", "S", "T"};
    feed(&d, &sm, a, 3, out);
    ok(!strcmp(out, "x"), "a possible stop string is held back (\"%s\")", out);
    const char *b[] = {"y"};
    feed(&d, &sm, b, 1, out);
    ok(!strcmp(out, "xSTy"), "and released when it cannot be one (\"%s\")",
       out);
    const char *c[] = {"S", "T", "O", "P", "z"};
    feed(&d, &sm, c, 5, out);
    ok(d.done && d.finish == HP_FINISH_STOP && !strcmp(out, "xSTy"),
       "a stop string ends it and is never shown (\"%s\")", out);
    ok(hp_decoder_next(&d, &sm, forced(llm.model.cfg.vocab_size, 1), &t,
                       &err) == HP_OK &&
           t == -1,
       "a finished decoder asks for nothing more");
    hp_decoder_free(&d);

    /* budget: held-back text comes out at the end */
    p.max_tokens = 3;
    hp_decoder_init(&d, &llm, &p, &err);
    out[0] = '\0';
    const char *e[] = {"a", "b", "S"};
    feed(&d, &sm, e, 3, out);
    ok(d.done && d.finish == HP_FINISH_LENGTH && d.n_tokens == 3 &&
           !strcmp(out, "abS"),
       "the budget ends it and flushes the held-back text (\"%s\")", out);
    hp_decoder_free(&d);

    /* a stop token */
    p.max_tokens = 10;
    p.n_stop = 0;
    hp_decoder_init(&d, &llm, &p, &err);
    hp_decoder_next(&d, &sm, forced(llm.model.cfg.vocab_size, tok_of("q")), &t,
                    &err);
    hp_decoder_next(&d, &sm, forced(llm.model.cfg.vocab_size, llm.stop_ids[0]),
                    &t, &err);
    ok(d.done && d.finish == HP_FINISH_STOP && d.n_tokens == 1,
       "a stop token ends it and is not counted");
    hp_decoder_free(&d);

    /* a budget of 0: no sampling at all */
    p.max_tokens = 0;
    hp_decoder_init(&d, &llm, &p, &err);
    hp_decoder_next(&d, &sm, forced(llm.model.cfg.vocab_size, 1), &t, &err);
    ok(d.done && d.n_tokens == 0 && t == -1, "max_tokens 0 samples nothing");
    hp_decoder_free(&d);
    hp_sampler_free(&sm);
}

/* ---- requests through the scheduler ---------------------------------- */

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
static int start_order[64], n_started;
static int n_finished; /* done() calls so far, every request */

#define MAXC    4  /* choices a collector keeps apart */
#define MAX_LP  64 /* log-probability entries it keeps per choice */
#define MAX_TOK 24 /* tokens of the n-choice tests */

typedef struct {
    int id;
    char text[16384];
    size_t len;
    int started, done, cancel;
    int finished_before; /* n_finished when it started */
    int accept;          /* bytes text() takes per call: -1 all, 0 none */
    int offers;          /* text() calls */
    hp_sched_final_t fin;
    int dones; /* done() calls */
    /* n choices (choice_ops): each one's text, log-probabilities (the
     * token's, then 3 alternatives') and ends */
    char ctext[MAXC][2048];
    float lp[MAXC][MAX_LP][4];
    int n_lp[MAXC];
    int ends[MAXC], end_tokens[MAXC], texts_after_end;
} col_t;

static void on_start(void *ud, const hp_sched_start_t *s)
{
    col_t *c = ud;
    (void)s;
    pthread_mutex_lock(&mu);
    c->started = 1;
    c->finished_before = n_finished;
    start_order[n_started++] = c->id;
    pthread_mutex_unlock(&mu);
}

static size_t on_text(void *ud, int choice, const char *t, size_t len)
{
    (void)choice;
    col_t *c = ud;
    pthread_mutex_lock(&mu);
    c->offers++;
    size_t n = c->accept < 0             ? len
               : (size_t)c->accept < len ? (size_t)c->accept
                                         : len;
    if (c->len + n < sizeof(c->text)) {
        memcpy(c->text + c->len, t, n);
        c->len += n;
        c->text[c->len] = '\0';
    }
    pthread_cond_broadcast(&cv);
    pthread_mutex_unlock(&mu);
    return n;
}

static int on_cancelled(void *ud)
{
    col_t *c = ud;
    pthread_mutex_lock(&mu);
    int r = c->cancel;
    pthread_mutex_unlock(&mu);
    return r;
}

static void on_done(void *ud, const hp_sched_final_t *f)
{
    col_t *c = ud;
    pthread_mutex_lock(&mu);
    c->fin = *f;
    c->done = 1;
    c->dones++;
    n_finished++;
    pthread_cond_broadcast(&cv);
    pthread_mutex_unlock(&mu);
}

static const hp_sched_ops_t ops = {.start = on_start,
                                   .text = on_text,
                                   .cancelled = on_cancelled,
                                   .done = on_done};

static size_t on_choice_text(void *ud, int choice, const char *t, size_t len)
{
    col_t *c = ud;
    pthread_mutex_lock(&mu);
    strncat(c->ctext[choice], t, len);
    c->texts_after_end += c->ends[choice];
    pthread_mutex_unlock(&mu);
    return len;
}

static int on_token(void *ud, const hp_sched_token_t *t)
{
    col_t *c = ud;
    pthread_mutex_lock(&mu);
    int k = c->n_lp[t->choice]++;
    if (k < MAX_LP) {
        c->lp[t->choice][k][0] = t->tok.logprob;
        for (int j = 0; j < 3 && j < t->n_top; j++)
            c->lp[t->choice][k][1 + j] = t->top[j].logprob;
    }
    pthread_mutex_unlock(&mu);
    return 1;
}

static int on_end(void *ud, int choice, hp_finish_t finish, int tokens)
{
    col_t *c = ud;
    (void)finish;
    pthread_mutex_lock(&mu);
    c->ends[choice]++;
    c->end_tokens[choice] = tokens;
    pthread_mutex_unlock(&mu);
    return 1;
}

static const hp_sched_ops_t choice_ops = {.text = on_choice_text,
                                          .cancelled = on_cancelled,
                                          .done = on_done,
                                          .token = on_token,
                                          .end = on_end};

/* Waits for cond over c (bounded: a failure, never a measurement). */
static int wait_for(col_t *c, int (*cond)(col_t *))
{
    struct timespec ts;
    int r;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec += 30;
    pthread_mutex_lock(&mu);
    while (!(r = cond(c)) && pthread_cond_timedwait(&cv, &mu, &ts) == 0)
        ;
    pthread_mutex_unlock(&mu);
    return r;
}

static int is_done(col_t *c)
{
    return c->done;
}
static int has_text(col_t *c)
{
    return c->len > 0;
}

static int submit(hp_sched_t *s, col_t *c, const char *prompt, int max,
                  float temp, uint64_t seed, const char *stop, int ignore)
{
    hp_error_t err = {0};
    hp_sched_req_t r = {
        .prompt = prompt, .prompt_len = strlen(prompt), .ops = &ops, .ud = c};
    r.gen.max_tokens = max;
    r.gen.sampling = (hp_sampling_t){temp, 0, 1.0f, seed};
    r.gen.ignore_eos = ignore;
    if (stop) {
        r.gen.stop[0] = stop;
        r.gen.n_stop = 1;
    }
    int rc = hp_sched_submit(s, &r, &err);
    if (rc != HP_OK)
        tap_diag("submit: %s", err.msg);
    return rc;
}

static int collect(void *ud, const char *t, size_t len, int token)
{
    (void)token;
    strncat(ud, t, len);
    return 0;
}

/* The text of one request run alone: hp_prefill in the scheduler's
 * chunks, then hp_generate. */
static int alone_tokens;
static hp_finish_t alone_finish;

static void alone(const char *prompt, int max, float temp, uint64_t seed,
                  const char *stop, int chunk, char *out)
{
    hp_error_t err = {0};
    hp_seq_t sq;
    hp_fwd_ws_t ws;
    int *ids, n;
    float *lg = malloc((size_t)llm.model.cfg.vocab_size * sizeof(float));
    hp_gen_params_t p = {.max_tokens = max, .sampling = {temp, 0, 1.0f, seed}};
    hp_gen_result_t res;
    if (stop) {
        p.stop[0] = stop;
        p.n_stop = 1;
    }
    out[0] = '\0';
    hp_llm_tokenize(&llm, prompt, strlen(prompt), &ids, &n, &err);
    hp_seq_init(&sq, &llm.model, &err);
    hp_fwd_ws_init(&ws, &llm.model, NULL, &err);
    hp_prefill(&llm.model, &sq, &ws, ids, n, chunk, lg, &err);
    hp_generate(&llm, &sq, &ws, lg, &p, collect, out, &res, &err);
    alone_tokens = res.n_tokens;
    alone_finish = res.finish;
    free(res.tokens);
    free(ids);
    free(lg);
    hp_seq_free(&sq);
    hp_fwd_ws_free(&ws);
}

static hp_sched_t *make(int batch, int chunk, int max_queue, int ctx,
                        int throttle)
{
    hp_sched_t *s;
    hp_error_t err = {0};
    hp_sched_cfg_t cfg = {.batch = batch,
                          .prefill_chunk = chunk,
                          .max_queue = max_queue,
                          .max_context = ctx,
                          .throttle_ms = throttle};
    if (hp_sched_create(&s, &llm, &cfg, &err) != HP_OK) {
        tap_diag("%s", err.msg);
        exit(1);
    }
    return s;
}

/* done() runs just before the request's memory goes: wait for that. */
static void settled(hp_sched_t *s, hp_sched_stats_t *st)
{
    for (int i = 0; i < 3000; i++) {
        hp_sched_stats(s, st);
        if (st->live == 0 && st->running == 0 && st->queued == 0 &&
            st->bytes == 0)
            return;
        usleep(10000);
    }
}

static col_t cols[16];

static void reset(void)
{
    memset(cols, 0, sizeof(cols));
    for (int i = 0; i < 16; i++) {
        cols[i].id = i;
        cols[i].accept = -1;
    }
    n_started = 0;
}

static void test_concurrent(void)
{
    /* long prompts cross several prefill chunks of 16 tokens */
    static char longp[2][1200];
    const char *prompts[10] = {"Hello world",
                               "Once upon a time",
                               "The quick brown fox",
                               "a",
                               longp[0],
                               "Hello world",
                               "x y z",
                               longp[1],
                               "<|im_start|>user\nHi<|im_end|>\n",
                               "Once upon a time"};
    int max[10] = {20, 40, 7, 30, 25, 20, 0, 33, 16, 40};
    float temp[10] = {0, 0, 0, 0, 0, 0.8f, 0, 0, 0, 1.0f};
    const char *stop[10] = {NULL, NULL, NULL, "e",  NULL,
                            NULL, NULL, "t",  NULL, NULL};
    char ref[10][16384];
    int ref_tokens[10];
    hp_finish_t ref_finish[10];
    int chunk = 16;

    for (int i = 0; i < 1100; i += 11) {
        memcpy(longp[0] + i, "the story ", 10);
        memcpy(longp[1] + i, "once more ", 10);
    }
    for (int i = 0; i < 10; i++) {
        alone(prompts[i], max[i], temp[i], 1000 + i, stop[i], chunk, ref[i]);
        ref_tokens[i] = alone_tokens;
        ref_finish[i] = alone_finish;
    }

    reset();
    hp_sched_t *s = make(3, chunk, 64, 0, 0);
    int bad = 0;
    for (int i = 0; i < 10; i++)
        bad |= submit(s, &cols[i], prompts[i], max[i], temp[i], 1000 + i,
                      stop[i], 0);
    ok(!bad, "ten requests are queued at once (batch 3)");
    int same = 1, done = 1;
    for (int i = 0; i < 10; i++) {
        done &= wait_for(&cols[i], is_done);
        if (strcmp(cols[i].text, ref[i]) ||
            cols[i].fin.completion_tokens != ref_tokens[i] ||
            cols[i].fin.finish != ref_finish[i]) {
            same = 0;
            tap_diag("request %d: got \"%s\" (%d tokens, finish %d), "
                     "alone \"%s\" (%d, %d)",
                     i, cols[i].text, cols[i].fin.completion_tokens,
                     (int)cols[i].fin.finish, ref[i], ref_tokens[i],
                     (int)ref_finish[i]);
        }
    }
    ok(done, "all of them finish");
    ok(same, "each gives exactly the text, token count and finish it "
             "gives alone (greedy, sampled with a seed, stop strings, long "
             "chunked prompts)");
    ok(cols[6].fin.completion_tokens == 0 && cols[6].started &&
           cols[6].len == 0,
       "max_tokens 0 prefills and generates nothing");
    {
        int *ids, n;
        hp_error_t err = {0};
        hp_llm_tokenize(&llm, prompts[0], strlen(prompts[0]), &ids, &n, &err);
        ok(cols[0].fin.prompt_tokens == n,
           "usage counts the prompt (%d tokens)", cols[0].fin.prompt_tokens);
        free(ids);
    }
    int fifo = n_started == 10;
    for (int i = 0; i < n_started; i++)
        fifo &= start_order[i] == i;
    ok(fifo, "admission is first come, first served");
    hp_sched_stats_t st;
    settled(s, &st);
    ok(st.live == 0 && st.bytes == 0 && st.served == 10,
       "nothing is held afterwards (%d live, %zu bytes, %llu served)", st.live,
       st.bytes, (unsigned long long)st.served);
    hp_sched_destroy(s);
}

/* texts of request 0 seen when request 1 started and when it first spoke */
static int texts_at_start, texts_at_first;

static void il_start(void *ud, const hp_sched_start_t *st)
{
    col_t *c = ud;
    on_start(ud, st);
    pthread_mutex_lock(&mu);
    if (c->id == 1)
        texts_at_start = cols[0].offers;
    pthread_mutex_unlock(&mu);
}

static size_t il_text(void *ud, int choice, const char *t, size_t len)
{
    col_t *c = ud;
    pthread_mutex_lock(&mu);
    if (c->id == 1 && c->len == 0)
        texts_at_first = cols[0].offers;
    pthread_mutex_unlock(&mu);
    return on_text(ud, choice, t, len);
}

static void test_interleave(void)
{
    static char longp[4000];
    static const hp_sched_ops_t il_ops = {.start = il_start,
                                          .text = il_text,
                                          .cancelled = on_cancelled,
                                          .done = on_done};
    hp_error_t err = {0};
    int *ids, n;

    for (int i = 0; i + 10 < (int)sizeof(longp); i += 10)
        memcpy(longp + i, "the story ", 10);
    hp_llm_tokenize(&llm, longp, strlen(longp), &ids, &n, &err);
    free(ids);
    reset();
    hp_sched_t *s = make(4, 16, 64, 0, 0);
    hp_sched_req_t r = {.prompt = "Hello world",
                        .prompt_len = 11,
                        .ops = &il_ops,
                        .ud = &cols[0]};
    r.gen.max_tokens = 5000;
    r.gen.ignore_eos = 1;
    r.gen.sampling.top_p = 1.0f;
    hp_sched_submit(s, &r, &err);
    wait_for(&cols[0], has_text);
    r.prompt = longp;
    r.prompt_len = strlen(longp);
    r.ud = &cols[1];
    r.gen.max_tokens = 4;
    hp_sched_submit(s, &r, &err);
    wait_for(&cols[1], has_text);
    int during = texts_at_first - texts_at_start, chunks = (n + 15) / 16;
    ok(during >= chunks / 2,
       "a %d-token prompt prefills in %d chunks while a stream goes on "
       "(%d pieces of text meanwhile)",
       n, chunks, during);
    pthread_mutex_lock(&mu);
    cols[0].cancel = 1;
    pthread_mutex_unlock(&mu);
    hp_sched_kick(s);
    wait_for(&cols[0], is_done);
    hp_sched_destroy(s);
}

static void test_backpressure(void)
{
    char ref[16384];
    alone("Once upon a time", 60, 0, 0, NULL, 256, ref);
    reset();
    hp_sched_t *s = make(4, 256, 64, 0, 0);
    cols[0].accept = 3; /* a reader that takes 3 bytes per offer */
    submit(s, &cols[0], "Once upon a time", 60, 0, 0, NULL, 0);
    cols[1].accept = 0; /* a reader that takes nothing */
    submit(s, &cols[1], "Hello world", 60, 0, 0, NULL, 1);
    ok(wait_for(&cols[0], is_done) && !strcmp(cols[0].text, ref),
       "a reader taking 3 bytes at a time still gets all the text");
    pthread_mutex_lock(&mu);
    int offers = cols[1].offers, len = (int)cols[1].len;
    pthread_mutex_unlock(&mu);
    hp_sched_kick(s);
    hp_sched_kick(s);
    usleep(20000);
    hp_sched_stats_t st;
    hp_sched_stats(s, &st);
    ok(!cols[1].done && len == 0 && st.running == 1,
       "a reader taking nothing stalls its request (%d offers)", offers);
    pthread_mutex_lock(&mu);
    cols[1].accept = -1;
    pthread_mutex_unlock(&mu);
    hp_sched_kick(s);
    int fin = wait_for(&cols[1], is_done);
    ok(fin && cols[1].fin.completion_tokens == 60,
       "once it reads again, the request runs to its end (%d tokens)",
       cols[1].fin.completion_tokens);
    hp_sched_destroy(s);
}

static void test_cancel(void)
{
    reset();
    hp_sched_t *s = make(1, 256, 64, 0, 1);
    submit(s, &cols[0], "Hello world", 100000, 0, 0, NULL, 1);
    submit(s, &cols[1], "Once upon a time", 100000, 0, 0, NULL, 1);
    ok(wait_for(&cols[0], has_text), "a long request streams");
    pthread_mutex_lock(&mu);
    cols[1].cancel = 1;
    pthread_mutex_unlock(&mu);
    hp_sched_kick(s);
    ok(wait_for(&cols[1], is_done) && !cols[1].started &&
           cols[1].fin.finish == HP_FINISH_CANCEL,
       "a queued request is cancelled before it starts");
    pthread_mutex_lock(&mu);
    cols[0].cancel = 1;
    pthread_mutex_unlock(&mu);
    hp_sched_kick(s);
    int fin = wait_for(&cols[0], is_done);
    ok(fin && cols[0].fin.finish == HP_FINISH_CANCEL &&
           cols[0].fin.completion_tokens > 0,
       "a running request is cancelled mid-stream (after %d tokens)",
       cols[0].fin.completion_tokens);
    hp_sched_stats_t st;
    settled(s, &st);
    ok(st.live == 0 && st.bytes == 0 && st.running == 0 && st.queued == 0,
       "cancelled requests hold no memory (%d live, %zu bytes)", st.live,
       st.bytes);

    /* shutting down with requests in flight cancels them */
    submit(s, &cols[2], "Hello world", 100000, 0, 0, NULL, 1);
    submit(s, &cols[3], "Hello world", 100000, 0, 0, NULL, 1);
    wait_for(&cols[2], has_text);
    hp_sched_destroy(s);
    ok(cols[2].done && cols[3].done && cols[2].fin.finish == HP_FINISH_CANCEL &&
           cols[3].fin.finish == HP_FINISH_CANCEL,
       "destroy cancels what is running and what waits");
}

/* What the last flush told a reader (the server's shared gauges). */
static hp_sched_stats_t flushed;
static int n_flushes;

static void on_flush(void *ud, const hp_sched_stats_t *st)
{
    (void)ud;
    pthread_mutex_lock(&mu);
    flushed = *st;
    n_flushes++;
    pthread_mutex_unlock(&mu);
}

/* A queued request cancelled while the running one is stalled produces
 * no output, yet the gauges readers see must drop it. */
static void test_cancel_gauges(void)
{
    reset();
    hp_sched_t *s;
    hp_error_t err = {0};
    hp_sched_cfg_t cfg = {
        .batch = 1, .prefill_chunk = 256, .max_queue = 64, .flush = on_flush};
    if (hp_sched_create(&s, &llm, &cfg, &err) != HP_OK) {
        tap_diag("%s", err.msg);
        exit(1);
    }
    cols[0].accept = 0; /* the running one's reader takes nothing */
    submit(s, &cols[0], "Hello world", 100000, 0, 0, NULL, 1);
    submit(s, &cols[1], "Once upon a time", 100000, 0, 0, NULL, 1);
    int shown = 0;
    for (int i = 0; i < 3000 && !shown; i++) {
        pthread_mutex_lock(&mu);
        shown = flushed.running == 1 && flushed.queued == 1;
        pthread_mutex_unlock(&mu);
        if (!shown)
            usleep(10000);
    }
    ok(shown, "the gauges show 1 running, 1 queued");
    pthread_mutex_lock(&mu);
    cols[1].cancel = 1;
    pthread_mutex_unlock(&mu);
    hp_sched_kick(s);
    ok(wait_for(&cols[1], is_done) && !cols[1].started,
       "the queued one is cancelled");
    int gone = 0;
    for (int i = 0; i < 3000 && !gone; i++) {
        pthread_mutex_lock(&mu);
        gone = flushed.running == 1 && flushed.queued == 0;
        pthread_mutex_unlock(&mu);
        if (!gone)
            usleep(10000);
    }
    ok(gone,
       "the gauges drop it although nothing was produced "
       "(running %d, queued %d after %d flushes)",
       flushed.running, flushed.queued, n_flushes);
    hp_sched_destroy(s);
}

static int is_started(col_t *c)
{
    return c->started;
}

/* Draining: the queued end at once with the drain's error, the running
 * one runs to its end, and nothing new is taken. */
static void test_drain(void)
{
    reset();
    hp_sched_t *s = make(1, 256, 64, 0, 5);
    submit(s, &cols[0], "Hello world", 60, 0, 0, NULL, 1);
    submit(s, &cols[1], "Once upon a time", 60, 0, 0, NULL, 1);
    submit(s, &cols[2], "The quick brown fox", 60, 0, 0, NULL, 1);
    ok(wait_for(&cols[0], is_started), "batch 1: one request runs");
    hp_sched_drain(s, HP_EUNAVAIL, "draining for a test");
    ok(wait_for(&cols[1], is_done) && wait_for(&cols[2], is_done) &&
           !cols[1].started && !cols[2].started &&
           cols[1].fin.status == HP_EUNAVAIL &&
           !strcmp(cols[1].fin.err.msg, "draining for a test") &&
           cols[2].fin.status == HP_EUNAVAIL,
       "the queued requests end unstarted with the drain's error");
    pthread_mutex_lock(&mu);
    int running_on = !cols[0].done;
    pthread_mutex_unlock(&mu);
    ok(running_on, "while the running one runs on");
    ok(submit(s, &cols[3], "Hi", 4, 0, 0, NULL, 1) == HP_EUNAVAIL,
       "a new request is refused");
    ok(wait_for(&cols[0], is_done) && cols[0].fin.status == HP_OK &&
           cols[0].fin.finish == HP_FINISH_LENGTH &&
           cols[0].fin.completion_tokens == 60,
       "the running request finishes all its tokens (%d)",
       cols[0].fin.completion_tokens);
    hp_sched_stats_t st;
    settled(s, &st);
    ok(st.live == 0 && st.bytes == 0, "nothing is held after the drain");
    hp_sched_destroy(s);
}

static void test_limits(void)
{
    hp_error_t err = {0};
    reset();
    hp_sched_t *s = make(1, 256, 2, 12, 1);
    hp_sched_req_t r = {.prompt = "Hello world, a long prompt this time",
                        .ops = &ops,
                        .ud = &cols[0]};
    r.prompt_len = strlen(r.prompt);
    r.gen.max_tokens = 4;
    ok(hp_sched_submit(s, &r, &err) == HP_ETOOLARGE &&
           strstr(err.msg, "context"),
       "a prompt longer than the context is refused: %s", err.msg);
    r.prompt = "";
    r.prompt_len = 0;
    ok(hp_sched_submit(s, &r, &err) == HP_EBADINPUT,
       "an empty prompt is refused: %s", err.msg);

    submit(s, &cols[1], "Hello world", 100, 0, 0, NULL, 1);
    submit(s, &cols[2], "Hello world", 100, 0, 0, NULL, 1);
    r.prompt = "Hi";
    r.prompt_len = 2;
    r.ud = &cols[3];
    ok(hp_sched_submit(s, &r, &err) == HP_EBUSY,
       "past max_queue requests in flight: busy (%s)", err.msg);
    int fin = wait_for(&cols[1], is_done);
    ok(fin && cols[1].fin.finish == HP_FINISH_LENGTH &&
           cols[1].fin.prompt_tokens + cols[1].fin.completion_tokens == 12,
       "generation stops at the end of the context: %d + %d tokens",
       cols[1].fin.prompt_tokens, cols[1].fin.completion_tokens);
    wait_for(&cols[2], is_done);
    ok(hp_sched_submit(s, &r, &err) == HP_OK && wait_for(&cols[3], is_done),
       "with room again, a request is accepted");
    hp_sched_destroy(s);
}

/* ---- decode forms, speculation and batched decode -------------------- */

typedef struct {
    const char *prompt;
    int mode, decode, spec;
    float temp;
} form_req_t;

/* A scheduler over fresh caches (every mode runs), with solo_decode. */
static hp_sched_t *make_cached(int batch, int solo, hp_cache_t *cache)
{
    hp_sched_t *s;
    hp_error_t err = {0};
    hp_prefix_cache_params_t pcp;
    hp_prefix_cache_params_default(&pcp, 64u << 20);
    cache->pub = hp_pool_create(64u << 20, &err);
    cache->prefix =
        hp_prefix_cache_create(&llm.model.cfg, &pcp, llm.model.be, &err);
    hp_sched_cfg_t cfg = {.batch = batch,
                          .prefill_chunk = 16,
                          .max_queue = 64,
                          .cache = cache,
                          .seam = -1,
                          .max_draft = 6,
                          .solo_decode = solo};
    if (!cache->pub || !cache->prefix ||
        hp_sched_create(&s, &llm, &cfg, &err) != HP_OK) {
        tap_diag("%s", err.msg);
        exit(1);
    }
    return s;
}

static void unmake_cached(hp_sched_t *s, hp_cache_t *cache)
{
    hp_sched_destroy(s);
    hp_pool_destroy(cache->pub);
    hp_prefix_cache_destroy(cache->prefix);
}

static int submit_form(hp_sched_t *s, col_t *c, const form_req_t *f, int i)
{
    hp_error_t err = {0};
    hp_sched_req_t r = {.prompt = f->prompt,
                        .prompt_len = strlen(f->prompt),
                        .separator = "<|pic_sep|>",
                        .mode = f->mode,
                        .seam = -1,
                        .decode = f->decode,
                        .speculative = f->spec,
                        .ops = &ops,
                        .ud = c};
    r.gen.max_tokens = 30;
    r.gen.ignore_eos = 1;
    r.gen.sampling = (hp_sampling_t){f->temp, 0, 1.0f, 500 + (uint64_t)i};
    int rc = hp_sched_submit(s, &r, &err);
    if (rc != HP_OK)
        tap_diag("submit: %s", err.msg);
    return rc;
}

/* Requests of every mode, decode form and length, with and without
 * speculation, batched together (batch 4), against each one alone. */
static void test_forms(void)
{
    static char longp[1400];
    for (int i = 0; i < 1300; i += 13)
        memcpy(longp + i, "a story told ", 13);
    enum {
        F = HP_IPC_MODE_FULL,
        X = HP_IPC_MODE_PREFIX,
        N = HP_IPC_MODE_NAIVE
    };
    enum {
        REC = HP_SCHED_DECODE_RECURRENT,
        CHW = HP_SCHED_DECODE_CHUNKWISE,
        AUT = HP_SCHED_DECODE_AUTO,
        ON = HP_SCHED_SPEC_ON
    };
    const char *rep = "the cat sat on the mat. the cat sat on the mat. the "
                      "cat sat on the";
    const char *rag = "You answer.<|pic_sep|>The cat sat on the mat; the mat "
                      "was red.<|pic_sep|>Dogs bark at night, cats do "
                      "not.<|pic_sep|>Where did the cat sit? the cat sat on";
    const form_req_t reqs[] = {
        {rep, F, REC, 0, 0},
        {rep, F, CHW, ON, 0},
        {rep, F, AUT, 0, 0},
        {"the cat sat.", F, AUT, ON, 0},
        {rag, HP_IPC_MODE_PIC, AUT, ON, 0},
        {rag, N, CHW, 0, 0},
        {rag, X, REC, ON, 0},
        {longp, F, CHW, ON, 0},
        {longp, F, REC, 0, 0},
        {rep, F, CHW, ON, 0.8f},
        {"the cat sat.", F, AUT, 0, 0},
        {rag, HP_IPC_MODE_PIC, REC, 0, 0},
    };
    enum { NR = sizeof(reqs) / sizeof(reqs[0]) };
    static col_t alone_c[NR];
    hp_cache_t cache;

    for (int i = 0; i < NR; i++) {
        reset();
        hp_sched_t *s = make_cached(1, 0, &cache);
        submit_form(s, &cols[0], &reqs[i], i);
        wait_for(&cols[0], is_done);
        alone_c[i] = cols[0];
        unmake_cached(s, &cache);
    }
    /* speculation and the decode form never change a greedy answer */
    int same = 1;
    for (int i = 0; i < NR; i++)
        for (int j = 0; j < NR; j++)
            if (reqs[i].prompt == reqs[j].prompt &&
                reqs[i].mode == reqs[j].mode && !reqs[i].temp &&
                !reqs[j].temp && strcmp(alone_c[i].text, alone_c[j].text)) {
                same = 0;
                tap_diag("requests %d and %d differ: \"%s\" / \"%s\"", i, j,
                         alone_c[i].text, alone_c[j].text);
            }
    ok(same, "greedy text is the same in every decode form, speculative "
             "or not");
    int drafted = 0, acc = 0, forms = 1;
    static const int want[NR] = {
        REC, CHW, CHW, HP_SCHED_DECODE_KVONLY, CHW, CHW, CHW,
        CHW, REC, CHW, HP_SCHED_DECODE_KVONLY, REC};
    for (int i = 0; i < NR; i++) {
        drafted += alone_c[i].fin.draft_tokens;
        acc += alone_c[i].fin.accepted_tokens;
        forms &= alone_c[i].fin.decode == want[i] &&
                 (alone_c[i].fin.draft_tokens > 0) == (reqs[i].spec == ON);
    }
    ok(forms && acc > 0,
       "each request reports its form; the speculative ones drafted %d "
       "tokens, %d accepted",
       drafted, acc);

    for (int solo = 0; solo <= 1; solo++) {
        reset();
        hp_sched_t *s = make_cached(4, solo, &cache);
        int bad = 0;
        for (int i = 0; i < NR; i++)
            bad |= submit_form(s, &cols[i], &reqs[i], i);
        int match = !bad;
        for (int i = 0; i < NR; i++) {
            match &= wait_for(&cols[i], is_done);
            if (strcmp(cols[i].text, alone_c[i].text) ||
                cols[i].fin.completion_tokens !=
                    alone_c[i].fin.completion_tokens ||
                cols[i].fin.accepted_tokens != alone_c[i].fin.accepted_tokens) {
                match = 0;
                tap_diag("request %d: \"%s\" (%d accepted), alone \"%s\" "
                         "(%d)",
                         i, cols[i].text, cols[i].fin.accepted_tokens,
                         alone_c[i].text, alone_c[i].fin.accepted_tokens);
            }
        }
        ok(match, "%d requests %s give exactly their texts alone", NR,
           solo ? "one pass each (solo_decode)" : "batched (4 per pass)");
        hp_sched_stats_t st;
        settled(s, &st);
        ok(st.live == 0 && st.bytes == 0, "their memory is gone");
        unmake_cached(s, &cache);
    }
}

/* ---- log-probabilities and n choices -------------------------------- */

static const float *sort_keys;

static int by_logit(const void *a, const void *b)
{
    int x = *(const int *)a, y = *(const int *)b;
    if (sort_keys[x] != sort_keys[y])
        return sort_keys[x] < sort_keys[y] ? 1 : -1;
    return x - y;
}

/* 1 if out matches log-softmax of l[0..V) in long double for token and
 * the n_top likeliest (lower id first among equals) */
static int brute_ok(const hp_logprobs_t *out, const float *l, int V, int tok,
                    int n_top, double *worst)
{
    long double mx = l[0], sum = 1; /* the maximum's term, exp(0) */
    int *idx = malloc((size_t)V * sizeof(int)), good = 1, arg = 0;
    for (int i = 1; i < V; i++)
        if (l[i] > mx) {
            mx = l[i];
            arg = i;
        }
    for (int i = 0; i < V; i++)
        if (i != arg)
            sum += expl((long double)l[i] - mx);
    long double lse = mx + logl(sum);
    for (int i = 0; i < V; i++)
        idx[i] = i;
    sort_keys = l;
    qsort(idx, (size_t)V, sizeof(int), by_logit);
    int k = n_top < V ? n_top : V;
    /* the error relative to 1 + |logprob|: a float holds ~7 digits */
    double ref = (double)(l[tok] - lse);
    double e = fabs(ref - out->logprob) / (1 + fabs(ref));
    good &= out->token == tok && out->n_top == k;
    for (int j = 0; j < k && good; j++) {
        ref = (double)(l[idx[j]] - lse);
        double d = fabs(ref - out->top_lp[j]) / (1 + fabs(ref));
        good &= out->top_id[j] == idx[j];
        e = d > e ? d : e;
    }
    *worst = e > *worst ? e : *worst;
    free(idx);
    return good && e <= 1e-6;
}

static void test_math(void)
{
    enum { V = 3000 };
    float *l = frand_amp(V, 6.0);
    hp_logprobs_t out;
    double worst = 0;
    int good = 1, sorted = 1, mass = 1;

    /* ties at the top: lower ids come first */
    l[700] = l[40] = l[2999] = 9.0f;
    for (int rep = 0; rep < 4; rep++) {
        const int tops[] = {0, 1, 3, 5, 20};
        for (int t = 0; t < 5; t++) {
            int tok = (int)((urand() + 1.0) / 2.0 * (V - 1));
            hp_logprobs(&out, l, V, tok, tops[t]);
            good &= brute_ok(&out, l, V, tok, tops[t], &worst);
            double p = 0;
            for (int j = 0; j < out.n_top; j++) {
                sorted &= j == 0 || out.top_lp[j] <= out.top_lp[j - 1];
                p += exp(out.top_lp[j]);
            }
            mass &= p <= 1.0 + 1e-6 && out.logprob <= 0;
        }
        for (int i = 0; i < V; i++) /* sharper, then flatter */
            l[i] *= rep % 2 ? 0.01f : 40.0f;
    }
    ok(good,
       "log-softmax in float against long double: token and top-k "
       "ids exact, values within 1e-6 of 1 + |logprob| (worst %.2g)",
       worst);
    ok(sorted && mass, "alternatives by falling logprob, probabilities sum "
                       "to at most 1, logprobs <= 0");
    hp_logprobs(&out, l, V, 0, 3);
    ok(out.top_id[0] == 40 && out.top_id[1] == 700 && out.top_id[2] == 2999,
       "equal logits: lower id first (%d %d %d)", out.top_id[0], out.top_id[1],
       out.top_id[2]);
    hp_logprobs(&out, l, 8, 2, 20);
    ok(out.n_top == 8 && brute_ok(&out, l, 8, 2, 20, &worst),
       "more alternatives asked than tokens: every token, in order");
    free(l);
    ok(hp_sampling_choice_seed(77, 0) == 77 &&
           hp_sampling_choice_seed(77, 1) != hp_sampling_choice_seed(77, 2),
       "choice 0 keeps the request's seed, the others differ");
}

static void test_decoder_logprobs(void)
{
    hp_sampler_t sm;
    hp_decoder_t d;
    hp_error_t err = {0};
    int V = llm.model.cfg.vocab_size, t;
    const hp_decoder_lp_t *lp;
    /* "é" is two byte tokens: its first makes no text of its own */
    const char *toks[] = {"a", "\xc3\x83", "\xc2\xa9", "z", "S", "T", "O", "P"};
    int ids[8];

    for (int i = 0; i < 8; i++)
        ids[i] = hp_tokenizer_token_id(llm.tok, toks[i]);
    hp_sampler_init(&sm, V);
    hp_gen_params_t p = {.max_tokens = 50,
                         .sampling = {0, 0, 1.0f, 0},
                         .logprobs = 1,
                         .top_logprobs = 2};
    p.stop[0] = "STOP";
    p.n_stop = 1;
    hp_decoder_init(&d, &llm, &p, &err);
    for (int i = 0; i < 6; i++)
        hp_decoder_next(&d, &sm, forced(V, ids[i]), &t, &err);
    int n = hp_decoder_logprobs_ready(&d, &lp);
    ok(n == 4 && lp[0].lp.token == ids[0] && lp[3].lp.token == ids[3] &&
           lp[0].lp.n_top == 2 && lp[0].lp.top_id[0] == ids[0] &&
           lp[0].lp.logprob > -1e-6f && lp[0].lp.logprob <= 0,
       "an entry per token, ready while its text is (\"ST\" may still be "
       "a stop string: %d ready)",
       n);
    size_t at[4];
    for (int i = 0; i < n && i < 4; i++)
        at[i] = hp_decoder_chars(&d, lp[i].off);
    ok(n == 4 && at[0] == 0 && at[1] == 1 && at[2] == 1 && at[3] == 2,
       "text offsets in characters: a=0, the two bytes of é at 1, z at 2");
    hp_decoder_logprobs_take(&d, 2);
    for (int i = 6; i < 8; i++)
        hp_decoder_next(&d, &sm, forced(V, ids[i]), &t, &err);
    n = hp_decoder_logprobs_ready(&d, &lp);
    ok(d.done && d.finish == HP_FINISH_STOP && n == 2 &&
           lp[0].lp.token == ids[2] && lp[1].lp.token == ids[3],
       "a stop string ends it and its tokens have no entry (%d left)", n);
    hp_decoder_free(&d);

    p.logprobs = 0;
    hp_decoder_init(&d, &llm, &p, &err);
    hp_decoder_next(&d, &sm, forced(V, ids[0]), &t, &err);
    ok(hp_decoder_logprobs_ready(&d, &lp) == 0, "none kept unless asked");
    hp_decoder_free(&d);
    hp_sampler_free(&sm);
}

static const char *RAG = "You answer.<|pic_sep|>The cat sat on the mat; the "
                         "mat was red.<|pic_sep|>Where did the cat sit? the "
                         "cat sat on";

static int submit_n(hp_sched_t *s, col_t *c, int mode, int n, uint64_t seed)
{
    hp_error_t err = {0};
    hp_sched_req_t r = {.prompt = RAG,
                        .prompt_len = strlen(RAG),
                        .separator = "<|pic_sep|>",
                        .mode = mode,
                        .seam = -1,
                        .n = n,
                        .ops = &choice_ops,
                        .ud = c};
    r.gen.max_tokens = MAX_TOK;
    r.gen.ignore_eos = 1;
    r.gen.sampling = (hp_sampling_t){1.0f, 0, 1.0f, seed};
    r.gen.logprobs = 1;
    r.gen.top_logprobs = 3;
    int rc = hp_sched_submit(s, &r, &err);
    if (rc != HP_OK)
        tap_diag("submit: %s", err.msg);
    return rc;
}

/* Choice i of `many` against the one choice of alone[i]: same text, same
 * log-probabilities (within tol; 0: bit for bit). */
static int same_choices(const col_t *many, col_t *const *alone, int n,
                        float tol)
{
    int same = 1;
    for (int i = 0; i < n; i++) {
        same &= !strcmp(many->ctext[i], alone[i]->ctext[0]) &&
                many->n_lp[i] == alone[i]->n_lp[0] && many->n_lp[i] == MAX_TOK;
        for (int k = 0; k < many->n_lp[i] && k < MAX_LP && same; k++)
            for (int j = 0; j < 4; j++)
                same &= fabsf(many->lp[i][k][j] - alone[i]->lp[0][k][j]) <= tol;
        if (!same) {
            tap_diag("choice %d: \"%s\" (%d entries), alone \"%s\" (%d)", i,
                     many->ctext[i], many->n_lp[i], alone[i]->ctext[0],
                     alone[i]->n_lp[0]);
            return 0;
        }
    }
    return same;
}

static void test_choices(int mode, int solo, const char *what)
{
    static col_t many, again, one[3];
    col_t *alone[3] = {&one[0], &one[1], &one[2]};
    hp_cache_t cache;
    hp_sched_t *s = make_cached(4, solo, &cache);

    memset(&many, 0, sizeof(many));
    memset(&again, 0, sizeof(again));
    memset(one, 0, sizeof(one));
    /* the separate runs first (pic: their segments are then cached for
     * the request of 3 as for the others), then 3 choices at once */
    for (int i = 0; i < 3; i++) {
        submit_n(s, &one[i], mode, 1, hp_sampling_choice_seed(1234, i));
        wait_for(&one[i], is_done);
    }
    submit_n(s, &many, mode, 3, 1234);
    wait_for(&many, is_done);
    ok(many.dones == 1 && many.fin.status == HP_OK &&
           many.fin.completion_tokens == 3 * MAX_TOK &&
           many.fin.prompt_tokens == one[0].fin.prompt_tokens,
       "%s: 3 choices end once, completion_tokens %d is their sum", what,
       many.fin.completion_tokens);
    ok(many.ends[0] == 1 && many.ends[1] == 1 && many.ends[2] == 1 &&
           many.end_tokens[2] == MAX_TOK && !many.texts_after_end,
       "%s: each choice ends once, after its text", what);
    ok(same_choices(&many, alone, 3, solo ? 0.0f : 1e-4f),
       "%s: choice i is the run of one request seeded "
       "hp_sampling_choice_seed(seed, i): text and logprobs%s",
       what, solo ? " bit for bit" : " within 1e-4");
    ok(strcmp(many.ctext[0], many.ctext[1]) ||
           strcmp(many.ctext[1], many.ctext[2]),
       "%s: the choices differ", what);
    /* all at once: the request of 3 and another beside it */
    submit_n(s, &again, mode, 3, 1234);
    wait_for(&again, is_done);
    int rep = 1;
    for (int i = 0; i < 3; i++)
        rep &= !strcmp(again.ctext[i], many.ctext[i]);
    ok(rep, "%s: the same seed gives the same choices", what);
    unmake_cached(s, &cache);
}

/* A pic request whose segments the public pool cannot hold at once runs
 * full (before: its warm pass evicted one segment to build the next, for
 * ever), with full's text, and is counted; one that fits runs pic. */
static void test_pool_short(void)
{
    static col_t pic, full, fits;
    hp_error_t err = {0};
    hp_cache_t cache;
    hp_prompt_t p;
    hp_sched_stats_t st;
    hp_sched_t *s = make_cached(4, 0, &cache);
    hp_prompt_build(&p, &llm, RAG, strlen(RAG), "<|pic_sep|>", &err);
    size_t all = hp_assemble_pool_bytes(&llm.model.cfg, &p, HP_IPC_MODE_PIC,
                                        HP_SEAM_DEFAULT);
    hp_prompt_free(&p);
    hp_pool_destroy(cache.pub); /* empty: nothing has run */
    cache.pub = hp_pool_create(all - HP_POOL_ALIGN, &err);
    memset(&pic, 0, sizeof(pic));
    memset(&full, 0, sizeof(full));
    memset(&fits, 0, sizeof(fits));
    submit_n(s, &pic, HP_IPC_MODE_PIC, 1, 7);
    submit_n(s, &full, HP_IPC_MODE_FULL, 1, 7);
    int done = wait_for(&pic, is_done) && wait_for(&full, is_done);
    settled(s, &st);
    ok(done && pic.fin.status == HP_OK && pic.fin.mode == HP_IPC_MODE_FULL &&
           !strcmp(pic.ctext[0], full.ctext[0]) && st.pool_short == 1,
       "pool short: pic whose segments take %zu bytes of a pool of %zu "
       "runs full (mode %d), full's text, counted (%llu)",
       all, all - HP_POOL_ALIGN, pic.fin.mode,
       (unsigned long long)st.pool_short);
    unmake_cached(s, &cache);
    s = make_cached(4, 0, &cache);
    hp_pool_destroy(cache.pub);
    cache.pub = hp_pool_create(all, &err);
    submit_n(s, &fits, HP_IPC_MODE_PIC, 1, 7);
    done = wait_for(&fits, is_done);
    settled(s, &st);
    ok(done && fits.fin.status == HP_OK && fits.fin.mode == HP_IPC_MODE_PIC &&
           st.pool_short == 0,
       "pool short: a pool of exactly %zu bytes runs it pic (mode %d)", all,
       fits.fin.mode);
    unmake_cached(s, &cache);
}

static void test_choice_limits(void)
{
    static col_t c;
    hp_cache_t cache;
    hp_error_t err = {0};
    hp_sched_t *s = make_cached(2, 0, &cache);
    hp_sched_req_t r = {.prompt = "hello",
                        .prompt_len = 5,
                        .mode = HP_IPC_MODE_FULL,
                        .seam = -1,
                        .n = 3,
                        .ops = &choice_ops,
                        .ud = &c};
    r.gen.max_tokens = 4;
    ok(hp_sched_submit(s, &r, &err) == HP_EBADINPUT &&
           strstr(err.msg, "'n' is 3"),
       "n past the batch is refused (%s)", err.msg);

    /* cancelled while its choices decode: done once, nothing left */
    memset(&c, 0, sizeof(c));
    r.n = 2;
    r.gen.max_tokens = 100000;
    r.gen.ignore_eos = 1;
    hp_sched_submit(s, &r, &err);
    for (int i = 0; i < 2000; i++) {
        pthread_mutex_lock(&mu);
        int going = c.n_lp[1] + (int)strlen(c.ctext[1]) > 0;
        if (going)
            c.cancel = 1;
        pthread_mutex_unlock(&mu);
        if (going)
            break;
        struct timespec ts = {0, 5000000};
        nanosleep(&ts, NULL);
    }
    hp_sched_kick(s);
    wait_for(&c, is_done);
    hp_sched_stats_t st;
    for (int i = 0; i < 3000; i++) {
        hp_sched_stats(s, &st);
        if (st.live == 0 && st.running == 0 && st.bytes == 0)
            break;
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
    }
    ok(c.dones == 1 && c.fin.finish == HP_FINISH_CANCEL && st.live == 0 &&
           st.running == 0 && st.bytes == 0,
       "a cancelled request of 2 choices ends once and frees all "
       "(live %d, running %d, %zu bytes)",
       st.live, st.running, st.bytes);
    unmake_cached(s, &cache);
}

/* The pool itself: extents taken, moved when a sequence outgrows its
 * own (contents kept), given back and merged. */
static void test_seq_pool(void)
{
    const hp_model_t *m = &llm.model;
    const hp_model_config_t *c = &m->cfg;
    hp_error_t err = {0};
    hp_seq_pool_t *p;
    size_t one = hp_seq_pool_need(m, 8), big = hp_seq_pool_need(m, 16);
    if (!ok(hp_seq_pool_create(&p, m->be, 2 * one + big, &err) == HP_OK,
            "seq pool: created (%s)", err.msg))
        return;
    hp_seq_t a, b, x;
    int la = 0, lf = 0;
    while (c->layer_kind[la] != HP_LAYER_LINEAR)
        la++;
    while (c->layer_kind[lf] != HP_LAYER_FULL)
        lf++;
    ok(hp_seq_init_in(&a, m, p, 8, &err) == HP_OK &&
           hp_seq_init_in(&b, m, p, 8, &err) == HP_OK,
       "seq pool: two sequences of 8 positions");
    ok(hp_seq_init_in(&x, m, p, 17, &err) == HP_EBUSY,
       "seq pool: no room now for 17: busy (%s)", err.msg);
    ok(hp_seq_init_in(&x, m, p, 100000, &err) == HP_ETOOLARGE,
       "seq pool: larger than the pool: too large (%s)", err.msg);
    a.layers[la].S[3] = 1.5f;
    a.layers[lf].k[7 * c->kv_row] = 2.5f;
    a.n_pos = 8;
    ok(hp_seq_reserve(&a, 12, &err) == HP_OK && a.kv_cap >= 12 &&
           a.layers[la].S[3] == 1.5f && a.layers[lf].k[7 * c->kv_row] == 2.5f,
       "seq pool: outgrowing its extent moves it, states and K/V kept");
    ok(hp_seq_reserve(&b, 40, &err) == HP_ENOMEM,
       "seq pool: no extent left to grow into: out of memory (%s)", err.msg);
    hp_seq_free(&a);
    hp_seq_free(&b);
    size_t largest, all = hp_seq_pool_free_bytes(p, &largest);
    ok(all == hp_seq_pool_bytes(p) && largest == all,
       "seq pool: all given back in one extent (%zu of %zu)", largest,
       hp_seq_pool_bytes(p));
    hp_seq_pool_free(p);
}

/* The sequence pool (hp_sched_cfg_t.seq_budget) on the CPU backend:
 * room for one request of the prompt below at a time. */
static void test_seq_budget(void)
{
    static col_t a, b, c2;
    hp_error_t err = {0};
    const char *prompt = "Hello world";
    hp_prompt_t p;
    hp_prompt_build(&p, &llm, prompt, strlen(prompt), "", &err);
    int n = p.n;
    hp_prompt_free(&p);
    size_t need = hp_seq_pool_need(&llm.model, n + 6 + HP_SCHED_MAX_DRAFT + 1);
    hp_sched_cfg_t cfg = {.batch = 4,
                          .prefill_chunk = 256,
                          .max_context = 256,
                          .seq_budget = need + need / 2};
    hp_sched_t *s;
    if (!ok(hp_sched_create(&s, &llm, &cfg, &err) == HP_OK,
            "a scheduler with a sequence pool: %s", err.msg))
        return;
    memset(&a, 0, sizeof(a));
    memset(&b, 0, sizeof(b));
    memset(&c2, 0, sizeof(c2));
    a.accept = b.accept = c2.accept = -1;
    pthread_mutex_lock(&mu);
    n_finished = 0;
    pthread_mutex_unlock(&mu);
    submit(s, &a, prompt, 6, 0, 0, NULL, 1);
    submit(s, &b, prompt, 6, 0, 0, NULL, 1);
    wait_for(&a, is_done);
    wait_for(&b, is_done);
    ok(a.fin.status == HP_OK && b.fin.status == HP_OK &&
           a.fin.completion_tokens == 6 && !strcmp(a.text, b.text),
       "seq budget: both requests run, the same greedy text (\"%s\")", a.text);
    ok(b.started && b.finished_before == 1,
       "seq budget: the second waits in the queue until the first ends "
       "(%d ended before it started)",
       b.finished_before);
    ok(submit(s, &c2, prompt, 200, 0, 0, NULL, 1) == HP_ETOOLARGE,
       "seq budget: a request that can never fit is refused");
    hp_sched_destroy(s);

    /* two choices, each its own extent taken at admission */
    cfg.seq_budget =
        2 * hp_seq_pool_need(&llm.model, n + MAX_TOK + HP_SCHED_MAX_DRAFT + 1);
    static col_t two;
    memset(&two, 0, sizeof(two));
    two.accept = -1;
    hp_sched_req_t r = {.prompt = prompt,
                        .prompt_len = strlen(prompt),
                        .mode = HP_IPC_MODE_FULL,
                        .seam = -1,
                        .n = 2,
                        .ops = &choice_ops,
                        .ud = &two};
    r.gen.max_tokens = MAX_TOK;
    r.gen.ignore_eos = 1;
    r.gen.sampling = (hp_sampling_t){1.0f, 0, 1.0f, 7};
    if (hp_sched_create(&s, &llm, &cfg, &err) != HP_OK)
        return;
    int sent = hp_sched_submit(s, &r, &err) == HP_OK && wait_for(&two, is_done);
    ok(sent && two.fin.status == HP_OK &&
           two.fin.completion_tokens == 2 * MAX_TOK,
       "seq budget: 2 choices decode in the extents of their admission "
       "(%d tokens) %s",
       two.fin.completion_tokens, two.fin.err.msg);
    hp_sched_destroy(s);
}

/* ---- memory on demand: growth and preemption -------------------------- */

#define GROW_CTX 96 /* max_context: requests without max_tokens end here */

typedef struct {
    int n;      /* choices */
    float temp; /* 0: greedy */
    int spec;   /* HP_SCHED_SPEC_* */
    int decode; /* HP_SCHED_DECODE_* */
    int lp;     /* log-probabilities: a token() per token */
} grow_req_t;

static int submit_grow(hp_sched_t *s, col_t *c, const char *prompt,
                       const grow_req_t *g, uint64_t seed)
{
    hp_error_t err = {0};
    hp_sched_req_t r = {.prompt = prompt,
                        .prompt_len = strlen(prompt),
                        .mode = HP_IPC_MODE_FULL,
                        .seam = -1,
                        .n = g->n,
                        .decode = g->decode,
                        .speculative = g->spec,
                        .ops = g->n > 1 || g->lp ? &choice_ops : &ops,
                        .ud = c};
    memset(c, 0, sizeof(*c));
    c->accept = -1;
    r.gen.max_tokens = 1 << 30; /* none asked: the context's end */
    r.gen.ignore_eos = 1;
    r.gen.logprobs = g->lp;
    r.gen.sampling = (hp_sampling_t){g->temp, 0, 1.0f, seed};
    int rc = hp_sched_submit(s, &r, &err);
    if (rc != HP_OK)
        tap_diag("submit: %s", err.msg);
    return rc;
}

/* A choice's text and token count (both collectors). */
static const char *grow_text(const col_t *c, const grow_req_t *g, int i)
{
    return g->n > 1 || g->lp ? c->ctext[i] : c->text;
}

static hp_sched_t *make_grow(size_t budget, int spec)
{
    hp_sched_t *s;
    hp_error_t err = {0};
    hp_sched_cfg_t cfg = {.batch = 6,
                          .prefill_chunk = 16,
                          .max_context = GROW_CTX,
                          .max_draft = 6,
                          .speculative = spec,
                          .seq_budget = budget,
                          .seq_step = 8};
    if (hp_sched_create(&s, &llm, &cfg, &err) != HP_OK) {
        tap_diag("%s", err.msg);
        exit(1);
    }
    return s;
}

/*
 * Requests that omit max_tokens on a pool that holds two sequences of
 * the whole context: they take first extents of prompt + 8 positions,
 * grow as they decode, and the last admitted is preempted and resumed
 * by recompute. Each round submits two greedy requests and then the
 * one under test (the victim); every text must be what it is alone,
 * streamed once.
 */
static void test_seq_grow(void)
{
    static const char *prompts[3] = {"Hello world", "Once upon a time",
                                     "the cat the cat the cat the cat sat"};
    static const grow_req_t fill = {1, 0, HP_SCHED_SPEC_OFF, 0, 0};
    static const struct {
        grow_req_t g;
        const char *what;
    } rounds[] = {
        {{1, 0, HP_SCHED_SPEC_OFF, 0, 1}, "greedy, streamed with logprobs"},
        {{1, 1.0f, HP_SCHED_SPEC_OFF, 0, 0}, "sampled with a seed"},
        {{2, 1.0f, HP_SCHED_SPEC_OFF, 0, 1}, "2 choices, sampled"},
        {{1, 0, HP_SCHED_SPEC_ON, HP_SCHED_DECODE_CHUNKWISE, 0},
         "greedy, speculative (KVBuffer)"},
        {{1, 0, HP_SCHED_SPEC_OFF, HP_SCHED_DECODE_AUTO, 0},
         "greedy, KV-only decode"},
    };
    static col_t ref[3], got[3];
    hp_error_t err = {0};
    int nr = (int)(sizeof(rounds) / sizeof(rounds[0]));
    size_t full =
        hp_seq_pool_need(&llm.model, GROW_CTX + HP_SCHED_MAX_DRAFT + 1);
    hp_sched_t *alone_s = make_grow(0, 0), *s = make_grow(2 * full, 0);

    for (int k = 0; k < nr; k++) {
        const grow_req_t *g = &rounds[k].g;
        uint64_t seed = 77 + (uint64_t)k;
        /* alone: one at a time, no pool */
        for (int i = 0; i < 3; i++) {
            submit_grow(alone_s, &ref[i], prompts[i], i < 2 ? &fill : g, seed);
            wait_for(&ref[i], is_done);
        }
        for (int i = 0; i < 3; i++)
            submit_grow(s, &got[i], prompts[i], i < 2 ? &fill : g, seed);
        int same = 1, once = 1;
        for (int i = 0; i < 3; i++) {
            const grow_req_t *gi = i < 2 ? &fill : g;
            same &=
                wait_for(&got[i], is_done) && got[i].fin.status == HP_OK &&
                got[i].fin.finish == HP_FINISH_LENGTH &&
                got[i].fin.completion_tokens == ref[i].fin.completion_tokens;
            for (int c = 0; c < gi->n; c++) {
                same &= !strcmp(grow_text(&got[i], gi, c),
                                grow_text(&ref[i], gi, c));
                if (strcmp(grow_text(&got[i], gi, c),
                           grow_text(&ref[i], gi, c)))
                    tap_diag("%s: request %d choice %d: \"%s\", alone \"%s\"",
                             rounds[k].what, i, c, grow_text(&got[i], gi, c),
                             grow_text(&ref[i], gi, c));
                /* a token() per token: none twice, none lost */
                if (gi->lp)
                    once &= got[i].n_lp[c] ==
                                got[i].fin.completion_tokens / gi->n &&
                            got[i].ends[c] == 1;
            }
        }
        if (!same)
            tap_diag("status %d %s; ref %d tokens", got[2].fin.status,
                     got[2].fin.err.msg, ref[2].fin.completion_tokens);
        ok(same && got[2].fin.preempted > 0 &&
               got[2].fin.completion_tokens ==
                   g->n * (GROW_CTX - got[2].fin.prompt_tokens),
           "seq growth, %s: preempted %d times, each text is the one it "
           "gives alone, to the context's end (%d tokens)",
           rounds[k].what, got[2].fin.preempted, got[2].fin.completion_tokens);
        if (g->lp)
            ok(once, "seq growth, %s: each token streamed once (%d, %d)",
               rounds[k].what, got[2].n_lp[0], got[2].n_lp[1]);
        if (g->spec == HP_SCHED_SPEC_ON)
            ok(got[2].fin.draft_tokens > 0,
               "seq growth, %s: it speculated (%d drafted)", rounds[k].what,
               got[2].fin.draft_tokens);
    }
    hp_sched_stats_t st;
    settled(s, &st);
    ok(st.seq_growths >= (uint64_t)nr && st.preemptions >= (uint64_t)nr &&
           st.seqs == 0 && st.seq_bytes == 0,
       "seq growth: %llu growths, %llu preemptions counted, nothing held "
       "after",
       (unsigned long long)st.seq_growths, (unsigned long long)st.preemptions);
    hp_sched_destroy(s);
    hp_sched_destroy(alone_s);

    /* pic (the cache's modes): preempted, its context is prefilled again
     * in full; what its start reported holds, and start comes once */
    {
        static col_t pf[3];
        hp_cache_t cache;
        hp_prefix_cache_params_t pcp;
        hp_prefix_cache_params_default(&pcp, 16u << 20);
        cache.pub = hp_pool_create(16u << 20, &err);
        cache.prefix =
            hp_prefix_cache_create(&llm.model.cfg, &pcp, llm.model.be, &err);
        hp_sched_cfg_t cfg = {.batch = 4,
                              .prefill_chunk = 16,
                              .max_context = GROW_CTX,
                              .cache = &cache,
                              .seam = -1,
                              .max_segment = 32,
                              .seq_step = 8,
                              .seq_budget =
                                  hp_seq_pool_need(&llm.model, 32) + 2 * full};
        int made = hp_sched_create(&s, &llm, &cfg, &err) == HP_OK;
        reset();
        for (int i = 0; made && i < 3; i++) {
            hp_sched_req_t r = {.prompt = i < 2 ? prompts[i] : RAG,
                                .prompt_len = strlen(i < 2 ? prompts[i] : RAG),
                                .separator = "<|pic_sep|>",
                                .mode =
                                    i < 2 ? HP_IPC_MODE_FULL : HP_IPC_MODE_PIC,
                                .seam = -1,
                                .ops = &ops,
                                .ud = &pf[i]};
            memset(&pf[i], 0, sizeof(pf[i]));
            pf[i].id = i;
            pf[i].accept = -1;
            r.gen.max_tokens = 1 << 30;
            r.gen.ignore_eos = 1;
            hp_sched_submit(s, &r, &err);
        }
        int starts = 0;
        for (int i = 0; made && i < 3; i++)
            wait_for(&pf[i], is_done);
        for (int i = 0; i < n_started; i++)
            starts += start_order[i] == 2;
        ok(made && pf[2].fin.status == HP_OK && pf[2].fin.preempted > 0 &&
               pf[2].fin.mode == HP_IPC_MODE_PIC && pf[2].fin.segs_total == 3 &&
               starts == 1 &&
               pf[2].fin.completion_tokens ==
                   GROW_CTX - pf[2].fin.prompt_tokens &&
               (int)strlen(pf[2].text) > 0,
           "seq growth, pic: preempted %d times, ends at the context's end "
           "(%d tokens), mode pic, started once (%d)",
           pf[2].fin.preempted, pf[2].fin.completion_tokens, starts);
        if (made)
            hp_sched_destroy(s);
        hp_pool_destroy(cache.pub);
        hp_prefix_cache_destroy(cache.prefix);
    }

    /* a pool whose room holds a first extent but not the whole context:
     * alone, the request cannot grow and ends with an error */
    static col_t big;
    hp_prompt_t p;
    hp_prompt_build(&p, &llm, prompts[0], strlen(prompts[0]), "", &err);
    int first = p.n + 8 + HP_SCHED_MAX_DRAFT + 1;
    hp_prompt_free(&p);
    s = make_grow(hp_seq_pool_need(&llm.model, first + 12), 0);
    submit_grow(s, &big, prompts[0], &fill, 1);
    wait_for(&big, is_done);
    ok(big.fin.status == HP_ETOOLARGE &&
           strstr(big.fin.err.msg, "seq_budget") &&
           big.fin.completion_tokens > 8 && big.len > 0,
       "seq growth: a request the pool cannot hold alone ends with an error "
       "after %d tokens (%s)",
       big.fin.completion_tokens, big.fin.err.msg);
    settled(s, &st);
    ok(st.preemptions > 0 && (uint64_t)big.fin.preempted == st.preemptions,
       "seq growth: alone, its extent too large to move within the pool, "
       "it was prefilled again in a fresh one first (%d times)",
       big.fin.preempted);
    hp_sched_destroy(s);
}

int main(void)
{
    hp_error_t err = {0};
    if (hp_llm_load(&llm, MODEL, &err) != HP_OK) {
        tap_skip(err.msg);
        return tap_done();
    }
    test_decoder();
    test_concurrent();
    test_interleave();
    test_backpressure();
    test_cancel();
    test_cancel_gauges();
    test_drain();
    test_limits();
    test_forms();
    test_math();
    test_decoder_logprobs();
    test_choices(HP_IPC_MODE_FULL, 1, "full, solo decode");
    test_choices(HP_IPC_MODE_FULL, 0, "full, batched decode");
    test_choices(HP_IPC_MODE_PIC, 0, "pic, batched decode");
    test_choice_limits();
    test_pool_short();
    test_seq_pool();
    test_seq_budget();
    test_seq_grow();
    hp_llm_free(&llm);
    return tap_done();
}
