"""Dict and OrderedDict subclasses whose reads run Python: a ``__getitem__`` override inlined at
the subscript (transformers' ``ACT2FN``, a ``ClassInstantier`` that builds the activation module
it holds), ``__missing__`` and ``__contains__`` inlined, ``super().__getitem__`` /
``dict.__getitem__`` reading the real mapping. Each must capture in one graph, match eager, and
recompile when the mapping changes."""
import collections

import pytest
import torch
from torch import nn

import kiln


class Instantier(collections.OrderedDict):
    """transformers' ClassInstantier, as written there."""

    def __getitem__(self, key):
        content = super().__getitem__(key)
        cls, kwargs = content if isinstance(content, tuple) else (content, {})
        return cls(**kwargs)


class Scaled(nn.Module):
    def __init__(self, scale=1.0):
        super().__init__()
        self.scale = scale

    def forward(self, x):
        return torch.tanh(x) * self.scale


ACTS = Instantier({"relu": nn.ReLU, "silu": nn.SiLU, "scaled": (Scaled, {"scale": 3.0}), "tanh": Scaled})


class Defaults(dict):
    """A dict whose reads go through dict.__getitem__ explicitly, with a __missing__."""

    def __getitem__(self, key):
        return dict.__getitem__(self, key) * 2

    def __missing__(self, key):
        return len(key)


DEFAULTS = Defaults(a=1.5, b=2.5)


class Aliases(dict):
    def __contains__(self, key):
        return dict.__contains__(self, key) or key.upper() in self.keys()


ALIASES = Aliases(X=1)


def activation(x, name):
    return ACTS[name](x) + 1


def explicit_dict_reads(x):
    # __getitem__ override, __missing__ through it, and dict.get, which skips the override
    return x * DEFAULTS["a"] + DEFAULTS["zzz"] + DEFAULTS.get("b")


def contains_override(x):
    return x + ("x" in ALIASES) + ("y" in ALIASES) * 10


def merge_plain_subclass(x):
    merged = {**DEFAULTS}  # a dict subclass's entries are copied as they are (no __getitem__)
    return x * merged["a"]


def one_graph(fn, *args):
    kiln.reset()
    out = kiln.explain(fn, backend="eager")(*args)
    assert (out.graph_count, out.graph_break_count) == (1, 0), out.break_reasons
    torch.testing.assert_close(out.result, fn(*args))


@pytest.mark.parametrize("name", ["relu", "silu", "scaled", "tanh"])
def test_instantier_builds_the_module_in_the_trace(name):
    one_graph(activation, torch.randn(3, 4), name)


@pytest.mark.parametrize("fn", [explicit_dict_reads, contains_override, merge_plain_subclass])
def test_python_reads_are_inlined(fn):
    one_graph(fn, torch.randn(3, 4))


def test_changed_entry_recompiles():
    kiln.reset()
    compiled = kiln.compile(activation, backend="eager")
    x = torch.randn(3, 4)
    torch.testing.assert_close(compiled(x, "scaled"), activation(x, "scaled"))
    old = dict.__getitem__(ACTS, "scaled")
    ACTS["scaled"] = (Scaled, {"scale": 5.0})
    try:
        torch.testing.assert_close(compiled(x, "scaled"), activation(x, "scaled"))
        assert kiln.stats()["recompiles"] == 1
    finally:
        ACTS["scaled"] = old


def test_guards_do_not_run_the_override():
    """The guards read items through dict.__getitem__: ACT2FN's __getitem__ builds a module.
    Only the item the trace read is guarded (besides the keys)."""
    kiln.reset()
    out = kiln.explain(activation, backend="eager")(torch.randn(2), "silu")
    text = "\n".join(out.guards)
    assert "dict.__getitem__(G['ACTS'], 'silu')" in text
    assert "G['ACTS']['" not in text
    assert "'relu')" not in text and "'scaled')" not in text


def test_moved_key_recompiles():
    """An OrderedDict subclass's keys are guarded in its own order (move_to_end changes it)."""
    kiln.reset()
    acts = Instantier(a=nn.ReLU, b=nn.Tanh)

    def first(x, acts):
        return x + len(list(acts)[0])
    compiled = kiln.compile(first, backend="eager")
    x = torch.randn(2)
    torch.testing.assert_close(compiled(x, acts), first(x, acts))
    acts = Instantier(c=nn.ReLU, bb=nn.Tanh)
    torch.testing.assert_close(compiled(x, acts), first(x, acts))
    acts.move_to_end("c")
    torch.testing.assert_close(compiled(x, acts), first(x, acts))
    assert kiln.stats()["recompiles"] == 2


@pytest.mark.filterwarnings("ignore:kiln:RuntimeWarning")
def test_merging_an_ordered_instantier_breaks():
    """``{**ACT2FN}`` calls its keys() and __getitem__ (OrderedDict iterates on its own): a
    break, and the result is eager's (modules built by the override)."""
    def merged(x):
        return x + len({**ACTS})
    kiln.reset()
    out = kiln.explain(merged, backend="eager")(torch.randn(2))
    assert out.graph_break_count == 1
    assert "merging a Instantier" in out.break_reasons[0].reason


class AutoInsert(dict):
    """A ``__missing__`` that inserts the key, as defaultdict's does."""

    def __missing__(self, key):
        self[key] = 0
        return 0


def get_k(x, d):
    return x * d.get("k", 1)


def test_guards_do_not_run_missing():
    """The guards read the items through ``dict.get``: ``d[k]`` and ``dict.__getitem__`` both
    run ``__missing__`` for a key a later call's object lacks, which inserted it there and
    made ``get`` see it."""
    kiln.reset()
    compiled = kiln.compile(get_k, backend="eager")
    x = torch.ones(2)
    torch.testing.assert_close(compiled(x, AutoInsert(k=2)), x * 2)
    d = AutoInsert()
    torch.testing.assert_close(compiled(x, d), get_k(x, AutoInsert()))
    assert dict(d) == {}
