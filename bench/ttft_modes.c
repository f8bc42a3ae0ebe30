/*
 * ttft_modes.c - time to first token of full, prefix, naive and pic on the
 * same segmented prompts, in one run (issue 4 bench; HYPIC Fig. 12), and
 * the relative state error per linear layer of naive and pic against full
 * (HYPIC Table 4).
 *
 *   build/bench/ttft_modes --model DIR --segments 1024,2048,4096,4096
 *       [--lead 32] [--query 32] [--seam 8] [--reps 3] [--seed 1]
 *
 * Segments are random token ids (no tokenizer involved). TTFT is the
 * wall time of the prefill up to the last token's logits. Warm modes have
 * every segment in the public pool first (untimed); `prefix` has the
 * prefix cache warmed by the same documents in another order, so only the
 * lead is an exact prefix hit (documents recur in new orders in RAG).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/bench_engine.h"
#include "bench/bench_util.h"
#include "engine/cache/assemble.h"

static uint64_t rng = BENCH_SEED;
static int next_id(int V)
{
    return (int)(bench_xorshift(&rng) % (uint64_t)V);
}

static double rel(const float *a, const float *b, size_t n)
{
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        num += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
        den += (double)a[i] * a[i];
    }
    return den > 0 ? sqrt(num / den) : 0;
}

int main(int argc, char **argv)
{
    const char *model = NULL, *segs = "1024,1024,1024,1024";
    int nl = 32, nq = 32, w = HP_SEAM_DEFAULT, reps = 3;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--model"))
            model = argv[i + 1];
        else if (!strcmp(argv[i], "--segments"))
            segs = argv[i + 1];
        else if (!strcmp(argv[i], "--lead"))
            nl = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--query"))
            nq = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--seam"))
            w = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--reps"))
            reps = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--seed"))
            rng ^= strtoull(argv[i + 1], NULL, 10) * 0x9e3779b97f4a7c15ull;
    }
    if (!model) {
        fprintf(stderr, "usage: ttft_modes --model DIR [--segments a,b,..]"
                        " [--lead N] [--query N] [--seam W] [--reps R]\n");
        return 2;
    }
    hp_llm_t llm;
    hp_error_t err = {0};
    if (hp_llm_load(&llm, model, &err) != HP_OK)
        return bench_fail(&err);
    const hp_model_config_t *c = &llm.model.cfg;
    int V = c->vocab_size < 4096 ? c->vocab_size : 4096;
    int nd = 0, dlen[64];
    for (const char *s = segs; *s && nd < 64; nd++)
        dlen[nd] = bench_next_int(&s);
    int *doc[64], *lead = malloc(nl * sizeof(int)), *query = malloc(nq * 4);
    for (int i = 0; i < nd; i++) {
        doc[i] = malloc((size_t)dlen[i] * sizeof(int));
        for (int t = 0; t < dlen[i]; t++)
            doc[i][t] = next_id(V);
    }
    for (int t = 0; t < nl; t++)
        lead[t] = next_id(V);
    for (int t = 0; t < nq; t++)
        query[t] = next_id(V);
    int order[64], rot[64];
    for (int i = 0; i < nd; i++) {
        order[i] = i;
        rot[i] = (i + 1) % nd;
    }
    hp_prompt_t p, pw;
    bench_make_prompt(&p, &llm, doc, dlen, order, nd, lead, nl, query, nq);
    bench_make_prompt(&pw, &llm, doc, dlen, rot, nd, lead, nl, query, nq);

    hp_prefix_cache_params_t pcp;
    hp_prefix_cache_params_default(&pcp, 48ull << 30);
    hp_cache_t cache = {
        hp_pool_create(48ull << 30, &err),
        hp_prefix_cache_create(&llm.model.cfg, &pcp, llm.model.be, &err)};
    hp_fwd_ws_t ws;
    if (hp_fwd_ws_init(&ws, &llm.model, NULL, &err) != HP_OK)
        return bench_fail(&err);
    float *lg = malloc((size_t)c->vocab_size * 4);
    const char *names[] = {"full", "prefix", "naive (warm)", "pic (warm)",
                           "pic (cold)"};
    hp_ipc_mode_t modes[] = {HP_IPC_MODE_FULL, HP_IPC_MODE_PREFIX,
                             HP_IPC_MODE_NAIVE, HP_IPC_MODE_PIC,
                             HP_IPC_MODE_PIC};
    double best[5];
    hp_assemble_stats_t st[5];
    hp_seq_t keep[5];

    printf("# model %s: %d layers, hidden %d; prompt %d tokens = lead %d + "
           "docs %s + query %d; seam %d; best of %d\n",
           model, c->n_layers, c->hidden, p.n, nl, segs, nq, w, reps);
    for (int k = 0; k < 5; k++) {
        best[k] = 1e30;
        for (int r = 0; r < reps; r++) {
            hp_pool_clear(cache.pub);
            hp_prefix_cache_clear(cache.prefix);
            hp_seq_t warm;
            hp_seq_init(&warm, &llm.model, &err);
            if (k == 1) /* other document order: only the lead is shared */
                hp_assemble(&llm, &cache, &ws, &pw, HP_IPC_MODE_PREFIX, w,
                            &warm, lg, NULL, &err);
            if (k == 2 || k == 3)
                hp_assemble_warm(&llm, &cache, &ws, &pw, modes[k], w, NULL,
                                 &err);
            hp_seq_free(&warm);
            hp_seq_t seq;
            hp_seq_init(&seq, &llm.model, &err);
            double t0 = bench_now();
            int rc = hp_assemble(&llm, &cache, &ws, &p, modes[k], w, &seq, lg,
                                 &st[k], &err);
            double dt = bench_now() - t0;
            if (rc != HP_OK) {
                fprintf(stderr, "%s: %s\n", names[k], err.msg);
                return 1;
            }
            if (dt < best[k])
                best[k] = dt;
            if (r == reps - 1)
                keep[k] = seq;
            else
                hp_seq_free(&seq);
        }
    }
    printf("| mode | TTFT ms | speedup vs full | recomputed tokens | cached "
           "tokens |\n|---|---|---|---|---|\n");
    for (int k = 0; k < 5; k++)
        printf("| %s | %.1f | %.2fx | %d | %d |\n", names[k], best[k] * 1e3,
               best[0] / best[k], st[k].recomputed_tokens, st[k].cached_tokens);
    double per_tok = best[0] / p.n;
    printf("# full prefill: %.3f ms/token (%.0f tokens/s)\n", per_tok * 1e3,
           1.0 / per_tok);

    printf("\n| linear layer | naive rel. state error | pic rel. state "
           "error |\n|---|---|---|\n");
    size_t ssz = c->state_floats;
    for (int l = 0; l < c->n_layers; l++)
        if (c->layer_kind[l] == HP_LAYER_LINEAR)
            printf("| %d | %.2e | %.2e |\n", l,
                   rel(keep[0].layers[l].S, keep[2].layers[l].S, ssz),
                   rel(keep[0].layers[l].S, keep[3].layers[l].S, ssz));
    return 0;
}
