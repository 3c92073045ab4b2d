"""kiln.observe.profile: kernel times are device times on CUDA (the profiler's CUDA activity
matched to kiln's launch ranges, or CUDA events with the GPU kept busy before each launch), host
times for C++ kernels; explain's summary per compile for a function with a graph break."""
import json
import os
import types

import pytest
import torch

import kiln
from kiln.observe import profile as prof_mod


def _ev(name, start, end, device=False):
    dt = torch.autograd.DeviceType.CUDA if device else torch.autograd.DeviceType.CPU
    return types.SimpleNamespace(name=name, device_type=dt,
                                 time_range=types.SimpleNamespace(start=start, end=end))


def test_kernels_sharing_a_binary_match_its_device_events_in_launch_order():
    events = [
        _ev("kiln kernel 000_f/kiln_kernel0", 0, 10),
        _ev("kiln kernel 000_f/kiln_kernel3", 20, 30),      # runs kiln_kernel0's binary
        _ev("kiln_kernel0", 8, 12, device=True),
        _ev("kiln_kernel0", 31, 36, device=True),
    ]
    m = prof_mod.match_device_kernels(events, {("000_f", "kiln_kernel3"): "kiln_kernel0"})
    assert m[("000_f", "kiln_kernel0")] == [(8, 4)] and m[("000_f", "kiln_kernel3")] == [(31, 5)]


def test_device_kernels_matched_to_launches_by_name_and_order():
    events = [
        _ev("kiln kernel 000_f/kiln_kernel0", 0, 30),       # host range of launch 1 (long: launch latency)
        _ev("kiln kernel 001_g/kiln_kernel0", 40, 70),      # same kernel name, another compile
        _ev("kiln kernel 000_f/kiln_kernel1", 80, 110),
        _ev("spin_kernel", 0, 200, device=True),            # the instrumented run's padding
        _ev("kiln_kernel0", 25, 29, device=True),           # device work of launch 1: 4 us
        _ev("kiln_kernel0", 65, 71, device=True),           # launch 2: 6 us
        _ev("kiln_kernel1", 200, 203, device=True),         # launch 3 ran late: 3 us
        _ev("other_kernel", 5, 9, device=True),
    ]
    m = prof_mod.match_device_kernels(events)
    assert m[("000_f", "kiln_kernel0")] == [(25, 4)]
    assert m[("001_g", "kiln_kernel0")] == [(65, 6)]
    assert m[("000_f", "kiln_kernel1")] == [(200, 3)]
    # device times win over host times when every launch was matched
    obs = prof_mod.Observer()
    obs.on_cuda = True
    obs.times[("000_f", "kiln_kernel0")] = [30e-6]
    rows = {(r["folder"], r["kernel"]): r for r in prof_mod.kernel_times(obs, m, {("000_f", "kiln_kernel0"): 1})}
    r = rows[("000_f", "kiln_kernel0")]
    assert r["median_us"] == pytest.approx(4) and r["source"].startswith("device (profiler")
    # a launch the profiler missed: the CUDA-event times of the instrumented run are used
    rows = {(r["folder"], r["kernel"]): r for r in prof_mod.kernel_times(obs, m, {("000_f", "kiln_kernel0"): 2})}
    r = rows[("000_f", "kiln_kernel0")]
    assert r["median_us"] == pytest.approx(30) and r["source"].startswith("device (CUDA events")


def _two_graphs(x):
    y = torch.relu(x) * 2
    print("mean", y.mean())
    return torch.sigmoid(y).sum(dim=1)


def test_profile_on_cpu_times_cpp_kernels_on_the_host(tmp_path):
    with kiln.config.patch(debug_dir=str(tmp_path)):
        run = prof_mod.profile(kiln.compile(_two_graphs), torch.randn(16, 32), runs=2)
    data = json.load(open(os.path.join(run, "profile.json")))
    assert data["device"] == ("cuda" if torch.cuda.is_available() else "cpu")
    assert len({k["folder"] for k in data["kernels"]}) == 2  # both graphs of the one function
    for k in data["kernels"]:
        assert k["calls"] == 2 and k["min_us"] > 0 and k["source"]
    assert any(e["lane"] == "kernel" for e in data["timeline"])


def test_triton_kernels_report_bytes_moved_and_bandwidth(tmp_path):
    """Triton kernels take tensors, so each row carries the bytes of its tensor arguments and
    the bandwidth that implies (C++ kernels take raw pointers: no bytes)."""
    if not torch.cuda.is_available():
        from testing import INTERPRET
        if not INTERPRET:
            pytest.skip("needs CUDA or the Triton interpreter")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    with kiln.config.patch(debug_dir=str(tmp_path), cpu_backend="triton"):
        run = prof_mod.profile(kiln.compile(_two_graphs), torch.randn(16, 32, device=device), runs=2)
    data = json.load(open(os.path.join(run, "profile.json")))
    assert data["kernels"]
    for k in data["kernels"]:
        # every kernel reads x or y (16x32 fp32) and writes a result of at least 16 floats
        assert k["bytes"] >= 16 * 32 * 4 + 16 * 4 and k["gb_per_s"] > 0, k
        assert k["gb_per_s"] == pytest.approx(k["bytes"] / k["median_us"] / 1e3)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA: device timing of Triton kernels")
def test_cuda_kernel_times_are_device_times(tmp_path):
    x = torch.randn(2048, 2048, device="cuda")
    with kiln.config.patch(debug_dir=str(tmp_path)):
        run = prof_mod.profile(kiln.compile(_two_graphs), x, runs=3)
    data = json.load(open(os.path.join(run, "profile.json")))
    host = {}
    for e in data["timeline"]:
        if e["lane"] == "kernel":
            host.setdefault(e["name"].split(" ", 2)[2], []).append(e["dur_us"])
    assert data["kernels"]
    for k in data["kernels"]:
        assert k["source"].startswith("device"), k
        assert k["calls"] == 3 and 0 < k["min_us"]
        # a 2048x2048 pointwise kernel moves 32 MB: tens of microseconds on the device, never
        # more than the host range around its launch
        assert k["median_us"] <= max(host[f"{k['folder']}/{k['kernel']}"]) + 1
    assert any(e["name"].startswith("kiln device ") for e in data["timeline"])


def test_explain_summarizes_each_graph_of_a_function_with_a_break():
    def f(x):
        y = torch.relu(x) * 2
        print("mean", y.mean())
        return torch.sigmoid(y).sum(dim=1)

    e = kiln.explain(f, dynamic=True)(torch.randn(8, 16))
    assert e.graph_count == 2 and e.graph_break_count == 1 and len(e.compiles) == 2
    assert len(e.kernels_per_graph) == 2 and all(len(k) >= 1 for k in e.kernels_per_graph)
    text = str(e)
    assert "Graphs: 2   Graph breaks: 1" in text
    assert "call to print is not supported" in text and 'print("mean", y.mean())' in text
    assert "<resume at" in text  # the resume function's own section
    assert text.count("kernel kiln_kernel0") == 2 and "test_profile.py:" in text
    assert ">= 2" in text  # a shape guard of the symbolic sizes
    assert "compile time" in text and "capture" in text


def _branchy(x):
    y = x * 2
    if y.sum() > 0:  # a tensor in an if: the host waits for the device here
        y = y + 1
    return y.relu()


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs CUDA"))])
def test_data_dependent_if_is_listed_as_a_host_sync_with_its_break(device, tmp_path):
    from kiln.observe import report
    line = _branchy.__code__.co_firstlineno + 2
    with kiln.config.patch(debug_dir=str(tmp_path)):
        run = prof_mod.profile(kiln.compile(_branchy), torch.randn(8, 8, device=device), runs=2)
    rows = {(os.path.basename(r["filename"]), r["lineno"]): r for r in report.host_syncs(report.load_run(run))}
    row = rows[("test_profile.py", line)]
    assert "condition" in row["what"] and row["count"] == 2
    [(c, b)] = row["breaks"]
    assert "data-dependent branch" in b["reason"] and c["name"] == "_branchy"
    page = report.render(run)
    assert f"test_profile.py:{line}" in page and "if y.sum() &gt; 0:" in page
