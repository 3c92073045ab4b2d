"""The torch.autograd.Function glue: a compiled forward and a lazily compiled backward.

``CompiledAutograd`` is what ``pipeline.compile_graph`` returns for a graph that needs
gradients. Calling it runs ``KilnFunction.apply``, whose forward runs the compiled forward
graph and saves the activations the partitioner chose; its backward runs the compiled backward
graph, compiling it on first use (with the saved tensors' real strides) through the compiler
the driver handed over (``pipeline.compile_backward``: the graph stages after capture).
"""
from __future__ import annotations

import threading

import sympy
import torch

from kiln import log
from kiln.autograd.partition import Partition
from kiln.graph.graph import Graph
from kiln.graph.node import CALL, GET_ATTR, OUTPUT, PLACEHOLDER, Node, map_args
from kiln.meta.symbolic import concretize, free_symbols, shape_env_of, symbol_values
from kiln.meta.tensor_meta import TensorMeta, WrappedNumberMeta
from kiln.ops.autocast import disabled as autocast_disabled

DOUBLE_BACKWARD_ERROR = "kiln: double backward through a compiled graph is not supported"


class CompiledAutograd:
    """Callable with the captured graph's inputs; returns its outputs, connected to autograd."""

    def __init__(self, name: str, part: Partition, forward, compiler, speculation=None):
        self.name = name
        self._speculation = speculation  # autograd/speculate.py: the backward compiling already
        self.part = part
        self.forward = forward
        self.compiler = compiler  # backward graph -> compiled backward (the driver's, passed in)
        self.num_user_outputs = part.num_user_outputs
        self.diff_outputs = part.diff_outputs
        self.grad_input_indices = part.grad_input_indices
        self.saved_inputs = part.saved_inputs
        self.tangent_metas = [t.meta["val"] for t in part.backward.placeholders[len(part.saved):]]
        # symbolic sizes: the forward's inputs give every symbol's value for the backward
        self.forward_metas = [n.meta["val"] for n in part.forward.placeholders]
        self.symbolic = bool(free_symbols(self.forward_metas))
        self._backward: dict = {}
        self._lock = threading.Lock()
        # explain / the debug dump read these like any compiled graph's
        self.kernel_count = getattr(forward, "kernel_count", 0)
        self.extern_count = getattr(forward, "extern_count", 0)
        self.wrapper_source = getattr(forward, "wrapper_source", None)

    def __call__(self, *inputs):
        if not torch.is_grad_enabled():  # entries are keyed by grad mode; this is a safety net
            return tuple(self.forward(*inputs)[:self.num_user_outputs])
        return KilnFunction.apply(self, *inputs)

    # ---------------------------------------------------------------- backward
    def backward_fn(self, saved, tangents, sizes=None):
        if sizes is not None:
            return self._symbolic_backward_fn(saved, tangents, sizes)
        key = tuple(t.stride() for t in saved)
        fn = self._backward.get(key)
        if fn is None:
            with self._lock:
                fn = self._backward.get(key)
                if fn is None:
                    fn = self._speculated(saved, tangents)
                    if fn is None:
                        fn = self._compile_backward(saved, tangents)
                    self._backward[key] = fn
        return fn

    def _speculated(self, saved, tangents):
        spec, self._speculation = self._speculation, None
        if spec is None:
            return None
        metas = [TensorMeta.of(t).with_(requires_grad=False) for t in list(saved) + list(tangents)]
        return spec.take(metas)

    def _symbolic_backward_fn(self, saved, tangents, sizes):
        """One backward for every size: the backward graph keeps its symbolic metas, where the
        real tensors have the strides those metas promise (or are contiguous); a tensor laid
        out otherwise gets its static meta (and a backward of its own)."""
        real = list(saved) + list(tangents)
        metas = [n.meta["val"] for n in self.part.backward.placeholders]
        key = tuple(_layout_key(m, t, sizes) for m, t in zip(metas, real))
        fn = self._backward.get(key)
        if fn is None:
            with self._lock:
                fn = self._backward.get(key)
                if fn is None:
                    use = [m.with_(requires_grad=False) if k == "meta" else
                           TensorMeta.contiguous(m.shape, m.dtype, m.device) if k == "contiguous" else
                           TensorMeta.of(t).with_(requires_grad=False) for k, m, t in zip(key, metas, real)]
                    fn = self._backward[key] = _SizedBackward(self, use)
        return fn.bind(sizes)

    def _compile_backward(self, saved, tangents, metas=None):
        if metas is None:
            metas = [TensorMeta.of(t).with_(requires_grad=False) for t in list(saved) + list(tangents)]
        return compile_backward(self.part, self.compiler, metas)


def compile_backward(part: Partition, compiler, metas):
    """The backward graph of ``part`` for these input metas (saved, then tangents), compiled by
    ``compiler`` (``pipeline.compile_backward``: it falls back to eager ops itself)."""
    graph = copy_graph(part.backward, metas)
    # the grads keep the strides the partition promised (eager's), whatever layouts the
    # forward saved its tensors in (pipeline.promised_strides)
    graph.promised_output_strides = [
        tuple(o.meta["val"].stride) if isinstance(o, Node) and isinstance(o.meta.get("val"), TensorMeta)
        else None for o in part.backward.output_node.args[0]]
    return compiler(graph)


def _layout_key(meta, t, sizes):
    """How a backward input is described: its symbolic meta ("meta"), contiguous over the
    symbolic sizes, or (a layout the sizes do not explain) its static shape and strides."""
    stride = concretize(tuple(meta.stride), sizes)
    if all(a == b for a, b, n in zip(stride, t.stride(), t.shape) if n != 1):
        return "meta"
    if t.is_contiguous():
        return "contiguous"
    return ("static", tuple(t.shape), t.stride())


class _SizedBackward:
    """A backward compiled over symbolic sizes. Guards its compile recorded on the sizes (the
    forward's guard function never saw them) are checked per call; where one fails, the
    backward graph runs with eager torch ops instead (never a wrong answer)."""

    def __init__(self, runtime, metas):
        env = shape_env_of(metas)
        before = len(env.guards) if env is not None else 0
        self.compiled = runtime._compile_backward(None, None, metas)
        self.guards = [g for g, _ in env.guards[before:]] if env is not None else []
        self.graph = copy_graph(runtime.part.backward, metas)
        if self.guards:
            log.log("dynamic", "the backward of %s recorded guards %s: checked per call", runtime.name,
                    [str(g) for g in self.guards])

    def bind(self, sizes):
        def call(*inputs):
            if self.guards and not all(bool(g.xreplace({s: sympy.Integer(v) for s, v in sizes.items()}))
                                       for g in self.guards):
                log.log("dynamic", "a backward guard failed for sizes %s: eager backward", sizes)
                return self.graph.run(*inputs, sizes=sizes)
            if not hasattr(self.compiled, "size_args"):  # an eager backend: graph.run takes the sizes
                return self.compiled.graph.run(*inputs, sizes=sizes)
            by_name = {s.name: v for s, v in sizes.items()}  # a dynamic int's symbol is not positive
            extra = [by_name[n] for n in self.compiled.size_args]
            return self.compiled(*inputs, *extra)
        return call


class _NoDoubleBackward(torch.autograd.Function):
    """Stands between a compiled backward's grads and anything differentiating them again."""

    @staticmethod
    def forward(ctx, *grads):
        return tuple(g.clone() for g in grads)

    @staticmethod
    def backward(ctx, *_):
        raise RuntimeError(DOUBLE_BACKWARD_ERROR + " (the gradient computed by a kiln-compiled "
                           "backward was differentiated again, e.g. through create_graph=True)")


class KilnFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, runtime: CompiledAutograd, *inputs):
        outs = runtime.forward(*inputs)
        n = runtime.num_user_outputs
        user = tuple(outs[:n])
        returned = iter(outs[n:])
        saved = [inputs[i] if i is not None else next(returned) for i in runtime.saved_inputs]
        ctx.runtime = runtime
        ctx.sizes = symbol_values(runtime.forward_metas, inputs) if runtime.symbolic else None
        ctx.save_for_backward(*saved)
        nondiff = [o for o, d in zip(user, runtime.diff_outputs) if not d and isinstance(o, torch.Tensor)]
        if nondiff:
            ctx.mark_non_differentiable(*nondiff)
        return user

    @staticmethod
    def backward(ctx, *grad_outputs):
        runtime: CompiledAutograd = ctx.runtime
        saved = ctx.saved_tensors
        tangents = []
        metas = iter(runtime.tangent_metas)
        for g, diff in zip(grad_outputs, runtime.diff_outputs):
            if not diff:
                continue
            meta = next(metas)
            if g is None:
                shape = concretize(tuple(meta.shape), ctx.sizes) if ctx.sizes else meta.shape
                g = torch.zeros(shape, dtype=meta.dtype, device=meta.device)
            elif g.dtype != meta.dtype:
                g = g.to(meta.dtype)
            tangents.append(g.contiguous())
        double = torch.is_grad_enabled()
        # backward() inside torch.autocast: the backward graph's dtypes are fixed, torch must not cast
        with torch.no_grad(), autocast_disabled():
            # only what requires grad needs a detached alias (inputs, the forward's outputs);
            # a detach is a dispatcher call, ~0.7 us for each of a BERT backward's 63 saved
            saved = [t.detach() if t.requires_grad else t for t in saved]
            tangents = [t.detach() if t.requires_grad else t for t in tangents]
            fn = runtime.backward_fn(saved, tangents, ctx.sizes)
            grads = list(fn(*saved, *tangents))
        if double and grads:
            # create_graph=True: these grads have no derivative of their own; make any attempt
            # to differentiate them fail loudly instead of silently giving zero.
            grads = list(_NoDoubleBackward.apply(*[g.detach().requires_grad_() for g in grads]))
        needs = ctx.needs_input_grad  # (a property that builds its tuple on every read)
        result = [None] * (len(needs) - 1)
        for i, g in zip(runtime.grad_input_indices, grads):
            if needs[i + 1]:
                result[i] = g
        return (None, *result)


def copy_graph(graph: Graph, input_metas=None) -> Graph:
    """A node-for-node copy of graph (new placeholder metas if given)."""
    out = Graph(graph.name)
    env: dict = {}
    metas = iter(input_metas) if input_metas is not None else None
    for n in graph.nodes:
        if n.op == PLACEHOLDER:
            old = n.meta.get("val")
            new = next(metas) if metas is not None else old
            if type(old) is WrappedNumberMeta:  # a real tensor's meta: still the Python float
                new = WrappedNumberMeta.like(new)
            p = out.placeholder(n.name, new)
            p.meta.update({k: v for k, v in n.meta.items() if k != "val"})
            env[n] = p
        elif n.op == GET_ATTR:
            env[n] = out.get_attr(n.target, graph.constants[n.target])
        elif n.op == CALL:
            new = out.create_node(n.target, map_args(n.args, env.__getitem__),
                                  map_args(n.kwargs, env.__getitem__), name=n.name)
            new.meta.update(n.meta)
            env[n] = new
        elif n.op == OUTPUT:
            out.output(map_args(n.args[0], env.__getitem__))
    return out
