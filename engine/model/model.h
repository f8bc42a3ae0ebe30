/*
 * model.h - a loaded hybrid model: config, weight views, tokenizer-free.
 *
 * Weight matrices keep the checkpoint's element type (hk_weight_t: F32,
 * BF16, or I8 with per-group scales, README "Weight formats") and point
 * straight into the mmapped safetensors; F16/F64 matrices, every vector
 * (norms, gates, conv) and the Qwen3-Next fused projections (de-interleaved
 * to the Qwen3.5 split order, in their own type) go into one arena at load
 * time, vectors as f32. Spec: shared/reference/qwen3-hybrid-architecture.md
 * §2.
 */
#ifndef HP_MODEL_H
#define HP_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "engine/backend/backend.h"
#include "engine/contract/hp_error.h"
#include "engine/model/model_config.h"
#include "engine/model/safetensors.h"
#include "kernels/common/hk_weight.h"

/* A row-major [rows, cols] matrix, PyTorch nn.Linear layout: y = W x. */
typedef hk_weight_t hp_mat_t;

/* The compute dtype asked for (--dtype, serve's `dtype`): AUTO is the
 * checkpoint's (bf16 when every matrix is bf16, else f32); F32 keeps
 * f32-level accuracy in every op; BF16 lets the ops that have a choice
 * round their operands to bf16 (hp_prec_t: the attention prefill). */
typedef enum {
    HP_COMPUTE_AUTO = 0,
    HP_COMPUTE_F32,
    HP_COMPUTE_BF16
} hp_compute_t;

typedef struct {
    const float *input_norm; /* [H], zero-centred: scale by (1 + w) */
    const float *post_norm;  /* [H], zero-centred */

    /* Gated DeltaNet, split layout (Qwen3.5 order) */
    hp_mat_t in_qkv;      /* [conv_dim, H]: q (Hk*dk) | k (Hk*dk) | v (Hv*dv) */
    hp_mat_t in_z;        /* [Hv*dv, H] */
    hp_mat_t in_b;        /* [Hv, H] -> beta = sigmoid(b) */
    hp_mat_t in_a;        /* [Hv, H] -> g = -exp(A_log) softplus(a + dt_bias) */
    const float *conv_w;  /* [conv_dim, Kc], w[., Kc-1] multiplies newest */
    const float *A_log;   /* [Hv] */
    const float *dt_bias; /* [Hv] */
    const float *gnorm;   /* [dv], plain weight (not zero-centred) */
    hp_mat_t out_proj;    /* [H, Hv*dv] */

    /* gated full attention */
    hp_mat_t q_proj;     /* [Hq*2*hd, H]: per head [query hd | gate hd] */
    hp_mat_t k_proj;     /* [Hkv*hd, H] */
    hp_mat_t v_proj;     /* [Hkv*hd, H] */
    hp_mat_t o_proj;     /* [H, Hq*hd] */
    const float *q_norm; /* [hd], zero-centred */
    const float *k_norm; /* [hd], zero-centred */

    /* dense SwiGLU */
    hp_mat_t gate, up, down; /* [I,H], [I,H], [H,I] */

    /* sparse MoE */
    hp_mat_t router;                  /* [E, H] */
    hp_mat_t *exp_gate;               /* [E] of [Im, H] */
    hp_mat_t *exp_up;                 /* [E] of [Im, H] */
    hp_mat_t *exp_down;               /* [E] of [H, Im] */
    hp_mat_t sh_gate, sh_up, sh_down; /* shared expert, rows 0 if none */
    const float *sh_expert_gate;      /* [H] (shared_expert_gate [1, H]) */
} hp_layer_weights_t;

typedef struct {
    hp_model_config_t cfg;
    char dir[1024];
    const hp_backend_t *be; /* runs the model; the weights are its memory */

    hp_mat_t embed;             /* [vocab, H] */
    const float *final_norm;    /* [H], zero-centred */
    hp_mat_t lm_head;           /* [vocab, H]; the embedding when tied */
    size_t weight_bytes[3];     /* matrices (I8: with scales) by hk_wtype_t */
    hp_prec_t prec;             /* the ops' operand precision (set_dtype) */
    hp_layer_weights_t *layers; /* [L] */

    /* The ids a sampler may choose, logits[0..sample_vocab): the
     * tokenizer's (hp_llm_load; cfg.vocab_size without one). Embedding
     * tables are padded past the tokenizer, and their rows are no token. */
    int sample_vocab;

    /* 128-bit model fingerprint: XXH3-128 of config.json ++ tokenizer.json
     * bytes (DESIGN §3), the namespace of every segment id. */
    uint8_t fingerprint[16];

    /* owned storage */
    hp_st_file_t *files;
    int n_files;
    unsigned char *arena; /* converted and rearranged tensors */
    size_t arena_bytes;
    hp_mat_t *expert_mats; /* backing store of exp_gate/up/down */
    int placed;            /* the backend placed the tensors */
} hp_model_t;

/*
 * Loads DIR/config.json and every safetensors shard (DIR/model.safetensors,
 * or the shards named by DIR/model.safetensors.index.json). Accepts the
 * "model." and "model.language_model." prefixes, skips mtp.* and visual
 * tensors, checks every shape against the config (and every I8 matrix's
 * scales against quantization_config). On error returns
 * HP_EMODEL/HP_EIO with a message naming the file and tensor; *m is then
 * left freed.
 */
int hp_model_load(hp_model_t *m, const char *dir, hp_error_t *err);
/* The same on backend be (hp_model_load: the CPU): the weights the ops
 * read are placed in its memory (hp_backend_place; on the CPU they stay
 * where the loader put them, mmapped or converted). be outlives m. */
int hp_model_load_on(hp_model_t *m, const char *dir, const hp_backend_t *be,
                     hp_error_t *err);
void hp_model_free(hp_model_t *m);

/* Sets m's compute dtype (a load sets AUTO's); before any workspace is
 * planned for m (its attention scratch depends on it). */
void hp_model_set_compute(hp_model_t *m, hp_compute_t d);
/* "auto", "f32" or "bf16" into *d: 0, or -1 for anything else. */
int hp_compute_parse(const char *s, hp_compute_t *d);
/* "f32" or "bf16". */
const char *hp_prec_name(hp_prec_t p);

#endif
