"""C++ reduction kernels: an expensive per-element value that later passes over the row would
compute again (max_pool2d's window maxima before a batch norm's mean, variance and output
passes) moves to a pointwise kernel that stores it; cheap prologues stay fused."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import kiln
from testing import assert_close


def _bn_of_pool(x, w, b):
    return F.relu(F.batch_norm(F.max_pool2d(x, 3, 2, 1), None, None, w, b, training=True))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("layout", ["contiguous", "channels_last"])
def test_pooled_batch_norm_stores_the_maxima_once(dtype, layout):
    torch.manual_seed(0)
    x = torch.randn(2, 4, 12, 12).to(dtype)
    if layout == "channels_last":
        x = x.to(memory_format=torch.channels_last)
    w, b = torch.randn(4).to(dtype), torch.randn(4).to(dtype)
    with kiln.config.patch(strict=True):
        r = kiln.explain(_bn_of_pool)(x, w, b)
    assert_close(r.result, _bn_of_pool(x, w, b), dtype)
    # one pointwise kernel stores the window maxima: the hoisted prologue (``_pre``) over a
    # contiguous input; over a channels-last one the pooled value is realized channels-last
    # by lowering already (its padded input stays channels-last, layout.py), which the
    # hoisting pass then finds stored
    pooled = [k for k in r.kernels if "kiln_max" in k.source and "acc0" not in k.source]
    assert len(pooled) == 1, [k.name for k in r.kernels]
    if layout == "contiguous":
        assert pooled[0].name.endswith("_pre")
    reductions = [k for k in r.kernels if "acc0" in k.source]
    # the reduction kernel's only max is the ReLU's (before: 8 window maxima in each of 3 passes)
    assert reductions and all(k.source.split("extern")[1].count("kiln_max<") <= 1 for k in reductions)


def test_cheap_prologue_stays_fused():
    """x * 2 + 1 before a norm is recomputed per pass (cheaper than a store and a load)."""
    torch.manual_seed(0)
    x = torch.randn(2, 4, 12, 12)

    def fn(x):
        return F.batch_norm(x * 2 + 1, None, None, training=True)
    with kiln.config.patch(strict=True):
        r = kiln.explain(fn)(x)
    assert_close(r.result, fn(x), torch.float32)
    assert not any(k.name.endswith("_pre") for k in r.kernels)


def test_pooled_batch_norm_backward_matches_eager():
    torch.manual_seed(1)
    x = torch.randn(2, 4, 12, 12, requires_grad=True)
    w = torch.randn(4, requires_grad=True)
    b = torch.randn(4, requires_grad=True)
    with kiln.config.patch(strict=True):
        out = kiln.compile(_bn_of_pool)(x, w, b)
    t = torch.randn_like(out)
    got = torch.autograd.grad(out, (x, w, b), t)
    want = torch.autograd.grad(_bn_of_pool(x, w, b), (x, w, b), t)
    for g, e in zip(got, want):
        assert_close(g, e, torch.float32)
