"""``python -m kiln demo``: the seed's example, from Python to one fused kernel, stage by stage."""
from __future__ import annotations

import argparse
import dis
import io
import statistics
import threading
import time

import torch

from kiln import api
from kiln.observe.explain import explain as kiln_explain


def transform(x, bias):
    y = x + bias
    y = torch.relu(y)
    return y * 2


def _section(title, body):
    print(f"\n{'=' * 78}\n{title}\n{'=' * 78}")
    print(str(body).rstrip())


def _quiesce():
    """On a fresh cache kiln builds its precompiled C++ header in a background thread after the
    first compile (runtime/cpp_pch.py). Timed beside that gcc, on a 2-core machine, eager and
    kiln both ran 3-20x slower from one run to the next: wait for it first."""
    for t in threading.enumerate():
        if t.name == "kiln-cpp-pch":
            t.join(timeout=120)


def _time(fn, args, device, iters, rounds=5):
    """Median over ``rounds`` of the mean time of ``iters`` calls (one round swings with the
    host's load)."""
    for _ in range(3):
        fn(*args)
    samples = []
    for _ in range(rounds):
        if device.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(iters):
            fn(*args)
        if device.type == "cuda":
            torch.cuda.synchronize()
        samples.append((time.perf_counter() - t0) / iters)
    return statistics.median(samples)


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m kiln demo")
    p.add_argument("--size", type=int, default=None, help="square input size (default 4096 on GPU, 1024 on CPU)")
    p.add_argument("--no-torch-compile", action="store_true", help="skip timing torch.compile")
    args = p.parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    n = args.size or (4096 if device.type == "cuda" else 1024)
    x = torch.randn(n, n, device=device)
    bias = torch.randn(n, device=device)

    print(f"kiln demo on {torch.cuda.get_device_name() if device.type == 'cuda' else 'CPU'}: "
          f"transform(x, bias) = relu(x + bias) * 2 with x {tuple(x.shape)} float32")
    buf = io.StringIO()
    dis.dis(transform, file=buf)
    _section("0. Python bytecode (what capture interprets)", buf.getvalue())

    api.reset()
    compiled = api.compile(transform)
    recorder: list = []
    api._RECORDERS.append(recorder)
    try:
        out = compiled(x, bias)
    finally:
        api._RECORDERS.remove(recorder)
    ctx = recorder[-1]
    art = {name: ir for _, name, ir in ctx.artifacts}
    _section("1. Captured graph (core ops; runnable Python)", art["captured_graph"].python())
    _section("2. Guards (one generated function per cache entry)", art["guards"])
    _section("3. Prims graph (after decomposition)", art["cse"].python())
    _section("4. Loop IR (after lowering)", art["lower"])
    _section("5. Schedule (after fusion)", art["schedule"])
    for k in ctx.kernels:
        _section(f"6. Fused kernel {k.name} ({'C++' if 'extern' in k.source else 'Triton'})", k.source)
    _section("7. Wrapper (allocates, launches, returns)", art["generate_wrapper"])

    expected = transform(x, bias)
    same = torch.equal(out, expected)
    explain = kiln_explain(transform)(x, bias)
    times = {stage: f"{t * 1e3:.1f} ms" for stage, t in ctx.stage_times.items()}
    _section("8. Result", f"bitwise equal to eager: {same}\n"
             f"graphs: {explain.graph_count}, graph breaks: {explain.graph_break_count}, "
             f"kernels: {explain.kernel_count}\ncompile time per stage: {times}")

    iters = 50 if device.type == "cuda" else 20
    _quiesce()
    rows = [("eager", _time(transform, (x, bias), device, iters)),
            ("kiln", _time(compiled, (x, bias), device, iters))]
    if not args.no_torch_compile and hasattr(torch, "compile"):
        try:
            tc = torch.compile(transform)
            t0 = time.perf_counter()
            tc(x, bias)
            cold = time.perf_counter() - t0
            rows.append((f"torch.compile (cold compile {cold:.1f} s)", _time(tc, (x, bias), device, iters)))
        except Exception as e:  # noqa: BLE001 - the peer may not work on this machine
            rows.append((f"torch.compile unavailable: {type(e).__name__}", float("nan")))
    eager_t = rows[0][1]
    lines = [f"{name:<40} {t * 1e6:10.1f} us/call   {eager_t / t:5.2f}x eager" for name, t in rows]
    _section("9. Steady-state time (same process, same inputs)", "\n".join(lines))
    return 0 if same else 1
