"""``collections.deque`` at trace time: a list tracker with two open ends and a ``maxlen``.

A deque made in the traced code, or one from the inputs, is a ``DequeVariable``: a
``ListVariable`` (so ``len``, truth, iteration, ``in``, integer subscripts, item writes and the
side-effect bookkeeping are a list's) whose methods are deque's: ``append``/``appendleft``,
``extend``/``extendleft``, ``pop``/``popleft``, ``rotate``, ``insert``, ``remove``, ``index``,
``count``, ``reverse``, ``clear``, ``copy`` and the ``maxlen`` attribute. A bounded deque drops
from the far end as Python's does (``append`` on a full deque drops the leftmost item).

An input deque is guarded by its type, length and ``maxlen``, its items by ``d[i]``. A write to
it is replayed on the caller's object (``clear()`` then ``extend(items)``: a deque has no slice
assignment), and returning it returns the caller's own object. One made in the trace is
returned, or rebuilt at a graph break, as ``deque(items, maxlen)``.
"""
from __future__ import annotations

import collections

from kiln.capture.errors import EagerRaises, Unsupported
from kiln.capture.guards import ItemSource
from kiln.capture.values import ConstantVariable, ListVariable, MethodVariable

_METHODS = ("append", "appendleft", "extend", "extendleft", "pop", "popleft", "rotate", "insert",
            "remove", "index", "count", "reverse", "clear", "copy")
_READS = ("index", "count", "copy")


class DequeVariable(ListVariable):
    kind = collections.deque

    def __init__(self, items, maxlen=None, source=None):
        super().__init__(items, source)
        self.maxlen = maxlen
        if maxlen is not None and len(self.items) > maxlen:
            del self.items[:len(self.items) - maxlen]  # deque(iterable, n) keeps the last n

    def as_python(self):
        return collections.deque((v.as_python() for v in self.items), self.maxlen)

    def getattr(self, tx, name):
        if name == "maxlen":
            return ConstantVariable(self.maxlen)
        if name in _METHODS:
            return MethodVariable(self, name)
        raise Unsupported(f"attribute {name!r} of a deque is not supported")

    def getitem(self, tx, key):
        if isinstance(key.as_python(), slice):  # eager's TypeError: deques take integer indices
            raise EagerRaises("a deque indexed by a slice: eager raises (sequence index must be "
                              "integer, not 'slice')")
        return super().getitem(tx, key)

    def call_method(self, tx, name, args, kwargs):
        if kwargs:
            raise Unsupported(f"deque.{name} with keyword arguments")
        if name == "copy" and not args:
            return DequeVariable(self.items, self.maxlen)
        if name in _READS:
            return super().call_method(tx, name, args, kwargs)
        self.check_mutable(tx)  # an input deque's writes are replayed (side_effects.py)
        handler = getattr(self, "_" + name, None)
        if name not in _METHODS or handler is None:
            raise Unsupported(f"deque.{name} is not supported")
        try:
            out = handler(tx, *args)
        except TypeError:  # the wrong number of arguments: eager's TypeError
            raise Unsupported(f"deque.{name} with {len(args)} arguments is not supported") from None
        return ConstantVariable(None) if out is None else out

    # ---------------------------------------------------------------- deque's methods
    def _append(self, tx, value):
        self.items.append(value)
        if self.maxlen is not None and len(self.items) > self.maxlen:
            del self.items[0]

    def _appendleft(self, tx, value):
        self.items.insert(0, value)
        if self.maxlen is not None and len(self.items) > self.maxlen:
            del self.items[-1]

    def _extend(self, tx, iterable):
        for v in list(iterable.iterate(tx)):  # listed first: d.extend(d) reads d as it was
            self._append(tx, v)

    def _extendleft(self, tx, iterable):
        for v in list(iterable.iterate(tx)):
            self._appendleft(tx, v)

    def _pop(self, tx):
        if not self.items:
            raise EagerRaises("pop from an empty deque: eager raises IndexError")
        return self.items.pop()

    def _popleft(self, tx):
        if not self.items:
            raise EagerRaises("pop from an empty deque: eager raises IndexError")
        return self.items.pop(0)

    def _rotate(self, tx, n=None):
        steps = 1 if n is None else n.as_python()
        if self.items:
            steps %= len(self.items)
            self.items[:] = self.items[-steps:] + self.items[:-steps] if steps else self.items

    def _insert(self, tx, index, value):
        if self.maxlen is not None and len(self.items) >= self.maxlen:
            raise EagerRaises("insert into a full bounded deque: eager raises IndexError")
        self.items.insert(index.as_python(), value)

    def _remove(self, tx, value):
        keys = [v.as_python() for v in self.items]  # compared as Python values, as list.remove
        target = value.as_python()
        if target not in keys:
            raise EagerRaises("deque.remove(x) with x not in the deque: eager raises ValueError")
        del self.items[keys.index(target)]

    def _reverse(self, tx):
        self.items.reverse()

    def _clear(self, tx):
        self.items.clear()

    # ---------------------------------------------------------------- leaving the trace
    def reconstruct(self, builder):
        """At a graph break: the input object itself, or ``deque([items], maxlen)``."""
        if self.source is not None:
            builder.load_source(self.source)
            return
        from kiln.capture.resume import Instr, _call
        builder.emit(Instr("PUSH_NULL"), Instr("LOAD_CONST", collections.deque))
        for x in self.items:
            builder.load(x)
        builder.emit(Instr("BUILD_LIST", len(self.items)), Instr("LOAD_CONST", self.maxlen), *_call(2))
        builder._memo(self)

    def __repr__(self):
        return f"deque({self.items!r}, maxlen={self.maxlen})"


def make_deque(tx, iterable=None, maxlen=None):
    """``collections.deque(iterable=(), maxlen=None)`` in the trace."""
    items = [] if iterable is None else list(iterable.iterate(tx))
    n = None if maxlen is None else maxlen.as_python()
    if n is not None and (type(n) is not int or n < 0):
        raise Unsupported(f"deque maxlen {n!r} (eager raises)")
    return DequeVariable(items, n)


def wrap_deque(tx, value, source, guard: bool):
    """``tx.wrap`` of a real deque: one tracker per object; type, length and maxlen guarded,
    items wrapped through ``d[i]``."""
    seen = tx.side_effects.tracker_of(value)
    if seen is not None:
        if seen.source is not None and source is not None and seen.source != source:
            tx.guards.same_object(source, seen.source)
        return seen
    if guard:
        tx.guards.add(source, f"id(type({{}})) == {id(collections.deque)} and len({{}}) == {len(value)} "
                              f"and {{}}.maxlen == {value.maxlen!r}")
    items = [tx.wrap(v, ItemSource(source, i) if source is not None else None, guard)
             for i, v in enumerate(value)]
    return tx.side_effects.remember(value, DequeVariable(items, value.maxlen, source))


def deque_spec(v, proxies, spec_of):
    """The output spec of a returned deque: the caller's own object where it came from the
    inputs (its writes are replayed on it), else ``deque(items, maxlen)`` built per call."""
    if v.source is not None:
        from kiln.capture.side_effects import _accessor
        return ("source", _accessor(v.source))
    return ("call", collections.deque, {"iterable": spec_of(ListVariable(v.items), proxies),
                                        "maxlen": ("const", v.maxlen)})


__all__ = ["DequeVariable", "make_deque", "wrap_deque", "deque_spec"]
