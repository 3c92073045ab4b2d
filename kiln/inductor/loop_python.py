"""The loop IR as runnable Python over torch tensors (``Kernel.python()``).

A kernel of the loop IR says what each element is; the generated Triton and C++ say how a
machine computes it. This module prints the first as plain Python, one whole-tensor statement
per IR expression, so a reader can run a kernel, print its intermediate values and compare
them with the generated kernel's (tests/inductor/test_loop_python.py does, for every kernel
kind). It is a reference, not a backend: nothing on the compile path calls it.

How a kernel reads as Python:

* the index symbols ``i0 .. i{n-1}`` of the kernel's full space are broadcastable ``arange``s
  (``grid``), so an index expression is an int64 tensor over the space;
* a buffer is addressed the way the kernels address it, by element offset from its first
  element (``load``/``store`` view the tensor as its flat extent);
* a scalar op ``Call(op, ...)`` is the prim of that name, run eagerly (``prims.exp(t0)``: the
  op's eager rule in ``kiln/ops``, not a second spelling here);
* a reduction reduces its body over the reduced dims, kept as size 1 so per-row values
  broadcast against the full space (``reduce``);
* a value computed inside the kernel is read from its variable, not from memory, exactly where
  the scheduler put it in a register.
"""
from __future__ import annotations

import math

import sympy
import torch

from kiln.inductor import ir
from kiln.inductor.codegen.common import IndexPrinter, size_params
from kiln.ops.registry import lookup

HEADER = ("import torch\n"
          "from kiln.inductor.loop_python import (cast, check_index, const, grid, index_value, load,\n"
          "                                       prims, rand, reduce, scatter_add, store)\n")

_PRINTER = IndexPrinter("//")  # Python's // and % on int64 tensors are sympy's floor and Mod


class PythonKernel:
    """One kernel's Python: what the wrapper needs to call it (as ``CppKernel``: the buffers it
    takes, in order, then the size symbols)."""
    __slots__ = ("name", "source", "args", "sizes", "checked", "origins")

    def __init__(self, name, source, args, sizes, origins=()):
        self.name, self.source, self.args, self.sizes = name, source, list(args), list(sizes)
        self.checked = False  # check_index raises itself
        self.origins = list(origins)

    def __str__(self):
        return self.source


def _literal(value) -> str:
    if isinstance(value, float) and not math.isfinite(value):
        return f"float({str(value)!r})"
    return repr(value)


def _dtype(dtype) -> str:
    return str(dtype)  # torch.float32


class _Writer:
    """Prints the statements of one kernel: each expression once (by its text), named ``t<k>``."""

    def __init__(self, ranges):
        self.lines: list[str] = []
        self.names: dict[str, str] = {}
        self.values: dict[str, tuple[str, sympy.Expr]] = {}  # in-kernel buffer -> (var, index)
        self.canon = ir.canonical_index_fn(ir.ranges_of(ranges))

    def index(self, expr) -> str:
        return _PRINTER.doprint(sympy.sympify(expr))

    def tmp(self, text: str) -> str:
        name = self.names.get(text)
        if name is None:
            name = self.names[text] = f"t{len(self.names)}"
            self.lines.append(f"{name} = {text}")
        return name

    def emit(self, expr: ir.Expr) -> str:
        if isinstance(expr, ir.Load):
            return self._load(expr)
        if isinstance(expr, ir.Const):
            return f"const({_literal(expr.value)}, {_dtype(expr.dtype)})"
        if isinstance(expr, ir.IndexValue):
            return self.tmp(f"index_value({self.index(expr.index)}, {_dtype(expr.dtype)})")
        if isinstance(expr, ir.Let):
            value = self.emit(expr.value)
            self.lines.append(f"{expr.symbol} = check_index({value}, {self.index(expr.bound)}, "
                              f"wrap_negative={expr.wrap_negative})")
            return self.emit(expr.body)
        if isinstance(expr, ir.Call):
            args = [self.emit(a) for a in expr.args]
            if expr.op == "cast":
                return self.tmp(f"cast({args[0]}, {_dtype(expr.dtype)})")
            if expr.op == "rand":  # the scalar op, not prims.rand (a whole-tensor factory)
                return self.tmp(f"rand({', '.join(args)})")
            try:
                lookup("prims", expr.op)
            except KeyError:
                raise NotImplementedError(f"[loop_python] no prim named {expr.op!r} runs scalar op "
                                          f"{expr.op!r}") from None
            return self.tmp(f"prims.{expr.op}({', '.join(args)})")
        raise NotImplementedError(f"[loop_python] cannot print {expr!r}")

    def _load(self, ld: ir.Load) -> str:
        inside = self.values.get(ld.buffer)
        if inside is None:
            return self.tmp(f"load({ld.buffer}, {self.index(ld.index)})")
        var, index = inside
        if self.canon(ld.index) != index:  # the scheduler fuses only reads where the value is
            raise NotImplementedError(f"[loop_python] {ld!r} reads {ld.buffer} away from where "
                                      f"this kernel computes it ({index})")
        return var


def _sizes(ranges) -> str:
    """A tuple of sizes as source (symbolic sizes print over the kernel's s0, s1 ...)."""
    items = [_PRINTER.doprint(sympy.sympify(s)) for s in ranges]
    return f"({items[0]},)" if len(items) == 1 else f"({', '.join(items)})"


def _grid_line(ranges, device) -> str:
    syms = ", ".join(f"i{k}" for k in range(len(ranges)))
    return f"{syms}{',' if len(ranges) == 1 else ''} = grid({_sizes(ranges)}, {str(device)!r})"


def _function(name, args, body: list[str], comment: str) -> tuple[str, list[str]]:
    sizes = size_params(body)
    head = f"def {name}({', '.join(list(args) + sizes)}):"
    return "\n".join([head, f"    # {comment}"] + ["    " + ln for ln in body]) + "\n", sizes


def kernel_python(kernel) -> PythonKernel:
    """A scheduler ``Kernel`` (pointwise or reduction) or ``ScatterStep`` as Python."""
    if hasattr(kernel, "node"):
        return _scatter_python(kernel)
    w = _Writer(kernel.ranges)
    w.lines.append(_grid_line(kernel.ranges, kernel.device))
    for node in kernel.nodes:
        value = w.emit(kernel.body(node))
        var = f"{node.name}_v"
        if kernel.levels[node.name] == "red":
            w.lines.append(f"{var} = reduce({node.reduction_type!r}, {value}, {tuple(node.reduced_dims)}, "
                           f"{_sizes(kernel.ranges)}, {_dtype(node.dtype)})")
        else:
            w.lines.append(f"{var} = {value}")
        index = w.canon(kernel.store_index(node))
        w.values[node.name] = (var, index)
        if node.name in kernel.stores:
            w.lines.append(f"store({node.name}, {w.index(kernel.store_index(node))}, {var})")
    args = sorted(kernel.reads()) + list(kernel.stores)
    red = f", reducing dims {list(kernel.reduced_dims)}" if kernel.reduced_dims else ""
    levels = ", ".join(f"{n.name}:{kernel.levels[n.name]}" for n in kernel.nodes)
    comment = f"over [{', '.join(map(str, kernel.ranges))}]{red}; nodes {levels}"
    source, sizes = _function(kernel.name, args, w.lines, comment)
    return PythonKernel(kernel.name, HEADER + "\n\n" + source, args, sizes, kernel.origins)


def _scatter_python(step) -> PythonKernel:
    node = step.node
    w = _Writer(node.src_ranges)
    w.lines.append(_grid_line(node.src_ranges, node.device))
    w.emit(node.slot)  # binds the index read from memory, checked against its bound
    value = w.emit(node.value)
    write = "store" if node.mode == "store" else "scatter_add"
    w.lines.append(f"{write}({node.target}, {w.index(node.index)}, {value})")
    args = sorted(step.reads() - {node.target}) + [node.target]
    comment = f"scatter-{node.mode} over [{', '.join(map(str, node.src_ranges))}] into {node.target}"
    source, sizes = _function(step.name, args, w.lines, comment)
    return PythonKernel(step.name, HEADER + "\n\n" + source, args, sizes, node.origins)


# ------------------------------------------------------------------ what the printout calls
class _Prims:
    """``prims.<name>``: the eager rule of the prim of that name."""

    def __getattr__(self, name):
        return lookup("prims", name).eager


prims = _Prims()


def grid(ranges, device):
    """One broadcastable int64 ``arange`` per dim of the space."""
    n = len(ranges)
    out = []
    for k, size in enumerate(ranges):
        shape = [1] * n
        shape[k] = int(size)
        out.append(torch.arange(int(size), dtype=torch.int64, device=device).view(shape))
    return tuple(out)


def _flat(t: torch.Tensor) -> torch.Tensor:
    """t's memory from its first element to its last, as the kernels address it."""
    extent = 0 if t.numel() == 0 else 1 + sum((s - 1) * st for s, st in zip(t.shape, t.stride()))
    return t.as_strided((extent,), (1,))


def load(t: torch.Tensor, index):
    """t's elements at element offsets ``index``. An offset outside t is read clamped: only a
    ``where`` lane that discards it computes one (a cat's or a pad's other source), which the
    generated kernels mask instead of reading."""
    flat = _flat(t)
    index = torch.as_tensor(index, device=t.device)
    return flat[index.clamp(0, max(flat.numel() - 1, 0))]


def store(t: torch.Tensor, index, value):
    index = torch.as_tensor(index, device=t.device)
    value = torch.as_tensor(value, device=t.device)
    shape = torch.broadcast_shapes(index.shape, value.shape)
    _flat(t)[index.expand(shape)] = value.expand(shape).to(t.dtype)


def scatter_add(t: torch.Tensor, index, value):
    index = torch.as_tensor(index, device=t.device)
    value = torch.as_tensor(value, device=t.device)
    shape = torch.broadcast_shapes(index.shape, value.shape)
    _flat(t).index_put_((index.expand(shape).reshape(-1),), value.expand(shape).reshape(-1).to(t.dtype),
                        accumulate=True)


def const(value, dtype):
    return torch.tensor(value, dtype=dtype)


def cast(x, dtype):
    return torch.as_tensor(x).to(dtype)


def index_value(index, dtype):
    return torch.as_tensor(index).to(dtype)


def check_index(value, bound, wrap_negative=False):
    """An index read from memory, as eager checks it (gather, embedding, scatter)."""
    value = torch.as_tensor(value).to(torch.int64)
    if wrap_negative:
        value = torch.where(value < 0, value + bound, value)
    if bool(((value < 0) | (value >= bound)).any()):
        raise IndexError(f"kiln loop_python: an index read from memory is out of range [0, {bound})")
    return value


def reduce(kind: str, value, dims, ranges, dtype):
    """``kind`` over ``dims`` of the full space ``ranges``, the reduced dims kept as size 1;
    argmax/argmin give the offset in the reduced dims flattened row-major."""
    value = torch.as_tensor(value).expand(tuple(int(s) for s in ranges))
    kept = [d for d in range(value.dim()) if d not in dims]
    rows = value.permute(kept + list(dims)).reshape([value.shape[d] for d in kept] + [-1])
    if kind == "sum":
        out = rows.sum(-1, dtype=dtype if dtype.is_floating_point else None)
    elif kind == "prod":
        out = rows.prod(-1)
    elif kind in ("max", "min"):
        out = rows.amax(-1) if kind == "max" else rows.amin(-1)
    elif kind in ("argmax", "argmin"):
        out = rows.argmax(-1) if kind == "argmax" else rows.argmin(-1)
    else:
        raise NotImplementedError(f"[loop_python] reduction {kind!r}")
    keep = [1 if d in dims else value.shape[d] for d in range(value.dim())]
    return out.to(dtype).reshape(keep)


def rand(seed, stream, index):
    """Uniform [0, 1) per (seed + stream, element index): a hash, not the kernels' Philox stream,
    so a random kernel's Python matches its distribution, never its bits."""
    g = torch.Generator().manual_seed(int(torch.as_tensor(seed).reshape(-1)[0]) + int(torch.as_tensor(stream)))
    index = torch.as_tensor(index)
    draws = torch.rand(int(index.max()) + 1 if index.numel() else 0, generator=g)
    return draws[index]
