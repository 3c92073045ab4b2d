"""Lowering: a prims graph becomes loop IR (``ir.LoopProgram``).

Pointwise prims compose loaders and are inlined into their consumers, so a chain of them costs
nothing until something needs memory. A value is *realized* into a ``Pointwise`` buffer when a
library call reads it, when the graph returns it, or when several consumers read a value that
is not cheap to recompute.
"""
from __future__ import annotations

import math

import sympy
import torch

from kiln.graph.graph import Graph, getitem
from kiln.graph.node import CALL, GET_ATTR, OUTPUT, PLACEHOLDER, flatten_args, map_args
from kiln.inductor import ir
from kiln.config import config
from kiln.inductor.codegen.cpp import scalar_math_call
from kiln.inductor.conv_layout import wants_channels_last
from kiln.inductor.layout import layout_hint
from kiln.inductor.lowering import TValue, broadcast_in_dim_rule, extern_rule
from kiln.meta.symbolic import SymInt, expr_meta, free_symbols, has_symbols, symbol_reads, sympy_args
from kiln.meta.strides import is_dense
from kiln.meta.tensor_meta import TensorMeta, contiguous_strides
from kiln.ops.registry import LOWERINGS
# The modules whose builders the ops' lowerings are written with: importing them binds their
# stage handles (ops/registry.py), so LOWERINGS holds real rules from here on.
from kiln.inductor import lowering_views, pad_gemm  # noqa: E402,F401

# A multi-use value is recomputed by each consumer when it has at most this many ops.
INLINE_OPS_LIMIT = 4


class LoweringError(RuntimeError):
    pass


class LoweringContext:
    def __init__(self):
        self.buffers: list[ir.Buffer] = []
        self._counter = 0
        self.current_op = None
        self.current_node = None  # the graph node being lowered (its users: pad_gemm)
        self.current_origins: tuple = ()
        self.seed = None
        self._streams = 0
        self.conv_channels_last = False  # inductor/conv_layout.py

    def seed_load(self, device):
        """The per-call random seed (an int64 the wrapper draws from torch's generator)."""
        if self.seed is None:
            self.seed = ir.InputBuffer("seed", (1,), (1,), torch.int64, device)
        return ir.Load("seed", sympy.Integer(0), torch.int64)

    def new_stream(self) -> int:
        self._streams += 1
        return self._streams

    def new_name(self, prefix="buf"):
        name = f"{prefix}{self._counter}"
        self._counter += 1
        return name

    def add_buffer(self, buf):
        self.buffers.append(buf)

    def realize(self, value: TValue, stride=None, in_order=False) -> ir.TensorRef:
        """Materialize a value into memory (no-op when it already lives in a buffer), with
        ``stride`` (default: the layout eager would give it, ``value.layout``, else contiguous).

        A permuted layout (the hint's, or ``stride`` with ``in_order``) is stored as a
        contiguous buffer over the dims in memory order, the value a strided view of it: the
        kernel then walks memory in order (coalesced stores, and coalesced loads from operands
        in that layout)."""
        if value.ref is not None:
            return value.ref
        shape = value.shape
        name = self.new_name("buf")
        origins = value.origins or self.current_origins
        if stride is None and value.layout is not None and config.eager_layouts:
            stride, in_order = tuple(value.layout), True
        if stride is not None and in_order:
            stride = tuple(stride)
            order = sorted(range(len(shape)), key=lambda d: (-stride[d], d))  # outermost first
            store_shape = tuple(shape[d] for d in order)
            syms = ir.index_symbols(len(shape))
            idx = [None] * len(shape)
            for k, d in enumerate(order):
                idx[d] = syms[k]
            body = value.loader(idx)
            self.add_buffer(ir.Pointwise(name, store_shape, contiguous_strides(store_shape), value.dtype,
                                         value.device, body, origins))
        else:
            stride = contiguous_strides(shape) if stride is None else tuple(stride)
            body = value.loader(ir.index_symbols(len(shape)))
            self.add_buffer(ir.Pointwise(name, shape, stride, value.dtype, value.device, body, origins))
        ref = ir.TensorRef(name, shape, stride, 0)
        value.ref = ref
        realized = TValue.of_ref(ref, value.dtype, value.device, origins)
        value.loader = realized.loader
        return ref


# A multi-use value is also realized when recomputing it costs memory traffic: it reads more
# than this many buffers, or it gathers (an indirect load: an embedding lookup feeding a
# residual stream would otherwise be redone by every later layer's consumers).
INLINE_LOADS_LIMIT = 2


def _recompute_is_costly(value: TValue, scalar_math_only=False) -> bool:
    """Also on the CPU (C++ kernels): any scalar libm call (``cpp.scalar_math_call``). A
    Llama's rotary ``cos``/``sin`` over [seq, head_dim] were recomputed by the q and k
    rotations of every layer at every batch and head (a broadcast: ``_read_more_than_once``),
    each element a glibc call. A value read only through a broadcast is stored for that reason
    alone (``scalar_math_only``): storing every costly broadcast value also split off GPT-2's
    position-embedding gather into a kernel of its own, for no measured gain."""
    body = value.loader(ir.index_symbols(len(value.shape)))
    calls, buffers = 0, set()
    scalar_math = _scalar_math_fn(value.device)
    for e in ir.walk(body):
        if isinstance(e, ir.Let) and not scalar_math_only:
            return True
        if isinstance(e, ir.Call) and e.op != "cast":
            calls += 1
            if scalar_math is not None and scalar_math(e.op, e.dtype):
                return True
        elif isinstance(e, ir.Load):
            buffers.add(e.buffer)
    return not scalar_math_only and (calls > INLINE_OPS_LIMIT or len(buffers) > INLINE_LOADS_LIMIT)


def _read_more_than_once(node, value: TValue) -> bool:
    """Several users; or, for C++ kernels, one that broadcasts it (a chain of
    ``broadcast_in_dim``: inlined, each element is recomputed once per broadcast copy, and the
    CPU is compute bound where a GPU would not be)."""
    if node.meta.get("recompute_in_users") and _scalar_math_fn(value.device) is None:
        # a pooling window's source (ops/core_pool.py), for Triton kernels: a C++ kernel keeps
        # it stored, its masked window loads would not vectorize (test_cpp_vectorized.py)
        return False
    if len(node.users) != 1:
        return len(node.users) > 1
    return _scalar_math_fn(value.device) is not None and _broadcast_read(node)


def _broadcast_read(node) -> bool:
    user = next(iter(node.users))
    if LOWERINGS.get(user.target) is not broadcast_in_dim_rule:
        return False
    n, m = _numel(node), _numel(user)
    if n is None or m is None:
        return False  # symbolic sizes: not compared (a comparison would guard)
    return m > n or (len(user.users) > 1 or (len(user.users) == 1 and _broadcast_read(user)))


def _numel(node):
    val = node.meta.get("val")
    shape = getattr(val, "shape", None)
    return math.prod(shape) if shape is not None and all(isinstance(d, int) for d in shape) else None


def _scalar_math_fn(device):
    """The C++ backend's test for a scalar libm call, where C++ kernels will compute the value."""
    if torch.device(device).type != "cpu" or config.cpu_backend != "cpp":
        return None
    return scalar_math_call


def _origin_of(node):
    src = node.meta.get("source")
    origin = node.meta.get("origin") or f"{node.name} = {node.target!r}"
    return (origin if src is None else f"{origin}  [{src}]",)


def lower(graph: Graph) -> ir.LoopProgram:
    """Symbolic sizes (``SymInt``) become plain sympy expressions here: lowering, scheduling and
    codegen compare them structurally, record no guards, and print them as kernel arguments."""
    ctx = LoweringContext()
    env: dict = {}
    inputs = []
    # symbols used only as values (a backward's ``g * n``, with static saved tensors) count too:
    # they must reach kernels as arguments, never be read as the traced hint
    arg_symbols = _arg_symbols(graph)
    symbolic = bool(arg_symbols) or any(has_symbols(n.meta["val"].shape) or has_symbols(n.meta["val"].stride)
                                        for n in graph.placeholders)
    meta_of = (lambda n: expr_meta(n.meta["val"])) if symbolic else (lambda n: n.meta["val"])
    device = graph_device(graph)
    ctx.conv_channels_last = wants_channels_last(graph, device)
    for node in graph.nodes:
        if node.op in (PLACEHOLDER, GET_ATTR):
            m = meta_of(node)
            name = f"arg{len(inputs)}"
            buf = ir.InputBuffer(name, m.shape, m.stride, m.dtype, m.device)
            inputs.append(buf)
            env[node] = TValue.of_ref(ir.TensorRef(name, m.shape, m.stride, 0), m.dtype, m.device)
        elif node.op == CALL:
            args = map_args(node.args, lambda n: env[n])
            kwargs = map_args(node.kwargs, lambda n: env[n])
            eager_strides = node.meta.get("eager_arg_strides")
            if eager_strides is not None and len(eager_strides) == len(args):
                args = [_in_eager_storage(ctx, v, st) if isinstance(v, TValue) and st is not None else v
                        for v, st in zip(args, eager_strides)]
            if symbolic:
                args, kwargs = sympy_args(args), sympy_args(kwargs)
            if node.target is getitem:
                env[node] = args[0][args[1]]
                continue
            ctx.current_op = node.target
            ctx.current_node = node
            ctx.current_origins = _origin_of(node)
            try:
                rule = LOWERINGS[node.target]
                if _off_device(node, device):  # a CPU value in a GPU graph: torch computes it
                    rule = extern_rule
                meta = meta_of(node)
                value = rule(ctx, meta, *args, **kwargs)
            except Exception as e:
                raise LoweringError(f"[lowering] {node.name} = {node.target!r}: {e}") from e
            if isinstance(value, TValue) and not value.origins:
                value.origins = ctx.current_origins
            if isinstance(value, TValue) and value.ref is None and value.layout is None:
                # a reducing op's result takes its meta's (eager's) layout, except over the
                # channels-last activations of a conv graph (conv_layout.py), where it follows
                # them as an elementwise op's does: a train-mode batch norm stays channels-last
                from_meta = node.meta.get("layout_from_meta", False) and \
                    not (ctx.conv_channels_last and len(meta.shape) == 4)
                value.layout = layout_hint(node.target, meta, args, from_meta)
            env[node] = value
            if isinstance(value, TValue) and value.ref is None and _read_more_than_once(node, value) \
                    and _recompute_is_costly(value, scalar_math_only=len(node.users) == 1):
                ctx.realize(value)
        elif node.op == OUTPUT:
            outputs = []
            wanted = getattr(graph, "output_strides", None) or ()
            free_from = _saved_layouts_free_from(ctx, graph)
            for i, (n, v) in enumerate(zip(node.args[0], map_args(node.args[0], lambda n: env[n]))):
                if isinstance(v, TValue):
                    stride = wanted[i] if i < len(wanted) else None
                    if stride is None:  # what a later graph (the backward) was compiled against
                        meta = meta_of(n) if hasattr(n, "meta") else None
                        stride = tuple(meta.stride) if isinstance(meta, TensorMeta) else None
                    if free_from is not None and i >= free_from:
                        outputs.append(_realize_saved(ctx, v, stride))
                    else:
                        outputs.append(_realize_output(ctx, v, stride))
                else:
                    outputs.append(v)
    program = ir.LoopProgram(inputs, ctx.buffers, tuple(outputs), device, ctx.seed)
    if symbolic:
        program.symbols = sorted(free_symbols([n.meta["val"] for n in graph.placeholders]) | arg_symbols,
                                 key=lambda s: s.name)
        # where the wrapper reads each symbol: an input's size or stride, else a call argument
        names = [b.name for b, n in zip(inputs, [n for n in graph.nodes if n.op in (PLACEHOLDER, GET_ATTR)])
                 if n.op == PLACEHOLDER]
        program.symbol_reads = {sym: (names[i], kind, d) for sym, (i, kind, d)
                                in symbol_reads([n.meta["val"] for n in graph.placeholders]).items()}
    return program


def _realize_output(ctx, value: TValue, stride) -> ir.TensorRef:
    """A graph output in memory with the strides promised for it: eager's, from the captured
    graph's metas, for the user's outputs (a later ``as_strided`` or layout-dependent view of
    the result must read what eager's would); the meta's for the rest (a later graph, the
    backward reading saved tensors, was compiled against them). A value already in a buffer
    laid out otherwise (a view, a library result, a value stored in the layout eager would give
    it for a library call: inductor/layout.py) is copied into one laid out so."""
    if stride is not None:
        stride = _stride_exprs(stride, len(value.shape))  # None: not a layout lowering can store
    if value.ref is not None:
        ref = value.ref
        if stride is None:
            return ref
        if _same_layout(value.shape, ref.stride, stride):
            if tuple(ref.stride) != tuple(stride):  # differing on size-1 dims only: a view with
                return ir.TensorRef(ref.buffer, ref.shape, tuple(stride), ref.offset)  # eager's strides
            return ref
        value = TValue(value.shape, value.dtype, value.device, value.loader, None, value.origins)
    if stride is None and value.layout is not None:
        stride = contiguous_strides(value.shape)
    return ctx.realize(value, stride)


def _stride_exprs(stride, ndim):
    """``stride`` as ints and sympy expressions over the graph's size symbols: symbolic sizes
    keep eager's strides too (a split of a symbolic width is a view with stride 3*s1, not a
    compact copy); None for anything else."""
    out = []
    for s in stride:
        if isinstance(s, SymInt):
            s = s.expr
        if not isinstance(s, (int, sympy.Basic)) or isinstance(s, bool):
            return None
        out.append(int(s) if isinstance(s, sympy.Integer) else s)
    return tuple(out) if len(out) == ndim else None


def _static(*xs) -> bool:
    return all(isinstance(v, int) for x in xs for v in x)


def _saved_layouts_free_from(ctx, graph):
    """The index of a training forward's first saved-tensor output when its saved tensors keep
    the layouts lowering gives them (a graph whose convolutions run channels-last,
    ``conv_layout.py``: copying each saved activation back to eager's layout would undo it);
    None otherwise. The backward is compiled for the saved tensors' real strides
    (autograd/function.py keys it by them)."""
    start = getattr(graph, "saved_outputs_from", None)
    if start is None or not ctx.conv_channels_last or not getattr(graph, "saves_for_backward", False):
        return None
    return start


def _realize_saved(ctx, value: TValue, stride) -> ir.TensorRef:
    """A saved tensor in the layout it has, or would get, in this graph: a buffer of its own
    laid out densely in any dim order (a channels-last activation), or the value stored in its
    layout hint; anything else (a strided or offset view) as ``_realize_output`` stores it."""
    if value.ref is not None:
        ref = value.ref
        if ref.offset == 0 and _static(value.shape, ref.stride) and is_dense(value.shape, ref.stride):
            return ref
        return _realize_output(ctx, value, stride)
    if value.layout is not None and config.eager_layouts and \
            all(isinstance(n, int) for n in value.shape):
        return ctx.realize(value)
    return _realize_output(ctx, value, stride)


def _in_eager_storage(ctx, value: TValue, stride) -> TValue:
    """``value`` in memory laid out as eager's tensor is (``stride``: the core graph's meta),
    for an op that reads storage (``as_strided``: ``ops/core_fallback.py STORAGE_READERS``).
    A kiln view whose strides differ (a repeat of size-1 dims kept as an expand, strides 0,
    where eager made a fresh contiguous tensor) is copied into a fresh buffer laid out so; a
    value already laid out so (a graph input, a view of one) is kept, with its storage offset.
    A value not yet in memory is stored with eager's strides."""
    stride = tuple(stride)
    if len(stride) != len(value.shape) \
            or not all(isinstance(x, int) for x in stride + tuple(value.shape)):
        return value  # symbolic: as before
    if value.ref is not None:
        if _same_layout(value.shape, value.ref.stride, stride):
            return value
        value = TValue(value.shape, value.dtype, value.device, value.loader, None, value.origins)
    ref = ctx.realize(value, stride)
    return TValue.of_ref(ref, value.dtype, value.device, value.origins)


def _same_layout(shape, a, b) -> bool:
    return all(n == 1 or sympy.sympify(x) == y for n, x, y in zip(shape, a, b))


def _arg_symbols(graph: Graph) -> set:
    """Size symbols in the graph's call arguments (SymInt scalars, symbolic shapes)."""
    out: set = set()
    for node in graph.nodes:
        if node.op == CALL:
            for a in flatten_args((node.args, node.kwargs)):
                for x in (a.start, a.stop, a.step) if isinstance(a, slice) else (a,):
                    if isinstance(x, SymInt):
                        out |= x.expr.free_symbols
    return out


def graph_device(graph: Graph) -> torch.device:
    """The device a graph's kernels run on: the first non-CPU device any node's value lives on."""
    devices = set()
    for n in graph.nodes:
        d = getattr(n.meta.get("val"), "device", None)
        if d is not None:
            devices.add(d)
    return _pick_device(devices)


def _off_device(node, device) -> bool:
    val = node.meta.get("val")
    return isinstance(val, TensorMeta) and val.device.type != device.type


def _pick_device(devices):
    for d in devices:
        if d.type != "cpu":
            return d
    return torch.device("cpu")
