"""Meta propagation over a graph: every node gets meta['val'] from its op's meta rule."""
from __future__ import annotations

from kiln.graph.node import CALL, map_args
from kiln.graph.registry import META_RULES


def propagate_meta(graph, input_metas=None):
    """Recompute meta['val'] for every call node (placeholders take input_metas if given)."""
    if input_metas is not None:
        for node, meta in zip(graph.placeholders, input_metas):
            node.meta["val"] = meta
    for node in graph.nodes:
        if node.op != CALL:
            continue
        args = map_args(node.args, lambda n: n.meta["val"])
        kwargs = map_args(node.kwargs, lambda n: n.meta["val"])
        try:
            node.meta["val"] = META_RULES[node.target](*args, **kwargs)
        except Exception as e:
            raise type(e)(f"[meta] while computing {node.name} = {node.target!r}: {e}") from e
    return graph
