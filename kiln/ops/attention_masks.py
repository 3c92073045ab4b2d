"""Attention masks that mask nothing, dropped before the graph is differentiated or lowered.

transformers builds a bidirectional model's mask whenever it is traced (``masking_utils``:
under ``torch.compiler.is_compiling()`` it may not look at a padding mask's values to skip
it), so a ViT or BERT without padding hands SDPA an all-True boolean mask made from
``arange`` and comparisons. Eager skips it; a compiled graph carrying it keeps SDPA off its
flash kernel (a mask rules flash out on CUDA) and reads a [batch, 1, q, kv] tensor per layer.
Such a mask depends on no graph input, only on sizes and constants, which the guards fix: its
value is computed once at compile time and, where it is all True (boolean) or all zero
(additive float), the SDPA call takes no mask, which is the same attention. A decoder's
traced causal mask (Llama, GPT-2: ``kv_idx <= q_idx``) equal to ``ones(L, S).tril()`` becomes
``is_causal=True``, which is torch's own definition of causal attention (top-left aligned).
"""
from __future__ import annotations

import math
import re

import torch

from kiln import log
from kiln.graph.graph import Graph
from kiln.graph.node import CALL, GET_ATTR, Node, map_args
from kiln.graph.passes import dce
from kiln.graph.propagate import propagate_meta
from kiln.meta.symbolic import has_symbols
from kiln.meta.tensor_meta import TensorMeta
from kiln.ops import core
from kiln.ops.core_fallback import fallback

# A mask larger than this is not evaluated at compile time (2^24 elements: a [32, 1, 4096, 128]
# bool mask is 16 MB, computed once per compile)
MAX_FOLDED_NUMEL = 1 << 24


def drop_all_true_masks(graph: Graph) -> Graph:
    """The pass: each SDPA call (forward or backward) whose mask is input-free and masks
    nothing gets ``attn_mask=None``; one whose mask is exactly the causal pattern
    (``ones(L, S).tril()`` over every batch and head, torch's top-left ``is_causal``) gets
    ``is_causal=True`` instead. The mask's ops then go as dead code, and the metas are
    recomputed (without a mask SDPA may pick a fused kernel, whose result layout differs).
    Graphs with symbolic sizes are left alone."""
    # op -> (index of q, index of attn_mask, index of is_causal)
    targets = {core.sdpa: (0, 3, 5), core.sdpa_backward: (1, 4, 5)}
    calls = [n for n in graph.calls if n.target in targets]
    if not calls or _symbolic(graph):
        return graph
    kinds: dict = {}  # mask node -> "none" | "causal" | None
    changed = False
    for node in calls:
        qi, mi, ci = targets[node.target]
        mask = _arg(node, mi, "attn_mask")
        if not isinstance(mask, Node) or _arg(node, ci, "is_causal") not in (False, None):
            continue
        q, k = node.args[qi].meta.get("val"), node.args[qi + 1].meta.get("val")
        mask_meta = mask.meta.get("val")
        if not isinstance(mask_meta, TensorMeta) or mask_meta.dtype not in (torch.bool, q.dtype):
            continue  # (a float mask of another dtype than q: eager's SDPA refuses it)
        if mask not in kinds:
            kinds[mask] = _mask_kind(graph, mask, q.shape[-2], k.shape[-2])
        kind = kinds[mask]
        if kind is None:
            continue
        log.log("decomp", "%s = %r: its mask %s (%s) %s", node.name, node.target, mask.name,
                mask.meta.get("source", "?"),
                "masks nothing: no mask" if kind == "none" else "is the causal pattern: is_causal=True")
        node.meta["dropped_mask"] = (kind, mask.meta.get("source") or mask.name)
        _set_arg(node, mi, "attn_mask", None)
        if kind == "causal":
            _set_arg(node, ci, "is_causal", True)
        if mask not in node.inputs():
            mask.users.pop(node, None)
        changed = True
    if not changed:
        return graph
    if getattr(graph, "promised_output_strides", None) is None:
        # the outputs keep eager's strides (eager ran SDPA with the mask: its unfused result
        # layout, which a view of it passed on); only the metas inside may change
        graph.promised_output_strides = [
            tuple(o.meta["val"].stride) if isinstance(o, Node) and isinstance(o.meta.get("val"), TensorMeta)
            else None for o in graph.output_node.args[0]]
    return propagate_meta(dce(graph))


def _symbolic(graph) -> bool:
    for n in graph.nodes:
        val = n.meta.get("val")
        if isinstance(val, TensorMeta) and has_symbols(tuple(val.shape) + tuple(val.stride)):
            return True
    return False


def _arg(node, index, name):
    if name in node.kwargs:
        return node.kwargs[name]
    return node.args[index] if len(node.args) > index else None


def _set_arg(node, index, name, value):
    if name in node.kwargs or len(node.args) <= index:
        node.kwargs = {**node.kwargs, name: value}
    else:
        node.args = node.args[:index] + (value,) + node.args[index + 1:]


def _mask_kind(graph: Graph, mask: Node, q_len: int, kv_len: int):
    """"none" (all True, or an all-zero bias), "causal" (a bool mask equal to the causal
    pattern of a q_len x kv_len attention in every batch and head), or None."""
    meta = mask.meta.get("val")
    if not isinstance(meta, TensorMeta) or math.prod(meta.shape) > MAX_FOLDED_NUMEL:
        return None
    if meta.dtype != torch.bool and not meta.dtype.is_floating_point:
        return None
    nodes = _input_free_subgraph(mask)
    if nodes is None:
        return None
    env: dict = {}
    try:
        for n in nodes:
            if n.op == GET_ATTR:
                env[n] = graph.constants[n.target]
            else:
                env[n] = n.target.eager(*map_args(n.args, env.__getitem__), **map_args(n.kwargs, env.__getitem__))
        value = env[mask]
    except Exception:  # noqa: BLE001 - not foldable here: the mask stays in the graph
        return None
    if not isinstance(value, torch.Tensor):
        return None
    if value.dtype != torch.bool:
        return "none" if bool((value == 0).all()) else None
    if bool(value.all()):
        return "none"
    if value.dim() >= 2 and tuple(value.shape[-2:]) == (q_len, kv_len):
        causal = torch.ones(q_len, kv_len, dtype=torch.bool, device=value.device).tril()
        if torch.equal(value, causal.expand_as(value)):
            return "causal"
    return None


# torch functions that draw random numbers (a fallback node names its callable)
_RANDOM_NAME = re.compile(r"rand|bernoulli|poisson|multinomial|normal|dropout|exponential|"
                          r"geometric|cauchy|uniform|shuffle|perm")


def _deterministic(node) -> bool:
    """Not a random op. A fallback (torch's own function, run whole: ``torch.diff`` in
    transformers' packed-sequence mask) counts when it names a torch function that draws
    nothing; a registered Python callable never does."""
    if node.target is fallback:
        name = node.args[0] if node.args and isinstance(node.args[0], str) else ""
        return name.split(".")[0] in ("torch", "Tensor") and not _RANDOM_NAME.search(name)
    return not getattr(node.target, "random", False)


def _input_free_subgraph(mask: Node):
    """The nodes ``mask`` is computed from, in graph order, when none is a placeholder or a
    random op (None otherwise)."""
    seen: dict = {}
    stack = [mask]
    while stack:
        n = stack.pop()
        if n in seen:
            continue
        if n.op not in (CALL, GET_ATTR) or (n.op == CALL and not _deterministic(n)):
            return None
        seen[n] = None
        stack.extend(n.inputs())
    order = {n: i for i, n in enumerate(mask.graph.nodes)}
    return sorted(seen, key=order.__getitem__)
