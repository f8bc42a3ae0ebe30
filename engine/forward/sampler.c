/* sampler.c - greedy and filtered temperature sampling (see sampler.h). */
#include "engine/forward/sampler.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "engine/backend/backend.h"
#include "kernels/common/hk_select.h"

/* Sorting (probability, index) pairs keeps qsort free of hidden state. */
typedef struct {
    float p;
    int i;
} pair_t;

static uint64_t rotl(uint64_t x, int k)
{
    return (x << k) | (x >> (64 - k));
}

static uint64_t splitmix64(uint64_t *x)
{
    uint64_t z = (*x += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

void hp_rng_seed(hp_rng_t *r, uint64_t seed)
{
    for (int i = 0; i < 4; i++)
        r->s[i] = splitmix64(&seed);
}

static uint64_t rng_next(hp_rng_t *r)
{
    uint64_t *s = r->s;
    uint64_t result = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return result;
}

double hp_rng_uniform(hp_rng_t *r)
{
    return (double)(rng_next(r) >> 11) * (1.0 / 9007199254740992.0);
}

int hp_sampler_init(hp_sampler_t *s, int V)
{
    s->V = V;
    s->prob = malloc((size_t)V * sizeof(float));
    s->idx = malloc((size_t)V * sizeof(int));
    s->pairs = malloc((size_t)V * sizeof(pair_t));
    return s->prob && s->idx && s->pairs ? 0 : -1;
}

void hp_sampler_free(hp_sampler_t *s)
{
    free(s->prob);
    free(s->idx);
    free(s->pairs);
    memset(s, 0, sizeof(*s));
}

int hp_argmax(const float *logits, int V)
{
    int best;
    hp_backend_argmax(hp_backend_cpu(), &best, logits, 1, V, V);
    return best;
}

static int pair_desc(const void *a, const void *b)
{
    const pair_t *x = a, *y = b;
    if (x->p != y->p)
        return x->p < y->p ? 1 : -1;
    return x->i - y->i;
}

/* Keeps the candidate set in s->idx[0..n) sorted by falling probability,
 * with s->prob the renormalized probabilities; returns n. */
static int filtered(hp_sampler_t *s, const float *logits,
                    const hp_sampling_t *p)
{
    int V = s->V;
    float mx = logits[hp_argmax(logits, V)];
    double inv_t = 1.0 / p->temperature, sum = 0.0;
    for (int i = 0; i < V; i++) {
        s->prob[i] = (float)exp((logits[i] - mx) * inv_t);
        sum += s->prob[i];
    }
    /* Sort only the head that top-k can keep; top-p alone sorts all. */
    pair_t *pairs = s->pairs;
    for (int i = 0; i < V; i++)
        pairs[i] = (pair_t){(float)(s->prob[i] / sum), i};
    qsort(pairs, V, sizeof(pair_t), pair_desc);
    int n = V;
    if (p->top_k > 0 && p->top_k < n)
        n = p->top_k;
    if (p->top_p > 0.0f && p->top_p < 1.0f) {
        double cum = 0.0;
        int keep = 0;
        while (keep < n) {
            cum += pairs[keep].p;
            keep++;
            if (cum >= p->top_p)
                break;
        }
        n = keep;
    }
    double z = 0.0;
    for (int i = 0; i < n; i++)
        z += pairs[i].p;
    for (int i = 0; i < n; i++) {
        s->idx[i] = pairs[i].i;
        s->prob[pairs[i].i] = (float)(pairs[i].p / z);
    }
    return n;
}

int hp_sample(hp_sampler_t *s, const float *logits, const hp_sampling_t *p,
              hp_rng_t *rng)
{
    if (p->temperature <= 0.0f)
        return hp_argmax(logits, s->V);
    int n = filtered(s, logits, p);
    double u = hp_rng_uniform(rng), cum = 0.0;
    for (int i = 0; i < n; i++) {
        cum += s->prob[s->idx[i]];
        if (u < cum)
            return s->idx[i];
    }
    return s->idx[n - 1];
}

void hp_sampler_probs(hp_sampler_t *s, float *out, const float *logits,
                      const hp_sampling_t *p)
{
    memset(out, 0, (size_t)s->V * sizeof(float));
    if (p->temperature <= 0.0f) {
        out[hp_argmax(logits, s->V)] = 1.0f;
        return;
    }
    int n = filtered(s, logits, p);
    for (int i = 0; i < n; i++)
        out[s->idx[i]] = s->prob[s->idx[i]];
}

void hp_logprobs(hp_logprobs_t *out, const float *logits, int V, int token,
                 int n_top)
{
    hp_logprobs_from(out, hp_backend_lse(logits, V), logits, NULL, V, token,
                     n_top);
}

int hp_logprobs_from(hp_logprobs_t *out, double lse, const float *raw,
                     const int *ids, int k, int token, int n_top)
{
    int at = ids ? -1 : token, n = 0;

    if (n_top > HP_LOGPROBS_MAX_TOP)
        n_top = HP_LOGPROBS_MAX_TOP;
    if (n_top > k)
        n_top = k;
    /* the top n_top by insertion: a logit enters only past the last kept
     * one, so the candidates are read once */
    for (int j = 0; j < k && (n_top > 0 || at < 0); j++) {
        const int id = ids ? ids[j] : j;
        const float l = raw[j];
        if (id == token)
            at = j;
        if (n_top == 0 || l == -INFINITY) /* masked by a grammar: no choice */
            continue;
        if (n == n_top &&
            !hk_sel_before(l, id, out->top_lp[n - 1], out->top_id[n - 1]))
            continue;
        int i = n < n_top ? n++ : n - 1;
        for (; i > 0 &&
               hk_sel_before(l, id, out->top_lp[i - 1], out->top_id[i - 1]);
             i--) {
            out->top_lp[i] = out->top_lp[i - 1];
            out->top_id[i] = out->top_id[i - 1];
        }
        out->top_lp[i] = l;
        out->top_id[i] = id;
    }
    if (at < 0)
        return -1;
    for (int i = 0; i < n; i++)
        out->top_lp[i] = (float)((double)out->top_lp[i] - lse);
    out->n_top = n;
    out->token = token;
    out->logprob = (float)((double)raw[at] - lse);
    return 0;
}

int hp_logprobs_first(const float *raw, const int *ids, int k)
{
    int f = 0;
    for (int j = 1; j < k; j++)
        if (hk_sel_before(raw[j], ids[j], raw[f], ids[f]))
            f = j;
    return ids[f];
}

uint64_t hp_sampling_choice_seed(uint64_t seed, int choice)
{
    /* a fixed odd stride: hp_rng_seed's splitmix decorrelates the rest */
    return seed + (uint64_t)choice * 0x9e3779b97f4a7c15ULL;
}
