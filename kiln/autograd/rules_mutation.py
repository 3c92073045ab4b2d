"""VJP rules of the ops functionalization records (kiln/ops/core_mutation.py).

A write ``out = scatter(base, src)`` passes the gradient of the positions it did not write to
``base``, and the gradient of the positions it wrote to ``src`` (eager's CopySlices does the
same for an in-place write into a view).
"""
from __future__ import annotations

from kiln.autograd.rules import zeros_like
from kiln.ops import core
from kiln.ops.registry import VJP_RULES


@VJP_RULES.register(core.slice_scatter)
def slice_scatter_vjp(g, out, base, src, dim=0, start=None, end=None, step=1):
    written = core.slice(g, dim, start, end, step)
    return (core.slice_scatter(g, zeros_like(written), dim, start, end, step), written,
            None, None, None, None)


@VJP_RULES.register(core.select_scatter)
def select_scatter_vjp(g, out, base, src, dim, index):
    written = core.select(g, dim, index)
    return core.select_scatter(g, zeros_like(written), dim, index), written, None, None


@VJP_RULES.register(core.index_put)
def index_put_vjp(g, out, base, dim, index, values, accumulate=False):
    size = base.shape[dim]  # index_put takes negative indices, index_select does not
    index = core.where(core.lt(index, 0), core.add(index, size), index)
    written = core.index_select(g, dim, index)
    gb = g if accumulate else core.index_put(g, dim, index, zeros_like(written))
    return gb, None, None, written, None


@VJP_RULES.register(core.scatter)
def scatter_vjp(g, out, base, dim, index, src):
    written = core.gather(g, dim, index)
    return core.scatter(g, dim, index, zeros_like(written)), None, None, written


@VJP_RULES.register(core.detach)
def detach_vjp(g, out, x):
    return (None,)
