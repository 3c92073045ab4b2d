"""``core.number``: the Python number a one-element tensor holds, as ``float(t)``, ``int(t)``,
``bool(t)`` and ``t.item()`` make it, kept inside the graph.

capture        ``float(t)`` / ``int(t)`` / ``bool(t)`` / ``t.item()`` of a computed tensor under
               ``fullgraph=True`` (capture/scalar_values.py)
meta           a 0-d ``WrappedNumberMeta`` of the number's dtype (float64, int64 or bool: a
               Python float is a double), on the operand's device, with no gradient; it then
               promotes as a Python number does (``half_tensor * float(t)`` stays half)
decomposition  reshape to 0-d, then one cast (a cast to bool is ``!= 0``, as ``bool(t)`` is)
VJP            none: a Python number carries no gradient

The returned value becomes a Python number again in the capture's rebuild (``.item()`` of
the 0-d output), so the user sees eager's type.
"""
from __future__ import annotations

import torch

from kiln.meta.tensor_meta import NUMBER_TYPES, WrappedNumberMeta
from kiln.ops import prims
from kiln.ops.registry import DECOMPOSITIONS, META_RULES, define

__all__ = ["number"]


def _number_eager(x, dtype):
    return x.detach().reshape(()).to(dtype)


number = define("core", "number", _number_eager, differentiable=False, recompute=True)


@META_RULES.register(number)
def _number_meta(x, dtype):
    if dtype not in NUMBER_TYPES:
        raise TypeError(f"[meta] core.number: {dtype} holds no Python number (float64, int64 or bool)")
    if x.numel() != 1:
        raise ValueError(f"[meta] core.number: only one element tensors can be converted to Python "
                         f"scalars (this one has {x.numel()})")
    return WrappedNumberMeta((), (), dtype, x.device, False)


@DECOMPOSITIONS.register(number)
def _number_decomposition(x, dtype):
    flat = x if x.shape == () else prims.reshape(x, ())
    # always a new node, even from a 0-d tensor of the dtype: the number's node must not be a
    # real tensor's (decompose._keep_number marks it as a number)
    return prims.convert_element_type(flat, dtype)
