"""Reduction entries: sum, mean, prod, amax/amin, max/min (with indices), argmax/argmin,
any/all, var/std (correction), logsumexp, norm and cumsum, with dim, keepdim and dtype."""
from __future__ import annotations

import math

import torch

from .common import ALL, BOOL, FLOATS, INTS, BadInput, OpEntry, rand, reduce_input


def dims(*specs, empty=True):
    """Samples (x, dim, keepdim) over three layouts; an empty input reduced over a kept dim."""
    def make(dtype, device, **kw):
        xs = reduce_input(dtype, device, **kw)
        out = [(x, d, k) for x, (d, k) in zip(xs * len(specs), specs)]
        out.append((rand((2, 3, 4), dtype, device, **kw), (0, 2), True))
        if empty:
            out.append((rand((0, 12), dtype, device, **kw), 1, False))
        return out
    return make


STD = dims((-1, False), (0, True), ((0, 1), False))
SMALL = lambda dtype, device: dims((-1, False), (0, True), (1, True))(dtype, device, low=-2, high=3)  # noqa: E731


def empty_dims(dtype, device):
    """STD plus reductions over an empty dim (sum-like ops give their identity, logsumexp -inf)."""
    return STD(dtype, device) + [(rand((0, 12), dtype, device), 0, False),
                                 (rand((3, 0), dtype, device), 1, True)]


def R(name, fn, samples=STD, dtypes=FLOATS, **kw):
    return OpEntry(name, fn, samples, dtypes, **kw)


def _special(dtype, device):
    x = rand((4, 9), dtype, device)
    x[0, 3] = float("nan")
    x[1, :] = float("-inf")
    x[2, 5] = float("inf")
    return [(x,)]


ENTRIES = [
    R("sum", lambda x, d, k: x.sum(d, keepdim=k), dtypes=ALL + BOOL, differentiable=True),
    R("sum_all", lambda x, d, k: torch.sum(x), dtypes=ALL, differentiable=True),
    R("sum_dtype", lambda x, d, k: torch.sum(x, d, keepdim=k, dtype=torch.float32), dtypes=FLOATS + INTS),
    R("mean", lambda x, d, k: x.mean(d, keepdim=k), differentiable=True),
    R("mean_dtype", lambda x, d, k: torch.mean(x, d, k, dtype=torch.float32), dtypes=(torch.float16,)),
    R("prod", lambda x, d, k: x.prod(d if isinstance(d, int) else -1, keepdim=k), SMALL, ALL,
      differentiable=True),
    R("prod_dtype", lambda x, d, k: torch.prod(x, -1, dtype=torch.float64), SMALL, INTS),
    R("amax", lambda x, d, k: x.amax(d, keepdim=k), dims((-1, False), (0, True), ((0, 1), False), empty=False),
      ALL, differentiable=True),
    R("amin", lambda x, d, k: torch.amin(x, d, k), dims((-1, False), (0, True), ((0, 1), False), empty=False),
      ALL, differentiable=True),
    R("max_all", lambda x, d, k: torch.max(x) + x.min(), dims((-1, False), empty=False), ALL),
    R("max_dim", lambda x, d, k: torch.max(x, d if isinstance(d, int) else 0, keepdim=k), SMALL, ALL,
      differentiable=True),
    R("min_dim", lambda x, d, k: x.min(d if isinstance(d, int) else -1, k), SMALL, ALL, differentiable=True),
    R("argmax", lambda x, d, k: x.argmax(d if isinstance(d, int) else None, keepdim=k), SMALL, ALL),
    R("argmin", lambda x, d, k: torch.argmin(x, d if isinstance(d, int) else 0), SMALL, ALL),
    R("any_all", lambda x, d, k: (x.any(d if isinstance(d, int) else 0, keepdim=k), torch.all(x > -2)),
      dtypes=ALL + BOOL),
    R("var", lambda x, d, k: x.var(d, keepdim=k), differentiable=True),
    R("var_correction", lambda x, d, k: torch.var(x, d, correction=0, keepdim=k) + x.var(d, correction=2, keepdim=k),
      differentiable=True),
    R("std", lambda x, d, k: torch.std(x, d, unbiased=False, keepdim=k) + x.std(d, keepdim=k), differentiable=True),
    R("logsumexp", lambda x, d, k: torch.logsumexp(x, d, keepdim=k), empty_dims, differentiable=True),
    R("norm", lambda x, d, k: torch.norm(x, dim=d, keepdim=k) + x.norm(1, d, k), differentiable=True),
    R("vector_norm", lambda x, d, k: torch.linalg.vector_norm(x, 3, d, k) + torch.linalg.vector_norm(x, 0.5, d, k, dtype=torch.float32).to(x.dtype),
      differentiable=True),
    R("norm_inf", lambda x, d, k: torch.linalg.vector_norm(x, math.inf, d, k) + torch.linalg.vector_norm(x, -math.inf, d, k),
      dims((-1, False), (0, True), ((0, 1), False), empty=False)),
    R("cumsum", lambda x, d, k: torch.cumsum(x, d if isinstance(d, int) else 0), dtypes=ALL + BOOL,
      differentiable=True),
    R("cumsum_dtype", lambda x, d, k: x.cumsum(-1, dtype=torch.float64), dtypes=FLOATS + INTS),
    R("reduce_special", lambda x: (x.amax(-1), x.sum(-1), torch.logsumexp(x, -1), x.argmax(-1), x.max(-1)),
      _special),
]

BAD = [
    BadInput("sum_dim_out_of_range", lambda x: x.sum(5), lambda: (torch.randn(3, 4),)),
    BadInput("amax_of_empty", lambda x: x.amax(1), lambda: (torch.randn(3, 0),)),
    BadInput("mean_of_int", lambda x: x.mean(), lambda: (torch.arange(4),)),
    BadInput("norm_of_int", lambda x: torch.linalg.vector_norm(x), lambda: (torch.arange(4),)),
    BadInput("cumsum_dim", lambda x: torch.cumsum(x, 2), lambda: (torch.randn(3, 4),)),
]
