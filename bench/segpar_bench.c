/*
 * segpar_bench.c - segment parallelism on one node (issue 6; HYPIC §6.5,
 * Fig. 14): the cold warm pass of one request whose n PIC segments all
 * miss, run sequentially (the warm path of hp_assemble_warm, one thread
 * set of T threads) and on a prefill pool of W workers x 1 thread, then
 * the combine (hp_assemble, every segment a hit). The logits of both are
 * compared bitwise.
 *
 *   build/bench/segpar_bench --model DIR [--segs 4,6,8,11]
 *       [--min 1000] [--max 2400] [--seq-threads 2] [--workers 2]
 *       [--reps 3] [--seam 8] [--seed 1] [--times FILE]
 *
 * Three configurations: sequential with 1 thread, sequential with
 * --seq-threads threads (intra-op OpenMP), and the pool of --workers
 * workers x 1 thread. Segments are random token ids (no tokenizer). Each
 * run starts from a fresh public pool; the time is the minimum over reps;
 * "cores" is the process CPU time over the wall time of that run (below
 * the thread count: the machine was busy with other work). On a shared
 * machine the CPU-time columns say what idle cores would give: seq1's
 * thread CPU time against the largest sum of per-segment CPU time over
 * the workers (memory-bandwidth interference between the workers is in
 * it, other processes are not). --times appends "tokens cpu_ms wall_ms"
 * per segment of the parallel runs, the input of bench/lpt_sim.
 */
#include <omp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/bench_util.h"
#include "engine/cache/assemble.h"
#include "engine/serve/prefill_pool.h"

static uint64_t rng = BENCH_SEED;
static uint64_t next(void)
{
    return bench_xorshift(&rng);
}

/* lead (32) + n documents of random lengths + query (16), random ids;
 * segment ids random too (every segment cold). */
static void make_prompt(hp_prompt_t *p, int V, int n, int lo, int hi)
{
    int len[HP_PROMPT_MAX_SEGS];
    int total = 0;
    for (int s = 0; s < n + 2; s++) {
        len[s] = s == 0       ? 32
                 : s == n + 1 ? 16
                              : lo + (int)(next() % (hi - lo + 1));
        total += len[s];
    }
    p->ids = malloc((size_t)total * sizeof(int));
    p->segs = calloc((size_t)(n + 2), sizeof(*p->segs));
    p->n = total;
    p->n_segs = n + 2;
    for (int t = 0; t < total; t++)
        p->ids[t] = (int)(next() % (uint64_t)V);
    for (int s = 0, at = 0; s < n + 2; at += len[s], s++) {
        hp_prompt_seg_t *g = &p->segs[s];
        g->start = at;
        g->len = len[s];
        g->role = s == 0 ? HP_SEG_LEAD : s == n + 1 ? HP_SEG_QUERY : HP_SEG_PIC;
        for (int b = 0; b < 16; b += 8) {
            uint64_t r = next();
            memcpy(g->id + b, &r, 8);
        }
    }
}

typedef struct {
    FILE *f;
    pthread_mutex_t mu;
    double cpu_ms[HP_PREFILL_MAX_WORKERS]; /* per worker, this run */
} times_t;

static void on_done(void *ud, const hp_prefill_done_t *d)
{
    times_t *t = ud;
    if (d->status != HP_OK || d->reused)
        return;
    pthread_mutex_lock(&t->mu);
    t->cpu_ms[d->worker] += d->cpu_us / 1000.0;
    if (t->f)
        fprintf(t->f, "%d %.3f %.3f\n", d->tokens, d->cpu_us / 1000.0,
                (d->end_us - d->start_us) / 1000.0);
    pthread_mutex_unlock(&t->mu);
}

int main(int argc, char **argv)
{
    const char *model = NULL, *segs = "4,6,8,11", *times = NULL;
    int lo = 1000, hi = 2400, seq_threads = 2, workers = 2, reps = 3, w = 8;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v) {
            fprintf(stderr, "%s needs a value\n", a);
            return 2;
        }
        if (!strcmp(a, "--model"))
            model = v;
        else if (!strcmp(a, "--segs"))
            segs = v;
        else if (!strcmp(a, "--min"))
            lo = atoi(v);
        else if (!strcmp(a, "--max"))
            hi = atoi(v);
        else if (!strcmp(a, "--seq-threads"))
            seq_threads = atoi(v);
        else if (!strcmp(a, "--workers"))
            workers = atoi(v);
        else if (!strcmp(a, "--reps"))
            reps = atoi(v);
        else if (!strcmp(a, "--seam"))
            w = atoi(v);
        else if (!strcmp(a, "--seed"))
            rng = BENCH_SEED ^ (uint64_t)atoll(v) * 0x9e37;
        else if (!strcmp(a, "--times"))
            times = v;
        else {
            fprintf(stderr, "unknown option %s\n", a);
            return 2;
        }
        i++;
    }
    if (!model || lo < 2 * w + 1 || hi < lo || reps < 1 || workers < 1) {
        fprintf(stderr, "usage: segpar_bench --model DIR [--segs 4,6,8,11] "
                        "[--min N] [--max N] [--seq-threads T] [--workers W] "
                        "[--reps R] [--seam W] [--seed S] [--times FILE]\n");
        return 2;
    }
    hp_llm_t llm;
    hp_error_t err = {0};
    if (hp_llm_load(&llm, model, &err) != HP_OK)
        return bench_fail(&err);
    const hp_model_config_t *c = &llm.model.cfg;
    size_t V = (size_t)c->vocab_size;
    times_t tf = {.f = times ? fopen(times, "a") : NULL};
    pthread_mutex_init(&tf.mu, NULL);
    hp_prefill_pool_t *pp;
    hp_prefill_pool_cfg_t pcfg = {.workers = workers, .threads_per_worker = 1};
    if (hp_prefill_pool_create(&pp, &pcfg, &err) != HP_OK)
        return bench_fail(&err);
    hp_fwd_ws_t ws;
    if (hp_fwd_ws_init(&ws, &llm.model, NULL, &err) != HP_OK)
        return bench_fail(&err);
    omp_set_num_threads(seq_threads);

    printf("model %s: hidden %d, %d layers; seam %d; segments %d..%d tokens; "
           "min of %d reps\n",
           model, c->hidden, c->n_layers, w, lo, hi, reps);
    printf("seq1 = hp_assemble_warm, 1 thread; seqT = hp_assemble_warm, %d "
           "threads; par = %d workers x 1 thread (LPT); combine = "
           "hp_assemble with every segment a hit, %d threads\n\n",
           seq_threads, workers, seq_threads);
    printf("| segs | cold tokens | seq1 ms (cores) | seq%d ms (cores) | "
           "par ms (cores) | par vs seq%d | par vs seq1 | seq1 CPU ms | "
           "par max-worker CPU ms | CPU-time speedup | LPT plan/ideal | "
           "combine ms | bitwise |\n",
           seq_threads, seq_threads);
    printf("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|:---:|"
           "\n");

    for (const char *s = segs; *s;) {
        int n = bench_next_int(&s);
        if (n < 1 || n > HP_PROMPT_MAX_SEGS - 2) {
            fprintf(stderr, "--segs: %d segments out of range\n", n);
            return 2;
        }
        hp_prompt_t p;
        make_prompt(&p, (int)(V < 500 ? V : 500), n, lo, hi);
        double best[3] = {1e30, 1e30, 1e30}, cores[3] = {0}, comb = 1e30;
        double seq1_cpu = 1e30, par_cpu = 1e30;
        double plan = 0;
        long tok = 0;
        int same = 1;
        float *lg[3] = {malloc(V * 4), malloc(V * 4), malloc(V * 4)};
        for (int r = 0; r < reps; r++) {
            for (int k = 0; k < 3; k++) { /* seq1, seqT, par */
                hp_cache_t cache = {hp_pool_create((size_t)4 << 30, &err),
                                    NULL};
                hp_assemble_stats_t ast;
                hp_prefill_stats_t pst;
                omp_set_num_threads(k == 0 ? 1 : seq_threads);
                memset(tf.cpu_ms, 0, sizeof(tf.cpu_ms));
                double t0 = bench_now();
                double c0 = bench_clock(CLOCK_PROCESS_CPUTIME_ID);
                double tc0 = bench_clock(CLOCK_THREAD_CPUTIME_ID);
                int rc = k == 2
                             ? hp_prefill_pool_run(pp, &llm, &cache, &p,
                                                   HP_IPC_MODE_PIC, w, on_done,
                                                   &tf, &pst, &err)
                             : hp_assemble_warm(&llm, &cache, &ws, &p,
                                                HP_IPC_MODE_PIC, w, &ast, &err);
                double dt = bench_now() - t0;
                double dc = bench_clock(CLOCK_PROCESS_CPUTIME_ID) - c0;
                double dtc = bench_clock(CLOCK_THREAD_CPUTIME_ID) - tc0;
                if (rc != HP_OK) {
                    fprintf(stderr, "warm: %s\n", err.msg);
                    return 1;
                }
                if (dt < best[k]) {
                    best[k] = dt;
                    cores[k] = dc / dt;
                }
                if (k == 0 && dtc < seq1_cpu)
                    seq1_cpu = dtc;
                if (k == 2) {
                    double mx = 0;
                    for (int q = 0; q < workers; q++)
                        mx = tf.cpu_ms[q] > mx ? tf.cpu_ms[q] : mx;
                    par_cpu = mx / 1e3 < par_cpu ? mx / 1e3 : par_cpu;
                    plan = pst.planned;
                    tok = pst.tokens;
                }
                omp_set_num_threads(seq_threads);
                hp_seq_t seq;
                hp_seq_init(&seq, &llm.model, &err);
                t0 = bench_now();
                rc = hp_assemble(&llm, &cache, &ws, &p, HP_IPC_MODE_PIC, w,
                                 &seq, lg[k], &ast, &err);
                dt = bench_now() - t0;
                if (rc != HP_OK || ast.miss_segments) {
                    fprintf(stderr, "combine: %s (%d misses)\n", err.msg,
                            ast.miss_segments);
                    return 1;
                }
                comb = dt < comb ? dt : comb;
                hp_seq_free(&seq);
                hp_pool_destroy(cache.pub);
            }
            same = same && !memcmp(lg[0], lg[2], V * 4) &&
                   !memcmp(lg[1], lg[2], V * 4);
        }
        printf("| %d | %ld | %.0f (%.2f) | %.0f (%.2f) | %.0f (%.2f) | "
               "%.2fx | %.2fx | %.0f | %.0f | %.2fx | %.3f | %.0f | %s |\n",
               n, tok, best[0] * 1e3, cores[0], best[1] * 1e3, cores[1],
               best[2] * 1e3, cores[2], best[1] / best[2], best[0] / best[2],
               seq1_cpu * 1e3, par_cpu * 1e3, seq1_cpu / par_cpu,
               plan / ((double)tok / workers), comb * 1e3, same ? "yes" : "NO");
        fflush(stdout);
        for (int k = 0; k < 3; k++)
            free(lg[k]);
        free(p.ids);
        free(p.segs);
    }
    if (tf.f)
        fclose(tf.f);
    hp_prefill_pool_destroy(pp);
    hp_fwd_ws_free(&ws);
    hp_llm_free(&llm);
    return 0;
}
