"""``requires_grad_()`` on a tensor made in the compiled function (kiln/capture/made_leaves.py):
with grad mode off it is captured (MRA's ``zeros_like(query).requires_grad_()``), the flag read
as eager's and given back to the tensor where it leaves the trace; with grad mode on, on an
input, or on a tensor later read with grad on, it is a graph break and eager's behaviour holds."""
import pytest
import torch

import kiln


def used_under_no_grad(x):
    with torch.no_grad():
        t = torch.zeros_like(x).requires_grad_()
        return x * 2 + t


def flag_is_read(x):
    with torch.no_grad():
        t = torch.zeros_like(x).requires_grad_()
        return x + 1 if t.requires_grad and t.is_leaf and t.grad is None else x - 1


def returned(x):
    with torch.no_grad():
        t = torch.ones_like(x)
        t.requires_grad = True
        return x + t, t


def unchanged_flag(x):
    y = x * 2
    y.requires_grad_(False)  # already False: nothing to do
    return y.requires_grad_(x.requires_grad) + 1


def one_graph(fn, *args):
    kiln.reset()
    out = kiln.explain(fn, backend="eager")(*args)
    assert (out.graph_count, out.graph_break_count) == (1, 0), out.break_reasons
    return out.result


@pytest.mark.parametrize("fn", [used_under_no_grad, flag_is_read, unchanged_flag])
def test_one_graph_as_eager(fn):
    x = torch.randn(3)
    got, want = one_graph(fn, x), fn(x)
    torch.testing.assert_close(got, want)
    assert got.requires_grad == want.requires_grad


def test_returned_leaf_requires_grad():
    x = torch.randn(3)
    out, leaf = one_graph(returned, x)
    assert leaf.requires_grad and leaf.is_leaf and leaf.grad_fn is None
    assert not out.requires_grad
    compiled = kiln.compile(returned)
    for _ in range(2):  # the flag is set again on each call's fresh output
        out, leaf = compiled(x)
        assert leaf.requires_grad and leaf.is_leaf
        torch.testing.assert_close(out, x + 1)


class Holder:
    pass


def test_stored_leaf_requires_grad():
    holder = Holder()

    def store(x, h):
        with torch.no_grad():
            h.state = torch.zeros_like(x).requires_grad_()
        return x + 1
    one_graph(store, torch.randn(2), holder)
    assert holder.state.requires_grad and holder.state.is_leaf


def grad_mode_on(x):
    t = torch.zeros_like(x).requires_grad_()
    return x * 2 + t


def used_with_grad_later(x):
    with torch.no_grad():
        t = torch.zeros_like(x).requires_grad_()
    return x * 2 + t  # eager records this op: the result requires grad


def on_an_input(x):
    x.requires_grad_()
    return x * 2


def live_at_a_break(x):
    with torch.no_grad():
        t = torch.zeros_like(x).requires_grad_()
    kiln.graph_break()
    return t.requires_grad, x + 1


@pytest.mark.filterwarnings("ignore:kiln:RuntimeWarning")
@pytest.mark.parametrize("fn,reason", [
    (grad_mode_on, "with grad mode on"),
    (used_with_grad_later, "reads a tensor made to require grad"),
    (on_an_input, "on an input or a view"),
])
def test_refused_cases_break_and_match_eager(fn, reason):
    kiln.reset()
    out = kiln.explain(fn, backend="eager")(torch.randn(3))
    assert out.graph_break_count >= 1 and reason in out.break_reasons[0].reason, out.break_reasons
    want = fn(torch.randn(3))
    assert out.result.requires_grad == want.requires_grad


@pytest.mark.filterwarnings("ignore:kiln:RuntimeWarning")
def test_live_at_a_break_runs_the_rest_eagerly():
    kiln.reset()
    flag, out = kiln.compile(live_at_a_break)(torch.ones(2))
    assert flag is True
    torch.testing.assert_close(out, torch.full((2,), 2.0))


@pytest.mark.filterwarnings("ignore:kiln:RuntimeWarning")
def test_integer_tensor_raises_as_eager():
    def fn(x):
        with torch.no_grad():
            return torch.zeros_like(x).requires_grad_()
    with pytest.raises(RuntimeError, match="floating point"):
        kiln.compile(fn, backend="eager")(torch.ones(2, dtype=torch.int64))
