#!/usr/bin/env python3
"""gen_model.py - write a small random-weight hybrid checkpoint in exact HF
layout (config.json, model.safetensors, tokenizer.json, tokenizer_config.json,
generation_config.json), without transformers: numpy + tools/hflib.py.

Flavours (reference §1-2):
  --arch qwen3_next   flat config, fused in_proj_qkvz / in_proj_ba, per-expert
                      MoE + shared expert, rope fields at top level
  --arch qwen3_5      flat qwen3_5_text config (or --wrapper), split GDN
                      projections, dense SwiGLU
  --arch qwen3_5_moe  like qwen3_5 with MoE on every layer; experts fused 3-D
                      (--fused-experts) or per-expert
  --wrapper           Qwen3.5 VLM form: text_config + vision_config, LM under
                      model.language_model., a tiny real vision tower under
                      model.visual. (ignored by the text engine)

Example (the committed models: see models/README.md):
  tools/gen_model.py --arch qwen3_5 --hidden 64 --layers 4 --tied \
      --out models/test/qwen35-dense
"""

import argparse
import json
import math
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hflib  # noqa: E402


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    a = p.add_argument
    a("--arch", choices=["qwen3_5", "qwen3_5_moe", "qwen3_next"], required=True)
    a("--hidden", type=int, default=64)
    a("--layers", type=int, default=4)
    a("--full-interval", type=int, default=4, help="full attention every n-th layer")
    a("--heads", type=int, default=4)
    a("--kv-heads", type=int, default=2)
    a("--head-dim", type=int, default=32)
    a("--partial-rotary", type=float, default=0.25)
    a("--rope-theta", type=float, default=1e7)
    a("--lin-k-heads", type=int, default=2)
    a("--lin-v-heads", type=int, default=4)
    a("--lin-k-dim", type=int, default=16)
    a("--lin-v-dim", type=int, default=16)
    a("--conv-kernel", type=int, default=4)
    a("--intermediate", type=int, default=128)
    a("--experts", type=int, default=8)
    a("--topk", type=int, default=2)
    a("--moe-intermediate", type=int, default=32)
    a("--shared-intermediate", type=int, default=32)
    a("--vocab", type=int, default=0, help="padded vocab (default: tokenizer size rounded up to 64)")
    a("--merges", type=int, default=240, help="BPE merges to learn")
    a("--dtype", choices=["f32", "bf16"], default="f32")
    a("--fused-experts", action="store_true", help="qwen3_5_moe form mlp.experts.gate_up_proj")
    a("--wrapper", action="store_true", help="Qwen3.5 VLM config with text_config")
    a("--tied", action="store_true", help="tie lm_head to the embedding (no lm_head.weight)")
    a("--mtp", action="store_true",
      help="add a one-layer multi-token-prediction head (mtp.*, ignored by loaders)")
    a("--rms-eps", type=float, default=1e-6)
    a("--seed", type=int, default=0)
    a("--max-positions", type=int, default=4096, help="max_position_embeddings in the config")
    a("--fast", action="store_true",
      help="draw the weights in f32 on every core (other numbers than without it, same "
           "distributions and format): multi-GB benchmark checkpoints in seconds")
    a("--out", required=True)
    args = p.parse_args(argv)
    if args.wrapper and args.arch == "qwen3_next":
        p.error("--wrapper is a Qwen3.5 form")
    if args.lin_v_heads % args.lin_k_heads or args.heads % args.kv_heads:
        p.error("heads must divide evenly (Hv % Hk, Hq % Hkv)")
    return args


def layer_types(args):
    return [
        "full_attention" if (i + 1) % args.full_interval == 0 else "linear_attention"
        for i in range(args.layers)
    ]


def make_tokenizer(args):
    pattern = hflib.QWEN2_REGEX if args.arch == "qwen3_next" else hflib.QWEN35_REGEX
    vocab, merges = hflib.train_bpe(hflib.CORPUS, args.merges, pattern)
    # Qwen-Next era files store merges as "a b" strings, newer ones as pairs
    tok = hflib.tokenizer_json(vocab, merges, pattern, merges_as_pairs=args.arch != "qwen3_next")
    n_tok = len(vocab) + len(hflib.SPECIAL_TOKENS)
    ids = {t: len(vocab) + i for i, t in enumerate(hflib.SPECIAL_TOKENS)}
    return tok, n_tok, ids


def tokenizer_config(ids):
    return {
        "add_bos_token": False,
        "add_prefix_space": False,
        "added_tokens_decoder": {
            str(i): {
                "content": t,
                "lstrip": False,
                "normalized": False,
                "rstrip": False,
                "single_word": False,
                "special": True,
            }
            for t, i in ids.items()
        },
        "bos_token": None,
        "chat_template": hflib.CHAT_TEMPLATE,
        "clean_up_tokenization_spaces": False,
        "eos_token": "<|im_end|>",
        "errors": "replace",
        "model_max_length": 262144,
        "pad_token": "<|endoftext|>",
        "split_special_tokens": False,
        "tokenizer_class": "Qwen2Tokenizer",
        "unk_token": None,
    }


def text_config(args, vocab, ids):
    rot = int(args.head_dim * args.partial_rotary)
    c = {
        "vocab_size": vocab,
        "hidden_size": args.hidden,
        "num_hidden_layers": args.layers,
        "num_attention_heads": args.heads,
        "num_key_value_heads": args.kv_heads,
        "head_dim": args.head_dim,
        "hidden_act": "silu",
        "rms_norm_eps": args.rms_eps,
        "max_position_embeddings": args.max_positions,
        "initializer_range": 0.02,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "linear_num_key_heads": args.lin_k_heads,
        "linear_num_value_heads": args.lin_v_heads,
        "linear_key_head_dim": args.lin_k_dim,
        "linear_value_head_dim": args.lin_v_dim,
        "linear_conv_kernel_dim": args.conv_kernel,
        "full_attention_interval": args.full_interval,
        "tie_word_embeddings": args.tied,
        "use_cache": True,
        "dtype": "bfloat16" if args.dtype == "bf16" else "float32",
    }
    if args.arch == "qwen3_next":
        # the original Qwen3-Next layout: rope at top level, no layer_types
        c.update(
            model_type="qwen3_next",
            rope_theta=args.rope_theta,
            partial_rotary_factor=args.partial_rotary,
            rope_scaling=None,
            intermediate_size=args.intermediate,
            num_experts=args.experts,
            num_experts_per_tok=args.topk,
            moe_intermediate_size=args.moe_intermediate,
            shared_expert_intermediate_size=args.shared_intermediate,
            decoder_sparse_step=1,
            mlp_only_layers=[],
            norm_topk_prob=True,
            output_router_logits=False,
            router_aux_loss_coef=0.001,
            bos_token_id=ids["<|endoftext|>"],
            eos_token_id=ids["<|im_end|>"],
        )
        return c
    # Qwen3.5: rope_parameters with M-RoPE sections summing to rot/2
    half = rot // 2
    sec = [half - 2 * (half // 3), half // 3, half // 3]
    c.update(
        model_type="qwen3_5_moe_text" if args.arch == "qwen3_5_moe" else "qwen3_5_text",
        rope_parameters={
            "rope_type": "default",
            "rope_theta": args.rope_theta,
            "partial_rotary_factor": args.partial_rotary,
            "mrope_section": sec,
            "mrope_interleaved": True,
        },
        layer_types=layer_types(args),
        attn_output_gate=True,
        mamba_ssm_dtype="float32",
        # what the tensors hold: converters (llama.cpp's) look for the
        # head's tensors when a layer is declared
        mtp_num_hidden_layers=1 if args.mtp else 0,
        mtp_use_dedicated_embeddings=False,
        bos_token_id=None,
        eos_token_id=[ids["<|im_end|>"], ids["<|endoftext|>"]],
    )
    if args.arch == "qwen3_5":
        c["intermediate_size"] = args.intermediate
    else:
        c.update(
            num_experts=args.experts,
            num_experts_per_tok=args.topk,
            moe_intermediate_size=args.moe_intermediate,
            shared_expert_intermediate_size=args.shared_intermediate,
            output_router_logits=False,
            router_aux_loss_coef=0.001,
        )
        # the wrapper keeps a single eos in text_config, like the releases
        if args.wrapper:
            c["eos_token_id"] = ids["<|endoftext|>"]
    return c


# a vision tower small enough to ship, in Qwen3.5's real tensor layout
VISION = {
    "depth": 1,
    "hidden_size": 16,
    "intermediate_size": 32,
    "num_heads": 2,
    "in_channels": 3,
    "patch_size": 2,
    "spatial_merge_size": 2,
    "temporal_patch_size": 2,
    "num_position_embeddings": 16,
    "hidden_act": "gelu_pytorch_tanh",
    "initializer_range": 0.02,
}


def config(args, vocab, ids):
    tc = text_config(args, vocab, ids)
    if not args.wrapper:
        arch = {
            "qwen3_next": "Qwen3NextForCausalLM",
            "qwen3_5": "Qwen3_5ForCausalLM",
            "qwen3_5_moe": "Qwen3_5MoeForCausalLM",
        }[args.arch]
        return dict(architectures=[arch], **tc)
    moe = args.arch == "qwen3_5_moe"
    vc = dict(VISION, out_hidden_size=args.hidden)
    vc["model_type"] = "qwen3_5_moe_vision" if moe else "qwen3_5_vision"
    return {
        "architectures": ["Qwen3_5MoeForConditionalGeneration" if moe else "Qwen3_5ForConditionalGeneration"],
        "model_type": "qwen3_5_moe" if moe else "qwen3_5",
        "text_config": tc,
        "vision_config": vc,
        "image_token_id": vocab - 4,
        "video_token_id": vocab - 3,
        "vision_start_token_id": vocab - 2,
        "vision_end_token_id": vocab - 1,
        "tie_word_embeddings": args.tied,
    }


class Init:
    """Random weights that keep a tiny model numerically alive: unit-scale
    activations, decays from ~0.999 to ~0 per step, decisive routing."""

    def __init__(self, seed, fast=False):
        self.rng = np.random.default_rng(seed)
        # fast: each array drawn in pieces, each piece from its own stream
        # (spawned in order, so a seed still names one checkpoint)
        self.seeds = np.random.SeedSequence(seed) if fast else None

    def normal(self, shape, std):
        if self.seeds is None:
            return (self.rng.standard_normal(shape) * std).astype(np.float32)
        out = np.empty(int(np.prod(shape, dtype=np.int64)), np.float32)
        n = (out.size + hflib.PIECE - 1) // hflib.PIECE
        streams = dict(zip(range(0, out.size, hflib.PIECE), self.seeds.spawn(n)))

        def part(s):
            np.random.Generator(np.random.PCG64(streams[s.start])).standard_normal(
                out=out[s], dtype=np.float32)
            out[s] *= np.float32(std)

        hflib.pieces(out.size, part)
        return out.reshape(shape)

    def lin(self, out, inp, gain=1.0):
        return self.normal((out, inp), gain / math.sqrt(inp))

    def zc_norm(self, n):  # zero-centred RMSNorm weight, used as (1 + w)
        return self.normal((n,), 0.1)


def gdn_tensors(args, ini, pre):
    H, Hk, Hv = args.hidden, args.lin_k_heads, args.lin_v_heads
    dk, dv = args.lin_k_dim, args.lin_v_dim
    kd, vd = Hk * dk, Hv * dv
    conv_dim = 2 * kd + vd
    q, k = ini.lin(kd, H), ini.lin(kd, H)
    v, z = ini.lin(vd, H), ini.lin(vd, H)
    b = ini.lin(Hv, H)  # beta = sigmoid(b): mostly in (0.15, 0.85)
    a = ini.lin(Hv, H, 0.5)
    t = []
    if args.arch == "qwen3_next":
        # fused, interleaved per key-head group (reference §2.3)
        r = Hv // Hk
        rows, ba = [], []
        for g in range(Hk):
            rows += [q[g * dk : (g + 1) * dk], k[g * dk : (g + 1) * dk]]
            rows += [v[g * r * dv : (g + 1) * r * dv], z[g * r * dv : (g + 1) * r * dv]]
            ba += [b[g * r : (g + 1) * r], a[g * r : (g + 1) * r]]
        t += [
            (pre + "in_proj_qkvz.weight", np.concatenate(rows)),
            (pre + "in_proj_ba.weight", np.concatenate(ba)),
        ]
    else:
        t += [
            (pre + "in_proj_qkv.weight", np.concatenate([q, k, v])),
            (pre + "in_proj_z.weight", z),
            (pre + "in_proj_b.weight", b),
            (pre + "in_proj_a.weight", a),
        ]
    A = ini.rng.uniform(1.0, 16.0, Hv)
    # dt_bias spread evenly over [-7, 1] (shuffled, jittered) so every layer
    # has a long-memory head (softplus(-7) * A <= 0.015: decay >= 0.985 per
    # step) and a fast one (decay ~ 0.2 .. 1e-9)
    dt = np.linspace(-7.0, 1.0, Hv) + ini.rng.uniform(-0.3, 0.3, Hv)
    dt = dt[ini.rng.permutation(Hv)].astype(np.float32)
    t += [
        (pre + "conv1d.weight", ini.normal((conv_dim, 1, args.conv_kernel), 0.3)),
        (pre + "dt_bias", dt),
        (pre + "A_log", np.log(A).astype(np.float32)),
        (pre + "norm.weight", (1.0 + ini.normal((dv,), 0.1)).astype(np.float32)),
        (pre + "out_proj.weight", ini.lin(H, vd, 0.5)),
    ]
    return t


def attn_tensors(args, ini, pre):
    H, hd = args.hidden, args.head_dim
    return [
        (pre + "q_proj.weight", ini.lin(args.heads * 2 * hd, H)),
        (pre + "k_proj.weight", ini.lin(args.kv_heads * hd, H)),
        (pre + "v_proj.weight", ini.lin(args.kv_heads * hd, H)),
        (pre + "o_proj.weight", ini.lin(H, args.heads * hd, 0.5)),
        (pre + "q_norm.weight", ini.zc_norm(hd)),
        (pre + "k_norm.weight", ini.zc_norm(hd)),
    ]


def mlp_tensors(args, ini, pre, width):
    H = args.hidden
    return [
        (pre + "gate_proj.weight", ini.lin(width, H)),
        (pre + "up_proj.weight", ini.lin(width, H)),
        (pre + "down_proj.weight", ini.lin(H, width, 0.5)),
    ]


def moe_tensors(args, ini, pre):
    H, E, Im = args.hidden, args.experts, args.moe_intermediate
    t = [(pre + "gate.weight", ini.lin(E, H, 2.0))]  # router: few near-ties
    gate = np.stack([ini.lin(Im, H) for _ in range(E)])
    up = np.stack([ini.lin(Im, H) for _ in range(E)])
    down = np.stack([ini.lin(H, Im, 0.5) for _ in range(E)])
    if args.fused_experts:
        t += [
            (pre + "experts.gate_up_proj", np.concatenate([gate, up], axis=1)),
            (pre + "experts.down_proj", down),
        ]
    else:
        for e in range(E):
            t += [
                (pre + f"experts.{e}.gate_proj.weight", gate[e]),
                (pre + f"experts.{e}.up_proj.weight", up[e]),
                (pre + f"experts.{e}.down_proj.weight", down[e]),
            ]
    if args.shared_intermediate:
        t += mlp_tensors(args, ini, pre + "shared_expert.", args.shared_intermediate)
        t += [(pre + "shared_expert_gate.weight", ini.lin(1, H))]
    return t


def vision_tensors(args, ini):
    v, pre = VISION, "model.visual."
    hs, m2 = v["hidden_size"], v["spatial_merge_size"] ** 2
    pt, pp = v["temporal_patch_size"], v["patch_size"]
    t = [
        (pre + "patch_embed.proj.weight", ini.normal((hs, v["in_channels"], pt, pp, pp), 0.02)),
        (pre + "patch_embed.proj.bias", ini.normal((hs,), 0.02)),
        (pre + "pos_embed.weight", ini.normal((v["num_position_embeddings"], hs), 0.02)),
    ]
    for i in range(v["depth"]):
        b = f"{pre}blocks.{i}."
        t += [
            (b + "norm1.weight", np.ones(hs, np.float32)),
            (b + "norm1.bias", np.zeros(hs, np.float32)),
            (b + "norm2.weight", np.ones(hs, np.float32)),
            (b + "norm2.bias", np.zeros(hs, np.float32)),
            (b + "attn.qkv.weight", ini.lin(3 * hs, hs)),
            (b + "attn.qkv.bias", np.zeros(3 * hs, np.float32)),
            (b + "attn.proj.weight", ini.lin(hs, hs)),
            (b + "attn.proj.bias", np.zeros(hs, np.float32)),
            (b + "mlp.linear_fc1.weight", ini.lin(v["intermediate_size"], hs)),
            (b + "mlp.linear_fc1.bias", np.zeros(v["intermediate_size"], np.float32)),
            (b + "mlp.linear_fc2.weight", ini.lin(hs, v["intermediate_size"])),
            (b + "mlp.linear_fc2.bias", np.zeros(hs, np.float32)),
        ]
    t += [
        (pre + "merger.norm.weight", np.ones(hs, np.float32)),
        (pre + "merger.norm.bias", np.zeros(hs, np.float32)),
        (pre + "merger.linear_fc1.weight", ini.lin(hs * m2, hs * m2)),
        (pre + "merger.linear_fc1.bias", np.zeros(hs * m2, np.float32)),
        (pre + "merger.linear_fc2.weight", ini.lin(args.hidden, hs * m2)),
        (pre + "merger.linear_fc2.bias", np.zeros(args.hidden, np.float32)),
    ]
    return t


def mtp_tensors(args, ini):
    """The multi-token-prediction head as real checkpoints hold it: fc over
    [embedding; hidden], its norms and one full-attention decoder layer
    (mtp.layers.0, with the model's kind of MLP). Skipped by every text
    loader (HF included). Drawn last, so the other tensors do not depend on
    --mtp."""
    H = args.hidden
    t = [
        ("mtp.fc.weight", ini.lin(H, 2 * H)),
        ("mtp.pre_fc_norm_embedding.weight", ini.zc_norm(H)),
        ("mtp.pre_fc_norm_hidden.weight", ini.zc_norm(H)),
        ("mtp.norm.weight", ini.zc_norm(H)),
    ]
    lp = "mtp.layers.0."
    t += [
        (lp + "input_layernorm.weight", ini.zc_norm(H)),
        (lp + "post_attention_layernorm.weight", ini.zc_norm(H)),
    ]
    t += attn_tensors(args, ini, lp + "self_attn.")
    if args.arch == "qwen3_5":
        t += mlp_tensors(args, ini, lp + "mlp.", args.intermediate)
    else:
        t += moe_tensors(args, ini, lp + "mlp.")
    return t


def weights(args, vocab, n_tok):
    ini = Init(args.seed, args.fast)
    pre = "model.language_model." if args.wrapper else "model."
    H = args.hidden
    # rows past the tokenizer are padding: zero, so their logit (0) never
    # wins a greedy step against the ~N(0, 3^2) logits of real tokens
    embed = ini.normal((vocab, H), 0.3)
    embed[n_tok:] = 0.0
    t = [(pre + "embed_tokens.weight", embed)]
    for i, kind in enumerate(layer_types(args)):
        lp = f"{pre}layers.{i}."
        t += [
            (lp + "input_layernorm.weight", ini.zc_norm(H)),
            (lp + "post_attention_layernorm.weight", ini.zc_norm(H)),
        ]
        if kind == "linear_attention":
            t += gdn_tensors(args, ini, lp + "linear_attn.")
        else:
            t += attn_tensors(args, ini, lp + "self_attn.")
        if args.arch == "qwen3_5":
            t += mlp_tensors(args, ini, lp + "mlp.", args.intermediate)
        else:
            t += moe_tensors(args, ini, lp + "mlp.")
    t += [(pre + "norm.weight", ini.zc_norm(H))]
    if not args.tied:
        head = ini.normal((vocab, H), 0.3)
        head[n_tok:] = 0.0
        t += [("lm_head.weight", head)]
    if args.wrapper:
        t += vision_tensors(args, ini)
    if args.mtp:
        t += mtp_tensors(args, ini)
    return t


def main(argv=None):
    args = parse_args(argv)
    tok, n_tok, ids = make_tokenizer(args)
    vocab = args.vocab or (n_tok + 63) // 64 * 64
    if vocab < n_tok:
        sys.exit(f"gen_model: --vocab {vocab} < tokenizer size {n_tok}")
    os.makedirs(args.out, exist_ok=True)

    def dump(name, obj):
        with open(os.path.join(args.out, name), "w", encoding="utf-8") as f:
            json.dump(obj, f, indent=2, ensure_ascii=False)
            f.write("\n")

    dump("config.json", config(args, vocab, ids))
    dump("tokenizer.json", tok)
    dump("tokenizer_config.json", tokenizer_config(ids))
    gen = {"bos_token_id": ids["<|endoftext|>"], "eos_token_id": [ids["<|im_end|>"], ids["<|endoftext|>"]],
           "pad_token_id": ids["<|endoftext|>"], "do_sample": False}
    dump("generation_config.json", gen)

    dt = "BF16" if args.dtype == "bf16" else "F32"
    tensors = [(n, dt, a) for n, a in weights(args, vocab, n_tok)]
    hflib.write_safetensors(os.path.join(args.out, "model.safetensors"), tensors, {"format": "pt"})

    # the tokenizer must load in HF tokenizers and round-trip text
    from tokenizers import Tokenizer

    t = Tokenizer.from_file(os.path.join(args.out, "tokenizer.json"))
    sample = "Hello, world! <|im_start|>user\nWhat is 2024?<|im_end|>"
    enc = t.encode(sample)
    if t.decode(enc.ids, skip_special_tokens=False) != sample:
        sys.exit("gen_model: tokenizer does not round-trip")
    if t.get_vocab_size(with_added_tokens=True) != n_tok:
        sys.exit("gen_model: tokenizer size mismatch")
    n = sum(int(np.prod(a.shape)) for _, _, a in tensors)
    print(f"{args.out}: {args.arch}{' wrapper' if args.wrapper else ''}, {n} params ({dt}), "
          f"tokenizer {n_tok} tokens ({len(tok['model']['merges'])} merges), vocab {vocab}")


if __name__ == "__main__":
    main()
