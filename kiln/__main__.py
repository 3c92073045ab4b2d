"""The ``kiln`` command (also ``python -m kiln``): demo, explain, report, bench, --version.

Each subcommand parses its own arguments with argparse (its module's ``main(argv)``), so
``kiln COMMAND --help`` is that command's own help; this parser only picks the command.
"""
from __future__ import annotations

import argparse
import importlib
import os
import sys

from kiln._version import __version__

# name -> (help, the module whose main(argv) runs it); bench is the repository's (_bench)
COMMANDS = {
    "demo": ("compile the seed example and print every stage, then time it", "kiln.observe.demo"),
    "explain": ("run a script with compilation observed and print the explain summary",
                "kiln.observe.explain_script"),
    "report": ("turn a KILN_DEBUG dump into one HTML page and a Perfetto trace "
               "(--profile script.py: time it first)", "kiln.observe.report"),
    "bench": ("run the benchmark suite (benchmarks/run.py; needs the kiln repository checkout)", None),
    "config": ("print every setting, its value and where the value came from", "kiln.config"),
}


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="kiln", description="kiln: a compiler for PyTorch programs.",
                                epilog="kiln COMMAND --help shows a command's own arguments.")
    p.add_argument("--version", action="version", version=f"kiln {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", title="commands")
    for name, (text, _) in COMMANDS.items():
        # the command's own arguments are parsed by its main(); add_help=False leaves -h to it
        sub.add_parser(name, help=text, add_help=False)
    return p


def _split(argv: list[str]) -> tuple[list[str], list[str]]:
    """(kiln's own arguments up to and including the command, the command's arguments)."""
    for i, arg in enumerate(argv):
        if not arg.startswith("-"):
            return argv[:i + 1], argv[i + 1:]
    return argv, []


def _bench(argv: list[str]) -> int:
    """benchmarks/ is the repository's, not the installed package's: it runs from a checkout
    (the one an editable install of kiln points at, or the current directory)."""
    for repo in (os.getcwd(), os.path.dirname(os.path.dirname(os.path.abspath(__file__)))):
        if os.path.exists(os.path.join(repo, "benchmarks", "run.py")) and repo not in sys.path:
            sys.path.insert(0, repo)
    try:
        from benchmarks import run
    except ImportError:
        run = None
    if run is None or not hasattr(run, "CASES"):  # absent, or someone else's `benchmarks`
        print("kiln bench: the benchmark runner (benchmarks/run.py) ships with the kiln repository, "
              "not the installed package: run `kiln bench` from a checkout of the repository",
              file=sys.stderr)
        return 2
    run.main(argv)
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    own, rest = _split(argv)
    p = parser()
    args = p.parse_args(own)
    if args.command is None:
        p.print_help()
        return 0 if not argv else 2
    module = COMMANDS[args.command][1]
    if module is not None:
        return importlib.import_module(module).main(rest) or 0
    return _bench(rest)


if __name__ == "__main__":
    sys.exit(main())
