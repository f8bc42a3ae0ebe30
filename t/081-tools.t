# Tools end to end, real nginx and a real engine on models/test/qwen35-tools
# (tools/gen_toolcall_model.py: the real Qwen3.5 chat template, and
# weights whose greedy answer is a tool call: two XML calls with thinking
# off, one JSON call with thinking on). Checked from Python: the calls in
# message.tool_calls (content null, finish_reason tool_calls) and, streamed,
# in delta.tool_calls chunks; parallel_tool_calls false keeps one; a call
# cut short by a stop string and tool_choice "none" give the text as
# content; a named tool_choice shows the template that tool only; a tool
# spec sent again is a cache hit; the template's own refusal and every
# invalid combination are OpenAI 400s naming the field; and the official
# openai SDK runs a tools round trip (its tool results back to the model).
# With n choices and logprobs: each choice scans its own text for calls
# (streamed deltas under the choice's index, calls numbered per choice)
# and keeps the log-probabilities of all its tokens, calls' included.

use strict;
use warnings;
use lib 't/lib';

use JSON::PP ();
use Hypic::Nginx;
use Hypic::Engine;
use Hypic::Util qw(private_dir python_module);

our $MODEL = "$Hypic::Nginx::REPO/models/test/qwen35-tools";
our $PYTHON = $ENV{HYPIC_PYTHON} // 'python3';

my $why = Hypic::Engine->why_not || (-d $MODEL ? '' : "no $MODEL")
          || python_module('openai', $PYTHON);
plan(skip_all => $why) if $why;

our $engine = Hypic::Engine->start(
    args => ['--model', $MODEL, '--node', 't-node', '--slots', 4]);

add_vars(ENGINE => 'hypic_engine tools unix:' . $engine->socket
                   . ' model=tools-1;');

our $CLIENT = <<'PY';
import json, sys, urllib.request, urllib.error
import openai

base, model = sys.argv[1], sys.argv[2]
SEP = "<|pic_sep|>"
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather in a city",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string"}, "days": {"type": "integer"}},
        "required": ["city"]}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "parameters": {
        "type": "object", "properties": {"zone": {"type": "string"}}}}}
OFF = {"enable_thinking": False}
USER = [{"role": "user", "content": "Weather in Paris?"}]

def post(body, raw=False):
    req = urllib.request.Request(base + "/chat/completions",
                                 data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            text = r.read().decode()
            status = r.status
    except urllib.error.HTTPError as e:
        text, status = e.read().decode(), e.code
    if raw:
        return status, text
    return status, json.loads(text)

def chat(**kw):
    body = {"model": model, "messages": USER, "max_tokens": 8,
            "temperature": 0}
    body.update(kw)
    return post(body)

def stream(**kw):
    body = {"model": model, "messages": USER, "max_tokens": 8,
            "temperature": 0, "stream": True}
    body.update(kw)
    status, text = post(body, raw=True)
    events = [e[6:] for e in text.split("\n\n") if e.startswith("data: ")]
    return status, [json.loads(e) for e in events if e != "[DONE]"], \
        events[-1]

out = {}
s, r = chat(tools=[WEATHER, TIME], chat_template_kwargs=OFF)
out["two"] = {"status": s, "message": r["choices"][0]["message"],
              "finish": r["choices"][0]["finish_reason"],
              "prompt_tokens": r["usage"]["prompt_tokens"]}
s, r = chat(tools=[WEATHER, TIME], chat_template_kwargs=OFF,
            parallel_tool_calls=False)
out["one"] = r["choices"][0]["message"]
s, r = chat(tools=[WEATHER, TIME])
out["json"] = {"message": r["choices"][0]["message"],
               "finish": r["choices"][0]["finish_reason"]}
s, chunks, last = stream(tools=[WEATHER, TIME], chat_template_kwargs=OFF)
out["stream"] = {"status": s, "last": last,
                 "deltas": [c["choices"][0]["delta"] for c in chunks],
                 "finish": [c["choices"][0]["finish_reason"]
                            for c in chunks]}
s, r = chat(tools=[WEATHER, TIME], chat_template_kwargs=OFF,
            stop=["</function>"])
out["cut"] = {"message": r["choices"][0]["message"],
              "finish": r["choices"][0]["finish_reason"]}
s, chunks, last = stream(tools=[WEATHER, TIME], chat_template_kwargs=OFF,
                         stop=["</function>"])
out["cut_stream"] = "".join(c["choices"][0]["delta"].get("content") or ""
                            for c in chunks)
out["cut_stream_calls"] = sum(1 for c in chunks
                              if c["choices"][0]["delta"].get("tool_calls"))
s, r = chat(tools=[WEATHER, TIME], chat_template_kwargs=OFF,
            tool_choice="none")
out["none"] = r["choices"][0]["message"]
s, r = chat(chat_template_kwargs=OFF)
out["no_tools"] = r["choices"][0]["message"]
s, r = chat(tools=[WEATHER, TIME], chat_template_kwargs=OFF,
            tool_choice={"type": "function", "function": {"name": "get_time"}})
out["named"] = {"status": s, "prompt_tokens": r["usage"]["prompt_tokens"]}
s, r = chat(tools=[TIME], chat_template_kwargs=OFF)
out["time_only_tokens"] = r["usage"]["prompt_tokens"]

# n choices and logprobs with tools: each choice its calls and its tokens
def calls_of(m):
    return [[c["function"]["name"], c["function"]["arguments"]]
            for c in m.get("tool_calls") or []]

s, r = chat(tools=[WEATHER, TIME], chat_template_kwargs=OFF, n=2,
            logprobs=True, top_logprobs=2)
out["n2"] = {"status": s,
             "choices": [{"index": c["index"], "content": c["message"].get(
                              "content", "absent"),
                          "calls": calls_of(c["message"]),
                          "ids": [t["id"] for t in
                                  c["message"].get("tool_calls") or []],
                          "finish": c["finish_reason"],
                          "lp": [[e["token"], len(e["top_logprobs"])]
                                 for e in (c["logprobs"] or {}).get(
                                     "content") or []]}
                         for c in r.get("choices", [])],
             "completion_tokens": r.get("usage", {}).get("completion_tokens")}
s, chunks, last = stream(tools=[WEATHER, TIME], chat_template_kwargs=OFF,
                         n=2, logprobs=True, top_logprobs=2)
per = {}
for c in chunks:
    for ch in c["choices"]:
        p = per.setdefault(ch["index"], {"calls": [], "content": "",
                                         "finish": [], "lp": []})
        d = ch.get("delta") or {}
        p["content"] += d.get("content") or ""
        p["calls"] += [[t["index"], t["function"]["name"],
                        t["function"]["arguments"]]
                       for t in d.get("tool_calls") or []]
        if ch.get("finish_reason"):
            p["finish"].append(ch["finish_reason"])
        p["lp"] += [e["token"] for e in
                    (ch.get("logprobs") or {}).get("content") or []]
out["n2_stream"] = {"status": s, "last": last, "choices": per}
# calls cut short in both choices: each scanner holds its own text
s, r = chat(tools=[WEATHER, TIME], chat_template_kwargs=OFF, n=2,
            stop=["</function>"])
out["n2_cut"] = [[c["message"].get("content"), calls_of(c["message"]),
                  c["finish_reason"]] for c in r.get("choices", [])]
s, chunks, last = stream(tools=[WEATHER, TIME], chat_template_kwargs=OFF,
                         n=2, stop=["</function>"])
per = {}
for c in chunks:
    for ch in c["choices"]:
        per[ch["index"]] = per.get(ch["index"], "") + (
            (ch.get("delta") or {}).get("content") or "")
out["n2_cut_stream"] = per

# the tool spec as a cached segment: the same tools again hit the cache
doc = "The harbour has three piers; ferries use the middle one. " * 4
msgs = [{"role": "system", "content": "Use the tools."},
        {"role": "user", "content": SEP + doc + SEP + "Which pier?"}]
hits = []
for tools in ([WEATHER, TIME], [WEATHER, TIME], [TIME, WEATHER]):
    s, r = chat(messages=msgs, tools=tools, chat_template_kwargs=OFF,
                max_tokens=1)
    hits.append(r["usage"]["prompt_tokens_details"]["cached_tokens"])
out["cached"] = hits

# refusals, each naming its field
bad = {
    "required_no_tools": dict(tool_choice="required"),
    "named_missing": dict(tools=[TIME], tool_choice={
        "type": "function", "function": {"name": "get_weather"}}),
    "choice_junk": dict(tools=[TIME], tool_choice="always"),
    "tools_object": dict(tools={"type": "function"}),
    "tool_name": dict(tools=[{"type": "function",
                              "function": {"name": "bad name"}}]),
    "tool_type": dict(tools=[{"type": "retrieval"}]),
    "parallel": dict(tools=[TIME], parallel_tool_calls="yes"),
    "kwargs": dict(chat_template_kwargs=["x"]),
    "kwargs_reserved": dict(chat_template_kwargs={"messages": []}),
    "tool_id": dict(messages=USER + [{"role": "tool", "content": "1"}]),
    "args_text": dict(messages=USER + [{"role": "assistant", "tool_calls": [
        {"id": "c", "type": "function",
         "function": {"name": "get_time", "arguments": "{not json"}}]}]),
    "template": dict(messages=USER + [{"role": "system", "content": "late"}]),
}
out["bad"] = {}
for k, kw in bad.items():
    s, r = chat(**kw)
    e = r.get("error", {})
    out["bad"][k] = {"status": s, "param": e.get("param"),
                     "type": e.get("type"), "message": e.get("message")}

# the official client: a tools round trip
client = openai.OpenAI(base_url=base, api_key="dummy", max_retries=0,
                       timeout=60)
msgs = [{"role": "user", "content": "Weather and time in Paris?"}]
first = client.chat.completions.create(
    model=model, messages=msgs, tools=[WEATHER, TIME], max_tokens=8,
    temperature=0, extra_body={"chat_template_kwargs": OFF})
m = first.choices[0].message
out["sdk_first"] = {"finish": first.choices[0].finish_reason,
                    "calls": [[c.function.name,
                               json.loads(c.function.arguments)]
                              for c in m.tool_calls or []],
                    "ids": [c.id for c in m.tool_calls or []]}
msgs.append(m.model_dump(exclude_none=True))
for c in m.tool_calls or []:
    msgs.append({"role": "tool", "tool_call_id": c.id,
                 "content": "sunny" if c.function.name == "get_weather"
                 else "12:00"})
second = client.chat.completions.create(
    model=model, messages=msgs, tools=[WEATHER, TIME], max_tokens=8,
    temperature=0, extra_body={"chat_template_kwargs": OFF})
out["sdk_second"] = {"finish": second.choices[0].finish_reason,
                     "prompt_tokens": second.usage.prompt_tokens,
                     "first_prompt_tokens": first.usage.prompt_tokens,
                     "calls": len(second.choices[0].message.tool_calls or [])}
acc = {}
for chunk in client.chat.completions.create(
        model=model, messages=msgs[:1], tools=[WEATHER, TIME], max_tokens=8,
        temperature=0, stream=True,
        extra_body={"chat_template_kwargs": OFF}):
    for c in chunk.choices:
        for d in c.delta.tool_calls or []:
            a = acc.setdefault(d.index, {"name": "", "args": ""})
            a["name"] += d.function.name or ""
            a["args"] += d.function.arguments or ""
out["sdk_stream"] = [[a["name"], json.loads(a["args"])]
                     for _, a in sorted(acc.items())]
print(json.dumps(out))
PY

run_tests();

__DATA__

=== TEST 1: tool calls from the model, streamed and not, through the real template
--- http_config
    @ENGINE@
--- config
    @ERROR_PAGES@
    location /v1/ { hypic_pass tools; }
--- request
GET /v1/models
--- error_code: 200
--- response_check
my ($res, $block, $srv) = @_;
my $dir = private_dir('tools');
open my $fh, '>', "$dir/client.py" or die "$dir: $!";
print $fh $main::CLIENT;
close $fh;
my $out = `timeout 200 $main::PYTHON $dir/client.py http://127.0.0.1:$srv->{port}/v1 tools-1 2>&1`;
is($?, 0, 'the client ran') or diag($out);
my $r = eval { JSON::PP->new->decode((split /\n/, $out)[-1]) } || {};

my $two = $r->{two}{message} || {};
is($r->{two}{status}, 200, 'tools: 200');
is($two->{content}, undef, 'only calls: content null');
is(scalar @{ $two->{tool_calls} || [] }, 2, 'two calls (parallel)');
is_deeply([map { [$_->{type}, $_->{function}{name}, $_->{function}{arguments}] }
           @{ $two->{tool_calls} || [] }],
          [['function', 'get_weather', '{"city":"Paris","days":3}'],
           ['function', 'get_time', '{"zone":"CET"}']],
          'the XML calls, arguments as JSON text typed by the schema');
like($_->{id}, qr/^call_[0-9a-f]{24}$/, 'a call id') for @{ $two->{tool_calls} || [] };
isnt($two->{tool_calls}[0]{id}, $two->{tool_calls}[1]{id}, 'ids differ');
is($r->{two}{finish}, 'tool_calls', 'finish_reason tool_calls');
is_deeply([map { $_->{function}{name} } @{ $r->{one}{tool_calls} || [] }],
          ['get_weather'], 'parallel_tool_calls false: the first call only');
is_deeply([map { [$_->{function}{name}, $_->{function}{arguments}] }
           @{ $r->{json}{message}{tool_calls} || [] }],
          [['get_weather', '{"city":"Paris","days":3}']],
          'thinking on (the template default): the JSON form, parsed');
is($r->{json}{finish}, 'tool_calls', '... finish_reason tool_calls');

my $st = $r->{stream} || {};
is($st->{last}, '[DONE]', 'the stream ends with [DONE]');
is($st->{deltas}[0]{role}, 'assistant', 'the first delta has the role');
my @calls = map { @{ $_->{tool_calls} || [] } } @{ $st->{deltas} || [] };
is_deeply([map { [$_->{index}, $_->{type}, $_->{function}{name},
                  $_->{function}{arguments}] } @calls],
          [[0, 'function', 'get_weather', '{"city":"Paris","days":3}'],
           [1, 'function', 'get_time', '{"zone":"CET"}']],
          'streamed: delta.tool_calls with index, id, type, name, arguments');
ok(!grep({ length($_->{content} // '') } @{ $st->{deltas} || [] }),
   'streamed: no content');
is($st->{finish}[-1], 'tool_calls', 'streamed: finish_reason tool_calls');

my $n2 = $r->{n2} || {};
my @n2 = @{ $n2->{choices} || [] };
is($n2->{status}, 200, 'n 2, logprobs, tools: 200');
is_deeply([map { $_->{index} } @n2], [0, 1], '... two choices, in order');
for my $c (@n2) {
    my $i = $c->{index};
    is($c->{content}, undef, "choice $i: only calls, content null");
    is_deeply($c->{calls},
              [['get_weather', '{"city":"Paris","days":3}'],
               ['get_time', '{"zone":"CET"}']],
              "choice $i: its own two calls");
    is($c->{finish}, 'tool_calls', "choice $i: finish_reason tool_calls");
    ok(@{ $c->{lp} } > 0 && !grep({ $_->[1] != 2 } @{ $c->{lp} }),
       "choice $i: logprobs of its tokens, 2 alternatives each")
        or diag(JSON::PP->new->encode($c->{lp}));
    my $text = join '', map { $_->[0] } @{ $c->{lp} };
    like($text, qr/^<tool_call>.*get_weather.*get_time/s,
         "choice $i: the tokens spell its calls");
}
is(scalar @{ $n2[0]{lp} || [] } + scalar @{ $n2[1]{lp} || [] },
   $n2->{completion_tokens}, 'a logprob for every completion token');
my %ids = map { $_ => 1 } map { @{ $_->{ids} } } @n2;
is(scalar keys %ids, 4, 'four distinct call ids');

my $n2s = $r->{n2_stream} || {};
is($n2s->{status}, 200, 'streamed n 2, logprobs, tools: 200');
is($n2s->{last}, '[DONE]', '... ends with [DONE]');
is_deeply([sort keys %{ $n2s->{choices} || {} }], [0, 1],
          '... chunks of both choices');
for my $i (0, 1) {
    my $c = $n2s->{choices}{$i} || {};
    is_deeply($c->{calls},
              [[0, 'get_weather', '{"city":"Paris","days":3}'],
               [1, 'get_time', '{"zone":"CET"}']],
              "streamed choice $i: delta.tool_calls numbered from 0");
    is($c->{content}, '', "streamed choice $i: no content");
    is_deeply($c->{finish}, ['tool_calls'],
              "streamed choice $i: one finish_reason, tool_calls");
    is_deeply($c->{lp}, [map { $_->[0] } @{ $n2[$i]{lp} || [] }],
              "streamed choice $i: the same tokens' logprobs as gathered");
}

my $cut = "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n"
          . "</parameter>\n<parameter=days>\n3\n</parameter>\n";
is_deeply($r->{n2_cut}, [[$cut, [], 'stop'], [$cut, [], 'stop']],
          'n 2, calls cut short: each choice its own text as content');
is_deeply($r->{n2_cut_stream}, { 0 => $cut, 1 => $cut },
          'streamed: the same, per choice');
is($r->{cut}{message}{content}, $cut,
   'a call cut short (stop string) is content, not an error');
ok(!$r->{cut}{message}{tool_calls}, '... and no call');
is($r->{cut}{finish}, 'stop', '... finish_reason stop');
is($r->{cut_stream}, $cut, 'streamed, the same content');
is($r->{cut_stream_calls}, 0, '... and no call');
like($r->{none}{content} // '', qr/^<tool_call>\n<function=get_weather>/,
     'tool_choice none: the model\'s text is content');
ok(!$r->{none}{tool_calls}, '... no calls');
like($r->{no_tools}{content} // '', qr/<tool_call>/,
     'without tools nothing is parsed');
is($r->{named}{status}, 200, 'a named tool_choice');
is($r->{named}{prompt_tokens}, $r->{time_only_tokens},
   '... the template sees that tool only');
cmp_ok($r->{named}{prompt_tokens}, '<', $r->{two}{prompt_tokens},
       '... fewer prompt tokens than with both tools');

my ($c0, $c1, $c2) = @{ $r->{cached} || [] };
is($c0, 0, 'a tool spec first seen: nothing cached');
cmp_ok($c1, '>', 150, 'the same tools again: the tool spec is a cache hit')
    or diag("cached: @{ $r->{cached} || [] }");
cmp_ok($c2, '<', $c1, 'the tools in another order: another segment');

my %param = (required_no_tools => 'tool_choice', named_missing => 'tool_choice',
             choice_junk => 'tool_choice', tools_object => 'tools',
             tool_name => 'tools', tool_type => 'tools',
             parallel => 'parallel_tool_calls', kwargs => 'chat_template_kwargs',
             kwargs_reserved => 'chat_template_kwargs', tool_id => 'messages',
             args_text => 'messages');
for my $k (sort keys %param) {
    my $b = $r->{bad}{$k} || {};
    is_deeply([$b->{status}, $b->{param}, $b->{type}],
              [400, $param{$k}, 'invalid_request_error'],
              "$k: 400 naming $param{$k}") or diag($b->{message});
}
my $t = $r->{bad}{template} || {};
is($t->{status}, 400, 'the template refuses: 400');
like($t->{message} // '', qr/System message must be at the beginning/,
     '... with the template\'s message');

is($r->{sdk_first}{finish}, 'tool_calls', 'SDK: finish_reason tool_calls');
is_deeply($r->{sdk_first}{calls},
          [['get_weather', { city => 'Paris', days => 3 }],
           ['get_time', { zone => 'CET' }]],
          'SDK: message.tool_calls parsed by the client');
cmp_ok($r->{sdk_second}{prompt_tokens}, '>',
       $r->{sdk_second}{first_prompt_tokens},
       'SDK: the calls and tool results went back into the prompt');
is($r->{sdk_second}{calls}, 2, 'SDK: the second turn answers too');
is_deeply($r->{sdk_stream},
          [['get_weather', { city => 'Paris', days => 3 }],
           ['get_time', { zone => 'CET' }]],
          'SDK: streamed tool calls accumulate as OpenAI\'s do');
--- timeout: 200
--- no_error_log
[error]
