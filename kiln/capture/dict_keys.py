"""The keys of dicts built or changed in the traced code.

A dict tracker (``DictVariable.items``) files its values under hashable keys: Python
constants by value (``key.as_python()``), and tensors, which hash and compare by identity in
Python (``{a_param: 3}``), by their tracker. Only tensors that are graph inputs can be keys:
the tracer keeps one ``TensorVariable`` per input tensor object (``Tracer._wrap_tensor``), so
one tracker is one object for the whole trace, and its identity is what the key is. A tensor
made in the trace is a graph break as a key (an in-place op's result is the same object as
its operand in eager, which the trackers do not say).

Two distinct input trackers hold distinct objects at trace time, but the next call may pass
one object for both (``f(x, x)``), which would merge two keys, or turn a miss into a hit.
So each time a tensor key meets a dict, the decision made between it and every other tensor
key there (distinct keys, a lookup that misses) is guarded: ``{} is not <other source>``, as
``is`` between two modules is (interpreter_ops._identical).
"""
from __future__ import annotations

import torch

from kiln.capture.errors import Unsupported
from kiln.capture.guards import Source


class TensorKey:
    """An input tensor as a key of a dict tracker: equal only to itself (its tracker)."""
    __slots__ = ("var",)

    def __init__(self, var):
        self.var = var

    def __hash__(self):
        return id(self.var)

    def __eq__(self, other):
        return isinstance(other, TensorKey) and other.var is self.var

    def __repr__(self):
        return f"TensorKey({self.var.source.expr()})"


def dict_key(tx, var, items=None):
    """The key ``var`` is filed under in a dict tracker whose items are ``items`` (given for
    a lookup or an insertion: the distinctness of its tensor keys from ``var`` is guarded)."""
    from kiln.capture.values import TensorVariable
    if not isinstance(var, TensorVariable):
        return var.as_python()
    if tx is None or not _is_input(tx, var):
        raise Unsupported("a tensor computed in the traced code as a dict key is not supported "
                          "(only input tensors, hashed by identity)")
    key = TensorKey(var)
    for other in items or ():
        if isinstance(other, TensorKey) and other.var is not var:
            tx.guards.add(var.source, f"{{}} is not {other.var.source.expr()}")
    return key


def _is_input(tx, var) -> bool:
    if var.source is None:
        return False
    return any(v is var for v, _, _ in tx._tensor_inputs.values())


def key_variable(tx, key):
    """A key of a dict tracker as a value (iterating the dict, its keys, its items)."""
    from kiln.capture.values import ConstantVariable, is_constant
    if isinstance(key, TensorKey):
        return key.var
    return ConstantVariable(key) if is_constant(key) or tx is None else tx.wrap(key, None)


def has_tensor_keys(items) -> bool:
    return any(isinstance(k, TensorKey) for k in items)


def merge_items(tx, target: dict, new: dict):
    """``target.update(new)`` between two dict trackers' items, guarding that their distinct
    tensor keys stay distinct objects."""
    if has_tensor_keys(new):
        for k in new:
            if isinstance(k, TensorKey):
                dict_key(tx, k.var, target)
    target.update(new)


# ---------------------------------------------------------------- a real dict's tensor keys
class DictKeyAtSource(Source):
    """The key at position ``index`` of a dict (its guard fixes the keys' order first)."""
    __slots__ = ("parent", "index")

    def __init__(self, parent, index):
        self.parent, self.index = parent, index

    def expr(self, base=None):
        return f"list({base or self.parent.expr()})[{self.index}]"


def is_tensor_key(key) -> bool:
    return type(key) in (torch.Tensor, torch.nn.Parameter)


def wrap_key(tx, key, source, index, guard=True):
    """A key of a real dict the trace reaches (an input, or one a break's glue built): a
    tensor is wrapped as the input it is, read through ``list(d)[i]`` (keys of one real dict
    are distinct objects, as their hash is identity); any other key stays itself."""
    if not is_tensor_key(key):
        return key
    if source is None:
        raise Unsupported("a dict keyed by a tensor reached without a source")
    return TensorKey(tx.wrap(key, DictKeyAtSource(source, index), guard))


# ---------------------------------------------------------------- leaving the trace
def load_key(builder, key):
    """A break's glue pushing one key of a dict it builds again: a tensor key is its input."""
    from kiln.capture.resume import Instr
    if isinstance(key, TensorKey):
        builder.load(key.var)
    else:
        builder.emit(Instr("LOAD_CONST", key))


def key_spec(key):
    """The output spec of a key (rebuild.py): a tensor key is read again from its source, the
    input object itself, never a graph output (a graph may hand back a copy)."""
    if isinstance(key, TensorKey):
        from kiln.capture.side_effects import _accessor
        return ("source", _accessor(key.var.source))
    return ("const", key)


def keyed_dict_spec(v, proxies, spec_of):
    """A returned dict keyed by tensors: its type, key specs and value specs."""
    return ("keyed_dict", v.python_type(), [key_spec(k) for k in v.items],
            [spec_of(x, proxies) for x in v.items.values()])


def build_keyed_dict(spec, build):
    return spec[1]((build(k), build(x)) for k, x in zip(spec[2], spec[3]))


def refuse_tensor_keys(items, what: str):
    """A break where a dict keyed by tensors would leave the trace in a way that cannot say
    its keys' identity."""
    if has_tensor_keys(items):
        raise Unsupported(f"{what} a dict keyed by a tensor is not supported")


__all__ = ["TensorKey", "DictKeyAtSource", "is_tensor_key", "wrap_key", "dict_key", "key_variable", "has_tensor_keys", "merge_items",
           "load_key", "key_spec", "keyed_dict_spec", "build_keyed_dict", "refuse_tensor_keys"]
