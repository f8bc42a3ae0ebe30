/*
 * test_sampler.c - the device's way of sampling against the sampler's
 * own: a device sends the scheduler hk_topk's candidates of a row
 * (hp_backend_topk), and hk_sample_topk draws from them with the same
 * uniform hp_sample would take (hp_decoder_pick_topk). Over random rows,
 * temperatures, top-k and top-p filters and seeds, that must give
 * hp_sample's token and leave the generator where hp_sample leaves it
 * wherever the candidates decide, and decide every top-k filter within
 * the candidates.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "engine/backend/backend.h"
#include "engine/forward/sampler.h"
#include "kernels/cpu/hk_cpu.h"
#include "t/lib/tap.h"
#define TEST_RNG_SEED 0x5deece66dull
#include "t/lib/testrand.h"

int main(void)
{
    enum { V = 3000, K = HP_BACKEND_TOPK_MAX, ROWS = 6, DRAWS = 40 };
    static const float temps[] = {0.3f, 0.8f, 1.0f, 1.7f};
    static const int top_ks[] = {0, 1, 20, K, K + 1};
    static const float top_ps[] = {1.0f, 0.95f, 0.6f};
    hp_sampler_t sm;
    float *l = malloc(V * sizeof(float)), *p = malloc(K * sizeof(float));
    int *idx = malloc(K * sizeof(int));
    test_rng_t rng = {TEST_RNG_SEED};
    if (hp_sampler_init(&sm, V) != 0 || !l || !p || !idx)
        return 1;

    long same = 0, decided = 0, undecided = 0, cases = 0, topk_undecided = 0;
    int agree = 1, rng_agree = 1;
    for (int row = 0; row < ROWS; row++) {
        /* peaked rows (a model's) and flat ones, ties included */
        for (int i = 0; i < V; i++)
            l[i] = row % 3 == 2 ? (float)(int)(7.0 * test_rng_unif(&rng))
                                : (float)(test_rng_normal(&rng) * (2.0 + row));
        for (size_t a = 0; a < sizeof(temps) / sizeof(*temps); a++) {
            hk_topk(p, idx, l, V, K, 1.0 / temps[a]);
            for (size_t b = 0; b < sizeof(top_ks) / sizeof(*top_ks); b++)
                for (size_t c = 0; c < sizeof(top_ps) / sizeof(*top_ps); c++)
                    for (int d = 0; d < DRAWS; d++) {
                        hp_sampling_t sp = {.temperature = temps[a],
                                            .top_k = top_ks[b],
                                            .top_p = top_ps[c],
                                            .seed = (uint64_t)d};
                        hp_rng_t ra, rb;
                        hp_rng_seed(&ra, sp.seed);
                        hp_rng_seed(&rb, sp.seed);
                        int want = hp_sample(&sm, l, &sp, &ra);
                        int got = hk_sample_topk(p, idx, K, V, sp.top_k,
                                                 sp.top_p, hp_rng_uniform(&rb));
                        cases++;
                        if (got < 0) {
                            undecided++;
                            topk_undecided += sp.top_k > 0 && sp.top_k <= K;
                            continue;
                        }
                        decided++;
                        same += got == want;
                        agree &= got == want;
                        rng_agree &= !memcmp(&ra, &rb, sizeof(ra));
                    }
        }
    }
    ok(agree,
       "the candidates pick hp_sample's token wherever they decide "
       "(%ld of %ld decided, %ld the same)",
       decided, cases, same);
    ok(rng_agree, "and leave the generator where hp_sample leaves it");
    ok(topk_undecided == 0,
       "every top-k filter within the %d candidates "
       "decides (%ld did not)",
       K, topk_undecided);
    ok(decided > cases / 2 && undecided > 0,
       "most draws decide, some need the row (%ld of %ld)", undecided, cases);

    hp_sampler_free(&sm);
    free(l);
    free(p);
    free(idx);
    return tap_done();
}
