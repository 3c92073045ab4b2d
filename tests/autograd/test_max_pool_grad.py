"""max_pool2d's gradient follows eager's rule: each window's first maximum takes the whole
gradient (the last NaN if there are NaNs; never a padded position). Ties are where a
maximum-of-windows rule would split the gradient, so most inputs here have many."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import kiln
from testing import CUDA, assert_close

DEVICES = ["cpu"] + (["cuda"] if CUDA else [])

CASES = [  # (input shape, kernel, stride, padding)
    ((2, 3, 9, 9), 3, 2, 1),     # the ResNet stem
    ((2, 2, 8, 8), 2, 2, 0),
    ((1, 2, 7, 10), (3, 2), (1, 2), (1, 0)),
    ((3, 6, 5), 3, 1, 1),        # a 3-d input
    ((2, 2, 6, 6), 1, 2, 0),     # one-element windows
]


def _grad_pair(fn, x, dtype, tangent_seed=0, device="cpu"):
    x = x.to(device)
    xk = x.detach().clone().requires_grad_(True)
    xe = x.detach().clone().requires_grad_(True)
    with kiln.config.patch(strict=True):
        out = kiln.compile(fn)(xk)
    want = fn(xe)
    torch.manual_seed(tangent_seed)
    t = torch.randn(want.shape).to(dtype).to(device)
    (gk,) = torch.autograd.grad(out, xk, t)
    (ge,) = torch.autograd.grad(want, xe, t)
    return out, want, gk, ge


def _pool(kernel, stride, padding):
    return lambda x: F.max_pool2d(x, kernel, stride, padding) * 1.5


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", CASES, ids=[f"case{i}" for i in range(len(CASES))])
@pytest.mark.parametrize("values", ["random", "ties", "relu"])
def test_max_pool_grad_matches_eager(case, values, device):
    shape, k, s, p = case
    torch.manual_seed(1)
    x = torch.randn(shape)
    if values == "ties":   # few distinct values: most windows hold several maxima
        x = torch.randint(0, 3, shape).float()
    elif values == "relu":  # zeros everywhere a ReLU cut: whole windows of equal zeros
        x = torch.relu(x)
    out, want, gk, ge = _grad_pair(_pool(k, s, p), x, torch.float32, device=device)
    assert_close(out, want, torch.float32)
    torch.testing.assert_close(gk, ge, rtol=0, atol=1e-6)


@pytest.mark.parametrize("device", DEVICES)
def test_nan_takes_the_gradient_like_eager(device):
    x = torch.randn(1, 1, 6, 6)
    x[0, 0, 1, 1] = math.nan
    x[0, 0, 2, 2] = math.nan   # two NaNs in one window: eager picks the last
    out, want, gk, ge = _grad_pair(_pool(3, 2, 1), x, torch.float32, device=device)
    torch.testing.assert_close(out, want, equal_nan=True)
    torch.testing.assert_close(gk, ge, rtol=0, atol=1e-6, equal_nan=True)


def test_windows_of_minus_inf_keep_the_gradient_off_the_padding():
    """A window whose real elements are all -inf: eager gives the gradient to its first real
    element; the padding (also -inf) must not take it."""
    x = torch.full((1, 1, 5, 5), -math.inf)
    x[0, 0, 3:, 3:] = torch.randn(2, 2)
    out, want, gk, ge = _grad_pair(_pool(3, 2, 1), x, torch.float32)
    torch.testing.assert_close(out, want)
    torch.testing.assert_close(gk, ge, rtol=0, atol=1e-6)
    assert gk.abs().sum() > 0


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "f16"])
def test_max_pool_grad_reduced_precision(dtype, device):
    torch.manual_seed(2)
    x = torch.randn(2, 3, 9, 9).to(dtype)   # bf16 rounding makes ties common
    out, want, gk, ge = _grad_pair(_pool(3, 2, 1), x, dtype, device=device)
    assert_close(out, want, dtype)
    assert_close(gk, ge, dtype)


@pytest.mark.parametrize("layout", ["channels_last", "transposed"])
def test_max_pool_grad_of_strided_inputs(layout):
    torch.manual_seed(3)
    if layout == "channels_last":
        x = torch.randn(2, 3, 8, 8).to(memory_format=torch.channels_last)
    else:
        x = torch.randn(2, 3, 8, 8).transpose(-1, -2)
    out, want, gk, ge = _grad_pair(_pool(3, 2, 1), x, torch.float32)
    assert_close(out, want, torch.float32)
    torch.testing.assert_close(gk, ge, rtol=0, atol=1e-6)


def test_forward_saves_one_int8_offset_per_output():
    """The training forward saves the window offsets (int8, one per pooled element) for the
    backward, instead of the backward recomputing the chain of window maxima."""
    x = torch.randn(2, 3, 9, 9, requires_grad=True)

    def fn(x):
        return F.max_pool2d(torch.relu(x), 3, 2, 1).sum()

    with kiln.config.patch(strict=True):
        r = kiln.explain(fn)(x)
    source = "\n".join(w.source for w in r.wrappers)
    assert "(2, 3, 5, 5), (75, 25, 5, 1), dtype=torch.int8" in source
    r.result.backward()
    xe = x.detach().clone().requires_grad_(True)
    (ge,) = torch.autograd.grad(fn(xe), xe)
    torch.testing.assert_close(x.grad, ge, rtol=0, atol=1e-6)
