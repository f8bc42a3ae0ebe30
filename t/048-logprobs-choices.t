# Log-probabilities and n choices through real nginx and a real engine
# (models/test/qwen35-dense), as OpenAI shapes them: chat's
# logprobs.content[] (token, logprob, bytes, top_logprobs[]) and the
# completions' tokens / token_logprobs / top_logprobs / text_offset,
# streamed and not; the tokens spell the text, the chosen token of a
# greedy answer is the first alternative, alternatives come by falling
# log-probability and their probabilities sum to at most 1. n choices:
# each its index, choice 0 is the run of one choice with the same seed,
# a seed reproduces all of them, streamed they interleave and each ends;
# include_usage sends the usage chunk; max_completion_tokens wins over
# max_tokens; stop strings across tokens leave their tokens out; every
# invalid combination is a 400 naming the field.

use strict;
use warnings;
use lib 't/lib';

use JSON::PP ();
use List::Util qw(sum);
use Hypic::Nginx;
use Hypic::Engine;

Hypic::Engine::Client->import(qw(sse_events json_of));

our $MODEL = "$Hypic::Nginx::REPO/models/test/qwen35-dense";

my $why = Hypic::Engine->why_not || (-d $MODEL ? '' : "no $MODEL");
plan(skip_all => $why) if $why;

# HYPIC_TEST_DEVICE=cuda: the same checks with the engine on a GPU (greedy
# answers with logprobs must copy the logits back from the device)
our $engine = Hypic::Engine->start(
    args => ['--model', $MODEL, '--node', 'l-node', '--slots', 8,
             '--batch', 4,
             $ENV{HYPIC_TEST_DEVICE} ? ('--device', $ENV{HYPIC_TEST_DEVICE})
                                     : ()]);

add_vars(ENGINE => 'hypic_engine tiny unix:' . $engine->socket
                   . ' model=tiny-1;');

# the tiny model's greedy answer to it is ASCII (bytes spell the text)
our $PROMPT = 'the cat sat on the mat. the cat sat on the mat.';

sub body {
    my (%f) = @_;
    return JSON::PP->new->canonical->encode({ max_tokens => 12, %f });
}

sub chat {
    my (%f) = @_;
    return "POST /v1/chat/completions\n"
           . body(messages => [{ role => 'user', content => $PROMPT }], %f);
}

sub cmpl {
    my (%f) = @_;
    return "POST /v1/completions\n" . body(prompt => $PROMPT, %f);
}

sub bytes_of { my $s = shift; utf8::encode($s); $s }

# the checks every chat content entry passes; $greedy: the token is the
# likeliest
sub check_entries {
    my ($entries, $k, $greedy, $what) = @_;
    my ($bad, $why) = (0, '');
    for my $e (@$entries) {
        my $top = $e->{top_logprobs} || [];
        my @lp = map { $_->{logprob} } @$top;
        my $mass = sum(0, map { exp $_ } @lp);
        my $sorted = !grep { $lp[$_] > $lp[$_ - 1] } 1 .. $#lp;
        my $b = join ',', @{ $e->{bytes} };
        my ($same) = grep { join(',', @{ $_->{bytes} || [] }) eq $b } @$top;
        my $spelled = pack('C*', @{ $e->{bytes} }) eq bytes_of($e->{token})
                      || $e->{token} =~ /\x{fffd}/;
        my @fail = (
            $e->{logprob} <= 0 ? () : 'logprob > 0',
            @$top == $k ? () : scalar(@$top) . " alternatives, not $k",
            $sorted ? () : 'alternatives not sorted',
            $mass <= 1 + 1e-5 ? () : "probabilities sum to $mass",
            $spelled ? () : 'bytes do not spell the token',
            !$same || abs($same->{logprob} - $e->{logprob}) < 1e-6
                ? () : 'its logprob differs among the alternatives',
            !$greedy || !@$top || join(',', @{ $top->[0]{bytes} }) eq $b
                ? () : 'greedy, but not the likeliest',
            !grep({ !defined $_->{bytes} } @$top)
                ? () : 'an alternative without bytes');
        if (@fail) {
            $bad++;
            $why ||= "'$e->{token}': @fail";
        }
    }
    ok(@$entries && !$bad, "$what: " . scalar(@$entries)
       . " entries, each well formed" . ($why ? " ($why)" : ''));
}

run_tests();

__DATA__

=== TEST 1: chat logprobs, not streamed: the tokens spell the text
--- http_config
    @ENGINE@
--- config
    location /v1/ { hypic_pass tiny; hypic_mode full; }
--- request eval
[main::chat(temperature => 0, logprobs => JSON::PP::true(),
            top_logprobs => 5, ignore_eos => JSON::PP::true()),
 main::chat(temperature => 0, logprobs => JSON::PP::true(),
            ignore_eos => JSON::PP::true()),
 main::chat(temperature => 0, ignore_eos => JSON::PP::true()),
 main::chat(temperature => 0.9, seed => 7, logprobs => JSON::PP::true(),
            top_logprobs => 20, ignore_eos => JSON::PP::true())]
--- error_code: 200
--- response_check
my ($r) = @_;
my $j = json_of($r->[0]);
my $c = $j->{choices}[0];
my $content = $c->{logprobs}{content} || [];
is(scalar @$content, $j->{usage}{completion_tokens},
   'an entry per generated token');
main::check_entries($content, 5, 1, 'greedy, top_logprobs 5');
is(join('', map { pack 'C*', @{ $_->{bytes} } } @$content),
   main::bytes_of($c->{message}{content}), 'their bytes spell the answer');
ok(exists $c->{logprobs}{refusal}, 'and "refusal" is there (null)');
my $c1 = json_of($r->[1])->{choices}[0];
main::check_entries($c1->{logprobs}{content} || [], 0, 1,
                    'logprobs without top_logprobs');
is_deeply([map { $_->{logprob} } @{ $c1->{logprobs}{content} }],
          [map { $_->{logprob} } @$content],
          'the same tokens get the same log-probabilities');
is(json_of($r->[2])->{choices}[0]{logprobs}, undef,
   'not asked for: "logprobs": null');
main::check_entries(json_of($r->[3])->{choices}[0]{logprobs}{content} || [],
                    20, 0, 'sampled at temperature 0.9, top_logprobs 20');
--- no_error_log
[error]



=== TEST 2: chat logprobs streamed: the same entries, chunk by chunk
--- http_config
    @ENGINE@
--- config
    location /v1/ { hypic_pass tiny; hypic_mode full; }
--- request eval
[main::chat(temperature => 0, logprobs => JSON::PP::true(),
            top_logprobs => 3, ignore_eos => JSON::PP::true()),
 main::chat(temperature => 0, logprobs => JSON::PP::true(),
            top_logprobs => 3, ignore_eos => JSON::PP::true(),
            stream => JSON::PP::true())]
--- error_code: 200
--- response_check
my ($r) = @_;
my $want = json_of($r->[0])->{choices}[0]{logprobs}{content};
my @ev = grep { ref $_ } sse_events($r->[1]{body});
my @got = map { @{ $_->{choices}[0]{logprobs}{content} || [] } }
          grep { $_->{choices}[0] && $_->{choices}[0]{logprobs} } @ev;
is_deeply(\@got, $want, 'the streamed entries are the answer\'s entries');
my $text = join '', map { $_->{choices}[0]{delta}{content} // '' } @ev;
is($text, json_of($r->[0])->{choices}[0]{message}{content},
   'and the text is the same');
--- no_error_log
[error]



=== TEST 3: completions logprobs, streamed and not
--- http_config
    @ENGINE@
--- config
    location /v1/ { hypic_pass tiny; hypic_mode full; }
--- request eval
[main::cmpl(temperature => 0, logprobs => 2, ignore_eos => JSON::PP::true()),
 main::cmpl(temperature => 0, logprobs => 2, ignore_eos => JSON::PP::true(),
            stream => JSON::PP::true()),
 main::cmpl(temperature => 0, logprobs => 0, ignore_eos => JSON::PP::true())]
--- error_code: 200
--- response_check
my ($r) = @_;
my $c = json_of($r->[0])->{choices}[0];
my $lp = $c->{logprobs};
my $n = json_of($r->[0])->{usage}{completion_tokens};
is(scalar @{ $lp->{$_} || [] }, $n, "$_: one per token")
    for qw(tokens token_logprobs top_logprobs text_offset);
is(join('', @{ $lp->{tokens} }), $c->{text}, 'the tokens spell the text');
my ($off, @want) = (0);
for my $t (@{ $lp->{tokens} }) {
    push @want, $off;
    $off += length $t;
}
is_deeply($lp->{text_offset}, \@want,
          'text_offset: characters of the text before each token');
ok(!grep({ $_ > 0 } @{ $lp->{token_logprobs} }), 'every logprob <= 0');
my $ok = 1;
for my $i (0 .. $n - 1) {
    my $d = $lp->{top_logprobs}[$i];
    my @keys = keys %$d;
    $ok = 0 unless @keys >= 2 && @keys <= 3
        && exists $d->{ $lp->{tokens}[$i] }
        && abs($d->{ $lp->{tokens}[$i] } - $lp->{token_logprobs}[$i]) < 1e-6;
}
ok($ok, 'top_logprobs: the 2 likeliest and the token itself');
my @ev = grep { ref $_ } sse_events($r->[1]{body});
my %s = map { my $k = $_;
              ($k => [map { @{ $_->{choices}[0]{logprobs}{$k} || [] } }
                      grep { $_->{choices}[0] && $_->{choices}[0]{logprobs} }
                      @ev]) } qw(tokens token_logprobs text_offset);
is_deeply(\%s, { map { ($_ => $lp->{$_}) }
                 qw(tokens token_logprobs text_offset) },
          'streamed, the same arrays');
my $z = json_of($r->[2])->{choices}[0]{logprobs};
ok(!grep({ keys %$_ != 1 } @{ $z->{top_logprobs} })
   && @{ $z->{tokens} } == $n,
   'logprobs 0: the token\'s own log-probability only');
--- no_error_log
[error]



=== TEST 4: n choices share the prompt; a seed reproduces them
--- http_config
    @ENGINE@
--- config
    location /v1/ { hypic_pass tiny; hypic_mode full; }
--- request eval
[main::chat(n => 3, temperature => 1, seed => 42, max_tokens => 16),
 main::chat(n => 3, temperature => 1, seed => 42, max_tokens => 16),
 main::chat(temperature => 1, seed => 42, max_tokens => 16),
 main::cmpl(n => 2, temperature => 1, seed => 5, logprobs => 1),
 main::chat(n => 2, temperature => 0, max_tokens => 8)]
--- error_code: 200
--- response_check
my ($r) = @_;
my $j = json_of($r->[0]);
my @c = @{ $j->{choices} || [] };
is(scalar @c, 3, 'n 3: three choices');
is_deeply([map { $_->{index} } @c], [0, 1, 2], 'indexed 0, 1, 2');
my @t = map { $_->{message}{content} } @c;
ok($t[0] ne $t[1] || $t[1] ne $t[2], 'they differ (seeded per choice)');
is_deeply([map { $_->{message}{content} } @{ json_of($r->[1])->{choices} }],
          \@t, 'the same seed gives the same three');
is($t[0], json_of($r->[2])->{choices}[0]{message}{content},
   'choice 0 is the answer of n 1 with that seed');
is(json_of($r->[0])->{usage}{prompt_tokens},
   json_of($r->[2])->{usage}{prompt_tokens},
   'the prompt counts once');
ok($j->{usage}{completion_tokens} >= 3,
   "completion_tokens sums the choices ($j->{usage}{completion_tokens})");
my @k = @{ json_of($r->[3])->{choices} || [] };
ok(@k == 2 && !grep({ join('', @{ $_->{logprobs}{tokens} }) ne $_->{text} }
                    @k),
   'completions n 2 with logprobs: each choice\'s tokens spell its text');
my @g = @{ json_of($r->[4])->{choices} || [] };
ok(@g == 2 && $g[0]{message}{content} eq $g[1]{message}{content},
   'greedy n 2: the same answer twice');
--- no_error_log
[error]



=== TEST 5: n choices streamed: interleaved, each ends, usage at the end
--- http_config
    @ENGINE@
--- config
    location /v1/ { hypic_pass tiny; hypic_mode full; }
--- request eval
[main::chat(n => 2, temperature => 1, seed => 9, max_tokens => 10,
            logprobs => JSON::PP::true(), top_logprobs => 2),
 main::chat(n => 2, temperature => 1, seed => 9, max_tokens => 10,
            logprobs => JSON::PP::true(), top_logprobs => 2,
            stream => JSON::PP::true(),
            stream_options => { include_usage => JSON::PP::true() })]
--- error_code: 200
--- response_check
my ($r) = @_;
my $j = json_of($r->[0]);
my @ev = grep { ref $_ } sse_events($r->[1]{body});
my (%text, %fin, %roles, %lp);
for my $e (@ev) {
    for my $c (@{ $e->{choices} || [] }) {
        my $i = $c->{index};
        $text{$i} .= $c->{delta}{content} // '';
        $roles{$i}++ if $c->{delta}{role};
        $fin{$i} = $c->{finish_reason} if $c->{finish_reason};
        push @{ $lp{$i} }, @{ $c->{logprobs}{content} }
            if $c->{logprobs};
    }
}
is_deeply([sort keys %text], [0, 1], 'chunks of choices 0 and 1');
is_deeply(\%roles, { 0 => 1, 1 => 1 }, 'each begins with its role');
is_deeply(\%fin, { map { ($_->{index} => $_->{finish_reason}) }
                   @{ $j->{choices} } },
          'each ends with its finish_reason');
is_deeply(\%text, { map { ($_->{index} => $_->{message}{content}) }
                    @{ $j->{choices} } },
          'each streams the text of the same choice not streamed');
is_deeply(\%lp, { map { ($_->{index} => $_->{logprobs}{content}) }
                  @{ $j->{choices} } },
          'and its log-probabilities');
my $last = $ev[-1];
ok($last->{usage} && !@{ $last->{choices} }
   && $last->{usage}{completion_tokens} == $j->{usage}{completion_tokens},
   'the last chunk: usage of both choices, no choices');
--- no_error_log
[error]



=== TEST 6: max_completion_tokens wins; stop strings leave their tokens out; nothing generated
--- http_config
    @ENGINE@
--- config
    location /v1/ { hypic_pass tiny; hypic_mode full; }
--- request eval
[main::chat(max_completion_tokens => 3, max_tokens => 9,
            ignore_eos => JSON::PP::true()),
 main::cmpl(temperature => 0, max_tokens => 24, logprobs => 1,
            ignore_eos => JSON::PP::true()),
 main::chat(max_tokens => 0, n => 2, logprobs => JSON::PP::true()),
 main::cmpl(max_tokens => 0, logprobs => 3)]
--- error_code: 200
--- response_check
my ($r) = @_;
is(json_of($r->[0])->{usage}{completion_tokens}, 3,
   'max_completion_tokens 3 over max_tokens 9');
is_deeply([map { [$_->{index}, $_->{logprobs}{content},
                  $_->{finish_reason}] } @{ json_of($r->[2])->{choices} }],
          [[0, [], 'length'], [1, [], 'length']],
          'nothing generated: empty content in each choice');
is_deeply(json_of($r->[3])->{choices}[0]{logprobs},
          { tokens => [], token_logprobs => [], top_logprobs => [],
            text_offset => [] }, 'and empty arrays for completions');
# a stop string of two tokens from the middle of the greedy answer
my $full = json_of($r->[1])->{choices}[0]{logprobs}{tokens};
my $i = int(@$full / 2);
$i++ while $i < $#$full - 1 && length($full->[$i] . $full->[$i + 1]) < 2;
my $stop = $full->[$i] . $full->[$i + 1];
my $req = main::cmpl(temperature => 0, max_tokens => 24, logprobs => 1,
                     ignore_eos => JSON::PP::true(), stop => [$stop]);
my $s = json_of(http_request($_[2], $req));
my $c = $s->{choices}[0];
my $joined = join '', @{ $c->{logprobs}{tokens} };
is($c->{finish_reason}, 'stop', "the stop string '$stop' (two tokens) ends it");
ok(index($joined, $c->{text}) == 0
   && length($joined) < length($c->{text}) + length($stop),
   "the tokens spell the text, none of the stop string's past it "
   . "('$c->{text}' from '$joined')");
--- no_error_log
[error]



=== TEST 7: invalid combinations are a 400 naming the field
--- http_config
    @ENGINE@
--- config
    location /v1/ { hypic_pass tiny; }
--- request eval
[main::chat(top_logprobs => 2),
 main::chat(logprobs => JSON::PP::false(), top_logprobs => 2),
 main::chat(logprobs => JSON::PP::true(), top_logprobs => 21),
 main::chat(logprobs => 3),
 main::cmpl(logprobs => 21),
 main::cmpl(logprobs => JSON::PP::true()),
 main::chat(n => 0),
 main::chat(n => 17),
 main::cmpl(n => 1.5),
 main::chat(stream_options => { include_usage => JSON::PP::true() }),
 main::chat(n => 5)]
--- error_code: 400
--- response_body_json eval
[{ error => { type => 'invalid_request_error', param => 'top_logprobs',
              message => qr/needs 'logprobs' set to true/ } },
 { error => { param => 'top_logprobs' } },
 { error => { param => 'top_logprobs',
              message => qr/integer from 0 to 20/ } },
 { error => { param => 'logprobs', message => qr/must be a boolean/ } },
 { error => { param => 'logprobs', message => qr/integer from 0 to 20/ } },
 { error => { param => 'logprobs' } },
 { error => { param => 'n', message => qr/integer from 1 to 16/ } },
 { error => { param => 'n' } },
 { error => { param => 'n' } },
 { error => { param => 'stream_options',
              message => qr/only allowed with 'stream' true/ } },
 { error => { type => 'invalid_request_error',
              message => qr/'n' is 5, more choices than the 4/ } }]
--- no_error_log
[error]
