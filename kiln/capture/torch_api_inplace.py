"""Capture-table entries for in-place ops (merged into torch_api's tables).

An in-place adapter computes the tensor's new value with core ops, like any adapter, and
returns ``Writes``: which argument receives which new value, and what the call returns.
Capture (``kiln/capture/mutation.py``) then functionalizes the write: it updates the storage
the argument aliases, so every view of it sees the new value, and a mutated graph input is
written back after the compiled graph runs.

The in-place form of an elementwise method ``foo_`` is ``foo`` followed by a write, so this
table is built from the functional tables, one line per name.
"""
from __future__ import annotations

import inspect

import torch
import torch.nn.functional as F

from kiln.capture.errors import Unsupported
from kiln.graph import Proxy
from kiln.graph.node import flatten_args
from kiln.ops import core
from kiln.ops.registry import INPLACE_METHODS


class Writes:
    """An adapter's answer for a call that mutates arguments.

    ``updates`` is a list of (argument proxy, new value) pairs, the proxy being the very object
    the adapter received; ``result`` is what the call returns (often one of the arguments).
    """
    __slots__ = ("updates", "result")

    def __init__(self, updates, result):
        self.updates = list(updates)
        self.result = result


class Rebinds:
    """An adapter's answer for an in-place view op (``unsqueeze_``, ``t_``): the argument
    ``target`` becomes the view ``view`` of itself (same memory, new shape and strides); the
    call returns it. Capture rebinds the argument's Variable, which every Python reference to
    that tensor shares."""
    __slots__ = ("target", "view")

    def __init__(self, target, view):
        self.target, self.view = target, view


def rebind_of(functional):
    """``self.foo_(*a)`` for a view op foo: self becomes ``self.foo(*a)``."""
    def adapter(self, *args, **kwargs):
        return Rebinds(self, functional(self, *args, **kwargs))
    adapter.__name__ = getattr(functional, "__name__", "view") + "_"
    return adapter


# View methods whose in-place form changes the tensor's shape and strides, not its memory.
REBIND_FROM_VIEW = ("unsqueeze", "squeeze", "transpose", "t", "swapdims", "swapaxes")


def _is_tensor(x) -> bool:
    return isinstance(x, Proxy)


# ------------------------------------------------------------------ method_ from method
def inplace_of(functional):
    """``self.foo_(*a)`` = write ``self.foo(*a)`` into self; returns self."""
    def adapter(self, *args, **kwargs):
        return Writes([(self, functional(self, *args, **kwargs))], self)
    adapter.__name__ = getattr(functional, "__name__", "inplace") + "_"
    return adapter


# Elementwise methods whose in-place form is the functional one plus a write (with
# registry.INPLACE_METHODS: those declared in their op's own file, ops/op_*.py).
INPLACE_FROM_FUNCTIONAL = (
    "mul", "multiply", "div", "divide", "true_divide", "neg", "negative",
    "abs", "relu", "square", "pow", "floor",
    "ceil", "trunc", "fix", "round", "sign", "reciprocal", "exp2", "expm1", "log2", "log10",
    "log1p", "sin", "cos", "erf", "clamp", "clip", "clamp_min", "clamp_max", "lerp", "addcmul",
    "addcdiv", "masked_fill", "nan_to_num", "fmod", "remainder", "floor_divide", "logical_not",
    "logical_and", "logical_or", "logical_xor", "bitwise_not", "bitwise_and", "bitwise_or",
    "bitwise_xor", "maximum", "minimum", "eq", "ne", "lt", "le", "gt", "ge",
    "acos", "asin", "atan", "tan", "sinh", "cosh", "asinh", "acosh", "atanh", "arccos", "arcsin",
    "arctan", "arcsinh", "arccosh", "arctanh", "atan2", "arctan2", "hypot", "erfc", "frac",
    "deg2rad", "rad2deg", "copysign", "lgamma", "digamma", "sgn", "logit", "sinc", "heaviside",
    "xlogy", "i0", "nextafter", "ldexp", "gcd", "lcm", "bitwise_left_shift", "bitwise_right_shift",
)


# ------------------------------------------------------------------ writes of given values
def _fill_value(self, value):
    """``value`` (a Python number or a tensor) broadcast to self's shape, in self's dtype."""
    shape = tuple(self.shape)
    if _is_tensor(value):
        v = value
        while v.ndim > len(shape) and v.shape[0] == 1:  # eager drops leading size-1 dims here
            v = core.squeeze(v, 0)
        if v.dtype != self.dtype:
            v = core.to_dtype(v, self.dtype)
        if v.device != self.device and v.ndim != 0:
            raise Unsupported(f"copying a {v.device} tensor into a {self.device} tensor")
        return core.expand(v, shape) if tuple(v.shape) != shape else core.contiguous(v)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        if not isinstance(value, bool):
            raise Unsupported(f"writing a {type(value).__name__} into a tensor is not supported")
    if self.dtype == torch.bool:
        value = bool(value)
    elif not self.dtype.is_floating_point and not self.dtype.is_complex:
        value = int(value)
    return core.full(shape, value, self.dtype, self.device)


def copy_(self, src, non_blocking=False):
    if not _is_tensor(src):
        raise TypeError("copy_(): argument 'src' must be Tensor")
    return Writes([(self, _fill_value(self, src))], self)


def fill_(self, value):
    if _is_tensor(value) and value.ndim != 0:
        raise RuntimeError(f"fill_ only supports 0-dimension value tensor but got tensor with "
                           f"{value.ndim} dimensions.")
    return Writes([(self, _fill_value(self, value))], self)


def zero_(self):
    return Writes([(self, _fill_value(self, 0))], self)


def _index_dim(self, dim, index, name):
    if not _is_tensor(index) or index.ndim > 1 or index.dtype not in (torch.int64, torch.int32):
        raise Unsupported(f"{name}: index must be a 1-d integer tensor")
    return core.reshape(index, (-1,)) if index.ndim == 0 else index


def _index_put_values(self, dim, index, values):
    shape = list(self.shape)
    shape[dim % self.ndim] = index.shape[0]
    return _fill_value(_Shaped(tuple(shape), self.dtype, self.device), values)


class _Shaped:
    """Shape, dtype and device of a tensor that does not exist yet (for _fill_value)."""
    __slots__ = ("shape", "dtype", "device")

    def __init__(self, shape, dtype, device):
        self.shape, self.dtype, self.device = shape, dtype, device


def index_put_(self, indices, values, accumulate=False):
    return Writes([(self, index_put(self, indices, values, accumulate))], self)


def _index_put_value(self, indices, values, accumulate):
    from kiln.capture import torch_api_index
    entries = torch_api_index.index_put_entries(self, tuple(indices))
    return torch_api_index.put(self, entries, values, accumulate)


def index_copy_(self, dim, index, source):
    idx = _index_dim(self, dim, index, "index_copy_")
    return Writes([(self, core.index_put(self, dim, idx, _index_put_values(self, dim, idx, source)))], self)


def index_add_(self, dim, index, source, *, alpha=1):
    return Writes([(self, core.index_add(self, dim, index, source, alpha))], self)


def index_fill_(self, dim, index, value):
    idx = _index_dim(self, dim, index, "index_fill_")
    return Writes([(self, core.index_put(self, dim, idx, _index_put_values(self, dim, idx, value)))], self)


def scatter_(self, dim, index, src=None, value=None, *, reduce=None):
    if reduce is not None:  # the functional form's rule: scatter_add, else a fallback node
        return Writes([(self, scatter(self, dim, index, src, value, reduce=reduce))], self)
    if src is None:
        src = value
    if not _is_tensor(src):
        src = core.full(tuple(index.shape), src, self.dtype, self.device)
    elif tuple(src.shape) != tuple(index.shape):
        src = _crop(src, index)
    return Writes([(self, core.scatter(self, dim, index, core.to_dtype(src, self.dtype)
                                       if src.dtype != self.dtype else src))], self)


def _crop(src, index):
    out = src
    for d, n in enumerate(index.shape):
        if src.shape[d] != n:
            out = core.slice(out, d, 0, n)
    return out


def scatter_add_(self, dim, index, src):
    if tuple(src.shape) != tuple(index.shape):
        src = _crop(src, index)
    return Writes([(self, core.scatter_add(self, dim, index, src))], self)


def masked_assign(self, dim, mask, value):
    """``self[..., mask] = value`` for a bool mask over dims dim.. of self and a value that
    broadcasts over the dims after the mask (or a scalar)."""
    k = mask.ndim
    if tuple(self.shape[dim:dim + k]) != tuple(mask.shape):
        raise IndexError(f"The shape of the mask {list(mask.shape)} does not match the shape of the "
                         f"indexed tensor {list(self.shape)}")
    m = mask
    for _ in range(self.ndim - dim - k):
        m = core.unsqueeze(m, -1)
    if _is_tensor(value):
        if value.ndim > self.ndim - dim - k:
            raise Unsupported("assigning a tensor through a bool mask is data-dependent (its number "
                              "of elements is the mask's count)")
        if value.dtype != self.dtype:
            value = core.to_dtype(value, self.dtype)
        return core.where(m, value, self)
    return core.masked_fill(self, m, value)


# ------------------------------------------------------------------ functional forms
# torch.scatter / torch.index_put (and their methods) are the in-place adapters' new value,
# without the write. Forms the core ops do not cover (a scatter reduce, several index tensors)
# stay whole as fallback nodes when no gradient is needed, and are graph breaks otherwise.
def _or_fallback(name, cover, *args, **kwargs):
    try:
        return cover()
    except Unsupported as e:
        if _needs_grad(*flatten_args((args, kwargs))):
            raise Unsupported(f"{name}: {e}; a fallback node cannot give the gradient it needs") from None
        return core.fallback(name, *args, **kwargs)


def _needs_grad(*tensors):
    return torch.is_grad_enabled() and any(_is_tensor(t) and t.meta.requires_grad for t in tensors)


def _same_dtype(name, input, other, what):
    if _is_tensor(other) and other.dtype != input.dtype:
        raise RuntimeError(f"{name}(): Expected self.dtype to be equal to {what}.dtype "
                           f"({input.dtype} vs {other.dtype})")


def scatter(input, dim, index, src=None, value=None, *, reduce=None, out=None):
    if out is not None:
        raise Unsupported("scatter(out=...) is not supported")
    src = value if src is None else src
    _same_dtype("scatter", input, src, "src")
    if reduce is not None:
        def cover():
            # eager's scatter(reduce=) has no derivative: with a gradient it stays eager's
            if reduce == "add" and _is_tensor(src) and not _needs_grad(input, src):
                return scatter_add_(input, dim, index, src).updates[0][1]
            raise Unsupported(f"scatter(reduce={reduce!r}) has no core op")
        return _or_fallback("torch.scatter", cover, input, dim, index, src, reduce=reduce)
    return scatter_(input, dim, index, src).updates[0][1]


def scatter_reduce(input, dim, index, src, reduce, *, include_self=True, out=None):
    """``reduce='sum'`` over the input is scatter_add; the other reductions (prod, mean, amax,
    amin) and ``include_self=False`` stay whole as fallback nodes."""
    if out is not None:
        raise Unsupported("scatter_reduce(out=...) is not supported")
    _same_dtype("scatter_reduce", input, src, "src")

    def cover():
        if reduce == "sum" and include_self:
            return scatter_add_(input, dim, index, src).updates[0][1]
        raise Unsupported(f"scatter_reduce(reduce={reduce!r}, include_self={include_self}) has "
                          "no core op")
    return _or_fallback("torch.scatter_reduce", cover, input, dim, index, src, reduce,
                        include_self=include_self)


def scatter_reduce_(self, dim, index, src, reduce, *, include_self=True):
    return Writes([(self, scatter_reduce(self, dim, index, src, reduce,
                                         include_self=include_self))], self)


def index_put(input, indices, values, accumulate=False):
    _same_dtype("index_put", input, values, "values")
    # torch.index_put's binding takes no None among the indices; the aten op does
    name = "torch.ops.aten.index_put.default" if any(i is None for i in indices) else "torch.index_put"
    return _or_fallback(name,
                        lambda: _index_put_value(input, indices, values, accumulate),
                        input, tuple(indices), values, accumulate)


# ------------------------------------------------------------------ F.*(inplace=True)
def with_inplace_flag(fn, functional):
    """An adapter for ``fn(..., inplace=...)``: the functional adapter, plus a write into the
    input when ``inplace`` is true."""
    sig = inspect.signature(fn)

    def adapter(*args, **kwargs):
        try:
            bound = sig.bind(*args, **kwargs)
        except TypeError as e:
            raise Unsupported(f"{fn.__name__}: {e}") from None
        inplace = bound.arguments.pop("inplace", False)
        out = functional(*bound.args, **bound.kwargs)
        if not inplace or out is bound.arguments.get("input"):
            return out
        return Writes([(bound.arguments["input"], out)], bound.arguments["input"])
    adapter.__name__ = fn.__name__
    return adapter


def _relu(input):
    return core.relu(input)


def clone(input, *, memory_format=None):
    if memory_format is torch.contiguous_format:
        return core.contiguous(input)
    if memory_format not in (None, torch.preserve_format):
        from kiln.capture.torch_api import in_memory_format
        return in_memory_format(input, memory_format, copy=True)
    return core.clone(input)


def detach(input):
    return core.detach(input)


def requires_grad_(self, requires_grad=True):
    raise Unsupported("requires_grad_ inside a compiled function is not supported")


def build_tables(torch_functions: dict, tensor_methods: dict):
    """The in-place entries, derived from the functional tables already built."""
    methods = {}
    for name in INPLACE_FROM_FUNCTIONAL + tuple(INPLACE_METHODS):
        if name in tensor_methods:
            methods[name + "_"] = inplace_of(tensor_methods[name])
    for name in REBIND_FROM_VIEW:
        if name in tensor_methods:
            methods[name + "_"] = rebind_of(tensor_methods[name])
    methods.update({
        "copy_": copy_, "fill_": fill_, "zero_": zero_, "index_put_": index_put_,
        "index_copy_": index_copy_, "index_add_": index_add_, "index_fill_": index_fill_,
        "scatter_": scatter_, "scatter_add_": scatter_add_, "clone": clone, "detach": detach,
        "requires_grad_": requires_grad_, "scatter": scatter, "index_put": index_put,
        "scatter_reduce": scatter_reduce, "scatter_reduce_": scatter_reduce_,
    })
    functions = {torch.clone: clone, torch.detach: detach, F.batch_norm: batch_norm,
                 torch.scatter: scatter, torch.index_put: index_put,
                 torch.index_put_: index_put_, torch.scatter_reduce: scatter_reduce}
    for name in ("relu", "neg", "abs", "floor", "ceil", "trunc", "round", "sin", "cos", "reciprocal",
                 "clamp", "clip", *INPLACE_METHODS):
        fn = getattr(torch, name + "_", None)
        if fn is not None and name in tensor_methods:
            functions[fn] = inplace_of(tensor_methods[name])
    functions[F.relu_] = inplace_of(tensor_methods["relu"])
    functions[F.relu] = with_inplace_flag(F.relu, _relu)
    for f in (F.silu, F.hardtanh, F.leaky_relu, F.elu, F.relu6, F.hardswish, F.hardsigmoid, F.mish,
              F.dropout):
        functional = torch_functions.get(f)
        if functional is not None:
            functions[f] = with_inplace_flag(f, functional)
    return functions, methods


# ------------------------------------------------------------------ batch norm's running stats
def batch_norm(input, running_mean, running_var, weight=None, bias=None, training=False,
               momentum=0.1, eps=1e-5):
    """Training-mode batch norm with running statistics: the output uses the batch statistics;
    the running statistics receive ``(1 - momentum) * running + momentum * batch`` (the
    unbiased variance), computed without gradient, as writes into the buffers."""
    if not training or running_mean is None and running_var is None:
        return core.batch_norm(input, running_mean, running_var, weight, bias, training, momentum, eps)
    if momentum is None:
        raise Unsupported("batch_norm(momentum=None) (a cumulative average) is not supported")
    c = input.shape[1] if input.ndim > 1 else 0
    n = input.numel() // c if c else 0
    if n <= 1:
        raise ValueError(f"Expected more than 1 value per channel when training, got input size "
                         f"{list(input.shape)}")
    out = core.batch_norm(input, None, None, weight, bias, True, momentum, eps)
    dims = tuple(d for d in range(input.ndim) if d != 1)
    x = core.detach(input)
    if x.dtype != torch.float32 and x.dtype != torch.float64:
        x = core.to_dtype(x, torch.float32)
    updates = []
    for stat, batch in ((running_mean, lambda: core.mean(x, dims)),
                        (running_var, lambda: core.var(x, dims, 1))):
        if stat is None:
            continue
        b = batch()
        s = core.to_dtype(stat, b.dtype) if stat.dtype != b.dtype else stat
        new = core.add(core.mul(s, 1.0 - float(momentum)), core.mul(b, float(momentum)))
        updates.append((stat, core.to_dtype(new, stat.dtype) if new.dtype != stat.dtype else new))
    return Writes(updates, out)
