# Per-request decode options through real nginx and a real engine
# (models/test/qwen35-dense): the extension object "hypic": {"decode":
# recurrent|chunkwise|auto, "speculative": bool, "max_draft": 1..16}
# reaches the scheduler (X-Hypic-Decode names the form that ran, usage.
# completion_tokens_details counts accepted and rejected drafts), every
# form and speculation give the CLI's greedy text, also batched together,
# the server's defaults apply when a request does not say, and bad values
# are refused with a 400 naming the field.

use strict;
use warnings;
use lib 't/lib';

use JSON::PP ();
use Hypic::Nginx;
use Hypic::Engine;

Hypic::Engine::Client->import(qw(concurrently sse_events));

our $MODEL = "$Hypic::Nginx::REPO/models/test/qwen35-dense";

my $why = Hypic::Engine->why_not || (-d $MODEL ? '' : "no $MODEL");
plan(skip_all => $why) if $why;

# the server default: auto, no speculation
our $engine = Hypic::Engine->start(
    args => ['--model', $MODEL, '--node', 'd-node', '--slots', 8,
             '--batch', 4]);
# speculation on unless a request says, over recurrent decoding
our $spec_engine = Hypic::Engine->start(
    args => ['--model', $MODEL, '--node', 's-node', '--slots', 8,
             '--batch', 4, '--decode', 'recurrent', '--speculative', 1,
             '--max-draft', 4]);

add_vars(ENGINE => 'hypic_engine tiny unix:' . $engine->socket
                   . ' model=tiny-1;',
         SPEC_ENGINE => 'hypic_engine spec unix:' . $spec_engine->socket
                        . ' model=tiny-1;');

# repetitive, so prompt lookup finds drafts the model accepts
our $PROMPT = 'the cat sat on the mat. the cat sat on the mat. the cat sat '
              . 'on the';
our $SHORT = 'the cat sat on the mat.';
our $MAX = 24;

sub body {
    my (%f) = @_;
    return JSON::PP->new->canonical->encode(
        { prompt => $PROMPT, max_tokens => $MAX, temperature => 0, %f });
}

# the answer's JSON, and its text as UTF-8 bytes (as the CLI prints it)
sub answer {
    my ($r) = @_;
    my $j = eval { JSON::PP->new->utf8->decode($r->{body}) } || {};
    my $t = $j->{choices}[0]{text} // '';
    utf8::encode($t);
    return ($j, $t);
}

sub json_of { (answer($_[0]))[0] }
sub text_of { (answer($_[0]))[1] }

sub header {
    my ($r, $name) = @_;
    return join(', ', @{ $r->{headers}{lc $name} || [] });
}

sub accepted {
    my $d = json_of($_[0])->{usage}{completion_tokens_details};
    return $d ? $d->{accepted_prediction_tokens} : undef;
}

our %CLI;

# the reference: the CLI's recurrent greedy answer
sub cli {
    my ($prompt) = @_;
    $prompt //= $PROMPT;
    $CLI{$prompt} //= Hypic::Engine->generate(
        model => $MODEL, prompt => $prompt, max_tokens => $MAX,
        args => ['--decode', 'recurrent']);
    return $CLI{$prompt};
}

run_tests();

__DATA__

=== TEST 1: every form and speculation, batched together, give the CLI's text
--- http_config
    @ENGINE@
--- config
    location /v1/ { hypic_pass tiny; hypic_mode full; }
--- request
GET /v1/models
--- error_code: 200
--- response_check
my ($r, $block, $srv) = @_;
# auto: KV-only for a prompt within the buffer's KV-only limit (16 tokens
# on this model: SHORT is), chunkwise above it (PROMPT, 28 tokens)
my @opts = (undef, { decode => 'recurrent' }, { decode => 'chunkwise' },
            { decode => 'auto' }, { speculative => JSON::PP::true(),
                                    max_draft => 4 },
            { speculative => JSON::PP::true(), decode => 'chunkwise' },
            undef, { speculative => JSON::PP::true() });
my @forms = ('chunkwise', 'recurrent', 'chunkwise', 'chunkwise',
             'chunkwise', 'chunkwise', 'kv-only', 'kv-only');
my @prompts = (($main::PROMPT) x 6, ($main::SHORT) x 2);
my @reqs = map {
    "POST /v1/completions\n"
    . main::body(prompt => $prompts[$_],
                 defined $opts[$_] ? (hypic => $opts[$_]) : ())
} 0 .. $#opts;
my @res = concurrently($srv->{port}, @reqs);
for my $i (0 .. $#res) {
    is($res[$i]{status}, 200, "request $i answered");
    is(main::header($res[$i], 'X-Hypic-Decode'), $forms[$i],
       "request $i decoded $forms[$i]");
    is(main::text_of($res[$i]), main::cli($prompts[$i]),
       "request $i gives the CLI's greedy text");
}
ok(!defined main::accepted($res[$_]),
   "request $_ did not speculate: no completion_tokens_details")
    for 0 .. 3;
for my $i (4, 5) {
    my $u = main::json_of($res[$i])->{usage};
    my $acc = main::accepted($res[$i]) // -1;
    ok($acc > 0 && $acc <= $u->{completion_tokens},
       "request $i speculated: $acc of $u->{completion_tokens} tokens were "
       . 'accepted drafts ('
       . $u->{completion_tokens_details}{rejected_prediction_tokens}
       . ' rejected)');
}
--- no_error_log
[error]



=== TEST 2: a streamed speculative answer: same text, drafts in its usage
--- http_config
    @ENGINE@
--- config
    location /v1/ { hypic_pass tiny; hypic_mode full; }
--- request eval
"POST /v1/completions\n" . main::body(
    stream => JSON::PP::true(),
    stream_options => { include_usage => JSON::PP::true() },
    hypic => { speculative => JSON::PP::true(), decode => 'chunkwise' })
--- error_code: 200
--- response_headers
X-Hypic-Decode: chunkwise
--- response_check
my ($r) = @_;
my @ev = sse_events($r->[0]{body});
my $text = join '', map { ref $_ && $_->{choices}[0] ? $_->{choices}[0]{text} // ''
                                                     : '' } @ev;
utf8::encode($text);
is($text, main::cli(), 'the streamed text is the greedy text');
my ($usage) = map { $_->{usage} } grep { ref $_ && $_->{usage} } @ev;
ok($usage && $usage->{completion_tokens_details}
   && $usage->{completion_tokens_details}{accepted_prediction_tokens} > 0,
   'the usage chunk counts the accepted drafts');
--- no_error_log
[error]



=== TEST 3: the server's defaults apply unless a request says otherwise
--- http_config
    @SPEC_ENGINE@
--- config
    location /v1/ { hypic_pass spec; hypic_mode full; }
--- request eval
["POST /v1/completions\n" . main::body(),
 "POST /v1/completions\n" . main::body(hypic => {
     speculative => JSON::PP::false() }),
 "POST /v1/completions\n" . main::body(hypic => { max_draft => 1 }),
 "POST /v1/chat/completions\n" . JSON::PP->new->canonical->encode({
     messages => [{ role => 'user', content => $main::PROMPT }],
     max_tokens => 8, temperature => 0,
     hypic => { decode => 'auto' } })]
--- error_code: 200
--- response_headers eval
[{ 'X-Hypic-Decode' => 'chunkwise' }, { 'X-Hypic-Decode' => 'recurrent' },
 { 'X-Hypic-Decode' => 'chunkwise' }, undef]
--- response_check
my ($r) = @_;
is(main::text_of($r->[$_]), main::cli(), "request $_: the greedy text")
    for 0 .. 2;
ok((main::accepted($r->[0]) // 0) > 0,
   'speculative by default (--speculative 1): drafts accepted ('
   . (main::accepted($r->[0]) // 'none') . ')');
ok(!defined main::accepted($r->[1]), '"speculative": false turns it off');
my $d = main::json_of($r->[2])->{usage}{completion_tokens_details} || {};
my $passes = ($d->{accepted_prediction_tokens} // 0)
             + ($d->{rejected_prediction_tokens} // 0);
ok(defined $d->{accepted_prediction_tokens}
   && $passes <= main::json_of($r->[2])->{usage}{completion_tokens},
   "max_draft 1: at most one draft per pass ($passes drafted)");
ok(length(main::json_of($r->[3])->{choices}[0]{message}{content} // '') > 0,
   'chat takes the options too');
--- no_error_log
[error]



=== TEST 4: bad values are refused with a 400 that names the field
--- http_config
    @ENGINE@
--- config
    location /v1/ { hypic_pass tiny; }
--- request eval
[map { "POST /v1/completions\n" . main::body(hypic => $_) }
     3, { decode => 'fast' }, { speculative => 'yes' }, { max_draft => 0 },
     { max_draft => 17 }, { max_draft => 2.5 },
     { speculative => JSON::PP::true(), decode => 'recurrent' },
     { draft => 4 }]
--- error_code: 400
--- response_body_json eval
[{ error => { type => 'invalid_request_error', param => 'hypic',
              message => qr/'hypic' must be an object/ } },
 { error => { param => 'hypic.decode',
              message => qr/must be "recurrent", "chunkwise" or "auto"/ } },
 { error => { param => 'hypic.speculative',
              message => qr/must be a boolean/ } },
 { error => { param => 'hypic.max_draft',
              message => qr/an integer from 1 to 16/ } },
 { error => { param => 'hypic.max_draft',
              message => qr/an integer from 1 to 16/ } },
 { error => { param => 'hypic.max_draft',
              message => qr/an integer from 1 to 16/ } },
 { error => { param => 'hypic.speculative',
              message => qr/needs 'hypic.decode' chunkwise or auto/ } },
 { error => { param => 'hypic',
              message => qr/'hypic.draft' is not an option/ } }]
--- no_error_log
[error]
