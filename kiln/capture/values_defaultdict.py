"""``collections.defaultdict`` at trace time: a dict tracker that remembers its factory.

A defaultdict from the inputs, or one made in the traced code, is a ``DefaultDictVariable``:
a ``DictVariable`` (so subscripts, ``in``, iteration, ``len``, the dict methods, item writes
and the side-effect replay are a dict's) plus ``factory``, the tracker of its
``default_factory``. A subscript that misses calls the factory in the trace (``list``,
``int``, ``lambda: torch.zeros(3)``, a user class, each as a call of that value would be
traced) and stores the result, as ``defaultdict.__missing__`` does; ``get``, ``in`` and
``setdefault`` never call it, as in Python.

An input defaultdict is guarded by its type and keys (``dict_keys_check``), its items as a
dict's, and its factory through ``<source>.default_factory`` (by identity; a function made at
run time by its code, as every such function is). A write to it is replayed on the caller's
object with dict's own methods (``side_effects.replay``), which leave the factory alone. One
made in the trace comes back, returned or rebuilt at a graph break, as a real defaultdict with
the same factory.
"""
from __future__ import annotations

import collections

from kiln.capture.builtins import call_builtin
from kiln.capture.dict_keys import dict_key, key_spec, load_key, wrap_key
from kiln.capture.errors import Unsupported
from kiln.capture.guards import AttrSource, ItemSource
from kiln.capture.values import ConstantVariable, DictVariable, TensorVariable, _Sequence
from kiln.capture.values_callables import BuiltinVariable, FunctionVariable


class DefaultDictVariable(DictVariable):
    """A ``collections.defaultdict``: a dict's items and the tracker of its factory
    (``ConstantVariable(None)`` for none, where a missing key is a ``KeyError``)."""

    def __init__(self, items: dict, factory, source=None):
        super().__init__(items, source)
        self.factory = factory

    def python_type(self):
        return collections.defaultdict

    def as_python(self):
        items = super().as_python()  # refuses tensor keys
        return collections.defaultdict(self.factory.as_python(), items)

    def getitem(self, tx, key):
        """``d[key]``: the item, or ``__missing__``'s: the factory called and its result stored."""
        k = dict_key(tx, key, self.items)
        if k in self.items:
            return self.items[k]
        return self.missing(tx, k)

    def missing(self, tx, key):
        if self.has_no_factory():
            raise Unsupported(f"key {key!r} is not in the defaultdict, which has no default_factory "
                              "(a KeyError)")
        value = self.factory.call(tx, [], {})
        tx.side_effects.mutate(self)  # replayed when the defaultdict came from the inputs
        self.items[key] = value
        return value

    def has_no_factory(self) -> bool:
        return isinstance(self.factory, ConstantVariable) and self.factory.value is None

    def getattr(self, tx, name):
        if name == "default_factory":
            return self.factory
        return super().getattr(tx, name)

    def call_method(self, tx, name, args, kwargs):
        if name == "copy" and not args and not kwargs:
            return DefaultDictVariable(self.items, self.factory)
        return super().call_method(tx, name, args, kwargs)

    def reconstruct(self, builder):
        """At a graph break: the input object itself, or ``defaultdict(factory, {items})``."""
        if self.source is not None:
            builder.load_source(self.source)
            return
        from kiln.capture.resume import Instr, _call
        builder.emit(Instr("PUSH_NULL"), Instr("LOAD_CONST", collections.defaultdict))
        builder.load(self.factory)
        for k, x in self.items.items():
            load_key(builder, k)
            builder.load(x)
        builder.emit(Instr("BUILD_MAP", len(self.items)), *_call(2))
        builder._memo(self)

    def __repr__(self):
        return f"defaultdict({self.factory!r}, {self.items!r})"


def wrap_defaultdict(tx, value, source, guard: bool):
    """``tx.wrap`` of a real defaultdict: one tracker per object; type, keys and factory
    guarded; items wrapped as a dict's."""
    from kiln.capture.values_stdlib import dict_keys_check
    seen = tx.side_effects.tracker_of(value)
    if seen is not None:
        if seen.source is not None and source is not None and seen.source != source:
            tx.guards.same_object(source, seen.source)
        return seen
    if guard:
        tx.guards.add(source, dict_keys_check(value, tx.guards))  # id(type(d)) and the keys
    factory_source = AttrSource(source, "default_factory") if source is not None else None
    factory = tx.wrap(value.default_factory, factory_source, guard)
    items = {wrap_key(tx, k, source, i, guard): tx.wrap(v, _item_source(source, i, k), guard)
             for i, (k, v) in enumerate(value.items())}
    return tx.side_effects.remember(value, DefaultDictVariable(items, factory, source))


def _item_source(source, i, key):
    from kiln.capture.values_stdlib import dict_item_source
    from kiln.capture.values_dict import DictGetSource
    item = dict_item_source(source, i, key)  # ItemSource by a spelled key, else by position
    return DictGetSource(source, key) if isinstance(item, ItemSource) else item


def make_defaultdict(tx, args, kwargs):
    """``collections.defaultdict(factory=None, *dict_args, **kwargs)`` in the trace."""
    factory = args[0] if args else ConstantVariable(None)
    if isinstance(factory, ConstantVariable) and factory.value is not None and not callable(factory.value) \
            or isinstance(factory, (TensorVariable, DictVariable, _Sequence)):
        raise Unsupported(f"defaultdict's first argument {factory} must be callable or None")
    return DefaultDictVariable(call_builtin(tx, dict, list(args[1:]), kwargs).items, factory)


# ---------------------------------------------------------------- leaving the trace
def defaultdict_spec(v, proxies, spec_of):
    """The output spec of a returned defaultdict: its factory's spec, key specs, value specs."""
    return ("defaultdict", factory_spec(v.factory, proxies, spec_of), [key_spec(k) for k in v.items],
            [spec_of(x, proxies) for x in v.items.values()])


def factory_spec(factory, proxies, spec_of):
    """A factory reached as a constant (a builtin, a class, None, a function reached through a
    trusted path) is itself; one made in the trace or read from a source is built as any such
    value is."""
    if factory.source is None and isinstance(factory, (ConstantVariable, BuiltinVariable)):
        return ("const", factory.as_python())
    if factory.source is None and isinstance(factory, FunctionVariable) and factory.fn is not None \
            and factory.self_var is None:
        return ("const", factory.fn)
    return spec_of(factory, proxies)


def build_defaultdict(spec, build):
    return collections.defaultdict(build(spec[1]), zip([build(k) for k in spec[2]],
                                                      [build(x) for x in spec[3]]))


__all__ = ["DefaultDictVariable", "wrap_defaultdict", "make_defaultdict", "defaultdict_spec",
           "factory_spec", "build_defaultdict"]
