"""``assert`` on a one-element tensor and ``torch._assert(t, msg)`` (kiln/capture/tensor_asserts.py):
one graph, the check made at run time, and a false condition raising eager's AssertionError
(same arguments) before any Python-state write is replayed. I-BERT's activation ranges
(``assert x_max.isnan().sum() == 0 and x_min.isnan().sum() == 0, "..."``) broke twice a call.

PYTEST_DONT_REWRITE: the functions under test hold plain ``assert`` statements, as models do."""
import pytest
import torch

import kiln


def and_assert(x, y):
    a = x.amax()
    b = y.amin()
    assert a.isnan().sum() == 0 and b.isnan().sum() == 0, ("NaN detected " "in the ranges")
    return (x - a) * (y - b)


def bare_assert(x):
    assert (x > -100).all()
    return x.sin()


def not_assert(x):
    assert not x.isinf().any(), "inf"
    return x.cos() + 1


def torch_assert(x):
    torch._assert(x.sum() > 0, "a non-positive sum")
    return x.exp()


def computed_message(x):
    n = x.shape[0]
    assert x.sum() > 0, f"rows {n}"  # the message is built on the failing path: still a break
    return x * 2


def one_graph(fn, *args):
    kiln.reset()
    out = kiln.explain(fn, backend="eager")(*args)
    assert (out.graph_count, out.graph_break_count) == (1, 0), out.break_reasons
    return out.result


def eager_error(fn, *args):
    with pytest.raises(AssertionError) as info:
        fn(*args)
    return info.value.args


@pytest.mark.parametrize("fn,good,bad", [
    (and_assert, (torch.randn(3, 4), torch.randn(4)),
     (torch.tensor([[1.0, float("nan")]]), torch.randn(2))),
    (bare_assert, (torch.randn(5),), (torch.full((5,), -200.0),)),
    (not_assert, (torch.randn(5),), (torch.tensor([1.0, float("inf")]),)),
    (torch_assert, (torch.rand(6) + 0.1,), (-torch.rand(6),)),
])
def test_tensor_assert_is_one_graph_and_raises_as_eager(fn, good, bad):
    torch.testing.assert_close(one_graph(fn, *good), fn(*good))
    compiled = kiln.compile(fn)
    torch.testing.assert_close(compiled(*good), fn(*good))
    want = eager_error(fn, *bad)
    with pytest.raises(AssertionError) as info:
        compiled(*bad)  # the same entry where shapes agree, a new one where they do not
    assert info.value.args == want


def test_failing_assert_replays_no_python_write():
    class Ranges(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.calls = 0

        def forward(self, x):
            m = x.max()
            assert m.isnan().sum() == 0, "NaN"
            self.calls += 1
            return x / m

    model = Ranges()
    compiled = kiln.compile(model)
    x = torch.rand(4) + 0.5
    torch.testing.assert_close(compiled(x), x / x.max())
    assert model.calls == 1
    with pytest.raises(AssertionError, match="NaN"):
        compiled(torch.tensor([1.0, float("nan"), 2.0, 3.0]))
    assert model.calls == 1  # as in eager: the write after the assert never ran


def test_assert_in_training_matches_eager_gradients():
    w = torch.randn(4, 4, requires_grad=True)

    def step(x):
        h = x @ w
        assert h.isnan().sum() == 0 and h.abs().max() < 1e6, "bad activations"
        return h.tanh().sum()

    x = torch.randn(3, 4)
    loss = one_graph(step, x)
    (g,) = torch.autograd.grad(loss, w)
    (want,) = torch.autograd.grad(step(x), w)
    torch.testing.assert_close(g, want)


def test_computed_message_still_breaks_and_raises_as_eager():
    compiled = kiln.compile(computed_message)
    x = torch.rand(3)
    torch.testing.assert_close(compiled(x), x * 2)
    with pytest.raises(AssertionError, match="rows 3"):
        compiled(-x)


def test_many_elements_still_raise_eagers_error():
    def f(x):
        assert x > 0, "positive"
        return x + 1
    with pytest.raises(RuntimeError, match="ambiguous"):
        kiln.compile(f)(torch.rand(3))
