"""Small tensors whose values capture knows: graph constants, and ops computed from them only.

Eager code makes 0-d tensors out of Python numbers and then uses them where torch wants an int:
Longformer's ``torch.div(seq_len, w, rounding_mode="trunc") - 1`` becomes a size of ``view`` and
``new_zeros`` (torch reads it through ``__index__``). Dynamo's fake tensors keep the value of
such a tensor (FakeTensor constant propagation) and so reach one graph; capture does the same:
an op whose tensor operands are all small graph constants is computed at trace time into a new
constant (the node it recorded becomes dead and dce drops it), and a size argument that is a
0-d integer constant is its Python int. The values came from Python numbers that capture
specialized and guarded where it read them, so they hold for every call the guards admit.
"""
from __future__ import annotations

import torch

from kiln.graph import Proxy
from kiln.graph.node import CALL, GET_ATTR, Node, flatten_args, map_args

SMALL = 64  # elements: a size or a scalar, never a weight
_KNOWN = "known_constant"  # node.meta key


def constant(graph, value: torch.Tensor) -> Proxy:
    """A graph constant computed from Python numbers at trace time, its value known from here on
    (a parameter or a buffer read as a constant is not: its value may change between calls)."""
    node = graph.get_attr("const", value)
    node.meta[_KNOWN] = True
    return Proxy(node)


def known_value(x):
    """The value of ``x`` when it is a small constant made by ``constant``, else None."""
    if isinstance(x, Proxy):
        x = x.node
    if not isinstance(x, Node) or x.op != GET_ATTR or not x.meta.get(_KNOWN):
        return None
    value = x.graph.constants.get(x.target)
    return value if isinstance(value, torch.Tensor) and value.numel() <= SMALL else None


def fold(out):
    """``out`` itself, or a constant of its value where its op read small constants only (and
    other Python values): no random op, no gradient, a small result."""
    if not isinstance(out, Proxy) or out.node.op != CALL:
        return out
    node = out.node
    op = node.target
    if getattr(op, "random", True) or getattr(op, "eager", None) is None:
        return out
    meta = node.meta.get("val")
    shape = tuple(getattr(meta, "shape", (None,)))
    if getattr(meta, "requires_grad", True) or not all(type(d) is int for d in shape) \
            or _numel(shape) > SMALL:  # no symbolic size: comparing one would guard on it
        return out
    operands = [a for a in flatten_args((node.args, node.kwargs)) if isinstance(a, Node)]
    if not operands or any(known_value(a) is None for a in operands):
        return out
    args, kwargs = map_args((node.args, node.kwargs), known_value)
    try:
        value = op.eager(*args, **kwargs)
    except Exception:  # noqa: BLE001 - the node stays as recorded; the graph computes it
        return out
    if not isinstance(value, torch.Tensor) or value.dtype != meta.dtype or tuple(value.shape) != tuple(meta.shape):
        return out
    return constant(node.graph, value)


def _numel(shape):
    n = 1
    for d in shape:
        n *= d
    return n


def as_size(s):
    """A size argument: a 0-d integer constant is its Python int (eager reads it by
    ``__index__``); anything else is returned as it is."""
    value = known_value(s)
    if value is None or value.ndim != 0 or value.dtype.is_floating_point or value.dtype.is_complex \
            or value.dtype == torch.bool:
        return s
    return int(value)


def sizes_in_lists(args, kwargs):
    """``args`` and ``kwargs`` with each tuple or list of ints and 0-d integer constants (a size
    or a stride, ``as_strided(size=(b, chunks + 1, w, d))``) made of ints: torch's own functions
    reached as fallback nodes read such a list on the meta device, where a tensor has no value.
    A lone tensor argument stays a tensor."""
    def convert(v):
        if not isinstance(v, (tuple, list)) or not any(isinstance(x, Proxy) for x in v):
            return v
        sizes = [as_size(x) for x in v]
        if any(isinstance(x, Proxy) for x in sizes):
            return v
        return type(v)(sizes) if isinstance(v, list) else tuple(sizes)
    return [convert(a) for a in args], {k: convert(v) for k, v in kwargs.items()}
