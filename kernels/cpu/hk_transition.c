/*
 * hk_transition.c - the segment transition algebra of PIC for linear
 * attention (HYPIC §4.2): compose, chain, and state RoPE re-rotation.
 *
 * A segment's recurrence S_t = T_t S_{t-1} + u_t unrolls to
 * S_end = T_C S_start + S_C|0 with T_C = T_last ... T_first (HYPIC Eq. 4/6).
 * Per head, S[dk, dv] ([key][value]); T_C stored by family:
 *   scalar t[1] (T = t I), diagonal t[dk] (T = diag t), dense t[dk, dk].
 * Chaining (T2, S2) after (T1, S1) gives (T2 T1, T2 S1 + S2).
 * RoPE shift (HYPIC Eq. 7, scalar-transition layers with rotated keys):
 *   S_C|b = R(b - a) S_C|a, R acting on the key axis, rotate-half over the
 *   first rot dims, inv_freq_i = theta^(-2i/rot), angles in double.
 */
#include <assert.h>
#include <cblas.h>
#include <math.h>
#include <string.h>

#include "kernels/cpu/hk_cpu.h"

size_t hk_trans_size(hk_trans_family_t fam, int dk)
{
    switch (fam) {
    case HK_TRANS_SCALAR:
        return 1;
    case HK_TRANS_DIAG:
        return (size_t)dk;
    case HK_TRANS_DENSE:
        return (size_t)dk * dk;
    }
    return 0;
}

/* out[dk, dv] = T S + S0 for one head (S0 may be NULL = 0); out may alias
 * S or S0, hence the dense product goes through scratch[dk, dv]. */
static void trans_apply(float *out, hk_trans_family_t fam, const float *t,
                        const float *S, const float *S0, int dk, int dv,
                        float *scratch)
{
    const size_t n = (size_t)dk * dv;
    switch (fam) {
    case HK_TRANS_SCALAR:
        for (size_t e = 0; e < n; e++)
            out[e] = t[0] * S[e] + (S0 ? S0[e] : 0.0f);
        break;
    case HK_TRANS_DIAG:
        for (int i = 0; i < dk; i++) {
            for (int j = 0; j < dv; j++) {
                size_t e = (size_t)i * dv + j;
                out[e] = t[i] * S[e] + (S0 ? S0[e] : 0.0f);
            }
        }
        break;
    case HK_TRANS_DENSE:
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, dk, dv, dk, 1.0f,
                    t, dk, S, dv, 0.0f, scratch, dv);
        for (size_t e = 0; e < n; e++)
            out[e] = scratch[e] + (S0 ? S0[e] : 0.0f);
        break;
    }
}

void hk_trans_compose(float *out, // [H, dk, dv]
                      hk_trans_family_t fam,
                      const float *T,  // [H, hk_trans_size]
                      const float *S,  // [H, dk, dv]
                      const float *S0, // [H, dk, dv] or NULL
                      int H, int dk, int dv,
                      float *scratch) // [dk, dv] (dense only)
{
    assert(H >= 0 && dk > 0 && dv > 0);
    assert(fam != HK_TRANS_DENSE || scratch);
    const size_t ts = hk_trans_size(fam, dk), ss = (size_t)dk * dv;
    for (int h = 0; h < H; h++)
        trans_apply(out + h * ss, fam, T + h * ts, S + h * ss,
                    S0 ? S0 + h * ss : NULL, dk, dv, scratch);
}

void hk_trans_chain(float *T1, // [H, hk_trans_size], in/out
                    float *S1, // [H, dk, dv], in/out
                    hk_trans_family_t fam,
                    const float *T2, // [H, hk_trans_size]
                    const float *S2, // [H, dk, dv]
                    int H, int dk, int dv,
                    float *scratch) // [dk, max(dk, dv)] (dense only)
{
    assert(H >= 0 && dk > 0 && dv > 0);
    assert(fam != HK_TRANS_DENSE || scratch);
    const size_t ts = hk_trans_size(fam, dk), ss = (size_t)dk * dv;
    for (int h = 0; h < H; h++) {
        float *t1 = T1 + h * ts;
        const float *t2 = T2 + h * ts;
        /* S first: it needs T2 only, and T1 is overwritten below. */
        trans_apply(S1 + h * ss, fam, t2, S1 + h * ss, S2 + h * ss, dk, dv,
                    scratch);
        switch (fam) {
        case HK_TRANS_SCALAR:
            t1[0] *= t2[0];
            break;
        case HK_TRANS_DIAG:
            for (int i = 0; i < dk; i++)
                t1[i] *= t2[i];
            break;
        case HK_TRANS_DENSE:
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, dk, dk, dk,
                        1.0f, t2, dk, t1, dk, 0.0f, scratch, dk);
            memcpy(t1, scratch, ts * sizeof(float));
            break;
        }
    }
}

void hk_trans_rope_shift(float *S, // [H, dk, dv], in/out
                         int delta, int H, int dk, int dv, int rot,
                         double theta)
{
    assert(H >= 0 && dk > 0 && dv > 0);
    assert(rot >= 0 && rot % 2 == 0 && rot <= dk && theta > 0.0);
    const int half = rot / 2;
    for (int i = 0; i < half; i++) {
        /* The angle in double: delta can be ~1e5 and float would lose the
         * phase of the fast frequencies. */
        const double ang = (double)delta * pow(theta, -2.0 * i / rot);
        const double c = cos(ang), s = sin(ang);
        for (int h = 0; h < H; h++) {
            float *x = S + ((size_t)h * dk + i) * dv;        // row i
            float *y = S + ((size_t)h * dk + i + half) * dv; // row i+half
            for (int j = 0; j < dv; j++) {
                const double xj = x[j], yj = y[j];
                x[j] = (float)(c * xj - s * yj);
                y[j] = (float)(c * yj + s * xj);
            }
        }
    }
}
