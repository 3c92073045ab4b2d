"""log, sqrt, rsqrt, tanh, sigmoid: a family of unary math ops, every rule of each core op and
of its prim in one table row and the few lines below it (the pattern of ``op_exp.py``).

    capture        torch.<name>(x), x.<name>(); F.tanh, F.sigmoid; in place x.<name>_(),
                   torch.<name>_(x)
    core.<name>    eager torch.<name>; meta: elementwise, integers promote to the default float
    decomposition  core.<name> -> prims.<name> on operands cast to the compute dtype
    VJP            the row's rule (read off the forward's result where it can)
    prims.<name>   eager torch.<name>; meta: same shape and dtype as its operand
    lowering       pointwise: loop IR ``Call("<name>", x)``; its spelling per backend is in
                   ``TritonOps.TABLE`` (codegen/triton.py) and the C++ tables (codegen/cpp.py)
    autocast       the row's policy (log and rsqrt: float32 on CUDA, torch's fp32 list)
    properties     pointwise (recompute-cheap, eager layout follows the input's)
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from kiln.ops import core
from kiln.ops.autocast import FP32
from kiln.ops.core import elementwise_meta
from kiln.ops.prim_utils import elementwise_operands, to_dtype
from kiln.ops.prims import _elementwise_meta as prim_elementwise_meta
from kiln.ops.promotion import Promotion
from kiln.ops.registry import (CAPTURE_FUNCTIONS, CAPTURE_METHODS, DECOMPOSITIONS, INPLACE_METHODS,
                               LOWERINGS, META_RULES, POINTWISE, VJP_RULES, define, stage_api)
from kiln.ops.vjp_utils import _one_minus

L = stage_api("lowering")  # inductor/lowering.py
C = stage_api("capture")   # capture/torch_api.py (its adapters)

__all__ = ["log", "sqrt", "rsqrt", "tanh", "sigmoid"]


def _log_vjp(g, out, x):
    return (core.div(g, x),)


def _sqrt_vjp(g, out, x):
    return (core.div(g, core.mul(out, 2.0)),)


def _rsqrt_vjp(g, out, x):
    # d(x^-1/2)/dx = -1/2 x^-3/2 = -1/2 out^3
    return (core.mul(g, core.mul(core.mul(core.mul(out, out), out), -0.5)),)


def _tanh_vjp(g, out, x):
    return (core.mul(g, _one_minus(core.mul(out, out))),)


def _sigmoid_vjp(g, out, x):
    return (core.mul(g, core.mul(out, _one_minus(out))),)


# name: (eager, VJP rule, autocast policy, extra torch spellings)
FAMILY = {
    "log": (torch.log, _log_vjp, {"cuda": FP32}, ()),
    "sqrt": (torch.sqrt, _sqrt_vjp, None, ()),
    "rsqrt": (torch.rsqrt, _rsqrt_vjp, {"cuda": FP32}, ()),
    "tanh": (torch.tanh, _tanh_vjp, None, (F.tanh,)),
    "sigmoid": (torch.sigmoid, _sigmoid_vjp, None, (F.sigmoid,)),
}


def _decomposition(prim):
    def decomp(x):
        operands, _, result = elementwise_operands((x,), Promotion.INT_TO_FLOAT)
        return to_dtype(prim(*operands), result)
    return decomp


def _define(name, eager, vjp, policy, spellings):
    prim = define("prims", name, eager, pointwise=True)
    META_RULES[prim] = prim_elementwise_meta(name)
    LOWERINGS[prim] = L.pointwise(name)

    op = define("core", name, eager, autocast=policy, **POINTWISE)
    META_RULES[op] = elementwise_meta(name, Promotion.INT_TO_FLOAT)
    core.PROMOTION[op] = Promotion.INT_TO_FLOAT
    DECOMPOSITIONS[op] = _decomposition(prim)
    VJP_RULES[op] = vjp

    for fn in (eager,) + spellings:
        CAPTURE_FUNCTIONS[fn] = C.unary(op)
    CAPTURE_METHODS[name] = C.unary(op)
    INPLACE_METHODS.append(name)  # x.<name>_() and torch.<name>_(x): the op written into x
    return op


log, sqrt, rsqrt, tanh, sigmoid = (_define(name, *row) for name, row in FAMILY.items())
