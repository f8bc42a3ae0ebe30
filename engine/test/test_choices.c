/*
 * test_choices.c - log-probabilities and n choices: hp_logprobs against a
 * brute-force log-softmax in long double (value, top-k order, ties), the
 * decoder's entries (text offsets in characters, a stop string's tokens
 * left out), and the scheduler's n choices: one prefill forked into n,
 * each choice exactly the run of one request with its seed
 * (hp_sampling_choice_seed), in full and pic mode, solo and batched; a
 * seed reproduces them; n past the batch is refused; a cancelled request
 * of n choices ends once and frees everything.
 */
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine/cache/pool.h"
#include "engine/cache/prefix_cache.h"
#include "engine/forward/decoder.h"
#include "engine/serve/sched.h"
#include "t/lib/tap.h"
#include "t/lib/testrand.h"

#define MODEL "models/test/qwen35-dense"

static hp_llm_t llm;

/* ---- hp_logprobs against a brute force ------------------------------- */

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
    long double mx = l[0], sum = 0;
    int *idx = malloc((size_t)V * sizeof(int)), good = 1;
    for (int i = 1; i < V; i++)
        if (l[i] > mx)
            mx = l[i];
    for (int i = 0; i < V; i++)
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
            int tok = (int)(urand() * V);
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
    ok(good, "log-softmax in float against long double: token and top-k "
             "ids exact, values within 1e-6 of 1 + |logprob| (worst %.2g)",
       worst);
    ok(sorted && mass, "alternatives by falling logprob, probabilities sum "
                       "to at most 1, logprobs <= 0");
    hp_logprobs(&out, l, V, 0, 3);
    ok(out.top_id[0] == 40 && out.top_id[1] == 700 && out.top_id[2] == 2999,
       "equal logits: lower id first (%d %d %d)", out.top_id[0],
       out.top_id[1], out.top_id[2]);
    hp_logprobs(&out, l, 8, 2, 20);
    ok(out.n_top == 8 && brute_ok(&out, l, 8, 2, 20, &worst),
       "more alternatives asked than tokens: every token, in order");
    free(l);
    ok(hp_sampling_choice_seed(77, 0) == 77 &&
           hp_sampling_choice_seed(77, 1) != hp_sampling_choice_seed(77, 2),
       "choice 0 keeps the request's seed, the others differ");
}

/* ---- the decoder's entries ------------------------------------------- */

static float *forced(int V, int tok)
{
    static float *l;
    if (!l)
        l = calloc((size_t)V, sizeof(float));
    memset(l, 0, (size_t)V * sizeof(float));
    l[tok] = 30.0f;
    return l;
}

static void test_decoder(void)
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

/* ---- n choices through the scheduler ---------------------------------- */

#define MAXC    4
#define MAX_TOK 24

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv = PTHREAD_COND_INITIALIZER;

typedef struct {
    char text[MAXC][4096];
    float lp[MAXC][64][4]; /* the token's, then 3 alternatives' */
    int n_lp[MAXC];
    int ends[MAXC], end_tokens[MAXC], texts_after_end;
    int done, cancel, dones;
    hp_sched_final_t fin;
} col_t;

static size_t on_text(void *ud, int choice, const char *t, size_t len)
{
    col_t *c = ud;
    pthread_mutex_lock(&mu);
    strncat(c->text[choice], t, len);
    c->texts_after_end += c->ends[choice];
    pthread_mutex_unlock(&mu);
    return len;
}

static int on_token(void *ud, const hp_sched_token_t *t)
{
    col_t *c = ud;
    pthread_mutex_lock(&mu);
    int k = c->n_lp[t->choice]++;
    if (k < 64) {
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
    pthread_cond_broadcast(&cv);
    pthread_mutex_unlock(&mu);
}

static const hp_sched_ops_t ops = {.text = on_text,
                                   .cancelled = on_cancelled,
                                   .done = on_done,
                                   .token = on_token,
                                   .end = on_end};

/* bounded: a failure, never a measurement */
static int wait_done(col_t *c)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec += 60;
    pthread_mutex_lock(&mu);
    while (!c->done && pthread_cond_timedwait(&cv, &mu, &ts) == 0)
        ;
    int r = c->done;
    pthread_mutex_unlock(&mu);
    return r;
}

static const char *RAG = "You answer.<|pic_sep|>The cat sat on the mat; the "
                         "mat was red.<|pic_sep|>Where did the cat sit? the "
                         "cat sat on";

static int submit(hp_sched_t *s, col_t *c, int mode, int n, uint64_t seed)
{
    hp_error_t err = {0};
    hp_sched_req_t r = {.prompt = RAG,
                        .prompt_len = strlen(RAG),
                        .separator = "<|pic_sep|>",
                        .mode = mode,
                        .seam = -1,
                        .n = n,
                        .ops = &ops,
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

static hp_sched_t *make(int batch, int solo, hp_cache_t *cache)
{
    hp_sched_t *s;
    hp_error_t err = {0};
    hp_prefix_cache_params_t pcp;
    hp_prefix_cache_params_default(&pcp, 64u << 20);
    cache->pub = hp_pool_create(64u << 20, &err);
    cache->prefix = hp_prefix_cache_create(&llm.model.cfg, &pcp, 1, &err);
    hp_sched_cfg_t cfg = {.batch = batch,
                          .prefill_chunk = 16,
                          .max_queue = 64,
                          .cache = cache,
                          .seam = -1,
                          .solo_decode = solo};
    if (!cache->pub || !cache->prefix ||
        hp_sched_create(&s, &llm, &cfg, &err) != HP_OK) {
        tap_diag("%s", err.msg);
        exit(1);
    }
    return s;
}

static void unmake(hp_sched_t *s, hp_cache_t *cache)
{
    hp_sched_destroy(s);
    hp_pool_destroy(cache->pub);
    hp_prefix_cache_destroy(cache->prefix);
}

/* Choice i of `many` against the one choice of alone[i]: same text, same
 * log-probabilities (within tol; 0: bit for bit). */
static int same_choices(const col_t *many, col_t *const *alone, int n,
                        float tol)
{
    int same = 1;
    for (int i = 0; i < n; i++) {
        same &= !strcmp(many->text[i], alone[i]->text[0]) &&
                many->n_lp[i] == alone[i]->n_lp[0] &&
                many->n_lp[i] == MAX_TOK;
        for (int k = 0; k < many->n_lp[i] && k < 64 && same; k++)
            for (int j = 0; j < 4; j++)
                same &= fabsf(many->lp[i][k][j] - alone[i]->lp[0][k][j]) <=
                        tol;
        if (!same) {
            tap_diag("choice %d: \"%s\" (%d entries), alone \"%s\" (%d)", i,
                     many->text[i], many->n_lp[i], alone[i]->text[0],
                     alone[i]->n_lp[0]);
            return 0;
        }
    }
    return same;
}

static void test_fork(int mode, int solo, const char *what)
{
    static col_t many, again, one[3];
    col_t *alone[3] = {&one[0], &one[1], &one[2]};
    hp_cache_t cache;
    hp_sched_t *s = make(4, solo, &cache);

    memset(&many, 0, sizeof(many));
    memset(&again, 0, sizeof(again));
    memset(one, 0, sizeof(one));
    /* the separate runs first (pic: their segments are then cached for
     * the request of 3 as for the others), then 3 choices at once */
    for (int i = 0; i < 3; i++) {
        submit(s, &one[i], mode, 1, hp_sampling_choice_seed(1234, i));
        wait_done(&one[i]);
    }
    submit(s, &many, mode, 3, 1234);
    wait_done(&many);
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
    ok(strcmp(many.text[0], many.text[1]) || strcmp(many.text[1], many.text[2]),
       "%s: the choices differ", what);
    /* all at once: the request of 3 and another beside it */
    submit(s, &again, mode, 3, 1234);
    wait_done(&again);
    int rep = 1;
    for (int i = 0; i < 3; i++)
        rep &= !strcmp(again.text[i], many.text[i]);
    ok(rep, "%s: the same seed gives the same choices", what);
    unmake(s, &cache);
}

static void test_limits(void)
{
    static col_t c;
    hp_cache_t cache;
    hp_error_t err = {0};
    hp_sched_t *s = make(2, 0, &cache);
    hp_sched_req_t r = {.prompt = "hello",
                        .prompt_len = 5,
                        .mode = HP_IPC_MODE_FULL,
                        .seam = -1,
                        .n = 3,
                        .ops = &ops,
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
        int going = c.n_lp[1] + (int)strlen(c.text[1]) > 0;
        if (going)
            c.cancel = 1;
        pthread_mutex_unlock(&mu);
        if (going)
            break;
        struct timespec ts = {0, 5000000};
        nanosleep(&ts, NULL);
    }
    hp_sched_kick(s);
    wait_done(&c);
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
    unmake(s, &cache);
}

int main(void)
{
    hp_error_t err = {0};
    test_math();
    if (hp_llm_load(&llm, MODEL, &err) != HP_OK) {
        tap_skip(err.msg);
        return tap_done();
    }
    test_decoder();
    test_fork(HP_IPC_MODE_FULL, 1, "full, solo decode");
    test_fork(HP_IPC_MODE_FULL, 0, "full, batched decode");
    test_fork(HP_IPC_MODE_PIC, 0, "pic, batched decode");
    test_limits();
    hp_llm_free(&llm);
    return tap_done();
}
