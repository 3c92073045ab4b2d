"""exp: every rule of ``core.exp`` and of the prim it decomposes to, ``prims.exp``, in one file.

    capture        torch.exp(x), x.exp(); in place x.exp_(), torch.exp_(x)
    core.exp       eager torch.exp; meta: elementwise, integers promote to the default float
    decomposition  core.exp -> prims.exp on operands cast to the compute dtype
    VJP            d exp(x) = g * exp(x), read off the forward's result
    prims.exp      eager torch.exp; meta: same shape and dtype as its operand
    lowering       pointwise: loop IR ``Call("exp", x)``; its spelling per backend is in
                   ``TritonOps.TABLE`` (codegen/triton.py) and the C++ tables (codegen/cpp.py)
    autocast       float32 on CUDA (torch's autocast lists exp among its fp32 ops); CPU: as is
    properties     pointwise (recompute-cheap, eager layout follows the input's)

The rules that need a stage's helpers reach them through stage handles (``registry.stage_api``),
bound when the stage is imported: this file imports no stage.
"""
from __future__ import annotations

import torch

from kiln.ops import core
from kiln.ops.autocast import FP32
from kiln.ops.core import elementwise_meta
from kiln.ops.prim_utils import elementwise_operands, to_dtype
from kiln.ops.prims import _elementwise_meta as prim_elementwise_meta
from kiln.ops.promotion import Promotion
from kiln.ops.registry import (CAPTURE_FUNCTIONS, CAPTURE_METHODS, DECOMPOSITIONS, INPLACE_METHODS,
                               LOWERINGS, META_RULES, POINTWISE, VJP_RULES, define, stage_api)

L = stage_api("lowering")  # inductor/lowering.py
C = stage_api("capture")   # capture/torch_api.py (its adapters and Unsupported)

__all__ = ["exp", "prim_exp"]

# ------------------------------------------------------------------ prims.exp
prim_exp = define("prims", "exp", torch.exp, pointwise=True)
META_RULES[prim_exp] = prim_elementwise_meta("exp")
LOWERINGS[prim_exp] = L.pointwise("exp")

# ------------------------------------------------------------------ core.exp
exp = define("core", "exp", torch.exp, autocast={"cuda": FP32}, **POINTWISE)
META_RULES[exp] = elementwise_meta("exp", Promotion.INT_TO_FLOAT)
core.PROMOTION[exp] = Promotion.INT_TO_FLOAT


@DECOMPOSITIONS.register(exp)
def _exp_decomposition(x):
    operands, _, result = elementwise_operands((x,), Promotion.INT_TO_FLOAT)
    return to_dtype(prim_exp(*operands), result)


@VJP_RULES.register(exp)
def _exp_vjp(g, out, x):
    return (core.mul(g, out),)


# ------------------------------------------------------------------ capture
CAPTURE_FUNCTIONS[torch.exp] = C.unary(exp)
CAPTURE_METHODS["exp"] = C.unary(exp)
INPLACE_METHODS.append("exp")  # x.exp_() and torch.exp_(x): exp written into x
