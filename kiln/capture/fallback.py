"""Fallback nodes in capture: a torch function or Tensor method with no capture-table entry
runs eagerly inside the compiled graph (``core.fallback``), when that is safe:

* its output metadata can be computed on torch's meta device (one tensor, or a tuple of them:
  one node whose results are read by ``getitem``, kept as torch's named tuple where it has one);
* it does not mutate (no trailing ``_``, no ``out=``), change device, or leave torch's compute
  namespaces (RNG state, CUDA streams, autograd, I/O are graph breaks);
* no gradient is needed through a tensor passed by keyword (the fallback's VJP replays
  torch's autograd of the call for its positional tensors: ``ops/core_fallback.py``).
Each fallback is logged on the ``graph`` channel with the op's name.
"""
from __future__ import annotations

import types

import torch

from kiln import log
from kiln.capture.errors import Unsupported
from kiln.capture.known_constants import sizes_in_lists
from kiln.graph import Proxy
from kiln.graph.node import flatten_args
from kiln.ops import core
from kiln.ops.core_fallback import NotTensors, _map, register_fallback_target, tensor_positions
from kiln.capture.torch_api_inplace import Writes

# torch submodules whose functions are never run as fallbacks (RNG state, devices, autograd,
# I/O, compilers): a call into them stays a graph break
DENIED_SUBMODULES = ("cuda", "distributed", "random", "autograd", "backends", "utils", "profiler",
                     "jit", "serialization", "onnx", "hub", "multiprocessing", "_dynamo", "fx")
DENIED_NAMES = {"manual_seed", "seed", "save", "load", "set_grad_enabled", "no_grad", "enable_grad",
                "is_grad_enabled", "set_default_dtype", "set_printoptions", "compile", "cond",
                "item", "tolist", "numpy", "cpu", "cuda", "backward", "register_hook", "data_ptr",
                "storage", "untyped_storage", "pin_memory", "record_stream", "retain_grad",
                "requires_grad_", "to", "type", "is_nonzero", "nonzero", "unique", "masked_select",
                "bincount", "repeat_interleave", "equal", "allclose"}


def eligible(fn, name: str) -> str | None:
    """None if fn may become a fallback node, else the reason it may not."""
    short = name.rsplit(".", 1)[-1]
    mod = getattr(fn, "__module__", None) or ""
    if short.endswith("_") or short.startswith("_"):
        return f"{name} mutates its input or is private"
    if short in DENIED_NAMES:
        return f"{name} has side effects, a data-dependent shape or changes device"
    if any(mod == f"torch.{m}" or mod.startswith(f"torch.{m}.") for m in DENIED_SUBMODULES):
        return f"{name} is outside torch's tensor functions"
    return None


def fallback_adapter(fn, name: str):
    """An adapter that records ``core.fallback(name, ...)`` for fn."""
    short = getattr(fn, "__name__", "")
    if not name.startswith("Tensor.") and short and getattr(torch, short, None) is fn:
        name = f"torch.{short}"  # torch._VariableFunctionsClass.cumsum -> torch.cumsum
    elif getattr(torch.nn.functional, short, None) is fn:
        name = f"torch.nn.functional.{short}"
    reason = eligible(fn, name)
    if reason is not None:
        return None, reason

    def adapter(*args, **kwargs):
        if kwargs.get("out") is not None or "device" in kwargs:
            raise Unsupported(f"{name} with out=/device= is not captured")
        args, kwargs = sizes_in_lists(args, kwargs)
        proxies = [a for a in flatten_args((args, kwargs)) if isinstance(a, Proxy)]
        if not proxies:
            raise Unsupported(f"{name} has no tensor argument")
        if torch.is_grad_enabled() and any(p.meta.requires_grad for p in proxies):
            why = _not_replayable(fn, kwargs)
            if why is not None:
                raise Unsupported(f"{name} has no core op, and a gradient is needed through it ({why})")
        target = register_fallback_target(name, fn)
        try:
            out = core.fallback(target, *args, **kwargs)
        except NotTensors as e:  # not an argument error: eager would not raise, so a break
            out = _with_nones(fn, name, args, kwargs)
            if out is None:
                raise Unsupported(f"{name} returns no tensor ({e})") from None
            log.log("graph", "fallback node: %s runs eagerly inside the compiled graph", name)
            return out
        if isinstance(out, tuple):  # several results: one node, one getitem per result
            out = _as_return_type(fn, out)
        elif not isinstance(out, Proxy):
            raise Unsupported(f"{name} returns {type(out).__name__}, not tensors")
        log.log("graph", "fallback node: %s runs eagerly inside the compiled graph", name)
        return out
    return adapter, None


def inplace_fallback_adapter(name: str):
    """``x.foo_(*a)`` for a method with no capture-table entry: ``x.foo(*a)`` as a fallback node,
    written into x (functionalized, ``torch_api_inplace.Writes``), when every overload of
    ``aten.foo_`` is ``aten.foo`` with the same parameters and defaults written into self
    (``bernoulli_``'s p=0.5 is not ``bernoulli``'s p=self, so it is refused). A result that
    self's dtype cannot hold is a break, as eager raises."""
    from kiln.capture.torch_ops import _functional_of
    functional = getattr(torch.Tensor, name[:-1], None)
    packet = getattr(torch.ops.aten, name, None)
    overloads = [o for o in packet.overloads() if "out" not in o.split("_")] if packet is not None else []
    if functional is None or not overloads \
            or any(_functional_of(getattr(packet, o)._schema) is None for o in overloads):
        return None, f"Tensor.{name} mutates its input and is not its functional form written back"
    adapter, why = fallback_adapter(functional, f"Tensor.{name[:-1]}")
    if adapter is None:
        return None, why

    def inplace(self, *args, **kwargs):
        out = adapter(self, *args, **kwargs)
        if not isinstance(out, Proxy) or tuple(out.shape) != tuple(self.shape):
            raise Unsupported(f"Tensor.{name}: the result's shape differs from self's")
        if out.dtype != self.dtype:
            if not torch.can_cast(out.dtype, self.dtype):
                raise Unsupported(f"Tensor.{name}: a {out.dtype} result cannot be written into {self.dtype}")
            out = core.to_dtype(out, self.dtype)
        return Writes([(self, out)], self)
    return inplace, None


def draws_random(fn) -> bool:
    """Whether a C++-bound torch callable is a random op (its aten op is tagged
    ``nondeterministic_seeded``: ``torch.bernoulli``, ``torch.poisson``, ``Tensor.random_``)."""
    tags = getattr(fn, "tags", None)
    if tags is not None:  # an OpOverload
        return torch.Tag.nondeterministic_seeded in tags
    packet = getattr(torch.ops.aten, getattr(fn, "__name__", "") or "_", None)
    try:
        overloads = [getattr(packet, o) for o in packet.overloads()] if packet is not None else []
    except (AttributeError, RuntimeError):
        return False
    return any(torch.Tag.nondeterministic_seeded in o.tags for o in overloads)


def _not_replayable(fn, kwargs) -> str | None:
    """Why the backward cannot replay fn to get torch's gradient (the fallback's VJP runs the
    call again on the saved inputs), or None."""
    if any(isinstance(a, Proxy) and a.meta.requires_grad for a in flatten_args(kwargs)):
        return "a tensor passed by keyword"
    if isinstance(fn, types.FunctionType):  # Python code may draw random numbers (gumbel_softmax)
        return "a Python function, which may draw random numbers again in the backward"
    if draws_random(fn):
        return "a random op: the backward would draw again"
    return None


def _with_nones(fn, name, args, kwargs):
    """A result tuple with None entries among its tensors: the node is the op's tensors only
    (target ``name[0,2]``, which the fallback resolves in any process), and the Nones are put
    back here, where they are Python constants."""
    fake = _map((args, kwargs), lambda a: a.meta.fake() if isinstance(a, Proxy) else a)
    try:
        result = fn(*fake[0], **fake[1])
    except Exception:  # noqa: BLE001 - the op refused meta tensors: stays a break
        return None
    picks = tensor_positions(result)
    if picks is None:
        return None
    tensors = core.fallback(f"{name}[{','.join(map(str, picks))}]", *args, **kwargs)
    out = [None] * len(result)
    for i, t in zip(picks, tensors):
        out[i] = t
    return tuple(out)


def _as_return_type(fn, out: tuple):
    """torch.sort's results as ``torch.return_types.sort`` (``.values``/``.indices``)."""
    short = getattr(fn, "__name__", "")
    if isinstance(fn, torch._ops.OpOverload):
        short = fn.overloadpacket.__name__
    ty = getattr(torch.return_types, short, None)
    if isinstance(ty, type) and getattr(ty, "n_fields", None) == len(out):
        return ty(out)
    return out
