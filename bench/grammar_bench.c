/*
 * grammar_bench.c - the per-token cost of structured output: computing the
 * allowed-token mask (engine/forward/gmask.h) over a real vocabulary and
 * applying it to a row of logits, for json_object and a pydantic-like
 * json_schema (its strings unbounded, then bounded), at every token
 * boundary of a realistic answer (the answer tokenized by the tokenizer,
 * as a model would write it: in order, the mask kept from the token
 * before reused where the state is the same, and each cold) and at named
 * points of it (cold). Also the one-time trie build and the schema
 * compile.
 *
 * Run: build/bench/grammar_bench [--tokenizer PATH] [--vocab V] [--reps N]
 * (default: the Qwen3 tokenizer under /work/shared/data, V = 248320, the
 * Qwen3.5 logit width; single-threaded, best of N reps per point).
 */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine/contract/hp_grammar.h"
#include "engine/forward/gmask.h"
#include "engine/tokenizer/tokenizer.h"

static double now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

static const char *SCHEMA =
    "{\"response_format\": {\"type\": \"json_schema\", \"json_schema\": "
    "{\"name\": \"Order\", \"strict\": true, \"schema\": {\"$defs\": "
    "{\"Item\": {\"properties\": {\"sku\": {\"title\": \"Sku\", \"type\": "
    "\"string\"}, \"qty\": {\"title\": \"Qty\", \"type\": \"integer\"}, "
    "\"price\": {\"title\": \"Price\", \"type\": \"number\"}}, \"required\": "
    "[\"sku\", \"qty\", \"price\"], \"title\": \"Item\", \"type\": "
    "\"object\", \"additionalProperties\": false}}, \"properties\": "
    "{\"customer\": {\"title\": \"Customer\", \"type\": \"string\"}, "
    "\"status\": {\"enum\": [\"open\", \"paid\", \"shipped\"], \"title\": "
    "\"Status\", \"type\": \"string\"}, \"items\": {\"items\": {\"$ref\": "
    "\"#/$defs/Item\"}, \"title\": \"Items\", \"type\": \"array\"}, "
    "\"note\": {\"anyOf\": [{\"type\": \"string\"}, {\"type\": \"null\"}], "
    "\"title\": \"Note\"}, \"gift\": {\"title\": \"Gift\", \"type\": "
    "\"boolean\"}}, \"required\": [\"customer\", \"status\", \"items\", "
    "\"note\", \"gift\"], \"title\": \"Order\", \"type\": \"object\", "
    "\"additionalProperties\": false}}}}";

static const char *ANSWER =
    "{\"customer\": \"Ana Lima, São Paulo\", \"status\": \"paid\", "
    "\"items\": [{\"sku\": \"B-1042\", \"qty\": 2, \"price\": 19.5}, "
    "{\"sku\": \"K-77\", \"qty\": 1, \"price\": 240.0}], \"note\": "
    "\"Leave the parcel with the neighbour if nobody is home.\", "
    "\"gift\": false}";

typedef struct {
    const char *name;
    const char *after; /* the point: right after this text's first match */
} point_t;

static const point_t POINTS[] = {
    {"start", ""},
    {"after {", "{"},
    {"in a key", "{\"cust"},
    {"after a key's colon", "\"customer\": "},
    {"in a string value", "\"Ana Li"},
    {"in an enum", "\"pa"},
    {"in a number", "\"qty\": 2"},
    {"in a free text", "\"Leave the par"},
    {"before the end", "false"},
};

static void run(const char *label, const char *spec, const hp_tokenizer_t *tok,
                const hp_gmask_vocab_t *v, int V, int reps)
{
    hp_grammar_t *g;
    char msg[400];
    const char *param;
    double t0 = now_us();
    if (hp_grammar_compile(spec, strlen(spec), NULL, &g, msg, sizeof(msg),
                           &param) ||
        !g) {
        fprintf(stderr, "%s: %s\n", label, msg);
        exit(1);
    }
    double compile = now_us() - t0;
    printf("\n%s: compiled in %.0f us (%u rules, %u elements)\n", label,
           compile, g->n_rules, g->n_elems);
    uint32_t *bits = malloc((size_t)(V + 31) / 32 * sizeof(*bits));
    float *logits = malloc((size_t)V * sizeof(float));
    hp_gmask_scratch_t s = {0};
    hp_gmatch_t m;
    hp_error_t err;

    /* named points */
    printf("  %-22s %10s %10s %10s\n", "point", "allowed", "mask us",
           "apply us");
    for (size_t p = 0; p < sizeof(POINTS) / sizeof(*POINTS); p++) {
        const char *at = strstr(ANSWER, POINTS[p].after);
        size_t n = at ? (size_t)(at - ANSWER) + strlen(POINTS[p].after) : 0;
        hp_gmatch_init(&m, g, &err);
        if (!hp_gmatch_feed(&m, ANSWER, n)) {
            printf("  %-22s (not in the grammar)\n", POINTS[p].name);
            hp_gmatch_free(&m);
            continue;
        }
        double best = 1e18, best_apply = 1e18;
        int count = 0;
        for (int r = 0; r < reps; r++) {
            s.last_g = NULL; /* cold: not the mask kept from the last rep */
            double a = now_us();
            count = hp_gmask_compute(v, &m, &s, bits);
            double b = now_us();
            for (int i = 0; i < V; i++)
                logits[i] = (float)(i & 1023);
            double c = now_us();
            hp_gmask_apply(bits, logits, V);
            double d = now_us();
            best = b - a < best ? b - a : best;
            best_apply = d - c < best_apply ? d - c : best_apply;
        }
        printf("  %-22s %10d %10.1f %10.1f\n", POINTS[p].name, count, best,
               best_apply);
        hp_gmatch_free(&m);
    }

    /* every token boundary of the answer as the tokenizer splits it, in
     * order as a decoder meets them (the mask kept from the token before
     * reused where the state is the same), and each cold */
    hp_tokenizer_ids_t ids = {0};
    if (hp_tokenizer_encode(tok, ANSWER, strlen(ANSWER), &ids, &err) != HP_OK) {
        fprintf(stderr, "encode: %s\n", err.msg);
        exit(1);
    }
    double *best = malloc(2 * ids.n * sizeof(*best));
    for (size_t k = 0; k < 2 * ids.n; k++)
        best[k] = 1e18;
    for (int r = 0; r < reps; r++)
        for (int cold = 0; cold < 2; cold++) {
            hp_gmatch_init(&m, g, &err);
            s.last_g = NULL;
            for (size_t k = 0; k < ids.n; k++) {
                if (cold)
                    s.last_g = NULL;
                double a = now_us();
                hp_gmask_compute(v, &m, &s, bits);
                hp_gmask_apply(bits, logits, V);
                double b = now_us() - a;
                double *at = &best[(size_t)cold * ids.n + k];
                *at = b < *at ? b : *at;
                size_t nb;
                const char *tb = hp_tokenizer_token_bytes(tok, ids.ids[k], &nb);
                if (!hp_gmatch_feed(&m, tb, nb)) {
                    fprintf(stderr, "%s: token %zu refused\n", label, k);
                    exit(1);
                }
            }
            hp_gmatch_free(&m);
        }
    for (int cold = 0; cold < 2; cold++) {
        double total = 0, worst = 0;
        for (size_t k = 0; k < ids.n; k++) {
            double b = best[(size_t)cold * ids.n + k];
            total += b;
            worst = b > worst ? b : worst;
        }
        printf("  per token over the answer's %zu tokens%s: mean %.1f us, "
               "worst %.1f us (mask + apply)\n",
               ids.n, cold ? ", no mask kept" : "", total / (double)ids.n,
               worst);
    }
    free(best);
    hp_tokenizer_ids_free(&ids);
    hp_gmask_scratch_free(&s);
    free(bits);
    free(logits);
    hp_grammar_free(g);
}

int main(int argc, char **argv)
{
    const char *path = "/work/shared/data/qwen3-tokenizer/tokenizer.json";
    int V = 248320, reps = 5;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--tokenizer"))
            path = argv[i + 1];
        else if (!strcmp(argv[i], "--vocab"))
            V = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--reps"))
            reps = atoi(argv[i + 1]);
    }
    hp_tokenizer_t *tok;
    hp_error_t err;
    if (hp_tokenizer_load(&tok, path, &err) != HP_OK) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    if ((size_t)V < hp_tokenizer_vocab_size(tok))
        V = (int)hp_tokenizer_vocab_size(tok);
    int stop[2] = {hp_tokenizer_token_id(tok, "<|im_end|>"),
                   hp_tokenizer_token_id(tok, "<|endoftext|>")};
    hp_gmask_vocab_t *v;
    double t0 = now_us();
    if (hp_gmask_vocab_build(&v, tok, V, stop, 2, &err) != HP_OK) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    printf("tokenizer %s: %zu tokens, logits %d wide; trie built in %.0f ms\n",
           path, hp_tokenizer_vocab_size(tok), V, (now_us() - t0) / 1e3);
    run("json_object", "{\"response_format\": {\"type\": \"json_object\"}}",
        tok, v, V, reps);
    run("json_schema (pydantic Order)", SCHEMA, tok, v, V, reps);
    /* the same with every string bounded, as constr(max_length=64) */
    char *b = malloc(2 * strlen(SCHEMA)), *o = b;
    const char *str = "\"type\": \"string\"", *at, *from = SCHEMA;
    while ((at = strstr(from, str))) {
        memcpy(o, from, (size_t)(at - from) + strlen(str));
        o += at - from + (ptrdiff_t)strlen(str);
        o += sprintf(o, ", \"maxLength\": 64");
        from = at + strlen(str);
    }
    strcpy(o, from);
    run("json_schema (Order, strings of at most 64)", b, tok, v, V, reps);
    free(b);
    hp_gmask_vocab_free(v);
    hp_tokenizer_free(tok);
    return 0;
}
