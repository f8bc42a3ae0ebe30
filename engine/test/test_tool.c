/* test_tool.c - tool calls in a model's output (hp_tool.h): the streaming
 * scanner, whatever the pieces, and the two call formats. */
#include <stdlib.h>
#include <string.h>

#include "engine/contract/hp_tool.h"
#include "t/lib/tap.h"

/* what the sink saw: content, and blocks as [BODY] */
typedef struct {
    char out[4096];
    size_t n;
} seen_t;

static int sink(void *ud, int kind, const char *data, size_t len)
{
    seen_t *s = ud;
    if (s->n + len + 2 >= sizeof(s->out))
        return -1;
    if (kind == HP_TOOL_BLOCK)
        s->out[s->n++] = '[';
    memcpy(s->out + s->n, data, len);
    s->n += len;
    if (kind == HP_TOOL_BLOCK)
        s->out[s->n++] = ']';
    s->out[s->n] = '\0';
    return 0;
}

/* text fed in pieces of `step` bytes (0: at every cut, each tried) */
static int scan_is(const char *text, const char *want)
{
    size_t len = strlen(text);
    for (size_t step = 1; step <= len + 1; step++) {
        hp_tool_scan_t sc = {0};
        seen_t s = {.n = 0};
        s.out[0] = '\0';
        int rc = 0;
        for (size_t i = 0; i < len && !rc; i += step)
            rc = hp_tool_scan_feed(&sc, text + i,
                                   i + step <= len ? step : len - i, sink, &s);
        rc = rc ? rc : hp_tool_scan_end(&sc, sink, &s);
        hp_tool_scan_free(&sc);
        if (rc || strcmp(s.out, want)) {
            tap_diag("pieces of %zu: got \"%s\", want \"%s\"", step, s.out,
                     want);
            return 0;
        }
    }
    return 1;
}

static int call_is(const char *body, const cJSON *tools, const char *name,
                   const char *args)
{
    char *n, *a;
    int rc = hp_tool_parse(body, strlen(body), tools, &n, &a);
    int good =
        name ? rc == 0 && !strcmp(n, name) && !strcmp(a, args) : rc == -1;
    if (!good)
        tap_diag("got rc %d name %s args %s", rc, rc ? "-" : n, rc ? "-" : a);
    if (rc == 0) {
        free(n);
        free(a);
    }
    return good;
}

int main(void)
{
    ok(scan_is("plain text, no call", "plain text, no call"),
       "text without a call is content, as it is");
    ok(scan_is("ends in spaces  \n", "ends in spaces  \n"),
       "trailing whitespace of plain text is kept");
    ok(scan_is("a < b <tool <tool_cal", "a < b <tool <tool_cal"),
       "a tag's beginning that never completes is content");
    ok(scan_is("<tool_call>X</tool_call>", "[X]"), "one block");
    ok(scan_is("Let me look.\n\n<tool_call>\nA\n</tool_call>\n<tool_call>B"
               "</tool_call>\n",
               "Let me look.[\nA\n][B]"),
       "content, then two blocks; the whitespace around them is not content");
    ok(scan_is("<tool_call>A</tool_call> and then", "[A]and then"),
       "text after a block");
    ok(scan_is("x <tool_call>{\"name\": \"f\"", "x<tool_call>{\"name\": \"f\""),
       "a block that never closes is content, tags included");
    ok(scan_is("<tool_call><tool_call>A</tool_call>", "[<tool_call>A]"),
       "the first closing tag ends a block");
    ok(scan_is("</tool_call> stray", "</tool_call> stray"),
       "a closing tag outside a block is content");
    ok(scan_is("", ""), "nothing in, nothing out");

    /* the JSON form (Qwen2.5, Qwen3) */
    ok(call_is("\n{\"name\": \"get_weather\", \"arguments\": {\"city\": "
               "\"Paris\", \"days\": 3}}\n",
               NULL, "get_weather", "{\"city\":\"Paris\",\"days\":3}"),
       "JSON: name and arguments");
    ok(call_is("{\"name\": \"f\", \"arguments\": \"{\\\"a\\\": [1, 2]}\"}",
               NULL, "f", "{\"a\":[1,2]}"),
       "JSON: arguments given as JSON text");
    ok(call_is("{\"name\": \"f\"}", NULL, "f", "{}"),
       "JSON: no arguments is {}");
    ok(call_is("{\"name\": \"f\", \"arguments\": {\"s\": \"\\u00e9\\n\"}}",
               NULL, "f", "{\"s\":\"\xc3\xa9\\n\"}"),
       "JSON: escapes and UTF-8");
    ok(call_is("{\"name\": \"f\", \"arguments\": [1]}", NULL, NULL, NULL),
       "JSON: arguments that are not an object: malformed");
    ok(call_is("{\"name\": \"\", \"arguments\": {}}", NULL, NULL, NULL),
       "JSON: an empty name: malformed");
    ok(call_is("{\"arguments\": {}}", NULL, NULL, NULL),
       "JSON: no name: malformed");
    ok(call_is("{\"name\": \"f\", \"arguments\": {\"a\": 1}", NULL, NULL, NULL),
       "JSON: cut short: malformed");
    ok(call_is("{\"name\": \"f\"} trailing", NULL, NULL, NULL),
       "JSON: text after the object: malformed");
    ok(call_is("{\"name\": \"f\", \"arguments\": \"not json\"}", NULL, NULL,
               NULL),
       "JSON: arguments text that is not JSON: malformed");
    ok(call_is("just words", NULL, NULL, NULL), "neither form: malformed");
    ok(call_is("", NULL, NULL, NULL), "an empty block: malformed");

    /* the XML form (Qwen3-Coder, Qwen3.5), typed by the tools' schemas */
    cJSON *tools = cJSON_Parse(
        "[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\","
        "\"parameters\":{\"type\":\"object\",\"properties\":{"
        "\"city\":{\"type\":\"string\"},\"days\":{\"type\":\"integer\"},"
        "\"opts\":{\"type\":\"object\"},\"zip\":{\"type\":\"string\"}}}}}]");
    ok(tools != NULL, "the tools parse");
    ok(call_is("\n<function=get_weather>\n<parameter=city>\nParis\n"
               "</parameter>\n<parameter=days>\n3\n</parameter>\n"
               "</function>\n",
               tools, "get_weather", "{\"city\":\"Paris\",\"days\":3}"),
       "XML: parameters typed by the schema");
    ok(call_is("<function=get_weather>\n<parameter=zip>\n01234\n</parameter>\n"
               "<parameter=opts>\n{\"h24\": true}\n</parameter>\n</function>",
               tools, "get_weather",
               "{\"zip\":\"01234\",\"opts\":{\"h24\":true}}"),
       "XML: a string stays a string, an object parses");
    ok(call_is("<function=get_weather>\n<parameter=days>\nthree\n</parameter>\n"
               "</function>",
               tools, "get_weather", "{\"days\":\"three\"}"),
       "XML: a value that is not JSON stays text");
    ok(call_is("<function=other>\n<parameter=n>\n5\n</parameter>\n"
               "<parameter=text>\nline one\nline two\n</parameter>\n"
               "</function>",
               tools, "other",
               "{\"n\":\"5\",\"text\":\"line one\\nline two\"}"),
       "XML: without a schema values are text, newlines inside kept");
    ok(call_is("<function=f>\n</function>", NULL, "f", "{}"),
       "XML: no parameters");
    ok(call_is("<function=f>\n<parameter=a>\n1\n</parameter>\n", NULL, NULL,
               NULL),
       "XML: no </function>: malformed");
    ok(call_is("<function=f>\n<parameter=a>\n1\n</function>", NULL, NULL, NULL),
       "XML: no </parameter>: malformed");
    ok(call_is("<function=>\n</function>", NULL, NULL, NULL),
       "XML: no name: malformed");
    ok(call_is("<function=f>\njunk\n</function>", NULL, NULL, NULL),
       "XML: text between parameters: malformed");
    ok(call_is("<function=f>\n</function> tail", NULL, NULL, NULL),
       "XML: text after </function>: malformed");
    cJSON_Delete(tools);

    return tap_done();
}
