"""KILN_DEBUG dumps: every graph file (captured, forward, backward, prims) runs on its own as a
subprocess, on random inputs of the recorded shapes."""
import glob
import os
import subprocess
import sys

import torch

import kiln

# Runs each file as __main__ in a fresh namespace, in one child process (not kiln's own: the
# files import what they need themselves), and says which ones failed.
RUNNER = """
import runpy, sys, traceback
failed = []
for path in sys.argv[1:]:
    try:
        runpy.run_path(path, run_name="__main__")
    except BaseException:
        failed.append(path + "\\n" + traceback.format_exc())
print("FAILED:\\n" + "\\n".join(failed) if failed else "ALL RAN")
"""


def run_each(files):
    """Every graph file runs on its own: the first in a subprocess of its own (``python FILE``,
    from another folder), then all of them, one fresh namespace each, in one more."""
    proc = subprocess.run([sys.executable, files[0]], capture_output=True, text=True, timeout=120,
                          cwd=os.path.dirname(files[0]))
    assert proc.returncode == 0 and "torch.Size" in proc.stdout, f"{files[0]}:\n{proc.stderr}"
    proc = subprocess.run([sys.executable, "-c", RUNNER, *files], capture_output=True, text=True,
                          timeout=600, cwd=os.path.dirname(files[0]))
    assert proc.returncode == 0 and "ALL RAN" in proc.stdout, proc.stdout[-4000:] + proc.stderr[-4000:]
    assert proc.stdout.count("torch.Size") >= len(files)


def test_every_graph_file_runs_as_a_subprocess(tmp_path):
    import kiln.observe.debug as debug
    debug._run_dir = None
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.LayerNorm(16))

    def infer(x):
        return torch.softmax(x, -1).cumsum(-1) * 2  # cumsum: a fallback node

    with kiln.config.patch(debug=True, debug_dir=str(tmp_path)):
        kiln.compile(model)(torch.randn(4, 8)).sum().backward()
        with torch.no_grad():
            kiln.compile(infer)(torch.randn(3, 5))
    debug._run_dir = None
    files = sorted(glob.glob(str(tmp_path / "*" / "*" / "0*graph*.py")))
    names = {os.path.basename(f) for f in files}
    assert {"02_captured_graph.py", "02a_forward_graph.py", "02b_backward_graph.py",
            "03_prims_graph.py"} <= names, names
    run_each(files)


def step(x, w):
    y = torch.relu(x @ w) * 2
    print("norm", y.norm())  # a graph break: the rest is a resume function
    n = y.shape[0]
    return (y.sigmoid() + 1).reshape(n // 2, -1).sum(dim=1)


def test_break_backward_and_symbolic_dumps_run_as_subprocesses(tmp_path):
    """A function with a graph break, trained (backward graphs compiled at backward()), called at
    a second size (a recompile with a symbolic size): one folder per compile, the resume
    function's and the backwards' included, and every graph file in them runs."""
    import json

    import kiln.observe.debug as debug
    debug._run_dir = None
    w = torch.randn(8, 4, requires_grad=True)
    f = kiln.compile(step)
    with kiln.config.patch(debug=True, debug_dir=str(tmp_path)):
        for n in (4, 6):
            f(torch.randn(n, 8), w).sum().backward()
    debug._run_dir = None
    (run,) = glob.glob(str(tmp_path / "run_*"))
    metrics = {os.path.basename(d): json.load(open(os.path.join(d, "metrics.json")))
               for d in sorted(glob.glob(os.path.join(run, "*")))}
    kinds = [(m["kind"], m["name"]) for m in metrics.values()]
    assert [k for k, _ in kinds].count("resume") == 2, kinds
    assert [k for k, _ in kinds].count("backward") == 4, kinds  # both graphs, both sizes
    assert all(" " not in d for d in metrics)  # folder names are plain identifiers
    ids = {m["compile_id"] for m in metrics.values()}
    for m in metrics.values():
        if m["kind"] == "backward":
            assert m["backward_of"] in ids
            # the backward's kernels point at the forward lines they differentiate
            assert any("test_debug_dump.py:" in o for k in m["kernels"] for o in k["origins"]), m["kernels"]
    breaks = [b for m in metrics.values() for b in m["graph_breaks"]]
    assert breaks and all("print" in b["reason"] for b in breaks)
    resumed = [e for m in metrics.values() for e in m["events"] if e["kind"] == "graph_break"]
    assert resumed and all(e["resume"] and not e["eager_rest"] for e in resumed)
    symbolic = [d for d in metrics if "01a_shape_env.txt" in metrics[d]["files"]]
    assert symbolic, "the recompile at a new size has symbolic sizes"
    files = sorted(glob.glob(os.path.join(run, "*", "0*graph*.py")))
    assert len(files) >= 2 * 4 + 4 * 2
    run_each(files)
    text = open(glob.glob(os.path.join(run, symbolic[0], "02_captured_graph.py"))[0]).read()
    assert "s0 = 6" in text  # the symbol at its traced value
