/*
 * main.c - hypic-engine: one binary, one subcommand per job (DESIGN §10).
 * Each subcommand lives in its own cli/cmd_*.c and returns the exit code.
 */
#include <stdio.h>
#include <string.h>

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
};

static void usage(FILE *out)
{
    fprintf(out, "usage: hypic-engine COMMAND [options]\n\ncommands:\n");
    for (size_t i = 0; i < sizeof(commands) / sizeof(commands[0]); i++)
        fprintf(out, "  %-10s %s\n", commands[i].name, commands[i].help);
    fprintf(out, "\n'hypic-engine COMMAND --help' for a command's options\n");
}

int main(int argc, char **argv)
{
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
