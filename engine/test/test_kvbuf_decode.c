/*
 * test_kvbuf_decode.c - KVBuffer decoding through the pool
 * (engine/forward/kvbuf.c) against a float64 recurrent decode: long chunkwise
 * runs (1000 steps, B = 8, 64, 100, 128) checking outputs and the effective
 * state at every step; KV-only (prompt through the buffer, no state until
 * cap_kvonly); draft verification with random acceptance = recurrent decode of
 * the accepted tokens only; pool exhaustion refused cleanly; a batch of mixed
 * requests = each one's solo run, bit for bit; model-sized heads.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "engine/forward/kvbuf.h"
#include "kernels/cpu/hk_cpu.h"
#include "t/lib/tap.h"
#include "t/lib/testrand.h"

/* Tolerances as in kernels/test/test_kvbuf.c: f32 sums of <= lmax + 1
 * terms against f64, measured ~1e-7..2e-6; the state contracts, so 1000
 * steps do not compound it. Relative in norm (outputs over a run, the
 * state at every step) and elementwise |ref - x| <= ATOL + RTOL |ref|. */
#define REL_TOL 1e-5
#define ATOL    2e-6
#define RTOL    1e-4
/* State entries grow to O(1..5) in weak-decay heads (a sum of many
 * writes), so near-zero entries carry the absolute rounding of those:
 * hk_gdn_recurrent itself shows up to ~1.5e-6 here over 1000 steps. */
#define STATE_ATOL 5e-6

/* ---- token source and f64 reference -------------------------------------- */

typedef struct {
    int Hk, Hv, dk, dv;
} dims_t;

/* A request's GDN inputs: per value head a decay scale log-uniform in
 * [1e-3, 8] (g = -scale softplus(N)), beta = sigmoid(2N), unit keys,
 * queries unit / sqrt(dk), values N(0,1). */
typedef struct {
    dims_t d;
    double sc[64];
    test_rng_t r;
} gen_t;

static void gen_init(gen_t *G, dims_t d, uint64_t seed)
{
    G->d = d;
    G->r.s = seed * 0x100000001B3ull + 17;
    for (int h = 0; h < d.Hv; h++)
        G->sc[h] =
            exp(log(1e-3) + test_rng_unif(&G->r) * (log(8.0) - log(1e-3)));
}

/* Token rows in the kernels' layout, one token. */
typedef struct {
    float *q, *k, *v, *g, *beta;
} rows_t;

static void rows_alloc(rows_t *x, dims_t d, int n)
{
    x->q = malloc((size_t)n * d.Hk * d.dk * sizeof(float));
    x->k = malloc((size_t)n * d.Hk * d.dk * sizeof(float));
    x->v = malloc((size_t)n * d.Hv * d.dv * sizeof(float));
    x->g = malloc((size_t)n * d.Hv * sizeof(float));
    x->beta = malloc((size_t)n * d.Hv * sizeof(float));
}

static void rows_free(rows_t *x)
{
    free(x->q);
    free(x->k);
    free(x->v);
    free(x->g);
    free(x->beta);
}

/* Fills row i of x with the next token of G. */
static void gen_row(gen_t *G, rows_t *x, int i)
{
    dims_t d = G->d;
    for (int h = 0; h < d.Hk; h++) {
        test_rng_unit(&G->r, x->q + ((size_t)i * d.Hk + h) * d.dk, d.dk,
                      1.0 / sqrt(d.dk));
        test_rng_unit(&G->r, x->k + ((size_t)i * d.Hk + h) * d.dk, d.dk, 1.0);
    }
    for (int e = 0; e < d.Hv * d.dv; e++)
        x->v[(size_t)i * d.Hv * d.dv + e] = (float)test_rng_normal(&G->r);
    for (int h = 0; h < d.Hv; h++) {
        double a = test_rng_normal(&G->r);
        x->g[(size_t)i * d.Hv + h] =
            (float)(-G->sc[h] * (a > 20 ? a : log1p(exp(a))));
        x->beta[(size_t)i * d.Hv + h] =
            (float)(1.0 / (1.0 + exp(-2.0 * test_rng_normal(&G->r))));
    }
}

/* f64 recurrence over rows [i0, i1) of x from S (in/out); o [i1-i0, Hv,
 * dv]: decay, read, delta, write, output after the update. */
static void ref_rows(double *o, double *S, const rows_t *x, int i0, int i1,
                     dims_t d)
{
    double u[512];
    for (int h = 0; h < d.Hv; h++) {
        double *Sh = S + (size_t)h * d.dk * d.dv;
        int kh = h / (d.Hv / d.Hk);
        for (int t = i0; t < i1; t++) {
            const float *q = x->q + ((size_t)t * d.Hk + kh) * d.dk;
            const float *k = x->k + ((size_t)t * d.Hk + kh) * d.dk;
            const float *v = x->v + ((size_t)t * d.Hv + h) * d.dv;
            double a = exp((double)x->g[(size_t)t * d.Hv + h]);
            double b = x->beta[(size_t)t * d.Hv + h];
            for (size_t e = 0; e < (size_t)d.dk * d.dv; e++)
                Sh[e] *= a;
            for (int j = 0; j < d.dv; j++) {
                double s = 0.0;
                for (int i = 0; i < d.dk; i++)
                    s += Sh[(size_t)i * d.dv + j] * k[i];
                u[j] = b * (v[j] - s);
            }
            for (int i = 0; i < d.dk; i++)
                for (int j = 0; j < d.dv; j++)
                    Sh[(size_t)i * d.dv + j] += k[i] * u[j];
            for (int j = 0; j < d.dv; j++) {
                double s = 0.0;
                for (int i = 0; i < d.dk; i++)
                    s += Sh[(size_t)i * d.dv + j] * q[i];
                o[((size_t)(t - i0) * d.Hv + h) * d.dv + j] = s;
            }
        }
    }
}

/* ---- checking ------------------------------------------------------------ */

/* Worst error ratio of a run (<= 1 passes) and the outputs' squared error
 * and reference norms (relative error in norm over the run: one output
 * alone can be tiny, o = (k.q) w under total decay). */
typedef struct {
    double worst, num, den;
} chk_t;

static void chk_out(chk_t *c, const double *ref, const float *x, size_t n)
{
    double r = tap_close_ratio_d(ref, x, n, ATOL, RTOL);
    c->worst = r > c->worst ? r : c->worst;
    for (size_t i = 0; i < n; i++) {
        double e = ref[i] - (double)x[i];
        c->num += e * e;
        c->den += ref[i] * ref[i];
    }
}

static void chk_state(chk_t *c, const double *ref, const float *x, size_t n)
{
    double r = tap_rel_norm_err(ref, x, n) / REL_TOL;
    double s = tap_close_ratio_d(ref, x, n, STATE_ATOL, RTOL);
    r = r > s ? r : s;
    c->worst = r > c->worst ? r : c->worst;
}

static double chk_done(const chk_t *c)
{
    double r = c->den > 0 ? sqrt(c->num / c->den) / REL_TOL : 0.0;
    return r > c->worst ? r : c->worst;
}

/* ---- a request under test ------------------------------------------------ */

typedef struct {
    dims_t d;
    gen_t gen;
    hp_kvbuf_t b;
    float *S;   /* the caller's state (NULL: KV-only) */
    double *Sr; /* reference state */
    float *Se;  /* effective state scratch */
    double * or ;
    rows_t x; /* [max_rows] */
    float *o;
} req_t;

static void req_open(req_t *q, hp_kvbuf_pool_t *p, dims_t d, uint64_t seed,
                     int with_state, int max_rows)
{
    size_t ns = (size_t)d.Hv * d.dk * d.dv;
    memset(q, 0, sizeof(*q));
    q->d = d;
    gen_init(&q->gen, d, seed);
    q->Sr = calloc(ns, sizeof(double));
    q->Se = malloc(ns * sizeof(float));
    q->or = malloc((size_t)max_rows * d.Hv * d.dv * sizeof(double));
    q->o = malloc((size_t)max_rows * d.Hv * d.dv * sizeof(float));
    rows_alloc(&q->x, d, max_rows);
    if (with_state) {
        /* A prefilled state: random, as a prompt leaves it. */
        q->S = malloc(ns * sizeof(float));
        for (size_t e = 0; e < ns; e++) {
            q->S[e] = (float)(0.3 * test_rng_normal(&q->gen.r));
            q->Sr[e] = q->S[e];
        }
    }
    hp_error_t err;
    hp_kvbuf_open(p, &q->b, q->S, NULL, &err);
}

static void req_close(req_t *q, hp_kvbuf_pool_t *p)
{
    hp_kvbuf_close(p, &q->b);
    free(q->S);
    free(q->Sr);
    free(q->Se);
    free(q->or);
    free(q->o);
    rows_free(&q->x);
}

static void req_check_state(req_t *q, hp_kvbuf_pool_t *p, chk_t *c)
{
    hp_error_t err;
    hp_kvbuf_state(p, &q->b, q->Se, &err);
    chk_state(c, q->Sr, q->Se, (size_t)q->d.Hv * q->d.dk * q->d.dv);
}

static hp_kvbuf_config_t make_cfg(dims_t d, int bs, int cap, int cap_kv,
                                  int nblocks, int nstates)
{
    hp_kvbuf_config_t c;
    hp_kvbuf_config_default(&c, d.Hk, d.Hv, d.dk, d.dv);
    c.block_tokens = bs;
    c.cap = cap;
    c.cap_kvonly = cap_kv;
    c.max_step = 8;
    c.max_batch = 16;
    c.n_blocks = nblocks;
    c.n_states = nstates;
    /* Small shapes run on one thread: results do not depend on the thread
     * count (test_kvbuf checks it bit for bit), and thousands of tiny
     * parallel regions only measure the machine's load. The model-sized
     * test below runs with all threads. */
    c.n_threads = 1;
    return c;
}

/* ---- tests --------------------------------------------------------------- */

/* Chunkwise decode over a prefilled state, 1000 steps, every B. */
static void test_long(void)
{
    const dims_t d = {2, 4, 64, 48};
    const int caps[] = {8, 64, 100, 128};
    for (int c = 0; c < 4; c++) {
        hp_kvbuf_pool_t p;
        hp_error_t err;
        hp_kvbuf_config_t cfg = make_cfg(d, 16, caps[c], 128, 64, 0);
        int rc = hp_kvbuf_pool_init(&p, &cfg, &err);
        req_t q;
        req_open(&q, &p, d, 1000 + c, 1, 1);
        chk_t ck = {0};
        int flushes = 0, bad = rc != HP_OK;
        hp_kvbuf_t *bp = &q.b;
        for (int step = 0; step < 1000 && !bad; step++) {
            gen_row(&q.gen, &q.x, 0);
            rc = hp_kvbuf_decode(&p, &bp, 1, q.o, q.x.q, q.x.k, q.x.v, q.x.g,
                                 q.x.beta, &err);
            bad |= rc != HP_OK;
            ref_rows(q.or, q.Sr, &q.x, 0, 1, d);
            chk_out(&ck, q.or, q.o, (size_t)d.Hv * d.dv);
            req_check_state(&q, &p, &ck);
            flushes += q.b.len == 0;
        }
        double w = chk_done(&ck);
        ok(!bad && w <= 1.0 && flushes == 1000 / caps[c],
           "B %d: 1000 steps, o and state = f64 recurrence at every step "
           "(worst %.3f, %d flushes)",
           caps[c], w, flushes);
        req_close(&q, &p);
        hp_kvbuf_pool_free(&p);
    }
}

/* KV-only: a 30-token prompt through the buffer, then decode; no state
 * exists until the context reaches cap_kvonly, then a pool slot holds it. */
static void test_kvonly(void)
{
    const dims_t d = {2, 4, 64, 48};
    const int P = 30, cap_kv = 100, steps = 400;
    hp_kvbuf_pool_t p;
    hp_error_t err;
    hp_kvbuf_config_t cfg = make_cfg(d, 16, 64, cap_kv, 64, 1);
    int rc = hp_kvbuf_pool_init(&p, &cfg, &err);
    req_t q;
    req_open(&q, &p, d, 77, 0, P);
    chk_t ck = {0};
    for (int i = 0; i < P; i++)
        gen_row(&q.gen, &q.x, i);
    rc |= hp_kvbuf_prefill(&p, &q.b, P, q.o, q.x.q, q.x.k, q.x.v, q.x.g,
                           q.x.beta, &err);
    ref_rows(q.or, q.Sr, &q.x, 0, P, d);
    chk_out(&ck, q.or, q.o, (size_t)P * d.Hv * d.dv);
    req_check_state(&q, &p, &ck);
    int stateless_ok = q.b.S == NULL && p.n_free_st == 1;
    int created_at = -1;
    hp_kvbuf_t *bp = &q.b;
    for (int step = 0; step < steps && rc == HP_OK; step++) {
        gen_row(&q.gen, &q.x, 0);
        rc = hp_kvbuf_decode(&p, &bp, 1, q.o, q.x.q, q.x.k, q.x.v, q.x.g,
                             q.x.beta, &err);
        ref_rows(q.or, q.Sr, &q.x, 0, 1, d);
        chk_out(&ck, q.or, q.o, (size_t)d.Hv * d.dv);
        req_check_state(&q, &p, &ck);
        if (q.b.S && created_at < 0)
            created_at = P + step + 1;
        if (!q.b.S)
            stateless_ok &= p.n_free_st == 1;
    }
    double w = chk_done(&ck);
    ok(rc == HP_OK && w <= 1.0,
       "KV-only prompt (%d) + %d steps = f64 recurrence (worst %.3f)", P, steps,
       w);
    ok(stateless_ok && created_at == cap_kv && p.n_free_st == 0,
       "no state until the context reaches cap_kvonly (created at %d)",
       created_at);
    req_close(&q, &p);
    ok(p.n_free_st == 1 && p.n_free_blk == 64,
       "close returns the state slot and every block");
    hp_kvbuf_pool_free(&p);
}

/* Verification: T = 1 + n tokens (n = 0..7 drafts), all outputs checked,
 * keep a random 0..T; the reference advances over the kept tokens only. */
static void test_verify(int with_state, int cap, uint64_t seed)
{
    const dims_t d = {2, 4, 64, 48};
    hp_kvbuf_pool_t p;
    hp_error_t err;
    hp_kvbuf_config_t cfg = make_cfg(d, 16, cap, 40, 64, 1);
    int rc = hp_kvbuf_pool_init(&p, &cfg, &err);
    req_t q;
    req_open(&q, &p, d, seed, with_state, 8);
    test_rng_t pick = {seed};
    size_t ns = (size_t)d.Hv * d.dk * d.dv;
    double *Stry = malloc(ns * sizeof(double));
    chk_t ck = {0};
    int kept = 0, offered = 0;
    hp_kvbuf_t *bp = &q.b;
    for (int it = 0; it < 250 && rc == HP_OK; it++) {
        int T = 1 + (int)(test_rng_unif(&pick) * 8);
        for (int i = 0; i < T; i++)
            gen_row(&q.gen, &q.x, i);
        rc = hp_kvbuf_verify(&p, &bp, 1, T, q.o, q.x.q, q.x.k, q.x.v, q.x.g,
                             q.x.beta, &err);
        /* All T outputs are what the recurrence gives if all are kept. */
        memcpy(Stry, q.Sr, ns * sizeof(double));
        ref_rows(q.or, Stry, &q.x, 0, T, d);
        chk_out(&ck, q.or, q.o, (size_t)T * d.Hv * d.dv);
        int keep = (int)(test_rng_unif(&pick) * (T + 1));
        if (rc == HP_OK)
            rc = hp_kvbuf_truncate(&p, &q.b, keep, &err);
        ref_rows(q.or, q.Sr, &q.x, 0, keep, d);
        req_check_state(&q, &p, &ck);
        kept += keep;
        offered += T;
    }
    double w = chk_done(&ck);
    ok(rc == HP_OK && w <= 1.0,
       "verify %s, B %d: %d of %d tokens kept, o and state = recurrence "
       "over the kept tokens (worst %.3f)",
       with_state ? "over a state" : "KV-only", cap, kept, offered, w);
    free(Stry);
    req_close(&q, &p);
    hp_kvbuf_pool_free(&p);
}

/* A small pool runs dry: the call is refused with HP_EBUSY and changes
 * nothing; after another request leaves, the refused one continues and
 * still matches the reference. */
static void test_exhaustion(void)
{
    const dims_t d = {1, 2, 16, 8};
    hp_kvbuf_pool_t p;
    hp_error_t err;
    /* bs 4, cap 12 (3 blocks each), 5 blocks: two requests cannot both
     * fill their buffers. KV-only cap 6, no state slots. */
    hp_kvbuf_config_t cfg = make_cfg(d, 4, 12, 6, 5, 0);
    cfg.max_step = 4;
    int rc = hp_kvbuf_pool_init(&p, &cfg, &err);
    req_t a, b, c;
    req_open(&a, &p, d, 1, 1, 4);
    req_open(&b, &p, d, 2, 1, 4);
    req_open(&c, &p, d, 3, 0, 4);
    chk_t ck = {0};
    hp_kvbuf_t *both[2] = {&a.b, &b.b};
    int busy_at = -1, step;
    float o2[2 * 2 * 8];
    rows_t x2;
    rows_alloc(&x2, d, 2);
    for (step = 0; step < 12 && rc == HP_OK; step++) {
        gen_row(&a.gen, &x2, 0);
        gen_row(&b.gen, &x2, 1);
        int fb = p.n_free_blk, la = a.b.len, lb = b.b.len;
        int nba = a.b.n_blocks, nbb = b.b.n_blocks;
        rc = hp_kvbuf_decode(&p, both, 2, o2, x2.q, x2.k, x2.v, x2.g, x2.beta,
                             &err);
        if (rc == HP_EBUSY) {
            busy_at = step;
            ok(p.n_free_blk == fb && a.b.len == la && b.b.len == lb &&
                   a.b.n_blocks == nba && b.b.n_blocks == nbb,
               "refused batch changed nothing (free %d, lens %d %d)",
               p.n_free_blk, a.b.len, b.b.len);
            break;
        }
        ref_rows(a.or, a.Sr, &x2, 0, 1, d);
        ref_rows(b.or, b.Sr, &x2, 1, 2, d);
        chk_out(&ck, a.or, o2, (size_t)d.Hv * d.dv);
        chk_out(&ck, b.or, o2 + d.Hv * d.dv, (size_t)d.Hv * d.dv);
    }
    ok(busy_at == 8,
       "pool of 5 blocks refuses the step needing a 6th "
       "(step %d: %s)",
       busy_at, err.msg);

    /* reserve is all or nothing over several buffers. */
    hp_kvbuf_t *three[3] = {&c.b, &a.b, &b.b};
    int fb = p.n_free_blk;
    rc = hp_kvbuf_reserve(&p, three, 3, 4, &err);
    ok(rc == HP_EBUSY && p.n_free_blk == fb && c.b.n_blocks == 0,
       "reserve over three buffers: refused whole, nothing taken");

    /* A KV-only request with no state slot is refused at cap_kvonly. */
    hp_kvbuf_close(&p, &b.b);
    hp_kvbuf_t *cp = &c.b;
    int n_ok = 0;
    for (int i = 0; i < 8; i++) {
        gen_row(&c.gen, &c.x, 0);
        rc = hp_kvbuf_decode(&p, &cp, 1, c.o, c.x.q, c.x.k, c.x.v, c.x.g,
                             c.x.beta, &err);
        if (rc != HP_OK)
            break;
        ref_rows(c.or, c.Sr, &c.x, 0, 1, d);
        chk_out(&ck, c.or, c.o, (size_t)d.Hv * d.dv);
        n_ok++;
    }
    ok(rc == HP_EBUSY && n_ok == 5 && c.b.len == 5 && c.b.S == NULL,
       "KV-only buffer without a state slot waits at cap_kvonly (%d steps)",
       n_ok);
    hp_kvbuf_close(&p, &c.b);

    /* The refused request continues where it stood. */
    hp_kvbuf_t *ap = &a.b;
    for (int i = 0; i < 30; i++) {
        gen_row(&a.gen, &a.x, 0);
        rc = hp_kvbuf_decode(&p, &ap, 1, a.o, a.x.q, a.x.k, a.x.v, a.x.g,
                             a.x.beta, &err);
        if (rc != HP_OK)
            break;
        ref_rows(a.or, a.Sr, &a.x, 0, 1, d);
        chk_out(&ck, a.or, a.o, (size_t)d.Hv * d.dv);
        req_check_state(&a, &p, &ck);
    }
    double w = chk_done(&ck);
    ok(rc == HP_OK && w <= 1.0,
       "after the refusals every output and state still match (worst "
       "%.3f)",
       w);
    rows_free(&x2);
    req_close(&a, &p);
    req_close(&b, &p);
    req_close(&c, &p);
    ok(p.n_free_blk == 5, "all blocks back in the pool");
    hp_kvbuf_pool_free(&p);
}

/* Six requests (over states and KV-only, different histories) decoded and
 * verified as one batch = each run alone in its own pool, bit for bit. */
static void test_batch(void)
{
    enum { R = 6, STEPS = 300 };
    const dims_t d = {2, 4, 32, 24};
    hp_kvbuf_pool_t pb, ps[R];
    hp_error_t err;
    hp_kvbuf_config_t cfg = make_cfg(d, 8, 20, 50, 8 * R, R);
    int rc = hp_kvbuf_pool_init(&pb, &cfg, &err);
    req_t qb[R], qs[R];
    rows_t xb;
    rows_alloc(&xb, d, R * 4);
    size_t vo = (size_t)d.Hv * d.dv;
    float *ob = malloc(R * 4 * vo * sizeof(float));
    hp_kvbuf_t *bb[R];
    int same = rc == HP_OK;
    for (int r = 0; r < R; r++) {
        cfg.n_blocks = 8;
        cfg.n_states = 1;
        rc |= hp_kvbuf_pool_init(&ps[r], &cfg, &err);
        req_open(&qb[r], &pb, d, 500 + r, r % 3 != 0, 4);
        req_open(&qs[r], &ps[r], d, 500 + r, r % 3 != 0, 4);
        bb[r] = &qb[r].b;
        /* Different histories: r solo steps first. */
        for (int i = 0; i < 3 * r; i++) {
            gen_row(&qb[r].gen, &qb[r].x, 0);
            gen_row(&qs[r].gen, &qs[r].x, 0);
            hp_kvbuf_t *b1 = &qb[r].b, *b2 = &qs[r].b;
            rc |= hp_kvbuf_decode(&pb, &b1, 1, qb[r].o, qb[r].x.q, qb[r].x.k,
                                  qb[r].x.v, qb[r].x.g, qb[r].x.beta, &err);
            rc |= hp_kvbuf_decode(&ps[r], &b2, 1, qs[r].o, qs[r].x.q, qs[r].x.k,
                                  qs[r].x.v, qs[r].x.g, qs[r].x.beta, &err);
        }
    }
    for (int step = 0; step < STEPS && rc == HP_OK; step++) {
        /* Every 10th step verifies 3 tokens and keeps 0..3. */
        int T = step % 10 == 9 ? 3 : 1;
        for (int r = 0; r < R; r++)
            for (int t = 0; t < T; t++) {
                gen_row(&qs[r].gen, &qs[r].x, t);
                /* the batch rows: request-major, same tokens */
                size_t i = (size_t)r * T + t;
                memcpy(xb.q + i * d.Hk * d.dk,
                       qs[r].x.q + (size_t)t * d.Hk * d.dk,
                       d.Hk * d.dk * sizeof(float));
                memcpy(xb.k + i * d.Hk * d.dk,
                       qs[r].x.k + (size_t)t * d.Hk * d.dk,
                       d.Hk * d.dk * sizeof(float));
                memcpy(xb.v + i * vo, qs[r].x.v + t * vo, vo * sizeof(float));
                memcpy(xb.g + i * d.Hv, qs[r].x.g + (size_t)t * d.Hv,
                       d.Hv * sizeof(float));
                memcpy(xb.beta + i * d.Hv, qs[r].x.beta + (size_t)t * d.Hv,
                       d.Hv * sizeof(float));
            }
        if (T == 1)
            rc |= hp_kvbuf_decode(&pb, bb, R, ob, xb.q, xb.k, xb.v, xb.g,
                                  xb.beta, &err);
        else
            rc |= hp_kvbuf_verify(&pb, bb, R, T, ob, xb.q, xb.k, xb.v, xb.g,
                                  xb.beta, &err);
        for (int r = 0; r < R; r++) {
            hp_kvbuf_t *b2 = &qs[r].b;
            if (T == 1)
                rc |= hp_kvbuf_decode(&ps[r], &b2, 1, qs[r].o, qs[r].x.q,
                                      qs[r].x.k, qs[r].x.v, qs[r].x.g,
                                      qs[r].x.beta, &err);
            else
                rc |= hp_kvbuf_verify(&ps[r], &b2, 1, T, qs[r].o, qs[r].x.q,
                                      qs[r].x.k, qs[r].x.v, qs[r].x.g,
                                      qs[r].x.beta, &err);
            same &= !memcmp(ob + (size_t)r * T * vo, qs[r].o,
                            T * vo * sizeof(float));
            if (T > 1) {
                int keep = (step / 10 + r) % (T + 1);
                rc |= hp_kvbuf_truncate(&pb, &qb[r].b, keep, &err);
                rc |= hp_kvbuf_truncate(&ps[r], &qs[r].b, keep, &err);
            }
            same &= qb[r].b.len == qs[r].b.len && !qb[r].b.S == !qs[r].b.S;
        }
    }
    for (int r = 0; r < R; r++) {
        hp_kvbuf_state(&pb, &qb[r].b, qb[r].Se, &err);
        hp_kvbuf_state(&ps[r], &qs[r].b, qs[r].Se, &err);
        same &= !memcmp(qb[r].Se, qs[r].Se,
                        (size_t)d.Hv * d.dk * d.dv * sizeof(float));
    }
    ok(rc == HP_OK && same,
       "%d mixed requests batched = solo runs, outputs and states bit for "
       "bit (%d steps)",
       R, STEPS);
    for (int r = 0; r < R; r++) {
        req_close(&qb[r], &pb);
        req_close(&qs[r], &ps[r]);
        hp_kvbuf_pool_free(&ps[r]);
    }
    hp_kvbuf_pool_free(&pb);
    rows_free(&xb);
    free(ob);
}

/* Model-sized heads with the default capacities: Qwen3.5-0.8B (16/16) and
 * Qwen3-Next (16 key, 32 value heads), dk = dv = 128. */
static void test_model_heads(void)
{
    const dims_t ds[2] = {{16, 16, 128, 128}, {16, 32, 128, 128}};
    const int steps[2] = {120, 60};
    for (int m = 0; m < 2; m++) {
        dims_t d = ds[m];
        hp_kvbuf_pool_t p;
        hp_error_t err;
        hp_kvbuf_config_t cfg;
        hp_kvbuf_config_default(&cfg, d.Hk, d.Hv, d.dk, d.dv);
        cfg.n_blocks = 16;
        cfg.max_batch = 4;
        int rc = hp_kvbuf_pool_init(&p, &cfg, &err);
        req_t q;
        req_open(&q, &p, d, 9 + m, 1, 1);
        chk_t ck = {0};
        hp_kvbuf_t *bp = &q.b;
        for (int s = 0; s < steps[m] && rc == HP_OK; s++) {
            gen_row(&q.gen, &q.x, 0);
            rc = hp_kvbuf_decode(&p, &bp, 1, q.o, q.x.q, q.x.k, q.x.v, q.x.g,
                                 q.x.beta, &err);
            ref_rows(q.or, q.Sr, &q.x, 0, 1, d);
            chk_out(&ck, q.or, q.o, (size_t)d.Hv * d.dv);
            if (s % 7 == 6 || q.b.len == 0)
                req_check_state(&q, &p, &ck);
        }
        double w = chk_done(&ck);
        ok(rc == HP_OK && w <= 1.0,
           "Hk %d Hv %d dk %d, default B %d: %d steps = recurrence "
           "(worst %.3f)",
           d.Hk, d.Hv, d.dk, cfg.cap, steps[m], w);
        req_close(&q, &p);
        hp_kvbuf_pool_free(&p);
    }
}

static void test_defaults(void)
{
    hp_kvbuf_config_t a, b;
    hp_kvbuf_config_default(&a, 16, 16, 128, 128);
    hp_kvbuf_config_default(&b, 16, 32, 128, 128);
    ok(a.cap == 16 && b.cap == 18 && a.cap_kvonly == 79 && b.cap_kvonly == 103,
       "traffic-model defaults: B %d / %d, KV-only up to %d / %d", a.cap, b.cap,
       a.cap_kvonly, b.cap_kvonly);
}

int main(void)
{
    hk_matmul_init();
    test_defaults();
    test_long();
    test_kvonly();
    test_verify(1, 16, 11);
    test_verify(0, 16, 12);
    test_verify(1, 100, 13);
    test_exhaustion();
    test_batch();
    test_model_heads();
    return tap_done();
}
