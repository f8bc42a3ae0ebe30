#!/usr/bin/env python3
"""The anchor for bench/gpu_engine.c: Hugging Face transformers on the same
checkpoint, the same device and the same shapes; then the merged report.

    gpu_engine_ref.py --model DIR [--name TAG] [--device cuda|cpu]
        [--tokens 4096,16384] [--batch 1,16,64,256] [--decode 32]
        [--prompt 16] [--ours OURS.tsv] [--anchors ANCHORS.tsv]
        [--logits OURS.safetensors --text TEXT] [--budget S] [--reps 3]
        [--out DIR]
    gpu_engine_ref.py --ours OURS.tsv --anchors ANCHORS.tsv --out DIR

With --model: loads DIR with from_pretrained in bf16 (FLA's Gated DeltaNet
kernels when `fla` imports: transformers picks them up at import) and
measures, as gpu_engine does:
  * prefill tok/s: one sequence of T ids (t * 7919 + 13) % min(V, 4000)
    (bench_engine.h), logits of the last token only, synchronized;
  * decode tok/s: a static batch of B prompts of --prompt tokens (prompt i
    continues the same formula at i * prompt), then --decode greedy steps
    with the model's KV/state cache, B * steps / time;
  * ttft_full: the prefill of as many tokens as our PIC prompts hold (the
    pic_prompt_tokens rows of --ours, one per shape);
  * parity (--logits, from `hypic-engine logits --all` on --text): the
    logits of the same text, max |ours - hf| / max |hf| over every
    position, in bf16 (the model as benchmarked) and in f32 (the same
    weights widened: our engine's arithmetic), and the share of positions
    whose argmax agrees.
Each figure: the median of --reps after an untimed run at the same shape
(Triton compiles and autotunes at each shape's first call; its seconds
are logged). No new measurement starts once --budget seconds have
passed. Rows are appended to --anchors (measure, shape, value, unit).

Then (and alone without --model): merges --ours (gpu_engine's TSV) with
--anchors into DIR/engine.tsv (measure shape ours anchor anchor_value unit)
and DIR/engine.md, with the ratios and issue 14's targets: prefill >=
transformers+FLA, decode at batch 64 >= 2x transformers, warm PIC TTFT >=
5x faster than full at 4x4096.
"""
import argparse
import csv
import os
import re
import statistics
import sys
import time

T0 = time.time()
COLS = ["measure", "shape", "ours", "anchor", "anchor_value", "unit"]


def log(msg):
    print("[%6.1fs] %s" % (time.time() - T0, msg), flush=True)


def ints(s):
    return [int(x) for x in s.split(",") if x]


def prompt_ids(start, n, vocab):
    """bench_prompt_id of bench/bench_engine.h for t in [start, start+n)."""
    m = min(vocab, 4000)
    return [(t * 7919 + 13) % m for t in range(start, start + n)]


def read_tsv(path):
    if not path or not os.path.exists(path):
        return []
    with open(path, newline="") as f:
        return list(csv.DictReader(f, delimiter="\t"))


def fnum(s):
    try:
        return float(s)
    except (TypeError, ValueError):
        return None


# ---- transformers -----------------------------------------------------------


def fla_status():
    """Whether transformers will run FLA's kernels (it imports them the
    same way), and why not."""
    try:
        import importlib

        m = importlib.import_module("fla.ops.gated_delta_rule")
        getattr(m, "chunk_gated_delta_rule")
        return True, "fla " + getattr(importlib.import_module("fla"), "__version__", "?")
    except Exception as e:  # noqa: BLE001 - any failure means the torch path
        return False, "no FLA (%s: %s)" % (type(e).__name__, str(e).splitlines()[0][:120] if str(e) else "")


class Ref:
    def __init__(self, a):
        import torch

        self.a, self.torch = a, torch
        self.dev = torch.device(a.device)
        self.rows = []
        self.fla, why = fla_status()
        self.anchor = "transformers+FLA-bf16" if self.fla else "transformers-bf16"
        self.cuda = self.dev.type == "cuda"
        if self.cuda and not torch.cuda.is_available():
            raise SystemExit("gpu_engine_ref: --device cuda but torch sees no CUDA device")
        import transformers

        t = time.time()
        self.model = transformers.AutoModelForCausalLM.from_pretrained(a.model, dtype=torch.bfloat16).to(self.dev)
        self.model.eval()
        self.vocab = self.model.config.get_text_config().vocab_size
        log("transformers %s, torch %s, %s, %s; %s loaded in %.1f s; anchor %s"
            % (transformers.__version__, torch.__version__,
               torch.cuda.get_device_name(self.dev) if self.cuda else "cpu", why, a.model,
               time.time() - t, self.anchor))

    def sync(self):
        if self.cuda:
            self.torch.cuda.synchronize(self.dev)

    def over(self):
        return self.a.budget > 0 and time.time() - T0 > self.a.budget

    def add(self, measure, shape, value, unit, anchor=None):
        anchor = anchor or self.anchor
        v = value if isinstance(value, str) else "%.6g" % value
        self.rows.append([measure, "%s/%s" % (self.a.name, shape), v, unit])
        log("%s %s/%s: %s %s" % (measure, self.a.name, shape, v, unit))
        if self.a.anchors:
            new = not os.path.exists(self.a.anchors) or os.path.getsize(self.a.anchors) == 0
            with open(self.a.anchors, "a") as f:
                if new:
                    f.write("measure\tshape\tvalue\tunit\tanchor\n")
                f.write("%s\t%s/%s\t%s\t%s\t%s\n" % (measure, self.a.name, shape, v, unit, anchor))

    def prefill_s(self, ids):
        """Seconds of one prefill of ids [B, T], last logits only; returns
        (seconds, output)."""
        torch = self.torch
        x = torch.tensor(ids, device=self.dev)
        self.sync()
        t = time.time()
        with torch.no_grad():
            out = self.model(input_ids=x, use_cache=True, logits_to_keep=1)
        self.sync()
        return time.time() - t, out

    def decode_s(self, B, steps):
        torch = self.torch
        P = self.a.prompt
        ids = [prompt_ids(i * P, P, self.vocab) for i in range(B)]
        _, out = self.prefill_s(ids)
        past = out.past_key_values
        tok = out.logits[:, -1].argmax(-1, keepdim=True)
        self.sync()
        t = time.time()
        with torch.no_grad():
            for _ in range(steps):
                out = self.model(input_ids=tok, past_key_values=past, use_cache=True)
                past = out.past_key_values
                tok = out.logits[:, -1].argmax(-1, keepdim=True)
        self.sync()
        return time.time() - t

    def median(self, fn):
        return statistics.median(fn() for _ in range(self.a.reps))

    def run(self, what, fn, warm):
        """fn() -> (value, unit), after warm() once untimed at the same
        shape (Triton compiles, and autotunes, at a shape's first call: a
        warm-up at another shape does not cover it); skipped past the
        budget, failures kept."""
        measure, shape = what
        if self.over():
            self.add(measure, shape, "skipped (budget)", "-")
            return
        try:
            t = time.time()
            warm()
            log("warm-up %s %s/%s: %.1f s" % (measure, self.a.name, shape, time.time() - t))
            if self.over():
                self.add(measure, shape, "skipped (budget)", "-")
                return
            v, unit = fn()
            self.add(measure, shape, v, unit)
        except Exception as e:  # noqa: BLE001 - a failed row, the rest goes on
            msg = str(e).splitlines()[0][:200] if str(e) else ""
            self.add(measure, shape, "failed: %s: %s" % (type(e).__name__, msg), "-")
            if self.cuda:
                self.torch.cuda.empty_cache()

    def measure(self, pic_tokens):
        a = self.a
        for T in a.tokens:
            ids = [prompt_ids(0, T, self.vocab)]
            self.run(("prefill", "T=%d" % T),
                     lambda: (T / self.median(lambda: self.prefill_s(ids)[0]), "tok/s"),
                     lambda: self.prefill_s(ids))
        for B in a.batch:
            self.run(("decode", "B=%d" % B),
                     lambda: (B * a.decode / self.median(lambda: self.decode_s(B, a.decode)), "tok/s"),
                     lambda: self.decode_s(B, a.decode))
        for shape, n in pic_tokens:
            ids = [prompt_ids(0, n, self.vocab)]
            self.run(("ttft_full", shape),
                     lambda: (1e3 * self.median(lambda: self.prefill_s(ids)[0]), "ms"),
                     lambda: self.prefill_s(ids))

    def parity(self):
        """Our logits of --text against transformers' (bf16, then f32)."""
        a, torch = self.a, self.torch
        from safetensors.numpy import load_file

        ours = load_file(a.logits)["logits"]
        if ours.ndim == 1:
            ours = ours[None, :]
        import transformers

        tok = transformers.AutoTokenizer.from_pretrained(a.model)
        ids = tok(a.text, add_special_tokens=False)["input_ids"]
        if len(ids) != ours.shape[0] or self.vocab != ours.shape[1]:
            self.add("logits_parity", "text", "failed: %d tokens x %d here, ours %s"
                     % (len(ids), self.vocab, "x".join(map(str, ours.shape))), "-")
            return
        import numpy as np

        for dt in ("bf16", "f32"):
            if dt == "f32":  # from the checkpoint again: an f32 one stays exact
                del self.model
                if self.cuda:
                    torch.cuda.empty_cache()
                self.model = transformers.AutoModelForCausalLM.from_pretrained(
                    a.model, dtype=torch.float32).to(self.dev).eval()
            x = torch.tensor([ids], device=self.dev)
            with torch.no_grad():
                hf = self.model(input_ids=x).logits[0].float().cpu().numpy()
            err = float(np.abs(ours - hf).max() / max(np.abs(hf).max(), 1e-30))
            agree = float((ours.argmax(-1) == hf.argmax(-1)).mean())
            anchor = "transformers-" + dt
            self.add("logits_max_rel_err_vs_" + dt, "%d tokens" % len(ids), err, "rel", anchor)
            self.add("argmax_agree_vs_" + dt, "%d tokens" % len(ids), agree, "share", anchor)


# ---- the merged report ----------------------------------------------------------


def merge(ours_path, anchors_path, out):
    ours, anch = read_tsv(ours_path), read_tsv(anchors_path)
    ref = {(r["measure"], r["shape"]): r for r in anch}
    used, rows = set(), []
    for r in ours:
        # TAG@MODE/...: a HYPIC_CUDA_GDN mode's run against TAG's anchors
        base = re.sub(r"^([^/@]*)@[^/]*", r"\1", r["shape"])
        key = (r["measure"], base)
        a = ref.get(key)
        if a:
            used.add(key)
        elif r["measure"].startswith("ttft_pic"):  # PIC against the full prefill
            a = ref.get(("ttft_full", base))
        elif r["measure"] == "decode_kvbuf":  # the server's decode form
            a = ref.get(("decode", base))
        if a and r["measure"] != "pic_prompt_tokens":
            rows.append([r["measure"], r["shape"], r["ours"], a["anchor"], a["value"], r["unit"]])
        else:
            rows.append([r["measure"], r["shape"], r["ours"], "-", "-", r["unit"]])
    for key, a in ref.items():  # rows of the anchor alone
        if key in used:
            continue
        if a["unit"] in ("rel", "share"):  # parity: ours against the anchor
            rows.append([key[0], key[1], a["value"], a["anchor"], "-", a["unit"]])
        else:
            rows.append([key[0], key[1], "-", a["anchor"], a["value"], a["unit"]])
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "engine.tsv"), "w") as f:
        f.write("\t".join(COLS) + "\n")
        for r in rows:
            f.write("\t".join(r) + "\n")
    with open(os.path.join(out, "engine.md"), "w") as f:
        f.write(report(rows))
    return rows


def ratio(r):
    """How many times better ours is than the anchor (None without both)."""
    o, a = fnum(r[2]), fnum(r[4])
    if o is None or a is None or o <= 0 or a <= 0:
        return None
    return o / a if r[5] == "tok/s" else a / o if r[5] == "ms" else None


def targets(rows):
    """The issue's floors, each (what, met or not, how)."""
    out, by = [], {(r[0], r[1]): r for r in rows}
    models = sorted({r[1].split("/")[0] for r in rows})
    for m in models:
        for r in rows:
            if r[1].startswith(m + "/") and r[0] == "prefill":
                q = ratio(r)
                out.append(("%s prefill %s >= transformers+FLA" % (m, r[1].split("/", 1)[1]),
                            None if q is None else q >= 1.0, "%.2fx" % q if q else r[2]))
        r = by.get(("decode", m + "/B=64"))
        if r:
            q = ratio(r)
            out.append(("%s decode at B=64 >= 2x transformers" % m,
                        None if q is None else q >= 2.0, "%.2fx" % q if q else r[2]))
        full, warm = by.get(("ttft_full", m + "/4x4096")), by.get(("ttft_pic_warm", m + "/4x4096"))
        if full and warm:
            f, w = fnum(full[2]), fnum(warm[2])
            q = f / w if f and w else None
            out.append(("%s warm PIC TTFT >= 5x faster than full at 4x4096" % m,
                        None if q is None else q >= 5.0, "%.2fx" % q if q else warm[2]))
    return out


def report(rows):
    L = ["# Engine on the device against transformers", "",
         "ratio: how many times ours is better (tok/s: ours/anchor; ms: anchor/ours);",
         "PIC rows' anchor is transformers' `full` prefill of the same prompt length.", "",
         "| measure | shape | ours | anchor | anchor value | unit | ratio |",
         "|---|---|---:|---|---:|---|---:|"]
    for r in rows:
        q = ratio(r)
        L.append("| %s | %s | %s | %s | %s | %s | %s |"
                 % (r[0], r[1], r[2], r[3], r[4], r[5], "%.2fx" % q if q else "-"))
    L += ["", "## Targets (issue 14)", "", "| target | status | figure |", "|---|---|---|"]
    for what, ok, how in targets(rows):
        L.append("| %s | %s | %s |" % (what, "n/a" if ok is None else "met" if ok else "not met", how))
    return "\n".join(L) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model")
    ap.add_argument("--name")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--tokens", type=ints, default=[4096, 16384])
    ap.add_argument("--batch", type=ints, default=[1, 16, 64, 256])
    ap.add_argument("--decode", type=int, default=32)
    ap.add_argument("--prompt", type=int, default=16)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--budget", type=float, default=0)
    ap.add_argument("--ours", help="gpu_engine's TSV")
    ap.add_argument("--anchors", help="our rows are appended here")
    ap.add_argument("--logits", help="hypic-engine logits --all output for --text")
    ap.add_argument("--text", help="the text our --logits ran")
    ap.add_argument("--out", help="write engine.tsv and engine.md here")
    a = ap.parse_args()
    if not a.model and not (a.ours and a.out):
        ap.error("--model, or --ours and --out to merge")
    if a.model:
        a.name = a.name or os.path.basename(os.path.normpath(a.model))
        pic = []
        for r in read_tsv(a.ours):
            if r["measure"] == "pic_prompt_tokens" and r["shape"].startswith(a.name + "/") and fnum(r["ours"]):
                pic.append((r["shape"].split("/", 1)[1], int(float(r["ours"]))))
        ref = Ref(a)
        ref.measure(pic)
        if a.logits and a.text:
            if ref.over():
                ref.add("logits_parity", "text", "skipped (budget)", "-")
            else:
                try:
                    ref.parity()
                except Exception as e:  # noqa: BLE001
                    ref.add("logits_parity", "text", "failed: %s: %s" % (type(e).__name__, e), "-")
    if a.out and a.ours:
        rows = merge(a.ours, a.anchors, a.out)
        sys.stdout.write(report(rows))
        log("wrote %s/engine.tsv and engine.md" % a.out)


if __name__ == "__main__":
    main()
