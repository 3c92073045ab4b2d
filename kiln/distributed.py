"""kiln.compile for a model wrapped in ``torch.nn.parallel.DistributedDataParallel``.

Collectives stay outside kiln's graphs. DDP's forward is Python bookkeeping (buffer broadcast,
``reducer.prepare_for_backward``) and its gradient all-reduce runs in autograd hooks on the
parameters' gradient accumulators, so kiln compiles the *inner* module's forward and lets DDP's
own forward run around it, untouched (``CompiledDDP``).

One compiled graph would have one backward node: every parameter's gradient would appear at the
very end of the backward, every bucket would become ready at once, and no all-reduce could overlap
the backward. So the captured forward graph is split at DDP bucket boundaries
(``split_at_buckets``): walking the graph backwards (the order DDP fills its buckets, reverse
parameter order), a new piece starts at the first node that brings in a parameter once the
current piece holds ``bucket_bytes_cap`` bytes of parameters. Each piece is compiled on its own
(with its own forward/backward pair), so in the backward, the last piece's backward finishes, its
parameters' gradients accumulate, DDP's hooks fire and that bucket's all-reduce starts while the
earlier pieces' backwards still run.

Values crossing a boundary are passed contiguous (the next piece is compiled for contiguous
inputs). Graphs with symbolic sizes or input mutations are not split (they compile whole, which
is correct, only without the overlap).
"""
from __future__ import annotations

import torch

from kiln import api, context, counters, log, pipeline
from kiln.api import CompiledFunction, CompiledModule
from kiln.graph.graph import Graph, getitem
from kiln.graph.node import CALL, GET_ATTR, PLACEHOLDER, Node, map_args
from kiln.meta.symbolic import free_symbols
from kiln.meta.tensor_meta import TensorMeta


def is_ddp(module) -> bool:
    if not torch.distributed.is_available():
        return False
    from torch.nn.parallel import DistributedDataParallel
    return isinstance(module, DistributedDataParallel)


# ---------------------------------------------------------------------------- the split
class Piece:
    """One subgraph of a split: its graph, the original nodes it reads (in placeholder order)
    and the original nodes it produces (in output order)."""
    __slots__ = ("graph", "inputs", "outputs", "param_bytes", "compiled")

    def __init__(self, graph: Graph, inputs: list, outputs: list, param_bytes: int):
        self.graph = graph
        self.inputs = inputs
        self.outputs = outputs
        self.param_bytes = param_bytes
        self.compiled = None


def _is_param(node: Node) -> bool:
    val = node.meta.get("val")
    return node.op == PLACEHOLDER and isinstance(val, TensorMeta) and val.requires_grad


def _nbytes(meta: TensorMeta) -> int:
    return meta.numel() * meta.dtype.itemsize


def bucket_assignment(graph: Graph, bucket_bytes_cap: int) -> tuple[dict, list]:
    """node -> piece index (0 first in forward order) for every call and get_attr node, and the
    parameter bytes of each piece. Assignments never decrease along the graph's order, so every
    node's inputs come from its own piece or an earlier one."""
    body = [n for n in graph.nodes if n.op in (CALL, GET_ATTR)]
    bucket, filled, seen = 0, [0], set()
    reverse: dict = {}
    for node in reversed(body):
        new = [p for p in node.inputs() if _is_param(p) and p not in seen]
        if new and filled[bucket] >= bucket_bytes_cap:
            bucket += 1
            filled.append(0)
        for p in new:
            seen.add(p)
            filled[bucket] += _nbytes(p.meta["val"])
        reverse[node] = bucket
    last = bucket
    assign = {n: last - b for n, b in reverse.items()}
    for node in body:  # a tuple element stays with the op that made the tuple
        if node.op == CALL and node.target is getitem:
            assign[node] = assign[node.args[0]]
    return assign, list(reversed(filled))


def split_at_buckets(graph: Graph, bucket_bytes_cap: int) -> list[Piece] | None:
    """The pieces of ``graph`` at DDP bucket boundaries, or None when it stays whole (one
    bucket, symbolic sizes, input mutations, or a non-tensor value crossing a boundary)."""
    if getattr(graph, "input_mutations", None):
        return _whole(graph, "it writes into its inputs")
    if _symbolic([n.meta.get("val") for n in graph.placeholders]):
        return _whole(graph, "it has symbolic sizes")
    assign, param_bytes = bucket_assignment(graph, bucket_bytes_cap)
    count = len(param_bytes)
    if count <= 1:
        return None
    members: list[list[Node]] = [[] for _ in range(count)]
    for node in graph.nodes:
        if node.op == CALL:
            members[assign[node]].append(node)
    # which original nodes each piece reads and which later pieces (or the output) need
    needed_from: list[dict] = [{} for _ in range(count)]
    reads: list[dict] = [{} for _ in range(count)]
    for i, nodes in enumerate(members):
        for node in nodes:
            for inp in node.inputs():
                if inp.op == PLACEHOLDER or (inp.op == CALL and assign[inp] != i):
                    reads[i][inp] = None
                if inp.op == CALL and assign[inp] != i:
                    needed_from[assign[inp]][inp] = None
    for leaf in _output_leaves(graph):
        if leaf.op == CALL:
            needed_from[assign[leaf]][leaf] = None
    for i in range(count):
        for node in needed_from[i]:
            val = node.meta.get("val")
            if not isinstance(val, TensorMeta) or _symbolic([val]):
                return _whole(graph, f"{node.name} ({val!r}) would cross a piece boundary")
    pieces = []
    for i, nodes in enumerate(members):
        if not needed_from[i]:
            continue  # computes nothing anyone reads
        pieces.append(_build_piece(graph, i, nodes, list(reads[i]), list(needed_from[i]), param_bytes[i]))
    return pieces if len(pieces) > 1 else None


def _symbolic(metas) -> bool:
    return bool(free_symbols([m for m in metas if isinstance(m, TensorMeta)]))


def _whole(graph: Graph, why: str):
    log.log("graph", "DDP split: %s stays one graph: %s", graph.name, why)
    return None


def _output_leaves(graph: Graph) -> list:
    leaves = []
    map_args(graph.output_node.args[0], leaves.append)
    return leaves


def _build_piece(graph: Graph, index: int, nodes: list, inputs: list, outputs: list, param_bytes: int) -> Piece:
    g = Graph(f"{graph.name}_ddp{index}")
    env: dict = {}
    for inp in inputs:
        val = inp.meta["val"]
        if inp.op == CALL:  # crosses from an earlier piece: passed contiguous (see _SplitRunner)
            val = TensorMeta.contiguous(val.shape, val.dtype, val.device, val.requires_grad)
        env[inp] = g.placeholder(inp.name, val)
    for node in nodes:
        for inp in node.inputs():
            if inp.op == GET_ATTR and inp not in env:  # constants are copied into each piece
                env[inp] = g.get_attr(inp.target, graph.constants[inp.target])
        new = g.create_node(node.target, map_args(node.args, env.__getitem__),
                            map_args(node.kwargs, env.__getitem__), name=node.name)
        new.meta.update(node.meta)
        env[node] = new
    g.output(tuple(env[n] for n in outputs))
    return Piece(g, inputs, outputs, param_bytes)


# ---------------------------------------------------------------------------- compile and run
class SplitGraph:
    """Runs the compiled pieces in order; each piece's outputs feed the later ones. Its
    attributes add up the pieces' (explain and the debug dump read them)."""

    def __init__(self, graph: Graph, pieces: list[Piece]):
        self.graph_name = graph.name
        self.pieces = pieces
        self.placeholders = graph.placeholders
        self.output_spec = graph.output_node.args[0]
        self.constants = {n: graph.constants[n.target] for n in graph.nodes if n.op == GET_ATTR}
        self.graph_count = len(pieces)
        self.kernel_count = sum(getattr(p.compiled, "kernel_count", 0) for p in pieces)
        self.extern_count = sum(getattr(p.compiled, "extern_count", 0) for p in pieces)
        sources = [getattr(p.compiled, "wrapper_source", None) for p in pieces]
        self.wrapper_source = "\n\n".join(s for s in sources if s) or None

    def __call__(self, *inputs):
        env = dict(zip(self.placeholders, inputs))
        env.update(self.constants)
        for piece in self.pieces:
            args = [env[n] if n.op == PLACEHOLDER else _contiguous(env[n]) for n in piece.inputs]
            outs = piece.compiled(*args)
            env.update(zip(piece.outputs, outs))
        return map_args(self.output_spec, env.__getitem__)


def _contiguous(t):
    return t if t.is_contiguous() else t.contiguous()


def compile_split(graph: Graph, backend: str, bucket_bytes_cap: int):
    """``pipeline.compile_graph`` for a DDP module's forward: the graph split at bucket
    boundaries, each piece compiled on its own (one autograd node each)."""
    pieces = split_at_buckets(graph, bucket_bytes_cap) if torch.is_grad_enabled() else None
    if pieces is None:
        return pipeline.compile_graph(graph, backend)
    ctx = context.current()
    for i, piece in enumerate(pieces):
        if ctx is not None:
            ctx.record("distributed", f"ddp_piece_{i}", piece.graph)
        piece.compiled = pipeline.compile_graph(piece.graph, backend)
    log.log("graph", "DDP split: %s compiled as %d graphs (bucket cap %d bytes; parameter bytes %s)",
            graph.name, len(pieces), bucket_bytes_cap, [p.param_bytes for p in pieces])
    counters.bump("graphs_compiled", len(pieces) - 1)  # the caller counts one
    counters.bump("ddp_graphs", len(pieces))
    return SplitGraph(graph, pieces)


# ---------------------------------------------------------------------------- the module
def _ddp_bucket_cap(ddp, options: dict) -> int | None:
    """DDP's own ``bucket_bytes_cap``, unless ``options`` says ``ddp_bucket_bytes`` (a cap of
    its own) or ``ddp_split=False`` (one graph)."""
    if options.get("ddp_split") is False:
        return None
    cap = options.get("ddp_bucket_bytes", getattr(ddp, "bucket_bytes_cap", None))
    return None if cap is None else int(cap)


class CompiledDDP(CompiledModule):
    """DDP's forward in Python around the inner module's compiled forward. Shares every
    parameter and buffer (it holds the DDP module as ``_orig_mod``); the inner module runs
    compiled only inside this wrapper's calls, the DDP module itself is left as it was."""

    wrapper_attributes = CompiledModule.wrapper_attributes | {"bucket_bytes_cap"}

    def __init__(self, ddp, **opts):
        torch.nn.Module.__init__(self)
        self._orig_mod = ddp
        self._kiln_opts = opts
        self._compiled_forward = CompiledFunction(ddp.module.forward, **opts)
        self.bucket_bytes_cap = _ddp_bucket_cap(ddp, dict(opts.get("options") or {}))
        if self.bucket_bytes_cap is not None:
            backend, cap = opts.get("backend", "kiln"), self.bucket_bytes_cap
            self._compiled_forward.compile_graph = lambda graph, _b=backend: compile_split(graph, _b, cap)

    def forward(self, *args, **kwargs):
        inner = self._orig_mod.module
        had = inner.__dict__.get("forward")
        inner.__dict__["forward"] = self._compiled_forward  # DDP calls self.module(...)
        try:
            return self._orig_mod(*args, **kwargs)
        finally:
            if had is None:
                inner.__dict__.pop("forward", None)
            else:
                inner.__dict__["forward"] = had


api.register_model_wrapper(is_ddp, CompiledDDP)  # kiln.compile(ddp) (api.MODEL_WRAPPERS)
