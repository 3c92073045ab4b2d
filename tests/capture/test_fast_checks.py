"""The guard's faster checks (kiln/capture/fast_sources.py ``fast_checks``): a class compared
by identity with the class bound in the guard, a module's own attributes read from its instance
dict once its class is checked, a contiguous tensor's strides checked with ``is_contiguous()``.
Every change the plain checks catch must still fail the guard: a recompile with eager's answer."""
import re

import torch
import torch.nn.functional as F

import kiln
from kiln import api


class Block(torch.nn.Module):
    def __init__(self, n=6):
        super().__init__()
        self.fc = torch.nn.Linear(n, n)
        self.drop = torch.nn.Dropout(0.5)

    def forward(self, x):
        return self.drop(torch.tanh(self.fc(x))) + x


class SubBlock(Block):
    def forward(self, x):
        return super().forward(x) * 2


class TrainingProperty(torch.nn.Module):
    """``training`` is a class attribute (a property): read the plain way, never from the dict."""

    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(6, 6)
        self.flag = False

    @property
    def training(self):
        return self.flag

    @training.setter
    def training(self, value):
        self.flag = value

    def forward(self, x):
        return F.dropout(self.fc(x), 0.5, self.training)


def _check_dropped(got, dropped, kept):
    """Dropout in train mode (kiln's random stream is its own): each element is the dropped
    value or the scaled kept one, and both occur."""
    torch.manual_seed(0)
    is_kept = ~torch.isclose(got, dropped)
    assert is_kept.any() and not is_kept.all()
    torch.testing.assert_close(got[is_kept], kept[is_kept])


def _guard_source(fn_code):
    (cache,) = [c for c in api.caches_of(fn_code) if c.entries]
    return cache.entries[-1].capture.guard_source


def test_the_guard_uses_the_faster_checks():
    net = Block().eval()
    f = kiln.compile(net)
    x = torch.randn(4, 6)
    with torch.no_grad():
        torch.testing.assert_close(f(x), net(x))
    src = _guard_source(Block.forward.__code__)
    assert "id(type(" not in src and re.search(r"type\(v\d+\) is _t\d+", src), src
    assert re.search(r"d\d+ = v\d+\.__dict__", src), src
    assert "['training'] is False" in src and "['_forward_hooks']" in src and re.search(r"'forward' not in d\d", src), src
    # the (6, 6) weight and (4, 6) input are contiguous with no size-1 dim: is_contiguous()
    assert ".stride() ==" not in src and src.count(".is_contiguous()") == 3, src
    # the printed guards keep the readable spelling
    guards = api.caches_of(Block.forward.__code__)[0].entries[-1].capture.guards
    assert any(".training is False" in g for g in guards) and any(".stride() == (6, 1)" in g for g in guards)


def test_every_change_the_plain_checks_catch_still_recompiles():
    torch.manual_seed(0)
    net = Block().eval()
    f = kiln.compile(net)
    x = torch.randn(4, 6)
    with torch.no_grad():
        f(x)
        net.train()                                   # training flag, read from the dict
        _check_dropped(f(x), x, 2 * torch.tanh(net.fc(x)) + x)
        net.eval()
        torch.testing.assert_close(f(x), net(x))
        # a weight of the same shape, transposed strides: is_contiguous() fails
        w = net.fc.weight.data
        net.fc.weight.data = w.t().contiguous().t()
        assert net.fc.weight.stride() == (1, 6)
        torch.testing.assert_close(f(x), net(x))
        # a non-contiguous input of the same shape
        xt = torch.randn(6, 4).t()
        torch.testing.assert_close(f(xt), net(xt))
        # a forward hook on a submodule
        calls = []
        handle = net.fc.register_forward_hook(lambda m, i, o: calls.append(1) or o * 3)
        torch.testing.assert_close(f(x), net(x))
        assert calls
        handle.remove()
        # an instance-level forward
        net.fc.forward = lambda inp: inp * 0 + 1
        torch.testing.assert_close(f(x), net(x))
        del net.fc.forward
        torch.testing.assert_close(f(x), net(x))
    assert kiln.stats()["fallbacks"] == 0


def test_a_module_whose_class_changes_fails_the_class_check():
    net = Block().eval()
    f = kiln.compile(lambda m, x: m(x))  # the module is an argument: its class is guarded
    x = torch.randn(4, 6)
    with torch.no_grad():
        torch.testing.assert_close(f(net, x), net(x))
        net.__class__ = SubBlock
        torch.testing.assert_close(f(net, x), net(x))
    assert kiln.stats()["recompiles"] == 1


def test_a_size_one_dim_keeps_the_stride_comparison():
    f = kiln.compile(lambda x: x * 2)
    x = torch.randn(1, 6)
    torch.testing.assert_close(f(x), x * 2)
    (cache,) = [c for c in api._CODE_CACHES.values() if c.entries]
    src = cache.entries[-1].capture.guard_source
    assert ".stride() == (6, 1)" in src and "is_contiguous" not in src, src


def test_a_class_attribute_named_like_a_module_attribute_is_read_the_plain_way():
    m = TrainingProperty()
    f = kiln.compile(m)
    x = torch.randn(3, 6)
    with torch.no_grad():
        torch.testing.assert_close(f(x), m(x))
        src = _guard_source(TrainingProperty.forward.__code__)
        # the property's module reads it the plain way (the Linear inside reads its dict)
        assert re.search(r"type\((v\d+)\) is _t\d+ and \1\.training is False", src), src
        assert "d0['fc']" not in src  # fc is a submodule table entry, not a dict attribute
        m.flag = True                 # the property flips: the guard sees it
        _check_dropped(f(x), torch.zeros_like(x), 2 * m.fc(x))
