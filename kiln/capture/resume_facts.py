"""Facts about bytecode that graph breaks need: what an instruction pops and leaves, where the
loops are, which locals are live (resume.py decides from these where a break stops and what
its glue passes on). https://docs.python.org/3/library/dis.html"""
from __future__ import annotations

_ENDS = {"RETURN_VALUE", "RETURN_CONST", "JUMP_FORWARD", "JUMP_BACKWARD",
         "JUMP_BACKWARD_NO_INTERRUPT", "RAISE_VARARGS", "RERAISE", "JUMP"}
_COND_JUMPS = {"POP_JUMP_IF_TRUE", "POP_JUMP_IF_FALSE", "POP_JUMP_IF_NONE", "POP_JUMP_IF_NOT_NONE"}


def _cond_jump_kind(opname: str) -> str | None:
    """'POP_JUMP_FORWARD_IF_FALSE' (3.11) and 'POP_JUMP_IF_FALSE' (3.12) -> 'IF_FALSE'."""
    for direction in ("", "FORWARD_", "BACKWARD_"):
        for kind in ("IF_TRUE", "IF_FALSE", "IF_NONE", "IF_NOT_NONE"):
            if opname == f"POP_JUMP_{direction}{kind}":
                return kind
    return None


def _operands(inst) -> int | None:
    """How many stack values the breaking instruction pops (None: the glue does not run it)."""
    name, arg = inst.opname, inst.arg
    fixed = {"BINARY_OP": 2, "COMPARE_OP": 2, "BINARY_SUBSCR": 2, "CONTAINS_OP": 2, "IS_OP": 2,
             "STORE_ATTR": 2, "STORE_SUBSCR": 3, "DELETE_SUBSCR": 2, "UNARY_NEGATIVE": 1,
             "UNARY_NOT": 1, "UNARY_INVERT": 1, "GET_ITER": 1, "STORE_GLOBAL": 1,
             "BEFORE_WITH": 1, "LOAD_METHOD": 1, "LOAD_ATTR": 1}
    if name in fixed:
        return fixed[name]
    if name == "CALL":
        return arg + 2
    if name == "CALL_FUNCTION_EX":
        return 3 + (arg & 1)
    if name == "UNPACK_SEQUENCE":
        return 1
    if name == "FORMAT_VALUE":
        return 2 if arg & 0x04 else 1
    if name == "BUILD_STRING":
        return arg
    if _cond_jump_kind(name):
        return 1
    return None


def _result_layout(inst) -> list[bool]:
    """The stack slots the glue's copy of the instruction leaves (True marks a NULL)."""
    name = inst.opname
    if name in ("STORE_ATTR", "STORE_SUBSCR", "DELETE_SUBSCR", "STORE_GLOBAL") or _cond_jump_kind(name):
        return []
    if name == "UNPACK_SEQUENCE":
        return [False] * inst.arg
    if name == "BEFORE_WITH":
        return [False, False]
    if name == "LOAD_METHOD" or (name == "LOAD_ATTR" and inst.flag):
        return [True, False]  # the glue loads a bound method; the resume pushes the NULL
    return [False]


def loop_head(instructions, index: int) -> int | None:
    """The first instruction of the outermost loop whose body holds ``index``, if any."""
    head = None
    for inst in instructions:
        if inst.target is not None and inst.target <= inst.index and inst.target <= index <= inst.index:
            head = inst.target if head is None else min(head, inst.target)
    return head


def live_locals(code, instructions, index: int) -> set[str] | None:
    """Fast locals read at or after ``index`` before being written (None: assume all)."""
    if code.co_exceptiontable:
        return None  # handlers are reachable from everywhere; keep it simple and pass them all
    n = len(instructions)
    use, kill, succ = [], [], []
    for inst in instructions:
        u, k = set(), set()
        if inst.opname in ("LOAD_FAST", "LOAD_FAST_CHECK", "LOAD_FAST_AND_CLEAR", "LOAD_CLOSURE",
                           "DELETE_FAST") and isinstance(inst.argval, str):
            u.add(inst.argval)
        elif inst.opname == "STORE_FAST":
            k.add(inst.argval)
        use.append(u)
        kill.append(k)
        s = [] if inst.opname in _ENDS else ([inst.index + 1] if inst.index + 1 < n else [])
        if inst.target is not None:
            s.append(inst.target)
        succ.append(s)
    live = [set() for _ in range(n)]
    changed = True
    while changed:
        changed = False
        for i in range(n - 1, -1, -1):
            out = set()
            for s in succ[i]:
                out |= live[s]
            new = (out - kill[i]) | use[i]
            if new != live[i]:
                live[i] = new
                changed = True
    return live[index]
