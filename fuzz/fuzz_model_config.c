/*
 * fuzz_model_config - config.json parsing on any text. Beyond no crash:
 * an accepted config satisfies what model_config.h promises (positive
 * sizes, Hv % Hk == 0, Hq % Hkv == 0, even rotary_dim <= hd, at most
 * HP_MAX_LAYERS layers of known kinds, eos ids within bounds).
 */
#include <stdlib.h>
#include <string.h>

#include "engine/model/model_config.h"
#include "fuzz/fuzz_util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *text = malloc(size + 1);
    hp_model_config_t c;
    hp_error_t err;

    FUZZ_CHECK(text);
    memcpy(text, data, size);
    text[size] = '\0';
    if (hp_model_config_parse(&c, text, "fuzz/config.json", &err) == HP_OK) {
        FUZZ_CHECK(c.vocab_size > 0 && c.hidden > 0 && c.n_layers > 0);
        FUZZ_CHECK(c.n_layers <= HP_MAX_LAYERS);
        FUZZ_CHECK(c.n_heads > 0 && c.n_kv_heads > 0 && c.head_dim > 0);
        FUZZ_CHECK(c.n_heads % c.n_kv_heads == 0);
        FUZZ_CHECK(c.lin_k_heads > 0 && c.lin_v_heads % c.lin_k_heads == 0);
        FUZZ_CHECK(c.rotary_dim % 2 == 0 && c.rotary_dim <= c.head_dim);
        FUZZ_CHECK(c.n_eos >= 0 && c.n_eos <= HP_MAX_EOS);
        for (int i = 0; i < c.n_layers; i++)
            FUZZ_CHECK(c.layer_kind[i] == HP_LAYER_LINEAR ||
                       c.layer_kind[i] == HP_LAYER_FULL);
    } else {
        FUZZ_CHECK(err.code < 0 && err.msg[0] != '\0');
    }
    free(text);
    return 0;
}
