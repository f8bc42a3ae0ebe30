# The engine's lifecycle through real nginx: SIGHUP re-reads the config
# file and applies what can change while serving (seam, log level,
# max_queue, ...), reports what needs a restart, keeps flags first and
# survives a broken file; SIGTERM drains (the stream in flight completes,
# a new request and one queued but not started get 503 at once, /health
# says draining, the node leaves the Redis index, exit 0); the drain
# timeout ends what is left with an error event; a second SIGTERM stops
# at once. Engines on models/test/qwen35-dense with --throttle-ms
# (a floor under every stream's length, so that "in flight" exists; no
# check measures time: every wait is for a condition, with a bound).

use strict;
use warnings;
use lib 't/lib';

use JSON::PP ();
use Time::HiRes qw(sleep);
use Hypic::Nginx;
use Hypic::Engine;
use Hypic::Redis;
use Hypic::Util qw(private_dir);

Hypic::Engine::Client->import(qw(open_request read_until finish_request
                                 sse_events json_body json_of text_of
                                 cached_of));

our $MODEL = "$Hypic::Nginx::REPO/models/test/qwen35-dense";

my $why = Hypic::Engine->why_not || (-d $MODEL ? '' : "no $MODEL");
unless ($why) {
    my $bin = Hypic::Engine::binary();
    $why = 'hypic-engine serve has no --drain-timeout-ms'
        unless `$bin serve --help 2>&1` =~ /--drain-timeout-ms/;
}
plan(skip_all => $why) if $why;

our $DIR = private_dir('lifecycle');
our $redis = Hypic::Redis->start;

# a config file replaced in one step: the engine never reads half of one
sub write_conf {
    my ($file, $text) = @_;
    open my $fh, '>', "$file.new" or die "$file.new: $!";
    print $fh $text;
    close $fh or die "$file.new: $!";
    rename "$file.new", $file or die "rename $file: $!";
}

my @common = ('--model', $MODEL, '--model-id', 'tiny-1', '--threads', 1,
              '--max-prompt-bytes', '4k', '--public-pool', '64m',
              '--private-pool', '16m');

# L: reloads, then drains; its --max-queue flag must beat the file's
our $CONF_L = "$DIR/life.conf";
write_conf($CONF_L, "throttle_ms 20\nlog_level info\n");
our $L = Hypic::Engine->start(
    args => [@common, '--node', 't-life', '--config', $CONF_L, '--slots', 4,
             '--max-queue', 4, '--redis', '127.0.0.1:' . $redis->port,
             '--drain-timeout-ms', 120000]);

# T: max_queue from its file, and a short drain timeout
our $CONF_T = "$DIR/timeout.conf";
write_conf($CONF_T, "throttle_ms 20\nmax_queue 4\ndrain_timeout_ms 300\n");
our $T = Hypic::Engine->start(
    args => [@common, '--node', 't-timeout', '--config', $CONF_T,
             '--slots', 4]);

# U: a drain that only a second signal ends; its Redis is down
our $U = Hypic::Engine->start(
    args => [@common, '--node', 't-stop', '--slots', 2, '--throttle-ms', 20,
             '--drain-timeout-ms', 600000,
             '--redis', '127.0.0.1:' . Hypic::Util::free_port()]);

# Q: one request runs at a time, the next waits in the queue
our $Q = Hypic::Engine->start(
    args => [@common, '--node', 't-queue', '--slots', 4, '--batch', 1,
             '--throttle-ms', 20, '--drain-timeout-ms', 120000]);

add_vars(map { ("ENGINE_$_->[0]" => "hypic_engine $_->[0] unix:"
                                    . $_->[1]->socket . ' model=tiny-1;') }
         ['L', $L], ['T', $T], ['U', $U], ['Q', $Q]);

our $SEP = '<|pic_sep|>';
our $PIC = join($SEP, 'You answer from the documents.',
                'The capital of Zorvia is Quellam. Zorvia exports copper '
                . 'and tea; its population is 4812, most of it in the hills.',
                'Water boils at one hundred degrees at sea level, and '
                . 'earlier at altitude, because the air pressure is lower.',
                'What is the capital of Zorvia?');

sub body { json_body(@_) }

# a stream that lasts as long as the test needs (4000 tokens, throttled)
sub endless {
    return "POST /v1/completions\n"
        . body(prompt => 'Hello', max_tokens => 4000, temperature => 0,
               ignore_eos => JSON::PP::true, stream => JSON::PP::true);
}

sub first_event {
    my ($h) = @_;
    return read_until($h, sub { $_[0]{body} =~ /data: \{/ }, 20);
}

sub short {
    my ($srv) = @_;
    return http_request($srv, "POST /v1/completions\n"
                        . body(prompt => 'x', max_tokens => 1), undef, 20);
}

# the pic prompt twice: the second answer, which hits the cached segments
sub pic_twice {
    my ($srv) = @_;
    my $b = body(prompt => $PIC, max_tokens => 4, temperature => 0);
    http_request($srv, "POST /v1/completions\n$b", undef, 20);
    return http_request($srv, "POST /v1/completions\n$b", undef, 20);
}

# the node ids each segment key of the index holds, and the node key
sub index_of {
    my $keys = $redis->command('KEYS', 'hypic:tiny-1:seg:*') || [];
    my %who = map { ($_ => $redis->command('SMEMBERS', $_)) } @$keys;
    return \%who;
}

sub segs_of {
    my ($node) = @_;
    my $who = index_of();
    return scalar grep { grep { $_ eq $node } @{ $who->{$_} } } keys %$who;
}

run_tests();

__DATA__

=== TEST 1: SIGHUP applies seam, decode and log level, reports batch as needing a restart, and the --max-queue flag beats the file
--- http_config
    @ENGINE_L@
--- config
    location /v1/ { hypic_pass L; hypic_mode pic; }
--- timeout: 30
--- response_check
my ($res, $block, $srv) = @_;
my $r8 = main::pic_twice($srv);
is($r8->{status}, 200, 'pic with the engine\'s default seam (8)');
my $c8 = main::cached_of($r8);
ok($c8 > 0, "cached tokens with seam 8: $c8");
unlike($main::L->log_text, qr/\[debug\]/, 'no debug lines at level info');
main::write_conf($main::CONF_L, "throttle_ms 20\nlog_level debug\nseam 0\n"
                 . "max_queue 1\nbatch 4\ndecode recurrent\n");
ok($main::L->signal('HUP'), 'SIGHUP sent');
ok($main::L->log_wait(qr/reload done: 3 setting\(s\) applied, 1 need a restart/),
   'the engine reloaded: 3 applied, 1 needs a restart')
    or diag($main::L->log_text);
my $log = $main::L->log_text;
like($log, qr/reload: seam \(default 8\) -> 0/, 'seam 8 -> 0');
like($log, qr/reload: log-level info -> debug/, 'log level info -> debug');
like($log, qr/reload: decode \(default\) -> recurrent/,
     'decode auto -> recurrent');
like($log, qr/reload: batch \(default 8\) -> 4 needs a restart; it stays \(default 8\)/,
     'batch needs a restart and stays');
like($log, qr/reload: max-queue in \S+ is ignored: the flag --max-queue 4 wins/,
     'the file\'s max_queue loses to the flag');
my $r0 = main::pic_twice($srv);
is($r0->{status}, 200, 'pic with the reloaded seam');
my $c0 = main::cached_of($r0);
ok($c0 > $c8, "seam 0 recomputes no seam windows: $c0 cached tokens > $c8");
is(main::text_of($r0),
   Hypic::Engine->generate(model => $main::MODEL, prompt => $main::PIC,
                           max_tokens => 4,
                           args => ['--mode', 'pic', '--seam', 0]),
   'the text of the CLI with --seam 0');
ok($main::L->log_wait(qr/\[debug\] request \S+: slot \d+/),
   'debug lines now');
my $h = open_request($srv->{port}, main::endless());
is(first_event($h)->{status}, 200, 'a stream is in flight');
my $r = main::short($srv);
is($r->{status}, 200, 'a second request is admitted: max-queue is still 4')
    or diag($r->{body});
close $h->{sock};
--- no_error_log
[error]



=== TEST 2: a broken config file on SIGHUP is logged and changes nothing
--- http_config
    @ENGINE_L@
--- config
    location /v1/ { hypic_pass L; }
--- timeout: 30
--- response_check
my ($res, $block, $srv) = @_;
main::write_conf($main::CONF_L, "log_level info\nno_such_setting 1\n");
$main::L->signal('HUP');
ok($main::L->log_wait(qr/reload failed, the running configuration stays: \S+life\.conf:2: unknown setting 'no_such_setting'/),
   'an unknown setting: the reload fails, saying where')
    or diag($main::L->log_text);
main::write_conf($main::CONF_L, "log_level info\nseam wide\n");
$main::L->signal('HUP');
ok($main::L->log_wait(qr/reload failed, the running configuration stays: \S+life\.conf:2: seam needs an integer in \[0, 256\], not 'wide'/),
   'a bad value: the reload fails, saying where');
my $before = () = $main::L->log_text =~ /\[debug\] request/g;
my $r = main::short($srv);
is($r->{status}, 200, 'the engine serves on');
ok($main::L->log_wait(qr/\[debug\] request/, 20, $before + 1),
   'at the old log level (debug): the new file\'s info was not applied');
unlike($main::L->log_text, qr/reload: log-level debug -> info/,
       'nothing of the broken file was applied');
--- no_error_log
[error]



=== TEST 3: SIGTERM drains: the stream in flight completes, a new request gets 503, /health says draining, the node leaves the index, exit 0
--- http_config
    @ENGINE_L@
--- config
    location /v1/ { hypic_pass L; }
    location = /health { hypic_health; }
--- timeout: 60
--- response_check
my ($res, $block, $srv) = @_;
ok(Hypic::Util::wait_until(
       cond => sub { $main::redis->command('EXISTS',
                                           'hypic:tiny-1:node:t-life') },
       timeout => 20),
   'before: the node has its heartbeat key in the index');
ok(main::segs_of('t-life') > 0,
   'before: the index lists segments on the node (' . main::segs_of('t-life')
   . ')');
my $h = open_request($srv->{port}, "POST /v1/completions\n"
                     . main::body(prompt => 'Hello', max_tokens => 200,
                                  temperature => 0,
                                  ignore_eos => JSON::PP::true,
                                  stream => JSON::PP::true,
                                  stream_options => { include_usage =>
                                                      JSON::PP::true }));
# 200 throttled steps: the stream outlasts the checks below by far
is(first_event($h)->{status}, 200, 'a 200-token stream is under way');
ok($main::L->signal('TERM'), 'SIGTERM sent');
ok($main::L->log_wait(qr/SIGTERM: draining: no new requests, 1 in flight may finish/),
   'the engine drains, with 1 request in flight')
    or diag($main::L->log_text);
my $r = main::short($srv);
is($r->{status}, 503, 'a request sent after SIGTERM gets 503');
my $e = main::json_of($r)->{error} || {};
is($e->{code}, 'engine_unavailable', 'code engine_unavailable');
like($e->{message} // '', qr/draining before it shuts down/,
     'the message says the engine is draining');
$r = http_request($srv, "GET /health");
is($r->{status}, 503, '/health while draining: 503');
is(main::json_of($r)->{engines}[0]{state}, 'draining',
   'the engine is draining');
$r = finish_request($h, 40);
my @ev = sse_events($r->{body});
is($ev[-1], '[DONE]', 'the stream in flight ends with [DONE]')
    or diag($r->{body});
my ($fin) = grep { ref && @{ $_->{choices} || [] }
                   && $_->{choices}[0]{finish_reason} } @ev;
is($fin && $fin->{choices}[0]{finish_reason}, 'length',
   'finish_reason length');
my ($usage) = grep { ref && $_->{usage} } @ev;
is($usage && $usage->{usage}{completion_tokens}, 200, 'with all 200 tokens');
is($main::L->wait_exit(30), 0, 'the engine exits 0');
my $log = $main::L->log_text;
like($log, qr/drained: every request in flight finished/, 'logged: drained');
like($log, qr/node t-life left the index \(\d+ segment\(s\) removed\)/,
     'logged: left the index');
like($log, qr/\[info\] exit 0/, 'logged: exit 0');
is($main::redis->command('EXISTS', 'hypic:tiny-1:node:t-life'), 0,
   'the heartbeat key is gone');
is(main::segs_of('t-life'), 0, 'no segment in the index names the node');
--- error_log eval
[qr/hypic: engine refused \S+: the engine is draining before it shuts down and takes no new requests \(engine_unavailable\)/]



=== TEST 4: SIGHUP lowers max_queue (429); the drain timeout ends the stream left with an error event
--- http_config
    @ENGINE_T@
--- config
    location /v1/ { hypic_pass T; }
--- timeout: 60
--- response_check
my ($res, $block, $srv) = @_;
my $h = open_request($srv->{port}, main::endless());
is(first_event($h)->{status}, 200, 'a stream is in flight');
is(main::short($srv)->{status}, 200, 'max_queue 4: another is admitted');
main::write_conf($main::CONF_T,
                 "throttle_ms 20\nmax_queue 1\ndrain_timeout_ms 300\n");
$main::T->signal('HUP');
ok($main::T->log_wait(qr/reload: max-queue 4 -> 1/), 'max_queue 4 -> 1')
    or diag($main::T->log_text);
my $r = main::short($srv);
is($r->{status}, 429, 'max_queue 1: the next request is refused');
is(main::json_of($r)->{error}{code}, 'engine_busy', 'code engine_busy');
$main::T->signal('TERM');
ok($main::T->log_wait(qr/drain timeout \(300 ms\): 1 request\(s\) still in flight/),
   'the drain times out with the stream in flight')
    or diag($main::T->log_text);
$r = finish_request($h, 30);
ok($r->{complete}, 'the stream ends');
my @ev = sse_events($r->{body});
my $last = $ev[-1];
is(ref $last && $last->{error} && $last->{error}{code},
   'engine_unavailable', 'with an error event')
    or diag($r->{body});
like(ref $last && $last->{error}{message} // '',
     qr/shut down before the request finished \(drain timeout, 300 ms\)/,
     'that names the drain timeout');
ok(!grep({ !ref && $_ eq '[DONE]' } @ev), 'and no [DONE]');
is($main::T->wait_exit(30), 0, 'the engine exits 0');
like($main::T->log_text,
     qr/drained: the requests ended by the timeout are collected/,
     'after nginx collected the error record');
--- error_log eval
[qr/hypic: engine refused \S+: the engine has 1 requests in flight, its limit \(engine_busy\)/]



=== TEST 5: a second SIGTERM stops at once, also with Redis down
--- http_config
    @ENGINE_U@
--- config
    location /v1/ { hypic_pass U; }
--- timeout: 60
--- response_check
my ($res, $block, $srv) = @_;
my $h = open_request($srv->{port}, main::endless());
is(first_event($h)->{status}, 200, 'a stream is in flight');
$main::U->signal('TERM');
ok($main::U->log_wait(qr/SIGTERM: draining/), 'draining (for 600 s)');
$main::U->signal('TERM');
is($main::U->wait_exit(30), 0, 'a second SIGTERM: the engine exits 0');
like($main::U->log_text,
     qr/second SIGTERM: stopping now, 1 request\(s\) in flight end/,
     'logged: stopping now');
like($main::U->log_text, qr/Redis did not confirm leaving the index/,
     'Redis down: leaving the index is not confirmed, the stop goes on');
my $r = finish_request($h, 20);
ok($r->{complete}, 'the stream ends');
my @ev = sse_events($r->{body});
is(ref $ev[-1] && $ev[-1]{error} && $ev[-1]{error}{code},
   'engine_unavailable', 'with an error event')
    or diag($r->{body});
--- error_log eval
[qr/hypic: engine "U" at "unix:\S+" closed the connection/]



=== TEST 6: SIGTERM: a request queued but not started gets 503 at once, while the one running finishes
--- http_config
    @ENGINE_Q@
--- config
    location /v1/ { hypic_pass Q; }
    location = /health { hypic_health; }
--- timeout: 60
--- response_check
my ($res, $block, $srv) = @_;
my $h = open_request($srv->{port}, "POST /v1/completions\n"
                     . main::body(prompt => 'Hello', max_tokens => 300,
                                  temperature => 0,
                                  ignore_eos => JSON::PP::true,
                                  stream => JSON::PP::true,
                                  stream_options => { include_usage =>
                                                      JSON::PP::true }));
is(first_event($h)->{status}, 200, 'a 300-token stream runs (batch 1)');
my $w = open_request($srv->{port}, "POST /v1/completions\n"
                     . main::body(prompt => 'x', max_tokens => 1));
ok(Hypic::Util::wait_until(
       cond => sub {
           my $e = main::json_of(http_request($srv, "GET /health"))
                   ->{engines}[0];
           $e->{running} == 1 && $e->{queued} == 1;
       }, timeout => 20),
   'a second request waits in the queue (/health: running 1, queued 1)');
ok($main::Q->signal('TERM'), 'SIGTERM sent');
my $r = finish_request($w, 20);
is($r->{status}, 503, 'the queued request gets 503');
unlike($main::Q->log_text, qr/drained:/,
       'before the running one finished: at once, not after the drain');
my $e = main::json_of($r)->{error} || {};
is($e->{code}, 'engine_unavailable', 'code engine_unavailable');
like($e->{message} // '', qr/draining before it shuts down/,
     'the message says the engine is draining');
$r = finish_request($h, 40);
my @ev = sse_events($r->{body});
is($ev[-1], '[DONE]', 'the running stream ends with [DONE]')
    or diag($r->{body});
my ($usage) = grep { ref && $_->{usage} } @ev;
is($usage && $usage->{usage}{completion_tokens}, 300, 'with all 300 tokens');
is($main::Q->wait_exit(30), 0, 'the engine exits 0');
--- error_log eval
[qr/hypic: engine refused \S+: the engine is draining before it shuts down and takes no new requests \(engine_unavailable\)/]
