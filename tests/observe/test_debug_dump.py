"""KILN_DEBUG dumps: every graph file (captured, forward, backward, prims) runs on its own as a
subprocess, on random inputs of the recorded shapes."""
import glob
import os
import subprocess
import sys

import torch

import kiln


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
    for f in files:
        proc = subprocess.run([sys.executable, f], capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, f"{f}:\n{proc.stderr}"
        assert "torch.Size" in proc.stdout
