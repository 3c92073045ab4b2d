"""kiln's graphs and breaks over many transformers families (decoders, encoders,
encoder-decoders, audio and vision models), from tiny configs built by ``AutoConfig.for_model``
(random weights; ``benchmarks/family_configs.py``), against eager and, with ``--dynamo``,
Dynamo's own count (``torch._dynamo.explain``, the peer's figure).

    python -m benchmarks.family_sweep                      # every family, inference
    python -m benchmarks.family_sweep --train --dynamo     # a training step, and Dynamo's counts
    python -m benchmarks.family_sweep --families bloom,t5,vit --mode both

Inference runs under ``no_grad`` in eval mode. Training runs in train mode: a loss from the first
floating output, then ``backward()``. The graphs and breaks of training come from the model as
configured, dropout on; the comparison with eager from the same model with every dropout
probability of its config set to 0 (still in train mode), since dropout's draws differ between
any two runs. A family whose tiny config the library refuses is listed as "config" and skipped.
One line per family and mode: graphs and breaks from ``kiln.explain``, whether the output (and in
training the loss and every gradient) matches eager, Dynamo's graphs/breaks (with kiln's counted
Dynamo's way beside them: graphs with an op, breaks as graphs minus one), the first break reasons.
"""
from __future__ import annotations

import argparse
import importlib
import subprocess
import sys
import warnings

import torch

import kiln
from benchmarks.family_configs import ALL, build

TOL = 1e-3


def first_float(out):
    """The first floating tensor of a model's output (``ModelOutput`` fields in order)."""
    values = [out] if torch.is_tensor(out) else (out.values() if isinstance(out, dict) else out)
    for v in values:
        if torch.is_tensor(v) and v.is_floating_point():
            return v
    raise ValueError("no floating output")


def loss_of(out):
    """A scalar every element of the first floating output feeds, each with its own weight (a
    plain sum of a normalized output has a zero gradient)."""
    t = first_float(out).float()
    return (t * torch.linspace(0.5, 1.5, t.numel()).view(t.shape)).sum()


def _grads_close(model, want, wide=None):
    """Whether every gradient is within TOL of eager's (relative to its size). With ``wide``
    (float64 eager gradients), a gradient outside that is still accepted where its error
    against float64 is at most twice eager's own fp32 error: a model whose fp32 gradients are
    ill-conditioned (train-mode batch norms over a batch of 2) rounds as freely in eager."""
    worst = 0.0
    for (name, p), w, ref in zip(model.named_parameters(), want, wide or [None] * len(want)):
        if w is None or p.grad is None:
            if (w is None) != (p.grad is None or not p.grad.any()):
                return False, f"{name}: gradient present in one run only"
            continue
        scale = max(1.0, w.abs().max().item())
        err = (p.grad - w).abs().max().item() / scale
        worst = max(worst, err)
        if err <= TOL:
            continue
        if ref is not None:
            ours, eager = ((g.double() - ref).abs().max().item() for g in (p.grad, w))
            if ours <= 2 * eager + 1e-5 * max(1.0, ref.abs().max().item()):
                continue
            return False, (f"{name}: max error {err:.2e} of its scale; against float64 "
                           f"{ours:.2e}, eager fp32's {eager:.2e}")
        return False, f"{name}: max error {err:.2e} of its scale"
    return True, f"worst gradient error {worst:.1e}"


def _float64_run(family, step):
    """Eager's loss and gradients of the dropout-free model in float64, its inputs' floats too."""
    model, kwargs = build(family, dropout=False)
    model.double().train()
    kwargs = {k: v.double() if v.is_floating_point() else v for k, v in kwargs.items()}
    loss = step(model, kwargs)
    loss.backward()
    return loss.item(), [None if p.grad is None else p.grad.double() for p in model.parameters()]


def _loss_close(got, want, ref) -> bool:
    """Whether kiln's loss is within TOL of eager's, or (``ref``: the float64 loss) at most
    twice eager's own fp32 error from it: the rule ``_grads_close`` applies to gradients, for a
    model whose fp32 forward is ill-conditioned (LeViT's train-mode batch norms over a batch of
    2: eager -4.7900, kiln -4.7975, float64 -4.8103)."""
    if abs(got - want) <= TOL + TOL * abs(want):
        return True
    return ref is not None and abs(got - ref) <= 2 * abs(want - ref) + 1e-5 * max(1.0, abs(ref))


def _dynamo_counts(fn, kwargs, grad):
    dyn = importlib.import_module("torch._dynamo")  # the peer's figure only
    dyn.reset()
    with torch.set_grad_enabled(grad):
        e = dyn.explain(fn)(**kwargs)
    return f"  dynamo={e.graph_count}/{e.graph_break_count}"


def _like_dynamo(out):
    """kiln's figure counted as ``torch._dynamo.explain`` counts: only graphs with an op in them
    (Dynamo compiles none without a call; kiln counts a resume function's tail that only
    returns values, and a break whose prefix computes nothing is a break), and breaks as graphs
    minus one (Dynamo's ``graph_break_count``)."""
    n = sum(1 for g in out.graphs if g.ops_count() > 0)
    return f" (as dynamo counts: {n}/{n - 1})"


def _reasons(out):
    return list(dict.fromkeys(str(r)[:160] for r in out.break_reasons))[:2]


def sweep_inference(family, dynamo=False, backend="kiln"):
    model, kwargs = build(family)
    model.eval()
    kiln.reset()
    with torch.no_grad():
        want = first_float(model(**kwargs))
        out = kiln.explain(model, backend=backend)(**kwargs)
    ok = torch.allclose(first_float(out.result), want, rtol=TOL, atol=TOL)
    line = (f"{family:20s} infer graphs={out.graph_count:<3d} breaks={out.graph_break_count:<3d} "
            f"matches_eager={ok}")
    if dynamo:
        line += _like_dynamo(out) + _dynamo_counts(model, kwargs, grad=False)
    return [line] + [f"    {r}" for r in _reasons(out)]


def sweep_training(family, dynamo=False, backend="kiln"):
    """Counts from the model with dropout on; loss and gradients against eager from the one
    without (train mode both times)."""
    model, kwargs = build(family)
    model.train()

    def step(**kw):
        return loss_of(model(**kw))
    kiln.reset()
    counted = kiln.explain(step, backend=backend)(**kwargs)
    counted.result.backward()  # the backward of the dropout-on graph runs too

    model, kwargs = build(family, dropout=False)
    model.train()
    model.zero_grad(set_to_none=True)
    want_loss = step(**kwargs)
    want_loss.backward()
    want = [None if p.grad is None else p.grad.clone() for p in model.parameters()]
    model.zero_grad(set_to_none=True)
    kiln.reset()
    compared = kiln.explain(step, backend=backend)(**kwargs)
    compared.result.backward()
    got, eager = compared.result.item(), want_loss.item()
    loss_ok = _loss_close(got, eager, None)
    grads_ok, note = _grads_close(model, want)
    if not (loss_ok and grads_ok):
        ref, wide = _float64_run(family, lambda m, kw: loss_of(m(**kw)))
        loss_ok = _loss_close(got, eager, ref)
        grads_ok, note = _grads_close(model, want, wide)
        note += f" (float64 reference; its loss {ref:.6g})"
    line = (f"{family:20s} train graphs={counted.graph_count:<3d} breaks={counted.graph_break_count:<3d} "
            f"matches_eager={loss_ok and grads_ok}")
    if (compared.graph_count, compared.graph_break_count) != (counted.graph_count, counted.graph_break_count):
        line += f" (dropout 0: {compared.graph_count}/{compared.graph_break_count})"
    if dynamo:
        model, kwargs = build(family)
        model.train()
        line += _like_dynamo(counted) + _dynamo_counts(step, kwargs, grad=True)
    notes = [] if loss_ok and grads_ok else [f"    loss {compared.result.item():.6g} vs eager "
                                             f"{want_loss.item():.6g}; {note}"]
    return [line] + notes + [f"    {r}" for r in _reasons(counted)]


def sweep(family, mode="infer", dynamo=False, backend="kiln"):
    """The lines for one family: ``mode`` is "infer", "train" or "both"."""
    lines = []
    for m in (("infer", "train") if mode == "both" else (mode,)):
        run = sweep_training if m == "train" else sweep_inference
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                lines += run(family, dynamo, backend)
        except Exception as e:  # noqa: BLE001 - one family's failure is a line, not the end
            what = "config" if _refused_config(e) else "error"
            lines.append(f"{family:20s} {m:5s} {what} ({type(e).__name__}: {str(e)[:120]})")
    return "\n".join(lines)


def _refused_config(e):
    """Whether the exception left through ``family_configs.build`` (the library refused the tiny
    config), not through the model's call or kiln."""
    tb = e.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code.co_filename.endswith("family_configs.py"):
            return True
        tb = tb.tb_next
    return False


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m benchmarks.family_sweep", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--families", default=ALL)
    p.add_argument("--train", action="store_true", help="a training step instead of inference")
    p.add_argument("--mode", choices=("infer", "train", "both"), default=None,
                   help="infer (default), train (same as --train) or both")
    p.add_argument("--dynamo", action="store_true", help="also Dynamo's graphs/breaks")
    p.add_argument("--backend", default="kiln", help="kiln (kernels) or aot_eager/eager (capture only)")
    args = p.parse_args(argv)
    mode = args.mode or ("train" if args.train else "infer")
    import transformers
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                                text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        commit = "unknown"
    print(f"# transformers {transformers.__version__}, torch {torch.__version__}, "
          f"Python {sys.version.split()[0]}, kiln commit {commit}, mode {mode}, backend {args.backend}",
          flush=True)
    for family in args.families.split(","):
        print(sweep(family, mode, args.dynamo, args.backend), flush=True)


if __name__ == "__main__":
    main()
