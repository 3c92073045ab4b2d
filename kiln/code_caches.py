"""The per-code cache table of ``kiln.api``, keyed weakly (issue 24, item 6).

Keys are ``(code object or function, compile options)``: a closure is cached per function
object, since its resume functions hold its cells. A dict keyed by the function itself kept
every dropped closure alive, and with it whatever its cells held. Here the first part of the
key is held by a weak reference: when the function (or the code object) is gone, its CodeCache
and everything compiled for it go too.
"""
from __future__ import annotations

import threading
import weakref


class CodeCaches:
    """A dict-like ``{(obj, opts): CodeCache}`` whose ``obj`` is held weakly."""

    def __init__(self):
        self._by_obj: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # obj -> {opts: cache}
        self._lock = threading.Lock()  # setdefault: threads racing a first call get one cache

    def get(self, key, default=None):
        obj, opts = key
        per = self._by_obj.get(obj)
        return default if per is None else per.get(opts, default)

    def setdefault(self, key, value):
        obj, opts = key
        with self._lock:
            per = self._by_obj.get(obj)
            if per is None:
                per = self._by_obj[obj] = {}
            return per.setdefault(opts, value)

    def __getitem__(self, key):
        out = self.get(key, _MISSING)
        if out is _MISSING:
            raise KeyError(key)
        return out

    def __setitem__(self, key, value):
        obj, opts = key
        with self._lock:
            self._by_obj.setdefault(obj, {})[opts] = value

    def __contains__(self, key) -> bool:
        return self.get(key, _MISSING) is not _MISSING

    def items(self):
        return [((obj, opts), c) for obj, per in list(self._by_obj.items()) for opts, c in per.items()]

    def keys(self):
        return [k for k, _ in self.items()]

    def values(self):
        return [c for _, c in self.items()]

    def __iter__(self):
        return iter(self.keys())

    def __len__(self) -> int:
        return len(self.items())

    def clear(self):
        with self._lock:
            self._by_obj.clear()


_MISSING = object()
