#!/usr/bin/env python3
"""Runs llama.cpp's convert_hf_to_gguf.py on a tools/gen_model.py checkpoint
(used by bench/llamacpp_compare.py, in its venv).

    python bench/llamacpp_convert.py LLAMA_CPP_TREE MODEL_DIR [converter options]

The converter names a BPE pre-tokenizer by hashing how the tokenizer encodes a
test string, which only recognises released vocabularies. gen_model's
tokenizers are small BPEs trained here under a Qwen pre-tokenizer regex, so the
hash is unknown and the converter refuses them. Where it does, this names the
pre-tokenizer from the regex in tokenizer.json (the regex is what llama.cpp's
pre-tokenizer type implements); the rest is the converter's own code.
"""
import json
import os
import runpy
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tools"))
import hflib  # noqa: E402

PRE = {hflib.QWEN35_REGEX: "qwen35", hflib.QWEN2_REGEX: "qwen2"}


def split_regexes(pre):
    subs = pre.get("pretokenizers", [pre]) if pre else []
    return [p["pattern"]["Regex"] for p in subs if p.get("type") == "Split" and "Regex" in p.get("pattern", {})]


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__.split("\n\n")[1])
    tree = sys.argv[1]
    sys.argv = [os.path.join(tree, "convert_hf_to_gguf.py")] + sys.argv[2:]
    sys.path[:0] = [tree, os.path.join(tree, "gguf-py")]
    from conversion import base

    known = base.TextModel.get_vocab_base_pre

    def named(self, tokenizer):
        try:
            return known(self, tokenizer)
        except NotImplementedError:
            with open(os.path.join(self.dir_model, "tokenizer.json"), encoding="utf-8") as f:
                regexes = split_regexes(json.load(f).get("pre_tokenizer"))
            name = next((PRE[r] for r in regexes if r in PRE), None)
            if name is None:
                raise
            print(f"llamacpp_convert: pre-tokenizer {name!r}, named from tokenizer.json's regex", file=sys.stderr)
            return name

    base.TextModel.get_vocab_base_pre = named
    runpy.run_path(sys.argv[0], run_name="__main__")


if __name__ == "__main__":
    main()
