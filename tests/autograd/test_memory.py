"""Saved-activation memory: what kiln's forward keeps for the backward, against eager autograd
on the same model (both measured through torch.autograd.graph.saved_tensors_hooks)."""
from __future__ import annotations

import copy

import pytest
import torch

import kiln


class Block(torch.nn.Module):
    def __init__(self, d=32):
        super().__init__()
        self.fc1 = torch.nn.Linear(d, 4 * d)
        self.fc2 = torch.nn.Linear(4 * d, d)

    def forward(self, x):
        h = torch.relu(self.fc1(x))
        y = self.fc2(h)
        return torch.tanh(torch.sigmoid(y) * x) + x


def saved_bytes(fn, *args):
    """Bytes of the distinct tensors autograd saves while fn runs (parameters included)."""
    seen = {}

    def pack(t):
        seen[(t.data_ptr(), t.dtype, tuple(t.shape))] = t.numel() * t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn(*args)
    return sum(seen.values()), out


@pytest.mark.parametrize("backend", ["aot_eager", "kiln"])
def test_min_cut_saves_no_more_than_eager(backend):
    torch.manual_seed(0)
    eager = Block()
    ours = kiln.compile(copy.deepcopy(eager), backend=backend)
    x = torch.randn(16, 32, requires_grad=True)
    ours(x)  # compile outside the measurement
    eager_bytes, e = saved_bytes(eager, x)
    kiln_bytes, o = saved_bytes(ours, x)
    print(f"saved for backward: eager {eager_bytes} bytes, kiln (min-cut) {kiln_bytes} bytes")
    assert kiln_bytes <= eager_bytes
    torch.testing.assert_close(o, e)


@pytest.mark.parametrize("backend", ["aot_eager", "kiln"])
def test_gpt_block_min_cut_saves_no_more_than_eager(backend):
    """A pre-LayerNorm GPT block (causal sdpa, GELU MLP): attention's probabilities are
    recomputed in the backward (as flash attention does), so they are never saved."""
    from test_gpt_training import Block as GPTBlock

    torch.manual_seed(0)
    eager = GPTBlock(32, 4)
    ours = kiln.compile(copy.deepcopy(eager), backend=backend)
    x = torch.randn(4, 16, 32, requires_grad=True)
    with kiln.config.patch(strict=True):
        ours(x)
        kiln_bytes, o = saved_bytes(ours, x)
    eager_bytes, e = saved_bytes(eager, x)
    print(f"GPT block saved for backward: eager {eager_bytes} bytes, kiln (min-cut) {kiln_bytes} bytes")
    assert kiln_bytes <= eager_bytes
    torch.testing.assert_close(o, e)
