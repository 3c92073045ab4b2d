"""Trace-time Python that library code runs around its tensors, evaluated on what capture
knows and guarded by what it read (transformers' ``apply_chunking_to_forward``, configs copied
in ``get_text_config``, ``copy``'s memo keyed by ``id``):

- ``inspect.signature`` of a function, bound method, module, class or builtin: computed at
  trace time from the real callable (whose identity, or code and defaults' layout, the tracer
  already guards); ``Signature``/``Parameter`` objects are immutable, so they are constants
  whose attributes are read for real (``IntrospectVariable``);
- ``id()``: the real id of an object reached from the inputs, with an identity guard on its
  source (any other object of the same call would have another id); a value made during the
  trace gets an id unique within the trace;
- ``copy.copy`` / ``copy.deepcopy`` of constants, containers and plain objects (configs): a new
  tracker without a source (writes to it stay local); a deep copy reads every attribute of the
  original through its source, so each is guarded as any read is.
"""
from __future__ import annotations

import copy
import inspect
import types

from kiln.capture.builtins import handles
from kiln.capture.errors import Unsupported
from kiln.capture.guards import AttrSource, ItemSource
from kiln.capture.dict_keys import refuse_tensor_keys
from kiln.capture.values import (ConstantVariable, DictVariable, ListVariable, MethodVariable,
                                 TensorVariable, TupleVariable)
from kiln.capture.values_callables import (BuiltinVariable, FunctionVariable, ModuleVariable,
                                           PythonModuleVariable, TorchFunctionVariable)

INTROSPECT_TYPES = (inspect.Signature, inspect.Parameter)


class IntrospectVariable(ConstantVariable):
    """An ``inspect.Signature`` or ``inspect.Parameter``: immutable, so a constant whose
    attributes and methods are evaluated for real (``parameters`` is a dict of Parameters)."""

    def getattr(self, tx, name):
        try:
            attr = getattr(self.value, name)
        except AttributeError as e:
            raise Unsupported(str(e)) from None
        if isinstance(attr, types.MappingProxyType):  # Signature.parameters
            return DictVariable({k: tx.wrap_constant(v) for k, v in attr.items()})
        if isinstance(attr, types.MethodType) or type(attr).__name__ == "builtin_function_or_method":
            return MethodVariable(self, name)  # replace(), bind(): evaluated on constants
        return tx.wrap_constant(attr)

    def __repr__(self):
        return f"Introspect({self.value})"


# ---------------------------------------------------------------- inspect.signature
_PLACEHOLDER_SELF = object()  # binds a method for inspect, which never reads its __self__


def real_callable(tx, v):
    """The real callable behind a tracker, for trace-time introspection; the tracker's guards
    (identity, or a made function's code and defaults' layout) make the answer reusable."""
    if isinstance(v, FunctionVariable):
        fn = v.fn if v.fn is not None else _made_function(v)
        if v.fn is not None and v.by_code:
            _guard_defaults(tx, v)
        return fn if v.self_var is None else types.MethodType(fn, _PLACEHOLDER_SELF)
    if isinstance(v, ModuleVariable):
        return v.module
    if isinstance(v, (BuiltinVariable, TorchFunctionVariable)):
        return v.fn
    if isinstance(v, ConstantVariable) and callable(v.value):
        return v.value
    value = getattr(v, "value", None)
    if value is not None and callable(value) and getattr(v, "source", None) is not None:
        return value  # a callable user object: its class is guarded
    raise Unsupported(f"inspecting {v} at trace time is not supported")


def _made_function(v):
    """A function made by MAKE_FUNCTION in the trace, rebuilt for inspect from its code and
    constant defaults (its cells are never read by a signature)."""
    try:
        defaults = tuple(d.as_python() for d in v.defaults) or None
        kwdefaults = {k: d.as_python() for k, d in v.kwdefaults.items()} or None
    except Unsupported:
        raise Unsupported(f"inspecting {v.qualname}, whose defaults are not constants") from None
    cells = tuple(types.CellType() for _ in v.code.co_freevars) or None
    fn = types.FunctionType(v.code, v.globals, v.code.co_name, defaults, cells)
    fn.__kwdefaults__ = kwdefaults
    return fn


def _guard_defaults(tx, v):
    """A function guarded by its code (a lambda made anew per call) keeps its default values
    lazy; a signature shows them, so they are read (and guarded) through their sources."""
    fn, src = v.fn, v.source
    for i, d in enumerate(fn.__defaults__ or ()):
        tx.wrap(d, ItemSource(AttrSource(src, "__defaults__"), i))
    for k, d in (fn.__kwdefaults__ or {}).items():
        tx.wrap(d, ItemSource(AttrSource(src, "__kwdefaults__"), k))


@handles(inspect.signature)
def _signature(tx, obj, *, follow_wrapped=None, **kwargs):
    if kwargs:
        raise Unsupported(f"inspect.signature with {sorted(kwargs)}")
    follow = True if follow_wrapped is None else bool(follow_wrapped.as_python())
    try:
        sig = inspect.signature(real_callable(tx, obj), follow_wrapped=follow)
    except (TypeError, ValueError) as e:
        raise Unsupported(f"inspect.signature raised {e!r}") from None
    return IntrospectVariable(sig)


def _inspect_class(cls):
    def handler(tx, *args, **kwargs):
        try:
            value = cls(*[a.as_python() for a in args], **{k: v.as_python() for k, v in kwargs.items()})
        except (TypeError, ValueError) as e:
            raise Unsupported(f"{cls.__name__}(...) raised {e!r}") from None
        return IntrospectVariable(value)
    return handler


def construct(tx, cls, args, kwargs):
    """``inspect.Parameter(...)`` / ``inspect.Signature(...)`` on constants, or None."""
    if cls in INTROSPECT_TYPES:
        return _inspect_class(cls)(tx, *args, **kwargs)
    return None


# ---------------------------------------------------------------- id()
@handles(id)
def _id(tx, obj):
    real, source = real_object(tx, obj)
    if real is None:
        return ConstantVariable(id(obj))  # made in the trace: unique while the trace lives
    if source is not None:
        tx.guards.identity(source, real)
    return ConstantVariable(id(real))


def real_object(tx, v):
    """(the real object behind tracker v, the source guarding it), or (None, None) for a value
    made during the trace."""
    if isinstance(v, ModuleVariable):
        return v.module, None  # guarded by identity when wrapped
    if isinstance(v, TensorVariable):
        if v.source is None:
            return None, None
        for var, _, t in tx._tensor_inputs.values():
            if var is v:
                return t, v.source
        return None, None
    if isinstance(v, FunctionVariable):
        if v.fn is None or v.self_var is not None:
            return None, None  # a bound method object is new on each access
        return v.fn, (v.source if v.by_code else None)
    if isinstance(v, (BuiltinVariable, TorchFunctionVariable, PythonModuleVariable)):
        return v.as_python(), None
    if isinstance(v, ConstantVariable):
        if isinstance(v.value, (bool, type(None), type)) or v.source is None:
            return v.value, None
        return v.value, v.source
    for real, tracker in tx.side_effects.trackers.values():  # lists, dicts, user objects
        if tracker is v:
            return real, v.source
    value = getattr(v, "value", None)
    if value is not None and getattr(v, "source", None) is not None:
        return value, v.source
    return None, None


# ---------------------------------------------------------------- copy.copy / copy.deepcopy
_COPY_HOOKS = ("__copy__", "__deepcopy__", "__reduce__", "__reduce_ex__", "__getstate__",
               "__setstate__", "__getnewargs__", "__getnewargs_ex__")


def _plain_copyable(cls):
    """A class copied by copy's default path (``__reduce_ex__(4)`` of object: a new object of
    the class and its instance dict); any hook of its own could do something else."""
    import copyreg
    if cls in copyreg.dispatch_table:
        return False
    return not any(name in vars(k) for k in cls.__mro__ if k is not object for name in _COPY_HOOKS)


def _read_all(tx, v, seen):
    """Guard everything a copy of v reads: every instance attribute of a user object (through
    ``__dict__``, as copy reads it, bypassing a class's ``__getattribute__``), every item of a
    container, recursively. Only Python data may be inside: no tensors, modules or state that
    this trace has written (the real object would not show the write)."""
    from kiln.capture.values_python import ObjectVariable
    if id(v) in seen or _is_atomic(v):
        return
    seen.add(id(v))
    if id(v) in tx.side_effects.containers:
        raise Unsupported("copying a container this trace has changed")
    if isinstance(v, (TupleVariable, ListVariable)):
        for x in v.items:
            _read_all(tx, x, seen)
    elif type(v) is DictVariable:
        for x in v.items.values():
            _read_all(tx, x, seen)
    elif type(v) is ObjectVariable and v.value is not None and v.source is not None:
        if not _plain_copyable(v.cls):
            raise Unsupported(f"copy of a {v.cls.__name__} object, whose class customizes copying")
        if id(v.value) in tx.side_effects.attr_writes:
            raise Unsupported(f"copying a {v.cls.__name__} object this trace has written")
        d = AttrSource(v.source, "__dict__")
        tx.guards.add(d, f"list({{}}) == {list(vars(v.value))!r}")
        for k, val in vars(v.value).items():
            _read_all(tx, tx.wrap(val, ItemSource(d, k)), seen)
    elif type(v) is ObjectVariable and getattr(v, "local", False):
        pass  # a copy made earlier in this trace: its state is the real object's
    else:
        raise Unsupported(f"copying {v} inside a compiled region")


def _copy_object(tx, obj, deep, memo):
    """A copy of a user object. One made in the trace copies its tracked attributes; a real one
    (a config) is copied for real at trace time, after guarding what the copy reads, into a
    *trace-local* object: private to this call, read and written for real during the trace
    (its class's ``__getattribute__``/``__setattr__`` run as in eager)."""
    from kiln.capture.values_python import ObjectVariable
    if not _plain_copyable(obj.cls):
        raise Unsupported(f"copy of a {obj.cls.__name__} object, whose class customizes copying")
    if obj.value is None:
        new = memo[id(obj)] = ObjectVariable(obj.cls)
        new.attrs = {k: _deep(tx, v, memo) for k, v in obj.attrs.items()} if deep else dict(obj.attrs)
        return new
    if deep:
        _read_all(tx, obj, set())
    elif obj.source is not None and not getattr(obj, "local", False):
        if id(obj.value) in tx.side_effects.attr_writes:
            raise Unsupported(f"copying a {obj.cls.__name__} object this trace has written")
        d = AttrSource(obj.source, "__dict__")
        tx.guards.add(d, f"list({{}}) == {list(vars(obj.value))!r}")
        for k, val in vars(obj.value).items():  # shared by the copy: read (and guarded) as reads
            tx.wrap(val, ItemSource(d, k))
    elif not getattr(obj, "local", False):
        raise Unsupported(f"copying a {obj.cls.__name__} object reached without a source")
    try:
        real = copy.deepcopy(obj.value) if deep else copy.copy(obj.value)
    except Exception as e:  # noqa: BLE001
        raise Unsupported(f"copy of a {obj.cls.__name__} object raised {e!r}") from None
    new = ObjectVariable(obj.cls, real)
    new.local = True
    memo[id(obj)] = new
    return tx.side_effects.remember(real, new)


def _is_atomic(v):
    return isinstance(v, (ConstantVariable, BuiltinVariable, TorchFunctionVariable,
                          PythonModuleVariable)) or \
        (isinstance(v, FunctionVariable) and v.self_var is None)


def _deep(tx, v, memo):
    from kiln.capture.values_python import NamedTupleVariable, ObjectVariable, SetVariable
    if id(v) in memo:
        return memo[id(v)]
    if _is_atomic(v):
        return v
    if isinstance(v, NamedTupleVariable):
        out = NamedTupleVariable(v.cls, [_deep(tx, x, memo) for x in v.items])
    elif type(v) is TupleVariable:
        out = TupleVariable([_deep(tx, x, memo) for x in v.items])
    elif type(v) is ListVariable:
        out = memo[id(v)] = ListVariable([])
        out.items = [_deep(tx, x, memo) for x in v.items]
    elif type(v) is DictVariable:
        refuse_tensor_keys(v.items, "copy.deepcopy of")  # its keys would be copied too
        out = memo[id(v)] = DictVariable({})
        out.items = {k: _deep(tx, x, memo) for k, x in v.items.items()}
    elif type(v) is SetVariable:
        out = SetVariable(list(v.items))
    elif type(v) is ObjectVariable:
        return _copy_object(tx, v, True, memo)
    elif isinstance(v, TensorVariable):
        raise Unsupported("copy.deepcopy of a tensor inside a compiled region")
    else:
        raise Unsupported(f"copy.deepcopy of {v}")
    memo[id(v)] = out
    return out


@handles(copy.deepcopy)
def _deepcopy(tx, obj, memo=None):
    if memo is not None and not (isinstance(memo, ConstantVariable) and memo.value is None):
        raise Unsupported("copy.deepcopy with a memo dict")
    return _deep(tx, obj, {})


@handles(copy.copy)
def _copy(tx, obj):
    from kiln.capture.values_python import ObjectVariable, SetVariable
    if _is_atomic(obj) or type(obj) is TupleVariable:
        return obj
    if type(obj) is ListVariable:
        return ListVariable(list(obj.items))
    if type(obj) is DictVariable:
        return DictVariable(dict(obj.items))
    if type(obj) is SetVariable:
        return SetVariable(list(obj.items))
    if type(obj) is ObjectVariable:
        return _copy_object(tx, obj, False, {})
    raise Unsupported(f"copy.copy of {obj}")


@handles(setattr)
def _setattr(tx, obj, name, value):
    from kiln.capture.interpreter import store_attribute
    key = name.as_python()
    if not isinstance(key, str):
        raise Unsupported("setattr with a name that is not a str")
    store_attribute(tx, obj, key, value)
    return ConstantVariable(None)


@handles(delattr)
def _delattr(tx, obj, name):
    """``delattr`` on an object made in the trace or a trace-local copy (anything else would
    have to be replayed on state outside the call)."""
    from kiln.capture.values_python import ObjectVariable, local_delattr
    key = name.as_python()
    if type(obj) is ObjectVariable and obj.local:
        local_delattr(obj, key)
    elif type(obj) is ObjectVariable and obj.value is None and key in obj.attrs:
        del obj.attrs[key]
    else:
        raise Unsupported(f"delattr on {obj} is not supported")
    return ConstantVariable(None)


__all__ = ["IntrospectVariable", "INTROSPECT_TYPES", "construct", "real_callable", "real_object"]
