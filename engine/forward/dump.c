/* dump.c - states and logits to safetensors (see dump.h). */
#include "engine/forward/dump.h"

#include <stdio.h>
#include <stdlib.h>

#include "engine/model/safetensors.h"

int hp_dump_state(const char *path, const hp_seq_t *seq, hp_error_t *err)
{
    const hp_model_config_t *c = &seq->model->cfg;
    int n = 0, rc;
    /* backend memory the host cannot read comes over first */
    int copy = !hp_backend_host_memory(seq->be);
    hp_st_out_t *t = calloc((size_t)2 * c->n_layers, sizeof(*t));
    char(*names)[64] = calloc((size_t)2 * c->n_layers, sizeof(*names));
    hp_seq_layer_t *host = calloc((size_t)c->n_layers, sizeof(*host));
    float *buf = copy ? malloc(hp_seq_bytes(seq->model, seq->n_pos)) : NULL;
    if (!t || !names || !host || (copy && !buf)) {
        free(t);
        free(names);
        free(host);
        free(buf);
        return hp_error_set(err, HP_ENOMEM, "state dump: out of memory");
    }
    size_t at = 0;
    for (int l = 0; l < c->n_layers; l++) {
        hp_seq_layer_t *sl = &host[l];
        *sl = seq->layers[l];
        if (copy && c->layer_kind[l] == HP_LAYER_LINEAR) {
            sl->S = buf + at;
            sl->conv = sl->S + c->state_floats;
            hp_seq_state_pack(seq, l, sl->S, HP_MEM_HOST);
            at += c->state_floats + c->conv_floats;
        } else if (copy) {
            sl->k = buf + at;
            sl->v = sl->k + (size_t)seq->n_pos * c->kv_row;
            hp_seq_kv_pack(seq, l, 0, seq->n_pos, sl->k, sl->v, HP_MEM_HOST);
            at += 2 * (size_t)seq->n_pos * c->kv_row;
        }
    }
    for (int l = 0; l < c->n_layers; l++) {
        const hp_seq_layer_t *sl = &host[l];
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
    free(host);
    free(buf);
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
