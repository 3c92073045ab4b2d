"""Graph breaks with resume functions: the code kiln runs where a trace had to stop.

When capture stops at instruction ``i`` of the function's own frame (the *break*), kiln:

1. traces again and stops *before* ``i`` (``trace(..., stop_at=i)``): the prefix becomes a
   graph whose outputs are the tensors live at ``i`` (``finish_at_break``);
2. builds a **glue** code object (``build_glue``) with the ``bytecode`` library. Called as
   ``glue(outs, L)`` after the prefix graph ran, it restores the stack and the live locals as
   they were at ``i`` (tensors from ``outs``, inputs from ``L`` and the globals, constants
   inline, containers rebuilt), executes instruction ``i`` for real, and calls the resume
   function of each successor with the stack and the live locals as arguments;
3. a **resume function** (``resume_code``) is a copy of the original code whose prologue pushes
   its stack arguments and jumps to the successor instruction. It is wrapped with kiln's compile
   (its own guards and cache), so the rest of the function is compiled when it is called. The
   glue returns it as a ``TailCall`` that ``CompiledFunction`` runs (no nesting per break).

Policies, decided by ``plan_break``:

* a break inside ``for`` loops of the function's own frame resumes inside them: each loop's
  iterator goes to the resume function as a ``LoopRest`` of its remaining items, and a break in
  a resume function's copy of the loop resumes the same resume function again (resume_loops.py);
* a break inside a ``while`` loop (or a ``for`` loop that cannot resume inside: a generator, an
  iterator held elsewhere) stops before the outermost loop holding it, and the rest of the
  frame (loop included) runs eagerly in an uncompiled resume function;
* a break inside an inlined callee breaks at the outermost call site; the callee, when it is a
  plain function, bound method or module known at compile time, is called through kiln's
  compile (so its own body is compiled), otherwise it runs eagerly;
* an instruction the glue cannot execute on its own, or a stack value it cannot rebuild,
  makes the rest of the frame run eagerly (resume at ``i``, uncompiled), or, failing that,
  raises ``CannotResume`` and the api runs the whole function eagerly.

Every such choice is logged on the ``graph_breaks`` channel.
"""
from __future__ import annotations

import dataclasses
import inspect
import sys
import types

import torch
from bytecode import Bytecode, Instr, Label

from kiln import log
from kiln.capture.instructions import decode
from kiln.capture.resume_loops import (LoopRestVariable, TailCall, check_loop_state, for_loop_refusal,
                                      origin_of, register_origin, stack_iterators)
from kiln.capture.resume_values import view_rebuild
from kiln.capture.resume_cells import cell_names, cells_as_arguments, keep_super_alive, \
    load_cell, register_cell_arguments
# the glue's value rebuilding; CannotResume, GradModeExit, _call and _load_attr are imported
# from here by the tracer, the loops and the values
from kiln.capture.resume_glue import (CannotResume, Glue, GradModeExit, _call,  # noqa: F401
                                      _is_made_object, _is_own_symbol, _load_attr)
from kiln.capture.resume_facts import (_cond_jump_kind, _operands, _result_layout, live_locals,
                                      loop_head)
from kiln.capture.values_iterators import LazyIteratorVariable
from kiln.capture.values import (NULL, BoundAdapterVariable, CellVariable, ConstantVariable,
                                 DictVariable, IteratorVariable, ListVariable, MethodVariable,
                                 NullVariable, TensorVariable, TupleVariable, Variable, _Sequence)
from kiln.capture.values_callables import FunctionVariable
from kiln.meta.symbolic import SymInt

PY = sys.version_info[:2]
CO_VARARGS, CO_VARKEYWORDS = inspect.CO_VARARGS, inspect.CO_VARKEYWORDS
_STACK = "___kiln_stack"


def stack_prefix(code) -> str:
    """The names of a resume function's stack arguments: ``___kiln_stack<level>_<k>``, with a
    level no name of ``code`` uses, so a resume function of a resume function (a break inside
    one, possibly still in its prologue) keeps its parent's stack arguments as plain locals."""
    level = 0
    while any(n.startswith(f"{_STACK}{level}_") for n in code.co_varnames):
        level += 1
    return f"{_STACK}{level}_"


def _stack_reads(instructions, index: int) -> set:
    """Stack arguments of resume functions still read at or after ``index``. They are read only
    by prologues, straight-line code placed right after RESUME and run once, so a read at a
    later position is a read still to come."""
    return {i.argval for i in instructions[index:]
            if i.opname == "LOAD_FAST" and str(i.argval).startswith(_STACK)}


# ====================================================================== resume functions
_RESUME_CODES: dict = {}


def _bytecode_items(code):
    """The code as a ``bytecode.Bytecode`` list, and each kiln instruction's position in it."""
    bc = Bytecode.from_code(code)
    items = list(bc)
    positions = [n for n, x in enumerate(items) if isinstance(x, Instr)]
    ours = [i for i in decode(code) if i.opname != "EXTENDED_ARG"]
    if len(positions) != len(ours) or any(items[p].name != i.opname for p, i in zip(positions, ours)):
        raise CannotResume(f"the bytecode of {code.co_name} does not decode one-to-one")
    index_of = {i.index: p for i, p in zip(ours, positions)}
    return bc, items, index_of


def resume_code(code, index: int, layout: tuple, argnames: tuple, tag: str,
                grad: bool | None = None) -> types.CodeType:
    """A copy of ``code`` that starts at instruction ``index`` with a stack given by ``layout``
    (True marks a NULL slot; the others are the leading ``___kiln_stack<k>`` arguments), the
    locals ``argnames``, then the frame's cells (``resume_cells.cell_names``: real cells, the
    last arguments). ``grad``: the grad mode the break was in, when a with block changed it;
    the prologue re-enters it (``set_grad_mode``)."""
    key = (code, index, layout, argnames, grad)
    cached = _RESUME_CODES.get(key)
    if cached is not None:
        return cached
    bc, items, index_of = _bytecode_items(code)
    cells = cell_names(code)  # trailing arguments holding the frame's cells (resume_cells.py)
    if cells:
        items = cells_as_arguments(items, bc)
    if index not in index_of:
        raise CannotResume(f"no instruction {index} in {code.co_name}")
    pos = index_of[index]
    label = Label()
    items.insert(pos, label)
    start = next((n for n, x in enumerate(items) if isinstance(x, Instr) and x.name == "RESUME"), None)
    if start is None or start >= pos:
        raise CannotResume(f"{code.co_name} has no RESUME before instruction {index}")
    lineno = items[pos + 1].lineno or code.co_firstlineno
    prologue, k, prefix = [], 0, stack_prefix(code)
    if grad is not None:
        prologue += [Instr("PUSH_NULL", lineno=lineno), Instr("LOAD_CONST", set_grad_mode, lineno=lineno),
                     Instr("LOAD_CONST", grad, lineno=lineno), *_call(1, lineno),
                     Instr("POP_TOP", lineno=lineno)]
    for is_null in layout:
        if is_null:
            prologue.append(Instr("PUSH_NULL", lineno=lineno))
        else:
            prologue.append(Instr("LOAD_FAST", f"{prefix}{k}", lineno=lineno))
            k += 1
    prologue.append(Instr("JUMP_FORWARD", label, lineno=lineno))
    new = Bytecode(items[:start + 1] + prologue + items[start + 1:])
    new._copy_attr_from(bc)
    new.argnames = [f"{prefix}{j}" for j in range(k)] + list(argnames) + list(cells)
    new.argcount = len(new.argnames)
    new.posonlyargcount = 0
    new.kwonlyargcount = 0
    new.flags = bc.flags & ~(CO_VARARGS | CO_VARKEYWORDS)
    new.name = f"{code.co_name}_{tag}_{index}"
    if PY >= (3, 11):
        new.qualname = f"{getattr(code, 'co_qualname', code.co_name)}.<{tag} at {index}>"
    try:
        out = new.to_code()
    except Exception as e:  # noqa: BLE001 - the assembler refused our copy
        raise CannotResume(f"could not assemble a resume function: {type(e).__name__}: {e}") from None
    _RESUME_CODES[key] = out
    register_cell_arguments(out, cells, code)
    n_before = sum(isinstance(x, Instr) for x in items[:start])  # RESUME's position among instructions
    register_origin(out, code, index, n_before, len(prologue))
    return out


# ====================================================================== the state at a break
@dataclasses.dataclass
class BreakState:
    """What ``trace(..., stop_at=i)`` hands back: the root frame at instruction ``i``."""
    code: types.CodeType
    instructions: list
    index: int
    stack: list
    locals: dict            # name -> Variable, the live fast locals (and bound cellvars)
    outputs: list           # TensorVariables computed by the prefix graph, in output order
    grad_enabled: bool      # grad mode at the break (what the breaking instruction must see)
    eager_rest: bool        # the continuation runs uncompiled
    reason: str             # why the frame broke
    in_loop: bool = False   # resumes inside the for loops holding the break (resume_loops.py)
    cells: dict = dataclasses.field(default_factory=dict)  # name -> CellVariable, every cell


def finish_at_break(tx, root, plan) -> BreakState:
    """Collect the root frame's state where the trace stopped; fills the graph's output."""
    code, index = root.code, root.ip
    live = live_locals(code, root.instructions, index)
    pending = _stack_reads(root.instructions, index)
    locals_ = {}
    for name, v in root.locals.items():
        if live is None and name.startswith(_STACK) and name not in pending:
            continue  # a stack argument its prologue already read
        if live is None or name in live:
            locals_[name] = v
    keep_super_alive(code, root, locals_)
    cells = {name: root.cells.get(name) or CellVariable() for name in cell_names(code)}
    outputs, seen = [], set()

    def collect(v, depth=0):
        if depth > 50:
            raise CannotResume("a value nested too deeply to rebuild")
        if isinstance(v, TensorVariable):
            if v.made_leaf:  # the resume function would get it as a plain input (made_leaves.py)
                raise CannotResume("a tensor made to require grad in the compiled code is live at the break")
            rebuilt = view_rebuild(v) if v.source is None else None
            if rebuilt is not None:  # the glue takes the view again from its base
                collect(rebuilt[0], depth + 1)
            elif v.source is None and v.proxy.node not in seen:
                seen.add(v.proxy.node)
                outputs.append(v)
        elif isinstance(v, _Sequence) and v.source is None:  # tuples, lists, namedtuples
            for x in v.items:
                collect(x, depth + 1)
        elif isinstance(v, DictVariable) and v.source is None:
            for x in v.items.values():
                collect(x, depth + 1)
        elif isinstance(v, LoopRestVariable):
            pass  # its remaining items are the resume function's inputs: reloaded from there
        elif isinstance(v, IteratorVariable):
            for x in v.items[v.pos:]:
                collect(x, depth + 1)
        elif isinstance(v, (MethodVariable, BoundAdapterVariable)):
            collect(v.obj, depth + 1)
        elif isinstance(v, FunctionVariable) and v.self_var is not None:
            collect(v.self_var, depth + 1)
        elif isinstance(v, FunctionVariable) and v.fn is None:  # made by MAKE_FUNCTION
            for x in [*v.defaults, *v.kwdefaults.values(), *v.closure]:
                collect(x, depth + 1)
        elif isinstance(v, CellVariable) and v.cell_source is None and id(v) not in seen:
            seen.add(id(v))  # a cell the glue makes again, holding its value at the break
            if v.contents is not None:
                collect(v.contents, depth + 1)
        elif _is_made_object(v) and id(v) not in seen:
            seen.add(id(v))
            for x in v.attrs.values():
                collect(x, depth + 1)
        elif type(v).__name__ == "DictDataclassVariable" and id(v) not in seen:
            seen.add(id(v))
            for x in v.values.values():
                collect(x, depth + 1)
        elif type(v).__name__ == "PartialVariable":
            for x in [v.fn, *v.args, *v.kwargs.values()]:
                collect(x, depth + 1)
        elif isinstance(v, LazyIteratorVariable):  # map, islice (values_iterators.py)
            for x in v.held_values():
                collect(x, depth + 1)
        elif type(v).__name__ == "_GeneratorExit":
            for x in [*v.manager.args, *v.manager.kwargs.values()]:
                collect(x, depth + 1)

    for v in root.stack:
        collect(v)
    for v in locals_.values():
        collect(v)
    for v in cells.values():
        collect(v)
    for v in [*root.stack, *locals_.values(),
              *(c.contents for c in cells.values() if c.contents is not None)]:
        _specialize_sizes(v)
    grad = getattr(tx, "grad_enabled", None)
    return BreakState(code, root.instructions, index, list(root.stack), locals_, outputs,
                      torch.is_grad_enabled() if grad is None else grad, plan.eager_rest,
                      plan.reason, plan.in_loop, cells)


def _specialize_sizes(v, depth=0):
    """Symbolic sizes handed to Python at a break become ints (int() records their guards)."""
    if depth > 50:
        return
    if isinstance(v, ConstantVariable):
        value = v.value
        if isinstance(value, SymInt):
            if not _is_own_symbol(v):  # a dynamic int passed along unchanged is reloaded instead
                v.value = int(value)
        elif isinstance(value, tuple) and any(isinstance(x, SymInt) for x in value):
            ints = tuple(int(x) for x in value)
            v.value = torch.Size(ints) if type(value) is not tuple else ints
    elif isinstance(v, (TupleVariable, ListVariable)) and v.source is None:
        for x in v.items:
            _specialize_sizes(x, depth + 1)
    elif isinstance(v, DictVariable) and v.source is None:
        for x in v.items.values():
            _specialize_sizes(x, depth + 1)
    elif isinstance(v, IteratorVariable) and not isinstance(v, LoopRestVariable):
        for x in v.items[v.pos:]:
            _specialize_sizes(x, depth + 1)


# ====================================================================== the plan
@dataclasses.dataclass
class BreakPlan:
    stop_at: int          # root instruction index where the re-trace stops
    eager_rest: bool      # continue uncompiled from stop_at
    wrap_callee: bool     # the break came from inside an inlined callee (or compile_callee)
    reason: str
    in_loop: bool = False  # the break is inside for loops and resumes inside them


def _in_loop_plan(err, code, instructions, index, loops: bool) -> BreakPlan | None:
    """The plan for a break inside a loop: resume inside it (resume_loops.py) when every loop
    holding it is a for loop and the glue can run the breaking instruction; else None, with
    the reason logged (the caller stops before the outermost loop). ``loops=False``: None."""
    if not loops:
        return None  # a first try inside the loop failed (kiln/breaks.py logged why)
    why = for_loop_refusal(instructions, index)
    if why is None and _operands(instructions[index]) is None:
        why = f"the glue cannot run {instructions[index].opname} on its own"
    if why is None:
        log.log("graph_breaks", "%s: the break at instruction %d is inside a for loop; the rest "
                "resumes inside the loop", code.co_name, index)
        return BreakPlan(index, False, _wrap_callee(err), err.reason, True)
    log.log("graph_breaks", "%s: the break at instruction %d is inside a loop (%s); the graph "
            "stops before the loop and the rest of the frame runs eagerly", code.co_name, index, why)
    return None


def plan_break(err, code, loops: bool = True) -> BreakPlan:
    """Where to stop the re-trace for the break ``err`` (an Unsupported) in ``code``;
    ``loops=False``: a break inside a loop stops before the loop (its rest runs eagerly)."""
    if not err.frames or err.frames[0].code is not code:
        raise CannotResume("the break has no position in the function's own frame")
    index = err.frames[0].instruction_index
    instructions = decode(code)
    head = loop_head(instructions, index)
    if head is not None:
        plan = _in_loop_plan(err, code, instructions, index, loops)
        return plan if plan is not None else BreakPlan(head, True, False, err.reason)
    inst = instructions[index]
    if _operands(inst) is None:
        log.log("graph_breaks", "%s: the glue cannot run %s on its own; the rest of the frame "
                "runs eagerly", code.co_name, inst.opname)
        return BreakPlan(index, True, False, err.reason)
    return BreakPlan(index, False, _wrap_callee(err), err.reason)


def _wrap_callee(err) -> bool:
    """Whether the glue calls the callee at the break through kiln's compile: a break inside
    an inlined callee, or at the call of a module whose hooks stay out of the graph
    (capture/module_call.py: the hooks run for real, the forward compiled)."""
    return len(err.frames) > 1 or getattr(err, "compile_callee", False)


# ====================================================================== the glue
def set_grad_mode(mode: bool):
    """A resume function's prologue re-enters the grad mode of the block it starts in; capture
    traces this call as a change of the traced grad mode (``SetGradModeVariable``)."""
    torch._C._set_grad_enabled(mode)


class SetGradModeVariable(Variable):
    def call(self, tx, args, kwargs):
        tx.grad_enabled = bool(args[0].as_python())
        return ConstantVariable(None)


def _store_slots(glue: Glue, values) -> list:
    """Rebuild ``values`` (stack slots, bottom first) into temporaries; NULLs are skipped."""
    names = []
    for v in values:
        if isinstance(v, NullVariable):
            continue
        glue.load(v)
        name = glue.temp()
        glue.keep.append(v)
        glue.emit(Instr("STORE_FAST", name))
        names.append(name)
    return names


def _call_resume(glue: Glue, fn, stack_names, local_names, restore=None):
    if restore is not None:  # back to the entry's grad mode; the resume's prologue re-enters
        glue.emit(Instr("PUSH_NULL"), Instr("LOAD_CONST", torch._C._set_grad_enabled),
                  Instr("LOAD_CONST", restore), *_call(1), Instr("POP_TOP"))
    # returned, not called: CompiledFunction runs it (no nesting per loop iteration)
    glue.emit(Instr("PUSH_NULL"), Instr("LOAD_CONST", TailCall), Instr("LOAD_CONST", fn))
    for name in stack_names:
        glue.emit(Instr("LOAD_FAST", name))
    for name in local_names:
        glue.emit(Instr("LOAD_FAST", name))
    glue.emit(Instr("BUILD_TUPLE", len(stack_names) + len(local_names)), *_call(2),
              Instr("RETURN_VALUE"))


def build_glue(state: BreakState, func, make_resume, wrap_callee=None):
    """The glue function ``glue(outs, L)`` for ``state`` (see the module docstring).

    ``make_resume(code, closure)`` turns a resume code object into the callable the glue calls
    (kiln's compile for compiled continuations); ``wrap_callee(value)`` wraps the callee of a
    break that happened inside an inlined call (or returns None to call it eagerly).
    Returns ``(glue, resume_codes)``.
    """
    code, index = state.code, state.index
    inst = state.instructions[index]
    glue = Glue(state, func.__globals__)
    entry_grad = torch.is_grad_enabled()  # what the entry guards (the mode at compile time)
    inner = state.grad_enabled if state.grad_enabled != entry_grad else None
    restore = entry_grad if inner is not None else None
    local_names = sorted(state.locals)
    stack = state.stack
    n_ops = 0 if state.eager_rest else _operands(inst)
    if n_ops > len(stack):
        raise CannotResume(f"{inst.opname} needs {n_ops} stack values, the trace has {len(stack)}")
    deeper, operands = stack[:len(stack) - n_ops], stack[len(stack) - n_ops:]
    glue.loop_iters = check_loop_state(state, deeper, operands) if state.in_loop else \
        stack_iterators(state, deeper, operands)[0]
    deep_names = _store_slots(glue, deeper)
    local_temps = []
    for name in local_names:
        glue.load(state.locals[name])
        t = f"___kiln_l_{name}"
        glue.emit(Instr("STORE_FAST", t))
        local_temps.append(t)
    for name in cell_names(code):  # the resume function's cell arguments, after its locals
        load_cell(glue, state.cells[name])
        t = f"___kiln_c_{name}"
        glue.emit(Instr("STORE_FAST", t))
        local_temps.append(t)
    deep_layout = tuple(isinstance(v, NullVariable) for v in deeper)
    codes = []

    def resume_at(target, layout):
        # a break in a resume function's copy of the code resumes a copy of the original
        # (a loop that breaks every iteration reuses one resume function)
        origin, target = origin_of(code, target)
        rc = resume_code(origin, target, layout, tuple(local_names),
                         "rest" if state.eager_rest else "resume", inner)
        codes.append(rc)
        return make_resume(rc, None, state.eager_rest)  # no closure: its cells are arguments

    if state.eager_rest:
        _call_resume(glue, resume_at(index, deep_layout), deep_names, local_temps)
        return _assemble(glue, state, func), codes

    # the breaking instruction, on the operands rebuilt on the glue's own stack
    for k, v in enumerate(operands):
        if isinstance(v, NullVariable):
            glue.emit(Instr("PUSH_NULL"))
        elif k == 1 and inst.opname in ("CALL", "CALL_FUNCTION_EX") and wrap_callee is not None \
                and isinstance(operands[0], NullVariable):
            wrapped = wrap_callee(v)
            if wrapped is None:
                glue.load(v)
            elif getattr(wrapped, "compiles_at_run", False):  # a function made in the frame
                glue.emit(Instr("PUSH_NULL"), Instr("LOAD_CONST", wrapped))
                glue.load(v)
                glue.emit(*_call(1))
            elif type(wrapped) is tuple:
                # a module's method: the compiled function bound, at run time, to the module the
                # call reaches (modules are guarded by type, not identity: not a constant)
                compiled, owner = wrapped
                glue.emit(Instr("PUSH_NULL"), Instr("LOAD_CONST", types.MethodType),
                          Instr("LOAD_CONST", compiled))
                glue.load(owner)
                glue.emit(*_call(2))
            else:
                glue.emit(Instr("LOAD_CONST", wrapped))
        else:
            glue.load(v)
    if inner is not None:  # the breaking instruction runs in the block's grad mode
        glue.emit(Instr("PUSH_NULL"), Instr("LOAD_CONST", torch._C._set_grad_enabled),
                  Instr("LOAD_CONST", inner), *_call(1), Instr("POP_TOP"))
    bc_items = _bytecode_items(code)
    _, items, index_of = bc_items
    original = items[index_of[index]]
    jump = _cond_jump_kind(inst.opname)
    if jump is not None:
        other = Label()
        name = f"POP_JUMP_{jump}" if PY >= (3, 12) else f"POP_JUMP_FORWARD_{jump}"
        glue.emit(Instr(name, other, location=original.location))
        _call_resume(glue, resume_at(index + 1, deep_layout), deep_names, local_temps, restore)
        glue.emit(other)
        _call_resume(glue, resume_at(inst.target, deep_layout), deep_names, local_temps, restore)
        return _assemble(glue, state, func), codes
    if inst.opname in ("CALL",):
        prev = [state.instructions[j] for j in (index - 2, index - 1) if j >= 0]
        for p in prev:
            if p.opname in ("KW_NAMES", "PRECALL") and index_of.get(p.index) is not None:
                glue.emit(_copy(items[index_of[p.index]]))
        glue.emit(_copy(original))
    elif inst.opname == "LOAD_METHOD" or (inst.opname == "LOAD_ATTR" and inst.flag):
        glue.emit(Instr("LOAD_ATTR", (False, inst.argval) if PY >= (3, 12) else inst.argval,
                        location=original.location))
    else:
        glue.emit(_copy(original))
    results = _result_layout(inst)
    result_names = [glue.temp() + f"_r{k}" for k in range(results.count(False))]
    for name in reversed(result_names):
        glue.emit(Instr("STORE_FAST", name))
    _call_resume(glue, resume_at(index + 1, deep_layout + tuple(results)),
                 deep_names + result_names, local_temps, restore)
    return _assemble(glue, state, func), codes


def _copy(instr):
    return instr.copy()


def _assemble(glue: Glue, state: BreakState, func):
    code = state.code
    inst = state.instructions[state.index]
    lineno = inst.lineno or code.co_firstlineno
    for ins in glue.instrs:
        if isinstance(ins, Instr) and ins.lineno is None:
            ins.lineno = lineno
    bc = Bytecode([Instr("RESUME", 0, lineno=lineno), *glue.instrs])
    bc.argnames = ["___outs", "___L"]
    bc.argcount = 2
    bc.name = f"{code.co_name}_break_{state.index}"
    if PY >= (3, 11):
        bc.qualname = f"{getattr(code, 'co_qualname', code.co_name)}.<break at {state.index}>"
    bc.filename = code.co_filename
    bc.first_lineno = min(lineno, code.co_firstlineno)
    bc.flags = inspect.CO_OPTIMIZED | inspect.CO_NEWLOCALS
    try:
        glue_code = bc.to_code()
    except Exception as e:  # noqa: BLE001
        raise CannotResume(f"could not assemble the glue: {type(e).__name__}: {e}") from None
    fn = types.FunctionType(glue_code, func.__globals__, bc.name)
    fn._kiln_keep = glue.keep  # the Variables whose ids key the temporaries
    return fn


__all__ = ["CannotResume", "BreakPlan", "BreakState", "plan_break", "finish_at_break",
           "build_glue", "resume_code", "live_locals", "loop_head", "GradModeExit", "NULL"]
