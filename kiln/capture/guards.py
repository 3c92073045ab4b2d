"""Sources (where a value came from) and guards (what must stay true to reuse a capture).

A source is a Python expression over ``L`` (the frame's locals at entry: arguments, and free
variables, by name) and ``G`` (the function's globals). Guards are recorded as
``(source, check)`` pairs while tracing; ``GuardSet.compile()`` turns them into one generated
function ``guard(L, G)`` that loads each source once into a temporary (parents before
children, so a type or identity check always runs before an attribute of the same object is
read) and returns False at the first failing check.
"""
from __future__ import annotations

import math
import re

import torch

from kiln.meta.symbolic import py


# ------------------------------------------------------------------ sources
class Source:
    __slots__ = ()
    parent: "Source | None" = None

    def expr(self, base: str | None = None) -> str:
        raise NotImplementedError

    def __str__(self):
        return self.expr()

    def __eq__(self, other):
        return type(self) is type(other) and self.expr() == other.expr()

    def __hash__(self):
        return hash(self.expr())


class LocalSource(Source):
    __slots__ = ("name",)

    def __init__(self, name):
        self.name = name

    def expr(self, base=None):
        return f"L[{self.name!r}]"


class GlobalSource(Source):
    __slots__ = ("name",)

    def __init__(self, name):
        self.name = name

    def expr(self, base=None):
        return f"G[{self.name!r}]"


class AttrSource(Source):
    __slots__ = ("parent", "attr")

    def __init__(self, parent, attr):
        self.parent = parent
        self.attr = attr

    def expr(self, base=None):
        return f"{base or self.parent.expr()}.{self.attr}"


class ItemSource(Source):
    __slots__ = ("parent", "key")

    def __init__(self, parent, key):
        self.parent = parent
        self.key = key

    def expr(self, base=None):
        return f"{base or self.parent.expr()}[{self.key!r}]"


class ExprSource(Source):
    """Global state read by a Python expression over ``torch`` (for example autocast's switch,
    ``torch.is_autocast_enabled('cpu')``): a guard on what the call's ambient state was."""
    __slots__ = ("text",)

    def __init__(self, text):
        self.text = text

    def expr(self, base=None):
        return self.text


class ModuleSource(Source):
    """An imported Python module, by name (``import x`` inside traced code)."""
    __slots__ = ("name",)

    def __init__(self, name):
        self.name = name

    def expr(self, base=None):
        return f"__import__('sys').modules[{self.name!r}]"


class IntCarrierSource(Source):
    """The graph input standing for a dynamic Python int ``parent``: a tensor of shape
    ``(parent, 0)`` (no storage), whose size 0 is the int's symbol. Built by the fetch on each
    call; every stage reads symbols from input sizes, so the int needs no other path."""
    __slots__ = ("parent",)

    def __init__(self, parent):
        self.parent = parent

    def expr(self, base=None):
        return f"torch.empty(({base or self.parent.expr()}, 0), dtype=torch.uint8)"


def closure_source(fn_source: Source, index: int) -> Source:
    return AttrSource(ItemSource(AttrSource(fn_source, "__closure__"), index), "cell_contents")


# ------------------------------------------------------------------ checks
def _const_check(value) -> str:
    """A check (with ``{}`` for the object) that a Python constant is still the same."""
    if value is None or value is True or value is False or value is Ellipsis:
        return f"{{}} is {value!r}"
    if isinstance(value, torch.dtype):
        return f"{{}} == {value}"
    if isinstance(value, torch.device):
        return f"{{}} == torch.device({str(value)!r})"
    if isinstance(value, float) and math.isnan(value):
        return "type({}) is float and {} != {}"
    if isinstance(value, float) and value == 0.0:
        # 0.0 == -0.0: the sign tells them apart (x / -0.0 is -inf), read off the printed form
        return f"type({{}}) is float and {{}} == 0.0 and str({{}}) == {str(value)!r}"
    if isinstance(value, float) and math.isinf(value):
        return f"type({{}}) is float and {{}} == float({str(value)!r})"
    if isinstance(value, tuple) and any(isinstance(v, float) and v == 0.0 for v in value):
        return f"type({{}}) is tuple and repr({{}}) == {repr(value)!r}"  # keeps -0.0's sign
    return f"type({{}}) is {type(value).__name__} and {{}} == {value!r}"


_CLASS_CHECK = re.compile(r"id\(type\(\{\}\)\) == \d+")
_RELATION = re.compile(r"\{\} (is not|is) (.+)")
# a Python string literal as repr writes one: a guarded constant's repr may hold "{}"
_STRING = re.compile(r"'(?:[^'\\]|\\.)*'" + r'|"(?:[^"\\]|\\.)*"')


def fill(check: str, value: str, marker: str = "{}") -> str:
    """``check`` with ``marker`` replaced by ``value`` outside string literals only: a constant
    ``'w{}'`` filled inside its quotes compared with another string and failed on every call."""
    if "'" not in check and '"' not in check:
        return check.replace(marker, value)
    out, pos = [], 0
    for m in _STRING.finditer(check):
        out += [check[pos:m.start()].replace(marker, value), m.group(0)]
        pos = m.end()
    out.append(check[pos:].replace(marker, value))
    return "".join(out)


def tensor_checks(t: torch.Tensor) -> list[str]:
    if type(t) is torch.Tensor:
        ty = "type({}) is torch.Tensor"
    elif type(t) is torch.nn.Parameter:
        ty = "type({}) is torch.nn.Parameter"
    else:
        raise TypeError(f"tensor subclass {type(t).__name__}")
    # ``is_cpu`` / ``is_cuda`` and ``get_device()`` read flags; ``.device`` builds a torch.device
    # (about 300 ns a check, on every parameter of every call)
    if t.device.type == "cpu":
        dev = "{}.is_cpu"
    elif t.device.type == "cuda" and t.device.index is not None:
        dev = f"{{}}.is_cuda and {{}}.get_device() == {t.device.index}"
    else:
        dev = f"{{}}.device.type == {t.device.type!r}"
        if t.device.index is not None:
            dev += f" and {{}}.device.index == {t.device.index}"
    return [ty, f"{{}}.dtype is {t.dtype}", dev, f"{{}}.shape == {tuple(t.shape)!r}",
            f"{{}}.stride() == {tuple(t.stride())!r}", f"{{}}.requires_grad is {t.requires_grad}"]


def dynamic_tensor_checks(t: torch.Tensor) -> list[str]:
    """The checks of ``tensor_checks`` that do not depend on sizes (those are symbolic)."""
    return [c for c in tensor_checks(t) if ".shape ==" not in c and ".stride() ==" not in c] + \
        [f"{{}}.dim() == {t.dim()}"]


class Temporaries:
    """``temp(source)``: the name of a generated function's local holding ``source``'s value,
    appending ``vN = <parent's local>.attr`` the first time (parents first), with the faster
    spelling of ``fast`` (expr -> Source, fast_sources.py) where there is one."""

    def __init__(self, lines: list, fast: dict, indent: str):
        self.lines, self.fast, self.indent = lines, fast, indent
        self.names: dict[str, str] = {}

    def __call__(self, src: Source) -> str:
        src = self.fast.get(src.expr(), src)
        key = src.expr()
        name = self.names.get(key)
        if name is None:  # LocalSource, GlobalSource, ExprSource have no parent
            rhs = src.expr() if src.parent is None else src.expr(self(src.parent))
            name = self.names[key] = f"{getattr(src, 'prefix', 'v')}{len(self.names)}"
            self.lines.append(f"{self.indent}{name} = {rhs}")
        return name


class GuardSet:
    def __init__(self):
        self.entries: list[tuple[Source, str]] = []
        self._seen: set[tuple[str, str]] = set()
        self._kept: list = []  # objects whose id() a guard compares (kept alive: ids stay unique)
        # symbolic sizes: where each symbol is read, checks over symbols, the ShapeEnv's guards
        self.shape_env = None
        self.symbol_reads: dict = {}              # symbol -> (source, "size(0)" | "stride(1)")
        self.symbolic: list[tuple[Source, str, object]] = []  # (source, accessor, expr)
        self.fast: dict = {}  # expr -> the faster spelling the generated code uses (fast_sources.py)
        # (expr, check) -> the faster check the generated code uses, and the names it reads
        self.fast_checks: dict = {}
        self.fast_names: dict = {}
        self.relations: dict = {}  # expr -> the Source an ``is``/``is not`` check compares with

    @property
    def checked(self) -> set:
        """The (source expr, check) pairs recorded so far."""
        return self._seen

    def dynamic_tensor(self, source, t, shape, stride):
        """Guards for a tensor with symbolic sizes: type, dtype, device and rank as usual, a
        static size per static dim, and each symbolic size or stride read into its symbol (its
        first occurrence) or compared with its expression."""
        for check in dynamic_tensor_checks(t):
            self.add(source, check)
        items = [(f"size({d})", s) for d, s in enumerate(shape)]
        # a size-1 dim's stride never matters for indexing (torch does not check it either)
        items += [(f"stride({d})", st) for d, st in enumerate(stride) if t.shape[d] != 1]
        for accessor, value in items:
            expr = getattr(value, "expr", None)
            if expr is None:
                self.add(source, f"{{}}.{accessor} == {value!r}")
            elif expr.is_Symbol and expr not in self.symbol_reads:
                self.symbol_reads[expr] = (source, accessor)
            else:
                self.symbolic.append((source, accessor, expr))

    def add(self, source: Source, check: str):
        key = (source.expr(), check)
        if key not in self._seen:
            self._seen.add(key)
            self.entries.append((source, check))

    def discard(self, source, check: str):
        """Forget a check (a value turned out to need a weaker one)."""
        key = (source.expr(), check)
        if key in self._seen:
            self._seen.discard(key)
            self.entries = [(s, c) for s, c in self.entries if (s.expr(), c) != key]

    def constant(self, source, value):
        self.add(source, _const_check(value))

    def tensor(self, source, t):
        for check in tensor_checks(t):
            self.add(source, check)

    def identity(self, source, obj):
        self.add(source, f"id({{}}) == {id(obj)}")

    def keep_alive(self, obj):
        self._kept.append(obj)

    def same_object(self, source, other: Source, same: bool = True):
        """``source is other`` (or ``is not``); the generated guard reads ``other`` from its
        temporary instead of evaluating its whole spelling again (GPT-2's guard compared 159
        objects with spellings like ``L['self'].transformer.h[0].attn.forward.__func__.__closure__[3]``,
        each through ``nn.Module.__getattr__`` and ``ModuleList.__getitem__``)."""
        self.relations[other.expr()] = other
        self.add(source, f"{{}} {'is' if same else 'is not'} {other.expr()}")

    def typed(self) -> frozenset:
        """The exprs of the sources whose class a check compares (``id(type({})) == N``): every
        check runs on each hit, so where the guard passes, each of these has its class."""
        return frozenset(s.expr() for s, c in self.entries if _CLASS_CHECK.fullmatch(c))

    def _symbol_names(self, temp=None) -> dict:
        if temp is None:
            return {sym: f"{src.expr()}.{acc}" if acc else src.expr()
                    for sym, (src, acc) in self.symbol_reads.items()}
        return {sym: sym.name for sym in self.symbol_reads}

    def shape_checks(self, names: dict) -> list[tuple[Source | None, str]]:
        """(source, check) for every symbolic check and ShapeEnv guard, over symbol ``names``."""
        out = [(src, f"{{}}.{acc} == {py(expr, names)}") for src, acc, expr in self.symbolic]
        if self.shape_env is not None:
            out += [(None, g) for g in self.shape_env.guard_lines(names)]
        return out

    def exprs(self) -> list[str]:
        names = self._symbol_names()
        return [fill(check, src.expr()) for src, check in self.entries] + \
            [fill(check, src.expr()) if src is not None else check
             for src, check in self.shape_checks(names)]

    def python(self) -> str:
        lines = ["def guard(L, G):"]
        temp = Temporaries(lines, self.fast, "        ")

        # One `if` per run of checks on the same object; a check that raises (an attribute
        # that went away, a shorter tuple) means the guard fails, never an error.
        lines.append("    try:")
        lines.append("        pass")  # a capture may guard nothing (a break at entry)
        from kiln.capture.fast_sources import InstanceDictSource
        emitted: set = set()  # (spelling, check): two sources with one spelling (ClassSource) check once
        i = 0
        while i < len(self.entries):
            src = self.entries[i][0]
            j = i
            while j < len(self.entries) and self.entries[j][0] == src:
                j += 1
            # "": a check that another one implies (fast_sources.fast_checks)
            checks = [c for c in (self.fast_checks.get((s.expr(), c), c) for s, c in self.entries[i:j]) if c]
            i = j
            spelling = self.fast.get(src.expr(), src).expr()
            checks = [c for c in checks if (spelling, c) not in emitted]
            emitted.update((spelling, c) for c in checks)
            if not checks:
                continue
            name = temp(src)
            checks = [self._relation_read(c, temp) for c in checks]
            # ``{} is vN`` where this source's spelling is vN's own (ClassSource): always true
            checks = [c for c in checks if c != f"{{}} is {name}"]
            if not checks:
                continue
            if any("{d}" in _STRING.sub("", c) for c in checks):  # the module's instance dict, read once
                d = temp(InstanceDictSource(self.fast.get(src.expr(), src)))
                checks = [fill(c, d, "{d}") for c in checks]
            cond = " and ".join(f"({fill(c, name)})" if " or " in c else fill(c, name)
                                for c in checks)
            lines.append(f"        if not ({cond}):")
            lines.append("            return False")
        if self.symbol_reads:
            # symbolic sizes: read each symbol once, then the relations recorded on them
            for sym, (src, acc) in self.symbol_reads.items():  # acc "": an int input itself
                lines.append(f"        {sym.name} = {temp(src)}.{acc}" if acc else f"        {sym.name} = {temp(src)}")
            conds = [fill(check, temp(src)) if src is not None else check
                     for src, check in self.shape_checks(self._symbol_names(temp))]
            if conds:
                lines.append(f"        if not ({' and '.join(f'({c})' for c in conds)}):")
                lines.append("            return False")
        lines.append("    except Exception:")
        lines.append("        return False")
        lines.append("    return True")
        return "\n".join(lines) + "\n"

    def _relation_read(self, check: str, temp) -> str:
        """``{} is <other>`` with ``other`` read from its temporary (made here if not yet)."""
        m = _RELATION.fullmatch(check)
        if m is None or m.group(2) not in self.relations:
            return check
        return f"{{}} {m.group(1)} {temp(self.relations[m.group(2)])}"

    def compile(self, L=None, G=None):
        """The guard function; with the frame's locals and globals (at capture), sources that
        read module tables spell them directly (fast_sources.py) in this and later compiles."""
        if L is not None:
            from kiln.capture.fast_sources import class_names, fast_checks, fast_map
            sources = [s for s, _ in self.entries] + [s for s, _ in self.symbol_reads.values()] + \
                [s for s, _, _ in self.symbolic] + list(self.relations.values())
            typed = self.typed()
            self.fast = fast_map(sources, L, G or {}, typed, self.checked)
            self.fast_checks, self.fast_names = fast_checks(self.entries, L, G or {}, self.fast, typed)
            self.fast_names.update(class_names(self.fast))
        source = self.python()
        namespace = {"torch": torch, **self.fast_names}
        exec(compile(bind_torch_names(source, namespace), "<kiln guard>", "exec"), namespace)
        return source, namespace["guard"]


_BOUND_DOTTED = frozenset({"Tensor", "nn.Parameter", "is_autocast_enabled", "is_grad_enabled"}) | \
    frozenset(str(d).replace("torch.", "") for d in (
        torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int64, torch.int32,
        torch.int16, torch.int8, torch.uint8, torch.bool, torch.complex64, torch.complex128))


# A string literal (skipped whole), or ``torch.<name>``/``torch.nn.Parameter`` standing alone:
# not after a dot or a name character, and not followed by another attribute or name character.
_TORCH_NAME = re.compile(r"""(?P<str>'(?:[^'\\\n]|\\.)*'|"(?:[^"\\\n]|\\.)*")"""
                         r"""|(?<![\w.])torch\.(?P<dotted>nn\.Parameter|[A-Za-z_]\w*)(?![\w.])""")


def bind_torch_names(source: str, namespace: dict) -> str:
    """The guard's source with ``torch.Tensor``, ``torch.nn.Parameter``, dtypes and the
    autocast/grad flags read from names bound once in ``namespace`` (one global load instead
    of two or three attribute loads per use: 15-20% of a tensor's checks). Only code is
    rewritten, never string constants; the source shown in logs keeps the torch spelling.
    (A regular expression: ``tokenize`` took 0.08 s of GPT-2's capture, every process.)"""
    def bind(m):
        dotted = m.group("dotted")
        if dotted is None or dotted not in _BOUND_DOTTED:
            return m.group(0)
        name = "_torch_" + dotted.replace(".", "_")
        if name not in namespace:
            obj = torch
            for part in dotted.split("."):
                obj = getattr(obj, part)
            namespace[name] = obj
        return name
    return _TORCH_NAME.sub(bind, source)


def make_fetch(sources: list[Source], globals_: dict | None = None, fast: dict | None = None):
    """``fetch(L) -> tuple`` of graph inputs (``G`` is bound to the function's globals). Each
    object on the way is read once into a temporary; ``fast`` (expr -> Source, from
    ``fast_sources.fast_map``) gives faster spellings of module table reads."""
    lines = ["def fetch(L, G=G):"]
    temp = Temporaries(lines, fast or {}, "    ")
    names = [temp(s) for s in sources]
    lines.append(f"    return ({''.join(n + ', ' for n in names)})")
    source = "\n".join(lines) + "\n"
    from kiln.capture.fast_sources import class_names
    namespace = {"torch": torch, "G": globals_, **class_names(fast or {})}
    exec(compile(source, "<kiln fetch>", "exec"), namespace)
    return source, namespace["fetch"]


def argument_guards(L: dict) -> GuardSet:
    """Guards on a call's arguments alone, for a call whose capture failed (api.EagerEntry):
    a tensor's metadata, a constant's value, anything else's type."""
    g = GuardSet()
    for name, value in L.items():
        if not isinstance(name, str) or not name.isidentifier():  # the closure's cells
            continue
        source = LocalSource(name)
        if type(value) in (torch.Tensor, torch.nn.Parameter):
            g.tensor(source, value)
        elif value is None or type(value) in (bool, int, float, str):
            g.constant(source, value)
        else:
            g.add(source, f"id(type({{}})) == {id(type(value))}")
            g.keep_alive(type(value))
    return g


# ------------------------------------------------------------------ why a guard failed
def pretty(expr: str) -> str:
    """``L['self'].lin.training`` -> ``self.lin.training``; ``G['MODE']`` -> ``MODE``."""
    import re
    expr = re.sub(r"__import__\('sys'\)\.modules\[(['\"])([^'\"]+)\1\]", r"\2", expr)  # ModuleSource
    return re.sub(r"\b[LG]\[(['\"])([^'\"]+)\1\]", r"\2", expr)


def _describe(name: str, check: str, value) -> str:
    """Plain words for a failed check ``check`` ({} is the object) on ``value`` (read now)."""
    import re
    if check.startswith("id({}) == "):
        return f"{name} is a different object than when it was compiled"
    if check.startswith("not {}._forward_hooks") or check.startswith("not ({}._forward_hooks"):
        return f"{name} has hooks now"
    if check.startswith("not ({}._global_"):
        return "global module hooks (torch.nn.modules.module) are registered now"
    if check.startswith("not ({}._backward_hooks"):
        return f"{name} has backward hooks now"
    if check.startswith("list(map(") and "_hooks_with_kwargs" in check:
        return f"which hooks of {name} take kwargs changed"
    if check == "{}.is_cpu" or check.startswith("{}.is_cuda and ") or check.startswith("{}.device.type == "):
        return f"{name} is on {getattr(value, 'device', type(value).__name__)} now"
    if check.startswith("hasattr("):
        return f"{name} gained or lost attribute {check.split(', ')[1].split(')')[0]}"
    m = re.fullmatch(r"type\(\{\}\) is (\w+) and \{\} == (.*)", check)
    if m:
        was = m.group(2)
        now = repr(value)
        if type(value).__name__ != m.group(1):
            return f"{name} changed: was {was} ({m.group(1)}), now {now} ({type(value).__name__})"
        return f"{name} changed: was {was}, now {now}"
    m = re.fullmatch(r"(?:type\(\{\}\) is \w+ and |id\(type\(\{\}\)\) == \d+ and )?len\(\{\}\) == (\d+)", check)
    if m:
        try:
            now = len(value)
        except TypeError:
            return f"{name} is not a sized container any more (now a {type(value).__name__})"
        return f"len({name}) changed: was {m.group(1)}, now {now}"
    m = re.fullmatch(r"type\(\{\}\) is (?:\w|\.)+", check) or re.fullmatch(r"id\(type\(\{\}\)\) == \d+", check)
    if m:
        return f"the type of {name} changed: now {type(value).__name__}"
    m = re.fullmatch(r"\{\}((?:\.\w+(?:\(\))?)+) (==|is) (.*)", check)
    if m:
        accessor, was = m.group(1), m.group(3)
        try:
            now = eval(f"v{accessor}", {"torch": torch}, {"v": value})  # noqa: S307
            now = tuple(now) if isinstance(now, torch.Size) else now
        except Exception as e:  # noqa: BLE001
            now = f"unreadable ({type(e).__name__})"
        return f"{name}{accessor} changed: was {was}, now {now!r}"
    m = re.fullmatch(r"\{\} (==|is) (.*)", check)
    if m:
        return f"{name} changed: was {m.group(2)}, now {value!r}"
    return f"guard failed: {fill(check, name)} ({name} is now {value!r})"


def explain_failure(guard_set: "GuardSet", L: dict, G: dict) -> str | None:
    """The first failing guard of ``guard_set`` for a call's ``L``/``G``, in plain words (for the
    ``recompiles`` log); None when every recorded check passes."""
    env = {"torch": torch, "math": math}
    for source, check in guard_set.entries:
        name = pretty(source.expr())
        try:
            value = eval(source.expr(), env, {"L": L, "G": G})  # noqa: S307
        except Exception as e:  # noqa: BLE001
            return f"{name} cannot be read any more ({type(e).__name__}: {e})"
        try:
            ok = eval(fill(check, "v"), env, {"v": value})  # noqa: S307
        except Exception:  # noqa: BLE001 - a check that cannot run has failed
            ok = False
        if not ok:
            return _describe(name, check, value)
    return None


def add_default_guards(guards: GuardSet, reads: dict):
    """Guards on torch's default dtype and device read during a trace (``reads``, from
    ``meta.defaults.watching``)."""
    if "dtype" in reads:
        guards.add(ExprSource("torch.get_default_dtype()"), f"{{}} == {reads['dtype']}")
    if "device" in reads:
        guards.add(ExprSource("torch.get_default_device()"), f"{{}} == torch.device({str(reads['device'])!r})")
