"""Python numbers read from tensor data, kept in the graph under ``fullgraph=True``.

``float(t)``, ``int(t)``, ``bool(t)`` and ``t.item()`` of a computed tensor make a Python number
whose value the trace cannot know. DESIGN.md makes that a graph break, which ``fullgraph=True``
turns into an error, losing programs eager runs (Dynamo's ``capture_scalar_outputs``). kiln
has no unbacked symbols, but a number that is only returned, or only combined with other
numbers and tensors, needs none: it is a 0-d tensor of the graph (``core.number``, a
``WrappedNumberMeta`` that promotes as the Python number it stands for) and becomes a Python
number again where it leaves the graph (the rebuild's ``.item()``), so the caller sees eager's
type and value. What needs its value while tracing (a branch on it, a size, ``math.*``) stays a
break, with a reason that says so.

Python's own arithmetic on numbers is kept where torch's differs: bools count as ints in
``+ - * / // % **`` and unary ``- ~``, ``int / int`` is a double, an int raised to an unknown
power is refused (its type depends on the exponent's sign).

``x in [t, ...]`` (a list or tuple holding tensors) compares as CPython's ``list_contains`` does:
identity first, then ``bool(el == x)`` per item until one is true; under ``fullgraph=True`` those
truths are numbers too (a bool ``logical_or`` of them), otherwise the containment is a break.

Not done: ``int()`` of a floating value (eager raises on nan and inf, which a graph cannot);
numbers used as sizes (they would need unbacked symbols); Python's unbounded ints (a graph's
int64 wraps).
"""
from __future__ import annotations

import torch

from kiln.capture.errors import EagerRaises, Unsupported
from kiln.capture.values import ConstantVariable, TensorVariable
from kiln.graph import Proxy
from kiln.meta.tensor_meta import WrappedNumberMeta
from kiln.ops import core

_DTYPES = {float: torch.float64, int: torch.int64, bool: torch.bool}
_ARITHMETIC = {"+", "-", "*", "/", "//", "%", "**"}


class NumberVariable(TensorVariable):
    """A Python float, int or bool computed in the graph: a 0-d ``WrappedNumberMeta`` node."""
    python_float = True  # ``n += t`` rebinds the number, it writes into no tensor (tracer.binary_op)
    origin = None  # what made it, for messages: "Tensor.item", "float()"

    def python_type(self):
        return self.proxy.meta.python_type

    def unknown(self, use: str) -> Unsupported:
        kind = self.python_type().__name__
        made = f" by {self.origin}" if self.origin else ""
        return Unsupported(f"data-dependent {use}: this Python {kind} is computed from tensor data"
                           f"{made} inside the graph ({self.proxy.node.name}), so its value is only "
                           "known when the graph runs (kiln has no unbacked symbols)")

    def truth(self, tx):
        raise self.unknown("branch")

    def as_python(self):
        raise self.unknown("Python value")

    def getattr(self, tx, name):
        raise self.unknown(f"attribute {name!r}")

    def iterate(self, tx):
        raise self.unknown("iteration")

    def __repr__(self):
        return f"Number({self.proxy.node.name}: {self.python_type().__name__})"


def wrap_number(tx, proxy, origin=None) -> NumberVariable:
    var = NumberVariable(proxy)
    var.origin = origin
    tx._var_of_node[proxy.node] = var
    return var


def to_number(tx, var: TensorVariable, kind: type, what: str) -> NumberVariable:
    """``kind(var)`` (``float``, ``int`` or ``bool``) of a one-element tensor, in the graph."""
    meta = var.proxy.meta
    if isinstance(var, NumberVariable) and var.python_type() is kind:
        return var
    numel = meta.numel()
    if type(numel) is not int:
        raise Unsupported(f"{what}: the tensor's element count is symbolic ({numel}); only a "
                          "one-element tensor converts to a Python number")
    if numel != 1:
        eager = ("Boolean value of Tensor with more than one value is ambiguous" if kind is bool
                 else "only one element tensors can be converted to Python scalars")
        raise EagerRaises(f"{what} of a tensor with {numel} elements: eager raises ({eager})")
    if meta.dtype.is_complex and kind is not bool:
        raise Unsupported(f"{what} of a complex tensor is not supported")
    if kind is int and meta.dtype.is_floating_point:
        raise Unsupported(f"{what}: int() of a floating value computed in the graph is not "
                          "supported (eager raises on nan and inf; a graph cannot)")
    return wrap_number(tx, core.number(var.proxy, _DTYPES[kind]), what)


def item_number(tx, var: TensorVariable) -> NumberVariable:
    """``t.item()``: the Python number of t's dtype's kind."""
    dtype = var.proxy.meta.dtype
    if dtype.is_complex:
        raise Unsupported("Tensor.item of a complex tensor computed in the graph is not supported")
    kind = bool if dtype == torch.bool else float if dtype.is_floating_point else int
    return to_number(tx, var, kind, "Tensor.item")


def python_operands(tx, op: str, a, b):
    """The operands of binary ``op`` between numbers (and constants) as Python computes them:
    a bool is an int in arithmetic, ``/`` of ints is in doubles. With a real tensor among
    them torch's rules are Python's, and the operands stay as they are."""
    if not (isinstance(a, NumberVariable) or isinstance(b, NumberVariable)):
        return a, b
    if any(isinstance(v, TensorVariable) and not isinstance(v, NumberVariable) for v in (a, b)):
        return a, b
    if op not in _ARITHMETIC:
        return a, b
    a, b = (_as_int_if_bool(tx, v) for v in (a, b))
    if op == "/":
        a, b = (_as_float_if_int(tx, v) for v in (a, b))
    if op == "**" and _kind(a) is int and _kind(b) is int:
        if isinstance(b, NumberVariable):
            raise Unsupported("operator **: an int raised to an int computed from tensor data has a "
                              "type that depends on the exponent's sign (int, or float when "
                              "negative); it is not supported")
        if b.as_python() < 0:
            a = _as_float_if_int(tx, a)
    return a, b


def python_unary_operand(tx, op: str, v):
    """Unary ``-``, ``+`` and ``~`` of a bool number work on its int, as in Python."""
    return _as_int_if_bool(tx, v) if isinstance(v, NumberVariable) else v


def _kind(v):
    return v.python_type() if isinstance(v, NumberVariable) else type(v.as_python())


def _as_int_if_bool(tx, v):
    if isinstance(v, NumberVariable) and v.python_type() is bool:
        return wrap_number(tx, core.number(v.proxy, torch.int64))
    return v


def _as_float_if_int(tx, v):
    if isinstance(v, NumberVariable) and v.python_type() is int:
        return wrap_number(tx, core.number(v.proxy, torch.float64))
    return v


# ---------------------------------------------------------------- ``in`` over tensors
def holds_tensors(container, item) -> bool:
    return isinstance(item, TensorVariable) or any(isinstance(v, TensorVariable) for v in container.items)


def sequence_contains(tx, container, item):
    """``item in container`` for a list or tuple, when a tensor takes part: each element is
    ``el is item or bool(el == item)``, in order, stopping at the first true one (CPython's
    ``list_contains``). A truth known while tracing is a constant; a tensor's is a bool number
    under ``fullgraph=True`` and a graph break otherwise. Returns a ConstantVariable or a bool
    NumberVariable."""
    unknown = None  # the bool number: any of the data-dependent truths so far
    for el in container.items:
        if el is item:  # one tracker, one object: identity, no comparison (as CPython)
            return ConstantVariable(True)
        truth = _element_equals(tx, el, item)
        if isinstance(truth, ConstantVariable):
            if truth.value:
                return ConstantVariable(True)
            continue
        unknown = truth if unknown is None else wrap_number(tx, core.logical_or(unknown.proxy, truth.proxy))
    return ConstantVariable(False) if unknown is None else unknown


def _element_equals(tx, el, item):
    if not isinstance(el, TensorVariable) and not isinstance(item, TensorVariable):
        return ConstantVariable(el.as_python() == item.as_python())
    eq = tx.binary_op("==", el, item)
    if isinstance(eq, ConstantVariable):
        return ConstantVariable(bool(eq.value))
    if not tx.scalar_outputs:
        raise Unsupported("`in` over a list or tuple holding tensors: each comparison with == is a "
                          "tensor whose truth depends on its data (data-dependent; captured under "
                          "fullgraph=True)")
    return to_number(tx, eq, bool, "`in` over a list or tuple holding tensors: bool(el == item)")


def negate(tx, found):
    """``not found`` for a containment's result (``not in``)."""
    if isinstance(found, ConstantVariable):
        return ConstantVariable(not found.value)
    return wrap_number(tx, core.logical_not(found.proxy))


def is_number_meta(proxy) -> bool:
    return isinstance(proxy, Proxy) and type(proxy.meta) is WrappedNumberMeta
