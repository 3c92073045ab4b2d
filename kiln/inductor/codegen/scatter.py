"""Scatter kernels (Triton and C++): one program/iteration per *source* element, adding into
(or, mode "store", writing) a computed address of the target buffer. Collisions of adds are
resolved with atomics (``tl.atomic_add``; ``omp atomic`` for 32/64-bit C++ types, a serial loop
for half types), except where a C++ scatter's outer slices cannot collide: one thread per
slice, no atomics (``_plane_split``). Stores collide by keeping one value: C++ stores run
serially (or a plane per thread), so the last in source order wins."""
from __future__ import annotations

import math

import torch

from kiln.inductor import ir
from kiln.inductor.codegen.common import (LOW_PRECISION, IndexPrinter, KernelWriter, decompose_index,
                                          is_symbolic, size_params, size_text)
from kiln.meta.symbolic import py
from kiln.inductor.codegen.cpp import (C_MEM_TYPES, PRELUDE, CppKernel, CppOps, _helpers_for, cpp_bounds_check, with_index_flag,
                                       cpp_cast, cpp_const, cpp_declare, cpp_load, ctype,
                                       index_check_support)
from kiln.inductor.codegen.triton import (TL_DTYPES, TritonKernel, TritonOps, _block_config,
                                          triton_bounds_check, triton_cast, triton_const,
                                          triton_index_value)


def generate_scatter(step, buffers: dict, target: str):
    return (_triton if target == "triton" else _cpp)(step, buffers)


def _triton(step, buffers):
    node = step.node
    printer = IndexPrinter("//")
    ranges = ir.ranges_of(node.src_ranges)
    numel = math.prod(node.src_ranges)
    in_names: dict[str, str] = {}

    def load(ld):
        index = ir.simplify_index(ld.index, ranges)
        ptr = in_names.setdefault(ld.buffer, f"in_ptr{len(in_names)}")
        mask = ", xmask, other=0" if ir.loop_symbols(index) else ""
        text = f"tl.load({ptr} + ({printer.doprint(index)}){mask})"
        return text + ".to(tl.float32)" if ld.dtype in LOW_PRECISION else text

    writer = KernelWriter(TritonOps(), load, triton_const, triton_cast, lambda n, t, d: f"{n} = {t}")
    writer.bounds_check = triton_bounds_check
    writer.index_value_fn = lambda e: triton_index_value(e, printer, ranges)
    lines = ["xoffset = tl.program_id(0) * XBLOCK", "xindex = xoffset + tl.arange(0, XBLOCK)",
             "xmask = xindex < xnumel"]
    lines += [f"i{d} = {e}" for d, e in decompose_index("xindex", node.src_ranges, range(len(node.src_ranges)), "//")]
    writer.lines = lines
    writer.emit(node.slot)
    value = writer.emit(node.value)
    index = node.index.xreplace(writer.indirect)
    out_dtype = TL_DTYPES[node.dtype]
    try:  # a constant source (a scatter of ones) is a Python literal: make it a block
        float(value)
        value = f"tl.full([XBLOCK], {value}, {out_dtype})"
    except ValueError:
        pass
    write = "tl.store" if node.mode == "store" else "tl.atomic_add"
    lines.append(f"{write}(out_ptr0 + ({printer.doprint(index)}), {value}.to({out_dtype}), mask=xmask)")
    name = f"kiln_{step.name}"
    sizes = size_params(lines)
    params = list(in_names.values()) + ["out_ptr0"] + sizes + ["xnumel", "XBLOCK: tl.constexpr"]
    src = ["import triton", "import triton.language as tl", ""]
    src += [f"# from: {o}" for o in node.origins]
    src += ["", "", "@triton.jit(debug=True)", f"def {name}({', '.join(params)}):"] + ["    " + ln for ln in lines]
    if is_symbolic(numel):
        return TritonKernel(name, "\n".join(src) + "\n", list(in_names) + [node.target], sizes + [py(numel)],
                            {"XBLOCK": 1024}, f"-(-({py(numel)}) // 1024)", 4, list(node.origins))
    xblock, warps = _block_config(numel)
    return TritonKernel(name, "\n".join(src) + "\n", list(in_names) + [node.target], sizes + [numel],
                        {"XBLOCK": xblock}, -(-numel // xblock), warps, list(node.origins))


def _cpp(step, buffers):
    node = step.node
    printer = IndexPrinter("/")
    ranges = ir.ranges_of(node.src_ranges)
    numel = math.prod(node.src_ranges)
    in_names: dict[str, str] = {}

    def load(ld):
        return cpp_load(in_names.setdefault(ld.buffer, f"in_ptr{len(in_names)}"),
                        printer.doprint(ir.simplify_index(ld.index, ranges)), ld.dtype)

    writer = KernelWriter(CppOps(), load, cpp_const, cpp_cast, cpp_declare)
    writer.bounds_check = cpp_bounds_check
    writer.index_value_fn = lambda e: f"static_cast<{ctype(e.dtype)}>({printer.doprint(ir.simplify_index(e.index, ranges))})"
    writer.lines = [f"const int64_t i{d} = {e};"
                    for d, e in decompose_index("x0", node.src_ranges, range(len(node.src_ranges)), "/")]
    writer.emit(node.slot)
    value = writer.emit(node.value)
    index = printer.doprint(node.index.xreplace(writer.indirect))
    atomic = node.dtype not in LOW_PRECISION and node.dtype != torch.bool
    if node.mode == "store":
        # plain stores; threads only where they cannot meet (a plane each), so a position
        # named twice keeps its last value in source order
        split = _plane_split(node)
        atomic = split is not None  # lowering widens half types first: never one here
        writer.lines.append(f"out_ptr0[{index}] = {value};")
    elif node.dtype == torch.bfloat16:
        writer.lines.append(f"out_ptr0[{index}] = kiln_float_to_bf16(kiln_bf16_to_float(out_ptr0[{index}]) + {value});")
    elif node.dtype == torch.float16:
        writer.lines.append(f"out_ptr0[{index}] = (_Float16)((float)out_ptr0[{index}] + {value});")
    else:
        split = _plane_split(node) if atomic else None
        writer.lines += ([] if split else [ATOMIC]) + [f"out_ptr0[{index}] += {value};"]
    name = f"kiln_{step.name}"
    params = [f"const {C_MEM_TYPES[buffers[b].dtype]}* __restrict__ {p}" for b, p in in_names.items()]
    params.append(f"{C_MEM_TYPES[node.dtype]}* out_ptr0")
    symbolic = is_symbolic(numel)
    numel_text = size_text(numel, printer)
    sizes = size_params(writer.lines + [numel_text])
    params += [f"const int64_t {p}" for p in sizes]
    if symbolic:
        parallel = f"#pragma omp parallel for if({numel_text} >= 16384)" if atomic else ""
    else:
        parallel = "#pragma omp parallel for" if atomic and numel >= 1 << 14 else ""
    code = [f'extern "C" void {name}({", ".join(params)}) {{']
    if parallel:
        code.append(f"    {parallel}")
    if atomic and split:  # one thread per outer slice, its elements in order: no atomics
        planes, inner = math.prod(node.src_ranges[:split]), math.prod(node.src_ranges[split:])
        code.append(f"    for (int64_t xp = 0; xp < {planes}; ++xp) {{")
        code.append(f"    for (int64_t xq = 0; xq < {inner}; ++xq) {{")
        code.append(f"        const int64_t x0 = xp * {inner} + xq;")
        code += ["        " + ln for ln in writer.lines] + ["    }", "    }", "}"]
    elif ATOMIC in writer.lines:
        code = _atomic_adds(code, parallel, writer.lines, numel_text)
    else:
        code.append(f"    for (int64_t x0 = 0; x0 < {numel_text}; ++x0) {{")
        code += ["        " + ln for ln in writer.lines] + ["    }", "}"]
    text = "\n".join(code)
    header = "\n".join(f"// from: {o}" for o in node.origins)
    helpers = _helpers_for(text)
    if "kiln_float_to_bf16" in text and "kiln_bf16_to_float" not in helpers:
        helpers = _helpers_for(text + " kiln_round_bf16")
    text = with_index_flag(text)
    omp = "#ifdef _OPENMP\n#include <omp.h>\n#endif\n" if "omp_get_max_threads" in text else ""
    source = header + PRELUDE + omp + helpers + "\n" + index_check_support(name, text) + "\n" + text + "\n"
    return CppKernel(name, source, list(in_names) + [node.target], numel, list(node.origins), sizes)


ATOMIC = "#pragma omp atomic"


def _atomic_adds(code, parallel, body, numel_text):
    """The loop of a scatter-add whose targets may collide: atomic adds where threads share
    it, plain adds where one thread runs it. An atomic float add is a compare-and-swap loop
    even with no other thread (a BERT embedding gradient's 16384 adds took 100 us on one
    thread; 10 without), so the atomics are only in the loop that runs in parallel."""
    plain = [ln for ln in body if ln != ATOMIC]
    head, loop = code[:1], f"    for (int64_t x0 = 0; x0 < {numel_text}; ++x0) {{"
    if not parallel:  # no parallel region: nothing else writes the target
        return head + [loop] + ["        " + ln for ln in plain] + ["    }", "}"]
    out = head + ["#ifdef _OPENMP", "    if (omp_get_max_threads() > 1) {", f"    {parallel}", loop]
    out += ["        " + ln for ln in body] + ["    }", "    return;", "    }", "#endif", loop]
    return out + ["        " + ln for ln in plain] + ["    }", "}"]


PLANE_MIN = 8  # outer slices a scatter needs before it runs them in parallel without atomics


def _plane_split(node) -> int | None:
    """How many leading source dims a C++ scatter-add can spread over threads without atomics,
    or None. A scatter along dim ``d`` (lowering's ``scatter_rule``) adds source element
    ``(i0, .., id, ..)`` at target coordinates ``(i0, .., index, ..)``: every other coordinate is
    the source's own. Elements that differ in a dim before ``d`` therefore land in different
    target slices, so one thread per slice of the dims before ``d``, walking its elements in
    order, never meets another thread (max_pool2d's CPU gradient: a plane each; its
    [4, 16, 32, 32] kernel took 153 us against 182 us with atomics, two cores, standalone).
    ``d`` is the one source dim whose symbol the target index lacks; static sizes only, and at
    least ``PLANE_MIN`` slices."""
    ranges = node.src_ranges
    if any(is_symbolic(r) for r in ranges):
        return None
    free = node.index.free_symbols
    if node.slot is None or node.slot.symbol not in free:
        return None
    absent = [d for d, sym in enumerate(ir.index_symbols(len(ranges))) if sym not in free and ranges[d] != 1]
    if len(absent) != 1 or math.prod(ranges[:absent[0]]) < PLANE_MIN:
        return None
    return absent[0]
