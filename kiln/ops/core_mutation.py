"""Core ops that functionalization records for in-place updates.

Capture turns every mutation into a functional op that returns the updated tensor
(``kiln/capture/mutation.py``): writing through a view becomes a ``*_scatter`` of the new view
value into its base; ``x[idx] = v`` becomes ``index_put``; ``scatter_`` becomes ``scatter``.
Each op's eager implementation, meta rule and decomposition to prims sit together below.

The decompositions are pointwise where they can be: a slice or select scatter is
``where(mask over an iota, src moved into base's coordinates, base)``, which fuses with the
producer of ``src`` and the consumers of the result. ``index_put`` and ``scatter`` overwrite with
the storing scatter prims (``index_copy``, ``scatter_store``): a position named twice receives
one of its values, as in eager, where the winner is unspecified (C++: the last).
"""
from __future__ import annotations

import torch

from kiln.meta.tensor_meta import TensorMeta
from kiln.ops import prims
from kiln.ops import prims_more as pm
from kiln.ops import prims_nn as pn
from kiln.ops.core_shape import slice_range
from kiln.ops.core_views import normalize_dim
from kiln.ops.prim_utils import to_dtype
from kiln.ops.registry import DECOMPOSITIONS, META_RULES, define

__all__ = ["slice_scatter", "select_scatter", "index_put", "scatter", "detach"]


class MutationOpError(ValueError):
    pass


def _core(name, eager):
    return define("core", name, eager)


def _iota_along(base, d):
    """[base.shape] int64: the index along dim d, broadcast over the other dims."""
    return base.graph_builder.call(pm.iota, (base.shape[d], 0, 1, torch.int64, base.device))


def _mask_to(mask_1d, base, d):
    return prims.broadcast_in_dim(mask_1d, tuple(base.shape), (d,))


def _result_meta(name, base, src):
    if src.dtype != base.dtype:
        raise MutationOpError(f"[meta] core.{name}: src dtype {src.dtype} differs from base {base.dtype}")
    return TensorMeta.contiguous(base.shape, base.dtype, base.device,
                                 base.requires_grad or src.requires_grad)


# ------------------------------------------------------------------ slice_scatter
def _slice_scatter_eager(base, src, dim=0, start=None, end=None, step=1):
    return torch.slice_scatter(base, src, dim, start, end, step)


slice_scatter = _core("slice_scatter", _slice_scatter_eager)


def _slice_shape(base, dim, start, end, step, name):
    d = normalize_dim(dim, base.ndim, name)
    s, e, st = slice_range(base.shape[d], start, end, step)
    shape = list(base.shape)
    shape[d] = (e - s + st - 1) // st
    return d, s, e, st, tuple(shape)


@META_RULES.register(slice_scatter)
def _slice_scatter_meta(base, src, dim=0, start=None, end=None, step=1):
    _, _, _, _, shape = _slice_shape(base, dim, start, end, step, "slice_scatter")
    if tuple(src.shape) != shape:
        raise MutationOpError(f"[meta] core.slice_scatter: src {list(src.shape)} does not match the "
                              f"slice {list(shape)} of base {list(base.shape)}")
    return _result_meta("slice_scatter", base, src)


@DECOMPOSITIONS.register(slice_scatter)
def _slice_scatter_decomp(base, src, dim=0, start=None, end=None, step=1):
    d, s, e, st, shape = _slice_shape(base, dim, start, end, step, "slice_scatter")
    n, size = shape[d], base.shape[d]
    if n == 0:
        return base
    if n == size:  # the slice is the whole dim
        return prims.copy(src) if tuple(src.shape) == tuple(base.shape) else src
    i = _iota_along(base, d)
    if st == 1:
        lo, hi = [0] * base.ndim, [0] * base.ndim
        lo[d], hi[d] = s, size - e
        placed = pm.pad(src, tuple(lo), tuple(hi), 0)
        mask = prims.bitwise_and(prims.ge(i, s), prims.lt(i, e))
    else:
        # src's element for each position along d, clamped into range where the mask is off
        k = pm.trunc_div(prims.maximum(prims.sub(i, s), 0), st)
        k = prims.minimum(k, n - 1)
        placed = pn.index_select(src, d, k)
        on_step = prims.eq(pm.fmod(prims.sub(i, s), st), 0)
        mask = prims.bitwise_and(prims.bitwise_and(prims.ge(i, s), prims.lt(i, e)), on_step)
    return prims.where(_mask_to(mask, base, d), placed, base)


# ------------------------------------------------------------------ select_scatter
def _select_scatter_eager(base, src, dim, index):
    return torch.select_scatter(base, src, dim, index)


select_scatter = _core("select_scatter", _select_scatter_eager)


def _select_pos(base, dim, index):
    d = normalize_dim(dim, base.ndim, "select_scatter")
    size = base.shape[d]
    if not -size <= index < size:
        raise IndexError(f"[meta] core.select_scatter: index {index} is out of bounds for dim {d} "
                         f"with size {size}")
    return d, index % size


@META_RULES.register(select_scatter)
def _select_scatter_meta(base, src, dim, index):
    d, _ = _select_pos(base, dim, index)
    want = tuple(s for k, s in enumerate(base.shape) if k != d)
    if tuple(src.shape) != want:
        raise MutationOpError(f"[meta] core.select_scatter: src {list(src.shape)} does not match "
                              f"{list(want)}")
    return _result_meta("select_scatter", base, src)


@DECOMPOSITIONS.register(select_scatter)
def _select_scatter_decomp(base, src, dim, index):
    d, i = _select_pos(base, dim, index)
    spread = prims.broadcast_in_dim(src, tuple(base.shape), tuple(k for k in range(base.ndim) if k != d))
    if base.shape[d] == 1:
        return prims.copy(spread)
    mask = prims.eq(_iota_along(base, d), i)
    return prims.where(_mask_to(mask, base, d), spread, base)


# ------------------------------------------------------------------ index_put (one index tensor)
def _wrap_index(index, size):
    return torch.where(index < 0, index + size, index)


def _index_put_eager(base, dim, index, values, accumulate=False):
    index = _wrap_index(index, base.shape[dim])
    if accumulate:
        return torch.index_add(base, dim, index, values)
    return base.index_copy(dim, index, values)


index_put = _core("index_put", _index_put_eager)


@META_RULES.register(index_put)
def _index_put_meta(base, dim, index, values, accumulate=False):
    d = normalize_dim(dim, base.ndim, "index_put")
    if index.ndim != 1 or index.dtype not in (torch.int64, torch.int32):
        raise MutationOpError(f"[meta] core.index_put: index must be a 1-d integer tensor, got "
                              f"{index.dtype} {list(index.shape)}")
    want = list(base.shape)
    want[d] = index.shape[0]
    if list(values.shape) != want:
        raise MutationOpError(f"[meta] core.index_put: values {list(values.shape)} do not match {want}")
    return _result_meta("index_put", base, values)


@DECOMPOSITIONS.register(index_put)
def _index_put_decomp(base, dim, index, values, accumulate=False):
    d = normalize_dim(dim, base.ndim, "index_put")
    size = base.shape[d]
    index = prims.where(prims.lt(index, 0), prims.add(index, size), index)
    values = to_dtype(values, base.dtype)
    if accumulate:
        return pn.index_add(base, d, index, values)
    return pn.index_copy(base, d, index, values)


# ------------------------------------------------------------------ scatter (overwrite)
def _scatter_eager(base, dim, index, src):
    return torch.scatter(base, dim, index, src)


scatter = _core("scatter", _scatter_eager)


@META_RULES.register(scatter)
def _scatter_meta(base, dim, index, src):
    normalize_dim(dim, base.ndim, "scatter")
    if index.ndim != base.ndim or src.ndim != base.ndim or index.dtype != torch.int64:
        raise MutationOpError(f"[meta] core.scatter: index (int64) and src need {base.ndim} dims")
    if tuple(index.shape) != tuple(src.shape):
        raise MutationOpError("[meta] core.scatter: index and src must have the same shape here")
    return _result_meta("scatter", base, src)


@DECOMPOSITIONS.register(scatter)
def _scatter_decomp(base, dim, index, src):
    d = normalize_dim(dim, base.ndim, "scatter")
    return pn.scatter_store(base, d, index, to_dtype(src, base.dtype))


# ------------------------------------------------------------------ detach
def _detach_eager(x):
    return x.detach()


detach = define("core", "detach", _detach_eager, view="alias")
META_RULES[detach] = lambda x: x.with_(requires_grad=False)
DECOMPOSITIONS[detach] = lambda x: x
