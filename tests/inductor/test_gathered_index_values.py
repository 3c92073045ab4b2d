"""An index value computed from a gathered index (a stacked or concatenated tensor read at
rows an index tensor picks): the stack's ``where(Mod(row, 2) < 1, ...)`` takes the gathered row,
the register the gather loaded, as a load's index does. It printed the Let's own symbol, never
declared (``'ind26' was not declared``: Phi-MoE's expert sum failed to build and ran eagerly)."""
import pytest
import torch

import kiln
from testing import TARGETS, assert_close, on_target


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_a_gathered_row_of_a_stack_is_read_from_the_right_source(target, dtype):
    def f(a, b, perm):
        s = torch.stack([torch.exp(a), b * 2], 1).reshape(-1, a.shape[-1])  # even rows a, odd rows b
        return s[perm].view(-1, 2, a.shape[-1]).sum(1), torch.cat([a, b])[perm] + 1
    torch.manual_seed(0)
    with on_target(target) as device:
        a, b = torch.randn(6, 16, device=device, dtype=dtype), torch.randn(6, 16, device=device, dtype=dtype)
        perm = torch.randperm(12, device=device)
        got, want = kiln.compile(f)(a, b, perm), f(a, b, perm)
    for g, w in zip(got, want):
        assert_close(g, w, dtype)
        assert g.stride() == w.stride() and g.dtype == w.dtype
    assert kiln.stats()["fallbacks"] == 0 and kiln.stats()["eager_runs"] == 0, kiln.stats()
