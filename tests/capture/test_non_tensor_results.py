"""Torch calls that return no tensor, and ``torch.tensor`` of a traced tensor (issue 24, peer
``test_functions`` ``test_is_complex``, ``test_is_floating_point``, ``test_add_``).

Before, each ran the whole frame eagerly: the fallback node's meta refused a bool result, which
read as an argument error ("capture refused an op's arguments"), and ``torch.tensor(t)`` tried
to build a constant from a proxy. Now the metadata queries are answered at trace time, a
fallback returning no tensor is a graph break (the rest compiles), and ``torch.tensor(t)`` is a
detached copy, as eager's.
"""
from __future__ import annotations

import warnings

import torch

import kiln


def _compiled_run(fn, *args):
    kiln.reset()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # torch.tensor(tensor)'s advice
        want = fn(*args)
        got = kiln.compile(fn)(*args)
    return got, want, kiln.stats()


def test_metadata_queries_as_torch_functions_compile_in_one_graph():
    def fn(x):
        y = x + 1
        a = torch.is_floating_point(y), torch.is_floating_point(input=y), torch.is_complex(y)
        return y * torch.numel(y) if a[0] and not a[2] else y, a
    for x in (torch.randn(3, 4), torch.arange(6)):
        got, want, stats = _compiled_run(fn, x)
        assert got[1] == want[1] and torch.equal(got[0], want[0])
        assert stats["eager_runs"] == 0 and stats["graph_breaks"] == 0 and stats["frames_compiled"] == 1


def test_a_fallback_returning_no_tensor_is_a_graph_break_not_an_eager_run():
    def fn(x, y):
        a = x * 2
        dtype = torch.result_type(a, y)  # a dtype: no graph node can hold it
        return (a + y).to(dtype) - 1
    x, y = torch.randn(4), torch.randn(4, dtype=torch.float64)
    got, want, stats = _compiled_run(fn, x, y)
    assert got.dtype == want.dtype and torch.allclose(got, want)
    assert stats["eager_runs"] == 0 and stats["graph_breaks"] == 1 and stats["frames_compiled"] >= 1


def test_torch_tensor_of_a_traced_tensor_is_a_detached_copy():
    def fn(a, b):
        c = torch.tensor(a)
        d = torch.tensor(a.t(), dtype=torch.float64)
        return c.add_(b, alpha=5.0), d, c.requires_grad
    a = torch.randn(3, 4, requires_grad=True)
    b = torch.randn(3, 4)
    got, want, stats = _compiled_run(fn, a, b)
    assert stats["eager_runs"] == 0 and stats["graph_breaks"] == 0
    for g, w in zip(got[:2], want[:2]):
        assert g.dtype == w.dtype and g.stride() == w.stride() and not g.requires_grad
        assert torch.allclose(g, w.detach())
    assert got[2] is False
    assert a.grad is None and torch.equal(a, a.detach())  # the caller's tensor is not written
