"""A method's function reached through instances of one class is guarded once, off the class.

Library code wraps ``forward`` in decorators whose closures the trace reads (transformers'
``deprecate_kwarg``, ``kernels``' ``use_kernelized_func``). Twelve identical blocks walked those
closures twelve times in every call's guard. The guard now reads ``Block.forward`` through the
class (which it compares each block's type with) and checks its closure once; changing the
class's forward, a block's own forward or the decorator's state still fails the guard.
"""
import functools

import torch
from torch import nn

import kiln


def tagged(mode):
    """A decorator whose wrapper reads its closure (``mode``) on every call."""
    def deco(fn):
        @functools.wraps(fn)
        def wrapper(self, x):
            return fn(self, x) * 2 if mode["double"] else fn(self, x)
        return wrapper
    return deco


MODE = {"double": True}


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)

    @tagged(MODE)
    def forward(self, x):
        return torch.relu(self.lin(x))


class Stack(nn.Module):
    def __init__(self, n):
        super().__init__()
        self.blocks = nn.ModuleList(Block() for _ in range(n))

    def forward(self, x):
        for b in self.blocks:
            x = b(x) * 0.5
        return x


def _guard_source(compiled, n):
    # Stack instances share Stack.forward's cache: the entry for n blocks checks len == n
    (src,) = [e.capture.guard_source for e in compiled._compiled_forward.cache.entries
              if f"== {n})" in e.capture.guard_source]
    return src


def test_identical_blocks_check_the_decorator_closure_once():
    torch.manual_seed(0)
    sources = {}
    for n in (2, 6):
        m = Stack(n)
        c = kiln.compile(m)
        x = torch.randn(3, 8)
        torch.testing.assert_close(c(x), m(x))
        sources[n] = _guard_source(c, n)
    # the forward's closure is read once, whatever the number of blocks
    assert sources[6].count("__closure__") == sources[2].count("__closure__") == 1
    assert sources[6].count(".cell_contents") == sources[2].count(".cell_contents")
    assert "__func__" not in sources[6]


def test_the_class_forward_replaced_fails_the_guard():
    torch.manual_seed(0)
    m = Stack(3)
    c = kiln.compile(m)
    x = torch.randn(3, 8)
    torch.testing.assert_close(c(x), m(x))
    old = Block.forward
    try:
        Block.forward = lambda self, x: self.lin(x) - 1.0
        torch.testing.assert_close(c(x), m(x))
    finally:
        Block.forward = old
    torch.testing.assert_close(c(x), m(x))


def test_the_decorator_state_and_an_instance_forward_fail_the_guard():
    torch.manual_seed(0)
    m = Stack(3)
    c = kiln.compile(m)
    x = torch.randn(3, 8)
    torch.testing.assert_close(c(x), m(x))
    MODE["double"] = False
    try:
        torch.testing.assert_close(c(x), m(x))
    finally:
        MODE["double"] = True
    blk = m.blocks[2]
    blk.forward = lambda x: blk.lin(x) + 3.0  # one instance's own forward
    expected = m(x)
    torch.testing.assert_close(c(x), expected)
