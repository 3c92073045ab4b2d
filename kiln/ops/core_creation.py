"""Core creation ops: full (zeros, ones, empty, *_like), arange, linspace, eye, randn, randint.

They take no tensor argument, so inside a graph build they record into the active graph
(``Graph.inherit``). Each decomposes to ``prims.full``, ``prims.iota`` and pointwise prims, so
the values are computed inside the consuming kernel and never stored.
"""
from __future__ import annotations

import math

import torch

from kiln.meta.tensor_meta import TensorMeta
from kiln.ops import prims
from kiln.ops.prim_utils import to_dtype
from kiln.ops.promotion import no_kernel
from kiln.ops.registry import DECOMPOSITIONS, META_RULES, define

# creation ops make fresh contiguous tensors that never require grad
_CREATION = {"eager_layout": "contiguous", "differentiable": False}

__all__ = ["full", "arange", "linspace", "eye", "randn", "randint"]


def _device(device):
    return torch.device(device) if device is not None else torch.device("cpu")


def _full_eager(shape, value, dtype, device):
    return torch.full(tuple(shape), value, dtype=dtype, device=device)


full = define("core", "full", _full_eager, **_CREATION)
META_RULES[full] = lambda shape, value, dtype, device: TensorMeta.contiguous(tuple(shape), dtype, _device(device))
DECOMPOSITIONS[full] = lambda shape, value, dtype, device: prims.full(tuple(shape), value, dtype, _device(device))


from kiln.ops.promotion import _is_symint as is_symint  # noqa: E402


def arange_length(start, end, step) -> int:
    if step == 0:
        raise ValueError("[meta] core.arange: step must be nonzero")
    if any(is_symint(v) for v in (start, end, step)) and \
            all(isinstance(v, int) or is_symint(v) for v in (start, end, step)):
        # ceil((end - start) / step) on ints, symbolic; the numerator is never negative for a
        # valid range (kernels print floor division as C's, which truncates)
        length = (end - start + step - 1) // step if step > 0 else (start - end - step - 1) // (-step)
    else:
        length = math.ceil((end - start) / step)
    if length < 0:
        raise ValueError(f"[meta] core.arange: upper bound and step sign are inconsistent "
                         f"(start={start}, end={end}, step={step})")
    return length


def _arange_eager(start, end, step, dtype, device):
    return torch.arange(start, end, step, dtype=dtype, device=device)


arange = define("core", "arange", _arange_eager, **_CREATION)
META_RULES[arange] = lambda start, end, step, dtype, device: TensorMeta.contiguous(
    (arange_length(start, end, step),), dtype, _device(device))


@DECOMPOSITIONS.register(arange)
def _arange_decomp(start, end, step, dtype, device):
    n = arange_length(start, end, step)
    if all(isinstance(v, int) or is_symint(v) for v in (start, step)) and not dtype.is_floating_point:
        return prims.iota(n, start, step, dtype, _device(device))
    # torch computes start + i * step in double for float ranges, then casts
    i = prims.iota(n, 0, 1, torch.int64, _device(device))
    return to_dtype(prims.add(prims.mul(to_dtype(i, torch.float64), float(step)), float(start)), dtype)


def _linspace_eager(start, end, steps, dtype, device):
    return torch.linspace(start, end, steps, dtype=dtype, device=device)


linspace = define("core", "linspace", _linspace_eager, **_CREATION)
META_RULES[linspace] = lambda start, end, steps, dtype, device: TensorMeta.contiguous((steps,), dtype, _device(device))


@DECOMPOSITIONS.register(linspace)
def _linspace_decomp(start, end, steps, dtype, device):
    dev = _device(device)
    if steps == 1:
        return prims.full((1,), start, dtype, dev)
    acc = torch.float64 if dtype == torch.float64 else torch.float32
    step = (end - start) / (steps - 1)
    i = to_dtype(prims.iota(steps, 0, 1, torch.int64, dev), acc)
    # the first half counts up from start, the second half down from end (torch's formula)
    up = prims.add(prims.mul(i, step), float(start))
    down = prims.sub(float(end), prims.mul(prims.sub(float(steps - 1), i), step))
    halfway = steps // 2
    return to_dtype(prims.where(prims.lt(i, float(halfway)), up, down), dtype)


def _eye_eager(n, m, dtype, device):
    return torch.eye(n, m, dtype=dtype, device=device)


eye = define("core", "eye", _eye_eager, **_CREATION)
META_RULES[eye] = lambda n, m, dtype, device: TensorMeta.contiguous((n, m), dtype, _device(device))


@DECOMPOSITIONS.register(eye)
def _eye_decomp(n, m, dtype, device):
    dev = _device(device)
    rows = prims.broadcast_in_dim(prims.iota(n, 0, 1, torch.int64, dev), (n, m), (0,))
    cols = prims.broadcast_in_dim(prims.iota(m, 0, 1, torch.int64, dev), (n, m), (1,))
    return to_dtype(prims.eq(rows, cols), dtype)


def _randn_eager(shape, dtype, device):
    return torch.randn(tuple(shape), dtype=dtype, device=device)


randn = define("core", "randn", _randn_eager, random=True, **_CREATION)


@META_RULES.register(randn)
def _randn_meta(shape, dtype, device):
    if not dtype.is_floating_point:
        raise no_kernel(dtype, "normal_kernel_cpu")  # eager draws floats only
    return TensorMeta.contiguous(tuple(shape), dtype, _device(device))


@DECOMPOSITIONS.register(randn)
def _randn_decomp(shape, dtype, device):
    # Box-Muller from two independent uniform streams; 1 - u keeps the log finite
    dev = _device(device)
    u1 = prims.sub(1.0, prims.rand(tuple(shape), torch.float32, dev))
    u2 = prims.rand(tuple(shape), torch.float32, dev)
    radius = prims.sqrt(prims.mul(prims.log(u1), -2.0))
    return to_dtype(prims.mul(radius, prims.cos(prims.mul(u2, 2 * math.pi))), dtype)


def _randint_eager(low, high, shape, dtype, device):
    return torch.randint(low, high, tuple(shape), dtype=dtype, device=device)


randint = define("core", "randint", _randint_eager, random=True, **_CREATION)
META_RULES[randint] = lambda low, high, shape, dtype, device: TensorMeta.contiguous(tuple(shape), dtype, _device(device))


@DECOMPOSITIONS.register(randint)
def _randint_decomp(low, high, shape, dtype, device):
    u = prims.rand(tuple(shape), torch.float64 if high - low > 1 << 24 else torch.float32, _device(device))
    scaled = prims.floor(prims.mul(u, float(high - low)))
    # a uniform in [0, 1) times the span can round up to the span itself: clamp it
    scaled = prims.minimum(scaled, float(high - low - 1))
    return to_dtype(prims.add(to_dtype(scaled, torch.int64), low), dtype)
