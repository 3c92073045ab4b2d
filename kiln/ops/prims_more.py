"""More prims: rounding, transcendental, integer and bitwise elementwise prims, and the shape
prims beyond the basic views (slice, squeeze, flip, roll, cat, pad, iota).

Elementwise prims follow prims.py's contract (one shape, one dtype, scalars read in that dtype)
and lower through ``L.pointwise(name)``; each name has a spelling in ``TritonOps.TABLE`` and
``CppOps.TABLE``/``CppOps.call``. Shape prims lower to index transforms in
``kiln/inductor/lowering_views.py``: no copies.
"""
from __future__ import annotations

import builtins

import torch

from kiln.meta.tensor_meta import TensorMeta
from kiln.ops.prims import PrimError, _elementwise_meta, _prim
from kiln.ops.registry import LOWERINGS, META_RULES, stage_api

L = stage_api("lowering")  # the lowering stage's builders, bound when it is imported
LV = stage_api("lowering_views")


__all__ = ["floor", "ceil", "trunc", "round", "sin", "cos", "erf", "exp2", "expm1", "log2",
           "log10", "log1p", "bitwise_not", "pow", "fmod", "trunc_div", "bitwise_and", "device_put",
           "bitwise_or", "bitwise_xor", "shift_left", "shift_right", "slice", "squeeze", "flip", "roll", "cat", "pad", "iota"]


def _tensor_first(fn):
    """Eager form that accepts a Python scalar in any operand position (read in the tensor's dtype)."""
    def run(*args):
        t = next(a for a in args if isinstance(a, torch.Tensor))
        return fn(*(a if isinstance(a, torch.Tensor) else torch.tensor(a, dtype=t.dtype, device=t.device)
                    for a in args))
    return run


def _elementwise(name, eager, out_dtype=None):
    op = _prim(name, eager)
    META_RULES[op] = _elementwise_meta(name, out_dtype)
    LOWERINGS[op] = L.pointwise(name)
    return op


# ------------------------------------------------------------------ elementwise
floor = _elementwise("floor", torch.floor)
ceil = _elementwise("ceil", torch.ceil)
trunc = _elementwise("trunc", torch.trunc)
round = _elementwise("round", torch.round)  # half to even
sin = _elementwise("sin", torch.sin)
cos = _elementwise("cos", torch.cos)
erf = _elementwise("erf", torch.erf)
exp2 = _elementwise("exp2", torch.exp2)
expm1 = _elementwise("expm1", torch.expm1)
log2 = _elementwise("log2", torch.log2)
log10 = _elementwise("log10", torch.log10)
log1p = _elementwise("log1p", torch.log1p)
bitwise_not = _elementwise("bitwise_not", torch.bitwise_not)  # integers only (bools use eq(x, False))

pow = _elementwise("pow", _tensor_first(torch.pow))
fmod = _elementwise("fmod", _tensor_first(torch.fmod))  # C fmod: the sign of the dividend
# Integer division rounding toward zero (C semantics), integers only.
trunc_div = _elementwise("trunc_div", _tensor_first(lambda a, b: torch.div(a, b, rounding_mode="trunc")))
bitwise_and = _elementwise("bitwise_and", _tensor_first(torch.bitwise_and))
bitwise_or = _elementwise("bitwise_or", _tensor_first(torch.bitwise_or))
bitwise_xor = _elementwise("bitwise_xor", _tensor_first(torch.bitwise_xor))
# Shifts as eager's: a count outside [0, bits) gives 0 (left) or the sign fill (right), where
# C and Triton leave the result undefined; the codegen spells that out.
shift_left = _elementwise("shift_left", _tensor_first(torch.bitwise_left_shift))
shift_right = _elementwise("shift_right", _tensor_first(torch.bitwise_right_shift))


# ------------------------------------------------------------------ slice
def _slice_eager(x, starts, ends, steps):
    return x[tuple(builtins.slice(s, e, st) for s, e, st in zip(starts, ends, steps))]


slice = _prim("slice", _slice_eager)


@META_RULES.register(slice)
def _slice_meta(x, starts, ends, steps):
    if not (len(starts) == len(ends) == len(steps) == x.ndim):
        raise PrimError(f"[meta] prims.slice: needs one start, end and step per dim of {list(x.shape)}")
    shape = []
    for d, (s, e, st) in enumerate(zip(starts, ends, steps)):
        if st <= 0 or not 0 <= s <= e <= x.shape[d]:
            raise PrimError(f"[meta] prims.slice: bad range {s}:{e}:{st} for dim {d} of size {x.shape[d]}")
        shape.append((e - s + st - 1) // st)
    stride = [x.stride[d] * st for d, st in enumerate(steps)]
    return TensorMeta(shape, stride, x.dtype, x.device, x.requires_grad)


LOWERINGS[slice] = LV.slice_rule


# ------------------------------------------------------------------ squeeze (drop size-1 dims)
def _squeeze_eager(x, dims):
    return x.squeeze(tuple(dims)) if dims else x


squeeze = _prim("squeeze", _squeeze_eager)


@META_RULES.register(squeeze)
def _squeeze_meta(x, dims):
    dims = set(dims)
    for d in dims:
        if x.shape[d] != 1:
            raise PrimError(f"[meta] prims.squeeze: dim {d} has size {x.shape[d]}, not 1")
    keep = [d for d in range(x.ndim) if d not in dims]
    return TensorMeta([x.shape[d] for d in keep], [x.stride[d] for d in keep], x.dtype, x.device,
                      x.requires_grad)


LOWERINGS[squeeze] = LV.squeeze_rule


# ------------------------------------------------------------------ flip / roll
def _flip_eager(x, dims):
    return torch.flip(x, tuple(dims))


flip = _prim("flip", _flip_eager)


@META_RULES.register(flip)
def _flip_meta(x, dims):
    if builtins.any(not 0 <= d < x.ndim for d in dims):
        raise PrimError(f"[meta] prims.flip: dims {dims} out of range for {x.ndim} dims")
    return TensorMeta.contiguous(x.shape, x.dtype, x.device, x.requires_grad)


LOWERINGS[flip] = LV.flip_rule


def _roll_eager(x, shifts, dims):
    return torch.roll(x, tuple(shifts), tuple(dims))


roll = _prim("roll", _roll_eager)


@META_RULES.register(roll)
def _roll_meta(x, shifts, dims):
    if len(shifts) != len(dims) or builtins.any(not 0 <= d < x.ndim for d in dims):
        raise PrimError(f"[meta] prims.roll: shifts {shifts} and dims {dims} do not match {x.ndim} dims")
    return TensorMeta.contiguous(x.shape, x.dtype, x.device, x.requires_grad)


LOWERINGS[roll] = LV.roll_rule


# ------------------------------------------------------------------ cat
def _cat_eager(tensors, dim):
    return torch.cat(list(tensors), dim)


cat = _prim("cat", _cat_eager)


@META_RULES.register(cat)
def _cat_meta(tensors, dim):
    if not tensors:
        raise PrimError("[meta] prims.cat: needs at least one tensor")
    first = tensors[0]
    for t in tensors[1:]:
        if t.dtype != first.dtype or t.ndim != first.ndim or builtins.any(
                a != b for d, (a, b) in enumerate(zip(t.shape, first.shape)) if d != dim):
            raise PrimError(f"[meta] prims.cat: operands differ ({t.dtype}{list(t.shape)} vs "
                            f"{first.dtype}{list(first.shape)}) outside dim {dim}")
    shape = list(first.shape)
    shape[dim] = builtins.sum(t.shape[dim] for t in tensors)
    return TensorMeta.contiguous(shape, first.dtype, first.device,
                                 builtins.any(t.requires_grad for t in tensors))


LOWERINGS[cat] = LV.cat_rule


# ------------------------------------------------------------------ pad (constant, non-negative)
def _pad_eager(x, lo, hi, value):
    pads = []
    for d in reversed(range(x.ndim)):
        pads += [lo[d], hi[d]]
    return torch.nn.functional.pad(x, pads, value=value)


pad = _prim("pad", _pad_eager)


@META_RULES.register(pad)
def _pad_meta(x, lo, hi, value):
    if len(lo) != x.ndim or len(hi) != x.ndim or builtins.any(p < 0 for p in tuple(lo) + tuple(hi)):
        raise PrimError(f"[meta] prims.pad: needs non-negative lo/hi per dim, got {lo} {hi}")
    shape = [s + a + b for s, a, b in zip(x.shape, lo, hi)]
    return TensorMeta.contiguous(shape, x.dtype, x.device, x.requires_grad)


LOWERINGS[pad] = LV.pad_rule


# ------------------------------------------------------------------ iota
def _iota_eager(length, start, step, dtype, device):
    return torch.arange(start, start + length * step, step, dtype=dtype, device=device)[:length]


iota = _prim("iota", _iota_eager)


@META_RULES.register(iota)
def _iota_meta(length, start, step, dtype, device):
    if length < 0:
        raise PrimError(f"[meta] prims.iota: negative length {length}")
    return TensorMeta.contiguous((length,), dtype, device)


LOWERINGS[iota] = LV.iota_rule


# ------------------------------------------------------------------ device_put
# A copy to another device. Decomposition inserts it where torch lets a 0-d CPU tensor act as
# a scalar beside tensors on an accelerator; lowering calls it from the wrapper.
device_put = _prim("device_put", lambda x, device: x.to(device))


@META_RULES.register(device_put)
def _device_put_meta(x, device):
    return TensorMeta(x.shape, x.stride, x.dtype, torch.device(device), x.requires_grad)


LOWERINGS[device_put] = L.extern_rule
