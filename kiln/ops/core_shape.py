"""Core shape ops beyond the basic views: slice, select, cat, flip, roll, tril/triu, repeat and
constant padding, each with eager implementation, meta rule and decomposition to prims.

split, chunk, unbind, narrow, stack, flatten, unflatten and tensor indexing are capture-level
compositions of these (kiln/capture/torch_api_more.py), as they are in ATen.
"""
from __future__ import annotations

import builtins

import torch
import torch.nn.functional as F

from kiln.meta.strides import cat_strides, format_like_input
from kiln.meta.symbolic import is_int_like, same_shape
from kiln.meta.tensor_meta import TensorMeta
from kiln.ops import prims
from kiln.ops import prims_more as pm
from kiln.ops.core_views import normalize_dim
from kiln.ops.prim_utils import to_dtype
from kiln.ops.promotion import result_type, scalar_for
from kiln.ops.registry import DECOMPOSITIONS, META_RULES, define

__all__ = ["slice", "select", "cat", "flip", "roll", "tril", "triu", "repeat", "constant_pad",
           "slice_range"]


def _core(name, eager, **props):
    # index transforms read no elements beyond their inputs': free to recompute in a backward
    return define("core", name, eager, recompute=True, **props)


# ------------------------------------------------------------------ slice
def slice_range(size: int, start, end, step):
    """Python slice semantics for one dim: (start, end, step) with 0 <= start <= end <= size."""
    if step <= 0:
        raise ValueError("[meta] core.slice: slice step must be positive")
    start = 0 if start is None else start
    end = size if end is None else end
    start = start + size if start < 0 else start
    end = end + size if end < 0 else end
    start = builtins.min(builtins.max(start, 0), size)
    end = builtins.min(builtins.max(end, start), size)
    return start, end, step


def _slice_eager(x, dim=0, start=None, end=None, step=1):
    index = [builtins.slice(None)] * x.ndim
    index[dim] = builtins.slice(start, end, step)
    return x[tuple(index)]


slice = _core("slice", _slice_eager, view="index")


@META_RULES.register(slice)
def _slice_meta(x, dim=0, start=None, end=None, step=1):
    d = normalize_dim(dim, x.ndim, "slice")
    s, e, st = slice_range(x.shape[d], start, end, step)
    shape, stride = list(x.shape), list(x.stride)
    shape[d] = (e - s + st - 1) // st
    stride[d] = stride[d] * st
    return TensorMeta(shape, stride, x.dtype, x.device, x.requires_grad)


@DECOMPOSITIONS.register(slice)
def _slice_decomp(x, dim=0, start=None, end=None, step=1):
    d = normalize_dim(dim, x.ndim, "slice")
    s, e, st = slice_range(x.shape[d], start, end, step)
    if same_shape((s, e, st), (0, x.shape[d], 1)):  # a no-op slice (decided without a guard)
        return x
    starts, ends, steps = [0] * x.ndim, list(x.shape), [1] * x.ndim
    starts[d], ends[d], steps[d] = s, e, st
    return pm.slice(x, tuple(starts), tuple(ends), tuple(steps))


# ------------------------------------------------------------------ select
def _select_eager(x, dim, index):
    return torch.select(x, dim, index)


select = _core("select", _select_eager, view="index")


def _select_index(x, dim, index):
    if x.ndim == 0:
        raise IndexError("[meta] core.select: cannot select from a 0-d tensor")
    d = normalize_dim(dim, x.ndim, "select")
    size = x.shape[d]
    if not -size <= index < size:
        raise IndexError(f"index {index} is out of bounds for dimension {d} with size {size}")
    return d, index % size


@META_RULES.register(select)
def _select_meta(x, dim, index):
    d, _ = _select_index(x, dim, index)
    keep = [k for k in range(x.ndim) if k != d]
    return TensorMeta([x.shape[k] for k in keep], [x.stride[k] for k in keep], x.dtype, x.device,
                      x.requires_grad)


@DECOMPOSITIONS.register(select)
def _select_decomp(x, dim, index):
    d, i = _select_index(x, dim, index)
    starts, ends, steps = [0] * x.ndim, list(x.shape), [1] * x.ndim
    starts[d], ends[d] = i, i + 1
    part = x if x.shape[d] == 1 else pm.slice(x, tuple(starts), tuple(ends), tuple(steps))
    return pm.squeeze(part, (d,))


# ------------------------------------------------------------------ cat
def _cat_eager(tensors, dim=0):
    return torch.cat(list(tensors), dim)


cat = _core("cat", _cat_eager, eager_layout="follows")


def _cat_parts(tensors, dim, op="cat"):
    if not tensors:
        raise ValueError(f"[meta] core.{op}: expected a non-empty list of tensors")
    # eager skips 1-d empty tensors (legacy behaviour) when it checks shapes
    parts = [t for t in tensors if not (t.ndim == 1 and t.shape[0] == 0)]
    if not parts:
        return [], 0
    ref = parts[0]
    d = normalize_dim(dim, ref.ndim, op)
    for t in parts:
        if t.ndim != ref.ndim:
            raise RuntimeError(f"Tensors must have same number of dimensions: got {ref.ndim} and {t.ndim}")
        for k in range(ref.ndim):
            if k != d and t.shape[k] != ref.shape[k]:
                raise RuntimeError(f"Sizes of tensors must match except in dimension {d}. Expected "
                                   f"size {ref.shape[k]} but got size {t.shape[k]} for dimension {k}")
    return parts, d


@META_RULES.register(cat)
def _cat_meta(tensors, dim=0):
    dtype = result_type(*tensors)
    parts, d = _cat_parts(tensors, dim)
    grad = builtins.any(t.requires_grad for t in tensors) and dtype.is_floating_point
    if not parts:
        return TensorMeta.contiguous((0,), dtype, tensors[0].device, grad)
    shape = list(parts[0].shape)
    shape[d] = builtins.sum(t.shape[d] for t in parts)
    # eager's cat stays channels-last when all inputs are
    return TensorMeta(shape, cat_strides(parts, tuple(shape)), dtype, parts[0].device, grad)


@DECOMPOSITIONS.register(cat)
def _cat_decomp(tensors, dim=0):
    dtype = result_type(*tensors)
    parts, d = _cat_parts(tensors, dim)
    if not parts:  # only legacy 1-d empty tensors: eager's result is one of them, [0]
        return prims.full((0,), 0, dtype, tensors[0].device)
    parts = [to_dtype(t, dtype) for t in ([t for t in parts if t.shape[d]] or parts[:1])]
    if len(parts) == 1:  # a copy: eager's cat never returns (a view of) an operand
        return prims.copy(parts[0])
    return pm.cat(parts, d)


# ------------------------------------------------------------------ flip / roll
def _flip_eager(x, dims):
    return torch.flip(x, tuple(dims))


flip = _core("flip", _flip_eager)


def _flip_dims(x, dims):
    dims = [dims] if isinstance(dims, int) else list(dims)
    out = [normalize_dim(d, x.ndim, "flip") for d in dims]
    if len(set(out)) != len(out):
        raise RuntimeError(f"dims has duplicates, original flip dims size={len(dims)}")
    return tuple(sorted(d for d in out if x.ndim and x.shape[d] > 1))


@META_RULES.register(flip)
def _flip_meta(x, dims):
    _flip_dims(x, dims)
    return TensorMeta.contiguous(x.shape, x.dtype, x.device, x.requires_grad)


@DECOMPOSITIONS.register(flip)
def _flip_decomp(x, dims):
    dims = _flip_dims(x, dims)
    return pm.flip(x, dims) if dims else prims.copy(x)


def _roll_eager(x, shifts, dims=None):
    return torch.roll(x, shifts, dims) if dims is not None else torch.roll(x, shifts)


roll = _core("roll", _roll_eager)


def _roll_args(x, shifts, dims):
    shifts = (shifts,) if is_int_like(shifts) else tuple(shifts)  # a SymInt shift too
    if dims is None:
        if len(shifts) != 1:
            raise RuntimeError("roll: shifts must be a single int when dims is not given")
        return shifts, None
    dims = (dims,) if isinstance(dims, int) else tuple(dims)
    if len(shifts) != len(dims):
        raise RuntimeError(f"shifts and dimensions must align. shifts: {len(shifts)}, dims:{len(dims)}")
    return shifts, tuple(normalize_dim(d, x.ndim, "roll") for d in dims)


@META_RULES.register(roll)
def _roll_meta(x, shifts, dims=None):
    _roll_args(x, shifts, dims)
    return TensorMeta.contiguous(x.shape, x.dtype, x.device, x.requires_grad)


@DECOMPOSITIONS.register(roll)
def _roll_decomp(x, shifts, dims=None):
    shifts, dims = _roll_args(x, shifts, dims)
    if dims is None:  # roll the flattened tensor
        flat = prims.reshape(x, (x.numel(),)) if x.ndim != 1 else x
        out = pm.roll(flat, shifts, (0,))
        return prims.reshape(out, tuple(x.shape)) if x.ndim != 1 else out
    return pm.roll(x, shifts, dims)


# ------------------------------------------------------------------ tril / triu
def _tri(name, eager, keep_lower: bool):
    op = _core(name, lambda x, diagonal=0: eager(x, diagonal))

    @META_RULES.register(op)
    def meta(x, diagonal=0):
        if x.ndim < 2:
            raise RuntimeError(f"{name}: input tensor must have at least 2 dimensions")
        return TensorMeta.contiguous(x.shape, x.dtype, x.device, x.requires_grad)

    @DECOMPOSITIONS.register(op)
    def decomp(x, diagonal=0):
        n, m = x.shape[-2], x.shape[-1]
        g = x.graph_builder
        rows = g.call(pm.iota, (n, 0, 1, torch.int64, x.device))
        cols = g.call(pm.iota, (m, 0, 1, torch.int64, x.device))
        diff = prims.sub(prims.broadcast_in_dim(cols, (n, m), (1,)),
                         prims.broadcast_in_dim(rows, (n, m), (0,)))
        keep = prims.le(diff, diagonal) if keep_lower else prims.ge(diff, diagonal)
        keep = prims.broadcast_in_dim(keep, tuple(x.shape), (x.ndim - 2, x.ndim - 1))
        zero = False if x.dtype == torch.bool else (0.0 if x.dtype.is_floating_point else 0)
        return prims.where(keep, x, zero)
    return op


tril = _tri("tril", torch.tril, True)
triu = _tri("triu", torch.triu, False)


# ------------------------------------------------------------------ repeat
def _repeat_eager(x, repeats):
    return x.repeat(*repeats)


repeat = _core("repeat", _repeat_eager)


@META_RULES.register(repeat)
def _repeat_meta(x, repeats):
    repeats = tuple(repeats)
    if len(repeats) < x.ndim:
        raise RuntimeError("Number of dimensions of repeat dims can not be smaller than number of "
                           "dimensions of tensor")
    lead = len(repeats) - x.ndim
    shape = list(repeats[:lead]) + [s * r for s, r in zip(x.shape, repeats[lead:])]
    return TensorMeta.contiguous(shape, x.dtype, x.device, x.requires_grad)


@DECOMPOSITIONS.register(repeat)
def _repeat_decomp(x, repeats):
    repeats = tuple(repeats)
    lead = len(repeats) - x.ndim
    sizes = (1,) * lead + tuple(x.shape)
    # broadcast to (r0, s0, r1, s1, ...) and merge each pair: a reshape of a broadcast, no copy
    interleaved = []
    for r, s in zip(repeats, sizes):
        interleaved += [r, s]
    expanded = prims.broadcast_in_dim(x, tuple(interleaved), tuple(2 * k + 1 for k in range(lead, len(sizes))))
    return prims.reshape(expanded, tuple(r * s for r, s in zip(repeats, sizes)))


# ------------------------------------------------------------------ constant pad
def _pad_eager(x, pad, value=0.0):
    return F.pad(x, list(pad), mode="constant", value=value)


constant_pad = _core("constant_pad", _pad_eager)


def _pad_pairs(x, pad):
    pad = tuple(pad)
    if len(pad) % 2 or len(pad) // 2 > x.ndim:
        raise RuntimeError(f"Padding length must be divisible by 2 and at most twice the input's "
                           f"dims, got {len(pad)} for {x.ndim} dims")
    lo, hi = [0] * x.ndim, [0] * x.ndim
    for k in range(len(pad) // 2):
        d = x.ndim - 1 - k
        lo[d], hi[d] = pad[2 * k], pad[2 * k + 1]
    for d in range(x.ndim):
        if x.shape[d] + lo[d] + hi[d] < 0:
            raise RuntimeError(f"The input size {x.shape[d]}, plus negative padding {lo[d]} and "
                               f"{hi[d]} resulted in a negative output size")
    return lo, hi


@META_RULES.register(constant_pad)
def _constant_pad_meta(x, pad, value=0.0):
    lo, hi = _pad_pairs(x, pad)
    shape = [s + a + b for s, a, b in zip(x.shape, lo, hi)]
    # eager's constant_pad_nd allocates in the input's suggested memory format
    return TensorMeta(shape, format_like_input(x, shape), x.dtype, x.device, x.requires_grad)


@DECOMPOSITIONS.register(constant_pad)
def _constant_pad_decomp(x, pad, value=0.0):
    lo, hi = _pad_pairs(x, pad)
    if builtins.any(p < 0 for p in lo + hi):  # negative padding crops
        starts = [builtins.max(-a, 0) for a in lo]
        ends = [s - builtins.max(-b, 0) for s, b in zip(x.shape, hi)]
        x = pm.slice(x, tuple(starts), tuple(builtins.max(e, s) for s, e in zip(starts, ends)),
                     (1,) * x.ndim)
        lo, hi = [builtins.max(a, 0) for a in lo], [builtins.max(b, 0) for b in hi]
    if not builtins.any(lo + hi):
        return prims.copy(x)
    return pm.pad(x, tuple(lo), tuple(hi), scalar_for(value, x.dtype))
