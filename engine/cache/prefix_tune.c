/*
 * prefix_tune.c - the prefix cache's alpha search (Marconi §4.3,
 * prefix_cache.h): after the first eviction a window of requests is
 * recorded, then replayed on a simulator copy of the tree over the grid
 * of alphas (in a thread of its own), and the alpha with the best token
 * hit rate is adopted.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "engine/cache/prefix_cache_impl.h"

#define TRACE_MAX_TOKENS (1 << 26) /* bootstrap window cap, in tokens */

typedef struct hp_pc_tune_job {
    hp_prefix_cache_t *snap; /* simulator copy at the first eviction */
    hp_prefix_cache_trace_t *tr;
    int n_tr;
    double alphas[HP_PC_MAX_ALPHAS];
    int n_alphas;
    double hit[HP_PC_MAX_ALPHAS];
    double best;
    atomic_int done;
    int threaded;
    pthread_t th;
} tune_job_t;

static hp_prefix_cache_t *clone_sim(hp_prefix_cache_t *src, double alpha,
                                    hp_error_t *err);
static double replay_on(hp_prefix_cache_t *base,
                        const hp_prefix_cache_trace_t *tr, int n, double alpha,
                        hp_error_t *err);

static void *tune_main(void *arg)
{
    tune_job_t *j = arg;
    hp_error_t err = {0};
    int best = 0;
    for (int i = 0; i < j->n_alphas; i++) {
        j->hit[i] = replay_on(j->snap, j->tr, j->n_tr, j->alphas[i], &err);
        if (j->hit[i] > j->hit[best])
            best = i;
    }
    j->best = j->alphas[best];
    atomic_store(&j->done, 1);
    return NULL;
}

static void trace_free(hp_prefix_cache_trace_t *tr, int n)
{
    for (int i = 0; i < n; i++)
        free((void *)tr[i].ids);
    free(tr);
}

static void job_free(tune_job_t *j)
{
    hp_prefix_cache_destroy(j->snap);
    trace_free(j->tr, j->n_tr);
    free(j);
}

/* Adopts a finished search (wait: block until it is). Locked. */
void hp_pc_tune_poll(hp_prefix_cache_t *pc, int wait)
{
    tune_job_t *j = pc->job;
    if (!j || (!wait && !atomic_load(&j->done)))
        return;
    if (j->threaded)
        pthread_join(j->th, NULL);
    pc->p.alpha = j->best;
    memcpy(pc->tune_hit, j->hit, sizeof(j->hit));
    pc->phase = HP_PC_TUNE_DONE;
    pc->job = NULL;
    job_free(j);
}

static void tune_start(hp_prefix_cache_t *pc)
{
    tune_job_t *j = calloc(1, sizeof(*j));
    if (!j) { /* no memory for the search: keep the current alpha */
        pc->phase = HP_PC_TUNE_DONE;
        return;
    }
    j->snap = pc->snap;
    j->tr = pc->rec;
    j->n_tr = pc->n_rec;
    j->n_alphas = pc->p.n_alphas;
    memcpy(j->alphas, pc->p.alphas, sizeof(j->alphas));
    pc->snap = NULL;
    pc->rec = NULL;
    pc->n_rec = pc->cap_rec = 0;
    pc->rec_tokens = 0;
    pc->job = j;
    pc->phase = HP_PC_TUNE_SEARCH;
    j->threaded =
        pc->p.tune_async && pthread_create(&j->th, NULL, tune_main, j) == 0;
    if (!j->threaded) {
        tune_main(j);
        hp_pc_tune_poll(pc, 1);
    }
}

/* After each call that may have evicted: the bootstrap state machine. */
void hp_pc_tune_step(hp_prefix_cache_t *pc)
{
    if (!pc->p.tune || pc->p.n_alphas <= 0)
        return;
    if (pc->phase == HP_PC_TUNE_WAIT && pc->evicted_once) {
        hp_error_t err = {0};
        pc->snap = clone_sim(pc, 0.0, &err);
        if (!pc->snap) {
            pc->phase = HP_PC_TUNE_DONE;
            return;
        }
        long w = (long)pc->p.bootstrap_mult * (long)pc->n_before;
        if (w < pc->p.bootstrap_min)
            w = pc->p.bootstrap_min;
        if (w > pc->p.bootstrap_max)
            w = pc->p.bootstrap_max;
        pc->window = (int)w;
        pc->phase = HP_PC_TUNE_RECORD;
    }
    if (pc->phase == HP_PC_TUNE_DONE && pc->p.retune && !pc->job) {
        hp_error_t err = {0};
        pc->snap = clone_sim(pc, 0.0, &err);
        pc->phase = pc->snap ? HP_PC_TUNE_RECORD : HP_PC_TUNE_DONE;
        pc->rec_tokens = 0;
        if (!pc->snap)
            pc->p.retune = 0;
    }
    if (pc->phase == HP_PC_TUNE_RECORD &&
        (pc->n_rec >= pc->window || pc->rec_tokens > TRACE_MAX_TOKENS))
        tune_start(pc);
}

void hp_pc_tune_record(hp_prefix_cache_t *pc, const int *ids, int n_prompt,
                       int n)
{
    if (pc->phase != HP_PC_TUNE_RECORD)
        return;
    if (pc->n_rec == pc->cap_rec) {
        int cap = pc->cap_rec ? 2 * pc->cap_rec : 64;
        hp_prefix_cache_trace_t *r = realloc(pc->rec, cap * sizeof(*r));
        if (!r)
            return;
        pc->rec = r;
        pc->cap_rec = cap;
    }
    int *copy = malloc((size_t)n * sizeof(int));
    if (!copy)
        return;
    memcpy(copy, ids, (size_t)n * sizeof(int));
    hp_prefix_cache_trace_t *r = &pc->rec[pc->n_rec++];
    r->ids = copy;
    r->n_prompt = n_prompt;
    r->n = n;
    pc->rec_tokens += (size_t)n;
}

static void *clone_pcd(void *ud, const hp_radix_node_t *n)
{
    (void)ud;
    pcd_t *d = calloc(1, sizeof(*d));
    if (d) {
        d->stamp = D(n)->stamp;
        d->has_state = D(n)->has_state;
    }
    return d;
}

/* A simulator copy of src (tree, clock, histogram; no tensors, no pins,
 * no tuning) with eviction weight alpha. */
static hp_prefix_cache_t *clone_sim(hp_prefix_cache_t *src, double alpha,
                                    hp_error_t *err)
{
    hp_prefix_cache_params_t p = src->p;
    p.tune = 0;
    p.alpha = alpha;
    hp_prefix_cache_t *pc = hp_prefix_cache_create(&src->cfg, &p, NULL, err);
    if (!pc)
        return NULL;
    hp_radix_free(&pc->tree, hp_pc_free_pcd, NULL);
    if (hp_radix_clone(&pc->tree, &src->tree, clone_pcd, hp_pc_free_pcd, NULL,
                       err) != HP_OK) {
        memset(&pc->tree, 0, sizeof(pc->tree));
        hp_prefix_cache_destroy(pc);
        return NULL;
    }
    for (hp_radix_node_t *x = pc->tree.all; x; x = x->next_all) {
        pc->kv_used += node_kv_bytes(pc, x);
        if (D(x)->has_state) {
            pc->states++;
            pc->st_used += pc->g.state;
        }
    }
    pc->clock = src->clock;
    if (pc->hist && src->hist)
        memcpy(pc->hist, src->hist,
               ((size_t)p.dp_max_depth + 1) * sizeof(double));
    pc->hist_w = src->hist_w;
    pc->hist_mass = src->hist_mass;
    pc->hist_all = src->hist_all;
    pc->hist_len = src->hist_len;
    return pc;
}

void hp_prefix_cache_tune_wait(hp_prefix_cache_t *pc)
{
    pthread_mutex_lock(&pc->mu);
    hp_pc_tune_poll(pc, 1);
    pthread_mutex_unlock(&pc->mu);
}

static double replay_on(hp_prefix_cache_t *base,
                        const hp_prefix_cache_trace_t *tr, int n, double alpha,
                        hp_error_t *err)
{
    pthread_mutex_lock(&base->mu);
    hp_prefix_cache_t *pc = clone_sim(base, alpha, err);
    pthread_mutex_unlock(&base->mu);
    if (!pc)
        return -1.0;
    for (int i = 0; i < n; i++) {
        hp_prefix_cache_req_t req;
        if (hp_prefix_cache_begin(pc, tr[i].ids, tr[i].n_prompt, -1, NULL, &req,
                                  err) != HP_OK)
            continue;
        hp_prefix_cache_admit(pc, &req, NULL, err);
        hp_prefix_cache_finish(pc, &req, tr[i].ids + tr[i].n_prompt,
                               tr[i].n - tr[i].n_prompt, NULL, err);
    }
    double rate = pc->st.prompt_tokens
                      ? (double)pc->st.hit_tokens / pc->st.prompt_tokens
                      : 0.0;
    hp_prefix_cache_destroy(pc);
    return rate;
}

double hp_prefix_cache_replay(hp_prefix_cache_t *pc,
                              const hp_prefix_cache_trace_t *trace, int n,
                              double alpha, hp_error_t *err)
{
    return replay_on(pc, trace, n, alpha, err);
}

void hp_pc_tune_free(hp_prefix_cache_t *pc)
{
    if (pc->job) {
        if (pc->job->threaded)
            pthread_join(pc->job->th, NULL);
        job_free(pc->job);
    }
    hp_prefix_cache_destroy(pc->snap);
    trace_free(pc->rec, pc->n_rec);
}
