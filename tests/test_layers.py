"""kiln's packages import each other as a DAG (docs/architecture.md, "Layers").

The contract is import-linter's, in pyproject.toml; these tests run it on this tree, show that
a back-edge breaks it, and check with kiln's own AST reader (tools/import_graph.py) that the
package graph has no cycle once the contract's listed exceptions are left out.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tomllib

import pytest

pytest.importorskip("importlinter")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tools"))
import import_graph  # noqa: E402

LINT = ("import sys; from importlinter.cli import lint_imports; "
        "sys.exit(lint_imports(config_filename='pyproject.toml', no_cache=True, no_logo=True))")


def _lint(root: str) -> subprocess.CompletedProcess:
    # lint_imports puts the working directory first on sys.path: it reads root's kiln
    env = {**os.environ, "PYTHONPATH": root}
    return subprocess.run([sys.executable, "-c", LINT], cwd=root, env=env, capture_output=True,
                          text=True, timeout=300)


def _contract() -> dict:
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        (contract,) = tomllib.load(f)["tool"]["importlinter"]["contracts"]
    return contract


def test_the_layers_contract_is_kept():
    run = _lint(ROOT)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "1 kept, 0 broken" in run.stdout


def test_a_back_edge_breaks_the_contract(tmp_path):
    """graph (bottom) importing the api (top) fails the lint, naming both."""
    shutil.copytree(os.path.join(ROOT, "kiln"), tmp_path / "kiln",
                    ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(os.path.join(ROOT, "pyproject.toml"), tmp_path / "pyproject.toml")
    with open(tmp_path / "kiln" / "graph" / "node.py", "a") as f:
        f.write("\n\ndef _back_edge():\n    from kiln import api  # noqa: F401\n")
    run = _lint(str(tmp_path))
    assert run.returncode != 0
    assert "kiln.graph is not allowed to import kiln.api" in run.stdout
    assert "kiln.graph.node -> kiln.api" in run.stdout


def _ignored(contract) -> list[tuple[re.Pattern, re.Pattern]]:
    def pattern(expr: str) -> re.Pattern:
        text = re.escape(expr).replace(r"\*\*", ".+").replace(r"\*", "[^.]+")
        return re.compile(text + "$")
    out = []
    for line in contract.get("ignore_imports", []):
        a, b = (part.strip() for part in line.split("->"))
        out.append((pattern(a), pattern(b)))
    return out


def test_no_package_cycle_outside_the_listed_exceptions():
    """Every subpackage and top-level module of kiln (and kiln's __init__) is one unit; its
    imports, top-level and inside functions, form a DAG."""
    imports, _ = import_graph.collect()
    ignored = _ignored(_contract())
    kept = [i for i in imports
            if not any(a.match(i.source) and b.match(i.target) for a, b in ignored)]
    edges = import_graph.unit_edges(kept)
    assert import_graph.cycles(edges) == []
    # nothing but the command line imports the package's __init__ (the public API on top)
    assert sorted(a for a, b in edges if b == "kiln") in ([], ["kiln.__main__"])


def test_every_module_of_kiln_has_a_layer():
    """The contract is exhaustive: a new package or top-level module must be given a layer."""
    contract = _contract()
    assert contract["exhaustive"] is True
    listed = {m.strip() for layer in contract["layers"] for m in re.split(r"[|:]", layer)}
    units = {import_graph.unit(i.source) for i in import_graph.collect()[0]}
    assert {u.split(".", 1)[1] for u in units if u != "kiln"} <= listed
