"""An A/B of kiln trees (or settings) on zoo models: each variant runs ``benchmarks.zoo`` in a
fresh process, kiln and eager only, the variants interleaved round by round. The figure is
kiln's speedup over eager measured in the same process (``kiln_vs_eager``): on a shared host
the load drifts between processes, and the ratio to eager timed in the same rounds cancels
most of it. Prints per model and mode the median over rounds per variant and its ratio to the
first variant.

    python -m benchmarks.zoo_ab --models llama,bert --mode inference \\
        --tree /tmp/base --tree . [--var ""] [--rounds 3] [--threads 1]

``--tree DIR`` runs the kiln found in DIR (its ``benchmarks/zoo.py`` and ``kiln/``; a copy
of an older commit: ``git archive COMMIT | tar -x -C DIR``); ``--var "name=value ..."`` runs
this tree with those ``kiln.config`` settings (``KILN_CONFIG``). Variants are listed in the
order given; every variant's rows must pass against eager, or the A/B stops.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_once(tree: str, settings: str, args) -> list[dict]:
    env = dict(os.environ, PYTHONPATH=tree)
    if settings:
        env["KILN_CONFIG"] = ",".join(filter(None, [os.environ.get("KILN_CONFIG", ""), *settings.split()]))
    cmd = [sys.executable, "-m", "benchmarks.zoo", "--device", "cpu", "--no-torch-compile",
           "--models", args.models, "--mode", args.mode, "--rounds", str(args.inner_rounds)]
    if args.threads:
        cmd += ["--threads", str(args.threads)]
    if args.quick:
        cmd.append("--quick")
    proc = subprocess.run(cmd, env=env, cwd=tree, capture_output=True, text=True, check=False)
    rows = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not rows:
        raise SystemExit(f"zoo_ab: {tree} {settings!r} failed:\n{proc.stderr[-2000:]}")
    bad = [r for r in rows if not r.get("kiln_pass")]
    if bad:
        raise SystemExit(f"zoo_ab: {tree} {settings!r}: kiln wrong or failed on "
                         f"{[(r['model'], r['mode'], r.get('kiln_error') or r.get('error')) for r in bad]}")
    return rows


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(prog="python -m benchmarks.zoo_ab", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", required=True)
    p.add_argument("--mode", choices=("inference", "training", "both"), default="both")
    p.add_argument("--tree", action="append", default=[], help="a kiln checkout to run (repeatable)")
    p.add_argument("--var", action="append", default=[], help="settings for this tree (repeatable)")
    p.add_argument("--rounds", type=int, default=3, help="processes per variant, interleaved")
    p.add_argument("--inner-rounds", type=int, default=3, help="zoo's --rounds within each process")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--quick", action="store_true", help="zoo's tiny sizes (a smoke run)")
    args = p.parse_args(argv)
    variants = [(os.path.abspath(t), "") for t in args.tree] + [(ROOT, v) for v in args.var]
    if len(variants) < 2:
        p.error("give at least two variants (--tree and/or --var)")
    results: dict = {}
    for r in range(args.rounds):
        for i, (tree, settings) in enumerate(variants):
            rows = run_once(tree, settings, args)
            for row in rows:
                key = (row["model"], row["mode"])
                results.setdefault(key, {}).setdefault(i, []).append(row["kiln_vs_eager"])
            # each process's figures as they come, so a run cut short still says something
            print(f"round {r + 1}/{args.rounds}: {tree} {settings!r}: " +
                  ", ".join(f"{row['model']} {row['mode']} {row['kiln_vs_eager']:.3f}x" for row in rows),
                  file=sys.stderr, flush=True)
    names = [f"{os.path.relpath(t, ROOT) if t != ROOT else '.'}{' ' + s if s else ''}" for t, s in variants]
    print("| model | mode | " + " | ".join(f"kiln/eager: {n}" for n in names) + " | " +
          " | ".join(f"{n} / first" for n in names[1:]) + " |")
    print("|" + " --- |" * (2 + 2 * len(names) - 1))
    summary = {}
    for (model, mode), per in results.items():
        med = [statistics.median(per[i]) for i in range(len(variants))]
        summary[(model, mode)] = med
        cells = [f"{m:.3f}x ({min(per[i]):.2f}-{max(per[i]):.2f})" for i, m in enumerate(med)]
        print(f"| {model} | {mode} | " + " | ".join(cells) + " | " +
              " | ".join(f"{m / med[0]:.3f}" for m in med[1:]) + " |")
    return summary


if __name__ == "__main__":
    main()
