
/*
 * HYPIC serve: hypic_error, nginx's own refusals in OpenAI's error shape.
 *
 * error_page sends the request here by an internal redirect, which keeps
 * r->err_status, the request line and the headers as the client sent
 * them, but makes the method GET and the URI this location's: so the
 * status is r->err_status, and the method and URI the request line's.
 */


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include "ngx_http_hypic_error.h"
#include "ngx_http_hypic_json.h"


typedef struct {
    ngx_uint_t   status;
    const char  *code;
    const char  *message;
} ngx_http_hypic_error_t;


static const char *ngx_http_hypic_error_message(ngx_http_request_t *r,
    ngx_uint_t status, const char *message);


/* nginx's 494: the status nginx sends for it without an error_page */
#define NGX_HTTP_HYPIC_HEADER_TOO_LARGE  494


static ngx_http_hypic_error_t  ngx_http_hypic_errors[] = {
    { NGX_HTTP_BAD_REQUEST, "bad_request",
      "The request is malformed: its request line, a header or the "
      "framing of its body could not be parsed" },
    { NGX_HTTP_FORBIDDEN, "forbidden",
      "Access to this URL is forbidden" },
    { NGX_HTTP_NOT_FOUND, "unknown_url", NULL },
    { NGX_HTTP_NOT_ALLOWED, "method_not_allowed", NULL },
    { NGX_HTTP_REQUEST_TIME_OUT, "request_timeout",
      "The request was not received in time" },
    { NGX_HTTP_LENGTH_REQUIRED, "length_required",
      "The request body needs a Content-Length or chunked framing" },
    { NGX_HTTP_REQUEST_ENTITY_TOO_LARGE, "request_too_large",
      "The request body is larger than the server accepts" },
    { NGX_HTTP_REQUEST_URI_TOO_LARGE, "uri_too_long",
      "The request URI is longer than the server accepts" },
    { NGX_HTTP_TOO_MANY_REQUESTS, "rate_limit_exceeded",
      "Too many requests, retry later" },
    { NGX_HTTP_HYPIC_HEADER_TOO_LARGE, "request_header_too_large",
      "A request header, or all of them together, is larger than the "
      "server accepts" },
    { NGX_HTTP_INTERNAL_SERVER_ERROR, "internal_error",
      "The server failed to answer the request" },
    { NGX_HTTP_NOT_IMPLEMENTED, "not_implemented",
      "The request asks for what the server does not implement: a "
      "Transfer-Encoding other than chunked" },
    { NGX_HTTP_BAD_GATEWAY, "bad_gateway",
      "The node this request was sent to failed to answer" },
    { NGX_HTTP_SERVICE_UNAVAILABLE, "service_unavailable",
      "The service is unavailable, retry later" },
    { NGX_HTTP_GATEWAY_TIME_OUT, "gateway_timeout",
      "The node this request was sent to did not answer in time" },
    { NGX_HTTP_VERSION_NOT_SUPPORTED, "http_version_not_supported",
      "The request's HTTP version is not supported" },
    { 0, NULL, NULL }
};


ngx_int_t
ngx_http_hypic_error_handler(ngx_http_request_t *r)
{
    u_char      *p;
    ngx_str_t    method;
    ngx_uint_t   i, status;
    const char  *type, *message;

    /* without an error_page, as a direct request for this location */

    status = r->err_status ? r->err_status : NGX_HTTP_NOT_FOUND;

    for (i = 0; ngx_http_hypic_errors[i].code; i++) {
        if (ngx_http_hypic_errors[i].status == status) {
            break;
        }
    }

    message = ngx_http_hypic_error_message(r, status,
                                           ngx_http_hypic_errors[i].message);

    /* what nginx sends for its own 49x codes, and for what is no error */

    if ((status >= NGX_HTTP_NGINX_CODES
         && status < NGX_HTTP_INTERNAL_SERVER_ERROR)
        || status < NGX_HTTP_BAD_REQUEST || status > 599)
    {
        status = NGX_HTTP_BAD_REQUEST;
    }

    if (status == NGX_HTTP_TOO_MANY_REQUESTS) {
        type = "rate_limit_error";

    } else if (status >= NGX_HTTP_INTERNAL_SERVER_ERROR) {
        type = NGX_HTTP_HYPIC_SERVER_ERROR;

    } else {
        type = NGX_HTTP_HYPIC_INVALID_REQUEST;
    }

    /* ngx_http_send_header() sends err_status, when set, as the status */

    r->err_status = status;

    if (message) {
        return ngx_http_hypic_send_error(r, status, type,
                                         ngx_http_hypic_errors[i].code, NULL,
                                         "%s", message);
    }

    /* the method as the client sent it: the redirect made it GET */

    method.data = r->request_line.data;
    p = ngx_strlchr(method.data, method.data + r->request_line.len, ' ');
    method.len = p ? (size_t) (p - method.data) : r->request_line.len;

    if (status == NGX_HTTP_NOT_FOUND) {
        return ngx_http_hypic_send_error(r, status, type,
                                         ngx_http_hypic_errors[i].code, NULL,
                                         "Unknown request URL: %V %V",
                                         &method, &r->unparsed_uri);
    }

    return ngx_http_hypic_send_error(r, status, type,
                                     ngx_http_hypic_errors[i].code, NULL,
                                     "Method %V is not allowed for %V",
                                     &method, &r->unparsed_uri);
}


/*
 * A more precise message where the request shows why nginx refused it;
 * NULL where the request line is the message (a 404 or 405 with one).
 */

static const char *
ngx_http_hypic_error_message(ngx_http_request_t *r, ngx_uint_t status,
    const char *message)
{
    ngx_http_headers_in_t  *h;

    h = &r->headers_in;

    switch (status) {

    case NGX_HTTP_BAD_REQUEST:

        if (h->chunked && r->request_body) {
            return "The chunked framing of the request body is malformed";
        }

        if (h->content_length && h->transfer_encoding) {
            return "A request may not carry both Content-Length and "
                   "Transfer-Encoding";
        }

        if (h->content_length && h->content_length_n < 0) {
            return "The Content-Length header is not a valid length";
        }

        return message;

    case NGX_HTTP_NOT_FOUND:
        return r->request_line.len ? NULL : "Unknown request URL";

    case NGX_HTTP_NOT_ALLOWED:
        return r->request_line.len ? NULL
                                   : "The request method is not allowed";
    }

    return message ? message : "The request failed";
}
