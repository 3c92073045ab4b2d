"""A module whose class forward is a decorator's wrapper holding modules in its closure.

transformers 5.25 requires the ``kernels`` package, and with it installed
``use_kernelized_func`` wraps the forward of Llama-family attention in a function that iterates
its decorator's arguments: function-modules, ``nn.Module`` instances, reached only through the
wrapper's closure. The forward was traced without a source, so those modules had none, and
every decoder layer broke (20 graphs, 14 breaks for a 2-layer Llama on CI). The forward is now
sourced as ``m.forward.__func__``, and what its closure holds is guarded through it."""
from __future__ import annotations

import contextvars
import functools

import torch
import torch.nn as nn

import kiln

_ACTIVE = contextvars.ContextVar("active", default=None)


class _Scale(nn.Module):
    """A function turned into a module (as ``kernels`` makes of a decorated function)."""
    name = "scale"
    factor = 2.0

    def forward(self, x):
        return x * 2


def kernelized(*fns):
    def decorator(cls):
        orig_init, orig_forward = cls.__init__, cls.forward

        def new_init(self, *args, **kwargs):
            orig_init(self, *args, **kwargs)
            funcs = self.__dict__.setdefault("_funcs", {})
            for fn in fns:
                funcs[fn.name] = type(fn)()

        @functools.wraps(orig_forward)
        def new_forward(self, *args, **kwargs):
            active = dict(_ACTIVE.get() or {})
            for fn in fns:
                active[id(fn)] = self._funcs[fn.name]
            return orig_forward(self, *args, **kwargs) * fns[0].factor

        cls.__init__, cls.forward = new_init, new_forward
        return cls
    return decorator


SCALE = _Scale()


@kernelized(SCALE)
class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x):
        return SCALE(self.lin(x)).relu()


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList(Block() for _ in range(3))

    def forward(self, x):
        for b in self.blocks:
            x = b(x) + x
        return x


def test_wrapped_forwards_are_one_graph_and_match_eager():
    torch.manual_seed(0)
    net = Net()
    x = torch.randn(4, 8)
    out = kiln.explain(net)(x)
    assert (out.graph_count, out.graph_break_count) == (1, 0), [str(b) for b in out.break_reasons]
    compiled = kiln.compile(net)
    for _ in range(2):
        x = torch.randn(4, 8)
        torch.testing.assert_close(compiled(x), net(x))


def test_a_changed_closure_module_is_seen():
    """What the wrapper reads from its closure's module is guarded through the cell: a new
    module there, with another factor, recompiles instead of reusing the first entry."""
    torch.manual_seed(0)
    net = Net()
    compiled = kiln.compile(net)
    x = torch.randn(4, 8)
    before = net(x)
    torch.testing.assert_close(compiled(x), before)

    class _Other(_Scale):
        factor = 0.5
    cell = Block.forward.__closure__[Block.forward.__code__.co_freevars.index("fns")]
    old = cell.cell_contents
    cell.cell_contents = (_Other(),)
    try:
        want = net(x)
        assert not torch.allclose(want, before)
        torch.testing.assert_close(compiled(x), want)
    finally:
        cell.cell_contents = old
