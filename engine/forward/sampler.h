/*
 * sampler.h - next-token choice from logits: greedy, or temperature with
 * top-k / top-p, from a seeded generator (same seed, same tokens).
 */
#ifndef HP_SAMPLER_H
#define HP_SAMPLER_H

#include <stdint.h>

typedef struct {
    float temperature; /* 0: greedy (argmax, lowest index on ties) */
    int top_k;         /* 0: off */
    float top_p;       /* 1: off */
    uint64_t seed;
} hp_sampling_t;

typedef struct {
    uint64_t s[4]; /* xoshiro256** */
} hp_rng_t;

void hp_rng_seed(hp_rng_t *r, uint64_t seed);
/* Uniform in [0, 1). */
double hp_rng_uniform(hp_rng_t *r);

/* Scratch the sampler needs for a vocabulary of V. */
typedef struct {
    float *prob; /* [V] */
    int *idx;    /* [V] */
    void *pairs; /* [V] (probability, index) sort buffer */
    int V;
} hp_sampler_t;

int hp_sampler_init(hp_sampler_t *s, int V);
void hp_sampler_free(hp_sampler_t *s);

/* Index of the largest logit (lowest index among equals). */
int hp_argmax(const float *logits, int V);

/* Picks the next token. logits are not modified. */
int hp_sample(hp_sampler_t *s, const float *logits, const hp_sampling_t *p,
              hp_rng_t *rng);

/* Most alternatives a token's log-probabilities list (OpenAI's 20). */
#define HP_LOGPROBS_MAX_TOP 20

/* A token's log-probability and the likeliest alternatives. */
typedef struct {
    int token;
    float logprob;
    int n_top;                       /* alternatives in top_* */
    int top_id[HP_LOGPROBS_MAX_TOP]; /* by falling logprob, lower id first */
    float top_lp[HP_LOGPROBS_MAX_TOP];
} hp_logprobs_t;

/*
 * Log-probabilities of the model's own distribution, log_softmax of the
 * raw logits[0..V) (before temperature, top-k and top-p, as vLLM's
 * default "raw_logprobs" and OpenAI report them): token's, and the
 * n_top (<= HP_LOGPROBS_MAX_TOP) likeliest tokens'. The normalizer is
 * summed in double.
 */
void hp_logprobs(hp_logprobs_t *out, const float *logits, int V, int token,
                 int n_top);
/*
 * hp_logprobs from what a device sends instead of the row: lse, the row's
 * log-sum-exp of its raw logits, and k candidates, raw logits raw[k] of
 * tokens ids[k] (NULL: ids 0..k-1) in any order, among them the row's
 * n_top largest (hp_backend_topk's). Returns 0, or -1 where token is not
 * a candidate (out then unset). hp_logprobs is this over the whole row.
 */
int hp_logprobs_from(hp_logprobs_t *out, double lse, const float *raw,
                     const int *ids, int k, int token, int n_top);
/* The first of k candidates (raw logits raw[k] of tokens ids[k]) by raw
 * logit, then lower id: hp_argmax's choice where they hold the row's
 * largest. */
int hp_logprobs_first(const float *raw, const int *ids, int k);

/* The seed of choice i of a request seeded `seed` (n > 1 choices): choice
 * 0 keeps the seed, so a choice is the run of one request with its seed. */
uint64_t hp_sampling_choice_seed(uint64_t seed, int choice);

/* Probabilities after temperature / top-k / top-p filtering, written to
 * out[V] (zeros outside the kept set): the distribution hp_sample draws
 * from, used by speculative acceptance and tests. */
void hp_sampler_probs(hp_sampler_t *s, float *out, const float *logits,
                      const hp_sampling_t *p);

#endif
