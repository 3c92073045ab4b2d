"""The capture table, continued: elementwise math, activations, views and shape ops.

``torch_api`` merges these tables into its own at import time, so the capture stage still
reads one table per kind (torch callables, Tensor methods, operators).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from kiln.capture.errors import Unsupported
from kiln.capture.known_constants import as_size
from kiln.graph import Proxy
from kiln.meta.symbolic import SymInt, is_int_like
from kiln.ops import core
from kiln.ops.promotion import broadcast_shapes


def _is_tensor(x) -> bool:
    return isinstance(x, Proxy)


def _no_out(name, out):
    if out is not None:
        raise Unsupported(f"{name}(out=...) is not supported")


def _no_inplace(name, inplace):
    if inplace:
        raise Unsupported(f"{name}(inplace=True) is not supported")


def unary(op):
    def adapter(input, *, out=None):
        _no_out(op.name, out)
        return op(input)
    adapter.__name__ = op.name
    return adapter


def binary(op):
    def adapter(input, other, *, out=None):
        _no_out(op.name, out)
        return op(input, other)
    adapter.__name__ = op.name
    return adapter


def reflected(op):
    """For operators whose left operand is a Python scalar (``2 ** x``, ``7 // x``)."""
    return binary(op)


# ------------------------------------------------------------------ elementwise
def round_(input, *, decimals=0, out=None):
    _no_out("round", out)
    return core.round(input, decimals) if decimals else core.round(input)


def pow_(input, exponent, *, out=None):
    _no_out("pow", out)
    return core.pow(input, exponent)


def div_rounding(input, other, *, rounding_mode=None, out=None):
    _no_out("div", out)
    if rounding_mode is None:
        return core.div(input, other)
    if rounding_mode == "floor":
        return core.floor_divide(input, other)
    if rounding_mode == "trunc":
        return core.trunc_divide(input, other)
    raise ValueError(f"div expected rounding_mode to be one of None, 'trunc', or 'floor' but found "
                     f"'{rounding_mode}'")


def clamp(input, min=None, max=None, *, out=None):
    _no_out("clamp", out)
    if min is None and max is None:
        raise Unsupported("clamp needs at least one of min and max")
    return core.clamp(input, min, max)


def clamp_min(input, min):
    return core.clamp(input, min, None)


def clamp_max(input, max):
    return core.clamp(input, None, max)


def lerp(input, end, weight, *, out=None):
    _no_out("lerp", out)
    return core.lerp(input, end, weight)


def addc(op):
    def adapter(input, tensor1, tensor2, *, value=1, out=None):
        _no_out(op.name, out)
        if isinstance(value, Proxy):  # a 0-d tensor value, as eager takes it
            return op(input, tensor1, tensor2, value)
        return op(input, tensor1, tensor2, value) if value != 1 else op(input, tensor1, tensor2)
    adapter.__name__ = op.name
    return adapter


def masked_fill(input, mask, value):
    return core.masked_fill(input, mask, value)


def nan_to_num(input, nan=0.0, posinf=None, neginf=None, *, out=None):
    _no_out("nan_to_num", out)
    return core.nan_to_num(input, nan, posinf, neginf)


# ------------------------------------------------------------------ activations
def gelu(input, approximate="none"):
    return core.gelu(input, approximate) if approximate != "none" else core.gelu(input)


def silu(input, inplace=False):
    _no_inplace("silu", inplace)
    return core.silu(input)


def relu6(input, inplace=False):
    _no_inplace("relu6", inplace)
    return core.hardtanh(input, 0.0, 6.0)


def hardtanh(input, min_val=-1.0, max_val=1.0, inplace=False):
    _no_inplace("hardtanh", inplace)
    return core.hardtanh(input, float(min_val), float(max_val))


def leaky_relu(input, negative_slope=0.01, inplace=False):
    _no_inplace("leaky_relu", inplace)
    return core.leaky_relu(input, float(negative_slope))


def elu(input, alpha=1.0, inplace=False):
    _no_inplace("elu", inplace)
    return core.elu(input, float(alpha))


def _plain(op):
    def adapter(input, inplace=False):
        _no_inplace(op.name, inplace)
        return op(input)
    adapter.__name__ = op.name
    return adapter


def softplus(input, beta=1.0, threshold=20.0):
    return core.softplus(input, float(beta), float(threshold))


# ------------------------------------------------------------------ conversions
_TENSOR_TYPES = {
    "FloatTensor": torch.float32, "DoubleTensor": torch.float64, "HalfTensor": torch.float16,
    "BFloat16Tensor": torch.bfloat16, "LongTensor": torch.int64, "IntTensor": torch.int32,
    "ShortTensor": torch.int16, "CharTensor": torch.int8, "ByteTensor": torch.uint8,
    "BoolTensor": torch.bool, "ComplexFloatTensor": torch.complex64,
    "ComplexDoubleTensor": torch.complex128,
}
_TYPE_NAMES = {dtype: name for name, dtype in _TENSOR_TYPES.items()}


def type_(self, dtype=None, non_blocking=False, **kwargs):
    """``Tensor.type()``: the legacy type name, a string computed from the dtype and device
    (both guarded); ``Tensor.type(t)`` with a dtype, such a name, or a legacy class
    (``torch.HalfTensor``) casts, on the tensor's own device only (another moves it: a break)."""
    if dtype is None:
        if self.dtype not in _TYPE_NAMES:
            raise Unsupported(f"Tensor.type() of a {self.dtype} tensor")
        device = self.device.type
        return f"torch.{_TYPE_NAMES[self.dtype]}" if device == "cpu" else \
            f"torch.{device}.{_TYPE_NAMES[self.dtype]}"
    if isinstance(dtype, type) and type(dtype).__name__ == "tensortype":  # torch.HalfTensor
        dtype = f"{dtype.__module__}.{dtype.__name__}"
    if isinstance(dtype, str):
        prefix, _, name = dtype.rpartition(".")
        device = "cpu" if prefix == "torch" else prefix.partition(".")[2]
        if name not in _TENSOR_TYPES or not prefix.startswith("torch") or device != self.device.type:
            raise Unsupported(f"Tensor.type({dtype!r}) on a {self.device.type} tensor is not supported")
        dtype = _TENSOR_TYPES[name]
    if not isinstance(dtype, torch.dtype):
        raise Unsupported(f"Tensor.type({type(dtype).__name__}) is not supported")
    return self if dtype == self.dtype else core.to_dtype(self, dtype)


def cast_to(dtype):
    def adapter(self, memory_format=None):
        return self if self.dtype == dtype else core.to_dtype(self, dtype)
    adapter.__name__ = str(dtype)
    return adapter


# ------------------------------------------------------------------ views and shapes
def _sizes(args):
    """view(2, 3), view((2, 3)) and view([2, 3]) all mean (2, 3)."""
    if len(args) == 1 and isinstance(args[0], (tuple, list, torch.Size)):
        return tuple(args[0])
    return tuple(args)


def _check_ints(name, sizes):
    sizes = tuple(as_size(s) for s in sizes)  # a 0-d integer constant reads as its int, as in eager
    for s in sizes:
        if not is_int_like(s):  # an int or a symbolic size
            raise Unsupported(f"{name}: size {s!r} is not a Python int")
    return sizes


def reshape(input, *shape):
    shape = _check_ints("reshape", _sizes(shape))
    return core.reshape(input, shape)


def view(self, *shape, dtype=None, size=None):
    # eager's two overloads, by position or keyword: view(*size) / view(size=...), view(dtype)
    if dtype is not None or size is not None:
        if shape or (dtype is None) == (size is None):
            raise TypeError("view() takes either a size or a dtype")
        shape = (dtype,) if dtype is not None else (size,)
    if len(shape) == 1 and isinstance(shape[0], torch.dtype):  # a bitcast view (core_view_dtype.py)
        return core.view_dtype(self, shape[0])
    # kiln has no aliasing: view has reshape's semantics (a copy is never observable)
    return reshape(self, *shape)


def view_as(self, other):
    return core.reshape(self, tuple(other.shape))


def flatten(input, start_dim=0, end_dim=-1):
    if input.ndim == 0:
        return core.reshape(input, (1,))
    start = start_dim % input.ndim
    end = end_dim % input.ndim
    if start > end:
        raise ValueError("flatten() has invalid args: start_dim cannot come after end_dim")
    if start == end:
        return input
    shape = tuple(input.shape[:start]) + (-1,) + tuple(input.shape[end + 1:])
    return core.reshape(input, shape)


def unflatten(input, dim, sizes):
    d = dim % input.ndim
    shape = tuple(input.shape[:d]) + tuple(sizes) + tuple(input.shape[d + 1:])
    return core.reshape(input, shape)


def permute(input, *dims):
    return core.permute(input, _sizes(dims))


def transpose(input, dim0, dim1):
    return core.transpose(input, dim0, dim1)


def t(input):
    if input.ndim > 2:
        raise ValueError(f"t() expects a tensor with <= 2 dimensions, but self is {input.ndim}D")
    return core.transpose(input, 0, 1) if input.ndim == 2 else input


def expand(self, *sizes, implicit=False):
    return core.expand(self, _sizes(sizes))


def broadcast_tensors(*tensors):
    """Each tensor expanded to the shapes' broadcast (a view, differentiable through expand);
    torch.functional's wrapper (smooth_l1_loss, huber_loss) calls torch.broadcast_tensors."""
    if len(tensors) == 1 and isinstance(tensors[0], (list, tuple)):
        tensors = tuple(tensors[0])
    try:
        shape = broadcast_shapes(*[tuple(t.shape) for t in tensors])
    except ValueError as e:  # eager's RuntimeError, raised by eager itself
        raise Unsupported(f"broadcast_tensors: {e}") from None
    return tuple(t if tuple(t.shape) == shape else core.expand(t, shape) for t in tensors)


def expand_as(self, other):
    return core.expand(self, tuple(other.shape))


def unsqueeze(input, dim):
    return core.unsqueeze(input, dim)


def squeeze(input, dim=None, *dims):
    if dims:  # Tensor.squeeze(0, 2): the dims as varargs
        dim = (dim, *dims)
    return core.squeeze(input) if dim is None else core.squeeze(input, dim)


def narrow(input, dim, start, length):
    if _is_tensor(start):
        raise Unsupported("narrow with a tensor start is not supported")
    size = input.shape[dim]
    start = start + size if start < 0 else start
    if start < 0 or length < 0 or start + length > size:
        raise IndexError(f"start ({start}) + length ({length}) exceeds dimension size ({size}).")
    return core.slice(input, dim, start, start + length)


def select(input, dim, index):
    return core.select(input, dim, index)


def split(tensor, split_size_or_sections, dim=0):
    size = tensor.shape[dim]
    if is_int_like(split_size_or_sections):
        step = split_size_or_sections
        if step <= 0 and size:
            raise RuntimeError(f"split expects split_size be non-negative, but got split_size={step}")
        if not size:
            return (core.slice(tensor, dim, 0, 0),)
        # the number of pieces is a Python int (a guard on it, where the sizes are symbolic);
        # the bounds stay expressions: each piece but the last is one step long
        n = int((size + step - 1) // step)
        bounds = [(i * step, (i + 1) * step) for i in range(n - 1)] + [((n - 1) * step, size)]
    else:
        sections = list(split_size_or_sections)
        if sum(sections) != size:
            raise RuntimeError(f"split_with_sizes expects split_sizes to sum exactly to {size} "
                               f"(input tensor's size at dimension {dim}), but got split_sizes={sections}")
        bounds, start = [], 0
        for s in sections:
            bounds.append((start, start + s))
            start += s
    return tuple(core.slice(tensor, dim, a, b) for a, b in bounds)


def chunk(input, chunks, dim=0):
    if chunks <= 0:
        raise RuntimeError("chunk expects `chunks` to be greater than 0")
    size = input.shape[dim]
    # torch's ceil(size / chunks), kept an expression for a symbolic size
    step = (size + chunks - 1) // chunks if size else 1
    return split(input, step, dim)


def unbind(input, dim=0):
    return tuple(core.select(input, dim, i) for i in range(input.shape[dim]))


def cat(tensors, dim=0, *, out=None):
    _no_out("cat", out)
    return core.cat(list(tensors), dim)


def stack(tensors, dim=0, *, out=None):
    _no_out("stack", out)
    tensors = list(tensors)
    if not tensors:
        raise RuntimeError("stack expects a non-empty TensorList")
    return core.cat([core.unsqueeze(t, dim) for t in tensors], dim)


def flip(input, *dims, **kwargs):
    if kwargs:  # flip(dims=[0]), as torch.flip and Tensor.flip both name it
        if dims or set(kwargs) != {"dims"}:
            raise TypeError(f"flip() got unexpected arguments {sorted(kwargs)}")  # eager's kind of error
        dims = (kwargs["dims"],)
    return core.flip(input, _sizes(dims))


def roll(input, shifts, dims=None):
    return core.roll(input, shifts, dims) if dims is not None else core.roll(input, shifts)


def tri(op):
    def adapter(input, diagonal=0, *, out=None):
        _no_out(op.name, out)
        return op(input, diagonal) if diagonal else op(input)
    adapter.__name__ = op.name
    return adapter


def repeat(self, *sizes):
    return core.repeat(self, _sizes(sizes))


def repeat_interleave(input, repeats=None, dim=None, *, output_size=None):
    """Each element ``repeats`` times in a row along ``dim`` (the flattened input for None): a
    broadcast over a new dim after ``dim`` and a reshape. Only an int count: a tensor of counts
    makes the shape depend on the data (a break)."""
    if repeats is None or isinstance(repeats, Proxy) or isinstance(repeats, bool) \
            or not isinstance(repeats, int):
        raise Unsupported("repeat_interleave with tensor repeats (a data-dependent shape)")
    if repeats < 0:
        raise RuntimeError("repeats can not be negative")
    if dim is None:
        input, dim = core.reshape(input, (-1,)), 0
    dim = dim + input.ndim if dim < 0 else dim
    if not 0 <= dim < max(input.ndim, 1):
        raise IndexError(f"Dimension out of range (got {dim} for a {input.ndim}-d tensor)")
    if input.ndim == 0:
        input = core.reshape(input, (1,))
    shape = tuple(input.shape)
    grown = core.expand(core.unsqueeze(input, dim + 1), shape[:dim + 1] + (repeats,) + shape[dim + 1:])
    out = core.reshape(grown, shape[:dim] + (shape[dim] * repeats,) + shape[dim + 1:])
    # eager's result is a fresh contiguous tensor: never a view of the input (a write to it
    # must not reach the input), nor a broadcast one
    return core.clone(out) if out.meta.is_contiguous() else core.contiguous(out)


def pad(input, pad, mode="constant", value=None):
    if mode != "constant":
        raise Unsupported(f"F.pad(mode={mode!r}) is not supported (constant only)")
    return core.constant_pad(input, tuple(pad), 0.0 if value is None else value)


def getitem(self, key):
    """Basic indexing: ints, slices, None and Ellipsis, as views; a key with index tensors or
    lists of ints is advanced indexing (``torch_api_index``)."""
    key = key if isinstance(key, tuple) else (key,)
    from kiln.capture import torch_api_index
    if torch_api_index.has_advanced(key):
        return torch_api_index.getitem(self, key)
    for k in key:
        if k is not None and k is not Ellipsis and not isinstance(k, (int, slice, SymInt)) or isinstance(k, bool):
            raise Unsupported(f"indexing a tensor with {type(k).__name__} is not supported")
    consumed = sum(1 for k in key if k is not None and k is not Ellipsis)
    if consumed > self.ndim:
        raise IndexError(f"too many indices for tensor of dimension {self.ndim}")
    if sum(1 for k in key if k is Ellipsis) > 1:
        raise IndexError("an index can only have a single ellipsis ('...')")
    expanded = []
    for k in key:
        if k is Ellipsis:
            expanded += [slice(None)] * (self.ndim - consumed)
        else:
            expanded.append(k)
    out, d = self, 0
    for k in expanded:
        if k is None:
            out = core.unsqueeze(out, d)
            d += 1
        elif isinstance(k, (int, SymInt)):  # a symbolic index (a dynamic int) selects too
            out = core.select(out, d, k)
        else:
            if not (k.start is None and k.stop is None and k.step in (None, 1)):
                step = 1 if k.step is None else k.step
                if step <= 0:
                    raise ValueError("step must be greater than zero")
                out = core.slice(out, d, k.start, k.stop, step)
            d += 1
    return out


# ------------------------------------------------------------------ tables
_UNARY = {
    "floor": core.floor, "ceil": core.ceil, "trunc": core.trunc, "fix": core.trunc,
    "sign": core.sign, "reciprocal": core.reciprocal, "exp2": core.exp2, "expm1": core.expm1,
    "log2": core.log2, "log10": core.log10, "log1p": core.log1p, "sin": core.sin, "cos": core.cos,
    "erf": core.erf, "isnan": core.isnan, "isinf": core.isinf, "isfinite": core.isfinite,
    "logical_not": core.logical_not, "bitwise_not": core.bitwise_not,
}
_BINARY = {
    "fmod": core.fmod, "remainder": core.remainder, "floor_divide": core.floor_divide,
    "logical_and": core.logical_and, "logical_or": core.logical_or, "logical_xor": core.logical_xor,
    "bitwise_and": core.bitwise_and, "bitwise_or": core.bitwise_or, "bitwise_xor": core.bitwise_xor,
    "bitwise_left_shift": core.bitwise_left_shift, "bitwise_right_shift": core.bitwise_right_shift,
}

TORCH_FUNCTIONS = {getattr(torch, n): unary(op) for n, op in _UNARY.items()}
TORCH_FUNCTIONS.update({getattr(torch, n): binary(op) for n, op in _BINARY.items()})
TORCH_FUNCTIONS.update({
    torch.repeat_interleave: repeat_interleave,
    torch.round: round_, torch.pow: pow_, torch.div: div_rounding, torch.divide: div_rounding,
    torch.clamp: clamp, torch.clip: clamp, torch.clamp_min: clamp_min, torch.clamp_max: clamp_max,
    torch.lerp: lerp, torch.addcmul: addc(core.addcmul), torch.addcdiv: addc(core.addcdiv),
    torch.masked_fill: masked_fill, torch.nan_to_num: nan_to_num,
    torch.special.erf: unary(core.erf), torch.special.expm1: unary(core.expm1),
    torch.special.exp2: unary(core.exp2), torch.special.log1p: unary(core.log1p),
    F.gelu: gelu, F.silu: silu, F.relu6: relu6, F.hardtanh: hardtanh, F.leaky_relu: leaky_relu,
    F.elu: elu, F.hardswish: _plain(core.hardswish), F.hardsigmoid: _plain(core.hardsigmoid),
    F.mish: _plain(core.mish), F.softplus: softplus,
    # views and shapes
    torch.reshape: reshape, torch.flatten: flatten, torch.unflatten: unflatten,
    torch.permute: permute, torch.transpose: transpose, torch.swapaxes: transpose,
    torch.t: t, torch.unsqueeze: unsqueeze, torch.squeeze: squeeze,
    torch.narrow: narrow, torch.select: select, torch.split: split, torch.chunk: chunk,
    torch.unbind: unbind, torch.cat: cat, torch.concat: cat, torch.concatenate: cat,
    torch.stack: stack, torch.flip: flip, torch.roll: roll,
    torch.broadcast_tensors: broadcast_tensors,
    torch.tril: tri(core.tril), torch.triu: tri(core.triu), F.pad: pad,
    # F.pad is a Python wrapper of this builtin, which is what Dynamo's graphs call
    # (torch.compile(backend="kiln"), kiln/interop/)
    torch._C._nn.pad: pad,
})

TENSOR_METHODS = {n: unary(op) for n, op in _UNARY.items()}
TENSOR_METHODS.update({n: binary(op) for n, op in _BINARY.items()})
TENSOR_METHODS.update({
    "round": round_, "pow": pow_, "div": div_rounding, "divide": div_rounding,
    "clamp": clamp, "clip": clamp, "clamp_min": clamp_min, "clamp_max": clamp_max,
    "lerp": lerp, "addcmul": addc(core.addcmul), "addcdiv": addc(core.addcdiv),
    "masked_fill": masked_fill, "nan_to_num": nan_to_num,
    "type": type_, "short": cast_to(torch.int16), "char": cast_to(torch.int8),
    "byte": cast_to(torch.uint8),
    "view": view, "reshape": reshape, "view_as": view_as, "reshape_as": view_as,
    "flatten": flatten, "unflatten": unflatten, "permute": permute, "transpose": transpose,
    "swapaxes": transpose, "t": t, "expand": expand, "expand_as": expand_as,
    "unsqueeze": unsqueeze, "squeeze": squeeze, "narrow": narrow, "select": select,
    "split": split, "chunk": chunk, "unbind": unbind, "flip": flip, "roll": roll,
    "tril": tri(core.tril), "triu": tri(core.triu), "repeat": repeat,
    "repeat_interleave": repeat_interleave,
    "__getitem__": getitem,
})

BINARY_OPERATORS = {
    "**": pow_, "//": binary(core.floor_divide), "%": binary(core.remainder),
    "&": binary(core.bitwise_and), "|": binary(core.bitwise_or), "^": binary(core.bitwise_xor),
    "<<": binary(core.bitwise_left_shift), ">>": binary(core.bitwise_right_shift),
}
