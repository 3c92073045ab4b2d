"""``torch.full`` whose fill value is a symbolic size (``torch.full((1,), x.shape[0])`` under
``dynamic=True``): the value reaches kernels as an argument, as a size used as any other
operand does. Before, lowering made it a constant, and codegen failed converting the symbol to
a number (an internal error: the frame ran eagerly; peer
``test_no_specization_over_symbolic_value``)."""
from __future__ import annotations

import pytest
import torch

import kiln
from tests.testing import TARGETS, on_target


def fn(x):
    n = x.shape[0]
    return (x + torch.full((1,), n), torch.full((2,), n + 1, dtype=torch.float16),
            torch.full((3,), n * 2))


@pytest.mark.parametrize("target", TARGETS)
def test_full_of_a_symbolic_size_matches_eager_without_recompiling(target):
    with on_target(target) as device, kiln.config.patch(strict=True):
        kiln.reset()
        compiled = kiln.compile(fn, fullgraph=True, dynamic=True)
        for n in (10, 11, 13):
            x = torch.ones(n, device=device)
            for got, want in zip(compiled(x), fn(x)):
                assert got.dtype == want.dtype and got.stride() == want.stride()
                torch.testing.assert_close(got, want, rtol=0, atol=0)
        assert kiln.stats()["recompiles"] == 0 and kiln.stats()["fallbacks"] == 0
