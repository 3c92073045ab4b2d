"""Inputs that share memory: one storage for several graph inputs (functionalization).

Two inputs of one call may be views of the same memory (``f(x, x[0])``, ``f(x[:3], x[2:])``,
``f(x, x.t())``). A write through one must be seen by reads of the others, as in eager. The
first time aliasing matters for an input (a write into it or a view of it: ``mutation.storage_of``),
capture looks for the other inputs in the same memory (the tensors already wrapped, and the
root frame's arguments not read yet, which are wrapped now) and makes them one ``GroupStorage``:

* its value is a synthetic flat base ``F``: a 1-D tensor whose element ``i`` is the memory
  element ``lo + i`` (``lo``: the smallest storage offset among the members). It is a graph
  value, not real memory: built on first use (the first write) from ``full(0)`` and each
  member's placeholder scattered into it (members agree where they overlap; elements no
  member covers are never read or written back);
* each member is a view of ``F``: a chain of ordinary view steps (``ViewStep``) that gives
  the member's sizes and strides at its offset: ``slice`` of ``F`` from the member's offset,
  ``reshape`` into one dim per stride (strides sorted, each a multiple of the next), ``slice``
  and ``select`` to the member's sizes, ``permute`` to its dim order, ``reshape`` for size-1
  dims. So mutation.py's alias tracking (write = scatter through the inverse chain, read =
  replay the chain) works unchanged, and the chain replayed on a contiguous ``F`` gives the
  member's eager strides (``layout``), so views of members keep exact eager layouts.

Layouts the chain cannot express (a stride 0, overlapping or non-nested strides, different
dtypes, symbolic sizes) leave each input its own storage marked ``refused``: writing into it
is a graph break, as before. After the graph, each *root* member (one no dense member covers)
is written back with its final value; members agree where they overlap, so the order does not
matter. A guard checks the pattern: the members share one storage at the same relative
offsets, and no other input shares memory with a written group (else the call recompiles).
"""
from __future__ import annotations

import math

import torch

from kiln.capture.errors import Unsupported
from kiln.capture.mutation import Alias, Storage, ViewStep
from kiln.meta import TensorMeta
from kiln.ops import core
from kiln.meta.symbolic import has_symbols
from kiln.ops.registry import META_RULES
from kiln.capture.values import LazyVariable


def mem_key(t: torch.Tensor):
    """Which memory a tensor reads (None for an empty tensor: it reads none)."""
    if t.numel() == 0:
        return None
    return (t.device.type, t.device.index, t.untyped_storage().data_ptr())


def _groups(tx) -> dict:
    groups = tx.__dict__.get("_input_groups")
    if groups is None:
        groups = tx.__dict__["_input_groups"] = {}
    return groups


def _input_entry(tx, var):
    return next(((s, t) for v, s, t in tx._tensor_inputs.values() if v is var), None)


# ---------------------------------------------------------------- forming a group
def input_alias(tx, var):
    """The Alias of input ``var`` in the group of inputs sharing its memory, or None when it
    shares memory with no other input. A reason string when it does but cannot join a group."""
    entry = _input_entry(tx, var)
    if entry is None:
        return None
    _, t = entry
    key = mem_key(t)
    if key is None:
        return None
    groups = _groups(tx)
    st = groups.get(key)
    if st is None:
        _wrap_lazy_arguments(tx, key)
        entries = [(v, s, u) for v, s, u in tx._tensor_inputs.values() if mem_key(u) == key]
        if len(entries) < 2:
            return None
        try:
            st = GroupStorage(entries)
        except Unsupported as e:
            groups[key] = e.reason
            return e.reason
        groups[key] = st
        tx.storages.append(st)
        return var.alias
    if isinstance(st, str):
        return st
    if st.version:  # its reads so far saw the memory before the group's writes
        return (f"input {entry[0].expr()} shares memory with inputs written earlier in the "
                "function, and was first read after the write")
    try:
        st.join(var, entry[0], t)
    except Unsupported as e:
        return e.reason
    return var.alias


def _wrap_lazy_arguments(tx, key):
    """Arguments of the traced function not read yet that share memory ``key``: wrap them now,
    so the group holds them from its start."""
    frame = getattr(tx, "_current_frame", None)
    while frame is not None and frame.parent is not None:
        frame = frame.parent
    if frame is None:
        return
    for name, v in list(frame.locals.items()):
        if isinstance(v, LazyVariable) and isinstance(v.value, torch.Tensor) \
                and type(v.value) in (torch.Tensor, torch.nn.Parameter) and mem_key(v.value) == key:
            frame.locals[name] = tx.wrap(v.value, v.source)


class Member:
    __slots__ = ("var", "source", "tensor", "placeholder", "alias", "lo", "hi", "dense", "index")

    def __init__(self, var, source, tensor, alias, lo, hi, dense, index):
        self.var, self.source, self.tensor = var, source, tensor
        self.placeholder = var._proxy  # its value at entry
        self.alias = alias
        self.lo, self.hi, self.dense, self.index = lo, hi, dense, index


def _plan(t: torch.Tensor, lo: int):
    """(offset from lo, dims by stride, their sizes, their strides, span, extent), or raise."""
    shape, stride = tuple(t.shape), tuple(t.stride())
    dims = [d for d in range(len(shape)) if shape[d] != 1]
    if any(stride[d] == 0 for d in dims):
        raise Unsupported("an input that shares memory with another input has a stride 0")
    dims.sort(key=lambda d: -stride[d])
    n = [shape[d] for d in dims]
    s = [stride[d] for d in dims]
    for j in range(1, len(dims)):
        if s[j] == s[j - 1] or s[j - 1] % s[j] or n[j] * s[j] > s[j - 1]:
            raise Unsupported(f"an input that shares memory with another input has strides "
                              f"{list(stride)} (sizes {list(shape)}) that kiln cannot express as "
                              "a view of their common memory")
    off = t.storage_offset() - lo
    span = n[0] * s[0] if dims else 1
    extent = 1 + sum((a - 1) * b for a, b in zip(n, s))
    return off, dims, n, s, span, extent


def _steps(shape, plan, total):
    """The view chain from the flat base (``total`` elements) to the member."""
    off, dims, n, s, span, _ = plan
    steps = []
    if not (off == 0 and span == total):
        steps.append(ViewStep(core.slice, (0, off, off + span, 1), {}))
    k = len(dims)
    if k:
        inner = [s[j - 1] // s[j] for j in range(1, k)]
        rshape = (n[0], *inner) + ((s[-1],) if s[-1] > 1 else ())
        if rshape != (span,):
            steps.append(ViewStep(core.reshape, (rshape,), {}))
        for j in range(1, k):
            if n[j] < inner[j - 1]:
                steps.append(ViewStep(core.slice, (j, 0, n[j], 1), {}))
        if s[-1] > 1:
            steps.append(ViewStep(core.select, (k, 0), {}))
        perm = tuple(sorted(range(k), key=lambda i: dims[i]))
        if perm != tuple(range(k)):
            steps.append(ViewStep(core.permute, (perm,), {}))
    if tuple(shape) != (tuple(shape[d] for d in sorted(dims)) if dims else (1,)):
        steps.append(ViewStep(core.reshape, (tuple(shape),), {}))
    return tuple(steps)


def _check_meta(var, what):
    meta = var._proxy.meta
    if has_symbols(meta.shape) or has_symbols(meta.stride):
        raise Unsupported(f"{what} has symbolic (dynamic) sizes and shares memory with another input")
    return meta


class GroupStorage(Storage):
    """The memory of several inputs: a synthetic flat base (see the module docstring)."""
    __slots__ = ("members", "total", "lo", "dtype", "device", "_value", "layout_meta", "key")

    def __init__(self, entries):
        self.version, self.from_input, self.root, self.root_node = 0, True, None, None
        self.poisoned, self.refused, self._value = None, None, None
        metas = [_check_meta(v, s.expr()) for v, s, _ in entries]
        self.dtype, self.device = metas[0].dtype, metas[0].device
        if any(m.dtype != self.dtype for m in metas):
            raise Unsupported("inputs that share memory have different dtypes")
        self.key = mem_key(entries[0][2])
        self.lo = min(t.storage_offset() for _, _, t in entries)
        plans = [_plan(t, self.lo) for _, _, t in entries]
        self.total = max(p[0] + p[4] for p in plans)
        self.layout_meta = TensorMeta.contiguous((self.total,), self.dtype, self.device)
        self.members = []
        for (v, s, t), plan in zip(entries, plans):
            self._add(v, s, t, plan)

    def _add(self, var, source, t, plan):
        off, _, n, _, _, extent = plan
        alias = Alias(self, _steps(tuple(t.shape), plan, self.total))
        member = Member(var, source, t, alias, off, off + extent, extent == math.prod(n),
                        len(self.members))
        self.members.append(member)
        var.alias, var._seen = alias, self.version

    def join(self, var, source, t):
        """An input wrapped after the group formed (before any write into it)."""
        _check_meta(var, source.expr())
        if var._proxy.meta.dtype != self.dtype:
            raise Unsupported("inputs that share memory have different dtypes")
        if t.storage_offset() < self.lo:
            raise Unsupported(f"input {source.expr()} shares memory with other inputs and starts "
                              "before them, but was read after them")
        plan = _plan(t, self.lo)
        if plan[0] + plan[4] > self.total:
            raise Unsupported(f"input {source.expr()} shares memory with other inputs and reaches "
                              "past them, but was read after them")
        self._add(var, source, t, plan)

    # -- the value
    @property
    def value(self):
        if self._value is None:
            self._value = self._build()
        return self._value

    @value.setter
    def value(self, v):
        self._value = v

    def root_layout(self):
        return self.layout_meta

    def roots(self):
        """The members no dense member covers (each memory element is in one of them)."""
        def covers(c, m):
            if c is m or not c.dense or not (c.lo <= m.lo and m.hi <= c.hi):
                return False
            return (c.lo, c.hi) != (m.lo, m.hi) or not m.dense or c.index < m.index
        return [m for m in self.members if not any(covers(c, m) for c in self.members)]

    def _build(self):
        roots = self.roots()
        full = next((m for m in roots if (m.lo, m.hi) == (0, self.total) and m.dense), None)
        if full is not None:  # one member is all of the memory: F is a view of it
            return scatter_chain(self.layout_meta, full.alias.chain, full.placeholder)
        base = self.members[0].placeholder.graph_builder.call(
            core.full, ((self.total,), 0, self.dtype, self.device))
        for m in roots:
            base = scatter_chain(base, m.alias.chain, m.placeholder)
        return base

    def input_tensors(self, tx):
        return [m.tensor for m in self.members]

    # -- after the trace
    def writeback(self, index_of: dict, proxies: list) -> list:
        """(input index, output index) per root member; its final value added to proxies."""
        out = []
        for m in self.roots():
            value = self.value
            for step in m.alias.chain:
                value = step.apply(value)
            out.append((index_of[m.placeholder.node], len(proxies)))
            proxies.append(value)
        return out

    def member_of(self, var):
        return next((m for m in self.members if m.var is var and var.alias is m.alias), None)


def scatter_chain(base, chain, new):
    """The value of ``base`` with ``new`` written through view chain ``chain``. ``base`` may be
    a TensorMeta when every step's inverse needs only its shape (reshape, permute)."""

    values = [base]
    for step in chain[:-1]:
        cur = values[-1]
        values.append(META_RULES[step.op](cur, *step.args, **step.kwargs)
                      if isinstance(cur, TensorMeta) else step.apply(cur))
    cur = new
    for step, b in zip(reversed(chain), reversed(values)):
        if isinstance(b, TensorMeta) and step.op not in (core.reshape, core.permute):
            raise AssertionError(f"scatter through {step} needs the base's value")
        cur = step.scatter(b, cur)
    return cur


def member_alias(var) -> bool:
    """var is an input in a group, as it was passed (not a view taken in the trace)."""
    a = var.alias
    return a is not None and isinstance(a.storage, GroupStorage) and a.storage.member_of(var) is not None


# ---------------------------------------------------------------- guards
def _ptr(expr):
    return f"{expr}.untyped_storage().data_ptr()"


def check_and_guard(tx, plain: list, groups: list):
    """Mutated inputs: plain storages (one input each) and written groups. Refuse an input that
    shares memory with a written one without being in its group; guard the pattern."""
    entries = list(tx._tensor_inputs.values())
    sources = {id(var): src for var, src, _ in entries}
    unit_ids = []  # per unit: the var ids in it
    for st in plain:
        unit_ids.append([id(st.root)])
    for g in groups:
        unit_ids.append([id(m.var) for m in g.members])
    in_unit = {i for u in unit_ids for i in u}
    for st in plain:
        t = next(t for v, _, t in entries if v is st.root)
        for var, src, u in entries:
            if var is not st.root and u.untyped_storage().data_ptr() == t.untyped_storage().data_ptr() \
                    and mem_key(t) is not None and mem_key(u) is not None:
                why = st.refused or "it is not supported"
                raise Unsupported(f"in-place update of input {sources[id(st.root)].expr()}, which shares "
                                  f"memory with input {src.expr()}: {why}")
    for g in groups:
        for var, src, u in entries:
            if id(var) not in {id(m.var) for m in g.members} and mem_key(u) == g.key:
                raise Unsupported(f"input {src.expr()} shares memory with inputs written in place "
                                  "but was read outside their group (a late read of an aliased input)")
    first = sources[unit_ids[0][0]]
    for g in groups:
        exprs = [m.source.expr() for m in g.members]
        tup = ", ".join(exprs)
        tx.guards.add(first, f"len({{{_ptr('t')} for t in ({tup},)}}) == 1")
        offsets = [m.tensor.storage_offset() - g.members[0].tensor.storage_offset() for m in g.members]
        tx.guards.add(first, f"[t.storage_offset() - {exprs[0]}.storage_offset() for t in ({tup},)] "
                             f"== {offsets!r}")
    # empty tensors (sizes are guarded) read no memory: all of theirs may share a pointer
    nonempty = {id(var) for var, _, t in entries if t.numel()}
    others = ", ".join(src.expr() for var, src, _ in entries
                       if id(var) not in in_unit and id(var) in nonempty)
    heads = [sources[u[0]].expr() for u in unit_ids if u[0] in nonempty]
    if not heads or (len(heads) < 2 and not others):
        return
    n, heads = len(heads), ", ".join(heads)
    check = (f"len({{{_ptr('t')} for t in ({heads},)}}) == {n}" if not others else
             f"len({{{_ptr('t')} for t in ({heads},)}}) == {n} and "
             f"not ({{{_ptr('t')} for t in ({heads},)}} & {{{_ptr('t')} for t in ({others},)}})")
    tx.guards.add(first, check)


__all__ = ["GroupStorage", "input_alias", "mem_key", "member_alias", "check_and_guard",
           "scatter_chain"]
