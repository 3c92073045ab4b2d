"""The capture table: which torch callable, Tensor method or operator becomes which core op.

Adapters take what the user wrote, with tensors as graph ``Proxy`` objects and everything else
as plain Python values, normalize the arguments (keyword names, ``alpha``, defaults, operand
order) and call core ops. Adding an op to capture is one line in one of the tables below.
An adapter raises ``Unsupported`` for argument forms it does not cover.
"""
from __future__ import annotations

import sys

import torch
import torch.nn.functional as F

from kiln.capture.errors import Unsupported
from kiln.graph import Proxy
from kiln.meta.symbolic import size_tuple
from kiln.ops import core
from kiln.ops.registry import CAPTURE_FUNCTIONS, CAPTURE_METHODS, CAPTURE_OPERATORS, bind_stage


def _is_tensor(x) -> bool:
    return isinstance(x, Proxy)


def _no_out(name, kwargs):
    if kwargs.get("out") is not None:
        raise Unsupported(f"{name}(out=...) is not supported")


# ------------------------------------------------------------------ adapters
def unary(op):
    def adapter(input, *, out=None):
        _no_out(op.name, {"out": out})
        return op(input)
    adapter.__name__ = op.name
    return adapter


def with_alpha(op):
    def adapter(input, other, *, alpha=1, out=None):
        _no_out(op.name, {"out": out})
        if isinstance(alpha, Proxy):  # a 0-d tensor alpha (SGD's ``alpha=-lr``, a tensor lr):
            # eager reads it as a number, so it scales ``other`` without promoting it
            if alpha.ndim != 0 or not isinstance(other, Proxy) or not other.dtype.is_floating_point:
                raise Unsupported(f"{op.name} with a tensor alpha other than a 0-d one scaling a float tensor")
            return op(input, core.mul(other, core.to_dtype(alpha, other.dtype)))
        return op(input, other, alpha=alpha) if alpha != 1 else op(input, other)
    adapter.__name__ = op.name
    return adapter


def binary(op):
    def adapter(input, other, *, out=None):
        _no_out(op.name, {"out": out})
        return op(input, other)
    adapter.__name__ = op.name
    return adapter


# torch's comparison and maximum/minimum kernels want a tensor first: swap a leading scalar.
_SWAPPED = {core.lt: core.gt, core.gt: core.lt, core.le: core.ge, core.ge: core.le,
            core.eq: core.eq, core.ne: core.ne, core.maximum: core.maximum, core.minimum: core.minimum}


def tensor_first(op):
    def adapter(input, other, *, out=None):
        _no_out(op.name, {"out": out})
        if not _is_tensor(input) and _is_tensor(other):
            return _SWAPPED[op](other, input)
        return op(input, other)
    adapter.__name__ = op.name
    return adapter


def div(input, other, *, rounding_mode=None, out=None):
    _no_out("div", {"out": out})
    if rounding_mode is not None:
        raise Unsupported(f"div(rounding_mode={rounding_mode!r}) is not supported")
    return core.div(input, other)


def where(condition, input=None, other=None, *, out=None):
    _no_out("where", {"out": out})
    if input is None or other is None:
        raise Unsupported("torch.where(condition) with one argument is not supported")
    return core.where(condition, input, other)


def matmul(input, other, *, out=None):
    _no_out("matmul", {"out": out})
    if not (_is_tensor(input) and _is_tensor(other)) or input.ndim != 2 or other.ndim != 2:
        raise Unsupported("matmul is only supported for two 2-D tensors (core.mm)")
    return core.mm(input, other)


def relu_functional(input, inplace=False):
    if inplace:
        raise Unsupported("F.relu(inplace=True) is not supported")
    return core.relu(input)


def linear(input, weight, bias=None):
    return core.linear(input, weight, bias) if bias is not None else core.linear(input, weight)


def square(input):
    # eager's square is pow(input, 2): a bool squares as int64 (an int exponent promotes it)
    if input.dtype == torch.bool:
        input = core.to_dtype(input, torch.int64)
    return core.mul(input, input)


def positive(input):
    return input


# ------------------------------------------------------------------ Tensor methods
def _same_device(x, device) -> bool:
    device = torch.device(device)
    return device.type == x.device.type and (device.index is None or device.index == x.device.index)


def _is_contiguous_as(x, memory_format=None) -> bool:
    """Eager's ``x.is_contiguous(memory_format=...)``, asked of the meta device."""
    if memory_format in (None, torch.contiguous_format):
        return x.meta.is_contiguous()
    try:
        return x.meta.fake().is_contiguous(memory_format=memory_format)
    except Exception:  # noqa: BLE001 - symbolic sizes: not known, so not
        return False


# dims in memory order for each permuted memory format, and back
_FORMAT_ORDER = {torch.channels_last: ((0, 2, 3, 1), (0, 3, 1, 2)),
                 torch.channels_last_3d: ((0, 2, 3, 4, 1), (0, 4, 1, 2, 3))}


def in_memory_format(x, memory_format, copy=False):
    """``x`` laid out in ``memory_format`` (``to``/``contiguous``/``clone(memory_format=)``):
    itself where it already is, unless ``copy``; a channels-last copy is the contiguous copy of
    x with channels innermost, permuted back (eager's strides)."""
    if memory_format in (None, torch.preserve_format):
        return core.clone(x) if copy else x
    if not copy and _is_contiguous_as(x, memory_format):
        return x
    if memory_format is torch.contiguous_format:
        return core.contiguous(x) if not x.meta.is_contiguous() else core.clone(x)
    if memory_format not in _FORMAT_ORDER:
        raise Unsupported(f"memory_format={memory_format} is not supported")
    order, back = _FORMAT_ORDER[memory_format]
    if x.ndim != len(order):  # eager's error, from the user's line
        raise RuntimeError(f"required rank {len(order)} tensor to use {memory_format} format")
    inner = core.permute(x, order)
    inner = core.clone(inner) if inner.meta.is_contiguous() else core.contiguous(inner)
    return core.permute(inner, back)


def to(self, *args, **kwargs):
    dtype = kwargs.pop("dtype", None)
    device = kwargs.pop("device", None)
    kwargs.pop("non_blocking", None)
    copy, memory_format = kwargs.pop("copy", False), kwargs.pop("memory_format", None)
    if kwargs:
        raise Unsupported(f"Tensor.to with arguments {sorted(kwargs)}")
    if copy or memory_format not in (None, torch.preserve_format):
        out = to(self, *args, dtype=dtype, device=device)
        if memory_format not in (None, torch.preserve_format) and not copy:
            # eager keeps the tensor where its suggested format is the one asked for (a
            # permuted tensor stays as it is "to" contiguous_format): ask the meta device
            try:
                fake = out.meta.fake()
                if fake.to(memory_format=memory_format) is fake:
                    return out
            except Exception:  # noqa: BLE001 - symbolic sizes: copy
                pass
            return in_memory_format(out, memory_format, copy=True)
        return in_memory_format(out, memory_format, copy=copy and out is self)
    for a in args:
        if isinstance(a, torch.dtype):
            dtype = a
        elif isinstance(a, (str, torch.device)):
            device = a
        elif _is_tensor(a):
            dtype, device = a.dtype, a.device
        else:
            raise Unsupported(f"Tensor.to({type(a).__name__}) is not supported")
    if device is not None and not _same_device(self, device):
        raise Unsupported(f"Tensor.to(device={device}) across devices is not supported")
    if dtype is None or dtype == self.dtype:
        return self  # torch returns the tensor itself
    return core.to_dtype(self, dtype)


def cast_to(dtype):
    def adapter(self, memory_format=None):
        return self if self.dtype == dtype else core.to_dtype(self, dtype)
    adapter.__name__ = str(dtype)
    return adapter


def type_as(self, other):
    return self if self.dtype == other.dtype else core.to_dtype(self, other.dtype)


def where_method(self, condition, other):
    return core.where(condition, self, other)


def size(self, dim=None):
    # a torch.Size, as .shape gives: Tensor.new(x.size()) reads it as a size, a tuple as data
    return size_tuple(self.shape) if dim is None else self.shape[dim]


def contiguous(self, memory_format=None):
    # eager returns the tensor itself when it is contiguous, else a contiguous copy (a graph
    # output must have eager's strides); capture's mutation tracking handles inputs
    if memory_format not in (None, torch.contiguous_format):
        return in_memory_format(self, memory_format)
    return self if self.meta.is_contiguous() else core.contiguous(self)


TORCH_FUNCTIONS = {
    torch.mul: binary(core.mul), torch.multiply: binary(core.mul),
    torch.div: div, torch.divide: div, torch.true_divide: binary(core.div),
    torch.maximum: tensor_first(core.maximum), torch.minimum: tensor_first(core.minimum),
    torch.eq: tensor_first(core.eq), torch.ne: tensor_first(core.ne),
    torch.lt: tensor_first(core.lt), torch.le: tensor_first(core.le),
    torch.gt: tensor_first(core.gt), torch.ge: tensor_first(core.ge),
    torch.neg: unary(core.neg), torch.negative: unary(core.neg), torch.abs: unary(core.abs),
    torch.relu: unary(core.relu),
    torch.square: square,
    torch.where: where,
    torch.matmul: matmul,
    F.relu: relu_functional, F.linear: linear,
}

TENSOR_METHODS = {
    "mul": binary(core.mul), "multiply": binary(core.mul),
    "div": div, "divide": div, "true_divide": binary(core.div),
    "maximum": tensor_first(core.maximum), "minimum": tensor_first(core.minimum),
    "eq": tensor_first(core.eq), "ne": tensor_first(core.ne), "lt": tensor_first(core.lt),
    "le": tensor_first(core.le), "gt": tensor_first(core.gt), "ge": tensor_first(core.ge),
    "neg": unary(core.neg), "negative": unary(core.neg), "abs": unary(core.abs),
    "relu": unary(core.relu), "square": square,
    "where": where_method, "matmul": matmul,
    "to": to, "type_as": type_as,
    "float": cast_to(torch.float32), "half": cast_to(torch.float16), "double": cast_to(torch.float64),
    "bfloat16": cast_to(torch.bfloat16), "int": cast_to(torch.int32), "long": cast_to(torch.int64),
    "bool": cast_to(torch.bool),
    "contiguous": contiguous,
    # metadata queries: answered from TensorMeta, return Python values (the shape guard covers them)
    "size": size, "dim": lambda self: self.ndim, "ndimension": lambda self: self.ndim,
    "numel": lambda self: self.numel(), "stride": lambda self, dim=None: self.stride(dim),
    "is_contiguous": _is_contiguous_as,
    "is_floating_point": lambda self: self.dtype.is_floating_point,
    "is_complex": lambda self: self.dtype.is_complex,
    "element_size": lambda self: self.dtype.itemsize,
    "__len__": lambda self: _tensor_len(self),  # x.__len__(), as len(x)
}


def _tensor_len(self):
    if self.ndim == 0:
        raise TypeError("len() of a 0-d tensor")  # eager's error
    return self.shape[0]

# Metadata queries torch also spells as functions (``torch.is_complex(x)``, ``input=`` as torch
# names the argument): the same answers from TensorMeta, not a fallback node (which returns no
# tensor, so it cannot be one)
for _name in ("is_floating_point", "is_complex", "numel"):
    TORCH_FUNCTIONS[getattr(torch, _name)] = (lambda method: lambda input: method(input))(TENSOR_METHODS[_name])

# Tensor attributes that are Python values computed from the tensor's metadata.
TENSOR_ATTRIBUTES = {
    "shape": lambda t: size_tuple(t.shape),  # a SymSize when some sizes are symbolic
    "dtype": lambda t: t.dtype,
    "device": lambda t: t.device,
    "ndim": lambda t: t.ndim,
    "requires_grad": lambda t: t.meta.requires_grad,
    "is_cuda": lambda t: t.device.type == "cuda",
    # kiln captures strided dense tensors only (a nested, sparse or quantized input is refused
    # at the frame's entry), so these are known False; nn.MultiheadAttention branches on them
    "is_nested": lambda t: False,
    "is_sparse": lambda t: False,
    "is_quantized": lambda t: False,
    "is_meta": lambda t: t.device.type == "meta",
}

# Tensor attributes that are tensors (views), computed with core ops.
def _transpose_attr(t):
    if t.ndim > 2:
        raise Unsupported("Tensor.T on a tensor with more than 2 dims is deprecated in torch")
    return core.permute(t, tuple(reversed(range(t.ndim)))) if t.ndim == 2 else t


def _complex_part(name):
    """``x.real``: x itself for a real tensor (as eager; ``x.imag`` raises eager's error); a
    complex tensor's part runs as a fallback node (complex values never reach a kernel)."""
    def attr(t):
        if not t.dtype.is_complex:
            if name == "imag":
                raise RuntimeError("imag is not implemented for tensors with non-complex dtypes.")
            return t
        from kiln.capture.fallback import fallback_adapter
        adapter, why = fallback_adapter(getattr(torch, name), f"torch.{name}")
        if adapter is None:
            raise Unsupported(f"Tensor.{name}: {why}")
        return adapter(t)
    return attr


TENSOR_VIEW_ATTRIBUTES = {
    "T": _transpose_attr,
    "mT": lambda t: core.transpose(t, -2, -1),
    "real": _complex_part("real"), "imag": _complex_part("imag"),
    # x.data read: the same memory, outside autograd, as x.detach() (I-BERT's quantizers read
    # x_act.data.min() in training); assigning x.data stays a break
    "data": core.detach,
}

# Operator spelling (dis's argrepr for BINARY_OP / COMPARE_OP) -> adapter.
BINARY_OPERATORS = {
    "*": binary(core.mul),
    "/": binary(core.div), "@": matmul,
    "<": tensor_first(core.lt), "<=": tensor_first(core.le), ">": tensor_first(core.gt),
    ">=": tensor_first(core.ge), "==": tensor_first(core.eq), "!=": tensor_first(core.ne),
}

UNARY_OPERATORS = {"-": unary(core.neg), "+": positive, "abs": unary(core.abs),
                   "~": unary(core.bitwise_not)}


def callable_name(fn) -> str:
    mod = getattr(fn, "__module__", None) or ""
    name = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or repr(fn)
    if mod in ("torch", "torch._C._VariableFunctions") or mod.startswith("torch._C"):
        mod = "torch"
    if mod == "torch.nn.functional":
        mod = "F"
    return f"{mod}.{name}" if mod and mod != "builtins" else name


# Op families kept in their own files, merged into the tables above.
from kiln.capture import torch_api_reductions as _reductions  # noqa: E402

TORCH_FUNCTIONS.update(_reductions.FUNCTIONS)
TENSOR_METHODS.update(_reductions.METHODS)

from kiln.capture import torch_api_more as _more  # noqa: E402

TORCH_FUNCTIONS.update(_more.TORCH_FUNCTIONS)
TENSOR_METHODS.update(_more.TENSOR_METHODS)
BINARY_OPERATORS.update(_more.BINARY_OPERATORS)
from kiln.capture import torch_api_nn as _nn  # noqa: E402

TORCH_FUNCTIONS.update(_nn.FUNCTIONS)
TENSOR_METHODS.update(_nn.METHODS)
BINARY_OPERATORS.update(_nn.BINARY_OPERATORS)
from kiln.capture import torch_api_creation as _creation  # noqa: E402

TORCH_FUNCTIONS.update(_creation.FUNCTIONS)
TENSOR_METHODS.update(_creation.METHODS)
from kiln.capture import torch_api_pool as _pool  # noqa: E402

TORCH_FUNCTIONS.update(_pool.FUNCTIONS)
TENSOR_METHODS.update(_pool.METHODS)
from kiln.capture import torch_api_inplace as _inplace  # noqa: E402

# Spellings declared in their op's own file (ops/op_*.py), written with this module's adapters
# through the "capture" stage handle, which binding resolves. An op's spellings live in one
# place: none may also be in the tables above.
bind_stage("capture", sys.modules[__name__])
for _table, _declared in ((TORCH_FUNCTIONS, CAPTURE_FUNCTIONS), (TENSOR_METHODS, CAPTURE_METHODS),
                          (BINARY_OPERATORS, CAPTURE_OPERATORS)):
    _twice = [k for k in _declared if k in _table]
    if _twice:
        raise AssertionError(f"[capture] spelled both in capture/torch_api*.py and in an op file: {_twice}")
    _table.update(_declared)

# In-place forms last: they are derived from the functional entries above.
_inplace_functions, _inplace_methods = _inplace.build_tables(TORCH_FUNCTIONS, TENSOR_METHODS)
TORCH_FUNCTIONS.update(_inplace_functions)
TENSOR_METHODS.update(_inplace_methods)

# torch._foreach_* (torch.optim's foreach paths): per-element calls of the entries above
from kiln.capture import torch_api_foreach as _foreach  # noqa: E402

TORCH_FUNCTIONS.update(_foreach.build_table(TENSOR_METHODS, TORCH_FUNCTIONS))
