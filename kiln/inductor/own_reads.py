"""One rule for a fused kernel's reads of the values it computes itself.

A kernel thread holds, in registers, the elements of its buffers at the store index of the
iteration point it runs. A read of such a buffer at that index is served from the register;
a read at any other index names an element another thread computes (or, on a CPU, a later
iteration), so it can be served neither from a register nor, without a barrier, from memory.
The scheduler only fuses reads at the store index (``scheduler._why_not``), but it compares
indices in normal form, and later re-indexing (a kernel reshaped onto a split reduction's
space, a prologue hoisted into its own kernel) can leave a read whose index no longer
normalises to the store index. Such a read used to fall through to a load from memory of a
buffer no step allocates (a ``NameError`` in the wrapper at call time, BERT training on the
H200, session 28).

``resolve_own_reads`` makes the rule hold after scheduling: a mismatched read of a pointwise
value is replaced by that value's body evaluated at the read's element (its index unravelled
by the buffer's strides): pure recomputation, right for every backend. A mismatched read of a
reduction's result cannot be recomputed per element, so it is an internal error that names
the kernel, the buffers and both indices (the graph then runs eagerly, with a warning).
"""
from __future__ import annotations

import copy

import sympy

from kiln.inductor import ir
from kiln import log

MAX_ROUNDS = 16  # a pointwise chain inlined into itself this deep is a bug, not a graph


class OwnReadError(ValueError):
    pass


def unravel(buf: ir.Pointwise, offset) -> dict | None:
    """The map from ``buf``'s index symbols to its coordinates at element ``offset`` (an
    index into its storage), or None when its strides do not unravel an offset uniquely
    (overlapping or symbolic strides)."""
    dims = [d for d, s in enumerate(buf.shape) if s != 1]
    if any(not isinstance(buf.shape[d], int) and getattr(buf.shape[d], "free_symbols", None)
           for d in dims) or any(getattr(buf.stride[d], "free_symbols", None) for d in dims):
        return None
    dims.sort(key=lambda d: int(buf.stride[d]))
    reach = 1
    for d in dims:  # innermost first: each dim's stride must clear the dims inside it
        if int(buf.stride[d]) < reach:
            return None
        reach = int(buf.stride[d]) * int(buf.shape[d])
    syms = ir.index_symbols(len(buf.shape))
    coords = {s: sympy.Integer(0) for s in syms}
    for d in dims:
        coords[syms[d]] = sympy.Mod(sympy.floor(offset / int(buf.stride[d])), int(buf.shape[d]))
    return coords


def _inline(body: ir.Expr, producer: ir.Pointwise, at: ir.Load) -> ir.Expr | None:
    """``body`` with the read ``at`` of ``producer`` replaced by ``producer``'s body there."""
    coords = unravel(producer, at.index)
    if coords is None:
        return None
    value = _substitute(producer.body, coords)

    def swap(ld):
        return value if ld is at else None
    return ir.substitute_loads(body, swap)


def _substitute(expr: ir.Expr, mapping: dict) -> ir.Expr:
    if isinstance(expr, ir.Load):
        return ir.Load(expr.buffer, sympy.sympify(expr.index).xreplace(mapping), expr.dtype)
    if isinstance(expr, ir.IndexValue):
        return ir.IndexValue(sympy.sympify(expr.index).xreplace(mapping), expr.dtype)
    if isinstance(expr, ir.Call):
        return ir.Call(expr.op, tuple(_substitute(a, mapping) for a in expr.args), expr.dtype)
    if isinstance(expr, ir.Let):
        return ir.Let(expr.symbol, _substitute(expr.value, mapping), expr.bound,
                      _substitute(expr.body, mapping), expr.wrap_negative)
    return expr


def _with_body(node, body):
    """A copy of a Pointwise or Reduction node with another body (the program keeps the old
    node; only this kernel computes the buffer, so only this kernel sees the copy)."""
    new = copy.copy(node)
    new.body = body
    new._reads = None  # the cached read set (ir._body_reads) belongs to the old body
    return new


def _mismatch(kernel, canon, inside):
    """The first (node position, its read, producer) whose index is not the producer's
    store index in the kernel's space, or None."""
    for k, node in enumerate(kernel.nodes):
        body = getattr(node, "body", None)
        if body is None:
            continue
        mapping = kernel.maps[node.name]
        for ld in ir.loads_of(body):
            producer = inside.get(ld.buffer)
            if producer is None:
                continue
            index = ld.index.xreplace(mapping) if mapping else ld.index
            if canon(index) != canon(kernel.store_index(producer)):
                return k, ld, producer
    return None


def resolve_own_reads(kernel) -> set:
    """Rewrite ``kernel`` (a scheduler Kernel) so every read of a buffer it computes is at
    that buffer's store index; see the module docstring. Returns the buffers whose reads were
    inlined (``drop_unused`` removes those no one reads any more)."""
    canon = ir.canonical_index_fn(ir.ranges_of(kernel.ranges))
    inlined = set()
    for _ in range(MAX_ROUNDS * max(len(kernel.nodes), 1)):
        inside = {n.name: n for n in kernel.nodes}
        found = _mismatch(kernel, canon, inside)
        if found is None:
            return inlined
        k, ld, producer = found
        node = kernel.nodes[k]
        new_body = _inline(node.body, producer, ld) if isinstance(producer, ir.Pointwise) else None
        if new_body is None:
            raise OwnReadError(
                f"[schedule] {kernel.name}: {node.name} reads {producer.name} at {ld.index}, not where "
                f"this kernel computes it ({producer.store_index()}), and "
                f"{'a reduction result' if isinstance(producer, ir.Reduction) else 'its strides'} "
                f"cannot be recomputed there")
        log.log("schedule", "%s: %s reads %s off its store index; recomputed there", kernel.name,
                node.name, producer.name)
        kernel.nodes[k] = _with_body(node, new_body)
        kernel._names = kernel._reads = None
        inlined.add(producer.name)
    raise OwnReadError(f"[schedule] {kernel.name}: reads of its own values did not settle "
                       f"after inlining {sorted(inlined)}")


def drop_unused(kernel, candidates: set) -> None:
    """Remove the nodes in ``candidates`` that the kernel neither stores nor reads: values
    whose every read was inlined by ``resolve_own_reads``."""
    if not candidates:
        return
    while True:
        read = {b for n in kernel.nodes for b in n.reads()}
        dead = [n for n in kernel.nodes
                if n.name in candidates and n.name not in kernel.stores and n.name not in read]
        if not dead:
            return
        for n in dead:
            kernel.nodes.remove(n)
            del kernel.levels[n.name], kernel.maps[n.name]
        kernel._names = kernel._reads = None
