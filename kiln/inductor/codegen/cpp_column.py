"""C++ column reductions: reductions over outer (strided) dims whose innermost kept dim is the
contiguous one (``x.sum(0)``, bias and norm-weight gradients, also when the summed values are
stored too: a backward's concatenated q/k/v gradient and its bias gradient in one pass).

The row plan of ``cpp_reduction`` would give each kept element its own strided walk down a
column. Here OpenMP splits (outer kept index, tile of ``TILE`` contiguous kept elements); each
tile loops over the reduced dims outside and over its kept elements inside, into an array of
accumulators, so every inner loop is a contiguous vector load and a vector accumulate. The
per-element epilogue (``after`` nodes) runs once over the tile at the end.
"""
from __future__ import annotations

import math

import sympy
import torch

from kiln.inductor import ir
from kiln.inductor.codegen.common import (IDENTITY, IndexPrinter, KernelWriter, compute_dtype,
                                          decompose_index, plan_phases)
from kiln.inductor.codegen.cpp import (C_TYPES, PRELUDE, CppKernel, CppOps, _helpers_for,
                                       cpp_bounds_check, cpp_cast, cpp_const, cpp_declare, cpp_load,
                                       cpp_store_value, ctype, index_check_support)

TILE = 64  # kept elements per tile: 4 AVX-512 vectors of float accumulators
COLUMN_REDUCTIONS = ("sum", "prod", "max", "min")
MIN_KEPT = 8  # a narrower contiguous kept dim leaves the vector loop mostly empty


def _static(sizes) -> bool:
    return all(isinstance(s, int) or (isinstance(s, sympy.Basic) and s.is_Integer) for s in sizes)


def column_plan(kernel) -> bool:
    """True when the kernel is a column reduction this generator handles: static sizes, one
    pass of sum/prod/max/min (whose per-element values may also be stored, contiguously along
    the kept dim), the last dim kept (at least MIN_KEPT wide), and every load that walks the
    reduced dims contiguous along that kept dim."""
    if not kernel.reduced_dims or not _static(kernel.ranges):
        return False
    last = len(kernel.ranges) - 1
    if last in kernel.reduced_dims or int(kernel.ranges[last]) < MIN_KEPT:
        return False
    pre, phases = plan_phases(kernel)
    if pre or len(phases) != 1:
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
            if not _moves_with_kept(index, kept_sym) or any(s in index.free_symbols for s in ld.index.free_symbols
                                                            if s.name.startswith("ind")):
                return False
            walking += 1
    return walking > 0


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


def generate_cpp_column_reduction(kernel, buffers: dict) -> CppKernel:
    printer = IndexPrinter("/")
    name = f"kiln_{kernel.name}"
    ranges = ir.ranges_of(kernel.ranges)
    nd = len(kernel.ranges)
    last = nd - 1
    kept_outer = [d for d in kernel.kept_dims if d != last]
    outer_shape = [int(kernel.ranges[d]) for d in kept_outer]
    width = int(kernel.ranges[last])
    rshape = [int(s) for s in kernel.rshape]
    tiles = -(-width // TILE)
    xo_numel = math.prod(outer_shape)
    rnumel = math.prod(rshape)
    in_names: dict[str, str] = {}
    out_names: dict[str, str] = {}

    def index_text(expr):
        return printer.doprint(ir.simplify_index(expr, ranges))

    def load(ld: ir.Load):
        return cpp_load(in_names.setdefault(ld.buffer, f"in_ptr{len(in_names)}"), index_text(ld.index),
                        ld.dtype)

    writer = KernelWriter(CppOps(), load, cpp_const, cpp_cast, cpp_declare)
    writer.canon = ir.canonical_index_fn(ranges)
    writer.index_value_fn = lambda e: f"static_cast<{ctype(e.dtype)}>({index_text(e.index)})"
    writer.recompute_from(kernel)
    writer.bounds_check = cpp_bounds_check
    lines = writer.lines

    def store(node, value):
        if node.name not in kernel.stores:
            return
        out = out_names.setdefault(node.name, f"out_ptr{len(out_names)}")
        stored = cpp_store_value(writer, value, node.dtype)
        lines.append(f"{out}[{index_text(kernel.store_index(node))}] = {stored};")

    _, (phase,) = plan_phases(kernel)
    lines.append(f"const int64_t xt = x0 % {tiles};")
    if kept_outer:
        lines += [f"const int64_t i{d} = {e};"
                  for d, e in decompose_index(f"(x0 / {tiles})", outer_shape, kept_outer, "/")]
    lines.append(f"const int64_t k0 = xt * {TILE};")
    lines.append(f"const int64_t kn = {width} - k0 < {TILE} ? {width} - k0 : {TILE};")
    accs = {}
    for k, node in enumerate(phase.reductions):
        dt = compute_dtype(node.body.dtype)
        acc = f"acc{k}"
        ident = cpp_const(IDENTITY[node.reduction_type](dt), dt)
        lines.append(f"{ctype(dt)} {acc}_v[{TILE}];")
        lines.append(f"for (int64_t kk = 0; kk < {TILE}; ++kk) {acc}_v[kk] = {ident};")
        accs[node.name] = (acc, dt)
    lines.append(f"for (int64_t r0 = 0; r0 < {rnumel}; ++r0) {{")
    lines += ["    " + f"const int64_t i{d} = {e};" for d, e in decompose_index("r0", rshape, kernel.reduced_dims, "/")]
    lines.append("    #pragma omp simd")
    lines.append("    for (int64_t kk = 0; kk < kn; ++kk) {")
    writer.push_scope()
    start = len(lines)
    lines.append(f"const int64_t i{last} = k0 + kk;")
    for node in phase.reductions:
        acc, dt = accs[node.name]
        value = writer.emit(kernel.body(node))
        a = f"{acc}_v[kk]"
        kind = node.reduction_type
        if kind == "sum":
            lines.append(f"{a} += {value};")
        elif kind == "prod":
            lines.append(f"{a} *= {value};")
        else:
            lines.append(f"{a} = kiln_{kind}<{ctype(dt)}>({a}, {value});")
    for node in phase.stores:  # per-element values the graph needs (a bias gradient's input)
        store(node, writer.emit_node(node))
    lines[start:] = ["        " + ln for ln in lines[start:]]
    writer.pop_scope()
    lines += ["    }", "}"]
    # the epilogue, once per kept element of the tile
    lines.append("for (int64_t kk = 0; kk < kn; ++kk) {")
    writer.push_scope()
    start = len(lines)
    lines.append(f"const int64_t i{last} = k0 + kk;")
    for node in phase.reductions:
        acc, dt = accs[node.name]
        value = f"({acc}_v[kk] != 0)" if node.dtype == torch.bool else f"{acc}_v[kk]"
        reg = writer._tmp(value, node.dtype)
        writer.in_registers[(node.name, writer.canon(kernel.store_index(node)))] = reg
        store(node, reg)
    for node in phase.after:
        store(node, writer.emit_node(node))
    lines[start:] = ["    " + ln for ln in lines[start:]]
    writer.pop_scope()
    lines.append("}")

    params = [f"const {C_TYPES[buffers[b].dtype]}* __restrict__ {p}" for b, p in in_names.items()]
    params += [f"{C_TYPES[buffers[b].dtype]}* __restrict__ {p}" for b, p in out_names.items()]
    parallel = xo_numel * tiles > 1 and xo_numel * width * max(rnumel, 1) >= 1 << 16
    code = [f'extern "C" void {name}({", ".join(params)}) {{',
            f"    #pragma omp parallel for{'' if parallel else ' if(0)'}",
            f"    for (int64_t x0 = 0; x0 < {xo_numel * tiles}; ++x0) {{"]
    code += ["        " + ln for ln in lines] + ["    }", "}"]
    code_text = "\n".join(code)
    header = "\n".join(f"// from: {o}" for o in kernel.origins)
    source = (header + PRELUDE + _helpers_for(code_text) + "\n" + index_check_support(name, code_text) + "\n"
              + code_text + "\n")
    return CppKernel(name, source, list(in_names) + list(out_names), math.prod(kernel.xshape) * rnumel,
                     list(kernel.origins))
