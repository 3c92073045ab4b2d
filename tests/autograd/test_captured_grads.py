"""Gradients through torch-level code compiled end to end (capture -> autograd -> backend):
the torch functions that capture writes as compositions of core ops (split, chunk, unbind,
stack, narrow, flatten/unflatten, F.pad, relu6, indexing) get the right gradients."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import kiln

from testing import assert_close


def shapes_fn(x, y):
    a, b = torch.split(x, [2, 3], dim=1)
    c = torch.stack([a * 2, y[:, :2]], dim=0)
    parts = torch.chunk(b, 3, dim=1)
    u = torch.unbind(x, 0)
    n = torch.narrow(x, 1, 1, 2)
    f = torch.flatten(c, 0, 1).unflatten(0, (2, -1))
    p = F.pad(x, (1, 2, 0, 1), value=0.5)
    r = torch.roll(x, 1, 0).flip(1).tril()
    return (f.sum() + parts[1].sum() * 3 + u[2].sum() + n.pow(2).sum() + p.sum() + r.sum(),
            torch.cat([x[::2], y[1:3]], 0))


def activations_fn(x):
    return (F.relu6(x * 4) + F.gelu(x, approximate="tanh") + F.silu(x) + F.elu(x) + F.mish(x)
            + torch.clamp(x, -0.5, 0.5) + F.hardswish(x) + torch.sin(x) * torch.erf(x)).sum(-1)


def nn_fn(x, w, idx, tgt):
    h = F.layer_norm(F.embedding(idx, w), (w.shape[1],))
    att = F.scaled_dot_product_attention(h[:, None], h[:, None], h[:, None], is_causal=True)[:, 0]
    logits = att @ x
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tgt.reshape(-1), label_smoothing=0.1)


CASES = [
    ("shapes", shapes_fn, lambda: [torch.randn(4, 5, requires_grad=True), torch.randn(4, 5, requires_grad=True)]),
    ("activations", activations_fn, lambda: [torch.randn(3, 8, requires_grad=True)]),
    ("nn", nn_fn, lambda: [torch.randn(6, 7, requires_grad=True), torch.randn(10, 6, requires_grad=True),
                           torch.randint(0, 10, (2, 5)), torch.randint(0, 7, (2, 5))]),
]


@pytest.mark.parametrize("backend", ["aot_eager", "kiln"])
@pytest.mark.parametrize("name,fn,make", CASES, ids=[c[0] for c in CASES])
def test_captured_grads_match_eager(name, fn, make, backend):
    torch.manual_seed(0)
    inputs = make()
    leaves = [t for t in inputs if t.requires_grad]
    compiled = kiln.compile(fn, backend=backend, fullgraph=True)
    with kiln.config.patch(strict=True):
        got = compiled(*inputs)
        got = got if isinstance(got, tuple) else (got,)
        tangents = [torch.randn_like(g) for g in got]
        got_grads = torch.autograd.grad(got, leaves, tangents)
    want = fn(*inputs)
    want = want if isinstance(want, tuple) else (want,)
    want_grads = torch.autograd.grad(want, leaves, tangents)
    for g, w in zip(got + got_grads, want + want_grads):
        assert_close(g, w, torch.float32)
    assert kiln.stats()["fallbacks"] == 0
