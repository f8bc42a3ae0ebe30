/*
 * rag_trace.c - a synthetic RAG trace through the engine's scheduler
 * (issue 6, bench 8b): TTFT and tokens/s against offered load for `full`,
 * `prefix` and `pic` (HYPIC §6: reuse turns a saturated server into an
 * idle one).
 *
 *   build/bench/rag_trace --model DIR [--docs 128] [--doc-tokens 200,1000]
 *       [--k 4] [--zipf 1.0] [--lead 64] [--question 24]
 *       [--loads 0.5,1,2] [--duration 40] [--requests N]
 *       [--modes full,prefix,pic] [--burst 1,2,0] [--max-tokens 16]
 *       [--seed 1] [--threads 0] [--batch 8] [--slots 32]
 *       [--prefill-chunk 256] [--public-pool 2048] [--private-pool 1024]
 *       [--prefill-workers 0] [--prefill-threads 1] [--decode auto]
 *       [--seam 8] [--prewarm 0] [--drain 30] [--csv FILE]
 *
 * Documents are random words of syllables (tools/rag_data.py's alphabet),
 * each grown until the model's tokenizer makes it at least its target
 * length (uniform in --doc-tokens). A request is the system prompt (the
 * lead, shared) + k distinct documents drawn by Zipf(s) popularity, in
 * the order drawn + a question of its own, joined by the separator, as
 * nginx sends them; greedy, --max-tokens tokens (EOS ignored).
 *
 * Arrivals are a two-state Markov-modulated Poisson process: on and off
 * periods of exponential length (means ON and OFF s), the on rate R times
 * the off rate (R = 0: silent off periods), scaled so the mean rate is
 * the offered load. The trace (arrival times, documents, questions) is a
 * function of --seed alone; request i has the same content at every load.
 *
 * Each (mode, load) runs on a fresh scheduler (engine/serve/sched.h, the path
 * `hypic-engine serve` drives) with empty pools made as serve makes them.
 * --prewarm 1: naive and pic first ingest the whole corpus (one warm-up
 * request per document, untimed, reported below the table) and keep it
 * across loads, as a RAG service caches documents when it indexes them;
 * prefix has nothing to ingest (its entries are whole prefixes). A request is
 * submitted at its arrival time from this thread (which tokenizes it, as
 * serve's IPC thread does); a full queue (--slots) refuses it (nginx: 429).
 * TTFT is arrival to first token; requests still held --drain s after the last
 * arrival are cancelled and count as "unfinished" (a TTFT percentile that lands
 * on one of them is a lower bound, printed with '>'). tok/s is generated tokens
 * over the run's span (start to the last completion). The hit ratio is the
 * prompt tokens a cache supplied over all prompt tokens of the completed
 * requests.
 */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench/bench_util.h"
#include "engine/cache/assemble.h"
#include "engine/forward/sampler.h"
#include "engine/model/llm.h"
#include "engine/serve/sched.h"

#define MAX_LOADS 16

static int64_t mono_us(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000000 + t.tv_nsec / 1000;
}

static void sleep_until(int64_t us)
{
    struct timespec t = {us / 1000000, (long)(us % 1000000) * 1000};
    while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &t, NULL))
        ;
}

/* ---- text ------------------------------------------------------------ */

typedef struct {
    char *s;
    size_t n, cap;
} str_t;

static void put(str_t *b, const char *s, size_t n)
{
    if (b->n + n + 1 > b->cap) {
        b->cap = (b->n + n + 1) * 2;
        b->s = realloc(b->s, b->cap);
        if (!b->s) {
            fprintf(stderr, "out of memory\n");
            exit(1);
        }
    }
    memcpy(b->s + b->n, s, n);
    b->n += n;
    b->s[b->n] = '\0';
}

static void puts_(str_t *b, const char *s)
{
    put(b, s, strlen(s));
}

static int uni(hp_rng_t *r, int lo, int hi)
{
    return lo + (int)(hp_rng_uniform(r) * (hi - lo + 1));
}

static const char *const syllables[] = {
    "ba",  "bel", "cor", "da",  "dor", "el",  "fen", "gar", "hal", "is",
    "ka",  "kel", "lan", "lor", "ma",  "mir", "nor", "ol",  "pa",  "quel",
    "ra",  "ren", "sa",  "sil", "tal", "tor", "ul",  "va",  "ven", "wyn",
    "xa",  "yor", "za",  "zor", "an",  "ek",  "im",  "ost", "ur",  "bri",
    "cla", "dre", "fro", "gla", "pra", "tre", "vo",  "lu",  "mon", "tas"};

/* A sentence's worth of made-up words. */
static void words(str_t *b, hp_rng_t *r, int n)
{
    int ns = (int)(sizeof(syllables) / sizeof(*syllables));
    for (int i = 0; i < n; i++) {
        puts_(b, " ");
        for (int k = uni(r, 1, 3); k > 0; k--)
            puts_(b, syllables[uni(r, 0, ns - 1)]);
    }
    puts_(b, ".");
}

static int n_tokens(const hp_llm_t *llm, const str_t *b)
{
    int *ids = NULL, n = 0;
    hp_error_t err = {0};
    if (hp_llm_tokenize(llm, b->s, b->n, &ids, &n, &err) != HP_OK) {
        fprintf(stderr, "tokenizer: %s\n", err.msg);
        exit(1);
    }
    free(ids);
    return n;
}

/* head + sentences until the tokenizer makes it >= target tokens; returns
 * the token count (segments are tokenized on their own, so this is the
 * count inside every prompt too). */
static int grow(const hp_llm_t *llm, hp_rng_t *r, str_t *b, const char *head,
                int target)
{
    int n;
    b->n = 0;
    puts_(b, head);
    while ((n = n_tokens(llm, b)) < target)
        words(b, r, (target - n) / 4 + 1);
    return n;
}

/* ---- the trace --------------------------------------------------------- */

typedef struct {
    int n_docs, k, lead_tokens, q_tokens, seed;
    int tok_lo, tok_hi;
    double zipf_s;
    str_t lead, *doc;
    int lead_n, *doc_n;
    double *cdf; /* Zipf popularity, cumulative, doc 0 the most popular */
} corpus_t;

static void corpus_build(corpus_t *c, const hp_llm_t *llm)
{
    hp_rng_t r;
    char head[64];
    hp_rng_seed(&r, (uint64_t)c->seed * 0x9e3779b97f4a7c15ull + 1);
    c->doc = calloc((size_t)c->n_docs, sizeof(*c->doc));
    c->doc_n = calloc((size_t)c->n_docs, sizeof(int));
    c->cdf = calloc((size_t)c->n_docs, sizeof(double));
    c->lead_n = grow(llm, &r, &c->lead,
                     "You are a helpful assistant. Answer the question "
                     "with the documents.",
                     c->lead_tokens);
    double acc = 0;
    for (int d = 0; d < c->n_docs; d++) {
        snprintf(head, sizeof(head), "Document %d.", d + 1);
        c->doc_n[d] =
            grow(llm, &r, &c->doc[d], head, uni(&r, c->tok_lo, c->tok_hi));
        c->cdf[d] = acc += pow(d + 1, -c->zipf_s);
    }
    for (int d = 0; d < c->n_docs; d++)
        c->cdf[d] /= acc;
}

static int popular(const corpus_t *c, hp_rng_t *r)
{
    return bench_cdf_pick(c->cdf, c->n_docs, hp_rng_uniform(r));
}

/* Request i's prompt: a function of (seed, i) alone. */
static void request_prompt(const corpus_t *c, const hp_llm_t *llm, long i,
                           str_t *out)
{
    hp_rng_t r;
    int pick[64];
    str_t q = {0};
    hp_rng_seed(&r, (uint64_t)c->seed * 0x9e3779b97f4a7c15ull ^
                        ((uint64_t)i + 2) * 0xbf58476d1ce4e5b9ull);
    for (int j = 0; j < c->k; j++) {
        int d, dup;
        do { /* k distinct documents (k <= n_docs / 2) */
            d = popular(c, &r);
            dup = 0;
            for (int m = 0; m < j; m++)
                dup |= pick[m] == d;
        } while (dup);
        pick[j] = d;
    }
    grow(llm, &r, &q, "Question:", c->q_tokens);
    out->n = 0;
    put(out, c->lead.s, c->lead.n);
    for (int j = 0; j < c->k; j++) {
        puts_(out, HP_SEG_DEFAULT_SEPARATOR);
        put(out, c->doc[pick[j]].s, c->doc[pick[j]].n);
    }
    puts_(out, HP_SEG_DEFAULT_SEPARATOR);
    put(out, q.s, q.n);
    puts_(out, "\nAnswer:");
    free(q.s);
}

typedef struct {
    double on_s, off_s, ratio; /* mean periods; on rate / off rate */
} burst_t;

static double expo(hp_rng_t *r, double mean)
{
    return -mean * log(1.0 - hp_rng_uniform(r));
}

/* Arrival times (s) of the MMPP at mean rate `rate` in [0, duration), at
 * most max_n of them; returns the count. */
static int arrivals(double rate, const burst_t *b, double duration, int max_n,
                    uint64_t seed, double *at)
{
    hp_rng_t r;
    double cycle = b->on_s + b->off_s;
    double off = rate * cycle / (b->ratio * b->on_s + b->off_s);
    double on = b->ratio > 0 ? b->ratio * off : rate * cycle / b->on_s;
    int n = 0, is_on;
    hp_rng_seed(&r, seed);
    if (b->ratio == 0)
        off = 0;
    is_on = hp_rng_uniform(&r) < b->on_s / cycle; /* stationary start */
    double t = 0, end = expo(&r, is_on ? b->on_s : b->off_s);
    while (n < max_n && t < duration) {
        double lam = is_on ? on : off;
        double next = lam > 0 ? t + expo(&r, 1.0 / lam) : INFINITY;
        if (next < end) {
            t = next;
            if (t < duration)
                at[n++] = t;
        } else { /* memoryless: the state changes, draw afresh */
            t = end;
            is_on = !is_on;
            end = t + expo(&r, is_on ? b->on_s : b->off_s);
        }
    }
    return n;
}

/* ---- one run ----------------------------------------------------------- */

enum { R_IDLE, R_REFUSED, R_FAILED, R_HELD, R_DONE };

typedef struct run run_t;

typedef struct {
    run_t *run;
    int64_t arrive_us, submit_us, first_us, done_us;
    int state, status, finish;
    int prompt, cached, completion;
} rec_t;

struct run {
    pthread_mutex_t mu;
    pthread_cond_t cv; /* on CLOCK_MONOTONIC */
    int held;
};

static void on_done(void *ud, const hp_sched_final_t *f)
{
    rec_t *q = ud;
    int64_t t = mono_us();
    q->done_us = t;
    q->submit_us = t - f->total_us; /* the final record is relative */
    q->first_us = f->ttft_us >= 0 ? q->submit_us + f->ttft_us : -1;
    q->status = f->status;
    q->finish = f->finish;
    q->prompt = f->prompt_tokens;
    q->cached = f->cached_tokens;
    q->completion = f->completion_tokens;
    pthread_mutex_lock(&q->run->mu);
    q->state = R_DONE;
    q->run->held--;
    pthread_cond_signal(&q->run->cv);
    pthread_mutex_unlock(&q->run->mu);
}

static const hp_sched_ops_t rec_ops = {.text = bench_drop_text,
                                       .done = on_done};

typedef struct {
    hp_sched_cfg_t sched;
    int mode, max_tokens;
    double drain_s;
} setup_t;

/* Submits prompts[i] at t0 + at[i] (t0: now), waits for them (at most
 * drain s after the last arrival; drain < 0: for all), then stops the
 * scheduler. */
static void run_trace(const hp_llm_t *llm, const setup_t *su, str_t *prompts,
                      const double *at, int n, rec_t *rec, int64_t *t0_out)
{
    run_t run = {.held = 0};
    pthread_condattr_t ca;
    hp_sched_t *s;
    hp_error_t err = {0};
    pthread_mutex_init(&run.mu, NULL);
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&run.cv, &ca);
    if (hp_sched_create(&s, llm, &su->sched, &err) != HP_OK) {
        fprintf(stderr, "scheduler: %s\n", err.msg);
        exit(1);
    }
    int64_t t0 = mono_us() + 10000;
    for (int i = 0; i < n; i++) {
        hp_sched_req_t req = {
            .prompt = prompts[i].s,
            .prompt_len = prompts[i].n,
            .separator = HP_SEG_DEFAULT_SEPARATOR,
            .mode = su->mode,
            .seam = -1,
            .gen = {.max_tokens = su->max_tokens, .ignore_eos = 1},
            .ops = &rec_ops,
            .ud = &rec[i],
        };
        memset(&rec[i], 0, sizeof(rec[i]));
        rec[i].run = &run;
        rec[i].arrive_us = t0 + (int64_t)(at[i] * 1e6);
        rec[i].first_us = -1;
        sleep_until(rec[i].arrive_us);
        pthread_mutex_lock(&run.mu);
        rec[i].state = R_HELD;
        run.held++;
        pthread_mutex_unlock(&run.mu);
        int rc = hp_sched_submit(s, &req, &err);
        if (rc != HP_OK) {
            pthread_mutex_lock(&run.mu);
            rec[i].state = rc == HP_EBUSY ? R_REFUSED : R_FAILED;
            run.held--;
            pthread_mutex_unlock(&run.mu);
            if (rc != HP_EBUSY)
                fprintf(stderr, "request %d: %s\n", i, err.msg);
        }
    }
    int64_t end =
        (n ? rec[n - 1].arrive_us : t0) + (int64_t)(su->drain_s * 1e6);
    struct timespec ts = {end / 1000000, (long)(end % 1000000) * 1000};
    pthread_mutex_lock(&run.mu);
    while (run.held > 0 && (su->drain_s < 0 || mono_us() < end))
        if (su->drain_s < 0)
            pthread_cond_wait(&run.cv, &run.mu);
        else
            pthread_cond_timedwait(&run.cv, &run.mu, &ts);
    pthread_mutex_unlock(&run.mu);
    hp_sched_destroy(s); /* the rest: done(CANCEL) */
    pthread_cond_destroy(&run.cv);
    pthread_condattr_destroy(&ca);
    pthread_mutex_destroy(&run.mu);
    *t0_out = t0;
}

/* ---- report ------------------------------------------------------------ */

typedef struct {
    double v;
    int censored; /* a lower bound: cancelled before its first token */
} obs_t;

static int by_v(const void *a, const void *b)
{
    double x = ((const obs_t *)a)->v, y = ((const obs_t *)b)->v;
    return (x > y) - (x < y);
}

/* Nearest-rank percentile of sorted o[n] as text ("-" if none): a lower
 * bound ('>') if a censored value sorts at or below it, since its true
 * value may lie above. */
static const char *pct(char *buf, size_t sz, const obs_t *o, int n, double p)
{
    int i = (int)ceil(p / 100.0 * n) - 1, below = 0;
    if (n == 0)
        return "-";
    i = i < 0 ? 0 : i >= n ? n - 1 : i;
    for (int j = 0; j <= i; j++)
        below |= o[j].censored;
    snprintf(buf, sz, "%s%.0f", below ? ">" : "", o[i].v);
    return buf;
}

static const char *outcome(const rec_t *q)
{
    if (q->state == R_REFUSED)
        return "refused";
    if (q->state != R_DONE || q->status != HP_OK)
        return "error";
    return q->finish == HP_FINISH_CANCEL ? "unfinished" : "ok";
}

static void report(const char *mode, double load, const rec_t *rec, int n,
                   int64_t t0, FILE *csv)
{
    obs_t *ttft = calloc((size_t)n + 1, sizeof(obs_t));
    obs_t *e2e = calloc((size_t)n + 1, sizeof(obs_t));
    int nt = 0, ne = 0, done = 0, refused = 0, failed = 0, unfinished = 0;
    long gen = 0, prompt = 0, cached = 0;
    double sum = 0;
    int any_censored = 0;
    int64_t last = t0;
    char b1[32], b2[32], b3[32];

    for (int i = 0; i < n; i++) {
        const rec_t *q = &rec[i];
        const char *what = outcome(q);
        int held = q->state == R_DONE;
        if (csv)
            fprintf(csv, "%s,%g,%d,%.6f,%.3f,%.3f,%d,%d,%d,%s\n", mode, load, i,
                    (q->arrive_us - t0) / 1e6,
                    q->first_us >= 0 ? (q->first_us - q->arrive_us) / 1e3
                                     : -1.0,
                    held ? (q->done_us - q->arrive_us) / 1e3 : -1.0, q->prompt,
                    q->cached, q->completion, what);
        if (held) {
            gen += q->completion;
            last = q->done_us > last ? q->done_us : last;
        }
        if (!strcmp(what, "refused") || !strcmp(what, "error")) {
            refused += what[0] == 'r';
            failed += what[0] == 'e';
            continue;
        }
        obs_t o = {(q->first_us >= 0 ? q->first_us : q->done_us) / 1e3 -
                       q->arrive_us / 1e3,
                   q->first_us < 0};
        ttft[nt++] = o;
        sum += o.v;
        any_censored |= o.censored;
        if (!strcmp(what, "ok")) {
            done++;
            prompt += q->prompt;
            cached += q->cached;
            e2e[ne++] = (obs_t){(q->done_us - q->arrive_us) / 1e3, 0};
        } else {
            unfinished++;
        }
    }
    qsort(ttft, (size_t)nt, sizeof(obs_t), by_v);
    qsort(e2e, (size_t)ne, sizeof(obs_t), by_v);
    double span = (last - t0) / 1e6;
    printf("| %s | %.2f | %d | %d | %d | %d | %s | %s | %s%.0f | %s | %.1f | "
           "%.1f |\n",
           mode, load, n, done, refused, unfinished,
           pct(b1, sizeof(b1), ttft, nt, 50), pct(b2, sizeof(b2), ttft, nt, 99),
           any_censored ? ">" : "", nt ? sum / nt : 0.0,
           pct(b3, sizeof(b3), e2e, ne, 50), span > 0 ? gen / span : 0.0,
           prompt ? 100.0 * cached / prompt : 0.0);
    if (failed)
        printf("# %s at %.2f req/s: %d requests failed (see stderr)\n", mode,
               load, failed);
    fflush(stdout);
    free(ttft);
    free(e2e);
}

/* naive/pic: every document cached ahead of the traffic, by warm-up
 * requests (DESIGN §3: "SEP doc SEP", max_tokens 0), as a RAG service
 * ingests its corpus; untimed for the table, reported on its own. */
static double prewarm_corpus(const hp_llm_t *llm, const setup_t *su,
                             const corpus_t *c, str_t *prompts, rec_t *rec)
{
    setup_t w = *su;
    int64_t t0, t = mono_us();
    double *zero = calloc((size_t)c->n_docs, sizeof(double));
    w.max_tokens = 0;
    w.drain_s = -1; /* every document, however long it takes */
    for (int d = 0; d < c->n_docs; d++) {
        prompts[d].n = 0;
        puts_(&prompts[d], HP_SEG_DEFAULT_SEPARATOR);
        put(&prompts[d], c->doc[d].s, c->doc[d].n);
        puts_(&prompts[d], HP_SEG_DEFAULT_SEPARATOR);
    }
    /* in waves the queue holds */
    for (int d = 0; d < c->n_docs; d += w.sched.max_queue) {
        int n = c->n_docs - d < w.sched.max_queue ? c->n_docs - d
                                                  : w.sched.max_queue;
        run_trace(llm, &w, prompts + d, zero, n, rec + d, &t0);
    }
    for (int d = 0; d < c->n_docs; d++)
        if (strcmp(outcome(&rec[d]), "ok")) {
            fprintf(stderr, "ingesting document %d failed\n", d);
            exit(1);
        }
    free(zero);
    return (mono_us() - t) / 1e6;
}

/* ---- main -------------------------------------------------------------- */

static int parse_list(const char *s, double *out, int max)
{
    int n = 0;
    while (*s && n < max) {
        char *end;
        out[n++] = strtod(s, &end);
        if (end == s)
            return -1;
        s = end + (*end == ',');
    }
    return n;
}

/* The decode form by serve's names (its --decode), or -1. */
static int decode_form(const char *d)
{
    return !strcmp(d, "auto")        ? HP_SCHED_DECODE_AUTO
           : !strcmp(d, "recurrent") ? HP_SCHED_DECODE_RECURRENT
           : !strcmp(d, "chunkwise") ? HP_SCHED_DECODE_CHUNKWISE
                                     : -1;
}

/* "full,prefix,pic" to modes[]; the count, or -1 naming a bad one. */
static int parse_modes(const char *list, int *modes, int max)
{
    char buf[256];
    int n = 0;
    snprintf(buf, sizeof(buf), "%s", list);
    for (char *sv, *t = strtok_r(buf, ",", &sv); t && n < max;
         t = strtok_r(NULL, ",", &sv))
        if ((modes[n++] = hp_mode_parse(t)) < 0) {
            fprintf(stderr, "unknown mode %s\n", t);
            return -1;
        }
    return n;
}

static void usage(void)
{
    fprintf(
        stderr,
        "usage: rag_trace --model DIR [--docs D] [--doc-tokens MIN,MAX] "
        "[--k K]\n  [--zipf S] [--lead N] [--question N] [--loads "
        "L1,L2,..] [--duration S]\n  [--requests N] [--modes "
        "full,prefix,pic] [--burst ON,OFF,RATIO]\n  [--max-tokens N] "
        "[--seed S] [--threads T] [--batch B] [--slots Q]\n  "
        "[--prefill-chunk N] [--public-pool MiB] [--private-pool MiB]\n  "
        "[--prefill-workers W] [--prefill-threads T] [--decode "
        "auto|recurrent|chunkwise]\n  [--seam W] [--prewarm 0|1] [--drain S] "
        "[--csv FILE]\n");
}

/* A flag and where its value goes: 'i' int, 'l' long, 'd' double,
 * 's' string (lists are parsed afterwards). */
typedef struct {
    const char *name;
    char type;
    void *p;
} opt_t;

static int parse_opts(int argc, char **argv, const opt_t *o, int n)
{
    for (int i = 1; i < argc; i += 2) {
        int k = 0;
        while (k < n && strcmp(argv[i], o[k].name))
            k++;
        if (k == n || i + 1 >= argc) {
            fprintf(stderr, "%s '%s'\n",
                    k == n ? "unknown option" : "missing value for", argv[i]);
            return -1;
        }
        const char *v = argv[i + 1];
        if (o[k].type == 'i')
            *(int *)o[k].p = atoi(v);
        else if (o[k].type == 'l')
            *(long *)o[k].p = atol(v);
        else if (o[k].type == 'd')
            *(double *)o[k].p = atof(v);
        else
            *(const char **)o[k].p = v;
    }
    return 0;
}

int main(int argc, char **argv)
{
    const char *model = NULL, *modes = "full,prefix,pic", *csv_path = NULL;
    const char *decode = "auto", *doc_tokens = "200,1000";
    const char *load_list = "0.5,1,2", *burst_spec = "1,2,0";
    corpus_t c = {.n_docs = 128,
                  .k = 4,
                  .lead_tokens = 64,
                  .q_tokens = 24,
                  .seed = 1,
                  .zipf_s = 1.0};
    double loads[MAX_LOADS], duration = 40, drain = 30, dt[2], bl[3];
    int max_req = 0, max_tokens = 16, threads = 0, batch = 8, slots = 32;
    int chunk = 256, pworkers = 0, pthreads = 1, seam = HP_SEAM_DEFAULT;
    int prewarm = 0;
    long pub_mib = 2048, priv_mib = 1024;
    const opt_t opts[] = {
        {"--model", 's', &model},
        {"--docs", 'i', &c.n_docs},
        {"--doc-tokens", 's', &doc_tokens},
        {"--k", 'i', &c.k},
        {"--zipf", 'd', &c.zipf_s},
        {"--lead", 'i', &c.lead_tokens},
        {"--question", 'i', &c.q_tokens},
        {"--loads", 's', &load_list},
        {"--duration", 'd', &duration},
        {"--requests", 'i', &max_req},
        {"--modes", 's', &modes},
        {"--burst", 's', &burst_spec},
        {"--max-tokens", 'i', &max_tokens},
        {"--seed", 'i', &c.seed},
        {"--threads", 'i', &threads},
        {"--batch", 'i', &batch},
        {"--slots", 'i', &slots},
        {"--prefill-chunk", 'i', &chunk},
        {"--public-pool", 'l', &pub_mib},
        {"--private-pool", 'l', &priv_mib},
        {"--prefill-workers", 'i', &pworkers},
        {"--prefill-threads", 'i', &pthreads},
        {"--decode", 's', &decode},
        {"--seam", 'i', &seam},
        {"--prewarm", 'i', &prewarm},
        {"--drain", 'd', &drain},
        {"--csv", 's', &csv_path},
    };
    if (parse_opts(argc, argv, opts, (int)(sizeof(opts) / sizeof(*opts)))) {
        usage();
        return 2;
    }
    int n_loads = parse_list(load_list, loads, MAX_LOADS);
    if (parse_list(doc_tokens, dt, 2) != 2 ||
        parse_list(burst_spec, bl, 3) != 3)
        n_loads = 0; /* reported as a usage error below */
    c.tok_lo = (int)dt[0];
    c.tok_hi = (int)dt[1];
    burst_t burst = {bl[0], bl[1], bl[2]};
    if (!model || n_loads < 1 || c.n_docs < 1 || c.k < 1 || c.k > 64 ||
        2 * c.k > c.n_docs || c.tok_lo < 1 || c.tok_hi < c.tok_lo ||
        max_tokens < 1 || burst.on_s <= 0 || burst.off_s < 0 ||
        burst.ratio < 0 || duration <= 0 || max_req < 0 || slots < 1 ||
        decode_form(decode) < 0) {
        usage();
        return 2;
    }
    int mode_list[8], n_modes = parse_modes(modes, mode_list, 8);
    double ingest_s[8] = {0};
    if (n_modes < 1)
        return 2;

    hp_llm_t llm;
    hp_error_t err = {0};
    if (hp_llm_load(&llm, model, &err) != HP_OK)
        return bench_fail(&err);
    corpus_build(&c, &llm);
    long doc_sum = 0;
    int longest[64] = {0}, worst = c.lead_n + c.q_tokens + 4;
    for (int d = 0; d < c.n_docs; d++) {
        doc_sum += c.doc_n[d];
        /* the k longest documents bound a prompt's length */
        for (int j = 0, x = c.doc_n[d]; j < c.k; j++)
            if (x > longest[j]) {
                int y = longest[j];
                longest[j] = x;
                x = y;
            }
    }
    for (int j = 0; j < c.k; j++)
        worst += longest[j];
    int ctx = llm.model.cfg.max_positions;
    if (ctx > 0 && worst + max_tokens > ctx) {
        fprintf(stderr,
                "a prompt may reach %d tokens + %d generated: more than "
                "the model's context %d (fewer or shorter documents)\n",
                worst, max_tokens, ctx);
        return 2;
    }

    hp_cache_t cache;
    hp_prefix_cache_params_t pcp;
    hp_prefix_cache_params_default(&pcp, (size_t)priv_mib << 20);
    cache.pub = hp_pool_create((size_t)pub_mib << 20, &err);
    cache.prefix = cache.pub ? hp_prefix_cache_create(&llm.model.cfg, &pcp,
                                                      llm.model.be, &err)
                             : NULL;
    hp_prefill_pool_t *prefill = NULL;
    hp_prefill_pool_cfg_t pfc = {.workers = pworkers,
                                 .threads_per_worker = pthreads};
    if (!cache.prefix ||
        (pworkers > 0 && hp_prefill_pool_create(&prefill, &pfc, &err) != HP_OK))
        return bench_fail(&err);
    setup_t su = {
        .sched =
            {
                .batch = batch,
                .prefill_chunk = chunk,
                .max_queue = slots,
                .threads = threads,
                .cache = &cache,
                .prefill = prefill,
                .decode = decode_form(decode),
                .seam = seam,
            },
        .max_tokens = max_tokens,
        .drain_s = drain,
    };

    /* the trace: arrivals per load; content by request index */
    double *at[MAX_LOADS];
    int n_at[MAX_LOADS], most = c.n_docs;
    for (int l = 0; l < n_loads; l++) {
        double cap_d = loads[l] * duration * 8 + 256;
        size_t cap = (size_t)(max_req && max_req < cap_d ? max_req : cap_d);
        at[l] = malloc(cap * sizeof(double));
        n_at[l] = arrivals(
            loads[l], &burst, duration, (int)cap,
            (uint64_t)c.seed * 1000003u + (uint64_t)(loads[l] * 1000), at[l]);
        most = n_at[l] > most ? n_at[l] : most;
    }
    str_t *prompts = calloc((size_t)most + 1, sizeof(str_t));
    rec_t *rec = calloc((size_t)most + 1, sizeof(rec_t));
    FILE *csv = csv_path ? fopen(csv_path, "w") : NULL;
    if (csv)
        fprintf(csv, "mode,load,request,arrival_s,ttft_ms,e2e_ms,"
                     "prompt_tokens,cached_tokens,completion_tokens,status\n");

    const hp_model_config_t *mc = &llm.model.cfg;
    printf("# rag_trace: model %s (%d layers, hidden %d); %d documents of "
           "%d..%d tokens (mean %.0f), Zipf %.2f, k %d, lead %d, question "
           "~%d tokens; %d tokens generated (greedy)\n",
           model, mc->n_layers, mc->hidden, c.n_docs, c.tok_lo, c.tok_hi,
           (double)doc_sum / c.n_docs, c.zipf_s, c.k, c.lead_n, c.q_tokens,
           max_tokens);
    printf("# arrivals: MMPP, on %.2g s / off %.2g s (means), on rate = %g x "
           "off rate%s; %g s per run%s; drain %g s; seed %d\n",
           burst.on_s, burst.off_s, burst.ratio,
           burst.ratio == 0 ? " (silent off)" : "", duration,
           max_req ? " (or the first --requests)" : "", drain, c.seed);
    printf("# scheduler: batch %d, slots %d, prefill chunk %d, threads %d, "
           "pools %ld+%ld MiB, %d prefill workers x %d, decode %s, seam %d; "
           "%s\n\n",
           batch, slots, chunk, threads, pub_mib, priv_mib, pworkers, pthreads,
           decode, seam,
           prewarm ? "naive/pic ingest the corpus first"
                   : "every run starts with empty pools");
    printf("| mode | load req/s | arrived | done | refused | unfinished | "
           "TTFT p50 ms | TTFT p99 ms | TTFT mean ms | e2e p50 ms | tok/s | "
           "hit %% |\n|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    for (int m = 0; m < n_modes; m++) {
        int ingest = prewarm && (mode_list[m] == HP_IPC_MODE_NAIVE ||
                                 mode_list[m] == HP_IPC_MODE_PIC);
        su.mode = mode_list[m];
        hp_pool_clear(cache.pub);
        if (ingest)
            ingest_s[m] = prewarm_corpus(&llm, &su, &c, prompts, rec);
        for (int l = 0; l < n_loads; l++) {
            int64_t t0;
            /* every load starts as cold as the first: an ingested corpus
             * stays (the budget holds it), nothing else does */
            if (!ingest)
                hp_pool_clear(cache.pub);
            hp_prefix_cache_clear(cache.prefix);
            for (int i = 0; i < n_at[l]; i++)
                request_prompt(&c, &llm, i, &prompts[i]);
            run_trace(&llm, &su, prompts, at[l], n_at[l], rec, &t0);
            report(hp_mode_name((hp_ipc_mode_t)su.mode), loads[l], rec, n_at[l],
                   t0, csv);
        }
    }
    for (int m = 0; m < n_modes; m++)
        if (ingest_s[m] > 0)
            printf("# %s: ingesting the corpus (%d documents, %ld tokens) "
                   "took %.1f s\n",
                   hp_mode_name((hp_ipc_mode_t)mode_list[m]), c.n_docs, doc_sum,
                   ingest_s[m]);
    if (csv)
        fclose(csv);
    for (int i = 0; i <= most; i++)
        free(prompts[i].s);
    for (int l = 0; l < n_loads; l++)
        free(at[l]);
    for (int d = 0; d < c.n_docs; d++)
        free(c.doc[d].s);
    free(c.doc);
    free(c.doc_n);
    free(c.cdf);
    free(c.lead.s);
    free(prompts);
    free(rec);
    hp_prefill_pool_destroy(prefill);
    hp_pool_destroy(cache.pub);
    hp_prefix_cache_destroy(cache.prefix);
    hp_llm_free(&llm);
    return 0;
}
