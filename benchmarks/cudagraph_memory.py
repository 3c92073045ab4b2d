"""Memory and time of ``mode="reduce-overhead"`` under each CUDA-graph pool policy
(``config.cudagraph_share``: 0, auto, 1; kiln/runtime/cudagraphs.py), next to eager and
torch.compile(mode="reduce-overhead"), one fresh process per row.

The program is a model split into separately compiled parts, as graph breaks or pipeline stages
split one: GPT-2 small's twelve blocks in four stages of three (bf16, batch 8 x 1024 by default),
each stage its own compiled function with its own recordings, then a loss head. A stage's
intermediates (attention and MLP activations) are several times its output (the hidden state),
the case pool sharing is for; the loss head's output is a scalar.

Reported per row: reserved CUDA memory after the recordings (``torch.cuda.memory_reserved``),
the peak during them, the steady time per forward (CUDA events, median of samples), and the
largest difference from eager.

    python -m benchmarks.cudagraph_memory --device cuda [--out rows.jsonl]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ROWS = [("eager", {}), ("kiln share=0", {"KILN_CONFIG": "cudagraph_share=0"}),
        ("kiln share=auto", {"KILN_CONFIG": "cudagraph_share=auto"}), ("kiln share=1", {"KILN_CONFIG": "cudagraph_share=1"}),
        ("torch.compile", {})]


def _program(device: str, batch: int, seq: int, layers: int, stages: int):
    import torch
    sys.path.insert(0, os.path.join(ROOT, "examples"))
    from gpt import GPT2_SMALL, Block
    import dataclasses
    cfg = dataclasses.replace(GPT2_SMALL, seq=seq, layers=layers, dropout=0.0)
    torch.manual_seed(0)
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    blocks = [Block(cfg).to(device=device, dtype=dtype).eval() for _ in range(layers)]
    per = -(-layers // stages)
    parts = [torch.nn.Sequential(*blocks[i:i + per]) for i in range(0, layers, per)]
    head = torch.nn.Linear(cfg.dim, 1).to(device=device, dtype=dtype)

    def loss(h):  # the last part: a scalar out of the final hidden state
        return head(h).float().square().mean()
    x = torch.randn(batch, seq, cfg.dim, device=device, dtype=dtype)
    return parts, loss, x


def _child(name: str, device: str, batch: int, seq: int, layers: int, stages: int) -> dict:
    import torch

    from benchmarks.timing import TimingPlan, measure
    parts, loss, x = _program(device, batch, seq, layers, stages)

    def run(fs, h):
        if name == "torch.compile" and hasattr(torch.compiler, "cudagraph_mark_step_begin"):
            # torch.compile's CUDA-graph trees ask for this mark before each forward of a program
            # whose compiled parts feed one another (otherwise it reports outputs overwritten)
            torch.compiler.cudagraph_mark_step_begin()
        for f in fs[:-1]:
            h = f(h)
        return fs[-1](h)
    with torch.no_grad():
        want = run(list(parts) + [loss], x)
        if name == "eager":
            fns = list(parts) + [loss]
        elif name == "torch.compile":
            fns = [torch.compile(p, mode="reduce-overhead") for p in parts] + \
                  [torch.compile(loss, mode="reduce-overhead")]
        else:
            import kiln
            fns = [kiln.compile(p, mode="reduce-overhead") for p in parts] + [kiln.compile(loss, mode="reduce-overhead")]
        if device == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            before = torch.cuda.memory_reserved()
        got = None
        for _ in range(4):  # warm-up, the recordings (two slots where outputs are handed out), replays
            got = run(fns, x)
        if device == "cuda":
            torch.cuda.synchronize()
        row = {"row": name, "device": device, "batch": batch, "seq": seq, "layers": layers, "stages": stages,
               "max_abs_diff": float((got.float() - want.float()).abs().max())}
        if device == "cuda":
            row.update(reserved_mb=torch.cuda.memory_reserved() / 2**20,
                       reserved_growth_mb=(torch.cuda.memory_reserved() - before) / 2**20,
                       peak_allocated_mb=torch.cuda.max_memory_allocated() / 2**20)
        plan = TimingPlan.for_device(device, quick=device != "cuda")
        row["forward_s"] = measure(lambda: run(fns, x), [()], device, plan).median_s
        if name.startswith("kiln"):
            import kiln
            row["kiln_stats"] = kiln.stats()
    return row


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    p.add_argument("--batch", type=int, help="default 8 on CUDA, 1 on the CPU")
    p.add_argument("--seq", type=int, help="default 1024 on CUDA, 64 on the CPU")
    p.add_argument("--layers", type=int, default=12)
    p.add_argument("--stages", type=int, default=4)
    p.add_argument("--out", help="also write the rows as JSON lines here")
    p.add_argument("--child", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    batch = a.batch or (8 if a.device == "cuda" else 1)
    seq = a.seq or (1024 if a.device == "cuda" else 64)
    if a.child:
        print(json.dumps(_child(a.child, a.device, batch, seq, a.layers, a.stages)))
        return 0
    rows = []
    for name, env in ROWS:
        if a.device != "cuda" and name == "torch.compile":
            continue  # reduce-overhead is a CUDA-graph mode; the CPU run only checks the program
        cmd = [sys.executable, "-m", "benchmarks.cudagraph_memory", "--device", a.device, "--batch", str(batch),
               "--seq", str(seq), "--layers", str(a.layers), "--stages", str(a.stages), "--child", name]
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True,
                              env=dict(os.environ, **env, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")))
        if proc.returncode != 0:
            rows.append({"row": name, "error": proc.stderr[-1500:]})
            print(f"{name:18s} failed:\n{proc.stderr[-1500:]}", file=sys.stderr)
            continue
        rows.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    print(f"{'row':18s} {'reserved MB':>12s} {'growth MB':>10s} {'peak MB':>9s} {'forward':>10s} {'max diff':>9s}")
    for r in rows:
        if "error" in r:
            continue
        mb = lambda k: f"{r[k]:.0f}" if k in r else "-"  # noqa: E731
        print(f"{r['row']:18s} {mb('reserved_mb'):>12s} {mb('reserved_growth_mb'):>10s} {mb('peak_allocated_mb'):>9s} "
              f"{r['forward_s'] * 1e3:>8.3f}ms {r['max_abs_diff']:>9.2e}")
    if a.out:
        with open(a.out, "w") as f:
            for r in rows:
                f.write(json.dumps(r) + "\n")
    return 0 if all("error" not in r for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
