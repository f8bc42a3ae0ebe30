/*
 * dump.h - write a sequence's states and logits as safetensors, in the
 * tensor names of the CLI contract (DESIGN §10) that tests, benchmarks and
 * reviewers read from outside.
 */
#ifndef HP_DUMP_H
#define HP_DUMP_H

#include "engine/contract/hp_error.h"
#include "engine/forward/seq.h"

/* layers.N.linear_attn.state [Hv, dk, dv], layers.N.linear_attn.conv_state
 * [conv_dim, Kc-1] (oldest first), layers.N.self_attn.k / .v
 * [n_pos, Hkv, hd] (K after RoPE). */
int hp_dump_state(const char *path, const hp_seq_t *seq, hp_error_t *err);

/* Tensor "logits": [vocab] when rows == 1 and !keep_rows, else
 * [rows, vocab]. */
int hp_dump_logits(const char *path, const float *logits, int rows, int vocab,
                   int keep_rows, hp_error_t *err);

#endif
