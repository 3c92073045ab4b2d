"""Small helpers decompositions share: explicit casts and broadcasts in prims."""
from __future__ import annotations

from kiln.meta.symbolic import same_shape
from kiln.ops import prims


def to_dtype(x, dtype):
    return x if x.dtype == dtype else prims.convert_element_type(x, dtype)


def broadcast_to(x, shape):
    """Broadcast x (trailing-aligned, torch rules) to shape with broadcast_in_dim."""
    shape = tuple(shape)
    if same_shape(x.shape, shape):  # no guard: broadcasting to the same shape is a no-op anyway
        return x
    return prims.broadcast_in_dim(x, shape, tuple(range(len(shape) - x.ndim, len(shape))))
