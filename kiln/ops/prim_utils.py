"""Small helpers decompositions share: explicit casts, broadcasts and type promotion in prims."""
from __future__ import annotations

from kiln.graph.proxy import Proxy
from kiln.meta.symbolic import same_shape
from kiln.ops import prims, prims_more
from kiln.ops.promotion import Promotion, broadcast_shapes, promoted_dtypes, scalar_for


def to_dtype(x, dtype):
    return x if x.dtype == dtype else prims.convert_element_type(x, dtype)


def broadcast_to(x, shape):
    """Broadcast x (trailing-aligned, torch rules) to shape with broadcast_in_dim."""
    shape = tuple(shape)
    if same_shape(x.shape, shape):  # no guard: broadcasting to the same shape is a no-op anyway
        return x
    return prims.broadcast_in_dim(x, shape, tuple(range(len(shape) - x.ndim, len(shape))))


def on_one_device(args):
    """torch lets a 0-d CPU tensor stand as a scalar beside tensors on another device; prims
    take one device, so such an operand is copied over (``prims.device_put``)."""
    devices = {a.device for a in args if isinstance(a, Proxy) and (a.ndim > 0 or a.device.type != "cpu")}
    if len(devices) != 1:
        return args
    (device,) = devices
    return type(args)(prims_more.device_put(a, device) if isinstance(a, Proxy) and a.device != device else a
                      for a in args)


def elementwise_operands(args, kind: Promotion):
    """Promote and broadcast operands; returns (operands, compute dtype, result dtype)."""
    args = on_one_device(args)
    compute, result = promoted_dtypes(args, kind)
    shape = broadcast_shapes(*(a.shape for a in args if isinstance(a, Proxy)))
    out = []
    for a in args:
        if isinstance(a, Proxy):
            out.append(broadcast_to(to_dtype(a, compute), shape))
        else:
            out.append(scalar_for(a, compute))
    return out, compute, result
