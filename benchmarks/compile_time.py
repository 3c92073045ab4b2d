"""Compile time and warm start, kiln vs torch.compile; per-call overhead of reduce-overhead.

    python -m benchmarks.compile_time                       # CUDA if available, else CPU
    python -m benchmarks.compile_time --device cpu --no-torch-compile
    python -m benchmarks.compile_time --out results/compile_time.jsonl
    python -m benchmarks.compile_time --phases inference --skip-overhead   # one part at a time
    python -m benchmarks.compile_time --phases train --skip-overhead --no-torch-compile \
        --var '' --var 'speculative_backward=1' --rounds 2      # an A/B of kiln settings

**Cold compile**: a new process with empty caches (``KILN_CACHE_DIR``, ``TRITON_CACHE_DIR``,
``TORCHINDUCTOR_CACHE_DIR`` in a fresh temporary directory) builds the model and times its
first result (synchronized): GPT-2 small (``examples/gpt.py``: batch 8, sequence 1024, bf16
autocast) on CUDA, the tiny config (batch 2) on CPU; inference (no_grad loss) and one training
step (loss + backward) separately. **Warm start**: the same program in another new process with
those caches filled; ``first_result_s`` is the time from the first call to its result,
``process_s`` the child's whole life (imports and model construction included).

**Per-call overhead**: the seed example (``relu(x + bias) * 2`` at 1024x1024 fp32), same inputs
call after call, median per call over back-to-back runs (CUDA: timed with events after a
synchronize; the GPU work is a few microseconds, so the host's cost shows): eager, kiln default,
kiln ``mode="reduce-overhead"``, torch.compile default and ``mode="reduce-overhead"``.

kiln's rows also carry ``stage_s`` (seconds per compile stage, summed over the process's
compiles: capture, meta, autograd, decomp, lowering, scheduling, codegen, build) and
``import_kiln_s``, so a cold compile shows where its time went.

``KILN_BENCH_PROFILE=PREFIX`` makes each child cProfile its first call into
``PREFIX.<backend>.<phase>.<pid>.txt`` and keeps its stderr (with ``KILN_LOGS=perf,kernels``,
each build's time) in ``PREFIX.<backend>.<phase>.stderr.txt``.

One JSON line per measurement to stdout (and ``--out``), a table to stderr.
"""
from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# ---------------------------------------------------------------------- child: one first call
def _child(backend: str, phase: str, device: str):
    t_start = time.perf_counter()
    import torch
    sys.path.insert(0, os.path.join(ROOT, "examples"))
    sys.path.insert(0, ROOT)
    from gpt import GPT, GPT2_SMALL, TINY

    cfg, batch = (GPT2_SMALL, 8) if device == "cuda" else (TINY, 2)
    torch.manual_seed(0)
    model = GPT(cfg).to(device)
    idx = torch.randint(0, cfg.vocab, (batch, cfg.seq), device=device)
    targets = torch.randint(0, cfg.vocab, (batch, cfg.seq), device=device)
    if backend == "kiln":
        t_import = time.perf_counter()
        import kiln
        import_s = time.perf_counter() - t_import
        compiled = kiln.compile(model)
    elif backend == "prime":
        compiled = model
        if device == "cuda":
            _touch_triton()
    else:
        compiled = torch.compile(model)
    amp = torch.autocast("cuda", dtype=torch.bfloat16) if device == "cuda" else _null()

    def sync():
        if device == "cuda":
            torch.cuda.synchronize()
    sync()
    profile_path = os.environ.get("KILN_BENCH_PROFILE")  # cProfile the first call into this file
    prof = None
    if profile_path:
        import cProfile
        prof = cProfile.Profile()
        prof.enable()
    t0 = time.perf_counter()
    with amp:
        if phase == "inference":
            with torch.no_grad():
                loss = compiled(idx, targets)
        else:
            loss = compiled(idx, targets)
            loss.backward()
    sync()
    first = time.perf_counter() - t0
    if prof is not None:
        prof.disable()
        _write_profile(prof, f"{profile_path}.{backend.replace('.', '_')}.{phase}.{os.getpid()}.txt")
    out = {"first_result_s": first, "process_s": time.perf_counter() - t_start, "loss": float(loss)}
    if backend == "kiln":
        import kiln
        out["stats"] = kiln.stats()
        from kiln.counters import stage_totals  # not a recorder: one would turn the graph cache off
        out["stage_s"] = {k: round(v, 3) for k, v in stage_totals().items()}
        out["import_kiln_s"] = round(import_s, 3)
    print(json.dumps(out))


def _touch_triton():
    """Compile one trivial Triton kernel (the prime child): its shared libraries and ptxas are
    then in the OS page cache for every measured child, whichever backend runs first."""
    import torch
    import triton
    import triton.language as tl

    @triton.jit
    def _copy(x, y, n, B: tl.constexpr):
        i = tl.program_id(0) * B + tl.arange(0, B)
        tl.store(y + i, tl.load(x + i, mask=i < n), mask=i < n)
    x = torch.ones(100, device="cuda")
    y = torch.empty_like(x)
    _copy[(1,)](x, y, 100, B=128)


def _write_profile(prof, path):
    import io
    import pstats
    buf = io.StringIO()
    stats = pstats.Stats(prof, stream=buf)
    stats.sort_stats("cumulative").print_stats(70)
    stats.sort_stats("tottime").print_stats(40)
    with open(path, "w") as f:
        f.write(buf.getvalue())


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False


def prime_pycache(prefix: str):
    """Compile the bytecode of every installed package (and kiln) into ``prefix``, which every
    child then reads through PYTHONPYCACHEPREFIX: the imports of a normal install, which has its
    .pyc files, where the machine's packages were installed without them (the H200 host's are,
    and there every module a child imports is compiled from source, in both backends)."""
    import sysconfig
    marker = os.path.join(prefix, ".primed")
    if os.path.exists(marker):
        return
    t0 = time.perf_counter()
    dirs = sorted({sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"], os.path.join(ROOT, "kiln")})
    subprocess.run([sys.executable, "-m", "compileall", "-q", "-j", "0", *dirs],
                   env=dict(os.environ, PYTHONPYCACHEPREFIX=prefix), capture_output=True)
    os.makedirs(prefix, exist_ok=True)
    open(marker, "w").close()
    print(f"bytecode of {', '.join(dirs)} compiled into {prefix} in {time.perf_counter() - t0:.1f} s",
          file=sys.stderr, flush=True)


def _spawn(backend, phase, device, cache, extra_env=None):
    env = dict(os.environ, **(extra_env or {}), KILN_CACHE_DIR=os.path.join(cache, "kiln"),
               TRITON_CACHE_DIR=os.path.join(cache, "triton"),
               TORCHINDUCTOR_CACHE_DIR=os.path.join(cache, "inductor"),
               PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "benchmarks.compile_time", "--child", backend, phase, device],
                          cwd=ROOT, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if os.environ.get("KILN_BENCH_PROFILE"):  # the child's logs (KILN_LOGS=perf,...) beside its profile
        with open(f"{os.environ['KILN_BENCH_PROFILE']}.{backend.replace('.', '_')}.{phase}.stderr.txt", "a") as f:
            f.write(proc.stderr)
    if proc.returncode != 0:
        return {"error": proc.stderr[-2000:]}
    res = json.loads(proc.stdout.strip().splitlines()[-1])
    res["wall_s"] = wall
    return res


def compile_rows(device, backends, phases=("inference", "train"), variants=None, rounds=1):
    """One row per (phase, backend), yielded as soon as it is measured (a run cut short by a
    time limit keeps what it finished). With ``variants`` ({label: env}), kiln runs once per
    variant with those variables set in its children, round by round, the variants interleaved
    so that a drifting host hits them alike. One unmeasured eager child runs first (with a
    trivial Triton kernel on CUDA), so that the first measured child does not alone pay for
    loading the libraries from disk."""
    with tempfile.TemporaryDirectory(prefix="kiln-bench-") as cache:
        t0 = time.perf_counter()
        primed = _spawn("prime", phases[0], device, cache)
        print(f"prime child (eager{', a Triton kernel' if device == 'cuda' else ''}): "
              f"{time.perf_counter() - t0:.1f} s{'  ERROR ' + primed['error'][-300:] if 'error' in primed else ''}",
              file=sys.stderr, flush=True)
    for r in range(rounds):
        for phase in phases:
            for backend in backends:
                for label, env in (variants or {None: {}}).items():
                    if label is not None and backend != "kiln":
                        if label != next(iter(variants)):
                            continue  # torch.compile once per round, beside the first variant
                        env = {}
                    with tempfile.TemporaryDirectory(prefix="kiln-bench-") as cache:
                        cold = _spawn(backend, phase, device, cache, env)
                        warm = _spawn(backend, phase, device, cache, env)
                    row = {"case": "compile_time", "device": device, "phase": phase, "backend": backend,
                           "pycache_prefix": os.environ.get("PYTHONPYCACHEPREFIX"), "cold": cold, "warm": warm,
                           "round": r}
                    if label is not None and backend == "kiln":
                        row.update(variant=label)
                    yield row


# ---------------------------------------------------------------------- per-call overhead
def _per_call_us(fn, args, device, calls=200, samples=15):
    import torch
    for _ in range(10):
        fn(*args)
    times = []
    for _ in range(samples):
        if device == "cuda":
            torch.cuda.synchronize()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(calls):
                fn(*args)
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) * 1e3 / calls)
        else:
            t0 = time.perf_counter()
            for _ in range(calls):
                fn(*args)
            times.append((time.perf_counter() - t0) * 1e6 / calls)
    return statistics.median(times)


def overhead_rows(device, with_torch_compile):
    import torch

    import kiln

    def transform(x, bias):
        return torch.relu(x + bias) * 2

    x = torch.randn(1024, 1024, device=device)
    b = torch.randn(1024, device=device)
    variants = [("eager", transform),
                ("kiln", kiln.compile(transform)),
                ("kiln reduce-overhead", kiln.compile(transform, mode="reduce-overhead"))]
    if with_torch_compile:
        variants += [("torch.compile", torch.compile(transform)),
                     ("torch.compile reduce-overhead", torch.compile(transform, mode="reduce-overhead"))]
    rows = []
    want = transform(x, b)
    for name, fn in variants:
        torch.testing.assert_close(fn(x, b), want)
        rows.append({"case": "per_call_overhead", "device": device, "program": "seed 1024x1024 fp32",
                     "variant": name, "us_per_call": _per_call_us(fn, (x, b), device)})
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default=None)
    ap.add_argument("--no-torch-compile", action="store_true")
    ap.add_argument("--skip-compile", action="store_true", help="only the per-call overhead")
    ap.add_argument("--skip-overhead", action="store_true", help="only the compile times")
    ap.add_argument("--phases", default="inference,train", help="compile phases to measure")
    ap.add_argument("--out", default=None)
    ap.add_argument("--pycache", default=None, metavar="DIR",
                    help="compile every package's bytecode into DIR first and run the children with "
                         "PYTHONPYCACHEPREFIX=DIR (for machines whose packages lack their .pyc files)")
    ap.add_argument("--var", action="append", default=None, metavar="'KILN_X=1 KILN_Y=0'",
                    help="an A/B variant of kiln's environment (repeat for each; the first is the "
                         "baseline, '' for none); kiln rows carry the variant's label")
    ap.add_argument("--rounds", type=int, default=1, help="rounds over the variants")
    ap.add_argument("--child", nargs=3, metavar=("BACKEND", "PHASE", "DEVICE"))
    args = ap.parse_args(argv)
    if args.child:
        return _child(*args.child)
    import torch
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    backends = ["kiln"] + ([] if args.no_torch_compile else ["torch.compile"])
    if args.pycache and not args.skip_compile:
        prime_pycache(os.path.abspath(args.pycache))
        os.environ["PYTHONPYCACHEPREFIX"] = os.path.abspath(args.pycache)  # the children inherit it
    variants = None
    if args.var:
        from benchmarks.env_ab import parse_variant
        variants = {v.strip() or "default": parse_variant(v) for v in args.var}
    rows = iter(()) if args.skip_compile else compile_rows(device, backends, tuple(args.phases.split(",")),
                                                           variants, args.rounds)
    if not args.skip_overhead:
        rows = itertools.chain(rows, _lazy(lambda: overhead_rows(device, not args.no_torch_compile)))
    out = open(args.out, "a") if args.out else None
    seen = []
    for r in rows:
        seen.append(r)
        line = json.dumps(r)
        print(line, flush=True)
        if out:
            out.write(line + "\n")
            out.flush()
        if r["case"] == "compile_time":
            c, w = r["cold"], r["warm"]
            who = r["backend"] + (f" [{r['variant']}]" if "variant" in r else "")
            print(f"{r['phase']:<9} {who:<14} cold {c.get('first_result_s', float('nan')):7.2f} s   "
                  f"warm {w.get('first_result_s', float('nan')):7.2f} s (process {w.get('process_s', float('nan')):.2f} s)"
                  + (f"   ERROR {c.get('error', w.get('error'))[-300:]}" if "error" in c or "error" in w else ""),
                  file=sys.stderr, flush=True)
            if c.get("stage_s"):  # where kiln's cold compile went, stage by stage
                print(f"{'':<9} {'':<14} cold stages (s): {c['stage_s']}", file=sys.stderr, flush=True)
        else:
            print(f"overhead  {r['variant']:<30} {r['us_per_call']:8.1f} us/call", file=sys.stderr, flush=True)
    if out:
        out.close()
    for line in ratio_lines(seen):
        print(line, file=sys.stderr, flush=True)


def ratio_lines(rows) -> list[str]:
    """kiln's cold compile and warm start over torch.compile's, per phase and kiln variant; with
    several rounds, each kiln row is set against torch.compile's row of the same round."""
    tc = {(r["phase"], r.get("round", 0)): r for r in rows
          if r["case"] == "compile_time" and r["backend"] == "torch.compile"}
    out = []
    for r in rows:
        if r["case"] != "compile_time" or r["backend"] != "kiln":
            continue  # per-call overhead rows have no phase
        other = tc.get((r["phase"], r.get("round", 0)))
        if other is None:
            continue
        k, t = r["cold"].get("first_result_s"), other["cold"].get("first_result_s")
        kw, tw = r["warm"].get("first_result_s"), other["warm"].get("first_result_s")
        if None in (k, t, kw, tw):
            continue
        label = r["phase"] + (f" [{r['variant']}]" if "variant" in r else "")
        out.append(f"ratio     {label:<40} cold {k / t:5.2f}x of torch.compile ({k:.2f} / {t:.2f} s)   "
                   f"warm {kw / tw:5.2f}x ({kw:.2f} / {tw:.2f} s)")
    return out


def _lazy(make):
    yield from make()


if __name__ == "__main__":
    main()
