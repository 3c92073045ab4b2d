"""Node: one operation in a Graph. Small, slotted, no hidden state; analyses write to meta."""
from __future__ import annotations

PLACEHOLDER, CALL, OUTPUT, GET_ATTR = "placeholder", "call", "output", "get_attr"
NODE_OPS = (PLACEHOLDER, CALL, OUTPUT, GET_ATTR)


class Node:
    __slots__ = ("graph", "name", "op", "target", "args", "kwargs", "meta", "users")

    def __init__(self, graph, name, op, target, args=(), kwargs=None, meta=None):
        assert op in NODE_OPS, op
        self.graph = graph
        self.name = name
        self.op = op
        self.target = target
        self.args = tuple(args)
        self.kwargs = dict(kwargs or {})
        self.meta = dict(meta or {})
        self.users: dict[Node, None] = {}
        for inp in self.inputs():
            inp.users[self] = None

    def inputs(self):
        """The nodes this node reads, in argument order, without repeats."""
        seen: dict = {}
        _collect_nodes(self.args, seen)
        _collect_nodes(self.kwargs, seen)
        return list(seen)

    @property
    def val(self):
        return self.meta.get("val")

    def replace_all_uses_with(self, other: "Node"):
        for user in list(self.users):
            user.args = map_args(user.args, lambda n: other if n is self else n)
            user.kwargs = map_args(user.kwargs, lambda n: other if n is self else n)
            other.users[user] = None
        self.users.clear()

    def __repr__(self):
        return f"%{self.name}"


def flatten_args(obj):
    """Yield the leaves of nested tuples/lists/dicts."""
    if isinstance(obj, (tuple, list)):
        for x in obj:
            yield from flatten_args(x)
    elif isinstance(obj, dict):
        for x in obj.values():
            yield from flatten_args(x)
    else:
        yield obj


def _collect_nodes(obj, out: dict):
    """The Node leaves of nested tuples/lists/dicts into ``out``, in order (plain recursion:
    a chain of generators cost a compile's graph passes a third of their time)."""
    for x in (obj.values() if isinstance(obj, dict) else obj):
        if type(x) is Node:
            out[x] = None
        elif isinstance(x, (tuple, list, dict)):
            _collect_nodes(x, out)


_LEAF_TYPES = (int, float, bool, str, type(None))


def map_args(obj, fn):
    """Apply fn to every Node leaf of nested tuples/lists/dicts."""
    if type(obj) is Node:
        return fn(obj)
    if isinstance(obj, tuple):
        return tuple([x if type(x) in _LEAF_TYPES else map_args(x, fn) for x in obj])
    if isinstance(obj, list):
        return [x if type(x) in _LEAF_TYPES else map_args(x, fn) for x in obj]
    if isinstance(obj, dict):
        return {k: map_args(v, fn) for k, v in obj.items()}
    if isinstance(obj, Node):
        return fn(obj)
    return obj
