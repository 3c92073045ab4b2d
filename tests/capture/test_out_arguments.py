"""``torch.op(..., out=t)`` (kiln/capture/out_arguments.py): a write of ``t``, for every
capture-table entry, in the graph; forms whose eager answer is not "compute, then copy"
(resize, cast, partial overlap, autograd) stay with eager and match it."""
import warnings

import pytest
import torch

import kiln


def _run_both(fn, make):
    want_args, got_args = make(), make()
    want = fn(*want_args)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got = kiln.compile(fn)(*got_args)
    for w, g in zip(want_args, got_args):
        if isinstance(w, torch.Tensor):
            torch.testing.assert_close(g, w, rtol=0, atol=0)
    return want, got, got_args


def test_out_is_written_and_returned_in_one_graph():
    def f(a, b, c, d):
        r = torch.maximum(a, b, out=c)  # torch.optim's amsgrad: maximum(max_sq, sq, out=max_sq)
        torch.add(a, 1, out=a)  # out is an input of the op
        torch.mul(a, b[1], out=d[0])  # out is a view: its base sees the write
        return r, d.sum()
    want, got, got_args = _run_both(f, lambda: [torch.ones(3), torch.arange(6.).view(2, 3),
                                                torch.zeros(2, 3), torch.zeros(2, 3)])
    torch.testing.assert_close(got, want)
    assert got[0] is got_args[2]  # eager returns out itself
    stats = kiln.stats()
    assert (stats["graph_breaks"], stats["eager_runs"]) == (0, 0), stats


def test_an_out_read_after_the_write_sees_the_new_value():
    def f(a, out):
        torch.sqrt(a, out=out)
        return out * 2
    want, got, _ = _run_both(f, lambda: [torch.arange(4.), torch.zeros(4)])
    torch.testing.assert_close(got, want)
    assert kiln.stats()["graph_breaks"] == 0


def _resized(a, out):
    return torch.sin(a, out=out)


def _cast(a, out):
    return torch.add(a, a, out=out)


def _one_storage(a, _):
    return torch.mul(a[0], 2, out=a[1])  # rows of one tensor: kiln does not tell overlaps apart


@pytest.mark.parametrize("fn,make", [
    (_resized, lambda: [torch.arange(3.), torch.empty(0)]),
    (_cast, lambda: [torch.arange(3), torch.zeros(3)]),
    (_one_storage, lambda: [torch.arange(6.).view(2, 3), 0]),
], ids=["resized", "cast", "one_storage"])
def test_forms_eager_answers_otherwise_stay_with_eager(fn, make):
    """An out eager resizes, a dtype eager casts to, an out sharing memory with an input: a
    break, and eager's answer."""
    want, got, _ = _run_both(fn, make)
    torch.testing.assert_close(got, want)
    assert kiln.stats()["graph_breaks"] >= 1


def test_out_under_grad_mode_with_a_grad_argument_raises_as_eager():
    def f(a, out):
        return torch.mul(a, 2, out=out)
    a = torch.ones(3, requires_grad=True)
    with pytest.raises(RuntimeError, match="out=... arguments don't support automatic differentiation"):
        f(a, torch.zeros(3))
    with warnings.catch_warnings(), \
            pytest.raises(RuntimeError, match="out=... arguments don't support automatic differentiation"):
        warnings.simplefilter("ignore")
        kiln.compile(f)(a, torch.zeros(3))
