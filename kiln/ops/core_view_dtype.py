"""``Tensor.view(dtype)``: the same bytes read as another dtype (a bitcast view).

Same element size: same shape and strides. A smaller element (float32 -> int16): the last dim
grows by the ratio and every other stride scales with it. A larger one (int8 -> int32): the last
dim shrinks by the ratio, which must divide it and every other stride. Both need a last dim of
stride 1, as in eager; the meta rule raises otherwise, naming the op.

It is a view: capture tracks it like any view op (kiln/capture/mutation.py ``SCATTERS``: a
write through it is viewed back to the base's dtype), so writes reach the base. It decomposes
to a library call of ``Tensor.view`` (``prims.fallback``), which returns a view of its realized
operand in the wrapper; no kernel reinterprets bytes.
"""
from __future__ import annotations

import torch

from kiln.meta.tensor_meta import TensorMeta
from kiln.ops import prims
from kiln.ops.registry import DECOMPOSITIONS, META_RULES, define

__all__ = ["view_dtype"]


def _view_dtype_eager(x, dtype):
    return x.view(dtype)


# a bitcast: torch gives it no gradient
view_dtype = define("core", "view_dtype", _view_dtype_eager, view="alias", differentiable=False)


def _itemsize(dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


@META_RULES.register(view_dtype)
def _view_dtype_meta(x, dtype):
    old, new = _itemsize(x.dtype), _itemsize(dtype)
    shape, stride = list(x.shape), list(x.stride)
    if old == new:
        return TensorMeta(tuple(shape), tuple(stride), dtype, x.device, False)
    what = f"[meta] core.view_dtype({x.dtype} -> {dtype})"
    if not shape:
        raise RuntimeError(f"{what}: a 0-d tensor cannot change its element size")
    if stride[-1] != 1 and shape[-1] != 1:
        raise RuntimeError(f"{what}: the last dimension must have stride 1")
    if old > new:
        r = old // new
        shape[-1] = shape[-1] * r
        stride = [s * r for s in stride[:-1]] + [1]
    else:
        r = new // old
        if shape[-1] % r or any(s % r for s in stride[:-1]):
            raise RuntimeError(f"{what}: the last dimension's size and the other strides must be "
                               f"divisible by {r}")
        shape[-1] = shape[-1] // r
        stride = [s // r for s in stride[:-1]] + [1]
    return TensorMeta(tuple(shape), tuple(stride), dtype, x.device, False)


@DECOMPOSITIONS.register(view_dtype)
def _view_dtype_decomp(x, dtype):
    return prims.fallback("Tensor.view", x, dtype)
