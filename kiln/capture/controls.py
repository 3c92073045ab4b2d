"""torch.compiler's controls, as kiln reads them (issue 27).

A user of torch.compile steers it with ``torch.compiler.*`` (and ``torch._dynamo.mark_*``).
Those calls leave their state in plain places: attributes on the tensor or function they mark,
and the stance in a module global of ``torch._dynamo.eval_frame``. kiln honours the same calls
by reading that state here, and nowhere else. Nothing here imports ``torch._dynamo``: the
stance module is looked up in ``sys.modules`` (``set_stance`` imports it, so when it is not
loaded no stance was ever set), and marks are read with ``getattr`` (absent: no mark).

- ``dim_marks``: ``mark_dynamic`` / ``maybe_mark_dynamic`` / ``mark_static`` (and
  ``kiln.mark_dynamic``) on a tensor, as the dims capture makes symbolic or keeps static;
- ``is_disabled``: a function wrapped by ``torch.compiler.disable`` (or ``kiln.disable``);
- ``is_constant_result``: ``torch.compiler.assume_constant_result``;
- ``is_allowed_in_graph``: ``torch.compiler.allow_in_graph``;
- ``stance``: ``torch.compiler.set_stance``'s current stance (api.py acts on it);
- ``STEP_MARKERS``: ``torch.compiler.cudagraph_mark_step_begin``, a no-op in a trace.
"""
from __future__ import annotations

import sys

import torch

_EVAL_FRAME = "torch._dynamo.eval_frame"
_TRACE_RULES = "torch._dynamo.trace_rules"
_loaded: dict = {}  # the torch._dynamo modules once seen in sys.modules (never imported here)


def _module(name):
    mod = _loaded.get(name)
    if mod is None:
        mod = sys.modules.get(name)
        if mod is not None:
            _loaded[name] = mod
    return mod


def stance() -> str:
    """"default", "force_eager", "eager_on_recompile", "fail_on_recompile",
    "eager_then_compile" or "aot_eager_then_compile" (torch.compiler.set_stance's)."""
    ef = _loaded.get(_EVAL_FRAME) or _module(_EVAL_FRAME)
    if ef is None:
        return "default"
    return getattr(getattr(ef, "_stance", None), "stance", "default")


def _dims(t, attr) -> set:
    return set(getattr(t, attr, None) or ())


def dim_marks(t: torch.Tensor) -> tuple[set, set]:
    """(dims marked dynamic, dims marked static), each normalized to 0..dim-1."""
    n = t.dim()
    dynamic = _dims(t, "_kiln_dynamic_dims") | _dims(t, "_dynamo_dynamic_indices") | \
        _dims(t, "_dynamo_weak_dynamic_indices") | _dims(t, "_dynamo_unbacked_indices")
    static = _dims(t, "_dynamo_static_indices")
    return ({d % n for d in dynamic if -n <= d < n}, {d % n for d in static if -n <= d < n})


def _mark(fn, attr) -> bool:
    # ``is True``: namespaces such as torch.ops make up any attribute asked for
    try:
        return getattr(fn, attr, False) is True
    except Exception:  # noqa: BLE001 - an object whose __getattr__ raises something else
        return False


def _torch_disable_code():
    """The code of the wrapper ``torch._disable_dynamo(fn)`` returns (torch/_compile.py's
    ``inner``): it carries no mark until its first call, when it makes and caches Dynamo's
    disabled function. torch decorates ``Optimizer.zero_grad``, ``state_dict`` and
    ``load_state_dict`` with it, and its optimizers' functional steps when Dynamo compiles."""
    made = getattr(torch, "_disable_dynamo", None)
    try:
        return made(lambda: None).__code__ if made is not None else None
    except Exception:  # noqa: BLE001 - another torch's spelling: nothing to recognize
        return None


_TORCH_DISABLE_CODE = _torch_disable_code()


def is_disabled(fn) -> bool:
    """Not to be traced: the call is a graph break and runs natively (marked kiln.disable or
    torch.compiler.disable, or torch's own ``_disable_dynamo`` wrapper: traced, it broke four
    times on its lazy import of Dynamo and its attribute cache before reaching the call)."""
    if _mark(fn, "_kiln_disabled") or _mark(fn, "_torchdynamo_disable"):
        return True
    code = getattr(getattr(fn, "__func__", fn), "__code__", None)
    return code is not None and code is _TORCH_DISABLE_CODE


def compiled_original(fn):
    """The function a ``kiln.compile``'d function wraps, or None for anything else. Called in
    a traced frame (a compiled function calling another, a module whose class compiled its
    forward), it is traced as that function, in the caller's graph: Dynamo inlines a nested
    torch.compile so, and the inner one's own options do not apply there."""
    if _mark(type(fn), "_kiln_compiled_function"):
        return fn.fn
    return None


def disabled_reason(fn) -> str:
    if _mark(fn, "_kiln_disabled"):
        return "marked kiln.disable"
    if not _mark(fn, "_torchdynamo_disable"):
        return "wrapped by torch._disable_dynamo (torch keeps it out of compiled code)"
    msg = getattr(fn, "_torchdynamo_disable_msg", None)
    return "marked torch.compiler.disable" + (f" ({msg})" if msg else "")


def is_constant_result(fn) -> bool:
    return _mark(fn, "_dynamo_marked_constant")


def is_allowed_in_graph(fn) -> bool:
    """``torch.compiler.allow_in_graph(fn)`` records ``id(fn)`` in Dynamo's allow list (and
    takes it out when ``fn`` dies, so a reused id is not a false match)."""
    rules = _module(_TRACE_RULES)
    if rules is None:
        return False
    ids = getattr(rules, "_allowed_callable_ids", None)
    try:
        return ids is not None and id(fn) in ids
    except Exception:  # noqa: BLE001 - another torch version's container: not marked
        return False


STEP_MARKERS = tuple(f for f in (getattr(torch.compiler, "cudagraph_mark_step_begin", None),)
                     if f is not None)
