"""Automatic dynamic Python floats: a float whose value changed between calls is a graph input.

A Python float read by the trace (an argument, a module attribute such as a scale) is first a
constant with a guard on its value, as ints and sizes are. When a later call fails that guard
with another float, the code's next compile (``api._note_changed_floats``) traces the float's
source as a graph input: a 0-d float64 CPU tensor built by the fetch on each call
(``FloatCarrierSource``), whose meta (``WrappedNumberMeta``) promotes like the Python number
it stands for (torch's "wrapped number": ``half * 0.5`` stays half). The guard then checks
only that the value is still a float, so every later value reuses the entry.

Arithmetic on such floats alone stays a float64 ``WrappedNumberMeta`` (Python's double
arithmetic) and comes back as a Python float where it is returned, stored or live at a graph
break (``rebuild``'s ``number`` spec, the glue's ``.item()``; the input itself is reloaded from
its source). A float input is only kept where the trace treats it as a number inside tensor
ops: when the trace needs its value in Python (a branch on it, ``math.sqrt``, an op argument
that must be a Python number), the trace fails, and the caller traces again with the float
constant, for this code from now on (``api.CompiledFunction._trace``); a graph break that
happens with the floats constant too keeps them inputs.
"""
from __future__ import annotations

import torch

from kiln.capture.errors import Unsupported
from kiln.capture.guards import Source
from kiln.graph.node import PLACEHOLDER, Node, flatten_args
from kiln.meta.tensor_meta import WrappedNumberMeta
from kiln.graph import Proxy
from kiln.capture.values import TensorVariable


class FloatCarrierSource(Source):
    """The graph input standing for dynamic Python float ``parent``: a 0-d float64 CPU tensor
    holding its value (float64 holds a Python float exactly)."""
    __slots__ = ("parent",)

    def __init__(self, parent):
        self.parent = parent

    def expr(self, base=None):
        return f"torch.scalar_tensor({base or self.parent.expr()}, dtype=torch.float64)"


def wrap_dynamic_float(tx, value: float, source: Source):
    """The tracker of a dynamic float: a tensor variable over its carrier placeholder."""
    from kiln.capture.tracer import _placeholder_name
    seen = tx.float_inputs.get(source.expr())
    if seen is not None:
        return seen
    tx.guards.add(source, "type({}) is float")
    node = tx.graph.placeholder(_placeholder_name(source) + "_float", WrappedNumberMeta.scalar())
    node.meta["python_float"] = source.expr()
    # the source is the float's own: a graph break's glue hands the resume function the float
    var = TensorVariable(Proxy(node), torch.Tensor, source)
    var.python_float = True  # ``s += t`` rebinds a float, it writes into no input (tracer.binary_op)
    tx._var_of_node[node] = var
    tx.float_inputs[source.expr()] = var
    tx.input_sources.append(FloatCarrierSource(source))
    return var


def check_float_outputs(graph):
    """Refuse a capture that hands back, as a value, something computed from dynamic floats
    alone that is not a Python float any more (``WrappedNumberMeta`` results are: the rebuild
    and a break's glue turn them back into floats with ``.item()``)."""
    numbers = set()  # nodes computed from float carriers alone
    for node in graph.nodes:
        if node.op == PLACEHOLDER:
            if "python_float" in node.meta:
                numbers.add(node)
            continue
        inputs = [a for a in flatten_args((node.args, node.kwargs)) if type(a) is Node]
        if inputs and all(a in numbers for a in inputs):
            numbers.add(node)
    outputs = [a for a in flatten_args(graph.output_node.args) if type(a) is Node]
    if any(o in numbers and type(o.meta.get("val")) is not WrappedNumberMeta for o in outputs):
        raise Unsupported("a dynamic Python float is returned or stored as a value")
