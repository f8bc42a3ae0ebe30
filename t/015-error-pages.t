# What nginx itself refuses, before or around hypic_pass, answers in
# OpenAI's error shape ({"error":{"message","type","param":null,"code"}})
# through error_page and hypic_error, as conf/nginx.conf.in ships it: the
# harness's @ERROR_PAGES@ is that file's error_page lines and hypic_error
# location, so this suite checks the shipped configuration. Malformed
# request lines, headers and chunk framing, a bad Content-Length, TRACE
# and CONNECT, a 70 KB URI, huge headers, an unknown Transfer-Encoding,
# HTTP version or URL, a body over client_max_body_size. Raw sockets; no
# engine is needed (every request is refused before one is asked).

use strict;
use warnings;
use lib 't/lib';

use Hypic::Nginx;

ok(Hypic::Nginx::shipped_error_pages(),
   'conf/nginx.conf.in has error_page lines and a hypic_error location')
    or BAIL_OUT('no error pages in conf/nginx.conf.in');

add_vars(ENGINE => 'hypic_engine tiny unix:/tmp/hypic-t-tiny.sock '
                   . 'model=tiny-1;');

# an OpenAI error body: the code, its type, the message matching $re
sub err {
    my ($code, $type, $re) = @_;
    return { error => { message => $re, type => $type, param => undef,
                        code => $code } };
}

# a raw request: the request line, header lines, then the body bytes
sub raw {
    my ($line, $headers, $body) = @_;
    return "$line\r\nHost: localhost\r\nConnection: close\r\n"
           . CORE::join('', map { "$_\r\n" } @{ $headers || [] })
           . "\r\n" . ($body // '');
}

our $BAD = 'invalid_request_error';

run_tests();

__DATA__

=== TEST 1: malformed framing of a chunked body, in hypic_pass and elsewhere
--- http_config
    @ENGINE@
--- config
    @ERROR_PAGES@
    location /v1/ { hypic_pass tiny; }
    location = /health { hypic_health; }
--- raw_request eval
[map { main::raw("POST $_->[0] HTTP/1.1",
                 ['Transfer-Encoding: chunked'], $_->[1]) }
 ['/v1/completions', "zz\r\n{}\r\n0\r\n\r\n"],
 ['/v1/chat/completions', "2\r\n{\"a\":1}\r\n0\r\n\r\n"],
 ['/v1/completions', "2\r\n{}0\r\n\r\n"],
 ['/v1/completions', "-2\r\n{}\r\n0\r\n\r\n"],
 ['/health', "zz\r\n{}\r\n0\r\n\r\n"]]
--- error_code: 400
--- response_headers
Content-Type: application/json
--- response_body_json eval
main::err('bad_request', $main::BAD,
          qr/^The chunked framing of the request body is malformed$/)
--- error_log
client sent invalid chunked body



=== TEST 2: malformed request lines and headers: 400
--- http_config
    @ENGINE@
--- config
    @ERROR_PAGES@
    location /v1/ { hypic_pass tiny; }
--- raw_request eval
[main::raw('POST /v1/completions HTTP/1.1', ['Content-Length: -1'], '{}'),
 main::raw('POST /v1/completions HTTP/1.1',
           ['Content-Length: 2', 'Transfer-Encoding: chunked'],
           "2\r\n{}\r\n0\r\n\r\n"),
 "garbage\r\n\r\n",
 "POST /v1/completions HTTP/1.1\r\nConnection: close\r\n\r\n",
 main::raw('POST /v1/completions HTTP/1.1', ['Content-Length: 1x'], '{}')]
--- error_code: 400
--- response_headers
Content-Type: application/json
--- response_body_json eval
[main::err('bad_request', $main::BAD,
           qr/^The Content-Length header is not a valid length$/),
 main::err('bad_request', $main::BAD,
           qr/^A request may not carry both Content-Length and /),
 main::err('bad_request', $main::BAD, qr/^The request is malformed/),
 main::err('bad_request', $main::BAD, qr/^The request is malformed/),
 main::err('bad_request', $main::BAD,
           qr/^The Content-Length header is not a valid length$/)]
--- no_error_log
[error]



=== TEST 3: TRACE is 405, CONNECT refused (405 or 400 by nginx version)
--- http_config
    @ENGINE@
--- config
    @ERROR_PAGES@
    location /v1/ { hypic_pass tiny; }
--- raw_request eval
[main::raw('TRACE /v1/completions HTTP/1.1'),
 main::raw('TRACE / HTTP/1.1'),
 main::raw('CONNECT example.com:443 HTTP/1.1')]
--- error_code eval
[405, 405, undef]
--- response_headers
Content-Type: application/json
--- response_body_json eval
[main::err('method_not_allowed', $main::BAD,
           qr{^Method TRACE is not allowed for /v1/completions$}),
 main::err('method_not_allowed', $main::BAD,
           qr{^Method TRACE is not allowed for /$}),
 main::err(qr/^(method_not_allowed|bad_request)$/, $main::BAD,
           qr/^(Method CONNECT is not allowed|The request is malformed)/)]
--- response_check
my ($res) = @_;
like($res->[2]{status}, qr/^(400|405)$/, 'CONNECT: 400 or 405');
--- no_error_log
[error]



=== TEST 4: a 70 KB URI is 414
--- http_config
    @ENGINE@
--- config
    @ERROR_PAGES@
    location /v1/ { hypic_pass tiny; }
--- raw_request eval
[main::raw('GET /v1/models?q=' . ('a' x 70000) . ' HTTP/1.1'),
 main::raw('POST /' . ('b' x 70000) . '/v1/completions HTTP/1.1',
           ['Content-Length: 2'], '{}')]
--- error_code: 414
--- response_headers
Content-Type: application/json
--- response_body_json eval
main::err('uri_too_long', $main::BAD,
          qr/^The request URI is longer than the server accepts$/)
--- no_error_log
[error]



=== TEST 5: a huge header line, or too many header bytes, is a 400
nginx's 494; it goes out as the 400 nginx would send.
--- http_config
    @ENGINE@
--- config
    @ERROR_PAGES@
    location /v1/ { hypic_pass tiny; }
--- raw_request eval
[main::raw('POST /v1/completions HTTP/1.1',
           ['X-Big: ' . ('a' x 10000), 'Content-Length: 2'], '{}'),
 main::raw('GET /v1/models HTTP/1.1',
           [map { "X-H$_: " . ('b' x 7000) } 1 .. 6]),
 main::raw('GET /v1/models HTTP/1.1', ['Cookie: ' . ('c=d; ' x 3000)])]
--- error_code: 400
--- response_headers
Content-Type: application/json
--- response_body_json eval
main::err('request_header_too_large', $main::BAD,
          qr/^A request header, or all of them together, is larger /)
--- no_error_log
[error]



=== TEST 6: a Transfer-Encoding other than chunked is 501
--- http_config
    @ENGINE@
--- config
    @ERROR_PAGES@
    location /v1/ { hypic_pass tiny; }
--- raw_request eval
[main::raw('POST /v1/completions HTTP/1.1', ['Transfer-Encoding: gzip'],
           "x"),
 main::raw('POST /v1/completions HTTP/1.1',
           ['Transfer-Encoding: gzip, chunked'], "2\r\n{}\r\n0\r\n\r\n")]
--- error_code: 501
--- response_headers
Content-Type: application/json
--- response_body_json eval
main::err('not_implemented', 'server_error',
          qr/^The request asks for what the server does not implement/)
--- no_error_log
[error]



=== TEST 7: an HTTP version nginx does not speak is 505
--- http_config
    @ENGINE@
--- config
    @ERROR_PAGES@
    location /v1/ { hypic_pass tiny; }
--- raw_request eval
[main::raw('GET /v1/models HTTP/2.0'), main::raw('GET /v1/models HTTP/9.9')]
--- error_code: 505
--- response_headers
Content-Type: application/json
--- response_body_json eval
main::err('http_version_not_supported', 'server_error',
          qr/^The request's HTTP version is not supported$/)
--- no_error_log
[error]



=== TEST 8: an unknown URL outside /v1/, and the error location itself, 404
A HEAD request gets the status and headers only.
--- http_config
    @ENGINE@
--- config
    @ERROR_PAGES@
    location /v1/ { hypic_pass tiny; }
--- raw_request eval
[main::raw('GET /nowhere?x=1 HTTP/1.1'),
 main::raw('GET /hypic_error HTTP/1.1'),
 main::raw('POST /v2/completions HTTP/1.1', ['Content-Length: 2'], '{}'),
 main::raw('HEAD /nowhere HTTP/1.1')]
--- error_code: 404
--- response_headers
Content-Type: application/json
--- response_body_json eval
[main::err('unknown_url', $main::BAD,
           qr{^Unknown request URL: GET /nowhere\?x=1$}),
 main::err('unknown_url', $main::BAD,
           qr{^Unknown request URL: GET /hypic_error$}),
 main::err('unknown_url', $main::BAD,
           qr{^Unknown request URL: POST /v2/completions$}),
 undef]
--- response_check
my ($res) = @_;
is($res->[3]{body}, '', 'HEAD: no body');



=== TEST 9: a body over client_max_body_size outside hypic_pass is 413
hypic_pass locations have their own limit, hypic_max_prompt_bytes.
--- http_config
    @ENGINE@
--- config
    @ERROR_PAGES@
    client_max_body_size 1k;
    location /v1/ { hypic_pass tiny; hypic_max_prompt_bytes 100; }
    location = /health { hypic_health; }
--- raw_request eval
[main::raw('POST /health HTTP/1.1', ['Content-Length: 5000'], 'x' x 5000),
 main::raw('PUT /nowhere HTTP/1.1', ['Content-Length: 1025'], 'x' x 1025),
 main::raw('POST /v1/completions HTTP/1.1', ['Content-Length: 500'],
           'x' x 500)]
--- error_code: 413
--- response_headers
Content-Type: application/json
--- response_body_json eval
[main::err('request_too_large', $main::BAD,
           qr/^The request body is larger than the server accepts$/),
 main::err('request_too_large', $main::BAD,
           qr/^The request body is larger than the server accepts$/),
 main::err('request_too_large', $main::BAD,
           qr/^The request body is larger than 100 bytes$/)]
--- error_log
client intended to send too large body



=== TEST 10: hypic_pass's own errors are unchanged by the error pages
--- http_config
    @ENGINE@
--- config
    @ERROR_PAGES@
    location /v1/ { hypic_pass tiny; }
--- raw_request eval
[main::raw('GET /v1/completions HTTP/1.1'),
 main::raw('POST /v1/nothing HTTP/1.1', ['Content-Length: 2'], '{}'),
 main::raw('POST /v1/completions HTTP/1.1', ['Content-Length: 3'], '{x}')]
--- error_code eval
[405, 404, 400]
--- response_headers eval
["Allow: POST\nContent-Type: application/json",
 "Content-Type: application/json", "Content-Type: application/json"]
--- response_body_json eval
[main::err('method_not_allowed', $main::BAD,
           qr{^Method GET is not allowed for /v1/completions, use POST$}),
 main::err('unknown_url', $main::BAD,
           qr{^Unknown request URL: POST /v1/nothing$}),
 main::err(undef, $main::BAD, qr/invalid JSON/)]
--- no_error_log
[error]



=== TEST 11: hypic_error takes no argument and is one content handler
--- http_config
    @ENGINE@
--- config
    location = /a { hypic_error on; }
--- must_die
--- error_log
invalid number of arguments in "hypic_error"



=== TEST 12: hypic_error beside hypic_pass in one location is refused
--- http_config
    @ENGINE@
--- config
    location = /a { hypic_pass tiny; hypic_error; }
--- must_die
--- error_log
conflicts with another content handler in this location



=== TEST 13: without an error_page, hypic_error is a JSON 404
--- http_config
    @ENGINE@
--- config
    location = /error { hypic_error; }
--- request
GET /error
--- error_code: 404
--- response_body_json eval
main::err('unknown_url', $main::BAD, qr{^Unknown request URL: GET /error$})
--- no_error_log
[error]
