#!/usr/bin/env python3
"""train_model.py - train the small Qwen3.5-architecture default model on the
rag_data retrieval task (CPU, PyTorch, transformers' Qwen3_5ForCausalLM).

Token stream, exactly as the engine feeds it (DESIGN §3): every segment of
"SYSTEM SEP doc_1 SEP ... SEP doc_n SEP question" is tokenized on its own
(no BOS, no special tokens) and the ids are concatenated; the separator is
not fed. The model then emits " answer" <|im_end|>.

Training examples (generated on the fly from a per-step seed, so a resumed
run sees the same data):
  system + docs + Q1 A1 <|im_end|> Q2 A2 <|im_end|> ... (3..6 questions about
  the same documents, for a denser answer signal; val/test prompts have one).
Loss: cross-entropy on the answer tokens and <|im_end|> (weight 1), plus an
LM loss of weight --lm-weight on the document tokens and --q-weight on the
question tokens (names recur in docs and questions: copy / induction signal).

Retrieval needs copy (induction) heads, and this hybrid at this size does
not form them on its own within a CPU budget (TRAINING.md). So:
  - residual branches start at zero (--zero-init-out), so untrained layers are
    exact identities;
  - phase 1 (--attn-steps): only the two full-attention layers (with the
    embeddings) train: an attention-only model inside the hybrid, which forms
    induction heads in a few hundred steps; then the GDN layers join with their
    lr ramped up over --unfreeze-ramp steps;
  - copy rows (a random token run shown twice, with a random length and gap)
    fill --copy-frac of each batch for --copy-steps steps, then
    --copy-frac-late of it to the end, so the copy heads do not decay.
Learning rate: warm-up, held at the peak, cosine decay over the last
--decay-frac of the steps.

Curriculum: rag_data.STAGES (1 doc, then 2-3 docs x <= 3 facts, then up to
6, 10 and 16 documents). A stage is left when the running teacher-forced exact match of
the training answers reaches --advance-em, or at its step limit.
Batches: one n_docs per batch, filled up to --batch-tokens tokens.

Exact match (EM): all answer tokens and the final <|im_end|> are the argmax
under teacher forcing, which is the same as greedy decoding producing exactly
the answer and stopping.

Logs: <out>/training_log.tsv (step, loss, answer loss, lr, train EM, val EM,
stage, elapsed seconds). Checkpoints: <ckpt>/last.pt every --ckpt-every steps
(resume: run the same command again), <ckpt>/best.pt at the best val EM.

    OMP_NUM_THREADS=1 nice -n 10 tools/train_model.py --out models/default \\
        --ckpt tools/train/ckpt --steps 1500 --seed 1
    tools/train_model.py --out models/default --ckpt tools/train/ckpt --export-only
"""

import argparse
import csv
import json
import math
import os
import random
import sys
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

TOOLS = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, TOOLS)
import rag_data  # noqa: E402

EOS = "<|im_end|>"
PAD = "<|endoftext|>"


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    a = p.add_argument
    a("--out", default="models/default", help="model dir (tokenizer.json must exist; log, export)")
    a("--ckpt", default="tools/train/ckpt", help="checkpoint dir (last.pt, best.pt)")
    a("--data", default="tools/train/data", help="dir with val.jsonl, test.jsonl")
    a("--seed", type=int, default=1)
    a("--steps", type=int, default=1600)
    a("--time-budget", type=float, default=0, help="stop after this many seconds (0 = none)")
    a("--batch-tokens", type=int, default=1024)
    a("--max-batch", type=int, default=24)
    a("--lr", type=float, default=2e-3)
    a("--min-lr-frac", type=float, default=0.05)
    a("--warmup", type=int, default=60)
    a("--wd", type=float, default=0.05)
    a("--clip", type=float, default=1.0)
    a("--decay-frac", type=float, default=1.0,
      help="the lr is held at its peak after warm-up and decays (cosine) over this last fraction of --steps")
    a("--zero-init-out", type=int, default=1,
      help="start every residual branch at zero (out_proj, o_proj, down_proj): see build_model")
    a("--attn-steps", type=int, default=0,
      help="phase 1: only the full-attention layers (with embeddings and final norm) train; the GDN layers "
           "stay exact identities (zero-initialised outputs) until then")
    a("--unfreeze-ramp", type=int, default=200, help="steps over which the GDN layers' lr ramps up after phase 1")
    a("--copy-steps", type=int, default=0, help="copy warm-up: steps that mix copy rows into the batches")
    a("--copy-frac", type=float, default=0.5, help="share of a warm-up batch's tokens that are copy rows")
    a("--copy-frac-late", type=float, default=0.0,
      help="share of copy rows after the warm-up (keeps the copy heads alive: without them they decay)")
    a("--copy-len", type=int, default=32, help="length of the random sequence a copy row repeats")
    a("--copy-pool", type=int, default=0,
      help="copy rows draw from the K most frequent answer tokens (0: every plain token). The steps before "
           "induction forms grow with the number of distinct tokens copied (measured: TRAINING.md), and the "
           "answers are the tokens retrieval must copy")
    a("--lm-weight", type=float, default=0.2)
    a("--q-weight", type=float, default=0.2, help="LM loss weight of question tokens")
    a("--max-questions", type=int, default=6)
    a("--advance-em", type=float, default=0.8)
    a("--stage-steps", default="0.15,0.3,0.45,0.6", help="forced stage changes, as fractions of --steps")
    a("--val-every", type=int, default=50)
    a("--val-n", type=int, default=240)
    a("--ckpt-every", type=int, default=25)
    a("--threads", type=int, default=1)
    # model
    a("--hidden", type=int, default=128)
    a("--layers", type=int, default=8)
    a("--heads", type=int, default=4)
    a("--kv-heads", type=int, default=2)
    a("--head-dim", type=int, default=32)
    a("--lin-k-heads", type=int, default=4)
    a("--lin-v-heads", type=int, default=4)
    a("--lin-k-dim", type=int, default=32)
    a("--lin-v-dim", type=int, default=32)
    a("--intermediate", type=int, default=256)
    a("--rope-theta", type=float, default=1e7)
    a("--partial-rotary", type=float, default=0.25)
    a("--export-only", action="store_true", help="export best.pt and evaluate on test; no training")
    a("--eval-test", type=int, default=1000, help="test records to evaluate at the end")
    return p.parse_args(argv)


# ---- model ----

def gen_model_args(args, vocab):
    import gen_model

    return gen_model.parse_args([
        "--arch", "qwen3_5", "--hidden", str(args.hidden), "--layers", str(args.layers),
        "--heads", str(args.heads), "--kv-heads", str(args.kv_heads), "--head-dim", str(args.head_dim),
        "--lin-k-heads", str(args.lin_k_heads), "--lin-v-heads", str(args.lin_v_heads),
        "--lin-k-dim", str(args.lin_k_dim), "--lin-v-dim", str(args.lin_v_dim),
        "--intermediate", str(args.intermediate), "--tied", "--dtype", "f32",
        "--rope-theta", str(args.rope_theta), "--partial-rotary", str(args.partial_rotary),
        "--vocab", str(vocab), "--out", args.out,
    ])


def model_config_dict(args, tok):
    """The exported config.json (gen_model.py's qwen3_5 flat layout)."""
    import gen_model

    n_tok = tok.get_vocab_size(with_added_tokens=True)
    vocab = (n_tok + 63) // 64 * 64
    ids = {t: tok.token_to_id(t) for t in rag_data_special()}
    ga = gen_model_args(args, vocab)
    return gen_model.config(ga, vocab, ids), ids, ga


def rag_data_special():
    import hflib

    return hflib.SPECIAL_TOKENS


def build_model(cfg_dict, seed, zero_init_out=False):
    from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig

    c = {k: v for k, v in cfg_dict.items() if k not in ("architectures", "model_type")}
    c["dtype"] = "float32"
    config = Qwen3_5TextConfig(**c)
    config._attn_implementation = "sdpa"
    torch.manual_seed(seed)
    model = Qwen3_5ForCausalLM(config)
    # GDN decays: A ~ U(1, 16), dt ~ logU(1e-3, 1e-1) (FLA/Mamba convention), so
    # every layer starts with heads that remember from ~5 to ~1000 tokens
    # (HF's default dt_bias = 1 makes nearly all heads forget within a step).
    g = torch.Generator().manual_seed(seed + 7)
    with torch.no_grad():
        for layer in model.model.layers:
            la = getattr(layer, "linear_attn", None)
            if la is None:
                continue
            n = la.A_log.numel()
            la.A_log.copy_(torch.empty(n).uniform_(1, 16, generator=g).log())
            dt = torch.exp(torch.rand(n, generator=g) * (math.log(0.1) - math.log(1e-3)) + math.log(1e-3))
            la.dt_bias.copy_(dt + torch.log(-torch.expm1(-dt)))  # inverse softplus
        # Residual branches start at zero (as modded-nanogpt does): at this width
        # the random outputs of six GDN layers otherwise bury the token identity
        # the two attention layers must match on, and copying never starts
        # (measured with tools/train/copy_probe.py; see TRAINING.md).
        if zero_init_out:
            for name, p in model.named_parameters():
                if name.endswith(("out_proj.weight", "o_proj.weight", "down_proj.weight")):
                    p.zero_()
    return model


# ---- data ----

class Encoder:
    def __init__(self, tok):
        self.tok = tok
        self.cache = {}
        self.eos = tok.token_to_id(EOS)
        self.pad = tok.token_to_id(PAD)
        self.n_plain = min(tok.token_to_id(t) for t in rag_data_special())  # ids below are byte/merge tokens
        self.pool = list(range(self.n_plain))

    def set_copy_pool(self, k, seed):
        """Restrict copy rows to the k most frequent tokens of answers (0: all)."""
        if k <= 0:
            return
        rng = random.Random(seed)
        freq = {}
        for _ in range(400):
            ex = rag_data.make_example(rng, rag_data.FINAL_STAGE, 4)
            for _, a, *_ in ex["qas"]:
                for t in self.enc(" " + a):
                    freq[t] = freq.get(t, 0) + 1
        self.pool = sorted(freq, key=lambda t: -freq[t])[:k]

    def enc(self, s):
        ids = self.cache.get(s)
        if ids is None:
            ids = self.tok.encode(s, add_special_tokens=False).ids
            if len(self.cache) < 200000:
                self.cache[s] = ids
        return ids


def encode_example(enc, segments, qas, lm_weight, q_weight=0.0):
    """-> (ids, weights for predicting ids[t] at position t-1, answer spans)."""
    ids, w = [], []
    for i, s in enumerate(segments):
        t = enc.enc(s)
        ids += t
        w += [lm_weight if i > 0 else 0.0] * len(t)
    spans = []
    for q, a in qas:
        t = enc.enc(q)
        ids += t
        w += [q_weight] * len(t)
        at = enc.enc(" " + a) + [enc.eos]
        spans.append((len(ids), len(ids) + len(at)))
        ids += at
        w += [1.0] * len(at)
    return ids, w, spans


def copy_row(enc, rng, n):
    """A random token sequence shown twice with a random gap, LM loss on all:
    only copying lowers the second copy's loss (the induction warm-up). The
    length and the gap vary per row so that the only way to copy is by content
    (induction); with a fixed period the model learns to copy from a fixed
    offset instead, which does not transfer to documents (measured)."""
    k = rng.randint(max(4, n // 4), n)
    a = [rng.choice(enc.pool) for _ in range(k)]
    gap = [rng.choice(enc.pool) for _ in range(rng.randint(0, n // 2))]
    x = a + gap + a
    return x, [1.0] * len(x), []


def make_batch(enc, rng, stage, args, copy_frac=0.0):
    lo, hi, _ = rag_data.STAGES[stage]
    n_docs = rng.randint(lo, hi)
    seqs, total = [], 0
    if copy_frac > 0:
        while total < args.batch_tokens * copy_frac and len(seqs) < args.max_batch // 2:
            seqs.append(copy_row(enc, rng, args.copy_len))
            total += len(seqs[-1][0])
    while total < args.batch_tokens and len(seqs) < args.max_batch:
        nq = rng.randint(max(1, args.max_questions // 2), args.max_questions)
        ex = rag_data.make_example(rng, stage, nq, n_docs)
        ids, w, spans = encode_example(enc, ex["segments"], [(q, a) for q, a, *_ in ex["qas"]], args.lm_weight,
                                       args.q_weight)
        seqs.append((ids, w, spans))
        total += len(ids)
    return collate(enc, seqs)


def collate(enc, seqs):
    T = max(len(s[0]) for s in seqs)
    B = len(seqs)
    x = torch.full((B, T), enc.pad, dtype=torch.long)
    w = torch.zeros(B, T)
    spans = []
    for b, (ids, ww, sp) in enumerate(seqs):
        x[b, : len(ids)] = torch.tensor(ids)
        w[b, : len(ww)] = torch.tensor(ww)
        spans.append(sp)
    return x, w, spans


def losses(model, x, w, spans):
    logits = model(input_ids=x).logits.float()
    lp = F.log_softmax(logits[:, :-1], -1)
    tgt = x[:, 1:]
    nll = -lp.gather(-1, tgt.unsqueeze(-1)).squeeze(-1)
    ww = w[:, 1:]
    ans_mask = torch.zeros_like(ww)
    for b, sp in enumerate(spans):
        for s, e in sp:
            ans_mask[b, s - 1 : e - 1] = 1.0
    loss = (nll * ww).sum() / ww.sum().clamp(min=1e-6)  # weighted mean
    ans_loss = (nll * ans_mask).sum() / ans_mask.sum().clamp(min=1)
    pred = logits.argmax(-1)
    hits, n = 0, 0
    for b, sp in enumerate(spans):
        for s, e in sp:
            n += 1
            hits += int(torch.equal(pred[b, s - 1 : e - 1], x[b, s:e]))
    return loss, ans_loss.item(), hits, n


def load_records(path, n):
    out = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            out.append(json.loads(line))
            if n and len(out) >= n:
                break
    return out


@torch.no_grad()
def evaluate(model, enc, records, max_tokens=3072):
    """Teacher-forced EM per record (single question: segments[:-1] + q)."""
    model.eval()
    res = []
    order = sorted(range(len(records)), key=lambda i: records[i]["n_docs"])
    i = 0
    while i < len(order):
        batch = []
        while i < len(order):
            r = records[order[i]]
            ids, w, sp = encode_example(enc, r["segments"][:-1], [(r["segments"][-1], r["answer"])], 0.0)
            if batch and (len(batch) + 1) * max(len(ids), max(len(b[0]) for b in batch)) > max_tokens:
                break
            batch.append((ids, w, sp))
            i += 1
        x, w, spans = collate(enc, batch)
        pred = model(input_ids=x).logits.argmax(-1)
        for b, sp in enumerate(spans):
            s, e = sp[0]
            res.append(bool(torch.equal(pred[b, s - 1 : e - 1], x[b, s:e])))
    model.train()
    hit = {}
    for k, j in enumerate(order):
        hit[j] = res[k]
    return [hit[j] for j in range(len(records))]


def lr_at(step, args):
    """Linear warm-up, then the peak held (retrieval is learned in a late
    phase transition: decaying during the plateau starves it), then a cosine
    decay over the last --decay-frac of the steps."""
    if step < args.warmup:
        return args.lr * (step + 1) / args.warmup
    start = max(args.warmup, int(args.steps * (1 - args.decay_frac)))
    if step < start:
        return args.lr
    t = min(1.0, (step - start) / max(1, args.steps - start))
    return args.lr * (args.min_lr_frac + (1 - args.min_lr_frac) * 0.5 * (1 + math.cos(math.pi * t)))


def save_ckpt(path, **state):
    tmp = path + ".tmp"
    torch.save(state, tmp)
    os.replace(tmp, path)


# ---- main ----

def gdn_layer_params(model):
    """Every parameter of the decoder layers whose mixer is Gated DeltaNet."""
    return [p for layer in model.model.layers if hasattr(layer, "linear_attn") for p in layer.parameters()]


def set_phase(model, step, args):
    """Phase 1 (step < --attn-steps): the GDN layers are frozen. Why: a 2-layer
    attention-only model of this width forms copy (induction) heads in ~250
    steps, the hybrid never did in 2000 (TRAINING.md); with zero-initialised
    residual outputs the frozen GDN layers are exact identities, so phase 1
    trains the attention-only model inside the hybrid, and phase 2 lets the
    GDN layers join once retrieval works."""
    on = step >= args.attn_steps
    for p in gdn_layer_params(model):
        p.requires_grad_(on)


def train(args, model, enc, cfg_dict):
    os.makedirs(args.ckpt, exist_ok=True)
    gdn = {id(p) for p in gdn_layer_params(model)}
    groups = {}
    for n, p in model.named_parameters():
        wd = 0.0 if p.ndim < 2 or "norm" in n or "A_log" in n or "dt_bias" in n else args.wd
        groups.setdefault((wd, id(p) in gdn), []).append(p)
    opt = torch.optim.AdamW([{"params": ps, "weight_decay": wd, "gdn": g} for (wd, g), ps in groups.items()],
                            lr=args.lr, betas=(0.9, 0.98), eps=1e-8)
    val = load_records(os.path.join(args.data, "val.jsonl"), args.val_n)
    log_path = os.path.join(args.out, "training_log.tsv")
    last = os.path.join(args.ckpt, "last.pt")
    st = dict(step=0, stage=0, em_hist=[], best_val=-1.0, elapsed=0.0)
    if os.path.exists(last):
        ck = torch.load(last, weights_only=False)
        model.load_state_dict(ck["model"])
        opt.load_state_dict(ck["opt"])
        st = ck["st"]
        print(f"resumed at step {st['step']} stage {st['stage']} best val {st['best_val']:.3f}", flush=True)
    elif os.path.exists(log_path):
        os.remove(log_path)
    new_log = not os.path.exists(log_path)
    logf = open(log_path, "a", newline="")
    lw = csv.writer(logf, delimiter="\t")
    if new_log:
        lw.writerow(["step", "loss", "answer_loss", "lr", "train_em", "val_em", "stage", "n_docs_max",
                     "tokens", "elapsed_s"])
    forced = [int(float(f) * args.steps) for f in args.stage_steps.split(",")]
    t_start = time.time() - st["elapsed"]
    model.train()
    acc = dict(loss=0.0, aloss=0.0, hits=0, n=0, k=0, tok=0)
    while st["step"] < args.steps:
        step = st["step"]
        if args.time_budget and time.time() - t_start > args.time_budget:
            print(f"time budget reached at step {step}", flush=True)
            break
        # curriculum
        if st["stage"] < rag_data.FINAL_STAGE:
            h = st["em_hist"][-30:]
            if (len(h) == 30 and sum(h) / 30 >= args.advance_em) or step >= forced[st["stage"]]:
                st["stage"] += 1
                st["em_hist"] = []
                print(f"step {step}: -> stage {st['stage']} {rag_data.STAGES[st['stage']]}", flush=True)
        rng = random.Random(args.seed * 1_000_003 + step)
        x, w, spans = make_batch(enc, rng, st["stage"], args,
                                 args.copy_frac if step < args.copy_steps else args.copy_frac_late)
        lr = lr_at(step, args)
        set_phase(model, step, args)
        ramp = min(1.0, max(0.0, (step - args.attn_steps + 1) / max(1, args.unfreeze_ramp)))
        for g in opt.param_groups:
            g["lr"] = lr * (ramp if g["gdn"] else 1.0)
        loss, aloss, hits, n = losses(model, x, w, spans)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)
        opt.step()
        st["step"] = step + 1
        st["em_hist"].append(hits / max(1, n))
        acc["loss"] += loss.item(); acc["aloss"] += aloss; acc["hits"] += hits; acc["n"] += n
        acc["k"] += 1; acc["tok"] += x.numel()
        do_val = st["step"] % args.val_every == 0 or st["step"] == args.steps
        if st["step"] % 10 == 0 or do_val:
            st["elapsed"] = time.time() - t_start
            vem = ""
            if do_val:
                r = evaluate(model, enc, val)
                vem = sum(r) / len(r)
                if vem > st["best_val"]:
                    st["best_val"] = vem
                    save_ckpt(os.path.join(args.ckpt, "best.pt"), model=model.state_dict(),
                              step=st["step"], val_em=vem, config=cfg_dict)
                vem = f"{vem:.4f}"
            k = max(1, acc["k"])
            row = [st["step"], f"{acc['loss'] / k:.4f}", f"{acc['aloss'] / k:.4f}", f"{lr:.2e}",
                   f"{acc['hits'] / max(1, acc['n']):.3f}", vem, st["stage"],
                   rag_data.STAGES[st["stage"]][1], acc["tok"], f"{st['elapsed']:.0f}"]
            lw.writerow(row)
            logf.flush()
            print("\t".join(map(str, row)), flush=True)
            acc = dict(loss=0.0, aloss=0.0, hits=0, n=0, k=0, tok=0)
        if st["step"] % args.ckpt_every == 0:
            st["elapsed"] = time.time() - t_start
            save_ckpt(last, model=model.state_dict(), opt=opt.state_dict(), st=st)
    st["elapsed"] = time.time() - t_start
    save_ckpt(last, model=model.state_dict(), opt=opt.state_dict(), st=st)
    logf.close()
    return st


def main(argv=None):
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(os.path.join(args.out, "tokenizer.json"))
    enc = Encoder(tok)
    cfg_dict, ids, _ = model_config_dict(args, tok)
    model = build_model(cfg_dict, args.seed, bool(args.zero_init_out))
    n_par = sum(p.numel() for p in model.parameters())
    print(f"model: {n_par} parameters, layer_types {cfg_dict['layer_types']}", flush=True)
    if not args.export_only:
        enc.set_copy_pool(args.copy_pool, args.seed + 11)  # only training makes copy rows
        print(f"copy rows draw from {len(enc.pool)} tokens", flush=True)
        st = train(args, model, enc, cfg_dict)
        print(f"trained {st['step']} steps in {st['elapsed']:.0f} s, best val EM {st['best_val']:.4f}", flush=True)
    import export_hf

    ck = torch.load(os.path.join(args.ckpt, "best.pt"), weights_only=False)
    model.load_state_dict(ck["model"])
    print(f"best checkpoint: step {ck['step']} val EM {ck['val_em']:.4f}", flush=True)
    export_hf.export(model, args, tok, cfg_dict, ids)
    test = load_records(os.path.join(args.data, "test.jsonl"), args.eval_test)
    r = evaluate(model, enc, test)
    summary = export_hf.summarize(test, r)
    summary.update(best_step=ck["step"], best_val_em=ck["val_em"], parameters=n_par)
    with open(os.path.join(args.out, "test_metrics.json"), "w") as f:
        json.dump(summary, f, indent=2)
        f.write("\n")
    print(json.dumps(summary, indent=2), flush=True)


if __name__ == "__main__":
    main()
