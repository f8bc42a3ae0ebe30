/*
 * hk_tune.cu - an online tuner for ops with interchangeable kernels: the
 * kernels of an op that give the same results bit for bit (hk_cuda.h
 * names the sets) take turns on the op's real calls, each call timed by a
 * pair of CUDA events, until each has `samples` times at a call's size
 * class; from then on the class runs its fastest. The calls' results are
 * the same whichever kernel runs, so tuning costs nothing but the slower
 * kernels' first few calls. Events are read only once they have
 * completed (cudaEventQuery): the host never waits for the device here.
 */
#include "kernels/cuda/hk_cuda_impl.h"

#include <float.h>
#include <stdlib.h>
#include <string.h>

/* Size classes kept: the table doubles from HK_TUNE_FIRST_CLASS as classes
 * come (a server's attention classes, powers of 2 of T and N, pass 128);
 * later ones run cand 0. */
#define HK_TUNE_FIRST_CLASS 16
#define HK_TUNE_MAX_CLASS   4096
#define HK_TUNE_EVENTS      16 /* event pairs in flight */

typedef struct {
    long long key;
    int n[HK_CUDA_TUNER_MAX_CAND];    /* times in, and pairs in flight */
    int done[HK_CUDA_TUNER_MAX_CAND]; /* times in */
    float ms[HK_CUDA_TUNER_MAX_CAND]; /* the least of them */
    /* out of the running: not one of the class's kernels, or a call of it
     * failed (hk_cuda_tuner_fail) */
    unsigned char out[HK_CUDA_TUNER_MAX_CAND];
    int best; /* -1 while tuning */
} hk_tune_class;

typedef struct {
    hk_cuda_timer_t tm; /* its two events */
    int cls, cand;      /* cls -1: free */
} hk_tune_pair;

struct hk_cuda_tuner {
    int ncand, samples, nclass, cap;
    hk_tune_class *cls; /* [cap] */
    hk_tune_pair pair[HK_TUNE_EVENTS];
    int cur; /* the pair hk_cuda_tuner_begin recorded, or -1 */
};

extern "C" int hk_cuda_tuner_create(hk_cuda_tuner_t **out, int ncand,
                                    int samples)
{
    if (!out || ncand < 1 || ncand > HK_CUDA_TUNER_MAX_CAND || samples < 1)
        return HK_CUDA_EINVAL;
    hk_cuda_tuner_t *t = (hk_cuda_tuner_t *)calloc(1, sizeof(*t));
    if (!t)
        return HK_CUDA_ENOMEM;
    t->ncand = ncand;
    t->samples = samples;
    t->cur = -1;
    t->cls = (hk_tune_class *)malloc(HK_TUNE_FIRST_CLASS * sizeof(*t->cls));
    if (!t->cls) {
        free(t);
        return HK_CUDA_ENOMEM;
    }
    t->cap = HK_TUNE_FIRST_CLASS;
    for (int i = 0; i < HK_TUNE_EVENTS; i++) {
        t->pair[i].cls = -1;
        const int rc = hk_cuda_timer_create(&t->pair[i].tm);
        if (rc != HK_CUDA_OK) {
            hk_cuda_tuner_destroy(t);
            return rc;
        }
    }
    *out = t;
    return HK_CUDA_OK;
}

extern "C" void hk_cuda_tuner_destroy(hk_cuda_tuner_t *t)
{
    if (!t)
        return;
    for (int i = 0; i < HK_TUNE_EVENTS; i++)
        hk_cuda_timer_destroy(&t->pair[i].tm); /* zeroed: a no-op */
    free(t->cls);
    free(t);
}

/* Class c settles once every kernel in the running has its samples in:
 * on the fastest of them (kernel 0 where none is left). */
static void hk_tune_settle(const hk_cuda_tuner_t *t, hk_tune_class *c)
{
    int best = -1;
    for (int k = 0; k < t->ncand; k++) {
        if (c->out[k])
            continue;
        if (c->done[k] < t->samples)
            return;
        if (best < 0 || c->ms[k] < c->ms[best])
            best = k;
    }
    c->best = best < 0 ? 0 : best;
}

/* An error of the tuner's own event calls (not ready yet, a start never
 * recorded) is not the next launch's: dropped where the runtime keeps it
 * as the last one (a fault is another). */
static void hk_tune_forget(cudaError_t e)
{
    if (cudaPeekAtLastError() == e)
        (void)cudaGetLastError();
}

/* The times of every pair whose stop event has completed, into their
 * classes; a class with all its samples in keeps its fastest. */
static void hk_tune_harvest(hk_cuda_tuner_t *t)
{
    for (int i = 0; i < HK_TUNE_EVENTS; i++) {
        hk_tune_pair *p = &t->pair[i];
        if (p->cls < 0)
            continue;
        const cudaEvent_t start = (cudaEvent_t)p->tm.start;
        const cudaEvent_t stop = (cudaEvent_t)p->tm.stop;
        const cudaError_t q = cudaEventQuery(stop);
        if (q == cudaErrorNotReady) {
            hk_tune_forget(q);
            continue;
        }
        if (q != cudaSuccess)
            continue; /* a fault: the ops' own checks report it */
        float ms = FLT_MAX;
        const cudaError_t e = cudaEventElapsedTime(&ms, start, stop);
        if (e != cudaSuccess) {
            ms = FLT_MAX; /* counted, never the fastest */
            hk_tune_forget(e);
        }
        hk_tune_class *c = &t->cls[p->cls];
        if (c->done[p->cand]++ == 0 || ms < c->ms[p->cand])
            c->ms[p->cand] = ms;
        p->cls = -1;
        if (c->best < 0)
            hk_tune_settle(t, c);
    }
}

extern "C" int hk_cuda_tuner_pick_of(hk_cuda_tuner_t *t, long long key,
                                     unsigned mask, int *timed)
{
    *timed = 0;
    hk_tune_harvest(t);
    int ci = 0;
    while (ci < t->nclass && t->cls[ci].key != key)
        ci++;
    if (ci == t->nclass) {
        if (t->nclass == t->cap) {
            const int cap = 2 * t->cap;
            hk_tune_class *m =
                cap > HK_TUNE_MAX_CLASS
                    ? NULL
                    : (hk_tune_class *)realloc(t->cls, cap * sizeof(*m));
            if (!m)
                return 0; /* no room: the first kernel, untimed */
            t->cls = m;
            t->cap = cap;
        }
        hk_tune_class *c = &t->cls[t->nclass++];
        memset(c, 0, sizeof(*c));
        c->key = key;
        c->best = -1;
        /* the kernels the class has not are out (kernel 0 always runs) */
        int others = 0;
        for (int k = 1; k < t->ncand; k++) {
            c->out[k] = !(mask >> k & 1u);
            others += !c->out[k];
        }
        if (!others)
            c->best = 0; /* nothing to choose from: never timed */
    }
    hk_tune_class *c = &t->cls[ci];
    if (c->best >= 0)
        return c->best;
    /* the kernel in the running with the fewest times in or in flight,
     * timed if a pair is free */
    int k = -1;
    for (int j = 0; j < t->ncand; j++)
        if (!c->out[j] && (k < 0 || c->n[j] < c->n[k]))
            k = j;
    if (c->n[k] >= t->samples)
        return k; /* every sample in flight: wait for them */
    for (int i = 0; i < HK_TUNE_EVENTS; i++)
        if (t->pair[i].cls < 0) {
            t->pair[i].cls = ci;
            t->pair[i].cand = k;
            t->cur = i;
            c->n[k]++;
            *timed = 1;
            break;
        }
    return k;
}

extern "C" int hk_cuda_tuner_pick(hk_cuda_tuner_t *t, long long key, int *timed)
{
    return hk_cuda_tuner_pick_of(t, key, ~0u, timed);
}

extern "C" int hk_cuda_tuner_begin(hk_cuda_tuner_t *t, void *stream)
{
    if (t->cur < 0)
        return HK_CUDA_EINVAL;
    return hk_cuda_timer_start(&t->pair[t->cur].tm, stream);
}

extern "C" int hk_cuda_tuner_end(hk_cuda_tuner_t *t, void *stream)
{
    if (t->cur < 0)
        return HK_CUDA_EINVAL;
    const int i = t->cur;
    t->cur = -1;
    return hk_cuda_status(
        cudaEventRecord((cudaEvent_t)t->pair[i].tm.stop, hk_stream(stream)));
}

extern "C" int hk_cuda_tuner_fail(hk_cuda_tuner_t *t)
{
    if (t->cur < 0)
        return HK_CUDA_EINVAL;
    hk_tune_pair *p = &t->pair[t->cur];
    hk_tune_class *c = &t->cls[p->cls];
    c->out[p->cand] = 1;
    p->cls = -1; /* its start event is simply recorded again */
    t->cur = -1;
    if (c->best < 0)
        hk_tune_settle(t, c);
    return HK_CUDA_OK;
}

extern "C" int hk_cuda_tuner_best(const hk_cuda_tuner_t *t, long long key)
{
    for (int i = 0; i < t->nclass; i++)
        if (t->cls[i].key == key)
            return t->cls[i].best;
    return -1;
}

extern "C" int hk_cuda_tuner_class(hk_cuda_tuner_t *t, int i, long long *key,
                                   int *best, float *ms)
{
    hk_tune_harvest(t);
    if (i < 0 || i >= t->nclass)
        return HK_CUDA_EINVAL;
    const hk_tune_class *c = &t->cls[i];
    *key = c->key;
    *best = c->best;
    for (int k = 0; k < t->ncand; k++)
        ms[k] =
            !c->out[k] && c->done[k] && c->ms[k] < FLT_MAX ? c->ms[k] : -1.0f;
    return HK_CUDA_OK;
}
