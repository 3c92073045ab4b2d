"""Functions made in the traced code, leaving it: returned from the compiled frame, or stored
into Python state (a closure cell, an attribute) the rebuild replays. rebuild.py's value
specs, extended:

- ``("made_function", code, globals, qualname, defaults, kwdefaults, cells)``: a function
  made by MAKE_FUNCTION, made again for real after each call, with its closure: a cell the
  trace reached from the inputs (the compiled function's own closure, a resume function's
  cell arguments) is that real cell (``("source", ...)``); a cell made in the frame is a new
  cell per call holding its value at the end of the frame, one per trace-time cell, shared
  by every function of the call's result that closes over it (the ``memo`` of one rebuild);
- ``("partial", fn, args, kwargs)``: a ``functools.partial`` made in the traced code.

A function whose cells lead back to itself (a recursive closure) is a break, as is a method
made in the trace.
"""
from __future__ import annotations

import functools
import threading
import types

from kiln.capture.errors import Unsupported
from kiln.capture.values_callables import FunctionVariable

MADE_KINDS = ("made_function", "partial")
_BUILDING = threading.local()  # ids of the functions whose specs are being made (cycles)


def made_value_spec(v, proxies, spec_of):
    """The spec of a function or partial made in the trace; None for any other value."""
    from kiln.capture.side_effects import _accessor
    from kiln.capture.values_python import PartialVariable
    if isinstance(v, PartialVariable):
        return ("partial", spec_of(v.fn, proxies), [spec_of(x, proxies) for x in v.args],
                {k: spec_of(x, proxies) for k, x in v.kwargs.items()})
    if not (isinstance(v, FunctionVariable) and v.fn is None and v.source is None):
        return None
    if v.self_var is not None:
        raise Unsupported(f"a method {v.qualname} made in the traced code leaving it")
    building = _BUILDING.__dict__.setdefault("ids", set())
    if id(v) in building:
        raise Unsupported(f"the closure {v.qualname} refers to itself through its cells")
    building.add(id(v))
    try:
        cells = []
        for cell in v.closure:
            if cell.cell_source is not None:
                cells.append(("source", _accessor(cell.cell_source)))
            else:
                contents = None if cell.contents is None else spec_of(cell.contents, proxies)
                cells.append(("cell", id(cell), contents))  # the id labels the cell here
    finally:
        building.discard(id(v))
    return ("made_function", v.code, v.globals, v.qualname,
            [spec_of(x, proxies) for x in v.defaults],
            {k: spec_of(x, proxies) for k, x in v.kwdefaults.items()}, cells)


def build_made(spec, build, memo: dict):
    """The value of a ``MADE_KINDS`` spec; ``memo`` holds the cells made so far in this rebuild."""
    if spec[0] == "partial":
        return functools.partial(build(spec[1]), *[build(s) for s in spec[2]],
                                 **{k: build(s) for k, s in spec[3].items()})
    _, code, globals_, qualname, defaults, kwdefaults, cells = spec
    closure = tuple(_build_cell(c, build, memo) for c in cells)
    fn = types.FunctionType(code, globals_, code.co_name,
                            tuple(build(s) for s in defaults) or None, closure or None)
    fn.__kwdefaults__ = {k: build(s) for k, s in kwdefaults.items()} or None
    fn.__qualname__ = qualname
    return fn


def _build_cell(spec, build, memo):
    if spec[0] != "cell":
        return build(spec)  # a real cell, read from its source
    cell = memo.get(spec[1])
    if cell is None:
        cell = memo[spec[1]] = types.CellType()
        if spec[2] is not None:
            cell.cell_contents = build(spec[2])
    return cell


__all__ = ["MADE_KINDS", "made_value_spec", "build_made"]
