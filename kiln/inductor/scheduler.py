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

import functools
import math

import sympy

from kiln import log
from kiln.config import config
from kiln.inductor import ir, loop_python
from kiln.inductor.own_reads import drop_unused, resolve_own_reads


class Kernel:
    __slots__ = ("name", "nodes", "ranges", "reduced_dims", "device", "stores", "origins",
                 "levels", "maps", "_names", "_reads")

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
        self._names = self._reads = None  # buffer_names() and reads(), until the next add
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

    def reshape(self, ranges, onto=None):
        """Re-index a pointwise kernel over ``ranges`` (same numel): each node's mapping is
        composed with ``onto``, the map from the old space onto the new one (default: both
        row-major views of one flat index)."""
        ranges = tuple(ranges)
        if ranges == tuple(self.ranges):
            return
        onto = reshape_mapping(self.ranges, ranges) if onto is None else onto
        # each composition is simplified over the new ranges: a kernel that horizontal fusion
        # flattens and refines again and again (transposed siblings) otherwise nests one
        # floor/modulo layer per round, and the maps grow without bound
        within = ir.ranges_of(ranges)
        for n in self.nodes:
            old = self.maps[n.name]
            self.maps[n.name] = ({s: ir.simplify_index(e.xreplace(onto), within) for s, e in old.items()}
                                 if old else dict(onto))
        self.ranges = ranges

    def add(self, node, level, mapping):
        if isinstance(node, ir.Reduction) and not self.reduced_dims:
            self.reduced_dims = node.reduced_dims  # a pointwise kernel becomes its prologue
            for n in self.nodes:
                self.levels[n.name] = "r"
        self.nodes.append(node)
        self._names = self._reads = None
        self.levels[node.name] = level
        self.maps[node.name] = mapping
        self.origins.extend(o for o in node.origins if o not in self.origins)

    def body(self, node) -> ir.Expr:
        """node's body in the kernel's full-space symbols."""
        return _remap(node.body, self.maps[node.name])

    def store_index(self, node) -> sympy.Expr:
        return node.store_index().xreplace(self.maps[node.name]) if self.maps[node.name] else node.store_index()

    def buffer_names(self) -> frozenset:
        if self._names is None:
            self._names = frozenset(n.name for n in self.nodes)
        return self._names

    def reads(self) -> frozenset:
        """Buffers the kernel loads from memory (not the ones it computes itself). The
        scheduler asks for every candidate pair, so both sets are kept until the next add."""
        if self._reads is None:
            self._reads = frozenset(b for n in self.nodes for b in n.reads()) - self.buffer_names()
        return self._reads

    def python(self) -> str:
        """This kernel's loop IR as runnable Python over torch tensors (``loop_python``)."""
        return loop_python.kernel_python(self).source

    def __repr__(self):
        names = ", ".join(f"{n.name}:{self.levels[n.name]}" for n in self.nodes)
        red = f" reduce dims {list(self.reduced_dims)}" if self.reduced_dims else ""
        return f"{self.name}: Kernel[{', '.join(map(str, self.ranges))}]{red}({names}) stores {self.stores}"


def remap(expr: ir.Expr, mapping: dict) -> ir.Expr:
    """expr with its index symbols substituted (simultaneously) by ``mapping``."""
    return _remap(expr, mapping)


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


def _suffix_products(shape) -> list:
    out, inner = [], 1
    for s in reversed(shape):
        out.append(inner)
        inner = inner * s
    return out[::-1]  # per dim: the product of the sizes after it


def _static(shape) -> bool:
    return all(isinstance(s, int) or (isinstance(s, sympy.Basic) and s.is_Integer) for s in shape)


@functools.lru_cache(maxsize=4096)
def common_ranges(a, b) -> tuple | None:
    """The coarsest shape that both ``a`` and ``b`` (of equal numel, static sizes) are views of
    without division: its dims are cut wherever either shape's dims are cut (a [4, 8] and a
    [32] give [4, 8]; a [2, 12] and a [6, 4] give [2, 3, 4]). None when no such shape exists
    (a cut of one does not divide a cut of the other: [6, 4] and [4, 6])."""
    total = math.prod(a)
    cuts = sorted({int(c) for c in _suffix_products(a) + _suffix_products(b)} | {int(total)})
    for lo, hi in zip(cuts, cuts[1:]):
        if hi % lo:
            return None
    return tuple(hi // lo for lo, hi in zip(cuts, cuts[1:]))[::-1]


def reshape_mapping(shape, ranges) -> dict:
    """{symbol of shape's dim k: its index in ranges' symbols}, both row-major views of one flat
    index. Linear where ``ranges`` refines ``shape``, a floor/modulo unravel otherwise."""
    return dict(_reshape_mapping(tuple(shape), tuple(ranges)))


@functools.lru_cache(maxsize=4096)
def _reshape_mapping(shape: tuple, ranges: tuple) -> dict:
    # a pure function of the two shapes, asked for once per candidate pair: sympy's
    # simplification is the scheduler's largest cost without the cache (callers get copies)
    flat = sum((ir.index_symbol(d) * st for d, st in enumerate(_suffix_products(ranges))), sympy.Integer(0))
    mapping = {}
    for k, (size, inner) in enumerate(zip(shape, _suffix_products(shape))):
        e = sympy.floor(flat / inner) if inner != 1 else flat
        if k > 0:
            e = sympy.Mod(e, size)
        mapping[ir.index_symbol(k)] = ir.simplify_index(e, ir.ranges_of(ranges)) if size != 1 else sympy.Integer(0)
    return mapping


# Independent pointwise kernels of the same numel but shapes with no common refinement share
# one flat loop (division and modulo per index) only when they are this small: there the
# launch is what costs, and above it the lost contiguous inner loop would.
HORIZONTAL_FLAT_MAX_NUMEL = 1 << 16


def horizontal_ranges(node, kernel) -> tuple | None:
    """The iteration space a pointwise kernel takes on when the pointwise ``node``, of another
    shape but the same number of elements, joins it (horizontal fusion), or None."""
    if kernel.reduced_dims or not isinstance(node, ir.Pointwise):
        return None
    return _horizontal_ranges(tuple(kernel.ranges), tuple(node.shape))


@functools.lru_cache(maxsize=4096)
def _horizontal_ranges(a: tuple, b: tuple) -> tuple | None:
    if not (_static(a) and _static(b)) or math.prod(a) != math.prod(b) or math.prod(a) == 0:
        return None
    common = common_ranges(a, b)
    if common is not None:
        return common
    return (math.prod(a),) if math.prod(a) <= HORIZONTAL_FLAT_MAX_NUMEL else None


def split_onto(node, kernel) -> dict | None:
    """When ``node`` is the first stage of a split reduction over the pointwise kernel's space
    (its ``source`` shape), the map from that space onto the stage's iteration space: the
    kernel's values are then computed, stored and reduced in one pass (a bias gradient's
    column sums fused with the GELU backward that produces them)."""
    if not isinstance(node, ir.Reduction) or node.source is None or kernel.reduced_dims \
            or not config.fuse_split_prologue:
        return None
    shape, index = node.source
    if tuple(shape) != tuple(kernel.ranges) or tuple(node.ranges) == tuple(kernel.ranges):
        return None
    return {ir.index_symbol(k): e for k, e in enumerate(index)}


def placement(node, kernel):
    """(level, symbol mapping into the kernel's full space), or None if node does not fit."""
    if isinstance(node, ir.Reduction):
        if split_onto(node, kernel) is not None:
            return "red", {}
        if node.ranges != tuple(kernel.ranges):
            return None
        if kernel.reduced_dims and node.reduced_dims != tuple(kernel.reduced_dims):
            return None
        return "red", {}
    if tuple(node.shape) == tuple(kernel.ranges):
        return ("r" if kernel.reduced_dims else "p"), {}
    if not kernel.reduced_dims:
        ranges = horizontal_ranges(node, kernel)
        if ranges is not None:  # the mapping is into the space the kernel takes on
            return "p", reshape_mapping(node.shape, ranges)
    if kernel.reduced_dims:
        # a reshaped view of the full space (a norm's output flattened to [rows, dim] for a
        # matmul): linear index maps when the kernel's space refines the node's shape
        if isinstance(node, ir.Pointwise) and _refines(kernel.ranges, node.shape):
            return "r", reshape_mapping(node.shape, kernel.ranges)
        # per-row values, with or without the reduced dims kept as size 1 (keepdim)
        mine = [k for k, s in enumerate(node.shape) if s != 1]
        kept = [d for d in kernel.kept_dims if kernel.ranges[d] != 1]
        if [node.shape[k] for k in mine] == [kernel.ranges[d] for d in kept]:
            mapping = {ir.index_symbol(k): sympy.Integer(0) for k, s in enumerate(node.shape) if s == 1}
            mapping.update({ir.index_symbol(k): ir.index_symbol(d) for k, d in zip(mine, kept)})
            return "x", mapping  # xreplace substitutes simultaneously, so shifts are safe
        kept_sizes = [kernel.ranges[d] for d in kept]
        if kept and isinstance(node, ir.Pointwise) and _refines(kept_sizes, [node.shape[k] for k in mine]):
            # per-row values of a reshaped row space ([2, 128] rows read as [256])
            inner = reshape_mapping([node.shape[k] for k in mine], kept_sizes)
            rename = {ir.index_symbol(j): ir.index_symbol(d) for j, d in enumerate(kept)}
            mapping = {ir.index_symbol(k): sympy.Integer(0) for k, s in enumerate(node.shape) if s == 1}
            mapping.update({ir.index_symbol(k): inner[ir.index_symbol(j)].xreplace(rename)
                            for j, k in enumerate(mine)})
            return "x", mapping
    return None


def _refines(ranges, shape) -> bool:
    """``ranges`` cuts the flat index everywhere ``shape`` does (same numel, static sizes), so
    every index of ``shape`` is a linear combination of ``ranges``' indices."""
    return _refines_tuples(tuple(ranges), tuple(shape))


@functools.lru_cache(maxsize=4096)
def _refines_tuples(ranges: tuple, shape: tuple) -> bool:
    if ranges == shape or not (_static(ranges) and _static(shape)) or math.prod(ranges) != math.prod(shape):
        return False
    return math.prod(ranges) > 0 and common_ranges(ranges, shape) == tuple(int(r) for r in ranges)


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

    def python(self) -> str:
        """This kernel's loop IR as runnable Python over torch tensors (``loop_python``)."""
        return loop_python.kernel_python(self).source

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
    ranges = target_ranges(node, kernel)
    onto = space_onto(node, kernel, ranges)
    canon = ir.canonical_index_fn(ir.ranges_of(ranges))
    for ld in ir.loads_of(node.body):
        producer = inside.get(ld.buffer)
        if producer is None:
            continue
        plevel = kernel.levels[producer.name]
        if level == "x" and plevel in ("r", "p"):
            return f"{node.name} is per-row but reads the per-element {producer.name}"
        index = ld.index.xreplace(mapping) if mapping else ld.index
        stored = kernel.store_index(producer)
        if onto is not None:
            stored = stored.xreplace(onto)
        if canon(index) != canon(stored):
            return (f"{node.name} reads {ld.buffer} at {index}, not where it is stored "
                    f"({stored}): another thread's value would be needed")
    return None


def space_onto(node, kernel, ranges) -> dict | None:
    """The map from the kernel's space onto ``ranges`` (``target_ranges``), None if unchanged."""
    if ranges == tuple(kernel.ranges):
        return None
    return split_onto(node, kernel) or reshape_mapping(kernel.ranges, ranges)


def target_ranges(node, kernel) -> tuple:
    """The kernel's iteration space once node has joined it (changed by a pointwise node of
    another shape with the same numel: horizontal fusion; and by the first stage of a split
    reduction over the kernel's space)."""
    if split_onto(node, kernel) is not None:
        return tuple(node.ranges)
    if not kernel.reduced_dims and not isinstance(node, ir.Reduction) \
            and tuple(node.shape) != tuple(kernel.ranges):
        ranges = horizontal_ranges(node, kernel)
        if ranges is not None:
            return ranges
    return tuple(kernel.ranges)


def _nbytes(buf):
    n = math.prod(buf.shape) * buf.dtype.itemsize
    return int(n) if isinstance(n, int) or getattr(n, "is_Integer", False) else None


SHARED_READ_REACH = 3  # kernels a horizontal fusion may skip back over on shared reads
PEAK_IGNORE_BYTES = 1 << 20  # a result this small never matters to peak memory


class _ProgramFacts:
    """What the fusion rules ask of the program for every candidate pair, computed once."""
    __slots__ = ("by_name", "pinned")

    def __init__(self, program: ir.LoopProgram):
        self.by_name = {b.name: b for b in program.inputs + program.buffers}
        # graph inputs and returned views: alive the whole program, never freed by a move
        self.pinned = {b.name for b in program.inputs}
        self.pinned |= {o.buffer for o in program.outputs if isinstance(o, ir.TensorRef)}


def _peak_reason(buf, i: int, steps: list, position: dict, facts: _ProgramFacts) -> str | None:
    """Why moving ``buf`` from the end of the schedule into step ``i`` (a kernel it reads
    nothing from: horizontal fusion) would raise peak memory, or None. Its result becomes live
    across the steps after ``i``, while the buffers it is the last reader of die earlier. Up to
    the bytes of the inputs it shares with the kernel are allowed on top: those are read once
    instead of twice."""
    later = steps[i + 1:]
    if not later:
        return None
    out = _nbytes(buf)
    if out is None:
        return f"its {list(buf.shape)} result would be live across {len(later)} later steps (symbolic size)"
    if out <= PEAK_IGNORE_BYTES:
        return None
    freed = 0
    for b in buf.reads():
        if b in facts.pinned or b not in position or any(b in s.reads() for s in later):
            continue
        size = _nbytes(facts.by_name[b])
        freed += size or 0
    # reading an input the kernel already reads is the gain: the fused kernel loads it once
    # (a GELU backward joining the GELU recompute of the same pre-activation)
    # (only next door: a result moved far up would stay live across the whole program; the
    # normalized activations of every layer's norm once joined the backward's first kernel)
    near = sum(isinstance(s, Kernel) for s in later) <= SHARED_READ_REACH
    shared = sum(_nbytes(facts.by_name[b]) or 0 for b in buf.reads() & steps[i].reads()) if near else 0
    if out > freed + shared:
        return (f"its result ({out} bytes) would be live across {len(later)} later steps, "
                f"freeing only {freed} bytes earlier and sharing {shared} bytes of reads: "
                f"peak memory could rise")
    return None


def sink_pointwise(program: ir.LoopProgram) -> ir.LoopProgram:
    """Move each pointwise buffer down to just before its first reader (program order is the
    order the scheduler fuses in). A backward recomputes GELU's output for the weight gradient's
    matmul, and GELU's backward reads the same pre-activation after the other matmul; sunk next
    to each other they fuse into one kernel that reads the pre-activation once, and each value
    lives shorter. A buffer never moves past a scatter into a buffer it reads."""
    if not config.sink_pointwise:
        return program
    order = list(program.buffers)
    reads = {b.name: b.reads() for b in order}
    for b in reversed(program.buffers):
        if not isinstance(b, ir.Pointwise):
            continue
        i = order.index(b)
        j = i + 1
        while j < len(order) and b.name not in reads[order[j].name] and not (
                isinstance(order[j], ir.Scatter) and order[j].target in reads[b.name]):
            j += 1
        if j == len(order) or j == i + 1:
            continue  # read by no later step (an output), or already next to its reader
        order.insert(j - 1, order.pop(i))
    program.buffers = order
    return program


def _sibling_reading_the_same(buf, i: int, earliest: int, steps: list, position: dict, facts):
    """An earlier kernel than ``i`` that reads what ``buf`` reads and may take it, or None.
    ``buf`` was about to join kernel ``i`` horizontally while sharing no input with it; a kernel
    that already loads its input saves that read (a variance a norm's backward saves, computed
    late in the forward, belongs with the norm's own kernel, not with the last norm's)."""
    deps = buf.reads()
    for k in range(i - 1, max(earliest, 0) - 1, -1):
        step = steps[k]
        if not isinstance(step, Kernel) or not (deps & step.reads()):
            continue
        if any(d in position and position[d] > k for d in deps):
            continue
        if _why_not(buf, step) is None and not (deps & step.buffer_names()) \
                and _peak_reason(buf, k, steps, position, facts) is None:
            return k
    return None


PARTNER_REACH = 8  # later buffers a buffer looks ahead to for one that shares its reads


def _space(buf):
    """The number of elements a buffer's kernel iterates over (a reduction's input space)."""
    return math.prod(buf.ranges if isinstance(buf, ir.Reduction) else buf.shape)


def _later_partner(j: int, buffers: list, facts: _ProgramFacts) -> bool:
    """Whether a buffer shortly after ``buffers[j]`` in program order reads one of its non-tiny
    inputs over an iteration space of the same size: a kernel partner that saves a read (and
    often a recomputation) which a horizontal fusion into an unrelated earlier kernel would
    forfeit. A backward's recomputed SiLU (GELU) of layer 0, needed by its down projection's
    weight gradient, joined layer 1's SiLU backward kernel; layer 0's own SiLU backward then
    read the pre-activation again and computed its sigmoid a second time."""
    buf = buffers[j]
    mine = {b for b in buf.reads() if (_nbytes(facts.by_name[b]) or PEAK_IGNORE_BYTES) > 4096} \
        if all(b in facts.by_name for b in buf.reads()) else set(buf.reads())
    if not mine:
        return False
    space = _space(buf)
    for later in buffers[j + 1:j + 1 + PARTNER_REACH]:
        if isinstance(later, (ir.Pointwise, ir.Reduction)) and later.reads() & mine and _space(later) == space:
            return True
    return False


def schedule(program: ir.LoopProgram) -> Schedule:
    program = sink_pointwise(program)
    facts = _ProgramFacts(program)
    steps: list = []
    position: dict[str, int] = {}  # buffer -> index of the step that produces it
    kernel_ids = 0
    for j, buf in enumerate(program.buffers):
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
                if reason is not None and isinstance(buf, ir.Pointwise):
                    alt = _in_memory_order_if_it_fuses(program, buf, step, reason)
                    if alt is not None:
                        buf, reason = alt, None
                horizontal = reason is None and not (buf.reads() & step.buffer_names())
                if horizontal:
                    reason = _peak_reason(buf, i, steps, position, facts)
                if horizontal and reason is None and not (buf.reads() & step.reads()) \
                        and _later_partner(j, program.buffers, facts):
                    reason = "a later buffer reads what it reads: it waits to start a kernel with it"
                if reason is None:
                    chosen = i
                    if horizontal and not (buf.reads() & step.reads()):
                        sibling = _sibling_reading_the_same(buf, i, earliest, steps, position, facts)
                        chosen = i if sibling is None else sibling
                        step = steps[chosen]
                    log.log("schedule", "fuse %s into %s%s", buf.name, step.name,
                            " (horizontal: independent, same number of elements)" if horizontal else "")
                    break
                log.log("schedule", "do not fuse %s into %s: %s", buf.name, step.name, reason)
            if chosen is None:
                if isinstance(buf, ir.Pointwise):
                    buf = _start_in_memory_order(program, buf)
                steps.append(Kernel(f"kernel{kernel_ids}", buf))
                kernel_ids += 1
                position[buf.name] = len(steps) - 1
            else:
                kernel = steps[chosen]
                level, mapping = placement(buf, kernel)  # into the space it is about to take on
                ranges = target_ranges(buf, kernel)
                kernel.reshape(ranges, space_onto(buf, kernel, ranges))
                kernel.add(buf, level, mapping)
                position[buf.name] = chosen
        elif isinstance(buf, ir.Scatter):
            steps.append(ScatterStep(f"kernel{kernel_ids}", buf))
            kernel_ids += 1
            position[buf.name] = len(steps) - 1
        else:
            steps.append(buf)
            position[buf.name] = len(steps) - 1

    steps = hoist_recomputed_prologues(steps)
    inlined = {step.name: resolve_own_reads(step) for step in steps if isinstance(step, Kernel)}
    # Decide stores: a value leaves registers only when someone outside its kernel needs it.
    # (a kernel's reads() never names its own buffers, so the reads of all steps together are
    # what each kernel's outside needs)
    needed = {o.buffer for o in program.outputs if isinstance(o, ir.TensorRef)}
    for step in steps:
        needed |= step.reads()
    for step in steps:
        if isinstance(step, Kernel):
            step.stores = [n.name for n in step.nodes if n.name in needed]
            drop_unused(step, inlined[step.name])
    return Schedule(program, steps)


def _start_in_memory_order(program, buf: ir.Pointwise):
    """A pointwise buffer that starts a kernel of its own loops in its stride order, so that its
    stores walk memory: ``x.t() + y`` keeps eager's transposed strides (its first operand's), and
    looped over its logical dims every store and the ``x`` loads strided by a row, where in
    memory order only ``y``'s load is transposed and the 2-D tiles (codegen/triton_tiled.py)
    make it coalesced as well. The same bytes either way (``memory_order``)."""
    alt = memory_order(buf)
    if alt is None:
        return buf
    log.log("schedule", "loop %s in its stride order %s", buf.name, list(alt.shape))
    program.buffers[program.buffers.index(buf)] = alt
    program.outputs = [ir.TensorRef(o, buf.shape, buf.stride, 0) if isinstance(o, str) and o == buf.name
                       else o for o in program.outputs]
    return alt


def _in_memory_order_if_it_fuses(program, buf: ir.Pointwise, kernel, reason):
    """``buf`` looped in its stride order (outermost dim = largest stride) when that lets it join
    ``kernel`` and it did not as it was: an output in eager's transposed strides reading an
    intermediate stored in memory order reads each element where the kernel's thread stored
    it once both walk memory the same way. Loads address buffers by flat offsets and outputs
    are strided views, so the reordered buffer holds the same bytes; an output naming it
    becomes a view with its logical shape and strides. None (nothing changed) otherwise."""
    alt = memory_order(buf)
    if alt is None or _why_not(alt, kernel) is not None:
        return None
    log.log("schedule", "loop %s in its stride order %s to fuse it into %s (%s)", buf.name,
            list(alt.shape), kernel.name, reason)
    program.buffers[program.buffers.index(buf)] = alt
    program.outputs = [ir.TensorRef(o, buf.shape, buf.stride, 0) if isinstance(o, str) and o == buf.name
                       else o for o in program.outputs]
    return alt


def memory_order(buf: ir.Pointwise):
    """``buf`` over its dims sorted by stride (size-1 dims first), stored contiguously in that
    order: the same bytes, written walking memory; None when its strides are symbolic, not a
    dense permutation, or already in order."""
    shape, stride = buf.shape, buf.stride
    if not all(type(v) is int for v in shape + stride) or math.prod(shape) == 0:
        return None
    perm = sorted(range(len(shape)), key=lambda d: (shape[d] != 1, -stride[d], d))
    if perm == list(range(len(shape))):
        return None
    new_shape = tuple(shape[d] for d in perm)
    new_stride = ir_contiguous(new_shape)
    if any(shape[d] != 1 and stride[d] != new_stride[k] for k, d in enumerate(perm)):
        return None  # not dense (padded, overlapping): another layout than a permutation
    old, new = ir.index_symbols(len(shape)), ir.index_symbols(len(shape))
    dummy = [sympy.Symbol(f"_perm{k}", integer=True) for k in range(len(shape))]
    # old i_{perm[k]} is the new i_k (through dummies, as the two sets of names coincide)
    to_dummy = {old[d]: dummy[k] for k, d in enumerate(perm)}
    to_new = {dummy[k]: new[k] for k in range(len(shape))}
    body = _reindex(buf.body, lambda e: e.xreplace(to_dummy).xreplace(to_new))
    return ir.Pointwise(buf.name, new_shape, new_stride, buf.dtype, buf.device, body, buf.origins)


def ir_contiguous(shape) -> tuple:
    out, acc = [], 1
    for size in reversed(shape):
        out.append(acc)
        acc *= size
    return tuple(reversed(out))


def _reindex(expr, fn):
    """expr with fn applied to every index expression (loads, index values, let bounds' bodies)."""
    if isinstance(expr, ir.Load):
        return ir.Load(expr.buffer, fn(expr.index), expr.dtype)
    if isinstance(expr, ir.IndexValue):
        return ir.IndexValue(fn(expr.index), expr.dtype)
    if isinstance(expr, ir.Call):
        return ir.Call(expr.op, tuple(_reindex(a, fn) for a in expr.args), expr.dtype)
    if isinstance(expr, ir.Let):
        return ir.Let(expr.symbol, _reindex(expr.value, fn), expr.bound, _reindex(expr.body, fn),
                      expr.wrap_negative)
    if isinstance(expr, ir.Const):
        return expr
    raise TypeError(f"[schedule] memory_order: no rule for {type(expr).__name__}")


# A per-element value a later pass of a C++ reduction kernel would compute again is stored by
# a kernel of its own instead, when computing it costs at least this many loads or calls.
HOIST_MIN_LOADS = 6
HOIST_MIN_CALLS = 32


def _cost(nodes) -> tuple[int, int]:
    loads = calls = 0
    for n in nodes:
        for e in ir.walk(n.body):
            if isinstance(e, ir.Load):
                loads += 1
            elif isinstance(e, ir.Call) and e.op != "cast":
                calls += 1
    return loads, calls


def hoist_recomputed_prologues(steps: list) -> list:
    """C++ reduction kernels run one loop over a row per pass: the reductions, then those that
    need the first ones (a variance around its mean), then the per-element results that need
    them (a norm's output). Everything a later pass reads from the first is computed again
    there, from its loads. For a cheap prologue that is the right trade; for an expensive one
    (max_pool2d's window maxima before a batch norm, or its gradient's window gathers before
    the norm's backward: 2 and 3 passes, 4.7 of 9 ms in a small ResNet's step) it is not. Such
    a value (with the per-element values it is computed from) moves to a pointwise kernel just
    before, which stores it; the reduction kernel loads it in each pass. Triton kernels keep
    the recomputation (a GPU's compute hides it better; not measured there yet)."""
    out = []
    for step in steps:
        if isinstance(step, Kernel) and step.reduced_dims and step.device.type == "cpu":
            hoisted = _split_recomputed(step)
            if hoisted is not None:
                out.append(hoisted)
        out.append(step)
    return out


def _split_recomputed(kernel: Kernel):
    """The pointwise kernel of ``kernel``'s expensive recomputed prologue values (removed from
    ``kernel``), or None."""
    by_name = {n.name: n for n in kernel.nodes}
    inside = {n.name: n.reads() & by_name.keys() for n in kernel.nodes}
    late: set = set()
    for n in kernel.nodes:  # nodes come in dependency order
        if kernel.levels[n.name] in ("red", "x") or inside[n.name] & late:
            late.add(n.name)
    early = [n for n in kernel.nodes if n.name not in late]
    if len(early) == len(kernel.nodes) or not early:
        return None
    targets = [e for e in early if any(e.name in inside[l] for l in late)]

    def closure(name, acc):
        if name not in acc:
            acc.add(name)
            for d in inside[name]:
                closure(d, acc)
        return acc
    move: set = set()
    for t in targets:
        names = closure(t.name, set())
        loads, calls = _cost(by_name[n] for n in names)
        if loads >= HOIST_MIN_LOADS or calls >= HOIST_MIN_CALLS:
            log.log("schedule", "store %s before %s: its later passes would recompute it (%d loads, %d calls)",
                    t.name, kernel.name, loads, calls)
            move |= names
    if not move:
        return None
    pointwise = Kernel.__new__(Kernel)
    pointwise.name = kernel.name + "_pre"
    pointwise.ranges, pointwise.reduced_dims = tuple(kernel.ranges), ()
    pointwise.device = kernel.device
    pointwise.stores = []
    pointwise.nodes = [n for n in kernel.nodes if n.name in move]
    pointwise.levels = {n.name: "p" for n in pointwise.nodes}
    pointwise.maps = {n.name: kernel.maps[n.name] for n in pointwise.nodes}
    pointwise.origins = [o for n in pointwise.nodes for o in n.origins]
    pointwise._names = pointwise._reads = None
    kernel.nodes = [n for n in kernel.nodes if n.name not in move]
    for name in move:
        del kernel.levels[name], kernel.maps[name]
    kernel._names = kernel._reads = None
    return pointwise
