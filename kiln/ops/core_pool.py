"""Core ops for pooling and resampling: ``max_pool2d``, ``avg_pool2d``,
``adaptive_avg_pool2d`` and ``interpolate`` (nearest, bilinear), over the last two dims.

Each op's computation is written once, as a *composite* of other core ops (windows are strided
slices of a padded input combined with ``maximum``/``add``; resampling is ``index_select`` at
indices computed from ``iota``, blended per axis). That one function serves twice:
- the decomposition runs it with every core op replaced by that op's own decomposition, so the
  prims graph holds slices, pads, pointwise ops, reductions and gathers (one fused kernel);
- the VJP rule runs it on a small tape and applies the VJP rules of its parts in reverse.
So the eager implementation is torch's, and the meta rule gives torch's output shape.

max_pool2d's gradient has its own rule, as eager's has: the forward side finds each window's
*first* maximum (a NaN wins, the last one if several, as in eager's kernel; a padded position
never does) and keeps its offset in the window as one int8 per output; the backward hands
each output's gradient to that one element. On CUDA the rule is written as "the output is
the window element the saved offset selects", run on the tape, so the slices' and the pad's
own rules place the gradient: one pointwise kernel reads, per input element, the gradients
and offsets of the windows that hold it. On the CPU it is a scatter-add of each output's
gradient at the position its offset names (``_scatter_grad``). (Before, the gradient came from ``maximum``'s rule over
the chain of maxima: it split ties, unlike eager, and the backward recomputed the chain for
every window of every element: 4.2 of 5.6 ms of kernel time in a small ResNet's step.)
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from kiln.graph.proxy import Proxy
from kiln.meta.strides import format_like_input
from kiln.meta.tensor_meta import TensorMeta
from kiln.ops.registry import DECOMPOSITIONS, META_RULES, VJP_RULES, define
from kiln.ops.vjp_utils import sum_to_shape

__all__ = ["max_pool2d", "avg_pool2d", "adaptive_avg_pool2d", "interpolate"]

LOW = (torch.float16, torch.bfloat16)


class PoolError(ValueError):
    pass


def _core():
    from kiln.ops import core
    return core


# ------------------------------------------------------------------ running a composite
class _AsPrims:
    """Calls a core op's decomposition in place of the op (inside a decomposition rule)."""

    def __call__(self, op, *args):
        return DECOMPOSITIONS[op](*args)


class _Tape:
    """Calls core ops and records them, for a reverse pass over their VJP rules."""

    def __init__(self):
        self.calls = []

    def __call__(self, op, *args):
        out = op(*args)
        self.calls.append((op, args, out))
        return out

    def grads(self, x, y, g):
        core = _core()
        acc = {y.node: g}
        for op, args, out in reversed(self.calls):
            if not isinstance(out, Proxy) or out.node not in acc or not out.meta.requires_grad:
                continue
            gin = VJP_RULES[op](acc.pop(out.node), out, *args)
            pairs = []
            for a, ga in zip(args, gin):  # a list argument (cat) has a list of gradients
                pairs += list(zip(a, ga)) if isinstance(a, (list, tuple)) and ga is not None else [(a, ga)]
            for a, ga in pairs:
                if not isinstance(a, Proxy) or ga is None or not a.meta.requires_grad:
                    continue
                ga = core.to_dtype(sum_to_shape(ga, tuple(a.shape)), a.dtype)
                acc[a.node] = core.add(acc[a.node], ga) if a.node in acc else ga
        return acc.get(x.node)


def _composite(op, forward, nparams):
    DECOMPOSITIONS[op] = lambda x, *params: forward(_AsPrims(), x, *params)

    def vjp(g, out, x, *params):
        tape = _Tape()
        y = forward(tape, x, *params)
        return (tape.grads(x, y, g),) + (None,) * nparams
    VJP_RULES[op] = vjp


def _opmath(call, x):
    return call(_core().to_dtype, x, torch.float32) if x.dtype in LOW else x


def _check_input(name, x):
    if x.ndim not in (3, 4):
        raise PoolError(f"[meta] core.{name}: expected a 3-d or 4-d input, got {x.ndim}-d")
    if not x.dtype.is_floating_point:
        raise PoolError(f"[meta] core.{name}: expected a floating point input, got {x.dtype}")


# ------------------------------------------------------------------ windows (max / avg pool)
def _pool_out(size, k, s, p):
    return (size + 2 * p - k) // s + 1


def _pool_meta(name, x, kernel, stride, padding):
    _check_input(name, x)
    for k, s, p in zip(kernel, stride, padding):
        if k <= 0 or s <= 0 or p < 0 or p > k // 2:
            raise PoolError(f"[meta] core.{name}: pad should be at most half of the effective "
                            f"kernel size (kernel {kernel}, stride {stride}, padding {padding})")
    out = [_pool_out(n, k, s, p) for n, k, s, p in zip(x.shape[-2:], kernel, stride, padding)]
    if min(out) <= 0:
        raise PoolError(f"[meta] core.{name}: output size {out} is too small for input "
                        f"{list(x.shape)}")
    return _like_input(x, tuple(x.shape[:-2]) + tuple(out))


def _like_input(x, shape):
    # pooling and interpolation allocate in their input's suggested memory format, as eager does
    return TensorMeta(shape, format_like_input(x, shape), x.dtype, x.device, x.requires_grad)


# Windows that read each input element at most this many times (3x3 stride 2: 2.25) recompute
# the padded input in the pool's kernel instead of storing it (``_recompute_in_users``).
RECOMPUTED_READS_LIMIT = 4


def _recompute_in_users(v, kernel, stride):
    """Mark a window source so lowering inlines it into every window instead of storing it.
    Stored, ResNet's bn+relu+pad before its 3x3/2 max pool was a 53 MB buffer at batch 32 bf16
    (most of kiln's extra peak memory over torch.compile's), written and read back once more;
    recomputed, each output loads 9 inputs that the overlapping windows share in cache, and the
    bn+relu is redone ~2.25 times per input element (Triton kernels only: lower.py keeps it
    stored for C++ kernels, where the masked loads would not vectorize). Larger reuse (a 3x3 stride-1 or an SPP
    13x13 pool) keeps the stored input: recomputing a chain 9-169 times would cost more."""
    reads = kernel[0] * kernel[1] / (stride[0] * stride[1])
    if isinstance(v, Proxy) and reads <= RECOMPUTED_READS_LIMIT:
        v.node.meta["recompute_in_users"] = True
    return v


def _windows(call, x, kernel, stride, padding, value):
    """The kh*kw strided views of the padded input, one per kernel offset, in scan order."""
    core = _core()
    (kh, kw), (sh, sw), (ph, pw) = kernel, stride, padding
    oh, ow = (_pool_out(n, k, s, p) for n, k, s, p in zip(x.shape[-2:], kernel, stride, padding))
    xp = call(core.constant_pad, x, (pw, pw, ph, ph), value) if ph or pw else x
    if xp is not x:
        _recompute_in_users(xp, kernel, stride)
    for i in range(kh):
        rows = _recompute_in_users(call(core.slice, xp, -2, i, i + sh * (oh - 1) + 1, sh), kernel, stride)
        for j in range(kw):
            yield call(core.slice, rows, -1, j, j + sw * (ow - 1) + 1, sw)


def _max_pool_forward(call, x, kernel, stride, padding):
    out = None
    for w in _windows(call, x, kernel, stride, padding, -math.inf):
        out = w if out is None else call(_core().maximum, out, w)
    return out


def _first_max_offsets(x, kernel, stride, padding):
    """Per output element, the offset in its window (scan order, int8 or int32) of the element
    eager's max_pool2d picks: the first maximum, or the last NaN; never a padded position."""
    core = _core()
    plain = _AsIs()
    windows = list(_windows(plain, x, kernel, stride, padding, -math.inf))
    inside = None
    if any(padding):  # a bool "inside" view of the same windows: padded positions are False
        everywhere = core.logical_not(core.lt(core.abs(x), -1.0))   # True, NaN included
        inside = list(_windows(plain, everywhere, kernel, stride, padding, False))
    dtype = torch.int8 if len(windows) <= 127 else torch.int32
    cur, idx = windows[0], None
    on_pad = None if inside is None else core.logical_not(inside[0])
    for k, w in enumerate(windows[1:], start=1):
        take = core.logical_or(core.gt(w, cur), core.isnan(w))
        if inside is not None:  # a real element replaces a padded one; a padded one never wins
            take = core.logical_and(core.logical_or(take, on_pad), inside[k])
            on_pad = core.logical_and(on_pad, core.logical_not(take))
        cur = core.where(take, w, cur)
        idx = core.to_dtype(take, dtype) if idx is None else core.where(take, k, idx)
    return idx


def _max_pool_vjp(g, out, x, kernel, stride, padding):
    core = _core()
    if kernel[0] * kernel[1] == 1:  # every window is one element: a strided slice of x
        tape = _Tape()
        y = next(_windows(tape, x, kernel, stride, padding, -math.inf))
        return tape.grads(x, y, g), None, None, None
    idx = _first_max_offsets(x, kernel, stride, padding)
    if x.device.type == "cpu":
        return _scatter_grad(g, x, idx, kernel, stride, padding), None, None, None
    tape = _Tape()
    y = None
    for k, w in enumerate(_windows(tape, x, kernel, stride, padding, -math.inf)):
        term = tape(core.where, core.eq(idx, k), w, 0.0)
        y = term if y is None else tape(core.add, y, term)
    return tape.grads(x, y, g), None, None, None


def _scatter_grad(g, x, idx, kernel, stride, padding):
    """The CPU form of the gradient: each output adds its gradient at the input position its
    offset names (a scatter-add over the outputs, as eager's CPU kernel does). The gather
    form, where each input element visits every window that may hold it, costs a division and
    a modulo per window per element in C++, which gcc does not vectorize: a small ResNet
    block's max_pool backward took 1.9 ms that way, 0.3 ms as a scatter (eager: 0.14 ms)."""
    core = _core()
    (kh, kw), (sh, sw), (ph, pw) = kernel, stride, padding
    h, w = x.shape[-2], x.shape[-1]
    oh, ow = g.shape[-2], g.shape[-1]
    lead = tuple(x.shape[:-2])
    # the positions and the zeros belong to the backward: computed in the forward, the int64
    # positions would be saved (8 bytes an output beside the 1-byte offsets), and their store
    # kept gcc from vectorizing the forward's window loop
    with g.graph_builder.inherit(backward_only=True):
        k = core.to_dtype(idx, torch.int64)
        rows = core.reshape(core.iota(g, oh), (oh, 1))
        rows = core.add(core.mul(rows, sh), core.sub(core.floor_divide(k, kw), ph))
        cols = core.add(core.mul(core.iota(g, ow), sw), core.sub(core.remainder(k, kw), pw))
        where = core.reshape(core.add(core.mul(rows, w), cols), lead + (oh * ow,))
        base = core.full(lead + (h * w,), 0.0, x.dtype, x.device)
    gx = core.scatter_add(base, len(lead), where, core.reshape(g, lead + (oh * ow,)))
    return core.reshape(gx, tuple(x.shape))


class _AsIs:
    """Calls core ops as they are (not recorded)."""

    def __call__(self, op, *args):
        return op(*args)


def _avg_pool_forward(call, x, kernel, stride, padding, count_include_pad=True, divisor=None):
    core = _core()
    xs = _opmath(call, x)
    total = None
    for w in _windows(call, xs, kernel, stride, padding, 0.0):
        total = w if total is None else call(core.add, total, w)
    if divisor is None and not count_include_pad and any(padding):
        never = call(core.lt, call(core.abs, xs), -1.0)  # False everywhere, NaN included
        ones = call(core.to_dtype, call(core.eq, never, False), torch.float32)
        counts = None
        for w in _windows(call, ones, kernel, stride, padding, 0.0):
            counts = w if counts is None else call(core.add, counts, w)
        out = call(core.div, total, counts)
    else:
        out = call(core.div, total, float(divisor or kernel[0] * kernel[1]))
    return call(core.to_dtype, out, x.dtype) if out.dtype != x.dtype else out


def _max_pool_eager(x, kernel, stride, padding):
    return F.max_pool2d(x, kernel, stride, padding)


def _avg_pool_eager(x, kernel, stride, padding, count_include_pad=True, divisor=None):
    return F.avg_pool2d(x, kernel, stride, padding, False, count_include_pad, divisor)


max_pool2d = define("core", "max_pool2d", _max_pool_eager)
META_RULES[max_pool2d] = lambda x, kernel, stride, padding: _pool_meta("max_pool2d", x, kernel, stride, padding)
_composite(max_pool2d, _max_pool_forward, 3)
VJP_RULES[max_pool2d] = _max_pool_vjp   # eager's rule: the first maximum takes the gradient

avg_pool2d = define("core", "avg_pool2d", _avg_pool_eager)
META_RULES[avg_pool2d] = (lambda x, kernel, stride, padding, count_include_pad=True, divisor=None:
                          _pool_meta("avg_pool2d", x, kernel, stride, padding))
_composite(avg_pool2d, _avg_pool_forward, 5)


# ------------------------------------------------------------------ adaptive average pool
def _bins(n_in, n_out):
    return [((i * n_in) // n_out, -(-((i + 1) * n_in) // n_out)) for i in range(n_out)]


def _adaptive_axis(call, x, dim, n_out):
    """Mean over each adaptive bin along dim (bins may overlap when sizes do not divide)."""
    core = _core()
    n_in = x.shape[dim]
    if n_in == n_out:
        return x
    if n_in % n_out == 0:  # equal, disjoint bins: one reshape and a mean
        k = n_in // n_out
        shape = tuple(x.shape[:dim]) + (n_out, k) + tuple(x.shape[dim + 1:])
        return call(core.mean, call(core.reshape, x, shape), (dim + 1,), False, None)
    parts = [call(core.mean, call(core.slice, x, dim, s, e, 1), (dim,), True, None)
             for s, e in _bins(n_in, n_out)]
    return call(core.cat, parts, dim)


def _adaptive_forward(call, x, output_size):
    if min(output_size) == 0:  # no bins: eager's empty result, still a function of x (its
        core = _core()         # gradient: zeros), as an empty slice of x reshaped
        empty = call(core.slice, x, x.ndim - 1, 0, 0, 1)
        return call(core.reshape, empty, tuple(x.shape[:-2]) + tuple(output_size))
    xs = _opmath(call, x)
    out = _adaptive_axis(call, _adaptive_axis(call, xs, x.ndim - 1, output_size[1]), x.ndim - 2,
                         output_size[0])
    return call(_core().to_dtype, out, x.dtype) if out.dtype != x.dtype else out


adaptive_avg_pool2d = define("core", "adaptive_avg_pool2d", lambda x, size: F.adaptive_avg_pool2d(x, size))


@META_RULES.register(adaptive_avg_pool2d)
def _adaptive_meta(x, output_size):
    _check_input("adaptive_avg_pool2d", x)
    if min(x.shape[-2:]) == 0 or min(output_size) < 0:  # an output size of 0 is empty, as eager
        raise PoolError(f"[meta] core.adaptive_avg_pool2d: empty input {list(x.shape)} or output "
                        f"size {output_size}")
    return _like_input(x, tuple(x.shape[:-2]) + tuple(output_size))


_composite(adaptive_avg_pool2d, _adaptive_forward, 1)


# ------------------------------------------------------------------ interpolate
def _f32(v: float) -> float:
    return torch.tensor(v, dtype=torch.float32).item()


def _axis_scale(n_in, n_out, scale, align_corners):
    if align_corners:
        return (n_in - 1) / (n_out - 1) if n_out > 1 else 0.0
    return 1.0 / scale if scale else n_in / n_out


def _resample_axis(call, x, dim, n_out, scale, mode, align_corners):
    core = _core()
    n_in = x.shape[dim]
    if n_in == n_out and (mode == "nearest" or not scale or scale == 1):
        return x
    pos = call(core.to_dtype, call(core.iota, x, n_out, torch.int64), torch.float32)
    s = _f32(_axis_scale(n_in, n_out, scale, align_corners))
    if mode == "nearest":
        idx = call(core.to_dtype, call(core.floor, call(core.mul, pos, s)), torch.int64)
        idx = call(core.minimum, idx, n_in - 1)
        return call(core.index_select, x, dim, idx)
    if align_corners:
        src = call(core.mul, pos, s)
    else:
        src = call(core.maximum, call(core.sub, call(core.mul, call(core.add, pos, 0.5), s), 0.5), 0.0)
    i0 = call(core.minimum, call(core.to_dtype, call(core.floor, src), torch.int64), n_in - 1)
    i1 = call(core.minimum, call(core.add, i0, 1), n_in - 1)
    l1 = call(core.sub, src, call(core.to_dtype, i0, torch.float32))
    l0 = call(core.sub, 1.0, l1)
    view = [1] * x.ndim
    view[dim] = n_out
    l0, l1 = call(core.reshape, l0, tuple(view)), call(core.reshape, l1, tuple(view))
    a = call(core.mul, call(core.index_select, x, dim, i0), l0)
    return call(core.add, a, call(core.mul, call(core.index_select, x, dim, i1), l1))


def _interpolate_forward(call, x, size, scales, mode, align_corners):
    xs = _opmath(call, x) if mode == "bilinear" else x
    out = _resample_axis(call, xs, x.ndim - 1, size[1], scales[1], mode, align_corners)
    out = _resample_axis(call, out, x.ndim - 2, size[0], scales[0], mode, align_corners)
    return call(_core().to_dtype, out, x.dtype) if out.dtype != x.dtype else out


def _interpolate_eager(x, size, scales, mode, align_corners):
    align = align_corners if mode != "nearest" else None  # eager refuses it for nearest
    if any(scales):
        return F.interpolate(x, scale_factor=scales, mode=mode, align_corners=align)
    return F.interpolate(x, size=size, mode=mode, align_corners=align)


interpolate = define("core", "interpolate", _interpolate_eager,
                     doc="resample the last two dims to size; scales are the user's scale "
                         "factors (None when size was given)")


@META_RULES.register(interpolate)
def _interpolate_meta(x, size, scales, mode, align_corners):
    _check_input("interpolate", x)
    if mode not in ("nearest", "bilinear") or x.ndim != 4:
        raise PoolError(f"[meta] core.interpolate: mode {mode!r} on a {x.ndim}-d input is not supported")
    if min(size) <= 0:
        raise PoolError(f"[meta] core.interpolate: output size {size} must be positive")
    return _like_input(x, tuple(x.shape[:-2]) + tuple(size))


_composite(interpolate, _interpolate_forward, 4)
