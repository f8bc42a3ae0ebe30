#!/usr/bin/env python3
"""make_golden.py - golden reference outputs of a model directory, computed
with Hugging Face transformers (float32, eager attention), written to
DIR/golden.safetensors (format "hypic-golden-1").

For every fixed prompt i:
  prompt.{i}.ids                          I32 [T]      token ids (tokenizers)
  prompt.{i}.logits                       F32 [T, V]   logits at every position
  prompt.{i}.greedy                       I32 [8]      greedy continuation
  prompt.{i}.layers.N.linear_attn.state      F32 [Hv, dk, dv]  after prefill
  prompt.{i}.layers.N.linear_attn.conv_state F32 [conv_dim, K-1] oldest first
  prompt.{i}.layers.N.self_attn.k / .v       F32 [T, Hkv, hd]  K after RoPE
  weights.*                               F32  a few weights in the engine's
                                          canonical layout, read back from HF
__metadata__: format, versions, model class, prompt texts (JSON).

Before computing anything it proves that transformers read the checkpoint as
it is: no missing / mismatched keys, only mtp.* (and model.visual.* for the
text class) unexpected, and every parameter equal to the checkpoint tensor it
comes from (prefix, fused experts and tied head resolved independently).

Usage: tools/make_golden.py [DIR ...]   (default: every models/test/*/)
"""

import glob
import json
import os
import re
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hflib  # noqa: E402

GOLDEN_FORMAT = "hypic-golden-1"
N_GREEDY = 8

# Lengths in the toy tokenizers: ~7, ~50, ~80 and ~150 tokens, so that the
# chunked GDN prefill (chunk 64) runs 1, 1, 2 and 3 chunks.
PROMPTS = [
    "Hello world",
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
    "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n"
    "<|im_start|>assistant\n",
    "def softmax(x):\n    m = max(x)\n    e = [math.exp(v - m) for v in x]\n"
    "    s = sum(e)\n    return [v / s for v in e]\n\nprint(softmax([1.0, 2.0, 3.0]))\n",
    "Once upon a time there was a little town by the sea. Every evening the "
    "people of the town came down to the harbour to watch the boats return. "
    "The old captain told stories of storms and of islands where the trees "
    "were taller than the houses, and nobody could tell which of his stories "
    "were true. One night a boat did not come back.",
]


def die(msg):
    sys.exit(f"make_golden: {msg}")


def model_classes(cfg):
    """(class used for the goldens, class that must load the whole file)."""
    import transformers as tf

    mt = cfg.get("model_type")
    text = {
        "qwen3_next": tf.Qwen3NextForCausalLM,
        "qwen3_5_text": tf.Qwen3_5ForCausalLM,
        "qwen3_5_moe_text": tf.Qwen3_5MoeForCausalLM,
        "qwen3_5": tf.Qwen3_5ForCausalLM,
        "qwen3_5_moe": tf.Qwen3_5MoeForCausalLM,
    }
    full = {
        "qwen3_5": tf.Qwen3_5ForConditionalGeneration,
        "qwen3_5_moe": tf.Qwen3_5MoeForConditionalGeneration,
    }
    if mt not in text:
        die(f"unsupported model_type {mt!r}")
    return text[mt], full.get(mt)


def load_checked(cls, d, ckpt, allowed_unexpected):
    import torch

    model, info = cls.from_pretrained(
        d, dtype=torch.float32, attn_implementation="eager", output_loading_info=True
    )
    model.eval()
    bad = {k: sorted(info[k]) for k in ("missing_keys", "mismatched_keys") if info[k]}
    if info.get("error_msgs"):
        bad["error_msgs"] = info["error_msgs"]
    unexpected = [k for k in info["unexpected_keys"] if not re.match(allowed_unexpected, k)]
    if unexpected:
        bad["unexpected_keys"] = sorted(unexpected)
    if bad:
        die(f"{d}: {cls.__name__} did not load the checkpoint cleanly: {bad}")
    verify_params(model, ckpt, d, cls.__name__)
    return model


def expected_tensor(name, ckpt, prefix):
    """The checkpoint value an HF parameter must equal, derived here without
    transformers' conversion code. None if the checkpoint cannot give it."""
    cands = [name]
    if name.startswith("model.") and not name.startswith(prefix):
        cands.append(prefix + name[len("model.") :])
    for c in cands:
        if c in ckpt:
            return ckpt[c]
        m = re.match(r"(.*\.mlp\.experts)\.(gate_up_proj|down_proj)$", c)
        if m and f"{m.group(1)}.0.down_proj.weight" in ckpt:
            base, kind = m.groups()
            E = sum(1 for k in ckpt if re.match(re.escape(base) + r"\.\d+\.down_proj\.weight$", k))
            if kind == "down_proj":
                return np.stack([ckpt[f"{base}.{e}.down_proj.weight"] for e in range(E)])
            return np.stack(
                [
                    np.concatenate([ckpt[f"{base}.{e}.gate_proj.weight"], ckpt[f"{base}.{e}.up_proj.weight"]])
                    for e in range(E)
                ]
            )
    if name == "lm_head.weight":  # tied: no lm_head in the file
        return expected_tensor("model.embed_tokens.weight", ckpt, prefix)
    return None


def verify_params(model, ckpt, d, what):
    prefix = "model.language_model." if any(k.startswith("model.language_model.") for k in ckpt) else "model."
    bad, n = [], 0
    for name, p in model.state_dict().items():
        want = expected_tensor(name, ckpt, prefix)
        if want is None:
            bad.append(f"{name}: no checkpoint source")
            continue
        got = p.detach().float().numpy()
        if got.shape != want.shape or not np.array_equal(got, want):
            bad.append(f"{name}: differs from the checkpoint")
        n += 1
    if bad:
        die(f"{d}: {what} parameters not from the file: {bad[:5]} ({len(bad)} total)")
    print(f"  {what}: all {n} tensors equal to the checkpoint")


def layer_state(cache, cfg_text, i):
    """HF cache of layer i -> our golden tensors."""
    layer = cache.layers[i]
    out = {}
    if cfg_text["layer_types"][i] == "linear_attention":
        S = layer.recurrent_states[0][0]  # [Hv, dk, dv], key index first
        conv = layer.conv_states[0][0]  # [conv_dim, K]: the last K raw inputs
        K = cfg_text["linear_conv_kernel_dim"]
        assert conv.shape[-1] == K and S.shape[1] == cfg_text["linear_key_head_dim"]
        out["linear_attn.state"] = S.detach().float().numpy().copy()
        out["linear_attn.conv_state"] = conv[:, 1:].detach().float().numpy().copy()
    else:
        # [1, Hkv, T, hd] -> [T, Hkv, hd]
        out["self_attn.k"] = layer.keys[0].transpose(0, 1).detach().float().numpy().copy()
        out["self_attn.v"] = layer.values[0].transpose(0, 1).detach().float().numpy().copy()
    return out


def text_cfg(model):
    c = model.config
    c = getattr(c, "text_config", c)
    return {
        "layer_types": list(c.layer_types),
        "linear_conv_kernel_dim": c.linear_conv_kernel_dim,
        "linear_key_head_dim": c.linear_key_head_dim,
    }


class RouterGap:
    """Smallest gap between the k-th and (k+1)-th routing probability seen
    by any router: a tiny gap means another implementation may pick a
    different expert on rounding noise (worth knowing for parity tests)."""

    def __init__(self, model):
        self.min = float("inf")
        for mod in model.modules():
            if type(mod).__name__.endswith("TopKRouter"):
                mod.register_forward_hook(self.hook)

    def hook(self, mod, inp, out):
        import torch

        p = torch.softmax(out[0].float(), dim=-1)
        v = torch.topk(p, mod.top_k + 1, dim=-1).values
        self.min = min(self.min, float((v[:, -2] - v[:, -1]).min()))


def run_prompt(model, ids):
    import torch

    tc = text_cfg(model)
    with torch.no_grad():
        x = torch.tensor([ids])
        out = model(input_ids=x, use_cache=True)
        logits = out.logits[0].float().numpy().copy()
        cache = out.past_key_values
        states = {}
        for i in range(len(tc["layer_types"])):
            for k, v in layer_state(cache, tc, i).items():
                states[f"layers.{i}.{k}"] = v
        # greedy decode through HF's own cached single-token path
        greedy = [int(np.argmax(logits[-1]))]
        for _ in range(N_GREEDY - 1):
            o = model(input_ids=torch.tensor([[greedy[-1]]]), past_key_values=cache, use_cache=True)
            cache = o.past_key_values
            greedy.append(int(torch.argmax(o.logits[0, -1])))
        # the same tokens from one uncached pass: decode path == prefill path
        full = model(input_ids=torch.tensor([ids + greedy[:-1]]), use_cache=False).logits[0]
        check = [int(t) for t in torch.argmax(full[len(ids) - 1 :], dim=-1)]
        if check != greedy:
            die(f"cached greedy {greedy} != uncached argmax {check}")
        top2 = torch.topk(full[len(ids) - 1 :], 2, dim=-1).values
        margin = float((top2[:, 0] - top2[:, 1]).min())
    return logits, states, greedy, margin


def text_model(model):
    """The decoder stack (model.model for *ForCausalLM, the language model
    of a VLM wrapper)."""
    inner = model.model
    return getattr(inner, "language_model", inner)


def ref_weights(model):
    """A few weights in the engine's canonical layout (hp_layer_weights_t
    names), taken from the HF modules after loading. For Qwen3-Next the split
    projections come from HF's own fix_query_key_value_ordering applied to
    the fused matrices, so the engine's de-interleave is checked against
    transformers, not against gen_model.py."""
    import torch

    tm = text_model(model)
    c = getattr(model.config, "text_config", model.config)
    f = lambda t: t.detach().float().numpy().copy()  # noqa: E731
    out = {
        "weights.lm_head.rows": f(model.lm_head.weight[:4]),
        "weights.final_norm": f(tm.norm.weight),
    }
    li = c.layer_types.index("linear_attention")
    la = tm.layers[li].linear_attn
    p = f"weights.layers.{li}."
    if hasattr(la, "in_proj_qkvz"):
        with torch.no_grad():
            H = c.hidden_size
            q, k, v, z, b, a = la.fix_query_key_value_ordering(
                la.in_proj_qkvz.weight.T[None], la.in_proj_ba.weight.T[None]
            )
            # position c of the fake sequence = input column c
            cols = lambda t: t[0].reshape(H, -1).T  # noqa: E731
            out[p + "in_qkv"] = f(torch.cat([cols(q), cols(k), cols(v)]))
            out[p + "in_z"] = f(cols(z))
            out[p + "in_b"] = f(cols(b))
            out[p + "in_a"] = f(cols(a))
    else:
        out[p + "in_qkv"] = f(la.in_proj_qkv.weight)
        out[p + "in_z"] = f(la.in_proj_z.weight)
        out[p + "in_b"] = f(la.in_proj_b.weight)
        out[p + "in_a"] = f(la.in_proj_a.weight)
    out[p + "conv_w"] = f(la.conv1d.weight[:, 0, :])
    out[p + "A_log"] = f(la.A_log)
    out[p + "dt_bias"] = f(la.dt_bias)
    out[p + "gnorm"] = f(la.norm.weight)
    fi = c.layer_types.index("full_attention")
    sa = tm.layers[fi].self_attn
    p = f"weights.layers.{fi}."
    out[p + "q_norm"] = f(sa.q_norm.weight)
    out[p + "k_norm"] = f(sa.k_norm.weight)
    mlp = tm.layers[1].mlp
    p = "weights.layers.1."
    if hasattr(mlp, "experts"):
        e, im = 3, mlp.experts.gate_up_proj.shape[1] // 2
        out[p + "router"] = f(mlp.gate.weight)
        out[p + f"exp_gate.{e}"] = f(mlp.experts.gate_up_proj[e, :im])
        out[p + f"exp_up.{e}"] = f(mlp.experts.gate_up_proj[e, im:])
        out[p + f"exp_down.{e}"] = f(mlp.experts.down_proj[e])
        out[p + "sh_down"] = f(mlp.shared_expert.down_proj.weight)
        out[p + "sh_expert_gate"] = f(mlp.shared_expert_gate.weight[0])
    else:
        out[p + "down"] = f(mlp.down_proj.weight)
    return out


def golden(d):
    import torch
    import transformers
    from tokenizers import Tokenizer

    with open(os.path.join(d, "config.json")) as f:
        cfg = json.load(f)
    ckpt, _ = hflib.read_safetensors(os.path.join(d, "model.safetensors"))
    text_cls, full_cls = model_classes(cfg)
    print(f"{d}: {cfg['model_type']}")
    model = load_checked(text_cls, d, ckpt, r"^(mtp\.|model\.visual\.)")
    full = load_checked(full_cls, d, ckpt, r"^mtp\.") if full_cls else None

    tok = Tokenizer.from_file(os.path.join(d, "tokenizer.json"))
    gap = RouterGap(model)
    tensors = []
    for i, text in enumerate(PROMPTS):
        ids = tok.encode(text).ids
        gap.min = float("inf")
        logits, states, greedy, margin = run_prompt(model, ids)
        if full is not None:
            with torch.no_grad():
                lf = full(input_ids=torch.tensor([ids])).logits[0].numpy()
            err = float(np.abs(lf - logits).max())
            if err > 1e-4:
                die(f"{full_cls.__name__} and {text_cls.__name__} disagree by {err}")
        rg = f", min router gap {gap.min:.3g}" if gap.min < float("inf") else ""
        print(f"  prompt {i}: {len(ids)} tokens, greedy {greedy}, min top-2 margin {margin:.3g}{rg}")
        p = f"prompt.{i}."
        tensors += [
            (p + "ids", "I32", np.array(ids, np.int32)),
            (p + "logits", "F32", logits),
            (p + "greedy", "I32", np.array(greedy, np.int32)),
        ]
        tensors += [(p + k, "F32", v) for k, v in sorted(states.items(), key=lambda kv: kv[0])]
    tensors += [(k, "F32", v) for k, v in ref_weights(model).items()]
    meta = {
        "format": GOLDEN_FORMAT,
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "model_class": text_cls.__name__,
        "n_prompts": len(PROMPTS),
        "prompts": json.dumps(PROMPTS, ensure_ascii=False),
    }
    path = os.path.join(d, "golden.safetensors")
    hflib.write_safetensors(path, tensors, meta)
    print(f"  wrote {path} ({os.path.getsize(path)} bytes)")


def main():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    dirs = sys.argv[1:] or sorted(
        os.path.dirname(p) for p in glob.glob(os.path.join(root, "models", "test", "*", "config.json"))
    )
    if not dirs:
        die("no model directories")
    import torch

    torch.manual_seed(0)
    for d in dirs:
        golden(d)


if __name__ == "__main__":
    main()
