"""``assert t`` and ``torch._assert(t, msg)`` on a one-element tensor, checked at run time
instead of breaking the graph.

The truth value of a tensor is data (a break, values.py ``truth``), but an assert has only one
way on: the other successor raises. So capture takes the way on and records the tensor as a
check (``SideEffects.asserts``): the tensor becomes one more graph output, and the rebuild
(rebuild.py, side_effects.replay) calls ``bool()`` on it before it replays any Python-state
write, raising ``AssertionError(msg)`` as eager's ``assert`` does when it is false. Dynamo
does the same with an in-graph ``_assert_async``; kiln checks on the host after the graph, so
a failing check still raises eager's exception type and message, never passes silently. What
differs from eager on failure: the graph has run to its end, so writes it makes to input
tensors after the assert have happened (Python-state writes have not).

Recognized shapes, in the bytecode of 3.11 and 3.12 (https://docs.python.org/3/library/dis.html):
the block ``LOAD_ASSERTION_ERROR [LOAD_CONST msg [PRECALL 0] CALL 0] RAISE_VARARGS 1`` is the
target of the jump (the first term of ``assert a and b``) or its fall-through (``assert a``,
``assert not a``); the check expects the truth that avoids it. A message computed at run time (an
f-string) is not known without running the failing path, so that assert still breaks.
"""
from __future__ import annotations

from kiln.capture.values import TensorVariable


def tensor_condition(value) -> bool:
    """Whether ``value`` is a tensor whose truth eager takes (one element, known statically)."""
    if type(value) is not TensorVariable:
        return False
    numel = value.proxy.meta.numel()
    return type(numel) is int and numel == 1  # more elements: eager raises at bool() itself


def raise_block_args(instructions, index: int):
    """The ``AssertionError`` arguments of the assert-failure block starting at ``index``:
    ``()`` for a bare ``assert``, ``(msg,)`` for a constant message, None when the block is not
    one (or its message is computed)."""
    if index is None or index >= len(instructions) or \
            instructions[index].opname != "LOAD_ASSERTION_ERROR":
        return None
    ops = [(i.opname, i.argval) for i in instructions[index + 1:index + 5]]
    names = [name for name, _ in ops]
    if names[:1] == ["RAISE_VARARGS"]:
        return ()
    if names[:1] != ["LOAD_CONST"]:
        return None
    rest = [n for n in names[1:] if n != "PRECALL"]
    calls = [a for n, a in ops[1:] if n == "CALL"]
    if rest[:2] == ["CALL", "RAISE_VARARGS"] and calls[:1] == [0]:
        return (ops[0][1],)
    return None


def checked_assert(frame, inst, value, jumps_if: bool) -> bool:
    """For a conditional jump on ``value`` (taken when its truth is ``jumps_if``): when one
    successor is an assert's failure block and ``value`` a one-element tensor, record the check,
    move to the other successor, and return True; else False (the caller takes the truth)."""
    if not tensor_condition(value):
        return False
    # frame.ip is already the fall-through (taken when the truth is not ``jumps_if``)
    args = raise_block_args(frame.instructions, inst.target)
    if args is not None:  # the jump fails: the value must not take it
        record_assert(frame.tx, value, args, expect=not jumps_if)
        return True
    args = raise_block_args(frame.instructions, frame.ip)
    if args is not None:  # falling through fails: the jump is the way on
        record_assert(frame.tx, value, args, expect=jumps_if)
        frame.jump(inst)
        return True
    return False


def record_assert(tx, value: TensorVariable, args: tuple, expect: bool = True):
    """A run-time check that ``bool(value) is expect``, else ``AssertionError(*args)``."""
    tx.side_effects.asserts.append((value, args, expect))


__all__ = ["checked_assert", "raise_block_args", "record_assert", "tensor_condition"]
