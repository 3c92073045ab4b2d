"""Grad-mode decorators and context objects reached as values: ``@torch.no_grad()`` on a
module's forward stacked over a ``functools.wraps`` decorator (transformers' rotary embeddings
before 5.2x), on a method, ``@torch.set_grad_enabled(False)``, and a global ``torch.no_grad()``
object. torch's decorator runs ``with ctx_factory():`` where ctx_factory is the context's bound
``clone``; capture traces it as a grad-mode change: one graph, no break, and the same
gradients as eager."""
import functools

import pytest
import torch

import kiln


def passthrough(fn):
    @functools.wraps(fn)
    def wrapper(self, *args, **kwargs):
        return fn(self, *args, **kwargs)
    return wrapper


class Rotary(torch.nn.Module):
    @torch.no_grad()
    @passthrough
    def forward(self, x):
        return x.cos() * 2


class Halver(torch.nn.Module):
    @torch.set_grad_enabled(False)
    def forward(self, x):
        return x / 2

    @torch.no_grad()
    def detached_sin(self, x):
        return x.sin()


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)
        self.rotary = Rotary()
        self.halver = Halver()

    def forward(self, x):
        h = self.lin(x)
        return h * self.rotary(h) + self.halver(h) * self.halver.detached_sin(h)


NO_GRAD = torch.no_grad()


def with_a_global_no_grad_object(x):
    with NO_GRAD:
        y = x * 3
    return x * y


def _check_one_graph(fn, x):
    out = kiln.explain(fn, backend="eager")(x)
    assert (out.graph_count, out.graph_break_count) == (1, 0), [str(b) for b in out.break_reasons]


@pytest.mark.parametrize("backend", ["eager", "kiln"])
def test_no_grad_decorated_forward_and_methods(backend):
    kiln.reset()
    torch.manual_seed(0)
    model = Model()
    x = torch.randn(3, 4)
    _check_one_graph(model, x)
    compiled = kiln.compile(model, backend=backend)
    for _ in range(2):
        x = torch.randn(3, 4)
        expected = model(x)
        grads = torch.autograd.grad(expected.sum(), list(model.parameters()))
        actual = compiled(x)
        torch.testing.assert_close(actual, expected)
        got = torch.autograd.grad(actual.sum(), list(model.parameters()))
        for g, e in zip(got, grads):  # the no_grad branches contribute no gradient
            torch.testing.assert_close(g, e)
    assert kiln.stats()["fallbacks"] == 0


@pytest.mark.parametrize("backend", ["eager", "kiln"])
def test_global_no_grad_object(backend):
    kiln.reset()
    x = torch.randn(4, requires_grad=True)
    _check_one_graph(with_a_global_no_grad_object, x)
    compiled = kiln.compile(with_a_global_no_grad_object, backend=backend)
    x = torch.randn(4, requires_grad=True)
    actual = compiled(x)
    expected = with_a_global_no_grad_object(x)
    torch.testing.assert_close(actual, expected)
    (got,) = torch.autograd.grad(actual.sum(), [x])
    (want,) = torch.autograd.grad(expected.sum(), [x])
    torch.testing.assert_close(got, want)  # 3x, not 6x: y is a constant inside no_grad


def decorated_in_the_frame(x):
    @torch.no_grad()
    def augment(x):
        return (x + 1) * 2

    @torch.enable_grad()
    def scaled(x):
        return x * 5

    y = augment(x)
    with torch.no_grad():
        z = scaled(x)       # enable_grad inside no_grad: differentiable again
    return y, z, y.requires_grad, z.requires_grad, x * 3


@pytest.mark.parametrize("backend", ["eager", "kiln"])
def test_a_grad_mode_decorator_applied_in_the_frame(backend):
    """``@torch.no_grad()`` on a function defined inside the compiled frame calls the context
    object with the function (PyTorch's test_functions.py
    test_context_wrapping_nested_functions_no_closure ran eagerly: 'calling GradModeVariable')."""
    x = torch.randn(4, requires_grad=True)
    _check_one_graph(decorated_in_the_frame, x)
    got, want = kiln.compile(decorated_in_the_frame, backend=backend)(x), decorated_in_the_frame(x)
    assert got[2:4] == want[2:4] == (False, True)
    for g, w in zip(got[:2] + got[4:], want[:2] + want[4:]):
        torch.testing.assert_close(g, w)
    (gz,) = torch.autograd.grad(got[1].sum() + got[4].sum(), [x])
    (wz,) = torch.autograd.grad(want[1].sum() + want[4].sum(), [x])
    torch.testing.assert_close(gz, wz)
    assert kiln.stats()["eager_runs"] == 0


def test_a_grad_mode_decorator_on_a_generator_in_the_frame_is_a_named_break():
    def fn(x):
        @torch.no_grad()
        def gen(x):
            yield x * 2
        return sum(gen(x)) + x
    x = torch.randn(3)
    out = kiln.explain(fn, backend="eager")(x)
    assert any("generator" in str(b) for b in out.break_reasons), [str(b) for b in out.break_reasons]
    torch.testing.assert_close(kiln.compile(fn)(x), fn(x))
