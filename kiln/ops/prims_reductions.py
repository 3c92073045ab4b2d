"""Reduction prims: reduce over a tuple of dims, which disappear from the output (no keepdim,
no dtype argument: decompositions convert first and broadcast after)."""
from __future__ import annotations

import torch

from kiln.meta.tensor_meta import TensorMeta
from kiln.ops.registry import LOWERINGS, META_RULES, define, stage_api

L = stage_api("lowering")  # the lowering stage's builders, bound when it is imported


__all__ = ["prod", "amax", "amin", "argmax", "argmin"]


def _dims(x, dims, name):
    dims = tuple(sorted(set(d % max(x.ndim, 1) for d in dims)))
    if not dims:
        raise TypeError(f"[meta] prims.{name}: needs at least one dim to reduce")
    return dims


def _reduction_meta(name, out_dtype=None, single=False):
    def rule(x, dims):
        dims = _dims(x, dims, name)
        if single and len(dims) != 1:
            raise TypeError(f"[meta] prims.{name}: reduces exactly one dim, got {dims}")
        for d in dims:
            if x.shape[d] == 0 and name not in ("sum", "prod"):
                raise ValueError(f"[meta] prims.{name}: cannot reduce an empty dim {d}")
        shape = [s for d, s in enumerate(x.shape) if d not in dims]
        dtype = out_dtype or x.dtype
        return TensorMeta.contiguous(shape, dtype, x.device, x.requires_grad and dtype.is_floating_point)
    return rule


def _eager(fn):
    def run(x, dims):
        return fn(x, tuple(dims))
    return run


def _prod_eager(x, dims):
    out = x
    for d in sorted(dims, reverse=True):
        out = torch.prod(out, dim=d, dtype=x.dtype)
    return out


def _arg_eager(fn):
    def run(x, dims):
        (d,) = dims
        return fn(x, dim=d)
    return run


# reduction=: the loop IR's reduction kind (prims.sum's rules are in ops/op_sum.py)
prod = define("prims", "prod", _prod_eager, reduction="prod")
amax = define("prims", "amax", _eager(lambda x, d: torch.amax(x, dim=d)), reduction="max")
amin = define("prims", "amin", _eager(lambda x, d: torch.amin(x, dim=d)), reduction="min")
argmax = define("prims", "argmax", _arg_eager(torch.argmax), reduction="argmax")
argmin = define("prims", "argmin", _arg_eager(torch.argmin), reduction="argmin")

for _op in (prod, amax, amin, argmax, argmin):
    single = _op.reduction in ("argmax", "argmin")
    META_RULES[_op] = _reduction_meta(_op.name, torch.int64 if single else None, single)
    LOWERINGS[_op] = L.reduction(_op.reduction)
