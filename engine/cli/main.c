/*
 * main.c - hypic-engine: one binary, one subcommand per job (DESIGN §10).
 * Each subcommand lives in its own cli/cmd_*.c and returns the exit code.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/cli/cli.h"

static const struct {
    const char *name;
    int (*run)(int argc, char **argv);
    const char *help;
} commands[] = {
    {"tokenize", hp_cmd_tokenize, "token ids of a text, one line"},
    {"generate", hp_cmd_generate, "generate text from a prompt"},
    {"logits", hp_cmd_logits, "write last (or all) logits as safetensors"},
    {"state", hp_cmd_state, "write the states after prefill as safetensors"},
    {"serve", hp_cmd_serve, "run the engine service"},
    {"chat", hp_cmd_chat, "the prompt the chat template makes of a request"},
};

/*
 * The thread runtimes read their settings when they load, before main, so
 * the process re-executes itself once with them set (never overriding what
 * the environment already says):
 *  - GOMP_SPINCOUNT=20000: an idle OpenMP worker spins briefly, then
 *    sleeps. The engine shares its cores with nginx and Redis: spinning
 *    without a bound (OMP_WAIT_POLICY=ACTIVE) cut 0.8B prefill on a busy
 *    2-core host from 67 to 16 tokens/s and decode from 2.6 to 0.5; never
 *    spinning (PASSIVE) pays a wake-up at each of a decode step's ~380
 *    parallel regions: 0.8B f32 decode 7.96-8.00 tokens/s against
 *    8.75-8.86 with this bound on an idle host, and no loss beside two
 *    busy loops (prefill 61-65 against 63-69, decode 3.2-3.7 / 3.7-4.0).
 *  - OPENBLAS_CORETYPE=SkylakeX on AVX-512 CPUs: OpenBLAS 0.3.21 does not
 *    know recent cores and falls back to its SSE3 kernels (4-5x slower
 *    sgemm); the AVX-512 kernels were checked against a naive product.
 */
static void tune_runtime(char **argv)
{
    int again = 0;
    if (getenv("HYPIC_NO_REEXEC"))
        return;
    if (!getenv("OMP_WAIT_POLICY") && !getenv("GOMP_SPINCOUNT")) {
        setenv("GOMP_SPINCOUNT", "20000", 1);
        again = 1;
    }
    if (!getenv("OPENBLAS_CORETYPE") && __builtin_cpu_supports("avx512f") &&
        __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512dq") &&
        __builtin_cpu_supports("avx512vl")) {
        setenv("OPENBLAS_CORETYPE", "SkylakeX", 1);
        again = 1;
    }
    if (again) {
        setenv("HYPIC_NO_REEXEC", "1", 1);
        execv("/proc/self/exe", argv); /* on failure: run as we are */
    }
}

static void usage(FILE *out)
{
    fprintf(out, "usage: hypic-engine COMMAND [options]\n\ncommands:\n");
    for (size_t i = 0; i < sizeof(commands) / sizeof(commands[0]); i++)
        fprintf(out, "  %-10s %s\n", commands[i].name, commands[i].help);
    fprintf(out, "\n'hypic-engine COMMAND --help' for a command's options\n");
}

int main(int argc, char **argv)
{
    tune_runtime(argv);
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
        usage(stdout);
        return 0;
    }
    for (size_t i = 0; i < sizeof(commands) / sizeof(commands[0]); i++)
        if (!strcmp(argv[1], commands[i].name))
            return commands[i].run(argc - 1, argv + 1);
    fprintf(stderr, "hypic-engine: unknown command '%s'\n", argv[1]);
    usage(stderr);
    return 2;
}
