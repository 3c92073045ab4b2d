"""add and sub: every rule of ``core.add``/``core.sub`` and of their prims, in one file.

    capture        torch.add(a, b, *, alpha=1), a.add(b), a + b; torch.sub/subtract, a.sub(b),
                   a.subtract(b), a - b; in place a.add_(b), a.sub_(b), a.subtract_(b), a += b
    core.add       eager torch.add (alpha only when it is not 1); meta: elementwise with
                   broadcasting and torch's default type promotion (alpha does not promote)
    decomposition  operands promoted and broadcast, b scaled by alpha, then prims.add / prims.sub
    VJP            g for a; g (times alpha) for b, negated for sub; summed down to each
                   operand's shape by the joint graph (``joint._fit``)
    prims.add      eager torch.add; meta: operands of one shape and dtype
    lowering       pointwise: loop IR ``Call("add", a, b)``; its spelling per backend is in
                   ``TritonOps.TABLE`` (codegen/triton.py) and the C++ tables (codegen/cpp.py)
    autocast       none: inputs as they are on every device (``autocast={}``)
    properties     pointwise (recompute-cheap, eager layout follows the inputs')
"""
from __future__ import annotations

import torch

from kiln.graph.proxy import Proxy
from kiln.ops import core, prims
from kiln.ops.core import elementwise_meta
from kiln.ops.prim_utils import elementwise_operands
from kiln.ops.prims import _elementwise_meta as prim_elementwise_meta
from kiln.ops.promotion import Promotion, scalar_for
from kiln.ops.registry import (CAPTURE_FUNCTIONS, CAPTURE_METHODS, CAPTURE_OPERATORS, DECOMPOSITIONS,
                               INPLACE_METHODS, LOWERINGS, META_RULES, POINTWISE, VJP_RULES, define,
                               stage_api)

L = stage_api("lowering")  # inductor/lowering.py
C = stage_api("capture")   # capture/torch_api.py (its adapters)

__all__ = ["add", "sub"]


# ------------------------------------------------------------------ prims.add, prims.sub
def _prim(name, eager):
    prim = define("prims", name, eager, pointwise=True)
    META_RULES[prim] = prim_elementwise_meta(name)
    LOWERINGS[prim] = L.pointwise(name)
    return prim


prim_add = _prim("add", torch.add)
prim_sub = _prim("sub", torch.sub)


# ------------------------------------------------------------------ core.add, core.sub
# add(a, b, alpha) = a + alpha * b
def _add_eager(a, b, alpha=1):
    return torch.add(a, b, alpha=alpha) if alpha != 1 else torch.add(a, b)


def _sub_eager(a, b, alpha=1):
    return torch.sub(a, b, alpha=alpha) if alpha != 1 else torch.sub(a, b)


add = define("core", "add", _add_eager, autocast={}, **POINTWISE)
sub = define("core", "sub", _sub_eager, autocast={}, **POINTWISE)
def _meta_without_alpha(name):
    rule = elementwise_meta(name, Promotion.DEFAULT)
    return lambda a, b, alpha=1: rule(a, b)


for _op in (add, sub):
    META_RULES[_op] = _meta_without_alpha(_op.name)
    core.PROMOTION[_op] = Promotion.DEFAULT


def _with_alpha(prim):
    def decomp(a, b, alpha=1):
        (a, b), compute, _ = elementwise_operands((a, b), Promotion.DEFAULT)
        if alpha != 1:
            b = prims.mul(b, scalar_for(alpha, compute)) if isinstance(b, Proxy) else b * alpha
        return prim(a, b)
    return decomp


DECOMPOSITIONS[add] = _with_alpha(prim_add)
DECOMPOSITIONS[sub] = _with_alpha(prim_sub)


@VJP_RULES.register(add)
def _add_vjp(g, out, a, b, alpha=1):
    return g, (g if alpha == 1 else core.mul(g, alpha))


@VJP_RULES.register(sub)
def _sub_vjp(g, out, a, b, alpha=1):
    return g, (core.neg(g) if alpha == 1 else core.mul(g, -alpha))


# ------------------------------------------------------------------ capture
CAPTURE_FUNCTIONS[torch.add] = C.with_alpha(add)
CAPTURE_METHODS["add"] = C.with_alpha(add)
CAPTURE_OPERATORS["+"] = C.with_alpha(add)
for _fn in (torch.sub, torch.subtract):
    CAPTURE_FUNCTIONS[_fn] = C.with_alpha(sub)
for _name in ("sub", "subtract"):
    CAPTURE_METHODS[_name] = C.with_alpha(sub)
CAPTURE_OPERATORS["-"] = C.with_alpha(sub)
INPLACE_METHODS.extend(("add", "sub", "subtract"))  # a.add_(b) ...: the result written into a
