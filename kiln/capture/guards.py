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

import torch


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
    if isinstance(value, float) and math.isinf(value):
        return f"type({{}}) is float and {{}} == float({str(value)!r})"
    return f"type({{}}) is {type(value).__name__} and {{}} == {value!r}"


def tensor_checks(t: torch.Tensor) -> list[str]:
    if type(t) is torch.Tensor:
        ty = "type({}) is torch.Tensor"
    elif type(t) is torch.nn.Parameter:
        ty = "type({}) is torch.nn.Parameter"
    else:
        raise TypeError(f"tensor subclass {type(t).__name__}")
    dev = f"{{}}.device.type == {t.device.type!r}"
    if t.device.index is not None:
        dev += f" and {{}}.device.index == {t.device.index}"
    return [ty, f"{{}}.dtype == {t.dtype}", dev, f"{{}}.shape == {tuple(t.shape)!r}",
            f"{{}}.stride() == {tuple(t.stride())!r}", f"{{}}.requires_grad is {t.requires_grad}"]


class GuardSet:
    def __init__(self):
        self.entries: list[tuple[Source, str]] = []
        self._seen: set[tuple[str, str]] = set()

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

    def same_object(self, source, other: Source):
        self.add(source, f"{{}} is {other.expr()}")

    def exprs(self) -> list[str]:
        return [check.replace("{}", src.expr()) for src, check in self.entries]

    def python(self) -> str:
        temps: dict[str, str] = {}
        lines = ["def guard(L, G):"]

        def temp(src: Source) -> str:
            key = src.expr()
            if key in temps:
                return temps[key]
            if src.parent is None:  # LocalSource, GlobalSource, ExprSource
                rhs = src.expr()
            else:
                rhs = src.expr(temp(src.parent))
            name = f"v{len(temps)}"
            temps[key] = name
            lines.append(f"        {name} = {rhs}")
            return name

        # One `if` per run of checks on the same object; a check that raises (an attribute
        # that went away, a shorter tuple) means the guard fails, never an error.
        lines.append("    try:")
        lines.append("        pass")  # a capture may guard nothing (a break at entry)
        i = 0
        while i < len(self.entries):
            src = self.entries[i][0]
            j = i
            while j < len(self.entries) and self.entries[j][0] == src:
                j += 1
            name = temp(src)
            cond = " and ".join(f"({c.replace('{}', name)})" if " or " in c else c.replace("{}", name)
                                for _, c in self.entries[i:j])
            lines.append(f"        if not ({cond}):")
            lines.append("            return False")
            i = j
        lines.append("    except Exception:")
        lines.append("        return False")
        lines.append("    return True")
        return "\n".join(lines) + "\n"

    def compile(self):
        source = self.python()
        namespace = {"torch": torch}
        exec(compile(source, "<kiln guard>", "exec"), namespace)
        return source, namespace["guard"]


def make_fetch(sources: list[Source], globals_: dict | None = None):
    """``fetch(L) -> tuple`` of graph inputs (``G`` is bound to the function's globals)."""
    body = "".join(f"{s.expr()}, " for s in sources)
    source = f"def fetch(L, G=G):\n    return ({body})\n"
    namespace = {"torch": torch, "G": globals_}
    exec(compile(source, "<kiln fetch>", "exec"), namespace)
    return source, namespace["fetch"]
