"""The symbolic interpreter: one handler per opcode, each registered with its version range.

A ``Frame`` interprets one code object over ``Variable`` values (values.py). Its state is
explicit: the instruction pointer ``ip`` (an index into ``instructions``), the value ``stack``,
``locals`` and ``cells``. CPython 3.11+ has no block stack (exceptions use a side table, and
capture does not model exceptions), so these three are the whole state a resume function
needs; ``Unsupported.frames`` records them for every frame when capture stops.

Handlers are looked up by opname in ``HANDLERS``, filled by ``@handler(...)`` for the running
Python version only. Each handler's ``doc`` links the ``dis`` documentation of its opcode.
"""
from __future__ import annotations

import dataclasses
import sys

from kiln.capture.errors import FrameState, Unsupported
from kiln.capture.instructions import PY, Instruction, decode, source_line
from kiln.capture.values_iterators import LazyIteratorVariable
from kiln.capture.values import (NULL, CellVariable, ConstantVariable, DictVariable,
                                 IteratorVariable, LazyVariable, NullVariable, TensorVariable,
                                 Variable)
from kiln.capture.values_callables import FunctionVariable, ModuleVariable
from kiln.capture.values_python import SuperVariable
from kiln.capture.guards import GlobalSource, ItemSource
from kiln.capture.resume_cells import first_argument
from kiln.capture.tensor_asserts import checked_assert

MAX_STEPS = 200_000


@dataclasses.dataclass(frozen=True)
class HandlerSpec:
    opname: str
    fn: object
    versions: tuple  # (min, max) inclusive, as (major, minor)
    doc: str


HANDLERS: dict[str, HandlerSpec] = {}
ALL_HANDLERS: list[HandlerSpec] = []  # every version's, for documentation and tests


def handler(*opnames, versions=((3, 11), (3, 12))):
    lo, hi = versions

    def deco(fn):
        for name in opnames:
            doc = f"https://docs.python.org/{hi[0]}.{hi[1]}/library/dis.html#opcode-{name}"
            spec = HandlerSpec(name, fn, versions, doc)
            ALL_HANDLERS.append(spec)
            if lo <= PY <= hi:
                HANDLERS[name] = spec
        return fn
    return deco


class Frame:
    stop_at: int | None = None  # resume.py: stop before this instruction index

    def __init__(self, tx, code, globals_, globals_source, locals_, cells, parent=None,
                 trusted=False):
        self.tx = tx
        self.code = code
        self.globals = globals_
        self.globals_source = globals_source  # Source of the globals dict; None means G
        self.trusted = trusted                # torch's own code: its globals are not guarded
        self.instructions: list[Instruction] = decode(code)
        self.locals: dict[str, Variable] = locals_
        self.cells: dict[str, CellVariable] = cells
        self.stack: list[Variable] = []
        self.ip = 0
        self.kw_names: tuple = ()
        self.parent = parent
        self.depth = 0 if parent is None else parent.depth + 1
        self.return_value: Variable | None = None
        self.current: Instruction | None = None
        self._provenance: dict = {}

    # ---------------------------------------------------------------- stack
    def push(self, v):
        self.stack.append(v)

    def pop(self):
        return self.stack.pop()

    def popn(self, n):
        if n == 0:
            return []
        items = self.stack[-n:]
        del self.stack[-n:]
        return items

    def jump(self, inst):
        self.ip = inst.target

    # ---------------------------------------------------------------- where
    def location(self, inst):
        lineno = inst.lineno if inst is not None else self.code.co_firstlineno
        return self.code.co_filename, lineno, source_line(self.code.co_filename, lineno)

    def provenance(self, inst):
        text = self._provenance.get(inst.lineno)
        if text is None:
            filename, lineno, line = self.location(inst)
            text = self._provenance[inst.lineno] = f"{filename}:{lineno}: {line}"
        return text

    def state(self) -> FrameState:
        inst = self.current
        return FrameState(self.code, inst.index if inst else 0, inst.offset if inst else 0,
                          inst.lineno if inst else None, list(self.stack), dict(self.locals))

    # ---------------------------------------------------------------- running
    def run(self) -> Variable:
        graph = self.tx.graph
        while self.return_value is None:
            if self.ip == self.stop_at:
                return None  # a re-trace for a graph break stops before this instruction
            if self.ip >= len(self.instructions):
                raise Unsupported("fell off the end of the bytecode")
            inst = self.instructions[self.ip]
            self.current = inst
            self.ip += 1
            self.tx.steps += 1
            try:
                if self.tx.steps > MAX_STEPS:
                    raise Unsupported(f"more than {MAX_STEPS} instructions interpreted (unbounded loop?)")
                self.tx.record_instruction(self, inst)
                spec = HANDLERS.get(inst.opname)
                if spec is None:
                    raise Unsupported(f"opcode {inst.opname} is not supported")
                with graph.inherit(source=self.provenance(inst)):
                    spec.fn(self, inst)
            except Unsupported as e:
                e.locate(*self.location(inst))
                e.frames.insert(0, self.state())
                raise
        return self.return_value

    # ---------------------------------------------------------------- helpers
    def load_local(self, name):
        if name not in self.locals:
            raise Unsupported(f"local variable {name!r} is referenced before assignment")
        v = self.locals[name]
        if isinstance(v, LazyVariable):
            v = self.locals[name] = self.tx.wrap(v.value, v.source)
        return v

    def load_cell(self, name):
        cell = self.cells.get(name)
        if cell is None or cell.contents is None:
            raise Unsupported(f"free variable {name!r} is referenced before assignment")
        if isinstance(cell.contents, LazyVariable):
            cell.contents = self.tx.wrap(cell.contents.value, cell.contents.source)
        return cell.contents

    def load_global(self, name):
        written = self.tx.side_effects.load_global(self.globals, name)
        if written is not None:
            return written
        if name in self.globals:
            value = self.globals[name]
            source = GlobalSource(name) if self.globals_source is None else ItemSource(self.globals_source, name)
            return self.tx.wrap(value, source, guard=not self.trusted)
        builtins_ = self.globals.get("__builtins__", __builtins__)
        builtins_ = builtins_ if isinstance(builtins_, dict) else vars(builtins_)
        if name in builtins_:
            return self.tx.wrap(builtins_[name], None)
        raise Unsupported(f"name {name!r} is not defined")

    def call(self, fn, args, kwargs):
        if isinstance(fn, NullVariable):
            raise Unsupported("call of NULL (interpreter stack out of sync)")
        return fn.call(self.tx, list(args), dict(kwargs))


# ====================================================================== handlers
# ---------------------------------------------------------------- no-ops
@handler("NOP", "RESUME", "EXTENDED_ARG", "CACHE")
def nop(frame, inst):
    pass


@handler("PRECALL", versions=((3, 11), (3, 11)))
def precall(frame, inst):
    pass


@handler("COPY_FREE_VARS")
def copy_free_vars(frame, inst):
    pass  # the frame's free-variable cells are set up when the frame is made


# ---------------------------------------------------------------- stack
@handler("POP_TOP")
def pop_top(frame, inst):
    frame.pop()


@handler("PUSH_NULL")
def push_null(frame, inst):
    frame.push(NULL)


@handler("COPY")
def copy(frame, inst):
    frame.push(frame.stack[-inst.arg])


@handler("SWAP")
def swap(frame, inst):
    s = frame.stack
    s[-1], s[-inst.arg] = s[-inst.arg], s[-1]


# ---------------------------------------------------------------- locals, cells, constants
@handler("LOAD_FAST")
@handler("LOAD_FAST_CHECK", versions=((3, 12), (3, 12)))
def load_fast(frame, inst):
    frame.push(frame.load_local(inst.argval))


@handler("LOAD_FAST_AND_CLEAR", versions=((3, 12), (3, 12)))
def load_fast_and_clear(frame, inst):
    # Inlined comprehensions save the outer variable (or NULL if unbound) and restore it later.
    if inst.argval in frame.locals:
        frame.push(frame.load_local(inst.argval))
        del frame.locals[inst.argval]
    else:
        frame.push(NULL)


@handler("STORE_FAST")
def store_fast(frame, inst):
    value = frame.pop()
    if isinstance(value, NullVariable):
        frame.locals.pop(inst.argval, None)
    else:
        frame.locals[inst.argval] = value


@handler("DELETE_FAST")
def delete_fast(frame, inst):
    frame.locals.pop(inst.argval, None)


@handler("LOAD_CONST")
def load_const(frame, inst):
    frame.push(frame.tx.wrap_constant(inst.argval))


@handler("MAKE_CELL")
def make_cell(frame, inst):
    frame.cells[inst.argval] = CellVariable(frame.locals.pop(inst.argval, None))


@handler("LOAD_CLOSURE")
def load_closure(frame, inst):
    frame.push(frame.cells[inst.argval])


@handler("LOAD_DEREF")
def load_deref(frame, inst):
    frame.push(frame.load_cell(inst.argval))


@handler("STORE_DEREF")
def store_deref(frame, inst):
    cell = frame.cells.setdefault(inst.argval, CellVariable())
    cell.contents = frame.pop()
    if cell.cell_source is not None:  # a real closure cell: replayed after the call
        frame.tx.side_effects.store_cell(cell)


@handler("LOAD_GLOBAL")
def load_global(frame, inst):
    # 3.11 and 3.12 push the NULL *below* the global when the low arg bit is set.
    if inst.flag:
        frame.push(NULL)
    frame.push(frame.load_global(inst.argval))


@handler("STORE_ATTR")
def store_attr(frame, inst):
    # Modules and objects from the inputs: recorded and replayed after the call
    # (side_effects.py); objects made during the trace just change.
    obj, value = frame.pop(), frame.pop()
    store_attribute(frame.tx, obj, inst.argval, value)


def store_attribute(tx, obj, name, value):
    """``obj.name = value`` (STORE_ATTR, and the ``setattr`` builtin)."""
    if isinstance(obj, ModuleVariable) and not obj.local:
        if isinstance(value, TensorVariable) and value.source is None and \
                name in obj.module._parameters:
            raise Unsupported(f"assigning a computed tensor to parameter {name!r}")
        tx.side_effects.store_attr(obj, name, value)
    elif hasattr(obj, "setattr"):
        obj.setattr(tx, name, value)
    else:
        raise Unsupported(f"assigning attribute {name!r} of {obj} is not supported")


@handler("STORE_GLOBAL")
def store_global(frame, inst):
    frame.tx.side_effects.store_global(frame.globals, inst.argval, frame.pop())


# ---------------------------------------------------------------- attributes
@handler("LOAD_ATTR", versions=((3, 11), (3, 11)))
def load_attr_311(frame, inst):
    frame.push(frame.pop().getattr(frame.tx, inst.argval))


@handler("LOAD_ATTR", versions=((3, 12), (3, 12)))
def load_attr_312(frame, inst):
    # 3.12 folds LOAD_METHOD into LOAD_ATTR: the low arg bit asks for a method load.
    obj = frame.pop()
    attr = obj.getattr(frame.tx, inst.argval)
    if inst.flag:
        frame.push(NULL)  # "NULL and the object returned by the attribute lookup"
    frame.push(attr)


@handler("LOAD_METHOD", versions=((3, 11), (3, 11)))
def load_method(frame, inst):
    # Our attribute lookup already binds self, so we always take the [NULL, attr] form.
    obj = frame.pop()
    frame.push(NULL)
    frame.push(obj.getattr(frame.tx, inst.argval))


# ---------------------------------------------------------------- calls
@handler("KW_NAMES")
def kw_names(frame, inst):
    frame.kw_names = tuple(inst.argval)


@handler("CALL")
def call(frame, inst):
    args = frame.popn(inst.arg)
    names, frame.kw_names = frame.kw_names, ()
    kwargs = {}
    if names:
        kwargs = dict(zip(names, args[-len(names):]))
        args = args[:-len(names)]
    second, first = frame.pop(), frame.pop()
    if isinstance(first, NullVariable):
        fn = second
    else:
        fn, args = first, [second, *args]
    frame.push(frame.call(fn, args, kwargs))


@handler("CALL_FUNCTION_EX")
def call_function_ex(frame, inst):
    kwargs = frame.pop() if inst.arg & 1 else None
    args = frame.pop()
    fn = frame.pop()
    if frame.stack and isinstance(frame.stack[-1], NullVariable):
        frame.pop()
    if kwargs is not None and not isinstance(kwargs, DictVariable):
        raise Unsupported("**kwargs of a non-dict")
    py_kwargs = {k: v for k, v in (kwargs.items.items() if kwargs is not None else ())}
    if any(not isinstance(k, str) for k in py_kwargs):  # Python's TypeError: a break, not a trace
        raise Unsupported("**kwargs with a key that is not a string")
    frame.push(frame.call(fn, args.iterate(frame.tx), py_kwargs))


@handler("MAKE_FUNCTION")
def make_function(frame, inst):
    code = frame.pop().value  # LOAD_CONST of a code object: an OpaqueVariable
    closure = frame.pop().items if inst.arg & 0x08 else ()
    if inst.arg & 0x04:
        frame.pop()  # annotations
    kwdefaults = frame.pop().items if inst.arg & 0x02 else {}
    defaults = tuple(frame.pop().items) if inst.arg & 0x01 else ()
    frame.push(FunctionVariable(code=code, globals_=frame.globals, defaults=defaults,
                                kwdefaults=kwdefaults, closure=tuple(closure)))


@handler("BEFORE_WITH")
def before_with(frame, inst):
    # Pushes the bound __exit__ and what __enter__ returned; the normal exit is a CALL of the
    # former with (None, None, None). Context managers capture models define ``enter(tx)``
    # (torch.autocast: capture/autocast.py); the exceptional path is never interpreted.
    mgr = frame.pop()
    enter = getattr(mgr, "enter", None)
    if enter is None:
        raise Unsupported(f"`with` on {mgr} is not supported")
    exit_fn, value = enter(frame.tx)
    frame.push(exit_fn)
    frame.push(value)


@handler("RETURN_VALUE")
def return_value(frame, inst):
    frame.return_value = frame.pop()


@handler("RETURN_CONST", versions=((3, 12), (3, 12)))
def return_const(frame, inst):
    frame.return_value = frame.tx.wrap_constant(inst.argval)


# ---------------------------------------------------------------- jumps and loops
@handler("JUMP_FORWARD", "JUMP_BACKWARD", "JUMP_BACKWARD_NO_INTERRUPT")
def jump(frame, inst):
    frame.jump(inst)


def _is_none(v):
    return isinstance(v, ConstantVariable) and v.value is None


@handler("POP_JUMP_IF_TRUE", versions=((3, 12), (3, 12)))
@handler("POP_JUMP_FORWARD_IF_TRUE", "POP_JUMP_BACKWARD_IF_TRUE", versions=((3, 11), (3, 11)))
def pop_jump_if_true(frame, inst):
    value = frame.pop()
    if checked_assert(frame, inst, value, jumps_if=True):  # `assert t`: checked at run time
        return
    if value.truth(frame.tx):
        frame.jump(inst)


@handler("POP_JUMP_IF_FALSE", versions=((3, 12), (3, 12)))
@handler("POP_JUMP_FORWARD_IF_FALSE", "POP_JUMP_BACKWARD_IF_FALSE", versions=((3, 11), (3, 11)))
def pop_jump_if_false(frame, inst):
    value = frame.pop()
    if checked_assert(frame, inst, value, jumps_if=False):  # `assert t and u`'s first term
        return
    if not value.truth(frame.tx):
        frame.jump(inst)


@handler("POP_JUMP_IF_NONE", versions=((3, 12), (3, 12)))
@handler("POP_JUMP_FORWARD_IF_NONE", "POP_JUMP_BACKWARD_IF_NONE", versions=((3, 11), (3, 11)))
def pop_jump_if_none(frame, inst):
    if _is_none(frame.pop()):
        frame.jump(inst)


@handler("POP_JUMP_IF_NOT_NONE", versions=((3, 12), (3, 12)))
@handler("POP_JUMP_FORWARD_IF_NOT_NONE", "POP_JUMP_BACKWARD_IF_NOT_NONE", versions=((3, 11), (3, 11)))
def pop_jump_if_not_none(frame, inst):
    if not _is_none(frame.pop()):
        frame.jump(inst)


@handler("JUMP_IF_TRUE_OR_POP", versions=((3, 11), (3, 11)))
def jump_if_true_or_pop(frame, inst):
    if frame.stack[-1].truth(frame.tx):
        frame.jump(inst)
    else:
        frame.pop()


@handler("JUMP_IF_FALSE_OR_POP", versions=((3, 11), (3, 11)))
def jump_if_false_or_pop(frame, inst):
    if not frame.stack[-1].truth(frame.tx):
        frame.jump(inst)
    else:
        frame.pop()


@handler("GET_ITER")
def get_iter(frame, inst):
    v = frame.pop()  # a lazy iterator (map, islice) stays lazy: a loop takes its items one by one
    frame.push(v if isinstance(v, (IteratorVariable, LazyIteratorVariable))
               else IteratorVariable(v.iterate(frame.tx)))


@handler("FOR_ITER")
def for_iter(frame, inst):
    it = frame.stack[-1]
    if not isinstance(it, (IteratorVariable, LazyIteratorVariable)):
        raise Unsupported(f"FOR_ITER over {it}")
    lazy = getattr(it, "next_lazy", None)  # a resume function's loop (resume_loops.LoopRest)
    if lazy is not None and frame.ip < len(frame.instructions) and \
            frame.instructions[frame.ip].opname == "STORE_FAST":
        item = lazy()  # stored in a local, wrapped and guarded only if it is read
    else:
        item = it.next()
    if item is not None:
        frame.push(item)
        return
    # Exhausted: the iterator is popped. 3.11 jumps to the target; 3.12's target is END_FOR,
    # which CPython skips (it pops the iterator itself), so we land just after it.
    frame.pop()
    frame.jump(inst)
    if frame.ip < len(frame.instructions) and frame.instructions[frame.ip].opname == "END_FOR":
        frame.ip += 1


@handler("END_FOR", versions=((3, 12), (3, 12)))
def end_for(frame, inst):
    frame.popn(2)


def frame_super(frame):
    """Zero-argument ``super()``: the ``__class__`` cell and the first argument of the frame."""
    cell = frame.cells.get("__class__")
    if cell is None or cell.contents is None or not frame.code.co_varnames:
        raise Unsupported("super() without arguments outside a method")
    cls = frame.load_cell("__class__").as_python()
    first = first_argument(frame.code)  # a resume function's: the method's (resume_cells.py)
    if first is None:
        raise Unsupported("super() without arguments in a function without parameters")
    obj = frame.locals.get(first)
    if obj is None and first in frame.cells:
        obj = frame.load_cell(first)
    if obj is None:
        raise Unsupported("super(): the method's first argument is not bound")
    if isinstance(obj, LazyVariable):
        obj = frame.load_local(first)
    return SuperVariable(cls, obj)


def python_versions_covered():
    """Opnames with a handler on this Python (for the bytecode tests)."""
    return sorted(HANDLERS)


if PY not in ((3, 11), (3, 12)):  # pragma: no cover
    import warnings
    warnings.warn(f"kiln.capture is written for Python 3.11 and 3.12, running {sys.version}")

__all__ = ["Frame", "HANDLERS", "ALL_HANDLERS", "handler"]

from kiln.capture import interpreter_ops  # noqa: E402,F401 - registers the other handler families
