"""Triton code generation for reduction kernels.

Each program takes ``XBLOCK`` rows (the kept dims, flattened) as a ``[XBLOCK, 1]`` column and
walks the reduced dims (flattened) as a ``[1, RBLOCK]`` row.

* **Persistent** (the whole reduced extent fits one block): every value of the row stays in
  registers, so a chain like softmax (max, then sum of exp(x - max), then the division) is
  straight-line code with one load of ``x``.
* **Looped** (long rows): one loop over the reduced extent per *pass* (see
  ``common.plan_phases``); per-element values needed by a later pass are recomputed there,
  accumulators live in ``[XBLOCK, RBLOCK]`` registers and are combined at the end of the pass.
"""
from __future__ import annotations

import math

import torch

from kiln.config import config
from kiln.inductor import ir
from kiln.inductor.codegen.common import (IDENTITY, LOW_PRECISION, IndexPrinter, KernelWriter,
                                          compute_dtype, decompose_index, plan_phases)
from kiln.inductor.codegen.triton import (TL_DTYPES, TritonKernel, TritonOps, interpreter_bf16,
                                          interpreting, triton_bounds_check, triton_cast, triton_const,
                                          triton_index_value)

COMBINE_FNS = {
    "max": ("_kiln_max", "tl.where((a > b) | (a != a), a, b)"),
    "min": ("_kiln_min", "tl.where((a < b) | (a != a), a, b)"),
    "prod": ("_kiln_prod", "a * b"),
}


def _pow2(n: int) -> int:
    return 1 << max(0, (max(n, 1) - 1).bit_length())


def block_config(xnumel: int, rnumel: int):
    """(persistent?, XBLOCK, RBLOCK, num_warps)."""
    rblock = _pow2(rnumel)
    if rblock <= config.triton_max_persistent_rblock:
        xblock = max(1, min(_pow2(xnumel), max(1, 4096 // rblock), 64))
        warps = 8 if rblock >= 2048 else 4 if rblock * xblock >= 512 else 2
        return True, xblock, rblock, warps
    return False, 1, min(config.triton_looped_rblock, rblock), 8


def generate_triton_reduction(kernel, buffers: dict) -> TritonKernel:
    printer = IndexPrinter("//")
    name = f"kiln_{kernel.name}"
    ranges = ir.ranges_of(kernel.ranges)
    xshape, rshape = kernel.xshape, kernel.rshape
    xnumel, rnumel = math.prod(xshape), math.prod(rshape)
    persistent, xblock, rblock, warps = block_config(xnumel, rnumel)
    red_syms = {ir.index_symbol(d) for d in kernel.reduced_dims}
    in_names: dict[str, str] = {}
    out_names: dict[str, str] = {}
    combine_used: set[str] = set()

    def ptr(buf):
        return in_names.setdefault(buf, f"in_ptr{len(in_names)}")

    def mask_for(index) -> str:
        syms = index.free_symbols
        if not syms:
            return ""
        return ", xmask & rmask, other=0" if syms & red_syms else ", xmask, other=0"

    def load(ld: ir.Load):
        index = ir.simplify_index(ld.index, ranges)
        text = f"tl.load({ptr(ld.buffer)} + ({printer.doprint(index)}){mask_for(index)})"
        if ld.dtype in LOW_PRECISION:
            text += ".to(tl.float32)"
        return text

    writer = KernelWriter(TritonOps(), load, triton_const, triton_cast,
                          lambda n, text, dtype: f"{n} = {text}")

    writer.canon = ir.canonical_index_fn(ranges)
    writer.index_value_fn = lambda e: triton_index_value(e, printer, ranges)
    inside = {n.name: n for n in kernel.nodes}

    def recompute(ld: ir.Load):
        producer = inside.get(ld.buffer)
        if producer is None or kernel.levels[producer.name] != "r":
            return None
        index = writer.canon(kernel.store_index(producer))
        if writer.canon(ld.index) != index:
            return None
        value = writer.emit(kernel.body(producer))
        writer.in_registers[(producer.name, index)] = value
        return value

    writer.recompute = recompute
    writer.bounds_check = triton_bounds_check
    lines = writer.lines

    def emit_value(node):
        value = writer.emit(kernel.body(node))
        writer.in_registers[(node.name, writer.canon(kernel.store_index(node)))] = value
        return value

    def store(node, value, level):
        if node.name not in kernel.stores:
            return
        out = out_names.setdefault(node.name, f"out_ptr{len(out_names)}")
        index = ir.simplify_index(kernel.store_index(node), ranges)
        if node.dtype == torch.bfloat16 and interpreting():
            value = writer._tmp(interpreter_bf16(value), node.dtype)
        shape = "[XBLOCK, RBLOCK]" if level == "r" else "[XBLOCK, 1]"
        mask = "xmask & rmask" if level == "r" else "xmask"
        value = writer._tmp(f"tl.broadcast_to({value}, {shape})", node.dtype)
        offset = printer.doprint(index)
        if not index.free_symbols:  # a scalar address still needs a block of pointers
            offset += f" + tl.zeros({shape}, tl.int32)"
        lines.append(f"tl.store({out} + ({offset}), {value}, {mask})")

    def acc_dtype(node):
        src = node.body.dtype if isinstance(node.body, ir.Expr) else node.dtype
        dt = compute_dtype(src)
        return torch.int8 if dt == torch.bool else dt

    def masked_block(node):
        """The node's per-element value as a full block with masked lanes at the identity."""
        value = writer.emit(kernel.body(node))
        dt = acc_dtype(node)
        value = writer._tmp(f"tl.broadcast_to({value}, [XBLOCK, RBLOCK]).to({TL_DTYPES[dt]})", dt)
        ident = triton_const(IDENTITY[node.reduction_type](dt), dt)
        return writer._tmp(f"tl.where(xmask & rmask, {value}, {ident})", dt), dt

    def finish(node, value):
        """Cast a reduced value to the node's dtype and register it."""
        if node.dtype == torch.bool:
            value = writer._tmp(f"({value} != 0)", node.dtype)
        writer.in_registers[(node.name, writer.canon(kernel.store_index(node)))] = value
        store(node, value, "x")

    def reduce_text(kind, block):
        if kind == "sum":
            return f"tl.sum({block}, 1)[:, None]"
        fn, _ = COMBINE_FNS[kind]
        combine_used.add(kind)
        return f"tl.reduce({block}, 1, {fn})[:, None]"

    arg_dim = f"i{kernel.reduced_dims[0]}" if len(kernel.reduced_dims) == 1 else "rindex"

    def arg_pick(kind, vals, idxs):
        combine_used.add("max" if kind == "argmax" else "min")
        best = writer._tmp(reduce_text("max" if kind == "argmax" else "min", vals), torch.float32)
        hit = f"(({vals} == {best}) | (({best} != {best}) & ({vals} != {vals})))"
        return writer._tmp(f"tl.min(tl.where({hit}, {idxs}, {rnumel}), 1)[:, None]", torch.int64)

    head = [
        f"xoffset = tl.program_id(0) * XBLOCK",
        "xindex = xoffset + tl.arange(0, XBLOCK)[:, None]",
        "xmask = xindex < xnumel",
    ]
    head += [f"i{d} = {e}" for d, e in decompose_index("xindex", xshape, kernel.kept_dims, "//")]
    rsetup = [f"rmask = rindex < rnumel"]
    rsetup += [f"i{d} = {e}" for d, e in decompose_index("rindex", rshape, kernel.reduced_dims, "//")]

    if persistent:
        lines += head + ["rindex = tl.arange(0, RBLOCK)[None, :]"] + rsetup
        for node in kernel.nodes:
            level = kernel.levels[node.name]
            if level == "red":
                kind = node.reduction_type
                block, dt = masked_block(node)
                if kind in ("argmax", "argmin"):
                    value = arg_pick(kind, block, arg_dim)
                else:
                    value = writer._tmp(reduce_text(kind, block), dt)
                finish(node, value)
            else:
                store(node, emit_value(node), level)
    else:
        lines += head
        pre, phases = plan_phases(kernel)
        for node in pre:
            store(node, emit_value(node), "x")
        for phase in phases:
            accs = {}
            for node in phase.reductions:
                dt = acc_dtype(node)
                ident = triton_const(IDENTITY[node.reduction_type](dt), dt)
                acc = writer._tmp(f"tl.full([XBLOCK, RBLOCK], {ident}, {TL_DTYPES[dt]})", dt)
                writer.cache.pop(f"tl.full([XBLOCK, RBLOCK], {ident}, {TL_DTYPES[dt]})", None)
                idx = None
                if node.reduction_type in ("argmax", "argmin"):
                    idx = writer._tmp(f"tl.zeros([XBLOCK, RBLOCK], tl.int64) + {rnumel}", torch.int64)
                    writer.cache.pop(f"tl.zeros([XBLOCK, RBLOCK], tl.int64) + {rnumel}", None)
                accs[node.name] = (acc, idx, dt)
            lines.append("for roffset in range(0, rnumel, RBLOCK):")
            writer.push_scope()
            start = len(lines)
            lines += ["rindex = roffset + tl.arange(0, RBLOCK)[None, :]"] + rsetup
            for node in phase.reductions:
                acc, idx, dt = accs[node.name]
                block, _ = masked_block(node)
                kind = node.reduction_type
                if kind == "sum":
                    lines.append(f"{acc} = {acc} + {block}")
                elif kind in ("argmax", "argmin"):
                    cmp = ">" if kind == "argmax" else "<"
                    better = f"(({block} {cmp} {acc}) | (({block} != {block}) & ({acc} == {acc})))"
                    upd = writer._tmp(f"(xmask & rmask) & {better}", torch.bool)
                    lines.append(f"{idx} = tl.where({upd}, {arg_dim} + tl.zeros([XBLOCK, RBLOCK], tl.int64), {idx})")
                    lines.append(f"{acc} = tl.where({upd}, {block}, {acc})")
                else:
                    lines.append(f"{acc} = {_combine_inline(kind, acc, block)}")
            for node in phase.stores:
                store(node, emit_value(node), "r")
            for k in range(start, len(lines)):
                lines[k] = "    " + lines[k]
            writer.pop_scope()
            for node in phase.reductions:
                acc, idx, dt = accs[node.name]
                kind = node.reduction_type
                if kind in ("argmax", "argmin"):
                    value = arg_pick(kind, acc, idx)
                else:
                    value = writer._tmp(reduce_text(kind, acc), dt)
                finish(node, value)
            for node in phase.after:
                store(node, emit_value(node), "x")

    params = list(in_names.values()) + list(out_names.values())
    sig = ", ".join(params + ["xnumel", "rnumel", "XBLOCK: tl.constexpr", "RBLOCK: tl.constexpr"])
    src = ["import triton", "import triton.language as tl"]
    if any("libdevice." in ln for ln in lines):
        src.append("from triton.language.extra import libdevice")
    if kernel.origins:
        src.append("")
        src += [f"# from: {o}" for o in kernel.origins]
    for kind in sorted(combine_used):
        fn, body = COMBINE_FNS[kind]
        src += ["", "", "@triton.jit", f"def {fn}(a, b):", f"    return {body}"]
    jit = "@triton.jit(debug=True)" if any("tl.device_assert" in ln for ln in lines) else "@triton.jit"
    src += ["", "", jit, f"def {name}({sig}):"] + ["    " + ln for ln in lines]
    source = "\n".join(src) + "\n"
    return TritonKernel(name, source, list(in_names) + list(out_names), [xnumel, rnumel],
                        {"XBLOCK": xblock, "RBLOCK": rblock}, -(-xnumel // xblock), warps,
                        list(kernel.origins))


def _combine_inline(kind, acc, value):
    if kind == "max":
        return f"tl.where(({acc} > {value}) | ({acc} != {acc}), {acc}, {value})"
    if kind == "min":
        return f"tl.where(({acc} < {value}) | ({acc} != {acc}), {acc}, {value})"
    if kind == "prod":
        return f"{acc} * {value}"
    raise NotImplementedError(f"[codegen:triton] no combine rule for reduction {kind!r}")
