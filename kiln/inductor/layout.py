"""The memory layout eager would give a value, as a hint for where lowering realizes it.

kiln's metas give pointwise results contiguous strides, but eager's elementwise ops
(TensorIterator) lay their result out in the order of their operands' strides: ``g * r + x``
over channels-last ``r`` and ``x`` is channels-last. Libraries choose their kernels by the
layout they are handed: cuDNN runs a depthwise 7x7 convolution over a channels-last input with
its NHWC kernel, and over a contiguous one torch's generic depthwise kernel, several times
slower (ConvNeXt-T: docs/notes/measurements.md). So lowering tracks,
for each value not yet in memory, the strides eager would give it (``TValue.layout``), and
``LoweringContext.realize`` writes it in that order (``config.eager_layouts``).

The hint follows three rules: an elementwise op (every tensor operand has the result's shape)
orders its dims the way TensorIterator does, the first operand whose strides tell two dims
apart deciding; a permute permutes its operand's layout; a pad or a cat keeps a channels-last
order its operands share (eager's ``constant_pad_nd`` and ``cat`` keep their input's memory format: a
max-pool's padded input over a channels-last activation stays channels-last, where a contiguous
copy would read the activation across channels, 64 elements apart in ResNet's stem; any other
order, a transposed 3-d table say, is not a memory format and comes out contiguous). Anything
else gets no hint (a contiguous result, which is what kiln's metas promise). The hint changes where a value is
stored, never its values: every reader indexes the buffer through the ref's strides.
"""
from __future__ import annotations

from kiln.meta.symbolic import has_symbols
from kiln.meta.tensor_meta import contiguous_strides
from kiln.ops import prims
from kiln.inductor.lowering import TValue


def value_strides(v) -> tuple:
    """The strides a value has (in memory) or will have when realized."""
    if v.ref is not None:
        return tuple(v.ref.stride)
    return v.layout if v.layout is not None else contiguous_strides(v.shape)


def _order(shape, operand_strides) -> list:
    """Dims innermost first, as TensorIterator's ``reorder_dimensions`` sorts them: an
    insertion sort where, for two dims, the first operand with nonzero strides on both decides
    (a broadcast or size-1 dim says nothing); ties keep the dims' own order."""
    n = len(shape)

    def should_swap(d0, d1) -> int:
        for st in operand_strides:
            if shape[d0] == 1 or shape[d1] == 1:
                return 0
            s0, s1 = st[d0], st[d1]
            if s0 == 0 or s1 == 0:
                continue
            if s0 < s1:
                return -1
            if s0 > s1:
                return 1
        return 0

    perm = list(range(n - 1, -1, -1))  # innermost first
    for i in range(1, n):
        d1 = i
        for d0 in range(i - 1, -1, -1):
            c = should_swap(perm[d0], perm[d1])
            if c > 0:
                perm[d0], perm[d1] = perm[d1], perm[d0]
                d1 = d0
            elif c < 0:
                break
    return perm


def dense_in_order(shape, inner_first) -> tuple:
    out = [0] * len(shape)
    step = 1
    for d in inner_first:
        out[d] = step
        step *= shape[d]
    return tuple(out)


def _hint(shape, strides) -> tuple | None:
    """Dense strides in the order of ``strides``, or None where that is contiguous."""
    if any(s < 0 for s in strides):
        return None
    order = sorted(range(len(shape)), key=lambda d: (strides[d], -d))  # innermost first
    out = dense_in_order(shape, order)
    contiguous = contiguous_strides(shape)
    if all(sz == 1 or a == b for sz, a, b in zip(shape, out, contiguous)):
        return None
    return out


def layout_hint(target, meta, args, from_meta=False) -> tuple | None:
    """The layout eager would give the result of ``target(*args)``, or None (contiguous).
    ``from_meta``: the result of a reducing core op's decomposition (``decompose``), which eager
    allocates with the strides of its meta."""
    shape = tuple(meta.shape)
    if len(shape) < 2 or has_symbols(shape) or has_symbols(tuple(meta.stride)):
        return None
    if from_meta:
        return _hint(shape, tuple(meta.stride))
    if target is prims.permute:
        x, dims = args[0], args[1]
        if not isinstance(x, TValue):
            return None
        st = value_strides(x)
        if has_symbols(st) or any(s == 0 and n != 1 for s, n in zip(st, x.shape)):
            return None  # a broadcast: eager would copy it out contiguous
        return _hint(shape, [st[d] for d in dims])
    if target is prims.slice:
        # a strided view: eager's has the operand's dim order (a pooling window over an
        # unstored, channels-last padded input stays channels-last, as the stored one did)
        x = args[0]
        if not isinstance(x, TValue) or len(x.shape) != len(shape):
            return None
        st = value_strides(x)
        if has_symbols(st) or any(s == 0 and n != 1 for s, n in zip(st, x.shape)):
            return None
        return _hint(shape, st)
    if target is prims.pad or target is prims.cat:
        operands = list(args[0]) if target is prims.cat else [args[0]]
        return _shared_order(shape, [t for t in operands if isinstance(t, TValue)])
    tensors = [a for a in args if isinstance(a, TValue)]
    if not tensors or any(t.shape != shape for t in tensors):
        return None
    strides = [value_strides(t) for t in tensors]
    if has_symbols(strides) or all(s == contiguous_strides(shape) for s in strides):
        return None
    return _hint(shape, dense_in_order(shape, _order(shape, strides)))


def _shared_order(shape, operands) -> tuple | None:
    """Dense strides for ``shape`` in the dim order every operand shares (a pad's or a cat's
    result, same rank as its operands), or None where they disagree, broadcast or carry
    symbols: eager then allocates contiguous."""
    orders = set()
    for t in operands:
        st = value_strides(t)
        if len(st) != len(shape) or has_symbols(st) or any(s == 0 and n != 1 for s, n in zip(st, t.shape)):
            return None
        # a size-1 dim's stride says nothing about order: it sorts where contiguous puts it
        orders.add(tuple(sorted((d for d in range(len(st)) if t.shape[d] != 1), key=lambda d: (st[d], -d))))
    if len(orders) != 1:
        return None
    inner = list(next(iter(orders)))
    # eager keeps only a channels-last memory format (its suggest_memory_format): any other
    # shared order (RoPE's cat of a transposed [1, 64, 16] frequency table) comes out
    # contiguous, and a transposed hint made every reader of the cos table stride by 64
    channels_last = {4: (1, 3, 2, 0), 5: (1, 4, 3, 2, 0)}.get(len(shape))
    if channels_last is None or inner != [d for d in channels_last if d in inner]:
        return None
    for d in range(len(shape) - 1, -1, -1):  # the size-1 dims, outermost, in their own order
        if d not in inner:
            inner.append(d)
    return _hint(shape, dense_in_order(shape, inner))
