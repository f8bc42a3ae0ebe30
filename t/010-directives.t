# The directives: nginx -t accepts every one of them, refuses each kind of
# mistake with a message that says what is wrong and where, and the values
# reach the handlers (two models side by side, hypic_mode from a variable).

use strict;
use warnings;
use lib 't/lib';

use Hypic::Nginx;

add_vars(ENGINE => 'hypic_engine tiny unix:/tmp/hypic-t-tiny.sock '
                   . 'model=tiny-1;');

run_tests();

__DATA__

=== TEST 1: nginx -t accepts a configuration using every directive
--- http_config
    hypic_engine tiny unix:/tmp/hypic-t-tiny.sock model=tiny-1 shm=hp-tiny;
    hypic_engine big unix:/tmp/hypic-t-big.sock shm=hp-big model=Org/Big-7B;
    hypic_redis 127.0.0.1:6379;
    hypic_redis_timeout 100ms;
    hypic_separator "<|sep|>";
    hypic_mode pic;
    hypic_seam 16;
    hypic_routing cache_affinity;
    hypic_max_prompt_bytes 2m;
    hypic_max_tokens 1024;
    hypic_request_timeout 60s;
    hypic_stall_timeout 3s;
    split_clients "${remote_addr}${msec}" $hypic_arm {
        50%     pic;
        *       prefix;
    }
--- config
    hypic_mode naive;
    location /v1/ {
        hypic_pass tiny;
        hypic_mode $hypic_arm;
        hypic_seam 0;
        hypic_routing local;
        hypic_separator "|||";
    }
    location /big/ {
        hypic_pass big;
        hypic_mode full;
        hypic_seam 256;
        hypic_max_tokens 1;
        hypic_max_prompt_bytes 10k;
        hypic_request_timeout 5m;
    }
    location = /health { hypic_health; }
    location = /metrics { hypic_metrics; }
--- config_test
--- no_error_log
[emerg]
[warn]



=== TEST 2: the same configuration serves
--- http_config
    hypic_engine tiny unix:/tmp/hypic-t-tiny.sock model=tiny-1 shm=hp-tiny;
    hypic_redis localhost:6379;
    hypic_redis_timeout 100ms;
    hypic_separator "<|sep|>";
    hypic_seam 16;
    hypic_routing cache_affinity;
    split_clients "${remote_addr}${msec}" $hypic_arm {
        50%     pic;
        *       prefix;
    }
--- config
    location /v1/ {
        hypic_pass tiny;
        hypic_mode $hypic_arm;
    }
    location = /health { hypic_health; }
--- request eval
["GET /health", "POST /v1/completions\n{\"prompt\": \"hi\"}"]
--- error_code eval
[503, 503]
--- error_log
is unavailable
--- no_error_log
hypic_mode evaluated to



=== TEST 3: hypic_pass to an unknown engine
--- http_config
    @ENGINE@
--- config
    location /v1/ { hypic_pass nope; }
--- must_die
--- error_log eval
qr/\[emerg\] .*unknown hypic_engine "nope" in \S+nginx\.conf:\d+/



=== TEST 4: hypic_pass without any hypic_engine
--- config
    location /v1/ { hypic_pass tiny; }
--- must_die
--- error_log eval
qr/hypic_pass "tiny" in \S+nginx\.conf:\d+ needs a hypic_engine, but none is declared/



=== TEST 5: hypic_engine may come after the hypic_pass that names it
--- config
    location /v1/ { hypic_pass late; }
--- http_config
    server {
        listen 127.0.0.1:@PORT@;
        server_name other;
        location /x/ { hypic_pass late; }
    }
    hypic_engine late unix:/tmp/hypic-t-late.sock;
--- config_test
--- no_error_log
[emerg]



=== TEST 6: a mode literal that is not a mode
--- http_config
    @ENGINE@
--- config
    location /v1/ { hypic_pass tiny; hypic_mode turbo; }
--- must_die
--- error_log
invalid hypic_mode "turbo", expected full, prefix, naive, pic or a variable



=== TEST 7: hypic_seam out of range
--- http_config
    @ENGINE@
    hypic_seam 257;
--- must_die
--- error_log eval
qr/"hypic_seam" must be between 0 and 256, not "257" in \S+nginx\.conf:\d+/



=== TEST 8: hypic_seam that is not a number
--- http_config
    @ENGINE@
--- config
    location /a/ { hypic_pass tiny; hypic_seam -1; }
--- must_die
--- error_log
"hypic_seam" directive invalid number



=== TEST 9: hypic_stall_timeout must leave room for the heartbeat
--- http_config
    @ENGINE@
    hypic_stall_timeout 500ms;
--- must_die
--- error_log eval
qr/"hypic_stall_timeout" directive must be at least 1s in \S+nginx\.conf:\d+/



=== TEST 10: hypic_stall_timeout is for the http block
--- http_config
    @ENGINE@
--- config
    location /v1/ { hypic_pass tiny; hypic_stall_timeout 2s; }
--- must_die
--- error_log
"hypic_stall_timeout" directive is not allowed here



=== TEST 11: hypic_max_tokens must be positive
--- http_config
    @ENGINE@
    hypic_max_tokens 0;
--- must_die
--- error_log
"hypic_max_tokens" must be at least 1, not "0"



=== TEST 12: duplicate engine names
--- http_config
    hypic_engine tiny unix:/tmp/a.sock;
    hypic_engine tiny unix:/tmp/b.sock;
--- must_die
--- error_log
duplicate hypic_engine "tiny"



=== TEST 13: a Redis address with a bad port
--- http_config
    hypic_redis 127.0.0.1:99999;
--- must_die
--- error_log
invalid port in hypic_redis "127.0.0.1:99999"



=== TEST 14: a Redis address without a port, or a unix socket
--- http_config
    hypic_redis 127.0.0.1;
--- must_die
--- error_log
invalid hypic_redis "127.0.0.1", expected HOST:PORT



=== TEST 15: a Redis host that does not resolve
--- http_config
    hypic_redis no-such-host.invalid:6379;
--- must_die
--- error_log
host not found in hypic_redis "no-such-host.invalid:6379"



=== TEST 16: hypic_redis twice
--- http_config
    hypic_redis 127.0.0.1:6379;
    hypic_redis 127.0.0.1:6380;
--- must_die
--- error_log
"hypic_redis" directive is duplicate



=== TEST 17: an engine address that is not unix:
--- http_config
    hypic_engine tiny 127.0.0.1:7000;
--- must_die
--- error_log
invalid address "127.0.0.1:7000" in hypic_engine "tiny", expected unix:/path



=== TEST 18: an unknown hypic_engine parameter
--- http_config
    hypic_engine tiny unix:/tmp/a.sock gpu=0;
--- must_die
--- error_log
invalid parameter "gpu=0" in hypic_engine "tiny", expected model=ID or shm=NAME



=== TEST 19: an engine name with characters that do not belong in keys
--- http_config
    hypic_engine "a b" unix:/tmp/a.sock;
--- must_die
--- error_log
invalid hypic_engine name "a b"



=== TEST 20: hypic_engine is an http-level directive only
--- http_config
    @ENGINE@
--- config
    hypic_engine other unix:/tmp/b.sock;
--- must_die
--- error_log
"hypic_engine" directive is not allowed here



=== TEST 21: an empty separator
--- http_config
    @ENGINE@
--- config
    location /v1/ { hypic_pass tiny; hypic_separator ""; }
--- must_die
--- error_log
"hypic_separator" directive must not be empty



=== TEST 22: an unknown routing
--- http_config
    @ENGINE@
    hypic_routing nearest;
--- must_die
--- error_log
invalid value "nearest"



=== TEST 23: two content handlers in one location
--- http_config
    @ENGINE@
--- config
    location /v1/ { hypic_pass tiny; hypic_health; }
--- must_die
--- error_log
"hypic_health" directive conflicts with another content handler



=== TEST 24: hypic_pass twice in one location
--- http_config
    @ENGINE@
--- config
    location /v1/ { hypic_pass tiny; hypic_pass tiny; }
--- must_die
--- error_log
"hypic_pass" directive is duplicate



=== TEST 25: two locations, two models, side by side
--- http_config
    hypic_engine small unix:/tmp/hypic-t-small.sock model=qwen-small;
    hypic_engine large unix:/tmp/hypic-t-large.sock model=qwen-large;
--- config
    location /a/ { hypic_pass small; }
    location /b/ { hypic_pass large; }
--- request eval
["GET /a/v1/models", "GET /b/v1/models",
 "POST /a/v1/completions\n{\"model\": \"qwen-large\", \"prompt\": \"x\"}",
 "POST /b/v1/completions\n{\"model\": \"qwen-large\", \"prompt\": \"x\"}"]
--- error_code eval
[200, 200, 404, 503]
--- response_body_json eval
[{ data => [{ id => "qwen-small" }] },
 { data => [{ id => "qwen-large" }] },
 { error => { code => "model_not_found" } },
 { error => { type => "engine_unavailable",
              message => qr/model "qwen-large"/ } }]
--- error_log
hypic: engine "large" at "unix:/tmp/hypic-t-large.sock" is unavailable
--- no_error_log
engine "small"



=== TEST 26: hypic_mode from a variable that is not a mode: logged, "full"
--- http_config
    @ENGINE@
    map $http_x_arm $hypic_arm {
        default pic;
        bad     turbo;
    }
--- config
    location /v1/ { hypic_pass tiny; hypic_mode $hypic_arm; }
--- more_headers eval
["X-Arm: good", "X-Arm: bad"]
--- request eval
["POST /v1/completions\n{\"prompt\": \"x\"}",
 "POST /v1/completions\n{\"prompt\": \"x\"}"]
--- error_code: 503
--- error_log
hypic: hypic_mode evaluated to "turbo", which is not full, prefix, naive or pic; using "full"
--- response_check
my ($res, $block) = @_;
is(scalar @$res, 2, 'both requests answered');
