#!/usr/bin/env python3
"""The anchors for bench/gpu_kernels.c, on the same GPU and the same inputs.

    gpu_kernels_ref.py --bench BENCH.tsv --dump DIR --out DIR [--budget S]

Reads what gpu_kernels wrote: its timings (BENCH.tsv) and, per small case
under DIR, the inputs and our outputs. Then, in this order:
  * accuracy of ours: a float64 reference of every dumped case (numpy, on
    the CPU, seconds per case: the GDN recurrence token by token, T_C as
    the product of the per-token transitions, the fused step's
    conv/norm/gates, causal GQA attention, the projection), and the
    relative error of our outputs: max |x - ref| / max |ref|;
  * timing: each bench row's anchor at the same shape (FLA's
    chunk_gated_delta_rule and fused_recurrent_gated_delta_rule in f32 and
    bf16, torch's scaled_dot_product_attention (for the paged decode:
    after gathering the pages through the table, torch having no paged
    attention of its own), torch.matmul with TF32 off,
    tensor.copy_), CUDA events, median of >= 3 calls after two warm-ups
    (Triton compiles and autotunes there: tens of seconds per kernel and
    dtype), most wanted first, none started past --budget seconds;
  * accuracy of the anchors on the same dumped inputs, while the budget
    lasts (last: FLA's first calls compile).
Writes DIR/kernels.tsv (op shape ours_ms anchor anchor_ms rel_err_vs_f64),
DIR/accuracy.tsv and DIR/report.md after each step, and on SIGTERM (a
`timeout` around it) before it exits, so a run cut short keeps every row
it has. Without torch, CUDA or FLA the anchors are reported missing and
the float64 checks of our outputs still run.
"""
import argparse
import os
import signal
import sys
import time
import traceback

import numpy as np

T0 = time.time()


def log(msg):
    print("[%6.1fs] %s" % (time.time() - T0, msg), flush=True)


# ---- inputs ---------------------------------------------------------------


def read_meta(d):
    meta = {}
    with open(os.path.join(d, "meta.txt")) as f:
        for line in f:
            k, _, v = line.strip().partition(" ")
            meta[k] = v
    for k, v in meta.items():
        try:
            meta[k] = int(v)
        except ValueError:
            try:
                meta[k] = float(v)
            except ValueError:
                pass
    return meta


def arr(d, name, shape):
    return np.fromfile(os.path.join(d, name), dtype="<f4").reshape(shape)


def read_bench(path):
    """The bench rows, one per op, model and params (kernels.tsv's rule):
    device-check merges one gpu_kernels run per family of ops, a family's
    prefix may name another's ops (attention_prefill prints
    attention_prefill_flash3's rows as skipped) and every run times
    copy_d2d. A measured row takes the place of an earlier row of its key;
    a skipped one never replaces a measured one."""
    rows, device = {}, None
    if not path or not os.path.exists(path):
        return [], device
    with open(path) as f:
        head = f.readline().rstrip("\n").split("\t")
        for line in f:
            r = dict(zip(head, line.rstrip("\n").split("\t")))
            if r["op"] == "device":
                device = r["model"] if r["model"] != "-" else None
                continue
            key = (r["op"], r["model"], r["params"])
            if key not in rows or r["ms"] != "-":
                rows[key] = r
    return list(rows.values()), device


def params(s):
    return {k: int(v) for k, v in (p.split("=") for p in s.split(","))}


def rel_err(x, ref):
    x = np.asarray(x, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    den = np.max(np.abs(ref))
    return float(np.max(np.abs(x - ref)) / (den if den > 0 else 1.0))


# ---- float64 references -----------------------------------------------------


def gdn_ref(q, k, v, g, beta, S0, want_tc=False):
    """o, S (and T_C): the recurrence token by token in float64; q, k
    [T, Hk, dk], v [T, Hv, dv], g, beta [T, Hv], S0 [Hv, dk, dv]."""
    T, Hk, dk = q.shape
    Hv = v.shape[1]
    r = Hv // Hk
    S = S0.astype(np.float64).copy()
    Tc = np.broadcast_to(np.eye(dk), (Hv, dk, dk)).copy() if want_tc else None
    o = np.zeros(v.shape, dtype=np.float64)
    for t in range(T):
        qt = np.repeat(q[t].astype(np.float64), r, axis=0)
        kt = np.repeat(k[t].astype(np.float64), r, axis=0)
        a = np.exp(g[t].astype(np.float64))[:, None, None]
        bt = beta[t].astype(np.float64)[:, None]
        S *= a
        u = np.einsum("hij,hi->hj", S, kt)
        d = bt * (v[t] - u)
        S += kt[:, :, None] * d[:, None, :]
        o[t] = np.einsum("hij,hi->hj", S, qt)
        if want_tc:
            kT = np.einsum("hi,hij->hj", kt, Tc)
            Tc = a * (Tc - bt[:, :, None] * kt[:, :, None] * kT[:, None, :])
    return o, S, Tc


def softplus(x):
    return np.where(x > 20.0, x, np.log1p(np.exp(np.minimum(x, 20.0))))


def step_inputs_ref(m, qkv, a, b, w, A_log, dtb, conv0):
    """The fused step's preprocessing in float64: conv + SiLU, l2 norms,
    gates; returns q, k [B, Hk, dk], v [B, Hv, dv], g, beta [B, Hv] and the
    shifted conv states."""
    B, Hk, Hv, dk, dv, K = m["B"], m["Hk"], m["Hv"], m["dk"], m["dv"], m["K"]
    kd = Hk * dk
    x = qkv.astype(np.float64)
    st = conv0.astype(np.float64)  # [B, cd, K-1]
    win = np.concatenate([st, x[:, :, None]], axis=2)  # [B, cd, K]
    y = np.einsum("bcj,cj->bc", win, w.astype(np.float64))
    y = y / (1.0 + np.exp(-y))
    q = y[:, :kd].reshape(B, Hk, dk)
    k = y[:, kd:2 * kd].reshape(B, Hk, dk)
    v = y[:, 2 * kd:].reshape(B, Hv, dv)
    eps = m.get("eps", 1e-6)
    q = q / np.sqrt((q * q).sum(-1, keepdims=True) + eps) / np.sqrt(dk)
    k = k / np.sqrt((k * k).sum(-1, keepdims=True) + eps)
    g = -np.exp(A_log.astype(np.float64)) * softplus(a + dtb.astype(np.float64))
    beta = 1.0 / (1.0 + np.exp(-b.astype(np.float64)))
    return q, k, v, g, beta, win[:, :, 1:]


def attention_ref(q, k, v, qpos=None):
    """Causal (by position) GQA attention in float64: q [T, Hq, hd],
    k, v [N, Hkv, hd]."""
    T, Hq, hd = q.shape
    N, Hkv, _ = k.shape
    r = Hq // Hkv
    kk = np.repeat(k.astype(np.float64), r, axis=1)
    vv = np.repeat(v.astype(np.float64), r, axis=1)
    s = np.einsum("thd,nhd->htn", q.astype(np.float64), kk,
                  optimize=True) / np.sqrt(hd)
    if qpos is not None:
        s = np.where(np.arange(N)[None, None, :] <= qpos[None, :, None], s,
                     -np.inf)
    s -= s.max(-1, keepdims=True)
    p = np.exp(s)
    p /= p.sum(-1, keepdims=True)
    return np.einsum("htn,nhd->thd", p, vv, optimize=True)


# ---- anchors (torch, FLA) -----------------------------------------------------


class Anchors:
    def __init__(self):
        self.torch = self.fla = None
        self.why = []
        try:
            import torch
            if torch.cuda.is_available():
                self.torch = torch
                torch.backends.cuda.matmul.allow_tf32 = False
                torch.backends.cudnn.allow_tf32 = False
                self.dev = torch.device("cuda")
                self.name = torch.cuda.get_device_name()
            else:
                self.why.append("torch has no CUDA device")
        except ImportError:
            self.why.append("no torch")
        if self.torch:
            try:
                from fla.ops.gated_delta_rule import (
                    chunk_gated_delta_rule, fused_recurrent_gated_delta_rule)
                self.fla = (chunk_gated_delta_rule,
                            fused_recurrent_gated_delta_rule)
            except Exception as e:  # noqa: BLE001 - any import failure
                self.why.append("no FLA (%s)" % e.__class__.__name__)

    def t(self, x, dtype=None):
        torch = self.torch
        return torch.as_tensor(np.ascontiguousarray(x), device=self.dev,
                               dtype=dtype or torch.float32)

    def time(self, fn, budget_left):
        """Median ms of fn() after two warm-ups; None past the budget."""
        torch = self.torch
        for _ in range(2):
            fn()
        torch.cuda.synchronize()
        ms, total = [], 0.0
        while len(ms) < 3 or (total < 200.0 and len(ms) < 50):
            if time.time() > budget_left:
                break
            a = torch.cuda.Event(enable_timing=True)
            b = torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            b.synchronize()
            ms.append(a.elapsed_time(b))
            total += ms[-1]
        return sorted(ms)[len(ms) // 2] if ms else None

    # FLA 0.6 does GVA (Hv > Hk) itself; an older build wants q, k repeated
    # per value head. Keywords: fused_recurrent's third positional after v
    # is gk, not beta.
    def fla_call(self, which, q, k, v, g, beta, S0):
        f = self.fla[which]
        kw = dict(g=g, beta=beta, scale=1.0, initial_state=S0,
                  output_final_state=True)
        try:
            return f(q, k, v, **kw)
        except Exception:  # noqa: BLE001
            r = v.shape[2] // q.shape[2]
            if r == 1:
                raise
            return f(q.repeat_interleave(r, 2), k.repeat_interleave(r, 2), v,
                     **kw)

    def gdn_inputs(self, q, k, v, g, beta, S0, dtype):
        return (self.t(q[None], dtype), self.t(k[None], dtype),
                self.t(v[None], dtype), self.t(g[None]),
                self.t(beta[None], dtype), self.t(S0[None]))

    def sdpa(self, q, k, v, causal, mask=None):
        """q [B, Hq, T, hd], k, v [B, Hkv, N, hd]; mask [T, N] (True: attend)
        or None."""
        F = self.torch.nn.functional
        r = q.shape[1] // k.shape[1]
        try:
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask,
                                                  is_causal=causal,
                                                  enable_gqa=True)
        except TypeError:  # torch < 2.5
            return F.scaled_dot_product_attention(
                q, k.repeat_interleave(r, 1), v.repeat_interleave(r, 1),
                attn_mask=mask, is_causal=causal)


# ---- accuracy -------------------------------------------------------------------


def accuracy(dump, anc, later):
    """Rows (case, output, who, rel_err) of our outputs; who is ours_*.
    The anchors' checks on the same inputs (each a call that appends its
    rows, its float64 reference already computed) go to later: they run
    after the anchors' timing, while the budget lasts (their first calls
    compile FLA's Triton kernels)."""
    rows = []
    if not dump or not os.path.isdir(dump):
        return rows
    for case in sorted(os.listdir(dump)):
        d = os.path.join(dump, case)
        if not os.path.isfile(os.path.join(d, "meta.txt")):
            continue
        t = time.time()
        log("float64 reference: %s" % case)
        try:
            case_accuracy(d, case, anc, rows, later)
        except Stop:
            raise
        except Exception as ex:  # noqa: BLE001 - one case's failure is reported
            stop_if(ex)
            log("case %s failed:\n%s" % (case, traceback.format_exc()))
        log("float64 reference: %s done (%.1f s)" % (case, time.time() - t))
    return rows


def anchor_try(case, who, fn):
    """Runs an anchor's accuracy check; its failure is logged, not fatal."""
    t = time.time()
    try:
        fn()
    except Stop:
        raise
    except Exception as ex:  # noqa: BLE001
        stop_if(ex)
        log("anchor %s on %s failed:\n%s" % (who, case,
                                              traceback.format_exc()))
    log("anchor accuracy %s on %s (%.1f s)" % (who, case, time.time() - t))


def case_accuracy(d, case, anc, rows, later):
    m = read_meta(d)
    op = m["op"]
    add = lambda out, who, x, ref: rows.append(  # noqa: E731
        (case, out, who, rel_err(x, ref)))
    if op == "gdn_chunk":
        T, Hk, Hv, dk, dv = m["T"], m["Hk"], m["Hv"], m["dk"], m["dv"]
        q, k = arr(d, "q.f32", (T, Hk, dk)), arr(d, "k.f32", (T, Hk, dk))
        v = arr(d, "v.f32", (T, Hv, dv))
        g, beta = arr(d, "g.f32", (T, Hv)), arr(d, "beta.f32", (T, Hv))
        S0 = arr(d, "S0.f32", (Hv, dk, dv))
        o, S, Tc = gdn_ref(q, k, v, g, beta, S0, want_tc=True)
        for var in ("f32", "bf16", "bf16a3", "bf16ro", "bf16a3ro",
                    "bf16r64", "bf16deep", "bf16o64", "bf16w8", "bf16ov",
                    "bf16fast",
                    "bf16fasta",
                    "bf16fastap", "bf16p",
                    "bf16v1", "bf16a1", "bf16ps", "f32mma", "f32mmaa3",
                    "f32mmap", "f32mmafast", "f32mmaround", "f32mmabf16in",
                    "f32mmabf16ina3ro", "f32mmabf16inr64",
                    "f32mmabf16indeep", "f32mmabf16inw8", "f32mmabf16inov",
                    "f32mmaro",
                    "f32mmav1", "f32mmaa1", "f32mmaps"):
            add("o", "ours_" + var, arr(d, "o_%s.f32" % var, o.shape), o)
            add("S", "ours_" + var, arr(d, "S_%s.f32" % var, S.shape), S)
            add("Tc", "ours_" + var, arr(d, "Tc_%s.f32" % var, Tc.shape),
                Tc)
        if anc.fla:
            for name, dt in (("fla_f32", anc.torch.float32),
                             ("fla_bf16", anc.torch.bfloat16)):
                def run(name=name, dt=dt):
                    xs = anc.gdn_inputs(q, k, v, g, beta, S0, dt)
                    fo, fS = anc.fla_call(0, *xs)
                    add("o", name, fo[0].float().cpu().numpy(), o)
                    add("S", name, fS[0].float().cpu().numpy(), S)
                later.append((case, name, run))
    elif op == "gdn_step":
        B, Hk, Hv, dk, dv, K = (m["B"], m["Hk"], m["Hv"], m["dk"], m["dv"],
                                m["K"])
        cd = 2 * Hk * dk + Hv * dv
        qkv = arr(d, "qkv.f32", (B, cd))
        a, b = arr(d, "a.f32", (B, Hv)), arr(d, "b.f32", (B, Hv))
        w = arr(d, "conv_w.f32", (cd, K))
        A_log, dtb = arr(d, "A_log.f32", (Hv,)), arr(d, "dt_bias.f32",
                                                    (Hv,))
        S0 = arr(d, "S0.f32", (B, Hv, dk, dv))
        c0 = arr(d, "conv0.f32", (B, cd, K - 1))
        q, k, v, g, beta, c1 = step_inputs_ref(m, qkv, a, b, w, A_log,
                                               dtb, c0)
        o = np.zeros((B, Hv, dv))
        S = np.zeros(S0.shape)
        for i in range(B):
            oi, Si, _ = gdn_ref(q[i:i + 1], k[i:i + 1], v[i:i + 1],
                                g[i:i + 1], beta[i:i + 1], S0[i])
            o[i], S[i] = oi[0], Si
        for var in ("step", "step_kh", "step_pipe", "step_pipe32",
                    "step_pipea", "step_pipew"):
            add("o", "ours_" + var, arr(d, "o_%s.f32" % var, o.shape), o)
            add("S", "ours_" + var, arr(d, "S_%s.f32" % var, S.shape), S)
            add("conv", "ours_" + var, arr(d, "conv_%s.f32" % var, c1.shape),
                c1)
        add("o", "ours_chain", arr(d, "o_chain.f32", o.shape), o)
        add("S", "ours_chain", arr(d, "S_chain.f32", S.shape), S)
        if anc.fla:
            for name, dt in (("fla_f32", anc.torch.float32),
                             ("fla_bf16", anc.torch.bfloat16)):
                def run(name=name, dt=dt):
                    # one token per request: [B, 1, H, d]
                    xs = (anc.t(q[:, None], dt), anc.t(k[:, None], dt),
                          anc.t(v[:, None], dt), anc.t(g[:, None]),
                          anc.t(beta[:, None], dt), anc.t(S0))
                    fo, fS = anc.fla_call(1, *xs)
                    add("o", name, fo[:, 0].float().cpu().numpy(), o)
                    add("S", name, fS.float().cpu().numpy(), S)
                later.append((case, name, run))
    elif op in ("attention_prefill", "attention_decode",
                "attention_decode_paged"):
        Hq, Hkv, hd = m["Hq"], m["Hkv"], m["hd"]
        gather = None
        if op == "attention_prefill":
            T = m["T"]
            q = arr(d, "q.f32", (T, Hq, hd))
            k, v = (arr(d, "k.f32", (T, Hkv, hd)),
                    arr(d, "v.f32", (T, Hkv, hd)))
            o = attention_ref(q, k, v, np.arange(T))
            ours = arr(d, "o.f32", o.shape)
            qs, ks, vs = q[None], k[None], v[None]
        elif op == "attention_decode_paged":
            # every request's N positions through its row of the table
            B, N, P = m["B"], m["N"], m["P"]
            q = arr(d, "q.f32", (B, Hq, hd))
            table = np.fromfile(os.path.join(d, "table.i32"),
                                dtype="<i4").reshape(B, N // P)
            ks, vs = (arr(d, f, (-1, P, Hkv, hd))
                      for f in ("k_pages.f32", "v_pages.f32"))

            def gather(x, ix):  # [pages, P, Hkv, hd] -> [B, N, Hkv, hd]
                return x[ix].reshape(B, N, Hkv, hd)
            kg, vg = gather(ks, table), gather(vs, table)
            o = np.stack([attention_ref(q[i:i + 1], kg[i], vg[i])[0]
                          for i in range(B)])
            ours = arr(d, "o.f32", o.shape)
            qs = q[:, None]
        else:
            B, N = m["B"], m["N"]
            q = arr(d, "q.f32", (B, Hq, hd))
            k, v = (arr(d, "k.f32", (B, N, Hkv, hd)),
                    arr(d, "v.f32", (B, N, Hkv, hd)))
            o = np.stack([attention_ref(q[i:i + 1], k[i], v[i])[0]
                          for i in range(B)])
            ours = arr(d, "o.f32", o.shape)
            qs, ks, vs = q[:, None], k, v
        add("o", "ours", ours, o)
        # the other kernels of the op (gpu_kernels.c's att_*_kinds)
        for var in ("flash3", "flash3seq", "flash3ws", "flash2", "flash2x",
                    "bf16", "simple", "1blk"):
            f = os.path.join(d, "o_%s.f32" % var)
            if os.path.exists(f):
                add("o", "ours_att_" + var, arr(d, "o_%s.f32" % var, o.shape),
                    o)
        if anc.torch:
            for name, dt in (("sdpa_f32", anc.torch.float32),
                             ("sdpa_bf16", anc.torch.bfloat16)):
                def run(name=name, dt=dt):
                    tq = anc.t(qs, dt).transpose(1, 2)
                    tk, tv = anc.t(ks, dt), anc.t(vs, dt)
                    if gather:  # the anchor's own gather, on the device
                        ix = anc.torch.from_numpy(table.astype(np.int64)).to(
                            anc.dev)
                        tk, tv = gather(tk, ix), gather(tv, ix)
                    tk, tv = tk.transpose(1, 2), tv.transpose(1, 2)
                    so = anc.sdpa(tq, tk, tv, op == "attention_prefill")
                    so = so.transpose(1, 2).float().cpu().numpy()
                    add("o", name, so.reshape(o.shape), o)
                later.append((case, name, run))
    elif op == "matmul":
        n, i_, o_ = m["n"], m["in"], m["out"]
        x, w = arr(d, "x.f32", (n, i_)), arr(d, "w.f32", (o_, i_))
        y = x.astype(np.float64) @ w.astype(np.float64).T
        add("y", "ours_f32", arr(d, "y_f32.f32", y.shape), y)
        add("y", "ours_bf16", arr(d, "y_bf16.f32", y.shape), y)
        if anc.torch:
            def run():
                tx, tw = anc.t(x), anc.t(w)
                add("y", "torch_f32", (tx @ tw.T).cpu().numpy(), y)
                bx, bw = tx.bfloat16(), tw.bfloat16()
                add("y", "torch_bf16", (bx @ bw.T).float().cpu().numpy(), y)
            later.append((case, "torch matmul", run))


# The rows of accuracy() that stand for each bench op: (dump op, who,
# outputs).
ERR_OF = {
    "gdn_chunk_f32": ("gdn_chunk", "ours_f32", ("o", "S")),
    "gdn_chunk_f32_tc": ("gdn_chunk", "ours_f32", ("o", "S", "Tc")),
    "gdn_chunk_bf16": ("gdn_chunk", "ours_bf16", ("o", "S")),
    "gdn_chunk_bf16_tc": ("gdn_chunk", "ours_bf16", ("o", "S", "Tc")),
    "gdn_chunk_bf16_fast": ("gdn_chunk", "ours_bf16fast", ("o", "S")),
    "gdn_chunk_bf16_fast_tc": ("gdn_chunk", "ours_bf16fast", ("o", "S", "Tc")),
    "gdn_chunk_bf16_fasta": ("gdn_chunk", "ours_bf16fasta", ("o", "S")),
    "gdn_chunk_bf16_fasta_tc": ("gdn_chunk", "ours_bf16fasta",
                                ("o", "S", "Tc")),
    "gdn_chunk_bf16_fasta_p": ("gdn_chunk", "ours_bf16fastap", ("o", "S")),
    "gdn_chunk_bf16_fasta_p_tc": ("gdn_chunk", "ours_bf16fastap",
                                   ("o", "S", "Tc")),
    "gdn_chunk_bf16_p": ("gdn_chunk", "ours_bf16p", ("o", "S")),
    "gdn_chunk_bf16_p_tc": ("gdn_chunk", "ours_bf16p", ("o", "S", "Tc")),
    "gdn_chunk_f32mma_p": ("gdn_chunk", "ours_f32mmap", ("o", "S")),
    "gdn_chunk_f32mma_p_tc": ("gdn_chunk", "ours_f32mmap",
                                ("o", "S", "Tc")),
    "gdn_chunk_f32mma_bf16in": ("gdn_chunk", "ours_f32mmabf16in", ("o", "S")),
    "gdn_chunk_f32mma_bf16in_tc": ("gdn_chunk", "ours_f32mmabf16in",
                                   ("o", "S", "Tc")),
    "gdn_chunk_f32mma_round": ("gdn_chunk", "ours_f32mmaround", ("o", "S")),
    "gdn_chunk_f32mma_round_tc": ("gdn_chunk", "ours_f32mmaround",
                                  ("o", "S", "Tc")),
    "gdn_chunk_bf16_v1": ("gdn_chunk", "ours_bf16v1", ("o", "S")),
    "gdn_chunk_bf16_v1_tc": ("gdn_chunk", "ours_bf16v1", ("o", "S", "Tc")),
    "gdn_chunk_f32mma": ("gdn_chunk", "ours_f32mma", ("o", "S")),
    "gdn_chunk_f32mma_tc": ("gdn_chunk", "ours_f32mma", ("o", "S", "Tc")),
    "gdn_chunk_f32mma_fast": ("gdn_chunk", "ours_f32mmafast", ("o", "S")),
    "gdn_chunk_f32mma_fast_tc": ("gdn_chunk", "ours_f32mmafast",
                                 ("o", "S", "Tc")),
    "gdn_chunk_f32mma_v1": ("gdn_chunk", "ours_f32mmav1", ("o", "S")),
    "gdn_chunk_f32mma_v1_tc": ("gdn_chunk", "ours_f32mmav1", ("o", "S", "Tc")),
    "gdn_chunk_bf16_ro": ("gdn_chunk", "ours_bf16ro", ("o", "S")),
    "gdn_chunk_bf16_ro_tc": ("gdn_chunk", "ours_bf16ro", ("o", "S", "Tc")),
    "gdn_chunk_bf16_a3ro": ("gdn_chunk", "ours_bf16a3ro", ("o", "S")),
    "gdn_chunk_bf16_a3ro_tc": ("gdn_chunk", "ours_bf16a3ro",
                               ("o", "S", "Tc")),
    "gdn_chunk_f32mma_bf16in_a3ro": ("gdn_chunk", "ours_f32mmabf16ina3ro",
                                     ("o", "S")),
    "gdn_chunk_f32mma_bf16in_a3ro_tc": ("gdn_chunk", "ours_f32mmabf16ina3ro",
                                        ("o", "S", "Tc")),
    "gdn_chunk_bf16_r64": ("gdn_chunk", "ours_bf16r64", ("o", "S")),
    "gdn_chunk_bf16_r64_tc": ("gdn_chunk", "ours_bf16r64", ("o", "S", "Tc")),
    "gdn_chunk_f32mma_bf16in_r64": ("gdn_chunk", "ours_f32mmabf16inr64",
                                    ("o", "S")),
    "gdn_chunk_f32mma_bf16in_r64_tc": ("gdn_chunk", "ours_f32mmabf16inr64",
                                       ("o", "S", "Tc")),
    "gdn_chunk_bf16_deep": ("gdn_chunk", "ours_bf16deep", ("o", "S")),
    "gdn_chunk_bf16_deep_tc": ("gdn_chunk", "ours_bf16deep", ("o", "S", "Tc")),
    "gdn_chunk_bf16_o64": ("gdn_chunk", "ours_bf16o64", ("o", "S")),
    "gdn_chunk_bf16_o64_tc": ("gdn_chunk", "ours_bf16o64", ("o", "S", "Tc")),
    "gdn_chunk_bf16_ov": ("gdn_chunk", "ours_bf16ov", ("o", "S")),
    "gdn_chunk_bf16_ov_tc": ("gdn_chunk", "ours_bf16ov", ("o", "S", "Tc")),
    "gdn_chunk_f32mma_bf16in_ov": ("gdn_chunk", "ours_f32mmabf16inov",
                                   ("o", "S")),
    "gdn_chunk_f32mma_bf16in_ov_tc": ("gdn_chunk", "ours_f32mmabf16inov",
                                      ("o", "S", "Tc")),
    "gdn_chunk_bf16_w8": ("gdn_chunk", "ours_bf16w8", ("o", "S")),
    "gdn_chunk_bf16_w8_tc": ("gdn_chunk", "ours_bf16w8", ("o", "S", "Tc")),
    "gdn_chunk_f32mma_bf16in_w8": ("gdn_chunk", "ours_f32mmabf16inw8",
                                   ("o", "S")),
    "gdn_chunk_f32mma_bf16in_w8_tc": ("gdn_chunk", "ours_f32mmabf16inw8",
                                      ("o", "S", "Tc")),
    "gdn_chunk_f32mma_bf16in_deep": ("gdn_chunk", "ours_f32mmabf16indeep",
                                     ("o", "S")),
    "gdn_chunk_f32mma_bf16in_deep_tc": ("gdn_chunk", "ours_f32mmabf16indeep",
                                        ("o", "S", "Tc")),
    "gdn_chunk_f32mma_ro": ("gdn_chunk", "ours_f32mmaro", ("o", "S")),
    "gdn_chunk_f32mma_ro_tc": ("gdn_chunk", "ours_f32mmaro",
                               ("o", "S", "Tc")),
    "gdn_chunk_bf16_a3": ("gdn_chunk", "ours_bf16a3", ("o", "S")),
    "gdn_chunk_bf16_a3_tc": ("gdn_chunk", "ours_bf16a3", ("o", "S", "Tc")),
    "gdn_chunk_f32mma_a3": ("gdn_chunk", "ours_f32mmaa3", ("o", "S")),
    "gdn_chunk_f32mma_a3_tc": ("gdn_chunk", "ours_f32mmaa3",
                               ("o", "S", "Tc")),
    "gdn_chunk_bf16_a1": ("gdn_chunk", "ours_bf16a1", ("o", "S")),
    "gdn_chunk_bf16_a1_tc": ("gdn_chunk", "ours_bf16a1", ("o", "S", "Tc")),
    "gdn_chunk_f32mma_a1": ("gdn_chunk", "ours_f32mmaa1", ("o", "S")),
    "gdn_chunk_f32mma_a1_tc": ("gdn_chunk", "ours_f32mmaa1", ("o", "S", "Tc")),
    "gdn_chunk_bf16_ps": ("gdn_chunk", "ours_bf16ps", ("o", "S")),
    "gdn_chunk_bf16_ps_tc": ("gdn_chunk", "ours_bf16ps", ("o", "S", "Tc")),
    "gdn_chunk_f32mma_ps": ("gdn_chunk", "ours_f32mmaps", ("o", "S")),
    "gdn_chunk_f32mma_ps_tc": ("gdn_chunk", "ours_f32mmaps", ("o", "S", "Tc")),
    "gdn_step": ("gdn_step", "ours_step", ("o", "S")),
    "gdn_step_kh": ("gdn_step", "ours_step_kh", ("o", "S")),
    "gdn_step_pipe": ("gdn_step", "ours_step_pipe", ("o", "S")),
    "gdn_step_pipe32": ("gdn_step", "ours_step_pipe32", ("o", "S")),
    "gdn_step_pipea": ("gdn_step", "ours_step_pipea", ("o", "S")),
    "gdn_step_pipew": ("gdn_step", "ours_step_pipew", ("o", "S")),
    "gdn_decode": ("gdn_step", "ours_chain", ("o", "S")),
    "gdn_decode_chain": ("gdn_step", "ours_chain", ("o", "S")),
    "attention_prefill": ("attention_prefill", "ours", ("o",)),
    "attention_prefill_bf16": ("attention_prefill", "ours_att_bf16", ("o",)),
    "attention_prefill_flash3": ("attention_prefill", "ours_att_flash3",
                                 ("o",)),
    "attention_prefill_flash3seq": ("attention_prefill",
                                    "ours_att_flash3seq", ("o",)),
    "attention_prefill_flash3ws": ("attention_prefill",
                                   "ours_att_flash3ws", ("o",)),
    "attention_prefill_flash2": ("attention_prefill", "ours_att_flash2",
                                 ("o",)),
    "attention_prefill_flash2x": ("attention_prefill", "ours_att_flash2x",
                                  ("o",)),
    "attention_prefill_simple": ("attention_prefill", "ours_att_simple",
                                 ("o",)),
    "attention_decode": ("attention_decode", "ours", ("o",)),
    "attention_decode_1blk": ("attention_decode", "ours_att_1blk", ("o",)),
    "attention_decode_simple": ("attention_decode", "ours_att_simple",
                                ("o",)),
    "attention_decode_paged": ("attention_decode_paged", "ours", ("o",)),
    "matmul_f32": ("matmul", "ours_f32", ("y",)),
    "matmul_bf16": ("matmul", "ours_bf16", ("y",)),
}

# Who each anchor is in accuracy(): its errors are read on the bench op's
# dumped case (ERR_OF), so an attention anchor is judged on the same
# prefill or decode case as ours.
ANCHOR_WHO = {
    "fla chunk_gated_delta_rule f32": "fla_f32",
    "fla chunk_gated_delta_rule bf16": "fla_bf16",
    "fla fused_recurrent_gated_delta_rule f32": "fla_f32",
    "fla fused_recurrent_gated_delta_rule bf16": "fla_bf16",
    "torch sdpa f32": "sdpa_f32",
    "torch sdpa bf16": "sdpa_bf16",
    "torch paged sdpa f32": "sdpa_f32",
    "torch paged sdpa bf16": "sdpa_bf16",
    "torch matmul f32 (no tf32)": "torch_f32",
    "torch matmul bf16": "torch_bf16",
}


def worst(acc, case_op, who, outs, model):
    """The largest error of who's outputs outs on case case_op-model."""
    vals = [e for (case, out, w, e) in acc
            if case == case_op + "-" + model and w == who and out in outs]
    return max(vals) if vals else None


# ---- timing of the anchors ----------------------------------------------------------


def anchors_for(op):
    if op.startswith("gdn_chunk_f32mma_round"):  # f32 in, FLA's bf16 precision
        return ["fla chunk_gated_delta_rule bf16", "fla chunk_gated_delta_rule f32"]
    if op.startswith("gdn_chunk_f32"):
        return ["fla chunk_gated_delta_rule f32"]
    if op.startswith("gdn_chunk_bf16"):
        return ["fla chunk_gated_delta_rule bf16"]
    if op.startswith("gdn_step"):
        return ["fla fused_recurrent_gated_delta_rule f32",
                "fla fused_recurrent_gated_delta_rule bf16"]
    if op in ("gdn_decode", "gdn_decode_chain"):
        return ["fla fused_recurrent_gated_delta_rule f32"]
    if op.startswith("attention_prefill"):
        return ["torch sdpa f32", "torch sdpa bf16"]
    if op.startswith("attention_append"):
        return ["torch sdpa bf16"]
    if op.startswith("attention_decode_paged"):
        return ["torch paged sdpa f32", "torch paged sdpa bf16"]
    if op.startswith("attention_decode"):
        return ["torch sdpa f32", "torch sdpa bf16"]
    if op == "matmul_f32":
        return ["torch matmul f32 (no tf32)"]
    if op in ("matmul_bf16", "matmul_bf16_gemv"):
        return ["torch matmul bf16"]
    if op == "copy_d2d":
        return ["torch copy_"]
    if op.startswith("sample_argmax"):
        return ["torch argmax"]
    if op in ("sample_topk", "sample_topk_lp"):
        # the same answer: the row's probabilities, the k largest
        return ["torch softmax+topk"]
    return []


def priority(r, name=""):
    """Order of the anchors' timing: torch SDPA bf16 at the prefill shapes
    first (a few seconds, no compiling; an earlier run ran out of time
    before them), then the chunk at 16k (FLA bf16, the target's anchor,
    before f32: each compiles for a minute), decode, the rest; SDPA f32 at
    64k keys (seconds a call) last."""
    op, p = r["op"], r["params"]
    if op.startswith("attention_prefill") and name == "torch sdpa bf16":
        return -1
    if op.startswith("attention_prefill") and "T=65536," in p:
        return 6
    if op.startswith("gdn_chunk") and "T=16384," in p:
        return 0 if name.endswith("bf16") else 0.5
    if op == "copy_d2d":
        return 0
    if op.startswith("gdn_step") or op.startswith("gdn_decode"):
        return 1
    if op.startswith("gdn_chunk"):
        return 2
    if op.startswith("attention_decode"):
        return 3
    return {"matmul_f32": 4, "matmul_bf16": 4}.get(op, 5)


def run_anchor(anc, name, p, deadline):
    """Milliseconds of one anchor at bench params p, or (None, why)."""
    torch = anc.torch
    if torch is None:
        return None, "; ".join(anc.why)
    if name.startswith("fla") and not anc.fla:
        return None, "; ".join(anc.why)
    gen = torch.Generator(device=anc.dev).manual_seed(1)
    dt = torch.bfloat16 if name.endswith("bf16") else torch.float32
    rnd = lambda *s: torch.randn(*s, device=anc.dev, generator=gen)  # noqa

    def unit(x):
        return x / x.norm(dim=-1, keepdim=True)

    if name.startswith("fla chunk"):
        T, Hk, Hv, dk, dv = p["T"], p["Hk"], p["Hv"], p["dk"], p["dv"]
        q = (unit(rnd(1, T, Hk, dk)) / dk ** 0.5).to(dt)
        k = unit(rnd(1, T, Hk, dk)).to(dt)
        v = rnd(1, T, Hv, dv).to(dt)
        g = -torch.rand(1, T, Hv, device=anc.dev, generator=gen) * 2.0
        beta = torch.rand(1, T, Hv, device=anc.dev, generator=gen).to(dt)
        S0 = rnd(Hv, dk, dv)[None] * 0.1
        return anc.time(lambda: anc.fla_call(0, q, k, v, g, beta, S0),
                        deadline), None
    if name.startswith("fla fused"):
        B, Hk, Hv, dk, dv = p["B"], p["Hk"], p["Hv"], p["dk"], p["dv"]
        q = (unit(rnd(B, 1, Hk, dk)) / dk ** 0.5).to(dt)
        k = unit(rnd(B, 1, Hk, dk)).to(dt)
        v = rnd(B, 1, Hv, dv).to(dt)
        g = -torch.rand(B, 1, Hv, device=anc.dev, generator=gen)
        beta = torch.rand(B, 1, Hv, device=anc.dev, generator=gen).to(dt)
        # state sets over >= 256 MB, as the C bench, so L2 holds none
        sb = B * Hv * dk * dv * 4
        n = max(1, min(256, -(-(256 << 20) // sb)))
        sets = [torch.zeros(B, Hv, dk, dv, device=anc.dev) for _ in range(n)]
        it = [0]

        def step():
            it[0] += 1
            return anc.fla_call(1, q, k, v, g, beta, sets[it[0] % n])
        return anc.time(step, deadline), None
    if name.startswith("torch sdpa"):
        if "T" in p and "N" in p:
            # T queries, the last of N keys (attention_append): causal
            # aligned to the end, as an explicit mask (is_causal aligns
            # to the start)
            T, N = p["T"], p["N"]
            q = rnd(1, p["Hq"], T, p["hd"]).to(dt)
            k = rnd(1, p["Hkv"], N, p["hd"]).to(dt)
            v = rnd(1, p["Hkv"], N, p["hd"]).to(dt)
            keys = torch.arange(N, device=anc.dev)
            last = N - T + torch.arange(T, device=anc.dev)
            mask = keys[None, :] <= last[:, None]
            return anc.time(lambda: anc.sdpa(q, k, v, False, mask),
                            deadline), None
        if "T" in p:
            q = rnd(1, p["Hq"], p["T"], p["hd"]).to(dt)
            k = rnd(1, p["Hkv"], p["T"], p["hd"]).to(dt)
            v = rnd(1, p["Hkv"], p["T"], p["hd"]).to(dt)
            if dt != torch.bfloat16:
                # f32 has no flash kernel, and GQA keeps the memory-
                # efficient one out: the math kernel's T x T scores at 64k
                # would not fit. K/V repeated per query head (not timed;
                # the same flops) let the efficient kernel run.
                r = p["Hq"] // p["Hkv"]
                k, v = k.repeat_interleave(r, 1), v.repeat_interleave(r, 1)
            return anc.time(lambda: anc.sdpa(q, k, v, True), deadline), None
        q = rnd(p["B"], p["Hq"], 1, p["hd"]).to(dt)
        k = rnd(p["B"], p["Hkv"], p["N"], p["hd"]).to(dt)
        v = rnd(p["B"], p["Hkv"], p["N"], p["hd"]).to(dt)
        return anc.time(lambda: anc.sdpa(q, k, v, False), deadline), None
    if name.startswith("torch paged sdpa"):
        # pages of P positions, shuffled over one arena as the C bench's;
        # timed: the gather of each request's K/V through its table row
        # into contiguous [B, Hkv, N, hd], then SDPA (torch has no paged
        # attention of its own)
        B, N, P, Hkv, hd = p["B"], p["N"], p["P"], p["Hkv"], p["hd"]
        q = rnd(B, p["Hq"], 1, hd).to(dt)
        kp = rnd(B * N // P, P, Hkv, hd).to(dt)
        vp = rnd(B * N // P, P, Hkv, hd).to(dt)
        table = torch.randperm(B * N // P, device=anc.dev,
                               generator=gen).view(B, N // P)

        def paged():
            k = kp[table].view(B, N, Hkv, hd).transpose(1, 2)
            v = vp[table].view(B, N, Hkv, hd).transpose(1, 2)
            return anc.sdpa(q, k, v, False)
        return anc.time(paged, deadline), None
    if name.startswith("torch matmul"):
        x = rnd(p["n"], p["in"]).to(dt)
        w = rnd(p["out"], p["in"]).to(dt)
        return anc.time(lambda: x @ w.T, deadline), None
    if name == "torch argmax":
        x = rnd(p["B"], p["V"])
        return anc.time(lambda: torch.argmax(x, dim=-1), deadline), None
    if name == "torch softmax+topk":
        x = rnd(p["B"], p["V"])
        return anc.time(lambda: torch.topk(torch.softmax(x, -1), p["k"]),
                        deadline), None
    if name == "torch copy_":
        n = p["bytes"] // 4
        a = torch.zeros(n, device=anc.dev)
        b = torch.empty_like(a)
        return anc.time(lambda: b.copy_(a), deadline), None
    return None, "no anchor"


# ---- report ---------------------------------------------------------------------------


def fmt(x, f="%.4g"):
    return "-" if x is None else f % x


class Stop(Exception):
    """SIGTERM (timeout's first signal): write what there is, then exit."""


def on_term(signum, frame):
    raise Stop()


def stop_if(ex):
    """Raises Stop where ex came from one: SIGTERM's Stop raised while a C
    function runs (np.fromfile, a torch call) comes back as that call's
    error (a SystemError), with the Stop as its cause or context."""
    seen = set()
    while ex is not None and id(ex) not in seen:
        if isinstance(ex, Stop):
            raise Stop() from ex
        seen.add(id(ex))
        ex = ex.__cause__ or ex.__context__


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bench", help="gpu_kernels' TSV")
    ap.add_argument("--dump", help="gpu_kernels' --dump folder")
    ap.add_argument("--out", required=True, help="folder for the results")
    ap.add_argument("--budget", type=float, default=200.0,
                    help="seconds in all (default 200): no anchor timing "
                    "or anchor accuracy check starts past it")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    signal.signal(signal.SIGTERM, on_term)
    rows, device = read_bench(a.bench)
    acc, cache, later = [], {}, []
    anc = None
    try:
        anc = Anchors()
        log("torch/CUDA: %s; FLA: %s" % (
            "yes" if anc.torch else "no", "yes" if anc.fla else "no"))
        # our outputs against float64 first (numpy, seconds), then the
        # anchors' timing most wanted first, then the anchors' own
        # accuracy: each result is on disk as soon as it exists
        acc += accuracy(a.dump, anc, later)
        write_all(a, rows, device, anc, acc, cache)
        deadline = T0 + a.budget
        time_anchors(a, rows, device, anc, acc, cache, deadline)
        for case, who, fn in later:
            if time.time() > deadline:
                log("anchor accuracy %s on %s: skipped (budget)" % (who, case))
                continue
            anchor_try(case, who, fn)
            write_all(a, rows, device, anc, acc, cache)
    except Stop:
        log("terminated: writing what there is")
        write_all(a, rows, device, anc, acc, cache)
        return 124
    write_all(a, rows, device, anc, acc, cache)
    log("wrote %s/{kernels.tsv,accuracy.tsv,report.md}" % a.out)
    return 0


def time_anchors(a, rows, device, anc, acc, cache, deadline):
    """Each bench row's anchors timed into cache[(name, model, params)] =
    (ms or None, why), most wanted first (priority(); Triton's compiles
    and autotuning may use up the budget)."""
    pairs = [(r, name) for r in rows for name in anchors_for(r["op"])]
    for r, name in sorted(pairs, key=lambda x: priority(*x)):
        key = (name, r["model"], r["params"])
        if key in cache or name == "-":
            continue
        if time.time() > deadline:
            cache[key] = (None, "skipped: budget")
            continue
        log("anchor %s %s %s" % key)
        t = time.time()
        try:
            cache[key] = run_anchor(anc, name, params(r["params"]),
                                    deadline)
        except Stop:
            raise
        except Exception as ex:  # noqa: BLE001 - report, go on
            stop_if(ex)
            cache[key] = (None,
                          "error: %s" % str(ex).splitlines()[0][:80])
        log("anchor %s: %s ms (%.1f s)" % (
            name, fmt(cache[key][0]), time.time() - t))
        if anc.torch:
            anc.torch.cuda.empty_cache()
        write_all(a, rows, device, anc, acc, cache)


def out_rows_of(rows, acc, cache):
    """kernels.tsv's rows: each bench row beside each of its anchors."""
    out_rows = []
    for r in rows:
        op, model = r["op"], r["model"]
        ours = None if r["ms"] == "-" else float(r["ms"])
        e = None
        if op in ERR_OF:
            case, who, outs = ERR_OF[op]
            e = worst(acc, case, who, outs, model)
        for name in anchors_for(op) or ["-"]:
            key = (name, model, r["params"])
            ams, why = cache.get(key, (None, "no anchor" if name == "-"
                                       else "not run"))
            ae = None
            if name in ANCHOR_WHO and op in ERR_OF:
                case, _, outs = ERR_OF[op]
                ae = worst(acc, case, ANCHOR_WHO[name], outs, model)
            out_rows.append(dict(op=op, model=model, params=r["params"],
                                 ours=ours, anchor=name, anchor_ms=ams,
                                 err=e, anchor_err=ae, gbps=r["gb_per_s"],
                                 rate=r["tokens_per_s"],
                                 tflops=r["tflop_per_s"],
                                 note=r.get("note") or why or ""))
    return out_rows


def write_all(a, rows, device, anc, acc, cache):
    """kernels.tsv, accuracy.tsv and report.md from what there is now
    (written whole each time, then renamed: never half a file)."""
    out_rows = out_rows_of(rows, acc, cache)
    copy_gbps = None
    for r in rows:
        if r["op"] == "copy_d2d" and r["gb_per_s"] != "-":
            copy_gbps = float(r["gb_per_s"])

    def put(fname, text):
        path = os.path.join(a.out, fname)
        with open(path + ".part", "w") as f:
            f.write(text)
        os.replace(path + ".part", path)

    put("accuracy.tsv", "case\toutput\twho\trel_err_vs_f64\n" + "".join(
        "%s\t%s\t%s\t%.3e\n" % x for x in acc))
    put("kernels.tsv",
        "op\tshape\tours_ms\tanchor\tanchor_ms\trel_err_vs_f64\n" + "".join(
            "%s\t%s %s\t%s\t%s\t%s\t%s\n" % (
                x["op"], x["model"], x["params"], fmt(x["ours"]), x["anchor"],
                fmt(x["anchor_ms"]), fmt(x["err"], "%.2e"))
            for x in out_rows))
    torch_ok = anc is not None and anc.torch is not None
    name = device or (anc.name if torch_ok else None)
    L = ["# GPU kernels vs anchors\n\n"]
    w = L.append
    if not rows or device is None:
        w("**No CUDA device**: the C bench measured nothing (%s). "
          "Only the float64 checks of the dumped outputs ran.\n\n"
          % ("it found no device" if a.bench and os.path.exists(a.bench)
             else "no bench TSV"))
    w("- device: %s\n" % (name or "none"))
    if anc is None:
        w("- anchors: none (not started)\n")
    else:
        w("- anchors: %s\n" % ("torch %s, FLA %s" % (
            anc.torch.__version__, "yes" if anc.fla else "no")
            if torch_ok else "none (%s)" % "; ".join(anc.why)))
    w("- copy bandwidth (cudaMemcpy D2D, read + write): %s GB/s; the "
      "decode target is 85 %% of it\n" % fmt(copy_gbps, "%.0f"))
    w("- rel_err_vs_f64 = max |x - ref| / max |ref| against a float64 "
      "recurrence / attention / product on the dumped small shape of "
      "the op and model (bench/gpu_kernels.c --dump), not at each "
      "timed size\n\n")
    w("| op | model | params | ours ms | rate | GB/s (% copy) | "
      "TFLOP/s | anchor | anchor ms | anchor/ours | ours err | "
      "anchor err | note |\n")
    w("|---|---|---|---:|---:|---:|---:|---|---:|---:|---:|---:|---|\n")
    for x in out_rows:
        pct = ""
        if x["gbps"] not in ("-", "") and copy_gbps:
            pct = " (%.0f %%)" % (100.0 * float(x["gbps"]) / copy_gbps)
        ratio = (x["anchor_ms"] / x["ours"]
                 if x["ours"] and x["anchor_ms"] else None)
        w("| %s | %s | %s | %s | %s | %s%s | %s | %s | %s | %s | %s | "
          "%s | %s |\n" % (
              x["op"], x["model"], x["params"], fmt(x["ours"]),
              x["rate"], x["gbps"], pct, x["tflops"], x["anchor"],
              fmt(x["anchor_ms"]), fmt(ratio, "%.2f"),
              fmt(x["err"], "%.1e"), fmt(x["anchor_err"], "%.1e"),
              x["note"]))
    w("\n## Accuracy on the dumped shapes\n\n| case | output | who | "
      "rel err vs f64 |\n|---|---|---|---:|\n")
    for case, out, who, e in acc:
        w("| %s | %s | %s | %.2e |\n" % (case, out, who, e))
    put("report.md", "".join(L))


if __name__ == "__main__":
    sys.exit(main())
