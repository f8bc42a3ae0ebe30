# Structured output end to end, real nginx and real engines on the test
# models: models/test/qwen35-tools (the real Qwen3.5 chat template, which
# teaches the XML tool-call syntax) and models/test/qwen35-dense (ChatML,
# the JSON syntax). The models are tiny and random, so what they write is
# nonsense, but under response_format it must parse and validate: a
# json_object answer is a JSON object, a json_schema answer validates
# against its schema (by pydantic, the model it came from, extra fields
# forbidden), streamed too, and on /v1/completions; the official openai
# SDK's client.chat.completions.parse fills a pydantic model;
# tool_choice "required" and a named function give tool calls whose
# arguments parse and follow the tool's parameters, in both syntaxes
# (without the masking the tools model answers a call only with thinking
# on, the dense model never); chunkwise (KVBuffer) decode with speculation
# asked for still masks (a masked request does not speculate); the
# log-probabilities are the masked
# distribution's (no alternative outside it); a schema the compiler does
# not take is a 400 naming the keyword, param response_format.

use strict;
use warnings;
use lib 't/lib';

use JSON::PP ();
use Hypic::Nginx;
use Hypic::Engine;
use Hypic::Util qw(private_dir python_module);

our $TOOLS = "$Hypic::Nginx::REPO/models/test/qwen35-tools";
our $DENSE = "$Hypic::Nginx::REPO/models/test/qwen35-dense";
our $PYTHON = $ENV{HYPIC_PYTHON} // 'python3';

my $why = Hypic::Engine->why_not
          || (-d $TOOLS && -d $DENSE ? '' : "no test models")
          || python_module('openai', $PYTHON)
          || python_module('pydantic', $PYTHON);
plan(skip_all => $why) if $why;

our $e_tools = Hypic::Engine->start(
    args => ['--model', $TOOLS, '--node', 't-tools', '--slots', 4]);
our $e_dense = Hypic::Engine->start(
    args => ['--model', $DENSE, '--node', 't-dense', '--slots', 4]);

add_vars(ENGINE => 'hypic_engine tools unix:' . $e_tools->socket
                   . ' model=tools-1;'
                   . ' hypic_engine dense unix:' . $e_dense->socket
                   . ' model=dense-1;');

our $CLIENT = <<'PY';
import json, sys, urllib.request, urllib.error
from typing import List, Literal, Optional
import openai
import pydantic

base = sys.argv[1]
OFF = {"enable_thinking": False}
USER = [{"role": "user", "content": "Weather in Paris?"}]

class Answer(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="forbid")
    name: str = pydantic.Field(max_length=6)
    age: int
    ok: bool
    kind: Literal["x", "y"]
    tags: List[Literal["a", "b"]] = pydantic.Field(max_length=2)
    note: Optional[str] = pydantic.Field(default=None, max_length=4)

SCHEMA = Answer.model_json_schema()
FORMAT = {"type": "json_schema",
          "json_schema": {"name": "Answer", "schema": SCHEMA,
                          "strict": True}}
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "parameters": {
        "type": "object", "properties": {
            "city": {"type": "string", "maxLength": 8},
            "days": {"type": "integer"}},
        "required": ["city", "days"], "additionalProperties": False}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "parameters": {
        "type": "object", "properties": {
            "zone": {"type": "string", "enum": ["utc", "cet"]}},
        "required": ["zone"]}}}

def url(model):
    return base + ("/tools/v1" if model == "tools-1" else "/dense/v1")

def post(path, body):
    req = urllib.request.Request(url(body["model"]) + path, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()

def chat(model, **kw):
    body = {"model": model, "messages": USER, "max_tokens": 300,
            "temperature": 0}
    if model == "tools-1":
        body["chat_template_kwargs"] = OFF
    body.update(kw)
    status, text = post("/chat/completions", body)
    if kw.get("stream"):
        ev = [e[6:] for e in text.split("\n\n") if e.startswith("data: ")]
        chunks = [json.loads(e) for e in ev if e != "[DONE]"]
        content = "".join(c["choices"][0]["delta"].get("content") or ""
                          for c in chunks if c["choices"])
        finish = [c["choices"][0]["finish_reason"] for c in chunks
                  if c["choices"] and c["choices"][0]["finish_reason"]]
        return status, {"content": content, "finish": finish}
    return status, json.loads(text)

def is_object(text):
    try:
        return isinstance(json.loads(text), dict)
    except Exception:
        return False

def validates(text):
    try:
        Answer.model_validate_json(text)
        return True
    except Exception as e:
        return str(e)

def args_ok(call):
    a = json.loads(call["function"]["arguments"])
    if call["function"]["name"] == "get_weather":
        return (sorted(a) == ["city", "days"] and isinstance(a["city"], str)
                and type(a["days"]) is int and len(a["city"]) <= 8)
    return sorted(a) == ["zone"] and a["zone"] in ("utc", "cet")

out = {}
for model in ("tools-1", "dense-1"):
    o = out[model] = {}
    s, r = chat(model)
    o["free"] = {"status": s, "object": is_object(
        r["choices"][0]["message"].get("content") or "")}
    # greedy, the dense model loops inside a string to max_tokens (a
    # valid prefix, finish "length"); this seed closes it
    s, r = chat(model, response_format={"type": "json_object"},
                temperature=1.0, seed=1)
    c = r["choices"][0]
    o["json_object"] = {"status": s, "object": is_object(
        c["message"]["content"]), "finish": c["finish_reason"],
        "content": c["message"]["content"]}
    s, r = chat(model, response_format=FORMAT, logprobs=True,
                top_logprobs=5)
    c = r["choices"][0]
    lp = c["logprobs"]["content"]
    o["schema"] = {"status": s, "valid": validates(c["message"]["content"]),
                   "finish": c["finish_reason"],
                   "content": c["message"]["content"],
                   "lp_text": b"".join(bytes(t["bytes"]) for t in lp) ==
                              c["message"]["content"].encode(),
                   "lp_finite": all(a["logprob"] > -1e30 for t in lp
                                    for a in t["top_logprobs"])}
    s, r = chat(model, response_format=FORMAT,
                hypic={"decode": "chunkwise", "speculative": True})
    o["chunkwise_spec"] = {"status": s, "valid": validates(
        r["choices"][0]["message"]["content"]) if s == 200 else r}
    s, r = chat(model, response_format=FORMAT, stream=True)
    o["stream"] = {"status": s, "valid": validates(r["content"]),
                   "finish": r["finish"]}
    s, text = post("/completions", {"model": model, "prompt": "Once",
                                    "max_tokens": 300, "temperature": 0,
                                    "response_format": FORMAT})
    o["completions"] = {"status": s, "valid": validates(
        json.loads(text)["choices"][0]["text"]) if s == 200 else text}
    s, r = chat(model, tools=[WEATHER, TIME], tool_choice="required")
    c = r["choices"][0]
    calls = c["message"].get("tool_calls") or []
    o["required"] = {"status": s, "finish": c["finish_reason"],
                     "calls": len(calls), "content": c["message"]["content"],
                     "args_ok": bool(calls) and all(args_ok(k)
                                                    for k in calls)}
    s, r = chat(model, tools=[WEATHER, TIME], tool_choice={
        "type": "function", "function": {"name": "get_time"}})
    c = r["choices"][0]
    calls = c["message"].get("tool_calls") or []
    o["named"] = {"status": s, "finish": c["finish_reason"],
                  "names": [k["function"]["name"] for k in calls],
                  "args_ok": bool(calls) and all(args_ok(k) for k in calls)}
    s, r = chat(model, tools=[WEATHER, TIME])
    o["auto_calls"] = len(r["choices"][0]["message"].get("tool_calls") or [])

client = openai.OpenAI(base_url=url("dense-1"), api_key="dummy", max_retries=0,
                       timeout=120)
parse = getattr(client.chat.completions, "parse", None) or \
    client.beta.chat.completions.parse
done = parse(model="dense-1", messages=USER, response_format=Answer,
             max_tokens=300, temperature=0)
p = done.choices[0].message.parsed
out["sdk"] = {"type": type(p).__name__, "parsed": p.model_dump()}

bad = {}
for k, rf in {
        "pattern": {"type": "json_schema", "json_schema": {
            "name": "x", "schema": {"type": "object", "properties": {
                "a": {"type": "string", "pattern": "^x"}}}}},
        "ref": {"type": "json_schema", "json_schema": {
            "name": "x", "schema": {"$ref": "#/$defs/Missing"}}},
        "type": {"type": "yaml"},
        "no_schema": {"type": "json_schema", "json_schema": {"name": "x"}},
}.items():
    s, text = post("/chat/completions", {"model": "dense-1",
                                         "messages": USER,
                                         "response_format": rf})
    e = json.loads(text).get("error", {})
    bad[k] = {"status": s, "type": e.get("type"), "param": e.get("param"),
              "message": e.get("message")}
s, text = post("/chat/completions", {
    "model": "dense-1", "messages": USER, "tools": [{
        "type": "function", "function": {"name": "f", "parameters": {
            "type": "object", "properties": {"a": {"format": "date"}}}}}],
    "tool_choice": "required"})
e = json.loads(text).get("error", {})
bad["tool"] = {"status": s, "type": e.get("type"), "param": e.get("param"),
               "message": e.get("message")}
out["bad"] = bad
print(json.dumps(out))
PY

run_tests();

__DATA__

=== TEST 1: response_format and tool_choice enforced while decoding
--- http_config
    @ENGINE@
--- config
    @ERROR_PAGES@
    location /tools/v1/ { hypic_pass tools; }
    location /dense/v1/ { hypic_pass dense; }
--- request
GET /dense/v1/models
--- error_code: 200
--- response_check
my ($res, $block, $srv) = @_;
my $dir = private_dir('structured');
open my $fh, '>', "$dir/client.py" or die "$dir: $!";
print $fh $main::CLIENT;
close $fh;
my $out = `timeout 200 $main::PYTHON $dir/client.py http://127.0.0.1:$srv->{port} 2>&1`;
is($?, 0, 'the client ran') or diag($out);
my $r = eval { JSON::PP->new->decode((split /\n/, $out)[-1]) } || {};
diag(JSON::PP->new->canonical->encode($r)) if $ENV{HYPIC_VERBOSE};

for my $m ('tools-1', 'dense-1') {
    my $o = $r->{$m} || {};
    ok(!$o->{free}{object}, "$m: unconstrained, the answer is no JSON object");
    is($o->{json_object}{status}, 200, "$m json_object: 200");
    ok($o->{json_object}{object}, "$m json_object: the content is a JSON "
       . 'object') or diag($o->{json_object}{content});
    is($o->{json_object}{finish}, 'stop', "$m json_object: finish stop");
    is($o->{schema}{valid}, JSON::PP::true, "$m json_schema: the content "
       . 'validates') or diag($o->{schema}{valid}, ' ', $o->{schema}{content});
    is($o->{schema}{finish}, 'stop', "$m json_schema: finish stop");
    ok($o->{schema}{lp_text} && $o->{schema}{lp_finite},
       "$m json_schema: logprobs of the masked distribution, text and "
       . 'alternatives');
    is($o->{chunkwise_spec}{valid}, JSON::PP::true, "$m json_schema, "
       . 'KVBuffer decode and speculation asked for: validates')
        or diag(explain($o->{chunkwise_spec}));
    is($o->{stream}{valid}, JSON::PP::true, "$m json_schema streamed: "
       . 'validates') or diag($o->{stream}{valid});
    is_deeply($o->{stream}{finish}, ['stop'], "$m streamed: finish stop");
    is($o->{completions}{valid}, JSON::PP::true, "$m /v1/completions "
       . 'json_schema: validates') or diag($o->{completions}{valid});
    is($o->{required}{status}, 200, "$m required: 200");
    cmp_ok($o->{required}{calls}, '>=', 1, "$m required: tool calls")
        or diag($o->{required}{content});
    ok($o->{required}{args_ok}, "$m required: arguments parse and follow "
       . 'the parameters');
    is($o->{required}{finish}, 'tool_calls', "$m required: finish "
       . 'tool_calls');
    is_deeply($o->{named}{names}, ['get_time'], "$m named: one call of it");
    ok($o->{named}{args_ok}, "$m named: its arguments parse and follow "
       . 'the parameters');
}
is($r->{'dense-1'}{auto_calls}, 0, 'dense, tool_choice auto: no calls '
   . '(the calls above are the masking\'s)');

is($r->{sdk}{type}, 'Answer', 'SDK parse: a pydantic Answer');
like($r->{sdk}{parsed}{kind} // '', qr/^[xy]$/, 'SDK parse: its fields');

for my $k (qw(pattern ref type no_schema)) {
    my $b = $r->{bad}{$k} || {};
    is_deeply([$b->{status}, $b->{type}, $b->{param}],
              [400, 'invalid_request_error', 'response_format'],
              "bad $k: 400 naming response_format") or diag($b->{message});
}
like($r->{bad}{pattern}{message} // '', qr/'pattern' at #\/properties\/a/,
     'the message names the keyword and its path');
is_deeply([@{ $r->{bad}{tool} || {} }{qw(status param)}], [400, 'tools'],
          'a tool schema that does not compile: 400 naming tools');
like($r->{bad}{tool}{message} // '', qr/'format'/, '... and the keyword');
--- timeout: 240
--- no_error_log
[error]
