/*
 * safetensors.c - mmap reader with full header validation, dtype -> f32
 * conversion, and a writer for f32 tensors. Not a general tensor library:
 * no strided views, no in-place edits of a mapped file.
 */
#include "engine/model/safetensors.h"

#include <cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* A header larger than this is not a checkpoint header (HF caps at 100 MB). */
#define HP_ST_MAX_HEADER (100u << 20)
/* JSON numbers are doubles: integers are exact up to 2^53. */
#define HP_ST_MAX_INT 9007199254740992.0

size_t hp_dtype_size(hp_dtype_t dt)
{
    switch (dt) {
    case HP_DT_F32:
    case HP_DT_I32:
        return 4;
    case HP_DT_F16:
    case HP_DT_BF16:
        return 2;
    case HP_DT_F64:
    case HP_DT_I64:
        return 8;
    case HP_DT_I8:
        return 1;
    }
    return 0;
}

const char *hp_dtype_name(hp_dtype_t dt)
{
    switch (dt) {
    case HP_DT_F32:
        return "F32";
    case HP_DT_F16:
        return "F16";
    case HP_DT_BF16:
        return "BF16";
    case HP_DT_F64:
        return "F64";
    case HP_DT_I32:
        return "I32";
    case HP_DT_I64:
        return "I64";
    case HP_DT_I8:
        return "I8";
    }
    return "?";
}

static int dtype_parse(const char *s, hp_dtype_t *dt)
{
    static const hp_dtype_t all[] = {HP_DT_F32, HP_DT_F16, HP_DT_BF16,
                                     HP_DT_F64, HP_DT_I32, HP_DT_I64,
                                     HP_DT_I8};
    for (size_t i = 0; i < sizeof(all) / sizeof(all[0]); i++) {
        if (strcmp(s, hp_dtype_name(all[i])) == 0) {
            *dt = all[i];
            return 1;
        }
    }
    return 0;
}

/* IEEE half -> single, exact for every input (subnormals, inf, nan). */
static float f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t man = h & 0x3ffu;
    uint32_t bits;
    if (exp == 0x1f) {
        bits = sign | 0x7f800000u | (man << 13); /* inf / nan (payload kept) */
    } else if (exp != 0) {
        bits = sign | ((exp + 112u) << 23) | (man << 13);
    } else if (man == 0) {
        bits = sign; /* signed zero */
    } else {
        /* subnormal: man * 2^-24, normalize into an f32 normal */
        int e = -1;
        do {
            e++;
            man <<= 1;
        } while (!(man & 0x400u));
        bits = sign | ((uint32_t)(112 - e) << 23) | ((man & 0x3ffu) << 13);
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

void hp_st_to_f32(float *dst, const void *src, hp_dtype_t dt, size_t n)
{
    const unsigned char *s = src;
    switch (dt) {
    case HP_DT_F32:
        memcpy(dst, s, n * 4);
        break;
    case HP_DT_BF16:
        for (size_t i = 0; i < n; i++) {
            uint16_t h;
            uint32_t bits;
            memcpy(&h, s + 2 * i, 2);
            bits = (uint32_t)h << 16;
            memcpy(&dst[i], &bits, 4);
        }
        break;
    case HP_DT_F16:
        for (size_t i = 0; i < n; i++) {
            uint16_t h;
            memcpy(&h, s + 2 * i, 2);
            dst[i] = f16_to_f32(h);
        }
        break;
    case HP_DT_F64:
        for (size_t i = 0; i < n; i++) {
            double d;
            memcpy(&d, s + 8 * i, 8);
            dst[i] = (float)d;
        }
        break;
    case HP_DT_I32:
        for (size_t i = 0; i < n; i++) {
            int32_t v;
            memcpy(&v, s + 4 * i, 4);
            dst[i] = (float)v;
        }
        break;
    case HP_DT_I8:
        for (size_t i = 0; i < n; i++)
            dst[i] = (float)(int8_t)s[i];
        break;
    case HP_DT_I64:
        for (size_t i = 0; i < n; i++) {
            int64_t v;
            memcpy(&v, s + 8 * i, 8);
            dst[i] = (float)v;
        }
        break;
    }
}

static int cmp_tensor_name(const void *a, const void *b)
{
    return strcmp(((const hp_st_tensor_t *)a)->name,
                  ((const hp_st_tensor_t *)b)->name);
}

/* A JSON number that is a whole value in [0, 2^53]. */
static int json_uint(const cJSON *j, uint64_t *out)
{
    if (!cJSON_IsNumber(j))
        return 0;
    double d = j->valuedouble;
    if (!(d >= 0.0 && d <= HP_ST_MAX_INT) || floor(d) != d)
        return 0;
    *out = (uint64_t)d;
    return 1;
}

/* Validates one header entry and fills *t (name is owned by *t). */
static int parse_entry(hp_st_tensor_t *t, const cJSON *e, const char *base,
                       uint64_t data_size, const char *path, hp_error_t *err)
{
    const char *name = e->string;
    if (!cJSON_IsObject(e))
        return hp_error_set(err, HP_EMODEL,
                            "%s: header entry \"%s\" is not an object", path,
                            name);
    const cJSON *jd = cJSON_GetObjectItemCaseSensitive(e, "dtype");
    const cJSON *js = cJSON_GetObjectItemCaseSensitive(e, "shape");
    const cJSON *jo = cJSON_GetObjectItemCaseSensitive(e, "data_offsets");
    if (!cJSON_IsString(jd) || !cJSON_IsArray(js) || !cJSON_IsArray(jo))
        return hp_error_set(err, HP_EMODEL,
                            "%s: tensor %s needs dtype, shape and "
                            "data_offsets",
                            path, name);
    if (!dtype_parse(jd->valuestring, &t->dtype))
        return hp_error_set(err, HP_EMODEL,
                            "%s: tensor %s has unsupported dtype \"%.16s\"",
                            path, name, jd->valuestring);
    int nd = cJSON_GetArraySize(js);
    if (nd > HP_ST_MAX_DIMS)
        return hp_error_set(err, HP_EMODEL,
                            "%s: tensor %s has %d dims (max %d)", path, name,
                            nd, HP_ST_MAX_DIMS);
    t->ndim = nd;
    uint64_t count = 1;
    int overflow = 0;
    const cJSON *d;
    int i = 0;
    cJSON_ArrayForEach(d, js)
    {
        uint64_t v;
        if (!json_uint(d, &v))
            return hp_error_set(err, HP_EMODEL,
                                "%s: tensor %s has a bad shape entry", path,
                                name);
        t->shape[i++] = (int64_t)v;
        if (v != 0 && count > UINT64_MAX / v)
            overflow = 1;
        count *= v;
    }
    uint64_t esz = hp_dtype_size(t->dtype);
    if (overflow || count > UINT64_MAX / esz)
        return hp_error_set(err, HP_EMODEL, "%s: tensor %s shape overflows",
                            path, name);
    uint64_t b, en;
    if (cJSON_GetArraySize(jo) != 2 ||
        !json_uint(cJSON_GetArrayItem(jo, 0), &b) ||
        !json_uint(cJSON_GetArrayItem(jo, 1), &en) || b > en)
        return hp_error_set(err, HP_EMODEL,
                            "%s: tensor %s has bad data_offsets", path, name);
    if (en > data_size)
        return hp_error_set(err, HP_EMODEL,
                            "%s: tensor %s ends at byte %llu of a %llu-byte "
                            "data section (file truncated?)",
                            path, name, (unsigned long long)en,
                            (unsigned long long)data_size);
    if (en - b != count * esz)
        return hp_error_set(err, HP_EMODEL,
                            "%s: tensor %s has %llu bytes but shape x %s "
                            "needs %llu",
                            path, name, (unsigned long long)(en - b),
                            hp_dtype_name(t->dtype),
                            (unsigned long long)(count * esz));
    t->data = base + b;
    t->nbytes = (size_t)(en - b);
    t->name = strdup(name);
    if (!t->name)
        return hp_error_set(err, HP_ENOMEM, "%s: out of memory", path);
    return HP_OK;
}

static int parse_header(hp_st_file_t *f, const char *hdr, size_t hlen,
                        hp_error_t *err)
{
    const char *path = f->path;
    cJSON *root = cJSON_ParseWithLength(hdr, hlen);
    if (!root)
        return hp_error_set(err, HP_EMODEL, "%s: header is not valid JSON",
                            path);
    int rc = HP_OK;
    if (!cJSON_IsObject(root)) {
        rc = hp_error_set(err, HP_EMODEL, "%s: header is not a JSON object",
                          path);
        goto out;
    }
    int n = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, root)
    {
        if (strcmp(e->string, "__metadata__") != 0)
            n++;
    }
    f->tensors = calloc(n > 0 ? (size_t)n : 1, sizeof(*f->tensors));
    if (!f->tensors) {
        rc = hp_error_set(err, HP_ENOMEM, "%s: out of memory", path);
        goto out;
    }
    const char *base = (const char *)f->map + 8 + hlen;
    uint64_t data_size = f->map_size - 8 - hlen;
    cJSON_ArrayForEach(e, root)
    {
        if (strcmp(e->string, "__metadata__") == 0)
            continue;
        rc = parse_entry(&f->tensors[f->n_tensors], e, base, data_size, path,
                         err);
        if (rc != HP_OK)
            goto out;
        f->n_tensors++;
    }
    /* sorted by name: binary search in hp_st_find, duplicates adjacent */
    qsort(f->tensors, (size_t)f->n_tensors, sizeof(*f->tensors),
          cmp_tensor_name);
    for (int i = 1; i < f->n_tensors; i++) {
        if (strcmp(f->tensors[i - 1].name, f->tensors[i].name) == 0) {
            rc = hp_error_set(err, HP_EMODEL, "%s: tensor %s listed twice",
                              path, f->tensors[i].name);
            goto out;
        }
    }
out:
    cJSON_Delete(root);
    return rc;
}

int hp_st_open(hp_st_file_t *f, const char *path, hp_error_t *err)
{
    memset(f, 0, sizeof(*f));
    if (strlen(path) >= sizeof(f->path))
        return hp_error_set(err, HP_EBADINPUT, "path too long: %.64s...", path);
    strcpy(f->path, path);

    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return hp_error_set(err, HP_EIO, "%s: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        return hp_error_set(err, HP_EIO, "%s: %s", path, strerror(e));
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return hp_error_set(err, HP_EMODEL, "%s: not a regular file", path);
    }
    if (st.st_size < 8) {
        close(fd);
        return hp_error_set(err, HP_EMODEL,
                            "%s: %lld bytes, too short for a safetensors "
                            "header",
                            path, (long long)st.st_size);
    }
    f->map_size = (size_t)st.st_size;
    f->map = mmap(NULL, f->map_size, PROT_READ, MAP_PRIVATE, fd, 0);
    int e = errno;
    close(fd);
    if (f->map == MAP_FAILED) {
        f->map = NULL;
        return hp_error_set(err, HP_EIO, "%s: mmap: %s", path, strerror(e));
    }

    const unsigned char *p = f->map;
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--)
        hlen = (hlen << 8) | p[i];
    int rc;
    if (hlen < 2 || hlen > HP_ST_MAX_HEADER || hlen > f->map_size - 8) {
        rc = hp_error_set(err, HP_EMODEL,
                          "%s: header length %llu is impossible for a "
                          "%zu-byte file",
                          path, (unsigned long long)hlen, f->map_size);
    } else {
        rc = parse_header(f, (const char *)p + 8, (size_t)hlen, err);
    }
    if (rc != HP_OK)
        hp_st_close(f);
    return rc;
}

void hp_st_close(hp_st_file_t *f)
{
    if (!f)
        return;
    for (int i = 0; i < f->n_tensors; i++)
        free(f->tensors[i].name);
    free(f->tensors);
    if (f->map)
        munmap(f->map, f->map_size);
    f->tensors = NULL;
    f->n_tensors = 0;
    f->map = NULL;
    f->map_size = 0;
}

const hp_st_tensor_t *hp_st_find(const hp_st_file_t *f, const char *name)
{
    int lo = 0, hi = f->n_tensors - 1;
    while (lo <= hi) {
        int mid = lo + (hi - lo) / 2;
        int c = strcmp(name, f->tensors[mid].name);
        if (c == 0)
            return &f->tensors[mid];
        if (c < 0)
            hi = mid - 1;
        else
            lo = mid + 1;
    }
    return NULL;
}

/* ---- writer ---- */

static int write_all(FILE *fp, const void *p, size_t n)
{
    return fwrite(p, 1, n, fp) == n;
}

int hp_st_write_f32(const char *path, const hp_st_out_t *t, int n,
                    hp_error_t *err)
{
    cJSON *root = cJSON_CreateObject();
    if (!root)
        return hp_error_set(err, HP_ENOMEM, "%s: out of memory", path);
    uint64_t off = 0;
    int rc = HP_OK;
    for (int i = 0; i < n && rc == HP_OK; i++) {
        if (!t[i].name || t[i].ndim < 0 || t[i].ndim > HP_ST_MAX_DIMS ||
            strcmp(t[i].name, "__metadata__") == 0 ||
            cJSON_GetObjectItemCaseSensitive(root, t[i].name)) {
            rc = hp_error_set(err, HP_EBADINPUT,
                              "%s: tensor %d (%s) has a bad or duplicate "
                              "name or rank",
                              path, i, t[i].name ? t[i].name : "(null)");
            break;
        }
        uint64_t count = 1;
        double shp[HP_ST_MAX_DIMS];
        for (int d = 0; d < t[i].ndim; d++) {
            if (t[i].shape[d] < 0) {
                rc = hp_error_set(err, HP_EBADINPUT,
                                  "%s: tensor %s has a negative dim", path,
                                  t[i].name);
                break;
            }
            count *= (uint64_t)t[i].shape[d];
            shp[d] = (double)t[i].shape[d];
        }
        if (rc != HP_OK)
            break;
        double offs[2] = {(double)off, (double)(off + count * 4)};
        cJSON *e = cJSON_AddObjectToObject(root, t[i].name);
        if (!e || !cJSON_AddStringToObject(e, "dtype", "F32") ||
            !cJSON_AddItemToObject(e, "shape",
                                   cJSON_CreateDoubleArray(shp, t[i].ndim)) ||
            !cJSON_AddItemToObject(e, "data_offsets",
                                   cJSON_CreateDoubleArray(offs, 2)))
            rc = hp_error_set(err, HP_ENOMEM, "%s: out of memory", path);
        off += count * 4;
    }
    char *hdr = rc == HP_OK ? cJSON_PrintUnformatted(root) : NULL;
    cJSON_Delete(root);
    if (rc != HP_OK)
        return rc;
    if (!hdr)
        return hp_error_set(err, HP_ENOMEM, "%s: out of memory", path);

    /* pad the header with spaces so the data starts 8-byte aligned */
    size_t hlen = strlen(hdr);
    size_t padded = (hlen + 7) & ~(size_t)7;
    unsigned char len8[8];
    for (int i = 0; i < 8; i++)
        len8[i] = (unsigned char)((uint64_t)padded >> (8 * i));

    FILE *fp = fopen(path, "wb");
    if (!fp) {
        int e = errno;
        free(hdr);
        return hp_error_set(err, HP_EIO, "%s: %s", path, strerror(e));
    }
    int okw = write_all(fp, len8, 8) && write_all(fp, hdr, hlen);
    for (size_t i = hlen; okw && i < padded; i++)
        okw = fputc(' ', fp) != EOF;
    free(hdr);
    for (int i = 0; okw && i < n; i++) {
        size_t count = 1;
        for (int d = 0; d < t[i].ndim; d++)
            count *= (size_t)t[i].shape[d];
        okw = count == 0 || write_all(fp, t[i].data, count * 4);
    }
    int e = errno;
    if (fclose(fp) != 0 && okw) {
        okw = 0;
        e = errno;
    }
    if (!okw) {
        unlink(path);
        return hp_error_set(err, HP_EIO, "%s: write failed: %s", path,
                            strerror(e));
    }
    return HP_OK;
}
