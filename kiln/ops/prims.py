"""Prims: the vocabulary lowering consumes.

Prims do no implicit broadcasting and no type promotion: tensor operands of an elementwise prim
have one shape and one dtype, and a Python scalar operand is read in that dtype. Library ops
(``mm``) are prims too, kept whole so the backend can call cuBLAS/MKL.

Each prim is defined with its eager implementation, and its meta rule and lowering sit right
below it.
"""
from __future__ import annotations

import builtins  # core and prims define ops named sum, any, all, abs: use builtins.* here

import torch

from kiln.meta.tensor_meta import TensorMeta, contiguous_strides, view_strides
from kiln.ops.registry import LOWERINGS, META_RULES, define, lookup, stage_api

L = stage_api("lowering")  # the lowering stage's builders, bound when it is imported
_pad_gemm = stage_api("pad_gemm")


def _prim(name, eager, **kw):
    return define("prims", name, eager, **kw)


class PrimError(TypeError):
    pass


def _tensors(args):
    return [a for a in args if isinstance(a, TensorMeta)]


def _elementwise_meta(name, out_dtype=None):
    def rule(*args):
        ts = _tensors(args)
        if not ts:
            raise PrimError(f"[meta] prims.{name}: needs at least one tensor operand")
        first = ts[0]
        for t in ts[1:]:
            if t.shape != first.shape:
                raise PrimError(f"[meta] prims.{name}: operand shapes differ {first.shape} vs "
                                f"{t.shape}; prims do not broadcast (use broadcast_in_dim)")
            if t.dtype != first.dtype:
                raise PrimError(f"[meta] prims.{name}: operand dtypes differ {first.dtype} vs "
                                f"{t.dtype}; prims do not promote (use convert_element_type)")
        return TensorMeta.contiguous(first.shape, out_dtype or first.dtype, first.device,
                                     builtins.any(t.requires_grad for t in ts))
    return rule


def _where_meta(pred, a, b):
    ts = _tensors((pred, a, b))
    shape = ts[0].shape
    for t in ts:
        if t.shape != shape:
            raise PrimError(f"[meta] prims.where: operand shapes differ ({t.shape} vs {shape})")
    if isinstance(pred, TensorMeta) and pred.dtype != torch.bool:
        raise PrimError(f"[meta] prims.where: predicate must be bool, got {pred.dtype}")
    vals = _tensors((a, b))
    if len(vals) == 2 and vals[0].dtype != vals[1].dtype:
        raise PrimError(f"[meta] prims.where: value dtypes differ ({vals[0].dtype} vs {vals[1].dtype})")
    if not vals:
        raise PrimError("[meta] prims.where: needs a tensor value operand")
    return TensorMeta.contiguous(shape, vals[0].dtype, ts[0].device, builtins.any(t.requires_grad for t in vals))


# ------------------------------------------------------------------ elementwise
def _unary(name, eager):
    op = _prim(name, eager)
    META_RULES[op] = _elementwise_meta(name)
    LOWERINGS[op] = L.pointwise(name)
    return op


def _binary(name, eager, out_dtype=None):
    op = _prim(name, eager)
    META_RULES[op] = _elementwise_meta(name, out_dtype)
    LOWERINGS[op] = L.pointwise(name)
    return op


neg = _unary("neg", torch.neg)
abs = _unary("abs", torch.abs)

mul = _binary("mul", torch.mul)
div = _binary("div", torch.true_divide)
maximum = _binary("maximum", lambda a, b: torch.maximum(a, torch.as_tensor(b, dtype=a.dtype))
                  if not isinstance(b, torch.Tensor) else torch.maximum(a, b))
minimum = _binary("minimum", lambda a, b: torch.minimum(a, torch.as_tensor(b, dtype=a.dtype))
                  if not isinstance(b, torch.Tensor) else torch.minimum(a, b))
eq = _binary("eq", torch.eq, torch.bool)
ne = _binary("ne", torch.ne, torch.bool)
lt = _binary("lt", torch.lt, torch.bool)
le = _binary("le", torch.le, torch.bool)
gt = _binary("gt", torch.gt, torch.bool)
ge = _binary("ge", torch.ge, torch.bool)

where = _prim("where", torch.where)
META_RULES[where] = _where_meta
LOWERINGS[where] = L.where_rule


def _convert_eager(x, dtype):
    return x.to(dtype)


convert_element_type = _prim("convert_element_type", _convert_eager)


@META_RULES.register(convert_element_type)
def _convert_meta(x, dtype):
    return TensorMeta.contiguous(x.shape, dtype, x.device, x.requires_grad and dtype.is_floating_point)


LOWERINGS[convert_element_type] = L.convert_rule


# ------------------------------------------------------------------ views and shapes
def _broadcast_in_dim_eager(x, shape, broadcast_dims):
    view_shape = [1] * len(shape)
    for k, d in enumerate(broadcast_dims):
        view_shape[d] = x.shape[k]
    return x.reshape(view_shape).expand(shape)


broadcast_in_dim = _prim("broadcast_in_dim", _broadcast_in_dim_eager)


@META_RULES.register(broadcast_in_dim)
def _broadcast_in_dim_meta(x, shape, broadcast_dims):
    shape = tuple(shape)
    if len(broadcast_dims) != x.ndim:
        raise PrimError(f"[meta] prims.broadcast_in_dim: {x.ndim} dims but broadcast_dims={broadcast_dims}")
    stride = [0] * len(shape)
    for k, d in enumerate(broadcast_dims):
        if x.shape[k] != shape[d] and x.shape[k] != 1:
            raise PrimError(f"[meta] prims.broadcast_in_dim: size {x.shape[k]} of dim {k} cannot "
                            f"become {shape[d]}")
        stride[d] = x.stride[k] if x.shape[k] == shape[d] else 0
    return TensorMeta(shape, stride, x.dtype, x.device, x.requires_grad)


LOWERINGS[broadcast_in_dim] = L.broadcast_in_dim_rule

permute = _prim("permute", torch.permute)


@META_RULES.register(permute)
def _permute_meta(x, dims):
    if sorted(dims) != list(range(x.ndim)):
        raise PrimError(f"[meta] prims.permute: {dims} is not a permutation of {x.ndim} dims")
    return TensorMeta([x.shape[d] for d in dims], [x.stride[d] for d in dims], x.dtype, x.device,
                      x.requires_grad)


LOWERINGS[permute] = L.permute_rule

reshape = _prim("reshape", torch.reshape)


@META_RULES.register(reshape)
def _reshape_meta(x, shape):
    shape = list(shape)
    if -1 in shape:
        known = 1
        for s in shape:
            if s != -1:
                known *= s
        shape[shape.index(-1)] = x.numel() // known if known else 0
    if x.numel() != TensorMeta.contiguous(shape, x.dtype, x.device).numel():
        raise PrimError(f"[meta] prims.reshape: cannot reshape {list(x.shape)} to {shape}")
    # torch's reshape is a view whenever the strides allow one (then later views index with
    # its strides), else a contiguous copy
    stride = view_strides(x.shape, x.stride, shape)
    if stride is None:
        return TensorMeta.contiguous(shape, x.dtype, x.device, x.requires_grad)
    return TensorMeta(tuple(shape), stride, x.dtype, x.device, x.requires_grad)


LOWERINGS[reshape] = L.reshape_rule


def _copy_eager(x):
    return x.clone(memory_format=torch.contiguous_format)


copy = _prim("copy", _copy_eager)


@META_RULES.register(copy)
def _copy_meta(x):
    return TensorMeta.contiguous(x.shape, x.dtype, x.device, x.requires_grad)


LOWERINGS[copy] = L.copy_rule


# ------------------------------------------------------------------ library ops
# prims.mm: ops/op_mm.py

# bias + a @ b in one library call: the bias rides in the GEMM's epilogue (cuBLASLt, MKL), as
# in torch's own F.linear, so a linear's result is never re-read just to add its bias
addmm = _prim("addmm", torch.addmm, library=True, fresh_result=True, exact_layout=True)


@META_RULES.register(addmm)
def _addmm_meta(bias, a, b):
    out = META_RULES[lookup("prims", "mm")](a, b)  # prims.mm's shape and dtype checks (ops/op_mm.py)
    if bias.ndim != 1 or bias.shape[0] != out.shape[1] or bias.dtype != out.dtype:
        raise PrimError(f"[meta] prims.addmm: bias {bias.dtype}{list(bias.shape)} does not fit a "
                        f"{out.dtype}{list(out.shape)} product")
    return out.with_(requires_grad=out.requires_grad or bias.requires_grad)


LOWERINGS[addmm] = _pad_gemm.gemm_rule


# Reductions live in their own file; they are all ``prims.<name>``.
from kiln.ops.prims_reductions import *  # noqa: E402,F401,F403
from kiln.ops.prims_more import *  # noqa: E402,F401,F403
from kiln.ops.prims_nn import *  # noqa: E402,F401,F403
from kiln.ops.core_custom import prim_custom_op as custom_op  # noqa: E402,F401


def __getattr__(name):
    """``prims.exp``, ``prims.sum``, ``prims.mm``: prims defined in their op's own file
    (ops/op_*.py, loaded after this module) are read from the registry, the namespace itself."""
    try:
        op = lookup("prims", name)
    except KeyError:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
    globals()[name] = op  # later reads skip this function
    return op
