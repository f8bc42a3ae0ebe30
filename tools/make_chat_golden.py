#!/usr/bin/env python3
"""make_chat_golden.py - reference prompts for the chat template tests
(t/027-chat-template.t), made by Hugging Face transformers'
apply_chat_template, written to t/chat/golden.json.

Each case is an OpenAI chat request in the form transformers users pass
too (content strings, tool-call arguments as objects), rendered with
add_generation_prompt=True, the request's tools and its
chat_template_kwargs, for a model directory:

  models/test/qwen35-dense, models/default  their own (ChatML) template
  qwen3.5                                   t/chat/qwen3.5.jinja, the real
                                            Qwen3.5 template, as the
                                            chat_template.jinja of a copy
                                            of qwen35-dense's tokenizer

A case the template refuses records the error instead of a prompt.

Usage: tools/make_chat_golden.py [--check]   (needs transformers, jinja2;
--check compares with the file instead of writing it)
"""

import json
import os
import shutil
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(REPO, "t", "chat", "golden.json")

WEATHER = {"type": "function", "function": {
    "name": "get_weather",
    "description": "Weather for a city, «today» or later",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "description": "the city"},
        "days": {"type": "integer", "minimum": 1.0}},
        "required": ["city"]}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "description": "The time in a zone",
    "parameters": {"type": "object",
                   "properties": {"zone": {"type": "string"}}}}}
SEP = "<|pic_sep|>"

CALL = {"id": "call_1", "type": "function", "function": {
    "name": "get_weather", "arguments": {"city": "Paris", "days": 3}}}
CALL2 = {"id": "call_2", "type": "function", "function": {
    "name": "get_time", "arguments": {"zone": "CET", "opts": {"h24": True},
                                      "list": [1, "b"]}}}

SIMPLE = [
    {"messages": [{"role": "system", "content": "Be brief."},
                  {"role": "user", "content": "Hello" + SEP + "doc" + SEP
                   + "q?"}]},
    {"messages": [{"role": "user", "content": "Hi"},
                  {"role": "assistant", "content": "Hello!"},
                  {"role": "user", "content": "Tool says:"},
                  {"role": "tool", "content": "42", "tool_call_id": "c"}]},
    {"messages": [{"role": "user", "content": "x"},
                  {"role": "assistant", "content": None,
                   "tool_calls": [CALL]}]},
]

QWEN = [
    {"messages": [{"role": "system", "content": "You are terse."},
                  {"role": "user", "content": "Hi there"}]},
    {"messages": [{"role": "user", "content": "Hi"}],
     "chat_template_kwargs": {"enable_thinking": False}},
    {"messages": [{"role": "user", "content": "Hi"}],
     "chat_template_kwargs": {"enable_thinking": True}},
    {"messages": [{"role": "system", "content": "Use tools."},
                  {"role": "user", "content": "Weather in Paris?"}],
     "tools": [WEATHER, TIME]},
    {"messages": [{"role": "user", "content": SEP + "Weather?"}],
     "tools": [WEATHER], "chat_template_kwargs": {"enable_thinking": False}},
    {"messages": [
        {"role": "system", "content": "Use tools."},
        {"role": "user", "content": "Weather and time in Paris?"},
        {"role": "assistant", "content": "Let me look.",
         "tool_calls": [CALL, CALL2]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
        {"role": "tool", "tool_call_id": "call_2", "content": "12:00"},
        {"role": "assistant", "content": "Sunny, noon.",
         "reasoning_content": "Both tools answered."},
        {"role": "user", "content": "Thanks. And Rome?"},
        {"role": "assistant", "content": "", "tool_calls": [CALL]},
        {"role": "tool", "tool_call_id": "call_1", "content": "rain"}],
     "tools": [WEATHER, TIME]},
    {"messages": [
        {"role": "user", "content": "Q"},
        {"role": "assistant",
         "content": "<think>\nhm\n</think>\n\nA"},
        {"role": "user", "content": [{"type": "text", "text": "part one, "},
                                     {"type": "text", "text": "part two"}]}],
     "chat_template_kwargs": {"enable_thinking": False}},
    {"messages": [{"role": "user", "content": "Hi"},
                  {"role": "system", "content": "late"}]},
    {"messages": [{"role": "tool", "content": "orphan"}]},
]


def cases():
    for model in ("models/test/qwen35-dense", "models/default"):
        for req in SIMPLE:
            yield model, req
    for req in QWEN:
        yield "qwen3.5", req


def model_dir(name, tmp):
    """The directory transformers (and the engine) load for a case."""
    if name != "qwen3.5":
        return os.path.join(REPO, name)
    d = os.path.join(tmp, "qwen3.5")
    if not os.path.isdir(d):
        os.makedirs(d)
        src = os.path.join(REPO, "models", "test", "qwen35-dense")
        for f in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copy(os.path.join(src, f), d)
        shutil.copy(os.path.join(REPO, "t", "chat", "qwen3.5.jinja"),
                    os.path.join(d, "chat_template.jinja"))
    return d


def render(tok, req):
    try:
        return {"prompt": tok.apply_chat_template(
            req["messages"], tools=req.get("tools"), tokenize=False,
            add_generation_prompt=True,
            **req.get("chat_template_kwargs", {}))}
    except Exception as e:  # the template refused: record what it said
        return {"error": str(e)}


def main():
    from transformers import AutoTokenizer
    import transformers

    out = {"transformers": transformers.__version__, "cases": []}
    with tempfile.TemporaryDirectory() as tmp:
        toks = {}
        for model, req in cases():
            if model not in toks:
                toks[model] = AutoTokenizer.from_pretrained(
                    model_dir(model, tmp))
            # the body as the client sends it: the engine parses this text
            case = {"model": model,
                    "body": json.dumps(req, ensure_ascii=False)}
            case.update(render(toks[model], req))
            out["cases"].append(case)
    text = json.dumps(out, indent=1, ensure_ascii=False) + "\n"
    if "--check" in sys.argv:
        with open(OUT, encoding="utf-8") as f:
            old = json.load(f)
        same = [c for c in old["cases"]] == out["cases"]
        print("golden.json is " + ("up to date" if same else "STALE"))
        return 0 if same else 1
    with open(OUT, "w", encoding="utf-8") as f:
        f.write(text)
    print("%d cases -> %s" % (len(out["cases"]), OUT))
    return 0


if __name__ == "__main__":
    sys.exit(main())
