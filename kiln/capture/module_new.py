"""An ``nn.Module`` made inside a traced frame: ``loss_fct = CrossEntropyLoss()`` in the forward
of transformers' heads, ``nn.Dropout(p)`` or ``nn.Sequential(...)`` built per call.

The module is built at trace time, for real, into a *trace-local* object: private to this
call, with no source, read and written for real (``nn.Module.__getattr__``/``__setattr__`` run
as in eager). Its forward is then traced like any module call (module_call.py), reading its
attributes as constants: they were computed from the constructor's arguments, which are
Python values the trace read (and guarded) where it read them.

How it is built:

- a class whose ``__init__`` is torch's own (every ``torch.nn`` module, and a user subclass
  without an ``__init__`` of its own): called for real with the arguments' Python values;
  torch's constructors only set up the new object;
- a class with a Python ``__init__`` of its own: the object is made by ``object.__new__`` and
  its ``__init__`` is traced (reads of outside state are guarded, writes to it replayed, as in
  any traced code), with ``self`` the local module. ``nn.Module``'s own methods called on it
  (``super().__init__()``, ``register_buffer``, ``add_module``, ``train``) run for real.

What breaks, with the reason: a module that ends up holding a tensor (parameters, buffers:
``nn.Linear`` made per call draws new random weights each call; ``CrossEntropyLoss(weight=t)``)
and arguments that are not Python values.

When the module outlives the trace (returned, stored on an object from the inputs, or live at a
graph break), each call gets a fresh deep copy of its state at the end of the trace, as eager
makes a new module per call; a module that holds a module from the inputs, or a list or dict
the trace may have changed through a tracker, cannot be copied that way, which is a break.
"""
from __future__ import annotations

import collections
import copy
import types

import torch

from kiln.capture.errors import Unsupported
from kiln.capture.dict_keys import refuse_tensor_keys
from kiln.capture.values import (DictVariable, IteratorVariable, ListVariable, TensorVariable,
                                 TupleVariable, Variable)
from kiln.capture.values_callables import FunctionVariable, ModuleVariable
from kiln.capture.resume_glue import CannotResume, _call
from kiln.capture.values_python import _static_lookup, plain_metaclass

_BASE = "torch.nn.modules.module"  # nn.Module's own methods: run for real on a local module
_TRACED_METHODS = ("forward", "__call__", "_call_impl", "_wrapped_call_impl")


class LocalModuleVariable(ModuleVariable):
    """A module built during the trace (the module docstring)."""

    local = True

    def __init__(self, module, seen: dict):
        super().__init__(module, None)
        self.seen = seen  # the tracer's modules seen: id -> (module, tracker)
        self.shares_state = False  # holds a list/dict the trace may change through a tracker

    def _guard(self, tx, check: str):
        pass  # private to this call: nothing to guard

    def _child(self, tx, value, source):
        if isinstance(value, torch.nn.Module):
            return local_child(tx, value)
        if isinstance(value, torch.Tensor):
            raise Unsupported(f"reading a tensor of a {type(self.module).__name__} module made "
                              "inside compiled code")
        if type(value) in (list, dict, set, collections.OrderedDict, collections.defaultdict):
            self.shares_state = True
        return tx.wrap(value, None)

    def _method(self, tx, name, fn):
        if runs_for_real(name, fn):
            return RealMethodVariable(self, fn)
        return super()._method(tx, name, fn)

    def setattr(self, tx, name, value):
        try:
            setattr(self.module, name, real_value(value))
        except Unsupported:
            raise
        except Exception as e:  # noqa: BLE001
            raise Unsupported(f"setting {name!r} on a {type(self.module).__name__} made inside "
                              f"compiled code raised {e!r}") from None
        check_no_tensors(tx, self.module)

    def snapshot(self):
        """A deep copy of the module as it is now, from which each call copies its own."""
        name = type(self.module).__name__
        if self.shares_state:
            raise Unsupported(f"a {name} module made inside compiled code, holding a list or dict "
                              "the trace read, outlives the compiled code")
        if _local_tree(self.module, self.seen)[1]:
            raise Unsupported(f"a {name} module made inside compiled code holds a module from "
                                  "the inputs and outlives the compiled code")
        try:
            return copy.deepcopy(self.module)
        except Exception as e:  # noqa: BLE001
            raise Unsupported(f"copying a {name} module made inside compiled code raised {e!r}") from None

    def reconstruct(self, glue):
        """At a graph break: a fresh copy for this call (resume_glue.Glue.load's protocol)."""
        from bytecode import Instr
        try:
            snap = self.snapshot()
        except Unsupported as e:
            raise CannotResume(str(e)) from None
        glue.emit(Instr("PUSH_NULL"), Instr("LOAD_CONST", copy.deepcopy), Instr("LOAD_CONST", snap),
                  *_call(1))
        glue._memo(self)

    def __repr__(self):
        return f"LocalModule({type(self.module).__name__})"


def runs_for_real(name: str, fn) -> bool:
    """Is ``fn`` one of ``nn.Module``'s own methods that manage a module's state (not forward),
    which run for real on a local module?"""
    if name in _TRACED_METHODS:
        return False
    # what nn.Module holds under the name counts too: Dynamo, once it has run in the process,
    # replaces Module.__init__ with a wrapper of its own (it tags each new module), and a
    # user's super().__init__() must still build the module for real
    if fn is vars(torch.nn.Module).get(name):
        return True
    return getattr(fn, "__module__", None) == _BASE and fn.__qualname__.startswith("Module.")


class RealMethodVariable(Variable):
    """``nn.Module``'s own method of a local module (``add_module``, ``train``, ``__init__``),
    called for real on the Python values of its arguments."""

    def __init__(self, owner: LocalModuleVariable, fn):
        self.owner, self.fn = owner, fn

    def call(self, tx, args, kwargs):
        m = self.owner.module
        try:
            out = self.fn(m, *[real_value(a) for a in args],
                          **{k: real_value(v) for k, v in kwargs.items()})
        except Unsupported:
            raise
        except Exception as e:  # noqa: BLE001
            raise Unsupported(f"{type(m).__name__}.{self.fn.__name__} on a module made inside "
                              f"compiled code raised {e!r}") from None
        check_no_tensors(tx, m)
        return wrap_result(tx, self.owner, out)

    def __repr__(self):
        return f"RealMethod({self.fn.__qualname__})"


def real_value(v):
    """The Python value of an argument given to a local module (a module's real object)."""
    if isinstance(v, ModuleVariable):
        return v.module
    if isinstance(v, TensorVariable):
        raise Unsupported("a tensor given to a module made inside compiled code (it would hold "
                          "the tensor)")
    if isinstance(v, (TupleVariable, ListVariable)):
        items = [real_value(x) for x in v.items]
        return tuple(items) if isinstance(v, TupleVariable) else items
    if type(v) is DictVariable:
        refuse_tensor_keys(v.items, "a module made inside compiled code given")
        return {k: real_value(x) for k, x in v.items.items()}
    return v.as_python()


def wrap_result(tx, owner, out):
    if out is owner.module:
        return owner
    if isinstance(out, torch.nn.Module):
        return local_child(tx, out)
    if isinstance(out, torch.Tensor):
        raise Unsupported("a tensor from a module made inside compiled code")
    if isinstance(out, types.GeneratorType):  # parameters(), modules(): items known now
        return IteratorVariable([wrap_result(tx, owner, x) for x in out])
    if isinstance(out, tuple):
        return TupleVariable([wrap_result(tx, owner, x) for x in out])
    return tx.wrap(out, None)


def local_child(tx, m):
    """The tracker of module ``m`` held by a local module: the one already made in this trace
    (a module from the inputs keeps its source), else a new local one."""
    seen = tx._modules_seen.get(id(m))
    if seen is not None and seen[0] is m:
        return seen[1]
    check_no_tensors(tx, m)
    var = LocalModuleVariable(m, tx._modules_seen)
    tx._modules_seen[id(m)] = (m, var)  # holding the module keeps its id unique
    return var


def _local_tree(m, seen: dict):
    """(``m`` and its submodules, not descending into modules from the inputs; whether it holds
    any module from the inputs). ``seen`` is the tracer's ``_modules_seen``."""
    out, shared, todo, visited = [], False, [m], set()
    while todo:
        x = todo.pop()
        if x is None or id(x) in visited:
            continue
        visited.add(id(x))
        known = seen.get(id(x))
        if known is not None and known[0] is x and not known[1].local:
            shared = True
            continue
        out.append(x)
        todo.extend(x.__dict__.get("_modules", {}).values())
    return out, shared


def check_no_tensors(tx, m):
    """A module made in the trace holds no tensor of its own (see the module docstring)."""
    for x in _local_tree(m, tx._modules_seen)[0]:
        held = [n for n, t in list(x.__dict__.get("_parameters", {}).items()) +
                list(x.__dict__.get("_buffers", {}).items()) if t is not None]
        if held:
            raise Unsupported(f"creating a {type(x).__name__} module inside compiled code that "
                              f"holds tensors ({', '.join(held)}): each call would make new ones; "
                              "create it outside the compiled function")


def construct_module(tx, cls, args, kwargs):
    """``cls(*args, **kwargs)`` for an nn.Module class during capture (the module docstring)."""

    name = cls.__name__
    if (cls.__module__ or "").startswith("kiln.") or not plain_metaclass(type(cls)) or \
            cls.__new__ is not object.__new__:
        raise Unsupported(f"creating a {name} module inside compiled code")
    init, owner = _static_lookup(cls, "__init__")
    if not isinstance(init, types.FunctionType):
        raise Unsupported(f"creating a {name} module inside compiled code: its __init__ is "
                          "not a Python function")
    if (init.__module__ or "").startswith("torch."):
        py_args = [real_value(a) for a in args]
        py_kwargs = {k: real_value(v) for k, v in kwargs.items()}
        try:
            # a module with parameters draws their initial values: the trace must leave the
            # generator as it found it (the module is then refused, and eager builds it again)
            with torch.random.fork_rng(devices=[]):
                m = cls(*py_args, **py_kwargs)
        except Exception as e:  # noqa: BLE001
            raise Unsupported(f"creating a {name} module inside compiled code raised {e!r}") from None
        return local_child(tx, m)
    m = object.__new__(cls)
    var = LocalModuleVariable(m, tx._modules_seen)
    tx._modules_seen[id(m)] = (m, var)
    FunctionVariable(init, self_var=var).call(tx, list(args), dict(kwargs))
    if "_modules" not in m.__dict__:
        raise Unsupported(f"creating a {name} module inside compiled code: its __init__ did not "
                          "call nn.Module.__init__")
    check_no_tensors(tx, m)
    return var


__all__ = ["LocalModuleVariable", "RealMethodVariable", "construct_module", "real_value",
           "runs_for_real"]
