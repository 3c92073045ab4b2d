"""``core.nonzero_rows``: ``torch.nonzero(x)`` with the row count a ``torch._check`` stated.

capture        ``z = x.nonzero(); torch._check(z.size(0) == n)`` under ``fullgraph=True``
               (capture/sized_later.py): kiln has no unbacked sizes, so the graph is built for
               the checked count
meta           int64 ``(n, x.ndim)``, contiguous; it reads only x's rank, so x's sizes stay
               symbolic (a generic fallback node would specialize them)
eager          ``torch.nonzero(x)``, raising eager's RuntimeError for a failed ``torch._check``
               when the count differs (the check moves into the op: its result is the check)
decomposition  ``prims.nonzero_rows``, a library op the wrapper calls through torch
VJP            none: indices carry no gradient
"""
from __future__ import annotations

import torch

from kiln.meta.tensor_meta import TensorMeta
from kiln.ops.registry import DECOMPOSITIONS, LOWERINGS, META_RULES, define, stage_api

L = stage_api("lowering")  # the lowering stage's builders, bound when it is imported

__all__ = ["nonzero_rows"]


def _nonzero_rows_eager(x, rows):
    out = torch.nonzero(x)
    if out.shape[0] != rows:
        raise RuntimeError(f"Expected cond to be True, but got False: torch._check(size(0) == {rows}) "
                           f"failed: Tensor.nonzero found {out.shape[0]} nonzero elements (kiln "
                           "built the compiled graph for the checked count)")
    return out


def _nonzero_rows_meta(x, rows):
    if type(rows) is not int or rows < 0:
        raise TypeError(f"[meta] core.nonzero_rows: the row count must be an int >= 0, not {rows!r}")
    return TensorMeta.contiguous((rows, x.ndim), torch.int64, x.device)


nonzero_rows = define("core", "nonzero_rows", _nonzero_rows_eager, differentiable=False)
META_RULES[nonzero_rows] = _nonzero_rows_meta

prim_nonzero_rows = define("prims", "nonzero_rows", _nonzero_rows_eager, library=True, fresh_result=True,
                           doc="torch.nonzero with its row count checked, called through torch")
META_RULES[prim_nonzero_rows] = _nonzero_rows_meta
LOWERINGS[prim_nonzero_rows] = L.extern_rule
DECOMPOSITIONS[nonzero_rows] = prim_nonzero_rows
