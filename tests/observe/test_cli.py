"""The command line: `python -m kiln demo` prints every stage and matches eager bitwise;
`python -m kiln explain script.py` runs a script and summarizes its compiles."""
import os
import subprocess
import sys
from tests.testing import config_env

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _run(*args):
    env = config_env(cpu_backend="cpp")
    proc = subprocess.run([sys.executable, "-m", "kiln", *args], capture_output=True, text=True,
                          env=env, cwd=ROOT, timeout=300)
    return proc


def test_demo_prints_every_stage_in_order():
    proc = _run("demo", "--size", "64", "--no-torch-compile")
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    sections = ["Python bytecode", "Captured graph", "Guards", "Prims graph", "Loop IR",
                "Schedule", "Fused kernel", "Wrapper", "bitwise equal to eager: True",
                "graphs: 1, graph breaks: 0, kernels: 1", "Steady-state time"]
    positions = [out.find(s) for s in sections]
    assert all(p >= 0 for p in positions), [s for s, p in zip(sections, positions) if p < 0]
    assert positions == sorted(positions)


def test_explain_script_reports_graphs_and_breaks():
    proc = _run("explain", os.path.join("examples", "seed.py"))
    assert proc.returncode == 0, proc.stderr
    # transform, and with_a_break's two graphs: before the print and its resume function after it
    assert "Graphs: 3   Graph breaks: 1   Kernels: 3" in proc.stderr
    assert "seed.py:21" in proc.stderr and "print" in proc.stderr
    assert "with_a_break.<resume at" in proc.stderr and proc.stderr.count("kernel kiln_kernel0") == 3


def test_help_and_unknown_command():
    assert _run("--help").returncode == 0
    assert _run("no-such-command").returncode == 2
