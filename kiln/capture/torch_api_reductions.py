"""Capture-table entries for reductions and the softmax family (merged into torch_api's
tables). Each adapter normalizes torch's overloads onto one core op."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from kiln.capture.errors import Unsupported
from kiln.graph import Proxy
from kiln.ops import core


def _dims(dim):
    if dim is None:
        return None
    if isinstance(dim, int):
        return (dim,)
    return tuple(dim)


def _no_out(name, out):
    if out is not None:
        raise Unsupported(f"{name}(out=...) is not supported")


def mean(input, dim=None, keepdim=False, *, dtype=None, out=None):
    _no_out("mean", out)
    return core.mean(input, _dims(dim), keepdim, dtype)


def prod(input, dim=None, keepdim=False, *, dtype=None, out=None):
    _no_out("prod", out)
    return core.prod(input, _dims(dim), keepdim, dtype)


def amax(input, dim=(), keepdim=False, *, out=None):
    _no_out("amax", out)
    return core.amax(input, _dims(dim) or None, keepdim)


def amin(input, dim=(), keepdim=False, *, out=None):
    _no_out("amin", out)
    return core.amin(input, _dims(dim) or None, keepdim)


def _minmax(reduce_all, with_dim, binary, result_type):
    def adapter(input, dim=None, keepdim=False, *, out=None):
        _no_out("max/min", out)
        if isinstance(dim, Proxy):  # torch.max(a, b): elementwise
            return binary(input, dim)
        if dim is None:
            return reduce_all(input, None, False)
        return result_type(with_dim(input, dim, keepdim))  # (values, indices), as eager's
    return adapter


def argmax(input, dim=None, keepdim=False, *, out=None):
    _no_out("argmax", out)
    return core.argmax(input, dim, keepdim)


def argmin(input, dim=None, keepdim=False, *, out=None):
    _no_out("argmin", out)
    return core.argmin(input, dim, keepdim)


def any_(input, dim=None, keepdim=False, *, out=None):
    _no_out("any", out)
    return core.any(input, _dims(dim), keepdim)


def all_(input, dim=None, keepdim=False, *, out=None):
    _no_out("all", out)
    return core.all(input, _dims(dim), keepdim)


def _correction(unbiased, correction):
    if correction is not None:
        return correction
    return 1 if unbiased in (None, True) else 0


def var(input, dim=None, unbiased=None, keepdim=False, *, correction=None, out=None):
    _no_out("var", out)
    if isinstance(dim, bool):  # var(input, unbiased)
        dim, unbiased = None, dim
    return core.var(input, _dims(dim), _correction(unbiased, correction), keepdim)


def std(input, dim=None, unbiased=None, keepdim=False, *, correction=None, out=None):
    return core.sqrt(var(input, dim, unbiased, keepdim, correction=correction, out=out))


def logsumexp(input, dim, keepdim=False, *, out=None):
    _no_out("logsumexp", out)
    return core.logsumexp(input, _dims(dim), keepdim)


def _softmax_like(op):
    def adapter(input, dim=None, _stacklevel=3, dtype=None):
        if dim is None:
            raise Unsupported(f"{op.name} without dim (implicit dim choice) is not supported")
        return op(input, dim, dtype)
    return adapter


def histogramdd(input, bins=10, *, range=None, weight=None, density=False):
    """One fallback node of the flat form (ops/core_fallback.py), torch's named tuple rebuilt."""
    if isinstance(bins, Proxy) or isinstance(bins, (list, tuple)) and not all(type(b) is int for b in bins):
        raise Unsupported("torch.histogramdd with tensor bins is not captured")
    if type(bins) is not int and not isinstance(bins, (list, tuple)):
        raise Unsupported(f"torch.histogramdd: bins={bins!r} is not captured")
    if torch.is_grad_enabled() and any(isinstance(t, Proxy) and t.meta.requires_grad for t in (input, weight)):
        raise Unsupported("torch.histogramdd of a tensor that requires grad is not captured")
    if range is not None:
        range = [float(r) for r in range]
    out = core.fallback("histogramdd_flat", input, bins if type(bins) is int else list(bins),
                        range=range, weight=weight, density=density)
    return torch.return_types.histogramdd((out[0], list(out[1:])))


FUNCTIONS = {
    torch.histogramdd: histogramdd,
    torch.mean: mean, torch.prod: prod, torch.amax: amax, torch.amin: amin,
    torch.max: _minmax(core.amax, core.max_dim, core.maximum, torch.return_types.max),
    torch.min: _minmax(core.amin, core.min_dim, core.minimum, torch.return_types.min),
    torch.argmax: argmax, torch.argmin: argmin, torch.any: any_, torch.all: all_,
    torch.var: var, torch.std: std, torch.logsumexp: logsumexp,
    torch.softmax: _softmax_like(core.softmax), torch.log_softmax: _softmax_like(core.log_softmax),
    F.softmax: _softmax_like(core.softmax), F.log_softmax: _softmax_like(core.log_softmax),
}

METHODS = {
    "mean": mean, "prod": prod, "amax": amax, "amin": amin,
    "max": _minmax(core.amax, core.max_dim, core.maximum, torch.return_types.max),
    "min": _minmax(core.amin, core.min_dim, core.minimum, torch.return_types.min),
    "argmax": argmax, "argmin": argmin, "any": any_, "all": all_, "var": var, "std": std,
    "logsumexp": logsumexp, "softmax": _softmax_like(core.softmax),
    "log_softmax": _softmax_like(core.log_softmax),
}
