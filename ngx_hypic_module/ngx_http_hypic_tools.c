
/*
 * HYPIC serve: tools in chat completions (see ngx_http_hypic_tools.h).
 */


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include <cJSON.h>

#include "engine/contract/hp_tool.h"

#include "ngx_http_hypic_module.h"
#include "ngx_http_hypic_choice.h"
#include "ngx_http_hypic_request.h"
#include "ngx_http_hypic_json.h"
#include "ngx_http_hypic_sse.h"
#include "ngx_http_hypic_tools.h"


/* one choice's calls */

typedef struct {
    hp_tool_scan_t              scan;
    ngx_uint_t                  n_calls;
    ngx_str_t                   calls;      /* ,"tool_calls":[...] */
    size_t                      calls_cap;
} ngx_http_hypic_tools_choice_t;


/* what an answer scanned for calls keeps (ctx->out.tools) */

typedef struct {
    cJSON                          *tools;    /* the request's, for types */
    unsigned                        parallel:1;
    ngx_uint_t                      n;
    ngx_http_hypic_tools_choice_t  *choice;   /* [n]: one per choice */
} ngx_http_hypic_tools_t;


/* what the scanner's sink is called for: a choice of a request */

typedef struct {
    ngx_http_request_t         *r;
    ngx_uint_t                  i;
} ngx_http_hypic_tools_sink_t;


static ngx_int_t ngx_http_hypic_tools_check_list(cJSON *tools,
    ngx_http_hypic_bad_t *bad);
static ngx_int_t ngx_http_hypic_tools_check_choice(cJSON *json,
    cJSON *tools, ngx_http_hypic_bad_t *bad);
static ngx_int_t ngx_http_hypic_tools_check_messages(cJSON *json,
    ngx_http_hypic_bad_t *bad);
static ngx_int_t ngx_http_hypic_tools_check_calls(cJSON *calls,
    ngx_uint_t i, ngx_http_hypic_bad_t *bad);
static cJSON *ngx_http_hypic_tools_call_of(cJSON *asked, const char *id);
static ngx_int_t ngx_http_hypic_tools_answered(cJSON *asked, ngx_uint_t k,
    ngx_http_hypic_bad_t *bad);
static ngx_uint_t ngx_http_hypic_tools_name_ok(cJSON *name);
static cJSON *ngx_http_hypic_tools_find(cJSON *tools, const char *name);
static void ngx_http_hypic_tools_cleanup(void *data);
static int ngx_http_hypic_tools_sink(void *ud, int kind, const char *data,
    size_t len);
static ngx_int_t ngx_http_hypic_tools_content(ngx_http_request_t *r,
    ngx_http_hypic_ctx_t *ctx, ngx_uint_t i, const char *data, size_t len);
static ngx_int_t ngx_http_hypic_tools_call(ngx_http_request_t *r,
    ngx_http_hypic_ctx_t *ctx, ngx_uint_t i, char *name, char *args);


static ngx_str_t  ngx_http_hypic_tools_reason = ngx_string("tool_calls");
static ngx_str_t  ngx_http_hypic_tools_none = ngx_null_string;


ngx_int_t
ngx_http_hypic_tools_check(ngx_http_hypic_ctx_t *ctx, cJSON *json,
    ngx_http_hypic_bad_t *bad)
{
    cJSON       *tools, *item, *key, *choice;
    const char  *reserved[] = { "messages", "tools", "documents",
                                "add_generation_prompt", NULL };
    ngx_uint_t   i;

    tools = cJSON_GetObjectItemCaseSensitive(json, "tools");

    if (cJSON_IsNull(tools)) {
        tools = NULL;
    }

    if (tools && ngx_http_hypic_tools_check_list(tools, bad) != NGX_OK) {
        return NGX_ERROR;
    }

    if (ngx_http_hypic_tools_check_choice(json, tools, bad) != NGX_OK) {
        return NGX_ERROR;
    }

    /* "none": the model sees the tools but is not to call them, and what
     * it writes is content */

    choice = cJSON_GetObjectItemCaseSensitive(json, "tool_choice");

    ctx->in.tools = tools;
    ctx->in.tool_calls = cJSON_GetArraySize(tools) > 0
                         && !(cJSON_IsString(choice)
                              && ngx_strcmp(choice->valuestring, "none")
                                 == 0);

    item = cJSON_GetObjectItemCaseSensitive(json, "parallel_tool_calls");

    if (item && !cJSON_IsNull(item) && !cJSON_IsBool(item)) {
        return ngx_http_hypic_bad(bad, NGX_HTTP_BAD_REQUEST,
                                  "parallel_tool_calls", NULL,
                                  "'parallel_tool_calls' must be a boolean");
    }

    if (item && !cJSON_IsNull(item) && tools == NULL) {
        return ngx_http_hypic_bad(bad, NGX_HTTP_BAD_REQUEST,
                                  "parallel_tool_calls", NULL,
                                  "'parallel_tool_calls' is only allowed "
                                  "when 'tools' are specified");
    }

    ctx->in.parallel = !cJSON_IsFalse(item);

    item = cJSON_GetObjectItemCaseSensitive(json, "chat_template_kwargs");

    if (item && !cJSON_IsNull(item)) {
        if (!cJSON_IsObject(item)) {
            return ngx_http_hypic_bad(bad, NGX_HTTP_BAD_REQUEST,
                                      "chat_template_kwargs", NULL,
                                      "'chat_template_kwargs' must be an "
                                      "object");
        }

        /* what the template gets from the request itself */

        for (i = 0; reserved[i]; i++) {
            key = cJSON_GetObjectItemCaseSensitive(item, reserved[i]);

            if (key) {
                return ngx_http_hypic_bad(bad, NGX_HTTP_BAD_REQUEST,
                                          "chat_template_kwargs", NULL,
                                          "'chat_template_kwargs' may not "
                                          "set '%s'", reserved[i]);
            }
        }
    }

    return ngx_http_hypic_tools_check_messages(json, bad);
}


static ngx_int_t
ngx_http_hypic_tools_check_list(cJSON *tools, ngx_http_hypic_bad_t *bad)
{
    cJSON       *tool, *type, *fn, *item;
    ngx_uint_t   i;

    if (!cJSON_IsArray(tools)) {
        return ngx_http_hypic_bad(bad, NGX_HTTP_BAD_REQUEST, "tools", NULL,
                                  "'tools' must be an array of function "
                                  "tools");
    }

    i = 0;

    cJSON_ArrayForEach(tool, tools) {
        type = cJSON_GetObjectItemCaseSensitive(tool, "type");
        fn = cJSON_GetObjectItemCaseSensitive(tool, "function");

        if (!cJSON_IsString(type) || ngx_strcmp(type->valuestring, "function")
            || !cJSON_IsObject(fn))
        {
            return ngx_http_hypic_bad(bad, NGX_HTTP_BAD_REQUEST, "tools",
                                      NULL, "'tools[%ui]' must be "
                                      "{\"type\": \"function\", "
                                      "\"function\": {...}}", i);
        }

        if (!ngx_http_hypic_tools_name_ok(
                 cJSON_GetObjectItemCaseSensitive(fn, "name")))
        {
            return ngx_http_hypic_bad(bad, NGX_HTTP_BAD_REQUEST, "tools",
                                      NULL, "'tools[%ui].function.name' "
                                      "must be 1 to 64 letters, digits, _ "
                                      "or -", i);
        }

        item = cJSON_GetObjectItemCaseSensitive(fn, "description");

        if (item && !cJSON_IsNull(item) && !cJSON_IsString(item)) {
            return ngx_http_hypic_bad(bad, NGX_HTTP_BAD_REQUEST, "tools",
                                      NULL, "'tools[%ui].function."
                                      "description' must be a string", i);
        }

        item = cJSON_GetObjectItemCaseSensitive(fn, "parameters");

        if (item && !cJSON_IsNull(item) && !cJSON_IsObject(item)) {
            return ngx_http_hypic_bad(bad, NGX_HTTP_BAD_REQUEST, "tools",
                                      NULL, "'tools[%ui].function."
                                      "parameters' must be a JSON Schema "
                                      "object", i);
        }

        i++;
    }

    return NGX_OK;
}


static ngx_int_t
ngx_http_hypic_tools_check_choice(cJSON *json, cJSON *tools,
    ngx_http_hypic_bad_t *bad)
{
    cJSON  *choice, *type, *fn, *name;

    choice = cJSON_GetObjectItemCaseSensitive(json, "tool_choice");

    if (choice == NULL || cJSON_IsNull(choice)) {
        return NGX_OK;
    }

    if (cJSON_IsString(choice)) {

        if (ngx_strcmp(choice->valuestring, "none") == 0
            || ngx_strcmp(choice->valuestring, "auto") == 0)
        {
            /* as OpenAI: a choice among no tools is a mistake */

            if (tools == NULL) {
                return ngx_http_hypic_bad(bad, NGX_HTTP_BAD_REQUEST,
                                          "tool_choice", NULL,
                                          "'tool_choice' is only allowed "
                                          "when 'tools' are specified");
            }

            return NGX_OK;
        }

        if (ngx_strcmp(choice->valuestring, "required") != 0) {
            return ngx_http_hypic_bad(bad, NGX_HTTP_BAD_REQUEST,
                                      "tool_choice", NULL,
                                      "'tool_choice' must be \"none\", "
                                      "\"auto\", \"required\" or "
                                      "{\"type\": \"function\", "
                                      "\"function\": {\"name\": ...}}");
        }

        if (cJSON_GetArraySize(tools) == 0) {
            return ngx_http_hypic_bad(bad, NGX_HTTP_BAD_REQUEST,
                                      "tool_choice", NULL,
                                      "'tool_choice' \"required\" needs "
                                      "'tools'");
        }

        return NGX_OK;
    }

    type = cJSON_GetObjectItemCaseSensitive(choice, "type");
    fn = cJSON_GetObjectItemCaseSensitive(choice, "function");
    name = cJSON_GetObjectItemCaseSensitive(fn, "name");

    if (!cJSON_IsObject(choice) || !cJSON_IsString(type)
        || ngx_strcmp(type->valuestring, "function") != 0
        || !cJSON_IsString(name))
    {
        return ngx_http_hypic_bad(bad, NGX_HTTP_BAD_REQUEST, "tool_choice",
                                  NULL, "'tool_choice' must be \"none\", "
                                  "\"auto\", \"required\" or "
                                  "{\"type\": \"function\", "
                                  "\"function\": {\"name\": ...}}");
    }

    if (ngx_http_hypic_tools_find(tools, name->valuestring) == NULL) {
        return ngx_http_hypic_bad(bad, NGX_HTTP_BAD_REQUEST, "tool_choice",
                                  NULL, "'tool_choice' names the function "
                                  "'%s', which is not in 'tools'",
                                  name->valuestring);
    }

    return NGX_OK;
}


/*
 * Assistant turns with their tool calls, tool turns with their call id;
 * and, as OpenAI, the turns in order: the tool turns right after an
 * assistant turn with calls answer each of its calls, and a tool turn
 * answers one of them.
 */

static ngx_int_t
ngx_http_hypic_tools_check_messages(cJSON *json, ngx_http_hypic_bad_t *bad)
{
    cJSON       *message, *role, *calls, *id, *asked;
    ngx_uint_t   i, k, tool;

    asked = NULL;     /* the assistant turn whose calls are answered now */
    k = 0;

    i = 0;

    cJSON_ArrayForEach(message,
                       cJSON_GetObjectItemCaseSensitive(json, "messages"))
    {
        role = cJSON_GetObjectItemCaseSensitive(message, "role");
        tool = (ngx_strcmp(role->valuestring, "tool") == 0);

        if (asked && !tool) {
            if (ngx_http_hypic_tools_answered(asked, k, bad) != NGX_OK) {
                return NGX_ERROR;
            }

            asked = NULL;
        }

        if (tool) {
            id = cJSON_GetObjectItemCaseSensitive(message, "tool_call_id");

            if (!cJSON_IsString(id)) {
                return ngx_http_hypic_bad(bad, NGX_HTTP_BAD_REQUEST,
                                          "messages", NULL,
                                          "'messages[%ui].tool_call_id' "
                                          "must be a string", i);
            }

            if (asked == NULL) {
                return ngx_http_hypic_bad(bad, NGX_HTTP_BAD_REQUEST,
                                          "messages", NULL,
                                          "'messages[%ui]' has role 'tool' "
                                          "but follows no assistant "
                                          "message with 'tool_calls'", i);
            }

            if (ngx_http_hypic_tools_call_of(asked, id->valuestring)
                == NULL)
            {
                return ngx_http_hypic_bad(bad, NGX_HTTP_BAD_REQUEST,
                                          "messages", NULL,
                                          "'messages[%ui].tool_call_id' "
                                          "'%s' is not the id of a call in "
                                          "'messages[%ui].tool_calls'", i,
                                          id->valuestring, k);
            }
        }

        calls = cJSON_GetObjectItemCaseSensitive(message, "tool_calls");

        if (calls && !cJSON_IsNull(calls)) {

            if (ngx_strcmp(role->valuestring, "assistant") != 0
                || !cJSON_IsArray(calls))
            {
                return ngx_http_hypic_bad(bad, NGX_HTTP_BAD_REQUEST,
                                          "messages", NULL,
                                          "'messages[%ui].tool_calls' "
                                          "must be an array, in an "
                                          "assistant message", i);
            }

            if (ngx_http_hypic_tools_check_calls(calls, i, bad) != NGX_OK) {
                return NGX_ERROR;
            }

            if (cJSON_GetArraySize(calls) > 0) {
                asked = message;
                k = i;
            }
        }

        i++;
    }

    if (asked) {
        return ngx_http_hypic_tools_answered(asked, k, bad);
    }

    return NGX_OK;
}


/* the calls of the assistant turn messages[i] */

static ngx_int_t
ngx_http_hypic_tools_check_calls(cJSON *calls, ngx_uint_t i,
    ngx_http_hypic_bad_t *bad)
{
    cJSON       *call, *type, *fn, *args;
    ngx_uint_t   k;

    k = 0;

    cJSON_ArrayForEach(call, calls) {
        type = cJSON_GetObjectItemCaseSensitive(call, "type");
        fn = cJSON_GetObjectItemCaseSensitive(call, "function");
        args = cJSON_GetObjectItemCaseSensitive(fn, "arguments");

        if (!cJSON_IsString(type)
            || ngx_strcmp(type->valuestring, "function") != 0
            || !cJSON_IsString(cJSON_GetObjectItemCaseSensitive(fn, "name"))
            || !(cJSON_IsString(args) || cJSON_IsObject(args)))
        {
            return ngx_http_hypic_bad(bad, NGX_HTTP_BAD_REQUEST,
                                      "messages", NULL,
                                      "'messages[%ui].tool_calls[%ui]' must "
                                      "be {\"type\": \"function\", "
                                      "\"function\": {\"name\": ..., "
                                      "\"arguments\": ...}}", i, k);
        }

        if (!cJSON_IsString(cJSON_GetObjectItemCaseSensitive(call, "id"))) {
            return ngx_http_hypic_bad(bad, NGX_HTTP_BAD_REQUEST,
                                      "messages", NULL,
                                      "'messages[%ui].tool_calls[%ui].id' "
                                      "must be a string", i, k);
        }

        /* the template gets the arguments as an object */

        if (cJSON_IsString(args)) {
            fn = cJSON_Parse(args->valuestring);

            if (!cJSON_IsObject(fn)) {
                cJSON_Delete(fn);
                return ngx_http_hypic_bad(bad, NGX_HTTP_BAD_REQUEST,
                                          "messages", NULL,
                                          "'messages[%ui].tool_calls[%ui]."
                                          "function.arguments' must be a "
                                          "JSON object's text", i, k);
            }

            cJSON_Delete(fn);
        }

        k++;
    }

    return NGX_OK;
}


/* the call of an assistant turn with this id, or NULL */

static cJSON *
ngx_http_hypic_tools_call_of(cJSON *asked, const char *id)
{
    cJSON  *call, *cid;

    cJSON_ArrayForEach(call,
                       cJSON_GetObjectItemCaseSensitive(asked, "tool_calls"))
    {
        cid = cJSON_GetObjectItemCaseSensitive(call, "id");

        if (cJSON_IsString(cid) && ngx_strcmp(cid->valuestring, id) == 0) {
            return call;
        }
    }

    return NULL;
}


/* each call of messages[k] (asked) has its answer in the tool turns after
 * it */

static ngx_int_t
ngx_http_hypic_tools_answered(cJSON *asked, ngx_uint_t k,
    ngx_http_hypic_bad_t *bad)
{
    cJSON  *call, *id, *m, *answer;

    cJSON_ArrayForEach(call,
                       cJSON_GetObjectItemCaseSensitive(asked, "tool_calls"))
    {
        id = cJSON_GetObjectItemCaseSensitive(call, "id");

        for (m = asked->next; m; m = m->next) {
            if (ngx_strcmp(cJSON_GetObjectItemCaseSensitive(m, "role")
                               ->valuestring, "tool")
                != 0)
            {
                m = NULL;
                break;
            }

            answer = cJSON_GetObjectItemCaseSensitive(m, "tool_call_id");

            if (ngx_strcmp(answer->valuestring, id->valuestring) == 0) {
                break;
            }
        }

        if (m == NULL) {
            return ngx_http_hypic_bad(bad, NGX_HTTP_BAD_REQUEST,
                                      "messages", NULL,
                                      "an assistant message with "
                                      "'tool_calls' must be followed by tool "
                                      "messages answering each call: "
                                      "'messages[%ui].tool_calls' '%s' has "
                                      "no answer", k, id->valuestring);
        }
    }

    return NGX_OK;
}


/* OpenAI's function names: 1 to 64 of [a-zA-Z0-9_-] */

static ngx_uint_t
ngx_http_hypic_tools_name_ok(cJSON *name)
{
    u_char  *p, c;
    size_t   n;

    if (!cJSON_IsString(name)) {
        return 0;
    }

    p = (u_char *) name->valuestring;
    n = ngx_strlen(p);

    if (n == 0 || n > 64) {
        return 0;
    }

    while ((c = *p++)) {
        if (!(isalnum(c) || c == '_' || c == '-')) {
            return 0;
        }
    }

    return 1;
}


static cJSON *
ngx_http_hypic_tools_find(cJSON *tools, const char *name)
{
    cJSON  *tool, *n;

    cJSON_ArrayForEach(tool, tools) {
        n = cJSON_GetObjectItemCaseSensitive(
                cJSON_GetObjectItemCaseSensitive(tool, "function"), "name");

        if (cJSON_IsString(n) && ngx_strcmp(n->valuestring, name) == 0) {
            return tool;
        }
    }

    return NULL;
}


ngx_int_t
ngx_http_hypic_tools_setup(ngx_http_request_t *r, ngx_http_hypic_ctx_t *ctx)
{
    ngx_pool_cleanup_t      *cln;
    ngx_http_hypic_tools_t  *t;

    if (!ctx->in.tool_calls) {
        return NGX_OK;
    }

    t = ngx_pcalloc(r->pool, sizeof(ngx_http_hypic_tools_t));
    if (t == NULL) {
        return NGX_ERROR;
    }

    t->choice = ngx_pcalloc(r->pool,
                            ctx->out.n * sizeof(ngx_http_hypic_tools_choice_t));
    if (t->choice == NULL) {
        return NGX_ERROR;
    }

    t->n = ctx->out.n;

    cln = ngx_pool_cleanup_add(r->pool, 0);
    if (cln == NULL) {
        return NGX_ERROR;
    }

    /* the body's JSON is gone once the request is built */

    t->tools = cJSON_Duplicate(ctx->in.tools, 1);
    if (t->tools == NULL) {
        return NGX_ERROR;
    }

    cln->handler = ngx_http_hypic_tools_cleanup;
    cln->data = t;

    t->parallel = ctx->in.parallel;

    ctx->out.tools = t;

    return NGX_OK;
}


static void
ngx_http_hypic_tools_cleanup(void *data)
{
    ngx_uint_t               i;
    ngx_http_hypic_tools_t  *t = data;

    for (i = 0; i < t->n; i++) {
        hp_tool_scan_free(&t->choice[i].scan);
    }

    cJSON_Delete(t->tools);
}


ngx_int_t
ngx_http_hypic_tools_text(ngx_http_request_t *r, ngx_http_hypic_ctx_t *ctx,
    ngx_uint_t i, u_char *data, size_t len)
{
    ngx_http_hypic_tools_t       *t = ctx->out.tools;
    ngx_http_hypic_tools_sink_t   sink;

    sink.r = r;
    sink.i = i;

    if (hp_tool_scan_feed(&t->choice[i].scan, (const char *) data, len,
                          ngx_http_hypic_tools_sink, &sink)
        != 0)
    {
        return NGX_ERROR;
    }

    return NGX_OK;
}


ngx_int_t
ngx_http_hypic_tools_end(ngx_http_request_t *r, ngx_http_hypic_ctx_t *ctx,
    ngx_uint_t i)
{
    ngx_http_hypic_tools_t       *t = ctx->out.tools;
    ngx_http_hypic_tools_sink_t   sink;

    if (t == NULL) {
        return NGX_OK;
    }

    sink.r = r;
    sink.i = i;

    if (hp_tool_scan_end(&t->choice[i].scan, ngx_http_hypic_tools_sink,
                         &sink)
        != 0)
    {
        return NGX_ERROR;
    }

    return NGX_OK;
}


static int
ngx_http_hypic_tools_sink(void *ud, int kind, const char *data, size_t len)
{
    char                           *name, *args;
    ngx_int_t                       rc;
    ngx_uint_t                      i;
    ngx_http_request_t             *r;
    ngx_http_hypic_ctx_t           *ctx;
    ngx_http_hypic_tools_t         *t;
    ngx_http_hypic_tools_sink_t    *sink = ud;
    ngx_http_hypic_tools_choice_t  *tc;

    r = sink->r;
    i = sink->i;
    ctx = ngx_http_get_module_ctx(r, ngx_http_hypic_module);
    t = ctx->out.tools;
    tc = &t->choice[i];

    if (kind == HP_TOOL_TEXT) {
        return ngx_http_hypic_tools_content(r, ctx, i, data, len) == NGX_OK
               ? 0 : -1;
    }

    if (hp_tool_parse(data, len, t->tools, &name, &args) != 0) {

        /* not a call: the model's text, as it wrote it */

        ngx_log_debug1(NGX_LOG_DEBUG_HTTP, r->connection->log, 0,
                       "hypic: malformed tool call in %V", &ctx->out.id);

        rc = ngx_http_hypic_tools_content(r, ctx, i, HP_TOOL_OPEN,
                                          sizeof(HP_TOOL_OPEN) - 1);

        if (rc == NGX_OK) {
            rc = ngx_http_hypic_tools_content(r, ctx, i, data, len);
        }

        if (rc == NGX_OK) {
            rc = ngx_http_hypic_tools_content(r, ctx, i, HP_TOOL_CLOSE,
                                              sizeof(HP_TOOL_CLOSE) - 1);
        }

        return rc == NGX_OK ? 0 : -1;
    }

    /* parallel_tool_calls false: the first call only */

    rc = (t->parallel || tc->n_calls == 0)
         ? ngx_http_hypic_tools_call(r, ctx, i, name, args) : NGX_OK;

    free(name);
    free(args);

    return rc == NGX_OK ? 0 : -1;
}


static ngx_int_t
ngx_http_hypic_tools_content(ngx_http_request_t *r,
    ngx_http_hypic_ctx_t *ctx, ngx_uint_t i, const char *data, size_t len)
{
    if (len == 0) {
        return NGX_OK;
    }

    return ngx_http_hypic_choice_text(r, ctx, i, (u_char *) data, len);
}


/*
 * {"index":N,"id":"call_...","type":"function","function":{"name":"..",
 * "arguments":".."}}: streamed as a delta of its own (one chunk holds a
 * whole call), or gathered for the message (without "index").
 */

static ngx_int_t
ngx_http_hypic_tools_call(ngx_http_request_t *r, ngx_http_hypic_ctx_t *ctx,
    ngx_uint_t i, char *name, char *args)
{
    u_char                         *p, *q;
    size_t                          len, nlen, alen;
    ngx_str_t                       delta;
    ngx_http_hypic_tools_t         *t = ctx->out.tools;
    ngx_http_hypic_tools_choice_t  *tc = &t->choice[i];

    nlen = ngx_strlen(name);
    alen = ngx_strlen(args);

    len = sizeof("{\"tool_calls\":[{\"index\":,\"id\":\"call_\","
                 "\"type\":\"function\",\"function\":{\"name\":\"\","
                 "\"arguments\":\"\"}}]},") - 1
          + NGX_INT_T_LEN + 24
          + ngx_http_hypic_json_escape_len((u_char *) name, nlen)
          + ngx_http_hypic_json_escape_len((u_char *) args, alen);

    p = ngx_pnalloc(r->pool, len);
    if (p == NULL) {
        return NGX_ERROR;
    }

    q = p;

    if (ctx->in.stream) {
        q = ngx_sprintf(q, "{\"tool_calls\":[{\"index\":%ui,", tc->n_calls);

    } else {
        *q++ = '{';
    }

    q = ngx_sprintf(q, "\"id\":\"call_%08xD%08xD%08xD\",\"type\":\"function\","
                    "\"function\":{\"name\":\"",
                    (uint32_t) ngx_random(), (uint32_t) ngx_random(),
                    (uint32_t) ngx_random());
    q = ngx_http_hypic_json_escape(q, (u_char *) name, nlen);
    q = ngx_cpymem(q, "\",\"arguments\":\"", sizeof("\",\"arguments\":\"") - 1);
    q = ngx_http_hypic_json_escape(q, (u_char *) args, alen);
    q = ngx_cpymem(q, "\"}}", 3);

    tc->n_calls++;

    if (ctx->in.stream) {
        q = ngx_cpymem(q, "]}", 2);

        delta.data = p;
        delta.len = q - p;

        return ngx_http_hypic_choice_chunk(r, ctx, i, &delta, NULL, 0, NULL);
    }

    /* ,"tool_calls":[CALL,CALL,...] grows in the pool */

    len = (size_t) (q - p);

    if (tc->calls.len + len + sizeof(",\"tool_calls\":[]") > tc->calls_cap) {
        tc->calls_cap = ngx_max(2 * tc->calls_cap,
                                tc->calls.len + len + 256);

        q = ngx_pnalloc(r->pool, tc->calls_cap);
        if (q == NULL) {
            return NGX_ERROR;
        }

        if (tc->calls.len) {
            ngx_memcpy(q, tc->calls.data, tc->calls.len);
        }

        tc->calls.data = q;
    }

    q = tc->calls.data + tc->calls.len;

    if (tc->calls.len == 0) {
        q = ngx_cpymem(q, ",\"tool_calls\":[", sizeof(",\"tool_calls\":[")
                                                 - 1);

    } else {
        q[-1] = ',';   /* over the closing bracket */
    }

    q = ngx_cpymem(q, p, len);
    *q++ = ']';

    tc->calls.len = q - tc->calls.data;

    return NGX_OK;
}


ngx_str_t *
ngx_http_hypic_tools_calls(ngx_http_hypic_ctx_t *ctx, ngx_uint_t i)
{
    ngx_http_hypic_tools_t  *t = ctx->out.tools;

    return (t && t->choice[i].calls.len) ? &t->choice[i].calls
                                         : &ngx_http_hypic_tools_none;
}


ngx_str_t *
ngx_http_hypic_tools_finish(ngx_http_hypic_ctx_t *ctx, ngx_uint_t i,
    ngx_uint_t finish)
{
    ngx_http_hypic_tools_t  *t = ctx->out.tools;

    if (t && t->choice[i].n_calls && finish == HP_IPC_FINISH_STOP) {
        return &ngx_http_hypic_tools_reason;
    }

    return ngx_http_hypic_finish_name(finish);
}
