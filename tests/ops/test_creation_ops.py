"""Creation ops inside compiled code: values, dtypes and shapes equal eager's (random ones are
checked statistically), on both code-generation targets."""
import pytest
import torch

import kiln
from testing import TARGETS, assert_close, on_target

CASES = {
    "zeros_ones_full": lambda x: torch.zeros(6, 4, device=x.device) + torch.ones(4, device=x.device) * 2
    + torch.full((6, 1), 0.5, device=x.device) + x,
    "like": lambda x: torch.zeros_like(x) + torch.ones_like(x, dtype=torch.float64) + torch.full_like(x, 7),
    "empty_then_fill": lambda x: torch.empty_like(x).mul(0) + x,
    "arange_int": lambda x: torch.arange(5, device=x.device) * 3 + torch.arange(2, 12, 2, device=x.device),
    "arange_float": lambda x: torch.arange(0, 1, 0.125, device=x.device) + torch.arange(-1.5, 1.5, 0.5, dtype=torch.float64, device=x.device).sum(),
    "linspace": lambda x: torch.linspace(-3, 7, 11, device=x.device) + torch.linspace(0, 1, 5, device=x.device).sum(),
    "eye": lambda x: torch.eye(4, device=x.device) @ torch.eye(4, 3, device=x.device) + x[:4, :3],
    "new_methods": lambda x: x.new_zeros(2, 4) + x.new_ones((2, 4)) + x.new_full((2, 4), 3.0),
    "tensor_constant": lambda x: x * torch.tensor([1.0, -2.0, 3.0, 0.5], device=x.device),
    "bool_full": lambda x: torch.full((4,), True, device=x.device) & (x[0] > 0),
}


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("name", list(CASES))
def test_creation_matches_eager(name, target):
    fn = CASES[name]
    with on_target(target) as device:
        x = torch.randn(6, 4, device=device)
        expected = fn(x)
        actual = kiln.compile(fn, fullgraph=True)(x)
        assert actual.dtype == expected.dtype and actual.shape == expected.shape
        assert_close(actual, expected)


@pytest.mark.parametrize("target", TARGETS)
def test_random_creation_statistics(target):
    with on_target(target) as device:
        f = kiln.compile(lambda x: (torch.randn_like(x), torch.randint(3, 9, (4000,), device=x.device),
                                    torch.rand(4000, device=x.device)), fullgraph=True)
        z, i, u = f(torch.zeros(4000, device=device))
        assert abs(z.mean().item()) < 0.1 and abs(z.std().item() - 1) < 0.1
        assert i.dtype == torch.int64 and i.min().item() == 3 and i.max().item() == 8
        assert 0 <= u.min().item() and u.max().item() < 1


def test_creation_with_requires_grad_is_a_graph_break():
    def f(x):
        w = torch.zeros(3, requires_grad=True)
        return x + w
    e = kiln.explain(f)(torch.randn(3))
    assert e.graph_break_count == 1 and "requires_grad" in e.break_reasons[0].reason
