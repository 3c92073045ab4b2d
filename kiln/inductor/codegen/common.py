"""What the Triton and C++ code generators share: index printing and expression emission.

Each backend supplies one rule table (``ScalarOps``): how each scalar op of the loop IR is
spelled, how a load, a store and a constant are written. ``KernelWriter`` walks the fused
kernel's expressions once, with common-subexpression elimination, and asks the table for text.
"""
from __future__ import annotations

import os
import re

import sympy
import torch
from sympy.printing.str import StrPrinter

from kiln.inductor import ir


def interpreting() -> bool:
    """Triton runs kernels in its interpreter (CPU tests), not compiled."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"

LOW_PRECISION = (torch.float16, torch.bfloat16)


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """Half-precision values are computed in float32 and rounded only where stored or cast."""
    return torch.float32 if dtype in LOW_PRECISION else dtype


_PRINTED: dict = {}  # (floordiv, expr) -> text, shared by every IndexPrinter


class IndexPrinter(StrPrinter):
    """sympy -> integer index arithmetic: sympy's floor division and modulo (rounding down), spelled
    with the backend's truncating ones where the dividend may be negative."""

    def __init__(self, floordiv="//"):
        super().__init__()
        self.floordiv = floordiv

    def doprint(self, expr):
        """Memoized: the same index expressions recur across kernels (a model's repeated
        layers) and sympy's printing sorts terms expensively each time."""
        key = (self.floordiv, expr)
        text = _PRINTED.get(key)
        if text is None:
            if len(_PRINTED) > 200_000:
                _PRINTED.clear()
            text = _PRINTED[key] = super().doprint(expr)
        return text

    def _print_floor(self, expr):
        arg = expr.args[0]
        num, den = arg.as_numer_denom()
        if den == 1:
            return self._print(arg)
        n, d = self._print(num), self._print(den)
        if num.is_nonnegative:
            return f"(({n}) {self.floordiv} ({d}))"
        # C and Triton integer division truncates toward zero, sympy's floor rounds down: they
        # differ for a negative numerator, which sympy makes of a flip's index (floor((2 - i0)/2)
        # is kept as floor(-i0/2) + 1). Subtracting the floor remainder first makes the division
        # exact, so either rounding gives the floor (the denominator is a positive size).
        return f"((({n}) - {self._floor_mod(n, d)}) {self.floordiv} ({d}))"

    def _print_Mod(self, expr):
        a, b = expr.args
        if a.is_nonnegative:
            return f"(({self._print(a)}) % ({self._print(b)}))"
        # sympy's Mod by a positive size is in [0, b), C's and Triton's % takes the dividend's sign
        return self._floor_mod(self._print(a), self._print(b))

    @staticmethod
    def _floor_mod(a: str, b: str) -> str:
        return f"(((({a}) % ({b})) + ({b})) % ({b}))"

    def _print_Integer(self, expr):
        return str(int(expr))

    def _print_Pow(self, expr):
        """A symbolic size squared (``s1**2``): repeated multiplication (C and Triton have no
        integer power operator)."""
        base, exp = expr.args
        if exp.is_Integer and int(exp) > 0:
            return "(" + " * ".join([f"({self._print(base)})"] * int(exp)) + ")"
        raise NotImplementedError(f"[codegen] cannot print the index power {expr}")


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


def _guards_loads(cond) -> bool:
    """Can a where's condition mask its branches' loads? Only a condition on indices alone: one
    that differs across a block's lanes (a scalar one would not broadcast as a mask) and reads no
    memory. Cats, pads and slice gradients select by index, which is where the reads are saved.
    A data-dependent mask saves little (both branches are read somewhere in most sectors), and on
    a GPU (Triton 3.6) one gave wrong max_pool2d gradients that the interpreter got right."""
    walked = list(ir.walk(cond))
    return not any(isinstance(e, ir.Load) for e in walked) and \
        any(isinstance(e, ir.IndexValue) and ir.loop_symbols(e.index) for e in walked)


class KernelWriter:
    """Emits the body of one fused kernel: loads, math (CSE'd), stores."""

    def __init__(self, ops: ScalarOps, load_fn, const_fn, cast_fn, declare_fn):
        self.ops = ops
        self.load_fn, self.const_fn, self.cast_fn, self.declare_fn = load_fn, const_fn, cast_fn, declare_fn
        self.lines: list[str] = []
        self.cache: dict[str, str] = {}
        self.counter = 0
        self.in_registers: dict[tuple[str, sympy.Expr], str] = {}
        # called for a load of a buffer computed in this kernel but not yet in a register in the
        # current scope (a reduction kernel's per-element value from an earlier pass): returns
        # the register after recomputing it, or None to load from memory
        self.recompute = None
        self._scopes: list = []
        self.indirect: dict = {}  # Let symbol -> symbol named after the register holding it
        self.canon = sympy.expand  # index normal form used to match loads with stores
        # Backends that can mask a load set guard_ops = (and_fn, not_fn) over mask texts; a
        # where's branches are then emitted with their condition as the loads' extra mask, so a
        # cat or a pad reads each element from one source instead of from every source.
        self.guard_ops = None
        self.guard = None  # the current extra mask text (load_fn reads it), or None

    def recompute_from(self, kernel):
        """Loads of the kernel's own per-element buffers that are not in a register in the
        current scope (an earlier pass computed them) are recomputed from their bodies."""
        inside = {n.name: n for n in kernel.nodes}

        def recompute(ld: ir.Load):
            producer = inside.get(ld.buffer)
            if producer is None or kernel.levels[producer.name] != "r":
                return None
            index = self.canon(kernel.store_index(producer))
            if self.canon(ld.index) != index:
                return None
            saved, self.guard = self.guard, None  # the register serves every later use: unmasked
            try:
                value = self.emit(kernel.body(producer))
            finally:
                self.guard = saved
            self.in_registers[(producer.name, index)] = value
            return value
        self.recompute = recompute
        self._kernel = kernel

    def emit_node(self, node) -> str:
        """Emit a node's value and remember it in a register under its store index."""
        value = self.emit(self._kernel.body(node))
        self.in_registers[(node.name, self.canon(self._kernel.store_index(node)))] = value
        return value

    def push_scope(self):
        self._scopes.append((dict(self.cache), dict(self.in_registers)))

    def pop_scope(self):
        self.cache, self.in_registers = self._scopes.pop()

    def _tmp(self, text: str, dtype) -> str:
        hit = self.cache.get(text)
        if hit is not None:
            return hit
        name = f"tmp{self.counter}"
        self.counter += 1
        self.lines.append(self.declare_fn(name, text, dtype))
        self.cache[text] = name
        return name

    index_value_fn = None  # backend hook: IndexValue -> text of its value
    bounds_check = None  # backend hook: (register, bound) -> lines checking 0 <= register < bound

    def emit(self, expr: ir.Expr) -> str:
        if isinstance(expr, ir.Let):
            value = self.emit(expr.value)
            wrapped = value
            if expr.wrap_negative:
                wrapped = self._tmp(self.ops.call("where", [self.ops.call("lt", [value, "0"], torch.bool, ()),
                                                            self.ops.call("add", [value, str(expr.bound)], torch.int64, ()),
                                                            value], torch.int64, ()), torch.int64)
            if self.bounds_check is not None and not wrapped.isidentifier():
                # a folded constant index (``0LL``): the C++ check resets its register to 0 on
                # a bad index, so the check needs a variable
                wrapped = self._tmp(wrapped, torch.int64)
            if self.bounds_check is not None and ("checked", wrapped) not in self.cache:
                self.lines.extend(self.bounds_check(wrapped, expr.bound))
                self.cache[("checked", wrapped)] = wrapped
            self.indirect[expr.symbol] = sympy.Symbol(wrapped, integer=True)
            return self.emit(expr.body)
        if isinstance(expr, ir.Load) and expr.index.free_symbols & set(self.indirect):
            expr = ir.Load(expr.buffer, expr.index.xreplace(self.indirect), expr.dtype)
        if isinstance(expr, ir.Load):
            reg = self.in_registers.get((expr.buffer, self.canon(expr.index)))
            if reg is not None:
                return reg
            if self.recompute is not None:
                reg = self.recompute(expr)
                if reg is not None:
                    return reg
            if self.guard is not None:  # already loaded unmasked: reuse it
                saved, self.guard = self.guard, None
                try:
                    hit = self.cache.get(self.load_fn(expr))
                finally:
                    self.guard = saved
                if hit is not None:
                    return hit
            return self._tmp(self.load_fn(expr), expr.dtype)
        if isinstance(expr, ir.Const):
            return self.const_fn(expr.value, expr.dtype)
        if isinstance(expr, ir.IndexValue):
            if expr.index.free_symbols & set(self.indirect):  # an index computed from a gather
                expr = ir.IndexValue(expr.index.xreplace(self.indirect), expr.dtype)
            if self.index_value_fn is None:
                raise NotImplementedError(f"[codegen:{self.ops.name}] index values are not supported here")
            return self._tmp(self.index_value_fn(expr), expr.dtype)
        if isinstance(expr, ir.Call):
            if expr.op == "cast" and isinstance(expr.args[0], ir.Const):
                # fold: a constant cast at compile time, rounded the way torch rounds it
                value = torch.tensor(expr.args[0].value, dtype=expr.args[0].dtype).to(expr.dtype).item()
                return self.const_fn(value, expr.dtype)
            if expr.op == "where" and self.guard_ops is not None and expr.args[0].dtype == torch.bool \
                    and _guards_loads(expr.args[0]) and (ir.loads_of(expr.args[1]) or ir.loads_of(expr.args[2])):
                return self._guarded_where(expr)
            args = [self.emit(a) for a in expr.args]
            if expr.op == "cast":
                if expr.dtype == compute_dtype(expr.args[0].dtype):
                    # widening to the type the value is already computed in (bf16 -> float32):
                    # the same register, so values computed from either side CSE together (a
                    # GELU recomputed for a GEMM and its backward share one tanh)
                    return args[0]
                return self._tmp(self.cast_fn(args[0], expr.args[0].dtype, expr.dtype), expr.dtype)
            arg_dtypes = [a.dtype for a in expr.args]
            return self._tmp(self.ops.call(expr.op, args, expr.dtype, arg_dtypes), expr.dtype)
        raise NotImplementedError(f"[codegen:{self.ops.name}] cannot emit {expr!r}")

    def _under(self, expr: ir.Expr, guard: str) -> str:
        both = self.guard_ops[0]
        saved = self.guard
        self.guard = guard if saved is None else self._tmp(both(saved, guard), torch.bool)
        try:
            return self.emit(expr)
        finally:
            self.guard = saved

    def _guarded_where(self, expr: ir.Call) -> str:
        """``where(c, a, b)`` with a's loads masked by c and b's by not c: lanes a branch does not
        select never touch its memory (masked lanes read 0, which the where discards)."""
        cond = self.emit(expr.args[0])
        shared = {(ld.buffer, ld.index) for ld in ir.loads_of(expr.args[1])} & \
            {(ld.buffer, ld.index) for ld in ir.loads_of(expr.args[2])}
        for ld in ir.loads_of(expr.args[1]):  # loads both branches need are read unmasked
            if (ld.buffer, ld.index) in shared:
                self.emit(ld)
        a = self._under(expr.args[1], cond) if ir.loads_of(expr.args[1]) else self.emit(expr.args[1])
        if ir.loads_of(expr.args[2]):
            b = self._under(expr.args[2], self._tmp(self.guard_ops[1](cond), torch.bool))
        else:
            b = self.emit(expr.args[2])
        arg_dtypes = [x.dtype for x in expr.args]
        return self._tmp(self.ops.call("where", [cond, a, b], expr.dtype, arg_dtypes), expr.dtype)



# ------------------------------------------------------------------ reduction kernels
IDENTITY = {  # reduction kind -> identity for masked lanes, per dtype category
    "sum": lambda dt: 0,
    "prod": lambda dt: 1,
    "max": lambda dt: float("-inf") if dt.is_floating_point else (0 if dt == torch.bool else torch.iinfo(dt).min),
    "min": lambda dt: float("inf") if dt.is_floating_point else (1 if dt == torch.bool else torch.iinfo(dt).max),
    "argmax": lambda dt: float("-inf") if dt.is_floating_point else torch.iinfo(dt).min,
    "argmin": lambda dt: float("inf") if dt.is_floating_point else torch.iinfo(dt).max,
}


class Phase:
    """One pass over the reduced dims: reductions accumulated in it, per-element values stored
    in it, and the per-row values that become computable once it ends."""
    __slots__ = ("reductions", "stores", "after")

    def __init__(self):
        self.reductions, self.stores, self.after = [], [], []


def plan_phases(kernel) -> tuple[list, list]:
    """(per-row nodes computable before any pass, phases). A reduction whose body reads another
    reduction of the kernel goes in a later pass (softmax: max, then sum of exp(x - max))."""
    inside = {n.name: n for n in kernel.nodes}
    ready: dict[str, int] = {}  # x/red node -> number of passes after which it exists
    need: dict[str, int] = {}   # r/red node -> the pass it must run in
    pre, phases = [], []

    def dep_need(node):
        n = 0
        for b in node.reads():
            p = inside.get(b)
            if p is None:
                continue
            level = kernel.levels[p.name]
            n = max(n, ready[p.name] if level in ("x", "red") else need[p.name])
        return n

    def phase(i):
        while len(phases) <= i:
            phases.append(Phase())
        return phases[i]

    stores = set(kernel.stores)
    for node in kernel.nodes:
        level = kernel.levels[node.name]
        n = dep_need(node)
        if level == "x":
            ready[node.name] = n
            (pre if n == 0 else phase(n - 1).after).append(node)
        elif level == "red":
            need[node.name] = n
            phase(n).reductions.append(node)
            ready[node.name] = n + 1
        else:
            need[node.name] = n
            if node.name in stores:
                phase(n).stores.append(node)
    return pre, phases


def decompose_index(flat: str, shape, dims, floordiv: str) -> list[tuple[int, str]]:
    """[(dim, expression)] recovering each dim's index from a flat index over `shape`
    (row-major), where `dims` names the full-space dim of each entry of shape. Sizes may be
    symbolic (printed as the kernel's size arguments)."""
    out = []
    inner = 1
    printer = IndexPrinter(floordiv)
    for k in range(len(shape) - 1, -1, -1):
        d = dims[k]
        size = size_text(shape[k], printer)
        inner_text = size_text(inner, printer)
        if k == 0:
            expr = f"({flat} {floordiv} {inner_text})" if not isinstance(inner, int) or inner > 1 else flat
        elif inner == 1:
            expr = f"({flat} % {size})"
        else:
            expr = f"(({flat} {floordiv} {inner_text}) % {size})"
        out.append((d, expr))
        inner = inner * shape[k]
    return out


# ------------------------------------------------------------------ symbolic sizes
_SIZE_NAME = re.compile(r"\bs(\d+)\b")


def is_symbolic(x) -> bool:
    """A size that is a sympy expression over size symbols (known only at run time)."""
    return isinstance(x, sympy.Basic) and bool(x.free_symbols)


def size_text(x, printer) -> str:
    """A size as kernel source: an int as itself, an expression through the index printer."""
    if isinstance(x, sympy.Basic):
        return str(int(x)) if x.is_Integer else f"({printer.doprint(x)})"
    return str(x)


def size_params(lines) -> list[str]:
    """The size symbols (``s0``, ``s1`` ...) the kernel text uses, in order: they become kernel
    arguments, so one kernel serves every size. No other generated name looks like them."""
    found = {int(m) for ln in lines for m in _SIZE_NAME.findall(ln)}
    return [f"s{k}" for k in sorted(found)]
