"""dict's own methods on a real object that is a dict and a user class at once, reached from
the inputs: transformers' ``ModelOutput`` (a dataclass over ``OrderedDict``) returned by a call
that ran before a graph break, then handed to the resumed frame, whose code calls
``out.keys()``, ``out.values()``, ``out.to_tuple()`` (which reads ``self.keys()``) or iterates it.

Such an object is an ``ObjectVariable`` (values_python.py): its attributes are read from the
real object through their sources. Its dict side is read the same way: the keys are guarded
(``list(dict.keys(obj)) == [...]``) and each item is wrapped through ``obj[key]``. A trace that
wrote one of the object's attributes first would read stale items, so that is a graph break.
"""
from __future__ import annotations

import collections

from kiln.capture.errors import Unsupported
from kiln.capture.guards import ItemSource
from kiln.capture.values import ConstantVariable, TupleVariable, Variable

_DICT_TYPES = (dict, collections.OrderedDict)


def is_dict_method(found) -> bool:
    """``found`` (a class attribute) is dict's or OrderedDict's own C method."""
    return getattr(found, "__objclass__", None) in _DICT_TYPES


def real_dict_object(var) -> bool:
    """An ``ObjectVariable`` over a real dict instance reached through a source."""
    return isinstance(var.value, dict) and var.source is not None and not var.local


def contents(tx, var) -> tuple[list, list]:
    """(keys, item Variables) of the real object, its keys guarded."""
    obj = var.value
    keys = list(dict.keys(obj))
    if not all(type(k) in (str, int) for k in keys):
        raise Unsupported(f"a {var.cls.__name__} with non-str/int keys is not supported")
    tx.guards.add(var.source, f"list(dict.keys({{}})) == {keys!r}")
    return keys, [tx.wrap(dict.__getitem__(obj, k), ItemSource(var.source, k)) for k in keys]


class DictMethod(Variable):
    """``obj.keys`` (and friends) of a real dict object, called: read-only methods only."""

    READ_ONLY = ("keys", "values", "items", "get", "__len__", "__iter__", "__contains__")

    def __init__(self, var, name):
        self.var, self.name = var, name

    def call(self, tx, args, kwargs):
        keys, items = contents(tx, self.var)
        name = self.name
        if kwargs or (name in ("keys", "values", "items", "__len__", "__iter__") and args):
            raise Unsupported(f"{self.var.cls.__name__}.{name} with these arguments is not supported")
        if name in ("keys", "__iter__"):
            return TupleVariable([ConstantVariable(k) for k in keys])
        if name == "values":
            return TupleVariable(items)
        if name == "items":
            return TupleVariable([TupleVariable([ConstantVariable(k), v]) for k, v in zip(keys, items)])
        if name == "__len__":
            return ConstantVariable(len(keys))
        key = args[0].as_python() if args else None
        if name == "__contains__" and len(args) == 1:
            return ConstantVariable(key in keys)
        if name == "get" and 1 <= len(args) <= 2:
            return items[keys.index(key)] if key in keys else (
                args[1] if len(args) == 2 else ConstantVariable(None))
        raise Unsupported(f"{self.var.cls.__name__}.{name} with these arguments is not supported")


def dict_method(tx, var, name, found):
    """The Variable for ``obj.name`` when it is one of dict's read-only methods on a real dict
    object; None otherwise (the caller's usual rules apply, a write is a graph break there).
    The break for an object whose attributes the trace wrote comes here, at the attribute
    load, so that the stack at the break holds the object, not a bound method of it."""
    if not (real_dict_object(var) and is_dict_method(found) and name in DictMethod.READ_ONLY):
        return None
    if tx.side_effects.attr_writes.get(id(var.value)) is not None:
        raise Unsupported(f"reading the items of a {var.cls.__name__} whose attributes this trace "
                          "wrote is not supported")
    return DictMethod(var, name)
