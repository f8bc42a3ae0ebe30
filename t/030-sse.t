# Streaming (server-sent events) through real nginx and a real engine on
# models/test/qwen35-dense: events arrive one by one as the engine makes
# them, in OpenAI's chunk shapes, [DONE] last; usage when asked for; stop
# strings never leak; heartbeats; a client that goes away cancels its
# request in the engine and frees its slot. The engine is throttled
# (--throttle-ms) so that a stream lasts long enough to be watched: that
# sets a floor on durations, and no check measures time.

use strict;
use warnings;
use lib 't/lib';

use JSON::PP ();
use Time::HiRes qw(sleep);
use Hypic::Nginx;
use Hypic::Engine;

Hypic::Engine::Client->import(qw(open_request read_until finish_request
                                 concurrently sse_events sse_text json_body
                                 chatml));

our $MODEL = Hypic::Engine->test_model;
our $engine = Hypic::Engine->start_suite(
    args => ['--node', 't-node', '--slots', 2, '--batch', 4,
             '--throttle-ms', 20, '--max-prompt-bytes', '64k']);

sub cli { Hypic::Engine->generate(model => $MODEL, @_) }

sub body { json_body(@_) }

# the events that are not '[DONE]'
sub json_events {
    return grep { ref } @_;
}

run_tests();

__DATA__

=== TEST 1: a streamed completion: one event per chunk, as they come
--- http_config
    @ENGINE@
--- config
    location /v1/ { hypic_pass tiny; }
--- request
POST /v1/completions
{"model": "tiny-1", "prompt": "Hello world", "max_tokens": 16, "temperature": 0, "stream": true}
--- error_code: 200
--- response_headers
Content-Type: text/event-stream
Cache-Control: no-cache
X-Hypic-Mode: pic
X-Hypic-Node: t-node
X-Hypic-Segments: 0/1
Transfer-Encoding: chunked
!Content-Length
--- response_check
my ($res) = @_;
my $r = $res->[0];
my @ev = sse_events($r->{body});
my @bad = grep { !ref && $_ ne '[DONE]' } @ev;
ok(!@bad, 'every event is data: JSON or [DONE]') or diag(explain(\@bad));
is($ev[-1], '[DONE]', '[DONE] comes last');
is(scalar(grep { !ref } @ev), 1, 'and only once');
my @j = json_events(@ev);
ok(@j >= 3, scalar(@j) . ' JSON events');
is(scalar(grep { $_->{object} eq 'text_completion' && $_->{model} eq 'tiny-1'
                 && $_->{id} eq $j[0]{id} && $_->{created} =~ /^\d+$/ } @j),
   scalar @j, 'all are text_completion chunks of one id');
like($j[0]{id}, qr/^cmpl-[0-9a-f]{24}$/, 'the id');
is(sse_text(@j), cli(prompt => 'Hello world', max_tokens => 16),
   'the streamed text is the CLI\'s greedy text');
is(scalar(grep { defined $_->{choices}[0]{finish_reason} } @j), 1,
   'one event has a finish_reason');
like($j[-1]{choices}[0]{finish_reason}, qr/^(stop|length)$/,
     'the last one');
ok(!grep({ exists $_->{usage} } @j), 'no usage unless asked for');
my @chunks = grep { length $_->[1] } @{ $r->{chunks} };
is(scalar(grep { $_->[1] =~ /\A(?:(?:data: [^\n]+|: ping)\n\n)+\z/ }
       @chunks), scalar @chunks, 'HTTP chunks hold whole events');
ok($chunks[0][0] < $chunks[-1][0],
   "events arrived incrementally (first in read $chunks[0][0], last in "
   . "read $chunks[-1][0])");
--- no_error_log
[error]



=== TEST 2: a streamed chat completion with usage
--- http_config
    @ENGINE@
--- config
    location /v1/ { hypic_pass tiny; }
--- request
POST /v1/chat/completions
{"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 12, "temperature": 0, "stream": true, "stream_options": {"include_usage": true}}
--- error_code: 200
--- response_headers
Content-Type: text/event-stream
--- response_check
my ($res) = @_;
my @ev = sse_events($res->[0]{body});
is($ev[-1], '[DONE]', '[DONE] comes last');
my @j = json_events(@ev);
is(scalar(grep { $_->{object} eq 'chat.completion.chunk' } @j), scalar @j,
   'all are chat.completion.chunk');
like($j[0]{id}, qr/^chatcmpl-[0-9a-f]{24}$/, 'the id');
is_deeply($j[0]{choices}, [{ index => 0, logprobs => undef,
                             finish_reason => undef,
                             delta => { role => 'assistant',
                                        content => '' } }],
          'the first chunk gives the role');
my $u = $j[-1];
is_deeply($u->{choices}, [], 'the usage chunk has no choices');
is($u->{usage}{prompt_tokens},
   scalar(() = Hypic::Engine->tokenize(model => $main::MODEL,
                                       text => chatml(user => 'Hi'))),
   'usage.prompt_tokens');
is($u->{usage}{total_tokens},
   $u->{usage}{prompt_tokens} + $u->{usage}{completion_tokens},
   'usage.total_tokens');
is($u->{usage}{prompt_tokens_details}{cached_tokens}, 0, 'cached_tokens');
my $fin = $j[-2]{choices}[0];
like($fin->{finish_reason} // '', qr/^(stop|length)$/,
     'the chunk before usage finishes');
is_deeply($fin->{delta}, {}, 'with an empty delta');
is(sse_text(@j), cli(prompt => chatml(user => 'Hi'), max_tokens => 12),
   'the text is the CLI\'s on the ChatML prompt');
--- no_error_log
[error]



=== TEST 3: stop strings end the stream and never leak into it
--- http_config
    @ENGINE@
--- config
    location /v1/ { hypic_pass tiny; }
--- response_check
my ($res, $block, $srv) = @_;
my $full = cli(prompt => 'Once upon a time', max_tokens => 40);
my ($at) = grep { substr($full, $_, 3) =~ /^[a-z]{3}$/ }
           3 .. length($full) - 3;
ok(defined $at, 'the reference has a stop candidate') or diag($full);
my $stop = substr($full, $at // 0, 3);
my $r = http_request($srv, "POST /v1/completions\n"
    . body(prompt => 'Once upon a time', max_tokens => 40, temperature => 0,
           stream => JSON::PP::true, stop => [$stop]));
my @j = grep { ref } sse_events($r->{body});
is(sse_text(@j), substr($full, 0, index($full, $stop)),
   "the text ends before \"$stop\"");
is($j[-1]{choices}[0]{finish_reason}, 'stop', 'finish_reason "stop"');
unlike($r->{body}, qr/\Q$stop\E/, 'the stop string is in no event');
--- no_error_log
[error]



=== TEST 4: heartbeats are SSE comments between the events
--- http_config
    @ENGINE@
--- config
    location /v1/ { hypic_pass tiny; hypic_heartbeat 30ms; }
--- request
POST /v1/completions
{"prompt": "Hello", "max_tokens": 30, "ignore_eos": true, "temperature": 0, "stream": true}
--- error_code: 200
--- response_check
my ($res) = @_;
my @ev = sse_events($res->[0]{body}, 1);
ok(scalar(grep { $_ eq ':' } grep { !ref } @ev) >= 1,
   'a stream longer than hypic_heartbeat carries ": ping" comments');
my @j = grep { ref } @ev;
is($ev[-1], '[DONE]', 'and still ends with [DONE]');
is($j[-1]{choices}[0]{finish_reason}, 'length',
   'and the events around them are whole');
--- no_error_log
[error]



=== TEST 5: a client that goes away cancels its request and frees its slot
--- http_config
    @ENGINE@
--- config
    location /v1/ { hypic_pass tiny; }
--- response_check
my ($res, $block, $srv) = @_;
my $long = "POST /v1/completions\n"
    . body(prompt => 'Hello', max_tokens => 4000, ignore_eos => JSON::PP::true,
           stream => JSON::PP::true);
my @h = map { open_request($srv->{port}, $long) } 1 .. 2;
my @r = map { read_until($_, sub { $_[0]{body} =~ /data: \{/ }, 10) } @h;
is(scalar(grep { ($_->{status} // 0) == 200 && $_->{body} =~ /data: \{/ }
              @r), 2, 'two endless streams hold both slots');
my $full = http_request($srv, "POST /v1/completions\n{\"prompt\": \"x\"}");
is($full->{status}, 429, 'a third request finds no slot');
close $_->{sock} for @h;
my $ok;
for (1 .. 200) {
    my $t = http_request($srv, "POST /v1/completions\n"
                         . "{\"prompt\": \"x\", \"max_tokens\": 1}");
    $ok = ($t->{status} // 0) == 200 and last;
    sleep 0.05;
}
ok($ok, 'once the clients are gone, their slots serve others');
--- error_log
client prematurely closed connection
engine "tiny" has all 2 slots in flight
--- no_error_log
[error]



=== TEST 6: concurrent streams each carry their own text
--- http_config
    @ENGINE@
--- config
    location /v1/ { hypic_pass tiny; }
--- response_check
my ($res, $block, $srv) = @_;
my @p = ('Hello world', 'Once upon a time');
my @r = concurrently($srv->{port}, map {
    "POST /v1/completions\n" . body(prompt => $_, max_tokens => 14,
                                    temperature => 0,
                                    stream => JSON::PP::true)
} @p);
for my $i (0 .. $#p) {
    my @ev = sse_events($r[$i]{body});
    is($ev[-1], '[DONE]', "stream $i ends with [DONE]");
    is(sse_text(grep { ref } @ev), cli(prompt => $p[$i], max_tokens => 14),
       "stream $i has its own greedy text");
}
--- no_error_log
[error]
