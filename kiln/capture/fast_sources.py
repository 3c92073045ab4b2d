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

A module whose class the guard compares (``typed``: ``Tracer._wrap_module`` guards every module
by type) is read further through its instance dict, fetched once into a temporary
(``d = m.__dict__``): its tables (``d['_modules']['fc']``) and its own plain attributes
(``d['stride']``), where no class in its MRO has the name and ``__getattribute__`` is
object's. Then the attribute read finds the instance dict's entry first, so both spellings
name the same object for every state the class check lets through. ``nn.Module`` defines
``__getattr__``, which keeps CPython from specializing any attribute read on a module: each
one searched the MRO and then the dict (a ResNet-50-deep guard read 531 tables and 479
attributes this way).
"""
from __future__ import annotations

import ast
import re
import types
import weakref

import torch

from kiln.capture.guards import AttrSource, ItemSource, Source, _const_check

_TABLES = ("_parameters", "_buffers", "_modules")
_MISSING = object()


class ModuleValuesSource(Source):
    """``tuple(table.values())`` of an ``nn.Sequential``'s ``_modules`` table (``parent``): its
    children in order. Indexing it is what ``Sequential.__getitem__`` does with an int (the
    idx-th entry of ``_modules``), without its Python-level normalization; the guard reads it
    once into a temporary."""
    __slots__ = ("parent",)

    def __init__(self, parent):
        self.parent = parent

    def expr(self, base=None):
        return f"tuple({base or self.parent.expr()}.values())"


class InstanceDictSource(Source):
    """``parent.__dict__``: a module's instance dict, read once into a temporary (``dN``)."""
    __slots__ = ("parent",)
    prefix = "d"

    def __init__(self, parent):
        self.parent = parent

    def expr(self, base=None):
        return f"{base or self.parent.expr()}.__dict__"


# Classes a ClassSource names, by the name it spells them with: the generated functions bind
# them in their namespace (``class_names``); weak, so a guard keeps alive only what it binds
_CLASSES: "weakref.WeakValueDictionary[str, type]" = weakref.WeakValueDictionary()


class ClassSource(Source):
    """A class the guard compares some object's type with, as a constant bound in the
    generated function's namespace (``_kc<id>``). A method's function reached through a typed
    instance (``m.forward.__func__``) is spelled as the class attribute (``_kcN.forward``):
    every instance of the class then reads and checks the function, its closure and its
    globals through one temporary, once per guard, instead of once per instance (the twelve
    identical blocks of a transformer walked the same decorator closures twelve times)."""
    __slots__ = ("cls",)

    def __init__(self, cls):
        self.cls = cls
        _CLASSES[self.expr()] = cls

    def expr(self, base=None):
        return f"_kc{id(self.cls)}"


def class_names(fast: dict) -> dict:
    """The classes the spellings in ``fast`` name (a ClassSource at their root), by name."""
    out = {}
    for src in fast.values():
        while src is not None:
            if isinstance(src, ClassSource):
                out[src.expr()] = src.cls
            src = getattr(src, "parent", None)
    return out


def _class_function(obj, name: str):
    """``type(obj).name`` where ``obj.name`` is that plain function bound to ``obj`` (found on
    the class, not the instance), else None."""
    if name in getattr(obj, "__dict__", {}) or not _reads_instance_dict(obj):
        return None
    for klass in type(obj).__mro__:
        if name in vars(klass):
            fn = vars(klass)[name]
            break
    else:
        return None
    if type(fn) is not types.FunctionType or type(type(obj)).__getattribute__ is not type.__getattribute__:
        return None
    bound = getattr(obj, name, None)
    return fn if isinstance(bound, types.MethodType) and bound.__func__ is fn and bound.__self__ is obj else None


def _class_has(obj, name: str) -> bool:
    return any(name in vars(klass) for klass in type(obj).__mro__)


def _reads_instance_dict(obj) -> bool:
    """Whether ``obj.name`` for a name in no class of its MRO is ``obj.__dict__[name]`` when
    present: object's ``__getattribute__``, and ``__dict__`` the instance dict's own descriptor."""
    if type(obj).__getattribute__ is not object.__getattribute__:
        return False
    for klass in type(obj).__mro__:
        if "__dict__" in vars(klass):
            return type(vars(klass)["__dict__"]).__name__ == "getset_descriptor"
    return False


def _own_attr(obj, name: str) -> bool:
    """``obj.name`` reads ``obj.__dict__[name]`` (given ``_reads_instance_dict(obj)``)."""
    return name in obj.__dict__ and not _class_has(obj, name)


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
                values[text] = eval(text, {"torch": torch, "__builtins__": __builtins__, **_CLASSES},
                                    {"L": L, "G": G})
            except Exception:  # noqa: BLE001 - gone since tracing: keep the plain spelling
                values[text] = _MISSING
        return values[text]
    return value


def fast_map(sources, L: dict, G: dict, typed=frozenset(), checked=None) -> dict:
    """expr -> faster Source, for every source (and its parents) that has one. ``typed``: the
    exprs of the sources whose class the guard compares; their reads may go through the
    instance dict (the module docstring says when). ``checked``: the guard's (expr, check)
    pairs; ``m.f.__func__`` is read off the class (ClassSource) where ``m`` is typed and the
    guard checks ``'f' not in m.__dict__``."""
    evaluate = _evaluator(L, G)
    out: dict = {}
    checked = checked or frozenset()
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
        if isinstance(src, AttrSource) and src.attr == "__func__" and isinstance(parent, AttrSource):
            result = _class_method_source(parent, value(parent.parent), typed, checked)
            if result is not None:
                out[key] = result
                return result
        if isinstance(obj, torch.nn.Module):
            own = InstanceDictSource(fast_parent) if parent.expr() in typed and _reads_instance_dict(obj) else None

            def table_of(name):
                if own is not None and _own_attr(obj, name):
                    return ItemSource(own, name)
                return AttrSource(fast_parent, name)
            if isinstance(src, AttrSource):
                table = _module_table(obj, src.attr)
                if table is not None:
                    result = ItemSource(table_of(table), src.attr)
                elif own is not None and _own_attr(obj, src.attr):
                    result = ItemSource(own, src.attr)
            elif isinstance(src, ItemSource):
                entry = _item_key(obj, src.key)
                if entry is not None:
                    result = ItemSource(table_of("_modules"), entry)
                elif _is_sequential_index(obj, src.key):
                    result = ItemSource(ModuleValuesSource(table_of("_modules")), src.key)
        if result is None and fast_parent is not parent:
            result = _with_parent(src, fast_parent)
        if result is not None:
            out[key] = result
        return result

    for s in sources:
        if s is not None:
            faster(s)
    return out


def _class_method_source(method_src, owner, typed, checked):
    """``_kcN.f`` for ``owner.f.__func__`` (``method_src`` is ``owner.f``), where the guard
    compares ``owner``'s class and checks that ``f`` is not in its instance dict: then, on every
    call the guard lets through, ``owner.f`` is the class's function bound to ``owner``."""
    owner_expr = method_src.parent.expr()
    name = method_src.attr
    if owner_expr not in typed or (owner_expr, f"{name!r} not in {{}}.__dict__") not in checked:
        return None
    if _class_function(owner, name) is None:
        return None
    return AttrSource(ClassSource(type(owner)), name)


def _with_parent(src, parent):
    if isinstance(src, AttrSource):
        return AttrSource(parent, src.attr)
    if isinstance(src, ItemSource):
        return ItemSource(parent, src.key)
    if isinstance(src, ModuleValuesSource):
        return ModuleValuesSource(parent)
    if isinstance(src, InstanceDictSource):
        return InstanceDictSource(parent)
    return None  # a source kind with no parent to swap: keep the plain spelling


# ---- faster spellings of checks

# A module's own attributes, read through its instance dict once it is known to be of the
# guarded class (which has no class attribute of that name): ``d['training']`` for
# ``m.training`` (the type's MRO is searched first on every plain read). ``{d}`` stands for
# the temporary holding ``m.__dict__`` (GuardSet.python).
_ATTR = re.compile(r"\{\}\.([A-Za-z_]\w*)(?![\w(])")
# ``len(m)`` of a container whose ``__len__`` is torch's own ``len(self._modules)`` (a Python
# function: a frame per call)
_LEN = re.compile(r"(?<![\w.])len\(\{\}\)")
_LEN_OF_MODULES = {torch.nn.ModuleList.__len__, torch.nn.Sequential.__len__, torch.nn.ModuleDict.__len__}


def fast_checks(entries, L: dict, G: dict, fast: dict, typed=frozenset()) -> tuple[dict, dict]:
    """((source expr, check) -> faster check, names the faster checks read), for the checks
    that have one, given the objects the sources name at capture; ``""`` for a check another
    one implies. ``typed``: the exprs of sources whose class the guard compares (every check
    runs on every hit, so a read may rely on a class check anywhere in the guard).

    - ``id(type({})) == N`` becomes ``type({}) is _tK`` with the class bound in the guard's
      namespace (keeping it alive, which the id comparison needed anyway);
    - on a typed module, ``{}.name`` for a name in its instance dict and in no class of its MRO
      reads that dict (``{d}['name']``), ``{}.__dict__`` is ``{d}``, and ``len({})`` of a
      ModuleList/Sequential/ModuleDict with torch's ``__len__`` is ``len({d}['_modules'])``;
    - on a tensor with no size-1 dim, the ``stride()`` comparison with contiguous strides is
      ``is_contiguous()`` (exact there: every stride is compared; a tuple is not built);
    - ``_implied_checks`` and ``_folded_tuples`` below.
    """
    value = _evaluator(L, G)
    out: dict = {}
    names: dict = {}
    classes: dict = {}  # id(class) -> bound name
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
        if key in typed:
            new = _module_dict_reads(new, obj)
        if isinstance(obj, torch.Tensor) and check == f"{{}}.stride() == {tuple(obj.stride())!r}" and \
                obj.numel() > 0 and 1 not in obj.shape and obj.is_contiguous():
            new = "{}.is_contiguous()"
        if new != check:
            out[(key, check)] = new
    out.update(_implied_checks(entries, fast, out))
    out.update(_folded_tuples(entries))
    return out, names


def _module_dict_reads(check: str, obj) -> str:
    if not isinstance(obj, torch.nn.Module) or not _reads_instance_dict(obj):
        return check

    def read(m):
        attr = m.group(1)
        if attr == "__dict__":
            return "{d}"
        if _own_attr(obj, attr):
            return f"{{d}}[{attr!r}]"
        return m.group(0)
    check = _ATTR.sub(read, check)
    if getattr(type(obj), "__len__", None) in _LEN_OF_MODULES and _own_attr(obj, "_modules"):
        check = _LEN.sub("len({d}['_modules'])", check)
    return check


def _implied_checks(entries, fast: dict, checks: dict) -> dict:
    """``m.name is X`` on the attribute's own source, where ``m``'s checks already compare
    ``{d}['name'] is X`` and both read the same entry of ``m``'s instance dict (a BatchNorm's
    ``self.training`` beside the ``training`` every module is guarded on): ``""``, dropped."""
    own = {(s.expr(), checks.get((s.expr(), c), c)) for s, c in entries}
    out = {}
    for src, check in entries:
        fast_src = fast.get(src.expr())
        if not (isinstance(src, AttrSource) and check.startswith("{} is ") and isinstance(fast_src, ItemSource)
                and isinstance(fast_src.parent, InstanceDictSource) and fast_src.key == src.attr):
            continue
        if (src.parent.expr(), f"{{d}}[{src.attr!r}] {check[3:]}") in own:
            out[(src.expr(), check)] = ""
    return out


# A tuple item's constant check as ``guards._const_check`` writes it
_ITEM_CHECK = re.compile(r"type\(\{\}\) is (int|str|float) and \{\} == (.+)|\{\} is (None|True|False)")


def _folded_tuples(entries) -> dict:
    """A tuple of constants (a convolution's ``stride``, ``padding``, ``dilation``), guarded as
    ``type({}) is tuple and len({}) == n`` and one check per item, becomes one check on the
    tuple: ``{} == (2, 2)`` and each item's type (``True == 1`` and ``2.0 == 2``: the equality
    alone would let them through). The items' own checks are dropped (``""``)."""
    by_source: dict = {}
    for src, check in entries:
        by_source.setdefault(src.expr(), []).append(check)
    out = {}
    for src, check in entries:
        m = re.fullmatch(r"type\(\{\}\) is tuple and len\(\{\}\) == (\d+)", check)
        if m is None:
            continue
        items = [(ItemSource(src, i).expr(), by_source.get(ItemSource(src, i).expr(), ())) for i in range(int(m.group(1)))]
        folded = [_folded_item(i, checks[0]) if len(checks) == 1 else None for i, (_, checks) in enumerate(items)]
        if not items or None in folded:
            continue
        values = ", ".join(v for v, _ in folded) + ("," if len(folded) == 1 else "")
        out[(src.expr(), check)] = " and ".join([f"type({{}}) is tuple and {{}} == ({values})"] + [t for _, t in folded])
        out.update(((key, checks[0]), "") for key, checks in items)
    return out


def _folded_item(i: int, check: str):
    """(the constant's text, the check of item ``i``'s type), or None for a check of another
    form (a nested tuple, a NaN, a signed zero)."""
    m = _ITEM_CHECK.fullmatch(check)
    if m is None:
        return None
    if m.group(3) is not None:
        return m.group(3), f"{{}}[{i}] is {m.group(3)}"
    try:
        value = ast.literal_eval(m.group(2))
    except (ValueError, SyntaxError):
        return None
    if type(value).__name__ != m.group(1) or _const_check(value) != check or "{}" in m.group(2):
        return None
    return m.group(2), f"type({{}}[{i}]) is {m.group(1)}"
