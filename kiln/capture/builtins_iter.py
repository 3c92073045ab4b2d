"""More builtins during capture: ``collections.deque``.

Registered into ``builtins.BUILTIN_HANDLERS`` on import (builtins.py imports this module last).
"""
from __future__ import annotations

import collections

from kiln.capture.builtins import handles
from kiln.capture.values_deque import make_deque


# ---------------------------------------------------------------- collections.deque
@handles(collections.deque)
def _deque(tx, iterable=None, maxlen=None):
    return make_deque(tx, iterable, maxlen)


__all__ = []
