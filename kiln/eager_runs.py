"""No silent eager (issue 25): every frame kiln runs natively instead of compiled goes through
``note_eager_run``.

The paths that call it: the recompile limit, a graph break that cannot be resumed (the whole
frame, or the rest of the frame after the break), an internal error in a stage, an op that
refused its arguments at capture while eager torch accepted them, arguments capture could not
bind, a break's callee not known at compile time, and the eager-ops backward after a failed
backward compile. The one exception is a resume function with no tensor work whose traced
Python values keep changing (``return loss.item() * 2``): compiled code would be the same
plain Python, so it is logged (``recompiles`` channel) and not counted.

Each run counts in ``kiln.stats()["eager_runs"]``; the first run of each (code object,
reason) warns, with the reason and the source line, and is listed in ``kiln.explain``'s
``eager_runs`` and, under ``KILN_DEBUG``, in the run folder's ``eager_runs.json``, which the
report shows.
"""
from __future__ import annotations

import linecache
import os
import sys
import warnings

from kiln import counters, log

_RECORDS: dict = {}            # (where the code is, or name; reason) -> the record of its runs
_LISTENERS: list[list] = []    # kiln.explain's lists: records of the runs during its call
# fn(record) at the first run of each (frame, reason), after its warning: kiln/observe writes
# the KILN_DEBUG run folder's list (observe sits above this module)
SUBSCRIBERS: list = []
_COUNTS = counters.counters


def note_eager_run(reason: str, code=None, lineno: int | None = None, name: str | None = None,
                   filename: str | None = None) -> dict:
    """One run of a frame (``code``, or a graph called ``name``) natively instead of compiled,
    because of ``reason``; ``filename:lineno`` is the line that decided it (a graph break's,
    maybe in a callee), else the frame's first line."""
    _COUNTS["eager_runs"] += 1
    # by where the code is, not the code object: a record must not keep a dropped function's
    # code (and the weakly keyed CodeCache of it, kiln/code_caches.py) alive
    where = (code.co_filename, code.co_firstlineno, code.co_name) if code is not None else name
    key = (where, reason)
    rec = _RECORDS.get(key)
    if rec is not None:
        rec["count"] += 1
    else:
        rec = _RECORDS[key] = _record(reason, code, filename, lineno, name)
        _announce(rec)
    for listener in _LISTENERS:
        if not any(r is rec for r in listener):
            listener.append(rec)
    return rec


def _record(reason, code, filename, lineno, name) -> dict:
    if code is not None and (filename is None or lineno is None):
        filename = filename or code.co_filename
        lineno = lineno or code.co_firstlineno
    if name is None and code is not None:
        name = getattr(code, "co_qualname", code.co_name)
    source = linecache.getline(filename, lineno).strip() if filename and lineno else ""
    return {"reason": reason, "name": name, "filename": filename, "lineno": lineno,
            "source_line": source, "count": 1}


def _announce(rec):
    """The first run of a (frame, reason): a warning, a log line, the debug run folder's list."""
    filename, lineno, source = rec["filename"], rec["lineno"], rec["source_line"]
    where = f" ({filename}:{lineno})" if filename else ""
    text = f"kiln: {rec['name']}{where} runs eagerly: {rec['reason']}" + (f"\n    {source}" if source else "")
    warnings.warn(text, RuntimeWarning, stacklevel=_user_level())
    log.log("graph_breaks", "%s", text)
    for fn in SUBSCRIBERS:
        fn(rec)


_KILN_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep


def _user_level() -> int:
    """The stacklevel of the first frame outside kiln: the warning names the user's call."""
    frame, level = sys._getframe(1), 1
    while frame is not None and frame.f_code.co_filename.startswith(_KILN_DIR):
        frame, level = frame.f_back, level + 1
    return level


def records() -> list[dict]:
    """Every (frame, reason) that ran eagerly since the last ``kiln.reset()``, first seen first."""
    return [dict(r) for r in _RECORDS.values()]


def reset():
    _RECORDS.clear()
