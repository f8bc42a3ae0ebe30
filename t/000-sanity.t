# Sanity of the module's HTTP surface: health, models, metrics, request
# checking and the OpenAI error shape, while no engine is reachable. Also
# checks that the harness's fixtures start and stop.

use strict;
use warnings;
use lib 't/lib';

use Hypic::Nginx;
use Hypic::Redis;
use Hypic::Engine;
use Hypic::Util qw(port_open);

{
    my $redis = Hypic::Redis->start;
    my $port = $redis->port;
    is($redis->command('PING'), 'PONG', 'redis fixture answers PING');
    $redis->stop;
    ok(!port_open($port), 'redis fixture is stopped');
}

SKIP: {
    my $model = "$Hypic::Nginx::REPO/models/test/qwen35-dense";
    my $why = Hypic::Engine->why_not || (-d $model ? '' : "no $model");
    skip "engine fixture: $why", 2 if $why;
    my $engine = eval { Hypic::Engine->start(args => ['--model', $model]) };
    ok($engine && -S $engine->socket, 'engine fixture made its socket')
        or diag($@);
    $engine->stop if $engine;
    ok(!$engine || !$engine->alive, 'engine fixture is stopped');
}

add_vars(ENGINE => 'hypic_engine tiny unix:/tmp/hypic-t-tiny.sock '
                   . 'model=tiny-1;');

run_tests();

__DATA__

=== TEST 1: health lists the configured engines, down: 503 (a look is no error)
--- http_config
    @ENGINE@
    hypic_engine big unix:/tmp/hypic-t-big.sock;
--- config
    location = /health { hypic_health; }
--- request
GET /health
--- error_code: 503
--- response_headers
Content-Type: application/json
--- response_body chomp
{"status":"unavailable","engines":[{"name":"tiny","address":"unix:/tmp/hypic-t-tiny.sock","model":"tiny-1","state":"down"},{"name":"big","address":"unix:/tmp/hypic-t-big.sock","model":"big","state":"down"}]}
--- error_log
hypic: engine "big" at "unix:/tmp/hypic-t-big.sock" is unavailable
--- no_error_log
[error]



=== TEST 2: health answers HEAD without a body, refuses POST in JSON
--- http_config
    @ENGINE@
--- config
    location = /health { hypic_health; }
--- request eval
["HEAD /health", "POST /health\n{}"]
--- error_code eval
[503, 405]
--- response_body eval
["", undef]
--- response_headers eval
["Content-Type: application/json", "Allow: GET, HEAD"]
--- response_body_json eval
[undef, {error => {type => "invalid_request_error",
                   code => "method_not_allowed"}}]
--- no_error_log
[error]



=== TEST 3: /v1/models lists the location's model
--- http_config
    @ENGINE@
--- config
    location /v1/ { hypic_pass tiny; }
--- request
GET /v1/models
--- error_code: 200
--- response_headers
Content-Type: application/json
--- response_body_json eval
{ object => "list",
  data => [{ id => "tiny-1", object => "model", owned_by => "hypic",
             created => qr/^\d{10}$/ }] }
--- no_error_log
[error]



=== TEST 4: metrics count API requests by status class, across workers
--- workers: 2
--- http_config
    @ENGINE@
--- config
    location /v1/ { hypic_pass tiny; }
    location = /metrics { hypic_metrics; }
    location = /health { hypic_health; }
--- request eval
["GET /metrics",
 "POST /v1/completions\n{bad json",
 "POST /v1/completions\n{\"prompt\":\"hi\"}",
 "GET /v1/models",
 "GET /v1/models",
 "GET /health",
 "GET /metrics"]
--- error_code eval
[200, 400, 503, 200, 200, 503, 200]
--- response_headers eval
["Content-Type: text/plain; version=0.0.4; charset=utf-8"]
--- response_body_like eval
[qr/^# TYPE hypic:requests_total counter$/m]
--- response_check
my ($res) = @_;
my ($before, $after) = map {
    +{ $_->{body} =~ /^hypic:requests_total\{code="(\dxx)"\} (\d+)$/mg }
} $res->[0], $res->[6];
is_deeply($before, { '1xx' => 0, '2xx' => 0, '3xx' => 0, '4xx' => 0,
                     '5xx' => 0 }, 'metrics start at zero');
# a request is counted in its log phase, after its answer went out: the
# other worker may serve the next /metrics first, so look again briefly
my $want = { '1xx' => 0, '2xx' => 2, '3xx' => 0, '4xx' => 1, '5xx' => 1 };
for (1 .. 40) {
    last if CORE::join(',', map { "$_=$after->{$_}" } sort keys %$after)
            eq CORE::join(',', map { "$_=$want->{$_}" } sort keys %$want);
    select(undef, undef, undef, 0.05);
    my $r = http_request($_[2], "GET /metrics");
    $after = +{ $r->{body} =~ /^hypic:requests_total\{code="(\dxx)"\} (\d+)$/mg };
}
is_deeply($after, $want, 'metrics counted the API requests only');
--- error_log
hypic: engine "tiny" at "unix:/tmp/hypic-t-tiny.sock" is unavailable



=== TEST 5: malformed JSON is a 400 in OpenAI's error shape
--- http_config
    @ENGINE@
--- config
    location /v1/ { hypic_pass tiny; }
--- request
POST /v1/completions
{"prompt": "hi",
--- error_code: 400
--- response_headers
Content-Type: application/json
--- response_body_like
^\{"error":\{"message":"We could not parse the JSON body of your request: invalid JSON at byte \d+ of 16","type":"invalid_request_error","param":null,"code":null\}\}$
--- no_error_log
[error]



=== TEST 6: bodies that are not a request object
--- http_config
    @ENGINE@
--- config
    location /v1/ { hypic_pass tiny; }
--- request eval
["POST /v1/completions\n[1, 2]",
 "POST /v1/completions\n{\"prompt\": \"a\"} {}",
 "POST /v1/completions\n  ",
 "POST /v1/completions"]
--- error_code: 400
--- response_body_json eval
[{ error => { message => "The request body must be a JSON object",
              type => "invalid_request_error" } },
 { error => { message => qr/invalid JSON at byte 16 of 18/ } },
 { error => { message => qr/invalid JSON at byte \d of 2/ } },
 { error => { message => qr/the body is empty/ } }]
--- no_error_log
[error]



=== TEST 7: missing and mistyped fields name the parameter
--- http_config
    @ENGINE@
--- config
    location /v1/ {
        hypic_pass tiny;
        hypic_max_tokens 16;
    }
--- request eval
["POST /v1/completions\n{\"model\": \"tiny-1\"}",
 "POST /v1/completions\n{\"prompt\": [1, 2]}",
 "POST /v1/completions\n{\"prompt\": \"a\", \"max_tokens\": 17}",
 "POST /v1/completions\n{\"prompt\": \"a\", \"max_tokens\": 1.5}",
 "POST /v1/completions\n{\"prompt\": \"a\", \"stream\": \"yes\"}",
 "POST /v1/completions\n{\"prompt\": \"a\", \"temperature\": 3}",
 "POST /v1/chat/completions\n{\"prompt\": \"a\"}",
 "POST /v1/chat/completions\n{\"messages\": []}",
 "POST /v1/chat/completions\n{\"messages\": [{\"role\": \"bot\", \"content\": \"x\"}]}",
 "POST /v1/chat/completions\n{\"messages\": [{\"role\": \"user\"}]}"]
--- error_code: 400
--- response_body_json eval
[{ error => { param => "prompt", code => undef,
              message => "Missing required parameter: 'prompt'" } },
 { error => { param => "prompt", message => qr/array of strings/ } },
 { error => { param => "max_tokens",
              message => "'max_tokens' must be an integer from 0 to 16" } },
 { error => { param => "max_tokens" } },
 { error => { param => "stream", message => "'stream' must be a boolean" } },
 { error => { param => "temperature",
              message => "'temperature' must be a number from 0.0 to 2.0" } },
 { error => { param => "messages",
              message => "Missing required parameter: 'messages'" } },
 { error => { param => "messages", message => qr/non-empty array/ } },
 { error => { param => "messages", message => qr/role.*not 'bot'/ } },
 { error => { param => "messages", message => qr/messages\[0\]\.content/ } }]
--- no_error_log
[error]



=== TEST 8: an unknown model is a 404, quoted with correct JSON escaping
--- http_config
    @ENGINE@
--- config
    location /v1/ { hypic_pass tiny; }
--- request eval
"POST /v1/completions\n{\"model\": \"a\\\"b\\\\c\\u0001\\n\\u00e9\", \"prompt\": \"x\"}"
--- error_code: 404
--- response_body_json eval
{ error => { type => "invalid_request_error", code => "model_not_found",
             param => "model",
             message => "The model 'a\"b\\c\x{1}\n\x{e9}' does not "
                        . "exist here, this endpoint serves 'tiny-1'" } }
--- response_body_like
\\u0001\\n\xc3\xa9'
--- no_error_log
[error]



=== TEST 9: a body over hypic_max_prompt_bytes is a 413, by Content-Length
--- http_config
    @ENGINE@
--- config
    location /v1/ {
        hypic_pass tiny;
        hypic_max_prompt_bytes 1k;
    }
--- request eval
["POST /v1/completions\n{\"prompt\": \"" . ("a" x 2000) . "\"}",
 "POST /v1/completions\n{\"prompt\": \"" . ("a" x 1000) . "\"}"]
--- error_code eval
[413, 503]
--- response_body_json eval
[{ error => { type => "invalid_request_error", code => "request_too_large",
              message => "The request body is larger than 1024 bytes" } },
 { error => { type => "engine_unavailable" } }]
--- error_log
hypic: client body is larger than hypic_max_prompt_bytes 1024



=== TEST 10: a chunked body over the limit is a 413 too, and in JSON
--- http_config
    @ENGINE@
--- config
    location /v1/ {
        hypic_pass tiny;
        hypic_max_prompt_bytes 1k;
    }
--- raw_request eval
my $data = "{\"prompt\": \"" . ("a" x 3000) . "\"}";
"POST /v1/completions HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n"
. "Transfer-Encoding: chunked\r\n\r\n"
. CORE::join("", map { sprintf("%x\r\n%s\r\n", length $_, $_) }
               $data =~ /(.{1,700})/gs)
. "0\r\n\r\n"
--- error_code: 413
--- response_body_json
{"error":{"type":"invalid_request_error","code":"request_too_large"}}
--- error_log
in a chunked body
--- no_error_log
[error]



=== TEST 11: Expect: 100-continue with a too large body gets no 100
--- http_config
    @ENGINE@
--- config
    location /v1/ {
        hypic_pass tiny;
        hypic_max_prompt_bytes 10;
    }
--- raw_request eval
"POST /v1/completions HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n"
. "Content-Length: 100\r\nExpect: 100-continue\r\n\r\n"
--- error_code: 413
--- response_check
my ($res) = @_;
unlike($res->[0]{raw}, qr/100 Continue/, 'no 100 Continue');
--- no_error_log
[error]



=== TEST 12: a body buffered to a temp file is read back whole
--- http_config
    @ENGINE@
--- config
    location /v1/ {
        hypic_pass tiny;
        client_body_buffer_size 1k;
    }
--- request eval
"POST /v1/completions\n{\"prompt\": \"" . ("a" x 20000) . "\"}"
--- error_code: 503
--- error_log
a client request body is buffered to a temporary file
--- no_error_log
bad request



=== TEST 13: a valid completion finds no engine: 503 engine_unavailable
--- http_config
    @ENGINE@
--- config
    location /v1/ { hypic_pass tiny; }
--- request
POST /v1/completions
{"model": "tiny-1", "prompt": "Hello", "max_tokens": 8, "stream": false}
--- error_code: 503
--- response_headers
Content-Type: application/json
--- response_body chomp
{"error":{"message":"The engine for model \"tiny-1\" is unavailable, try again later","type":"engine_unavailable","param":null,"code":"engine_unavailable"}}
--- error_log
hypic: engine "tiny" at "unix:/tmp/hypic-t-tiny.sock" is unavailable



=== TEST 14: a valid chat completion finds no engine either
--- http_config
    @ENGINE@
--- config
    location /v1/ { hypic_pass tiny; }
--- request
POST /v1/chat/completions
{"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": [{"type": "text", "text": "Hi"}]}, {"role": "assistant", "content": null}], "stream": true, "top_p": 0.9}
--- error_code: 503
--- response_body_json
{"error":{"type":"engine_unavailable","code":"engine_unavailable"}}
--- error_log
is unavailable



=== TEST 15: wrong methods are 405 with Allow, unknown paths 404, in JSON
--- http_config
    @ENGINE@
--- config
    location /v1/ { hypic_pass tiny; }
--- request eval
["GET /v1/completions",
 "PUT /v1/chat/completions\n{}",
 "POST /v1/models\n{}",
 "GET /v1/embeddings"]
--- error_code eval
[405, 405, 405, 404]
--- response_headers eval
["Allow: POST\nContent-Type: application/json",
 "Allow: POST",
 "Allow: GET, HEAD",
 "!Allow\nContent-Type: application/json"]
--- response_body_json eval
[{ error => { type => "invalid_request_error", code => "method_not_allowed",
              param => undef,
              message => "Method GET is not allowed for /v1/completions, "
                         . "use POST" } },
 { error => { code => "method_not_allowed" } },
 { error => { code => "method_not_allowed" } },
 { error => { code => "unknown_url",
              message => "Unknown request URL: GET /v1/embeddings" } }]
--- no_error_log
[error]



=== TEST 16: the harness decodes a chunked response and records its reads
--- config
    location = /chunked {
        sub_filter 'a' 'b';
        sub_filter_once off;
        sub_filter_types text/plain;
        return 200 "aaaa";
    }
--- request
GET /chunked
--- error_code: 200
--- response_headers
Transfer-Encoding: chunked
!Content-Length
--- response_body chomp
bbbb
--- response_chunks_like
^bbbb$
--- response_check
my ($res) = @_;
ok(@{ $res->[0]{reads} } >= 1, 'reads are recorded');
is($res->[0]{reads}[0][0], 0, 'reads are numbered from 0');
--- no_error_log
[error]



=== TEST 17: metrics survive a reload (HUP), with no alert
--- workers: 2
--- http_config
    @ENGINE@
--- config
    location /v1/ { hypic_pass tiny; }
    location = /metrics { hypic_metrics; }
--- request
GET /v1/models
--- error_code: 200
--- response_check
my ($res, $block, $srv) = @_;
kill 'HUP', $srv->{pid};
my $log = "$srv->{prefix}/logs/error.log";
for (1 .. 250) {
    last if Hypic::Util::slurp($log) =~ /gracefully shutting down/;
    select undef, undef, undef, 0.02;
}
my $m = http_request($srv, "GET /metrics");
like($m->{body}, qr/^hypic:requests_total\{code="2xx"\} 1$/m,
     'the count from before the reload is kept');
--- error_log
reconfiguring
--- no_error_log
[error]
