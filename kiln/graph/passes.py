"""Graph -> Graph passes: dead-code elimination and common-subexpression elimination."""
from __future__ import annotations

import math

from kiln.graph.graph import Graph
from kiln.graph.node import CALL, GET_ATTR, Node


def dce(graph: Graph) -> Graph:
    """Remove calls whose results nobody reads. Every op in kiln's vocabularies is pure."""
    for node in reversed(list(graph.nodes)):
        if node.op in (CALL, GET_ATTR) and not node.users:
            graph.erase(node)
    return graph


def _key(obj):
    if isinstance(obj, Node):
        return ("node", id(obj))
    if isinstance(obj, (tuple, list)):
        return (type(obj).__name__,) + tuple(_key(x) for x in obj)
    if isinstance(obj, dict):
        return ("dict",) + tuple((k, _key(v)) for k, v in sorted(obj.items()))
    if isinstance(obj, float) and obj != obj:
        return ("nan",)
    if isinstance(obj, float) and obj == 0.0:
        return ("zero", math.copysign(1.0, obj))  # 0.0 == -0.0, but x / 0.0 != x / -0.0
    return (type(obj).__name__, obj)


def cse(graph: Graph) -> Graph:
    """Merge calls with the same op and arguments. Random ops are never merged."""
    seen: dict = {}
    for node in list(graph.nodes):
        if node.op != CALL or getattr(node.target, "random", False):
            continue
        key = (node.target, _key(node.args), _key(node.kwargs))
        try:
            hash(key)
        except TypeError:
            continue
        prev = seen.get(key)
        if prev is None:
            seen[key] = node
        else:
            node.replace_all_uses_with(prev)
            graph.erase(node)
    return graph
