"""C++ column reductions: reductions over outer (strided) dims whose innermost kept dim is the
contiguous one (``x.sum(0)``, bias and norm-weight gradients, also when the summed values are
stored too: a backward's concatenated q/k/v gradient and its bias gradient in one pass).

The row plan of ``cpp_reduction`` would give each kept element its own strided walk down a
column. Here OpenMP splits (outer kept index, tile of 64 to 256 contiguous kept elements); each
tile loops over the reduced dims outside and over its kept elements inside, into an array of
accumulators, so every inner loop is a contiguous vector load and a vector accumulate. The
per-element epilogue (``after`` nodes) runs once over the tile at the end.
"""
from __future__ import annotations

import math
import os

import sympy
import torch

from kiln.inductor import ir
from kiln.inductor.codegen.common import (IDENTITY, IndexPrinter, KernelWriter, compute_dtype,
                                          decompose_index, plan_phases)
from kiln.inductor.codegen.cpp import (C_MEM_TYPES, PRELUDE, CppKernel, CppOps, _helpers_for,
                                       cpp_bounds_check, with_index_flag, cpp_cast, cpp_const, cpp_declare, cpp_load,
                                       cpp_store_value, ctype, index_check_support)

TILES = (256, 128, 64)  # kept elements per tile (64: 4 AVX-512 vectors of float accumulators)
# fp32 sums are cascaded: the float tile accumulates CASCADE_ROWS reduced rows, then is added
# into a double tile and restarts from zero (cpp_reduction.CASCADE_BLOCKS says why; one float
# chain over every row of a bias gradient's [tokens, features] was 2-3x eager's error)
CASCADE_ROWS = 256
COLUMN_REDUCTIONS = ("sum", "prod", "max", "min")
MIN_KEPT = 8  # a narrower contiguous kept dim leaves the vector loop mostly empty


def _static(sizes) -> bool:
    return all(isinstance(s, int) or (isinstance(s, sympy.Basic) and s.is_Integer) for s in sizes)


def column_plan(kernel) -> bool:
    """True when the kernel is a column reduction this generator handles: static sizes, one
    pass of sum/prod/max/min (whose per-element values may also be stored, contiguously along
    the kept dim), the last dim kept (at least MIN_KEPT wide), and every load that walks the
    reduced dims contiguous along that kept dim or independent of it."""
    if not kernel.reduced_dims or not _static(kernel.ranges):
        return False
    last = len(kernel.ranges) - 1
    if last in kernel.reduced_dims or int(kernel.ranges[last]) < MIN_KEPT:
        return False
    pre, phases = plan_phases(kernel)
    if len(phases) != 1 or not _extra_outputs(kernel, pre):
        return False
    if any(n.reduction_type not in COLUMN_REDUCTIONS for n in phases[0].reductions):
        return False
    ranges = ir.ranges_of(kernel.ranges)
    kept_sym = ir.index_symbol(last)
    red_syms = {ir.index_symbol(d) for d in kernel.reduced_dims}
    for node in phases[0].stores:  # per-element values stored in the pass: contiguous in a tile
        index = sympy.expand(ir.simplify_index(kernel.store_index(node), ranges))
        if not _moves_with_kept(index, kept_sym):
            return False
    walking = 0
    for node in phases[0].reductions + phases[0].stores:
        for ld in ir.loads_of(kernel.body(node)):
            index = sympy.expand(ir.simplify_index(ld.index, ranges))
            if not (index.free_symbols & red_syms):
                continue
            if any(s.name.startswith("ind") for s in index.free_symbols):
                return False  # an indirect (gathered) address
            if kept_sym not in index.free_symbols:
                continue  # one value per reduced step, the same for the whole tile (a norm's mean)
            if not _moves_with_kept(index, kept_sym):
                return False
            walking += 1
    return walking > 0


def _extra_outputs(kernel, pre) -> bool:
    """Whether the nodes computed before the pass (``plan_phases``' ``pre``: per kept element,
    nothing reduced) are only stored results no other node of the kernel reads: a pointwise
    output fused beside the column sum (a BERT backward's mask cast beside its embedding
    gradient's batch sum). They are then written in the tile's epilogue, once per element."""
    names = {n.name for n in pre}
    return all(n.name in kernel.stores for n in pre) and \
        not any(names & set(n.reads()) for n in kernel.nodes)


def _moves_with_kept(index, kept_sym) -> bool:
    """The address steps by one with the kept index: ``... + k`` or, for a part of a
    concatenation, ``... + Mod(k + c, n)`` (by one within the part)."""
    dep = [t for t in sympy.Add.make_args(index) if kept_sym in t.free_symbols]
    if len(dep) != 1:
        return False
    term = dep[0]
    if term == kept_sym:
        return True
    return isinstance(term, sympy.Mod) and sympy.expand(term.args[0]).coeff(kept_sym) == 1 and \
        not (sympy.expand(term.args[0]) - kept_sym).free_symbols & {kept_sym}


def _linear_form(index, loop_syms):
    """({loop symbol: coefficient}, base) of an index linear in the loop symbols, whose
    coefficients and base are per-tile values (constants, ``kbJ``, ``tselN_*``); None otherwise."""
    index = sympy.expand(index)
    coefs = {}
    for sym in index.free_symbols & loop_syms:
        c = index.coeff(sym, 1)
        if c.free_symbols & loop_syms:
            return None
        coefs[sym] = c
    base = sympy.expand(index - sum((c * s for s, c in coefs.items()), sympy.Integer(0)))
    if base.free_symbols & loop_syms:
        return None
    return coefs, base


def _tile_width(kernel, ranges, width: int, xo_numel: int) -> int:
    """The widest tile that still gives each thread two tasks: wide tiles read longer runs of
    each row (a q/k/v bias gradient at 4096x2304, 2 cores: 17.2 ms at 64, 15.7 ms at 256);
    among those, the widest that a concatenation's parts fill whole (``Mod(k + c, n)`` loads
    with n and c multiples of it), so that each tile reads one part (see tile_select)."""
    kept_sym = ir.index_symbol(len(kernel.ranges) - 1)
    mods = set()
    for node in kernel.nodes:
        for ld in ir.loads_of(kernel.body(node)):
            index = ir.simplify_index(ld.index, ranges)
            for m in index.atoms(sympy.Mod):
                c = sympy.expand(m.args[0]) - kept_sym
                if kept_sym in m.free_symbols and c.is_Integer and m.args[1].is_Integer:
                    mods.add((int(c), int(m.args[1])))
    threads = os.cpu_count() or 1
    busy = [t for t in TILES if xo_numel * -(-width // t) >= 2 * threads] or [TILES[-1]]
    for t in busy:
        if all(n % t == 0 and c % t == 0 for c, n in mods):
            return t
    return busy[-1]



def _cascaded(node, dt, rnumel) -> bool:
    # more rows than one float chain takes (else the double tile adds nothing but its set-up)
    return node.reduction_type == "sum" and dt == torch.float32 and rnumel > CASCADE_ROWS

class _BodiesMapped:
    """A kernel whose node bodies pass through ``fn`` (what the writer emits and recomputes)."""

    def __init__(self, kernel, fn):
        self._kernel, self._fn = kernel, fn

    def __getattr__(self, name):
        return getattr(self._kernel, name)

    def body(self, node):
        return self._fn(self._kernel.body(node))


def generate_cpp_column_reduction(kernel, buffers: dict) -> CppKernel:
    return _ColumnWriter(kernel, buffers).generate()


_FLIP = {"gt": "lt", "le": "ge", "lt": "gt", "ge": "le"}


class _ColumnWriter:
    """One C++ column reduction being written: each thread task reduces a tile of ``tile`` kept
    elements of the last dim over every reduced row, in ``tile`` partial accumulators that gcc
    vectorizes along the tile; a concatenation's parts that tiles cannot straddle are read
    through one pointer chosen per tile (``tile_local``, ``tile_uniform``, ``tile_select``)."""

    def __init__(self, kernel, buffers: dict):
        self.kernel, self.buffers = kernel, buffers
        self.printer = IndexPrinter("/")
        self.name = f"kiln_{kernel.name}"
        self.ranges = ranges = ir.ranges_of(kernel.ranges)
        nd = len(kernel.ranges)
        self.last = last = nd - 1
        self.kept_outer = [d for d in kernel.kept_dims if d != last]
        self.outer_shape = [int(kernel.ranges[d]) for d in self.kept_outer]
        self.width = int(kernel.ranges[last])
        self.rshape = [int(s) for s in kernel.rshape]
        self.xo_numel = math.prod(self.outer_shape)
        self.tile = _tile_width(kernel, ranges, self.width, self.xo_numel)
        self.tiles = -(-self.width // self.tile)
        self.rnumel = math.prod(self.rshape)
        self.in_names: dict[str, str] = {}
        self.out_names: dict[str, str] = {}
        self.kept_sym = ir.index_symbol(last)
        self.kk_sym = sympy.Symbol("kk", integer=True, nonnegative=True)
        self.k0_sym = sympy.Symbol("k0", integer=True, nonnegative=True)
        self.loop_syms = {ir.index_symbol(d) for d in range(nd)} | {self.kk_sym}  # what varies inside a tile
        self.tile_bases: dict = {}  # (c, n) -> (name, declaration): Mod(k + c, n) at the tile's start
        self.selects: dict = {}  # (test, pointers, index forms) -> (name, declarations, index)
        self.selects_by_name: dict = {}  # tsel name -> storage dtype
        writer = KernelWriter(CppOps(), self.load, cpp_const, cpp_cast, cpp_declare)
        writer.canon = ir.canonical_index_fn(ranges)
        writer.index_value_fn = lambda e: f"static_cast<{ctype(e.dtype)}>({self._index_text(e.index)})"
        self.view = _BodiesMapped(kernel, self.tile_uniform)
        writer.recompute_from(self.view)
        writer.bounds_check = cpp_bounds_check
        self.writer, self.lines = writer, writer.lines

    def _index_text(self, expr):
        return self.printer.doprint(ir.simplify_index(expr, self.ranges))

    def _in_ptr(self, buf):
        return self.in_names.setdefault(buf, f"in_ptr{len(self.in_names)}")

    def tile_local(self, expr):
        """``Mod(k + c, n)`` as ``kbJ + kk`` when no part boundary can fall inside a tile (n and c
        multiples of the tile width, where tiles start): a concatenation's part is then a
        contiguous load that gcc vectorizes, instead of a modulo per element."""
        expr = ir.simplify_index(expr, self.ranges)
        kept_sym, tile, tile_bases = self.kept_sym, self.tile, self.tile_bases

        def local(m):
            arg, n = sympy.expand(m.args[0]), m.args[1]
            c = arg - kept_sym
            if not (n.is_Integer and c.is_Integer and arg.coeff(kept_sym) == 1) or int(n) % tile or int(c) % tile:
                return m
            key = (int(c), int(n))
            if key not in tile_bases:
                name_ = f"kb{len(tile_bases)}"
                tile_bases[key] = (name_, f"const int64_t {name_} = ((k0 + {key[0]}) % {key[1]} + {key[1]}) % {key[1]};")
            return sympy.Symbol(tile_bases[key][0], integer=True, nonnegative=True) + self.kk_sym
        return expr.replace(lambda e: isinstance(e, sympy.Mod) and kept_sym in e.free_symbols, local)

    def tile_uniform(self, expr):
        """Comparisons of the kept index with a part boundary that tiles cannot straddle
        (``k + c < B`` with B - c a multiple of the tile width) read the tile's start instead of the
        element's: the same truth value, but loop-invariant, so that tile_select can turn a
        ``where`` on it into a pointer chosen per tile."""
        if isinstance(expr, ir.Let):
            return ir.Let(expr.symbol, self.tile_uniform(expr.value), expr.bound, self.tile_uniform(expr.body),
                          wrap_negative=expr.wrap_negative)
        if not isinstance(expr, ir.Call):
            return expr
        args = tuple(self.tile_uniform(a) for a in expr.args)
        if expr.op == "where":
            picked = self.tile_select(*args)
            if picked is not None:
                return picked
        if expr.op in _FLIP and len(args) == 2:
            for pos in (0, 1):
                iv, const = args[pos], args[1 - pos]
                if not (isinstance(iv, ir.IndexValue) and isinstance(const, ir.Const) and type(const.value) is int):
                    continue
                op = expr.op if pos == 0 else _FLIP[expr.op]  # as "k + c <op> B"
                index = sympy.expand(ir.simplify_index(iv.index, self.ranges))
                c = index - self.kept_sym
                if index.coeff(self.kept_sym) != 1 or not c.is_Integer:
                    continue
                # k + c < B  <=>  k < t, with t = B - c (lt, ge) or B - c + 1 (le, gt)
                t = const.value - int(c) + (1 if op in ("le", "gt") else 0)
                if t % self.tile == 0:
                    new = list(args)
                    new[pos] = ir.IndexValue(self.k0_sym + c, iv.dtype)
                    return ir.Call(expr.op, tuple(new), expr.dtype)
        return ir.Call(expr.op, args, expr.dtype)

    def tile_select(self, cond, a, b):
        """``where(c, A[i], B[j])`` with a tile-uniform c (see tile_uniform) loads from one
        pointer chosen per tile, at an index whose differing coefficients and base are chosen
        per tile too: a concatenation's tile reads only its own part, contiguously."""
        if not (isinstance(cond, ir.Call) and cond.op in _FLIP and isinstance(a, ir.Load) and isinstance(b, ir.Load)
                and a.dtype == b.dtype):
            return None
        values = [x for x in cond.args if isinstance(x, ir.IndexValue)]
        consts = [x for x in cond.args if isinstance(x, ir.Const)]
        if len(values) != 1 or len(consts) != 1 or values[0].index.free_symbols != {self.k0_sym}:
            return None
        buffers, selects_by_name = self.buffers, self.selects_by_name
        storage = {buffers[x.buffer].dtype if x.buffer in buffers else selects_by_name.get(x.buffer) for x in (a, b)}
        forms = [_linear_form(self.tile_local(x.index), self.loop_syms) for x in (a, b)]
        if len(storage) != 1 or None in storage or None in forms or \
                any(f[0].get(self.kk_sym) != 1 for f in forms):  # contiguous along the tile in both
            return None
        ptrs = [x.buffer if x.buffer in selects_by_name else self._in_ptr(x.buffer) for x in (a, b)]
        symbol = {"lt": "<", "le": "<=", "gt": ">", "ge": ">="}[cond.op]
        sides = [f"({self.printer.doprint(x.index)})" if isinstance(x, ir.IndexValue) else str(x.value)
                 for x in cond.args]
        test = f"{sides[0]} {symbol} {sides[1]}"
        key = (test, *ptrs, *(str(f) for f in forms))
        if key not in self.selects:
            (dt,) = storage
            self.selects[key] = self._select_declarations(f"tsel{len(self.selects)}", test, ptrs, forms, dt)
            selects_by_name[self.selects[key][0]] = dt
        name_, _, index = self.selects[key]
        return ir.Load(name_, index, a.dtype)

    def _select_declarations(self, name_, test, ptrs, forms, dt):
        """(name, its declarations, the index it is read at) of one per-tile pointer choice."""
        printer = self.printer
        decls = [f"const {C_MEM_TYPES[dt]}* __restrict__ {name_} = ({test}) ? {ptrs[0]} : {ptrs[1]};"]
        (ca, ba), (cb, bb) = forms
        index = sympy.Integer(0)
        for k, sym in enumerate(sorted(set(ca) | set(cb), key=str)):
            x, y = ca.get(sym, sympy.Integer(0)), cb.get(sym, sympy.Integer(0))
            if x != y:
                var = sympy.Symbol(f"{name_}_c{k}", integer=True)
                decls.append(f"const int64_t {var} = ({test}) ? ({printer.doprint(x)}) : ({printer.doprint(y)});")
                x = var
            index += x * sym
        if ba != bb:
            var = sympy.Symbol(f"{name_}_b", integer=True)
            decls.append(f"const int64_t {var} = ({test}) ? ({printer.doprint(ba)}) : ({printer.doprint(bb)});")
            ba = var
        return name_, "\n".join(decls), index + ba

    def load(self, ld: ir.Load):
        ptr = ld.buffer if ld.buffer in self.selects_by_name else self._in_ptr(ld.buffer)
        return cpp_load(ptr, self.printer.doprint(self.tile_local(ld.index)), ld.dtype)

    def store(self, node, value):
        if node.name not in self.kernel.stores:
            return
        out = self.out_names.setdefault(node.name, f"out_ptr{len(self.out_names)}")
        stored = cpp_store_value(self.writer, value, node.dtype)
        self.lines.append(f"{out}[{self._index_text(self.kernel.store_index(node))}] = {stored};")

    def generate(self) -> CppKernel:
        kernel, lines, tile = self.kernel, self.lines, self.tile
        pre, (phase,) = plan_phases(kernel)
        lines.append(f"const int64_t xt = x0 % {self.tiles};")
        if self.kept_outer:
            lines += [f"const int64_t i{d} = {e};"
                      for d, e in decompose_index(f"(x0 / {self.tiles})", self.outer_shape, self.kept_outer, "/")]
        lines.append(f"const int64_t k0 = xt * {tile};")
        lines.append(f"const int64_t kn = {self.width} - k0 < {tile} ? {self.width} - k0 : {tile};")
        bases_at = len(lines)  # the tile's part bases (tile_local) go here
        accs = {}
        for k, node in enumerate(phase.reductions):
            dt = compute_dtype(node.body.dtype)
            acc = f"acc{k}"
            ident = cpp_const(IDENTITY[node.reduction_type](dt), dt)
            lines.append(f"{ctype(dt)} {acc}_v[{tile}];")
            lines.append(f"for (int64_t kk = 0; kk < {tile}; ++kk) {acc}_v[kk] = {ident};")
            if _cascaded(node, dt, self.rnumel):
                lines.append(f"double {acc}_d[{tile}];")
                lines.append(f"for (int64_t kk = 0; kk < {tile}; ++kk) {acc}_d[kk] = 0.0;")
            accs[node.name] = (acc, dt)
        self._reduce_loop(phase, accs)
        self._epilogue(phase, accs, pre)
        lines[bases_at:bases_at] = [decl for _, decl in self.tile_bases.values()] + \
            [ln for _, decls, _ in self.selects.values() for ln in decls.split("\n")]
        return self._kernel_object()

    def _reduce_loop(self, phase, accs):
        """Over the reduced rows, each row's tile accumulated lane by lane."""
        kernel, lines, writer = self.kernel, self.lines, self.writer
        cascade = any(_cascaded(node, dt, self.rnumel) for node in phase.reductions for _, dt in [accs[node.name]])
        if cascade:  # blocks of CASCADE_ROWS rows, each flushed into the double tile after it
            lines.append(f"for (int64_t rc = 0; rc < {self.rnumel}; rc += {CASCADE_ROWS}) {{")
            lines.append(f"const int64_t rc_end = rc + {CASCADE_ROWS} < {self.rnumel} ? rc + {CASCADE_ROWS} : {self.rnumel};")
            lines.append("for (int64_t r0 = rc; r0 < rc_end; ++r0) {")
        else:
            lines.append(f"for (int64_t r0 = 0; r0 < {self.rnumel}; ++r0) {{")
        lines += ["    " + f"const int64_t i{d} = {e};"
                  for d, e in decompose_index("r0", self.rshape, kernel.reduced_dims, "/")]
        lines.append("    #pragma omp simd")
        lines.append("    for (int64_t kk = 0; kk < kn; ++kk) {")
        writer.push_scope()
        start = len(lines)
        lines.append(f"const int64_t i{self.last} = k0 + kk;")
        for node in phase.reductions:
            acc, dt = accs[node.name]
            value = writer.emit(self.view.body(node))
            a = f"{acc}_v[kk]"
            kind = node.reduction_type
            if kind == "sum":
                lines.append(f"{a} += {value};")
            elif kind == "prod":
                lines.append(f"{a} *= {value};")
            else:
                lines.append(f"{a} = kiln_{kind}<{ctype(dt)}>({a}, {value});")
        for node in phase.stores:  # per-element values the graph needs (a bias gradient's input)
            self.store(node, writer.emit_node(node))
        lines[start:] = ["        " + ln for ln in lines[start:]]
        writer.pop_scope()
        lines.append("    }")
        flush = [f"for (int64_t kk = 0; kk < kn; ++kk) {{ {acc}_d[kk] += {acc}_v[kk]; {acc}_v[kk] = 0.0f; }}"
                 for node in phase.reductions for acc, dt in [accs[node.name]] if _cascaded(node, dt, self.rnumel)]
        lines.append("}")
        if flush:
            lines += flush + ["}"]

    def _epilogue(self, phase, accs, pre=()):
        """Once per kept element of the tile: the reduced values, what follows them, and the
        stored values that need no reduction (``_extra_outputs``)."""
        kernel, lines, writer = self.kernel, self.lines, self.writer
        lines.append("for (int64_t kk = 0; kk < kn; ++kk) {")
        writer.push_scope()
        start = len(lines)
        lines.append(f"const int64_t i{self.last} = k0 + kk;")
        for node in phase.reductions:
            acc, dt = accs[node.name]
            part = f"{acc}_d" if _cascaded(node, dt, self.rnumel) else f"{acc}_v"
            value = f"({part}[kk] != 0)" if node.dtype == torch.bool else f"{part}[kk]"
            reg = writer._tmp(value, node.dtype)
            writer.in_registers[(node.name, writer.canon(kernel.store_index(node)))] = reg
            self.store(node, reg)
        for node in list(pre) + phase.after:
            self.store(node, writer.emit_node(node))
        lines[start:] = ["    " + ln for ln in lines[start:]]
        writer.pop_scope()
        lines.append("}")

    def _kernel_object(self) -> CppKernel:
        kernel, lines, buffers, name = self.kernel, self.lines, self.buffers, self.name
        xo_numel, tiles, rnumel = self.xo_numel, self.tiles, self.rnumel
        params = [f"const {C_MEM_TYPES[buffers[b].dtype]}* __restrict__ {p}" for b, p in self.in_names.items()]
        params += [f"{C_MEM_TYPES[buffers[b].dtype]}* __restrict__ {p}" for b, p in self.out_names.items()]
        parallel = xo_numel * tiles > 1 and xo_numel * self.width * max(rnumel, 1) >= 1 << 16
        code = [f'extern "C" void {name}({", ".join(params)}) {{',
                f"    #pragma omp parallel for{'' if parallel else ' if(0)'}",
                f"    for (int64_t x0 = 0; x0 < {xo_numel * tiles}; ++x0) {{"]
        code += ["        " + ln for ln in lines] + ["    }", "}"]
        code_text = "\n".join(code)
        header = "\n".join(f"// from: {o}" for o in kernel.origins)
        code_text = with_index_flag(code_text)
        source = (header + PRELUDE + _helpers_for(code_text) + "\n" + index_check_support(name, code_text) + "\n"
                  + code_text + "\n")
        return CppKernel(name, source, list(self.in_names) + list(self.out_names), math.prod(kernel.xshape) * rnumel,
                         list(kernel.origins))
