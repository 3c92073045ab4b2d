"""What the glue of a graph break (resume.py) calls to make values of the traced code again
for real: views of inputs (taken again from the real input, so the resume function gets a view
as in eager), dict dataclasses such as ``ModelOutput``, and ``functools.partial`` objects."""
from __future__ import annotations

import functools


def input_view_steps(var):
    """The view ops from an input to ``var`` when the glue can take the same view of the real
    input (so the resume function gets a view, as in eager): the input is not shared with
    other inputs, was not written before the break, and every step's aliasing is eager's."""
    from kiln.capture.mutation_alias import GroupStorage
    a = getattr(var, "alias", None)
    if a is None or not a.chain or not a.storage.from_input or a.storage.version \
            or isinstance(a.storage, GroupStorage) or a.storage.root.source is None:
        return None
    if any(s.uncertain or s.op is None or _has_symbols(s.args) or _has_symbols(s.kwargs)
           for s in a.chain):
        return None
    return tuple((s.op, s.args, s.kwargs) for s in a.chain)


def _has_symbols(v) -> bool:
    from kiln.meta.symbolic import SymInt
    if isinstance(v, dict):
        v = tuple(v.values())
    if isinstance(v, (tuple, list)):
        return any(_has_symbols(x) for x in v)
    return isinstance(v, SymInt)


def replay_view(tensor, steps):
    """The glue's view of an input: each core view op's eager implementation in turn."""
    for op, args, kwargs in steps:
        tensor = op(tensor, *args, **kwargs)
    return tensor


def _construct(cls, fields):
    """A dict dataclass (``ModelOutput``) made in traced code before a break, made again."""
    return cls(**fields)


def _construct_partial(fn, args, kwargs):
    return functools.partial(fn, *args, **kwargs)
