/* options.h - the flags the one-shot subcommands share (DESIGN §10). */
#ifndef HP_CLI_OPTIONS_H
#define HP_CLI_OPTIONS_H

#include <stddef.h>
#include <stdint.h>

typedef struct {
    const char *model;     /* --model DIR */
    const char *text;      /* --prompt S / --text S */
    const char *file;      /* --prompt-file F / --file F */
    const char *out;       /* --out F.safetensors */
    const char *mode;      /* --mode full|prefix|naive|pic */
    const char *separator; /* --separator S */
    const char *decode;    /* --decode recurrent|chunkwise|auto */
    const char *device;    /* --device cpu|cuda|cuda:N */
    int dtype;             /* --dtype auto|f32|bf16 (hp_compute_t) */
    int all;               /* --all */
    int cold;              /* --cold */
    int seam;              /* --seam W */
    int max_tokens;        /* --max-tokens N */
    float temperature;     /* --temperature T */
    float top_p;           /* --top-p P */
    int top_k;             /* --top-k K */
    uint64_t seed;         /* --seed S */
    int speculative;       /* --speculative N */
    const char *stop[8];   /* --stop S (repeatable) */
    int n_stop;
    int help;
} hp_cli_opts_t;

/* Parses argv (argv[0] is the command name). Unknown flags or bad values
 * print a message naming the flag and return -1. */
int hp_cli_parse(hp_cli_opts_t *o, int argc, char **argv, const char *cmd);

/* The prompt text: --prompt, or the contents of --prompt-file (malloc'd,
 * *len set). NULL with a message on stderr if neither or unreadable. */
char *hp_cli_prompt(const hp_cli_opts_t *o, const char *cmd, size_t *len);

#endif
