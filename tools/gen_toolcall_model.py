#!/usr/bin/env python3
"""gen_toolcall_model.py - models/test/qwen35-tools: a Qwen3.5 checkpoint
whose greedy answer is a tool call, for the end-to-end tool tests.

Nothing is trained. The checkpoint is tools/gen_model.py's qwen3_5 layout
(untied, f32) with every layer's output projection zero, so the residual
stream is the token's embedding and the next token depends on the last
one alone; the embedding and lm_head rows of a few tokens are then set so
that greedy decoding walks a fixed chain. The tokens are added
(non-special) tokens, so the chain's text is the model's real output:

  "\\n\\n" (Qwen3.5's prompt end, thinking off)
      -> XML call get_weather(city=Paris, days=3)
      -> XML call get_time(zone=CET) -> <|im_end|>
  "\\n" (the prompt end, thinking on: after "<think>")
      -> JSON call get_weather -> <|im_end|>

Its chat template is the real Qwen3.5 one (t/chat/qwen3.5.jinja).

Usage: tools/gen_toolcall_model.py [--out models/test/qwen35-tools]
"""

import json
import os
import shutil
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gen_model  # noqa: E402
import hflib  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

XML_A = ("<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n"
         "</parameter>\n<parameter=days>\n3\n</parameter>\n</function>\n"
         "</tool_call>")
XML_B = ("\n<tool_call>\n<function=get_time>\n<parameter=zone>\nCET\n"
         "</parameter>\n</function>\n</tool_call>")
JSON_A = ('<tool_call>\n{"name": "get_weather", "arguments": '
          '{"city": "Paris", "days": 3}}\n</tool_call>')
ADDED = ["<think>", "</think>", "\n\n", XML_A, XML_B, JSON_A]


def main():
    out = sys.argv[sys.argv.index("--out") + 1] if "--out" in sys.argv \
        else os.path.join(REPO, "models", "test", "qwen35-tools")
    gen_model.main(["--arch", "qwen3_5", "--hidden", "64", "--layers", "4",
                    "--heads", "4", "--kv-heads", "2", "--head-dim", "32",
                    "--lin-k-heads", "2", "--lin-v-heads", "4",
                    "--lin-k-dim", "16", "--lin-v-dim", "16",
                    "--intermediate", "64", "--dtype", "f32", "--seed", "31",
                    "--out", out])

    def path(name):
        return os.path.join(out, name)

    with open(path("tokenizer.json"), encoding="utf-8") as f:
        tok = json.load(f)
    first = max(t["id"] for t in tok["added_tokens"]) + 1
    ids = {}
    for i, text in enumerate(ADDED):
        ids[text] = first + i
        tok["added_tokens"].append({
            "id": first + i, "content": text, "single_word": False,
            "lstrip": False, "rstrip": False, "normalized": False,
            "special": False})
    with open(path("tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(tok, f, indent=2, ensure_ascii=False)
        f.write("\n")

    with open(path("tokenizer_config.json"), encoding="utf-8") as f:
        cfg = json.load(f)
    for text, i in ids.items():
        cfg["added_tokens_decoder"][str(i)] = {
            "content": text, "lstrip": False, "normalized": False,
            "rstrip": False, "single_word": False, "special": False}
    del cfg["chat_template"]  # chat_template.jinja, as Qwen3.5 ships it
    with open(path("tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(cfg, f, indent=2, ensure_ascii=False)
        f.write("\n")
    shutil.copy(os.path.join(REPO, "t", "chat", "qwen3.5.jinja"),
                path("chat_template.jinja"))

    from tokenizers import Tokenizer
    t = Tokenizer.from_file(path("tokenizer.json"))
    newline = t.encode("<think>\n").ids[-1]
    end = t.token_to_id("<|im_end|>")
    chain = {ids["\n\n"]: ids[XML_A], ids[XML_A]: ids[XML_B],
             ids[XML_B]: end, newline: ids[JSON_A], ids[JSON_A]: end}

    w, meta = hflib.read_safetensors(path("model.safetensors"))
    for name in w:
        if name.endswith(("out_proj.weight", "o_proj.weight",
                          "down_proj.weight")):
            w[name][:] = 0.0  # no layer writes to the residual stream
    w["model.norm.weight"][:] = 0.0  # (1 + w) scaling: none
    rng = np.random.default_rng(5)
    embed, head = w["model.embed_tokens.weight"], w["lm_head.weight"]
    for src in chain:
        embed[src] = rng.standard_normal(embed.shape[1])
    for src, dst in chain.items():
        unit = embed[src] / np.sqrt(np.mean(embed[src] ** 2))
        head[dst] += 10.0 * unit / np.linalg.norm(unit)
    tensors = [(n, "F32", a.astype(np.float32)) for n, a in w.items()]
    hflib.write_safetensors(path("model.safetensors"), tensors, meta)
    print("chain", {t.id_to_token(a): t.id_to_token(b)
                    for a, b in chain.items()})


if __name__ == "__main__":
    main()
