"""kiln behind torch.compile: ``torch.compile(m, backend="kiln")`` against
``torch.compile(m)`` (inductor) and ``kiln.compile(m)``, steady state, on GPT-2 and a ResNet.

    python -m benchmarks.interop --device cuda --out interop.jsonl
    python -m benchmarks.interop --device cpu --quick --no-inductor      # a smoke run

Each model and mode is a ``benchmarks.zoo.Case`` (the zoo's sizes, dtypes, autocast and
fp32 reference): ``gpt2`` (zoo's GPT-2 small, LM head) and ``hf_resnet`` (transformers'
ResNet-50 config, random weights: torchvision is not needed). One JSON line per case with,
for each implementation (``eager``, ``inductor``, ``dynamo_kiln`` = torch.compile with kiln's
backend, ``kiln``): ``*_s`` (median seconds per call over interleaved rounds, the zoo's
``time_rounds``), ``*_cold_s`` (the first call), ``*_pass`` (against the fp32 reference, the
zoo's tolerance) or ``*_error``; and ``dynamo_kiln_vs_inductor`` / ``dynamo_kiln_vs_kiln``
(time ratios: above 1 means the torch.compile-backend path is faster). A summary table goes
to stderr.
"""
from __future__ import annotations

import argparse
import copy
import json
import sys
import time
import traceback

import torch

import kiln
import kiln.interop
from benchmarks import run as bench_run
from benchmarks import zoo, zoo_models

IMPLS = ("eager", "inductor", "dynamo_kiln", "kiln")

_RESNET_SIZES = {  # size -> (batch, image, config overrides)
    "full": (32, 224, {}),  # ResNetConfig() is ResNet-50
    "small": (2, 64, dict(embedding_size=16, hidden_sizes=[16, 32, 64, 128], depths=[1, 1, 1, 1])),
    "quick": (2, 32, dict(embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1], layer_type="basic")),
}


class _ResNetLogits(torch.nn.Module):
    def __init__(self, model, training):
        super().__init__()
        self.model, self.training_step = model, training

    def forward(self, pixels, labels=None):
        if self.training_step:
            return self.model(pixels, labels=labels).loss
        return self.model(pixels).logits


def _build_resnet(size, training):
    import transformers
    batch, image, overrides = _RESNET_SIZES[size]
    cfg = transformers.ResNetConfig(num_labels=10, **overrides)
    model = _ResNetLogits(transformers.ResNetForImageClassification(cfg), training)

    def make(device, dtype):
        x = torch.randn(batch, 3, image, image, device=device, dtype=dtype)
        return (x, torch.randint(0, 10, (batch,), device=device)) if training else (x,)
    return model, make


# a zoo entry of this script's own (not in a zoo group: `zoo --models hf` stays as it was)
zoo_models.MODELS.setdefault("hf_resnet", zoo_models.Entry(
    "hf_resnet", "hf", _build_resnet, "transformers ResNet-50 (random weights), 32 x 224 x 224"))
MODELS = ("gpt2", "hf_resnet")


def _compile(impl, case, model):
    if impl == "inductor":
        zoo._no_inductor_caches()
        return torch.compile(model)
    if impl == "dynamo_kiln":
        return torch.compile(model, backend=kiln.interop.backend)
    return kiln.compile(model)


def run_case(name, mode, args, env) -> dict:
    rec = {"model": name, "mode": mode, **env}
    size = "quick" if args.quick else ("full" if args.device == "cuda" else "small")
    case = zoo.Case(name, mode, args.device, size, sgd=False)
    rec.update(dtype=str(case.dtype).replace("torch.", ""), input_shapes=case.input_shapes, params=case.params)
    ref = case.reference()
    steps, errs = {}, {}
    impls = [i for i in IMPLS if not (i == "inductor" and args.no_inductor)]
    for impl in impls:
        model = copy.deepcopy(case.base)
        torch._dynamo.reset()
        bench_run.kiln_reset()
        try:
            fn = model if impl == "eager" else _compile(impl, case, model)
            step = case.step_fn(model, fn)
            rec[f"{impl}_cold_s"], out = zoo._first_call(step, case.inputs[0], args.device)
            errs[impl] = case.error_vs(ref, model, out)
            if impl in ("dynamo_kiln", "kiln"):
                stats = kiln.stats()
                rec[f"{impl}_kernels"] = stats["kernels_generated"]
                if stats["eager_runs"] or stats["fallbacks"] or not stats["kernels_generated"]:
                    raise RuntimeError(f"kiln did not compile it all (stats {stats})")
            steps[impl] = step
        except Exception as e:  # noqa: BLE001 - that implementation's column only
            rec[f"{impl}_error"] = zoo._error(e)
            if args.verbose:
                traceback.print_exc()
    tol = zoo.TOLERANCE[case.dtype]
    for impl, err in errs.items():
        rec[f"{impl}_rel_err"] = err
        rec[f"{impl}_pass"] = err <= max(tol, 1.5 * errs.get("eager", err) + 1e-3)
    timings, errors = zoo.time_rounds(steps, case.inputs, args.device, args.rounds, args.quick)
    for impl, (med, spread) in timings.items():
        rec[f"{impl}_s"], rec[f"{impl}_spread_pct"] = med, round(spread, 1)
    for impl, e in errors.items():
        rec[f"{impl}_error"] = "while timing: " + zoo._error(e)
    for other in ("inductor", "kiln"):
        rec[f"dynamo_kiln_vs_{other}"] = zoo._ratio(rec.get(f"{other}_s"), rec.get("dynamo_kiln_s"))
    torch._dynamo.reset()
    kiln.reset()
    return rec


def table(records) -> str:
    head = "| model | mode | " + " | ".join(f"{i} ms" for i in IMPLS) + " | vs inductor | vs kiln.compile |"
    lines = [head, "|" + "---|" * (len(IMPLS) + 4)]
    for r in records:
        cells = []
        for i in IMPLS:
            s = r.get(f"{i}_s")
            bad = "" if r.get(f"{i}_pass", True) else " (FAIL)"
            cells.append(f"{s * 1e3:.3f}{bad}" if s else ("error" if f"{i}_error" in r else "-"))
        ratios = [f"{r[k]:.2f}x" if r.get(k) else "-" for k in ("dynamo_kiln_vs_inductor", "dynamo_kiln_vs_kiln")]
        lines.append(f"| {r['model']} | {r['mode']} | " + " | ".join(cells + ratios) + " |")
    return "\n".join(lines)


def parse_args(argv):
    p = argparse.ArgumentParser(prog="python -m benchmarks.interop", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--models", default=",".join(MODELS), help=f"comma list of {', '.join(MODELS)}")
    p.add_argument("--mode", choices=("inference", "training", "both"), default="both")
    p.add_argument("--rounds", type=int, default=None, help="interleaved timing rounds (default 5; --quick 2)")
    p.add_argument("--quick", action="store_true", help="tiny models, few calls: a smoke run")
    p.add_argument("--no-inductor", action="store_true", help="skip torch.compile's default backend")
    p.add_argument("--out", help="write the JSON lines to this file")
    p.add_argument("--verbose", action="store_true", help="print compiler tracebacks")
    args = p.parse_args(argv)
    args.rounds = args.rounds or (2 if args.quick else 5)
    return args


def main(argv=None) -> list[dict]:
    args = parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda but torch.cuda.is_available() is False")
    env = bench_run.environment(args.device)
    t0 = time.perf_counter()
    records = []
    modes = ["inference", "training"] if args.mode == "both" else [args.mode]
    with open(args.out, "w") if args.out else _nowhere() as out:
        for name in [m.strip() for m in args.models.split(",") if m.strip()]:
            for mode in modes:
                rec = {k: zoo._round(v) for k, v in run_case(name, mode, args, env).items()}
                records.append(rec)
                line = json.dumps(rec)
                print(line, flush=True)
                if out is not None:
                    out.write(line + "\n")
    print(table(records), file=sys.stderr)
    print(f"{len(records)} rows on {env['device']} in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    return records


class _nowhere:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


if __name__ == "__main__":
    main()
