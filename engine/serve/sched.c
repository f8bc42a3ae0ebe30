/* sched.c - continuous batching (see sched.h; the step-wise decoder is
 * decoder.c). */
#include "engine/serve/sched.h"

#include <errno.h>
#include <limits.h>
#include <omp.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine/cache/prompt.h"
#include "engine/forward/forward.h"
#include "engine/forward/seq.h"

enum { R_QUEUED, R_PREFILL, R_DECODE, R_FINISH };

typedef struct req {
    struct req *next; /* incoming list, then queue */
    hp_sched_ops_t ops;
    void *ud;
    /* choices (n > 1): the first choice is the request (lead); the others
     * are forked from it after the prefill and run beside it */
    struct req *lead; /* itself for the first choice */
    int choice;
    int n_choices; /* lead: asked for */
    int members;   /* lead: choices not yet retired, itself included */
    int holds;     /* batch places held (lead: all until the fork) */
    int ended;     /* the choice's end was taken */
    int others, others_drafted, others_accepted; /* lead: retired choices' */
    int mode;                                    /* the mode that runs */
    int seam;
    int phase;
    hp_assemble_stats_t ast;
    int warm_next;         /* the warm pass's cursor (hp_assemble_warm_next) */
    int fetched_tokens;    /* of ast.cached_tokens: pulled from peers */
    hp_prefill_job_t *job; /* cold segments on the prefill workers */
    hp_prompt_t prompt;
    int prefilled; /* prompt tokens through the model */
    hp_seq_t seq;
    int need_pos;   /* most positions it may reach */
    int want_pos;   /* positions of the extent its next admission takes */
    uint64_t order; /* lead: its first admission's place (victims: last) */
    /* preempted while decoding: the context to prefill again (prompt and
     * the tokens the sequence held), NULL: none */
    int *redo;
    int n_redo;
    int shown;      /* start() was called: never again */
    int preempted;  /* lead: times a choice of it was preempted */
    hp_seq_t *kept; /* [n_choices - 1] the choices' pooled sequences,
                       taken with the lead's at admission */
    float *logits;  /* [vocab] the prompt's last */
    hp_decoder_t dec;
    int ask_decode; /* HP_SCHED_DECODE_* asked for */
    int decode;     /* the form that runs (resolved at admission) */
    int feed;       /* token to run next, -1: sample it from logits first */
    int ids[HP_SCHED_MAX_DRAFT + 1]; /* this step's: feed, then drafts */
    int n_ids;
    int counted; /* tokens already in the stats */
    int status;
    hp_error_t err;
    int cancelled;
    int64_t t_submit, t_admit, t_first;
    /* structured output: the grammar held from the cache, NULL: none */
    hp_gcache_t *gcache;
    const hp_grammar_t *grammar;
} req_t;

struct hp_sched {
    const hp_llm_t *llm;
    hp_sched_cfg_t cfg;
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;      /* work arrived, kicked, stopping */
    pthread_cond_t stop_cv; /* stopping only (throttle sleeps on it) */
    int stopping, kicked;
    int draining;             /* hp_sched_drain: refuse what has not started */
    hp_error_t drain_err;     /* ... with this */
    req_t *in_head, *in_tail; /* submitted, not yet seen by the thread */
    hp_sched_stats_t st;      /* under mu */
    /* the thread's own */
    req_t *q_head, *q_tail;
    req_t **running; /* [batch], in admission order */
    int n_running;
    int held; /* batch places the running requests hold (a choice each) */
    hp_fwd_ws_t ws;
    hp_sampler_t sm;
    float *prob;            /* [V] scratch of sampled draft acceptance */
    hp_fwd_item_t *items;   /* [batch] a decode step's sequences */
    req_t **item_req;       /* [batch] ... and their requests */
    hp_kvbuf_pool_t kvpool; /* KVBuffer decode: blocks for every request */
    hp_seq_pool_t *pool;    /* the requests' sequences (cfg.seq_budget) */
    const req_t *blocked;   /* the queue's head waiting for pool memory:
                               not runnable until a request ends */
    /* the segment builders' sequences, extents of the pool taken at start
     * (the scheduler's own first, then one per prefill worker), each of
     * build_pos positions; room: the pool's bytes requests may take */
    hp_seq_t *build;
    int n_build, build_pos;
    size_t room;
    int dev_locked; /* the thread holds the device (hp_backend_lock) */
    int lost;       /* the device faulted: nothing runs any more */
    int kvb;
    uint64_t passes;                 /* decode passes so far */
    hp_gcache_t *gcache;             /* compiled grammars (thread-safe) */
    int shown_running, shown_queued; /* the gauges the last flush gave */
    uint64_t admits;                 /* first admissions so far */
    uint64_t growths, preemptions;   /* hp_sched_stats_t's */
    atomic_ullong pool_short;        /* counted by submit (callers' threads) */
};

static int64_t now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

static size_t req_bytes(const hp_sched_t *s, const req_t *r)
{
    size_t b = sizeof(*r) + (size_t)r->prompt.n * sizeof(int) +
               (size_t)r->prompt.n_segs * sizeof(hp_prompt_seg_t) +
               r->dec.text.cap;
    if (r->logits)
        b += (size_t)s->llm->model.cfg.vocab_size * sizeof(float);
    if (r->seq.layers)
        b += hp_seq_bytes(&s->llm->model, r->seq.kv_cap);
    return b;
}

static void req_free(req_t *r)
{
    hp_prefill_job_free(r->job); /* before the prompt it points into */
    hp_decoder_free(&r->dec);
    if (r->grammar)
        hp_gcache_put(r->gcache, r->grammar);
    if (r->seq.layers)
        hp_seq_free(&r->seq);
    for (int i = 0; r->kept && i < r->n_choices - 1; i++)
        hp_seq_free(&r->kept[i]); /* no-op on those the choices took */
    free(r->kept);
    free(r->logits);
    free(r->redo);
    hp_prompt_free(&r->prompt);
    free(r);
}

/* Gives up r's prefill job: its workers may be waiting for the device
 * this thread holds, so the thread lets it go meanwhile. */
static void drop_job(hp_sched_t *s, req_t *r)
{
    const hp_backend_t *be = s->llm->model.be;
    if (!r->job)
        return;
    if (s->dev_locked)
        hp_backend_unlock(be);
    hp_prefill_job_free(r->job);
    r->job = NULL;
    if (s->dev_locked)
        hp_backend_lock(be);
}

/* The last callback, then the memory goes. */
static void req_done(hp_sched_t *s, req_t *r)
{
    hp_sched_final_t f;
    int64_t t = now_us();

    memset(&f, 0, sizeof(f));
    f.status = r->status;
    f.finish = r->cancelled ? HP_FINISH_CANCEL : r->dec.finish;
    f.prompt_tokens = r->prompt.n;
    f.completion_tokens = r->dec.n_tokens + r->others;
    f.mode = r->mode;
    f.decode = r->decode;
    f.draft_tokens = r->dec.drafted + r->others_drafted;
    f.accepted_tokens = r->dec.accepted + r->others_accepted;
    f.cached_tokens = r->ast.cached_tokens;
    f.fetched_tokens = r->fetched_tokens;
    f.segs_hit = r->ast.hit_segments;
    f.segs_total = r->prompt.n_segs;
    f.preempted = r->preempted;
    f.ttft_us = r->t_first ? r->t_first - r->t_submit : -1;
    f.total_us = t - r->t_submit;
    if (r->status != HP_OK)
        f.err = r->err;
    r->ops.done(r->ud, &f);
    int tokens = r->dec.n_tokens - r->counted;
    drop_job(s, r);
    req_free(r);
    pthread_mutex_lock(&s->mu);
    s->st.live--;
    s->st.served++;
    s->st.tokens += (uint64_t)tokens;
    pthread_mutex_unlock(&s->mu);
}

/* A choice retires, and the request ends with its last choice: the
 * others' tokens and errors go to the lead, which is freed last. */
static void retire(hp_sched_t *s, req_t *r)
{
    req_t *lead = r->lead;
    s->blocked = NULL; /* its memory may let the queue's head in */
    s->held -= r->holds;
    r->holds = 0;
    if (r != lead) {
        if (r->status != HP_OK && lead->status == HP_OK) {
            lead->status = r->status;
            lead->err = r->err;
        }
        lead->cancelled |= r->cancelled;
        lead->others += r->dec.n_tokens;
        lead->others_drafted += r->dec.drafted;
        lead->others_accepted += r->dec.accepted;
        int tokens = r->dec.n_tokens - r->counted;
        req_free(r);
        pthread_mutex_lock(&s->mu);
        s->st.tokens += (uint64_t)tokens;
        pthread_mutex_unlock(&s->mu);
    }
    if (--lead->members == 0)
        req_done(s, lead);
}

static int is_cancelled(req_t *r)
{
    if (!r->cancelled && r->ops.cancelled && r->ops.cancelled(r->ud))
        r->cancelled = 1;
    return r->cancelled;
}

/* Another choice of the request failed: this one ends too. */
static int group_failed(const req_t *r)
{
    return r->lead->status != HP_OK;
}

/* The log-probabilities of r's ready tokens; 1 when none is left over. */
static int deliver_tokens(hp_sched_t *s, req_t *r, int *produced)
{
    const hp_decoder_lp_t *lp;
    int n = r->ops.token ? hp_decoder_logprobs_ready(&r->dec, &lp) : 0, k;
    for (k = 0; k < n; k++) {
        hp_sched_token_t t = {.choice = r->choice, .n_top = lp[k].lp.n_top};
        t.text_offset = hp_decoder_chars(&r->dec, lp[k].off);
        t.tok.logprob = lp[k].lp.logprob;
        t.tok.bytes =
            hp_tokenizer_token_bytes(s->llm->tok, lp[k].lp.token, &t.tok.len);
        for (int j = 0; j < t.n_top; j++) {
            t.top[j].logprob = lp[k].lp.top_lp[j];
            t.top[j].bytes = hp_tokenizer_token_bytes(
                s->llm->tok, lp[k].lp.top_id[j], &t.top[j].len);
        }
        if (!r->ops.token(r->ud, &t))
            break;
    }
    if (k) {
        hp_decoder_logprobs_take(&r->dec, k);
        *produced = 1;
    }
    return k == n;
}

/* Offers the ready tokens and text; 1 when none is left over. */
static int deliver(hp_sched_t *s, req_t *r, int *produced)
{
    const char *text;
    if (!deliver_tokens(s, r, produced))
        return 0;
    size_t len = hp_decoder_ready(&r->dec, &text);
    if (len == 0)
        return 1;
    size_t n = r->ops.text(r->ud, r->choice, text, len);
    if (n > len)
        n = len;
    if (n) {
        hp_decoder_take(&r->dec, n);
        *produced = 1;
    }
    return n == len;
}

/* A finished choice's end, once its text is all out; 1 when taken. */
static int deliver_end(req_t *r, int *produced)
{
    if (!r->ended)
        r->ended = !r->ops.end ||
                   r->ops.end(r->ud, r->choice, r->dec.finish, r->dec.n_tokens);
    if (r->ended && r->ops.end)
        *produced = 1;
    return r->ended;
}

static void fail(req_t *r, const hp_error_t *err)
{
    r->status = err->code ? err->code : HP_EINTERNAL;
    r->err = *err;
    r->phase = R_FINISH;
}

static void started(req_t *r, int *produced)
{
    if (!r->ops.start || r->shown)
        return;
    r->shown = 1;
    hp_sched_start_t st = {
        .prompt_tokens = r->prompt.n,
        .cached_tokens = r->ast.cached_tokens,
        .mode = r->mode,
        .decode = r->decode,
        .segs_hit = r->ast.hit_segments,
        .segs_total = r->prompt.n_segs,
        .queue_us = r->t_admit - r->t_submit,
    };
    r->ops.start(r->ud, &st);
    *produced = 1;
}

/* The decode form a request runs, fixed at its admission: its own or
 * the server's (hp_sched_tune may change that one). Speculation needs the
 * KVBuffer, so recurrent becomes chunkwise then; auto is KV-only for a
 * full-mode prompt within the buffer's KV-only limit. */
static int decode_form(hp_sched_t *s, const req_t *r)
{
    int f = r->ask_decode;
    if (!s->kvb)
        return HP_SCHED_DECODE_RECURRENT;
    if (f == HP_SCHED_DECODE_SERVER) {
        pthread_mutex_lock(&s->mu);
        f = s->cfg.decode;
        pthread_mutex_unlock(&s->mu);
    }
    if (f != HP_SCHED_DECODE_CHUNKWISE && f != HP_SCHED_DECODE_AUTO)
        f = r->dec.spec ? HP_SCHED_DECODE_CHUNKWISE : HP_SCHED_DECODE_RECURRENT;
    /* choices fork from the prefill's state: none in KV-only */
    if (f == HP_SCHED_DECODE_AUTO)
        f = r->mode == HP_IPC_MODE_FULL && r->n_choices == 1 &&
                    r->prompt.n <= s->kvpool.cfg.cap_kvonly
                ? HP_SCHED_DECODE_KVONLY
                : HP_SCHED_DECODE_CHUNKWISE;
    return f;
}

static void admit(hp_sched_t *s, req_t *r, int *produced)
{
    hp_error_t err = {0};
    int V = s->llm->model.cfg.vocab_size;

    int first = !r->lead->order; /* not readmitted after a preemption */
    if (first) {
        r->t_admit = now_us();
        r->order = ++s->admits;
    }
    r->phase = R_PREFILL;
    if ((!r->seq.layers && hp_seq_init(&r->seq, &s->llm->model, &err)) ||
        hp_seq_reserve(&r->seq, (r->redo ? r->n_redo : r->prompt.n) + 1,
                       &err) != HP_OK) {
        fail(r, &err);
        return;
    }
    if (!r->logits && !(r->logits = malloc((size_t)V * sizeof(float)))) {
        hp_error_set(&err, HP_ENOMEM, "no memory for a request's logits");
        fail(r, &err);
        return;
    }
    /* a context prefilled again keeps its form; its buffers open after
     * the prefill (resume) */
    if (r->redo)
        return;
    /* KV-only: the prompt itself goes through the buffers (opened on the
     * empty sequence); failing that, chunkwise after the prefill */
    if (first)
        r->decode = decode_form(s, r);
    if (r->decode == HP_SCHED_DECODE_KVONLY &&
        hp_seq_kvbuf_open(&r->seq, &s->kvpool, &err) != HP_OK)
        r->decode = HP_SCHED_DECODE_CHUNKWISE;
    if (!s->kvb)
        r->dec.spec = 0;
    /* full mode streams from the first chunk on: tell the client now;
     * the other modes know their hits only once assembled */
    if (r->mode == HP_IPC_MODE_FULL)
        started(r, produced);
}

/* Decoding goes on chunkwise if the choice's form says so (buffers that
 * cannot open: recurrent, and no speculation). */
static void open_buffers(hp_sched_t *s, req_t *r)
{
    hp_error_t err;
    /* KV-only's buffers are open from its admission, unless its context
     * was prefilled again (resume): it goes on chunkwise then */
    if ((r->decode == HP_SCHED_DECODE_CHUNKWISE ||
         r->decode == HP_SCHED_DECODE_KVONLY) &&
        r->seq.layers && !r->seq.kvpool &&
        hp_seq_kvbuf_open(&r->seq, &s->kvpool, &err) != HP_OK) {
        r->decode = HP_SCHED_DECODE_RECURRENT;
        r->dec.spec = 0;
    }
}

/* Choice i of lead r: a copy of the prefilled state, logits and decoder
 * settings, its own seed; it runs from now on beside the lead, in one of
 * the batch places the lead held. */
static int fork_choice(hp_sched_t *s, req_t *r, int i, hp_error_t *err)
{
    size_t V = (size_t)s->llm->model.cfg.vocab_size;
    req_t *c = calloc(1, sizeof(*c));
    if (!c)
        return hp_error_set(err, HP_ENOMEM, "scheduler: out of memory");
    c->lead = r;
    c->choice = i;
    c->ops = r->ops;
    c->ud = r->ud;
    c->mode = r->mode;
    c->seam = r->seam;
    c->need_pos = r->need_pos;
    c->ask_decode = r->ask_decode;
    c->decode = r->decode;
    c->prefilled = r->prefilled;
    c->feed = -1;
    c->t_submit = r->t_submit;
    c->t_admit = r->t_admit;
    if (r->grammar) { /* each choice holds the grammar it decodes under */
        c->gcache = r->gcache;
        c->grammar = r->grammar;
        hp_gcache_hold(c->gcache, c->grammar);
    }
    c->logits = malloc(V * sizeof(float));
    int rc = c->logits ? HP_OK
                       : hp_error_set(err, HP_ENOMEM,
                                      "no memory for a choice's logits");
    if (rc == HP_OK && r->kept) { /* the extent taken at admission */
        c->seq = r->kept[i - 1];
        memset(&r->kept[i - 1], 0, sizeof(r->kept[i - 1]));
    } else if (rc == HP_OK) {
        rc = hp_seq_init(&c->seq, &s->llm->model, err);
    }
    if (rc == HP_OK)
        rc = hp_seq_copy(&c->seq, &r->seq, err);
    if (rc == HP_OK)
        rc = hp_decoder_fork(&c->dec, &r->dec,
                             hp_sampling_choice_seed(r->dec.sampling.seed, i),
                             err);
    if (rc != HP_OK) {
        req_free(c);
        return rc;
    }
    memcpy(c->logits, r->logits, V * sizeof(float));
    c->phase = R_DECODE;
    c->holds = 1;
    r->holds--;
    r->members++;
    s->running[s->n_running++] = c;
    open_buffers(s, c);
    return HP_OK;
}

/* The prefill is done: decoding continues from its state, in every
 * choice of the request. */
static void to_decode(hp_sched_t *s, req_t *r)
{
    hp_error_t err = {0};
    r->phase = R_DECODE;
    for (int i = 1; i < r->n_choices && r->lead == r; i++)
        if (fork_choice(s, r, i, &err) != HP_OK) {
            fail(r, &err);
            return;
        }
    open_buffers(s, r);
}

/* A preempted request's context is back in its sequence: decoding goes
 * on where it stopped (its decoder, and its choices, untouched). */
static void resume(hp_sched_t *s, req_t *r)
{
    free(r->redo);
    r->redo = NULL;
    r->n_redo = 0;
    r->prefilled = r->lead->prompt.n;
    r->phase = R_DECODE;
    open_buffers(s, r);
}

/* A prefill worker published a segment (called in its thread): a
 * request may be ready to assemble. */
static void segment_done(void *ud, const hp_prefill_done_t *d)
{
    (void)d;
    hp_sched_kick(ud);
}

static int uses_workers(const hp_sched_t *s, const req_t *r)
{
    return s->cfg.prefill &&
           (r->mode == HP_IPC_MODE_NAIVE || r->mode == HP_IPC_MODE_PIC);
}

/* Waiting for prefill workers: nothing to do in this thread. */
static int waiting(const req_t *r)
{
    return r->job && !hp_prefill_job_done(r->job);
}

/* naive/pic: one missing segment per step (or all of them on the prefill
 * workers), then the assembly; prefix: the resume in one step. */
static void prefill_cached(hp_sched_t *s, req_t *r, int *produced)
{
    hp_error_t err = {0};
    hp_assemble_stats_t warm = {0};
    hp_prefill_stats_t ps;
    int rc;
    if (uses_workers(s, r)) {
        if (!r->job &&
            (rc = hp_prefill_submit(s->cfg.prefill, s->llm, s->cfg.cache,
                                    &r->prompt, (hp_ipc_mode_t)r->mode, r->seam,
                                    segment_done, s, &r->job, &err)) != HP_OK) {
            fail(r, &err);
            return;
        }
        if (waiting(r))
            return;
        /* the job holds its entries until the request ends: nothing it
         * published is evicted before the assembly */
        rc = hp_prefill_job_wait(r->job, &ps, &err);
        /* a segment fetched from a peer was reused, not computed: a hit */
        r->ast.miss_segments = ps.published - ps.fetched;
        r->ast.miss_tokens = (int)(ps.miss_tokens - ps.fetched_tokens);
        r->fetched_tokens = (int)ps.fetched_tokens;
    } else {
        rc = hp_assemble_warm_next(s->llm, s->cfg.cache, &s->ws, &r->prompt,
                                   (hp_ipc_mode_t)r->mode, r->seam,
                                   &r->warm_next, &warm, &err);
        if (rc == 1) {
            r->ast.miss_segments += warm.miss_segments;
            r->ast.miss_tokens += warm.miss_tokens;
            return;
        }
    }
    int misses = r->ast.miss_segments, miss_tokens = r->ast.miss_tokens;
    if (rc == HP_OK && r->dec.max_tokens == 0) {
        /* a warm-up request (DESIGN §3): the segments are cached now;
         * nothing to generate, so no assembly either */
        r->ast.hit_segments = 0;
        r->prefilled = r->prompt.n;
        r->phase = R_DECODE;
        started(r, produced);
        return;
    }
    if (rc == HP_OK)
        rc = hp_assemble(s->llm, s->cfg.cache, &s->ws, &r->prompt,
                         (hp_ipc_mode_t)r->mode, r->seam, &r->seq, r->logits,
                         &r->ast, &err);
    if (rc == HP_OK && r->ast.recomputed_tokens == 0)
        rc = hp_error_set(&err, HP_EBADINPUT,
                          "nothing to generate from: the prompt ends with "
                          "a separator (a warm-up request wants "
                          "max_tokens 0)");
    if (rc != HP_OK) {
        fail(r, &err);
        return;
    }
    /* segments prefilled by this request were misses, not hits, and
     * their tokens were computed, not reused */
    r->ast.hit_segments -= misses;
    r->ast.miss_segments = misses;
    r->ast.cached_tokens -= miss_tokens;
    r->prefilled = r->prompt.n;
    to_decode(s, r);
    started(r, produced);
}

/* One chunk of the prompt, or of a preempted request's context (whose
 * logits are not wanted: its next token is chosen already, or its
 * prompt's logits are still held). */
static void prefill_chunk(hp_sched_t *s, req_t *r)
{
    hp_error_t err = {0};
    const int *ids = r->redo ? r->redo : r->prompt.ids;
    int chunk = s->cfg.prefill_chunk,
        left = (r->redo ? r->n_redo : r->prompt.n) - r->prefilled;
    int n = left < chunk ? left : chunk, last = n == left;
    /* a KV-only prompt goes through the buffers in pieces they take */
    int piece = r->seq.kvpool ? s->kvpool.cfg.max_step : n;
    for (int off = 0; off < n; off += piece) {
        int k = n - off < piece ? n - off : piece;
        int rc = hp_forward(
            &s->llm->model, &r->seq, &s->ws, ids + r->prefilled, NULL, k, NULL,
            last && off + k == n && !r->redo ? HP_LOGITS_LAST : HP_LOGITS_NONE,
            r->logits, &err);
        if (rc != HP_OK) {
            fail(r, &err);
            return;
        }
        r->prefilled += k;
    }
    if (last && r->redo)
        resume(s, r);
    else if (last)
        to_decode(s, r);
}

static void note_first(req_t *r)
{
    if (!r->lead->t_first && r->dec.n_tokens > 0)
        r->lead->t_first = now_us();
}

/* What a decoding request runs this step: the token to feed (the first
 * one sampled from the prompt's logits here) and, speculating, drafts
 * after it. 0: nothing to run (it finished, or failed). */
static int plan(hp_sched_t *s, req_t *r)
{
    hp_error_t err = {0};
    int rc = HP_OK;
    if (r->feed < 0) {
        rc = hp_decoder_next(&r->dec, &s->sm, r->logits, &r->feed, &err);
        note_first(r);
    }
    if (rc != HP_OK) {
        fail(r, &err);
        return 0;
    }
    if (r->dec.done || r->feed < 0) {
        r->phase = R_FINISH;
        return 0;
    }
    r->ids[0] = r->feed;
    r->n_ids = 1;
    if (r->seq.kvpool)
        r->n_ids += hp_decoder_draft(&r->dec, r->ids + 1);
    return 1;
}

/* After the pass: the next token, sampled now (the logits live in the
 * workspace only until the next pass), or the drafts resolved. */
static void resolve(hp_sched_t *s, req_t *r, hp_fwd_item_t *it)
{
    hp_error_t err = {0};
    int rc = HP_OK, keep;
    if (it->status != HP_OK) {
        fail(r, &it->err);
        return;
    }
    if (!it->verify) {
        int best = it->best ? it->best[0] : -1, decided = 0;
        /* a device sent the sampler's candidates only (with what
         * log-probabilities need): they decide, or the row's logits come
         * over after all */
        if (it->cand_p) {
            rc = hp_decoder_next_cands(
                &r->dec, it->cand_p, it->cand_idx, it->cand_raw, it->cand_lse,
                hp_fwd_topk(&s->llm->model), s->sm.V, &r->feed, &err);
            decided = rc <= 0;
            if (rc > 0)
                rc = hp_forward_fetch_logits(&s->llm->model, &s->ws, it, &err);
        }
        if (rc == HP_OK && !decided)
            rc = hp_decoder_next_id(&r->dec, best, &s->sm, it->logits, &r->feed,
                                    &err);
    } else {
        rc = it->best
                 ? hp_decoder_accept_best(&r->dec, it->best, r->ids + 1,
                                          it->T - 1, &keep, &r->feed, &err)
                 : hp_decoder_accept(&r->dec, &s->sm, s->prob, it->logits,
                                     s->llm->model.cfg.vocab_size, r->ids + 1,
                                     it->T - 1, &keep, &r->feed, &err);
        if (rc == HP_OK)
            rc = hp_forward_accept(&s->llm->model, &r->seq, &s->ws, keep, &err);
    }
    note_first(r);
    if (rc != HP_OK)
        fail(r, &err);
    else if (r->dec.done)
        r->phase = R_FINISH;
}

/* The step of every decoding request in rs[n]: one forward pass (or, with
 * solo_decode, one per request, as before batching). */
static void decode_step(hp_sched_t *s, req_t **rs, int n)
{
    int per = s->cfg.solo_decode ? 1 : n;
    for (int i0 = 0; i0 < n; i0 += per) {
        hp_error_t err = {0};
        int k = n - i0 < per ? n - i0 : per;
        for (int i = 0; i < k; i++) {
            req_t *r = rs[i0 + i];
            /* on a device no logits are copied unless a grammar masks
             * them first: greedy, the device picks the token; sampled or
             * with log-probabilities, it sends the candidates (at
             * temperature 1 for greedy) and what log-probabilities need */
            const float temp = r->dec.sampling.temperature;
            const int plain = !r->dec.grammar, lp = r->dec.logprobs;
            s->items[i] =
                (hp_fwd_item_t){.seq = &r->seq,
                                .ids = r->ids,
                                .T = r->n_ids,
                                .verify = r->n_ids > 1,
                                .argmax = temp <= 0.0f && !lp && plain,
                                .topk = (temp > 0.0f || lp) && plain,
                                .logprobs = lp && plain,
                                .inv_t = temp > 0.0f ? 1.0 / temp : 1.0};
        }
        int rc = hp_forward_batch(&s->llm->model, s->items, k, &s->ws, &err);
        s->passes++;
        for (int i = 0; i < k; i++) {
            if (rc != HP_OK)
                fail(rs[i0 + i], &err);
            else
                resolve(s, rs[i0 + i], &s->items[i]);
        }
    }
}

/* Draining: what waits and has not started never will; it ends now
 * with the drain's error instead of at the drain deadline. 1 if any. */
static int refuse_queued(hp_sched_t *s)
{
    hp_error_t err;
    pthread_mutex_lock(&s->mu);
    int draining = s->draining;
    err = s->drain_err;
    pthread_mutex_unlock(&s->mu);
    if (!draining || !s->q_head)
        return 0;
    /* preempted ones were admitted: they run on (unless nothing can) */
    int any = 0;
    req_t **pp = &s->q_head;
    s->q_tail = NULL;
    while (*pp) {
        req_t *r = *pp;
        if (r->lead->order && !s->lost) {
            s->q_tail = r;
            pp = &r->next;
            continue;
        }
        *pp = r->next;
        r->status = err.code;
        r->err = err;
        retire(s, r);
        any = 1;
    }
    return any;
}

/* Batch places a queued request takes: a choice each, or one for a
 * preempted choice (its siblings hold their own). */
static int places(const req_t *r)
{
    return r->redo || r->lead != r ? 1 : r->n_choices;
}

/* Takes r's sequences (every choice's) from the pool: HP_OK (or no
 * pool), HP_EBUSY while the pool has no room for them (nothing taken),
 * or another error. */
static int take_seqs(hp_sched_t *s, req_t *r, hp_error_t *err)
{
    const hp_model_t *m = &s->llm->model;
    int n_kept = places(r) - 1;
    if (!s->pool || r->seq.layers)
        return HP_OK;
    if (n_kept && !(r->kept = calloc((size_t)n_kept, sizeof(*r->kept))))
        return hp_error_set(err, HP_ENOMEM, "scheduler: out of memory");
    int rc = hp_seq_init_in(&r->seq, m, s->pool, r->want_pos, err);
    for (int i = 0; rc == HP_OK && i < n_kept; i++)
        rc = hp_seq_init_in(&r->kept[i], m, s->pool, r->want_pos, err);
    if (rc != HP_OK) {
        if (r->seq.layers)
            hp_seq_free(&r->seq);
        for (int i = 0; i < n_kept; i++)
            hp_seq_free(&r->kept[i]);
        free(r->kept);
        r->kept = NULL;
    }
    return rc;
}

/* ---- memory on demand: growth and preemption -------------------------- */

/* The first extent of a sequence of ctx positions: seq_step positions to
 * grow into and one verification's drafts, within the most it reaches. */
static int first_pos(const hp_sched_t *s, const req_t *r, int ctx)
{
    long p = (long)ctx + s->cfg.seq_step + HP_SCHED_MAX_DRAFT + 1;
    return p < r->need_pos ? (int)p : r->need_pos;
}

/* The running choice to preempt: the last admitted (its request's first
 * admission; of a request, its last choice) of those holding a sequence
 * that will still run. Older requests keep their memory, so a request
 * preempted and readmitted is the next victim again, not its elders. */
static req_t *victim(const hp_sched_t *s)
{
    req_t *v = NULL;
    for (int i = 0; i < s->n_running; i++) {
        req_t *r = s->running[i];
        if (!r->seq.layers || r->phase == R_FINISH || r->cancelled ||
            group_failed(r) || r->dec.max_tokens == 0)
            continue;
        if (!v || r->lead->order > v->lead->order ||
            (r->lead == v->lead && r->choice > v->choice))
            v = r;
    }
    return v;
}

/* v gives its memory back and waits at the head of the queue. Decoding,
 * it keeps its decoder (text, stops, generator, what was shown) and, to
 * prefill again when readmitted, the tokens its sequence held; still
 * prefilling (its prompt), it starts over. HP_ENOMEM. */
static int preempt(hp_sched_t *s, req_t *v, int want, hp_error_t *err)
{
    if (v->phase == R_DECODE) {
        const hp_prompt_t *pr = &v->lead->prompt; /* a choice has none */
        int n = v->seq.n_pos, P = pr->n, gen = n - P;
        if (gen < 0 || gen > v->dec.n_ids - v->dec.n_prompt)
            return hp_error_set(err, HP_EINTERNAL,
                                "scheduler: a sequence of %d positions, a "
                                "prompt of %d and %d tokens",
                                n, P, v->dec.n_ids - v->dec.n_prompt);
        int *ids = malloc((size_t)n * sizeof(int));
        if (!ids)
            return hp_error_set(err, HP_ENOMEM, "scheduler: out of memory");
        memcpy(ids, pr->ids, (size_t)P * sizeof(int));
        memcpy(ids + P, v->dec.ids + v->dec.n_prompt,
               (size_t)gen * sizeof(int));
        v->redo = ids;
        v->n_redo = n;
    } else if (!v->redo) {
        drop_job(s, v);
        for (int i = 0; v->kept && i < v->n_choices - 1; i++)
            hp_seq_free(&v->kept[i]);
        free(v->kept);
        v->kept = NULL;
    }
    hp_seq_free(&v->seq);
    v->prefilled = 0;
    v->want_pos = want;
    v->phase = R_QUEUED;
    s->held -= v->holds;
    v->holds = 0;
    int k = 0;
    for (int i = 0; i < s->n_running; i++)
        if (s->running[i] != v)
            s->running[k++] = s->running[i];
    s->n_running = k;
    v->next = s->q_head;
    s->q_head = v;
    if (!s->q_tail)
        s->q_tail = v;
    s->blocked = NULL;
    s->preemptions++;
    v->lead->preempted++;
    return HP_OK;
}

/* r's sequence, past its extent for this step's tokens (need positions):
 * to one half as large again, at least seq_step more, at most all it may
 * reach. HP_EBUSY: no room now. */
static int grow(hp_sched_t *s, req_t *r, int need, hp_error_t *err)
{
    long cap = r->seq.kv_cap, more = cap / 2;
    cap += more > s->cfg.seq_step ? more : s->cfg.seq_step;
    if (cap > r->need_pos)
        cap = r->need_pos;
    int rc = hp_seq_grow(&r->seq, need, cap > need ? (int)cap : need, err);
    s->growths += rc == HP_OK;
    return rc;
}

/* No room for r to grow into (need positions): the last admitted choice
 * (*out) gives its memory back. HP_OK; *out may be r itself: it waits
 * for the others' memory or, alone, takes a fresh extent of the pool's
 * free memory as a whole, its own included (free memory may lie in
 * pieces). Else the error r fails with: HP_ETOOLARGE where it needs
 * more than the pool leaves requests. */
static int preempt_for(hp_sched_t *s, req_t *r, int need, req_t **out,
                       hp_error_t *err)
{
    const hp_model_t *m = &s->llm->model;
    req_t *v = victim(s);
    *out = v && v != r ? v : r;
    if (v && v != r) {
        /* its first extent again, or what its prefill needs where that
         * is more than the pool leaves requests */
        int ctx = v->phase == R_DECODE ? v->seq.n_pos
                  : v->redo            ? v->n_redo
                                       : v->prompt.n;
        int want = first_pos(s, v, ctx);
        if (hp_seq_pool_need(m, want) > s->room)
            want = ctx + 1;
        return preempt(s, v, want, err);
    }
    int alone = 1; /* no other holds a sequence (or its choices' kept) */
    for (int i = 0; i < s->n_running; i++) {
        const req_t *q = s->running[i];
        alone &= q == r || (!q->seq.layers && !(q->kept && q->kept[0].layers));
    }
    long want = (long)need + s->cfg.seq_step;
    if (want > r->need_pos)
        want = r->need_pos > need ? r->need_pos : need;
    if (alone && hp_seq_pool_need(m, (int)want) > s->room)
        want = need;
    if (alone && hp_seq_pool_need(m, need) > s->room)
        return hp_error_set(err, HP_ETOOLARGE,
                            "the sequence reached %d positions: %d take "
                            "%zu bytes, the sequence pool leaves requests "
                            "%zu (seq_budget)",
                            need - r->n_ids, need, hp_seq_pool_need(m, need),
                            s->room);
    return preempt(s, r, (int)want, err);
}

/* v leaves rs[*n] (if there): 1 if it stood at or before i. */
static int unplan(req_t **rs, int *n, const req_t *v, int i)
{
    for (int j = 0; j < *n; j++)
        if (rs[j] == v) {
            memmove(&rs[j], &rs[j + 1], (size_t)(*n - j - 1) * sizeof(*rs));
            (*n)--;
            return j <= i;
        }
    return 0;
}

/* Room for this step's tokens in each of rs[n] (planned, in admission
 * order: the oldest get theirs first): sequences grow, preempting where
 * the pool has no room. Returns the count left in rs. */
static int make_room(hp_sched_t *s, req_t **rs, int n)
{
    if (!s->pool)
        return n;
    /* the finished never run again: their memory goes now */
    for (int i = 0; i < s->n_running; i++)
        if (s->running[i]->phase == R_FINISH && s->running[i]->seq.layers)
            hp_seq_free(&s->running[i]->seq);
    for (int i = 0; i < n; i++) {
        req_t *r = rs[i];
        int need = r->seq.n_pos + r->n_ids;
        while (need > r->seq.kv_cap) {
            hp_error_t err = {0};
            req_t *v;
            int rc = grow(s, r, need, &err);
            if (rc == HP_OK)
                break;
            if (rc == HP_EBUSY)
                rc = preempt_for(s, r, need, &v, &err);
            if (rc != HP_OK) {
                fail(r, &err);
                v = r;
            }
            i -= unplan(rs, &n, v, i);
            if (v == r)
                break;
        }
    }
    return n;
}

/* One iteration; returns 1 if it produced output. */
static int step(hp_sched_t *s)
{
    int produced = 0;

    /* cancelled while waiting: gone before they cost anything */
    for (req_t **pp = &s->q_head; *pp;) {
        req_t *r = *pp;
        if (!is_cancelled(r)) {
            pp = &r->next;
            continue;
        }
        *pp = r->next;
        if (s->q_tail == r)
            s->q_tail = NULL;
        retire(s, r); /* a preempted choice: its request may run on */
    }
    if (!s->q_head)
        s->q_tail = NULL;
    else if (!s->q_tail)
        for (s->q_tail = s->q_head; s->q_tail->next;)
            s->q_tail = s->q_tail->next;
    if (refuse_queued(s))
        produced = 1;

    /* FIFO admission: a request holds a batch place per choice, and its
     * sequences' memory from the pool: while that is short, it waits for
     * running requests to end (with none running it never fits: its
     * error) */
    while (s->q_head && s->held + places(s->q_head) <= s->cfg.batch) {
        req_t *r = s->q_head;
        hp_error_t perr = {0};
        int prc = take_seqs(s, r, &perr);
        if (prc == HP_EBUSY && s->n_running > 0) {
            s->blocked = r;
            break;
        }
        s->blocked = NULL;
        s->q_head = r->next;
        if (!s->q_head)
            s->q_tail = NULL;
        r->next = NULL;
        s->running[s->n_running++] = r;
        r->holds = places(r);
        s->held += r->holds;
        if (prc != HP_OK) {
            r->t_admit = now_us();
            fail(r, &perr);
            continue;
        }
        admit(s, r, &produced);
        /* cold segments go to the workers at once: LPT sees the load */
        if (r->phase == R_PREFILL && !r->redo && uses_workers(s, r))
            prefill_cached(s, r, &produced);
    }

    /* one prefill chunk, for the oldest request still prefilling (one
     * waiting for prefill workers lets the next go first) */
    for (int i = 0; i < s->n_running; i++) {
        req_t *r = s->running[i];
        if (r->phase == R_PREFILL && !is_cancelled(r) && !waiting(r)) {
            if (r->mode == HP_IPC_MODE_FULL || r->redo)
                prefill_chunk(s, r);
            else
                prefill_cached(s, r, &produced);
            break;
        }
    }

    /* one token (or a verified draft run) for every request past its
     * prefill, in one pass */
    int n_dec = 0;
    for (int i = 0; i < s->n_running; i++) {
        req_t *r = s->running[i];
        if (is_cancelled(r) || r->phase == R_PREFILL || group_failed(r))
            continue;
        if (!deliver(s, r, &produced))
            continue; /* its reader is behind: wait for it */
        if (r->phase == R_DECODE && plan(s, r))
            s->item_req[n_dec++] = r;
    }
    n_dec = make_room(s, s->item_req, n_dec);
    if (n_dec)
        decode_step(s, s->item_req, n_dec);
    for (int i = 0; i < n_dec; i++)
        if (s->item_req[i]->status == HP_OK)
            deliver(s, s->item_req[i], &produced);

    /* retire the finished (text and end all taken), the failed and the
     * cancelled; a request ends with its last choice */
    int k = 0;
    for (int i = 0; i < s->n_running; i++) {
        req_t *r = s->running[i];
        int gone = r->cancelled || r->status != HP_OK || group_failed(r) ||
                   (r->phase == R_FINISH && deliver(s, r, &produced) &&
                    deliver_end(r, &produced));
        if (gone) {
            retire(s, r);
            produced = 1;
        } else {
            s->running[k++] = r;
        }
    }
    s->n_running = k;
    return produced;
}

/* Can a step make progress now? (called with mu held) */
static int runnable(const hp_sched_t *s)
{
    if (s->q_head && s->held + places(s->q_head) <= s->cfg.batch &&
        s->q_head != s->blocked)
        return 1;
    for (int i = 0; i < s->n_running; i++) {
        req_t *r = s->running[i];
        const char *t;
        const hp_decoder_lp_t *lp;
        if (r->phase == R_PREFILL) {
            if (!waiting(r))
                return 1;
            continue; /* segment_done kicks when a segment is out */
        }
        /* output its reader has no room for yet waits for a kick */
        if (hp_decoder_ready(&r->dec, &t) == 0 &&
            (!r->ops.token || hp_decoder_logprobs_ready(&r->dec, &lp) == 0) &&
            (r->phase != R_FINISH || !r->ops.end || r->ended))
            return 1;
    }
    return 0;
}

/* r's sequences (its own and the choices' kept for later) into the
 * stats: an extent's length in a pool, else what it allocated. */
static void count_seqs(const hp_sched_t *s, const req_t *r,
                       hp_sched_stats_t *st)
{
    for (int i = -1; i < (r->kept ? r->n_choices - 1 : 0); i++) {
        const hp_seq_t *q = i < 0 ? &r->seq : &r->kept[i];
        if (!q->layers)
            continue;
        st->seqs++;
        st->seq_bytes +=
            q->pool ? q->pool_len : hp_seq_bytes(&s->llm->model, q->kv_cap);
    }
}

static void update_stats(hp_sched_t *s)
{
    int queued = 0;
    size_t bytes = 0;
    s->st.seqs = 0;
    s->st.seq_bytes = 0;
    for (req_t *r = s->q_head; r; r = r->next) {
        queued++;
        bytes += req_bytes(s, r);
        count_seqs(s, r, &s->st);
    }
    for (req_t *r = s->in_head; r; r = r->next) {
        queued++;
        bytes += req_bytes(s, r);
        count_seqs(s, r, &s->st);
    }
    s->st.decoding = 0;
    for (int i = 0; i < s->n_running; i++) {
        req_t *r = s->running[i];
        bytes += req_bytes(s, r);
        count_seqs(s, r, &s->st);
        s->st.decoding += r->phase == R_DECODE;
        s->st.tokens += (uint64_t)(r->dec.n_tokens - r->counted);
        r->counted = r->dec.n_tokens;
    }
    s->st.passes = s->passes;
    s->st.seq_growths = s->growths;
    s->st.preemptions = s->preemptions;
    s->st.pool_short = atomic_load(&s->pool_short);
    s->st.queued = queued;
    s->st.running = s->n_running;
    s->st.bytes = bytes;
}

/* After a step: once the device has faulted (hp_backend_lost), every
 * request ends with the fault, and the queue and later submissions are
 * refused with it (engine_unavailable): nothing can run here again, and
 * the flush hook's lost tells the server to exit for a restart. 1 the
 * first time. */
static int device_lost(hp_sched_t *s)
{
    hp_error_t why = {0}, err;
    if (s->lost || !hp_backend_lost(s->llm->model.be, &why))
        return 0;
    hp_error_set(&err, HP_EUNAVAIL,
                 "the device failed (%s); the engine stops and must be "
                 "restarted",
                 why.msg);
    s->lost = 1;
    for (int i = 0; i < s->n_running; i++)
        if (s->running[i]->phase != R_FINISH)
            fail(s->running[i], &err);
    pthread_mutex_lock(&s->mu);
    s->draining = 1;
    s->drain_err = err;
    s->st.lost = 1;
    pthread_mutex_unlock(&s->mu);
    return 1;
}

static void deadline_after(struct timespec *ts, int ms)
{
    clock_gettime(CLOCK_REALTIME, ts);
    ts->tv_sec += ms / 1000;
    ts->tv_nsec += (long)(ms % 1000) * 1000000;
    if (ts->tv_nsec >= 1000000000) {
        ts->tv_sec++;
        ts->tv_nsec -= 1000000000;
    }
}

static void *sched_main(void *arg)
{
    hp_sched_t *s = arg;
    struct timespec ts;

    if (s->cfg.threads > 0)
        omp_set_num_threads(s->cfg.threads);
    pthread_mutex_lock(&s->mu);
    for (;;) {
        /* the newly submitted join the queue, in submission order */
        if (s->in_head) {
            if (s->q_tail)
                s->q_tail->next = s->in_head;
            else
                s->q_head = s->in_head;
            s->q_tail = s->in_tail;
            s->in_head = s->in_tail = NULL;
        }
        if (s->stopping)
            break;
        if (!s->kicked && !runnable(s)) {
            /* only stalled readers (or nothing) left: sleep until kicked;
             * the timeout is a safety net, never the wake-up path */
            if (s->n_running) {
                deadline_after(&ts, 200);
                pthread_cond_timedwait(&s->cv, &s->mu, &ts);
                s->kicked = 1;
            } else {
                pthread_cond_wait(&s->cv, &s->mu);
            }
            continue;
        }
        s->kicked = 0;
        pthread_mutex_unlock(&s->mu);
        hp_backend_lock(s->llm->model.be);
        s->dev_locked = 1;
        int produced = step(s);
        produced |= device_lost(s);
        s->dev_locked = 0;
        hp_backend_unlock(s->llm->model.be);
        pthread_mutex_lock(&s->mu);
        s->st.steps++;
        update_stats(s);
        hp_sched_stats_t st = s->st;
        pthread_mutex_unlock(&s->mu);
        /* a request cancelled while queued produces nothing, yet the
         * gauges moved: a reader must not see it waiting forever */
        if ((produced || st.running != s->shown_running ||
             st.queued != s->shown_queued) &&
            s->cfg.flush) {
            s->shown_running = st.running;
            s->shown_queued = st.queued;
            s->cfg.flush(s->cfg.flush_ud, &st);
        }
        pthread_mutex_lock(&s->mu);
        if (s->cfg.throttle_ms > 0 && !s->stopping &&
            (s->n_running || s->q_head)) {
            deadline_after(&ts, s->cfg.throttle_ms);
            while (!s->stopping && pthread_cond_timedwait(&s->stop_cv, &s->mu,
                                                          &ts) != ETIMEDOUT)
                ;
        }
    }
    pthread_mutex_unlock(&s->mu);

    /* stopping: everything still held is cancelled */
    hp_backend_lock(s->llm->model.be);
    s->dev_locked = 1;
    for (int i = 0; i < s->n_running; i++) {
        s->running[i]->cancelled = 1;
        retire(s, s->running[i]);
    }
    s->dev_locked = 0;
    hp_backend_unlock(s->llm->model.be);
    s->n_running = 0;
    while (s->q_head) {
        req_t *r = s->q_head;
        s->q_head = r->next;
        r->cancelled = 1;
        retire(s, r); /* a preempted choice's request ends with its last */
    }
    s->q_tail = NULL;
    return NULL;
}

static void free_parts(hp_sched_t *s)
{
    hp_error_t err;
    if (s->cfg.prefill) /* the workers' builders go back to the pool */
        hp_prefill_pool_plan(s->cfg.prefill, NULL, NULL, &err);
    for (int i = 0; s->build && i < s->n_build; i++)
        hp_seq_free(&s->build[i]);
    free(s->build);
    hp_sampler_free(&s->sm);
    hp_fwd_ws_free(&s->ws);
    if (s->kvb)
        hp_kvbuf_pool_free(&s->kvpool);
    free(s->prob);
    free(s->items);
    free(s->item_req);
    free(s->running);
    hp_gcache_free(s->gcache);
    hp_seq_pool_free(s->pool);
    free(s);
}

/* The sequence pool (hp_sched_cfg_t.seq_budget) and the segment
 * builders' sequences in it, taken now: the scheduler's own where a cache
 * may build segments in its thread, and one per prefill worker. */
static int seq_pool(hp_sched_t *s, hp_error_t *err)
{
    const hp_model_t *m = &s->llm->model;
    size_t bytes = s->cfg.seq_budget;
    if (!bytes && hp_backend_host_memory(m->be))
        return HP_OK;
    s->n_build = !s->cfg.cache    ? 0
                 : s->cfg.prefill ? 1 + hp_prefill_pool_workers(s->cfg.prefill)
                                  : 1;
    s->build_pos = s->cfg.max_segment;
    size_t build = (size_t)s->n_build * hp_seq_pool_need(m, s->build_pos);
    if (!bytes) {
        long most = (long)s->cfg.max_context + HP_SCHED_MAX_DRAFT + 1;
        bytes = (size_t)s->cfg.batch *
                    hp_seq_pool_need(m, most < INT_MAX ? (int)most : INT_MAX) +
                build;
        size_t half = hp_backend_mem_total(m->be) / 2;
        if (half && bytes > half)
            bytes = half;
    }
    int rc = hp_seq_pool_create(&s->pool, m->be, bytes, err);
    if (rc != HP_OK)
        return rc;
    if (build >= hp_seq_pool_bytes(s->pool))
        return hp_error_set(err, HP_ENOMEM,
                            "sequence pool: %.1f MiB (seq_budget) does not "
                            "hold %d segment builders of %d positions "
                            "(%.1f MiB; lower max_segment)",
                            hp_seq_pool_bytes(s->pool) / 1048576.0, s->n_build,
                            s->build_pos, build / 1048576.0);
    s->build = calloc((size_t)s->n_build + 1, sizeof(*s->build));
    if (!s->build)
        return hp_error_set(err, HP_ENOMEM, "scheduler: out of memory");
    for (int i = 0; i < s->n_build; i++)
        if ((rc = hp_seq_init_in(&s->build[i], m, s->pool, s->build_pos,
                                 err)) != HP_OK)
            return rc;
    s->room = hp_seq_pool_bytes(s->pool) - build;
    s->st.seq_budget = s->room;
    s->st.seq_pool = hp_seq_pool_bytes(s->pool);
    s->st.seq_full = (int)(s->room / hp_seq_pool_need(m, s->cfg.max_context));
    return HP_OK;
}

/* The KVBuffer pool every request's buffers come from (whatever the
 * server's form: a request may ask for another), sized so that `batch`
 * requests at their largest always fit: admission never waits for it. */
static int kvbuf_pool(hp_sched_t *s, hp_error_t *err)
{
    const hp_model_config_t *c = &s->llm->model.cfg;
    hp_kvbuf_config_t kc;
    int n_lin = c->n_lin;
    if (n_lin == 0)
        return HP_OK; /* nothing to buffer: every request is recurrent */
    if (!hp_backend_supports_op(s->llm->model.be, HP_OP_KVBUF_STEP, 0))
        return HP_OK; /* the backend has no KVBuffer: recurrent too */
    hp_kvbuf_config_default(&kc, c->lin_k_heads, c->lin_v_heads, c->lin_k_dim,
                            c->lin_v_dim);
    if (kc.max_step < HP_SCHED_MAX_DRAFT + 1)
        kc.max_step = HP_SCHED_MAX_DRAFT + 1;
    int most = (kc.cap > kc.cap_kvonly ? kc.cap : kc.cap_kvonly) + kc.max_step;
    kc.n_blocks = s->cfg.batch * n_lin * ((most - 1) / kc.block_tokens + 1);
    kc.max_batch = s->cfg.batch;
    kc.be = s->llm->model.be;
    if (hp_kvbuf_pool_init(&s->kvpool, &kc, err) != HP_OK)
        return err->code;
    s->kvb = 1;
    return HP_OK;
}

int hp_sched_create(hp_sched_t **out, const hp_llm_t *llm,
                    const hp_sched_cfg_t *cfg, hp_error_t *err)
{
    hp_sched_t *s = calloc(1, sizeof(*s));
    *out = NULL;
    if (!s)
        return hp_error_set(err, HP_ENOMEM, "scheduler: out of memory");
    s->llm = llm;
    s->cfg = *cfg;
    if (s->cfg.batch <= 0)
        s->cfg.batch = 8;
    if (s->cfg.prefill_chunk <= 0)
        s->cfg.prefill_chunk = hp_sched_prefill_chunk(&llm->model);
    if (s->cfg.seam < 0)
        s->cfg.seam = HP_SEAM_DEFAULT;
    if (s->cfg.max_queue <= 0)
        s->cfg.max_queue = 1024;
    if (s->cfg.max_context <= 0)
        s->cfg.max_context = llm->model.cfg.max_positions > 0
                                 ? llm->model.cfg.max_positions
                                 : INT_MAX;
    if (s->cfg.seq_step <= 0)
        s->cfg.seq_step = HP_SCHED_SEQ_STEP;
    if (s->cfg.max_segment <= 0 || s->cfg.max_segment > s->cfg.max_context)
        s->cfg.max_segment = s->cfg.max_context;
    const int V = llm->model.sample_vocab; /* the sampler's ids */
    if (s->cfg.max_draft <= 0)
        s->cfg.max_draft = HP_SCHED_DRAFT_DEFAULT;
    if (s->cfg.max_draft > HP_SCHED_MAX_DRAFT)
        s->cfg.max_draft = HP_SCHED_MAX_DRAFT;
    s->running = calloc((size_t)s->cfg.batch, sizeof(*s->running));
    s->items = calloc((size_t)s->cfg.batch, sizeof(*s->items));
    s->item_req = calloc((size_t)s->cfg.batch, sizeof(*s->item_req));
    s->prob = malloc((size_t)V * sizeof(float));
    if (!s->running || !s->items || !s->item_req || !s->prob ||
        hp_gcache_create(&s->gcache, 0, llm->tok, V, llm->stop_ids,
                         llm->n_stop_ids, err) != HP_OK ||
        hp_sampler_init(&s->sm, V) != 0) {
        free_parts(s);
        return hp_error_set(err, HP_ENOMEM, "scheduler: out of memory");
    }
    if (kvbuf_pool(s, err) != HP_OK || seq_pool(s, err) != HP_OK) {
        free_parts(s);
        return err->code;
    }
    /* The workspace serves the largest pass: a prefill chunk (or a cache's
     * piece), or a decode step of the whole batch, each item verifying as
     * many drafts as its KVBuffers take. */
    hp_fwd_plan_t plan = {
        .max_tokens = s->cfg.prefill_chunk > hp_fwd_piece(&llm->model)
                          ? s->cfg.prefill_chunk
                          : hp_fwd_piece(&llm->model),
        .max_ctx = s->cfg.max_context,
        .max_batch = s->cfg.batch,
        .max_step = s->kvb ? s->kvpool.cfg.max_step : 1,
    };
    if (hp_fwd_ws_init(&s->ws, &llm->model, &plan, err) != HP_OK ||
        (s->cfg.prefill &&
         hp_prefill_pool_plan(s->cfg.prefill, llm,
                              s->n_build ? s->build + 1 : NULL,
                              err) != HP_OK)) {
        free_parts(s);
        return err->code;
    }
    s->ws.build_seq = s->n_build ? &s->build[0] : NULL;
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    pthread_cond_init(&s->stop_cv, NULL);
    if (pthread_create(&s->thread, NULL, sched_main, s) != 0) {
        pthread_cond_destroy(&s->stop_cv);
        pthread_cond_destroy(&s->cv);
        pthread_mutex_destroy(&s->mu);
        free_parts(s);
        return hp_error_set(err, HP_ENOMEM,
                            "scheduler: cannot start its thread");
    }
    *out = s;
    return HP_OK;
}

/* naive/pic hold every cacheable segment of the prompt in the public pool
 * while they assemble it: a prompt whose segments the pool cannot hold at
 * once runs full instead (counted: hp_sched_stats_t.pool_short), since its
 * assembly could only fail for want of memory. */
static void pool_holds(hp_sched_t *s, req_t *r)
{
    hp_pool_stats_t ps;
    if (r->mode != HP_IPC_MODE_NAIVE && r->mode != HP_IPC_MODE_PIC)
        return;
    hp_pool_stats(s->cfg.cache->pub, &ps);
    if (hp_assemble_pool_bytes(&s->llm->model.cfg, &r->prompt,
                               (hp_ipc_mode_t)r->mode, r->seam) <= ps.budget)
        return;
    r->mode = HP_IPC_MODE_FULL;
    atomic_fetch_add(&s->pool_short, 1);
}

/* naive/pic build each cacheable segment on its own in a builder's
 * sequence (planned at start): one longer than that can never be built. */
static int segments_fit(const hp_sched_t *s, const req_t *r, hp_error_t *err)
{
    if (!s->n_build ||
        (r->mode != HP_IPC_MODE_NAIVE && r->mode != HP_IPC_MODE_PIC))
        return HP_OK;
    for (int i = 0; i < r->prompt.n_segs; i++) {
        const hp_prompt_seg_t *g = &r->prompt.segs[i];
        if (hp_assemble_cacheable(g, (hp_ipc_mode_t)r->mode, r->seam) &&
            g->len > s->build_pos)
            return hp_error_set(err, HP_ETOOLARGE,
                                "segment %d is %d tokens, the segment "
                                "builders hold %d (max_segment)",
                                i, g->len, s->build_pos);
    }
    return HP_OK;
}

int hp_sched_submit(hp_sched_t *s, const hp_sched_req_t *req, hp_error_t *err)
{
    hp_gen_params_t gen = req->gen;
    req_t *r = calloc(1, sizeof(*r));
    int rc;

    if (!r)
        return hp_error_set(err, HP_ENOMEM, "scheduler: out of memory");
    rc = hp_prompt_build(&r->prompt, s->llm, req->prompt, req->prompt_len,
                         req->separator ? req->separator : "", err);
    if (rc != HP_OK) {
        free(r);
        return rc;
    }
    r->n_choices = req->n > 1 ? req->n : 1;
    if (r->n_choices > s->cfg.batch) {
        rc = hp_error_set(err, HP_EBADINPUT,
                          "'n' is %d, more choices than the %d sequences "
                          "this engine decodes at once",
                          r->n_choices, s->cfg.batch);
        req_free(r);
        return rc;
    }
    if (r->prompt.n > s->cfg.max_context) {
        rc = hp_error_set(err, HP_ETOOLARGE,
                          "the prompt is %d tokens, the model's context is "
                          "%d",
                          r->prompt.n, s->cfg.max_context);
        req_free(r);
        return rc;
    }
    /* generation stops at the end of the context: finish "length" */
    if (gen.max_tokens > s->cfg.max_context - r->prompt.n)
        gen.max_tokens = s->cfg.max_context - r->prompt.n;
    /* the positions it may reach: a verification runs past the last
     * token by its drafts */
    r->need_pos = r->prompt.n + (gen.max_tokens > 0 ? gen.max_tokens : 0) +
                  HP_SCHED_MAX_DRAFT + 1;
    /* without pools every request runs full, and says so */
    r->mode = s->cfg.cache && req->mode >= HP_IPC_MODE_FULL &&
                      req->mode <= HP_IPC_MODE_PIC
                  ? req->mode
                  : HP_IPC_MODE_FULL;
    r->seam = req->seam >= 0 ? req->seam : s->cfg.seam;
    pool_holds(s, r);
    if ((rc = segments_fit(s, r, err)) != HP_OK) {
        req_free(r);
        return rc;
    }
    /* its first extent; it grows from there as it decodes */
    r->want_pos = first_pos(s, r, r->prompt.n);
    if (s->pool) {
        size_t need = (size_t)r->n_choices *
                      hp_seq_pool_need(&s->llm->model, r->want_pos);
        if (need > s->room) {
            rc = hp_error_set(err, HP_ETOOLARGE,
                              "the request takes %.1f MiB of sequence memory "
                              "(%d positions, %d choices), the engine has "
                              "%.1f MiB (seq_budget)",
                              need / 1048576.0, r->want_pos, r->n_choices,
                              s->room / 1048576.0);
            req_free(r);
            return rc;
        }
    }

    /* speculative decoding: drafts from the prompt's tokens */
    int spec = req->speculative == HP_SCHED_SPEC_ON ||
               (req->speculative == HP_SCHED_SPEC_SERVER && s->cfg.speculative);
    int draft = req->max_draft > 0 ? req->max_draft : s->cfg.max_draft;
    gen.speculative =
        spec ? (draft < HP_SCHED_MAX_DRAFT ? draft : HP_SCHED_MAX_DRAFT) : 0;
    gen.ctx = r->prompt.ids;
    gen.n_ctx = r->prompt.n;
    /* structured output: compiled once per distinct request (cached);
     * masked requests neither speculate nor take the device's argmax */
    if (req->grammar_len) {
        rc = hp_gcache_get(s->gcache, req->grammar, req->grammar_len,
                           &req->grammar_opts, &r->grammar, &gen.gvocab, err);
        if (rc != HP_OK) {
            hp_prompt_free(&r->prompt);
            free(r);
            return rc;
        }
        r->gcache = s->gcache;
        gen.grammar = r->grammar;
        if (r->grammar)
            gen.speculative = 0;
    }
    if ((rc = hp_decoder_init(&r->dec, s->llm, &gen, err)) != HP_OK) {
        if (r->grammar)
            hp_gcache_put(r->gcache, r->grammar);
        hp_prompt_free(&r->prompt);
        free(r);
        return rc;
    }
    r->ops = *req->ops;
    r->ud = req->ud;
    r->lead = r;
    r->members = 1;
    r->ask_decode = req->decode;
    r->decode = HP_SCHED_DECODE_RECURRENT;
    r->feed = -1;
    r->phase = R_QUEUED;
    r->t_submit = now_us();

    pthread_mutex_lock(&s->mu);
    if (s->draining) {
        *err = s->drain_err;
        pthread_mutex_unlock(&s->mu);
        req_free(r);
        return err->code;
    }
    if (s->stopping || s->st.live >= s->cfg.max_queue) {
        int stopping = s->stopping;
        pthread_mutex_unlock(&s->mu);
        req_free(r);
        return hp_error_set(err, stopping ? HP_EUNAVAIL : HP_EBUSY,
                            stopping ? "the engine is shutting down"
                                     : "the engine has %d requests in "
                                       "flight, its limit",
                            s->cfg.max_queue);
    }
    if (s->in_tail)
        s->in_tail->next = r;
    else
        s->in_head = r;
    s->in_tail = r;
    s->st.live++;
    pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&s->mu);
    return HP_OK;
}

void hp_sched_drain(hp_sched_t *s, int status, const char *msg)
{
    pthread_mutex_lock(&s->mu);
    s->draining = 1;
    hp_error_set(&s->drain_err, status, "%s", msg);
    s->kicked = 1;
    pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&s->mu);
}

void hp_sched_kick(hp_sched_t *s)
{
    pthread_mutex_lock(&s->mu);
    s->kicked = 1;
    pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&s->mu);
}

int hp_sched_prefill_chunk(const hp_model_t *m)
{
    return hp_backend_host_memory(m->be) ? 256 : HP_FWD_PIECE_DEVICE;
}

void hp_sched_stats(hp_sched_t *s, hp_sched_stats_t *st)
{
    pthread_mutex_lock(&s->mu);
    *st = s->st;
    pthread_mutex_unlock(&s->mu);
}

void hp_sched_destroy(hp_sched_t *s)
{
    if (!s)
        return;
    pthread_mutex_lock(&s->mu);
    s->stopping = 1;
    pthread_cond_broadcast(&s->cv);
    pthread_cond_broadcast(&s->stop_cv);
    pthread_mutex_unlock(&s->mu);
    pthread_join(s->thread, NULL);
    /* submitted after the thread's last look */
    while (s->in_head) {
        req_t *r = s->in_head;
        s->in_head = r->next;
        r->cancelled = 1;
        req_done(s, r);
    }
    pthread_cond_destroy(&s->stop_cv);
    pthread_cond_destroy(&s->cv);
    pthread_mutex_destroy(&s->mu);
    free_parts(s);
}

int hp_sched_tune(hp_sched_t *s, const hp_sched_tune_t *t, hp_error_t *err)
{
    if (t->decode == HP_SCHED_DECODE_CHUNKWISE && !s->kvb)
        return hp_error_set(err, HP_EBADINPUT,
                            "chunkwise decode needs a scheduler started "
                            "with it");
    pthread_mutex_lock(&s->mu);
    if (t->max_queue > 0)
        s->cfg.max_queue = t->max_queue;
    s->cfg.throttle_ms = t->throttle_ms > 0 ? t->throttle_ms : 0;
    s->cfg.decode = t->decode;
    pthread_mutex_unlock(&s->mu);
    return HP_OK;
}
