# The JSON front is strict where cJSON alone would lose or change the
# client's text (issue #16 item 3): bytes that are not white space around
# the value, "\u0000" and bad \u escapes (cJSON decodes both to a NUL that
# cuts the string), raw control bytes, unpaired surrogates and invalid
# UTF-8 in strings, nesting past 64 levels, numbers a double cannot hold
# and names given twice are a 400 in OpenAI's shape that names the field;
# valid text, whatever its escapes, reaches the engine whole (prompt_tokens
# equals the tokenizer's count for the decoded text).

use strict;
use warnings;
use lib 't/lib';

use Hypic::Nginx;
use Hypic::Engine;

Hypic::Engine::Client->import(qw(json_of));

our $MODEL = Hypic::Engine->test_model;
our $engine = Hypic::Engine->start_suite(
    args => ['--node', 't-node', '--slots', 4, '--max-context', 256,
             '--max-prompt-bytes', '64k']);

sub tokens {
    my ($text) = @_;
    return scalar(() = Hypic::Engine->tokenize(model => $MODEL,
                                               text => $text));
}

# a completion request whose body is these bytes
sub completion { "POST /v1/completions\n$_[0]" }

# {"prompt": "<raw>", "max_tokens": 1}: raw is the JSON text of the string
sub prompt { completion("{\"prompt\": \"$_[0]\", \"max_tokens\": 1}") }

# the refusal of a body, in OpenAI's shape
sub refused {
    my ($why, $param) = @_;
    return { error => { type => 'invalid_request_error', code => undef,
                        param => $param, message => $why } };
}

# (the blocks' eval sections run in Test::Base::Filter: they call these as
# ::name)

run_tests();

__DATA__

=== TEST 1: bytes around the value that are not JSON white space (a BOM
is: cJSON skips it only before 2 bytes or more, found by fuzz/fuzz_json)
--- http_config
    @ENGINE@
--- config
    location /v1/ { hypic_pass tiny; }
--- request eval
[::completion("\xef\xbb\xbf8"),
 ::completion("\0{\"prompt\": \"hi\"}"),
 ::completion("\x01{\"prompt\": \"hi\"}"),
 ::completion("{\"prompt\":\x0c \"hi\"}"),
 ::completion("{\"prompt\": \"hi\"}\0"),
 ::completion("{\"prompt\": \"hi\"} x")]
--- error_code: 400
--- response_body_json eval
[::refused("The request body must be a JSON object", undef),
 ::refused("We could not parse the JSON body of your request: invalid JSON "
         . "at byte 0 of 17", undef),
 ::refused(qr/: invalid JSON at byte 0 of 17$/, undef),
 ::refused(qr/: invalid JSON at byte 10 of 17, in 'prompt'$/,
           'prompt'),
 ::refused(qr/: invalid JSON at byte 16 of 17$/, undef),
 ::refused(qr/: invalid JSON at byte 17 of 18$/, undef)]
--- no_error_log
[error]



=== TEST 2: strings that cJSON would cut short or change
--- http_config
    @ENGINE@
--- config
    location /v1/ { hypic_pass tiny; }
--- request eval
[::prompt('ab\u0000cd'),
 ::prompt('ab\u12G4cd'),
 ::prompt("ab\0cd"),
 ::prompt("ab\ncd"),
 ::prompt("ab\x1fcd"),
 ::prompt('ab\xcd'),
 ::prompt('ab\u00')]
--- error_code: 400
--- response_body_json eval
[::refused("We could not parse the JSON body of your request: \\u0000 (NUL) "
         . "is not allowed in a string at byte 14 of 41, in 'prompt'",
         'prompt'),
 ::refused(qr/: invalid \\u escape in a string at byte 14 of 41, in 'prompt'$/,
         'prompt'),
 ::refused(qr/: a control character must be escaped in a string at byte 14 /,
         'prompt'),
 ::refused(qr/: a control character must be escaped in a string at byte 14 /,
         'prompt'),
 ::refused(qr/: a control character must be escaped in a string at byte 14 /,
         'prompt'),
 ::refused(qr/: invalid escape in a string at byte 14 /, 'prompt'),
 ::refused(qr/: invalid \\u escape in a string at byte 14 /, 'prompt')]
--- no_error_log
[error]



=== TEST 3: the refusal names the field where the text is nested
--- http_config
    @ENGINE@
--- config
    location /v1/ { hypic_pass tiny; }
--- request eval
["POST /v1/chat/completions\n{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}, {\"role\": \"user\", \"content\": \"b\\u0000\"}]}",
 "POST /v1/chat/completions\n{\"messages\": [{\"role\": \"user\", \"content\": [{\"type\": \"text\", \"text\": \"\\u12G4\"}]}]}",
 ::completion("{\"prompt\": \"a\", \"stop\": [\"x\", \"y\\u0000\"]}"),
 ::completion("{\"prompt\": \"a\", \"hypic\": {\"decode\": \"auto\\u0000\"}}"),
 ::completion("{\"prompt\\u0000\": \"a\"}"),
 ::completion("{\"prompt\": \"a\", \"x\": {\"\\u0000\": 1}}")]
--- error_code: 400
--- response_body_json eval
[::refused(qr/NUL.* at byte 78 of 88, in 'messages\[1\]\.content'$/,
         'messages[1].content'),
 ::refused(qr/invalid \\u escape/, 'messages[0].content[0].text'),
 ::refused(qr/NUL/, 'stop[1]'),
 ::refused(qr/NUL/, 'hypic.decode'),
 ::refused(qr/NUL.* at byte 8 of 21$/, undef),
 ::refused(qr/NUL.* at byte 23 of 35, in 'x'$/, 'x')]
--- no_error_log
[error]



=== TEST 4: unpaired UTF-16 surrogates
--- http_config
    @ENGINE@
--- config
    location /v1/ { hypic_pass tiny; }
--- request eval
[::prompt('a\ud800'),
 ::prompt('a\ud800b'),
 ::prompt('a\ud83d\u0041'),
 ::prompt('a\ude00\ud83d'),
 ::prompt('a\ud83d\u12G4')]
--- error_code: 400
--- response_body_json eval
[::refused(qr/: unpaired UTF-16 surrogate in a string at byte 13 .*'prompt'$/,
         'prompt'),
 ::refused(qr/: unpaired UTF-16 surrogate in a string at byte 13 /, 'prompt'),
 ::refused(qr/: unpaired UTF-16 surrogate in a string at byte 13 /, 'prompt'),
 ::refused(qr/: unpaired UTF-16 surrogate in a string at byte 13 /, 'prompt'),
 ::refused(qr/: unpaired UTF-16 surrogate in a string at byte 13 /, 'prompt')]
--- no_error_log
[error]



=== TEST 5: invalid UTF-8 in a string (overlong, surrogate, past U+10FFFF,
cut short, stray continuation)
--- http_config
    @ENGINE@
--- config
    location /v1/ { hypic_pass tiny; }
--- request eval
[::prompt("a\xc0\xaf"),
 ::prompt("a\xe0\x80\xaf"),
 ::prompt("a\xf0\x80\x80\xaf"),
 ::prompt("a\xed\xa0\x80"),
 ::prompt("a\xf4\x90\x80\x80"),
 ::prompt("a\xe2\x82"),
 ::prompt("a\x80"),
 ::prompt("a\xff"),
 ::completion("{\"pr\xffompt\": \"a\"}")]
--- error_code: 400
--- response_body_json eval
[(map { ::refused(qr/: invalid UTF-8 in a string at byte 13 .*'prompt'$/,
                'prompt') } 1 .. 8),
 ::refused(qr/: invalid UTF-8 in a string at byte 4 of 16$/, undef)]
--- no_error_log
[error]



=== TEST 6: valid text reaches the engine whole, whatever its escapes
--- http_config
    @ENGINE@
--- config
    location /v1/ { hypic_pass tiny; }
--- request eval
[::prompt('caf\u00e9 \ud83d\ude00 tab\u0009 q\"\\\/ \u20ac'),
 ::prompt("caf\xc3\xa9 \xf0\x9f\x98\x80 \xe2\x82\xac \xf4\x8f\xbf\xbf"),
 ::completion("\xef\xbb\xbf {\"prompt\": \"Hello\", \"max_tokens\": 1}\r\n\t"),
 ::completion("{\"prompt\": \"Hello\", \"max_tokens\": 1, \"x\": {\"prompt\": 2}, \"y\": [{\"prompt\": 3}, {\"prompt\": 4}]}")]
--- error_code: 200
--- response_check
my ($res) = @_;
my @want = ("caf\xc3\xa9 \xf0\x9f\x98\x80 tab\t q\"\\/ \xe2\x82\xac",
            "caf\xc3\xa9 \xf0\x9f\x98\x80 \xe2\x82\xac \xf4\x8f\xbf\xbf",
            "Hello", "Hello");
for my $i (0 .. $#want) {
    is(json_of($res->[$i])->{usage}{prompt_tokens}, tokens($want[$i]),
       "request $i: prompt_tokens counts the decoded text");
}
--- no_error_log
[error]



=== TEST 7: nesting: 64 levels are read, 65 and cJSON's own 1001 are not
--- http_config
    @ENGINE@
--- config
    location /v1/ { hypic_pass tiny; }
--- request eval
[::completion("{\"prompt\": \"a\", \"max_tokens\": 1, \"x\": "
            . ("[" x 63) . ("]" x 63) . "}"),
 ::completion("{\"prompt\": \"a\", \"x\": " . ("[" x 64) . ("]" x 64) . "}"),
 ::completion("{\"prompt\": \"a\", \"x\": " . ("[" x 1000) . ("]" x 1000)
            . "}")]
--- error_code eval
[200, 400, 400]
--- response_body_json eval
[{ object => "text_completion" },
 ::refused(qr/: nesting deeper than 64 levels at byte 84 of 150, in 'x(\[0\]){41}\.\.\.'$/,
           'x' . ('[0]' x 41) . '...'),
 ::refused(qr/: nesting deeper than 64 levels at byte 84 of 2022, in 'x\[0\]/,
           'x' . ('[0]' x 41) . '...')]
--- no_error_log
[error]



=== TEST 8: numbers: the JSON grammar, at most 63 characters, a double
--- http_config
    @ENGINE@
--- config
    location /v1/ { hypic_pass tiny; }
--- request eval
[::completion("{\"prompt\": \"a\", \"x\": 1e400}"),
 ::completion("{\"prompt\": \"a\", \"x\": -1e400}"),
 ::completion("{\"prompt\": \"a\", \"max_tokens\": 1e400}"),
 ::completion("{\"prompt\": \"a\", \"x\": 1" . ("0" x 63) . "}"),
 ::completion("{\"prompt\": \"a\", \"max_tokens\": 01}"),
 ::completion("{\"prompt\": \"a\", \"max_tokens\": 1.}"),
 ::completion("{\"prompt\": \"a\", \"max_tokens\": +1}"),
 ::completion("{\"prompt\": \"a\", \"max_tokens\": .5}"),
 ::completion("{\"prompt\": \"a\", \"max_tokens\": 1e}"),
 ::completion("{\"prompt\": \"a\", \"max_tokens\": -}"),
 ::completion("{\"prompt\": \"a\", \"max_tokens\": 1, \"x\": 1e-400, "
            . "\"y\": -0.5E+3, \"z\": 1" . ("0" x 62) . "}")]
--- error_code eval
[(400) x 10, 200]
--- response_body_json eval
[::refused(qr/: a number too large for a double at byte 21 of 27, in 'x'$/,
         'x'),
 ::refused(qr/: a number too large for a double at byte 21 /, 'x'),
 ::refused(qr/: a number too large for a double /, 'max_tokens'),
 ::refused(qr/: a number longer than 63 characters at byte 21 /, 'x'),
 ::refused(qr/: invalid JSON at byte 31 of 33, in 'max_tokens'$/,
         'max_tokens'),
 ::refused(qr/: invalid JSON at byte 32 /, 'max_tokens'),
 ::refused(qr/: invalid JSON at byte 30 /, 'max_tokens'),
 ::refused(qr/: invalid JSON at byte 30 /, 'max_tokens'),
 ::refused(qr/: invalid JSON at byte 32 /, 'max_tokens'),
 ::refused(qr/: invalid JSON at byte 31 /, 'max_tokens'),
 { object => "text_completion" }]
--- no_error_log
[error]



=== TEST 9: a name given twice in one object (cJSON keeps the first)
--- http_config
    @ENGINE@
--- config
    location /v1/ { hypic_pass tiny; }
--- request eval
[::completion("{\"prompt\": \"a\", \"prompt\": \"b\"}"),
 ::completion("{\"prompt\": \"a\", \"pr\\u006fmpt\": \"b\"}"),
 "POST /v1/chat/completions\n{\"messages\": [{\"role\": \"user\", \"content\": \"a\", \"content\": \"b\"}]}",
 ::completion("{\"prompt\": \"a\", \"hypic\": {\"decode\": \"auto\", "
            . "\"decode\": \"recurrent\"}}"),
 ::completion("{\"prompt\": \"a\", \"\": 1, \"\": 2}")]
--- error_code: 400
--- response_body_json eval
[::refused("We could not parse the JSON body of your request: a name given "
         . "twice in one object, 'prompt'", 'prompt'),
 ::refused(qr/: a name given twice in one object, 'prompt'$/, 'prompt'),
 ::refused(qr/, 'messages\[0\]\.content'$/, 'messages[0].content'),
 ::refused(qr/, 'hypic\.decode'$/, 'hypic.decode'),
 ::refused(qr/, '""'$/, '""')]
--- no_error_log
[error]
