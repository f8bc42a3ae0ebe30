/*
 * prefix_cache.h - the exact prefix cache of the `prefix` mode (DESIGN §6)
 * for hybrid models: a radix tree over token ids (radix.h) whose edges
 * keep the full-attention K/V of their tokens and whose nodes keep the
 * linear-layer states (S, conv) only at admitted checkpoints. A request
 * resumes from the deepest checkpoint at or before where its prompt
 * leaves the tree (states from that node, K/V from the path) and
 * recomputes the rest with hp_forward: outputs equal a full prefill.
 * Made without tensors the same object is a token-level simulator (byte
 * and FLOP bookkeeping: the benchmark, the alpha replay). Thread-safe:
 * one mutex; the forward pass between begin and admit runs outside it,
 * the request's path pinned. Not a PIC pool: no position independence.
 */
#ifndef HP_PREFIX_CACHE_H
#define HP_PREFIX_CACHE_H

#include <stddef.h>
#include <stdint.h>

#include "engine/contract/hp_error.h"
#include "engine/forward/forward.h"
#include "engine/forward/seq.h"
#include "engine/model/model.h"

#define HP_PC_MAX_ALPHAS 16

typedef enum {
    HP_PC_ADMIT_MARCONI = 0, /* branch points + the last decoded token */
    HP_PC_ADMIT_BLOCK        /* every `block` tokens (vLLM+ baseline) */
} hp_pc_admit_t;

/*
 * Admission (Marconi, papers/001 §4.1): a speculative insertion of the
 * prompt before the prefill finds the branch point it would create; the
 * state there is captured during the prefill (n - 1 for a prompt found
 * whole: its last token is always recomputed), and after decoding the
 * state of the last decoded token; nothing else. Or a checkpoint every
 * `block` tokens (the vLLM-style baseline). Optional sparse checkpoints
 * in the recomputed stretch come from the overlap-depth DP (ckpt_dp.h,
 * papers/002) over an exponentially weighted histogram of the depths
 * where requests left the tree (balanced placement until it holds enough
 * mass); one is kept only if it saves dp_min_gain of the mean prompt in
 * recompute per future request: a state costs megabytes, and the pooled
 * depths of unrelated sessions (chat) must not buy one.
 *
 * Eviction (Marconi §4.2-4.3): among nodes with at most one child that no
 * running request holds, the lowest recency + alpha * FLOPs saved per
 * byte (both min-max normalised over the candidates; FLOPs from the
 * nearest checkpointed ancestor, from the model config, attention growing
 * with depth). A leaf goes with its K/V; a node with one child drops its
 * states and its K/V joins the child's edge. alpha is 0 until the first
 * eviction; then a window of requests is recorded and replayed over a
 * grid of alphas on a snapshot of the tree in a background thread, and
 * the alpha with the best token hit rate is adopted.
 */
typedef struct {
    size_t budget;       /* bytes of K/V + states the tree may hold */
    hp_pc_admit_t admit; /* which checkpoints are taken */
    int block;           /* HP_PC_ADMIT_BLOCK spacing */
    int touch_path;      /* a hit refreshes the whole path (vLLM) instead
                            of only the node resumed from (Marconi) */
    double alpha;        /* FLOP weight of the eviction score */
    int tune;            /* bootstrap alpha search (Marconi) */
    int tune_async;      /* the search in a pthread (else inline) */
    int bootstrap_mult;  /* window = mult x requests before 1st eviction */
    int bootstrap_min;   /* ... and at least this many */
    int bootstrap_max;   /* ... and at most this many */
    int retune;          /* after adopting alpha, record a new window
                            and search again (0: once, as Marconi) */
    double alphas[HP_PC_MAX_ALPHAS]; /* the grid */
    int n_alphas;
    int sparse;         /* DP checkpoints per request (0: none) */
    double dp_gamma;    /* histogram decay per request (0.99) */
    double dp_min_mass; /* below this (requests), balanced placement */
    double dp_min_gain; /* a DP checkpoint must save this fraction of
                           the mean prompt in expected recompute per
                           future request */
    int dp_max_depth;   /* histogram depths 1..this */
} hp_prefix_cache_params_t;

/* Marconi defaults: judicious admission, FLOP-aware eviction with alpha
 * tuned in the background, no sparse checkpoints, `budget` bytes. */
void hp_prefix_cache_params_default(hp_prefix_cache_params_t *p, size_t budget);

typedef struct hp_prefix_cache hp_prefix_cache_t;

/* Where the alpha search stands (prefix_tune.c). */
typedef enum {
    HP_PC_TUNE_WAIT = 0,   /* before the first eviction */
    HP_PC_TUNE_RECORD = 1, /* recording the window of requests */
    HP_PC_TUNE_SEARCH = 2, /* replaying it over the grid of alphas */
    HP_PC_TUNE_DONE = 3    /* alpha adopted, or no search possible */
} hp_pc_tune_phase_t;

/* One request between begin and finish/release. Caller-owned struct;
 * the arrays are the cache's (freed by finish/release). */
typedef struct {
    int n;        /* prompt tokens */
    int match;    /* tokens of the prompt found in the tree */
    int resume;   /* tokens restored: the prefill starts here */
    int *ckpt;    /* [n_ckpt] rising positions in (resume, n] whose */
    int n_ckpt;   /*   states the prefill must capture */
    float **snap; /* [n_ckpt] the captured states (tensor mode): blobs
                     of the private pool, backend memory */
    int admitted; /* the prompt entered the tree */
    /* private */
    int *ids;
    void *pin;
    int active;
} hp_prefix_cache_req_t;

typedef struct {
    uint64_t requests;
    uint64_t prompt_tokens;
    uint64_t hit_tokens; /* tokens restored instead of recomputed */
    double prompt_flops; /* prefill FLOPs of the prompts */
    double saved_flops;  /* ... that resuming skipped */
    uint64_t states_admitted, states_evicted, nodes_evicted;
    uint64_t rejected;        /* admissions skipped: no room */
    uint64_t arena_evictions; /* for a free run the byte count had room
                                 for (fragmentation, a split's copy) */
    uint64_t skipped;         /* captures not taken: no room for them */
    size_t bytes_used, kv_bytes, state_bytes, budget;
    size_t snap_bytes; /* running requests' snapshots (not in bytes_used) */
    int nodes, states;
    double alpha;
    hp_pc_tune_phase_t tune_phase;
    double tune_hit[HP_PC_MAX_ALPHAS]; /* token hit rate per grid alpha */
} hp_prefix_cache_stats_t;

/*
 * A cache for models of config cfg (copied). be: keep K/V and states in
 * its memory, the models' backend (NULL: simulate, allocating nothing
 * for tensors). The private pool, budget bytes of backend memory, is
 * made now (on a host-memory backend a mapping touched on use); node
 * K/V, checkpoints and requests' snapshots are blobs in it, copied on
 * the backend, so a device resume or capture moves nothing over the
 * host link and no request allocates backend memory. A blob that finds
 * no free run large enough where the byte count has room (fragmentation)
 * evicts more by the cache's policy until one is; a capture that still
 * finds none is skipped (stats: arena_evictions, skipped). Errors:
 * HP_EBADINPUT (bad params), HP_ENOMEM (naming the budget).
 */
hp_prefix_cache_t *hp_prefix_cache_create(const hp_model_config_t *cfg,
                                          const hp_prefix_cache_params_t *p,
                                          const hp_backend_t *be,
                                          hp_error_t *err);
/* Joins a running alpha search; every request must be finished or
 * released before. */
void hp_prefix_cache_destroy(hp_prefix_cache_t *pc);

/* FLOPs of prefilling positions [a, b) after a context of a tokens. */
double hp_prefix_cache_flops(const hp_prefix_cache_t *pc, int a, int b);
/* Bytes of one checkpoint (all linear layers) and of one token's K/V. */
size_t hp_prefix_cache_state_bytes(const hp_prefix_cache_t *pc);
size_t hp_prefix_cache_kv_bytes(const hp_prefix_cache_t *pc);

/*
 * Looks ids[0..n) up (n >= 1): req gets the match, the resume depth (the
 * deepest checkpoint at or before min(match, n - 1)) and the positions to
 * capture; the path to the resume node is pinned. hint: a position the
 * caller knows many requests share (the end of the lead segment, DESIGN
 * §3), captured too when it lies in (resume, n); -1 for none. With seq
 * (tensor mode) the sequence is reset and gets the state at the resume
 * depth. Every successful begin needs a finish or a release.
 * Errors: HP_EBADINPUT (n < 1, seq given to a simulator), HP_ENOMEM.
 */
int hp_prefix_cache_begin(hp_prefix_cache_t *pc, const int *ids, int n,
                          int hint, hp_seq_t *seq, hp_prefix_cache_req_t *req,
                          hp_error_t *err);

/* After the prefill of req's prompt (seq->n_pos == n, req->snap filled
 * in tensor mode): inserts the prompt, with its K/V from seq and the
 * captured states at req->ckpt, evicting to make room. No room is not an
 * error (req->admitted stays 0). Errors: HP_EBADINPUT, HP_ENOMEM. */
int hp_prefix_cache_admit(hp_prefix_cache_t *pc, hp_prefix_cache_req_t *req,
                          const hp_seq_t *seq, hp_error_t *err);

/*
 * After decoding: the sequence is the prompt followed by out[0..k), with
 * k = seq->n_pos - n in tensor mode (the tokens the model consumed;
 * n_out >= k) and k = n_out when simulating. Inserts it and checkpoints
 * its last token (seq's current state), then ends the request (pins
 * dropped, arrays freed). n_out = 0: the prompt's last token is the last
 * decoded one. Errors: HP_EBADINPUT, HP_ENOMEM (the request still ends).
 */
int hp_prefix_cache_finish(hp_prefix_cache_t *pc, hp_prefix_cache_req_t *req,
                           const int *out, int n_out, const hp_seq_t *seq,
                           hp_error_t *err);

/* Ends a request without a checkpoint (error, cancel). Idempotent. */
void hp_prefix_cache_release(hp_prefix_cache_t *pc, hp_prefix_cache_req_t *req);

/*
 * The whole prefill of the `prefix` mode: begin (restore into seq, fresh
 * from hp_seq_init), hp_forward over [resume, n) in pieces of at most
 * 1024 tokens capturing the states at req->ckpt, admit; logits [vocab]
 * of the last token if logits != NULL. A failed admission is not an
 * error (req->admitted stays 0). On error the request is released; on
 * success the caller decodes and calls hp_prefix_cache_finish (or
 * release). Errors: as begin, forward errors.
 */
int hp_prefix_cache_prefill(hp_prefix_cache_t *pc, const hp_model_t *m,
                            hp_fwd_ws_t *ws, const int *ids, int n, int hint,
                            hp_seq_t *seq, float *logits,
                            hp_prefix_cache_req_t *req, hp_error_t *err);

void hp_prefix_cache_stats(hp_prefix_cache_t *pc, hp_prefix_cache_stats_t *out);

/* The checkpoints held: up to max depths, and with paths != NULL each
 * one's tokens (malloc'd, the caller frees). Returns how many exist. */
int hp_prefix_cache_checkpoints(hp_prefix_cache_t *pc, int *depths, int **paths,
                                int max);

/* Drops every entry no request holds (a model reload, a benchmark's
 * fresh start); counters, histogram and alpha stay. */
void hp_prefix_cache_clear(hp_prefix_cache_t *pc);

/* Evicts the single best victim now (tests, tools); returns its depth,
 * or -1 when nothing can be evicted. */
int hp_prefix_cache_evict_one(hp_prefix_cache_t *pc);

/* Waits for a running alpha search and adopts its result. */
void hp_prefix_cache_tune_wait(hp_prefix_cache_t *pc);

/* A recorded request for replay: prompt ids[0..n_prompt), then the
 * rest of the sequence up to n. */
typedef struct {
    const int *ids;
    int n_prompt, n;
} hp_prefix_cache_trace_t;

/* Token hit rate of replaying trace[0..n) on a simulator copy of pc
 * (its tree, clock and histogram) with the given alpha and no tuning.
 * Returns a rate in [0, 1], or -1 on HP_ENOMEM. */
double hp_prefix_cache_replay(hp_prefix_cache_t *pc,
                              const hp_prefix_cache_trace_t *trace, int n,
                              double alpha, hp_error_t *err);

#endif
