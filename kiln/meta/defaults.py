"""torch's default dtype and device, read at trace time and guarded (issue 24, item 2).

Factories without ``dtype=``/``device=`` (``torch.ones(4)``), a Python float meeting an integer
tensor, and ``torch.tensor(data)`` depend on ``torch.get_default_dtype()`` and
``torch.get_default_device()``. Capture reads them through ``default_dtype()`` and
``default_device()``, which note the read for the trace running in this thread (``watching``),
and the trace guards each value it read (``capture.guards.add_default_guards``), so a compiled function recompiles after
``torch.set_default_dtype`` or ``torch.set_default_device`` instead of returning the old dtype
or device. A trace that read neither guards neither (no cost per call).
"""
from __future__ import annotations

import contextlib
import threading

import torch

_local = threading.local()


def _note(kind, value):
    reads = getattr(_local, "reads", None)
    if reads is not None:
        reads.setdefault(kind, value)
    return value


def default_dtype() -> torch.dtype:
    return _note("dtype", torch.get_default_dtype())


def default_device() -> torch.device:
    return _note("device", torch.get_default_device())


@contextlib.contextmanager
def watching():
    """The defaults read while the block runs (in this thread): ``{"dtype": ..., "device": ...}``."""
    prev = getattr(_local, "reads", None)
    _local.reads = reads = {}
    try:
        yield reads
    finally:
        _local.reads = prev
        if prev is not None:  # a nested trace's reads are the outer one's too
            for k, v in reads.items():
                prev.setdefault(k, v)

