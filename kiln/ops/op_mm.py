"""mm: every rule of ``core.mm`` and of the library prim it decomposes to, ``prims.mm``, in one
file.

    capture        torch.mm(a, b), a.mm(b) (two 2-D tensors; torch.matmul and ``@`` are
                   ``core.matmul``, ops/core_nn.py)
    core.mm        eager torch.mm; meta: [n, k] @ [k, m] -> contiguous [n, m], one dtype
    decomposition  prims.mm itself (kept whole: a library call)
    VJP            grad_a = g @ b^T, grad_b = a^T @ g
    prims.mm       a library prim: lowering keeps it whole as an extern call (cuBLAS/MKL)
    lowering       ``inductor/pad_gemm.gemm_rule``: realize the operands in a layout the
                   library takes (padding awkward sizes on CUDA), then one extern call
    autocast       the autocast dtype on CPU and CUDA (torch's lower-precision list)
    properties     prims.mm: a library prim whose result is always a fresh row-major tensor
                   (``fresh_result``, ``exact_layout``: the wrapper neither guards its layout
                   nor treats it as a view); core.mm: eager's result is contiguous whatever
                   the operands' layouts (``eager_layout``); never recomputed in a backward

The rules that need a stage's helpers reach them through stage handles (``registry.stage_api``),
bound when the stage is imported: this file imports no stage.
"""
from __future__ import annotations

import torch

from kiln.graph.proxy import Proxy
from kiln.meta.tensor_meta import TensorMeta, contiguous_strides
from kiln.ops import core
from kiln.ops.autocast import LOWER
from kiln.ops.core import CoreOpError
from kiln.ops.prims import PrimError
from kiln.ops.registry import (CAPTURE_FUNCTIONS, CAPTURE_METHODS, DECOMPOSITIONS, LOWERINGS,
                               META_RULES, VJP_RULES, define, stage_api)

G = stage_api("pad_gemm")  # inductor/pad_gemm.py
C = stage_api("capture")   # capture/torch_api.py (Unsupported)

__all__ = ["mm", "prim_mm", "prim_mm_compact"]

# ------------------------------------------------------------------ prims.mm
def _mm_wrapper_call(inputs, args, kwargs, bound=None):
    """``a @ w.t()`` as ``torch.nn.functional.linear(a, w)`` where the second operand is the
    transpose of the tensor bound to its buffer (a Linear's weight): one Python call where the
    view and the product were two (each a dispatcher call, 2-5 us with caches cold between
    kernels; T5's forward made 33). ``linear`` of a 2-D input without bias is ``mm(a, w.t())``
    in ATen, the same library call. ``bound(name)``: the (shape, stride) of the tensor that
    name holds in the wrapper."""
    if kwargs or len(inputs) != 2 or bound is None:
        return None
    b = inputs[1]
    if not hasattr(b, "buffer") or b.offset != 0 or len(b.shape) != 2:
        return None
    shape, stride = bound(b.buffer)
    if len(shape) != 2 or tuple(b.shape) != (shape[1], shape[0]) or tuple(b.stride) != (stride[1], stride[0]):
        return None
    return f"torch.nn.functional.linear({args[0]}, {b.buffer})"


prim_mm = define("prims", "mm", torch.mm, library=True, fresh_result=True, exact_layout=True,
                 wrapper_call=_mm_wrapper_call)


@META_RULES.register(prim_mm)
def _prim_mm_meta(a, b):
    if a.ndim != 2 or b.ndim != 2 or a.shape[1] != b.shape[0]:
        raise PrimError(f"[meta] prims.mm: cannot multiply {list(a.shape)} by {list(b.shape)}")
    if a.dtype != b.dtype:
        raise PrimError(f"[meta] prims.mm: dtypes differ ({a.dtype} vs {b.dtype})")
    shape = (a.shape[0], b.shape[1])
    return TensorMeta(shape, contiguous_strides(shape), a.dtype, a.device,
                      a.requires_grad or b.requires_grad)


LOWERINGS[prim_mm] = G.gemm_rule


# ------------------------------------------------------------------ prims.mm_compact
def _mm_compact_eager(bias, a, b, n, rows):
    """``(bias +) a @ b`` of a padded ``b`` ([K, N2], N2 > n), as a compact [M, n] tensor: the
    product runs ``rows`` rows at a time into one [rows, N2] scratch (the aligned GEMM), each
    chunk's first n columns copied out. The whole padded product and its compact copy are
    never alive together: GPT-2's LM head held both, two 393 MiB logits."""
    m = a.shape[0]
    out = torch.empty((m, n), dtype=a.dtype, device=a.device)
    scratch = torch.empty((min(rows, m), b.shape[1]), dtype=a.dtype, device=a.device)
    for r in range(0, m, rows):
        k = min(rows, m - r)
        part = scratch[:k]
        if bias is None:
            torch.mm(a[r:r + k], b, out=part)
        else:
            torch.addmm(bias, a[r:r + k], b, out=part)
        out[r:r + k].copy_(part[:, :n])
    return out


# made by lowering only (pad_gemm.gemm_rule), never captured: a library prim with a compact result
prim_mm_compact = define("prims", "mm_compact", _mm_compact_eager, library=True, fresh_result=True,
                         exact_layout=True, differentiable=False)


@META_RULES.register(prim_mm_compact)
def _prim_mm_compact_meta(bias, a, b, n, rows):
    if a.ndim != 2 or b.ndim != 2 or a.shape[1] != b.shape[0] or not 0 < n <= b.shape[1] or rows < 1:
        raise PrimError(f"[meta] prims.mm_compact: {list(a.shape)} by {list(b.shape)}, n={n}, rows={rows}")
    return TensorMeta.contiguous((a.shape[0], n), a.dtype, a.device)

# ------------------------------------------------------------------ core.mm
mm = define("core", "mm", torch.mm, eager_layout="contiguous", autocast={"cpu": LOWER, "cuda": LOWER})


@META_RULES.register(mm)
def _mm_meta(a, b):
    if a.ndim != 2 or b.ndim != 2 or a.shape[1] != b.shape[0]:
        raise CoreOpError(f"[meta] core.mm: cannot multiply {list(a.shape)} by {list(b.shape)}")
    if a.dtype != b.dtype:
        raise CoreOpError(f"[meta] core.mm: dtypes differ ({a.dtype} vs {b.dtype})")
    return TensorMeta.contiguous((a.shape[0], b.shape[1]), a.dtype, a.device,
                                 a.requires_grad or b.requires_grad)


@DECOMPOSITIONS.register(mm)
def _mm_decomposition(a, b):
    return prim_mm(a, b)


@VJP_RULES.register(mm)
def _mm_vjp(g, out, a, b):
    return core.mm(g, core.transpose(b, 0, 1)), core.mm(core.transpose(a, 0, 1), g)


# ------------------------------------------------------------------ capture
def _capture_mm(input, other, *, out=None):
    if out is not None:
        raise C.Unsupported("matmul(out=...) is not supported")
    if not (isinstance(input, Proxy) and isinstance(other, Proxy)) or input.ndim != 2 or other.ndim != 2:
        raise C.Unsupported("matmul is only supported for two 2-D tensors (core.mm)")
    return mm(input, other)


CAPTURE_FUNCTIONS[torch.mm] = _capture_mm
CAPTURE_METHODS["mm"] = _capture_mm
