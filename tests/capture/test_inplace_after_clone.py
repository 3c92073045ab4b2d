"""In-place ops on a clone of an input never reach the caller's tensor, on every backend.

Each case runs ``a = a.clone(); <in-place op on a>; return a`` (and variants through a view of
the clone, and with a graph break between the clone and the write, so the clone is a graph
output that the resumed code writes into natively). The caller's tensors must keep their
values, and the result must match eager's.
"""
from __future__ import annotations

import pytest
import torch

import kiln

BACKENDS = ["eager", "aot_eager", "kiln"]


def _idx():
    return torch.tensor([0, 2])


CASES = {
    "index_put_": lambda a: a.index_put_((_idx(),), torch.ones(2, 4)),
    "index_put_2d": lambda a: a.index_put_((_idx(), torch.tensor([1, 3])), torch.ones(2)),
    "index_put_acc": lambda a: a.index_put_((_idx(),), torch.ones(2, 4), accumulate=True),
    "setitem": lambda a: a.__setitem__(_idx(), 5.0),
    "setitem_slice": lambda a: a.__setitem__((slice(None), 1), 7.0),
    "add_": lambda a: a.add_(1.5),
    "mul_": lambda a: a.mul_(3.0),
    "sub_alpha": lambda a: a.sub_(torch.ones(4), alpha=2),
    "div_": lambda a: a.div_(2.0),
    "copy_": lambda a: a.copy_(torch.full((3, 4), 9.0)),
    "masked_fill_": lambda a: a.masked_fill_(a > 0, -1.0),
    "scatter_": lambda a: a.scatter_(1, torch.tensor([[0], [1], [2]]), 4.0),
    "scatter_add_": lambda a: a.scatter_add_(0, torch.zeros(1, 4, dtype=torch.long), torch.ones(1, 4)),
    "index_add_": lambda a: a.index_add_(0, _idx(), torch.ones(2, 4)),
    "index_copy_": lambda a: a.index_copy_(0, _idx(), torch.ones(2, 4)),
    "index_fill_": lambda a: a.index_fill_(1, torch.tensor([1]), 3.0),
    "clamp_": lambda a: a.clamp_(-0.5, 0.5),
    "zero_": lambda a: a.zero_(),
    "fill_": lambda a: a.fill_(2.0),
    "relu_": lambda a: a.relu_(),
    "exp_": lambda a: a.exp_(),
    "neg_": lambda a: a.neg_(),
    "iadd": lambda a: a.__iadd__(torch.ones(4)),
    "view_add_": lambda a: a[1].add_(10.0),
    "t_mul_": lambda a: a.t().mul_(2.0),
}


def _run(op, brk):
    def f(a):
        a = a.clone()
        if brk:
            kiln.graph_break()
        op(a)
        return a
    return f


def _eager(op):
    def f(a):
        a = a.clone()
        op(a)
        return a
    return f


@pytest.mark.parametrize("brk", [False, True], ids=["one_graph", "break_after_clone"])
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", sorted(CASES))
def test_inplace_after_clone_leaves_the_caller_alone(name, backend, brk):
    op = CASES[name]
    x = torch.randn(3, 4)
    original = x.clone()
    expected = _eager(op)(x.clone())
    got = kiln.compile(_run(op, brk), backend=backend)(x)
    torch.testing.assert_close(x, original, rtol=0, atol=0, msg=f"{name}: the caller's tensor changed")
    torch.testing.assert_close(got, expected)
    assert got.data_ptr() != x.data_ptr()
    assert kiln.stats()["fallbacks"] == 0  # compiled, not run eagerly after an internal error


@pytest.mark.parametrize("backend", BACKENDS)
def test_clone_output_is_a_new_tensor(backend):
    x = torch.randn(3, 4)
    out = kiln.compile(lambda a: a.clone(), backend=backend)(x)
    assert out.data_ptr() != x.data_ptr()
    out.add_(1)
    assert not torch.equal(out, x)


@pytest.mark.parametrize("backend", BACKENDS)
def test_write_through_detach_after_a_break_reaches_the_caller(backend):
    """The other direction: detach() aliases its input in eager, so a write through it after a
    graph break changes the caller's tensor there, and must here too."""
    def f(a):
        b = a.detach()
        kiln.graph_break()
        b.add_(1.0)
        return b * 2

    x, y = torch.randn(3, 4), None
    y = x.clone()
    expected = f(y)
    got = kiln.compile(f, backend=backend)(x)
    torch.testing.assert_close(got, expected)
    torch.testing.assert_close(x, y)
