#!/usr/bin/env python3
"""Compiles and autotunes FLA's Gated DeltaNet kernels before anything is
timed, so the timed steps find them in Triton's caches.

    fla_warmup.py [--heads 16x16,16x32] [--dk 128] [--dv 128]

Why: on a fresh device machine the first call of each FLA kernel at a new
head shape compiles and autotunes for ~35 s (session 15's H200:
gpu_kernels_ref.py spent 70 of its 100 s on two chunk anchors and never
reached the Next heads or the decode step; gpu_engine_ref.py's first
prefill warm-up took 42 s of its 150). Triton keeps compiled kernels on
disk and FLA 0.6 keeps its autotuning results there too
(FLA_CACHE_RESULTS, on by default), keyed by head counts and widths, not
by T or the batch. tools/device-check.sh runs this in the background while
the CUDA tests run (nothing is timed then) and waits for it before the
first timed step.

One process per (head shape, call) runs at once (Triton compiles on one
core a process); the calls are the anchors' (gpu_kernels_ref.py's
Anchors.fla_call: chunk in bf16 and f32, the recurrent step at B = 1 and
64) and transformers' (its Qwen3.5 / Qwen3-Next layers: bf16 q, k, v and
beta, f32 gates, q and k normalized in the kernel, no initial state for
the chunk, with and without the final one). Prints one line per call
with its seconds; exits 0 when every call ran.
"""
import argparse
import os
import signal
import subprocess
import sys
import time

CALLS = ("chunk-bf16", "chunk-f32", "chunk-hf", "step")


def run_one(call, hk, hv, dk, dv):
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from gpu_kernels_ref import Anchors

    anc = Anchors()
    if not anc.fla:
        print("fla_warmup: no FLA or no CUDA (%s)" % "; ".join(anc.why))
        return 1
    torch = anc.torch
    gen = torch.Generator(device=anc.dev).manual_seed(1)

    def inputs(B, T, dt):
        rnd = lambda *s: torch.randn(*s, device=anc.dev, generator=gen)  # noqa
        q = torch.nn.functional.normalize(rnd(B, T, hk, dk), dim=-1).to(dt)
        k = torch.nn.functional.normalize(rnd(B, T, hk, dk), dim=-1).to(dt)
        v = rnd(B, T, hv, dv).to(dt)
        g = -torch.rand(B, T, hv, device=anc.dev, generator=gen)
        beta = torch.rand(B, T, hv, device=anc.dev, generator=gen).to(dt)
        S0 = rnd(B, hv, dk, dv) * 0.1
        return q, k, v, g, beta, S0

    bf16, f32 = torch.bfloat16, torch.float32
    chunk, step = anc.fla
    todo = []
    if call in ("chunk-bf16", "chunk-f32"):
        dt = bf16 if call == "chunk-bf16" else f32
        todo.append((call, lambda: anc.fla_call(0, *inputs(1, 4096, dt))))
    elif call == "chunk-hf":
        for final in (True, False):
            def hf(final=final):
                q, k, v, g, beta, _ = inputs(1, 4096, bf16)
                return chunk(q, k, v, g=g, beta=beta, initial_state=None,
                             output_final_state=final,
                             use_qk_l2norm_in_kernel=True)
            todo.append(("chunk-hf final=%d" % final, hf))
    else:
        for B in (1, 64):
            for dt in (f32, bf16):
                todo.append(("step B=%d %s" % (B, str(dt)[6:]),
                             lambda B=B, dt=dt: anc.fla_call(
                                 1, *inputs(B, 1, dt))))

            def hf(B=B):
                q, k, v, g, beta, S0 = inputs(B, 1, bf16)
                return step(q, k, v, g=g, beta=beta, initial_state=S0,
                            output_final_state=True,
                            use_qk_l2norm_in_kernel=True)
            todo.append(("step-hf B=%d" % B, hf))
    for name, fn in todo:
        t = time.time()
        fn()
        torch.cuda.synchronize()
        print("%s %dx%d: %.1f s" % (name, hk, hv, time.time() - t),
              flush=True)
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--heads", default="16x16,16x32",
                    help="key x value head counts, comma-separated")
    ap.add_argument("--dk", type=int, default=128)
    ap.add_argument("--dv", type=int, default=128)
    ap.add_argument("--one", help=argparse.SUPPRESS)  # CALL,HK,HV: a worker
    a = ap.parse_args()
    if a.one:
        call, hk, hv = a.one.split(",")
        return run_one(call, int(hk), int(hv), a.dk, a.dv)
    t0 = time.time()
    procs = []

    def stop(signum, frame):  # a timeout's SIGTERM: no worker outlives it
        for p in procs:
            p.kill()
        sys.exit(124)

    signal.signal(signal.SIGTERM, stop)
    for h in a.heads.split(","):
        hk, hv = h.split("x")
        for call in CALLS:
            procs.append(subprocess.Popen(
                [sys.executable, os.path.abspath(__file__), "--one",
                 "%s,%s,%s" % (call, hk, hv), "--dk", str(a.dk),
                 "--dv", str(a.dv)]))

    bad = sum(p.wait() != 0 for p in procs)
    print("fla_warmup: %d workers in %.1f s, %d failed"
          % (len(procs), time.time() - t0, bad), flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
