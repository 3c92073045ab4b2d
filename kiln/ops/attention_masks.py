"""Attention masks that mask nothing, dropped before the graph is differentiated or lowered.

transformers builds a bidirectional model's mask whenever it is traced (``masking_utils``:
under ``torch.compiler.is_compiling()`` it may not look at a padding mask's values to skip
it), so a ViT or BERT without padding hands SDPA an all-True boolean mask made from
``arange`` and comparisons. Eager skips it; a compiled graph carrying it keeps SDPA off its
flash kernel (a mask rules flash out on CUDA) and reads a [batch, 1, q, kv] tensor per layer.
Such a mask depends on no graph input, only on sizes and constants, which the guards fix: its
value is computed once at compile time and, where it is all True (boolean) or all zero
(additive float), the SDPA call takes no mask, which is the same attention.
"""
from __future__ import annotations

import math

import torch

from kiln import log
from kiln.graph.graph import Graph
from kiln.graph.node import CALL, GET_ATTR, Node, map_args
from kiln.graph.passes import dce
from kiln.meta.symbolic import has_symbols
from kiln.meta.tensor_meta import TensorMeta

# A mask larger than this is not evaluated at compile time (2^24 elements: a [32, 1, 4096, 128]
# bool mask is 16 MB, computed once per compile)
MAX_FOLDED_NUMEL = 1 << 24
_MASK_INDEX = 3  # sdpa(q, k, v, attn_mask, dropout_p, is_causal, scale)


def drop_all_true_masks(graph: Graph) -> Graph:
    """The pass: each SDPA call (forward or backward) whose mask is input-free and masks
    nothing gets ``attn_mask=None``; the mask's ops then go as dead code."""
    from kiln.ops import core
    targets = {core.sdpa: _MASK_INDEX, core.sdpa_backward: _MASK_INDEX + 1}
    values: dict = {}  # mask node -> masks nothing?
    changed = False
    for node in graph.calls:
        index = targets.get(node.target)
        if index is None:
            continue
        mask, where = _mask_arg(node, index)
        if not isinstance(mask, Node):
            continue
        if mask not in values:
            values[mask] = _masks_nothing(graph, mask)
        if values[mask]:
            log.log("decomp", "%s = %r: its mask %s (%s) masks nothing: SDPA runs without it",
                    node.name, node.target, mask.name, mask.meta.get("source", "?"))
            node.meta["dropped_mask"] = mask.meta.get("source") or mask.name
            _set_mask(node, index, where)
            if mask not in node.inputs():
                mask.users.pop(node, None)
            changed = True
    return dce(graph) if changed else graph


def _mask_arg(node, index):
    if "attn_mask" in node.kwargs:
        return node.kwargs["attn_mask"], "kwargs"
    if len(node.args) > index:
        return node.args[index], "args"
    return None, None


def _set_mask(node, index, where):
    if where == "kwargs":
        node.kwargs = {**node.kwargs, "attn_mask": None}
    else:
        node.args = node.args[:index] + (None,) + node.args[index + 1:]


def _masks_nothing(graph: Graph, mask: Node) -> bool:
    meta = mask.meta.get("val")
    if not isinstance(meta, TensorMeta) or has_symbols(tuple(meta.shape)) or \
            math.prod(meta.shape) > MAX_FOLDED_NUMEL:
        return False
    if meta.dtype != torch.bool and not meta.dtype.is_floating_point:
        return False
    nodes = _input_free_subgraph(mask)
    if nodes is None:
        return False
    env: dict = {}
    try:
        for n in nodes:
            if n.op == GET_ATTR:
                env[n] = graph.constants[n.target]
            else:
                env[n] = n.target.eager(*map_args(n.args, env.__getitem__), **map_args(n.kwargs, env.__getitem__))
        value = env[mask]
    except Exception:  # noqa: BLE001 - not foldable here: the mask stays in the graph
        return False
    if not isinstance(value, torch.Tensor):
        return False
    return bool(value.all()) if value.dtype == torch.bool else bool((value == 0).all())


def _input_free_subgraph(mask: Node):
    """The nodes ``mask`` is computed from, in graph order, when none is a placeholder or a
    random op (None otherwise)."""
    seen: dict = {}
    stack = [mask]
    while stack:
        n = stack.pop()
        if n in seen:
            continue
        if n.op not in (CALL, GET_ATTR) or getattr(n.target, "random", False):
            return None
        seen[n] = None
        stack.extend(n.inputs())
    order = {n: i for i, n in enumerate(mask.graph.nodes)}
    return sorted(seen, key=order.__getitem__)
