"""``module.modules()``, ``named_modules()``, ``parameters()``, ``named_parameters()``,
``buffers()`` and ``named_buffers()`` of a real module during capture.

torch writes them as generators (``named_modules`` recurses with ``yield from``), which capture
does not run: ``next(self.parameters()).dtype`` and transformers' ``self.dtype`` (which walks
``named_modules``) broke and ran the rest of the forward eagerly. The walk is computed now on the
real module, as torch's generators compute it (a None entry skipped, each object yielded once
unless ``remove_duplicate=False``), and returned as an iterator of trackers reached through
``_modules[k]`` / ``_parameters[k]`` / ``_buffers[k]`` sources. Guards: the key list of each
table the walk read, and ``is None`` for the entries it skipped; each yielded object is guarded
by its own tracker, as any attribute read is.
"""
from __future__ import annotations

import inspect

import torch

from kiln.capture.errors import Unsupported
from kiln.capture.guards import ItemSource
from kiln.capture.values import ConstantVariable, IteratorVariable, TupleVariable, Variable

WALKS = ("modules", "named_modules", "parameters", "named_parameters", "buffers", "named_buffers")
_TABLE = {"parameters": "_parameters", "buffers": "_buffers"}


class ModuleWalkVariable(Variable):
    """``root.<name>`` for one of ``WALKS`` that is torch.nn.Module's own method."""

    def __init__(self, root, name: str):
        self.root, self.name = root, name

    def call(self, tx, args, kwargs):
        try:
            values = [a.as_python() for a in args]
            kw = {k: v.as_python() for k, v in kwargs.items()}
        except Exception:  # noqa: BLE001 - an argument known only at run time
            raise Unsupported(f"Module.{self.name} with arguments that are not constants") from None
        bound = inspect.signature(getattr(torch.nn.Module, self.name)).bind(None, *values, **kw)
        bound.apply_defaults()
        a = dict(bound.arguments)
        a.pop("self")
        named = self.name.startswith("named_")
        kind = self.name.removeprefix("named_")
        if kind == "modules":
            if a.get("memo") is not None:
                raise Unsupported("Module.named_modules with a memo of the caller's")
            walked = _walk(tx, self.root, a.get("prefix", ""), a.get("remove_duplicate", True), set())
        else:
            walked = _members(tx, self.root, _TABLE[kind], a.get("prefix", ""), a.get("recurse", True),
                              a.get("remove_duplicate", True))
        items = [TupleVariable([ConstantVariable(n), v]) if named else v for n, v in walked]
        return IteratorVariable(items)

    def __repr__(self):
        return f"ModuleWalk({self.name})"


def _table(tx, var, table: str):
    """(key, value, source) of a module tracker's ``_modules``/``_parameters``/``_buffers``,
    guarded on its keys and on the None entries."""
    holder = tx.attr_source(var.source, table)
    entries = getattr(var.module, table)
    keys = list(entries.keys())
    tx.guards.add(var.source, f"list({{}}.{table}.keys()) == {keys!r}")
    out = []
    for k in keys:
        v = entries[k]
        if v is None:
            tx.guards.add(ItemSource(holder, k), "{} is None")
        out.append((k, v, ItemSource(holder, k)))
    return out


def _walk(tx, var, prefix, remove_duplicate, memo):
    """torch's ``named_modules``: (name, tracker) of ``var``'s module and its submodules."""
    if remove_duplicate:
        if id(var.module) in memo:
            return []
        memo.add(id(var.module))
    out = [(prefix, var)]
    for k, m, src in _table(tx, var, "_modules"):
        if m is None:
            continue
        child = tx.wrap(m, src)
        if getattr(child, "module", None) is not m:
            raise Unsupported(f"Module.named_modules: submodule {k!r} is not tracked as a module")
        out += _walk(tx, child, prefix + ("." if prefix else "") + k, remove_duplicate, memo)
    return out


def _members(tx, var, table, prefix, recurse, remove_duplicate):
    """torch's ``_named_members``: (name, tracker) of each module's parameters or buffers."""
    modules = _walk(tx, var, prefix, remove_duplicate, set()) if recurse else [(prefix, var)]
    seen, out = set(), []
    for module_prefix, mod in modules:
        for k, v, src in _table(tx, mod, table):
            if v is None or id(v) in seen:
                continue
            if remove_duplicate:
                seen.add(id(v))
            out.append((module_prefix + ("." if module_prefix else "") + k, tx.wrap(v, src)))
    return out
