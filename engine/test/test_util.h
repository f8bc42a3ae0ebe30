/*
 * test_util.h - what the engine tests on the committed test models share:
 * running a check on each of them, and the relative errors their
 * tolerances are stated in.
 */
#ifndef HYPIC_ENGINE_TEST_UTIL_H
#define HYPIC_ENGINE_TEST_UTIL_H

#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "engine/backend/backend.h"
#include "engine/contract/hp_error.h"
#include "t/lib/tap.h"

/* Runs check(root, name) on every model under ROOT/models/test (one per
 * architecture the engine serves); ROOT is $HYPIC_ROOT, else the working
 * directory (make test runs from the repo). Returns the TAP exit status. */
static inline int test_each_model(void (*check)(const char *root,
                                                const char *name))
{
    static const char *const models[] = {"qwen35-dense", "qwen35-moe",
                                         "qwen3next"};
    const char *root = getenv("HYPIC_ROOT") ? getenv("HYPIC_ROOT") : ".";
    for (size_t k = 0; k < sizeof(models) / sizeof(models[0]); k++)
        check(root, models[k]);
    return tap_done();
}

/* x against ref: the largest difference over the largest |ref| (*max),
 * and the L2 norm of the difference over ref's (*l2). */
static inline void test_rel_errs(const float *ref, const float *x, size_t n,
                                 double *max, double *l2)
{
    double top = 0, dmax = 0, r = 0, e = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)ref[i] - x[i]);
        top = fmax(top, fabs(ref[i]));
        dmax = fmax(dmax, d);
        r += (double)ref[i] * ref[i];
        e += d * d;
    }
    *max = top > 0 ? dmax / top : dmax;
    *l2 = r > 0 ? sqrt(e / r) : sqrt(e);
}

/* The first of the two: the largest difference over the largest |ref|. */
static inline double test_rel_err(const float *ref, const float *x, size_t n)
{
    double max, l2;
    test_rel_errs(ref, x, n, &max, &l2);
    return max;
}

/* Whether opening "cuda:0" failed (rc, err): then it must be the clear
 * refusal of a build without CUDA or a machine without a device, which is
 * recorded as the test's one check (the caller returns tap_done()). */
static inline int test_cuda_absent(int rc, const hp_error_t *err)
{
    if (rc == HP_OK)
        return 0;
    ok(rc == HP_EUNAVAIL && (strstr(err->msg, "without CUDA") ||
                             strstr(err->msg, "no CUDA device")),
       "cuda:0 refused clearly: %s", err->msg);
    return 1;
}

/* The main of a CUDA test over whole models: opens cuda:0 (absent: the
 * clear refusal is the one check), runs check(root, name, cuda) on the
 * models named in argv, else on dflt (NULL-terminated), closes it.
 * Returns the TAP exit status. */
static inline int test_cuda_models(int argc, char **argv,
                                   void (*check)(const char *root,
                                                 const char *name,
                                                 const hp_backend_t *cuda),
                                   const char *const *dflt)
{
    const hp_backend_t *cuda;
    hp_error_t err = {0};
    if (test_cuda_absent(hp_backend_open(&cuda, "cuda:0", &err), &err))
        return tap_done();
    const char *root = getenv("HYPIC_ROOT") ? getenv("HYPIC_ROOT") : ".";
    for (int i = 1; i < argc; i++)
        check(root, argv[i], cuda);
    for (int i = 0; argc <= 1 && dflt[i]; i++)
        check(root, dflt[i], cuda);
    int rc = tap_done();
    hp_backend_close(cuda);
    return rc;
}

#endif
