"""``x.resize_as_(y)`` / ``x.resize_(...)`` change a tensor's size and storage in place.

``resize_as_``'s functional-looking twin ``resize_as`` is autograd's same-numel reshape, so
reading the in-place op as "the functional op written back" failed at capture on any resize
that grows, and the whole frame ran eagerly (PyTorch's own ``test_inplace_resize_as``). It is
a graph break now: the ops before and after it run compiled, nothing runs eagerly.
"""
import pytest
import torch

import kiln


def _grow_as(x, y):
    z = x * 2
    x.resize_as_(y)
    return z.sum() + y.mean(), x.shape


def _grow_to(x, n):
    z = x + 1
    x.resize_(n, 3)
    return z * 3, x.shape


@pytest.mark.parametrize("fn,make", [
    (_grow_as, lambda: (torch.randn(2, 3), torch.randn(20, 30))),
    (_grow_to, lambda: (torch.randn(2, 3), 50)),
])
def test_resize_in_place_is_a_break_that_resumes(fn, make):
    kiln.reset()
    args = make()
    x_eager = args[0].clone()
    expected = fn(x_eager, *args[1:])
    x = args[0].clone()
    out = kiln.compile(fn)(x, *args[1:])
    torch.testing.assert_close(out[0], expected[0])
    assert out[1] == expected[1] == x.shape == x_eager.shape
    stats = kiln.stats()
    assert stats["eager_runs"] == 0
    assert stats["graph_breaks"] >= 1 and stats["graphs_compiled"] >= 1
