"""The scheduler: loop IR buffers -> an ordered list of kernels and library calls.

A kernel iterates over one full index space ``ranges`` (symbols ``i0 .. i{n-1}``), of which
``reduced_dims`` are reduced (none for a pointwise kernel). Each node in it has a *level*:

* ``r``: computed at every point of the full space (pointwise over ``ranges``);
* ``red``: a reduction over ``reduced_dims``, available once per kept index after its loop;
* ``x``: pointwise over the kept dims only (a reduction's epilogue), symbols mapped onto the
  kept dims of the full space.

A buffer joins a kernel when it fits one of those levels, the kernel comes after everything
it depends on, and every read of a buffer already in the kernel is exactly where that buffer
is stored, so the value is still in a register (no other thread's store is needed). An ``x``
node never reads an ``r`` node. Reductions therefore fuse with their pointwise prologues and
epilogues and with sibling reductions over the same rows (softmax, layer norm: one kernel),
and a reduction is never recomputed. Each decision is logged on the ``schedule`` channel.

After fusion, a buffer is stored only if something outside its kernel reads it or the graph
returns it; the rest live in registers and are never allocated.
"""
from __future__ import annotations

import math

import sympy

from kiln import log
from kiln.inductor import ir


class Kernel:
    __slots__ = ("name", "nodes", "ranges", "reduced_dims", "device", "stores", "origins",
                 "levels", "maps")

    def __init__(self, name, first):
        self.name = name
        self.nodes = []
        if isinstance(first, ir.Reduction):
            self.ranges, self.reduced_dims = first.ranges, first.reduced_dims
        else:
            self.ranges, self.reduced_dims = first.shape, ()
        self.device = first.device
        self.stores: list[str] = []
        self.origins: list[str] = []
        self.levels: dict[str, str] = {}
        self.maps: dict[str, dict] = {}
        self.add(first, *placement(first, self))

    @property
    def shape(self):
        return self.ranges

    @property
    def kept_dims(self):
        return tuple(d for d in range(len(self.ranges)) if d not in self.reduced_dims)

    @property
    def xshape(self):
        return tuple(self.ranges[d] for d in self.kept_dims)

    @property
    def rshape(self):
        return tuple(self.ranges[d] for d in self.reduced_dims)

    @property
    def is_reduction(self):
        return bool(self.reduced_dims)

    def add(self, node, level, mapping):
        if isinstance(node, ir.Reduction) and not self.reduced_dims:
            self.reduced_dims = node.reduced_dims  # a pointwise kernel becomes its prologue
            for n in self.nodes:
                self.levels[n.name] = "r"
        self.nodes.append(node)
        self.levels[node.name] = level
        self.maps[node.name] = mapping
        self.origins.extend(o for o in node.origins if o not in self.origins)

    def body(self, node) -> ir.Expr:
        """node's body in the kernel's full-space symbols."""
        return _remap(node.body, self.maps[node.name])

    def store_index(self, node) -> sympy.Expr:
        return node.store_index().xreplace(self.maps[node.name]) if self.maps[node.name] else node.store_index()

    def buffer_names(self):
        return {n.name for n in self.nodes}

    def reads(self) -> set[str]:
        """Buffers the kernel loads from memory (not the ones it computes itself)."""
        inside = self.buffer_names()
        return {b for n in self.nodes for b in n.reads()} - inside

    def __repr__(self):
        names = ", ".join(f"{n.name}:{self.levels[n.name]}" for n in self.nodes)
        red = f" reduce dims {list(self.reduced_dims)}" if self.reduced_dims else ""
        return f"{self.name}: Kernel[{', '.join(map(str, self.ranges))}]{red}({names}) stores {self.stores}"


def _remap(expr: ir.Expr, mapping: dict) -> ir.Expr:
    if not mapping:
        return expr
    if isinstance(expr, ir.Load):
        return ir.Load(expr.buffer, expr.index.xreplace(mapping), expr.dtype)
    if isinstance(expr, ir.IndexValue):
        return ir.IndexValue(expr.index.xreplace(mapping), expr.dtype)
    if isinstance(expr, ir.Call):
        return ir.Call(expr.op, tuple(_remap(a, mapping) for a in expr.args), expr.dtype)
    if isinstance(expr, ir.Let):
        return ir.Let(expr.symbol, _remap(expr.value, mapping), expr.bound, _remap(expr.body, mapping),
                      expr.wrap_negative)
    return expr


def placement(node, kernel):
    """(level, symbol mapping into the kernel's full space), or None if node does not fit."""
    if isinstance(node, ir.Reduction):
        if node.ranges != tuple(kernel.ranges):
            return None
        if kernel.reduced_dims and node.reduced_dims != tuple(kernel.reduced_dims):
            return None
        return "red", {}
    if tuple(node.shape) == tuple(kernel.ranges):
        return ("r" if kernel.reduced_dims else "p"), {}
    if kernel.reduced_dims:
        # per-row values, with or without the reduced dims kept as size 1 (keepdim)
        mine = [k for k, s in enumerate(node.shape) if s != 1]
        kept = [d for d in kernel.kept_dims if kernel.ranges[d] != 1]
        if [node.shape[k] for k in mine] == [kernel.ranges[d] for d in kept]:
            mapping = {ir.index_symbol(k): sympy.Integer(0) for k, s in enumerate(node.shape) if s == 1}
            mapping.update({ir.index_symbol(k): ir.index_symbol(d) for k, d in zip(mine, kept)})
            return "x", mapping  # xreplace substitutes simultaneously, so shifts are safe
    return None


class ScatterStep:
    """A scatter-add kernel: never fused (its stores go to computed addresses)."""
    __slots__ = ("name", "node", "stores")
    is_reduction = False

    def __init__(self, name, node: ir.Scatter):
        self.name, self.node, self.stores = name, node, []

    @property
    def nodes(self):
        return [self.node]

    @property
    def origins(self):
        return list(self.node.origins)

    def reads(self) -> set[str]:
        return self.node.reads()

    def __repr__(self):
        return f"{self.name}: {self.node!r}"


class Schedule:
    """What the wrapper runs, in order: Kernels and Externs, plus buffer lifetimes."""
    __slots__ = ("program", "steps", "last_use")

    def __init__(self, program: ir.LoopProgram, steps):
        self.program = program
        self.steps = steps
        self.last_use: dict[str, int] = {}
        for i, step in enumerate(steps):
            for b in step.reads():
                self.last_use[b] = i

    @property
    def kernels(self):
        return [s for s in self.steps if isinstance(s, (Kernel, ScatterStep))]

    @property
    def externs(self):
        return [s for s in self.steps if isinstance(s, ir.Extern)]

    def __str__(self):
        lines = []
        for step in self.steps:
            if isinstance(step, Kernel):
                lines.append(repr(step))
                for n in step.nodes:
                    lines.append("    " + repr(n).replace("\n", "\n    "))
            else:
                lines.append(repr(step))
        lines.append(f"return {self.program.outputs!r}")
        return "\n".join(lines) + "\n"


def _why_not(node, kernel: Kernel) -> str | None:
    """None when node may join kernel; otherwise the reason it may not."""
    if node.device != kernel.device:
        return "devices differ"
    if math.prod(kernel.ranges) == 0:
        return "empty iteration space"
    place = placement(node, kernel)
    if place is None:
        what = f"reduction over {list(node.ranges)}" if isinstance(node, ir.Reduction) else f"shape {list(node.shape)}"
        return f"iteration spaces differ ({what} vs kernel {list(kernel.ranges)}" \
               f"{' reducing ' + str(list(kernel.reduced_dims)) if kernel.reduced_dims else ''})"
    level, mapping = place
    inside = {n.name: n for n in kernel.nodes}
    for ld in ir.loads_of(node.body):
        producer = inside.get(ld.buffer)
        if producer is None:
            continue
        plevel = kernel.levels[producer.name]
        if level == "x" and plevel in ("r", "p"):
            return f"{node.name} is per-row but reads the per-element {producer.name}"
        index = ld.index.xreplace(mapping) if mapping else ld.index
        canon = ir.canonical_index_fn(ir.ranges_of(kernel.ranges))
        if canon(index) != canon(kernel.store_index(producer)):
            return (f"{node.name} reads {ld.buffer} at {index}, not where it is stored "
                    f"({kernel.store_index(producer)}): another thread's value would be needed")
    return None


def schedule(program: ir.LoopProgram) -> Schedule:
    steps: list = []
    position: dict[str, int] = {}  # buffer -> index of the step that produces it
    kernel_ids = 0
    for buf in program.buffers:
        deps = buf.reads()
        earliest = max((position[d] for d in deps if d in position), default=-1)
        if isinstance(buf, (ir.Pointwise, ir.Reduction)):
            chosen = None
            for i in range(len(steps) - 1, max(earliest, 0) - 1, -1):
                step = steps[i]
                if not isinstance(step, Kernel):
                    continue
                if any(d in position and position[d] > i for d in deps):
                    continue  # a producer runs after this kernel
                reason = _why_not(buf, step)
                if reason is None:
                    chosen = i
                    log.log("schedule", "fuse %s into %s", buf.name, step.name)
                    break
                log.log("schedule", "do not fuse %s into %s: %s", buf.name, step.name, reason)
            if chosen is None:
                steps.append(Kernel(f"kernel{kernel_ids}", buf))
                kernel_ids += 1
                position[buf.name] = len(steps) - 1
            else:
                steps[chosen].add(buf, *placement(buf, steps[chosen]))
                position[buf.name] = chosen
        elif isinstance(buf, ir.Scatter):
            steps.append(ScatterStep(f"kernel{kernel_ids}", buf))
            kernel_ids += 1
            position[buf.name] = len(steps) - 1
        else:
            steps.append(buf)
            position[buf.name] = len(steps) - 1

    # Decide stores: a value leaves registers only when someone outside its kernel needs it.
    outputs = {o.buffer for o in program.outputs if isinstance(o, ir.TensorRef)}
    for i, step in enumerate(steps):
        if not isinstance(step, Kernel):
            continue
        needed_outside = set(outputs)
        for j, other in enumerate(steps):
            if j != i:
                needed_outside |= other.reads()
        step.stores = [n.name for n in step.nodes if n.name in needed_outside]
    return Schedule(program, steps)
