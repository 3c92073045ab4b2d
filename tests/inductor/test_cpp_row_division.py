"""C++ row kernels divide by a per-row value through its reciprocal (cpp_reduction
RowScratchWriter.emit): softmax's normalization is x * (1 / sum), one divide per row instead of
one per element, as ATen's CPU softmax computes it. Values stay within float32 tolerance of
eager, and a per-element divisor keeps its division."""
import pytest
import torch

import kiln
from testing import assert_close, on_target

CPP = [pytest.param(("cpu", "cpp"), id="cpp")]


@pytest.mark.parametrize("target", CPP)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_softmax_normalizes_by_a_reciprocal(dtype, target):
    with on_target(target) as device:
        x = (torch.randn(37, 300, device=device) * 4).to(dtype)
        out = kiln.explain(lambda x: torch.softmax(x, -1))(x)
        assert_close(out.result, torch.softmax(x, -1), dtype)
        (k,) = out.kernels
        assert "(1.0f / " in k.source, k.source


@pytest.mark.parametrize("target", CPP)
def test_a_per_element_divisor_keeps_its_division(target):
    with on_target(target) as device:
        x, y = torch.randn(16, 200, device=device), torch.rand(16, 200, device=device) + 0.5
        f = lambda x, y: x / y - x.sum(-1, keepdim=True) / y  # noqa: E731
        out = kiln.explain(f)(x, y)
        assert_close(out.result, f(x, y))
        assert not any("(1.0f / " in k.source for k in out.kernels)
