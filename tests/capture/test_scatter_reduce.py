"""Scatter reductions compile (PyTorch's test_torchinductor test_scatter5, test_scatter_reduce3):
``scatter_(reduce='add')`` and ``scatter_reduce(reduce='sum')`` are scatter_add; the other
reductions, in place or not, are fallback nodes inside the graph, never a graph break. Each
matches eager on fresh random inputs, results and inputs afterwards."""
import pytest
import torch

import kiln
from kiln.capture import trace
from kiln.ops import core
from mutation_helpers import check_mutation


def _index():
    return torch.randint(0, 4, (3, 5))


def scatter_reduce_inplace(a, index, b, reduce):
    a = a.clone()
    a.scatter_(0, index, b, reduce=reduce)
    a1 = a + 1.0
    a1.scatter_(0, index, b, reduce=reduce)
    return a, a1


def scatter_reduce_method(a, index, b, reduce, include_self):
    a = a.clone()
    a.scatter_reduce_(0, index, b, reduce=reduce, include_self=include_self)
    return a, torch.scatter_reduce(a * 2, 1, index, b, reduce, include_self=include_self)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("reduce", ["add", "multiply"])
def test_scatter_with_reduce(reduce, dtype):
    check_mutation(scatter_reduce_inplace, lambda: [torch.randn(4, 5, dtype=dtype), _index(),
                                                    torch.randn(4, 5, dtype=dtype), reduce],
                   "kiln", dtype=dtype)
    assert kiln.stats()["graph_breaks"] == 0


@pytest.mark.parametrize("include_self", [True, False])
@pytest.mark.parametrize("reduce", ["sum", "prod", "amax", "mean"])
def test_scatter_reduce(reduce, include_self):
    check_mutation(scatter_reduce_method, lambda: [torch.randn(4, 5), _index(),
                                                   torch.randn(4, 5), reduce, include_self], "kiln")
    assert kiln.stats()["graph_breaks"] == 0


def test_sum_is_scatter_add():
    """The sum over the input needs no library call (it has a VJP rule too)."""
    graph = trace(scatter_reduce_method, [torch.randn(4, 5), _index(), torch.randn(4, 5), "sum",
                                          True]).graph
    assert not [n for n in graph.calls if n.target is core.fallback]


def test_scatter_reduce_gradient_as_eager():
    """Eager has no derivative for scatter(reduce=): compiled, the backward raises as eager's
    does (the call stays eager's), where scatter_reduce's sum has one, and matches eager."""
    def f(a, index, b):
        return torch.scatter(a, 0, index, b, reduce="add").square().sum()

    def g(a, index, b):
        return torch.scatter_reduce(a, 0, index, b, "sum").square().sum()
    a, b, index = torch.randn(4, 5), torch.randn(3, 5), _index()
    for fn in (f, kiln.compile(f)):
        x, y = a.clone().requires_grad_(), b.clone().requires_grad_()
        with pytest.raises(RuntimeError, match="derivative for aten::scatter"):
            fn(x, index, y).backward()
    grads = []
    for fn in (g, kiln.compile(g, fullgraph=True)):
        x, y = a.clone().requires_grad_(), b.clone().requires_grad_()
        fn(x, index, y).backward()
        grads.append((x.grad, y.grad))
    torch.testing.assert_close(grads[1], grads[0])
