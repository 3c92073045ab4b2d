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
from kiln.capture.values import (NULL, CellVariable, ConstantVariable, DictVariable,
                                 FunctionVariable, IteratorVariable, LazyVariable, ListVariable,
                                 ModuleVariable, NullVariable, TensorVariable,
                                 TupleVariable, Variable, _Sequence)
from kiln.capture.values_python import SetVariable

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
        from kiln.capture.guards import GlobalSource, ItemSource

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
    if isinstance(obj, ModuleVariable):
        if isinstance(value, TensorVariable) and value.source is None and \
                inst.argval in obj.module._parameters:
            raise Unsupported(f"assigning a computed tensor to parameter {inst.argval!r}")
        frame.tx.side_effects.store_attr(obj, inst.argval, value)
    elif hasattr(obj, "setattr"):
        obj.setattr(frame.tx, inst.argval, value)
    else:
        raise Unsupported(f"assigning attribute {inst.argval!r} of {obj} is not supported")


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
    if frame.pop().truth(frame.tx):
        frame.jump(inst)


@handler("POP_JUMP_IF_FALSE", versions=((3, 12), (3, 12)))
@handler("POP_JUMP_FORWARD_IF_FALSE", "POP_JUMP_BACKWARD_IF_FALSE", versions=((3, 11), (3, 11)))
def pop_jump_if_false(frame, inst):
    if not frame.pop().truth(frame.tx):
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
    v = frame.pop()
    frame.push(v if isinstance(v, IteratorVariable) else IteratorVariable(v.iterate(frame.tx)))


@handler("FOR_ITER")
def for_iter(frame, inst):
    it = frame.stack[-1]
    if not isinstance(it, IteratorVariable):
        raise Unsupported(f"FOR_ITER over {it}")
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


# ---------------------------------------------------------------- operators
@handler("BINARY_OP")
def binary_op(frame, inst):
    b, a = frame.pop(), frame.pop()
    frame.push(frame.tx.binary_op(inst.argrepr, a, b))


@handler("COMPARE_OP")
def compare_op(frame, inst):
    b, a = frame.pop(), frame.pop()
    frame.push(frame.tx.binary_op(inst.argval, a, b))


@handler("UNARY_NEGATIVE")
def unary_negative(frame, inst):
    frame.push(frame.tx.unary_op("-", frame.pop()))


@handler("UNARY_POSITIVE", versions=((3, 11), (3, 11)))
def unary_positive(frame, inst):
    frame.push(frame.tx.unary_op("+", frame.pop()))


@handler("UNARY_INVERT")
def unary_invert(frame, inst):
    frame.push(frame.tx.unary_op("~", frame.pop()))


@handler("UNARY_NOT")
def unary_not(frame, inst):
    frame.push(ConstantVariable(not frame.pop().truth(frame.tx)))


@handler("IS_OP")
def is_op(frame, inst):
    b, a = frame.pop(), frame.pop()
    result = _identical(a, b)
    frame.push(ConstantVariable(result != bool(inst.arg)))


def _identical(a, b) -> bool:
    if a is b:
        return True
    if isinstance(a, ConstantVariable) and isinstance(b, ConstantVariable):
        return a.value is b.value
    if isinstance(a, ModuleVariable) and isinstance(b, ModuleVariable):
        return a.module is b.module
    kinds = (ConstantVariable, TensorVariable, _Sequence, DictVariable, ModuleVariable)
    if isinstance(a, kinds) and isinstance(b, kinds):
        return False  # different trackers of different kinds, or distinct tensors
    raise Unsupported(f"`is` between {a} and {b} is not supported")


@handler("CONTAINS_OP")
def contains_op(frame, inst):
    container, item = frame.pop(), frame.pop()
    if isinstance(container, DictVariable):
        found = item.as_python() in container.items
    else:
        found = item.as_python() in container.as_python()
    frame.push(ConstantVariable(found != bool(inst.arg)))


# ---------------------------------------------------------------- containers
@handler("BUILD_TUPLE")
def build_tuple(frame, inst):
    frame.push(TupleVariable(frame.popn(inst.arg)))


@handler("BUILD_LIST")
def build_list(frame, inst):
    frame.push(ListVariable(frame.popn(inst.arg)))


@handler("BUILD_MAP")
def build_map(frame, inst):
    flat = frame.popn(2 * inst.arg)
    frame.push(DictVariable({flat[i].as_python(): flat[i + 1] for i in range(0, len(flat), 2)}))


@handler("BUILD_CONST_KEY_MAP")
def build_const_key_map(frame, inst):
    keys = frame.pop().as_python()
    values = frame.popn(inst.arg)
    frame.push(DictVariable(dict(zip(keys, values))))


@handler("BUILD_SLICE")
def build_slice(frame, inst):
    parts = [v.as_python() for v in frame.popn(inst.arg)]
    frame.push(ConstantVariable(slice(*parts)))


@handler("BUILD_STRING")
def build_string(frame, inst):
    frame.push(ConstantVariable("".join(v.as_python() for v in frame.popn(inst.arg))))


@handler("FORMAT_VALUE")
def format_value(frame, inst):
    spec = frame.pop().as_python() if inst.arg & 0x04 else ""
    value = frame.pop().as_python()
    conv = {1: str, 2: repr, 3: ascii}.get(inst.arg & 0x03)
    frame.push(ConstantVariable(format(conv(value) if conv else value, spec)))


@handler("LIST_APPEND")
def list_append(frame, inst):
    v = frame.pop()
    frame.stack[-inst.arg].items.append(v)


@handler("LIST_EXTEND")
def list_extend(frame, inst):
    seq = frame.pop()
    frame.stack[-inst.arg].items.extend(seq.iterate(frame.tx))


@handler("DICT_MERGE", "DICT_UPDATE")
def dict_merge(frame, inst):
    update = frame.pop()
    if not isinstance(update, DictVariable):
        raise Unsupported(f"{inst.opname} with {update}")
    target = frame.stack[-inst.arg]
    if inst.opname == "DICT_MERGE" and set(target.items) & set(update.items):
        raise Unsupported("duplicate keyword argument")
    target.items.update(update.items)


@handler("LIST_TO_TUPLE", versions=((3, 11), (3, 11)))
def list_to_tuple(frame, inst):
    frame.push(TupleVariable(frame.pop().items))


@handler("CALL_INTRINSIC_1", versions=((3, 12), (3, 12)))
def call_intrinsic_1(frame, inst):
    if inst.argrepr == "INTRINSIC_LIST_TO_TUPLE":
        frame.push(TupleVariable(frame.pop().items))
    elif inst.argrepr == "INTRINSIC_UNARY_POSITIVE":
        frame.push(frame.tx.unary_op("+", frame.pop()))
    else:
        raise Unsupported(f"CALL_INTRINSIC_1 {inst.argrepr} is not supported")


@handler("UNPACK_SEQUENCE")
def unpack_sequence(frame, inst):
    items = frame.pop().iterate(frame.tx)
    if len(items) != inst.arg:
        raise Unsupported(f"cannot unpack {len(items)} values into {inst.arg}")
    frame.stack.extend(reversed(items))


@handler("UNPACK_EX")
def unpack_ex(frame, inst):
    before, after = inst.arg & 0xFF, inst.arg >> 8
    items = frame.pop().iterate(frame.tx)
    if len(items) < before + after:
        raise Unsupported(f"cannot unpack {len(items)} values into {before} + {after}")
    middle = ListVariable(items[before:len(items) - after])
    frame.stack.extend(reversed(items[len(items) - after:]))
    frame.push(middle)
    frame.stack.extend(reversed(items[:before]))


@handler("BINARY_SUBSCR")
def binary_subscr(frame, inst):
    key, container = frame.pop(), frame.pop()
    frame.push(frame.tx.getitem(container, key))


@handler("BINARY_SLICE", versions=((3, 12), (3, 12)))
def binary_slice(frame, inst):
    end, start, container = frame.pop(), frame.pop(), frame.pop()
    key = ConstantVariable(slice(start.as_python(), end.as_python()))
    frame.push(frame.tx.getitem(container, key))


@handler("STORE_SUBSCR")
def store_subscr(frame, inst):
    key, container, value = frame.pop(), frame.pop(), frame.pop()
    if isinstance(container, TensorVariable):  # functionalized (kiln/capture/mutation.py)
        frame.tx.setitem(container, key, value)
        return
    if hasattr(container, "setitem"):  # a ModelOutput made during the trace
        container.setitem(key.as_python(), value)
        return
    if not isinstance(container, (ListVariable, DictVariable)):
        raise Unsupported(f"item assignment on {container} is not supported")
    frame.tx.side_effects.mutate(container)  # replayed when it came from the inputs
    k = key.as_python()
    if isinstance(container, ListVariable) and isinstance(k, slice):
        container.items[k] = value.iterate(frame.tx)
    else:
        container.items[k] = value


@handler("DELETE_SUBSCR")
def delete_subscr(frame, inst):
    key, container = frame.pop(), frame.pop()
    if not isinstance(container, (ListVariable, DictVariable)):
        raise Unsupported(f"item deletion on {container} is not supported")
    frame.tx.side_effects.mutate(container)
    try:
        del container.items[key.as_python()]
    except (KeyError, IndexError):
        raise Unsupported(f"del of missing item {key.as_python()!r}") from None


# ---------------------------------------------------------------- imports
@handler("IMPORT_NAME")
def import_name(frame, inst):
    # Pops fromlist and level, pushes what __import__ returns; only modules that are already
    # imported (importing for real would run a module's code during capture).
    fromlist, level = frame.pop().as_python(), frame.pop().as_python()
    import importlib.util
    name = inst.argval
    if level:
        name = importlib.util.resolve_name("." * level + name, frame.globals.get("__package__") or "")
    if name not in sys.modules:
        raise Unsupported(f"import of {name!r}, which is not imported yet")
    from kiln.capture.guards import ModuleSource
    top = name if fromlist else name.partition(".")[0]
    frame.push(frame.tx.wrap(sys.modules[top], ModuleSource(top), guard=False))


@handler("IMPORT_FROM")
def import_from(frame, inst):
    module = frame.stack[-1]
    frame.push(module.getattr(frame.tx, inst.argval))


# ---------------------------------------------------------------- sets
@handler("BUILD_SET")
def build_set(frame, inst):
    frame.push(SetVariable(frame.popn(inst.arg)))


@handler("SET_ADD")
def set_add(frame, inst):
    v = frame.pop()
    frame.stack[-inst.arg].add(v)


@handler("SET_UPDATE")
def set_update(frame, inst):
    seq = frame.pop()
    target = frame.stack[-inst.arg]
    for v in seq.iterate(frame.tx):
        target.add(v)


@handler("MAP_ADD")
def map_add(frame, inst):
    value, key = frame.pop(), frame.pop()
    frame.stack[-inst.arg].items[key.as_python()] = value


# ---------------------------------------------------------------- generators
# A generator called during capture runs to its end at once (tracer.inline_call): each
# YIELD_VALUE appends to ``frame.yielded`` and resumes with None, as ``next()`` would send.
@handler("RETURN_GENERATOR")
def return_generator(frame, inst):
    if getattr(frame, "yielded", None) is None:
        raise Unsupported("RETURN_GENERATOR outside a generator call")
    frame.push(ConstantVariable(None))  # the value the first resume sends; POP_TOP drops it


@handler("YIELD_VALUE")
def yield_value(frame, inst):
    if getattr(frame, "yielded", None) is None:
        raise Unsupported("yield outside a generator call")
    frame.yielded.append(frame.pop())
    frame.push(ConstantVariable(None))


# ---------------------------------------------------------------- super (3.12)
@handler("LOAD_SUPER_ATTR", versions=((3, 12), (3, 12)))
def load_super_attr(frame, inst):
    # Pops self, the class and the global `super`; the low arg bit asks for a method load
    # (NULL + bound method here, as LOAD_ATTR), bit 1 marks the two-argument form.
    self_var, cls_var, super_fn = frame.pop(), frame.pop(), frame.pop()
    from kiln.capture.values_python import SuperVariable
    del super_fn
    attr = SuperVariable(cls_var.as_python(), self_var).getattr(frame.tx, inst.argval)
    if inst.arg & 1:
        frame.push(NULL)
    frame.push(attr)


@handler("STORE_SLICE", versions=((3, 12), (3, 12)))
def store_slice(frame, inst):
    end, start, container, value = frame.pop(), frame.pop(), frame.pop(), frame.pop()
    if not isinstance(container, TensorVariable):
        raise Unsupported(f"slice assignment on {container} is not supported")
    key = ConstantVariable(slice(start.as_python(), end.as_python()))
    frame.tx.setitem(container, key, value)


def frame_super(frame):
    """Zero-argument ``super()``: the ``__class__`` cell and the first argument of the frame."""
    from kiln.capture.values_python import SuperVariable
    cell = frame.cells.get("__class__")
    if cell is None or cell.contents is None or not frame.code.co_varnames:
        raise Unsupported("super() without arguments outside a method")
    cls = frame.load_cell("__class__").as_python()
    first = frame.code.co_varnames[0]
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
