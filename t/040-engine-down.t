# When the engine is not there, dies, restarts, is full, slow or stalled
# (SIGSTOP), and when nginx reloads or loses a worker: every request gets
# a clean answer (503, an SSE error event, 413, 429, 504), nothing hangs,
# nginx keeps serving, and /health says what the engine's state is. One engine on models/test/qwen35-dense with 2 slots, 4k prompts
# and a throttle (--throttle-ms: a floor under every stream's length, so
# that "mid-stream" exists; no check measures time).

use strict;
use warnings;
use lib 't/lib';

use IO::Socket::UNIX;
use JSON::PP ();
use Time::HiRes qw(sleep);
use Hypic::Nginx;
use Hypic::Engine;
use Hypic::Util qw(private_dir);

Hypic::Engine::Client->import(qw(open_request read_until finish_request
                                 sse_events sse_text json_body json_of));

our $engine = Hypic::Engine->start_suite(
    args => ['--node', 't-node', '--slots', 2, '--throttle-ms', 20,
             '--max-prompt-bytes', '4k']);

# a socket file nobody listens on: what a crashed engine leaves behind
my $dir = private_dir('stale');
{
    my $s = IO::Socket::UNIX->new(Type => SOCK_STREAM(), Local => "$dir/s",
                                  Listen => 1) or die "stale socket: $!";
    close $s;
}

# a socket that accepts (the kernel's backlog) but never says hello: an
# engine that hangs at start
our $mute = IO::Socket::UNIX->new(Type => SOCK_STREAM(), Local => "$dir/m",
                                  Listen => 8) or die "mute socket: $!";

add_vars(STALE => "$dir/s", MUTE => "$dir/m");

sub body { json_body(@_) }

# a request that streams for as long as the test needs (4000 tokens)
sub endless {
    my (%o) = @_;
    return "POST /v1/completions\n"
        . body(prompt => 'Hello', max_tokens => 4000,
               ignore_eos => JSON::PP::true, %o);
}

sub first_event {
    my ($h) = @_;
    return read_until($h, sub { $_[0]{body} =~ /data: \{/ }, 10);
}

# polls (bounded) until a small request is answered 200
sub served {
    my ($srv) = @_;
    for (1 .. 200) {
        my $r = http_request($srv, "POST /v1/completions\n"
                             . "{\"prompt\": \"x\", \"max_tokens\": 1}");
        return 1 if ($r->{status} // 0) == 200;
        sleep 0.05;
    }
    return 0;
}

# polls (bounded) the engine's log for a line
sub engine_logged {
    my ($re) = @_;
    for (1 .. 200) {
        return 1 if $main::engine->log_text =~ $re;
        sleep 0.05;
    }
    return 0;
}

run_tests();

__DATA__

=== TEST 1: no engine, or a dead one's socket: 503 at once, in JSON
--- http_config
    hypic_engine gone unix:/tmp/hypic-t-no-such-engine.sock model=m1;
    hypic_engine stale unix:@STALE@ model=m2;
--- config
    location /a/ { hypic_pass gone; }
    location /b/ { hypic_pass stale; }
--- request eval
["POST /a/v1/completions\n{\"prompt\": \"Hello\", \"stream\": true}",
 "POST /b/v1/chat/completions\n{\"messages\": [{\"role\": \"user\", \"content\": \"Hi\"}]}"]
--- error_code: 503
--- response_headers
Content-Type: application/json
--- response_body_json eval
[{ error => { type => "engine_unavailable", code => "engine_unavailable",
              message => "The engine for model \"m1\" is unavailable, try again later" } },
 { error => { type => "engine_unavailable",
              message => qr/model "m2" is unavailable/ } }]
--- error_log eval
[qr/hypic: engine "gone" at "unix:\/tmp\/hypic-t-no-such-engine.sock" is unavailable \(2: No such file/,
 qr/hypic: engine "stale" at "unix:\S+" is unavailable \(111: Connection refused/]



=== TEST 2: the engine killed mid-stream: an SSE error event, 503 for the waiting, /health says down, nginx serves on, and a restarted engine is used
--- http_config
    @ENGINE@
--- config
    location /v1/ { hypic_pass tiny; }
    location = /health { hypic_health; }
--- response_check
my ($res, $block, $srv) = @_;
my $r = http_request($srv, "GET /health");
is($r->{status}, 200, 'a healthy engine: /health is 200');
my $j = json_of($r);
is($j->{status}, 'ok', 'status ok');
my $e = $j->{engines}[0] || {};
is($e->{state}, 'up', 'the engine is up');
is($e->{node}, 't-node', 'its node, from the shared header');
is($e->{slots}, 2, 'its slots');
is($e->{free_slots}, 2, 'all free');
is($e->{running} + $e->{queued}, 0, 'nothing running or queued');
my $gen = $e->{generation};
ok($gen > 0, "its generation ($gen)");
my $h = open_request($srv->{port}, endless(stream => JSON::PP::true));
$r = first_event($h);
is($r->{status}, 200, 'a stream is under way');
my $w = open_request($srv->{port}, endless());
ok(engine_logged(qr/worker \d+ connected/), 'the worker is connected');
sleep 0.1; # the second request reaches its slot
$main::engine->crash;
$r = finish_request($h, 10);
ok($r->{complete}, 'the stream ends (the chunked response is complete)');
my @ev = sse_events($r->{body});
my $last = $ev[-1];
is(ref $last && $last->{error} && $last->{error}{type},
   'engine_unavailable', 'with an error event')
    or diag($r->{body});
is($last->{error}{code}, 'engine_unavailable', 'code engine_unavailable');
ok(!grep({ !ref && $_ eq '[DONE]' } @ev), 'and no [DONE]');
$r = finish_request($w, 10);
is($r->{status}, 503, 'a request not yet answered gets 503');
is(json_of($r)->{error}{type}, 'engine_unavailable', 'in JSON');
$r = http_request($srv, "GET /health");
is($r->{status}, 503, 'nginx still answers /health: 503, the engine is down');
is_deeply(json_of($r), { status => 'unavailable',
                         engines => [{ name => 'tiny',
                                       address => 'unix:'
                                                  . $main::engine->socket,
                                       model => 'tiny-1',
                                       state => 'down' }] },
          'the killed engine is down');
$r = http_request($srv, "POST /v1/completions\n{\"prompt\": \"Hello\"}");
is($r->{status}, 503, 'with the engine down: 503, not a hang');
$main::engine->restart;
$r = http_request($srv, "POST /v1/completions\n"
                  . "{\"prompt\": \"Hello\", \"max_tokens\": 4}");
is($r->{status}, 200, 'the restarted engine serves the next request');
$r = http_request($srv, "GET /health");
is($r->{status}, 200, '/health is 200 again');
cmp_ok(json_of($r)->{engines}[0]{generation}, '>', $gen,
       'with the new generation');
--- error_log eval
[qr/hypic: engine "tiny" at "unix:\S+" closed the connection/,
 qr/hypic: engine "tiny" restarted, generation (\d+) after (\d+)/]



=== TEST 3: a prompt larger than the engine's slots is a 413
--- http_config
    @ENGINE@
--- config
    location /v1/ { hypic_pass tiny; }
--- request eval
["POST /v1/completions\n{\"prompt\": \"" . ("a" x 5000) . "\"}",
 "POST /v1/chat/completions\n{\"messages\": [{\"role\": \"user\", \"content\": \"" . ("a" x 4070) . "\"}]}",
 "POST /v1/completions\n{\"prompt\": \"" . ("a" x 4000) . "\", \"max_tokens\": 1}"]
--- error_code eval
[413, 413, 200]
--- response_body_json eval
[{ error => { type => "invalid_request_error", code => "prompt_too_large",
              param => "prompt",
              message => "The prompt is 5000 bytes, the engine takes at most 4096" } },
 { error => { code => "prompt_too_large",
              message => qr/ChatML|The prompt is 41\d\d bytes/ } },
 { object => "text_completion" }]
--- error_log
is larger than the 4096 the engine "tiny" takes
--- no_error_log
[error]



=== TEST 4: with every slot in flight, the next request is a 429
--- http_config
    @ENGINE@
--- config
    location /v1/ { hypic_pass tiny; }
--- response_check
my ($res, $block, $srv) = @_;
my @h = map { open_request($srv->{port}, endless(stream => JSON::PP::true)) }
        1 .. 2;
my @r = map { first_event($_) } @h;
is(scalar(grep { ($_->{status} // 0) == 200 } @r), 2,
   'two streams hold both slots');
my $r = http_request($srv, "POST /v1/completions\n{\"prompt\": \"x\"}");
is($r->{status}, 429, 'the next request is refused');
is_deeply(json_of($r)->{error},
          { type => 'rate_limit_error', code => 'engine_at_capacity',
            param => undef,
            message => 'The engine for model "tiny-1" has 2 requests in '
                       . 'flight, its limit; try again later' },
          'in OpenAI\'s error shape');
close $_->{sock} for @h;
ok(served($srv), 'closing them frees the slots');
--- error_log
engine "tiny" has all 2 slots in flight
--- no_error_log
[error]



=== TEST 5: hypic_request_timeout: 504, or an error event once streaming
--- http_config
    @ENGINE@
--- config
    location /v1/ { hypic_pass tiny; hypic_request_timeout 300ms; }
--- response_check
my ($res, $block, $srv) = @_;
my $r = http_request($srv, endless());
is($r->{status}, 504, 'a request that does not finish in time: 504');
is(json_of($r)->{error}{type}, 'timeout', 'type timeout');
$r = http_request($srv, endless(stream => JSON::PP::true));
is($r->{status}, 200, 'a stream that does not finish in time');
my @ev = sse_events($r->{body});
is(ref $ev[-1] && $ev[-1]{error} && $ev[-1]{error}{code}, 'timeout',
   'ends with a timeout error event');
ok(served($srv), 'the engine dropped both: their slots serve again');
--- error_log eval
[qr/hypic: engine "tiny" did not finish the request within hypic_request_timeout 300/]



=== TEST 6: a stream survives an nginx reload; the new workers connect
--- http_config
    @ENGINE@
--- config
    location /v1/ { hypic_pass tiny; }
--- response_check
my ($res, $block, $srv) = @_;
my $h = open_request($srv->{port},
                     "POST /v1/completions\n"
                     . body(prompt => 'Hello', max_tokens => 40,
                            ignore_eos => JSON::PP::true, temperature => 0,
                            stream => JSON::PP::true));
my $r = first_event($h);
is($r->{status}, 200, 'a stream is under way');
kill 'HUP', $srv->{pid};
$r = finish_request($h, 20);
my @ev = sse_events($r->{body});
is($ev[-1], '[DONE]', 'it runs to [DONE] across the reload');
is($ev[-2]{choices}[0]{finish_reason}, 'length', 'all 40 tokens');
ok(served($srv), 'the reloaded workers serve');
--- error_log
reconfiguring
--- no_error_log
[error]



=== TEST 7: a worker that dies mid-stream: the engine reclaims its slot
--- http_config
    @ENGINE@
--- config
    location /v1/ { hypic_pass tiny; }
--- response_check
my ($res, $block, $srv) = @_;
my $before = () = $main::engine->log_text =~ /request\(s\) cancelled/g;
my @h = map { open_request($srv->{port}, endless(stream => JSON::PP::true)) }
        1 .. 2;
first_event($_) for @h;
my ($pid) = $main::engine->log_text =~ /.*worker (\d+) connected/s;
ok($pid && kill('KILL', $pid), "worker $pid killed");
my $r = finish_request($h[0], 10);
ok($r->{eof}, 'its client sees the connection close');
close $_->{sock} for @h;
ok(engine_logged(qr/worker $pid disconnected \(connection \d+\), 2 request\(s\) cancelled/),
   'the engine cancels what the dead worker held');
ok(served($srv), 'and the new worker gets slots');
--- error_log eval
[qr/worker process \d+ exited on signal 9/]



=== TEST 8: a stalled engine (SIGSTOP): the stream in flight and new requests get 503 long before the request timeout, /health says stalled; SIGCONT and it serves again
--- http_config
    @ENGINE@
    hypic_stall_timeout 1500ms;
--- config
    location /v1/ { hypic_pass tiny; hypic_request_timeout 300s; }
    location = /health { hypic_health; }
--- timeout: 60
--- response_check
my ($res, $block, $srv) = @_;
is(http_request($srv, "GET /health")->{status}, 200, 'up: 200');
my $h = open_request($srv->{port}, endless(stream => JSON::PP::true));
is(first_event($h)->{status}, 200, 'a stream is under way');
ok($main::engine->signal('STOP'), 'the engine is stopped (SIGSTOP)');
# the bound (30 s) is far below hypic_request_timeout (300 s)
my $r = finish_request($h, 30);
ok($r->{complete}, 'the stream in flight ends');
my @ev = sse_events($r->{body});
my $last = $ev[-1];
is(ref $last && $last->{error} && $last->{error}{code},
   'engine_unavailable', 'with an error event')
    or diag($r->{body});
like(ref $last && $last->{error}{message} // '', qr/is not responding/,
     'saying the engine is not responding');
$r = http_request($srv, "GET /health", undef, 10);
is($r->{status}, 503, '/health: 503');
is(json_of($r)->{status}, 'unavailable', 'status unavailable');
is(json_of($r)->{engines}[0]{state}, 'stalled', 'the engine is stalled');
cmp_ok(json_of($r)->{engines}[0]{heartbeat_age_ms}, '>=', 1500,
       'its heartbeat is older than hypic_stall_timeout');
$r = http_request($srv, "POST /v1/completions\n"
                  . body(prompt => 'x', max_tokens => 1), undef, 10);
is($r->{status}, 503, 'a new request: 503 at once');
is(json_of($r)->{error}{code}, 'engine_unavailable',
   'code engine_unavailable');
like(json_of($r)->{error}{message}, qr/"tiny-1" is not responding/,
     'the engine is not responding');
ok($main::engine->signal('CONT'), 'SIGCONT');
ok(Hypic::Util::wait_until(
       cond => sub { http_request($srv, "GET /health")->{status} == 200 },
       timeout => 20),
   '/health is 200 again');
ok(served($srv), 'and the engine serves');
--- error_log eval
[qr/hypic: engine "tiny" at "unix:\S+" is stalled: no heartbeat for \d+ ms \(hypic_stall_timeout 1500\)/,
 qr/hypic: engine "tiny" responds again/]



=== TEST 9: an engine that accepts but never says hello: /health waits a moment, then says starting (503)
--- http_config
    hypic_engine mute unix:@MUTE@ model=m3;
--- config
    location = /health { hypic_health; }
--- request
GET /health
--- error_code: 503
--- response_body_json eval
{ status => 'unavailable',
  engines => [{ name => 'mute', model => 'm3', state => 'starting' }] }
