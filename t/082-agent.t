# An agent framework from PyPI (pydantic-ai, its OpenAI chat-completions
# model) drives a tool loop against real nginx and a real engine
# (models/test/qwen35-tools, whose greedy answer to a fresh turn is a call
# of get_weather and one of get_time): the framework sends its tools, the
# model calls them, the framework validates the arguments against the
# functions' signatures, runs the Python functions and sends their
# results back as role "tool" messages; the loop ends with the model's
# text. The tools are offered once (pydantic-ai's per-step `prepare`), so
# the second turn has none and what the model writes is its answer. The
# same loop runs again streamed (delta.tool_calls chunks). The HTTP
# bodies the framework sent are checked, not only its own account.
# pydantic-ai-slim[openai] is installed with pip when missing; the suite
# is skipped when that is not possible.

use strict;
use warnings;
use lib 't/lib';

use JSON::PP ();
use Hypic::Nginx;
use Hypic::Engine;
use Hypic::Util qw(python_module run_python);

our $PYTHON = $ENV{HYPIC_PYTHON} // 'python3';

our $engine = Hypic::Engine->start_suite(
    model => "$Hypic::Nginx::REPO/models/test/qwen35-tools", name => 'tools',
    args => ['--node', 't-node', '--slots', 4],
    need => sub { python_module('pydantic_ai', $PYTHON,
                                'pydantic-ai-slim[openai]') });

our $AGENT = <<'PY';
import asyncio, json, sys
import httpx2 as httpx
from pydantic_ai import Agent, RunContext
from pydantic_ai.models.openai import OpenAIChatModel
from pydantic_ai.providers.openai import OpenAIProvider

base, model_id = sys.argv[1], sys.argv[2]
sent, calls = [], []


async def record(request):
    sent.append(json.loads(request.content))


http = httpx.AsyncClient(event_hooks={"request": [record]}, timeout=60)
model = OpenAIChatModel(model_id, provider=OpenAIProvider(
    base_url=base, api_key="dummy", http_client=http))


async def once(ctx: RunContext, tool_def):
    # offered on the first step only: the next turn answers
    return tool_def if ctx.run_step <= 1 else None

agent = Agent(model, instructions="Answer with the tools' help.",
              model_settings={"max_tokens": 8, "temperature": 0,
                              "extra_body": {"chat_template_kwargs":
                                             {"enable_thinking": False}}})


@agent.tool_plain(prepare=once)
def get_weather(city: str, days: int) -> str:
    """Weather in a city for some days."""
    calls.append(["get_weather", {"city": city, "days": days}])
    return f"sunny in {city} for {days} days"


@agent.tool_plain(prepare=once)
def get_time(zone: str) -> str:
    """The time in a zone."""
    calls.append(["get_time", {"zone": zone}])
    return "12:00 " + zone



async def main():
    global calls, sent
    result = await agent.run("Weather in Paris?")
    out = {"output": result.output, "calls": calls, "sent": sent}

    # the same loop streamed: the calls come as delta.tool_calls chunks
    calls, sent = [], []
    async with agent.run_stream("Weather in Paris?") as run:
        text = "".join([t async for t in run.stream_text(delta=True)])
    out["stream"] = {"output": text, "calls": calls, "sent": sent}
    return out

out = asyncio.run(main())
print(json.dumps(out))
PY

run_tests();

__DATA__

=== TEST 1: pydantic-ai runs a tool loop to its answer
--- http_config
    @ENGINE@
--- config
    location /v1/ { hypic_pass tools; }
--- request
GET /v1/models
--- error_code: 200
--- response_check
my ($res, $block, $srv) = @_;
my ($rc, $out, $r) = run_python($main::AGENT, $main::PYTHON, 100,
                                "http://127.0.0.1:$srv->{port}/v1", 'tools-1');
is($rc, 0, 'the agent ran to its end') or diag($out);
my @sent = @{ $r->{sent} || [] };

# the model's calls, in its order; the framework may run them in any
my @model = (['get_weather', { city => 'Paris', days => 3 }],
             ['get_time', { zone => 'CET' }]);
sub ran { [sort { $a->[0] cmp $b->[0] } @{ $_[0] || [] }] }

is_deeply(ran($r->{calls}), ran(\@model),
          'the framework ran both functions, with the arguments it parsed '
          . 'and validated');
is(scalar @sent, 2, 'two requests: the calls, then the answer');
is_deeply([map { $_->{function}{name} } @{ $sent[0]{tools} || [] }],
          ['get_weather', 'get_time'], 'the first carried the tools');

my @m = @{ $sent[1]{messages} || [] };
my ($asked) = grep { $_->{role} eq 'assistant' } @m;
my @ids = map { $_->{id} } @{ $asked->{tool_calls} || [] };
is_deeply([map { [$_->{function}{name},
                  eval { JSON::PP->new->decode($_->{function}{arguments}) }] }
           @{ $asked->{tool_calls} || [] }],
          \@model, 'the second sent the calls back as the model made them');
is_deeply({ map { ($_->{tool_call_id} // '', $_->{content}) }
            grep { $_->{role} eq 'tool' } @m },
          { ($ids[0] // 'a') => 'sunny in Paris for 3 days',
            ($ids[1] // 'b') => '12:00 CET' },
          '... and each function\'s result as a tool message answering its '
          . 'call');
ok(@ids == 2 && $ids[0] ne $ids[1], '... under the ids nginx gave the calls');
ok(!exists $sent[1]{tools}, 'the second offered no tools');
like($r->{output} // '', qr/\S/, 'the loop ended with the model\'s text');

my $st = $r->{stream} || {};
is_deeply(ran($st->{calls}), ran(\@model), 'streamed: the same calls ran');
is_deeply([map { $_->{stream} ? 1 : 0 } @{ $st->{sent} || [] }], [1, 1],
          'streamed: two streamed requests');
is_deeply([map { $_->{role} } @{ $st->{sent}[1]{messages} || [] }],
          [map { $_->{role} } @m], 'streamed: the second with the results');
is($st->{output}, $r->{output}, 'streamed: the same answer');
--- timeout: 120
--- no_error_log
[error]
