# The official OpenAI Python client against nginx and a real engine
# (models/test/qwen35-dense): models.list, a chat completion streamed and
# not, whose texts must be equal (greedy), a streamed legacy completion,
# usage with cached tokens, chat and legacy logprobs (the client's types;
# each <= 0, alternatives sorted, summing to at most 1), n=3, and errors
# the client raises as the right
# exception, with their code, also those nginx itself answers (through
# the shipped error pages). The client is installed with pip when
# missing; the suite is skipped when that is not possible.

use strict;
use warnings;
use lib 't/lib';

use JSON::PP ();
use Hypic::Nginx;
use Hypic::Engine;
use Hypic::Util qw(private_dir python_module);

our $MODEL = "$Hypic::Nginx::REPO/models/test/qwen35-dense";
our $PYTHON = $ENV{HYPIC_PYTHON} // 'python3';

my $why = Hypic::Engine->why_not || (-d $MODEL ? '' : "no $MODEL")
          || openai_client();
plan(skip_all => $why) if $why;

our $engine = Hypic::Engine->start(
    args => ['--model', $MODEL, '--node', 't-node', '--slots', 4]);

add_vars(ENGINE => 'hypic_engine tiny unix:' . $engine->socket
                   . ' model=tiny-1;');

sub openai_client { python_module('openai', $PYTHON) }

our $CLIENT = <<'PY';
import json, math, sys
import openai

base, model = sys.argv[1], sys.argv[2]
client = openai.OpenAI(base_url=base, api_key="dummy", max_retries=0,
                       timeout=60)
out = {"models": [m.id for m in client.models.list()]}

sep = "<|pic_sep|>"
doc = ("The old harbour of Vell has three piers. Fishing boats use the "
       "north pier, ferries the middle one, and the south pier belongs "
       "to the yacht club, whose members paint their boats blue.")
msgs = [{"role": "system", "content": "Answer in one short sentence."},
        {"role": "user",
         "content": sep + doc + sep + "Which pier do the ferries use?"}]

full = client.chat.completions.create(model=model, messages=msgs,
                                      max_tokens=24, temperature=0)
out["text"] = full.choices[0].message.content
out["finish"] = full.choices[0].finish_reason
out["object"] = full.object

parts, n, finish, usage = [], 0, None, None
stream = client.chat.completions.create(
    model=model, messages=msgs, max_tokens=24, temperature=0, stream=True,
    stream_options={"include_usage": True})
for chunk in stream:
    n += 1
    if chunk.usage is not None:
        usage = chunk.usage
    for c in chunk.choices:
        if c.delta is not None and c.delta.content:
            parts.append(c.delta.content)
        if c.finish_reason:
            finish = c.finish_reason
out["stream_text"] = "".join(parts)
out["stream_chunks"] = n
out["stream_finish"] = finish
out["usage"] = {"prompt": usage.prompt_tokens,
                "completion": usage.completion_tokens,
                "cached": usage.prompt_tokens_details.cached_tokens}

legacy = client.completions.create(model=model, prompt="Once upon a time",
                                   max_tokens=12, temperature=0)
pieces = client.completions.create(model=model, prompt="Once upon a time",
                                   max_tokens=12, temperature=0,
                                   stream=True)
out["legacy_text"] = legacy.choices[0].text
out["legacy_stream_text"] = "".join(p.choices[0].text for p in pieces
                                    if p.choices)

# log-probabilities as the client types them, and n choices
lp = client.chat.completions.create(model=model, messages=msgs,
                                    max_tokens=12, temperature=0.8, seed=3,
                                    logprobs=True, top_logprobs=5)
checks = []
for e in lp.choices[0].logprobs.content:
    tops = [t.logprob for t in e.top_logprobs]
    same = [t.logprob for t in e.top_logprobs if t.bytes == e.bytes]
    checks.append({
        "le0": e.logprob <= 0,
        "five": len(tops) == 5,
        "sorted": tops == sorted(tops, reverse=True),
        "mass": sum(math.exp(t) for t in tops) <= 1 + 1e-6,
        "same": all(abs(x - e.logprob) < 1e-6 for x in same),
        "bytes": isinstance(e.bytes, list)})
out["logprobs"] = {"n": len(checks),
                   "tokens": lp.usage.completion_tokens,
                   "bad": [c for c in checks if not all(c.values())]}
three = client.chat.completions.create(model=model, messages=msgs,
                                       max_tokens=8, temperature=1, seed=11,
                                       n=3)
out["n3"] = sorted(c.index for c in three.choices)
legacy_lp = client.completions.create(model=model, prompt="Once upon a time",
                                      max_tokens=6, temperature=0,
                                      logprobs=2)
ll = legacy_lp.choices[0].logprobs
out["legacy_lp"] = {"tokens": len(ll.tokens) == legacy_lp.usage.completion_tokens,
                    "text": "".join(ll.tokens) == legacy_lp.choices[0].text,
                    "offsets": ll.text_offset[0] if ll.text_offset else -1,
                    "le0": all(x <= 0 for x in ll.token_logprobs)}
out["legacy_lp"] = {k: int(v) for k, v in out["legacy_lp"].items()}

try:
    client.chat.completions.create(model=model, messages=[],
                                   max_tokens=4)
    out["error"] = "none"
except openai.BadRequestError as e:
    out["error"] = {"status": e.status_code, "param": e.param,
                    "type": e.type}

try:
    client.chat.completions.create(model="no-such-model", messages=msgs,
                                   max_tokens=4)
    out["missing"] = "none"
except openai.NotFoundError as e:
    out["missing"] = {"status": e.status_code, "code": e.code}

# what nginx itself refuses, answered by the shipped error pages: the
# client finds the code in the body, as for the module's own errors
def refused(**opts):
    other = openai.OpenAI(api_key="dummy", max_retries=0, timeout=60,
                          **opts)
    try:
        other.models.list()
        return "none"
    except openai.APIStatusError as e:
        return {"status": e.status_code, "code": e.code, "type": e.type,
                "class": type(e).__name__}

out["elsewhere"] = refused(base_url=base.replace("/v1", "/nowhere/v1"))
out["long_uri"] = refused(base_url=base + "/" + "a" * 20000)
out["big_header"] = refused(base_url=base,
                            default_headers={"X-Big": "b" * 10000})

print(json.dumps(out))
PY

run_tests();

__DATA__

=== TEST 1: the OpenAI client streams a chat completion whose text equals the non-streamed one
--- http_config
    @ENGINE@
--- config
    @ERROR_PAGES@
    log_not_found off;
    location /v1/ { hypic_pass tiny; }
--- response_check
my ($res, $block, $srv) = @_;
my $dir = private_dir('openai');
open my $fh, '>', "$dir/client.py" or die "$dir: $!";
print $fh $main::CLIENT;
close $fh;
my $out = `timeout 120 $main::PYTHON $dir/client.py http://127.0.0.1:$srv->{port}/v1 tiny-1 2>&1`;
is($?, 0, 'the client ran') or diag($out);
my $r = eval { JSON::PP->new->decode((split /\n/, $out)[-1]) } || {};
is_deeply($r->{models}, ['tiny-1'], 'models.list');
is($r->{object}, 'chat.completion', 'a chat completion');
ok(length($r->{text} // ''), 'with text') or diag($out);
is($r->{stream_text}, $r->{text},
   'streamed, the same text (concatenated deltas)');
cmp_ok($r->{stream_chunks}, '>', 2, 'in several chunks');
is($r->{stream_finish}, $r->{finish}, 'the same finish reason');
is($r->{usage}{completion}, 24, 'usage of the stream')
    if $r->{finish} && $r->{finish} eq 'length';
cmp_ok($r->{usage}{cached} // 0, '>', 0,
       'the document was reused by the second request (cached_tokens)');
is($r->{legacy_stream_text}, $r->{legacy_text},
   'a legacy completion, streamed and not');
ok($r->{logprobs}{n} && $r->{logprobs}{n} == $r->{logprobs}{tokens}
   && !@{ $r->{logprobs}{bad} },
   "chat logprobs: $r->{logprobs}{n} entries, each <= 0, 5 alternatives "
   . 'sorted, summing to at most 1, the token\'s own where it is among '
   . 'them') or diag(JSON::PP->new->encode($r->{logprobs}));
is_deeply($r->{n3}, [0, 1, 2], 'n=3: three choices');
is_deeply($r->{legacy_lp}, { tokens => 1, text => 1, offsets => 0,
                             le0 => 1 },
          'legacy completion logprobs: a token each, spelling the text, '
          . 'offsets from 0, logprobs <= 0');
is_deeply($r->{error}, { status => 400, param => 'messages',
                         type => 'invalid_request_error' },
          'a bad request raises BadRequestError');
is_deeply($r->{missing}, { status => 404, code => 'model_not_found' },
          'an unknown model raises NotFoundError');
is_deeply($r->{elsewhere},
          { status => 404, code => 'unknown_url', class => 'NotFoundError',
            type => 'invalid_request_error' },
          'a URL nginx has nothing for: NotFoundError with its code');
is_deeply($r->{long_uri},
          { status => 414, code => 'uri_too_long', class => 'APIStatusError',
            type => 'invalid_request_error' },
          'a 20 KB URI: 414 with its code');
is_deeply($r->{big_header},
          { status => 400, code => 'request_header_too_large',
            class => 'BadRequestError', type => 'invalid_request_error' },
          'a 10 KB header: BadRequestError with its code');
--- timeout: 60
--- no_error_log
[error]
