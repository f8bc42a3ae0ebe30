/*
 * tokenizer.h - byte-level BPE tokenizer read from an HF tokenizer.json
 * (Qwen2/3/3.5 family), token for token as HF `tokenizers`; no chat
 * template, no BOS/EOS. Spec: qwen3-hybrid-architecture.md §6.
 */
#ifndef HP_TOKENIZER_H
#define HP_TOKENIZER_H

/*
 * One encode: invalid UTF-8 -> U+FFFD (maximal subparts, as Python's
 * bytes.decode(errors="replace")); added tokens matched verbatim in the raw
 * text (leftmost-longest); the rest normalised (NFC), split by the
 * pre-tokenizer regex, mapped through the GPT-2 byte alphabet and merged by
 * BPE rank. A loaded tokenizer is immutable apart from an internal, locked
 * cache: every function below may be called from several threads at once
 * on the same tokenizer.
 */

#include <stddef.h>
#include <stdint.h>

#include "engine/contract/hp_error.h"

typedef struct hp_tokenizer hp_tokenizer_t;

/* A growable array of token ids. Zero-initialise before first use; the
 * functions that take one append to it and grow it with realloc. */
typedef struct {
    int32_t *ids;
    size_t n, cap;
} hp_tokenizer_ids_t;

/* A growable byte buffer, always NUL-terminated once non-empty (the NUL is
 * not counted in len). Zero-initialise before first use; appended to. */
typedef struct {
    char *data;
    size_t len, cap;
} hp_tokenizer_text_t;

/* Streaming decoder state: the bytes of an incomplete UTF-8 sequence held
 * back between tokens. Initialise with hp_tokenizer_stream_init. */
typedef struct {
    uint8_t pend[4];
    uint8_t n;    /* bytes held in pend */
    uint8_t need; /* total length of the sequence being assembled */
} hp_tokenizer_stream_t;

/* Loads the tokenizer.json at path into a new tokenizer (*out; free it with
 * hp_tokenizer_free). Errors: HP_EIO (unreadable), HP_EMODEL (malformed
 * JSON, missing or inconsistent fields, unsupported model/normalizer/
 * pre-tokenizer), HP_ENOMEM. On error *out is NULL and err says why. */
int hp_tokenizer_load(hp_tokenizer_t **out, const char *path, hp_error_t *err);

/* Releases everything the tokenizer owns; NULL is a no-op. */
void hp_tokenizer_free(hp_tokenizer_t *tok);

/* Appends the ids of text[0..len) (any bytes; invalid UTF-8 is replaced by
 * U+FFFD first) to ids. Errors: HP_ENOMEM, HP_EINTERNAL (regex engine
 * failure); ids may then hold a partial result past its old length. */
int hp_tokenizer_encode(const hp_tokenizer_t *tok, const char *text, size_t len,
                        hp_tokenizer_ids_t *ids, hp_error_t *err);

/* Appends the text of ids[0..n) to out, as HF decode with
 * skip_special_tokens=False: token bytes concatenated, invalid UTF-8
 * replaced by U+FFFD. Errors: HP_EBADINPUT (an id with no token; out keeps
 * the text before it), HP_ENOMEM. */
int hp_tokenizer_decode(const hp_tokenizer_t *tok, const int32_t *ids, size_t n,
                        hp_tokenizer_text_t *out, hp_error_t *err);

/* Resets a streaming decoder (nothing pending). */
void hp_tokenizer_stream_init(hp_tokenizer_stream_t *st);

/* Appends to out the complete UTF-8 text that token id finishes, holding
 * back the bytes of a character that is still incomplete; invalid
 * sequences come out as U+FFFD. Pushing a sequence and then flushing gives
 * exactly hp_tokenizer_decode of it. Errors: HP_EBADINPUT (unknown id;
 * the state is unchanged), HP_ENOMEM. */
int hp_tokenizer_stream_push(const hp_tokenizer_t *tok,
                             hp_tokenizer_stream_t *st, int32_t id,
                             hp_tokenizer_text_t *out, hp_error_t *err);

/* Ends a stream: a held-back incomplete character becomes one U+FFFD.
 * Leaves st reset. Errors: HP_ENOMEM. */
int hp_tokenizer_stream_flush(hp_tokenizer_stream_t *st,
                              hp_tokenizer_text_t *out, hp_error_t *err);

/* The id of a token given by its exact string: added tokens first (e.g.
 * "<|im_end|>"), then the BPE vocabulary in its byte-level spelling (e.g.
 * "Ġthe"). -1 if there is none. */
int32_t hp_tokenizer_token_id(const hp_tokenizer_t *tok, const char *token);

/* One more than the largest id (151669 for Qwen3: 151643 BPE + 26 added);
 * model embedding tables are usually padded beyond it. */
size_t hp_tokenizer_vocab_size(const hp_tokenizer_t *tok);

/* 1 if id is an added token marked "special" (e.g. <|im_end|>, but not
 * <think> in Qwen3), else 0 (also for unknown ids). */
int hp_tokenizer_is_special(const hp_tokenizer_t *tok, int32_t id);

/* The bytes id decodes to (not NUL-terminated, *len set; may be a partial
 * UTF-8 character), owned by the tokenizer; NULL if id has no token. */
const char *hp_tokenizer_token_bytes(const hp_tokenizer_t *tok, int32_t id,
                                     size_t *len);

/* Releases the storage of ids / text and zeroes them. */
void hp_tokenizer_ids_free(hp_tokenizer_ids_t *ids);
void hp_tokenizer_text_free(hp_tokenizer_text_t *text);

#endif
