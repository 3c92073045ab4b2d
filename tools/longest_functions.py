"""The longest functions and files under a package: python tools/longest_functions.py [kiln] [-n 15].

A function's length is its source lines from ``def`` to its last statement (decorators and a
nested function's lines count in the outer one too, as a reader sees them)."""
from __future__ import annotations

import argparse
import ast
import pathlib


def functions(root: pathlib.Path):
    for path in sorted(root.rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                yield node.end_lineno - node.lineno + 1, f"{path}:{node.lineno}", node.name


def files(root: pathlib.Path):
    for path in sorted(root.rglob("*.py")):
        yield len(path.read_text().splitlines()), str(path)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("root", nargs="?", default="kiln")
    p.add_argument("-n", type=int, default=15)
    p.add_argument("--limit", type=int, default=120, help="count functions longer than this")
    a = p.parse_args(argv)
    root = pathlib.Path(a.root)
    fns = sorted(functions(root), reverse=True)
    print(f"functions over {a.limit} lines: {sum(n > a.limit for n, _, _ in fns)}")
    for n, where, name in fns[:a.n]:
        print(f"{n:5d}  {name:40s} {where}")
    big = sorted(files(root), reverse=True)
    print(f"files over 800 lines: {sum(n > 800 for n, _ in big)}")
    for n, where in big[:5]:
        print(f"{n:5d}  {where}")


if __name__ == "__main__":
    main()
