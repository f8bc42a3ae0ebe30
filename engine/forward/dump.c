/* dump.c - states and logits to safetensors (see dump.h). */
#include "engine/forward/dump.h"

#include <stdio.h>
#include <stdlib.h>

#include "engine/model/safetensors.h"

int hp_dump_state(const char *path, const hp_seq_t *seq, hp_error_t *err)
{
    const hp_model_config_t *c = &seq->model->cfg;
    int n = 0, rc;
    hp_st_out_t *t = calloc((size_t)2 * c->n_layers, sizeof(*t));
    char(*names)[64] = calloc((size_t)2 * c->n_layers, sizeof(*names));
    if (!t || !names) {
        free(t);
        free(names);
        return hp_error_set(err, HP_ENOMEM, "state dump: out of memory");
    }
    for (int l = 0; l < c->n_layers; l++) {
        const hp_seq_layer_t *sl = &seq->layers[l];
        if (c->layer_kind[l] == HP_LAYER_LINEAR) {
            snprintf(names[n], 64, "layers.%d.linear_attn.state", l);
            t[n] = (hp_st_out_t){names[n],
                                 3,
                                 {c->lin_v_heads, c->lin_k_dim, c->lin_v_dim},
                                 sl->S};
            n++;
            snprintf(names[n], 64, "layers.%d.linear_attn.conv_state", l);
            t[n] = (hp_st_out_t){names[n],
                                 2,
                                 {hp_cfg_conv_dim(c), c->conv_kernel - 1},
                                 sl->conv};
            n++;
        } else {
            snprintf(names[n], 64, "layers.%d.self_attn.k", l);
            t[n] = (hp_st_out_t){
                names[n], 3, {seq->n_pos, c->n_kv_heads, c->head_dim}, sl->k};
            n++;
            snprintf(names[n], 64, "layers.%d.self_attn.v", l);
            t[n] = (hp_st_out_t){
                names[n], 3, {seq->n_pos, c->n_kv_heads, c->head_dim}, sl->v};
            n++;
        }
    }
    rc = hp_st_write_f32(path, t, n, err);
    free(t);
    free(names);
    return rc;
}

int hp_dump_logits(const char *path, const float *logits, int rows, int vocab,
                   int keep_rows, hp_error_t *err)
{
    hp_st_out_t t = {"logits", 1, {vocab}, logits};
    if (rows != 1 || keep_rows)
        t = (hp_st_out_t){"logits", 2, {rows, vocab}, logits};
    return hp_st_write_f32(path, &t, 1, err);
}
