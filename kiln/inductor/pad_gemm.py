"""GEMM operands padded to aligned sizes before the library call (mm, addmm, bmm).

cuBLAS picks its kernel by the operands' alignment: a 16-bit GEMM whose leading dimensions
are not multiples of 8 elements (16 bytes) cannot use vector loads and stores, and runs on an
old ``align1`` kernel: GPT-2's LM head (768 x 50257, bf16, the vocab odd) ran 7x slower that
way, eager and kiln alike, than padded to 50264 columns (docs/notes/measurements.md;
torch.compile pads it the same way).

So where a GEMM is large and K or N is not a multiple of the alignment (8 elements for 16-bit
types, 4 for fp32 where cuBLAS may use tf32), kiln pads with zeros: K on both operands (the
extra products are zero, so the result is exact), N on the second operand and the bias; the
result is the ``[..., :N]`` view of the padded product. Its rows then have the padded stride:
a kernel reading it indexes through that stride, and a graph output is copied to the strides
its meta promised (``lower._output_ref``). M is left alone: it is no operand's leading
dimension, and padding it would copy the activations on every call.

A padded operand is a kiln kernel over the operand's own layout (a transposed weight stays
transposed), so it fuses with whatever produces the operand. A padded graph input (a weight) is
copied once per call, a small fraction of what the aligned kernel saves. Small GEMMs (``config.pad_gemm_min_mnk``) are left alone: there
the copy's launch costs more than the alignment gains; so are GEMMs bound by memory
(``compute_bound``).

A padded 2-D product that reaches only the graph's outputs would be copied whole into the
compact strides eager returns, so the padded product and its copy were alive together: an LM
head with an odd vocab (GPT-2's 50257, BERT's 30522) doubled its peak memory with two logits.
It is computed in row chunks instead (``prims.mm_compact``: each chunk's aligned GEMM into one
scratch, its first N columns copied out), and only one chunk of padding is alive.

``config.pad_gemm``: "auto" (CUDA only), "always" (any device: tests), "never".
"""
from __future__ import annotations

import math
import sys

import torch

from kiln.config import config
from kiln.graph.node import CALL, OUTPUT
from kiln.inductor import lowering as L
from kiln.inductor import lowering_views as LV
from kiln.inductor.layout import dense_in_order, value_strides
from kiln.meta.symbolic import has_symbols
from kiln.meta.tensor_meta import TensorMeta, contiguous_strides
from kiln.ops.registry import bind_stage, lookup


def alignment(dtype, device) -> int:
    """Elements per 16 bytes for the types cuBLAS runs on tensor cores; 0: never pad."""
    if dtype in (torch.float16, torch.bfloat16):
        return 8
    if dtype == torch.float32 and (config.pad_gemm == "always" or (
            device.type == "cuda" and torch.backends.cuda.matmul.allow_tf32)):
        return 4
    return 0


def _enabled(device) -> bool:
    mode = config.pad_gemm
    return mode == "always" or (mode == "auto" and device is not None and device.type == "cuda")


def padded_size(n: int, align: int) -> int:
    if align == 0 or n <= 1 or n % align == 0:
        return n
    return (n // align + 1) * align


def _pad(ctx, x, sizes: dict):
    """``x`` padded with zeros at the end of the dims in ``sizes`` (dim -> new size), stored in
    the order of ``x``'s own strides."""
    shape = list(x.shape)
    hi = [0] * len(shape)
    for d, n in sizes.items():
        hi[d % len(shape)] = n - shape[d]
        shape[d] = n
    if not any(hi):
        return x
    meta = TensorMeta.contiguous(shape, x.dtype, x.device)
    value = LV.pad_rule(ctx, meta, x, [0] * len(shape), hi, 0)
    st = value_strides(x)
    order = sorted(range(len(shape)), key=lambda d: (st[d], -d))  # innermost first
    ctx.realize(value, dense_in_order(shape, order), in_order=True)
    return value


def compute_bound(m, n, k) -> bool:
    """Multiply-adds per element moved (M*N*K over M*K + K*N + M*N) above
    ``config.pad_gemm_min_intensity``. Below it the GEMM is bound by memory, where alignment
    matters less and the pad's copy of an operand (a weight, for a matrix-vector-like shape) can
    cost as much as the product itself. The default, 100, is a Hopper GPU's bf16 rate over its
    bandwidth (about 206 flop per byte by the datasheet), halved: torch.compile's rule."""
    return m * n * k > config.pad_gemm_min_intensity * (m * k + k * n + m * n)


def gemm_rule(ctx, meta, *args):
    """Lowering of ``prims.mm(a, b)``, ``prims.addmm(bias, a, b)`` and ``prims.bmm(a, b)``."""
    bias, a, b = (None, *args) if len(args) == 2 else args
    tensors = [t for t in (bias, a, b) if t is not None]
    align = alignment(meta.dtype, meta.device)
    if not _enabled(meta.device) or not align or not all(isinstance(t, L.TValue) for t in tensors) \
            or has_symbols([t.shape for t in tensors]):
        return L.extern_rule(ctx, meta, *args)
    k, n = a.shape[-1], b.shape[-1]
    k2, n2 = padded_size(k, align), padded_size(n, align)
    m = math.prod(a.shape[:-1])
    if (k2, n2) == (k, n) or m * n * k < config.pad_gemm_min_mnk or not compute_bound(m, n, k):
        return L.extern_rule(ctx, meta, *args)
    a2 = _pad(ctx, a, {-1: k2})
    b2 = _pad(ctx, b, {-2: k2, -1: n2})
    out_shape = tuple(meta.shape[:-1]) + (n2,)
    out_meta = TensorMeta(out_shape, contiguous_strides(out_shape), meta.dtype, meta.device, meta.requires_grad)
    bias2 = None if bias is None else _pad(ctx, bias, {-1: n2})
    rows = _compact_rows(ctx, a, m, n2, meta) if n2 != n else None
    if rows is not None:
        return _compact_product(ctx, meta, bias2, a2, b2, n, rows)
    out = L.extern_rule(ctx, out_meta, a2, b2) if bias is None else L.extern_rule(ctx, out_meta, bias2, a2, b2)
    if n2 == n:
        return out
    ref = out.ref
    return L.TValue.of_ref(type(ref)(ref.buffer, meta.shape, ref.stride, ref.offset), meta.dtype, meta.device)


# A padded product that is only returned is computed in row chunks of at most 1/8 of it (and
# at least this many rows: a GEMM's efficiency holds at a few hundred rows of a wide N).
COMPACT_MIN_ROWS = 256
COMPACT_CHUNKS = 8


def _compact_rows(ctx, a, m, n2, meta):
    """The row chunk for a padded 2-D GEMM whose result reaches nothing but the graph's
    outputs (through shape views), else None. Such a result is copied whole to the compact
    strides eager returns (``lower._realize_output``), so the padded product and its copy were
    alive together: GPT-2's and BERT's LM heads (vocab 50257 and 30522) doubled their peak
    memory. Computed in chunks (``prims.mm_compact``), only one chunk of padding is alive."""
    node = getattr(ctx, "current_node", None)
    if node is None or len(a.shape) != 2 or not _only_returned(node):
        return None
    rows = max(COMPACT_MIN_ROWS, -(-m // COMPACT_CHUNKS))
    return rows if rows < m else None


# prims that re-index a compact result without moving it (a [B*T, V] product seen as [B, T, V])
_RESHAPES = ("reshape", "squeeze")


def _only_returned(node) -> bool:
    todo, seen = list(node.users), set()
    while todo:
        u = todo.pop()
        if u in seen:
            continue
        seen.add(u)
        if u.op == OUTPUT:
            continue
        if u.op == CALL and u.target.namespace == "prims" and u.target.name in _RESHAPES:
            todo.extend(u.users)
            continue
        return False
    return bool(seen)


def _compact_product(ctx, meta, bias2, a2, b2, n, rows):
    op, ctx.current_op = ctx.current_op, lookup("prims", "mm_compact")  # ops/op_mm.py
    try:
        return L.extern_rule(ctx, TensorMeta.contiguous(tuple(meta.shape), meta.dtype, meta.device,
                                                        meta.requires_grad), bias2, a2, b2, n, rows)
    finally:
        ctx.current_op = op


# The op files write their lowerings with this module's builders through a stage handle
# (ops/registry.py: the ops layer imports no stage); binding it resolves them.
bind_stage("pad_gemm", sys.modules[__name__])
