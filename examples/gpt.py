"""A nanoGPT-shaped language model, written for kiln's examples and benchmarks: token and
position embeddings, pre-LayerNorm blocks of causal self-attention (through
F.scaled_dot_product_attention) and a GELU MLP, a final LayerNorm, a tied LM head and
cross-entropy."""
from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F
from torch import nn


@dataclasses.dataclass
class GPTConfig:
    vocab: int = 50304
    seq: int = 1024
    layers: int = 12
    heads: int = 12
    dim: int = 768
    dropout: float = 0.0


GPT2_SMALL = GPTConfig()
TINY = GPTConfig(vocab=64, seq=32, layers=2, heads=4, dim=64)


class SelfAttention(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.heads = cfg.heads
        self.qkv = nn.Linear(cfg.dim, 3 * cfg.dim)
        self.proj = nn.Linear(cfg.dim, cfg.dim)
        self.drop = nn.Dropout(cfg.dropout)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(x).split(c, dim=2)
        shape = (b, t, self.heads, c // self.heads)
        q, k, v = [z.view(shape).transpose(1, 2) for z in (q, k, v)]
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.drop(self.proj(y.transpose(1, 2).reshape(b, t, c)))


class Block(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.ln_1 = nn.LayerNorm(cfg.dim)
        self.attn = SelfAttention(cfg)
        self.ln_2 = nn.LayerNorm(cfg.dim)
        self.fc = nn.Linear(cfg.dim, 4 * cfg.dim)
        self.proj = nn.Linear(4 * cfg.dim, cfg.dim)
        self.drop = nn.Dropout(cfg.dropout)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.drop(self.proj(F.gelu(self.fc(self.ln_2(x)), approximate="tanh")))


class GPT(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.cfg = cfg
        self.wte = nn.Embedding(cfg.vocab, cfg.dim)
        self.wpe = nn.Embedding(cfg.seq, cfg.dim)
        self.drop = nn.Dropout(cfg.dropout)
        self.blocks = nn.ModuleList([Block(cfg) for _ in range(cfg.layers)])
        self.ln_f = nn.LayerNorm(cfg.dim)
        self.lm_head = nn.Linear(cfg.dim, cfg.vocab, bias=False)
        self.lm_head.weight = self.wte.weight
        self.register_buffer("pos", torch.arange(cfg.seq), persistent=False)
        self.apply(self._init)

    @staticmethod
    def _init(m):
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, std=0.02)
        if isinstance(m, nn.Linear) and m.bias is not None:
            nn.init.zeros_(m.bias)

    def forward(self, idx, targets):
        t = idx.shape[1]
        x = self.drop(self.wte(idx) + self.wpe(self.pos[:t]))
        for block in self.blocks:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.reshape(-1))


def counting_batches(n, batch, cfg: GPTConfig, seed=0, device="cpu"):
    """Learnable synthetic data: each row counts up from a random start by 1 or 3 (mod vocab)."""
    g = torch.Generator().manual_seed(seed)
    start = torch.randint(0, cfg.vocab, (n, batch, 1), generator=g)
    step = 1 + 2 * torch.randint(0, 2, (n, batch, 1), generator=g)
    data = (start + step * torch.arange(cfg.seq + 1)) % cfg.vocab
    return [(d[:, :-1].to(device), d[:, 1:].to(device)) for d in data]
