"""Python builtins during capture: a table from builtin to handler.

Builtins that know about tracked values (``len``, ``isinstance``, ``abs`` on a tensor, ``tuple``
of a list of tensors...) have a handler here; any builtin in ``PURE_BUILTINS`` is evaluated
directly when all its arguments are Python constants. Everything else (``print``, ``open``,
``id``...) is unsupported.
"""
from __future__ import annotations

import builtins
import math

from kiln.capture import torch_api
from kiln.capture.errors import Unsupported
from kiln.capture.values import (ConstantVariable, DictVariable, IteratorVariable, ListVariable,
                                 ModuleVariable, TensorVariable, TupleVariable, _Sequence)

PURE_BUILTINS = {abs, min, max, sum, round, pow, divmod, int, float, bool, str, len, all, any,
                 sorted, repr, hash, chr, ord, math.sqrt, math.ceil, math.floor, math.prod,
                 math.log, math.exp, math.isclose, math.gcd}

BUILTIN_HANDLERS = {}


def handles(*fns):
    def deco(handler):
        for fn in fns:
            BUILTIN_HANDLERS[fn] = handler
        return handler
    return deco


def is_builtin(value) -> bool:
    try:
        return value in BUILTIN_HANDLERS or value in PURE_BUILTINS or value is builtins.print
    except TypeError:
        return False


def call_builtin(tx, fn, args, kwargs):
    handler = BUILTIN_HANDLERS.get(fn)
    if handler is not None:
        result = handler(tx, *args, **kwargs)
        if result is not NotImplemented:
            return result
    if fn in PURE_BUILTINS:
        try:
            py_args = [a.as_python() for a in args]
            py_kwargs = {k: v.as_python() for k, v in kwargs.items()}
        except Unsupported:
            raise Unsupported(f"call to {fn.__name__} on non-constant arguments is not supported") from None
        try:
            return tx.wrap_constant(fn(*py_args, **py_kwargs))
        except Exception as e:
            raise Unsupported(f"{fn.__name__}(...) raised {e!r}") from None
    raise Unsupported(f"call to {getattr(fn, '__name__', fn)} is not supported")


@handles(len)
def _len(tx, obj):
    if isinstance(obj, TensorVariable):
        if obj.proxy.ndim == 0:
            raise Unsupported("len() of a 0-d tensor")
        return ConstantVariable(obj.proxy.shape[0])
    if isinstance(obj, (_Sequence, DictVariable)):
        return ConstantVariable(len(obj.items))
    if isinstance(obj, ModuleVariable):
        return ConstantVariable(len(obj.iterate(tx)))
    return NotImplemented


@handles(isinstance)
def _isinstance(tx, obj, classinfo):
    return ConstantVariable(isinstance_of(obj.python_type(), classinfo.as_python()))


def isinstance_of(ty, classinfo) -> bool:
    if isinstance(classinfo, tuple):
        return any(isinstance_of(ty, c) for c in classinfo)
    return issubclass(ty, classinfo)


@handles(range)
def _range(tx, *args):
    return ConstantVariable(range(*[a.as_python() for a in args]))


def _make_sequence(cls):
    def handler(tx, iterable=None):
        items = [] if iterable is None else iterable.iterate(tx)
        return cls(items)
    return handler


BUILTIN_HANDLERS[tuple] = _make_sequence(TupleVariable)
BUILTIN_HANDLERS[list] = _make_sequence(ListVariable)


@handles(enumerate)
def _enumerate(tx, iterable, start=None):
    first = 0 if start is None else start.as_python()
    return IteratorVariable([TupleVariable([ConstantVariable(first + i), v])
                             for i, v in enumerate(iterable.iterate(tx))])


@handles(zip)
def _zip(tx, *iterables, **kwargs):
    if kwargs:
        return NotImplemented
    return IteratorVariable([TupleVariable(list(group))
                             for group in zip(*(it.iterate(tx) for it in iterables))])


@handles(abs)
def _abs(tx, x):
    if isinstance(x, TensorVariable):
        return tx.call_adapter(torch_api.UNARY_OPERATORS["abs"], [x], {}, "abs")
    return NotImplemented


@handles(getattr)
def _getattr(tx, obj, name, default=None):
    try:
        return obj.getattr(tx, name.as_python())
    except Unsupported:
        if default is None:
            raise
        return default


@handles(builtins.print)
def _print(tx, *args, **kwargs):
    raise Unsupported("call to print is not supported")


@handles(bool)
def _bool(tx, x=None):
    if x is None:
        return ConstantVariable(False)
    return ConstantVariable(x.truth(tx))
