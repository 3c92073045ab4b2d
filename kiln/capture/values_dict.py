"""Value trackers for mappings real model code reaches beyond plain dicts (values_python.py
has the other Python objects):

- ``DictSubclassVariable``: an instance of a dict subclass written in Python whose implicit
  reads are dict's (transformers' ``_CanRecordRegistry``): items tracked as a dict's, the
  subclass's own methods inlined, ``super().get``/``__setitem__`` reaching dict's behaviour.
- ``ContextVarVariable``: a ``contextvars.ContextVar``; ``get()`` is read for real and guarded.
"""
from __future__ import annotations

import collections
import dataclasses
import types

from kiln.capture.dict_keys import dict_key, load_key, refuse_tensor_keys
from kiln.capture.errors import Unsupported
from kiln.capture.guards import ItemSource, Source
from kiln.capture.values import ConstantVariable, DictVariable, Variable
from kiln.capture.values_callables import FunctionVariable
from kiln.capture.values_python import _static_lookup, attribute_of_class
from kiln.capture.builtins import call_builtin
from kiln.capture.resume import Instr, _call


# ====================================================================== context variables
class MethodCallSource(Source):
    """``<parent>.<method>()``: a value a call returns, read again by the guards on each call."""
    __slots__ = ("parent", "method")

    def __init__(self, parent, method):
        self.parent, self.method = parent, method

    def expr(self, base=None):
        return f"{base or self.parent.expr()}.{self.method}()"


class ContextVarVariable(Variable):
    """A ``contextvars.ContextVar`` reached from the inputs or globals (guarded by identity):
    ``.get()`` reads the current value for real and guards it (through ``var.get()``);
    ``set``/``reset`` are graph breaks."""

    def __init__(self, var, source):
        self.var, self.source = var, source

    def python_type(self):
        return type(self.var)

    def getattr(self, tx, name):
        if name == "get":
            return _ContextVarGet(self)
        if name == "name":
            return ConstantVariable(self.var.name)
        raise Unsupported(f"ContextVar.{name} is not supported")

    def get(self, tx):
        if self.source is None:
            raise Unsupported("ContextVar.get() on a context variable without a source")
        try:
            value = self.var.get()
        except LookupError:
            raise Unsupported(f"ContextVar {self.var.name!r} has no value") from None
        return tx.wrap(value, MethodCallSource(self.source, "get"))


class _ContextVarGet(Variable):
    def __init__(self, cv):
        self.cv = cv

    def call(self, tx, args, kwargs):
        # with a default: only when the variable has a value (the guard reads it with .get())
        return self.cv.get(tx)


# ====================================================================== dict subclasses
# What capture reads of a dict implicitly (subscripts, `in`, iteration, len, the guards): a
# subclass that overrides none of them keeps dict's reads, so its items are tracked as a dict's.
_DICT_READS = ("__getitem__", "__iter__", "__len__", "__contains__", "keys", "items", "values",
               "__eq__", "__missing__")


def is_python_dict_subclass(cls) -> bool:
    """A dict subclass defined in Python (heap types only between it and dict) whose implicit
    reads are dict's; its own methods are inlined, dict's behave as a dict's."""
    if not isinstance(cls, type) or cls is dict or not issubclass(cls, dict) or type(cls) is not type:
        return False
    if dataclasses.is_dataclass(cls):
        return False  # transformers' ModelOutput and friends: DictDataclassVariable
    heap = 1 << 9  # Py_TPFLAGS_HEAPTYPE: a class made by a class statement
    if any(k not in (dict, object) and not k.__flags__ & heap for k in cls.__mro__):
        return False
    return all(_static_lookup(cls, name)[1] in (dict, object, None) for name in _DICT_READS)


class DictSubclassVariable(DictVariable):
    """An instance of a Python dict subclass (``is_python_dict_subclass``): items as a dict's,
    methods the subclass defines inlined (``super().get`` reaches dict's), instance attributes
    read from the real object (guarded)."""

    def __init__(self, cls, items, source=None, value=None):
        super().__init__(items, source)
        self.cls = cls
        self.value = value

    def python_type(self):
        return self.cls

    def as_python(self):
        if self.value is None:
            raise Unsupported(f"a {self.cls.__name__} made during the trace as a constant")
        return self.value

    def getattr(self, tx, name):
        if self.value is not None and name in getattr(self.value, "__dict__", {}):
            return tx.wrap(self.value.__dict__[name], tx.attr_source(self.source, name))
        found, owner = _static_lookup(self.cls, name)
        if owner not in (None, dict, object):
            return attribute_of_class(tx, self.cls, name, self, self.source)
        return super().getattr(tx, name)

    def python_override(self, name):
        """The subclass's own ``name`` (a dunder an opcode would call), bound; None if dict's."""
        found, owner = _static_lookup(self.cls, name)
        if owner in (None, dict, object):
            return None
        if not isinstance(found, types.FunctionType):
            raise Unsupported(f"{self.cls.__name__}.{name} is not a Python function")
        return FunctionVariable(found, self_var=self)

    def __repr__(self):
        return f"{self.cls.__name__}({self.items!r})"


def wrap_dict_subclass(tx, value, source, guard: bool):
    """``tx.wrap`` of a Python dict subclass instance: one tracker per object, its class and
    keys guarded, its items wrapped as a dict's."""
    seen = tx.side_effects.tracker_of(value)
    if seen is not None:
        if seen.source is not None and source is not None and seen.source != source:
            tx.guards.same_object(source, seen.source)
        return seen
    keys = list(dict.keys(value))
    if not all(isinstance(k, (str, int)) for k in keys):
        raise Unsupported(f"a {type(value).__name__} with non-str/int keys is not supported")
    if guard:
        tx.guards.add(source, f"id(type({{}})) == {id(type(value))} and list(dict.keys({{}})) == {keys!r}")
    items = {k: tx.wrap(dict.__getitem__(value, k), ItemSource(source, k) if source is not None else None,
                        guard) for k in keys}
    return tx.side_effects.remember(value, DictSubclassVariable(type(value), items, source, value))


class DictDunder(Variable):
    """``super().__setitem__`` (and friends) reaching dict from a subclass's method."""

    def __init__(self, obj, name):
        self.obj, self.name = obj, name

    def call(self, tx, args, kwargs):
        obj, name = self.obj, self.name
        if name == "__getitem__" and len(args) == 1:
            return DictVariable.getitem(obj, tx, args[0])
        if name == "__contains__" and len(args) == 1:
            return ConstantVariable(dict_key(tx, args[0], obj.items) in obj.items)
        if name == "__len__" and not args:
            return ConstantVariable(len(obj.items))
        if name in ("__setitem__", "__delitem__") and len(args) == 2 - (name == "__delitem__"):
            tx.side_effects.mutate(obj)
            key = dict_key(tx, args[0], obj.items)
            if name == "__setitem__":
                obj.items[key] = args[1]
            elif obj.items.pop(key, None) is None:
                raise Unsupported(f"del of missing key {key!r}")
            return ConstantVariable(None)
        raise Unsupported(f"dict.{name} from a {type(obj).__name__} is not supported")


# ====================================================================== OrderedDict
class OrderedDictVariable(DictVariable):
    """A ``collections.OrderedDict``: a dict's items (insertion-ordered like every dict), its
    type kept when it is returned or rebuilt at a break; ``move_to_end`` and ``popitem`` are
    not modeled (a break)."""

    def python_type(self):
        return collections.OrderedDict

    def as_python(self):
        refuse_tensor_keys(self.items, "a Python value of")
        return collections.OrderedDict((k, v.as_python()) for k, v in self.items.items())

    def call_method(self, tx, name, args, kwargs):
        if name == "copy" and not args:
            return OrderedDictVariable(self.items)
        return super().call_method(tx, name, args, kwargs)

    def reconstruct(self, builder):
        builder.emit(Instr("PUSH_NULL"), Instr("LOAD_CONST", collections.OrderedDict))
        for k, x in self.items.items():
            load_key(builder, k)
            builder.load(x)
        builder.emit(Instr("BUILD_MAP", len(self.items)), *_call(1))
        builder._memo(self)


def make_ordered_dict(tx, args, kwargs):
    """``OrderedDict(...)`` in the trace: what ``dict(...)`` would hold, as an OrderedDict."""
    return OrderedDictVariable(call_builtin(tx, dict, args, kwargs).items)


__all__ = ["OrderedDictVariable", "make_ordered_dict", "is_python_dict_subclass", "DictSubclassVariable", "wrap_dict_subclass", "DictDunder",
           "ContextVarVariable", "MethodCallSource"]
