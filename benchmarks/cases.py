"""The benchmark cases. Adding one is one small function registered with ``@case``.

A case function takes (device, quick) and returns a list of Setups, one per size. A Setup holds
the program (a function or an nn.Module), a maker of fresh random inputs, and how to check it.
"""
from __future__ import annotations

import dataclasses
from typing import Callable, Optional

import torch

CASES: dict[str, Callable[[str, bool], list["Setup"]]] = {}


@dataclasses.dataclass
class Setup:
    fn: Callable                       # a function or an nn.Module, run as fn(*inputs)
    make_inputs: Callable[[], tuple]   # fresh random inputs on the device (never zeros)
    dtype: torch.dtype
    rtol: Optional[float] = None       # None: torch.testing.assert_close's defaults for dtype
    atol: Optional[float] = None
    no_grad: bool = False              # run every phase under torch.no_grad()
    overhead: bool = False             # report microseconds per call too
    flops: Optional[int] = None        # floating-point operations per call, when worth reporting
    label: str = ""                    # free-form note shown in the record


def case(name: str):
    def register(fn):
        CASES[name] = fn
        return fn
    return register


def _randn(shape, device, dtype):
    return torch.randn(shape, device=device, dtype=torch.float32).to(dtype)


# ----------------------------------------------------------------------------- programs
def transform(x, bias):
    return torch.relu(x + bias) * 2


class LinearBiasRelu(torch.nn.Module):
    def __init__(self, features: int):
        super().__init__()
        self.linear = torch.nn.Linear(features, features)
        self.bias = torch.nn.Parameter(torch.randn(features))

    def forward(self, x):
        return torch.relu(self.linear(x) + self.bias) * 2


# ----------------------------------------------------------------------------- cases
def _seed_setups(sizes, device, dtype):
    out = []
    for n in sizes:
        out.append(Setup(
            fn=transform,
            make_inputs=lambda n=n: (_randn((n, n), device, dtype), _randn((n,), device, dtype)),
            dtype=dtype))
    return out


@case("seed")
def seed(device: str, quick: bool) -> list[Setup]:
    if quick:
        sizes = [256]
    elif device == "cuda":
        sizes = [1024, 8192]
    else:
        sizes = [1024, 2048]
    return _seed_setups(sizes, device, torch.float32)


@case("seed_bf16")
def seed_bf16(device: str, quick: bool) -> list[Setup]:
    if quick:
        sizes = [256]
    elif device == "cuda":
        sizes = [8192]
    else:
        sizes = [1024]
    return _seed_setups(sizes, device, torch.bfloat16)


@case("linear")
def linear(device: str, quick: bool) -> list[Setup]:
    if quick:
        shape = (2, 8, 32)
    elif device == "cuda":
        shape = (8, 512, 1024)
    else:
        shape = (4, 64, 256)
    feat = shape[-1]
    torch.manual_seed(0)
    mod = LinearBiasRelu(feat).to(device)
    rows = shape[0] * shape[1]
    return [Setup(
        fn=mod,
        make_inputs=lambda: (_randn(shape, device, torch.float32),),
        dtype=torch.float32,
        # The matmul may accumulate in another order (or fuse the bias in cuBLAS' epilogue).
        rtol=1e-4, atol=1e-4,
        no_grad=True,
        flops=2 * rows * feat * feat,
        label=f"Linear({feat}->{feat})")]


@case("overhead")
def overhead(device: str, quick: bool) -> list[Setup]:
    return [Setup(
        fn=transform,
        make_inputs=lambda: (_randn((8,), device, torch.float32), _randn((8,), device, torch.float32)),
        dtype=torch.float32,
        overhead=True,
        label="per-call overhead, 8 elements")]


def four_args(a, b, c, d):
    return a * b + c - d


@case("overhead_4args")
def overhead_4args(device: str, quick: bool) -> list[Setup]:
    """A cache hit on a function of 4 tensor arguments: guard evaluation plus dispatch (the
    kernel is one tiny pointwise op), reported in microseconds for eager, torch.compile and
    kiln in one run."""
    return [Setup(
        fn=four_args,
        make_inputs=lambda: tuple(_randn((8,), device, torch.float32) for _ in range(4)),
        dtype=torch.float32,
        overhead=True,
        label="per-call overhead, 4 tensor args of 8 elements")]


def _rows(device, quick, big=(8192, 4096), small=(512, 1024), tiny=(16, 64)):
    return tiny if quick else (big if device == "cuda" else small)


@case("softmax")
def softmax(device: str, quick: bool) -> list[Setup]:
    shape = _rows(device, quick)
    return [Setup(fn=lambda x: torch.softmax(x, -1), dtype=dt,
                  make_inputs=lambda dt=dt: (_randn(shape, device, dt),), label=f"softmax {list(shape)}")
            for dt in (torch.float32, torch.bfloat16)]


@case("layer_norm")
def layer_norm(device: str, quick: bool) -> list[Setup]:
    shape = _rows(device, quick)
    n = shape[-1]

    def ln(x, w, b):
        return torch.nn.functional.layer_norm(x, (n,), w, b)
    return [Setup(fn=ln, dtype=dt, rtol=2e-2 if dt == torch.bfloat16 else 1e-4, atol=2e-2 if dt == torch.bfloat16 else 1e-4,
                  make_inputs=lambda dt=dt: (_randn(shape, device, dt), _randn((n,), device, dt), _randn((n,), device, dt)),
                  label=f"layer_norm {list(shape)}")
            for dt in (torch.float32, torch.bfloat16)]


@case("cross_entropy")
def cross_entropy(device: str, quick: bool) -> list[Setup]:
    rows, vocab = (16, 64) if quick else ((8192, 32768) if device == "cuda" else (256, 4096))

    def ce(logits, target):
        return torch.nn.functional.cross_entropy(logits, target)
    return [Setup(fn=ce, dtype=torch.float32, rtol=1e-4, atol=1e-4, no_grad=True,
                  make_inputs=lambda: (_randn((rows, vocab), device, torch.float32),
                                       torch.randint(0, vocab, (rows,), device=device)),
                  label=f"cross_entropy [{rows}, {vocab}]")]


@case("gelu_mlp")
def gelu_mlp(device: str, quick: bool) -> list[Setup]:
    shape = (2, 8, 32) if quick else ((8, 1024, 768) if device == "cuda" else (2, 64, 128))
    torch.manual_seed(0)
    mlp = torch.nn.Sequential(torch.nn.Linear(shape[-1], 4 * shape[-1]), torch.nn.GELU(approximate="tanh"),
                              torch.nn.Linear(4 * shape[-1], shape[-1])).to(device)
    return [Setup(fn=mlp, dtype=torch.float32, rtol=1e-3, atol=1e-3, no_grad=True,
                  make_inputs=lambda: (_randn(shape, device, torch.float32),), label=f"MLP {list(shape)}")]


@case("rms_norm")
def rms_norm(device: str, quick: bool) -> list[Setup]:
    shape = _rows(device, quick)
    n = shape[-1]

    def rms(x, w):
        return torch.nn.functional.rms_norm(x, (n,), w, 1e-6)
    return [Setup(fn=rms, dtype=dt, rtol=2e-2 if dt == torch.bfloat16 else 1e-4, atol=2e-2 if dt == torch.bfloat16 else 1e-4,
                  make_inputs=lambda dt=dt: (_randn(shape, device, dt), _randn((n,), device, dt)),
                  label=f"rms_norm {list(shape)}")
            for dt in (torch.float32, torch.bfloat16)]


@case("gelu_chain")
def gelu_chain(device: str, quick: bool) -> list[Setup]:
    """A memory-bound pointwise chain: bias add, tanh-GELU, residual add (one kernel)."""
    shape = _rows(device, quick)
    n = shape[-1]

    def chain(x, b, r):
        return torch.nn.functional.gelu(x + b, approximate="tanh") + r
    return [Setup(fn=chain, dtype=dt, rtol=2e-2 if dt == torch.bfloat16 else 1e-5, atol=2e-2 if dt == torch.bfloat16 else 1e-5,
                  make_inputs=lambda dt=dt: (_randn(shape, device, dt), _randn((n,), device, dt), _randn(shape, device, dt)),
                  label=f"gelu(x + b) + r {list(shape)}")
            for dt in (torch.float32, torch.bfloat16)]


@case("gpt2_forward")
def gpt2_forward(device: str, quick: bool) -> list[Setup]:
    """GPT-2 small forward with its loss (examples/gpt.py), bf16, batch 8, sequence 1024 on CUDA;
    a small config on the CPU."""
    import os
    import sys
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples"))
    from gpt import GPT, GPT2_SMALL, GPTConfig, TINY, counting_batches
    if quick:
        cfg, batch, dtype = TINY, 2, torch.float32
    elif device == "cuda":
        cfg, batch, dtype = GPT2_SMALL, 8, torch.bfloat16
    else:
        cfg, batch, dtype = GPTConfig(vocab=512, seq=128, layers=2, heads=4, dim=128), 2, torch.float32
    torch.manual_seed(0)
    model = GPT(cfg).to(device).to(dtype).eval()
    data = counting_batches(4, batch, cfg, device=device)
    pick = iter(range(1 << 30))
    return [Setup(fn=model, dtype=dtype, rtol=3e-2, atol=3e-2, no_grad=True,
                  make_inputs=lambda: data[next(pick) % len(data)],
                  label=f"GPT {cfg.layers} layers, dim {cfg.dim}, batch {batch}, seq {cfg.seq}, {dtype}")]


@case("sum_all")
def sum_all(device: str, quick: bool) -> list[Setup]:
    """A full reduction over few rows: split in two stages (kiln/inductor/lowering.split_plan)."""
    shape = (64, 64) if quick else ((8192, 8192) if device == "cuda" else (2048, 2048))
    return [Setup(fn=lambda x: x.sum(), dtype=torch.float32, rtol=1e-3, atol=1e-2,
                  make_inputs=lambda: (_randn(shape, device, torch.float32),), label=f"sum {list(shape)}")]


@case("transpose")
def transpose(device: str, quick: bool) -> list[Setup]:
    """A transposed add, out[i, j] = x[j, i] + y[i, j]: one input read across its rows, so a
    1-D block reads it one element per sector. kiln's 2D tiles (on by default; KILN_CONFIG=triton_tile_2d=0 for an A/B) read both
    inputs along their contiguous dims."""
    n = 64 if quick else (8192 if device == "cuda" else 2048)
    return [Setup(fn=lambda x, y: x.t() + y, dtype=dt, rtol=2e-2 if dt == torch.bfloat16 else 1e-5,
                  atol=2e-2 if dt == torch.bfloat16 else 1e-5,
                  make_inputs=lambda dt=dt: (_randn((n, n), device, dt), _randn((n, n), device, dt)),
                  label=f"x.t() + y [{n}, {n}]")
            for dt in (torch.float32, torch.bfloat16)]
