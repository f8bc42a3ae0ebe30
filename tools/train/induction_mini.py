"""induction_mini.py - how long the induction plateau lasts, on a minimal model.

A 2-layer attention-only transformer (width 128, 4 heads, full RoPE, no MLP)
learns content-based copying: a run of 16..32 random tokens from --vocab ids
appears twice at random offsets in a row of 96, so only matching by content
(an induction head) predicts the second copy. Prints the loss on the second
copy every 100 steps (uniform guess = ln vocab). This model trains ~20x faster
than the default hybrid, so it measures how the plateau before induction forms
scales with the number of distinct tokens (TRAINING.md); --conv adds a
depthwise causal conv (kernel 4) on the embeddings, the previous-token feature
a Gated DeltaNet layer's conv provides.

    python3 tools/train/induction_mini.py --vocab 128 --conv --secs 240
"""
import argparse
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

D, H = 128, 4
HD = D // H


def content_copy_rows(batch, n, vocab, g):
    """Rows of 3n random tokens in which a run of n/2..n tokens appears twice at
    random offsets -> (ids, mask of the next-token targets inside the second
    copy after its first token: predictable only by copying by content)."""
    x = torch.randint(0, vocab, (batch, 3 * n), generator=g)
    mask = torch.zeros(batch, 3 * n - 1, dtype=torch.bool)
    for b in range(batch):
        k = int(torch.randint(n // 2, n + 1, (1,), generator=g))
        s0 = int(torch.randint(0, n - k + 1, (1,), generator=g))
        s1 = min(int(torch.randint(s0 + k, 2 * n + 1 + (n - k), (1,), generator=g)), 3 * n - k)
        x[b, s1:s1 + k] = x[b, s0:s0 + k]
        mask[b, s1:s1 + k - 1] = True
    return x, mask


def rope(x, T):
    d = x.shape[-1]
    inv = 1.0 / (10000 ** (torch.arange(0, d, 2).float() / d))
    t = torch.arange(T).float()[:, None] * inv[None]
    c, s = torch.cat([t.cos()] * 2, -1), torch.cat([t.sin()] * 2, -1)
    return x * c + torch.cat([-x[..., d // 2:], x[..., : d // 2]], -1) * s


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = nn.LayerNorm(D)
        self.qkv = nn.Linear(D, 3 * D, bias=False)
        self.o = nn.Linear(D, D, bias=False)

    def forward(self, x):
        b, T, _ = x.shape
        q, k, v = self.qkv(self.norm(x)).view(b, T, 3, H, HD).unbind(2)
        q, k = rope(q.transpose(1, 2), T), rope(k.transpose(1, 2), T)
        y = F.scaled_dot_product_attention(q, k, v.transpose(1, 2), is_causal=True)
        return x + self.o(y.transpose(1, 2).reshape(b, T, D))


class Model(nn.Module):
    def __init__(self, vocab, conv):
        super().__init__()
        self.emb = nn.Embedding(vocab, D)
        self.blocks = nn.ModuleList([Block(), Block()])
        self.norm = nn.LayerNorm(D)
        self.head = nn.Linear(D, vocab, bias=False)
        self.conv = nn.Conv1d(D, D, 4, groups=D, padding=3) if conv else None

    def forward(self, x):
        h = self.emb(x)
        if self.conv is not None:
            h = h + self.conv(h.transpose(1, 2))[:, :, : x.shape[1]].transpose(1, 2)
        for blk in self.blocks:
            h = blk(h)
        return self.head(self.norm(h))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--vocab", type=int, default=700)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--secs", type=float, default=240)
    ap.add_argument("--conv", action="store_true")
    a = ap.parse_args()
    torch.set_num_threads(1)
    V, B, L = a.vocab, a.batch, 32
    torch.manual_seed(0)
    m = Model(V, a.conv)
    opt = torch.optim.AdamW(m.parameters(), lr=a.lr)
    g = torch.Generator().manual_seed(0)
    t0, step = time.time(), 0
    while time.time() - t0 < a.secs:
        x, mask = content_copy_rows(B, L, V, g)
        nll = F.cross_entropy(m(x)[:, :-1].reshape(-1, V), x[:, 1:].reshape(-1), reduction="none").view(B, -1)
        opt.zero_grad()
        nll.mean().backward()
        opt.step()
        if step % 100 == 0:
            print(step, f"second copy {nll[mask].mean():.2f}", f"{time.time() - t0:.0f}s", flush=True)
        step += 1


if __name__ == "__main__":
    main()
