
/*
 * HYPIC serve: a hypic_pass request's body, checked and turned into the
 * engine request.
 *
 * The body is read as one piece of memory and checked strictly as JSON.
 * Then one pass over its fields checks each and, in the same step, puts
 * it where it goes: the engine request (ctx->in.req), the prompt, or how
 * the answer is written. What OpenAI would refuse is an OpenAI-shaped
 * error naming the field. A chat request goes to the engine as its body,
 * which the engine renders with the model's chat template.
 */


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include <cJSON.h>

#include "ngx_http_hypic_module.h"
#include "ngx_http_hypic_choice.h"
#include "ngx_http_hypic_json.h"
#include "ngx_http_hypic_request.h"
#include "ngx_http_hypic_format.h"
#include "ngx_http_hypic_response.h"
#include "ngx_http_hypic_tools.h"


/* OpenAI's default for the legacy completions endpoint */
#define NGX_HTTP_HYPIC_COMPLETION_TOKENS  16


static ngx_int_t ngx_http_hypic_read_body(ngx_http_request_t *r,
    ngx_str_t *body);
static ngx_int_t ngx_http_hypic_parse(ngx_pool_t *pool, ngx_str_t *body,
    cJSON **json, ngx_http_hypic_bad_t *bad);
static ngx_int_t ngx_http_hypic_refuse_json(ngx_pool_t *pool,
    ngx_http_hypic_json_err_t *err, size_t size, ngx_http_hypic_bad_t *bad);
static ngx_int_t ngx_http_hypic_check_common(ngx_http_request_t *r,
    ngx_http_hypic_ctx_t *ctx, cJSON *json, ngx_http_hypic_bad_t *bad);
static ngx_int_t ngx_http_hypic_check_completion(ngx_http_request_t *r,
    ngx_http_hypic_ctx_t *ctx, cJSON *json, ngx_http_hypic_bad_t *bad);
static ngx_int_t ngx_http_hypic_check_chat(ngx_http_request_t *r,
    ngx_http_hypic_ctx_t *ctx, cJSON *json, ngx_http_hypic_bad_t *bad);
static ngx_int_t ngx_http_hypic_check_content(ngx_http_request_t *r,
    ngx_http_hypic_ctx_t *ctx, cJSON *content, ngx_uint_t i,
    ngx_http_hypic_bad_t *bad);
static ngx_int_t ngx_http_hypic_check_extras(ngx_http_request_t *r,
    ngx_http_hypic_ctx_t *ctx, cJSON *json, ngx_http_hypic_bad_t *bad);
static ngx_int_t ngx_http_hypic_check_stop(hp_ipc_request_t *req,
    cJSON *json, ngx_http_hypic_bad_t *bad);
static ngx_int_t ngx_http_hypic_check_decode(hp_ipc_request_t *req,
    cJSON *json, ngx_http_hypic_bad_t *bad);
static ngx_int_t ngx_http_hypic_decode_form(cJSON *item);
static ngx_int_t ngx_http_hypic_build(ngx_http_request_t *r,
    ngx_http_hypic_ctx_t *ctx, cJSON *json);
static ngx_uint_t ngx_http_hypic_eval_mode(ngx_http_request_t *r,
    ngx_http_hypic_loc_conf_t *hlcf);


static ngx_str_t  ngx_http_hypic_roles[] = {
    ngx_string("system"),
    ngx_string("developer"),
    ngx_string("user"),
    ngx_string("assistant"),
    ngx_string("tool"),
    ngx_null_string
};


/*
 * The checks run in this order, each filling what it checked; the first
 * that fails is the client's answer.
 */

ngx_int_t
ngx_http_hypic_request_parse(ngx_http_request_t *r,
    ngx_http_hypic_ctx_t *ctx, ngx_http_hypic_bad_t *bad)
{
    cJSON      *json;
    ngx_int_t   rc;
    ngx_str_t   body;
    ngx_uint_t  chat;

    chat = (ctx->in.endpoint == NGX_HTTP_HYPIC_CHAT);

    if (ngx_http_hypic_read_body(r, &body) != NGX_OK) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    rc = ngx_http_hypic_parse(r->pool, &body, &json, bad);

    if (rc == NGX_OK) {
        rc = ngx_http_hypic_check_common(r, ctx, json, bad);
    }

    if (rc == NGX_OK) {
        rc = chat ? ngx_http_hypic_check_chat(r, ctx, json, bad)
                  : ngx_http_hypic_check_completion(r, ctx, json, bad);
    }

    if (rc == NGX_OK && chat) {
        rc = ngx_http_hypic_tools_check(ctx, json, bad);

        /* the engine renders the body with the model's chat template; a
         * byte order mark is not JSON to its parser */

        ctx->in.prompt = body;

        if (body.len >= 3 && ngx_strncmp(body.data, "\xef\xbb\xbf", 3) == 0)
        {
            ctx->in.prompt.data += 3;
            ctx->in.prompt.len -= 3;
        }
    }

    if (rc == NGX_OK) {
        rc = ngx_http_hypic_format(r, ctx, json, bad);
    }

    if (rc == NGX_OK) {
        rc = ngx_http_hypic_check_extras(r, ctx, json, bad);
    }

    if (rc == NGX_OK) {
        rc = ngx_http_hypic_choices_check(ctx, json, bad);
    }

    if (rc == NGX_OK) {
        rc = ngx_http_hypic_build(r, ctx, json);
    }

    if (json) {
        cJSON_Delete(json);
        ctx->in.tools = NULL;
    }

    return rc;
}


static ngx_int_t
ngx_http_hypic_read_body(ngx_http_request_t *r, ngx_str_t *body)
{
    off_t         len, size;
    u_char       *p;
    ssize_t       n;
    ngx_buf_t    *b, *one;
    ngx_uint_t    nbufs;
    ngx_chain_t  *cl;

    ngx_str_null(body);

    if (r->request_body == NULL) {
        return NGX_OK;
    }

    len = 0;
    nbufs = 0;
    one = NULL;

    for (cl = r->request_body->bufs; cl; cl = cl->next) {
        size = ngx_buf_size(cl->buf);

        if (size > 0) {
            len += size;
            nbufs++;
            one = cl->buf;
        }
    }

    if (len == 0) {
        return NGX_OK;
    }

    if (nbufs == 1 && ngx_buf_in_memory(one)) {
        body->data = one->pos;
        body->len = one->last - one->pos;
        return NGX_OK;
    }

    p = ngx_pnalloc(r->pool, (size_t) len);
    if (p == NULL) {
        return NGX_ERROR;
    }

    body->data = p;

    for (cl = r->request_body->bufs; cl; cl = cl->next) {
        b = cl->buf;
        size = ngx_buf_size(b);

        if (size == 0) {
            continue;
        }

        /* as ngx_buf_size() counts it: memory first, then the file */

        if (ngx_buf_in_memory(b)) {
            p = ngx_cpymem(p, b->pos, (size_t) size);
            continue;
        }

        n = ngx_read_file(b->file, p, (size_t) size, b->file_pos);

        if (n == NGX_ERROR) {
            return NGX_ERROR;
        }

        if (n != (ssize_t) size) {
            ngx_log_error(NGX_LOG_ALERT, r->connection->log, 0,
                          "hypic: read only %z of %O bytes of the body "
                          "from \"%V\"", n, size, &b->file->name);
            return NGX_ERROR;
        }

        p += n;
    }

    body->len = p - body->data;

    return NGX_OK;
}


/*
 * The body is checked strictly before cJSON reads it (see
 * ngx_http_hypic_json_parse.c): what cJSON would lose or change is
 * refused, naming the field, rather than passed on changed.
 */

static ngx_int_t
ngx_http_hypic_parse(ngx_pool_t *pool, ngx_str_t *body, cJSON **json,
    ngx_http_hypic_bad_t *bad)
{
    const char                **scratch;
    ngx_http_hypic_json_err_t   err;

    *json = NULL;

    if (body->len == 0) {
        return ngx_http_hypic_bad(bad, NGX_HTTP_BAD_REQUEST, NULL, NULL,
                                  "We could not parse the JSON body of "
                                  "your request: the body is empty");
    }

    if (ngx_http_hypic_json_check(body->data, body->len, &err) != NGX_OK) {
        return ngx_http_hypic_refuse_json(pool, &err, body->len, bad);
    }

    /* the text is valid: cJSON fails only for want of memory */

    *json = cJSON_ParseWithLength((const char *) body->data + err.start,
                                  body->len - err.start);
    if (*json == NULL) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    if (!cJSON_IsObject(*json)) {
        return ngx_http_hypic_bad(bad, NGX_HTTP_BAD_REQUEST, NULL, NULL,
                                  "The request body must be a JSON object");
    }

    scratch = ngx_palloc(pool, err.keys * sizeof(const char *));
    if (scratch == NULL) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    if (ngx_http_hypic_json_unique(*json, scratch, &err) != NGX_OK) {
        return ngx_http_hypic_refuse_json(pool, &err, 0, bad);
    }

    return NGX_OK;
}


/* a 400 for a refused body; size 0: the reason has no byte (unique) */

static ngx_int_t
ngx_http_hypic_refuse_json(ngx_pool_t *pool, ngx_http_hypic_json_err_t *err,
    size_t size, ngx_http_hypic_bad_t *bad)
{
    size_t   n;
    u_char  *param;

    n = err->path_last - err->path;

    if (n == 0) {
        return ngx_http_hypic_bad(bad, NGX_HTTP_BAD_REQUEST, NULL, NULL,
                                  "We could not parse the JSON body of "
                                  "your request: %s at byte %uz of %uz",
                                  err->reason, err->offset, size);
    }

    param = ngx_pnalloc(pool, n + 1);
    if (param == NULL) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    *ngx_cpymem(param, err->path, n) = '\0';

    if (size == 0) {
        return ngx_http_hypic_bad(bad, NGX_HTTP_BAD_REQUEST, (char *) param,
                                  NULL, "We could not parse the JSON body "
                                  "of your request: %s, '%s'", err->reason,
                                  param);
    }

    return ngx_http_hypic_bad(bad, NGX_HTTP_BAD_REQUEST, (char *) param,
                              NULL, "We could not parse the JSON body of "
                              "your request: %s at byte %uz of %uz, in '%s'",
                              err->reason, err->offset, size, param);
}



/* model, stream, max_tokens, max_completion_tokens, temperature, top_p */

static ngx_int_t
ngx_http_hypic_check_common(ngx_http_request_t *r, ngx_http_hypic_ctx_t *ctx,
    cJSON *json, ngx_http_hypic_bad_t *bad)
{
    cJSON                      *item;
    double                      max, tokens, completion, temperature, top_p;
    ngx_int_t                   rc;
    ngx_str_t                  *model;
    hp_ipc_request_t           *req;
    ngx_http_hypic_loc_conf_t  *hlcf;

    hlcf = ngx_http_get_module_loc_conf(r, ngx_http_hypic_module);
    req = &ctx->in.req;

    item = cJSON_GetObjectItemCaseSensitive(json, "model");

    if (item && !cJSON_IsNull(item)) {

        if (!cJSON_IsString(item)) {
            return ngx_http_hypic_bad(bad, NGX_HTTP_BAD_REQUEST, "model",
                                      NULL, "'model' must be a string");
        }

        model = &hlcf->engine->model;

        if (ngx_strlen(item->valuestring) != model->len
            || ngx_strncmp(item->valuestring, model->data, model->len) != 0)
        {
            return ngx_http_hypic_bad(bad, NGX_HTTP_NOT_FOUND, "model",
                                      "model_not_found",
                                      "The model '%s' does not exist here, "
                                      "this endpoint serves '%V'",
                                      item->valuestring, model);
        }
    }

    item = cJSON_GetObjectItemCaseSensitive(json, "stream");

    if (item && !cJSON_IsNull(item) && !cJSON_IsBool(item)) {
        return ngx_http_hypic_bad(bad, NGX_HTTP_BAD_REQUEST, "stream", NULL,
                                  "'stream' must be a boolean");
    }

    ctx->in.stream = cJSON_IsTrue(item);

    max = (double) hlcf->max_tokens;

    /* chat's default is the limit, the legacy endpoint's OpenAI's 16; chat
     * takes max_completion_tokens first, the legacy endpoint never */

    tokens = (ctx->in.endpoint == NGX_HTTP_HYPIC_CHAT)
             ? max : ngx_min(NGX_HTTP_HYPIC_COMPLETION_TOKENS, max);
    completion = -1;
    temperature = 1;
    top_p = 1;

    rc = ngx_http_hypic_check_number(json, "max_tokens", 0, max, 1, &tokens,
                                     bad);

    if (rc == NGX_OK) {
        rc = ngx_http_hypic_check_number(json, "max_completion_tokens", 0,
                                         max, 1, &completion, bad);
    }

    if (rc == NGX_OK) {
        rc = ngx_http_hypic_check_number(json, "temperature", 0, 2, 0,
                                         &temperature, bad);
    }

    if (rc == NGX_OK) {
        rc = ngx_http_hypic_check_number(json, "top_p", 0, 1, 0, &top_p,
                                         bad);
    }

    if (rc != NGX_OK) {
        return rc;
    }

    if (ctx->in.endpoint == NGX_HTTP_HYPIC_CHAT && completion >= 0) {
        tokens = completion;
    }

    req->max_tokens = (uint32_t) tokens;
    req->temperature = (float) temperature;
    req->top_p = (float) top_p;

    /* top_p 0 keeps only the likeliest token: that is greedy */

    if (req->top_p <= 0) {
        req->top_p = 1;
        req->temperature = 0;
    }

    return NGX_OK;
}


ngx_int_t
ngx_http_hypic_check_number(cJSON *json, const char *name, double min,
    double max, ngx_uint_t integer, double *value, ngx_http_hypic_bad_t *bad)
{
    cJSON  *item;
    double  v;

    item = cJSON_GetObjectItemCaseSensitive(json, name);

    if (item == NULL || cJSON_IsNull(item)) {
        return NGX_OK;
    }

    if (cJSON_IsNumber(item)) {
        v = item->valuedouble;

        /* in range first, so that the cast below is defined */

        if (v >= min && v <= max
            && (!integer || v == (double) (int64_t) v))
        {
            if (value) {
                *value = v;
            }

            return NGX_OK;
        }
    }

    if (integer) {
        return ngx_http_hypic_bad(bad, NGX_HTTP_BAD_REQUEST, name, NULL,
                                  "'%s' must be an integer from %L to %L",
                                  name, (int64_t) min, (int64_t) max);
    }

    return ngx_http_hypic_bad(bad, NGX_HTTP_BAD_REQUEST, name, NULL,
                              "'%s' must be a number from %.1f to %.1f",
                              name, min, max);
}


/* the legacy endpoint's prompt: one string, copied (cJSON's goes away) */

static ngx_int_t
ngx_http_hypic_check_completion(ngx_http_request_t *r,
    ngx_http_hypic_ctx_t *ctx, cJSON *json, ngx_http_hypic_bad_t *bad)
{
    cJSON  *prompt, *item;

    prompt = cJSON_GetObjectItemCaseSensitive(json, "prompt");

    if (prompt == NULL) {
        return ngx_http_hypic_bad(bad, NGX_HTTP_BAD_REQUEST, "prompt", NULL,
                                  "Missing required parameter: 'prompt'");
    }

    item = NULL;

    if (cJSON_IsString(prompt)) {
        item = prompt;

    } else if (cJSON_IsArray(prompt) && cJSON_GetArraySize(prompt) > 0) {

        cJSON_ArrayForEach(item, prompt) {
            if (!cJSON_IsString(item)) {
                break;
            }
        }

        if (item == NULL) {
            if (cJSON_GetArraySize(prompt) != 1) {
                return ngx_http_hypic_bad(bad, NGX_HTTP_BAD_REQUEST,
                                          "prompt", NULL, "only one prompt "
                                          "per request is supported");
            }

            item = prompt->child;

        } else {
            item = NULL;
        }
    }

    if (item == NULL) {
        return ngx_http_hypic_bad(bad, NGX_HTTP_BAD_REQUEST, "prompt", NULL,
                                  "'prompt' must be a string or a "
                                  "non-empty array of strings");
    }

    /* what would change the answer and is not done is refused, not
     * ignored */

    prompt = cJSON_GetObjectItemCaseSensitive(json, "echo");

    if (prompt && !cJSON_IsNull(prompt) && !cJSON_IsFalse(prompt)) {
        return ngx_http_hypic_bad(bad, NGX_HTTP_BAD_REQUEST, "echo", NULL,
                                  "'echo' is not supported: it may only "
                                  "be false");
    }

    prompt = cJSON_GetObjectItemCaseSensitive(json, "suffix");

    if (prompt && !cJSON_IsNull(prompt)
        && !(cJSON_IsString(prompt) && prompt->valuestring[0] == '\0'))
    {
        return ngx_http_hypic_bad(bad, NGX_HTTP_BAD_REQUEST, "suffix", NULL,
                                  "'suffix' is not supported");
    }

    ctx->in.prompt.len = ngx_strlen(item->valuestring);
    ctx->in.prompt.data = ngx_pnalloc(r->pool, ctx->in.prompt.len + 1);
    if (ctx->in.prompt.data == NULL) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    ngx_memcpy(ctx->in.prompt.data, item->valuestring, ctx->in.prompt.len);

    return NGX_OK;
}


/*
 * The messages: each an object with a known role and content, whose texts
 * are kept (ctx->in.contents) for the Redis lookup, as they may hold
 * segments.
 */

static ngx_int_t
ngx_http_hypic_check_chat(ngx_http_request_t *r, ngx_http_hypic_ctx_t *ctx,
    cJSON *json, ngx_http_hypic_bad_t *bad)
{
    cJSON       *messages, *message, *role, *content;
    ngx_int_t    rc;
    ngx_str_t    name;
    ngx_uint_t   i, k;

    messages = cJSON_GetObjectItemCaseSensitive(json, "messages");

    if (messages == NULL) {
        return ngx_http_hypic_bad(bad, NGX_HTTP_BAD_REQUEST, "messages",
                                  NULL,
                                  "Missing required parameter: 'messages'");
    }

    if (!cJSON_IsArray(messages) || cJSON_GetArraySize(messages) == 0) {
        return ngx_http_hypic_bad(bad, NGX_HTTP_BAD_REQUEST, "messages",
                                  NULL,
                                  "'messages' must be a non-empty array");
    }

    ctx->in.req.flags |= HP_IPC_FLAG_CHAT;

    ctx->in.contents = ngx_array_create(r->pool, 4, sizeof(ngx_str_t));
    if (ctx->in.contents == NULL) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    i = 0;

    cJSON_ArrayForEach(message, messages) {

        if (!cJSON_IsObject(message)) {
            return ngx_http_hypic_bad(bad, NGX_HTTP_BAD_REQUEST, "messages",
                                      NULL, "'messages[%ui]' must be an "
                                      "object", i);
        }

        role = cJSON_GetObjectItemCaseSensitive(message, "role");

        if (!cJSON_IsString(role)) {
            return ngx_http_hypic_bad(bad, NGX_HTTP_BAD_REQUEST, "messages",
                                      NULL, "'messages[%ui].role' must be "
                                      "a string", i);
        }

        name.data = (u_char *) role->valuestring;
        name.len = ngx_strlen(role->valuestring);

        for (k = 0; ngx_http_hypic_roles[k].len; k++) {
            if (name.len == ngx_http_hypic_roles[k].len
                && ngx_strncmp(name.data, ngx_http_hypic_roles[k].data,
                               name.len)
                   == 0)
            {
                break;
            }
        }

        if (ngx_http_hypic_roles[k].len == 0) {
            return ngx_http_hypic_bad(bad, NGX_HTTP_BAD_REQUEST, "messages",
                                      NULL, "'messages[%ui].role' must be "
                                      "system, developer, user, assistant "
                                      "or tool, not '%V'", i, &name);
        }

        content = cJSON_GetObjectItemCaseSensitive(message, "content");

        /* only an assistant turn (with tool calls) may have no content */

        if (!(cJSON_IsString(content) || cJSON_IsArray(content)
              || ((content == NULL || cJSON_IsNull(content))
                  && ngx_strcmp(name.data, "assistant") == 0)))
        {
            return ngx_http_hypic_bad(bad, NGX_HTTP_BAD_REQUEST, "messages",
                                      NULL, "'messages[%ui].content' must "
                                      "be a string or an array of content "
                                      "parts", i);
        }

        rc = ngx_http_hypic_check_content(r, ctx, content, i, bad);

        if (rc != NGX_OK) {
            return rc;
        }

        i++;
    }

    return NGX_OK;
}


/*
 * A message's content: its text parts only (others are refused), kept.
 * NGX_OK, NGX_ERROR with bad, or 500 (no memory).
 */

static ngx_int_t
ngx_http_hypic_check_content(ngx_http_request_t *r,
    ngx_http_hypic_ctx_t *ctx, cJSON *content, ngx_uint_t i,
    ngx_http_hypic_bad_t *bad)
{
    cJSON      *part, *type, *text;
    ngx_str_t  *s;

    part = cJSON_IsArray(content) ? content->child : content;

    for ( /* void */ ; part; part = cJSON_IsArray(content) ? part->next
                                                          : NULL)
    {
        text = part;

        if (cJSON_IsArray(content)) {
            type = cJSON_GetObjectItemCaseSensitive(part, "type");
            text = cJSON_GetObjectItemCaseSensitive(part, "text");

            if (!cJSON_IsString(type)
                || ngx_strcmp(type->valuestring, "text") != 0
                || !cJSON_IsString(text))
            {
                return ngx_http_hypic_bad(bad, NGX_HTTP_BAD_REQUEST,
                                          "messages", NULL,
                                          "'messages[%ui].content' parts "
                                          "must be {\"type\": \"text\", "
                                          "\"text\": ...}: only text is "
                                          "supported", i);
            }
        }

        if (!cJSON_IsString(text)) {
            continue;
        }

        s = ngx_array_push(ctx->in.contents);
        if (s == NULL) {
            return NGX_HTTP_INTERNAL_SERVER_ERROR;
        }

        s->len = ngx_strlen(text->valuestring);
        s->data = ngx_pnalloc(r->pool, s->len);
        if (s->data == NULL) {
            return NGX_HTTP_INTERNAL_SERVER_ERROR;
        }

        ngx_memcpy(s->data, text->valuestring, s->len);
    }

    return NGX_OK;
}


/* the extensions and the fields the checks above leave alone */

static ngx_int_t
ngx_http_hypic_check_extras(ngx_http_request_t *r, ngx_http_hypic_ctx_t *ctx,
    cJSON *json, ngx_http_hypic_bad_t *bad)
{
    cJSON             *item;
    double             top_k, seed;
    ngx_int_t          rc;
    hp_ipc_request_t  *req;

    req = &ctx->in.req;

    /* past the range: no seed was given */

    top_k = 0;
    seed = 1e19;

    rc = ngx_http_hypic_check_number(json, "top_k", 0, 1e9, 1, &top_k, bad);

    if (rc == NGX_OK) {
        rc = ngx_http_hypic_check_number(json, "seed", -9e18, 9e18, 1, &seed,
                                         bad);
    }

    /* taken without effect, as by vLLM, but only within OpenAI's range */

    if (rc == NGX_OK) {
        rc = ngx_http_hypic_check_number(json, "frequency_penalty", -2, 2, 0,
                                         NULL, bad);
    }

    if (rc == NGX_OK) {
        rc = ngx_http_hypic_check_number(json, "presence_penalty", -2, 2, 0,
                                         NULL, bad);
    }

    if (rc != NGX_OK) {
        return rc;
    }

    req->top_k = (int32_t) top_k;

    /* no seed: one of our own, so that choices still differ */

    req->seed = (seed <= 9e18)
                ? (uint64_t) (int64_t) seed
                : ((uint64_t) ngx_random() << 32) ^ (uint64_t) ngx_random()
                  ^ (r->connection->number << 8);

    item = cJSON_GetObjectItemCaseSensitive(json, "ignore_eos");

    if (item && !cJSON_IsNull(item) && !cJSON_IsBool(item)) {
        return ngx_http_hypic_bad(bad, NGX_HTTP_BAD_REQUEST, "ignore_eos",
                                  NULL, "'ignore_eos' must be a boolean");
    }

    if (cJSON_IsTrue(item)) {
        req->flags |= HP_IPC_FLAG_IGNORE_EOS;
    }

    if (ngx_http_hypic_check_decode(req, json, bad) != NGX_OK) {
        return NGX_ERROR;
    }

    item = cJSON_GetObjectItemCaseSensitive(json, "stream_options");

    if (item && !cJSON_IsNull(item)) {
        if (!cJSON_IsObject(item)) {
            return ngx_http_hypic_bad(bad, NGX_HTTP_BAD_REQUEST,
                                      "stream_options", NULL,
                                      "'stream_options' must be an object");
        }

        item = cJSON_GetObjectItemCaseSensitive(item, "include_usage");

        if (item && !cJSON_IsNull(item) && !cJSON_IsBool(item)) {
            return ngx_http_hypic_bad(bad, NGX_HTTP_BAD_REQUEST,
                                      "stream_options", NULL,
                                      "'stream_options.include_usage' must "
                                      "be a boolean");
        }

        ctx->in.include_usage = (ctx->in.stream && cJSON_IsTrue(item));
    }

    return ngx_http_hypic_check_stop(req, json, bad);
}


static ngx_int_t
ngx_http_hypic_check_stop(hp_ipc_request_t *req, cJSON *json,
    ngx_http_hypic_bad_t *bad)
{
    cJSON       *item, *stop;
    size_t       len;
    ngx_uint_t   n;

    stop = cJSON_GetObjectItemCaseSensitive(json, "stop");

    if (stop == NULL || cJSON_IsNull(stop)) {
        return NGX_OK;
    }

    if (cJSON_IsString(stop)) {
        n = 1;
        item = stop;

    } else if (cJSON_IsArray(stop)) {
        n = cJSON_GetArraySize(stop);
        item = stop->child;

    } else {
        n = 0;
        item = NULL;
    }

    if ((item == NULL && !cJSON_IsArray(stop)) || n > HP_IPC_MAX_STOP) {
        return ngx_http_hypic_bad(bad, NGX_HTTP_BAD_REQUEST, "stop", NULL,
                                  "'stop' must be a string or an array of "
                                  "at most %d strings", HP_IPC_MAX_STOP);
    }

    for (n = 0; item; item = cJSON_IsArray(stop) ? item->next : NULL) {
        len = cJSON_IsString(item) ? ngx_strlen(item->valuestring) : 0;

        if (len == 0 || len > HP_IPC_STOP_BYTES) {
            return ngx_http_hypic_bad(bad, NGX_HTTP_BAD_REQUEST, "stop",
                                      NULL, "each 'stop' sequence must be "
                                      "a string of 1 to %d bytes",
                                      HP_IPC_STOP_BYTES);
        }

        req->stop_len[n] = (uint32_t) len;
        ngx_memcpy(req->stop[n], item->valuestring, len);
        n++;
    }

    req->n_stop = (uint32_t) n;

    return NGX_OK;
}


/*
 * The extension object "hypic": {"decode": "recurrent"|"chunkwise"|"auto",
 * "speculative": true|false, "max_draft": 1..16}, each optional (absent:
 * the engine's setting). Speculative drafts are verified in the KVBuffer,
 * so they cannot go with recurrent decoding.
 */

static ngx_int_t
ngx_http_hypic_check_decode(hp_ipc_request_t *req, cJSON *json,
    ngx_http_hypic_bad_t *bad)
{
    cJSON      *opts, *item;
    ngx_int_t   form;

    opts = cJSON_GetObjectItemCaseSensitive(json, "hypic");

    if (opts == NULL || cJSON_IsNull(opts)) {
        return NGX_OK;
    }

    if (!cJSON_IsObject(opts)) {
        return ngx_http_hypic_bad(bad, NGX_HTTP_BAD_REQUEST, "hypic", NULL,
                                  "'hypic' must be an object with any of "
                                  "decode, speculative, max_draft");
    }

    cJSON_ArrayForEach(item, opts) {
        if (ngx_strcmp(item->string, "decode") != 0
            && ngx_strcmp(item->string, "speculative") != 0
            && ngx_strcmp(item->string, "max_draft") != 0)
        {
            return ngx_http_hypic_bad(bad, NGX_HTTP_BAD_REQUEST, "hypic",
                                      NULL, "'hypic.%s' is not an option: "
                                      "'hypic' takes decode, speculative "
                                      "and max_draft", item->string);
        }
    }

    form = ngx_http_hypic_decode_form(
               cJSON_GetObjectItemCaseSensitive(opts, "decode"));

    if (form == NGX_ERROR) {
        return ngx_http_hypic_bad(bad, NGX_HTTP_BAD_REQUEST, "hypic.decode",
                                  NULL, "'hypic.decode' must be "
                                  "\"recurrent\", \"chunkwise\" or "
                                  "\"auto\"");
    }

    req->decode = (uint32_t) form;

    item = cJSON_GetObjectItemCaseSensitive(opts, "speculative");

    if (item && !cJSON_IsNull(item) && !cJSON_IsBool(item)) {
        return ngx_http_hypic_bad(bad, NGX_HTTP_BAD_REQUEST,
                                  "hypic.speculative", NULL,
                                  "'hypic.speculative' must be a boolean");
    }

    if (cJSON_IsTrue(item) && form == HP_IPC_DECODE_RECURRENT) {
        return ngx_http_hypic_bad(bad, NGX_HTTP_BAD_REQUEST,
                                  "hypic.speculative", NULL,
                                  "'hypic.speculative' needs 'hypic.decode' "
                                  "chunkwise or auto (drafts are verified "
                                  "in the KVBuffer), not recurrent");
    }

    req->speculative = cJSON_IsTrue(item) ? HP_IPC_SPEC_ON
                       : cJSON_IsFalse(item) ? HP_IPC_SPEC_OFF
                                             : HP_IPC_SPEC_SERVER;

    item = cJSON_GetObjectItemCaseSensitive(opts, "max_draft");

    if (item && !cJSON_IsNull(item)
        && !(cJSON_IsNumber(item) && item->valuedouble >= 1
             && item->valuedouble <= HP_IPC_MAX_DRAFT
             && item->valuedouble == (double) (int) item->valuedouble))
    {
        return ngx_http_hypic_bad(bad, NGX_HTTP_BAD_REQUEST,
                                  "hypic.max_draft", NULL,
                                  "'hypic.max_draft' must be an integer "
                                  "from 1 to %d", HP_IPC_MAX_DRAFT);
    }

    if (cJSON_IsNumber(item)) {
        req->max_draft = (uint32_t) item->valuedouble;
    }

    return NGX_OK;
}


/* HP_IPC_DECODE_* of a "decode" value (absent: the engine's), or
 * NGX_ERROR */

static ngx_int_t
ngx_http_hypic_decode_form(cJSON *item)
{
    if (item == NULL || cJSON_IsNull(item)) {
        return HP_IPC_DECODE_SERVER;
    }

    if (!cJSON_IsString(item)) {
        return NGX_ERROR;
    }

    if (ngx_strcmp(item->valuestring, "recurrent") == 0) {
        return HP_IPC_DECODE_RECURRENT;
    }

    if (ngx_strcmp(item->valuestring, "chunkwise") == 0) {
        return HP_IPC_DECODE_CHUNKWISE;
    }

    if (ngx_strcmp(item->valuestring, "auto") == 0) {
        return HP_IPC_DECODE_AUTO;
    }

    return NGX_ERROR;
}


/*
 * The request is checked and its fields are in ctx->in: what the location
 * adds (mode, seam, separator), the choices, the tools' scanners and the
 * answer's fixed parts. NGX_OK or 500 (no memory).
 */

static ngx_int_t
ngx_http_hypic_build(ngx_http_request_t *r, ngx_http_hypic_ctx_t *ctx,
    cJSON *json)
{
    ngx_uint_t                  chat;
    hp_ipc_request_t           *req;
    ngx_http_hypic_loc_conf_t  *hlcf;

    hlcf = ngx_http_get_module_loc_conf(r, ngx_http_hypic_module);

    chat = (ctx->in.endpoint == NGX_HTTP_HYPIC_CHAT);

    ctx->in.mode = ngx_http_hypic_eval_mode(r, hlcf);
    ctx->in.mode_set = 1;

    req = &ctx->in.req;

    req->endpoint = chat ? HP_IPC_EP_CHAT : HP_IPC_EP_COMPLETIONS;
    req->mode = (uint32_t) ctx->in.mode;
    req->seam = (uint32_t) hlcf->seam;

    req->sep_len = (uint32_t) hlcf->separator.len;
    ngx_memcpy(req->separator, hlcf->separator.data, hlcf->separator.len);

    /* the tools' scanners are per choice */

    if (ngx_http_hypic_choices_init(r, ctx) != NGX_OK
        || (chat && ngx_http_hypic_tools_setup(r, ctx) != NGX_OK))
    {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    return ngx_http_hypic_response_init(r, ctx, hlcf);
}

ngx_int_t
ngx_http_hypic_bad(ngx_http_hypic_bad_t *bad, ngx_uint_t status,
    const char *param, const char *code, const char *fmt, ...)
{
    va_list  args;

    bad->status = status;
    bad->param = param;
    bad->code = code;

    va_start(args, fmt);
    bad->last = ngx_vslprintf(bad->msg, bad->msg + sizeof(bad->msg), fmt,
                              args);
    va_end(args);

    return NGX_ERROR;
}


/*
 * hypic_mode may be a variable (split_clients, map): a value that is not a
 * mode is the configuration's fault, so it is logged and "full", which
 * reuses nothing and is always exact, is used.
 */

static ngx_uint_t
ngx_http_hypic_eval_mode(ngx_http_request_t *r,
    ngx_http_hypic_loc_conf_t *hlcf)
{
    ngx_int_t  mode;
    ngx_str_t  value;

    if (ngx_http_complex_value(r, hlcf->mode, &value) != NGX_OK) {
        return HP_IPC_MODE_FULL;
    }

    mode = ngx_http_hypic_parse_mode(&value);

    if (mode == NGX_ERROR) {
        ngx_log_error(NGX_LOG_ERR, r->connection->log, 0,
                      "hypic: hypic_mode evaluated to \"%V\", which is not "
                      "full, prefix, naive or pic; using \"full\"", &value);
        return HP_IPC_MODE_FULL;
    }

    return (ngx_uint_t) mode;
}
