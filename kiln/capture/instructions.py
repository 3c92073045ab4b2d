"""Decoding code objects into a flat instruction list.

Every difference between the CPython versions we support (3.11, 3.12) in how an instruction is
*encoded* is resolved here, so the interpreter's handlers see one uniform ``Instruction``:

- ``argval`` is always decoded by ``dis`` (names for LOAD_GLOBAL / LOAD_ATTR with the flag bit
  stripped, the comparison string for COMPARE_OP, absolute target offsets for every jump);
- ``flag`` is the low bit of the raw ``arg`` where an opcode packs one there (push-NULL for
  LOAD_GLOBAL on 3.11+, method-load for LOAD_ATTR on 3.12);
- ``target`` is the instruction *index* a jump goes to (``None`` for non-jumps);
- ``lineno`` is always set (3.11/3.12 only mark line starts; we carry the last one forward).

Differences in what an instruction *does* live in the handlers' version ranges
(interpreter.py). https://docs.python.org/3/library/dis.html
"""
from __future__ import annotations

import dataclasses
import dis
import linecache
import sys
import types
import weakref

PY = sys.version_info[:2]
SUPPORTED_VERSIONS = ((3, 11), (3, 12))

# Opcodes whose low arg bit is a flag rather than part of the name index.
_FLAG_BIT_OPS = {"LOAD_GLOBAL"} | ({"LOAD_ATTR"} if PY >= (3, 12) else set())


@dataclasses.dataclass(frozen=True)
class Instruction:
    index: int
    offset: int
    opname: str
    arg: int | None
    argval: object
    argrepr: str
    lineno: int | None
    is_jump_target: bool
    target: int | None = None   # index of the jump target, for jumps
    flag: bool = False          # the low arg bit, for opcodes that pack one

    def __str__(self):
        arg = "" if self.arg is None else f" {self.arg}"
        rep = f" ({self.argrepr})" if self.argrepr else ""
        mark = ">>" if self.is_jump_target else "  "
        return f"{mark}{self.offset:5d} {self.opname:<24}{arg}{rep}"


_JUMPS = set(dis.hasjrel) | set(dis.hasjabs)


_DECODED: "weakref.WeakKeyDictionary[types.CodeType, tuple]" = weakref.WeakKeyDictionary()


def decode(code: types.CodeType) -> tuple[Instruction, ...]:
    """The instructions of ``code`` without CACHE entries, with jump targets as indices; one
    tuple per code object (capture inlines the same method once per layer: ``dis`` took 40% of
    a GPT-2 capture before this was memoized)."""
    try:
        return _DECODED[code]
    except (KeyError, TypeError):
        pass
    out = _decode(code)
    try:
        _DECODED[code] = out
    except TypeError:  # noqa: PERF203 - a code type that takes no weak references
        pass
    return out


def _decode(code: types.CodeType) -> tuple[Instruction, ...]:
    raw = [i for i in dis.get_instructions(code) if i.opname != "CACHE"]
    index_of = {ins.offset: n for n, ins in enumerate(raw)}
    out = []
    lineno = code.co_firstlineno
    for n, ins in enumerate(raw):
        pos = getattr(ins, "positions", None)
        if pos is not None and pos.lineno is not None:
            lineno = pos.lineno
        elif isinstance(ins.starts_line, int) and not isinstance(ins.starts_line, bool):
            lineno = ins.starts_line
        target = None
        if ins.opcode in _JUMPS and isinstance(ins.argval, int):
            target = index_of.get(ins.argval)
        argval, argrepr = ins.argval, ins.argrepr
        if ins.opname == "KW_NAMES":
            # 3.11's dis leaves KW_NAMES's argval undecoded; the arg indexes co_consts.
            argval = code.co_consts[ins.arg]
            argrepr = argrepr or repr(argval)
        flag = bool(ins.arg & 1) if ins.opname in _FLAG_BIT_OPS and ins.arg is not None else False
        out.append(Instruction(n, ins.offset, ins.opname, ins.arg, argval, argrepr,
                               lineno, ins.is_jump_target, target, flag))
    return tuple(out)


def source_line(filename: str, lineno: int | None) -> str:
    if lineno is None:
        return ""
    return linecache.getline(filename, lineno).strip()


def listing(code: types.CodeType, instructions: list[Instruction]) -> str:
    lines = [f"# {code.co_name} ({code.co_filename}:{code.co_firstlineno})"]
    last = None
    for ins in instructions:
        if ins.lineno != last:
            lines.append(f"  {ins.lineno:>5}  # {source_line(code.co_filename, ins.lineno)}")
            last = ins.lineno
        lines.append(f"         {ins}")
    return "\n".join(lines)
