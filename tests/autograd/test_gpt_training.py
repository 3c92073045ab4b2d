"""A tiny nanoGPT-shaped model (token + position embeddings, pre-LayerNorm causal self-attention
through F.scaled_dot_product_attention, GELU MLP, final LayerNorm, LM head, cross-entropy)
trained for 20 AdamW steps with kiln.compile: the losses and the final parameters match eager,
with torch.no_grad() evaluation and eval()/train() switches in between, and nothing falls back."""
from __future__ import annotations

import copy
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import kiln

VOCAB, DIM, SEQ, BATCH, HEADS, LAYERS, STEPS = 32, 32, 16, 4, 4, 2, 20


class CausalSelfAttention(nn.Module):
    def __init__(self, dim, heads):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(x).split(c, dim=2)
        q = q.view(b, t, self.heads, c // self.heads).transpose(1, 2)
        k = k.view(b, t, self.heads, c // self.heads).transpose(1, 2)
        v = v.view(b, t, self.heads, c // self.heads).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        y = y.transpose(1, 2).contiguous().view(b, t, c)
        return self.proj(y)


class MLP(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.fc = nn.Linear(dim, 4 * dim)
        self.gelu = nn.GELU()
        self.proj = nn.Linear(4 * dim, dim)

    def forward(self, x):
        return self.proj(self.gelu(self.fc(x)))


class Block(nn.Module):
    def __init__(self, dim, heads):
        super().__init__()
        self.ln_1 = nn.LayerNorm(dim)
        self.attn = CausalSelfAttention(dim, heads)
        self.ln_2 = nn.LayerNorm(dim)
        self.mlp = MLP(dim)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class TinyGPT(nn.Module):
    def __init__(self, tied=True, dropout=0.0):
        super().__init__()
        self.wte = nn.Embedding(VOCAB, DIM)
        self.wpe = nn.Embedding(SEQ, DIM)
        self.drop = nn.Dropout(dropout)
        self.blocks = nn.ModuleList([Block(DIM, HEADS) for _ in range(LAYERS)])
        self.ln_f = nn.LayerNorm(DIM)
        self.lm_head = nn.Linear(DIM, VOCAB, bias=False)
        if tied:
            self.lm_head.weight = self.wte.weight
        self.register_buffer("pos", torch.arange(SEQ), persistent=False)
        self.apply(self._init)

    @staticmethod
    def _init(m):
        if isinstance(m, nn.Linear):
            nn.init.normal_(m.weight, std=0.02)
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.Embedding):
            nn.init.normal_(m.weight, std=0.02)

    def forward(self, idx, targets):
        t = idx.shape[1]
        x = self.drop(self.wte(idx) + self.wpe(self.pos[:t]))
        for block in self.blocks:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.reshape(-1))


def batches(n, seed=0):
    g = torch.Generator().manual_seed(seed)
    # learnable: each sequence counts up from a random start by a random step of 1 or 3
    start = torch.randint(0, VOCAB, (n, BATCH, 1), generator=g)
    step = 1 + 2 * torch.randint(0, 2, (n, BATCH, 1), generator=g)
    data = (start + step * torch.arange(SEQ + 1)) % VOCAB
    return [(d[:, :-1], d[:, 1:]) for d in data]


def train(model, data, val, eval_every=5):
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.1)
    losses, val_losses = [], []
    for step, (x, y) in enumerate(data):
        loss = model(x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.item())
        if (step + 1) % eval_every == 0:
            model.eval()
            with torch.no_grad():
                val_losses.append(model(*val).item())
            model.train()
    return losses, val_losses


@pytest.mark.parametrize("backend", ["aot_eager", "kiln"])
@pytest.mark.parametrize("tied", [True, False], ids=["tied", "untied"])
def test_gpt_trains_like_eager(backend, tied):
    if backend == "aot_eager" and not tied:
        pytest.skip("the kiln backend covers the untied head")
    torch.manual_seed(0)
    eager = TinyGPT(tied=tied)
    model = copy.deepcopy(eager)
    compiled = kiln.compile(model, backend=backend)
    data, val = batches(STEPS), batches(1, seed=1)[0]
    kiln.reset()
    with kiln.config.patch(strict=True):
        got, got_val = train(compiled, data, val)
        stats = kiln.stats()
    want, want_val = train(eager, data, val)

    print(f"losses eager {[round(v, 4) for v in want]}\nlosses kiln  {[round(v, 4) for v in got]}")
    assert want[-1] < want[0] - 0.1  # it learns something
    torch.testing.assert_close(torch.tensor(got), torch.tensor(want), rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(torch.tensor(got_val), torch.tensor(want_val), rtol=1e-4, atol=1e-4)
    for (name, p), q in zip(model.named_parameters(), eager.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-3, atol=1e-4, msg=lambda m: f"{name}: {m}")
    assert stats["fallbacks"] == 0
    assert stats["graph_breaks"] == 0
    assert 1 <= stats["frames_compiled"] <= 3  # train, and no_grad/eval (guarded) variants


def test_gpt_eval_switch_and_no_grad_match_eager():
    torch.manual_seed(1)
    eager = TinyGPT(dropout=0.0)
    compiled = kiln.compile(copy.deepcopy(eager), backend="aot_eager")
    x, y = batches(1, seed=2)[0]
    with kiln.config.patch(strict=True):
        compiled.eval()
        eager.eval()
        with torch.no_grad():
            torch.testing.assert_close(compiled(x, y), eager(x, y))
        compiled.train()
        eager.train()
        loss = compiled(x, y)
        assert loss.requires_grad
        torch.testing.assert_close(loss, eager(x, y))
