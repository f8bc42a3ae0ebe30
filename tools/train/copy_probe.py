"""copy_probe.py - how many steps a model of the default architecture needs to
learn plain copying: a random run of --L tokens (from --vocab ids) shown twice,
loss on both halves, "second" = the loss on the second copy (uniform = ln vocab).
Diagnostic for the retrieval plateau; figures in models/default/TRAINING.md.

    python3 tools/train/copy_probe.py --lr 5e-3 --vocab 256 --secs 400 \\
        [--layer-types full_attention,full_attention --extra "--layers 2"] [--zero-init] [--freeze-gdn]

Threads: TH (default 1). Without --var the copies have a fixed period (--L), so
a model may learn a positional copy; --var varies length and offsets (content
copy, as tools/train_model.py's copy rows do).
"""
import argparse
import os
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import train_model as tm  # noqa: E402
from induction_mini import content_copy_rows  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("--std", type=float, default=0.02, help="initializer_range")
ap.add_argument("--lr", type=float, default=3e-3)
ap.add_argument("--B", type=int, default=32)
ap.add_argument("--L", type=int, default=24)
ap.add_argument("--secs", type=float, default=150)
ap.add_argument("--vocab", type=int, default=700)
ap.add_argument("--layer-types", default="", help="comma list overriding the config's layer_types")
ap.add_argument("--zero-init", action="store_true", help="zero the residual branch outputs")
ap.add_argument("--freeze-gdn", action="store_true", help="train only the non-GDN layers")
ap.add_argument("--var", action="store_true",
                help="content copy: run length U(L/2, L) at a random offset, random filler around it, so "
                     "only matching by content (induction) predicts the second copy")
ap.add_argument("--extra", default="", help="train_model.py model flags, e.g. '--layers 2'")
a = ap.parse_args()
torch.set_num_threads(int(os.environ.get("TH", "1")))
root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
from tokenizers import Tokenizer  # noqa: E402

args = tm.parse_args(["--out", os.path.join(root, "models/default")] + a.extra.split())
tok = Tokenizer.from_file(os.path.join(root, "models/default/tokenizer.json"))
cfg, _, _ = tm.model_config_dict(args, tok)
cfg["initializer_range"] = a.std
if a.layer_types:
    cfg["layer_types"] = a.layer_types.split(",")
m = tm.build_model(cfg, 1, a.zero_init)
if a.freeze_gdn:
    for p in tm.gdn_layer_params(m):
        p.requires_grad_(False)
print(cfg["layer_types"], flush=True)
opt = torch.optim.AdamW([p for p in m.parameters() if p.requires_grad], lr=a.lr, betas=(0.9, 0.98))
g = torch.Generator().manual_seed(0)
t0, step = time.time(), 0
while time.time() - t0 < a.secs:
    if a.var:
        x, mask = content_copy_rows(a.B, a.L, a.vocab, g)
    else:
        x = torch.randint(0, a.vocab, (a.B, a.L), generator=g)
        x = torch.cat([x, x], 1)
        mask = torch.zeros(a.B, 2 * a.L - 1, dtype=torch.bool)
        mask[:, a.L:] = True
    for pg in opt.param_groups:
        pg["lr"] = a.lr * min(1, (step + 1) / 30)
    lg = m(input_ids=x, use_cache=False).logits
    nll = F.cross_entropy(lg[:, :-1].reshape(-1, lg.shape[-1]), x[:, 1:].reshape(-1), reduction="none")
    nll = nll.view(a.B, -1)
    opt.zero_grad()
    nll.mean().backward()
    torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0)
    opt.step()
    if step % 25 == 0:
        print(step, f"second {nll[mask].mean():.2f}", f"{time.time() - t0:.0f}s", flush=True)
    step += 1
