"""More builtins during capture: ``map`` with any function, ``min``/``max`` over tensors and with
``key=``, ``collections.deque``, and the itertools that are lazy or infinite (``islice``,
``count``, ``zip_longest``, ``accumulate``; ``zip`` over them).

Registered into ``builtins.BUILTIN_HANDLERS`` on import (builtins.py imports this module last).
"""
from __future__ import annotations

import collections
import itertools

import torch

from kiln.capture.builtins import BUILTIN_HANDLERS, PURE_BUILTINS, _constants, call_builtin, handles
from kiln.capture.errors import EagerRaises, Unsupported
from kiln.capture.scalar_values import NumberVariable
from kiln.capture.values import ConstantVariable, IteratorVariable, TensorVariable, TupleVariable
from kiln.capture.values_callables import TorchFunctionVariable
from kiln.capture.values_deque import make_deque
from kiln.capture.values_iterators import (CountVariable, ISliceVariable, MapVariable, ZipVariable,
                                           as_iterator, is_lazy)


def _is_none(v) -> bool:
    return v is None or isinstance(v, ConstantVariable) and v.value is None


# ---------------------------------------------------------------- map
@handles(map)
def _map(tx, fn, *iterables):
    """``map(fn, *iterables)``. A builtin known to be pure over lists (``map(str, names)`` in
    collections.namedtuple) is evaluated now, which no side effect can tell from Python's lazy
    map, and stays a plain list of results; any other function is called item by item as the
    map is consumed (values_iterators.MapVariable)."""
    if not iterables:
        raise EagerRaises("map() must have at least two arguments: eager raises TypeError")
    value = getattr(fn, "fn", getattr(fn, "value", None))
    if value in PURE_BUILTINS and not any(is_lazy(it) for it in iterables):
        return IteratorVariable([call_builtin(tx, value, list(group), {})
                                 for group in zip(*(it.iterate(tx) for it in iterables))])
    return MapVariable(tx, fn, [as_iterator(tx, it) for it in iterables])


def _all_any(want: bool):
    """``all``/``any`` of a lazy iterator: items taken one by one until the answer is known, as
    Python's short-circuit does (``all(map(pred, xs))`` calls ``pred`` no further); over
    anything else, the constant evaluation of PURE_BUILTINS."""
    def handler(tx, iterable):
        if not is_lazy(iterable):
            return NotImplemented
        while (item := iterable.next()) is not None:
            if item.truth(tx) is want:
                return ConstantVariable(want)
        return ConstantVariable(not want)
    return handler


BUILTIN_HANDLERS[all] = _all_any(False)
BUILTIN_HANDLERS[any] = _all_any(True)


# ---------------------------------------------------------------- min / max
def _min_max(py_fn):
    """``min``/``max`` as Python runs them: over Python constants, evaluated; with ``key=``, the
    key traced per item and the items chosen by the keys' values; over one-element tensors and
    numbers, one pairwise ``torch.maximum``/``minimum`` (``clamp`` against a number) per
    comparison Python would make, as Dynamo does (eager hands back one of the arguments
    itself; this is a new tensor of that value)."""
    name = py_fn.__name__

    def handler(tx, *args, key=None, default=None):
        items = args[0].iterate(tx) if len(args) == 1 else list(args)
        if not items:
            if default is None:
                raise EagerRaises(f"{name}() of an empty sequence: eager raises ValueError")
            return default
        if not _is_none(key):
            keys = _constants(tx, [key.call(tx, [v], {}) for v in items])  # traced per item
            if keys is None:
                raise Unsupported(f"{name}(key=...) whose keys are not Python constants")
            return items[py_fn(range(len(items)), key=keys.__getitem__)]  # the first best, as Python
        values = _constants(tx, items)
        if values is not None:
            try:
                return tx.wrap_constant(py_fn(values))
            except Exception as e:  # noqa: BLE001
                raise Unsupported(f"{name}(...) raised {e!r}") from None
        best = items[0]
        for item in items[1:]:
            best = _pairwise(tx, name, best, item)
        return best
    return handler


def _pairwise(tx, name, a, b):
    if isinstance(a, NumberVariable) or isinstance(b, NumberVariable):
        raise Unsupported(f"{name}() of a Python number computed in the graph compares data")
    tensors = [v for v in (a, b) if isinstance(v, TensorVariable)]
    if not tensors:
        return tx.wrap_constant((min if name == "min" else max)(a.as_python(), b.as_python()))
    for t in tensors:
        numel = t.proxy.meta.numel()
        if type(numel) is not int:
            raise Unsupported(f"{name}() of a tensor whose element count is symbolic")
        if numel != 1:  # Python's comparison reads the tensor's truth
            raise EagerRaises(f"{name}() of a tensor with {numel} elements: eager raises "
                              "(Boolean value of Tensor with more than one value is ambiguous)")
    if len(tensors) == 2:
        fn = torch.maximum if name == "max" else torch.minimum
        return TorchFunctionVariable(fn).call(tx, [a, b], {})
    t, other = (a, b) if isinstance(a, TensorVariable) else (b, a)
    if not isinstance(other.as_python(), (int, float, bool)):
        raise Unsupported(f"{name}() of a tensor and {other}")
    bound = "min" if name == "max" else "max"
    return TorchFunctionVariable(torch.clamp).call(tx, [t], {bound: other})


BUILTIN_HANDLERS[min] = _min_max(min)
BUILTIN_HANDLERS[max] = _min_max(max)


# ---------------------------------------------------------------- collections.deque
@handles(collections.deque)
def _deque(tx, iterable=None, maxlen=None):
    return make_deque(tx, iterable, maxlen)


# ---------------------------------------------------------------- itertools
def _int_arg(v, what, allow_none=True):
    value = None if _is_none(v) else v.as_python()
    if value is None and allow_none:
        return None
    if type(value) is not int or value < 0:
        raise EagerRaises(f"islice's {what} {value!r}: eager raises ValueError")
    return value


@handles(itertools.islice)
def _islice(tx, iterable, *args):
    if len(args) == 1:
        start, stop, step = None, args[0], None
    elif len(args) in (2, 3):
        start, stop, step = args[0], args[1], args[2] if len(args) == 3 else None
    else:
        raise EagerRaises("islice with a wrong number of arguments: eager raises TypeError")
    step_value = _int_arg(step, "step") or 1
    if step_value == 0:
        raise EagerRaises("islice's step 0: eager raises ValueError")
    return ISliceVariable(as_iterator(tx, iterable), _int_arg(start, "start") or 0,
                          _int_arg(stop, "stop"), step_value)


@handles(itertools.count)
def _count(tx, start=None, step=None):
    first = 0 if start is None else start.as_python()
    by = 1 if step is None else step.as_python()
    if not all(isinstance(x, (int, float)) for x in (first, by)):
        raise Unsupported("itertools.count of values that are not Python numbers")
    return CountVariable(first, by)


@handles(zip)
def _zip(tx, *iterables, **kwargs):
    """``zip``: over lists and other listed iterators, the tuples now; where a source is lazy
    (``map``, ``islice``, ``count``), pulled tuple by tuple (values_iterators.ZipVariable)."""
    strict = kwargs.pop("strict", None)
    strict = False if strict is None else strict.as_python()
    if kwargs or not isinstance(strict, bool):
        return NotImplemented
    if any(is_lazy(it) for it in iterables):
        if strict:
            return NotImplemented  # strict=True over a lazy source: a break
        return ZipVariable([as_iterator(tx, it) for it in iterables])
    items = [it.iterate(tx) for it in iterables]
    if strict and len({len(x) for x in items}) > 1:  # eager raises ValueError at the end
        return NotImplemented
    return IteratorVariable([TupleVariable(list(group)) for group in zip(*items)])


@handles(itertools.zip_longest)
def _zip_longest(tx, *iterables, fillvalue=None):
    return ZipVariable([as_iterator(tx, it) for it in iterables], longest=True, fillvalue=fillvalue)


@handles(itertools.accumulate)
def _accumulate(tx, iterable, func=None, *, initial=None):
    """``accumulate``: the running results at once (each step traced in order: ``+`` or
    ``func``)."""
    items = iterable.iterate(tx)
    out = [] if _is_none(initial) else [initial]
    for item in items:
        if not out:
            out.append(item)
        elif _is_none(func):
            out.append(tx.binary_op("+", out[-1], item))
        else:
            out.append(func.call(tx, [out[-1], item], {}))
    return IteratorVariable(out)

__all__ = []
