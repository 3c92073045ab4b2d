"""What the glue of a graph break (resume.py) calls to make values of the traced code again
for real: tensor views (taken again from their base, so the resume function gets views as in
eager), dict dataclasses such as ``ModelOutput``, and ``functools.partial`` objects."""
from __future__ import annotations

import functools

from kiln.meta.symbolic import SymInt


def view_rebuild(var):
    """``(root, steps)`` when the glue can take ``var`` again as a real view of its storage's
    root, by the same view ops (so the resume function gets views that alias each other and
    their base as in eager): every step's aliasing is eager's and its sizes static; the root is
    an input not shared with other inputs and not written before the break (read from its
    source), or a tensor the prefix graph computed (passed as a graph output, its value after
    any in-place writes). None otherwise."""
    from kiln.capture.mutation_alias import GroupStorage
    a = getattr(var, "alias", None)
    if a is None or not a.chain or isinstance(a.storage, GroupStorage):
        return None
    root = a.storage.root
    if a.storage.from_input and (a.storage.version or root.source is None):
        return None
    if not a.storage.from_input and root.source is not None:
        return None
    if any(s.uncertain or s.op is None or _has_symbols(s.args) or _has_symbols(s.kwargs)
           for s in a.chain):
        return None
    return root, tuple((s.op, s.args, s.kwargs) for s in a.chain)


def _has_symbols(v) -> bool:
    if isinstance(v, dict):
        v = tuple(v.values())
    if isinstance(v, (tuple, list)):
        return any(_has_symbols(x) for x in v)
    return isinstance(v, SymInt)


def replay_view(tensor, steps):
    """The glue's view of a base: each core view op's eager implementation in turn."""
    for op, args, kwargs in steps:
        tensor = op(tensor, *args, **kwargs)
    return tensor


def _construct(cls, fields):
    """A dict dataclass (``ModelOutput``) made in traced code before a break, made again."""
    return cls(**fields)


def _construct_partial(fn, args, kwargs):
    return functools.partial(fn, *args, **kwargs)
