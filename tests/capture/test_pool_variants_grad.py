"""Pooling variants the core ops do not cover (``ceil_mode``, ``dilation``) in training: a
fallback node whose backward replays torch's autograd of the C++ pooling function, one graph.
Before, any gradient through them was a graph break ("needs a gradient, which a fallback node
cannot give"): EfficientNet's ``avg_pool2d(ceil_mode=True)`` made its training step 4 graphs /
3 breaks (Dynamo 1 / 0). ``return_indices`` (a Python dispatcher) still breaks there."""
import pytest
import torch
import torch.nn.functional as F

import kiln

CASES = {
    "avg_ceil_padded": lambda x: F.avg_pool2d(x, 3, 2, 1, ceil_mode=True),
    "avg_ceil_no_pad_count": lambda x: F.avg_pool2d(x, 2, ceil_mode=True, count_include_pad=False),
    "avg_module_ceil": torch.nn.AvgPool2d(2, ceil_mode=True),
    "max_ceil": lambda x: F.max_pool2d(x, 3, 2, ceil_mode=True),
    "max_dilated": lambda x: F.max_pool2d(x, 2, dilation=2),
    "max_ceil_default_stride": lambda x: F.max_pool2d(x, 2, ceil_mode=True),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_one_graph_and_eagers_gradient(name):
    pool = CASES[name]

    def loss(x):
        y = pool(x * 2)
        return (y * torch.linspace(0.5, 1.5, y.numel()).view(y.shape)).sum()
    x = torch.randn(2, 3, 7, 7, requires_grad=True)
    want = torch.autograd.grad(loss(x), x)[0]
    kiln.reset()
    out = kiln.explain(loss)(x)
    assert (out.graph_count, out.graph_break_count) == (1, 0), out.break_reasons
    torch.testing.assert_close(torch.autograd.grad(out.result, x)[0], want)
