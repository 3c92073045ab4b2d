"""torch's ``associative_scan`` (``torch._higher_order_ops.associative_scan``) in captured code.

transformers' Mamba scans with it when ``torch.compiler.is_compiling()`` (kiln's trace says so).
Eagerly, torch runs the ``"generic"`` mode as a tree of ``combine_fn`` calls on strided slices
along the scan dim, each call vmapped over that dim; the ``"pointwise"`` mode (CUDA/XPU only)
computes the same scan in a compiled kernel. Capture builds that tree from the ops the graph
already has: the scan dim moved to the front, ``combine_fn`` traced once per tree step
(``2 * log2(n)`` calls), its results interleaved back with ``stack`` + ``flatten``.

Each step calls ``combine_fn`` on the batch of slices directly instead of through vmap. That is
vmap's result only where ``combine_fn`` is elementwise along the batch, which is checked on what
each call records:

- every op that reads a batched value (an argument, or a result of one) is a pointwise core op,
  all its batched operands have one rank ``r`` (its result too) and every other operand a rank
  below ``r``, so right-aligned broadcasting pairs the same elements as per example;
- its results are batched tensors, one per leaf;
- the ops and their non-tensor arguments match a probe trace of ``combine_fn`` on one example
  (the first slice of each leaf; its nodes are erased): a function that reads its operands'
  sizes (the batch's, not an example's) records other ops or other numbers.

Anything else (another op on the batch, nested pytrees, a symbolic number of steps that cannot
be fixed) is a graph break naming the reason.
"""
from __future__ import annotations

import sys

import torch

from kiln.capture import torch_api
from kiln.capture.errors import Unsupported
from kiln.capture.values import ConstantVariable, ListVariable, TensorVariable, TupleVariable, Variable
from kiln.graph.node import CALL, map_args
from kiln.meta.symbolic import SymInt

_MODULE = "torch._higher_order_ops.associative_scan"
_WHAT = "associative_scan"


def wrap_associative_scan(tx, value, source, guard):
    """The tracker of torch's ``associative_scan``, or None for anything else."""
    mod = sys.modules.get(_MODULE)
    if mod is None or getattr(value, "__name__", None) != "associative_scan" \
            or value is not getattr(mod, "associative_scan", None):
        return None
    if guard:
        tx.guards.identity(source, value)
    return AssociativeScanVariable()


class AssociativeScanVariable(Variable):
    """``associative_scan(combine_fn, xs, dim, reverse=False, combine_mode="pointwise")``."""

    def truth(self, tx):
        return True

    def call(self, tx, args, kwargs):
        names = ("combine_fn", "xs", "dim", "reverse", "combine_mode")
        bound = dict(zip(names, args))
        for k, v in kwargs.items():
            if k not in names or k in bound:
                raise Unsupported(f"{_WHAT}: unexpected argument {k!r}")
            bound[k] = v
        if not {"combine_fn", "xs", "dim"} <= set(bound):
            raise Unsupported(f"{_WHAT}: combine_fn, xs and dim are required")
        leaves, rebuild = _leaves(bound["xs"])
        dim = _constant(bound["dim"], "dim")
        reverse = _constant(bound.get("reverse", ConstantVariable(False)), "reverse")
        mode = _constant(bound.get("combine_mode", ConstantVariable("pointwise")), "combine_mode")
        _validate(leaves, dim, reverse, mode)
        ndim = len(leaves[0].proxy.shape)
        dim = dim % ndim
        order = [dim] + [d for d in range(ndim) if d != dim]  # the scan dim first, as torch does
        back = [order.index(d) for d in range(ndim)]
        moved = [_call(tx, "permute", x, *order) for x in leaves]  # views, as movedim's
        if reverse:
            moved = [_call(tx, "flip", x, [0]) for x in moved]
        scan = _Scan(tx, bound["combine_fn"], rebuild, moved)
        out = scan.run(moved)
        if reverse:
            out = [_call(tx, "flip", x, [0]) for x in out]
        return rebuild([_call(tx, "permute", x, *back) for x in out])

    def __repr__(self):
        return "AssociativeScan()"


def _constant(v, what):
    try:
        return v.as_python()
    except Unsupported:
        raise Unsupported(f"{_WHAT}: {what} must be a constant, got {v}") from None


def _leaves(xs):
    """The tensors of ``xs`` (a tensor, or a flat tuple/list of them) and how to rebuild its
    structure around new tensors (torch's pytree unflatten)."""
    if isinstance(xs, TensorVariable):
        return [xs], lambda items: items[0]
    if type(xs) in (TupleVariable, ListVariable) and xs.items \
            and all(isinstance(x, TensorVariable) for x in xs.items):
        kind = type(xs)
        return list(xs.items), lambda items: kind(list(items))
    raise Unsupported(f"{_WHAT}: xs is {xs}, not a tensor or a flat tuple/list of tensors")


def _validate(leaves, dim, reverse, mode):
    """torch's own argument checks; a failing one is a break, so eager raises its error."""
    if type(dim) is not int or type(reverse) is not bool or mode not in ("pointwise", "generic"):
        raise Unsupported(f"{_WHAT}: dim={dim!r}, reverse={reverse!r}, combine_mode={mode!r} are not valid")
    metas = [x.proxy.meta for x in leaves]
    if mode == "pointwise" and not all(m.device.type in ("cuda", "xpu") for m in metas):
        raise Unsupported(f"{_WHAT}: combine_mode='pointwise' needs CUDA or XPU tensors (torch raises)")
    ndim = metas[0].ndim
    if not -ndim <= dim < ndim or any(m.ndim != ndim for m in metas):
        raise Unsupported(f"{_WHAT}: dim {dim} and leaves of ranks {[m.ndim for m in metas]}")
    sizes = {m.shape[dim] for m in metas}
    if len(sizes) != 1:
        raise Unsupported(f"{_WHAT}: leaves of different lengths {sorted(map(str, sizes))} along dim {dim}")


def _call(tx, name, x, *args, **kwargs):
    """Tensor method ``name`` on ``x`` through the capture table."""
    wrapped = [ConstantVariable(a) if not isinstance(a, Variable) else a for a in args]
    return tx.call_adapter(torch_api.TENSOR_METHODS[name], [x, *wrapped],
                           {k: ConstantVariable(v) for k, v in kwargs.items()}, _WHAT)


def _torch(tx, fn, tensors, **kwargs):
    return tx.call_adapter(torch_api.TORCH_FUNCTIONS[fn], [ListVariable(list(tensors))],
                           {k: ConstantVariable(v) for k, v in kwargs.items()}, _WHAT)


def _length(x) -> int:
    """The scan length (dim 0), fixed: the tree's shape depends on it (a symbolic one is
    specialized, int() recording its guard, as a range() over a size is)."""
    n = x.proxy.shape[0]
    return int(n) if isinstance(n, SymInt) else n


def _rows(tx, x, start, stop=None, step=1):
    return _call(tx, "__getitem__", x, slice(start, stop, step))


class _Scan:
    """The tree of ``combine_fn`` calls over leaves whose scan dim is dim 0."""

    def __init__(self, tx, fn, rebuild, leaves):
        self.tx, self.fn, self.rebuild = tx, fn, rebuild
        self.signature = self._probe(leaves) if _length(leaves[0]) >= 2 else None

    def run(self, elems):
        """torch's generic scan: combine neighbours, scan the half, combine back in between."""
        tx = self.tx
        n = _length(elems[0])
        if n < 2:
            return elems
        reduced = self.combine([_rows(tx, e, 0, -1, 2) for e in elems], [_rows(tx, e, 1, None, 2) for e in elems])
        odd = self.run(reduced)  # the prefixes ending at positions 1, 3, 5...
        even = [_rows(tx, e, 0, 1) for e in elems]  # the prefix ending at 0 is the first item
        if n > 2:  # the prefixes ending at 2, 4...: the one ending just before, and the item
            before = [_rows(tx, o, 0, -1) for o in odd] if n % 2 == 0 else odd
            rest = self.combine(before, [_rows(tx, e, 2, None, 2) for e in elems])
            even = [_torch(tx, torch.cat, [first, r], dim=0) for first, r in zip(even, rest)]
        return [self._interleave(e, o) for e, o in zip(even, odd)]

    def _interleave(self, even, odd):
        """Items of ``even`` and ``odd`` alternating, ``even`` first (one longer for odd n)."""
        tx = self.tx
        pairs = _length(odd)
        both = _torch(tx, torch.stack, [_rows(tx, even, 0, pairs), odd], dim=1)
        out = _call(tx, "flatten", both, 0, 1)
        if _length(even) > pairs:
            out = _torch(tx, torch.cat, [out, _rows(tx, even, pairs)], dim=0)
        return out

    def _apply(self, lefts, rights):
        out = self.fn.call(self.tx, [self.rebuild(lefts), self.rebuild(rights)], {})
        if isinstance(out, TensorVariable):
            results = [out]
        elif type(out) in (TupleVariable, ListVariable):
            results = list(out.items)
        else:
            results = []
        if len(results) != len(lefts) or not all(isinstance(r, TensorVariable) for r in results):
            raise Unsupported(f"{_WHAT}: combine_fn returned {out}, not {len(lefts)} tensors like xs")
        return results

    def _probe(self, leaves):
        """The ops ``combine_fn`` records on one example, the first item of each leaf (all
        erased from the graph again)."""
        graph = self.tx.graph
        before = set(graph.nodes)
        examples = [_call(self.tx, "select", x, 0, 0) for x in leaves]
        selected = set(graph.nodes)
        self._apply(examples, examples)
        signature = _signature([n for n in graph.nodes if n not in selected and n.op == CALL])
        added = [n for n in graph.nodes if n not in before and n.op == CALL]
        for node in reversed(added):
            if not node.users:
                graph.erase(node)
        return signature

    def combine(self, lefts, rights):
        """``combine_fn`` on a batch of slices, checked to be what vmap would compute."""
        graph = self.tx.graph
        before = set(graph.nodes)
        results = self._apply(lefts, rights)
        added = [n for n in graph.nodes if n not in before and n.op == CALL]
        batched = {x.proxy.node for x in (*lefts, *rights)}
        for node in added:
            _check_elementwise(node, batched)
        for r in results:
            if r.proxy.node not in batched:
                raise Unsupported(f"{_WHAT}: a result of combine_fn does not depend on its arguments")
        if _signature(added) != self.signature:
            raise Unsupported(f"{_WHAT}: combine_fn records other ops on a batch than on one example "
                              "(it reads its operands' sizes)")
        return results


def _rank(node) -> int:
    return len(getattr(node.meta.get("val"), "shape", ()))


def _check_elementwise(node, batched: set):
    """``node`` reads no batched value, or is elementwise over the batch (added to ``batched``)."""
    inputs = node.inputs()
    reads = [i for i in inputs if i in batched]
    if not reads:
        return
    if not getattr(node.target, "pointwise", False):
        raise Unsupported(f"{_WHAT}: combine_fn applies {node.target}, which is not elementwise "
                          "(kiln scans only elementwise combine functions)")
    rank = _rank(reads[0])
    if any(_rank(i) != rank for i in reads) or _rank(node) != rank \
            or any(_rank(i) >= rank for i in inputs if i not in batched):
        raise Unsupported(f"{_WHAT}: combine_fn broadcasts {node.target} across the scan batch")
    batched.add(node)


def _signature(nodes) -> list:
    """The ops and their non-tensor arguments, tensors as one marker."""
    def spell(obj):
        return repr(map_args(obj, lambda n: "<tensor>"))
    return [(node.target, spell(node.args), spell(node.kwargs)) for node in nodes]
