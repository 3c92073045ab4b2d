"""Closure cells across graph breaks: a resume function takes its frame's cells as arguments.

A frame's cells (``co_cellvars``, made by MAKE_CELL, and ``co_freevars``, its closure) can be
shared with functions made in the frame (``def inner(): return op(x)``). When a break falls
between two calls of such a function, and the frame rebinds a cell in between (``op = ...``),
the function must read the cell the resumed frame writes. So a resume function does not make
cells of its own: every cell name of the original code is a trailing argument of the resume
function holding the real cell object (``cells_as_arguments``: its MAKE_CELL and
COPY_FREE_VARS become NOPs, free variables become cell variables). CPython's LOAD_DEREF,
STORE_DEREF and LOAD_CLOSURE read the cell in the variable's slot, which an argument fills.

The glue passes, for each cell name, the cell the trace knew (``load_cell``): the real cell
of the function's closure (or of a resume function's arguments) read from ``L``, or a new
cell holding the value at the break, made once and shared by every function the glue makes
again over it (``make_closure``: a function made in the frame before the break, with its
closure). A resume function has no free variables, so it is compiled and cached by code: one
entry serves every call, whatever cells it is handed.

Capture of a resume function (``argument_cells``) wraps each cell argument as the frame's cell
(its contents read lazily through ``L[name].cell_contents``, guarded like any input; a write is
replayed into the real cell), registered as the tracker of that real cell, so a closure made
before the break and called after it reads and writes the same tracker.
"""
from __future__ import annotations

import types

from bytecode import CellVar, FreeVar, Instr

from kiln.capture.guards import AttrSource, LocalSource
from kiln.capture.values import CellVariable, LazyVariable

_CELL_ARGUMENTS: dict = {}  # resume code -> the names of its cell arguments


def cell_names(code) -> tuple:
    """Every cell of ``code``'s frame, in the order a resume function takes them."""
    return tuple(code.co_cellvars) + tuple(code.co_freevars)


def cells_as_arguments(items: list, bc) -> list:
    """The instructions of ``bc`` with its cells made argument slots: MAKE_CELL and
    COPY_FREE_VARS become NOPs (positions kept), free variables cell variables; ``bc``'s
    cell and free variable lists are updated to match."""
    out = []
    for ins in items:
        if isinstance(ins, Instr) and ins.name in ("MAKE_CELL", "COPY_FREE_VARS"):
            ins = Instr("NOP", location=ins.location)
        elif isinstance(ins, Instr) and isinstance(ins.arg, FreeVar):
            ins = Instr(ins.name, CellVar(ins.arg.name), location=ins.location)
        out.append(ins)
    bc.cellvars = list(bc.cellvars) + [n for n in bc.freevars if n not in bc.cellvars]
    bc.freevars = []
    return out


_FIRST_ARGUMENT: dict = {}  # resume code -> the first parameter of the function it resumes


def register_cell_arguments(code, names: tuple, copied):
    """``code`` is a resume function copying ``copied`` (the original code, or a resume code)."""
    if names:
        _CELL_ARGUMENTS[code] = tuple(names)
    _FIRST_ARGUMENT[code] = first_argument(copied)


def first_argument(code):
    """The first parameter of the function ``code`` resumes (zero-argument ``super()`` reads
    it with the ``__class__`` cell); None for code without parameters."""
    if code in _FIRST_ARGUMENT:
        return _FIRST_ARGUMENT[code]
    n = code.co_argcount + code.co_kwonlyargcount
    return code.co_varnames[0] if n or code.co_flags & 0x0C else None


def keep_super_alive(code, root, locals_: dict):
    """A method using zero-argument ``super()`` (a ``__class__`` cell) keeps its first
    argument live across a break: ``super()`` reads it without naming it."""
    if "__class__" not in cell_names(code):
        return
    first = first_argument(code)
    if first is not None and first not in locals_ and first in root.locals:
        locals_[first] = root.locals[first]


def cell_arguments(code) -> tuple:
    """The names of a resume function's cell arguments (empty for any other code)."""
    return _CELL_ARGUMENTS.get(code, ())


# ---------------------------------------------------------------- capture of a resume function
def argument_cells(tx, code, L) -> dict:
    """The root frame's cells of a resume function: name -> CellVariable over the real cell
    passed in ``L[name]``."""
    cells = {}
    for name in cell_arguments(code):
        real = L[name]
        source = LocalSource(name)
        try:
            contents = LazyVariable(real.cell_contents, AttrSource(source, "cell_contents"))
        except ValueError:  # an empty cell (a variable bound later in the frame)
            contents = None
        cell = CellVariable(contents)
        cell.cell_source = source  # a write is replayed into the real cell
        tx._real_cells[id(real)] = (real, cell)
        cells[name] = cell
    return cells


# ---------------------------------------------------------------- the glue
def new_cell():
    return types.CellType()


def set_cell(cell, value):
    cell.cell_contents = value


def load_cell(glue, cell):
    """Push the real cell for CellVariable ``cell`` (one object per tracker in the glue)."""
    if id(cell) in glue.temps:
        glue.emit(Instr("LOAD_FAST", glue.temps[id(cell)]))
        return
    if cell.cell_source is not None:
        glue.load_source(cell.cell_source)
        return
    from kiln.capture.resume_glue import _call
    glue.emit(Instr("PUSH_NULL"), Instr("LOAD_CONST", new_cell), *_call(0))
    glue._memo(cell)  # first, so contents that refer back to the cell (a recursive closure) see it
    if cell.contents is not None:
        glue.emit(Instr("PUSH_NULL"), Instr("LOAD_CONST", set_cell),
                  Instr("LOAD_FAST", glue.temps[id(cell)]))
        glue.load(cell.contents)
        glue.emit(*_call(2), Instr("POP_TOP"))


def make_closure(code, globals_, qualname, defaults, kwdefaults, closure):
    """A function with a closure made in traced code before a break, made again for real."""
    fn = types.FunctionType(code, globals_, code.co_name, defaults or None, closure)
    fn.__kwdefaults__ = kwdefaults or None
    fn.__qualname__ = qualname
    return fn


def load_made_closure(glue, v):
    """Push function ``v`` made by MAKE_FUNCTION with a closure, over the glue's cells."""
    from kiln.capture.resume_glue import _call
    glue.emit(Instr("PUSH_NULL"), Instr("LOAD_CONST", make_closure), Instr("LOAD_CONST", v.code),
              Instr("LOAD_CONST", v.globals), Instr("LOAD_CONST", v.qualname))
    for x in v.defaults:
        glue.load(x)
    glue.emit(Instr("BUILD_TUPLE", len(v.defaults)))
    for k, x in v.kwdefaults.items():
        glue.emit(Instr("LOAD_CONST", k))
        glue.load(x)
    glue.emit(Instr("BUILD_MAP", len(v.kwdefaults)))
    for cell in v.closure:
        load_cell(glue, cell)
    glue.emit(Instr("BUILD_TUPLE", len(v.closure)), *_call(6))
    glue._memo(v)


__all__ = ["cell_names", "cells_as_arguments", "register_cell_arguments", "cell_arguments",
           "first_argument", "keep_super_alive",
           "argument_cells", "load_cell", "make_closure", "load_made_closure"]
