#!/usr/bin/env python3
"""The choices a device run settles, side by side (tools/device-check.sh
appends this to device-check.md; kernels/cuda/README.md, "The next device
session", says what each choice sets).

For each choice: the candidates' median times from gpu_kernels' bench.tsv
at each shape, each with its speed-up over the current default (default ms
/ candidate ms), the anchor's time from kernels.tsv where the run has one,
and per candidate its speed-up over the shapes where it and the default
both ran (total time against total time) and the shapes it wins. A row
that did not run (skipped by the budget, failed) is "-" and left out of
the totals. The T_C table gives each variant's time with T_C over its time
without (target 1.20 at most).

    device_decide.py --bench bench.tsv [--kernels kernels.tsv]

Prints markdown. Nothing here decides by itself: which kernel becomes a
default is a commit, made by someone who read these tables and the tests.
"""
import argparse
import sys

# title, the default's op, the candidates' ops, the shapes kept (params
# filter), the anchor in kernels.tsv, what the choice sets
CHOICES = [
    ("Decode step, B >= 64 (target: 85 % of copy)", "gdn_step_pipe",
     ["gdn_step_pipea", "gdn_step_pipew", "gdn_step_kh", "gdn_step_pipe32"],
     lambda p: int(p.get("B", "0")) >= 64,
     "fla fused_recurrent_gated_delta_rule bf16",
     "hk_step_resolve's default (HYPIC_CUDA_STEP)"),
    ("GDN chunk, bf16 in (target: FLA bf16's time or less)", "gdn_chunk_bf16",
     ["gdn_chunk_bf16_ov", "gdn_chunk_bf16_a3", "gdn_chunk_bf16_ro",
      "gdn_chunk_bf16_a3ro", "gdn_chunk_bf16_r64", "gdn_chunk_bf16_deep",
      "gdn_chunk_bf16_o64", "gdn_chunk_bf16_w8", "gdn_chunk_bf16_fast",
      "gdn_chunk_bf16_fasta"],
     lambda p: True, "fla chunk_gated_delta_rule bf16",
     "hk_tc_plan_for's flags"),
    ("GDN chunk, the engine's call (f32 in, rounded once)",
     "gdn_chunk_f32mma_bf16in",
     ["gdn_chunk_f32mma_bf16in_ov", "gdn_chunk_f32mma_bf16in_a3ro",
      "gdn_chunk_f32mma_bf16in_r64", "gdn_chunk_f32mma_bf16in_deep",
      "gdn_chunk_f32mma_bf16in_w8"],
     lambda p: True, "fla chunk_gated_delta_rule bf16",
     "backend_cuda.c's auto mode"),
    ("Attention prefill, bf16 operands (target: 0.7x SDPA bf16's speed)",
     "attention_prefill_flash3seq",
     ["attention_prefill_flash3ws", "attention_prefill_flash3"],
     lambda p: True, "torch sdpa bf16", "hk_att_resolve's DEFAULT_BF16"),
    # the decode step's launches (sessions 22, 23): the one launch the
    # engine now runs against the ones it replaced (bit for bit theirs on
    # the emulator; HYPIC_CUDA_GEMV=0 still runs cuBLAS)
    ("Few-row bf16 projections (decode): one GEMV launch or cuBLAS",
     "matmul_bf16_gemv", ["matmul_bf16"],
     lambda p: int(p.get("n", "0")) <= 4, "torch matmul bf16",
     "cu_project_staged's rows (HK_CUDA_GEMV_ROWS; HYPIC_CUDA_GEMV)"),
    ("A GDN layer's four in-projections (decode)", "matmul_bf16_n4_gemv",
     ["matmul_bf16_n4"], lambda p: True, "-", "cu_project_staged's parts"),
    ("A dense MLP's gate, up and SwiGLU (decode)", "matmul_bf16_swiglu_gemv",
     ["matmul_bf16_swiglu"], lambda p: True, "-",
     "cu_mlp_acc_bf16's few-row branch"),
    ("The decode step's GDN input path (the KVBuffer step's)",
     "gdn_step_input_fused", ["gdn_step_input"], lambda p: True, "-",
     "hp_backend_conv_qkv_decode on the device"),
    ("An attention layer's prologue (split, q / k norms, RoPE)",
     "prefill_qk_norm_rope", ["prefill_qk_norm_rope_unfused"],
     lambda p: True, "-", "hp_backend_qk_norm_rope on the device"),
]

# T_C's cost: op_tc over op, per shape
TC_OPS = ["gdn_chunk_bf16", "gdn_chunk_bf16_r64", "gdn_chunk_bf16_ov",
          "gdn_chunk_bf16_w8", "gdn_chunk_f32mma_bf16in",
          "gdn_chunk_f32mma_bf16in_r64", "gdn_chunk_f32mma_bf16in_ov"]
TC_TARGET = 1.20


def number(s):
    """A positive float, else None ("-", skipped, an error's -1)."""
    try:
        x = float(s)
    except (TypeError, ValueError):
        return None
    return x if x > 0 else None


def params_of(s):
    return dict(kv.split("=", 1) for kv in s.split(",") if "=" in kv)


def read_bench(path):
    """{(op, model, params): ms} of the measured rows, and copy's GB/s."""
    rows, copy = {}, None
    with open(path) as f:
        for line in f:
            c = line.rstrip("\n").split("\t")
            if len(c) < 7 or c[0] in ("op", "device"):
                continue
            if c[0] == "copy_d2d":
                copy = number(c[6]) or copy
            ms = number(c[3])
            if ms is not None:
                rows.setdefault((c[0], c[1], c[2]), ms)
    return rows, copy


def read_anchors(path):
    """{(anchor, 'model params'): ms} from kernels.tsv."""
    out = {}
    if not path:
        return out
    try:
        with open(path) as f:
            for line in f:
                c = line.rstrip("\n").split("\t")
                ms = number(c[4]) if len(c) >= 5 and c[0] != "op" else None
                if ms is not None:
                    out.setdefault((c[3], c[1]), ms)
    except OSError:
        pass
    return out


def by_size(shapes):
    """(model, params) pairs by T (or B), then model."""
    def key(mp):
        p = params_of(mp[1])
        return int(p.get("T", p.get("B", "0"))), mp[0]
    return sorted(set(shapes), key=key)


def shapes_of(rows, op, keep):
    """The (model, params) the op ran at, by size."""
    return by_size((m, p) for (o, m, p) in rows
                   if o == op and keep(params_of(p)))


def short(model, params):
    p = params_of(params)
    size = "T=" + p["T"] if "T" in p else "B=" + p["B"] if "B" in p else params
    return "%s %s" % (model, size)


def fmt_ms(ms, copy_pct=None):
    if ms is None:
        return "-"
    s = "%.4g" % ms
    return s + (" (%.0f %%)" % copy_pct if copy_pct is not None else "")


def step_bytes(params):
    """The decode step's state bytes read + written (gpu_kernels' GB/s)."""
    p = params_of(params)
    return 2.0 * int(p["B"]) * int(p["Hv"]) * int(p["dk"]) * int(p["dv"]) * 4


def choice(out, rows, copy, anchors, title, base, cands, keep, anchor, sets):
    out.append("### " + title)
    out.append("")
    out.append("Sets: %s. Default now: `%s`." % (sets, base))
    out.append("")
    shapes = shapes_of(rows, base, keep)
    if not shapes:
        out.append("No rows of `%s`: not run." % base)
        out.append("")
        return
    ran = [c for c in cands if any((c, m, p) in rows for m, p in shapes)]
    head = ["shape", base] + ran + [anchor, "best vs anchor"]
    out.append("| " + " | ".join(head) + " |")
    out.append("|" + "---|" + "---:|" * (len(head) - 1))
    tot = {c: [0.0, 0.0, 0, 0] for c in ran}  # base ms, ms, shapes, wins
    def pct(p, ms):  # the decode step's % of copy, else None
        if not base.startswith("gdn_step") or not copy:
            return None
        return step_bytes(p) / (ms * 1e-3) / 1e9 / copy * 100

    for m, p in shapes:
        b = rows[(base, m, p)]
        cells = [short(m, p), fmt_ms(b, pct(p, b))]
        best = b
        for c in ran:
            ms = rows.get((c, m, p))
            if ms is None:
                cells.append("-")
                continue
            best = min(best, ms)
            t = tot[c]
            t[0] += b
            t[1] += ms
            t[2] += 1
            t[3] += ms < b
            cells.append("%s x%.2f" % (fmt_ms(ms, pct(p, ms)), b / ms))
        a = anchors.get((anchor, "%s %s" % (m, p)))
        cells.append(fmt_ms(a))
        cells.append("x%.2f" % (a / best) if a else "-")
        out.append("| " + " | ".join(cells) + " |")
    out.append("")
    scored = [(t[0] / t[1], c) for c, t in tot.items() if t[2] > 0]
    for s, c in sorted(scored, reverse=True):
        t = tot[c]
        out.append("- `%s`: x%.2f of the default's speed over %d shape(s), "
                   "faster at %d" % (c, s, t[2], t[3]))
    if not scored:
        out.append("- no candidate ran")
    elif max(scored)[0] > 1.0:
        out.append("- fastest in total: `%s`" % max(scored)[1])
    else:
        out.append("- fastest in total: the default, `%s`" % base)
    out.append("")


def tc_table(out, rows):
    out.append("### T_C's cost (time with T_C over without; target %.2f)"
               % TC_TARGET)
    out.append("")
    ops = [o for o in TC_OPS if any(k[0] == o + "_tc" for k in rows)]
    if not ops:
        out.append("No `_tc` rows: not run.")
        out.append("")
        return
    shapes = by_size((m, p) for (o, m, p) in rows if o in ops)
    out.append("| shape | " + " | ".join(ops) + " |")
    out.append("|---|" + "---:|" * len(ops))
    for m, p in shapes:
        cells = [short(m, p)]
        for o in ops:
            a, b = rows.get((o, m, p)), rows.get((o + "_tc", m, p))
            cells.append("-" if a is None or b is None else "%.2f%s" % (
                b / a, "" if b / a <= TC_TARGET else " (over)"))
        out.append("| " + " | ".join(cells) + " |")
    out.append("")


def decide(bench, kernels=None):
    rows, copy = read_bench(bench)
    anchors = read_anchors(kernels)
    out = ["## Choices this run settles (bench/device_decide.py)", "",
           "Each cell: median ms, then x the default's ms over its own "
           "(above 1: faster than the default); the decode step's cells "
           "give the % of copy in brackets.", ""]
    for c in CHOICES:
        choice(out, rows, copy, anchors, *c)
    tc_table(out, rows)
    return "\n".join(out) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bench", required=True, help="gpu_kernels' merged TSV")
    ap.add_argument("--kernels", help="gpu_kernels_ref.py's kernels.tsv")
    a = ap.parse_args()
    try:
        sys.stdout.write(decide(a.bench, a.kernels))
    except OSError as e:
        sys.exit("device_decide: %s" % e)


if __name__ == "__main__":
    main()
