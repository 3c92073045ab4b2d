"""Capture of ``torch.autocast``: the context manager, the decorator, and the per-op casts.

While tracing, ``AutocastState`` knows, per device type, whether autocast is on and its dtype.
It starts from torch's *ambient* state at call time (a function compiled and called inside an
autocast region), read lazily per device type the first time an op on that device is recorded,
and guarded (``torch.is_autocast_enabled('cpu') is True``, ``torch.get_autocast_dtype('cpu') ==
torch.bfloat16``), so calling outside the region recompiles. ``with torch.autocast(...)``,
``torch.cpu.amp.autocast`` / ``torch.cuda.amp.autocast``, a ``torch.autocast`` object made
outside the traced code, and functions decorated with ``@torch.autocast(...)`` push and pop
regions on top of it; nothing runs torch's own ``__enter__``.

``AutocastState.cast_inputs`` is the tracer's graph call hook: before a core op is recorded,
its floating tensor inputs are cast per ``kiln.ops.autocast``'s policy table, as explicit
``core.to_dtype`` nodes. Captured graphs are therefore autocast-free: meta, autograd (the VJP
of ``to_dtype`` converts the gradient back), decomposition and codegen see plain dtypes. The
compiled graph then runs with torch's autocast off (``CaptureResult.autocast_devices``), so
library calls inside it (``torch.mm`` in extern kernels) do not cast a second time.

A fallback node (``core.fallback``) under autocast is kept only when torch's behaviour is known:
its name is in the policy table, or it is a single non-composite aten op (autocast then leaves
its inputs alone). A composite torch function could autocast ops inside it, so it is a graph
break there.
"""
from __future__ import annotations

import inspect
import types

import torch

from kiln.capture.errors import Unsupported
from kiln.capture.guards import ExprSource, AttrSource
from kiln.capture.values import ConstantVariable, Variable
from kiln.graph import Proxy
from kiln.graph.node import flatten_args
from kiln.ops import autocast as policy_table
from kiln.ops import core
from kiln.ops.registry import Op
from kiln.ops.core_fallback import resolve

AUTOCAST_CLASSES = tuple(c for c in (
    torch.autocast,
    getattr(getattr(torch.cpu, "amp", None), "autocast", None),
    getattr(getattr(torch.cuda, "amp", None), "autocast", None),
) if isinstance(c, type))


def _class_device(cls) -> str | None:
    mod = cls.__module__ or ""
    if mod.startswith("torch.cpu"):
        return "cpu"
    if mod.startswith("torch.cuda"):
        return "cuda"
    return None  # torch.autocast: device_type is an argument


# ====================================================================== tracing state
class Region:
    """One entered autocast region: device type -> (enabled, dtype)."""

    __slots__ = ("device", "enabled", "dtype")

    def __init__(self, device, enabled, dtype):
        self.device, self.enabled, self.dtype = device, enabled, dtype


class AutocastState:
    def __init__(self, guards):
        self.guards = guards
        self.ambient: dict[str, tuple[bool, torch.dtype]] = {}
        self._dtype_guarded: set[str] = set()
        self.regions: list[Region] = []

    @classmethod
    def outside(cls) -> "AutocastState":
        """The state of code that runs outside any autocast region whatever the call's state
        was, read without a guard: a custom Function's backward (eager's engine runs it at
        ``backward()``, kiln's compiled backward with autocast off). Regions it enters
        (``custom_bwd``) still cast."""
        state = cls(None)
        for device in policy_table.DEVICE_TYPES:
            state.ambient[device] = (False, policy_table.get_dtype(device))
            state._dtype_guarded.add(device)
        return state

    # ---------------------------------------------------------------- reading the state
    def _ambient(self, device: str, need_dtype: bool = False):
        state = self.ambient.get(device)
        if state is None:
            enabled = policy_table.is_enabled(device)
            state = self.ambient[device] = (enabled, policy_table.get_dtype(device))
            self.guards.add(ExprSource(policy_table.enabled_expr(device)), f"{{}} is {enabled}")
        if (state[0] or need_dtype) and device not in self._dtype_guarded:
            self._dtype_guarded.add(device)
            self.guards.add(ExprSource(policy_table.dtype_expr(device)), f"{{}} == {state[1]}")
        return state

    def current(self, device: str, need_dtype: bool = False) -> tuple[bool, torch.dtype]:
        for region in reversed(self.regions):
            if region.device == device:
                return region.enabled, region.dtype
        return self._ambient(device, need_dtype)

    def finish(self, graph, at_break: bool = False) -> tuple[str, ...]:
        """At the end of the trace: device types whose ambient autocast is on, for which the
        compiled graph runs with torch's autocast off. Every device type the graph computes on
        is read (and guarded), even when all its ops ran inside traced regions: under ambient
        autocast, torch would otherwise cast the graph's own library calls again."""
        if self.regions and not at_break:  # (at a break, the glue enters open regions for real)
            raise Unsupported("a torch.autocast region is still open at the end of the trace")
        graph.call_hook = None  # later stages add nodes without autocast
        devices = {getattr(n.meta.get("val"), "device", None) for n in graph.nodes}
        for d in policy_table.DEVICE_TYPES:
            if any(dev is not None and dev.type == d for dev in devices):
                self._ambient(d)
        return tuple(d for d, (on, _) in self.ambient.items() if on)

    # ---------------------------------------------------------------- regions
    def enter(self, device: str, enabled: bool, dtype) -> Region:
        if device not in policy_table.DEVICE_TYPES:
            raise Unsupported(f"torch.autocast on device type {device!r} is not supported "
                              f"(kiln knows {', '.join(policy_table.DEVICE_TYPES)})")
        if dtype is None:
            dtype = self.current(device, need_dtype=True)[1]
        if device == "cuda" and enabled and not torch.cuda.is_available():
            enabled = False  # torch warns and disables autocast too
        if enabled and dtype not in policy_table.SUPPORTED_DTYPES[device]:
            raise Unsupported(f"torch.autocast({device!r}, dtype={dtype}): torch disables "
                              "autocast for this dtype with a warning")
        region = Region(device, bool(enabled), dtype)
        self.regions.append(region)
        return region

    def exit(self, region: Region):
        if not self.regions or self.regions[-1] is not region:
            raise Unsupported("autocast regions exited out of order")
        self.regions.pop()

    # ---------------------------------------------------------------- the per-op casts
    def cast_inputs(self, target, args, kwargs):
        """The graph call hook: args and kwargs of a core op call, cast per the policy."""
        if not isinstance(target, Op) or target.namespace != "core" or target is core.to_dtype:
            return args, kwargs
        proxies = [a for a in flatten_args((args, kwargs)) if isinstance(a, Proxy)]
        if not proxies:
            return args, kwargs
        types_ = {p.device.type for p in proxies}
        device = "cuda" if "cuda" in types_ else proxies[0].device.type
        if device not in policy_table.DEVICE_TYPES:
            return args, kwargs
        enabled, dtype = self.current(device)
        if not enabled:
            return args, kwargs
        if target.name == "custom_op":  # a torch.library op: torch autocasts inside its Python
            raise Unsupported(f"{args[0]} under torch.autocast({device!r}): a custom op's "
                              "implementation runs with autocast on in eager (its inner ops cast)")
        name = op_name(target, args)
        kind = policy_table.policy(device, name)
        if target is core.fallback and kind is None:
            reason = _fallback_unknown(args[0])
            if reason is not None:
                raise Unsupported(f"{args[0]} under torch.autocast({device!r}): {reason}")
            return args, kwargs
        if kind is None:
            return args, kwargs
        if kind == policy_table.BANNED:
            raise Unsupported(f"{name} is not allowed under torch.autocast({device!r}) "
                              "(torch raises; eager reports it)")
        eligible = [p for p in proxies if policy_table.eligible(p.dtype, p.device, device)]
        if kind == policy_table.LOWER:
            to = dtype
        elif kind == policy_table.FP32:
            if _explicit_dtype(args, kwargs):
                return args, kwargs  # an explicit dtype= wins over autocast
            to = torch.float32
        else:
            try:
                to = policy_table.promote_dtype(dtype, [p.dtype for p in eligible])
            except ValueError as e:
                raise Unsupported(f"{name} under torch.autocast({device!r}): {e}") from None
        if all(p.dtype == to for p in eligible):
            return args, kwargs
        casts: dict = {}

        def cast(x):
            if isinstance(x, Proxy) and policy_table.eligible(x.dtype, x.device, device) and x.dtype != to:
                key = id(x.node)
                if key not in casts:
                    casts[key] = core.to_dtype(x, to)
                return casts[key]
            if isinstance(x, (tuple, list)):
                return type(x)(cast(v) for v in x)
            if isinstance(x, dict):
                return {k: cast(v) for k, v in x.items()}
            return x

        return cast(args), cast(kwargs)


def op_name(target: Op, args) -> str:
    """The policy-table name of a core op call."""
    if target is core.fallback:
        return str(args[0]).rsplit(".", 1)[-1]
    if target is core.div and args and not isinstance(args[0], Proxy):
        return "__rtruediv__"  # number / tensor: torch computes reciprocal(x) * number
    return target.name


def _explicit_dtype(args, kwargs) -> bool:
    return any(isinstance(a, torch.dtype) for a in flatten_args((args, kwargs)))


def _fallback_unknown(name: str) -> str | None:
    """None if autocast leaves this fallback's inputs and inner ops alone, else why not known."""

    try:
        fn = resolve(name)
    except KeyError:
        return "its callable is not known"
    if not isinstance(fn, (types.BuiltinFunctionType, types.MethodDescriptorType)):
        return "it is Python code whose inner ops autocast may cast"
    short = name.rsplit(".", 1)[-1]
    try:
        overloads = getattr(torch.ops.aten, short).overloads()
    except Exception:  # noqa: BLE001 - not an aten op
        return "it is not a single aten op"
    found = False
    for ov in overloads:
        if ov == "out" or ov.endswith("_out"):
            continue  # out= is never captured
        qual = f"aten::{short}" if ov == "default" else f"aten::{short}.{ov}"
        try:
            composite = torch._C._dispatch_has_kernel_for_dispatch_key(qual, "CompositeImplicitAutograd")
        except Exception:  # noqa: BLE001 - a TorchScript-only overload, not in the dispatcher
            continue
        if composite and "dimname" not in ov.lower():  # named-dim overloads are never captured
            return "it is a composite aten op whose inner ops autocast may cast"
        found = True
    return None if found else "it is not a single aten op"


# ====================================================================== value trackers
def _const(v: Variable, what: str):
    try:
        return v.as_python()
    except Unsupported:
        raise Unsupported(f"torch.autocast: {what} must be a Python constant, got {v}") from None


class AutocastClassVariable(Variable):
    """``torch.autocast`` / ``torch.cpu.amp.autocast`` / ``torch.cuda.amp.autocast`` itself."""

    def __init__(self, cls, source=None):
        self.cls = cls
        self.source = source

    def python_type(self):
        return type(self.cls)

    def call(self, tx, args, kwargs):
        py_args = [_const(a, "every argument") for a in args]
        py_kwargs = {k: _const(v, k) for k, v in kwargs.items()}
        try:
            bound = inspect.signature(self.cls.__init__).bind(None, *py_args, **py_kwargs)
        except TypeError as e:
            raise Unsupported(f"torch.autocast: {e}") from None
        bound.apply_defaults()
        a = bound.arguments
        device = _class_device(self.cls) or a.get("device_type")
        if not isinstance(device, str):
            raise Unsupported(f"torch.autocast: device_type must be a string, got {device!r}")
        return AutocastContextVariable(device, bool(a.get("enabled", True)), a.get("dtype"))

    def __repr__(self):
        return f"AutocastClass({self.cls.__module__}.{self.cls.__qualname__})"


class AutocastContextVariable(Variable):
    """An autocast object: ``with`` enters its region; calling it decorates a function."""

    def __init__(self, device, enabled, dtype, source=None):
        self.device, self.enabled, self.dtype = device, enabled, dtype
        self.source = source

    def python_type(self):
        return torch.autocast

    def enter(self, tx):
        """BEFORE_WITH: push the region; returns (the exit callable, what ``as`` binds)."""
        region = tx.autocast.enter(self.device, self.enabled, self.dtype)
        return AutocastExitVariable(region), self

    def call(self, tx, args, kwargs):
        if len(args) != 1 or kwargs:
            raise Unsupported("torch.autocast(...) called with other than one function")
        return AutocastDecoratedVariable(self, args[0])

    def __repr__(self):
        return f"autocast({self.device!r}, enabled={self.enabled}, dtype={self.dtype})"


class AutocastExitVariable(Variable):
    """The bound ``__exit__`` that BEFORE_WITH leaves on the stack."""

    def __init__(self, region):
        self.region = region

    def call(self, tx, args, kwargs):
        tx.autocast.exit(self.region)
        return ConstantVariable(None)

    def __repr__(self):
        return "autocast.__exit__"


class AutocastDecoratedVariable(Variable):
    """``torch.autocast(...)(fn)`` made during the trace: calls run fn inside the region."""

    def __init__(self, ctx: AutocastContextVariable, fn: Variable):
        self.ctx, self.fn = ctx, fn

    def call(self, tx, args, kwargs):
        region = tx.autocast.enter(self.ctx.device, self.ctx.enabled, self.ctx.dtype)
        out = self.fn.call(tx, args, kwargs)
        tx.autocast.exit(region)
        return out


class AutocastQueryVariable(Variable):
    """``torch.is_autocast_enabled(...)`` / ``torch.get_autocast_dtype(...)``, answered from the
    traced state (the ambient part is guarded)."""

    def __init__(self, fn, what: str, device: str | None, source=None):
        self.fn, self.what, self.device = fn, what, device
        self.source = source

    def call(self, tx, args, kwargs):
        device = self.device
        if device is None:
            py = [_const(a, "the device type") for a in [*args, *kwargs.values()]]
            if not py and self.what == "dtype":
                raise Unsupported("torch.get_autocast_dtype() without a device type (torch raises)")
            device = py[0] if py else "cuda"  # is_autocast_enabled(): the CUDA switch
        if device not in policy_table.DEVICE_TYPES:
            raise Unsupported(f"torch autocast query for device type {device!r}")
        enabled, dtype = tx.autocast.current(device, need_dtype=self.what == "dtype")
        return ConstantVariable(enabled if self.what == "enabled" else dtype)


def _queries():
    table = {}
    for name, what, device in (("is_autocast_enabled", "enabled", None),
                               ("get_autocast_dtype", "dtype", None),
                               ("is_autocast_cpu_enabled", "enabled", "cpu"),
                               ("get_autocast_cpu_dtype", "dtype", "cpu"),
                               ("get_autocast_gpu_dtype", "dtype", "cuda")):
        fn = getattr(torch, name, None)
        if fn is not None:
            table[fn] = (what, device)
    return table


_QUERIES = _queries()


def wrap_autocast(tx, value, source, guard=True):
    """A Variable for an autocast class, object or state query reached by the traced code,
    or None when value is none of these (``Tracer.wrap`` asks first)."""
    guard = guard and source is not None
    if isinstance(value, type):
        if value in AUTOCAST_CLASSES:
            if guard:
                tx.guards.identity(source, value)
            return AutocastClassVariable(value, source)
        return None
    if isinstance(value, AUTOCAST_CLASSES):
        if guard:
            tx.guards.identity(source, value)
            for attr in ("device", "fast_dtype", "_enabled"):
                tx.guards.constant(AttrSource(source, attr), getattr(value, attr))
        return AutocastContextVariable(value.device, bool(value._enabled), value.fast_dtype, source)
    try:
        query = _QUERIES.get(value)
    except Exception:  # noqa: BLE001 - unhashable (or a __hash__ that raises)
        return None
    if query is not None:
        if guard:
            tx.guards.identity(source, value)
        return AutocastQueryVariable(value, *query, source=source)
    return None


__all__ = ["AutocastState", "wrap_autocast", "AUTOCAST_CLASSES", "op_name"]
