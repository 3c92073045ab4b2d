"""Guarded loads (codegen.common.KernelWriter.guard_ops, ``config.triton_guarded_loads``): on
Triton, the branches of a ``where`` whose condition reads indices only load under that
condition, so a cat, a pad or a gradient summed from slices reads each element from the one
source that provides it (it used to load every source at every element and select afterwards:
three times the reads for a q/k/v gradient). A condition that reads memory masks nothing.
Off by default (a CUDA failure is not understood); on here."""
import re

import pytest
import torch
import torch.nn.functional as F

import kiln
from testing import TARGETS, assert_close, on_target, randn


@pytest.fixture(autouse=True)
def _guarded_loads_on():
    with kiln.config.patch(triton_guarded_loads=True):
        yield

CASES = {
    "cat3": lambda a, b, c: torch.cat([a, b * 2, torch.tanh(c)], dim=1),
    "pad": lambda a, b, c: F.pad(a, (2, 3)) * 2 + 1,
    "cat_and_sum": lambda a, b, c: (lambda y: (y, y.sum(0)))(torch.cat([a, b, c], dim=1)),
    "where_shared": lambda a, b, c: torch.where(a > 0, a * b, a - c),
}


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("layout", ["contiguous", "transposed"])
@pytest.mark.parametrize("name", list(CASES))
def test_guarded_loads_match_eager(name, layout, dtype, target):
    fn = CASES[name]
    with on_target(target) as device:
        a, b, c = randn((40, 24), dtype, device, layout), randn((40, 24), dtype, device), randn((40, 24), dtype, device)
        got, want = kiln.compile(fn)(a, b, c), fn(a, b, c)
        for x, y in zip(got if isinstance(got, tuple) else (got,), want if isinstance(want, tuple) else (want,)):
            assert_close(x, y, dtype)


@pytest.mark.parametrize("target", [t for t in TARGETS if t.id.startswith("triton")])
def test_each_cat_source_is_loaded_under_its_condition(target):
    with on_target(target) as device:
        a, b, c = (torch.randn(16, 8, device=device) for _ in range(3))
        out = kiln.explain(CASES["cat3"])(a, b, c)
        assert_close(out.result, CASES["cat3"](a, b, c))
        (k,) = out.kernels
        loads = re.findall(r"tl\.load\(in_ptr\d+ .*, (xmask[^,]*), other=0\)", k.source)
        assert len(loads) == 3, k.source
        assert all(m.startswith("xmask & ") for m in loads), loads  # each under its selection
        # a load both branches need is read once, unmasked
        out = kiln.explain(CASES["where_shared"])(a, b, c)
        (k,) = out.kernels
        assert len(re.findall(r"tl\.load\(in_ptr0 ", k.source)) == 1, k.source
        assert_close(out.result, CASES["where_shared"](a, b, c))
        # a data-dependent condition (a > 0) masks no load: every load is under xmask alone
        assert re.findall(r"tl\.load\(in_ptr\d+ .*, (xmask[^,]*), other=0\)", k.source) == ["xmask"] * 3, k.source


@pytest.mark.parametrize("target", TARGETS)
def test_qkv_gradient_matches_eager(target):
    """The gradient of a q/k/v split (three slices summed into the projection's gradient) and its
    bias gradient, through attention."""
    B, T, H, D = 2, 16, 2, 8
    C = H * D
    with on_target(target) as device:
        lin = torch.nn.Linear(C, 3 * C).to(device)

        def f(x):
            q, k, v = lin(x).split(C, dim=2)
            q, k, v = (t.view(B, T, H, D).transpose(1, 2) for t in (q, k, v))
            return F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(B, T, C)

        x = torch.randn(B, T, C, device=device, requires_grad=True)
        g = torch.randn(B, T, C, device=device)
        kiln.compile(f)(x).backward(g)
        got = (x.grad, lin.weight.grad, lin.bias.grad)
        x.grad = lin.weight.grad = lin.bias.grad = None
        f(x).backward(g)
        for a, b in zip(got, (x.grad, lin.weight.grad, lin.bias.grad)):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("target", TARGETS)
def test_pad_and_cat_bounds_under_dynamic_shapes(target):
    """A pad's or cat's bound is symbolic once the shape is dynamic (``lo + s0``): it reaches the
    kernel as a size argument (codegen used to fail on it, and the call ran eagerly)."""
    f = lambda x: F.pad(x, (1, 1))[..., 1::2] ** 2  # noqa: E731
    g = lambda x, y: torch.cat([x, y * 2], dim=-1).sin()  # noqa: E731
    with on_target(target) as device, kiln.config.patch(strict=True):
        cf, cg = kiln.compile(f), kiln.compile(g)
        for n in (5, 7, 9, 12):
            x = torch.randn(3, n, device=device)
            assert_close(cf(x), f(x))
            assert_close(cg(x, x[:, :2]), g(x, x[:, :2]))
