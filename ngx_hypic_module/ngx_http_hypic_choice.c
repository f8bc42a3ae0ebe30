
/*
 * HYPIC serve: the choices of an answer and their log-probabilities (see
 * ngx_http_hypic_choice.h).
 */


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include <math.h>
#include <stdio.h>

#include "ngx_http_hypic_module.h"
#include "ngx_http_hypic_choice.h"
#include "ngx_http_hypic_request.h"
#include "ngx_http_hypic_json.h"
#include "ngx_http_hypic_sse.h"
#include "ngx_http_hypic_tools.h"


/* a number's room in JSON: "%.9g" of a float */
#define NGX_HTTP_HYPIC_LOGPROB_LEN  24


static ngx_int_t ngx_http_hypic_buf_reserve(ngx_pool_t *pool,
    ngx_http_hypic_buf_t *b, size_t more);
static ngx_int_t ngx_http_hypic_choice_token(ngx_http_request_t *r,
    ngx_http_hypic_ctx_t *ctx, u_char *data, size_t len);
static ngx_int_t ngx_http_hypic_choice_end(ngx_http_request_t *r,
    ngx_http_hypic_ctx_t *ctx, ngx_uint_t i);
static ngx_int_t ngx_http_hypic_choice_logprobs(ngx_http_request_t *r,
    ngx_http_hypic_ctx_t *ctx, ngx_uint_t i, ngx_str_t *out);
static u_char *ngx_http_hypic_logprob(u_char *p, float v);
static u_char *ngx_http_hypic_token_bytes(u_char *p, const u_char *bytes,
    uint32_t n);


ngx_int_t
ngx_http_hypic_choices_check(ngx_http_hypic_ctx_t *ctx, cJSON *json,
    ngx_http_hypic_bad_t *bad)
{
    cJSON   *item, *logprobs;
    double   n, top, best;

    n = 1;

    if (ngx_http_hypic_check_number(json, "n", 1, HP_IPC_MAX_CHOICES, 1, &n,
                                    bad)
        != NGX_OK)
    {
        return NGX_ERROR;
    }

    ctx->out.n = (ngx_uint_t) n;
    ctx->in.req.n = (uint32_t) n;

    /* as vLLM: options of a stream that is not one are a mistake */

    item = cJSON_GetObjectItemCaseSensitive(json, "stream_options");

    if (item && !cJSON_IsNull(item) && !ctx->in.stream) {
        return ngx_http_hypic_bad(bad, NGX_HTTP_BAD_REQUEST,
                                  "stream_options", NULL,
                                  "'stream_options' is only allowed with "
                                  "'stream' true");
    }

    /* req.logprobs: 0 none, else 1 + the alternatives per token */

    top = -1;

    if (ctx->in.endpoint != NGX_HTTP_HYPIC_CHAT) {
        if (ngx_http_hypic_check_number(json, "logprobs", 0,
                                        HP_IPC_MAX_LOGPROBS, 1, &top, bad)
            != NGX_OK)
        {
            return NGX_ERROR;
        }

        ctx->in.req.logprobs = (uint32_t) (top + 1);

        /* best_of n: the n choices are all there is to choose from */

        best = n;

        if (ngx_http_hypic_check_number(json, "best_of", 1,
                                        HP_IPC_MAX_CHOICES, 1, &best, bad)
            != NGX_OK)
        {
            return NGX_ERROR;
        }

        if (best != n) {
            return ngx_http_hypic_bad(bad, NGX_HTTP_BAD_REQUEST, "best_of",
                                      NULL, best < n
                                      ? "'best_of' must be at least 'n'"
                                      : "'best_of' greater than 'n' is not "
                                        "supported");
        }

        return NGX_OK;
    }

    logprobs = cJSON_GetObjectItemCaseSensitive(json, "logprobs");

    if (logprobs && !cJSON_IsNull(logprobs) && !cJSON_IsBool(logprobs)) {
        return ngx_http_hypic_bad(bad, NGX_HTTP_BAD_REQUEST, "logprobs",
                                  NULL, "'logprobs' must be a boolean");
    }

    if (ngx_http_hypic_check_number(json, "top_logprobs", 0,
                                    HP_IPC_MAX_LOGPROBS, 1, &top, bad)
        != NGX_OK)
    {
        return NGX_ERROR;
    }

    if (top >= 0 && !cJSON_IsTrue(logprobs)) {
        return ngx_http_hypic_bad(bad, NGX_HTTP_BAD_REQUEST, "top_logprobs",
                                  NULL, "'top_logprobs' needs 'logprobs' "
                                  "set to true");
    }

    if (cJSON_IsTrue(logprobs)) {
        ctx->in.req.logprobs = 1 + (uint32_t) ngx_max(top, 0);
    }

    return NGX_OK;
}


ngx_int_t
ngx_http_hypic_choices_init(ngx_http_request_t *r, ngx_http_hypic_ctx_t *ctx)
{
    ctx->out.choices = ngx_pcalloc(r->pool, ctx->out.n
                                            * sizeof(ngx_http_hypic_choice_t));
    if (ctx->out.choices == NULL) {
        return NGX_ERROR;
    }

    return NGX_OK;
}


ngx_int_t
ngx_http_hypic_choices_record(ngx_http_request_t *r,
    ngx_http_hypic_ctx_t *ctx, ngx_uint_t type, u_char *data, size_t len)
{
    hp_ipc_end_t              end;
    hp_ipc_text_t             text;
    ngx_http_hypic_choice_t  *ch;

    if (type == HP_IPC_REC_TOKEN) {
        return ngx_http_hypic_choice_token(r, ctx, data, len);
    }

    if (type == HP_IPC_REC_END) {

        if (len != sizeof(hp_ipc_end_t)) {
            return NGX_DECLINED;
        }

        ngx_memcpy(&end, data, len);

        if (end.choice >= ctx->out.n || ctx->out.choices[end.choice].ended) {
            return NGX_DECLINED;
        }

        ch = &ctx->out.choices[end.choice];
        ch->finish = end.finish;
        ch->ended = 1;

        return ngx_http_hypic_choice_end(r, ctx, end.choice);
    }

    if (len < sizeof(hp_ipc_text_t)) {
        return NGX_DECLINED;
    }

    ngx_memcpy(&text, data, sizeof(hp_ipc_text_t));

    if (text.choice >= ctx->out.n) {
        return NGX_DECLINED;
    }

    data += sizeof(hp_ipc_text_t);
    len -= sizeof(hp_ipc_text_t);

    if (len == 0) {
        return NGX_OK;
    }

    /* with tools, the text goes through the choice's call scanner */

    return ctx->out.tools
           ? ngx_http_hypic_tools_text(r, ctx, text.choice, data, len)
           : ngx_http_hypic_choice_text(r, ctx, text.choice, data, len);
}


ngx_int_t
ngx_http_hypic_choice_text(ngx_http_request_t *r, ngx_http_hypic_ctx_t *ctx,
    ngx_uint_t i, u_char *data, size_t len)
{
    ngx_http_hypic_choice_t  *ch;

    if (ctx->in.stream) {
        return ngx_http_hypic_choice_chunk(r, ctx, i, NULL, data, len, NULL);
    }

    ch = &ctx->out.choices[i];

    if (ngx_http_hypic_buf_reserve(r->pool, &ch->text, len) != NGX_OK) {
        return NGX_ERROR;
    }

    ch->text.len = ngx_cpymem(ch->text.data + ch->text.len, data, len)
                   - ch->text.data;

    return NGX_OK;
}


ngx_int_t
ngx_http_hypic_choice_chunk(ngx_http_request_t *r, ngx_http_hypic_ctx_t *ctx,
    ngx_uint_t i, ngx_str_t *delta, u_char *text, size_t len,
    ngx_str_t *finish)
{
    ngx_int_t  rc;
    ngx_str_t  logprobs;

    if (ngx_http_hypic_choice_logprobs(r, ctx, i, &logprobs) != NGX_OK) {
        return NGX_ERROR;
    }

    rc = ngx_http_hypic_sse_chunk(r, ctx, i, delta, text, len, &logprobs,
                                  finish);

    return (rc == NGX_ERROR) ? NGX_ERROR : NGX_OK;
}


ngx_int_t
ngx_http_hypic_choices_end(ngx_http_request_t *r, ngx_http_hypic_ctx_t *ctx)
{
    ngx_uint_t                i;
    ngx_http_hypic_choice_t  *ch;

    /* choices the engine sent no END for end with the request */

    for (i = 0; i < ctx->out.n; i++) {
        ch = &ctx->out.choices[i];

        if (ch->ended) {
            continue;
        }

        ch->finish = ctx->out.final.finish;
        ch->ended = 1;

        if (ngx_http_hypic_choice_end(r, ctx, i) != NGX_OK) {
            return NGX_ERROR;
        }
    }

    return NGX_OK;
}


/* choice i ended: what its call scanner held, then its last chunk */

static ngx_int_t
ngx_http_hypic_choice_end(ngx_http_request_t *r, ngx_http_hypic_ctx_t *ctx,
    ngx_uint_t i)
{
    ngx_str_t  empty;

    if (ngx_http_hypic_tools_end(r, ctx, i) != NGX_OK) {
        return NGX_ERROR;
    }

    if (!ctx->in.stream) {
        return NGX_OK;
    }

    ngx_str_set(&empty, "{}");

    return ngx_http_hypic_choice_chunk(r, ctx, i,
                                       ctx->in.endpoint == NGX_HTTP_HYPIC_CHAT
                                       ? &empty : NULL,
                                       NULL, 0,
                                       ngx_http_hypic_choice_finish(ctx, i));
}


/* a TOKEN record as the JSON entries of its choice's log-probabilities */

static ngx_int_t
ngx_http_hypic_choice_token(ngx_http_request_t *r, ngx_http_hypic_ctx_t *ctx,
    u_char *data, size_t len)
{
    u_char                   *p;
    size_t                    size, esc[1 + HP_IPC_MAX_LOGPROBS];
    uint32_t                  off, n[1 + HP_IPC_MAX_LOGPROBS];
    ngx_uint_t                i, k, top;
    hp_ipc_token_t            tok;
    ngx_http_hypic_buf_t     *b;
    const u_char             *bytes[1 + HP_IPC_MAX_LOGPROBS];
    float                     lp[1 + HP_IPC_MAX_LOGPROBS];
    ngx_http_hypic_choice_t  *ch;

    if (len < sizeof(hp_ipc_token_t) || ctx->in.req.logprobs == 0) {
        return NGX_DECLINED;
    }

    ngx_memcpy(&tok, data, sizeof(hp_ipc_token_t));

    if (tok.choice >= ctx->out.n || tok.n_top > HP_IPC_MAX_LOGPROBS) {
        return NGX_DECLINED;
    }

    /* entry 0 is the token, the others its alternatives */

    off = sizeof(hp_ipc_token_t);
    size = 0;

    for (k = 0; k < 1 + tok.n_top; k++) {
        if (!hp_ipc_token_next(data, (uint32_t) len, &off, &lp[k], &bytes[k],
                               &n[k]))
        {
            return NGX_DECLINED;
        }

        esc[k] = ngx_http_hypic_json_escape_len((u_char *) bytes[k], n[k]);

        /* {"token":"T","logprob":L,"bytes":[B,..]}, twice at most */
        size += 2 * (esc[k] + 4 * n[k] + NGX_HTTP_HYPIC_LOGPROB_LEN + 48);
    }

    if (off != len) {
        return NGX_DECLINED;
    }

    ch = &ctx->out.choices[tok.choice];

    if (ctx->in.endpoint == NGX_HTTP_HYPIC_CHAT) {
        b = &ch->lp[0];

        if (ngx_http_hypic_buf_reserve(r->pool, b, size + 32) != NGX_OK) {
            return NGX_ERROR;
        }

        p = b->data + b->len;

        if (ch->n_lp) {
            *p++ = ',';
        }

        for (k = 0; k < 1 + tok.n_top; k++) {
            p = ngx_cpymem(p, "{\"token\":\"", sizeof("{\"token\":\"") - 1);
            p = ngx_http_hypic_json_escape(p, (u_char *) bytes[k], n[k]);
            p = ngx_cpymem(p, "\",\"logprob\":",
                           sizeof("\",\"logprob\":") - 1);
            p = ngx_http_hypic_logprob(p, lp[k]);
            p = ngx_cpymem(p, ",\"bytes\":", sizeof(",\"bytes\":") - 1);
            p = ngx_http_hypic_token_bytes(p, bytes[k], n[k]);

            if (k == 0) {
                p = ngx_cpymem(p, ",\"top_logprobs\":[",
                               sizeof(",\"top_logprobs\":[") - 1);

            } else {
                *p++ = '}';

                if (k < tok.n_top) {
                    *p++ = ',';
                }
            }
        }

        p = ngx_cpymem(p, "]}", 2);

        b->len = p - b->data;
        ch->n_lp++;

        return NGX_OK;
    }

    /* completions: four parallel arrays */

    for (i = 0; i < 4; i++) {
        if (ngx_http_hypic_buf_reserve(r->pool, &ch->lp[i], size + 32)
            != NGX_OK)
        {
            return NGX_ERROR;
        }
    }

    b = &ch->lp[0];
    p = b->data + b->len;

    if (ch->n_lp) {
        *p++ = ',';
    }

    *p++ = '"';
    p = ngx_http_hypic_json_escape(p, (u_char *) bytes[0], n[0]);
    *p++ = '"';
    b->len = p - b->data;

    b = &ch->lp[1];
    p = b->data + b->len;

    if (ch->n_lp) {
        *p++ = ',';
    }

    p = ngx_http_hypic_logprob(p, lp[0]);
    b->len = p - b->data;

    /* {"T":L,..}: the alternatives and, as OpenAI, the token itself */

    b = &ch->lp[2];
    p = b->data + b->len;

    if (ch->n_lp) {
        *p++ = ',';
    }

    *p++ = '{';
    top = 0;

    for (k = 1; k < 1 + tok.n_top; k++) {
        if (n[k] == n[0] && ngx_memcmp(bytes[k], bytes[0], n[0]) == 0) {
            top = 1;
        }
    }

    for (k = top ? 1 : 0; k < 1 + tok.n_top; k++) {
        if (p[-1] != '{') {
            *p++ = ',';
        }

        *p++ = '"';
        p = ngx_http_hypic_json_escape(p, (u_char *) bytes[k], n[k]);
        p = ngx_cpymem(p, "\":", 2);
        p = ngx_http_hypic_logprob(p, lp[k]);
    }

    *p++ = '}';
    b->len = p - b->data;

    b = &ch->lp[3];
    p = b->data + b->len;

    if (ch->n_lp) {
        *p++ = ',';
    }

    p = ngx_sprintf(p, "%uD", tok.text_offset);
    b->len = p - b->data;

    ch->n_lp++;

    return NGX_OK;
}


/*
 * The "logprobs" value of choice i from the entries gathered since the
 * last call (empty: null, when none was asked for or, streamed, none is
 * new), which are then dropped.
 */

static ngx_int_t
ngx_http_hypic_choice_logprobs(ngx_http_request_t *r,
    ngx_http_hypic_ctx_t *ctx, ngx_uint_t i, ngx_str_t *out)
{
    u_char                   *p;
    size_t                    len;
    ngx_uint_t                k;
    ngx_http_hypic_choice_t  *ch;

    static const char  *chat[] = { "{\"content\":[", "],\"refusal\":null}" };
    static const char  *cmpl[] = { "{\"tokens\":[", "],\"token_logprobs\":[",
                                   "],\"top_logprobs\":[",
                                   "],\"text_offset\":[", "]}" };

    ch = &ctx->out.choices[i];

    out->len = 0;
    out->data = NULL;

    /* null: not asked for, or nothing new in this chunk */

    if (ctx->in.req.logprobs == 0 || (ctx->in.stream && ch->n_lp == 0)) {
        return NGX_OK;
    }

    len = sizeof("{\"tokens\":[],\"token_logprobs\":[],\"top_logprobs\":[],"
                 "\"text_offset\":[]}");

    for (k = 0; k < 4; k++) {
        len += ch->lp[k].len;
    }

    p = ngx_pnalloc(r->pool, len);
    if (p == NULL) {
        return NGX_ERROR;
    }

    out->data = p;

    /* (no entries: the buffers may not exist yet) */

    if (ctx->in.endpoint == NGX_HTTP_HYPIC_CHAT) {
        p = ngx_cpymem(p, chat[0], ngx_strlen(chat[0]));

        if (ch->lp[0].len) {
            p = ngx_cpymem(p, ch->lp[0].data, ch->lp[0].len);
        }

        p = ngx_cpymem(p, chat[1], ngx_strlen(chat[1]));

    } else {
        for (k = 0; k < 4; k++) {
            p = ngx_cpymem(p, cmpl[k], ngx_strlen(cmpl[k]));

            if (ch->lp[k].len) {
                p = ngx_cpymem(p, ch->lp[k].data, ch->lp[k].len);
            }
        }

        p = ngx_cpymem(p, cmpl[4], ngx_strlen(cmpl[4]));
    }

    out->len = p - out->data;

    /* sent: the buffers take the next entries */

    for (k = 0; k < 4; k++) {
        ch->lp[k].len = 0;
    }

    ch->n_lp = 0;

    return NGX_OK;
}


ngx_str_t *
ngx_http_hypic_choice_finish(ngx_http_hypic_ctx_t *ctx, ngx_uint_t i)
{
    return ngx_http_hypic_tools_finish(ctx, i, ctx->out.choices[i].finish);
}


/*
 * "choices":[{"index":I,"message":{"role":"assistant","content":"T",
 *     "tool_calls":[..]},"logprobs":L,"finish_reason":"F"},..]
 *
 * (content null when there are calls and no text, as OpenAI answers;
 * completions: "text":"T" for "message")
 */

ngx_int_t
ngx_http_hypic_choices_json(ngx_http_request_t *r, ngx_http_hypic_ctx_t *ctx,
    ngx_str_t *out)
{
    u_char                   *p;
    size_t                    len;
    ngx_str_t                *lp, *finish, *calls;
    ngx_uint_t                i, chat;
    ngx_http_hypic_choice_t  *ch;

    chat = (ctx->in.endpoint == NGX_HTTP_HYPIC_CHAT);

    lp = ngx_palloc(r->pool, ctx->out.n * sizeof(ngx_str_t));
    if (lp == NULL) {
        return NGX_ERROR;
    }

    len = sizeof("\"choices\":[]");

    for (i = 0; i < ctx->out.n; i++) {
        if (ngx_http_hypic_choice_logprobs(r, ctx, i, &lp[i]) != NGX_OK) {
            return NGX_ERROR;
        }

        ch = &ctx->out.choices[i];

        len += sizeof("{\"index\":,\"message\":{\"role\":\"assistant\","
                      "\"content\":null},\"logprobs\":null,"
                      "\"finish_reason\":\"\"},")
               + NGX_INT_T_LEN + lp[i].len
               + ngx_http_hypic_json_escape_len(ch->text.data, ch->text.len)
               + ngx_http_hypic_tools_calls(ctx, i)->len
               + ngx_http_hypic_choice_finish(ctx, i)->len;
    }

    p = ngx_pnalloc(r->pool, len);
    if (p == NULL) {
        return NGX_ERROR;
    }

    out->data = p;

    p = ngx_cpymem(p, "\"choices\":[", sizeof("\"choices\":[") - 1);

    for (i = 0; i < ctx->out.n; i++) {
        ch = &ctx->out.choices[i];

        if (i) {
            *p++ = ',';
        }

        p = ngx_sprintf(p, "{\"index\":%ui,", i);

        if (chat) {
            calls = ngx_http_hypic_tools_calls(ctx, i);

            p = ngx_cpymem(p, "\"message\":{\"role\":\"assistant\","
                           "\"content\":",
                           sizeof("\"message\":{\"role\":\"assistant\","
                                  "\"content\":") - 1);

            if (calls->len && ch->text.len == 0) {
                p = ngx_cpymem(p, "null", sizeof("null") - 1);

            } else {
                *p++ = '"';
                p = ngx_http_hypic_json_escape(p, ch->text.data,
                                               ch->text.len);
                *p++ = '"';
            }

            if (calls->len) {
                p = ngx_cpymem(p, calls->data, calls->len);
            }

            *p++ = '}';

        } else {
            p = ngx_cpymem(p, "\"text\":\"", sizeof("\"text\":\"") - 1);
            p = ngx_http_hypic_json_escape(p, ch->text.data, ch->text.len);
            *p++ = '"';
        }

        p = ngx_cpymem(p, ",\"logprobs\":", sizeof(",\"logprobs\":") - 1);

        if (lp[i].len) {
            p = ngx_cpymem(p, lp[i].data, lp[i].len);

        } else {
            p = ngx_cpymem(p, "null", sizeof("null") - 1);
        }

        finish = ngx_http_hypic_choice_finish(ctx, i);

        p = ngx_sprintf(p, ",\"finish_reason\":\"%V\"}", finish);
    }

    *p++ = ']';

    out->len = p - out->data;

    return NGX_OK;
}


/* room for more bytes at b->data + b->len, doubling */

static ngx_int_t
ngx_http_hypic_buf_reserve(ngx_pool_t *pool, ngx_http_hypic_buf_t *b,
    size_t more)
{
    u_char  *p;
    size_t   cap;

    if (b->len + more <= b->cap) {
        return NGX_OK;
    }

    cap = ngx_max(2 * b->cap, b->len + more);
    cap = ngx_max(cap, 1024);

    p = ngx_pnalloc(pool, cap);
    if (p == NULL) {
        return NGX_ERROR;
    }

    if (b->len) {
        ngx_memcpy(p, b->data, b->len);
    }

    if (b->data) {
        ngx_pfree(pool, b->data);
    }

    b->data = p;
    b->cap = cap;

    return NGX_OK;
}


/* a log-probability as JSON: -9999.0 stands for none, as OpenAI writes */

static u_char *
ngx_http_hypic_logprob(u_char *p, float v)
{
    int  n;

    if (!isfinite(v) || v < -9999.0f) {
        return ngx_cpymem(p, "-9999.0", sizeof("-9999.0") - 1);
    }

    n = snprintf((char *) p, NGX_HTTP_HYPIC_LOGPROB_LEN, "%.9g", (double) v);

    return p + ((n > 0 && n < NGX_HTTP_HYPIC_LOGPROB_LEN) ? n : 0);
}


/* [B,..] */

static u_char *
ngx_http_hypic_token_bytes(u_char *p, const u_char *bytes, uint32_t n)
{
    uint32_t  i;

    *p++ = '[';

    for (i = 0; i < n; i++) {
        if (i) {
            *p++ = ',';
        }

        p = ngx_sprintf(p, "%ui", (ngx_uint_t) bytes[i]);
    }

    *p++ = ']';

    return p;
}
