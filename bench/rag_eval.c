/*
 * rag_eval.c - answer fidelity and TTFT of every prefill mode on the RAG
 * test split (issue 8; HYPIC §6.2, §6.4): exact match and token F1 of the
 * greedy answer against the reference, per mode, per seam width, per
 * document count. One TSV row per (mode, seam, example).
 *
 *   build/bench/rag_eval --model models/default --data test.jsonl
 *       [--modes full,prefix,naive,pic] [--seams 8] [--limit N]
 *       [--max-tokens 8] > rows.tsv
 *   python3 bench/rag_eval_report.py rows.tsv bench/results/
 *
 * naive/pic run warm: the example's segments are cached first (untimed),
 * as documents seen before; prefix has the lead cached (another request
 * with the same system prompt). TTFT is the prefill to the first logits.
 */
#include <cJSON.h>
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/bench_util.h"
#include "engine/cache/assemble.h"
#include "engine/forward/generate.h"

/* Lowercased words of s without punctuation (SQuAD-style normalization). */
static int words(const char *s, char out[][64], int max)
{
    int n = 0, k = 0;
    for (;; s++) {
        int c = (unsigned char)*s;
        if (c && (isalnum(c) || c >= 0x80)) {
            if (k < 63 && n < max)
                out[n][k++] = (char)tolower(c);
        } else if (k) {
            out[n][k] = '\0';
            n += n < max;
            k = 0;
        }
        if (!c)
            break;
    }
    return n;
}

static double token_f1(const char *pred, const char *gold, int *em)
{
    char p[64][64], g[64][64];
    int np = words(pred, p, 64), ng = words(gold, g, 64), common = 0;
    int used[64] = {0};
    *em = np == ng;
    for (int i = 0; i < np && i < ng; i++)
        *em &= !strcmp(p[i], g[i]);
    for (int i = 0; i < np; i++)
        for (int j = 0; j < ng; j++)
            if (!used[j] && !strcmp(p[i], g[j])) {
                used[j] = 1;
                common++;
                break;
            }
    if (!common)
        return 0.0;
    double pr = (double)common / np, rc = (double)common / ng;
    return 2 * pr * rc / (pr + rc);
}

typedef struct {
    char buf[512];
    size_t len;
} text_t;

static int collect(void *ud, const char *s, size_t n, int token)
{
    text_t *t = ud;
    (void)token;
    if (t->len + n < sizeof(t->buf)) {
        memcpy(t->buf + t->len, s, n);
        t->len += n;
        t->buf[t->len] = '\0';
    }
    return 0;
}

int main(int argc, char **argv)
{
    const char *model = NULL, *data = NULL, *modes = "full,prefix,naive,pic";
    const char *seams = "8";
    int limit = 1 << 30, max_tokens = 8;
    for (int i = 1; i + 1 < argc; i += 2) {
        const char *a = argv[i], *v = argv[i + 1];
        if (!strcmp(a, "--model"))
            model = v;
        else if (!strcmp(a, "--data"))
            data = v;
        else if (!strcmp(a, "--modes"))
            modes = v;
        else if (!strcmp(a, "--seams"))
            seams = v;
        else if (!strcmp(a, "--limit"))
            limit = atoi(v);
        else if (!strcmp(a, "--max-tokens"))
            max_tokens = atoi(v);
    }
    FILE *f = data ? fopen(data, "r") : NULL;
    if (!model || !f) {
        fprintf(stderr, "usage: rag_eval --model DIR --data F.jsonl "
                        "[--modes a,b] [--seams 0,8] [--limit N]\n");
        return 2;
    }
    hp_llm_t llm;
    hp_error_t err = {0};
    if (hp_llm_load(&llm, model, &err) != HP_OK)
        return bench_fail(&err);
    hp_prefix_cache_params_t pcp;
    hp_prefix_cache_params_default(&pcp, 8ull << 30);
    hp_cache_t cache = {
        hp_pool_create(8ull << 30, &err),
        hp_prefix_cache_create(&llm.model.cfg, &pcp, llm.model.be, &err)};
    hp_fwd_ws_t ws;
    if (hp_fwd_ws_init(&ws, &llm.model, NULL, &err) != HP_OK)
        return bench_fail(&err);
    float *lg = malloc((size_t)llm.model.cfg.vocab_size * 4);
    size_t cap = 1 << 20;
    char *line = malloc(cap);
    printf("id\tmode\tseam\tn_docs\thops\tqtype\tem\tf1\tttft_ms\t"
           "recomputed\tcached\tprediction\tanswer\n");
    for (int n = 0; n < limit && fgets(line, (int)cap, f); n++) {
        cJSON *j = cJSON_Parse(line);
        const char *prompt =
            cJSON_GetStringValue(cJSON_GetObjectItem(j, "prompt"));
        const char *answer =
            cJSON_GetStringValue(cJSON_GetObjectItem(j, "answer"));
        const char *id = cJSON_GetStringValue(cJSON_GetObjectItem(j, "id"));
        const char *qtype =
            cJSON_GetStringValue(cJSON_GetObjectItem(j, "qtype"));
        int nd = cJSON_GetObjectItem(j, "n_docs")
                     ? cJSON_GetObjectItem(j, "n_docs")->valueint
                     : 0;
        int hops = cJSON_GetObjectItem(j, "hops")
                       ? cJSON_GetObjectItem(j, "hops")->valueint
                       : 0;
        hp_prompt_t p;
        if (!prompt || !answer ||
            hp_prompt_build(&p, &llm, prompt, strlen(prompt),
                            HP_SEG_DEFAULT_SEPARATOR, &err) != HP_OK) {
            fprintf(stderr, "line %d: %s\n", n + 1,
                    prompt ? err.msg : "no prompt/answer");
            cJSON_Delete(j);
            continue;
        }
        for (const char *m = modes; *m;) {
            char name[16] = {0};
            size_t ml = strcspn(m, ",");
            memcpy(name, m, ml < 15 ? ml : 15);
            m += ml + (m[ml] == ',');
            int mode = hp_mode_parse(name);
            if (mode < 0) {
                fprintf(stderr, "unknown mode %s\n", name);
                return 2;
            }
            for (const char *s = seams; *s;) {
                int w = bench_next_int(&s);
                /* the seam matters to pic only: other modes run once */
                if (mode != HP_IPC_MODE_PIC &&
                    s - seams > (long)strcspn(seams, ",") + 1)
                    break;
                hp_pool_clear(cache.pub);
                hp_prefix_cache_clear(cache.prefix);
                if (mode == HP_IPC_MODE_NAIVE || mode == HP_IPC_MODE_PIC)
                    hp_assemble_warm(&llm, &cache, &ws, &p, (hp_ipc_mode_t)mode,
                                     w, NULL, &err);
                if (mode == HP_IPC_MODE_PREFIX && p.n_segs > 2) {
                    /* the lead alone seen before */
                    hp_prompt_t lead = p;
                    lead.n_segs = 1;
                    lead.n = p.segs[0].len;
                    hp_seq_t s0;
                    hp_seq_init(&s0, &llm.model, &err);
                    hp_assemble(&llm, &cache, &ws, &lead, HP_IPC_MODE_PREFIX, w,
                                &s0, lg, NULL, &err);
                    hp_seq_free(&s0);
                }
                hp_seq_t seq;
                hp_assemble_stats_t st;
                hp_seq_init(&seq, &llm.model, &err);
                double t0 = bench_now();
                int rc = hp_assemble(&llm, &cache, &ws, &p, (hp_ipc_mode_t)mode,
                                     w, &seq, lg, &st, &err);
                double ttft = (bench_now() - t0) * 1e3;
                text_t out = {{0}, 0};
                hp_gen_result_t res = {0};
                hp_gen_params_t gp = {
                    .max_tokens = max_tokens, .stop = {"\n"}, .n_stop = 1};
                if (rc == HP_OK)
                    rc = hp_generate(&llm, &seq, &ws, lg, &gp, collect, &out,
                                     &res, &err);
                if (rc != HP_OK) {
                    /* no row: a failed run is not an answer (e.g. a seam
                     * narrower than the conv window is refused) */
                    fprintf(stderr, "%s %s w=%d: %s\n", id, name, w, err.msg);
                    free(res.tokens);
                    hp_seq_free(&seq);
                    continue;
                }
                int em = 0;
                double f1 = token_f1(out.buf, answer, &em);
                for (char *c = out.buf; *c; c++)
                    if (*c == '\t' || *c == '\n')
                        *c = ' ';
                printf("%s\t%s\t%d\t%d\t%d\t%s\t%d\t%.4f\t%.2f\t%d\t%d\t%s\t"
                       "%s\n",
                       id, name, w, nd, hops, qtype ? qtype : "", em, f1, ttft,
                       st.recomputed_tokens, st.cached_tokens, out.buf, answer);
                fflush(stdout);
                free(res.tokens);
                hp_seq_free(&seq);
            }
        }
        hp_prompt_free(&p);
        cJSON_Delete(j);
    }
    return 0;
}
