"""Core ops: the normalized calls captured graphs contain.

A core op has torch's semantics (broadcasting, type promotion, Python scalars) and an eager
implementation in torch. Its meta rule sits below its definition; its decomposition to prims is
in ``decompositions.py``; its VJP rule belongs to the autograd stage. The ops of ``op_*.py``
(add, sub, exp, sum, mm; log, sqrt, rsqrt, tanh, sigmoid) hold all their rules in their own file.
"""
from __future__ import annotations

import builtins  # core and prims define ops named sum, any, all, abs: use builtins.* here

import torch
import torch.nn.functional as F

from kiln.meta.strides import pointwise_strides, preserve_strides
from kiln.meta.tensor_meta import TensorMeta, WrappedNumberMeta
from kiln.ops.promotion import (Promotion, broadcast_shapes, is_bool, no_kernel, promoted_dtypes,
                                refuse_dtypes)
from kiln.ops.registry import META_RULES, POINTWISE, define


def _core(name, eager, **kw):
    return define("core", name, eager, **kw)


class CoreOpError(TypeError):
    pass


def _tensor_metas(args):
    return [a for a in args if isinstance(a, TensorMeta)]


def _device_of(ts):
    """The result device of an elementwise op, as torch picks it: the operands' device, where a
    0-d CPU tensor counts as a scalar and mixes with any device; other mixes are errors."""
    devices = {t.device for t in ts if t.ndim > 0 or t.device.type != "cpu"}
    if len(devices) > 1:
        a, b = sorted(devices, key=str)[:2]
        raise CoreOpError(f"[meta] Expected all tensors to be on the same device, but found at least "
                          f"two devices, {a} and {b}!")
    return next(iter(devices)) if devices else ts[0].device


def elementwise_meta(name, kind: Promotion):
    def rule(*args):
        ts = _tensor_metas(args)
        if not ts:
            raise CoreOpError(f"[meta] core.{name}: needs a tensor operand")
        shape = broadcast_shapes(*(t.shape for t in ts))
        _, result = promoted_dtypes(args, kind)
        grad = result.is_floating_point and builtins.any(t.requires_grad for t in ts)
        # eager's layout: dense, in the operands' stride order (channels-last stays so)
        meta = TensorMeta(shape, pointwise_strides(shape, ts), result, _device_of(ts), grad)
        if builtins.all(type(t) is WrappedNumberMeta for t in ts):  # arithmetic on Python floats
            meta = WrappedNumberMeta.like(meta)
        return meta
    return rule


# ------------------------------------------------------------------ elementwise
UNARY = {
    # name: (eager, promotion)
    "neg": (torch.neg, Promotion.DEFAULT),
    "abs": (torch.abs, Promotion.DEFAULT),
    "relu": (torch.relu, Promotion.DEFAULT),
}

BINARY = {
    "mul": (torch.mul, Promotion.DEFAULT),
    "div": (torch.true_divide, Promotion.INT_TO_FLOAT),
    "maximum": (torch.maximum, Promotion.DEFAULT),
    "minimum": (torch.minimum, Promotion.DEFAULT),
    "eq": (torch.eq, Promotion.ALWAYS_BOOL),
    "ne": (torch.ne, Promotion.ALWAYS_BOOL),
    "lt": (torch.lt, Promotion.ALWAYS_BOOL),
    "le": (torch.le, Promotion.ALWAYS_BOOL),
    "gt": (torch.gt, Promotion.ALWAYS_BOOL),
    "ge": (torch.ge, Promotion.ALWAYS_BOOL),
}

PROMOTION: dict = {}


def _define_elementwise(table):
    ops = {}
    for name, (eager, kind) in table.items():
        # comparisons give bool results: nothing to differentiate
        op = _core(name, eager, differentiable=kind != Promotion.ALWAYS_BOOL, **POINTWISE)
        META_RULES[op] = elementwise_meta(name, kind)
        PROMOTION[op] = kind
        ops[name] = op
    return ops


_unary = _define_elementwise(UNARY)
_binary = _define_elementwise(BINARY)
neg, abs, relu = (_unary[n] for n in ("neg", "abs", "relu"))
div, maximum, minimum = _binary["div"], _binary["maximum"], _binary["minimum"]
mul = _binary["mul"]
# dtypes eager has no kernel for (capture refuses the call, so torch raises its own error)
refuse_dtypes(META_RULES, abs, is_bool, lambda d: no_kernel(d, "abs_cpu"))
refuse_dtypes(META_RULES, neg, is_bool, lambda d: RuntimeError(
    "[meta] Negation, the `-` operator, on a bool tensor is not supported."))
refuse_dtypes(META_RULES, relu, is_bool, lambda d: RuntimeError(
    "[meta] Boolean inputs not supported for relu"))
eq, ne, lt, le, gt, ge = (_binary[n] for n in ("eq", "ne", "lt", "le", "gt", "ge"))


where = _core("where", torch.where, **POINTWISE)


@META_RULES.register(where)
def _where_meta(cond, a, b):
    ts = _tensor_metas((cond, a, b))
    if isinstance(cond, TensorMeta) and cond.dtype != torch.bool:
        raise CoreOpError(f"[meta] core.where: condition must be bool, got {cond.dtype}")
    shape = broadcast_shapes(*(t.shape for t in ts))
    _, result = promoted_dtypes((a, b), Promotion.DEFAULT)
    grad = builtins.any(t.requires_grad for t in _tensor_metas((a, b)))
    return TensorMeta(shape, pointwise_strides(shape, ts), result, _device_of(ts), grad)


def _to_dtype_eager(x, dtype):
    return x.to(dtype)


to_dtype = _core("to_dtype", _to_dtype_eager, **POINTWISE)


@META_RULES.register(to_dtype)
def _to_dtype_meta(x, dtype):
    # x.to(dtype) keeps x's layout (torch.preserve_format)
    return TensorMeta(x.shape, preserve_strides(x), dtype, x.device, x.requires_grad and dtype.is_floating_point)


# ------------------------------------------------------------------ library-backed
linear = _core("linear", F.linear, eager_layout="contiguous")


@META_RULES.register(linear)
def _linear_meta(x, weight, bias=None):
    if weight.ndim != 2 or x.ndim == 0 or x.shape[-1] != weight.shape[1]:
        raise CoreOpError(f"[meta] core.linear: input {list(x.shape)} does not match weight "
                          f"{list(weight.shape)}")
    if x.dtype != weight.dtype or (bias is not None and bias.dtype != x.dtype):
        raise CoreOpError(f"[meta] core.linear: dtypes differ (input {x.dtype}, weight {weight.dtype}"
                          f"{', bias ' + str(bias.dtype) if bias is not None else ''})")
    shape = tuple(x.shape[:-1]) + (weight.shape[0],)
    grad = x.requires_grad or weight.requires_grad or (bias is not None and bias.requires_grad)
    return TensorMeta.contiguous(shape, x.dtype, x.device, grad)


# The other families of core ops live in their own files; they are all ``core.<name>``.
from kiln.ops.core_views import *  # noqa: E402,F401,F403
from kiln.ops.core_reductions import *  # noqa: E402,F401,F403
from kiln.ops.core_elementwise_more import *  # noqa: E402,F401,F403
from kiln.ops.core_shape import *  # noqa: E402,F401,F403
from kiln.ops.core_nn import *  # noqa: E402,F401,F403
from kiln.ops.core_scatter import *  # noqa: E402,F401,F403
from kiln.ops.core_grad import *  # noqa: E402,F401,F403
from kiln.ops.core_creation import *  # noqa: E402,F401,F403
from kiln.ops.core_fallback import *  # noqa: E402,F401,F403
from kiln.ops.core_scan import *  # noqa: E402,F401,F403
from kiln.ops.core_pool import *  # noqa: E402,F401,F403
from kiln.ops.core_mutation import *  # noqa: E402,F401,F403
from kiln.ops.core_einsum import *  # noqa: E402,F401,F403
from kiln.ops.core_view_dtype import *  # noqa: E402,F401,F403
from kiln.ops.core_custom import *  # noqa: E402,F401,F403
from kiln.ops.core_autograd_function import *  # noqa: E402,F401,F403
from kiln.ops.core_number import *  # noqa: E402,F401,F403
from kiln.ops.core_nonzero import *  # noqa: E402,F401,F403

# Ops whose every rule (capture, meta, eager, decomposition, VJP, lowering, autocast,
# properties) sits in one file of their own, with the prim they decompose to.
from kiln.ops.op_add import add, sub  # noqa: E402,F401
from kiln.ops.op_exp import exp  # noqa: E402,F401
from kiln.ops.op_sum import sum  # noqa: E402,F401
from kiln.ops.op_mm import mm  # noqa: E402,F401
from kiln.ops.op_unary_math import log, rsqrt, sigmoid, sqrt, tanh  # noqa: E402,F401
