"""The seed example: relu(x + bias) * 2, compiled, with a graph break to show how one reads.

    python examples/seed.py
    python -m kiln explain examples/seed.py
"""
import torch

import kiln


@kiln.compile
def transform(x, bias):
    y = x + bias
    y = torch.relu(y)
    return y * 2


@kiln.compile
def with_a_break(x):
    y = torch.sigmoid(x) * 2
    print("host-side print: a graph break")
    return y + 1


if __name__ == "__main__":
    x, bias = torch.randn(256, 256), torch.randn(256)
    assert torch.equal(transform(x, bias), torch.relu(x + bias) * 2)
    with_a_break(x)
    print("stats:", kiln.stats())
