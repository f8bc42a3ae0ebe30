/* test_grammar.c - structured output: JSON schemas and tool calls compiled
 * to grammars (hp_grammar.h), the recogniser on texts it must take and
 * refuse, token masks against every token of real tokenizers fed one by
 * one, the grammar cache, and the decoder under a grammar. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "engine/contract/hp_grammar.h"
#include "engine/forward/decoder.h"
#include "engine/forward/gmask.h"
#include "t/lib/tap.h"

static const char *PYD =
    "{\"$defs\": {\"Item\": {\"properties\": {\"name\": {\"title\": \"Name\","
    " \"type\": \"string\"}, \"qty\": {\"type\": \"integer\"}}, \"required\":"
    " [\"name\", \"qty\"], \"title\": \"Item\", \"type\": \"object\","
    " \"additionalProperties\": false}},"
    " \"properties\": {\"id\": {\"type\": \"integer\"},"
    " \"tags\": {\"type\": \"array\", \"items\": {\"type\": \"string\"},"
    " \"maxItems\": 3},"
    " \"kind\": {\"enum\": [\"a\", \"b\"]},"
    " \"note\": {\"anyOf\": [{\"type\": \"string\"}, {\"type\": \"null\"}],"
    " \"default\": null},"
    " \"items\": {\"type\": \"array\", \"items\": {\"$ref\": "
    "\"#/$defs/Item\"}},"
    " \"ok\": {\"type\": \"boolean\"}, \"score\": {\"type\": \"number\"}},"
    " \"required\": [\"id\", \"tags\", \"kind\", \"items\", \"ok\", \"score\"],"
    " \"title\": \"Model\", \"type\": \"object\","
    " \"additionalProperties\": false}";

static hp_grammar_t *from_schema(const char *json, char *msg, size_t cap)
{
    cJSON *j = cJSON_Parse(json);
    hp_grammar_t *g = NULL;
    if (hp_grammar_schema(j, &g, msg, cap))
        g = NULL;
    cJSON_Delete(j);
    return g;
}

static hp_grammar_t *from_request(const char *spec, int xml, int think,
                                  char *msg, size_t cap, const char **param)
{
    hp_grammar_opts_t o = {.tools = xml ? HP_GRAMMAR_TOOLS_XML
                                        : HP_GRAMMAR_TOOLS_JSON,
                           .thinking = think};
    hp_grammar_t *g = NULL;
    const char *p;
    msg[0] = 0;
    if (hp_grammar_compile(spec, strlen(spec), &o, &g, msg, cap,
                           param ? param : &p))
        return NULL;
    return g;
}

/* the whole of text matches */
static int takes(const hp_grammar_t *g, const char *text)
{
    hp_gmatch_t m;
    hp_error_t err;
    if (hp_gmatch_init(&m, g, &err) != HP_OK)
        return 0;
    int ok = hp_gmatch_feed(&m, text, strlen(text)) && hp_gmatch_may_end(&m);
    hp_gmatch_free(&m);
    return ok;
}

static void schemas(void)
{
    char msg[400];
    hp_grammar_t *g = from_schema(PYD, msg, sizeof(msg));
    ok(g, "a pydantic schema compiles ($defs, $ref, anyOf, enum, arrays)");
    if (!g)
        return;
    static const char *good[] = {
        "{\"id\": 12, \"tags\": [\"x\", \"y\"], \"kind\": \"a\", \"note\": "
        "null, \"items\": [{\"name\": \"n\\u00e9\", \"qty\": -3}], \"ok\": "
        "true, \"score\": 1.5e3}",
        "{\"id\":0,\"tags\":[],\"kind\":\"b\",\"items\":[],\"ok\":false,"
        "\"score\":-0.25}",
        "{\"id\": 1, \"tags\": [\"\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80\"], "
        "\"kind\": \"a\", \"note\": \"q\\\"\", \"items\": [], \"ok\": true, "
        "\"score\": 2}",
        "{\n  \"id\": 1,\n  \"tags\": [],\n  \"kind\": \"a\",\n  \"items\": "
        "[],\n  \"ok\": true,\n  \"score\": 2\n}",
    };
    for (size_t i = 0; i < sizeof(good) / sizeof(*good); i++)
        ok(takes(g, good[i]), "takes valid output %zu", i);
    static const char *bad[] = {
        "{\"id\": 1, \"kind\": \"a\", \"tags\": [], \"items\": [], \"ok\": "
        "true, \"score\": 2}", /* out of the schema's order */
        "{\"id\": 1, \"tags\": [], \"kind\": \"a\", \"items\": [], \"ok\": "
        "true}", /* score missing */
        "{\"id\": 1, \"tags\": [\"a\",\"b\",\"c\",\"d\"], \"kind\": \"a\", "
        "\"items\": [], \"ok\": true, \"score\": 2}", /* maxItems */
        "{\"id\": 1, \"tags\": [], \"kind\": \"c\", \"items\": [], \"ok\": "
        "true, \"score\": 2}", /* enum */
        "{\"id\": 1.5, \"tags\": [], \"kind\": \"a\", \"items\": [], \"ok\": "
        "true, \"score\": 2}", /* integer */
        "{\"id\": 012, \"tags\": [], \"kind\": \"a\", \"items\": [], \"ok\": "
        "true, \"score\": 2}", /* leading zero */
        "{\"id\": 1, \"tags\": [\"a\nb\"], \"kind\": \"a\", \"items\": [], "
        "\"ok\": true, \"score\": 2}", /* raw control byte */
        "{\"id\": 1, \"tags\": [\"\xc0\x80\"], \"kind\": \"a\", \"items\": "
        "[], \"ok\": true, \"score\": 2}", /* overlong UTF-8 */
        "{\"id\": 1, \"tags\": [\"\xed\xa0\x80\"], \"kind\": \"a\", \"items\": "
        "[], \"ok\": true, \"score\": 2}", /* a surrogate in UTF-8 */
        "{\"id\": 1, \"tags\": [], \"kind\": \"a\", \"items\": [{\"name\": "
        "\"x\"}], \"ok\": true, \"score\": 2}", /* $ref's required */
        "{\"id\": 1, \"tags\": [], \"kind\": \"a\", \"items\": [], \"ok\": "
        "true, \"score\": 2, \"x\": 1}", /* additional property */
        "{\"id\": 1, \"tags\": [], \"kind\": \"a\", \"items\": [], \"ok\": "
        "true, \"score\": 2} x", /* after the value */
        "{\"id\": 1, \"tags\": [\"\\x\"], \"kind\": \"a\", \"items\": [], "
        "\"ok\": true, \"score\": 2}", /* bad escape */
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(*bad); i++)
        ok(!takes(g, bad[i]), "refuses invalid output %zu", i);
    hp_grammar_free(g);

    /* bounds, type lists, const, recursion through "#" */
    g = from_schema("{\"type\": \"object\", \"properties\": {\"s\": {\"type\":"
                    " \"string\", \"minLength\": 2, \"maxLength\": 3}, \"t\":"
                    " {\"type\": [\"integer\", \"null\"]}, \"c\": {\"const\":"
                    " {\"k\": [1]}}, \"kid\": {\"$ref\": \"#\"}},"
                    " \"required\": [\"s\"]}",
                    msg, sizeof(msg));
    ok(g, "bounds, a type list, const and a recursive $ref compile (%s)",
       g ? "" : msg);
    if (g) {
        ok(takes(g, "{\"s\": \"ab\"}") && takes(g, "{\"s\": \"\xc3\xa9\\n\"}"),
           "minLength/maxLength count characters");
        ok(!takes(g, "{\"s\": \"a\"}") && !takes(g, "{\"s\": \"abcd\"}"),
           "outside the length bounds is refused");
        ok(takes(g, "{\"s\": \"ab\", \"t\": null, \"c\": {\"k\":[1]}}") &&
               takes(g, "{\"s\": \"ab\", \"t\": 7}"),
           "type list and const");
        ok(!takes(g, "{\"s\": \"ab\", \"c\": {\"k\":[2]}}"), "const refused");
        ok(takes(g, "{\"s\": \"ab\", \"kid\": {\"s\": \"cd\", \"kid\": "
                    "{\"s\": \"ef\"}}}"),
           "recursive $ref");
        ok(!takes(g, "{\"s\": \"ab\", \"kid\": {\"t\": 1}}"),
           "the recursion keeps its required");
        hp_grammar_free(g);
    }

    static const struct {
        const char *schema, *want;
    } errs[] = {
        {"{\"type\": \"object\", \"properties\": {\"a\": {\"type\": "
         "\"string\", \"pattern\": \"x\"}}}",
         "unsupported keyword 'pattern' at #/properties/a"},
        {"{\"$ref\": \"http://x/y\"}", "unsupported $ref"},
        {"{\"$ref\": \"#/$defs/Nope\"}", "names no schema"},
        {"{\"type\": \"date\"}", "unknown type \"date\" at #"},
        {"{\"type\": \"array\", \"maxItems\": 1000}", "'maxItems'"},
        {"{\"allOf\": [{\"type\": \"string\"}, {\"type\": \"null\"}]}",
         "'allOf' at #"},
        {"{\"type\": \"object\", \"properties\": {\"a\": {}}, \"required\": "
         "[\"b\"]}",
         "'required' at #"},
        {"{\"oneOf\": [{\"type\": \"string\"}]}", "'oneOf'"},
        {"{\"type\": \"number\", \"minimum\": 1}", "'minimum'"},
    };
    for (size_t i = 0; i < sizeof(errs) / sizeof(*errs); i++) {
        msg[0] = 0;
        g = from_schema(errs[i].schema, msg, sizeof(msg));
        ok(!g && strstr(msg, errs[i].want), "error %zu: \"%s\"", i, msg);
        hp_grammar_free(g);
    }
}

static const char *TOOLS =
    "\"tools\": [{\"type\": \"function\", \"function\": {\"name\": "
    "\"get_weather\", \"parameters\": {\"type\": \"object\", \"properties\": "
    "{\"city\": {\"type\": \"string\"}, \"days\": {\"type\": \"integer\"}}, "
    "\"required\": [\"city\"]}}}, {\"type\": \"function\", \"function\": "
    "{\"name\": \"get_time\", \"parameters\": {\"type\": \"object\", "
    "\"properties\": {\"zone\": {\"type\": \"string\", \"enum\": [\"utc\", "
    "\"cet\"]}}, \"required\": [\"zone\"]}}}]";

static void requests(void)
{
    char msg[400], spec[2048];
    const char *param = NULL;
    hp_grammar_t *g =
        from_request("{\"response_format\": {\"type\": \"text\"}}", 0, 0, msg,
                     sizeof(msg), NULL);
    ok(!g && !msg[0], "text: nothing to constrain");
    g = from_request("{\"response_format\": {\"type\": \"json_object\"}}", 0, 0,
                     msg, sizeof(msg), NULL);
    ok(g && takes(g, "{\"a\": [1, {\"b\": null}], \"c\": \"d\"}") &&
           takes(g, "{}"),
       "json_object takes objects");
    ok(g && !takes(g, "[1]") && !takes(g, "\"x\"") && !takes(g, "{\"a\" 1}"),
       "json_object refuses the rest");
    hp_grammar_free(g);

    g = from_request("{\"response_format\": {\"type\": \"json_object\"}}", 0, 1,
                     msg, sizeof(msg), NULL);
    ok(g && takes(g, "Let me think.</think>\n\n{\"a\": 1}") &&
           !takes(g, "{\"a\": 1}"),
       "an open thought comes first");
    hp_grammar_free(g);

    snprintf(spec, sizeof(spec), "{%s, \"tool_choice\": \"required\"}", TOOLS);
    g = from_request(spec, 0, 0, msg, sizeof(msg), NULL);
    static const char *one =
        "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": "
        "\"Paris\"}}\n</tool_call>";
    static const char *two =
        "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": "
        "\"Paris\", \"days\": 2}}\n</tool_call>\n<tool_call>\n{\"name\": "
        "\"get_time\", \"arguments\": {\"zone\": \"utc\"}}\n</tool_call>";
    ok(g && takes(g, one) && takes(g, two),
       "required, JSON syntax: one or more calls");
    ok(g && !takes(g, "Paris") &&
           !takes(g, "<tool_call>\n{\"name\": \"get_x\", \"arguments\": "
                     "{}}\n</tool_call>") &&
           !takes(g, "<tool_call>\n{\"name\": \"get_time\", \"arguments\": "
                     "{\"zone\": \"pst\"}}\n</tool_call>"),
       "required: no text, no other tool, arguments by the schema");
    hp_grammar_free(g);

    snprintf(spec, sizeof(spec),
             "{%s, \"tool_choice\": {\"type\": \"function\", \"function\": "
             "{\"name\": \"get_weather\"}}}",
             TOOLS);
    g = from_request(spec, 0, 0, msg, sizeof(msg), NULL);
    ok(g && takes(g, one) && !takes(g, two) &&
           !takes(g, "<tool_call>\n{\"name\": \"get_time\", \"arguments\": "
                     "{\"zone\": \"utc\"}}\n</tool_call>"),
       "named: exactly one call of that function");
    hp_grammar_free(g);

    snprintf(spec, sizeof(spec),
             "{%s, \"tool_choice\": \"required\", \"parallel_tool_calls\": "
             "false}",
             TOOLS);
    g = from_request(spec, 0, 0, msg, sizeof(msg), NULL);
    ok(g && takes(g, one) && !takes(g, two), "parallel_tool_calls false: one");
    hp_grammar_free(g);

    snprintf(spec, sizeof(spec), "{%s, \"tool_choice\": \"required\"}", TOOLS);
    g = from_request(spec, 1, 0, msg, sizeof(msg), NULL);
    ok(g &&
           takes(g, "<tool_call>\n<function=get_weather>\n<parameter=city>\n"
                    "Paris, \"France\"\n</parameter>\n<parameter=days>\n3\n"
                    "</parameter>\n</function>\n</tool_call>") &&
           takes(g, "<tool_call>\n<function=get_time>\n<parameter=zone>\ncet\n"
                    "</parameter>\n</function>\n</tool_call>\n<tool_call>\n"
                    "<function=get_weather>\n<parameter=city>\nRome\n"
                    "</parameter>\n</function>\n</tool_call>"),
       "XML syntax: text strings, JSON integers, enums as text");
    ok(g &&
           !takes(g, "<tool_call>\n<function=get_weather>\n"
                     "<parameter=days>\n3\n</parameter>\n</function>\n"
                     "</tool_call>") &&
           !takes(g, "<tool_call>\n<function=get_weather>\n<parameter=city>\n"
                     "Rome\n</parameter>\n<parameter=days>\nx\n</parameter>\n"
                     "</function>\n</tool_call>"),
       "XML syntax: required parameters, typed values");
    hp_grammar_free(g);

    snprintf(spec, sizeof(spec),
             "{%s, \"tool_choice\": \"auto\", \"response_format\": {\"type\": "
             "\"json_object\"}}",
             TOOLS);
    g = from_request(spec, 0, 0, msg, sizeof(msg), NULL);
    ok(g && takes(g, one) && takes(g, "{\"x\": 1}"),
       "auto with a JSON format: the JSON or calls");
    hp_grammar_free(g);

    g = from_request("{\"response_format\": {\"type\": \"json_schema\", "
                     "\"json_schema\": {\"name\": \"x\", \"schema\": "
                     "{\"type\": \"string\", \"format\": \"date\"}}}}",
                     0, 0, msg, sizeof(msg), &param);
    ok(!g && !strcmp(param, "response_format") &&
           strstr(msg, "unsupported keyword 'format' at #"),
       "a schema that does not compile: param and message (%s)", msg);
    g = from_request("{\"response_format\": {\"type\": \"xml\"}}", 0, 0, msg,
                     sizeof(msg), &param);
    ok(!g && strstr(msg, "\"xml\""), "an unknown response_format type");
    snprintf(spec, sizeof(spec),
             "{\"tools\": [{\"type\": \"function\", \"function\": {\"name\": "
             "\"f\", \"parameters\": {\"type\": \"object\", \"properties\": "
             "{\"a\": {\"type\": \"string\", \"pattern\": \"x\"}}}}}], "
             "\"tool_choice\": \"required\"}");
    g = from_request(spec, 0, 0, msg, sizeof(msg), &param);
    ok(!g && !strcmp(param, "tools") && strstr(msg, "'pattern'"),
       "a tool's schema that does not compile: param tools (%s)", msg);
}

/* The tokenizer at path, or NULL with the test skipped. */
static hp_tokenizer_t *load(const char *path)
{
    hp_tokenizer_t *tok = NULL;
    hp_error_t err;
    if (hp_tokenizer_load(&tok, path, &err) != HP_OK) {
        tap_skip(path);
        return NULL;
    }
    return tok;
}

/* The mask at each point of text against every token fed alone: at
 * `points` points spread over it (0: every byte, so inside escapes and
 * characters too), computed in order with the scratch's kept mask and
 * again cold. */
static void masks(const char *path, const char *what, const char *spec, int xml,
                  int think, const char *text, int points)
{
    hp_tokenizer_t *tok = load(path);
    hp_error_t err;
    if (!tok)
        return;
    int V = (int)hp_tokenizer_vocab_size(tok) + 7; /* padded, as models do */
    int stop[2] = {hp_tokenizer_token_id(tok, "<|im_end|>"),
                   hp_tokenizer_token_id(tok, "<|endoftext|>")};
    hp_gmask_vocab_t *v = NULL;
    char msg[400];
    hp_grammar_t *g = from_request(spec, xml, think, msg, sizeof(msg), NULL);
    if (!ok(g && hp_gmask_vocab_build(&v, tok, V, stop, 2, &err) == HP_OK,
            "%s: grammar and trie (%s)", path, msg)) {
        hp_grammar_free(g);
        hp_tokenizer_free(tok);
        return;
    }
    size_t nw = (size_t)(V + 31) / 32;
    uint32_t *bits = calloc(nw, sizeof(*bits));
    uint32_t *cold = calloc(nw, sizeof(*cold));
    hp_gmask_scratch_t s = {0}, s2 = {0};
    hp_gmatch_t m, probe;
    hp_gmatch_init(&m, g, &err);
    hp_gmatch_init(&probe, g, &err);
    size_t len = strlen(text);
    if (!points)
        points = (int)len;
    int bad = 0, checked = 0, allowed_total = 0;
    for (int p = 0; p <= points; p++) {
        size_t at = len * (size_t)p / (size_t)points;
        if (p > 0) {
            size_t prev = len * (size_t)(p - 1) / (size_t)points;
            bad += !hp_gmatch_feed(&m, text + prev, at - prev);
        }
        int n = hp_gmask_compute(v, &m, &s, bits), count = 0;
        s2.last_g = NULL;
        int n2 = hp_gmask_compute(v, &m, &s2, cold);
        if (n2 != n || memcmp(bits, cold, nw * sizeof(*bits))) {
            if (bad++ < 5)
                tap_diag("at %zu: the kept mask is not the cold one", at);
        }
        for (int id = 0; id < V; id++) {
            size_t nb;
            const char *b = hp_tokenizer_token_bytes(tok, id, &nb);
            int want;
            if (id == stop[0] || id == stop[1])
                want = hp_gmatch_may_end(&m);
            else if (!b || !nb || hp_tokenizer_is_special(tok, id))
                want = 0;
            else {
                hp_gmatch_copy(&probe, &m);
                want = hp_gmatch_feed(&probe, b, nb);
            }
            int got = bits[id >> 5] >> (id & 31) & 1;
            count += got;
            if (got != want && bad++ < 5)
                tap_diag("at %zu token %d (%.*s): mask %d, fed %d", at, id,
                         b ? (int)nb : 0, b ? b : "", got, want);
        }
        bad += count != n;
        allowed_total += n;
        checked++;
    }
    ok(!bad && checked == points + 1 && allowed_total > 0,
       "%s, %s: the mask is the tokens the recogniser takes, at %d points "
       "(%d allowed in all)",
       path, what, checked, allowed_total);
    hp_gmatch_free(&m);
    hp_gmatch_free(&probe);
    hp_gmask_scratch_free(&s);
    hp_gmask_scratch_free(&s2);
    free(bits);
    free(cold);
    hp_gmask_vocab_free(v);
    hp_grammar_free(g);
    hp_tokenizer_free(tok);
}

/* The masks' shortcuts on the real vocabulary, at every byte: strings
 * with and without bounds (a few characters of room, tens, more than a
 * token holds), escapes, characters split across tokens, two strings at
 * once, text up to a term starting with '<' or '\n'; the kept mask is
 * not given back for another grammar in the same state. */
static void real_masks(const char *path, const char *required)
{
    static const char *bounded =
        "{\"response_format\": {\"type\": \"json_schema\", \"json_schema\": "
        "{\"name\": \"b\", \"schema\": {\"type\": \"object\", \"properties\": "
        "{\"s\": {\"type\": \"string\", \"minLength\": 2, \"maxLength\": 5}, "
        "\"t\": {\"type\": \"string\", \"maxLength\": 300}, \"m\": {\"type\": "
        "\"string\", \"maxLength\": 40}, \"u\": {\"type\": \"string\", "
        "\"minLength\": 3}, \"a\": {\"anyOf\": [{\"type\": \"string\", "
        "\"maxLength\": 2}, {\"type\": \"string\", \"minLength\": 4}]}}, "
        "\"required\": [\"s\", \"t\", \"m\", \"u\", \"a\"], "
        "\"additionalProperties\": false}}}}";
    masks(path, "bounded strings, escapes, split characters", bounded, 0, 0,
          "{\"s\": \"a\\u00e9\\\"\xf0\x9f\x98\x80\", \"t\": \"x\xe2\x82\xac\\/"
          "y z\", \"m\": \"\xe4\xbd\xa0\xe5\xa5\xbd, wo\\nrld\", \"u\": "
          "\"abc\", \"a\": \"abcd\"}",
          0);
    masks(path, "json_object, every byte",
          "{\"response_format\": {\"type\": \"json_object\"}}", 0, 0,
          "{\"k\": [\"a\\\"b\\u00E9\", {\"\xc3\xa9 x\": -1.5e3}], \"z\": "
          "\"x\\\\y\"}",
          0);
    masks(path, "a thought, then XML tool calls", required, 1, 1,
          "Hm <b> </thin\xc3\xa9\n</think>\n\n<tool_call>\n"
          "<function=get_weather>\n<parameter=city>\nP\na<r\n</par x\n"
          "</parameter>\n</function>\n</tool_call>",
          0);

    /* two grammars in the same state words, one scratch */
    hp_tokenizer_t *tok = load(path);
    hp_error_t err;
    if (!tok)
        return;
    int V = (int)hp_tokenizer_vocab_size(tok), stop = 0;
    char msg[400];
    hp_grammar_t *g1 = from_schema("{\"type\": \"string\", \"maxLength\": 3}",
                                   msg, sizeof(msg));
    hp_grammar_t *g2 = from_schema("{\"type\": \"string\", \"maxLength\": 6}",
                                   msg, sizeof(msg));
    hp_gmask_vocab_t *v = NULL;
    hp_gmask_vocab_build(&v, tok, V, &stop, 1, &err);
    uint32_t *b1 = calloc((size_t)(V + 31) / 32, sizeof(*b1));
    uint32_t *b2 = calloc((size_t)(V + 31) / 32, sizeof(*b2));
    hp_gmask_scratch_t s = {0}, cold = {0};
    hp_gmatch_t m1, m2;
    hp_gmatch_init(&m1, g1, &err);
    hp_gmatch_init(&m2, g2, &err);
    hp_gmatch_feed(&m1, "\"ab", 3);
    hp_gmatch_feed(&m2, "\"ab", 3);
    int n1 = hp_gmask_compute(v, &m1, &s, b1);
    int n2 = hp_gmask_compute(v, &m2, &s, b2);
    int want = hp_gmask_compute(v, &m2, &cold, b1);
    ok(m1.set.len == m2.set.len &&
           !memcmp(m1.set.w, m2.set.w, m1.set.len * sizeof(uint32_t)) &&
           n1 < n2 && n2 == want &&
           !memcmp(b1, b2, (size_t)(V + 31) / 32 * sizeof(*b1)),
       "the same state of another grammar: its own mask (%d, %d of %d)", n1, n2,
       want);
    hp_gmatch_free(&m1);
    hp_gmatch_free(&m2);
    hp_gmask_scratch_free(&s);
    hp_gmask_scratch_free(&cold);
    free(b1);
    free(b2);
    hp_gmask_vocab_free(v);
    hp_grammar_free(g1);
    hp_grammar_free(g2);
    hp_tokenizer_free(tok);
}

/* Applying a mask: -inf exactly where its bit is clear, word by word
 * (words all clear, all set, mixed) and in a last partial word. */
static void apply(void)
{
    enum { V = 32 * 5 + 7 };
    uint32_t bits[6] = {0,           0xffffffffu, 0x80000001u,
                        0x5a5a5a5au, 0xfffffffeu, 0x45u};
    float l[V];
    int bad = 0;
    for (int i = 0; i < V; i++)
        l[i] = (float)i;
    hp_gmask_apply(bits, l, V);
    for (int i = 0; i < V; i++)
        bad += (bits[i >> 5] >> (i & 31) & 1) ? l[i] != (float)i
                                              : l[i] != -INFINITY;
    ok(!bad, "apply: -inf where the mask is clear, the logit where set");
}

static void cache(const char *path)
{
    hp_tokenizer_t *tok = load(path);
    hp_error_t err;
    if (!tok)
        return;
    int V = (int)hp_tokenizer_vocab_size(tok), stop = 0;
    hp_gcache_t *c = NULL;
    hp_gcache_create(&c, 1, tok, V, &stop, 1, &err);
    const char *a = "{\"response_format\": {\"type\": \"json_object\"}}";
    const char *b = "{\"response_format\": {\"type\": \"json_schema\", "
                    "\"json_schema\": {\"schema\": {\"type\": \"integer\"}}}}";
    const hp_grammar_t *g1, *g2, *g3;
    const hp_gmask_vocab_t *v;
    hp_gcache_stats_t st;
    int rc = hp_gcache_get(c, a, strlen(a), NULL, &g1, &v, &err);
    rc |= hp_gcache_get(c, a, strlen(a), NULL, &g2, &v, &err);
    hp_gcache_stats(c, &st);
    ok(rc == HP_OK && g1 && g1 == g2 && st.hits == 1 && st.misses == 1 && v,
       "the same request twice: one compile, one hit");
    hp_gcache_put(c, g1);
    hp_gcache_put(c, g2);
    rc = hp_gcache_get(c, b, strlen(b), NULL, &g3, &v, &err);
    hp_gcache_stats(c, &st);
    ok(rc == HP_OK && g3 && st.misses == 2 && st.evictions == 1 &&
           st.entries == 1,
       "another one past the capacity evicts the unheld one");
    hp_gcache_put(c, g3);
    rc = hp_gcache_get(c,
                       "{\"response_format\": {\"type\": \"json_schema\", "
                       "\"json_schema\": {\"schema\": {\"type\": 1}}}}",
                       84, NULL, &g1, &v, &err);
    ok(rc == HP_EBADINPUT && strstr(err.msg, "'response_format'"),
       "a bad one: HP_EBADINPUT naming the field (%s)", err.msg);
    hp_gcache_free(c);
    hp_tokenizer_free(tok);
}

/* The decoder on random logits under a schema: what it writes matches. */
static void decode(const char *path)
{
    hp_tokenizer_t *tok = load(path);
    hp_error_t err;
    if (!tok)
        return;
    hp_llm_t llm = {.tok = tok, .n_stop_ids = 1};
    llm.stop_ids[0] = hp_tokenizer_token_id(tok, "<|im_end|>");
    int V = (int)hp_tokenizer_vocab_size(tok);
    const char *spec =
        "{\"response_format\": {\"type\": \"json_schema\", \"json_schema\": "
        "{\"schema\": {\"type\": \"object\", \"properties\": {\"ok\": "
        "{\"type\": \"boolean\"}, \"n\": {\"type\": \"integer\"}, \"k\": "
        "{\"enum\": [\"x\", \"y\"]}, \"l\": {\"type\": \"array\", \"items\": "
        "{\"type\": \"null\"}, \"maxItems\": 2}}, \"required\": [\"ok\", "
        "\"n\", \"k\", \"l\"], \"additionalProperties\": false}}}}";
    hp_gcache_t *c = NULL;
    const hp_grammar_t *g;
    const hp_gmask_vocab_t *v;
    hp_gcache_create(&c, 0, tok, V, llm.stop_ids, 1, &err);
    hp_gcache_get(c, spec, strlen(spec), NULL, &g, &v, &err);
    hp_sampler_t sm;
    hp_sampler_init(&sm, V);
    float *logits = malloc((size_t)V * sizeof(float));
    int good = 0;
    for (int seed = 1; seed <= 8; seed++) {
        hp_gen_params_t p = {.max_tokens = 400,
                             .sampling = {.temperature = seed % 2 ? 1.0f : 0,
                                          .top_p = 1,
                                          .seed = (uint64_t)seed},
                             .grammar = g,
                             .gvocab = v,
                             .logprobs = 1,
                             .top_logprobs = 5};
        hp_decoder_t d;
        hp_rng_t r;
        hp_rng_seed(&r, (uint64_t)seed * 77);
        hp_decoder_init(&d, &llm, &p, &err);
        int tok_id = 0, rc = HP_OK, lp_ok = 1;
        while (!d.done && rc == HP_OK) {
            for (int i = 0; i < V; i++)
                logits[i] = (float)(hp_rng_uniform(&r) * 8.0);
            rc = hp_decoder_next(&d, &sm, logits, &tok_id, &err);
        }
        for (int i = 0; i < d.n_lp; i++)
            for (int k = 0; k < d.lp[i].lp.n_top; k++)
                lp_ok &= d.lp[i].lp.top_lp[k] > -1e30f;
        char *text = strndup(d.text.data ? d.text.data : "", d.text.len);
        cJSON *j = cJSON_Parse(text);
        int valid = rc == HP_OK && d.finish == HP_FINISH_STOP && j &&
                    cJSON_IsBool(cJSON_GetObjectItem(j, "ok")) &&
                    cJSON_IsNumber(cJSON_GetObjectItem(j, "n")) &&
                    cJSON_IsString(cJSON_GetObjectItem(j, "k")) &&
                    cJSON_GetArraySize(cJSON_GetObjectItem(j, "l")) <= 2 &&
                    takes(g, text) && lp_ok;
        if (!valid)
            tap_diag("seed %d: rc %d finish %d: %s", seed, rc, d.finish, text);
        good += valid;
        cJSON_Delete(j);
        free(text);
        hp_decoder_free(&d);
    }
    ok(good == 8,
       "random logits under a schema: 8 of 8 outputs parse, "
       "validate and end \"stop\" (%d)",
       good);
    free(logits);
    hp_sampler_free(&sm);
    hp_gcache_put(c, g);
    hp_gcache_free(c);
    hp_tokenizer_free(tok);
}

int main(void)
{
    const char *small = "models/test/qwen35-dense/tokenizer.json";
    const char *real = "/work/shared/data/qwen3-tokenizer/tokenizer.json";
    if (getenv("HYPIC_QWEN3_TOKENIZER"))
        real = getenv("HYPIC_QWEN3_TOKENIZER");
    schemas();
    requests();
    masks(small, "json_object",
          "{\"response_format\": {\"type\": \"json_object\"}}", 0, 0,
          "{\"key\": [1, -2.5e3, true, null, {\"x\": \"a\\u00e9\xc3\xa9\"}], "
          "\"b\": \"text with spaces\"}",
          40);
    char spec[2048];
    snprintf(spec, sizeof(spec), "{%s, \"tool_choice\": \"required\"}", TOOLS);
    masks(small, "tool call", spec, 0, 0,
          "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": "
          "\"Paris\", \"days\": 2}}\n</tool_call>",
          25);
    masks(real, "json_object",
          "{\"response_format\": {\"type\": \"json_object\"}}", 0, 0,
          "{\"key\": [1, true, {\"x\": \"a b\xc3\xa9\"}], \"b\": \"t\"}", 6);
    real_masks(real, spec);
    apply();
    cache(small);
    decode(small);
    return tap_done();
}
