/*
 * cmd_tokenize.c - `hypic-engine tokenize`: token ids of a text (one line,
 * space separated), plus batch modes for the parity tests (DESIGN §10).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "engine/cli/cli.h"
#include "engine/tokenizer/tokenizer.h"

static const char usage_text[] =
    "usage: hypic-engine tokenize --model DIR (--text S | --file F)\n"
    "       hypic-engine tokenize --model DIR --batch F\n"
    "       hypic-engine tokenize --model DIR --decode-batch F\n"
    "\n"
    "Prints the token ids of a text, space separated, on one line.\n"
    "\n"
    "  --model DIR         model directory with tokenizer.json (or the\n"
    "                      tokenizer.json itself)\n"
    "  --text S            the text to tokenize\n"
    "  --file F            tokenize the bytes of file F (- for stdin)\n"
    "  --batch F           F holds records \"<byte count>\\n<bytes>\\n\"; one\n"
    "                      line of ids is printed per record\n"
    "  --decode-batch F    F holds one line of space-separated ids per item;\n"
    "                      each is decoded and printed as a record\n"
    "                      \"<byte count>\\n<bytes>\\n\"\n"
    "  --time              report load and encode times on stderr\n"
    "  --help              this text\n";

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Whole file (or stdin for "-"), malloc'd; NULL with a message. */
static char *slurp(const char *path, size_t *len)
{
    FILE *f = strcmp(path, "-") ? fopen(path, "rb") : stdin;
    if (!f) {
        fprintf(stderr, "hypic-engine tokenize: %s: %s\n", path,
                strerror(errno));
        return NULL;
    }
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap + 1);
    while (buf) {
        n += fread(buf + n, 1, cap - n, f);
        if (n < cap)
            break;
        char *nb = realloc(buf, 2 * cap + 1);
        if (!nb) {
            free(buf);
            buf = NULL;
            break;
        }
        buf = nb;
        cap *= 2;
    }
    int bad = ferror(f);
    if (f != stdin)
        fclose(f);
    if (!buf || bad) {
        fprintf(stderr, "hypic-engine tokenize: %s: %s\n", path,
                buf ? "read error" : "out of memory");
        free(buf);
        return NULL;
    }
    buf[n] = 0;
    *len = n;
    return buf;
}

static void print_ids(const hp_tokenizer_ids_t *ids)
{
    char buf[4096];
    size_t n = 0;
    for (size_t i = 0; i < ids->n; i++) {
        char d[16];
        int k = 0;
        uint32_t v = (uint32_t)ids->ids[i];
        do {
            d[k++] = (char)('0' + v % 10);
            v /= 10;
        } while (v);
        if (n + (size_t)k + 2 > sizeof(buf)) {
            fwrite(buf, 1, n, stdout);
            n = 0;
        }
        if (i)
            buf[n++] = ' ';
        while (k)
            buf[n++] = d[--k];
    }
    buf[n++] = '\n';
    fwrite(buf, 1, n, stdout);
}

static int encode_one(const hp_tokenizer_t *tok, const char *s, size_t n,
                      hp_tokenizer_ids_t *ids)
{
    hp_error_t err = {0};
    ids->n = 0;
    if (hp_tokenizer_encode(tok, s, n, ids, &err)) {
        fprintf(stderr, "hypic-engine tokenize: %s\n", err.msg);
        return 1;
    }
    return 0;
}

static int run_batch(const hp_tokenizer_t *tok, const char *buf, size_t len,
                     const char *path, size_t *bytes, size_t *tokens)
{
    hp_tokenizer_ids_t ids = {0};
    size_t i = 0, rec = 0;
    int rc = 0;
    while (i < len && !rc) {
        size_t n = 0, digits = 0;
        while (i < len && buf[i] >= '0' && buf[i] <= '9' && digits < 12) {
            n = n * 10 + (size_t)(buf[i++] - '0');
            digits++;
        }
        if (!digits || i >= len || buf[i] != '\n' || len - i - 1 < n + 1 ||
            buf[i + 1 + n] != '\n') {
            fprintf(stderr,
                    "hypic-engine tokenize: %s: record %zu is not "
                    "\"<byte count>\\n<bytes>\\n\"\n",
                    path, rec);
            rc = 1;
            break;
        }
        rc = encode_one(tok, buf + i + 1, n, &ids);
        if (!rc)
            print_ids(&ids);
        *bytes += n;
        *tokens += ids.n;
        i += n + 2;
        rec++;
    }
    hp_tokenizer_ids_free(&ids);
    return rc;
}

static int run_decode_batch(const hp_tokenizer_t *tok, char *buf, size_t len)
{
    hp_tokenizer_ids_t ids = {0};
    hp_tokenizer_text_t text = {0};
    int rc = 0;
    size_t line = 0;
    for (char *p = buf; p < buf + len && !rc; line++) {
        char *eol = memchr(p, '\n', (size_t)(buf + len - p));
        if (!eol)
            eol = buf + len;
        *eol = 0;
        ids.n = 0;
        for (char *q = p; *q && !rc;) {
            char *end;
            errno = 0;
            long v = strtol(q, &end, 10);
            if (end == q) {
                if (*q == ' ' || *q == '\r' || *q == '\t') {
                    q++;
                    continue;
                }
                fprintf(stderr,
                        "hypic-engine tokenize: line %zu: not an "
                        "id list\n",
                        line + 1);
                rc = 1;
                break;
            }
            if (errno || v < 0 || v > INT32_MAX) {
                fprintf(stderr,
                        "hypic-engine tokenize: line %zu: id out of "
                        "range\n",
                        line + 1);
                rc = 1;
                break;
            }
            if (ids.n == ids.cap) {
                size_t cap = ids.cap ? 2 * ids.cap : 64;
                int32_t *a = realloc(ids.ids, cap * sizeof(int32_t));
                if (!a) {
                    fprintf(stderr, "hypic-engine tokenize: out of memory\n");
                    rc = 1;
                    break;
                }
                ids.ids = a;
                ids.cap = cap;
            }
            ids.ids[ids.n++] = (int32_t)v;
            q = end;
        }
        if (rc)
            break;
        hp_error_t err = {0};
        text.len = 0;
        if (hp_tokenizer_decode(tok, ids.ids, ids.n, &text, &err)) {
            fprintf(stderr, "hypic-engine tokenize: line %zu: %s\n", line + 1,
                    err.msg);
            rc = 1;
            break;
        }
        printf("%zu\n", text.len);
        fwrite(text.data, 1, text.len, stdout);
        putchar('\n');
        p = eol + 1;
    }
    hp_tokenizer_ids_free(&ids);
    hp_tokenizer_text_free(&text);
    return rc;
}

int hp_cmd_tokenize(int argc, char **argv)
{
    const char *model = NULL, *text = NULL, *file = NULL, *batch = NULL,
               *decode = NULL;
    int timing = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char **slot = NULL;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            fputs(usage_text, stdout);
            return 0;
        } else if (!strcmp(a, "--time")) {
            timing = 1;
            continue;
        } else if (!strcmp(a, "--model")) {
            slot = &model;
        } else if (!strcmp(a, "--text")) {
            slot = &text;
        } else if (!strcmp(a, "--file")) {
            slot = &file;
        } else if (!strcmp(a, "--batch")) {
            slot = &batch;
        } else if (!strcmp(a, "--decode-batch")) {
            slot = &decode;
        } else {
            fprintf(stderr, "hypic-engine tokenize: unknown option '%s'\n%s", a,
                    usage_text);
            return 2;
        }
        if (i + 1 >= argc) {
            fprintf(stderr, "hypic-engine tokenize: %s needs a value\n", a);
            return 2;
        }
        *slot = argv[++i];
    }
    int inputs = !!text + !!file + !!batch + !!decode;
    if (!model || inputs != 1) {
        fprintf(stderr,
                "hypic-engine tokenize: need --model and exactly one "
                "of --text, --file, --batch, --decode-batch\n%s",
                usage_text);
        return 2;
    }

    char path[4096];
    struct stat sb;
    if (stat(model, &sb) == 0 && S_ISDIR(sb.st_mode))
        snprintf(path, sizeof(path), "%s/tokenizer.json", model);
    else
        snprintf(path, sizeof(path), "%s", model);
    double t0 = now_s();
    hp_error_t err = {0};
    hp_tokenizer_t *tok;
    if (hp_tokenizer_load(&tok, path, &err)) {
        fprintf(stderr, "hypic-engine tokenize: %s\n", err.msg);
        return 1;
    }
    double t1 = now_s();
    if (timing)
        fprintf(stderr, "load: %.1f ms (%zu ids)\n", 1e3 * (t1 - t0),
                hp_tokenizer_vocab_size(tok));

    int rc = 0;
    size_t len = 0, bytes = 0, tokens = 0;
    char *buf = NULL;
    const char *src = file ? file : batch ? batch : decode;
    if (src) {
        buf = slurp(src, &len);
        if (!buf) {
            hp_tokenizer_free(tok);
            return 1;
        }
    }
    t1 = now_s();
    if (text || file) {
        hp_tokenizer_ids_t ids = {0};
        bytes = text ? strlen(text) : len;
        rc = encode_one(tok, text ? text : buf, bytes, &ids);
        tokens = ids.n;
        double t2 = now_s();
        if (!rc)
            print_ids(&ids);
        hp_tokenizer_ids_free(&ids);
        if (timing)
            fprintf(stderr,
                    "encode: %zu bytes, %zu tokens in %.1f ms "
                    "(%.2f MB/s)\n",
                    bytes, tokens, 1e3 * (t2 - t1),
                    (double)bytes / 1e6 / (t2 - t1 > 0 ? t2 - t1 : 1e-9));
    } else if (batch) {
        rc = run_batch(tok, buf, len, batch, &bytes, &tokens);
        double t2 = now_s();
        if (timing)
            fprintf(stderr, "batch: %zu bytes, %zu tokens in %.1f ms\n", bytes,
                    tokens, 1e3 * (t2 - t1));
    } else {
        rc = run_decode_batch(tok, buf, len);
    }
    free(buf);
    hp_tokenizer_free(tok);
    if (fflush(stdout) != 0) {
        fprintf(stderr, "hypic-engine tokenize: write error\n");
        rc = 1;
    }
    return rc;
}
