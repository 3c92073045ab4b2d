"""Core scatter ops (the backward of gather / index_select / embedding) and random ops.

Scatter ops accumulate into a copy of ``x``; their prims lower to a kernel over the *source*
elements that adds atomically into the destination. Random ops draw from a counter-based
generator keyed by a per-call seed, so a graph called twice draws fresh numbers and a value is
the same wherever it is recomputed within one call.
"""
from __future__ import annotations

import torch

from kiln.meta.tensor_meta import TensorMeta
from kiln.ops import prims
from kiln.ops.core_views import normalize_dim
from kiln.ops.prim_utils import to_dtype
from kiln.ops.promotion import no_kernel
from kiln.ops.registry import DECOMPOSITIONS, META_RULES, define

__all__ = ["scatter_add", "index_add", "dropout", "rand"]


def _scatter_add_eager(x, dim, index, src):
    return torch.scatter_add(x, dim, index, src)


scatter_add = define("core", "scatter_add", _scatter_add_eager)


@META_RULES.register(scatter_add)
def _scatter_add_meta(x, dim, index, src):
    normalize_dim(dim, x.ndim, "scatter_add")
    if index.ndim != x.ndim or src.ndim != x.ndim:
        raise ValueError(f"[meta] core.scatter_add: index and src need {x.ndim} dims")
    if index.dtype != torch.int64:
        raise TypeError(f"[meta] core.scatter_add: index must be int64, got {index.dtype}")
    return TensorMeta.contiguous(x.shape, x.dtype, x.device, x.requires_grad or src.requires_grad)


@DECOMPOSITIONS.register(scatter_add)
def _scatter_add_decomp(x, dim, index, src):
    return prims.scatter_add(x, normalize_dim(dim, x.ndim, "scatter_add"), index, to_dtype(src, x.dtype))


def _index_add_eager(x, dim, index, src, alpha=1):
    return torch.index_add(x, dim, index, src, alpha=alpha)


index_add = define("core", "index_add", _index_add_eager)


@META_RULES.register(index_add)
def _index_add_meta(x, dim, index, src, alpha=1):
    d = normalize_dim(dim, x.ndim, "index_add")
    if index.ndim != 1 or (src.ndim and src.shape[d] != index.shape[0]):
        raise ValueError(f"[meta] core.index_add: index {list(index.shape)} does not match src "
                         f"{list(src.shape)} along dim {d}")
    return TensorMeta.contiguous(x.shape, x.dtype, x.device, x.requires_grad or src.requires_grad)


@DECOMPOSITIONS.register(index_add)
def _index_add_decomp(x, dim, index, src, alpha=1):
    src = to_dtype(src, x.dtype)
    if alpha != 1:
        src = prims.mul(src, alpha)
    return prims.index_add(x, normalize_dim(dim, x.ndim, "index_add"), index, src)


# ------------------------------------------------------------------ random
def _rand_eager(shape, dtype, device):
    return torch.rand(shape, dtype=dtype, device=device)


rand = define("core", "rand", _rand_eager, random=True, eager_layout="contiguous", differentiable=False)


@META_RULES.register(rand)
def _rand_meta(shape, dtype, device):
    if not dtype.is_floating_point:
        raise no_kernel(dtype, "check_uniform_bounds")  # eager draws floats only
    return TensorMeta.contiguous(tuple(shape), dtype, device)


DECOMPOSITIONS[rand] = lambda shape, dtype, device: prims.rand(tuple(shape), dtype, device)


def _dropout_eager(x, p, training=True):
    return torch.nn.functional.dropout(x, p, training)


dropout = define("core", "dropout", _dropout_eager, random=True)


@META_RULES.register(dropout)
def _dropout_meta(x, p, training=True):
    if not 0 <= p <= 1:
        raise ValueError(f"[meta] core.dropout: p must be in [0, 1], got {p}")
    return TensorMeta.contiguous(x.shape, x.dtype, x.device, x.requires_grad)


@DECOMPOSITIONS.register(dropout)
def _dropout_decomp(x, p, training=True):
    if not training or p == 0:
        return x
    if p == 1:
        return prims.mul(x, 0.0)
    keep = prims.ge(prims.rand(tuple(x.shape), torch.float32, x.device), float(p))
    scaled = prims.mul(x, 1.0 / (1.0 - p))
    return prims.where(keep, scaled, 0.0)
