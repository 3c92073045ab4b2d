"""VJP rules for the core ops, written in core ops.

A rule has the signature

    rule(grad_out, out, *args, **kwargs) -> tuple   (one entry per positional argument)

- ``args``/``kwargs`` are the forward call's arguments: ``Proxy`` objects for tensors, plain
  Python values otherwise (dims, alpha, dtype ...).
- ``out`` is the forward result (a ``Proxy``; a tuple of them for multi-output ops).
- ``grad_out`` is the gradient of ``out`` (a ``Proxy``; for multi-output ops a tuple with
  ``None`` where an output received no gradient).
- The result has one gradient per positional argument, ``None`` where the argument is not a
  tensor or not differentiable.

A rule may return a gradient in the *broadcast* shape and in the computation dtype: the
joint-graph builder reduces every gradient to its input's shape (``sum_to_shape``) and casts
it to its input's dtype, so the broadcasting bookkeeping lives in one place.

Calling a core op on Proxies records a node (with its meta) into the joint graph under
construction. This file holds the helpers and the rules of the basic ops (core.py, views,
reductions); the other families live in rules_elementwise.py, rules_shape.py (with scatter and
random ops) and rules_nn.py. Ops without a rule here (comparisons, argmax/argmin, any/all) have outputs that
never require grad, so the builder never asks for them; anything else raises ``MissingRule``.
"""
from __future__ import annotations

import math

from kiln.meta.symbolic import same_shape
from kiln.graph.proxy import Proxy
from kiln.ops import core
from kiln.ops.core_views import normalize_dim
from kiln.ops.registry import VJP_RULES
from kiln.ops.vjp_utils import (_one_minus, broadcasts_to, in_backward, is_tensor,  # noqa: F401
                                keepdim_shape, reduce_dims, restore_reduced, sum_to_shape, zeros_like)

# ------------------------------------------------------------------ helpers


# ------------------------------------------------------------------ elementwise
@VJP_RULES.register(core.mul)
def mul_vjp(g, out, a, b):
    return (core.mul(g, b) if is_tensor(a) else None,
            core.mul(g, a) if is_tensor(b) else None)


@VJP_RULES.register(core.div)
def div_vjp(g, out, a, b):
    ga = core.div(g, b) if is_tensor(a) else None
    # d(a/b)/db = -a/b^2 = -out/b
    gb = core.neg(core.div(core.mul(g, out), b)) if is_tensor(b) else None
    return ga, gb


@VJP_RULES.register(core.neg)
def neg_vjp(g, out, x):
    return (core.neg(g),)


@VJP_RULES.register(core.abs)
def abs_vjp(g, out, x):
    # g * sign(x), with sign(0) = 0 as eager's abs backward
    return (core.where(core.gt(x, 0), g, core.where(core.lt(x, 0), core.neg(g), 0.0)),)


@VJP_RULES.register(core.relu)
def relu_vjp(g, out, x):
    return (core.where(core.gt(out, 0), g, 0.0),)


def _minmax_vjp(select_a):
    """maximum/minimum: the gradient goes to the selected side; ties split it in half (eager)."""
    def rule(g, out, a, b):
        half = core.div(g, 2.0)
        tie = core.eq(a, b)
        a_wins = select_a(a, b)
        ga = core.where(tie, half, core.where(a_wins, g, 0.0)) if is_tensor(a) else None
        gb = core.where(tie, half, core.where(a_wins, 0.0, g)) if is_tensor(b) else None
        return ga, gb
    return rule


VJP_RULES[core.maximum] = _minmax_vjp(core.gt)
VJP_RULES[core.minimum] = _minmax_vjp(core.lt)


@VJP_RULES.register(core.where)
def where_vjp(g, out, cond, a, b):
    return (None,
            core.where(cond, g, 0.0) if is_tensor(a) else None,
            core.where(cond, 0.0, g) if is_tensor(b) else None)


@VJP_RULES.register(core.to_dtype)
def to_dtype_vjp(g, out, x, dtype):
    return (core.to_dtype(g, x.dtype) if g.dtype != x.dtype else g, None)


# ------------------------------------------------------------------ views
@VJP_RULES.register(core.reshape)
def reshape_vjp(g, out, x, shape):
    return core.reshape(g, tuple(x.shape)), None


@VJP_RULES.register(core.squeeze)
def squeeze_vjp(g, out, x, dims=None):
    return core.reshape(g, tuple(x.shape)), None


@VJP_RULES.register(core.unsqueeze)
def unsqueeze_vjp(g, out, x, dim):
    return core.reshape(g, tuple(x.shape)), None


@VJP_RULES.register(core.permute)
def permute_vjp(g, out, x, dims):
    dims = [normalize_dim(d, x.ndim) for d in dims]
    inverse = [0] * len(dims)
    for i, d in enumerate(dims):
        inverse[d] = i
    return core.permute(g, inverse), None


@VJP_RULES.register(core.transpose)
def transpose_vjp(g, out, x, dim0, dim1):
    return core.transpose(g, dim0, dim1), None, None


@VJP_RULES.register(core.expand)
def expand_vjp(g, out, x, shape):
    return sum_to_shape(g, tuple(x.shape)), None


@VJP_RULES.register(core.contiguous, core.clone)
def contiguous_vjp(g, out, x):
    return (g,)


# ------------------------------------------------------------------ reductions
@VJP_RULES.register(core.mean)
def mean_vjp(g, out, x, dims=None, keepdim=False, dtype=None):
    dims = reduce_dims(x, dims)
    n = math.prod(x.shape[d] for d in dims)
    return (core.div(restore_reduced(g, x, dims), float(n)), None, None, None)


@VJP_RULES.register(core.prod)
def prod_vjp(g, out, x, dims=None, keepdim=False, dtype=None):
    """Exact with zeros: with no zero in a slice the gradient is prod/x; with exactly one zero,
    only the zero element gets the product of the others; with two or more, all get 0."""
    dims = reduce_dims(x, dims)
    if not dims:
        return (g, None, None, None)
    is_zero = core.eq(x, 0)
    zeros = restore_reduced(core.sum(is_zero, dims, True), x, dims)
    prod_nonzero = restore_reduced(core.prod(core.where(is_zero, 1.0, x), dims, True), x, dims)
    gx = restore_reduced(g, x, dims)
    no_zero = core.div(prod_nonzero, core.where(is_zero, 1.0, x))
    one_zero = core.where(is_zero, prod_nonzero, 0.0)
    local = core.where(core.eq(zeros, 0), no_zero, core.where(core.eq(zeros, 1), one_zero, 0.0))
    return (core.mul(gx, local), None, None, None)


def _selected_vjp(g, out, x, dims):
    """amax/amin/max(dim)/min(dim): the gradient is shared evenly among the elements equal to
    the result (eager's amax/amin rule)."""
    mask = core.to_dtype(core.eq(x, restore_reduced(out, x, dims)), g.dtype)
    count = restore_reduced(core.sum(mask, dims, True), x, dims)
    return core.mul(core.div(restore_reduced(g, x, dims), count), mask)


@VJP_RULES.register(core.amax, core.amin)
def amax_vjp(g, out, x, dims=None, keepdim=False):
    dims = reduce_dims(x, dims)
    if not dims:
        return (g, None, None)
    return (_selected_vjp(g, out, x, dims), None, None)


@VJP_RULES.register(core.max_dim, core.min_dim)
def max_dim_vjp(g, out, x, dim, keepdim=False):
    """values' gradient goes to the one index returned, as in eager (ties included): a
    scatter of the gradient into zeros at the indices."""
    g_values = g[0]
    if g_values is None:
        return (None, None, None)
    if x.ndim == 0:
        return (g_values, None, None)
    d = normalize_dim(dim, x.ndim)
    index = out[1]
    if not keepdim:
        index, g_values = core.unsqueeze(index, d), core.unsqueeze(g_values, d)
    return (core.scatter_add(zeros_like(x), d, index, g_values), None, None)


@VJP_RULES.register(core.var)
def var_vjp(g, out, x, dims=None, correction=1, keepdim=False):
    dims = reduce_dims(x, dims)
    n = math.prod(x.shape[d] for d in dims)
    mean = restore_reduced(core.mean(x, dims, True), x, dims)
    scale = 2.0 / (n - correction) if n - correction > 0 else math.inf
    centered = core.sub(x, mean)
    return (core.mul(core.mul(restore_reduced(g, x, dims), centered), scale), None, None, None)


@VJP_RULES.register(core.logsumexp)
def logsumexp_vjp(g, out, x, dims, keepdim=False):
    dims = reduce_dims(x, dims)
    if not dims:
        return (g, None, None)
    probs = core.exp(core.sub(x, restore_reduced(out, x, dims)))
    return (core.mul(restore_reduced(g, x, dims), probs), None, None)


@VJP_RULES.register(core.softmax)
def softmax_vjp(g, out, x, dim, dtype=None):
    if out.ndim == 0:
        return (core.mul(g, 0.0), None, None)
    d = normalize_dim(dim, out.ndim)
    gy = core.mul(g, out)
    return (core.sub(gy, core.mul(out, core.sum(gy, (d,), True))), None, None)


@VJP_RULES.register(core.log_softmax)
def log_softmax_vjp(g, out, x, dim, dtype=None):
    if out.ndim == 0:
        return (core.mul(g, 0.0), None, None)
    d = normalize_dim(dim, out.ndim)
    return (core.sub(g, core.mul(core.exp(out), core.sum(g, (d,), True))), None, None)


# ------------------------------------------------------------------ library ops
@VJP_RULES.register(core.linear)
def linear_vjp(g, out, x, weight, bias=None):
    """y = x @ W^T + b over any leading dims of x: flatten them, two mms, sum for the bias."""
    n_out, n_in = weight.shape
    g2 = core.reshape(g, (-1, n_out)) if g.ndim != 2 else g
    x2 = core.reshape(x, (-1, n_in)) if x.ndim != 2 else x
    gx = core.mm(g2, weight)
    if tuple(gx.shape) != tuple(x.shape):
        gx = core.reshape(gx, tuple(x.shape))
    gw = core.mm(core.transpose(g2, 0, 1), x2)
    gb = None
    if is_tensor(bias):
        gb = core.sum(g2, (0,), False) if g.ndim > 1 else g
    return gx, gw, gb


__all__ = ["sum_to_shape", "reduce_dims", "restore_reduced", "keepdim_shape", "zeros_like",
           "in_backward"]

# The rules of the other core-op families (they import the helpers above).
from kiln.autograd import rules_elementwise, rules_shape, rules_nn  # noqa: E402,F401
from kiln.autograd import rules_mutation  # noqa: E402,F401
