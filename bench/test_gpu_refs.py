#!/usr/bin/env python3
"""Checks of the device check's two reference scripts without torch or a
GPU (t/048-gpu-engine-bench.t runs this): what they do around the
measurements, on stand-ins for the measurements.

  * gpu_engine_ref.py times each shape only after an untimed call at that
    same shape (Triton compiles and autotunes at a shape's first call);
  * gpu_engine_ref.py's merge writes engine.tsv from our rows alone when
    the transformers step left none (it timed out);
  * gpu_kernels_ref.py writes kernels.tsv, accuracy.tsv and report.md when
    SIGTERM (`timeout`) stops it mid-way, and exits 124;
  * gpu_kernels_ref.py's kernels.tsv has the issue's columns and our
    float64 error per bench row, one row per op and shape where the merged
    family runs repeat one (the measured one);
  * fla_warmup.py says why it cannot run (no FLA or no CUDA) and fails,
    and takes its workers with it when SIGTERM stops it;
  * device_decide.py's tables: the candidates beside the default at the
    shapes that count, their speed-ups and totals, the anchor, T_C.
"""
import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
import unittest

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import gpu_engine_ref  # noqa: E402


def tsv(path):
    with open(path) as f:
        return [line.rstrip("\n").split("\t") for line in f]


class FakeRef(gpu_engine_ref.Ref):
    """Ref with the model replaced by a clock: the first call at a shape
    takes 100 s (a compile), later ones 1 s."""

    def __init__(self, a):  # noqa: D107 - no torch, no model
        self.a, self.rows, self.anchor, self.cuda = a, [], "fake", False
        self.vocab, self.seen, self.calls = 1000, set(), []

    def _t(self, key):
        self.calls.append(key)
        first = key not in self.seen
        self.seen.add(key)
        return 100.0 if first else 1.0

    def prefill_s(self, ids):
        return self._t(("prefill", len(ids[0]))), None

    def decode_s(self, B, steps):
        return self._t(("decode", B))


class EngineRef(unittest.TestCase):
    def test_warm_up_at_every_shape(self):
        a = argparse.Namespace(tokens=[64, 256], batch=[1, 4], decode=8,
                               reps=1, budget=0, name="m", anchors=None,
                               prompt=16)
        r = FakeRef(a)
        r.measure([("2x40", 100)])
        got = {(m, s): v for m, s, v, u in r.rows}
        self.assertEqual(got[("prefill", "m/T=64")], "64")
        self.assertEqual(got[("prefill", "m/T=256")], "256")
        self.assertEqual(got[("decode", "m/B=4")], "32")
        self.assertEqual(got[("ttft_full", "m/2x40")], "1000")
        self.assertEqual(len(r.calls), 2 * 5, "one untimed call per shape")

    def test_merge_without_anchor_rows(self):
        with tempfile.TemporaryDirectory() as d:
            ours = os.path.join(d, "ours.tsv")
            with open(ours, "w") as f:
                f.write("measure\tshape\tours\tanchor\tanchor_value\tunit\n"
                        "prefill\tm/T=4096\t64000\t-\t-\ttok/s\n")
            gpu_engine_ref.merge(ours, os.path.join(d, "none.tsv"), d)
            rows = tsv(os.path.join(d, "engine.tsv"))
            self.assertEqual(rows[0], gpu_engine_ref.COLS)
            self.assertEqual(rows[1], ["prefill", "m/T=4096", "64000", "-",
                                       "-", "tok/s"])


def write_case(d, T, Hk, Hv, dk, dv):
    """A gdn_chunk dump of gpu_kernels.c's layout (inputs only)."""
    os.makedirs(d)
    with open(os.path.join(d, "meta.txt"), "w") as f:
        f.write("op gdn_chunk\nT %d\nHk %d\nHv %d\ndk %d\ndv %d\n"
                % (T, Hk, Hv, dk, dv))
    rng = np.random.default_rng(1)
    for name, shape in (("q", (T, Hk, dk)), ("k", (T, Hk, dk)),
                        ("v", (T, Hv, dv)), ("g", (T, Hv)),
                        ("beta", (T, Hv)), ("S0", (Hv, dk, dv))):
        x = rng.standard_normal(shape).astype("<f4") * 0.1
        if name == "g":
            x = -np.abs(x)
        x.tofile(os.path.join(d, name + ".f32"))


def write_matmul(d, n, i, o):
    os.makedirs(d)
    with open(os.path.join(d, "meta.txt"), "w") as f:
        f.write("op matmul\nn %d\nin %d\nout %d\n" % (n, i, o))
    rng = np.random.default_rng(2)
    x = rng.standard_normal((n, i)).astype("<f4")
    w = rng.standard_normal((o, i)).astype("<f4")
    x.tofile(os.path.join(d, "x.f32"))
    w.tofile(os.path.join(d, "w.f32"))
    y = (x.astype(np.float64) @ w.astype(np.float64).T)
    y.astype("<f4").tofile(os.path.join(d, "y_f32.f32"))
    (y * (1 + 1e-3)).astype("<f4").tofile(os.path.join(d, "y_bf16.f32"))


BENCH = ("op\tmodel\tparams\tms\treps\ttokens_per_s\tgb_per_s\ttflop_per_s"
         "\tnote\n"
         "device\tTest GPU\tsms=1\t-\t0\t-\t-\t-\t\n"
         # merged family runs: a skipped row, then the measured one, then
         # a skipped one again (kernels.tsv keeps the measured one)
         "matmul_f32\tm\tn=4,in=8,out=16\t-\t0\t-\t-\t-\tskipped\n"
         "matmul_f32\tm\tn=4,in=8,out=16\t0.5\t3\t-\t-\t1.0\t\n"
         "gdn_chunk_f32\tm\tT=64,Hk=2,Hv=2,dk=8,dv=8,C=16\t2.0\t3\t-\t-\t-\t\n"
         "matmul_f32\tm\tn=4,in=8,out=16\t-\t0\t-\t-\t-\tskipped\n")


class KernelsRef(unittest.TestCase):
    def run_ref(self, d, dump):
        bench = os.path.join(d, "bench.tsv")
        with open(bench, "w") as f:
            f.write(BENCH)
        return subprocess.Popen(
            [sys.executable, os.path.join(HERE, "gpu_kernels_ref.py"),
             "--bench", bench, "--dump", dump, "--out",
             os.path.join(d, "res")],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

    def test_rows_and_columns(self):
        with tempfile.TemporaryDirectory() as d:
            write_matmul(os.path.join(d, "dump", "matmul-m"), 4, 8, 16)
            p = self.run_ref(d, os.path.join(d, "dump"))
            out = p.communicate(timeout=120)[0]
            self.assertEqual(p.returncode, 0, out)
            rows = tsv(os.path.join(d, "res", "kernels.tsv"))
            self.assertEqual(rows[0], ["op", "shape", "ours_ms", "anchor",
                                       "anchor_ms", "rel_err_vs_f64"])
            mm = [r for r in rows if r[0] == "matmul_f32"]
            self.assertEqual(len(mm), 1, rows)
            self.assertEqual(mm[0][1], "m n=4,in=8,out=16")
            self.assertEqual(mm[0][2], "0.5")
            self.assertLess(float(mm[0][5]), 1e-6)

    def test_sigterm_keeps_the_rows(self):
        with tempfile.TemporaryDirectory() as d:
            # a float64 recurrence of many seconds, then SIGTERM within it
            write_case(os.path.join(d, "dump", "gdn_chunk-m"), 200000, 2, 2,
                       8, 8)
            p = self.run_ref(d, os.path.join(d, "dump"))
            seen = ""
            t = time.time()
            while "float64 reference: gdn_chunk-m" not in seen:
                line = p.stdout.readline()
                self.assertTrue(line, "ended early: " + seen)
                self.assertLess(time.time() - t, 120, seen)
                seen += line
            p.send_signal(signal.SIGTERM)
            out = seen + p.communicate(timeout=60)[0]
            self.assertEqual(p.returncode, 124, out)
            res = os.path.join(d, "res")
            rows = tsv(os.path.join(res, "kernels.tsv"))
            self.assertEqual([r[0] for r in rows[1:]],
                             ["matmul_f32", "gdn_chunk_f32"], out)
            self.assertEqual([r[2] for r in rows[1:]], ["0.5", "2"])
            self.assertTrue(os.path.getsize(os.path.join(res, "report.md")))
            self.assertEqual(len(tsv(os.path.join(res, "accuracy.tsv"))), 1)


class FlaWarmup(unittest.TestCase):
    WARM = os.path.join(HERE, "fla_warmup.py")

    def test_without_fla_it_says_so_and_fails(self):
        p = subprocess.run([sys.executable, self.WARM, "--heads", "2x4"],
                           capture_output=True, text=True, timeout=120,
                           env=dict(os.environ, PYTHONPATH=""))
        self.assertEqual(p.returncode, 1, p.stdout + p.stderr)
        self.assertEqual(p.stdout.count("no FLA or no CUDA"), 4, p.stdout)
        self.assertIn("4 workers", p.stdout)
        self.assertIn("4 failed", p.stdout)

    # A `timeout` around it: no worker compiles on into a timed step
    # (their torch import here hangs: a stand-in for a compile).
    def test_sigterm_stops_every_worker(self):
        with tempfile.TemporaryDirectory() as d:
            os.makedirs(os.path.join(d, "torch"))
            with open(os.path.join(d, "torch", "__init__.py"), "w") as f:
                f.write("import time\ntime.sleep(60)\n")
            p = subprocess.Popen([sys.executable, self.WARM, "--heads",
                                  "3x7"], env=dict(os.environ, PYTHONPATH=d),
                                 stdout=subprocess.DEVNULL,
                                 stderr=subprocess.DEVNULL)
            pat = "fla_warmup.py --one .*,3,7"
            for _ in range(100):  # the 4 workers started
                n = subprocess.run(["pgrep", "-f", pat], capture_output=True,
                                   text=True).stdout.split()
                if len(n) == 4:
                    break
                time.sleep(0.1)
            self.assertEqual(len(n), 4)
            p.send_signal(signal.SIGTERM)
            self.assertEqual(p.wait(timeout=30), 124)
            time.sleep(0.5)
            left = subprocess.run(["pgrep", "-f", pat], capture_output=True,
                                  text=True).stdout.split()
            self.assertEqual(left, [])


class Decide(unittest.TestCase):
    """device_decide.py on a made-up run: the decode step at B >= 64 only,
    its % of copy, a candidate that never ran left out, one skipped at a
    shape left out of its totals, the anchor's ratio, T_C over target."""

    def test_tables(self):
        import device_decide
        sp = "B=%d,Hk=16,Hv=16,dk=128,dv=128"
        cp = "T=16384,Hk=16,Hv=16,dk=128,dv=128,C=64"
        rows = [
            ("copy_d2d", "-", "bytes=1", "0.5", "4000"),
            ("gdn_step_pipe", "m", sp % 1, "0.01", "-"),
            ("gdn_step_pipew", "m", sp % 1, "0.5", "-"),
            ("gdn_step_pipe", "m", sp % 64, "0.05", "-"),
            ("gdn_step_pipew", "m", sp % 64, "0.04", "-"),
            ("gdn_step_pipea", "m", sp % 64, "0.06", "-"),
            ("gdn_step_pipe", "m", sp % 256, "0.2", "-"),
            ("gdn_step_pipew", "m", sp % 256, "0.16", "-"),
            ("gdn_step_pipea", "m", sp % 256, "-", "-"),
            ("gdn_chunk_bf16", "m", cp, "2.0", "-"),
            ("gdn_chunk_bf16_ov", "m", cp, "1.0", "-"),
            ("gdn_chunk_bf16_tc", "m", cp, "2.2", "-"),
            ("gdn_chunk_bf16_ov_tc", "m", cp, "1.5", "-"),
        ]
        with tempfile.TemporaryDirectory() as d:
            bench, kern = os.path.join(d, "b.tsv"), os.path.join(d, "k.tsv")
            with open(bench, "w") as f:
                f.write("op\tmodel\tparams\tms\treps\ttok\tgbs\ttf\tnote\n")
                for r in rows:
                    f.write("\t".join([r[0], r[1], r[2], r[3], "50", "-",
                                       r[4], "-", ""]) + "\n")
            with open(kern, "w") as f:
                f.write("op\tshape\tours_ms\tanchor\tanchor_ms\trel\n")
                f.write("gdn_chunk_bf16\tm %s\t2.0\tfla chunk_gated_delta_"
                        "rule bf16\t0.8\t-\n" % cp)
            md = device_decide.decide(bench, kern)
        step = md.split("### ")[1]
        # B = 1 left out; 64 and 256 in, PIPEW 1.25x at both
        self.assertNotIn("m B=1 ", step)
        self.assertIn("| m B=64 | 0.05 (67 %) | 0.06 (56 %) x0.83 | "
                      "0.04 (84 %) x1.25 |", step)
        self.assertIn("| m B=256 | 0.2 (67 %) | - | 0.16 (84 %) x1.25 |",
                      step)
        self.assertNotIn("gdn_step_kh", step)  # never ran
        self.assertIn("`gdn_step_pipew`: x1.25 of the default's speed over "
                      "2 shape(s), faster at 2", step)
        self.assertIn("`gdn_step_pipea`: x0.83 of the default's speed over "
                      "1 shape(s), faster at 0", step)
        self.assertIn("fastest in total: `gdn_step_pipew`", step)
        chunk = md.split("### ")[2]
        self.assertIn("| m T=16384 | 2 | 1 x2.00 | 0.8 | x0.80 |", chunk)
        self.assertIn("No rows of `gdn_chunk_f32mma_bf16in`",
                      md.split("### ")[3])
        tc = md.split("### ")[-1]  # the T_C table comes last
        self.assertIn("T_C's cost", tc)
        self.assertIn("| m T=16384 | 1.10 | 1.50 (over) |", tc)


if __name__ == "__main__":
    unittest.main()
