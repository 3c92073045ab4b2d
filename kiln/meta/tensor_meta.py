"""TensorMeta: everything about a tensor except its data."""
from __future__ import annotations

import math

import torch


def contiguous_strides(shape) -> tuple:
    strides = []
    acc = 1
    for size in reversed(shape):
        strides.append(acc)
        acc = acc * max(size, 1) if isinstance(size, int) else acc * size
    return tuple(reversed(strides))


def no_small_symbols(dims: tuple) -> tuple:
    """Sizes and strides never hold a symbol that may be 0 or 1: a dynamic Python int traced
    symbolically at 0 or 1 (``Tracer._wrap_dynamic_int``, bound ``>= 0``) that becomes a size is
    specialized here (guarded equal to its value), since broadcasting, strides and kernels
    decide on sizes 0 and 1, and every other symbol is ``>= 2``."""
    if all(type(d) is int for d in dims):
        return dims
    if 0 in [d for d in dims if type(d) is int]:  # no elements (a dynamic int's carrier input)
        return dims
    out = []
    for d in dims:
        env = getattr(d, "env", None)
        if env is not None and any(env.lower.get(s, 2) < 2 for s in d.expr.free_symbols):
            d = int(d)  # SymInt.__index__: guarded equal to its hint
        out.append(d)
    return tuple(out)


def view_strides(old_shape, old_stride, new_shape):
    """Strides of a view of (old_shape, old_stride) as new_shape, or None if it needs a copy
    (torch's rule: the old dims form runs laid out one after another in memory; each run must
    be re-split into whole runs of new dims). Sizes may be symbolic (compared structurally)."""
    old_shape, old_stride, new_shape = tuple(old_shape), tuple(old_stride), tuple(new_shape)
    if 0 in old_shape:
        return contiguous_strides(new_shape)
    new_stride = [0] * len(new_shape)
    view_d = len(new_shape) - 1
    chunk_base = old_stride[-1] if old_stride else 1
    tensor_numel, view_numel = 1, 1
    for d in range(len(old_shape) - 1, -1, -1):
        tensor_numel *= old_shape[d]
        if d == 0 or (old_shape[d - 1] != 1 and old_stride[d - 1] != tensor_numel * chunk_base):
            while view_d >= 0 and (view_numel < tensor_numel or new_shape[view_d] == 1):
                new_stride[view_d] = view_numel * chunk_base
                view_numel *= new_shape[view_d]
                view_d -= 1
            if view_numel != tensor_numel:
                return None
            if d > 0:
                chunk_base = old_stride[d - 1]
                tensor_numel, view_numel = 1, 1
    if view_d != -1:
        return None
    return tuple(new_stride)


class TensorMeta:
    __slots__ = ("shape", "stride", "dtype", "device", "requires_grad")

    def __init__(self, shape, stride, dtype, device, requires_grad=False):
        self.shape = tuple(shape)
        self.stride = tuple(stride)
        if not all(type(d) is int for d in self.shape + self.stride) and \
                0 not in [d for d in self.shape if type(d) is int]:  # not an empty tensor
            self.shape, self.stride = no_small_symbols(self.shape), no_small_symbols(self.stride)
        self.dtype = dtype
        self.device = torch.device(device) if not isinstance(device, torch.device) else device
        self.requires_grad = requires_grad

    @classmethod
    def of(cls, t: torch.Tensor) -> "TensorMeta":
        return cls(t.shape, t.stride(), t.dtype, t.device, t.requires_grad)

    @classmethod
    def contiguous(cls, shape, dtype, device, requires_grad=False) -> "TensorMeta":
        shape = no_small_symbols(tuple(shape))  # before the strides, which assume sizes >= 2
        return cls(shape, contiguous_strides(shape), dtype, device, requires_grad)

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def numel(self):
        return math.prod(self.shape)

    def is_contiguous(self) -> bool:
        if 0 in [d for d in self.shape if type(d) is int]:
            return True  # no elements (torch's rule); and no comparison on the other sizes' symbols
        expected = contiguous_strides(self.shape)
        return all(sz == 1 or st == ex for sz, st, ex in zip(self.shape, self.stride, expected))

    def with_(self, **kw) -> "TensorMeta":
        vals = {s: getattr(self, s) for s in TensorMeta.__slots__}
        vals.update(kw)
        return TensorMeta(**vals)

    def fake(self) -> torch.Tensor:
        """A tensor on torch's meta device with this metadata (no data)."""
        return torch.empty_strided(self.shape, self.stride, dtype=self.dtype, device="meta")

    def random(self, device=None) -> torch.Tensor:
        """A real tensor with this metadata and random contents (for repro scripts and tests)."""
        device = device or self.device
        size = 1 + sum((s - 1) * st for s, st in zip(self.shape, self.stride)) if self.numel() else 0
        if self.dtype.is_floating_point:
            base = torch.randn(size, device=device).to(self.dtype)
        elif self.dtype == torch.bool:
            base = torch.rand(size, device=device) > 0.5
        else:
            base = torch.randint(-8, 8, (size,), device=device).to(self.dtype)
        return torch.as_strided(base, self.shape, self.stride)

    def __eq__(self, other):
        return isinstance(other, TensorMeta) and all(
            getattr(self, s) == getattr(other, s) for s in TensorMeta.__slots__)

    def __hash__(self):
        return hash((self.shape, self.stride, self.dtype, str(self.device), self.requires_grad))

    def __repr__(self):
        dt = str(self.dtype).replace("torch.", "")
        s = f"{dt}{list(self.shape)}"
        if not self.is_contiguous():
            s += f" stride={list(self.stride)}"
        if self.device.type != "cpu":
            s += f" {self.device}"
        if self.requires_grad:
            s += " grad"
        return s


# the dtype a graph holds each kind of Python number in, and back
NUMBER_TYPES = {torch.float64: float, torch.int64: int, torch.bool: bool}


class WrappedNumberMeta(TensorMeta):
    """A Python number held by a graph as a 0-d tensor: a float64 for a float (a float argument
    whose value changed between calls: capture/dynamic_floats.py; ``float(t)`` of a computed
    tensor: capture/scalar_values.py), an int64 for an int, a bool for a bool. It promotes as
    the Python number it stands for, torch's "wrapped number": ``half_tensor * 0.5`` stays
    half, ``int_tensor * 0.5`` is the default float dtype (a plain 0-d float64 tensor would
    make both float64)."""
    __slots__ = ()

    @classmethod
    def scalar(cls) -> "WrappedNumberMeta":
        return cls((), (), torch.float64, torch.device("cpu"), False)

    def with_(self, **kw) -> TensorMeta:
        out = TensorMeta.with_(self, **kw)
        return WrappedNumberMeta.like(out)

    @classmethod
    def like(cls, meta: TensorMeta) -> TensorMeta:
        """``meta`` as a wrapped number where it still is one (0-d float64, int64 or bool: the
        dtypes of Python's float, int and bool), else as it is."""
        if meta.shape == () and meta.dtype in NUMBER_TYPES and type(meta) is TensorMeta:
            return cls(meta.shape, meta.stride, meta.dtype, meta.device, meta.requires_grad)
        return meta

    @property
    def python_type(self) -> type:
        return NUMBER_TYPES[self.dtype]

    def __repr__(self):
        return TensorMeta.__repr__(self) + " number"
