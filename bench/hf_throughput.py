#!/usr/bin/env python3
"""Prefill and decode tokens/s of Hugging Face transformers (PyTorch, CPU)
on a model directory: the reference column of the issue-3 bench table.

    python3 bench/hf_throughput.py --model DIR [--tokens 512,2048,8192]
        [--decode 32] [--threads N] [--dtype float32|bfloat16]

Same token ids as bench/engine_throughput.c; eager attention, the torch
fallback of the gated delta rule (no FLA kernels on CPU).
"""
import argparse
import time

import torch
import transformers


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--tokens", default="512,2048,8192")
    ap.add_argument("--decode", type=int, default=32)
    ap.add_argument("--threads", type=int, default=torch.get_num_threads())
    ap.add_argument("--dtype", default="float32")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    t0 = time.time()
    model = transformers.AutoModelForCausalLM.from_pretrained(
        a.model, dtype=getattr(torch, a.dtype), attn_implementation="eager")
    model.eval()
    vocab = model.config.get_text_config().vocab_size
    print(f"# transformers {transformers.__version__}, torch {torch.__version__}, "
          f"{a.threads} threads, {a.dtype}; loaded in {time.time() - t0:.1f} s")
    print("| tokens | prefill tok/s | decode tok/s (after prefill) |")
    print("|---|---|---|")
    for T in [int(x) for x in a.tokens.split(",")]:
        ids = torch.tensor([[(t * 7919 + 13) % min(vocab, 4000) for t in range(T)]])
        with torch.no_grad():
            t0 = time.time()
            out = model(input_ids=ids, use_cache=True)
            dt = time.time() - t0
            past = out.past_key_values
            tok = out.logits[:, -1:].argmax(-1)
            t1 = time.time()
            for _ in range(a.decode):
                out = model(input_ids=tok, past_key_values=past, use_cache=True)
                past = out.past_key_values
                tok = out.logits[:, -1:].argmax(-1)
            dd = time.time() - t1
        print(f"| {T} | {T / dt:.1f} | {a.decode / dd:.2f} |", flush=True)


if __name__ == "__main__":
    main()
