
/*
 * HYPIC serve: hypic_error, the target of error_page, so that what nginx
 * itself refuses (a malformed request line, header or chunked body, a
 * method it never serves, a URI or headers too long, an unknown
 * Transfer-Encoding, a body over client_max_body_size, ...) is answered
 * in OpenAI's error shape, not as nginx's HTML page:
 *
 *   error_page 400 404 405 ... 494 500 501 ... /hypic_error;
 *   location = /hypic_error { internal; hypic_error; }
 */


#ifndef _NGX_HTTP_HYPIC_ERROR_H_INCLUDED_
#define _NGX_HTTP_HYPIC_ERROR_H_INCLUDED_


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>


/*
 * Answers the status error_page redirected with (r->err_status) as
 * {"error":{"message":..,"type":..,"param":null,"code":..}}; nginx's own
 * 494 (request headers too large) goes out as the 400 nginx would send.
 * Reached without an error, it is a 404 for an unknown URL.
 */
ngx_int_t ngx_http_hypic_error_handler(ngx_http_request_t *r);


#endif /* _NGX_HTTP_HYPIC_ERROR_H_INCLUDED_ */
