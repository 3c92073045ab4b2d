"""Binding a call's arguments to a frame's parameters: ``frame_locals`` (the real values, as
``L``), ``bind_arguments`` (the tracer's Variables, for an inlined call), and the name a graph
input gets from its source."""
from __future__ import annotations

import inspect
import types

from kiln.capture.errors import Unsupported
from kiln.capture.guards import AttrSource, ItemSource, LocalSource, Source
from kiln.capture.values import DictVariable, LazyVariable, TupleVariable
from kiln.capture.values_callables import FunctionVariable


def _placeholder_name(source: Source) -> str:
    parts = []
    s = source
    while s is not None:
        if isinstance(s, AttrSource):
            parts.append(s.attr)
        elif isinstance(s, ItemSource):
            parts.append(str(s.key))
        elif isinstance(s, LocalSource):
            parts.append(s.name)
        else:
            parts.append(getattr(s, "name", "g"))
        s = s.parent
    parts = [p for p in reversed(parts) if p not in ("self", "L")]
    return "_".join(parts) or "input"


def bind_arguments(fn: FunctionVariable, tx, args, kwargs) -> dict:
    """Map a call's Variables onto the callee's parameter names, with defaults filled in."""
    code = fn.code
    proto = types.FunctionType(code, {}, code.co_name, None,
                               tuple(types.CellType() for _ in code.co_freevars))
    if fn.fn is not None:
        defaults = fn.fn.__defaults__ or ()
        kwdefaults = fn.fn.__kwdefaults__ or {}
        dsrc = tx.attr_source(fn.source, "__defaults__")
        ksrc = tx.attr_source(fn.source, "__kwdefaults__")
        proto.__defaults__ = tuple(
            LazyVariable(v, ItemSource(dsrc, i) if dsrc else None) for i, v in enumerate(defaults)) or None
        proto.__kwdefaults__ = {k: LazyVariable(v, ItemSource(ksrc, k) if ksrc else None)
                                for k, v in kwdefaults.items()} or None
    else:
        proto.__defaults__ = tuple(fn.defaults) or None
        proto.__kwdefaults__ = dict(fn.kwdefaults) or None
    try:
        bound = inspect.signature(proto).bind(*args, **kwargs)
    except TypeError as e:
        raise Unsupported(f"calling {fn.qualname}: {e}") from None
    bound.apply_defaults()
    out = {}
    # inspect renames comprehension's implicit ".0" parameter; the code's own names win.
    nparams = code.co_argcount + code.co_kwonlyargcount
    nparams += bool(code.co_flags & inspect.CO_VARARGS) + bool(code.co_flags & inspect.CO_VARKEYWORDS)
    params = inspect.signature(proto).parameters.items()
    for code_name, (name, param) in zip(code.co_varnames[:nparams], params):
        value = bound.arguments[name]
        if param.kind is inspect.Parameter.VAR_POSITIONAL:
            value = TupleVariable(list(value))
        elif param.kind is inspect.Parameter.VAR_KEYWORD:
            value = DictVariable(dict(value))
        out[code_name] = value
    return out


def frame_locals(fn, args: tuple, kwargs: dict) -> dict:
    """``L`` for a call ``fn(*args, **kwargs)``: what guards, fetch and input_sources read.

    It is the frame's locals at entry, as CPython's ``frame.f_locals`` has them: every
    parameter by name (``self`` for a bound method; defaults filled in; ``*args`` as a tuple,
    ``**kwargs`` as a dict), and every free variable of a closure by name.
    """
    func, bound_self = _unbind(fn)
    sig_args = (bound_self, *args) if bound_self is not None else tuple(args)
    # the code's own parameters, not a functools.wraps target's (@torch.autocast(...) wrappers)
    ba = inspect.signature(func, follow_wrapped=False).bind(*sig_args, **kwargs)
    ba.apply_defaults()
    L = dict(ba.arguments)
    for name, cell in zip(func.__code__.co_freevars, func.__closure__ or ()):
        try:
            L[name] = cell.cell_contents
        except ValueError:
            pass
    if func.__closure__:
        L[CLOSURE_KEY] = func.__closure__  # the cells, for replaying writes to free variables
    return L


CLOSURE_KEY = "<closure>"


def _unbind(fn):
    if isinstance(fn, types.MethodType):
        return fn.__func__, fn.__self__
    if isinstance(fn, types.FunctionType):
        return fn, None
    raise Unsupported(f"capturing {type(fn).__name__} objects is not supported (need a function "
                      "or a bound method)")
