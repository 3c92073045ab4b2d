"""Triton code generation for fused pointwise kernels.

A kernel iterates over the flattened output index ``xindex`` in blocks of ``XBLOCK``; the loop
IR's index symbols are recovered from it with division and modulo, and loads/stores use each
buffer's own strides, so broadcast and transposed operands need no copies.
"""
from __future__ import annotations

import math

import torch

from kiln.config import config
from kiln.inductor import ir
from kiln.inductor.codegen import tuning
from kiln.inductor.codegen.common import (LOW_PRECISION, IndexPrinter, KernelWriter, ScalarOps,
                                          compute_dtype, interpreting, is_symbolic, size_params,
                                          size_text)
from kiln.meta.symbolic import py

TL_DTYPES = {
    torch.float32: "tl.float32", torch.float16: "tl.float16", torch.bfloat16: "tl.bfloat16",
    torch.float64: "tl.float64", torch.int64: "tl.int64", torch.int32: "tl.int32",
    torch.int16: "tl.int16", torch.int8: "tl.int8", torch.uint8: "tl.uint8", torch.bool: "tl.int1",
}


class TritonOps(ScalarOps):
    name = "triton"
    TABLE = {
        "add": "({0} + {1})",
        "sub": "({0} - {1})",
        "mul": "({0} * {1})",
        "div": "({0} / {1})",
        "neg": "(-{0})",
        "abs": "tl.abs({0})",
        "exp": "tl.exp({0})",
        "log": "tl.log({0})",
        "sqrt": "tl.sqrt({0})",
        "rsqrt": "tl.rsqrt({0})",
        "sigmoid": "tl.sigmoid({0})",
        # NaN-propagating, like torch.maximum/minimum (tl.maximum drops NaNs by default).
        "maximum": "tl.where(({0} > {1}) | ({0} != {0}), {0}, {1})",
        "minimum": "tl.where(({0} < {1}) | ({0} != {0}), {0}, {1})",
        "eq": "({0} == {1})",
        "ne": "({0} != {1})",
        "lt": "({0} < {1})",
        "le": "({0} <= {1})",
        "gt": "({0} > {1})",
        "ge": "({0} >= {1})",
        "where": "tl.where({0}, {1}, {2})",
        # counter-based Philox: (per-call seed + stream id, element index) -> uniform [0, 1)
        "rand": "tl.rand({0} + {1}, {2})",
        # kiln/ops/prims_more.py: spelled with tl.* only, so the interpreter runs them too
        "floor": "tl.floor({0})",
        "ceil": "tl.ceil({0})",
        "trunc": "tl.where({0} < 0, tl.ceil({0}), tl.floor({0}))",
        # half to even: the fraction decides, ties go to 2 * floor(x / 2 + 1 / 4)
        "round": ("tl.where({0} - tl.floor({0}) > 0.5, tl.floor({0}) + 1.0, tl.where({0} - tl.floor({0}) < 0.5, "
                  "tl.floor({0}), 2.0 * tl.floor({0} * 0.5 + 0.25)))"),
        "sin": "tl.sin({0})",
        "cos": "tl.cos({0})",
        "erf": "tl.erf({0})",
        "exp2": "tl.exp2({0})",
        "log2": "tl.log2({0})",
        "log10": "(tl.log2({0}) * 0.30102999566398120)",
        # Kahan's forms keep the relative accuracy near 0 without libdevice
        "expm1": ("tl.where(tl.abs({0}) > 0.5, tl.exp({0}) - 1.0, tl.where(tl.exp({0}) == 1.0, {0}, "
                  "(tl.exp({0}) - 1.0) * {0} / tl.log(tl.exp({0}))))"),
        "log1p": ("tl.where(tl.abs({0}) > 0.5, tl.log(1.0 + {0}), tl.where(1.0 + {0} == 1.0, {0}, "
                  "tl.log(1.0 + {0}) * {0} / ((1.0 + {0}) - 1.0)))"),
        # float pow through exp2/log2: the sign for negative bases (-0.0 included) raised to odd
        # integers, NaN for finite negative bases raised to non-integers (the exponent is made a
        # block with zeros_like, since it may be a Python scalar)
        "pow": (
                "tl.where(({1} == 0) | ({0} == 1.0), 1.0, tl.where(({0} < 0) & (tl.floor(({1} + "
                'tl.zeros_like({0} + {1}))) != ({1} + tl.zeros_like({0} + {1}))) & ({0} != float("-inf")), '
                'float("nan"), tl.where((tl.floor(({1} + tl.zeros_like({0} + {1}))) == ({1} + '
                "tl.zeros_like({0} + {1}))) & (tl.floor(({1} + tl.zeros_like({0} + {1})) * 0.5) * 2.0 != ({1} "
                "+ tl.zeros_like({0} + {1}))) & (({0} < 0) | (1.0 / {0} < 0)), -1.0, 1.0) * tl.exp2({1} "
                "* tl.log2(tl.abs({0})))))"),
        "fmod": "({0} % {1})",  # floats (frem, C semantics); integers: int_division below
        "bitwise_and": "({0} & {1})",
        "bitwise_or": "({0} | {1})",
        "bitwise_xor": "({0} ^ {1})",
        "bitwise_not": "(~{0})",
    }

    # Compiled Triton has libdevice (correctly rounded, torch's own accuracy); the interpreter
    # does not, so there the tl.* formulas of TABLE stand in.
    LIBDEVICE = {"tanh": "libdevice.tanh({0})", "pow": "libdevice.pow({0}, {1})",
                 "expm1": "libdevice.expm1({0})", "log1p": "libdevice.log1p({0})"}

    # The interpreter gives a comparison of 0-d values a float handle type, so broadcasting the
    # bool result to a block makes it float and numpy's bitwise ops then reject it. There, bool
    # bitwise ops run on int8 operands (Python bool constants print as 0/1), and pow's operands
    # are made blocks before its formula compares and combines them.
    BOOL_BITWISE = {"bitwise_and": "&", "bitwise_or": "|", "bitwise_xor": "^"}

    @staticmethod
    def _int8(x: str) -> str:
        return {"True": "1", "False": "0"}.get(x, f"({x}).to(tl.int8)")

    def call(self, op, args, dtype, arg_dtypes):
        if op in ("trunc_div", "fmod") and not dtype.is_floating_point:
            return int_division(op, args[0], args[1], dtype)
        if op in ("shift_left", "shift_right"):
            return shift(op == "shift_left", args[0], args[1], dtype)
        if op == "div" and dtype.is_floating_point and _float_literal(args[1]) == 0.0 \
                and _float_literal(args[0]) is not None:
            # two constants (the mean of an empty dim: 0 / 0): Python, which folds them, raises
            value = torch.tensor(_float_literal(args[0])) / 0.0
            return triton_const(value.item(), dtype)
        if interpreting() and dtype == torch.bool and op in self.BOOL_BITWISE:
            a, b = (self._int8(x) for x in args)
            return f"(({a} {self.BOOL_BITWISE[op]} {b}) != 0)"
        if interpreting() and dtype == torch.bool and op == "bitwise_not":
            return f"({self._int8(args[0])} == 0)"
        if interpreting() and op == "pow":
            block = f"tl.zeros_like({args[0]} + {args[1]})"
            args = [f"({args[0]} + {block})", f"({args[1]} + {block})"]
        if op == "tanh" and interpreting():
            return f"(2.0 * tl.sigmoid(2.0 * {args[0]}) - 1.0)"
        if op in self.LIBDEVICE and not interpreting() and dtype in (torch.float32, torch.float64,
                                                                     torch.float16, torch.bfloat16):
            return self.LIBDEVICE[op].format(*args)
        return super().call(op, args, dtype, arg_dtypes)


def _float_literal(text: str):
    try:
        return float(text)
    except ValueError:
        return None


def _int_literal(text: str):
    try:
        return int(text)
    except ValueError:
        return None


def _zero_division_value(a: str, dtype) -> str:
    """What CUDA eager's integer division and remainder give for a zero divisor (measured with
    torch 2.11: tests/inductor/test_int_division.py CUDA_EAGER_BY_ZERO): all ones,
    except that int64's emulated divide gives 2**32 - 1 for a dividend in [0, 2**32)."""
    if dtype == torch.int64:
        literal = _int_literal(a)
        if literal is not None:
            return "4294967295" if 0 <= literal < 1 << 32 else "-1"
        # 2**32 - 1 for a dividend in [0, 2**32), else -1 (written with a bitwise or: a literal
        # over 2**31 is uint32 in Triton, and a where of it with -1 does not type)
        return f"(((({a} >> 32) == 0).to(tl.int64) - 1) | 4294967295)"
    return "-1" if dtype.is_signed else str((1 << (8 * dtype.itemsize)) - 1)


def shift(left: bool, a: str, b: str, dtype) -> str:
    """``a << b`` / ``a >> b`` as eager's: a count outside [0, bits) gives 0 (left) or the
    sign fill (right: ``a >> (bits - 1)``, 0 unsigned), where LLVM's shift is poison. ``a * 0``
    is a zero of a's type."""
    bits = 8 * dtype.itemsize
    sign = "<<" if left else ">>"
    fill = f"({a} >> {bits - 1})" if not left and dtype.is_signed else f"({a} * 0)"
    count = _int_literal(b)
    if count is not None:
        return f"({a} {sign} {b})" if 0 <= count < bits else fill
    ok = f"(({b} >= 0) & ({b} < {bits}))"
    return f"tl.where({ok}, {a} {sign} tl.where({ok}, {b}, 0), {fill})"


def int_division(op: str, a: str, b: str, dtype) -> str:
    """Integer ``trunc_div`` (``a // b`` rounds toward zero in Triton) or ``fmod`` (``%``, the
    sign of the dividend) that never divides by zero nor MIN by -1: on the GPU both are
    undefined (LLVM folds a constant one to poison), and the interpreter's numpy warns. A zero
    divisor gives CUDA eager's value (eager does not raise on CUDA), MIN // -1 wraps to MIN and
    its remainder is 0, as in eager. A constant divisor costs nothing: its case is chosen here."""
    sign = "//" if op == "trunc_div" else "%"
    by_minus_one = f"(-{a})" if op == "trunc_div" else f"({a} * 0)"
    divisor = _int_literal(b)
    if divisor == 0:
        return _zero_division_value(a, dtype)
    if divisor == -1 and dtype.is_signed:
        return by_minus_one
    if divisor is not None:
        return f"({a} {sign} {b})"
    if dtype.is_signed:
        safe = f"tl.where(({b} == 0) | ({b} == -1), 1, {b})"
        value = f"tl.where({b} == -1, {by_minus_one}, {a} {sign} {safe})"
    else:
        value = f"({a} {sign} tl.where({b} == 0, 1, {b}))"
    return f"tl.where({b} == 0, {_zero_division_value(a, dtype)}, {value})"


def triton_const(value, dtype) -> str:
    if dtype == torch.bool:
        return "True" if value else "False"
    if dtype.is_floating_point:
        v = float(value)
        if math.isinf(v):
            return 'float("inf")' if v > 0 else 'float("-inf")'
        if math.isnan(v):
            return 'float("nan")'
        return repr(v)
    return repr(int(value))


def interpreter_bf16(x: str) -> str:
    """float32 -> bfloat16 with round-to-nearest-even. The interpreter's own conversion
    truncates; compiled Triton rounds correctly, so this is only emitted when interpreting."""
    bits = f"{x}.to(tl.uint32, bitcast=True)"
    rounded = f"(({bits} + 0x7FFF + (({bits} >> 16) & 1)) >> 16).to(tl.uint16).to(tl.bfloat16, bitcast=True)"
    return f"tl.where({x} != {x}, {x}.to(tl.bfloat16), {rounded})"


def triton_index_value(e, printer, ranges) -> str:
    index = ir.simplify_index(e.index, ranges)
    if not index.free_symbols:
        return triton_const(int(index), e.dtype)
    # tl.cast, not .to(): Triton passes an int argument equal to 1 as a constexpr Python int,
    # which has no .to(); an index of only such symbols is then a Python int.
    return f"tl.cast({printer.doprint(index)}, {TL_DTYPES[compute_dtype(e.dtype)]})"


def triton_bounds_check(reg: str, bound: int) -> list[str]:
    return [f'tl.device_assert((({reg} >= 0) & ({reg} < {bound})) | ~xmask, '
            f'"kiln: index out of bounds for a dimension of size {bound}")']


def triton_cast(x: str, src: torch.dtype, dst: torch.dtype) -> str:
    if dst == torch.bool:
        return f"({x} != 0)"
    if dst == torch.bfloat16 and interpreting():
        if src != torch.float32 and src not in LOW_PRECISION:
            x = f"{x}.to(tl.float32)"
        return f"{interpreter_bf16(x)}.to(tl.float32)"
    if dst in LOW_PRECISION:  # round to the narrow type, keep computing in float32
        return f"{x}.to({TL_DTYPES[dst]}).to(tl.float32)"
    return f"{x}.to({TL_DTYPES[dst]})"


class TritonKernel:
    """A generated kernel plus what the wrapper needs to launch it: pointer args (buffer
    names), then integer scalars, then constexpr block sizes, over a 1-D grid."""
    __slots__ = ("name", "source", "args", "scalars", "constexprs", "grid", "num_warps", "origins", "tune")

    def __init__(self, name, source, args, scalars, constexprs, grid, num_warps, origins):
        self.name, self.source, self.args = name, source, args
        self.scalars, self.constexprs, self.grid = scalars, constexprs, grid
        self.num_warps, self.origins = num_warps, origins
        self.tune = None  # a tuning.TuneSpec: launched through Autotuned.run

    def with_tuning(self, variants):
        """Tune over [(source, [config, ...])] (the first source is this kernel's own)."""
        if not tuning.enabled():
            return self
        self.tune = tuning.TuneSpec(self.name, variants, self.scalars)
        return self

    def launch_line(self) -> str:
        if self.tune is not None:
            args = ", ".join(list(self.args) + [str(s) for s in self.scalars])
            return f"{self.name}.run({args})"
        args = ", ".join(list(self.args) + [str(s) for s in self.scalars] +
                         [f"{k}={v}" for k, v in self.constexprs.items()])
        return f"{self.name}[({self.grid},)]({args}, num_warps={self.num_warps})"


def _block_config(numel: int) -> tuple[int, int]:
    if numel >= 1 << 20:
        return 1024, 4
    xblock = 1 << max(4, (numel - 1).bit_length()) if numel > 1 else 16
    xblock = min(xblock, 1024)
    return xblock, (4 if xblock >= 512 else 2 if xblock >= 128 else 1)


def _depends_on_index(expr) -> bool:
    for e in ir.walk(expr):
        if isinstance(e, (ir.Load, ir.IndexValue)) and ir.loop_symbols(e.index):
            return True
    return False


# (and, not) over Triton mask texts: KernelWriter.guard_ops
TRITON_GUARD_OPS = (lambda a, b: f"({a} & {b})", lambda c: f"({c} == 0)")


def generate_triton(kernel, buffers: dict) -> TritonKernel:
    if kernel.is_reduction:
        from kiln.inductor.codegen.triton_reduction import generate_triton_reduction
        return generate_triton_reduction(kernel, buffers)
    printer = IndexPrinter("//")
    shape = kernel.shape
    numel = math.prod(shape)
    symbolic = is_symbolic(numel)
    name = f"kiln_{kernel.name}"
    ranges = ir.ranges_of(shape)
    from kiln.inductor.codegen import triton_tiled
    tile = triton_tiled.tile_plan(kernel, shape, ranges) if config.triton_tile_2d and not symbolic else None
    body_lines, in_names, out_names = _pointwise_body(kernel, ranges, printer, tile)
    index_lines = [] if tile else _flat_index_lines(shape, symbolic, printer)  # a tile has its own
    sizes = size_params(index_lines + body_lines)
    params = list(in_names.values()) + list(out_names.values()) + sizes
    # symbolic sizes: 64-bit index math (the kernel must serve every size)
    wide = symbolic or numel * 8 >= 2 ** 31 or any(
        sum(abs(s) * (d - 1) for s, d in zip(buffers[b].stride, buffers[b].shape)) >= 2 ** 31
        for b in list(in_names) + list(out_names))
    pid = "tl.program_id(0).to(tl.int64)" if wide else "tl.program_id(0)"
    jit = "@triton.jit(debug=True)" if any("tl.device_assert" in ln for ln in body_lines) else "@triton.jit"
    if tile:
        lines = [jit, f"def {name}({', '.join(params + ['xnumel', 'XBLOCK: tl.constexpr', 'YBLOCK: tl.constexpr'])}):"]
        lines += ["    " + ln for ln in triton_tiled.tiled_index_lines(shape, tile, pid)]
    else:
        lines = [
            jit,
            f"def {name}({', '.join(params + ['xnumel', 'XBLOCK: tl.constexpr'])}):",
            f"    xoffset = {pid} * XBLOCK",
            "    xindex = xoffset + tl.arange(0, XBLOCK)",
        ]
        if symbolic:
            lines.append("    xmask = xindex < xnumel")
        else:  # a config whose XBLOCK divides the elements has no ragged edge (a static if in Triton)
            lines += [f"    if {numel} % XBLOCK == 0:",
                      "        xmask = tl.full([XBLOCK], 1, tl.int1)",
                      "    else:",
                      "        xmask = xindex < xnumel"]
    lines += ["    " + ln for ln in index_lines + body_lines]
    header = ["import triton", "import triton.language as tl"]
    if any("libdevice." in ln for ln in body_lines):
        header.append("from triton.language.extra import libdevice")
    if kernel.origins:
        header.append("")
        header += [f"# from: {o}" for o in kernel.origins]
    source = "\n".join(header) + "\n\n\n" + "\n".join(lines) + "\n"
    args = list(in_names) + list(out_names)
    if tile:  # (never symbolic)
        yblock, xblock, warps = triton_tiled.tile_blocks(shape, tile)
        return TritonKernel(name, source, args, sizes + [numel], {"XBLOCK": xblock, "YBLOCK": yblock},
                            triton_tiled.tile_grid(shape, tile, yblock, xblock), warps, list(kernel.origins))
    return _pointwise_kernel(kernel, name, source, args, sizes)


def _pointwise_body(kernel, ranges, printer, tile) -> tuple[list, dict, dict]:
    """(the lines computing and storing every node of a pointwise kernel, the input pointers by
    buffer, the output pointers by buffer); a ``tile`` plan (triton_tiled) makes blocks 2D."""
    in_names: dict[str, str] = {}
    out_names: dict[str, str] = {}
    tile_syms = {ir.index_symbol(d) for d in tile} if tile else set()
    block = "[YBLOCK, XBLOCK]" if tile else "[XBLOCK]"

    def ptr(buf):
        if buf not in in_names:
            in_names[buf] = f"in_ptr{len(in_names)}"
        return in_names[buf]

    def block_offset(index) -> str:
        """An offset over the program's scalars only (the untiled dims of a tile) as a block."""
        text = printer.doprint(index)
        if tile and not (index.free_symbols & tile_syms):
            text += f" + tl.zeros({block}, tl.int32)"
        return text

    def load(ld: ir.Load):
        index = ir.simplify_index(ld.index, ranges)
        # A load at a fixed address (a broadcast scalar) is one scalar load, not a masked block.
        mask = ""
        if ir.loop_symbols(index):
            mask = ", xmask, other=0" if writer.guard is None else f", xmask & {writer.guard}, other=0"
            text = f"tl.load({ptr(ld.buffer)} + ({block_offset(index)}){mask})"
        else:
            text = f"tl.load({ptr(ld.buffer)} + ({printer.doprint(index)}))"
        if ld.dtype in LOW_PRECISION:
            text += ".to(tl.float32)"
        return text

    writer = KernelWriter(TritonOps(), load, triton_const, triton_cast,
                          lambda n, text, dtype: f"{n} = {text}")
    writer.canon = ir.canonical_index_fn(ranges)
    writer.index_value_fn = lambda e: triton_index_value(e, printer, ranges)
    writer.bounds_check = triton_bounds_check
    writer.guard_ops = TRITON_GUARD_OPS if config.triton_guarded_loads else None
    stores = set(kernel.stores)
    for node in kernel.nodes:
        value = writer.emit(kernel.body(node))  # in the kernel's symbols (horizontal fusion remaps)
        if not _depends_on_index(node.body):  # a scalar value still needs a block to store
            value = writer._tmp(f"tl.zeros({block}, {TL_DTYPES[compute_dtype(node.dtype)]}) + {value}",
                                node.dtype)
        index = kernel.store_index(node)
        writer.in_registers[(node.name, writer.canon(index))] = value
        if node.name in stores:
            out = out_names.setdefault(node.name, f"out_ptr{len(out_names)}")
            if node.dtype == torch.bfloat16 and interpreting():
                value = writer._tmp(interpreter_bf16(value), node.dtype)
            simple = ir.simplify_index(index, ranges)
            offset = block_offset(simple)
            if not ir.loop_symbols(simple):  # scalar address: make a block
                offset += f" + tl.zeros({block}, tl.int32)"
            writer.lines.append(f"tl.store({out} + ({offset}), {value}, xmask)")
    return writer.lines, in_names, out_names


def _flat_index_lines(shape, symbolic: bool, printer) -> list[str]:
    """Each dim's index from the flat element index ``xindex`` (row-major)."""
    index_lines = []
    if len(shape) == 1:
        index_lines.append("i0 = xindex")
    elif len(shape) > 1:
        inner = 1
        for k in range(len(shape) - 1, -1, -1):
            size, inner_text = size_text(shape[k], printer), size_text(inner, printer)
            if k == 0:
                index_lines.append(f"i0 = xindex // {inner_text}" if symbolic or inner > 1 else "i0 = xindex")
            elif inner == 1:
                index_lines.append(f"i{k} = xindex % {size}")
            else:
                index_lines.append(f"i{k} = (xindex // {inner_text}) % {size}")
            inner = inner * shape[k]
    return index_lines


def _pointwise_kernel(kernel, name, source, args, sizes) -> TritonKernel:
    """The kernel with its launch: block sizes, grid and warps (tuning configs when large)."""
    shape = kernel.shape
    numel = math.prod(shape)
    if is_symbolic(numel):  # launched with the sizes of the call: scalars and grid are wrapper expressions
        xblock, warps = 1024, 4
        return TritonKernel(name, source, args, sizes + [py(numel)],
                            {"XBLOCK": xblock}, f"-(-({py(numel)}) // {xblock})", warps,
                            list(kernel.origins))
    xblock, warps = _block_config(numel)
    # static ranges, but symbolic sizes used as values (``y * n``) still come in as arguments
    gen = TritonKernel(name, source, args, sizes + [numel], {"XBLOCK": xblock},
                       -(-numel // xblock), warps, list(kernel.origins))
    if numel >= POINTWISE_TUNE_MIN:
        gen.with_tuning([(source, pointwise_configs(numel))])
    return gen


POINTWISE_TUNE_MIN = 1 << 16  # smaller kernels are launch-bound: the heuristic is as good


def pointwise_configs(numel: int) -> list[dict]:
    return [{"XBLOCK": xb, "num_warps": w} for xb, w in ((256, 2), (512, 4), (1024, 4), (1024, 8),
                                                          (2048, 8), (4096, 16)) if xb <= max(256, numel)]
