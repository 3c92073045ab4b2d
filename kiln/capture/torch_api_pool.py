"""Capture-table entries for pooling, interpolate, cumsum and norm (merged into torch_api's
tables). Variants the core ops do not cover (ceil_mode, dilation, return_indices, other
interpolation modes) stay whole as ``core.fallback`` nodes when no gradient is needed, and are
graph breaks otherwise."""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from kiln.capture.errors import Unsupported
from kiln.graph import Proxy
from kiln.ops import core


def _pair(v):
    if isinstance(v, (tuple, list)):
        return (v[0], v[0]) if len(v) == 1 else tuple(v)  # [3] is (3, 3), as in eager
    return (v, v)


def _whole(name, why, input, *args, torch_fn=None, **kwargs):
    """An uncovered variant: a fallback node. Where a gradient is needed, ``torch_fn`` (a
    C++-bound torch function taking these arguments) is one whose backward the fallback
    replays with torch's autograd (EfficientNet's ``avg_pool2d(ceil_mode=True)`` in training);
    without one, or where the fallback refuses to replay it, the call is a graph break."""
    if isinstance(input, Proxy) and input.meta.requires_grad:
        if torch_fn is None:
            raise Unsupported(f"{name}: {why} needs a gradient, and no torch function replays it")
        from kiln.capture.fallback import fallback_adapter  # fallback reaches the capture tables
        adapter, reason = fallback_adapter(torch_fn, name)
        if adapter is None:
            raise Unsupported(f"{name}: {why} needs a gradient ({reason})")
        return adapter(input, *args, **kwargs)
    return core.fallback(name, input, *args, **kwargs)


def max_pool2d(input, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False,
               return_indices=False):
    if ceil_mode or _pair(dilation) != (1, 1) or return_indices:
        if return_indices:
            return _whole("torch.nn.functional.max_pool2d", "return_indices", input, kernel_size,
                          stride, padding, dilation, ceil_mode, return_indices)
        return _whole("torch.nn.functional.max_pool2d", "ceil_mode/dilation", input, kernel_size,
                      stride if stride is not None else [], padding, dilation, ceil_mode,
                      torch_fn=torch.max_pool2d)
    k = _pair(kernel_size)
    return core.max_pool2d(input, k, _pair(stride) if stride else k, _pair(padding))


def avg_pool2d(input, kernel_size, stride=None, padding=0, ceil_mode=False, count_include_pad=True,
               divisor_override=None):
    if ceil_mode:
        return _whole("torch.nn.functional.avg_pool2d", "ceil_mode", input, kernel_size, stride,
                      padding, ceil_mode, count_include_pad, divisor_override,
                      torch_fn=torch._C._nn.avg_pool2d)
    k = _pair(kernel_size)
    return core.avg_pool2d(input, k, _pair(stride) if stride else k, _pair(padding),
                           count_include_pad, divisor_override)


def adaptive_avg_pool2d(input, output_size):
    size = _pair(output_size)
    size = tuple(input.shape[-2 + i] if s is None else s for i, s in enumerate(size))
    return core.adaptive_avg_pool2d(input, size)


def interpolate(input, size=None, scale_factor=None, mode="nearest", align_corners=None,
                recompute_scale_factor=None, antialias=False):
    if mode not in ("nearest", "bilinear") or antialias or input.ndim != 4 \
            or (size is None) == (scale_factor is None):
        return _whole("torch.nn.functional.interpolate", f"interpolate(mode={mode!r})", input, size,
                      scale_factor, mode, align_corners, recompute_scale_factor, antialias)
    if size is not None:
        out, scales = _pair(size), (None, None)
    else:
        scales = tuple(float(s) for s in _pair(scale_factor))
        out = tuple(math.floor(n * s) for n, s in zip(input.shape[-2:], scales))
        if recompute_scale_factor:
            scales = (None, None)
    return core.interpolate(input, tuple(int(o) for o in out), scales, mode, bool(align_corners))


def cumsum(input, dim, *, dtype=None, out=None):
    if out is not None:
        raise Unsupported("cumsum(out=...) is not supported")
    return core.cumsum(input, dim, dtype)


def cumprod(input, dim, *, dtype=None, out=None):
    if out is not None:
        raise Unsupported("cumprod(out=...) is not supported")
    return core.cumprod(input, dim, dtype)


def _dims(dim):
    return None if dim is None else (dim,) if isinstance(dim, int) else tuple(dim)


def norm(input, p="fro", dim=None, keepdim=False, out=None, dtype=None):
    if out is not None:
        raise Unsupported("norm(out=...) is not supported")
    if p == "fro":
        p = 2.0
    if isinstance(p, str):
        return _whole("torch.norm", f"norm(p={p!r})", input, p, dim, keepdim, dtype=dtype)
    return core.norm(input, float(p), _dims(dim), keepdim, dtype)


def vector_norm(x, ord=2, dim=None, keepdim=False, *, dtype=None, out=None):
    if out is not None:
        raise Unsupported("vector_norm(out=...) is not supported")
    return core.norm(x, float(ord), _dims(dim), keepdim, dtype)


def adaptive_avg_pool1d(input, output_size):
    """Over the last dim: the 2-d pool of a height-1 view (as torch computes it)."""
    (size,) = output_size if isinstance(output_size, (tuple, list)) else (output_size,)
    out = core.adaptive_avg_pool2d(core.unsqueeze(input, -2), (1, input.shape[-1] if size is None else size))
    return core.squeeze(out, -2)


FUNCTIONS = {
    F.adaptive_avg_pool1d: adaptive_avg_pool1d,
    F.max_pool2d: max_pool2d, torch.max_pool2d: max_pool2d,
    F.avg_pool2d: avg_pool2d,
    F.adaptive_avg_pool2d: adaptive_avg_pool2d, F.interpolate: interpolate,
    torch._C._nn.adaptive_avg_pool2d: adaptive_avg_pool2d,  # F's builtin (same signature)
    torch.cumsum: cumsum, torch.cumprod: cumprod, torch.norm: norm, torch.linalg.vector_norm: vector_norm,
}

METHODS = {"cumsum": cumsum, "cumprod": cumprod, "norm": norm}
