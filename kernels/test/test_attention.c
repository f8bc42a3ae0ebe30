/*
 * test_attention.c - hk_attention against a float64 brute-force reference:
 * prefill (odd sizes, several query blocks and key blocks), GQA/MQA/MHA
 * groupings, queries at scattered unsorted positions, T = 1 decode, large
 * scores (max subtraction), thread-count independence, full overwrite of o
 * and the scratch bound.
 *
 * HK_BENCH=1 (or =R: best of R runs) also times T = N = 2048, Hq = 8,
 * Hkv = 2, hd = 256 prefill and a T = 1 decode against N = 8192 keys
 * (diagnostics only).
 */
#include <omp.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

#include "kernels/cpu/hk_cpu.h"
#include "t/lib/tap.h"
#define TEST_RNG_SEED 0x9e3779b97f4a7c15ull
#include "t/lib/testrand.h"

/* Scores are float dot products over hd terms (relative rounding ~1e-7 per
 * term, ~1e-6 over hd <= 256 with |s| <= ~10 in the default data) and the
 * softmax uses a ~1-ulp exp; o is a convex combination of |v| <= 1, so its
 * error is ~1e-6 absolute. 1e-5 leaves 10x headroom and still catches a
 * missing key, a wrong mask or a wrong head mapping (errors >= 1e-3). */
#define ATOL 1e-5
#define RTOL 1e-4
/* Large-score case: |s| up to ~300, so float rounding in s is ~3e-5 and
 * moves probabilities by that relative amount. */
#define ATOL_BIG 3e-4
/* One probability alone: exp (~1 ulp), the float sum l (~1e-7 relative)
 * and one division; a wrong range reduction or cutoff errs by >= 1e-3. */
#define EXP_RTOL 1e-6

/* Plain-loop float64 reference. */
static void ref_attention(double *o, const float *q, const int *qpos,
                          const float *k, const float *v, int T, int N, int Hq,
                          int Hkv, int hd, double scale)
{
    double *s = malloc((size_t)N * sizeof(double));
    int r = Hq / Hkv;
    for (int t = 0; t < T; t++)
        for (int h = 0; h < Hq; h++) {
            int g = h / r;
            const float *qv = q + ((size_t)t * Hq + h) * hd;
            double mx = -INFINITY, sum = 0.0;
            for (int j = 0; j <= qpos[t]; j++) {
                const float *kv = k + ((size_t)j * Hkv + g) * hd;
                double d = 0.0;
                for (int i = 0; i < hd; i++)
                    d += (double)qv[i] * (double)kv[i];
                s[j] = d * scale;
                mx = s[j] > mx ? s[j] : mx;
            }
            for (int j = 0; j <= qpos[t]; j++) {
                s[j] = exp(s[j] - mx);
                sum += s[j];
            }
            double *ov = o + ((size_t)t * Hq + h) * hd;
            for (int i = 0; i < hd; i++)
                ov[i] = 0.0;
            for (int j = 0; j <= qpos[t]; j++) {
                const float *vv = v + ((size_t)j * Hkv + g) * hd;
                for (int i = 0; i < hd; i++)
                    ov[i] += s[j] / sum * (double)vv[i];
            }
        }
    free(s);
}

/* Runs hk_attention with exactly hk_attention_scratch floats plus a canary
 * tail, o pre-filled with NaN (every element must be written). Returns
 * nonzero if the canary was touched. */
#define CANARY 64
static int run_attn(float *o, const float *q, const int *qpos, const float *k,
                    const float *v, int T, int N, int Hq, int Hkv, int hd,
                    float scale)
{
    size_t ns = hk_attention_scratch(T, N, Hq);
    float *scr = malloc((ns + CANARY) * sizeof(float));
    for (size_t i = 0; i < ns + CANARY; i++)
        scr[i] = i < ns ? NAN : 12345.0f;
    for (size_t i = 0; i < (size_t)T * Hq * hd; i++)
        o[i] = NAN;
    hk_attention(o, q, qpos, k, v, T, N, Hq, Hkv, hd, scale, scr);
    int bad = 0;
    for (size_t i = ns; i < ns + CANARY; i++)
        bad |= scr[i] != 12345.0f;
    free(scr);
    return bad;
}

/* One case: random data, given positions (NULL = 0..T-1 prefill). */
static void check_case(const char *name, int T, int N, int Hq, int Hkv, int hd,
                       const int *pos_in, double qk_amp, double atol)
{
    float *q = frand_amp((size_t)T * Hq * hd, qk_amp);
    float *k = frand_amp((size_t)N * Hkv * hd, qk_amp);
    float *v = frand_amp((size_t)N * Hkv * hd, 1.0);
    int *qpos = malloc((size_t)T * sizeof(int));
    for (int t = 0; t < T; t++)
        qpos[t] = pos_in ? pos_in[t] : t + (N - T);
    float scale = (float)(1.0 / sqrt((double)hd));
    size_t no = (size_t)T * Hq * hd;
    float *o = malloc(no * sizeof(float));
    double *ref = malloc(no * sizeof(double));

    int canary = run_attn(o, q, qpos, k, v, T, N, Hq, Hkv, hd, scale);
    ref_attention(ref, q, qpos, k, v, T, N, Hq, Hkv, hd, scale);
    close_d(ref, o, no, atol, RTOL,
            "%s: T=%d N=%d Hq=%d Hkv=%d hd=%d matches float64", name, T, N, Hq,
            Hkv, hd);
    ok(!canary, "%s: stays within hk_attention_scratch", name);
    free(q);
    free(k);
    free(v);
    free(qpos);
    free(o);
    free(ref);
}

/* Same inputs, 1, 2 and 3 threads: bitwise equal outputs. */
static void check_threads(void)
{
    int T = 150, N = 600, Hq = 8, Hkv = 2, hd = 64;
    float *q = frand_amp((size_t)T * Hq * hd, 1.0);
    float *k = frand_amp((size_t)N * Hkv * hd, 1.0);
    float *v = frand_amp((size_t)N * Hkv * hd, 1.0);
    int *qpos = malloc((size_t)T * sizeof(int));
    for (int t = 0; t < T; t++)
        qpos[t] = (t * 7919) % N;
    size_t no = (size_t)T * Hq * hd;
    float *o1 = malloc(no * sizeof(float)), *o2 = malloc(no * sizeof(float));
    int saved = omp_get_max_threads(), same = 1;
    omp_set_num_threads(1);
    run_attn(o1, q, qpos, k, v, T, N, Hq, Hkv, hd, 0.125f);
    for (int nt = 2; nt <= 3; nt++) {
        omp_set_num_threads(nt);
        run_attn(o2, q, qpos, k, v, T, N, Hq, Hkv, hd, 0.125f);
        same &= memcmp(o1, o2, no * sizeof(float)) == 0;
    }
    omp_set_num_threads(saved);
    ok(same, "1, 2 and 3 threads give bitwise equal o");
    free(q);
    free(k);
    free(v);
    free(qpos);
    free(o1);
    free(o2);
}

/* Probabilities one by one: hd = N, q = e_0, k_j = s_j e_0, v_j = e_j, so
 * o[d] = softmax(s)_d exactly one term each. Scores span [-86, 0] to check
 * the exp over its whole range, relative to each (tiny) probability. */
static void check_exp_range(void)
{
    const int N = 200;
    float *q = calloc((size_t)N, sizeof(float));
    float *k = calloc((size_t)N * N, sizeof(float));
    float *v = calloc((size_t)N * N, sizeof(float));
    float *o = malloc((size_t)N * sizeof(float));
    double *ref = malloc((size_t)N * sizeof(double));
    int qpos = N - 1;
    double mx = -INFINITY, sum = 0.0;
    q[0] = 1.0f;
    for (int j = 0; j < N; j++) {
        k[(size_t)j * N] = j == 77 ? 0.0f : (float)(-86.0 * (j + 0.5) / N);
        v[(size_t)j * N + j] = 1.0f;
        mx = k[(size_t)j * N] > mx ? k[(size_t)j * N] : mx;
    }
    for (int j = 0; j < N; j++)
        sum += ref[j] = exp((double)k[(size_t)j * N] - mx);
    for (int j = 0; j < N; j++)
        ref[j] /= sum;
    run_attn(o, q, &qpos, k, v, 1, N, 1, 1, N, 1.0f);
    close_d(ref, o, (size_t)N, 1e-45, EXP_RTOL,
            "probabilities down to e^-86 to %g relative", EXP_RTOL);
    free(q);
    free(k);
    free(v);
    free(o);
    free(ref);
}

/* Paged decode: B requests with ragged contexts (1, P - 1, P, P + 1,
 * several pages), their rows scattered over an arena's pages in a shuffled
 * order, against the float64 reference on each request's rows in order. */
static void check_paged(int P)
{
    enum { B = 5 };
    const int Hq = 6, Hkv = 2, hd = 24,
              nctx[B] = {1, P - 1, P, P + 1, 3 * P + 5};
    const size_t row = (size_t)Hkv * hd;
    int maxp = 0, npages = 0;
    for (int b = 0; b < B; b++) {
        const int np = (nctx[b] + P - 1) / P;
        maxp = np > maxp ? np : maxp;
        npages += np;
    }
    npages += 3; /* pages nobody owns */
    int *perm = malloc((size_t)npages * sizeof(int));
    for (int i = 0; i < npages; i++)
        perm[i] = i;
    for (int i = npages - 1; i > 0; i--) {
        const int j = (int)((urand() + 1.0) / 2.0 * (i + 1)), t = perm[i];
        perm[i] = perm[j], perm[j] = t;
    }
    float *kp = frand_amp((size_t)npages * P * row, 1.0);
    float *vp = frand_amp((size_t)npages * P * row, 1.0);
    int *table = malloc((size_t)B * maxp * sizeof(int));
    float *q = frand_amp((size_t)B * Hq * hd, 1.0);
    float *o = malloc((size_t)B * Hq * hd * sizeof(float));
    double *ref = malloc((size_t)Hq * hd * sizeof(double));
    float *k = malloc((size_t)nctx[B - 1] * row * sizeof(float));
    float *v = malloc((size_t)nctx[B - 1] * row * sizeof(float));
    const float scale = 0.2f;
    for (int b = 0, used = 0; b < B; b++)
        for (int i = 0; i < maxp; i++)
            table[b * maxp + i] = i < (nctx[b] + P - 1) / P ? perm[used++] : -1;
    const size_t ns =
        hk_attention_decode_paged_scratch(nctx[B - 1], Hq, Hkv, hd);
    float *scr = malloc(ns * sizeof(float));
    hk_attention_decode_paged(o, q, kp, vp, table, maxp, nctx, B, P, Hq, Hkv,
                              hd, scale, scr);
    int good = 1;
    for (int b = 0; b < B; b++) {
        for (int j = 0; j < nctx[b]; j++) {
            const int page = table[b * maxp + j / P];
            memcpy(k + j * row, kp + ((size_t)page * P + j % P) * row,
                   row * sizeof(float));
            memcpy(v + j * row, vp + ((size_t)page * P + j % P) * row,
                   row * sizeof(float));
        }
        const int qpos = nctx[b] - 1;
        ref_attention(ref, q + (size_t)b * Hq * hd, &qpos, k, v, 1, nctx[b], Hq,
                      Hkv, hd, scale);
        for (size_t i = 0; i < (size_t)Hq * hd; i++)
            good &= fabs(o[(size_t)b * Hq * hd + i] - ref[i]) <=
                    ATOL + RTOL * fabs(ref[i]);
    }
    ok(good,
       "paged decode P=%d: B=%d ragged contexts over shuffled pages "
       "match float64",
       P, B);
    free(perm);
    free(kp);
    free(vp);
    free(table);
    free(q);
    free(o);
    free(ref);
    free(k);
    free(v);
    free(scr);
}

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + 1e-9 * ts.tv_nsec;
}

static void bench(int T, int N, int Hq, int Hkv, int hd, int reps)
{
    float *q = frand_amp((size_t)T * Hq * hd, 1.0);
    float *k = frand_amp((size_t)N * Hkv * hd, 1.0);
    float *v = frand_amp((size_t)N * Hkv * hd, 1.0);
    int *qpos = malloc((size_t)T * sizeof(int));
    double flops = 0.0;
    for (int t = 0; t < T; t++) {
        qpos[t] = t + (N - T);
        flops += 4.0 * hd * Hq * (qpos[t] + 1);
    }
    float *o = malloc((size_t)T * Hq * hd * sizeof(float));
    float *scr = malloc(hk_attention_scratch(T, N, Hq) * sizeof(float));
    double best = INFINITY;
    for (int i = 0; i < reps; i++) {
        double t0 = now();
        hk_attention(o, q, qpos, k, v, T, N, Hq, Hkv, hd, 0.0625f, scr);
        double dt = now() - t0;
        best = dt < best ? dt : best;
    }
    tap_diag("bench: T=%d N=%d Hq=%d Hkv=%d hd=%d threads=%d: %.2f ms "
             "(best of %d), %.1f GFLOP/s causal",
             T, N, Hq, Hkv, hd, omp_get_max_threads(), best * 1e3, reps,
             flops / best * 1e-9);
    free(q);
    free(k);
    free(v);
    free(qpos);
    free(o);
    free(scr);
}

int main(void)
{
    /* Prefill, positions 0..T-1; odd sizes; crosses query and key blocks. */
    check_case("prefill tiny", 1, 1, 1, 1, 1, NULL, 1.0, ATOL);
    check_case("prefill odd", 37, 37, 4, 2, 24, NULL, 1.0, ATOL);
    check_case("prefill gqa r=3", 301, 301, 6, 2, 40, NULL, 1.0, ATOL);
    check_case("prefill mha", 70, 70, 3, 3, 17, NULL, 1.0, ATOL);
    check_case("prefill mqa", 65, 65, 5, 1, 33, NULL, 1.0, ATOL);
    /* Continuation chunk: queries at the end of a longer cache. */
    check_case("chunk after cache", 90, 555, 8, 2, 64, NULL, 1.0, ATOL);

    /* Scattered, unsorted positions with repeats (PIC runs). */
    {
        int T = 97, N = 600, pos[97];
        for (int t = 0; t < T; t++)
            pos[t] = (int)((t * 2654435761u) % (unsigned)N);
        pos[5] = 0;
        pos[6] = N - 1;
        pos[7] = pos[8];
        check_case("scattered", T, N, 8, 2, 72, pos, 1.0, ATOL);
    }

    /* Decode T = 1, including a query in the middle of the cache. */
    check_case("decode end", 1, 600, 8, 2, 256, NULL, 1.0, ATOL);
    {
        int p = 301;
        check_case("decode mid", 1, 600, 8, 2, 256, &p, 1.0, ATOL);
        p = 0;
        check_case("decode first", 1, 257, 8, 2, 32, &p, 1.0, ATOL);
    }
    check_case("decode mha", 1, 513, 4, 4, 48, NULL, 1.0, ATOL);
    check_case("decode mqa", 1, 300, 7, 1, 20, NULL, 1.0, ATOL);
    check_case("short T=2", 2, 400, 8, 2, 64, NULL, 1.0, ATOL);

    /* Scores up to ~300: exp overflows without max subtraction. */
    check_case("large scores", 40, 300, 4, 2, 16, NULL, 12.0, ATOL_BIG);
    check_case("large scores decode", 1, 300, 4, 2, 16, NULL, 12.0, ATOL_BIG);

    check_threads();
    check_exp_range();
    check_paged(4);
    check_paged(16);

    if (getenv("HK_BENCH")) {
        int reps = atoi(getenv("HK_BENCH")); /* best of reps */
        reps = reps > 1 ? reps : 3;
        bench(2048, 2048, 8, 2, 256, reps);
        bench(1, 8192, 8, 2, 256, 10 * reps);
    }
    return tap_done();
}
