"""Opcode handlers, part two: operators, containers, unpacking and subscripts, imports, sets,
generators and 3.12's super/slice opcodes. interpreter.py holds the ``Frame``, the handler
registry and the handlers of the stack, locals, attributes, calls and jumps; it imports this
module at its end so every handler is registered. One handler per opcode, with its version
range, as there.
"""
from __future__ import annotations

import sys

from kiln.capture.dict_keys import dict_key, merge_items
from kiln.capture.errors import Unsupported
from kiln.capture.interpreter import handler
from kiln.capture.values import (NULL, ConstantVariable, DictVariable, ListVariable, TensorVariable,
                                 TupleVariable, _Sequence)
from kiln.capture.values_callables import (BuiltinVariable, FunctionVariable, ModuleVariable,
                                           TorchFunctionVariable)
from kiln.capture.scalar_values import holds_tensors, negate, sequence_contains
from kiln.capture.values_python import SetVariable, SuperVariable
from kiln.capture.guards import ModuleSource


# ---------------------------------------------------------------- operators
@handler("BINARY_OP")
def binary_op(frame, inst):
    b, a = frame.pop(), frame.pop()
    frame.push(frame.tx.binary_op(inst.argrepr, a, b))


@handler("COMPARE_OP")
def compare_op(frame, inst):
    b, a = frame.pop(), frame.pop()
    frame.push(frame.tx.binary_op(inst.argval, a, b))


@handler("UNARY_NEGATIVE")
def unary_negative(frame, inst):
    frame.push(frame.tx.unary_op("-", frame.pop()))


@handler("UNARY_POSITIVE", versions=((3, 11), (3, 11)))
def unary_positive(frame, inst):
    frame.push(frame.tx.unary_op("+", frame.pop()))


@handler("UNARY_INVERT")
def unary_invert(frame, inst):
    frame.push(frame.tx.unary_op("~", frame.pop()))


@handler("UNARY_NOT")
def unary_not(frame, inst):
    frame.push(ConstantVariable(not frame.pop().truth(frame.tx)))


@handler("IS_OP")
def is_op(frame, inst):
    b, a = frame.pop(), frame.pop()
    result = _identical(a, b, frame.tx)
    frame.push(ConstantVariable(result != bool(inst.arg)))


def _identical(a, b, tx=None) -> bool:
    if isinstance(a, FunctionVariable) and a.by_code or isinstance(b, FunctionVariable) and b.by_code:
        return _identical_made_functions(a, b, tx)
    if a is b:
        return True
    if isinstance(a, ConstantVariable) and isinstance(b, ConstantVariable):
        return a.value is b.value
    if isinstance(a, ModuleVariable) and isinstance(b, ModuleVariable):
        same = a.module is b.module
        if not same and tx is not None and a.source is not None and b.source is not None:
            # modules are guarded by type, not identity (tracer._wrap_module): keep them apart
            tx.guards.same_object(a.source, b.source, same=False)
        return same
    fns = [v for v in (a, b) if _known_callable(v)]
    if len(fns) == 2:  # functions known at compile time (their sources are guarded): torch's too,
        return fns[0].fn is fns[1].fn  # as in ``f is not torch.fmod`` over a table of ops
    if len(fns) == 1 and isinstance(b if fns[0] is a else a, ConstantVariable):
        # a constant may hold a class or a function itself (``type(name) is str``: type() of
        # a constant is the constant ``str``, the global ``str`` a builtin tracker)
        return fns[0].fn is (b if fns[0] is a else a).value
    kinds = (ConstantVariable, TensorVariable, _Sequence, DictVariable, ModuleVariable)
    if isinstance(a, kinds) and isinstance(b, kinds):
        return False  # different trackers of different kinds, or distinct tensors
    if _unrelated_types(a, b):
        return False  # one object has one type: a dict is never a dataclass's sentinel object
    raise Unsupported(f"`is` between {a} and {b} is not supported")


def _known_callable(v) -> bool:
    if isinstance(v, FunctionVariable):
        return v.self_var is None and v.fn is not None
    return isinstance(v, (TorchFunctionVariable, BuiltinVariable))


def _unrelated_types(a, b) -> bool:
    try:
        ta, tb = a.python_type(), b.python_type()
    except Exception:  # noqa: BLE001 - a tracker that cannot say: no answer from types
        return False
    return isinstance(ta, type) and isinstance(tb, type) and not (
        issubclass(ta, tb) or issubclass(tb, ta))


def _identical_made_functions(a, b, tx) -> bool:
    """``is`` with a function guarded by code (a new object per call): whether both sources
    hold the same object becomes a guard; a constant is never such a function."""
    if isinstance(a, ConstantVariable) or isinstance(b, ConstantVariable):
        return False
    if a is b:
        return True
    if tx is None or a.source is None or b.source is None:
        raise Unsupported(f"`is` between {a} and {b} is not supported")
    same = getattr(a, "fn", None) is getattr(b, "fn", None)
    tx.guards.same_object(a.source, b.source, same)
    return same


@handler("CONTAINS_OP")
def contains_op(frame, inst):
    container, item = frame.pop(), frame.pop()
    if type(container) in (ListVariable, TupleVariable) and holds_tensors(container, item):
        found = sequence_contains(frame.tx, container, item)  # a constant, or a bool number
        frame.push(negate(frame.tx, found) if inst.arg else found)
        return
    if isinstance(container, DictVariable) and not hasattr(container, "contains"):
        found = dict_key(frame.tx, item, container.items) in container.items
    elif hasattr(container, "contains"):  # a dict subclass's or user object's __contains__
        found = container.contains(frame.tx, item)
    else:
        found = item.as_python() in container.as_python()
    frame.push(ConstantVariable(found != bool(inst.arg)))


# ---------------------------------------------------------------- containers
@handler("BUILD_TUPLE")
def build_tuple(frame, inst):
    frame.push(TupleVariable(frame.popn(inst.arg)))


@handler("BUILD_LIST")
def build_list(frame, inst):
    frame.push(ListVariable(frame.popn(inst.arg)))


@handler("BUILD_MAP")
def build_map(frame, inst):
    flat = frame.popn(2 * inst.arg)
    items = {}
    for i in range(0, len(flat), 2):
        items[dict_key(frame.tx, flat[i], items)] = flat[i + 1]
    frame.push(DictVariable(items))


@handler("BUILD_CONST_KEY_MAP")
def build_const_key_map(frame, inst):
    keys = frame.pop().as_python()
    values = frame.popn(inst.arg)
    frame.push(DictVariable(dict(zip(keys, values))))


@handler("BUILD_SLICE")
def build_slice(frame, inst):
    parts = [v.as_python() for v in frame.popn(inst.arg)]
    frame.push(ConstantVariable(slice(*parts)))


@handler("BUILD_STRING")
def build_string(frame, inst):
    frame.push(ConstantVariable("".join(v.as_python() for v in frame.popn(inst.arg))))


@handler("FORMAT_VALUE")
def format_value(frame, inst):
    spec = frame.pop().as_python() if inst.arg & 0x04 else ""
    value = frame.pop().as_python()
    conv = {1: str, 2: repr, 3: ascii}.get(inst.arg & 0x03)
    frame.push(ConstantVariable(format(conv(value) if conv else value, spec)))


@handler("LIST_APPEND")
def list_append(frame, inst):
    v = frame.pop()
    frame.stack[-inst.arg].items.append(v)


@handler("LIST_EXTEND")
def list_extend(frame, inst):
    seq = frame.pop()
    frame.stack[-inst.arg].items.extend(seq.iterate(frame.tx))


@handler("DICT_MERGE", "DICT_UPDATE")
def dict_merge(frame, inst):
    update = frame.pop()
    if not isinstance(update, DictVariable):
        raise Unsupported(f"{inst.opname} with {update}")
    target = frame.stack[-inst.arg]
    items = update.merged_items()
    if inst.opname == "DICT_MERGE" and set(target.items) & set(items):
        raise Unsupported("duplicate keyword argument")
    merge_items(frame.tx, target.items, items)


@handler("LIST_TO_TUPLE", versions=((3, 11), (3, 11)))
def list_to_tuple(frame, inst):
    frame.push(TupleVariable(frame.pop().items))


@handler("CALL_INTRINSIC_1", versions=((3, 12), (3, 12)))
def call_intrinsic_1(frame, inst):
    if inst.argrepr == "INTRINSIC_LIST_TO_TUPLE":
        frame.push(TupleVariable(frame.pop().items))
    elif inst.argrepr == "INTRINSIC_UNARY_POSITIVE":
        frame.push(frame.tx.unary_op("+", frame.pop()))
    else:
        raise Unsupported(f"CALL_INTRINSIC_1 {inst.argrepr} is not supported")


@handler("UNPACK_SEQUENCE")
def unpack_sequence(frame, inst):
    items = frame.pop().iterate(frame.tx)
    if len(items) != inst.arg:
        raise Unsupported(f"cannot unpack {len(items)} values into {inst.arg}")
    frame.stack.extend(reversed(items))


@handler("UNPACK_EX")
def unpack_ex(frame, inst):
    before, after = inst.arg & 0xFF, inst.arg >> 8
    items = frame.pop().iterate(frame.tx)
    if len(items) < before + after:
        raise Unsupported(f"cannot unpack {len(items)} values into {before} + {after}")
    middle = ListVariable(items[before:len(items) - after])
    frame.stack.extend(reversed(items[len(items) - after:]))
    frame.push(middle)
    frame.stack.extend(reversed(items[:before]))


@handler("BINARY_SUBSCR")
def binary_subscr(frame, inst):
    key, container = frame.pop(), frame.pop()
    frame.push(frame.tx.getitem(container, key))


@handler("BINARY_SLICE", versions=((3, 12), (3, 12)))
def binary_slice(frame, inst):
    end, start, container = frame.pop(), frame.pop(), frame.pop()
    key = ConstantVariable(slice(start.as_python(), end.as_python()))
    frame.push(frame.tx.getitem(container, key))


@handler("STORE_SUBSCR")
def store_subscr(frame, inst):
    key, container, value = frame.pop(), frame.pop(), frame.pop()
    if isinstance(container, TensorVariable):  # functionalized (kiln/capture/mutation.py)
        frame.tx.setitem(container, key, value)
        return
    if _python_override(frame, container, "__setitem__", [key, value]):
        return
    if hasattr(container, "setitem"):  # a ModelOutput made during the trace
        container.setitem(key.as_python(), value)
        return
    if not isinstance(container, (ListVariable, DictVariable)):
        raise Unsupported(f"item assignment on {container} is not supported")
    frame.tx.side_effects.mutate(container)  # replayed when it came from the inputs
    k = dict_key(frame.tx, key, container.items) if isinstance(container, DictVariable) \
        else key.as_python()
    if isinstance(container, ListVariable) and isinstance(k, slice):
        container.items[k] = value.iterate(frame.tx)
    else:
        container.items[k] = value


def _python_override(frame, container, name, args) -> bool:
    """A dict subclass's own ``__setitem__``/``__delitem__``: inlined (True when it ran)."""
    lookup = getattr(container, "python_override", None)
    fn = lookup(name) if lookup is not None else None
    if fn is None:
        return False
    fn.call(frame.tx, args, {})
    return True


@handler("DELETE_SUBSCR")
def delete_subscr(frame, inst):
    key, container = frame.pop(), frame.pop()
    if _python_override(frame, container, "__delitem__", [key]):
        return
    if not isinstance(container, (ListVariable, DictVariable)):
        raise Unsupported(f"item deletion on {container} is not supported")
    frame.tx.side_effects.mutate(container)
    k = dict_key(frame.tx, key, container.items) if isinstance(container, DictVariable) \
        else key.as_python()
    try:
        del container.items[k]
    except (KeyError, IndexError):
        raise Unsupported(f"del of missing item {k!r}") from None


# ---------------------------------------------------------------- imports
@handler("IMPORT_NAME")
def import_name(frame, inst):
    # Pops fromlist and level, pushes what __import__ returns; only modules that are already
    # imported (importing for real would run a module's code during capture).
    fromlist, level = frame.pop().as_python(), frame.pop().as_python()
    import importlib.util
    name = inst.argval
    if level:
        name = importlib.util.resolve_name("." * level + name, frame.globals.get("__package__") or "")
    if name not in sys.modules:
        raise Unsupported(f"import of {name!r}, which is not imported yet")
    top = name if fromlist else name.partition(".")[0]
    frame.push(frame.tx.wrap(sys.modules[top], ModuleSource(top), guard=False))


@handler("IMPORT_FROM")
def import_from(frame, inst):
    module = frame.stack[-1]
    frame.push(module.getattr(frame.tx, inst.argval))


# ---------------------------------------------------------------- sets
@handler("BUILD_SET")
def build_set(frame, inst):
    frame.push(SetVariable(frame.popn(inst.arg)))


@handler("SET_ADD")
def set_add(frame, inst):
    v = frame.pop()
    frame.stack[-inst.arg].add(v)


@handler("SET_UPDATE")
def set_update(frame, inst):
    seq = frame.pop()
    target = frame.stack[-inst.arg]
    for v in seq.iterate(frame.tx):
        target.add(v)


@handler("MAP_ADD")
def map_add(frame, inst):
    value, key = frame.pop(), frame.pop()
    target = frame.stack[-inst.arg]
    target.items[dict_key(frame.tx, key, target.items)] = value


# ---------------------------------------------------------------- generators
# A generator called during capture runs to its end at once (tracer.inline_call): each
# YIELD_VALUE appends to ``frame.yielded`` and resumes with None, as ``next()`` would send.
@handler("RETURN_GENERATOR")
def return_generator(frame, inst):
    if getattr(frame, "yielded", None) is None:
        raise Unsupported("RETURN_GENERATOR outside a generator call")
    frame.push(ConstantVariable(None))  # the value the first resume sends; POP_TOP drops it


@handler("YIELD_VALUE")
def yield_value(frame, inst):
    if getattr(frame, "yielded", None) is None:
        raise Unsupported("yield outside a generator call")
    if getattr(frame, "suspend_at_yield", False):  # a context manager's body: stop here
        frame.suspend_at_yield = False
        frame.return_value = frame.pop()  # what __enter__ returns (run() stops on it)
        return
    frame.yielded.append(frame.pop())
    frame.push(ConstantVariable(None))


# ---------------------------------------------------------------- super (3.12)
@handler("LOAD_SUPER_ATTR", versions=((3, 12), (3, 12)))
def load_super_attr(frame, inst):
    # Pops self, the class and the global `super`; the low arg bit asks for a method load
    # (NULL + bound method here, as LOAD_ATTR), bit 1 marks the two-argument form.
    self_var, cls_var, super_fn = frame.pop(), frame.pop(), frame.pop()
    del super_fn
    attr = SuperVariable(cls_var.as_python(), self_var).getattr(frame.tx, inst.argval)
    if inst.arg & 1:
        frame.push(NULL)
    frame.push(attr)


@handler("STORE_SLICE", versions=((3, 12), (3, 12)))
def store_slice(frame, inst):
    end, start, container, value = frame.pop(), frame.pop(), frame.pop(), frame.pop()
    if not isinstance(container, TensorVariable):
        raise Unsupported(f"slice assignment on {container} is not supported")
    key = ConstantVariable(slice(start.as_python(), end.as_python()))
    frame.tx.setitem(container, key, value)
