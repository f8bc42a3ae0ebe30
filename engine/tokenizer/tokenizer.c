/*
 * tokenizer.c - loading an HF tokenizer.json into the tables of a byte-level
 * BPE tokenizer (vocabulary, merges, added tokens, normaliser, pre-tokenizer
 * steps) and the small lookups on them. Encoding is tokenizer_encode.c.
 */
#include "engine/tokenizer/tokenizer_impl.h"

#include <cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

/* Default pre-tokenizer regex of ByteLevel(use_regex = true), GPT-2's. */
static const char gpt2_pattern[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+"
    "|\\s+(?!\\S)|\\s+";

typedef struct {
    const char *path;
    hp_error_t *err;
} load_ctx_t;

static int bad(load_ctx_t *c, const char *fmt, const char *what)
{
    char msg[256];
    snprintf(msg, sizeof(msg), fmt, what);
    return hp_error_set(c->err, HP_EMODEL, "%s: %s", c->path, msg);
}

static int nomem(load_ctx_t *c)
{
    return hp_error_set(c->err, HP_ENOMEM,
                        "%s: out of memory loading the tokenizer", c->path);
}

static int read_file(const char *path, char **data, size_t *len,
                     hp_error_t *err)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return hp_error_set(err, HP_EIO, "%s: %s", path, strerror(errno));
    size_t cap = 1 << 20, n = 0;
    char *buf = malloc(cap);
    while (buf) {
        size_t got = fread(buf + n, 1, cap - n, f);
        n += got;
        if (n < cap)
            break;
        char *nb = cap > SIZE_MAX / 2 ? NULL : realloc(buf, cap * 2);
        if (!nb) {
            free(buf);
            buf = NULL;
            break;
        }
        buf = nb;
        cap *= 2;
    }
    int rerr = ferror(f);
    fclose(f);
    if (!buf)
        return hp_error_set(err, HP_ENOMEM, "%s: out of memory reading it",
                            path);
    if (rerr) {
        free(buf);
        return hp_error_set(err, HP_EIO, "%s: read error", path);
    }
    *data = buf;
    *len = n;
    return HP_OK;
}

/* ---- string arena ---- */

static int strs_add(hp_tokenizer_t *tok, const char *s, size_t n, uint32_t *off)
{
    if (tok->strs_len + n + 1 > tok->strs_cap) {
        size_t cap = tok->strs_cap ? tok->strs_cap : 1 << 20;
        while (cap < tok->strs_len + n + 1)
            cap *= 2;
        if (cap > UINT32_MAX)
            return -1;
        char *ns = realloc(tok->strs, cap);
        if (!ns)
            return -1;
        tok->strs = ns;
        tok->strs_cap = cap;
    }
    memcpy(tok->strs + tok->strs_len, s, n);
    tok->strs[tok->strs_len + n] = 0;
    *off = (uint32_t)tok->strs_len;
    tok->strs_len += n + 1;
    return 0;
}

/* ---- vocabulary hash ---- */

int32_t hp_tokenizer_vocab_find(const hp_tokenizer_t *tok, const char *s,
                                size_t len)
{
    if (!tok->vocab_slot)
        return -1;
    uint32_t i = (uint32_t)XXH3_64bits(s, len) & tok->vocab_mask;
    for (;;) {
        uint32_t e = tok->vocab_slot[i];
        if (!e)
            return -1;
        e--;
        if (tok->voc_len[e] == len &&
            !memcmp(tok->strs + tok->voc_off[e], s, len))
            return tok->voc_id[e];
        i = (i + 1) & tok->vocab_mask;
    }
}

static uint32_t pow2_at_least(size_t n)
{
    uint32_t p = 16;
    while (p < n)
        p <<= 1;
    return p;
}

/* Ids are dense in practice; this bound keeps the per-id tables sane. */
#define MAX_ID (1 << 24)

static int parse_id(const cJSON *v, int32_t *id)
{
    if (!cJSON_IsNumber(v))
        return -1;
    double d = v->valuedouble;
    if (!(d >= 0 && d < (double)MAX_ID) || d != (double)(int32_t)d)
        return -1;
    *id = (int32_t)d;
    return 0;
}

static int load_vocab(hp_tokenizer_t *tok, const cJSON *vocab, load_ctx_t *c)
{
    if (!cJSON_IsObject(vocab))
        return bad(c, "%s is not an object", "model.vocab");
    size_t n = (size_t)cJSON_GetArraySize(vocab);
    tok->voc_off = malloc((n + 1) * sizeof(uint32_t));
    tok->voc_len = malloc((n + 1) * sizeof(uint32_t));
    tok->voc_id = malloc((n + 1) * sizeof(int32_t));
    uint32_t slots = pow2_at_least(2 * n + 2);
    tok->vocab_slot = calloc(slots, sizeof(uint32_t));
    if (!tok->voc_off || !tok->voc_len || !tok->voc_id || !tok->vocab_slot)
        return nomem(c);
    tok->vocab_mask = slots - 1;
    size_t k = 0;
    for (const cJSON *e = vocab->child; e; e = e->next) {
        int32_t id;
        if (parse_id(e, &id))
            return bad(c, "model.vocab[\"%.100s\"] is not a token id",
                       e->string);
        size_t len = strlen(e->string);
        if ((uint32_t)id + 1 > tok->n_ids)
            tok->n_ids = (uint32_t)id + 1;
        uint32_t i = (uint32_t)XXH3_64bits(e->string, len) & tok->vocab_mask;
        uint32_t slot;
        while ((slot = tok->vocab_slot[i]) != 0) {
            if (tok->voc_len[slot - 1] == len &&
                !memcmp(tok->strs + tok->voc_off[slot - 1], e->string, len))
                break;
            i = (i + 1) & tok->vocab_mask;
        }
        if (slot) { /* a repeated key: the last one wins, as in HF */
            tok->voc_id[slot - 1] = id;
            continue;
        }
        if (strs_add(tok, e->string, len, &tok->voc_off[k]))
            return nomem(c);
        tok->voc_len[k] = (uint32_t)len;
        tok->voc_id[k] = id;
        tok->vocab_slot[i] = (uint32_t)k + 1;
        k++;
    }
    tok->n_vocab = k;
    return HP_OK;
}

/* ---- merges ---- */

static int merge_put(hp_tokenizer_t *tok, int32_t a, int32_t b, uint32_t rank,
                     int32_t new_id)
{
    uint64_t key = (((uint64_t)(uint32_t)a << 32) | (uint32_t)b) + 1;
    uint32_t i = hp_tokenizer_merge_hash(key) & tok->merge_mask;
    hp_tokenizer_merge_t *m;
    while ((m = &tok->merges[i])->key && m->key != key)
        i = (i + 1) & tok->merge_mask;
    if (!m->key)
        tok->n_merges++;
    /* a repeated pair takes its last rank, as HF's HashMap insert does */
    m->key = key;
    m->rank = rank;
    m->new_id = new_id;
    return 0;
}

static int load_merges(hp_tokenizer_t *tok, const cJSON *merges, load_ctx_t *c)
{
    if (merges && !cJSON_IsArray(merges))
        return bad(c, "%s is not an array", "model.merges");
    size_t n = merges ? (size_t)cJSON_GetArraySize(merges) : 0;
    /* load factor 0.3 .. 0.6: small enough to stay in cache longer */
    uint32_t slots = pow2_at_least(n + n / 2 + 2);
    tok->merges = calloc(slots, sizeof(*tok->merges));
    if (!tok->merges)
        return nomem(c);
    tok->merge_mask = slots - 1;
    char *joined = NULL;
    size_t jcap = 0;
    uint32_t rank = 0;
    int rc = HP_OK;
    for (const cJSON *m = merges ? merges->child : NULL; m; m = m->next) {
        const char *a, *b;
        size_t alen, blen;
        if (cJSON_IsString(m)) {
            /* "a b", exactly one space; merges.txt's "#version" header
             * line is skipped, as HF does */
            const char *sp = strchr(m->valuestring, ' ');
            if (!strncmp(m->valuestring, "#version", 8))
                continue;
            if (!sp || strchr(sp + 1, ' ')) {
                rc = bad(c, "merge \"%.100s\" is not two tokens and a space",
                         m->valuestring);
                break;
            }
            a = m->valuestring;
            alen = (size_t)(sp - a);
            b = sp + 1;
            blen = strlen(b);
        } else if (cJSON_IsArray(m) && cJSON_GetArraySize(m) == 2 &&
                   cJSON_IsString(m->child) && cJSON_IsString(m->child->next)) {
            a = m->child->valuestring;
            alen = strlen(a);
            b = m->child->next->valuestring;
            blen = strlen(b);
        } else {
            char where[32];
            snprintf(where, sizeof(where), "%u", rank);
            rc =
                bad(c, "model.merges[%s] is neither \"a b\" nor [a, b]", where);
            break;
        }
        int32_t ia = hp_tokenizer_vocab_find(tok, a, alen);
        int32_t ib = hp_tokenizer_vocab_find(tok, b, blen);
        if (alen + blen + 1 > jcap) {
            jcap = 2 * (alen + blen + 1);
            char *nj = realloc(joined, jcap);
            if (!nj) {
                rc = nomem(c);
                break;
            }
            joined = nj;
        }
        memcpy(joined, a, alen);
        memcpy(joined + alen, b, blen);
        joined[alen + blen] = 0;
        int32_t inew = hp_tokenizer_vocab_find(tok, joined, alen + blen);
        if (ia < 0 || ib < 0 || inew < 0) {
            rc = bad(c,
                     "merge of \"%.200s\" uses a token not in the "
                     "vocabulary",
                     joined);
            break;
        }
        merge_put(tok, ia, ib, rank++, inew);
    }
    free(joined);
    return rc;
}

/* ---- byte alphabet ---- */

static void init_byte_map(hp_tokenizer_t *tok)
{
    /* printable bytes map to themselves, the other 68 to U+0100.. */
    uint32_t next = 0x100;
    for (int b = 0; b < 256; b++) {
        bool keep = (b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) ||
                    (b >= 0xae && b <= 0xff);
        tok->byte_cp[b] = (uint16_t)(keep ? (uint32_t)b : next++);
    }
}

/* Inverse of the byte alphabet: byte of cp, or -1. */
static int cp_byte(const hp_tokenizer_t *tok, uint32_t cp)
{
    if (cp < 0x100) {
        return tok->byte_cp[cp] == cp ? (int)cp : -1;
    }
    if (cp >= 0x100 && cp < 0x144) {
        for (int b = 0; b < 256; b++)
            if (tok->byte_cp[b] == cp)
                return b;
    }
    return -1;
}

/* Bytes a token string decodes to, as HF's ByteLevel decoder does: every
 * character mapped back through the alphabet, or, if one of them is not in
 * it, the string's own UTF-8. */
static int decode_token(const char *s, size_t n, hp_tokenizer_text_t *decs,
                        const int16_t *inv, uint32_t *off, uint32_t *len,
                        hp_error_t *err)
{
    size_t start = decs->len;
    bool mapped = true;
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        size_t k =
            (size_t)hp_tokenizer_utf8_next((const uint8_t *)s + i, n - i, &cp);
        int b = cp < 0x144 ? inv[cp] : -1;
        if (b < 0) {
            mapped = false;
            break;
        }
        char ch = (char)b;
        if (hp_tokenizer_text_append(decs, &ch, 1, err))
            return err->code;
        i += k;
    }
    if (!mapped) {
        decs->len = start;
        if (hp_tokenizer_text_append(decs, s, n, err))
            return err->code;
    }
    *off = (uint32_t)start;
    *len = (uint32_t)(decs->len - start);
    return HP_OK;
}

/* ---- added tokens ---- */

static bool json_bool(const cJSON *o, const char *key, bool dflt)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (cJSON_IsBool(v))
        return cJSON_IsTrue(v);
    return dflt;
}

/* Ids as HF assigns them (it ignores the ids written in the file): a
 * content seen before keeps its id, one in the BPE vocabulary takes that
 * id, anything else the next id after the vocabulary and earlier added
 * tokens. A repeated content takes the later flags. */
static int load_added(hp_tokenizer_t *tok, const cJSON *arr, load_ctx_t *c)
{
    if (!arr || cJSON_IsNull(arr))
        return HP_OK;
    if (!cJSON_IsArray(arr))
        return bad(c, "%s is not an array", "added_tokens");
    size_t n = (size_t)cJSON_GetArraySize(arr);
    tok->added = calloc(n + 1, sizeof(*tok->added));
    if (!tok->added)
        return nomem(c);
    int64_t max_id = -1;
    for (const cJSON *e = arr->child; e; e = e->next) {
        const cJSON *content = cJSON_GetObjectItemCaseSensitive(e, "content");
        int32_t declared;
        if (!cJSON_IsObject(e) || !cJSON_IsString(content) ||
            parse_id(cJSON_GetObjectItemCaseSensitive(e, "id"), &declared))
            return bad(c, "%s needs an id and a content",
                       "every entry of added_tokens");
        size_t len = strlen(content->valuestring);
        if (len == 0)
            continue; /* HF ignores empty added tokens */
        hp_tokenizer_added_t *a = NULL;
        bool was_special = false;
        for (size_t i = 0; i < tok->n_added && !a; i++)
            if (tok->added[i].len == len &&
                !memcmp(tok->strs + tok->added[i].off, content->valuestring,
                        len))
                a = &tok->added[i];
        if (a) {
            was_special = a->special;
        } else {
            a = &tok->added[tok->n_added++];
            if (strs_add(tok, content->valuestring, len, &a->off))
                return nomem(c);
            a->len = (uint32_t)len;
            a->id = hp_tokenizer_vocab_find(tok, content->valuestring, len);
            if (a->id < 0) {
                int64_t v = (int64_t)tok->n_vocab;
                a->id = (int32_t)(max_id >= 0 && (max_id >= v || v == 0)
                                      ? max_id + 1
                                      : v);
            }
            if (a->id >= MAX_ID)
                return bad(c, "%s", "too many added tokens");
            if (a->id > max_id)
                max_id = a->id;
        }
        a->special = json_bool(e, "special", false) || was_special;
        a->lstrip = json_bool(e, "lstrip", false);
        a->rstrip = json_bool(e, "rstrip", false);
        a->single_word = json_bool(e, "single_word", false);
        a->normalized =
            json_bool(e, "normalized", !json_bool(e, "special", false));
        if ((uint32_t)a->id + 1 > tok->n_ids)
            tok->n_ids = (uint32_t)a->id + 1;
    }
    return HP_OK;
}

static int build_index(hp_tokenizer_t *tok, hp_tokenizer_added_index_t *ix,
                       bool normalized, load_ctx_t *c)
{
    size_t n = 0;
    ix->order = malloc((tok->n_added + 1) * sizeof(uint32_t));
    if (!ix->order)
        return nomem(c);
    /* counting sort by first byte, then longest first within a byte */
    uint32_t count[257] = {0};
    for (size_t i = 0; i < tok->n_added; i++) {
        const hp_tokenizer_added_t *a = &tok->added[i];
        if (a->normalized != normalized || a->nlen == 0)
            continue;
        count[(uint8_t)tok->strs[a->noff] + 1]++;
        n++;
    }
    for (int b = 0; b < 256; b++)
        count[b + 1] += count[b];
    memcpy(ix->first, count, sizeof(count));
    uint32_t fill[256];
    memcpy(fill, count, sizeof(fill));
    for (size_t i = 0; i < tok->n_added; i++) {
        const hp_tokenizer_added_t *a = &tok->added[i];
        if (a->normalized != normalized || a->nlen == 0)
            continue;
        ix->order[fill[(uint8_t)tok->strs[a->noff]]++] = (uint32_t)i;
    }
    ix->only_byte = -1;
    for (int b = 0; b < 256; b++)
        if (ix->first[b + 1] - ix->first[b] == n && n > 0)
            ix->only_byte = b;
    for (int b = 0; b < 256; b++) {
        /* insertion sort: a handful of tokens per first byte */
        for (uint32_t i = ix->first[b] + 1; i < ix->first[b + 1]; i++) {
            uint32_t v = ix->order[i], j = i;
            while (j > ix->first[b] &&
                   tok->added[ix->order[j - 1]].nlen < tok->added[v].nlen) {
                ix->order[j] = ix->order[j - 1];
                j--;
            }
            ix->order[j] = v;
        }
    }
    return HP_OK;
}

/* ---- normaliser and pre-tokenizer ---- */

static int load_normalizer(hp_tokenizer_t *tok, const cJSON *n, load_ctx_t *c)
{
    if (!n || cJSON_IsNull(n))
        return HP_OK;
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(n, "type");
    if (!cJSON_IsString(type))
        return bad(c, "%s has no type", "normalizer");
    const char *t = type->valuestring;
    if (!strcmp(t, "Sequence")) {
        const cJSON *list = cJSON_GetObjectItemCaseSensitive(n, "normalizers");
        if (!cJSON_IsArray(list))
            return bad(c, "%s has no normalizers list", "Sequence normalizer");
        for (const cJSON *e = list->child; e; e = e->next) {
            int rc = load_normalizer(tok, e, c);
            if (rc)
                return rc;
        }
        return HP_OK;
    }
    int kind;
    if (!strcmp(t, "NFC"))
        kind = HP_TOKENIZER_NFC;
    else if (!strcmp(t, "NFD"))
        kind = HP_TOKENIZER_NFD;
    else if (!strcmp(t, "NFKC"))
        kind = HP_TOKENIZER_NFKC;
    else if (!strcmp(t, "NFKD"))
        kind = HP_TOKENIZER_NFKD;
    else
        return bad(c, "unsupported normalizer \"%.60s\"", t);
    if (tok->n_norm == (int)(sizeof(tok->norm) / sizeof(tok->norm[0])))
        return bad(c, "%s", "too many normalizers");
    tok->norm[tok->n_norm++] = kind;
    return HP_OK;
}

static int add_step(hp_tokenizer_t *tok, int kind, int behavior, pcre2_code *re,
                    load_ctx_t *c)
{
    if (tok->n_steps == (int)(sizeof(tok->steps) / sizeof(tok->steps[0]))) {
        pcre2_code_free(re);
        return bad(c, "%s", "too many pre-tokenizer steps");
    }
    hp_tokenizer_step_t *s = &tok->steps[tok->n_steps++];
    s->kind = kind;
    s->behavior = behavior;
    s->re = re;
    return HP_OK;
}

static int load_pretok(hp_tokenizer_t *tok, const cJSON *p, load_ctx_t *c,
                       int *n_bytelevel)
{
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(p, "type");
    if (!cJSON_IsString(type))
        return bad(c, "%s has no type", "pre_tokenizer");
    const char *t = type->valuestring;
    if (!strcmp(t, "Sequence")) {
        const cJSON *list =
            cJSON_GetObjectItemCaseSensitive(p, "pretokenizers");
        if (!cJSON_IsArray(list))
            return bad(c, "%s has no pretokenizers list",
                       "Sequence pre_tokenizer");
        for (const cJSON *e = list->child; e; e = e->next) {
            int rc = load_pretok(tok, e, c, n_bytelevel);
            if (rc)
                return rc;
        }
        return HP_OK;
    }
    pcre2_code *re = NULL;
    if (!strcmp(t, "ByteLevel")) {
        (*n_bytelevel)++;
        if (json_bool(p, "add_prefix_space", false)) {
            int rc = add_step(tok, HP_TOKENIZER_STEP_PREFIX_SPACE, 0, NULL, c);
            if (rc)
                return rc;
        }
        if (!json_bool(p, "use_regex", true))
            return HP_OK;
        int rc = hp_tokenizer_regex_compile(gpt2_pattern, strlen(gpt2_pattern),
                                            false, &re, c->err);
        if (rc)
            return rc;
        return add_step(tok, HP_TOKENIZER_STEP_SPLIT, HP_TOKENIZER_ISOLATED, re,
                        c);
    }
    if (!strcmp(t, "Split")) {
        const cJSON *pat = cJSON_GetObjectItemCaseSensitive(p, "pattern");
        const cJSON *beh = cJSON_GetObjectItemCaseSensitive(p, "behavior");
        const cJSON *rx = cJSON_GetObjectItemCaseSensitive(pat, "Regex");
        const cJSON *lit = cJSON_GetObjectItemCaseSensitive(pat, "String");
        int behavior;
        if (!cJSON_IsString(beh))
            return bad(c, "%s has no behavior", "Split pre_tokenizer");
        if (!strcmp(beh->valuestring, "Isolated"))
            behavior = HP_TOKENIZER_ISOLATED;
        else if (!strcmp(beh->valuestring, "Removed"))
            behavior = HP_TOKENIZER_REMOVED;
        else
            return bad(c, "unsupported Split behavior \"%.40s\"",
                       beh->valuestring);
        if (json_bool(p, "invert", false))
            return bad(c, "%s", "unsupported Split with invert: true");
        const cJSON *src = cJSON_IsString(rx) ? rx : lit;
        if (!cJSON_IsString(src))
            return bad(c, "%s has no Regex or String pattern",
                       "Split pre_tokenizer");
        int rc = hp_tokenizer_regex_compile(src->valuestring,
                                            strlen(src->valuestring),
                                            src == lit, &re, c->err);
        if (rc) {
            char m[sizeof(c->err->msg)];
            snprintf(m, sizeof(m), "%s", c->err->msg);
            return hp_error_set(c->err, rc, "%s: %s", c->path, m);
        }
        return add_step(tok, HP_TOKENIZER_STEP_SPLIT, behavior, re, c);
    }
    return bad(c, "unsupported pre_tokenizer \"%.60s\"", t);
}

/* ---- the model section ---- */

static int load_model(hp_tokenizer_t *tok, const cJSON *model, load_ctx_t *c)
{
    if (!cJSON_IsObject(model))
        return bad(c, "%s", "no \"model\" object");
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(model, "type");
    if (type && !(cJSON_IsString(type) && !strcmp(type->valuestring, "BPE")))
        return bad(c, "unsupported model type \"%.40s\" (BPE expected)",
                   cJSON_IsString(type) ? type->valuestring : "?");
    const cJSON *v;
    v = cJSON_GetObjectItemCaseSensitive(model, "dropout");
    if (cJSON_IsNumber(v) && v->valuedouble > 0)
        return bad(c, "%s", "BPE dropout is not supported");
    const char *opt[] = {"continuing_subword_prefix", "end_of_word_suffix"};
    for (int i = 0; i < 2; i++) {
        v = cJSON_GetObjectItemCaseSensitive(model, opt[i]);
        if (cJSON_IsString(v) && v->valuestring[0])
            return bad(c, "unsupported non-empty %s", opt[i]);
    }
    tok->fuse_unk = json_bool(model, "fuse_unk", false);
    tok->byte_fallback = json_bool(model, "byte_fallback", false);
    tok->ignore_merges = json_bool(model, "ignore_merges", false);
    int rc =
        load_vocab(tok, cJSON_GetObjectItemCaseSensitive(model, "vocab"), c);
    if (rc)
        return rc;
    rc = load_merges(tok, cJSON_GetObjectItemCaseSensitive(model, "merges"), c);
    if (rc)
        return rc;
    tok->unk_id = -1;
    v = cJSON_GetObjectItemCaseSensitive(model, "unk_token");
    if (cJSON_IsString(v)) {
        tok->unk_id = hp_tokenizer_vocab_find(tok, v->valuestring,
                                              strlen(v->valuestring));
        if (tok->unk_id < 0)
            return bad(c, "unk_token \"%.60s\" is not in the vocabulary",
                       v->valuestring);
    }
    return HP_OK;
}

/* Per-id tables: token string, decoded bytes, flags; the byte ids. */
static int build_id_tables(hp_tokenizer_t *tok, load_ctx_t *c)
{
    size_t n = tok->n_ids;
    tok->flags = calloc(n + 1, 1);
    tok->str_off = calloc(n + 1, sizeof(uint32_t));
    tok->str_len = calloc(n + 1, sizeof(uint32_t));
    tok->dec_off = calloc(n + 1, sizeof(uint32_t));
    tok->dec_len = calloc(n + 1, sizeof(uint32_t));
    if (!tok->flags || !tok->str_off || !tok->str_len || !tok->dec_off ||
        !tok->dec_len)
        return nomem(c);
    for (size_t e = 0; e < tok->n_vocab; e++) {
        int32_t id = tok->voc_id[e];
        if (tok->flags[id])
            continue; /* two strings, one id: keep the first */
        tok->flags[id] = HP_TOKF_PRESENT;
        tok->str_off[id] = tok->voc_off[e];
        tok->str_len[id] = tok->voc_len[e];
    }
    for (size_t i = 0; i < tok->n_added; i++) {
        const hp_tokenizer_added_t *a = &tok->added[i];
        tok->flags[a->id] = HP_TOKF_PRESENT | HP_TOKF_ADDED |
                            (a->special ? HP_TOKF_SPECIAL : 0);
        tok->str_off[a->id] = a->off;
        tok->str_len[a->id] = a->len;
    }
    int16_t inv[0x144];
    for (uint32_t cp = 0; cp < 0x144; cp++)
        inv[cp] = (int16_t)cp_byte(tok, cp);
    hp_tokenizer_text_t decs = {0};
    for (size_t id = 0; id < n; id++) {
        if (!tok->flags[id])
            continue;
        if (decode_token(tok->strs + tok->str_off[id], tok->str_len[id], &decs,
                         inv, &tok->dec_off[id], &tok->dec_len[id], c->err)) {
            hp_tokenizer_text_free(&decs);
            return nomem(c);
        }
    }
    tok->decs = decs.data;
    tok->decs_len = decs.len;
    for (int b = 0; b < 256; b++) {
        char u[4];
        int k = hp_tokenizer_utf8_put(tok->byte_cp[b], u);
        tok->byte_id[b] = hp_tokenizer_vocab_find(tok, u, (size_t)k);
        tok->byte_fb[b][0] = tok->byte_fb[b][1] = -1;
        if (tok->byte_fallback) {
            for (int j = 0; j < k; j++) {
                char name[8];
                snprintf(name, sizeof(name), "<0x%02X>", (uint8_t)u[j]);
                tok->byte_fb[b][j] =
                    hp_tokenizer_vocab_find(tok, name, strlen(name));
            }
            if (tok->byte_fb[b][0] < 0 || (k == 2 && tok->byte_fb[b][1] < 0))
                tok->byte_fb[b][0] = tok->byte_fb[b][1] = -1;
        }
    }
    return HP_OK;
}

/* Normalised forms of the added tokens that match after normalisation. */
static int normalize_added(hp_tokenizer_t *tok, load_ctx_t *c)
{
    hp_tokenizer_text_t t = {0};
    for (size_t i = 0; i < tok->n_added; i++) {
        hp_tokenizer_added_t *a = &tok->added[i];
        a->noff = a->off;
        a->nlen = a->len;
        if (!a->normalized || tok->n_norm == 0)
            continue;
        int rc =
            hp_tokenizer_normalize(tok, tok->strs + a->off, a->len, &t, c->err);
        if (rc == HP_OK && strs_add(tok, t.data ? t.data : "", t.len, &a->noff))
            rc = nomem(c);
        if (rc) {
            hp_tokenizer_text_free(&t);
            return rc;
        }
        a->nlen = (uint32_t)t.len;
    }
    hp_tokenizer_text_free(&t);
    return HP_OK;
}

int hp_tokenizer_load(hp_tokenizer_t **out, const char *path, hp_error_t *err)
{
    *out = NULL;
    char *data = NULL;
    size_t len = 0;
    int rc = read_file(path, &data, &len, err);
    if (rc)
        return rc;
    load_ctx_t c = {path, err};
    cJSON *root = cJSON_ParseWithLength(data, len);
    free(data);
    if (!root)
        return hp_error_set(err, HP_EMODEL, "%s: not valid JSON", path);
    hp_tokenizer_t *tok = calloc(1, sizeof(*tok));
    if (!tok) {
        cJSON_Delete(root);
        return nomem(&c);
    }
    init_byte_map(tok);
    if (!cJSON_IsObject(root)) {
        rc = bad(&c, "%s", "top level is not an object");
        goto done;
    }
    rc = load_model(tok, cJSON_GetObjectItemCaseSensitive(root, "model"), &c);
    if (!rc)
        rc = load_added(
            tok, cJSON_GetObjectItemCaseSensitive(root, "added_tokens"), &c);
    if (!rc)
        rc = load_normalizer(
            tok, cJSON_GetObjectItemCaseSensitive(root, "normalizer"), &c);
    if (!rc) {
        const cJSON *p =
            cJSON_GetObjectItemCaseSensitive(root, "pre_tokenizer");
        int n_bytelevel = 0;
        if (p && !cJSON_IsNull(p))
            rc = load_pretok(tok, p, &c, &n_bytelevel);
        if (!rc && n_bytelevel == 0)
            rc = bad(&c, "%s",
                     "no ByteLevel pre_tokenizer: only byte-level "
                     "BPE is supported");
    }
    if (!rc && tok->n_ids == 0)
        rc = bad(&c, "%s", "empty vocabulary");
    if (!rc)
        rc = build_id_tables(tok, &c);
    if (!rc)
        rc = normalize_added(tok, &c);
    if (!rc)
        rc = build_index(tok, &tok->raw_index, false, &c);
    if (!rc)
        rc = build_index(tok, &tok->norm_index, true, &c);
    if (!rc && hp_tokenizer_cache_create(tok))
        rc = nomem(&c);
done:
    cJSON_Delete(root);
    if (rc) {
        hp_tokenizer_free(tok);
        return rc;
    }
    *out = tok;
    return HP_OK;
}

void hp_tokenizer_free(hp_tokenizer_t *tok)
{
    if (!tok)
        return;
    hp_tokenizer_cache_destroy(tok);
    for (int i = 0; i < tok->n_steps; i++)
        pcre2_code_free(tok->steps[i].re);
    free(tok->flags);
    free(tok->str_off);
    free(tok->str_len);
    free(tok->dec_off);
    free(tok->dec_len);
    free(tok->strs);
    free(tok->decs);
    free(tok->voc_off);
    free(tok->voc_len);
    free(tok->voc_id);
    free(tok->vocab_slot);
    free(tok->merges);
    free(tok->added);
    free(tok->raw_index.order);
    free(tok->norm_index.order);
    free(tok);
}

/* ---- lookups ---- */

int32_t hp_tokenizer_token_id(const hp_tokenizer_t *tok, const char *token)
{
    size_t len = strlen(token);
    for (size_t i = 0; i < tok->n_added; i++) {
        const hp_tokenizer_added_t *a = &tok->added[i];
        if (a->len == len && !memcmp(tok->strs + a->off, token, len))
            return a->id;
    }
    return hp_tokenizer_vocab_find(tok, token, len);
}

size_t hp_tokenizer_vocab_size(const hp_tokenizer_t *tok)
{
    return tok->n_ids;
}

int hp_tokenizer_is_special(const hp_tokenizer_t *tok, int32_t id)
{
    if (id < 0 || (uint32_t)id >= tok->n_ids)
        return 0;
    return (tok->flags[id] & HP_TOKF_SPECIAL) != 0;
}

const char *hp_tokenizer_token_bytes(const hp_tokenizer_t *tok, int32_t id,
                                     size_t *len)
{
    if (id < 0 || (uint32_t)id >= tok->n_ids || !tok->flags[id])
        return NULL;
    *len = tok->dec_len[id];
    return tok->decs ? tok->decs + tok->dec_off[id] : "";
}

void hp_tokenizer_ids_free(hp_tokenizer_ids_t *ids)
{
    free(ids->ids);
    ids->ids = NULL;
    ids->n = ids->cap = 0;
}

void hp_tokenizer_text_free(hp_tokenizer_text_t *text)
{
    free(text->data);
    text->data = NULL;
    text->len = text->cap = 0;
}
