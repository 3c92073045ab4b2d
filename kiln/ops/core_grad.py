"""Core ops that the VJP rules need and that captured graphs do not: ``iota``.

``iota(like, length, dtype)`` is ``arange(length)`` on ``like``'s device. ``like`` is only the
anchor: it names the graph the node belongs to (a decomposition with no tensor argument could
not record a node) and its device; its values are never read. A VJP rule passes its incoming
gradient as the anchor, so the iota lands in the backward graph. It builds one-hot masks
(cross-entropy, nll) and causal masks (sdpa) from pointwise comparisons, which fuse.
"""
from __future__ import annotations

import torch

from kiln.meta.tensor_meta import TensorMeta
from kiln.ops import prims_more as pm
from kiln.ops.registry import DECOMPOSITIONS, META_RULES, define

__all__ = ["iota"]


def _iota_eager(like, length, dtype=torch.int64):
    return torch.arange(length, dtype=dtype, device=like.device)


iota = define("core", "iota", _iota_eager, recompute=True, eager_layout="contiguous",
              differentiable=False)


@META_RULES.register(iota)
def _iota_meta(like, length, dtype=torch.int64):
    if length < 0:
        raise ValueError(f"[meta] core.iota: negative length {length}")
    return TensorMeta.contiguous((length,), dtype, like.device)


@DECOMPOSITIONS.register(iota)
def _iota_decomp(like, length, dtype=torch.int64):
    return like.graph_builder.call(pm.iota, (length, 0, 1, dtype, like.device))
