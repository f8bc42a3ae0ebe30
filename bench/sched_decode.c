/*
 * sched_decode.c - decode tokens/s through the scheduler (issue 5):
 * B concurrent requests decoded in one forward pass per step (batched)
 * against one pass per request (solo_decode, the path before batching),
 * and speculative prompt-lookup decoding against plain greedy.
 *
 *   build/bench/sched_decode --model DIR [--batches 1,4,16] [--tokens 32]
 *       [--prompt-words 60] [--spec-batches 1,4] [--draft 8] [--no-solo]
 *
 * Decode rate: the scheduler's token counter over the window in which all
 * B requests are decoding (every prefill done, none finished), sampled
 * every millisecond; end-to-end: all tokens over submit-to-last-done.
 *
 * Prompts (deterministic): "facts" are RAG-like documents of made-up
 * facts ("The capital of Kabel is Glaek. ..."), one document set per
 * request; "quote" prompts are such documents followed by an instruction
 * to quote the first one and its first words, so a copying answer
 * repeats a prompt span.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench/bench_util.h"
#include "engine/model/llm.h"
#include "engine/serve/sched.h"

/* ---- prompts ------------------------------------------------------------ */

static const char *syl[] = {"ka",  "bel", "mir", "sil", "gla", "ek",  "dor",
                            "pra", "rik", "ven", "tor", "nal", "qua", "lem"};
static const char *attrs[] = {"capital",  "leader",  "river",    "founder",
                              "language", "harbour", "mountain", "festival"};

static void name(char *out, unsigned k)
{
    out[0] = '\0';
    for (int i = 0; i < 2 + (int)(k % 2); i++)
        strcat(out, syl[(k / (i ? 14u * i : 1u) + i * 5u) % 14]);
    out[0] = (char)(out[0] - 'a' + 'A');
}

/* A document of `words` words or so about entity k. */
static void document(char *out, size_t cap, unsigned k, int words)
{
    char e[16], v[16];
    name(e, k);
    size_t n = (size_t)snprintf(out, cap, "Document about %s. ", e);
    for (int w = 4, a = 0; w < words && n + 64 < cap; w += 6, a++) {
        name(v, k * 31u + (unsigned)a * 7u + 3u);
        n += (size_t)snprintf(out + n, cap - n, "The %s of %s is %s. ",
                              attrs[(k + (unsigned)a) % 8], e, v);
    }
}

/* Request i's prompt: two documents and a question, or (quote) an
 * instruction to quote the first document and its first words. */
static char *prompt(unsigned i, int words, int quote)
{
    size_t cap = (size_t)words * 16 + 512;
    char *p = malloc(cap), *d1 = malloc(cap), *d2 = malloc(cap);
    document(d1, cap, 2 * i + 1, words / 2);
    document(d2, cap, 2 * i + 2, words / 2);
    if (quote) {
        char start[64];
        snprintf(start, sizeof(start), "%.40s", d1);
        snprintf(p, cap,
                 "Answer from the documents.\n%s\n%s\nQuote the first "
                 "document word for word.\nQuote: %s",
                 d1, d2, start);
    } else {
        snprintf(p, cap,
                 "Answer from the documents.\n%s\n%s\nQuestion: what is "
                 "the capital?\nAnswer:",
                 d1, d2);
    }
    free(d1);
    free(d2);
    return p;
}

/* ---- one run: B requests at once --------------------------------------- */

typedef struct {
    int done;
    hp_sched_final_t fin;
} req_t;

static void on_done(void *ud, const hp_sched_final_t *f)
{
    req_t *r = ud;
    r->fin = *f;
    __atomic_store_n(&r->done, 1, __ATOMIC_RELEASE);
}

static const hp_sched_ops_t ops = {.text = bench_drop_text, .done = on_done};

typedef struct {
    double rate; /* tokens/s while all B decode */
    double e2e;  /* tokens/s submit to last done */
    double ttft; /* mean seconds to the first token */
    double tpp;  /* tokens per request per pass in the window */
    int drafted, accepted, tokens;
} run_t;

static int run(const hp_llm_t *llm, int B, int solo, int spec, int draft,
               int tokens, int words, int quote, run_t *out)
{
    hp_error_t err = {0};
    hp_sched_t *s;
    hp_sched_cfg_t cfg = {.batch = B,
                          .max_queue = B,
                          .decode = HP_SCHED_DECODE_AUTO,
                          .speculative = spec,
                          .max_draft = draft,
                          .solo_decode = solo};
    if (hp_sched_create(&s, llm, &cfg, &err) != HP_OK)
        return bench_fail(&err);
    req_t *rs = calloc((size_t)B, sizeof(*rs));
    char **ps = calloc((size_t)B, sizeof(*ps));
    double t0 = bench_now();
    for (int i = 0; i < B; i++) {
        ps[i] = prompt((unsigned)i, words, quote);
        hp_sched_req_t r = {.prompt = ps[i],
                            .prompt_len = strlen(ps[i]),
                            .ops = &ops,
                            .ud = &rs[i]};
        r.gen.max_tokens = tokens;
        r.gen.ignore_eos = 1;
        if (hp_sched_submit(s, &r, &err) != HP_OK)
            return bench_fail(&err);
    }
    /* the window in which every request decodes */
    double w0 = 0, w1 = 0;
    uint64_t d0 = 0, d1 = 0, p0 = 0, p1 = 0;
    for (int left = B; left > 0;) {
        hp_sched_stats_t st;
        hp_sched_stats(s, &st);
        if (st.decoding == B && st.queued == 0) {
            if (!w0) {
                w0 = bench_now();
                d0 = st.tokens;
                p0 = st.passes;
            } else if (st.tokens > d1) {
                w1 = bench_now();
                d1 = st.tokens;
                p1 = st.passes;
            }
        }
        usleep(1000);
        left = 0;
        for (int i = 0; i < B; i++)
            left += !__atomic_load_n(&rs[i].done, __ATOMIC_ACQUIRE);
    }
    double t1 = bench_now();
    memset(out, 0, sizeof(*out));
    for (int i = 0; i < B; i++) {
        out->tokens += rs[i].fin.completion_tokens;
        out->drafted += rs[i].fin.draft_tokens;
        out->accepted += rs[i].fin.accepted_tokens;
        out->ttft += rs[i].fin.ttft_us * 1e-6 / B;
        free(ps[i]);
    }
    out->e2e = out->tokens / (t1 - t0);
    out->rate = w1 > w0 && d1 > d0 ? (d1 - d0) / (w1 - w0) : 0;
    out->tpp =
        p1 > p0 ? (double)(d1 - d0) / (double)(p1 - p0) / (solo ? 1 : B) : 0;
    hp_sched_destroy(s);
    free(rs);
    free(ps);
    return 0;
}

int main(int argc, char **argv)
{
    const char *model = NULL, *batches = "1,4,16", *spec_batches = "1,4";
    int tokens = 32, words = 60, draft = 8, solo = 1;
    for (int i = 1; i < argc; i++) {
        const char *v = i + 1 < argc ? argv[i + 1] : "";
        if (!strcmp(argv[i], "--model"))
            model = v, i++;
        else if (!strcmp(argv[i], "--batches"))
            batches = v, i++;
        else if (!strcmp(argv[i], "--spec-batches"))
            spec_batches = v, i++;
        else if (!strcmp(argv[i], "--tokens"))
            tokens = atoi(v), i++;
        else if (!strcmp(argv[i], "--prompt-words"))
            words = atoi(v), i++;
        else if (!strcmp(argv[i], "--draft"))
            draft = atoi(v), i++;
        else if (!strcmp(argv[i], "--no-solo"))
            solo = 0;
    }
    if (!model) {
        fprintf(stderr, "usage: sched_decode --model DIR [--batches 1,4,16] "
                        "[--tokens N] [--prompt-words N] [--spec-batches 1,4] "
                        "[--draft N] [--no-solo]\n");
        return 2;
    }
    hp_llm_t llm;
    hp_error_t err = {0};
    if (hp_llm_load(&llm, model, &err) != HP_OK)
        return bench_fail(&err);
    char *p = prompt(0, words, 0);
    int *ids, n;
    hp_llm_tokenize(&llm, p, strlen(p), &ids, &n, &err);
    printf("# %s: %d layers, hidden %d; prompts ~%d tokens, %d tokens "
           "generated per request (greedy, ignore_eos), decode auto\n",
           model, llm.model.cfg.n_layers, llm.model.cfg.hidden, n, tokens);
    free(ids);
    free(p);

    printf("\n| batch | batched tok/s | solo tok/s | batched / solo | "
           "end-to-end tok/s batched | solo | TTFT s batched |\n"
           "|---|---|---|---|---|---|---|\n");
    for (const char *s = batches; *s;) {
        int B = bench_next_int(&s);
        run_t a, b = {0};
        if (run(&llm, B, 0, 0, draft, tokens, words, 0, &a) ||
            (solo && B > 1 && run(&llm, B, 1, 0, draft, tokens, words, 0, &b)))
            return 1;
        if (B == 1)
            b = a; /* one request: one pass either way */
        printf("| %d | %.2f | %.2f | %.2fx | %.2f | %.2f | %.2f |\n", B, a.rate,
               b.rate, b.rate > 0 ? a.rate / b.rate : 0, a.e2e, b.e2e, a.ttft);
        fflush(stdout);
    }

    printf("\n| prompts | batch | greedy tok/s | speculative tok/s | "
           "speedup | drafted | accepted | acceptance | tokens/pass |\n"
           "|---|---|---|---|---|---|---|---|---|\n");
    for (int quote = 1; quote >= 0; quote--)
        for (const char *s = spec_batches; *s;) {
            int B = bench_next_int(&s);
            run_t a, b;
            if (run(&llm, B, 0, 0, draft, tokens, words, quote, &a) ||
                run(&llm, B, 0, 1, draft, tokens, words, quote, &b))
                return 1;
            printf("| %s | %d | %.2f | %.2f | %.2fx | %d | %d | %.0f%% | "
                   "%.2f |\n",
                   quote ? "quote" : "facts", B, a.rate, b.rate,
                   a.rate > 0 ? b.rate / a.rate : 0, b.drafted, b.accepted,
                   b.drafted ? 100.0 * b.accepted / b.drafted : 0, b.tpp);
            fflush(stdout);
        }
    hp_llm_free(&llm);
    return 0;
}
