"""A ResNet through kiln.compile: inference and one SGD training step, each compared with eager
(outputs; then loss, gradients, parameters and batch-norm running stats after the step), with
graph-break counts from kiln.explain and kiln/eager speed ratios.

    python examples/resnet.py                        # transformers ResNet, small config, CPU
    python examples/resnet.py --arch torchvision --device cuda --size full   # ResNet-18

The model is torchvision's resnet18 when ``--arch torchvision`` (or ``auto`` and torchvision
imports), else transformers' ResNet built from a config; weights are random either way.
"""
from __future__ import annotations

import argparse
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import compare  # noqa: E402
from compare import kiln  # noqa: E402

# transformers ResNet configs per --size: (hidden sizes, depths, embedding size, image size, batch)
SIZES = {
    "tiny": ([8, 16], [1, 1], 8, 32, 2),
    "small": ([16, 32, 64, 128], [1, 1, 1, 1], 16, 64, 4),
    "full": ([64, 128, 256, 512], [2, 2, 2, 2], 64, 224, 8),  # ResNet-18's shape
}
NUM_LABELS = 10


def _torchvision_available() -> bool:
    try:
        import torchvision  # noqa: F401
        return True
    except Exception:  # noqa: BLE001
        return False


def build(arch: str, size: str):
    """(model, field of its output holding the logits, image size, batch)."""
    hidden, depths, embed, image, batch = SIZES[size]
    if arch == "auto":
        arch = "torchvision" if _torchvision_available() else "transformers"
    if arch == "torchvision":
        import torchvision
        return torchvision.models.resnet18(num_classes=NUM_LABELS), None, image, batch, "torchvision resnet18"
    import transformers
    cfg = transformers.ResNetConfig(num_channels=3, embedding_size=embed, hidden_sizes=hidden, depths=depths,
                                    layer_type="basic", num_labels=NUM_LABELS)
    return transformers.ResNetForImageClassification(cfg), "logits", image, batch, f"transformers ResNet ({size})"


def run(arch="auto", size="small", device="cpu", dtype="float32", seed=0, quiet=False) -> dict:
    dt = getattr(torch, dtype)
    torch.manual_seed(seed)
    model, field, image, batch, title = build(arch, size)
    model = model.to(device=device, dtype=dt)
    images = torch.randn(batch, 3, image, image, device=device, dtype=dt)
    labels = torch.randint(0, NUM_LABELS, (batch,), device=device)

    results = {}
    kiln.reset()
    inference = compare.compare_inference(model, (images,), field, device)
    inference.update(compare.explain(model, (images,), train=False))
    results["inference"] = inference
    kiln.reset()
    training = compare.compare_training_step(
        model, (images,), lambda out: F.cross_entropy(compare.pick(out, field), labels),
        lambda params: torch.optim.SGD(params, lr=0.1, momentum=0.9), device)
    training.update(compare.explain(model, (images,), train=True))
    training["kernels"] = kiln.stats()["kernels_generated"]
    results["train step"] = training
    if not quiet:
        compare.print_report(f"{title} on {device}, {dt}, batch {batch}x3x{image}x{image}", results)
    return results


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--arch", default="auto", choices=["auto", "transformers", "torchvision"])
    p.add_argument("--size", default="small", choices=list(SIZES))
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    args = p.parse_args(argv)
    r = run(args.arch, args.size, args.device, args.dtype)
    return 0 if all(v["match"] for v in r.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
