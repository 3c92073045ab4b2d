"""Where one compiled call's host time goes: the seed example (``relu(x + bias) * 2``).

    python -m benchmarks.call_profile [--device cuda|cpu] [--size 1024] [--profile FILE]

Per call, in microseconds (median of samples of back-to-back calls):

- ``gpu_timed``: events around the calls (what ``benchmarks.compile_time`` reports);
- ``host``: ``perf_counter`` around the calls without a synchronize (the host's cost alone);
- for kiln, the same host time of each piece of the call path on its own: the locals builder,
  the guard function, the wrapper (``entry.call`` on fetched inputs), and the wrapper's kernel
  launches.

``--profile FILE`` also writes a cProfile of 20,000 kiln calls (sorted by own time) to FILE.
One JSON line per variant to stdout, a table to stderr.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time


def _host_us(fn, calls=2000, samples=9):
    for _ in range(50):
        fn()
    times = []
    for _ in range(samples):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        times.append((time.perf_counter() - t0) * 1e6 / calls)
    return statistics.median(times)


def _gpu_us(fn, device, calls=200, samples=15):
    import torch
    if device != "cuda":
        return None
    for _ in range(10):
        fn()
    times = []
    for _ in range(samples):
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(calls):
            fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / calls)
    return statistics.median(times)


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default=None)
    ap.add_argument("--size", type=int, default=1024)
    ap.add_argument("--profile", default=None)
    args = ap.parse_args(argv)
    import torch

    import kiln
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")

    def transform(x, bias):
        return torch.relu(x + bias) * 2

    n = args.size
    x = torch.randn(n, n, device=device)
    b = torch.randn(n, device=device)
    compiled = kiln.compile(transform)
    torch.testing.assert_close(compiled(x, b), transform(x, b))
    rows = []

    def add(variant, fn, gpu=True):
        row = {"case": "call_profile", "device": device, "size": n, "variant": variant,
               "host_us": round(_host_us(fn), 3)}
        if gpu:
            row["gpu_timed_us"] = _gpu_us(fn, device)
        if device == "cuda":
            torch.cuda.synchronize()
        rows.append(row)

    add("eager", lambda: transform(x, b))
    add("kiln", lambda: compiled(x, b))
    entry = compiled.cache.entries[0]
    L = compiled._fast_locals((x, b), {})
    G = compiled.globals
    inputs = entry.fetch(L)
    add("kiln: locals builder", lambda: compiled._fast_locals((x, b), {}), gpu=False)
    add("kiln: guard function", lambda: entry.guard_fn(L, G), gpu=False)
    add("kiln: fetch", lambda: entry.fetch(L), gpu=False)
    add("kiln: wrapper", lambda: entry.call(*inputs))
    add("torch.empty_like", lambda: torch.empty_like(x), gpu=False)
    if args.profile:
        import cProfile
        import io
        import pstats
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(20000):
            compiled(x, b)
        prof.disable()
        buf = io.StringIO()
        pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(30)
        with open(args.profile, "w") as f:
            f.write(buf.getvalue())
    for r in rows:
        print(json.dumps(r))
    print(f"{'variant':28} {'host us':>9} {'gpu-timed us':>13}", file=sys.stderr)
    for r in rows:
        g = r.get("gpu_timed_us")
        print(f"{r['variant']:28} {r['host_us']:9.2f} {'' if g is None else f'{g:13.2f}'}", file=sys.stderr)


if __name__ == "__main__":
    main()
