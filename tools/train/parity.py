#!/usr/bin/env python3
"""parity.py - check that build/hypic-engine runs the exported default model
like transformers does, on rag_data test prompts.

  1. tokenizer: the engine's ids of every segment == HF tokenizers' ids
  2. last-position logits (engine `logits`, mode full) vs transformers
  3. greedy answers: engine `generate --prompt-file` vs transformers greedy
     decoding of the same token stream (segments tokenized on their own,
     separators dropped), stopping at <|im_end|> / <|endoftext|>

    python3 tools/train/parity.py --model models/default --n 8 [--mode full]
        [--write-golden models/default/golden_answers.json]

--write-golden records the prompts with transformers' greedy answers (text
and ids) for t/026-default-model.t, which checks the engine against them
without torch.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tools"))
import hflib  # noqa: E402


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model", default=os.path.join(ROOT, "models/default"))
    p.add_argument("--data", default=os.path.join(ROOT, "tools/train/data/test.jsonl"))
    p.add_argument("--engine", default=os.path.join(ROOT, "build/hypic-engine"))
    p.add_argument("--n", type=int, default=8)
    p.add_argument("--max-tokens", type=int, default=8)
    p.add_argument("--mode", default="full")
    p.add_argument("--tok-records", type=int, default=200)
    p.add_argument("--write-golden", help="write the prompts and transformers' greedy answers here")
    args = p.parse_args()
    torch.set_num_threads(1)

    from tokenizers import Tokenizer
    from transformers import AutoModelForCausalLM

    tok = Tokenizer.from_file(os.path.join(args.model, "tokenizer.json"))
    recs = [json.loads(line) for line in open(args.data, encoding="utf-8")]
    tmp = tempfile.mkdtemp(prefix="hypic-parity-")

    # 1. tokenizer parity over segments
    segs = []
    for r in recs[: args.tok_records]:
        segs += r["segments"]
    segs = list(dict.fromkeys(segs))
    bf = os.path.join(tmp, "batch.bin")
    with open(bf, "wb") as f:
        for s in segs:
            b = s.encode("utf-8")
            f.write(b"%d\n" % len(b) + b + b"\n")
    out = subprocess.run([args.engine, "tokenize", "--model", args.model, "--batch", bf],
                         capture_output=True, text=True, check=True).stdout.splitlines()
    bad = sum(1 for s, line in zip(segs, out) if [int(t) for t in line.split()] != tok.encode(s).ids)
    print(f"tokenizer: {len(segs)} segments, {bad} mismatches, {len(out)} lines")

    # pick prompts with varied n_docs
    want = sorted({2, 3, 5, 8, 11, 13, 16, 4, 6, 9, 12, 14, 7, 10, 15})[: args.n]
    picks, seen = [], set()
    for r in recs:
        if r["n_docs"] in want and r["n_docs"] not in seen:
            picks.append(r)
            seen.add(r["n_docs"])
    picks = picks[: args.n]

    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32, attn_implementation="eager")
    model.eval()
    eos = {tok.token_to_id("<|im_end|>"), tok.token_to_id("<|endoftext|>")}
    n_same = n_ok = 0
    worst = 0.0
    golden = []
    for r in picks:
        ids = []
        for s in r["segments"]:
            ids += tok.encode(s).ids
        x = torch.tensor([ids])
        with torch.no_grad():
            hf_last = model(input_ids=x).logits[0, -1]
            gen = []
            cur = x
            for _ in range(args.max_tokens):
                nxt = int(model(input_ids=cur).logits[0, -1].argmax())
                if nxt in eos:
                    break
                gen.append(nxt)
                cur = torch.cat([cur, torch.tensor([[nxt]])], 1)
        hf_text = tok.decode(gen)
        pf = os.path.join(tmp, f"{r['id']}.txt")
        with open(pf, "w", encoding="utf-8") as f:
            f.write(r["prompt"])
        lf = os.path.join(tmp, f"{r['id']}.safetensors")
        subprocess.run([args.engine, "logits", "--model", args.model, "--prompt-file", pf, "--out", lf,
                        "--mode", args.mode], check=True, capture_output=True)
        t, _ = hflib.read_safetensors(lf)
        el = torch.from_numpy(next(iter(t.values()))).reshape(-1)[: hf_last.numel()]
        d = (el - hf_last).abs().max().item()
        worst = max(worst, d)
        eng = subprocess.run([args.engine, "generate", "--model", args.model, "--prompt-file", pf,
                              "--max-tokens", str(args.max_tokens), "--mode", args.mode],
                             capture_output=True, text=True, check=True).stdout
        eng_text = eng.rstrip("\n")
        same = eng_text == hf_text
        ok = hf_text.strip() == r["answer"]
        n_same += same
        n_ok += ok
        golden.append({"id": r["id"], "n_docs": r["n_docs"], "qtype": r["qtype"], "prompt": r["prompt"],
                       "answer": r["answer"], "hf_text": hf_text, "hf_ids": gen})
        print(f"{r['id']:>9} n_docs {r['n_docs']:>2} {r['qtype']:<12} tokens {len(ids):>3} "
              f"gold {r['answer']!r:<12} hf {hf_text!r:<14} engine {eng_text!r:<14} "
              f"same {same} correct {ok} max|dlogit| {d:.2e}")
    print(f"greedy: engine == transformers on {n_same}/{len(picks)} prompts; "
          f"correct {n_ok}/{len(picks)}; worst last-logit diff {worst:.2e} (mode {args.mode})")
    if args.write_golden:
        with open(args.write_golden, "w", encoding="utf-8") as f:
            json.dump({"max_tokens": args.max_tokens, "records": golden}, f, indent=1, ensure_ascii=False)
            f.write("\n")
        print(f"wrote {args.write_golden}: {len(golden)} records")


if __name__ == "__main__":
    main()
