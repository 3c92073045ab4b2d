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

from kiln.capture.dict_keys import dict_key, key_spec, load_key, refuse_tensor_keys
from kiln.capture.errors import Unsupported
from kiln.capture.guards import ItemSource, Source
from kiln.capture.values import ConstantVariable, DictVariable, Variable
from kiln.capture.values_callables import FunctionVariable
from kiln.capture.values_python import _static_lookup, attribute_of_class
from kiln.capture.builtins import call_builtin
from kiln.capture.resume import Instr, _call
from kiln.capture.side_effects import _accessor


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
# subclass keeps dict's (or OrderedDict's) reads for these, so its items are tracked as a dict's.
_DICT_READS = ("__iter__", "__len__", "keys", "items", "values", "__eq__")
# Reads an opcode makes that a subclass may override in Python: the override is inlined where
# the opcode runs (``__getitem__`` at a subscript, ``__contains__`` at ``in``; dict's
# ``__getitem__`` calls ``__missing__`` for a missing key). transformers' ``ClassInstantier``
# (``ACT2FN``, an OrderedDict) instantiates the class it holds in ``__getitem__``.
_INLINED_READS = ("__getitem__", "__contains__", "__missing__")
_DICT_BASES = (dict, collections.OrderedDict, object, None)


def is_python_dict_subclass(cls) -> bool:
    """A dict or OrderedDict subclass defined in Python (heap types only between it and its
    base) whose implicit reads are its base's, or Python overrides capture inlines."""
    if not isinstance(cls, type) or cls in (dict, collections.OrderedDict) or not issubclass(cls, dict) \
            or type(cls) is not type:
        return False
    if dataclasses.is_dataclass(cls):
        return False  # transformers' ModelOutput and friends: DictDataclassVariable
    heap = 1 << 9  # Py_TPFLAGS_HEAPTYPE: a class made by a class statement
    if any(k not in _DICT_BASES and not k.__flags__ & heap for k in cls.__mro__):
        return False
    if not all(_static_lookup(cls, name)[1] in _DICT_BASES for name in _DICT_READS):
        return False
    return all(_static_lookup(cls, name)[1] in _DICT_BASES
               or isinstance(_static_lookup(cls, name)[0], types.FunctionType) for name in _INLINED_READS)


class DictItemSource(Source):
    """``dict.__getitem__(<parent>, key)``: an item of a dict subclass read past its Python
    ``__getitem__`` (which the guards must not run: ACT2FN's builds a module)."""
    __slots__ = ("parent", "key")

    def __init__(self, parent, key):
        self.parent, self.key = parent, key

    def expr(self, base=None):
        return f"dict.__getitem__({base or self.parent.expr()}, {self.key!r})"


class DictGetSource(Source):
    """``dict.get(<parent>, key)``: an item of a defaultdict, or of a dict subclass with a
    ``__missing__``, as the guards read it. ``d[key]``, and ``dict.__getitem__(d, key)`` too,
    run ``__missing__`` for a key the call's object does not hold (its keys are guarded apart),
    which may insert the key into the caller's object while the guards run."""
    __slots__ = ("parent", "key")

    def __init__(self, parent, key):
        self.parent, self.key = parent, key

    def expr(self, base=None):
        return f"dict.get({base or self.parent.expr()}, {self.key!r})"


class _Unread:
    """An item of a dict subclass from the inputs that the trace has not read: wrapped, and
    guarded, when it is (a registry such as ACT2FN holds two dozen classes; a call reads one)."""
    __slots__ = ("value", "source", "guard")

    def __init__(self, value, source, guard):
        self.value, self.source, self.guard = value, source, guard


class DictSubclassVariable(DictVariable):
    """An instance of a Python dict subclass (``is_python_dict_subclass``): items as a dict's,
    methods the subclass defines inlined (``super().get`` reaches dict's), instance attributes
    read from the real object (guarded). Items from the inputs are wrapped when first read:
    one by a subscript, ``in`` or ``get``; all by anything that reads ``items``."""

    def __init__(self, cls, items, source=None, value=None, tx=None):
        self._tx = tx  # wraps the unread items (one trace: the tracker lives no longer)
        super().__init__(items, source)
        self.cls = cls
        self.value = value

    @property
    def items(self):
        if self._unread:
            for k, v in self._items.items():
                if type(v) is _Unread:
                    self._items[k] = self._tx.wrap(v.value, v.source, v.guard)
            self._unread = False
        return self._items

    @items.setter
    def items(self, items):
        self._items = items
        self._unread = any(type(v) is _Unread for v in items.values())

    def item(self, key):
        """The item at ``key`` (present), wrapped now if it was not read yet."""
        v = self._items[key]
        if type(v) is _Unread:
            v = self._items[key] = self._tx.wrap(v.value, v.source, v.guard)
        return v

    def keys(self):
        """The keys (guarded at the wrap), without reading any item."""
        return self._items.keys()

    def iterate(self, tx):
        return [ConstantVariable(k) for k in self._items]

    def truth(self, tx):
        return bool(self._items)

    def call_method(self, tx, name, args, kwargs):
        if name == "get" and 1 <= len(args) <= 2 and not kwargs:  # dict.get: no __getitem__
            key = args[0].as_python()
            if key in self._items:
                return self.item(key)
            return args[1] if len(args) == 2 else ConstantVariable(None)
        return super().call_method(tx, name, args, kwargs)

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
        if owner not in _DICT_BASES:
            return attribute_of_class(tx, self.cls, name, self, self.source)
        return super().getattr(tx, name)

    def getitem(self, tx, key):
        """``obj[key]``: the subclass's ``__getitem__`` inlined, else dict's."""
        override = self.python_override("__getitem__")
        if override is not None:
            return override.call(tx, [key], {})
        return self.dict_getitem(tx, key)

    def dict_getitem(self, tx, key):
        """dict's ``__getitem__``: the item, or the subclass's ``__missing__`` (inlined) for a
        key the guarded keys do not hold."""
        k = key.as_python()
        if k in self._items:
            return self.item(k)
        missing = self.python_override("__missing__")
        if missing is not None:
            return missing.call(tx, [key], {})
        raise Unsupported(f"key {k!r} is not in the {self.cls.__name__}")

    def contains(self, tx, item) -> bool:
        """``item in obj``: the subclass's ``__contains__`` inlined, else dict's."""
        override = self.python_override("__contains__")
        if override is None:
            return item.as_python() in self._items
        out = override.call(tx, [item], {})
        if not isinstance(out, ConstantVariable):
            raise Unsupported(f"{self.cls.__name__}.__contains__ returned {out}")
        return bool(out.value)

    def merged_items(self) -> dict:
        """The items ``{**obj}`` / ``dict.update(obj)`` read. CPython copies a dict's entries
        directly unless the class iterates on its own (OrderedDict does); then it calls
        ``keys()`` and ``obj[key]``, which for an overridden ``__getitem__`` is a break."""
        if self.cls.__iter__ is not dict.__iter__ and self.python_override("__getitem__"):
            raise Unsupported(f"merging a {self.cls.__name__} (its keys() and __getitem__) is not supported")
        return self.items

    def python_override(self, name):
        """The subclass's own ``name`` (a dunder an opcode would call), bound; None if dict's."""
        found, owner = _static_lookup(self.cls, name)
        if owner in _DICT_BASES:
            return None
        if not isinstance(found, types.FunctionType):
            raise Unsupported(f"{self.cls.__name__}.{name} is not a Python function")
        return FunctionVariable(found, self_var=self)

    def reconstruct(self, builder):
        """At a graph break: the input object itself, or one made in the trace built again
        (``cls({items})``, its base's ``__init__``: ``make_dict_subclass``)."""
        if self.source is not None:
            builder.load_source(self.source)
            return
        if self.value is not None:
            raise Unsupported(f"a {self.cls.__name__} reached without a source at a graph break")
        builder.emit(Instr("PUSH_NULL"), Instr("LOAD_CONST", self.cls))
        for k, x in self.items.items():
            load_key(builder, k)
            builder.load(x)
        builder.emit(Instr("BUILD_MAP", len(self.items)), *_call(1))
        builder._memo(self)

    def __repr__(self):
        return f"{self.cls.__name__}({self.items!r})"


def can_make_dict_subclass(cls) -> bool:
    """``cls(...)`` of a Python dict subclass can be made in the trace: its construction and
    item writes are its base's (dict's or OrderedDict's), its reads as ``is_python_dict_subclass``."""
    return is_python_dict_subclass(cls) and all(
        _static_lookup(cls, name)[1] in _DICT_BASES for name in ("__new__", "__init__", "__setitem__"))


def make_dict_subclass(tx, cls, args, kwargs):
    """``cls(...)`` in the trace (``can_make_dict_subclass``): what ``dict(...)`` would hold,
    as a tracker of that class with no real object behind it."""
    return DictSubclassVariable(cls, call_builtin(tx, dict, args, kwargs).items, tx=tx)


def dict_subclass_spec(v, proxies, spec_of):
    """The output spec of a returned dict subclass: the caller's own object where it came from
    the inputs (its writes are replayed on it), else ``cls(pairs)`` built after each call."""
    if v.source is not None:
        return ("source", _accessor(v.source))
    if v.value is not None:
        raise Unsupported(f"returning a {v.cls.__name__} reached without a source")
    return ("dict_subclass", v.cls, [key_spec(k) for k in v.items], [spec_of(x, proxies) for x in v.items.values()])


def build_dict_subclass(spec, build):
    return spec[1](zip([build(k) for k in spec[2]], [build(x) for x in spec[3]]))


def wrap_dict_subclass(tx, value, source, guard: bool):
    """``tx.wrap`` of a Python dict subclass instance: one tracker per object, its class and
    keys guarded (in its own iteration order: an OrderedDict's may differ from dict's), its
    items wrapped as a dict's, read past a Python ``__getitem__``."""
    seen = tx.side_effects.tracker_of(value)
    if seen is not None:
        if seen.source is not None and source is not None and seen.source != source:
            tx.guards.same_object(source, seen.source)
        return seen
    ordered = isinstance(value, collections.OrderedDict)
    keys = list(collections.OrderedDict.keys(value)) if ordered else list(dict.keys(value))
    if not all(isinstance(k, (str, int)) for k in keys):
        raise Unsupported(f"a {type(value).__name__} with non-str/int keys is not supported")
    if guard:
        read = "list({})" if ordered else "list(dict.keys({}))"
        tx.guards.add(source, f"id(type({{}})) == {id(type(value))} and {read} == {keys!r}")
    item_source = ItemSource if _static_lookup(type(value), "__getitem__")[1] in _DICT_BASES else DictItemSource
    if _static_lookup(type(value), "__missing__")[1] not in _DICT_BASES:
        item_source = DictGetSource  # the guards must not run it
    items = {k: _Unread(dict.__getitem__(value, k), item_source(source, k) if source is not None else None,
                        guard) for k in keys}
    return tx.side_effects.remember(value, DictSubclassVariable(type(value), items, source, value, tx))


class DictDunder(Variable):
    """``super().__setitem__`` (and friends) reaching dict from a subclass's method."""

    def __init__(self, obj, name):
        self.obj, self.name = obj, name

    def call(self, tx, args, kwargs):
        obj, name = self.obj, self.name
        if name == "__getitem__" and len(args) == 1:
            if isinstance(obj, DictSubclassVariable):
                return obj.dict_getitem(tx, args[0])  # a missing key: the subclass's __missing__
            return DictVariable.getitem(obj, tx, args[0])
        keys = obj.keys() if isinstance(obj, DictSubclassVariable) else obj.items  # no item read
        if name == "__contains__" and len(args) == 1:
            return ConstantVariable(dict_key(tx, args[0], obj.items) in keys)
        if name == "__len__" and not args:
            return ConstantVariable(len(keys))
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


__all__ = ["OrderedDictVariable", "make_ordered_dict", "is_python_dict_subclass", "DictSubclassVariable", "wrap_dict_subclass",
           "can_make_dict_subclass", "make_dict_subclass", "dict_subclass_spec", "build_dict_subclass", "DictDunder", "DictItemSource", "DictGetSource",
           "ContextVarVariable", "MethodCallSource"]
