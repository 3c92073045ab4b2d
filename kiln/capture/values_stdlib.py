"""Standard-library objects library code calls around its tensors, handled at trace time the
way a user expects (and the way Dynamo does): evaluated on constants, guarded, no break.

- ``os.environ`` (``EnvironVariable``): ``get``, ``[]``, ``in`` and ``os.getenv`` read the
  variable for real; the guard re-reads it (``os.environ.get('X') == '1'``), so changing it
  recompiles. Writes are graph breaks (they change the process for later calls).
- ``logging.Logger`` methods that emit (``warning``, ``info``, transformers' ``warning_once``
  and ``warning_advice``...) and ``warnings.warn``: the arguments must be Python constants;
  the call is not traced but recorded, and replayed for real after the compiled graph runs on
  every call (side_effects.py ``"call"`` steps), as Dynamo replays reorderable logging
  calls. So the side effect happens as often as in eager (``warning_once`` once, through its
  own cache; ``warnings.warn`` once per location, through the caller's warning registry).
  Queries (``isEnabledFor``, ``getEffectiveLevel``) are read at trace time and guarded.
"""
from __future__ import annotations

import collections
import contextlib
import enum
import functools
import logging
import os
import types
import warnings
import weakref

from kiln.capture.dict_keys import is_tensor_key
from kiln.capture.errors import Unsupported
from kiln.capture.guards import AttrSource, ItemSource, Source
from kiln.capture.values import ConstantVariable, Variable
from kiln.capture.values_dict import MethodCallSource
from kiln.capture.values_callables import FunctionVariable
from kiln.capture.values_deque import wrap_deque
from kiln.capture.values_python import PartialVariable

_Environ = type(os.environ)


class WeakRefVariable(Variable):
    """A ``weakref.ref`` from the inputs (an lr scheduler's wrapper of ``optimizer.step`` holds
    the optimizer through one): calling it is its referent, read again by the guards through
    ``ref.__call__()``, so a dead referent (None) fails them."""

    def __init__(self, ref, source):
        self.ref, self.source = ref, source

    def truth(self, tx):
        return True

    def call(self, tx, args, kwargs):
        if args or kwargs:
            raise Unsupported("calling a weakref with arguments")
        return tx.wrap(self.ref(), MethodCallSource(self.source, "__call__"))


def wrap_stdlib(tx, value, source, guard):
    """The tracker for a standard-library object modeled here, or None."""
    if type(value) is _Environ:
        if guard:
            tx.guards.identity(source, value)
        return EnvironVariable(value, source)
    if isinstance(value, logging.Logger):
        if guard:
            tx.guards.identity(source, value)
        return LoggerVariable(value, source)
    if value is warnings.warn:
        return WarnVariable()
    if value is os.getenv and source is not None:
        return _EnvironMethod(EnvironVariable(os.environ, _EnvironSource()), "get")
    if type(value) is functools.partial:
        return wrap_partial(tx, value, source, guard)
    if type(value) is weakref.ReferenceType and source is not None:
        if guard:
            tx.guards.identity(source, value)
        return WeakRefVariable(value, source)
    if type(value) is collections.deque:  # a list tracker with deque's methods (values_deque.py)
        return wrap_deque(tx, value, source, guard)
    if isinstance(value, types.FunctionType) and value.__code__ is _CONTEXTMANAGER_HELPER \
            and isinstance(getattr(value, "__wrapped__", None), types.FunctionType):
        if guard:
            tx.guards.identity(source, value)
        return ContextManagerFunctionVariable(value.__wrapped__)
    if isinstance(value, functools._lru_cache_wrapper) and source is not None \
            and isinstance(getattr(value, "__wrapped__", None), types.FunctionType):
        # a cached pure function: its body gives what the cache holds, so it is inlined
        if guard:
            tx.guards.identity(source, value)
        return FunctionVariable(value.__wrapped__, source=AttrSource(source, "__wrapped__"))
    return None


def wrap_partial(tx, value, source, guard):
    """A ``functools.partial`` object reached as a value (``self.act = partial(F.gelu, ...)``):
    its function and bound arguments are read through ``.func``/``.args[i]``/``.keywords[k]``,
    each with the guards of any value there; the partial itself by type and layout."""
    if guard:
        tx.guards.add(source, f"id(type({{}})) == {id(functools.partial)} and "
                              f"len({{}}.args) == {len(value.args)} and "
                              f"list({{}}.keywords) == {list(value.keywords)!r}")

    def part(v, src):
        return tx.wrap(v, src if source is not None else None, guard)
    fn = part(value.func, source and AttrSource(source, "func"))
    args = [part(a, source and ItemSource(AttrSource(source, "args"), i))
            for i, a in enumerate(value.args)]
    kwargs = {k: part(v, source and ItemSource(AttrSource(source, "keywords"), k))
              for k, v in value.keywords.items()}
    return PartialVariable(fn, args, kwargs)


# keys compared by value in a dict's guard; other hashable keys (types, enums, functions,
# modules...) are compared by identity, which is what their hash and == are
_VALUE_KEYS = (str, int, bool, float, type(None))


class DictValueAtSource(Source):
    """The value at position ``index`` of a dict whose key there has no literal spelling (a
    type, an enum, a function): the dict's guard fixes its keys' order first."""
    __slots__ = ("parent", "index")

    def __init__(self, parent, index):
        self.parent, self.index = parent, index

    def expr(self, base=None):
        return f"list({base or self.parent.expr()}.values())[{self.index}]"


def dict_item_source(source, i, key):
    """Where the guards read the value of ``key`` (at position ``i``) of the dict at ``source``."""
    if source is None:
        return None
    spelled = type(key) in _VALUE_KEYS or type(key) is tuple and all(type(x) in _VALUE_KEYS for x in key)
    return ItemSource(source, key) if spelled else DictValueAtSource(source, i)


def dict_keys_check(d: dict, guards) -> str:
    """The guard (``{}`` for the dict) that a dict has the same keys in the same order: by value
    for strings and numbers, by identity (kept alive) for types, enums, functions and other
    hashable objects, whose ``==`` is identity; tuples of those item by item."""
    def plain(k):  # spelled by repr (a tuple's repr names its items' identities or values)
        return type(k) in _VALUE_KEYS or type(k) is tuple
    keys = list(d)
    # an OrderedDict by its type's id: its class is not a name the guard function knows
    is_type = "type({}) is dict" if type(d) is dict else f"id(type({{}})) == {id(type(d))}"
    if all(type(k) in (str, int) for k in keys):
        return f"{is_type} and list({{}}) == {keys!r}"
    for k in keys:
        if not plain(k) and not is_tensor_key(k):  # a tensor key: an input (dict_keys.py)
            if type(k).__eq__ is not object.__eq__ and not isinstance(k, (type, enum.Enum)) \
                    and not callable(k):
                raise Unsupported(f"a dict key of type {type(k).__name__} (compared by its own "
                                  "__eq__) is not supported")
            guards.keep_alive(k)
    spelled = [repr(k) if plain(k) else "tensor" if is_tensor_key(k) else f"id:{id(k)}"
               for k in keys]
    return (f"{is_type} and [repr(k) if type(k) in (str, int, bool, float, type(None), tuple) "
            f"else 'tensor' if isinstance(k, torch.Tensor) else 'id:' + str(id(k)) "
            f"for k in {{}}] == {spelled!r}")


def _constants(args, kwargs, what):
    """The Python values of call arguments; a tensor or other traced value is a break."""
    try:
        return [a.as_python() for a in args], {k: v.as_python() for k, v in kwargs.items()}
    except Unsupported:
        raise Unsupported(f"{what} with a non-constant argument (a tensor?) is not supported") \
            from None


# ====================================================================== contextlib.contextmanager
# every @contextmanager function is a closure over this one code object (contextlib's helper)
_CONTEXTMANAGER_HELPER = contextlib.contextmanager(lambda: iter(())).__code__


class ContextManagerFunctionVariable(Variable):
    """A ``@contextlib.contextmanager`` function: calling it makes the manager; nothing runs yet."""

    def __init__(self, fn):
        self.fn = fn

    def truth(self, tx):
        return True

    def call(self, tx, args, kwargs):
        return GeneratorContextVariable(FunctionVariable(self.fn), list(args), dict(kwargs))


class GeneratorContextVariable(Variable):
    """``with cm(...) as v``: ``enter`` inlines the generator up to its yield (``v`` is what it
    yields); the exit resumes the same frame, which must then return, as contextlib checks."""

    def __init__(self, fn, args, kwargs):
        self.fn, self.args, self.kwargs = fn, args, kwargs

    def enter(self, tx):
        before = _effects_size(tx)
        frame = tx.inline_call(self.fn, self.args, self.kwargs, suspend=True)
        if frame.suspend_at_yield:  # the body returned without yielding
            raise Unsupported(f"{self.fn.qualname}: generator didn't yield")
        value = frame.return_value
        exit_ = _GeneratorExit(frame, self)
        # entering again for real is safe when the code before the yield did nothing kiln
        # records (no op, no write, no call replayed): a graph break inside the block does
        # that in its glue (resume.py), so the resume function gets a real exit
        exit_.pure_enter = _effects_size(tx) == before
        return exit_, value


def _effects_size(tx):
    se = tx.side_effects
    return (len(tx.graph.nodes), len(se.calls), len(se.attr_writes), len(se.containers),
            len(se.global_writes), len(se.cells))


def enter_for_real(fn, args, kwargs):
    """A ``@contextmanager`` block live at a graph break, entered again by the glue: the bound
    ``__exit__`` of a real manager whose generator stands at its yield."""
    manager = contextlib._GeneratorContextManager(fn, args, kwargs)
    manager.__enter__()
    return manager.__exit__


class _GeneratorExit(Variable):
    pure_enter = False

    def __init__(self, frame, manager):
        self.frame, self.manager = frame, manager

    def call(self, tx, args, kwargs):
        frame = self.frame
        frame.return_value = None
        frame.push(ConstantVariable(None))  # what next() sends into the yield
        frame.yielded = []
        tx.run_frame(frame)
        if frame.yielded:
            raise Unsupported("a @contextmanager generator yielded twice")
        return ConstantVariable(None)


# ====================================================================== os.environ
class _EnvironSource(Source):
    """``os.environ``, for ``os.getenv`` (whose own globals are the ``os`` module's)."""
    __slots__ = ()

    def expr(self, base=None):
        return "__import__('os').environ"


class EnvironVariable(Variable):
    """``os.environ``: reads are constants guarded by re-reading the variable."""

    def __init__(self, env, source):
        self.env, self.source = env, source

    def python_type(self):
        return _Environ

    def truth(self, tx):
        return True

    def read(self, tx, key):
        """The variable's value now (None when unset), guarded on the same read."""
        if not isinstance(key, str):
            raise Unsupported(f"os.environ read with a {type(key).__name__} key")
        if self.source is None:
            raise Unsupported("os.environ reached without a source")
        value = self.env.get(key)
        check = f"{{}}.get({key!r}) is None" if value is None else f"{{}}.get({key!r}) == {value!r}"
        tx.guards.add(self.source, check)
        return value

    def getitem(self, tx, key):
        key = key.as_python()
        value = self.read(tx, key)
        if value is None:
            raise Unsupported(f"os.environ[{key!r}] raises KeyError")
        return ConstantVariable(value)

    def contains(self, tx, item) -> bool:
        return self.read(tx, item.as_python()) is not None

    def getattr(self, tx, name):
        if name in ("get", "__getitem__", "__contains__"):
            return _EnvironMethod(self, name)
        raise Unsupported(f"os.environ.{name} is not supported (only reads are)")


class _EnvironMethod(Variable):
    def __init__(self, env, name):
        self.env, self.name = env, name

    def truth(self, tx):
        return True

    def call(self, tx, args, kwargs):
        args, kwargs = _constants(args, kwargs, f"os.environ.{self.name}")
        if self.name == "get" and 1 <= len(args) <= 2 and not kwargs or \
                self.name == "get" and len(args) == 1 and set(kwargs) == {"default"}:
            value = self.env.read(tx, args[0])
            default = args[1] if len(args) == 2 else kwargs.get("default")
            return tx.wrap_constant(default if value is None else value)
        if self.name == "__getitem__" and len(args) == 1 and not kwargs:
            return self.env.getitem(tx, ConstantVariable(args[0]))
        if self.name == "__contains__" and len(args) == 1 and not kwargs:
            return ConstantVariable(self.env.read(tx, args[0]) is not None)
        raise Unsupported(f"os.environ.{self.name} with these arguments is not supported")


# ====================================================================== logging and warnings
# Logger methods that only emit a record (their effect is the output): replayed after the graph
_EMITTING = frozenset({"debug", "info", "warning", "warn", "error", "critical", "fatal",
                       "exception", "log", "warning_once", "info_once", "warning_advice"})
# Logger methods whose result depends on the logger's configuration: read and guarded
_QUERIES = frozenset({"isEnabledFor", "getEffectiveLevel"})


class LoggerVariable(Variable):
    """A ``logging.Logger`` (guarded by identity)."""

    def __init__(self, logger, source):
        self.logger, self.source = logger, source

    def python_type(self):
        return type(self.logger)

    def truth(self, tx):
        return True

    def getattr(self, tx, name):
        if name in _EMITTING or name.endswith("_once") and callable(getattr(self.logger, name, None)):
            return ReplayedCallVariable(getattr(self.logger, name), f"Logger.{name}")
        if name in _QUERIES:
            return _LoggerQuery(self, name)
        if name in ("name", "level", "disabled", "propagate"):
            value = getattr(self.logger, name)
            if self.source is not None:
                tx.guards.constant(tx.attr_source(self.source, name), value)
            return ConstantVariable(value)
        raise Unsupported(f"Logger.{name} is not supported")


class _LoggerQuery(Variable):
    def __init__(self, logger_var, name):
        self.logger_var, self.name = logger_var, name

    def call(self, tx, args, kwargs):
        args, kwargs = _constants(args, kwargs, f"Logger.{self.name}")
        if self.logger_var.source is None:
            raise Unsupported(f"Logger.{self.name} on a logger reached without a source")
        value = getattr(self.logger_var.logger, self.name)(*args, **kwargs)
        call = f"{self.name}({', '.join(repr(a) for a in args)})"
        tx.guards.add(self.logger_var.source, f"{{}}.{call} == {value!r}")
        return ConstantVariable(value)


class ReplayedCallVariable(Variable):
    """A call whose only effect is output: recorded with its constant arguments and made for
    real after the graph runs, on every call (``SideEffects.record_call``)."""

    def __init__(self, fn, what):
        self.fn, self.what = fn, what

    def truth(self, tx):
        return True

    def call(self, tx, args, kwargs):
        args, kwargs = _constants(args, kwargs, self.what)
        tx.side_effects.record_call(self.fn, args, kwargs)
        return ConstantVariable(None)


class WarnVariable(Variable):
    """``warnings.warn``: replayed as ``warnings.warn_explicit`` at the location the traced
    code's ``stacklevel`` names, with that module's warning registry, so the warning says the
    same line as in eager and shows as often (once per location under the default filter)."""

    def truth(self, tx):
        return True

    def call(self, tx, args, kwargs):
        args, kwargs = _constants(args, kwargs, "warnings.warn")
        names = ("message", "category", "stacklevel")
        bound = dict(zip(names, args))
        bound.update(kwargs)
        if len(args) > 3 or set(bound) - set(names) - {"source", "skip_file_prefixes"}:
            raise Unsupported("warnings.warn with these arguments is not supported")
        message = bound["message"]
        category = bound.get("category") or (
            type(message) if isinstance(message, Warning) else UserWarning)
        frame = tx._current_frame
        for _ in range(int(bound.get("stacklevel", 1)) - 1):
            if frame is not None and frame.parent is not None:
                frame = frame.parent
        if frame is None:
            raise Unsupported("warnings.warn outside a traced frame")
        _, lineno, _ = frame.location(frame.current)
        module = frame.globals.get("__name__", "<string>")
        registry = frame.globals.setdefault("__warningregistry__", {})
        tx.side_effects.record_call(
            warnings.warn_explicit, [message, category, frame.code.co_filename, lineno or 0],
            {"module": module, "registry": registry, "module_globals": frame.globals})
        return ConstantVariable(None)


__all__ = ["wrap_stdlib", "EnvironVariable", "LoggerVariable", "WarnVariable", "enter_for_real"]
