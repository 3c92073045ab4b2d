"""python -m kiln report: the page of a two-graph program with a graph break in the middle,
rendered in a real headless browser (Debian's chromium)."""
from __future__ import annotations

import html
import json
import os
import re
import shutil
import subprocess
import sys
import textwrap

import pytest

from kiln.observe import report
from tests.testing import config_env

PROGRAM = textwrap.dedent("""\
    import torch
    import kiln


    @kiln.compile
    def step(x, w):
        y = torch.relu(x) * 2 + w
        print("total is", y.sum())
        return torch.sigmoid(y).sum(dim=1)


    def program(x, w):
        z = step(x, w)           # two graphs: before the print (a graph break) and after it
        if z.mean() > 0:         # host sync outside compiled code
            z = z + 1
        return z


    if __name__ == "__main__":
        x, w = torch.randn(64, 256), torch.randn(256)
        for _ in range(3):
            program(x, w)
        step(x.double(), w)  # a recompile of both graphs: the dtype guard fails
""")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _chromium():
    return shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.fixture(scope="module")
def profiled_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("report")
    script = tmp / "two_graphs.py"
    script.write_text(PROGRAM)
    out = tmp / "report.html"
    env = config_env(dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")])),
                     debug_dir=str(tmp / "kiln_debug"))
    proc = subprocess.run([sys.executable, "-m", "kiln", "report", "-o", str(out), "--profile", str(script)],
                          cwd=tmp, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return tmp, script, out


def test_dump_records_breaks_and_recompiles(profiled_run):
    tmp, script, _ = profiled_run
    run = report.find_run(str(tmp / "kiln_debug"))
    metrics = [json.load(open(os.path.join(run, d, "metrics.json"))) for d in sorted(os.listdir(run))
               if os.path.isdir(os.path.join(run, d))]
    breaks = [b for m in metrics for b in m["graph_breaks"]]
    assert len(breaks) == 2 and all("print" in b["reason"] for b in breaks)  # first call, recompile
    assert {b["lineno"] for b in breaks} == {8}
    assert breaks[0]["source_line"].strip() == 'print("total is", y.sum())'
    assert [m["kind"] for m in metrics].count("resume") == 2
    recompiles = [e["reason"] for m in metrics for e in m["events"] if e["kind"] == "recompile"]
    assert len(recompiles) == 2 and all("dtype changed" in r for r in recompiles), recompiles
    prof = json.load(open(os.path.join(run, "profile.json")))
    folders = {k["folder"] for k in prof["kernels"]}
    assert any(f.endswith("_step") for f in folders) and any("_step_resume_at_" in f for f in folders)
    assert all(k["calls"] >= 1 and k["min_us"] > 0 and k["source"] for k in prof["kernels"])
    lines = {(os.path.basename(s["filename"]), s["lineno"]) for s in prof["syncs"]}
    assert ("two_graphs.py", 8) in lines and ("two_graphs.py", 14) in lines
    # the sync list joins the real breaks with what the profiler run observed
    rows = report.host_syncs(report.load_run(run))
    by_line = {r["lineno"]: r for r in rows}
    assert len(by_line[8]["breaks"]) == 2 and by_line[8]["count"] >= 3
    assert by_line[14]["breaks"] == [] and by_line[14]["count"] == 3


def test_report_writes_a_perfetto_trace(profiled_run):
    tmp, _, page = profiled_run
    with open(tmp / "trace.json") as f:  # beside report.html
        trace = json.load(f)
    events = trace["traceEvents"]
    spans = [e for e in events if e["ph"] == "X"]
    assert spans and all({"name", "ph", "ts", "dur", "pid", "tid"} <= set(e) for e in spans)
    assert all(isinstance(e["ts"], float) and e["dur"] >= 0 for e in spans)
    lanes = {e["args"]["name"]: e["tid"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    assert {"call", "graph", "kernel"} <= set(lanes), lanes
    # every compiled call is a region on the call lane (runtime/profiler_regions.py), and each
    # kernel launch carries its measured figures
    calls = [e for e in spans if e["tid"] == lanes["call"]]
    assert any(re.fullmatch(r"kiln: step \[\d+\]", e["name"]) for e in calls), calls
    assert any(e["name"].startswith("kiln: step.<resume at") for e in calls)
    kernels = [e for e in spans if e["tid"] == lanes["kernel"]]
    assert kernels and all(e["args"]["median_us"] > 0 and e["args"]["calls"] >= 1 for e in kernels)
    # the kernel ranges nest inside the call regions, as in torch.profiler's own trace
    assert all(any(c["ts"] <= k["ts"] and k["ts"] + k["dur"] <= c["ts"] + c["dur"] + 1 for c in calls)
               for k in kernels)


def test_report_model():
    loop_ir = "arg0 = Input(float32[64, 128], stride=[128, 1])\nbuf1 = Pointwise(float16[64], stride=[1])\n"
    sizes = report.buffer_bytes(loop_ir)
    assert sizes == {"arg0": 64 * 128 * 4, "buf1": 64 * 2}
    wrapper = "def call(arg0):\n    k0(arg0.data_ptr(), arg0.data_ptr(), buf1.data_ptr())\n"
    assert report.kernel_bytes("k0", wrapper, sizes) == 64 * 128 * 4 + 64 * 2
    [o] = report.parse_origins("// from: mul = core.mul(relu, 2)  [/a/f.py:18: return y * 2]\nint x;")
    assert o == {"node": "mul = core.mul(relu, 2)", "filename": "/a/f.py", "lineno": 18,
                 "source": "return y * 2"}
    assert report.sync_kind("Tensor.item is not supported by the capture table")
    assert report.sync_kind("Tensor.item is not supported (a data-dependent shape)") == "Tensor.item()"
    assert "condition" in report.sync_kind("data-dependent branch: the truth value of a tensor depends on its data")
    assert report.sync_kind("opcode FOO is not supported") is None


def test_report_in_headless_chromium(profiled_run, tmp_path):
    browser = _chromium()
    if browser is None:
        pytest.skip("chromium is not installed (apt-get install -y chromium); .ci/run installs it")
    _, _, page = profiled_run
    text = page.read_text()
    assert "http://" not in text and "https://" not in text  # self-contained
    flags = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             f"--user-data-dir={tmp_path / 'profile'}", "--window-size=1280,2000"]
    shot_dir = os.environ.get("TMPDIR", str(tmp_path))
    shot = os.path.join(shot_dir, "kiln_report.png")
    subprocess.run(flags + [f"--screenshot={shot}", page.as_uri()], capture_output=True, timeout=120)
    assert os.path.exists(shot) and os.path.getsize(shot) > 10_000
    dom = subprocess.run(flags + ["--dump-dom", page.as_uri()], capture_output=True, text=True,
                         timeout=120).stdout
    assert "<table class=\"synclist\">" in dom  # the browser parsed and rendered the page
    words = html.unescape(re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", dom)))  # the text shown
    # the breaks, with their reason, line and source text, and where the function resumed
    assert "graph break" in dom and "call to print is not supported" in dom
    assert "two_graphs.py:8" in dom and 'print("total is", y.sum())' in dom
    assert "the rest resumed in compile" in words
    assert "step.<resume at" in words
    # the recompiles with the guard that failed, in plain words
    assert "recompile of step" in words and "x.dtype changed: was torch.float32, now torch.float64" in words
    # both graphs' kernels, their source and the Python lines they came from
    kernels = re.findall(r'id="k-(\d+_step[a-z_0-9]*)-kiln_kernel0"', dom)
    assert any(k.endswith("_step") for k in kernels) and any("_resume_at_" in k for k in kernels), kernels
    assert "y = torch.relu(x) * 2 + w" in dom and "return torch.sigmoid(y).sum(dim=1)" in dom
    assert "extern \"C\"" in dom or "@triton.jit" in dom
    # measured time and bandwidth, the timeline and the host syncs (print and the eager if)
    assert "GB/s" in dom and "class=\"lane\"" in dom
    assert "two_graphs.py:14" in words and "if z.mean() > 0:" in words
    keep = os.environ.get("KILN_REPORT_SCREENSHOT")  # e.g. docs/report_example.png
    if keep:
        shutil.copy(shot, keep)
