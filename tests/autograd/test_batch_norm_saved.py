"""Batch norm's backward computes the normalized activations from the input and the saved
per-channel statistics (autograd.rules_nn.batch_norm_vjp, ``in_backward``): the forward saves
the input (a convolution wrote it) and a few floats per channel, never a second full-size
tensor it would have to write; gradients match eager in train and eval mode."""
import pytest
import torch
import torch.nn.functional as F

import kiln
from kiln.autograd import build_joint, partition
from kiln.graph import Graph, Proxy
from kiln.meta import TensorMeta
from kiln.ops import core
from testing import assert_close


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("training", [True, False], ids=["train", "eval"])
def test_only_the_input_and_per_channel_values_are_saved(dtype, training):
    x = torch.randn(4, 6, 5, 5, dtype=dtype, requires_grad=True)
    w, b = torch.randn(6, dtype=dtype, requires_grad=True), torch.randn(6, dtype=dtype, requires_grad=True)
    rm, rv = torch.zeros(6, dtype=dtype), torch.ones(6, dtype=dtype)
    g = Graph()
    px, pw, pb, prm, prv = (Proxy(g.placeholder(n, TensorMeta.of(v)))
                            for n, v in (("x", x), ("w", w), ("b", b), ("rm", rm), ("rv", rv)))
    if training:  # batch statistics (the running-stat update is capture's, outside this op)
        prm = prv = None
    g.output((core.relu(core.batch_norm(px, prm, prv, pw, pb, training, 0.1, 1e-5)),))
    part = partition(build_joint(g))
    full = [n for n in part.saved if tuple(n.meta["val"].shape) == (4, 6, 5, 5)]
    floats = [n for n in full if n.meta["val"].dtype.is_floating_point]
    assert [n.name for n in floats] == ["x"], [(n.name, n.meta["val"].dtype) for n in part.saved]
    others = [n for n in part.saved if n not in full]
    assert all(n.meta["val"].numel() <= 6 for n in others), others


# per dtype: largest difference allowed, relative to the gradient's largest element (sums over
# a batch's pixels: bf16 rounds each term, the order differs)
SCALED_TOL = {torch.float32: 1e-5, torch.bfloat16: 5e-2}


@pytest.mark.parametrize("training", [True, False], ids=["train", "eval"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_batch_norm_gradients_match_eager(training, dtype):
    torch.manual_seed(0)
    conv = torch.nn.Conv2d(3, 6, 3, padding=1, bias=False).to(dtype)  # as in a ResNet
    bn = torch.nn.BatchNorm2d(6).to(dtype).train(training)
    model = torch.nn.Sequential(conv, bn, torch.nn.ReLU())
    x = torch.randn(4, 3, 8, 8, dtype=dtype)
    with kiln.config.patch(strict=True):
        out = kiln.compile(model)(x)
    want_out = model(x)
    assert_close(out, want_out, dtype)
    got = torch.autograd.grad(out.float().square().sum(), list(model.parameters()))
    want = torch.autograd.grad(want_out.float().square().sum(), list(model.parameters()))
    for gk, ge in zip(got, want):
        scale = float(ge.float().abs().max())
        assert float((gk.float() - ge.float()).abs().max()) <= SCALED_TOL[dtype] * scale
