# Valid chunked request bodies (Transfer-Encoding: chunked) through real
# nginx and a real engine on models/test/qwen35-dense, in every shape a
# client may send: one chunk, 1-byte chunks, chunk extensions, trailers,
# a stream, a body nginx keeps in a temp file, a body that arrives in
# pieces. Each answer is the same as for a Content-Length body: the CLI's
# greedy text. nginx ends a chunked body's buffer chain with an empty
# buffer; copying from it once killed the worker under the sanitizers
# (make test-asan), with every stream it was serving.

use strict;
use warnings;
use lib 't/lib';

use IO::Select;
use IO::Socket::INET;
use Time::HiRes qw(sleep);
use Hypic::Nginx;
use Hypic::Engine;

Hypic::Engine::Client->import(qw(open_request read_until finish_request
                                 sse_events sse_text json_body json_of
                                 text_of chatml));

our $MODEL = Hypic::Engine->test_model;
our $engine = Hypic::Engine->start_suite(
    args => ['--node', 't-node', '--slots', 4, '--batch', 4,
             '--throttle-ms', 10, '--max-prompt-bytes', '64k']);

sub cli { Hypic::Engine->generate(model => $MODEL, @_) }

# the CLI's texts for $CHAT and $COMPLETION, and a chat answer's text
my %want;
sub want_chat {
    return $want{chat} //= cli(prompt => $main::CHAT_PROMPT, max_tokens => 4);
}
sub want_completion {
    return $want{completion} //= cli(prompt => 'Hello world',
                                     max_tokens => 6);
}
sub chat_text {
    my $c = json_of($_[0])->{choices}[0]{message}{content} // '';
    utf8::encode($c);
    return $c;
}

# the chat body of the issue's curl, and its prompt as the engine sees it
our $CHAT = '{"messages":[{"role":"user","content":"Hello"}],'
            . '"max_tokens":4,"temperature":0}';
our $CHAT_PROMPT = chatml(user => 'Hello');

our $COMPLETION = json_body(prompt => 'Hello world', max_tokens => 6,
                            temperature => 0);

# A request with a chunked body: the pieces are the chunks' data; "ext"
# goes after each chunk's size, "trailer" (header lines) after the last.
sub chunked {
    my ($uri, $pieces, %o) = @_;
    my $ext = $o{ext} // '';
    my $body = CORE::join('', map { sprintf("%x%s\r\n%s\r\n", length $_,
                                            $ext, $_) } @$pieces);
    return "POST $uri HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n"
           . "Content-Type: application/json\r\n"
           . "Transfer-Encoding: chunked\r\n\r\n"
           . $body . "0\r\n" . ($o{trailer} // '') . "\r\n";
}

# the body cut into pieces of n bytes
sub pieces {
    my ($data, $n) = @_;
    return [ $data =~ /(.{1,$n})/gs ];
}

# Sends raw bytes in the given parts, pausing between them so that nginx
# reads them apart (a body that arrives in pieces), then reads the
# answer. The pause only orders events; nothing measures it.
sub send_parts {
    my ($port, @parts) = @_;
    my $s = IO::Socket::INET->new(PeerAddr => '127.0.0.1',
                                  PeerPort => $port, Proto => 'tcp')
        or die "connect: $!";
    local $SIG{PIPE} = 'IGNORE';
    for my $i (0 .. $#parts) {
        sleep 0.1 if $i;
        syswrite($s, $parts[$i]) == length $parts[$i] or die "write: $!";
    }
    $s->blocking(0);
    return finish_request({ sock => $s, method => 'POST', data => '',
                            reads => [], t0 => 0 }, 30);
}

run_tests();

__DATA__

=== TEST 1: the issue's request: a chat body in one chunk
--- http_config
    @ENGINE@
--- config
    location /v1/ { hypic_pass tiny; }
--- raw_request eval
main::chunked('/v1/chat/completions', [$main::CHAT])
--- error_code: 200
--- response_headers
Content-Type: application/json
--- response_body_json eval
{ object => "chat.completion", model => "tiny-1",
  choices => [{ index => 0, message => { role => "assistant" } }] }
--- response_check
my ($res) = @_;
is(chat_text($res->[0]), want_chat(),
   'the chat text is the CLI\'s, as for a Content-Length body');
--- no_error_log
[error]



=== TEST 2: every byte its own chunk: a long buffer chain
--- http_config
    @ENGINE@
--- config
    location /v1/ { hypic_pass tiny; }
--- raw_request eval
[main::chunked('/v1/completions', main::pieces($main::COMPLETION, 1)),
 main::chunked('/v1/chat/completions', main::pieces($main::CHAT, 1))]
--- error_code: 200
--- response_check
my ($res) = @_;
is(text_of($res->[0]), want_completion(),
   'completion from 1-byte chunks: the CLI\'s text');
is(chat_text($res->[1]), want_chat(),
   'chat from 1-byte chunks: the CLI\'s text');
--- no_error_log
[error]



=== TEST 3: chunk extensions are ignored
--- http_config
    @ENGINE@
--- config
    location /v1/ { hypic_pass tiny; }
--- raw_request eval
[main::chunked('/v1/completions', main::pieces($main::COMPLETION, 7),
         ext => ';name=value;flag'),
 main::chunked('/v1/completions', main::pieces($main::COMPLETION, 5),
         ext => ';q="quoted; string"')]
--- error_code: 200
--- response_check
my ($res) = @_;
my $want = want_completion();
is(text_of($res->[$_]), $want, "extensions $_: the CLI's text") for 0, 1;
--- no_error_log
[error]



=== TEST 4: trailer fields after the last chunk
--- http_config
    @ENGINE@
--- config
    location /v1/ { hypic_pass tiny; }
--- raw_request eval
[main::chunked('/v1/completions', main::pieces($main::COMPLETION, 9),
         trailer => "X-Checksum: 1234\r\nX-Other: a, b\r\n"),
 main::chunked('/v1/chat/completions', [$main::CHAT],
         trailer => "X-Checksum: 5678\r\n")]
--- error_code: 200
--- response_check
my ($res) = @_;
is(text_of($res->[0]), want_completion(),
   'completion with trailers: the CLI\'s text');
is(chat_text($res->[1]), want_chat(),
   'chat with a trailer: the CLI\'s text');
--- no_error_log
[error]



=== TEST 5: "stream": true in a chunked body streams the CLI's text
--- http_config
    @ENGINE@
--- config
    location /v1/ { hypic_pass tiny; }
--- raw_request eval
[main::chunked('/v1/chat/completions',
         main::pieces(main::json_body(
             messages => [{ role => 'user', content => 'Hello' }],
             max_tokens => 8, temperature => 0, stream => JSON::PP::true()),
             3)),
 main::chunked('/v1/completions',
         [main::json_body(prompt => 'Hello world', max_tokens => 8,
                          temperature => 0, stream => JSON::PP::true())],
         trailer => "X-T: 1\r\n")]
--- error_code: 200
--- response_headers
Content-Type: text/event-stream
--- response_check
my ($res) = @_;
for my $i (0, 1) {
    my @ev = sse_events($res->[$i]{body});
    is($ev[-1], '[DONE]', "stream $i ends with [DONE]");
    is(scalar(grep { !ref && $_ ne '[DONE]' } @ev), 0,
       "stream $i: every event is JSON");
}
is(sse_text(sse_events($res->[0]{body})),
   cli(prompt => chatml(user => 'Hello'), max_tokens => 8),
   'streamed chat text is the CLI\'s');
is(sse_text(sse_events($res->[1]{body})),
   cli(prompt => 'Hello world', max_tokens => 8),
   'streamed completion text is the CLI\'s');
--- no_error_log
[error]



=== TEST 6: a chunked body nginx writes to a temp file
client_body_buffer_size smaller than the body spills it to a file;
client_body_in_file_only keeps even a small one there. Content-Length
bodies take the same paths.
--- http_config
    @ENGINE@
--- config
    location /v1/ {
        hypic_pass tiny;
        client_body_buffer_size 16;
    }
    location /file/v1/ {
        hypic_pass tiny;
        client_body_in_file_only clean;
    }
--- raw_request eval
[main::chunked('/v1/completions', main::pieces($main::COMPLETION, 4)),
 main::chunked('/file/v1/completions',
               main::pieces($main::COMPLETION, 10)),
 main::chunked('/file/v1/chat/completions', [$main::CHAT]),
 "POST /v1/completions HTTP/1.1\r\nHost: localhost\r\n"
 . "Connection: close\r\nContent-Length: " . length($main::COMPLETION)
 . "\r\n\r\n$main::COMPLETION"]
--- error_code: 200
--- response_check
my ($res) = @_;
my $want = want_completion();
is(text_of($res->[$_]), $want, "in-file body $_: the CLI's text")
    for 0, 1, 3;
is(chat_text($res->[2]), want_chat(),
   'in-file chat: the CLI\'s text');
--- error_log
a client request body is buffered to a temporary file
--- no_error_log
[error]



=== TEST 7: a body that arrives in pieces, read as several buffers
The first read holds the headers and part of the body; the rest comes
later, a chunk header split from its data, the last chunk alone.
--- http_config
    @ENGINE@
--- config
    location /v1/ {
        hypic_pass tiny;
        client_body_buffer_size 64k;
    }
--- response_check
my ($res, $block, $srv) = @_;
my $want = want_completion();
my $req = chunked('/v1/completions', pieces($main::COMPLETION, 11));
my $head = index($req, "\r\n\r\n") + 4;
my $r = send_parts($srv->{port}, substr($req, 0, $head + 20),
                   substr($req, $head + 20, 3),
                   substr($req, $head + 23, -5), substr($req, -5));
is($r->{status}, 200, 'chunked body in pieces: 200') or diag($r->{body});
is(text_of($r), $want, 'chunked body in pieces: the CLI\'s text');

my $cl = "POST /v1/completions HTTP/1.1\r\nHost: localhost\r\n"
         . "Connection: close\r\nContent-Length: " . length($main::COMPLETION)
         . "\r\n\r\n";
my $c = $main::COMPLETION;
$r = send_parts($srv->{port}, $cl . substr($c, 0, 10), substr($c, 10, 10),
                substr($c, 20));
is($r->{status}, 200, 'Content-Length body in pieces: 200')
    or diag($r->{body});
is(text_of($r), $want, 'Content-Length body in pieces: the CLI\'s text');
--- no_error_log
[error]



=== TEST 8: streams in flight live through chunked requests on their worker
--- http_config
    @ENGINE@
--- config
    location /v1/ { hypic_pass tiny; }
--- response_check
my ($res, $block, $srv) = @_;
my @h = map {
    open_request($srv->{port}, "POST /v1/completions\n"
                 . json_body(prompt => "Stream $_", max_tokens => 24,
                             temperature => 0, stream => JSON::PP::true()))
} 1, 2;
for my $i (0, 1) {
    my $r = read_until($h[$i], sub { $_[0]{body} =~ /data: \{/ }, 20);
    like($r->{body}, qr/data: \{/, "stream $i has begun");
}
for my $i (1, 2) {
    my $r = http_request($srv, chunked('/v1/chat/completions', [$main::CHAT]));
    is($r->{status}, 200, "chunked request $i beside the streams: 200");
}
for my $i (0, 1) {
    my $r = finish_request($h[$i], 30);
    ok($r->{complete}, "stream $i is complete");
    my @ev = sse_events($r->{body});
    is($ev[-1], '[DONE]', "stream $i ends with [DONE]");
    is(sse_text(@ev), cli(prompt => 'Stream ' . ($i + 1), max_tokens => 24),
       "stream $i: the CLI's text, whole");
}
--- no_error_log
[error]



=== TEST 9: an empty chunked body is a JSON 400, not a crash
--- http_config
    @ENGINE@
--- config
    location /v1/ { hypic_pass tiny; }
--- raw_request eval
[main::chunked('/v1/completions', []),
 main::chunked('/v1/completions', [], trailer => "X-T: 1\r\n"),
 main::chunked('/v1/completions', ['  ', "\n"])]
--- error_code: 400
--- response_body_json eval
[{ error => { type => "invalid_request_error",
              message => qr/the body is empty/ } },
 { error => { type => "invalid_request_error",
              message => qr/the body is empty/ } },
 { error => { type => "invalid_request_error",
              message => qr/invalid JSON/ } }]
--- no_error_log
[error]
