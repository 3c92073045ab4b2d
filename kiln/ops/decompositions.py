"""Decompositions: core ops written as plain Python over prims.

Each function receives Proxies (and Python values) and calls prims; calling a prim on a Proxy
records a node. The broadcasting and type promotion that core ops do implicitly become
explicit ``broadcast_in_dim`` and ``convert_element_type`` prims here.
"""
from __future__ import annotations

from kiln.graph.proxy import Proxy
from kiln.ops import core, prims
from kiln.ops.promotion import Promotion, broadcast_shapes, scalar_for
from kiln.ops.registry import DECOMPOSITIONS


from kiln.ops.prim_utils import broadcast_to, elementwise_operands, on_one_device, to_dtype  # noqa: F401


def _elementwise(prim, kind):
    def decomp(*args):
        operands, _, result = elementwise_operands(args, kind)
        out = prim(*operands)
        return to_dtype(out, result) if kind != Promotion.ALWAYS_BOOL else out
    return decomp


_SAME_NAME = ("neg", "abs",
              "mul", "div", "maximum", "minimum", "eq", "ne", "lt", "le", "gt", "ge")
for _name in _SAME_NAME:
    _core_op = getattr(core, _name)
    DECOMPOSITIONS[_core_op] = _elementwise(getattr(prims, _name), core.PROMOTION[_core_op])


@DECOMPOSITIONS.register(core.relu)
def relu(x):
    return prims.maximum(x, scalar_for(0, x.dtype))


@DECOMPOSITIONS.register(core.where)
def where(cond, a, b):
    cond, a, b = on_one_device((cond, a, b))
    (a, b), compute, _ = elementwise_operands((a, b), Promotion.DEFAULT)
    shape = broadcast_shapes(*(t.shape for t in (cond, a, b) if isinstance(t, Proxy)))
    a = broadcast_to(a, shape) if isinstance(a, Proxy) else a
    b = broadcast_to(b, shape) if isinstance(b, Proxy) else b
    cond = broadcast_to(cond, shape) if isinstance(cond, Proxy) else cond
    if not isinstance(a, Proxy) and not isinstance(b, Proxy):  # where(c, 1.0, 0.0): a tensor branch
        a = prims.full(tuple(shape), a, compute, cond.device)
    return prims.where(cond, a, b)


@DECOMPOSITIONS.register(core.to_dtype)
def _to_dtype(x, dtype):
    return to_dtype(x, dtype)


@DECOMPOSITIONS.register(core.linear)
def linear(x, weight, bias=None):
    out_features, in_features = weight.shape
    lead = tuple(x.shape[:-1])
    x2 = x if x.ndim == 2 else prims.reshape(x, (-1, in_features))
    if bias is not None and bias.ndim == 1 and bias.dtype == x.dtype == weight.dtype:
        out = prims.addmm(bias, x2, prims.permute(weight, (1, 0)))
    else:
        out = prims.mm(x2, prims.permute(weight, (1, 0)))
        if bias is not None:
            out = prims.add(out, broadcast_to(bias, out.shape))
    if x.ndim != 2:
        out = prims.reshape(out, lead + (out_features,))
    return out
