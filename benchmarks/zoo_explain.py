"""What kiln makes of a zoo model: graphs, breaks, eager runs, and the torch ops its compiled
call still dispatches (library calls, fallbacks, copies), with the layouts it hands to
convolutions against eager's.

    python -m benchmarks.zoo_explain --models tv_swin_t,tv_convnext_tiny [--mode inference]

A model that is fast in kernels but slow overall usually shows here: an op that runs in torch
(``aten.roll``, ``aten._softmax``) where it should have fused, copies (``aten.copy_``,
``aten.clone``) around library calls, or a convolution fed NCHW where eager feeds NHWC.
"""
from __future__ import annotations

import argparse
import collections
import sys

import torch
from torch.utils._python_dispatch import TorchDispatchMode

import kiln
from benchmarks import zoo, zoo_models


class OpLog(TorchDispatchMode):
    """Counts the aten ops a call dispatches; records convolution input and weight strides."""

    def __init__(self):
        super().__init__()
        self.ops = collections.Counter()
        self.convs = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops[str(func)] += 1
        if func is torch.ops.aten.convolution.default:
            self.convs.append((tuple(args[0].shape), args[0].stride(), args[1].stride()))
        return func(*args, **(kwargs or {}))


def _dispatched(step, inputs):
    log = OpLog()
    with log:
        step(*inputs)
    return log


def _watch_layout_copies():
    """Every copy the wrapper's ``ensure_layout`` makes (a library result laid out otherwise
    than lowering promised): (shape, strides it had, strides promised) -> count."""
    from kiln.inductor.codegen import wrapper
    copies = collections.Counter()
    original = wrapper.ensure_layout

    def ensure_layout(t, shape, stride):
        out = original(t, shape, stride)
        if out.data_ptr() != t.data_ptr():
            copies[(tuple(shape), t.stride(), tuple(stride))] += 1
        return out
    wrapper.ensure_layout = ensure_layout
    return copies, lambda: setattr(wrapper, "ensure_layout", original)


def explain_model(name, mode, device, top):
    case = zoo.Case(name, mode, device, "full" if device == "cuda" else "small", False)
    inputs = case.inputs[0]
    kiln.reset()
    with case.autocast(), torch.set_grad_enabled(case.training):
        out = kiln.explain(case.base)(*inputs)
    print(f"\n== {name} {mode}: {out.graph_count} graphs, {out.graph_break_count} breaks, "
          f"{out.kernel_count} kernels, {out.extern_calls} library calls", file=sys.stderr)
    for b in out.break_reasons[:top]:
        print(f"  break: {b}", file=sys.stderr)
    for r in out.eager_runs[:top]:
        print(f"  eager: {r}", file=sys.stderr)
    kiln.reset()
    copies, restore = _watch_layout_copies()
    try:
        compiled = kiln.compile(case.base)
        k_step = case.step_fn(case.base, compiled)
        e_step = case.step_fn(case.base, case.base)
        k_step(*inputs)
        copies.clear()
        k_log, e_log = _dispatched(k_step, inputs), _dispatched(e_step, inputs)
    finally:
        restore()
    print(f"  library results copied to the promised layout per call: {sum(copies.values())}",
          file=sys.stderr)
    for (shape, have, want), n in copies.most_common(top):
        print(f"    {n:3d}x {shape}: strides {have}, promised {want}", file=sys.stderr)
    print(f"  aten ops per call: kiln {sum(k_log.ops.values())}, eager {sum(e_log.ops.values())}; "
          f"kiln's most frequent:", file=sys.stderr)
    for op, n in k_log.ops.most_common(top):
        print(f"    {n:5d}  {op}   (eager {e_log.ops.get(op, 0)})", file=sys.stderr)
    differ = [(k, e) for k, e in zip(k_log.convs, e_log.convs) if k[1] != e[1]]
    print(f"  convolutions: {len(k_log.convs)} (eager {len(e_log.convs)}), {len(differ)} with an "
          f"input layout other than eager's", file=sys.stderr)
    for k, e in differ[:top]:
        print(f"    {k[0]}: kiln input {k[1]} weight {k[2]}; eager input {e[1]} weight {e[2]}",
              file=sys.stderr)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.zoo_explain", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", required=True)
    p.add_argument("--mode", choices=("inference", "training"), default="inference")
    p.add_argument("--device", choices=("cuda", "cpu"),
                   default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--top", type=int, default=12)
    a = p.parse_args(argv)
    for name in zoo_models.resolve(a.models):
        try:
            explain_model(name, a.mode, a.device, a.top)
        except Exception as e:  # noqa: BLE001 - one model failing must not stop the rest
            print(f"{name}: {type(e).__name__}: {e}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
