"""kiln's packages import each other as a DAG (docs/architecture.md, "Layers").

The contract is import-linter's, in pyproject.toml; these tests run it on this tree, show that
a back-edge breaks it, and check with kiln's own AST reader (tools/import_graph.py) that the
package graph has no cycle, function-local imports included, and that the contract lists no
exceptions (``ignore_imports``).
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


def _importlinter() -> dict:
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        return tomllib.load(f)["tool"]["importlinter"]


def _contract() -> dict:
    (contract,) = _importlinter()["contracts"]
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


def test_no_package_cycle():
    """Every subpackage and top-level module of kiln (and kiln's __init__) is one unit; its
    imports, top-level and inside functions, form a DAG, with no import left out."""
    contract = _contract()
    assert "ignore_imports" not in contract and "ignore_imports" not in _importlinter()
    imports, _ = import_graph.collect()
    edges = import_graph.unit_edges(imports)
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


HOOKS = r"""
import sys, torch
import kiln.api as api
from kiln import breaks, distributed, pipeline, observe
assert {"kiln.breaks", "kiln.distributed", "kiln.observe"} <= set(sys.modules)
assert api.AT_BREAK is breaks.retrace_at_break
assert api.MODEL_WRAPPERS == [(distributed.is_ddp, distributed.CompiledDDP)]
assert pipeline.SUBSCRIBERS == [pipeline._record, observe._compile_seen]

def f(x):
    y = x.sin()
    print(end="")  # a graph break: the rest resumes compiled
    return y * 2

x = torch.randn(5)
assert torch.equal(api.compile(f, backend="eager")(x), x.sin() * 2)
import kiln
assert kiln.stats()["graph_breaks"] == 1 and kiln.stats()["frames_compiled"] == 2, kiln.stats()
print("ok")
"""


def test_the_higher_layers_fill_the_lower_ones_hooks_at_import():
    """``import kiln.api`` alone, in a fresh process, runs kiln's __init__, which loads breaks,
    distributed and observe: they fill the api's hooks and subscribe to the driver, and a
    graph break resumes through them."""
    run = subprocess.run([sys.executable, "-c", HOOKS], cwd=ROOT, capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": ROOT}, timeout=300)
    assert run.returncode == 0 and run.stdout.strip().endswith("ok"), run.stdout + run.stderr


def test_every_function_local_import_of_kiln_has_a_reason():
    """A function-local import of a kiln module is there because ``import kiln`` does not load
    that module (Triton's codegen and runtime, the debug dump: start-up time), because a
    top-level import would close a cycle of modules, or because it would change the order
    ``import kiln`` loads kiln's modules in; any other moves to the top of its module."""
    imports, _ = import_graph.collect()
    free = import_graph.why_local(imports).get("none", [])
    assert free == [], "\n".join(f"{i.source}:{i.line} -> {i.target}" for i in free)
