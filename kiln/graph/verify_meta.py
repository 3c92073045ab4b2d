"""The meta verifier (``config.verify``): run a graph eagerly node by node on real inputs and
check every node's meta (shape, dtype, device; strides of views) against the real tensor.

Symbolic metas are evaluated at the symbol values the real inputs have (at first compile:
the hints), so a meta rule that is wrong for some size is caught at that size.
"""
from __future__ import annotations

import torch

from kiln.graph.node import CALL, GET_ATTR, OUTPUT, PLACEHOLDER, map_args
from kiln.meta.symbolic import concretize, symbol_values
from kiln.meta.tensor_meta import TensorMeta
from kiln.graph.registry import META_RULES


class MetaMismatch(AssertionError):
    pass


def _check(node, meta, value, sizes, args=()):
    if not isinstance(value, torch.Tensor):
        return
    shape = tuple(concretize(tuple(meta.shape), sizes))
    where = f"[meta verify] {node.name} = {node.target!r}"
    if shape != tuple(value.shape):
        raise MetaMismatch(f"{where}: meta shape {list(meta.shape)} = {list(shape)}, real {list(value.shape)}")
    if meta.dtype != value.dtype:
        raise MetaMismatch(f"{where}: meta dtype {meta.dtype}, real {value.dtype}")
    if meta.device.type != value.device.type:
        raise MetaMismatch(f"{where}: meta device {meta.device}, real {value.device}")
    if value.numel() > 1 and _is_view(node, value, args):
        stride = concretize(tuple(meta.stride), sizes)
        real = value.stride()
        if any(s != r for s, r, n in zip(stride, real, value.shape) if n != 1):
            raise MetaMismatch(f"{where}: a view's meta strides {list(stride)}, real {list(real)}")


def _view_meta_from_real_inputs(node, args, kwargs):
    """A view's meta rule applied to its real inputs' layouts. kiln may give a computed (non-view)
    tensor another dense layout than eager, so a view of it is checked against the rule, not
    against the strides inherited from the recorded meta."""
    def as_meta(v):
        if isinstance(v, torch.Tensor):
            return TensorMeta.of(v)
        if isinstance(v, (list, tuple)):
            return type(v)(as_meta(x) for x in v)
        return v
    return META_RULES[node.target](*as_meta(tuple(args)), **{k: as_meta(v) for k, v in kwargs.items()})


def _is_view(node, value, args=()) -> bool:
    """A result sharing storage with one of the node's tensor inputs: its strides must be
    torch's (later views index with them); other results may pick another dense layout
    (documented in architecture.md), including a view of a temporary inside the op."""
    if getattr(value, "_base", None) is None:
        return False
    ptr = value.untyped_storage().data_ptr()
    return any(isinstance(a, torch.Tensor) and a.untyped_storage().data_ptr() == ptr
               for a in _tensors(args))


def _tensors(x):
    if isinstance(x, torch.Tensor):
        yield x
    elif isinstance(x, (list, tuple)):
        for v in x:
            yield from _tensors(v)
    elif isinstance(x, dict):
        for v in x.values():
            yield from _tensors(v)


def verify_meta(graph, inputs):
    """Raises MetaMismatch naming the first node whose meta disagrees with eager torch."""
    placeholders = graph.placeholders
    sizes = symbol_values([n.meta.get("val") for n in placeholders], inputs)
    env = {}
    for node, value in zip(placeholders, inputs):
        env[node] = value
        _check(node, node.meta["val"], value, sizes)
    load = env.__getitem__
    for node in graph.nodes:
        if node.op == CALL:
            args, kwargs = map_args(node.args, load), map_args(node.kwargs, load)
            if sizes:
                args, kwargs = concretize((args, kwargs), sizes)
            with torch.no_grad():
                value = node.target.eager(*args, **kwargs)
            env[node] = value
            meta = node.meta.get("val")
            if isinstance(value, torch.Tensor) and _is_view(node, value, (args, kwargs)) \
                    and node.target in META_RULES:
                view = _view_meta_from_real_inputs(node, args, kwargs)
                meta = meta.with_(stride=view.stride) if hasattr(meta, "with_") else meta
            if isinstance(value, (tuple, list)) and isinstance(meta, (tuple, list)):
                for m, v in zip(meta, value):
                    _check(node, m, v, sizes, (args, kwargs))
            elif meta is not None and hasattr(meta, "shape"):
                _check(node, meta, value, sizes, (args, kwargs))
        elif node.op == GET_ATTR:
            env[node] = graph.constants[node.target]
        elif node.op == OUTPUT:
            break
    return graph


__all__ = ["verify_meta", "MetaMismatch", "PLACEHOLDER"]
