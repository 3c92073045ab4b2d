"""VJP rules for the shape ops of ``core_shape.py`` (slice, select, cat, flip, roll, tril/triu,
repeat, constant padding) and the scatter/random ops of ``core_scatter.py``.

split, chunk, unbind, narrow, stack, flatten and unflatten are captured as compositions of
these (and of the views), so their gradients come from these rules. Slicing's gradient is a
constant pad with zeros: an index transform that fuses, never a scatter.
"""
from __future__ import annotations

from kiln.ops import core
from kiln.ops.core_shape import slice_range
from kiln.ops.core_views import normalize_dim
from kiln.ops.registry import VJP_RULES
from kiln.autograd.rules import is_tensor, zeros_like


class RandomOpGradError(RuntimeError):
    pass


def _pad_dim(g, ndim, d, lo, hi):
    """constant_pad's pad list for one dim d of an ndim-d tensor (pairs start at the last dim)."""
    pad = [0, 0] * (ndim - d)
    pad[2 * (ndim - 1 - d)] = lo
    pad[2 * (ndim - 1 - d) + 1] = hi
    return core.constant_pad(g, tuple(pad), 0.0)


def _spread(g, d, step):
    """Insert step-1 zeros after every element along d: length n becomes n * step."""
    n = g.shape[d]
    g = core.unsqueeze(g, d + 1)
    g = _pad_dim(g, g.ndim, d + 1, 0, step - 1)
    shape = list(g.shape[:d]) + [n * step] + list(g.shape[d + 2:])
    return core.reshape(g, tuple(shape))


@VJP_RULES.register(core.slice)
def slice_vjp(g, out, x, dim=0, start=None, end=None, step=1):
    d = normalize_dim(dim, x.ndim, "slice")
    size = x.shape[d]
    s, e, st = slice_range(size, start, end, step)
    if g.shape[d] == 0:
        return zeros_like(x), None, None, None, None
    if st > 1:
        g = _spread(g, d, st)   # each kept element at offset 0 of its step-long stretch
    # place at s, crop or extend to size (negative padding crops the last stretch's zeros)
    return _pad_dim(g, g.ndim, d, s, size - s - g.shape[d]), None, None, None, None


@VJP_RULES.register(core.select)
def select_vjp(g, out, x, dim, index):
    d = normalize_dim(dim, x.ndim, "select")
    i = index % x.shape[d]
    g = core.unsqueeze(g, d)
    return _pad_dim(g, x.ndim, d, i, x.shape[d] - i - 1), None, None


@VJP_RULES.register(core.cat)
def cat_vjp(g, out, tensors, dim=0):
    """One slice of the gradient per input (1-d empty inputs, skipped by cat, get none)."""
    ref = next(t for t in tensors if not (t.ndim == 1 and t.shape[0] == 0))
    d = normalize_dim(dim, ref.ndim, "cat")
    grads, offset = [], 0
    for t in tensors:
        if t.ndim == 1 and t.shape[0] == 0 and ref.ndim != 1:
            grads.append(None)
            continue
        n = t.shape[d]
        grads.append(core.slice(g, d, offset, offset + n, 1) if is_tensor(t) else None)
        offset += n
    return grads, None


@VJP_RULES.register(core.flip)
def flip_vjp(g, out, x, dims):
    return core.flip(g, dims), None


@VJP_RULES.register(core.roll)
def roll_vjp(g, out, x, shifts, dims=None):
    shifts = (shifts,) if isinstance(shifts, int) else tuple(shifts)
    back = tuple(-s for s in shifts)
    if dims is None:
        return core.roll(g, back[0]), None, None
    return core.roll(g, back, dims), None, None


@VJP_RULES.register(core.tril)
def tril_vjp(g, out, x, diagonal=0):
    return core.tril(g, diagonal), None


@VJP_RULES.register(core.triu)
def triu_vjp(g, out, x, diagonal=0):
    return core.triu(g, diagonal), None


@VJP_RULES.register(core.repeat)
def repeat_vjp(g, out, x, repeats):
    """Split each repeated dim into (repeats, size) and sum over the repeats."""
    repeats = tuple(repeats)
    lead = len(repeats) - x.ndim
    shape, sum_dims = [], []
    for k, r in enumerate(repeats):
        if k < lead:
            sum_dims.append(len(shape))
            shape.append(r)
        else:
            sum_dims.append(len(shape))
            shape += [r, x.shape[k - lead]]
    g = core.reshape(g, tuple(shape))
    g = core.sum(g, tuple(sum_dims), False)
    return core.reshape(g, tuple(x.shape)), None


@VJP_RULES.register(core.constant_pad)
def constant_pad_vjp(g, out, x, pad, value=0.0):
    return core.constant_pad(g, tuple(-p for p in pad), 0.0), None, None


# ------------------------------------------------------------------ scatter / random
@VJP_RULES.register(core.scatter_add)
def scatter_add_vjp(g, out, x, dim, index, src):
    gsrc = None
    if is_tensor(src):
        gsrc = core.gather(g, dim, index)
        if tuple(index.shape) != tuple(src.shape):  # src elements outside index get no grad
            pad = []
            for d in reversed(range(src.ndim)):
                pad += [0, src.shape[d] - index.shape[d]]
            gsrc = core.constant_pad(gsrc, tuple(pad), 0.0)
    return (g if is_tensor(x) else None), None, None, gsrc


@VJP_RULES.register(core.index_add)
def index_add_vjp(g, out, x, dim, index, src, alpha=1):
    gsrc = None
    if is_tensor(src):
        gsrc = core.index_select(g, dim, index) if src.ndim else g
        if alpha != 1:
            gsrc = core.mul(gsrc, alpha)
    return (g if is_tensor(x) else None), None, None, gsrc, None


@VJP_RULES.register(core.dropout)
def dropout_vjp(g, out, x, p, training=True):
    if not training or p == 0:
        return g, None, None
    if p == 1:
        return zeros_like(g), None, None
    raise RandomOpGradError(
        "[vjp] core.dropout in training mode has no VJP rule: its mask is not an output. "
        "Capture dropout as where(ge(rand(shape), p), x * 1/(1-p), 0), whose rand node the "
        "partitioner saves, so the forward and the backward share the mask")
