"""Triton code generation for reduction kernels.

Each program takes ``XBLOCK`` rows (the kept dims, flattened) as a ``[XBLOCK, 1]`` column and
walks the reduced dims (flattened) as a ``[1, RBLOCK]`` row.

* **Persistent** (the whole reduced extent fits one block): every value of the row stays in
  registers, so a chain like softmax (max, then sum of exp(x - max), then the division) is
  straight-line code with one load of ``x``.
* **Looped** (long rows): one loop over the reduced extent per *pass* (see
  ``common.plan_phases``); per-element values needed by a later pass are recomputed there,
  accumulators live in ``[XBLOCK, RBLOCK]`` registers and are combined at the end of the pass.
  A max pass followed by a ``sum(exp(E - X(max)))`` pass runs as one (online softmax,
  ``plan_online``).

On CUDA, kernels of at least ``REDUCTION_TUNE_MIN`` elements are autotuned
(``kiln/runtime/autotune.py``) over the persistent and looped forms and their block sizes.
"""
from __future__ import annotations

import math

import sympy

import torch

from kiln.config import config
from kiln.inductor import ir
from kiln.inductor.codegen import tuning
from kiln.inductor.codegen.common import (IDENTITY, LOW_PRECISION, IndexPrinter, KernelWriter,
                                          compute_dtype, decompose_index, is_symbolic, plan_phases,
                                          size_params)
from kiln.meta.symbolic import py
from kiln.inductor.codegen.triton import (TL_DTYPES, TRITON_GUARD_OPS, TritonKernel, TritonOps, interpreter_bf16,
                                          interpreting, triton_bounds_check, triton_cast, triton_const,
                                          triton_index_value)

COMBINE_FNS = {
    "max": ("_kiln_max", "tl.where((a > b) | (a != a), a, b)"),
    "min": ("_kiln_min", "tl.where((a < b) | (a != a), a, b)"),
    "prod": ("_kiln_prod", "a * b"),
}
# the same max and min as one NaN-propagating instruction (config.triton_nan_max_op)
NAN_OP_COMBINES = {
    "max": "tl.maximum(a, b, propagate_nan=tl.PropagateNan.ALL)",
    "min": "tl.minimum(a, b, propagate_nan=tl.PropagateNan.ALL)",
}


def combine_body(kind: str) -> str:
    if config.triton_nan_max_op and kind in NAN_OP_COMBINES:
        return NAN_OP_COMBINES[kind]
    return COMBINE_FNS[kind][1]


def _pow2(n: int) -> int:
    return 1 << max(0, (max(n, 1) - 1).bit_length())


def block_config(xnumel: int, rnumel: int):
    """(persistent?, XBLOCK, RBLOCK, num_warps). A symbolic reduced extent is looped (one
    kernel for every length); a symbolic row count takes the largest XBLOCK the rows allow."""
    if is_symbolic(rnumel):
        return False, 1, config.triton_looped_rblock, 8
    if is_symbolic(xnumel):
        xnumel = 64
    rblock = _pow2(rnumel)
    if rblock <= config.triton_max_persistent_rblock:
        xblock = max(1, min(_pow2(xnumel), max(1, 4096 // rblock), 64))
        warps = 8 if rblock >= 2048 else 4 if rblock * xblock >= 512 else 2
        return True, xblock, rblock, warps
    return False, 1, min(config.triton_looped_rblock, rblock), 8


def column_block_config(xnumel, rnumel):
    """Blocks for a column reduction (the kept dims are the contiguous ones, the reduced dims
    are strided: bias and norm-weight gradients, sums over the batch). Rows of one program are
    neighbours in memory, so a [XBLOCK, RBLOCK] tile loads XBLOCK contiguous elements per
    reduced step; one element per program (XBLOCK=1) would read one 32-byte sector per element."""
    xblock = max(1, min(_pow2(xnumel), 64))
    rblock = max(1, min(_pow2(rnumel), 4096 // xblock, 32))
    return rblock >= rnumel, xblock, rblock, 4


def is_column_reduction(kernel, ranges) -> bool:
    """Every load that walks the reduced dims steps by more than one element along them, and
    some load steps by exactly one along the innermost kept dim."""
    if is_symbolic(math.prod(kernel.xshape) * math.prod(kernel.rshape)) or not kernel.kept_dims \
            or not kernel.reduced_dims or math.prod(kernel.xshape) < 16:
        return False
    inner = ir.index_symbol(kernel.kept_dims[-1])
    red = {ir.index_symbol(d) for d in kernel.reduced_dims}
    inside = {n.name for n in kernel.nodes}
    column = False
    for node in kernel.nodes:
        for ld in ir.loads_of(kernel.body(node)):
            if ld.buffer in inside:
                continue
            index = sympy.expand(ir.simplify_index(ld.index, ranges))
            walks = index.free_symbols & red
            if not walks:
                continue
            if any(index.coeff(r, 1) == 1 for r in walks):
                return False
            if inner in index.free_symbols and index.coeff(inner, 1) == 1:
                column = True
    return column


def _is_literal(text: str) -> bool:
    if text in ("True", "False") or text.startswith("float("):
        return True
    try:
        float(text)
        return True
    except ValueError:
        return False


REDUCTION_TUNE_MIN = 1 << 16  # elements; smaller kernels keep the heuristic


def generate_triton_reduction(kernel, buffers: dict) -> TritonKernel:
    gen = _generate_triton_reduction(kernel, buffers)
    xnumel, rnumel = math.prod(kernel.xshape), math.prod(kernel.rshape)
    if is_symbolic(xnumel * rnumel) or xnumel * rnumel < REDUCTION_TUNE_MIN or not tuning.enabled():
        return gen
    persistent = gen.constexprs["RBLOCK"] >= rnumel
    if config.triton_column_reductions and is_column_reduction(kernel, ir.ranges_of(kernel.ranges)):
        return gen.with_tuning([(gen.source, column_configs(persistent, xnumel, rnumel))])
    variants = [(gen.source, reduction_configs(persistent, xnumel, rnumel))]
    if persistent and rnumel >= 1024:  # the looped form too: long rows may run better looped
        looped = _generate_triton_reduction(kernel, buffers, force_looped=True)
        variants.append((looped.source, reduction_configs(False, xnumel, rnumel)))
    return gen.with_tuning(variants)


# Column reductions tune over wide tiles of kept elements: a row reduction's configs (one or two
# rows per program) would read one 32-byte sector per element of a column.
COLUMN_TILES = ((64, 32, 4), (128, 16, 4), (128, 32, 8), (32, 64, 4), (64, 64, 8), (256, 8, 4))


def column_configs(persistent: bool, xnumel: int, rnumel: int) -> list[dict]:
    """Configs for a column reduction: [XBLOCK kept, RBLOCK reduced] tiles; a persistent
    kernel keeps RBLOCK at the whole reduced extent and tunes XBLOCK only."""
    xcap = max(_pow2(xnumel), 16)
    if persistent:
        rblock = _pow2(rnumel)
        out = [{"XBLOCK": xb, "RBLOCK": rblock, "num_warps": 8 if xb * rblock >= 4096 else 4}
               for xb in (16, 32, 64, 128, 256) if xb <= xcap and xb * rblock <= 8192]
        return out or [{"XBLOCK": 16, "RBLOCK": rblock, "num_warps": 4}]
    return [{"XBLOCK": xb, "RBLOCK": rb, "num_warps": w} for xb, rb, w in COLUMN_TILES
            if xb <= xcap and rb <= max(_pow2(rnumel), 8)]


def reduction_configs(persistent: bool, xnumel: int, rnumel: int) -> list[dict]:
    rblock = _pow2(rnumel)
    out = []
    if persistent:
        for xb in (1, 2, 4, 8, 16, 32, 64):
            tile = xb * rblock
            if xb > _pow2(xnumel) or tile > 8192 or (tile < 2048 and xb * 2 <= _pow2(xnumel) and xb < 64):
                continue
            for w in (2, 4, 8, 16):
                if (w >= 4 or tile <= 512) and (w < 16 or tile >= 4096) and 32 * w <= tile:
                    out.append({"XBLOCK": xb, "RBLOCK": rblock, "num_warps": w})
        return out
    for xb, rb, w in ((1, 1024, 8), (1, 2048, 8), (1, 2048, 16), (1, 4096, 16), (2, 1024, 8)):
        if rb <= rblock and xb <= _pow2(xnumel):
            out.append({"XBLOCK": xb, "RBLOCK": rb, "num_warps": w})
    return out


def _generate_triton_reduction(kernel, buffers: dict, force_looped: bool = False) -> TritonKernel:
    return _ReductionWriter(kernel, force_looped).generate()


class _ReductionWriter:
    """One Triton reduction kernel being written: its block configuration, the pointers and
    combine functions it uses so far, and the helpers that emit loads, stores, accumulators
    and (online softmax) running maxima into one ``KernelWriter``. A persistent kernel reduces
    each row in one block; a looped one runs each phase (``plan_phases``) over RBLOCK-wide
    steps of the reduced extent."""

    def __init__(self, kernel, force_looped: bool):
        self.kernel = kernel
        self.printer = IndexPrinter("//")
        self.name = f"kiln_{kernel.name}"
        self.ranges = ranges = ir.ranges_of(kernel.ranges)
        self.xnumel, self.rnumel = xnumel, rnumel = math.prod(kernel.xshape), math.prod(kernel.rshape)
        # the reduced extent as kernel text: the argument itself when it is symbolic
        self.rnumel_text = "rnumel" if is_symbolic(rnumel) else rnumel
        persistent, xblock, rblock, warps = block_config(xnumel, rnumel)
        if config.triton_column_reductions and is_column_reduction(kernel, ranges):
            persistent, xblock, rblock, warps = column_block_config(xnumel, rnumel)
        if force_looped and persistent:
            persistent, xblock, rblock, warps = False, 1, min(config.triton_looped_rblock, rblock), 8
        self.persistent, self.xblock, self.rblock, self.warps = persistent, xblock, rblock, warps
        self.red_syms = {ir.index_symbol(d) for d in kernel.reduced_dims}
        self.in_names: dict[str, str] = {}
        self.out_names: dict[str, str] = {}
        self.combine_used: set[str] = set()
        # the mask of an element of the [XBLOCK, RBLOCK] block: "xmask & rmask", or just "xmask"
        # in a block with no ragged reduced edge (a static extent's full blocks: masking them
        # costs bandwidth, docs/notes/measurements.md)
        self.mask = {"r": "xmask & rmask"}
        self.row_lanes: dict[str, str] = {}  # online softmax by rows: each max node's per-lane NaN-propagating max
        self.arg_dim = f"i{kernel.reduced_dims[0]}" if len(kernel.reduced_dims) == 1 else "rindex"
        writer = KernelWriter(TritonOps(), self.load, triton_const, triton_cast,
                              lambda n, text, dtype: f"{n} = {text}")
        writer.canon = ir.canonical_index_fn(ranges)
        writer.index_value_fn = lambda e: triton_index_value(e, self.printer, ranges)
        writer.recompute_from(kernel)
        writer.bounds_check = triton_bounds_check
        writer.guard_ops = TRITON_GUARD_OPS if config.triton_guarded_loads else None
        self.writer, self.lines = writer, writer.lines
        self.emit_value = writer.emit_node

    def generate(self) -> TritonKernel:
        if self.persistent:
            self._persistent()
        else:
            self._looped()
        return self._kernel_object()

    # ---------------------------------------------------------------- loads and stores
    def _ptr(self, buf):
        return self.in_names.setdefault(buf, f"in_ptr{len(self.in_names)}")

    def _mask_for(self, index) -> str:
        syms = ir.loop_symbols(index)
        if not syms:
            return ""
        base = self.mask["r"] if syms & self.red_syms else "xmask"
        guard = self.writer.guard
        return f", {base}, other=0" if guard is None else f", {base} & {guard}, other=0"

    def load(self, ld: ir.Load):
        index = ir.simplify_index(ld.index, self.ranges)
        text = f"tl.load({self._ptr(ld.buffer)} + ({self.printer.doprint(index)}){self._mask_for(index)})"
        if ld.dtype in LOW_PRECISION:
            text += ".to(tl.float32)"
        return text

    def store(self, node, value, level):
        if node.name not in self.kernel.stores:
            return
        writer = self.writer
        out = self.out_names.setdefault(node.name, f"out_ptr{len(self.out_names)}")
        index = ir.simplify_index(self.kernel.store_index(node), self.ranges)
        shape = "[XBLOCK, RBLOCK]" if level == "r" else "[XBLOCK, 1]"
        where = self.mask["r"] if level == "r" else "xmask"
        if _is_literal(value):  # a constant node (all() or a sum over nothing): a block of it
            value = writer._tmp(f"tl.full({shape}, {value}, {TL_DTYPES[node.dtype]})", node.dtype)
        elif node.dtype == torch.bfloat16 and interpreting():
            value = writer._tmp(interpreter_bf16(value), node.dtype)
        value = writer._tmp(f"tl.broadcast_to({value}, {shape})", node.dtype)
        offset = self.printer.doprint(index)
        if not ir.loop_symbols(index):  # a scalar address still needs a block of pointers
            offset += f" + tl.zeros({shape}, tl.int32)"
        self.lines.append(f"tl.store({out} + ({offset}), {value}, {where})")

    # ---------------------------------------------------------------- reductions
    @staticmethod
    def acc_dtype(node):
        src = node.body.dtype if isinstance(node.body, ir.Expr) else node.dtype
        dt = compute_dtype(src)
        return torch.int8 if dt == torch.bool else dt

    def masked_block(self, node):
        """The node's per-element value as a full block with masked lanes at the identity."""
        writer = self.writer
        value = writer.emit(self.kernel.body(node))
        dt = self.acc_dtype(node)
        value = writer._tmp(f"tl.broadcast_to({value}, [XBLOCK, RBLOCK]).to({TL_DTYPES[dt]})", dt)
        ident = triton_const(IDENTITY[node.reduction_type](dt), dt)
        return writer._tmp(f"tl.where({self.mask['r']}, {value}, {ident})", dt), dt

    def finish(self, node, value):
        """Cast a reduced value to the node's dtype and register it."""
        writer = self.writer
        if node.dtype == torch.bool:
            value = writer._tmp(f"({value} != 0)", node.dtype)
        writer.in_registers[(node.name, writer.canon(self.kernel.store_index(node)))] = value
        self.store(node, value, "x")

    def reduce_text(self, kind, block):
        if kind == "sum":
            return f"tl.sum({block}, 1)[:, None]"
        fn, _ = COMBINE_FNS[kind]
        self.combine_used.add(kind)
        return f"tl.reduce({block}, 1, {fn})[:, None]"

    def arg_pick(self, kind, vals, idxs):
        self.combine_used.add("max" if kind == "argmax" else "min")
        best = self.writer._tmp(self.reduce_text("max" if kind == "argmax" else "min", vals), torch.float32)
        hit = f"(({vals} == {best}) | (({best} != {best}) & ({vals} != {vals})))"
        return self.writer._tmp(f"tl.min(tl.where({hit}, {idxs}, {self.rnumel_text}), 1)[:, None]", torch.int64)

    # ---------------------------------------------------------------- online softmax
    def shift_of(self, m_node, x, register):
        """X (the per-row shift expression of the max m_node) with the max read from register."""
        writer = self.writer
        key = (m_node.name, writer.canon(self.kernel.store_index(m_node)))
        saved = writer.in_registers.get(key)
        writer.in_registers[key] = register
        try:
            return writer.emit(x)
        finally:
            if saved is None:
                writer.in_registers.pop(key, None)
            else:
                writer.in_registers[key] = saved

    def online_step(self, m_node, m_acc, block, sums, accs):
        """One block of the running max and of each sum(exp(E - X)) relative to X(max)."""
        writer, lines = self.writer, self.lines
        e = writer.emit(self.kernel.body(m_node))
        if config.triton_online_rowmax:
            # the shift is the row's running max ([XBLOCK, 1]) by tl.max, which skips NaN (so the
            # shift never is NaN); each lane keeps a NaN-propagating max for the stored result
            lane = self.row_lanes[m_node.name]
            lines.append(f"{lane} = {_combine_inline('max', lane, block)}")
            block = writer._tmp(f"tl.max({block}, 1)[:, None]", torch.float32)
            m_new = writer._tmp(f"tl.maximum({m_acc}, {block})", torch.float32)
        else:
            m_new = writer._tmp(_combine_inline("max", m_acc, block), torch.float32)
        for node, x in sums:
            s_acc = accs[node.name][0]
            g_old, g_new = self.shift_of(m_node, x, m_acc), self.shift_of(m_node, x, m_new)
            term = writer._tmp(f"tl.where({self.mask['r']} & ({g_new} != float('-inf')), tl.exp({e} - {g_new}), 0.0)",
                               torch.float32)
            alpha = writer._tmp(f"tl.where({g_old} == {g_new}, 1.0, tl.exp({g_old} - {g_new}))", torch.float32)
            lines.append(f"{s_acc} = {s_acc} * {alpha} + {term}")
        lines.append(f"{m_acc} = {m_new}")

    def online_finish(self, m_node, m_acc, m_value, sums, accs):
        """Combine the lanes: each lane's sum rescaled from its own max to the row's."""
        writer = self.writer
        lane_shifts = [self.shift_of(m_node, x, m_acc) for _, x in sums]
        self.finish(m_node, m_value)
        for (node, x), g_lane in zip(sums, lane_shifts):
            g_row = writer.emit(x)
            s_acc = accs[node.name][0]
            if config.triton_online_rowmax:  # every lane's sum is relative to the row's max already
                self.finish(node, writer._tmp(self.reduce_text("sum", s_acc), torch.float32))
                continue
            scaled = writer._tmp(f"tl.where({g_lane} == {g_row}, {s_acc}, {s_acc} * tl.exp({g_lane} - {g_row}))",
                                 torch.float32)
            self.finish(node, writer._tmp(self.reduce_text("sum", scaled), torch.float32))

    # ---------------------------------------------------------------- the kernel body
    def _head(self) -> list[str]:
        head = [
            "xoffset = tl.program_id(0) * XBLOCK",
            "xindex = xoffset + tl.arange(0, XBLOCK)[:, None]",
        ]
        xnumel = self.xnumel
        if is_symbolic(xnumel):
            head.append("xmask = xindex < xnumel")
        else:  # a config whose XBLOCK divides the rows has no ragged row edge (a static if in Triton)
            head += [f"if {xnumel} % XBLOCK == 0:",
                     "    xmask = tl.full([XBLOCK, 1], 1, tl.int1)",
                     "else:",
                     "    xmask = xindex < xnumel"]
        kernel = self.kernel
        return head + [f"i{d} = {e}" for d, e in decompose_index("xindex", kernel.xshape, kernel.kept_dims, "//")]

    def _rsetup(self) -> list[str]:
        kernel = self.kernel
        return ["rmask = rindex < rnumel"] + [
            f"i{d} = {e}" for d, e in decompose_index("rindex", kernel.rshape, kernel.reduced_dims, "//")]

    def _persistent(self):
        lines, writer = self.lines, self.writer
        lines += self._head() + ["rindex = tl.arange(0, RBLOCK)[None, :]"] + self._rsetup()
        if not is_symbolic(self.rnumel) and self.rblock == self.rnumel:
            self.mask["r"] = "xmask"  # the block is the row
        for node in self.kernel.nodes:
            level = self.kernel.levels[node.name]
            if level == "red":
                kind = node.reduction_type
                block, dt = self.masked_block(node)
                if kind in ("argmax", "argmin"):
                    value = self.arg_pick(kind, block, self.arg_dim)
                else:
                    value = writer._tmp(self.reduce_text(kind, block), dt)
                self.finish(node, value)
            else:
                self.store(node, self.emit_value(node), level)

    def _looped(self):
        self.lines += self._head()
        pre, phases = plan_phases(self.kernel)
        online = plan_online(self.kernel, phases)
        for node in pre:
            self.store(node, self.emit_value(node), "x")
        rnumel = self.rnumel
        for pi, phase in enumerate(phases):
            pairs = online.get(pi, {})
            accs = self._accumulators(phase, pairs)
            if is_symbolic(rnumel):
                self.lines.append("for roffset in range(0, rnumel, RBLOCK):")
                self._loop_body(phase, accs, pairs, masked=True)
            else:  # full blocks unmasked, then the ragged tail (static ifs in Triton)
                full = f"{rnumel} // RBLOCK * RBLOCK"
                self.lines.append(f"for roffset in range(0, {full}, RBLOCK):")
                self._loop_body(phase, accs, pairs, masked=False)
                self.lines.append(f"if {rnumel} % RBLOCK != 0:")
                self._loop_body(phase, accs, pairs, masked=True, first=f"roffset = {full}")
            self._phase_results(phase, accs, pairs)
            for node in phase.after:
                self.store(node, self.emit_value(node), "x")

    def _fresh(self, text, dt):
        """A new accumulator: never shared with an equal-looking one."""
        name = self.writer._tmp(text, dt)
        self.writer.cache.pop(text, None)
        return name

    def _accumulators(self, phase, pairs) -> dict:
        """node name -> (accumulator, index accumulator of an arg reduction, dtype), declared
        before the phase's loop."""
        accs = {}
        for m_name, sums in pairs.items():
            for node, _ in sums:
                accs[node.name] = (self._fresh("tl.full([XBLOCK, RBLOCK], 0.0, tl.float32)", torch.float32), None,
                                   torch.float32)
        for node in phase.reductions:
            dt = self.acc_dtype(node)
            ident = triton_const(IDENTITY[node.reduction_type](dt), dt)
            by_rows = node.name in pairs and config.triton_online_rowmax
            if by_rows:
                self.row_lanes[node.name] = self._fresh(f"tl.full([XBLOCK, RBLOCK], {ident}, {TL_DTYPES[dt]})", dt)
            acc = self._fresh(f"tl.full([XBLOCK, {'1' if by_rows else 'RBLOCK'}], {ident}, {TL_DTYPES[dt]})", dt)
            idx = None
            if node.reduction_type in ("argmax", "argmin"):
                idx = self._fresh(f"tl.zeros([XBLOCK, RBLOCK], tl.int64) + {self.rnumel_text}", torch.int64)
            accs[node.name] = (acc, idx, dt)
        return accs

    def _loop_body(self, phase, accs, pairs, masked: bool, first: str | None = None):
        """One block of a looped phase, indented under the line before it; ``masked=False``
        for blocks inside the reduced extent."""
        writer, lines = self.writer, self.lines
        writer.push_scope()
        start = len(lines)
        if first:
            lines.append(first)
        lines.extend(["rindex = roffset + tl.arange(0, RBLOCK)[None, :]"] + self._rsetup())
        self.mask["r"] = "xmask & rmask" if masked else "xmask"
        for node in phase.reductions:
            acc, idx, dt = accs[node.name]
            block, _ = self.masked_block(node)
            kind = node.reduction_type
            if kind == "sum":
                lines.append(f"{acc} = {acc} + {block}")
            elif kind in ("argmax", "argmin"):
                cmp = ">" if kind == "argmax" else "<"
                better = f"(({block} {cmp} {acc}) | (({block} != {block}) & ({acc} == {acc})))"
                upd = writer._tmp(f"({self.mask['r']}) & {better}", torch.bool)
                lines.append(f"{idx} = tl.where({upd}, {self.arg_dim} + tl.zeros([XBLOCK, RBLOCK], tl.int64), {idx})")
                lines.append(f"{acc} = tl.where({upd}, {block}, {acc})")
            elif node.name in pairs:
                self.online_step(node, acc, block, pairs[node.name], accs)
            else:
                lines.append(f"{acc} = {_combine_inline(kind, acc, block)}")
        for node in phase.stores:
            self.store(node, self.emit_value(node), "r")
        self.mask["r"] = "xmask & rmask"
        for k in range(start, len(lines)):
            lines[k] = "    " + lines[k]
        writer.pop_scope()

    def _phase_results(self, phase, accs, pairs):
        """After a phase's loop: each reduction's accumulator reduced across the lanes."""
        writer = self.writer
        for node in phase.reductions:
            acc, idx, dt = accs[node.name]
            kind = node.reduction_type
            if kind in ("argmax", "argmin"):
                value = self.arg_pick(kind, acc, idx)
            elif node.name in pairs and config.triton_online_rowmax:  # NaN if any element is
                value = writer._tmp(self.reduce_text(kind, self.row_lanes[node.name]), dt)
            else:
                value = writer._tmp(self.reduce_text(kind, acc), dt)
            if node.name in pairs:
                self.online_finish(node, acc, value, pairs[node.name], accs)
            else:
                self.finish(node, value)

    # ---------------------------------------------------------------- the source
    def _kernel_object(self) -> TritonKernel:
        kernel, lines, name = self.kernel, self.lines, self.name
        xnumel, rnumel, xblock, rblock = self.xnumel, self.rnumel, self.xblock, self.rblock
        sizes = size_params(lines)
        params = list(self.in_names.values()) + list(self.out_names.values()) + sizes
        sig = ", ".join(params + ["xnumel", "rnumel", "XBLOCK: tl.constexpr", "RBLOCK: tl.constexpr"])
        src = ["import triton", "import triton.language as tl"]
        if any("libdevice." in ln for ln in lines):
            src.append("from triton.language.extra import libdevice")
        if kernel.origins:
            src.append("")
            src += [f"# from: {o}" for o in kernel.origins]
        for kind in sorted(self.combine_used):
            fn, _ = COMBINE_FNS[kind]
            src += ["", "", "@triton.jit", f"def {fn}(a, b):", f"    return {combine_body(kind)}"]
        jit = "@triton.jit(debug=True)" if any("tl.device_assert" in ln for ln in lines) else "@triton.jit"
        src += ["", "", jit, f"def {name}({sig}):"] + ["    " + ln for ln in lines]
        source = "\n".join(src) + "\n"
        args = list(self.in_names) + list(self.out_names)
        if is_symbolic(xnumel) or is_symbolic(rnumel):
            # launched with the sizes of the call: scalars and grid are wrapper expressions
            return TritonKernel(name, source, args, sizes + [py(xnumel), py(rnumel)],
                                {"XBLOCK": xblock, "RBLOCK": rblock}, f"-(-({py(xnumel)}) // {xblock})",
                                self.warps, list(kernel.origins))
        # static ranges, but symbolic sizes used as values (``y * n``) still come in as arguments
        return TritonKernel(name, source, args, sizes + [xnumel, rnumel],
                            {"XBLOCK": xblock, "RBLOCK": rblock}, -(-xnumel // xblock), self.warps,
                            list(kernel.origins))


def _combine_inline(kind, acc, value):
    if config.triton_nan_max_op and kind in NAN_OP_COMBINES:
        return NAN_OP_COMBINES[kind].replace("a, b", f"{acc}, {value}")
    if kind == "max":
        return f"tl.where(({acc} > {value}) | ({acc} != {acc}), {acc}, {value})"
    if kind == "min":
        return f"tl.where(({acc} < {value}) | ({acc} != {acc}), {acc}, {value})"
    if kind == "prod":
        return f"{acc} * {value}"
    raise NotImplementedError(f"[codegen:triton] no combine rule for reduction {kind!r}")


def _match_exp_sub(body):
    """(E, X) when body is exp(E - X), else None."""
    if isinstance(body, ir.Call) and body.op == "exp" and isinstance(body.args[0], ir.Call) \
            and body.args[0].op == "sub":
        return body.args[0].args
    return None


def plan_online(kernel, phases) -> dict:
    """Online softmax: {phase k: {max node name: [(sum node, X), ...]}}, with the sums moved
    out of phase k + 1 (which disappears when nothing else is left in it).

    A looped pass computing ``M = max(E)`` followed by a pass computing ``S = sum(exp(E - X))``,
    where ``X`` is a per-row expression of ``M`` (softmax: ``M``; logsumexp: ``M`` with
    infinities replaced by 0), become one pass: each lane keeps a running max ``m`` and a sum
    relative to ``X(m)``, rescaled by ``exp(X(m_old) - X(m_new))`` when the max grows; the
    lanes are combined the same way after the loop. Softmax, log-softmax, logsumexp and
    cross-entropy read their input once fewer.
    """
    if not config.triton_online_softmax:
        return {}
    red_syms = {ir.index_symbol(d) for d in kernel.reduced_dims}
    inside = {n.name for n in kernel.nodes}
    plan: dict = {}
    k = 0
    while k < len(phases) - 1:
        maxes = {n.name: n for n in phases[k].reductions
                 if n.reduction_type == "max" and compute_dtype(n.body.dtype).is_floating_point}
        nxt = phases[k + 1]
        for node in list(nxt.reductions) if maxes else []:
            if node.reduction_type != "sum" or not compute_dtype(node.dtype).is_floating_point:
                continue
            match = _match_exp_sub(kernel.body(node))
            if match is None:
                continue
            e, x = match
            loads = ir.loads_of(x)
            mine = {ld.buffer for ld in loads if ld.buffer in inside}
            if len(mine) != 1 or next(iter(mine)) not in maxes:
                continue
            if any(isinstance(t, (ir.Load, ir.IndexValue)) and t.index.free_symbols & red_syms
                   for t in ir.walk(x)) or any(isinstance(t, ir.Let) for t in ir.walk(x)):
                continue
            m = maxes[next(iter(mine))]
            if repr(kernel.body(m)) != repr(e):
                continue
            nxt.reductions.remove(node)
            plan.setdefault(k, {}).setdefault(m.name, []).append((node, x))
        if k in plan and not nxt.reductions and not nxt.stores:
            phases[k].after.extend(nxt.after)
            del phases[k + 1]
            continue
        k += 1
    return plan
