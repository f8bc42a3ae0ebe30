/*
 * test_pic.c - the four prefill modes on real (small) checkpoints:
 * composition exact where the math says so, the structural error of naive
 * addition, seams covering whole segments give full recompute, warm and
 * cold identical, prefix resume exact, pools failing cleanly.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/cache/assemble.h"
#include "engine/cache/prompt.h"
#include "engine/cache/segcache.h"
#include "t/lib/tap.h"

/* f32 composition vs one pass: rounding of T_C S (dk-term sums) and of
 * S_end - T_C S_head; measured ~3e-7, bound 1e-5 as the issue states. */
#define COMPOSE_TOL 1e-5
/* the same tokens through other code paths (chunk sizes, run splits) */
#define EXACT_TOL 1e-5

#define SEP "<|pic_sep|>"
static const char *PROMPT =
    "You are a careful assistant." SEP
    "The capital of Zorvia is Quellam. Zorvia exports copper and tea, and "
    "its population is 4812 people living mostly in the hills." SEP
    "Water boils at one hundred degrees at sea level; at altitude it boils "
    "earlier because the air pressure is lower." SEP "Short doc." SEP
    "What is the capital of Zorvia?";

typedef struct {
    hp_llm_t llm;
    hp_cache_t cache;
    hp_fwd_ws_t ws;
} ctx_t;

static void cache_new(ctx_t *x, size_t pub, size_t priv)
{
    hp_error_t err = {0};
    hp_prefix_cache_params_t pcp;
    hp_pool_destroy(x->cache.pub);
    hp_prefix_cache_destroy(x->cache.prefix);
    x->cache.pub = hp_pool_create(pub, &err);
    hp_prefix_cache_params_default(&pcp, priv);
    x->cache.prefix =
        hp_prefix_cache_create(&x->llm.model.cfg, &pcp, x->llm.model.be, &err);
}

/* Runs p in mode; returns logits (malloc'd) and the sequence in *seq. */
static float *run(ctx_t *x, const hp_prompt_t *p, hp_ipc_mode_t mode, int w,
                  hp_seq_t *seq, hp_assemble_stats_t *st, int *rc)
{
    hp_error_t err = {0};
    float *lg = malloc((size_t)x->llm.model.cfg.vocab_size * 4);
    hp_seq_init(seq, &x->llm.model, &err);
    *rc =
        hp_assemble(&x->llm, &x->cache, &x->ws, p, mode, w, seq, lg, st, &err);
    if (*rc != HP_OK)
        tap_diag("assemble: %s", err.msg);
    return lg;
}

static double rel(const float *a, const float *b, size_t n)
{
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        num += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
        den += (double)a[i] * a[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

static int first_linear(const hp_model_config_t *c)
{
    for (int l = 0; l < c->n_layers; l++)
        if (c->layer_kind[l] == HP_LAYER_LINEAR)
            return l;
    return -1;
}

static void check_model(const char *root, const char *name)
{
    char dir[1024];
    ctx_t x = {0};
    hp_error_t err = {0};
    hp_prompt_t p;
    hp_assemble_stats_t st;
    hp_seq_t sf, sn, sp, sc;
    int rc;
    snprintf(dir, sizeof(dir), "%s/models/test/%s", root, name);
    if (!ok(hp_llm_load(&x.llm, dir, &err) == HP_OK, "%s loads", name)) {
        tap_diag("%s", err.msg);
        return;
    }
    const hp_model_config_t *c = &x.llm.model.cfg;
    size_t V = c->vocab_size;
    size_t ssz = c->state_floats;
    int l0 = first_linear(c);
    hp_fwd_ws_init(&x.ws, &x.llm.model, NULL, &err);
    cache_new(&x, 64 << 20, 64 << 20);
    hp_prompt_build(&p, &x.llm, PROMPT, strlen(PROMPT), SEP, &err);
    ok(p.n_segs == 5, "%s: prompt has 5 segments, %d tokens", name, p.n);

    float *lf = run(&x, &p, HP_IPC_MODE_FULL, 8, &sf, &st, &rc);
    float *ln = run(&x, &p, HP_IPC_MODE_NAIVE, 8, &sn, &st, &rc);
    float *lp = run(&x, &p, HP_IPC_MODE_PIC, 8, &sp, &st, &rc);
    /* the lead was cached by the naive run (a prefix either way) */
    ok(rc == HP_OK && st.hit_segments == 1 && st.miss_segments == 2,
       "%s: cold pic hit the lead, prefilled the 2 segments with an "
       "interior (%d hit, %d miss)",
       name, st.hit_segments, st.miss_segments);
    ok(st.cached_tokens > 0 && st.recomputed_tokens < p.n,
       "%s: pic recomputed %d of %d tokens", name, st.recomputed_tokens, p.n);

    double ep = rel(sf.layers[l0].S, sp.layers[l0].S, ssz);
    double en = rel(sf.layers[l0].S, sn.layers[l0].S, ssz);
    ok(ep <= COMPOSE_TOL,
       "%s: first linear layer's pic state equals full (rel %.2e)", name, ep);
    ok(en > 100 * COMPOSE_TOL,
       "%s: naive addition shows the structural error there (rel %.2e)", name,
       en);
    double lpe = rel(lf, lp, V), lne = rel(lf, ln, V);
    ok(lpe < lne, "%s: pic logits nearer full than naive (%.3f < %.3f)", name,
       lpe, lne);

    /* pack then unpack: a fresh sequence holds sp's state, bit for bit,
     * S before conv in the packed form */
    hp_seq_t su;
    int np = sp.n_pos, same = 1;
    size_t row = c->kv_row;
    float *pk = malloc((ssz + c->conv_floats + 2 * (size_t)np * row) * 4);
    ok(pk && hp_seq_init(&su, &x.llm.model, &err) == HP_OK &&
           hp_seq_reserve(&su, np, &err) == HP_OK,
       "%s: a sequence to unpack into", name);
    for (int l = 0; pk && l < c->n_layers; l++) {
        hp_seq_layer_t *a = &sp.layers[l], *b = &su.layers[l];
        if (c->layer_kind[l] == HP_LAYER_LINEAR) {
            hp_seq_state_pack(&sp, l, pk, HP_MEM_HOST);
            hp_seq_state_unpack(&su, l, pk, HP_MEM_HOST);
            same &= !memcmp(pk, a->S, ssz * 4) &&
                    !memcmp(b->S, a->S, ssz * 4) &&
                    !memcmp(b->conv, a->conv, c->conv_floats * 4);
        } else {
            hp_seq_kv_pack(&sp, l, 1, np - 1, pk, pk + (size_t)np * row,
                           HP_MEM_HOST);
            hp_seq_kv_unpack(&su, l, 1, np - 1, pk, pk + (size_t)np * row,
                             HP_MEM_HOST);
            same &= !memcmp(b->k + row, a->k + row, (np - 1) * row * 4) &&
                    !memcmp(b->v + row, a->v + row, (np - 1) * row * 4);
        }
    }
    ok(same, "%s: hp_seq_state/kv_pack then unpack give the state back", name);
    hp_seq_free(&su);
    free(pk);

    /* warm (segments first, one by one) then hit == cold, bit for bit */
    cache_new(&x, 64 << 20, 64 << 20);
    hp_assemble_warm(&x.llm, &x.cache, &x.ws, &p, HP_IPC_MODE_PIC, 8, NULL,
                     &err);
    float *lw = run(&x, &p, HP_IPC_MODE_PIC, 8, &sc, &st, &rc);
    ok(rc == HP_OK && st.hit_segments == 3 && st.miss_segments == 0,
       "%s: after warm-up every segment hits", name);
    ok(!memcmp(lw, lp, V * 4) &&
           !memcmp(sc.layers[l0].S, sp.layers[l0].S, ssz * 4),
       "%s: warm-then-hit is bit-identical to cold pic", name);
    hp_seq_free(&sc);
    free(lw);

    /* a pool that holds the largest segment but not all of them: the warm
     * pass ends (each segment once; it evicts one to hold the next), and
     * the assembly, which must hold them all, fails cleanly */
    {
        size_t one = 0, a = HP_POOL_ALIGN;
        for (int i = 0; i < p.n_segs; i++)
            if (hp_assemble_cacheable(&p.segs[i], HP_IPC_MODE_PIC, 8)) {
                size_t b = (hp_assemble_entry_bytes(c, &p.segs[i],
                                                    HP_IPC_MODE_PIC, 8) +
                            a - 1) /
                           a * a;
                one = b > one ? b : one;
            }
        size_t all = hp_assemble_pool_bytes(c, &p, HP_IPC_MODE_PIC, 8);
        hp_assemble_stats_t ws = {0};
        cache_new(&x, one, 64 << 20);
        int wrc = hp_assemble_warm(&x.llm, &x.cache, &x.ws, &p, HP_IPC_MODE_PIC,
                                   8, &ws, &err);
        float *ls = run(&x, &p, HP_IPC_MODE_PIC, 8, &sc, &st, &rc);
        ok(one < all && wrc == HP_OK && ws.miss_segments == 3 &&
               rc == HP_ENOMEM,
           "%s: a pool of %zu bytes (the prompt's segments take %zu): the "
           "warm pass builds each segment once (%d), the assembly fails "
           "with HP_ENOMEM (%d)",
           name, one, all, ws.miss_segments, rc);
        hp_seq_free(&sc);
        free(ls);
    }

    /* a seam wider than every segment: all recomputed, equals full */
    float *lb = run(&x, &p, HP_IPC_MODE_PIC, 64, &sc, &st, &rc);
    ok(rc == HP_OK && rel(lf, lb, V) <= EXACT_TOL,
       "%s: seam covering whole segments gives full (rel %.2e)", name,
       rel(lf, lb, V));
    hp_seq_free(&sc);
    free(lb);

    /* prefix: a second request extending the first resumes exactly */
    cache_new(&x, 64 << 20, 64 << 20);
    float *l1 = run(&x, &p, HP_IPC_MODE_PREFIX, 8, &sc, &st, &rc);
    ok(rc == HP_OK && st.cached_tokens == 0 && rel(lf, l1, V) <= EXACT_TOL,
       "%s: first prefix request is a full prefill", name);
    hp_seq_free(&sc);
    free(l1);
    char *longer = malloc(strlen(PROMPT) + 64);
    sprintf(longer, "%s" SEP "And of Quellam?", PROMPT);
    hp_prompt_t p2;
    hp_prompt_build(&p2, &x.llm, longer, strlen(longer), SEP, &err);
    float *l2 = run(&x, &p2, HP_IPC_MODE_PREFIX, 8, &sc, &st, &rc);
    hp_seq_t s2f;
    float *l2f = run(&x, &p2, HP_IPC_MODE_FULL, 8, &s2f, &st, &rc);
    hp_assemble_stats_t st2;
    hp_seq_t s3;
    float *l3 = run(&x, &p2, HP_IPC_MODE_PREFIX, 8, &s3, &st2, &rc);
    ok(rc == HP_OK && st2.cached_tokens == p2.segs[4].start + p2.segs[4].len,
       "%s: next turn resumed after %d cached tokens", name, st2.cached_tokens);
    ok(rel(l2f, l2, V) <= EXACT_TOL && rel(l2f, l3, V) <= EXACT_TOL,
       "%s: resumed logits equal full (rel %.2e)", name, rel(l2f, l3, V));
    hp_seq_free(&s3);
    hp_seq_free(&s2f);
    hp_seq_free(&sc);
    free(l3);
    free(l2f);
    free(l2);
    hp_prompt_free(&p2);
    free(longer);

    /* a public pool too small for two segments at once fails cleanly */
    size_t one = hp_segc_bytes(c, HP_SEGC_PIC, p.segs[1].len, 8);
    cache_new(&x, one + one / 2, 1 << 20);
    float *lt = run(&x, &p, HP_IPC_MODE_PIC, 8, &sc, &st, &rc);
    ok(rc == HP_ENOMEM, "%s: pool below one request's need -> ENOMEM", name);
    hp_pool_stats_t ps;
    hp_pool_stats(x.cache.pub, &ps);
    ok(ps.bytes_used <= ps.budget, "%s: pool within budget after failure",
       name);
    hp_seq_free(&sc);
    free(lt);

    hp_seq_free(&sf);
    hp_seq_free(&sn);
    hp_seq_free(&sp);
    free(lf);
    free(ln);
    free(lp);
    hp_prompt_free(&p);
    hp_pool_destroy(x.cache.pub);
    hp_prefix_cache_destroy(x.cache.prefix);
    hp_fwd_ws_free(&x.ws);
    hp_llm_free(&x.llm);
}

int main(void)
{
    const char *root = getenv("HYPIC_ROOT") ? getenv("HYPIC_ROOT") : ".";
    check_model(root, "qwen35-dense");
    check_model(root, "qwen3next");
    return tap_done();
}
