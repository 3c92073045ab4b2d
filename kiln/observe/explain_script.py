"""``python -m kiln explain script.py [args...]``: run a script with every kiln compile observed,
then print the explain summary (graphs, breaks with source lines, guards, kernels, compile time)."""
from __future__ import annotations

import runpy
import sys

from kiln import api
from kiln.observe.explain import summarize


def main(argv) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print("usage: python -m kiln explain SCRIPT.py [ARGS...]")
        return 0 if argv else 2
    script, rest = argv[0], argv[1:]
    recorder: list = []
    api._RECORDERS.append(recorder)
    old_argv = sys.argv
    sys.argv = [script, *rest]
    status = 0
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit as e:  # the script's own exit code
        status = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    finally:
        sys.argv = old_argv
        api._RECORDERS.remove(recorder)
    print(f"\n=== kiln explain: {script} ({len(recorder)} compiles) ===", file=sys.stderr)
    print(str(summarize(recorder)), file=sys.stderr)
    return status
