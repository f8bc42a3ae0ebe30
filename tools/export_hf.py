#!/usr/bin/env python3
"""export_hf.py - write the trained model as an HF checkpoint directory the
C engine loads (gen_model.py's qwen3_5 flat layout), prove transformers reads
it back bit-exactly, and summarise test results.

Used by tools/train_model.py at the end of training (and by
`tools/train_model.py --export-only`). Files written into --out:
  config.json              Qwen3_5ForCausalLM / qwen3_5_text, tied embeddings
  model.safetensors        F32, prefix model., no lm_head.weight (tied)
  tokenizer_config.json    ChatML chat_template, eos <|im_end|>
  generation_config.json   eos [<|im_end|>, <|endoftext|>], greedy
  (tokenizer.json is already there: tools/train_bpe.py)
"""

import collections
import json
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gen_model  # noqa: E402
import hflib  # noqa: E402


def _dump(out, name, obj):
    with open(os.path.join(out, name), "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=2, ensure_ascii=False)
        f.write("\n")


def export(model, args, tok, cfg_dict, ids, meta=None):
    out = args.out
    os.makedirs(out, exist_ok=True)
    _dump(out, "config.json", cfg_dict)
    _dump(out, "tokenizer_config.json", gen_model.tokenizer_config(ids))
    gen = {"bos_token_id": ids["<|endoftext|>"], "eos_token_id": [ids["<|im_end|>"], ids["<|endoftext|>"]],
           "pad_token_id": ids["<|endoftext|>"], "do_sample": False}
    _dump(out, "generation_config.json", gen)
    sd = model.state_dict()
    tensors = []
    for name in sorted(sd):
        if name == "lm_head.weight" and cfg_dict.get("tie_word_embeddings"):
            continue
        tensors.append((name, "F32", sd[name].detach().float().cpu().numpy()))
    md = {"format": "pt"}
    md.update(meta or {})
    hflib.write_safetensors(os.path.join(out, "model.safetensors"), tensors, md)
    n = sum(int(np.prod(a.shape)) for _, _, a in tensors)
    size = os.path.getsize(os.path.join(out, "model.safetensors"))
    print(f"export: {out}: {len(tensors)} tensors, {n} params, model.safetensors {size} bytes", flush=True)
    verify(model, out)


@torch.no_grad()
def verify(model, out):
    """transformers loads the directory and gives the same logits."""
    from transformers import AutoModelForCausalLM

    m2 = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32, attn_implementation="eager")
    m2.eval()
    model.eval()
    x = torch.randint(0, 700, (1, 300), generator=torch.Generator().manual_seed(0))
    a = model(input_ids=x).logits
    b = m2(input_ids=x).logits
    d = (a - b).abs().max().item()
    print(f"export: transformers reload ({type(m2).__name__}) max |logit diff| {d:.2e}", flush=True)
    if d > 1e-3:
        raise SystemExit("export: reloaded model differs")
    model.train()


def summarize(records, hits):
    by_q, by_n = collections.defaultdict(list), collections.defaultdict(list)
    for r, h in zip(records, hits):
        by_q[r["qtype"]].append(h)
        by_n[r["n_docs"]].append(h)
    return {
        "test_n": len(records),
        "test_em": sum(hits) / max(1, len(hits)),
        "by_qtype": {k: round(sum(v) / len(v), 4) for k, v in sorted(by_q.items())},
        "by_n_docs": {str(k): round(sum(v) / len(v), 4) for k, v in sorted(by_n.items())},
    }
