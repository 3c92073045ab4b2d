"""Declarations a C++ loop may compute once before it (row loops of ``cpp_reduction``, the
inner loop of a pointwise kernel in ``cpp``): values that depend on nothing the loop varies.
Their inlined branches (``kiln_logf``) kept gcc from vectorizing the loop, and they were
computed at every element."""
from __future__ import annotations

import re

# A declaration the row loop may compute once before it: ``<type> <name> = <expression>;``.
_DECL = re.compile(r"^(?:const )?(?:float|double|_Float16|uint16_t|u?int(?:8|16|32|64)_t|bool) (\w+) = (.*);$")
_IDENT = re.compile(r"[A-Za-z_]\w*")
# the loop's own indices, and memory the kernel writes (its outputs, scratch rows, bf16 runs):
# an expression naming one of them is not the same on every iteration
ROW_LOOP_NAMES = frozenset({"r0", "rl", "rb"})
_WRITTEN = re.compile(r"^(out_ptr\d+|scr\d+|kiln_run\d+|acc\d+(_v|_idx|_seen)?)$")
# a name assigned by a statement of the loop (``tmp4 = 0;`` in an index's bounds check)
_ASSIGNED = re.compile(r"\b([A-Za-z_]\w*)\s*(?:\[[^\]]*\])?\s*[+\-*/]?=(?!=)")


def hoist_row_invariants(body: list, loop_names=ROW_LOOP_NAMES) -> tuple:
    """(declarations to emit before the row loop, the loop's body without them). A value that
    depends on nothing the loop varies (a row's ``log(sum(exp))`` in log_softmax's output
    pass) was computed at every element, and its inlined branches kept gcc from vectorizing
    the loop: log_softmax over 4096 x 8192 took 128 ms against eager's 53 ms. A declaration
    moves when its expression names no loop index, no memory the kernel writes, and no value
    that stays in the loop; everything it calls is a pure function. ``loop_names``: the
    loop's own indices (a row loop's by default; a pointwise kernel's inner index)."""
    # a value a statement of the loop assigns (an index's bounds check clamps it) stays in the
    # loop, and so does everything computed from it: a gather hoisted above its bounds check
    # read out of range before the check could report it
    variant = set(loop_names) | {n for line in body if _DECL.match(line.strip()) is None
                                  for n in _ASSIGNED.findall(line)}
    hoisted, kept = [], []
    depth = 0  # only the loop body's own level moves (never a line inside a block of it)
    for line in body:
        m = _DECL.match(line.strip()) if depth == 0 else None
        if m is None:
            depth += line.count("{") - line.count("}")
            names = _DECL.match(line.strip())
            if names is not None:
                variant.add(names.group(1))
            kept.append(line)
            continue
        name, expr = m.groups()
        names = set(_IDENT.findall(expr))
        if name in variant or names & variant or any(_WRITTEN.match(n) for n in names):
            variant.add(name)
            kept.append(line)
        else:
            hoisted.append(line)
    return hoisted, kept
