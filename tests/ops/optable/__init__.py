"""The op table: one list of entries, by family, that drives tests/ops/test_optable.py (every
entry run each way), tests/ops/test_optable_grad.py (entries marked differentiable) and the
bad-input test. ``python -m tests.ops.optable.summary`` prints passes per way."""
from __future__ import annotations

import importlib

from .common import BadInput, OpEntry, entries_by_name

FAMILIES = ["elementwise", "reductions", "shape", "nn", "creation"]

ENTRIES: list[OpEntry] = []
BAD: list[BadInput] = []
for _family in FAMILIES:
    _mod = importlib.import_module(f"{__name__}.{_family}")
    ENTRIES += _mod.ENTRIES
    BAD += getattr(_mod, "BAD", [])

BY_NAME = entries_by_name(ENTRIES)
entries_by_name(BAD)
