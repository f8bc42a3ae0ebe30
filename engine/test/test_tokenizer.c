/*
 * test_tokenizer.c - the BPE tokenizer on a small tokenizer.json written
 * here (expected ids derived by hand from its merges), error handling of
 * broken files, streaming decode, and spot checks of the real Qwen3 file.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/tokenizer/tokenizer.h"
#include "t/lib/tap.h"

static char dir[64];

/* ---- building the test tokenizer.json ---- */

typedef struct {
    char *s;
    size_t n, cap;
} buf_t;

static void add(buf_t *b, const char *s, size_t n)
{
    if (b->n + n + 1 > b->cap) {
        b->cap = 2 * (b->n + n + 1);
        b->s = realloc(b->s, b->cap);
        if (!b->s)
            abort();
    }
    memcpy(b->s + b->n, s, n);
    b->n += n;
    b->s[b->n] = 0;
}

static void adds(buf_t *b, const char *s)
{
    add(b, s, strlen(s));
}

/* GPT-2 byte alphabet, straight from the spec (§6): printable bytes map
 * to themselves, the 68 others in order to U+0100, U+0101, ... */
static unsigned byte_cp(int b)
{
    unsigned next = 0x100;
    for (int x = 0; x < 256; x++) {
        int keep = (x >= 0x21 && x <= 0x7e) || (x >= 0xa1 && x <= 0xac) ||
                   (x >= 0xae && x <= 0xff);
        unsigned cp = keep ? (unsigned)x : next++;
        if (x == b)
            return cp;
    }
    return 0;
}

static void add_utf8(buf_t *b, unsigned cp)
{
    char u[4];
    size_t n;
    if (cp < 0x80) {
        u[0] = (char)cp;
        n = 1;
    } else if (cp < 0x800) {
        u[0] = (char)(0xc0 | (cp >> 6));
        u[1] = (char)(0x80 | (cp & 0x3f));
        n = 2;
    } else {
        u[0] = (char)(0xe0 | (cp >> 12));
        u[1] = (char)(0x80 | ((cp >> 6) & 0x3f));
        u[2] = (char)(0x80 | (cp & 0x3f));
        n = 3;
    }
    add(b, u, n);
}

/* The byte-level spelling of raw bytes, escaped for a JSON string. */
static void add_spelling(buf_t *b, const char *raw)
{
    for (const unsigned char *p = (const unsigned char *)raw; *p; p++) {
        unsigned cp = byte_cp(*p);
        if (cp == '"' || cp == '\\')
            adds(b, "\\");
        add_utf8(b, cp);
    }
}

static void add_token(buf_t *b, const char *raw)
{
    adds(b, "\"");
    add_spelling(b, raw);
    adds(b, "\"");
}

/* The merges, as raw byte strings; the vocabulary gets the 256 bytes as
 * ids 0..255 (id = byte value) and then each merge result in order. */
static const char *merges[][2] = {
    {"l", "l"},           /* 256 ll */
    {"h", "e"},           /* 257 he */
    {"he", "ll"},         /* 258 hell */
    {"hell", "o"},        /* 259 hello */
    {" ", "w"},           /* 260 " w" */
    {"o", "r"},           /* 261 or */
    {" w", "or"},         /* 262 " wor" */
    {" wor", "l"},        /* 263 " worl" */
    {" worl", "d"},       /* 264 " world" */
    {"y", "z"},           /* 265 yz: ranks before xy */
    {"x", "y"},           /* 266 xy */
    {"p", "q"},           /* 267 pq: ranks before qr */
    {"q", "r"},           /* 268 qr */
    {"a", "a"},           /* 269 aa */
    {"aa", "aa"},         /* 270 aaaa */
    {"\xe4", "\xb8"},     /* 271 first two bytes of U+4E2D */
    {"\xe4\xb8", "\xad"}, /* 272 U+4E2D */
};
#define N_MERGES ((int)(sizeof(merges) / sizeof(merges[0])))
#define ID_LL    256
#define ID_HE    257
#define ID_HELL  258
#define ID_HELLO 259
#define ID_OR    261
#define ID_WORLD 264
#define ID_YZ    265
#define ID_PQ    267
#define ID_AA    269
#define ID_AAAA  270
#define ID_E4B8  271
#define ID_ZHONG 272
/* added tokens follow the vocabulary (HF numbers them so) */
#define ID_IM_START 273
#define ID_IM_END   274
#define ID_THINK    275
#define ID_X        276
#define ID_XY       277
#define ID_M        278
#define ID_R        279
#define ID_FOO      280
#define ID_EACUTE   281

static const char qwen_regex[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\\\r\\\\n\\\\p{L}\\\\p{N}]?\\\\p{L}+|"
    "\\\\p{N}| ?[^\\\\s\\\\p{L}\\\\p{N}]+[\\\\r\\\\n]*|\\\\s*[\\\\r\\\\n]+|"
    "\\\\s+(?!\\\\S)|\\\\s+";

enum { MERGES_PAIRS, MERGES_STRINGS };
enum { PRE_SPLIT, PRE_BYTELEVEL_PREFIX, PRE_REMOVE_SPACES };

static char *write_tokenizer(const char *name, int merge_form, int pre)
{
    buf_t b = {0};
    adds(&b, "{\"version\": \"1.0\", \"added_tokens\": [");
    static const struct {
        const char *content;
        int special, lstrip, rstrip, single_word, normalized;
    } added[] = {
        {"<|im_start|>", 1, 0, 0, 0, 0}, {"<|im_end|>", 1, 0, 0, 0, 0},
        {"<think>", 0, 0, 0, 0, 0},      {"<x>", 1, 0, 0, 0, 0},
        {"<x>y", 1, 0, 0, 0, 0},         {"<m>", 1, 1, 0, 0, 0},
        {"<r>", 1, 0, 1, 0, 0},          {"foo", 0, 0, 0, 1, 0},
        {"\\u00e9!", 0, 0, 0, 0, 1},
    };
    static const char *tf[] = {"false", "true"};
    for (int i = 0; i < (int)(sizeof(added) / sizeof(added[0])); i++) {
        char line[256];
        snprintf(line, sizeof(line),
                 "%s{\"id\": %d, \"content\": \"%s\", \"special\": %s, "
                 "\"lstrip\": %s, \"rstrip\": %s, \"single_word\": %s, "
                 "\"normalized\": %s}",
                 i ? ", " : "", ID_IM_START + i, added[i].content,
                 tf[added[i].special], tf[added[i].lstrip], tf[added[i].rstrip],
                 tf[added[i].single_word], tf[added[i].normalized]);
        adds(&b, line);
    }
    adds(&b, "], \"normalizer\": {\"type\": \"NFC\"}, \"pre_tokenizer\": ");
    if (pre == PRE_SPLIT) {
        adds(&b, "{\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": "
                 "\"Split\", \"pattern\": {\"Regex\": \"");
        adds(&b, qwen_regex);
        adds(&b, "\"}, \"behavior\": \"Isolated\", \"invert\": false}, "
                 "{\"type\": \"ByteLevel\", \"add_prefix_space\": false, "
                 "\"trim_offsets\": false, "
                 "\"use_regex\": false}]}");
    } else if (pre == PRE_REMOVE_SPACES) {
        /* an Oniguruma \\uHHHH escape, and the Removed behaviour */
        adds(&b, "{\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": "
                 "\"Split\", \"pattern\": {\"Regex\": \"\\\\u0020\"}, "
                 "\"behavior\": \"Removed\", \"invert\": false}, "
                 "{\"type\": \"ByteLevel\", \"add_prefix_space\": false, "
                 "\"trim_offsets\": false, \"use_regex\": false}]}");
    } else {
        adds(&b, "{\"type\": \"ByteLevel\", \"add_prefix_space\": true, "
                 "\"trim_offsets\": false, "
                 "\"use_regex\": true}");
    }
    adds(
        &b,
        ", \"decoder\": {\"type\": \"ByteLevel\", \"add_prefix_space\": false, "
        "\"trim_offsets\": false, \"use_regex\": false}, \"model\": {\"type\": "
        "\"BPE\", \"dropout\": null, \"unk_token\": null, "
        "\"fuse_unk\": false, \"byte_fallback\": false, \"vocab\": {");
    for (int x = 0; x < 256; x++) {
        char raw[2] = {(char)x, 0}, num[32];
        if (x)
            adds(&b, ", ");
        if (x == 0) { /* NUL cannot sit in a C string: spell U+0100 */
            adds(&b, "\"\\u0100\"");
        } else {
            add_token(&b, raw);
        }
        snprintf(num, sizeof(num), ": %d", x);
        adds(&b, num);
    }
    for (int i = 0; i < N_MERGES; i++) {
        char joined[32], num[32];
        snprintf(joined, sizeof(joined), "%s%s", merges[i][0], merges[i][1]);
        adds(&b, ", ");
        add_token(&b, joined);
        snprintf(num, sizeof(num), ": %d", 256 + i);
        adds(&b, num);
    }
    adds(&b, "}, \"merges\": [");
    for (int i = 0; i < N_MERGES; i++) {
        if (i)
            adds(&b, ", ");
        if (merge_form == MERGES_PAIRS) {
            adds(&b, "[");
            add_token(&b, merges[i][0]);
            adds(&b, ", ");
            add_token(&b, merges[i][1]);
            adds(&b, "]");
        } else {
            adds(&b, "\"");
            add_spelling(&b, merges[i][0]);
            adds(&b, " ");
            add_spelling(&b, merges[i][1]);
            adds(&b, "\"");
        }
    }
    adds(&b, "]}}");
    char *path = malloc(strlen(dir) + strlen(name) + 2);
    sprintf(path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(b.s, 1, b.n, f) != b.n || fclose(f))
        abort();
    free(b.s);
    return path;
}

static char *write_raw(const char *name, const char *content)
{
    char *path = malloc(strlen(dir) + strlen(name) + 2);
    sprintf(path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(content, 1, strlen(content), f) != strlen(content) ||
        fclose(f))
        abort();
    return path;
}

/* ---- checking ---- */

static int ids_are(const hp_tokenizer_t *tok, const char *text, size_t len,
                   const int32_t *want, size_t n, const char *what)
{
    hp_tokenizer_ids_t ids = {0};
    hp_error_t err = {0};
    int rc = hp_tokenizer_encode(tok, text, len, &ids, &err);
    int same = rc == HP_OK && ids.n == n &&
               (n == 0 || !memcmp(ids.ids, want, n * sizeof(int32_t)));
    ok(same, "%s", what);
    if (!same) {
        char got[512] = "", exp[512] = "";
        for (size_t i = 0; i < ids.n && strlen(got) < 480; i++)
            sprintf(got + strlen(got), " %d", ids.ids[i]);
        for (size_t i = 0; i < n && strlen(exp) < 480; i++)
            sprintf(exp + strlen(exp), " %d", want[i]);
        tap_diag("  rc %d (%s); got [%s ], want [%s ]", rc, err.msg, got, exp);
    }
    hp_tokenizer_ids_free(&ids);
    return same;
}

#define IDS(tok, text, what, ...)                                              \
    do {                                                                       \
        const int32_t want_[] = {__VA_ARGS__};                                 \
        ids_are(tok, text, strlen(text), want_,                                \
                sizeof(want_) / sizeof(want_[0]), what);                       \
    } while (0)

static void test_merges(const hp_tokenizer_t *tok, const char *form)
{
    tap_diag("merges as %s", form);
    IDS(tok, "hello", "hello: ll, he, hell, hello in rank order", ID_HELLO);
    IDS(tok, "hell", "hell", ID_HELL);
    IDS(tok, "helo", "helo: he + l + o", ID_HE, 'l', 'o');
    IDS(tok, "llo", "llo: ll + o", ID_LL, 'o');
    IDS(tok, "hello world", "two pre-tokens: hello | ' world'", ID_HELLO,
        ID_WORLD);
    IDS(tok, " hello", "' hello': the space stays its own byte (no merge)", ' ',
        ID_HELLO);
    IDS(tok, "xyz", "xyz: lower rank yz wins over xy", 'x', ID_YZ);
    IDS(tok, "pqr", "pqr: lower rank pq wins over qr", ID_PQ, 'r');
    IDS(tok, "aaa", "aaa: ties go leftmost", ID_AA, 'a');
    IDS(tok, "aaaaa", "aaaaa: aa aa then aaaa, one a left", ID_AAAA, 'a');
    IDS(tok, "\xe4\xb8\xad", "U+4E2D through two merges", ID_ZHONG);
    IDS(tok, "it's", "contraction split off by the regex", 'i', 't', '\'', 's');
    IDS(tok, "a 12", "digits one by one", 'a', ' ', '1', '2');
}

static void test_added(const hp_tokenizer_t *tok)
{
    IDS(tok, "<|im_start|>hello<|im_end|>", "special tokens in text",
        ID_IM_START, ID_HELLO, ID_IM_END);
    IDS(tok, "<think>", "a non-special added token matches too", ID_THINK);
    IDS(tok, "<x>yz", "longest added token first", ID_XY, 'z');
    IDS(tok, "<x>z", "shorter one when the longer does not match", ID_X, 'z');
    IDS(tok, "<|im_sta", "a prefix of a token is plain text", '<', '|', 'i',
        'm', '_', 's', 't', 'a');
    IDS(tok, "a  <m>b", "lstrip swallows the spaces before", 'a', ID_M, 'b');
    IDS(tok, "<r>  b", "rstrip swallows the spaces after", ID_R, 'b');
    IDS(tok, "a foo b", "single_word token between spaces", 'a', ' ', ID_FOO,
        ' ', 'b');
    IDS(tok, "afoo", "single_word token inside a word is not matched", 'a', 'f',
        'o', 'o');
    IDS(tok, "e\xcc\x81!", "normalized token matched after NFC", ID_EACUTE);
    IDS(tok, "e\xcc\x81", "NFC composes e + U+0301", 0xc3, 0xa9);
    IDS(tok, "e<|im_end|>\xcc\x81", "NFC does not reach across a token", 'e',
        ID_IM_END, 0xcc, 0x81);

    ok(hp_tokenizer_token_id(tok, "<|im_end|>") == ID_IM_END,
       "token_id of an added token");
    ok(hp_tokenizer_token_id(tok, "\xc4\xa0w") == 260,
       "token_id of a vocabulary token in byte-level spelling");
    ok(hp_tokenizer_token_id(tok, "nope") == -1, "token_id of nothing is -1");
    ok(hp_tokenizer_is_special(tok, ID_IM_END) &&
           !hp_tokenizer_is_special(tok, ID_THINK) &&
           !hp_tokenizer_is_special(tok, ID_HELLO) &&
           !hp_tokenizer_is_special(tok, 1 << 20),
       "is_special follows the special flag");
    ok(hp_tokenizer_vocab_size(tok) == ID_EACUTE + 1,
       "vocab size counts added tokens");
}

static void test_byte_map(const hp_tokenizer_t *tok)
{
    int good = 1;
    for (int b = 0; b < 256; b++) {
        size_t n;
        const char *p = hp_tokenizer_token_bytes(tok, b, &n);
        if (!p || n != 1 || (unsigned char)p[0] != b) {
            tap_diag("  id %d decodes to %zu bytes", b, p ? n : 0);
            good = 0;
        }
    }
    ok(good, "every byte's token decodes to that byte");

    /* every byte value through encode: ASCII as itself, and U+0080..U+00FF
     * as their two UTF-8 bytes */
    good = 1;
    for (int c = 0; c < 256; c++) {
        char s[3];
        size_t n = 0;
        if (c < 0x80) {
            s[n++] = (char)c;
        } else {
            s[n++] = (char)(0xc0 | (c >> 6));
            s[n++] = (char)(0x80 | (c & 0x3f));
        }
        hp_tokenizer_ids_t ids = {0};
        hp_error_t err;
        int rc = hp_tokenizer_encode(tok, s, n, &ids, &err);
        if (rc || ids.n != n || ids.ids[0] != (uint8_t)s[0] ||
            (n == 2 && ids.ids[1] != (uint8_t)s[1])) {
            tap_diag("  U+%04X: rc %d, %zu ids", c, rc, ids.n);
            good = 0;
        }
        hp_tokenizer_ids_free(&ids);
    }
    ok(good, "U+0000..U+00FF encode to their UTF-8 bytes' ids");

    char all[512];
    size_t n = 0;
    for (int c = 1; c < 256; c++) {
        if (c < 0x80) {
            all[n++] = (char)c;
        } else {
            all[n++] = (char)(0xc0 | (c >> 6));
            all[n++] = (char)(0x80 | (c & 0x3f));
        }
    }
    hp_tokenizer_ids_t ids = {0};
    hp_tokenizer_text_t text = {0};
    hp_error_t err;
    int rc = hp_tokenizer_encode(tok, all, n, &ids, &err);
    rc = rc ? rc : hp_tokenizer_decode(tok, ids.ids, ids.n, &text, &err);
    ok(rc == HP_OK && text.len == n && !memcmp(text.data, all, n),
       "U+0001..U+00FF in one text: encode then decode round-trips");
    hp_tokenizer_ids_free(&ids);
    hp_tokenizer_text_free(&text);
}

static void test_malformed_input(const hp_tokenizer_t *tok)
{
    /* U+FFFD = EF BF BD, tokenized as its three bytes */
    IDS(tok,
        "a\xff"
        "b",
        "a lone FF becomes U+FFFD", 'a', 0xef, 0xbf, 0xbd, 'b');
    IDS(tok, "\xe0\x80", "E0 80: two maximal subparts, two U+FFFD", 0xef, 0xbf,
        0xbd, 0xef, 0xbf, 0xbd);
    IDS(tok, "\xe4\xb8", "a truncated sequence is one U+FFFD", 0xef, 0xbf,
        0xbd);
    IDS(tok, "\xed\xa0\x80", "a surrogate is three U+FFFD", 0xef, 0xbf, 0xbd,
        0xef, 0xbf, 0xbd, 0xef, 0xbf, 0xbd);
    IDS(tok, "", "empty text, no ids");
}

static int push_all(const hp_tokenizer_t *tok, hp_tokenizer_stream_t *st,
                    const int32_t *ids, size_t n, hp_tokenizer_text_t *out)
{
    hp_error_t err;
    for (size_t i = 0; i < n; i++)
        if (hp_tokenizer_stream_push(tok, st, ids[i], out, &err))
            return -1;
    return 0;
}

static void test_stream(const hp_tokenizer_t *tok)
{
    hp_tokenizer_stream_t st;
    hp_tokenizer_text_t out = {0};
    hp_error_t err;
    hp_tokenizer_stream_init(&st);
    int32_t a[] = {0xe4};
    push_all(tok, &st, a, 1, &out);
    int held = out.len == 0;
    int32_t b[] = {0xb8};
    push_all(tok, &st, b, 1, &out);
    held = held && out.len == 0;
    int32_t c[] = {0xad};
    push_all(tok, &st, c, 1, &out);
    ok(held && out.len == 3 && !memcmp(out.data, "\xe4\xb8\xad", 3),
       "stream: U+4E2D byte by byte comes out whole at the third token");

    out.len = 0;
    int32_t d[] = {ID_E4B8, 0xad, 'a'};
    push_all(tok, &st, d, 1, &out);
    held = out.len == 0;
    push_all(tok, &st, d + 1, 2, &out);
    ok(held && out.len == 4 &&
           !memcmp(out.data,
                   "\xe4\xb8\xad"
                   "a",
                   4),
       "stream: a token ending mid-character waits for the next");

    out.len = 0;
    int32_t e[] = {0xf0, 0x9f, 0x98, 0x80};
    push_all(tok, &st, e, 4, &out);
    ok(out.len == 4 && !memcmp(out.data, "\xf0\x9f\x98\x80", 4),
       "stream: a 4-byte emoji over four tokens");

    out.len = 0;
    int32_t f[] = {0xe4, 'a'};
    push_all(tok, &st, f, 2, &out);
    ok(out.len == 4 && !memcmp(out.data,
                               "\xef\xbf\xbd"
                               "a",
                               4),
       "stream: a cut-off character becomes U+FFFD, the next byte stays");

    out.len = 0;
    int32_t g[] = {0xff};
    push_all(tok, &st, g, 1, &out);
    ok(out.len == 3 && !memcmp(out.data, "\xef\xbf\xbd", 3),
       "stream: an invalid byte is U+FFFD at once");

    out.len = 0;
    int32_t h[] = {0xf0, 0x9f};
    push_all(tok, &st, h, 2, &out);
    int pending = out.len == 0;
    hp_tokenizer_stream_flush(&st, &out, &err);
    ok(pending && out.len == 3 && !memcmp(out.data, "\xef\xbf\xbd", 3),
       "stream: flush turns a held partial character into one U+FFFD");

    out.len = 0;
    ok(hp_tokenizer_stream_push(tok, &st, 1 << 20, &out, &err) ==
               HP_EBADINPUT &&
           out.len == 0,
       "stream: an unknown id is refused");

    /* any sequence: the pushes plus the flush equal one decode */
    unsigned seed = 12345;
    int same = 1;
    int32_t ids[64];
    size_t nv = hp_tokenizer_vocab_size(tok);
    for (int round = 0; round < 200 && same; round++) {
        size_t n = 1 + round % 40;
        for (size_t i = 0; i < n; i++) {
            seed = seed * 1103515245u + 12345u;
            ids[i] = (int32_t)((seed >> 8) % nv);
        }
        hp_tokenizer_text_t whole = {0}, parts = {0};
        hp_tokenizer_stream_init(&st);
        int rc = hp_tokenizer_decode(tok, ids, n, &whole, &err);
        rc |= push_all(tok, &st, ids, n, &parts);
        rc |= hp_tokenizer_stream_flush(&st, &parts, &err);
        same = rc == 0 && whole.len == parts.len &&
               !memcmp(whole.data, parts.data, whole.len);
        hp_tokenizer_text_free(&whole);
        hp_tokenizer_text_free(&parts);
    }
    ok(same, "stream: pushes + flush == decode on 200 random sequences");
    int32_t bad_id[] = {'a', -5};
    out.len = 0;
    ok(hp_tokenizer_decode(tok, bad_id, 2, &out, &err) == HP_EBADINPUT,
       "decode refuses a negative id");
    hp_tokenizer_text_free(&out);
}

static void test_broken_files(void)
{
    static const struct {
        const char *name, *content;
        int code;
    } cases[] = {
        {"empty.json", "", HP_EMODEL},
        {"truncated.json", "{\"model\": {\"vocab\": {\"a\": 0", HP_EMODEL},
        {"array.json", "[1, 2]", HP_EMODEL},
        {"nomodel.json", "{\"added_tokens\": []}", HP_EMODEL},
        {"novocab.json", "{\"model\": {\"type\": \"BPE\", \"merges\": []}}",
         HP_EMODEL},
        {"badid.json",
         "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": \"x\"}}}",
         HP_EMODEL},
        {"negid.json", "{\"model\": {\"vocab\": {\"a\": -1}}}", HP_EMODEL},
        {"badmerge.json",
         "{\"model\": {\"vocab\": {\"a\": 0, \"b\": 1}, \"merges\": [\"a "
         "c\"]}, \"pre_tokenizer\": {\"type\": \"ByteLevel\"}}",
         HP_EMODEL},
        {"mergetype.json",
         "{\"model\": {\"vocab\": {\"a\": 0}, \"merges\": [7]}}", HP_EMODEL},
        {"wordpiece.json",
         "{\"model\": {\"type\": \"WordPiece\", \"vocab\": {}}}", HP_EMODEL},
        {"nobytelevel.json",
         "{\"model\": {\"vocab\": {\"a\": 0}, \"merges\": []}}", HP_EMODEL},
        {"badnorm.json",
         "{\"model\": {\"vocab\": {\"a\": 0}}, \"normalizer\": {\"type\": "
         "\"Lowercase\"}, \"pre_tokenizer\": {\"type\": \"ByteLevel\"}}",
         HP_EMODEL},
        {"badregex.json",
         "{\"model\": {\"vocab\": {\"a\": 0}}, \"pre_tokenizer\": {\"type\": "
         "\"Sequence\", \"pretokenizers\": [{\"type\": \"Split\", "
         "\"pattern\": {\"Regex\": \"(a\"}, \"behavior\": \"Isolated\"}, "
         "{\"type\": \"ByteLevel\"}]}}",
         HP_EMODEL},
        {"badadded.json",
         "{\"model\": {\"vocab\": {\"a\": 0}}, \"added_tokens\": [{\"id\": "
         "1}], \"pre_tokenizer\": {\"type\": \"ByteLevel\"}}",
         HP_EMODEL},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        char *path = write_raw(cases[i].name, cases[i].content);
        hp_tokenizer_t *tok = (hp_tokenizer_t *)1;
        hp_error_t err = {0};
        int rc = hp_tokenizer_load(&tok, path, &err);
        ok(rc == cases[i].code && tok == NULL && err.msg[0],
           "broken file %s: %s", cases[i].name, err.msg);
        hp_tokenizer_free(rc ? NULL : tok);
        unlink(path);
        free(path);
    }
    hp_tokenizer_t *tok = (hp_tokenizer_t *)1;
    hp_error_t err = {0};
    char missing[128];
    snprintf(missing, sizeof(missing), "%s/does-not-exist.json", dir);
    ok(hp_tokenizer_load(&tok, missing, &err) == HP_EIO && tok == NULL,
       "missing file: %s", err.msg);
}

/* ---- several threads on one tokenizer ---- */

typedef struct {
    const hp_tokenizer_t *tok;
    int failures;
} thread_arg_t;

static const char *thread_texts[] = {
    "hello world",        "<|im_start|>hello<|im_end|>",   "aaaaa xyz pqr",
    "e\xcc\x81! a foo b", "\xe4\xb8\xad\xe4\xb8\xad hell",
};

static void *encode_loop(void *p)
{
    thread_arg_t *a = p;
    hp_tokenizer_ids_t ref[5] = {{0}}, got = {0};
    hp_error_t err;
    for (int i = 0; i < 5; i++)
        hp_tokenizer_encode(a->tok, thread_texts[i], strlen(thread_texts[i]),
                            &ref[i], &err);
    for (int r = 0; r < 2000; r++) {
        int i = r % 5;
        got.n = 0;
        if (hp_tokenizer_encode(a->tok, thread_texts[i],
                                strlen(thread_texts[i]), &got, &err) ||
            got.n != ref[i].n ||
            memcmp(got.ids, ref[i].ids, got.n * sizeof(int32_t)))
            a->failures++;
    }
    for (int i = 0; i < 5; i++)
        hp_tokenizer_ids_free(&ref[i]);
    hp_tokenizer_ids_free(&got);
    return NULL;
}

static void test_threads(const hp_tokenizer_t *tok)
{
    pthread_t th[4];
    thread_arg_t arg[4];
    int failures = 0;
    for (int i = 0; i < 4; i++) {
        arg[i] = (thread_arg_t){tok, 0};
        pthread_create(&th[i], NULL, encode_loop, &arg[i]);
    }
    for (int i = 0; i < 4; i++) {
        pthread_join(th[i], NULL);
        failures += arg[i].failures;
    }
    ok(failures == 0, "4 threads encoding at once agree (%d failures)",
       failures);
}

/* ---- the real Qwen3 tokenizer, facts from the architecture notes §6 ---- */

static void test_qwen3(void)
{
    const char *shared = getenv("HYPIC_SHARED");
    char path[1024];
    snprintf(path, sizeof(path), "%s/data/qwen3-tokenizer/tokenizer.json",
             shared ? shared : "../shared");
    if (access(path, R_OK)) {
        tap_skip("no Qwen3 tokenizer.json (set HYPIC_SHARED)");
        return;
    }
    hp_tokenizer_t *tok;
    hp_error_t err = {0};
    if (!ok(hp_tokenizer_load(&tok, path, &err) == HP_OK, "Qwen3 loads: %s",
            err.msg))
        return;
    ok(hp_tokenizer_vocab_size(tok) == 151669,
       "Qwen3: 151643 BPE + 26 added ids");
    ok(hp_tokenizer_token_id(tok, "<|endoftext|>") == 151643 &&
           hp_tokenizer_token_id(tok, "<|im_start|>") == 151644 &&
           hp_tokenizer_token_id(tok, "<|im_end|>") == 151645 &&
           hp_tokenizer_token_id(tok, "<think>") == 151667 &&
           hp_tokenizer_token_id(tok, "</think>") == 151668,
       "Qwen3: special token ids");
    ok(hp_tokenizer_is_special(tok, 151645) &&
           !hp_tokenizer_is_special(tok, 151667),
       "Qwen3: <|im_end|> special, <think> not");
    IDS(tok, "\n", "Qwen3: newline is 198", 198);
    IDS(tok, "\n\n", "Qwen3: two newlines are 271", 271);
    IDS(tok, "<|im_start|>user\n", "Qwen3: ChatML header starts with 151644",
        151644, hp_tokenizer_token_id(tok, "user"), 198);

    const char *text = "Hi \xe4\xb8\xad\xe6\x96\x87 "
                       "\xf0\x9f\x91\xa8\xe2\x80\x8d\xf0\x9f\x91\xa9 ok";
    hp_tokenizer_ids_t ids = {0};
    hp_tokenizer_text_t out = {0};
    hp_tokenizer_stream_t st;
    hp_tokenizer_stream_init(&st);
    int rc = hp_tokenizer_encode(tok, text, strlen(text), &ids, &err);
    for (size_t i = 0; i < ids.n && !rc; i++)
        rc = hp_tokenizer_stream_push(tok, &st, ids.ids[i], &out, &err);
    rc = rc ? rc : hp_tokenizer_stream_flush(&st, &out, &err);
    ok(rc == HP_OK && out.len == strlen(text) &&
           !memcmp(out.data, text, out.len),
       "Qwen3: CJK + ZWJ emoji stream back token by token");
    hp_tokenizer_ids_free(&ids);
    hp_tokenizer_text_free(&out);
    hp_tokenizer_free(tok);
}

int main(void)
{
    snprintf(dir, sizeof(dir), "/tmp/hypic-tok-XXXXXX");
    if (!mkdtemp(dir)) {
        perror("mkdtemp");
        return 1;
    }
    hp_error_t err = {0};
    char *paths[4] = {
        write_tokenizer("pairs.json", MERGES_PAIRS, PRE_SPLIT),
        write_tokenizer("strings.json", MERGES_STRINGS, PRE_SPLIT),
        write_tokenizer("bytelevel.json", MERGES_PAIRS, PRE_BYTELEVEL_PREFIX),
        write_tokenizer("removed.json", MERGES_PAIRS, PRE_REMOVE_SPACES),
    };
    hp_tokenizer_t *tok = NULL, *tok2 = NULL, *tok3 = NULL, *tok4 = NULL;
    ok(hp_tokenizer_load(&tok, paths[0], &err) == HP_OK, "load: %s", err.msg);
    ok(hp_tokenizer_load(&tok2, paths[1], &err) == HP_OK,
       "load with \"a b\" merges: %s", err.msg);
    ok(hp_tokenizer_load(&tok3, paths[2], &err) == HP_OK,
       "load with a plain ByteLevel pre-tokenizer: %s", err.msg);
    ok(hp_tokenizer_load(&tok4, paths[3], &err) == HP_OK,
       "load with a Split(Removed) pre-tokenizer: %s", err.msg);
    if (!tok || !tok2 || !tok3 || !tok4)
        return tap_done();

    test_merges(tok, "[a, b] pairs");
    test_merges(tok2, "\"a b\" strings");
    IDS(tok3, "hello", "ByteLevel add_prefix_space: ' hello'", ' ', ID_HELLO);
    IDS(tok3, "hello world", "ByteLevel GPT-2 regex: ' hello' ' world'", ' ',
        ID_HELLO, ID_WORLD);
    IDS(tok4, "hello world", "Split \\u0020 Removed drops the space", ID_HELLO,
        'w', ID_OR, 'l', 'd');
    test_added(tok);
    test_byte_map(tok);
    test_malformed_input(tok);
    test_stream(tok);
    test_threads(tok);
    hp_tokenizer_free(tok);
    hp_tokenizer_free(tok2);
    hp_tokenizer_free(tok3);
    hp_tokenizer_free(tok4);
    test_broken_files();
    test_qwen3();

    for (int i = 0; i < 4; i++) {
        unlink(paths[i]);
        free(paths[i]);
    }
    rmdir(dir);
    return tap_done();
}
