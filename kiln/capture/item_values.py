"""``.item()`` of an integer graph input under ``fullgraph=True``: its value, guarded.

A graph break is what ``.item()`` is otherwise (DESIGN.md section 4): kiln has no unbacked
symbols, so a size or count read from a tensor's data cannot stay symbolic. Under
``fullgraph=True`` a break is an error, which loses a program eager runs. For the common case,
an integer or bool tensor passed in and not written before the read (``n = lengths.item();
x.new_ones(n)``), the trace reads the value the call passed and guards on it like a Python int
argument (``L['y'].item() == 3``): a call with another value compiles another entry. Floats
are not guarded (their values rarely repeat: every call would recompile), nor are computed
tensors (their value is not known while tracing) or inputs written earlier in the frame: under
``fullgraph=True`` their ``.item()`` is a number inside the graph (capture/scalar_values.py),
which serves where the value is only returned or computed with, not branched on or used as a
size. Without ``fullgraph`` they are breaks.
"""
from __future__ import annotations

from kiln.capture.values import ConstantVariable, TensorVariable, Variable, _refuse, BoundAdapterVariable
from kiln.graph.node import PLACEHOLDER
from kiln.capture.errors import Unsupported
from kiln.capture.scalar_values import item_number


def input_item(tx, var: TensorVariable) -> Variable:
    """The bound ``var.item`` method: the guarded value, or a break at the call."""
    value = _guarded_value(tx, var)
    if value is None and tx.scalar_outputs:  # a number in the graph (scalar_values.py)
        return _NumberItem(var)
    if value is None:
        return BoundAdapterVariable(var, _refuse(
            "Tensor.item of a computed, written or floating tensor is a graph break (under "
            "fullgraph=True only an unwritten integer input's value is read)"), "Tensor.item")
    return _ItemMethod(value)


def _guarded_value(tx, var):
    node = var.proxy.node  # a written input's proxy is the write's result, not its placeholder
    if node.op != PLACEHOLDER:
        return None
    for known, source, t in tx._tensor_inputs.values():
        if known.proxy.node is node and source is not None:
            if t.numel() != 1 or t.is_floating_point() or t.is_complex() or t.requires_grad:
                return None
            value = t.item()
            tx.guards.add(source, f"{{}}.item() == {value!r}")
            return value
    return None


class _ItemMethod(Variable):
    def __init__(self, value):
        self.value = value

    def truth(self, tx):
        return True

    def call(self, tx, args, kwargs):
        if args or kwargs:
            raise Unsupported("Tensor.item takes no arguments")
        return ConstantVariable(self.value)

    def __repr__(self):
        return f"ItemMethod({self.value!r})"


class _NumberItem(Variable):
    """``t.item()`` of a computed, written or floating tensor: a number inside the graph."""

    def __init__(self, var):
        self.var = var

    def truth(self, tx):
        return True

    def call(self, tx, args, kwargs):
        if args or kwargs:
            raise Unsupported("Tensor.item takes no arguments")
        return item_number(tx, self.var)

    def __repr__(self):
        return f"NumberItem({self.var})"
