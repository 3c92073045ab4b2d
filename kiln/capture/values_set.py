"""Sets during capture: Python constants deduplicated by value, tensors and modules by
identity (as they hash), kept in first-insertion order."""
from __future__ import annotations

from kiln.capture.values import ConstantVariable, MethodVariable, TensorVariable, _Sequence
from kiln.capture.values_callables import ModuleVariable


def _module_by_identity(v) -> bool:
    """A module that hashes and compares by identity (object's own ``__hash__``/``__eq__``)."""
    m = getattr(v, "module", None) if isinstance(v, ModuleVariable) else None
    return m is not None and type(m).__hash__ is object.__hash__ and type(m).__eq__ is object.__eq__


class SetVariable(_Sequence):
    """A set of Python constants (kept in first-insertion order, deduplicated by value) and
    tensors (deduplicated by identity, as a tensor hashes by ``id``; never equal to a
    constant in a set, whose hashes differ)."""
    kind = set

    def __init__(self, items=(), source=None):
        super().__init__([], source)
        for v in items:
            self.add(v)

    def add(self, v):
        if not self.contains(None, v):
            self.items.append(v)

    def contains(self, tx, v):
        """``v in s``: a tensor or a module by identity, a constant by value among the constants."""
        if isinstance(v, TensorVariable):
            return any(x is v for x in self.items)
        if _module_by_identity(v):  # nn.Module.named_modules' memo set (``self not in memo``)
            return any(_module_by_identity(x) and x.module is v.module for x in self.items)
        key = v.as_python()
        return any(not isinstance(x, TensorVariable) and not _module_by_identity(x) and x.as_python() == key
                   for x in self.items)

    def getattr(self, tx, name):
        if name in ("add", "update", "union", "intersection", "difference"):
            return MethodVariable(self, name)
        return super().getattr(tx, name)

    def call_method(self, tx, name, args, kwargs):
        if name == "add":
            self.add(args[0])
            return ConstantVariable(None)
        if name == "update":
            for a in args:
                for v in a.iterate(tx):
                    self.add(v)
            return ConstantVariable(None)
        result = getattr(self.as_python(), name)(*[a.as_python() for a in args])
        return SetVariable([ConstantVariable(v) for v in result])
