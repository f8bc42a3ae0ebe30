/*
 * engine_throughput.c - prefill and decode tokens/s of the CPU engine on a
 * model directory in any of our weight formats (f32, bf16, int8: README
 * "Weight formats"), beside the machine's OpenBLAS sgemm GFLOP/s.
 *
 *   build/bench/engine_throughput --model DIR [--tokens 512,2048,8192]
 *       [--decode 32] [--piece 2048] [--reps 1]
 *
 * An untimed warm-up (a 64-token prefill and 4 decode steps: page faults
 * on the mapped weights, thread pools, caches) runs first. Each row is the
 * median of --reps runs. Prefill efficiency is reported as the GEMM work of
 * the forward pass (2 x weights touched per token, the LM head for the last
 * token only) over the wall time, against a same-shape sgemm measured in
 * this run. After the table, one decode step is split into its LM head
 * product and the argmax over the logits (what a fused head-argmax would
 * save at most).
 */
#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/bench_engine.h"
#include "bench/bench_util.h"
#include "engine/forward/forward.h"
#include "engine/forward/sampler.h"
#include "engine/model/llm.h"
#include "kernels/cpu/hk_cpu.h"

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

/* A T-token prefill (seconds into *tp) then n_dec greedy steps (*td). */
static int run_once(const hp_model_t *m, hp_fwd_ws_t *ws, const int *ids, int T,
                    int piece, int n_dec, float *lg, double *tp, double *td,
                    hp_error_t *err)
{
    const int V = m->cfg.vocab_size;
    hp_seq_t seq;
    int rc = hp_seq_init(&seq, m, err);
    double a = bench_now();
    if (rc == HP_OK)
        rc = hp_prefill(m, &seq, ws, ids, T, piece, lg, err);
    double b = bench_now();
    for (int k = 0; k < n_dec && rc == HP_OK; k++) {
        int tok = hp_argmax(lg, V);
        rc = hp_forward(m, &seq, ws, &tok, NULL, 1, NULL, HP_LOGITS_LAST, lg,
                        err);
    }
    *tp = b - a;
    *td = bench_now() - b;
    hp_seq_free(&seq);
    return rc;
}

/* One decode step's LM head product and argmax, best of 20. */
static void head_split(const hp_model_t *m, float *lg)
{
    const int H = m->cfg.hidden, V = m->cfg.vocab_size;
    float *y = malloc((size_t)H * sizeof(float));
    double head = 1e30, amax = 1e30;
    for (int i = 0; i < H; i++)
        y[i] = (float)((i * 37 % 101) - 50) * 0.02f;
    for (int r = 0; r < 20; r++) {
        double a = bench_now();
        hk_linear(lg, y, &m->lm_head, 1);
        double b = bench_now();
        volatile int t = hp_argmax(lg, V);
        (void)t;
        double c = bench_now();
        head = b - a < head ? b - a : head;
        amax = c - b < amax ? c - b : amax;
    }
    printf("# decode step: LM head %.2f ms, argmax over %d logits %.3f ms\n",
           head * 1e3, V, amax * 1e3);
    free(y);
}

int main(int argc, char **argv)
{
    const char *model = NULL, *toks = "512,2048,8192";
    int n_dec = 32, piece = 2048, reps = 1;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--model"))
            model = argv[i + 1];
        else if (!strcmp(argv[i], "--tokens"))
            toks = argv[i + 1];
        else if (!strcmp(argv[i], "--decode"))
            n_dec = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--piece"))
            piece = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--reps"))
            reps = atoi(argv[i + 1]);
    }
    if (!model || reps < 1 || reps > 99) {
        fprintf(stderr, "usage: engine_throughput --model DIR [--tokens "
                        "a,b,c] [--decode N] [--piece P] [--reps R]\n");
        return 2;
    }
    hp_llm_t llm;
    hp_error_t err = {0};
    double t0 = bench_now();
    if (hp_llm_load(&llm, model, &err) != HP_OK)
        return bench_fail(&err);
    const hp_model_t *m = &llm.model;
    const hp_model_config_t *c = &m->cfg;
    printf("# %s: %d layers, hidden %d, vocab %d, loaded in %.1f s\n", model,
           c->n_layers, c->hidden, c->vocab_size, bench_now() - t0);
    printf("# weights: f32 %.1f MB, bf16 %.1f MB, int8 %.1f MB (with "
           "scales); kernels: bf16 %s, int8 %s\n",
           m->weight_bytes[HK_W_F32] / 1e6, m->weight_bytes[HK_W_BF16] / 1e6,
           m->weight_bytes[HK_W_I8] / 1e6, hk_isa_name(hk_cpu_isa(HK_W_BF16)),
           hk_isa_name(hk_cpu_isa(HK_W_I8)));
    double peak =
        sgemm_gflops(piece < 2048 ? piece : 2048,
                     c->intermediate ? c->intermediate : 2048, c->hidden);
    printf("# OpenBLAS sgemm [%d x %d] x [%d x %d]^T: %.1f GFLOP/s (%s)\n",
           piece < 2048 ? piece : 2048, c->hidden,
           c->intermediate ? c->intermediate : 2048, c->hidden, peak,
           openblas_get_corename());
    double fpt = gemm_flops_per_token(c);
    hp_fwd_ws_t ws;
    if (hp_fwd_ws_init(&ws, &llm.model, NULL, &err) != HP_OK)
        return bench_fail(&err);
    float *lg = malloc((size_t)c->vocab_size * 4);
    int *ids = NULL;
    double tp[99], td[99];
    /* warm-up, untimed */
    int wT = 64;
    ids = malloc((size_t)wT * sizeof(int));
    for (int t = 0; t < wT; t++)
        ids[t] = bench_prompt_id(t, c->vocab_size);
    if (run_once(m, &ws, ids, wT, piece, 4, lg, tp, td, &err) != HP_OK)
        return bench_fail(&err);
    free(ids);
    printf("| tokens | prefill tok/s | GEMM GFLOP/s | %% of sgemm | decode "
           "tok/s (after prefill) |\n|---|---|---|---|---|\n");
    for (const char *s = toks; *s;) {
        int T = bench_next_int(&s);
        ids = malloc((size_t)T * sizeof(int));
        for (int t = 0; t < T; t++)
            ids[t] = bench_prompt_id(t, c->vocab_size);
        for (int r = 0; r < reps; r++)
            if (run_once(m, &ws, ids, T, piece, n_dec, lg, &tp[r], &td[r],
                         &err) != HP_OK)
                return bench_fail(&err);
        double dt = bench_median(tp, reps), dd = bench_median(td, reps);
        double gf = fpt * T / dt / 1e9;
        printf("| %d | %.1f | %.1f | %.0f%% | %.2f |\n", T, T / dt, gf,
               100 * gf / peak, n_dec / dd);
        fflush(stdout);
        free(ids);
    }
    head_split(m, lg);
    free(lg);
    hp_fwd_ws_free(&ws);
    hp_llm_free(&llm);
    return 0;
}
