/*
 * engine_throughput.c - prefill and decode tokens/s of the CPU engine on a
 * model directory, beside the machine's OpenBLAS sgemm GFLOP/s (issue 3).
 *
 *   build/bench/engine_throughput --model DIR [--tokens 512,2048,8192]
 *       [--decode 32] [--piece 2048]
 *
 * Prefill efficiency is reported as the GEMM work of the forward pass
 * (2 x weights touched per token, the LM head for the last token only)
 * over the wall time, against a same-shape sgemm measured in this run.
 */
#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/bench_util.h"
#include "engine/forward/forward.h"
#include "engine/forward/sampler.h"
#include "engine/model/llm.h"

/* sgemm of [M,K] x [N,K]^T, best of 3 */
static double sgemm_gflops(int M, int N, int K)
{
    float *a = malloc(4L * M * K), *b = malloc(4L * N * K),
          *c = malloc(4L * M * N);
    for (long i = 0; i < (long)M * K; i++)
        a[i] = (float)(i % 97) * 0.01f;
    for (long i = 0; i < (long)N * K; i++)
        b[i] = (float)(i % 89) * 0.01f;
    double best = 1e30;
    for (int r = 0; r < 4; r++) {
        double t0 = bench_now();
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, M, N, K, 1.0f, a,
                    K, b, K, 0.0f, c, N);
        double dt = bench_now() - t0;
        if (r > 0 && dt < best)
            best = dt;
    }
    free(a);
    free(b);
    free(c);
    return 2.0 * M * N * K / best / 1e9;
}

/* Weights one token multiplies (excluding embedding lookup and head). */
static double gemm_flops_per_token(const hp_model_config_t *c)
{
    double H = c->hidden, w = 0;
    for (int l = 0; l < c->n_layers; l++) {
        if (c->layer_kind[l] == HP_LAYER_LINEAR)
            w += H * (hp_cfg_conv_dim(c) + hp_cfg_value_dim(c) +
                      2.0 * c->lin_v_heads) +
                 (double)hp_cfg_value_dim(c) * H;
        else
            w += H * (2.0 * c->n_heads * c->head_dim +
                      2.0 * c->n_kv_heads * c->head_dim) +
                 (double)c->n_heads * c->head_dim * H;
        if (c->layer_moe[l])
            w += H * c->n_experts +
                 3.0 * H * c->moe_intermediate * c->n_experts_per_tok +
                 3.0 * H * c->shared_intermediate;
        else
            w += 3.0 * H * c->intermediate;
    }
    return 2.0 * w;
}

int main(int argc, char **argv)
{
    const char *model = NULL, *toks = "512,2048,8192";
    int n_dec = 32, piece = 2048;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--model"))
            model = argv[i + 1];
        else if (!strcmp(argv[i], "--tokens"))
            toks = argv[i + 1];
        else if (!strcmp(argv[i], "--decode"))
            n_dec = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--piece"))
            piece = atoi(argv[i + 1]);
    }
    if (!model) {
        fprintf(stderr, "usage: engine_throughput --model DIR [--tokens "
                        "a,b,c] [--decode N] [--piece P]\n");
        return 2;
    }
    hp_llm_t llm;
    hp_error_t err = {0};
    double t0 = bench_now();
    if (hp_llm_load(&llm, model, &err) != HP_OK)
        return bench_fail(&err);
    const hp_model_config_t *c = &llm.model.cfg;
    printf("# %s: %d layers, hidden %d, vocab %d, loaded in %.1f s\n", model,
           c->n_layers, c->hidden, c->vocab_size, bench_now() - t0);
    double peak =
        sgemm_gflops(piece < 2048 ? piece : 2048,
                     c->intermediate ? c->intermediate : 2048, c->hidden);
    printf("# OpenBLAS sgemm [%d x %d] x [%d x %d]^T: %.1f GFLOP/s (%s)\n",
           piece < 2048 ? piece : 2048, c->hidden,
           c->intermediate ? c->intermediate : 2048, c->hidden, peak,
           openblas_get_corename());
    double fpt = gemm_flops_per_token(c);
    printf("| tokens | prefill tok/s | GEMM GFLOP/s | %% of sgemm | decode "
           "tok/s (after prefill) |\n|---|---|---|---|---|\n");
    hp_fwd_ws_t ws;
    if (hp_fwd_ws_init(&ws, &llm.model, NULL, &err) != HP_OK)
        return bench_fail(&err);
    float *lg = malloc((size_t)c->vocab_size * 4);
    for (const char *s = toks; *s;) {
        int T = atoi(s);
        s += strcspn(s, ",");
        s += *s == ',';
        int *ids = malloc((size_t)T * sizeof(int));
        for (int t = 0; t < T; t++)
            ids[t] =
                (int)((t * 7919u + 13) %
                      (unsigned)(c->vocab_size < 4000 ? c->vocab_size : 4000));
        hp_seq_t seq;
        hp_seq_init(&seq, &llm.model, &err);
        double a = bench_now();
        if (hp_prefill(&llm.model, &seq, &ws, ids, T, piece, lg, &err) != HP_OK)
            return bench_fail(&err);
        double dt = bench_now() - a;
        double b = bench_now();
        for (int k = 0; k < n_dec; k++) {
            int tok = hp_argmax(lg, c->vocab_size);
            hp_forward(&llm.model, &seq, &ws, &tok, NULL, 1, NULL,
                       HP_LOGITS_LAST, lg, &err);
        }
        double dd = bench_now() - b;
        double gf = fpt * T / dt / 1e9;
        printf("| %d | %.1f | %.1f | %.0f%% | %.2f |\n", T, T / dt, gf,
               100 * gf / peak, n_dec / dd);
        fflush(stdout);
        hp_seq_free(&seq);
        free(ids);
    }
    return 0;
}
