"""A torch op with no core op that returns several tensors is one fallback node whose results
are read by getitem (torch's named tuple kept: .values/.indices), inside one graph."""
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
