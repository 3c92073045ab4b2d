"""GPT training step: eager vs torch.compile vs kiln in one process, reporting step time,
tokens/s, peak memory and the losses of every step, which must agree with eager's.

    python -m benchmarks.train_gpt --device cuda --config gpt2          # GPT-2 small, bf16, 8 x 1024
    python -m benchmarks.train_gpt --device cpu --config tiny --no-torch-compile

One JSON line per compiler (stdout, and appended to --out), then a table on stderr. On CUDA the
model and its AdamW state are bf16 (``--dtype`` changes that). Every compiler trains its own copy
of the same initial weights on the same batches; ``losses_match`` says whether its loss curve
stays within the dtype's tolerance of eager's, and the exit status is 1 when kiln's does not.
"""
from __future__ import annotations

import argparse
import copy
import gc
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples"))
from gpt import GPT, GPT2_SMALL, GPTConfig, counting_batches  # noqa: E402

CONFIGS = {  # name -> (model config, batch)
    "tiny": (GPTConfig(vocab=64, seq=32, layers=2, heads=4, dim=64), 4),
    "medium": (GPTConfig(vocab=8192, seq=512, layers=4, heads=8, dim=512), 8),
    "gpt2": (GPT2_SMALL, 8),  # GPT-2 small: 12 layers, 12 heads, 768 wide, 1024 tokens, vocab 50304
}
# (rtol, atol) for a loss curve against eager's: the first loss is one forward from the same
# weights; later ones drift as each step's rounding feeds the next
LOSS_TOLERANCE = {torch.float32: (1e-3, 1e-3), torch.bfloat16: (3e-2, 3e-2), torch.float16: (1e-2, 1e-2)}


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def _free(device):
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


def run(name, model, data, device, warmup=3):
    """Train ``model`` on ``data`` (one AdamW step per batch); the median step after ``warmup``."""
    _free(device)
    baseline = torch.cuda.memory_allocated() if device.type == "cuda" else None
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=device.type == "cuda")
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
        if i >= warmup or len(data) <= warmup:
            times.append(dt)
        losses.append(loss.item())
    times.sort()
    step = times[len(times) // 2]
    tokens = data[0][0].numel()
    peak = torch.cuda.max_memory_allocated() if device.type == "cuda" else None
    return {"compiler": name, "first_step_s": t_first, "step_s": step, "tokens_per_s": tokens / step,
            "peak_memory_bytes": peak, "memory_before_bytes": baseline, "losses": losses}


def losses_agree(losses, reference, dtype) -> tuple[bool, float]:
    rtol, atol = LOSS_TOLERANCE.get(dtype, (1e-3, 1e-3))
    worst = max(abs(a - b) for a, b in zip(losses, reference))
    ok = len(losses) == len(reference) and all(
        abs(a - b) <= atol + rtol * abs(b) for a, b in zip(losses, reference))
    return ok, worst


def main(argv=None):
    p = argparse.ArgumentParser()
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--config", default="medium", choices=list(CONFIGS))
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--batch", type=int, help="default: the config's (8 for gpt2)")
    p.add_argument("--dtype", choices=["float32", "bfloat16", "float16"],
                   help="default: bfloat16 on CUDA, float32 on the CPU")
    p.add_argument("--no-torch-compile", action="store_true")
    p.add_argument("--kiln-mode", default=None, help="kiln.compile's mode (e.g. reduce-overhead)")
    p.add_argument("--out")
    args = p.parse_args(argv)
    device = torch.device(args.device)
    cfg, batch = CONFIGS[args.config]
    batch = args.batch or batch
    dtype = getattr(torch, args.dtype) if args.dtype else (torch.bfloat16 if device.type == "cuda" else torch.float32)
    torch.manual_seed(0)
    base = GPT(cfg).to(device=device, dtype=dtype)
    data = counting_batches(args.steps, batch, cfg, device=device)

    import kiln
    results = [run("eager", copy.deepcopy(base), data, device)]
    if not args.no_torch_compile:
        try:
            results.append(run("torch.compile", torch.compile(copy.deepcopy(base)), data, device))
        except Exception as e:  # noqa: BLE001 - the peer failing is a result, not our error
            results.append({"compiler": "torch.compile", "error": f"{type(e).__name__}: {e}"})
        torch.compiler.reset()  # drop its caches (and the model copy they hold) before kiln runs
    kiln.reset()
    try:
        results.append(run("kiln", kiln.compile(copy.deepcopy(base), mode=args.kiln_mode), data, device))
        results[-1]["kiln_stats"] = kiln.stats()
    except Exception as e:  # noqa: BLE001 - reported in the table and the exit status
        results.append({"compiler": "kiln", "error": f"{type(e).__name__}: {e}"})
    eager = results[0]
    lines = []
    for r in results:
        r.update(config=args.config, device=torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
                 dtype=str(dtype), batch=batch, seq=cfg.seq, layers=cfg.layers, dim=cfg.dim,
                 params=sum(t.numel() for t in base.parameters()), torch_version=torch.__version__)
        if "losses" in r:
            r["final_loss_vs_eager"] = r["losses"][-1] - eager["losses"][-1]
            r["losses_match"], r["max_loss_diff"] = losses_agree(r["losses"], eager["losses"], dtype)
            r["tokens_per_s_vs_eager"] = r["tokens_per_s"] / eager["tokens_per_s"]
        lines.append(json.dumps(r))
        print(lines[-1])
    if args.out:
        with open(args.out, "a") as f:
            f.write("\n".join(lines) + "\n")
    _table(results, args, dtype, batch, cfg)
    kiln_result = results[-1]
    return 0 if kiln_result.get("losses_match") else 1


def _table(results, args, dtype, batch, cfg):
    err = sys.stderr
    print(f"\n{args.config}: batch {batch} x {cfg.seq} tokens, {cfg.layers} layers x {cfg.dim}, {dtype}, "
          f"{args.steps} steps", file=err)
    print(f"{'compiler':<15}{'step':>12}{'tokens/s':>12}{'vs eager':>10}{'peak MB':>10}{'first step':>12}"
          f"{'final loss':>12}  losses", file=err)
    for r in results:
        if "error" in r:
            print(f"{r['compiler']:<15} error: {r['error'][:100]}", file=err)
            continue
        peak = f"{r['peak_memory_bytes'] / 2**20:.0f}" if r["peak_memory_bytes"] else "-"
        agree = "match" if r["losses_match"] else f"DIFFER (by {r['max_loss_diff']:.3g})"
        print(f"{r['compiler']:<15}{r['step_s'] * 1e3:>10.2f}ms{r['tokens_per_s']:>12.0f}"
              f"{r['tokens_per_s_vs_eager']:>9.2f}x{peak:>10}{r['first_step_s']:>11.1f}s{r['losses'][-1]:>12.4f}"
              f"  {agree}", file=err)


if __name__ == "__main__":
    sys.exit(main())
