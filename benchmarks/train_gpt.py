"""GPT training step: eager vs torch.compile vs kiln in one process, reporting step time,
tokens/s, peak memory and the loss after a few steps (which must agree).

    python -m benchmarks.train_gpt [--device cuda] [--config small|medium|gpt2] [--steps 10]

One JSON line per compiler, then a table. On CUDA, the model and its optimizer run in bf16.
"""
from __future__ import annotations

import argparse
import copy
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples"))
from gpt import GPT, GPT2_SMALL, GPTConfig, counting_batches  # noqa: E402

CONFIGS = {
    "tiny": (GPTConfig(vocab=64, seq=32, layers=2, heads=4, dim=64), 4),
    "medium": (GPTConfig(vocab=8192, seq=512, layers=4, heads=8, dim=512), 8),
    "gpt2": (GPT2_SMALL, 8),
}


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def run(name, model, data, device, warmup=3):
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=device.type == "cuda")
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    losses, times = [], []
    t_first = None
    for i, (x, y) in enumerate(data):
        _sync(device)
        t0 = time.perf_counter()
        loss = model(x, y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        _sync(device)
        dt = time.perf_counter() - t0
        if i == 0:
            t_first = dt
        if i >= warmup:
            times.append(dt)
        losses.append(loss.item())
    times.sort()
    step = times[len(times) // 2]
    tokens = data[0][0].numel()
    peak = torch.cuda.max_memory_allocated() if device.type == "cuda" else None
    return {"compiler": name, "first_step_s": t_first, "step_s": step, "tokens_per_s": tokens / step,
            "peak_memory_bytes": peak, "losses": losses}


def main(argv=None):
    p = argparse.ArgumentParser()
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--config", default="medium", choices=list(CONFIGS))
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--no-torch-compile", action="store_true")
    p.add_argument("--out")
    args = p.parse_args(argv)
    device = torch.device(args.device)
    cfg, batch = CONFIGS[args.config]
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    torch.manual_seed(0)
    base = GPT(cfg).to(device=device, dtype=dtype)
    data = counting_batches(args.steps, batch, cfg, device=device)

    import kiln
    results = [run("eager", copy.deepcopy(base), data, device)]
    if not args.no_torch_compile:
        try:
            results.append(run("torch.compile", torch.compile(copy.deepcopy(base)), data, device))
        except Exception as e:  # noqa: BLE001
            results.append({"compiler": "torch.compile", "error": f"{type(e).__name__}: {e}"})
    kiln.reset()
    results.append(run("kiln", kiln.compile(copy.deepcopy(base)), data, device))
    results[-1]["kiln_stats"] = kiln.stats()
    eager_loss = results[0]["losses"][-1]
    lines = []
    for r in results:
        r.update(config=args.config, device=torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
                 dtype=str(dtype), batch=batch, seq=cfg.seq)
        if "losses" in r:
            r["final_loss_vs_eager"] = r["losses"][-1] - eager_loss
        lines.append(json.dumps(r))
        print(lines[-1])
    if args.out:
        with open(args.out, "a") as f:
            f.write("\n".join(lines) + "\n")
    print(f"\n{'compiler':<15}{'step':>12}{'tokens/s':>12}{'peak MB':>10}{'first step':>12}{'final loss':>12}",
          file=sys.stderr)
    for r in results:
        if "error" in r:
            print(f"{r['compiler']:<15} error: {r['error'][:80]}", file=sys.stderr)
            continue
        peak = f"{r['peak_memory_bytes'] / 2**20:.0f}" if r["peak_memory_bytes"] else "-"
        print(f"{r['compiler']:<15}{r['step_s'] * 1e3:>10.2f}ms{r['tokens_per_s']:>12.0f}{peak:>10}"
              f"{r['first_step_s']:>11.1f}s{r['losses'][-1]:>12.4f}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
