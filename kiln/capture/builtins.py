"""Python builtins during capture: a table from builtin to handler.

Builtins that know about tracked values (``len``, ``isinstance``, ``abs`` on a tensor, ``tuple``
of a list of tensors...) have a handler here; any builtin in ``PURE_BUILTINS`` is evaluated
directly when all its arguments are Python constants. Everything else (``print``, ``open``,
``id``...) is unsupported.
"""
from __future__ import annotations

import builtins
import dataclasses
import functools
import itertools
import math
import sys

import torch

from kiln.capture import controls, sized_later, torch_api
from kiln.capture.dict_keys import dict_key
from kiln.capture.errors import Unsupported
from kiln.capture.scalar_values import NumberVariable, to_number
from kiln.capture.tensor_asserts import record_assert, tensor_condition
from kiln.meta.defaults import default_dtype
from kiln.capture.values import (ConstantVariable, DictVariable, IteratorVariable, ListVariable,
                                 MethodVariable, TensorVariable, TupleVariable, _Sequence)
from kiln.capture.values_iterators import LazyIteratorVariable
from kiln.capture.values_callables import (BuiltinVariable, FunctionVariable, ModuleVariable,
                                           TorchFunctionVariable)

PURE_BUILTINS = {abs, min, max, sum, round, pow, divmod, int, float, bool, str, len, all, any,
                 sorted, repr, hash, chr, ord, math.sqrt, math.ceil, math.floor, math.prod,
                 math.log, math.exp, math.isclose, math.gcd}
# torch's functions of Python values only, computed at trace time as Dynamo folds them: dtype
# arithmetic, and facts fixed for the process (a build option, the renamed privateuse1 backend)
# or outside any compiled call (an ONNX export or FX symbolic trace in progress)
PURE_BUILTINS.update(fn for fn in (
    torch.promote_types, torch.can_cast, getattr(torch.distributed, "is_available", None),
    getattr(torch._C, "_get_privateuse1_backend_name", None),
    getattr(getattr(torch, "onnx", None), "is_in_onnx_export", None),
    getattr(torch.fx._symbolic_trace, "is_fx_tracing", None)) if fn is not None)

BUILTIN_HANDLERS = {}


def handles(*fns):
    def deco(handler):
        for fn in fns:
            BUILTIN_HANDLERS[fn] = handler
        return handler
    return deco


def is_builtin(value) -> bool:
    try:
        if value in BUILTIN_HANDLERS or value in PURE_BUILTINS or value is builtins.print:
            return True
    except TypeError:
        return False
    return _is_math(value) or _operator_fn(value) is not None


def call_builtin(tx, fn, args, kwargs):
    if _is_math(fn):
        PURE_BUILTINS.add(fn)
    op = _operator_fn(fn)
    if op is not None:
        return op(tx, *args)
    handler = BUILTIN_HANDLERS.get(fn)
    if handler is not None:
        result = handler(tx, *args, **kwargs)
        if result is not NotImplemented:
            return result
    if fn in PURE_BUILTINS:
        try:
            py_args = [a.as_python() for a in args]
            py_kwargs = {k: v.as_python() for k, v in kwargs.items()}
        except Unsupported:
            raise Unsupported(f"call to {fn.__name__} on non-constant arguments is not supported") from None
        try:
            return tx.wrap_constant(fn(*py_args, **py_kwargs))
        except Exception as e:
            raise Unsupported(f"{fn.__name__}(...) raised {e!r}") from None
    raise Unsupported(f"call to {getattr(fn, '__name__', fn)} is not supported")


@handles(len)
def _len(tx, obj):
    if isinstance(obj, TensorVariable):
        if obj.proxy.ndim == 0:
            raise Unsupported("len() of a 0-d tensor")
        return ConstantVariable(obj.proxy.shape[0])
    if isinstance(obj, (_Sequence, DictVariable)):
        return ConstantVariable(len(obj.items))
    if isinstance(obj, ModuleVariable):
        return ConstantVariable(len(obj.iterate(tx)))
    if hasattr(obj, "python_len"):  # a user object with a Python __len__ (values_python)
        return obj.python_len(tx)
    return NotImplemented


@handles(isinstance)
def _isinstance(tx, obj, classinfo):
    return ConstantVariable(isinstance_of(obj.python_type(), classinfo.as_python()))


def isinstance_of(ty, classinfo) -> bool:
    if isinstance(classinfo, tuple):
        return any(isinstance_of(ty, c) for c in classinfo)
    return issubclass(ty, classinfo)


@handles(range)
def _range(tx, *args):
    return ConstantVariable(range(*[a.as_python() for a in args]))


def _make_sequence(cls):
    def handler(tx, iterable=None):
        items = [] if iterable is None else iterable.iterate(tx)
        return cls(items)
    return handler


BUILTIN_HANDLERS[tuple] = _make_sequence(TupleVariable)
BUILTIN_HANDLERS[list] = _make_sequence(ListVariable)


@handles(enumerate)
def _enumerate(tx, iterable, start=None):
    first = 0 if start is None else start.as_python()
    return IteratorVariable([TupleVariable([ConstantVariable(first + i), v])
                             for i, v in enumerate(iterable.iterate(tx))])


# itertools over what capture can list now (lists, tuples, ranges of tracked values): the
# combinatorics run on positions, so tensors are only regrouped, never compared
@handles(itertools.chain)
def _chain(tx, *iterables):
    return IteratorVariable([v for it in iterables for v in it.iterate(tx)])


@handles(itertools.product)
def _product(tx, *iterables, repeat=None):
    n = 1 if repeat is None else repeat.as_python()
    pools = [it.iterate(tx) for it in iterables] * n
    return IteratorVariable([TupleVariable([pools[k][i] for k, i in enumerate(group)])
                             for group in itertools.product(*(range(len(p)) for p in pools))])


@handles(itertools.combinations)
def _combinations(tx, iterable, r):
    items = iterable.iterate(tx)
    return IteratorVariable([TupleVariable([items[i] for i in group])
                             for group in itertools.combinations(range(len(items)), r.as_python())])


@handles(itertools.permutations)
def _permutations(tx, iterable, r=None):
    items = iterable.iterate(tx)
    k = None if r is None else r.as_python()
    return IteratorVariable([TupleVariable([items[i] for i in group])
                             for group in itertools.permutations(range(len(items)), k)])


@handles(functools.reduce)
def _reduce(tx, fn, iterable, *initial):
    """functools.reduce: consumes its iterable at once, so each call is traced in order."""
    items = list(initial) + iterable.iterate(tx)
    if not items:
        return NotImplemented  # eager's TypeError for an empty sequence without an initial value
    acc = items[0]
    for item in items[1:]:
        acc = fn.call(tx, [acc, item], {})
    return acc


@handles(abs)
def _abs(tx, x):
    if isinstance(x, TensorVariable):
        return tx.call_adapter(torch_api.UNARY_OPERATORS["abs"], [x], {}, "abs")
    return NotImplemented


@handles(builtins.print)
def _print(tx, *args, **kwargs):
    raise Unsupported("call to print is not supported")


@handles(bool)
def _bool(tx, x=None):
    if x is None:
        return ConstantVariable(False)
    if isinstance(x, TensorVariable) and (tx.scalar_outputs or isinstance(x, NumberVariable)):
        return to_number(tx, x, bool, "bool()")  # a number in the graph (scalar_values.py)
    return ConstantVariable(x.truth(tx))


def _number_of(kind):
    # float(t) / int(t) of a tensor: a number in the graph under fullgraph=True (a number
    # already is one anywhere); other arguments are Python's (PURE_BUILTINS)
    def convert(tx, *args, **kwargs):
        if len(args) != 1 or kwargs or not isinstance(args[0], TensorVariable):
            return NotImplemented
        x = args[0]
        if not (tx.scalar_outputs or isinstance(x, NumberVariable)):
            raise Unsupported(f"{kind.__name__}() of a tensor reads its data: a graph break (under "
                              "fullgraph=True it stays in the graph as a number)")
        return to_number(tx, x, kind, f"{kind.__name__}()")
    return convert


BUILTIN_HANDLERS[float] = _number_of(float)
BUILTIN_HANDLERS[int] = _number_of(int)


# ---------------------------------------------------------------- more builtins
# Every function of the math module is pure on constants.
def _is_math(fn) -> bool:
    return getattr(fn, "__module__", None) == "math" and callable(fn)


def _operator_fn(fn):
    import operator
    try:
        name = {operator.add: "+", operator.sub: "-", operator.mul: "*", operator.truediv: "/",
                operator.floordiv: "//", operator.mod: "%", operator.pow: "**",
                operator.matmul: "@", operator.and_: "&", operator.or_: "|", operator.xor: "^",
                operator.lt: "<", operator.le: "<=", operator.gt: ">", operator.ge: ">=",
                operator.eq: "==", operator.ne: "!="}.get(fn)
    except TypeError:
        return None
    if name is not None:
        return lambda tx, a, b: tx.binary_op(name, a, b)
    if fn is operator.neg:
        return lambda tx, a: tx.unary_op("-", a)
    if fn is operator.getitem:
        return lambda tx, a, b: tx.getitem(a, b)
    return None


def _constants(tx, items):
    try:
        return [v.as_python() for v in items]
    except Unsupported:
        return None


@handles(sum)
def _sum(tx, iterable, start=None):
    items = iterable.iterate(tx)
    total = start if start is not None else ConstantVariable(0)
    values = _constants(tx, [total, *items])
    if values is not None:
        return tx.wrap_constant(sum(values[1:], values[0]))
    for v in items:  # tensors: fold with +, as Python's sum does (0 + a + b ...)
        total = tx.binary_op("+", total, v)
    return total


@handles(sorted)
def _sorted(tx, iterable, key=None, reverse=None):
    items = iterable.iterate(tx)
    if key is not None and not (isinstance(key, ConstantVariable) and key.value is None):
        items_keys = [key.call(tx, [v], {}) for v in items]  # the key function, traced per item
        keys = _constants(tx, items_keys)
    else:
        keys = _constants(tx, items)
    if keys is None:
        raise Unsupported("sorted() of values that are not Python constants")
    order = sorted(range(len(keys)), key=keys.__getitem__,
                   reverse=bool(reverse.as_python()) if reverse is not None else False)
    return ListVariable([items[i] for i in order])


@handles(reversed)
def _reversed(tx, seq):
    return IteratorVariable(list(reversed(seq.iterate(tx))))


@handles(iter)
def _iter(tx, obj):
    if isinstance(obj, (IteratorVariable, LazyIteratorVariable)):
        return obj
    return IteratorVariable(obj.iterate(tx))


@handles(next)
def _next(tx, it, default=None):
    if not isinstance(it, (IteratorVariable, LazyIteratorVariable)):
        raise Unsupported(f"next() of {it}")
    item = it.next()
    if item is None:
        if default is None:
            raise Unsupported("next() of an exhausted iterator (StopIteration)")
        return default
    return item


@handles(type)
def _type(tx, *args):
    if len(args) != 1:
        raise Unsupported("type() with 3 arguments (creating a class)")
    return ConstantVariable(args[0].python_type())


@handles(slice)
def _slice(tx, *args):
    return ConstantVariable(slice(*[a.as_python() for a in args]))


@handles(super)
def _super(tx, *args):
    from kiln.capture.interpreter import frame_super
    from kiln.capture.values_python import SuperVariable
    if not args:
        return frame_super(tx._current_frame)
    if len(args) != 2:
        raise Unsupported("super() with one argument")
    return SuperVariable(args[0].as_python(), args[1])


@handles(dict)
def _dict(tx, *args, **kwargs):
    items = {}
    if args:
        src = args[0]
        if isinstance(src, DictVariable):
            items.update(src.merged_items())
        else:
            for pair in src.iterate(tx):
                k, v = pair.iterate(tx)
                items[dict_key(tx, k, items)] = v
    items.update(kwargs)
    return DictVariable(items)


@handles(set, frozenset)
def _set(tx, iterable=None):
    from kiln.capture.values_python import SetVariable
    return SetVariable([] if iterable is None else iterable.iterate(tx))


@handles(hasattr)
def _hasattr(tx, obj, name):
    return ConstantVariable(has_attribute(tx, obj, name.as_python()))


def has_attribute(tx, obj, name) -> bool:
    """hasattr() answered without guessing: a lookup that fails for another reason is a break."""
    from kiln.capture.values_python import ObjectVariable
    if isinstance(obj, TensorVariable):
        return name in torch_api.TENSOR_ATTRIBUTES or hasattr(torch.Tensor, name)
    if isinstance(obj, ConstantVariable):
        return hasattr(obj.value, name)
    if isinstance(obj, (ModuleVariable, ObjectVariable)):
        if tx.side_effects.load_attr(obj, name) is not None:
            return True
        real = obj.module if isinstance(obj, ModuleVariable) else obj.value
        if real is None:  # made during the trace
            return name in obj.attrs or hasattr(obj.cls, name)
        found = hasattr(real, name)
        if obj.source is not None:
            tx.guards.add(obj.source, f"hasattr({{}}, {name!r}) is {found}")
        return found
    if isinstance(obj, (DictVariable, _Sequence)):
        return hasattr(obj.python_type(), name)
    raise Unsupported(f"hasattr() on {obj}")


@handles(getattr)
def _getattr(tx, obj, name, default=None):
    if default is not None and not has_attribute(tx, obj, name.as_python()):
        return default
    return obj.getattr(tx, name.as_python())


@handles(callable)
def _callable(tx, obj):
    if isinstance(obj, (FunctionVariable, BuiltinVariable, MethodVariable, TorchFunctionVariable)):
        return ConstantVariable(True)
    if isinstance(obj, (TensorVariable, _Sequence, DictVariable)):
        return ConstantVariable(False)
    if isinstance(obj, ConstantVariable):
        return ConstantVariable(callable(obj.value))
    raise Unsupported(f"callable() on {obj}")


@handles(torch.is_tensor)
def _is_tensor(tx, obj):
    # known from the tracker's kind: xglm asks it of a Python int (max_pos), a break before
    return ConstantVariable(isinstance(obj, TensorVariable))


@handles(torch.is_grad_enabled)
def _is_grad_enabled(tx):
    # The cache entry records the grad mode at entry; inside the trace, `with` blocks change it.
    return ConstantVariable(tx.grad_enabled)


@handles(dataclasses.replace)
def _dataclass_replace(tx, obj, **changes):
    from kiln.capture.values_python import dataclass_replace
    return dataclass_replace(tx, obj, changes)


def _usage_log(tx, *args, **kwargs):
    # torch's API-usage telemetry (torchvision's ops and models, transformers' masks): nothing
    # a compiled program computes with; Dynamo drops it as well
    return ConstantVariable(None)


BUILTIN_HANDLERS[torch._C._log_api_usage_once] = _usage_log


def _torch_function_overrides(tx, *args):
    # torch's __torch_function__ dispatch test (torch.nn.functional runs it on entry): a traced
    # tensor is a plain tensor, so False; a user object overriding __torch_function__ is
    # outside what kiln captures
    from kiln.capture.values_python import ObjectVariable
    todo = list(args)
    while todo:
        v = todo.pop()
        if isinstance(v, ObjectVariable) and hasattr(v.cls, "__torch_function__"):
            raise Unsupported(f"{v} overrides __torch_function__")
        todo.extend(getattr(v, "items", None) or ())
    return ConstantVariable(False)


for _fn in (torch._C._has_torch_function, torch._C._has_torch_function_unary,
            torch._C._has_torch_function_variadic):
    BUILTIN_HANDLERS[_fn] = _torch_function_overrides


@handles(torch.jit.annotate)
def _jit_annotate(tx, the_type, value):
    # TorchScript's type annotation (torch.nn.functional's pools with indices call it): the value
    return value


@handles(torch.backends.mha.get_fastpath_enabled)
def _mha_fastpath(tx):
    # nn.MultiheadAttention's (and TransformerEncoderLayer's) switch between torch's fused
    # inference kernel (torch._native_multi_head_attention: opaque to kiln, no fusion, no
    # gradient) and its composite of linear and scaled_dot_product_attention. Both compute the
    # same attention; kiln traces the composite, which it fuses and differentiates.
    return ConstantVariable(False)


@handles(torch._assert)
def _torch_assert(tx, condition, message=None):
    # ``assert`` spelled so tracers see it (timm checks image sizes with it): a condition known
    # at trace time (a size comparison, guarded where it read sizes) costs nothing when true; a
    # false one breaks the graph so the call raises eager's AssertionError itself; a
    # one-element tensor is checked at run time (tensor_asserts.py)
    if tensor_condition(condition) and isinstance(message, (ConstantVariable, type(None))):
        record_assert(tx, condition, () if message is None else (message.value,))
        return ConstantVariable(None)
    if condition.truth(tx):
        return ConstantVariable(None)
    raise Unsupported("torch._assert's condition is false at trace time")


def _torch_check(name):
    # torch._check and its typed kin (torch.nn.functional checks mask shapes with them): as
    # torch._assert, a condition true at trace time costs nothing; a false or unknown one breaks
    # so the call raises eager's error, with its message, itself
    def check(tx, *args, **kwargs):
        cond = args[1] if name == "_check_with" else (args[0] if args else kwargs.get("cond"))
        if name == "_check" and sized_later.checked(tx, cond):  # z.size(0) == n of x.nonzero()
            return ConstantVariable(None)
        if cond is not None and cond.truth(tx):
            return ConstantVariable(None)
        raise Unsupported(f"torch.{name}'s condition is false at trace time")
    return check


for _name in ("_check", "_check_with", "_check_index", "_check_value", "_check_type",
              "_check_not_implemented"):
    if hasattr(torch, _name):
        BUILTIN_HANDLERS[getattr(torch, _name)] = _torch_check(_name)


@handles(torch.get_default_dtype)
def _default_dtype(tx):
    return ConstantVariable(default_dtype())  # the read is guarded (guards.add_default_guards)


def _is_compiling(tx):
    # Model code takes its compile-friendly path under a compiler, as under torch.compile.
    return ConstantVariable(True)


for _fn in (getattr(torch.compiler, "is_compiling", None),
            getattr(torch.compiler, "is_dynamo_compiling", None)):
    if _fn is not None:
        BUILTIN_HANDLERS[_fn] = _is_compiling


def _step_marker(tx):
    # kiln's CUDA graphs know when a replay's outputs are free without being told (storage use
    # counts, runtime/cudagraphs.py): a step marker is a no-op, in the graph and out of it
    return ConstantVariable(None)


for _fn in controls.STEP_MARKERS:
    BUILTIN_HANDLERS[_fn] = _step_marker


def _is_exporting(tx):
    return ConstantVariable(False)  # kiln compiles; it never exports a program


if getattr(torch.compiler, "is_exporting", None) is not None:
    BUILTIN_HANDLERS[torch.compiler.is_exporting] = _is_exporting


def _not_traced(tx):
    return ConstantVariable(False)  # under kiln no other tracer or scripting compiler is running


def _torch_tracing_queries():
    """torch's "is another tracer / script compiler running?" queries (model code asks before
    taking a path such a tracer needs), found by name in torch's loaded modules."""
    found = []
    for name, mod in list(sys.modules.items()):
        if mod is None or name.split(".")[0] != "torch":
            continue
        for attr in ("is_tracing", "is_scripting"):
            fn = vars(mod).get(attr) if hasattr(mod, "__dict__") else None
            if callable(fn) and getattr(fn, "__module__", "").split(".")[0] == "torch":
                found.append(fn)
    return found


for _fn in _torch_tracing_queries():
    try:
        BUILTIN_HANDLERS.setdefault(_fn, _not_traced)
    except TypeError:
        pass


# trace-time introspection and copying (inspect.signature, id, copy): registers its handlers
from kiln.capture import values_introspect  # noqa: E402,F401
# classes made by library functions (collections.namedtuple), made at trace time
from kiln.capture import class_factories  # noqa: E402,F401
# map, min/max, deque and the lazy itertools (values_iterators.py)
from kiln.capture import builtins_iter  # noqa: E402,F401
