
/*
 * HYPIC serve: structured output (see ngx_http_hypic_format.h).
 */


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include <cJSON.h>

#include "engine/contract/hp_grammar.h"

#include "ngx_http_hypic_module.h"
#include "ngx_http_hypic_format.h"
#include "ngx_http_hypic_request.h"


/* the fields that constrain the output; tools only in chat */

static const char  *ngx_http_hypic_format_fields[] = {
    "response_format", "tools", "tool_choice", "parallel_tool_calls", NULL
};


ngx_int_t
ngx_http_hypic_format(ngx_http_request_t *r, ngx_http_hypic_ctx_t *ctx,
    cJSON *json, ngx_http_hypic_bad_t *bad)
{
    char               msg[NGX_MAX_ERROR_STR - 64], *text;
    cJSON             *spec, *item;
    size_t             len;
    ngx_int_t          rc;
    ngx_uint_t         i, last;
    const char        *param;
    hp_grammar_t      *g;
    hp_grammar_opts_t  opts;

    ngx_str_null(&ctx->in.grammar);

    last = (ctx->in.endpoint == NGX_HTTP_HYPIC_CHAT) ? 4 : 1;

    spec = cJSON_CreateObject();
    if (spec == NULL) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    for (i = 0; i < last; i++) {
        item = cJSON_GetObjectItemCaseSensitive(json,
                                            ngx_http_hypic_format_fields[i]);
        if (item == NULL || cJSON_IsNull(item)) {
            continue;
        }

        item = cJSON_Duplicate(item, 1);
        if (item == NULL
            || !cJSON_AddItemToObject(spec, ngx_http_hypic_format_fields[i],
                                      item))
        {
            cJSON_Delete(item);
            cJSON_Delete(spec);
            return NGX_HTTP_INTERNAL_SERVER_ERROR;
        }
    }

    /* the engine picks the template's tool syntax and sees the thinking
     * switch; neither changes what compiles */

    ngx_memzero(&opts, sizeof(hp_grammar_opts_t));

    if (hp_grammar_compile_json(spec, &opts, &g, msg, sizeof(msg), &param)
        != 0)
    {
        cJSON_Delete(spec);
        return ngx_http_hypic_bad(bad, NGX_HTTP_BAD_REQUEST, param, NULL,
                                  "Invalid '%s': %s", param, msg);
    }

    if (g == NULL) {
        cJSON_Delete(spec);
        return NGX_OK;
    }

    hp_grammar_free(g);

    text = cJSON_PrintUnformatted(spec);
    cJSON_Delete(spec);

    if (text == NULL) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    len = ngx_strlen(text);
    rc = NGX_OK;

    ctx->in.grammar.data = ngx_pnalloc(r->pool, len);
    if (ctx->in.grammar.data == NULL) {
        rc = NGX_HTTP_INTERNAL_SERVER_ERROR;

    } else {
        ngx_memcpy(ctx->in.grammar.data, text, len);
        ctx->in.grammar.len = len;
    }

    cJSON_free(text);

    return rc;
}
