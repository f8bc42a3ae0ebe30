/*
 * fuzz_json - the module's strict JSON check (ngx_hypic_module/
 * ngx_http_hypic_json_parse.c, linked without nginx) and the escaping.
 * Beyond no crash: a checked body is one cJSON parses, whose members fit
 * the scratch err.keys sizes, and that cJSON prints back as a body the
 * check accepts again; a refusal points inside the body; any bytes,
 * escaped and quoted, are a string the check accepts.
 */
#include <string.h>

#include "fuzz/fuzz_util.h"
#include "ngx_hypic_module/ngx_http_hypic_json_parse.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void checked(u_char *text, size_t size, ngx_http_hypic_json_err_t *err)
{
    cJSON *json = cJSON_ParseWithLength((const char *)text + err->start,
                                        size - err->start);
    FUZZ_CHECK(json != NULL);

    /* exactly err->keys slots: ASan sees a write past them */
    const char **scratch = malloc((err->keys + 1) * sizeof(*scratch));
    FUZZ_CHECK(scratch);
    if (ngx_http_hypic_json_unique(json, scratch, err) != NGX_OK)
        FUZZ_CHECK(err->reason && err->path_last > err->path);
    free(scratch);

    /* cJSON prints 15 digits first: near DBL_MAX that rounds past it */
    char *out = cJSON_PrintUnformatted(json);
    if (out) {
        ngx_http_hypic_json_err_t again;
        if (ngx_http_hypic_json_check((u_char *)out, strlen(out), &again) !=
            NGX_OK)
            FUZZ_CHECK(
                strcmp(again.reason, "a number too large for a double") == 0);
        free(out);
    }
    cJSON_Delete(json);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    ngx_http_hypic_json_err_t err;
    u_char *text = malloc(size ? size : 1);

    FUZZ_CHECK(text);
    memcpy(text, data, size);
    if (ngx_http_hypic_json_check(text, size, &err) == NGX_OK) {
        checked(text, size, &err);
    } else {
        FUZZ_CHECK(err.reason && err.offset <= size);
        FUZZ_CHECK(err.path_last >= err.path &&
                   err.path_last <= err.path + sizeof(err.path));
    }

    /* the escaped bytes, quoted, are a JSON string */
    size_t len = ngx_http_hypic_json_escape_len(text, size);
    u_char *s = malloc(len + 2);
    FUZZ_CHECK(s);
    s[0] = '"';
    FUZZ_CHECK(ngx_http_hypic_json_escape(s + 1, text, size) == s + 1 + len);
    s[len + 1] = '"';
    if (ngx_http_hypic_json_check(s, len + 2, &err) != NGX_OK) {
        /* only \u0000 is refused, and escaping writes a NUL that way */
        FUZZ_CHECK(memchr(text, 0, size) != NULL && strstr(err.reason, "NUL"));
    }
    free(s);
    free(text);
    return 0;
}
