/*
 * bench_engine.h - what the engine benches share beyond bench_util.h:
 * medians of repeated timings, the synthetic prompt token ids (the same
 * formula as the Python references, bench/hf_throughput.py and
 * bench/gpu_engine_ref.py), and a segmented prompt built from token ids
 * (lead + documents + query) without a tokenizer.
 *
 * Static inline, as bench_util.h: each bench is its own program.
 */
#ifndef HYPIC_BENCH_ENGINE_H
#define HYPIC_BENCH_ENGINE_H

#include <stdlib.h>
#include <string.h>

#include "bench/bench_util.h"
#include "engine/cache/prompt.h"
#include "engine/model/llm.h"

static inline int bench_cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* The median of v[n] (n >= 1); sorts v. */
static inline double bench_median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof(*v), bench_cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* Prompt token t of a synthetic prefill: (t * 7919 + 13) mod min(V,
 * 4000), below the tokenizer's padding rows of a real vocabulary.
 * bench/gpu_engine_ref.py feeds transformers the same ids. */
static inline int bench_prompt_id(long t, int V)
{
    return (int)((t * 7919u + 13) % (unsigned)(V < 4000 ? V : 4000));
}

/* A prompt of lead + docs (in the given order) + query: one segment each
 * (lead, PIC documents, query), ids concatenated, segment ids over the
 * token bytes (no tokenizer involved). Free with hp_prompt_free. */
static inline void bench_make_prompt(hp_prompt_t *p, const hp_llm_t *llm,
                                     int *const *doc, const int *dlen,
                                     const int *order, int nd, const int *lead,
                                     int nl, const int *query, int nq)
{
    int n = nl + nq;
    for (int i = 0; i < nd; i++)
        n += dlen[i];
    p->ids = malloc((size_t)n * sizeof(int));
    p->segs = calloc((size_t)nd + 2, sizeof(*p->segs));
    p->n = 0;
    p->n_segs = 0;
    for (int s = 0; s < nd + 2; s++) {
        const int *src = s == 0        ? lead
                         : s == nd + 1 ? query
                                       : doc[order[s - 1]];
        int len = s == 0 ? nl : s == nd + 1 ? nq : dlen[order[s - 1]];
        hp_prompt_seg_t *g = &p->segs[p->n_segs++];
        g->start = p->n;
        g->len = len;
        g->role = s == 0        ? HP_SEG_LEAD
                  : s == nd + 1 ? HP_SEG_QUERY
                                : HP_SEG_PIC;
        hp_seg_id(g->id, llm->model.fingerprint, g->role, (const char *)src,
                  (size_t)len * sizeof(int));
        memcpy(p->ids + p->n, src, (size_t)len * sizeof(int));
        p->n += len;
    }
}

#endif
