/*
 * test_model_load.c - config parsing of every flavour, loading of the
 * committed test models (checked against the weights transformers read back,
 * stored as weights.* in golden.safetensors), fingerprint, sharded loads, and
 * broken model copies that must fail with one clear HP_EMODEL message.
 * Run from the repo root, or set HYPIC_ROOT.
 */
#include <cJSON.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include "engine/model/model.h"
#include "kernels/cpu/hk_cpu.h"
#include "t/lib/tap.h"

static char repo_root[1024] = ".";
static char tmpdir[64];

/* ---- small file helpers (tests may exit on setup failure) ---- */

static char *read_file(const char *path, size_t *len)
{
    FILE *fp = fopen(path, "rb");
    if (!fp)
        return NULL;
    fseek(fp, 0, SEEK_END);
    long n = ftell(fp);
    fseek(fp, 0, SEEK_SET);
    char *buf = malloc((size_t)n + 1);
    if (!buf || fread(buf, 1, (size_t)n, fp) != (size_t)n) {
        fprintf(stderr, "cannot read %s\n", path);
        exit(2);
    }
    buf[n] = '\0';
    fclose(fp);
    if (len)
        *len = (size_t)n;
    return buf;
}

static void write_file(const char *path, const void *p, size_t n)
{
    FILE *fp = fopen(path, "wb");
    if (!fp || (n && fwrite(p, 1, n, fp) != n) || fclose(fp) != 0) {
        fprintf(stderr, "cannot write %s\n", path);
        exit(2);
    }
}

static void copy_file(const char *src, const char *dst)
{
    size_t n;
    char *b = read_file(src, &n);
    if (!b) {
        fprintf(stderr, "cannot read %s\n", src);
        exit(2);
    }
    write_file(dst, b, n);
    free(b);
}

static void model_path(char *out, size_t n, const char *model)
{
    snprintf(out, n, "%s/models/test/%s", repo_root, model);
}

/* A fresh copy dir tmpdir/NAME with config.json and tokenizer.json of
 * MODEL (and model.safetensors if with_weights). */
static void make_copy(char *dir, size_t n, const char *name, const char *model,
                      int with_weights)
{
    char src[1200], a[1300], b[1300];
    model_path(src, sizeof(src), model);
    snprintf(dir, n, "%s/%s", tmpdir, name);
    mkdir(dir, 0700);
    const char *files[] = {"config.json", "tokenizer.json",
                           "model.safetensors"};
    for (int i = 0; i < (with_weights ? 3 : 2); i++) {
        snprintf(a, sizeof(a), "%s/%s", src, files[i]);
        snprintf(b, sizeof(b), "%s/%s", dir, files[i]);
        copy_file(a, b);
    }
}

static void remove_dir(const char *dir)
{
    const char *files[] = {"config.json",
                           "tokenizer.json",
                           "model.safetensors",
                           "model.safetensors.index.json",
                           "model-00001-of-00002.safetensors",
                           "model-00002-of-00002.safetensors"};
    char p[1300];
    for (size_t i = 0; i < sizeof(files) / sizeof(files[0]); i++) {
        snprintf(p, sizeof(p), "%s/%s", dir, files[i]);
        unlink(p);
    }
    rmdir(dir);
}

/*
 * Rewrites the F32 tensors of SRC into DST (f32 writer), leaving out
 * tensors for which keep() says 0 and giving reshape_name the shape rs.
 */
typedef int (*keep_fn)(const char *name, void *ctx);

static int rewrite(const char *src, const char *dst, keep_fn keep, void *ctx,
                   const char *reshape_name, int rs0, int rs1)
{
    hp_st_file_t f;
    hp_error_t err;
    if (hp_st_open(&f, src, &err) != HP_OK) {
        tap_diag("%s", err.msg);
        return -1;
    }
    hp_st_out_t *o = calloc((size_t)f.n_tensors, sizeof(*o));
    int n = 0;
    for (int i = 0; i < f.n_tensors; i++) {
        const hp_st_tensor_t *t = &f.tensors[i];
        if (t->dtype != HP_DT_F32 || (keep && !keep(t->name, ctx)))
            continue;
        o[n].name = t->name;
        o[n].ndim = t->ndim;
        memcpy(o[n].shape, t->shape, sizeof(t->shape));
        o[n].data = t->data;
        if (reshape_name && strcmp(t->name, reshape_name) == 0) {
            o[n].ndim = 2;
            o[n].shape[0] = rs0;
            o[n].shape[1] = rs1;
        }
        n++;
    }
    int rc = hp_st_write_f32(dst, o, n, &err);
    if (rc != HP_OK)
        tap_diag("%s", err.msg);
    free(o);
    hp_st_close(&f);
    return rc;
}

/* ---- config parsing ---- */

static int parse(hp_model_config_t *c, const char *json, hp_error_t *err)
{
    return hp_model_config_parse(c, json, "dir/config.json", err);
}

static void test_config_flavours(void)
{
    hp_model_config_t c;
    hp_error_t err = {0};

    /* Qwen3-Next: top-level rope, interval schedule, sparse step, dense
     * override, legacy names not used */
    int rc = parse(&c,
                   "{\"model_type\":\"qwen3_next\",\"vocab_size\":100,"
                   "\"hidden_size\":32,\"num_hidden_layers\":8,"
                   "\"num_attention_heads\":4,\"num_key_value_heads\":2,"
                   "\"head_dim\":64,\"rope_theta\":5000,"
                   "\"linear_num_key_heads\":2,\"linear_num_value_heads\":6,"
                   "\"linear_key_head_dim\":8,\"linear_value_head_dim\":4,"
                   "\"intermediate_size\":40,\"num_experts\":4,"
                   "\"num_experts_per_tok\":2,\"moe_intermediate_size\":8,"
                   "\"shared_expert_intermediate_size\":0,"
                   "\"decoder_sparse_step\":2,\"mlp_only_layers\":[5],"
                   "\"norm_topk_prob\":false,\"eos_token_id\":[7,9],"
                   "\"bos_token_id\":3}",
                   &err);
    ok(rc == HP_OK, "qwen3_next flat config (%s)", err.msg);
    ok(c.arch == HP_ARCH_QWEN3_NEXT && c.rope_theta == 5000.0 &&
           c.rotary_dim == 16 && c.conv_kernel == 4 && c.rms_eps == 1e-6f &&
           c.max_positions == 32768,
       "top-level rope_theta, default partial_rotary_factor 0.25 (64 -> "
       "16), kernel 4, eps 1e-6");
    int sched = 1;
    for (int i = 0; i < 8; i++)
        sched &= c.layer_kind[i] ==
                 ((i + 1) % 4 == 0 ? HP_LAYER_FULL : HP_LAYER_LINEAR);
    ok(sched, "full_attention_interval default 4: layers 3, 7 full");
    ok(c.layer_moe[0] == 0 && c.layer_moe[1] == 1 && c.layer_moe[3] == 1 &&
           c.layer_moe[5] == 0 && c.layer_moe[7] == 1 && c.intermediate == 40,
       "decoder_sparse_step 2 + mlp_only_layers [5]: MoE on 1, 3, 7");
    ok(c.norm_topk_prob == 0 && c.n_eos == 2 && c.eos_ids[1] == 9 &&
           c.bos_id == 3 && c.shared_intermediate == 0,
       "norm_topk_prob false, eos list, bos");
    ok(hp_cfg_conv_dim(&c) == 2 * 16 + 24, "conv_dim = 2 Hk dk + Hv dv");
    ok(c.n_lin == 6 && c.n_full == 2 && c.slot[0] == 0 && c.slot[2] == 2 &&
           c.slot[3] == 0 && c.slot[4] == 3 && c.slot[7] == 1,
       "geometry: 6 linear + 2 full layers, slots per kind");
    ok(c.state_floats == 6 * 8 * 4 && c.trans_floats == 6 * 8 * 8 &&
           c.conv_floats == (size_t)(2 * 16 + 24) * 3 && c.kv_row == 2 * 64,
       "geometry: S Hv dk dv, T_C Hv dk dk, conv (Kc-1) conv_dim, K row "
       "Hkv hd");

    /* Qwen3.5 text: rope_parameters, layer_types with legacy names */
    rc = parse(&c,
               "{\"model_type\":\"qwen3_5_text\",\"vocab_size\":100,"
               "\"hidden_size\":32,\"num_hidden_layers\":3,"
               "\"num_attention_heads\":2,\"num_key_value_heads\":1,"
               "\"head_dim\":16,\"rope_theta\":1,\"rope_parameters\":"
               "{\"rope_type\":\"default\",\"rope_theta\":1e7,"
               "\"partial_rotary_factor\":0.5,\"mrope_section\":[2,1,1]},"
               "\"layer_types\":[\"mamba\",\"attention\","
               "\"linear_attention\"],\"rms_norm_eps\":1e-5,"
               "\"linear_num_key_heads\":1,\"linear_num_value_heads\":1,"
               "\"linear_key_head_dim\":8,\"linear_value_head_dim\":8,"
               "\"linear_conv_kernel_dim\":3,\"intermediate_size\":64,"
               "\"num_experts\":99,\"eos_token_id\":5}",
               &err);
    ok(rc == HP_OK, "qwen3_5_text flat config (%s)", err.msg);
    ok(c.arch == HP_ARCH_QWEN3_5 && c.rope_theta == 1e7 && c.rotary_dim == 8 &&
           c.rms_eps == 1e-5f && c.conv_kernel == 3,
       "rope_parameters win over top level; factor 0.5 -> 8");
    ok(c.layer_kind[0] == HP_LAYER_LINEAR && c.layer_kind[1] == HP_LAYER_FULL &&
           c.layer_kind[2] == HP_LAYER_LINEAR,
       "legacy mamba/attention names remapped");
    ok(c.n_experts == 0 && c.layer_moe[0] == 0 && c.intermediate == 64 &&
           c.n_eos == 1 && c.eos_ids[0] == 5 && c.bos_id == -1,
       "dense Qwen3.5 ignores MoE fields; eos int; no bos");

    /* Qwen3.5-MoE wrapper: text_config without model_type, tie at top */
    rc = parse(&c,
               "{\"model_type\":\"qwen3_5_moe\",\"tie_word_embeddings\":true,"
               "\"eos_token_id\":11,\"text_config\":{\"vocab_size\":100,"
               "\"hidden_size\":32,\"num_hidden_layers\":4,"
               "\"num_attention_heads\":2,\"num_key_value_heads\":2,"
               "\"head_dim\":16,\"linear_num_key_heads\":2,"
               "\"linear_num_value_heads\":2,\"linear_key_head_dim\":8,"
               "\"linear_value_head_dim\":8,\"num_experts\":4,"
               "\"num_experts_per_tok\":1,\"moe_intermediate_size\":8,"
               "\"shared_expert_intermediate_size\":8,"
               "\"norm_topk_prob\":false},\"vision_config\":{\"depth\":1}}",
               &err);
    ok(rc == HP_OK, "qwen3_5_moe wrapper config (%s)", err.msg);
    ok(c.arch == HP_ARCH_QWEN3_5_MOE &&
           strcmp(c.model_type, "qwen3_5_moe_text") == 0 &&
           c.tie_embeddings == 1 && c.n_eos == 1 && c.eos_ids[0] == 11,
       "text part found, tie and eos read from the top level");
    ok(c.layer_moe[0] && c.layer_moe[3] && c.norm_topk_prob == 1 &&
           c.intermediate == 0 && c.rope_theta == 10000.0,
       "Qwen3.5-MoE: every layer MoE, top-k always renormalized");
}

static void expect_cfg_error(const char *what, const char *json,
                             const char *needle)
{
    hp_model_config_t c;
    hp_error_t err = {0};
    int rc = parse(&c, json, &err);
    ok(rc == HP_EMODEL && strstr(err.msg, "dir/config.json") &&
           strstr(err.msg, needle),
       "config error, %s: %s", what, err.msg);
}

#define BASE35                                                                 \
    "\"vocab_size\":100,\"num_hidden_layers\":2,"                              \
    "\"num_attention_heads\":2,\"num_key_value_heads\":1,\"head_dim\":16,"     \
    "\"linear_num_key_heads\":1,\"linear_key_head_dim\":8,"                    \
    "\"linear_value_head_dim\":8,\"intermediate_size\":8"

static void test_config_errors(void)
{
    expect_cfg_error("another quantization method",
                     "{\"model_type\":\"qwen3_5_text\",\"hidden_size\":32,"
                     "\"linear_num_value_heads\":1," BASE35
                     ",\"quantization_config\":{\"quant_method\":\"gptq\"}}",
                     "quant_method \"gptq\" is not supported");
    expect_cfg_error("int8 of 4 bits",
                     "{\"model_type\":\"qwen3_5_text\",\"hidden_size\":32,"
                     "\"linear_num_value_heads\":1," BASE35
                     ",\"quantization_config\":{\"quant_method\":"
                     "\"hypic_int8\",\"bits\":4,\"group_size\":32}}",
                     "quantization_config.bits");
    expect_cfg_error("int8 without a group size",
                     "{\"model_type\":\"qwen3_5_text\",\"hidden_size\":32,"
                     "\"linear_num_value_heads\":1," BASE35
                     ",\"quantization_config\":{\"quant_method\":"
                     "\"hypic_int8\"}}",
                     "quantization_config.group_size");
    expect_cfg_error("bad JSON", "{\"model_type\": ", "JSON");
    expect_cfg_error("not an object", "[]", "object");
    expect_cfg_error("no model_type", "{\"hidden_size\":3}", "model_type");
    expect_cfg_error("unknown model_type", "{\"model_type\":\"llama\"}",
                     "llama");
    expect_cfg_error("missing field in text_config",
                     "{\"model_type\":\"qwen3_5\",\"text_config\":{"
                     "\"model_type\":\"qwen3_5_text\"," BASE35
                     ",\"linear_num_value_heads\":1}}",
                     "text_config.hidden_size");
    expect_cfg_error("string instead of int",
                     "{\"model_type\":\"qwen3_5_text\",\"hidden_size\":\"32\","
                     "\"linear_num_value_heads\":1," BASE35 "}",
                     "hidden_size");
    expect_cfg_error("Hv not a multiple of Hk",
                     "{\"model_type\":\"qwen3_5_text\",\"hidden_size\":32,"
                     "\"vocab_size\":100,\"num_hidden_layers\":2,"
                     "\"num_attention_heads\":2,\"num_key_value_heads\":1,"
                     "\"head_dim\":16,\"linear_num_key_heads\":2,"
                     "\"linear_num_value_heads\":3,"
                     "\"linear_key_head_dim\":8,\"linear_value_head_dim\":8,"
                     "\"intermediate_size\":8}",
                     "linear_num_value_heads");
    expect_cfg_error("layer_types of the wrong length",
                     "{\"model_type\":\"qwen3_5_text\",\"hidden_size\":32,"
                     "\"linear_num_value_heads\":1," BASE35
                     ",\"layer_types\":[\"full_attention\"]}",
                     "layer_types");
    expect_cfg_error("unknown layer type",
                     "{\"model_type\":\"qwen3_5_text\",\"hidden_size\":32,"
                     "\"linear_num_value_heads\":1," BASE35
                     ",\"layer_types\":[\"full_attention\",\"sliding\"]}",
                     "sliding");
    expect_cfg_error("scaled rope",
                     "{\"model_type\":\"qwen3_5_text\",\"hidden_size\":32,"
                     "\"linear_num_value_heads\":1," BASE35
                     ",\"rope_parameters\":{\"rope_type\":\"yarn\"}}",
                     "rope_type");
    expect_cfg_error("odd rotary dim",
                     "{\"model_type\":\"qwen3_5_text\",\"hidden_size\":32,"
                     "\"linear_num_value_heads\":1," BASE35
                     ",\"partial_rotary_factor\":0.1875}",
                     "partial_rotary_factor");
    expect_cfg_error("MoE without top-k",
                     "{\"model_type\":\"qwen3_5_moe_text\",\"hidden_size\":32,"
                     "\"linear_num_value_heads\":1," BASE35
                     ",\"num_experts\":4,\"moe_intermediate_size\":8,"
                     "\"shared_expert_intermediate_size\":8}",
                     "num_experts_per_tok");
    expect_cfg_error("eos of the wrong type",
                     "{\"model_type\":\"qwen3_5_text\",\"hidden_size\":32,"
                     "\"linear_num_value_heads\":1," BASE35
                     ",\"eos_token_id\":\"x\"}",
                     "eos_token_id");
    expect_cfg_error("too many layers",
                     "{\"model_type\":\"qwen3_5_text\",\"hidden_size\":32,"
                     "\"vocab_size\":100,\"num_hidden_layers\":300,"
                     "\"num_attention_heads\":2,\"num_key_value_heads\":1,"
                     "\"head_dim\":16,\"linear_num_key_heads\":1,"
                     "\"linear_num_value_heads\":1,"
                     "\"linear_key_head_dim\":8,\"linear_value_head_dim\":8,"
                     "\"intermediate_size\":8}",
                     "num_hidden_layers");

    hp_model_config_t c;
    hp_error_t err = {0};
    ok(hp_model_config_load(&c, "/nonexistent", &err) == HP_EMODEL &&
           strstr(err.msg, "/nonexistent/config.json"),
       "missing config.json: %s", err.msg);
}

/* ---- the committed models ---- */

typedef struct {
    const char *dir;
    hp_arch_t arch;
    const char *model_type;
    int H, L, Hq, Hkv, hd, rot, Hk, Hv, dk, dv, I, E, topk, Im, Is;
    int has_lm_head, n_eos, eos0, bos;
    /* 0: every tensor F32 and used in the mapping; 1: BF16, the matrices
     * used in the mapping as BF16, the vectors converted to f32; 2: F32,
     * the fused projections de-interleaved into the arena */
    int placement;
} expect_t;

static const expect_t MODELS[] = {
    {"qwen35-dense",
     HP_ARCH_QWEN3_5,
     "qwen3_5_text",
     64,
     4,
     4,
     2,
     32,
     8,
     2,
     4,
     16,
     16,
     128,
     0,
     0,
     0,
     0,
     0,
     2,
     498,
     -1,
     0},
    {"qwen35-moe",
     HP_ARCH_QWEN3_5_MOE,
     "qwen3_5_moe_text",
     64,
     4,
     4,
     2,
     32,
     8,
     2,
     4,
     16,
     16,
     0,
     8,
     2,
     32,
     32,
     1,
     1,
     496,
     -1,
     1},
    {"qwen3next",
     HP_ARCH_QWEN3_NEXT,
     "qwen3_next",
     32,
     8,
     4,
     2,
     16,
     4,
     2,
     4,
     16,
     8,
     0,
     8,
     2,
     16,
     32,
     1,
     1,
     498,
     496,
     2},
};

static int in_map(const hp_model_t *m, const void *p)
{
    for (int i = 0; i < m->n_files; i++) {
        const char *b = m->files[i].map;
        if ((const char *)p >= b && (const char *)p < b + m->files[i].map_size)
            return 1;
    }
    return 0;
}

/* The first rows of a weight matrix as f32 (malloc'd). */
static float *mat_f32(const hp_mat_t *w, int rows)
{
    float *d = malloc((size_t)rows * w->cols * sizeof(float));
    for (int r = 0; r < rows && w->data; r++)
        hk_weight_rows(d + (size_t)r * w->cols, w, &r, 1);
    return w->data ? d : (free(d), NULL);
}

static float *vec_f32(const float *v, size_t n)
{
    float *d = v ? malloc(n * sizeof(float)) : NULL;
    return d ? memcpy(d, v, n * sizeof(float)) : NULL;
}

/* The loaded view of a golden "weights.*" name as f32 (malloc'd), and its
 * element count. */
static float *resolve(const hp_model_t *m, const char *name, size_t *n)
{
    const hp_model_config_t *c = &m->cfg;
    const size_t H = (size_t)c->hidden;
    int li, e;
    char field[64];
    if (strcmp(name, "weights.lm_head.rows") == 0) {
        *n = 4 * H;
        return mat_f32(&m->lm_head, 4);
    }
    if (strcmp(name, "weights.final_norm") == 0) {
        *n = H;
        return vec_f32(m->final_norm, H);
    }
    if (sscanf(name, "weights.layers.%d.%63[A-Za-z_].%d", &li, field, &e) < 2 ||
        li < 0 || li >= c->n_layers)
        return NULL;
    const hp_layer_weights_t *w = &m->layers[li];
    const size_t Hv = (size_t)c->lin_v_heads, hd = (size_t)c->head_dim;
    const struct {
        const char *f;
        const hp_mat_t *w;
    } mats[] = {
        {"in_qkv", &w->in_qkv},     {"in_z", &w->in_z},
        {"in_b", &w->in_b},         {"in_a", &w->in_a},
        {"out_proj", &w->out_proj}, {"q_proj", &w->q_proj},
        {"gate", &w->gate},         {"down", &w->down},
        {"router", &w->router},     {"sh_down", &w->sh_down},
    };
    const struct {
        const char *f;
        const float *p;
        size_t n;
    } vecs[] = {
        {"conv_w", w->conv_w, (size_t)hp_cfg_conv_dim(c) * c->conv_kernel},
        {"A_log", w->A_log, Hv},
        {"dt_bias", w->dt_bias, Hv},
        {"gnorm", w->gnorm, (size_t)c->lin_v_dim},
        {"q_norm", w->q_norm, hd},
        {"k_norm", w->k_norm, hd},
        {"sh_expert_gate", w->sh_expert_gate, H},
    };
    for (size_t i = 0; i < sizeof(mats) / sizeof(mats[0]); i++) {
        if (strcmp(field, mats[i].f) == 0) {
            *n = (size_t)mats[i].w->rows * mats[i].w->cols;
            return mat_f32(mats[i].w, mats[i].w->rows);
        }
    }
    for (size_t i = 0; i < sizeof(vecs) / sizeof(vecs[0]); i++) {
        if (strcmp(field, vecs[i].f) == 0) {
            *n = vecs[i].n;
            return vec_f32(vecs[i].p, vecs[i].n);
        }
    }
    if (!w->exp_gate || e < 0 || e >= c->n_experts)
        return NULL;
    *n = (size_t)c->moe_intermediate * H;
    if (strcmp(field, "exp_gate") == 0)
        return mat_f32(&w->exp_gate[e], w->exp_gate[e].rows);
    if (strcmp(field, "exp_up") == 0)
        return mat_f32(&w->exp_up[e], w->exp_up[e].rows);
    if (strcmp(field, "exp_down") == 0)
        return mat_f32(&w->exp_down[e], w->exp_down[e].rows);
    return NULL;
}

static void check_shapes(const hp_model_t *m, const expect_t *x)
{
    const hp_model_config_t *c = &m->cfg;
    int good = 1;
    for (int i = 0; i < c->n_layers; i++) {
        const hp_layer_weights_t *w = &m->layers[i];
        good &= w->input_norm && w->post_norm;
        if (c->layer_kind[i] == HP_LAYER_LINEAR)
            good &= w->in_qkv.data && w->in_qkv.rows == hp_cfg_conv_dim(c) &&
                    w->in_z.rows == x->Hv * x->dv && w->in_b.rows == x->Hv &&
                    w->in_a.rows == x->Hv && w->in_a.cols == x->H &&
                    w->conv_w && w->A_log && w->dt_bias && w->gnorm &&
                    w->out_proj.rows == x->H &&
                    w->out_proj.cols == x->Hv * x->dv && !w->q_proj.data;
        else
            good &= w->q_proj.rows == 2 * x->Hq * x->hd &&
                    w->k_proj.rows == x->Hkv * x->hd && w->v_proj.data &&
                    w->o_proj.cols == x->Hq * x->hd && w->q_norm && w->k_norm &&
                    !w->in_qkv.data;
        if (c->layer_moe[i]) {
            good &= w->router.rows == x->E && w->exp_gate && !w->gate.data;
            for (int e = 0; good && e < x->E; e++)
                good &= w->exp_gate[e].data && w->exp_gate[e].rows == x->Im &&
                        w->exp_up[e].data && w->exp_up[e].cols == x->H &&
                        w->exp_down[e].rows == x->H &&
                        w->exp_down[e].cols == x->Im;
            good &= (x->Is == 0) == (w->sh_gate.data == NULL);
            good &= x->Is == 0 || (w->sh_down.cols == x->Is &&
                                   w->sh_expert_gate && w->sh_up.data);
        } else {
            good &= w->gate.rows == x->I && w->up.data &&
                    w->down.cols == x->I && !w->exp_gate;
        }
    }
    ok(good, "%s: every layer has its weights with the right dims", x->dir);
}

/* The MTP head the config declares is the one the file holds (converters
 * such as llama.cpp's look for its layer's tensors): mtp_num_hidden_layers
 * (top level or text_config; Qwen3-Next's config has no such key) layers
 * mtp.layers.N, with mtp.fc when there are any. */
static void check_mtp(const hp_model_t *m, const char *dir, const char *name)
{
    char path[1300];
    size_t n;
    snprintf(path, sizeof(path), "%s/config.json", dir);
    char *txt = read_file(path, &n);
    cJSON *root = txt ? cJSON_ParseWithLength(txt, n) : NULL;
    const cJSON *tc = cJSON_GetObjectItemCaseSensitive(root, "text_config");
    const cJSON *k = cJSON_GetObjectItemCaseSensitive(tc ? tc : root,
                                                      "mtp_num_hidden_layers");
    int declared = cJSON_IsNumber(k) ? k->valueint : -1, layers = 0, fc = 0;
    for (int f = 0; f < m->n_files; f++)
        for (int i = 0; i < m->files[f].n_tensors; i++) {
            const char *t = m->files[f].tensors[i].name;
            int l;
            if (sscanf(t, "mtp.layers.%d.", &l) == 1 && l + 1 > layers)
                layers = l + 1;
            fc |= strcmp(t, "mtp.fc.weight") == 0;
        }
    ok(root && (declared < 0 || (layers == declared && fc == (declared > 0))),
       "%s: mtp_num_hidden_layers %d (-1: not declared), the file holds %d MTP "
       "layers%s",
       name, declared, layers, fc ? " and mtp.fc" : "");
    cJSON_Delete(root);
    free(txt);
}

static void test_model(const expect_t *x)
{
    char dir[1200], path[1300];
    model_path(dir, sizeof(dir), x->dir);
    hp_model_t m;
    hp_error_t err = {0};
    int rc = hp_model_load(&m, dir, &err);
    if (!ok(rc == HP_OK, "%s: loads (%s)", x->dir, err.msg))
        return;
    const hp_model_config_t *c = &m.cfg;
    ok(c->arch == x->arch && strcmp(c->model_type, x->model_type) == 0 &&
           c->vocab_size == 512 && c->hidden == x->H && c->n_layers == x->L,
       "%s: arch %s, vocab 512, H %d, L %d", x->dir, c->model_type, c->hidden,
       c->n_layers);
    ok(c->n_heads == x->Hq && c->n_kv_heads == x->Hkv && c->head_dim == x->hd &&
           c->rotary_dim == x->rot && c->rope_theta == 1e7 &&
           c->rms_eps == 1e-6f,
       "%s: attention Hq %d Hkv %d hd %d rotary %d theta 1e7", x->dir,
       c->n_heads, c->n_kv_heads, c->head_dim, c->rotary_dim);
    ok(c->lin_k_heads == x->Hk && c->lin_v_heads == x->Hv &&
           c->lin_k_dim == x->dk && c->lin_v_dim == x->dv &&
           c->conv_kernel == 4,
       "%s: GDN Hk %d Hv %d dk %d dv %d Kc 4", x->dir, c->lin_k_heads,
       c->lin_v_heads, c->lin_k_dim, c->lin_v_dim);
    ok(c->intermediate == x->I && c->n_experts == x->E &&
           c->n_experts_per_tok == x->topk && c->moe_intermediate == x->Im &&
           c->shared_intermediate == x->Is && c->norm_topk_prob == 1,
       "%s: MLP I %d, E %d top-%d Im %d Is %d", x->dir, c->intermediate,
       c->n_experts, c->n_experts_per_tok, c->moe_intermediate,
       c->shared_intermediate);
    int sched = 1;
    for (int i = 0; i < c->n_layers; i++)
        sched &= c->layer_kind[i] ==
                     ((i + 1) % 4 ? HP_LAYER_LINEAR : HP_LAYER_FULL) &&
                 c->layer_moe[i] == (x->E > 0);
    ok(sched, "%s: layers 3, 7, ... full attention; MoE on every layer: %d",
       x->dir, x->E > 0);
    ok(c->n_eos == x->n_eos && c->eos_ids[0] == x->eos0 && c->bos_id == x->bos,
       "%s: eos %d (of %d), bos %d", x->dir, c->eos_ids[0], c->n_eos,
       c->bos_id);
    ok((m.lm_head.data == m.embed.data) == !x->has_lm_head &&
           m.lm_head.rows == 512,
       "%s: lm_head %s", x->dir, x->has_lm_head ? "own" : "tied to embed");
    check_shapes(&m, x);
    const hp_layer_weights_t *l0 = &m.layers[0], *l3 = &m.layers[3];
    if (x->placement == 0)
        ok(m.arena_bytes == 0 && m.embed.dtype == HK_W_F32 &&
               in_map(&m, m.embed.data) && in_map(&m, l3->q_proj.data),
           "%s: f32 weights used in place (no arena)", x->dir);
    else if (x->placement == 1)
        ok(m.arena_bytes > 0 && m.embed.dtype == HK_W_BF16 &&
               l0->in_qkv.dtype == HK_W_BF16 &&
               m.layers[1].exp_down[7].dtype == HK_W_BF16 &&
               in_map(&m, m.embed.data) && in_map(&m, l0->in_qkv.data) &&
               in_map(&m, m.layers[1].exp_down[7].data) &&
               !in_map(&m, l0->A_log),
           "%s: bf16 matrices used in place as bf16, vectors converted "
           "(%zu bytes)",
           x->dir, m.arena_bytes);
    else
        ok(m.arena_bytes > 0 && l0->in_qkv.dtype == HK_W_F32 &&
               !in_map(&m, l0->in_qkv.data) && in_map(&m, l3->q_proj.data),
           "%s: de-interleaved weights in the arena (%zu bytes)", x->dir,
           m.arena_bytes);

    check_mtp(&m, dir, x->dir);

    /* fingerprint: one-shot XXH3-128 over the concatenation */
    size_t n1, n2;
    snprintf(path, sizeof(path), "%s/config.json", dir);
    char *a = read_file(path, &n1);
    snprintf(path, sizeof(path), "%s/tokenizer.json", dir);
    char *b = read_file(path, &n2);
    char *cat = malloc(n1 + n2);
    memcpy(cat, a, n1);
    memcpy(cat + n1, b, n2);
    XXH128_hash_t h = XXH3_128bits(cat, n1 + n2);
    uint8_t want[16];
    for (int i = 0; i < 8; i++) {
        want[i] = (uint8_t)(h.high64 >> (56 - 8 * i));
        want[8 + i] = (uint8_t)(h.low64 >> (56 - 8 * i));
    }
    ok(memcmp(want, m.fingerprint, 16) == 0,
       "%s: fingerprint = XXH3-128(config.json ++ tokenizer.json), "
       "big-endian %016llx%016llx",
       x->dir, (unsigned long long)h.high64, (unsigned long long)h.low64);
    free(a);
    free(b);
    free(cat);

    /* weights as transformers read them back (golden weights.*) */
    hp_st_file_t g;
    snprintf(path, sizeof(path), "%s/golden.safetensors", dir);
    if (!ok(hp_st_open(&g, path, &err) == HP_OK, "%s: golden opens (%s)",
            x->dir, err.msg)) {
        hp_model_free(&m);
        return;
    }
    int n_checked = 0, n_bad = 0;
    for (int i = 0; i < g.n_tensors; i++) {
        const hp_st_tensor_t *t = &g.tensors[i];
        if (strncmp(t->name, "weights.", 8) != 0)
            continue;
        size_t n = 0;
        float *got = resolve(&m, t->name, &n);
        size_t cnt = t->nbytes / 4;
        if (!got || n < cnt || t->dtype != HP_DT_F32) {
            tap_diag("%s: cannot match %s", x->dir, t->name);
            n_bad++;
            free(got);
            continue;
        }
        float *ref = malloc(t->nbytes);
        hp_st_to_f32(ref, t->data, t->dtype, cnt);
        if (memcmp(ref, got, t->nbytes) != 0) {
            tap_diag("%s: %s differs from transformers' weight", x->dir,
                     t->name);
            n_bad++;
        }
        free(ref);
        free(got);
        n_checked++;
    }
    ok(n_checked >= 10 && n_bad == 0,
       "%s: %d weights bit-equal to transformers' (%d differ)", x->dir,
       n_checked, n_bad);
    /* the goldens belong to this config */
    const hp_st_tensor_t *ids = hp_st_find(&g, "prompt.3.ids");
    const hp_st_tensor_t *lg = hp_st_find(&g, "prompt.3.logits");
    ok(ids && lg && ids->dtype == HP_DT_I32 && lg->ndim == 2 &&
           lg->shape[0] == ids->shape[0] && lg->shape[1] == c->vocab_size &&
           ids->shape[0] > 128,
       "%s: golden prompt 3 has %lld ids and [T, vocab] logits", x->dir,
       ids ? (long long)ids->shape[0] : -1LL);
    hp_st_close(&g);
    hp_model_free(&m);
    ok(m.files == NULL && m.arena == NULL && m.layers == NULL, "%s: freed",
       x->dir);
}

/* ---- sharded loading ---- */

static int keep_even(const char *name, void *ctx)
{
    (void)name;
    int *k = ctx;
    return (*k)++ % 2 == 0;
}
static int keep_odd(const char *name, void *ctx)
{
    (void)name;
    int *k = ctx;
    return (*k)++ % 2 == 1;
}

/* Writes an index mapping every tensor of src to shard 1 or 2, alternating
 * in file order (the order keep_even/keep_odd see). */
static void write_index(const char *dir, const char *src, int lie)
{
    hp_st_file_t f;
    hp_error_t err;
    if (hp_st_open(&f, src, &err) != HP_OK) {
        fprintf(stderr, "%s\n", err.msg);
        exit(2);
    }
    cJSON *root = cJSON_CreateObject();
    cJSON_AddObjectToObject(root, "metadata");
    cJSON *wm = cJSON_AddObjectToObject(root, "weight_map");
    for (int i = 0; i < f.n_tensors; i++) {
        int shard = i % 2 ? 2 : 1;
        if (lie && strcmp(f.tensors[i].name, "model.norm.weight") == 0)
            shard = 3 - shard;
        cJSON_AddStringToObject(wm, f.tensors[i].name,
                                shard == 1
                                    ? "model-00001-of-00002.safetensors"
                                    : "model-00002-of-00002.safetensors");
    }
    char *txt = cJSON_Print(root);
    char p[1300];
    snprintf(p, sizeof(p), "%s/model.safetensors.index.json", dir);
    write_file(p, txt, strlen(txt));
    free(txt);
    cJSON_Delete(root);
    hp_st_close(&f);
}

static int same_mat(hp_mat_t a, hp_mat_t b)
{
    if (a.rows != b.rows || a.cols != b.cols || a.dtype != b.dtype ||
        !a.data != !b.data)
        return 0;
    return !a.data ||
           memcmp(a.data, b.data,
                  (size_t)a.rows * a.cols * hk_wtype_size(a.dtype)) == 0;
}

static int same_vec(const float *a, const float *b, size_t n)
{
    return (!a && !b) || (a && b && memcmp(a, b, n * sizeof(float)) == 0);
}

static void test_sharded(void)
{
    char src_dir[1200], src[1300], dir[1200], p1[1300], p2[1300];
    model_path(src_dir, sizeof(src_dir), "qwen3next");
    snprintf(src, sizeof(src), "%s/model.safetensors", src_dir);
    make_copy(dir, sizeof(dir), "sharded", "qwen3next", 0);
    snprintf(p1, sizeof(p1), "%s/model-00001-of-00002.safetensors", dir);
    snprintf(p2, sizeof(p2), "%s/model-00002-of-00002.safetensors", dir);
    int k = 0;
    rewrite(src, p1, keep_even, &k, NULL, 0, 0);
    k = 0;
    rewrite(src, p2, keep_odd, &k, NULL, 0, 0);
    write_index(dir, src, 0);

    hp_model_t a, b;
    hp_error_t err = {0};
    int rc1 = hp_model_load(&a, src_dir, &err);
    int rc2 = hp_model_load(&b, dir, &err);
    ok(rc1 == HP_OK && rc2 == HP_OK && b.n_files == 2,
       "qwen3next from two shards + index loads (%s)", err.msg);
    if (rc1 == HP_OK && rc2 == HP_OK) {
        const hp_model_config_t *c = &a.cfg;
        int same = memcmp(a.fingerprint, b.fingerprint, 16) == 0 &&
                   same_mat(a.lm_head, b.lm_head) && same_mat(a.embed, b.embed);
        for (int i = 0; i < c->n_layers; i++) {
            const hp_layer_weights_t *x = &a.layers[i], *y = &b.layers[i];
            same &=
                same_mat(x->in_qkv, y->in_qkv) && same_mat(x->in_z, y->in_z) &&
                same_mat(x->in_b, y->in_b) && same_mat(x->in_a, y->in_a) &&
                same_mat(x->q_proj, y->q_proj) &&
                same_mat(x->router, y->router) &&
                same_mat(x->sh_down, y->sh_down) &&
                same_vec(x->conv_w, y->conv_w, (size_t)hp_cfg_conv_dim(c) * 4);
            for (int e = 0; e < c->n_experts; e++)
                same &= same_mat(x->exp_gate[e], y->exp_gate[e]) &&
                        same_mat(x->exp_up[e], y->exp_up[e]) &&
                        same_mat(x->exp_down[e], y->exp_down[e]);
        }
        ok(same, "sharded load equals the single-file load");
    }
    if (rc1 == HP_OK)
        hp_model_free(&a);
    if (rc2 == HP_OK)
        hp_model_free(&b);

    /* the index lies about one tensor's shard */
    write_index(dir, src, 1);
    rc1 = hp_model_load(&a, dir, &err);
    ok(rc1 == HP_EMODEL && strstr(err.msg, "model.norm.weight") &&
           strstr(err.msg, "index"),
       "index naming the wrong shard: %s", err.msg);

    /* a listed shard is missing */
    write_index(dir, src, 0);
    unlink(p2);
    rc1 = hp_model_load(&a, dir, &err);
    ok(rc1 == HP_EMODEL &&
           strstr(err.msg, "model-00002-of-00002.safetensors") &&
           a.files == NULL,
       "index pointing to a missing shard: %s", err.msg);

    /* broken index JSON */
    snprintf(p2, sizeof(p2), "%s/model.safetensors.index.json", dir);
    write_file(p2, "{\"weight_map\": {", 16);
    rc1 = hp_model_load(&a, dir, &err);
    ok(rc1 == HP_EMODEL && strstr(err.msg, "index.json"),
       "index that is not JSON: %s", err.msg);
    remove_dir(dir);
}

/* ---- broken copies ---- */

typedef struct {
    const char *drop;
} drop_ctx_t;

static int keep_all_but(const char *name, void *ctx)
{
    return strcmp(name, ((drop_ctx_t *)ctx)->drop) != 0;
}

static void expect_load_error(const char *what, const char *dir, const char *n1,
                              const char *n2)
{
    hp_model_t m;
    hp_error_t err = {0};
    int rc = hp_model_load(&m, dir, &err);
    ok(rc == HP_EMODEL && strstr(err.msg, n1) && (!n2 || strstr(err.msg, n2)) &&
           m.files == NULL && m.layers == NULL,
       "%s: %s", what, err.msg);
    if (rc == HP_OK)
        hp_model_free(&m);
}

/* Replaces the first `from` after `after` (NULL: the start) in FILE by
 * `to`, of the same length. */
static void patch_file(const char *path, const char *after, const char *from,
                       const char *to)
{
    size_t n;
    char *buf = read_file(path, &n);
    char *a = after ? memmem(buf, n, after, strlen(after)) : buf;
    char *d = a ? memmem(a, n - (size_t)(a - buf), from, strlen(from)) : NULL;
    if (d && strlen(to) == strlen(from))
        memcpy(d, to, strlen(to));
    else
        tap_diag("cannot patch %s in %s", from, path);
    write_file(path, buf, n);
    free(buf);
}

/* Broken int8 checkpoints: what is I8 needs its scales and the config. */
static void test_broken_int8(void)
{
    char dir[1200], p[1300], c[1300];
    const char *sc = "model.embed_tokens.weight_scale";
    make_copy(dir, sizeof(dir), "q8", "qwen35-dense-int8", 1);
    snprintf(p, sizeof(p), "%s/model.safetensors", dir);
    snprintf(c, sizeof(c), "%s/config.json", dir);
    patch_file(p, NULL, sc, "model.embed_tokens.weight_scalX");
    expect_load_error("an I8 matrix without its scales", dir,
                      "missing tensor model.embed_tokens.weight_scale", NULL);
    patch_file(p, NULL, "model.embed_tokens.weight_scalX", sc);
    patch_file(p, sc, "[512,2]", "[256,4]");
    expect_load_error("scales of the wrong shape", dir,
                      "model.embed_tokens.weight_scale (F32 [256, 4]) does "
                      "not scale model.embed_tokens.weight [512, 64]",
                      NULL);
    patch_file(p, sc, "[256,4]", "[512,2]");
    patch_file(c, NULL, "quantization_config", "quantization_confiX");
    expect_load_error("I8 weights without quantization_config", dir,
                      "is I8 but config.json has no quantization_config", NULL);
    remove_dir(dir);
}

static void test_broken(void)
{
    char src_dir[1200], src[1300], dir[1200], p[1300];
    model_path(src_dir, sizeof(src_dir), "qwen35-dense");
    snprintf(src, sizeof(src), "%s/model.safetensors", src_dir);

    make_copy(dir, sizeof(dir), "trunc", "qwen35-dense", 1);
    snprintf(p, sizeof(p), "%s/model.safetensors", dir);
    struct stat st;
    if (stat(p, &st) != 0 || truncate(p, st.st_size - 1000) != 0)
        tap_diag("cannot truncate %s", p);
    expect_load_error("truncated model.safetensors", dir, "model.safetensors",
                      "truncated");
    remove_dir(dir);

    make_copy(dir, sizeof(dir), "drop", "qwen35-dense", 0);
    snprintf(p, sizeof(p), "%s/model.safetensors", dir);
    drop_ctx_t dc = {"model.layers.2.linear_attn.in_proj_z.weight"};
    rewrite(src, p, keep_all_but, &dc, NULL, 0, 0);
    expect_load_error("a dropped tensor", dir,
                      "missing tensor model.layers.2.linear_attn.in_proj_z."
                      "weight",
                      "model.safetensors");
    remove_dir(dir);

    make_copy(dir, sizeof(dir), "shape", "qwen35-dense", 0);
    snprintf(p, sizeof(p), "%s/model.safetensors", dir);
    rewrite(src, p, NULL, NULL, "model.layers.3.self_attn.k_proj.weight", 32,
            128);
    expect_load_error("a wrong shape", dir,
                      "model.layers.3.self_attn.k_proj.weight has shape "
                      "[32, 128], expected [64, 64]",
                      "model.safetensors");
    remove_dir(dir);

    make_copy(dir, sizeof(dir), "json", "qwen35-dense", 1);
    snprintf(p, sizeof(p), "%s/config.json", dir);
    write_file(p, "{\"model_type\": \"qwen3_5_text\",", 31);
    expect_load_error("bad JSON in config.json", dir, "config.json", "JSON");
    remove_dir(dir);

    make_copy(dir, sizeof(dir), "field", "qwen35-dense", 1);
    snprintf(p, sizeof(p), "%s/config.json", dir);
    write_file(p, "{\"model_type\": \"qwen3_5_text\"}", 30);
    expect_load_error("config.json without sizes", dir, "config.json",
                      "vocab_size");
    remove_dir(dir);

    make_copy(dir, sizeof(dir), "dtype", "qwen35-dense", 1);
    snprintf(p, sizeof(p), "%s/model.safetensors", dir);
    size_t n;
    char *buf = read_file(p, &n);
    char *d = memmem(buf, n, "\"F32\"", 5);
    if (d)
        memcpy(d, "\"F31\"", 5);
    write_file(p, buf, n);
    free(buf);
    expect_load_error("an unknown dtype string", dir, "model.safetensors",
                      "\"F31\"");
    remove_dir(dir);

    make_copy(dir, sizeof(dir), "notok", "qwen35-dense", 1);
    snprintf(p, sizeof(p), "%s/tokenizer.json", dir);
    unlink(p);
    expect_load_error("no tokenizer.json", dir, "tokenizer.json", NULL);
    remove_dir(dir);

    make_copy(dir, sizeof(dir), "noweights", "qwen35-dense", 0);
    expect_load_error("no weights", dir, "model.safetensors", NULL);
    remove_dir(dir);

    /* Qwen3-Next: a per-expert tensor and the fused projection */
    model_path(src_dir, sizeof(src_dir), "qwen3next");
    snprintf(src, sizeof(src), "%s/model.safetensors", src_dir);
    make_copy(dir, sizeof(dir), "expert", "qwen3next", 0);
    snprintf(p, sizeof(p), "%s/model.safetensors", dir);
    dc.drop = "model.layers.5.mlp.experts.7.down_proj.weight";
    rewrite(src, p, keep_all_but, &dc, NULL, 0, 0);
    expect_load_error("a dropped expert", dir,
                      "model.layers.5.mlp.experts.7.down_proj.weight", NULL);
    rewrite(src, p, NULL, NULL,
            "model.layers.4.linear_attn.in_proj_qkvz.weight", 32, 128);
    expect_load_error("a wrong fused shape", dir,
                      "model.layers.4.linear_attn.in_proj_qkvz.weight has "
                      "shape [32, 128], expected [128, 32]",
                      NULL);
    dc.drop = "model.layers.1.linear_attn.in_proj_ba.weight";
    rewrite(src, p, keep_all_but, &dc, NULL, 0, 0);
    expect_load_error("a dropped in_proj_ba", dir,
                      "missing tensor model.layers.1.linear_attn.in_proj_ba",
                      NULL);
    remove_dir(dir);
}

int main(void)
{
    const char *r = getenv("HYPIC_ROOT");
    if (r && *r)
        snprintf(repo_root, sizeof(repo_root), "%s", r);
    snprintf(tmpdir, sizeof(tmpdir), "/tmp/hp_model_test_XXXXXX");
    if (!mkdtemp(tmpdir)) {
        perror("mkdtemp");
        return 2;
    }
    test_config_flavours();
    test_config_errors();
    for (size_t i = 0; i < sizeof(MODELS) / sizeof(MODELS[0]); i++)
        test_model(&MODELS[i]);
    test_sharded();
    test_broken();
    test_broken_int8();
    rmdir(tmpdir);
    return tap_done();
}
