"""The guard reads a class-checked module through its instance dict (tables, plain attributes,
``len`` of a container), folds a tuple of constants into one check and drops a module
attribute check the module's own checks imply (kiln/capture/fast_sources.py). Each of these
must still fail when the property it stands for changes: every test changes one thing after
the first call and expects a recompile with eager's answer."""
import re

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import kiln
from kiln import api


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(4)
        self.layers = nn.ModuleList([nn.Linear(4, 4), nn.Linear(4, 4)])
        self.k = (2, 3)

    def forward(self, x):
        y = self.bn(self.conv(x)).mean((2, 3))
        for layer in self.layers:
            y = layer(y)
        return y * self.k[0] + torch.full((1,), self.k[1])


def _guard_source(code):
    (cache,) = [c for c in api.caches_of(code) if c.entries]
    return cache.entries[-1].capture.guard_source


def _same_as_eager(f, net, x, recompiles):
    with torch.no_grad():
        got, want = f(x), net(x)
    assert got.dtype == want.dtype
    torch.testing.assert_close(got, want)
    assert kiln.stats()["recompiles"] == recompiles


@pytest.fixture
def compiled():
    net = Net().eval()
    f = kiln.compile(net)
    x = torch.randn(2, 3, 5, 5)
    _same_as_eager(f, net, x, 0)
    return net, f, x


def test_the_guard_reads_dicts_folds_tuples_and_drops_implied_checks(compiled):
    src = _guard_source(Net.forward.__code__)
    assert "._modules" not in src and "._parameters" not in src and "._buffers" not in src, src
    assert re.search(r"d\d+ = v\d+\.__dict__\n", src) and re.search(r"= d\d+\['_modules'\]\n", src), src
    assert re.search(r"= d\d+\['stride'\]\n", src), src         # the conv's own attribute
    assert re.search(r"len\(d\d+\['_modules'\]\) == 2", src), src  # the ModuleList's len
    assert re.search(r"(v\d+) == \(1, 1\) and type\(\1\[0\]\) is int and type\(\1\[1\]\) is int", src), src
    assert not re.search(r"v\d+ = v\d+\[0\]", src), src            # no item temporaries left
    # the BatchNorm reads self.training: the module's own d['training'] check covers it
    assert not re.search(r"(v\d+) = d\d+\['training'\]\n +if not \(\1 is False\)", src), src
    # the printed guards keep every check
    guards = api.caches_of(Net.forward.__code__)[0].entries[-1].capture.guards
    assert any(g.endswith("bn.training is False") for g in guards) and any(g.endswith(".k[0] == 2") for g in guards)


def test_a_parameter_replaced_reshaped_or_retyped_recompiles(compiled):
    net, f, x = compiled
    last = net.layers[1]
    last.weight.data = torch.randn(5, 4)          # another shape through .data
    last.bias.data = torch.randn(5)
    _same_as_eager(f, net, x, 1)
    # another object of the same shape in _parameters / _buffers: the same entry, and the
    # fetch (which reads the same dicts) hands the new one to the graph
    last.weight = nn.Parameter(torch.randn(5, 4))
    _same_as_eager(f, net, x, 1)
    net.bn.running_var = torch.rand(4) + 0.5
    _same_as_eager(f, net, x, 1)


def test_a_parameters_dtype_and_requires_grad_are_still_checked():
    class Cast(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(4, 3)

        def forward(self, x):
            return F.linear(x.to(self.lin.weight.dtype), self.lin.weight) + 1

    net = Cast()
    f = kiln.compile(net)
    x = torch.randn(2, 4)
    with torch.no_grad():
        torch.testing.assert_close(f(x), net(x))
        net.lin.weight.data = net.lin.weight.data.double()   # the input is still float32
        got = f(x)
        assert got.dtype == torch.float64
        torch.testing.assert_close(got, net(x))
    out = f(x)
    assert out.requires_grad
    net.lin.weight.requires_grad_(False)
    out = f(x)
    assert not out.requires_grad and not net(x).requires_grad
    assert kiln.stats()["recompiles"] == 3


@pytest.mark.parametrize("kind", ["forward", "forward_pre", "global_forward", "full_backward"])
def test_a_hook_added_to_a_module_recompiles(compiled, kind):
    net, f, x = compiled
    calls = []
    if kind == "forward":
        handle = net.bn.register_forward_hook(lambda m, i, o: calls.append(1) or o * 3)
    elif kind == "forward_pre":
        handle = net.layers[0].register_forward_pre_hook(lambda m, i: calls.append(1) or (i[0] * 2,))
    elif kind == "global_forward":
        handle = nn.modules.module.register_module_forward_hook(lambda m, i, o: calls.append(1) or o)
    else:
        handle = net.layers[1].register_full_backward_hook(lambda m, gi, go: calls.append(1))
    try:
        if kind == "full_backward":
            handle.remove()
            xg = x.clone().requires_grad_(True)
            f(xg).sum().backward()           # an input needing grad: an entry of its own
            assert kiln.stats()["recompiles"] == 1
            handle = net.layers[1].register_full_backward_hook(lambda m, gi, go: calls.append(1))
            f(xg).sum().backward()
            assert calls and kiln.stats()["recompiles"] > 1
        else:
            _same_as_eager(f, net, x, 1)
            assert calls
    finally:
        handle.remove()


def test_a_submodules_training_flag_alone_recompiles(compiled):
    net, f, x = compiled
    net.bn.train()   # only the BatchNorm: it normalizes by the batch's own statistics now
    _same_as_eager(f, net, x, 1)
    net.bn.eval()
    _same_as_eager(f, net, x, 1)  # the first entry again


@pytest.mark.parametrize("value", [(True, 3), (2.0, 3), (2, 3.0), (2, 3, 4), [2, 3], (5, 3)])
def test_a_constant_tuple_with_another_item_type_length_or_value_recompiles(compiled, value):
    net, f, x = compiled
    net.k = value
    _same_as_eager(f, net, x, 1)


def test_a_module_list_that_grew_recompiles(compiled):
    net, f, x = compiled
    net.layers.append(nn.Linear(4, 4))
    _same_as_eager(f, net, x, 1)
    del net.layers[2]
    del net.layers[1]
    _same_as_eager(f, net, x, 2)


class Scaled(nn.Module):
    scale = 2.0  # a class attribute the instance shadows: read the plain way

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.scale = 3.0
        self.shift = 1.0

    def forward(self, x):
        return self.lin(x) * self.scale + self.shift


class ShiftProperty(Scaled):
    @property
    def shift(self):
        return -5.0


def test_a_class_attribute_shadowed_by_the_instance_keeps_the_plain_read():
    net = Scaled()
    f = kiln.compile(net)
    x = torch.randn(3, 4)
    _same_as_eager(f, net, x, 0)
    src = _guard_source(Scaled.forward.__code__)
    assert re.search(r"= v\d+\.scale\n", src) and re.search(r"= d\d+\['shift'\]\n", src), src
    del net.scale            # the class's 2.0 now
    assert net.scale == 2.0
    _same_as_eager(f, net, x, 1)


def test_a_class_whose_property_names_an_instance_attribute_fails_the_class_check():
    net = Scaled()
    f = kiln.compile(lambda m, x: m(x))  # the module is an argument: any class may come
    x = torch.randn(3, 4)
    with torch.no_grad():
        torch.testing.assert_close(f(net, x), net(x))
        net.__class__ = ShiftProperty   # 'shift' is still in the instance dict, shadowed now
        assert net.shift == -5.0 and net.__dict__["shift"] == 1.0
        torch.testing.assert_close(f(net, x), net(x))
    assert kiln.stats()["recompiles"] == 1


def test_a_module_with_its_own_getattribute_keeps_plain_reads():
    class Logged(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(4, 4)
            self.shift = 1.0

        def __getattribute__(self, name):
            return super().__getattribute__(name)

        def forward(self, x):
            return self.lin(x) + self.shift

    net = Logged()
    f = kiln.compile(net)
    x = torch.randn(3, 4)
    _same_as_eager(f, net, x, 0)
    src = _guard_source(Logged.forward.__code__)
    assert "v0.__dict__" not in src and "['shift']" not in src, src
    net.shift = 2.0
    _same_as_eager(f, net, x, 1)


def test_a_folded_tuple_keeps_exact_item_checks():
    from kiln.capture.fast_sources import _folded_tuples
    from kiln.capture.guards import GuardSet, ItemSource, LocalSource
    g = GuardSet()
    t = LocalSource("t")
    g.add(t, "type({}) is tuple and len({}) == 4")
    for i, v in enumerate((2, "a", None, 0.5)):
        g.constant(ItemSource(t, i), v)
    folded = _folded_tuples(g.entries)
    check = folded[(t.expr(), "type({}) is tuple and len({}) == 4")]
    assert check == ("type({}) is tuple and {} == (2, 'a', None, 0.5) and type({}[0]) is int and "
                     "type({}[1]) is str and {}[2] is None and type({}[3]) is float")
    assert sum(1 for c in folded.values() if c == "") == 4
    ok = eval(f"lambda t: {check.replace('{}', 't')}")  # noqa: S307
    assert ok((2, "a", None, 0.5)) and not ok((2.0, "a", None, 0.5)) and not ok((True, "a", None, 0.5))
    assert not ok((2, "a", None, 0.5, 1)) and not ok([2, "a", None, 0.5])
    # a signed zero or NaN item (its check reads the printed form): the tuple is not folded
    g2 = GuardSet()
    g2.add(t, "type({}) is tuple and len({}) == 2")
    g2.constant(ItemSource(t, 0), -0.0)
    g2.constant(ItemSource(t, 1), 1)
    assert _folded_tuples(g2.entries) == {}


class Tied(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(4, 4)
        self.b = self.a   # one module under two names: the second is guarded ``is`` the first
        self.c = nn.Linear(4, 4)

    def forward(self, x):
        y = self.b(self.a(x))
        return y * 2 if self.c is self.a else y - self.c(x)   # ``is not``, guarded too


def test_an_is_check_reads_the_other_object_from_its_temporary_and_still_fails():
    net = Tied()
    f = kiln.compile(net)
    x = torch.randn(3, 4)
    _same_as_eager(f, net, x, 0)
    src = _guard_source(Tied.forward.__code__)
    assert re.search(r"v\d+ is v\d+\b", src) and re.search(r"v\d+ is not v\d+\b", src), src
    assert " is L[" not in src and " is not L[" not in src, src
    net.b = nn.Linear(4, 4)   # untied: the ``is`` fails
    _same_as_eager(f, net, x, 1)
    net.b = net.a
    net.c = net.a             # now the same object: the ``is not`` fails
    _same_as_eager(f, net, x, 2)


class Tagged(nn.Module):
    def __init__(self, tag):
        super().__init__()
        self.tag = tag
        self.lin = nn.Linear(3, 3)

    def forward(self, x):
        return self.lin(x) * 2 if self.tag == "w{}" else self.lin(x) - 1


@pytest.mark.parametrize("tag", ["w{}", 'q"{}"\'{d}', "{}"])
def test_a_string_constant_holding_braces_is_guarded_as_written(tag):
    """A guarded str whose repr holds ``{}`` or ``{d}``: the guard's placeholders were filled
    inside the literal too, so the check compared with another string and the frame recompiled
    on every call until the limit."""
    net = Tagged(tag)
    f = kiln.compile(net)
    x = torch.randn(2, 3)
    for _ in range(4):
        _same_as_eager(f, net, x, 0)
    net.tag = "other"                  # the check still fails when the string changes
    _same_as_eager(f, net, x, 1)


def test_fill_leaves_string_literals_alone():
    from kiln.capture.guards import fill
    assert fill("type({}) is str and {} == 'a{}b'", "v1") == "type(v1) is str and v1 == 'a{}b'"
    assert fill('{} == "x\\"{}"', "v") == 'v == "x\\"{}"'
    assert fill("{d}['k'] == '{d}'", "d3", "{d}") == "d3['k'] == '{d}'"
