/*
 * model.c - loads a hybrid checkpoint directory (config.json, safetensors
 * shards, tokenizer.json for the fingerprint) into hp_model_t weight views.
 * Does not tokenize or compute; it only maps, validates and converts.
 */
#include "engine/model/model.h"

#include <cJSON.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <xxhash.h>

/* bytes: every arena tensor starts 64-byte aligned */
#define ARENA_ALIGN  64
#define NAME_MAX_LEN 256

/*
 * The loader walks the whole model twice with the same calls: pass 0 finds
 * and checks every tensor and sizes the arena, pass 1 assigns views and
 * converts. Pass 1 makes the same zero-copy decisions, so offsets agree.
 */
typedef struct {
    hp_model_t *m;
    hp_error_t *err;
    int pass;
    size_t arena_used;     /* bytes */
    const char *prefix;    /* "model." or "model.language_model." */
    char missing_in[1200]; /* the file a missing tensor is reported against */
} loader_t;

/* ---- files ---- */

/* Reads a whole file into a NUL-terminated buffer. */
static int slurp(const char *path, char **out, size_t *len, hp_error_t *err)
{
    FILE *fp = fopen(path, "rb");
    if (!fp)
        return hp_error_set(err, HP_EMODEL, "%s: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fileno(fp), &st) != 0 || !S_ISREG(st.st_mode)) {
        fclose(fp);
        return hp_error_set(err, HP_EMODEL, "%s: not a regular file", path);
    }
    char *buf = malloc((size_t)st.st_size + 1);
    if (!buf) {
        fclose(fp);
        return hp_error_set(err, HP_ENOMEM, "%s: out of memory", path);
    }
    size_t got = fread(buf, 1, (size_t)st.st_size, fp);
    int bad = ferror(fp) || got != (size_t)st.st_size;
    fclose(fp);
    if (bad) {
        free(buf);
        return hp_error_set(err, HP_EIO, "%s: read error", path);
    }
    buf[got] = '\0';
    *out = buf;
    *len = got;
    return HP_OK;
}

static int file_exists(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

static int open_shard(hp_model_t *m, const char *name, const char *listed_in,
                      hp_error_t *err)
{
    char path[1200];
    snprintf(path, sizeof(path), "%s/%s", m->dir, name);
    if (listed_in && !file_exists(path))
        return hp_error_set(err, HP_EMODEL,
                            "%s: shard %s listed in %s is missing", path, name,
                            listed_in);
    hp_st_file_t *nf =
        realloc(m->files, (size_t)(m->n_files + 1) * sizeof(*m->files));
    if (!nf)
        return hp_error_set(err, HP_ENOMEM, "%s: out of memory", path);
    m->files = nf;
    int rc = hp_st_open(&m->files[m->n_files], path, err);
    if (rc == HP_OK)
        m->n_files++;
    return rc;
}

/* Opens the shards named in model.safetensors.index.json ("weight_map"). */
static int open_index(hp_model_t *m, const char *ipath, hp_error_t *err)
{
    char *txt;
    size_t len;
    int rc = slurp(ipath, &txt, &len, err);
    if (rc != HP_OK)
        return rc;
    cJSON *root = cJSON_ParseWithLength(txt, len);
    free(txt);
    const cJSON *wm = cJSON_GetObjectItemCaseSensitive(root, "weight_map");
    if (!root || !cJSON_IsObject(wm)) {
        cJSON_Delete(root);
        return hp_error_set(err, HP_EMODEL,
                            "%s: not valid JSON with a \"weight_map\" object",
                            ipath);
    }
    const cJSON *e;
    cJSON_ArrayForEach(e, wm)
    {
        if (!cJSON_IsString(e) || strchr(e->valuestring, '/') ||
            e->valuestring[0] == '\0' || e->valuestring[0] == '.') {
            rc = hp_error_set(err, HP_EMODEL,
                              "%s: weight_map entry %s must name a shard "
                              "file in the model directory",
                              ipath, e->string);
            break;
        }
        int seen = 0;
        for (int i = 0; i < m->n_files && !seen; i++) {
            const char *base = strrchr(m->files[i].path, '/');
            seen =
                strcmp(base ? base + 1 : m->files[i].path, e->valuestring) == 0;
        }
        if (!seen &&
            (rc = open_shard(m, e->valuestring, "model.safetensors.index.json",
                             err)) != HP_OK)
            break;
        /* the map must tell the truth about where each tensor lives */
        for (int i = 0; i < m->n_files; i++) {
            const char *base = strrchr(m->files[i].path, '/');
            if (strcmp(base ? base + 1 : m->files[i].path, e->valuestring))
                continue;
            if (!hp_st_find(&m->files[i], e->string))
                rc = hp_error_set(err, HP_EMODEL,
                                  "%s: tensor %s is listed in %s but "
                                  "missing from %s",
                                  m->files[i].path, e->string, ipath,
                                  e->valuestring);
        }
        if (rc != HP_OK)
            break;
    }
    if (rc == HP_OK && m->n_files == 0)
        rc = hp_error_set(err, HP_EMODEL, "%s: weight_map is empty", ipath);
    cJSON_Delete(root);
    return rc;
}

static int open_files(hp_model_t *m, loader_t *ld, hp_error_t *err)
{
    char single[1200], index[1200];
    snprintf(single, sizeof(single), "%s/model.safetensors", m->dir);
    snprintf(index, sizeof(index), "%s/model.safetensors.index.json", m->dir);
    if (file_exists(single)) {
        snprintf(ld->missing_in, sizeof(ld->missing_in), "%s", single);
        return open_shard(m, "model.safetensors", NULL, err);
    }
    if (file_exists(index)) {
        snprintf(ld->missing_in, sizeof(ld->missing_in), "%s", index);
        return open_index(m, index, err);
    }
    return hp_error_set(err, HP_EMODEL,
                        "%s: neither model.safetensors nor "
                        "model.safetensors.index.json found",
                        m->dir);
}

/* ---- tensor lookup ---- */

static const hp_st_tensor_t *find_any(const hp_model_t *m, const char *name,
                                      const hp_st_file_t **in)
{
    for (int i = 0; i < m->n_files; i++) {
        const hp_st_tensor_t *t = hp_st_find(&m->files[i], name);
        if (t) {
            *in = &m->files[i];
            return t;
        }
    }
    return NULL;
}

static void fmt_shape(char *buf, size_t n, int ndim, const int64_t *shape)
{
    size_t off = (size_t)snprintf(buf, n, "[");
    for (int d = 0; d < ndim && off < n; d++)
        off += (size_t)snprintf(buf + off, n - off, "%s%lld", d ? ", " : "",
                                (long long)shape[d]);
    if (off < n)
        snprintf(buf + off, n - off, "]");
}

static void *arena_take(loader_t *ld, size_t bytes)
{
    size_t off = ld->arena_used;
    ld->arena_used += (bytes + ARENA_ALIGN - 1) / ARENA_ALIGN * ARENA_ALIGN;
    return ld->pass == 1 ? ld->m->arena + off : NULL;
}

/* dtype conversion, split across threads for big tensors */
static void convert(float *dst, const void *src, hp_dtype_t dt, size_t n)
{
    const size_t blk = (size_t)1 << 16;
    if (n < 4 * blk) {
        hp_st_to_f32(dst, src, dt, n);
        return;
    }
    size_t nb = (n + blk - 1) / blk, esz = hp_dtype_size(dt);
#pragma omp parallel for schedule(static)
    for (size_t b = 0; b < nb; b++) {
        size_t s = b * blk, e = s + blk < n ? s + blk : n;
        hp_st_to_f32(dst + s, (const char *)src + s * esz, dt, e - s);
    }
}

/*
 * Finds prefix+name and checks its shape. Returns the tensor or NULL with
 * *rc set (HP_EMODEL naming the file and tensor). optional: absence is not
 * an error (returns NULL with *rc = HP_OK).
 */
static const hp_st_tensor_t *lookup(loader_t *ld, const char *prefix,
                                    const char *rel, int ndim,
                                    const int64_t *shape, int optional, int *rc)
{
    char name[NAME_MAX_LEN];
    const hp_st_file_t *in = NULL;
    snprintf(name, sizeof(name), "%s%s", prefix, rel);
    const hp_st_tensor_t *t = find_any(ld->m, name, &in);
    *rc = HP_OK;
    if (!t) {
        if (!optional)
            *rc = hp_error_set(ld->err, HP_EMODEL, "%s: missing tensor %s",
                               ld->missing_in, name);
        return NULL;
    }
    int same = t->ndim == ndim;
    for (int d = 0; same && d < ndim; d++)
        same = t->shape[d] == shape[d];
    if (!same) {
        char want[96], got[96];
        fmt_shape(want, sizeof(want), ndim, shape);
        fmt_shape(got, sizeof(got), t->ndim, t->shape);
        *rc = hp_error_set(ld->err, HP_EMODEL,
                           "%s: tensor %s has shape %s, expected %s", in->path,
                           name, got, want);
        return NULL;
    }
    return t;
}

static size_t n_elems(int ndim, const int64_t *shape)
{
    size_t n = 1;
    for (int d = 0; d < ndim; d++)
        n *= (size_t)shape[d];
    return n;
}

/* An f32 view of a tensor: in place when F32 and aligned, else converted. */
static const float *view(loader_t *ld, const hp_st_tensor_t *t)
{
    size_t n = n_elems(t->ndim, t->shape);
    if (t->dtype == HP_DT_F32 && ((uintptr_t)t->data & 3u) == 0)
        return ld->pass == 1 ? (const float *)t->data : NULL;
    float *dst = arena_take(ld, n * sizeof(float));
    if (dst)
        convert(dst, t->data, t->dtype, n);
    return dst;
}

static int get(loader_t *ld, const float **dst, int ndim, int64_t d0,
               int64_t d1, int64_t d2, const char *fmt, ...)
    __attribute__((format(printf, 7, 8)));
static int get(loader_t *ld, const float **dst, int ndim, int64_t d0,
               int64_t d1, int64_t d2, const char *fmt, ...)
{
    char rel[NAME_MAX_LEN];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(rel, sizeof(rel), fmt, ap);
    va_end(ap);
    const int64_t shape[3] = {d0, d1, d2};
    int rc;
    const hp_st_tensor_t *t = lookup(ld, ld->prefix, rel, ndim, shape, 0, &rc);
    if (!t)
        return rc;
    if (t->dtype == HP_DT_I8)
        return hp_error_set(ld->err, HP_EMODEL,
                            "%s: tensor %s%s is I8: only projection matrices "
                            "may be quantized",
                            ld->missing_in, ld->prefix, rel);
    *dst = view(ld, t);
    return HP_OK;
}

#define GET_VEC(ld, dst, n, ...) get(ld, dst, 1, n, 0, 0, __VA_ARGS__)

/* The element type a matrix keeps: its own for F32, BF16 and I8 (README
 * "Weight formats"), f32 for the others (converted). */
static int wtype_of(hp_dtype_t dt)
{
    return dt == HP_DT_BF16 ? HK_W_BF16 : dt == HP_DT_I8 ? HK_W_I8 : HK_W_F32;
}

/* Scales of the I8 tensor t named name: "<name>_scale", t's shape with the
 * last dim cols / group (group dividing cols), as f32. */
static int wscales(loader_t *ld, const hp_st_tensor_t *t, const char *name,
                   hp_mat_t *mt)
{
    char sname[NAME_MAX_LEN + 8];
    const hp_st_file_t *in = NULL;
    const int64_t cols = t->shape[t->ndim - 1];
    snprintf(sname, sizeof(sname), "%s" HP_QUANT_SCALE_SUF, name);
    if (!ld->m->cfg.quant_group)
        return hp_error_set(ld->err, HP_EMODEL,
                            "%s: tensor %s is I8 but config.json has no "
                            "quantization_config of \"" HP_QUANT_INT8 "\"",
                            ld->missing_in, name);
    const hp_st_tensor_t *s = find_any(ld->m, sname, &in);
    if (!s)
        return hp_error_set(ld->err, HP_EMODEL, "%s: missing tensor %s",
                            ld->missing_in, sname);
    int same = s->ndim == t->ndim && s->shape[s->ndim - 1] > 0 &&
               cols % s->shape[s->ndim - 1] == 0 && s->dtype != HP_DT_I8;
    for (int d = 0; same && d + 1 < t->ndim; d++)
        same = s->shape[d] == t->shape[d];
    if (!same) {
        char got[96], of[96];
        fmt_shape(got, sizeof(got), s->ndim, s->shape);
        fmt_shape(of, sizeof(of), t->ndim, t->shape);
        return hp_error_set(ld->err, HP_EMODEL,
                            "%s: tensor %s (%s %s) does not scale %s %s by "
                            "groups of its last dim",
                            in->path, sname, hp_dtype_name(s->dtype), got, name,
                            of);
    }
    mt->group = (int)(cols / s->shape[s->ndim - 1]);
    mt->scales = view(ld, s);
    return HP_OK;
}

/* A weight view of tensor t (named name) as [rows, cols]: F32 (aligned),
 * BF16 (aligned) and I8 in place, anything else converted to f32. */
static int wview(loader_t *ld, const hp_st_tensor_t *t, const char *name,
                 int rows, int cols, hp_mat_t *mt)
{
    const int wt = wtype_of(t->dtype);
    const size_t n = n_elems(t->ndim, t->shape);
    *mt = (hp_mat_t){.dtype = wt, .rows = rows, .cols = cols};
    if (wt == HK_W_F32) {
        mt->data = view(ld, t);
    } else if (wt == HK_W_I8 || ((uintptr_t)t->data & 1u) == 0) {
        mt->data = ld->pass == 1 ? t->data : NULL;
    } else {
        void *dst = arena_take(ld, n * 2); /* BF16 at an odd address */
        if (dst)
            memcpy(dst, t->data, n * 2);
        mt->data = dst;
    }
    return wt == HK_W_I8 ? wscales(ld, t, name, mt) : HP_OK;
}

/* Finds prefix+rel with the given shape and views it as [rows, cols]. */
static const hp_st_tensor_t *get_w(loader_t *ld, const char *prefix,
                                   const char *rel, int ndim,
                                   const int64_t *shape, int rows, int cols,
                                   int optional, hp_mat_t *mt, int *rc)
{
    char name[NAME_MAX_LEN];
    const hp_st_tensor_t *t =
        lookup(ld, prefix, rel, ndim, shape, optional, rc);
    snprintf(name, sizeof(name), "%s%s", prefix, rel);
    if (t)
        *rc = wview(ld, t, name, rows, cols, mt);
    return t;
}

static int get_mat(loader_t *ld, hp_mat_t *mt, int rows, int cols,
                   const char *fmt, int layer)
{
    char rel[NAME_MAX_LEN];
    const int64_t shape[2] = {rows, cols};
    int rc;
    snprintf(rel, sizeof(rel), fmt, layer);
    get_w(ld, ld->prefix, rel, 2, shape, rows, cols, 0, mt, &rc);
    return rc;
}

/* Rows [r0, r0 + nr) of m as a matrix of their own. */
static hp_mat_t mat_rows(const hp_mat_t *m, size_t r0, int nr)
{
    hp_mat_t v = *m;
    v.rows = nr;
    if (m->data)
        v.data = (const char *)m->data +
                 r0 * (size_t)m->cols * (size_t)hk_wtype_size(m->dtype);
    if (m->scales)
        v.scales = m->scales + r0 * (size_t)(m->cols / m->group);
    return v;
}

/* A matrix of rows x src's columns and type, in the arena. */
static hp_mat_t arena_mat(loader_t *ld, const hp_mat_t *src, int rows)
{
    hp_mat_t m = *src;
    const size_t n = (size_t)rows * (size_t)src->cols;
    m.rows = rows;
    m.data = arena_take(ld, n * (size_t)hk_wtype_size(src->dtype));
    m.scales = src->dtype == HK_W_I8
                   ? arena_take(ld, n / (size_t)src->group * sizeof(float))
                   : NULL;
    return m;
}

/* Rows [s, s + nr) of src into rows [d, d + nr) of dst, same type (I8:
 * with their scales). */
static void copy_rows(const hp_mat_t *dst, size_t d, const hp_mat_t *src,
                      size_t s, size_t nr)
{
    const hp_mat_t from = mat_rows(src, s, (int)nr), to = mat_rows(dst, d, 0);
    memcpy((void *)to.data, from.data,
           nr * (size_t)src->cols * (size_t)hk_wtype_size(src->dtype));
    if (src->dtype == HK_W_I8)
        memcpy((void *)to.scales, from.scales,
               nr * (size_t)(src->cols / src->group) * sizeof(float));
}

static int has(loader_t *ld, const char *fmt, int layer)
{
    char rel[NAME_MAX_LEN], name[NAME_MAX_LEN];
    const hp_st_file_t *in;
    snprintf(rel, sizeof(rel), fmt, layer);
    snprintf(name, sizeof(name), "%s%s", ld->prefix, rel);
    return find_any(ld->m, name, &in) != NULL;
}

/* ---- the layers ---- */

/*
 * Qwen3-Next fused projections, reference §2.3: in_proj_qkvz rows form Hk
 * groups [q_g (dk) | k_g (dk) | v (r*dv) | z (r*dv)], in_proj_ba rows Hk
 * groups [b (r) | a (r)]. De-interleaved into the split Qwen3.5 order.
 */
static int load_fused_gdn(loader_t *ld, hp_layer_weights_t *w, int i)
{
    const hp_model_config_t *c = &ld->m->cfg;
    const int H = c->hidden, Hk = c->lin_k_heads, Hv = c->lin_v_heads;
    const int dk = c->lin_k_dim, dv = c->lin_v_dim, r = Hv / Hk;
    const int kd = hp_cfg_key_dim(c), vd = hp_cfg_value_dim(c);
    const size_t gs = (size_t)2 * dk + (size_t)2 * r * dv;
    char rel[NAME_MAX_LEN];
    int rc;

    /* the fused tensors as they are (F16 ones converted), then their rows
     * rearranged into the split matrices, in the same type */
    hp_mat_t q, ba;
    snprintf(rel, sizeof(rel), "layers.%d.linear_attn.in_proj_qkvz.weight", i);
    const int64_t sq[2] = {2 * kd + 2 * vd, H};
    if (!get_w(ld, ld->prefix, rel, 2, sq, 2 * kd + 2 * vd, H, 0, &q, &rc) ||
        rc)
        return rc;
    snprintf(rel, sizeof(rel), "layers.%d.linear_attn.in_proj_ba.weight", i);
    const int64_t sb[2] = {2 * Hv, H};
    if (!get_w(ld, ld->prefix, rel, 2, sb, 2 * Hv, H, 0, &ba, &rc) || rc)
        return rc;

    w->in_qkv = arena_mat(ld, &q, hp_cfg_conv_dim(c));
    w->in_z = arena_mat(ld, &q, vd);
    w->in_b = arena_mat(ld, &ba, Hv);
    w->in_a = arena_mat(ld, &ba, Hv);
    if (ld->pass == 0)
        return HP_OK;
    for (int g = 0; g < Hk; g++) {
        size_t s = (size_t)g * gs, rv = (size_t)r * dv;
        copy_rows(&w->in_qkv, (size_t)g * dk, &q, s, dk);
        copy_rows(&w->in_qkv, (size_t)kd + (size_t)g * dk, &q, s + dk, dk);
        copy_rows(&w->in_qkv, (size_t)2 * kd + g * rv, &q, s + 2 * dk, rv);
        copy_rows(&w->in_z, g * rv, &q, s + 2 * dk + rv, rv);
        copy_rows(&w->in_b, (size_t)g * r, &ba, (size_t)g * 2 * r, r);
        copy_rows(&w->in_a, (size_t)g * r, &ba, (size_t)g * 2 * r + r, r);
    }
    return HP_OK;
}

static int load_gdn(loader_t *ld, hp_layer_weights_t *w, int i)
{
    const hp_model_config_t *c = &ld->m->cfg;
    const int H = c->hidden, Hv = c->lin_v_heads, vd = hp_cfg_value_dim(c);
    const int cd = hp_cfg_conv_dim(c);
    int rc;
    /* the split (Qwen3.5) form unless only the fused one is present */
    if (c->arch == HP_ARCH_QWEN3_NEXT
            ? !has(ld, "layers.%d.linear_attn.in_proj_qkv.weight", i)
            : (!has(ld, "layers.%d.linear_attn.in_proj_qkv.weight", i) &&
               has(ld, "layers.%d.linear_attn.in_proj_qkvz.weight", i))) {
        rc = load_fused_gdn(ld, w, i);
    } else if (!(rc = get_mat(ld, &w->in_qkv, cd, H,
                              "layers.%d.linear_attn.in_proj_qkv.weight", i)) &&
               !(rc = get_mat(ld, &w->in_z, vd, H,
                              "layers.%d.linear_attn.in_proj_z.weight", i)) &&
               !(rc = get_mat(ld, &w->in_b, Hv, H,
                              "layers.%d.linear_attn.in_proj_b.weight", i))) {
        rc = get_mat(ld, &w->in_a, Hv, H,
                     "layers.%d.linear_attn.in_proj_a.weight", i);
    }
    if (rc)
        return rc;
    /* conv1d [conv_dim, 1, Kc] is [conv_dim, Kc] in memory: used as is */
    if ((rc = get(ld, &w->conv_w, 3, cd, 1, c->conv_kernel,
                  "layers.%d.linear_attn.conv1d.weight", i)) ||
        (rc = GET_VEC(ld, &w->A_log, Hv, "layers.%d.linear_attn.A_log", i)) ||
        (rc = GET_VEC(ld, &w->dt_bias, Hv, "layers.%d.linear_attn.dt_bias",
                      i)) ||
        (rc = GET_VEC(ld, &w->gnorm, c->lin_v_dim,
                      "layers.%d.linear_attn.norm.weight", i)))
        return rc;
    return get_mat(ld, &w->out_proj, H, vd,
                   "layers.%d.linear_attn.out_proj.weight", i);
}

static int load_attn(loader_t *ld, hp_layer_weights_t *w, int i)
{
    const hp_model_config_t *c = &ld->m->cfg;
    const int H = c->hidden, hd = c->head_dim;
    int rc;
    if ((rc = get_mat(ld, &w->q_proj, c->n_heads * 2 * hd, H,
                      "layers.%d.self_attn.q_proj.weight", i)) ||
        (rc = get_mat(ld, &w->k_proj, c->n_kv_heads * hd, H,
                      "layers.%d.self_attn.k_proj.weight", i)) ||
        (rc = get_mat(ld, &w->v_proj, c->n_kv_heads * hd, H,
                      "layers.%d.self_attn.v_proj.weight", i)) ||
        (rc = get_mat(ld, &w->o_proj, H, c->n_heads * hd,
                      "layers.%d.self_attn.o_proj.weight", i)) ||
        (rc = GET_VEC(ld, &w->q_norm, hd, "layers.%d.self_attn.q_norm.weight",
                      i)))
        return rc;
    return GET_VEC(ld, &w->k_norm, hd, "layers.%d.self_attn.k_norm.weight", i);
}

static int load_moe(loader_t *ld, hp_layer_weights_t *w, int i, hp_mat_t *mats)
{
    const hp_model_config_t *c = &ld->m->cfg;
    const int H = c->hidden, E = c->n_experts, Im = c->moe_intermediate;
    const int Is = c->shared_intermediate;
    int rc;
    w->exp_gate = mats;
    w->exp_up = mats + E;
    w->exp_down = mats + 2 * E;
    if ((rc = get_mat(ld, &w->router, E, H, "layers.%d.mlp.gate.weight", i)))
        return rc;
    if (has(ld, "layers.%d.mlp.experts.gate_up_proj", i)) {
        /* fused 3-D form: gate_up [E, 2Im, H] gate rows first, down
         * [E, H, Im]; each expert is a view, no transpose */
        hp_mat_t gu, dn;
        char rel[NAME_MAX_LEN];
        const int64_t sgu[3] = {E, 2 * Im, H}, sdn[3] = {E, H, Im};
        snprintf(rel, sizeof(rel), "layers.%d.mlp.experts.gate_up_proj", i);
        if (!get_w(ld, ld->prefix, rel, 3, sgu, E * 2 * Im, H, 0, &gu, &rc) ||
            rc)
            return rc;
        snprintf(rel, sizeof(rel), "layers.%d.mlp.experts.down_proj", i);
        if (!get_w(ld, ld->prefix, rel, 3, sdn, E * H, Im, 0, &dn, &rc) || rc)
            return rc;
        for (int e = 0; e < E && ld->pass == 1; e++) {
            w->exp_gate[e] = mat_rows(&gu, (size_t)e * 2 * Im, Im);
            w->exp_up[e] = mat_rows(&gu, (size_t)e * 2 * Im + Im, Im);
            w->exp_down[e] = mat_rows(&dn, (size_t)e * H, H);
        }
    } else {
        for (int e = 0; e < E; e++) {
            char rel[NAME_MAX_LEN];
            snprintf(rel, sizeof(rel), "layers.%%d.mlp.experts.%d.", e);
            size_t len = strlen(rel);
            snprintf(rel + len, sizeof(rel) - len, "gate_proj.weight");
            if ((rc = get_mat(ld, &w->exp_gate[e], Im, H, rel, i)))
                return rc;
            snprintf(rel + len, sizeof(rel) - len, "up_proj.weight");
            if ((rc = get_mat(ld, &w->exp_up[e], Im, H, rel, i)))
                return rc;
            snprintf(rel + len, sizeof(rel) - len, "down_proj.weight");
            if ((rc = get_mat(ld, &w->exp_down[e], H, Im, rel, i)))
                return rc;
        }
    }
    if (Is == 0)
        return HP_OK;
    if ((rc = get_mat(ld, &w->sh_gate, Is, H,
                      "layers.%d.mlp.shared_expert.gate_proj.weight", i)) ||
        (rc = get_mat(ld, &w->sh_up, Is, H,
                      "layers.%d.mlp.shared_expert.up_proj.weight", i)) ||
        (rc = get_mat(ld, &w->sh_down, H, Is,
                      "layers.%d.mlp.shared_expert.down_proj.weight", i)))
        return rc;
    return get(ld, &w->sh_expert_gate, 2, 1, H, 0,
               "layers.%d.mlp.shared_expert_gate.weight", i);
}

static int load_layer(loader_t *ld, int i, hp_mat_t *mats)
{
    const hp_model_config_t *c = &ld->m->cfg;
    hp_layer_weights_t *w = &ld->m->layers[i];
    const int H = c->hidden, I = c->intermediate;
    int rc;
    if ((rc = GET_VEC(ld, &w->input_norm, H, "layers.%d.input_layernorm.weight",
                      i)) ||
        (rc = GET_VEC(ld, &w->post_norm, H,
                      "layers.%d.post_attention_layernorm.weight", i)))
        return rc;
    rc = c->layer_kind[i] == HP_LAYER_FULL ? load_attn(ld, w, i)
                                           : load_gdn(ld, w, i);
    if (rc)
        return rc;
    if (c->layer_moe[i])
        return load_moe(ld, w, i, mats);
    if ((rc = get_mat(ld, &w->gate, I, H, "layers.%d.mlp.gate_proj.weight",
                      i)) ||
        (rc = get_mat(ld, &w->up, I, H, "layers.%d.mlp.up_proj.weight", i)))
        return rc;
    return get_mat(ld, &w->down, H, I, "layers.%d.mlp.down_proj.weight", i);
}

static int load_all(loader_t *ld)
{
    hp_model_t *m = ld->m;
    const hp_model_config_t *c = &m->cfg;
    const int64_t V = c->vocab_size, H = c->hidden;
    int rc;
    ld->arena_used = 0;
    const int64_t shp[2] = {V, H};
    if (!get_w(ld, ld->prefix, "embed_tokens.weight", 2, shp, (int)V, (int)H, 0,
               &m->embed, &rc) ||
        rc || (rc = get(ld, &m->final_norm, 1, H, 0, 0, "norm.weight")))
        return rc;
    /* tied: the head is the embedding, in whatever type it is stored */
    if (!get_w(ld, "", "lm_head.weight", 2, shp, (int)V, (int)H, 1, &m->lm_head,
               &rc))
        m->lm_head = m->embed;
    if (rc)
        return rc;
    hp_mat_t *mats = m->expert_mats;
    for (int i = 0; i < c->n_layers; i++) {
        if ((rc = load_layer(ld, i, mats)))
            return rc;
        if (c->layer_moe[i])
            mats += (size_t)3 * c->n_experts;
    }
    return HP_OK;
}

/* m->weight_bytes: every matrix once (the tied head is the embedding). */
static void add_mat(hp_model_t *m, const hp_mat_t *w)
{
    if (!w->data)
        return;
    size_t n = (size_t)w->rows * (size_t)w->cols;
    m->weight_bytes[w->dtype] += n * (size_t)hk_wtype_size(w->dtype);
    if (w->dtype == HK_W_I8)
        m->weight_bytes[w->dtype] += n / (size_t)w->group * sizeof(float);
}

static void count_weights(hp_model_t *m)
{
    const hp_model_config_t *c = &m->cfg;
    add_mat(m, &m->embed);
    if (m->lm_head.data != m->embed.data)
        add_mat(m, &m->lm_head);
    for (int i = 0; i < c->n_layers; i++) {
        const hp_layer_weights_t *w = &m->layers[i];
        const hp_mat_t *all[] = {
            &w->in_qkv,   &w->in_z,    &w->in_b,   &w->in_a,
            &w->out_proj, &w->q_proj,  &w->k_proj, &w->v_proj,
            &w->o_proj,   &w->gate,    &w->up,     &w->down,
            &w->router,   &w->sh_gate, &w->sh_up,  &w->sh_down};
        for (size_t j = 0; j < sizeof(all) / sizeof(all[0]); j++)
            add_mat(m, all[j]);
        for (int e = 0; c->layer_moe[i] && e < c->n_experts; e++) {
            add_mat(m, &w->exp_gate[e]);
            add_mat(m, &w->exp_up[e]);
            add_mat(m, &w->exp_down[e]);
        }
    }
}

/* ---- placement on the backend ---- */

/* Places *p (err set) or releases it (err NULL). */
static int place1(hp_model_t *m, const void **p, size_t bytes, hp_error_t *err)
{
    if (err)
        return hp_backend_place(m->be, p, bytes, err);
    hp_backend_unplace(m->be, *p);
    return HP_OK;
}

static int place_vec(hp_model_t *m, const float **p, size_t n, hp_error_t *err)
{
    const void *v = *p;
    int rc = place1(m, &v, n * sizeof(float), err);
    *p = v;
    return rc;
}

static int place_mat(hp_model_t *m, hp_mat_t *w, hp_error_t *err)
{
    size_t n = (size_t)w->rows * w->cols;
    int rc = place1(m, &w->data, n * (size_t)hk_wtype_size(w->dtype), err);
    if (rc == HP_OK && w->scales && w->group > 0)
        rc = place_vec(m, &w->scales, n / (size_t)w->group, err);
    return rc;
}

/* Every tensor an op reads, placed (err set) or released (err NULL). A
 * failure part way leaves the placed ones to the backend's close. */
static int each_tensor(hp_model_t *m, hp_error_t *err)
{
    const hp_model_config_t *c = &m->cfg;
    size_t H = c->hidden, Hv = c->lin_v_heads, hd = c->head_dim;
    size_t cw = (size_t)hp_cfg_conv_dim(c) * c->conv_kernel;
    int tied = m->lm_head.data == m->embed.data, rc = HP_OK;
    rc = place_mat(m, &m->embed, err);
    if (tied)
        m->lm_head = m->embed;
    else if (rc == HP_OK)
        rc = place_mat(m, &m->lm_head, err);
    if (rc == HP_OK)
        rc = place_vec(m, &m->final_norm, H, err);
    for (int i = 0; i < c->n_layers && rc == HP_OK; i++) {
        hp_layer_weights_t *w = &m->layers[i];
        hp_mat_t *all[] = {&w->in_qkv,   &w->in_z,    &w->in_b,   &w->in_a,
                           &w->out_proj, &w->q_proj,  &w->k_proj, &w->v_proj,
                           &w->o_proj,   &w->gate,    &w->up,     &w->down,
                           &w->router,   &w->sh_gate, &w->sh_up,  &w->sh_down};
        struct {
            const float **p;
            size_t n;
        } vec[] = {
            {&w->input_norm, H}, {&w->post_norm, H}, {&w->conv_w, cw},
            {&w->A_log, Hv},     {&w->dt_bias, Hv},  {&w->gnorm, c->lin_v_dim},
            {&w->q_norm, hd},    {&w->k_norm, hd},   {&w->sh_expert_gate, H}};
        for (size_t j = 0; j < sizeof(all) / sizeof(all[0]) && rc == HP_OK; j++)
            rc = place_mat(m, all[j], err);
        for (size_t j = 0; j < sizeof(vec) / sizeof(vec[0]) && rc == HP_OK; j++)
            if (*vec[j].p)
                rc = place_vec(m, vec[j].p, vec[j].n, err);
        for (int e = 0; c->layer_moe[i] && e < c->n_experts && rc == HP_OK;
             e++) {
            rc = place_mat(m, &w->exp_gate[e], err);
            if (rc == HP_OK)
                rc = place_mat(m, &w->exp_up[e], err);
            if (rc == HP_OK)
                rc = place_mat(m, &w->exp_down[e], err);
        }
    }
    return rc;
}

/* The weights into the backend's memory, once it is known to run their
 * formats; on the CPU nothing moves. */
static int place_all(hp_model_t *m, hp_error_t *err)
{
    static const char *const fmt[] = {"F32", "BF16", "I8"};
    for (int t = HK_W_F32; t <= HK_W_I8; t++)
        if (m->weight_bytes[t] &&
            !hp_backend_supports_op(m->be, HP_OP_LINEAR, t))
            return hp_error_set(err, HP_EUNAVAIL,
                                "%s: backend %s cannot run %s projections",
                                m->dir, hp_backend_name(m->be), fmt[t]);
    if (!hp_backend_supports_op(m->be, HP_OP_EMBED, m->embed.dtype))
        return hp_error_set(
            err, HP_EUNAVAIL, "%s: backend %s cannot gather a %s embedding",
            m->dir, hp_backend_name(m->be), fmt[m->embed.dtype]);
    if (hp_backend_host_memory(m->be))
        return HP_OK;
    int rc = each_tensor(m, err);
    m->placed = rc == HP_OK;
    return rc;
}

/* ---- fingerprint ---- */

/*
 * m->fingerprint = XXH3-128 over the bytes of config.json followed by the
 * bytes of tokenizer.json (one streaming state, no separator), stored in
 * XXH128's canonical big-endian form: bytes 0-7 = high64, 8-15 = low64,
 * most significant first, so its hex dump equals the usual 32-digit print.
 */
static int fingerprint(hp_model_t *m, const char *cfg_txt, size_t cfg_len,
                       hp_error_t *err)
{
    char path[1200], *tok;
    size_t tok_len;
    snprintf(path, sizeof(path), "%s/tokenizer.json", m->dir);
    int rc = slurp(path, &tok, &tok_len, err);
    if (rc != HP_OK)
        return rc;
    XXH3_state_t *st = XXH3_createState();
    if (!st) {
        free(tok);
        return hp_error_set(err, HP_ENOMEM, "%s: out of memory", path);
    }
    XXH3_128bits_reset(st);
    XXH3_128bits_update(st, cfg_txt, cfg_len);
    XXH3_128bits_update(st, tok, tok_len);
    XXH128_canonical_t can;
    XXH128_canonicalFromHash(&can, XXH3_128bits_digest(st));
    XXH3_freeState(st);
    free(tok);
    memcpy(m->fingerprint, can.digest, 16);
    return HP_OK;
}

/* ---- entry points ---- */

static int load(hp_model_t *m, const char *dir, hp_error_t *err)
{
    loader_t ld = {.m = m, .err = err};
    char path[1200], *cfg_txt;
    size_t cfg_len;
    if (strlen(dir) >= sizeof(m->dir))
        return hp_error_set(err, HP_EBADINPUT, "model path too long");
    strcpy(m->dir, dir);
    snprintf(path, sizeof(path), "%s/config.json", dir);
    int rc = slurp(path, &cfg_txt, &cfg_len, err);
    if (rc != HP_OK)
        return rc;
    rc = hp_model_config_parse(&m->cfg, cfg_txt, path, err);
    if (rc == HP_OK)
        rc = fingerprint(m, cfg_txt, cfg_len, err);
    free(cfg_txt);
    if (rc != HP_OK || (rc = open_files(m, &ld, err)) != HP_OK)
        return rc;

    const hp_model_config_t *c = &m->cfg;
    const hp_st_file_t *in;
    if (find_any(m, "model.language_model.embed_tokens.weight", &in))
        ld.prefix = "model.language_model.";
    else if (find_any(m, "model.embed_tokens.weight", &in))
        ld.prefix = "model.";
    else
        return hp_error_set(err, HP_EMODEL,
                            "%s: missing tensor model.embed_tokens.weight "
                            "(or model.language_model.embed_tokens.weight)",
                            ld.missing_in);

    /* the config parser bounds n_layers; restated for the allocator */
    if (c->n_layers < 1 || c->n_layers > HP_MAX_LAYERS)
        return hp_error_set(err, HP_EINTERNAL, "bad layer count");
    size_t n_moe = 0;
    for (int i = 0; i < c->n_layers; i++)
        n_moe += c->layer_moe[i];
    m->layers = calloc((size_t)c->n_layers, sizeof(*m->layers));
    if (n_moe)
        m->expert_mats =
            calloc(n_moe * 3 * (size_t)c->n_experts, sizeof(hp_mat_t));
    if (!m->layers || (n_moe && !m->expert_mats))
        return hp_error_set(err, HP_ENOMEM, "%s: out of memory", dir);

    if ((rc = load_all(&ld)) != HP_OK)
        return rc;
    m->arena_bytes = ld.arena_used;
    if (ld.arena_used) {
        m->arena = aligned_alloc(ARENA_ALIGN, ld.arena_used);
        if (!m->arena)
            return hp_error_set(err, HP_ENOMEM,
                                "%s: cannot allocate %zu MiB for converted "
                                "weights",
                                dir, ld.arena_used >> 20);
    }
    ld.pass = 1;
    if ((rc = load_all(&ld)) != HP_OK)
        return rc;
    count_weights(m);
    return HP_OK;
}

int hp_model_load(hp_model_t *m, const char *dir, hp_error_t *err)
{
    return hp_model_load_on(m, dir, hp_backend_cpu(), err);
}

int hp_model_load_on(hp_model_t *m, const char *dir, const hp_backend_t *be,
                     hp_error_t *err)
{
    memset(m, 0, sizeof(*m));
    m->be = be;
    int rc = load(m, dir, err);
    m->sample_vocab = m->cfg.vocab_size;
    if (rc == HP_OK)
        rc = place_all(m, err);
    if (rc != HP_OK)
        hp_model_free(m);
    else
        hp_model_set_compute(m, HP_COMPUTE_AUTO);
    return rc;
}

void hp_model_set_compute(hp_model_t *m, hp_compute_t d)
{
    const size_t *wb = m->weight_bytes;
    if (d == HP_COMPUTE_AUTO) /* a bf16 checkpoint (int8 ones included) */
        d = wb[HK_W_BF16] && !wb[HK_W_F32] ? HP_COMPUTE_BF16 : HP_COMPUTE_F32;
    m->prec = d == HP_COMPUTE_BF16 ? HP_PREC_BF16 : HP_PREC_F32;
}

int hp_compute_parse(const char *s, hp_compute_t *d)
{
    static const char *const names[] = {"auto", "f32", "bf16"};
    for (int i = 0; s && i < 3; i++)
        if (!strcmp(s, names[i])) {
            *d = (hp_compute_t)i;
            return 0;
        }
    return -1;
}

const char *hp_prec_name(hp_prec_t p)
{
    return p == HP_PREC_BF16 ? "bf16" : "f32";
}

void hp_model_free(hp_model_t *m)
{
    if (!m)
        return;
    if (m->be && m->placed)
        each_tensor(m, NULL);
    for (int i = 0; i < m->n_files; i++)
        hp_st_close(&m->files[i]);
    free(m->files);
    free(m->arena);
    free(m->layers);
    free(m->expert_mats);
    memset(m, 0, sizeof(*m));
}
