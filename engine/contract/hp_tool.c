/* hp_tool.c - tool calls in a model's output (hp_tool.h). */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* memmem, also under nginx's flags */
#endif
#include "engine/contract/hp_tool.h"

#include <stdlib.h>
#include <string.h>

#define OPEN_LEN  (sizeof(HP_TOOL_OPEN) - 1)
#define CLOSE_LEN (sizeof(HP_TOOL_CLOSE) - 1)

static int is_space(char c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

/* ---- the scanner ---------------------------------------------------- */

static int append(hp_tool_scan_t *s, const char *text, size_t len)
{
    if (s->len + len > s->cap) {
        size_t cap = s->cap ? 2 * s->cap : 256;
        while (cap < s->len + len)
            cap *= 2;
        char *b = realloc(s->buf, cap);
        if (!b)
            return -1;
        s->buf = b;
        s->cap = cap;
    }
    if (len)
        memcpy(s->buf + s->len, text, len);
    s->len += len;
    return 0;
}

static void consume(hp_tool_scan_t *s, size_t n)
{
    memmove(s->buf, s->buf + n, s->len - n);
    s->len -= n;
}

/* Content, less the whitespace that follows a block. */
static int emit(hp_tool_scan_t *s, const char *data, size_t n,
                hp_tool_sink_fn sink, void *ud)
{
    if (s->after)
        while (n && is_space(*data)) {
            data++;
            n--;
        }
    if (!n)
        return 0;
    s->after = 0;
    return sink(ud, HP_TOOL_TEXT, data, n);
}

/* The longest end of buf that could begin an opening tag. */
static size_t partial_open(const char *buf, size_t len)
{
    size_t k = len < OPEN_LEN - 1 ? len : OPEN_LEN - 1;
    for (; k > 0; k--)
        if (!memcmp(buf + len - k, HP_TOOL_OPEN, k))
            return k;
    return 0;
}

static int drain(hp_tool_scan_t *s, hp_tool_sink_fn sink, void *ud)
{
    for (;;) {
        if (s->in) {
            const char *p = memmem(s->buf, s->len, HP_TOOL_CLOSE, CLOSE_LEN);
            if (!p)
                return 0; /* the body goes on */
            size_t n = (size_t)(p - s->buf);
            if (sink(ud, HP_TOOL_BLOCK, s->buf, n))
                return -1;
            consume(s, n + CLOSE_LEN);
            s->in = 0;
            s->after = 1;
            continue;
        }
        const char *p = memmem(s->buf, s->len, HP_TOOL_OPEN, OPEN_LEN);
        size_t end =
            p ? (size_t)(p - s->buf) : s->len - partial_open(s->buf, s->len);
        size_t text = end;
        /* whitespace before a block is not content; it is held until
         * what follows it is known */
        while (text && is_space(s->buf[text - 1]))
            text--;
        if (emit(s, s->buf, text, sink, ud))
            return -1;
        if (!p) {
            consume(s, text);
            return 0;
        }
        consume(s, end + OPEN_LEN);
        s->in = 1;
    }
}

int hp_tool_scan_feed(hp_tool_scan_t *s, const char *text, size_t len,
                      hp_tool_sink_fn sink, void *ud)
{
    if (append(s, text, len))
        return -1;
    return drain(s, sink, ud);
}

int hp_tool_scan_end(hp_tool_scan_t *s, hp_tool_sink_fn sink, void *ud)
{
    int rc = 0;
    if (s->in) {
        /* never closed: text as the model wrote it */
        s->after = 0;
        rc = sink(ud, HP_TOOL_TEXT, HP_TOOL_OPEN, OPEN_LEN);
        if (!rc && s->len)
            rc = sink(ud, HP_TOOL_TEXT, s->buf, s->len);
    } else if (s->after) {
        rc = emit(s, s->buf, s->len, sink, ud);
    } else if (s->len) {
        rc = sink(ud, HP_TOOL_TEXT, s->buf, s->len);
    }
    s->len = 0;
    s->in = 0;
    return rc;
}

void hp_tool_scan_free(hp_tool_scan_t *s)
{
    free(s->buf);
    memset(s, 0, sizeof(*s));
}

/* ---- one call ------------------------------------------------------- */

static int starts(const char *p, const char *end, const char *lit)
{
    size_t n = strlen(lit);
    return (size_t)(end - p) >= n && !memcmp(p, lit, n);
}

static char *dup_n(const char *p, size_t n)
{
    char *s = malloc(n + 1);
    if (s) {
        memcpy(s, p, n);
        s[n] = '\0';
    }
    return s;
}

/* {"name": N, "arguments": {...} | "{...}"} */
static int parse_json(const char *b, size_t n, char **name, char **args)
{
    const char *end = NULL;
    cJSON *j = cJSON_ParseWithLengthOpts(b, n, &end, 0);
    cJSON *a = NULL, *own = NULL;
    int rc = -1;

    while (j && end < b + n && is_space(*end))
        end++;
    if (!j || end != b + n || !cJSON_IsObject(j))
        goto out;
    cJSON *nm = cJSON_GetObjectItemCaseSensitive(j, "name");
    if (!cJSON_IsString(nm) || !nm->valuestring[0])
        goto out;
    a = cJSON_GetObjectItemCaseSensitive(j, "arguments");
    if (cJSON_IsString(a) && !(a = own = cJSON_Parse(a->valuestring)))
        goto out; /* arguments given as text that is not JSON */
    if (a && !cJSON_IsNull(a) && !cJSON_IsObject(a))
        goto out;
    *name = strdup(nm->valuestring);
    *args = a && cJSON_IsObject(a) ? cJSON_PrintUnformatted(a) : strdup("{}");
    if (*name && *args) {
        rc = 0;
    } else {
        free(*name);
        free(*args);
        *name = *args = NULL;
    }
out:
    cJSON_Delete(own);
    cJSON_Delete(j);
    return rc;
}

/* tools[].function whose name is name, its parameters' properties */
static const cJSON *properties_of(const cJSON *tools, const char *name)
{
    const cJSON *t;
    cJSON_ArrayForEach(t, tools)
    {
        const cJSON *f = cJSON_GetObjectItemCaseSensitive(t, "function");
        const cJSON *n = cJSON_GetObjectItemCaseSensitive(f, "name");
        if (cJSON_IsString(n) && !strcmp(n->valuestring, name))
            return cJSON_GetObjectItemCaseSensitive(
                cJSON_GetObjectItemCaseSensitive(f, "parameters"),
                "properties");
    }
    return NULL;
}

/* A parameter's value: text, or JSON where its schema is not a string. */
static cJSON *typed(const cJSON *props, const char *key, const char *v)
{
    const cJSON *p = cJSON_GetObjectItemCaseSensitive(props, key);
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(p, "type");
    if (p && !(cJSON_IsString(type) && !strcmp(type->valuestring, "string"))) {
        cJSON *j = cJSON_Parse(v);
        if (j)
            return j;
    }
    return cJSON_CreateString(v);
}

/* <function=N>(<parameter=K>\nV\n</parameter>)*</function> */
static int parse_xml(const char *b, size_t n, const cJSON *tools, char **name,
                     char **args)
{
    const char *p = b + sizeof("<function=") - 1, *end = b + n, *q;
    cJSON *obj = NULL;
    char *key = NULL, *val = NULL;

    q = memchr(p, '>', (size_t)(end - p));
    if (!q || q == p || memchr(p, '\n', (size_t)(q - p)))
        return -1;
    if (!(*name = dup_n(p, (size_t)(q - p))) || !(obj = cJSON_CreateObject()))
        goto fail;
    const cJSON *props = properties_of(tools, *name);
    for (p = q + 1;;) {
        while (p < end && is_space(*p))
            p++;
        if (starts(p, end, "</function>")) {
            for (p += sizeof("</function>") - 1; p < end && is_space(*p); p++)
                ;
            if (p != end)
                goto fail;
            break;
        }
        if (!starts(p, end, "<parameter="))
            goto fail;
        p += sizeof("<parameter=") - 1;
        q = memchr(p, '>', (size_t)(end - p));
        if (!q || q == p || memchr(p, '\n', (size_t)(q - p)))
            goto fail;
        key = dup_n(p, (size_t)(q - p));
        p = q + 1;
        q = memmem(p, (size_t)(end - p), "</parameter>",
                   sizeof("</parameter>") - 1);
        if (!key || !q)
            goto fail;
        const char *v = p, *ve = q;
        /* the value sits between a newline after the tag and one before
         * the closing tag */
        if (v < ve && *v == '\n')
            v++;
        if (ve > v && ve[-1] == '\n')
            ve--;
        val = dup_n(v, (size_t)(ve - v));
        cJSON *item = val ? typed(props, key, val) : NULL;
        if (!item)
            goto fail;
        cJSON_DeleteItemFromObjectCaseSensitive(obj, key);
        cJSON_AddItemToObject(obj, key, item);
        free(key);
        free(val);
        key = val = NULL;
        p = q + sizeof("</parameter>") - 1;
    }
    if (!(*args = cJSON_PrintUnformatted(obj)))
        goto fail;
    cJSON_Delete(obj);
    return 0;
fail:
    free(key);
    free(val);
    cJSON_Delete(obj);
    free(*name);
    *name = NULL;
    return -1;
}

int hp_tool_parse(const char *body, size_t len, const cJSON *tools, char **name,
                  char **arguments)
{
    const char *b = body, *end = body + len;
    *name = *arguments = NULL;
    while (b < end && is_space(*b))
        b++;
    while (end > b && is_space(end[-1]))
        end--;
    if (b < end && *b == '{')
        return parse_json(b, (size_t)(end - b), name, arguments);
    if (starts(b, end, "<function="))
        return parse_xml(b, (size_t)(end - b), tools, name, arguments);
    return -1;
}
