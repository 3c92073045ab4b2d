"""Training steps of small building blocks, eager, torch.compile and kiln side by side in one
process: forward + backward of a conv + batch norm + ReLU, a cross-entropy over wide rows, and
a ResNet stem block (conv, BN, ReLU, max-pool, BN, ReLU). Each compiler's gradients are checked
against eager's before anything is timed; the table reports the median step and kiln's ratio
to eager and to torch.compile (>1: kiln faster).

    python -m benchmarks.train_blocks [--device cpu|cuda] [--cases conv_bn_relu,...] [--no-torch-compile]

These are the shapes session 21's CPU fixes were measured on (gcc vectorization of ReLU and bool
stores, what the forward saves for cross-entropy and batch norm, max_pool2d's gradient).
"""
from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
import time

import torch
import torch.nn.functional as F

import kiln


def _conv_bn_relu(device, dtype):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 16, 3, padding=1, bias=False), torch.nn.BatchNorm2d(16),
                                torch.nn.ReLU()).to(device, dtype)
    x = torch.randn(4, 3, 64, 64, device=device, dtype=dtype)
    return model, (x,), lambda out: out.float().square().mean()


def _resnet_stem(device, dtype):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 16, 3, padding=1, bias=False), torch.nn.BatchNorm2d(16),
                                torch.nn.ReLU(), torch.nn.MaxPool2d(3, 2, 1), torch.nn.BatchNorm2d(16),
                                torch.nn.ReLU()).to(device, dtype)
    x = torch.randn(4, 3, 64, 64, device=device, dtype=dtype)
    return model, (x,), lambda out: out.float().square().mean()


class _Logits(torch.nn.Module):
    def __init__(self, rows, classes, device, dtype):
        super().__init__()
        self.x = torch.nn.Parameter(torch.randn(rows, classes, device=device, dtype=dtype))

    def forward(self, target):
        return F.cross_entropy(self.x, target)


def _cross_entropy(device, dtype):
    torch.manual_seed(0)
    rows, classes = (4096, 8192) if device == "cpu" else (8192, 32768)
    model = _Logits(rows, classes, device, dtype)
    target = torch.randint(0, classes, (rows,), device=device)
    return model, (target,), lambda out: out


CASES = {"conv_bn_relu": _conv_bn_relu, "cross_entropy": _cross_entropy, "resnet_stem": _resnet_stem}


def _sync(device):
    if device == "cuda":
        torch.cuda.synchronize()


def _step(model, args, loss_of):
    loss = loss_of(model(*args))
    loss.backward()
    return loss


def _grads(model):
    return [p.grad.detach().clone() for p in model.parameters()]


def _time(fn, device, repeat=7, inner=None):
    fn()
    _sync(device)
    if inner is None:  # enough calls per sample for about 20 ms
        t0 = time.perf_counter()
        fn()
        _sync(device)
        inner = max(1, min(200, int(0.02 / max(time.perf_counter() - t0, 1e-6))))
    samples = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        for _ in range(inner):
            fn()
        _sync(device)
        samples.append((time.perf_counter() - t0) / inner)
    return statistics.median(samples)


def run_case(name, device, dtype, with_tc=True) -> dict:
    model, args, loss_of = CASES[name](device, dtype)
    compilers = {"eager": lambda m: m, "kiln": kiln.compile}
    if with_tc:
        compilers["torch.compile"] = torch.compile
    row = {"case": name, "device": device, "dtype": str(dtype)}
    want = None
    times = {}
    for cname, wrap in compilers.items():
        m = copy.deepcopy(model)
        f = wrap(m)
        for p in m.parameters():
            p.grad = None
        _step(f, args, loss_of)
        grads = _grads(m)
        if want is None:
            want = grads
        else:  # checked before timing: a wrong step is reported, not timed
            tol = 1e-4 if dtype == torch.float32 else 5e-2
            ok = all(float((g.float() - w.float()).abs().max()) <= tol * max(1.0, float(w.float().abs().max()))
                     for g, w in zip(grads, want))
            row[f"{cname}_correct"] = ok
            if not ok:
                continue

        def step(f=f, m=m):
            for p in m.parameters():
                p.grad = None
            _step(f, args, loss_of)
        times[cname] = _time(step, device)
        row[f"{cname}_ms"] = round(times[cname] * 1e3, 4)
    if "kiln" in times:
        row["kiln_vs_eager"] = round(times["eager"] / times["kiln"], 3)
        if "torch.compile" in times:
            row["kiln_vs_torch_compile"] = round(times["torch.compile"] / times["kiln"], 3)
    return row


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--no-torch-compile", action="store_true")
    args = ap.parse_args(argv)
    dtype = getattr(torch, args.dtype)
    print(f"{'case':<14} {'eager':>10} {'t.compile':>10} {'kiln':>10} {'k/eager':>8} {'k/tc':>6}", file=sys.stderr)
    for name in args.cases.split(","):
        row = run_case(name, args.device, dtype, not args.no_torch_compile)
        print(json.dumps(row), flush=True)
        fmt = lambda k: f"{row[k]:9.3f}ms" if k in row else f"{'-':>11}"  # noqa: E731
        print(f"{name:<14} {fmt('eager_ms')} {fmt('torch.compile_ms')} {fmt('kiln_ms')} "
              f"{row.get('kiln_vs_eager', float('nan')):8.2f} {row.get('kiln_vs_torch_compile', float('nan')):6.2f}"
              + ("" if row.get("kiln_correct", True) else "   KILN GRADIENTS DIFFER"), file=sys.stderr, flush=True)


if __name__ == "__main__":
    main()
