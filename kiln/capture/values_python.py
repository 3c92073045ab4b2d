"""Value trackers for plain Python objects and classes (values.py has the core ones).

- ``ObjectVariable``: an instance of a user class, either a real object reached from the inputs
  (with a source; attribute reads are guarded) or one created during the trace (``Box()``, a
  dataclass). Attribute writes go through the tracer's ``SideEffects`` (side_effects.py).
- ``NamedTupleVariable``: a namedtuple instance (a tuple with a class), or a structseq such as
  ``torch.return_types.max`` (what ``torch.max(x, 0)`` returns).
- ``SetVariable``: a set of Python constants.
- ``SuperVariable``: ``super()`` / ``super(cls, obj)``, resolving along the MRO.
- ``PartialVariable``: ``functools.partial(fn, ...)``.
- ``GradModeVariable`` / ``ContextExitVariable``: ``with torch.no_grad()`` and friends.

``call_class`` is what calling a class does during capture; ``attribute_of_class`` resolves a
name on a class the way attribute lookup does (properties, static and class methods, bound
functions).
"""
from __future__ import annotations

import abc
import collections.abc
import contextlib
import dataclasses
import functools
import inspect
import types

import torch

from kiln.capture.torch_modules import is_torch_module
from kiln.capture import autograd_function, controls, numpy_constants, torch_optim
from kiln.capture.profiler_ranges import RANGE_CLASSES, make_range
from kiln.capture.values_set import SetVariable  # noqa: F401 (re-exported: sets live there)
from kiln.capture.dict_object import dict_method
from kiln.capture.errors import Unsupported
from kiln.capture.values import (ConstantVariable, DictVariable, MethodVariable, TensorVariable,
                                 TupleVariable, Variable, _Sequence)
from kiln.capture.values_callables import FunctionVariable, ModuleVariable
from kiln.capture.values_introspect import construct
from kiln.capture.values_defaultdict import make_defaultdict
from kiln.capture.torch_api_creation import FUNCTIONS as creation, LEGACY_TYPES

_MISSING = object()


def _static_lookup(cls, name):
    """``name`` in the class dicts along ``cls``'s MRO (no descriptor is invoked)."""
    for klass in cls.__mro__:
        if name in vars(klass):
            return vars(klass)[name], klass
    return _MISSING, None


def attribute_of_class(tx, cls, name, self_var, source):
    """Resolve ``obj.name`` (``self_var`` not None) or ``cls.name`` through class descriptors.

    Returns a Variable, or None when the name is not a class attribute."""
    value, owner = _static_lookup(cls, name)
    if value is _MISSING:
        return None
    if isinstance(value, property):
        if self_var is None:
            return tx.wrap(value, None)
        if value.fget is None:
            raise Unsupported(f"property {cls.__name__}.{name} has no getter")
        return FunctionVariable(value.fget).call(tx, [self_var], {})
    if isinstance(value, staticmethod):
        return tx.wrap(value.__func__, None)
    if isinstance(value, classmethod):
        if value.__func__ is autograd_function.APPLY and self_var is None:  # MyFunction.apply
            return autograd_function.FunctionApplyVariable(cls, source, tx)
        return _bind(tx, value.__func__, ConstantVariable(cls))
    if isinstance(value, types.FunctionType):
        if self_var is None:
            src = tx.attr_source(source, name) if source is not None else None
            return FunctionVariable(value, source=src)
        return _bind(tx, value, self_var)
    # a class attribute reached without a source (through an object made during the trace)
    # is read unguarded, like a constant of the class's code
    return tx.wrap(value, tx.attr_source(source, name) if source is not None else None)


def _custom_getattribute(cls) -> bool:
    found, owner = _static_lookup(cls, "__getattribute__")
    return owner is not object and isinstance(found, types.FunctionType)


def _mapping_get(tx, obj, key, default=None):
    keys = [k.as_python() for k in obj.iterate(tx)]
    if key.as_python() in keys:
        return obj.getitem(tx, key)
    return default if default is not None else ConstantVariable(None)


def _mapping_contains(tx, obj, key):
    return ConstantVariable(key.as_python() in [k.as_python() for k in obj.iterate(tx)])


# collections.abc mixins that catch KeyError (capture does not model exceptions), in terms of
# the class's own __iter__ and __getitem__: a Mapping's keys are what iterating it yields
MAPPING_MIXINS = {collections.abc.Mapping.get: _mapping_get,
                  collections.abc.Mapping.__contains__: _mapping_contains}


class _MixinCall(Variable):
    def __init__(self, rule, obj):
        self.rule, self.obj = rule, obj

    def call(self, tx, args, kwargs):
        return self.rule(tx, self.obj, *args, **kwargs)


def _bind(tx, fn, self_var):
    rule = MAPPING_MIXINS.get(fn)
    if rule is not None and isinstance(self_var, ObjectVariable):
        return _MixinCall(rule, self_var)
    if torch_optim.is_inlined_optim_code(fn):  # an optimizer's own methods (torch_optim.py)
        return torch_optim.optim_call(tx, fn, None, self_var)
    if controls.is_disabled(fn):  # one break at the call (``opt.zero_grad()``), not at the read
        return FunctionVariable(fn, self_var=self_var)
    if is_torch_module(fn.__module__):
        raise Unsupported(f"calling torch's method {fn.__qualname__} on a user object")
    return FunctionVariable(fn, self_var=self_var)


# ====================================================================== objects
class ObjectVariable(Variable):
    """An instance of a user class. ``value`` is the real object (None for one created during
    the trace); ``attrs`` holds the attributes of a created object."""

    # A trace-local object (values_introspect: a copy of a config made in the trace) is a real
    # object private to this call: read and written for real, with no source and no guard.
    local = False

    def __init__(self, cls, value=None, source=None, attrs=None):
        self.cls = cls
        self.value = value
        self.source = source
        self.attrs: dict = dict(attrs or {})

    def python_type(self):
        return self.cls

    def truth(self, tx):
        for name in ("__bool__", "__len__"):  # Python's order; Python methods are inlined
            found = _static_lookup(self.cls, name)[0]
            if found is not _MISSING:
                method = dict_method(tx, self, name, found)
                out = (method.call(tx, [], {}) if method is not None else self._call(tx, name, [])).as_python()
                if not isinstance(out, (bool, int)):
                    raise Unsupported(f"truth value of a {self.cls.__name__} object")
                return bool(out)
        return True

    def getitem(self, tx, key):
        """``obj[key]`` through the class's Python ``__getitem__``."""
        return self._call(tx, "__getitem__", [key])

    def getattr(self, tx, name):
        written = tx.side_effects.load_attr(self, name)
        if written is not None:
            return written
        value, _ = _static_lookup(self.cls, name)
        if self.local:
            return local_getattr(tx, self, name)
        real = self.value is not None and self.source is not None
        if real and _custom_getattribute(self.cls) and not isinstance(
                value, (types.FunctionType, property, staticmethod, classmethod)):
            return self._read_for_real(tx, name)  # e.g. transformers' config attribute_map
        data_descriptor = value is not _MISSING and hasattr(type(value), "__set__")
        if not data_descriptor:
            if self.value is None and name in self.attrs:
                return self.attrs[name]
            if self.value is not None and name in getattr(self.value, "__dict__", {}):
                return tx.wrap(self.value.__dict__[name], tx.attr_source(self.source, name))
        if name == "__class__":
            return ConstantVariable(self.cls)
        if name == "__dict__" and self.value is None:
            return DictVariable(self.attrs)
        method = dict_method(tx, self, name, value)  # a ModelOutput's own keys() and friends
        if method is not None:
            return method
        out = attribute_of_class(tx, self.cls, name, self, self.source)
        if out is None and real and isinstance(_static_lookup(self.cls, "__getattr__")[0], types.FunctionType):
            return self._read_for_real(tx, name)
        if out is None:
            raise Unsupported(f"{self.cls.__name__} object has no attribute {name!r}")
        return out

    def _read_for_real(self, tx, name):
        """A class that computes its attributes (``__getattribute__``/``__getattr__`` in Python):
        the attribute is read from the real object and guarded through its source, which the
        guard reads again the same way on every call."""
        try:
            got = getattr(self.value, name)
        except AttributeError:
            raise Unsupported(f"{self.cls.__name__} object has no attribute {name!r}") from None
        return tx.wrap(got, tx.attr_source(self.source, name))

    def iterate(self, tx):
        """Iteration over a user sequence: ``collections.abc.Sequence``'s ``__iter__`` (which
        reads ``self[i]`` until IndexError) is ``self[i] for i in range(len(self))``, with the
        class's ``__len__``/``__getitem__`` inlined; a Python ``__iter__`` is called (a generator
        runs to its end)."""
        it, _ = _static_lookup(self.cls, "__iter__")
        if dict_method(tx, self, "__iter__", it) is not None:
            return dict_method(tx, self, "__iter__", it).call(tx, [], {}).iterate(tx)
        if it is collections.abc.Sequence.__iter__:
            n = self._call(tx, "__len__", []).as_python()
            if not isinstance(n, int):
                raise Unsupported(f"len() of a {self.cls.__name__} is not an int")
            return [self._call(tx, "__getitem__", [ConstantVariable(i)]) for i in range(n)]
        if isinstance(it, types.FunctionType) and not is_torch_module(it.__module__):
            return _bind(tx, it, self).call(tx, [], {}).iterate(tx)
        raise Unsupported(f"iterating over {self} is not supported")

    def contains(self, tx, item) -> bool:
        """``item in obj``: the class's ``__contains__`` (inlined, or a Mapping mixin's rule),
        else membership in what iterating it yields."""
        fn, _ = _static_lookup(self.cls, "__contains__")
        out = _bind(tx, fn, self).call(tx, [item], {}) if isinstance(fn, types.FunctionType) \
            else ConstantVariable(item.as_python() in [k.as_python() for k in self.iterate(tx)])
        value = out.as_python()
        if not isinstance(value, bool):
            raise Unsupported(f"`in` on a {self.cls.__name__} gave {type(value).__name__}")
        return value

    def python_len(self, tx):
        """``len(obj)`` through the class's Python ``__len__``."""
        method = dict_method(tx, self, "__len__", _static_lookup(self.cls, "__len__")[0])
        return method.call(tx, [], {}) if method is not None else self._call(tx, "__len__", [])

    def call(self, tx, args, kwargs):
        """``obj(...)`` through the class's Python ``__call__`` (a callable object as a hook).
        kiln's own objects (a ``kiln.compile``-d function) are not inlined."""
        fn, _ = _static_lookup(self.cls, "__call__")
        if numpy_constants.is_ufunc(self.value):
            return numpy_constants.call_ufunc(tx, self, args, kwargs)
        if not isinstance(fn, types.FunctionType) or (self.cls.__module__ or "").startswith("kiln."):
            raise Unsupported(f"calling {self} is not supported")
        return _bind(tx, fn, self).call(tx, args, kwargs)

    def _call(self, tx, name, args):
        fn, _ = _static_lookup(self.cls, name)
        if not isinstance(fn, types.FunctionType):
            raise Unsupported(f"{self.cls.__name__}.{name} is not a Python function")
        return _bind(tx, fn, self).call(tx, args, {})

    def enter(self, tx):
        """BEFORE_WITH on a user context manager (interpreter.py): ``__enter__`` is inlined now,
        the exit left on the stack is the bound ``__exit__`` (called with three Nones on the
        normal path; the exceptional path is never traced)."""
        enter_fn, _ = _static_lookup(self.cls, "__enter__")
        exit_fn, _ = _static_lookup(self.cls, "__exit__")
        if not isinstance(enter_fn, types.FunctionType) or not isinstance(exit_fn, types.FunctionType) \
                or issubclass(self.cls, contextlib._GeneratorContextManagerBase):
            raise Unsupported(f"`with` on a {self.cls.__name__} object is not supported")
        value = _bind(tx, enter_fn, self).call(tx, [], {})
        return _bind(tx, exit_fn, self), value

    def setattr(self, tx, name, value):
        if self.local:
            local_setattr(self, name, value)
        elif self.value is None:
            self.attrs[name] = value
        else:
            tx.side_effects.store_attr(self, name, value)

    def __repr__(self):
        return f"Object({self.cls.__name__}{' at ' + str(self.source) if self.source else ''})"


def local_getattr(tx, obj, name):
    """An attribute of a trace-local object, read for real (its class's ``__getattribute__``
    runs); what it holds belongs to the same private copy, so objects in it are local too."""
    if name == "__dict__":
        return DictVariable({k: _local(tx.wrap(v, None)) for k, v in vars(obj.value).items()})
    value, _ = _static_lookup(obj.cls, name)
    if isinstance(value, (types.FunctionType, property, staticmethod, classmethod)):
        out = attribute_of_class(tx, obj.cls, name, obj, None)
        if out is not None:
            return out
    try:
        got = getattr(obj.value, name)
    except AttributeError:
        raise Unsupported(f"{obj.cls.__name__} object has no attribute {name!r}") from None
    if isinstance(got, types.MethodType) and got.__self__ is obj.value:
        return _bind(tx, got.__func__, obj)
    return _local(tx.wrap(got, None))


def _local(v):
    if type(v) is ObjectVariable and v.value is not None and v.source is None:
        v.local = True
    return v


def local_setattr(obj, name, value):
    """A write to a trace-local object, done for real (its class's ``__setattr__`` runs)."""
    if type(value) is ObjectVariable and value.local:
        real = value.value
    else:
        try:
            real = value.as_python()
        except Unsupported:
            raise Unsupported(f"storing {value} on a trace-local {obj.cls.__name__} object") from None
    try:
        setattr(obj.value, name, real)
    except Exception as e:  # noqa: BLE001
        raise Unsupported(f"setting {name!r} on a {obj.cls.__name__} raised {e!r}") from None


def local_delattr(obj, name):
    try:
        delattr(obj.value, name)
    except Exception as e:  # noqa: BLE001
        raise Unsupported(f"deleting {name!r} of a {obj.cls.__name__} raised {e!r}") from None


def is_structseq(cls) -> bool:
    """A C-level named tuple (``torch.return_types.max``, ``os.stat_result``): a tuple subclass
    made by ``PyStructSequence``, built from one sequence argument."""
    return (isinstance(cls, type) and issubclass(cls, tuple) and not hasattr(cls, "_fields")
            and isinstance(getattr(cls, "n_sequence_fields", None), int)
            and getattr(cls, "n_fields", None) == cls.n_sequence_fields
            and not getattr(cls, "n_unnamed_fields", 0)
            and isinstance(getattr(cls, "__match_args__", None), tuple))


def tuple_fields(cls) -> tuple:
    """The field names of a namedtuple class or a structseq class."""
    return tuple(cls._fields) if hasattr(cls, "_fields") else tuple(cls.__match_args__)


def make_named_tuple(cls, items):
    """An instance of a namedtuple or structseq class holding ``items``."""
    return cls(tuple(items)) if is_structseq(cls) else cls(*items)


class NamedTupleVariable(_Sequence):
    kind = tuple

    def __init__(self, cls, items, source=None):
        super().__init__(items, source)
        self.cls = cls

    def python_type(self):
        return self.cls

    def as_python(self):
        return make_named_tuple(self.cls, [v.as_python() for v in self.items])

    def getattr(self, tx, name):
        fields = tuple_fields(self.cls)
        if name in fields:
            return self.items[fields.index(name)]
        if name == "_fields" and hasattr(self.cls, "_fields"):
            return ConstantVariable(fields)
        if name == "_replace" and hasattr(self.cls, "_fields"):
            return _NamedTupleReplace(self)
        out = attribute_of_class(tx, self.cls, name, self, None)
        if out is None:
            return super().getattr(tx, name)
        return out

    def getitem(self, tx, key):
        out = super().getitem(tx, key)
        return TupleVariable(out.items) if isinstance(out, NamedTupleVariable) else out

    def __repr__(self):
        return f"{self.cls.__name__}({self.items!r})"


class _NamedTupleReplace(Variable):
    def __init__(self, nt):
        self.nt = nt

    def call(self, tx, args, kwargs):
        items = list(self.nt.items)
        for k, v in kwargs.items():
            items[self.nt.cls._fields.index(k)] = v
        return NamedTupleVariable(self.nt.cls, items)


# ====================================================================== super, partial
class SuperVariable(Variable):
    def __init__(self, cls, obj):
        self.cls = cls    # the class after which the MRO search starts
        self.obj = obj    # the Variable of the instance

    def getattr(self, tx, name):
        mro = self.obj.python_type().__mro__
        start = mro.index(self.cls) + 1
        for klass in mro[start:]:
            # a dict (or OrderedDict) subclass's super(): OrderedDict's C methods keep dict's
            # items, in the same order while nothing moves a key (move_to_end is a break)
            if klass in (dict, collections.OrderedDict) and isinstance(self.obj, DictVariable):
                if name in ("__getitem__", "__setitem__", "__delitem__", "__contains__", "__len__"):
                    from kiln.capture.values_dict import DictDunder
                    return DictDunder(self.obj, name)
                return DictVariable.getattr(self.obj, tx, name)
            if name in vars(klass):
                value = vars(klass)[name]
                method = dict_method(tx, self.obj, name, value) if isinstance(self.obj, ObjectVariable) else None
                if method is not None:  # ``super().get`` in a ModelOutput's own get
                    return method
                if isinstance(value, types.FunctionType):
                    if klass is not object and getattr(self.obj, "local", False):
                        from kiln.capture.module_new import RealMethodVariable, runs_for_real
                        if runs_for_real(name, value):
                            return RealMethodVariable(self.obj, value)  # super().__init__(): for real
                    if is_torch_module(value.__module__) and klass is not object and name == "__init__":
                        return _NoOp()
                    if value in MAPPING_MIXINS and isinstance(self.obj, ObjectVariable):
                        return _MixinCall(MAPPING_MIXINS[value], self.obj)
                    return FunctionVariable(value, self_var=self.obj)
                if isinstance(value, (property, staticmethod, classmethod)):
                    return attribute_of_class(tx, klass, name, self.obj, None)
                if klass is object and name == "__init__":
                    return _NoOp()
                return tx.wrap(value, None)
        raise Unsupported(f"super() has no attribute {name!r}")

    def __repr__(self):
        return f"Super({self.cls.__name__})"


class _NoOp(Variable):
    def call(self, tx, args, kwargs):
        return ConstantVariable(None)


class PartialVariable(Variable):
    def __init__(self, fn, args, kwargs):
        self.fn, self.args, self.kwargs = fn, list(args), dict(kwargs)

    def truth(self, tx):
        return True

    def call(self, tx, args, kwargs):
        return self.fn.call(tx, self.args + list(args), {**self.kwargs, **kwargs})


# ====================================================================== grad mode
class GradModeVariable(Variable):
    """``torch.no_grad()``, ``torch.enable_grad()``, ``torch.set_grad_enabled(b)``: entering
    sets the tracer's grad mode (ops inside a disabled region record detached results)."""

    def __init__(self, enabled):
        self.enabled = enabled

    def python_type(self):
        return torch.no_grad if not self.enabled else torch.enable_grad

    def enter(self, tx):
        """BEFORE_WITH's protocol (interpreter.py): (the exit callable, what __enter__ returns)."""
        prev = tx.grad_enabled
        tx.grad_enabled = self.enabled
        return ContextExitVariable(lambda: setattr(tx, "grad_enabled", prev)), ConstantVariable(None)

    def getattr(self, tx, name):
        if name == "__enter__":
            return _Call(lambda: ConstantVariable(None))
        raise Unsupported(f"attribute {name!r} of a grad-mode context")

    def as_python(self):
        return torch.no_grad() if not self.enabled else torch.enable_grad()

    def call(self, tx, args, kwargs):
        """``@torch.no_grad()`` on a function defined in the frame: a function that runs under
        that grad mode (torch's ``_DecoratorContextManager.__call__``)."""
        if len(args) != 1 or kwargs or not isinstance(args[0], FunctionVariable):
            raise Unsupported("a grad-mode context called with other than one function")
        code = args[0].code
        if code is None or code.co_flags & (inspect.CO_GENERATOR | inspect.CO_ASYNC_GENERATOR
                                            | inspect.CO_COROUTINE):
            raise Unsupported("a grad-mode decorator on a generator or coroutine function")
        return GradModeFunctionVariable(args[0], self)


class _Call(Variable):
    def __init__(self, fn):
        self.fn = fn

    def call(self, tx, args, kwargs):
        return self.fn()


class ContextExitVariable(Variable):
    """What BEFORE_WITH leaves on the stack: calling it (the normal exit) restores the state."""

    def __init__(self, restore):
        self.restore = restore

    def call(self, tx, args, kwargs):
        self.restore()
        return ConstantVariable(None)


_GRAD_CONTEXTS = {torch.no_grad: False, torch.enable_grad: True}


# ====================================================================== calling classes
_PURE_CONSTRUCTORS = (torch.device, torch.finfo, torch.iinfo, torch.Size)


def call_class(tx, cls, args, kwargs):
    """What ``cls(*args, **kwargs)`` does during capture."""
    if cls in _GRAD_CONTEXTS:
        if args or kwargs:
            raise Unsupported(f"{cls.__name__} with arguments")
        return GradModeVariable(_GRAD_CONTEXTS[cls])
    if cls is torch.set_grad_enabled:
        return GradModeVariable(bool(args[0].as_python()))
    if cls in RANGE_CLASSES:  # torch.profiler.record_function: a no-op in compiled code
        return make_range(tx, cls, args, kwargs)
    if cls is collections.OrderedDict:
        from kiln.capture.values_dict import make_ordered_dict
        return make_ordered_dict(tx, args, kwargs)
    if cls is collections.defaultdict:
        return make_defaultdict(tx, args, kwargs)
    made = construct(tx, cls, args, kwargs)  # inspect.Parameter / Signature on constants
    if made is not None:
        return made
    if cls in _PURE_CONSTRUCTORS:
        py_args = [a.as_python() for a in args]
        py_kwargs = {k: v.as_python() for k, v in kwargs.items()}
        try:
            return ConstantVariable(cls(*py_args, **py_kwargs))
        except Exception as e:  # noqa: BLE001
            raise Unsupported(f"{cls.__name__}(...) raised {e!r}") from None
    if cls is functools.partial:
        if not args:
            raise Unsupported("functools.partial without a function")
        return PartialVariable(args[0], args[1:], kwargs)
    if issubclass(cls, tuple) and hasattr(cls, "_fields"):
        return _make_namedtuple(tx, cls, args, kwargs)
    if issubclass(cls, dict) and dataclasses.is_dataclass(cls):
        return make_dict_dataclass(tx, cls, args, kwargs)
    if issubclass(cls, dict):
        from kiln.capture.values_dict import can_make_dict_subclass, make_dict_subclass
        if can_make_dict_subclass(cls):
            return make_dict_subclass(tx, cls, args, kwargs)
    if cls in LEGACY_TYPES:  # torch.LongTensor([294]): a capture-table entry, as torch.tensor
        return tx.call_adapter(creation[cls], args, kwargs, f"torch.{cls.__name__}")
    if issubclass(cls, torch.nn.Module):  # built at trace time, private to the call
        from kiln.capture.module_new import construct_module
        return construct_module(tx, cls, args, kwargs)
    if is_torch_module(cls.__module__) or not plain_metaclass(type(cls)) or \
            cls.__new__ is not object.__new__ or cls.__dict__.get("__slots__") is not None:
        raise Unsupported(f"creating a {cls.__qualname__} object is not supported")
    obj = ObjectVariable(cls)
    init, _ = _static_lookup(cls, "__init__")
    if isinstance(init, types.FunctionType):
        FunctionVariable(init, self_var=obj).call(tx, list(args), dict(kwargs))
    elif args or kwargs:
        raise Unsupported(f"{cls.__qualname__}() takes no arguments")
    return obj


def _make_namedtuple(tx, cls, args, kwargs):
    params = list(inspect.signature(cls).parameters.values())
    items = list(args)
    if len(items) > len(params):
        raise Unsupported(f"{cls.__name__}() takes {len(params)} arguments")
    for p in params[len(items):]:
        if p.name in kwargs:
            items.append(kwargs.pop(p.name))
        elif p.default is not inspect.Parameter.empty:
            items.append(tx.wrap(p.default, None))
        else:
            raise Unsupported(f"{cls.__name__}() missing argument {p.name!r}")
    if kwargs:
        raise Unsupported(f"{cls.__name__}() got unexpected arguments {sorted(kwargs)}")
    return NamedTupleVariable(cls, items)


def dataclass_replace(tx, obj, kwargs):
    """``dataclasses.replace(obj, **changes)`` for a dataclass made during the trace."""
    if not isinstance(obj, ObjectVariable) or not dataclasses.is_dataclass(obj.cls):
        raise Unsupported("dataclasses.replace of a non-dataclass value")
    fields = {f.name: obj.getattr(tx, f.name) for f in dataclasses.fields(obj.cls) if f.init}
    fields.update(kwargs)
    return call_class(tx, obj.cls, [], fields)


__all__ = ["is_structseq", "tuple_fields", "make_named_tuple", "ObjectVariable",
           "plain_metaclass",
           "NamedTupleVariable", "SetVariable", "SuperVariable",
           "PartialVariable", "GradModeVariable", "ContextExitVariable", "call_class",
           "wrap_grad_mode_value",
           "attribute_of_class", "dataclass_replace"]


# ====================================================================== hooks used by values.py
_META_BEHAVIOUR = ("__getattribute__", "__getattr__", "__call__", "__instancecheck__",
                   "__subclasscheck__", "__getitem__", "__iter__", "__len__", "__contains__",
                   "__eq__", "__hash__", "__bool__")


def plain_metaclass(meta) -> bool:
    """``type``, ``abc.ABCMeta``, or a metaclass that changes none of how a class is looked up,
    called or compared (transformers' ``_BCCacheNameMeta`` only renames ``__init__`` arguments)."""
    if meta in (type, abc.ABCMeta):
        return True
    if not isinstance(meta, type) or not issubclass(meta, type):
        return False
    return not any(name in vars(k) for k in meta.__mro__ if k not in (type, abc.ABCMeta, object)
                   for name in _META_BEHAVIOUR)


def is_user_object(value) -> bool:
    """A plain instance of a user-defined class (attributes modeled by ObjectVariable)."""
    cls = type(value)
    if not plain_metaclass(type(cls)) or isinstance(value, (torch.nn.Module, torch.Tensor, type)):
        return False
    if torch_optim.is_optimizer(value):  # its class is torch's, its state plain Python
        return True
    module = (cls.__module__ or "").split(".")[0]
    if module in ("builtins", "torch", "types", "functools", "typing", "collections", "math"):
        return False
    if isinstance(value, (types.FunctionType, types.MethodType, tuple, list, set)):
        return False
    if isinstance(value, dict) and not dataclasses.is_dataclass(value):
        return False  # a dict dataclass (transformers' ModelOutput) is read by its attributes
    # slots hold state ObjectVariable does not model (empty __slots__ of ABC mixins are fine)
    return hasattr(value, "__dict__") and not any(vars(k).get("__slots__") for k in cls.__mro__)


def user_class_attribute(tx, module_var, name):
    """``module.name`` when a user class (not torch's) defines ``name`` as a property, static or
    class method or a function; None for everything else (instance attributes, parameters,
    submodules, and torch's own methods, which the caller resolves)."""
    cls = type(module_var.module)
    value, owner = _static_lookup(cls, name)
    if value is _MISSING or is_torch_module(owner.__module__):
        return None
    if name in module_var.module.__dict__ and not hasattr(type(value), "__set__"):
        return None
    if isinstance(value, (property, staticmethod, classmethod)):
        return attribute_of_class(tx, cls, name, module_var, module_var.source)
    return None


class GradModeFunctionVariable(Variable):
    """A function decorated with ``@torch.no_grad()`` (or enable_grad): the wrapped function is
    inlined with the tracer's grad mode set."""

    def __init__(self, wrapped, mode):
        self.wrapped, self.mode = wrapped, mode

    def truth(self, tx):
        return True

    def call(self, tx, args, kwargs):
        exit_, _ = self.mode.enter(tx)
        try:
            return self.wrapped.call(tx, args, kwargs)
        finally:
            exit_.call(tx, [], {})


def _grad_mode_of(obj):
    """The mode a no_grad / enable_grad / set_grad_enabled object sets, else None."""
    if type(obj) in _GRAD_CONTEXTS:
        return _GRAD_CONTEXTS[type(obj)]
    if type(obj) is torch.set_grad_enabled:
        return bool(obj.mode)
    return None


def wrap_grad_mode_value(tx, value, source, guard):
    """A grad-mode context object, or its bound ``clone``, reached as a value: torch's
    ``@torch.no_grad()`` wraps a function with ``context_decorator(self.clone, func)`` whose
    body runs ``with ctx_factory():`` (inlined when the decorated function is reached as a
    module's forward or a method, not through ``grad_mode_decorated``). None if not one."""
    is_clone = isinstance(value, types.MethodType) and value.__name__ == "clone"
    obj = value.__self__ if is_clone else value
    enabled = _grad_mode_of(obj)
    if enabled is None or (is_clone and value.__func__ is not type(obj).clone):
        return None
    if guard and source is not None:  # the same kind of object with the same mode
        obj_source = tx.attr_source(source, "__self__") if is_clone else source
        tx.guards.add(obj_source, f"id(type({{}})) == {id(type(obj))}"
                      + (f" and {{}}.mode == {enabled}" if type(obj) is torch.set_grad_enabled else ""))
    if is_clone:  # clone() makes a fresh context of the same kind and mode
        return _Call(lambda: GradModeVariable(enabled))
    return GradModeVariable(enabled)


def grad_mode_decorated(tx, fn, source):
    cells = dict(zip(fn.__code__.co_freevars, fn.__closure__ or ()))
    factory = cells.get("ctx_factory")
    try:
        ctx = factory.cell_contents() if factory is not None else None
    except Exception:  # noqa: BLE001
        ctx = None
    modes = {torch.no_grad: False, torch.enable_grad: True}
    if type(ctx) not in modes and not isinstance(ctx, torch.set_grad_enabled):
        raise Unsupported(f"call to {fn.__qualname__}, a function decorated with a torch "
                          "context manager other than no_grad / enable_grad")
    enabled = modes[type(ctx)] if type(ctx) in modes else ctx.mode
    wrapped = tx.wrap(fn.__wrapped__, tx.attr_source(source, "__wrapped__"))
    return GradModeFunctionVariable(wrapped, GradModeVariable(enabled))


# ====================================================================== dict dataclasses
class DictDataclassVariable(Variable):
    """An instance of a dataclass that is also a dict (transformers' ``ModelOutput``): fields in
    declaration order; the non-None ones are its keys, and ``out[i]`` indexes their tuple."""

    def __init__(self, cls, values: dict):
        self.cls = cls
        self.values = values  # field name -> Variable

    def python_type(self):
        return self.cls

    def truth(self, tx):
        return bool(self.keys())

    def keys(self):
        return [k for k, v in self.values.items()
                if not (isinstance(v, ConstantVariable) and v.value is None)]

    def to_tuple(self):
        return TupleVariable([self.values[k] for k in self.keys()])

    def iterate(self, tx):
        return [ConstantVariable(k) for k in self.keys()]

    def getitem(self, tx, key):
        k = key.as_python()
        if isinstance(k, str):
            if k not in self.keys():
                raise Unsupported(f"{self.cls.__name__} has no key {k!r}")
            return self.values[k]
        return self.to_tuple().getitem(tx, key)

    def getattr(self, tx, name):
        if name in self.values:
            return self.values[name]
        if name == "to_tuple":
            return _Call(self.to_tuple)
        if name == "keys":
            return _Call(lambda: TupleVariable(self.iterate(tx)))
        if name == "values":
            return _Call(self.to_tuple)
        if name == "items":
            return _Call(lambda: TupleVariable([TupleVariable([ConstantVariable(k), self.values[k]])
                                                for k in self.keys()]))
        if name == "get":
            return _Get(self)
        raise Unsupported(f"attribute {name!r} of a {self.cls.__name__} is not supported")

    def setattr(self, tx, name, value):
        self.values[name] = value

    def setitem(self, key, value):
        self.values[key] = value

    def __repr__(self):
        return f"{self.cls.__name__}({list(self.keys())})"


class _Get(Variable):
    def __init__(self, obj):
        self.obj = obj

    def call(self, tx, args, kwargs):
        key = args[0].as_python()
        if key in self.obj.keys():
            return self.obj.values[key]
        return args[1] if len(args) > 1 else ConstantVariable(None)


def make_dict_dataclass(tx, cls, args, kwargs):
    fields = [f.name for f in dataclasses.fields(cls)]
    if len(args) > len(fields):
        raise Unsupported(f"{cls.__name__}() with {len(args)} positional arguments")
    values = {}
    for f in dataclasses.fields(cls):
        default = None
        if f.default is not dataclasses.MISSING:
            default = f.default
        if not is_plain_default(default):
            raise Unsupported(f"{cls.__name__}.{f.name} has a default capture cannot copy")
        values[f.name] = ConstantVariable(default)
    values.update(zip(fields, args))
    unknown = set(kwargs) - set(fields)
    if unknown:
        raise Unsupported(f"{cls.__name__}() got unexpected fields {sorted(unknown)}")
    values.update(kwargs)
    return DictDataclassVariable(cls, values)


def is_plain_default(v) -> bool:
    return v is None or isinstance(v, (bool, int, float, str))
