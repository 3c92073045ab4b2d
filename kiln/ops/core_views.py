"""Core view and shape ops: each with its eager implementation, meta rule and decomposition.

Views keep torch's stride semantics in their meta rules (a view shares storage), and decompose
to the view prims (reshape, permute, broadcast_in_dim), which lowering turns into index
transforms: no copies.
"""
from __future__ import annotations

import torch

from kiln.meta.strides import preserve_strides
from kiln.meta.symbolic import same_shape
from kiln.meta.tensor_meta import TensorMeta, contiguous_strides, view_strides
from kiln.ops import prims
from kiln.ops.registry import DECOMPOSITIONS, META_RULES, define

__all__ = ["reshape", "permute", "expand", "unsqueeze", "squeeze", "transpose", "contiguous", "clone",
           "normalize_dim", "infer_shape"]


class ViewError(ValueError):
    pass


def normalize_dim(dim: int, ndim: int, op: str = "?") -> int:
    n = max(ndim, 1)
    if not -n <= dim < n:
        raise IndexError(f"[meta] core.{op}: dimension {dim} out of range for a {ndim}-d tensor")
    return dim % n


def infer_shape(shape, numel: int, op="reshape") -> tuple:
    shape = list(shape)
    if shape.count(-1) > 1:
        raise ViewError(f"[meta] core.{op}: only one dimension can be -1")
    if -1 in shape:
        known = 1
        for s in shape:
            if s != -1:
                known *= s
        if known == 0 or numel % known:
            raise ViewError(f"[meta] core.{op}: shape {shape} is invalid for {numel} elements")
        shape[shape.index(-1)] = numel // known
    total = 1
    for s in shape:
        total *= s
    if total != numel:
        raise ViewError(f"[meta] core.{op}: shape {shape} is invalid for input of size {numel}")
    return tuple(shape)


_view_strides = view_strides  # torch's view rule (kiln/meta/tensor_meta.py)


# ------------------------------------------------------------------ reshape / view
reshape = define("core", "reshape", torch.reshape, view="shape", recompute=True)


@META_RULES.register(reshape)
def _reshape_meta(x, shape):
    shape = infer_shape(shape, x.numel())
    stride = _view_strides(x.shape, x.stride, shape)
    if stride is None:  # reshape copies; the copy is contiguous
        stride = contiguous_strides(shape)
    return TensorMeta(shape, stride, x.dtype, x.device, x.requires_grad)


@DECOMPOSITIONS.register(reshape)
def _reshape_decomp(x, shape):
    shape = infer_shape(shape, x.numel())
    return x if same_shape(x.shape, shape) else prims.reshape(x, shape)


# ------------------------------------------------------------------ permute / transpose
permute = define("core", "permute", torch.permute, view="shape", recompute=True)


@META_RULES.register(permute)
def _permute_meta(x, dims):
    dims = [normalize_dim(d, x.ndim, "permute") for d in dims]
    if sorted(dims) != list(range(x.ndim)):
        raise ViewError(f"[meta] core.permute: {dims} is not a permutation of {x.ndim} dims")
    return TensorMeta([x.shape[d] for d in dims], [x.stride[d] for d in dims], x.dtype, x.device,
                      x.requires_grad)


@DECOMPOSITIONS.register(permute)
def _permute_decomp(x, dims):
    dims = tuple(normalize_dim(d, x.ndim, "permute") for d in dims)
    return x if dims == tuple(range(x.ndim)) else prims.permute(x, dims)


def _transpose_eager(x, dim0, dim1):
    return torch.transpose(x, dim0, dim1)


transpose = define("core", "transpose", _transpose_eager, view="shape", recompute=True)


def _transpose_dims(ndim, dim0, dim1):
    d0, d1 = normalize_dim(dim0, ndim, "transpose"), normalize_dim(dim1, ndim, "transpose")
    dims = list(range(ndim))
    dims[d0], dims[d1] = dims[d1], dims[d0]
    return dims


@META_RULES.register(transpose)
def _transpose_meta(x, dim0, dim1):
    return _permute_meta(x, _transpose_dims(x.ndim, dim0, dim1))


@DECOMPOSITIONS.register(transpose)
def _transpose_decomp(x, dim0, dim1):
    return _permute_decomp(x, _transpose_dims(x.ndim, dim0, dim1))


# ------------------------------------------------------------------ expand / (un)squeeze
def _expand_eager(x, shape):
    return x.expand(*shape)


expand = define("core", "expand", _expand_eager, view="shape", recompute=True)


def _expanded_shape(x, shape):
    shape = list(shape)
    if len(shape) < x.ndim:
        raise ViewError(f"[meta] core.expand: cannot expand {list(x.shape)} to {shape}")
    lead = len(shape) - x.ndim
    out = []
    for i, s in enumerate(shape):
        if i < lead:
            if s == -1:
                raise ViewError("[meta] core.expand: -1 is not allowed in new leading dimensions")
            out.append(s)
            continue
        have = x.shape[i - lead]
        if s == -1:
            s = have
        if have != s and have != 1:
            raise ViewError(f"[meta] core.expand: size {have} of dim {i - lead} cannot become {s}")
        out.append(s)
    return tuple(out), lead


@META_RULES.register(expand)
def _expand_meta(x, shape):
    out, lead = _expanded_shape(x, shape)
    stride = [0] * lead + [x.stride[k] if x.shape[k] == out[k + lead] else 0 for k in range(x.ndim)]
    return TensorMeta(out, stride, x.dtype, x.device, x.requires_grad)


@DECOMPOSITIONS.register(expand)
def _expand_decomp(x, shape):
    out, lead = _expanded_shape(x, shape)
    if same_shape(out, x.shape):
        return x
    return prims.broadcast_in_dim(x, out, tuple(range(lead, len(out))))


def _unsqueeze_eager(x, dim):
    return torch.unsqueeze(x, dim)


unsqueeze = define("core", "unsqueeze", _unsqueeze_eager, view="shape", recompute=True)


@META_RULES.register(unsqueeze)
def _unsqueeze_meta(x, dim):
    d = normalize_dim(dim, x.ndim + 1, "unsqueeze")
    shape = list(x.shape)
    stride = list(x.stride)
    new_stride = shape[d] * stride[d] if d < x.ndim else 1
    shape.insert(d, 1)
    stride.insert(d, new_stride)
    return TensorMeta(shape, stride, x.dtype, x.device, x.requires_grad)


@DECOMPOSITIONS.register(unsqueeze)
def _unsqueeze_decomp(x, dim):
    d = normalize_dim(dim, x.ndim + 1, "unsqueeze")
    shape = list(x.shape)
    shape.insert(d, 1)
    return prims.broadcast_in_dim(x, tuple(shape), tuple(i for i in range(len(shape)) if i != d))


def _squeeze_eager(x, dims=None):
    return torch.squeeze(x) if dims is None else torch.squeeze(x, dims)


squeeze = define("core", "squeeze", _squeeze_eager, view="shape", recompute=True)


def _squeezed_dims(x, dims):
    if dims is None:
        return [d for d in range(x.ndim) if x.shape[d] == 1]
    dims = [normalize_dim(d, x.ndim, "squeeze") for d in ([dims] if isinstance(dims, int) else list(dims))]
    if len(set(dims)) != len(dims):
        raise RuntimeError(f"[meta] core.squeeze: a dim appears more than once in {dims}")
    # a 0-d tensor's dim 0 is the tensor itself; a dim whose size is not 1 stays, as in eager
    return [d for d in dims if x.ndim and x.shape[d] == 1]


@META_RULES.register(squeeze)
def _squeeze_meta(x, dims=None):
    drop = set(_squeezed_dims(x, dims))
    keep = [d for d in range(x.ndim) if d not in drop]
    return TensorMeta([x.shape[d] for d in keep], [x.stride[d] for d in keep], x.dtype, x.device,
                      x.requires_grad)


@DECOMPOSITIONS.register(squeeze)
def _squeeze_decomp(x, dims=None):
    drop = set(_squeezed_dims(x, dims))
    if not drop:
        return x
    return prims.reshape(x, tuple(x.shape[d] for d in range(x.ndim) if d not in drop))


# ------------------------------------------------------------------ contiguous
def _contiguous_eager(x):
    # core.contiguous is a copy (capture emits it for clone() and where eager copies); x.contiguous()
    # would return x itself, and a graph output aliasing an input lets a later in-place op (after
    # a graph break, on the eager backends) write into the caller's tensor
    return x.clone(memory_format=torch.contiguous_format)


contiguous = define("core", "contiguous", _contiguous_eager, recompute=True, eager_layout="follows")


@META_RULES.register(contiguous)
def _contiguous_meta(x):
    return TensorMeta.contiguous(x.shape, x.dtype, x.device, x.requires_grad)


@DECOMPOSITIONS.register(contiguous)
def _contiguous_decomp(x):
    # The loop IR has no aliasing: every realized value is a fresh contiguous buffer.
    return prims.copy(x)


# ------------------------------------------------------------------ clone
def _clone_eager(x):
    return x.clone()


clone = define("core", "clone", _clone_eager, recompute=True, eager_layout="follows")


@META_RULES.register(clone)
def _clone_meta(x):
    # torch.preserve_format: a dense input keeps its strides
    return TensorMeta(x.shape, preserve_strides(x), x.dtype, x.device, x.requires_grad)


DECOMPOSITIONS[clone] = _contiguous_decomp
