/* hp_grammar.c - JSON schemas and tool calls to grammars (hp_grammar.h). */
#include "engine/contract/hp_grammar.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_ELEMS  (1u << 20) /* a schema bigger than this is refused */
#define MAX_UNROLL 256        /* minItems / maxItems written out */
#define INT_DIGITS 15
#define EXP_DIGITS 3

/* one alternative under construction */
typedef struct {
    hp_g_elem_t *e;
    uint32_t n, cap;
} seq_t;

typedef struct {
    const cJSON *schema;
    uint32_t rule;
} memo_t;

typedef struct {
    hp_grammar_t *g;
    uint32_t cap_elems, cap_alts, cap_rules, cap_classes, cap_terms, cap_tlen;
    memo_t *memo;
    uint32_t n_memo, cap_memo;
    const cJSON *root; /* what "#" refers to */
    char *msg;
    size_t msg_cap;
    int failed;
    /* shared rules, made on first use (0: not yet) */
    uint32_t ws, value, number, integer, frac, exp, intpart;
    uint32_t digits[INT_DIGITS + 1];
} gb_t;

static const char *const annotations[] = {
    "title",    "description", "default",    "examples", "$schema",   "$id",
    "$comment", "strict",      "deprecated", "readOnly", "writeOnly", NULL};
static const char *const keywords[] = {
    "type",      "properties", "required", "additionalProperties",
    "items",     "minItems",   "maxItems", "minLength",
    "maxLength", "enum",       "const",    "anyOf",
    "allOf",     "$ref",       "$defs",    "definitions",
    NULL};

static int fail(gb_t *b, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static int fail(gb_t *b, const char *fmt, ...)
{
    if (!b->failed) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(b->msg, b->msg_cap, fmt, ap);
        va_end(ap);
    }
    b->failed = 1;
    return -1;
}

static int grow(gb_t *b, void **p, uint32_t *cap, uint32_t need, size_t size)
{
    if (need <= *cap)
        return 0;
    uint32_t c = *cap ? *cap : 16;
    while (c < need)
        c *= 2;
    void *q = realloc(*p, (size_t)c * size);
    if (!q)
        return fail(b, "out of memory compiling the grammar");
    *p = q;
    *cap = c;
    return 0;
}

/* ---- sequences ------------------------------------------------------ */

static void seq_push(gb_t *b, seq_t *s, hp_g_elem_t e)
{
    if (grow(b, (void **)&s->e, &s->cap, s->n + 1, sizeof(*s->e)) == 0)
        s->e[s->n++] = e;
}

static void seq_byte(gb_t *b, seq_t *s, unsigned char c)
{
    seq_push(b, s, (hp_g_elem_t){.type = HP_G_BYTE, .byte = c});
}

static void seq_lit(gb_t *b, seq_t *s, const char *text)
{
    for (; *text; text++)
        seq_byte(b, s, (unsigned char)*text);
}

static void seq_rule(gb_t *b, seq_t *s, uint32_t r)
{
    seq_push(b, s, (hp_g_elem_t){.type = HP_G_RULE, .arg = r});
}

/* a class of the bytes lo..hi and the bytes of `also` */
static void seq_class(gb_t *b, seq_t *s, int lo, int hi, const char *also)
{
    hp_g_class_t c = {{0}};
    for (int i = lo; i <= hi; i++)
        c.bits[i >> 5] |= 1u << (i & 31);
    for (; also && *also; also++)
        c.bits[(unsigned char)*also >> 5] |= 1u << ((unsigned char)*also & 31);
    hp_grammar_t *g = b->g;
    uint32_t k;
    for (k = 0; k < g->n_classes; k++)
        if (!memcmp(&g->classes[k], &c, sizeof(c)))
            break;
    if (k == g->n_classes) {
        if (grow(b, (void **)&g->classes, &b->cap_classes, k + 1, sizeof(c)))
            return;
        g->classes[g->n_classes++] = c;
    }
    seq_push(b, s, (hp_g_elem_t){.type = HP_G_CLASS, .arg = k});
}

static void seq_until(gb_t *b, seq_t *s, const char *term)
{
    hp_grammar_t *g = b->g;
    uint32_t k;
    for (k = 0; k < g->n_terms; k++)
        if (!strcmp(g->terms[k], term))
            break;
    if (k == g->n_terms) {
        if (grow(b, (void **)&g->terms, &b->cap_terms, k + 1,
                 sizeof(*g->terms)))
            return;
        if (grow(b, (void **)&g->term_len, &b->cap_tlen, k + 1,
                 sizeof(uint32_t)))
            return;
        g->terms[k] = strdup(term);
        if (!g->terms[k]) {
            fail(b, "out of memory compiling the grammar");
            return;
        }
        g->term_len[k] = (uint32_t)strlen(term);
        g->n_terms++;
    }
    seq_push(b, s, (hp_g_elem_t){.type = HP_G_UNTIL, .arg = k});
}

/* ---- rules ---------------------------------------------------------- */

static uint32_t new_rule(gb_t *b)
{
    hp_grammar_t *g = b->g;
    if (grow(b, (void **)&g->rules, &b->cap_rules, g->n_rules + 1,
             sizeof(*g->rules)))
        return 0;
    g->rules[g->n_rules] = (hp_g_rule_t){0, 0};
    return g->n_rules++;
}

/* Gives rule r the alternatives s[n] and frees them. */
static uint32_t set_rule(gb_t *b, uint32_t r, seq_t *s, int n)
{
    hp_grammar_t *g = b->g;
    uint32_t total = 0;
    for (int i = 0; i < n; i++)
        total += s[i].n + 1;
    if (g->n_elems + total > MAX_ELEMS)
        fail(b, "the schema is too large (over %u grammar elements)",
             MAX_ELEMS);
    if (!b->failed &&
        !grow(b, (void **)&g->elems, &b->cap_elems, g->n_elems + total,
              sizeof(*g->elems)) &&
        !grow(b, (void **)&g->alts, &b->cap_alts, g->n_alts + (uint32_t)n,
              sizeof(*g->alts))) {
        g->rules[r] = (hp_g_rule_t){g->n_alts, (uint32_t)n};
        for (int i = 0; i < n; i++) {
            g->alts[g->n_alts++] = g->n_elems;
            if (s[i].n)
                memcpy(g->elems + g->n_elems, s[i].e,
                       s[i].n * sizeof(hp_g_elem_t));
            g->n_elems += s[i].n;
            g->elems[g->n_elems++] = (hp_g_elem_t){.type = HP_G_END};
        }
    }
    for (int i = 0; i < n; i++) {
        free(s[i].e);
        s[i] = (seq_t){0};
    }
    return r;
}

static uint32_t make_rule(gb_t *b, seq_t *s, int n)
{
    uint32_t r = new_rule(b);
    if (b->failed) {
        for (int i = 0; i < n; i++)
            free(s[i].e);
        return 0;
    }
    return set_rule(b, r, s, n);
}

/* ---- shared JSON rules ---------------------------------------------- */

static uint32_t ws_rule(gb_t *b)
{
    if (b->ws)
        return b->ws;
    uint32_t next = 0;
    for (int k = HP_GRAMMAR_WS; k >= 0; k--) {
        seq_t s[2] = {{0}};
        if (k < HP_GRAMMAR_WS) {
            seq_class(b, &s[1], 0, -1, " \t\n");
            seq_rule(b, &s[1], next);
        }
        next = make_rule(b, s, k < HP_GRAMMAR_WS ? 2 : 1);
    }
    return b->ws = next;
}

static void seq_ws(gb_t *b, seq_t *s)
{
    seq_rule(b, s, ws_rule(b));
}

/* up to k more digits */
static uint32_t digits(gb_t *b, int k)
{
    if (b->digits[k])
        return b->digits[k];
    seq_t s[2] = {{0}};
    if (k > 0) {
        seq_class(b, &s[1], '0', '9', NULL);
        seq_rule(b, &s[1], digits(b, k - 1));
    }
    return b->digits[k] = make_rule(b, s, k > 0 ? 2 : 1);
}

static uint32_t intpart(gb_t *b)
{
    if (b->intpart)
        return b->intpart;
    seq_t s[2] = {{0}};
    seq_byte(b, &s[0], '0');
    seq_class(b, &s[1], '1', '9', NULL);
    seq_rule(b, &s[1], digits(b, INT_DIGITS - 1));
    return b->intpart = make_rule(b, s, 2);
}

static uint32_t signed_int(gb_t *b, uint32_t frac, uint32_t exp)
{
    seq_t s[2] = {{0}};
    for (int i = 0; i < 2; i++) {
        if (i)
            seq_byte(b, &s[i], '-');
        seq_rule(b, &s[i], intpart(b));
        if (frac)
            seq_rule(b, &s[i], frac);
        if (exp)
            seq_rule(b, &s[i], exp);
    }
    return make_rule(b, s, 2);
}

static uint32_t integer_rule(gb_t *b)
{
    if (!b->integer)
        b->integer = signed_int(b, 0, 0);
    return b->integer;
}

static uint32_t number_rule(gb_t *b)
{
    if (b->number)
        return b->number;
    seq_t s[3] = {{0}};
    seq_byte(b, &s[1], '.');
    seq_class(b, &s[1], '0', '9', NULL);
    seq_rule(b, &s[1], digits(b, INT_DIGITS - 1));
    b->frac = make_rule(b, s, 2);
    seq_t e[3] = {{0}};
    for (int i = 1; i < 3; i++) {
        seq_class(b, &e[i], 0, -1, "eE");
        if (i == 2)
            seq_class(b, &e[i], 0, -1, "+-");
        seq_class(b, &e[i], '0', '9', NULL);
        seq_rule(b, &e[i], digits(b, EXP_DIGITS - 1));
    }
    b->exp = make_rule(b, e, 3);
    return b->number = signed_int(b, b->frac, b->exp);
}

static void seq_string(gb_t *b, seq_t *s, uint32_t lo, uint32_t hi)
{
    seq_byte(b, s, '"');
    seq_push(b, s,
             (hp_g_elem_t){.type = HP_G_STR, .arg = HP_G_STR_ARG(lo, hi)});
}

/* "key": V then rule next, any key */
static void seq_member(gb_t *b, seq_t *s, uint32_t v, uint32_t next)
{
    seq_string(b, s, 0, HP_G_STR_UNBOUNDED);
    seq_ws(b, s);
    seq_byte(b, s, ':');
    seq_ws(b, s);
    seq_rule(b, s, v);
    seq_ws(b, s);
    seq_rule(b, s, next);
}

/* {"k": V, ...} with any keys, values of rule v */
static uint32_t map_rule(gb_t *b, uint32_t v)
{
    uint32_t more = new_rule(b);
    seq_t m[2] = {{0}};
    seq_byte(b, &m[0], '}');
    seq_byte(b, &m[1], ',');
    seq_ws(b, &m[1]);
    seq_member(b, &m[1], v, more);
    set_rule(b, more, m, 2);
    seq_t r[2] = {{0}};
    seq_byte(b, &r[0], '}');
    seq_member(b, &r[1], v, more);
    uint32_t rest = make_rule(b, r, 2);
    seq_t o[1] = {{0}};
    seq_byte(b, &o[0], '{');
    seq_ws(b, &o[0]);
    seq_rule(b, &o[0], rest);
    return make_rule(b, o, 1);
}

/* [V, ...] of rule v, lo..hi items (hi < 0: unbounded) */
static uint32_t array_rule(gb_t *b, uint32_t v, int lo, int hi)
{
    int k_end = hi >= 0 ? hi : (lo > 1 ? lo : 1);
    uint32_t next = new_rule(b);
    uint32_t last = next;
    /* A_k_end: the end, or (unbounded) the loop of more items */
    seq_t s[2] = {{0}};
    seq_byte(b, &s[0], ']');
    if (hi < 0) {
        seq_byte(b, &s[1], ',');
        seq_ws(b, &s[1]);
        seq_rule(b, &s[1], v);
        seq_ws(b, &s[1]);
        seq_rule(b, &s[1], last);
    }
    set_rule(b, last, s, hi < 0 ? 2 : 1);
    for (int k = k_end - 1; k >= 0 && !b->failed; k--) {
        seq_t a[2] = {{0}};
        int n = 0;
        if (k >= lo)
            seq_byte(b, &a[n++], ']');
        if (k > 0) {
            seq_byte(b, &a[n], ',');
            seq_ws(b, &a[n]);
        }
        seq_rule(b, &a[n], v);
        seq_ws(b, &a[n]);
        seq_rule(b, &a[n], next);
        n++;
        next = make_rule(b, a, n);
    }
    seq_t o[1] = {{0}};
    seq_byte(b, &o[0], '[');
    seq_ws(b, &o[0]);
    seq_rule(b, &o[0], next);
    return make_rule(b, o, 1);
}

/* any JSON value */
static uint32_t value_rule(gb_t *b)
{
    if (b->value)
        return b->value;
    b->value = new_rule(b);
    seq_t s[7] = {{0}};
    seq_rule(b, &s[0], map_rule(b, b->value));
    seq_rule(b, &s[1], array_rule(b, b->value, 0, -1));
    seq_string(b, &s[2], 0, HP_G_STR_UNBOUNDED);
    seq_rule(b, &s[3], number_rule(b));
    seq_lit(b, &s[4], "true");
    seq_lit(b, &s[5], "false");
    seq_lit(b, &s[6], "null");
    return set_rule(b, b->value, s, 7);
}

/* ---- schemas -------------------------------------------------------- */

static int in_list(const char *k, const char *const *list)
{
    for (; *list; list++)
        if (!strcmp(k, *list))
            return 1;
    return 0;
}

static uint32_t schema_rule(gb_t *b, const cJSON *sc, const char *path);

static const cJSON *resolve(gb_t *b, const char *ref, const char *path)
{
    if (!strcmp(ref, "#"))
        return b->root;
    const char *defs = NULL;
    if (!strncmp(ref, "#/$defs/", 8))
        defs = "$defs";
    else if (!strncmp(ref, "#/definitions/", 14))
        defs = "definitions";
    if (!defs) {
        fail(b,
             "unsupported $ref \"%s\" at %s (only \"#\", \"#/$defs/...\" "
             "and \"#/definitions/...\")",
             ref, path);
        return NULL;
    }
    /* the name, JSON-pointer unescaped */
    char name[256];
    size_t n = 0;
    for (const char *p = ref + strlen(defs) + 3; *p && n + 1 < sizeof(name);
         p++) {
        if (p[0] == '~' && (p[1] == '0' || p[1] == '1')) {
            name[n++] = p[1] == '0' ? '~' : '/';
            p++;
        } else {
            name[n++] = *p;
        }
    }
    name[n] = 0;
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(
        cJSON_GetObjectItemCaseSensitive(b->root, defs), name);
    if (!t)
        fail(b, "$ref \"%s\" at %s names no schema", ref, path);
    return t;
}

static int get_count(gb_t *b, const cJSON *sc, const char *key, int dflt,
                     const char *path)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(sc, key);
    if (!v)
        return dflt;
    if (!cJSON_IsNumber(v) || v->valuedouble < 0 ||
        v->valuedouble != (double)(int)v->valuedouble)
        return fail(b, "'%s' at %s must be a non-negative integer", key, path);
    return (int)v->valuedouble;
}

/* a literal: the JSON text of v */
static void seq_json(gb_t *b, seq_t *s, const cJSON *v)
{
    char *t = cJSON_PrintUnformatted(v);
    if (!t) {
        fail(b, "out of memory compiling the grammar");
        return;
    }
    seq_lit(b, s, t);
    cJSON_free(t);
}

static uint32_t object_rule(gb_t *b, const cJSON *sc, const char *path)
{
    const cJSON *props = cJSON_GetObjectItemCaseSensitive(sc, "properties");
    const cJSON *req = cJSON_GetObjectItemCaseSensitive(sc, "required");
    const cJSON *add =
        cJSON_GetObjectItemCaseSensitive(sc, "additionalProperties");
    char sub[512];
    if (props && !cJSON_IsObject(props))
        return fail(b, "'properties' at %s must be an object", path), 0;
    if (req && !cJSON_IsArray(req))
        return fail(b, "'required' at %s must be an array", path), 0;
    const cJSON *r;
    cJSON_ArrayForEach(r, req)
    {
        if (!cJSON_IsString(r) ||
            !cJSON_GetObjectItemCaseSensitive(props, r->valuestring))
            return fail(b,
                        "'required' at %s names a property 'properties' "
                        "does not define",
                        path),
                   0;
    }
    int n = cJSON_GetArraySize(props);
    if (n == 0) {
        if (cJSON_IsFalse(add)) {
            seq_t s[1] = {{0}};
            seq_byte(b, &s[0], '{');
            seq_ws(b, &s[0]);
            seq_byte(b, &s[0], '}');
            return make_rule(b, s, 1);
        }
        snprintf(sub, sizeof(sub), "%s/additionalProperties", path);
        return map_rule(b, cJSON_IsObject(add) ? schema_rule(b, add, sub)
                                               : value_rule(b));
    }
    if (add && !cJSON_IsBool(add) && !cJSON_IsObject(add))
        return fail(b,
                    "'additionalProperties' at %s must be a boolean or a "
                    "schema",
                    path),
               0;
    /* at[i][f]: properties i.. to go, f: one was written (a comma next) */
    uint32_t(*at)[2] = calloc((size_t)n + 1, sizeof(*at));
    if (!at)
        return fail(b, "out of memory compiling the grammar"), 0;
    for (int f = 0; f < 2; f++) {
        seq_t s[1] = {{0}};
        seq_byte(b, &s[0], '}');
        at[n][f] = make_rule(b, s, 1);
    }
    for (int i = n - 1; i >= 0 && !b->failed; i--) {
        const cJSON *p = cJSON_GetArrayItem(props, i);
        int required = 0;
        cJSON_ArrayForEach(r, req) required |=
            !strcmp(r->valuestring, p->string);
        snprintf(sub, sizeof(sub), "%s/properties/%s", path, p->string);
        uint32_t v = schema_rule(b, p, sub);
        cJSON *key = cJSON_CreateString(p->string);
        for (int f = 0; f < 2 && !b->failed; f++) {
            seq_t s[2] = {{0}};
            if (f) {
                seq_byte(b, &s[0], ',');
                seq_ws(b, &s[0]);
            }
            if (key)
                seq_json(b, &s[0], key);
            seq_ws(b, &s[0]);
            seq_byte(b, &s[0], ':');
            seq_ws(b, &s[0]);
            seq_rule(b, &s[0], v);
            seq_ws(b, &s[0]);
            seq_rule(b, &s[0], at[i + 1][1]);
            if (!required)
                seq_rule(b, &s[1], at[i + 1][f]);
            at[i][f] = make_rule(b, s, required ? 1 : 2);
        }
        cJSON_Delete(key);
    }
    seq_t o[1] = {{0}};
    seq_byte(b, &o[0], '{');
    seq_ws(b, &o[0]);
    seq_rule(b, &o[0], at[0][0]);
    free(at);
    return make_rule(b, o, 1);
}

/* the alternative(s) of one type name */
static int type_seqs(gb_t *b, const cJSON *sc, const char *t, seq_t *s,
                     const char *path)
{
    char sub[512];
    if (!strcmp(t, "string")) {
        int lo = get_count(b, sc, "minLength", 0, path);
        int hi = get_count(b, sc, "maxLength", -1, path);
        if (hi >= 0 && hi < lo)
            return fail(b, "'maxLength' at %s is below 'minLength'", path);
        if (lo >= (int)HP_G_STR_UNBOUNDED)
            return fail(b, "'minLength' at %s is above %u", path,
                        HP_G_STR_UNBOUNDED - 1);
        seq_string(b, &s[0], (uint32_t)lo,
                   hi < 0 || hi >= (int)HP_G_STR_UNBOUNDED ? HP_G_STR_UNBOUNDED
                                                           : (uint32_t)hi);
    } else if (!strcmp(t, "number")) {
        seq_rule(b, &s[0], number_rule(b));
    } else if (!strcmp(t, "integer")) {
        seq_rule(b, &s[0], integer_rule(b));
    } else if (!strcmp(t, "boolean")) {
        seq_lit(b, &s[0], "true");
        seq_lit(b, &s[1], "false");
        return 2;
    } else if (!strcmp(t, "null")) {
        seq_lit(b, &s[0], "null");
    } else if (!strcmp(t, "object")) {
        seq_rule(b, &s[0], object_rule(b, sc, path));
    } else if (!strcmp(t, "array")) {
        const cJSON *items = cJSON_GetObjectItemCaseSensitive(sc, "items");
        int lo = get_count(b, sc, "minItems", 0, path);
        int hi = get_count(b, sc, "maxItems", -1, path);
        if (hi >= 0 && hi < lo)
            return fail(b, "'maxItems' at %s is below 'minItems'", path);
        if (lo > MAX_UNROLL || hi > MAX_UNROLL)
            return fail(b, "'minItems' or 'maxItems' at %s is above %d", path,
                        MAX_UNROLL);
        snprintf(sub, sizeof(sub), "%s/items", path);
        uint32_t v = items ? schema_rule(b, items, sub) : value_rule(b);
        seq_rule(b, &s[0], array_rule(b, v, lo, hi));
    } else {
        return fail(b, "unknown type \"%s\" at %s", t, path);
    }
    return 1;
}

static uint32_t schema_rule(gb_t *b, const cJSON *sc, const char *path)
{
    char sub[512];
    if (b->failed)
        return 0;
    if (cJSON_IsTrue(sc))
        return value_rule(b);
    if (!cJSON_IsObject(sc))
        return fail(b, "the schema at %s is not an object", path), 0;
    for (uint32_t i = 0; i < b->n_memo; i++)
        if (b->memo[i].schema == sc)
            return b->memo[i].rule;
    const cJSON *k;
    int validating = 0;
    cJSON_ArrayForEach(k, sc)
    {
        if (in_list(k->string, annotations))
            continue;
        if (!in_list(k->string, keywords))
            return fail(b, "unsupported keyword '%s' at %s", k->string, path),
                   0;
        if (strcmp(k->string, "$defs") && strcmp(k->string, "definitions") &&
            strcmp(k->string, "$ref"))
            validating = 1;
    }
    const cJSON *ref = cJSON_GetObjectItemCaseSensitive(sc, "$ref");
    if (ref) {
        if (!cJSON_IsString(ref))
            return fail(b, "'$ref' at %s must be a string", path), 0;
        if (validating)
            return fail(b, "'$ref' at %s has sibling keywords", path), 0;
        const cJSON *t = resolve(b, ref->valuestring, path);
        return t ? schema_rule(b, t, ref->valuestring) : 0;
    }
    const cJSON *all = cJSON_GetObjectItemCaseSensitive(sc, "allOf");
    if (all) {
        /* only the allOf: [{$ref}] pydantic writes */
        int others = 0;
        cJSON_ArrayForEach(k, sc) others +=
            !in_list(k->string, annotations) && strcmp(k->string, "allOf");
        if (!cJSON_IsArray(all) || cJSON_GetArraySize(all) != 1 || others)
            return fail(b,
                        "'allOf' at %s is supported with one schema and no "
                        "other keyword only",
                        path),
                   0;
        snprintf(sub, sizeof(sub), "%s/allOf/0", path);
        return schema_rule(b, cJSON_GetArrayItem(all, 0), sub);
    }
    uint32_t rule = new_rule(b);
    if (b->failed || grow(b, (void **)&b->memo, &b->cap_memo, b->n_memo + 1,
                          sizeof(*b->memo)))
        return 0;
    b->memo[b->n_memo++] = (memo_t){sc, rule};
    const cJSON *en = cJSON_GetObjectItemCaseSensitive(sc, "enum");
    const cJSON *cn = cJSON_GetObjectItemCaseSensitive(sc, "const");
    const cJSON *any = cJSON_GetObjectItemCaseSensitive(sc, "anyOf");
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(sc, "type");
    int n = 0, cap = 0;
    seq_t *s = NULL;
    if (en || cn) {
        if (en && (!cJSON_IsArray(en) || cJSON_GetArraySize(en) == 0))
            return fail(b, "'enum' at %s must be a non-empty array", path), 0;
        const cJSON *v = en ? en->child : cn;
        for (; v && !b->failed; v = en ? v->next : NULL) {
            if (grow(b, (void **)&s, (uint32_t *)&cap, (uint32_t)n + 1,
                     sizeof(*s)))
                break;
            s[n] = (seq_t){0};
            seq_json(b, &s[n++], v);
        }
    } else if (any) {
        if (!cJSON_IsArray(any) || cJSON_GetArraySize(any) == 0)
            return fail(b, "'anyOf' at %s must be a non-empty array", path), 0;
        int i = 0;
        cJSON_ArrayForEach(k, any)
        {
            snprintf(sub, sizeof(sub), "%s/anyOf/%d", path, i++);
            uint32_t r = schema_rule(b, k, sub);
            if (b->failed || grow(b, (void **)&s, (uint32_t *)&cap,
                                  (uint32_t)n + 1, sizeof(*s)))
                break;
            s[n] = (seq_t){0};
            seq_rule(b, &s[n++], r);
        }
    } else if (type) {
        int nt = cJSON_IsArray(type) ? cJSON_GetArraySize(type) : 1;
        for (int i = 0; i < nt && !b->failed; i++) {
            const cJSON *t =
                cJSON_IsArray(type) ? cJSON_GetArrayItem(type, i) : type;
            if (!cJSON_IsString(t)) {
                fail(b, "'type' at %s must be a name or a list of names", path);
                break;
            }
            if (grow(b, (void **)&s, (uint32_t *)&cap, (uint32_t)n + 2,
                     sizeof(*s)))
                break;
            s[n] = s[n + 1] = (seq_t){0};
            int m = type_seqs(b, sc, t->valuestring, s + n, path);
            n += m > 0 ? m : 0;
        }
    } else {
        if (!grow(b, (void **)&s, (uint32_t *)&cap, 1, sizeof(*s))) {
            s[0] = (seq_t){0};
            seq_rule(b, &s[n++], value_rule(b));
        }
    }
    if (!b->failed)
        set_rule(b, rule, s, n);
    for (int i = 0; i < n; i++)
        free(s[i].e);
    free(s);
    return b->failed ? 0 : rule;
}

/* ---- tool calls ----------------------------------------------------- */

static const cJSON *deref(gb_t *b, const cJSON *sc)
{
    for (int i = 0; i < 8 && cJSON_IsObject(sc); i++) {
        const cJSON *ref = cJSON_GetObjectItemCaseSensitive(sc, "$ref");
        if (!cJSON_IsString(ref))
            break;
        sc = resolve(b, ref->valuestring, "tools");
    }
    return sc;
}

/* one call of tool fn, in the template's syntax */
static uint32_t call_rule(gb_t *b, const cJSON *fn, int xml)
{
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(fn, "name");
    const cJSON *params = cJSON_GetObjectItemCaseSensitive(fn, "parameters");
    char path[300];
    snprintf(path, sizeof(path), "#(%s.parameters)",
             cJSON_IsString(name) ? name->valuestring : "?");
    if (!cJSON_IsString(name))
        return fail(b, "a tool has no function name"), 0;
    b->root = params; /* its $refs are the tool's own */
    seq_t s[1] = {{0}};
    if (!xml) {
        seq_lit(b, &s[0], "<tool_call>\n{\"name\": ");
        seq_json(b, &s[0], name);
        seq_lit(b, &s[0], ", \"arguments\": ");
        if (params)
            seq_rule(b, &s[0], schema_rule(b, params, path));
        else
            seq_lit(b, &s[0], "{}");
        seq_lit(b, &s[0], "}\n</tool_call>");
        return make_rule(b, s, 1);
    }
    /* XML: the properties in order, each required one, each optional one
     * or not; a plain string is text up to "\n</parameter>", any other a
     * JSON value (as hp_tool_parse reads them back) */
    const cJSON *sc = deref(b, params);
    const cJSON *props = cJSON_GetObjectItemCaseSensitive(sc, "properties");
    const cJSON *req = cJSON_GetObjectItemCaseSensitive(sc, "required");
    if (params && !b->failed)
        schema_rule(b, params, path); /* unsupported keywords fail here too */
    int n = cJSON_GetArraySize(props);
    uint32_t next = 0;
    {
        seq_t e[1] = {{0}};
        next = make_rule(b, e, 1);
    }
    for (int i = n - 1; i >= 0 && !b->failed; i--) {
        const cJSON *p = cJSON_GetArrayItem(props, i), *r;
        int required = 0;
        cJSON_ArrayForEach(r, req) required |=
            cJSON_IsString(r) && !strcmp(r->valuestring, p->string);
        const cJSON *ps = deref(b, p);
        const cJSON *type = cJSON_GetObjectItemCaseSensitive(ps, "type");
        const cJSON *en = cJSON_GetObjectItemCaseSensitive(ps, "enum");
        int text = cJSON_IsString(type) && !strcmp(type->valuestring, "string");
        seq_t a[64] = {{0}};
        int na = 0;
        if (text && cJSON_IsArray(en)) {
            const cJSON *v;
            cJSON_ArrayForEach(v, en)
            {
                if (!cJSON_IsString(v) || na == 63)
                    continue;
                seq_lit(b, &a[na], "<parameter=");
                seq_lit(b, &a[na], p->string);
                seq_lit(b, &a[na], ">\n");
                seq_lit(b, &a[na], v->valuestring);
                seq_lit(b, &a[na], "\n</parameter>\n");
                seq_rule(b, &a[na++], next);
            }
        } else {
            char sub[512];
            snprintf(sub, sizeof(sub), "%s/properties/%s", path, p->string);
            seq_lit(b, &a[0], "<parameter=");
            seq_lit(b, &a[0], p->string);
            seq_lit(b, &a[0], ">\n");
            if (text) {
                seq_until(b, &a[0], "\n</parameter>");
            } else {
                seq_rule(b, &a[0], schema_rule(b, p, sub));
                seq_lit(b, &a[0], "\n</parameter>");
            }
            seq_lit(b, &a[0], "\n");
            seq_rule(b, &a[0], next);
            na = 1;
        }
        if (!required)
            seq_rule(b, &a[na++], next);
        next = make_rule(b, a, na);
    }
    seq_lit(b, &s[0], "<tool_call>\n<function=");
    seq_lit(b, &s[0], name->valuestring);
    seq_lit(b, &s[0], ">\n");
    seq_rule(b, &s[0], next);
    seq_lit(b, &s[0], "</function>\n</tool_call>");
    return make_rule(b, s, 1);
}

/* One or more calls (parallel) or one, of the tools in `tools` (only
 * `only` if not NULL). */
static uint32_t calls_rule(gb_t *b, const cJSON *tools, const char *only,
                           int parallel, int xml)
{
    const cJSON *t;
    int n = 0, cap = 0;
    seq_t *s = NULL;
    cJSON_ArrayForEach(t, tools)
    {
        const cJSON *fn = cJSON_GetObjectItemCaseSensitive(t, "function");
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(fn, "name");
        if (!cJSON_IsString(name) || (only && strcmp(only, name->valuestring)))
            continue;
        uint32_t r = call_rule(b, fn, xml);
        if (b->failed ||
            grow(b, (void **)&s, (uint32_t *)&cap, (uint32_t)n + 1, sizeof(*s)))
            break;
        s[n] = (seq_t){0};
        seq_rule(b, &s[n++], r);
    }
    if (!b->failed && n == 0)
        fail(b, only ? "'tool_choice' names a function 'tools' does not have"
                     : "'tool_choice' \"required\" needs 'tools'");
    uint32_t one = b->failed ? 0 : make_rule(b, s, n);
    if (b->failed)
        for (int i = 0; i < n; i++)
            free(s[i].e);
    free(s);
    if (b->failed || !parallel)
        return one;
    uint32_t more = new_rule(b);
    seq_t m[2] = {{0}};
    seq_byte(b, &m[1], '\n');
    seq_rule(b, &m[1], one);
    seq_rule(b, &m[1], more);
    set_rule(b, more, m, 2);
    seq_t c[1] = {{0}};
    seq_rule(b, &c[0], one);
    seq_rule(b, &c[0], more);
    return make_rule(b, c, 1);
}

/* ---- requests ------------------------------------------------------- */

static void gb_free(gb_t *b)
{
    hp_grammar_free(b->g);
    b->g = NULL;
    free(b->memo);
}

static int response_rule(gb_t *b, const cJSON *rf, uint32_t *out)
{
    *out = 0;
    if (!rf || cJSON_IsNull(rf))
        return 0;
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(rf, "type");
    if (!cJSON_IsObject(rf) || !cJSON_IsString(type))
        return fail(b, "'response_format' must be an object with a 'type'");
    if (!strcmp(type->valuestring, "text"))
        return 0;
    if (!strcmp(type->valuestring, "json_object")) {
        *out = map_rule(b, value_rule(b));
        return b->failed ? -1 : 0;
    }
    if (strcmp(type->valuestring, "json_schema"))
        return fail(b,
                    "'response_format' type must be \"text\", "
                    "\"json_object\" or \"json_schema\", not \"%s\"",
                    type->valuestring);
    const cJSON *js = cJSON_GetObjectItemCaseSensitive(rf, "json_schema");
    const cJSON *sc = cJSON_GetObjectItemCaseSensitive(js, "schema");
    if (!cJSON_IsObject(js))
        return fail(b, "'response_format' of type \"json_schema\" needs a "
                       "'json_schema' object");
    if (!cJSON_IsObject(sc) && !cJSON_IsBool(sc))
        return fail(b, "'response_format.json_schema' needs a 'schema' "
                       "object");
    b->root = sc;
    *out = schema_rule(b, sc, "#");
    return b->failed ? -1 : 0;
}

static hp_grammar_t *gb_init(gb_t *b, char *msg, size_t cap)
{
    memset(b, 0, sizeof(*b));
    b->msg = msg;
    b->msg_cap = cap;
    b->g = calloc(1, sizeof(hp_grammar_t));
    if (!b->g) {
        fail(b, "out of memory compiling the grammar");
        return NULL;
    }
    new_rule(b); /* rule 0: the output */
    return b->g;
}

int hp_grammar_compile_json(const cJSON *spec, const hp_grammar_opts_t *opts,
                            hp_grammar_t **out, char *msg, size_t cap,
                            const char **param)
{
    gb_t b;
    uint32_t json = 0, calls = 0;
    *out = NULL;
    *param = "response_format";
    if (!gb_init(&b, msg, cap))
        return -1;
    response_rule(&b, cJSON_GetObjectItemCaseSensitive(spec, "response_format"),
                  &json);
    const cJSON *tools = cJSON_GetObjectItemCaseSensitive(spec, "tools");
    const cJSON *choice = cJSON_GetObjectItemCaseSensitive(spec, "tool_choice");
    const cJSON *par =
        cJSON_GetObjectItemCaseSensitive(spec, "parallel_tool_calls");
    const char *only = NULL;
    int want = 0;
    if (cJSON_IsObject(choice)) {
        const cJSON *n = cJSON_GetObjectItemCaseSensitive(
            cJSON_GetObjectItemCaseSensitive(choice, "function"), "name");
        only = cJSON_IsString(n) ? n->valuestring : "";
        want = 1;
    } else if (cJSON_IsString(choice) &&
               !strcmp(choice->valuestring, "required")) {
        want = 1;
    } else if (json && cJSON_GetArraySize(tools) > 0 &&
               !(cJSON_IsString(choice) &&
                 !strcmp(choice->valuestring, "none"))) {
        want = 1; /* auto: the JSON answer or calls */
    }
    if (!b.failed && want) {
        *param = cJSON_IsArray(tools) ? "tools" : "tool_choice";
        calls = calls_rule(&b, tools, only, !cJSON_IsFalse(par) && !only,
                           opts && opts->tools == HP_GRAMMAR_TOOLS_XML);
        if (!b.failed && cJSON_IsObject(choice))
            json = 0; /* a named call is the whole answer */
        if (!b.failed && cJSON_IsString(choice) &&
            !strcmp(choice->valuestring, "required"))
            json = 0;
    }
    if (b.failed) {
        gb_free(&b);
        return -1;
    }
    if (!json && !calls) {
        gb_free(&b);
        return 0;
    }
    seq_t s[2] = {{0}};
    int n = 0;
    if (json)
        seq_rule(&b, &s[n++], json);
    if (calls)
        seq_rule(&b, &s[n++], calls);
    uint32_t body = make_rule(&b, s, n);
    seq_t top[1] = {{0}};
    if (opts && opts->thinking) {
        seq_until(&b, &top[0], "</think>");
        seq_lit(&b, &top[0], "\n\n");
    }
    seq_rule(&b, &top[0], body);
    set_rule(&b, 0, top, 1);
    if (b.failed) {
        gb_free(&b);
        return -1;
    }
    free(b.memo);
    *out = b.g;
    return 0;
}

int hp_grammar_compile(const char *spec, size_t len,
                       const hp_grammar_opts_t *opts, hp_grammar_t **out,
                       char *msg, size_t cap, const char **param)
{
    cJSON *j = cJSON_ParseWithLength(spec, len);
    *out = NULL;
    *param = "response_format";
    if (!cJSON_IsObject(j)) {
        cJSON_Delete(j);
        snprintf(msg, cap, "the constraint is not a JSON object");
        return -1;
    }
    int rc = hp_grammar_compile_json(j, opts, out, msg, cap, param);
    cJSON_Delete(j);
    return rc;
}

int hp_grammar_schema(const cJSON *schema, hp_grammar_t **out, char *msg,
                      size_t cap)
{
    gb_t b;
    *out = NULL;
    if (!gb_init(&b, msg, cap))
        return -1;
    b.root = schema;
    uint32_t r = schema_rule(&b, schema, "#");
    seq_t s[1] = {{0}};
    seq_rule(&b, &s[0], r);
    if (!b.failed)
        set_rule(&b, 0, s, 1);
    else
        free(s[0].e);
    if (b.failed) {
        gb_free(&b);
        return -1;
    }
    free(b.memo);
    *out = b.g;
    return 0;
}

void hp_grammar_free(hp_grammar_t *g)
{
    if (!g)
        return;
    for (uint32_t i = 0; i < g->n_terms; i++)
        free(g->terms[i]);
    free(g->terms);
    free(g->term_len);
    free(g->elems);
    free(g->alts);
    free(g->rules);
    free(g->classes);
    free(g);
}
