"""Lowering rule makers: how a prim becomes loop IR.

A lowered tensor is a ``TValue``: a shape and dtype plus a *loader*, a function from a list of
sympy index expressions to a scalar ``Expr``. Pointwise prims compose loaders, views transform
indices, and nothing is materialized until a consumer needs memory (``LoweringContext.realize``).
The rules are registered next to each prim in ``kiln/ops/prims*.py`` and ``kiln/ops/op_*.py``,
through the stage handle this module binds (``registry.bind_stage`` at its end).
"""
from __future__ import annotations

import math
import sys

import sympy
import torch

from kiln.inductor import ir
from kiln.meta.tensor_meta import TensorMeta, contiguous_strides, view_strides
from kiln.ops.registry import META_RULES, bind_stage
from kiln.meta.symbolic import has_symbols
from kiln.config import config


class TValue:
    # layout: the strides eager would give this value, where they are not contiguous
    # (inductor/layout.py); realize() stores the value that way
    __slots__ = ("shape", "dtype", "device", "loader", "ref", "origins", "layout")

    def __init__(self, shape, dtype, device, loader, ref=None, origins=()):
        self.shape, self.dtype, self.device = tuple(shape), dtype, device
        self.loader, self.ref, self.origins = loader, ref, tuple(origins)
        self.layout = None

    @classmethod
    def of_ref(cls, ref: ir.TensorRef, dtype, device, origins=()):
        def load(idx):
            offset = ref.offset + sum((i * s for i, s in zip(idx, ref.stride)), sympy.Integer(0))
            return ir.Load(ref.buffer, offset, dtype)
        return cls(ref.shape, dtype, device, load, ref, origins)


def _operand(x, dtype):
    """Loader for one operand: a TValue's loader or a scalar constant."""
    if isinstance(x, TValue):
        return x.loader
    if isinstance(x, sympy.Basic) and x.free_symbols:  # a symbolic size used as a value
        value = ir.IndexValue(x, dtype)
        return lambda idx: value
    const = ir.Const(x, dtype)
    return lambda idx: const


def pointwise(op: str):
    """Rule for an elementwise prim whose codegen name is ``op``."""
    def rule(ctx, meta, *args):
        tensors = [a for a in args if isinstance(a, TValue)]
        operand_dtype = tensors[0].dtype if tensors else meta.dtype
        loaders = [_operand(a, operand_dtype) for a in args]
        out_dtype = meta.dtype

        def load(idx):
            return ir.Call(op, tuple(ld(idx) for ld in loaders), out_dtype)
        return TValue(meta.shape, out_dtype, meta.device, load)
    return rule


def where_rule(ctx, meta, pred, a, b):
    loaders = [_operand(pred, ir_bool()), _operand(a, meta.dtype), _operand(b, meta.dtype)]
    return TValue(meta.shape, meta.dtype, meta.device,
                  lambda idx: ir.Call("where", tuple(ld(idx) for ld in loaders), meta.dtype))


def ir_bool():
    import torch
    return torch.bool


def convert_rule(ctx, meta, x, dtype):
    if x.dtype == dtype:
        return x
    return TValue(x.shape, dtype, x.device, lambda idx: ir.Call("cast", (x.loader(idx),), dtype))


def broadcast_in_dim_rule(ctx, meta, x, shape, broadcast_dims):
    def src_index(idx):
        return [0 if x.shape[k] == 1 and shape[d] != 1 else idx[d] for k, d in enumerate(broadcast_dims)]

    ref = None
    if x.ref is not None:
        stride = [0] * len(shape)
        for k, d in enumerate(broadcast_dims):
            stride[d] = 0 if (x.shape[k] == 1 and shape[d] != 1) else x.ref.stride[k]
        ref = ir.TensorRef(x.ref.buffer, shape, stride, x.ref.offset)
    return TValue(shape, x.dtype, x.device, lambda idx: x.loader(src_index(idx)), ref)


def permute_rule(ctx, meta, x, dims):
    inverse = [0] * len(dims)
    for out_d, in_d in enumerate(dims):
        inverse[in_d] = out_d
    ref = None
    if x.ref is not None:
        ref = ir.TensorRef(x.ref.buffer, meta.shape, [x.ref.stride[d] for d in dims], x.ref.offset)
    return TValue(meta.shape, x.dtype, x.device,
                  lambda idx: x.loader([idx[inverse[k]] for k in range(len(dims))]), ref)


_UNRAVELED: dict = {}  # (flat index, shape) -> indices: a model's repeated layers unravel alike


def _unravel(flat, shape):
    key = (flat, tuple(shape))
    try:
        return list(_UNRAVELED[key])
    except (KeyError, TypeError):  # TypeError: an unhashable size
        pass
    if any(size == 0 for size in shape):  # an empty source is never read: any index will do
        return [sympy.Integer(0)] * len(shape)
    out = []
    for size in reversed(shape):
        out.append(flat % size if size != 1 else sympy.Integer(0))
        flat = sympy.floor(flat / size) if size != 1 else flat
    out.reverse()
    if len(_UNRAVELED) < 4096:
        try:
            _UNRAVELED[key] = tuple(out)
        except TypeError:
            pass
    return out


def reshape_rule(ctx, meta, x, shape):
    shape = tuple(meta.shape)
    ref = None
    if x.ref is not None and _is_contiguous(x.ref):
        ref = ir.TensorRef(x.ref.buffer, shape, contiguous_strides(shape), x.ref.offset)
        return TValue.of_ref(ref, x.dtype, x.device)
    if x.ref is not None:  # a view of memory the strides allow (a head split of a column slice)
        try:
            stride = view_strides(x.ref.shape, x.ref.stride, shape)
        except TypeError:  # symbolic sizes whose order sympy cannot decide: index through
            stride = None
        if stride is not None:
            return TValue.of_ref(ir.TensorRef(x.ref.buffer, shape, stride, x.ref.offset), x.dtype, x.device)

    def load(idx):
        strides = contiguous_strides(shape)
        flat = sum((i * s for i, s in zip(idx, strides)), sympy.Integer(0))
        return x.loader(_unravel(flat, x.shape))
    return TValue(shape, x.dtype, x.device, load)


def _is_contiguous(ref: ir.TensorRef) -> bool:
    expected = contiguous_strides(ref.shape)
    return all(sz == 1 or st == ex for sz, st, ex in zip(ref.shape, ref.stride, expected))


def _realized(ctx, args, kwargs):
    def realize(a):  # tensors inside tuples/lists (torch.index_put's indices) too
        if isinstance(a, TValue):
            return ctx.realize(a)
        if isinstance(a, (tuple, list)):
            return type(a)(realize(x) for x in a)
        return a
    return [realize(a) for a in args], {k: realize(v) for k, v in kwargs.items()}


def extern_multi_rule(ctx, metas, *args, **kwargs):
    """A library op with several results (fused attention and its saved state): one wrapper
    call, then one buffer per result (``ir.ExternItem``)."""
    raw_kwargs = kwargs
    refs, kwargs = _realized(ctx, args, kwargs)
    if ctx.current_op.layout_dependent:  # convolution's backward: its grads follow x's layout
        metas = _meta_as_realized(ctx.current_op, metas, args, refs, raw_kwargs, kwargs)
    name = ctx.new_name("buf")
    ctx.add_buffer(ir.MultiExtern(name, ctx.current_op, refs, kwargs, metas[0].device, ctx.current_origins))
    outs = []
    for i, m in enumerate(metas):
        item = ir.ExternItem(ctx.new_name("buf"), name, i, m.shape, m.stride, m.dtype, m.device,
                             ctx.current_origins)
        ctx.add_buffer(item)
        outs.append(TValue.of_ref(ir.TensorRef(item.name, m.shape, m.stride, 0), m.dtype, m.device))
    return tuple(outs)


# Library ops whose result's layout follows their operands' (``layout_dependent=True`` on
# their define: convolution, attention): their meta runs again on the operands as realized,
# which may be laid out as eager would have them rather than as the graph's metas say
# (inductor/layout.py), so the wrapper need not copy.


def _meta_as_realized(op, meta, args, refs, kwargs, realized):
    def as_meta(a, r):
        if not isinstance(a, TValue):
            return a
        if has_symbols(tuple(r.shape) + tuple(r.stride)):
            raise LookupError("symbolic")
        return TensorMeta(r.shape, r.stride, a.dtype, a.device)
    try:
        metas = [as_meta(a, r) for a, r in zip(args, refs)]
        kw = {k: as_meta(v, realized[k]) for k, v in kwargs.items()}
        if any(isinstance(x, (tuple, list)) and any(isinstance(y, TValue) for y in x)
               for x in list(args) + list(kwargs.values())):
            return meta  # tensors inside lists: not a layout-dependent op's signature
        again = META_RULES[op](*metas, **kw)
    except Exception:  # noqa: BLE001 - the graph's meta stands; ensure_layout keeps it right
        return meta
    if isinstance(meta, tuple):  # several results (extern_multi_rule)
        if not isinstance(again, tuple) or len(again) != len(meta):
            return meta
        return tuple(m if tuple(a.shape) != tuple(m.shape) else m.with_(stride=a.stride)
                     for m, a in zip(meta, again))
    if tuple(again.shape) != tuple(meta.shape):
        return meta
    return meta.with_(stride=again.stride)


def extern_rule(ctx, meta, *args, **kwargs):
    """Library ops (mm, bmm ...): realize the operands, call the library from the wrapper."""
    raw_kwargs = kwargs
    refs, kwargs = _realized(ctx, args, kwargs)
    if ctx.current_op.layout_dependent:
        meta = _meta_as_realized(ctx.current_op, meta, args, refs, raw_kwargs, kwargs)
    name = ctx.new_name("buf")
    node = ir.Extern(name, ctx.current_op, refs, kwargs, meta.shape, meta.stride, meta.dtype,
                     meta.device, ctx.current_origins)
    ctx.add_buffer(node)
    ref = ir.TensorRef(name, meta.shape, meta.stride, 0)
    return TValue.of_ref(ref, meta.dtype, meta.device)


def numel(shape):
    return math.prod(shape)


def copy_rule(ctx, meta, x):
    """A copy is the same loader without the memory: realizing it makes a fresh buffer."""
    return TValue(x.shape, x.dtype, x.device, x.loader)


# The second stage of a split reduction combines the partial results with this reduction.
SPLIT_COMBINE = {"sum": "sum", "prod": "prod", "max": "max", "min": "min"}


def _largest_divisor(n: int, at_most: int) -> int:
    for s in range(min(at_most, n), 1, -1):
        if n % s == 0:
            return s
    return 1


def split_plan(kind: str, shape, dims, device):
    """How to split a reduction with few rows over a long extent, or None.

    A long reduction over few rows runs as few programs (``x.sum()`` over 8192x8192: one
    program looping over 67M elements), so the reduced extent is cut into ``S`` chunks: a first
    reduction over (row, chunk) pairs writes ``rows x S`` partial results, a second reduces
    those (the standard two-stage reduction; on the CPU the first stage's rows are what OpenMP
    spreads over threads). ``S`` divides the outermost reduced dim when it can (the chunks are
    then whole slices of it, with linear index math); otherwise it divides the flattened
    reduced extent, whose indices are unravelled. An extent with no suitable divisor is not
    split. Returns ("dim", S) or ("flat", S), or for a column reduction (``_column_split``)
    ("column", S) or ("column_flat", S).

    argmax/argmin stay unsplit: their second stage would need (value, index) pairs.
    """
    if not config.split_reductions or kind not in SPLIT_COMBINE:
        return None
    rows = math.prod(s for d, s in enumerate(shape) if d not in dims)
    rnumel = math.prod(shape[d] for d in dims)
    if any(isinstance(s, sympy.Basic) and s.free_symbols for s in shape):
        return None  # symbolic sizes: one plan must serve every size; the looped kernel does
    if rows == 0:
        return None
    where = config.split_column_reductions
    if where == "always" or (where == "cuda" and device is not None and device.type == "cuda"):
        plan = _column_split(shape, dims, rows, rnumel)
        if plan is not None:
            return plan
    if rnumel < config.split_reduction_min_rnumel:
        return None
    if device is not None and device.type == "cuda":
        target = config.split_reduction_rows_cuda
    else:
        target = config.split_reduction_rows_cpu or 8 * torch.get_num_threads()
    want = min(target // rows, rnumel // max(config.split_reduction_min_chunk, 1))
    if want < 2:
        return None
    s = _largest_divisor(shape[dims[0]], want)
    if s >= max(2, want // 4):
        return "dim", s
    s = _largest_divisor(rnumel, want)
    return ("flat", s) if s >= max(2, want // 4) else None


def _column_split(shape, dims, rows, rnumel):
    """A reduction over the leading dims with the kept dims contiguous after them (bias and
    norm-weight gradients) tiles 64 kept elements per program, so few kept elements mean few
    programs each walking every reduced row. Cut the outermost reduced dim into S chunks, so
    about 2048 programs run (enough loads in flight to fill a Hopper GPU's memory system; each
    chunk keeps at least 128 rows); the partial results go to an [S, kept...] buffer
    ("column": chunk id outermost, so the kept dims stay contiguous in both stages)."""
    if dims != tuple(range(len(dims))) or len(dims) == len(shape) or rnumel < 1024:
        return None
    want = min(2048 * 64 // max(rows, 1), rnumel // 128)
    if want < 2:
        return None
    s = _largest_divisor(shape[dims[0]], want)
    if s >= max(2, want // 4):
        return "column", s
    # the outermost reduced dim is short (a batch of 8 over [8, 1024, 768]): chunk the
    # flattened reduced extent instead, its indices unravelled
    s = _largest_divisor(rnumel, want)
    return ("column_flat", s) if s >= max(2, want // 4) else None


def _split_reduction(ctx, meta, x, dims, kind, plan):
    """First stage over (kept dims..., chunk id, chunk dims...), reducing the chunk dims into
    a contiguous [kept..., S] buffer; second stage reduces S. Low-precision partial results
    stay in float32 (they are rounded once, by the second stage)."""
    how, s = plan
    n = len(x.shape)
    kept = [d for d in range(n) if d not in dims]
    kept_sizes = [x.shape[d] for d in kept]
    if how in ("dim", "column"):
        d0 = dims[0]
        chunk_sizes = [x.shape[d0] // s] + [x.shape[d] for d in dims[1:]]
    else:
        chunk_sizes = [math.prod(x.shape[d] for d in dims) // s]
    nk = len(kept)
    column = how in ("column", "column_flat")
    ranges1 = ([s] + kept_sizes if column else kept_sizes + [s]) + chunk_sizes
    syms = ir.index_symbols(len(ranges1))
    chunk_id, chunk_syms = (syms[0] if column else syms[nk]), syms[nk + 1:]
    kept_syms = syms[1:nk + 1] if column else syms[:nk]
    idx = [None] * n
    for k, d in enumerate(kept):
        idx[d] = kept_syms[k]
    if how in ("dim", "column"):
        idx[dims[0]] = chunk_id * chunk_sizes[0] + chunk_syms[0]
        for d, sym in zip(dims[1:], chunk_syms[1:]):
            idx[d] = sym
    else:
        flat = chunk_id * chunk_sizes[0] + chunk_syms[0]
        for d, e in zip(dims, _unravel(flat, [x.shape[d] for d in dims])):
            idx[d] = e
    partial_dtype = torch.float32 if meta.dtype in (torch.float16, torch.bfloat16) else meta.dtype
    body = x.loader(idx)
    if body.dtype != partial_dtype and meta.dtype in (torch.float16, torch.bfloat16):
        body = ir.Call("cast", (body,), partial_dtype)
    shape1 = (s,) + tuple(kept_sizes) if column else tuple(kept_sizes) + (s,)
    stride1 = contiguous_strides(shape1)
    name1 = ctx.new_name("buf")
    reduced1 = tuple(range(nk + 1, len(ranges1)))
    source = (tuple(x.shape), tuple(idx)) if how in ("dim", "column") else None
    ctx.add_buffer(ir.Reduction(name1, shape1, stride1, partial_dtype, meta.device, kind,
                                ranges1, reduced1, body, ctx.current_origins, source))
    syms2 = ir.index_symbols(nk + 1)
    # no cast here: the partials are combined in float32 and rounded once where stored
    body2 = ir.Load(name1, sum((a * b for a, b in zip(syms2, stride1)), sympy.Integer(0)), partial_dtype)
    name2 = ctx.new_name("buf")
    ctx.add_buffer(ir.Reduction(name2, meta.shape, meta.stride, meta.dtype, meta.device,
                                SPLIT_COMBINE[kind], shape1, (0,) if column else (nk,), body2,
                                ctx.current_origins))
    return TValue.of_ref(ir.TensorRef(name2, meta.shape, meta.stride, 0), meta.dtype, meta.device)


EMPTY_IDENTITY = {"sum": 0, "prod": 1}  # a reduction over no elements (eager's values)


def reduction(kind: str):
    """Rule for a reduction prim: a ``Reduction`` buffer whose body is over the input's full
    index space; the reduced dims disappear from the output. Few rows over a long extent are
    split in two stages (``split_plan``)."""
    def rule(ctx, meta, x, dims):
        n = len(x.shape)
        dims = tuple(sorted(set(d % n for d in dims)))
        if any(x.shape[d] == 0 for d in dims):  # nothing to reduce: every row is the identity
            if kind not in EMPTY_IDENTITY:  # meta raises first, as eager does
                raise ValueError(f"[lowering] prims.{kind}: cannot reduce an empty dim")
            fill = ir.Const(EMPTY_IDENTITY[kind], meta.dtype)
            return TValue(meta.shape, meta.dtype, meta.device, lambda idx: fill)
        plan = split_plan(kind, x.shape, dims, meta.device)
        if plan is not None:
            return _split_reduction(ctx, meta, x, dims, kind, plan)
        body = x.loader(ir.index_symbols(n))
        name = ctx.new_name("buf")
        node = ir.Reduction(name, meta.shape, meta.stride, meta.dtype, meta.device, kind,
                            x.shape, dims, body, ctx.current_origins)
        ctx.add_buffer(node)
        return TValue.of_ref(ir.TensorRef(name, meta.shape, meta.stride, 0), meta.dtype, meta.device)
    return rule


def gather_rule(ctx, meta, x, dim, index):
    """out[i] = x[i with i[dim] replaced by index[i]] (torch.gather)."""
    dim = dim % max(len(x.shape), 1)

    def load(idx):
        sym = ir.indirect_symbol()
        src = list(idx)
        src[dim] = sym
        return ir.Let(sym, index.loader(idx), x.shape[dim], x.loader(src))
    return TValue(meta.shape, x.dtype, x.device, load)


def index_select_rule(ctx, meta, x, dim, index):
    """out[i] = x[i with i[dim] replaced by index[i[dim]]] (index_select, embedding)."""
    dim = dim % max(len(x.shape), 1)

    def load(idx):
        sym = ir.indirect_symbol()
        src = list(idx)
        src[dim] = sym
        return ir.Let(sym, index.loader([idx[dim]]), x.shape[dim], x.loader(src))
    return TValue(meta.shape, x.dtype, x.device, load)


def rand_rule(ctx, meta, shape, dtype, device):
    """Uniform [0, 1) from a counter-based generator: (per-call seed, this op's stream id,
    element index). Recomputing the value anywhere in the call gives the same number."""
    seed = ctx.seed_load(device)
    stream = ir.Const(ctx.new_stream(), torch.int64)
    strides = contiguous_strides(shape)

    def load(idx):
        flat = sum((i * s for i, s in zip(idx, strides)), sympy.Integer(0))
        value = ir.Call("rand", (seed, stream, ir.IndexValue(flat, torch.int64)), torch.float32)
        return value if dtype == torch.float32 else ir.Call("cast", (value,), dtype)
    return TValue(shape, dtype, device, load)


def scatter_rule(kind: str, mode: str = "add"):
    """scatter_add ("scatter": index has the source's shape) and index_add ("index": a 1-d
    index along dim): copy x into a fresh buffer, then add every source element into it (mode
    "add"), or write it there ("store": scatter and index_copy)."""
    def rule(ctx, meta, x, dim, index, src):
        if meta.dtype in (torch.float16, torch.bfloat16):
            # accumulate in float32 (atomics on half types are slow or missing), round once
            wide = meta.with_(dtype=torch.float32)
            acc = rule(ctx, wide, convert_rule(ctx, wide, x, torch.float32), dim, index,
                       convert_rule(ctx, wide, src, torch.float32))
            return convert_rule(ctx, meta, acc, meta.dtype)
        base = ctx.realize(TValue(x.shape, x.dtype, x.device, x.loader))
        src_shape = tuple(index.shape) if kind == "scatter" else tuple(src.shape)
        syms = ir.index_symbols(len(src_shape))
        sym = ir.indirect_symbol()
        ival = index.loader(syms) if kind == "scatter" else index.loader([syms[dim]])
        target = list(syms)
        target[dim] = sym
        target_index = sum((t * s for t, s in zip(target, base.stride)), sympy.Integer(0))
        name = ctx.new_name("buf")
        node = ir.Scatter(name, base.buffer, meta.shape, base.stride, meta.dtype, meta.device,
                          src_shape, ir.Let(sym, ival, x.shape[dim], ir.Const(0, torch.int64)),
                          target_index, src.loader(syms), ctx.current_origins, mode)
        ctx.add_buffer(node)
        return TValue.of_ref(ir.TensorRef(name, meta.shape, base.stride, 0), meta.dtype, meta.device)
    return rule


def full_rule(ctx, meta, shape, value, dtype, device):
    # the value may be a symbolic size (torch.full((1,), x.shape[0]) under dynamic shapes),
    # which kernels receive as an argument, as every other operand does
    return TValue(tuple(shape), dtype, meta.device, _operand(value, dtype))


# The op files write their lowerings with this module's builders through a stage handle
# (ops/registry.py: the ops layer imports no stage); binding it resolves them.
bind_stage("lowering", sys.modules[__name__])
