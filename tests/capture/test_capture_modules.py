"""nn.Module capture: submodule forwards are inlined, parameters are lifted as graph inputs."""
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import kiln
from capture_helpers import check, locals_for, run_captured
from kiln.capture import trace
from kiln.ops import core


class LinearRelu(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(8, 6)

    def forward(self, x):
        return torch.relu(self.linear(x))


def scale_shift(x, scale, shift=1.0):
    return x * scale + shift


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = LinearRelu()
        self.proj = nn.Linear(6, 4, bias=False)
        self.act = nn.ReLU()
        self.scale = 0.5

    def forward(self, x):
        h = self.inner(x)
        h = scale_shift(h, self.scale)
        return self.act(self.proj(h)) + self.proj.weight.sum() if False else self.act(self.proj(h))


def test_linear_relu_lifts_parameters():
    m = LinearRelu()
    result = check(m.forward, lambda: (torch.randn(4, 8),))
    assert result.input_sources == ["L['x']", "L['self'].linear.weight", "L['self'].linear.bias"]
    assert [n.target for n in result.graph.calls] == [core.linear, core.relu]
    assert any("id(type(L['self']))" in g for g in result.guards)  # by type: instances share it
    assert not any("id(L['self'])" in g for g in result.guards)
    assert any("L['self'].training" in g for g in result.guards)
    assert any("type(L['self'].linear.weight) is torch.nn.Parameter" == g for g in result.guards)


def test_inplace_weight_update_is_seen():
    m = LinearRelu()
    x = torch.randn(4, 8)
    result = trace(m.forward, (x,), {})
    with torch.no_grad():
        m.linear.weight.mul_(2)
    L = locals_for(m.forward, (x,))
    torch.testing.assert_close(run_captured(result, m.forward, (x,)), m(x))
    assert result.guard_fn(L, m.forward.__func__.__globals__)


def test_nested_submodules_and_helper_function():
    m = Block()
    result = check(m.forward, lambda: (torch.randn(4, 8),))
    assert result.input_sources == ["L['x']", "L['self'].inner.linear.weight",
                                    "L['self'].inner.linear.bias", "L['self'].proj.weight"]
    assert [n.target for n in result.graph.calls] == [core.linear, core.relu, core.mul,
                                                      core.add, core.linear, core.relu]
    # the helper's nodes point at the helper's source lines
    mul = result.graph.calls[2]
    assert "return x * scale + shift" in mul.meta["source"]
    assert any("L['self'].scale" in g for g in result.guards)


def test_same_parameter_read_twice_is_one_placeholder():
    class Tied(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = nn.Linear(8, 8)

        def forward(self, x):
            return F.linear(F.linear(x, self.a.weight), self.a.weight, self.a.bias)

    m = Tied()
    result = check(m.forward, lambda: (torch.randn(4, 8),))
    assert len(result.graph.placeholders) == 3


def test_sequential_and_module_list():
    class Stack(nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = nn.ModuleList([nn.Linear(8, 8) for _ in range(3)])
            self.head = nn.Sequential(nn.Linear(8, 4), nn.Sigmoid())

        def forward(self, x):
            for i, layer in enumerate(self.layers):
                x = layer(x).relu() if i % 2 == 0 else layer(x).tanh()
            return self.head(x + self.layers[0](x))

    m = Stack()
    result = check(m.forward, lambda: (torch.randn(4, 8),))
    assert "L['self'].layers[0].weight" in result.input_sources
    assert "L['self'].head[0].bias" in result.input_sources


def test_module_with_backward_hook_is_unsupported():
    # forward hooks are traced (tests/capture/test_submodule_hooks.py); backward hooks are not
    import pytest
    from kiln.capture import Unsupported

    m = Block()
    handle = m.inner.register_full_backward_hook(lambda mod, gin, gout: None)
    try:
        with pytest.raises(Unsupported, match="backward hooks"):
            trace(m.forward, (torch.randn(4, 8),), {})
    finally:
        handle.remove()


def test_calling_the_module_directly():
    m = LinearRelu()

    def fn(model, x):
        return model(x) * 2

    result = check(lambda x: fn(m, x), lambda: (torch.randn(4, 8),))
    assert "L['m'].linear.weight" in result.input_sources


class _Holder:
    pass


class _KeepsItsMethod(nn.Module):
    """Stores its own method's function into Python state, as the kernels package's
    use_kernelized_func does (a dict of (module, Func.forward) set on a context holder)."""

    def __init__(self, holder):
        super().__init__()
        self.holder = holder
        self.lin = nn.Linear(3, 3)

    def helper(self, x):
        return x + 1

    def forward(self, x, brk=False):
        self.holder.table = {"fn": (self, self.helper.__func__)}
        y = self.lin(x)
        if brk:
            kiln.graph_break()
        return self.holder.table["fn"][1](self, y)


@pytest.mark.parametrize("brk", [False, True], ids=["stored", "live-at-a-break"])
def test_a_methods_function_is_stored_and_rebuilt(brk):
    """``m.helper.__func__`` is reached through the module (guarded as any function), so the
    replayed write and a graph break's glue can rebuild it; no part runs eagerly."""
    holder = _Holder()
    m = _KeepsItsMethod(holder)
    x = torch.randn(2, 3)
    kiln.reset()
    out = kiln.explain(m, backend="eager")(x, brk)
    assert not out.eager_runs, out.eager_runs
    assert out.graph_break_count == int(brk), out.break_reasons
    torch.testing.assert_close(out.result, m.lin(x) + 1)
    assert holder.table["fn"][1] is _KeepsItsMethod.helper and holder.table["fn"][0] is m
