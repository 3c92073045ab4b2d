"""Eager's output layouts: the strides torch gives a freshly allocated result.

torch.compile promises graph outputs with eager's strides, and so does kiln: a later
``as_strided`` or a ``.view`` that depends on the layout must read what eager would. These are
torch's rules, computed on metadata:

* pointwise (TensorIterator's ``reorder_dimensions``): the result is dense, its dims laid out
  in the order of the operands' strides; dims an operand broadcasts (stride 0, or size 1 where
  the result is larger) carry no vote for it; the first operand that orders a pair decides,
  and equal strides put the smaller dim inside;
* ``clone`` (preserve format): a dense, non-overlapping input keeps its strides; others are
  laid out as pointwise would;
* reductions, softmax, norms and scans: contiguous (their metas say so already);
* ``cat``: channels-last when every input is, else contiguous;
* ops that allocate in their input's ``suggest_memory_format`` (constant pad, pooling,
  interpolation): channels-last when the input's strides are like channels-last, by c10's own
  test (``format_like_input``), else contiguous.

Symbolic sizes or strides give contiguous strides (their order is not known statically).
"""
from __future__ import annotations

from kiln.meta.tensor_meta import contiguous_strides


def _static(*xs) -> bool:
    return all(isinstance(v, int) for x in xs for v in x)


def dense_strides(shape, perm) -> tuple:
    """Strides of a dense tensor whose dims, innermost first, are ``perm``."""
    out = [0] * len(shape)
    step = 1
    for d in perm:
        out[d] = step
        step *= max(shape[d], 1)
    return tuple(out)


def _broadcast_strides(shape, meta):
    """meta's strides aligned to ``shape``: 0 where meta broadcasts (a missing or size-1 dim)."""
    lead = len(shape) - meta.ndim
    out = [0] * lead
    for d in range(meta.ndim):
        size = meta.shape[d]
        out.append(0 if size == 1 and shape[lead + d] != 1 else meta.stride[d])
    return out


def pointwise_perm(shape, metas):
    """The dims of ``shape``, innermost first, as TensorIterator orders them."""
    ndim = len(shape)
    strides = [_broadcast_strides(shape, m) for m in metas if m.ndim > 0]

    def should_swap(d0, d1):
        for st in strides:
            s0, s1 = st[d0], st[d1]
            if s0 == 0 or s1 == 0:
                continue
            if s0 < s1:
                return -1
            if s0 > s1:
                return 1
            if shape[d0] > shape[d1]:
                return 1
        return 0

    perm = list(range(ndim - 1, -1, -1))
    for i in range(1, ndim):
        d1 = i
        for d0 in range(i - 1, -1, -1):
            c = should_swap(perm[d0], perm[d1])
            if c > 0:
                perm[d0], perm[d1] = perm[d1], perm[d0]
                d1 = d0
            elif c < 0:
                break
    return perm


def pointwise_strides(shape, metas) -> tuple:
    shape = tuple(shape)
    metas = [m for m in metas if m is not None]
    if not _static(shape, *(m.shape for m in metas), *(m.stride for m in metas)):
        return contiguous_strides(shape)
    fast = _fast_setup(shape, metas)
    if fast is not None:
        return fast
    return dense_strides(shape, pointwise_perm(shape, metas))


def _fast_setup(shape, metas):
    """TensorIterator's fast setup, which runs before any reordering when every operand has the
    result's shape: all contiguous gives contiguous, all channels-last-contiguous gives
    channels-last. It decides the strides of size-1 dims, which the reordering would carry
    over from the operand: relu of a [2, 1, 8, 8] tensor with strides (64, 1, 8, 1) is
    (64, 64, 8, 1), and a later pool reads that as contiguous."""
    if not metas or any(tuple(m.shape) != shape for m in metas):
        return None
    if all(m.is_contiguous() for m in metas):
        return contiguous_strides(shape)
    if len(shape) in (4, 5):
        cl = dense_strides(shape, channels_last_order(len(shape)))
        if all(all(n == 1 or a == b for n, a, b in zip(shape, m.stride, cl)) for m in metas):
            return cl
    return None


def is_dense(shape, stride) -> bool:
    """Non-overlapping and dense: some order of the dims is contiguous."""
    dims = sorted((d for d in range(len(shape)) if shape[d] != 1), key=lambda d: stride[d])
    step = 1
    for d in dims:
        if stride[d] != step:
            return False
        step *= shape[d]
    return True


def preserve_strides(meta) -> tuple:
    """clone()'s strides (torch.preserve_format)."""
    if not _static(meta.shape, meta.stride):
        return contiguous_strides(meta.shape)
    if is_dense(meta.shape, meta.stride):
        return tuple(meta.stride)
    return pointwise_strides(meta.shape, [meta])


def _is_channels_last(meta) -> bool:
    if meta.ndim not in (4, 5) or not _static(meta.shape, meta.stride):
        return False
    perm = [1] + list(range(meta.ndim - 1, 1, -1)) + [0]
    return tuple(meta.stride) == dense_strides(meta.shape, perm) and tuple(meta.stride) != contiguous_strides(meta.shape)


def cat_strides(metas, out_shape) -> tuple:
    metas = [m for m in metas if m.numel() != 0] or metas
    if metas and all(_is_channels_last(m) for m in metas) and len(out_shape) == metas[0].ndim:
        nd = len(out_shape)
        return dense_strides(out_shape, [1] + list(range(nd - 1, 1, -1)) + [0])
    return contiguous_strides(out_shape)


def channels_last_order(ndim) -> list:
    """The dims of a channels-last (4-d) or channels-last-3d (5-d) tensor, innermost first."""
    return [1] + list(range(ndim - 1, 1, -1)) + [0]


def strides_like_channels_last(shape, stride) -> bool:
    """c10's ``is_channels_last_strides_2d/3d``: walking channels, then the spatial dims inner
    to outer, then the batch, the strides never fall below the extent walked so far. Ambiguous
    cases (a size-1 channel dim with the batch's stride, a zero channel stride) read as
    contiguous, as torch reads them."""
    if len(shape) not in (4, 5) or not _static(shape, stride) or stride[1] == 0:
        return False
    low = 0
    for d in channels_last_order(len(shape)):
        if shape[d] == 0 or stride[d] < low:
            return False
        if d == 0 and low == stride[1]:
            return False
        low = stride[d] * shape[d] if shape[d] > 1 else stride[d]
    return True


def format_like_input(x, out_shape) -> tuple:
    """Strides of a fresh result allocated in ``x.suggest_memory_format()`` (same rank)."""
    out_shape = tuple(out_shape)
    if len(out_shape) == x.ndim and _static(out_shape) and strides_like_channels_last(x.shape, x.stride):
        return dense_strides(out_shape, channels_last_order(len(out_shape)))
    return contiguous_strides(out_shape)
