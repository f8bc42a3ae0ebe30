/*
 * hk_rope.c - partial rotary position embedding, rotate-half (NeoX) pairing.
 *
 * For each head vector x[hd] of a token at position p, on the first rot
 * dims (pairs i, i + rot/2), i < rot/2:
 *
 *   inv_freq_i = theta^(-2i/rot),  phi_i = p * inv_freq_i
 *   x'[i]         = x[i] cos phi_i - x[i + rot/2] sin phi_i
 *   x'[i + rot/2] = x[i + rot/2] cos phi_i + x[i] sin phi_i
 *
 * dims rot..hd-1 pass through. Layout: x [T, nh, hd] row-major, pos [T].
 * Reference: HF Qwen3NextRotaryEmbedding + apply_rotary_pos_emb (rotate_half,
 * cos/sin = cat(freqs, freqs)); spec §4.4. The shift re-rotates cached keys:
 * R(phi) is a plane rotation, so R(b - a) R(a) = R(b) and K_b = R(b - a) K_a.
 *
 * Precision (a deliberate difference from HF): HF forms inv_freq, the angle
 * p * inv_freq and cos/sin in float32, so its angle carries a rounding error
 * of up to ulp(p)/2 rad (2.4e-4 rad at p = 8192). We form inv_freq, the
 * angle and cos/sin in double and round only cos/sin to float. That makes
 * rope(x, a) followed by a shift of d equal rope(x, a + d) to float rounding
 * at any position, which the PIC splice relies on; HF parity at long
 * positions is then bounded by HF's own angle error, not ours.
 *
 * Threads: OpenMP over tokens; each element is rotated by one fixed formula.
 */
#include <assert.h>
#include <math.h>

#include "kernels/cpu/hk_cpu.h"

/* Largest supported rot: bounds the per-token cos/sin table on the stack. */
#define HK_ROPE_MAX_ROT 1024
/* Below this many rotated pairs the OpenMP fork costs more than the work. */
#define HK_ROPE_PAR_MIN 16384

/* cos/sin of p * theta^(-2i/rot) for i < rot/2, angles in double. */
static void hk_rope_table(float *restrict c, // [rot/2]
                          float *restrict s, // [rot/2]
                          double p, int rot, double theta)
{
    for (int i = 0; i < rot / 2; i++) {
        double phi = p * pow(theta, -2.0 * i / rot);
        c[i] = (float)cos(phi);
        s[i] = (float)sin(phi);
    }
}

/* Rotates the first rot dims of nh head vectors of one token. */
static void hk_rope_apply(float *restrict x,       // [nh, hd]
                          const float *restrict c, // [rot/2]
                          const float *restrict s, // [rot/2]
                          int nh, int hd, int rot)
{
    const int h2 = rot / 2;
    for (int h = 0; h < nh; h++) {
        float *a = x + (size_t)h * hd;
        float *b = a + h2;
        /* a and b are disjoint halves of one head vector. */
#pragma omp simd
        for (int i = 0; i < h2; i++) {
            float x0 = a[i], x1 = b[i];
            a[i] = x0 * c[i] - x1 * s[i];
            b[i] = x1 * c[i] + x0 * s[i];
        }
    }
}

void hk_rope(float *x,       // [T, nh, hd], in place
             const int *pos, // [T]
             int T, int nh, int hd, int rot, double theta)
{
    assert(T >= 0 && nh >= 0 && rot >= 0 && rot % 2 == 0 && rot <= hd);
    assert(rot <= HK_ROPE_MAX_ROT && theta > 0.0);
    if (rot == 0)
        return;
#pragma omp parallel for schedule(                                             \
    static) if ((size_t)T * (size_t)nh * (size_t)(rot / 2) >= HK_ROPE_PAR_MIN)
    for (int t = 0; t < T; t++) {
        float c[HK_ROPE_MAX_ROT / 2], s[HK_ROPE_MAX_ROT / 2];
        hk_rope_table(c, s, (double)pos[t], rot, theta);
        hk_rope_apply(x + (size_t)t * nh * hd, c, s, nh, hd, rot);
    }
}

void hk_rope_shift(float *x, // [T, nh, hd], in place
                   int delta, int T, int nh, int hd, int rot, double theta)
{
    assert(T >= 0 && nh >= 0 && rot >= 0 && rot % 2 == 0 && rot <= hd);
    assert(rot <= HK_ROPE_MAX_ROT && theta > 0.0);
    if (rot == 0 || delta == 0)
        return;
    float c[HK_ROPE_MAX_ROT / 2], s[HK_ROPE_MAX_ROT / 2];
    hk_rope_table(c, s, (double)delta, rot, theta);
#pragma omp parallel for schedule(                                             \
    static) if ((size_t)T * (size_t)nh * (size_t)(rot / 2) >= HK_ROPE_PAR_MIN)
    for (int t = 0; t < T; t++)
        hk_rope_apply(x + (size_t)t * nh * hd, c, s, nh, hd, rot);
}
