/*
 * tokenizer_decode.c - ids to text, whole or streamed token by token; the
 * result is always valid UTF-8 (HF's from_utf8_lossy on the byte string).
 */
#include "engine/tokenizer/tokenizer_impl.h"

int hp_tokenizer_stream_push(const hp_tokenizer_t *tok,
                             hp_tokenizer_stream_t *st, int32_t id,
                             hp_tokenizer_text_t *out, hp_error_t *err)
{
    size_t len;
    const char *b = hp_tokenizer_token_bytes(tok, id, &len);
    if (!b)
        return hp_error_set(err, HP_EBADINPUT,
                            "tokenizer: no token with id %ld", (long)id);
    return hp_tokenizer_utf8_feed(st, (const uint8_t *)b, len, out, err);
}

int hp_tokenizer_decode(const hp_tokenizer_t *tok, const int32_t *ids, size_t n,
                        hp_tokenizer_text_t *out, hp_error_t *err)
{
    hp_tokenizer_stream_t st;
    hp_tokenizer_stream_init(&st);
    for (size_t i = 0; i < n; i++) {
        int rc = hp_tokenizer_stream_push(tok, &st, ids[i], out, err);
        if (rc)
            return rc;
    }
    return hp_tokenizer_stream_flush(&st, out, err);
}
