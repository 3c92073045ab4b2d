"""Helpers the model examples share: run a model eagerly and through kiln.compile, compare the
results (inference outputs; loss, gradients and parameters after one optimizer step), count
graphs and graph breaks with kiln.explain, and time both for a kiln/eager speed ratio."""
from __future__ import annotations

import copy
import os
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
try:
    import kiln
except ImportError:  # run from a checkout without `pip install -e .`
    sys.path.insert(0, os.path.dirname(HERE))
    import kiln

# (rtol, atol) per dtype for one forward; a training step compares parameters after an update,
# where the update's own rounding adds to the gradient's
TOLERANCES = {torch.float32: (1e-4, 1e-5), torch.float16: (5e-3, 5e-3), torch.bfloat16: (3e-2, 3e-2)}


def tolerance(dtype, step=False):
    rtol, atol = TOLERANCES.get(dtype, (1e-4, 1e-5))
    return (rtol * 10, atol * 10) if step else (rtol, atol)


def _sync(device):
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


class exact_fp32:
    """TF32 off on CUDA (cuDNN convolutions and cuBLAS matmuls) while results are compared:
    TF32 rounds fp32 operands to 10 mantissa bits, differently for each algorithm, so eager
    and compiled runs of one model would differ by far more than fp32 tolerances. Timing runs
    with the user's settings."""

    def __enter__(self):
        self.saved = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
        torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False

    def __exit__(self, *exc):
        torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = self.saved


def median_time(fn, device, repeat=5, warmup=1) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeat):
        _sync(device)
        t0 = time.perf_counter()
        fn()
        _sync(device)
        times.append(time.perf_counter() - t0)
    return sorted(times)[len(times) // 2]


def pick(out, field):
    """A named field of a model output (transformers' ModelOutput), or the output itself."""
    return getattr(out, field) if field else out


def explain(model, args, kwargs=None, train=False) -> dict:
    """Graph and graph-break counts for one call of ``model`` (in train or eval mode, with or
    without gradients to match): where the graphs break does not depend on the backend, so
    kiln.explain runs the captured graphs eagerly here instead of compiling kernels twice."""
    model.train(train)
    with torch.set_grad_enabled(train):
        out = kiln.explain(model, backend="eager")(*args, **(kwargs or {}))
    return {"mode": "train" if train else "eval", "graphs": out.graph_count, "graph_breaks": out.graph_break_count,
            "ops": sum(out.ops_per_graph),  # 0: everything ran eagerly around empty graphs
            "break_reasons": [f"{os.path.basename(b.filename)}:{b.lineno}: {b.reason}" for b in out.break_reasons]}


def compare_inference(model, args, field=None, device="cpu", repeat=5, kwargs=None) -> dict:
    """eval() and no_grad: the compiled output against eager's, and both timed."""
    model = model.eval()
    compiled = kiln.compile(model)
    kwargs = kwargs or {}
    with torch.no_grad():
        with exact_fp32():
            want = pick(model(*args, **kwargs), field)
            got = pick(compiled(*args, **kwargs), field)  # compiles
        rtol, atol = tolerance(want.dtype)
        err = _difference(got, want, rtol, atol)
        eager_s = median_time(lambda: model(*args, **kwargs), device, repeat)
        kiln_s = median_time(lambda: compiled(*args, **kwargs), device, repeat)
    return {"max_abs_diff": err[0], "match": err[1], "eager_ms": eager_s * 1e3, "kiln_ms": kiln_s * 1e3,
            "speedup": eager_s / kiln_s}


def compare_training_step(model, args, loss_of, make_opt, device="cpu", repeat=3, kwargs=None) -> dict:
    """One optimizer step from the same weights, eager and compiled: the losses, the gradients,
    then the parameters and buffers after the step must agree. Then a few more steps of each
    are timed (after the comparison, on their own copies).

    Some models' gradients are not a well-conditioned function of their inputs in fp32: in a
    ResNet trained with batch norm, a ReLU whose input lies within rounding of zero passes or
    stops a whole gradient element, so nudging eager's own weights by one ulp moves some of
    its gradients by ~1e-2 (torchvision's ResNet-18 at 224x224 on the H200). Where the
    elementwise check fails, each failing tensor is held instead to that measured noise floor:
    kiln's distance from eager (in norm) must stay within ``SENSITIVITY_FACTOR`` times the
    largest distance between eager and eager with its weights nudged by one ulp (two nudges).
    The report says which tensors matched that way."""
    model = model.train()
    pristine = copy.deepcopy(model)
    eager_model, kiln_model = copy.deepcopy(model), copy.deepcopy(model)
    compiled = kiln.compile(kiln_model)
    kwargs = kwargs or {}

    def step(m, opt):
        loss = loss_of(m(*args, **kwargs))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=False)
        return loss

    def one_step(m, params_of):
        """loss, gradients, and the optimizer after one step (compared with TF32 off)"""
        opt = make_opt(params_of.parameters())
        with exact_fp32():
            loss = loss_of(m(*args, **kwargs))
            loss.backward()
        grads = [None if p.grad is None else p.grad.clone() for p in params_of.parameters()]
        opt.step()
        opt.zero_grad(set_to_none=False)
        return loss.detach(), grads, opt

    want_loss, want_grads, eager_opt = one_step(eager_model, eager_model)
    got_loss, got_grads, kiln_opt = one_step(compiled, kiln_model)
    dtype = want_loss.dtype
    rtol, atol = tolerance(dtype, step=True)
    pairs = {"loss": (got_loss, want_loss, rtol, atol)}
    names = [n for n, _ in kiln_model.named_parameters()]
    for n, g, w in zip(names, got_grads, want_grads):
        if (g is None) != (w is None):
            pairs[f"grad {n}"] = None
        elif g is not None:
            pairs[f"grad {n}"] = (g, w, rtol, atol * max(1.0, float(w.abs().max())))
    for (n, p), q in zip(kiln_model.named_parameters(), eager_model.parameters()):
        pairs[f"param {n}"] = (p.detach(), q.detach(), rtol, atol)
    for (n, b), c in zip(kiln_model.named_buffers(), eager_model.buffers()):
        if b.is_floating_point() or b.dtype == torch.long:
            pairs[f"buffer {n}"] = (b, c, rtol, atol)
    checks = {k: (float("inf"), False) if v is None else _difference(*v) for k, v in pairs.items()}
    bad = [k for k, (_, ok) in checks.items() if not ok]
    within_noise = []
    if bad and all(pairs[k] is not None for k in bad):
        noise = _rounding_noise(pristine, one_step, pairs, bad)
        within_noise = [k for k in bad if _norm_diff(pairs[k][0], pairs[k][1]) <= SENSITIVITY_FACTOR * noise[k]]
        bad = [k for k in bad if k not in within_noise]
    eager_s = median_time(lambda: step(eager_model, eager_opt), device, repeat)
    kiln_s = median_time(lambda: step(compiled, kiln_opt), device, repeat)
    return {"loss": float(want_loss), "max_abs_diff": max(d for d, _ in checks.values()),
            "checked": len(checks), "mismatches": bad, "match": not bad,
            "within_rounding_noise": within_noise,
            "eager_ms": eager_s * 1e3, "kiln_ms": kiln_s * 1e3, "speedup": eager_s / kiln_s}


# kiln's distance from eager may be this many times eager's own distance under a one-ulp nudge
SENSITIVITY_FACTOR = 4.0


def _norm_diff(a, b) -> float:
    return float((a.detach().double() - b.detach().double()).norm())


def _rounding_noise(model, one_step, pairs, keys, nudges=2) -> dict:
    """Per compared tensor, the largest norm distance between eager's step and eager's step
    with every floating weight multiplied by (1 +- 2**-mantissa), a one-ulp nudge."""
    noise = dict.fromkeys(keys, 0.0)
    for seed in range(nudges):
        nudged = copy.deepcopy(model)
        gen = torch.Generator().manual_seed(1234 + seed)
        with torch.no_grad():
            for p in nudged.parameters():
                if p.is_floating_point():
                    ulp = torch.finfo(p.dtype).eps
                    sign = torch.randint(0, 2, p.shape, generator=gen).to(p.device, p.dtype) * 2 - 1
                    p.mul_(1 + ulp * sign)
        loss, grads, _ = one_step(nudged, nudged)
        got = {"loss": loss}
        names = [n for n, _ in nudged.named_parameters()]
        for n, g in zip(names, grads):
            got[f"grad {n}"] = g
        for n, p in nudged.named_parameters():
            got[f"param {n}"] = p.detach()
        for n, b in nudged.named_buffers():
            got[f"buffer {n}"] = b
        for k in keys:
            if got.get(k) is not None:
                noise[k] = max(noise[k], _norm_diff(got[k], pairs[k][1]))
    return noise


def _difference(got, want, rtol, atol) -> tuple[float, bool]:
    got, want = got.detach().double(), want.detach().double()
    if got.shape != want.shape:
        return float("inf"), False
    diff = (got - want).abs()
    ok = bool((diff <= atol + rtol * want.abs()).all()) and bool(torch.isfinite(got).all() == torch.isfinite(want).all())
    return float(diff.max()) if diff.numel() else 0.0, ok


def print_report(title: str, results: dict):
    """results: {"inference": ..., "train step": ...}, each a comparison merged with the
    explain counts of that mode."""
    print(f"== {title}")
    for name, r in results.items():
        verdict = "matches eager" if r["match"] else f"DIFFERS from eager {r.get('mismatches', '')}"
        if r["match"] and r.get("within_rounding_noise"):
            verdict += (f" ({len(r['within_rounding_noise'])} tensor(s) within {SENSITIVITY_FACTOR:g}x of eager's own "
                        f"change under a one-ulp nudge of its weights, not elementwise)")
        print(f"   {name:<11} {verdict} (largest difference {r['max_abs_diff']:.2e}); "
              f"{r['graphs']} graph(s) of {r['ops']} ops, {r['graph_breaks']} graph break(s)"
              + (f", {r['kernels']} kernels" if "kernels" in r else "")
              + f"; eager {r['eager_ms']:.2f} ms, "
              f"kiln {r['kiln_ms']:.2f} ms: kiln/eager speed {r['speedup']:.2f}x")
        for reason in r["break_reasons"]:
            print(f"               break: {reason}")
