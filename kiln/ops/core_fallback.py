"""Fallback: a torch callable with no core op, run eagerly inside compiled code.

Capture turns a call to an unknown torch function or Tensor method into
``core.fallback("torch.cumsum", x, dim=0)`` when its output metadata can be computed on torch's
``meta`` device (that is the meta rule); otherwise it stays a graph break. The callable is
looked up by name in ``FALLBACK_TARGETS`` so the graph still prints as runnable Python. It
decomposes to ``prims.fallback``, a library op: the wrapper calls torch for it, between kernels.
Autograd (``fallback_vjp``): the gradient is torch's own for the callable. The backward graph
holds a ``core.custom_op_backward`` node that runs the callable again on the saved inputs with
grad enabled and calls ``torch.autograd.grad`` (``core_custom._replay_backward``), so a fallback
is differentiable wherever eager's op is. Which results need a gradient is eager's answer too:
the meta rule runs the callable on meta tensors that require grad as the inputs do.
"""
from __future__ import annotations

import functools
import types

import torch

from kiln.meta.tensor_meta import TensorMeta
from kiln.graph.node import flatten_args
from kiln.ops import prims
from kiln.ops.registry import DECOMPOSITIONS, META_RULES, VJP_RULES, define, lookup
from kiln.ops.core_custom import custom_op_vjp_replay

__all__ = ["fallback", "FALLBACK_TARGETS", "register_fallback_target"]

FALLBACK_TARGETS: dict[str, object] = {}


# Callables that read their tensor operand's storage rather than its elements: their result
# depends on where eager put each element, so lowering hands them their operands laid out as
# eager's are (``decompose`` records those strides, ``inductor/lower.py`` copies where needed).
STORAGE_READERS = {"as_strided", "as_strided_copy", "as_strided_scatter"}


def reads_storage(name: str) -> bool:
    """``torch.as_strided``, ``Tensor.as_strided``, ``torch.ops.aten.as_strided.default`` ..."""
    return not STORAGE_READERS.isdisjoint(name.split("."))


# Callables torch has no meta kernel for: a function giving their results on meta tensors
FALLBACK_METAS: dict[str, object] = {}


def register_fallback_target(name: str, fn):
    FALLBACK_TARGETS[name] = fn
    return name


@functools.cache
def returns_fresh(name: str) -> bool:
    """Whether the fallback ``name`` ("torch.topk", "Tensor.sort") always returns new tensors:
    a C++-bound torch function whose aten op's functional overloads all return tensors with no
    alias annotation (``topk -> (Tensor values, Tensor indices)``; ``diagonal -> Tensor(a)`` may
    alias). Python-level functions keep the conservative answer: their aliasing is their own."""
    head, _, short = name.partition(".")
    if head not in ("torch", "Tensor") or "." in short or "[" in short:
        return False
    fn = getattr(torch.Tensor if head == "Tensor" else torch, short, None)
    packet = getattr(torch.ops.aten, short, None)
    if fn is None or isinstance(fn, types.FunctionType) or packet is None:
        return False
    schemas = [getattr(packet, o)._schema for o in packet.overloads()]
    schemas = [s for s in schemas if not s.is_mutable]  # out= and in-place overloads
    return bool(schemas) and all(r.alias_info is None for s in schemas for r in s.returns)


def resolve(name: str):
    """The callable for a fallback name: registered by capture, or found from its dotted name
    ("torch.cumsum", "torch.nn.functional.glu", "Tensor.erfinv") in a fresh process."""
    fn = FALLBACK_TARGETS.get(name)
    if fn is not None:
        return fn
    if name.endswith("]") and "[" in name:  # "op[0,2]": results 0 and 2 of op (its others None)
        base, _, picks = name[:-1].rpartition("[")
        fn = FALLBACK_TARGETS[name] = _picking(resolve(base), tuple(int(p) for p in picks.split(",")))
        return fn
    head, _, rest = name.partition(".")
    if head == "core":  # a core op kept whole (a complex one: ops/decompose.py), its eager form
        fn = FALLBACK_TARGETS[name] = lookup("core", rest).eager
        return fn
    obj = torch.Tensor if head == "Tensor" else torch if head == "torch" else None
    for part in rest.split(".") if obj is not None else ():
        obj = getattr(obj, part, None)
    if obj is None or not callable(obj):
        raise KeyError(f"[fallback] no callable registered under {name!r}")
    FALLBACK_TARGETS[name] = obj
    return obj


def _picking(fn, picks):
    def tensors_only(*args, **kwargs):
        out = fn(*args, **kwargs)
        return tuple(out[i] for i in picks)
    return tensors_only


def tensor_positions(out) -> tuple | None:
    """The positions of the tensors in a result tuple whose other entries are None
    (``aten.convolution_backward`` with a partial output mask), else None."""
    if not isinstance(out, (tuple, list)) or not any(isinstance(t, torch.Tensor) for t in out):
        return None
    if not all(t is None or isinstance(t, torch.Tensor) for t in out):
        return None
    return tuple(i for i, t in enumerate(out) if t is not None)


class NotTensors(TypeError):
    """The callable returns something other than tensors: it cannot be a graph node (capture
    turns this into a graph break, with the call run by the resumed eager code)."""


def _fallback_eager(target, *args, **kwargs):
    return resolve(target)(*args, **kwargs)


def _map(obj, fn):
    if isinstance(obj, tuple):
        return tuple(_map(x, fn) for x in obj)
    if isinstance(obj, list):
        return [_map(x, fn) for x in obj]
    if isinstance(obj, dict):
        return {k: _map(v, fn) for k, v in obj.items()}
    return fn(obj)


def _differentiable(dtype) -> bool:
    return dtype.is_floating_point or dtype.is_complex


def fallback_meta(target, *args, **kwargs):
    """Run the callable on meta tensors; outputs land on the inputs' device."""
    metas = [a for a in flatten_args((args, kwargs)) if isinstance(a, TensorMeta)]
    if not metas:
        raise TypeError(f"[meta] core.fallback({target}): needs a tensor argument")
    device = next((m.device for m in metas if m.device.type != "cpu"), metas[0].device)
    fake = _map((args, kwargs), lambda a: a.fake() if isinstance(a, TensorMeta) else a)
    # complex values carry gradients too: torch.fft.fftn(h).real is two fallbacks joined by a
    # complex tensor, and h's gradient through them was dropped (FNet's Fourier layers)
    grad = any(m.requires_grad and _differentiable(m.dtype) for m in metas)
    if grad:  # eager's autograd decides which results need a gradient
        fake = _map(fake, lambda a: a.requires_grad_() if isinstance(a, torch.Tensor)
                    and _differentiable(a.dtype) else a)
    with torch.enable_grad() if grad else torch.no_grad():
        out = FALLBACK_METAS.get(target, resolve(target))(*fake[0], **fake[1])

    def to_meta(t):
        if not isinstance(t, torch.Tensor):
            raise NotTensors(f"[meta] core.fallback({target}): returns {type(t).__name__}, not tensors")
        return TensorMeta(t.shape, t.stride(), t.dtype, device, grad and t.requires_grad)
    if isinstance(out, (tuple, list)):
        return tuple(to_meta(t) for t in out)
    return to_meta(out)


# random=True: the callable may draw random numbers (torch.bernoulli, torch.poisson, a Python
# function calling torch.rand): two equal calls are never merged by CSE, and the partitioner
# never recomputes one (capture keeps a gradient through a drawing call a graph break)
fallback = define("core", "fallback", _fallback_eager, random=True)
META_RULES[fallback] = fallback_meta


@VJP_RULES.register(fallback)
def fallback_vjp(g, out, target, *args, **kwargs):
    """Torch's autograd of the callable, replayed in the backward on the saved inputs
    (``core.custom_op_backward`` with no saved outputs); tensors passed by keyword take no
    gradient (capture breaks where one would need it)."""
    return custom_op_vjp_replay(g, out, target, *args, **kwargs)
DECOMPOSITIONS[fallback] = lambda target, *args, **kwargs: prims.fallback(target, *args, **kwargs)


# ------------------------------------------------------------------ histogramdd
# torch.histogramdd returns (hist, [bin_edges, ...]) and its bin-edge op has no meta kernel:
# the node is this flat form (every tensor a result), with the shapes computed here; capture
# puts torch's named tuple back together (capture/torch_api_reductions.py)
def _histogramdd_flat(input, bins=10, *, range=None, weight=None, density=False):
    hist, edges = torch.histogramdd(input, bins, range=range, weight=weight, density=density)
    return (hist, *edges)


def _histogramdd_flat_meta(input, bins=10, *, range=None, weight=None, density=False):
    dims = input.shape[-1]
    counts = [bins] * dims if isinstance(bins, int) else list(bins)
    if len(counts) != dims or not all(isinstance(b, int) for b in counts):
        raise TypeError(f"[meta] torch.histogramdd: bins={bins!r} for {dims}-d samples")
    hist = torch.empty(counts, dtype=input.dtype, device="meta")
    return (hist, *[torch.empty(b + 1, dtype=input.dtype, device="meta") for b in counts])


FALLBACK_TARGETS["histogramdd_flat"] = _histogramdd_flat
FALLBACK_METAS["histogramdd_flat"] = _histogramdd_flat_meta

