/*
 * cmd_run.c - the one-shot commands that run the model: logits, state and
 * generate. They share loading, prompt building and the prefill.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/cli/cli.h"
#include "engine/cli/options.h"
#include "engine/dump.h"
#include "engine/forward.h"
#include "engine/generate.h"
#include "engine/llm.h"
#include "engine/prompt.h"

#define PREFILL_PIECE 1024

typedef struct {
    hp_cli_opts_t o;
    hp_llm_t llm;
    hp_prompt_t prompt;
    hp_seq_t seq;
    hp_fwd_ws_t ws;
    float *logits; /* [vocab] or, with --all, [n, vocab] */
    int loaded;
} run_t;

static void usage(const char *cmd)
{
    printf("usage: hypic-engine %s --model DIR (--prompt S | --prompt-file F)"
           "%s\n",
           cmd,
           !strcmp(cmd, "generate")
               ? " [--max-tokens N] [--temperature T] [--top-p P]\n"
                 "       [--top-k K] [--seed S] [--stop S]... [--mode M] "
                 "[--seam W] [--separator S]"
               : " --out F.safetensors\n       [--mode M] [--seam W] "
                 "[--separator S] [--cold]"
                 "" );
    if (!strcmp(cmd, "logits"))
        printf("       [--all]   all positions' logits [tokens, vocab]\n");
}

static void run_free(run_t *r)
{
    free(r->logits);
    hp_fwd_ws_free(&r->ws);
    if (r->seq.layers)
        hp_seq_free(&r->seq);
    hp_prompt_free(&r->prompt);
    if (r->loaded)
        hp_llm_free(&r->llm);
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
    if (strcmp(r->o.mode, "full") != 0) {
        fprintf(stderr, "hypic-engine %s: mode '%s' is not available in "
                "this build (only 'full')\n", cmd, r->o.mode);
        return 2;
    }
    char *text = hp_cli_prompt(&r->o, cmd, &len);
    if (!text)
        return 2;
    rc = hp_llm_load(&r->llm, r->o.model, &err);
    r->loaded = rc == HP_OK;
    if (rc == HP_OK)
        rc = hp_prompt_build(&r->prompt, &r->llm, text, len,
                             r->o.separator, &err);
    free(text);
    if (rc == HP_OK)
        rc = hp_seq_init(&r->seq, &r->llm.model, &err);
    if (rc != HP_OK) {
        fprintf(stderr, "hypic-engine %s: %s\n", cmd, err.msg);
        return 1;
    }
    hp_fwd_ws_init(&r->ws);
    int V = r->llm.model.cfg.vocab_size, n = r->prompt.n;
    size_t rows = r->o.all ? (size_t)n : 1;
    r->logits = malloc(rows * V * sizeof(float));
    if (!r->logits) {
        fprintf(stderr, "hypic-engine %s: out of memory\n", cmd);
        return 1;
    }
    if (r->o.all) {
        for (int off = 0; off < n && rc == HP_OK; off += PREFILL_PIECE) {
            int k = n - off < PREFILL_PIECE ? n - off : PREFILL_PIECE;
            rc = hp_forward(&r->llm.model, &r->seq, &r->ws,
                            r->prompt.ids + off, NULL, k, NULL,
                            HP_LOGITS_ALL, r->logits + (size_t)off * V, &err);
        }
    } else {
        rc = hp_prefill(&r->llm.model, &r->seq, &r->ws, r->prompt.ids, n,
                        PREFILL_PIECE, r->logits, &err);
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
    if (rc == 0) {
        hp_gen_params_t p = {0};
        p.max_tokens = r.o.max_tokens;
        p.sampling = (hp_sampling_t){r.o.temperature, r.o.top_k, r.o.top_p,
                                     r.o.seed};
        for (int i = 0; i < r.o.n_stop && i < HP_GEN_MAX_STOP; i++)
            p.stop[p.n_stop++] = r.o.stop[i];
        if (hp_generate(&r.llm, &r.seq, &r.ws, r.logits, &p, print_text,
                        NULL, &res, &err) != HP_OK) {
            fprintf(stderr, "\nhypic-engine generate: %s\n", err.msg);
            rc = 1;
        } else {
            printf("\n");
        }
        free(res.tokens);
    }
    run_free(&r);
    return rc < 0 ? 0 : rc;
}
