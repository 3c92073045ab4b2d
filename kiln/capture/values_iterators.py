"""Lazy iterators at trace time: ``map``, ``itertools.islice``, ``itertools.count``, and ``zip``
/ ``zip_longest`` over them.

Most iterators capture meets are lists of tracked values known at once (``IteratorVariable``:
``zip`` of lists, ``enumerate``, ``range``...). These are not: ``map(f, xs)`` calls ``f`` only
when an item is asked for, ``islice`` takes from its source only as far as it must, ``count``
never ends. Each is a ``LazyIteratorVariable`` whose ``next()`` does what CPython's ``__next__``
does, in the trace: ``f`` is traced at the moment the item is consumed (``list(...)``,
``tuple(...)``, ``sum``, a ``for`` loop, ``next``), so calls with side effects run in eager's
order. A source is itself an iterator (``as_iterator``): a list's items are taken once, as
``iter(list)`` would, and another lazy iterator is pulled from, not listed.

At a graph break a live one is rebuilt as the real iterator over its rebuilt sources
(``map(f, iter(rest))``), which the resumed code then consumes.
"""
from __future__ import annotations

import itertools

from kiln.capture.errors import Unsupported
from kiln.capture.values import ConstantVariable, IteratorVariable, TupleVariable, Variable


class LazyIteratorVariable(Variable):
    """An iterator whose items are computed as they are taken (``next() -> Variable | None``)."""

    def next(self):
        raise NotImplementedError

    def iterate(self, tx):
        out = []
        while (item := self.next()) is not None:
            out.append(item)
        return out

    def truth(self, tx):
        return True

    def held_values(self) -> list:
        """The values this iterator holds (its sources, its function): what a graph break must
        keep alive to rebuild it."""
        return []

    def _load_call(self, builder, fn, values):
        """Emit ``fn(*values)`` into the break's glue, keeping the object for later loads."""
        from kiln.capture.resume import Instr, _call
        builder.emit(Instr("PUSH_NULL"), Instr("LOAD_CONST", fn))
        for v in values:
            builder.load(v)
        builder.emit(*_call(len(values)))
        builder._memo(self)


def as_iterator(tx, v):
    """``iter(v)`` for a tracked value: an iterator stays itself (pulled from, shared with its
    other holders), anything else is listed once."""
    if isinstance(v, (IteratorVariable, LazyIteratorVariable)):
        return v
    return IteratorVariable(v.iterate(tx))


def is_lazy(v) -> bool:
    return isinstance(v, LazyIteratorVariable)


class MapVariable(LazyIteratorVariable):
    """``map(fn, *iterables)``: ``fn`` traced per item when the item is taken."""

    def __init__(self, tx, fn, sources):
        self.tx, self.fn, self.sources = tx, fn, sources

    def python_type(self):
        return map

    def next(self):
        args = []
        for source in self.sources:  # CPython's order: each source in turn, stop at the first end
            item = source.next()
            if item is None:
                return None
            args.append(item)
        return self.fn.call(self.tx, args, {})

    def held_values(self):
        return [self.fn, *self.sources]

    def reconstruct(self, builder):
        self._load_call(builder, map, [self.fn, *self.sources])

    def __repr__(self):
        return f"map({self.fn})"


class CountVariable(LazyIteratorVariable):
    """``itertools.count(start, step)`` of Python numbers: never exhausted."""

    def __init__(self, start, step):
        self.value, self.step = start, step

    def python_type(self):
        return itertools.count

    def next(self):
        value = self.value
        self.value = value + self.step
        return ConstantVariable(value)

    def iterate(self, tx):
        raise Unsupported("itertools.count consumed to its end (it never ends)")

    def reconstruct(self, builder):
        from kiln.capture.resume import Instr, _call
        builder.emit(Instr("PUSH_NULL"), Instr("LOAD_CONST", itertools.count),
                     Instr("LOAD_CONST", self.value), Instr("LOAD_CONST", self.step), *_call(2))
        builder._memo(self)


class ISliceVariable(LazyIteratorVariable):
    """``itertools.islice(source, start, stop, step)``: CPython's ``islice_next`` step for step
    (``cnt`` items taken from the source so far, ``nxt`` the index of the next one to yield)."""

    def __init__(self, source, start, stop, step):
        self.source, self.stop, self.step = source, stop, step
        self.cnt, self.nxt = 0, start

    def python_type(self):
        return itertools.islice

    def next(self):
        while self.cnt < self.nxt:  # skipped items are still taken from the source
            if self.source.next() is None:
                return None
            self.cnt += 1
        if self.stop is not None and self.cnt >= self.stop:
            return None
        item = self.source.next()
        if item is None:
            return None
        self.cnt += 1
        self.nxt += self.step
        if self.stop is not None and self.nxt > self.stop:
            self.nxt = self.stop
        return item

    def held_values(self):
        return [self.source]

    def reconstruct(self, builder):
        stop = None if self.stop is None else ConstantVariable(self.stop - self.cnt)
        self._load_call(builder, itertools.islice, [self.source, ConstantVariable(self.nxt - self.cnt),
                                                    stop or ConstantVariable(None),
                                                    ConstantVariable(self.step)])


class ZipVariable(LazyIteratorVariable):
    """``zip(*sources)`` / ``itertools.zip_longest(*sources, fillvalue=...)`` where a source is
    lazy: items taken source by source, as CPython's ``zip_next`` does."""

    def __init__(self, sources, longest=False, fillvalue=None):
        self.sources, self.longest = sources, longest
        self.fillvalue = fillvalue if fillvalue is not None else ConstantVariable(None)
        self.active = [True] * len(sources)

    def python_type(self):
        return itertools.zip_longest if self.longest else zip

    def next(self):
        if not self.sources or not any(self.active):
            return None
        group = []
        for i, source in enumerate(self.sources):
            item = source.next() if self.active[i] else None
            if item is None:
                if not self.longest:
                    return None
                self.active[i] = False
                if not any(self.active):
                    return None
                item = self.fillvalue
            group.append(item)
        return TupleVariable(group)

    def held_values(self):
        return [*self.sources, self.fillvalue]

    def reconstruct(self, builder):
        if self.longest:
            sources = [s if a else IteratorVariable([]) for s, a in zip(self.sources, self.active)]
            self._load_call(builder, _zip_longest_of, [self.fillvalue, *sources])
        else:
            self._load_call(builder, zip, self.sources)


def _zip_longest_of(fillvalue, *iterables):
    """``zip_longest`` called positionally (the break's glue calls without keywords)."""
    return itertools.zip_longest(*iterables, fillvalue=fillvalue)


__all__ = ["LazyIteratorVariable", "MapVariable", "CountVariable", "ISliceVariable", "ZipVariable",
           "as_iterator", "is_lazy"]
