"""``repeat_interleave`` with an int count (peer ``test_repeat_interleave``): a broadcast and a
reshape, with its gradient; before, a break (listed with the data-dependent ops). A tensor of
counts stays a break (its shape depends on the data)."""
from __future__ import annotations

import pytest
import torch

import kiln


def _fn(x):
    return (x.repeat_interleave(2), x.repeat_interleave(3, dim=0), x.repeat_interleave(x.size(1), dim=1),
            torch.repeat_interleave(x, 2, -1), torch.repeat_interleave(x.t(), 2, 0),
            x[0, 0].repeat_interleave(3))


def test_int_repeats_match_eager_with_gradients():
    x = torch.randn(4, 5, requires_grad=True)
    got, want = kiln.compile(_fn, fullgraph=True)(x), _fn(x)
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.stride() == w.stride() and torch.equal(g, w)
    sum(g.sum() * (i + 1) for i, g in enumerate(got)).backward()
    mine, x.grad = x.grad, None
    sum(w.sum() * (i + 1) for i, w in enumerate(want)).backward()
    assert torch.allclose(mine, x.grad)
    assert kiln.stats()["eager_runs"] == 0


def test_tensor_repeats_are_a_break():
    fn = lambda x, r: x.repeat_interleave(r, dim=0)  # noqa: E731
    x, r = torch.randn(3, 2), torch.tensor([1, 0, 2])
    with pytest.raises(kiln.GraphBreakError, match="data-dependent"):
        kiln.compile(fn, fullgraph=True)(x, r)
    kiln.reset()
    assert torch.equal(kiln.compile(fn)(x, r), fn(x, r))


def test_the_result_is_not_a_view_of_the_input():
    def fn(x):
        y = x.repeat_interleave(1, dim=1)  # the same elements: a reshape could be a view
        y.add_(1)
        return y, x * 1
    x = torch.randn(4, 1)
    got, want = kiln.compile(fn)(x), fn(x.clone())
    assert all(torch.equal(g, w) for g, w in zip(got, want))
