/*
 * fuzz_safetensors - the .safetensors reader on any bytes. Beyond no
 * crash: an accepted file's tensors lie inside the mapping, hold
 * shape x dtype bytes, are found by name, and convert to f32 in bounds.
 */
#include <string.h>

#include "engine/model/safetensors.h"
#include "fuzz/fuzz_util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static float out[4096];
    hp_st_file_t f;
    hp_error_t err;

    if (hp_st_open(&f, fuzz_file(data, size), &err) != HP_OK) {
        FUZZ_CHECK(err.code < 0 && err.msg[0] != '\0');
        return 0;
    }
    const uint8_t *map = f.map, *end = map + f.map_size;
    for (int i = 0; i < f.n_tensors; i++) {
        const hp_st_tensor_t *t = &f.tensors[i];
        size_t n = 1;
        FUZZ_CHECK(t->ndim >= 0 && t->ndim <= HP_ST_MAX_DIMS);
        for (int d = 0; d < t->ndim; d++) {
            FUZZ_CHECK(t->shape[d] >= 0);
            n *= (size_t)t->shape[d];
        }
        FUZZ_CHECK(t->nbytes == n * hp_dtype_size(t->dtype));
        const uint8_t *p = t->data;
        FUZZ_CHECK(t->nbytes == 0 || (p >= map && p + t->nbytes <= end));
        const hp_st_tensor_t *found = hp_st_find(&f, t->name);
        FUZZ_CHECK(found && strcmp(found->name, t->name) == 0);
        if (n <= sizeof(out) / sizeof(out[0]))
            hp_st_to_f32(out, t->data, t->dtype, n);
    }
    hp_st_close(&f);
    return 0;
}
