"""Capture-table entries for creation ops (merged into torch_api's tables). Shapes, values
and dtypes are Python values at trace time (specialized and guarded where they came from)."""
from __future__ import annotations

import torch

from kiln.meta.defaults import default_device, default_dtype
from kiln.meta.strides import channels_last_order, dense_strides, preserve_strides
from kiln.capture.errors import Unsupported
from kiln.capture.known_constants import as_size
from kiln.graph import Proxy
from kiln.graph.proxy import active_graph
from kiln.meta.symbolic import SymSize, is_int_like
from kiln.meta.tensor_meta import contiguous_strides
from kiln.ops import core


def _size(size, kw=None):
    """The size of a creation call: ints, one tuple/list/Size, or the ``size=`` keyword
    (``x.new_ones(size=x.size())``, Longformer), popped from ``kw``."""
    if kw is not None and "size" in kw:
        if size:
            raise TypeError("got multiple values for argument 'size'")  # eager's error
        size = (kw.pop("size"),)
    if len(size) == 1 and isinstance(size[0], (tuple, list, torch.Size)):
        size = size[0]
    return tuple(as_size(s) for s in size)  # a 0-d integer constant reads as its int, as in eager


def _check(requires_grad=False, layout=None, pin_memory=False, out=None, memory_format=None, **_):
    if requires_grad:
        raise Unsupported("creating a tensor with requires_grad=True inside a compiled region")
    if out is not None:
        raise Unsupported("creation ops with out= are not supported")


def _dev(device, like=None):
    if device is not None:
        return torch.device(device)
    return like.device if like is not None else default_device()


def _filler(value):
    def adapter(*size, dtype=None, device=None, **kw):
        size = _size(size, kw)
        _check(**kw)
        return core.full(size, value, dtype or default_dtype(), _dev(device))
    return adapter


def full(size, fill_value, *, dtype=None, device=None, **kw):
    _check(**kw)
    if isinstance(fill_value, Proxy):
        raise Unsupported("torch.full with a tensor fill value")
    if dtype is None:
        # a symbolic size (``2 * x.shape[0]``) is an int too, as its traced value is in eager
        dtype = torch.bool if isinstance(fill_value, bool) else torch.int64 if is_int_like(fill_value) \
            else default_dtype()
    return core.full(tuple(size), fill_value, dtype, _dev(device))


def like_strides(input, memory_format=None):
    """The strides eager gives a ``*_like`` result: ``torch.preserve_format`` (the default)
    keeps a dense input's strides, and orders any other input's dims as a pointwise result's
    (``zeros_like`` of a channels-last tensor is channels-last); None where that is the
    contiguous layout, or cannot be known (symbolic sizes)."""
    meta = input.meta if isinstance(input, Proxy) else None
    if meta is None or not all(isinstance(v, int) for v in tuple(meta.shape) + tuple(meta.stride)):
        return None
    if memory_format in (None, torch.preserve_format):
        strides = preserve_strides(meta)
    elif memory_format in (torch.channels_last, torch.channels_last_3d) and meta.ndim in (4, 5):
        strides = dense_strides(tuple(meta.shape), channels_last_order(meta.ndim))
    else:
        return None
    return None if strides == contiguous_strides(tuple(meta.shape)) else tuple(strides)


def made_strided(make, size, stride):
    """``make(shape)``'s contiguous result laid out with ``stride``: a buffer of the dims in
    stride order, each padded out to the next outer dim's stride, then sliced to the sizes and
    permuted back (``empty_strided((16, 8), (16, 1))`` is the first 8 columns of a 16x16
    buffer). Overlapping strides, or strides that do not nest, are a break."""
    size, stride = tuple(size), tuple(stride)
    order = sorted(range(len(size)), key=lambda d: (size[d] != 1, stride[d], -d))  # inner first
    extents, inner = [], 1
    for k, d in enumerate(order):
        if size[d] == 1:
            extents.append(1)
            continue
        outer = next((stride[e] for e in order[k + 1:] if size[e] != 1), None)
        if stride[d] != inner or outer is not None and (outer % inner or outer // inner < size[d]):
            raise Unsupported(f"a tensor of size={size}, stride={stride}: strides that overlap "
                              f"or do not nest are not supported")
        extents.append(size[d] if outer is None else outer // inner)
        inner = inner * extents[-1]
    dims = list(reversed(order))  # outermost first
    out = make(tuple(reversed(extents)))
    for k, d in enumerate(dims):
        if out.shape[k] != size[d]:
            out = core.slice(out, k, 0, size[d], 1)
    perm = tuple(dims.index(d) for d in range(len(size)))
    return out if perm == tuple(range(len(size))) else core.permute(out, perm)


def make_like(input, make, memory_format=None):
    """``make(shape)`` for a ``*_like`` op, in the layout eager gives it (:func:`like_strides`)."""
    strides = like_strides(input, memory_format)
    if strides is None:
        return make(tuple(input.shape))
    return made_strided(make, tuple(input.shape), strides)


def _like(value):
    def adapter(input, *, dtype=None, device=None, memory_format=None, **kw):
        _check(**kw)
        dtype, dev = dtype or input.dtype, _dev(device, input)
        return make_like(input, lambda shape: core.full(shape, value, dtype, dev), memory_format)
    return adapter


def full_like(input, fill_value, *, dtype=None, device=None, memory_format=None, **kw):
    _check(**kw)
    dtype, dev = dtype or input.dtype, _dev(device, input)
    return make_like(input, lambda shape: core.full(shape, fill_value, dtype, dev), memory_format)


def _new(value):
    def method(self, *size, dtype=None, device=None, **kw):
        size = _size(size, kw)
        _check(**kw)
        return core.full(size, value, dtype or self.dtype, _dev(device, self))
    return method


def new(self, *args, dtype=None, device=None, **kw):
    """Tensor.new: a size (ints, or one torch.Size) gives an uninitialized tensor of that size
    (zeros here), a plain list or tuple is data, no argument an empty tensor; torch.Size is a
    tuple, so the size test comes first (reading it as data gave a tensor of its sizes)."""
    _check(**kw)
    dev = _dev(device, self)
    if len(args) == 1 and isinstance(args[0], (torch.Size, SymSize)):
        size = tuple(args[0])
    elif all(is_int_like(a) and not isinstance(a, bool) for a in args):
        size = tuple(args) if args else (0,)
    elif len(args) == 1 and isinstance(args[0], (list, tuple)):
        data = tensor(args[0], dtype=dtype or self.dtype, device=dev)
        return data
    else:
        raise Unsupported("Tensor.new of a tensor or a storage (it aliases its argument)")
    return core.full(size, 0, dtype or self.dtype, dev)


def new_full(self, size, fill_value, *, dtype=None, device=None, **kw):
    _check(**kw)
    return core.full(tuple(size), fill_value, dtype or self.dtype, _dev(device, self))


def arange(start, end=None, step=1, *, dtype=None, device=None, **kw):
    _check(**kw)
    if end is None:
        start, end = 0, start
    if dtype is None:
        dtype = torch.int64 if all(is_int_like(v) for v in (start, end, step)) else default_dtype()
    return core.arange(start, end, step, dtype, _dev(device))


def empty_strided(size, stride, *, dtype=None, device=None, **kw):
    """An uninitialized tensor (zeros here) with exactly these strides, as a graph value
    (:func:`made_strided`)."""
    _check(**kw)
    size, stride = tuple(size), tuple(stride)
    if len(size) != len(stride) or not all(isinstance(v, int) for v in size + stride):
        raise Unsupported("torch.empty_strided with symbolic or mismatched sizes and strides")
    dtype, dev = dtype or default_dtype(), _dev(device)
    return made_strided(lambda shape: core.full(shape, 0, dtype, dev), size, stride)


def new_empty_strided(self, size, stride, *, dtype=None, device=None, **kw):
    return empty_strided(size, stride, dtype=dtype or self.dtype, device=_dev(device, self), **kw)


def iota(length, *, start, step, dtype, device, requires_grad):
    """``prims.iota``: start, start + step, ... (length values)."""
    _check(requires_grad=requires_grad)
    return core.arange(start, start + length * step, step, dtype, _dev(device))


def linspace(start, end, steps, *, dtype=None, device=None, **kw):
    _check(**kw)
    return core.linspace(start, end, steps, dtype or default_dtype(), _dev(device))


def eye(n, m=None, *, dtype=None, device=None, **kw):
    _check(**kw)
    return core.eye(n, n if m is None else m, dtype or default_dtype(), _dev(device))


def randn(*size, generator=None, dtype=None, device=None, **kw):
    _check(**kw)
    if generator is not None:
        raise Unsupported("torch.randn(generator=...) is not supported")
    return core.randn(_size(size), dtype or default_dtype(), _dev(device))


def randn_like(input, *, dtype=None, device=None, memory_format=None, **kw):
    _check(**kw)
    dtype, dev = dtype or input.dtype, _dev(device, input)
    return make_like(input, lambda shape: core.randn(shape, dtype, dev), memory_format)


def randint(*args, generator=None, dtype=None, device=None, **kw):
    _check(**kw)
    if generator is not None:
        raise Unsupported("torch.randint(generator=...) is not supported")
    if len(args) == 2:
        low, (high, size) = 0, args
    elif len(args) == 3:
        low, high, size = args
    else:
        raise Unsupported(f"torch.randint with {len(args)} positional arguments")
    return core.randint(low, high, tuple(size), dtype or torch.int64, _dev(device))


def tensor(data, *, dtype=None, device=None, **kw):
    """torch.tensor(python data): a constant of the graph, created at trace time.
    torch.tensor(a traced tensor): a detached copy (eager warns and does ``clone().detach()``,
    keeping the layout), cast to ``dtype``."""
    _check(**kw)
    if isinstance(data, Proxy):
        if device is not None and torch.device(device).type != data.device.type:
            raise Unsupported("torch.tensor(tensor, device=...) across devices is not supported")
        out = core.detach(core.clone(data))
        return out if dtype is None or dtype == data.dtype else core.to_dtype(out, dtype)
    graph = active_graph()
    if graph is None:
        raise Unsupported("torch.tensor outside a graph build")
    value = torch.tensor(data, dtype=dtype or _inferred_dtype(data),
                         device=device if device is not None else default_device())
    if value.numel() > 1 << 16:
        raise Unsupported("torch.tensor of more than 65536 elements inside a compiled region")
    return Proxy(graph.get_attr("const", value))


def as_tensor(data, dtype=None, device=None):
    """torch.as_tensor: a tensor is itself (cast when dtype differs: eager copies then);
    Python data is ``torch.tensor(data)``."""
    if isinstance(data, Proxy):
        if device is not None and torch.device(device).type != data.device.type:
            raise Unsupported("torch.as_tensor(tensor, device=...) across devices is not supported")
        return data if dtype is None or dtype == data.dtype else core.to_dtype(data, dtype)
    return tensor(data, dtype=dtype, device=device)


def _inferred_dtype(data):
    """torch.tensor's dtype for ``data``; a float in it makes it the (guarded) default dtype."""
    dtype = torch.tensor(data, device="cpu").dtype if not isinstance(data, torch.Tensor) else data.dtype
    return default_dtype() if dtype == torch.get_default_dtype() and dtype.is_floating_point else dtype


def legacy_type(dtype):
    """``torch.LongTensor([294])`` and the other legacy CPU tensor types: from data (a list or
    tuple of numbers) it is ``torch.tensor(data, dtype=...)`` on the CPU; from sizes it is an
    uninitialized tensor (zeros here); from a tensor, eager refuses another dtype."""
    def adapter(*args, device=None):
        if device is not None and torch.device(device).type != "cpu":
            raise RuntimeError(f"legacy constructor expects device type: cpu but device type: "
                               f"{torch.device(device).type} was passed")
        if len(args) == 1 and isinstance(args[0], (list, tuple)):
            return tensor(list(args[0]), dtype=dtype, device="cpu")
        if all(isinstance(a, int) and not isinstance(a, bool) for a in args):
            return core.full(tuple(args), 0, dtype, torch.device("cpu"))
        if len(args) == 1 and isinstance(args[0], Proxy):
            t = args[0]
            if t.dtype != dtype or t.device.type != "cpu":  # eager's TypeError, raised by eager
                raise TypeError(f"expected {dtype} on the CPU (got {t.dtype} on {t.device})")
            return t  # eager returns the same tensor
        raise Unsupported(f"the legacy {dtype} tensor constructor with these arguments is not "
                          "supported")
    return adapter


LEGACY_TYPES = {torch.FloatTensor: torch.float32, torch.DoubleTensor: torch.float64,
                torch.HalfTensor: torch.float16, torch.BFloat16Tensor: torch.bfloat16,
                torch.LongTensor: torch.int64, torch.IntTensor: torch.int32,
                torch.ShortTensor: torch.int16, torch.CharTensor: torch.int8,
                torch.ByteTensor: torch.uint8, torch.BoolTensor: torch.bool}

FUNCTIONS = {
    torch.zeros: _filler(0), torch.ones: _filler(1), torch.empty: _filler(0), torch.full: full,
    torch.zeros_like: _like(0), torch.ones_like: _like(1), torch.empty_like: _like(0),
    torch.full_like: full_like, torch.arange: arange, torch.linspace: linspace, torch.eye: eye,
    torch.randn: randn, torch.randn_like: randn_like, torch.randint: randint, torch.tensor: tensor,
    torch.as_tensor: as_tensor,
    torch.empty_strided: empty_strided,
    **{cls: legacy_type(dtype) for cls, dtype in LEGACY_TYPES.items()},
}

METHODS = {
    "new_zeros": _new(0), "new_ones": _new(1), "new_empty": _new(0), "new_full": new_full, "new": new,
    "new_empty_strided": new_empty_strided,
}
