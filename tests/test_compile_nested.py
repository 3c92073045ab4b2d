"""``@kiln.compile`` on a class, and compiled functions inside compiled code, as torch.compile
takes them (peer test_torchinductor ``test_linear_dynamic_maxautotune``):

- a class comes back with its instances' calls compiled. Before, kiln compiled the constructor
  call, which graph-broke on the class and ran eagerly, so no instance was ever compiled;
- a compiled function called in a traced frame, a module whose class compiled its forward, and
  such a module compiled again whole, are traced as the functions they wrap, in one graph (as
  Dynamo inlines a nested torch.compile). Before, each was a graph break, an error under
  ``fullgraph=True``."""
from __future__ import annotations

import pytest
import torch

import kiln


def test_module_class_compiles_each_instance_forward():
    @kiln.compile(dynamic=True)
    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = torch.nn.Linear(3, 2)

        def forward(self, x):
            return self.linear(x).relu()

    kiln.reset()
    assert isinstance(Model, type)
    for rows in (4, 7):
        model, x = Model(), torch.randn(rows, 3)
        got = model(x)
        want = torch.relu(torch.nn.functional.linear(x, model.linear.weight, model.linear.bias))
        assert got.dtype == want.dtype and got.stride() == want.stride()
        torch.testing.assert_close(got, want)
    stats = kiln.stats()
    assert stats["frames_compiled"] >= 1 and stats["eager_runs"] == 0, stats


def test_plain_class_compiles_its_call():
    @kiln.compile
    class Scale:
        def __init__(self, k):
            self.k = k

        def __call__(self, x):
            return x.sin() * self.k

    kiln.reset()
    x = torch.randn(5)
    torch.testing.assert_close(Scale(3.0)(x), x.sin() * 3.0)
    assert kiln.stats()["frames_compiled"] == 1


def test_class_without_a_python_call_is_refused():
    class Opaque:
        pass
    with pytest.raises(TypeError, match="__call__"):
        kiln.compile(Opaque)


def test_compiled_function_inside_a_compiled_function_is_one_graph():
    @kiln.compile
    def inner(x):
        return x + 1

    def outer(x):
        return inner(x).sin() * 2

    x = torch.randn(6)
    want = (x + 1).sin() * 2
    kiln.reset()
    torch.testing.assert_close(kiln.compile(outer, fullgraph=True)(x), want)
    assert kiln.stats()["graph_breaks"] == 0 and kiln.stats()["frames_compiled"] == 1


def test_module_with_a_compiled_forward_inside_compiled_code_and_compiled_whole():
    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = torch.nn.Linear(4, 4)

        @kiln.compile
        def forward(self, x):
            return self.linear(x).tanh()

    block = Block()
    x = torch.randn(3, 4)
    want = torch.tanh(torch.nn.functional.linear(x, block.linear.weight, block.linear.bias))
    kiln.reset()
    torch.testing.assert_close(kiln.compile(lambda t: block(t) * 2, fullgraph=True)(x), want * 2)
    torch.testing.assert_close(kiln.compile(block, fullgraph=True)(x), want)
    assert kiln.stats()["graph_breaks"] == 0
