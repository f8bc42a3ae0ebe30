/*
 * safetensors.h - read (mmap) and write .safetensors files.
 *
 * Format: u64 little-endian header length N, N bytes of JSON
 * {"name": {"dtype": "F32", "shape": [...], "data_offsets": [b, e]}, ...,
 *  "__metadata__": {...}}, then the data; offsets are relative to the end of
 * the header. Reading validates every entry against the file size.
 */
#ifndef HP_SAFETENSORS_H
#define HP_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "engine/contract/hp_error.h"

/* 8, not 4: Qwen3.5 VLM checkpoints hold a 5-D Conv3d patch embedding. */
#define HP_ST_MAX_DIMS 8

typedef enum {
    HP_DT_F32 = 1,
    HP_DT_F16,
    HP_DT_BF16,
    HP_DT_F64,
    HP_DT_I32,
    HP_DT_I64,
    HP_DT_I8 /* quantized weights (their scales beside them) */
} hp_dtype_t;

typedef struct {
    char *name;
    hp_dtype_t dtype;
    int ndim;
    int64_t shape[HP_ST_MAX_DIMS];
    const void *data; /* into the mapping */
    size_t nbytes;
} hp_st_tensor_t;

typedef struct {
    char path[1024];
    void *map;
    size_t map_size;
    hp_st_tensor_t *tensors;
    int n_tensors;
} hp_st_file_t;

/* Maps and indexes a file. On error returns HP_EMODEL/HP_EIO naming path. */
int hp_st_open(hp_st_file_t *f, const char *path, hp_error_t *err);
void hp_st_close(hp_st_file_t *f);
/* NULL if absent. */
const hp_st_tensor_t *hp_st_find(const hp_st_file_t *f, const char *name);
size_t hp_dtype_size(hp_dtype_t dt);
const char *hp_dtype_name(hp_dtype_t dt);
/* Converts n elements of src (dtype dt) to f32. */
void hp_st_to_f32(float *dst, const void *src, hp_dtype_t dt, size_t n);

/* Writer: collects f32 tensors (data copied by reference: keep it alive
 * until hp_st_writer_write returns), then writes the file. */
typedef struct {
    const char *name;
    int ndim;
    int64_t shape[HP_ST_MAX_DIMS];
    const float *data;
} hp_st_out_t;

int hp_st_write_f32(const char *path, const hp_st_out_t *t, int n,
                    hp_error_t *err);

#endif
