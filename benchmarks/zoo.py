"""The model zoo: eager, torch.compile and kiln on real models, side by side in one process.

    python -m benchmarks.zoo --list
    python -m benchmarks.zoo --device cuda --models hf --mode both --out zoo_hf.jsonl
    python -m benchmarks.zoo --device cuda --models tv_resnet50,timm --mode inference --time-budget 450
    python -m benchmarks.zoo --device cpu --models gpt2 --quick --no-torch-compile
    python -m benchmarks.zoo_table zoo_*.jsonl          # merge runs into one markdown table

Per model and mode (inference: bf16 on CUDA, fp32 on the CPU, no_grad; training: forward,
loss, backward and optionally an SGD step, under bf16 autocast on CUDA) one JSON line:

- ``kiln_pass`` / ``torch_compile_pass``: the result (logits; for training the loss and every
  gradient) against an fp32 eager reference, as ||out - ref|| / ||ref||: at most the dtype's
  tolerance (fp32 1e-4; bf16 2e-2), or within 1.5x eager's own error in that dtype plus 1e-3;
- ``*_s``: median seconds per call over ``--rounds`` interleaved rounds (eager, torch.compile,
  kiln, eager, ...), each round after its own warm-up (CUDA: >= 0.3 s, which brings the clocks
  back up after a compile; CPU: >= 3 calls), timed with CUDA events over >= 0.1 s of calls;
  ``*_spread_pct``: (max - min) / median over the rounds;
- ``*_cold_s``: the first call, synchronized, compiling from nothing: ``torch._dynamo.reset()``
  and a fresh ``TORCHINDUCTOR_CACHE_DIR`` and ``TRITON_CACHE_DIR`` per model, with inductor's FX
  graph and autograd caches off for the whole process; ``kiln.reset()``, its loaded-kernel memo
  cleared and a fresh ``kiln.config.cache_dir`` (kernel and graph cache) and ``TRITON_CACHE_DIR``
  per model. One-time process costs (imports, worker pools) are paid by a throwaway probe per
  compiler first and reported as ``*_init_s``;
- ``*_peak_mem_bytes`` (CUDA): ``max_memory_allocated`` over one call after
  ``reset_peak_memory_stats``, less what was allocated before it (the call's activations,
  gradients and workspaces; every compiler's model copy stays resident, so absolute peaks would
  say nothing); null on the CPU;
- ``kiln_graph_breaks`` (``kiln.stats()``), ``torch_compile_graph_breaks`` (the sum of
  ``torch._dynamo.utils.counters["graph_break"]``) and graph counts for each.

A model that fails to build or to run eagerly is one row with ``error``; a compiler that fails
is that compiler's ``*_error``. ``--time-budget`` skips the models left once the run has used
that many seconds (a device command is limited to 10 minutes). README.md lists the rest.
"""
from __future__ import annotations

import argparse
import atexit
import contextlib
import copy
import gc
import json
import math
import os
import shutil
import statistics
import sys
import tempfile
import time
import traceback

# before torch._inductor is imported: a cold compile must not find cached graphs
_INDUCTOR_ROOT = tempfile.mkdtemp(prefix="zoo-inductor-")
atexit.register(shutil.rmtree, _INDUCTOR_ROOT, True)
os.environ.setdefault("TORCHINDUCTOR_FX_GRAPH_CACHE", "0")
os.environ.setdefault("TORCHINDUCTOR_AUTOGRAD_CACHE", "0")
os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(_INDUCTOR_ROOT, "init")

import torch  # noqa: E402

import kiln  # noqa: E402
from benchmarks import run as bench_run  # noqa: E402
from benchmarks import zoo_models  # noqa: E402
from benchmarks.zoo_table import markdown  # noqa: E402

IMPLS = ("eager", "torch_compile", "kiln")
TOLERANCE = {torch.float32: 1e-4, torch.bfloat16: 2e-2, torch.float16: 1e-2}


# ----------------------------------------------------------------------------- helpers
def _sync(device):
    if device == "cuda":
        torch.cuda.synchronize()


def _error(e: BaseException) -> str:
    msg = f"{type(e).__name__}: {e}".strip()
    return msg if len(msg) <= 600 else msg[:600] + " ..."


def _free(device):
    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()


def _rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    out, ref = out.detach().double().flatten(), ref.detach().double().flatten().to(out.device)
    if out.shape != ref.shape:
        return math.inf
    if not torch.isfinite(out).all():
        return math.inf
    return ((out - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def _grads(model) -> torch.Tensor:
    gs = [p.grad.detach().float().flatten() for p in model.parameters() if p.grad is not None]
    return torch.cat(gs) if gs else torch.zeros(0)


class Case:
    """One model in one mode on one device: its step function per compiler and its inputs."""

    def __init__(self, name, mode, device, size, sgd):
        self.name, self.mode, self.device = name, mode, device
        self.training = mode == "training"
        self.dtype = torch.bfloat16 if device == "cuda" else torch.float32
        entry = zoo_models.MODELS[name]
        torch.manual_seed(0)
        module, make_inputs = entry.build(size, self.training)
        self.base = zoo_models.no_dropout(module).to(device)
        self.base.train(self.training)
        # inference runs in the dtype itself; training keeps fp32 weights under autocast
        in_dtype = self.dtype if not self.training else torch.float32
        if not self.training:
            self.base = self.base.to(self.dtype)
        torch.manual_seed(1)
        self.inputs = [make_inputs(device, in_dtype) for _ in range(2)]
        self.sgd = sgd
        self.params = sum(p.numel() for p in self.base.parameters())
        self.input_shapes = [list(t.shape) for t in self.inputs[0] if isinstance(t, torch.Tensor)]

    def autocast(self):
        if self.training and self.device == "cuda":
            return torch.autocast("cuda", dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def step_fn(self, model, fn):
        """One call: inference, or a training step (forward, loss, backward, SGD step)."""
        params = [p for p in model.parameters() if p.requires_grad]
        opt = torch.optim.SGD(params, lr=1e-6) if self.sgd and self.training else None

        if not self.training:
            def infer(*inputs):
                with torch.no_grad():
                    return fn(*inputs)
            return infer

        def train(*inputs):
            for p in params:
                p.grad = None
            with self.autocast():
                loss = fn(*inputs)
            loss.backward()
            if opt is not None:
                opt.step()
            return loss
        return train

    def reference(self):
        """fp32 eager on the first input set: logits, or loss and gradients."""
        ref_model = copy.deepcopy(self.base).float()
        inputs = [t.float() if isinstance(t, torch.Tensor) and t.is_floating_point() else t
                  for t in self.inputs[0]]
        if not self.training:
            with torch.no_grad():
                out = ref_model(*inputs).float()
            return {"out": out}
        for p in ref_model.parameters():
            p.grad = None
        loss = ref_model(*inputs)
        loss.backward()
        return {"out": loss.detach().float(), "grads": _grads(ref_model)}

    def error_vs(self, ref, model, out) -> float:
        err = _rel_err(out.float(), ref["out"])
        if self.training:
            err = max(err, _rel_err(_grads(model), ref["grads"]))
        return err


# ----------------------------------------------------------------------------- compilers
@contextlib.contextmanager
def _fresh_caches(tag):
    d = tempfile.mkdtemp(prefix=f"zoo-{tag}-", dir=_INDUCTOR_ROOT)
    try:
        with bench_run.environ(TORCHINDUCTOR_CACHE_DIR=d, TRITON_CACHE_DIR=os.path.join(d, "triton")):
            yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


def _no_inductor_caches():
    """The FX graph and autograd caches off (also where torch._inductor was imported before
    this module set the environment)."""
    import torch._inductor.config as inductor_config
    for key in ("fx_graph_cache", "fx_graph_remote_cache", "autotune_local_cache"):
        if hasattr(inductor_config, key):
            setattr(inductor_config, key, False)
    try:
        import torch._functorch.config as functorch_config
        if hasattr(functorch_config, "enable_autograd_cache"):
            functorch_config.enable_autograd_cache = False
    except ImportError:
        pass


def _compile_torch(case, model, rec):
    from torch._dynamo.utils import counters
    _no_inductor_caches()
    torch._dynamo.reset()
    counters.clear()
    with _fresh_caches("inductor"):
        step = case.step_fn(model, torch.compile(model))
        cold, out = _first_call(step, case.inputs[0], case.device)
    rec["torch_compile_cold_s"] = cold
    rec["torch_compile_graph_breaks"] = sum(counters["graph_break"].values())
    rec["torch_compile_graphs"] = counters["stats"].get("unique_graphs")
    return step, out


def _compile_kiln(case, model, rec):
    old = kiln.config.cache_dir
    try:
        with _fresh_caches("kiln") as d:
            kiln.config.cache_dir = d
            bench_run.kiln_reset()
            compiled = kiln.compile(model)
            step = case.step_fn(model, compiled)
            cold, out = _first_call(step, case.inputs[0], case.device)
            stats = kiln.stats()
    finally:
        kiln.config.cache_dir = old
    rec["kiln_cold_s"] = cold
    rec["kiln_graph_breaks"] = stats.get("graph_breaks")
    rec["kiln_graphs"] = stats.get("graphs_compiled")
    rec["kiln_kernels"] = stats.get("kernels_generated")
    if stats.get("fallbacks") or not stats.get("frames_compiled"):
        raise RuntimeError(f"kiln fell back to eager (stats {stats})")
    return step, out


def _first_call(step, inputs, device):
    _sync(device)
    t0 = time.perf_counter()
    out = step(*inputs)
    _sync(device)
    return time.perf_counter() - t0, out


# ----------------------------------------------------------------------------- timing
def _calls_for(step, inputs, device, warm_s, min_calls) -> float:
    """Warm up for ``warm_s`` seconds and at least ``min_calls`` calls; seconds per call."""
    i, t0 = 0, time.perf_counter()
    while i < min_calls or time.perf_counter() - t0 < warm_s:
        step(*inputs[i % len(inputs)])
        i += 1
    _sync(device)
    return (time.perf_counter() - t0) / i


def _sample(step, inputs, device, k) -> float:
    if device == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        start.record()
        for j in range(k):
            step(*inputs[j % len(inputs)])
        end.record()
        end.synchronize()
        return start.elapsed_time(end) * 1e-3 / k
    t0 = time.perf_counter()
    for j in range(k):
        step(*inputs[j % len(inputs)])
    return (time.perf_counter() - t0) / k


def time_rounds(steps: dict, inputs, device, rounds, quick) -> tuple[dict, dict]:
    """Median seconds per call of each step over interleaved rounds, each round warmed up."""
    warm_s, sample_s = (0.3, 0.1) if device == "cuda" else ((0.0, 0.02) if quick else (0.1, 0.2))
    times: dict = {name: [] for name in steps}
    errors: dict = {}
    for _ in range(rounds):
        for name in list(times):
            try:
                per = _calls_for(steps[name], inputs, device, warm_s, 1 if quick else 3)
                times[name].append(_sample(steps[name], inputs, device, max(1, math.ceil(sample_s / per))))
            except Exception as e:  # noqa: BLE001 - that compiler's column only
                errors[name] = e
                del times[name]
    out = {}
    for name, xs in times.items():
        med = statistics.median(xs)
        out[name] = (med, 100.0 * (max(xs) - min(xs)) / med if med else 0.0)
    return out, errors


def peak_memory(step, inputs, device):
    if device != "cuda":
        return None
    _free(device)
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    step(*inputs[0])
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - before


# ----------------------------------------------------------------------------- one case
def run_case(name, mode, args, env) -> dict:
    rec = {"model": name, "group": zoo_models.MODELS[name].group, "mode": mode, **env}
    t_case = time.perf_counter()
    try:
        case = Case(name, mode, args.device, "quick" if args.quick else ("full" if args.device == "cuda" else "small"),
                    args.sgd)
        rec.update(dtype=str(case.dtype).replace("torch.", ""), input_shapes=case.input_shapes,
                   params=case.params, autocast=case.training and args.device == "cuda", sgd_step=bool(args.sgd and case.training))
        ref = case.reference()
        _free(args.device)
    except Exception as e:  # noqa: BLE001 - a row, not a crash
        rec["error"] = "building the model or its fp32 reference: " + _error(e)
        return rec
    models = {impl: copy.deepcopy(case.base) for impl in IMPLS}
    steps, errs = {}, {}
    try:
        steps["eager"] = case.step_fn(models["eager"], models["eager"])
        _, out = _first_call(steps["eager"], case.inputs[0], args.device)
        errs["eager"] = case.error_vs(ref, models["eager"], out)
    except Exception as e:  # noqa: BLE001
        rec["error"] = "eager: " + _error(e)
        return rec
    tol = TOLERANCE[case.dtype]
    for impl, compile_fn in (("torch_compile", _compile_torch), ("kiln", _compile_kiln)):
        if impl == "torch_compile" and args.no_torch_compile:
            rec["torch_compile_error"] = "skipped (--no-torch-compile)"
            continue
        try:
            step, out = compile_fn(case, models[impl], rec)
            errs[impl] = case.error_vs(ref, models[impl], out)
            rec[f"{impl}_pass"] = errs[impl] <= max(tol, 1.5 * errs["eager"] + 1e-3)
            steps[impl] = step
        except Exception as e:  # noqa: BLE001
            rec[f"{impl}_error"] = _error(e)
            rec[f"{impl}_pass"] = False
            if args.verbose:
                traceback.print_exc()
        _free(args.device)
    for impl, err in errs.items():
        rec[f"{impl}_rel_err"] = err
    rec["tolerance"] = tol
    timings, errors = time_rounds(steps, case.inputs, args.device, args.rounds, args.quick)
    for impl, (med, spread) in timings.items():
        rec[f"{impl}_s"], rec[f"{impl}_spread_pct"] = med, round(spread, 1)
    for impl, e in errors.items():
        rec[f"{impl}_error"] = "while timing: " + _error(e)
    for impl in timings:
        try:
            rec[f"{impl}_peak_mem_bytes"] = peak_memory(steps[impl], case.inputs, args.device)
        except Exception as e:  # noqa: BLE001
            rec[f"{impl}_error"] = "measuring memory: " + _error(e)
    derive(rec)
    del steps, models
    torch._dynamo.reset()
    kiln.reset()
    _free(args.device)
    rec["case_wall_s"] = time.perf_counter() - t_case
    return rec


def _ratio(a, b):
    return a / b if a and b else None


def derive(rec):
    e, tc, k = (rec.get(f"{i}_s") for i in IMPLS)
    rec["kiln_vs_eager"] = _ratio(e, k)
    rec["kiln_vs_torch_compile"] = _ratio(tc, k)
    rec["torch_compile_vs_eager"] = _ratio(e, tc)
    rec["kiln_cold_vs_torch_compile"] = _ratio(rec.get("kiln_cold_s"), rec.get("torch_compile_cold_s"))
    rec["kiln_mem_vs_torch_compile"] = _ratio(rec.get("kiln_peak_mem_bytes"), rec.get("torch_compile_peak_mem_bytes"))


def _round(v):
    if isinstance(v, float) and math.isfinite(v) and v != 0:
        return float(f"{v:.4g}")
    return None if isinstance(v, float) and not math.isfinite(v) else v


# ----------------------------------------------------------------------------- main
def parse_args(argv):
    p = argparse.ArgumentParser(prog="python -m benchmarks.zoo", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--models", default=None,
                   help="comma list of models and groups (hf, torchvision, timm, all); default: every "
                        "installed group on CUDA, hf on the CPU")
    p.add_argument("--mode", choices=("inference", "training", "both"), default="both")
    p.add_argument("--rounds", type=int, default=None, help="interleaved timing rounds (default 5; --quick 2)")
    p.add_argument("--quick", action="store_true", help="tiny models, few calls: a smoke run")
    p.add_argument("--out", help="write the JSON lines to this file")
    p.add_argument("--table", help="write the markdown table to this file (it also goes to stderr)")
    p.add_argument("--time-budget", type=float, default=None,
                   help="seconds: skip the models left once the run has used this long")
    p.add_argument("--no-torch-compile", action="store_true", help="skip torch.compile")
    p.add_argument("--sgd", action="store_true", help="training: also take an SGD step per call")
    p.add_argument("--list", action="store_true", help="print the groups and models, and exit")
    p.add_argument("--verbose", action="store_true", help="print compiler tracebacks")
    p.add_argument("--threads", type=int, default=None,
                   help="CPU threads for eager (torch.set_num_threads) and for OpenMP in kiln's and "
                        "inductor's kernels (OMP_NUM_THREADS); default: leave as is")
    args = p.parse_args(argv)
    if args.rounds is None:
        args.rounds = 2 if args.quick else 5
    return args


def list_models() -> str:
    lines = []
    for group, names in zoo_models.GROUPS.items():
        state = "installed" if zoo_models.available(group) else "not installed"
        lines.append(f"{group} ({state}):")
        lines += [f"  {n:28s} {zoo_models.MODELS[n].note}" for n in names]
    return "\n".join(lines)


def _default_models(device) -> str:
    if device == "cpu":
        return "hf"
    return ",".join(g for g in zoo_models.GROUPS if zoo_models.available(g))


def main(argv=None) -> list[dict]:
    args = parse_args(argv)
    if args.list:
        print(list_models())
        return []
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda but torch.cuda.is_available() is False")
    if args.threads:
        # before any generated kernel's OpenMP runtime starts: it reads the variable once
        os.environ["OMP_NUM_THREADS"] = str(args.threads)
        torch.set_num_threads(args.threads)
    names = zoo_models.resolve(args.models or _default_models(args.device))
    modes = ["inference", "training"] if args.mode == "both" else [args.mode]
    t_start = time.perf_counter()
    env = bench_run.environment(args.device)
    if args.device == "cpu":
        env["malloc_tuned"] = bench_run.tune_malloc()
    if not args.no_torch_compile:
        env["torch_compile_init_s"], err = bench_run.init_torch_compile(args.device)
        if err:
            env["torch_compile_init_error"] = err
    env["kiln_init_s"], err = bench_run.init_kiln(args.device)
    if err:
        env["kiln_init_error"] = err
    records, longest = [], 0.0
    out = open(args.out, "w") if args.out else None
    try:
        for name in names:
            for mode in modes:
                used = time.perf_counter() - t_start
                if args.time_budget is not None and used + longest > args.time_budget:
                    rec = {"model": name, "group": zoo_models.MODELS[name].group, "mode": mode, **env,
                           "skipped": f"time budget: {used:.0f} s used of {args.time_budget:.0f} s"}
                else:
                    rec = run_case(name, mode, args, env)
                    longest = max(longest, rec.get("case_wall_s") or 0.0)
                rec = {k: _round(v) for k, v in rec.items()}
                records.append(rec)
                line = json.dumps(rec)
                print(line, flush=True)
                if out:
                    out.write(line + "\n")
                    out.flush()
    finally:
        if out:
            out.close()
    table = markdown(records)
    print(table, file=sys.stderr)
    if args.table:
        with open(args.table, "w") as f:
            f.write(table + "\n")
    print(f"{len(records)} rows on {env['device']} in {time.perf_counter() - t_start:.0f} s", file=sys.stderr)
    return records


if __name__ == "__main__":
    main()
