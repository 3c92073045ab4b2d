"""Core reductions and the normalizations built from them, each with eager implementation,
meta rule and decomposition into reduction prims.

Half-precision inputs are reduced in float32 (as eager's kernels accumulate) and cast back.
"""
from __future__ import annotations

import builtins
import math

import torch

from kiln.meta.defaults import default_dtype
from kiln.meta.tensor_meta import TensorMeta
from kiln.ops import prims
from kiln.ops.core_views import normalize_dim
from kiln.ops.prim_utils import broadcast_to, to_dtype
from kiln.ops.registry import DECOMPOSITIONS, META_RULES, define

__all__ = ["mean", "amax", "amin", "prod", "argmax", "argmin", "any", "all", "var",
           "logsumexp", "softmax", "log_softmax", "max_dim", "min_dim"]

LOW = (torch.float16, torch.bfloat16)


def _reduce_dims(x, dims, op):
    if dims is None or (isinstance(dims, (tuple, list)) and len(dims) == 0 and op != "sum_empty"):
        return tuple(range(x.ndim))
    if isinstance(dims, int):
        dims = (dims,)
    dims = tuple(sorted(set(normalize_dim(d, x.ndim, op) for d in dims)))
    # a 0-d tensor's dim 0 (or -1) is the tensor itself: nothing is reduced, as in eager
    return () if x.ndim == 0 else dims


def _out_shape(x, dims, keepdim):
    if keepdim:
        return tuple(1 if d in dims else s for d, s in enumerate(x.shape))
    return tuple(s for d, s in enumerate(x.shape) if d not in dims)


def _meta(op, dtype_rule):
    def rule(x, dims=None, keepdim=False, dtype=None, **kw):
        dims = _reduce_dims(x, dims, op)
        out_dtype = dtype_rule(x.dtype, dtype)
        return TensorMeta.contiguous(_out_shape(x, dims, keepdim), out_dtype, x.device,
                                     x.requires_grad and out_dtype.is_floating_point)
    return rule


def _sum_dtype(in_dtype, dtype):
    if dtype is not None:
        return dtype
    return torch.int64 if (in_dtype == torch.bool or not (in_dtype.is_floating_point or in_dtype.is_complex)) else in_dtype


def _mean_dtype(in_dtype, dtype):
    out = dtype or in_dtype
    if not out.is_floating_point:
        raise TypeError(f"[meta] core.mean: mean of {in_dtype} needs a floating dtype")
    return out


def _same_dtype(in_dtype, dtype):
    return in_dtype


def _finish(r, x, dims, keepdim):
    """Reshape a prim reduction's output to the keepdim layout if asked."""
    if keepdim and dims:
        r = prims.reshape(r, _out_shape(x, dims, True))
    return r


def _reduce(prim, x, dims, keepdim):
    if not dims:  # a 0-d input reduces to a copy of itself (eager's result never aliases it)
        return prims.copy(x)
    return _finish(prim(x, dims), x, dims, keepdim)


def _accum_dtype(dtype):
    return torch.float32 if dtype in LOW else dtype


# ------------------------------------------------------------------ mean / prod (sum: ops/op_sum.py)
def _mean_eager(x, dims=None, keepdim=False, dtype=None):
    return torch.mean(x, dim=_reduce_dims(x, dims, "mean"), keepdim=keepdim, dtype=dtype)


mean = define("core", "mean", _mean_eager)
META_RULES[mean] = _meta("mean", _mean_dtype)


@DECOMPOSITIONS.register(mean)
def _mean_decomp(x, dims=None, keepdim=False, dtype=None):
    dims = _reduce_dims(x, dims, "mean")
    out_dtype = _mean_dtype(x.dtype, dtype)
    acc = _accum_dtype(out_dtype)
    n = math.prod(x.shape[d] for d in dims)
    s = _reduce(prims.sum, to_dtype(x, acc), dims, keepdim)
    return to_dtype(prims.div(s, float(n)), out_dtype)


def _prod_eager(x, dims=None, keepdim=False, dtype=None):
    dims = _reduce_dims(x, dims, "prod")
    out = x.to(_sum_dtype(x.dtype, dtype))
    for d in sorted(dims, reverse=True):
        out = torch.prod(out, dim=d, keepdim=keepdim)
    return out


prod = define("core", "prod", _prod_eager)
META_RULES[prod] = _meta("prod", _sum_dtype)


@DECOMPOSITIONS.register(prod)
def _prod_decomp(x, dims=None, keepdim=False, dtype=None):
    dims = _reduce_dims(x, dims, "prod")
    return _reduce(prims.prod, to_dtype(x, _sum_dtype(x.dtype, dtype)), dims, keepdim)


# ------------------------------------------------------------------ amax / amin / any / all
def _amax_eager(x, dims=None, keepdim=False):
    return torch.amax(x, dim=_reduce_dims(x, dims, "amax"), keepdim=keepdim)


def _amin_eager(x, dims=None, keepdim=False):
    return torch.amin(x, dim=_reduce_dims(x, dims, "amin"), keepdim=keepdim)


amax = define("core", "amax", _amax_eager)
amin = define("core", "amin", _amin_eager)


def _nonempty_meta(op):
    """amax/amin: eager raises IndexError when a reduced dim has no elements."""
    rule = _meta(op, _same_dtype)

    def meta(x, dims=None, keepdim=False, **kw):
        empty = [d for d in _reduce_dims(x, dims, op) if x.shape[d] == 0]
        if empty:
            raise IndexError(f"[meta] core.{op}: reduction dim {empty[0]} has no elements")
        return rule(x, dims, keepdim, **kw)
    return meta


META_RULES[amax] = _nonempty_meta("amax")
META_RULES[amin] = _nonempty_meta("amin")
DECOMPOSITIONS[amax] = lambda x, dims=None, keepdim=False: _reduce(prims.amax, x, _reduce_dims(x, dims, "amax"), keepdim)
DECOMPOSITIONS[amin] = lambda x, dims=None, keepdim=False: _reduce(prims.amin, x, _reduce_dims(x, dims, "amin"), keepdim)


def _any_eager(x, dims=None, keepdim=False):
    dims = _reduce_dims(x, dims, "any")
    out = x.bool()
    for d in sorted(dims, reverse=True):
        out = torch.any(out, dim=d, keepdim=keepdim)
    return out.to(torch.uint8) if x.dtype == torch.uint8 else out


def _all_eager(x, dims=None, keepdim=False):
    dims = _reduce_dims(x, dims, "all")
    out = x.bool()
    for d in sorted(dims, reverse=True):
        out = torch.all(out, dim=d, keepdim=keepdim)
    return out.to(torch.uint8) if x.dtype == torch.uint8 else out


# predicates and indices: nothing to differentiate
any = define("core", "any", _any_eager, differentiable=False)
all = define("core", "all", _all_eager, differentiable=False)
# eager's any/all return uint8 for a uint8 input (numpy's old convention), bool otherwise
META_RULES[any] = _meta("any", lambda d, dt: torch.uint8 if d == torch.uint8 else torch.bool)
META_RULES[all] = _meta("all", lambda d, dt: torch.uint8 if d == torch.uint8 else torch.bool)


@DECOMPOSITIONS.register(any)
def _any_decomp(x, dims=None, keepdim=False):
    return _uint8_like(x, _bool_reduce(prims.amax, x, _reduce_dims(x, dims, "any"), keepdim, False))


def _uint8_like(x, out):
    return to_dtype(out, torch.uint8) if x.dtype == torch.uint8 else out


def _bool_reduce(prim, x, dims, keepdim, identity):
    """any/all as max/min over bools; over an empty slice they are the identity."""
    if builtins.any(x.shape[d] == 0 for d in dims):
        shape = _out_shape(x, dims, keepdim)
        return prims.full(shape, identity, torch.bool, x.device)
    return _reduce(prim, to_dtype(x, torch.bool), dims, keepdim)


@DECOMPOSITIONS.register(all)
def _all_decomp(x, dims=None, keepdim=False):
    return _uint8_like(x, _bool_reduce(prims.amin, x, _reduce_dims(x, dims, "all"), keepdim, True))


# ------------------------------------------------------------------ argmax / argmin / max(dim)
def _arg_eager(fn):
    def run(x, dim=None, keepdim=False):
        return fn(x, dim=dim, keepdim=keepdim)
    return run


argmax = define("core", "argmax", _arg_eager(torch.argmax), differentiable=False)
argmin = define("core", "argmin", _arg_eager(torch.argmin), differentiable=False)


def _no_empty_dim(x, dim, op):
    """argmax/argmin/max(dim)/min(dim): eager raises IndexError over an empty dim, and over
    an empty tensor when no dim is given."""
    if dim is None and x.numel() == 0:
        raise IndexError(f"[meta] core.{op}: an empty tensor needs a reduction dim")
    if dim is not None and x.ndim and x.shape[normalize_dim(dim, x.ndim, op)] == 0:
        raise IndexError(f"[meta] core.{op}: reduction dim {dim} has no elements")


def _arg_meta(x, dim=None, keepdim=False):
    _no_empty_dim(x, dim, "argmax")
    if dim is None:
        shape = (1,) * x.ndim if keepdim else ()
    else:
        d = normalize_dim(dim, x.ndim, "argmax")
        shape = _out_shape(x, (d,), keepdim)
    return TensorMeta.contiguous(shape, torch.int64, x.device)


META_RULES[argmax] = META_RULES[argmin] = _arg_meta


def _arg_decomp(prim):
    def decomp(x, dim=None, keepdim=False):
        if dim is None:
            flat = prims.reshape(x, (x.numel(),)) if x.ndim != 1 else x
            r = prim(flat, (0,)) if x.ndim else prims.convert_element_type(prims.mul(x, 0), torch.int64)
            return prims.reshape(r, (1,) * x.ndim) if keepdim and x.ndim else r
        d = normalize_dim(dim, x.ndim, prim.name)
        if x.ndim == 0:
            return prims.convert_element_type(prims.mul(x, 0), torch.int64)
        return _finish(prim(x, (d,)), x, (d,), keepdim)
    return decomp


DECOMPOSITIONS[argmax] = _arg_decomp(prims.argmax)
DECOMPOSITIONS[argmin] = _arg_decomp(prims.argmin)


def _max_dim_eager(x, dim, keepdim=False):
    r = torch.max(x, dim=dim, keepdim=keepdim)
    return r.values, r.indices


def _min_dim_eager(x, dim, keepdim=False):
    r = torch.min(x, dim=dim, keepdim=keepdim)
    return r.values, r.indices


max_dim = define("core", "max_dim", _max_dim_eager)
min_dim = define("core", "min_dim", _min_dim_eager)


def _minmax_dim_meta(x, dim, keepdim=False):
    _no_empty_dim(x, dim, "max")
    d = normalize_dim(dim, x.ndim, "max")
    shape = _out_shape(x, (d,), keepdim) if x.ndim else ()
    return (TensorMeta.contiguous(shape, x.dtype, x.device, x.requires_grad),
            TensorMeta.contiguous(shape, torch.int64, x.device))


META_RULES[max_dim] = META_RULES[min_dim] = _minmax_dim_meta
DECOMPOSITIONS[max_dim] = lambda x, dim, keepdim=False: (
    DECOMPOSITIONS[amax](x, (dim,), keepdim), _arg_decomp(prims.argmax)(x, dim, keepdim))
DECOMPOSITIONS[min_dim] = lambda x, dim, keepdim=False: (
    DECOMPOSITIONS[amin](x, (dim,), keepdim), _arg_decomp(prims.argmin)(x, dim, keepdim))


# ------------------------------------------------------------------ var / std
def _var_eager(x, dims=None, correction=1, keepdim=False):
    return torch.var(x, dim=_reduce_dims(x, dims, "var"), correction=correction, keepdim=keepdim)


var = define("core", "var", _var_eager)
META_RULES[var] = lambda x, dims=None, correction=1, keepdim=False: _meta("var", _mean_dtype)(x, dims, keepdim)


@DECOMPOSITIONS.register(var)
def _var_decomp(x, dims=None, correction=1, keepdim=False):
    dims = _reduce_dims(x, dims, "var")
    acc = _accum_dtype(x.dtype)
    xa = to_dtype(x, acc)
    n = math.prod(x.shape[d] for d in dims)
    mean_k = prims.div(_reduce(prims.sum, xa, dims, True), float(n))
    centered = prims.sub(xa, broadcast_to(mean_k, x.shape))
    sq = _reduce(prims.sum, prims.mul(centered, centered), dims, keepdim)
    return to_dtype(prims.div(sq, float(max(n - correction, 0))), x.dtype)


# ------------------------------------------------------------------ softmax family
def _stable_shift(xa, dims):
    """x - max(x) along dims, with an all -inf row kept finite (eager returns nan there too)."""
    m = _reduce(prims.amax, xa, dims, True)
    return prims.sub(xa, broadcast_to(m, xa.shape)), m


def _logsumexp_eager(x, dims, keepdim=False):
    return torch.logsumexp(x, dim=_reduce_dims(x, dims, "logsumexp"), keepdim=keepdim)


logsumexp = define("core", "logsumexp", _logsumexp_eager)
META_RULES[logsumexp] = _meta("logsumexp", lambda d, dt: d if d.is_floating_point else default_dtype())


@DECOMPOSITIONS.register(logsumexp)
def _logsumexp_decomp(x, dims, keepdim=False):
    dims = _reduce_dims(x, dims, "logsumexp")
    out_dtype = x.dtype if x.dtype.is_floating_point else torch.get_default_dtype()
    xa = to_dtype(x, _accum_dtype(out_dtype))
    if 0 in [x.shape[d] for d in dims]:  # an empty reduction: log(0) = -inf, no max to take
        return to_dtype(prims.log(_reduce(prims.sum, prims.exp(xa), dims, keepdim)), out_dtype)
    m = _reduce(prims.amax, xa, dims, True)
    # an infinite max (all -inf, or any +inf) must not turn into inf - inf = nan
    m = prims.where(prims.eq(prims.abs(m), float("inf")), 0.0, m)
    s = _reduce(prims.sum, prims.exp(prims.sub(xa, broadcast_to(m, xa.shape))), dims, keepdim)
    m_out = m if keepdim else prims.reshape(m, _out_shape(x, dims, False))
    return to_dtype(prims.add(prims.log(s), m_out), out_dtype)


def _softmax_eager(x, dim, dtype=None):
    return torch.softmax(x, dim, dtype=dtype)


def _log_softmax_eager(x, dim, dtype=None):
    return torch.log_softmax(x, dim, dtype=dtype)


softmax = define("core", "softmax", _softmax_eager, eager_layout="follows")
log_softmax = define("core", "log_softmax", _log_softmax_eager, eager_layout="follows")


def _softmax_meta(x, dim, dtype=None):
    normalize_dim(dim, x.ndim, "softmax")
    out = dtype or x.dtype
    if not out.is_floating_point:
        raise TypeError(f"[meta] core.softmax: needs a floating dtype, got {out}")
    return TensorMeta.contiguous(x.shape, out, x.device, x.requires_grad)


META_RULES[softmax] = META_RULES[log_softmax] = _softmax_meta


@DECOMPOSITIONS.register(softmax)
def _softmax_decomp(x, dim, dtype=None):
    out_dtype = dtype or x.dtype
    if x.ndim == 0:
        return to_dtype(prims.div(x, x), out_dtype)
    if x.numel() == 0:  # nothing to normalize: no reduction over an empty dim
        return prims.full(tuple(x.shape), 0.0, out_dtype, x.device)
    dims = (normalize_dim(dim, x.ndim, "softmax"),)
    xa = to_dtype(x, _accum_dtype(out_dtype))
    shifted, _ = _stable_shift(xa, dims)
    e = prims.exp(shifted)
    s = _reduce(prims.sum, e, dims, True)
    return to_dtype(prims.div(e, broadcast_to(s, x.shape)), out_dtype)


@DECOMPOSITIONS.register(log_softmax)
def _log_softmax_decomp(x, dim, dtype=None):
    out_dtype = dtype or x.dtype
    if x.ndim == 0:
        return to_dtype(prims.sub(x, x), out_dtype)
    if x.numel() == 0:  # nothing to normalize: no reduction over an empty dim
        return prims.full(tuple(x.shape), 0.0, out_dtype, x.device)
    dims = (normalize_dim(dim, x.ndim, "log_softmax"),)
    xa = to_dtype(x, _accum_dtype(out_dtype))
    shifted, _ = _stable_shift(xa, dims)
    s = _reduce(prims.sum, prims.exp(shifted), dims, True)
    return to_dtype(prims.sub(shifted, broadcast_to(prims.log(s), x.shape)), out_dtype)
