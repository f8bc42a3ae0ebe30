/*
 * cmd_run.c - the one-shot commands that run the model: logits, state and
 * generate. They share loading, prompt building and the prefill.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/cache/assemble.h"
#include "engine/cache/prompt.h"
#include "engine/cache/segcache.h"
#include "engine/cli/cli.h"
#include "engine/cli/options.h"
#include "engine/forward/dump.h"
#include "engine/forward/forward.h"
#include "engine/forward/generate.h"
#include "engine/forward/kvbuf.h"
#include "engine/model/llm.h"

#define PREFILL_PIECE 1024

typedef struct {
    hp_cli_opts_t o;
    const hp_backend_t *be; /* --device */
    hp_llm_t llm;
    hp_prompt_t prompt;
    hp_seq_t seq;
    hp_fwd_ws_t ws;
    float *logits; /* [vocab] or, with --all, [n, vocab] */
    hp_cache_t cache;
    hp_assemble_stats_t stats;
    hp_kvbuf_pool_t kvpool; /* generate: KVBuffer decoding */
    int kvb;                /* 1: pool made; 2: opened before the prefill */
    int loaded;
} run_t;

/* One-shot runs on the CPU reserve generous address space; pages are
 * touched only as entries are written. */
#define CLI_PUBLIC_POOL  (8ull << 30)
#define CLI_PRIVATE_POOL (2ull << 30)

static void usage(const char *cmd)
{
    printf("usage: hypic-engine %s --model DIR (--prompt S | --prompt-file F)"
           " [--device cpu|cuda[:N]]\n       [--dtype auto|f32|bf16]%s\n",
           cmd,
           !strcmp(cmd, "generate")
               ? " [--max-tokens N] [--temperature T] [--top-p P]\n"
                 "       [--top-k K] [--seed S] [--stop S]... [--mode M] "
                 "[--seam W] [--separator S]"
               : " --out F.safetensors\n       [--mode M] [--seam W] "
                 "[--separator S] [--cold]"
                 "");
    if (!strcmp(cmd, "logits"))
        printf("       [--all]   all positions' logits [tokens, vocab]\n");
}

static void run_free(run_t *r)
{
    hp_error_t err;
    if (r->kvb && r->seq.layers)
        hp_seq_kvbuf_close(&r->seq, &err);
    if (r->kvb)
        hp_kvbuf_pool_free(&r->kvpool);
    free(r->logits);
    hp_fwd_ws_free(&r->ws);
    hp_pool_destroy(r->cache.pub);
    hp_prefix_cache_destroy(r->cache.prefix);
    if (r->seq.layers)
        hp_seq_free(&r->seq);
    hp_prompt_free(&r->prompt);
    if (r->loaded)
        hp_llm_free(&r->llm);
    hp_backend_close(r->be);
}

/* Parses, loads, builds the prompt and prefills it. 0, or an exit code. */
static int run_prefill(run_t *r, int argc, char **argv, const char *cmd,
                       int need_out)
{
    hp_error_t err = {0};
    size_t len;
    int rc;

    memset(r, 0, sizeof(*r));
    if (hp_cli_parse(&r->o, argc, argv, cmd) != 0)
        return 2;
    if (r->o.help) {
        usage(cmd);
        return -1;
    }
    if (!r->o.model || (need_out && !r->o.out)) {
        fprintf(stderr, "hypic-engine %s: --model%s required\n", cmd,
                need_out ? " and --out are" : " is");
        return 2;
    }
    hp_ipc_mode_t mode = (hp_ipc_mode_t)hp_mode_parse(r->o.mode);
    if (r->o.all && mode != HP_IPC_MODE_FULL) {
        fprintf(stderr,
                "hypic-engine %s: --all needs --mode full (other "
                "modes do not recompute every position)\n",
                cmd);
        return 2;
    }
    char *text = hp_cli_prompt(&r->o, cmd, &len);
    if (!text)
        return 2;
    rc = hp_backend_open(&r->be, r->o.device, &err);
    if (rc != HP_OK) {
        free(text);
        fprintf(stderr, "hypic-engine %s: %s\n", cmd, err.msg);
        return rc == HP_EBADINPUT ? 2 : 1;
    }
    rc = hp_llm_load_on(&r->llm, r->o.model, r->be, &err);
    r->loaded = rc == HP_OK;
    if (rc == HP_OK)
        hp_model_set_compute(&r->llm.model, (hp_compute_t)r->o.dtype);
    if (rc == HP_OK)
        rc = hp_prompt_build(&r->prompt, &r->llm, text, len, r->o.separator,
                             &err);
    free(text);
    if (rc == HP_OK)
        rc = hp_seq_init(&r->seq, &r->llm.model, &err);
    if (rc == HP_OK) {
        /* a device's arenas are taken now, sized to this prompt: its
         * entries; in prefix mode its K/V and a few checkpoints (the
         * lead's end, the branch point, the prompt's end) */
        const hp_model_t *m = &r->llm.model;
        int host = hp_backend_host_memory(r->be);
        size_t pub =
            host ? CLI_PUBLIC_POOL
                 : hp_assemble_pool_bytes(&m->cfg, &r->prompt, mode, r->o.seam);
        size_t priv =
            host ? CLI_PRIVATE_POOL
            : mode == HP_IPC_MODE_PREFIX
                ? hp_seq_bytes(m, r->prompt.n) + 4 * hp_seq_bytes(m, 0)
                : 0;
        r->cache.pub = hp_segc_pool_create(r->be, pub, &err);
        hp_prefix_cache_params_t pcp;
        hp_prefix_cache_params_default(&pcp, priv);
        r->cache.prefix = hp_prefix_cache_create(&r->llm.model.cfg, &pcp,
                                                 r->llm.model.be, &err);
        if (!r->cache.pub || !r->cache.prefix)
            rc = HP_ENOMEM;
    }
    if (rc != HP_OK) {
        fprintf(stderr, "hypic-engine %s: %s\n", cmd, err.msg);
        return 1;
    }
    if (hp_fwd_ws_init(&r->ws, &r->llm.model, NULL, &err) != HP_OK) {
        fprintf(stderr, "hypic-engine %s: %s\n", cmd, err.msg);
        return 1;
    }
    int V = r->llm.model.cfg.vocab_size, n = r->prompt.n;
    int kvbuf = hp_backend_supports_op(r->be, HP_OP_KVBUF_STEP, 0);
    if (!kvbuf && !strcmp(cmd, "generate") &&
        (!strcmp(r->o.decode, "chunkwise") || r->o.speculative)) {
        fprintf(stderr,
                "hypic-engine generate: --decode chunkwise and "
                "--speculative need the KVBuffer, which device %s does "
                "not run\n",
                hp_backend_name(r->be));
        return 2;
    }
    if (kvbuf && !strcmp(cmd, "generate") &&
        (strcmp(r->o.decode, "recurrent") || r->o.speculative)) {
        const hp_model_config_t *c = &r->llm.model.cfg;
        hp_kvbuf_config_t kc;
        if (!strcmp(r->o.decode, "recurrent")) {
            fprintf(stderr, "hypic-engine generate: --speculative needs "
                            "--decode chunkwise or auto\n");
            return 2;
        }
        hp_kvbuf_config_default(&kc, c->lin_k_heads, c->lin_v_heads,
                                c->lin_k_dim, c->lin_v_dim);
        if (kc.max_step < r->o.speculative + 1)
            kc.max_step = r->o.speculative + 1;
        int most =
            (kc.cap > kc.cap_kvonly ? kc.cap : kc.cap_kvonly) + kc.max_step;
        kc.n_blocks = c->n_layers * (most / kc.block_tokens + 2);
        kc.n_states = c->n_layers;
        kc.be = r->llm.model.be;
        if (hp_kvbuf_pool_init(&r->kvpool, &kc, &err) != HP_OK) {
            fprintf(stderr, "hypic-engine generate: %s\n", err.msg);
            return 1;
        }
        r->kvb = 1;
        /* auto: a prompt that fits the KV-only limit never makes a state */
        if (!strcmp(r->o.decode, "auto") && mode == HP_IPC_MODE_FULL &&
            n <= kc.cap_kvonly) {
            if (hp_seq_kvbuf_open(&r->seq, &r->kvpool, &err) != HP_OK) {
                fprintf(stderr, "hypic-engine generate: %s\n", err.msg);
                return 1;
            }
            r->kvb = 2;
        }
    }
    size_t rows = r->o.all ? (size_t)n : 1;
    r->logits = malloc(rows * V * sizeof(float));
    if (!r->logits) {
        fprintf(stderr, "hypic-engine %s: out of memory\n", cmd);
        return 1;
    }
    if (r->o.all) {
        for (int off = 0; off < n && rc == HP_OK; off += PREFILL_PIECE) {
            int k = n - off < PREFILL_PIECE ? n - off : PREFILL_PIECE;
            rc = hp_forward(&r->llm.model, &r->seq, &r->ws, r->prompt.ids + off,
                            NULL, k, NULL, HP_LOGITS_ALL,
                            r->logits + (size_t)off * V, &err);
        }
    } else {
        /* naive/pic: each segment first warmed as its own request, so the
         * prompt runs with every segment hit; --cold skips that */
        if (!r->o.cold)
            rc = hp_assemble_warm(&r->llm, &r->cache, &r->ws, &r->prompt, mode,
                                  r->o.seam, NULL, &err);
        if (rc == HP_OK)
            rc = hp_assemble(&r->llm, &r->cache, &r->ws, &r->prompt, mode,
                             r->o.seam, &r->seq, r->logits, &r->stats, &err);
        if (rc == HP_OK && r->stats.recomputed_tokens == 0)
            rc = hp_error_set(&err, HP_EBADINPUT,
                              "every token is cached: the prompt needs a "
                              "query after its last separator");
    }
    if (rc != HP_OK) {
        fprintf(stderr, "hypic-engine %s: %s\n", cmd, err.msg);
        return 1;
    }
    return 0;
}

int hp_cmd_logits(int argc, char **argv)
{
    run_t r;
    hp_error_t err = {0};
    int rc = run_prefill(&r, argc, argv, "logits", 1);
    if (rc == 0 &&
        hp_dump_logits(r.o.out, r.logits, r.o.all ? r.prompt.n : 1,
                       r.llm.model.cfg.vocab_size, r.o.all, &err) != HP_OK) {
        fprintf(stderr, "hypic-engine logits: %s\n", err.msg);
        rc = 1;
    }
    run_free(&r);
    return rc < 0 ? 0 : rc;
}

int hp_cmd_state(int argc, char **argv)
{
    run_t r;
    hp_error_t err = {0};
    int rc = run_prefill(&r, argc, argv, "state", 1);
    if (rc == 0 && hp_dump_state(r.o.out, &r.seq, &err) != HP_OK) {
        fprintf(stderr, "hypic-engine state: %s\n", err.msg);
        rc = 1;
    }
    run_free(&r);
    return rc < 0 ? 0 : rc;
}

static int print_text(void *ud, const char *text, size_t len, int token)
{
    (void)ud;
    (void)token;
    fwrite(text, 1, len, stdout);
    fflush(stdout);
    return 0;
}

int hp_cmd_generate(int argc, char **argv)
{
    run_t r;
    hp_error_t err = {0};
    hp_gen_result_t res = {0};
    int rc = run_prefill(&r, argc, argv, "generate", 0);
    /* chunkwise: decoding continues from the prefill's state */
    if (rc == 0 && r.kvb == 1 &&
        hp_seq_kvbuf_open(&r.seq, &r.kvpool, &err) != HP_OK) {
        fprintf(stderr, "hypic-engine generate: %s\n", err.msg);
        rc = 1;
    }
    if (rc == 0) {
        hp_gen_params_t p = {0};
        p.max_tokens = r.o.max_tokens;
        p.speculative = r.o.speculative;
        p.ctx = r.prompt.ids;
        p.n_ctx = r.prompt.n;
        p.sampling =
            (hp_sampling_t){r.o.temperature, r.o.top_k, r.o.top_p, r.o.seed};
        for (int i = 0; i < r.o.n_stop && i < HP_GEN_MAX_STOP; i++)
            p.stop[p.n_stop++] = r.o.stop[i];
        if (hp_generate(&r.llm, &r.seq, &r.ws, r.logits, &p, print_text, NULL,
                        &res, &err) != HP_OK) {
            fprintf(stderr, "\nhypic-engine generate: %s\n", err.msg);
            rc = 1;
        } else {
            printf("\n");
            if (r.o.speculative)
                fprintf(stderr,
                        "hypic-engine generate: %d tokens in %d passes, "
                        "%d of %d drafted tokens accepted\n",
                        res.n_tokens, res.passes, res.accepted, res.drafted);
        }
        free(res.tokens);
    }
    run_free(&r);
    return rc < 0 ? 0 : rc;
}
