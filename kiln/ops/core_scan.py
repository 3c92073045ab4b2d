"""Core ops ``cumsum`` (a scan) and ``norm`` (a vector norm), each with its eager implementation,
meta rule, decomposition and VJP rule.

cumsum stays whole as the library prim ``prims.cumsum``: the wrapper calls torch for it between
kernels (one of the ops best left to ATen on every target until kiln generates scan kernels).
norm decomposes to abs, pow, reductions and sqrt, computed in fp32 for fp16/bf16 inputs.
"""
from __future__ import annotations

import builtins
import math

import torch

from kiln.meta.tensor_meta import TensorMeta
from kiln.ops import prims
from kiln.ops.core_reductions import _accum_dtype, _out_shape, _reduce_dims
from kiln.ops.core_views import normalize_dim
from kiln.ops.prim_utils import to_dtype
from kiln.ops.registry import DECOMPOSITIONS, LOWERINGS, META_RULES, VJP_RULES, define, stage_api
from kiln.ops.vjp_utils import restore_reduced, zeros_like

L = stage_api("lowering")  # the lowering stage's builders, bound when it is imported


__all__ = ["cumsum", "cumprod", "cumprod_backward", "norm"]


class ScanError(TypeError):
    pass


# ------------------------------------------------------------------ cumsum
def _scan_dtype(in_dtype, dtype):
    if dtype is not None:
        return dtype
    return in_dtype if in_dtype.is_floating_point else torch.int64


def _cumsum_eager(x, dim, dtype=None):
    return torch.cumsum(x, dim, dtype=dtype)


cumsum = define("core", "cumsum", _cumsum_eager)


@META_RULES.register(cumsum)
def _cumsum_meta(x, dim, dtype=None):
    normalize_dim(dim, x.ndim, "cumsum")
    out = _scan_dtype(x.dtype, dtype)
    return TensorMeta.contiguous(x.shape, out, x.device, x.requires_grad and out.is_floating_point)


def _scan_decomp(prim, name):
    """A scan in its result dtype, carried in fp32 for fp16/bf16 (eager's CPU kernels carry the
    running value in fp32; its CUDA kernels carry it in the half type, which drifts over long
    scans: a 100k-element fp16 cumprod was off by 6.5 from the fp32 reference), rounded once."""
    def decomp(x, dim, dtype=None):
        out = _scan_dtype(x.dtype, dtype)
        acc = _accum_dtype(out)
        scanned = prim(to_dtype(to_dtype(x, out), acc), normalize_dim(dim, x.ndim, name))
        return to_dtype(scanned, out)
    return decomp


prim_cumsum = define("prims", "cumsum", lambda x, dim: torch.cumsum(x, dim), library=True,
                     doc="inclusive prefix sum along dim, called through torch")
META_RULES[prim_cumsum] = lambda x, dim: TensorMeta.contiguous(x.shape, x.dtype, x.device, x.requires_grad)
LOWERINGS[prim_cumsum] = L.extern_rule
DECOMPOSITIONS[cumsum] = _scan_decomp(prim_cumsum, "cumsum")


# ------------------------------------------------------------------ cumprod
def _cumprod_eager(x, dim, dtype=None):
    return torch.cumprod(x, dim, dtype=dtype)


cumprod = define("core", "cumprod", _cumprod_eager)


@META_RULES.register(cumprod)
def _cumprod_meta(x, dim, dtype=None):
    normalize_dim(dim, x.ndim, "cumprod")
    out = _scan_dtype(x.dtype, dtype)
    return TensorMeta.contiguous(x.shape, out, x.device, x.requires_grad and out.is_floating_point)


prim_cumprod = define("prims", "cumprod", lambda x, dim: torch.cumprod(x, dim), library=True,
                      doc="inclusive prefix product along dim, called through torch")
META_RULES[prim_cumprod] = lambda x, dim: TensorMeta.contiguous(x.shape, x.dtype, x.device, x.requires_grad)
LOWERINGS[prim_cumprod] = L.extern_rule
DECOMPOSITIONS[cumprod] = _scan_decomp(prim_cumprod, "cumprod")


def _cumprod_backward_eager(g, x, dim):
    """torch's own gradient of cumprod (its rule handles zeros in x, which dividing the
    reversed cumsum of g * out by x does not), through autograd on a recomputed forward."""
    with torch.enable_grad():
        xx = x.detach().requires_grad_()
        return torch.autograd.grad(torch.cumprod(xx, dim), xx, g)[0]


cumprod_backward = define("core", "cumprod_backward", _cumprod_backward_eager, differentiable=False)
prim_cumprod_backward = define("prims", "cumprod_backward", _cumprod_backward_eager, library=True)
for _op in (cumprod_backward, prim_cumprod_backward):
    META_RULES[_op] = lambda g, x, dim: TensorMeta.contiguous(x.shape, x.dtype, x.device, False)
LOWERINGS[prim_cumprod_backward] = L.extern_rule
DECOMPOSITIONS[cumprod_backward] = prim_cumprod_backward


@VJP_RULES.register(cumprod)
def _cumprod_vjp(g, out, x, dim, dtype=None):
    from kiln.ops import core
    d = normalize_dim(dim, x.ndim, "cumprod")
    xs = core.to_dtype(x, out.dtype) if x.dtype != out.dtype else x
    gx = cumprod_backward(core.to_dtype(g, out.dtype) if g.dtype != out.dtype else g, xs, d)
    return (core.to_dtype(gx, x.dtype) if gx.dtype != x.dtype else gx), None, None


@VJP_RULES.register(cumsum)
def _cumsum_vjp(g, out, x, dim, dtype=None):
    from kiln.ops import core
    d = normalize_dim(dim, x.ndim, "cumsum")
    if x.ndim == 0:
        return g, None, None
    return core.flip(core.cumsum(core.flip(g, (d,)), d), (d,)), None, None


# ------------------------------------------------------------------ norm
def _norm_eager(x, p=2.0, dims=None, keepdim=False, dtype=None):
    dims = _reduce_dims(x, dims, "norm")
    return torch.linalg.vector_norm(x, p, dims, keepdim, dtype=dtype)


norm = define("core", "norm", _norm_eager)


@META_RULES.register(norm)
def _norm_meta(x, p=2.0, dims=None, keepdim=False, dtype=None):
    if not x.dtype.is_floating_point:
        raise ScanError(f"[meta] core.norm: expected a floating point input, got {x.dtype}")
    if dtype is not None and not dtype.is_floating_point:
        raise ScanError(f"[meta] core.norm: dtype must be floating point, got {dtype}")
    dims = _reduce_dims(x, dims, "norm")
    out = dtype or x.dtype
    if p < 0 or math.isinf(p):
        empty = [d for d in dims if x.shape[d] == 0] or ([] if x.numel() else [0])
        if empty and x.ndim:
            raise ScanError(f"[meta] core.norm: the norm of order {p} of an empty slice is undefined")
    return TensorMeta.contiguous(_out_shape(x, dims, keepdim), out, x.device, x.requires_grad)


def _finish(r, x, dims, keepdim):
    return prims.reshape(r, _out_shape(x, dims, True)) if keepdim and dims else r


@DECOMPOSITIONS.register(norm)
def _norm_decomp(x, p=2.0, dims=None, keepdim=False, dtype=None):
    dims = _reduce_dims(x, dims, "norm")
    out = dtype or x.dtype
    acc = _accum_dtype(out)
    a = prims.abs(to_dtype(x, acc))
    if not dims:
        r = prims.ne(a, 0.0) if p == 0 else a
        return to_dtype(to_dtype(r, acc), out)
    if p == math.inf:
        r = prims.amax(a, dims)
    elif p == -math.inf:
        r = prims.amin(a, dims)
    elif p == 0:
        r = prims.sum(to_dtype(prims.ne(a, 0.0), acc), dims)
    elif p == 1:
        r = prims.sum(a, dims)
    elif p == 2:
        r = prims.sqrt(prims.sum(prims.mul(a, a), dims))
    else:
        r = prims.pow(prims.sum(prims.pow(a, float(p)), dims), 1.0 / p)
    return _finish(to_dtype(r, out), x, dims, keepdim)


@VJP_RULES.register(norm)
def _norm_vjp(g, out, x, p=2.0, dims=None, keepdim=False, dtype=None):
    from kiln.ops import core
    dims = _reduce_dims(x, dims, "norm")
    if p == 0:
        return (zeros_like(x),) + (None,) * 4
    gx = restore_reduced(g, x, dims) if dims else g
    n = restore_reduced(out, x, dims) if dims else out
    sign = core.sign(x)
    if p == 1:
        local = sign
    elif builtins.abs(p) == math.inf:
        hit = core.to_dtype(core.eq(core.abs(x), n), x.dtype)
        count = restore_reduced(core.sum(hit, dims, True), x, dims) if dims else hit
        local = core.div(core.mul(sign, hit), count)
    elif p == 2:
        local = core.where(core.eq(n, 0), 0.0, core.div(x, n))
    else:
        ratio = core.pow(core.div(core.abs(x), n), p - 1)
        local = core.where(core.eq(n, 0), 0.0, core.mul(sign, ratio))
    return (core.mul(gx, local),) + (None,) * 4
