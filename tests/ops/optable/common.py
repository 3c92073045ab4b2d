"""The op table's data types and sample makers.

An ``OpEntry`` is data: a torch-level function, a sample maker ``samples(dtype, device)`` that
returns a list of argument tuples (tensors, Python scalars, dims, dtypes), the dtypes it takes,
tolerance overrides, a ``differentiable`` flag for the grad test, and expected failures per
way (``xfail={way_or_group: reason}``, strict). ``tests/ops/test_optable.py`` runs every entry
each way (see ``runner.WAYS``).

Samples of one entry are compiled together in one graph (see ``runner``), so the kiln backend
builds few kernels per entry: where an op allows it, samples share one output shape and fuse.
"""
from __future__ import annotations

import dataclasses
from typing import Callable

import torch

FLOATS = (torch.float32, torch.float16, torch.bfloat16)
F32 = (torch.float32,)
INTS = (torch.int32, torch.int64)
ALL = FLOATS + INTS
BOOL = (torch.bool,)


@dataclasses.dataclass
class OpEntry:
    name: str
    fn: Callable
    samples: Callable                       # (dtype, device) -> list of argument tuples
    dtypes: tuple = FLOATS
    tol: dict = dataclasses.field(default_factory=dict)    # dtype -> (rtol, atol)
    differentiable: bool = False
    xfail: dict = dataclasses.field(default_factory=dict)  # way or group -> reason (strict)
    known: dict = dataclasses.field(default_factory=dict)  # way -> reason (not strict: open bugs)
    compare: Callable | None = None         # compare(actual, expected): random ops
    core: bool = True                       # the captured graph holds core ops, no fallback node
    grad_dtypes: tuple = (torch.float32,)
    nograd: tuple = ()                      # argument positions that never require grad


@dataclasses.dataclass
class BadInput:
    """A call eager torch rejects: kiln must raise the same exception type from the same line."""
    name: str
    fn: Callable
    make: Callable                          # () -> argument tuple


def entries_by_name(entries):
    seen = {}
    for e in entries:
        assert e.name not in seen, f"op table entry {e.name} is defined twice"
        seen[e.name] = e
    return seen


# ------------------------------------------------------------------ tensors
def rand(shape, dtype, device, low=None, high=None):
    """Random tensor: floats ~ N(0, 1) (or U(low, high)), ints in [-20, 20), bools 50/50."""
    if dtype == torch.bool:
        return torch.rand(shape, device=device) > 0.5
    if dtype.is_floating_point:
        if low is not None:
            return (torch.rand(shape, device=device) * (high - low) + low).to(dtype)
        return torch.randn(shape, device=device).to(dtype)
    lo = -20 if low is None else int(low)
    hi = 20 if high is None else int(high)
    return torch.randint(lo, hi, shape, device=device).to(dtype)


def tr(shape, dtype, device, **kw):
    """A non-contiguous tensor of ``shape``: the transpose of a contiguous one."""
    base = rand(tuple(shape[:-2]) + (shape[-1], shape[-2]), dtype, device, **kw)
    return base.transpose(-1, -2)


def strided(shape, dtype, device, **kw):
    """A non-contiguous tensor of ``shape``: every other element of the last dim."""
    base = rand(tuple(shape[:-1]) + (shape[-1] * 2,), dtype, device, **kw)
    return base[..., ::2]


SPECIAL = [float("nan"), float("inf"), float("-inf"), 0.0, -0.0, 2.5, -2.5, 0.5, -1.5, 1.0]


def with_special(x):
    """Row 0 of a (., 10) float tensor holds NaN, infinities, signed zeros and rounding ties."""
    if x.dtype.is_floating_point:
        x = x.clone() if x.is_contiguous() else x
        x[0] = torch.tensor(SPECIAL, dtype=x.dtype, device=x.device)
    return x


# ------------------------------------------------------------------ standard sample sets
# Every set keeps one output shape, (6, 10), for the main samples so they fuse into one kernel;
# an empty tensor and a 0-d tensor follow where the op takes them.
def unary(dtype, device, special=True, empty=True, **kw):
    a = tr((6, 10), dtype, device, **kw)
    out = [(with_special(a) if special else a,), (rand((6, 10), dtype, device, **kw),),
           (strided((6, 10), dtype, device, **kw),)]
    if empty:
        out += [(rand((0, 10), dtype, device, **kw),), (rand((), dtype, device, **kw),)]
    return out


def binary(dtype, device, empty=True, **kw):
    out = [(rand((6, 10), dtype, device, **kw), rand((6, 10), dtype, device, **kw)),
           (tr((6, 10), dtype, device, **kw), rand((10,), dtype, device, **kw)),
           (rand((6, 1), dtype, device, **kw), strided((1, 10), dtype, device, **kw)),
           (rand((6, 10), dtype, device, **kw), rand((), dtype, device, **kw))]
    if empty:
        out.append((rand((0, 10), dtype, device, **kw), rand((10,), dtype, device, **kw)))
    return out


def ternary(dtype, device, **kw):
    return [(rand((6, 10), dtype, device, **kw), rand((6, 10), dtype, device, **kw),
             rand((6, 10), dtype, device, **kw)),
            (tr((6, 10), dtype, device, **kw), rand((10,), dtype, device, **kw),
             rand((6, 1), dtype, device, **kw)),
            (rand((0, 10), dtype, device, **kw), rand((10,), dtype, device, **kw),
             rand((1,), dtype, device, **kw))]


def with_scalars(*scalars):
    """Sample maker: a (6, 10) tensor with each Python scalar, plus a transposed one."""
    def make(dtype, device):
        out = []
        for s in scalars:
            out.append((rand((6, 10), dtype, device), s))
            out.append((tr((6, 10), dtype, device), s))
        return out
    return make


def reduce_input(dtype, device, **kw):
    """Inputs for reductions: contiguous, transposed and strided (5, 12) tensors."""
    return [rand((5, 12), dtype, device, **kw), tr((5, 12), dtype, device, **kw),
            strided((5, 12), dtype, device, **kw)]
