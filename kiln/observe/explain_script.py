"""``python -m kiln explain script.py [args...]``: run a script with every kiln compile observed,
then print the explain summary (graphs, breaks with source lines, guards, kernels, compile time)."""
from __future__ import annotations

import argparse
import runpy
import sys

from kiln import api
from kiln.observe.explain import summarize


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="kiln explain", description=__doc__.split("\n\n")[0])
    p.add_argument("script", metavar="SCRIPT.py", nargs="?")
    # the script's own arguments, flags included: everything after SCRIPT.py is the script's
    p.add_argument("args", nargs=argparse.REMAINDER, metavar="ARGS")
    return p


def main(argv=None) -> int:
    p = parser()
    args = p.parse_args(argv)
    if args.script is None:
        p.error("give the script to run: kiln explain SCRIPT.py [ARGS...]")
    script, rest = args.script, args.args
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
