"""Helpers VJP rules share, written in core ops over graph Proxies (as decompositions are
written in prims). They live with the ops, not the autograd stage, so an op file can hold its
VJP rule beside its other rules without importing a stage."""
from __future__ import annotations

import torch

from kiln.graph.proxy import Proxy
from kiln.meta.symbolic import same_shape
from kiln.ops import core
from kiln.ops.core_views import normalize_dim


def is_tensor(x) -> bool:
    return isinstance(x, Proxy)


def sum_to_shape(g, shape):
    """Sum g over the dims that broadcasting added or expanded, giving it ``shape``."""
    shape = tuple(shape)
    if same_shape(g.shape, shape):  # decided without a guard on symbolic sizes
        return g
    lead = g.ndim - len(shape)
    dims = list(range(lead))
    dims += [lead + i for i, s in enumerate(shape) if s == 1 and g.shape[lead + i] != 1]
    if dims:
        g = core.sum(g, dims, True)
    return core.reshape(g, shape) if not same_shape(g.shape, shape) else g


def broadcasts_to(shape, target) -> bool:
    """A tensor of ``shape`` broadcasts to ``target`` (so a gradient of ``target`` sums down to
    ``shape``). Decided by shapes, not element counts: an empty target has fewer elements."""
    shape, target = tuple(shape), tuple(target)
    if len(target) < len(shape):
        return False
    lead = len(target) - len(shape)
    return all(s == 1 or s == t for s, t in zip(shape, target[lead:]))


def reduce_dims(x, dims):
    """Normalized, sorted reduction dims (None or () means every dim, as the core ops do)."""
    if dims is None or (isinstance(dims, (tuple, list)) and len(dims) == 0):
        return tuple(range(x.ndim))
    if isinstance(dims, int):
        dims = (dims,)
    dims = tuple(sorted({normalize_dim(d, x.ndim) for d in dims}))
    return () if x.ndim == 0 else dims  # a 0-d tensor's dim 0 is itself: nothing reduced


def keepdim_shape(x, dims):
    return tuple(1 if d in dims else s for d, s in enumerate(x.shape))


def restore_reduced(g, x, dims):
    """Broadcast a reduction's gradient (or result) back to x's shape."""
    g = core.reshape(g, keepdim_shape(x, dims)) if x.ndim else g
    return core.expand(g, tuple(x.shape)) if not same_shape(g.shape, x.shape) else g


def _one_minus(y):
    return core.add(core.neg(y), 1.0)


def zeros_like(x):
    """Zeros of x's shape and dtype: a fill, not a function of x (``x * 0`` would turn inf into
    NaN, and any function of x reads all of it: a BERT embedding gradient's zeros read the
    whole weight). Made in the backward: a fill that depends on nothing would otherwise be
    computed in the forward and saved."""
    dtype = x.dtype
    value = False if dtype == torch.bool else 0.0 if (dtype.is_floating_point or dtype.is_complex) else 0

    def fill():
        return core.full(tuple(x.shape), value, dtype, x.device)

    builder = getattr(x, "graph_builder", None)
    if builder is None:
        return fill()
    with builder.inherit(backward_only=True):
        return fill()


def in_backward(g):
    """A block whose nodes run in the backward graph even though they do not depend on the
    tangents: recomputation the partitioner must not hoist into the forward (attention's
    probabilities). ``g`` is any Proxy of the joint graph."""
    return g.graph_builder.inherit(backward_only=True)
