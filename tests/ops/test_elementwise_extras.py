"""Elementwise behaviour beyond the op table (tests/ops/optable): fusion of an activation chain
into one kernel, rounding ties and special values, NaN propagation, and a clear error for
integer pow with a tensor exponent."""
import pytest
import torch
import torch.nn.functional as F

import kiln
from testing import TARGETS, assert_close, on_target, randn


@pytest.mark.parametrize("target", TARGETS)
def test_activation_chain_is_one_kernel(target):
    def chain(x, y):
        h = F.gelu(x) * F.silu(y) + F.hardswish(x)
        h = torch.clamp(h, -2, 2) ** 2 + torch.lerp(x, y, 0.25)
        return torch.where(torch.isfinite(h), F.softplus(h), h * 0) + (x // 0.5)
    with on_target(target) as device:
        x = randn((8, 16), torch.float32, device, "transposed")
        y = randn((16,), torch.float32, device)
        assert kiln.explain(chain)(x, y).kernel_count == 1
        assert_close(kiln.compile(chain, fullgraph=True)(x, y), chain(x, y))


def test_round_ties_to_even_and_sign_of_special_values():
    x = torch.tensor([0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 0.49999997, 1e30, float("nan"), float("-inf")])
    fn = lambda t: (torch.round(t), torch.sign(t), torch.trunc(t))  # noqa: E731
    for out, exp in zip(kiln.compile(fn, fullgraph=True)(x), fn(x)):
        assert_close(out, exp)


def test_integer_pow_by_tensor_compiles():
    """Integer tensor exponents compile (eager's powi; tests/ops/test_edge_cases.py has more)."""
    fn = lambda a, b: a ** b  # noqa: E731
    a, b = torch.arange(-4, 4), torch.arange(8) - 2
    with kiln.config.patch(strict=True):
        assert torch.equal(kiln.compile(fn, fullgraph=True)(a, b), fn(a, b))


def test_nan_propagates_like_eager():
    x = torch.tensor([float("nan"), -1.0, 2.0, float("-inf")])
    fn = lambda a: torch.maximum(torch.relu(a), a * 0.5)  # noqa: E731
    assert_close(kiln.compile(fn)(x), fn(x))
