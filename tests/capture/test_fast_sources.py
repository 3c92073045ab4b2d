"""Guards and fetches read module tables directly (kiln/capture/fast_sources.py): the same
answers and the same recompiles as the plain attribute spelling, faster."""
import re

import torch

import kiln
from kiln import api
from kiln.capture.fast_sources import fast_map
from kiln.capture.guards import AttrSource, ItemSource, LocalSource


class Block(torch.nn.Module):
    def __init__(self, n):
        super().__init__()
        self.fc = torch.nn.Linear(n, n)
        self.register_buffer("scale", torch.full((n,), 0.5))

    def forward(self, x):
        return torch.tanh(self.fc(x)) * self.scale


class Net(torch.nn.Module):
    def __init__(self, n=6, depth=3):
        super().__init__()
        self.blocks = torch.nn.ModuleList([Block(n) for _ in range(depth)])
        self.heads = torch.nn.ModuleDict({"out": torch.nn.Linear(n, 2)})

    def forward(self, x):
        for b in self.blocks:
            x = x + b(x)
        return self.heads["out"](x)


def _sources(compiled):
    (cache,) = [c for c in api._CODE_CACHES.values() if c.entries]
    entry = cache.entries[-1]
    return entry.capture.guard_source, entry.capture.fetch_source


def _reads(code):
    """Each temporary of a generated guard or fetch, spelled out: ``v3 = v2['blocks']`` with
    ``v2 = d1['_modules']`` and ``d1 = v0.__dict__`` reads ``L['self'].__dict__['_modules']['blocks']``."""
    full = {}
    for line in code.splitlines():
        m = re.fullmatch(r"\s*([vd]\d+) = (.*)", line)
        if m:
            full[m.group(1)] = re.sub(r"\b[vd]\d+\b", lambda t: full.get(t.group(0), t.group(0)), m.group(2))
    return set(full.values())


def test_module_tables_are_read_directly_and_answers_match():
    net = Net()
    f = kiln.compile(net)
    x = torch.randn(4, 6)
    with torch.no_grad():
        torch.testing.assert_close(f(x), net(x))
        guard, fetch = _sources(f)
    # every module here is guarded by class: its tables are read from its instance dict
    blocks = "L['self'].__dict__['_modules']['blocks']"
    for code in (guard, fetch):
        reads = _reads(code)
        for read in (blocks, f"{blocks}.__dict__['_modules']['1']",
                     f"{blocks}.__dict__['_modules']['1'].__dict__['_modules']['fc'].__dict__['_parameters']['weight']",
                     f"{blocks}.__dict__['_modules']['1'].__dict__['_buffers']['scale']",
                     "L['self'].__dict__['_modules']['heads'].__dict__['_modules']['out']"):
            assert read in reads, (read, code)
        assert ".blocks" not in code and ".fc" not in code and "[1]" not in code, code
    # readable spellings stay what the guards print
    assert any("L['self'].blocks[1].fc.weight" in g for g in api.caches_of(Net.forward.__code__)[0].entries[-1].capture.guards)


def test_replaced_submodule_parameter_and_buffer_recompile_with_correct_answers():
    net = Net()
    f = kiln.compile(net)
    x = torch.randn(4, 6)
    with torch.no_grad():
        f(x)
        net.blocks[1] = Block(6)                                       # a new submodule
        torch.testing.assert_close(f(x), net(x))
        net.blocks[0].fc.weight = torch.nn.Parameter(torch.randn(6, 6))  # a new parameter
        torch.testing.assert_close(f(x), net(x))
        net.blocks[2].scale = torch.full((6,), 3.0)                      # a new buffer
        torch.testing.assert_close(f(x), net(x))
        net.blocks[2].fc.bias.add_(1.0)                                  # same object, new values
        torch.testing.assert_close(f(x), net(x))
        net.blocks.append(Block(6))                                      # one more layer
        torch.testing.assert_close(f(x), net(x))
        net.heads["out"] = torch.nn.Linear(6, 2)
        torch.testing.assert_close(f(x), net(x))
    # modules are guarded by structure, parameters and buffers are re-read per call: new objects
    # of the same shapes reuse the entry; only the added layer (a new structure) recompiles
    assert kiln.stats()["recompiles"] == 1


class Shadowed(torch.nn.Module):
    """A class attribute named like a submodule entry is read the plain way."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(3, 3)

    @property
    def double(self):
        return 2.0

    def forward(self, x):
        return self.lin(x) * self.double


def test_fast_map_rewrites_only_table_reads():
    m = Shadowed()
    L = {"self": m}
    lin, weight = AttrSource(LocalSource("self"), "lin"), None
    weight = AttrSource(lin, "weight")
    double = AttrSource(LocalSource("self"), "double")
    training = AttrSource(lin, "training")
    out = fast_map([weight, double, training], L, {})
    assert out[weight.expr()].expr() == "L['self']._modules['lin']._parameters['weight']"
    assert double.expr() not in out                                    # a property: plain
    assert out[training.expr()].expr() == "L['self']._modules['lin'].training"  # instance dict
    lst = torch.nn.ModuleList([torch.nn.ReLU(), torch.nn.Tanh()])
    out = fast_map([ItemSource(LocalSource("l"), 1), ItemSource(LocalSource("l"), -1)], {"l": lst}, {})
    assert out["L['l'][1]"].expr() == "L['l']._modules['1']" and "L['l'][-1]" not in out
    f = kiln.compile(m)
    x = torch.randn(2, 3)
    with torch.no_grad():
        torch.testing.assert_close(f(x), m(x))


def test_fast_map_walks_a_deep_chain_once(monkeypatch):
    """A chain of sources with no faster form (a forward's closure, then attributes of plain
    objects) is walked once per source: each source was walked again from each child, 2^depth
    evaluations, and a sourced forward's closure chain hung ViT's training trace."""
    from kiln.capture import fast_sources
    from kiln.capture.guards import AttrSource, LocalSource

    class Node:
        pass
    root = Node()
    obj, src = root, LocalSource("x")
    depth = 16
    for _ in range(depth):
        obj.a = Node()
        obj, src = obj.a, AttrSource(src, "a")
    calls = []
    real = fast_sources._evaluator

    def counting(L, G):
        evaluate = real(L, G)

        def wrapped(text):
            calls.append(text)
            return evaluate(text)
        return wrapped
    monkeypatch.setattr(fast_sources, "_evaluator", counting)
    assert fast_sources.fast_map([src], {"x": root}, {}) == {}
    assert len(calls) <= 2 * depth, len(calls)
