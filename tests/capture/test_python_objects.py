"""Python objects real model code reaches (transformers' registries, configs, interfaces):
dict subclasses, collections.abc sequences and mappings, classes that compute attributes,
ContextVars, Python context managers, bound methods passed as arguments. Each function must
capture without a break, match eager, and not recompile on a second call with fresh inputs."""
import collections.abc
import contextvars

import pytest
import torch

import kiln
from tests.capture.resume_helpers import BACKENDS, _clone, run_both

CASES = []


def case(args=lambda: (torch.randn(3, 4),)):
    def deco(fn):
        CASES.append(pytest.param(fn, args, id=fn.__name__))
        return fn
    return deco


class Registry(dict):
    """transformers' _CanRecordRegistry: keys are class names, ``get`` takes the model."""

    def __setitem__(self, obj, value):
        super().__setitem__(type(obj).__name__, value)

    def get(self, obj):
        return super().get(type(obj).__name__) or {}


class Model:
    pass


REGISTRY = Registry()
REGISTRY[Model()] = {"scale": 2.0}
MODEL = Model()


class Layers(collections.abc.Sequence):
    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if i < 0 or i >= len(self):
            raise IndexError(i)
        return i + 1


class Interface(collections.abc.MutableMapping):
    """transformers' GeneralInterface: a class-wide mapping plus a local one."""
    _global = {"double": 2.0, "triple": 3.0}

    def __init__(self):
        self._local = {}

    def __getitem__(self, key):
        if key in self._local:
            return self._local[key]
        return self._global[key]

    def __setitem__(self, key, value):
        self._local[key] = value

    def __delitem__(self, key):
        del self._local[key]

    def __iter__(self):
        return iter({**self._global, **self._local})

    def __len__(self):
        return len(self._global.keys() | self._local.keys())


INTERFACE = Interface()


class Config:
    """Attribute aliases through __getattribute__ (transformers' attribute_map)."""
    attribute_map = {"hidden": "n_embd"}

    def __init__(self):
        self.n_embd = 4
        self.eps = 0.5

    def __getattribute__(self, key):
        if key != "attribute_map" and key in super().__getattribute__("attribute_map"):
            key = super().__getattribute__("attribute_map")[key]
        return super().__getattribute__(key)


class Lazy:
    def __getattr__(self, name):
        return len(name)


CONFIG, LAZY = Config(), Lazy()
SCALE = contextvars.ContextVar("scale")
SCALE.set(1.5)


class Counter:
    def __init__(self, log):
        self.log = log

    def __enter__(self):
        self.log.append("in")
        return 2.0

    def __exit__(self, *exc):
        self.log.append("out")
        return False


class Scaler:
    def __init__(self, k):
        self.k = k

    def apply(self, t):
        return t * self.k


SCALER = Scaler(3.0)


@case()
def dict_subclass_get_through_super(x):
    flags = REGISTRY.get(MODEL)
    return x * flags["scale"] + len(flags)


WRITTEN = Registry()


@case()
def dict_subclass_setitem_is_inlined(x):
    WRITTEN[MODEL] = x.shape[0]  # the override's write is replayed after the graph
    return x + len(WRITTEN) + ("Model" in WRITTEN) + WRITTEN["Model"]


@case()
def sequence_iteration_and_len(x):
    total = x
    for k in Layers(3):
        total = total + k
    return total * len(Layers(2))


@case()
def mapping_get_contains_and_getitem(x):
    a = INTERFACE.get("double", 0.0)
    b = INTERFACE.get("missing", 5.0)
    c = INTERFACE["triple"] if "triple" in INTERFACE else 0.0
    return x * a + b - c + ("nope" in INTERFACE)


@case()
def attribute_aliases_and_getattr(x):
    return x * CONFIG.hidden + CONFIG.eps + LAZY.abc


@case()
def context_variable_get(x):
    return x * SCALE.get()


@case()
def functions_compared_with_is(x):
    same = type(SCALER).apply is Scaler.apply
    other = type(SCALER).apply is Layers.__len__
    return x + int(same) - int(other)


@case(args=lambda: (torch.randn(3, 4), ["start"]))
def python_context_manager(x, log):
    cm = Counter(log)
    with cm as k:
        y = x * k
    return y + len(cm.log)


@case(args=lambda: (torch.randn(3, 4), SCALER.apply))
def bound_method_argument(x, fn):
    return fn(x) + 1


@case()
def structseq_result_fields(x):
    r = torch.max(x, 1)
    values, indices = x.min(0)
    return r.values * 2, r.indices, values + indices, type(r).__name__


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("fn,args", CASES)
def test_python_object(fn, args, backend, capsys):
    compiled = kiln.compile(fn, backend=backend)
    run_both(fn, compiled, args(), capsys)
    run_both(fn, compiled, args(), capsys)
    stats = kiln.stats()
    assert stats["graph_breaks"] == 0 and stats["recompiles"] == 0 and stats["fallbacks"] == 0, stats
    explained = kiln.explain(fn, backend="eager")(*_clone(args()))
    assert (explained.graph_count, explained.graph_break_count) == (1, 0), explained


def test_context_variable_value_is_guarded():
    compiled = kiln.compile(context_variable_get, backend="eager")
    x = torch.randn(3)
    torch.testing.assert_close(compiled(x), x * 1.5)
    token = SCALE.set(4.0)
    try:
        torch.testing.assert_close(compiled(x), x * 4.0)  # a new value recompiles
    finally:
        SCALE.reset(token)
    assert kiln.stats()["recompiles"] == 1


def test_registry_change_recompiles():
    compiled = kiln.compile(dict_subclass_get_through_super, backend="eager")
    x = torch.randn(3)
    torch.testing.assert_close(compiled(x), x * 2.0 + 1)
    REGISTRY["k"] = {}  # the override stores it under "str"
    try:
        torch.testing.assert_close(compiled(x), x * 2.0 + 1)
        assert kiln.stats()["recompiles"] == 1  # its keys are guarded
    finally:
        dict.pop(REGISTRY, "str")


def test_case_count():
    assert len(CASES) >= 10


def test_dict_subclass_write_is_replayed():
    compiled = kiln.compile(dict_subclass_setitem_is_inlined, backend="eager")
    for n in (3, 5):
        dict.clear(WRITTEN)
        x = torch.randn(n, 2)
        torch.testing.assert_close(compiled(x), x + 1 + 1 + n)
        assert dict(WRITTEN) == {"Model": n} and type(WRITTEN) is Registry
