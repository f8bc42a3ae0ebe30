/*
 * fuzz_tokenizer - encode, decode and stream decode with the test model's
 * tokenizer on any text or ids. Beyond no crash: ASCII text round-trips
 * exactly, decoded text is valid UTF-8, streaming then flushing gives
 * exactly decode, and an unknown id is refused by both the same way.
 */
#include <string.h>
#include <utf8proc.h>

#include "engine/tokenizer/tokenizer.h"
#include "fuzz/fuzz_util.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static hp_tokenizer_t *tok;

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    char path[4096];
    hp_error_t err;
    snprintf(path, sizeof(path), "%s/tokenizer.json", fuzz_model_dir());
    if (hp_tokenizer_load(&tok, path, &err) != HP_OK)
        return fuzz_setup_failed(err.msg);
    return 0;
}

static int valid_utf8(const char *s, size_t n)
{
    utf8proc_int32_t cp;
    for (size_t i = 0; i < n;) {
        utf8proc_ssize_t k = utf8proc_iterate((const utf8proc_uint8_t *)s + i,
                                              (utf8proc_ssize_t)(n - i), &cp);
        if (k <= 0)
            return 0;
        i += (size_t)k;
    }
    return 1;
}

/* decode and stream decode of ids agree; returns decode's status */
static int decode_both(const int32_t *ids, size_t n, hp_tokenizer_text_t *out)
{
    hp_tokenizer_text_t streamed = {0};
    hp_tokenizer_stream_t st;
    hp_error_t err;
    int rc = hp_tokenizer_decode(tok, ids, n, out, &err), src = HP_OK;

    hp_tokenizer_stream_init(&st);
    for (size_t i = 0; i < n && src == HP_OK; i++)
        src = hp_tokenizer_stream_push(tok, &st, ids[i], &streamed, &err);
    FUZZ_CHECK(rc == src);
    if (rc == HP_OK) {
        FUZZ_CHECK(hp_tokenizer_stream_flush(&st, &streamed, &err) == HP_OK);
        FUZZ_CHECK(streamed.len == out->len &&
                   memcmp(streamed.data, out->data, out->len) == 0);
        FUZZ_CHECK(valid_utf8(out->data, out->len));
    } else {
        FUZZ_CHECK(rc == HP_EBADINPUT);
    }
    hp_tokenizer_text_free(&streamed);
    return rc;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    hp_tokenizer_ids_t ids = {0};
    hp_tokenizer_text_t out = {0};
    hp_error_t err;

    if (size == 0)
        return 0;
    if (data[0] & 1) {
        /* ids: 3 bytes each, so that ids past the vocabulary occur too */
        size_t n = (size - 1) / 3;
        int32_t *v = malloc((n + 1) * sizeof(*v));
        FUZZ_CHECK(v);
        for (size_t i = 0; i < n; i++)
            v[i] = (int32_t)(data[1 + 3 * i] | data[2 + 3 * i] << 8 |
                             (data[3 + 3 * i] & 0x7f) << 16) -
                   (data[3 + 3 * i] & 0x80 ? 1 << 22 : 0);
        decode_both(v, n, &out);
        free(v);
    } else {
        const char *text = (const char *)data + 1;
        size_t n = size - 1, ascii = 1;
        FUZZ_CHECK(hp_tokenizer_encode(tok, text, n, &ids, &err) == HP_OK);
        FUZZ_CHECK(decode_both(ids.ids, ids.n, &out) == HP_OK);
        for (size_t i = 0; i < n; i++)
            ascii &= ((const uint8_t *)text)[i] < 0x80;
        if (ascii)
            FUZZ_CHECK(out.len == n && memcmp(out.data, text, n) == 0);
    }
    hp_tokenizer_ids_free(&ids);
    hp_tokenizer_text_free(&out);
    return 0;
}
