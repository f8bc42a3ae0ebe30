/* options.c - flag parsing shared by the one-shot subcommands. */
#include "engine/cli/options.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/model/model.h"

static int want_int(const char *cmd, const char *flag, const char *v, int lo,
                    int hi, int *out)
{
    char *end;
    errno = 0;
    long x = v ? strtol(v, &end, 10) : 0;
    if (!v || errno || *end || x < lo || x > hi) {
        fprintf(stderr, "hypic-engine %s: %s needs an integer in [%d, %d]\n",
                cmd, flag, lo, hi);
        return -1;
    }
    *out = (int)x;
    return 0;
}

static int want_float(const char *cmd, const char *flag, const char *v,
                      float lo, float hi, float *out)
{
    char *end;
    errno = 0;
    float x = v ? strtof(v, &end) : 0;
    if (!v || errno || *end || !(x >= lo && x <= hi)) {
        fprintf(stderr, "hypic-engine %s: %s needs a number in [%g, %g]\n", cmd,
                flag, lo, hi);
        return -1;
    }
    *out = x;
    return 0;
}

int hp_cli_parse(hp_cli_opts_t *o, int argc, char **argv, const char *cmd)
{
    memset(o, 0, sizeof(*o));
    o->mode = "full";
    o->separator = "<|pic_sep|>";
    o->decode = "auto";
    o->device = "cpu";
    o->seam = 8;
    o->max_tokens = 64;
    o->top_p = 1.0f;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int rc = 0, used = 1;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            o->help = 1;
            used = 0;
        } else if (!strcmp(a, "--all")) {
            o->all = 1;
            used = 0;
        } else if (!strcmp(a, "--cold")) {
            o->cold = 1;
            used = 0;
        } else if (!v) {
            fprintf(stderr, "hypic-engine %s: %s needs a value\n", cmd, a);
            return -1;
        } else if (!strcmp(a, "--model")) {
            o->model = v;
        } else if (!strcmp(a, "--device")) {
            o->device = v; /* checked when opened (hp_backend_open) */
        } else if (!strcmp(a, "--dtype")) {
            hp_compute_t d;
            if (hp_compute_parse(v, &d)) {
                fprintf(stderr,
                        "hypic-engine %s: --dtype is auto, f32 or bf16, "
                        "not '%s'\n",
                        cmd, v);
                return -1;
            }
            o->dtype = (int)d;
        } else if (!strcmp(a, "--prompt") || !strcmp(a, "--text")) {
            o->text = v;
        } else if (!strcmp(a, "--prompt-file") || !strcmp(a, "--file")) {
            o->file = v;
        } else if (!strcmp(a, "--out")) {
            o->out = v;
        } else if (!strcmp(a, "--mode")) {
            if (strcmp(v, "full") && strcmp(v, "prefix") &&
                strcmp(v, "naive") && strcmp(v, "pic")) {
                fprintf(stderr,
                        "hypic-engine %s: --mode is full, prefix, naive "
                        "or pic, not '%s'\n",
                        cmd, v);
                return -1;
            }
            o->mode = v;
        } else if (!strcmp(a, "--separator")) {
            if (!*v) {
                fprintf(stderr, "hypic-engine %s: empty --separator\n", cmd);
                return -1;
            }
            o->separator = v;
        } else if (!strcmp(a, "--decode")) {
            if (strcmp(v, "recurrent") && strcmp(v, "chunkwise") &&
                strcmp(v, "auto")) {
                fprintf(stderr,
                        "hypic-engine %s: --decode is recurrent, chunkwise "
                        "or auto\n",
                        cmd);
                return -1;
            }
            o->decode = v;
        } else if (!strcmp(a, "--seam")) {
            rc = want_int(cmd, a, v, 0, 4096, &o->seam);
        } else if (!strcmp(a, "--max-tokens")) {
            rc = want_int(cmd, a, v, 0, 1 << 20, &o->max_tokens);
        } else if (!strcmp(a, "--top-k")) {
            rc = want_int(cmd, a, v, 0, 1 << 30, &o->top_k);
        } else if (!strcmp(a, "--speculative")) {
            rc = want_int(cmd, a, v, 0, 64, &o->speculative);
        } else if (!strcmp(a, "--temperature")) {
            rc = want_float(cmd, a, v, 0.0f, 100.0f, &o->temperature);
        } else if (!strcmp(a, "--top-p")) {
            rc = want_float(cmd, a, v, 0.0f, 1.0f, &o->top_p);
        } else if (!strcmp(a, "--seed")) {
            char *end;
            errno = 0;
            o->seed = strtoull(v, &end, 10);
            if (errno || *end) {
                fprintf(stderr, "hypic-engine %s: bad --seed\n", cmd);
                return -1;
            }
        } else if (!strcmp(a, "--stop")) {
            if (o->n_stop == (int)(sizeof(o->stop) / sizeof(o->stop[0]))) {
                fprintf(stderr, "hypic-engine %s: too many --stop\n", cmd);
                return -1;
            }
            o->stop[o->n_stop++] = v;
        } else {
            fprintf(stderr, "hypic-engine %s: unknown option '%s'\n", cmd, a);
            return -1;
        }
        if (rc)
            return -1;
        i += used;
    }
    return 0;
}

char *hp_cli_prompt(const hp_cli_opts_t *o, const char *cmd, size_t *len)
{
    if (o->text) {
        *len = strlen(o->text);
        return strdup(o->text);
    }
    if (!o->file) {
        fprintf(stderr, "hypic-engine %s: give --prompt S or --prompt-file F\n",
                cmd);
        return NULL;
    }
    FILE *f = fopen(o->file, "rb");
    if (!f) {
        fprintf(stderr, "hypic-engine %s: cannot open %s: %s\n", cmd, o->file,
                strerror(errno));
        return NULL;
    }
    size_t cap = 1 << 16, n = 0, r;
    char *buf = malloc(cap + 1);
    while (buf && (r = fread(buf + n, 1, cap - n, f)) > 0) {
        n += r;
        if (n == cap) {
            char *nb = realloc(buf, 2 * cap + 1);
            if (!nb) {
                free(buf);
                buf = NULL;
                break;
            }
            buf = nb;
            cap *= 2;
        }
    }
    fclose(f);
    if (!buf) {
        fprintf(stderr, "hypic-engine %s: out of memory reading %s\n", cmd,
                o->file);
        return NULL;
    }
    buf[n] = '\0';
    *len = n;
    return buf;
}
