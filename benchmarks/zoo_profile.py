"""Where a zoo model's device time goes, kernel by kernel: torch.compile against kiln.

    python -m benchmarks.zoo_profile --models tv_convnext_tiny,gpt2 [--mode inference] [--top 15]

For each model (built as ``benchmarks.zoo`` builds it: bf16 inference or autocast training on
CUDA, fp32 on the CPU), each compiler's step is warmed up, then ``torch.profiler`` records
``--calls`` calls. Printed per compiler: device time per call, the number of kernel launches per
call, and the ``--top`` kernels by device time (total per call, launches per call, name). The
device time of a kernel is its CUDA time on a GPU, its CPU self time on the CPU. One JSON line
per model and compiler goes to ``--out`` when given. This is the profile issue 26 asks for:
read the two tables side by side and find the kernels kiln spends more on.

Each compiler's host time per call (calls launched back to back, no synchronize) and wall time
per call are printed beside its device time: a model whose host time exceeds its device time is
launch-bound, and ``--cprofile FILE`` then shows where the host time goes.
"""
from __future__ import annotations

import argparse
import collections
import cProfile
import json
import pstats
import statistics
import sys
import time

import torch

from benchmarks import zoo, zoo_models


def _annotation(ev) -> bool:
    # record_function regions (kiln's "kiln: <fn>" and "kiln kernel: <k>", torch.compile's own)
    # show on the GPU timeline as user annotations; they span kernels, they are not kernels
    return bool(getattr(ev, "is_user_annotation", False)) or ev.name.startswith(("kiln:", "kiln kernel:"))


def _host_ms(step, inputs, device, calls=20, samples=7) -> tuple[float, float]:
    """(host ms per call, without a synchronize: what launching costs the CPU; wall ms per call,
    synchronized). When host > device time the model is launch-bound and host overhead is the
    gap to close, not kernels."""
    host, wall = [], []
    for _ in range(samples):
        zoo._sync(device)
        t0 = time.perf_counter()
        for _ in range(calls):
            step(*inputs)
        t1 = time.perf_counter()
        zoo._sync(device)
        t2 = time.perf_counter()
        host.append((t1 - t0) * 1e3 / calls)
        wall.append((t2 - t0) * 1e3 / calls)
    return statistics.median(host), statistics.median(wall)


def _cprofile(step, inputs, device, label, name, path, calls=30) -> None:
    prof = cProfile.Profile()
    zoo._sync(device)
    prof.enable()
    for _ in range(calls):
        step(*inputs)
    prof.disable()
    zoo._sync(device)
    with open(path, "a") as f:
        f.write(f"\n== {name} {label}: cProfile of {calls} calls, by own time\n")
        pstats.Stats(prof, stream=f).sort_stats("tottime").print_stats(35)


def _kernel_table(prof, calls, device) -> tuple[float, float, list]:
    """(device ms per call, launches per call, [(ms per call, launches per call, name)])."""
    per = collections.defaultdict(lambda: [0.0, 0])
    for ev in prof.events():
        if device == "cuda":
            if ev.device_type != torch.autograd.DeviceType.CUDA or _annotation(ev):
                continue
            t = ev.device_time_total if hasattr(ev, "device_time_total") else ev.cuda_time_total
        else:
            if ev.cpu_children:  # leaf CPU ops only: their self time is the work
                continue
            t = ev.self_cpu_time_total
        per[ev.name][0] += t
        per[ev.name][1] += 1
    rows = sorted(((t / 1e3 / calls, n / calls, name) for name, (t, n) in per.items()), reverse=True)
    return sum(r[0] for r in rows), sum(r[1] for r in rows), rows


def profile_model(name, mode, device, calls, top, warm_calls=10, cprofile=None) -> list[dict]:
    case = zoo.Case(name, mode, device, "full" if device == "cuda" else "small", False)
    steps = {}
    rec: dict = {}
    steps["torch.compile"], _ = zoo._compile_torch(case, case.base, rec)
    steps["kiln"], _ = zoo._compile_kiln(case, case.base, rec)
    out = []
    acts = [torch.profiler.ProfilerActivity.CPU]
    if device == "cuda":
        acts.append(torch.profiler.ProfilerActivity.CUDA)
    for label, step in steps.items():
        inputs = case.inputs[0]
        for _ in range(warm_calls):
            step(*inputs)
        zoo._sync(device)
        with torch.profiler.profile(activities=acts) as prof:
            for _ in range(calls):
                step(*inputs)
            zoo._sync(device)
        ms, launches, rows = _kernel_table(prof, calls, device)
        host, wall = _host_ms(step, inputs, device)
        if cprofile:
            _cprofile(step, inputs, device, label, name, cprofile)
        print(f"\n== {name} {mode} {label}: {ms:.3f} ms device time per call, "
              f"{launches:.0f} kernels per call; host {host:.3f} ms, wall {wall:.3f} ms per call",
              file=sys.stderr)
        for t, n, kname in rows[:top]:
            print(f"  {t:8.3f} ms  x{n:5.1f}  {kname[:140]}", file=sys.stderr)
        out.append({"model": name, "mode": mode, "compiler": label, "device_ms": round(ms, 4),
                    "kernels_per_call": launches,
                    "host_ms": round(host, 4), "wall_ms": round(wall, 4),
                    "top": [[round(t, 4), n, k[:200]] for t, n, k in rows[:top]]})
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.zoo_profile", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", required=True, help="comma list of zoo models or groups")
    p.add_argument("--mode", choices=("inference", "training"), default="inference")
    p.add_argument("--device", choices=("cuda", "cpu"),
                   default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--calls", type=int, default=5)
    p.add_argument("--top", type=int, default=15)
    p.add_argument("--out")
    p.add_argument("--cprofile", help="append a cProfile of each compiler's calls to this file")
    a = p.parse_args(argv)
    lines = []
    for name in zoo_models.resolve(a.models):
        try:
            lines += profile_model(name, a.mode, a.device, a.calls, a.top, cprofile=a.cprofile)
        except Exception as e:  # noqa: BLE001 - one model failing must not stop the rest
            print(f"{name}: {type(e).__name__}: {e}", file=sys.stderr)
    if a.out:
        with open(a.out, "w") as f:
            for line in lines:
                f.write(json.dumps(line) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
