"""Faster spellings of sources for the generated guard and fetch functions.

A source like ``L['self'].blocks[3].attn.qkv.weight`` reads each step through
``nn.Module.__getattr__`` (a Python function that searches ``_parameters``, ``_buffers`` and
``_modules``) and ``nn.ModuleList.__getitem__`` (which normalizes the index in Python): on a
12-layer GPT that was most of the guard's and the fetch's time per call. Where the traced
objects show that a step resolves through one of those tables, the generated code reads the
table directly: ``v._modules['blocks']._modules['3']._modules['attn']._parameters['weight']``.

A rewrite is made only when it names the same object for every state of the module where the
original spelling succeeds with a module lookup: the name is not an attribute of the class or
the instance (``nn.Module.__setattr__`` keeps the tables and the instance dict disjoint), and
an index into an ``nn.ModuleList``/``nn.ModuleDict`` whose ``__getitem__`` is torch's own,
and an int index into an ``nn.Sequential`` (read from ``tuple(seq._modules.values())``, which
is what its ``__getitem__`` returns for any state of the table).
Anything else keeps its plain spelling. The readable spellings stay what the guards print
(``GuardSet.exprs``, explain, recompile reasons); only the generated code uses these.
"""
from __future__ import annotations

import re

import torch

from kiln.capture.guards import AttrSource, ItemSource, Source

_TABLES = ("_parameters", "_buffers", "_modules")
_MISSING = object()


class ModuleEntrySource(Source):
    """``parent.<table>[key]``: one entry of a module's parameter, buffer or submodule table."""
    __slots__ = ("parent", "table", "key")

    def __init__(self, parent, table: str, key: str):
        self.parent, self.table, self.key = parent, table, key

    def expr(self, base=None):
        return f"{base or self.parent.expr()}.{self.table}[{self.key!r}]"


class ModuleValuesSource(Source):
    """``tuple(parent._modules.values())``: an ``nn.Sequential``'s children in order. Indexing
    it is what ``Sequential.__getitem__`` does with an int (the idx-th entry of ``_modules``),
    without its Python-level normalization; the guard reads it once into a temporary."""
    __slots__ = ("parent",)

    def __init__(self, parent):
        self.parent = parent

    def expr(self, base=None):
        return f"tuple({base or self.parent.expr()}._modules.values())"


def _class_has(obj, name: str) -> bool:
    return any(name in vars(klass) for klass in type(obj).__mro__)


def _module_table(obj, name: str):
    """The table an attribute read of ``name`` on module ``obj`` resolves through, or None."""
    if _class_has(obj, name) or name in obj.__dict__:
        return None
    for table in _TABLES:
        entries = obj.__dict__.get(table)
        if entries is not None and name in entries:
            return table
    return None


def _is_sequential_index(obj, key) -> bool:
    nn = torch.nn
    return isinstance(obj, nn.Sequential) and type(obj).__getitem__ is nn.Sequential.__getitem__ and \
        type(key) is int and 0 <= key < len(obj._modules)


def _item_key(obj, key):
    """The ``_modules`` key an index into a ModuleList/ModuleDict reads, or None."""
    nn = torch.nn
    if isinstance(obj, nn.ModuleList) and type(obj).__getitem__ is nn.ModuleList.__getitem__:
        if type(key) is int and 0 <= key < len(obj):
            return str(key)
    if isinstance(obj, nn.ModuleDict) and type(obj).__getitem__ is nn.ModuleDict.__getitem__:
        if type(key) is str and key in obj._modules:
            return key
    return None


def _evaluator(L: dict, G: dict):
    """value(expr text) -> the object it names now, or ``_MISSING`` (cached per text)."""
    values: dict = {}

    def value(text):
        if text not in values:
            try:
                values[text] = eval(text, {"torch": torch, "__builtins__": __builtins__}, {"L": L, "G": G})
            except Exception:  # noqa: BLE001 - gone since tracing: keep the plain spelling
                values[text] = _MISSING
        return values[text]
    return value


def fast_map(sources, L: dict, G: dict) -> dict:
    """expr -> faster Source, for every source (and its parents) that has one."""
    evaluate = _evaluator(L, G)
    out: dict = {}
    done: dict = {}  # every source visited, rewritten or not: each chain is walked once (a
    # source with no faster form was walked again from each child, 2^depth times; a deep
    # source under a forward's closure hung ViT's training trace)

    def value(src):
        return evaluate(faster(src).expr())

    def faster(src):
        key = src.expr()
        if key not in done:
            done[key] = _faster(src, key)
        return done[key] or src  # None: no faster form, the source itself

    def _faster(src, key):
        parent = getattr(src, "parent", None)
        if parent is None:
            return None
        fast_parent = faster(parent)
        obj = value(parent)
        result = None
        if isinstance(obj, torch.nn.Module):
            if isinstance(src, AttrSource):
                table = _module_table(obj, src.attr)
                if table is not None:
                    result = ModuleEntrySource(fast_parent, table, src.attr)
            elif isinstance(src, ItemSource):
                entry = _item_key(obj, src.key)
                if entry is not None:
                    result = ModuleEntrySource(fast_parent, "_modules", entry)
                elif _is_sequential_index(obj, src.key):
                    result = ItemSource(ModuleValuesSource(fast_parent), src.key)
        if result is None and fast_parent is not parent:
            result = _with_parent(src, fast_parent)
        if result is not None:
            out[key] = result
        return result

    for s in sources:
        if s is not None:
            faster(s)
    return out


def _with_parent(src, parent):
    if isinstance(src, AttrSource):
        return AttrSource(parent, src.attr)
    if isinstance(src, ItemSource):
        return ItemSource(parent, src.key)
    if isinstance(src, ModuleEntrySource):
        return ModuleEntrySource(parent, src.table, src.key)
    if isinstance(src, ModuleValuesSource):
        return ModuleValuesSource(parent)
    return None  # a source kind with no parent to swap: keep the plain spelling


# ---- faster spellings of checks

# A module's own attributes, read through its instance dict once it is known to be of the
# guarded class (which has no class attribute of that name): ``d['training']`` for
# ``m.training`` (the type's MRO is searched first on every plain read). ``{d}`` stands for
# the run's temporary holding ``m.__dict__`` (GuardSet.python).
_ATTR = re.compile(r"\{\}\.([A-Za-z_]\w*)(?![\w(])")


def fast_checks(entries, L: dict, G: dict, fast: dict) -> tuple[dict, dict]:
    """((source expr, check) -> faster check, names the faster checks read), for the checks
    that have one, given the objects the sources name at capture:

    - ``id(type({})) == N`` becomes ``type({}) is _tK`` with the class bound in the guard's
      namespace (keeping it alive, which the id comparison needed anyway);
    - on a module, after its class is checked, ``{}.name`` for a name in its instance dict
      and in no class of its MRO reads that dict (``{d}['name']``), ``{}.__dict__`` is ``{d}``;
    - on a tensor with no size-1 dim, the ``stride()`` comparison with contiguous strides is
      ``is_contiguous()`` (exact there: every stride is compared; a tuple is not built).
    """
    value = _evaluator(L, G)
    out: dict = {}
    names: dict = {}
    classes: dict = {}  # id(class) -> bound name
    typed: set = set()  # sources whose class an earlier check compared
    for src, check in entries:
        key = src.expr()
        obj = value(fast.get(key, src).expr())
        if obj is _MISSING:
            continue
        new = check
        type_check = f"id(type({{}})) == {id(type(obj))}"
        if type_check in new:
            name = classes.setdefault(id(type(obj)), f"_t{len(classes)}")
            names[name] = type(obj)
            new = new.replace(type_check, f"type({{}}) is {name}")
            if new.startswith(f"type({{}}) is {name}"):
                typed.add(key)
                new = new[:len(f"type({{}}) is {name}")] + _module_dict_reads(new[len(f"type({{}}) is {name}"):], obj)
        elif key in typed:
            new = _module_dict_reads(new, obj)
        if isinstance(obj, torch.Tensor) and check == f"{{}}.stride() == {tuple(obj.stride())!r}" and \
                obj.numel() > 0 and 1 not in obj.shape and obj.is_contiguous():
            new = "{}.is_contiguous()"
        if new != check:
            out[(key, check)] = new
    return out, names


def _module_dict_reads(check: str, obj) -> str:
    if not isinstance(obj, torch.nn.Module) or type(obj).__getattribute__ is not object.__getattribute__:
        return check
    own = obj.__dict__

    def read(m):
        attr = m.group(1)
        if attr == "__dict__":
            return "{d}"
        if attr in own and not _class_has(obj, attr):
            return f"{{d}}[{attr!r}]"
        return m.group(0)
    return _ATTR.sub(read, check)
