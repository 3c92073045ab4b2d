"""What the Triton and C++ code generators share: index printing and expression emission.

Each backend supplies one rule table (``ScalarOps``): how each scalar op of the loop IR is
spelled, how a load, a store and a constant are written. ``KernelWriter`` walks the fused
kernel's expressions once, with common-subexpression elimination, and asks the table for text.
"""
from __future__ import annotations

import sympy
import torch
from sympy.printing.str import StrPrinter

from kiln.inductor import ir

LOW_PRECISION = (torch.float16, torch.bfloat16)


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """Half-precision values are computed in float32 and rounded only where stored or cast."""
    return torch.float32 if dtype in LOW_PRECISION else dtype


class IndexPrinter(StrPrinter):
    """sympy -> integer index arithmetic (floor division and modulo on non-negative ints)."""

    def __init__(self, floordiv="//"):
        super().__init__()
        self.floordiv = floordiv

    def _print_floor(self, expr):
        arg = expr.args[0]
        num, den = arg.as_numer_denom()
        if den != 1:
            return f"(({self._print(num)}) {self.floordiv} ({self._print(den)}))"
        return self._print(arg)

    def _print_Mod(self, expr):
        a, b = expr.args
        return f"(({self._print(a)}) % ({self._print(b)}))"

    def _print_Integer(self, expr):
        return str(int(expr))


class ScalarOps:
    """A backend's spelling of scalar ops. Subclasses fill ``TABLE`` (op -> format string)."""
    TABLE: dict[str, str] = {}
    name = "?"

    def call(self, op: str, args: list[str], dtype: torch.dtype, arg_dtypes) -> str:
        try:
            fmt = self.TABLE[op]
        except KeyError:
            raise NotImplementedError(f"[codegen:{self.name}] no rule for scalar op {op!r}") from None
        return fmt.format(*args)


class KernelWriter:
    """Emits the body of one fused kernel: loads, math (CSE'd), stores."""

    def __init__(self, ops: ScalarOps, load_fn, const_fn, cast_fn, declare_fn):
        self.ops = ops
        self.load_fn, self.const_fn, self.cast_fn, self.declare_fn = load_fn, const_fn, cast_fn, declare_fn
        self.lines: list[str] = []
        self.cache: dict[str, str] = {}
        self.counter = 0
        self.in_registers: dict[tuple[str, sympy.Expr], str] = {}

    def _tmp(self, text: str, dtype) -> str:
        hit = self.cache.get(text)
        if hit is not None:
            return hit
        name = f"tmp{self.counter}"
        self.counter += 1
        self.lines.append(self.declare_fn(name, text, dtype))
        self.cache[text] = name
        return name

    def emit(self, expr: ir.Expr) -> str:
        if isinstance(expr, ir.Load):
            reg = self.in_registers.get((expr.buffer, sympy.expand(expr.index)))
            if reg is not None:
                return reg
            return self._tmp(self.load_fn(expr), expr.dtype)
        if isinstance(expr, ir.Const):
            return self.const_fn(expr.value, expr.dtype)
        if isinstance(expr, ir.IndexValue):
            return self._tmp(self.index_value(expr), expr.dtype)
        if isinstance(expr, ir.Call):
            args = [self.emit(a) for a in expr.args]
            if expr.op == "cast":
                return self._tmp(self.cast_fn(args[0], expr.args[0].dtype, expr.dtype), expr.dtype)
            arg_dtypes = [a.dtype for a in expr.args]
            return self._tmp(self.ops.call(expr.op, args, expr.dtype, arg_dtypes), expr.dtype)
        raise NotImplementedError(f"[codegen:{self.ops.name}] cannot emit {expr!r}")

    def index_value(self, expr):
        raise NotImplementedError
