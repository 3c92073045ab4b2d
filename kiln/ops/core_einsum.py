"""core.einsum: contractions of one or two operands written as an explicit equation.

Capture normalizes what the user wrote (``kiln/capture/torch_api_einsum.py``): spaces dropped,
``...`` replaced by fresh letters, the implicit output made explicit, and three or more operands
contracted pairwise, so the op sees ``"bij,bjk->bik"`` with one or two operands, each letter at
most once per operand (a repeated letter, a diagonal or trace, stays a fallback node).

The decomposition classifies the letters of ``a, b -> out``: *batch* (in a, b and out),
*contracted* (in a and b only), *kept* (in one operand and out) and *summed* (in one operand
only, summed away first). A float contraction is one ``bmm`` over [batch, a-kept, contracted] x
[batch, contracted, b-kept]; without contracted letters (outer products, batch scaling), or for
integers, it is a broadcast multiply (pointwise, it fuses) followed by a sum. Size-1 dims
broadcast against the other operand, as in eager.
"""
from __future__ import annotations

import math

import torch

from kiln.meta.tensor_meta import TensorMeta
from kiln.ops import prims
from kiln.ops.prim_utils import to_dtype
from kiln.ops.registry import DECOMPOSITIONS, META_RULES, define

__all__ = ["einsum", "parse_einsum"]

LOW = (torch.float16, torch.bfloat16)


class EinsumError(ValueError):
    pass


def parse_einsum(equation: str, ndims) -> tuple[list[str], str]:
    """(operand subscripts, output subscripts) of a normalized equation, checked against the
    operands' ranks."""
    if "->" not in equation:
        raise EinsumError(f"[meta] core.einsum: equation {equation!r} has no explicit output")
    lhs, out = equation.split("->")
    subs = lhs.split(",")
    if len(subs) != len(ndims) or len(subs) not in (1, 2):
        raise EinsumError(f"[meta] core.einsum: {equation!r} names {len(subs)} operands, got {len(ndims)}")
    for s, n in zip(subs + [out], list(ndims) + [None]):
        if not s.isalpha() and s:
            raise EinsumError(f"[meta] core.einsum: subscripts {s!r} must be letters")
        if len(set(s)) != len(s):
            raise EinsumError(f"[meta] core.einsum: a letter repeats in {s!r} (diagonals are not a core op)")
        if n is not None and len(s) != n:
            raise EinsumError(f"[meta] core.einsum: subscripts {s!r} do not match an operand of {n} dims")
    if not set(out) <= set("".join(subs)):
        raise EinsumError(f"[meta] core.einsum: output letters {out!r} are not in the operands")
    return subs, out


def letter_sizes(subs, shapes, equation) -> dict:
    """Each letter's size; a size-1 dim broadcasts against the same letter's other size."""
    sizes: dict = {}
    for s, shape in zip(subs, shapes):
        for c, n in zip(s, shape):
            old = sizes.get(c)
            if old is None or old == 1:
                sizes[c] = n
            elif n != 1 and n != old:
                raise EinsumError(f"[meta] core.einsum({equation!r}): letter {c!r} has sizes {old} and {n}")
    return sizes


def _einsum_eager(equation, *operands):
    return torch.einsum(equation, *operands)


einsum = define("core", "einsum", _einsum_eager)


@META_RULES.register(einsum)
def _einsum_meta(equation, *operands):
    subs, out = parse_einsum(equation, [o.ndim for o in operands])
    dtypes = {o.dtype for o in operands}
    if len(dtypes) != 1:
        raise EinsumError(f"[meta] core.einsum: operands have different dtypes {sorted(map(str, dtypes))}")
    sizes = letter_sizes(subs, [o.shape for o in operands], equation)
    grad = any(o.requires_grad for o in operands)
    shape = tuple(sizes[c] for c in out)
    if len(operands) == 1 and sorted(subs[0]) == sorted(out) and len(set(out)) == len(out):
        # one operand, every letter kept once: torch returns a permuted view of it
        x = operands[0]
        stride = tuple(x.stride[subs[0].index(c)] for c in out)
        return TensorMeta(shape, stride, x.dtype, x.device, grad)
    return TensorMeta.contiguous(shape, operands[0].dtype, operands[0].device, grad)


def _sum_letters(x, s, drop):
    """Sum x (subscripts s) over the letters in drop; returns (x, remaining subscripts)."""
    dims = tuple(i for i, c in enumerate(s) if c in drop)
    if not dims:
        return x, s
    return prims.sum(x, dims), "".join(c for c in s if c not in drop)


def _arrange(x, s, order, sizes):
    """x (subscripts s) permuted to ``order`` (letters of s, plus letters x lacks as new dims),
    each dim broadcast to its letter's size."""
    kept = [c for c in order if c in s]
    if kept != list(s):
        x = prims.permute(x, tuple(s.index(c) for c in kept))
    shape = tuple(sizes[c] for c in order)
    if tuple(x.shape) != shape:
        x = prims.broadcast_in_dim(x, shape, tuple(order.index(c) for c in kept))
    return x


@DECOMPOSITIONS.register(einsum)
def _einsum_decomp(equation, *operands):
    subs, out = parse_einsum(equation, [o.ndim for o in operands])
    sizes = letter_sizes(subs, [o.shape for o in operands], equation)
    # letters only one operand has and the output lacks are summed away first
    used = [set(out).union(*(set(t) for j, t in enumerate(subs) if j != i)) for i in range(len(subs))]
    xs, subs = map(list, zip(*(_sum_letters(x, s, set(s) - u) for x, s, u in zip(operands, subs, used))))
    if len(xs) == 1:
        return _arrange(xs[0], subs[0], out, sizes)
    return _contract(xs, subs, out, sizes)


def _contract(xs, subs, out, sizes):
    (a, b), (sa, sb) = xs, subs
    contracted = [c for c in sa if c in sb and c not in out]
    if not contracted or not a.dtype.is_floating_point:
        # broadcast multiply over every letter, then sum the contracted ones (half precision
        # in float32, rounded once, as eager's matmul does)
        dtype = a.dtype
        if dtype in LOW:
            a, b = to_dtype(a, torch.float32), to_dtype(b, torch.float32)
        full = out + "".join(contracted)
        prod = prims.mul(_arrange(a, sa, full, sizes), _arrange(b, sb, full, sizes))
        if contracted:
            prod = prims.sum(prod, tuple(range(len(out), len(full))))
        return to_dtype(prod, dtype)
    batch = [c for c in out if c in sa and c in sb]
    a_kept = [c for c in sa if c in out and c not in sb]
    b_kept = [c for c in sb if c in out and c not in sa]
    nb, na, nk, nc = (math.prod(sizes[c] for c in g) for g in (batch, a_kept, b_kept, contracted))
    a3 = prims.reshape(_arrange(a, sa, "".join(batch + a_kept + contracted), sizes), (nb, na, nc))
    b3 = prims.reshape(_arrange(b, sb, "".join(batch + contracted + b_kept), sizes), (nb, nc, nk))
    order = batch + a_kept + b_kept
    r = prims.reshape(prims.bmm(a3, b3), tuple(sizes[c] for c in order))
    perm = tuple(order.index(c) for c in out)
    return prims.permute(r, perm) if perm != tuple(range(len(out))) else r
