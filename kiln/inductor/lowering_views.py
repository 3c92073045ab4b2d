"""Lowering rules for the shape prims of ``kiln/ops/prims_more.py``.

Each is an index transform on the operand's loader (nothing is copied). Strided views (slice,
squeeze) also carry a ``TensorRef``, so a library call such as mm takes them as they are.

Ops that read an operand only for part of the output (cat, pad) select with a where-chain over
index values, and clamp the index they load from into the operand's range with a modulo, so no
load ever leaves its buffer even though both sides of a ``where`` are evaluated.
"""
from __future__ import annotations

import sys

import sympy
import torch

from kiln.inductor import ir
from kiln.inductor.lowering import TValue
from kiln.ops.registry import bind_stage


def _index_in(i, offset: int, size: int):
    """``i - offset`` for ``offset <= i < offset + size``, and some in-range index elsewhere.

    The operand of the modulo is kept non-negative, since the generated C++ and Triton ``%``
    truncate toward zero."""
    if size == 1:
        return sympy.Integer(0)
    return sympy.Mod(i + (-offset) % size, size)


def _const(value, dtype):
    """A constant, or the value of a symbolic size (a pad's or cat's bound under dynamic
    shapes: ``lo + s0``), which kernels receive as an argument."""
    if isinstance(value, sympy.Basic) and value.free_symbols:
        return ir.IndexValue(value, dtype)
    return ir.Const(value, dtype)


def _cmp(op, a, b):
    return ir.Call(op, (a, b), torch.bool)


def slice_rule(ctx, meta, x, starts, ends, steps):
    def load(idx):
        return x.loader([s + i * st for i, s, st in zip(idx, starts, steps)])

    ref = None
    if x.ref is not None:
        offset = x.ref.offset + sum(s * st for s, st in zip(starts, x.ref.stride))
        ref = ir.TensorRef(x.ref.buffer, meta.shape, [st * k for st, k in zip(x.ref.stride, steps)], offset)
    return TValue(meta.shape, x.dtype, x.device, load, ref)


def squeeze_rule(ctx, meta, x, dims):
    dims = set(dims)
    keep = [d for d in range(len(x.shape)) if d not in dims]

    def load(idx):
        full = [sympy.Integer(0)] * len(x.shape)
        for k, d in enumerate(keep):
            full[d] = idx[k]
        return x.loader(full)

    ref = None
    if x.ref is not None:
        ref = ir.TensorRef(x.ref.buffer, meta.shape, [x.ref.stride[d] for d in keep], x.ref.offset)
    return TValue(meta.shape, x.dtype, x.device, load, ref)


def flip_rule(ctx, meta, x, dims):
    dims = set(dims)

    def load(idx):
        return x.loader([x.shape[d] - 1 - i if d in dims else i for d, i in enumerate(idx)])
    # A flipped view has negative strides, which torch's as_strided cannot express: no ref.
    return TValue(meta.shape, x.dtype, x.device, load)


def roll_rule(ctx, meta, x, shifts, dims):
    by_dim = {}
    for s, d in zip(shifts, dims):
        by_dim[d] = by_dim.get(d, 0) + s

    def load(idx):
        out = list(idx)
        for d, s in by_dim.items():
            size = x.shape[d]
            if size and s % size:
                out[d] = _index_in(idx[d], s % size, size)
        return x.loader(out)
    return TValue(meta.shape, x.dtype, x.device, load)


def cat_rule(ctx, meta, tensors, dim):
    parts, offset = [], 0
    for t in tensors:
        size = t.shape[dim]
        if size:
            parts.append((offset, size, t))
        offset += size

    def load(idx):
        i = idx[dim]
        *head, (last_off, last_size, last) = parts
        value = last.loader(_replace(idx, dim, _index_in(i, last_off, last_size)))
        for off, size, t in reversed(head):
            here = t.loader(_replace(idx, dim, _index_in(i, off, size)))
            cond = _cmp("lt", ir.IndexValue(i), _const(off + size, torch.int64))
            value = ir.Call("where", (cond, here, value), meta.dtype)
        return value
    if len(parts) == 1:
        only = parts[0][2]
        return TValue(meta.shape, only.dtype, only.device, only.loader, only.ref)
    return TValue(meta.shape, meta.dtype, meta.device, load)


def pad_rule(ctx, meta, x, lo, hi, value):
    padded = [d for d in range(len(x.shape)) if lo[d] or hi[d]]
    fill = _const(value, meta.dtype)
    if any(x.shape[d] == 0 for d in range(len(x.shape))):
        return TValue(meta.shape, meta.dtype, meta.device, lambda idx: fill)

    def load(idx):
        src = list(idx)
        inside = None
        for d in padded:
            i = idx[d]
            src[d] = _index_in(i, lo[d], x.shape[d])
            conds = []
            if lo[d]:
                conds.append(_cmp("ge", ir.IndexValue(i), _const(lo[d], torch.int64)))
            if hi[d]:
                conds.append(_cmp("lt", ir.IndexValue(i), _const(lo[d] + x.shape[d], torch.int64)))
            for c in conds:
                inside = c if inside is None else ir.Call("bitwise_and", (inside, c), torch.bool)
        value = x.loader(src)
        if inside is None:
            return value
        return ir.Call("where", (inside, value, fill), meta.dtype)
    return TValue(meta.shape, meta.dtype, meta.device, load)


def iota_rule(ctx, meta, length, start, step, dtype, device):
    def load(idx):
        value = ir.IndexValue(start + idx[0] * step)
        return value if dtype == torch.int64 else ir.Call("cast", (value,), dtype)
    return TValue(meta.shape, dtype, meta.device, load)


def _replace(idx, dim, value):
    out = list(idx)
    out[dim] = value
    return out


# The op files write their lowerings with this module's builders through a stage handle
# (ops/registry.py: the ops layer imports no stage); binding it resolves them.
bind_stage("lowering_views", sys.modules[__name__])
