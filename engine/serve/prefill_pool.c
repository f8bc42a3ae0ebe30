/*
 * prefill_pool.c - worker threads for segment prefill (prefill_pool.h).
 *
 * One mutex guards every queue, load and job counter; workers sleep on a
 * condition each, and jobs' owners on one shared `done` condition. The
 * model math runs outside the lock.
 */
#include "engine/serve/prefill_pool.h"

#include <omp.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine/cache/segcache.h"
#include "engine/cluster/peer.h"
#include "engine/serve/lpt.h"

typedef struct task {
    struct task *next;
    hp_prefill_job_t *job;
    int k; /* index into the job's cold list */
} task_t;

typedef struct {
    hp_prefill_pool_t *pp;
    int idx;
    pthread_t th;
    pthread_cond_t cv; /* a task arrived, or stopping */
    task_t *head, *tail;
    double load; /* tokens queued + running */
    int omp_max, omp_team;
    int started;
    int peer;                   /* -1: computes here; else drives peers[peer] */
    hp_fwd_ws_t ws;             /* its builds' activations */
    const hp_model_t *ws_model; /* the model ws is planned for */
    hp_seq_t *build_seq;        /* hp_prefill_pool_plan's, or NULL */
} worker_t;

struct hp_prefill_pool {
    pthread_mutex_t mu;
    pthread_cond_t done; /* a task of some job finished */
    int n, tpw;
    int stopping;
    worker_t *w;
    char **peers; /* [n_peers] */
    int n_peers;
    int64_t *dead_until; /* [n_peers] ms, under mu */
    int peer_timeout, peer_retry, peer_fetch;
    hp_log_fn log;
    void *log_ud;
};

struct hp_prefill_job {
    hp_prefill_pool_t *pp;
    const hp_llm_t *llm;
    hp_cache_t *cache;
    const hp_prompt_t *p;
    hp_ipc_mode_t mode;
    int w;
    hp_prefill_cb_fn cb;
    void *ud;
    int n;                 /* cold segments */
    int *seg;              /* [n] index in p->segs */
    uint32_t *var;         /* [n] */
    hp_pool_entry_t **ent; /* [n] references held until free */
    task_t *tasks;         /* [n] */
    int pending;           /* tasks not yet finished (under mu) */
    int cancelled;         /* under mu */
    int status;            /* first error (under mu) */
    hp_error_t err;
    hp_prefill_stats_t st;
    int64_t t0;
};

static int64_t now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

static int64_t thread_cpu_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

static void pp_log(hp_prefill_pool_t *pp, int level, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void pp_log(hp_prefill_pool_t *pp, int level, const char *fmt, ...)
{
    char line[700];
    va_list ap;
    if (!pp->log)
        return;
    va_start(ap, fmt);
    vsnprintf(line, sizeof(line), fmt, ap);
    va_end(ap);
    pp->log(pp->log_ud, level, line);
}

static int peer_live(hp_prefill_pool_t *pp, int i)
{
    pthread_mutex_lock(&pp->mu);
    int live = pp->dead_until[i] <= now_us() / 1000;
    pthread_mutex_unlock(&pp->mu);
    return live;
}

static void peer_failed(hp_prefill_pool_t *pp, int i, const hp_error_t *err)
{
    pthread_mutex_lock(&pp->mu);
    pp->dead_until[i] = now_us() / 1000 + pp->peer_retry;
    pthread_mutex_unlock(&pp->mu);
    pp_log(pp, HP_LOG_WARN,
           "prefill: peer %s failed (%s); its segments are prefilled "
           "locally for %d ms",
           pp->peers[i], err->msg, pp->peer_retry);
}

/* Builds cold segment k of job j on worker wk: from a peer that holds
 * it (peer_fetch), by wk's peer (a remote worker), or here; fills d.
 * Runs unlocked. */
static int build(hp_prefill_job_t *j, int k, worker_t *wk, hp_fwd_ws_t *ws,
                 hp_prefill_done_t *d, hp_error_t *err)
{
    hp_prefill_pool_t *pp = j->pp;
    const hp_model_t *m = &j->llm->model;
    const hp_prompt_seg_t *s = &j->p->segs[j->seg[k]];
    hp_pool_t *pub = j->cache->pub;
    int pic = s->role != HP_SEG_LEAD && j->mode == HP_IPC_MODE_PIC;
    hp_error_t perr = {0};

    /* another request may have published it since the dispatch */
    hp_pool_entry_t *e = hp_pool_get(pub, s->id, j->var[k]);
    if (e) {
        d->reused = 1;
        d->entry = j->ent[k] = e;
        return HP_OK;
    }
    for (int i = 0; pp->peer_fetch && i < pp->n_peers; i++) {
        if (!peer_live(pp, i))
            continue;
        int rc = hp_peer_fetch(pp->peers[i], s->id, j->var[k], pub, m,
                               pp->peer_timeout, &e, &perr);
        if (rc == HP_OK) {
            d->fetched = 1;
            d->entry = j->ent[k] = e;
            pp_log(pp, HP_LOG_DEBUG,
                   "prefill: segment %d (%d tokens) fetched from peer %s",
                   j->seg[k], s->len, pp->peers[i]);
            return HP_OK;
        }
        if (rc != HP_PEER_NOT_FOUND_RC && rc != HP_ENOMEM)
            peer_failed(pp, i, &perr);
    }
    if (wk->peer >= 0 && peer_live(pp, wk->peer)) {
        int rc = hp_peer_prefill(pp->peers[wk->peer], s->id, j->var[k],
                                 pic ? HP_PEER_KIND_PIC : HP_PEER_KIND_STATE,
                                 pic ? j->w : 0, j->p->ids + s->start, s->len,
                                 pub, m, pp->peer_timeout, &e, &perr);
        if (rc == HP_OK) {
            d->remote = 1;
            d->entry = j->ent[k] = e;
            return HP_OK;
        }
        if (rc == HP_ENOMEM) /* our pool, not the peer */
            return hp_error_set(err, rc, "%s", perr.msg);
        peer_failed(pp, wk->peer, &perr);
    }
    d->fallback = wk->peer >= 0;
    e = hp_pool_alloc(pub, s->id, j->var[k],
                      hp_assemble_entry_bytes(&m->cfg, s, j->mode, j->w), err);
    if (!e)
        return err->code ? err->code : HP_ENOMEM;
    const int *ids = j->p->ids + s->start;
    hp_backend_lock(m->be);
    int rc = pic ? hp_segc_build_pic(e, m, ws, ids, s->len, j->w, err)
                 : hp_segc_build_state(e, m, ws, ids, s->len, err);
    if (rc == HP_OK) /* this build's failures, before another thread's */
        rc = hp_backend_sync(m->be, err);
    hp_backend_unlock(m->be);
    if (rc != HP_OK) {
        hp_pool_release(pub, e);
        return rc;
    }
    /* the pointer goes public: the combine side reads it in place */
    hp_pool_publish(pub, e);
    d->entry = j->ent[k] = e;
    return HP_OK;
}

/* Plans wk's workspace for model m (segment builds: prefill pieces, no
 * batched steps), with its build sequence. */
static int ws_plan(worker_t *wk, const hp_model_t *m, hp_error_t *err)
{
    hp_fwd_plan_t plan = {hp_fwd_piece(m), 0, 0, 1};
    hp_backend_lock(m->be); /* the backend's scratch may grow */
    hp_fwd_ws_free(&wk->ws);
    wk->ws_model = NULL;
    int rc = hp_fwd_ws_init(&wk->ws, m, &plan, err);
    hp_backend_unlock(m->be);
    if (rc != HP_OK)
        return rc;
    wk->ws_model = m;
    wk->ws.build_seq = wk->build_seq;
    return HP_OK;
}

static void *worker_main(void *arg)
{
    worker_t *wk = arg;
    hp_prefill_pool_t *pp = wk->pp;

    /* nthreads-var is a per-task ICV: this sets the count for this
     * thread's own parallel regions (and the BLAS calls sized from it)
     * only, not the process's or the other workers' */
    omp_set_num_threads(pp->tpw);
    int team = 0;
#pragma omp parallel
    {
#pragma omp single
        team = omp_get_num_threads();
    }

    pthread_mutex_lock(&pp->mu);
    wk->omp_max = omp_get_max_threads();
    wk->omp_team = team;
    wk->started = 1;
    pthread_cond_broadcast(&pp->done);
    for (;;) {
        while (!wk->head && !pp->stopping)
            pthread_cond_wait(&wk->cv, &pp->mu);
        task_t *t = wk->head;
        if (!t)
            break; /* stopping, nothing queued */
        wk->head = t->next;
        if (!wk->head)
            wk->tail = NULL;
        hp_prefill_job_t *j = t->job;
        const hp_prompt_seg_t *s = &j->p->segs[j->seg[t->k]];
        int skip = pp->stopping || j->cancelled || j->status != HP_OK;
        pthread_mutex_unlock(&pp->mu);

        hp_error_t err = {0};
        hp_prefill_done_t d = {
            .seg = j->seg[t->k], .worker = wk->idx, .tokens = s->len};
        d.start_us = now_us();
        int64_t c0 = thread_cpu_us();
        /* unplanned (hp_prefill_pool_plan): at the first job of a model
         * (one model in practice) */
        if (!skip && wk->ws_model != &j->llm->model)
            ws_plan(wk, &j->llm->model, &err);
        d.status = skip            ? HP_ECANCELLED
                   : !wk->ws_model ? err.code
                                   : build(j, t->k, wk, &wk->ws, &d, &err);
        d.end_us = now_us();
        d.cpu_us = thread_cpu_us() - c0;
        if (j->cb)
            j->cb(j->ud, &d);

        pthread_mutex_lock(&pp->mu);
        wk->load -= s->len;
        if (d.status == HP_ECANCELLED) {
            j->st.cancelled++;
        } else if (d.status != HP_OK) {
            j->st.failed++;
            if (j->status == HP_OK) {
                j->status = d.status;
                hp_error_set(&j->err, d.status, "segment %d (%d tokens): %s",
                             d.seg, s->len, err.msg);
            }
        } else if (d.reused) {
            j->st.reused++;
        } else {
            long covered = s->role != HP_SEG_LEAD && j->mode == HP_IPC_MODE_PIC
                               ? s->len - 2 * j->w
                               : s->len;
            j->st.published++;
            j->st.miss_tokens += covered;
            j->st.remote += d.remote;
            j->st.fetched += d.fetched;
            j->st.fetched_tokens += d.fetched ? covered : 0;
            j->st.fallbacks += d.fallback;
        }
        if (--j->pending == 0)
            j->st.wall_us = now_us() - j->t0;
        pthread_cond_broadcast(&pp->done);
    }
    pthread_mutex_unlock(&pp->mu);
    hp_fwd_ws_free(&wk->ws);
    return NULL;
}

int hp_prefill_pool_create(hp_prefill_pool_t **out,
                           const hp_prefill_pool_cfg_t *cfg, hp_error_t *err)
{
    *out = NULL;
    int np = cfg->peers ? cfg->n_peers : 0;
    if (cfg->workers < 1 || np < 0 ||
        cfg->workers + np > HP_PREFILL_MAX_WORKERS ||
        cfg->threads_per_worker < 0)
        return hp_error_set(err, HP_EBADINPUT,
                            "prefill pool: %d workers of %d threads and %d "
                            "peers (at least 1 worker, %d in all)",
                            cfg->workers, cfg->threads_per_worker, np,
                            HP_PREFILL_MAX_WORKERS);
    hp_prefill_pool_t *pp = calloc(1, sizeof(*pp));
    int nomem = !pp;
    if (pp) {
        pp->w = calloc((size_t)(cfg->workers + np), sizeof(worker_t));
        pp->peers = calloc((size_t)np + 1, sizeof(char *));
        pp->dead_until = calloc((size_t)np + 1, sizeof(int64_t));
        nomem = !pp->w || !pp->peers || !pp->dead_until;
        for (int i = 0; i < np && !nomem; i++)
            nomem = !(pp->peers[pp->n_peers++] = strdup(cfg->peers[i]));
    }
    if (nomem) {
        if (pp) {
            for (int i = 0; i < pp->n_peers; i++)
                free(pp->peers[i]);
            free(pp->peers);
            free(pp->dead_until);
            free(pp->w);
        }
        free(pp);
        return hp_error_set(err, HP_ENOMEM, "prefill pool: out of memory");
    }
    pp->n = cfg->workers + np;
    pp->tpw = cfg->threads_per_worker ? cfg->threads_per_worker : 1;
    pp->peer_timeout = cfg->peer_timeout_ms > 0 ? cfg->peer_timeout_ms : 30000;
    pp->peer_retry = cfg->peer_retry_ms > 0 ? cfg->peer_retry_ms : 5000;
    pp->peer_fetch = cfg->peer_fetch && np > 0;
    pp->log = cfg->log;
    pp->log_ud = cfg->log_ud;
    pthread_mutex_init(&pp->mu, NULL);
    pthread_cond_init(&pp->done, NULL);
    for (int i = 0; i < pp->n; i++) {
        worker_t *wk = &pp->w[i];
        wk->pp = pp;
        wk->idx = i;
        wk->peer = i < cfg->workers ? -1 : i - cfg->workers;
        pthread_cond_init(&wk->cv, NULL);
        if (pthread_create(&wk->th, NULL, worker_main, wk) != 0) {
            pp->n = i; /* destroy joins those that started */
            hp_prefill_pool_destroy(pp);
            return hp_error_set(err, HP_EINTERNAL,
                                "prefill pool: cannot start worker %d", i);
        }
    }
    /* every worker has set its thread count before the first job */
    pthread_mutex_lock(&pp->mu);
    for (int i = 0; i < pp->n; i++)
        while (!pp->w[i].started)
            pthread_cond_wait(&pp->done, &pp->mu);
    pthread_mutex_unlock(&pp->mu);
    *out = pp;
    return HP_OK;
}

int hp_prefill_pool_plan(hp_prefill_pool_t *pp, const hp_llm_t *llm,
                         hp_seq_t *seqs, hp_error_t *err)
{
    int rc = HP_OK;
    for (int i = 0; i < pp->n; i++) {
        worker_t *wk = &pp->w[i];
        wk->build_seq = seqs ? &seqs[i] : NULL;
        if (llm && rc == HP_OK) {
            rc = ws_plan(wk, &llm->model, err);
        } else if (!llm) {
            hp_fwd_ws_free(&wk->ws);
            wk->ws_model = NULL;
        }
    }
    return rc;
}

void hp_prefill_pool_destroy(hp_prefill_pool_t *pp)
{
    if (!pp)
        return;
    pthread_mutex_lock(&pp->mu);
    pp->stopping = 1;
    for (int i = 0; i < pp->n; i++)
        pthread_cond_signal(&pp->w[i].cv);
    pthread_mutex_unlock(&pp->mu);
    /* each worker drains its queue as cancelled before it exits */
    for (int i = 0; i < pp->n; i++)
        pthread_join(pp->w[i].th, NULL);
    for (int i = 0; i < pp->n; i++)
        pthread_cond_destroy(&pp->w[i].cv);
    pthread_cond_destroy(&pp->done);
    pthread_mutex_destroy(&pp->mu);
    for (int i = 0; i < pp->n_peers; i++)
        free(pp->peers[i]);
    free(pp->peers);
    free(pp->dead_until);
    free(pp->w);
    free(pp);
}

int hp_prefill_pool_workers(const hp_prefill_pool_t *pp)
{
    return pp->n;
}

void hp_prefill_pool_worker_omp(hp_prefill_pool_t *pp, int i, int *max,
                                int *team)
{
    pthread_mutex_lock(&pp->mu);
    *max = pp->w[i].omp_max;
    *team = pp->w[i].omp_team;
    pthread_mutex_unlock(&pp->mu);
}

void hp_prefill_pool_loads(hp_prefill_pool_t *pp, double *loads)
{
    pthread_mutex_lock(&pp->mu);
    for (int i = 0; i < pp->n; i++)
        loads[i] = pp->w[i].load;
    pthread_mutex_unlock(&pp->mu);
}

static void job_free_arrays(hp_prefill_job_t *j)
{
    free(j->seg);
    free(j->var);
    free(j->ent);
    free(j->tasks);
    free(j);
}

int hp_prefill_submit(hp_prefill_pool_t *pp, const hp_llm_t *llm,
                      hp_cache_t *cache, const hp_prompt_t *p,
                      hp_ipc_mode_t mode, int w, hp_prefill_cb_fn cb, void *ud,
                      hp_prefill_job_t **out, hp_error_t *err)
{
    *out = NULL;
    if (w < 0)
        return hp_error_set(err, HP_EBADINPUT, "seam width %d < 0", w);
    if (!cache || !cache->pub)
        return hp_error_set(err, HP_EBADINPUT, "prefill pool: no public pool");
    hp_prefill_job_t *j = calloc(1, sizeof(*j));
    size_t ns = (size_t)(p->n_segs > 0 ? p->n_segs : 1);
    double *cost = malloc(ns * sizeof(double));
    int *order = malloc(ns * sizeof(int));
    int *assign = malloc(ns * sizeof(int));
    if (j) {
        j->seg = malloc(ns * sizeof(int));
        j->var = malloc(ns * sizeof(uint32_t));
        j->ent = calloc(ns, sizeof(hp_pool_entry_t *));
        j->tasks = calloc(ns, sizeof(task_t));
    }
    if (!j || !cost || !order || !assign || !j->seg || !j->var || !j->ent ||
        !j->tasks) {
        if (j)
            job_free_arrays(j);
        free(cost);
        free(order);
        free(assign);
        return hp_error_set(err, HP_ENOMEM, "prefill pool: out of memory");
    }
    j->pp = pp; /* calloc zeroed the counters, status and stats */
    j->llm = llm;
    j->cache = cache;
    j->p = p;
    j->mode = mode;
    j->w = w;
    j->cb = cb;
    j->ud = ud;
    j->t0 = now_us();

    /* the cold list: cacheable, not in the pool, first occurrence */
    for (int i = 0; (mode == HP_IPC_MODE_NAIVE || mode == HP_IPC_MODE_PIC) &&
                    i < p->n_segs;
         i++) {
        const hp_prompt_seg_t *s = &p->segs[i];
        if (!hp_assemble_cacheable(s, mode, w))
            continue;
        uint32_t var = hp_assemble_variant(s, mode, w);
        if (hp_pool_contains(cache->pub, s->id, var)) {
            j->st.hits++;
            continue;
        }
        int dup = 0;
        for (int k = 0; k < j->n && !dup; k++)
            dup = j->var[k] == var &&
                  !memcmp(p->segs[j->seg[k]].id, s->id, sizeof(s->id));
        if (dup) {
            j->st.dups++;
            continue;
        }
        j->seg[j->n] = i;
        j->var[j->n] = var;
        cost[j->n] = s->len;
        j->st.tokens += s->len;
        j->n++;
    }
    j->st.cold = j->n;
    hp_lpt_order(cost, j->n, order);

    pthread_mutex_lock(&pp->mu);
    double base[HP_PREFILL_MAX_WORKERS];
    int64_t now_ms = now_us() / 1000;
    for (int i = 0; i < pp->n; i++) {
        base[i] = pp->w[i].load;
        /* a peer that failed lately gets nothing new (local workers are
         * always live, so LPT always has somewhere to put a segment) */
        if (pp->w[i].peer >= 0 && pp->dead_until[pp->w[i].peer] > now_ms)
            base[i] = 1e300;
    }
    double ld[HP_PREFILL_MAX_WORKERS];
    hp_lpt_assign(cost, j->n, pp->n, base, assign, ld);
    for (int i = 0; i < pp->n; i++)
        if (base[i] < 1e300 && ld[i] > j->st.planned)
            j->st.planned = ld[i];
    j->pending = j->n;
    /* longest first on every worker, as LPT assigned them */
    for (int q = 0; q < j->n; q++) {
        int k = order[q];
        worker_t *wk = &pp->w[assign[k]];
        task_t *t = &j->tasks[k];
        *t = (task_t){NULL, j, k};
        if (wk->tail)
            wk->tail->next = t;
        else
            wk->head = t;
        wk->tail = t;
        wk->load += cost[k];
        j->st.per_worker[assign[k]]++;
        pthread_cond_signal(&wk->cv);
    }
    pthread_mutex_unlock(&pp->mu);
    free(cost);
    free(order);
    free(assign);
    *out = j;
    return HP_OK;
}

int hp_prefill_job_done(hp_prefill_job_t *j)
{
    pthread_mutex_lock(&j->pp->mu);
    int done = j->pending == 0;
    pthread_mutex_unlock(&j->pp->mu);
    return done;
}

int hp_prefill_job_wait(hp_prefill_job_t *j, hp_prefill_stats_t *st,
                        hp_error_t *err)
{
    hp_prefill_pool_t *pp = j->pp;
    pthread_mutex_lock(&pp->mu);
    while (j->pending > 0)
        pthread_cond_wait(&pp->done, &pp->mu);
    int rc = j->status;
    if (rc != HP_OK && err)
        *err = j->err;
    if (st)
        *st = j->st;
    pthread_mutex_unlock(&pp->mu);
    return rc;
}

void hp_prefill_job_free(hp_prefill_job_t *j)
{
    if (!j)
        return;
    hp_prefill_pool_t *pp = j->pp;
    pthread_mutex_lock(&pp->mu);
    j->cancelled = 1;
    while (j->pending > 0)
        pthread_cond_wait(&pp->done, &pp->mu);
    pthread_mutex_unlock(&pp->mu);
    for (int k = 0; k < j->n; k++)
        hp_pool_release(j->cache->pub, j->ent[k]);
    job_free_arrays(j);
}

int hp_prefill_pool_run(hp_prefill_pool_t *pp, const hp_llm_t *llm,
                        hp_cache_t *cache, const hp_prompt_t *p,
                        hp_ipc_mode_t mode, int w, hp_prefill_cb_fn cb,
                        void *ud, hp_prefill_stats_t *st, hp_error_t *err)
{
    hp_prefill_job_t *j;
    int rc = hp_prefill_submit(pp, llm, cache, p, mode, w, cb, ud, &j, err);
    if (rc != HP_OK)
        return rc;
    rc = hp_prefill_job_wait(j, st, err);
    hp_prefill_job_free(j);
    return rc;
}
