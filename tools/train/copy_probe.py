"""copy_probe.py - how many steps the default-model architecture needs to learn
plain copying (random 48-token sequence repeated twice, loss on both halves).
Diagnostic for the retrieval plateau; see models/default/TRAINING.md."""
import sys, torch, time, math
sys.path.insert(0,'tools'); torch.set_num_threads(1)
import train_model as tm
from tokenizers import Tokenizer
import torch.nn.functional as F
args = tm.parse_args(["--out","models/default"] + sys.argv[1:])
tok = Tokenizer.from_file("models/default/tokenizer.json")
cfg,ids,_ = tm.model_config_dict(args, tok)
m = tm.build_model(cfg, 1)
opt = torch.optim.AdamW(m.parameters(), lr=float(args.lr))
g = torch.Generator().manual_seed(0)
t0=time.time()
for step in range(1001):
    a = torch.randint(0, 700, (8, 48), generator=g)
    x = torch.cat([a, a], 1)
    lg = m(input_ids=x).logits
    nll = F.cross_entropy(lg[:, :-1].reshape(-1, lg.shape[-1]), x[:, 1:].reshape(-1), reduction='none').view(8, -1)
    loss = nll.mean()
    opt.zero_grad(); loss.backward(); opt.step()
    if step % 25 == 0:
        print(step, f"first {nll[:, :47].mean():.2f} second {nll[:, 48:].mean():.2f}", f"{time.time()-t0:.0f}s", flush=True)
