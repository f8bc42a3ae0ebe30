/*
 * sched.h - the engine's scheduler: continuous batching of many requests
 * on one model, in one thread of its own.
 *
 * Every iteration (a "step") admits waiting requests in FIFO order while
 * fewer than `batch` run, runs ONE prefill chunk (at most prefill_chunk
 * prompt tokens of the oldest request still prefilling), then decodes one
 * token for every running request that has finished its prefill. A long
 * prompt therefore never freezes the streams of others: it costs them one
 * chunk per token. Requests are tokenized in the submitting thread.
 *
 * The decode tokens of a step run as one forward pass over all decoding
 * requests (hp_forward_batch: each weight read once per step), each in its
 * own decode form (recurrent, chunkwise, KV-only) and, speculating, as a
 * verification of its prompt-lookup drafts.
 * Modes (assemble.h): `full` prefills in chunks; `naive`/`pic` first
 * prefill each missing segment on its own, one segment per step, then
 * assemble from the pool in one step; `prefix` resumes from the prefix
 * cache (radix tree) in one step. Without a cache every request runs `full`,
 * and the mode reported back is always the one that ran.
 *
 * Not here: the IPC (ipc_server.c adapts slots to the callbacks below).
 */
#ifndef HP_SCHED_H
#define HP_SCHED_H

#include <stddef.h>
#include <stdint.h>

#include "engine/contract/hp_error.h"
#include "engine/forward/decoder.h"
#include "engine/forward/generate.h"
#include "engine/forward/sampler.h"
#include "engine/model/llm.h"

#include "engine/cache/assemble.h"
#include "engine/forward/kvbuf.h"
#include "engine/serve/prefill_pool.h"

/* Decode forms (DESIGN §5): recurrent writes every state every step;
 * chunkwise (KVBuffer) defers the writes, from the prefill's state; auto
 * runs a `full` prompt that fits the buffer's KV-only limit through the
 * buffer with no state at all (reported as kv-only), else chunkwise.
 * SERVER (0): a request takes the server's form; a server: recurrent. */
enum {
    HP_SCHED_DECODE_SERVER = 0,
    HP_SCHED_DECODE_RECURRENT = 1,
    HP_SCHED_DECODE_CHUNKWISE = 2,
    HP_SCHED_DECODE_AUTO = 3,
    HP_SCHED_DECODE_KVONLY = 4 /* reported only: what auto ran */
};

/* Speculative decoding per request: the server's setting, on or off. */
enum { HP_SCHED_SPEC_SERVER = 0, HP_SCHED_SPEC_ON = 1, HP_SCHED_SPEC_OFF = 2 };

/* Most tokens one speculative pass drafts (the KVBuffer pool's max_step
 * is this + 1), and the server's default. */
#define HP_SCHED_MAX_DRAFT     16
#define HP_SCHED_DRAFT_DEFAULT 8

/* The sequence pool's default growth step: 512 positions are 12 MiB of
 * f32 K/V on Qwen3.5-0.8B (6 full layers), so 256 short requests take
 * 3 GiB where reserving max_context (262144) took 6.4 GB each; a step
 * this long also keeps the moves rare (one per 512 tokens at first,
 * then geometric) and most replies within their first extent. */
#define HP_SCHED_SEQ_STEP 512

/* ---- the scheduler --------------------------------------------------- */

typedef struct hp_sched hp_sched_t;

typedef struct {
    int queued;      /* admitted to the queue, not yet running */
    int running;     /* prefilling or decoding */
    int live;        /* requests holding memory (queued + running) */
    size_t bytes;    /* memory those requests hold */
    uint64_t served; /* requests finished since start */
    uint64_t steps;  /* scheduler iterations */
    int decoding;    /* requests decoding (prefill done, not finished) */
    uint64_t tokens; /* tokens generated since start */
    uint64_t passes; /* decode passes (forward calls) since start */
    /* The requests' sequences (linear states and K/V): how many, their
     * bytes, and what the sequence pool leaves to requests (0: no pool,
     * each sequence allocates on its own). The segment builders' own
     * sequences are in neither. */
    int seqs;
    size_t seq_bytes, seq_budget;
    /* the sequence pool in all (the builders' included), and how many
     * requests of max_context positions its budget holds at once */
    size_t seq_pool;
    int seq_full;
    /* since start: sequences moved to a larger extent as they grew, and
     * requests (choices) preempted for want of room: their memory given
     * back, their context prefilled again when readmitted */
    uint64_t seq_growths, preemptions;
    /* since start: naive/pic requests whose cacheable segments the public
     * pool could not hold at once, run full instead */
    uint64_t pool_short;
    /* the device faulted (hp_backend_lost): every request ended with it,
     * new ones are refused, the server should exit to be restarted */
    int lost;
} hp_sched_stats_t;

typedef struct {
    int batch;         /* requests running at once (default 8) */
    int prefill_chunk; /* prompt tokens per prefill step (0: the model's
                          backend's, hp_sched_prefill_chunk) */
    int max_queue;     /* requests waiting + running; beyond: HP_EBUSY */
    int max_context;   /* prompt + generated tokens (0: the model's) */
    int threads;       /* compute threads (0: the OpenMP default) */
    int throttle_ms;   /* pause after every busy step (tests, demos) */
    hp_cache_t *cache; /* pools for prefix/naive/pic (NULL: full only) */
    /* naive/pic: the cold segments go to these workers (LPT, all at once)
     * and the request assembles once they are published; NULL: one
     * segment per step in the scheduler thread */
    hp_prefill_pool_t *prefill;
    int decode; /* HP_SCHED_DECODE_*: how the linear layers decode */
    int seam;   /* default seam width (HP_SEAM_DEFAULT) */
    /* speculative decoding (prompt-lookup drafts, spec.h) for requests
     * that do not say: 1 on; max_draft tokens per pass (0: 8) */
    int speculative;
    int max_draft;
    /* 1: one forward pass per decoding request, as before batching
     * (benches compare); 0: one pass for all of a step's requests */
    int solo_decode;
    /* The sequence pool (seq.h): the running requests' states and K/V
     * come out of one allocation made here at start, so that serving a
     * request allocates no device memory. Memory is taken as a sequence
     * grows: a request reserves at admission its prompt + seq_step
     * positions + the drafts of one verification, at most the most it
     * may reach (prompt + max_tokens + drafts; n choices: n times that);
     * before a step would write past a sequence's extent, the sequence
     * moves to one half as large again (at least seq_step more). One
     * whose first extent does not fit now waits in the queue until
     * running ones end, one larger than the pool is refused at submit
     * (HP_ETOOLARGE). When a sequence cannot grow, the most recently
     * admitted running request (choice) is preempted: its memory goes
     * back and it waits at the head of the queue, then prefills its
     * context (prompt and tokens so far) again and decodes on, its
     * output unbroken; one that cannot grow even alone ends with
     * HP_ETOOLARGE. The
     * segment builds of naive/pic (hp_segc_build_*) run in builders'
     * sequences of max_segment positions taken from the pool at start
     * too: one for this thread where there is a cache, one per prefill
     * worker; they never wait for requests' memory, so a request waits
     * for its own extent only (no deadlock), and a cacheable segment
     * longer than max_segment is refused at submit (HP_ETOOLARGE). Its
     * bytes: seq_budget (the builders included); 0: batch sequences of
     * max_context positions plus the builders, capped at half the
     * device's memory; on a backend whose memory is host memory (the
     * CPU) with seq_budget 0 there is no pool (each sequence allocates
     * on its own, as before). */
    size_t seq_budget;
    int max_segment; /* positions of a builder (0: max_context) */
    /* positions a pooled sequence takes beyond its context at admission,
     * and the least it grows by (0: HP_SCHED_SEQ_STEP) */
    int seq_step;
    /* Called in the scheduler thread after a step that produced output
     * (may be NULL): a place to send wake-ups in one go. */
    void (*flush)(void *ud, const hp_sched_stats_t *st);
    void *flush_ud;
} hp_sched_cfg_t;

typedef struct {
    int prompt_tokens;
    int cached_tokens;
    int mode;   /* the mode that runs */
    int decode; /* the decode form that runs (HP_SCHED_DECODE_*) */
    int segs_hit;
    int segs_total;
    int64_t queue_us;
} hp_sched_start_t;

typedef struct {
    int status; /* HP_OK or the error that ended the request */
    hp_finish_t finish;
    int prompt_tokens;
    int completion_tokens;
    int cached_tokens;
    int fetched_tokens; /* of cached_tokens: pulled from peers (peer fetch) */
    int mode;
    int decode;          /* the form that ran */
    int draft_tokens;    /* speculative tokens proposed */
    int accepted_tokens; /* ... and accepted (<= completion_tokens) */
    int segs_hit;
    int segs_total;
    int preempted;    /* times a choice of it gave its memory back */
    int64_t ttft_us;  /* submit to first token (-1: none) */
    int64_t total_us; /* submit to done */
    hp_error_t err;   /* status != HP_OK: why */
} hp_sched_final_t;

/* One token's log-probabilities as a request reports them: its bytes
 * (owned by the tokenizer; a piece of a character may be one) and the
 * alternatives', by falling log-probability. */
typedef struct {
    const char *bytes;
    size_t len;
    float logprob;
} hp_sched_alt_t;

typedef struct {
    int choice;
    size_t text_offset; /* characters of the choice's text before it */
    hp_sched_alt_t tok;
    int n_top;
    hp_sched_alt_t top[HP_LOGPROBS_MAX_TOP];
} hp_sched_token_t;

/*
 * How a request talks back; every call comes from the scheduler thread.
 * A request of n choices reports each choice's text, tokens and end
 * under its index (0..n-1), interleaved; start and done once.
 */
typedef struct {
    /* admitted: prefill begins (may be NULL) */
    void (*start)(void *ud, const hp_sched_start_t *s);
    /* text ready: returns the bytes taken (the rest is offered again
     * after the next hp_sched_kick, and the choice waits for it) */
    size_t (*text)(void *ud, int choice, const char *text, size_t len);
    /* polled every step: non-zero ends the request (may be NULL) */
    int (*cancelled)(void *ud);
    /* the last call: the request's memory is gone after it */
    void (*done)(void *ud, const hp_sched_final_t *f);
    /* with gen.logprobs, a token's log-probabilities, before the text
     * that starts with it: 1 taken, 0 no room (offered again as text
     * is); NULL: none are kept */
    int (*token)(void *ud, const hp_sched_token_t *t);
    /* a choice ended, all its text taken: 1 taken, 0 no room (may be
     * NULL) */
    int (*end)(void *ud, int choice, hp_finish_t finish, int tokens);
} hp_sched_ops_t;

typedef struct {
    const char *prompt; /* only read during hp_sched_submit */
    size_t prompt_len;
    const char *separator; /* NULL or "": the prompt is one segment */
    int mode;              /* hp_ipc_mode_t */
    int seam;              /* < 0: the scheduler's default */
    int decode;            /* HP_SCHED_DECODE_* (0: the server's) */
    int speculative;       /* HP_SCHED_SPEC_* (0: the server's) */
    int max_draft;         /* 1..HP_SCHED_MAX_DRAFT (0: the server's) */
    hp_gen_params_t gen;   /* stop strings are copied; speculative and
                              ctx come from the fields above */
    /* choices (0: one): the prompt is prefilled once and its state
     * copied to each; choice i samples from hp_sampling_choice_seed(
     * gen.sampling.seed, i). At most the scheduler's batch. */
    int n;
    /* structured output: the constraint (hp_grammar.h's request JSON,
     * read during hp_sched_submit only) and how the chat template writes
     * tool calls and thinking; grammar_len 0: free text. A constraint
     * that does not compile is HP_EBADINPUT. */
    const char *grammar;
    size_t grammar_len;
    hp_grammar_opts_t grammar_opts;
    const hp_sched_ops_t *ops;
    void *ud;
} hp_sched_req_t;

/* Starts the scheduler thread for llm (which must outlive it). */
int hp_sched_create(hp_sched_t **out, const hp_llm_t *llm,
                    const hp_sched_cfg_t *cfg, hp_error_t *err);

/*
 * Tokenizes the prompt (in the calling thread) and queues the request.
 * HP_OK: ops->done will be called exactly once. Otherwise no callback is
 * ever made: HP_EBADINPUT (no tokens, too many segments, more choices
 * than the batch), HP_ETOOLARGE
 * (longer than the context; err->msg says so), HP_EBUSY (queue full),
 * HP_ENOMEM, or hp_sched_drain's status. Thread-safe.
 */
int hp_sched_submit(hp_sched_t *s, const hp_sched_req_t *req, hp_error_t *err);

/*
 * Draining (SIGTERM): every request queued and not yet admitted ends at
 * the next step with done(status, msg), and hp_sched_submit refuses new
 * ones the same way; those admitted run on. Thread-safe; for good.
 */
void hp_sched_drain(hp_sched_t *s, int status, const char *msg);

/* Wakes the scheduler: a cancel flag was set, or a stalled request's
 * reader made room. Thread-safe, cheap. */
void hp_sched_kick(hp_sched_t *s);

void hp_sched_stats(hp_sched_t *s, hp_sched_stats_t *st);

/* The prefill chunk a model's backend runs well: 256 tokens on the CPU,
 * where a long prompt must not hold the decoding streams back for long;
 * the device's prefill piece (HP_FWD_PIECE_DEVICE, 4096) on a device,
 * whose GEMMs and chunked GDN want long rows (a step of 256 leaves an H100
 * mostly idle) and where a chunk takes tens of milliseconds (~40 ms of a
 * 9B-like model's 8 layers on an H200; SGLang's chunked prefill on such
 * cards takes 4096-8192 tokens a step). */
int hp_sched_prefill_chunk(const hp_model_t *m);

/* Stops the thread; every request still held gets done(CANCEL). */
void hp_sched_destroy(hp_sched_t *s);

/* ---- run-time settings (serve's SIGHUP) ------------------------------ */

typedef struct {
    int max_queue;   /* as hp_sched_cfg_t; <= 0: unchanged */
    int throttle_ms; /* as hp_sched_cfg_t */
    int decode;      /* HP_SCHED_DECODE_*, for requests not yet decoding */
} hp_sched_tune_t;

/*
 * Changes these settings of a running scheduler; submissions and steps
 * from now on use them. HP_OK, or HP_EBADINPUT (nothing changed) for
 * chunkwise decode on a scheduler created recurrent: its KVBuffer pool
 * is sized at creation. Thread-safe.
 */
int hp_sched_tune(hp_sched_t *s, const hp_sched_tune_t *t, hp_error_t *err);

#endif
