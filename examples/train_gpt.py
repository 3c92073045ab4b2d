"""Train a small GPT (examples/gpt.py, the nanoGPT shape) with kiln.compile on a character-level
corpus made of this project's own source files and docs (nothing to download), next to the same
model in eager PyTorch from the same initial weights (dropout off), then plot both loss curves.

    python examples/train_gpt.py                          # tiny model on the CPU, 50 steps
    python examples/train_gpt.py --device cuda --size gpt2 --steps 200 --out loss.png

Both runs see the same batches (random windows of the corpus), so the two curves should lie on
top of each other: kiln changes how the step is computed, not what it computes.
"""
from __future__ import annotations

import argparse
import copy
import dataclasses
import glob
import math
import os
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
try:
    import kiln
except ImportError:  # run from a checkout without `pip install -e .`
    sys.path.insert(0, ROOT)
    import kiln

from gpt import GPT, GPT2_SMALL, GPTConfig  # noqa: E402
from lineplot import plot_lines  # noqa: E402

# model shape, batch size and learning rate per --size; the vocabulary comes from the corpus.
# The learning rates keep training stable: at the edge of stability (3e-3 for tiny) loss spikes
# amplify rounding differences step after step, and two correct runs drift apart.
SIZES = {
    "tiny": (GPTConfig(seq=64, layers=2, heads=4, dim=64), 8, 1e-3),
    "gpt2": (dataclasses.replace(GPT2_SMALL), 8, 6e-4),  # 12 layers, 12 heads, 768 wide, 1024 tokens
}
CORPUS_GLOBS = ("README.md", "docs/*.md", "kiln/**/*.py", "examples/*.py", "benchmarks/*.py")


# ---------------------------------------------------------------------------- data
def build_corpus(root: str = ROOT, max_chars: int | None = None) -> str:
    """The project's own text: docs first, then the sources, each file once, in sorted order.
    Only printable ASCII and newlines are kept, so the vocabulary stays under 100 symbols."""
    paths = []
    for pattern in CORPUS_GLOBS:
        paths += sorted(glob.glob(os.path.join(root, pattern), recursive=True))
    seen, parts = set(), []
    for path in paths:
        if path in seen or not os.path.isfile(path):
            continue
        seen.add(path)
        with open(path, encoding="utf-8", errors="replace") as f:
            text = f.read()
        parts.append("".join(c for c in text if c == "\n" or " " <= c <= "~"))
        if max_chars is not None and sum(map(len, parts)) >= max_chars:
            break
    text = "\n".join(parts)
    if len(text) < 1000:
        raise RuntimeError(f"the corpus under {root} has only {len(text)} characters")
    return text[:max_chars] if max_chars else text


class CharData:
    """A character vocabulary over a corpus, and batches of random windows from it."""

    def __init__(self, text: str):
        self.chars = sorted(set(text))
        self.index = {c: i for i, c in enumerate(self.chars)}
        self.data = torch.tensor([self.index[c] for c in text], dtype=torch.long)

    @property
    def vocab(self) -> int:
        return len(self.chars)

    def encode(self, s: str) -> torch.Tensor:
        return torch.tensor([self.index[c] for c in s], dtype=torch.long)

    def decode(self, ids) -> str:
        return "".join(self.chars[int(i)] for i in ids)

    def batches(self, n: int, batch: int, seq: int, seed: int = 0, device="cpu") -> list:
        """``n`` (inputs, targets) pairs: windows of seq+1 characters at random offsets."""
        if len(self.data) <= seq + 1:
            raise ValueError(f"corpus of {len(self.data)} characters is shorter than a window of {seq + 1}")
        g = torch.Generator().manual_seed(seed)
        starts = torch.randint(0, len(self.data) - seq - 1, (n, batch), generator=g)
        windows = self.data[starts[..., None] + torch.arange(seq + 1)]
        return [(w[:, :-1].to(device), w[:, 1:].to(device)) for w in windows]


# ---------------------------------------------------------------------------- progress display
class Progress:
    """A progress bar on a terminal (rewritten in place); plain lines every tenth of the run
    otherwise (logs, CI)."""

    def __init__(self, name: str, total: int, stream=None, width: int = 24):
        self.name, self.total, self.width = name, total, width
        self.stream = stream or sys.stderr
        self.tty = hasattr(self.stream, "isatty") and self.stream.isatty()
        self.every = max(1, total // 10)

    def update(self, step: int, loss: float, tokens_per_s: float):
        done = step / self.total
        rate = f"{tokens_per_s / 1e3:.1f}k tok/s" if tokens_per_s else "compiling"
        if self.tty:
            filled = int(done * self.width)
            bar = "#" * filled + "." * (self.width - filled)
            self.stream.write(f"\r{self.name:>6} [{bar}] {step:>5}/{self.total} loss {loss:7.4f} {rate:>16}")
            if step == self.total:
                self.stream.write("\n")
            self.stream.flush()
        elif step % self.every == 0 or step == self.total or step == 1:
            print(f"{self.name:>6} step {step:>5}/{self.total} loss {loss:.4f} {rate}", file=self.stream,
                  flush=True)


# ---------------------------------------------------------------------------- training
def _sync(device: torch.device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def lr_at(step: int, steps: int, lr: float) -> float:
    """nanoGPT's schedule: a linear warm-up over the first tenth of the run, then a cosine decay to
    a tenth of ``lr``. Without the warm-up, GPT-2 small in bf16 spikes in its first steps (loss 5
    -> 8 at step 3), and a spike amplifies the rounding differences of any two correct runs."""
    warmup = max(1, steps // 10)
    if step <= warmup:
        return lr * step / warmup
    t = (step - warmup) / max(1, steps - warmup)
    return lr * (0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * t)))


def train(name: str, model, batches: list, lr: float, device: torch.device, quiet: bool = False) -> dict:
    """AdamW steps over ``batches`` (clipped gradients, warm-up and cosine decay); returns the
    losses, the steady tokens/s and step times."""
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.1, betas=(0.9, 0.95))
    progress = None if quiet else Progress(name, len(batches))
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    losses, times = [], []
    tokens = batches[0][0].numel()
    for step, (x, y) in enumerate(batches, 1):
        _sync(device)
        t0 = time.perf_counter()
        loss = model(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        for group in opt.param_groups:
            group["lr"] = lr_at(step, len(batches), lr)
        opt.step()
        opt.zero_grad(set_to_none=True)
        value = loss.item()  # synchronizes
        times.append(time.perf_counter() - t0)
        losses.append(value)
        steady = times[1:][-20:]  # the first step compiles
        rate = tokens * len(steady) / sum(steady) if steady else 0.0
        if progress is not None:
            progress.update(step, value, rate)
    steady = sorted(times[1:]) or times
    step_s = steady[len(steady) // 2]
    peak = torch.cuda.max_memory_allocated() if device.type == "cuda" else None
    return {"name": name, "losses": losses, "first_step_s": times[0], "step_s": step_s,
            "tokens_per_s": tokens / step_s, "peak_memory_bytes": peak}


def compare(eager: list, kiln_losses: list, rtol: float, atol: float) -> float:
    """The largest |kiln - eager| over the curve, after checking it is within tolerance."""
    worst = 0.0
    for i, (a, b) in enumerate(zip(kiln_losses, eager)):
        if not (math.isfinite(a) and abs(a - b) <= atol + rtol * abs(b)):
            raise AssertionError(f"step {i + 1}: kiln loss {a:.6f} vs eager {b:.6f} "
                                 f"(rtol {rtol}, atol {atol})")
        worst = max(worst, abs(a - b))
    return worst


def run(device: str = "cpu", size: str = "tiny", steps: int = 50, out: str | None = "loss.png",
        lr: float | None = None, seed: int = 0, dtype: str | None = None, quiet: bool = False,
        rtol: float | None = None, atol: float | None = None, max_chars: int | None = None) -> dict:
    """Train eager and kiln from the same initial weights on the same batches; returns a summary
    with both loss curves, tokens/s, kiln's graph-break count and the plot's path."""
    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: no CUDA device here")
    dt = getattr(torch, dtype) if dtype else (torch.bfloat16 if dev.type == "cuda" else torch.float32)
    base_cfg, batch, default_lr = SIZES[size]
    lr = lr or default_lr
    data = CharData(build_corpus(max_chars=max_chars))
    # the vocabulary rounded up to a multiple of 64 keeps the LM-head GEMM aligned
    cfg = dataclasses.replace(base_cfg, vocab=-(-data.vocab // 64) * 64, dropout=0.0)
    batches = data.batches(steps, batch, cfg.seq, seed=seed + 1, device=dev)
    torch.manual_seed(seed)
    init = GPT(cfg).to(device=dev, dtype=dt)
    nparams = sum(p.numel() for p in init.parameters())
    if not quiet:
        print(f"corpus: {len(data.data):,} characters, vocabulary {data.vocab}; model: {cfg.layers} layers, "
              f"{cfg.dim} wide, {nparams / 1e6:.2f}M parameters, {dt}; batch {batch} x {cfg.seq} tokens; "
              f"{steps} AdamW steps on {dev}", file=sys.stderr)

    eager_model = copy.deepcopy(init)
    eager = train("eager", eager_model, batches, lr, dev, quiet)
    kiln.reset()
    kiln_model = kiln.compile(copy.deepcopy(init))
    compiled = train("kiln", kiln_model, batches, lr, dev, quiet)
    stats = kiln.stats()

    # fp32 on the CPU tracks eager closely; bf16 rounds differently in fused kernels and drifts
    if rtol is None:
        rtol = 2e-3 if dt == torch.float32 else 5e-2
    if atol is None:
        atol = 2e-3 if dt == torch.float32 else 5e-2
    summary = {
        "device": str(dev), "size": size, "dtype": str(dt), "steps": steps, "batch": batch,
        "seq": cfg.seq, "params": nparams, "vocab": data.vocab,
        "eager": eager, "kiln": compiled,
        "graph_breaks": stats.get("graph_breaks", 0), "fallbacks": stats.get("fallbacks", 0),
        "kernels": stats.get("kernels_generated", 0),
        "speedup": compiled["tokens_per_s"] / eager["tokens_per_s"],
    }
    try:
        summary["max_loss_diff"] = compare(eager["losses"], compiled["losses"], rtol, atol)
        summary["match"] = True
    except AssertionError as e:
        summary["max_loss_diff"] = max(abs(a - b) for a, b in zip(eager["losses"], compiled["losses"]))
        summary["match"] = False
        summary["mismatch"] = str(e)
    if out:
        summary["plot"] = out
        summary["plot_writer"] = plot_lines(out, {"eager": eager["losses"], "kiln": compiled["losses"]},
                                            title=f"GPT {size} on {dev.type}: eager vs kiln",
                                            xlabel="step", ylabel="loss")
    if not quiet:
        _print_summary(summary)
    return summary


def _print_summary(s: dict):
    print(f"\n{'':<8}{'first step':>12}{'step':>12}{'tokens/s':>12}{'peak MB':>10}{'final loss':>12}")
    for r in (s["eager"], s["kiln"]):
        peak = f"{r['peak_memory_bytes'] / 2**20:.0f}" if r["peak_memory_bytes"] else "-"
        print(f"{r['name']:<8}{r['first_step_s']:>11.2f}s{r['step_s'] * 1e3:>10.1f}ms"
              f"{r['tokens_per_s']:>12.0f}{peak:>10}{r['losses'][-1]:>12.4f}")
    print(f"kiln/eager speed: {s['speedup']:.2f}x; graph breaks {s['graph_breaks']}, kernels {s['kernels']}, "
          f"fallbacks {s['fallbacks']}")
    verdict = "match" if s["match"] else f"DIFFER ({s['mismatch']})"
    print(f"loss curves {verdict}: largest difference {s['max_loss_diff']:.2e}; "
          f"first {s['kiln']['losses'][0]:.4f} -> last {s['kiln']['losses'][-1]:.4f}")
    if "plot" in s:
        print(f"plot: {s['plot']} ({s['plot_writer']})")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--size", default="tiny", choices=list(SIZES))
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--out", default="loss.png", help="PNG for the loss curves ('' to skip)")
    p.add_argument("--lr", type=float, help="default: 1e-3 for tiny, 6e-4 for gpt2")
    p.add_argument("--dtype", choices=["float32", "bfloat16", "float16"],
                   help="default: float32 on the CPU, bfloat16 on CUDA")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    s = run(args.device, args.size, args.steps, args.out or None, args.lr, args.seed, args.dtype)
    return 0 if s["match"] and s["kiln"]["losses"][-1] < s["kiln"]["losses"][0] else 1


if __name__ == "__main__":
    sys.exit(main())
