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
    # nor a ``__signature__`` set on the function (the kernels package gives its Func.forward,
    # ``(self, *args, **kwargs)``, the kernel's): CPython binds the frame by its code
    if "__signature__" in func.__dict__:
        func = _unsigned(func)
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


def _unsigned(func):
    """A copy of ``func`` without its ``__signature__``: inspect then reads its code."""
    copy = types.FunctionType(func.__code__, func.__globals__, func.__name__, func.__defaults__,
                              func.__closure__)
    copy.__kwdefaults__ = func.__kwdefaults__
    return copy


def _unbind(fn):
    if isinstance(fn, types.MethodType):
        return fn.__func__, fn.__self__
    if isinstance(fn, types.FunctionType):
        return fn, None
    raise Unsupported(f"capturing {type(fn).__name__} objects is not supported (need a function "
                      "or a bound method)")


_VARARGS, _VARKEYWORDS = inspect.CO_VARARGS, inspect.CO_VARKEYWORDS


def fast_locals_builder(fn):
    """A cheap L builder: ``build(args, kwargs)`` gives what ``frame_locals`` gives (every
    parameter in parameter order, defaults read at call time, ``*args`` as a tuple and
    ``**kwargs`` as a dict, a closure's free variables from its cells), or None for a call it
    cannot bind, which then takes the general binding and raises Python's own TypeError.
    ``inspect.signature(...).bind`` costs 15-60 us a call, and a transformers forward always
    has ``**kwargs``. None (no builder) for what is not a plain function or method. Like
    CPython, it binds by the code (a ``__signature__`` the function carries is not read)."""
    func, bound_self = fn, None
    if isinstance(fn, types.MethodType):
        func, bound_self = fn.__func__, fn.__self__
    if not isinstance(func, types.FunctionType):
        return None
    code = func.__code__
    n, kwonly, flags = code.co_argcount, code.co_kwonlyargcount, code.co_flags
    varnames = code.co_varnames
    names, kw_names = varnames[:n], varnames[n:n + kwonly]
    star = varnames[n + kwonly] if flags & _VARARGS else None
    starstar = varnames[n + kwonly + bool(star)] if flags & _VARKEYWORDS else None
    by_keyword = frozenset(names[code.co_posonlyargcount:])
    kw_only = frozenset(kw_names)
    free = code.co_freevars
    bound = (bound_self,) if bound_self is not None else ()
    simple = star is None and starstar is None and not kwonly

    def build(args, kwargs):
        if bound:
            args = (*bound, *args)
        if simple and len(args) == n and not kwargs:
            L = dict(zip(names, args))
        else:
            L = _bind(func, args, kwargs)
            if L is None:
                return None
        if free:
            cells = func.__closure__
            for name, cell in zip(free, cells):
                try:
                    L[name] = cell.cell_contents
                except ValueError:  # an empty cell (assigned later in the enclosing function)
                    pass
            L[CLOSURE_KEY] = cells
        return L

    def _bind(func, args, kwargs):
        if len(args) > n and star is None:
            return None
        by_name, extra = {}, {}
        for k, v in kwargs.items():
            if k in by_keyword or k in kw_only:
                by_name[k] = v
            elif starstar is not None:
                extra[k] = v  # a positional-only name passed by keyword lands here too
            else:
                return None
        defaults = func.__defaults__ or ()
        first_default = n - len(defaults)
        L = {}
        for i, name in enumerate(names):
            if i < len(args):
                if name in by_name:
                    return None  # given twice
                L[name] = args[i]
            elif name in by_name:
                L[name] = by_name[name]
            elif i >= first_default:
                L[name] = defaults[i - first_default]
            else:
                return None
        if star is not None:
            L[star] = tuple(args[n:])
        if kwonly:
            kwdefaults = func.__kwdefaults__ or {}
            for name in kw_names:
                if name in by_name:
                    L[name] = by_name[name]
                elif name in kwdefaults:
                    L[name] = kwdefaults[name]
                else:
                    return None
        if starstar is not None:
            L[starstar] = extra
        return L
    return build


# torch's argument parser takes NumPy's names for these everywhere (``x.mean(axis=2)``,
# ``keepdims=True``): I-BERT's LayerNorm ran eagerly on ``axis``
_NUMPY_ALIASES = {"axis": "dim", "keepdims": "keepdim"}


def numpy_aliases(adapter, kwargs: dict) -> dict:
    try:
        params = inspect.signature(adapter).parameters
    except (TypeError, ValueError):
        return kwargs
    if any(p.kind is p.VAR_KEYWORD for p in params.values()):
        return kwargs
    return {(_NUMPY_ALIASES[k] if k in _NUMPY_ALIASES and k not in params and _NUMPY_ALIASES[k] not in kwargs
             else k): v for k, v in kwargs.items()}
