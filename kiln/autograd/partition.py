"""The partitioner: a joint graph becomes a forward graph and a backward graph.

    forward(<primals...>)            -> (<user outputs...>, <saved activations...>)
    backward(<saved...>, <tangents>) -> (<grads of the primals that require grad>)

Saved values that are primals (inputs, parameters) are not returned by the forward: the
runtime saves the input tensors themselves. ``Partition.saved`` lists every saved node.

Two strategies:

- ``save_all``: save every forward value that a VJP rule's node reads ("save what the backward
  needs"); the rules' nodes all run in the backward. Nothing is recomputed.
- ``min_cut`` (the default): choose the cheapest set of values to save such that everything the
  backward reads can be recomputed from them, with a max-flow/min-cut over the forward nodes
  (``maxflow.py``), as AOTAutograd's rematerializing partitioner does.

Cost model (what the cut minimizes): **the bytes kept alive between forward and backward**,
i.e. ``numel * element size`` of each saved tensor. (Charging a saved pointwise value more,
for the forward's extra write, was tried: the cut then recomputed whole residual streams in the
backward, and their normalized activations all ran in the backward's first kernel.) Saving a
primal costs its bytes like any other value (it is kept alive by the saved-tensor reference). Recomputation is taken to be free
for ops that fuse into the backward's kernels: elementwise core ops, dtype casts and views,
since they are inlined into the backward's own loops and only add arithmetic, not memory traffic.
Recomputation is banned (the value is computed in the forward, and saved if the backward needs
it) for ops whose recomputation costs real work or is not repeatable: library ops (mm,
linear), every reduction and normalization (sum, softmax, var, ...) and random ops.
Non-tensor values (tuples of multi-output ops) cannot be saved (infinite cost); their elements
can. Constants (get_attr) are never saved: the backward graph holds them too. Ties are broken
towards primals, then computed values, then views (``_capacity``).
"""
from __future__ import annotations

import dataclasses
import math

from kiln.autograd.joint import JointGraph, nbytes, strip_requires_grad
from kiln.graph.graph import Graph, getitem
from kiln.graph.node import CALL, GET_ATTR, PLACEHOLDER, Node, map_args
from kiln.meta.tensor_meta import TensorMeta

def recomputable(node: Node) -> bool:
    if node.op != CALL or node.target.random:
        return False
    # ``recompute=True`` on the op's define: cheap to recompute inside a fused backward kernel
    return node.target.recompute or node.target is getitem


@dataclasses.dataclass
class Partition:
    forward: Graph
    backward: Graph
    saved: list                 # joint Nodes saved for the backward, in joint-graph order
    saved_inputs: list          # per saved node: primal index, or None (returned by the forward)
    grad_input_indices: list    # primal index of each backward output
    num_user_outputs: int
    diff_outputs: list          # per user output: does it get a tangent
    strategy: str

    @property
    def saved_bytes(self) -> int:
        return sum(nbytes(n.meta["val"]) for n in self.saved)


def _tangent_dependent(joint: JointGraph) -> set:
    """The backward's nodes: those that read a tangent, and those a VJP rule placed in the
    backward on purpose (``meta['backward_only']``: attention's recomputed probabilities)."""
    dep = set(joint.tangent_nodes)
    for node in joint.graph.nodes:
        if node.op == CALL and (node.meta.get("backward_only") or any(i in dep for i in node.inputs())):
            dep.add(node)
    return dep


def _ancestors(roots, stop=frozenset()) -> set:
    seen = set()
    stack = [r for r in roots if isinstance(r, Node)]
    while stack:
        n = stack.pop()
        if n in seen:
            continue
        seen.add(n)
        if n in stop:
            continue
        stack.extend(n.inputs())
    return seen


def _backward_frontier(joint: JointGraph, bw_nodes: set) -> list:
    """The forward values the backward reads directly."""
    grads = [g for g in joint.grads if g is not None]
    needed_bw = _ancestors(grads) & bw_nodes
    frontier = {}
    for n in joint.graph.nodes:
        if n in needed_bw:
            for i in n.inputs():
                if i not in bw_nodes:
                    frontier[i] = None
        elif n in grads and n not in bw_nodes:  # a grad that does not depend on the tangents
            frontier[n] = None
    return [n for n in joint.graph.nodes if n in frontier]


def save_all(joint: JointGraph, bw_nodes: set) -> list:
    """The forward values that the VJP rules' nodes read (those nodes all run in the backward,
    even the ones that do not depend on the tangents)."""
    rule_nodes = {n for n in joint.graph.nodes if n.op == CALL and n.meta.get("joint") == "backward"
                  and n.target is not getitem}
    return [n for n in _backward_frontier(joint, bw_nodes | rule_nodes) if n.op != GET_ATTR]


def min_cut(joint: JointGraph, bw_nodes: set) -> list:
    frontier = _backward_frontier(joint, bw_nodes)
    if not frontier:
        return []
    from kiln.autograd.maxflow import FlowGraph, minimum_cut

    candidates = _ancestors(frontier) - bw_nodes
    order = [n for n in joint.graph.nodes if n in candidates]
    weights = {n: _capacity(n) if isinstance(n.meta.get("val"), TensorMeta) else None for n in order}
    inf = sum(w for w in weights.values() if w is not None) + 1  # more than every finite cut
    g = FlowGraph()
    source, sink = g.node(), g.node()
    ends = {n: (g.node(), g.node()) for n in order}  # (in, out): the value's edge between them
    for n in order:
        n_in, n_out = ends[n]
        g.edge(n_in, n_out, inf if weights[n] is None else weights[n])
        if n.op == GET_ATTR:  # a constant: the backward graph holds it too, never saved
            continue
        if n.op == PLACEHOLDER or not recomputable(n):
            g.edge(source, n_in, inf)
        for i in n.inputs():
            if i in ends:
                g.edge(ends[i][1], n_in, inf)
    for n in frontier:
        g.edge(ends[n][1], sink, inf)
    value, source_side = minimum_cut(g, source, sink)
    if value >= inf:
        raise RuntimeError("[autograd] min-cut partition: every cut saves a value that is not a tensor "
                           f"({[n.name for n in order if weights[n] is None]})")
    return [n for n in order if ends[n][0] in source_side and ends[n][1] not in source_side]


def _capacity(n: Node) -> int:
    """Bytes, scaled so that a tie-break term never outweighs one byte: between equally big
    values, save a primal (alive anyway) before a computed value, and a computed value before a
    view of one (a saved view would be copied out of the forward; its base recomputes it free)."""
    tie = 0 if n.op == PLACEHOLDER else (4 if n.op == CALL and n.target.view == "shape" else 1)
    return nbytes(n.meta["val"]) * 8 + tie


STRATEGIES = {"min_cut": min_cut, "save_all": save_all}


def _copy_nodes(dst: Graph, src: Graph, nodes, env: dict):
    for n in src.nodes:
        if n not in nodes or n in env:
            continue
        if n.op == GET_ATTR:
            env[n] = dst.get_attr(n.target, src.constants[n.target])
            continue
        if n.op != CALL:
            raise AssertionError(f"partition: {n.name} ({n.op}) is not available in {dst.name}")
        new = dst.create_node(n.target, map_args(n.args, env.__getitem__),
                              map_args(n.kwargs, env.__getitem__), name=n.name)
        new.meta.update(n.meta)
        new.meta["val"] = strip_requires_grad(n.meta["val"])
        env[n] = new


def partition(joint: JointGraph, strategy: str = "min_cut", name: str = "graph", saved=None) -> Partition:
    """``saved``: the strategy's answer for this joint graph, if known (the partition cache)."""
    if saved is None:
        saved = STRATEGIES[strategy](joint, _tangent_dependent(joint))
    saved_set = set(saved)
    primal_index = {p: i for i, p in enumerate(joint.primals)}

    # ---- forward: everything the user outputs and the saved values need
    fw = Graph(f"{name}_forward")
    env: dict = {}
    for p in joint.primals:
        ph = fw.placeholder(p.name, strip_requires_grad(p.meta["val"]))
        ph.meta.update({k: v for k, v in p.meta.items() if k != "val"})
        env[p] = ph
    fw_returned = [n for n in saved if n not in primal_index]
    _copy_nodes(fw, joint.graph, _ancestors(joint.fw_outputs + fw_returned), env)
    fw.output(tuple(env[o] for o in joint.fw_outputs) + tuple(env[n] for n in fw_returned))

    # ---- backward: from the saved values and the tangents to the grads
    bw = Graph(f"{name}_backward")
    benv: dict = {}
    for n in saved:
        benv[n] = bw.placeholder(n.name, strip_requires_grad(n.meta["val"]))
    for t in joint.tangent_nodes:
        benv[t] = bw.placeholder(t.name, t.meta["val"])
    grad_input_indices = [i for i, g in enumerate(joint.grads) if g is not None]
    grads = [joint.grads[i] for i in grad_input_indices]
    needed = _ancestors(grads, stop=saved_set | set(joint.tangent_nodes))
    missing = [n for n in needed if n.op == PLACEHOLDER and n not in benv]
    if missing:
        raise AssertionError(f"partition ({strategy}): the backward reads {missing}, which are not saved")
    _copy_nodes(bw, joint.graph, needed, benv)
    bw.output(tuple(benv[g] for g in grads))
    return Partition(fw, bw, saved, [primal_index.get(n) for n in saved], grad_input_indices,
                     len(joint.fw_outputs), joint.diff_outputs, strategy)
