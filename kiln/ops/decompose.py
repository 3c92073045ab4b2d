"""The decomposition pass: a core-op graph in, a prims graph out."""
from __future__ import annotations

from kiln.graph.graph import Graph, getitem
from kiln.graph.node import CALL, GET_ATTR, OUTPUT, PLACEHOLDER, Node, flatten_args, map_args
from kiln.graph.proxy import Proxy
from kiln.ops.registry import DECOMPOSITIONS
from kiln.meta.tensor_meta import TensorMeta, WrappedNumberMeta
from kiln.ops.core_fallback import reads_storage
from kiln.ops import prims


def _describe(node) -> str:
    args = ", ".join(a.name if hasattr(a, "name") and not isinstance(a, str) else repr(a)
                     for a in node.args)
    return f"{node.name} = {node.target!r}({args})"


def _holds_complex(node) -> bool:
    """Does the node read or make a complex tensor? Kernels have no complex types, so such a
    core op stays whole as a library call (``prims.fallback`` of its eager form, run by torch
    between kernels), chosen here, before lowering: no kernel ever sees a complex buffer."""
    vals = [node.meta.get("val")] + [a.meta.get("val") for a in flatten_args((node.args, node.kwargs))
                                     if isinstance(a, Node)]
    return any(isinstance(m, TensorMeta) and m.dtype.is_complex for m in flatten_args(vals))


# core ops whose eager form allocates its result with its meta's strides whatever the operands'
# layout: ``x.t().contiguous()`` is contiguous (its copy must not follow x's order)
_ALLOCATES_BY_META = {"contiguous"}


def _mark_composite(created, result, core_name=None):
    """A core op that reduces (layer_norm, softmax ...) allocates its result in eager, which
    keeps the strides its meta gives (contiguous), unlike an elementwise op's (TensorIterator
    follows the operands' layout). Its result nodes say so for lowering's layout hint
    (``inductor/layout.py``)."""
    if core_name not in _ALLOCATES_BY_META and not any(getattr(n.target, "reduction", None) for n in created):
        return
    inside = set(map(id, created))
    for p in flatten_args(result):
        if isinstance(p, Proxy) and id(p.node) in inside:
            p.node.meta["layout_from_meta"] = True


def _note_eager_strides(node, result):
    """A fallback that reads its operands' storage (``as_strided``): the strides eager gives
    each tensor operand, from the core graph's metas, for lowering to lay them out so (the
    prims graph's metas are kiln's: a repeat is an expand there, a product contiguous)."""
    if not (node.args and isinstance(node.args[0], str) and reads_storage(node.args[0])):
        return
    lead = []
    if node.target.name == "custom_op_backward":  # a fallback's VJP replaying the call:
        # one prims.custom_op read by getitem, whose args lead with its own target and spec
        if not (isinstance(result, tuple) and result and isinstance(result[0], Proxy)):
            return
        result, lead = Proxy(result[0].node.args[0]), [None, None]
    if not isinstance(result, Proxy):
        return
    result.node.meta["eager_arg_strides"] = lead + [
        tuple(a.meta["val"].stride) if isinstance(a, Node) and isinstance(a.meta.get("val"), TensorMeta)
        else None for a in node.args]


def _keep_number(node, result, new_nodes):
    """A Python number computed in the graph (``core.number``, arithmetic on numbers) stays one
    in the prims graph: the decompositions of the ops that read it promote it as a number
    (``zero_dim_f32 * float(t)`` is float32), which a plain 0-d float64 would not be."""
    if type(node.meta.get("val")) is not WrappedNumberMeta or not isinstance(result, Proxy):
        return
    if result.node in new_nodes:  # never an operand's node: that one is what it is
        result.node.meta["val"] = WrappedNumberMeta.like(result.meta)


def _fresh_output(core, value, reused):
    """A graph result, each core op's its own tensor: a decomposition may hand back an operand
    unchanged (``ceil`` of an integer, ``clamp`` of nothing), but eager's op returned a new
    tensor, so the caller must not get the input (or another result) itself, which a later
    in-place op, in the graph or in the caller, would change under it. View ops alias in
    eager too, and keep their operand."""
    while core.op == CALL and core.target is getitem:
        core = core.args[0]
    if (core in reused and getattr(core.target, "view", None) is None
            and isinstance(value, Proxy) and isinstance(value.meta, TensorMeta)):
        return prims.copy(value)
    return value


def decompose(graph: Graph) -> Graph:
    """Replace every core op by its decomposition into prims (prims pass through)."""
    out = Graph(graph.name)
    env: dict = {}
    reused = set()  # core nodes whose decomposition returned a node made before it
    for node in graph.nodes:
        if node.op == PLACEHOLDER:
            p = out.placeholder(node.name, node.meta.get("val"))
            p.meta.update({k: v for k, v in node.meta.items() if k != "val"})
            env[node] = Proxy(p)
        elif node.op == GET_ATTR:
            env[node] = Proxy(out.get_attr(node.target, graph.constants[node.target]))
        elif node.op == CALL:
            args = map_args(node.args, lambda n: env[n])
            kwargs = map_args(node.kwargs, lambda n: env[n])
            target = node.target
            if target is getitem:
                env[node] = args[0][args[1]]
                continue
            source = node.meta.get("source")
            if target.namespace == "prims":
                with out.inherit(source=source):
                    env[node] = target(*args, **kwargs)
                continue
            if _holds_complex(node) and target.name != "fallback":
                with out.inherit(origin=_describe(node), source=source):
                    env[node] = prims.fallback(f"core.{target.name}", *args, **kwargs)
                continue
            rule = DECOMPOSITIONS[target]
            first_new = len(out.nodes)
            with out.inherit(origin=_describe(node), source=source):
                env[node] = rule(*args, **kwargs)
            made = set(map(id, out.nodes[first_new:]))
            if any(isinstance(p, Proxy) and id(p.node) not in made for p in flatten_args(env[node])):
                reused.add(node)
            _mark_composite(out.nodes[first_new:], env[node], target.name)
            _keep_number(node, env[node], out.nodes[first_new:])
            if target.name in ("fallback", "custom_op_backward"):
                _note_eager_strides(node, env[node])
        elif node.op == OUTPUT:
            result = map_args(node.args[0], lambda n: _fresh_output(n, env[n], reused))
            out.output(result)
    return out
