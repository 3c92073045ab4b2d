"""The graph verifier, run at stage boundaries under ``config.verify``."""
from __future__ import annotations

from kiln.graph.graph import Graph
from kiln.graph.node import CALL, GET_ATTR, OUTPUT, PLACEHOLDER
from kiln.graph.registry import Op


class GraphVerificationError(AssertionError):
    pass


def verify(graph: Graph, vocabulary: tuple[str, ...] | None = None) -> Graph:
    """Check structure: defs before uses, use lists in sync, one output last, metas present,
    and (optionally) every call's op in the allowed namespaces. Errors print the graph."""
    defined = set()
    names = set()

    def fail(node, msg):
        raise GraphVerificationError(f"[verify] {graph.name}: {node.name}: {msg}\n{graph.python()}")

    for i, node in enumerate(graph.nodes):
        if node.name in names:
            fail(node, "duplicate node name")
        names.add(node.name)
        if node.graph is not graph:
            fail(node, "node belongs to another graph")
        for inp in node.inputs():
            if inp not in defined:
                fail(node, f"reads {inp.name} before it is defined")
            if node not in inp.users:
                fail(node, f"is missing from the users of {inp.name}")
        if node.op == OUTPUT:
            if i != len(graph.nodes) - 1:
                fail(node, "output is not the last node")
            continue
        if node.op == CALL:
            if not isinstance(node.target, Op):
                fail(node, f"target {node.target!r} is not an op")
            if vocabulary and node.target.namespace not in vocabulary + ("graph",):
                fail(node, f"op {node.target!r} is outside the vocabulary {vocabulary}")
        elif node.op not in (PLACEHOLDER, GET_ATTR):
            fail(node, f"unknown node kind {node.op}")
        if "val" not in node.meta:
            fail(node, "has no meta['val']")
        defined.add(node)
    if not graph.nodes or graph.nodes[-1].op != OUTPUT:
        raise GraphVerificationError(f"[verify] {graph.name}: graph has no output node")
    return graph
