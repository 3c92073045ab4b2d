"""Codegen's side of autotuning: whether a kernel offers variants to tune over, and the spec
it hands on. ``runtime/autotune.py`` times the variants at the kernel's first call.

Tuning runs on CUDA; under the Triton interpreter codegen keeps its heuristic config unless
``config.triton_autotune == "interpret"`` (used by tests). C++ kernels tune their OpenMP chunk
size under the same switch (``codegen/cpp_tune.py``).
"""
from __future__ import annotations

from kiln.config import config
from kiln.inductor.codegen.common import interpreting


class TuneSpec:
    """Variants of one kernel: [(source, [config dict, ...])], the kernel's name, and its
    launch sizes (the scalars after the pointers; the first is xnumel)."""
    __slots__ = ("name", "variants", "scalars")

    def __init__(self, name, variants, scalars):
        self.name, self.variants, self.scalars = name, variants, tuple(scalars)


def enabled() -> bool:
    setting = config.triton_autotune
    if setting == "interpret":
        return True
    return bool(setting) and not interpreting()


def cpp_enabled() -> bool:
    """C++ kernels are tuned whenever the switch is on (the Triton interpreter is irrelevant)."""
    return bool(config.triton_autotune)
