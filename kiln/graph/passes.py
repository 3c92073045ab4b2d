"""Graph -> Graph passes: dead-code elimination and common-subexpression elimination."""
from __future__ import annotations

import math

from kiln.graph.graph import Graph
from kiln.graph.node import CALL, GET_ATTR, OUTPUT, Node


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


def _output_bases(graph: Graph) -> set:
    """The nodes whose memory a graph output is (the output, or the base its views start from)."""
    bases = set()
    if not graph.nodes or graph.nodes[-1].op != OUTPUT:
        return bases
    for out in graph.output_node.args[0]:
        while isinstance(out, Node) and out.op == CALL and getattr(out.target, "view", False) \
                and out.args and isinstance(out.args[0], Node):
            out = out.args[0]
        if isinstance(out, Node):
            bases.add(out)
    return bases


def cse(graph: Graph) -> Graph:
    """Merge calls with the same op and arguments. Random ops are never merged, nor two calls
    that are the memory of two outputs: eager returns two tensors (torch.optim's ``zeros(())``
    step counter of each parameter), which merged would be one, a write to one seen by both."""
    seen: dict = {}
    bases = _output_bases(graph)
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
        elif node in bases and prev in bases:
            continue
        else:
            node.replace_all_uses_with(prev)
            graph.erase(node)
    return graph
