# Combinations of chat fields that OpenAI refuses, each a 400 in OpenAI's
# shape naming its field, next to the same fields used right (200):
# tool_choice or parallel_tool_calls without tools; a tool turn that
# follows no assistant turn with tool_calls, or answers no call of it; an
# assistant turn whose calls are not all answered by the tool turns right
# after it; a call without an id. And what the legacy endpoint cannot do
# (echo, suffix, best_of past n) is refused rather than ignored, as are
# penalties out of OpenAI's range.

use strict;
use warnings;
use lib 't/lib';

use Hypic::Nginx;
use Hypic::Engine;

Hypic::Engine::Client->import(qw(json_body));

our $engine = Hypic::Engine->start_suite(
    args => ['--node', 't-node', '--slots', 4, '--max-context', 512]);

our $TIME = { type => 'function', function => {
    name => 'get_time', parameters => { type => 'object', properties => {
        zone => { type => 'string' } } } } };

sub call {
    my ($id) = @_;
    return { id => $id, type => 'function',
             function => { name => 'get_time', arguments => '{"zone":"CET"}' } };
}

sub user { { role => 'user', content => $_[0] // 'What time is it?' } }
sub asks { { role => 'assistant', content => '',
             tool_calls => [map { call($_) } @_] } }
sub answer { { role => 'tool', tool_call_id => $_[0], content => '12:00' } }

# a chat request with these fields, max_tokens 1
sub chat {
    return "POST /v1/chat/completions\n"
           . json_body(max_tokens => 1, messages => [user()], @_);
}

# a legacy completion request with these fields, max_tokens 1
sub cmpl {
    return "POST /v1/completions\n"
           . json_body(max_tokens => 1, prompt => 'Once upon', @_);
}

sub refused {
    my ($param, $why) = @_;
    return { error => { type => 'invalid_request_error', param => $param,
                        message => $why } };
}

run_tests();

__DATA__

=== TEST 1: tool_choice and parallel_tool_calls need tools
--- http_config
    @ENGINE@
--- config
    location /v1/ { hypic_pass tiny; }
--- request eval
[::chat(tool_choice => 'auto'),
 ::chat(tool_choice => 'none'),
 ::chat(parallel_tool_calls => JSON::PP::false),
 ::chat(tools => [$::TIME], tool_choice => 'auto',
        parallel_tool_calls => JSON::PP::false),
 ::chat(tools => [$::TIME], tool_choice => 'none'),
 ::chat(tool_choice => undef, parallel_tool_calls => undef)]
--- error_code eval
[400, 400, 400, 200, 200, 200]
--- response_body_json eval
[::refused('tool_choice', qr/only allowed when 'tools' are specified/),
 ::refused('tool_choice', qr/only allowed when 'tools' are specified/),
 ::refused('parallel_tool_calls',
           qr/only allowed when 'tools' are specified/),
 { object => 'chat.completion' },
 { object => 'chat.completion' },
 { object => 'chat.completion' }]
--- no_error_log
[error]



=== TEST 2: tool turns answer the calls of the assistant turn before them
--- http_config
    @ENGINE@
--- config
    location /v1/ { hypic_pass tiny; }
--- request eval
[::chat(messages => [::user(), ::answer('c1')]),
 ::chat(messages => [::user(), ::asks('c1'), ::answer('c1'), ::user('and?'),
                     ::answer('c1')]),
 ::chat(messages => [::user(), ::asks('c1'), ::answer('c9')]),
 ::chat(messages => [::user(), ::asks('c1', 'c2'), ::answer('c2'),
                     ::user('and?')]),
 ::chat(messages => [::user(), ::asks('c1')]),
 ::chat(messages => [::user(), { role => 'assistant', tool_calls => [
     { type => 'function', function => { name => 'get_time',
                                         arguments => '{}' } }] }]),
 ::chat(tools => [$::TIME],
        messages => [::user(), ::asks('c1', 'c2'), ::answer('c2'),
                     ::answer('c1'), ::user('and?')]),
 ::chat(tools => [$::TIME],
        messages => [::user(), ::asks('c1'), ::answer('c1')])]
--- error_code eval
[400, 400, 400, 400, 400, 400, 200, 200]
--- response_body_json eval
[::refused('messages',
           qr/'messages\[1\]' has role 'tool' but follows no assistant/),
 ::refused('messages',
           qr/'messages\[4\]' has role 'tool' but follows no assistant/),
 ::refused('messages',
           qr/'messages\[2\]\.tool_call_id' 'c9' is not the id of a call in 'messages\[1\]\.tool_calls'/),
 ::refused('messages',
           qr/followed by tool messages answering each call: 'messages\[1\]\.tool_calls' 'c1' has no answer/),
 ::refused('messages', qr/'messages\[1\]\.tool_calls' 'c1' has no answer/),
 ::refused('messages', qr/'messages\[1\]\.tool_calls\[0\]\.id' must be a string/),
 { object => 'chat.completion' },
 { object => 'chat.completion' }]
--- no_error_log
[error]



=== TEST 3: what would change the answer and is not done is refused, and
the fields we take without acting on them are checked like OpenAI's
--- http_config
    @ENGINE@
--- config
    location /v1/ { hypic_pass tiny; }
--- request eval
[::cmpl(echo => JSON::PP::true),
 ::cmpl(suffix => ' the end'),
 ::cmpl(best_of => 2),
 ::cmpl(n => 2, best_of => 1),
 ::cmpl(frequency_penalty => 2.5),
 ::chat(presence_penalty => -3),
 ::chat(frequency_penalty => 'x'),
 ::cmpl(echo => JSON::PP::false, suffix => '', best_of => 2, n => 2,
        frequency_penalty => -2, presence_penalty => 1.5),
 ::chat(frequency_penalty => 0.5, presence_penalty => 2)]
--- error_code eval
[400, 400, 400, 400, 400, 400, 400, 200, 200]
--- response_body_json eval
[::refused('echo', qr/'echo' is not supported/),
 ::refused('suffix', qr/'suffix' is not supported/),
 ::refused('best_of', qr/'best_of' greater than 'n' is not supported/),
 ::refused('best_of', qr/'best_of' must be at least 'n'/),
 ::refused('frequency_penalty', qr/from -2\.0 to 2\.0/),
 ::refused('presence_penalty', qr/from -2\.0 to 2\.0/),
 ::refused('frequency_penalty', qr/must be a number/),
 { object => 'text_completion' },
 { object => 'chat.completion' }]
--- no_error_log
[error]
