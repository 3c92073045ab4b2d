"""sum: every rule of ``core.sum`` and of the prim it decomposes to, ``prims.sum``, in one file.

    capture        torch.sum(x, dim=None, keepdim=False, *, dtype=None), x.sum(...)
    core.sum       eager torch.sum; meta: the reduced shape, integers and bool sum in int64
                   unless ``dtype`` says otherwise; no dims (or ``()``) reduces every dim
    decomposition  cast to the result dtype, then prims.sum over the normalized dims and a
                   reshape for keepdim (a 0-d input: a copy, as eager never aliases it)
    VJP            the gradient broadcast back over the reduced dims
    prims.sum      reduce a tuple of dims, which disappear (no keepdim, no dtype)
    lowering       a ``sum`` reduction (inductor/lowering.reduction: a Reduction buffer, split
                   in two stages for few long rows); its spelling per backend is in the codegen
                   reduction tables
    autocast       float32 on CUDA unless ``dtype=`` is given (torch's fp32 list); CPU: as is
    properties     a reduction (prims.sum: ``reduction="sum"``); never recomputed in a backward

The rules that need a stage's helpers reach them through stage handles (``registry.stage_api``),
bound when the stage is imported: this file imports no stage.
"""
from __future__ import annotations

import torch

from kiln.ops.autocast import FP32
from kiln.ops.core_reductions import _meta, _reduce, _reduce_dims, _sum_dtype
from kiln.ops.prim_utils import to_dtype
from kiln.ops.prims_reductions import _reduction_meta
from kiln.ops.registry import (CAPTURE_FUNCTIONS, CAPTURE_METHODS, DECOMPOSITIONS, LOWERINGS,
                               META_RULES, VJP_RULES, define, stage_api)
from kiln.ops.vjp_utils import reduce_dims, restore_reduced

L = stage_api("lowering")  # inductor/lowering.py
C = stage_api("capture")   # capture/torch_api.py (Unsupported)

__all__ = ["sum", "prim_sum"]


# ------------------------------------------------------------------ prims.sum
def _prim_sum_eager(x, dims):
    return torch.sum(x, dim=tuple(dims), dtype=x.dtype)


prim_sum = define("prims", "sum", _prim_sum_eager, reduction="sum")
META_RULES[prim_sum] = _reduction_meta("sum")
LOWERINGS[prim_sum] = L.reduction("sum")


# ------------------------------------------------------------------ core.sum
def _sum_eager(x, dims=None, keepdim=False, dtype=None):
    dims = _reduce_dims(x, dims, "sum")
    if not dims:  # a 0-d input: a copy in the result dtype (eager's result never aliases it)
        return x.to(_sum_dtype(x.dtype, dtype)).clone()
    return torch.sum(x, dim=dims, keepdim=keepdim, dtype=dtype)


sum = define("core", "sum", _sum_eager, autocast={"cuda": FP32})
META_RULES[sum] = _meta("sum", _sum_dtype)


@DECOMPOSITIONS.register(sum)
def _sum_decomposition(x, dims=None, keepdim=False, dtype=None):
    dims = _reduce_dims(x, dims, "sum")
    out_dtype = _sum_dtype(x.dtype, dtype)
    return _reduce(prim_sum, to_dtype(x, out_dtype), dims, keepdim)


@VJP_RULES.register(sum)
def _sum_vjp(g, out, x, dims=None, keepdim=False, dtype=None):
    return (restore_reduced(g, x, reduce_dims(x, dims)), None, None, None)


# ------------------------------------------------------------------ capture
def _capture_sum(input, dim=None, keepdim=False, *, dtype=None, out=None):
    if out is not None:
        raise C.Unsupported("sum(out=...) is not supported")
    dims = None if dim is None else (dim,) if isinstance(dim, int) else tuple(dim)
    return sum(input, dims, keepdim, dtype)


CAPTURE_FUNCTIONS[torch.sum] = _capture_sum
CAPTURE_METHODS["sum"] = _capture_sum
