"""kiln's host-side compile stages for GPT-2 small's graph, measured without a GPU.

    python -m benchmarks.host_stages                                  # inference and train, 3 runs
    python -m benchmarks.host_stages --phases train --var '' --var 'compile_gc=on'
    python -m benchmarks.host_stages --phases train --profile /tmp/host.prof.txt
    python -m benchmarks.host_stages --autotune --shape 1,1024,50304 --repeats 1   # tuned configs

On a GPU, a cold compile's capture, meta, autograd, decomp, lowering, scheduling and codegen
stages run on the host, in Python; only the build stage and the first run need the device.
This runs the same graph (``examples/gpt.py``'s GPT2_SMALL: 12 layers, 12 heads, width 768,
under bf16 autocast, with a short sequence and a small vocabulary, which change sizes but not
the graph) through the same stages, generating Triton code, in a child process with
``TRITON_INTERPRET=1`` and ``KILN_CONFIG=cpu_backend=triton``. The generated kernels are loaded but not
run: the interpreter's grid executor is replaced by a no-op, so the first call's time is the
compile. Its outputs are therefore meaningless, and nothing checks them. The kernels' correctness
is what the test suite checks.

Each run is a fresh process with an empty cache directory. The child prints one JSON line:
``first_s`` (the first call, forward, or forward plus backward for ``train``),
``stage_s`` (seconds per stage, summed over the forward and backward compiles), the number of
kernels, and per graph the kernels, the distinct binaries among them and the binaries counting
every tuned config (``--autotune`` generates tuned kernels, as ``KILN_AUTOTUNE=1`` does on a GPU;
the sizes here are smaller than GPT-2's real ones, so fewer kernels qualify for tuning). ``--var`` runs each variant of kiln's environment (``KILN_X=1 KILN_Y=0``; ``''`` for
none), the variants interleaved run by run. The table gives medians.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _child(phase: str, layers: int, profile: str | None, autotune: bool = False, shape=(1, 32, 512)):
    import dataclasses

    sys.path.insert(0, os.path.join(ROOT, "examples"))
    sys.path.insert(0, ROOT)
    import torch
    from gpt import GPT, GPT2_SMALL

    batch, seq, vocab = shape
    cfg = dataclasses.replace(GPT2_SMALL, seq=seq, vocab=vocab, layers=layers)
    torch.manual_seed(0)
    model = GPT(cfg)
    idx = torch.randint(0, cfg.vocab, (batch, cfg.seq))
    targets = torch.randint(0, cfg.vocab, (batch, cfg.seq))
    import triton.runtime.interpreter as interpreter

    import kiln
    from kiln.counters import stage_totals
    interpreter.GridExecutor.__call__ = lambda self, *a, **k: None  # compile only: no kernel runs
    if autotune:
        kiln.config.triton_autotune = "interpret"
    builds = _count_builds()
    compiled = kiln.compile(model)
    prof = None
    if profile:
        import cProfile
        prof = cProfile.Profile()
        prof.enable()
    t0 = time.perf_counter()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        if phase == "inference":
            with torch.no_grad():
                compiled(idx, targets)
        else:
            compiled(idx, targets).backward()
    first = time.perf_counter() - t0
    if prof is not None:
        prof.disable()
        import io
        import pstats
        buf = io.StringIO()
        stats = pstats.Stats(prof, stream=buf)
        stats.sort_stats("cumulative").print_stats("kiln/", 80)
        stats.sort_stats("tottime").print_stats(50)
        with open(profile, "a") as f:
            f.write(buf.getvalue())
    print(json.dumps({"first_s": first, "stage_s": {k: round(v, 4) for k, v in stage_totals().items()},
                      "kernels": kiln.stats()["kernels_generated"], "graphs": builds}))


def _count_builds() -> list:
    """Per compiled graph: kernels, distinct binaries (``builder.representatives``), and the
    binaries a GPU compile would build counting every tuned config."""
    import kiln.pipeline as pipeline
    from kiln.runtime.builder import representatives
    rows = []
    generate = pipeline.generate_kernels

    def counting(*args, **kwargs):
        generated = generate(*args, **kwargs)
        kernels = list(generated.values())
        unique = list({id(r): r for r in representatives(kernels, {})}.values())
        configs = sum(1 if getattr(k, "tune", None) is None or not hasattr(k.tune, "variants")
                      else sum(len(c) for _, c in k.tune.variants) for k in unique)
        rows.append({"kernels": len(kernels), "distinct": len(unique), "binaries": configs})
        return generated
    pipeline.generate_kernels = counting
    return rows


def run_one(phase: str, layers: int, env: dict, profile: str | None = None, autotune: bool = False,
            shape=(1, 32, 512)) -> dict:
    with tempfile.TemporaryDirectory(prefix="kiln-host-") as cache:
        child_env = dict(os.environ, **env, KILN_CACHE_DIR=cache, TRITON_INTERPRET="1",
                         PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
        # the variant's settings after cpu_backend (KILN_CONFIG applies its entries in order)
        child_env["KILN_CONFIG"] = ",".join(filter(None, ["cpu_backend=triton", env.get("KILN_CONFIG", "")]))
        cmd = [sys.executable, "-m", "benchmarks.host_stages", "--child", phase, str(layers)]
        if profile:
            cmd += ["--profile", profile]
        if autotune:
            cmd.append("--autotune")
        cmd += ["--shape", ",".join(map(str, shape))]
        proc = subprocess.run(cmd, cwd=ROOT, env=child_env, capture_output=True, text=True)
    if proc.returncode != 0:
        return {"error": proc.stderr[-2000:]}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main(argv=None) -> list[dict]:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.host_stages", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--phases", default="inference,train")
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--var", action="append", default=None, metavar="'KILN_X=1 KILN_Y=0'")
    ap.add_argument("--profile", default=None, metavar="FILE", help="append a cProfile of each run to FILE")
    ap.add_argument("--autotune", action="store_true",
                    help="generate tuned kernels (as KILN_AUTOTUNE=1 on a GPU) and count their configs")
    ap.add_argument("--shape", default="1,32,512", metavar="BATCH,SEQ,VOCAB",
                    help="GPT-2's real ones are 8,1024,50304 (the matmuls then run on the CPU)")
    ap.add_argument("--out", default=None)
    ap.add_argument("--child", nargs=2, metavar=("PHASE", "LAYERS"))
    args = ap.parse_args(argv)
    if args.child:
        _child(args.child[0], int(args.child[1]), args.profile, args.autotune,
               tuple(int(v) for v in args.shape.split(",")))
        return []
    from benchmarks.env_ab import parse_variant
    variants = {(v.strip() or "default"): parse_variant(v) for v in (args.var or [""])}
    rows = []
    out = open(args.out, "a") if args.out else None
    for phase in args.phases.split(","):
        for r in range(args.repeats):
            for label, env in variants.items():
                res = run_one(phase, args.layers, env, args.profile, args.autotune,
                              tuple(int(v) for v in args.shape.split(",")))
                row = {"case": "host_stages", "phase": phase, "layers": args.layers, "variant": label,
                       "round": r, **res}
                rows.append(row)
                print(json.dumps(row), flush=True)
                if out:
                    out.write(json.dumps(row) + "\n")
    if out:
        out.close()
    for phase in args.phases.split(","):
        for label in variants:
            mine = [r for r in rows if r["phase"] == phase and r["variant"] == label and "error" not in r]
            errors = [r["error"] for r in rows if r["phase"] == phase and r["variant"] == label and "error" in r]
            if not mine:
                print(f"{phase:<9} {label:<28} ERROR {errors[0][-300:] if errors else ''}", file=sys.stderr)
                continue
            first = statistics.median(r["first_s"] for r in mine)
            stages = {k: round(statistics.median(r["stage_s"].get(k, 0.0) for r in mine), 3)
                      for k in mine[0]["stage_s"]}
            print(f"{phase:<9} {label:<28} first call {first:6.2f} s  stages {stages}", file=sys.stderr)
            print(f"{'':<9} {'':<28} per graph (kernels, distinct, binaries with tuned configs): "
                  f"{[(g['kernels'], g['distinct'], g['binaries']) for g in mine[0]['graphs']]}", file=sys.stderr)
    return rows


if __name__ == "__main__":
    main()
