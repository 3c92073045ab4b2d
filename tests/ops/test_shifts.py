"""``<<`` / ``>>`` on tensors (``torch.bitwise_left_shift`` / ``bitwise_right_shift``; peer
``test_uint4x2_mixed_mm``): before, a graph break ("operator >> on tensors is not supported").

Eager's values where C's and LLVM's shifts are undefined: a count outside [0, bits) gives 0 to
the left and the sign fill to the right (``a >> (bits - 1)``, 0 unsigned); a left shift wraps
to the type. Bool and float operands are refused, as eager refuses them.
"""
from __future__ import annotations

import pytest
import torch

import kiln
from testing import TARGETS, on_target

DTYPES = [torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64]


def _shifts(a, b):
    return (a << b, a >> b, a >> 3, a << 2, torch.bitwise_left_shift(a, b), a.bitwise_right_shift(b),
            a << 70, a >> 70, (a & 0xF) | (a >> 4) << 4)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_shifts_match_eager_for_every_count(dtype, target):
    info = torch.iinfo(dtype)
    a = torch.randint(info.min, info.max, (64,), dtype=torch.int64).to(dtype)
    b = torch.randint(0 if dtype == torch.uint8 else -3, 70, (64,), dtype=torch.int64).to(dtype)
    with on_target(target) as device, kiln.config.patch(strict=True):
        a, b = a.to(device), b.to(device)
        got, want = kiln.compile(_shifts, fullgraph=True)(a, b), _shifts(a, b)
        for g, w in zip(got, want):
            assert g.dtype == w.dtype and torch.equal(g.cpu(), w.cpu()), (g, w)
    assert kiln.stats()["fallbacks"] == 0


def test_shift_promotes_and_unpacks_nibbles():
    def unpack(b, x):
        return torch.cat((b & 0xF, b >> 4), 1).to(x.dtype) - 8 + x, b.to(torch.int16) << torch.tensor(3)
    b = torch.randint(0, 255, (4, 3), dtype=torch.uint8)
    x = torch.randn(4, 6)
    got, want = kiln.compile(unpack, fullgraph=True)(b, x), unpack(b, x)
    assert torch.allclose(got[0], want[0]) and got[1].dtype == want[1].dtype and torch.equal(got[1], want[1])


def test_shifts_of_bool_or_float_raise_as_eager():
    for a, b in ((torch.tensor([True]), torch.tensor([True])), (torch.tensor([1.0]), 1)):
        with pytest.raises(NotImplementedError):
            _ = a << b
        with pytest.raises(Exception):
            kiln.compile(lambda a, b: a << b, fullgraph=True)(a, b)
