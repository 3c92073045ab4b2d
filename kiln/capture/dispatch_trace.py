"""``torch.compiler.allow_in_graph`` functions: traced at the op level, not bytecode by bytecode.

torch.compile's frontend does not look inside such a function: it writes one call into its
graph, and its backend traces the call down to aten ops. kiln has one tracer, so it does both
at the call: the function runs natively, once, on meta tensors shaped like its tensor
arguments, under a dispatch mode that records every aten op it reaches (Python code the
bytecode tracer would break on, such as a ``print`` or a helper library's control flow, just
runs, at trace time, as it does under torch.compile). The recorded ops are then replayed into
the graph through the aten-op capture (capture/torch_ops.py), so they get kiln's own meta,
autograd and kernels. No graph break.

The recording needs what torch requires of such a function: tensors reach it as arguments
(a tensor it did not make from them is a real tensor among meta ones), no data-dependent
Python decision on tensor values (``.item()`` fails on meta), static sizes. When the
recording fails, or an argument is not a tensor or a Python constant, or a size is symbolic,
the function is inlined as any other (``None`` is returned to the caller); an op the replay
refuses (a random or mutating op) is a graph break naming it.
"""
from __future__ import annotations

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from kiln import log
from kiln.capture.errors import Unsupported
from kiln.meta.symbolic import has_symbols
from kiln.capture.values import (ConstantVariable, ListVariable, TensorVariable, TupleVariable,
                                 is_constant)
from kiln.capture.torch_ops import TorchOpVariable


class _Recorder(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops = []  # (op overload, args, kwargs, out)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        self.ops.append((func, args, kwargs, out))
        return out


def _to_meta(var, metas: dict):
    """A Python value for ``fn``: tensors as meta tensors (their variables remembered)."""
    if isinstance(var, TensorVariable):
        m = var.proxy.meta
        if has_symbols(m.shape) or has_symbols(m.stride):
            raise _NotRecordable("a symbolic size")
        t = torch.empty_strided(m.shape, m.stride, dtype=m.dtype, device="meta")
        metas[id(t)] = (t, var, m.device)
        return t
    if isinstance(var, (TupleVariable, ListVariable)):
        items = [_to_meta(v, metas) for v in var.items]
        return tuple(items) if isinstance(var, TupleVariable) else items
    if isinstance(var, ConstantVariable):
        return var.value
    try:
        return var.as_python()
    except Unsupported as e:
        raise _NotRecordable(e.reason) from None


class _NotRecordable(Exception):
    pass


def record(fn, args, kwargs):
    """``fn`` run on meta tensors: (recorder, metas, out) or raises _NotRecordable."""
    metas: dict = {}
    py_args = [_to_meta(a, metas) for a in args]
    py_kwargs = {k: _to_meta(v, metas) for k, v in kwargs.items()}
    rec = _Recorder()
    try:
        with rec:
            out = fn(*py_args, **py_kwargs)
    except Exception as e:  # noqa: BLE001 - not recordable on meta tensors: inline it instead
        raise _NotRecordable(f"{type(e).__name__}: {e}") from None
    return rec, metas, out


def call_allowed_in_graph(tx, fn, name: str, args, kwargs):
    """The call's result Variable, or None (inline ``fn`` instead)."""
    try:
        rec, metas, out = record(fn, args, kwargs)
    except _NotRecordable as e:
        log.log("graph_breaks", "%s (allow_in_graph) is inlined: it cannot be traced at the op "
                "level (%s)", name, e)
        return None
    devices = {dev for _, _, dev in metas.values()}
    device = devices.pop() if len(devices) == 1 else None
    known = {k: var for k, (_, var, _) in metas.items()}
    keep = [t for t, _, _ in metas.values()]  # alive while ids are keys
    for func, a, kw, result in rec.ops:
        _replay(tx, func, a, kw, result, known, keep, device, name)
    return _wrap_output(tx, out, known, name)


def _replay(tx, func, args, kwargs, result, known, keep, device, name):
    def var_of(x):
        if isinstance(x, torch.Tensor):
            v = known.get(id(x))
            if v is None:
                raise Unsupported(f"{name} (allow_in_graph): {func} reads a tensor that is not "
                                  f"one of its arguments nor made from them")
            return v
        if isinstance(x, torch.device) and x.type == "meta":
            x = device  # factory ops made on the arguments' device
        if isinstance(x, (list, tuple)):
            items = [var_of(i) for i in x]
            return TupleVariable(items) if isinstance(x, tuple) else ListVariable(items)
        return ConstantVariable(x)
    vargs = [var_of(x) for x in args]
    vkwargs = {k: var_of(v) for k, v in kwargs.items()}
    try:
        out = TorchOpVariable(func).call(tx, vargs, vkwargs)
    except Unsupported as e:
        raise Unsupported(f"{name} (allow_in_graph): {e.reason}") from None
    flat_t, _ = tree_flatten(result)
    flat_v = _flat_vars(out)
    if len(flat_t) != len(flat_v):
        raise Unsupported(f"{name} (allow_in_graph): {func} gave {len(flat_v)} results, "
                          f"expected {len(flat_t)}")
    for t, v in zip(flat_t, flat_v):
        if isinstance(t, torch.Tensor):
            known[id(t)] = v
            keep.append(t)


def _flat_vars(v):
    if isinstance(v, (TupleVariable, ListVariable)):
        return [x for item in v.items for x in _flat_vars(item)]
    return [v]


def _wrap_output(tx, out, known, name):
    if isinstance(out, torch.Tensor):
        v = known.get(id(out))
        if v is None:
            raise Unsupported(f"{name} (allow_in_graph) returned a tensor not made from its arguments")
        return v
    if isinstance(out, (tuple, list)):
        items = [_wrap_output(tx, o, known, name) for o in out]
        return TupleVariable(items) if isinstance(out, tuple) else ListVariable(items)
    if out is None or is_constant(out):
        return ConstantVariable(out)
    raise Unsupported(f"{name} (allow_in_graph) returned a {type(out).__name__}")

