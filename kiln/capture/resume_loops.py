"""Graph breaks inside ``for`` loops: the rest of the loop resumes compiled, inside the loop.

At a break inside a ``for`` loop of the function's own frame, the iterator of each enclosing
loop sits on the stack (FOR_ITER leaves it there). Capture knows its remaining items (a
range, list, tuple, dict, zip, enumerate, ModuleList... iterator is an ``IteratorVariable``).
The glue (resume.py) hands the resume function a ``LoopRest``, a plain Python iterator over
a tuple of those items, rebuilt like any other value the glue passes (tensors from the prefix
graph's outputs, modules and inputs from their sources, constants inline).

Capture wraps a ``LoopRest`` argument as a ``LoopRestVariable``: its items are read one at a
time, lazily, each with its own guards, and only the test FOR_ITER makes is guarded on its
length (``len(items) > k`` or ``== k``). So a resume function traced at iteration 3 of a
``range(100)`` loop does not specialize on the 96 items left, and the same compiled entry
serves every iteration that looks the same (a module list's layers differ by identity:
one entry per layer).

A break inside a resume function's copy of the loop maps back to the original code object
and instruction (``origin_of``), so the glue resumes into the same resume function again
instead of nesting a new one per iteration: one resume code per (code, instruction, layout),
one cache of entries, guarded like any other. Its entries are bounded by
``config.loop_resume_limit`` rather than ``recompile_limit`` (``starts_in_loop``). The glue
returns a ``TailCall`` instead of calling the resume function, and ``CompiledFunction``
runs it, so N iterations do not nest N Python calls.

Where a loop cannot be resumed inside (a ``while`` loop, an iterator that is also held
elsewhere, a generator's items, a value the glue cannot rebuild), resume.plan_break falls
back to stopping before the outermost loop, the rest of the frame running eagerly.
"""
from __future__ import annotations

from bytecode import Instr

from kiln.capture.errors import Unsupported
from kiln.capture.guards import AttrSource, ItemSource
from kiln.capture.instructions import decode
from kiln.capture.values import (DictVariable, IteratorVariable, LazyVariable, ListVariable,
                                 NullVariable, TupleVariable)


# ====================================================================== at run time
class LoopRest:
    """The items a ``for`` loop has left at a graph break, as the iterator the resume function's
    copy of the loop runs on (a plain Python iterator, so eager code can run it too)."""
    __slots__ = ("items", "pos")

    def __init__(self, items: tuple):
        self.items = items
        self.pos = 0

    def __iter__(self):
        return self

    def __next__(self):
        pos = self.pos
        if pos >= len(self.items):
            raise StopIteration
        self.pos = pos + 1
        return self.items[pos]

    def __length_hint__(self):
        return len(self.items) - self.pos

    def __repr__(self):
        return f"LoopRest({len(self.items) - self.pos} items left)"


def rest_after(rest: LoopRest, consumed: int) -> LoopRest:
    """A fresh ``LoopRest`` over what ``rest`` has left after ``consumed`` more items."""
    return LoopRest(rest.items[rest.pos + consumed:])


class TailCall:
    """What a glue returns instead of calling the resume function: ``CompiledFunction`` runs it
    (``run_tail_calls``), so a loop that breaks N times does not nest N Python calls."""
    __slots__ = ("fn", "args")

    def __init__(self, fn, args: tuple):
        self.fn = fn
        self.args = args


def run_tail_calls(out):
    """Run the resume functions glues hand back until a real value comes out (a compiled one
    through ``call_raw``, which hands back its own glue's TailCall instead of running it)."""
    while type(out) is TailCall:
        raw = getattr(out.fn, "call_raw", None)
        out = raw(out.args, {}) if raw is not None else out.fn(*out.args)
    return out


# ====================================================================== in capture
class LoopRestVariable(IteratorVariable):
    """A ``LoopRest`` argument of a resume function: items are read lazily, one per FOR_ITER,
    and the iterator's length is guarded only as far as FOR_ITER tested it."""
    lazy = True

    def __init__(self, tx, value: LoopRest, source):
        self.tx = tx
        self.value = value
        self.source = source
        self.items_source = AttrSource(source, "items")
        self.pos = 0

    def _has(self, k: int) -> bool:
        if len(self.value.items) > k:
            self.tx.guards.add(self.items_source, f"len({{}}) > {k}")
            return True
        self.tx.guards.add(self.items_source, f"len({{}}) == {k}")
        return False

    def next_lazy(self):
        """The next item as a LazyVariable (wrapped, and guarded, when it is first read)."""
        if not self._has(self.pos):
            return None
        self.pos += 1
        k = self.pos - 1
        return LazyVariable(self.value.items[k], ItemSource(self.items_source, k))

    def next(self):
        item = self.next_lazy()
        return None if item is None else self.tx.wrap(item.value, item.source)

    @property
    def items(self):
        """Every item (a use other than FOR_ITER: ``list(it)``, ``zip``): the length is guarded."""
        n = len(self.value.items)
        self.tx.guards.add(self.items_source, f"len({{}}) == {n}")
        return [self.tx.wrap(v, ItemSource(self.items_source, k)) for k, v in enumerate(self.value.items)]

    def iterate(self, tx):
        items = self.items
        rest, self.pos = items[self.pos:], len(items)
        return rest

    def python_type(self):
        return LoopRest

    def reconstruct(self, glue):
        """At a break: a fresh LoopRest over the items this trace has not consumed."""
        if id(self) in glue.temps:
            glue.emit(Instr("LOAD_FAST", glue.temps[id(self)]))
            return
        from kiln.capture.resume import _call
        glue.emit(Instr("PUSH_NULL"), Instr("LOAD_CONST", rest_after))
        glue.load_source(self.source)
        glue.emit(Instr("LOAD_CONST", self.pos), *_call(2))
        glue._memo(self)

    def __repr__(self):
        return f"LoopRest({self.source}, at {self.pos})"


def wrap_loop_rest(tx, value: LoopRest, source):
    """``Tracer.wrap`` of a LoopRest: guarded by type and a fresh position (the glue makes it)."""
    if source is None:
        raise Unsupported("a loop's remaining items reached without a source")
    seen = tx.side_effects.tracker_of(value)
    if seen is not None:
        tx.guards.same_object(source, seen.source)
        return seen
    tx.guards.add(source, f"id(type({{}})) == {id(LoopRest)} and {{}}.pos == 0")
    return tx.side_effects.remember(value, LoopRestVariable(tx, value, source))


def load_as_rest(glue, v: IteratorVariable):
    """The glue's rebuild of an iterator on the stack: ``LoopRest((remaining items...))``."""
    from kiln.capture.resume import _call
    glue.emit(Instr("PUSH_NULL"), Instr("LOAD_CONST", LoopRest))
    rest = v.items[v.pos:]
    for x in rest:
        glue.load(x)
    glue.emit(Instr("BUILD_TUPLE", len(rest)), *_call(1))
    glue._memo(v)


# ====================================================================== which iterators
def for_loop_refusal(instructions, index: int) -> str | None:
    """Why the break at ``index`` cannot resume inside its loops (None: it can): every loop
    holding it must be a ``for`` loop (its backward jumps go to its FOR_ITER), and the break
    must not be the FOR_ITER itself. 3.12's inlined comprehensions (LOAD_FAST_AND_CLEAR just
    before their loop; their list is on the stack) are left to the eager fallback."""
    heads = {inst.target for inst in instructions
             if inst.target is not None and inst.target <= inst.index and inst.target <= index <= inst.index}
    for head in sorted(heads):
        if instructions[head].opname != "FOR_ITER":
            return "a while loop holds it"
        if head == index:
            return "it is the loop's own FOR_ITER"
        if any(i.opname == "LOAD_FAST_AND_CLEAR" for i in instructions[max(0, head - 6):head]):
            return "an inlined comprehension holds it"
    return None


def enclosing_for_loops(instructions, index: int) -> int:
    """How many ``for`` loops hold ``index`` (each keeps its iterator on the stack)."""
    return len({inst.target for inst in instructions
                if inst.target is not None and inst.target <= inst.index
                and inst.target <= index <= inst.index and instructions[inst.target].opname == "FOR_ITER"})


def _reaches(v, target: int, depth=0) -> bool:
    """Does ``v`` hold the Variable whose id is ``target`` (through containers)?"""
    if id(v) == target:
        return True
    if depth > 20:
        return True  # too deep to tell: assume it does
    if isinstance(v, (TupleVariable, ListVariable)):
        return any(_reaches(x, target, depth + 1) for x in v.items)
    if isinstance(v, DictVariable):
        return any(_reaches(x, target, depth + 1) for x in v.items.values())
    if isinstance(v, IteratorVariable) and not getattr(v, "lazy", False):
        return any(_reaches(x, target, depth + 1) for x in v.items[v.pos:])
    attrs = getattr(v, "attrs", None)
    if isinstance(attrs, dict):
        return any(_reaches(x, target, depth + 1) for x in attrs.values())
    return False


def stack_iterators(state, deeper: list, operands: list) -> tuple[set, list]:
    """The iterators among the stack slots ``deeper`` the glue may pass as a LoopRest (ids), and
    why the others may not: held elsewhere too (a local, another slot, a container: the resume
    function's copy would not advance theirs), or a generator's items (run at its call)."""
    ok, refused = set(), []
    others = [*state.locals.values(), *operands]
    for k, v in enumerate(deeper):
        if not isinstance(v, IteratorVariable) or isinstance(v, NullVariable):
            continue
        if getattr(v, "from_generator", False):
            refused.append("the loop runs over a generator")
            continue
        rest = others + [x for j, x in enumerate(deeper) if j != k]
        if any(_reaches(x, id(v)) for x in rest):
            refused.append("the loop's iterator is also held by another value")
            continue
        ok.add(id(v))
    return ok, refused


def check_loop_state(state, deeper: list, operands: list) -> set:
    """For a break planned inside its loops: the loop iterators (ids), or CannotResume."""
    from kiln.capture.resume import CannotResume
    ok, refused = stack_iterators(state, deeper, operands)
    if refused:
        raise CannotResume(refused[0])
    need = enclosing_for_loops(state.instructions, state.index)
    if len(ok) < need:
        raise CannotResume(f"{need} loop iterators expected on the stack, {len(ok)} found")
    return ok


# ====================================================================== resume codes -> originals
_ORIGINS: dict = {}    # resume code -> (the code it copies, {its instruction index: that code's})
_IN_LOOP: set = set()  # resume codes that start inside a for loop of their original


def _norm(opname: str) -> str:
    return opname.replace("FORWARD_", "").replace("BACKWARD_", "").replace("_NO_INTERRUPT", "")


def register_origin(resume, code, resume_at: int, start: int, n_prologue: int):
    """Record how ``resume``'s instructions map onto ``code``'s: ``resume`` is ``code`` with
    ``n_prologue`` instructions inserted after the ``start``-th (RESUME); EXTENDED_ARGs may
    differ, so positions are matched without them. ``resume_at``: where it resumes in ``code``."""
    orig = [i for i in decode(code) if i.opname != "EXTENDED_ARG"]
    new = [i for i in decode(resume) if i.opname != "EXTENDED_ARG"]
    if len(new) != len(orig) + n_prologue:
        return
    mapping = {}
    for k, inst in enumerate(new):
        if start < k <= start + n_prologue:
            continue  # the prologue has no counterpart
        o = orig[k if k <= start else k - n_prologue]
        if _norm(o.opname) != _norm(inst.opname) and not (
                inst.opname == "NOP" and o.opname in ("MAKE_CELL", "COPY_FREE_VARS")):
            return  # (a resume function's cells are arguments: resume_cells.py)
        mapping[inst.index] = o.index
    _ORIGINS[resume] = (code, mapping)
    root, root_at = origin_of(code, resume_at)
    from kiln.capture.resume_facts import loop_head
    if loop_head(decode(root), root_at) is not None:
        _IN_LOOP.add(resume)


def origin_of(code, index: int):
    """The original code object and instruction that instruction ``index`` of ``code`` copies
    (``code`` itself when it is no resume function, or ``index`` is in its prologue)."""
    while code in _ORIGINS:
        parent, mapping = _ORIGINS[code]
        if index not in mapping:
            break
        code, index = parent, mapping[index]
    return code, index


def starts_in_loop(code) -> bool:
    """Is ``code`` a resume function that starts inside a for loop (its entries: one per
    iteration that looks different, bounded by ``config.loop_resume_limit``)?"""
    return code in _IN_LOOP


__all__ = ["LoopRest", "LoopRestVariable", "TailCall", "run_tail_calls", "wrap_loop_rest",
           "load_as_rest", "for_loop_refusal", "check_loop_state", "stack_iterators",
           "register_origin", "origin_of", "starts_in_loop"]
