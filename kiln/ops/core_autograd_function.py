"""``core.autograd_function``: the outputs of a user's ``torch.autograd.Function``, whose
gradient is the user's own ``backward``.

Capture (kiln/capture/autograd_function.py) inlines the Function's ``forward`` into the graph
under no_grad, as eager runs it, so its ops compute the outputs but carry no gradient. It traces
``backward`` into a graph of its own, ``CustomFunction.backward``::

    def <Fn>_backward(saved_0, ..., grad_0, ...):   # ctx's saved values, one grad per output slot
        ...                                          # the user's backward, in core ops
        return (<grad of tensor input 0, or None>, ...)

and ends the region with one node::

    out = core.autograd_function('<Fn>#<digest>', (x, w), (saved...), (y0, y1))
    y0_ = graph.getitem(out, 0)

Its value is ``outputs`` (requiring grad where the Function's output is differentiable); its
VJP rule inlines the backward graph into the joint graph on the saved values and the incoming
gradients, and hands the results to ``inputs``. The forward's own ops get no gradient (they were
traced under no_grad), so autograd differentiates the region with the user's rule only. It
decomposes to nothing (its outputs are the forward's values).

The first argument names the function in ``CUSTOM_FUNCTIONS`` (as ``core.fallback`` names its
callable), so the graph prints as runnable Python. Its eager form, used by ``Graph.run`` (the
``eager`` backend), is a ``torch.autograd.Function`` that runs the backward graph, so gradients
through an eagerly run graph are the user's too.
"""
from __future__ import annotations

import dataclasses
import hashlib

import torch

from kiln.graph.graph import Graph, getitem
from kiln.graph.node import CALL, GET_ATTR, OUTPUT, PLACEHOLDER, map_args
from kiln.graph.proxy import Proxy
from kiln.meta.tensor_meta import TensorMeta
from kiln.ops.core_creation import full
from kiln.ops.registry import DECOMPOSITIONS, META_RULES, VJP_RULES, define

__all__ = ["autograd_function"]


@dataclasses.dataclass(eq=False)
class CustomFunction:
    """What the autograd stage needs of one traced ``torch.autograd.Function`` application."""

    name: str               # the Function's __qualname__, for messages
    backward: Graph         # (saved values..., grads of the output slots...) -> grad per tensor input
    differentiable: tuple   # per tensor output: can it carry a gradient (floating, not marked)
    grad_slots: tuple       # per tensor output: does the traced backward take a tensor for it
    materialize: bool       # an output with no gradient gets zeros (set_materialize_grads)


CUSTOM_FUNCTIONS: dict[str, CustomFunction] = {}


def register(fn: CustomFunction) -> str:
    """The key naming ``fn`` in graphs: its name and a digest of its backward, so recompiles
    and other processes print the same graph (the partition cache keys on that text). Another
    function with the same text and no symbolic size is interchangeable and shares the key;
    one with symbolic sizes keeps its own (its sizes belong to its own shape env)."""
    text = _identity_text(fn)
    base = f"{fn.name}#{hashlib.sha1(text.encode()).hexdigest()[:12]}"
    key, n = base, 1
    while key in CUSTOM_FUNCTIONS:
        other = CUSTOM_FUNCTIONS[key]
        if other is fn or (_identity_text(other) == text and not _symbolic(fn.backward)
                           and _same_constants(other.backward, fn.backward)):
            return key
        n += 1
        key = f"{base}.{n}"
    CUSTOM_FUNCTIONS[key] = fn
    return key


def resolve(key: str) -> CustomFunction:
    try:
        return CUSTOM_FUNCTIONS[key]
    except KeyError:
        raise KeyError(f"core.autograd_function: no traced torch.autograd.Function {key!r} in "
                       "this process (it is registered when capture traces it)") from None


def _identity_text(fn: CustomFunction) -> str:
    return f"{fn.backward.python()}{fn.differentiable}{fn.grad_slots}{fn.materialize}"


def _symbolic(graph: Graph) -> bool:
    for n in graph.nodes:
        val = n.meta.get("val")
        for m in val if isinstance(val, tuple) else (val,):
            if isinstance(m, TensorMeta) and not all(type(d) is int for d in m.shape + m.stride):
                return True
    return False


def _same_constants(a: Graph, b: Graph) -> bool:
    return a.constants.keys() == b.constants.keys() and all(
        a.constants[k].dtype == b.constants[k].dtype and torch.equal(a.constants[k], b.constants[k])
        for k in a.constants)


# ------------------------------------------------------------------ the op
class _UserBackward(torch.autograd.Function):
    """The eager form: ``outputs`` as the Function's results, the traced backward as their
    gradient (``Graph.run`` of a captured graph under the ``eager`` backend)."""

    @staticmethod
    def forward(ctx, key, saved, outputs, *inputs):
        fn = resolve(key)
        ctx.fn, ctx.shapes = fn, [(o.shape, o.dtype, o.device) for o in outputs]
        ctx.saved_values = saved
        ctx.set_materialize_grads(False)  # the traced backward's own slots say what it takes
        # a tensor of its own per output (one tensor returned twice would be one output)
        outs = tuple(o.view_as(o) for o in outputs)
        ctx.mark_non_differentiable(*[o for o, d in zip(outs, fn.differentiable) if not d])
        return outs

    @staticmethod
    def backward(ctx, *grads):
        fn = ctx.fn
        given = []
        for g, (shape, dtype, device), slot in zip(grads, ctx.shapes, fn.grad_slots):
            if slot:
                given.append(g if g is not None else torch.zeros(shape, dtype=dtype, device=device))
        with torch.no_grad():
            result = fn.backward.run(*ctx.saved_values, *given)
        return (None, None, None, *result)


def _eager(key, inputs, saved, outputs):
    out = _UserBackward.apply(key, tuple(saved), tuple(outputs), *inputs)
    return tuple(out)


# not recomputed by the partitioner: its value is a tuple; the getitems of it are free to recompute
autograd_function = define("core", "autograd_function", _eager)


@META_RULES.register(autograd_function)
def _meta(key, inputs, saved, outputs):
    fn = resolve(key)
    grad = any(isinstance(m, TensorMeta) and m.requires_grad for m in inputs)
    return tuple(m.with_(requires_grad=grad and d) for m, d in zip(outputs, fn.differentiable))


@DECOMPOSITIONS.register(autograd_function)
def _decompose(key, inputs, saved, outputs):
    return tuple(outputs)  # the forward's values themselves: the region was only for autograd


@VJP_RULES.register(autograd_function)
def autograd_function_vjp(g, out, key, inputs, saved, outputs):
    """The user's backward, inlined on the saved values and the outputs' gradients; an output
    with no gradient gets zeros (eager materializes them; a function that turned that off was
    traced with None in its slot, and capture allows at most one such differentiable output)."""
    fn = resolve(key)
    given = []
    for gi, o, slot in zip(g, outputs, fn.grad_slots):
        if not slot:
            continue
        if gi is None:
            if not fn.materialize:
                raise RuntimeError(f"[vjp] {fn.name}: an output with set_materialize_grads(False) "
                                   "got no gradient")
            gi = full(tuple(o.shape), 0, o.dtype, o.device)
        given.append(gi)
    grads = inline(fn.backward, [*saved, *given])
    return (None, tuple(grads), None, None)


def inline(graph: Graph, inputs: list):
    """Record ``graph``'s nodes into the graph being built (the active one, where the proxies
    in ``inputs`` live), its placeholders bound to ``inputs``; returns its outputs as Proxies.
    Each node keeps its source line, so the backward's kernels point at the user's backward."""
    env: dict = dict(zip(graph.placeholders, inputs))
    target_graph = next(p for p in inputs if isinstance(p, Proxy)).node.graph
    result = None
    for node in graph.nodes:
        if node.op == PLACEHOLDER:
            continue
        if node.op == GET_ATTR:
            env[node] = Proxy(target_graph.get_attr(node.target, graph.constants[node.target]))
        elif node.op == CALL and node.target is getitem:
            env[node] = env[node.args[0]][node.args[1]]
        elif node.op == CALL:
            args, kwargs = map_args((node.args, node.kwargs), env.__getitem__)
            source = node.meta.get("source")
            with target_graph.inherit(**({"source": source} if source else {})):
                env[node] = target_graph.call(node.target, args, kwargs)
        elif node.op == OUTPUT:
            result = map_args(node.args[0], env.__getitem__)
    return result
