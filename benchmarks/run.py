"""Run eager, torch.compile and kiln side by side in one process; one JSON line per case.

    python -m benchmarks.run [--device cuda|cpu] [--quick] [--cases seed,linear,...]
                             [--out FILE.jsonl] [--no-torch-compile] [--mode reduce-overhead]

JSON lines go to stdout (and --out); a short table goes to stderr. README.md lists the fields.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
import warnings

import torch

import kiln
from benchmarks import timing
from benchmarks.cases import CASES, Setup

IMPLS = ("eager", "torch_compile", "kiln")
MODE = None  # --mode: passed to torch.compile and kiln.compile alike (e.g. "reduce-overhead")


# ----------------------------------------------------------------------------- environment
def device_name(device: str) -> str:
    if device == "cuda":
        return torch.cuda.get_device_name()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    name = line.split(":", 1)[1].strip()
                    break
            else:
                name = platform.processor() or platform.machine()
    except OSError:
        name = platform.processor() or platform.machine()
    return name


def environment(device: str) -> dict:
    try:
        import triton
        triton_version = triton.__version__
    except Exception:  # noqa: BLE001 - absent or broken: either way not usable
        triton_version = None
    kiln_version = kiln.__version__  # the kiln imported, not whichever one pip installed
    # KILN_COMMIT names the commit of a copied tree (git would answer for the tree around it)
    try:
        commit = os.environ.get("KILN_COMMIT") or subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                                text=True, timeout=5,
                                cwd=os.path.dirname(os.path.abspath(kiln.__file__))).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        commit = ""
    return {"device": device_name(device), "device_type": device,
            "torch_version": torch.__version__, "triton_version": triton_version,
            "python_version": platform.python_version(), "kiln_version": kiln_version,
            "kiln_commit": commit or None,
            # Other processes on a small CPU host skew CPU timings; say how busy it was.
            "cpu_count": os.cpu_count(), "threads": torch.get_num_threads(), "loadavg_1m": round(os.getloadavg()[0], 2)}


# ----------------------------------------------------------------------------- helpers
def _tensors(x) -> list[torch.Tensor]:
    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, (list, tuple)):
        return [t for item in x for t in _tensors(item)]
    if isinstance(x, dict):
        return [t for item in x.values() for t in _tensors(item)]
    return []


def _nbytes(ts) -> int:
    return sum(t.numel() * t.element_size() for t in ts)


def _error(e: BaseException) -> str:
    msg = f"{type(e).__name__}: {e}"
    return msg if len(msg) <= 1000 else msg[:1000] + " ..."


def check(out, ref, setup: Setup) -> tuple[bool, str | None, float | None]:
    """kiln (or torch.compile) output against eager: (correct, message, max abs error)."""
    outs, refs = _tensors(out), _tensors(ref)
    if len(outs) != len(refs):
        return False, f"{len(outs)} output tensors, eager gives {len(refs)}", None
    max_err = 0.0
    try:
        for o, r in zip(outs, refs):
            if o.shape == r.shape and o.numel():
                max_err = max(max_err, (o.double() - r.double()).abs().max().item())
            tol = {} if setup.rtol is None else {"rtol": setup.rtol, "atol": setup.atol}
            torch.testing.assert_close(o, r, **tol)
    except AssertionError as e:
        return False, str(e).strip().splitlines()[0][:500], max_err
    return True, None, max_err


@contextlib.contextmanager
def environ(**values):
    """Set environment variables for a scope (None unsets), restoring them afterwards."""
    old = {k: os.environ.get(k) for k in values}
    try:
        for k, v in values.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@contextlib.contextmanager
def fresh_dir(prefix: str):
    d = tempfile.mkdtemp(prefix=prefix)
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


def forget_loaded_kernels():
    """kiln.reset() forgets compiled frames; the runtime also memoizes loaded kernels by
    content key. Drop those too, so a 'warm disk' first call really loads from disk."""
    for modname in ("kiln.runtime.cpp_build", "kiln.runtime.triton_load"):
        mod = sys.modules.get(modname)
        loaded = getattr(mod, "_loaded", None)
        if isinstance(loaded, dict):
            loaded.clear()


def tune_malloc() -> bool:
    """Keep glibc from returning freed tensor memory to the OS after every call. Otherwise each
    CPU allocation of a large output may page-fault afresh, and whether it does depends on heap
    history (imports, earlier cases): seen here as a 13x swing in eager's time for one case.
    PyTorch's CPU performance guides suggest jemalloc/tcmalloc for the same reason."""
    try:
        import ctypes
        libc = ctypes.CDLL(None)
        M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
        return bool(libc.mallopt(M_TRIM_THRESHOLD, 1 << 30)) and \
            bool(libc.mallopt(M_MMAP_THRESHOLD, 32 << 20))
    except (OSError, AttributeError):
        return False


def kiln_reset():
    kiln.reset()
    forget_loaded_kernels()


def _compile_probe(x):
    # Ops every backend handles, and constants no case uses (so no kernel is shared with a case).
    return torch.relu(x - 1) * 3


def init_torch_compile(device: str) -> tuple[float | None, str | None]:
    """One throwaway torch.compile, so one-time process costs (imports, worker pools, toolchain
    checks) are reported on their own and not charged to the first case."""
    try:
        with fresh_dir("bench-inductor-init-") as d, \
                environ(TORCHINDUCTOR_CACHE_DIR=d, TRITON_CACHE_DIR=os.path.join(d, "triton")):
            torch._dynamo.reset()
            x = torch.randn(16, device=device)
            t, _ = timing.first_call(torch.compile(_compile_probe), (x,), device)
            torch._dynamo.reset()
        return t, None
    except Exception as e:  # noqa: BLE001 - recorded, and torch.compile is skipped
        return None, _error(e)


def init_kiln(device: str) -> tuple[float | None, str | None]:
    old = kiln.config.cache_dir
    try:
        with fresh_dir("bench-kiln-init-") as d, environ(TRITON_CACHE_DIR=os.path.join(d, "triton_bin")):
            kiln.config.cache_dir = d
            kiln_reset()
            x = torch.randn(16, device=device)
            t, _ = timing.first_call(kiln.compile(_compile_probe), (x,), device)
            stats = kiln.stats()
            kiln_reset()
        return t, None if stats.get("frames_compiled") else f"the probe did not compile: {stats}"
    except Exception as e:  # noqa: BLE001
        return None, _error(e)
    finally:
        kiln.config.cache_dir = old


# ----------------------------------------------------------------------------- one setup
def run_torch_compile(setup, check_inputs, ref, arg_sets, device, plan, rec):
    try:
        with fresh_dir("bench-inductor-") as d, \
                environ(TORCHINDUCTOR_CACHE_DIR=d, TRITON_CACHE_DIR=os.path.join(d, "triton")):
            torch._dynamo.reset()
            compiled = torch.compile(setup.fn, mode=MODE)
            cold, out = timing.first_call(compiled, check_inputs, device)
            rec["torch_compile_cold_compile_s"] = cold
            ok, msg, _ = check(out, ref, setup)
            rec["torch_compile_correct"] = ok
            if msg:
                rec["torch_compile_mismatch"] = msg
            return compiled
    except Exception as e:  # noqa: BLE001 - recorded; the other columns still run
        rec["torch_compile_error"] = _error(e)
    return None


def run_kiln(setup, check_inputs, ref, arg_sets, device, plan, rec):
    old_dir = kiln.config.cache_dir
    try:
        with fresh_dir("bench-kiln-") as d, environ(TRITON_CACHE_DIR=os.path.join(d, "triton_bin")):
            kiln.config.cache_dir = d
            compiled = kiln.compile(setup.fn, mode=MODE)
            # Cold: nothing in memory, an empty disk cache.
            kiln_reset()
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                cold, out = timing.first_call(compiled, check_inputs, device)
            stats = kiln.stats()
            rec["kiln_cold_compile_s"] = cold
            rec["kiln_kernels"] = stats.get("kernels_generated")
            rec["kiln_graph_breaks"] = stats.get("graph_breaks")
            kiln_warnings = [str(w.message) for w in caught if "kiln" in str(w.message)]
            if kiln_warnings:
                rec["kiln_warnings"] = kiln_warnings[:5]
            if stats.get("fallbacks") or not stats.get("frames_compiled"):
                # kiln ran the function eagerly: a time here would be eager's, not kiln's.
                rec["kiln_error"] = ("kiln fell back to eager: "
                                     + ("; ".join(kiln_warnings) or f"stats {stats}"))
                rec["correct"] = False
                return
            ok, msg, err = check(out, ref, setup)
            rec["correct"] = ok
            rec["max_abs_err"] = err
            if msg:
                rec["mismatch"] = msg
            # Warm disk: in-memory caches cleared, the disk cache populated by the cold call.
            kiln_reset()
            warm, _ = timing.first_call(compiled, check_inputs, device)
            stats = kiln.stats()
            rec["kiln_warm_disk_compile_s"] = warm
            rec["kiln_warm_disk_hits"] = stats.get("disk_cache_hits")
            rec["kiln_warm_disk_builds"] = stats.get("kernel_builds")
            return compiled
    except Exception as e:  # noqa: BLE001 - recorded (KILN_STRICT, fullgraph or a runtime error)
        rec["kiln_error"] = _error(e)
        rec["correct"] = False
    finally:
        kiln.config.cache_dir = old_dir
    return None


def time_steady_state(setup, check_inputs, ref, arg_sets, device, plan, rec, impls: dict):
    """Eager, torch.compile and kiln timed together, their samples interleaved
    (``timing.measure_many``); then, under a mode, each compiled result checked again (the
    steady state of a replayed CUDA graph is right too)."""
    before = kiln.stats().get("frames_compiled", 0)
    timings, errors = timing.measure_many(impls, arg_sets, device, plan)
    for name, t in timings.items():
        rec.update(t.as_dict(name))
    if "kiln" in impls:
        rec["kiln_recompiles_during_timing"] = kiln.stats().get("frames_compiled", 0) - before
    for name, e in errors.items():
        if name == "eager":
            raise e
        rec[f"{name}_error"] = _error(e)
        if name == "kiln":
            rec["correct"] = False
    if MODE is None:
        return
    for name, (ok_key, msg_key) in (("torch_compile", ("torch_compile_correct", "torch_compile_mismatch")),
                                    ("kiln", ("correct", "mismatch"))):
        if name in timings:
            ok, msg, _ = check(impls[name](*check_inputs), ref, setup)
            rec[ok_key] = rec.get(ok_key, True) and ok
            if msg:
                rec[msg_key] = "after timing: " + msg


def run_setup(name: str, setup: Setup, device: str, plan: timing.TimingPlan, env: dict,
              use_torch_compile: bool, tc_init_error: str | None) -> dict:
    rec = {"case": name}
    rec.update(env)
    grad_ctx = torch.no_grad() if setup.no_grad else contextlib.nullcontext()
    with grad_ctx:
        torch.manual_seed(1234)
        check_inputs = setup.make_inputs()
        rec["shape"] = list(check_inputs[0].shape)
        rec["input_shapes"] = [list(t.shape) for t in check_inputs]
        rec["dtype"] = str(setup.dtype).replace("torch.", "")
        if setup.label:
            rec["label"] = setup.label
        ref = setup.fn(*check_inputs)
        timing.sync(device)
        in_bytes = _nbytes(_tensors(check_inputs))
        out_bytes = _nbytes(_tensors(ref))
        param_bytes = 0
        if isinstance(setup.fn, torch.nn.Module):
            param_bytes = _nbytes(list(setup.fn.parameters()) + list(setup.fn.buffers()))
        rec["bytes_moved"] = in_bytes + param_bytes + out_bytes
        n_sets = timing.n_input_sets(in_bytes + out_bytes, plan)
        arg_sets = [check_inputs] + [setup.make_inputs() for _ in range(n_sets - 1)]
        rec["input_sets"] = n_sets

        impls = {"eager": setup.fn}
        if not use_torch_compile:
            rec["torch_compile_error"] = "skipped (--no-torch-compile)"
        elif tc_init_error:
            rec["torch_compile_error"] = tc_init_error
        else:
            tc = run_torch_compile(setup, check_inputs, ref, arg_sets, device, plan, rec)
            if tc is not None:
                impls["torch_compile"] = tc
        kiln_fn = run_kiln(setup, check_inputs, ref, arg_sets, device, plan, rec)
        if kiln_fn is not None:
            impls["kiln"] = kiln_fn
        time_steady_state(setup, check_inputs, ref, arg_sets, device, plan, rec, impls)
        del impls

        if device == "cuda":
            # the reference copy moves as many bytes as the case (half read, half written), so a
            # reduction to a small output is compared with a copy of its input's size
            out_t = _tensors(ref)[0]
            copy_bytes = max(out_t.numel() * out_t.element_size(), rec["bytes_moved"] // 2)
            k = timing.n_input_sets(2 * copy_bytes, plan)
            pairs = [(torch.empty(copy_bytes, dtype=torch.uint8, device=device),
                      torch.randint(0, 255, (copy_bytes,), dtype=torch.uint8, device=device))
                     for _ in range(k)]
            t = timing.measure(lambda dst, src: dst.copy_(src), pairs, device, plan)
            rec["copy_s"] = t.median_s
            rec["copy_gbps"] = 2 * copy_bytes / t.median_s / 1e9
            del pairs
    del arg_sets
    derive(rec, setup, device)
    return rec


def derive(rec: dict, setup: Setup, device: str):
    """Ratios, bandwidths and rates from the measured times."""
    t = {impl: rec.get(f"{impl}_s") for impl in IMPLS}
    if "kiln_error" in rec:
        t["kiln"] = None
    if "torch_compile_error" in rec:
        t["torch_compile"] = None
    k = t["kiln"]
    rec["kiln_vs_eager"] = t["eager"] / k if k and t["eager"] else None
    rec["kiln_vs_torch_compile"] = t["torch_compile"] / k if k and t["torch_compile"] else None
    rec["torch_compile_vs_eager"] = (t["eager"] / t["torch_compile"]
                                     if t["torch_compile"] and t["eager"] else None)
    if setup.overhead:
        for impl in IMPLS:
            rec[f"{impl}_us"] = t[impl] * 1e6 if t[impl] else None
    if device == "cuda":
        for impl in IMPLS:
            rec[f"{impl}_gbps"] = rec["bytes_moved"] / t[impl] / 1e9 if t[impl] else None
        if rec.get("kiln_gbps") and rec.get("copy_gbps"):
            rec["kiln_pct_of_copy"] = 100.0 * rec["kiln_gbps"] / rec["copy_gbps"]
    if setup.flops:
        rec["flops"] = setup.flops
        for impl in IMPLS:
            rec[f"{impl}_tflops"] = setup.flops / t[impl] / 1e12 if t[impl] else None


def _round(v):
    if isinstance(v, float) and math.isfinite(v) and v != 0:
        return float(f"{v:.4g}")
    return v


# ----------------------------------------------------------------------------- output
def _fmt_time(s):
    if s is None:
        return "-"
    if s < 1e-3:
        return f"{s * 1e6:.1f}us"
    return f"{s * 1e3:.3f}ms"


def _fmt(v, spec):
    return "-" if v is None else format(v, spec)


def table(records: list[dict]) -> str:
    cols = ["case", "shape", "dtype", "eager", "t.compile", "kiln", "k/eager", "k/tc",
            "tc cold", "kiln cold", "kiln disk", "ok"]
    cuda = any(r.get("device_type") == "cuda" for r in records)
    if cuda:
        cols += ["kiln GB/s", "%copy"]
    rows = [cols]
    for r in records:
        ok = "yes" if r.get("correct") else ("ERR" if "kiln_error" in r else "WRONG")
        row = [r["case"], "x".join(map(str, r["shape"])), r["dtype"],
               _fmt_time(r.get("eager_s")),
               _fmt_time(r.get("torch_compile_s")) if "torch_compile_error" not in r else "n/a",
               _fmt_time(r.get("kiln_s")) if "kiln_error" not in r else "n/a",
               _fmt(r.get("kiln_vs_eager"), ".2f"), _fmt(r.get("kiln_vs_torch_compile"), ".2f"),
               _fmt(r.get("torch_compile_cold_compile_s"), ".2f"),
               _fmt(r.get("kiln_cold_compile_s"), ".2f"), _fmt(r.get("kiln_warm_disk_compile_s"), ".3f"),
               ok]
        if cuda:
            row += [_fmt(r.get("kiln_gbps"), ".0f"), _fmt(r.get("kiln_pct_of_copy"), ".0f")]
        rows.append(row)
    widths = [max(len(str(row[i])) for row in rows) for i in range(len(cols))]
    lines = ["  ".join(str(c).rjust(w) if i > 2 else str(c).ljust(w)
                       for i, (c, w) in enumerate(zip(row, widths))) for row in rows]
    notes = []
    for r in records:
        for key in ("kiln_error", "mismatch", "torch_compile_error", "torch_compile_mismatch"):
            if key in r and not str(r[key]).startswith("skipped"):
                notes.append(f"  {r['case']} {'x'.join(map(str, r['shape']))}: {key}: {r[key]}")
    return "\n".join(lines + notes)


# ----------------------------------------------------------------------------- main
def parse_args(argv):
    p = argparse.ArgumentParser(prog="python -m benchmarks.run", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", choices=("cuda", "cpu"),
                   default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--quick", action="store_true", help="smallest sizes, fewer samples")
    p.add_argument("--cases", default=",".join(CASES),
                   help=f"comma-separated, from: {', '.join(CASES)}")
    p.add_argument("--out", help="also write the JSON lines to this file")
    p.add_argument("--threads", type=int, default=None,
                   help="CPU threads for eager (torch.set_num_threads) and for OpenMP in kiln's "
                        "and inductor's kernels (OMP_NUM_THREADS); default: leave as is")
    p.add_argument("--no-malloc-tune", action="store_true",
                   help="CPU: leave glibc's trim/mmap thresholds alone (see tune_malloc)")
    p.add_argument("--no-torch-compile", action="store_true",
                   help="skip torch.compile (its cold compile is slow on some CPUs)")
    p.add_argument("--mode", default=None,
                   help="compile mode for torch.compile and kiln alike (e.g. reduce-overhead)")
    args = p.parse_args(argv)
    args.case_list = [c.strip() for c in args.cases.split(",") if c.strip()]
    unknown = [c for c in args.case_list if c not in CASES]
    if unknown:
        p.error(f"unknown case(s) {unknown}; known: {', '.join(CASES)}")
    if args.device == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda but torch.cuda.is_available() is False")
    return args


def main(argv=None) -> list[dict]:
    args = parse_args(argv)
    device = args.device
    global MODE
    MODE = args.mode
    if args.threads:
        # Before any generated kernel's OpenMP runtime starts: it reads the variable once.
        os.environ["OMP_NUM_THREADS"] = str(args.threads)
        torch.set_num_threads(args.threads)
    plan = timing.TimingPlan.for_device(device, args.quick)
    env = environment(device)
    env["mode"] = MODE
    if device == "cpu":
        env["malloc_tuned"] = False if args.no_malloc_tune else tune_malloc()
    t_start = time.perf_counter()
    tc_init, tc_init_error = (None, None)
    if not args.no_torch_compile:
        tc_init, tc_init_error = init_torch_compile(device)
    kiln_init, kiln_init_error = init_kiln(device)
    env = dict(env, torch_compile_init_s=tc_init, kiln_init_s=kiln_init)
    if kiln_init_error:
        env["kiln_init_error"] = kiln_init_error
    records = []
    out_file = open(args.out, "w") if args.out else None
    try:
        for name in args.case_list:
            for setup in CASES[name](device, args.quick):
                rec = run_setup(name, setup, device, plan, env, not args.no_torch_compile,
                                tc_init_error)
                rec = {k: _round(v) for k, v in rec.items()}
                records.append(rec)
                line = json.dumps(rec)
                print(line, flush=True)
                if out_file:
                    out_file.write(line + "\n")
                    out_file.flush()
                if device == "cuda":
                    torch.cuda.empty_cache()
    finally:
        if out_file:
            out_file.close()
    print(table(records), file=sys.stderr)
    print(f"{len(records)} results on {env['device']} in {time.perf_counter() - t_start:.1f} s "
          f"(torch.compile init {_fmt(tc_init, '.2f')} s, kiln init {_fmt(kiln_init, '.2f')} s)",
          file=sys.stderr)
    return records


if __name__ == "__main__":
    main()
