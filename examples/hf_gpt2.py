"""transformers' GPT-2 (built from a config, random weights) through kiln.compile: inference and
one SGD training step, each compared with eager (logits; then loss, gradients and parameters
after the step), with graph-break counts from kiln.explain and kiln/eager speed ratios.

The step is SGD with momentum, not AdamW: AdamW's first step moves every parameter by about
lr * g / |g|, so a parameter whose gradient is within rounding of zero moves by anything up to
lr depending on the rounding, and comparing parameters after it would measure rounding, not
the compiler (GPT-2 small on the H200: gradients matched, two such parameters differed by
2.4e-4). The gradients themselves are compared before the step either way.

    python examples/hf_gpt2.py                        # a small GPT-2 on the CPU
    python examples/hf_gpt2.py --size gpt2 --device cuda   # GPT-2 small's shape (124M)

Dropout is off so the two runs compute the same function.
"""
from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import compare  # noqa: E402
from compare import kiln  # noqa: E402

# per --size: (layers, heads, width, vocab, positions, batch, sequence)
SIZES = {
    "tiny": (2, 2, 32, 128, 32, 2, 16),
    "small": (4, 4, 128, 1024, 128, 4, 64),
    "gpt2": (12, 12, 768, 50257, 1024, 8, 1024),
}


def build(size: str, attn: str = "sdpa"):
    import transformers
    layers, heads, width, vocab, positions, batch, seq = SIZES[size]
    cfg = transformers.GPT2Config(n_layer=layers, n_head=heads, n_embd=width, vocab_size=vocab,
                                  n_positions=positions, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                                  bos_token_id=0, eos_token_id=0, attn_implementation=attn)
    model = transformers.GPT2LMHeadModel(cfg)
    # name the loss: left unset, transformers logs a warning from inside the forward on every call
    # (a Python logging call there is a graph break for kiln)
    model.loss_type = "ForCausalLM"
    return model, vocab, batch, seq


def run(size="small", device="cpu", dtype="float32", attn="sdpa", seed=0, quiet=False) -> dict:
    dt = getattr(torch, dtype)
    torch.manual_seed(seed)
    model, vocab, batch, seq = build(size, attn)
    model = model.to(device=device, dtype=dt)
    ids = torch.randint(0, vocab, (batch, seq), device=device)

    results = {}
    kiln.reset()
    inference = compare.compare_inference(model, (ids,), "logits", device)
    inference.update(compare.explain(model, (ids,), train=False))
    results["inference"] = inference
    kiln.reset()
    training = compare.compare_training_step(
        model, (ids,), lambda out: out.loss, lambda params: torch.optim.SGD(params, lr=1e-2, momentum=0.9), device,
        kwargs={"labels": ids})
    training.update(compare.explain(model, (ids,), {"labels": ids}, train=True))
    training["kernels"] = kiln.stats()["kernels_generated"]
    results["train step"] = training
    if not quiet:
        compare.print_report(f"transformers GPT-2 ({size}, attention {attn}) on {device}, {dt}, "
                             f"batch {batch}x{seq}", results)
    return results


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--size", default="small", choices=list(SIZES))
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    p.add_argument("--attn", default="sdpa", choices=["sdpa", "eager"])
    args = p.parse_args(argv)
    r = run(args.size, args.device, args.dtype, args.attn)
    return 0 if all(v["match"] for v in r.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
