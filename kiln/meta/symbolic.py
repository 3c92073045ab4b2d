"""Symbolic sizes: ``SymInt``, a size that is a sympy expression over a ``ShapeEnv``'s symbols.

Arithmetic on a ``SymInt`` stays symbolic (``s0 * 64``, ``s1 // 2``). Anything that needs a
Python value (a comparison, ``bool``, ``int``, ``range``) is answered from the *hints* (the
sizes seen when the graph was traced) and, unless the answer follows from what every symbol is
known to satisfy (each size symbol is at least 2: sizes 0 and 1 are specialized), it becomes a
guard on the ShapeEnv: the compiled graph is reused only where the guard holds again.

The inductor never sees ``SymInt``: lowering turns sizes into plain sympy expressions (``expr``),
on which comparisons are structural and record nothing.
"""
from __future__ import annotations

import operator

import sympy

from kiln import log
from kiln.meta import sympy_compat  # noqa: F401  (sympy 1.14's Mod squares inner Mods)
from kiln.meta.tensor_meta import TensorMeta


def is_symbolic(x) -> bool:
    return isinstance(x, SymInt)


def hint_of(x):
    """The traced value of a size (an int stays an int)."""
    return x.hint if isinstance(x, SymInt) else x


def hints(seq) -> tuple:
    return tuple(hint_of(x) for x in seq)


def to_sympy(x):
    """A SymInt's expression; ints (and everything else) as they are."""
    return x.expr if isinstance(x, SymInt) else x


def sympy_args(obj):
    """``to_sympy`` over nested tuples/lists/dicts/slices (lowering's view of prim args)."""
    if isinstance(obj, SymInt):
        return obj.expr
    if isinstance(obj, tuple):
        return tuple(sympy_args(x) for x in obj)
    if isinstance(obj, list):
        return [sympy_args(x) for x in obj]
    if isinstance(obj, dict):
        return {k: sympy_args(v) for k, v in obj.items()}
    if isinstance(obj, slice):
        return slice(sympy_args(obj.start), sympy_args(obj.stop), sympy_args(obj.step))
    return obj


def has_symbols(obj) -> bool:
    if isinstance(obj, SymInt):
        return True
    if isinstance(obj, sympy.Basic):
        return bool(obj.free_symbols)
    if isinstance(obj, (tuple, list)):
        return any(has_symbols(x) for x in obj)
    return False


def size_symbol(name: str) -> sympy.Symbol:
    return sympy.Symbol(name, integer=True, positive=True)


def int_or_expr(expr):
    """A sympy expression as an int when it is a number (so static code paths see ints)."""
    expr = sympy.sympify(expr)
    return int(expr) if expr.is_Integer else expr


# ------------------------------------------------------------------ printing
class PythonSizePrinter(sympy.printing.str.StrPrinter):
    """sympy -> Python integer arithmetic over named symbols (guards, the wrapper)."""

    def __init__(self, names=None):
        super().__init__()
        self.names = names or {}

    def _print_Symbol(self, expr):
        return self.names.get(expr, expr.name)

    def _print_floor(self, expr):
        num, den = expr.args[0].as_numer_denom()
        if den != 1:
            return f"(({self._print(num)}) // ({self._print(den)}))"
        return self._print(expr.args[0])

    def _print_ceiling(self, expr):
        num, den = expr.args[0].as_numer_denom()
        if den != 1:
            return f"(-((-({self._print(num)})) // ({self._print(den)})))"
        return self._print(expr.args[0])

    def _print_Mod(self, expr):
        return f"(({self._print(expr.args[0])}) % ({self._print(expr.args[1])}))"

    def _print_Integer(self, expr):
        return str(int(expr))

    def _print_Relational(self, expr):
        op = {"==": "==", "!=": "!=", ">=": ">=", "<=": "<=", ">": ">", "<": "<"}[expr.rel_op]
        return f"{self._print(expr.lhs)} {op} {self._print(expr.rhs)}"

    def _print_Max(self, expr):
        return f"max({', '.join(self._print(a) for a in expr.args)})"

    def _print_Min(self, expr):
        return f"min({', '.join(self._print(a) for a in expr.args)})"


def py(expr, names=None) -> str:
    """Python source for a size expression (an int prints as itself)."""
    if isinstance(expr, SymInt):
        expr = expr.expr
    if isinstance(expr, int):
        return str(expr)
    return PythonSizePrinter(names).doprint(sympy.sympify(expr))


def py_tuple(seq, names=None) -> str:
    """``repr(tuple(seq))`` for ints; the same shape of text with expressions."""
    seq = tuple(seq)
    if all(isinstance(x, int) for x in seq):
        return repr(seq)
    items = ", ".join(py(x, names) for x in seq)
    return f"({items},)" if len(seq) == 1 else f"({items})"


# ------------------------------------------------------------------ the environment
_NEGATE = {sympy.Eq: sympy.Ne, sympy.Ne: sympy.Eq, sympy.Lt: sympy.Ge, sympy.Ge: sympy.Lt,
           sympy.Gt: sympy.Le, sympy.Le: sympy.Gt}


class ShapeEnv:
    """The symbols of one capture, their hints and sources, and the guards recorded on them."""

    def __init__(self):
        self.hints: dict[sympy.Symbol, int] = {}
        self.sources: dict[sympy.Symbol, str] = {}   # symbol -> Python expr over L, G
        self.lower: dict[sympy.Symbol, int] = {}     # symbol -> known lower bound
        self.guards: list[tuple[sympy.Basic, str]] = []  # (relation, where it was recorded)
        self._seen: set = set()
        self._duck: dict[int, sympy.Symbol] = {}     # hint -> symbol (duck sizing)
        self.location = None                          # callable -> "file:line: source"

    # ---------------------------------------------------------------- symbols
    def create_size(self, hint: int, source: str, duck: bool = True):
        """A size: 0 and 1 stay ints (specialized), equal hints share a symbol (duck sizing)."""
        hint = int(hint)
        if hint in (0, 1):
            log.log("dynamic", "%s = %d stays static (0 and 1 are specialized)", source, hint)
            return hint
        if duck and hint in self._duck:
            sym = self._duck[hint]
            log.log("dynamic", "%s = %d shares symbol %s (duck sizing)", source, hint, sym)
            return SymInt(sym, self)
        sym = self._new(hint, source)
        if duck:
            self._duck[hint] = sym
        return SymInt(sym, self)

    def _new(self, hint, source, small=False):
        name = f"s{len(self.hints)}"
        # sympy's assumptions must hold: a size is positive, an int that may be 0 is not
        sym = sympy.Symbol(name, integer=True, nonnegative=True) if small else size_symbol(name)
        self.hints[sym] = hint
        self.sources[sym] = source
        self.lower[sym] = 0 if small else 2
        log.log("dynamic", "create symbol %s = %d for %s", sym, hint, source)
        return sym

    def create_int(self, hint: int, source: str):
        """A dynamic Python int: 2 and up as a size's symbol; 0 and 1 too, bound ``>= 0``
        (an index such as a layer's ``layer_idx``), specialized where it becomes a size
        (``tensor_meta.no_small_symbols``)."""
        return SymInt(self._new(int(hint), source, small=hint < 2), self)

    def create_stride(self, hint: int, source: str):
        """A stride no size explains (a slice with a step, a view into a larger buffer)."""
        return SymInt(self._new(int(hint), source), self)

    @property
    def symbols(self):
        return list(self.hints)

    # ---------------------------------------------------------------- values
    def hint(self, expr) -> int:
        value = sympy.sympify(expr).xreplace(self._hint_subs())
        if not value.is_number:
            raise ValueError(f"[meta] no hint for {expr} (unknown symbols {value.free_symbols})")
        return int(value)

    def _hint_subs(self):
        return {s: sympy.Integer(v) for s, v in self.hints.items()}

    def decide(self, rel):
        """True/False when the relation follows from the symbols' lower bounds, else None."""
        if rel in (sympy.true, sympy.false):
            return bool(rel)
        if not isinstance(rel, sympy.core.relational.Relational):
            return None
        d = sympy.expand(rel.lhs - rel.rhs)
        if d.is_number:
            return bool(rel.func(d, 0))
        # every symbol s is lower[s] + t with t a non-negative integer
        shift = {s: self.lower.get(s, 0) + sympy.Symbol(f"_t{s.name}", integer=True, nonnegative=True)
                 for s in d.free_symbols if s in self.hints}
        d = sympy.expand(d.xreplace(shift))
        f = rel.func
        if f in (sympy.Ge, sympy.Gt, sympy.Le, sympy.Lt):
            if f in (sympy.Le, sympy.Lt):
                d, f = -d, (sympy.Ge if f is sympy.Le else sympy.Gt)
            if f is sympy.Ge:
                return True if d.is_nonnegative else False if d.is_negative else None
            return True if d.is_positive else False if d.is_nonpositive else None
        if f in (sympy.Eq, sympy.Ne):
            eq = True if d.is_zero else False if (d.is_positive or d.is_negative) else None
            if eq is None:
                return None
            return eq if f is sympy.Eq else not eq
        return None

    def evaluate(self, rel) -> bool:
        """The relation's truth at the hints; recorded as a guard unless it always holds."""
        rel = sympy.sympify(rel)
        known = self.decide(rel)
        if known is not None:
            return known
        value = bool(rel.xreplace(self._hint_subs()))
        guard = rel if value else _NEGATE[type(rel)](rel.lhs, rel.rhs)
        self.add_guard(guard)
        return value

    def add_guard(self, guard):
        key = sympy.srepr(guard)
        if key in self._seen:
            return
        self._seen.add(key)
        where = ""
        try:
            where = self.location() if self.location is not None else ""
        except Exception:  # noqa: BLE001 - a location is a nicety
            where = ""
        self.guards.append((guard, where))
        # a lower bound on one symbol tightens what later relations can be decided from
        if isinstance(guard, (sympy.Ge, sympy.Gt)) and guard.lhs in self.hints and guard.rhs.is_Integer:
            lb = int(guard.rhs) + (1 if isinstance(guard, sympy.Gt) else 0)
            self.lower[guard.lhs] = max(self.lower[guard.lhs], lb)
        elif isinstance(guard, (sympy.Le, sympy.Lt)) and guard.rhs in self.hints and guard.lhs.is_Integer:
            lb = int(guard.lhs) + (1 if isinstance(guard, sympy.Lt) else 0)
            self.lower[guard.rhs] = max(self.lower[guard.rhs], lb)
        log.detail("dynamic", "guard %s  (hints %s)%s", py(guard), self._hint_text(guard),
                f"  at {where}" if where else "")

    def _hint_text(self, expr):
        return ", ".join(f"{s}={self.hints[s]}" for s in sorted(expr.free_symbols, key=str) if s in self.hints)

    # ---------------------------------------------------------------- emitted guards
    def simplified_guards(self) -> list:
        """The guards to check, simplified: each symbol's lower bound once, then every recorded
        relation that the bounds do not already imply (duplicates and weaker bounds dropped)."""
        # unevaluated: sympy would fold ``s >= 0`` of a non-negative symbol to True, and the
        # guard must still check it (a dynamic int's symbol; the int could be negative)
        out = [sympy.Ge(s, self.lower[s], evaluate=False) for s in self.hints]
        for g, _ in self.guards:
            if isinstance(g, (sympy.Ge, sympy.Gt, sympy.Le, sympy.Lt)) and (
                    (g.lhs in self.hints and g.rhs.is_Integer) or (g.rhs in self.hints and g.lhs.is_Integer)):
                continue  # folded into the lower bound (or checked below when an upper bound)
            g = sympy.simplify(g) if not isinstance(g, (sympy.Eq, sympy.Ne)) else g
            if g is sympy.true:
                continue
            if self.decide(g) is True:
                continue
            out.append(g)
        # upper bounds on single symbols (s <= c) are kept as they are
        for g, _ in self.guards:
            if isinstance(g, (sympy.Le, sympy.Lt)) and g.lhs in self.hints and g.rhs.is_Integer:
                out.append(g)
            elif isinstance(g, (sympy.Ge, sympy.Gt)) and g.rhs in self.hints and g.lhs.is_Integer:
                out.append(g)
        seen, unique = set(), []
        for g in out:
            k = sympy.srepr(g)
            if k not in seen:
                seen.add(k)
                unique.append(g)
        return unique

    def guard_lines(self, names=None) -> list[str]:
        return [py(g, names) for g in self.simplified_guards()]

    def describe(self) -> list[str]:
        """Human-readable: each symbol with its source, then each guard with where it came from."""
        out = [f"{s} = {self.sources[s]}  (traced as {self.hints[s]}, >= {self.lower[s]})" for s in self.hints]
        out += [f"{py(g)}  [{where or 'compile'}]" for g, where in self.guards]
        return out


# ------------------------------------------------------------------ SymInt
def _expr(x):
    if isinstance(x, SymInt):
        return x.expr
    if isinstance(x, bool):
        return sympy.Integer(int(x))
    if isinstance(x, int):
        return sympy.Integer(x)
    return None


class SymInt:
    """An integer size that is an expression over a ShapeEnv's symbols."""
    __slots__ = ("expr", "env")

    def __init__(self, expr, env: ShapeEnv):
        self.expr = expr
        self.env = env

    @staticmethod
    def make(expr, env):
        expr = sympy.sympify(expr)
        if expr.is_Integer:
            return int(expr)
        return SymInt(expr, env)

    @property
    def hint(self) -> int:
        return self.env.hint(self.expr)

    def _binary(self, other, fn, reflected=False):
        o = _expr(other)
        if o is None:
            if isinstance(other, float):  # a float result: specialize on this size
                return fn(other, int(self)) if reflected else fn(int(self), other)
            return NotImplemented
        a, b = (o, self.expr) if reflected else (self.expr, o)
        return SymInt.make(fn(a, b), self.env)

    def __add__(self, o): return self._binary(o, operator.add)
    def __radd__(self, o): return self._binary(o, operator.add, True)
    def __sub__(self, o): return self._binary(o, operator.sub)
    def __rsub__(self, o): return self._binary(o, operator.sub, True)
    def __mul__(self, o): return self._binary(o, operator.mul)
    def __rmul__(self, o): return self._binary(o, operator.mul, True)

    def __floordiv__(self, o):
        return self._binary(o, _floordiv)

    def __rfloordiv__(self, o):
        return self._binary(o, _floordiv, True)

    def __mod__(self, o):
        return self._binary(o, _mod)

    def __rmod__(self, o):
        return self._binary(o, _mod, True)

    def __truediv__(self, o):
        return int(self) / (int(o) if isinstance(o, SymInt) else o)

    def __rtruediv__(self, o):
        return o / int(self)

    def __pow__(self, o):
        if isinstance(o, int) and o >= 0:
            return SymInt.make(self.expr ** o, self.env)
        return int(self) ** o

    def __neg__(self):
        return SymInt.make(-self.expr, self.env)

    def __pos__(self):
        return self

    def __abs__(self):
        return self if self.env.evaluate(sympy.Ge(self.expr, 0)) else -self

    # comparisons become Python bools, recorded as guards
    def _cmp(self, other, rel):
        o = _expr(other)
        if o is None:
            if isinstance(other, float):
                return rel(sympy.Integer(int(self)), sympy.Float(other)) == sympy.true
            return NotImplemented
        return self.env.evaluate(rel(self.expr, o))

    def __eq__(self, o): return self._cmp(o, sympy.Eq)
    def __ne__(self, o): return self._cmp(o, sympy.Ne)
    def __lt__(self, o): return self._cmp(o, sympy.Lt)
    def __le__(self, o): return self._cmp(o, sympy.Le)
    def __gt__(self, o): return self._cmp(o, sympy.Gt)
    def __ge__(self, o): return self._cmp(o, sympy.Ge)

    def __bool__(self):
        return self.env.evaluate(sympy.Ne(self.expr, 0))

    def __index__(self):
        """A Python int is needed (``range``, a torch call): specialize on the hint."""
        value = self.hint
        self.env.evaluate(sympy.Eq(self.expr, value))
        return value

    __int__ = __index__

    def __float__(self):
        return float(int(self))

    def __hash__(self):
        return hash(self.expr)

    def __repr__(self):
        return str(self.expr)

    def __format__(self, spec):
        return format(str(self), spec)


def _floordiv(a, b):
    return sympy.floor(a / b)


def _mod(a, b):
    return sympy.Mod(a, b)


# ------------------------------------------------------------------ inputs
def symbolic_meta(t, dims, source: str, env: ShapeEnv):
    """A TensorMeta for input tensor t with the sizes of ``dims`` symbolic.

    Strides follow the sizes where the tensor is dense in some dim order (contiguous,
    transposed, permuted): each stride is the product of the sizes inside it. A stride no
    size explains (a slice with a step) becomes a symbol of its own; stride 0 stays 0.
    """
    shape = [env.create_size(t.shape[d], f"{source}.size({d})") if d in dims else int(t.shape[d])
             for d in range(t.dim())]
    stride = [None] * t.dim()
    # innermost first: by stride, then by position from the right (contiguous order on ties)
    order = sorted(range(t.dim()), key=lambda d: (t.stride(d), -d))
    expected, expected_hint = 1, 1
    for d in order:
        if t.shape[d] == 1:
            continue
        st = t.stride(d)
        if st == 0:
            stride[d] = 0
            continue
        if st != expected_hint:
            expected = st if st == 1 or not has_symbols(expected) else env.create_stride(st, f"{source}.stride({d})")
            expected_hint = st
        stride[d] = expected
        expected = expected * shape[d]
        expected_hint *= int(t.shape[d])
    # size-1 dims: any stride indexes the same element; use the contiguous one (no hint in it)
    inner = 1
    for d in range(t.dim() - 1, -1, -1):
        if stride[d] is None:
            stride[d] = inner
        inner = inner * shape[d]
    return TensorMeta(shape, stride, t.dtype, t.device, t.requires_grad)


class SymSize(tuple):
    """``x.shape`` when some sizes are symbolic (torch.Size would turn them into ints)."""

    def numel(self):
        out = 1
        for s in self:
            out = out * s
        return out

    def __repr__(self):
        return f"SymSize({list(self)})"


def size_tuple(shape):
    import torch
    return SymSize(shape) if any(isinstance(s, SymInt) for s in shape) else torch.Size(shape)


# ------------------------------------------------------------------ binding symbols at run time
def symbol_reads(metas) -> dict:
    """{symbol: (input index, "size" | "stride", dim)}: where each symbol of the inputs' metas
    can be read from the real inputs (the first size or stride that is exactly the symbol)."""
    out = {}
    for kind in ("size", "stride"):
        for i, m in enumerate(metas):
            if m is None:
                continue
            for d, v in enumerate(m.shape if kind == "size" else m.stride):
                e = to_sympy(v)
                if isinstance(e, sympy.Symbol) and e not in out:
                    out[e] = (i, kind, d)
    return out


def free_symbols(metas) -> set:
    out = set()
    for m in metas:
        if m is None:
            continue
        for v in tuple(m.shape) + tuple(m.stride):
            e = to_sympy(v)
            if isinstance(e, sympy.Basic):
                out |= e.free_symbols
    return out


def symbol_values(metas, tensors) -> dict:
    """{symbol: int} read from real tensors for the symbols in their metas ({} when static)."""
    reads = symbol_reads(metas)
    out = {}
    for sym, (i, kind, d) in reads.items():
        t = tensors[i]
        out[sym] = int(t.shape[d] if kind == "size" else t.stride(d))
    return out


def concretize(obj, values: dict):
    """obj with every SymInt (or sympy size expression) evaluated at ``values``."""
    if isinstance(obj, SymInt):
        obj = obj.expr
    if isinstance(obj, sympy.Basic):
        subs = {s: sympy.Integer(values[s]) for s in obj.free_symbols if s in values}
        r = obj.xreplace(subs)
        if not r.is_number:
            raise ValueError(f"[meta] size {obj} has symbols with no value ({r.free_symbols})")
        return int(r)
    if isinstance(obj, tuple):
        return tuple(concretize(x, values) for x in obj)
    if isinstance(obj, list):
        return [concretize(x, values) for x in obj]
    if isinstance(obj, dict):
        return {k: concretize(v, values) for k, v in obj.items()}
    if isinstance(obj, slice):
        return slice(concretize(obj.start, values), concretize(obj.stop, values), concretize(obj.step, values))
    return obj


def is_int_like(x) -> bool:
    """An int (not a bool) or a symbolic size: what a size argument may be."""
    return isinstance(x, SymInt) or (isinstance(x, int) and not isinstance(x, bool))


def expr_meta(meta):
    """meta with its sizes and strides as ints or sympy expressions (lowering's view)."""
    if isinstance(meta, tuple):  # a library op's several results
        return tuple(expr_meta(m) for m in meta)
    if not isinstance(meta, TensorMeta):
        return meta
    return TensorMeta([to_sympy(s) for s in meta.shape], [to_sympy(s) for s in meta.stride],
                      meta.dtype, meta.device, meta.requires_grad)


def statically_equal(a, b) -> bool:
    """a == b for every value of the symbols, decided without recording a guard (False when
    it is not known). For "is this a no-op?" checks, where answering False is always safe."""
    if not isinstance(a, SymInt) and not isinstance(b, SymInt):
        return a == b
    ea, eb = _expr(a), _expr(b)
    if ea is None or eb is None:
        return False
    env = (a if isinstance(a, SymInt) else b).env
    return env.decide(sympy.Eq(ea, eb)) is True


def same_shape(a, b) -> bool:
    """Shapes equal for every value of the symbols (no guard recorded)."""
    a, b = tuple(a), tuple(b)
    return len(a) == len(b) and all(statically_equal(x, y) for x, y in zip(a, b))


def shape_env_of(metas):
    """The ShapeEnv of the first symbolic size in metas (None when all are static)."""
    for m in metas:
        for v in tuple(getattr(m, "shape", ())) + tuple(getattr(m, "stride", ())):
            if isinstance(v, SymInt):
                return v.env
    return None
