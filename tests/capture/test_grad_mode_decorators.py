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
