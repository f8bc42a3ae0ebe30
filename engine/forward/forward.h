/*
 * forward.h - the model's forward pass over a batch of tokens of one
 * sequence: prefill (many tokens, chunked GDN) and decode (one token,
 * recurrent GDN), on the CPU kernels; and one decode step of many
 * sequences at once (hp_forward_batch: each weight read once per step).
 *
 * Tokens carry explicit positions (RoPE and the causal mask use them) and
 * their K/V go to those positions of the sequence's cache; linear layers
 * read them in order. A prefill may be split into jumps: after token
 * index `after` every linear layer hands its state and conv history to a
 * callback (the PIC assembler composes a cached segment there, DESIGN §4),
 * and the full layers see whatever K/V the caller pre-filled at the
 * positions that were jumped over.
 */
#ifndef HP_FORWARD_H
#define HP_FORWARD_H

#include "engine/contract/hp_error.h"
#include "engine/forward/seq.h"
#include "engine/model/model.h"

/* Where a verification's raw conv inputs wait for hp_forward_accept. */
typedef struct {
    const void *seq; /* the hp_seq_t verified */
    int row;         /* its first row in the saved inputs */
} hp_fwd_spec_t;

/*
 * The largest call a workspace serves, fixed when it is made: its
 * activation buffers are sized from this and the model's config and
 * allocated once, so no call allocates. Its owner sizes it: the scheduler
 * from its batch, prefill chunk, draft limit and max_context; a prefill
 * worker or peer from hp_fwd_piece; tools and tests from their own calls.
 * hp_forward runs a longer call in pieces of max_tokens (same results up
 * to f32 rounding); a batch, an item or a context beyond the plan is
 * refused with HP_ETOOLARGE naming the limit.
 */
typedef struct {
    int max_tokens; /* most tokens of one pass (a prefill piece) */
    int max_ctx;    /* most positions of a sequence; 0: max_positions */
    int max_batch;  /* most sequences of one hp_forward_batch */
    int max_step;   /* most tokens of a batched item: 1 + drafts */
} hp_fwd_plan_t;

/* The prefill piece of the caches and a one-sequence workspace's plan
 * (plan NULL) on the CPU: pieces of 1024 tokens, one sequence verifying up
 * to 16 drafts, contexts up to the model's max_positions. A device's piece
 * is HP_FWD_PIECE_DEVICE (hp_fwd_piece): bigger GEMMs and a quarter of the
 * launches, 1.13-1.28x the prefill's tokens/s at 4k-16k on an H200
 * (bench/results/gpu/2026-11-28-h200). */
#define HP_FWD_PIECE        1024
#define HP_FWD_PIECE_DEVICE 4096
#define HP_FWD_MAX_STEP     17
/* The most rows of logits a device workspace holds at once: a pass asking
 * for every row's (HP_LOGITS_ALL) downloads them in slices of this many,
 * so a piece does not cost its rows x the vocabulary (4 GB at 4096 x
 * 248k) in device memory. */
#define HP_FWD_LOGIT_ROWS 256

/* The prefill piece for m's backend: HP_FWD_PIECE on the CPU,
 * HP_FWD_PIECE_DEVICE on a device. */
int hp_fwd_piece(const hp_model_t *m);

/* Activation buffers of a plan, carved out of one allocation of the
 * model's backend (and a small host one: tables, host arrays), reused
 * across calls. Also remembers the last batch's verifications
 * (hp_forward_accept reads them). */
typedef struct {
    hp_fwd_plan_t plan;     /* as resolved (max_ctx filled in) */
    const hp_backend_t *be; /* the model's */
    void *mem;              /* the host allocation */
    void *dev;              /* the backend allocation */
    float **buf;            /* [n] buffers in dev or mem */
    size_t *cap;            /* [n] their floats */
    int n;
    hp_fwd_spec_t *spec; /* [max_batch] */
    int n_spec;
    int spec_rows; /* rows of every saved layer */
    /* The sequence the segment builds of this workspace's thread run in
     * (segcache.h), its owner's (not freed here; set after init): reset
     * and reused per segment, so a server that takes it from its
     * sequence pool at start makes no allocation per segment. NULL: each
     * build makes a sequence of its own. */
    hp_seq_t *build_seq;
} hp_fwd_ws_t;

/* Plans and allocates a workspace for model m (plan NULL: the default
 * above). HP_EBADINPUT (a bad plan), HP_ENOMEM; ws is then empty (free
 * is safe). */
int hp_fwd_ws_init(hp_fwd_ws_t *ws, const hp_model_t *m,
                   const hp_fwd_plan_t *plan, hp_error_t *err);
void hp_fwd_ws_free(hp_fwd_ws_t *ws);
/* Bytes a plan allocates for model m. */
size_t hp_fwd_ws_bytes(const hp_model_t *m, const hp_fwd_plan_t *plan);

/* Called at a linear layer after run `jump` (tokens up to after[jump]):
 * may read or update S [Hv,dk,dv] and conv [conv_dim, Kc-1] in place for
 * what is skipped before the next run. Tc [Hv,dk,dk] is the transition
 * over the run just finished when it was asked for (tc_run), else NULL. */
typedef int (*hp_jump_fn)(void *ud, int layer, int jump, float *S, float *conv,
                          const float *Tc, hp_error_t *err);

typedef struct {
    const int *after; /* [n] token index (exclusive end of a run), rising */
    int n;
    int tc_run; /* run whose transition the callback gets, -1 for none */
    hp_jump_fn fn;
    void *ud;
} hp_jumps_t;

/* Backend memory of the workspace for the jump callbacks (the PIC
 * capture's T_C S_head, the compositions' scratch): s a state
 * [Hv,dk,dv], scr trans_compose's scratch [Hv,dk,dv]. The forward pass
 * never touches them; both NULL for a model without linear layers or an
 * empty workspace. */
typedef struct {
    float *s, *scr;
} hp_fwd_jump_mem_t;
hp_fwd_jump_mem_t hp_fwd_jump_mem(hp_fwd_ws_t *ws);

typedef enum {
    HP_LOGITS_NONE = 0,
    HP_LOGITS_LAST, /* logits [vocab] of the last token */
    HP_LOGITS_ALL   /* logits [T, vocab] */
} hp_logits_mode_t;

/*
 * Runs T tokens ids[T] at positions pos[T] (NULL: seq->n_pos .. + T-1)
 * through the model, updating seq (states, K/V; n_pos becomes
 * max(n_pos, last pos + 1)), in pieces of the plan's max_tokens (jumps
 * and a transition run may span pieces). jumps may be NULL. Writes
 * logits per mode into `logits` (caller-sized). The linear layers run the
 * chunked form
 * (hk_gdn_chunk) for T > 1 and the recurrent one for T = 1. Returns HP_OK,
 * HP_EBADINPUT (token id out of range), HP_ETOOLARGE (a position past the
 * plan's max_ctx) or HP_ENOMEM.
 */
int hp_forward(const hp_model_t *m, hp_seq_t *seq, hp_fwd_ws_t *ws,
               const int *ids, const int *pos, int T, const hp_jumps_t *jumps,
               hp_logits_mode_t mode, float *logits, hp_error_t *err);

/* One sequence's part of a batched step (hp_forward_batch). */
typedef struct {
    hp_seq_t *seq;
    const int *ids; /* [T] tokens, continuing at seq->n_pos */
    int T;          /* 1, or with verify 1..the pool's max_step */
    int verify;     /* ids = [x0, drafts]: hp_forward_accept must follow */
    int argmax;     /* only each row's argmax is wanted (greedy sampling):
                       on a device the logits then stay there */
    /* > 0 (a one-token step, not a verification): on a device, the row's
     * sampler candidates (hp_backend_topk: hp_fwd_topk(m) of them, at
     * temperature 1/inv_t) are wanted first; the logits stay there
     * (hp_forward_fetch_logits gets them when the candidates cannot
     * decide). Ignored where backend memory is host memory. */
    int topk;
    double inv_t;
    /* with topk: what its log-probabilities need comes too (cand_raw,
     * cand_lse; hp_logprobs_from), so they need no logits either */
    int logprobs;
    /* out, host memory in ws, valid until ws's next use */
    float *logits;       /* [T, vocab] (the caller may overwrite them); NULL
                            with argmax where backend memory is not host memory */
    const int *best;     /* with argmax: [T], each row's argmax (hp_argmax's
                            rule: lowest index among equals) */
    const float *cand_p; /* with topk on a device: [k] the candidates' */
    const int *cand_idx; /* probabilities and tokens (hk_topk's order) */
    /* with logprobs too: [k] their raw logits, [1] the row's log-sum-exp */
    const float *cand_raw;
    const double *cand_lse;
    int row;        /* the item's first row in the step */
    int status;     /* HP_OK, or why this sequence did not run */
    hp_error_t err; /* status != HP_OK: the message */
} hp_fwd_item_t;

/*
 * One step of n sequences as one pass: the embedding, projections, MLPs
 * and LM head run as one call over every row (each weight read once per
 * step); the one-token steps' conv, recurrence, K/V stores and attention
 * as one call each over their caches (the KVBuffer decode steps of
 * sequences sharing a pool in one hp_kvbuf_decode call), so the backend
 * ops a step issues and its host-link transfers do not grow with them;
 * a verification's per sequence. A sequence's results equal its own
 * hp_forward's to f32 rounding (GEMM vs GEMV sums).
 *
 * Each item is checked first (tokens, positions, the plan's max_step and
 * max_ctx, KVBuffer room for every layer): one that fails gets status/err and
 * is left out, unchanged. An error once layers run (HP_ENOMEM) ends the step
 * for all: the return value, verifications rolled back, other sequences left
 * half advanced. More items than the plan's max_batch: HP_ETOOLARGE, nothing
 * run. Returns HP_OK otherwise.
 */
int hp_forward_batch(const hp_model_t *m, hp_fwd_item_t *items, int n,
                     hp_fwd_ws_t *ws, hp_error_t *err);

/* The candidates a topk item gets: min(HP_BACKEND_TOPK_MAX,
 * m->sample_vocab). */
int hp_fwd_topk(const hp_model_t *m);

/* After hp_forward_batch, before the workspace's next use: the logits of
 * an item that got only its argmax or candidates, copied to host memory
 * (it->logits). */
int hp_forward_fetch_logits(const hp_model_t *m, hp_fwd_ws_t *ws,
                            hp_fwd_item_t *it, hp_error_t *err);

/*
 * Speculative verification through the KVBuffer (seq's buffers open,
 * hp_seq_kvbuf_open): runs ids[T] = [x0, d_1 .. d_{T-1}] (x0 the last
 * token not yet fed, d the drafts; T <= the pool's max_step) and writes
 * logits [T, vocab], row j the distribution after ids[j]. Nothing is
 * final until hp_forward_accept: the linear layers hold the tokens as
 * pending buffer entries and convolve on a copy of their history. On
 * error the sequence is left as before. HP_EBADINPUT, HP_EBUSY, HP_ENOMEM.
 * (A batch of one verify item.)
 */
int hp_forward_verify(const hp_model_t *m, hp_seq_t *seq, hp_fwd_ws_t *ws,
                      const int *ids, int T, float *logits, hp_error_t *err);
/* Keeps the first `keep` verified tokens (0..T; m accepted drafts: m + 1):
 * the linear layers drop the other entries and roll their conv history
 * over the kept raw inputs only; the sequence continues at position
 * start + keep (K/V written at later positions are overwritten by the next
 * tokens). Must follow the verification (hp_forward_verify, or a verify
 * item of hp_forward_batch) with the same ws, before ws's next batch. */
int hp_forward_accept(const hp_model_t *m, hp_seq_t *seq, hp_fwd_ws_t *ws,
                      int keep, hp_error_t *err);

/* Prefill in pieces of at most `piece` tokens (<= 0: hp_fwd_piece; the
 * plan may split them further), logits of the last token if
 * logits != NULL. */
int hp_prefill(const hp_model_t *m, hp_seq_t *seq, hp_fwd_ws_t *ws,
               const int *ids, int T, int piece, float *logits,
               hp_error_t *err);

#endif
