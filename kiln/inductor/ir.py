"""The loop IR.

Two levels, each a handful of small slotted node types:

* scalar expressions (``Load``, ``Const``, ``IndexValue``, ``Call``): the body of a loop, as a
  function of the index symbols ``i0 .. i{n-1}``. Index math is sympy.
* buffers: ``InputBuffer`` (a graph input), ``Pointwise`` (a computed buffer whose element at
  index ``i`` is ``body``), ``Extern`` (a library call: mm, bmm ...), and ``Alias`` (a graph
  output that is a view of another buffer).

Views never appear as buffers: lowering turns them into index transforms inside loaders.
"""
from __future__ import annotations

import functools
import math

import sympy
import torch

from kiln.meta import sympy_compat  # noqa: F401  (sympy 1.14's Mod squares inner Mods)


@functools.lru_cache(maxsize=None)
def index_symbol(k: int) -> sympy.Symbol:
    return sympy.Symbol(f"i{k}", integer=True, nonnegative=True)


def index_symbols(n: int) -> list[sympy.Symbol]:
    return [index_symbol(k) for k in range(n)]


_INDEX_TEXT: dict = {}


def index_text(index) -> str:
    """``str(index)``, memoized: reprs of loads key the codegen's CSE tables, and sympy's
    printer sorts the terms of every sum it prints (most of codegen's time before this)."""
    text = _INDEX_TEXT.get(index)
    if text is None:
        if len(_INDEX_TEXT) > 200_000:
            _INDEX_TEXT.clear()
        text = _INDEX_TEXT[index] = str(index)
    return text


# ------------------------------------------------------------------ scalar expressions
class Expr:
    __slots__ = ()


class Load(Expr):
    __slots__ = ("buffer", "index", "dtype")

    def __init__(self, buffer: str, index: sympy.Expr, dtype: torch.dtype):
        self.buffer, self.index, self.dtype = buffer, sympy.sympify(index), dtype

    def __repr__(self):
        return f"load({self.buffer}, {index_text(self.index)})"


class Const(Expr):
    __slots__ = ("value", "dtype")

    def __init__(self, value, dtype: torch.dtype):
        self.value, self.dtype = value, dtype

    def __repr__(self):
        return f"{self.value!r}:{_dt(self.dtype)}"


class IndexValue(Expr):
    """An index expression used as a value (iota, masks built from positions)."""
    __slots__ = ("index", "dtype")

    def __init__(self, index: sympy.Expr, dtype: torch.dtype = torch.int64):
        self.index, self.dtype = sympy.sympify(index), dtype

    def __repr__(self):
        return f"index({index_text(self.index)})"


class Call(Expr):
    """A scalar op from the codegen op table (``add``, ``exp``, ``where``, ``cast`` ...)."""
    __slots__ = ("op", "args", "dtype")

    def __init__(self, op: str, args: tuple, dtype: torch.dtype):
        self.op, self.args, self.dtype = op, tuple(args), dtype

    def __repr__(self):
        if self.op == "cast":
            return f"cast({self.args[0]!r}, {_dt(self.dtype)})"
        return f"{self.op}({', '.join(map(repr, self.args))})"


class Let(Expr):
    """``body`` with ``symbol`` bound to the integer ``value`` (an index read from memory:
    gather, embedding). Loads in ``body`` use ``symbol`` in their index; ``bound`` is the size
    of the indexed dim, checked at run time (eager raises on an out-of-range index, so must we)."""
    __slots__ = ("symbol", "value", "bound", "body", "dtype", "wrap_negative")

    def __init__(self, symbol, value: Expr, bound: int, body: Expr, wrap_negative: bool = False):
        self.symbol, self.value, self.bound, self.body = symbol, value, bound, body
        self.dtype = body.dtype
        self.wrap_negative = wrap_negative  # Python-style x[-1] (tensor indexing); gather does not

    def __repr__(self):
        return f"let {self.symbol} = {self.value!r} in [0, {self.bound}): {self.body!r}"


_indirect_ids = __import__("itertools").count()


def indirect_symbol() -> sympy.Symbol:
    return sympy.Symbol(f"ind{next(_indirect_ids)}", integer=True)


def walk(expr: Expr):
    """Post-order traversal of an expression tree."""
    if isinstance(expr, Call):
        for a in expr.args:
            yield from walk(a)
    elif isinstance(expr, Let):
        yield from walk(expr.value)
        yield from walk(expr.body)
    yield expr


def loads_of(expr: Expr) -> list[Load]:
    return [e for e in walk(expr) if isinstance(e, Load)]


def _body_reads(buf) -> set[str]:
    """The buffers a Pointwise's or Reduction's body loads (bodies are never reassigned, so
    the walk runs once per buffer; the scheduler asks for every pair of candidates)."""
    names = getattr(buf, "_reads", None)
    if names is None:
        names = buf._reads = frozenset(ld.buffer for ld in loads_of(buf.body))
    return set(names)


def substitute_loads(expr: Expr, fn) -> Expr:
    """Rebuild expr with every Load replaced by fn(load) (fn returns an Expr or None to keep)."""
    if isinstance(expr, Load):
        return fn(expr) or expr
    if isinstance(expr, Call):
        return Call(expr.op, tuple(substitute_loads(a, fn) for a in expr.args), expr.dtype)
    if isinstance(expr, Let):
        return Let(expr.symbol, substitute_loads(expr.value, fn), expr.bound,
                   substitute_loads(expr.body, fn), expr.wrap_negative)
    return expr


def _dt(dtype) -> str:
    return str(dtype).replace("torch.", "")


# ------------------------------------------------------------------ buffers
class Buffer:
    __slots__ = ()

    def numel(self):
        return math.prod(self.shape)


class InputBuffer(Buffer):
    __slots__ = ("name", "shape", "stride", "dtype", "device")

    def __init__(self, name, shape, stride, dtype, device):
        self.name, self.shape, self.stride = name, tuple(shape), tuple(stride)
        self.dtype, self.device = dtype, device

    def __repr__(self):
        return f"{self.name} = Input({_dt(self.dtype)}{list(self.shape)}, stride={list(self.stride)})"


class Pointwise(Buffer):
    """``name[i] = body(i)`` over ``shape``, stored with ``stride``."""
    __slots__ = ("name", "shape", "stride", "dtype", "device", "body", "origins", "_reads")

    def __init__(self, name, shape, stride, dtype, device, body: Expr, origins=()):
        self.name, self.shape, self.stride = name, tuple(shape), tuple(stride)
        self.dtype, self.device, self.body = dtype, device, body
        self.origins = tuple(origins)

    def store_index(self) -> sympy.Expr:
        return sum((s * st for s, st in zip(index_symbols(len(self.shape)), self.stride)), sympy.Integer(0))

    def reads(self) -> set[str]:
        return _body_reads(self)

    def __repr__(self):
        idx = ", ".join(str(s) for s in index_symbols(len(self.shape)))
        return (f"{self.name} = Pointwise({_dt(self.dtype)}{list(self.shape)}, stride={list(self.stride)})\n"
                f"    [{idx}] -> {self.body!r}")


class Reduction(Buffer):
    """``name[kept index] = reduce(reduction_type, body(i) for i over the reduced dims)``.

    ``ranges`` is the full (input) iteration space and ``body`` is written in its index symbols
    ``i0 .. i{n-1}``; ``shape`` is ``ranges`` without ``reduced_dims``.
    """
    __slots__ = ("name", "shape", "stride", "dtype", "device", "reduction_type", "ranges",
                 "reduced_dims", "body", "origins", "_reads", "source")

    def __init__(self, name, shape, stride, dtype, device, reduction_type, ranges, reduced_dims,
                 body, origins=(), source=None):
        self.name, self.shape, self.stride = name, tuple(shape), tuple(stride)
        self.dtype, self.device = dtype, device
        self.reduction_type, self.ranges = reduction_type, tuple(ranges)
        self.reduced_dims, self.body, self.origins = tuple(reduced_dims), body, tuple(origins)
        # the first stage of a split reduction: (the unsplit input's shape, each of its indices
        # in this node's symbols), so a pointwise producer over that shape can join its kernel
        self.source = source

    @property
    def kept_dims(self):
        return tuple(d for d in range(len(self.ranges)) if d not in self.reduced_dims)

    def store_index(self) -> sympy.Expr:
        """The output index in the full space's symbols."""
        syms = index_symbols(len(self.ranges))
        return sum((syms[d] * st for d, st in zip(self.kept_dims, self.stride)), sympy.Integer(0))

    def reads(self) -> set[str]:
        return _body_reads(self)

    def __repr__(self):
        idx = ", ".join(str(s) for s in index_symbols(len(self.ranges)))
        red = ", ".join(f"i{d}" for d in self.reduced_dims)
        return (f"{self.name} = Reduction[{self.reduction_type} over {red}]({_dt(self.dtype)}{list(self.shape)}, "
                f"ranges={list(self.ranges)})\n    [{idx}] -> {self.body!r}")


class Scatter(Buffer):
    """``target`` buffer, updated in place: for each source index ``i`` over ``src_ranges``,
    ``target[index(i)] += value(i)`` (``mode`` "add") or ``= value(i)`` ("store": a position
    named twice keeps one of its values, never their sum), where ``index`` reads ``slot.value``
    (an index from memory, bound to ``slot.symbol``, checked against ``slot.bound``). ``name``
    names the result (it aliases ``target``'s memory)."""
    __slots__ = ("name", "target", "shape", "stride", "dtype", "device", "src_ranges", "slot",
                 "index", "value", "origins", "mode")

    def __init__(self, name, target, shape, stride, dtype, device, src_ranges, slot, index, value,
                 origins=(), mode="add"):
        self.name, self.target, self.shape, self.stride = name, target, tuple(shape), tuple(stride)
        self.dtype, self.device, self.src_ranges, self.slot = dtype, device, tuple(src_ranges), slot
        self.index, self.value, self.origins, self.mode = index, value, tuple(origins), mode

    def reads(self) -> set[str]:
        return {ld.buffer for ld in loads_of(self.slot.value)} | {ld.buffer for ld in loads_of(self.value)} | {self.target}

    def __repr__(self):
        idx = ", ".join(str(s) for s in index_symbols(len(self.src_ranges)))
        return (f"{self.name} = Scatter-{self.mode} into {self.target}[{self.index}] over {list(self.src_ranges)}\n"
                f"    [{idx}] with {self.slot.symbol} = {self.slot.value!r} -> {self.value!r}")


class TensorRef:
    """A strided view of a buffer, as a library call or an output alias receives it."""
    __slots__ = ("buffer", "shape", "stride", "offset")

    def __init__(self, buffer: str, shape, stride, offset=0):
        self.buffer, self.shape, self.stride, self.offset = buffer, tuple(shape), tuple(stride), offset

    def __repr__(self):
        return f"{self.buffer}.as_strided({list(self.shape)}, {list(self.stride)}, {self.offset})"


class Extern(Buffer):
    """A library op called from the wrapper (cuBLAS/MKL through torch.mm and friends)."""
    __slots__ = ("name", "op", "inputs", "kwargs", "shape", "stride", "dtype", "device", "origins")

    def __init__(self, name, op, inputs, kwargs, shape, stride, dtype, device, origins=()):
        self.name, self.op, self.inputs, self.kwargs = name, op, tuple(inputs), dict(kwargs)
        self.shape, self.stride, self.dtype, self.device = tuple(shape), tuple(stride), dtype, device
        self.origins = tuple(origins)

    def reads(self) -> set[str]:
        """Buffers read, also through tuples/lists of tensors and keyword arguments."""
        out, todo = set(), list(self.inputs) + list(self.kwargs.values())
        while todo:
            r = todo.pop()
            if isinstance(r, TensorRef):
                out.add(r.buffer)
            elif isinstance(r, (tuple, list)):
                todo.extend(r)
        return out

    def __repr__(self):
        args = ", ".join(repr(r) for r in self.inputs)
        return f"{self.name} = Extern {self.op!r}({args}) -> {_dt(self.dtype)}{list(self.shape)}"


class MultiExtern(Extern):
    """A library op with several results, called once; each result is an ``ExternItem``."""
    __slots__ = ()

    def __init__(self, name, op, inputs, kwargs, device, origins=()):
        super().__init__(name, op, inputs, kwargs, (), (), None, device, origins)

    def __repr__(self):
        args = ", ".join(repr(r) for r in self.inputs)
        return f"{self.name} = Extern {self.op!r}({args}) -> tuple"


class ExternItem(Buffer):
    """Result ``index`` of a ``MultiExtern`` (the wrapper binds it by name: no copy)."""
    __slots__ = ("name", "source", "index", "shape", "stride", "dtype", "device", "origins")

    def __init__(self, name, source, index, shape, stride, dtype, device, origins=()):
        self.name, self.source, self.index = name, source, index
        self.shape, self.stride, self.dtype, self.device = tuple(shape), tuple(stride), dtype, device
        self.origins = tuple(origins)

    def reads(self) -> set[str]:
        return {self.source}

    def __repr__(self):
        return f"{self.name} = {self.source}[{self.index}] -> {_dt(self.dtype)}{list(self.shape)}"


class LoopProgram:
    """The whole loop IR of one graph: inputs, buffers in order, and what the graph returns.

    ``outputs`` holds buffer names or TensorRefs (outputs that alias a buffer through a view)
    or plain Python values.
    """
    __slots__ = ("inputs", "buffers", "outputs", "device", "seed", "symbols", "symbol_reads")

    def __init__(self, inputs, buffers, outputs, device, seed=None):
        self.inputs, self.buffers, self.outputs, self.device = inputs, buffers, outputs, device
        self.seed = seed  # an InputBuffer the wrapper fills with a fresh random seed per call
        # symbolic sizes: the size symbols (sorted by name), and {symbol: (input buffer name,
        # "size" | "stride", dim)} for those an input's size or stride gives the wrapper
        self.symbols: list = []
        self.symbol_reads: dict = {}

    def all_buffers(self) -> dict:
        out = {b.name: b for b in self.inputs + self.buffers}
        if self.seed is not None:
            out[self.seed.name] = self.seed
        return out

    def buffer(self, name):
        for b in self.inputs + self.buffers:
            if b.name == name:
                return b
        raise KeyError(name)

    def __str__(self):
        lines = [repr(b) for b in self.inputs] + [repr(b) for b in self.buffers]
        lines.append(f"return {self.outputs!r}")
        return "\n".join(lines) + "\n"


# ------------------------------------------------------------------ index simplification
def _bounds(expr, ranges):
    """(lo, hi) of an index expression given 0 <= symbol < size, or None if unknown. Sizes may
    be symbolic: a size symbol (positive, not an index) is its own bound."""
    if expr.is_Integer:
        v = int(expr)
        return v, v
    if expr.is_Symbol:
        size = ranges.get(expr)
        if size is not None:
            return 0, size - 1
        return (expr, expr) if expr.is_positive else None
    if expr.is_Add:
        lo = hi = 0
        for a in expr.args:
            b = _bounds(a, ranges)
            if b is None:
                return None
            lo, hi = lo + b[0], hi + b[1]
        return lo, hi
    if expr.is_Mul:
        lo = hi = 1
        for a in expr.args:
            b = _bounds(a, ranges)
            if b is None:
                return None
            if all(isinstance(v, int) for v in (lo, hi, *b)):
                cands = [lo * b[0], lo * b[1], hi * b[0], hi * b[1]]
                lo, hi = min(cands), max(cands)
            elif _nonneg(lo) and _nonneg(b[0]):  # symbolic: non-negative factors only
                lo, hi = lo * b[0], hi * b[1]
            else:
                return None
        return lo, hi
    if isinstance(expr, sympy.Mod):
        m = expr.args[1]
        if m.is_Integer and int(m) > 0:
            return 0, int(m) - 1
        if m.is_positive:
            return 0, m - 1
    if isinstance(expr, sympy.floor):
        num, den = expr.args[0].as_numer_denom()
        b = _bounds(num, ranges)
        if b is not None and den.is_Integer and int(den) > 0 and isinstance(b[0], int) and isinstance(b[1], int):
            return b[0] // int(den), b[1] // int(den)
        if b is not None and den.is_positive and _nonneg(b[0]):
            return 0, sympy.floor(b[1] / den)
    return None


def _nonneg(x) -> bool:
    if isinstance(x, int):
        return x >= 0
    return bool(sympy.sympify(x).is_nonnegative)


def _lt(a, b) -> bool:
    """a < b provably (ints, or size expressions whose symbols are positive integers)."""
    if isinstance(a, int) and isinstance(b, int):
        return a < b
    return bool(sympy.expand(sympy.sympify(b) - a - 1).is_nonnegative)


def _within(b, m) -> bool:
    """Bounds b = (lo, hi) lie in [0, m): provably, for ints or symbolic sizes."""
    if b is None:
        return False
    lo, hi = b
    if m.is_Integer and isinstance(lo, int) and isinstance(hi, int):
        return 0 <= lo and hi < int(m)
    return bool(m.is_positive) and _nonneg(lo) and _lt(hi, m)


def simplify_index(expr, ranges: dict) -> sympy.Expr:
    """Drop modulo and floor-division that the index ranges make no-ops, to a fixed point: a
    pass can leave one behind (an unravel pair merged into ``c*a`` brings a's own
    ``floor(i4/32)`` up a level, over an i4 < 32), and gcc does not vectorize a load whose
    index divides the loop variable. Only a result still holding a Mod or floor is passed
    again."""
    out = _simplify_once(expr, ranges)
    for _ in range(3):
        if out == expr or not out.has(sympy.Mod, sympy.floor):
            break
        expr, out = out, _simplify_once(out, ranges)
    return out


def _simplify_once(expr, ranges: dict) -> sympy.Expr:
    expr = sympy.sympify(expr)
    if not expr.args:
        return expr
    args = [_simplify_once(a, ranges) for a in expr.args]
    if isinstance(expr, sympy.Mod):
        b = _bounds(args[0], ranges)
        m = args[1]
        if _within(b, m):
            return args[0]
        return sympy.Mod(*args)
    if isinstance(expr, sympy.floor):
        num, den = args[0].as_numer_denom()
        b = _bounds(num, ranges)
        if _within(b, den):
            return sympy.Integer(0)
        if den.free_symbols and num.is_Add:
            # floor((q*den + r) / den) = q + floor(r / den), then r's own bounds
            whole = [t for t in num.args if sympy.fraction(sympy.cancel(t / den))[1] == 1]
            if whole:
                rest = sympy.Add(*[t for t in num.args if t not in whole])
                q = sympy.expand(sympy.Add(*whole) / den)
                return q + _simplify_once(sympy.floor(rest / den), ranges)
        return sympy.floor(args[0])
    if expr.is_Add:
        # a simplified term may itself be a sum (``128*(2*i0 + floor(i2/128))`` distributes
        # once its Mod is dropped): merge over the flattened terms, or an unravel pair split
        # across two of them survives
        args = _merge_unravelled([t for a in args for t in sympy.Add.make_args(a)])
    return expr.func(*args)


def _merge_unravelled(terms: list) -> list:
    """``Mod(a, n) + n*floor(a/n)`` -> ``a``: a flat index unravelled and raveled again (split
    reductions over a flattened extent index a contiguous input this way)."""
    for k, t in enumerate(terms):
        c, m = t.as_coeff_Mul()  # c*Mod(a, n) + c*n*floor(a/n) -> c*a (a strided unravel)
        if not isinstance(m, sympy.Mod) or not m.args[1].is_Integer:
            continue
        a, n = m.args
        want = c * n * sympy.floor(a / n)
        for j, u in enumerate(terms):
            if j != k and sympy.expand(u - want) == 0:
                rest = [v for i, v in enumerate(terms) if i not in (j, k)]
                return _merge_unravelled(rest + [sympy.expand(c * a)])
    return terms


def loop_symbols(expr) -> set:
    """The index symbols of an expression (size symbols, positive by construction, excluded):
    an index with none of them is one address for the whole block."""
    return {s for s in sympy.sympify(expr).free_symbols if not s.is_positive}


def ranges_of(shape) -> dict:
    return {index_symbol(k): s if isinstance(s, sympy.Basic) and s.free_symbols else int(s)
            for k, s in enumerate(shape)}


def canonical_index_fn(ranges: dict):
    """The normal form in which a load's index is compared with a store's index."""
    def canon(expr):
        out = sympy.expand(simplify_index(expr, ranges))
        if out.is_Add:  # expanding can bring a scaled unravel pair together: c*Mod(a, n) + c*n*floor(a/n)
            out = sympy.Add(*_merge_unravelled(list(out.args)))
        return out
    return canon
