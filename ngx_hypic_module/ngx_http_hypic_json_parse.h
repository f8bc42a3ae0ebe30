
/*
 * HYPIC serve: the pure JSON text functions of the module - strict
 * checking of a request body and escaping. They use nginx's core types
 * and macros only, no nginx object, so fuzz/ links them without nginx.
 */


#ifndef _NGX_HTTP_HYPIC_JSON_PARSE_H_INCLUDED_
#define _NGX_HTTP_HYPIC_JSON_PARSE_H_INCLUDED_


#include <ngx_config.h>
#include <ngx_core.h>

#include <cJSON.h>


/*
 * Nesting a request never needs (a tool's JSON Schema stays far below);
 * it also bounds the stack of the checks below.
 */
#define NGX_HTTP_HYPIC_JSON_DEPTH  64

/* bytes of a field's path kept for an error message */
#define NGX_HTTP_HYPIC_JSON_PATH   128


typedef struct {
    size_t       offset;        /* of the error, in bytes from the start */
    const char  *reason;        /* static text */
    size_t       start;         /* check: where the value starts (BOM) */
    size_t       keys;          /* check: the most members of one object */
    u_char      *path_last;
    u_char       path[NGX_HTTP_HYPIC_JSON_PATH];  /* messages[0].content */
    ngx_uint_t   path_cut;      /* the path did not fit: it ends "..." */
} ngx_http_hypic_json_err_t;


/*
 * Checks that data[len] is one JSON value as RFC 8259 writes it (a UTF-8
 * BOM may lead), stricter than cJSON where cJSON would lose or change
 * the client's text: no bytes but white space around the value, no raw
 * control byte, \u0000, bad \u escape, unpaired surrogate or invalid
 * UTF-8 (overlong, surrogate, past U+10FFFF) in a string, numbers of at
 * most 63 characters (older cJSON's limit) that a double holds, at most
 * NGX_HTTP_HYPIC_JSON_DEPTH levels. NGX_OK (err->start and err->keys
 * set: cJSON is given the text from err->start, as it skips a BOM only
 * before 2 bytes or more) or NGX_ERROR with err naming the reason, the
 * byte and the field.
 */
ngx_int_t ngx_http_hypic_json_check(u_char *data, size_t len,
    ngx_http_hypic_json_err_t *err);

/*
 * Refuses a name given twice in one object of a checked and parsed body
 * (cJSON would keep the first and drop the other): NGX_OK or NGX_ERROR
 * with err naming the field. scratch holds err->keys pointers.
 */
ngx_int_t ngx_http_hypic_json_unique(cJSON *json, const char **scratch,
    ngx_http_hypic_json_err_t *err);

/*
 * The length of src once escaped as the inside of a JSON string. Escaping
 * writes \" \\ \n \r \t \b \f, \u00XX for other control bytes and \ufffd
 * for each byte that is not part of valid UTF-8, so the output is always
 * valid JSON whatever the client sent.
 */
size_t ngx_http_hypic_json_escape_len(u_char *src, size_t size);

/* Writes the escaped src to dst; returns the end of what was written. */
u_char *ngx_http_hypic_json_escape(u_char *dst, u_char *src, size_t size);


#endif /* _NGX_HTTP_HYPIC_JSON_PARSE_H_INCLUDED_ */
