"""An A/B of kiln settings (``kiln.config`` fields such as triton_tile_2d, triton_looped_rblock,
aot_launchers, triton_guarded_loads, passed through KILN_CONFIG; or public KILN_* variables):
each variant runs ``benchmarks.run`` in a fresh process (settings are read at import), kiln
only, the variants interleaved round by round so drift on a shared machine hits them alike.
Prints kiln's median time per case and variant and each variant's ratio to the first.

    python -m benchmarks.env_ab --cases cross_entropy,gpt2_forward \\
        --var triton_looped_rblock=1024 --var triton_looped_rblock=4096 [--rounds 2] [--device cuda]

A variant may set several: ``--var "triton_tile_2d=0 aot_launchers=0"``.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def parse_variant(text: str) -> dict:
    """``"name=value KILN_X=value ..."`` -> the environment the variant adds: settings by their
    ``kiln.config`` name go into KILN_CONFIG (after the inherited entries, so they win)."""
    from kiln.config import _FIELDS, PUBLIC_ENV, RETIRED_ENV

    env, settings = {}, []
    public = set(PUBLIC_ENV.values()) | {"KILN_LOGS"}
    for item in text.split():
        name, sep, value = item.partition("=")
        if sep and name in _FIELDS:
            settings.append(f"{name}={value}")
        elif sep and name in public:
            env[name] = value
        elif name in RETIRED_ENV:
            raise SystemExit(f"env_ab: {name} is no longer read; write {RETIRED_ENV[name]}={value}")
        else:
            raise SystemExit(f"env_ab: a variant is setting=value or public KILN_NAME=value pairs, got {item!r}")
    if settings:
        env["KILN_CONFIG"] = ",".join(filter(None, [os.environ.get("KILN_CONFIG", "")] + settings))
    return env


def run_variant(env: dict, cases: str, device: str | None, quick: bool) -> list[dict]:
    cmd = [sys.executable, "-m", "benchmarks.run", "--cases", cases, "--no-torch-compile"]
    if device:
        cmd += ["--device", device]
    if quick:
        cmd.append("--quick")
    proc = subprocess.run(cmd, env={**os.environ, **env}, capture_output=True, text=True, check=False, cwd=ROOT)
    if proc.returncode != 0:
        raise SystemExit(f"env_ab: {' '.join(f'{k}={v}' for k, v in env.items())} failed:\n{proc.stderr[-2000:]}")
    return [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]


def key_of(rec: dict) -> str:
    return f"{rec['case']} {'x'.join(map(str, rec['shape']))} {rec['dtype']}"


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(prog="python -m benchmarks.env_ab", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cases", required=True)
    p.add_argument("--var", action="append", required=True, help="setting=value [...] (repeat)")
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--device", choices=("cuda", "cpu"))
    p.add_argument("--quick", action="store_true")
    args = p.parse_args(argv)
    variants = [parse_variant(v) for v in args.var]
    names = [v.strip() or "default" for v in args.var]
    times: dict = {}  # case key -> variant index -> [kiln seconds per round]
    wrong = []
    for _ in range(args.rounds):
        for i, env in enumerate(variants):
            for rec in run_variant(env, args.cases, args.device, args.quick):
                if not rec.get("correct", False) or rec.get("kiln_s") is None:
                    wrong.append((names[i], key_of(rec), rec.get("kiln_error") or rec.get("mismatch")))
                    continue
                times.setdefault(key_of(rec), {}).setdefault(i, []).append(rec["kiln_s"])
    width = max(len(n) for n in names)
    for case, per in times.items():
        print(case)
        base = statistics.median(per[0]) if 0 in per else None
        for i, name in enumerate(names):
            if i not in per:
                print(f"  {name:<{width}}  (no result)")
                continue
            t = statistics.median(per[i])
            ratio = f"{base / t:5.2f}x of the first" if base else ""
            print(f"  {name:<{width}}  {t * 1e6:10.1f} us  {ratio}")
    for name, case, why in wrong:
        print(f"WRONG or failed: {name}: {case}: {why}")
    return {"times": times, "wrong": wrong}


if __name__ == "__main__":
    main()
