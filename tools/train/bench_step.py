"""bench_step.py - time one training step of candidate model sizes (1 thread)."""
import os, sys, time
os.environ.setdefault("OMP_NUM_THREADS", "1")
import torch
torch.set_num_threads(1)
from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig

def cfg(H, L, hd, nh, nkv, hk, hv, dk, dv, inter):
    lt = ["full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(L)]
    return Qwen3_5TextConfig(vocab_size=768, hidden_size=H, num_hidden_layers=L, num_attention_heads=nh,
        num_key_value_heads=nkv, head_dim=hd, intermediate_size=inter, linear_num_key_heads=hk,
        linear_num_value_heads=hv, linear_key_head_dim=dk, linear_value_head_dim=dv, layer_types=lt,
        tie_word_embeddings=True, rope_parameters={"rope_type": "default", "rope_theta": 1e7,
        "partial_rotary_factor": 0.25, "mrope_section": [2, 1, 1], "mrope_interleaved": True})

for name, c, B, T in [
    ("H128 L8", cfg(128, 8, 32, 4, 2, 2, 4, 32, 32, 384), 16, 256),
    ("H128 L8 T512", cfg(128, 8, 32, 4, 2, 2, 4, 32, 32, 384), 8, 512),
    ("H192 L8", cfg(192, 8, 48, 4, 2, 2, 4, 48, 48, 512), 16, 256),
]:
    torch.manual_seed(0)
    m = Qwen3_5ForCausalLM(c)
    c._attn_implementation = "sdpa"
    opt = torch.optim.AdamW(m.parameters(), 1e-3)
    x = torch.randint(0, 760, (B, T))
    n = sum(p.numel() for p in m.parameters())
    ts = []
    for i in range(4):
        t0 = time.time()
        out = m(input_ids=x, labels=x)
        out.loss.backward(); opt.step(); opt.zero_grad()
        ts.append(time.time() - t0)
    print(name, n, "params", [round(t, 2) for t in ts], "tok/s", int(B * T / min(ts[1:])), flush=True)
