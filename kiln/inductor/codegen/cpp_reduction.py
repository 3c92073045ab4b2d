"""C++ code generation for reduction kernels.

OpenMP splits the rows (kept dims, flattened); each row runs one loop over the reduced dims per
pass (``common.plan_phases``) with scalar accumulators, then computes its per-row epilogue.
Sum-only passes get ``omp simd reduction`` so gcc vectorizes them.
"""
from __future__ import annotations

import math

import sympy
import torch

from kiln.config import config
from kiln.inductor import ir
from kiln.inductor.codegen import cpp_runs
from kiln.inductor.codegen.cpp_hoist import hoist_row_invariants
from kiln.inductor.codegen.common import (IDENTITY, IndexPrinter, KernelWriter, compute_dtype,
                                          decompose_index, is_symbolic, plan_phases, size_params,
                                          size_text)
from kiln.inductor.codegen.cpp import (C_MEM_TYPES, PRELUDE, CppKernel, CppOps, _helpers_for,
                                       cpp_bounds_check, with_index_flag, cpp_cast, cpp_const, cpp_declare, cpp_load,
                                       cpp_store_value, ctype, index_check_support)


# Partial accumulators per reduction in a vectorized row loop: 32 floats are two AVX-512 (or
# four AVX2) registers, so two independent vector chains hide the add/max latency.
LANES = 32
# fp32 sums are cascaded: the float lanes run at most CASCADE_BLOCKS lane blocks (or one run
# of a split row), then are added into double partials and restart from zero. One float chain
# over a whole long row lost 2-3x eager's accuracy (torch's CPU sum cascades, its batch norm
# accumulates across planes in double); a double accumulator in the inner loop cost 17-30%
# on reduction-bound kernels, the flush costs nothing measurable.
CASCADE_BLOCKS = 64
LANE_REDUCTIONS = ("sum", "prod", "max", "min")
# prefetching the next row (``next_row_prefetches``): only for data unlikely to stay in cache
# between calls (a 256x4096 fp32 softmax's 4 MB lost 3% with it) and rows of at least 8 KB
PREFETCH_MIN_BYTES = 16 << 20
PREFETCH_MIN_ROW_BYTES = 8 << 10


def cascaded(node, dt, rnumel) -> bool:
    """Whether a reduction's float partials are flushed into double ones (``CASCADE_BLOCKS``).
    Not where the row is known to fit one float chain (at most LANES * CASCADE_BLOCKS
    elements): the flush would come once, at the end, while the double lanes cost a set-up and
    a flush per row (a layer norm over 128 features); the lanes still combine in double
    (``_combine_lanes``), which is what that one flush gave."""
    if node.reduction_type != "sum" or dt != torch.float32:
        return False
    if rnumel is None:  # a scalar loop: a double accumulator outright
        return True
    run = sympy.sympify(rnumel)
    return not (run.is_Integer and int(run) <= LANES * CASCADE_BLOCKS)


def flush_cascade(accs: dict, phase, lanes: str, rnumel) -> list[str]:
    """Each cascaded reduction's float lanes added into its double partials, and zeroed."""
    out = []
    for node in phase.reductions:
        acc, _, dt = accs[node.name]
        if cascaded(node, dt, rnumel):
            out.append(f"for (int64_t rl = 0; rl < {lanes}; ++rl) {{ {acc}_d[rl] += {acc}_v[rl]; "
                       f"{acc}_v[rl] = 0.0f; }}")
    return out


def _combine(kind: str, acc: str, other: str, dt) -> str:
    if kind == "sum":
        return f"{acc} += {other}"
    if kind == "prod":
        return f"{acc} *= {other}"
    return f"{acc} = kiln_{kind}<{ctype(dt)}>({acc}, {other})"


R0 = sympy.Symbol("r0", integer=True, nonnegative=True)


def _flat_reduced_index(kernel, rshape):
    """index -> the same index over the flat reduced counter ``r0`` where that needs no division:
    several reduced dims that are contiguous together in memory (``x.sum()`` over [2048, 2048]
    reads ``in[r0]``, not ``in[2048*(r0 / 2048) + r0 % 2048]``, which gcc cannot vectorize)."""
    if len(kernel.reduced_dims) < 2 or not all(isinstance(s, int) or getattr(s, "is_Integer", False) for s in rshape):
        return lambda e: e
    sub, inner = {}, 1
    for d, size in zip(reversed(kernel.reduced_dims), reversed([int(s) for s in rshape])):
        e = sympy.floor(R0 / inner) if inner > 1 else R0
        sub[ir.index_symbol(d)] = sympy.Mod(e, size) if d != kernel.reduced_dims[0] else e
        inner *= size
    rranges = {R0: inner}

    def flat(expr):
        if not (expr.free_symbols & set(sub)):
            return expr
        merged = ir.simplify_index(expr.xreplace(sub), rranges)
        if merged.has(sympy.Mod) or merged.has(sympy.floor):
            return expr  # not contiguous together: the per-dim indices are cheaper
        return merged
    return flat


RI = sympy.Symbol("ri", integer=True, nonnegative=True)
# the inner loop of a split row must be at least this long to be worth its own loop
SPLIT_MIN_INNER = 16


def _merge_inner(expr, inner_dims, inner_shape, ranges):
    """expr with the inner reduced dims read through the inner counter ``ri``, or None when
    that needs division (those dims are not contiguous together in this buffer)."""
    sub, inner = {}, 1
    for d, size in zip(reversed(inner_dims), reversed(inner_shape)):
        e = sympy.floor(RI / inner) if inner > 1 else RI
        sub[ir.index_symbol(d)] = sympy.Mod(e, size) if d != inner_dims[0] else e
        inner *= size
    if not (expr.free_symbols & set(sub)):
        return expr
    merged = ir.simplify_index(expr.xreplace(sub), {**ranges, RI: inner})
    if merged.has(sympy.Mod) or merged.has(sympy.floor):
        return None
    return merged


def row_split(kernel, rshape, ranges):
    """How many leading reduced dims an outer row loop takes, or None (one flat loop). A
    reduction over [N, C, H, W]'s (0, 2, 3) (batch norm's statistics and its backward's sums)
    reads each channel's row as N runs of H*W contiguous elements; one flat counter over all
    three dims indexes them with a division and a modulo per element, which gcc does not
    vectorize (gathers), so the row becomes ``for ro < N: for ri < H*W`` with a vectorized
    inner loop. The split is the smallest count of leading dims after which every access of
    the kernel reads the remaining dims contiguously together; None when a flat counter is
    already linear for every access, or no split is."""
    dims = kernel.reduced_dims
    if len(dims) < 2 or not all(isinstance(s, int) or getattr(s, "is_Integer", False) for s in rshape):
        return None
    rshape = [int(s) for s in rshape]
    syms = {ir.index_symbol(d) for d in dims}
    exprs = []
    for node in kernel.nodes:
        for ld in ir.loads_of(kernel.body(node)):
            if ld.index.free_symbols & syms:
                exprs.append(ir.simplify_index(ld.index, ranges))
        if kernel.levels.get(node.name) == "r" and node.name in kernel.stores:
            exprs.append(ir.simplify_index(kernel.store_index(node), ranges))
    if not exprs:
        return None
    flat = _flat_reduced_index(kernel, rshape)
    if all(flat(e) is not e or not (e.free_symbols & syms) for e in exprs):
        return None  # one flat counter is linear everywhere already
    for k in range(1, len(dims)):
        if math.prod(rshape[k:]) < SPLIT_MIN_INNER:
            break
        if all(_merge_inner(e, dims[k:], rshape[k:], ranges) is not None for e in exprs):
            return k
    return None


# Ops worth keeping per element in a row scratch array rather than recomputing in a later pass.
EXPENSIVE = frozenset({"exp", "log", "tanh", "sigmoid", "erf", "pow", "sin", "cos", "exp2", "log2",
                       "log10", "expm1", "log1p"})
SCRATCH_MAX_ROW = 16384  # elements of all scratch rows together: they live on each thread's stack


class RowScratchWriter(KernelWriter):
    """Remembers, per pass over a row, the expensive per-element subexpressions it emits. Given
    a plan (those that several passes compute: softmax's exp(x - max) in the sum pass and the
    output pass), the first pass stores the value in a row scratch array and later passes load
    it instead of recomputing."""

    def __init__(self, *args, reduced_syms=(), plan=()):
        super().__init__(*args)
        self.phase = None  # the pass being emitted (None outside the row loops)
        self.reduced_syms = set(reduced_syms)
        self.seen: dict = {}  # key -> set of passes that computed it
        self.plan = {key: f"scr{k}" for k, key in enumerate(plan)}
        self.saved: dict = {}  # key -> the pass that stored it

    def _expensive(self, expr) -> bool:
        per_element = cheap = False
        for e in ir.walk(expr):
            if isinstance(e, ir.Call) and e.op in EXPENSIVE:
                cheap = True
            if isinstance(e, (ir.Load, ir.IndexValue)) and e.index.free_symbols & self.reduced_syms:
                per_element = True
            if isinstance(e, ir.Let):
                return False
        return per_element and cheap

    def _per_element(self, expr) -> bool:
        return any(isinstance(e, (ir.Load, ir.IndexValue)) and e.index.free_symbols & self.reduced_syms
                   for e in ir.walk(expr))

    def emit(self, expr):
        if self.phase is None or not isinstance(expr, ir.Call) or expr.op == "cast":
            return super().emit(expr)
        if expr.op == "div" and expr.dtype == torch.float32 and self._per_element(expr.args[0]) \
                and not self._per_element(expr.args[1]):
            # x / s with s per row (softmax's normalization): x * (1 / s), the reciprocal once
            # per row (gcc hoists it), as ATen's CPU softmax does; a vector divide per element
            # was a tenth of the pass
            s = self.emit(expr.args[1])
            inv = self._tmp(f"(1.0f / {s})", torch.float32)
            return self._tmp(f"({self.emit(expr.args[0])} * {inv})", torch.float32)
        key = (repr(expr), expr.dtype)
        scr = self.plan.get(key)
        if scr is not None and key in self.saved and self.saved[key] < self.phase:
            return self._tmp(f"{scr}[r0]", expr.dtype)
        value = super().emit(expr)
        if scr is not None and key not in self.saved:
            self.lines.append(f"{scr}[r0] = {value};")
            self.saved[key] = self.phase
        elif scr is None and self._expensive(expr):
            self.seen.setdefault(key, set()).add(self.phase)
        return value


def generate_cpp_reduction(kernel, buffers: dict) -> CppKernel:
    from kiln.inductor.codegen.cpp_column import column_plan, generate_cpp_column_reduction
    if column_plan(kernel):
        return generate_cpp_column_reduction(kernel, buffers)
    gen, seen = _generate_rows(kernel, buffers, ())
    rnumel = math.prod(kernel.rshape)
    plan = [key for key, phases in seen.items() if len(phases) > 1]
    if plan and isinstance(rnumel, int) and len(plan) * rnumel <= SCRATCH_MAX_ROW:
        gen, _ = _generate_rows(kernel, buffers, plan)
    return gen


def next_row_prefetches(kernel, buffers: dict, phases, ranges, flat, printer) -> list[str]:
    """Prefetches of the next row's first-pass reads, one per cache line of a lane block, for
    the last lane pass of a multi-pass row (cross-entropy's sum of exps): the first pass of the
    next row then finds its row in cache instead of waiting on memory after this row's
    compute. One kept dim and one reduced dim, static sizes, loads contiguous along the row.
    Cross-entropy 4096x50257 fp32, 2 cores: 57.6 -> 47.0 ms; 4096x4096: 4.48 -> 3.90 ms."""
    if len(phases) < 2 or len(kernel.kept_dims) != 1 or len(kernel.reduced_dims) != 1 or \
            not all(isinstance(s, int) or getattr(s, "is_Integer", False) for s in kernel.ranges):
        return []
    k_sym, r_sym = ir.index_symbol(kernel.kept_dims[0]), ir.index_symbol(kernel.reduced_dims[0])
    rows, rnumel = int(kernel.ranges[kernel.kept_dims[0]]), int(kernel.ranges[kernel.reduced_dims[0]])
    inside = {n.name for n in kernel.nodes}
    out, seen = [], set()
    for node in phases[0].reductions:
        for ld in ir.loads_of(kernel.body(node)):
            if ld.buffer in inside or ld.buffer not in buffers:
                continue
            index = sympy.expand(flat(ir.simplify_index(ld.index, ranges)))
            size = buffers[ld.buffer].dtype.itemsize
            if index.coeff(r_sym, 1) != 1 or (index - r_sym).free_symbols - {k_sym} or \
                    rnumel * size < PREFETCH_MIN_ROW_BYTES or rows * rnumel * size < PREFETCH_MIN_BYTES:
                continue
            at = index.xreplace({k_sym: k_sym + 1, r_sym: sympy.Symbol("rb", integer=True)})
            for line in range(0, LANES * size, 64):
                text = f"__builtin_prefetch(&{{ptr}}[{printer.doprint(at)}{f' + {line // size}' if line else ''}], 0, 3);"
                if (ld.buffer, text) not in seen:
                    seen.add((ld.buffer, text))
                    out.append((ld.buffer, text))
    return out


def _generate_rows(kernel, buffers: dict, plan) -> tuple:
    return _RowsWriter(kernel, buffers, plan).generate()


class _RowsWriter:
    """One C++ row-reduction kernel being written: an OpenMP loop over the kept rows, and in it
    one loop over the reduced extent per phase (``plan_phases``), vectorized over ``LANES``
    partial accumulators where every reduction of the phase allows it, or split into an outer
    and a contiguous inner run (``row_split``)."""

    def __init__(self, kernel, buffers: dict, plan):
        self.kernel, self.buffers = kernel, buffers
        self.printer = printer = IndexPrinter("/")
        self.name = f"kiln_{kernel.name}"
        self.ranges = ranges = ir.ranges_of(kernel.ranges)
        self.xnumel, self.rnumel = math.prod(kernel.xshape), math.prod(kernel.rshape)
        self.in_names: dict[str, str] = {}
        self.out_names: dict[str, str] = {}
        rshape = kernel.rshape
        self.split = split = row_split(kernel, rshape, ranges) if config.cpp_row_split else None
        if split is None:
            self.flat = _flat_reduced_index(kernel, rshape)
        else:
            self.inner_dims, self.inner_shape = kernel.reduced_dims[split:], [int(s) for s in rshape[split:]]
            self.outer_dims, self.outer_shape = kernel.reduced_dims[:split], [int(s) for s in rshape[:split]]
            self.flat = self._merged_inner
        writer = RowScratchWriter(CppOps(), self.load, cpp_const, cpp_cast, cpp_declare,
                                  reduced_syms=[ir.index_symbol(d) for d in kernel.reduced_dims], plan=plan)
        for key, scr in writer.plan.items():
            writer.lines.append(f"{ctype(key[1])} {scr}[{math.prod(kernel.rshape)}];")
        writer.canon = ir.canonical_index_fn(ranges)
        writer.index_value_fn = lambda e: f"static_cast<{ctype(e.dtype)}>({printer.doprint(ir.simplify_index(e.index, ranges))})"
        writer.recompute_from(kernel)
        writer.bounds_check = cpp_bounds_check
        self.writer, self.lines = writer, writer.lines
        self.emit_value = writer.emit_node
        self.runs = []  # this pass's bf16 row stores, written to a float row and rounded after it (cpp_runs.py)
        self.row_runs = config.cpp_bf16_runs and isinstance(self.rnumel, int) and \
            0 < self.rnumel <= cpp_runs.ROW_MAX and split is None
        self.r_sym = ir.index_symbol(kernel.reduced_dims[0]) if len(kernel.reduced_dims) == 1 else R0
        self.arg_dim = f"i{kernel.reduced_dims[0]}" if len(kernel.reduced_dims) == 1 else "r0"
        self.counter = 0

    def _merged_inner(self, e):
        merged = _merge_inner(e, self.inner_dims, self.inner_shape, self.ranges)
        return e if merged is None else merged

    def _ptr(self, buf):
        return self.in_names.setdefault(buf, f"in_ptr{len(self.in_names)}")

    def _index_text(self, expr):
        return self.printer.doprint(self.flat(ir.simplify_index(expr, self.ranges)))

    def load(self, ld: ir.Load):
        return cpp_load(self._ptr(ld.buffer), self._index_text(ld.index), ld.dtype)

    def store(self, node, value, in_row_pass=False):
        kernel = self.kernel
        if node.name not in kernel.stores:
            return
        out = self.out_names.setdefault(node.name, f"out_ptr{len(self.out_names)}")
        index = self._index_text(kernel.store_index(node))
        stored = cpp_store_value(self.writer, value, node.dtype)
        fv = cpp_runs.float_value(stored) if node.dtype == torch.bfloat16 else None
        if in_row_pass and self.row_runs and fv is not None and cpp_runs.moves_by_one(
                self.flat(ir.simplify_index(kernel.store_index(node), self.ranges)), self.r_sym):
            arr = f"kiln_run{len(self.runs)}"
            self.runs.append((arr, out, index))
            self.lines.append(f"{arr}[r0] = {fv};")
            return
        self.lines.append(f"{out}[{index}] = {stored};")

    def generate(self) -> tuple:
        kernel, lines = self.kernel, self.lines
        lines += [f"const int64_t i{d} = {e};" for d, e in decompose_index("x0", kernel.xshape, kernel.kept_dims, "/")]
        if self.split is None:
            self.rdecomp = [f"const int64_t i{d} = {e};"
                            for d, e in decompose_index("r0", kernel.rshape, kernel.reduced_dims, "/")]
        else:
            self.rdecomp = [f"const int64_t i{d} = {e};"
                            for d, e in decompose_index("ri", self.inner_shape, self.inner_dims, "/")]
            self.odecomp = [f"const int64_t i{d} = {e};"
                            for d, e in decompose_index("ro", self.outer_shape, self.outer_dims, "/")]
        pre, phases = plan_phases(kernel)
        for node in pre:
            self.store(node, self.emit_value(node))
        self.prefetches = next_row_prefetches(kernel, self.buffers, phases, self.ranges, self.flat,
                                              self.printer) if self.split is None else []
        self.last_lanes = max((p for p, ph in enumerate(phases) if ph.reductions and
                               all(n.reduction_type in LANE_REDUCTIONS for n in ph.reductions)), default=0)
        for pnum, phase in enumerate(phases):
            # lanes: each reduction keeps LANES partial accumulators, one per position of a
            # fixed-length inner loop that gcc vectorizes (a scalar loop-carried max or product
            # stays serial); the rows' remainder runs on lane 0, and the lanes are combined after
            lanes = bool(phase.reductions) and all(n.reduction_type in LANE_REDUCTIONS for n in phase.reductions) \
                and not self._short_run()
            accs = self._accumulators(phase, lanes)
            body = self._phase_body(pnum, phase, accs, lanes)
            if self.split is not None:
                _emit_split_row(lines, body, phase, accs, lanes, self.odecomp, self.outer_dims,
                                math.prod(self.outer_shape), math.prod(self.inner_shape))
            else:
                self._row_loops(pnum, phase, accs, lanes, body)
            self._phase_results(phase, accs)
            for node in phase.after:
                self.store(node, self.emit_value(node))
        return self._kernel_object(), self.writer.seen

    def _short_run(self) -> bool:
        """Whether the vectorized run is known shorter than LANES: the lane arrays would be
        set up, flushed and combined per kept element around a loop that never fills them (a
        BERT backward's position-embedding gradient, summed over a batch of 2, spent 300 us on
        8192 such elements; one scalar accumulator does it in 10)."""
        # the whole row, split or not: a split row's short inner runs still flush into double
        # partials every CASCADE_BLOCKS lane blocks' worth of elements when the row is long
        run = sympy.sympify(self.rnumel)
        return bool(run.is_Integer) and int(run) < LANES

    def _accumulators(self, phase, lanes: bool) -> dict:
        """node name -> (accumulator, index of an arg reduction, dtype), declared before the loop."""
        accs, lines = {}, self.lines
        for node in phase.reductions:
            dt = compute_dtype(node.body.dtype)
            acc = f"acc{self.counter}"
            self.counter += 1
            ident = cpp_const(IDENTITY[node.reduction_type](dt), dt)
            idx = None
            if lanes:
                lines.append(f"{ctype(dt)} {acc}_v[{LANES}];")
                lines.append(f"for (int64_t rl = 0; rl < {LANES}; ++rl) {acc}_v[rl] = {ident};")
                if cascaded(node, dt, self.rnumel):
                    lines.append(f"double {acc}_d[{LANES}];")
                    lines.append(f"for (int64_t rl = 0; rl < {LANES}; ++rl) {acc}_d[rl] = 0.0;")
            else:  # a scalar loop (no lanes): a float sum accumulates in double outright, unless
                # the row is shorter than the lanes (summed in float in order, as on lane 0)
                wide = cascaded(node, dt, None) and not self._short_run()
                lines.append(f"{'double' if wide else ctype(dt)} {acc} = {ident};")
            if node.reduction_type in ("argmax", "argmin"):
                idx = f"{acc}_idx"
                lines.append(f"int64_t {idx} = 0;")
                lines.append(f"bool {acc}_seen = false;")
            accs[node.name] = (acc, idx, dt)
        return accs

    def _phase_body(self, pnum, phase, accs, lanes: bool) -> list[str]:
        """The lines of one element of the phase's loop over the reduced extent."""
        writer, lines, kernel = self.writer, self.lines, self.kernel
        writer.push_scope()
        writer.phase = pnum
        body_start = len(lines)
        lines += self.rdecomp
        for node in phase.reductions:
            acc, idx, dt = accs[node.name]
            value = writer.emit(kernel.body(node))
            kind = node.reduction_type
            a = f"{acc}_v[rl]" if lanes else acc
            if kind == "sum":
                lines.append(f"{a} += {value};")
            elif kind == "prod":
                lines.append(f"{a} *= {value};")
            elif kind in ("max", "min"):
                lines.append(f"{a} = kiln_{kind}<{ctype(dt)}>({a}, {value});")
            else:
                cmp = ">" if kind == "argmax" else "<"
                lines.append(f"if (!{acc}_seen || {value} {cmp} {acc} || ({value} != {value} && {acc} == {acc})) "
                             f"{{ {acc} = {value}; {idx} = {self.arg_dim}; {acc}_seen = true; }}")
        self.runs.clear()
        for node in phase.stores:
            self.store(node, self.emit_value(node), in_row_pass=not phase.reductions)
        body = lines[body_start:]
        del lines[body_start:]
        writer.pop_scope()
        writer.phase = None
        return body

    def _row_loops(self, pnum, phase, accs, lanes: bool, body: list[str]):
        """The phase's loop over an unsplit row: LANES-wide blocks and a remainder, or one loop."""
        kernel, lines, runs = self.kernel, self.lines, self.runs
        rtext = size_text(self.rnumel, self.printer)
        hoisted, body = hoist_row_invariants(body)
        lines += hoisted
        if lanes:
            rmain = f"rmain{pnum}"
            flush = flush_cascade(accs, phase, LANES, self.rnumel)
            chunk = LANES * CASCADE_BLOCKS
            lines.append(f"const int64_t {rmain} = ({rtext} / {LANES}) * {LANES};")
            if flush:  # blocks of CASCADE_BLOCKS lane blocks, flushed into double after each
                lines.append(f"for (int64_t rc = 0; rc < {rmain}; rc += {chunk}) {{")
                lines.append(f"const int64_t rc_end = rc + {chunk} < {rmain} ? rc + {chunk} : {rmain};")
                lines.append(f"for (int64_t rb = rc; rb < rc_end; rb += {LANES}) {{")
            else:
                lines.append(f"for (int64_t rb = 0; rb < {rmain}; rb += {LANES}) {{")
            if self.prefetches and pnum == self.last_lanes and pnum > 0:
                i_kept = f"i{kernel.kept_dims[0]}"
                lines.append(f"    if ({i_kept} + 1 < {int(kernel.ranges[kernel.kept_dims[0]])}) {{ "
                             + " ".join(t.replace("{ptr}", self._ptr(b)) for b, t in self.prefetches) + " }")
            lines.append("    #pragma omp simd")
            lines.append(f"    for (int64_t rl = 0; rl < {LANES}; ++rl) {{")
            lines.append("        const int64_t r0 = rb + rl;")
            lines += ["        " + ln for ln in body] + ["    }", "}"]
            if flush:
                lines += flush + ["}"]
            lines.append(f"for (int64_t r0 = {rmain}; r0 < {rtext}; ++r0) {{")
            lines.append("    const int64_t rl = 0;")
            lines += ["    " + ln for ln in body] + ["}"]
            lines += flush
            _combine_lanes(lines, phase, accs, self.rnumel)
            return
        lines += [f"float {arr}[{rtext}];" for arr, _, _ in runs]
        if not phase.reductions:
            lines.append("#pragma omp simd")
        lines.append(f"for (int64_t r0 = 0; r0 < {rtext}; ++r0) {{")
        lines += ["    " + ln for ln in body] + ["}"]
        if runs:  # each run's row starts where its index has r0 = 0
            lines += ["{", "    const int64_t r0 = 0;"] + ["    " + ln for ln in self.rdecomp]
            lines += [f"    kiln_store_bf16_run(&{ptr_}[{idx}], {arr}, {rtext});" for arr, ptr_, idx in runs]
            lines += ["}"]

    def _phase_results(self, phase, accs):
        writer = self.writer
        for node in phase.reductions:
            acc, idx, dt = accs[node.name]
            value = idx if idx is not None else acc
            if node.dtype == torch.bool:
                value = f"({value} != 0)"
            reg = writer._tmp(value, node.dtype if idx is None else torch.int64)
            writer.in_registers[(node.name, writer.canon(self.kernel.store_index(node)))] = reg
            self.store(node, reg)

    def _kernel_object(self) -> CppKernel:
        kernel, lines, buffers, name = self.kernel, self.lines, self.buffers, self.name
        xnumel, rnumel, printer = self.xnumel, self.rnumel, self.printer
        params = [f"const {C_MEM_TYPES[buffers[b].dtype]}* __restrict__ {p}" for b, p in self.in_names.items()]
        params += [f"{C_MEM_TYPES[buffers[b].dtype]}* __restrict__ {p}" for b, p in self.out_names.items()]
        symbolic = is_symbolic(xnumel) or is_symbolic(rnumel)
        xtext, rtext = size_text(xnumel, printer), size_text(rnumel, printer)
        if symbolic:  # threads only where they pay, decided at run time
            clause = f" if({xtext} * {rtext} >= 65536 && {xtext} > 1)"
        else:  # threads pay for a row's work, which grows with the loads each element makes
            loads = sum(ln.count("in_ptr") for ln in lines)
            work = xnumel * max(rnumel, 1) * max(1, loads // 4)
            clause = "" if work >= 1 << 16 and xnumel > 1 else " if(0)"
        sizes = size_params(lines + [xtext, rtext])
        params += [f"const int64_t {p}" for p in sizes]
        code = [f'extern "C" void {name}({", ".join(params)}) {{',
                f"    #pragma omp parallel for{clause}",
                f"    for (int64_t x0 = 0; x0 < {xtext}; ++x0) {{"]
        code += ["        " + ln for ln in lines] + ["    }", "}"]
        code_text = "\n".join(code)
        header = "\n".join(f"// from: {o}" for o in kernel.origins)
        code_text = with_index_flag(code_text)
        source = header + PRELUDE + _helpers_for(code_text) + "\n" + index_check_support(name, code_text) + "\n" + code_text + "\n"
        return CppKernel(name, source, list(self.in_names) + list(self.out_names), xnumel * rnumel,
                         list(kernel.origins), sizes)


SPLIT_LOOP_NAMES = frozenset({"r0", "rl", "rb", "ri", "ro"})


def _emit_split_row(lines, body, phase, accs, lanes, odecomp, outer_dims, outer, inner):
    """One pass over a split row (``row_split``): ``for ro < outer`` (the leading reduced dims'
    indices, and what depends on them only, once per ``ro``), then the inner contiguous run
    as the usual lane loop (or a plain loop) over ``ri``; ``r0 = ro * inner + ri`` stays the
    flat reduced index (scratch rows, argmax)."""
    per_ro, body = hoist_row_invariants(body, loop_names=SPLIT_LOOP_NAMES)
    outer_names = SPLIT_LOOP_NAMES | {f"i{d}" for d in outer_dims}
    before, per_ro = hoist_row_invariants(per_ro, loop_names=outer_names)
    lines += before
    lines.append(f"for (int64_t ro = 0; ro < {outer}; ++ro) {{")
    lines += ["    " + ln for ln in odecomp + per_ro]
    if lanes:
        rmain = inner // LANES * LANES
        if rmain:
            lines.append(f"    for (int64_t rb = 0; rb < {rmain}; rb += {LANES}) {{")
            lines.append("        #pragma omp simd")
            lines.append(f"        for (int64_t rl = 0; rl < {LANES}; ++rl) {{")
            lines.append("            const int64_t ri = rb + rl;")
            lines.append(f"            const int64_t r0 = ro * {inner} + ri;")
            lines += ["            " + ln for ln in body] + ["        }", "    }"]
        if rmain < inner:
            lines.append(f"    for (int64_t ri = {rmain}; ri < {inner}; ++ri) {{")
            lines.append("        const int64_t rl = 0;")
            lines.append(f"        const int64_t r0 = ro * {inner} + ri;")
            lines += ["        " + ln for ln in body] + ["    }"]
        # whole runs of the row (image planes of batch norm's statistics) per float chain, as
        # many as make about one unsplit chunk (LANES * CASCADE_BLOCKS elements)
        flush = flush_cascade(accs, phase, LANES if rmain else 1, outer * inner)
        every = max(1, LANES * CASCADE_BLOCKS // inner)
        if flush and every < outer:
            lines.append(f"    if ((ro + 1) % {every} == 0 || ro + 1 == {outer}) {{")
            lines += ["        " + ln for ln in flush] + ["    }"]
    else:
        if not phase.reductions:
            lines.append("    #pragma omp simd")
        lines.append(f"    for (int64_t ri = 0; ri < {inner}; ++ri) {{")
        lines.append(f"        const int64_t r0 = ro * {inner} + ri;")
        lines += ["        " + ln for ln in body] + ["    }"]
    lines.append("}")
    if lanes:
        if flush and every >= outer:  # the whole row fit one chain
            lines += flush
        _combine_lanes(lines, phase, accs, outer * inner)


def _combine_lanes(lines, phase, accs, rnumel):
    """Each reduction's partial accumulators (one per lane) combined into one after its loop."""
    for node in phase.reductions:
        acc, _, dt = accs[node.name]
        cascade = cascaded(node, dt, rnumel)
        part = f"{acc}_d" if cascade else f"{acc}_v"  # flushed already
        # an fp32 sum's lanes combine in double even where they were never flushed: partials
        # that cancel (a batch norm backward's sum of g * (x - mean)) lose the result in a
        # float combine (mobilenet_v1's stem gradient went 360x further from float64 than eager's)
        wide = cascade or cascaded(node, dt, None)
        lines.append(f"{'double' if wide else ctype(dt)} {acc} = {part}[0];")
        lines.append(f"for (int64_t rl = 1; rl < {LANES}; ++rl) {_combine(node.reduction_type, acc, f'{part}[rl]', dt)};")
