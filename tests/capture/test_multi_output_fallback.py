"""A torch op with no core op that returns several tensors is one fallback node whose results
are read by getitem (torch's named tuple kept: .values/.indices), inside one graph."""
import pytest
import torch

import kiln
from testing import assert_close


def fn(x):
    s = torch.sort(x, dim=1, descending=True)
    var, mean = torch.var_mean(x, 1)
    lo, hi = x.aminmax()
    k = torch.topk(x, 2)
    return s.values * 2, s.indices, var + mean, lo, hi, k.values, k.indices


def test_multi_output_ops_are_one_fallback_node_each():
    x = torch.randn(4, 6)
    e = kiln.explain(fn)(x)
    assert e.graph_count == 1 and e.graph_break_count == 0, e.break_reasons
    for got, want in zip(kiln.compile(fn, fullgraph=True)(x), fn(x)):
        assert_close(got, want)
    x = torch.randn(4, 6)  # fresh inputs, same compiled code
    for got, want in zip(kiln.compile(fn, fullgraph=True)(x), fn(x)):
        assert_close(got, want)


def test_named_tuple_fields_survive():
    def g(x):
        r = torch.sort(x)
        return r.indices, r[0]
    x = torch.randn(8)
    got, want = kiln.compile(g, fullgraph=True)(x), g(x)
    assert_close(got[0], want[0])
    assert_close(got[1], want[1])


def test_multi_output_fallback_needing_a_gradient_compiles_with_torchs_gradient():
    x = torch.randn(4, 6, requires_grad=True)
    f2 = lambda x: torch.sort(x, 1).values.cumsum(1).sum()  # noqa: E731
    e = kiln.explain(f2)(x)
    assert e.graph_break_count == 0
    kiln.compile(f2)(x).backward()
    g = x.grad
    x2 = x.detach().clone().requires_grad_()
    f2(x2).backward()
    assert_close(g, x2.grad)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_histogramdd_is_one_node_and_torchs_named_tuple(dtype):
    # PyTorch's test_kwargs: torch has no meta kernel for the bin edges (ops/core_fallback.py)
    x, w = torch.randn(40, 2, dtype=dtype), torch.rand(40, dtype=dtype)
    fn = lambda x, w: torch.histogramdd(x, bins=[3, 4], weight=w)  # noqa: E731
    assert kiln.explain(fn)(x, w).graph_break_count == 0
    got, want = kiln.compile(fn, fullgraph=True)(x, w), fn(x, w)
    assert type(got) is type(want) and type(got.bin_edges) is list and len(got.bin_edges) == 2
    assert got.hist.dtype == want.hist.dtype
    assert_close(got.hist, want.hist)
    for a, b in zip(got.bin_edges, want.bin_edges):
        assert_close(a, b)
    fn2 = lambda x: torch.histogramdd(x * 2, bins=5, range=[-1., 1., -2., 2.], density=True).hist  # noqa: E731
    assert_close(kiln.compile(fn2, fullgraph=True)(x), fn2(x))
    e = kiln.explain(lambda x: torch.histogramdd(x, bins=[3, 3]))(x.requires_grad_())
    assert e.graph_break_count == 1  # eager has no derivative for it
