"""In-place aten ops without a Tensor method of their name (``aten.hardswish_``, ``aten.silu_``,
``aten.elu_``; peer ``test_inplace_activations``): the functional op's result written into
``self``, functionalized like any in-place write (views of self see it). Before, a break. Ops
that change self's shape in place (``unsqueeze_``) stay breaks."""
from __future__ import annotations

import pytest
import torch

import kiln

aten = torch.ops.aten


def test_inplace_activations_write_self_and_return_it():
    def fn(x):
        a = aten.hardswish_(x + 1)
        b = aten.hardtanh_(x + 1)
        c = aten.leaky_relu_(x + 1)
        d = aten.silu_(x + 1)
        f = aten.masked_fill_(x + 1, torch.ones_like(x, dtype=torch.bool), 99.0)
        y = x * 2
        r = aten.elu_(y, 2.0)
        return a, b, c, d, f, y, r is y
    x = torch.randn(64) * 10
    got, want = kiln.compile(fn, fullgraph=True)(x), fn(x)
    assert got[-1] is want[-1] is True
    for g, w in zip(got[:-1], want[:-1]):
        assert torch.allclose(g, w)
    assert kiln.stats()["eager_runs"] == 0


def test_inplace_aten_op_on_a_view_reaches_its_base_and_the_callers_tensor():
    def fn(x, inp):
        y = x.clone()
        aten.relu_(y[1:])
        aten.hardsigmoid_(inp[:2])
        return y
    x, inp = torch.randn(8), torch.randn(5)
    inp_eager = inp.clone()
    got = kiln.compile(fn, fullgraph=True)(x, inp)
    want = fn(x, inp_eager)
    assert torch.equal(got, want) and torch.allclose(inp, inp_eager)


def test_shape_changing_inplace_aten_ops_compile():
    """aten.unsqueeze_ of an intermediate rebinds it to the view (tests/capture/
    test_inplace_views.py; on an input it is a break)."""
    def fn(a):
        t = a + 1
        aten.unsqueeze_(t, 0)
        return t
    x = torch.randn(2, 2)
    out = kiln.compile(fn, fullgraph=True)(x)
    assert out.shape == (1, 2, 2) and torch.equal(out, fn(x))
