"""The glue's value rebuilding: ``Glue.load(v)`` emits the instructions that push the real
value of a Variable live at a graph break (capture/resume.py builds the glue around it): a
tensor from the prefix graph's outputs, an input from ``L`` or the globals, a constant inline,
containers, bound methods, functions and objects made in the traced code made again."""
from __future__ import annotations

import sys
import types

import torch
from bytecode import Instr

from kiln.capture.guards import AttrSource, GlobalSource, ItemSource, LocalSource, Source
from kiln.meta.tensor_meta import WrappedNumberMeta
from kiln.capture.dict_keys import load_key
from kiln.capture.resume_loops import load_as_rest
from kiln.capture.resume_values import _construct, _construct_partial, replay_view, view_rebuild
from kiln.capture.resume_cells import load_cell, load_made_closure
from kiln.capture.values import (BoundAdapterVariable, CellVariable, ConstantVariable, DictVariable,
                                 IteratorVariable, LazyVariable, ListVariable, MethodVariable,
                                 NullVariable, OpaqueVariable, TensorVariable, TupleVariable)
from kiln.capture.values_callables import (BuiltinVariable, FunctionVariable, ModuleVariable,
                                           PythonModuleVariable, TorchFunctionVariable)
from kiln.meta.symbolic import SymInt
from kiln.capture.values_python import _MISSING, _static_lookup, make_named_tuple

PY = sys.version_info[:2]


class CannotResume(Exception):
    """The break cannot be resumed; the whole function runs eagerly (the reason says why)."""


def _is_own_symbol(v) -> bool:
    """A dynamic int (a symbol) held by the variable its source names: the glue reloads it from
    that source (the frame's value at entry) instead of specializing it."""
    value = v.value
    return isinstance(value, SymInt) and v.source is not None and value.expr.is_Symbol and \
        value.env.sources.get(value.expr) == v.source.expr()


class GradModeExit:
    """A with-block's ``__exit__`` rebuilt at a break: restores grad mode to ``prev``.
    ``GRAD_EXITS[prev]`` are the only instances; capture traces a call of one as the exit of
    a grad-mode block (``Tracer.wrap``)."""
    __slots__ = ("prev",)

    def __init__(self, prev: bool):
        self.prev = prev

    def __call__(self, *exc):
        torch._C._set_grad_enabled(self.prev)
        return False


GRAD_EXITS = {False: GradModeExit(False), True: GradModeExit(True)}


def _grad_prev(v) -> bool:
    """The grad mode a ContextExitVariable restores (its ``restore`` closes over ``prev``)."""
    prev = getattr(v, "grad_prev", None)
    if prev is None:
        fn = v.restore
        names = fn.__code__.co_freevars
        if "prev" not in names:
            raise CannotResume("cannot tell which grad mode the with block restores")
        prev = fn.__closure__[names.index("prev")].cell_contents
    return bool(prev)


def _enter_autocast(device, dtype, enabled):
    """Enter an autocast region for real at a break; returns its ``__exit__``."""
    cm = torch.autocast(device, dtype=dtype, enabled=enabled)
    cm.__enter__()
    return cm.__exit__


def _make_function(code, globals_, qualname, defaults, kwdefaults):
    """A function made in traced code before a break, made again for real by the glue."""
    fn = types.FunctionType(code, globals_, code.co_name, defaults or None)
    fn.__kwdefaults__ = kwdefaults or None
    fn.__qualname__ = qualname
    return fn


def _new_object(cls, attrs):
    """An object made in traced code before a break (its ``__init__`` already ran in the
    trace: ``attrs`` is its instance dict), made again for real by the glue."""
    obj = object.__new__(cls)
    for k, x in attrs.items():
        object.__setattr__(obj, k, x)
    return obj


def _is_made_object(v) -> bool:
    return type(v).__name__ == "ObjectVariable" and v.value is None and v.source is None


def _binds_to(self_var, name: str, fn) -> bool:
    """Does ``<the real self_var>.name`` give a method bound to ``fn``?"""
    owner = getattr(self_var, "module", None)
    if owner is None:
        owner = getattr(self_var, "value", None)
    if owner is not None:
        return getattr(getattr(owner, name, None), "__func__", None) is fn
    if _is_made_object(self_var):
        found, _ = _static_lookup(self_var.cls, name)
        return found is fn and name not in self_var.attrs and found is not _MISSING
    return False


def _load_attr(name):
    return Instr("LOAD_ATTR", (False, name) if PY >= (3, 12) else name)


def _call(n, lineno=None):
    kw = {} if lineno is None else {"lineno": lineno}
    return ([Instr("PRECALL", n, **kw)] if PY < (3, 12) else []) + [Instr("CALL", n, **kw)]


class Glue:
    """Emits the glue's instructions; ``load(v)`` pushes the real value of Variable ``v``."""

    def __init__(self, state, fn_globals: dict):
        self.state = state
        self.globals = fn_globals
        self.out_index = {v.proxy.node: k for k, v in enumerate(state.outputs)}
        self.instrs: list = []
        self.temps: dict[int, str] = {}
        self.keep: list = []
        self.loop_iters: set = set()  # ids of stack iterators passed as a LoopRest (resume_loops)

    def emit(self, *instrs):
        self.instrs.extend(instrs)

    def temp(self) -> str:
        return f"___kiln_t{len(self.keep) + len(self.temps)}"

    def load_source(self, s: Source):
        if isinstance(s, LocalSource):
            self.emit(Instr("LOAD_FAST", "___L"), Instr("LOAD_CONST", s.name), Instr("BINARY_SUBSCR"))
        elif isinstance(s, GlobalSource):
            self.emit(Instr("LOAD_GLOBAL", (False, s.name)))
        elif isinstance(s, AttrSource):
            self.load_source(s.parent)
            self.emit(_load_attr(s.attr))
        elif isinstance(s, ItemSource):
            self.load_source(s.parent)
            self.emit(Instr("LOAD_CONST", s.key), Instr("BINARY_SUBSCR"))
        else:  # any other kind of source: evaluate its expression
            getter = eval(f"lambda L, G: {s.expr()}", {"torch": torch})  # noqa: S307 - our own text
            self.emit(Instr("PUSH_NULL"), Instr("LOAD_CONST", getter), Instr("LOAD_FAST", "___L"),
                      Instr("LOAD_CONST", self.globals), *_call(2))

    def load(self, v):
        """Emit the instructions that push the real value of ``v``; ``CannotResume`` where
        it cannot be rebuilt."""
        if id(v) in self.temps:  # rebuilt once already: the same object (a dict the resumed
            self.emit(Instr("LOAD_FAST", self.temps[id(v)]))  # code mutates is the local's)
            return
        reconstruct = getattr(v, "reconstruct", None)
        if reconstruct is not None:  # a Variable that knows how to rebuild itself
            reconstruct(self)
            return
        if isinstance(v, NullVariable):
            raise CannotResume("a NULL inside a value")
        if isinstance(v, CellVariable):  # a closure cell (resume_cells.py)
            load_cell(self, v)
            return
        if isinstance(v, TensorVariable):
            self._load_tensor(v)
            return
        if isinstance(v, LazyVariable):
            if v.source is None:
                raise CannotResume("an unread value without a source")
            self.load_source(v.source)
            return
        if isinstance(v, ConstantVariable):
            if _is_own_symbol(v):
                self.load_source(v.source)
            else:
                self.emit(Instr("LOAD_CONST", v.value))
            return
        if id(v) in self.temps:
            self.emit(Instr("LOAD_FAST", self.temps[id(v)]))
            return
        if isinstance(v, FunctionVariable) and v.self_var is not None and v.source is not None:
            # a method bound in the trace: its source is the function's (``m.forward.__func__``,
            # an lr scheduler's ``func.__get__(opt, cls)``), so bind it again to the rebuilt self
            self.emit(Instr("PUSH_NULL"), Instr("LOAD_CONST", types.MethodType))
            self.load_source(v.source)
            self.load(v.self_var)
            self.emit(*_call(2))
            self._memo(v)
            return
        if v.source is not None and isinstance(v, (TupleVariable, ListVariable, DictVariable,
                                                   ModuleVariable, FunctionVariable, OpaqueVariable,
                                                   PythonModuleVariable, TorchFunctionVariable,
                                                   BuiltinVariable)):
            self.load_source(v.source)
            return
        if not (self._load_container(v) or self._load_bound(v) or self._load_other(v)):
            raise CannotResume(f"cannot rebuild {v} at the break")

    def _load_tensor(self, v):
        """An input (its source), a view taken again from its base, or a prefix graph output."""
        if v.source is not None:
            self.load_source(v.source)
        elif id(v) in self.temps:
            self.emit(Instr("LOAD_FAST", self.temps[id(v)]))
        elif view_rebuild(v) is not None:  # a view: taken again from its base, for real
            root, steps = view_rebuild(v)
            self.emit(Instr("PUSH_NULL"), Instr("LOAD_CONST", replay_view))
            self.load(root)
            self.emit(Instr("LOAD_CONST", steps), *_call(2))
            self._memo(v)
        else:
            number = type(v.proxy.meta) is WrappedNumberMeta  # a Python float (dynamic_floats.py)
            if number:
                self.emit(Instr("PUSH_NULL"), Instr("LOAD_CONST", torch.Tensor.item))
            self.emit(Instr("LOAD_FAST", "___outs"), Instr("LOAD_CONST", self.out_index[v.proxy.node]),
                      Instr("BINARY_SUBSCR"))
            if number:
                self.emit(*_call(1))

    def _load_container(self, v) -> bool:
        """Tuples, lists and dicts built from their items; iterators (a loop's as a LoopRest)."""
        if isinstance(v, (TupleVariable, ListVariable)):
            for x in v.items:
                self.load(x)
            self.emit(Instr("BUILD_TUPLE" if isinstance(v, TupleVariable) else "BUILD_LIST", len(v.items)))
            if isinstance(v, ListVariable):
                self._memo(v)
            return True
        if isinstance(v, DictVariable):
            for k, x in v.items.items():
                load_key(self, k)
                self.load(x)
            self.emit(Instr("BUILD_MAP", len(v.items)))
            self._memo(v)
            return True
        if isinstance(v, IteratorVariable) and id(v) in self.loop_iters:
            load_as_rest(self, v)
            return True
        if isinstance(v, IteratorVariable):
            for x in v.items[v.pos:]:
                self.load(x)
            self.emit(Instr("BUILD_TUPLE", len(v.items) - v.pos), Instr("GET_ITER"))
            self._memo(v)
            return True
        return False

    def _load_bound(self, v) -> bool:
        """Bound methods, functions and objects made in the traced code."""
        if isinstance(v, (MethodVariable, BoundAdapterVariable)):
            self.load(v.obj)
            self.emit(_load_attr(v.name.rsplit(".", 1)[-1]))
            return True
        if isinstance(v, FunctionVariable) and v.fn is not None and v.self_var is not None:
            name = v.fn.__name__
            if not _binds_to(v.self_var, name, v.fn):
                raise CannotResume(f"cannot rebuild the bound method {v.qualname}")
            self.load(v.self_var)
            self.emit(_load_attr(name))
            return True
        if isinstance(v, FunctionVariable) and v.fn is None and v.source is None:
            self._load_made_function(v)
            return True
        if _is_made_object(v):
            self._guard_cycle(v)
            self.emit(Instr("PUSH_NULL"), Instr("LOAD_CONST", _new_object), Instr("LOAD_CONST", v.cls))
            for k, x in v.attrs.items():
                self.emit(Instr("LOAD_CONST", k))
                self.load(x)
            self.emit(Instr("BUILD_MAP", len(v.attrs)), *_call(2))
            self._memo(v)
            return True
        return False

    def _load_other(self, v) -> bool:
        """With-block exits entered again, named tuples, made values, values from sources."""
        if type(v).__name__ == "ContextExitVariable":  # a grad-mode with block (values_python)
            self.emit(Instr("LOAD_CONST", GRAD_EXITS[_grad_prev(v)]))
            return True
        if type(v).__name__ == "AutocastExitVariable":  # an autocast with block: enter it for real
            r = v.region
            self.emit(Instr("PUSH_NULL"), Instr("LOAD_CONST", _enter_autocast),
                      Instr("LOAD_CONST", r.device), Instr("LOAD_CONST", r.dtype),
                      Instr("LOAD_CONST", r.enabled), *_call(3))
            return True
        if type(v).__name__ == "NamedTupleVariable" and v.source is None:
            self.emit(Instr("PUSH_NULL"), Instr("LOAD_CONST", make_named_tuple), Instr("LOAD_CONST", v.cls))
            for x in v.items:
                self.load(x)
            self.emit(Instr("BUILD_TUPLE", len(v.items)), *_call(2))
            return True
        if v.source is None and self._load_made_value(v):
            return True
        if v.source is not None and not isinstance(v, (ListVariable, DictVariable)):
            self.load_source(v.source)  # any other value reached from the inputs
            return True
        if isinstance(v, (BuiltinVariable, TorchFunctionVariable, OpaqueVariable)) and v.source is None:
            self.emit(Instr("LOAD_CONST", getattr(v, "fn", getattr(v, "value", None))))
            return True
        if isinstance(v, FunctionVariable) and v.fn is not None and v.source is None:
            self.emit(Instr("LOAD_CONST", v.fn))  # a function reached through a trusted path
            return True
        return False

    def _load_made_value(self, v) -> bool:
        """Values made in the traced code that live across the break, made again for real:
        a ``ModelOutput``-like dict dataclass (``cls(**fields)``, the way its output spec
        builds it after a graph), a set, a ``functools.partial``. False for other kinds."""
        kind = type(v).__name__
        if kind == "DictDataclassVariable":
            self._guard_cycle(v)
            self.emit(Instr("PUSH_NULL"), Instr("LOAD_CONST", _construct), Instr("LOAD_CONST", v.cls))
            for k, x in v.values.items():
                self.emit(Instr("LOAD_CONST", k))
                self.load(x)
            self.emit(Instr("BUILD_MAP", len(v.values)), *_call(2))
        elif kind == "SetVariable":
            for x in v.items:
                self.load(x)
            self.emit(Instr("BUILD_SET", len(v.items)))
        elif kind == "PartialVariable":
            self.emit(Instr("PUSH_NULL"), Instr("LOAD_CONST", _construct_partial))
            self.load(v.fn)
            for x in v.args:
                self.load(x)
            self.emit(Instr("BUILD_TUPLE", len(v.args)))
            for k, x in v.kwargs.items():
                self.emit(Instr("LOAD_CONST", k))
                self.load(x)
            self.emit(Instr("BUILD_MAP", len(v.kwargs)), *_call(3))
        elif kind == "ProfilerExitVariable":  # a profiler range's exit: a no-op (profiler_ranges.py)
            self.emit(Instr("LOAD_CONST", v.glue_value))
        elif kind == "_GeneratorExit" and v.pure_enter:  # a @contextmanager block: enter again
            from kiln.capture.values_stdlib import enter_for_real
            m = v.manager
            self.emit(Instr("PUSH_NULL"), Instr("LOAD_CONST", enter_for_real), Instr("LOAD_CONST", m.fn.fn))
            for x in m.args:
                self.load(x)
            self.emit(Instr("BUILD_TUPLE", len(m.args)))
            for k, x in m.kwargs.items():
                self.emit(Instr("LOAD_CONST", k))
                self.load(x)
            self.emit(Instr("BUILD_MAP", len(m.kwargs)), *_call(3))
        else:
            return False
        self._memo(v)
        return True

    def _load_made_function(self, v):
        """A function made by MAKE_FUNCTION before the break (a lambda, a 3.11 comprehension;
        one with a closure over the glue's cells: resume_cells.py)."""
        if v.self_var is not None:
            raise CannotResume(f"cannot rebuild the method {v.qualname} made before the break")
        if v.closure:
            load_made_closure(self, v)
            return
        self.emit(Instr("PUSH_NULL"), Instr("LOAD_CONST", _make_function),
                  Instr("LOAD_CONST", v.code), Instr("LOAD_CONST", v.globals),
                  Instr("LOAD_CONST", v.qualname))
        for x in v.defaults:
            self.load(x)
        self.emit(Instr("BUILD_TUPLE", len(v.defaults)))
        for k, x in v.kwdefaults.items():
            self.emit(Instr("LOAD_CONST", k))
            self.load(x)
        self.emit(Instr("BUILD_MAP", len(v.kwdefaults)), *_call(5))
        self._memo(v)

    def _guard_cycle(self, v):
        building = self.__dict__.setdefault("_building", set())
        if id(v) in building:
            raise CannotResume(f"{v} refers to itself; it cannot be rebuilt at the break")
        building.add(id(v))

    def _memo(self, v):
        name = self.temp()
        self.keep.append(v)
        self.emit(Instr("STORE_FAST", name), Instr("LOAD_FAST", name))
        self.temps[id(v)] = name
