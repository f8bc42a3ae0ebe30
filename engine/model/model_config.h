/*
 * model_config.h - the hybrid model's hyper-parameters, read from an HF
 * config.json: flat Qwen3-Next ("qwen3_next"), flat Qwen3.5 text
 * ("qwen3_5_text", "qwen3_5_moe_text") and the Qwen3.5 VLM wrappers
 * ("qwen3_5", "qwen3_5_moe") whose LM fields sit under "text_config".
 * Spec: shared/reference/qwen3-hybrid-architecture.md §1.
 */
#ifndef HP_MODEL_CONFIG_H
#define HP_MODEL_CONFIG_H

#include <stddef.h>

#include "engine/contract/hp_error.h"

#define HP_MAX_LAYERS 256
#define HP_MAX_EOS    8
/* Our int8 weight format: quantization_config.quant_method, and the suffix
 * of a quantized tensor's scales (README "Weight formats"). */
#define HP_QUANT_INT8      "hypic_int8"
#define HP_QUANT_SCALE_SUF "_scale"

typedef enum {
    HP_ARCH_QWEN3_NEXT = 1, /* fused in_proj_qkvz / in_proj_ba */
    HP_ARCH_QWEN3_5,        /* split projections, dense MLP */
    HP_ARCH_QWEN3_5_MOE     /* split projections, MoE every layer */
} hp_arch_t;

typedef enum { HP_LAYER_LINEAR = 0, HP_LAYER_FULL = 1 } hp_layer_kind_t;

typedef struct {
    hp_arch_t arch;
    char model_type[48]; /* as written in the file (text part) */

    int vocab_size;
    int hidden;   /* H */
    int n_layers; /* L */
    float rms_eps;
    int tie_embeddings; /* hint only: absence of lm_head.weight decides */

    /* gated full attention */
    int n_heads;    /* Hq */
    int n_kv_heads; /* Hkv */
    int head_dim;   /* hd */
    int rotary_dim; /* int(hd * partial_rotary_factor), even */
    double rope_theta;

    /* Gated DeltaNet */
    int lin_k_heads; /* Hk */
    int lin_v_heads; /* Hv, a multiple of Hk */
    int lin_k_dim;   /* dk */
    int lin_v_dim;   /* dv */
    int conv_kernel; /* Kc */

    /* MLP */
    int intermediate;        /* dense SwiGLU width (0 if none) */
    int n_experts;           /* E, 0 = dense model */
    int n_experts_per_tok;   /* top-k */
    int moe_intermediate;    /* per-expert width */
    int shared_intermediate; /* shared expert width, 0 = none */
    int norm_topk_prob;      /* renormalize top-k weights */

    int bos_id; /* -1 if none */
    int eos_ids[HP_MAX_EOS];
    int n_eos;
    int max_positions;

    /* quantization_config.group_size of "hypic_int8" (I8 weights, each
     * with a "<name>_scale" tensor; README "Weight formats"); 0: none */
    int quant_group;

    unsigned char layer_kind[HP_MAX_LAYERS]; /* hp_layer_kind_t */
    unsigned char layer_moe[HP_MAX_LAYERS];  /* 1: sparse MoE MLP */

    /* Geometry, derived once from the fields above by
     * hp_model_config_derive (parse calls it): every box sizes states,
     * checkpoints and cache entries from these. */
    int n_lin;               /* Gated DeltaNet layers */
    int n_full;              /* full-attention layers */
    int slot[HP_MAX_LAYERS]; /* layer -> its index among its kind */
    size_t state_floats;     /* one linear layer's S: Hv * dk * dv */
    size_t trans_floats;     /* one linear layer's T_C: Hv * dk * dk */
    size_t conv_floats;      /* its conv history: conv_dim * (Kc - 1) */
    size_t kv_row;           /* one position's K (or V): Hkv * hd */
} hp_model_config_t;

/* Derived sizes. */
static inline int hp_cfg_key_dim(const hp_model_config_t *c)
{
    return c->lin_k_heads * c->lin_k_dim;
}
static inline int hp_cfg_value_dim(const hp_model_config_t *c)
{
    return c->lin_v_heads * c->lin_v_dim;
}
static inline int hp_cfg_conv_dim(const hp_model_config_t *c)
{
    return 2 * hp_cfg_key_dim(c) + hp_cfg_value_dim(c);
}

/* Fills the geometry (n_lin .. kv_row) from the other fields; for a config
 * filled by hand (benchmarks), parse and load call it. */
void hp_model_config_derive(hp_model_config_t *cfg);

/*
 * Parses config.json text (path is used in messages only). Fills *cfg and
 * validates it (positive sizes, Hv % Hk == 0, Hq % Hkv == 0, rotary_dim even
 * and <= hd, layer counts <= HP_MAX_LAYERS). Returns HP_OK or HP_EMODEL with
 * a message naming the file and the field.
 */
int hp_model_config_parse(hp_model_config_t *cfg, const char *json,
                          const char *path, hp_error_t *err);

/* Reads and parses DIR/config.json. */
int hp_model_config_load(hp_model_config_t *cfg, const char *dir,
                         hp_error_t *err);

#endif
