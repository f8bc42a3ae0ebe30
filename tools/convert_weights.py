#!/usr/bin/env python3
"""convert_weights.py - rewrite an HF checkpoint directory in another of the
engine's weight formats (README "Weight formats"): still config.json +
model.safetensors, loaded by the same code path.

  tools/convert_weights.py --to int8 [--group 64] SRC DST
  tools/convert_weights.py --to bf16 SRC DST
  tools/convert_weights.py --to f32 SRC DST

--to int8: every projection matrix of the language model (the *proj*
weights, the fused 3-D experts, embed_tokens and lm_head) becomes an I8
tensor of the same name and shape plus "<name>_scale", F32 [..., rows,
cols / g]: symmetric, per output row and group of g consecutive input
columns, scale = max|W_group| / 127, q = round(W / scale). g is --group, or
the largest divisor of the row length that divides --group when it does not
divide the row. Other tensors (norms, conv, gates, router, mtp.*, visual.*)
are copied as they are. config.json gets quantization_config
{"quant_method": "hypic_int8", "bits": 8, "group_size": g, ...}.
--to bf16 / f32: every floating tensor in that type (f32 -> bf16 rounds to
nearest even; bf16 -> f32 is exact); I8 sources are dequantized first.

Streams tensor by tensor (numpy memmap), so memory stays near one tensor.
"""

import argparse
import json
import math
import os
import re
import shutil
import struct
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hflib  # noqa: E402

SCALE_SUFFIX = "_scale"
METHOD = "hypic_int8"
# projection matrices of the language model; mtp.* and the vision tower
# are not the engine's and stay as they are
PROJ = re.compile(r"(embed_tokens\.weight|lm_head\.weight|proj[a-z_]*\.weight|experts\.(gate_up|down)_proj)$")
SKIP = re.compile(r"^(mtp\.|model\.visual\.|visual\.)")

NP = {"F32": np.float32, "F16": np.float16, "F64": np.float64, "I8": np.int8,
      "I32": np.int32, "I64": np.int64, "BF16": np.uint16}
SIZE = {"F32": 4, "F16": 2, "BF16": 2, "F64": 8, "I8": 1, "I32": 4, "I64": 8}


def open_st(path):
    """(header without __metadata__, metadata, data memmap)"""
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
    meta = header.pop("__metadata__", {})
    data = np.memmap(path, dtype=np.uint8, mode="r", offset=8 + n)
    return header, meta, data


def source_tensors(src):
    """{name: (entry, memmap)} over model.safetensors or the index's shards."""
    single = os.path.join(src, "model.safetensors")
    if os.path.exists(single):
        files = ["model.safetensors"]
    else:
        with open(os.path.join(src, "model.safetensors.index.json")) as f:
            files = sorted(set(json.load(f)["weight_map"].values()))
    out = {}
    for fn in files:
        header, _, data = open_st(os.path.join(src, fn))
        for name, e in header.items():
            out[name] = (e, data)
    return out


def read(entry, data):
    b, e = entry["data_offsets"]
    a = np.frombuffer(data[b:e], dtype=NP[entry["dtype"]]).reshape(entry["shape"])
    return a


def as_f32(tensors, name):
    """A floating (or I8 with scales) tensor as f32."""
    e, data = tensors[name]
    a = read(e, data)
    if e["dtype"] == "BF16":
        return hflib.bf16_bits_to_f32(a)
    if e["dtype"] == "I8":
        s = as_f32(tensors, name + SCALE_SUFFIX)
        g = a.shape[-1] // s.shape[-1]
        return (a.astype(np.float32).reshape(*s.shape, g) * s[..., None]).reshape(a.shape)
    return a.astype(np.float32)


def quantize(w, g):
    """Symmetric int8 per group of g along the last axis: (q, scales)."""
    shp = w.shape
    wg = w.reshape(*shp[:-1], shp[-1] // g, g)
    mx = np.abs(wg).max(axis=-1)
    scale = (mx / 127.0).astype(np.float32)
    safe = np.where(scale > 0, scale, 1.0).astype(np.float32)
    q = np.clip(np.rint(wg / safe[..., None]), -127, 127).astype(np.int8)
    return q.reshape(shp), scale


def plan(tensors, to, group):
    """[(name, dtype, shape, producer)] of the output, in name order."""
    out = []
    for name in sorted(tensors):
        e, _ = tensors[name]
        dt, shp = e["dtype"], e["shape"]
        if name.endswith(SCALE_SUFFIX) and name[: -len(SCALE_SUFFIX)] in tensors:
            continue  # written with (or dequantized into) its matrix
        floating = dt in ("F32", "F16", "BF16", "F64") or (
            dt == "I8" and name + SCALE_SUFFIX in tensors)
        if to == "int8" and floating and PROJ.search(name) and not SKIP.match(name) \
                and len(shp) in (2, 3):
            g = math.gcd(shp[-1], group)
            sshape = shp[:-1] + [shp[-1] // g]
            out.append((name, "I8", shp, ("q", g)))
            out.append((name + SCALE_SUFFIX, "F32", sshape, ("s", g)))
        elif to in ("bf16", "f32") and floating:
            out.append((name, "BF16" if to == "bf16" else "F32", shp, ("f", 0)))
        else:
            out.append((name, dt, shp, ("copy", 0)))
    return out


def write(dst_file, tensors, items, meta):
    header, off = {}, 0
    if meta:
        header["__metadata__"] = meta
    for name, dt, shp, _ in items:
        n = int(np.prod(shp)) * SIZE[dt]
        header[name] = {"dtype": dt, "shape": shp, "data_offsets": [off, off + n]}
        off += n
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    cache = {}
    with open(dst_file, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for name, dt, shp, (how, g) in items:
            if how == "copy":
                e, data = tensors[name]
                b, en = e["data_offsets"]
                f.write(bytes(data[b:en]))
            elif how == "q":
                q, s = quantize(as_f32(tensors, name), g)
                cache[name + SCALE_SUFFIX] = s
                f.write(q.tobytes())
            elif how == "s":
                f.write(cache.pop(name).astype("<f4").tobytes())
            elif dt == "BF16":
                f.write(hflib.f32_to_bf16_bits(as_f32(tensors, name)).tobytes())
            else:
                f.write(as_f32(tensors, name).astype("<f4").tobytes())


def fix_config(cfg, to, group):
    dtype = {"bf16": "bfloat16", "f32": "float32"}.get(to)
    for c in (cfg, cfg.get("text_config")):
        if not isinstance(c, dict):
            continue
        c.pop("quantization_config", None)
        for k in ("dtype", "torch_dtype"):
            if dtype and k in c:
                c[k] = dtype
    if to == "int8":
        cfg["quantization_config"] = {
            "quant_method": METHOD,
            "bits": 8,
            "symmetric": True,
            "group_size": group,
            "scale_suffix": SCALE_SUFFIX,
            "scale_dtype": "float32",
            "modules": PROJ.pattern,
        }
    return cfg


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--to", choices=["int8", "bf16", "f32"], required=True)
    p.add_argument("--group", type=int, default=64, help="int8: input columns per scale")
    p.add_argument("src")
    p.add_argument("dst")
    args = p.parse_args(argv)
    if args.group < 1:
        p.error("--group must be positive")
    if os.path.abspath(args.src) == os.path.abspath(args.dst):
        p.error("SRC and DST must differ")
    os.makedirs(args.dst, exist_ok=True)
    tensors = source_tensors(args.src)
    items = plan(tensors, args.to, args.group)
    with open(os.path.join(args.src, "config.json")) as f:
        cfg = json.load(f)
    cfg = fix_config(cfg, args.to, args.group)
    for fn in sorted(os.listdir(args.src)):
        path = os.path.join(args.src, fn)
        if os.path.isfile(path) and not fn.endswith(".safetensors") and \
                fn not in ("config.json", "model.safetensors.index.json"):
            shutil.copyfile(path, os.path.join(args.dst, fn))
    with open(os.path.join(args.dst, "config.json"), "w", encoding="utf-8") as f:
        json.dump(cfg, f, indent=2, ensure_ascii=False)
        f.write("\n")
    write(os.path.join(args.dst, "model.safetensors"), tensors, items, {"format": "pt"})
    size = os.path.getsize(os.path.join(args.dst, "model.safetensors"))
    print(f"{args.dst}: {len(items)} tensors, {size / 1e6:.1f} MB, weights {args.to}"
          + (f" (group {args.group})" if args.to == "int8" else ""))


if __name__ == "__main__":
    main()
