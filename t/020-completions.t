# Completions through real nginx and a real engine (models/test/
# qwen35-dense), not streamed: the OpenAI shapes of /v1/completions and
# /v1/chat/completions, greedy text equal to `hypic-engine generate` (the
# CLI is the reference), max_tokens and finish_reason, stop strings,
# seeded sampling, the separator, concurrent requests, and the requests
# the engine refuses.

use strict;
use warnings;
use lib 't/lib';

use Hypic::Nginx;
use Hypic::Engine;

Hypic::Engine::Client->import(qw(concurrently json_body json_of text_of
                                 chatml));

our $MODEL = Hypic::Engine->test_model;
our $engine = Hypic::Engine->start_suite(
    args => ['--node', 't-node', '--slots', 8, '--batch', 3,
             '--max-context', 256, '--max-prompt-bytes', '64k']);

# the CLI's answer for a prompt, as bytes
sub cli { Hypic::Engine->generate(model => $MODEL, @_) }

# how many tokens the model sees for a text
sub tokens {
    my ($text) = @_;
    return scalar(() = Hypic::Engine->tokenize(model => $MODEL,
                                               text => $text));
}

# a JSON string (characters) as UTF-8 bytes
sub bytes {
    my ($s) = @_;
    $s //= '';
    utf8::encode($s);
    return $s;
}

sub body { json_body(@_) }

run_tests();

__DATA__

=== TEST 1: a completion in OpenAI's shape, its greedy text the CLI's
--- http_config
    @ENGINE@
--- config
    location /v1/ { hypic_pass tiny; hypic_mode pic; }
--- request
POST /v1/completions
{"model": "tiny-1", "prompt": "Hello world", "max_tokens": 12, "temperature": 0}
--- error_code: 200
--- response_headers
Content-Type: application/json
X-Hypic-Mode: pic
X-Hypic-Node: t-node
X-Hypic-Segments: 0/1
--- response_body_json eval
{ id => qr/^cmpl-[0-9a-f]{24}$/, object => "text_completion",
  created => qr/^\d{10}$/, model => "tiny-1",
  choices => [{ index => 0, logprobs => undef,
                finish_reason => qr/^(stop|length)$/ }],
  usage => { prompt_tokens => 7, completion_tokens => qr/^\d+$/,
             total_tokens => qr/^\d+$/,
             prompt_tokens_details => { cached_tokens => 0 } } }
--- response_check
my ($res) = @_;
my $j = json_of($res->[0]);
is(bytes($j->{choices}[0]{text}),
   cli(prompt => 'Hello world', max_tokens => 12),
   'greedy text equals hypic-engine generate');
is($j->{usage}{prompt_tokens}, tokens('Hello world'),
   'prompt_tokens counts the prompt');
is($j->{usage}{total_tokens},
   $j->{usage}{prompt_tokens} + $j->{usage}{completion_tokens},
   'total_tokens adds up');
--- no_error_log
[error]



=== TEST 2: a chat completion, rendered as ChatML, equals the CLI on that
--- http_config
    @ENGINE@
--- config
    location /v1/ { hypic_pass tiny; }
--- request
POST /v1/chat/completions
{"model": "tiny-1", "max_tokens": 10, "temperature": 0, "messages": [{"role": "developer", "content": "Be brief."}, {"role": "user", "content": [{"type": "text", "text": "Hi"}, {"type": "text", "text": " there"}]}]}
--- error_code: 200
--- response_headers
Content-Type: application/json
X-Hypic-Mode: pic
--- response_body_json eval
{ id => qr/^chatcmpl-[0-9a-f]{24}$/, object => "chat.completion",
  model => "tiny-1",
  choices => [{ index => 0, logprobs => undef,
                message => { role => "assistant" },
                finish_reason => qr/^(stop|length)$/ }],
  usage => { prompt_tokens_details => { cached_tokens => 0 } } }
--- response_check
my ($res) = @_;
my $j = json_of($res->[0]);
my $prompt = chatml(system => 'Be brief.', user => 'Hi there');
is(bytes($j->{choices}[0]{message}{content}),
   cli(prompt => $prompt, max_tokens => 10),
   'chat text equals hypic-engine generate on the ChatML prompt');
is($j->{usage}{prompt_tokens}, tokens($prompt),
   'prompt_tokens counts the rendered prompt');
--- no_error_log
[error]



=== TEST 3: max_tokens is respected, finish_reason "length"
--- http_config
    @ENGINE@
--- config
    location /v1/ { hypic_pass tiny; }
--- request eval
["POST /v1/completions\n{\"prompt\": \"Hello\", \"max_tokens\": 5, \"ignore_eos\": true}",
 "POST /v1/chat/completions\n{\"messages\": [{\"role\": \"user\", \"content\": \"Hi\"}], \"max_completion_tokens\": 3, \"ignore_eos\": true}",
 "POST /v1/completions\n{\"prompt\": \"Hello\", \"max_tokens\": 0}",
 "POST /v1/completions\n{\"prompt\": \"Hello\", \"ignore_eos\": true}"]
--- error_code: 200
--- response_body_json eval
[{ choices => [{ finish_reason => "length" }],
   usage => { completion_tokens => 5 } },
 { choices => [{ finish_reason => "length" }],
   usage => { completion_tokens => 3 } },
 { choices => [{ text => "", finish_reason => "length" }],
   usage => { completion_tokens => 0 } },
 { choices => [{ finish_reason => "length" }],
   usage => { completion_tokens => 16 } }]
--- no_error_log
[error]



=== TEST 4: stop strings end the text before them, like the CLI's --stop
--- http_config
    @ENGINE@
--- config
    location /v1/ { hypic_pass tiny; }
--- response_check
my ($res, $block, $srv) = @_;
my $full = cli(prompt => 'Once upon a time', max_tokens => 40);
my ($at) = grep { substr($full, $_, 2) =~ /^[a-z]{2}$/ } 3 .. length($full) - 2;
ok(defined $at, 'the reference has a two-letter stop candidate')
    or diag($full);
my $stop = substr($full, $at // 0, 2);
my $want = substr($full, 0, index($full, $stop));
my $r = http_request($srv, "POST /v1/completions\n"
    . body(prompt => 'Once upon a time', max_tokens => 40, temperature => 0,
           stop => $stop));
my $j = json_of($r);
is(bytes($j->{choices}[0]{text}), $want, "text ends before \"$stop\"");
is($j->{choices}[0]{finish_reason}, 'stop', 'finish_reason is "stop"');
is($want, cli(prompt => 'Once upon a time', max_tokens => 40,
              stop => [$stop]), 'the CLI agrees');
$r = http_request($srv, "POST /v1/completions\n"
    . body(prompt => 'Once upon a time', max_tokens => 40, temperature => 0,
           stop => ['never there', $stop]));
is(text_of($r), $want,
   'any of an array of stop strings ends it');
--- no_error_log
[error]



=== TEST 5: seeded sampling is reproducible and matches the CLI's
--- http_config
    @ENGINE@
--- config
    location /v1/ { hypic_pass tiny; }
--- request eval
["POST /v1/completions\n{\"prompt\": \"Hello\", \"max_tokens\": 20, \"temperature\": 0.9, \"seed\": 42}",
 "POST /v1/completions\n{\"prompt\": \"Hello\", \"max_tokens\": 20, \"temperature\": 0.9, \"seed\": 42}"]
--- error_code: 200
--- response_check
my ($res) = @_;
my @t = map { text_of($_) } @$res;
is($t[0], $t[1], 'the same seed gives the same text');
is($t[0], cli(prompt => 'Hello', max_tokens => 20,
              args => ['--temperature', '0.9', '--seed', '42']),
   'and the CLI gives it too');
--- no_error_log
[error]



=== TEST 6: the separator is the location's, and never reaches the model
--- http_config
    @ENGINE@
--- config
    location /a/ { hypic_pass tiny; }
    location /b/ { hypic_pass tiny; hypic_separator "|||"; }
--- request eval
["POST /a/v1/completions\n{\"prompt\": \"sys<|pic_sep|>doc<|pic_sep|>question\", \"max_tokens\": 8, \"temperature\": 0}",
 "POST /b/v1/completions\n{\"prompt\": \"Hello|||world\", \"max_tokens\": 8, \"temperature\": 0}"]
--- error_code: 200
--- response_headers eval
["X-Hypic-Segments: 0/3", "X-Hypic-Segments: 0/2"]
--- response_check
my ($res) = @_;
is(text_of($res->[0]),
   cli(prompt => 'sys<|pic_sep|>doc<|pic_sep|>question', max_tokens => 8),
   'three segments: the CLI splits alike');
is(text_of($res->[1]),
   cli(prompt => 'Hello|||world', max_tokens => 8,
       args => ['--separator', '|||']),
   'hypic_separator "|||" is what the engine splits on');
--- no_error_log
[error]



=== TEST 7: concurrent requests each get exactly their own greedy text
--- http_config
    @ENGINE@
--- config
    location /v1/ { hypic_pass tiny; }
--- response_check
my ($res, $block, $srv) = @_;
my @prompts = ('Hello world', 'Once upon a time', 'The quick brown fox',
               'a b c', 'story ' x 40, 'Hello world');
my @max = (20, 30, 12, 25, 15, 20);
my @reqs = map {
    "POST /v1/completions\n"
    . body(prompt => $prompts[$_], max_tokens => $max[$_], temperature => 0)
} 0 .. $#prompts;
push @reqs, "POST /v1/chat/completions\n"
    . body(messages => [{ role => 'user', content => 'Hi' }],
           max_tokens => 18, temperature => 0);
my @r = concurrently($srv->{port}, @reqs);
is(scalar(grep { ($_->{status} // 0) == 200 } @r), scalar @reqs,
   'all ' . @reqs . ' concurrent requests succeed');
for my $i (0 .. $#prompts) {
    is(text_of($r[$i]),
       cli(prompt => $prompts[$i], max_tokens => $max[$i]),
       "request $i equals its CLI reference");
}
is(bytes(json_of($r[-1])->{choices}[0]{message}{content}),
   cli(prompt => chatml(user => 'Hi'), max_tokens => 18),
   'the chat request too');
my %ids = map { json_of($_)->{id} => 1 } @r;
is(scalar keys %ids, scalar @r, 'every answer has its own id');
--- no_error_log
[error]



=== TEST 8: what the engine or the checks refuse, in OpenAI's error shape
--- http_config
    @ENGINE@
--- config
    location /v1/ { hypic_pass tiny; }
--- request eval
["POST /v1/completions\n{\"prompt\": \"\"}",
 "POST /v1/completions\n{\"prompt\": \"" . ("word " x 400) . "\", \"max_tokens\": 1}",
 "POST /v1/completions\n{\"prompt\": [\"a\", \"b\"]}",
 "POST /v1/completions\n{\"prompt\": \"a\", \"stop\": [\"1\", \"2\", \"3\", \"4\", \"5\"]}",
 "POST /v1/completions\n{\"prompt\": \"a\", \"stop\": \"\"}",
 "POST /v1/completions\n{\"prompt\": \"a\", \"top_k\": -1}",
 "POST /v1/completions\n{\"prompt\": \"a\", \"stream_options\": 3}",
 "POST /v1/chat/completions\n{\"messages\": [{\"role\": \"user\", \"content\": [{\"type\": \"image_url\", \"image_url\": {\"url\": \"x\"}}]}]}",
 "POST /v1/completions\n{\"prompt\": \"Hi\", \"max_tokens\": 2}"]
--- error_code eval
[400, 400, 400, 400, 400, 400, 400, 400, 200]
--- response_body_json eval
[{ error => { type => "invalid_request_error", code => "invalid_prompt",
              message => "prompt has no tokens" } },
 { error => { type => "invalid_request_error",
              code => "context_length_exceeded",
              message => qr/the prompt is \d+ tokens, the model's context is 256/ } },
 { error => { param => "prompt", message => qr/only one prompt/ } },
 { error => { param => "stop", message => qr/at most 4 strings/ } },
 { error => { param => "stop", message => qr/1 to 64 bytes/ } },
 { error => { param => "top_k" } },
 { error => { param => "stream_options" } },
 { error => { param => "messages", message => qr/only text is supported/ } },
 { object => "text_completion" }]
--- error_log
hypic: engine refused
--- no_error_log
[error]



=== TEST 9: generation stops at the end of the model's context
--- http_config
    @ENGINE@
--- config
    location /v1/ { hypic_pass tiny; hypic_max_tokens 100000; }
--- request eval
"POST /v1/completions\n{\"prompt\": \"" . ("word " x 40) . "\", \"max_tokens\": 5000, \"ignore_eos\": true}"
--- error_code: 200
--- response_body_json eval
{ choices => [{ finish_reason => "length" }] }
--- response_check
my ($res) = @_;
my $u = json_of($res->[0])->{usage};
is($u->{total_tokens}, 256, 'prompt + completion fill the context');
--- no_error_log
[error]
