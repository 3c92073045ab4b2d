"""The zoo's JSON lines as one markdown table per mode, with a geomean row.

    python -m benchmarks.zoo_table zoo_hf.jsonl zoo_tv.jsonl zoo_timm.jsonl [--out table.md]

Several files (one per device command) merge into one table; a model and mode measured twice
keeps its last row. Ratios are kiln over torch.compile (or eager) as speedups: > 1 means kiln
is faster; the cold-compile and memory ratios are kiln / torch.compile: < 1 means kiln
compiles faster or uses less memory. The geomean row covers the rows that have the figure.
"""
from __future__ import annotations

import argparse
import json
import math
import sys


def _fmt(v, spec, suffix=""):
    return "-" if v is None else format(v, spec) + suffix


def _geomean(xs):
    xs = [x for x in xs if x is not None and x > 0]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else None


def _ok(rec, impl):
    if f"{impl}_error" in rec and not str(rec[f"{impl}_error"]).startswith("skipped"):
        return "ERR"
    v = rec.get(f"{impl}_pass")
    return "-" if v is None else ("ok" if v else "FAIL")


COLUMNS = ["model", "kiln ok", "tc ok", "eager ms", "tc ms", "kiln ms", "kiln/eager", "kiln/tc",
           "tc/eager", "kiln cold s", "tc cold s", "cold k/tc", "kiln MB", "tc MB", "mem k/tc",
           "breaks k/tc"]


def _row(r) -> list[str]:
    def ms(k):
        return _fmt(r.get(k) and r[k] * 1e3, ".2f")

    def mb(k):
        return _fmt(r.get(k) and r[k] / 2 ** 20, ".0f")
    breaks = f"{_fmt(r.get('kiln_graph_breaks'), 'd')}/{_fmt(r.get('torch_compile_graph_breaks'), 'd')}"
    return [r["model"], _ok(r, "kiln"), _ok(r, "torch_compile"), ms("eager_s"), ms("torch_compile_s"),
            ms("kiln_s"), _fmt(r.get("kiln_vs_eager"), ".2f", "x"), _fmt(r.get("kiln_vs_torch_compile"), ".2f", "x"),
            _fmt(r.get("torch_compile_vs_eager"), ".2f", "x"), _fmt(r.get("kiln_cold_s"), ".1f"),
            _fmt(r.get("torch_compile_cold_s"), ".1f"), _fmt(r.get("kiln_cold_vs_torch_compile"), ".2f"),
            mb("kiln_peak_mem_bytes"), mb("torch_compile_peak_mem_bytes"),
            _fmt(r.get("kiln_mem_vs_torch_compile"), ".2f"), breaks]


def markdown(records: list[dict]) -> str:
    """One table per mode, its geomean row last, then the rows' errors."""
    latest: dict = {}
    for r in records:
        latest[(r["model"], r["mode"])] = r
    out = []
    for mode in ("inference", "training"):
        rows = [r for (m, md), r in latest.items() if md == mode]
        if not rows:
            continue
        r0 = rows[0]
        out.append(f"\n### {mode}: {r0.get('device', '?')}, {r0.get('dtype', '?')}"
                   f"{', bf16 autocast' if mode == 'training' and r0.get('autocast') else ''}"
                   f" (kiln {r0.get('kiln_commit') or '?'}, torch {r0.get('torch_version', '?')})\n")
        out.append("| " + " | ".join(COLUMNS) + " |")
        out.append("| " + " | ".join(["---"] * len(COLUMNS)) + " |")
        for r in rows:
            if "skipped" in r or "error" in r:
                out.append("| " + " | ".join([r["model"], "skipped" if "skipped" in r else "ERR"] + ["-"] * (len(COLUMNS) - 2)) + " |")
                continue
            out.append("| " + " | ".join(_row(r)) + " |")
        g = {k: _geomean([r.get(k) for r in rows]) for k in
             ("kiln_vs_eager", "kiln_vs_torch_compile", "torch_compile_vs_eager", "kiln_cold_vs_torch_compile",
              "kiln_mem_vs_torch_compile")}
        passed = sum(1 for r in rows if r.get("kiln_pass"))
        geo = ["**geomean**", f"{passed}/{len(rows)}", "", "", "", "", _fmt(g["kiln_vs_eager"], ".2f", "x"),
               _fmt(g["kiln_vs_torch_compile"], ".2f", "x"), _fmt(g["torch_compile_vs_eager"], ".2f", "x"),
               "", "", _fmt(g["kiln_cold_vs_torch_compile"], ".2f"), "", "", _fmt(g["kiln_mem_vs_torch_compile"], ".2f"), ""]
        out.append("| " + " | ".join(geo) + " |")
        notes = []
        for r in rows:
            for key in ("skipped", "error", "kiln_error", "torch_compile_error"):
                if key in r and not str(r[key]).startswith("skipped (--no"):
                    notes.append(f"- {r['model']}: {key}: {str(r[key])[:300]}")
        if notes:
            out.append("")
            out += notes
    return "\n".join(out).lstrip("\n")


def load(paths) -> list[dict]:
    records = []
    for path in paths:
        with open(path) as f:
            records += [json.loads(line) for line in f if line.strip().startswith("{")]
    return records


def main(argv=None) -> str:
    p = argparse.ArgumentParser(prog="python -m benchmarks.zoo_table", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("files", nargs="+", help="JSON lines from benchmarks.zoo --out")
    p.add_argument("--out", help="also write the table to this file")
    args = p.parse_args(argv)
    table = markdown(load(args.files))
    print(table)
    if args.out:
        with open(args.out, "w") as f:
            f.write(table + "\n")
    return table


if __name__ == "__main__":
    main()
    sys.exit(0)
