"""Cross-entropy's backward recomputes the softmax from the logits and a float32 log-sum-exp per
row (autograd.rules_nn._through_log_softmax): the forward writes no full-size tensor for the
backward (it used to save exp(log_softmax), as big as the logits), and gradients match eager."""
import pytest
import torch
import torch.nn.functional as F

import kiln
from kiln.autograd import build_joint, partition
from kiln.graph import Graph, Proxy
from kiln.meta import TensorMeta
from kiln.ops import core

GRAD_TOL = {torch.float32: (1e-5, 1e-5), torch.float16: (2e-3, 2e-3), torch.bfloat16: (1.6e-2, 1.6e-2)}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_only_the_logits_and_per_row_values_are_saved(dtype):
    logits = torch.randn(16, 40, dtype=dtype, requires_grad=True)
    target = torch.randint(0, 40, (16,))
    g = Graph()
    x, t = (Proxy(g.placeholder(n, TensorMeta.of(v))) for n, v in (("x", logits), ("t", target)))
    g.output((core.cross_entropy(x, t),))
    part = partition(build_joint(g))
    full = [n for n in part.saved if tuple(n.meta["val"].shape) == (16, 40)]
    # the logits themselves, in float32 too: the softmax is computed in the backward
    # (in_backward), so the forward has no same-sized float32 tensor to save and write
    assert [n.name for n in full] == ["x"], [(n.name, n.meta["val"].shape) for n in part.saved]
    rows = [n for n in part.saved if n not in full and n.meta["val"].dtype.is_floating_point]
    assert all(n.meta["val"].numel() <= 16 for n in rows), rows
    # the per-row max and sum of exponentials (or its log), in float32
    assert sum(n.meta["val"].dtype == torch.float32 and n.meta["val"].numel() == 16 for n in rows) == 2, rows


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("case", ["mean", "sum_ignore", "smoothing", "probabilities", "noncontiguous"])
def test_cross_entropy_gradients_match_eager(case, dtype):
    torch.manual_seed(0)
    n, c = 24, 37
    x = torch.randn(n, c, dtype=dtype) * 3
    if case == "noncontiguous":
        x = torch.randn(c, n, dtype=dtype).t() * 3
    x.requires_grad_(True)
    t = torch.randint(0, c, (n,))
    kwargs = {}
    if case == "sum_ignore":
        t[::5] = -100
        kwargs = {"reduction": "sum"}
    if case == "smoothing":
        kwargs = {"label_smoothing": 0.1}
    if case == "probabilities":
        t = torch.softmax(torch.randn(n, c), -1).to(dtype)

    def fn(x, t):
        return F.cross_entropy(x * 1.0, t, **kwargs)
    got = torch.autograd.grad(kiln.compile(fn)(x, t), x)[0]
    want = torch.autograd.grad(fn(x, t), x)[0]
    rtol, atol = GRAD_TOL[dtype]
    torch.testing.assert_close(got, want, rtol=rtol, atol=atol)
