"""User-defined torch ops in capture: ``torch.library.custom_op`` functions (the ``CustomOpDef``
and ``torch.ops.ns.f`` / ``torch.ops.ns.f.default``) and ops made with
``torch.library.Library(ns, "DEF").define`` + ``impl``, become one ``core.custom_op`` node
(kiln/ops/core_custom.py): an opaque library call whose meta is the op's fake implementation.

What stays a graph break, with the reason:
* no fake (meta) implementation (``register_fake`` / ``impl_abstract``), or one that fails on
  meta tensors (a data-dependent output size);
* a schema that mutates (``mutates_args``) or returns a view of an input (alias annotations):
  kiln does not functionalize through an opaque op;
* a gradient needed through it while no autograd formula is registered (no
  ``register_autograd``, no Autograd or CompositeImplicitAutograd kernel): eager then does
  what torch does (a ``custom_op`` raises at backward), never a silent zero gradient;
* a tensor needing a gradient passed by keyword or inside a list (the VJP takes tensors
  positionally, one gradient each).
"""
from __future__ import annotations

import torch

from kiln import log
from kiln.capture.errors import Unsupported
from kiln.graph import Proxy
from kiln.ops.core_custom import CustomOpMetaError, custom_op
from kiln.ops.core_fallback import register_fallback_target

_BUILTIN_NAMESPACES = ("aten", "prims", "prim", "quantized", "_quantized", "rngprims", "higher_order")
_AUTOGRAD_KEYS = ("Autograd", "AutogradCPU", "AutogradCUDA", "CompositeImplicitAutograd")


def custom_op_def(value):
    """The ``OpOverload`` behind a ``torch.library.custom_op`` function, or None."""
    from torch._library.custom_ops import CustomOpDef
    return value._opoverload if isinstance(value, CustomOpDef) else None


def is_user_op(overload) -> bool:
    """An op of a namespace that torch does not own (a user's or a library's extension)."""
    return overload._schema.name.split("::", 1)[0] not in _BUILTIN_NAMESPACES


def _autograd_missing(overload) -> str | None:
    """None when torch's autograd knows a formula for the op, else why not."""
    from torch._library.custom_ops import OPDEFS
    qualname = overload._schema.name
    opdef = OPDEFS.get(qualname)
    if opdef is not None:  # a custom_op always has an Autograd kernel; it raises without a formula
        if getattr(opdef, "_backward_fn", None) is None:
            return "no autograd formula is registered for it (torch.library.register_autograd)"
        return None
    for key in _AUTOGRAD_KEYS:
        try:
            if torch._C._dispatch_has_kernel_for_dispatch_key(overload._name, key):
                return None
        except RuntimeError:
            break
    return "no autograd formula is registered for it (torch.library.register_autograd)"


def _refusal(overload) -> str | None:
    schema = overload._schema
    if schema.is_mutable:
        return "it mutates its arguments (mutates_args / a (a!) schema); kiln does not functionalize opaque ops"
    if any(r.alias_info is not None for r in schema.returns):
        return "it returns a view of an input (an alias annotation in its schema)"
    return None


def custom_op_adapter(overload, label: str):
    """(adapter, None) recording ``core.custom_op`` for the overload, or (None, why not)."""
    why = _refusal(overload)
    if why is not None:
        return None, why
    target = register_fallback_target(label, overload)

    def adapter(*args, **kwargs):
        proxies = [a for a in _flat(args) + _flat(kwargs) if isinstance(a, Proxy)]
        if not proxies:
            raise Unsupported(f"{label} has no tensor argument")
        if torch.is_grad_enabled() and any(_needs_grad(p) for p in proxies):
            missing = _autograd_missing(overload)
            if missing is not None:
                raise Unsupported(f"{label}: a gradient is needed through it and {missing}")
            if any(_needs_grad(p) for p in _flat(kwargs) + _flat([a for a in args if not isinstance(a, Proxy)])
                   if isinstance(p, Proxy)):
                raise Unsupported(f"{label}: a tensor needing a gradient is passed by keyword or in a list")
        try:
            out = custom_op(target, *args, **kwargs)
        except Unsupported:
            raise
        except CustomOpMetaError as e:
            raise Unsupported(f"{label}: {e}") from None
        except Exception as e:  # noqa: BLE001 - the fake impl's own error names the problem
            raise Unsupported(f"{label}: its fake (meta) implementation failed (register one with "
                              f"torch.library.register_fake): {type(e).__name__}: {e}") from None
        log.log("graph", "custom op node: %s runs as a library call inside the compiled graph", label)
        return out
    return adapter, None


def _needs_grad(p) -> bool:
    return bool(p.meta.requires_grad) and p.meta.dtype.is_floating_point


def _flat(obj) -> list:
    from kiln.graph.node import flatten_args
    return list(flatten_args(obj))
