/*
 * fuzz_tokenizer_load - tokenizer.json loading on any bytes. Beyond no
 * crash: a loaded tokenizer encodes a fixed text to ids below its vocab
 * size, and those ids decode again; a refusal leaves *out NULL.
 */
#include <string.h>

#include "engine/tokenizer/tokenizer.h"
#include "fuzz/fuzz_util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static const char text[] = "Hello, world! <|im_end|> 123 caf\xc3\xa9";
    hp_tokenizer_t *tok = (hp_tokenizer_t *)1;
    hp_tokenizer_ids_t ids = {0};
    hp_tokenizer_text_t out = {0};
    hp_error_t err;

    if (hp_tokenizer_load(&tok, fuzz_file(data, size), &err) != HP_OK) {
        FUZZ_CHECK(tok == NULL && err.code < 0);
        return 0;
    }
    if (hp_tokenizer_encode(tok, text, strlen(text), &ids, &err) == HP_OK) {
        for (size_t i = 0; i < ids.n; i++)
            FUZZ_CHECK(ids.ids[i] >= 0 &&
                       (size_t)ids.ids[i] < hp_tokenizer_vocab_size(tok));
        FUZZ_CHECK(hp_tokenizer_decode(tok, ids.ids, ids.n, &out, &err) ==
                   HP_OK);
    }
    hp_tokenizer_ids_free(&ids);
    hp_tokenizer_text_free(&out);
    hp_tokenizer_free(tok);
    return 0;
}
