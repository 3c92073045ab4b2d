"""The scheduler: loop IR buffers -> an ordered list of kernels and library calls.

Fusion rule for pointwise buffers: a buffer joins an existing kernel when it iterates over the
same shape on the same device, the kernel comes after everything the buffer depends on, and
every read of a buffer already in that kernel is at exactly the index where that buffer is
stored (so the value is still in a register: no other thread's store is needed). Independent
buffers of the same shape are fused too (horizontal fusion). Each decision is logged on the
``schedule`` channel with its reason.

After fusion, a buffer is stored only if something outside its kernel reads it or the graph
returns it; the rest live in registers and are never allocated.
"""
from __future__ import annotations

import sympy

from kiln import log
from kiln.inductor import ir


class Kernel:
    __slots__ = ("name", "nodes", "shape", "device", "stores", "origins")

    def __init__(self, name, first: ir.Pointwise):
        self.name = name
        self.nodes = [first]
        self.shape = first.shape
        self.device = first.device
        self.stores: list[str] = []
        self.origins: list[str] = list(first.origins)

    def buffer_names(self):
        return {n.name for n in self.nodes}

    def reads(self) -> set[str]:
        """Buffers the kernel loads from memory (not the ones it computes itself)."""
        inside = self.buffer_names()
        return {b for n in self.nodes for b in n.reads()} - inside

    def __repr__(self):
        names = ", ".join(n.name for n in self.nodes)
        return f"{self.name}: Kernel[{', '.join(map(str, self.shape))}]({names}) stores {self.stores}"


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
        return [s for s in self.steps if isinstance(s, Kernel)]

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


def _fusable_reads(node: ir.Pointwise, kernel: Kernel, buffers: dict) -> str | None:
    """None when node may join kernel; otherwise the reason it may not."""
    if node.shape != kernel.shape:
        return f"iteration shapes differ ({list(node.shape)} vs {list(kernel.shape)})"
    if node.device != kernel.device:
        return "devices differ"
    inside = kernel.buffer_names()
    for ld in ir.loads_of(node.body):
        if ld.buffer in inside:
            producer = buffers[ld.buffer]
            if sympy.expand(ld.index - producer.store_index()) != 0:
                return (f"{node.name} reads {ld.buffer} at {ld.index}, not where it is stored "
                        f"({producer.store_index()}): another thread's value would be needed")
    return None


def schedule(program: ir.LoopProgram) -> Schedule:
    buffers = {b.name: b for b in program.inputs + program.buffers}
    steps: list = []
    position: dict[str, int] = {}  # buffer -> index of the step that produces it
    kernel_ids = 0
    for buf in program.buffers:
        deps = buf.reads()
        earliest = max((position[d] for d in deps if d in position), default=-1)
        if isinstance(buf, ir.Pointwise):
            chosen = None
            for i in range(len(steps) - 1, max(earliest, 0) - 1, -1):
                step = steps[i]
                if not isinstance(step, Kernel):
                    continue
                # Joining a kernel before its producers is impossible, unless the producer is
                # in that same kernel.
                producers_outside = [d for d in deps if d in position and position[d] > i]
                if producers_outside:
                    continue
                reason = _fusable_reads(buf, step, buffers)
                if reason is None:
                    chosen = i
                    log.log("schedule", "fuse %s into %s: same iteration space, reads line up",
                            buf.name, step.name)
                    break
                log.log("schedule", "do not fuse %s into %s: %s", buf.name, step.name, reason)
            if chosen is None:
                k = Kernel(f"kernel{kernel_ids}", buf)
                kernel_ids += 1
                steps.append(k)
                position[buf.name] = len(steps) - 1
            else:
                steps[chosen].nodes.append(buf)
                steps[chosen].origins.extend(o for o in buf.origins if o not in steps[chosen].origins)
                position[buf.name] = chosen
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
