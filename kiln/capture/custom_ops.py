"""User-defined torch ops in capture: ``torch.library.custom_op`` functions (the ``CustomOpDef``
and ``torch.ops.ns.f`` / ``torch.ops.ns.f.default``) and ops made with
``torch.library.Library(ns, "DEF").define`` + ``impl``, become one ``core.custom_op`` node
(kiln/ops/core_custom.py): an opaque library call whose meta is the op's fake implementation.

What stays a graph break, with the reason:
* no fake (meta) implementation (``register_fake`` / ``impl_abstract``), or one that fails on
  meta tensors (a data-dependent output size);
* a schema that returns a view of an input, or mutates something other than a ``Tensor``,
  ``Tensor?``, ``Tensor[]`` or ``Tensor[]?`` argument (or returns a written argument while it
  writes a list); a mutating op that a gradient flows through, or whose written argument shares
  memory with another argument. Other mutating ops (``mutates_args``, ``Tensor(a!)``) are
  functionalized: ``core.custom_op_mutating`` runs the op on copies of what it writes and
  capture writes the copies back (``Writes``), so views and graph inputs see the write;
* a gradient needed through it while no autograd formula is registered (no
  ``register_autograd``, no Autograd or CompositeImplicitAutograd kernel): eager then does
  what torch does (a ``custom_op`` raises at backward), never a silent zero gradient;
* a tensor needing a gradient passed by keyword-only parameter (VJP rules take tensors
  positionally; ``register_autograd`` refuses kwarg-only tensors too).
"""
from __future__ import annotations

import torch

from kiln import log
from kiln.capture.errors import Unsupported
from kiln.graph import Proxy
from kiln.ops.core_custom import CustomOpMetaError, custom_op, custom_op_mutating
from kiln.ops.core_fallback import register_fallback_target
from kiln.graph.node import flatten_args
from kiln.capture.torch_api_inplace import Writes
from kiln.capture import mutation

# torch's own namespaces (torch 2.13 with torch.distributed loaded): their ops keep the aten
# path (capture/torch_ops.py: torch-level rules or fallback nodes). Collectives and FSDP's
# copy ops must never be functionalized by copying (a wait on a copy waits on nothing).
_BUILTIN_NAMESPACES = frozenset((
    "aten", "prims", "prim", "rngprims", "higher_order", "debugprims", "inductor", "inductor_prims",
    "quantized", "_quantized", "quantization", "mkl", "mkldnn", "mkldnn_prepacked", "onednn",
    "sparse", "c10d", "c10d_functional", "_c10d_functional", "_c10d_functional_autograd",
    "_dtensor", "fsdp", "symm_mem", "profiler", "export", "static_runtime", "debug_mode_ops",
    "_native", "_test", "streams"))
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
    # an empty alias set (a written ``Tensor(a!)[]?``: the set is on the element type) is a set
    # too: frozen, or the comprehension fails on it (``unhashable type: 'set'``)
    written = {frozenset(a.alias_info.before_set)
               for a in schema.arguments if a.alias_info is not None and a.alias_info.is_write}
    for a in schema.arguments:
        info = a.alias_info
        if info is not None and info.is_write and _written_kind(a.type) is None:
            return (f"it mutates {a.name}, a {a.type} (Tensor, Tensor?, Tensor[] and Tensor[]? "
                    "arguments are functionalized)")
    lists = any(_written_kind(a.type) == "list" for a in schema.arguments
                if a.alias_info is not None and a.alias_info.is_write)
    if lists and any(r.alias_info is not None for r in schema.returns):
        return "it returns a mutated argument and mutates a list of tensors"
    for r in schema.returns:
        if r.alias_info is not None and not (r.alias_info.is_write and
                                             frozenset(r.alias_info.before_set) in written):
            return "it returns a view of an input (an alias annotation in its schema)"
    if len(schema.returns) > 1 and any(r.alias_info is not None for r in schema.returns):
        return "it returns a mutated argument among several results"
    return None


def _written_kind(t) -> str | None:
    """"tensor" for a written ``Tensor``/``Tensor?``, "list" for ``Tensor[]``/``Tensor[]?``, else
    None (a written argument of another type is not functionalized)."""
    if t.kind() == "OptionalType":
        t = t.getElementType()
    if t.kind() == "TensorType":
        return "tensor"
    if t.kind() == "ListType" and t.getElementType().kind() == "TensorType":
        return "list"
    return None


def mutated_arguments(schema) -> tuple:
    """Where the arguments the op writes are in the call form capture builds (torch_ops
    ``_call_form``): a position among the positional parameters, or a keyword-only name."""
    where, i = [], 0
    for a in schema.arguments:
        if a.alias_info is not None and a.alias_info.is_write:
            where.append(a.name if a.kwarg_only else i)
        if not a.kwarg_only:
            i += 1
    return tuple(where)


def _functionalized(overload, target, label, where, args, kwargs):
    """The mutating op as ``core.custom_op_mutating``: its results, with the new values of the
    arguments it writes as ``Writes`` (capture/mutation.py writes them back)."""
    written = []
    for w in where:
        a = kwargs.get(w) if isinstance(w, str) else args[w] if w < len(args) else None
        # an omitted ``Tensor?``/``Tensor[]?`` writes nothing; a list writes each of its tensors
        items = () if a is None else a if isinstance(a, (list, tuple)) else (a,)
        if not all(isinstance(x, Proxy) for x in items):
            raise Unsupported(f"{label}: the argument it mutates is not a tensor or a list of tensors")
        written.extend(items)
    outs = custom_op_mutating(target, where, *args, **kwargs)
    results, news = list(outs[:len(outs) - len(written)]), outs[len(outs) - len(written):]
    returns = overload._schema.returns
    if not returns:
        result = None
    elif returns[0].alias_info is not None:  # `-> Tensor(a!)`: the mutated argument itself
        target_set = frozenset(returns[0].alias_info.before_set)
        result = next(p for p, a in zip(written, (a for a in overload._schema.arguments
                                                 if a.alias_info is not None and a.alias_info.is_write))
                      if frozenset(a.alias_info.before_set) == target_set)
    else:
        result = results[0] if len(returns) == 1 else tuple(results)
    return Writes(list(zip(written, news)), result)


def custom_op_adapter(overload, label: str):
    """(adapter, None) recording ``core.custom_op`` for the overload, or (None, why not)."""
    why = _refusal(overload)
    if why is not None:
        return None, why
    target = register_fallback_target(label, overload)
    where = mutated_arguments(overload._schema)

    def adapter(*args, **kwargs):
        proxies = [a for a in _flat(args) + _flat(kwargs) if isinstance(a, Proxy)]
        if not proxies:
            raise Unsupported(f"{label} has no tensor argument")
        if torch.is_grad_enabled() and any(_needs_grad(p) for p in proxies):
            missing = _autograd_missing(overload)
            if missing is not None:
                raise Unsupported(f"{label}: a gradient is needed through it and {missing}")
            if any(_needs_grad(p) for p in _flat(kwargs) if isinstance(p, Proxy)):
                raise Unsupported(f"{label}: a tensor needing a gradient is passed by keyword")
        try:
            if where:
                if torch.is_grad_enabled() and any(_needs_grad(p) for p in proxies):
                    raise Unsupported(f"{label}: it mutates its arguments and a gradient is involved "
                                      "(kiln has no autograd for mutating custom ops)")
                out = _functionalized(overload, target, label, where, args, kwargs)
            else:
                out = custom_op(target, *args, **kwargs)
        except Unsupported:
            raise
        except CustomOpMetaError as e:
            raise Unsupported(f"{label}: {e}") from None
        except Exception as e:  # noqa: BLE001 - the fake impl's own error names the problem
            raise Unsupported(f"{label}: its fake (meta) implementation failed on meta tensors (none "
                              f"registered with torch.library.register_fake, or a data-dependent "
                              f"output size): {type(e).__name__}: {e}") from None
        log.log("graph", "custom op node: %s runs as a library call inside the compiled graph", label)
        return out
    return adapter, None


def _needs_grad(p) -> bool:
    return bool(p.meta.requires_grad) and p.meta.dtype.is_floating_point


def _flat(obj) -> list:
    return list(flatten_args(obj))


def check_written_memory(tx, overload, pos, kw, label: str):
    """A mutating op's written argument must not share memory with another tensor argument:
    eager's answer would depend on the order the op reads and writes in; the copy it gets
    here reads the old values."""
    from kiln.capture.values import ListVariable, TensorVariable, TupleVariable
    where = mutated_arguments(overload._schema)
    if not where:
        return
    tensors = []  # ((argument, index in its list or None), tensor variable)
    for k, v in list(enumerate(pos)) + list(kw.items()):
        if isinstance(v, TensorVariable):
            tensors.append(((k, None), v))
        elif isinstance(v, (ListVariable, TupleVariable)):
            tensors += [((k, j), x) for j, x in enumerate(v.items) if isinstance(x, TensorVariable)]
    for key, var in tensors:
        if key[0] not in where:
            continue
        st = mutation.storage_of(tx, var).storage
        if any(k != key and mutation.storage_of(tx, o).storage is st for k, o in tensors):
            raise Unsupported(f"{label}: the tensor it mutates shares memory with another argument")
