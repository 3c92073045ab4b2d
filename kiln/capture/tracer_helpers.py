"""Small pieces of the tracer that need none of its state: the globals source of a function
reached without one, which functions are guarded by code, the class check of an opaque value,
hashability (moved out of tracer.py to keep it under the size limit)."""
from __future__ import annotations

import types

from kiln.capture.guards import Source
from kiln.capture.torch_modules import is_torch_module


class ModuleGlobalsSource(Source):
    """The globals dict of a module, for functions reached without a source (methods)."""
    __slots__ = ("module",)

    def __init__(self, module):
        self.module = module

    def expr(self, base=None):
        return f"__import__('sys').modules[{self.module!r}].__dict__"


def _guarded_by_code(value) -> bool:
    """A plain function made at run time (``<lambda>``/``<locals>`` in its qualified name), without
    function attributes (a decorator's ``__wrapped__``, ``kiln.disable``'s mark): these are
    guarded by code, defaults and cells; module-level functions stay guarded by identity."""
    if not isinstance(value, types.FunctionType) or value.__dict__:
        return False
    if is_torch_module(value.__module__):
        return False
    # a comprehension's or generator expression's function (``<genexpr>``): its qualified name
    # can lose the ``<locals>`` part when the code holding it was rebuilt (a graph break)
    return "<lambda>" in value.__qualname__ or "<locals>" in value.__qualname__ or \
        value.__code__.co_name.startswith("<")


def _type_check(cls) -> str:
    if cls in (tuple, list, dict):
        return f"type({{}}) is {cls.__name__}"
    return f"id(type({{}})) == {id(cls)}"  # classes live as long as their module


def _is_hashable(value) -> bool:
    try:
        hash(value)
        return True
    except TypeError:
        return False
