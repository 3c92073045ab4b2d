"""Advanced indexing: ``x[i, :, j]``, ``x[:, i, None, j, 0]``, ``x[:, [2, 0]] = v`` and
``index_put_`` with several indices, one mechanism for reads and writes.

PyTorch's rule (``torch/csrc/autograd/python_variable_indexing.cpp``): ints, slices, None and
Ellipsis apply first, as a view (an int *selects*: unlike NumPy it is not an advanced index);
each index tensor (or list of ints) then indexes one dim of that view, a bool mask of k dims
k dims. The int index tensors broadcast together to a shape B. When the indexed dims are
adjacent B takes their place; otherwise B comes first and the other dims follow in order.

Both directions move the indexed dims together (a permute, only when they are apart), flatten
them into one and linearize the indices (``i * n_j + j``): a read is then one index_select and
a write one index_put on that flat dim, ops that already have meta, VJP and lowering rules.
A bool mask is data-dependent in a read (its count is the result's size); in a write it is a
masked ``where`` when the value broadcasts over the mask, and anything else is ``Unsupported``
(``index_put_`` turns that into a fallback node where no gradient is needed).
"""
from __future__ import annotations

import torch

from kiln.capture.errors import Unsupported
from kiln.graph import Proxy
from kiln.meta.symbolic import SymInt
from kiln.ops import core
from kiln.ops.promotion import broadcast_shapes
from kiln.capture.torch_api_inplace import _fill_value, _Shaped, masked_assign
from kiln.capture.torch_api_more import getitem as basic_getitem
from kiln.capture.torch_api_creation import tensor


def _is_advanced(k) -> bool:
    return isinstance(k, (Proxy, list))


def has_advanced(key) -> bool:
    key = key if isinstance(key, tuple) else (key,)
    return any(_is_advanced(k) for k in key)


def all_full(basic) -> bool:
    """Whether a basic key is only full slices (its view is the tensor itself)."""
    return all(isinstance(k, slice) and k == slice(None) for k in basic)


def split_key(ndim: int, key):
    """``(basic_key, entries)``: the key with every advanced entry replaced by full slices (the
    view the advanced entries then index), and ``[(view dim, entry)]`` for those entries."""
    key = key if isinstance(key, tuple) else (key,)
    width = [k.ndim if isinstance(k, Proxy) and k.dtype in (torch.bool, torch.uint8) else 1
             for k in key]
    consumed = sum(w for k, w in zip(key, width) if k is not None and k is not Ellipsis)
    if consumed > ndim:
        raise IndexError(f"too many indices for tensor of dimension {ndim}")
    if sum(1 for k in key if k is Ellipsis) > 1:
        raise IndexError("an index can only have a single ellipsis ('...')")
    basic, entries, vd = [], [], 0
    for k, w in zip(key, width):
        if k is Ellipsis:
            basic += [slice(None)] * (ndim - consumed)
            vd += ndim - consumed
        elif k is None:
            basic.append(None)
            vd += 1
        elif _is_advanced(k):
            entries.append((vd, k))
            basic += [slice(None)] * w
            vd += w
        elif isinstance(k, (int, SymInt)) and not isinstance(k, bool):
            basic.append(k)
        elif isinstance(k, slice):
            basic.append(k)
            vd += 1
        else:
            raise Unsupported(f"indexing a tensor with {type(k).__name__} is not supported")
    return tuple(basic), entries


def _int_index(x, idx, dim, device):
    """An int index tensor for dim ``dim`` of x, negatives wrapped (out of range still fails
    in the gather/scatter), from an int tensor or a list of ints."""
    n = x.shape[dim]
    if isinstance(idx, list):
        if not idx or not all(isinstance(i, int) and not isinstance(i, bool) for i in idx):
            raise Unsupported("indexing a tensor with a list that is not a list of ints")
        if any(not -n <= i < n for i in idx):
            raise IndexError(f"index {idx} is out of bounds for dimension {dim} with size {n}")
        return tensor([i % n for i in idx], device=device)
    if idx.dtype in (torch.bool, torch.uint8):
        raise Unsupported("boolean mask indexing (its result's shape depends on the data)")
    if idx.dtype.is_floating_point or idx.dtype.is_complex:
        raise IndexError("tensors used as indices must be long, int, byte or bool tensors")
    return core.where(core.lt(idx, 0), core.add(idx, n), idx)


class _Flat:
    """x with its indexed dims moved together (``perm``, None when already adjacent) and
    flattened into dim ``at``; ``lin`` the linearized broadcast index, ``bshape`` its shape."""

    def __init__(self, x, entries):
        dims = [d for d, _ in entries]
        if len(set(dims)) != len(dims):
            raise Unsupported("advanced indexing: two indices on one dim")
        idxs = [_int_index(x, k, d, x.device) for d, k in entries]
        self.perm = None
        if dims != list(range(dims[0], dims[0] + len(dims))):
            rest = [d for d in range(x.ndim) if d not in dims]
            self.perm = dims + rest
            x = core.permute(x, tuple(self.perm))
            dims = list(range(len(dims)))
        self.at, self.x = dims[0], x
        shape = tuple(x.shape)
        self.pre, self.post = shape[:dims[0]], shape[dims[-1] + 1:]
        sizes = shape[dims[0]:dims[-1] + 1]
        self.bshape = broadcast_shapes(*[tuple(i.shape) for i in idxs])
        lin = None
        for idx, n in zip(idxs, sizes):
            lin = idx if lin is None else core.add(core.mul(lin, n), idx)
        if tuple(lin.shape) != self.bshape:
            lin = core.expand(lin, self.bshape)
        self.lin = core.reshape(lin, (-1,)) if lin.ndim != 1 else lin
        flat = 1
        for n in sizes:
            flat = flat * n
        self.flat = core.reshape(x, self.pre + (flat,) + self.post) if len(sizes) != 1 else x

    def result_shape(self):
        return self.pre + self.bshape + self.post

    def unflatten(self, new):
        """The flat tensor's new value, in the original layout of dims."""
        shape = tuple(self.x.shape)
        if tuple(new.shape) != shape:
            new = core.reshape(new, shape)
        if self.perm is not None:
            inverse = [0] * len(self.perm)
            for i, p in enumerate(self.perm):
                inverse[p] = i
            new = core.permute(new, tuple(inverse))
        return new


def gather(view, entries):
    """The read ``view[entries]`` (all advanced; the basic part already applied)."""
    f = _Flat(view, entries)
    out = core.index_select(f.flat, f.at, f.lin)
    want = f.result_shape()
    return core.reshape(out, want) if tuple(out.shape) != want else out


def getitem(self, key):
    """``self[key]`` for a key with at least one index tensor or list."""
    basic, entries = split_key(self.ndim, key)
    view = basic_getitem(self, basic) if not all_full(basic) else self
    return gather(view, entries)


def _mask_entry(view, entries):
    """The bool mask entry when it is the only index, else None; a mask mixed with other
    index tensors is data-dependent."""
    masks = [(d, k) for d, k in entries if isinstance(k, Proxy) and k.dtype in (torch.bool, torch.uint8)]
    if not masks:
        return None
    if len(entries) > 1:
        raise Unsupported("indexing with a bool mask together with other index tensors is "
                          "data-dependent")
    return masks[0]


def put(view, entries, values, accumulate=False):
    """The new value of ``view`` after ``view[entries] = values`` (``+=`` with accumulate):
    ``values`` a tensor or a Python number, broadcast to the indexed result's shape."""
    mask = _mask_entry(view, entries)
    if mask is not None:
        dim, m = mask
        if m.dtype == torch.uint8:
            m = core.to_dtype(m, torch.bool)
        rest = view.ndim - dim - m.ndim
        if isinstance(values, Proxy) and values.ndim > rest and any(
                n != 1 for n in tuple(values.shape)[:values.ndim - rest]):
            raise Unsupported("writing several values through a bool mask is data-dependent (their "
                              "count must be the mask's)")
        if isinstance(values, Proxy) and values.ndim > rest:
            values = core.reshape(values, tuple(values.shape)[values.ndim - rest:])
        if not accumulate:
            return masked_assign(view, dim, m, values)
        if tuple(view.shape[dim:dim + m.ndim]) != tuple(m.shape):
            raise IndexError(f"The shape of the mask {list(m.shape)} does not match the shape "
                             f"of the indexed tensor {list(view.shape)}")
        added = core.add(view, values)
        if added.dtype != view.dtype:
            added = core.to_dtype(added, view.dtype)
        for _ in range(rest):
            m = core.unsqueeze(m, -1)
        return core.where(m, added, view)
    f = _Flat(view, entries)
    vals = _fill_value(_Shaped(f.result_shape(), view.dtype, view.device), values)
    n = 1
    for s in f.bshape:
        n = n * s
    flat_vals_shape = f.pre + (n,) + f.post
    if tuple(vals.shape) != flat_vals_shape:
        vals = core.reshape(vals, flat_vals_shape)
    new = core.index_put(f.flat, f.at, f.lin, vals, bool(accumulate))
    return f.unflatten(new)


def index_put_entries(self, indices):
    """aten.index_put's index list (None for a dim not indexed) as ``[(dim, index)]``."""
    entries, d = [], 0
    for idx in indices:
        if idx is None:
            d += 1
            continue
        if not isinstance(idx, Proxy):
            raise Unsupported(f"index_put_ with a {type(idx).__name__} index is not supported")
        entries.append((d, idx))
        d += idx.ndim if idx.dtype in (torch.bool, torch.uint8) else 1
    if d > self.ndim:
        raise IndexError(f"too many indices for tensor of dimension {self.ndim} (got {d})")
    if not entries:
        raise Unsupported("index_put_ with no index tensor")
    return entries
