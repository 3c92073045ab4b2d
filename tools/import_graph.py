"""The import graph of kiln's packages: edges, cycles and function-local imports.

    python tools/import_graph.py            # summary: edges, back-edge cycles, local imports
    python tools/import_graph.py --edges    # every unit-to-unit edge with its import count
    python tools/import_graph.py --local    # every function-local import of a kiln module
    python tools/import_graph.py --why      # why each one is local (imports kiln once to see)

A *unit* is a subpackage of kiln (``kiln.capture``) or a top-level module (``kiln.config``);
``kiln`` itself is the package's ``__init__``. Imports are read from the source with ``ast``
(top-level and inside functions alike), so the figures need no import of kiln. The
import-linter contract in pyproject.toml checks the same graph; this script gives the counts
that the contract does not print (tests/test_layers.py runs it too).
"""
from __future__ import annotations

import argparse
import ast
import os
import sys
from collections import defaultdict
from dataclasses import dataclass

ROOT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "kiln")


@dataclass(frozen=True)
class Import:
    source: str     # importing module, dotted
    target: str     # imported kiln module (or package), dotted
    line: int
    local: bool     # made inside a function body


def _module_name(path: str) -> str:
    rel = os.path.relpath(path, os.path.dirname(ROOT))[:-3].split(os.sep)
    if rel[-1] == "__init__":
        rel = rel[:-1]
    return ".".join(rel)


def _is_module(dotted: str) -> bool:
    base = os.path.join(os.path.dirname(ROOT), *dotted.split("."))
    return os.path.isdir(base) or os.path.exists(base + ".py")


def _resolve(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    parts = module.split(".")
    if not is_package:
        parts = parts[:-1]
    parts = parts[: len(parts) - (node.level - 1)]
    return ".".join(parts + ([node.module] if node.module else []))


class _Collector(ast.NodeVisitor):
    def __init__(self, module: str, is_package: bool):
        self.module, self.is_package = module, is_package
        self.depth = 0
        self.found: list[Import] = []
        self.local_statements: list[tuple[str, int]] = []   # every import inside a function

    def _function(self, node):
        self.depth += 1
        self.generic_visit(node)
        self.depth -= 1

    visit_FunctionDef = visit_AsyncFunctionDef = visit_Lambda = _function

    def _add(self, target: str, line: int):
        if target == "kiln" or target.startswith("kiln."):
            self.found.append(Import(self.module, target, line, self.depth > 0))

    def _statement(self, node):
        if self.depth:
            self.local_statements.append((self.module, node.lineno))

    def visit_Import(self, node: ast.Import):
        self._statement(node)
        for alias in node.names:
            self._add(alias.name, node.lineno)

    def visit_ImportFrom(self, node: ast.ImportFrom):
        self._statement(node)
        base = _resolve(self.module, self.is_package, node)
        for alias in node.names:
            # `from kiln import config` imports the module kiln.config
            full = f"{base}.{alias.name}"
            self._add(full if _is_module(full) else base, node.lineno)


def collect(root: str = ROOT) -> tuple[list[Import], list[tuple[str, int]]]:
    """Every import of a kiln module, and every function-local import statement (any module)."""
    found: list[Import] = []
    local_statements: list[tuple[str, int]] = []
    for folder, _, files in os.walk(root):
        for name in sorted(files):
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                with open(path, encoding="utf-8") as f:
                    tree = ast.parse(f.read(), path)
                collector = _Collector(_module_name(path), name == "__init__.py")
                collector.visit(tree)
                found += collector.found
                local_statements += collector.local_statements
    return found, local_statements


def unit(dotted: str) -> str:
    """kiln.capture.values -> kiln.capture; kiln.config -> kiln.config; kiln -> kiln."""
    return ".".join(dotted.split(".")[:2])


def unit_edges(imports: list[Import]) -> dict[tuple[str, str], int]:
    edges: dict[tuple[str, str], int] = defaultdict(int)
    for imp in imports:
        a, b = unit(imp.source), unit(imp.target)
        if a != b:
            edges[a, b] += 1
    return dict(edges)


def cycles(edges) -> list[list[str]]:
    """Strongly connected components of more than one unit (Tarjan's algorithm)."""
    graph: dict[str, set[str]] = defaultdict(set)
    for a, b in edges:
        graph[a].add(b)
        graph[b]
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10000))
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def load_order(imports: list[Import]) -> list[str]:
    """The order ``import kiln`` finishes loading kiln's modules, read from the top-level
    imports (importlib moves a module to the end of sys.modules when it finishes)."""
    top: dict[str, list] = defaultdict(list)
    for i in imports:
        if not i.local:
            top[i.source].append((i.line, i.target))
    order: list[str] = []
    seen: set[str] = set()

    def visit(m: str):
        if m in seen:
            return
        if "." in m:
            visit(m.rsplit(".", 1)[0])  # the package's __init__ runs first
            if m in seen:
                return
        seen.add(m)
        for _, t in sorted(top[m]):
            visit(t)
        order.append(m)

    visit("kiln")
    return order


def _reaches(top: dict, a: str, b: str) -> bool:
    seen, todo = set(), [a]
    while todo:
        v = todo.pop()
        if v == b:
            return True
        if v not in seen:
            seen.add(v)
            todo.extend(top[v])
    return False


def why_local(imports: list[Import]) -> dict[str, list[Import]]:
    """Each function-local import of a kiln module, by the reason it is not at the top:
    ``start-up`` (``import kiln`` does not load the module: triton's codegen and runtime, the
    debug dump, ...), ``cycle`` (a top-level import would close a cycle of modules),
    ``load order`` (it would change the order ``import kiln`` loads kiln's modules in, whose
    import-time registrations are left as they are), and ``none`` (could move to the top)."""
    import subprocess
    code = "import kiln, sys; print(' '.join(m for m in sys.modules if m.startswith('kiln')))"
    env = {**os.environ, "PYTHONPATH": os.path.dirname(ROOT)}
    loaded = set(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                env=env, check=True).stdout.split())
    top: dict[str, set] = defaultdict(set)
    for i in imports:
        if not i.local:
            top[i.source].add(i.target)
    baseline = load_order(imports)
    top_lines: dict[str, list[int]] = defaultdict(list)
    for i in imports:
        if not i.local:
            top_lines[i.source].append(i.line)
    out: dict[str, list[Import]] = defaultdict(list)
    for i in imports:
        if not i.local:
            continue
        if i.target not in loaded:
            out["start-up"].append(i)
        elif _reaches(top, i.target, i.source):
            out["cycle"].append(i)
        # moved up to just after the top-level imports above its function
        elif load_order([*imports, Import(i.source, i.target, max(
                [n for n in top_lines[i.source] if n < i.line], default=0), False)]) != baseline:
            out["load order"].append(i)
        else:
            out["none"].append(i)
    return dict(out)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--edges", action="store_true", help="print every unit edge")
    parser.add_argument("--local", action="store_true", help="print every function-local import")
    parser.add_argument("--why", action="store_true", help="why each function-local import is local")
    args = parser.parse_args(argv)
    imports, local_statements = collect()
    edges = unit_edges(imports)
    if args.edges:
        for (a, b), n in sorted(edges.items()):
            print(f"{a} -> {b}  ({n})")
    if args.local:
        for imp in sorted(imports, key=lambda i: (i.source, i.line)):
            if imp.local:
                print(f"{imp.source}:{imp.line} -> {imp.target}")
    local = [i for i in imports if i.local]
    statements = {(i.source, i.line) for i in local}
    units = {unit(i.source) for i in imports} | {unit(i.target) for i in imports}
    print(f"units: {len(units)}  unit edges: {len(edges)}")
    print(f"function-local imports: {len(local_statements)} statements, "
          f"{len(statements)} of them of kiln modules ({len(local)} names)")
    for component in cycles(edges):
        print(f"cycle of {len(component)} units: {' '.join(component)}")
    if args.why:
        for why, found in sorted(why_local(imports).items()):
            print(f"{why}: {len({(i.source, i.line) for i in found})} statements")
            for i in sorted(found, key=lambda i: (i.source, i.line)):
                print(f"  {i.source}:{i.line} -> {i.target}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
