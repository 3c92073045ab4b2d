"""The joint graph: the forward graph followed by its backward, built from the VJP rules.

Format of a ``JointGraph.graph``:

    def <name>_joint(<primals...>, tangent_0, tangent_1, ...):
        <the forward nodes, unchanged>          meta['joint'] = 'forward'
        <the backward nodes, in reverse order>  meta['joint'] = 'backward', meta['vjp_of'] = node
        return (<forward outputs...>, <one grad per primal, None where none>)

- Primals are the captured graph's placeholders (user inputs and lifted parameters), with the
  metadata they were captured with (``requires_grad`` included).
- There is one tangent placeholder per *differentiable* forward output (a floating tensor that
  requires grad), in output order; ``JointGraph.tangents`` is aligned with the outputs (None
  for outputs that get no tangent).
- Each grad has its primal's shape and dtype.
"""
from __future__ import annotations

import dataclasses

from kiln.graph.graph import Graph, getitem
from kiln.graph.node import CALL, GET_ATTR, OUTPUT, PLACEHOLDER, Node, flatten_args, map_args
from kiln.graph.proxy import Proxy
from kiln.meta.symbolic import hint_of, same_shape
from kiln.meta.tensor_meta import TensorMeta
from kiln.ops import core
from kiln.ops.registry import TRAINING_FORMS, VJP_RULES
from kiln.autograd import rules  # noqa: F401  (registers the VJP rules)
from kiln.autograd.rules import broadcasts_to, sum_to_shape


class AutogradError(RuntimeError):
    pass


@dataclasses.dataclass
class JointGraph:
    graph: Graph
    primals: list            # placeholder Nodes, in the captured graph's order
    fw_outputs: list         # Nodes (the forward results, in output order)
    tangents: list           # per forward output: its tangent placeholder, or None
    grads: list              # per primal: the Node of its gradient, or None

    @property
    def diff_outputs(self) -> list[bool]:
        return [t is not None for t in self.tangents]

    @property
    def tangent_nodes(self) -> list[Node]:
        return [t for t in self.tangents if t is not None]


def requires_grad(meta) -> bool:
    # complex too: a complex value joining two fallbacks (torch.fft.fftn(h).real) carries h's
    # gradient; core elementwise ops give complex results no gradient flag (their rules are
    # written for real values), so complex gradients pass through fallbacks and views only
    return isinstance(meta, TensorMeta) and meta.requires_grad and \
        (meta.dtype.is_floating_point or meta.dtype.is_complex)


def _fit(g: Proxy, meta: TensorMeta) -> Proxy:
    """Reduce or broadcast a rule's gradient to the input's shape and cast it to its dtype."""
    shape = tuple(meta.shape)
    if not same_shape(g.shape, shape):  # no guard: fitting an equal shape is a no-op
        if broadcasts_to(g.shape, shape) and not broadcasts_to(shape, g.shape):
            g = core.expand(g, shape)
        else:  # summed over broadcast dims (also from an empty gradient), or reshaped
            g = sum_to_shape(g, shape)
    if g.dtype != meta.dtype:
        g = core.to_dtype(g, meta.dtype)
    return g


def build_joint(graph: Graph) -> JointGraph:
    """Copy ``graph`` (core ops, metas propagated) and append its backward (see module doc)."""
    joint = Graph(f"{graph.name}_joint")
    env: dict[Node, Node] = {}
    primals: list[Node] = []
    outputs = None
    with joint.inherit(joint="forward"):
        for node in graph.nodes:
            if node.op == PLACEHOLDER:
                p = joint.placeholder(node.name, node.meta.get("val"))
                p.meta.update({k: v for k, v in node.meta.items() if k != "val"})
                p.meta["joint"] = "primal"
                env[node] = p
                primals.append(p)
            elif node.op == GET_ATTR:
                env[node] = joint.get_attr(node.target, graph.constants[node.target])
            elif node.op == CALL:
                env[node] = _copy_for_training(joint, node, env)
            elif node.op == OUTPUT:
                outputs = map_args(node.args[0], env.__getitem__)
    if outputs is None:
        raise AutogradError(f"graph {graph.name} has no output node")
    fw_outputs = list(outputs) if isinstance(outputs, (tuple, list)) else [outputs]
    forward_calls = [n for n in joint.nodes if n.op == CALL]

    tangents: list = []
    grads: dict[Node, Proxy] = {}

    def accumulate(node: Node, g: Proxy):
        grads[node] = g if node not in grads else core.add(grads[node], g)

    with joint.inherit(joint="backward"):
        for i, out in enumerate(fw_outputs):
            meta = out.meta.get("val") if isinstance(out, Node) else None
            if not requires_grad(meta):
                tangents.append(None)
                continue
            t = joint.placeholder(f"tangent_{i}", TensorMeta.contiguous(meta.shape, meta.dtype, meta.device))
            t.meta["joint"] = "tangent"
            tangents.append(t)
            accumulate(out, Proxy(t))

        tuple_grads: dict[Node, dict[int, Proxy]] = {}
        for node in reversed(forward_calls):
            if node.target is getitem:
                if node in grads:
                    src, idx = node.args
                    slot = tuple_grads.setdefault(src, {})
                    slot[idx] = grads[node] if idx not in slot else core.add(slot[idx], grads[node])
                continue
            val = node.meta["val"]
            if isinstance(val, tuple):
                if node not in tuple_grads:
                    continue
                g = tuple(tuple_grads[node].get(i) for i in range(len(val)))
                out = tuple(_element(joint, node, i) for i in range(len(val)))
            else:
                if node not in grads or not requires_grad(val):
                    continue
                g, out = grads[node], Proxy(node)
            for v in node.kwargs.values():
                for a in _flat_nodes(v):
                    if requires_grad(a.meta.get("val")):
                        raise AutogradError(f"[vjp] {node.name} = {node.target!r}: a tensor passed by "
                                            f"keyword ({a.name}) needs a gradient; VJP rules take "
                                            "tensors positionally")
            rule = VJP_RULES[node.target]
            args = map_args(node.args, Proxy)
            kwargs = map_args(node.kwargs, Proxy)
            # the gradient's nodes carry the source line of the node they differentiate
            with joint.inherit(vjp_of=node.name, source=node.meta.get("source")):
                try:
                    result = rule(g, out, *args, **kwargs)
                except Exception as e:
                    raise AutogradError(f"[vjp] while differentiating {node.name} = {node.target!r}: "
                                        f"{type(e).__name__}: {e}") from e
                if len(result) < len(node.args):
                    raise AutogradError(f"[vjp] the rule of {node.target!r} returned {len(result)} "
                                        f"grads for {len(node.args)} arguments")
                for arg, ga in _arg_grad_pairs(node.args, result):
                    if ga is None or not isinstance(arg, Node) or not requires_grad(arg.meta.get("val")):
                        continue
                    accumulate(arg, _fit(ga, arg.meta["val"]))

    grad_nodes = [grads[p].node if (p in grads and requires_grad(p.meta.get("val"))) else None
                  for p in primals]
    joint.output(tuple(fw_outputs) + tuple(grad_nodes))
    return JointGraph(joint, primals, fw_outputs, tangents, grad_nodes)


def _copy_for_training(joint: Graph, node: Node, env: dict) -> Node:
    """node in the joint graph: in its training form (``TRAINING_FORMS``) when it has one and
    its result needs a gradient, else as it is."""
    args, kwargs = map_args(node.args, env.__getitem__), map_args(node.kwargs, env.__getitem__)
    form = TRAINING_FORMS.get(node.target)
    if form is not None and requires_grad(node.meta.get("val")):
        with joint.inherit(**{k: v for k, v in node.meta.items() if k in ("source", "origin")}):
            result = form(*map_args(args, Proxy), **map_args(kwargs, Proxy))
        if result is not None:
            return result.node
    new = joint.create_node(node.target, args, kwargs, name=node.name)
    new.meta.update(node.meta)
    return new


def _arg_grad_pairs(args, grads):
    """(argument, gradient) pairs; a list argument (cat's tensors) takes a list of grads."""
    for arg, ga in zip(args, grads):
        if isinstance(arg, (list, tuple)) and isinstance(ga, (list, tuple)):
            yield from zip(arg, ga)
        else:
            yield arg, ga


def _element(graph: Graph, node: Node, i: int) -> Proxy:
    for user in node.users:
        if user.target is getitem and user.args[1] == i:
            return Proxy(user)
    return graph.call(getitem, (Proxy(node), i))


def _flat_nodes(obj):
    return [a for a in flatten_args(obj) if isinstance(a, Node)]


def strip_requires_grad(meta):
    if isinstance(meta, tuple):
        return tuple(strip_requires_grad(m) for m in meta)
    if isinstance(meta, TensorMeta) and meta.requires_grad:
        return meta.with_(requires_grad=False)
    return meta


def nbytes(meta) -> int:
    """Bytes of a tensor's data (numel * element size)."""
    if not isinstance(meta, TensorMeta):
        raise TypeError(f"not a tensor: {meta!r}")
    return hint_of(meta.numel()) * meta.dtype.itemsize  # symbolic sizes: at their traced values
