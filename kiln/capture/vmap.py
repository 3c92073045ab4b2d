"""``torch.vmap`` / ``torch.func.vmap`` in captured code, by unrolling.

vmap's contract is the per-example map: ``vmap(f)(x)`` equals ``stack([f(x[0]), f(x[1]), ...])``
(for ``f`` without random draws of ``randomness="same"``). Capture keeps that contract literally:
the batch dimension of each mapped argument is selected (a view, so an in-place op inside ``f``
writes the argument, as under vmap), ``f`` is traced once per example, and the results are
stacked along ``out_dims``. The graph then holds ``B`` copies of ``f``'s ops, which fuse like any
others; so the batch size must be a static int no larger than ``MAX_UNROLL``, and anything else
(a symbolic batch size, ``randomness="same"``, ``chunk_size``, nested containers as arguments,
non-tensor results) is a graph break naming the reason. The result is a contiguous stack:
where eager's batched kernels follow a non-contiguous mapped input's layout, its strides
differ from eager's (values and dtypes do not).

An in-place function (``vmap(torch.Tensor.acos_)(x)``) returns its batched argument itself, as
eager's vmap does (``y is x``): when every example's result is that example's slice of the
same argument, and the result is mapped on the argument's dimension, the result is the argument.
"""
from __future__ import annotations

import torch

from kiln.capture import torch_api
from kiln.capture.errors import Unsupported
from kiln.meta.symbolic import SymInt
from kiln.capture.values import ConstantVariable, ListVariable, TensorVariable, TupleVariable, Variable

MAX_UNROLL = 64

VMAP_FUNCTIONS = {torch.vmap, torch.func.vmap}


def wrap_vmap(tx, value, source, guard):
    """The tracker of ``torch.vmap``, or None for anything else."""
    try:
        if value not in VMAP_FUNCTIONS:
            return None
    except TypeError:  # unhashable
        return None
    if guard and source is not None:
        tx.guards.identity(source, value)
    return VmapVariable()


class VmapVariable(Variable):
    """``torch.vmap`` itself: calling it makes the mapped function."""

    def truth(self, tx):
        return True

    def call(self, tx, args, kwargs):
        names = ("func", "in_dims", "out_dims", "randomness", "chunk_size")
        bound = dict(zip(names, args))
        for k, v in kwargs.items():
            if k not in names or k in bound:
                raise Unsupported(f"torch.vmap: unexpected argument {k!r}")
            bound[k] = v
        if "func" not in bound:
            raise Unsupported("torch.vmap: no function given")
        const = {k: _constant(bound[k], k) for k in names[1:] if k in bound}
        if const.get("randomness", "error") not in ("error", "different"):
            raise Unsupported(f"torch.vmap: randomness={const['randomness']!r} is not unrolled")
        if const.get("chunk_size") is not None:
            raise Unsupported("torch.vmap: chunk_size is not supported")
        return MappedVariable(bound["func"], const.get("in_dims", 0), const.get("out_dims", 0))

    def __repr__(self):
        return "Vmap()"


def _constant(v, what):
    try:
        return v.as_python()
    except Unsupported:
        raise Unsupported(f"torch.vmap: {what} must be a constant, got {v}") from None


class MappedVariable(Variable):
    """``torch.vmap(func, in_dims, out_dims)``: calling it unrolls ``func`` over the batch."""

    def __init__(self, func: Variable, in_dims, out_dims):
        self.func = func
        self.in_dims = in_dims
        self.out_dims = out_dims

    def truth(self, tx):
        return True

    def call(self, tx, args, kwargs):
        if kwargs:
            raise Unsupported("torch.vmap: keyword arguments to the mapped function are not supported")
        dims = self.in_dims if isinstance(self.in_dims, (tuple, list)) else (self.in_dims,) * len(args)
        if len(dims) != len(args) or not all(d is None or type(d) is int for d in dims):
            raise Unsupported(f"torch.vmap: in_dims={self.in_dims!r} is not an int or None per argument")
        batch = _batch_size(args, dims)
        results = []
        slices = []
        for i in range(batch):
            row = [_select(tx, a, d, i) if d is not None else a for a, d in zip(args, dims)]
            slices.append(row)
            results.append(self.func.call(tx, row, {}))
        return _combine(tx, results, slices, args, dims, self.out_dims)

    def __repr__(self):
        return f"Vmapped({self.func})"


def _batch_size(args, dims) -> int:
    sizes = set()
    for a, d in zip(args, dims):
        if d is None:
            continue
        if not isinstance(a, TensorVariable):
            raise Unsupported(f"torch.vmap: a mapped argument is {a}, not a tensor")
        shape = a.proxy.shape
        if not -len(shape) <= d < len(shape):
            raise Unsupported(f"torch.vmap: in_dim {d} is out of range for a {len(shape)}-d tensor")
        sizes.add(shape[d])
    if not sizes:
        raise Unsupported("torch.vmap: no argument is mapped (in_dims all None)")
    if len(sizes) != 1:
        raise Unsupported(f"torch.vmap: mapped arguments have different batch sizes {sorted(map(str, sizes))}")
    batch = sizes.pop()
    if isinstance(batch, SymInt):
        # a symbolic batch (dynamic=True): unrolling needs its value, so it is specialized and
        # guarded (int() records the guard), one entry per batch size, as a range() over a
        # size is; the other sizes stay symbolic
        batch = int(batch)
    if type(batch) is not int or batch > MAX_UNROLL:
        raise Unsupported(f"torch.vmap: the batch size {batch} is not a static int up to {MAX_UNROLL} "
                          "(kiln unrolls vmap)")
    return batch


def _select(tx, a, d, i):
    return tx.call_adapter(torch_api.TENSOR_METHODS["select"], [a, ConstantVariable(d), ConstantVariable(i)],
                           {}, "torch.vmap")


def _combine(tx, results, slices, args, dims, out_dims):
    first = results[0]
    if isinstance(first, TensorVariable):
        return _stack_one(tx, [r for r in results], slices, args, dims, out_dims, 0)
    if isinstance(first, TupleVariable) and all(isinstance(r, TupleVariable) and len(r.items) == len(first.items)
                                                for r in results):
        per = out_dims if isinstance(out_dims, (tuple, list)) else (out_dims,) * len(first.items)
        if len(per) != len(first.items):
            raise Unsupported(f"torch.vmap: out_dims={out_dims!r} does not match {len(first.items)} results")
        return TupleVariable([_stack_one(tx, [r.items[k] for r in results], slices, args, dims, per[k], k)
                              for k in range(len(first.items))])
    raise Unsupported(f"torch.vmap: the mapped function returned {first}, not tensors")


def _stack_one(tx, outs, slices, args, dims, out_dim, k):
    if not all(isinstance(o, TensorVariable) for o in outs):
        raise Unsupported(f"torch.vmap: result {k} is not a tensor for every example")
    if type(out_dim) is not int:
        raise Unsupported(f"torch.vmap: out_dims={out_dim!r} is not an int")
    for j, (a, d) in enumerate(zip(args, dims)):
        # an in-place function: every example returned its own slice of argument j
        if d is not None and d % len(a.proxy.shape) == out_dim % len(a.proxy.shape) \
                and all(o is row[j] for o, row in zip(outs, slices)):
            return a
    return tx.call_adapter(torch_api.TORCH_FUNCTIONS[torch.stack], [ListVariable(outs)],
                           {"dim": ConstantVariable(out_dim)}, "torch.vmap")
