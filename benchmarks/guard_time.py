"""The per-call cost of kiln's guard functions on a deep conv net, measured without a GPU.

    python -m benchmarks.guard_time              # a transformers ResNet of ResNet-50's depth
    python -m benchmarks.guard_time --calls 5000 --show

Builds ``ResNetForImageClassification`` (bottleneck blocks, depths 3-4-6-3, small widths:
the guard checks modules and parameters, whose count is ResNet-50's, not their sizes),
compiles it, and times each cache entry's guard on the call's own locals (timeit, best of 5).
``--show`` prints the generated guard source.
"""
from __future__ import annotations

import argparse
import inspect
import timeit

import torch

import kiln
from kiln import api


def build():
    from transformers import ResNetConfig, ResNetForImageClassification
    cfg = ResNetConfig(embedding_size=16, hidden_sizes=[16, 32, 64, 128], depths=[3, 4, 6, 3],
                       layer_type="bottleneck", num_labels=10)
    return ResNetForImageClassification(cfg).eval(), {"pixel_values": torch.randn(1, 3, 32, 32)}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--calls", type=int, default=2000)
    p.add_argument("--show", action="store_true")
    args = p.parse_args(argv)
    model, kwargs = build()
    compiled = kiln.compile(model)
    with torch.no_grad():
        compiled(**kwargs)
    fn = compiled._compiled_forward
    bound = inspect.ismethod(fn.fn)
    L = api.frame_locals(fn.fn, () if bound else (model,), kwargs)
    for entry in fn.cache.entries:
        guard = entry.guard_fn
        assert guard(L, fn.globals), "the guard fails on the call it was compiled for"
        best = min(timeit.repeat(lambda: guard(L, fn.globals), number=args.calls, repeat=5)) / args.calls
        source = entry.capture.guard_source
        print(f"{fn.name}: guard {best * 1e6:.1f} us per call, {len(source.splitlines())} lines, "
              f"{source.count('torch.nn.Parameter')} parameter checks")
        if args.show:
            print(source)


if __name__ == "__main__":
    main()
