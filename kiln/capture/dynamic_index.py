"""A list or tuple from the inputs indexed by a symbolic int: ``cache.layers[self.layer_idx]``.

Each decoder layer of a transformers model reaches its own entry of the KV cache through its
``layer_idx`` attribute. When the layers' shared code is compiled on its own (each layer wrapped
by ``kiln.compile``, or a graph break inside the layer), ``layer_idx`` changes from call to call,
automatic dynamic makes it a symbol, and the list subscript used to make the capture fail, so
``layer_idx`` stayed static and every layer compiled its own entries (and hit the recompile
limit). Here the element is read through a source whose index is the int's own expression,
``L['cache'].layers[L['self'].attn.layer_idx]``: the guard, the fetch of the element's tensors
and the replay of writes to it evaluate that index on each call, so every layer whose cache
entry has the same structure shares one compiled entry (as the layers' parameters already do).

What the element's tracker records is only true for the element the index picks, so:

- the index is guarded to be in range (``0 <= i < len``; the list's length is guarded already);
- the element gets a tracker of its own under the symbolic source; the list's slot keeps a
  ``ShadowedItem`` in its place, so reaching the same object again through a constant index or
  an iteration (which would be a different object on the next call) fails the capture with
  "SymInt" in the reason, and the int is then traced as a constant (``CodeCache.static_ints``);
- only plain objects are indexed this way (``ObjectVariable`` trackers, whose attributes are
  read lazily through their source); anything else keeps the old behaviour (the int static).
"""
from __future__ import annotations

from kiln.capture.errors import Unsupported
from kiln.capture.guards import Source
from kiln.capture.values import LazyVariable, Variable
from kiln.meta.symbolic import SymInt, py
from kiln.capture.tracer import _type_check
from kiln.capture.values_python import ObjectVariable, is_user_object


class SymbolicItemSource(Source):
    """``parent[<index>]`` where the index is a Python expression over ``L``/``G`` (the
    symbolic int's own source, or an expression over several), evaluated on every call."""
    __slots__ = ("parent", "index")
    name = "at"  # a graph placeholder's name part (tracer._placeholder_name)

    def __init__(self, parent: Source, index: str):
        self.parent = parent
        self.index = index

    def expr(self, base=None):
        return f"{base or self.parent.expr()}[{self.index}]"


class ShadowedItem(Variable):
    """A list slot whose object is also tracked under a symbolic index: any use of it is a
    capture failure naming SymInt (the index is then specialized)."""

    def __init__(self, source, by_symbol: dict):
        self.source = source
        self.by_symbol = by_symbol  # symbolic index expr -> the element's tracker

    def __repr__(self):
        return "a list item reached both by a constant index and by a SymInt index"


def _index_text(tx, key: SymInt) -> str | None:
    """The index as a Python expression over the call's locals, or None when one of its
    symbols is not read straight from a source (a stride, a symbol of a computed size)."""
    names = {}
    for sym in key.expr.free_symbols:
        read = tx.guards.symbol_reads.get(sym)
        if read is None:
            return None
        src, accessor = read
        names[sym] = f"{src.expr()}.{accessor}" if accessor else src.expr()
    return py(key.expr, names)


def symbolic_item(tx, seq, key: SymInt):
    """``seq[key]`` for a symbolic ``key``: the element under a ``SymbolicItemSource``."""
    kind = seq.kind.__name__
    index = _index_text(tx, key) if seq.source is not None else None
    if index is None:
        raise Unsupported(f"indexing a {kind} with SymInt {key} (not read from the inputs)")
    n = len(seq.items)
    if not (key >= 0 and key < n):  # guarded: the same decision on every call
        raise Unsupported(f"{kind} index SymInt {key} out of range")
    hint = key.hint
    slot = seq.items[hint]
    if isinstance(slot, ShadowedItem):
        for expr, var in slot.by_symbol.items():
            if key == SymInt(expr, key.env):  # the same element when the indices are equal
                return var
        raise Unsupported(f"a {kind} indexed by two SymInt indices {list(slot.by_symbol)} and {key}")
    return _track_element(tx, seq, key, hint, slot, index)


def _track_element(tx, seq, key, hint, slot, index):
    kind = seq.kind.__name__
    if isinstance(slot, LazyVariable):
        real = slot.value if is_user_object(slot.value) else None
    else:
        real = slot.value if type(slot) is ObjectVariable and not slot.local else None
    if real is None or slot.source is None:
        raise Unsupported(f"indexing a {kind} of {type(slot).__name__} with SymInt {key}")
    if id(real) in tx.side_effects.attr_writes:  # written under its constant index already
        raise Unsupported(f"indexing a {kind} with SymInt {key}: the item was written before")
    source = SymbolicItemSource(seq.source, index)
    tx.guards.add(source, _type_check(type(real)))
    var = ObjectVariable(type(real), real, source)
    tx.side_effects.remember(real, var)  # reached again by another path: guarded the same object
    seq.items[hint] = ShadowedItem(slot.source, {key.expr: var})
    return var


__all__ = ["SymbolicItemSource", "ShadowedItem", "symbolic_item"]
