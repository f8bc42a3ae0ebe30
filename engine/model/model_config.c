/*
 * model_config.c - reads the hybrid model's config.json (all three flavours:
 * flat qwen3_next, flat qwen3_5(_moe)_text, VLM wrappers with text_config)
 * into hp_model_config_t. Only the text model; vision fields are ignored.
 */
#include "engine/model/model_config.h"

#include <cJSON.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/contract/hp_error.h"

/* Defaults HF applies when a field is absent (configuration_qwen3_*.py). */
#define DEF_RMS_EPS        1e-6
#define DEF_PARTIAL_ROTARY 0.25
#define DEF_ROPE_THETA     10000.0
#define DEF_CONV_KERNEL    4
#define DEF_FULL_INTERVAL  4
#define DEF_MAX_POSITIONS  32768

typedef struct {
    const cJSON *text; /* the LM fields: text_config or the root */
    const cJSON *top;  /* the root */
    const char *tpre;  /* "text_config." when wrapped, for messages */
    const char *path;
    hp_error_t *err;
} cfg_ctx_t;

/* NULL if absent or JSON null. */
static const cJSON *item(const cJSON *obj, const char *name)
{
    const cJSON *j = cJSON_GetObjectItemCaseSensitive(obj, name);
    return cJSON_IsNull(j) ? NULL : j;
}

/* Looks in the text part, then (if also_top) at the top level. Sets *pre to
 * the message prefix of where it was found. */
static const cJSON *lookup(const cfg_ctx_t *cx, const char *name, int also_top,
                           const char **pre)
{
    const cJSON *j = item(cx->text, name);
    *pre = cx->tpre;
    if (!j && also_top && cx->top != cx->text) {
        j = item(cx->top, name);
        *pre = "";
    }
    return j;
}

static int bad_field(const cfg_ctx_t *cx, const char *pre, const char *name,
                     const char *what)
{
    return hp_error_set(cx->err, HP_EMODEL, "%s: field \"%s%s\" %s", cx->path,
                        pre, name, what);
}

static int json_to_int(const cJSON *j, int *out)
{
    if (!cJSON_IsNumber(j))
        return 0;
    double d = j->valuedouble;
    if (!(d >= INT_MIN && d <= INT_MAX) || floor(d) != d)
        return 0;
    *out = (int)d;
    return 1;
}

/* Integer field; required fields fail when absent, others take def. */
static int get_int(const cfg_ctx_t *cx, const char *name, int required, int def,
                   int also_top, int *out)
{
    const char *pre;
    const cJSON *j = lookup(cx, name, also_top, &pre);
    if (!j) {
        if (required)
            return bad_field(cx, cx->tpre, name, "is missing");
        *out = def;
        return HP_OK;
    }
    if (!json_to_int(j, out))
        return bad_field(cx, pre, name, "must be an integer");
    return HP_OK;
}

static int get_num(const cfg_ctx_t *cx, const cJSON *obj, const char *pre,
                   const char *name, double def, double *out)
{
    const cJSON *j = item(obj, name);
    if (!j) {
        *out = def;
        return HP_OK;
    }
    if (!cJSON_IsNumber(j))
        return bad_field(cx, pre, name, "must be a number");
    *out = j->valuedouble;
    return HP_OK;
}

static int get_bool(const cfg_ctx_t *cx, const char *name, int def,
                    int also_top, int *out)
{
    const char *pre;
    const cJSON *j = lookup(cx, name, also_top, &pre);
    if (!j) {
        *out = def;
        return HP_OK;
    }
    if (!cJSON_IsBool(j))
        return bad_field(cx, pre, name, "must be true or false");
    *out = cJSON_IsTrue(j);
    return HP_OK;
}

/* quantization_config, where HF writes it (the top level; a wrapper's
 * text_config is also looked at). Only ours is known: "hypic_int8" (README
 * "Weight formats"); any other method's tensors are not ours to read. */
static int parse_quant(const cfg_ctx_t *cx, hp_model_config_t *c)
{
    const char *pre;
    const cJSON *q = lookup(cx, "quantization_config", 1, &pre);
    if (!q)
        return HP_OK;
    const cJSON *m = item(q, "quant_method");
    if (!cJSON_IsObject(q) || !cJSON_IsString(m))
        return bad_field(cx, pre, "quantization_config",
                         "must be an object with a \"quant_method\" string");
    if (strcmp(m->valuestring, HP_QUANT_INT8))
        return hp_error_set(cx->err, HP_EMODEL,
                            "%s: quantization_config.quant_method \"%.32s\" "
                            "is not supported (only \"%s\")",
                            cx->path, m->valuestring, HP_QUANT_INT8);
    const cJSON *b = item(q, "bits"), *g = item(q, "group_size");
    int bits = 8;
    if (b && (!json_to_int(b, &bits) || bits != 8))
        return bad_field(cx, pre, "quantization_config.bits", "must be 8");
    if (!g || !json_to_int(g, &c->quant_group) || c->quant_group < 1)
        return bad_field(cx, pre, "quantization_config.group_size",
                         "must be a positive integer");
    return HP_OK;
}

static int parse_arch(const cfg_ctx_t *cx, hp_model_config_t *c)
{
    const cJSON *mt = item(cx->text, "model_type");
    const char *pre = cx->tpre;
    const char *name = NULL;
    if (mt && !cJSON_IsString(mt))
        return bad_field(cx, pre, "model_type", "must be a string");
    if (mt) {
        name = mt->valuestring;
    } else if (cx->text != cx->top) {
        /* a wrapper whose text_config omits model_type */
        const cJSON *top = item(cx->top, "model_type");
        if (cJSON_IsString(top) && strcmp(top->valuestring, "qwen3_5") == 0)
            name = "qwen3_5_text";
        else if (cJSON_IsString(top) &&
                 strcmp(top->valuestring, "qwen3_5_moe") == 0)
            name = "qwen3_5_moe_text";
    }
    if (!name)
        return bad_field(cx, pre, "model_type", "is missing");
    if (strcmp(name, "qwen3_next") == 0)
        c->arch = HP_ARCH_QWEN3_NEXT;
    else if (strcmp(name, "qwen3_5_text") == 0 || strcmp(name, "qwen3_5") == 0)
        c->arch = HP_ARCH_QWEN3_5;
    else if (strcmp(name, "qwen3_5_moe_text") == 0 ||
             strcmp(name, "qwen3_5_moe") == 0)
        c->arch = HP_ARCH_QWEN3_5_MOE;
    else
        return hp_error_set(cx->err, HP_EMODEL,
                            "%s: field \"%smodel_type\" is \"%.40s\"; "
                            "supported: qwen3_next, qwen3_5(_text), "
                            "qwen3_5_moe(_text)",
                            cx->path, pre, name);
    snprintf(c->model_type, sizeof(c->model_type), "%s", name);
    return HP_OK;
}

/* rope_theta / partial_rotary_factor: rope_parameters (or its older alias
 * rope_scaling) first, then top level of the text part, then defaults. */
static int parse_rope(const cfg_ctx_t *cx, hp_model_config_t *c)
{
    char rpre[64];
    const char *rname = "rope_parameters";
    const cJSON *rp = item(cx->text, rname);
    if (!rp) {
        rname = "rope_scaling";
        rp = item(cx->text, rname);
    }
    if (rp && !cJSON_IsObject(rp))
        return bad_field(cx, cx->tpre, rname, "must be an object");
    snprintf(rpre, sizeof(rpre), "%s%s.", cx->tpre, rname);

    double theta, prf;
    int rc;
    if ((rc = get_num(cx, cx->text, cx->tpre, "rope_theta", DEF_ROPE_THETA,
                      &theta)) != HP_OK ||
        (rc = get_num(cx, cx->text, cx->tpre, "partial_rotary_factor",
                      DEF_PARTIAL_ROTARY, &prf)) != HP_OK)
        return rc;
    if (rp) {
        const cJSON *type = item(rp, "rope_type");
        if (!type)
            type = item(rp, "type");
        if (type && (!cJSON_IsString(type) ||
                     strcmp(type->valuestring, "default") != 0))
            return bad_field(cx, rpre, "rope_type",
                             "must be \"default\" (scaled RoPE is not "
                             "supported)");
        if ((rc = get_num(cx, rp, rpre, "rope_theta", theta, &theta)) !=
                HP_OK ||
            (rc = get_num(cx, rp, rpre, "partial_rotary_factor", prf, &prf)) !=
                HP_OK)
            return rc;
    }
    if (!(theta > 0.0))
        return bad_field(cx, cx->tpre, "rope_theta", "must be positive");
    if (!(prf >= 0.0 && prf <= 1.0))
        return bad_field(cx, cx->tpre, "partial_rotary_factor",
                         "must be in [0, 1]");
    c->rope_theta = theta;
    c->rotary_dim = (int)(c->head_dim * prf); /* int() as in HF */
    return HP_OK;
}

static int parse_layer_types(const cfg_ctx_t *cx, hp_model_config_t *c)
{
    const cJSON *lt = item(cx->text, "layer_types");
    if (lt) {
        if (!cJSON_IsArray(lt) || cJSON_GetArraySize(lt) != c->n_layers)
            return hp_error_set(cx->err, HP_EMODEL,
                                "%s: field \"%slayer_types\" must be a list "
                                "of num_hidden_layers (%d) strings",
                                cx->path, cx->tpre, c->n_layers);
        int i = 0;
        const cJSON *e;
        cJSON_ArrayForEach(e, lt)
        {
            const char *s = cJSON_IsString(e) ? e->valuestring : "";
            if (strcmp(s, "linear_attention") == 0 || strcmp(s, "mamba") == 0)
                c->layer_kind[i] = HP_LAYER_LINEAR;
            else if (strcmp(s, "full_attention") == 0 ||
                     strcmp(s, "attention") == 0)
                c->layer_kind[i] = HP_LAYER_FULL;
            else
                return hp_error_set(cx->err, HP_EMODEL,
                                    "%s: field \"%slayer_types\"[%d] is "
                                    "\"%.32s\"; expected linear_attention or "
                                    "full_attention",
                                    cx->path, cx->tpre, i, s);
            i++;
        }
        return HP_OK;
    }
    int interval, rc;
    if ((rc = get_int(cx, "full_attention_interval", 0, DEF_FULL_INTERVAL, 0,
                      &interval)) != HP_OK)
        return rc;
    if (interval < 1)
        return bad_field(cx, cx->tpre, "full_attention_interval",
                         "must be >= 1");
    for (int i = 0; i < c->n_layers; i++)
        c->layer_kind[i] =
            (i + 1) % interval == 0 ? HP_LAYER_FULL : HP_LAYER_LINEAR;
    return HP_OK;
}

static int parse_moe(const cfg_ctx_t *cx, hp_model_config_t *c)
{
    int rc;
    c->n_experts = 0;
    if (c->arch != HP_ARCH_QWEN3_5 &&
        (rc = get_int(cx, "num_experts", 1, 0, 0, &c->n_experts)) != HP_OK)
        return rc;
    if (c->n_experts < 0)
        return bad_field(cx, cx->tpre, "num_experts", "must be >= 0");

    int step = 1;
    c->norm_topk_prob = 1;
    if (c->arch == HP_ARCH_QWEN3_NEXT) {
        if ((rc = get_int(cx, "decoder_sparse_step", 0, 1, 0, &step)) !=
                HP_OK ||
            (rc = get_bool(cx, "norm_topk_prob", 1, 0, &c->norm_topk_prob)) !=
                HP_OK)
            return rc;
        if (step < 1)
            return bad_field(cx, cx->tpre, "decoder_sparse_step",
                             "must be >= 1");
    }
    /* Qwen3.5-MoE: every layer sparse, top-k always renormalized */
    for (int i = 0; i < c->n_layers; i++)
        c->layer_moe[i] = c->n_experts > 0 && (i + 1) % step == 0;
    if (c->arch == HP_ARCH_QWEN3_NEXT) {
        const cJSON *ml = item(cx->text, "mlp_only_layers");
        if (ml && !cJSON_IsArray(ml))
            return bad_field(cx, cx->tpre, "mlp_only_layers",
                             "must be a list of layer indices");
        const cJSON *e;
        cJSON_ArrayForEach(e, ml)
        {
            int li;
            if (!json_to_int(e, &li) || li < 0 || li >= c->n_layers)
                return bad_field(cx, cx->tpre, "mlp_only_layers",
                                 "has an entry that is not a layer index");
            c->layer_moe[li] = 0;
        }
    }

    int any_dense = 0;
    for (int i = 0; i < c->n_layers; i++)
        any_dense |= !c->layer_moe[i];
    if ((rc = get_int(cx, "intermediate_size", any_dense, 0, 0,
                      &c->intermediate)) != HP_OK)
        return rc;
    if (any_dense && c->intermediate <= 0)
        return bad_field(cx, cx->tpre, "intermediate_size", "must be > 0");
    if (!any_dense)
        c->intermediate = 0; /* no dense MLP: the field is not a shape */
    if (c->n_experts > 0) {
        if ((rc = get_int(cx, "num_experts_per_tok", 1, 0, 0,
                          &c->n_experts_per_tok)) != HP_OK ||
            (rc = get_int(cx, "moe_intermediate_size", 1, 0, 0,
                          &c->moe_intermediate)) != HP_OK ||
            (rc = get_int(cx, "shared_expert_intermediate_size", 1, 0, 0,
                          &c->shared_intermediate)) != HP_OK)
            return rc;
        if (c->n_experts_per_tok < 1 || c->n_experts_per_tok > c->n_experts)
            return bad_field(cx, cx->tpre, "num_experts_per_tok",
                             "must be in [1, num_experts]");
        if (c->moe_intermediate <= 0)
            return bad_field(cx, cx->tpre, "moe_intermediate_size",
                             "must be > 0");
        if (c->shared_intermediate < 0)
            return bad_field(cx, cx->tpre, "shared_expert_intermediate_size",
                             "must be >= 0");
    }
    return HP_OK;
}

static int parse_tokens(const cfg_ctx_t *cx, hp_model_config_t *c)
{
    const char *pre;
    const cJSON *b = lookup(cx, "bos_token_id", 1, &pre);
    c->bos_id = -1;
    if (b && (!json_to_int(b, &c->bos_id) || c->bos_id < 0))
        return bad_field(cx, pre, "bos_token_id", "must be a token id");
    const cJSON *e = lookup(cx, "eos_token_id", 1, &pre);
    c->n_eos = 0;
    if (!e)
        return HP_OK;
    if (cJSON_IsArray(e)) {
        if (cJSON_GetArraySize(e) > HP_MAX_EOS)
            return bad_field(cx, pre, "eos_token_id",
                             "lists more ids than supported (8)");
        const cJSON *x;
        cJSON_ArrayForEach(x, e)
        {
            if (!json_to_int(x, &c->eos_ids[c->n_eos]) ||
                c->eos_ids[c->n_eos] < 0)
                return bad_field(cx, pre, "eos_token_id",
                                 "must hold token ids");
            c->n_eos++;
        }
    } else if (json_to_int(e, &c->eos_ids[0]) && c->eos_ids[0] >= 0) {
        c->n_eos = 1;
    } else {
        return bad_field(cx, pre, "eos_token_id",
                         "must be a token id or a list of them");
    }
    return HP_OK;
}

static int validate(const cfg_ctx_t *cx, hp_model_config_t *c)
{
    struct {
        const char *name;
        int v;
    } pos[] = {
        {"vocab_size", c->vocab_size},
        {"hidden_size", c->hidden},
        {"num_attention_heads", c->n_heads},
        {"num_key_value_heads", c->n_kv_heads},
        {"head_dim", c->head_dim},
        {"linear_num_key_heads", c->lin_k_heads},
        {"linear_num_value_heads", c->lin_v_heads},
        {"linear_key_head_dim", c->lin_k_dim},
        {"linear_value_head_dim", c->lin_v_dim},
        {"linear_conv_kernel_dim", c->conv_kernel},
    };
    for (size_t i = 0; i < sizeof(pos) / sizeof(pos[0]); i++) {
        if (pos[i].v <= 0)
            return bad_field(cx, cx->tpre, pos[i].name, "must be > 0");
    }
    if (c->n_layers < 1 || c->n_layers > HP_MAX_LAYERS)
        return bad_field(cx, cx->tpre, "num_hidden_layers",
                         "must be in [1, 256]");
    if (c->n_heads % c->n_kv_heads != 0)
        return bad_field(cx, cx->tpre, "num_attention_heads",
                         "must be a multiple of num_key_value_heads");
    if (c->lin_v_heads % c->lin_k_heads != 0)
        return bad_field(cx, cx->tpre, "linear_num_value_heads",
                         "must be a multiple of linear_num_key_heads");
    if (c->conv_kernel > 64)
        return bad_field(cx, cx->tpre, "linear_conv_kernel_dim",
                         "must be <= 64");
    if (c->rotary_dim % 2 != 0 || c->rotary_dim > c->head_dim)
        return bad_field(cx, cx->tpre, "partial_rotary_factor",
                         "must give an even rotary dim <= head_dim");
    if (!(c->rms_eps > 0.0f))
        return bad_field(cx, cx->tpre, "rms_norm_eps", "must be > 0");
    return HP_OK;
}

void hp_model_config_derive(hp_model_config_t *c)
{
    c->n_lin = c->n_full = 0;
    for (int l = 0; l < c->n_layers; l++)
        c->slot[l] =
            c->layer_kind[l] == HP_LAYER_LINEAR ? c->n_lin++ : c->n_full++;
    c->state_floats = (size_t)c->lin_v_heads * c->lin_k_dim * c->lin_v_dim;
    c->trans_floats = (size_t)c->lin_v_heads * c->lin_k_dim * c->lin_k_dim;
    c->conv_floats = (size_t)hp_cfg_conv_dim(c) * (c->conv_kernel - 1);
    c->kv_row = (size_t)c->n_kv_heads * c->head_dim;
}

int hp_model_config_parse(hp_model_config_t *cfg, const char *json,
                          const char *path, hp_error_t *err)
{
    memset(cfg, 0, sizeof(*cfg));
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithOpts(json, &end, 0);
    if (!root)
        return hp_error_set(err, HP_EMODEL,
                            "%s: not valid JSON (near byte %td)", path,
                            end ? end - json : (ptrdiff_t)0);
    cfg_ctx_t cx = {root, root, "", path, err};
    int rc = HP_OK;
    if (!cJSON_IsObject(root)) {
        rc = hp_error_set(err, HP_EMODEL, "%s: not a JSON object", path);
        goto out;
    }
    const cJSON *tc = item(root, "text_config");
    if (tc) {
        if (!cJSON_IsObject(tc)) {
            rc = bad_field(&cx, "", "text_config", "must be an object");
            goto out;
        }
        cx.text = tc;
        cx.tpre = "text_config.";
    }
    if ((rc = parse_arch(&cx, cfg)) != HP_OK)
        goto out;

    const char *pre;
    const cJSON *act = lookup(&cx, "hidden_act", 0, &pre);
    if (act && (!cJSON_IsString(act) || strcmp(act->valuestring, "silu")))
        rc = bad_field(&cx, pre, "hidden_act", "must be \"silu\"");
    const cJSON *ab = lookup(&cx, "attention_bias", 0, &pre);
    if (rc == HP_OK && cJSON_IsTrue(ab))
        rc = bad_field(&cx, pre, "attention_bias", "must be false");
    if (rc != HP_OK)
        goto out;

    double eps;
    if ((rc = get_int(&cx, "vocab_size", 1, 0, 0, &cfg->vocab_size)) ||
        (rc = get_int(&cx, "hidden_size", 1, 0, 0, &cfg->hidden)) ||
        (rc = get_int(&cx, "num_hidden_layers", 1, 0, 0, &cfg->n_layers)) ||
        (rc = get_num(&cx, cx.text, cx.tpre, "rms_norm_eps", DEF_RMS_EPS,
                      &eps)) ||
        (rc = get_bool(&cx, "tie_word_embeddings", 0, 1,
                       &cfg->tie_embeddings)) ||
        (rc = get_int(&cx, "num_attention_heads", 1, 0, 0, &cfg->n_heads)) ||
        (rc = get_int(&cx, "num_key_value_heads", 1, 0, 0, &cfg->n_kv_heads)) ||
        (rc = get_int(&cx, "head_dim", 1, 0, 0, &cfg->head_dim)) ||
        (rc = get_int(&cx, "linear_num_key_heads", 1, 0, 0,
                      &cfg->lin_k_heads)) ||
        (rc = get_int(&cx, "linear_num_value_heads", 1, 0, 0,
                      &cfg->lin_v_heads)) ||
        (rc = get_int(&cx, "linear_key_head_dim", 1, 0, 0, &cfg->lin_k_dim)) ||
        (rc =
             get_int(&cx, "linear_value_head_dim", 1, 0, 0, &cfg->lin_v_dim)) ||
        (rc = get_int(&cx, "linear_conv_kernel_dim", 0, DEF_CONV_KERNEL, 0,
                      &cfg->conv_kernel)) ||
        (rc = get_int(&cx, "max_position_embeddings", 0, DEF_MAX_POSITIONS, 1,
                      &cfg->max_positions)))
        goto out;
    cfg->rms_eps = (float)eps;
    if (cfg->n_layers < 1 || cfg->n_layers > HP_MAX_LAYERS) {
        rc =
            bad_field(&cx, cx.tpre, "num_hidden_layers", "must be in [1, 256]");
        goto out;
    }
    if ((rc = parse_rope(&cx, cfg)) || (rc = parse_layer_types(&cx, cfg)) ||
        (rc = parse_moe(&cx, cfg)) || (rc = parse_tokens(&cx, cfg)) ||
        (rc = parse_quant(&cx, cfg)) || (rc = validate(&cx, cfg)))
        goto out;
    hp_model_config_derive(cfg);
out:
    cJSON_Delete(root);
    return rc;
}

int hp_model_config_load(hp_model_config_t *cfg, const char *dir,
                         hp_error_t *err)
{
    char path[1200];
    snprintf(path, sizeof(path), "%s/config.json", dir);
    FILE *fp = fopen(path, "rb");
    if (!fp)
        return hp_error_set(err, HP_EMODEL, "%s: %s", path, strerror(errno));
    char *buf = NULL;
    size_t len = 0, cap = 0;
    int rc = HP_OK;
    for (;;) {
        if (len + 4096 + 1 > cap) {
            cap = cap ? cap * 2 : 16384;
            char *nb = realloc(buf, cap);
            if (!nb) {
                rc = hp_error_set(err, HP_ENOMEM, "%s: out of memory", path);
                break;
            }
            buf = nb;
        }
        size_t got = fread(buf + len, 1, cap - len - 1, fp);
        len += got;
        if (got == 0)
            break;
    }
    if (rc == HP_OK && ferror(fp))
        rc = hp_error_set(err, HP_EIO, "%s: read error", path);
    fclose(fp);
    if (rc == HP_OK) {
        buf[len] = '\0';
        rc = hp_model_config_parse(cfg, buf, path, err);
    }
    free(buf);
    return rc;
}
